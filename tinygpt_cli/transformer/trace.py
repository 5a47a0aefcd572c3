"""A Trace holds every value of one forward pass under its path, and finds it by any spelling.

Paths use dots or brackets and accept negative indices: `layers.0.heads.0.weights`,
`layers[-1].mlp_out`, `logits[-1]` (trailing indices pick rows of the value). The seed page's
camelCase spellings (`tokenEmbeddings`, `lnFinal.out`, `layers[0].mlpOut`) and the
TransformerLens hook names (`blocks.0.attn.hook_pattern`) resolve to the same values; the
list of names is `schema.VALUES`.
"""

from __future__ import annotations

from collections.abc import ItemsView, KeysView, Mapping
from dataclasses import dataclass

import numpy as np

from . import ops, wiring
from .config import Config
from .hooks import Hook
from .model import attn_out_bias, head_out_matrix, norm_weights, record
from .ops import probabilities
from .schema import PathError, expand, head_name, mlp_name, resolve, suggest
from .schema import describe as describe_path

__all__ = ["PathError", "Trace"]


_MISSING = object()


@dataclass(repr=False)
class Trace:
    """Every value of one forward pass, by canonical path ([B, ...] for a batch).

    A read-only mapping: `t[path]` and `path in t` take any spelling (`blocks.0.hook_pattern`,
    `layers[-1].mlp_out`); keys, iteration and len are the canonical paths it holds, in
    forward order. `t.values` is the dict of recorded arrays itself, not a method."""

    values: dict[str, np.ndarray]
    config: Config
    tokens: list[str] | None = None

    @property
    def ids(self) -> np.ndarray:
        return self.values["ids"]

    def __getitem__(self, path: str):
        return self.get(path)

    def __contains__(self, path) -> bool:
        if not isinstance(path, str):
            return False
        try:
            self.get(path)
        except PathError:
            return False
        return True

    def __iter__(self):
        return iter(self._held())

    def __len__(self) -> int:
        return len(self._held())

    def keys(self) -> KeysView:
        return KeysView(self)

    def items(self) -> ItemsView:
        return ItemsView(self)

    def _held(self) -> list[str]:
        """The canonical paths this trace answers, in forward order."""
        derived = {"layers.length": True, "tokens": self.tokens is not None,
                   "probs": "logits" in self.values}
        return [p for p in self.paths() if derived.get(p, p in self.values)]

    def __repr__(self) -> str:
        shape = " × ".join(str(n) for n in np.shape(self.values.get("ids", ())))
        return f"<Trace: {shape or 'no'} tokens, {len(self)} values (t.keys() lists them)>"

    def paths(self) -> list[str]:
        """Every concrete path, per-block and per-head paths expanded, in forward order."""
        return expand(self.config)

    def entries(self) -> list[dict]:
        """{path, shape, about} of every concrete path, in forward order (trace --list)."""
        return [{"path": p, "shape": [] if isinstance(v := self.get(p), int) else
                 list(np.shape(v)), "about": describe_path(p, self.config)}
                for p in self.paths()]

    def canonical(self, path: str) -> tuple[str, list[int]]:
        """Resolve a user path to (canonical path, trailing row indices)."""
        return resolve(path, self.config)

    def suggest(self, path: str) -> list[str]:
        return suggest(path, self.config)

    # ---------------------------------------------------------------- the residual stream
    # What lens, dla, diff and blocks read from a run, written once here.

    def stages(self, mid: bool = False) -> list[tuple[str, np.ndarray]]:
        """The residual stream, (name, [T, d]): the embeddings, then after each block (with
        `mid`, each block's resid_mid before its resid_post, the logit lens's stages)."""
        # the block's own stream values (wiring.describe): a parallel block (NeoX) has none
        # between its attention and its MLP
        return [("embeddings", self.get("embeddings"))] + [
            (f"layers.{i}.{k}", self.get(f"layers.{i}.{k}"))
            for i in range(self.config.n_layer)
            for k in (wiring.describe(self.config, i).stream[1:] if mid else ("resid_post",))]

    def residual_parts(self, params, position: int | None = None, steer=None,
                       layer: int | None = None) -> tuple[list[str], np.ndarray]:
        """The parts whose sum is the stream entering block `layer` (default: the final
        resid_post): (labels, [P, d]) at `position`, or [P, ..., T, d] at every position.
        float64: token embedding, position embedding, then per block each head's z_h W_O[h]
        (its own d_k rows of W_O, labelled L{i}H{h}), the attention bias b_O, the MLP
        output (mlp_post W_2 + b_2). A steered run (`steer`: hooks.Steering, adding `shift`
        to layers.L.resid_pre) has the shift as a part of its own, "steer", where it enters.
        dla reads the final stream at one position, qk a block's input, circuit its senders."""
        cfg = self.config
        last = cfg.n_layer if layer is None else layer
        entry = int(steer.site.split(".")[1]) if steer is not None else None

        def at(x):  # the row of `position` (before any product: dla's numbers are its own)
            return x if position is None else x[..., position, :]

        labels, parts = ["token_embedding"], [at(self.get("token_embeddings"))]
        if cfg.positions == "learned":  # a rotary model's positions are in q and k instead
            labels.append("position_embedding")
            parts.append(at(self.get("position_embeddings")))
        shape = parts[0].shape

        def heads(i: int) -> None:  # attn_out as each head's z_h W_O[h], then the bias b_O
            w_o = head_out_matrix(params, cfg, i).astype(np.float64)  # [H, d_k, d]
            z = np.moveaxis(self.get(f"layers.{i}.z").astype(np.float64), -3, 0)  # [H, .., d_k]
            for h in range(cfg.n_head):
                labels.append(head_name(i, h))
                parts.append(at(z[h]) @ w_o[h])
            labels.append(f"L{i}.attn_bias")
            parts.append(np.broadcast_to(attn_out_bias(params, cfg, i), shape))

        for i in range(last + 1):
            if i == entry:
                labels.append("steer")
                parts.append(np.broadcast_to(steer.shift, shape))
            if i == last:
                break
            b = wiring.describe(cfg, i)
            # what the block's adds put on the stream: each sublayer's output, or (Gemma) a
            # norm of it, whose scale at this run is frozen so that the parts still add up
            post = self.post_norms(i)
            added = {v for v, _ in b.added()}
            if added != {f"{post[v]}.out" if v in post else v for v in ("attn_out", "mlp_out")}:
                raise ValueError(f"block {i} adds {sorted(added)} to its stream, not the "
                                 "attention's and the MLP's outputs: no parts to split")
            first = len(parts)
            heads(i)
            self._through_post_norm(params, i, "attn_out", parts, labels, first, position)
            first = len(parts)
            labels.append(mlp_name(i))
            parts.append(at(self.get(f"layers.{i}.mlp_out")))
            self._through_post_norm(params, i, "mlp_out", parts, labels, first, position)
        return labels, np.stack([np.asarray(p, dtype=np.float64) for p in parts])

    def post_norms(self, i: int) -> dict[str, str]:
        """Block i's norms after a branch (Gemma's), branch -> the norm's name."""
        return {s.reads[0]: s.name for s in wiring.describe(self.config, i).steps
                if s.op == "norm" and s.reads[0] in ("attn_out", "mlp_out")}

    def frozen_post_norm(self, params, i: int, branch: str, x, position: int | None = None):
        """x [.., d], a part of block i's `branch` (attn_out, mlp_out), as the norm after that
        branch passes it on with its std (rms) held at this run's: centred (LayerNorm) or
        not, divided, times the scale; unchanged with no such norm. Linear in x, so the
        parts of a branch through it add up to the norm's output, less its bias."""
        name = self.post_norms(i).get(branch)
        if name is None:
            return x
        path = f"layers.{i}.{name}"
        w = np.asarray(norm_weights(params, path)[0], np.float64)
        rms = self.config.norm == "rms"
        s = np.asarray(self.get(path + (".rms" if rms else ".std")), np.float64)
        s = s if position is None else s[..., position, :]
        x = np.asarray(x, np.float64)
        return (x if rms else x - x.mean(axis=-1, keepdims=True)) / s * w

    def _through_post_norm(self, params, i, branch, parts, labels, first, position) -> None:
        """parts[first:] (one branch's) through its norm, and that norm's bias a part of its
        own."""
        name = self.post_norms(i).get(branch)
        if name is None:
            return
        for k in range(first, len(parts)):
            parts[k] = self.frozen_post_norm(params, i, branch, parts[k], position)

        bias = norm_weights(params, f"layers.{i}.{name}")[1]
        if bias is not None:
            labels.append(f"L{i}.{name}_bias")
            parts.append(np.broadcast_to(np.asarray(bias, np.float64), parts[0].shape))

    def get(self, path: str, default=_MISSING):
        """The value at `path`: an array, the token strings, or layers.length (an int). A path
        of no value raises PathError (with suggestions), unless a `default` is given."""
        if default is not _MISSING:
            return self[path] if path in self else default
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

            return probabilities(self.values["logits"], 1.0)
        if name == "rotary_angles":

            cfg, t = self.config, np.asarray(self.values["ids"]).shape[-1]
            return ops.rotary_frequencies(t, cfg.rotary, cfg.rotary_base, cfg.rope_scaling)
        if name not in self.values:
            raise PathError(name, f"{name} was not recorded in this run")
        return self.values[name]


Mapping.register(Trace)  # a dataclass field named `values` rules out Mapping's mixins


def run_traced(params, config: Config, ids, *, hooks: Hook | None = None, tokens=None):
    """Run the model and record every value: the Trace of one forward pass.

    `hooks` run before the recording, so an intervention shows in the values recorded.
    """
    return Trace(record(params, config, ids, hooks=hooks)[1], config, tokens=tokens)
