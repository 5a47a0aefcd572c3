"""Many edited copies of one forward pass, run as one batch.

Ablation and patching ask the same question many times: what are the next-token scores if this
one value had been different? Each variant is a dict {canonical path: fn}, fn taking that
variant's value (no batch axis) and returning its replacement. All variants run together as a
batch [N, T], so twenty ablations or a hundred patches cost about one forward pass each of
NumPy's fixed overhead, not twenty or a hundred.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from ..transformer.config import Config
from ..transformer.hooks import Chain, Replace
from ..transformer.model import (
    block,
    cut_head,
    forward,
    norm,
    token_embeddings_of,
    token_table,
    unembed,
)

Edit = Callable[[np.ndarray], np.ndarray]
Variant = Mapping[str, Edit]

TOKENS_PER_BATCH = 8192  # rows of [B * T, ff] stay a few MB


class PerVariant:
    """A hook set that applies variant b's edits to row b of each batched value."""

    def __init__(self, variants: Sequence[Variant]) -> None:
        self.by_path: dict[str, list[tuple[int, Edit]]] = {}
        for b, variant in enumerate(variants):
            for path, fn in variant.items():
                if path == "position_embeddings":
                    # W_P[0..T-1] is shared by the whole batch: it has no row per variant.
                    raise ValueError("position_embeddings cannot be edited per variant")
                self.by_path.setdefault(path, []).append((b, fn))

    def __call__(self, path: str, x: np.ndarray) -> np.ndarray:
        todo = self.by_path.get(path)
        if not todo:
            return x
        x = x.copy()
        for b, fn in todo:
            x[b] = fn(x[b])
        return x


def run_variants(params: dict[str, np.ndarray], config: Config, ids: Sequence[int],
                 variants: Sequence[Variant], position: int = -1,
                 rows: Sequence[int] | None = None,
                 streams: Sequence[np.ndarray] | None = None,
                 advance: Callable[[int], object] | None = None, hooks=None) -> np.ndarray:
    """The logits at `position` of each edited run: [N, V], or [N, len(rows)] with `rows`
    (only those rows of the head are computed: see cut_head).

    The text is cut after `position`: with causal attention nothing later can change it.
    With `streams` (the unchanged run's resid_pre of every block, then its last resid_post),
    a variant that edits only values of blocks L and later starts at block L from that
    stream instead of recomputing the blocks before it, which no edit of it can change.
    `advance(n)` is called as each batch of n variants is done (a progress bar). `hooks`
    (steering) go into every run before the variant's edits; the streams are then not used
    (they hold the hooks' change already, which starting a block would add again).
    """
    ids = np.asarray(ids)
    position = position % len(ids)
    ids = ids[: position + 1]
    first = None
    if rows is not None:
        x = token_embeddings_of(params, config, ids)
        params = cut_head(params, config, rows)
        first = Replace({"token_embeddings": lambda _: x})
        ids = np.zeros_like(ids)
    width = config.vocab_size if rows is None else len(rows)
    out = np.zeros((len(variants), width), dtype=token_table(params).dtype)
    streams = None if hooks is not None else streams
    groups: dict[int | None, list[int]] = {}
    for k, variant in enumerate(variants):
        groups.setdefault(None if streams is None else first_block(variant, config), []).append(k)
    step = max(1, TOKENS_PER_BATCH // len(ids))
    for layer, members in groups.items():
        for start in range(0, len(members), step):
            chunk = members[start : start + step]
            each = Chain(hooks, first, PerVariant([variants[k] for k in chunk]))
            if layer is None:
                batch = np.broadcast_to(ids, (len(chunk), len(ids)))
                logits = forward(params, config, batch, hooks=each, last_only=True)
            else:
                h = np.broadcast_to(streams[layer][: len(ids)], (len(chunk), len(ids),
                                                                    config.n_embd))
                logits = forward_from(params, config, layer, h, each)
            out[chunk] = logits[:, -1, :]
            if advance is not None:
                advance(len(chunk))
    return out


def first_block(variant: Variant, config: Config) -> int:
    """The first block whose values the variant edits (n_layer when it edits none)."""
    layers = []
    for path in variant:
        parts = path.split(".")
        if parts[0] != "layers":
            raise ValueError(f"{path} comes before the first block: run it without streams")
        layers.append(int(parts[1]))
    return min(layers, default=config.n_layer)


def forward_from(params: dict[str, np.ndarray], config: Config, layer: int, h: np.ndarray,
                 hooks) -> np.ndarray:
    """Blocks layer .. n_layer-1 on the stream h entering block `layer`, then the final norm and
    the head at the last position only.  [B, T, d] -> [B, 1, V]"""

    for i in range(layer, config.n_layer):
        h = block(params, config, i, h, hooks, None, 0, None)
    u = norm(params, config, h[..., -1:, :], "ln_final", hooks)
    return unembed(params, config, u, hooks)


def set_row(t: int, value: np.ndarray) -> Edit:
    """Replace position t's row of a [T, ...] value."""
    def fn(x: np.ndarray) -> np.ndarray:
        x[t] = value
        return x
    return fn


def set_all(value: np.ndarray) -> Edit:
    """Replace the whole value (broadcast: a [d] mean fills every position)."""
    return lambda x: np.broadcast_to(value, x.shape)


def widen(params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The parameters in float64. Comparisons between runs (ablated against unchanged, patched
    against clean) are made in float64 so that a no-op edit shows as exactly no change and a
    full patch as exactly all of it, not as float32 rounding of about 1e-6."""
    return {k: np.asarray(v, np.float64) for k, v in params.items()}


