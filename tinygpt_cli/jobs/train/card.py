"""The model card of a trained weights folder: how it was made, how good it is, what it writes."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shlex
from collections.abc import Callable
from pathlib import Path

from ...errors import RunError
from ...storage.files import sha256, write_text
from ...transformer.folder import Model, load_model
from ...transformer.generate import generate
from ...transformer.sampling import create_rng
from ...transformer.windows import encode_stories
from ..corpus import read_stories, split_data
from .loop import CHECKPOINT, evaluate, stored_settings, windows_in
from .loop import machine as this_machine
from .loop import read_log as read

PROMPTS = ["Lily wanted", "Once upon a time"]
SEED_SENTENCE = "Lily wanted to play with her"


def read_log(path: Path, note: Callable[[str], None] = lambda s: None) -> list[dict]:
    """The run's log; a torn last line is skipped (with a note), any other fault is a
    RunError (exit 1)."""

    if not path.is_file():
        raise RunError(f"{path.parent} has no {path.name}: model-card needs a folder written "
                       "by `tinygpt train`")
    log = read(path, note)
    if not log:
        raise RunError(f"{path} holds no steps: the run never trained")
    return log


def wall_time(log: list[dict]) -> float:
    """Seconds of training over every piece of a resumed run (a piece's clock may restart)."""
    total, prev = 0.0, 0.0
    for r in log:
        if r["elapsed_s"] < prev:
            total += prev
        prev = r["elapsed_s"]
    return total + prev


def bits_per_byte(nats_per_token: float, bytes_per_token: float) -> float:
    """nats per token ÷ ln 2 ÷ bytes per token."""
    return nats_per_token / math.log(2) / bytes_per_token


def smooth(values: list[float], window: int) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def loss_curve_svg(log: list[dict], width: int = 640, height: int = 320,
                   val_name: str = "validation") -> str:
    """Training loss (smoothed over 50 steps) and validation loss against tokens seen."""
    steps = [r["step"] for r in log]
    train = smooth([r["train_loss"] for r in log], 50)
    val = [(r["step"], r["val_loss"]) for r in log if "val_loss" in r]
    lo = min(min(train[len(train) // 20:] or train), min((v for _, v in val), default=9))
    hi = max(train[min(len(train) - 1, 100)], max((v for _, v in val), default=0))
    lo, hi = math.floor(lo * 10) / 10 - 0.1, math.ceil(hi * 10) / 10
    m = 48

    def xy(step, loss):
        x = m + (width - 2 * m) * step / max(steps[-1], 1)
        y = height - m - (height - 2 * m) * (min(max(loss, lo), hi) - lo) / (hi - lo)
        return f"{x:.1f},{y:.1f}"

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="11">',
             f'<rect width="{width}" height="{height}" fill="white"/>']
    for k in range(6):
        loss = lo + (hi - lo) * k / 5
        y = xy(0, loss).split(",")[1]
        parts.append(f'<line x1="{m}" x2="{width - m}" y1="{y}" y2="{y}" stroke="#ddd"/>')
        parts.append(f'<text x="{m - 6}" y="{y}" text-anchor="end" dy="4">{loss:.2f}</text>')
    for k in range(5):
        step = steps[-1] * k / 4
        x = xy(step, lo).split(",")[0]
        parts.append(f'<text x="{x}" y="{height - m + 16}" text-anchor="middle">{step:,.0f}</text>')
    parts.append(f'<text x="{width / 2}" y="{height - 8}" text-anchor="middle">step</text>')
    parts.append(f'<text x="14" y="{height / 2}" transform="rotate(-90 14 {height / 2})" '
                 'text-anchor="middle">cross-entropy, nats per token</text>')
    stride = max(1, len(steps) // 400)
    pts = " ".join(xy(s, v) for s, v in list(zip(steps, train, strict=True))[::stride])
    parts.append(f'<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="{pts}"/>')
    if val:
        pts = " ".join(xy(s, v) for s, v in val)
        parts.append(f'<polyline fill="none" stroke="#d62728" stroke-width="2" points="{pts}"/>')
    parts.append(f'<text x="{width - m}" y="{m - 16}" text-anchor="end" fill="#1f77b4">train '
                 '(50-step mean, with dropout)</text>')
    parts.append(f'<text x="{width - m}" y="{m - 4}" text-anchor="end" fill="#d62728">'
                 f'{_xml(val_name)}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def samples(model: Model, prompt: str, *, temperature: float, seed: int, n: int = 120) -> str:
    tok = model.tokenizer
    ids = tok.encode(prompt)
    new = [s.id for s in generate(model.params, model.config, ids, n, temperature=temperature,
                                  rng=create_rng(seed), stop_ids=(tok.eot_id,))]
    if new and new[-1] == tok.eot_id:
        new = new[:-1]
    return prompt + tok.decode(new)


def _xml(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def ascii_curve(log: list[dict]) -> str:
    train = smooth([r["train_loss"] for r in log], 50)
    if any("val_loss" in r for r in log):
        rows = ["| step | tokens seen | train loss (50-step mean) | validation loss "
                "| val bits/byte |", "| ---: | ---: | ---: | ---: | ---: |"]
        for i, r in enumerate(log):
            if "val_loss" in r:
                rows.append(f"| {r['step']:,} | {r['tokens']:,} | {train[i]:.3f} | "
                            f"{r['val_loss']:.3f} | {r['val_bits_per_byte']:.3f} |")
        return "\n".join(rows)
    rows = ["| step | tokens seen | train loss (50-step mean) |", "| ---: | ---: | ---: |"]
    every = max(1, len(log) // 10)
    for i, r in enumerate(log):
        if (i + 1) % every == 0 or i == len(log) - 1:
            rows.append(f"| {r['step']:,} | {r['tokens']:,} | {train[i]:.3f} |")
    return "\n".join(rows)


def shown_path(path: str | Path) -> str:
    """A path as a reader can reproduce it: relative to the current folder when it was
    absolute (`/home/me/shared/data/x` run from /home/me/tinygpt -> `../shared/data/x`)."""
    path = str(path)
    return os.path.relpath(path) if os.path.isabs(path) else path


def reproducible_command(line: str, *, extension: bool = False) -> str:
    """A command from command.txt with absolute paths made relative, and without --force or
    --resume (how often a run was resumed is not part of the recipe), except the --resume of
    an extension (a later line), which is how it continues the run."""
    try:
        words = shlex.split(line)
    except ValueError:
        return line
    dropped = ("--force",) if extension else ("--resume", "--force")
    words = [shown_path(w) if w.startswith("/") else w for w in words if w not in dropped]
    return shlex.join(words)


def file_names(files: list[Path]) -> str:
    """`part-000.txt` … `part-004.txt` for a numbered run of files, else each name."""
    names = [Path(f).name for f in files]
    if not names:
        return "none"
    numbers = [re.fullmatch(r"(.*?)(\d+)(\.\w+)", n) for n in names]
    if len(names) > 2 and all(numbers) and len({(m[1], m[3]) for m in numbers}) == 1:
        values = [int(m[2]) for m in numbers]
        if values == list(range(values[0], values[0] + len(values))):
            return f"`{names[0]}` … `{names[-1]}`"
    return ", ".join(f"`{n}`" for n in names)


def run_settings(run: Path) -> dict:
    """The settings a run was trained with, from its checkpoint (empty when there is none,
    or it is damaged: the card then says less)."""

    try:
        return stored_settings(run / CHECKPOINT)
    except RunError:
        return {}


def machine_line(run: Path) -> str:
    """Cores and BLAS threads, as the run recorded them in result.json; a run that did not
    record them is described by the machine writing the card, and says so."""
    try:
        machine = json.loads((run / "result.json").read_text())["machine"]
        where = "the machine it ran on"
    except Exception:  # noqa: BLE001 - older runs, or a run still going
        machine, where = this_machine(), "the machine that wrote this card (the run did not record its own)"
    threads = machine.get("blas_threads") or {}
    blas = ", ".join(f"{k}={v}" for k, v in sorted(threads.items())) or "library default"
    return f"{machine.get('cpu_count')} CPU cores, BLAS threads {blas}: {where}"


def block(text: str) -> str:
    return "```text\n" + text.strip() + "\n```"


def warm_start(settings: dict, train_names: str) -> tuple[str, str, list[str]]:
    """How the card tells where the run started: (origin, the tokenizer's training files,
    the extra line), for a run from scratch or from --init's weights."""
    init = settings.get("init")
    if not init:
        return "from scratch", train_names, []
    return ("from a warm start (below)", "the `--init` model's, kept by this run",
            [f"- Warm start: step 0 is the weights of `{shown_path(init)}` (`--init`), a model "
             "trained before on part of this text; the optimiser, the schedule and the moving "
             "average start anew, and the tokenizer is that model's."])


def write_card(run: Path, data: list[Path], out: Path | None = None, *,
               progress=None, on_note: Callable[[str], None] | None = None) -> str:
    """MODEL_CARD.md and loss_curve.svg for the weights folder `run` (the output of `train`).

    `data` is shown as given (relative paths stay relative). `progress(total, description)`,
    if given, is a context manager yielding advance(n), as cli.common.progress is: the
    evaluation over the whole data takes a while.
    """

    out = out or run
    model = load_model(run)
    log = read_log(run / "log.jsonl", on_note or (lambda s: None))
    settings = run_settings(run)
    train_files, val_files = split_data(data)
    quality, train_stream = _quality(model, train_files, val_files, progress)
    val_names = file_names(val_files)
    write_text(out / "loss_curve.svg",
               loss_curve_svg(log, val_name=f"validation ({val_names.replace('`', '')})"))
    text = _card_text(run, model, log, settings, data, file_names(train_files), val_names,
                      quality, len(train_stream.ids))
    write_text(out / "MODEL_CARD.md", text)
    return text


def _quality(model: Model, train_files: list[Path], val_files: list[Path], progress
             ) -> tuple[str, object]:
    """The card's quality rows (the loss over each whole part), and the training stream."""

    tok = model.tokenizer
    train_stream = encode_stories(read_stories(train_files), tok)
    val_stream = encode_stories(read_stories(val_files), tok) if val_files else None
    streams = [train_stream] + ([val_stream] if val_stream else [])
    total = sum(windows_in(st.ids, model.config) for st in streams)
    bar = progress(total, "evaluating") if progress else contextlib.nullcontext(None)
    with bar as advance:
        losses = [evaluate(model.params, model.config, st.ids, on_batch=advance)
                  for st in streams]
    rows = [_quality_row(f"training, {file_names(train_files)}", train_stream, losses[0])]
    if val_stream is not None:
        rows.append(_quality_row(f"validation, {file_names(val_files)} (held out)", val_stream,
                                 losses[1]))
    return "\n".join(rows), train_stream


def _run_command(run: Path) -> str:
    """The commands that made the run (command.txt), as one can run them again."""
    command_file = run / "command.txt"
    lines = [line for line in command_file.read_text(errors="replace").splitlines()
             if line.strip()] if command_file.is_file() else []
    return "\n".join(reproducible_command(line, extension=k > 0)
                     for k, line in enumerate(lines)) or "(the run folder has no command.txt)"


def _sample_blocks(model: Model) -> list[str]:
    """A greedy and a seeded continuation of each prompt, with the command that writes it."""
    sample_md = []
    for prompt in PROMPTS:
        sample_md.append(f"**{prompt}**, greedy "
                         f"(`tinygpt generate \"{prompt}\" --temperature 0`):\n\n"
                         + block(samples(model, prompt, temperature=0.0, seed=0)))
        sample_md.append(f"**{prompt}**, seeded (`tinygpt generate \"{prompt}\" --seed 1`, "
                         "temperature 0.8):\n\n"
                         + block(samples(model, prompt, temperature=0.8, seed=1)))
    return sample_md


def _exported(log: list[dict]) -> str:
    """Which weights the folder holds: the best validation step's, or the last step's."""
    vals = [r for r in log if "val_loss" in r]
    if not vals:
        return "the last step's (the run had no validation data)"
    best = min(vals, key=lambda r: r["val_loss"])
    return (f"the checkpoint with the best validation loss, at step {best['step']:,} "
            f"(validation {best['val_loss']:.4f} nats per token, "
            f"{best['val_bits_per_byte']:.4f} bits per byte)")


def _extra_lines(run: Path, settings: dict) -> list[str]:
    """The training section's lines for what not every run has: averaged weights, history
    snapshots, an extension by --resume with more --steps."""
    extras = []
    ema = settings.get("ema") or 0.0
    if ema > 0:
        extras.append(f"- Averaged weights: an exponential moving average of the parameters "
                      f"with decay {ema:g} (ramped up over the first steps, as "
                      f"min({ema:g}, (1 + step) / (10 + step))); the average is what was "
                      "validated, exported and snapshotted.")
    history = sorted((run / "history").glob("step-*.safetensors")) \
        if (run / "history").is_dir() else []
    if history:
        steps = ", ".join(f"{int(p.stem.split('-')[1]):,}" for p in history)
        extras.append(f"- History: {len(history)} float16 snapshot{'s' * (len(history) > 1)} "
                      "of the "
                      f"{'averaged ' if ema > 0 else ''}weights, log-spaced in steps "
                      f"({steps}), in `history/`.")
    cycle = settings.get("cycle_start") or 0
    if cycle:
        number = (settings.get("cycle") or 1) + 1
        extras.append(f"- Extended: steps {cycle:,} to {settings['steps']:,} are cycle {number} "
                      "of the same run (the last command: `--resume` with more `--steps`), a "
                      "warm restart from the weights, optimiser state and average of step "
                      f"{cycle:,}: a new warm-up of {settings['warmup']:,} steps to a peak "
                      f"learning rate of {settings['lr']:g}, then cosine decay, dropout "
                      f"{settings['dropout']:g}.")
    return extras


def _card_text(run: Path, model: Model, log: list[dict], settings: dict, data: list[Path],
               train_names: str, val_names: str, quality: str, train_tokens: int) -> str:
    """MODEL_CARD.md's text."""
    cfg, tok = model.config, model.tokenizer
    n_params = sum(a.size for a in model.params.values())
    ids = tok.encode(SEED_SENTENCE)
    enc = " · ".join(f"`{tok.token_str(i).replace(' ', '␣')}` ({i})" for i in ids)
    data_shown = ", ".join(f"`{shown_path(p)}`" for p in data)
    tinystories = any("tinystories" in str(p).lower() for p in data)
    last, command, sample_md = log[-1], _run_command(run), _sample_blocks(model)
    hours = wall_time(log) / 3600
    batch = last["tokens"] // last["step"] // cfg.n_positions
    exported, extras = _exported(log), _extra_lines(run, settings)
    cycle = settings.get("cycle_start") or 0
    origin, tokenizer_files, extras[:0] = warm_start(settings, train_names)
    opt = (f"{'in the last cycle, ' if cycle else ''}"
           f"peak learning rate {settings['lr']:g} after {settings['warmup']:,} warm-up steps, "
           f"weight decay {settings['weight_decay']:g}, dropout {settings['dropout']:g}, "
           if settings else "")
    optimiser = ("plain SGD (no momentum)" if settings and settings.get("optimizer") == "sgd"
                 else "AdamW (β = 0.9, 0.95)")
    data_line = (f"- Data: {train_names} for training and {val_names} for validation, from "
                 f"{data_shown} (not redistributed here). Stories are joined with "
                 "`<|endoftext|>`.")
    corpus, licence = ("TinyStories", TINYSTORIES_LICENCE) if tinystories else \
        (f"the text in {data_shown}", "")
    return f"""# tinygpt model card

A GPT-2-style language model with {n_params:,} parameters, trained {origin} on
{corpus} with the project's own NumPy code (`tinygpt train`): no PyTorch, no JAX.

| | |
| --- | --- |
| numbers per token (n_embd) | {cfg.n_embd} |
| blocks (n_layer) | {cfg.n_layer} |
| heads per block (n_head) | {cfg.n_head}, {cfg.d_k} numbers each |
| feed-forward width (n_inner) | {cfg.n_inner}, GELU tanh form |
| vocabulary | {cfg.vocab_size:,} byte-level BPE tokens, `<|endoftext|>` = {tok.eot_id} |
| longest text | {cfg.n_positions} tokens |
| norm | pre-LayerNorm, eps {cfg.layer_norm_epsilon:g}, plus a final one |
| output head | tied to the token embedding table |
| file | `model.safetensors`, float32, Hugging Face GPT-2 names, sha256 `{sha256(run / 'model.safetensors')}` |

## Quality

Cross-entropy of these weights, computed over each whole part in non-overlapping
windows of {cfg.n_positions} tokens (dropout off). Bits per byte = nats per token ÷ ln 2 ÷
bytes per token; the bytes are the stories' UTF-8 bytes plus one per story separator.

| data | tokens | bytes per token | nats per token | bits per byte |
| --- | ---: | ---: | ---: | ---: |
{quality}

## Training

```sh
{command}
```

{data_line}
- Steps: {last['step']:,} of batch {batch} × {cfg.n_positions};
  tokens seen: {last['tokens']:,} ({last['tokens'] / train_tokens:.1f} passes over the training text).
- Wall time: {hours:.2f} h; {machine_line(run)}.
- Exported weights: {exported}.
{chr(10).join(extras) + chr(10) if extras else ""}- Final logged training loss (with dropout, last step): {last['train_loss']:.4f}.
- Optimiser: {optimiser}, {opt}decoupled weight decay on matrices and the embedding
  table only, linear warm-up then cosine decay to a tenth of the peak, gradient norm clipped at 1,
  dropout on the embeddings and on each attention and MLP output.

![loss curve](loss_curve.svg)

{ascii_curve(log)}

## Samples

{chr(10).join(s + chr(10) for s in sample_md)}
## Tokenizer

Byte-level BPE trained with the `tokenizers` library on the training files only
({tokenizer_files}), exactly {tok.vocab_size:,} entries including `<|endoftext|>`.
The seed sentence "{SEED_SENTENCE}" is {len(ids)} tokens: {enc}.
{licence}
## Limitations

A {n_params / 1e6:.1f}-million-parameter model trained on {train_tokens / 1e6:.1f} million tokens{" of children's stories" if tinystories else ""}: it
writes short, simple, often ungrammatical or incoherent text, knows nothing else, and
repeats itself at low temperature. It is made for looking inside, not for use.
"""

def _quality_row(name: str, stream, loss: float) -> str:
    return (f"| {name} | {len(stream.ids):,} | {stream.bytes_per_token:.3f} | {loss:.4f} | "
            f"{bits_per_byte(loss, stream.bytes_per_token):.4f} |")


TINYSTORIES_LICENCE = """
## Data licence

Trained on excerpts of TinyStories (Ronen Eldan and Yuanzhi Li, 2023, "TinyStories: How Small
Can Language Models Be and Still Speak Coherent English?", arXiv:2305.07759), released on the
Hugging Face hub (roneneldan/TinyStories) under the Community Data License Agreement – Sharing,
Version 1.0 (CDLA-Sharing-1.0). The excerpts were collected from public GitHub repositories and
reassembled only by splitting, normalising whitespace and encoding, and deduplicating. This
model is a result of computation on that data; the data itself is not shipped here.
"""
