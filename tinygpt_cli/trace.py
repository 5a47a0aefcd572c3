"""A Trace holds every value of one forward pass under its path, and finds it by any spelling.

Paths use dots or brackets and accept negative indices: `layers.0.heads.0.weights`,
`layers[-1].mlp_out`, `logits[-1]` (trailing indices pick rows of the value). The seed page's
camelCase spellings (`tokenEmbeddings`, `lnFinal.out`, `layers[0].mlpOut`) and the
TransformerLens hook names (`blocks.0.attn.hook_pattern`) resolve to the same values; the
list of names is `schema.VALUES`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import Config
from .schema import PathError, expand, resolve, suggest

__all__ = ["PathError", "Trace"]


@dataclass
class Trace:
    """Every value of one forward pass, by canonical path ([B, ...] for a batch)."""

    values: dict[str, np.ndarray]
    config: Config
    tokens: list[str] | None = None

    @property
    def ids(self) -> np.ndarray:
        return self.values["ids"]

    def __getitem__(self, path: str):
        return self.get(path)

    def paths(self) -> list[str]:
        """Every concrete path, per-block and per-head paths expanded, in forward order."""
        return expand(self.config)

    def entries(self) -> list[dict]:
        """{path, shape, about} of every concrete path, in forward order (trace --list)."""
        from .schema import describe

        return [{"path": p, "shape": [] if isinstance(v := self.get(p), int) else
                 list(np.shape(v)), "about": describe(p)} for p in self.paths()]

    def canonical(self, path: str) -> tuple[str, list[int]]:
        """Resolve a user path to (canonical path, trailing row indices)."""
        return resolve(path, self.config)

    def suggest(self, path: str) -> list[str]:
        return suggest(path, self.config)

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
        if name == "probs":
            from .sampling import probabilities

            return probabilities(self.values["logits"], 1.0)
        if name not in self.values:
            raise PathError(name, f"{name} was not recorded in this run")
        return self.values[name]
