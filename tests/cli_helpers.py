"""Helpers for the CLI tests: a tiny weights folder with the shipped tokenizer, and a way to run
`tinygpt_cli.cli.main` in-process and get back its exit code, stdout and stderr."""

from __future__ import annotations

import functools
import io
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tinygpt_cli.cli import main
from tinygpt_cli.storage.locations import SHIPPED
from tinygpt_cli.transformer.config import Config
from tinygpt_cli.transformer.families import gpt2, save_config
from tinygpt_cli.transformer.folder import Model, load_model, save_params
from tinygpt_cli.transformer.model import init_params
from tinygpt_cli.transformer.schema import is_bias, is_norm_weight
from tinygpt_cli.transformer.trace import run_traced

TEXT = "Lily wanted to play with her"
TEXT_IDS = [608, 429, 267, 346, 336, 314]  # the shipped tokenizer is final
TOKENIZER = SHIPPED / "tokenizer.json"

# Sizes small enough that every command runs in milliseconds; the vocabulary and the longest
# text are the real ones, so the shipped tokenizer fits and the 128-token limit is the real one.
TINY = Config(n_embd=16, n_layer=2, n_head=2, n_inner=24, vocab_size=4096, n_positions=128)

# Variables that would make Rich think a capture buffer or a pipe is a colour terminal.
RICH_ENV = ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS", "LINES",
            "TINYGPT_DEBUG", "TINYGPT_WEIGHTS")


def random_params(config: Config, seed: int) -> dict[str, np.ndarray]:
    """Random GPT-2 parameters large enough that attention is far from uniform."""
    rng = np.random.default_rng(seed)
    params = init_params(config, rng)
    for name, value in params.items():
        if is_norm_weight(name):
            value = 1.0 + rng.normal(0.0, 0.2, value.shape)
        elif is_bias(name):
            value = rng.normal(0.0, 0.1, value.shape)
        else:
            value = rng.normal(0.0, 0.4, value.shape)
        params[name] = value.astype(np.float32)
    return params


def file_names(params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The same arrays by GPT-2's file names without the prefix (h.0.attn.c_attn.weight, ...),
    as independent references read the weights: nothing copied, so writing into one writes
    into params."""
    return {gpt2.file_name(n): a for n, a in params.items()}


def file_tensors(params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The tensors of a model.safetensors GPT2LMHeadModel writes (transformer.h.0...)."""
    return {gpt2.PREFIX + n: a for n, a in file_names(params).items()}


def write_folder(folder: Path, params: dict[str, np.ndarray], config: Config = TINY) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_params(params, folder / "model.safetensors", config)
    save_config(config, folder / "config.json")
    shutil.copyfile(TOKENIZER, folder / "tokenizer.json")
    return folder


def without_head(params: dict[str, np.ndarray], config: Config, layer: int,
                 head: int) -> dict[str, np.ndarray]:
    """The hand computation of a zeroed head: its rows of W_O (c_proj) in block `layer` set
    to zero, so its output never reaches the stream (the bias still does)."""
    p = dict(params)
    w = params[f"layers.{layer}.attn.W_O"].copy()
    w[head * config.d_k:(head + 1) * config.d_k] = 0.0
    p[f"layers.{layer}.attn.W_O"] = w
    return p


@dataclass
class Tiny:
    """A weights folder on disk and the model as the CLI loads it (float32)."""

    folder: Path
    model: Model

    def __repr__(self) -> str:  # short, so a failing example does not print every weight
        return f"Tiny({str(self.folder)!r})"

    def trace(self, ids):
        return run_traced(self.model.params, self.model.config, np.asarray(ids))


def make_tiny(folder: Path, params: dict[str, np.ndarray] | None = None) -> Tiny:
    write_folder(folder, random_params(TINY, seed=3) if params is None else params)
    return Tiny(folder, load_model(folder))


class Terminal(io.StringIO):
    """A stdin that is a terminal: nothing is piped in."""

    def isatty(self) -> bool:
        return True


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self):
        return json.loads(self.out)

    def ndjson(self) -> list[dict]:
        return [json.loads(line) for line in self.out.splitlines()]


class Runner:
    """Calls main(argv) the way the console script does; stdin is a terminal unless given."""

    def __init__(self, capsys, monkeypatch):
        self.capsys, self.monkeypatch = capsys, monkeypatch

    def __call__(self, *args, stdin: str | None = None, context=None) -> Result:
        """`context`: the run context (tinygpt_cli.cli.context.RunContext) to run with."""
        self.monkeypatch.setattr(sys, "stdin", Terminal() if stdin is None else io.StringIO(stdin))
        self.capsys.readouterr()
        with pytest.raises(SystemExit) as exit_info:
            main([str(a) for a in args], context=context)
        out, err = self.capsys.readouterr()
        code = exit_info.value.code
        return Result(0 if code is None else code, out, err)


def clean_env(monkeypatch) -> None:
    for name in RICH_ENV:
        monkeypatch.delenv(name, raising=False)


def run_module(*args, stdin: str = "", env: dict | None = None, cwd=None):
    """`python -m tinygpt_cli ...` in a child process, stdout and stderr both pipes."""
    child_env = {k: v for k, v in os.environ.items() if k not in RICH_ENV}
    child_env["TERM"] = "xterm-256color"  # a colour terminal type, yet stdout is a pipe
    child_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "tinygpt_cli", *map(str, args)], input=stdin,
                          capture_output=True, text=True, env=child_env, cwd=cwd, timeout=120)


def assert_one_error_line(result, code: int, *needles: str) -> str:
    """Exit `code`, nothing on stdout, one `error: ...` line on stderr containing the needles."""
    assert result.code == code if isinstance(result, Result) else result.returncode == code, \
        (result, code)
    err = result.err if isinstance(result, Result) else result.stderr
    out = result.out if isinstance(result, Result) else result.stdout
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    assert "Traceback" not in err
    assert out == ""
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@functools.cache
def example(name: str):
    """examples/NAME.py as a module (make_gguf: the GGUF writer the tests make files with),
    loaded once for every test that uses it."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
