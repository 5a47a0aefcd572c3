"""Activation patching: which values of the clean run carry the answer into the corrupt run?

Two texts of the same token length differ in a detail that changes the prediction. For each
value (a block's resid_pre, resid_mid, resid_post, attn_out, mlp_out at one position, or a
head's output at every position; a parallel block, GPT-NeoX's, has no resid_mid: both its
sublayers read resid_pre) the corrupt run is repeated with that value copied from the
clean run, and the metric

    (patched - corrupt) / (clean - corrupt),   of the logit difference  logit[target] - logit[vs]

says how much of the gap it restores: 0 nothing, 1 all of it.

Attribution patching approximates every cell at once from one backward pass of the corrupt
run: d metric / d value . (clean value - corrupt value), divided by the same gap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..transformer.config import Config
from ..transformer.model import backward, record
from ..transformer.wiring import FORWARD
from .question import Question, ask
from .variants import Variant, run_variants, set_all, set_row, widen

# The blocks this analysis implements (wiring.require refuses others by name): values copied
# between runs and the model's own backward (attribution patching).
HANDLES = FORWARD

STREAM = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")


def stream_kinds(config: Config) -> tuple[str, ...]:
    """The values of the stream patched at one position, the grids' rows: STREAM, without
    resid_mid for a parallel block (its attention and MLP both read resid_pre, so there is no
    value between them)."""
    return tuple(k for k in STREAM if k != "resid_mid" or not config.parallel)


def logit_difference(logits: np.ndarray, target: int, vs: int) -> np.ndarray:
    """logit[target] - logit[vs] over the last axis ([..., V] -> [...]), float64."""
    z = np.asarray(logits, np.float64)
    return z[..., target] - z[..., vs]


def check_gap(clean: float, corrupt: float) -> None:
    if clean == corrupt:
        raise InputError(
            f"the clean and corrupt runs give the same logit difference ({clean:.4g}), so "
            "there is nothing to restore: choose other texts or other --target/--vs tokens")


def restored(patched, clean: float, corrupt: float):
    """(patched - corrupt) / (clean - corrupt)."""
    return (np.asarray(patched, np.float64) - corrupt) / (clean - corrupt)


@dataclass
class Patching:
    """Fractions restored: stream[kind] is [n_layer, T], for each kind of stream_kinds;
    heads is [n_layer, n_head]."""

    stream: dict[str, np.ndarray]
    heads: np.ndarray
    clean: float  # the clean run's logit difference
    corrupt: float
    position: int


def patch_variants(clean: dict[str, np.ndarray], config: Config, position: int
                   ) -> tuple[list[Variant], list[tuple[str, int, int]]]:
    """One variant per (kind, layer, position <= scored position), then one per head.

    Positions after the scored one cannot change it (causal attention), so they are skipped;
    so is resid_post of every block but the last, which is the next block's resid_pre.
    """
    variants, keys = [], []
    for kind in stream_kinds(config):
        for i in range(config.n_layer):
            if kind == "resid_post" and i < config.n_layer - 1:
                continue
            path = f"layers.{i}.{kind}"
            for t in range(position + 1):
                variants.append({path: set_row(t, clean[path][t])})
                keys.append((kind, i, t))
    for i in range(config.n_layer):
        for h in range(config.n_head):
            path = f"layers.{i}.heads.{h}.out"
            variants.append({path: set_all(clean[path][: position + 1])})
            keys.append(("heads", i, h))
    return variants, keys


def patch_count(config: Config, position: int) -> int:
    """How many patched runs activation_patching makes (for a progress bar): resid_post of
    the last block only, every other kind of every block, at each position; then the heads."""
    per_position = (len(stream_kinds(config)) - 1) * config.n_layer + 1
    return per_position * (position + 1) + config.n_layer * config.n_head


def _both_runs(params, config: Config, clean_ids, corrupt_ids, target: int, vs: int,
               position: int, hooks=None):
    """The clean and corrupt runs' values, and their logit differences at `position`
    (refused when the two texts score the same, since the metric would divide by zero)."""
    clean_logits, clean = record(params, config, clean_ids, hooks=hooks)
    corrupt_logits, corrupt = record(params, config, corrupt_ids, hooks=hooks)
    c = float(logit_difference(clean_logits[position], target, vs))
    r = float(logit_difference(corrupt_logits[position], target, vs))
    check_gap(c, r)
    return clean, corrupt_logits, corrupt, c, r


def activation_patching(params, config: Config, clean_ids, corrupt_ids, target: int, vs: int,
                        position: int = -1, advance=None, hooks=None) -> Patching:
    """Every patch of patch_variants, run as one float64 batch on the corrupt text; `hooks`
    (steering) in every run, clean, corrupt and patched."""
    t = len(corrupt_ids)
    position = position % t
    params = widen(params)
    clean, corrupt_logits, corrupt, c, r = _both_runs(params, config, clean_ids, corrupt_ids,
                                                      target, vs, position, hooks)
    variants, keys = patch_variants(clean, config, position)
    # the metric reads two rows of the head: cut it to them (column 0 target, 1 vs)
    streams = [corrupt[f"layers.{i}.resid_pre"] for i in range(config.n_layer)]
    streams.append(corrupt[f"layers.{config.n_layer - 1}.resid_post"])
    patched = run_variants(params, config, corrupt_ids, variants, position, rows=[target, vs],
                           streams=streams, advance=advance, hooks=hooks)
    result = _grids(keys, restored(logit_difference(patched, 0, 1), c, r), config, t, c, r,
                    position)
    for i in range(config.n_layer - 1):
        result.stream["resid_post"][i] = result.stream["resid_pre"][i + 1]
    return result


def _grids(keys, scores, config: Config, t: int, clean: float, corrupt: float,
           position: int) -> Patching:
    stream = {kind: np.zeros((config.n_layer, t)) for kind in stream_kinds(config)}
    heads = np.zeros((config.n_layer, config.n_head))
    for (kind, i, j), s in zip(keys, scores, strict=True):
        (heads if kind == "heads" else stream[kind])[i, j] = s
    return Patching(stream, heads, clean, corrupt, position)


def attribution_patching(params, config: Config, clean_ids, corrupt_ids, target: int, vs: int,
                         position: int = -1, hooks=None) -> Patching:
    """The first-order estimate of every cell of activation_patching, from one backward pass.

    Cells after the scored position are 0, as in activation patching: the gradient there is 0.
    """
    t = len(corrupt_ids)
    position = position % t
    params = widen(params)
    clean, corrupt_logits, corrupt, c, r = _both_runs(params, config, clean_ids, corrupt_ids,
                                                      target, vs, position, hooks)
    dlogits = np.zeros_like(corrupt_logits)
    dlogits[position, target] += 1.0
    dlogits[position, vs] -= 1.0
    _, grads = backward(params, config, corrupt, dlogits, wrt_values=True)

    def estimate(path: str) -> np.ndarray:
        diff = clean[path].astype(np.float64) - corrupt[path]
        return (grads[path].astype(np.float64) * diff).sum(axis=-1)  # [T]

    gap = c - r
    stream = {kind: np.stack([estimate(f"layers.{i}.{kind}") for i in range(config.n_layer)])
              / gap for kind in stream_kinds(config)}
    heads = np.array([[estimate(f"layers.{i}.heads.{h}.out").sum() for h in range(config.n_head)]
                      for i in range(config.n_layer)]) / gap
    return Patching(stream, heads, c, r, position)


def correlation(a: Patching, b: Patching) -> float:
    """Pearson correlation of two patchings (of one model: the same grids) over every cell
    up to the scored position."""
    x = np.concatenate([a.stream[k][:, : a.position + 1].ravel() for k in a.stream]
                       + [a.heads.ravel()])
    y = np.concatenate([b.stream[k][:, : b.position + 1].ravel() for k in a.stream]
                       + [b.heads.ravel()])
    if x.std() == 0 or y.std() == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


@dataclass
class PatchReport:
    """Patching of one clean/corrupt pair: `result` is the method's grids (activation
    patching, or its attribution estimate with `correlation` to the real one)."""

    q: object  # analysis.question.Question, on the clean text
    method: str
    result: Patching
    correlation: float | None
    corrupt_ids: list[int]
    corrupt_tokens: list[str]


def best_other(logits_row: np.ndarray, t: int) -> int:
    """The likeliest token of a run other than `t`."""
    first, second = np.argsort(-logits_row, kind="stable")[:2]
    return int(second if first == t else first)


METHODS = ("activation", "atp")


def check_method(method: str) -> None:
    if method not in METHODS:
        raise InputError(f"unknown --method {method!r}: use activation or atp")


def patch_question(clean, corrupt, position: int, target: str | None, vs: str | None):
    """The target (default: the clean run's top guess) against vs (default: the corrupt
    run's top guess, or its next best when that is the target too: both runs guessing alike
    is a question still worth asking) at `position` (checked already), for two texts of as
    many tokens. Returns the question and a note saying which --vs was chosen, when it had
    to be."""

    if corrupt.T != clean.T:
        raise InputError(f"the clean text is {clean.T:,} token{'s' * (clean.T != 1)} and the "
                         f"corrupt text {corrupt.T}: patching copies values position by "
                         "position, so they must have the same number of tokens")
    q = ask(clean, clean.run()[position], position, target, None)
    v = clean.token_id(vs) if vs is not None else best_other(corrupt.run()[position], q.target)
    note = None
    if vs is None and v != int(np.argmax(corrupt.run()[position])):
        note = (f"both runs' top guess is {q.token_str(q.target)!r}: --vs is the corrupt run's "
                f"next best, {q.token_str(v)!r} (give --vs to choose)")
    if v == q.target:
        raise InputError(f"the target and --vs are the same token ({q.token_str(v)!r}): give "
                         "--target and --vs that differ")
    return Question(q.tokens, position, q.target, v, q.token_str), note


def patch_report(clean, corrupt, q, method: str, progress=None) -> PatchReport:
    """Activation patching of every cell, and with method 'atp' its one-backward-pass
    estimate as well (the estimate is the result; its correlation with the real one kept)."""
    args = (clean.params, clean.config, clean.ids, corrupt.ids, q.target, q.vs, q.position)
    real = activation_patching(*args, progress, hooks=clean.hooks)
    if method != "atp":
        return PatchReport(q, method, real, None, corrupt.ids, corrupt.tokens)
    estimate = attribution_patching(*args, hooks=clean.hooks)
    return PatchReport(q, method, estimate, correlation(estimate, real), corrupt.ids,
                       corrupt.tokens)
