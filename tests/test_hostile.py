"""Hostile input, folders and runs: every case ends with exit 2 (bad input) or 1 (a broken
weights or run folder, a failed write), nothing on stdout, exactly one `error:` line on stderr
and no traceback -- and never the `{type}: {message}` catch-all of `entry.failed`, which is
kept for bugs. A planted symlink in a run folder never redirects a write.

The table runs in-process on tiny models; two cases run a real process with raw bytes in argv
and on stdin, as a shell would pass them.
"""

from __future__ import annotations

import dataclasses
import errno
import io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import (
    TEXT,
    TINY,
    Result,
    Terminal,
    clean_env,
    file_tensors,
    random_params,
    write_folder,
)
from safetensors.numpy import save_file

from tinygpt_cli.cli import main
from tinygpt_cli.transformer.families.gpt2 import PREFIX

CATCH_ALL = re.compile(r"^error: [A-Z]\w*(Error|Exception): |run again with --debug")

# A run small enough to train in a fraction of a second.
RUN_SIZES = ["--n-embd", "16", "--n-layer", "1", "--n-head", "2", "--n-inner", "32",
             "--n-positions", "16", "--vocab-size", "257", "--batch-size", "2",
             "--eval-every", "2", "--checkpoint-every", "2", "--warmup", "1"]


def assert_error(result, code: int, *needles: str) -> str:
    """Exit `code`, nothing on stdout, one `error: ...` line, no traceback, no catch-all."""
    lines = result.err.splitlines()
    assert result.code == code, (result.code, result.err)
    assert result.out == "", result.out
    assert len(lines) == 1 and lines[0].startswith("error: "), result.err
    assert "Traceback" not in result.err
    assert not CATCH_ALL.search(lines[0]), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def write_parts(folder: Path, n: int = 3, seed: int = 0) -> Path:
    """Numbered part files of short made-up stories (fixed seed)."""
    rng = random.Random(seed)
    words = "the cat sat on a mat and dog ran to big red ball Lily Tom happy sad day sun".split()
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        stories = [" ".join(rng.choice(words) for _ in range(40)) + "." for _ in range(40)]
        (folder / f"part-{i:03d}.txt").write_text("\n<|endoftext|>\n".join(stories) + "\n")
    return folder


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_parts(tmp_path_factory.mktemp("data") / "stories")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data) -> Path:
    """A finished tiny run (4 steps) to copy and break."""
    out = tmp_path_factory.mktemp("run") / "run"
    r = _run_main(["train", "--data", data, "--out", out, "--steps", "4", *RUN_SIZES])
    assert r.code == 0, r.err
    return out


def _run_main(args, stdin=None) -> Result:
    saved = sys.stdin
    sys.stdin = stdin if stdin is not None else Terminal()
    out, err = io.StringIO(), io.StringIO()
    saved_out, saved_err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as e:
        code = 0 if e.code is None else e.code
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved, saved_out, saved_err
    return Result(code, out.getvalue(), err.getvalue())




@dataclass
class Ctx:
    """What a case may refer to: {tiny} (a good weights folder), {broken} (a copy to break),
    {data} (numbered parts), {run} (a copy of a finished run), {tmp}."""

    tmp: Path
    tiny: Path
    broken: Path
    data: Path
    run: Path
    stdin: object = None
    extra: dict = field(default_factory=dict)

    def fill(self, arg):
        return str(arg).format(tmp=self.tmp, tiny=self.tiny, broken=self.broken,
                               data=self.data, run=self.run)


def run(ctx: Ctx, *argv):
    """main() on argv with the {placeholders} of ctx filled in."""
    return _run_main([ctx.fill(a) for a in argv])


@pytest.fixture
def ctx(tmp_path, tiny, data, trained, monkeypatch) -> Ctx:
    clean_env(monkeypatch)
    monkeypatch.delenv("TINYGPT_WEIGHTS", raising=False)
    broken = tmp_path / "broken"
    shutil.copytree(tiny.folder, broken)
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    return Ctx(tmp_path, tiny.folder, broken, data, run)


# ------------------------------------------------------------------ ways to break things


def config_json(ctx: Ctx, **changes) -> None:
    d = json.loads((ctx.broken / "config.json").read_text())
    d.update(changes)
    (ctx.broken / "config.json").write_text(json.dumps(d))


def config_text(text: str):
    def setup(ctx: Ctx) -> None:
        (ctx.broken / "config.json").write_text(text)
    return setup


def tensors(ctx: Ctx, change) -> None:
    """Rewrite the broken folder's weights after `change(dict of named float32 arrays)`."""
    t = file_tensors(random_params(TINY, seed=3))
    change(t)
    save_file(t, str(ctx.broken / "model.safetensors"))


def bf16(t):
    """A bf16 tensor as safetensors writes it: numpy has no bf16, so patch the header."""
    t[PREFIX + "ln_f.bias"] = t[PREFIX + "ln_f.bias"].astype(np.float16)


def with_raw_dtype(dtype: str):
    """ln_f.bias stored as 2-byte F16, then its header dtype renamed to `dtype`."""
    def setup(ctx: Ctx) -> None:
        tensors(ctx, bf16)
        path = ctx.broken / "model.safetensors"
        raw = path.read_bytes()
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8:8 + n])
        header[PREFIX + "ln_f.bias"]["dtype"] = dtype
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)  # offsets are relative to the data: they still hold
        path.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n:])
    return setup


def claimed_shape(ctx: Ctx) -> None:
    """wte's header entry claims 10^12 rows while its bytes stay those of 4,096."""
    tensors(ctx, lambda t: None)
    path = ctx.broken / "model.safetensors"
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    header[PREFIX + "wte.weight"]["shape"] = [10**12, 16]
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n:])


def moved_offsets(move):
    """The header's data_offsets rewritten by `move(header)`; the bytes stay as they were."""
    def setup(ctx: Ctx) -> None:
        tensors(ctx, lambda t: None)
        path = ctx.broken / "model.safetensors"
        raw = path.read_bytes()
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8:8 + n])
        move(header)
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        path.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n:])
    return setup


def overlap_bias(header) -> None:
    """ln_f.bias (16 floats) moved onto the first bytes of ln_f.weight (16 floats)."""
    header[PREFIX + "ln_f.bias"]["data_offsets"] = header[PREFIX + "ln_f.weight"]["data_offsets"]


def set_tensor(name, fn):
    def setup(ctx: Ctx) -> None:
        def change(t):
            t[name] = fn(t)
        tensors(ctx, change)
    return setup


def duplicate_names(ctx: Ctx) -> None:
    def change(t):
        t["ln_f.bias"] = t[PREFIX + "ln_f.bias"].copy()
    tensors(ctx, change)


def vocabulary(size: int):
    """A model of `size` tokens beside the shipped 4,096-token tokenizer."""
    def setup(ctx: Ctx) -> None:
        config = dataclasses.replace(TINY, vocab_size=size)  # __dict__ holds a pass's cache
        write_folder(ctx.broken, random_params(config, seed=3), config)
    return setup


def stdin_bytes(data: bytes):
    def setup(ctx: Ctx) -> None:
        ctx.stdin = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")
    return setup


def data_file(content: bytes):
    def setup(ctx: Ctx) -> None:
        (ctx.tmp / "bad.txt").write_bytes(content)
    return setup


def tokenizer_out(ctx: Ctx) -> None:
    (ctx.tmp / "tok.json").write_text("{}")


def run_tokenizer_of(size: int):
    """A fresh OUT holding only a tokenizer of another size than asked."""
    def setup(ctx: Ctx) -> None:
        from tinygpt_cli.jobs.corpus import read_stories
        from tinygpt_cli.transformer.tokenizer import save_tokenizer, train_tokenizer

        (ctx.tmp / "fresh").mkdir()
        tok = train_tokenizer(read_stories(sorted(ctx.data.glob("*.txt"))[:2]), size)
        save_tokenizer(tok, ctx.tmp / "fresh" / "tokenizer.json")
    return setup


def log_lines(edit):
    def setup(ctx: Ctx) -> None:
        path = ctx.run / "log.jsonl"
        path.write_text(edit(path.read_text()))
    return setup


def no_space_left(ctx: Ctx) -> None:
    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    ctx.extra["patch"] = (os, "fsync", full)


def read_only(ctx: Ctx) -> None:
    import tempfile

    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
    ctx.extra["patch"] = (tempfile, "mkstemp", denied)


def hold_lock(ctx: Ctx) -> None:
    import fcntl

    fd = os.open(ctx.run / ".train.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    ctx.extra["lock"] = fd


def nothing(ctx: Ctx) -> None:
    pass


def snapshot(write):
    """A history/ folder in the broken weights folder holding one snapshot, as `write` makes it."""
    def setup(ctx: Ctx) -> None:
        (ctx.broken / "history").mkdir()
        write(ctx.broken / "history" / "step-000010.safetensors")
    return setup


def header_not_json(path: Path) -> None:
    path.write_bytes((10).to_bytes(8, "little") + b"{not json!")


def step_not_a_number(path: Path) -> None:
    t = file_tensors(random_params(TINY, seed=3))
    save_file(t, str(path), metadata={"step": "ten", "lr": "0.001"})


def stamped(path: Path, weights: Path | None = None) -> dict:
    """The claim a finished run writes into its snapshots: the weights beside history/."""
    from tinygpt_cli.storage.madefor import made_for

    return made_for(weights or path.parent.parent / "model.safetensors")


def snapshot_with_nan(path: Path) -> None:
    t = file_tensors(random_params(TINY, seed=3))
    t[PREFIX + "wpe.weight"][0, 0] = np.nan
    save_file(t, str(path), metadata={"step": "10", "lr": "0.001", **stamped(path)})


def snapshot_unstamped(path: Path) -> None:
    save_file(file_tensors(random_params(TINY, seed=3)), str(path),
              metadata={"step": "10", "lr": "0.001"})


def snapshot_of_other_weights(path: Path) -> None:
    other = path.parent / "other.bin"
    other.write_bytes(b"the weights of another run")
    claim = stamped(path, other)
    other.unlink()
    save_file(file_tensors(random_params(TINY, seed=3)), str(path),
              metadata={"step": "10", "lr": "0.001", **claim})


def data_with(name: str, make):
    """{tmp}/d: the numbered parts, with part-000.txt replaced by what `make` puts there."""
    def setup(ctx: Ctx) -> None:
        shutil.copytree(ctx.data, ctx.tmp / "d")
        (ctx.tmp / "d" / name).unlink()
        make(ctx.tmp / "d" / name)
    return setup


def gap_in_token_ids(ctx: Ctx) -> None:
    """One token moved from id 4,094 to 4,096: as many ids as rows, but one past the end."""
    path = ctx.broken / "tokenizer.json"
    doc = json.loads(path.read_text())
    vocab = doc["model"]["vocab"]
    moved = next(k for k, v in vocab.items() if v == 4094)
    vocab[moved] = 4096
    path.write_text(json.dumps(doc))


def shifted_token_ids(ctx: Ctx) -> None:
    path = ctx.broken / "tokenizer.json"
    doc = json.loads(path.read_text())
    doc["model"]["vocab"] = {k: v + 5000 for k, v in doc["model"]["vocab"].items()}
    for t in doc["added_tokens"]:
        t["id"] += 5000
    path.write_text(json.dumps(doc))


def wordpiece_tokenizer(ctx: Ctx) -> None:
    """A WordPiece tokenizer with as many ids as the model has rows, <|endoftext|> among them."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "<|endoftext|>": 1, **{f"w{i}": i for i in range(2, 4096)}}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(ctx.broken / "tokenizer.json"))


def padded_tokenizer(ctx: Ctx) -> None:
    path = ctx.broken / "tokenizer.json"
    path.write_text(path.read_text() + " " * (17 << 20))


def many_header_entries(ctx: Ctx) -> None:
    """The good tensors, and 20,000 made-up empty ones named in the header."""
    tensors(ctx, lambda t: t.update({f"x{i}": np.zeros(0, np.float32) for i in range(20_000)}))


def side_file(name: str, make):
    """The broken folder's `name` replaced by what `make(path)` puts there."""
    def setup(ctx: Ctx) -> None:
        (ctx.broken / name).unlink()
        make(ctx.broken / name)
    return setup


def symlink_loop(ctx: Ctx) -> None:
    (ctx.tmp / "loop").symlink_to(ctx.tmp / "loop")


def plain_file(ctx: Ctx) -> None:
    (ctx.tmp / "f").write_text("")


def planted_lock(ctx: Ctx) -> None:
    (ctx.tmp / "victim").write_text("precious")
    (ctx.run / ".train.lock").unlink(missing_ok=True)  # the finished run's own lock file
    (ctx.run / ".train.lock").symlink_to(ctx.tmp / "victim")


def trailing_bytes(ctx: Ctx) -> None:
    """300 bytes after the last tensor (the safetensors library: "not fully covered")."""
    with open(ctx.broken / "model.safetensors", "ab") as f:
        f.write(b"\0" * 300)


def tokenizer_edit(edit):
    """The broken folder's tokenizer.json after edit(its JSON document)."""
    def setup(ctx: Ctx) -> None:
        path = ctx.broken / "tokenizer.json"
        doc = json.loads(path.read_text())
        edit(doc)
        path.write_text(json.dumps(doc))
    return setup


def lowercase(doc) -> None:
    doc["normalizer"] = {"type": "Lowercase"}


def no_token_for_byte_0(doc) -> None:
    """Byte 0's token (GPT-2 writes it "Ā") renamed: a byte no token stands for."""
    vocab = doc["model"]["vocab"]
    vocab["Ā-renamed"] = vocab.pop("Ā")


def whitespace_first(doc) -> None:
    """A Whitespace pre-tokenizer before the byte-level one: the spaces are dropped."""
    doc["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Whitespace"}, doc["pre_tokenizer"]]}


def no_decoder(doc) -> None:
    doc["decoder"] = None


def means_with_a_huge_header(ctx: Ctx) -> None:
    from safetensors.numpy import save

    _write(ctx.broken / "means.safetensors",
           save({"x": np.zeros(1, np.float32)}, metadata={f"k{i}": "v" for i in range(50_000)}))


W = ["--weights", "{broken}"]
SAE = "sae/layers.1.resid_post.safetensors"


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _tensors(**shapes) -> bytes:
    from safetensors.numpy import save

    return save({n: np.ones(s, np.float32) for n, s in shapes.items()},
                metadata={"site": "layers.1.resid_post", "k": "4"})
TRAIN = ["train", "--steps", "2", *RUN_SIZES]
DATA = ["--data", "{data}"]
N16 = dict(n_embd=16)

# (id, setup, argv, exit code, words the error line must hold)
CASES = [
    # -------------------------------------------------- bad input and usage: exit 2
    ("seed-negative-sample", nothing, ["sample", TEXT, "--seed", "-1", *W], 2, ["--seed", "-1"]),
    ("seed-negative-generate", nothing, ["generate", TEXT, "--seed", "-3", *W], 2, ["--seed"]),
    ("seed-negative-train", nothing, [*TRAIN, *DATA, "--out", "{tmp}/o", "--seed", "-1"], 2,
     ["--seed"]),
    ("argv-not-utf8", nothing, ["embed", "Lily \udcff", *W], 2, ["not valid UTF-8", "0xff"]),
    ("token-not-utf8", nothing, ["embed", "\udce9", *W], 2, ["not valid UTF-8"]),
    ("stdin-not-utf8", stdin_bytes(b"Lily \xff\xfe wanted"), ["embed", "-", *W], 2,
     ["stdin is not UTF-8", "0xff", "offset 5"]),
    # (the lines of stdin are run as they come: a bad byte on line 1, before any output)
    ("each-line-stdin-not-utf8", stdin_bytes(b"ab\xff\nLily\n"),
     ["encode", "--each-line", "-", *W], 2, ["stdin is not UTF-8", "0xff", "offset 2"]),
    ("stdin-utf16", stdin_bytes("Lily".encode("utf-16")), ["logits", "-", *W], 2,
     ["stdin is not UTF-8"]),
    ("temperature-subnormal", nothing, ["sample", TEXT, "--temperature", "1e-320", *W], 2,
     ["--temperature", "1e-320"]),
    ("temperature-nan", nothing, ["probs", TEXT, "--temperature", "nan", *W], 2,
     ["--temperature"]),
    ("temperature-inf-generate", nothing, ["generate", TEXT, "-t", "inf", "--seed", "1", *W], 2,
     ["--temperature", "inf"]),
    ("temperature-tiny-generate-unseeded", nothing, ["generate", TEXT, "-t", "1e-9", *W], 2,
     ["--temperature", "1e-09"]),
    ("top-p-nan", nothing, ["sample", TEXT, "--top-p", "nan", *W], 2, ["--top-p"]),
    ("weights-empty", nothing, ["embed", TEXT, "--weights", ""], 2, ["--weights is empty"]),
    ("weights-missing", nothing, ["info", "--weights", "{tmp}/nowhere"], 2,
     ["nowhere", "does not exist"]),
    ("data-binary", data_file(b"\x7fELF\x02\x01\x01\x00" * 64),
     [*TRAIN, "--data", "{tmp}/bad.txt", "--out", "{tmp}/o"], 2, ["bad.txt", "binary"]),
    ("data-utf16", data_file("Once upon a time.\n".encode("utf-16") * 50),
     [*TRAIN, "--data", "{tmp}/bad.txt", "--out", "{tmp}/o"], 2, ["bad.txt", "UTF-16"]),
    ("data-latin1", data_file("caf\xe9 au lait. ".encode("latin-1") * 50),
     ["train-tokenizer", "--data", "{tmp}/bad.txt", "--out", "{tmp}/t.json"], 2,
     ["bad.txt", "not UTF-8", "0xe9"]),
    ("vocab-too-small", nothing, [*TRAIN, *DATA, "--out", "{tmp}/o", "--vocab-size", "256"], 2,
     ["--vocab-size", "257", "256"]),
    ("vocab-too-small-tokenizer", nothing,
     ["train-tokenizer", "--data", "{data}", "--out", "{tmp}/t.json", "--vocab-size", "10"], 2,
     ["--vocab-size", "257"]),
    ("vocab-too-large", nothing, [*TRAIN, *DATA, "--out", "{tmp}/o", "--vocab-size", "70000"], 2,
     ["65,535"]),
    ("sizes-beyond-memory", nothing,
     [*TRAIN, *DATA, "--out", "{tmp}/o", "--n-embd", "65536", "--n-layer", "1000"], 2,
     ["parameters", "GiB", "choose smaller sizes"]),
    ("out-is-a-file", lambda c: (c.tmp / "f").write_text(""), [*TRAIN, *DATA, "--out", "{tmp}/f"],
     2, ["is a file"]),
    ("lr-nan", nothing, [*TRAIN, *DATA, "--out", "{tmp}/o", "--lr", "nan"], 2, ["--lr", "nan"]),
    ("lr-huge", nothing, [*TRAIN, *DATA, "--out", "{tmp}/o", "--lr", "1e30"], 2, ["--lr", "1e+30"]),
    ("lr-zero", nothing, [*TRAIN, *DATA, "--out", "{tmp}/o", "--lr", "0"], 2, ["--lr"]),
    ("dropout-nan", nothing, [*TRAIN, *DATA, "--out", "{tmp}/o", "--dropout", "nan"], 2,
     ["--dropout"]),
    ("minutes-nan", nothing, [*TRAIN, *DATA, "--out", "{tmp}/o", "--minutes", "nan"], 2,
     ["--minutes"]),
    ("resume-other-sizes", nothing,
     [*TRAIN, *DATA, "--out", "{run}", "--resume", "--n-embd", "32"], 2,
     ["--resume", "n_embd 16 (asked 32)"]),
    ("extension-within-warmup", nothing,
     [*TRAIN, *DATA, "--out", "{run}", "--resume", "--steps", "6", "--warmup", "5"], 2,
     ["--steps 6 extends the run by 2 steps", "--warmup of 5"]),
    ("resume-and-force", nothing, [*TRAIN, *DATA, "--out", "{run}", "--resume", "--force"], 2,
     ["--resume", "--force"]),
    ("previous-run", nothing, [*TRAIN, *DATA, "--out", "{run}"], 2,
     ["previous run", "log.jsonl", "--resume", "--force"]),
    ("locked", hold_lock, [*TRAIN, *DATA, "--out", "{run}", "--resume"], 2,
     ["another `tinygpt train`", ".train.lock"]),
    ("tokenizer-of-other-size", run_tokenizer_of(300), [*TRAIN, *DATA, "--out", "{tmp}/fresh"], 2,
     ["300 tokens", "--vocab-size is 257"]),
    ("train-tokenizer-no-force", tokenizer_out,
     ["train-tokenizer", "--data", "{data}", "--out", "{tmp}/tok.json"], 2,
     ["tok.json exists", "--force"]),
    ("model-card-missing-run", nothing, ["model-card", "{tmp}/nope", "--data", "{data}"], 2,
     ["nope", "does not exist"]),
    # -------------------------------------------------- broken weights folders: exit 1
    ("n-layer-million", lambda c: config_json(c, n_layer=10**6), ["info", *W], 1,
     ["n_layer 1,000,000 is too large"]),
    ("n-layer-billion", lambda c: config_json(c, n_layer=10**9), ["embed", TEXT, *W], 1,
     ["n_layer 1,000,000,000 is too large"]),
    ("n-layer-beyond-file", lambda c: config_json(c, n_layer=1000), ["info", *W], 1,
     ["n_layer 1,000 (12,004 tensors)", "holds 28 tensors"]),
    ("vocab-huge", lambda c: config_json(c, vocab_size=10**12), ["info", *W], 1,
     ["vocab_size", "too large"]),
    ("n-embd-float", lambda c: config_json(c, n_embd=128.9), ["info", *W], 1,
     ["n_embd", "whole number", "128.9"]),
    ("n-embd-string", lambda c: config_json(c, n_embd="16"), ["info", *W], 1,
     ["n_embd", "'16'"]),
    ("n-embd-bool", lambda c: config_json(c, n_embd=True), ["info", *W], 1, ["n_embd", "True"]),
    ("n-embd-whole-float", lambda c: config_json(c, n_embd=16.0), ["info", *W], 1, ["n_embd"]),
    ("config-unscaled-attention", lambda c: config_json(c, scale_attn_weights=False),
     ["embed", TEXT, *W], 1, ["scale_attn_weights False is not supported"]),
    ("config-list", config_text("[1, 2, 3]"), ["info", *W], 1, ["JSON object", "list"]),
    ("config-deep", config_text("[" * 100_000 + "]" * 100_000), ["info", *W], 1,
     ["nested too deeply"]),
    ("config-huge", config_text(" " * (2 << 20) + "{}"), ["info", *W], 1, ["larger than"]),
    ("eps-nan", config_text('{"n_embd": 16, "layer_norm_epsilon": NaN}'), ["info", *W], 1,
     ["NaN"]),
    ("eps-zero", lambda c: config_json(c, layer_norm_epsilon=0), ["info", *W], 1,
     ["layer_norm_epsilon", "(0, 1]"]),
    ("eps-negative", lambda c: config_json(c, layer_norm_epsilon=-1e-5), ["info", *W], 1,
     ["layer_norm_epsilon"]),
    ("n-head-not-dividing", lambda c: config_json(c, n_head=3), ["info", *W], 1,
     ["divisible by n_head (3)"]),
    ("dtype-f8", with_raw_dtype("F8_E4M3"), ["info", *W], 1, ["ln_f.bias", "F8_E4M3"]),
    ("header-shape-lies", claimed_shape, ["info", *W], 1,
     ["wte.weight", "bytes for shape [1000000000000, 16]"]),
    ("dtype-int", set_tensor(PREFIX + "ln_f.bias", lambda t: np.ones(16, np.int64)),
     ["info", *W], 1, ["ln_f.bias", "I64", "int64"]),
    ("duplicate-prefix", duplicate_names, ["info", *W], 1, ["ln_f.bias", "appears twice"]),
    ("f16-inf", set_tensor(PREFIX + "ln_f.bias", lambda t: np.full(16, np.inf, np.float16)),
     ["info", *W], 1, ["ln_f.bias", "NaN or infinite"]),
    ("f64-beyond-float32", set_tensor(PREFIX + "wpe.weight",
                                      lambda t: t[PREFIX + "wpe.weight"].astype(np.float64)
                                      * 1e300), ["info", *W], 1, ["wpe.weight", "infinite"]),
    ("lm-head-nan", set_tensor("lm_head.weight", lambda t: np.full_like(
        t[PREFIX + "wte.weight"], np.nan)), ["info", *W], 1, ["lm_head.weight", "NaN"]),
    ("lm-head-differs", set_tensor("lm_head.weight", lambda t: t[PREFIX + "wte.weight"] * 2),
     ["info", *W], 1, ["lm_head.weight differs", "ties"]),
    ("lm-head-shape", set_tensor("lm_head.weight", lambda t: t[PREFIX + "wte.weight"][:5]),
     ["info", *W], 1, ["lm_head.weight has shape [5, 16]"]),
    ("vocab-mismatch-bigger-model", vocabulary(4100), ["info", *W], 1,
     ["tokenizer has 4,096 tokens but the model 4,100"]),
    ("vocab-mismatch-smaller-model", vocabulary(4000), ["embed", TEXT, *W], 1,
     ["4,096", "4,000"]),
    # finite but huge weights: the forward pass overflows; the first bad value is named
    ("huge-ln-f-probs", set_tensor(PREFIX + "ln_f.weight", lambda t: np.full(16, 3e38,
                                                                             np.float32)),
     ["probs", TEXT, *W], 1, ["overflowed", "ln_final.out is the first value"]),
    ("huge-ln-f-logits-json", set_tensor(PREFIX + "ln_f.weight", lambda t: np.full(
        16, 3e38, np.float32)), ["logits", TEXT, "--json", *W], 1, ["ln_final.out"]),
    ("huge-c-attn-generate", set_tensor(PREFIX + "h.0.attn.c_attn.weight", lambda t: np.full(
        (16, 48), 1e30, np.float32)), ["generate", TEXT, "-n", "3", *W], 1,
     ["overflowed", "layers.0.scores is the first value"]),
    ("huge-c-attn-score", set_tensor(PREFIX + "h.0.attn.c_attn.weight", lambda t: np.full(
        (16, 48), 1e30, np.float32)), ["score", TEXT, *W], 1, ["layers.0.scores"]),
    ("huge-c-fc-neurons", set_tensor(PREFIX + "h.1.mlp.c_fc.weight", lambda t: np.full(
        (16, 24), 3e38, np.float32)), ["neurons", TEXT, "--layer", "1", *W], 1,
     ["overflowed", "layers.1.mlp_pre"]),
    ("steer-scale-huge", nothing, ["probs", TEXT, "--steer", "Lily was happy", "--steer-away",
                                   "Lily was sad", "--steer-layer", "1", "--steer-scale",
                                   "1e39", *W], 2,
     ["overflowed: the steering vector times --steer-scale put infinite or NaN numbers "
      "into layers.1.resid_pre"]),
    ("tokenizer-wordpiece", wordpiece_tokenizer, ["encode", TEXT, *W], 1,
     ["tokenizer.json is not a tokenizer whose tokens are bytes", "WordPiece"]),
    ("tokenizer-padded", padded_tokenizer, ["encode", TEXT, *W], 1,
     ["tokenizer.json is larger than 16,777,216 bytes"]),
    ("offsets-overlap", moved_offsets(overlap_bias), ["encode", TEXT, *W], 1,
     ["not a readable safetensors file", "bytes of tensor transformer.ln_f.weight overlap "
      "those of tensor transformer.ln_f.bias"]),
    ("offsets-gap", moved_offsets(lambda h: h[PREFIX + "wte.weight"].update(
        data_offsets=[o + 8 for o in h[PREFIX + "wte.weight"]["data_offsets"]])),
     ["encode", TEXT, *W], 1, ["not a readable safetensors file"]),
    ("header-many-entries", many_header_entries, ["encode", TEXT, *W], 1,
     ["model.safetensors: its header is", "more than a file of a GPT-2 model"]),
    ("trailing-bytes", trailing_bytes, ["encode", TEXT, *W], 1,
     ["not a readable safetensors file", "300 bytes after its last tensor"]),
    ("tokenizer-normalizer", tokenizer_edit(lowercase), ["encode", TEXT, *W], 1,
     ["not a tokenizer whose tokens are bytes", "it has a normalizer, Lowercase"]),
    ("tokenizer-byte-without-token", tokenizer_edit(no_token_for_byte_0),
     ["encode", TEXT + "\x00", *W], 2, ["character 28 (U+0000, a control character) needs "
                                       "byte 0x00, which this model's tokenizer has no token"]),
    ("tokenizer-whitespace-first", tokenizer_edit(whitespace_first), ["encode", TEXT, *W], 1,
     ["not a tokenizer whose tokens are bytes", "its pre-tokenizer has Whitespace"]),
    ("tokenizer-no-decoder", tokenizer_edit(no_decoder), ["decode", "1", "2", *W], 1,
     ["not a tokenizer whose tokens are bytes", "it has no decoder"]),
    ("means-header-huge", means_with_a_huge_header,
     ["ablate", TEXT, "-l", "0", "-H", "0", "--mode", "mean", *W], 1,
     ["means.safetensors: its header is"]),
    # messages that say what happened
    ("weights-symlink-loop", symlink_loop, ["info", "--weights", "{tmp}/loop"], 1,
     ["loop is a symbolic link that leads nowhere"]),
    ("weights-file-a-fifo", side_file("model.safetensors", os.mkfifo), ["info", *W], 1,
     ["model.safetensors is not a regular file"]),
    ("weights-file-a-folder", side_file("model.safetensors", Path.mkdir), ["info", *W], 1,
     ["model.safetensors is a folder, not a file"]),
    ("config-5000-digits", config_text('{"n_embd": 1' + "0" * 5000 + "}"), ["info", *W], 1,
     ["config: a number of more than 4,300 digits"]),
    ("out-under-a-file", plain_file, ["train-tokenizer", "--data", "{data}", "--out",
                                      "{tmp}/f/t.json", "--vocab-size", "257"], 1,
     ["cannot write", "f/t.json", "/f is a file, not a folder"]),
    ("save-under-a-file", plain_file, ["attn", TEXT, "--save", "{tmp}/f/a.svg", *W], 2,
     ["the folder", "/f is a file"]),
    ("train-lock-planted-link", planted_lock, [*TRAIN, *DATA, "--out", "{run}", "--resume"], 1,
     ["cannot write", ".train.lock", "symbolic link, which tinygpt never writes through"]),
    ("embed-5-mb", stdin_bytes(b"Lily wanted to play. " * 250_000), ["embed", "-", *W], 2,
     ["the text on stdin is more than", "bytes long (read no further); this model reads at "
      "most 128 tokens"]),
    # -------------------------------------------------- the analysis commands: exit 2
    ("lens-target-not-a-token", nothing, ["lens", TEXT, "--target", "nosuchtokenxyz", *W], 2,
     ["'nosuchtokenxyz' is not a single token", "it is"]),
    ("dla-vs-several-tokens", nothing, ["dla", TEXT, "--vs", " toys and more", *W], 2,
     ["not a single token", "' toys' ' and' ' more'"]),
    ("ablate-nothing-named", nothing, ["ablate", TEXT, *W], 2, ["--layer L", "--all"]),
    ("ablate-layer-out-of-range", nothing, ["ablate", TEXT, "--layer", "9", "--mlp", *W], 2,
     ["layer 9 is out of range"]),
    ("patch-unequal-lengths", nothing, ["patch", TEXT, "Lily wanted", *W], 2,
     ["6 tokens", "the same number of tokens"]),
    ("attribute-unknown-method", nothing, ["attribute", TEXT, "--method", "magic", *W], 2,
     ["unknown --method 'magic'", "integrated-gradients"]),
    ("means-data-missing", nothing, ["means", "--data", "{tmp}/nowhere", *W], 2,
     ["nowhere", "does not exist"]),
    ("means-out-a-folder", nothing, ["means", "--data", "{data}", "--out", "{tmp}", *W], 2,
     ["is a folder", "--out means.safetensors"]),
    ("score-file-missing", nothing, ["score", "--file", "{tmp}/nowhere.txt", *W], 2,
     ["nowhere.txt does not exist"]),
    ("score-stride-zero", nothing, ["score", TEXT, "--stride", "0", *W], 2, ["--stride"]),
    ("heads-file-missing", nothing, ["heads", "--file", "{tmp}/nowhere.txt", *W], 2,
     ["nowhere.txt"]),
    ("neurons-layer-out-of-range", nothing, ["neurons", TEXT, "--layer", "9", *W], 2,
     ["layer 9 is out of range"]),
    ("diff-one-text", nothing, ["diff", TEXT, *W], 2, ["two texts", "--weights-b"]),
    ("circuit-unequal-lengths", nothing, ["circuit", TEXT, "Lily wanted", *W], 2,
     ["6 tokens", "the same number of tokens"]),
    ("circuit-pairs-a-folder", nothing,
     ["circuit", TEXT, TEXT, "--stability", "--pairs", "{tmp}", *W], 2,
     ["--pairs", "cannot read it", "Is a directory"]),
    ("qk-key-after-query", nothing, ["qk", TEXT, "--query", "2", "--key", "4", *W], 2,
     ["--key 4 is out of range", "0..2"]),
    ("diff-weights-b-missing", nothing, ["diff", TEXT, "--weights-b", "{tmp}/nowhere", *W], 2,
     ["nowhere", "does not exist"]),
    ("history-missing", nothing, ["history", TEXT, *W], 2, ["history"]),
    ("history-snapshot-of-other-weights", snapshot(snapshot_of_other_weights),
     ["history", TEXT, *W], 2,
     ["step-000010.safetensors: the snapshot was made for other weights (weights_sha256 ",
      "this model's is "]),
    ("history-position-out-of-range", snapshot(step_not_a_number),
     ["history", TEXT, "--position", "-129", *W], 2, ["position -129 is out of range"]),
    ("why-data-missing", nothing, ["why", TEXT, "--data", "{tmp}/nowhere", *W], 2,
     ["nowhere", "does not exist"]),
    ("why-data-fifo", data_with("part-000.txt", os.mkfifo),
     ["why", TEXT, "--data", "{tmp}/d", *W], 2, ["part-000.txt is not a regular file"]),
    ("means-data-binary", data_with("part-002.txt", lambda p: p.write_bytes(b"\x00\x01" * 50)),
     ["means", "--data", "{tmp}/d", *W], 2, ["part-002.txt looks binary"]),
    ("number-of-5000-digits", nothing, ["attn", TEXT, "--layer", "9" * 5000, *W], 2,
     ["more than 4,300 digits"]),
    ("trace-path-too-long", nothing, ["trace", TEXT, "layers" + "[0]" * 100, *W], 2,
     ["a path of 306 characters"]),
    ("integrated-gradients-steps-too-many", nothing,
     ["attribute", TEXT, "--method", "integrated-gradients", "--steps", "5000", *W], 2,
     ["--steps", "4096"]),
    # -------------------------------------------------- damaged side files: exit 1, named
    ("history-header-not-json", snapshot(header_not_json), ["history", TEXT, *W], 1,
     ["step-000010.safetensors is not a readable safetensors file (header: Expecting"]),
    ("history-step-not-a-number", snapshot(step_not_a_number), ["history", TEXT, *W], 1,
     ["step-000010.safetensors", "'ten'", "not a number"]),
    ("history-fifo", snapshot(os.mkfifo), ["history", TEXT, *W], 1,
     ["step-000010.safetensors is not a regular file"]),
    ("history-snapshot-nan", snapshot(snapshot_with_nan), ["history", TEXT, *W], 1,
     ["step-000010.safetensors: tensor transformer.wpe.weight holds NaN"]),
    ("history-snapshot-unstamped", snapshot(snapshot_unstamped), ["history", TEXT, *W], 1,
     ["step-000010.safetensors: its metadata does not say which weights the snapshot was "
      "made for (weights_sha256); history/ holds the snapshots of the run that ended in the "
      "model beside it (a run stamps them when it ends: tinygpt train --resume finishes an "
      "interrupted one)"]),
    ("means-file-damaged", lambda c: (c.broken / "means.safetensors").write_bytes(b"\xff" * 64),
     ["ablate", TEXT, "--all", "--mode", "mean", *W], 1,
     ["means.safetensors is not a readable safetensors file"]),
    ("sae-file-damaged", lambda c: _write(c.broken / SAE, b"\xff" * 64),
     ["sae", "eval", *W], 1, ["layers.1.resid_post.safetensors is not a readable safetensors"]),
    ("sae-file-wrong-shapes", lambda c: _write(c.broken / SAE, _tensors(
        W_enc=(5, 8), b_enc=(8,), W_dec=(8, 5), b_dec=(5,))),
     ["trace", TEXT, "sae.layers.1.resid_post", *W], 1, ["W_enc has shape [5, 8]"]),
    ("sae-file-missing", nothing, ["sae", "feature", "3", *W], 2,
     ["no SAE file at", "sae train --site layers.1.resid_post"]),
    ("sae-train-k-over-latents", nothing, ["sae", "train", "--site", "layers.1.resid_post",
                                           "--latents", "8", "--k", "9", *W], 2,
     ["--k 9 is more than the 8 latents"]),
    ("sae-train-steered-default-file", nothing,
     ["sae", "train", "--site", "layers.1.resid_post", "--steer", "Lily", "--steer-away", "Tom",
      "--steer-layer", "1", *W], 2,
     ["a steered run does not write over the weights folder's sae/SITE.safetensors",
      "give --out FILE"]),
    ("sae-train-out-a-folder", nothing, ["sae", "train", "--site", "layers.1.resid_post",
                                         "--out", "{tmp}", *W], 2,
     ["--out", "that is a folder; give a file name, e.g. --out sae.safetensors"]),
    ("lens-fit-lens-a-folder", nothing, ["lens", "--fit", "--lens", "{tmp}", *W], 2,
     ["--lens", "that is a folder; give a file name, e.g. --lens tuned.safetensors"]),
    ("means-steered-default-file", nothing,
     ["means", "--steer", "Lily", "--steer-away", "Tom", "--steer-layer", "1", *W], 2,
     ["a steered run does not write over the weights folder's means.safetensors"]),
    ("lens-fit-steered-default-file", nothing,
     ["lens", "--fit", "--steer", "Lily", "--steer-away", "Tom", "--steer-layer", "1", *W], 2,
     ["a steered run does not write over the weights folder's lens/tuned.safetensors",
      "give --lens FILE"]),
    ("lens-file-damaged", lambda c: _write(c.broken / "lens" / "tuned.safetensors", b"\0" * 9),
     ["lens", TEXT, "--kind", "tuned", *W], 1, ["tuned.safetensors is not a readable"]),
    ("lens-translator-missing", lambda c: _write(c.broken / "lens" / "tuned.safetensors",
                                                 _tensors(**{"A.0": (16, 16)})),
     ["lens", TEXT, "--kind", "tuned", *W], 1, ["b.0 must be [16] finite floats (missing)"]),
    ("tokenizer-ids-past-the-vocabulary", shifted_token_ids, ["embed", TEXT, *W], 1,
     ["tokenizer.json", "token ids are not 0 to 4,095"]),
    ("tokenizer-ids-with-a-gap", gap_in_token_ids, ["embed", TEXT, *W], 1,
     ["tokenizer.json", "token ids are not 0 to 4,095"]),
    # -------------------------------------------------- broken runs and failed writes: exit 1
    ("log-damaged-middle", log_lines(lambda s: "{oops\n" + s),
     ["model-card", "{run}", "--data", "{data}"], 1, ["log.jsonl line 1", "damaged"]),
    ("log-missing", log_lines(lambda s: s) , ["model-card", "{tmp}", "--data", "{data}"], 1,
     ["weights folder"]),
    ("checkpoint-damaged", lambda c: (c.run / "checkpoint.npz").write_bytes(b"PK junk"),
     [*TRAIN, *DATA, "--out", "{run}", "--resume"], 1, ["checkpoint.npz", "damaged", "--force"]),
    ("disk-full", no_space_left,
     ["train-tokenizer", "--data", "{data}", "--out", "{tmp}/t.json", "--vocab-size", "257"], 1,
     ["cannot write", "t.json", "No space left on device"]),
    ("read-only-run", read_only, ["model-card", "{run}", "--data", "{data}"], 1,
     ["cannot write", "loss_curve.svg", "Permission denied"]),
]


@pytest.mark.parametrize("setup, argv, code, needles",
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_case(ctx, monkeypatch, setup, argv, code, needles):
    def too_long(signum, frame):  # noqa: ARG001 - the signal handler's signature
        raise TimeoutError("the case ran for over 60 s: something blocked (a FIFO read?)")

    previous = signal.signal(signal.SIGALRM, too_long)
    signal.alarm(60)
    try:
        _hostile_case(ctx, monkeypatch, setup, argv, code, needles)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _hostile_case(ctx, monkeypatch, setup, argv, code, needles):
    setup(ctx)
    if "patch" in ctx.extra:
        module, name, fn = ctx.extra["patch"]
        monkeypatch.setattr(module, name, fn)
    try:
        r = _run_main([ctx.fill(a) for a in argv], ctx.stdin)
    finally:
        if "lock" in ctx.extra:
            os.close(ctx.extra["lock"])
    assert_error(r, code, *needles)


def test_every_command_refuses_a_tokenizer_of_another_size(ctx):
    vocabulary(4100)(ctx)
    for argv in (["encode", TEXT], ["embed", TEXT], ["pos", TEXT], ["norm", TEXT],
                 ["attn", TEXT], ["mlp", TEXT], ["blocks", TEXT], ["final-norm", TEXT],
                 ["logits", TEXT], ["probs", TEXT], ["sample", TEXT], ["generate", TEXT],
                 ["decode", "1"], ["trace", TEXT, "logits"], ["review", TEXT], ["map", TEXT],
                 ["info"]):
        assert_error(_run_main([*argv, "--weights", ctx.broken]), 1, "4,096", "4,100")


# ------------------------------------------------------------------ raw bytes from a shell


def test_raw_bytes_in_argv_and_stdin_from_a_real_process(tiny):
    env = {k: v for k, v in os.environ.items() if k != "TINYGPT_WEIGHTS"}
    for argv, stdin in (([b"embed", b"Lily \xff"], b""), ([b"embed", b"-"], b"Lily \xc3\x28")):
        proc = subprocess.run([sys.executable.encode(), b"-m", b"tinygpt_cli", *argv,
                               b"--weights", str(tiny.folder).encode()], input=stdin,
                              capture_output=True, env=env, timeout=60)
        err = proc.stderr.decode()
        assert proc.returncode == 2 and proc.stdout == b"", err
        assert err.count("\n") == 1 and err.startswith("error: ") and "UTF-8" in err, err


# ------------------------------------------------------------------ no write through a link


@pytest.fixture
def victim(tmp_path) -> Path:
    v = tmp_path / "victim.txt"
    v.write_text("precious\n")
    return v


def plant(folder: Path, names, victim: Path) -> None:
    for name in names:
        p = folder / name
        if p.exists() or p.is_symlink():
            p.unlink()
        p.symlink_to(victim)


def test_train_never_writes_through_planted_links(ctx, victim):
    names = ["command.txt", "result.json", "log.jsonl", "config.json", "model.safetensors"]
    plant(ctx.run, names, victim)
    r = run(ctx, *TRAIN, *DATA, "--out", ctx.run, "--steps", "4", "--force")
    assert r.code == 0, r.err
    assert victim.read_text() == "precious\n"
    for name in names:
        assert not (ctx.run / name).is_symlink(), name
    assert json.loads((ctx.run / "result.json").read_text())["steps"] == 4


def test_resume_replaces_a_planted_log_link_instead_of_appending_to_it(ctx, victim):
    shutil.copyfile(ctx.run / "log.jsonl", victim)  # a victim that parses as a log
    before = victim.read_bytes()
    plant(ctx.run, ["log.jsonl", "command.txt"], victim)
    r = run(ctx, *TRAIN, *DATA, "--out", ctx.run, "--steps", "6", "--resume")
    assert r.code == 0, r.err
    assert victim.read_bytes() == before
    assert not (ctx.run / "log.jsonl").is_symlink()
    assert [json.loads(ln)["step"] for ln in (ctx.run / "log.jsonl").read_text().splitlines()] \
        == list(range(1, 7))


def test_a_planted_history_link_is_refused(ctx, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (ctx.run / "history").symlink_to(elsewhere, target_is_directory=True)
    r = run(ctx, *TRAIN, *DATA, "--out", ctx.run, "--steps", "4", "--force", "--snapshots", "1")
    assert_error(r, 1, "history", "symbolic link")  # refused before training starts
    assert list(elsewhere.iterdir()) == []


def test_model_card_never_writes_through_planted_links(ctx, victim):
    plant(ctx.run, ["MODEL_CARD.md", "loss_curve.svg"], victim)
    r = _run_main(["model-card", ctx.run, "--data", ctx.data, "--force"])
    assert r.code == 0, r.err
    assert victim.read_text() == "precious\n"
    assert (ctx.run / "MODEL_CARD.md").read_text().startswith("# tinygpt model card")
    assert (ctx.run / "loss_curve.svg").read_text().startswith("<svg")


def test_append_line_refuses_a_link_and_a_hard_link(tmp_path, victim):
    from tinygpt_cli.errors import WriteError
    from tinygpt_cli.storage.files import append_line

    (tmp_path / "soft").symlink_to(victim)
    with pytest.raises(WriteError, match="symbolic link"):
        append_line(tmp_path / "soft", "{}")
    os.link(victim, tmp_path / "hard")
    with pytest.raises(WriteError, match="hard link"):
        append_line(tmp_path / "hard", "{}")
    assert victim.read_text() == "precious\n"
    append_line(tmp_path / "log", '{"step": 1}')
    append_line(tmp_path / "log", '{"step": 2}')
    assert (tmp_path / "log").read_text() == '{"step": 1}\n{"step": 2}\n'


# ------------------------------------------------------------------ training that goes wrong


def test_a_diverging_loss_stops_with_exit_1_and_strict_json(ctx, monkeypatch):
    import tinygpt_cli.jobs.train.loop as loop

    real = loop.loss_and_grads
    calls = []

    def nan_at_step_3(*args, **kwargs):
        loss, grads = real(*args, **kwargs)
        calls.append(1)
        return (float("nan") if len(calls) == 3 else loss), grads

    monkeypatch.setattr(loop, "loss_and_grads", nan_at_step_3)
    out = ctx.tmp / "diverged"
    r = run(ctx, *TRAIN, *DATA, "--out", out, "--steps", "6")
    # The progress bar was on stderr before; the error is the last line, and the only one.
    assert r.code == 1 and r.out == "" and "Traceback" not in r.err
    errors = [ln for ln in r.err.splitlines() if ln.startswith("error:")]
    assert errors == [r.err.splitlines()[-1]] and not CATCH_ALL.search(errors[0])
    for needle in ("diverged at step 3", "loss is nan", "step 2", "--lr"):
        assert needle in errors[0]
    assert "best validation" not in r.err
    assert not (out / "result.json").exists()  # never reports success
    log = (out / "log.jsonl").read_text()
    assert "NaN" not in log and [json.loads(x)["step"] for x in log.splitlines()] == [1, 2]


def test_result_json_is_strict_without_validation(ctx):
    out = ctx.tmp / "noval"
    one = ctx.tmp / "one.txt"
    shutil.copyfile(ctx.data / "part-000.txt", one)
    r = run(ctx, *TRAIN, "--data", one, "--out", out)
    assert r.code == 0, r.err
    assert "no validation data" in r.err and "nan" not in r.err.lower()
    result = json.loads((out / "result.json").read_text(), parse_constant=pytest.fail)
    assert result["best_val_loss"] is None and result["machine"]["cpu_count"] >= 1
    # and model-card works for it
    r = _run_main(["model-card", out, "--data", one])
    assert r.code == 0, r.err
    card = (out / "MODEL_CARD.md").read_text()
    assert "the run had no validation data" in card and "| validation" not in card


def test_a_torn_last_log_line_is_skipped_with_a_warning_on_resume(ctx):
    with open(ctx.run / "log.jsonl", "a") as f:
        f.write('{"step": 5, "train_lo')
    r = run(ctx, *TRAIN, *DATA, "--out", ctx.run, "--steps", "6", "--resume")
    assert r.code == 0, r.err
    assert "skipped the torn last line" in r.err
    steps = [json.loads(x)["step"] for x in (ctx.run / "log.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 7))


def test_force_starts_over_and_removes_the_old_history(ctx):
    r = run(ctx, *TRAIN, *DATA, "--out", ctx.run, "--steps", "4", "--snapshots", "2", "--force")
    assert r.code == 0, r.err
    old = sorted(p.name for p in (ctx.run / "history").iterdir())
    r = run(ctx, *TRAIN, *DATA, "--out", ctx.run, "--steps", "3", "--force")
    assert r.code == 0, r.err
    assert old and list((ctx.run / "history").iterdir()) == []
    steps = [json.loads(x)["step"] for x in (ctx.run / "log.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]


def test_train_never_prints_a_loss_before_the_first_step(ctx):
    r = run(ctx, *TRAIN, *DATA, "--out", ctx.tmp / "fresh", "--steps", "2")
    assert r.code == 0, r.err
    assert "nan" not in r.err.lower()


# ------------------------------------------------------------------ the model card


def test_model_card_uses_the_run_and_paths_a_user_can_reproduce(ctx, monkeypatch):
    """The command comes from command.txt with absolute paths made relative to the current
    folder, the data names from the data, EMA and history from the run; never 'shipped'."""
    out = ctx.tmp / "cardrun"
    argv = [*TRAIN, *DATA, "--out", out, "--steps", "4", "--ema", "0.9", "--snapshots", "2"]
    monkeypatch.setattr(sys, "argv", ["tinygpt", *[ctx.fill(a) for a in argv]])
    r = run(ctx, *TRAIN, "--data", ctx.data, "--out", out, "--steps", "4", "--ema", "0.9",
                   "--snapshots", "2")
    assert r.code == 0, r.err
    command = (out / "command.txt").read_text()
    assert str(ctx.data) in command  # absolute, as this test typed it
    monkeypatch.chdir(ctx.tmp)
    r = _run_main(["model-card", "cardrun", "--data", "../" + ctx.tmp.name + "/../"
                   + ctx.tmp.name + "/" + os.path.relpath(ctx.data, ctx.tmp)])
    assert r.code == 0, r.err
    card = (out / "MODEL_CARD.md").read_text()
    assert str(ctx.tmp) not in card  # no absolute path of this machine
    relative = os.path.relpath(ctx.data, ctx.tmp)
    assert f"--data {relative} --out cardrun" in card
    assert "`part-000.txt`, `part-001.txt` for training and `part-002.txt`" in card
    assert f"{os.cpu_count()} CPU cores" in card and "the machine it ran on" in card
    assert "moving average of the parameters with decay 0.9" in card
    assert "float16 snapshot" in card and "`history/`" in card
    assert "shipped" not in card.lower() and "TinyStories" not in card
    assert "validation (part-002.txt)" in (out / "loss_curve.svg").read_text()


def test_model_card_shows_progress_on_a_terminal(ctx, monkeypatch):
    """The evaluation reports each batch to cli.common.progress with the right total."""
    from tinygpt_cli.cli import common

    seen = {}

    def fake_progress(total, description, **kw):
        import contextlib

        seen["total"], seen["done"] = total, 0

        def advance(n=1):
            seen["done"] += n
        return contextlib.nullcontext(advance)

    monkeypatch.setattr(common, "progress", fake_progress)
    r = _run_main(["model-card", ctx.run, "--data", ctx.data])
    assert r.code == 0, r.err
    assert seen["total"] > 0 and seen["done"] == seen["total"]


def test_overflowing_weights_warn_nothing_in_a_real_process(ctx):
    """NumPy's RuntimeWarnings are printed once per process, so only a fresh one shows them."""
    set_tensor(PREFIX + "h.0.attn.c_attn.weight", lambda t: np.full((16, 48), 1e30,
                                                                    np.float32))(ctx)
    env = {k: v for k, v in os.environ.items() if k != "TINYGPT_WEIGHTS"}
    for argv in (["probs", TEXT], ["generate", TEXT, "--seed", "1", "-n", "2"]):
        proc = subprocess.run([sys.executable, "-m", "tinygpt_cli", *argv, "--weights",
                               str(ctx.broken)], capture_output=True, text=True, env=env,
                              timeout=60)
        assert proc.returncode == 1 and proc.stdout == "", proc.stderr
        assert proc.stderr == ("error: the forward pass overflowed: layers.0.scores is the "
                               "first value holding infinite or NaN numbers (weights too large "
                               "to compute with in float32)\n")


# ------------------------------------------------------------------ the cache


def _neurons(ctx, *extra):
    return run(ctx, "neurons", "--layer", "1", "--neuron", "3", "--data", "{data}", "--top",
               "2", "--json", "--weights", "{tiny}", *extra)


def _no_record(ctx) -> str:
    """The one line neurons --data prints for the test's weights, which record no text."""
    return (f"note: {ctx.tiny} has no record of its training text (data.json, which tinygpt "
            "train writes): using --data as given\n")


def test_a_cache_entry_of_the_wrong_shape_is_rebuilt(ctx, monkeypatch):
    import tinygpt_cli.analysis.neurons as nrn

    monkeypatch.setenv("TINYGPT_CACHE", str(ctx.tmp / "cache"))
    first = _neurons(ctx)
    assert (first.code, first.err) == (0, _no_record(ctx))
    (path,) = (ctx.tmp / "cache" / "neurons").glob("*.npz")
    good = dict(np.load(path))
    truncated = path.read_bytes()[: path.stat().st_size // 2]  # a zip without its directory
    for bad in ({"stream": good["stream"]},  # keys missing
                {**good, "window": good["window"][:, :3]},  # a shape of other sizes
                {**good, "window": good["window"] + 10**6},  # windows past the data's end
                {**good, "window": good["window"].astype(np.float64)},  # not indices
                truncated):
        if isinstance(bad, bytes):
            path.write_bytes(bad)
        else:
            np.savez(path, **bad)
        again = _neurons(ctx)
        assert (again.code, again.out, again.err) == (0, first.out, _no_record(ctx)), again.err
        assert set(np.load(path).files) == set(good)
    calls = []
    real = nrn.window_maxima
    monkeypatch.setattr(nrn, "window_maxima", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert _neurons(ctx).out == first.out and calls == []  # the rebuilt entry is used


def test_an_unwritable_cache_still_shows_the_result(ctx, monkeypatch):
    import tempfile

    monkeypatch.setenv("TINYGPT_CACHE", str(ctx.tmp / "cache"))
    clean = _neurons(ctx)
    monkeypatch.setenv("TINYGPT_CACHE", str(ctx.tmp / "other"))

    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(tempfile, "mkstemp", denied)
    r = _neurons(ctx)
    assert r.code == 0 and r.out == clean.out
    assert re.fullmatch(rf"note: cannot write {re.escape(str(ctx.tmp))}/other/neurons/\w+\.npz: "
                        r"Permission denied; the result is not kept for the next run \(set "
                        r"TINYGPT_CACHE to a writable folder\)\n" + re.escape(_no_record(ctx)),
                        r.err), r.err


def test_an_unwritable_cache_still_gives_the_mean_ablation(ctx, monkeypatch):
    import tempfile

    argv = ["ablate", TEXT, "-l", "0", "-H", "0", "--mode", "mean", "--data", "{data}",
            "--json", "--weights", "{tiny}"]
    monkeypatch.setenv("TINYGPT_CACHE", str(ctx.tmp / "cache"))
    clean = run(ctx, *argv)
    assert clean.code == 0, clean.err
    monkeypatch.setenv("TINYGPT_CACHE", str(ctx.tmp / "other"))

    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(tempfile, "mkstemp", denied)
    r = run(ctx, *argv)
    assert r.code == 0 and r.out == clean.out
    assert re.search(rf"note: cannot write {re.escape(str(ctx.tmp))}/other/means/\w+"
                     r"\.safetensors: Permission denied; the result is not kept", r.err), r.err


def test_a_file_name_that_is_not_utf8_is_shown_by_its_bytes(ctx):
    """Python keeps such a name's bytes as lone surrogates (surrogateescape); a message shows
    the byte, \\xff, never the surrogate \\udcff."""
    r = run(ctx, "score", "--file", "{tmp}/x\udcff.txt", "--weights", "{tiny}")
    assert (r.code, r.out) == (2, "")
    assert r.err == f"error: {ctx.tmp}/x\\xff.txt does not exist\n", r.err


def test_huge_finite_weights_give_an_infinite_perplexity_not_an_error(ctx):
    """The forward pass stays finite (the norms rescale; their sums of squares, ~1e35, fit
    float32), the loss is ~1e17 nats a token: its perplexity is inf (e**1e17), printed as
    such, not a catch-all OverflowError. (At 1e19 the squares overflow: test_hostile_files.)"""
    def bigger(t):
        t[PREFIX + "wte.weight"] = t[PREFIX + "wte.weight"] * np.float32(1e17)

    tensors(ctx, bigger)
    r = run(ctx, "score", TEXT, "--json", "--weights", "{broken}")
    assert r.code == 0, r.err
    doc = json.loads(r.out.splitlines()[-1])  # JSON lines: the tokens, then the summary
    assert doc["perplexity"] is None and doc["mean_nats"] > 1e15, doc  # no inf in JSON: null
    view = run(ctx, "score", TEXT, "--weights", "{broken}")
    assert view.code == 0 and "perplexity inf" in view.out, view.out


# ------------------------------------------------------------------ a stderr that fails


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_stderr_is_treated_like_a_closed_one(ctx):
    """`2>/dev/full`: every write to stderr fails. The notes are lost, nothing else is."""
    env = {k: v for k, v in os.environ.items() if k != "TINYGPT_WEIGHTS"}
    with open("/dev/full", "w") as full:
        def tinygpt(*argv):
            return subprocess.run([sys.executable, "-m", "tinygpt_cli", *map(str, argv)],
                                  stdout=subprocess.PIPE, stderr=full, text=True, env=env,
                                  timeout=120)
        r = tinygpt("generate", TEXT, "-n", "3", "--weights", ctx.tiny)  # a seed note first
        assert r.returncode == 0 and r.stdout.startswith(TEXT) and len(r.stdout) > len(TEXT)
        r = tinygpt("attn", TEXT, "--layer", "9", "--weights", ctx.tiny)
        assert (r.returncode, r.stdout) == (2, "")
        out = ctx.tmp / "full"
        r = tinygpt(*TRAIN, *[ctx.fill(a) for a in DATA], "--out", out)
        assert r.returncode == 0
        assert json.loads((out / "result.json").read_text())["steps"] == 2
        assert (out / "model.safetensors").is_file()


def test_utf8_arguments_in_the_posix_locale_without_utf8_mode(tiny):
    """There Python decodes argv as ASCII, so 'café' arrives as surrogates: decoded again from
    its bytes it is the same text; bytes that are not UTF-8 are still refused."""
    env = {**{k: v for k, v in os.environ.items() if k not in ("TINYGPT_WEIGHTS", "LANG")},
           "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    want = tiny.model.tokenizer.encode("café")

    def tinygpt(*argv):
        return subprocess.run([sys.executable.encode(), b"-m", b"tinygpt_cli", *argv,
                               b"--weights", str(tiny.folder).encode()], capture_output=True,
                              env=env, timeout=60)
    r = tinygpt(b"encode", "café".encode(), b"--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ids"] == want
    r = tinygpt(b"encode", b"caf\xe9")
    assert r.returncode == 2 and b"not valid UTF-8 (byte 0xe9 at character 3)" in r.stderr


# ------------------------------------------------------------------ saved pictures


@pytest.mark.parametrize("suffix", [".html", ".svg"])
def test_review_pictures_escape_bidirectional_overrides(cli, tmp_path, suffix):
    """U+202E (right-to-left override) would show the rest of a line reversed: every place
    the text appears in the picture carries it as an escape, as the terminal view does."""
    out = tmp_path / f"review{suffix}"
    r = cli("review", "Lily \u202ewanted to", "--save", out, "--quiet")
    assert r.code == 0, r.err
    page = out.read_text(encoding="utf-8")
    assert "\u202e" not in page and "\u2066" not in page
    assert page.count("Lily \\u202ewanted to") >= 3  # the title, the facts, the next token


def test_closed_stdin_and_full_stdout_say_so(tiny):
    env = {k: v for k, v in os.environ.items() if k != "TINYGPT_WEIGHTS"}
    py, w = sys.executable, str(tiny.folder)
    r = subprocess.run(["bash", "-c", f'"{py}" -m tinygpt_cli embed - --weights "{w}" <&-'],
                       capture_output=True, text=True, env=env, timeout=60)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == "error: no text: stdin is closed; give the text as an argument\n"
    if not os.path.exists("/dev/full"):
        return
    # buffered, a short output fails only in the flush at the end; unbuffered, at its write
    buffered = {k: v for k, v in env.items() if k != "PYTHONUNBUFFERED"}
    for environment in (buffered, {**buffered, "PYTHONUNBUFFERED": "1"}):
        for argv in (["encode", TEXT], ["decode", "1", "2"], ["probs", TEXT, "--json"]):
            with open("/dev/full", "w") as full:
                r = subprocess.run([py, "-m", "tinygpt_cli", *argv, "--weights", w],
                                   stdout=full, stderr=subprocess.PIPE, text=True,
                                   env=environment, timeout=60)
            assert r.returncode == 1, (argv, r.stderr)
            assert r.stderr == ("error: cannot write to standard output: No space left on "
                                "device\n"), r.stderr


def test_help_examples_name_files_that_exist_from_the_readme_folder():
    """The README's commands run from the repository's root, where the project's data is
    ../shared/data/tinystories: an example of --help naming a file names it from there."""
    from tinygpt_cli.cli.app import _register, app

    root = Path(__file__).resolve().parent.parent
    _register()
    named = [w for c in app.registered_commands for line in (c.help or "").splitlines()
             if "tinygpt " in line for w in line.split() if w.endswith(".txt")]
    assert named, "no example names a file"
    if not (root / "../shared/data/tinystories").is_dir():
        pytest.skip("the project's data is not beside the repository")
    for name in named:
        assert (root / name).is_file(), name


# ------------------------------------------------------------------ reproducible files


def test_written_safetensors_are_the_same_bytes_every_time(ctx, tmp_path):
    from safetensors import safe_open

    from tinygpt_cli.storage.safetensors import safetensors_bytes

    rng = np.random.default_rng(0)
    tensors = {"b": rng.normal(size=(3, 2)).astype(np.float32),
               "a": rng.normal(size=4).astype(np.float16), "c": np.arange(5, dtype=np.int64)}
    one = safetensors_bytes(tensors, {"step": "10", "lr": "0.1", "format": "pt"})
    two = safetensors_bytes(dict(reversed(tensors.items())),
                            {"format": "pt", "lr": "0.1", "step": "10"})
    assert one == two
    (tmp_path / "t.safetensors").write_bytes(one)  # and the library reads it back exactly
    with safe_open(str(tmp_path / "t.safetensors"), framework="numpy") as f:
        assert f.metadata() == {"step": "10", "lr": "0.1", "format": "pt"}
        for name, a in tensors.items():
            got = f.get_tensor(name)
            assert got.dtype == a.dtype and np.array_equal(got, a)
    outs = []
    for name in ("m1.safetensors", "m2.safetensors"):
        r = run(ctx, "means", "--data", "{data}", "--out", tmp_path / name, "--weights",
                "{tiny}")
        assert r.code == 0, r.err
        outs.append((tmp_path / name).read_bytes())
    assert outs[0] == outs[1]


# ------------------------------------------------------------------ stdin only for '-'


def test_heads_reads_stdin_only_for_a_dash(ctx):
    """`while read line; do tinygpt heads; done < list` must not eat the loop's input."""
    piped = io.StringIO("Lily wanted to play with her\nTom ran\n")
    r = _run_main(["heads", "--json", "--weights", ctx.tiny], stdin=piped)
    assert r.code == 0, r.err
    assert json.loads(r.out)["source"] != "stdin" and piped.tell() == 0
    r = _run_main(["heads", "-", "--json", "--weights", ctx.tiny],
                  stdin=io.StringIO("Lily wanted to play\n"))
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["source"] == "stdin" and len(doc["text_ids"]) == 1


# ------------------------------------------------------------------ big inputs stay bounded


@pytest.mark.parametrize("argv", [["encode"], ["probs"], ["score"], ["trace", "logits[-1]"]],
                         ids=lambda a: a[0])
def test_each_line_opens_the_weights_folder_once(ctx, monkeypatch, argv):
    import tinygpt_cli.transformer.folder as weights

    opened, loaded = [], []
    real_open, real_load = weights._open_folder, weights._load_model
    monkeypatch.setattr(weights, "_open_folder", lambda f: opened.append(f) or real_open(f))
    monkeypatch.setattr(weights, "_load_model", lambda f: loaded.append(f) or real_load(f))
    lines = io.StringIO("Lily wanted\nTom ran to the\nthe cat sat on a mat\n")
    r = _run_main([argv[0], "--each-line", "-", *argv[1:], "--json", "--weights", ctx.tiny],
                  stdin=lines)
    assert r.code == 0, r.err
    records = [json.loads(x) for x in r.out.splitlines()]
    assert [d["line"] for d in records] == [1, 2, 3]
    assert len(opened) == 1 and len(loaded) == (argv[0] != "encode")
    one = _run_main([argv[0], "Tom ran to the", *argv[1:], "--json", "--weights", ctx.tiny])
    docs = [json.loads(x) for x in one.out.splitlines()]  # the same as a run of its own
    assert records[1]["result"] == (docs[0] if len(docs) == 1 else docs)
    assert len(opened) == 2  # and outside --each-line, each run opens the folder itself


def test_a_long_text_is_encoded_in_pieces_to_the_same_ids(tiny):
    """Cut where the pre-tokenizer always starts a piece, a long text gives exactly the ids of
    one call to the library (which holds ~600 bytes of bookkeeping per token)."""
    tok = tiny.model.tokenizer
    rng = random.Random(5)
    words = ["Lily", "wanted", "to", "play", "42", "!", "'s", "don't", "caf\u00e9", "\u00a0",
             "\u3000", "<|endoftext|>", "\t", "\r\n", "\n", "\n\n", " ", "  ", "-", "\U0001f600"]
    text = "".join(rng.choice(words) + rng.choice(["", " ", "  ", "\n", " \n "])
                   for _ in range(60_000))
    assert len(text) > 3 * (1 << 16)  # several pieces
    assert tok.encode(text) == tok._tok.encode(text, add_special_tokens=False).ids


def test_encode_shows_the_ends_of_a_long_text_and_json_every_token(ctx):
    text = "Once upon a time, Lily wanted to play.\n" * 2000
    stdin = io.TextIOWrapper(io.BytesIO(text.encode()), encoding="utf-8")
    r = _run_main(["encode", "-", "--weights", ctx.tiny], stdin=stdin)
    assert r.code == 0, r.err
    rows = [ln for ln in r.out.splitlines() if re.match(r"\s*\d+\s+\d+\s", ln)]
    text = text.removesuffix("\n")  # stdin's last newline is not part of the text
    n = len(json.loads(_run_main(["encode", text, "--json", "--weights", ctx.tiny]).out)["ids"])
    assert len(rows) == 200 and rows[0].split()[0] == "0" and rows[-1].split()[0] == str(n - 1)
    assert f"{n - 200:,} tokens not shown" in r.out and f"T = {n:,} tokens" in r.out
    assert rows[-1].split()[-1] == f"{len(text.encode()) - 1}\u2013{len(text.encode())}"


# ------------------------------------------------------------------ defaults that make sense


def test_patch_chooses_vs_when_both_runs_guess_the_same_token(cli, tiny):
    """The tiny model's top guess after both texts is the same token: --vs defaults to the
    corrupt run's next best (printed), instead of an error about options not given."""
    corrupt = "Lily wanted to read with her"
    tok = tiny.model.tokenizer
    clean_row = tiny.trace(tok.encode(TEXT)).get("logits")[-1]
    corrupt_row = tiny.trace(tok.encode(corrupt)).get("logits")[-1]
    t = int(np.argmax(clean_row))
    first, second = np.argsort(-corrupt_row, kind="stable")[:2]
    assert first == t  # the case this test is about
    r = cli("patch", TEXT, corrupt, "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["target"]["id"] == t and doc["vs"]["id"] == int(second)
    assert " ".join(r.err.split()) == (  # a note on stderr, wrapped to the width
        f"both runs' top guess is {tok.token_str(t)!r}: --vs is the corrupt run's next best, "
        f"{tok.token_str(int(second))!r} (give --vs to choose)")
    r = cli("patch", TEXT, corrupt, "--vs", f"#{t}")
    assert r.code == 2 and "give --target and --vs that differ" in r.err


def test_neuron_windows_mark_the_firing_token_without_colour(ctx, monkeypatch):
    """Colour alone marked it: invisible under NO_COLOR, in a pipe or a file."""
    monkeypatch.setenv("TINYGPT_CACHE", str(ctx.tmp / "cache"))
    monkeypatch.setenv("NO_COLOR", "1")
    doc = json.loads(_neurons(ctx).out)
    r = run(ctx, "neurons", "--layer", "1", "--neuron", "3", "--data", "{data}", "--top", "2",
            "--weights", "{tiny}")
    assert r.code == 0, r.err
    marked = [m for m in re.findall(r"\[([^\[\]]+)\]", r.out) if ":" not in m]
    assert len(marked) == len(doc["examples"]) == 2
    for got, example in zip(marked, doc["examples"], strict=True):
        assert got == example["token"].lstrip(" "), (got, example["token"])
