"""Every speed and memory figure of tinygpt against PyTorch + transformers, in one run.

    python benchmarks/run.py                 # all of it; writes benchmarks/results.md
    python benchmarks/run.py --runs 7 --no-training
    python benchmarks/run.py --no-torch      # tinygpt's own figures only

One thread each (OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1, set before NumPy is imported and
passed to every subprocess; torch.set_num_threads(1)), except the training comparison, which
is the 2-thread B 32 x T 128 step of benchmarks/train_speed.py. Each timing is the median of
--runs runs after one untimed warm-up, on the shipped weights, the reference measured in the
same process, the two taking turns run by run. Prints a table (what, tinygpt, reference,
ratio, goal, pass) and writes benchmarks/results.md with the date, the machine and the
figures. Without torch and transformers the reference columns say "skipped".
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
if any(os.environ.get(v) != "1" for v in THREAD_VARS):
    for v in THREAD_VARS:
        os.environ[v] = "1"
    if "numpy" in sys.modules:  # BLAS reads these once, when loaded
        os.execv(sys.executable, [sys.executable, *sys.argv])

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DATA = next((p for p in (Path(os.environ.get("TINYGPT_DATA", "/nonexistent")),
                         ROOT.parent / "shared" / "data" / "tinystories",
                         ROOT.parent.parent / "shared" / "data" / "tinystories")
             if p.is_dir()), ROOT.parent / "shared" / "data" / "tinystories")
PROMPT = "Lily wanted to play with her"
NEW_TOKENS = 122  # 6 + 122 = 128: the whole context


@dataclass
class Row:
    what: str
    tinygpt: str
    reference: str = "-"
    ratio: float | None = None
    goal: str = ""
    passed: bool | None = None  # None: no goal to meet, or not measured

    def cells(self) -> list[str]:
        ratio = "-" if self.ratio is None else f"{self.ratio:.2f}x"
        ok = {True: "yes", False: "NO", None: "-"}[self.passed]
        return [self.what, self.tinygpt, self.reference, ratio, self.goal, ok]


def median_seconds(fn, runs: int, warmup: int = 1) -> float:
    """Median CPU time of fn (the process's, user + system). Both sides run on one thread, so
    on an idle machine this is the wall time; on a loaded one it leaves out the waiting."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return statistics.median(times)


def paired_median_seconds(fns, runs: int, warmup: int = 1) -> list[float]:
    """median_seconds of each of fns, taken in turns (a, b, a, b, ...): this machine's speed
    drifts by tens of percent over a minute, and a drift then slows both sides alike instead
    of whichever ran second. fns that are None are skipped (their time is None)."""
    live = [f for f in fns if f is not None]
    for _ in range(warmup):
        for f in live:
            f()
    times: dict[int, list[float]] = {i: [] for i, f in enumerate(fns) if f is not None}
    for _ in range(runs):
        for i in times:
            t = time.process_time()
            fns[i]()
            times[i].append(time.process_time() - t)
    return [statistics.median(times[i]) if i in times else None for i in range(len(fns))]


def traced_row(label: str, model, hf, ids: np.ndarray, runs: int) -> Row:
    """A forward pass with every value recorded (run_traced) against transformers' with every
    attention and hidden state, in turns: the row a real-size family benchmark reports."""
    import torch

    from tinygpt_cli.transformer.trace import run_traced

    xt = torch.from_numpy(ids[None])

    def ref_traced():
        with torch.inference_mode():
            hf(xt, output_attentions=True, output_hidden_states=True)

    t, tr = paired_median_seconds([lambda: run_traced(model.params, model.config, ids),
                                   ref_traced], runs)
    return Row(f"{label}: forward pass, every value recorded, T={len(ids)}",
               f"{t * 1000:.0f} ms", f"{tr * 1000:.0f} ms", t / tr, "<= 1x the time",
               t / tr <= 1.0)


def child_env(checkout: bool = True) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TINYGPT_WEIGHTS"}
    env.update({v: "1" for v in THREAD_VARS})
    if not checkout:  # a floor that imports no tinygpt: nothing added to its path
        return env
    # the `tinygpt` script imports tinygpt_cli from wherever it was installed: this checkout
    # first, so that the figures are of the code beside this script
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


# Linux counts the memory a process had before exec() in its peak (ru_maxrss), so a command
# started straight from this process (with torch loaded: 400 MB) would seem that large. A
# small interpreter starts it instead and reports its rusage: (wall, cpu, peak KB, code).
LAUNCHER = """
import os, sys, time
t = time.perf_counter()
quiet = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_WRONLY, 0) for fd in (1, 2)]
pid = os.posix_spawn(sys.argv[1], sys.argv[1:], os.environ, file_actions=quiet)
_, status, u = os.wait4(pid, 0)
print(time.perf_counter() - t, u.ru_utime + u.ru_stime, u.ru_maxrss,
      os.waitstatus_to_exitcode(status))
"""


def run_measured(cmd: list[str], env=None) -> tuple[float, float, int, int]:
    """(wall s, cpu s, peak RSS in MB, exit code) of one command, by its own rusage."""
    import shutil

    exe = cmd[0] if os.path.isabs(cmd[0]) else shutil.which(cmd[0]) or cmd[0]
    r = subprocess.run([sys.executable, "-c", LAUNCHER, exe, *cmd[1:]], capture_output=True,
                       text=True, env=env or child_env())
    wall, cpu, kb, code = r.stdout.split()[-4:]
    return float(wall), float(cpu), int(kb) // 1024, int(code)


def tinygpt_cmd() -> list[str]:
    script = Path(sys.executable).parent / "tinygpt"
    return [str(script)] if script.exists() else [sys.executable, "-m", "tinygpt_cli"]


# ------------------------------------------------------------------ the two models


def load_tinygpt():
    from tinygpt_cli.cli.process import keep_freed_memory_now
    from tinygpt_cli.transformer.folder import load_model

    keep_freed_memory_now()  # the passes timed in this process run as the console script's do
    return load_model()


def load_reference(eager: bool = False):
    """GPT2LMHeadModel on the shipped folder (it is a transformers GPT-2 folder), one thread."""
    import torch
    from transformers import GPT2LMHeadModel

    from tinygpt_cli.storage.locations import SHIPPED

    torch.set_num_threads(1)
    kwargs = {"attn_implementation": "eager"} if eager else {}
    return GPT2LMHeadModel.from_pretrained(str(SHIPPED), **kwargs).eval()


def text_ids(model, n: int | None = None) -> np.ndarray:
    """Token ids of the validation part (or the prompt repeated when the data is absent)."""
    path = DATA / "part-005.txt"
    text = path.read_text(encoding="utf-8") if path.is_file() else (PROMPT + " ") * 4000
    if n is not None:
        text = text[: 12 * n]  # enough characters for n tokens
    ids = np.asarray(model.tokenizer.encode(text), dtype=np.int64)
    return ids if n is None else ids[:n]


# ------------------------------------------------------------------ start-up


# What a command cannot avoid: starting Python and importing the libraries it needs. Each
# command's start-up is measured against that floor, the two taking turns (issue 19).
FLOORS = {"--help": ("typer, rich", 0.030),
          "encode": ("typer, rich, tokenizers", None),
          "attn": ("numpy, typer, rich, tokenizers, safetensors", 0.040)}


def startup(runs: int) -> tuple[list[Row], list[str]]:
    import compileall

    import tinygpt_cli

    # As an installed package would be: byte-compiled (this does nothing if it already is).
    compileall.compile_dir(str(Path(tinygpt_cli.__file__).parent), quiet=2)
    rows, notes = [], []
    for args in (["--help"], ["encode", "Lily wanted"],
                 ["attn", PROMPT, "--layer", "0", "--head", "0"]):
        modules, slack = FLOORS[args[0]]
        cmd = tinygpt_cmd() + args
        floor = [sys.executable, "-c", f"import {modules}"]
        bare = child_env(checkout=False)
        run_measured(cmd), run_measured(floor, bare)  # warm the page cache
        ours, base = [], []
        for _ in range(max(runs, 9)):  # in turns: a drift slows both alike
            ours.append(run_measured(cmd))
            base.append(run_measured(floor, bare))
        wall = statistics.median(g[0] for g in ours)
        cpu = statistics.median(g[1] for g in ours)
        floor_wall = statistics.median(g[0] for g in base)
        floor_cpu = statistics.median(g[1] for g in base)
        # Judged by CPU time: both are one thread, so on an idle machine it is the wall
        # time, and on a loaded one it leaves out the waiting for a core, which is not ours.
        row = Row(f"start-up: tinygpt {args[0]}, against `python -c \"import {modules}\"` "
                  "(CPU time; wall beside it)", f"{cpu:.3f} s (wall {wall:.3f} s)",
                  f"{floor_cpu:.3f} s (wall {floor_wall:.3f} s)", cpu / floor_cpu)
        if slack is not None:
            row.goal = f"<= floor + {slack * 1000:.0f} ms"
            row.passed = cpu <= floor_cpu + slack
        rows.append(row)
        if args[0] != "--help":
            notes.append(import_table(args))
    return rows, notes


def import_table(args: list[str], top: int = 12) -> str:
    """`python -X importtime`'s biggest cumulative entries for one command."""
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "tinygpt_cli", *args],
                       capture_output=True, text=True, env=child_env())
    entries = []
    for line in r.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \| (\s*)(\S+)", line)
        if m:
            entries.append((int(m[2]), int(m[1]), len(m[3]) // 2, m[4]))
    entries.sort(reverse=True)
    total = sum(e[1] for e in entries)
    lines = [f"`python -X importtime -m tinygpt_cli {' '.join(args)}` "
             f"({len(entries)} modules, {total / 1000:.0f} ms of imports in all), the "
             f"{top} largest by cumulative time:", "",
             "| cumulative ms | self ms | module |", "| ---: | ---: | --- |"]
    lines += [f"| {c / 1000:.1f} | {s / 1000:.1f} | {'&nbsp;' * 2 * d}{name} |"
              for c, s, d, name in entries[:top]]
    return "\n".join(lines)


# ------------------------------------------------------------------ generation


def generation(runs: int, ref) -> list[Row]:
    from tinygpt_cli.transformer.generate import generate
    from tinygpt_cli.transformer.sampling import create_rng

    model = load_tinygpt()
    ids = model.tokenizer.encode(PROMPT)
    out: list[int] = []

    def ours():
        out[:] = [s.id for s in generate(model.params, model.config, ids, NEW_TOKENS,
                                         temperature=0.0, rng=create_rng(0))]

    if ref is None:
        t = median_seconds(ours, runs)
        return [Row(f"greedy generation, {NEW_TOKENS} new tokens after {PROMPT!r}",
                    f"{NEW_TOKENS / t:,.0f} tokens/s", "skipped (no torch)", goal=">= 5x")]
    import torch

    hf, theirs = ref, []
    x = torch.tensor([ids])
    # Like `--no-stop`: <|endoftext|> is a token like any other and the story goes on after
    # it. (min_new_tokens would instead forbid it, and the texts would part at the first one.)

    def reference():
        with torch.inference_mode():
            y = hf.generate(x, max_new_tokens=NEW_TOKENS, eos_token_id=None, do_sample=False,
                            use_cache=True, pad_token_id=0)
        theirs[:] = y[0, len(ids):].tolist()

    t, tr = paired_median_seconds([ours, reference], runs)
    row = Row(f"greedy generation, {NEW_TOKENS} new tokens after {PROMPT!r}",
              f"{NEW_TOKENS / t:,.0f} tokens/s", f"{NEW_TOKENS / tr:,.0f} tokens/s", tr / t,
              ">= 5x", tr / t >= 5)
    same = sum(a == b for a, b in zip(out, theirs, strict=False))
    row.what += f" (same tokens as transformers: {same}/{NEW_TOKENS})"
    return [row]


# ------------------------------------------------------------------ the traced forward pass


def traced(runs: int, ref_eager) -> list[Row]:
    from tinygpt_cli.transformer.trace import run_traced

    model = load_tinygpt()
    rows = []
    for t_len, goal in ((128, 0.5), (6, 1.0)):
        ids = text_ids(model, t_len) if t_len == 128 else np.asarray(
            model.tokenizer.encode(PROMPT))
        reference = None
        if ref_eager is not None:
            import torch

            x = torch.from_numpy(ids[None])

            def reference(x=x):
                with torch.inference_mode():
                    ref_eager(x, output_attentions=True, output_hidden_states=True)

        t, tr = paired_median_seconds(
            [lambda ids=ids: run_traced(model.params, model.config, ids), reference], runs)
        row = Row(f"forward pass, every value recorded, T={t_len}", f"{t * 1000:.2f} ms",
                  goal=f"<= {goal}x the time")
        if tr is not None:
            row.reference = f"{tr * 1000:.2f} ms"
            row.ratio = t / tr
            row.passed = row.ratio <= goal
        else:
            row.reference = "skipped (no torch)"
        rows.append(row)
        if t_len == 128:
            rows.append(matmul_floor(model, ids, runs, tr if ref_eager is not None else None, t))
    return rows


def matmul_floor(model, ids: np.ndarray, runs: int, reference: float | None,
                 traced: float) -> Row:
    """The matrix products of the T = 128 pass alone, with nothing else: no pass can take
    less. Its ratio is the traced pass's time over it (issue 19: at most 1.4x); over the
    reference's time it would be the lowest ratio any implementation on this BLAS could
    reach."""
    p, c = model.params, model.config
    x = np.ones((len(ids), c.n_embd), np.float32)
    q = np.ones((c.n_head, len(ids), c.d_k), np.float32)
    head = np.ascontiguousarray(p["embed.W_E"].T)
    mlp = np.ones((len(ids), c.n_inner), np.float32)

    def products():
        for i in range(c.n_layer):
            x @ p[f"layers.{i}.attn.W_QKV"]
            q @ q.swapaxes(-1, -2) @ q  # Q K^T, then weights V
            x @ p[f"layers.{i}.attn.W_O"]
            x @ p[f"layers.{i}.mlp.W_in"]
            mlp @ p[f"layers.{i}.mlp.W_out"]
        x @ head

    from tinygpt_cli.transformer.trace import run_traced

    # the pass again, in turns with its products: a drift of this machine's speed then moves
    # both alike (the ratio is the pass over its own floor)
    traced, t = paired_median_seconds([lambda: run_traced(p, c, ids), products], max(runs, 9))
    n, d, f = len(ids), c.n_embd, c.n_inner
    flops = 2 * (c.n_layer * (n * d * 3 * d + 2 * n * n * d + n * d * d + 2 * n * d * f)
                 + n * d * c.vocab_size)
    big = np.ones((1024, 1024), np.float32)
    peak = 2 * 1024**3 / median_seconds(lambda: big @ big, runs)
    row = Row(f"  its matrix products alone, T=128 (no pass can be faster): {flops / t / 1e9:.0f} "
              f"GFLOP/s, where one 1024 x 1024 product runs at {peak / 1e9:.0f}; ratio: the "
              f"traced pass ({traced * 1000:.2f} ms in these turns) over these products",
              f"{t * 1000:.2f} ms", ratio=traced / t,
              goal="<= 1.4x", passed=traced / t <= 1.4)
    if reference is not None:
        row.reference = f"{reference * 1000:.2f} ms (products {t / reference:.2f}x of it)"
    return row


def foundation(runs: int) -> list[Row]:
    """The traced forward pass against the one before the refactor (commit cccc9d4)."""
    from tinygpt_cli.transformer.trace import run_traced

    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "cccc9d4", "tinygpt_cli"],
                                 capture_output=True)
        if archive.returncode != 0:
            return [Row("forward pass, every value recorded, T=128, vs commit cccc9d4",
                        "-", "skipped (no git history)")]
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        os.rename(Path(tmp) / "tinygpt_cli", Path(tmp) / "tinygpt_cccc9d4")
        sys.path.insert(0, tmp)
        try:
            from tinygpt_cccc9d4.model import forward as old_forward
        finally:
            sys.path.remove(tmp)
        from tinygpt_cli.storage.safetensors import read_safetensors

        model = load_tinygpt()
        ids = text_ids(model, 128)
        tensors, _ = read_safetensors(model.weights_file)  # the old code's names: the file's
        old = {k.removeprefix("transformer."): np.array(v) for k, v in tensors.items()}
        t, told = paired_median_seconds([lambda: run_traced(model.params, model.config, ids),
                                         lambda: old_forward(old, model.config, ids)], runs)
    return [Row("forward pass, every value recorded, T=128, vs commit cccc9d4",
                f"{t * 1000:.2f} ms", f"{told * 1000:.2f} ms", t / told, "<= 1x the time",
                t / told <= 1.0)]


# ------------------------------------------------------------------ scoring


def windows_of(ids: np.ndarray, n_ctx: int) -> np.ndarray:
    """Windows of n_ctx inputs and their n_ctx next tokens: [N, n_ctx + 1], stride n_ctx."""
    n = (len(ids) - 1) // n_ctx
    idx = np.arange(n)[:, None] * n_ctx + np.arange(n_ctx + 1)[None, :]
    return ids[idx]


def window_losses(params, config, windows: np.ndarray) -> np.ndarray:
    """The loss (nats) of every next token of a batch of windows [B, T+1] -> [B, T]; the
    logits' log-softmax is taken in place, so a batch needs one [B, T, V] array."""
    from tinygpt_cli.transformer.model import forward

    logits = forward(params, config, windows[:, :-1])  # [B, T, V]
    if not (logits.max() < 60.0 and logits.min() > -60.0):  # exp could over- or underflow
        logits -= logits.max(axis=-1, keepdims=True)  # so shift each row to max 0
    # (otherwise exp is safe as it is, and the logits need no pass that writes them)
    picked = np.take_along_axis(logits, windows[:, 1:, None], axis=-1)[..., 0]
    np.exp(logits, out=logits)
    return np.log(logits.sum(axis=-1)) - picked


def score_all(params, config, windows: np.ndarray, batch: int) -> np.ndarray:
    return np.concatenate([window_losses(params, config, windows[i:i + batch])
                           for i in range(0, len(windows), batch)])


def scoring(runs: int, ref, n_windows: int, batch: int) -> list[Row]:
    model = load_tinygpt()
    w = windows_of(text_ids(model), model.config.n_positions)[:n_windows]
    tokens = w.shape[0] * (w.shape[1] - 1)
    losses: list[np.ndarray] = []

    def ours():
        losses[:] = [score_all(model.params, model.config, w, batch)]

    def row_for(t: float) -> Row:
        return Row(f"scoring part-005: first {len(w)} windows of {w.shape[1] - 1}, batches of "
                   f"{batch}, mean loss {losses[0].mean():.4f}", f"{tokens / t:,.0f} tokens/s",
                   goal=">= 1.5x")

    if ref is None:
        row = row_for(median_seconds(ours, runs))
        row.reference = "skipped (no torch)"
        return [row]
    import torch
    import torch.nn.functional as F

    x = torch.from_numpy(w)
    theirs: list = []

    def reference():
        with torch.inference_mode():
            out = []
            for i in range(0, len(x), batch):
                xb = x[i:i + batch]
                logits = ref(xb[:, :-1]).logits
                out.append(F.cross_entropy(logits.transpose(1, 2), xb[:, 1:], reduction="none"))
            theirs[:] = [torch.cat(out).numpy()]

    t, tr = paired_median_seconds([ours, reference], runs)
    row = row_for(t)
    row.reference = f"{tokens / tr:,.0f} tokens/s"
    row.ratio = tr / t
    row.passed = row.ratio >= 1.5
    row.what += f", largest |loss difference| {np.abs(losses[0] - theirs[0]).max():.1e}"
    return [row]


def score_child(path: str, batch: int) -> None:
    """Run by the memory figure in a subprocess: the per-token loss of a whole file."""
    model = load_tinygpt()
    text = Path(path).read_text(encoding="utf-8")
    ids = np.asarray(model.tokenizer.encode(text), dtype=np.int64)
    losses = score_all(model.params, model.config, windows_of(ids, model.config.n_positions),
                       batch)
    print(f"{losses.size} tokens, mean loss {losses.mean():.4f}")


# ------------------------------------------------------------------ a GPT-2-small-sized model


SMALL = dict(n_layer=12, n_embd=768, n_head=12, vocab_size=4096, n_positions=1024)
SMALL_TOKENS = 64


def gpt2_small_folder(folder: Path):
    """A 12 x 768 GPT-2 folder as `transformers` writes it (default config, seeded random
    weights), with the shipped tokenizer; returns the model (one thread, eager attention)."""
    import shutil

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from tinygpt_cli.storage.locations import SHIPPED

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = GPT2LMHeadModel(GPT2Config(**SMALL, attn_implementation="eager")).eval()
    model.save_pretrained(folder)
    shutil.copyfile(SHIPPED / "tokenizer.json", folder / "tokenizer.json")
    return model


def gpt2_small(runs: int, folder: Path, hf) -> list[Row]:
    """Issue 19: logits, whole-process generation, peak memory and a T = 512 traced pass of a
    12 x 768 GPT-2 folder (gpt2_small_folder), against transformers on the same folder."""
    import torch

    from tinygpt_cli.transformer.folder import load_model
    from tinygpt_cli.transformer.model import forward
    from tinygpt_cli.transformer.trace import run_traced

    ours = load_model(folder)
    size_mb = (folder / "model.safetensors").stat().st_size / 2**20
    ids = text_ids(ours, 512)
    with torch.inference_mode():
        want = hf(torch.from_numpy(ids[None, :64])).logits[0].numpy()
    got = forward(ours.params, ours.config, ids[:64])
    gap = float(np.abs(got - want).max() / np.abs(want).max())
    rows = [Row("12 x 768: logits of 64 tokens, largest |difference| over largest |logit|",
                f"{gap:.1e}", goal="<= 1e-4", passed=gap <= 1e-4)]
    prompt = ours.tokenizer.encode(PROMPT)
    x = torch.tensor([prompt])
    cmd = tinygpt_cmd() + ["generate", PROMPT, "-t", "0", "-n", str(SMALL_TOKENS),
                           "--no-stop", "--weights", str(folder)]
    measured: list[tuple] = []

    def whole():
        measured.append(run_measured(cmd))

    def reference():
        with torch.inference_mode():
            hf.generate(x, max_new_tokens=SMALL_TOKENS, eos_token_id=None,
                        do_sample=False, use_cache=True, pad_token_id=0)

    for busy in (False, True):  # idle, then with two spinning processes beside both
        spin = spinners() if busy else []
        try:
            walls, theirs = [], []
            whole(), reference()  # warm-up
            for _ in range(runs):  # wall time: the tinygpt side is a whole process
                whole()
                walls.append(measured[-1][0])
                t = time.perf_counter()
                reference()
                theirs.append(time.perf_counter() - t)
        finally:
            for p in spin:
                p.kill()
                p.wait()
        t, tr = statistics.median(walls), statistics.median(theirs)
        rows.append(Row(f"12 x 768: greedy generation of {SMALL_TOKENS} tokens, the whole "
                        "tinygpt process against transformers' generate alone"
                        + (" (busy machine: 2 spinning processes)" if busy else ""),
                        f"{SMALL_TOKENS / t:,.1f} tokens/s", f"{SMALL_TOKENS / tr:,.1f} tokens/s",
                        tr / t, ">= 1.5x", tr / t >= 1.5))
        if not busy:
            rows.append(generation_floor(ours, len(prompt), tr, runs))
    peak = max(m[2] for m in measured)
    most = 1.3 * size_mb + 150
    rows.append(Row(f"12 x 768: peak memory of that generate (weights file {size_mb:.0f} MB)",
                    f"{peak} MB", goal=f"<= {most:.0f} MB (1.3x + 150)",
                    passed=peak <= most))
    xt = torch.from_numpy(ids[None])

    def ref_traced():
        with torch.inference_mode():
            hf(xt, output_attentions=True, output_hidden_states=True)

    t, tr = paired_median_seconds([lambda: run_traced(ours.params, ours.config, ids),
                                   ref_traced], runs)
    rows.append(Row("12 x 768: forward pass, every value recorded, T=512",
                    f"{t * 1000:.0f} ms", f"{tr * 1000:.0f} ms", t / tr, "<= 1x the time",
                    t / tr <= 1.0))
    return rows


def generation_floor(model, prompt_len: int, reference: float, runs: int) -> Row:
    """What no whole-process generation of SMALL_TOKENS tokens can beat on this machine:
    starting Python with NumPy and the tokenizer and weights libraries, the prompt's matrix
    products, then each later token's matrix-vector products (every weight read once a
    token; the memory's speed, not the arithmetic, sets it). Its ratio is transformers'
    generate over it: the most any implementation on this BLAS, in float32, could reach."""
    import numpy as np

    p, c = model.params, model.config
    mats = [p[f"layers.{i}.{name}"] for i in range(c.n_layer)  # the canonical parameters
            for name in ("attn.W_QKV", "attn.W_O", "mlp.W_in", "mlp.W_out")]
    rows = np.ones((prompt_len, c.n_inner), np.float32)

    def prompt():
        for w in mats:
            rows[:, :w.shape[0]] @ w
        p["embed.W_E"] @ rows[-1, :c.n_embd]

    def token():
        for w in mats:
            rows[0, :w.shape[0]] @ w
        p["embed.W_E"] @ rows[0, :c.n_embd]

    first, each = paired_median_seconds([prompt, token], runs)
    floor = [sys.executable, "-c", "import numpy, tokenizers, safetensors"]
    start = statistics.median(run_measured(floor, child_env(checkout=False))[0]
                              for _ in range(runs))
    least = start + first + (SMALL_TOKENS - 1) * each
    return Row(f"  its floor: start-up with the libraries ({start * 1000:.0f} ms), the "
               f"prompt's products ({first * 1000:.0f} ms), {SMALL_TOKENS - 1} tokens of "
               f"matrix-vector products ({each * 1000:.1f} ms each); ratio: transformers' "
               "generate over it, the most any implementation could reach",
               f"{SMALL_TOKENS / least:,.1f} tokens/s", f"{SMALL_TOKENS / reference:,.1f} "
               "tokens/s", reference / least)


# ------------------------------------------------------------------ a busy machine


def some_stories(n_chars: int = 20_000) -> str:
    """The start of the validation part (or the prompt repeated when the data is absent)."""
    path = DATA / "part-005.txt"
    text = path.read_text(encoding="utf-8") if path.is_file() else (PROMPT + ". ") * 4000
    return text[:n_chars]


def spinners(n: int = 2) -> list[subprocess.Popen]:
    """n processes that keep a core busy each, as other work on a user's machine would."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def under_load(runs: int, small: Path | None, stories: Path) -> list[Row]:
    """Issue 19: with two spinning processes beside it, each command with the default
    settings (no thread variables at all) against the same with one BLAS thread forced."""
    default = {k: v for k, v in child_env().items()
               if k not in (*THREAD_VARS, "TINYGPT_THREADS", "RAYON_NUM_THREADS")}
    commands = {"generate -n 120": ["generate", "Lily wanted", "-n", "120", "--no-stop",
                                    "-t", "0"],
                "logits": ["logits", PROMPT],
                f"score --file ({stories.stat().st_size // 1000} kB of stories)":
                    ["score", "--file", str(stories)],
                "trace --list": ["trace", PROMPT, "--list"]}
    if small is not None:
        commands["logits, 12 x 768"] = ["logits", PROMPT, "--weights", str(small)]
        commands["generate -n 50, 12 x 768"] = ["generate", "Lily wanted", "-n", "50",
                                                "--no-stop", "-t", "0", "--weights", str(small)]
    rows = []
    busy = spinners()
    try:
        for name, args in commands.items():
            cmd = tinygpt_cmd() + args
            if run_measured(cmd)[3] != 0:
                rows.append(Row(f"busy machine: tinygpt {name}", "skipped (the command failed)"))
                continue
            ours, one = [], []
            for _ in range(runs):
                ours.append(run_measured(cmd, env=default)[0])
                one.append(run_measured(cmd)[0])
            t, t1 = statistics.median(ours), statistics.median(one)
            rows.append(Row(f"busy machine (2 spinning processes): tinygpt {name}, default "
                            "settings against one BLAS thread forced", f"{t:.2f} s",
                            f"{t1:.2f} s", t / t1, "<= 1.3x the time", t / t1 <= 1.3))
    finally:
        for p in busy:
            p.kill()
            p.wait()
    return rows


# ------------------------------------------------------------------ memory


def memory(batch: int) -> list[Row]:
    gen = tinygpt_cmd() + ["generate", PROMPT, "-t", "0", "-n", str(NEW_TOKENS), "--no-stop"]
    rss = [run_measured(gen)[2] for _ in range(3)]
    rows = [Row("peak memory: tinygpt generate (122 tokens)", f"{max(rss)} MB",
                goal="<= 80 MB", passed=max(rss) <= 80)]
    part = DATA / "part-005.txt"
    if not part.is_file():
        return rows + [Row("peak memory: scoring part-005", "skipped (no data)")]
    wall, _, mb, code = run_measured([sys.executable, __file__, "--score-child", str(part),
                                      "--batch", str(batch)])
    rows.append(Row(f"peak memory: scoring all of part-005 (batches of {batch}; the function "
                    "this script times)", f"{mb} MB ({wall:.1f} s)" if code == 0 else
                    f"failed (exit {code})", goal="<= 150 MB", passed=code == 0 and mb <= 150))
    has_score = run_measured(tinygpt_cmd() + ["score", "--help"])[3] == 0
    if not has_score:
        rows.append(Row("peak memory: tinygpt score --file part-005", "skipped: no `tinygpt "
                        "score` command yet"))
        return rows
    wall, _, mb, code = run_measured(tinygpt_cmd() + ["score", "--file", str(part)])
    rows.append(Row("peak memory: tinygpt score --file part-005",
                    f"{mb} MB ({wall:.1f} s)" if code == 0 else f"failed (exit {code})",
                    goal="<= 150 MB", passed=code == 0 and mb <= 150))
    return rows


# ------------------------------------------------------------------ big inputs (issue 22)

BIG_BYTES = 5_000_000  # score - and encode - on 5 MB of stories
EACH_LINES = 10_000  # probs --each-line on 10,000 lines


def big_inputs() -> list[Row]:
    """Whole-data inputs, built in a temporary folder from the shared stories (never kept):
    5 MB on stdin for score, encode and embed, 10,000 lines for --each-line. Each command is
    run once (a minute or two each): time and peak memory, against the goals of issue 22."""
    parts = sorted(DATA.glob("part-*.txt"))
    if not parts:
        return [Row("big inputs: score - of 5 MB, probs --each-line 10,000 lines",
                    "skipped (no data)")]
    text = "".join(p.read_text(encoding="utf-8") for p in parts)
    lines = [x for x in text.split("\n") if x.strip() and "<|endoftext|>" not in x
             and len(x) < 250][:EACH_LINES]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        big, each = Path(tmp) / "big.txt", Path(tmp) / "lines.txt"
        big.write_bytes(text.encode("utf-8")[:BIG_BYTES].decode("utf-8", "ignore").encode())
        each.write_text("\n".join(lines) + "\n", encoding="utf-8")
        for what, args, goal_s, goal_mb in (
                (f"score - < {BIG_BYTES / 1e6:.0f} MB of stories", ["score", "-"], 120, 300),
                (f"encode - < {BIG_BYTES / 1e6:.0f} MB", ["encode", "-"], 10, 300),
                (f"embed - < {BIG_BYTES / 1e6:.0f} MB (refused: too long)", ["embed", "-"], 2,
                 150),
                (f"probs --each-line, {len(lines):,} lines", ["probs", "--each-line",
                                                               str(each)], 60, 150)):
            cmd = tinygpt_cmd() + args
            stdin = f"< {big} " if args[-1] == "-" else ""
            wall, _, mb, code = run_measured(
                ["bash", "-c", " ".join(f"'{c}'" for c in cmd) + f" {stdin}> /dev/null"])
            ok = (code == 0 or args[0] == "embed") and wall <= goal_s and mb <= goal_mb
            rows.append(Row(f"big input: tinygpt {what}", f"{wall:.1f} s, {mb} MB",
                            goal=f"<= {goal_s} s, <= {goal_mb} MB", passed=ok))
    return rows


# ------------------------------------------------------------------ training


def training(steps: int, torch_ok: bool) -> list[Row]:
    import json

    cmd = [sys.executable, str(ROOT / "benchmarks" / "train_speed.py"), "--steps", str(steps),
           "--threads", "2", "--json"] + ([] if torch_ok else ["--no-torch"])
    env = child_env()
    for v in THREAD_VARS:
        env[v] = "2"
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        return [Row("training step, B 32 x T 128, 2 threads", f"failed: {r.stderr[-200:]}")]
    doc = json.loads(r.stdout)
    res = {x["framework"]: x for x in doc["results"]}
    row = Row(f"training step, B 32 x T 128, 2 threads ({steps} steps each)",
              f"{res['numpy']['tokens_per_s']:,.0f} tokens/s", goal=">= 0.9x")
    if "torch" in res:
        row.reference = f"{res['torch']['tokens_per_s']:,.0f} tokens/s"
        row.ratio = doc["numpy_over_torch"]
        row.passed = row.ratio >= 0.9
    else:
        row.reference = "skipped (no torch)"
    return [row]


# ------------------------------------------------------------------ report


def machine() -> dict[str, str]:
    info = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "cpu": platform.processor() or platform.machine(),
            "cores": str(os.cpu_count()),
            "python": platform.python_version(), "numpy": np.__version__}
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"model name\s*:\s*(.+)", f.read())
        if m:
            info["cpu"] = m[1]
    except OSError:
        pass
    try:
        cfg = np.show_config(mode="dicts")
        blas = cfg["Build Dependencies"]["blas"]
        info["blas"] = f"{blas.get('name')} {blas.get('version', '')}".strip()
    except Exception:  # noqa: BLE001 - older NumPy: no dict form
        info["blas"] = "unknown"
    try:
        import torch
        import transformers

        info["torch"] = torch.__version__
        info["transformers"] = transformers.__version__
    except ImportError:
        info["torch"] = "not installed (reference skipped)"
    info["load"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return info


def on_made_folder(argv: list[str] | None, doc: str, name: str, make, rows) -> int:
    """The main of a benchmark on a folder that transformers makes: --runs and --markdown
    read, make(folder) -> the transformers model, rows(runs, folder, it) -> its rows, the
    table printed; the folder made in a temporary one and gone after. The passes timed in
    this process run as the console script's do (keep_freed_memory_now, as load_tinygpt)."""
    from tinygpt_cli.cli.process import keep_freed_memory_now

    keep_freed_memory_now()
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5, help="timed runs per figure (median; 5)")
    p.add_argument("--markdown", action="store_true", help="a table for results.md")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / name
        found = rows(args.runs, folder, make(folder))
    print(table(found, args.markdown))
    return 0


def table(rows: list[Row], markdown: bool) -> str:
    head = ["what", "tinygpt", "reference (PyTorch)", "ratio", "goal", "pass"]
    cells = [r.cells() for r in rows]
    if markdown:
        out = ["| " + " | ".join(head) + " |", "| " + " | ".join(["---"] * len(head)) + " |"]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in cells]
        return "\n".join(out)
    widths = [max(len(x) for x in col) for col in zip(head, *cells, strict=True)]
    widths[0] = min(widths[0], 70)
    line = "  ".join
    out = [line(h.ljust(w) for h, w in zip(head, widths, strict=True))]
    out += [line(c[:w].ljust(w) if i == 0 else c.ljust(w)
                 for i, (c, w) in enumerate(zip(row, widths, strict=True))) for row in cells]
    return "\n".join(out)


def report(rows, notes, info, args) -> str:
    facts = "\n".join(f"- {k}: {v}" for k, v in info.items())
    return f"""# Benchmark results

Written by `python benchmarks/run.py` (issue 8). Each timing is the median of {args.runs} runs
after one warm-up, one thread each (`OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1`,
`torch.set_num_threads(1)`), on the shipped weights; the reference is `transformers`'
`GPT2LMHeadModel` on the same folder, measured in the same process, the two taking turns
run by run (this machine's speed drifts: in turns a drift slows both sides alike).
In-process timings are CPU time (both sides are single-threaded, so on an idle machine
that is the wall time; on a loaded one it leaves out the time spent waiting for a core);
start-up is wall time of a fresh process (its CPU time beside it), and memory the peak
resident size of a fresh process. A ratio is tinygpt's throughput over the reference's
(tokens/s) or tinygpt's time over the reference's (times). Training is
`benchmarks/train_speed.py` at 2 threads (its own wall-clock timing, the two frameworks
taking steps in turns).

{facts}

{args.note}

{table(rows, markdown=True)}

## Imports on the inspection path

{chr(10).join(chr(10) + n + chr(10) for n in notes)}
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5, help="timed runs per figure (median; 5)")
    p.add_argument("--windows", type=int, default=64, help="windows of part-005 timed (64)")
    p.add_argument("--batch", type=int, default=8, help="windows per scoring batch (8)")
    p.add_argument("--train-steps", type=int, default=10, help="training steps timed (10)")
    p.add_argument("--no-torch", action="store_true", help="skip the reference")
    p.add_argument("--no-training", action="store_true", help="skip the training figure")
    p.add_argument("--no-big", action="store_true", help="skip the big inputs (5 MB on "
                   "stdin, 10,000 lines of --each-line: minutes)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results.md")
    p.add_argument("--note", default="", help="a line for results.md (how loaded the "
                   "machine was, say)")
    p.add_argument("--score-child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.score_child:
        score_child(args.score_child, args.batch)
        return 0
    if args.runs < 5:
        p.error("--runs must be at least 5")

    ref = ref_eager = None
    if not args.no_torch:
        try:
            ref, ref_eager = load_reference(), load_reference(eager=True)
        except ImportError as e:
            print(f"reference skipped: {e}", file=sys.stderr)
    torch_ok = ref is not None

    def log(s):
        print(s, file=sys.stderr, flush=True)

    rows: list[Row] = []
    log("start-up ...")
    start_rows, notes = startup(args.runs)
    rows += start_rows
    log("generation ...")
    rows += generation(args.runs, ref)
    log("traced forward pass ...")
    rows += traced(args.runs, ref_eager)
    rows += foundation(args.runs)
    with tempfile.TemporaryDirectory() as tmp:
        small = None
        if torch_ok:
            log("12 x 768 GPT-2 ...")
            small = Path(tmp) / "gpt2-12x768"
            rows += gpt2_small(args.runs, small, gpt2_small_folder(small))
        log("busy machine ...")
        stories = Path(tmp) / "stories.txt"
        stories.write_text(some_stories(), encoding="utf-8")
        rows += under_load(args.runs, small, stories)
    log("scoring ...")
    rows += scoring(args.runs, ref, args.windows, args.batch)
    log("memory ...")
    rows += memory(args.batch)
    if not args.no_big:
        log("big inputs ...")
        rows += big_inputs()
    if not args.no_training:
        log("training (2 threads) ...")
        rows += training(args.train_steps, torch_ok)
    info = machine()
    print(table(rows, markdown=False))
    from tinygpt_cli.storage.files import write_text

    write_text(args.out, report(rows, notes, info, args))
    print(f"\nwrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
