"""The GPT-2 forward pass as small named functions, every value passing through hooks,
and its backward pass, which returns gradients for the parameters and, on request, for every
recorded value under the same path.

Parameters are a flat dict by their canonical names, the same for every family
(`layers.0.attn.W_QKV`, `ln_final.b`, `embed.W_E`, ...: schema.PARAMS; families/ maps each
family's file to them). `ids` is
[T] for one text or [B, T] for a batch; every value then has that leading shape.
"""

from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError, NonFiniteError
from ..storage.pages import fresh_pages
from . import ops, wiring
from .config import Config
from .hooks import Chain, Hook, Record, RecordOnly, Stop, StopAfter, sets_of
from .schema import is_bias, is_norm_weight, param_shapes
from .wiring import Step

__all__ = ["Dropout", "KVCache", "backward", "decode_step", "forward", "run_to_final_norm",
           "init_params", "logits_of", "loss_and_grads",
           "param_shapes"]


def init_params(
    config: Config, rng: np.random.Generator, dtype=np.float32
) -> dict[str, np.ndarray]:
    """GPT-2's initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2 L)."""
    params = {}
    resid_std = 0.02 / np.sqrt(2 * config.n_layer)
    for name, shape in param_shapes(config).items():
        if is_norm_weight(name):
            value = np.ones(shape)
        elif is_bias(name):
            value = np.zeros(shape)
        elif name.endswith((".W_O", ".W_out")):  # the projections back into the stream
            value = rng.normal(0.0, resid_std, shape)
        elif name == "embed.W_pos":
            value = rng.normal(0.0, 0.01, shape)
        else:
            value = rng.normal(0.0, 0.02, shape)
        params[name] = value.astype(dtype)
    return params


def _no_hooks(path: str, x: np.ndarray) -> np.ndarray:
    return x


@dataclass
class Dropout:
    """Inverted dropout before each residual add (training); keeps its masks for backward."""

    p: float
    rng: np.random.Generator
    masks: dict[str, np.ndarray] = field(default_factory=dict)

    def __call__(self, path: str, x: np.ndarray) -> np.ndarray:
        if self.p <= 0.0:
            return x
        mask = ops.dropout_mask(x.shape, self.p, self.rng, x.dtype)
        self.masks[path] = mask
        return x * mask


@dataclass
class KVCache:
    """Each block's keys and values for the positions a next query can read, in buffers.

    k[i], v[i]: [*batch, H_kv, rows, d_k] (the keys already turned by their positions); row r
    holds position first[i] + r. A block that sees all keys keeps every position from 0 (one
    preallocated buffer of n_ctx rows); a block with a sliding window of w keys (Gemma 3's,
    GPT-Neo's local blocks) keeps only the w - 1 before the newest, in a buffer of 2 w rows
    whose live rows move to its front when it is full, so its memory stays bounded however
    long the text (held_bytes). forward(..., cache=c, start=c.length) writes the new
    positions' keys and values and attends over what is kept (put).
    """

    k: list[np.ndarray]
    v: list[np.ndarray]
    length: int = 0
    decoder: Decoder | None = None  # decode_step's, made at its first step
    windows: tuple[int, ...] = ()  # each block's window (0: all); () all
    first: list[int] = field(default_factory=list)  # the position of each buffer's row 0

    @classmethod
    def empty(cls, config: Config, batch: tuple[int, ...] = (), dtype=np.float32) -> KVCache:
        # One buffer for the blocks that keep every position, not zeroed: only positions
        # below `length` are ever read, and each is written first; untouched, its pages are
        # never made (pages.fresh_pages: the prompt's few positions at the start of every
        # head's stretch would otherwise make nearly all of it, 2 MB at a time, before the
        # first token). A sliding block's is its own, of 2 w rows (smaller than the context).
        n = config.n_positions
        windows = tuple(w if 0 < w and 2 * w < n else 0
                        for w in (config.window(i) for i in range(config.n_layer)))
        full = [i for i, w in enumerate(windows) if not w]
        buf = fresh_pages((len(full), 2, *batch, config.kv_heads, n, config.d_k), dtype)
        k, v = [], []
        for i, w in enumerate(windows):
            if w:
                pair = np.empty((2, *batch, config.kv_heads, 2 * w, config.d_k), dtype)
            else:
                pair = buf[full.index(i)]
            k.append(pair[0])
            v.append(pair[1])
        return cls(k, v, windows=windows, first=[0] * config.n_layer)

    def put(self, i: int, start: int, k: np.ndarray, v: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, int]:
        """Block i's keys and values k, v [.., H_kv, T, d_k] of positions start .. end-1
        written: (the keys and values the queries at those positions may read, the position
        of the first). All from 0 for a block that sees all keys; from start - w + 1 for a
        window of w, the rows the buffer keeps (and as many again for a prompt's pass)."""
        end = start + k.shape[-2]
        w = self.windows[i] if self.windows else 0
        if not w:
            self.k[i][..., start:end, :] = k
            self.v[i][..., start:end, :] = v
            return self.k[i][..., :end, :], self.v[i][..., :end, :], 0
        lo = max(0, start - w + 1)  # the first key the first new query sees
        base = self.first[i] if start else lo  # a pass from 0 begins afresh
        if lo < base:
            raise ValueError(f"block {i}'s cache holds positions from {base}, not {lo}")
        rows = self.k[i].shape[-2]
        if end - lo > rows or (rows > 2 * w and end - lo <= 2 * w):  # a prompt's pass, or
            # the first step after one: a buffer of the size needed (2 w rows once it fits)
            size = max(2 * w, end - lo)
            for buf in (self.k, self.v):
                old = buf[i]
                buf[i] = np.empty((*old.shape[:-2], size, old.shape[-1]), old.dtype)
                buf[i][..., :start - lo, :] = old[..., lo - base:start - base, :]
            base = lo
        elif end - base > rows:  # full: the live rows to the front
            for buf in (self.k, self.v):
                buf[i][..., :start - lo, :] = buf[i][..., lo - base:start - base, :].copy()
            base = lo
        self.first[i] = base
        self.k[i][..., start - base:end - base, :] = k
        self.v[i][..., start - base:end - base, :] = v
        return (self.k[i][..., lo - base:end - base, :], self.v[i][..., lo - base:end - base, :],
                lo)

    def held_bytes(self) -> int:
        """The bytes of keys and values the cache holds: every position so far of a block
        that sees all keys (its buffer's pages are made as they are written), a sliding
        block's whole buffer."""
        total = 0
        for i, k in enumerate(self.k):
            w = self.windows[i] if self.windows else 0
            rows = k.shape[-2] if w else self.length
            total += 2 * k.itemsize * int(np.prod(k.shape[:-2])) * rows * k.shape[-1]
        return total


# ------------------------------------------------------------------ the forward pass, by card


def embed(params, ids: np.ndarray, start: int, hooks: Hook, scale: float = 0.0) -> np.ndarray:
    """Cards 1-3: ids -> their rows of W_E (times `scale`, Gemma's sqrt(d), when given),
    plus the rows of W_P for their positions (a rotary model has no W_P: its positions turn
    q and k in attention)."""
    tok = hooks("token_embeddings", ops.scaled_embedding(params["embed.W_E"], ids, scale))
    if "embed.W_pos" not in params:
        return hooks("embeddings", tok)
    pos = hooks("position_embeddings",
                ops.position_embedding(params["embed.W_pos"], ids.shape[-1], start))  # [T, d]
    return hooks("embeddings", tok + pos)


def embed_backward(g: Gradients, dh: np.ndarray) -> None:
    """Cards 1-3 in reverse: the rows of W_E and W_P the embeddings were read from."""
    demb = g.undrop("embeddings", dh)
    g.keep("embeddings", demb)
    g.keep("token_embeddings", demb)
    learned = "embed.W_pos" in g.params
    if learned:
        g.keep("position_embeddings", demb.reshape(-1, *demb.shape[-2:]).sum(axis=0)
               if demb.ndim == 3 else demb)
    if not g.weights:
        return
    if learned:
        g.grads["embed.W_pos"] = ops.position_embedding_backward(demb, g.params["embed.W_pos"])
    g.grads["embed.W_E"] = g.grads.get("embed.W_E", 0) + ops.scaled_embedding_backward(
        demb, g.params["embed.W_E"], g.values["ids"], g.config.embed_scale)


def norm(params, config: Config, x: np.ndarray, name: str, hooks: Hook) -> np.ndarray:
    """Card 4 (and 8): the norm `name` (layers.L.ln1, layers.L.ln2, ln_final), a LayerNorm
    or an RMSNorm as the architecture has it; its parameters are name.w (and name.b)."""
    if config.norm == "rms":
        return rms_norm(x, params[name + ".w"], config.layer_norm_epsilon, name, hooks)
    return layer_norm(x, params[name + ".w"], params[name + ".b"], config.layer_norm_epsilon,
                      name, hooks)


def norm_backward(g: Gradients, d: np.ndarray, x: np.ndarray, name: str) -> np.ndarray:
    """Card 4 (and 8) in reverse: dx of the norm `name` whose input was x."""
    if g.config.norm == "rms":
        return rms_norm_backward(g, d, x, name)
    return layer_norm_backward(g, d, x, name, name)


def layer_norm(x: np.ndarray, w, b, eps: float, name: str, hooks: Hook) -> np.ndarray:
    """Card 4 (and 8): ops.layer_norm, its mean and std passing through the hooks."""
    if hooks is _no_hooks and x.dtype == w.dtype == b.dtype:
        # nothing to show or change (generation): the same arithmetic without the checks,
        # which cost more than the arithmetic on one position
        return ops.layer_norm_out(x, w, b, eps)
    mean = hooks(name + ".mean", ops.layer_norm_mean(x))  # [T, 1]
    centred = x - mean
    computed = ops.layer_norm_std(centred, eps)
    std = hooks(name + ".std", computed)
    # centred is ours alone: scaled in place when the hook kept the std's shape and dtype
    mine = (isinstance(std, np.ndarray) and std.shape == computed.shape
            and std.dtype == centred.dtype)
    return hooks(name + ".out", ops.layer_norm_scale(centred, std, w, b, in_place=mine))


def layer_norm_backward(g: Gradients, d: np.ndarray, x: np.ndarray, param: str,
                        name: str) -> np.ndarray:
    """Card 4 (and 8) in reverse: dx of the norm `name` with weight and bias `param`; the
    gradients of its hooked mean and std kept as values."""
    dx, dw, db, dmean, dstd = \
        ops.layer_norm_backward_parts(d, x, g.params[param + ".w"],
                                      g.values[name + ".mean"], g.values[name + ".std"])
    g.grads[param + ".w"], g.grads[param + ".b"] = dw, db
    g.keep(name + ".mean", dmean)
    g.keep(name + ".std", dstd)
    return dx


def rms_norm(x: np.ndarray, w, eps: float, name: str, hooks: Hook) -> np.ndarray:
    """Card 4 (and 8) of Llama-style models: ops.rms_norm, its rms passing through the hooks."""
    rms = hooks(name + ".rms", ops.rms_of(x, eps))  # [T, 1]
    return hooks(name + ".out", ops.rms_scale(x, rms, w))


def rms_norm_backward(g: Gradients, d: np.ndarray, x: np.ndarray, name: str) -> np.ndarray:
    dx, g.grads[name + ".w"], drms = ops.rms_norm_backward(d, x, g.params[name + ".w"],
                                                           g.values[name + ".rms"])
    g.keep(name + ".rms", drms)
    return dx


@functools.cache
def _head_paths(prefix: str, name: str, n_head: int) -> tuple[str, ...]:
    return tuple(f"{prefix}heads.{h}.{name}" for h in range(n_head))


def _kept(hooks: Hook | None, x: np.ndarray) -> bool:
    """Whether a recording hook keeps x or a view of it (then it must not be overwritten)."""
    values = getattr(hooks, "values", None) or {}
    return any(np.may_share_memory(v, x) for v in values.values())


def _heads(name: str, x: np.ndarray, prefix: str, hooks: Hook, n_head: int) -> None:
    """Pass each head's slice of x [.., H, ...] through the hooks as its own value; a hook
    that returns a new array for a head has it written into that head's slice. With fewer
    heads in x than queries (grouped keys and values), head h's is its group's, h // group."""
    group = n_head // x.shape[-3]
    # one text ([H, T, ..]): the heads as the first axis iterates them, the cheapest views
    parts = (x if x.ndim == 3 and group == 1
             else (x[..., h // group, :, :] for h in range(n_head)))
    for path, part in zip(_head_paths(prefix, name, n_head), parts, strict=True):
        out = hooks(path, part)
        if out is not part:
            part[...] = out


def queries_keys_values(params, config: Config, i: int, x: np.ndarray, start: int,
                        per_text: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Block i's q [H, T, d_k] and k, v [H_kv, T, d_k] from its normed input x: one product
    by W_QKV, each head's q and k RMS-normed (Qwen3) and turned by its positions (rotary)."""
    p = f"layers.{i}.attn."
    qkv = ops.linear(x, params[p + "W_QKV"], params.get(p + "b_QKV"), per_text)
    q, k, v = ops.split_qkv(qkv, config.n_head, config.kv_heads)
    return turned(params, config, i, "q", q, start), turned(params, config, i, "k", k, start), v


def turned(params, config: Config, i: int, part: str, x: np.ndarray, start: int) -> np.ndarray:
    """Block i's projected queries (part "q") or keys ("k") [.., T, d_k] as attention reads
    them: each head's RMS-normed (Qwen3), then turned by its positions start .. (rotary);
    unchanged for GPT-2's block. Head by head, so a caller may give one head's alone
    (analysis.circuit, whose heads each read their own input)."""
    a = wiring.describe(config, i).attention
    if a.qk_norm:
        w = params[f"layers.{i}.attn.{part}_norm.w"]
        x = ops.rms_norm(x, w, config.layer_norm_epsilon)[0]
    if a.rotary:
        x = ops.rotary(x, start, a.rotary, a.rotary_base, a.rope_scaling)
    return x


def turned_backward(g: Gradients, i: int, dq: np.ndarray, dk: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
    """turned() of a whole text (start 0) in reverse, q and k together: from d q, d k as
    attention read them to d of the projections W_QKV made."""
    a = wiring.describe(g.config, i).attention
    if a.rotary:
        rope = (a.rotary, a.rotary_base, a.rope_scaling)
        dq, dk = ops.rotary_backward(dq, 0, *rope), ops.rotary_backward(dk, 0, *rope)
    if a.qk_norm:
        dq, dk = _qk_norm_backward(g, i, dq, dk)
    return dq, dk


def attention(params, config: Config, i: int, x: np.ndarray, hooks: Hook | None,
              cache: KVCache | None, start: int, per_text: bool = False) -> np.ndarray:
    """Card 5: masked multi-head attention of block i.  [T, d] -> [T, d]"""
    p, L = f"layers.{i}.attn.", f"layers.{i}."
    q, k, v = queries_keys_values(params, config, i, x, start, per_text)
    if hooks is not None:
        q, k, v = hooks(L + "q", q), hooks(L + "k", k), hooks(L + "v", v)
        for name, a in (("q", q), ("k", k), ("v", v)):
            _heads(name, a, L, hooks, config.n_head)
    if cache is not None:  # the keys from position `first` on: the queries' places counted
        k, v, first = cache.put(i, start, k, v)  # from there (a sliding block keeps a window)
        start -= first
    a = wiring.describe(config, i).attention
    k, v = ops.repeat_kv(k, a.groups), ops.repeat_kv(v, a.groups)
    scores = ops.attention_scores(q, k, start, a.scale, a.window)  # [H, T, S]
    if hooks is not None:
        scores = hooks(L + "scores", scores)
        _heads("scores", scores, L, hooks, config.n_head)
    # A hook that only records leaves the masked scores -inf, as causal_softmax needs; any
    # other may have changed them (in place, even, through a head's slice).
    untouched = hooks is None or type(hooks) in (Record, RecordOnly)
    weights = ops.attention_weights(scores, start, masked=untouched,
                                    overwrite=untouched and not _kept(hooks, scores))
    if weights is None:  # a row out of the unshifted softmax's range, its scores overwritten
        scores = ops.attention_scores(q, k, start, a.scale, a.window)
        weights = ops.attention_weights(scores, start)
    if hooks is not None:
        weights = hooks(L + "weights", weights)
        _heads("weights", weights, L, hooks, config.n_head)
    z = ops.attention_mix(weights, v, start, masked=untouched)  # [H, T, d_k]
    if hooks is not None:
        z = hooks(L + "z", z)
        _heads("out", z, L, hooks, config.n_head)
    out = ops.linear(ops.merge_heads(z), params[p + "W_O"], params.get(p + "b_O"), per_text)
    return out if hooks is None else hooks(L + "attn_out", out)  # [T, d]


def attention_backward(g: Gradients, i: int, dattn: np.ndarray) -> np.ndarray:
    """Card 5 in reverse: from d attn_out to d ln1.out, through W_O, the weighted sum of
    the values, the softmax, the scores, the positions' turn, the q/k norms and W_QKV."""
    p, L, values, cfg = f"layers.{i}.attn.", f"layers.{i}.", g.values, g.config
    g.keep(L + "attn_out", dattn)
    dz, g.grads[p + "W_O"], db = ops.linear_backward(
        dattn, ops.merge_heads(values[L + "z"]), g.params[p + "W_O"], weights=g.weights)
    g.bias(p + "b_O", db)
    return heads_backward(g, i, ops.split_heads(dz, cfg.n_head))


def heads_backward(g: Gradients, i: int, dz: np.ndarray) -> np.ndarray:
    """Card 5 from the heads' outputs z [H, T, d_k] in reverse, to d ln1.out."""
    L, values, a = f"layers.{i}.", g.values, wiring.describe(g.config, i).attention
    group = a.groups
    k, v = ops.repeat_kv(values[L + "k"], group), ops.repeat_kv(values[L + "v"], group)
    dq, dk, dvv, dweights, dscores = ops.attention_backward_parts(
        dz, values[L + "q"], k, v, values[L + "weights"], a.scale)
    dk, dvv = ops.repeat_kv_backward(dk, group), ops.repeat_kv_backward(dvv, group)
    for name, path, d in (("out", "z", dz), ("weights", "weights", dweights),
                          ("scores", "scores", dscores)):
        g.keep(L + path, d)
        g.keep_heads(name, d, L)
    return qkv_backward(g, i, dq, dk, dvv)


def qkv_backward(g: Gradients, i: int, dq: np.ndarray, dk: np.ndarray,
                 dvv: np.ndarray) -> np.ndarray:
    """Card 5's first step in reverse: from d q, k, v to d ln1.out, through the positions'
    turn, the q/k norms and W_QKV."""
    p, L, values = f"layers.{i}.attn.", f"layers.{i}.", g.values
    for name, d in (("q", dq), ("k", dk), ("v", dvv)):
        g.keep(L + name, d)
        g.keep_heads(name, d, L)
    dq, dk = turned_backward(g, i, dq, dk)
    dqkv = np.concatenate(
        [ops.merge_heads(dq), ops.merge_heads(dk), ops.merge_heads(dvv)], axis=-1)
    # the product's own output gradient, before the turn and the norms (TracIn's W_QKV term
    # pairs it with ln1.out; q, k above are the turned, normed values' gradients)
    g.keep(L + "qkv", dqkv)
    dx, g.grads[p + "W_QKV"], db = ops.linear_backward(
        dqkv, values[L + "ln1.out"], g.params[p + "W_QKV"], weights=g.weights)
    g.bias(p + "b_QKV", db)
    g.keep(L + "ln1.out", dx)
    return dx


def attention_weights_backward(g: Gradients, i: int, dweights: np.ndarray) -> np.ndarray:
    """Card 5 from its attention weights in reverse (a scalar that reads block i's pattern,
    not its output): through the softmax, the scores and W_QKV, to d ln1.out."""
    L, values, a = f"layers.{i}.", g.values, wiring.describe(g.config, i).attention
    group = a.groups
    dscores = ops.softmax_backward(dweights, values[L + "weights"])
    dq, dk = ops.attention_scores_backward(dscores, values[L + "q"],
                                           ops.repeat_kv(values[L + "k"], group), a.scale)
    return qkv_backward(g, i, dq, ops.repeat_kv_backward(dk, group),
                        np.zeros_like(values[L + "v"]))


def _qk_norm_backward(g: Gradients, i: int, dq: np.ndarray, dk: np.ndarray):
    """Through each head's RMSNorm of q and k, whose inputs are made again from ln1.out (the
    same product as the pass's; not a value of the trace)."""
    p, cfg = f"layers.{i}.attn.", g.config
    q, k = _queries_keys_before_norm(g.params, cfg, i, g.values[f"layers.{i}.ln1.out"])
    out = []
    for name, x, d in (("q_norm", q, dq), ("k_norm", k, dk)):
        w = g.params[p + name + ".w"]
        rms = ops.rms_of(x, cfg.layer_norm_epsilon)
        dx, dw, _ = ops.rms_norm_backward(d, x, w, rms)
        g.grads[p + name + ".w"] = dw
        if g.wrt_values:  # each head's and position's part of dw, summed per window by TracIn
            g.keep(p + name + ".dw", d * (x / rms))
        out.append(dx)
    return out


def _queries_keys_before_norm(params, config: Config, i: int, x: np.ndarray):
    """Block i's q [H, T, d_k] and k [H_kv, T, d_k] from its normed input x, before Qwen3's
    per-head norms and the positions' turn (the pass's own product, made again)."""
    p = f"layers.{i}.attn."
    qkv = ops.linear(x, params[p + "W_QKV"], params.get(p + "b_QKV"))
    q, k, _ = ops.split_qkv(qkv, config.n_head, config.kv_heads)
    return q, k


def qk_norm_rms(params, config: Config, values, i: int) -> tuple[np.ndarray, np.ndarray]:
    """The rms Qwen3's norms divided each head's q [H, T, 1] and k [H_kv, T, 1] of block i
    by in the run of `values`: sqrt(mean(x^2) + eps) of the unnormed vectors, made again
    from ln1.out (they are not values of the trace)."""
    q, k = _queries_keys_before_norm(params, config, i, values[f"layers.{i}.ln1.out"])
    eps = config.layer_norm_epsilon
    return ops.rms_of(q, eps), ops.rms_of(k, eps)


def qk_norm_weights(params, i: int) -> tuple[np.ndarray, np.ndarray]:
    """The scales [d_k] of Qwen3's per-head norms of block i's q and of its k."""
    p = f"layers.{i}.attn."
    return params[p + "q_norm.w"], params[p + "k_norm.w"]


def feed_forward(params, config: Config, i: int, x: np.ndarray, hooks: Hook,
                 per_text: bool = False) -> np.ndarray:
    """Card 6: act(x W_1 + b_1) W_2 + b_2, or gated: (act(x W_gate) * x W_in) W_out.
    [T, d] -> [T, ff] -> [T, d]"""
    p, L = f"layers.{i}.mlp.", f"layers.{i}."
    if config.mlp == "gated":  # no biases: the config refuses a gated MLP with them
        pre = hooks(L + "mlp_pre", ops.linear(x, params[p + "W_gate"], None, per_text))
        up = hooks(L + "mlp_up", ops.linear(x, params[p + "W_in"], None, per_text))
        post = hooks(L + "mlp_post", ops.gated(pre, up, config.act))
    else:
        pre = hooks(L + "mlp_pre", ops.linear(x, params[p + "W_in"], params.get(p + "b_in"),
                                              per_text))
        post = hooks(L + "mlp_post", ops.ACTIVATIONS[config.act][0](pre))
    return hooks(L + "mlp_out", ops.linear(post, params[p + "W_out"], params.get(p + "b_out"),
                                           per_text))


def feed_forward_backward(g: Gradients, i: int, dmlp_out: np.ndarray) -> np.ndarray:
    """Card 6 in reverse: from d mlp_out to d ln2.out, through W_out, the activation (and
    the gate) and W_in."""
    p, L, values, act = f"layers.{i}.mlp.", f"layers.{i}.", g.values, g.config.act
    g.keep(L + "mlp_out", dmlp_out)
    dpost, g.grads[p + "W_out"], db = ops.linear_backward(
        dmlp_out, values[L + "mlp_post"], g.params[p + "W_out"], weights=g.weights)
    g.bias(p + "b_out", db)
    g.keep(L + "mlp_post", dpost)
    x = values[L + "ln2.out"]
    if g.config.mlp == "gated":
        dpre, dup = ops.gated_backward(dpost, values[L + "mlp_pre"], values[L + "mlp_up"], act)
        g.keep(L + "mlp_pre", dpre)
        g.keep(L + "mlp_up", dup)
        dx_up, g.grads[p + "W_in"], _ = ops.linear_backward(dup, x, g.params[p + "W_in"],
                                                            weights=g.weights)
        dx, g.grads[p + "W_gate"], _ = ops.linear_backward(dpre, x, g.params[p + "W_gate"],
                                                           weights=g.weights)
        dx += dx_up
    else:
        dpre = ops.ACTIVATIONS[act][1](dpost, values[L + "mlp_pre"])
        g.keep(L + "mlp_pre", dpre)
        dx, g.grads[p + "W_in"], db = ops.linear_backward(
            dpre, x, g.params[p + "W_in"], weights=g.weights)
        g.bias(p + "b_in", db)
    g.keep(L + "ln2.out", dx)
    return dx


def block(params, config: Config, i: int, h: np.ndarray, hooks: Hook | None,
          cache: KVCache | None, start: int, drop: Dropout | None, per_text: bool = False
          ) -> np.ndarray:
    """Card 7: block i as its description has it (wiring.describe): GPT-2's pre-norm
    h + attn(ln1(h)), then + mlp(ln2(.)); a parallel block (GPT-NeoX) adds both to h, each
    reading h itself.  [T, d] -> [T, d]  (`per_text`: a batch's products text by text, see
    ops.linear)"""
    L = f"layers.{i}."
    hk = hooks or _no_hooks

    def dropped(s: Step, x: np.ndarray) -> np.ndarray:
        return drop(L + s.out, x) if drop and s.dropped else x

    ops_ = {
        "norm": lambda s, x: dropped(s, norm(params, config, x, L + s.name, hk)),
        "attention": lambda s, x: dropped(s, attention(params, config, i, x, hooks, cache,
                                                       start, per_text)),
        "mlp": lambda s, x: dropped(s, feed_forward(params, config, i, x, hk, per_text)),
        "add": lambda s, *xs: hk(L + s.out, functools.reduce(operator.add, xs)),
    }
    return wiring.run(wiring.describe(config, i), ops_, hk(L + "resid_pre", h))


def block_backward(g: Gradients, i: int, dh: np.ndarray, start: str | None = None
                   ) -> np.ndarray:
    """Card 7 in reverse, wiring.run_backward over block i's steps: each residual sum sends
    its gradient both ways, into the branch (MLP, then attention, each through its norm) and
    on down the stream. From d of the block's output, or of its value `start`."""
    L = f"layers.{i}."

    def undropped(s: Step, d: np.ndarray) -> np.ndarray:
        return g.undrop(L + s.out, d) if s.dropped else d

    def add(s: Step, d: np.ndarray) -> tuple:
        g.keep(L + s.out, d)
        return (d,) * len(s.reads)

    def normed(s: Step, d: np.ndarray) -> tuple:
        d = undropped(s, d)
        g.keep(L + s.out, d)  # a norm after a branch (Gemma 3's): TracIn reads its gain's
        return (norm_backward(g, d, g.values[L + s.reads[0]], L + s.name),)

    ops_ = {
        "norm": normed,
        "attention": lambda s, d: (attention_backward(g, i, undropped(s, d)),),
        "mlp": lambda s, d: (feed_forward_backward(g, i, undropped(s, d)),),
        "add": add,
    }
    dh = wiring.run_backward(wiring.describe(g.config, i), ops_, dh, start)
    g.keep(L + "resid_pre", dh)
    return dh


def head_table(config: Config) -> str:
    """The name of the output head's rows [V, d]: W_E itself when the config says the head
    is tied to the embedding, else unembed.W_U."""
    return "embed.W_E" if config.tied else "unembed.W_U"


def unembed(params, config: Config, u: np.ndarray, hooks: Hook) -> np.ndarray:
    """Card 9: logits = u W_U, the head's rows (W_E's when tied).  [T, d] -> [T, V]

    Large logits are written into small pages all made at once (pages.fresh_pages): NumPy's
    own array would be made of 2 MB pages, whose first touch is slow when the kernel has none
    free at hand (a pass in a new process, or after other work): Gemma-3-270M's 512 x
    262,144 took 2.9 s instead of 2.0 (benchmarks/results.md, issue 48). Smaller ones (a
    training step's, whose 2 MB pages a loop finds freed by the step before) are NumPy's."""
    table = params[head_table(config)]
    shape = (*u.shape[:-1], table.shape[0])
    dtype = np.result_type(u, table)
    large = math.prod(shape) * dtype.itemsize >= LOGITS_ON_SMALL_PAGES
    out = fresh_pages(shape, dtype, whole=True) if large else None
    return hooks("logits", ops.unembed(u, table, out))


LOGITS_ON_SMALL_PAGES = 128 << 20  # bytes of logits


def unembed_backward(g: Gradients, dlogits: np.ndarray) -> np.ndarray:
    """Cards 8-9 in reverse: from d logits (the cross-entropy's, ops.cross_entropy_with_grad,
    or any other score's) through the head and the final norm to the last block."""
    g.keep("logits", dlogits)
    table = head_table(g.config)
    du, g.grads[table] = ops.unembed_backward(dlogits, g.values["ln_final.out"],
                                              g.params[table], weights=g.weights)
    g.keep("ln_final.out", du)
    last = g.values[f"layers.{g.config.n_layer - 1}.resid_post"]
    return norm_backward(g, du, last, "ln_final")


def forward(
    params: dict[str, np.ndarray],
    config: Config,
    ids: np.ndarray,
    *,
    hooks: Hook | None = None,
    cache: KVCache | None = None,
    start: int = 0,
    dropout: Dropout | None = None,
    last_only: bool = False,
    check_finite: bool = True,
) -> np.ndarray | None:
    """The logits [T, V] for ids [T] (or [B, T, V] for [B, T]), every value through `hooks`.

    With `cache`, ids are the tokens at positions start .. start+T-1 and attend to the cached
    keys and values before them. `last_only` computes the logits of the last position only
    ([1, V]). Returns None when a StopAfter hook ended the pass. An infinite or NaN value
    raises NonFiniteError naming the first one (weights too large for float32), or
    InputError naming the hook at fault (one that returned such numbers, or changed a value
    into one too large for the rest of the pass), unless `check_finite` is False (training,
    which reports a diverging loss itself).
    """
    ids = np.asarray(ids)
    t = ids.shape[-1]
    if start + t > config.n_positions:
        raise ValueError(f"{start + t} tokens is more than the model's limit of "
                         f"{config.n_positions}")
    hk = hooks or _no_hooks
    # Finite but huge weights overflow float32 somewhere inside: no warning on the way, one
    # check of the last value at the end, naming the first value that went wrong.
    with np.errstate(all="ignore"):
        try:
            hk("ids", ids)
            h = embed(params, ids, start, hk, config.embed_scale)
            if dropout is not None:
                h = dropout("embeddings", h)
            for i in range(config.n_layer):
                h = block(params, config, i, h, hooks, cache, start, dropout)
            if last_only:
                h = h[..., -1:, :]
            u = norm(params, config, h, "ln_final", hk)
            logits = unembed(params, config, u, hk)
        except Stop as e:
            last = e.args[1] if len(e.args) > 1 else None
            if check_finite and last is not None and not _finite(e.args[0], last):
                _name_first_non_finite(params, config, ids, hooks, cache, start, last_only,
                                       e.args[0])
            return None
    if check_finite and not all_finite(logits):
        _name_first_non_finite(params, config, ids, hooks, cache, start, last_only, "logits")
    if cache is not None:
        cache.length = start + t
    return logits


def run_to_final_norm(params, config: Config, ids, per_text: bool = True) -> np.ndarray:
    """ln_final.out [B, T, d] of texts of one length, ids [B, T] ([T]: a batch of one), with
    no hooks and no unembedding, for callers that unembed only what they need or run many
    texts together (ahead.py). Each text's numbers are bit for bit those its own recorded
    pass (`record`, `trace`) computes: every product is made text by text (ops.linear's
    per_text), every other step row by row, and one position is normed as a row of a batch,
    not by the one-position shortcut of generation. Without `per_text` they are those of the
    batch's recorded pass instead (one product for all rows: faster). Non-finite values are
    left to the caller (forward names the first one)."""
    ids = np.asarray(ids)
    ids = ids[None] if ids.ndim == 1 else ids
    if ids.shape[-1] > config.n_positions:
        raise ValueError(f"{ids.shape[-1]} tokens is more than the model's limit of "
                         f"{config.n_positions}")
    with np.errstate(all="ignore"):
        h = embed(params, ids, 0, _no_hooks, config.embed_scale)  # [B, T, d]
        for i in range(config.n_layer):
            h = block(params, config, i, h, None, None, 0, None, per_text=per_text)
        return norm(params, config, h, "ln_final", _no_hooks)


def logits_of(params, config: Config, u: np.ndarray) -> np.ndarray:
    """Card 9 alone: the logits of final-norm outputs u [T, d] (final_norm's), as a pass's."""
    with np.errstate(all="ignore"):
        return unembed(params, config, u, _no_hooks)


def all_finite(x: np.ndarray) -> bool:
    """np.isfinite(x).all() in one read and no array of flags: a NaN or an infinity makes
    the sum of squares (one BLAS dot product, faster than either) NaN or infinite; only a
    sum that overflowed is checked number by number."""
    flat = x.reshape(-1)
    with np.errstate(all="ignore"):
        return bool(np.isfinite(np.dot(flat, flat)) or np.isfinite(x).all())


def _finite(path: str, x) -> bool:
    """Every number of a value finite; attention scores are -inf where masked, by design."""
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.floating):
        return True
    if path.endswith("scores"):
        return not (np.isnan(x).any() or np.isposinf(x).any())
    return bool(np.isfinite(x).all())


def _overflowed(path: str) -> NonFiniteError:
    return NonFiniteError(f"the forward pass overflowed: {path} is the first value holding "
                          "infinite or NaN numbers (weights too large to compute with in "
                          "float32)")


class _Bad(Exception):
    """The rerun's first non-finite value: its path and, when a hook set made it so, who."""


def _blame(hook_set, path: str) -> str | None:
    """A hook set's own words for the change it makes at `path`: what the user asked for
    (hooks.Replace's `who`: steering, a hook of the API, a value set by hand); None for the
    changes the analyses make themselves, which are part of the computation."""
    blame = getattr(hook_set, "blame", None)
    return blame(path) if blame is not None else None


def _watched(hook_set, changed: list) -> Hook:
    """The hook set, its input and output checked: _Bad at a value that arrives non-finite
    (computed so) or leaves it non-finite (the hook set's doing); the values it changed are
    listed in `changed` as (who, path) when the user asked for them."""
    def run(path: str, x: np.ndarray) -> np.ndarray:
        if not _finite(path, x):
            raise _Bad(path, None)
        before = np.array(x, copy=True)  # the hook may change x in place
        out = hook_set(path, x)
        who = _blame(hook_set, path)
        if not _finite(path, out):
            raise _Bad(path, who)
        if who is not None and not np.array_equal(before, out):
            changed.append((who, path))
        return out
    return run


def _name_first_non_finite(params, config, ids, hooks, cache, start, last_only,
                           last: str) -> None:
    """Run the pass again, checking every value as it is made, and raise for the first bad
    one (`last`, the value found bad, if none before it is): InputError when the hooks are at
    fault (one returned infinite or NaN numbers, or a value one changed overflowed further on
    where the same pass without hooks stays finite), NonFiniteError (the weights) otherwise."""

    changed: list = []
    watched = Chain(*(_watched(h, changed) for h in sets_of(hooks))) if hooks else None

    def guard(path: str, x: np.ndarray) -> np.ndarray:  # ends the pass at the first bad value
        if not _finite(path, x):
            raise _Bad(path, None)
        return x

    try:
        forward(params, config, ids, hooks=Chain(watched, guard) if watched else guard,
                cache=cache, start=start, last_only=last_only, check_finite=False)
        path, who = last, None
    except _Bad as e:
        path, who = e.args
    if who is not None:
        raise InputError(f"the forward pass overflowed: {who} put infinite or NaN numbers "
                         f"into {path}")
    if changed and path in _finite_without_hooks(params, config, ids, cache, start, last_only):
        whos = list(dict.fromkeys(w for w, _ in changed))
        raise InputError(f"the forward pass overflowed: {path} holds infinite or NaN numbers "
                         f"because of {' and '.join(whos)} (the same pass without "
                         f"{'it' if len(whos) == 1 else 'them'} is finite): too large to "
                         "compute with in float32")
    raise _overflowed(path)


def _finite_without_hooks(params, config, ids, cache, start, last_only) -> set[str]:
    """The paths of the plain pass (no hooks) that hold finite numbers, up to its first bad
    value."""
    seen: set[str] = set()

    def note(path: str, x: np.ndarray) -> np.ndarray:
        if not _finite(path, x):
            raise _Bad(path, None)
        seen.add(path)
        return x

    try:
        forward(params, config, ids, hooks=note, cache=cache, start=start,
                last_only=last_only, check_finite=False)
    except _Bad:
        pass
    return seen


def decode_step(params, config: Config, token: int, cache: KVCache,
                hooks: Hook | None = None) -> np.ndarray:
    """One new position for generation: the logits [V] after `token`, whose keys and values
    join the cache: forward on a text of one token starting at position cache.length; with
    no hooks, the same steps by a Decoder (its numbers are forward's, bit for bit)."""
    if hooks is None:
        if cache.decoder is None or not cache.decoder.made_for(params, config):
            cache.decoder = Decoder(params, config)
        return cache.decoder.step(token, cache)
    ids = np.asarray([token])
    return forward(params, config, ids, hooks=hooks, cache=cache, start=cache.length,
                   last_only=True)[-1]


class Decoder:
    """forward(params, config, [token], cache=cache, start=cache.length, last_only=True)
    with no hooks, for generation's steps: the same ops on the same arrays in the same order,
    so the same numbers bit for bit (tests), without the per-step work of the general pass
    (each block's parameters looked up by name, the hooks' calls, the checks of what a hook
    may have changed), which is most of a step of a small model (the shipped one) and a
    tenth of a large one's. Made once per cache (decode_step); the rotary angles are rows of
    one table, made as the positions come (a row is the same in a table of any length)."""

    def __init__(self, params, config: Config) -> None:
        self.params, self.config = params, config
        self.blocks = [self._block_params(i) for i in range(config.n_layer)]
        self.head = params[head_table(config)]
        self.turns: dict = {}  # (dtype, turn) -> (cos, sin) of positions 0 .. n-1

    def made_for(self, params, config: Config) -> bool:
        return params is self.params and (config is self.config or config == self.config)

    def _turned(self, x: np.ndarray, start: int, a: wiring.Attention) -> np.ndarray:
        """ops.rotary(x, start, ...) for one position, its angles a row of one table (one per
        dtype and turn: blocks may turn differently)."""
        key = (x.dtype, a.rotary, a.rotary_base, a.rope_scaling)
        made = self.turns.get(key)
        if made is None or start >= len(made[0]):  # twice the positions asked for so far
            # (all of Llama 3.2's 131,072 at once would be 128 MB)
            n = min(self.config.n_positions, max(256, 2 * (start + 1)))
            made = self.turns[key] = ops.rotary_angles((0, n), a.rotary, a.rotary_base,
                                                       x.dtype, a.rope_scaling)
        cos, sin = (t[start:start + 1] for t in made)
        return ops.rotary_by(x, cos, sin)

    def _block_params(self, i: int) -> dict:
        p, c = self.params, self.config
        b = wiring.describe(c, i)
        get = lambda name: p.get(f"layers.{i}.{name}")  # noqa: E731
        # each step as (op, what it reads, what it makes, a norm's w and b), looked up once
        plan = tuple((s.op, s.reads[0], s.reads[1:], s.out, get(s.name + ".w"),
                      get(s.name + ".b")) for s in b.steps)
        return {name: get(name) for name in (
            "attn.W_QKV", "attn.b_QKV", "attn.q_norm.w", "attn.k_norm.w", "attn.W_O",
            "attn.b_O", "mlp.W_in", "mlp.b_in", "mlp.W_gate", "mlp.W_out", "mlp.b_out")
        } | {"i": i, "plan": plan, "attention": b.attention}

    def step(self, token: int, cache: KVCache) -> np.ndarray:
        """The logits [V] after `token` at position cache.length, its keys and values cached."""
        p, c, start = self.params, self.config, cache.length
        if start + 1 > c.n_positions:
            raise ValueError(f"{start + 1} tokens is more than the model's limit of "
                             f"{c.n_positions}")
        ids = np.asarray([token])
        with np.errstate(all="ignore"):
            h = ops.scaled_embedding(p["embed.W_E"], ids, c.embed_scale)
            if "embed.W_pos" in p:
                h = h + ops.position_embedding(p["embed.W_pos"], 1, start)
            for b in self.blocks:
                h = self._block(b, h, cache, start)
            logits = ops.unembed(self._norm(h, p["ln_final.w"], p.get("ln_final.b")),
                                 self.head)
        if not all_finite(logits):  # the general pass names the first value gone wrong
            return forward(p, c, ids, cache=cache, start=start, last_only=True)[-1]
        cache.length = start + 1
        return logits[-1]

    def _norm(self, x: np.ndarray, w, b) -> np.ndarray:
        eps = self.config.layer_norm_epsilon
        if self.config.norm == "rms":
            return ops.rms_scale(x, ops.rms_of(x, eps), w)
        if x.dtype == w.dtype == b.dtype:
            return ops.layer_norm_out(x, w, b, eps)
        return layer_norm(x, w, b, eps, "", _no_hooks)

    def _block(self, b: dict, h: np.ndarray, cache: KVCache, start: int) -> np.ndarray:
        """block(): its description's steps (wiring.describe), with this step's own ops,
        written out rather than through wiring.run: a step of a small model is mostly such
        calls."""
        values = {"resid_pre": h}
        for op, read, more, out, w, bias in b["plan"]:
            x = values[read]
            if op == "norm":
                x = self._norm(x, w, bias)
            elif op == "attention":
                x = self._attention(b, x, cache, start)
            elif op == "mlp":
                x = self._mlp(b, x)
            elif op == "add":  # in the order of its reads
                for y in more:
                    x = x + values[y]
            else:
                raise ValueError(f"the Decoder has no op {op!r}")
            values[out] = x
        return x

    def _attention(self, b: dict, x: np.ndarray, cache: KVCache, start: int) -> np.ndarray:
        """attention() and queries_keys_values() with no hooks, for one position: the steps
        of ops.attention_scores, attention_weights and attention_mix that one query takes."""
        c, i, a = self.config, b["i"], b["attention"]
        qkv = _row_times(x, b["attn.W_QKV"], b["attn.b_QKV"])
        if c.kv_heads == c.n_head:  # split_qkv's views for one position, by one reshape
            q, k, v = qkv.reshape(3, c.n_head, 1, c.d_k)
        else:
            q, k, v = ops.split_qkv(qkv, c.n_head, c.kv_heads)
        if a.qk_norm:
            eps = c.layer_norm_epsilon
            q = ops.rms_norm(q, b["attn.q_norm.w"], eps)[0]
            k = ops.rms_norm(k, b["attn.k_norm.w"], eps)[0]
        if a.rotary:
            q, k = self._turned(q, start, a), self._turned(k, start, a)
        k, v, first = cache.put(i, start, k, v)  # a sliding block's: its window alone
        end, start = start + 1 - first, start - first
        if a.groups > 1:  # each key/value head read by its group of query heads as it is,
            # not repeated (a copy of the whole cache a step): [H_kv, groups, 1, d_k] against
            # [H_kv, 1, end, d_k], each head's product the very one of repeat_kv's copy
            q = q.reshape(c.kv_heads, a.groups, 1, c.d_k)
            k, v = k[:, None], v[:, None]
        scores = q @ k.swapaxes(-1, -2)  # [H, 1, end]: one query sees every key but ...
        scores *= (np.asarray(a.scale, q.dtype) if a.scale
                   else ops._inverse_sqrt(q.shape[-1], q.dtype))
        if a.window and end > a.window:  # ... those a local block's window leaves out
            scores += ops.window_mask(1, start, a.window, np.dtype(q.dtype).type)
        e = np.exp(scores)  # attention_softmax: unshifted while every row's sum allows it
        total = ops.row_sums(e)
        e /= total
        low, high = ops.SUMS_WITHOUT_SHIFT
        # a head's sum each: compared as Python floats (a NaN fails both), a fifth of the
        # time of two reduces
        if not all(low <= s <= high for s in total.reshape(-1).tolist()):
            e = ops.softmax(scores)
        z = (e @ v).reshape(c.n_head, 1, c.d_k)  # [H, 1, d_k], merged as merge_heads does
        return _row_times(z.swapaxes(-3, -2).reshape(1, -1), b["attn.W_O"], b["attn.b_O"])

    def _mlp(self, b: dict, x: np.ndarray) -> np.ndarray:
        """feed_forward() with no hooks."""
        act = self.config.act
        if self.config.mlp == "gated":
            post = ops.gated(_row_times(x, b["mlp.W_gate"], None),
                             _row_times(x, b["mlp.W_in"], None), act)
        else:
            post = ops.ACTIVATIONS[act][0](_row_times(x, b["mlp.W_in"], b["mlp.b_in"]))
        return _row_times(post, b["mlp.W_out"], b["mlp.b_out"])


def _row_times(x: np.ndarray, w: np.ndarray, b) -> np.ndarray:
    """ops.linear of one row [1, in]: the vector times w, then the bias added as it adds it."""
    out = (x[0] @ w)[None]
    if b is None:
        return out
    if out.dtype == b.dtype or out.dtype == np.result_type(out, b):
        out += b
        return out
    return out + b


def record(params, config: Config, ids, paths=None, *, hooks: Hook | None = None,
           stop_after: str | None = None) -> tuple[np.ndarray | None, dict[str, np.ndarray]]:
    """The one way to run the model and keep its values: (logits, {path: value}) of every
    value, or only of `paths`. `hooks` run before the recording, so an intervention shows in
    the values recorded; `stop_after` ends the pass once that value exists (logits None)."""

    rec = Record() if paths is None else RecordOnly(paths)
    chain = [h for h in (hooks, rec, StopAfter(stop_after) if stop_after else None)
             if h is not None]
    logits = forward(params, config, np.asarray(ids),
                     hooks=chain[0] if len(chain) == 1 else Chain(*chain))
    return logits, rec.values


# ------------------------------------------------------------------ the model's parts, by role
# What the analyses read of the weights: each part by its role in the block, never by a
# family's tensor name, so that an analysis written once reads every family.


def token_table(params) -> np.ndarray:
    """W_E [V, d]: each token's row, as the embedding reads it."""
    return params["embed.W_E"]


def token_embeddings_of(params, config: Config, ids) -> np.ndarray:
    """The token embeddings of ids [..., T] as the pass makes them (`token_embeddings`):
    their rows of W_E, times Gemma's scale."""
    return ops.scaled_embedding(params["embed.W_E"], np.asarray(ids), config.embed_scale)


def position_table(params) -> np.ndarray:
    """W_pos [n_ctx, d], the learned position rows added to the embeddings."""
    return params["embed.W_pos"]


def unembed_rows(params, config: Config, rows) -> np.ndarray:
    """The output head's rows for these tokens, [len(rows), d] (tied: W_E's rows): the
    direction whose dot with ln_final.out is each token's logit."""
    return params[head_table(config)][rows]


def cut_head(params, config: Config, rows) -> dict[str, np.ndarray]:
    """The parameters with the output head cut to these vocabulary rows. A score such as
    logit[target] - logit[vs] reads two rows of W_U; with the head cut to them it costs
    [T, d] x [d, 2] instead of [T, d] x [d, V] in every forward and backward pass. A tied
    head is W_E itself, which then no longer serves as the embedding: callers supply the
    token embeddings through a hook (and pass ids 0, which index the cut table harmlessly)."""
    return dict(params, **{head_table(config): unembed_rows(params, config, list(rows))})


def head_out_matrix(params, config: Config, layer: int) -> np.ndarray:
    """W_O of block `layer` split by head, [H, d_k, d]: head h writes z_h W_O[h]."""
    return params[f"layers.{layer}.attn.W_O"].reshape(config.n_head, config.d_k, -1)


def out_matrix(params, layer: int) -> np.ndarray:
    """W_O of block `layer` whole, [H d_k, d]: the merged heads' outputs z (o_proj's input,
    head 0's d_k numbers first) to the attention's output."""
    return params[f"layers.{layer}.attn.W_O"]


def attn_out_bias(params, config: Config, layer: int) -> np.ndarray:
    """b_O [d], added once to the merged heads' output (zeros for a family without one)."""
    b = params.get(f"layers.{layer}.attn.b_O")
    return np.zeros(config.n_embd, params["embed.W_E"].dtype) if b is None else b


def head_qkv(params, config: Config, layer: int) -> tuple[np.ndarray, ...]:
    """Block `layer`'s W_Q [H, d, d_k], W_K and W_V [H_kv, d, d_k] and their biases b_Q
    [H, d_k], b_K and b_V [H_kv, d_k] (zeros for a family without them), views of the W_QKV
    and b_QKV the pass multiplies by at once."""
    d, dk = config.n_embd, config.d_k
    w = params[f"layers.{layer}.attn.W_QKV"]
    b = params.get(f"layers.{layer}.attn.b_QKV")
    b = np.zeros(w.shape[-1], w.dtype) if b is None else b
    heads = (config.n_head, config.kv_heads, config.kv_heads)
    edges = np.cumsum((0,) + tuple(n * dk for n in heads))
    weights = [w[:, a:e].reshape(d, n, dk).transpose(1, 0, 2)
               for a, e, n in zip(edges, edges[1:], heads, strict=False)]
    biases = [b[a:e].reshape(n, dk) for a, e, n in zip(edges, edges[1:], heads, strict=False)]
    return (*weights, *biases)


def neuron_out_rows(params, layer: int) -> np.ndarray:
    """W_out [ff, d] of block `layer`'s MLP: neuron n writes mlp_post[n] W_out[n]."""
    return params[f"layers.{layer}.mlp.W_out"]


def mlp_out_bias(params, config: Config, layer: int) -> np.ndarray:
    """b_out [d] of block `layer`'s MLP (zeros for a family without one)."""
    b = params.get(f"layers.{layer}.mlp.b_out")
    return np.zeros(config.n_embd, params["embed.W_E"].dtype) if b is None else b


def norm_weights(params, name: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(scale w, shift b) of a norm: `layers.L.ln1`, `layers.L.ln2` or `ln_final` (b None
    for an RMSNorm, which has no shift)."""
    return params[name + ".w"], params.get(name + ".b")


def _identity(path: str, x: np.ndarray) -> np.ndarray:
    return x


def read_out(params, config: Config, h: np.ndarray) -> np.ndarray:
    """The logits the model would give if the stream were h [..., d]: the final norm with
    statistics of h itself, then the head; the same steps as a traced pass's, so h =
    the last resid_post gives its logits bit for bit (the logit lens's last stage)."""
    with np.errstate(all="ignore"):
        return unembed(params, config, norm(params, config, h, "ln_final", _identity),
                       _identity)


# ------------------------------------------------------------------ the backward pass


def inner_gradients(config: Config) -> set[str]:
    """What a backward pass with `wrt_values` keeps beside the recorded values' gradients:
    each block's `layers.L.qkv`, the gradient of W_QKV's own output (before the turn and the
    q/k norms, which the recorded q and k are after), and with Qwen3's norms of q and k each
    position's and head's part of their scales' gradients, `layers.L.attn.q_norm.dw` and
    `.k_norm.dw`: the terms TracIn pairs per window (analysis.tracin)."""
    out = set()
    for i in range(config.n_layer):
        out.add(f"layers.{i}.qkv")
        if config.qk_norm:
            out |= {f"layers.{i}.attn.q_norm.dw", f"layers.{i}.attn.k_norm.dw"}
    return out


class Gradients:
    """What every backward step shares: the values the forward pass recorded, the gradients
    of the parameters as they are found, the dropout masks, and (with `wrt_values`) the
    gradient of every recorded value by its path, and the inner_gradients."""

    def __init__(self, params, config: Config, values, masks, wrt_values: bool,
                 param_grads: bool = True):
        self.params, self.config, self.values = params, config, values
        self.masks = masks or {}
        self.grads: dict[str, np.ndarray] = {}
        self.dv: dict[str, np.ndarray] = {}
        self.wrt_values = wrt_values
        # off: the weight matrices' gradients are skipped (a third of the products), for
        # callers that want the values' gradients only (analysis.tracin)
        self.weights = param_grads

    def keep(self, path: str, d: np.ndarray) -> None:
        if self.wrt_values:
            self.dv[path] = d

    def keep_heads(self, name: str, d: np.ndarray, prefix: str) -> None:
        """Each head's slice as its own value; with grouped keys and values, head h's k and v
        are its group's (the gradient of the shared value)."""
        if self.wrt_values:
            group = self.config.n_head // d.shape[-3]
            for h in range(self.config.n_head):
                self.dv[f"{prefix}heads.{h}.{name}"] = d[..., h // group, :, :]

    def bias(self, name: str, d) -> None:
        """A bias's gradient, kept when the family has that bias."""
        if name in self.params and d is not None:
            self.grads[name] = d

    def undrop(self, path: str, d: np.ndarray) -> np.ndarray:
        return d * self.masks[path] if path in self.masks else d


def backward(
    params: dict[str, np.ndarray],
    config: Config,
    values: dict[str, np.ndarray],
    dlogits: np.ndarray,
    *,
    masks: dict[str, np.ndarray] | None = None,
    wrt_values: bool = False,
    param_grads: bool = True,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Gradients of a scalar, given d scalar / d logits, for every parameter and (with
    `wrt_values`) for every recorded value, by path.

    forward in reverse, each step by its own backward beside its forward, over the values a
    Record hook kept. Hooks are taken to be the identity: on an intervened run this is the
    gradient at the changed values. With `param_grads` off only the values' gradients are
    computed (the parameters' dict comes back empty).
    """
    g = Gradients(params, config, values, masks, wrt_values, param_grads)
    dh = unembed_backward(g, dlogits)
    for i in reversed(range(config.n_layer)):
        dh = block_backward(g, i, dh)
    embed_backward(g, dh)
    if not param_grads:
        return {}, g.dv
    return {name: g.grads[name] for name in params}, g.dv


def backward_from_attention(params: dict[str, np.ndarray], config: Config,
                            values: dict[str, np.ndarray], layer: int, dweights: np.ndarray,
                            ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Gradients of a scalar of block `layer`'s attention weights (d scalar / d weights
    [H, T, T]), for every parameter (zero above what it reads) and every recorded value
    below it: backward from that block's pattern down to the embeddings."""
    g = Gradients(params, config, values, None, wrt_values=True)
    L = f"layers.{layer}."
    dx = attention_weights_backward(g, layer, dweights)
    dh = norm_backward(g, dx, values[L + "resid_pre"], L + "ln1")
    g.keep(L + "resid_pre", dh)
    for i in reversed(range(layer)):
        dh = block_backward(g, i, dh)
    embed_backward(g, dh)
    return {n: g.grads.get(n, np.zeros_like(a)) for n, a in params.items()}, g.dv


def backward_from_stream(params: dict[str, np.ndarray], config: Config,
                         values: dict[str, np.ndarray], layer: int, dh: np.ndarray,
                         ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Gradients of a scalar of the residual stream after block `layer` (d scalar /
    d layers.{layer}.resid_post [T, d]; layer -1: the embeddings), for every parameter (zero
    above it) and every recorded value below it."""
    g = Gradients(params, config, values, None, wrt_values=True)
    for i in reversed(range(layer + 1)):
        dh = block_backward(g, i, dh)
    embed_backward(g, dh)
    return {n: g.grads.get(n, np.zeros_like(a)) for n, a in params.items()}, g.dv


def backward_from_part(params: dict[str, np.ndarray], config: Config,
                       values: dict[str, np.ndarray], layer: int, part: int | str,
                       d: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Gradients of a scalar of one part block `layer` writes to the stream (d scalar /
    d part [T, d]): its MLP's output (part "mlp"; Gemma 3: after the norm that follows it),
    or head `part`'s z_h W_O[h] without the shared bias b_O (Gemma 3: divided by the rms of
    the block's whole attention output and times the next norm's scale, as the heads' parts
    of that norm's output); for every parameter (zero above it) and every recorded value
    below it."""
    g = Gradients(params, config, values, None, wrt_values=True)
    L, b = f"layers.{layer}.", wiring.describe(config, layer)
    post = {s.reads[0]: s for s in b.steps if s.op == "norm" and s.reads[0] in
            ("attn_out", "mlp_out")}
    if part == "mlp":  # back through the block's own steps from what the MLP adds
        dh = block_backward(g, layer, d, start=post["mlp_out"].out if "mlp_out" in post
                            else "mlp_out")
    else:  # head h writes z_h W_O[h]: its rows of W_O, and its z alone
        dk, p = config.d_k, f"layers.{layer}.attn.W_O"
        z = values[L + "z"]  # [H, T, d_k]
        w_o = head_out_matrix(params, config, layer)  # [H, d_k, d]
        da, dz = d, np.zeros_like(z)
        g.grads[p] = np.zeros_like(params[p])
        if "attn_out" in post:  # the part a_h / rms(attn_out) * w: through a_h and the rms
            name = L + post["attn_out"].name
            da, dwhole, g.grads[name + ".w"] = _part_of_norm_backward(
                d, z[part] @ w_o[part], values[L + "attn_out"], values[name + ".rms"],
                params[name + ".w"])
            g.keep(L + "attn_out", dwhole)  # W_O's product reads it (analysis.why_edge)
            dzw, g.grads[p], db = ops.linear_backward(dwhole, ops.merge_heads(z), params[p])
            dz += ops.split_heads(dzw, config.n_head)
            g.bias(f"layers.{layer}.attn.b_O", db)
        dz[part] += da @ w_o[part].T
        g.grads[p][part * dk:(part + 1) * dk] += z[part].T @ da
        dh = norm_backward(g, heads_backward(g, layer, dz), values[L + "resid_pre"],
                           L + b.norm_of("attention"))
    g.keep(L + "resid_pre", dh)
    for i in reversed(range(layer)):
        dh = block_backward(g, i, dh)
    embed_backward(g, dh)
    return {n: g.grads.get(n, np.zeros_like(a)) for n, a in params.items()}, g.dv


def _part_of_norm_backward(d: np.ndarray, a: np.ndarray, whole: np.ndarray, rms: np.ndarray,
                           w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """a / rms(whole) * w in reverse, a a part of `whole`, rms = sqrt(mean(whole^2) + eps):
    (d a, d whole through the rms alone, d w).  [T, d] ..., rms [T, 1]"""
    wd = d * w
    drms = -(a * wd).sum(axis=-1, keepdims=True) / (rms * rms)  # [T, 1]
    return wd / rms, drms * whole / (whole.shape[-1] * rms), (a * d / rms).sum(axis=0)


def loss_and_grads(params, config, ids, targets, *, dropout=0.0, rng=None):
    """One training step's worth of math: mean cross-entropy and its gradients."""
    rec = Record()
    drop = Dropout(dropout, rng) if dropout > 0 else None
    logits = forward(params, config, ids, hooks=rec, dropout=drop, check_finite=False)
    loss, dlogits = ops.cross_entropy_with_grad(logits, targets)
    grads, _ = backward(params, config, rec.values, dlogits,
                        masks=drop.masks if drop else None)
    return loss, grads
