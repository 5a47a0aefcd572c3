"""The model's own history: the scores followed across the snapshots training kept.

A weights folder may hold `history/step-NNNNNN.safetensors` (float16 weights with the step
and learning rate in their metadata, written by `train --snapshots`). The timeline is those
snapshots in step order, then the folder's own model.safetensors as the final entry; reading
them is jobs.history's, and these functions take the Snapshots it read.

The head scores follow TransformerLens' head detector: a pattern P (1 where a head of that
kind would attend) and score = sum(A * P) / sum(A) over the attention grid A. The induction
score is the mean attention on the induction stripe of a repeated random token sequence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..transformer import ops
from ..transformer.config import Config
from ..transformer.families import Family
from ..transformer.model import forward, record
from ..transformer.schema import param_shapes, resolve, with_old_keys
from ..transformer.trace import Trace
from ..transformer.wiring import FORWARD
from . import heads as detect
from .heads import uniform_previous_token

# The blocks this analysis implements (wiring.require refuses others by name): the model's own
# passes on each snapshot.
HANDLES = FORWARD


@dataclass
class Snapshot:
    """One point of the timeline: a snapshot file, or the folder's final weights."""

    label: str  # "step 50", or "final"
    step: int | None  # None for final weights whose step is not recorded
    lr: float | None  # the learning rate at that step (None when unknown)
    path: Path
    params: dict[str, np.ndarray] | None = None


# ------------------------------------------------------------------ loss and next token


def text_loss(logits: np.ndarray, ids: np.ndarray) -> float | None:
    """Mean cross-entropy (nats per token) of each next token of the text; None for 1 token."""
    if len(ids) < 2:
        return None
    return ops.cross_entropy(logits[:-1], np.asarray(ids[1:]))


def next_token(logits: np.ndarray) -> tuple[int, float]:
    """The likeliest token after the text and its chance."""
    p = ops.softmax(np.asarray(logits[-1], dtype=np.float64))
    top = int(np.argmax(p))
    return top, float(p[top])


def summary(value: np.ndarray) -> dict:
    """norm (Frobenius), mean and std of a value."""
    a = np.asarray(value, dtype=np.float64)
    finite = a[np.isfinite(a)]  # masked attention scores are -inf
    return {"norm": float(np.linalg.norm(finite)), "mean": float(finite.mean()),
            "std": float(finite.std())}


# ------------------------------------------------------------------ head scores


def induction_length(config: Config) -> int:
    """The repeated sequence's length: 50 tokens as TransformerLens' examples, or what fits."""
    return min(50, (config.n_positions - 1) // 2)


def head_scores(params, config: Config, ids: np.ndarray, seed: int = 0,
                batch: int = 4, hooks=None) -> dict[str, np.ndarray]:
    """previous_token [L, H] on the text, induction [L, H] on repeated random tokens, with
    the detectors of `heads` (the same definitions as `tinygpt heads`)."""

    names = [f"layers.{i}.weights" for i in range(config.n_layer)]
    _, values = record(params, config, np.asarray(ids), names, hooks=hooks)
    grids = np.stack([values[n] for n in names])  # [L, H, T, T]
    prev = detect.detection_score(grids, detect.previous_token_pattern(len(ids)))
    induction = detect.induction_test(params, config, induction_length(config), batch, seed,
                                      config.bos_token_id, hooks).score
    return {"previous_token": prev, "induction": induction}


# ------------------------------------------------------------------ over the whole timeline


def snapshot_rows(snapshots: list[Snapshot], **columns) -> list[dict]:
    """One row per snapshot: its label, step and learning rate, and the given columns."""
    return [{"label": s.label, "step": s.step, "lr": s.lr,
             **{k: v[i] for k, v in columns.items()}} for i, s in enumerate(snapshots)]


def loss_over_training(snapshots: list[Snapshot], config: Config, ids,
                       token_str, hooks=None) -> list[dict]:
    """Per snapshot: the loss on the text and the likeliest next token with its chance."""

    ids = np.asarray(ids)
    logits = [forward(s.params, config, ids, hooks=hooks) for s in snapshots]
    losses = [text_loss(z, ids) for z in logits]
    tops = [next_token(z) for z in logits]
    return snapshot_rows(snapshots, loss=losses, top_id=[t[0] for t in tops],
                         top_token=[token_str(t[0]) for t in tops],
                         **with_old_keys({"top_chance": [t[1] for t in tops]}))


@dataclass
class ValueHistory:
    """One value or parameter at every snapshot: `shown` is its canonical name, `rows` its
    norm, mean and std per snapshot; `grid`: it is an attention grid (shown row by row)."""

    shown: str
    values: list[np.ndarray]
    rows: list[dict]
    grid: bool


def value_over_training(snapshots: list[Snapshot], config: Config, fam: Family, ids, tokens,
                        path: str, hooks=None) -> ValueHistory:
    """A parameter, by its canonical name (layers.0.attn.W_QKV) or its family's file name
    (h.0.attn.c_attn.weight), read from each snapshot, or a value of the forward pass
    (layers.0.heads.1.weights, logits[-1]) on the text under each snapshot."""

    param = path if path in param_shapes(config) else fam.canonical_name(path)
    if param is not None:
        values = [s.params[param] for s in snapshots]
        shown = path.removeprefix(fam.PREFIX)
    else:
        canonical, rows = resolve(path, config)
        shown = canonical + "".join(f"[{i}]" for i in rows)
        values = [Trace(record(s.params, config, ids, hooks=hooks)[1], config,
                        tokens=tokens).get(path) for s in snapshots]
    rows = snapshot_rows(snapshots, **{k: [summary(v)[k] for v in values]
                                       for k in ("norm", "mean", "std")})
    return ValueHistory(shown, values, rows, param is None and shown.endswith("weights"))


def heads_over_training(snapshots: list[Snapshot], config: Config, ids,
                        progress=None, hooks=None) -> dict:
    """previous_token and induction [S, L, H]: head_scores at every snapshot (`hooks`, the
    steering, in every run); previous_token_chance: the score of evenly spread attention on
    this text, where an untrained head starts."""
    scores = []
    for s in snapshots:
        scores.append(head_scores(s.params, config, ids, hooks=hooks))
        if progress:
            progress(1)
    return {**{k: np.stack([s[k] for s in scores]) for k in ("previous_token", "induction")},
            "previous_token_chance": uniform_previous_token(len(ids))}


def uniform_loss(vocab_size: int) -> float:
    """The loss (nats per token) of a model that gives every token the same chance: ln V,
    where training starts from."""
    return math.log(vocab_size)
