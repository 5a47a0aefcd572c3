"""A Trace holds every value of one forward pass under one name, and finds it by path.

Paths use dots or brackets and accept negative indices: `layers.0.heads.0.weights`,
`layers[-1].mlp_out`, `logits[-1]` (trailing indices pick rows of the value). The seed page's
camelCase spellings (`tokenEmbeddings`, `lnFinal.out`, `layers[0].mlpOut`) and the
TransformerLens hook names (`blocks.0.attn.hook_pattern`) resolve to the same values.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

import numpy as np

from .config import Config

# What each value is, for `trace --list` and the docs. Keys use L for a layer, H for a head.
DESCRIPTIONS: dict[str, str] = {
    "ids": "token ids (card 1)",
    "tokens": "each token's text (card 1)",
    "token_embeddings": "W_E[ids], each id's row of the embedding table (card 2)",
    "position_embeddings": "W_P[0..T-1], each position's row (card 3)",
    "embeddings": "token_embeddings + position_embeddings (card 3)",
    "layers.L.resid_pre": "the residual stream entering block L (card 4)",
    "layers.L.ln1.out": "LayerNorm before attention (card 4)",
    "layers.L.ln1.mean": "each token's mean, removed by ln1",
    "layers.L.ln1.std": "each token's sqrt(var + eps), divided out by ln1",
    "layers.L.q": "queries, every head (card 5)",
    "layers.L.k": "keys, every head (card 5)",
    "layers.L.v": "values, every head (card 5)",
    "layers.L.scores": "Q K^T / sqrt(d_k) + M, every head; -inf above the diagonal (card 5)",
    "layers.L.weights": "softmax of the scores: the attention grid, every head (card 5)",
    "layers.L.z": "weights V, every head's output before c_proj (card 5)",
    "layers.L.heads.H.q": "head H's queries",
    "layers.L.heads.H.k": "head H's keys",
    "layers.L.heads.H.v": "head H's values",
    "layers.L.heads.H.scores": "head H's masked, scaled scores",
    "layers.L.heads.H.weights": "head H's attention grid; rows sum to 1 (card 5)",
    "layers.L.heads.H.out": "head H's output, weights V",
    "layers.L.attn_out": "all heads merged and projected by c_proj (card 5)",
    "layers.L.resid_mid": "resid_pre + attn_out (card 4, add)",
    "layers.L.ln2.out": "LayerNorm before the feed-forward layer (card 4)",
    "layers.L.ln2.mean": "each token's mean, removed by ln2",
    "layers.L.ln2.std": "each token's sqrt(var + eps), divided out by ln2",
    "layers.L.mlp_pre": "x W_1 + b_1, the hidden layer before GELU (card 6)",
    "layers.L.mlp_post": "GELU(mlp_pre), the hidden neurons (card 6)",
    "layers.L.mlp_out": "mlp_post W_2 + b_2 (card 6)",
    "layers.L.resid_post": "resid_mid + mlp_out, the block's output (cards 6, 7)",
    "ln_final.out": "the final LayerNorm (card 8)",
    "ln_final.mean": "each token's mean, removed by the final norm",
    "ln_final.std": "each token's sqrt(var + eps), divided out by the final norm",
    "logits": "ln_final.out W_E^T, a score for every token of the vocabulary (card 9)",
}

# Names for the same values in other vocabularies: TransformerLens hooks and seed spellings
# that snake-casing alone does not reach. Keys and values use L/H as placeholders.
ALIASES: dict[str, str] = {
    "hook_embed": "token_embeddings",
    "hook_pos_embed": "position_embeddings",
    "blocks.L.hook_resid_pre": "layers.L.resid_pre",
    "blocks.L.ln1.hook_scale": "layers.L.ln1.std",
    "blocks.L.attn.hook_q": "layers.L.q",
    "blocks.L.attn.hook_k": "layers.L.k",
    "blocks.L.attn.hook_v": "layers.L.v",
    "blocks.L.attn.hook_attn_scores": "layers.L.scores",
    "blocks.L.attn.hook_pattern": "layers.L.weights",
    "blocks.L.attn.hook_z": "layers.L.z",
    "blocks.L.hook_attn_out": "layers.L.attn_out",
    "blocks.L.hook_resid_mid": "layers.L.resid_mid",
    "blocks.L.ln2.hook_scale": "layers.L.ln2.std",
    "blocks.L.mlp.hook_pre": "layers.L.mlp_pre",
    "blocks.L.mlp.hook_post": "layers.L.mlp_post",
    "blocks.L.hook_mlp_out": "layers.L.mlp_out",
    "blocks.L.hook_resid_post": "layers.L.resid_post",
    "ln_final.hook_scale": "ln_final.std",
    "layers.L.ln_1.out": "layers.L.ln1.out",
    "layers.L.ln_2.out": "layers.L.ln2.out",
    "ln_f.out": "ln_final.out",
}

_HEAD_FIELDS = {"q": "q", "k": "k", "v": "v", "scores": "scores", "weights": "weights", "out": "z"}


class PathError(KeyError):
    """A path that names no value; carries the nearest valid paths."""

    def __init__(self, path: str, message: str, suggestions: list[str] | None = None):
        super().__init__(path)
        self.path = path
        self.message = message
        self.suggestions = suggestions or []

    def __str__(self) -> str:
        hint = f"; did you mean {' or '.join(self.suggestions)}?" if self.suggestions else ""
        return self.message + hint


def _snake(segment: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", segment).lower()


def split_path(path: str) -> list[str]:
    """`layers[0].heads[-1].weights` -> ['layers', '0', 'heads', '-1', 'weights']"""
    text = re.sub(r"\[\s*(-?\d+)\s*\]", r".\1", path.strip())
    return [s for s in text.split(".") if s != ""]


def _is_int(s: str) -> bool:
    return re.fullmatch(r"-?\d+", s) is not None


@dataclass
class Trace:
    """Every value of one forward pass, by canonical path.

    `values` is batched ([B, T, ...]) when the forward pass was run on a batch, else not.
    """

    values: dict[str, np.ndarray]
    config: Config
    masks: dict[str, np.ndarray] = field(default_factory=dict)
    batched: bool = False
    tokens: list[str] | None = None

    @property
    def ids(self) -> np.ndarray:
        return self.values["ids"]

    def __getitem__(self, path: str):
        return self.get(path)

    # ------------------------------------------------------------------ path lookup

    def paths(self) -> list[str]:
        """Every canonical path, with per-layer and per-head paths expanded."""
        out = ["ids", "tokens", "token_embeddings", "position_embeddings", "embeddings"]
        for i in range(self.config.n_layer):
            L = f"layers.{i}."
            for name in ("resid_pre", "ln1.out", "ln1.mean", "ln1.std", "q", "k", "v",
                         "scores", "weights", "z"):
                out.append(L + name)
            for h in range(self.config.n_head):
                out += [f"{L}heads.{h}.{f}" for f in _HEAD_FIELDS]
            for name in ("attn_out", "resid_mid", "ln2.out", "ln2.mean", "ln2.std", "mlp_pre",
                         "mlp_post", "mlp_out", "resid_post"):
                out.append(L + name)
        out += ["ln_final.out", "ln_final.mean", "ln_final.std", "logits", "layers.length"]
        return out

    def canonical(self, path: str) -> tuple[str, list[int]]:
        """Resolve a user path to (canonical path, trailing row indices)."""
        parts = [_snake(p) if not _is_int(p) else p for p in split_path(path)]
        if not parts:
            raise PathError(path, "empty path")
        # Longest prefix that names a value; what follows must be indices into it.
        for cut in range(len(parts), 0, -1):
            head, rest = parts[:cut], parts[cut:]
            if not all(_is_int(r) for r in rest):
                continue
            name = self._name(head)
            if name is not None:
                return name, [int(r) for r in rest]
        raise PathError(path, f"no value at path {path!r}", self.suggest(path))

    def _name(self, parts: list[str]) -> str | None:
        cfg = self.config
        parts = list(parts)
        # Normalise layer / head indices (negatives count from the end) into placeholders.
        idx: dict[str, int] = {}
        for key, count, ph in (("layers", cfg.n_layer, "L"), ("blocks", cfg.n_layer, "L"),
                               ("heads", cfg.n_head, "H")):
            if key in parts:
                j = parts.index(key)
                if j + 1 < len(parts) and _is_int(parts[j + 1]):
                    n = int(parts[j + 1])
                    if not -count <= n < count:
                        raise PathError(
                            ".".join(parts),
                            f"{key[:-1]} {n} is out of range: this model has {count} "
                            f"{key} (0..{count - 1}, or -{count}..-1)",
                        )
                    idx[ph] = n % count
                    parts[j + 1] = ph
        pattern = ".".join(parts)
        if pattern == "layers.length":
            return pattern
        pattern = ALIASES.get(pattern, pattern)
        if pattern not in DESCRIPTIONS and pattern != "tokens":
            return None
        for key, ph in (("layers", "L"), ("heads", "H")):
            if f"{key}.{ph}" in pattern:
                if ph not in idx:
                    return None  # the placeholder itself was typed, not an index
                pattern = pattern.replace(f"{key}.{ph}", f"{key}.{idx[ph]}")
        return pattern

    def suggest(self, path: str) -> list[str]:
        return difflib.get_close_matches(path.strip(), self.paths(), n=2, cutoff=0.5)

    def get(self, path: str):
        """The value at `path`: an array, the token strings, or layers.length (an int)."""
        name, rows = self.canonical(path)
        value = self._value(name)
        for r in rows:
            if not isinstance(value, np.ndarray) or value.ndim == 0:
                raise PathError(path, f"{name} has no rows to index")
            if not -value.shape[0] <= r < value.shape[0]:
                raise PathError(
                    path, f"index {r} is out of range for {name}, whose first axis has "
                    f"{value.shape[0]} entries (0..{value.shape[0] - 1})"
                )
            value = value[r]
        return value

    def _value(self, name: str):
        if name == "layers.length":
            return self.config.n_layer
        if name == "tokens":
            if self.tokens is None:
                raise PathError(name, "this trace has no token strings")
            return self.tokens
        m = re.fullmatch(r"layers\.(\d+)\.heads\.(\d+)\.(\w+)", name)
        if m:
            layer, head, f = int(m[1]), int(m[2]), m[3]
            return self.values[f"layers.{layer}.{_HEAD_FIELDS[f]}"][..., head, :, :]
        return self.values[name]
