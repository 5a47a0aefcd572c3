"""The model card of a trained weights folder: how it was made, how good it is, what it writes."""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..files import sha256
from ..generate import generate
from ..sampling import create_rng
from ..weights import Model

PROMPTS = ["Lily wanted", "Once upon a time"]
SEED_SENTENCE = "Lily wanted to play with her"


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


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


def loss_curve_svg(log: list[dict], width: int = 640, height: int = 320) -> str:
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
                 'validation (part-005)</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def samples(model: Model, prompt: str, *, temperature: float, seed: int, n: int = 120) -> str:
    tok = model.tokenizer
    ids = tok.encode(prompt)
    new = [s.id for s in generate(model.params, model.config, ids, n, temperature=temperature,
                                  rng=create_rng(seed), stop_id=tok.eot_id)]
    if new and new[-1] == tok.eot_id:
        new = new[:-1]
    return prompt + tok.decode(new)


def ascii_curve(log: list[dict]) -> str:
    rows = ["| step | tokens seen | train loss (50-step mean) | validation loss | val bits/byte |",
            "| ---: | ---: | ---: | ---: | ---: |"]
    train = smooth([r["train_loss"] for r in log], 50)
    for i, r in enumerate(log):
        if "val_loss" in r:
            rows.append(f"| {r['step']:,} | {r['tokens']:,} | {train[i]:.3f} | "
                        f"{r['val_loss']:.3f} | {r['val_bits_per_byte']:.3f} |")
    return "\n".join(rows)


def write_card(run: Path, data: list[Path], out: Path | None = None) -> str:
    """MODEL_CARD.md and loss_curve.svg for the weights folder `run` (the output of `train`)."""
    from ..tokenizer import Tokenizer
    from ..weights import load_model
    from .data import encode_stories, read_stories, split_data
    from .loop import evaluate

    out = out or run
    model = load_model(run)
    log = read_log(run / "log.jsonl")
    command = (run / "command.txt").read_text().strip().removesuffix(" --resume")
    tok: Tokenizer = model.tokenizer
    train_files, val_files = split_data(data)
    train_stream = encode_stories(read_stories(train_files), tok)
    val_stream = encode_stories(read_stories(val_files), tok)
    train_loss = evaluate(model.params, model.config, train_stream.ids)
    val_loss = evaluate(model.params, model.config, val_stream.ids)
    best = min((r for r in log if "val_loss" in r), key=lambda r: r["val_loss"])
    last = log[-1]
    cfg = model.config
    n_params = sum(a.size for a in model.params.values())
    ids = tok.encode(SEED_SENTENCE)
    enc = " · ".join(f"`{tok.token_str(i).replace(' ', '␣')}` ({i})" for i in ids)
    (out / "loss_curve.svg").write_text(loss_curve_svg(log))
    tr_bpb = bits_per_byte(train_loss, train_stream.bytes_per_token)
    va_bpb = bits_per_byte(val_loss, val_stream.bytes_per_token)

    def block(text: str) -> str:
        return "```text\n" + text.strip() + "\n```"

    sample_md = []
    for prompt in PROMPTS:
        sample_md.append(f"**{prompt}**, greedy "
                         f"(`tinygpt generate \"{prompt}\" --temperature 0`):\n\n"
                         + block(samples(model, prompt, temperature=0.0, seed=0)))
        sample_md.append(f"**{prompt}**, seeded (`tinygpt generate \"{prompt}\" --seed 1`, "
                         "temperature 0.8):\n\n"
                         + block(samples(model, prompt, temperature=0.8, seed=1)))
    hours = wall_time(log) / 3600
    text = f"""# tinygpt model card

A GPT-2-style language model with {n_params:,} parameters, trained from scratch on
TinyStories with the project's own NumPy code (`tinygpt train`): no PyTorch, no JAX.

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

Cross-entropy of the shipped weights, computed over each whole part in non-overlapping
windows of {cfg.n_positions} tokens (dropout off). Bits per byte = nats per token ÷ ln 2 ÷
bytes per token; the bytes are the stories' UTF-8 bytes plus one per story separator.

| data | tokens | bytes per token | nats per token | bits per byte |
| --- | ---: | ---: | ---: | ---: |
| training, part-000 … part-004 | {len(train_stream.ids):,} | {train_stream.bytes_per_token:.3f} | {train_loss:.4f} | {tr_bpb:.4f} |
| validation, part-005 (held out) | {len(val_stream.ids):,} | {val_stream.bytes_per_token:.3f} | {val_loss:.4f} | {va_bpb:.4f} |

## Training

```sh
{command}
```

- Data: TinyStories excerpts `part-000.txt` … `part-004.txt` for training and the held-out
  `part-005.txt` (from the official validation split) for validation, from the project's
  shared data folder (not redistributed here). Stories are joined with `<|endoftext|>`.
- Steps: {last['step']:,} of batch {last['tokens'] // last['step'] // cfg.n_positions} × {cfg.n_positions};
  tokens seen: {last['tokens']:,} ({last['tokens'] / len(train_stream.ids):.1f} passes over the training text).
- Wall time: {hours:.2f} h on a 2-core CPU machine.
- Exported weights: the checkpoint with the best validation loss, at step {best['step']:,}
  (validation {best['val_loss']:.4f} nats per token, {best['val_bits_per_byte']:.4f} bits per byte).
- Final logged training loss (with dropout, last step): {last['train_loss']:.4f}.
- Optimiser: AdamW (β = 0.9, 0.95), decoupled weight decay on matrices and the embedding
  table only, linear warm-up then cosine decay to a tenth of the peak, gradient norm clipped at 1,
  dropout on the embeddings and on each attention and MLP output.

![loss curve](loss_curve.svg)

{ascii_curve(log)}

## Samples

{chr(10).join(s + chr(10) for s in sample_md)}
## Tokenizer

Byte-level BPE trained with the `tokenizers` library on part-000 … part-004 only
(`tinygpt train-tokenizer`), exactly {tok.vocab_size:,} entries including `<|endoftext|>`.
The seed sentence "{SEED_SENTENCE}" is {len(ids)} tokens: {enc}.

## Data licence

Trained on excerpts of TinyStories (Ronen Eldan and Yuanzhi Li, 2023, "TinyStories: How Small
Can Language Models Be and Still Speak Coherent English?", arXiv:2305.07759), released on the
Hugging Face hub (roneneldan/TinyStories) under the Community Data License Agreement – Sharing,
Version 1.0 (CDLA-Sharing-1.0). The excerpts were collected from public GitHub repositories and
reassembled only by splitting, normalising whitespace and encoding, and deduplicating. This
model is a result of computation on that data; the data itself is not shipped here.

## Limitations

A 1.3-million-parameter model trained on about a million tokens of children's stories: it
writes short, simple, often ungrammatical or incoherent stories, knows nothing else, and
repeats itself at low temperature. It is made for looking inside, not for use.
"""
    (out / "MODEL_CARD.md").write_text(text)
    return text
