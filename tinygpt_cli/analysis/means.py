"""The mean of each ablatable value over a reference text, for mean ablation.

One vector per component, averaged over every position of every window (position-independent,
as TransformerLens' mean ablation over a dataset): each head's output [d_k] and each block's
attn_out and mlp_out [d]: each shard's sums (batch_sums), merged in window order
(merged_means). Reading the reference text, the cache and the means file beside the weights
is the job's (jobs/means.py).
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from ..transformer.config import Config
from ..transformer.model import record
from ..transformer.wiring import FORWARD

# The blocks this analysis implements (wiring.require refuses others by name): recorded values
# averaged.
HANDLES = FORWARD


def mean_size(path: str, config: Config) -> int:
    """A head's output has d_k numbers per position, attn_out and mlp_out d."""
    return config.d_k if ".heads." in path else config.n_embd


def mean_paths(config: Config) -> list[str]:
    paths = []
    for i in range(config.n_layer):
        paths += [f"layers.{i}.heads.{h}.out" for h in range(config.n_head)]
        paths += [f"layers.{i}.attn_out", f"layers.{i}.mlp_out"]
    return paths


def merged_means(parts) -> dict[str, np.ndarray]:
    """The mean, float64, of every path from the parts batch_sums gives (each shard's list
    of (positions, sums)), added in window order wherever they were made: the same numbers
    on any engine."""

    sums: dict[str, np.ndarray] = {}
    count = 0
    for part in parts:
        for n, found in part:
            for p, v in found.items():
                sums[p] = sums.get(p, 0.0) + v
            count += n
    if count == 0:
        raise InputError("the reference text has no complete window of tokens to average")
    return {p: s / count for p, s in sums.items()}


def batch_sums(task: tuple, shared: tuple) -> list[tuple[int, dict[str, np.ndarray]]]:
    """One shard's part of the means (jobs.means.value_means): for each batch, (positions,
    the sum over them of every path's value, float64). task (first window, windows [w, T]);
    shared (params, config, batch, hooks)."""
    _, windows = task
    params, config, batch, hooks = shared
    paths = mean_paths(config)
    stop = f"layers.{config.n_layer - 1}.mlp_out"
    out = []
    for start in range(0, len(windows), batch):
        ids = windows[start : start + batch]
        _, values = record(params, config, ids, paths, hooks=hooks, stop_after=stop)
        sums = {}
        for p in paths:
            v = values[p].astype(np.float64)
            sums[p] = v.reshape(-1, v.shape[-1]).sum(axis=0)
        out.append((ids.shape[0] * ids.shape[1], sums))
    return out
