"""The GPT-2 forward pass as small named functions, every value passing through hooks,
and its backward pass, which returns gradients for the parameters and, on request, for every
recorded value under the same path.

Parameters are a flat dict named as in the Hugging Face GPT-2 file without the
`transformer.` prefix (`h.0.attn.c_attn.weight`, `ln_f.bias`, `wte.weight`, ...). `ids` is
[T] for one text or [B, T] for a batch; every value then has that leading shape.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from . import ops
from .config import Config
from .errors import NonFiniteError
from .hooks import Hook, Record, Stop  # noqa: F401  (Record for callers)
from .schema import param_shapes

__all__ = ["Dropout", "KVCache", "backward", "decode_step", "forward", "init_params",
           "loss_and_grads",
           "param_shapes", "trace"]


def init_params(
    config: Config, rng: np.random.Generator, dtype=np.float32
) -> dict[str, np.ndarray]:
    """GPT-2's initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2 L)."""
    params = {}
    resid_std = 0.02 / np.sqrt(2 * config.n_layer)
    for name, shape in param_shapes(config).items():
        if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            value = np.ones(shape)
        elif name.endswith(".bias"):
            value = np.zeros(shape)
        elif name.endswith("c_proj.weight"):
            value = rng.normal(0.0, resid_std, shape)
        elif name == "wpe.weight":
            value = rng.normal(0.0, 0.01, shape)
        else:
            value = rng.normal(0.0, 0.02, shape)
        params[name] = value.astype(dtype)
    return params


def _no_hooks(path: str, x: np.ndarray) -> np.ndarray:
    return x


@functools.cache
def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed memory for reuse instead of handing it back to the
    system at once. A traced pass keeps every value (8 MB at T = 128), so with the defaults
    each pass got fresh pages from the kernel, and zeroing them took as long as half the
    arithmetic. The peak memory is unchanged; it is only reused. No-op elsewhere."""
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, 32 << 20) and mallopt(m_trim_threshold, 64 << 20))


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
    """Each block's keys and values for positions 0 .. length-1, in preallocated buffers.

    k[i], v[i]: [*batch, H, n_ctx, d_k]. forward(..., cache=c, start=c.length) writes the new
    positions' keys and values and attends over everything cached so far.
    """

    k: list[np.ndarray]
    v: list[np.ndarray]
    length: int = 0

    @classmethod
    def empty(cls, config: Config, batch: tuple[int, ...] = (), dtype=np.float32) -> KVCache:
        shape = (*batch, config.n_head, config.n_positions, config.d_k)
        return cls([np.zeros(shape, dtype) for _ in range(config.n_layer)],
                   [np.zeros(shape, dtype) for _ in range(config.n_layer)])


# ------------------------------------------------------------------ the forward pass, by card


def embed(params, ids: np.ndarray, start: int, hooks: Hook) -> np.ndarray:
    """Cards 1-3: ids -> their rows of W_E, plus the rows of W_P for their positions."""
    tok = hooks("token_embeddings", ops.embedding(params["wte.weight"], ids))  # [T, d]
    pos = hooks("position_embeddings",
                ops.position_embedding(params["wpe.weight"], ids.shape[-1], start))  # [T, d]
    return hooks("embeddings", tok + pos)


def _mean_last(x: np.ndarray) -> np.ndarray:
    """x.mean(axis=-1, keepdims=True), as NumPy computes it (a sum, then a division by the
    count as an intp, in place), without np.mean's Python-level bookkeeping, which costs more
    than the arithmetic on one token."""
    total = np.add.reduce(x, axis=-1, keepdims=True)
    return np.true_divide(total, np.intp(x.shape[-1]), out=total, casting="unsafe")


def layer_norm(x: np.ndarray, g, b, eps: float, name: str, hooks: Hook) -> np.ndarray:
    """Card 4 (and 8): (x - mean) / std * g + b, each token on its own; mean and std hooked."""
    mean = hooks(name + ".mean", _mean_last(x))  # [T, 1]
    centred = x - mean
    computed = np.sqrt(_mean_last(centred * centred) + eps)
    std = hooks(name + ".std", computed)
    if (isinstance(std, np.ndarray) and std.shape == computed.shape
            and std.dtype == centred.dtype):  # centred is ours alone: reuse it
        out = centred
        out /= std
    else:
        out = centred / std
    if out.dtype == np.result_type(out, g, b):  # in place, the same numbers with fewer arrays
        out *= g
        out += b
    else:
        out = out * g + b
    return hooks(name + ".out", out)  # [T, d]


def _heads(name: str, x: np.ndarray, prefix: str, hooks: Hook, n_head: int) -> None:
    """Pass each head's slice of x [.., H, ...] through the hooks as its own value; a hook
    that returns a new array for a head has it written into that head's slice."""
    for h in range(n_head):
        part = x[..., h, :, :]
        out = hooks(f"{prefix}heads.{h}.{name}", part)
        if out is not part:
            part[...] = out


def attention(params, config: Config, i: int, x: np.ndarray, hooks: Hook | None,
              cache: KVCache | None, start: int) -> np.ndarray:
    """Card 5: masked multi-head attention of block i.  [T, d] -> [T, d]"""
    p, L = f"h.{i}.attn.", f"layers.{i}."
    hk = hooks or _no_hooks
    qkv = ops.linear(x, params[p + "c_attn.weight"], params[p + "c_attn.bias"])  # [T, 3d]
    d = qkv.shape[-1] // 3
    q, k, v = (ops.split_heads(qkv[..., j * d:(j + 1) * d], config.n_head) for j in range(3))
    q, k, v = hk(L + "q", q), hk(L + "k", k), hk(L + "v", v)  # [H, T, d_k] each
    if hooks is not None:
        for name, a in (("q", q), ("k", k), ("v", v)):
            _heads(name, a, L, hooks, config.n_head)
    if cache is not None:
        end = start + x.shape[-2]
        cache.k[i][..., start:end, :] = k
        cache.v[i][..., start:end, :] = v
        k, v = cache.k[i][..., :end, :], cache.v[i][..., :end, :]
    scores = hk(L + "scores", ops.attention_scores(q, k, start))  # [H, T, S]
    if hooks is not None:
        _heads("scores", scores, L, hooks, config.n_head)
    weights = hk(L + "weights", ops.softmax(scores))  # [H, T, S]
    if hooks is not None:
        _heads("weights", weights, L, hooks, config.n_head)
    z = hk(L + "z", weights @ v)  # [H, T, d_k]
    if hooks is not None:
        _heads("out", z, L, hooks, config.n_head)
    out = ops.linear(ops.merge_heads(z), params[p + "c_proj.weight"], params[p + "c_proj.bias"])
    return hk(L + "attn_out", out)  # [T, d]


def feed_forward(params, i: int, x: np.ndarray, hooks: Hook) -> np.ndarray:
    """Card 6: GELU(x W_1 + b_1) W_2 + b_2.  [T, d] -> [T, ff] -> [T, d]"""
    p, L = f"h.{i}.mlp.", f"layers.{i}."
    pre = hooks(L + "mlp_pre", ops.linear(x, params[p + "c_fc.weight"], params[p + "c_fc.bias"]))
    post = hooks(L + "mlp_post", ops.gelu(pre))
    return hooks(L + "mlp_out",
                 ops.linear(post, params[p + "c_proj.weight"], params[p + "c_proj.bias"]))


def block(params, config: Config, i: int, h: np.ndarray, hooks: Hook | None,
          cache: KVCache | None, start: int, drop: Dropout | None) -> np.ndarray:
    """Card 7: one pre-norm block: h + attn(ln1(h)), then + mlp(ln2(.)).  [T, d] -> [T, d]"""
    p, L = f"h.{i}.", f"layers.{i}."
    hk = hooks or _no_hooks
    eps = config.layer_norm_epsilon
    h = hk(L + "resid_pre", h)
    x = layer_norm(h, params[p + "ln_1.weight"], params[p + "ln_1.bias"], eps, L + "ln1", hk)
    a = attention(params, config, i, x, hooks, cache, start)
    h = hk(L + "resid_mid", h + (drop(L + "attn_out", a) if drop else a))
    x = layer_norm(h, params[p + "ln_2.weight"], params[p + "ln_2.bias"], eps, L + "ln2", hk)
    m = feed_forward(params, i, x, hk)
    return hk(L + "resid_post", h + (drop(L + "mlp_out", m) if drop else m))


def unembed(params, u: np.ndarray, hooks: Hook) -> np.ndarray:
    """Card 9: logits = u W_E^T, the head tied to the embedding table.  [T, d] -> [T, V]"""
    return hooks("logits", ops.unembed(u, params["wte.weight"]))


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
    (weights too large for float32) raises NonFiniteError naming the first one, unless
    `check_finite` is False (training, which reports a diverging loss itself).
    """
    keep_freed_memory()
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
            h = embed(params, ids, start, hk)
            if dropout is not None:
                h = dropout("embeddings", h)
            for i in range(config.n_layer):
                h = block(params, config, i, h, hooks, cache, start, dropout)
            if last_only:
                h = h[..., -1:, :]
            u = layer_norm(h, params["ln_f.weight"], params["ln_f.bias"],
                           config.layer_norm_epsilon, "ln_final", hk)
            logits = unembed(params, u, hk)
        except Stop as e:
            last = e.args[1] if len(e.args) > 1 else None
            if check_finite and last is not None and not _finite(e.args[0], last):
                _name_first_non_finite(params, config, ids, hooks, cache, start, last_only,
                                       e.args[0])
            return None
    if check_finite and not np.isfinite(logits).all():
        _name_first_non_finite(params, config, ids, hooks, cache, start, last_only, "logits")
    if cache is not None:
        cache.length = start + t
    return logits


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


def _first_non_finite(path: str, x: np.ndarray) -> np.ndarray:
    """A hook that ends the pass at the first value holding an infinite or NaN number."""
    if not _finite(path, x):
        raise _overflowed(path)
    return x


def _name_first_non_finite(params, config, ids, hooks, cache, start, last_only,
                           last: str) -> None:
    """Run the pass again, checking every value as it is made, and raise NonFiniteError for
    the first bad one (`last`, the value found bad, if none before it is)."""
    from .hooks import Chain

    guard = _first_non_finite
    forward(params, config, ids, hooks=Chain(hooks, guard) if hooks else guard, cache=cache,
            start=start, last_only=last_only, check_finite=False)
    raise _overflowed(last)


def decode_step(params, config: Config, token: int, cache: KVCache) -> np.ndarray:
    """forward(params, config, [token], cache=cache, start=cache.length, last_only=True)[-1]
    for generation: one new position, no hooks, nothing recorded.  -> logits [V]

    The same cards as `forward`, written for a single vector: at one position every NumPy
    call costs more in overhead than in arithmetic, so this does each card in as few calls
    as it can (no reshapes, no hook calls, the attention of all heads in one product). Its
    logits equal forward's to float32 rounding (tests/test_generate.py).
    """
    pos = cache.length
    if pos >= config.n_positions:
        raise ValueError(f"{pos + 1} tokens is more than the model's limit of "
                         f"{config.n_positions}")
    eps, n_head = config.layer_norm_epsilon, config.n_head
    d = config.n_embd
    dk = d // n_head
    scale = np.asarray(1.0 / np.sqrt(dk), dtype=params["wte.weight"].dtype)
    h = params["wte.weight"][token] + params["wpe.weight"][pos]  # cards 2-3  [d]
    for i in range(config.n_layer):
        w = _block_weights(params, i)
        x = _norm_vector(h, w[0], w[1], eps)  # card 4
        qkv = x @ w[2]
        qkv += w[3]  # [3d]: q, k, v of every head
        k_cache, v_cache = cache.k[i], cache.v[i]  # [H, n_ctx, d_k]
        k_cache[:, pos, :] = qkv[d:2 * d].reshape(n_head, dk)
        v_cache[:, pos, :] = qkv[2 * d:].reshape(n_head, dk)
        q = qkv[:d].reshape(n_head, 1, dk)
        scores = q @ k_cache[:, :pos + 1, :].swapaxes(-1, -2)  # card 5  [H, 1, S]
        scores *= scale  # nothing to mask: the new position may look at every key
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        z = scores @ v_cache[:, :pos + 1, :]  # [H, 1, d_k]
        a = z.reshape(d) @ w[4]
        a += w[5]
        h = h + a
        x = _norm_vector(h, w[6], w[7], eps)  # card 6
        m = ops.gelu(x @ w[8] + w[9]) @ w[10]
        m += w[11]
        h += m  # card 7
    u = _norm_vector(h, params["ln_f.weight"], params["ln_f.bias"], eps)  # card 8
    cache.length = pos + 1
    return u @ ops.tied_head(params["wte.weight"])  # card 9


def _norm_vector(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """layer_norm of one vector [d], in four NumPy calls."""
    centred = x - np.add.reduce(x) / x.shape[0]
    std = np.sqrt(np.dot(centred, centred) / x.shape[0] + eps)
    out = centred / std
    out *= g
    out += b
    return out


def _block_weights(params, i: int) -> tuple[np.ndarray, ...]:
    """Block i's tensors in the order decode_step uses them (dict lookups by built names
    cost more than the arithmetic of one position)."""
    p = f"h.{i}."
    return tuple(params[p + n] for n in (
        "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
        "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
        "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"))


def trace(params, config: Config, ids, *, hooks: Hook | None = None, tokens=None):
    """Run the model and record every value: the Trace of one forward pass.

    `hooks` run before the recording, so an intervention shows in the values recorded.
    """
    from .hooks import Chain
    from .trace import Trace

    rec = Record()
    forward(params, config, ids, hooks=Chain(hooks, rec) if hooks else rec)
    return Trace(rec.values, config, tokens=tokens)


# ------------------------------------------------------------------ the backward pass


def backward(
    params: dict[str, np.ndarray],
    config: Config,
    values: dict[str, np.ndarray],
    dlogits: np.ndarray,
    *,
    masks: dict[str, np.ndarray] | None = None,
    wrt_values: bool = False,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Gradients of a scalar, given d scalar / d logits, for every parameter and (with
    `wrt_values`) for every recorded value, by path.

    Walks the forward pass in reverse over the values a Record hook kept. Hooks are taken to
    be the identity: on an intervened run this is the gradient at the changed values.
    """
    masks = masks or {}
    grads: dict[str, np.ndarray] = {}
    dv: dict[str, np.ndarray] = {}
    keep = dv.__setitem__ if wrt_values else (lambda k, x: None)

    def undrop(path: str, d: np.ndarray) -> np.ndarray:
        return d * masks[path] if path in masks else d

    def norm_backward(d, x, g, name):
        dx, dg, db, dmean, dstd = ops.layer_norm_backward_parts(
            d, x, g, values[name + ".mean"], values[name + ".std"])
        keep(name + ".mean", dmean)
        keep(name + ".std", dstd)
        return dx, dg, db

    def heads(name, d, prefix):
        if wrt_values:
            for h in range(config.n_head):
                dv[f"{prefix}heads.{h}.{name}"] = d[..., h, :, :]

    keep("logits", dlogits)
    last = f"layers.{config.n_layer - 1}.resid_post"
    du, grads["wte.weight"] = ops.unembed_backward(dlogits, values["ln_final.out"],
                                                   params["wte.weight"])
    keep("ln_final.out", du)
    dh, grads["ln_f.weight"], grads["ln_f.bias"] = norm_backward(
        du, values[last], params["ln_f.weight"], "ln_final")
    for i in reversed(range(config.n_layer)):
        p, L = f"h.{i}.", f"layers.{i}."
        keep(L + "resid_post", dh)
        # resid_post = resid_mid + mlp_out: the gradient flows both ways
        dmlp_out = undrop(L + "mlp_out", dh)
        keep(L + "mlp_out", dmlp_out)
        dpost, grads[p + "mlp.c_proj.weight"], grads[p + "mlp.c_proj.bias"] = ops.linear_backward(
            dmlp_out, values[L + "mlp_post"], params[p + "mlp.c_proj.weight"])
        keep(L + "mlp_post", dpost)
        dpre = ops.gelu_backward(dpost, values[L + "mlp_pre"])
        keep(L + "mlp_pre", dpre)
        dx, grads[p + "mlp.c_fc.weight"], grads[p + "mlp.c_fc.bias"] = ops.linear_backward(
            dpre, values[L + "ln2.out"], params[p + "mlp.c_fc.weight"])
        keep(L + "ln2.out", dx)
        dx, grads[p + "ln_2.weight"], grads[p + "ln_2.bias"] = norm_backward(
            dx, values[L + "resid_mid"], params[p + "ln_2.weight"], L + "ln2")
        dh = dh + dx
        keep(L + "resid_mid", dh)
        # resid_mid = resid_pre + attn_out
        dattn = undrop(L + "attn_out", dh)
        keep(L + "attn_out", dattn)
        dz, grads[p + "attn.c_proj.weight"], grads[p + "attn.c_proj.bias"] = ops.linear_backward(
            dattn, ops.merge_heads(values[L + "z"]), params[p + "attn.c_proj.weight"])
        dz = ops.split_heads(dz, config.n_head)
        keep(L + "z", dz)
        heads("out", dz, L)
        dweights = dz @ values[L + "v"].swapaxes(-1, -2)
        keep(L + "weights", dweights)
        heads("weights", dweights, L)
        dscores = ops.softmax_backward(dweights, values[L + "weights"])
        keep(L + "scores", dscores)
        heads("scores", dscores, L)
        dq, dk = ops.attention_scores_backward(dscores, values[L + "q"], values[L + "k"])
        dvv = values[L + "weights"].swapaxes(-1, -2) @ dz
        for name, d in (("q", dq), ("k", dk), ("v", dvv)):
            keep(L + name, d)
            heads(name, d, L)
        dqkv = np.concatenate(
            [ops.merge_heads(dq), ops.merge_heads(dk), ops.merge_heads(dvv)], axis=-1)
        dx, grads[p + "attn.c_attn.weight"], grads[p + "attn.c_attn.bias"] = ops.linear_backward(
            dqkv, values[L + "ln1.out"], params[p + "attn.c_attn.weight"])
        keep(L + "ln1.out", dx)
        dx, grads[p + "ln_1.weight"], grads[p + "ln_1.bias"] = norm_backward(
            dx, values[L + "resid_pre"], params[p + "ln_1.weight"], L + "ln1")
        dh = dh + dx
        keep(L + "resid_pre", dh)
    demb = undrop("embeddings", dh)
    keep("embeddings", demb)
    keep("token_embeddings", demb)
    keep("position_embeddings", demb.reshape(-1, *demb.shape[-2:]).sum(axis=0)
         if demb.ndim == 3 else demb)
    grads["wpe.weight"] = ops.position_embedding_backward(demb, params["wpe.weight"])
    grads["wte.weight"] += ops.embedding_backward(demb, params["wte.weight"], values["ids"])
    return {name: grads[name] for name in params}, dv


def loss_and_grads(params, config, ids, targets, *, dropout=0.0, rng=None):
    """One training step's worth of math: mean cross-entropy and its gradients."""
    rec = Record()
    drop = Dropout(dropout, rng) if dropout > 0 else None
    logits = forward(params, config, ids, hooks=rec, dropout=drop, check_finite=False)
    loss, dlogits = ops.cross_entropy_with_grad(logits, targets)
    grads, _ = backward(params, config, rec.values, dlogits,
                        masks=drop.masks if drop else None)
    return loss, grads
