"""Steering vectors: a direction added to the residual stream entering a block.

    v = mean_t resid_pre[L](toward)_t - mean_t resid_pre[L](away)_t        (ActAdd)
    v = mean over pairs i of the same difference of pos_i and neg_i           (CAA)

and the steered run adds c * v to `layers.L.resid_pre` at every position (hooks.add_vector).
A vector is judged on held-out pairs: each pair's shared opening is a prompt, and the first
tokens where the two texts part are the target and the token it is scored against. The
steerability of a prompt is the least-squares slope of logit[target] - logit[vs] at its last
position against the scale; a negative slope is a prompt steered the wrong way (Tan et al.
2024 found up to half of inputs are). The price is the loss increase on held-out stories.

Vectors are saved as a direction file (jobs/dictionaries/directions.py), also read for
`--steer-vector`; the files of pairs and the --steer options are jobs/steer.py's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..transformer.config import Config
from ..transformer.hooks import Chain, RecordOnly, StopAfter, add_vector, chained
from ..transformer.model import forward
from ..transformer.sampling import create_rng
from ..transformer.wiring import FORWARD

# The blocks this analysis implements (wiring.require refuses others by name): a vector added to
# the stream, the model's own pass run on.
HANDLES = FORWARD


def site(layer: int) -> str:
    return f"layers.{layer}.resid_pre"


# ------------------------------------------------------------------ building a vector


def mean_resid_pre(params, config: Config, ids: list[int], layer: int,
                   hooks=None) -> np.ndarray:
    """mean over positions of resid_pre[layer] of one text (a run through `hooks`, when
    given), in float64.  [T] -> [d]"""
    keep = RecordOnly({site(layer)})
    forward(params, config, np.asarray(ids), hooks=Chain(hooks, keep, StopAfter(site(layer))))
    return keep.values[site(layer)].astype(np.float64).mean(axis=0)


def mean_difference(params, config: Config, pairs: list[tuple[list[int], list[int]]],
                    layer: int, hooks=None) -> np.ndarray:
    """The mean over pairs of mean resid_pre(pos) - mean resid_pre(neg), as float32 [d], of
    runs through `hooks` (a steering already in place) when given.

    Summed in float64 in the pairs' order, so the same pairs give the same bytes."""
    total = np.zeros(config.n_embd)
    for pos, neg in pairs:
        total += mean_resid_pre(params, config, pos, layer, hooks) - mean_resid_pre(
            params, config, neg, layer, hooks)
    return (total / len(pairs)).astype(np.float32)


# ------------------------------------------------------------------ pairs and prompts


def parse_texts(content: str, name: str) -> list[str]:
    """The texts of a --pos/--neg file: one a line, or JSON lines (a string or {"text": ...}).

    Blank lines are skipped; a line starting with '{' or '"' is read as JSON."""
    texts = []
    for n, line in enumerate(content.splitlines(), 1):
        if not line.strip():
            continue
        if line.lstrip()[:1] in ('{', '"'):
            try:
                value = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{name} line {n}: not valid JSON ({e.msg})") from None
            if isinstance(value, dict):
                value = value.get("text")
            if not isinstance(value, str) or not value:
                raise InputError(f'{name} line {n}: a JSON line must be a text or '
                                 '{"text": "..."} with a non-empty text')
            line = value
        texts.append(line)
    if not texts:
        raise InputError(f"{name} holds no text")
    return texts


def split_pairs(n: int, held_out: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out) pair indices: a seeded shuffle, at least one pair on each side."""
    if n < 2:
        raise InputError(f"steer needs at least 2 pairs (one to build the vector, one to "
                         f"test it); the files hold {n}")
    order = create_rng(seed).permutation(n)
    k = min(max(1, round(held_out * n)), n - 1)
    return np.sort(order[k:]), np.sort(order[:k])


@dataclass(frozen=True)
class Prompt:
    """A held-out pair as a test: the shared opening, and where the two texts part."""

    ids: list[int]
    target: int  # the pos text's next token
    vs: int  # the neg text's next token


def prompt_of(pos: list[int], neg: list[int], line: int) -> Prompt:
    shared = 0
    while shared < min(len(pos), len(neg)) and pos[shared] == neg[shared]:
        shared += 1
    if shared == 0 or shared == min(len(pos), len(neg)):
        why = "share no first token" if shared == 0 else "do not part (one ends first)"
        raise InputError(f"pair {line}: the two texts {why}; a held-out pair must start the "
                         "same and then differ, e.g. 'The day was happy' / 'The day was sad'")
    return Prompt(pos[:shared], pos[shared], neg[shared])


# ------------------------------------------------------------------ judging a vector


def logit_difference(params, config: Config, prompt: Prompt, vector: np.ndarray, layer: int,
                     scale: float, hooks=None) -> float:
    run = chained(hooks, add_vector(site(layer), vector, scale))
    logits = forward(params, config, np.asarray(prompt.ids), hooks=run, last_only=True)[-1]
    return float(logits[prompt.target]) - float(logits[prompt.vs])


def slope(xs: np.ndarray, ys: np.ndarray) -> float:
    """The least-squares slope of ys against xs."""
    xc = xs - xs.mean()
    return float(xc @ (ys - ys.mean()) / (xc @ xc))


def mean_loss(params, config: Config, texts: list[list[int]], hooks=None) -> float:
    """Mean next-token loss (nats) over every target of the texts (each <= n_positions)."""
    total, count = 0.0, 0
    for ids in texts:
        ids = np.asarray(ids)
        logits = forward(params, config, ids[:-1], hooks=hooks).astype(np.float64)
        z = logits - logits.max(axis=-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
        total -= float(logp[np.arange(len(ids) - 1), ids[1:]].sum())
        count += len(ids) - 1
    return total / count


@dataclass
class PromptResult:
    ids: list[int]
    target: int
    vs: int
    diffs: np.ndarray  # [S] logit[target] - logit[vs] at each scale
    slope: float


@dataclass
class SteerReport:
    """A mean-difference vector and how it steers held-out prompts."""

    layer: int
    vector: np.ndarray  # [d] float32
    train_pairs: list[int]  # line numbers (from 1) of the pairs that built it
    held_out_pairs: list[int]
    scales: np.ndarray  # [S]
    prompts: list[PromptResult]
    scale: float  # the chosen scale, at which the loss is measured
    loss_before: float | None  # nats per token on held-out stories, None without them
    loss_after: float | None
    n_loss_tokens: int

    @property
    def norm(self) -> float:
        return float(np.linalg.norm(self.vector))

    @property
    def slopes(self) -> np.ndarray:
        return np.array([p.slope for p in self.prompts])

    @property
    def wrong_way(self) -> float:
        """The fraction of held-out prompts whose logit difference falls as the scale grows."""
        return float(np.mean(self.slopes < 0))

    @property
    def loss_increase(self) -> float | None:
        return None if self.loss_before is None else self.loss_after - self.loss_before


def steer_report(params, config: Config, pos: list[list[int]], neg: list[list[int]], *,
                 layer: int, scale: float, held_out: float = 0.25, seed: int = 0, steps: int = 5,
                 loss_texts: list[list[int]] = (), hooks=None) -> SteerReport:
    """Build the vector from the training pairs, judge it on the held-out ones at `steps`
    scales from 0 to `scale`, and measure the loss on `loss_texts` unsteered and at `scale`.

    With `hooks` (a steering already in place: --steer) every run is a run through them: the
    pairs' values, the prompts and the loss; the new vector is measured on top of it."""
    train, held = split_pairs(len(pos), held_out, seed)
    prompts = [prompt_of(pos[i], neg[i], int(i) + 1) for i in held]
    vector = mean_difference(params, config, [(pos[i], neg[i]) for i in train], layer, hooks)
    scales = np.linspace(0.0, scale, steps)
    results = []
    for p in prompts:
        diffs = np.array([logit_difference(params, config, p, vector, layer, c, hooks)
                          for c in scales])
        results.append(PromptResult(p.ids, p.target, p.vs, diffs, slope(scales, diffs)))
    before = after = None
    if loss_texts:
        before = mean_loss(params, config, loss_texts, hooks)
        after = mean_loss(params, config, loss_texts,
                          chained(hooks, add_vector(site(layer), vector, scale)))
    return SteerReport(layer, vector, [int(i) + 1 for i in train], [int(i) + 1 for i in held],
                       scales, results, scale, before, after,
                       sum(len(t) - 1 for t in loss_texts))


# ------------------------------------------------------------------ a direction file's site


def layer_of_site(path: str | None, n_layer: int) -> int | None:
    """resid_pre[L] is L; resid_post[L] is resid_pre[L + 1]; anything else says nothing."""
    parts = (path or "").split(".")
    if len(parts) != 3 or parts[0] != "layers" or not parts[1].isdigit():
        return None
    layer = int(parts[1]) + (parts[2] == "resid_post")
    return layer if parts[2] in ("resid_pre", "resid_post") and layer < n_layer else None
