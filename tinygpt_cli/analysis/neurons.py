"""MLP neurons: which fire on a text, which tokens their output pushes up, and which windows of
a corpus make one fire most.

A neuron n of block L writes mlp_post[n] * W_out[n] into the residual stream (W_out is
`h.L.mlp.c_proj.weight`, [ff, d]). Read straight through the tied unembedding, W_out[n] W_E^T
says which next tokens it makes likelier; `through_norm` first multiplies by the final
LayerNorm's weight (the scale every direction gets on its way to the logits; the per-token
1/std and the centring are left out, so this is a direction, not exact logits).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..config import Config
from ..hooks import Chain, RecordOnly, StopAfter
from ..model import forward


def output_logits(params, layer: int, neurons, *, through_norm: bool = True) -> np.ndarray:
    """W_out[n] (* ln_f.weight) @ W_E^T for each neuron.  -> [len(neurons), V]"""
    w_out = params[f"h.{layer}.mlp.c_proj.weight"][np.asarray(neurons)]  # [k, d]
    if through_norm:
        w_out = w_out * params["ln_f.weight"]
    return w_out @ params["wte.weight"].T


def top_ids(row: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-row, kind="stable")[:k]


def window_maxima(params, config: Config, windows: np.ndarray, *, batch_size: int = 32,
                  progress: Callable[[int], None] | None = None
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
        rec = RecordOnly(paths)
        forward(params, config, x, hooks=Chain(rec, StopAfter(paths[-1])))
        for i, p in enumerate(paths):
            post = rec.values[p]  # [B, T, ff]
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
                       neuron: int) -> np.ndarray:
    """One neuron's activation at every position of windows [B, T] -> [B, T]."""
    path = f"layers.{layer}.mlp_post"
    rec = RecordOnly({path})
    forward(params, config, ids, hooks=Chain(rec, StopAfter(path)))
    return rec.values[path][..., neuron]
