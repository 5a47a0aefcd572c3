"""Transcoders: one sparse dictionary per block's MLP, reading the MLP's input and predicting
its output (Dunefsky et al. 2024; circuit-tracer's per-layer transcoders).

    z = TopK_k(ReLU((x - b_in) W_enc + b_enc))     x = layers.L.ln2.out, b_in its mean (fixed)
    y_hat = z W_dec + b_dec                         predicting layers.L.mlp_out

TopK rather than JumpReLU: k fixes L0 exactly (the goal is L0 <= 32, so it is met by
construction, not by tuning a sparsity penalty), there is no threshold to learn through a
straight-through estimator, and the SAE's trainer (analysis/sae.py: Adam, unit decoder rows,
AuxK for dead latents, checkpoints) serves unchanged with the target y in place of x. In an
attribution graph the active set is frozen at the real run either way, so the choice does not
change the graph's arithmetic.

The files live in the weights folder's transcoders/, one per block, layers.L.safetensors,
with the SAE's four tensors plus b_in and metadata (kind "transcoder", layer, k,
weights_sha256: made for these weights, madefor.py's rule), read and written by
jobs/dictionaries/transcoders.py; the passes over a corpus are jobs/transcoder.py's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..transformer.config import Config
from ..transformer.hooks import Chain, RecordOnly, Replace, chained
from ..transformer.model import forward
from ..transformer.wiring import FORWARD
from . import sae as S

# The blocks this analysis implements (wiring.require refuses others by name): the MLP's recorded
# input and output.
HANDLES = FORWARD


def encoders_of(transcoders) -> list[S.SAE]:
    """Per block the SAE that encodes its latents: the transcoders themselves, or a
    cross-layer transcoder's encoders."""
    return list(getattr(transcoders, "encoders", transcoders))


def input_path(layer: int) -> str:
    return f"layers.{layer}.ln2.out"


def output_path(layer: int) -> str:
    return f"layers.{layer}.mlp_out"


# ------------------------------------------------------------------ the values they read


def mlp_values(params, config: Config, windows: np.ndarray, *, batch: int = 16,
               progress: Callable[[int], None] | None = None, hooks=None,
               outputs: list[str] | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per block, (ln2.out, its output: mlp_out, or the path outputs[i] a transcoder
    predicts) at every position of windows [W, T]: [W*T, d] each, float32, from one pass
    per batch (through `hooks` when given)."""

    outs = outputs or [output_path(i) for i in range(config.n_layer)]
    paths = [p for i in range(config.n_layer) for p in (input_path(i), outs[i])]
    parts: dict[str, list[np.ndarray]] = {p: [] for p in paths}
    for b in range(0, len(windows), batch):
        rec = RecordOnly(paths)
        forward(params, config, windows[b:b + batch], hooks=Chain(hooks, rec))
        for p in paths:
            v = rec.values[p]
            parts[p].append(np.asarray(v, dtype=np.float32).reshape(-1, v.shape[-1]))
        if progress:
            progress(len(windows[b:b + batch]))
    return [(np.concatenate(parts[input_path(i)]), np.concatenate(parts[outs[i]]))
            for i in range(config.n_layer)]


# ------------------------------------------------------------------ the replacement model


class Replacement:
    """A hook set running the replacement model: each block's mlp_out (or the value its
    transcoder predicts: Gemma's ln2_post.out) is its transcoder's prediction from that same
    run's ln2.out (upstream replacements reaching it)."""

    def __init__(self, transcoders: list[S.SAE]):
        self.transcoders = transcoders
        self.sites = {tc.site for tc in transcoders}
        self.inputs: dict[int, np.ndarray] = {}

    def __call__(self, path: str, x: np.ndarray) -> np.ndarray:
        if not path.startswith("layers.") or not (path.endswith("ln2.out")
                                                  or path in self.sites):
            return x
        layer = int(path.split(".")[1])
        if path.endswith("ln2.out"):
            self.inputs[layer] = x
            return x
        return S.reconstruct(self.transcoders[layer], self.inputs.pop(layer)).astype(x.dtype)


@dataclass
class LayerEval:
    layer: int
    k: int
    n_latents: int
    l0: float
    variance_explained: float
    dead: int


@dataclass
class TranscoderEval:
    tokens: int
    layers: list[LayerEval]
    loss_clean: float
    loss_replaced: float  # every MLP replaced by its transcoder
    loss_mean: float  # every MLP's output replaced by its mean over the tokens

    @property
    def loss_recovered(self) -> float:
        return S.recovered(self.loss_clean, self.loss_replaced, self.loss_mean)

    @property
    def l0(self) -> float:
        return float(np.mean([e.l0 for e in self.layers]))

    @property
    def variance_explained(self) -> float:
        return float(np.mean([e.variance_explained for e in self.layers]))

    @property
    def dead(self) -> int:
        return sum(e.dead for e in self.layers)


def evaluate(params, config: Config, transcoders: list[S.SAE], inputs: np.ndarray,
             targets: np.ndarray, progress: Callable[[int], None] | None = None,
             hooks=None) -> TranscoderEval:
    """On windows [W, T] of held-out text: per block L0, the fraction of mlp_out's variance
    explained (on the real run's inputs) and dead latents; the loss of the real model, of
    the replacement model (all MLPs replaced at once) and with every MLP mean-ablated."""
    if not isinstance(transcoders, list):
        raise InputError("transcoder eval evaluates per-layer transcoders; a cross-layer one "
                         "is read by graph only")
    values = mlp_values(params, config, inputs, hooks=hooks,
                        outputs=[tc.site for tc in transcoders])
    layers, means = [], {}
    for i, ((x, y), tc) in enumerate(zip(values, transcoders, strict=True)):
        z = S.encode(tc, x)
        err = float(((y - S.decode(tc, z)) ** 2).sum())
        ve = 1 - err / float(((y - y.mean(axis=0)) ** 2).sum())
        layers.append(LayerEval(i, tc.k, tc.n_latents, float((z > 0).sum(axis=1).mean()), ve,
                                int(((z > 0).sum(axis=0) == 0).sum())))
        means[tc.site] = y.mean(axis=0)
    if progress:
        progress(1)
    losses = []
    for run in (None, Replacement(transcoders),
                Replace({p: (lambda v, m=m: m) for p, m in means.items()})):
        losses.append(S.mean_loss(params, config, inputs, targets, chained(hooks, run)))
        if progress:
            progress(1)
    return TranscoderEval(int(targets.size), layers, *losses)


# ------------------------------------------------------------------ features over the training text


def top_windows(codes: dict[str, np.ndarray], latent: int, n: int = 3, before: int = 8,
                after: int = 2) -> list[dict]:
    """The latent's n strongest windows: ids around each window's peak, best first:
    {ids [before+1+after at most], peak (its index there), value}."""
    return top_windows_of(codes, [latent], n, before, after)[latent]


def top_windows_of(codes: dict[str, np.ndarray], latents, n: int = 3, before: int = 8,
                   after: int = 2) -> dict[int, list[dict]]:
    """top_windows of each latent, from one pass over the codes (a graph labels thousands:
    one scan of the text's codes a latent took most of `graph`'s time). A window's peak is
    the latent's largest value in it, at its first position; ties between windows go to the
    first window."""
    ids = codes["ids"]
    t = ids.shape[1]
    wanted = np.unique(np.asarray(latents, np.int64))
    token, slot = np.nonzero(np.isin(codes["idx"], wanted) & (codes["val"] > 0))
    lat = codes["idx"][token, slot].astype(np.int64)
    val = codes["val"][token, slot]
    window, pos = token // t, token % t
    # each (latent, window)'s peak: its largest value, the first position of it
    order = np.lexsort((pos, -val, window, lat))
    lat, val, window, pos = lat[order], val[order], window[order], pos[order]
    first = np.ones(len(lat), bool)
    first[1:] = (lat[1:] != lat[:-1]) | (window[1:] != window[:-1])
    lat, val, window, pos = lat[first], val[first], window[first], pos[first]
    # each latent's windows, strongest first, the first window among equals
    order = np.lexsort((window, -val, lat))
    lat, val, window, pos = lat[order], val[order], window[order], pos[order]
    starts = np.searchsorted(lat, wanted)
    ends = np.searchsorted(lat, wanted, side="right")
    out = {}
    for latent, a, b in zip(wanted.tolist(), starts, ends, strict=True):
        found = []
        for i in range(a, min(b, a + n)):
            p, lo = int(pos[i]), max(0, int(pos[i]) - before)
            found.append({"ids": [int(x) for x in ids[window[i], lo:p + after + 1]],
                          "peak": p - lo, "value": float(val[i])})
        out[latent] = found
    return out


def label_of(examples: list[dict], show) -> str:
    """A short label from a feature's top windows: the token it fires on and the one before
    it, when most of the windows share them. A summary of examples, not an explanation."""

    if not examples:
        return "no example in the searched text"
    on = Counter(show(e["ids"][e["peak"]]) for e in examples)
    prev = Counter(show(e["ids"][e["peak"] - 1]) for e in examples if e["peak"] > 0)
    most = len(examples) / 2
    tok, count = on.most_common(1)[0]
    p, pc = prev.most_common(1)[0] if prev else ("", 0)
    if count > most and pc > most:
        return f"on {tok} after {p}"
    if count > most:
        return f"on {tok}"
    if pc > most:
        return f"after {p}"
    return "on " + ", ".join(t for t, _ in on.most_common(3)) + " (mixed)"
