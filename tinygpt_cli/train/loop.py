"""The training loop: batches, forward, backward, clip, AdamW; validation, checkpoints, export.

A checkpoint holds the parameters, the optimiser's moments, the step and the random
generator's state, so a resumed run continues exactly where the killed one stopped.
"""

from __future__ import annotations

import io
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .. import ops
from ..config import Config, save_config
from ..files import write_atomically
from ..model import forward, init_params, loss_and_grads
from ..tokenizer import Tokenizer, save_tokenizer, train_tokenizer
from ..weights import save_params
from .data import TokenStream, encode_stories, eval_windows, random_windows, read_stories
from .optim import AdamW, clip_by_global_norm, lr_at

CHECKPOINT = "checkpoint.npz"
LOG = "log.jsonl"


class TrainingDataError(ValueError):
    """Data that cannot train the model (too short for one window); the CLI exits 2."""


@dataclass
class Settings:
    steps: int = 2000
    batch_size: int = 32
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup: int = 200
    weight_decay: float = 0.1
    dropout: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    eval_every: int = 200
    checkpoint_every: int = 100
    minutes: float | None = None  # stop early when this much wall time has passed
    ema: float = 0.0  # decay of an exponential moving average of the weights; 0 = off
    snapshots: int = 0  # weights kept along the run in history/, log-spaced in steps
    config: dict = field(default_factory=lambda: asdict(Config()))


@dataclass
class StepInfo:
    step: int
    steps: int
    loss: float
    lr: float
    tokens_per_s: float
    val_loss: float | None = None


def evaluate(params, config: Config, stream: np.ndarray, batch_size: int = 32) -> float:
    """Mean cross-entropy (nats per token) over the whole stream, in non-overlapping windows."""
    x, y = eval_windows(stream, config.n_positions)
    total = 0.0
    for i in range(0, len(x), batch_size):
        logits = forward(params, config, x[i : i + batch_size])
        total += ops.cross_entropy(logits, y[i : i + batch_size]) * y[i : i + batch_size].size
    return total / y.size


def ema_decay_at(step: int, decay: float) -> float:
    """The average's decay, ramped up early so it does not remember the random start.

    min(decay, (1 + step) / (10 + step)): after 10 steps the average spans about half the run.
    """
    return min(decay, (1 + step) / (10 + step))


def ema_update(average: dict[str, np.ndarray], params: dict[str, np.ndarray], decay: float):
    """average <- decay * average + (1 - decay) * params, in place."""
    for n, a in average.items():
        a *= decay
        a += (1.0 - decay) * params[n]


def snapshot_steps(steps: int, count: int, first: int = 50) -> list[int]:
    """`count` steps spaced evenly in log(step) from `first` to the last step, which is included.

    The early steps get most snapshots because that is where the model's parts form.
    """
    if count <= 0:
        return []
    if count == 1 or steps <= first:
        return [steps]
    grid = np.geomspace(first, steps, count)
    return sorted({int(round(s)) for s in grid} | {steps})


HISTORY = "history"


def snapshot_name(step: int) -> str:
    return f"step-{step:06d}.safetensors"


def save_snapshot(out: Path, params, step: int, lr: float) -> None:
    """Float16 weights for `tinygpt history`, with the step and learning rate (for TracIn)."""
    from safetensors.numpy import save

    from ..weights import PREFIX

    tensors = {PREFIX + n: np.ascontiguousarray(a, dtype=np.float16) for n, a in params.items()}
    meta = {"format": "pt", "step": str(step), "lr": repr(float(lr))}
    write_atomically(out / HISTORY / snapshot_name(step), save(tensors, metadata=meta))


def prepare_tokenizer(out: Path, train_files: list[Path], vocab_size: int) -> Tokenizer:
    path = out / "tokenizer.json"
    if path.is_file():
        return Tokenizer.from_file(path)
    tok = train_tokenizer(read_stories(train_files), vocab_size)
    save_tokenizer(tok, path)
    return tok


def _save_checkpoint(path: Path, params, opt: AdamW, step: int, rng, best_val: float, settings,
                     elapsed: float, average=None) -> None:
    arrays = {f"p/{n}": a for n, a in params.items()}
    if average is not None:
        arrays.update({f"ema/{n}": a for n, a in average.items()})
    arrays.update({f"opt/{k}": a for k, a in opt.state().items()})
    arrays["step"] = np.asarray(step)
    arrays["best_val"] = np.asarray(best_val)
    arrays["elapsed"] = np.asarray(elapsed)
    arrays["rng"] = np.asarray(json.dumps(rng.bit_generator.state))
    arrays["settings"] = np.asarray(json.dumps(asdict(settings)))
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    write_atomically(path, buf.getvalue())


def _load_checkpoint(path: Path, params, opt: AdamW, rng, average=None):
    with np.load(path) as z:
        for n in params:
            params[n][...] = z[f"p/{n}"]
            if average is not None:
                average[n][...] = z[f"ema/{n}"] if f"ema/{n}" in z.files else z[f"p/{n}"]
        opt.load_state({k[4:]: z[k] for k in z.files if k.startswith("opt/")})
        rng.bit_generator.state = json.loads(str(z["rng"]))
        elapsed = float(z["elapsed"]) if "elapsed" in z.files else 0.0
        return int(z["step"]), float(z["best_val"]), elapsed


def _remove_stale_temporaries(out: Path) -> None:
    """A run killed while writing a file leaves write_atomically's `.NAME.*.tmp` behind."""
    for name in (CHECKPOINT, LOG, "model.safetensors", "config.json", "tokenizer.json"):
        for tmp in out.glob(f".{name}.*.tmp"):
            tmp.unlink(missing_ok=True)


def _trim_log(path: Path, step: int) -> None:
    """Drop log lines written after the checkpoint we resume from: they will be redone."""
    if not path.is_file():
        return
    keep = [ln for ln in path.read_text().splitlines() if ln and json.loads(ln)["step"] <= step]
    write_atomically(path, ("\n".join(keep) + "\n" if keep else "").encode())


def train(
    train_files: list[Path],
    val_files: list[Path],
    out: Path,
    settings: Settings,
    *,
    resume: bool = False,
    on_step: Callable[[StepInfo], None] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> dict:
    """Train, writing checkpoints, a JSONL log and the best weights folder into `out`."""
    note = on_note or (lambda s: None)
    out.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(out)
    config = Config(**settings.config)
    tokenizer = prepare_tokenizer(out, train_files, config.vocab_size)
    config = Config(**{**asdict(config), "bos_token_id": tokenizer.eot_id,
                       "eos_token_id": tokenizer.eot_id})
    train_data = encode_stories(read_stories(train_files), tokenizer)
    val_data: TokenStream | None = (
        encode_stories(read_stories(val_files), tokenizer) if val_files else None
    )
    need = config.n_positions + 2  # one window of inputs and targets, and room to move it
    for name, stream in (("training", train_data), ("validation", val_data)):
        if stream is not None and len(stream.ids) < need:
            raise TrainingDataError(
                f"the {name} text is {len(stream.ids)} tokens; it must be at least {need} "
                f"for windows of {config.n_positions}")
    note(f"training tokens: {len(train_data.ids):,}"
         + (f"; validation tokens: {len(val_data.ids):,}" if val_data else ""))

    rng = np.random.default_rng(settings.seed)
    params = init_params(config, rng)
    opt = AdamW(params, weight_decay=settings.weight_decay)
    # With an average on, it is what is validated, exported and snapshotted: the weights
    # that training would ship at that step.
    average = {n: p.copy() for n, p in params.items()} if settings.ema > 0 else None
    shipped = average if average is not None else params
    keep_at = set(snapshot_steps(settings.steps, settings.snapshots))
    start, best_val, elapsed_before = 0, math.inf, 0.0
    ckpt, log_path = out / CHECKPOINT, out / LOG
    if resume and ckpt.is_file():
        start, best_val, elapsed_before = _load_checkpoint(ckpt, params, opt, rng, average)
        _trim_log(log_path, start)
        note(f"resumed from {ckpt} at step {start}")
    elif log_path.exists():
        log_path.unlink()

    def log(record: dict) -> None:
        with open(log_path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def validate(step: int) -> float | None:
        nonlocal best_val
        if val_data is None:
            return None
        val = evaluate(shipped, config, val_data.ids)
        if val < best_val:
            best_val = val
            export(out, shipped, config, tokenizer)
        return val

    t0 = time.perf_counter()
    tokens_per_step = settings.batch_size * config.n_positions
    step = start
    for step in range(start, settings.steps):
        lr = lr_at(step, settings.lr, settings.warmup, settings.steps, settings.min_lr_ratio)
        x, y = random_windows(train_data.ids, settings.batch_size, config.n_positions, rng)
        loss, grads = loss_and_grads(params, config, x, y, dropout=settings.dropout, rng=rng)
        gnorm = clip_by_global_norm(grads, settings.grad_clip)
        opt.step(params, grads, lr)
        if average is not None:
            ema_update(average, params, ema_decay_at(step, settings.ema))
        done = step + 1
        if done in keep_at:
            save_snapshot(out, shipped, done, lr)
        run_time = time.perf_counter() - t0
        elapsed = elapsed_before + run_time  # wall time over all resumed pieces of the run
        tps = (done - start) * tokens_per_step / max(run_time, 1e-9)
        record = {"step": done, "train_loss": round(loss, 5), "lr": lr,
                  "grad_norm": round(gnorm, 4), "tokens": done * tokens_per_step,
                  "elapsed_s": round(elapsed, 2)}
        val = None
        out_of_time = settings.minutes is not None and run_time > settings.minutes * 60
        if done % settings.eval_every == 0 or done == settings.steps or out_of_time:
            val = validate(done)
            if val is not None:
                record["val_loss"] = round(val, 5)
                record["val_bits_per_byte"] = round(val / math.log(2) / val_data.bytes_per_token, 5)
        log(record)
        if done % settings.checkpoint_every == 0 or done == settings.steps or out_of_time:
            _save_checkpoint(ckpt, params, opt, done, rng, best_val, settings, elapsed, average)
        if on_step:
            on_step(StepInfo(done, settings.steps, loss, lr, tps, val))
        if out_of_time:
            note(f"stopped at step {done}: the {settings.minutes} minute limit was reached")
            break
    if val_data is None:
        export(out, shipped, config, tokenizer)
    return {
        "steps": step + 1 if settings.steps > start else start,
        "best_val_loss": best_val,
        "val_bytes_per_token": val_data.bytes_per_token if val_data else None,
        "train_tokens": len(train_data.ids),
    }


def export(out: Path, params, config: Config, tokenizer: Tokenizer) -> None:
    """A complete weights folder: model.safetensors, config.json, tokenizer.json."""
    save_params(params, out / "model.safetensors")
    save_config(config, out / "config.json")
    if not (out / "tokenizer.json").is_file():
        save_tokenizer(tokenizer, out / "tokenizer.json")


def write_text(path: Path, text: str) -> None:
    write_atomically(path, text.encode("utf-8"))
