"""MLP neurons: which fire on a text, which tokens their output pushes up, and which windows of
a corpus make one fire most.

A neuron n of block L writes mlp_post[n] * W_out[n] into the residual stream (W_out is
`layers.L.mlp.W_out`, [ff, d]). Read straight through the tied unembedding, W_out[n] W_E^T
says which next tokens it makes likelier; `through_norm` first multiplies by the final
LayerNorm's weight (the scale every direction gets on its way to the logits; the per-token
1/std and the centring are left out, so this is a direction, not exact logits). A block whose
MLP output passes a norm of its own before the residual add (Gemma 3's ln2_post) scales the
row by that norm's weight first, the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..transformer.config import Config
from ..transformer.model import neuron_out_rows, norm_weights, record, token_table
from ..transformer.wiring import FAMILIES, handles
from .circuit import norm_after
from .lens import top_neurons

# The blocks this analysis implements (wiring.require refuses others by name): what a neuron
# pushes up is its W_out row read by the head, through the norm after the MLP where there is one.
HANDLES = handles(step=FAMILIES["step"] + ("norm after attention", "norm after the MLP"))


def output_logits(params, config: Config, layer: int, neurons, *, through_norm: bool = True
                  ) -> np.ndarray:
    """W_out[n] (* ln2_post.w) (* ln_final.w) W_U for each neuron.  -> [len(neurons), V]"""
    w_out = neuron_out_rows(params, layer)[np.asarray(neurons)]  # [k, d]
    if through_norm:
        post = norm_after(config, layer, "mlp_out")  # Gemma 3's, before the residual add
        if post is not None:
            w_out = w_out * norm_weights(params, f"layers.{layer}.{post}")[0]
        w_out = w_out * norm_weights(params, "ln_final")[0]
    return w_out @ token_table(params).T


def top_ids(row: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-row, kind="stable")[:k]


def window_maxima(params, config: Config, windows: np.ndarray, *, batch_size: int = 32,
                  progress: Callable[[int], None] | None = None, hooks=None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Every neuron's largest activation in each window, and where: (max [L, W, ff] float32,
    argmax [L, W, ff] int16) for windows [W, T]. Stops after the last block's MLP."""
    n_layer, ff = config.n_layer, config.n_inner
    w = len(windows)
    top = np.empty((n_layer, w, ff), dtype=np.float32)
    where = np.empty((n_layer, w, ff), dtype=np.int16)
    paths = [f"layers.{i}.mlp_post" for i in range(n_layer)]
    for b in range(0, w, batch_size):
        x = windows[b : b + batch_size]
        _, values = record(params, config, x, paths, hooks=hooks, stop_after=paths[-1])
        for i, p in enumerate(paths):
            post = values[p]  # [B, T, ff]
            top[i, b : b + len(x)] = post.max(axis=1)
            where[i, b : b + len(x)] = post.argmax(axis=1)
        if progress:
            progress(len(x))
    return top, where


def top_windows(maxima: np.ndarray, k: int) -> np.ndarray:
    """The k windows with the highest peak, best first.  [W] -> [k]"""
    k = min(k, len(maxima))
    part = np.argpartition(-maxima, k - 1)[:k]
    return part[np.argsort(-maxima[part], kind="stable")]


def neuron_activations(params, config: Config, ids: np.ndarray, layer: int,
                       neuron: int, hooks=None) -> np.ndarray:
    """One neuron's activation at every position of windows [B, T] -> [B, T]."""
    path = f"layers.{layer}.mlp_post"
    return record(params, config, ids, {path}, hooks=hooks,
                  stop_after=path)[1][path][..., neuron]


# ------------------------------------------------------------------ on one text


@dataclass
class TextNeurons:
    """The neurons of one block that fire most on a text (analysis.lens.top_neurons rows,
    each with the tokens it `pushes` up), and the block's whole mlp_post [T, ff]."""

    path: str
    post: np.ndarray
    found: list[dict]
    read: str  # how W_out was read: through the final norm's weight or not


def neurons_on_text(session, layer: int, top: int, *, raw: bool = False) -> TextNeurons:

    path = f"layers.{layer}.mlp_post"
    post = session.record({path})[1][path]  # [T, ff]
    found = top_neurons(post, min(top, post.shape[1]))
    pushes = output_logits(session.params, session.config, layer,
                           [f["neuron"] for f in found], through_norm=not raw)
    token_str = session.model.tokenizer.token_str
    for f, row in zip(found, pushes, strict=True):
        f["pushes"] = [{"id": int(i), "token": token_str(int(i)), "logit": float(row[i])}
                       for i in top_ids(row, 8)]
    after = norm_after(session.config, layer, "mlp_out")
    read = ("W_out[n] @ W_E^T" if raw else "W_out[n] * "
            + (f"{after}.weight * " if after else "") + "ln_final.weight @ W_E^T")
    return TextNeurons(path, post, found, read)


# ------------------------------------------------------------------ over a corpus

NEURON_TOP = 64  # examples kept per neuron by jobs.neurons.corpus_maxima; --top is capped by it


def best_maxima(parts: list[dict[str, np.ndarray]], keep: int, n_windows: int
                ) -> dict[str, np.ndarray]:
    """The `keep` windows where each neuron of each block peaks highest, best first (ties:
    the earlier window), from the shards' own best (shard_maxima, in window order): window
    [L, ff, k] (its index), value [L, ff, k] (the peak), position [L, ff, k]. The best of
    each shard's best are the best of all."""

    found = {name: np.concatenate([p[name] for p in parts], axis=2) for name in parts[0]}
    best = np.argsort(-found["value"], axis=2, kind="stable")[:, :, :min(keep, n_windows)]
    return {name: np.take_along_axis(a, best, axis=2) for name, a in found.items()}


def shard_maxima(task: tuple, shared: tuple) -> dict[str, np.ndarray]:
    """The best windows of one shard (jobs.neurons.corpus_maxima): task (its first window,
    windows [w, T]), shared (params, config, keep, hooks); window indices are the
    corpus's."""
    first, windows = task
    params, config, keep, hooks = shared
    top, where = window_maxima(params, config, windows, hooks=hooks)
    best = np.argsort(-top, axis=1, kind="stable")[:, : min(keep, len(windows)), :]  # [L, k, ff]
    return {"window": (best + first).transpose(0, 2, 1).astype(np.int32),
            "value": np.take_along_axis(top, best, axis=1).transpose(0, 2, 1),
            "position": np.take_along_axis(where, best, axis=1).transpose(0, 2, 1)}


@dataclass
class NeuronExamples:
    """The windows of a corpus where one neuron fires most: ids and activations [k, T], and
    per window its index, first token's offset in the stream, peak and where it is."""

    path: str
    layer: int
    neuron: int
    ids: np.ndarray
    acts: np.ndarray
    rows: list[dict]
    windows: int  # how many windows the corpus has


def neuron_examples(params, config: Config, maxima: dict[str, np.ndarray], stream: np.ndarray,
                    layer: int, neuron: int, top: int, token_str, hooks=None
                    ) -> NeuronExamples:
    """The top windows of corpus_maxima for one neuron, run again to show every position."""
    ctx = config.n_positions
    wins = maxima["window"][layer, neuron, : min(top, maxima["window"].shape[-1])]
    ids = np.stack([stream[w * ctx:(w + 1) * ctx] for w in wins]).astype(np.int64)
    acts = neuron_activations(params, config, ids, layer, neuron, hooks)  # [k, T]
    peaks = acts.argmax(axis=1)
    rows = [{"window": int(w), "start": int(w) * ctx, "max": float(acts[r].max()),
             "position": int(peaks[r]), "token": token_str(int(ids[r, peaks[r]]))}
            for r, w in enumerate(wins)]
    return NeuronExamples(f"layers.{layer}.mlp_post[:, {neuron}]", layer, neuron, ids, acts,
                          rows, len(stream) // ctx)
