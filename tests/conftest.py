"""Shared fixtures: tiny random models (float64, LayerNorm weights not all 1) and a tiny
weights folder, so every test runs in milliseconds."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings

from tinygpt_cli.transformer.config import Config
from tinygpt_cli.transformer.families import save_config
from tinygpt_cli.transformer.folder import save_params
from tinygpt_cli.transformer.model import init_params
from tinygpt_cli.transformer.schema import is_bias, is_norm_weight
from tinygpt_cli.transformer.tokenizer import Tokenizer, save_tokenizer, train_tokenizer

# Hypothesis profiles: "ci" is deterministic (derandomize: the same examples on every run, no
# example database), selected when CI=true; "dev" is the broader local default, searching new
# examples each run. HYPOTHESIS_PROFILE=ci|dev overrides either.
settings.register_profile("ci", derandomize=True, database=None, deadline=None,
                          max_examples=100, print_blob=True)
settings.register_profile("dev", deadline=None, max_examples=300)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE")
                      or ("ci" if os.environ.get("CI", "").lower() == "true" else "dev"))

# The suite writes nowhere but its temporary folders: the tool's cache (means, score and
# neuron maxima, the why index) is one temporary folder for the whole run, set before any
# test (and every child process, which inherits it) reads it, removed at the end; a test may
# still point TINYGPT_CACHE elsewhere with monkeypatch.
_CACHE = None


def pytest_configure(config):  # noqa: ARG001 - pytest's hook signature
    import tempfile

    global _CACHE
    _CACHE = tempfile.mkdtemp(prefix="tinygpt-tests-cache-")
    os.environ["TINYGPT_CACHE"] = _CACHE
    os.environ.pop("TINYGPT_CLUSTER", None)  # this machine, unless a test names a cluster
    # No progress on stderr: a step over a second on a busy machine would add a line where a
    # test reads stderr exactly (the tests of progress itself unset it)
    os.environ["TINYGPT_PROGRESS"] = "0"


def pytest_unconfigure(config):  # noqa: ARG001
    import shutil

    if _CACHE is not None:
        shutil.rmtree(_CACHE, ignore_errors=True)



SENTENCES = [
    "Once upon a time, there was a little girl named Lily.",
    "She liked to play with her red ball in the park.",
    "One day, Lily saw a big dog. The dog wanted to play too!",
    "Tom and Lily ran and ran until the sun went down.",
    "They were happy. The end.",
]


def story_parts(folder: Path, copies=(4, 4, 4)) -> Path:
    """A --data folder as the TinyStories one is laid out: part-000.txt ... , part i holding
    SENTENCES copies[i] times, one per line between <|endoftext|> markers."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, n in enumerate(copies):
        (folder / f"part-00{i}.txt").write_text("\n<|endoftext|>\n".join(SENTENCES * n) + "\n")
    return folder


def random_params(config: Config, seed: int = 0, dtype=np.float64) -> dict[str, np.ndarray]:
    """GPT-2 shaped parameters with every entry perturbed, so nothing is 0 or 1 by accident.

    The scales give attention patterns that are far from uniform and logits of order 1.
    """
    rng = np.random.default_rng(seed)
    params = init_params(config, rng, dtype=np.float64)
    out = {}
    for name, value in params.items():
        if is_norm_weight(name):
            value = 1.0 + rng.normal(0.0, 0.3, value.shape)
        elif is_bias(name):
            value = rng.normal(0.0, 0.1, value.shape)
        elif name == "embed.W_E":
            value = rng.normal(0.0, 0.5, value.shape)
        else:
            value = value + rng.normal(0.0, 0.3, value.shape)
        out[name] = value.astype(dtype)
    return out


FAMILIES = ("gpt2", "neo", "neox", "llama", "qwen2", "qwen3")


def family_configs(**sizes) -> dict[str, Config]:
    """A small config of every family's block, by name: GPT-Neo's local window (on every
    other block), NeoX's parallel blocks and quarter-turned heads with an untied head,
    Llama's grouped keys and values (6 query heads on 3 by default), Qwen2's q/k/v biases,
    Qwen3's q/k norms."""
    from tinygpt_cli.jobs.train.loop import arch_config
    from tinygpt_cli.transformer.families import llama

    sizes = dict(n_embd=24, n_layer=2, n_head=6, n_inner=20, vocab_size=23, n_positions=12) \
        | sizes
    out = {arch: arch_config(arch, **sizes) for arch in ("gpt2", "neo", "neox", "llama")}
    hf = llama.config_to_hf(out["llama"])
    out["qwen2"] = llama.config_from_hf({**hf, "model_type": "qwen2", "attention_bias": True})
    out["qwen3"] = llama.config_from_hf({**hf, "model_type": "qwen3"})
    return out


@pytest.fixture(scope="session")
def tiny_config() -> Config:
    # n_inner is deliberately not 4 * n_embd, so a swapped size shows up.
    return Config(n_embd=12, n_layer=2, n_head=2, n_inner=20, vocab_size=23, n_positions=8)


@pytest.fixture(scope="session")
def tiny_params(tiny_config) -> dict[str, np.ndarray]:
    return random_params(tiny_config, seed=0)


@pytest.fixture(scope="session")
def make_params():
    """The parameter factory itself, for tests that need another config or seed."""
    return random_params


@dataclass
class TinyFolder:
    folder: Path
    config: Config
    params: dict[str, np.ndarray]  # float64, as generated (the file holds float32)
    tokenizer: Tokenizer


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Tokenizer:
    return train_tokenizer(SENTENCES * 4, vocab_size=300)


@pytest.fixture
def tiny_folder(tmp_path, tiny_tokenizer) -> TinyFolder:
    """model.safetensors + config.json + tokenizer.json for a 2-layer, 16-number model."""
    config = Config(
        n_embd=16, n_layer=2, n_head=2, n_inner=24,
        vocab_size=max(tiny_tokenizer.vocab_size, 64), n_positions=32,
    )
    params = random_params(config, seed=1)
    folder = tmp_path / "tiny"
    save_params(params, folder / "model.safetensors", config)
    save_config(config, folder / "config.json")
    save_tokenizer(tiny_tokenizer, folder / "tokenizer.json")
    return TinyFolder(folder, config, params, tiny_tokenizer)


# ---------------------------------------------------------------- the CLI on tiny weights


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random model with the shipped 4,096-token tokenizer (see cli_helpers)."""
    from cli_helpers import make_tiny

    return make_tiny(tmp_path_factory.mktemp("tiny") / "weights")


@pytest.fixture
def cli(capsys, monkeypatch, tiny):
    """Run the CLI on the tiny weights (through $TINYGPT_WEIGHTS)."""
    from cli_helpers import Runner, clean_env

    clean_env(monkeypatch)
    monkeypatch.setenv("TINYGPT_WEIGHTS", str(tiny.folder))
    return Runner(capsys, monkeypatch)


def patched_slope(params, config: Config, clean_ids, corrupt_ids, path: str, t: int,
                  target: int, vs: int, position: int = -1) -> float:
    """d (logit[target] - logit[vs] at `position`) along value `path`'s row t moving from
    the corrupt run's to the clean run's, at the corrupt run: a central finite difference
    of the real metric through a Replace hook (what an AtP cell times the gap estimates)."""
    from tinygpt_cli.transformer.hooks import Replace
    from tinygpt_cli.transformer.model import forward
    from tinygpt_cli.transformer.trace import run_traced

    clean, corrupt = run_traced(params, config, clean_ids), run_traced(params, config, corrupt_ids)
    step = clean[path][t] - corrupt[path][t]

    def metric(eps: float) -> float:
        def edit(x):
            x = x.copy()
            x[t] = corrupt[path][t] + eps * step
            return x
        z = forward(params, config, corrupt_ids, hooks=Replace({path: edit}))[position]
        return z[target] - z[vs]

    eps = 1e-5
    return (metric(eps) - metric(-eps)) / (2 * eps)


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium for the tests that open a saved page (tests/browser.py); the test
    skips where the machine has none (.ci/run installs it)."""
    from browser import Browser, find_chromium

    exe = find_chromium()
    if exe is None:
        pytest.skip("no Chromium on PATH (apt-get install chromium; .ci/run installs it): "
                    "the HTML pages cannot be opened in a real browser here")
    b = Browser(exe)
    yield b
    b.close()
