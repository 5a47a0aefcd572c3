"""The operations of the forward pass, each followed by its backward twin (as in llm.c).

Every function is pure, works on any leading batch axes, and keeps the dtype of its inputs,
so the same code trains in float32 and is gradient-checked in float64. A backward function
takes the gradient of the loss with respect to the forward output (`dout`), then the values
the forward pass saw, in the same order as the forward arguments.
"""

from __future__ import annotations

import functools
import math
import threading

import numpy as np

# ---------------------------------------------------------------- embedding + position (cards 2, 3)


def embedding(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """x_i = W_E[t_i].  [vocab, d], [B, T] -> [B, T, d]"""
    return table[ids]


def embedding_backward(dout: np.ndarray, table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Scatter-add each row's gradient back to the table row it was read from."""
    dtable = np.zeros_like(table)
    np.add.at(dtable, ids.reshape(-1), dout.reshape(-1, dout.shape[-1]))
    return dtable


def scaled_embedding(table: np.ndarray, ids: np.ndarray, scale: float) -> np.ndarray:
    """x_i = W_E[t_i] * scale, multiplied in the table's precision (0: not scaled). Gemma's
    scale is sqrt(d) as its weights' dtype holds it: transformers rounds the scalar to that
    dtype first (in bfloat16, sqrt(640) = 25.298 becomes 25.25), and the converter gives it
    rounded so."""
    rows = table[ids]
    return rows * rows.dtype.type(scale) if scale else rows


def scaled_embedding_backward(dout: np.ndarray, table: np.ndarray, ids: np.ndarray,
                              scale: float) -> np.ndarray:
    return embedding_backward(dout * dout.dtype.type(scale) if scale else dout, table, ids)


def position_embedding(positions: np.ndarray, t: int, start: int = 0) -> np.ndarray:
    """Rows start .. start+t-1 of the position table.  [n_ctx, d] -> [t, d]"""
    return positions[start : start + t]


def position_embedding_backward(dout: np.ndarray, positions: np.ndarray) -> np.ndarray:
    dpositions = np.zeros_like(positions)
    t = dout.shape[-2]
    dpositions[:t] = dout.reshape(-1, t, dout.shape[-1]).sum(axis=0)
    return dpositions


# ---------------------------------------------------------------- layer norm (cards 4, 8)


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float):
    """Rescale each token's numbers to mean 0, std 1, then scale by w and shift by b.

    Returns (out, mean, std); std already includes eps, as the model divides by it. The
    steps the model runs (model.layer_norm hooks the mean and the std between them), so an
    analysis that norms a stream of its own gets the pass's numbers bit for bit.
    [..., d] -> [..., d], [..., 1], [..., 1]
    """
    mean = layer_norm_mean(x)
    centred = x - mean
    std = layer_norm_std(centred, eps)
    return layer_norm_scale(centred, std, w, b, in_place=True), mean, std


def layer_norm_mean(x: np.ndarray) -> np.ndarray:
    """Each token's mean.  [..., d] -> [..., 1]"""
    return mean_last(x)


def layer_norm_std(centred: np.ndarray, eps: float) -> np.ndarray:
    """sqrt(mean(centred^2) + eps), each token's.  [..., d] -> [..., 1]"""
    return np.sqrt(mean_last(centred * centred) + eps)


def layer_norm_scale(centred: np.ndarray, std, w, b, in_place: bool = False) -> np.ndarray:
    """centred / std * w + b; `in_place` writes into centred where the dtypes allow."""
    if in_place:
        out = centred
        out /= std
    else:
        out = centred / std
    poison_overflow(out, std)
    if out.dtype == w.dtype == b.dtype or out.dtype == np.result_type(out, w, b):
        out *= w  # in place, the same numbers with fewer arrays
        out += b
        return out
    return out * w + b


def layer_norm_out(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """layer_norm's output alone, x, w, b of one dtype: the same arithmetic in fewer arrays
    (generation's path), one position as a vector, in half the time."""
    n = x.shape[-1]
    if x.shape == (1, n):
        centred = x[0] - np.add.reduce(x[0]) / n
        square = np.dot(centred, centred)
        out = centred / np.sqrt(square / n + eps)
        if not math.isfinite(square):
            out[...] = np.nan  # poison_overflow's rule
        out *= w
        out += b
        return out[None]
    out = x - mean_last(x)
    var = mean_last(out * out)
    var += eps
    out /= np.sqrt(var, out=var)
    poison_overflow(out, var)
    out *= w
    out += b
    return out


def poison_overflow(out: np.ndarray, std) -> None:
    """A token whose sum of squares overflowed float32 has std (or rms) inf, and x / inf reads
    0: finite, and wrong (wte x 1e21 gave one token 100% at every position). Its output is
    made NaN, so the pass's one check at the end finds it and names the norm's std."""
    if isinstance(std, np.ndarray):
        flat = std.reshape(-1)
        with np.errstate(all="ignore"):
            if np.isfinite(np.dot(flat, flat)) or np.isfinite(std).all():
                return
        out[np.broadcast_to(~np.isfinite(std), out.shape)] = np.nan


def mean_last(x: np.ndarray) -> np.ndarray:
    """x.mean(axis=-1, keepdims=True): a sum (row_sums), then a division by the count in
    place, without np.mean's Python-level bookkeeping, which costs more than the arithmetic
    on one token."""
    total = row_sums(x)
    total /= x.shape[-1]
    return total


def layer_norm_backward(dout, x, w, mean, std):
    """Returns (dx, dg, db)."""
    return layer_norm_backward_parts(dout, x, w, mean, std)[:3]


def layer_norm_backward_parts(dout, x, w, mean, std):
    """layer_norm_backward that also returns the gradients of its mean and std as values of
    their own (the forward pass hooks them), through out = (x - mean) / std * w + b with
    std = sqrt(mean((x - mean)^2) + eps).  Returns (dx, dg, db, dmean, dstd); dx is the total.
    """
    # Three [.., d] arrays (xhat, a product buffer, dx) instead of a dozen: on a training batch
    # this runs nine times over 32 x 128 tokens. centred / std is xhat, so
    # dcentred = dxhat / std + dstd * xhat / d.
    n = x.shape[-1]
    lead = tuple(range(x.ndim - 1))
    wide = np.result_type(dout, x, w, mean, std)  # in place, every array needs the widest dtype
    xhat = np.subtract(x, mean, dtype=wide)
    xhat /= std
    prod = np.multiply(dout, xhat, dtype=wide)
    dg = prod.sum(axis=lead)
    db = dout.sum(axis=lead)
    dx = np.multiply(dout, w, dtype=wide)  # d xhat; dx below
    np.multiply(dx, xhat, out=prod)
    dstd = -prod.sum(axis=-1, keepdims=True) / std
    dx /= std
    np.multiply(xhat, dstd / n, out=prod)
    dx += prod  # dcentred
    dmean = -dx.sum(axis=-1, keepdims=True)
    dx += dmean / n
    return dx, dg, db, dmean, dstd


# ---------------------------------------------------------------- RMSNorm (Llama's cards 4, 8)


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float):
    """x / rms * w with rms = sqrt(mean(x^2) + eps), each token on its own: LayerNorm without
    the centring and the shift.  Returns (out, rms).  [..., d] -> [..., d], [..., 1]"""
    rms = rms_of(x, eps)
    return rms_scale(x, rms, w), rms


def rms_of(x: np.ndarray, eps: float) -> np.ndarray:
    """sqrt(mean(x^2) + eps), each token's.  [..., d] -> [..., 1]"""
    return np.sqrt(mean_last(x * x) + eps)


def rms_scale(x: np.ndarray, rms, w) -> np.ndarray:
    """x / rms * w"""
    out = x / rms
    poison_overflow(out, rms)
    if out.dtype == np.result_type(out, w):
        out *= w
        return out
    return out * w


def rms_norm_backward(dout, x, w, rms):
    """Returns (dx, dg, drms), drms the gradient of the hooked rms as a value of its own;
    dx is the total, through rms = sqrt(mean(x^2) + eps)."""
    n = x.shape[-1]
    lead = tuple(range(x.ndim - 1))
    xhat = x / rms
    dg = (dout * xhat).sum(axis=lead)
    dxhat = dout * w
    drms = -(dxhat * xhat).sum(axis=-1, keepdims=True) / rms
    dx = dxhat / rms + drms * x / (n * rms)
    return dx, dg, drms


# ---------------------------------------------------------------- linear (W_QKV, W_O, W_in, W_out)


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray, per_text: bool = False) -> np.ndarray:
    """x W + b with W stored (in, out), as GPT-2's Conv1D (b None: no bias).
    [..., in] -> [..., out]

    `per_text`: a batch [B, T, in] as B products of [T, in], each the very product of that
    text's own pass (BLAS rounds a row of a larger product differently, in the last bits)."""
    # A batch [B, T, in] as one [B*T, in] product: one BLAS call, not one per text.
    flat = x.ndim == 2 or per_text  # [T, in] (one text; one position while generating)
    if x.ndim == 2:
        out = _rows_times(x, w)
    elif per_text:  # np.matmul multiplies each [T, in] slice as one text's [T, in] is
        out = np.matmul(x, w)
    else:
        out = x.reshape(-1, x.shape[-1]) @ w
    if b is None:  # a family without this bias (Llama)
        pass
    elif out.dtype == b.dtype or out.dtype == np.result_type(out, b):
        out += b  # in place: one array, not two
    else:
        out = out + b
    return out if flat else out.reshape(*x.shape[:-1], w.shape[-1])


def _rows_times(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x [N, in] @ w; one row (generation's one position) as a vector, which BLAS multiplies
    as a matrix-vector product, faster than a matrix product with one row."""
    return (x[0] @ w)[None] if x.shape[0] == 1 else x @ w


def linear_backward(dout, x, w, *, weights: bool = True):
    """Returns (dx, dw, db); without `weights`, (dx, None, None): a third of a backward
    pass's products saved when only the values' gradients are wanted (db is computed for a
    product without a bias too: the caller keeps it only where the bias is a parameter)."""
    x2 = x.reshape(-1, x.shape[-1])
    d2 = dout.reshape(-1, dout.shape[-1])
    # dx as one [B*T, out] product too: `dout @ w.T` on [B, T, out] is one BLAS call per text
    dx = (d2 @ w.T).reshape(*dout.shape[:-1], w.shape[0])
    if not weights:
        return dx, None, None
    return dx, x2.T @ d2, d2.sum(axis=0)


# ---------------------------------------------------------------- GELU, tanh form (card 6)

_GELU_C = float(np.sqrt(2.0 / np.pi))
_GELU_CA = _GELU_C * 0.044715


def gelu(x: np.ndarray) -> np.ndarray:
    """GPT-2's `gelu_new`: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).

    The tanh's argument as x (sqrt(2/pi) + sqrt(2/pi) 0.044715 x^2), and everything in one
    array: eight passes over it where the one-line formula makes nine temporaries (the
    MLP's [T, 4d] array is the largest of a block's element-wise work).
    """
    if x.dtype.kind != "f":  # whole numbers (a hook's): computed as floats, as the formula is
        x = x.astype(np.float64)
    t = x * x
    t *= _GELU_CA
    t += _GELU_C
    t *= x
    np.tanh(t, out=t)
    t += 1.0
    t *= x
    t *= 0.5
    return t


def gelu_backward(dout: np.ndarray, x: np.ndarray) -> np.ndarray:
    """dout * gelu'(x), gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 0.044715 x^2)
    with t = tanh(sqrt(2/pi) (x + 0.044715 x^3)).

    In three arrays instead of a dozen temporaries: on a training batch each is 2M numbers.
    """
    x2 = x * x
    t = 0.044715 * x2
    t *= x
    t += x
    t *= _GELU_C
    np.tanh(t, out=t)
    slope = x2  # d tanh-argument / dx, in place of x^2
    slope *= 3 * 0.044715
    slope += 1.0
    slope *= _GELU_C
    s = t * t  # 0.5 x (1 - t^2) * slope
    np.subtract(1.0, s, out=s)
    s *= x
    s *= 0.5
    s *= slope
    t += 1.0
    t *= 0.5
    t += s
    if t.dtype != np.result_type(t, dout) or t.shape != np.broadcast_shapes(t.shape, dout.shape):
        return t * dout
    t *= dout
    return t


def gelu_exact(x: np.ndarray) -> np.ndarray:
    """GELU by erf (transformers' "gelu", GPT-NeoX's): x Phi(x) = 0.5 x (1 + erf(x / sqrt 2))."""
    x = x if x.dtype.kind == "f" else x.astype(np.float64)
    return 0.5 * x * (1.0 + erf(x * _SQRT_HALF))


def gelu_exact_backward(dout: np.ndarray, x: np.ndarray) -> np.ndarray:
    """dout (Phi(x) + x phi(x))"""
    x = x if x.dtype.kind == "f" else x.astype(np.float64)
    phi = np.exp(-0.5 * x * x) * _INV_SQRT_2PI
    return dout * (0.5 * (1.0 + erf(x * _SQRT_HALF)) + x * phi)


_SQRT_HALF = float(np.sqrt(0.5))
_INV_SQRT_2PI = float(1.0 / np.sqrt(2.0 * np.pi))
# erf(x) = 1 - (a1 t + ... + a5 t^5) exp(-x^2), t = 1 / (1 + p x) for x >= 0: Abramowitz and
# Stegun 7.1.26, absolute error below 1.5e-7 (float32's step near 1 is 6e-8); NumPy has no erf.
_ERF = (0.3275911, 0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def erf(x: np.ndarray) -> np.ndarray:
    p, a1, a2, a3, a4, a5 = _ERF
    z = np.abs(x)
    t = 1.0 / (1.0 + p * z)
    poly = t * (a1 + t * (a2 + t * (a3 + t * (a4 + t * a5))))
    return np.sign(x) * (1.0 - poly * np.exp(-z * z))


def silu(x: np.ndarray) -> np.ndarray:
    """x sigmoid(x) (Llama's MLP gate)."""
    x = x if x.dtype.kind == "f" else x.astype(np.float64)
    with np.errstate(over="ignore"):
        return x / (1.0 + np.exp(-x))


def silu_backward(dout: np.ndarray, x: np.ndarray) -> np.ndarray:
    """dout s (1 + x (1 - s)), s = sigmoid(x)"""
    x = x if x.dtype.kind == "f" else x.astype(np.float64)
    with np.errstate(over="ignore"):
        s = 1.0 / (1.0 + np.exp(-x))
    return dout * s * (1.0 + x * (1.0 - s))


ACTIVATIONS = {"gelu_new": (gelu, gelu_backward), "gelu": (gelu_exact, gelu_exact_backward),
               "silu": (silu, silu_backward)}  # config.act -> (forward, backward)


def gated(gate: np.ndarray, up: np.ndarray, act: str) -> np.ndarray:
    """act(gate) * up, the gated MLP's hidden neurons (SwiGLU with silu)."""
    return ACTIVATIONS[act][0](gate) * up


def gated_backward(dout, gate, up, act: str):
    """Returns (dgate, dup)."""
    return ACTIVATIONS[act][1](dout * up, gate), dout * ACTIVATIONS[act][0](gate)


# ---------------------------------------------------------------- rotary positions (Llama, NeoX)


@functools.lru_cache(maxsize=32)
def rotary_angles(positions: tuple[int, int], rot: int, base: float, dtype,
                  scaling: tuple = ()) -> tuple:
    """cos and sin [T, rot] of positions start .. end-1, each frequency twice (the halves
    of the rotated part turn together, as transformers' rotate_half pairs them)."""
    angles = rotary_frequencies(positions[1], rot, base, scaling)[positions[0]:]  # [T, rot / 2]
    angles = np.concatenate([angles, angles], axis=-1)
    cos, sin = np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)
    cos.flags.writeable = sin.flags.writeable = False
    return cos, sin


def rotary_frequencies(t: int, rot: int, base: float, scaling: tuple = ()) -> np.ndarray:
    """The angle position p turns pair i by: p base^(-2i / rot), radians; `scaling`: linear
    (factor,), every rate divided by factor, or Llama 3's (factor, low_freq_factor,
    high_freq_factor, original context): the slow pairs' rates divided by factor, the middle
    ones blended.  [t, rot / 2]"""
    inv = 1.0 / (base ** (np.arange(0, rot, 2, dtype=np.float64) / rot))
    if len(scaling) == 1:
        inv = inv / scaling[0]
    elif scaling:
        inv = llama3_rates(inv, *scaling)
    return np.arange(t, dtype=np.float64)[:, None] * inv


def llama3_rates(inv: np.ndarray, factor: float, low: float, high: float,
                 context: int) -> np.ndarray:
    """Llama 3's rope scaling of the turn rates: wavelengths past context / low are slowed
    by `factor`, those under context / high kept, those between blended smoothly."""
    wavelength = 2 * math.pi / inv
    slowed = np.where(wavelength > context / low, inv / factor, inv)
    smooth = (context / wavelength - low) / (high - low)
    blended = (1 - smooth) * slowed / factor + smooth * slowed
    middle = ~(wavelength < context / high) & ~(wavelength > context / low)
    return np.where(middle, blended, slowed)


def _rotate_half(x: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rotary(x: np.ndarray, start: int, rot: int, base: float, scaling: tuple = ()) -> np.ndarray:
    """x [.., T, d_k] with its first `rot` numbers turned by position start + t: each pair
    (x_i, x_{i + rot/2}) by the angle t base^(-2i / rot).  The rest pass unchanged."""
    cos, sin = rotary_angles((start, start + x.shape[-2]), rot, base, x.dtype, scaling)
    return rotary_by(x, cos, sin)


def rotary_by(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """rotary with its angles' cos and sin [T, rot] given (rows of rotary_angles' table:
    a position's row is the same in a table of any length)."""
    rot = cos.shape[-1]
    part = x[..., :rot]
    turned = part * cos + _rotate_half(part) * sin
    if rot == x.shape[-1]:
        return turned
    return np.concatenate([turned, x[..., rot:]], axis=-1)


def rotary_backward(dout: np.ndarray, start: int, rot: int, base: float,
                    scaling: tuple = ()) -> np.ndarray:
    """The rotation's transpose: each pair turned back by its angle."""
    cos, sin = rotary_angles((start, start + dout.shape[-2]), rot, base, dout.dtype, scaling)
    part = dout[..., :rot]
    back = part * cos - _rotate_half(part) * sin
    if rot == dout.shape[-1]:
        return back
    return np.concatenate([back, dout[..., rot:]], axis=-1)


# ---------------------------------------------------------------- masked attention (card 5)


def split_heads(x: np.ndarray, n_head: int) -> np.ndarray:
    """[B, T, d] -> [B, H, T, d_k]"""
    *lead, t, d = x.shape
    return x.reshape(*lead, t, n_head, d // n_head).swapaxes(-3, -2)


def split_qkv(qkv: np.ndarray, n_head: int, n_kv: int | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x W_QKV [B, T, (H + 2 H_kv) d_k] (q, then k, then v) -> q [B, H, T, d_k] and k, v
    [B, H_kv, T, d_k], views."""
    *lead, t, width = qkv.shape
    n_kv = n_head if n_kv is None else n_kv
    n = len(lead)
    dk = width // (n_head + 2 * n_kv)
    if n_kv == n_head:
        parts = qkv.reshape(*lead, t, 3, n_head, dk)  # [B, T, 3, H, d_k]
        q, k, v = parts.transpose(n + 1, *range(n), n + 2, n, n + 3)  # [3, B, H, T, d_k]
        return q, k, v
    q = qkv[..., : n_head * dk].reshape(*lead, t, n_head, dk).swapaxes(-3, -2)
    k = qkv[..., n_head * dk: (n_head + n_kv) * dk].reshape(*lead, t, n_kv, dk).swapaxes(-3, -2)
    v = qkv[..., (n_head + n_kv) * dk:].reshape(*lead, t, n_kv, dk).swapaxes(-3, -2)
    return q, k, v


def repeat_kv(x: np.ndarray, group: int) -> np.ndarray:
    """[.., H_kv, T, d_k] -> [.., H_kv * group, T, d_k]: each key/value head for each of the
    `group` query heads that share it (grouped-query attention)."""
    return x if group == 1 else np.repeat(x, group, axis=-3)


def repeat_kv_backward(dout: np.ndarray, group: int) -> np.ndarray:
    """The group's gradients summed back onto the head they share."""
    if group == 1:
        return dout
    *lead, h, t, dk = dout.shape
    return dout.reshape(*lead, h // group, group, t, dk).sum(axis=-3)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """[B, H, T, d_k] -> [B, T, d]"""
    *lead, h, t, dk = x.shape
    return x.swapaxes(-3, -2).reshape(*lead, t, h * dk)


@functools.lru_cache(maxsize=64)
def causal_mask(t: int, dtype=np.float32, start: int = 0) -> np.ndarray:
    """M: 0 where a token may look (itself and earlier), -inf where key j comes after query i.

    Queries are positions start .. start+t-1, keys 0 .. start+t-1: [t, start + t]. Cached and
    read-only, since every forward pass of the same length needs the same one.
    """
    m = np.triu(np.full((t, start + t), -np.inf, dtype=dtype), k=1 + start)
    m.flags.writeable = False
    return m


# Rows of queries per block of a causal pass: block b needs the keys of blocks 0..b only.
CAUSAL_BLOCK = 128


def causal_blocks(t: int) -> list[tuple[int, int]]:
    """(first row, end row) of each block of queries of a whole-text pass of t positions;
    the queries of a block look at keys 0 .. end-1 only. One block when t is small."""
    if t < 2 * CAUSAL_BLOCK:
        return [(0, t)]
    return [(r, min(t, r + CAUSAL_BLOCK)) for r in range(0, t, CAUSAL_BLOCK)]


def attention_scores(q: np.ndarray, k: np.ndarray, start: int = 0, scale: float = 0.0,
                     window: int = 0) -> np.ndarray:
    """Q K^T * scale + M, with M = -inf where a key comes after its query (and, with a
    `window`, where it is `window` or more positions before it).  scale 0: 1 / sqrt(d_k).
    -> [H, T, S]"""
    t = q.shape[-2]
    # a whole text, not longer than its window (which then masks nothing): block by block
    if (start == 0 and t == k.shape[-2] and (not window or t <= window)
            and len(blocks := causal_blocks(t)) > 1):
        return _causal_scores(q, k, blocks, scale)
    scores = q @ k.swapaxes(-1, -2)
    scores *= np.asarray(scale, q.dtype) if scale else _inverse_sqrt(q.shape[-1], q.dtype)
    if q.shape[-2] > 1:  # one new query may look at every key: nothing to mask
        scores += causal_mask(q.shape[-2], np.dtype(q.dtype).type, start)
    if window and k.shape[-2] > window:
        scores += window_mask(t, start, window, np.dtype(q.dtype).type)
    return scores


@functools.lru_cache(maxsize=64)
def window_mask(t: int, start: int, window: int, dtype=np.float32) -> np.ndarray:
    """-inf where key j is `window` or more positions before query start + i, else 0:
    local attention (GPT-Neo's local blocks).  [t, start + t]"""
    i = np.arange(start, start + t)[:, None]
    j = np.arange(start + t)[None, :]
    m = np.where(j <= i - window, -np.inf, 0.0).astype(dtype)
    m.flags.writeable = False
    return m


def _causal_scores(q: np.ndarray, k: np.ndarray, blocks, scale: float = 0.0) -> np.ndarray:
    """attention_scores of a whole text, block of queries by block: the products with the
    keys after a block, all masked, are skipped (a third to a half of them), and those
    scores are set to -inf directly. Each score is the same d_k-long dot product as in one
    whole product, scaled and masked the same way."""
    t = q.shape[-2]
    scores = np.empty((*np.broadcast_shapes(q.shape[:-2], k.shape[:-2]), t, t),
                      np.result_type(q, k))
    scale = np.asarray(scale, q.dtype) if scale else _inverse_sqrt(q.shape[-1], q.dtype)
    mask = causal_mask(t, scores.dtype.type)
    kt = k.swapaxes(-1, -2)
    for r0, r1 in blocks:
        part = scores[..., r0:r1, :r1]
        np.matmul(q[..., r0:r1, :], kt[..., :r1], out=part)
        part *= scale
        part += mask[r0:r1, :r1]
        scores[..., r0:r1, r1:] = -np.inf
    return scores


def attention_softmax(scores: np.ndarray, start: int = 0) -> np.ndarray:
    """softmax of attention scores [.., H, T, S] over the keys (queries at positions start ..
    start+T-1, S = start + T): exp(z) / sum exp(z), without the usual shift by each row's
    largest score when the row sums show it is not needed.

    A shift does not change a softmax; it only keeps exp inside float's range, and finding
    each row's largest score took a third of the softmax's time. Unshifted, exp(z) can
    overflow or, for a row of very negative scores, underflow; every row's sum tells: all of
    a text's sums between SUMS_WITHOUT_SHIFT's bounds means no term overflowed and each
    row's largest term is a normal float (the weights are exact to float's precision; a term
    that underflowed is off by less than 1e-45 / 1e-20 of its row's sum). Else that text
    ([H, T, S], the leading axes being texts) is taken again by `softmax` with its shift, as
    it would be alone, so that a text's numbers never depend on the batch it runs in; and so
    is a grid of another shape (a hook may have changed the scores in any way)."""
    t, s = scores.shape[-2], scores.shape[-1]
    if s != start + t or scores.dtype.kind != "f":
        return softmax(scores)
    # an overflow or an underflow is found in the sums below, and that text done again
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        e = np.exp(scores)
        total = row_sums(e)
        e /= total
    return _shift_where_needed(e, scores, total)


SUMS_WITHOUT_SHIFT = (1e-20, 1e30)  # of exp(score) over a row; float32 spans 1e-38 .. 3e38


def _shift_where_needed(e: np.ndarray, scores: np.ndarray, total: np.ndarray) -> np.ndarray:
    """e, with each text whose row sums left SUMS_WITHOUT_SHIFT (a NaN too) replaced by the
    shifted softmax of its scores."""
    ok = _sums_in_range(total)
    if ok.all():
        return e
    if not ok.ndim:
        return softmax(scores)
    for text in zip(*np.nonzero(~ok), strict=True):
        e[text] = softmax(scores[text])
    return e


def _sums_in_range(total: np.ndarray) -> np.ndarray:
    """Per text ([.., H, T, 1] sums, the leading axes texts): every row's sum within
    SUMS_WITHOUT_SHIFT (a NaN is not). Two reduces a text, no array of flags for the rows."""
    low, high = SUMS_WITHOUT_SHIFT
    lead = total.shape[:-3]
    flat = total.reshape(*lead, math.prod(total.shape[len(lead):]))  # 0 texts too
    return (np.minimum.reduce(flat, axis=-1, initial=np.inf) >= low) & \
        (np.maximum.reduce(flat, axis=-1, initial=-np.inf) <= high)


def causal_softmax(scores: np.ndarray, overwrite: bool = False) -> np.ndarray | None:
    """attention_softmax of attention_scores' own output for a whole text, whose scores past
    each block's last key are -inf: their chances are exactly 0, set without an exp. The
    rest, and every row's sum, are computed as attention_softmax computes them.

    overwrite: the weights are written over the scores (the caller keeps no other reference
    to them), the same numbers without a second [.., T, T] array: past malloc's 32 MB each is
    fresh pages from the kernel (64 MB a block at 2,000 tokens and 4 heads). Then None when
    some text needs the shifted softmax, whose scores are gone: the caller makes them again."""
    t = scores.shape[-1]
    blocks = causal_blocks(t)
    if len(blocks) == 1 or scores.shape[-2] != t:
        return attention_softmax(scores)
    e = scores if overwrite else np.empty_like(scores)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for r0, r1 in blocks:
            np.exp(scores[..., r0:r1, :r1], out=e[..., r0:r1, :r1])
            e[..., r0:r1, r1:] = 0
        # each row's sum over all its keys, zeros included, as attention_softmax sums it (a
        # sum of the block alone would pair the numbers differently); 0 / sum is 0, so only
        # blocks divide
        total = row_sums(e)
        for r0, r1 in blocks:
            e[..., r0:r1, :r1] /= total[..., r0:r1, :]
    if overwrite:
        return e if _sums_in_range(total).all() else None
    return _shift_where_needed(e, scores, total)


def causal_mix(weights: np.ndarray, v: np.ndarray) -> np.ndarray:
    """weights @ v for causal_softmax's output of a whole text: each block of queries
    against the values up to its last key only, the rest of its weights being exactly 0."""
    t = weights.shape[-1]
    blocks = causal_blocks(t)
    if len(blocks) == 1 or weights.shape[-2] != t or v.shape[-2] != t:
        return weights @ v
    z = np.empty((*np.broadcast_shapes(weights.shape[:-2], v.shape[:-2]), t, v.shape[-1]),
                 np.result_type(weights, v))
    for r0, r1 in blocks:
        np.matmul(weights[..., r0:r1, :r1], v[..., :r1, :], out=z[..., r0:r1, :])
    return z


@functools.cache
def _inverse_sqrt(n: int, dtype: np.dtype) -> np.ndarray:
    """1 / sqrt(n) in dtype (made once per size: generation asks for it at every step)."""
    return np.asarray(1.0 / np.sqrt(n), dtype=dtype)


def attention_scores_backward(dscores, q, k, scale: float = 0.0):
    """Returns (dq, dk) for scores = Q K^T * scale + M (scale 0: 1 / sqrt(d_k))."""
    # the scale applied to the [.., T, d_k] products, not to the larger [.., T, T] input
    wide = np.result_type(dscores, q, k)
    scale = np.asarray(scale or 1.0 / np.sqrt(q.shape[-1]), dtype=wide)
    dq = np.matmul(dscores, k, dtype=wide)
    dk = np.matmul(dscores.swapaxes(-1, -2), q, dtype=wide)
    dq *= scale
    dk *= scale
    return dq, dk


def softmax(z: np.ndarray, axis: int = -1) -> np.ndarray:
    # the ufuncs' reduce, not .max/.sum, whose Python wrappers cost more than the arithmetic
    # of one position while generating
    e = z - np.maximum.reduce(z, axis=axis, keepdims=True)
    np.exp(e, out=e)  # in place: one array for the whole softmax
    e /= row_sums(e) if axis in (-1, e.ndim - 1) else np.add.reduce(e, axis=axis,
                                                                      keepdims=True)
    return e


ROW_SUMS_BY_PRODUCT = 64  # rows of at least this many numbers are summed by a BLAS product


def row_sums(e: np.ndarray) -> np.ndarray:
    """Each row's sum over the last axis, [..., 1]. Long rows (a whole text's attention
    weights, a position's numbers in a layer norm) as a product with a vector of ones: BLAS
    sums 128-long rows three to four times as fast as NumPy's reduce along the last axis.
    Short ones by the reduce, whose call costs less. The choice is made on the rows' length
    alone, never on how many texts there are, and each text's [T, n] rows are one product of
    their own, so that a row's sum is the same bits whether its text runs alone or in a batch
    of texts of its length (--each-line's passes made ahead, ahead.py). BLAS may round a row
    differently among another number of rows: a text padded to a longer one is not bit for
    bit its own run."""
    if e.shape[-1] < ROW_SUMS_BY_PRODUCT or e.dtype.kind != "f":
        return np.add.reduce(e, axis=-1, keepdims=True)
    return np.matmul(e, _ones(e.shape[-1], e.dtype))[..., None]


@functools.lru_cache(maxsize=16)
def _ones(n: int, dtype: np.dtype) -> np.ndarray:
    ones = np.ones(n, dtype)
    ones.flags.writeable = False
    return ones


def softmax_backward(dout: np.ndarray, p: np.ndarray) -> np.ndarray:
    return p * (dout - (dout * p).sum(axis=-1, keepdims=True))


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int = 0, scale: float = 0.0,
              window: int = 0):
    """softmax(Q K^T * scale + M) V, queries at positions start.. against every key (scale 0:
    1 / sqrt(d_k); `window`: see attention_scores). Returns (out, scores, weights): the steps
    the model runs (model.attention hooks each)."""
    scores = attention_scores(q, k, start, scale, window)
    weights = attention_weights(scores, start)
    return attention_mix(weights, v, start), scores, weights


def attention_weights(scores: np.ndarray, start: int = 0, masked: bool = True,
                      overwrite: bool = False) -> np.ndarray | None:
    """Each query's softmax over its keys. `masked`: the scores are attention_scores' own,
    -inf past each query (a hook may have changed them: False), and a whole text's
    (start 0) are then made block by block, without the exp of the masked part, and written
    over the scores when `overwrite` (see causal_softmax: then None means make them again)."""
    if masked and start == 0:
        return causal_softmax(scores, overwrite)
    return attention_softmax(scores, start)


def attention_mix(weights: np.ndarray, v: np.ndarray, start: int = 0,
                  masked: bool = True) -> np.ndarray:
    """weights V; for attention_weights' masked output of a whole text, block by block."""
    return causal_mix(weights, v) if masked and start == 0 else weights @ v


def attention_backward_parts(dout, q, k, v, weights, scale: float = 0.0):
    """attention's backward: (dq, dk, dv), and the gradients of the weights and of the
    (masked, scaled) scores, values the forward pass hooks: (dq, dk, dv, dweights, dscores).
    Masked weights are exactly 0, so their scores get no gradient."""
    dweights = dout @ v.swapaxes(-1, -2)
    dscores = softmax_backward(dweights, weights)
    dq, dk = attention_scores_backward(dscores, q, k, scale)
    return dq, dk, weights.swapaxes(-1, -2) @ dout, dweights, dscores


# ---------------------------------------------------------------- dropout (training only)


def dropout_mask(shape, p: float, rng: np.random.Generator, dtype) -> np.ndarray:
    """Inverted dropout: keep with probability 1-p and scale by 1/(1-p)."""
    mask = (rng.random(shape, dtype=np.float32) >= p).astype(dtype)
    mask *= np.asarray(1.0 / (1.0 - p), dtype=dtype)
    return mask


# --------------------------------------------------------------- linear head + softmax (cards 9-10)


def unembed(u: np.ndarray, table: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """z = u W_E^T, the output head tied to the embedding table.  [..., d] -> [..., vocab]
    `out`: where to write the logits of several positions (C-ordered, [..., vocab])."""
    rows = u.reshape(-1, u.shape[-1])
    if rows.shape[0] == 1 and table.size >= VIEW_HEAD_FROM:
        # one position (generation) of a large table: each row of W_E times it, without the
        # transposed copy (17 ms at 4,096 x 768, a token's worth). As one dot product per row
        # (vecdot: BLAS's sdot on each contiguous row), not BLAS's matrix-vector product,
        # whose kernel for a row-major table is slow on short rows: 33 ms instead of 47 at
        # 262,144 x 640 on the loader's pages (22 against 46 on NumPy's), its sums as accurate
        return _rows_dot(table, rows[0]).reshape(*u.shape[:-1], table.shape[0])
    head = tied_head(table)
    if out is None:
        return (rows @ head).reshape(*u.shape[:-1], head.shape[-1])
    np.matmul(rows, head, out=out.reshape(rows.shape[0], head.shape[-1]))
    return out


VIEW_HEAD_FROM = 1 << 21  # numbers in W_E: a smaller table's copy costs less than it saves
_HEADS: dict[int, tuple[np.ndarray, np.ndarray]] = {}
_HEADS_LOCK = threading.Lock()  # threads.map_on_cores runs passes side by side


def _rows_dot(table: np.ndarray, x: np.ndarray) -> np.ndarray:
    """table @ x [rows], each row's dot product with x (NumPy 2's vecdot; before it, or for
    a table the caches hold, the matrix-vector product: the shipped model's 4,096 x 768,
    0.18 against 0.22 ms)."""
    vecdot = getattr(np, "vecdot", None)
    if (vecdot is None or table.dtype != x.dtype or not table.flags.c_contiguous
            or table.nbytes < HEAD_BY_ROWS_FROM):
        return table @ x
    return vecdot(table, x)


HEAD_BY_ROWS_FROM = 32 << 20  # bytes: a table read from memory, not from the caches


def tied_head(table: np.ndarray) -> np.ndarray:
    """W_E^T [d, vocab]. For a read-only table (loaded weights) a contiguous copy, made once:
    BLAS multiplies by it several times faster than by the transposed view. A writable table
    (training changes it in place) is used as the view, so it is never stale; so is a table
    of HEAD_BY_ROWS_FROM bytes or more, whose copy costs more than it saves (Gemma-3-270M's
    671 MB: 2.6 s to make, and BLAS multiplies by the view as fast, 1.88 against 1.83 s for
    512 positions, 147 against 167 ms for 2).
    """
    if table.flags.writeable or table.ndim != 2 or table.nbytes >= HEAD_BY_ROWS_FROM:
        return table.T
    with _HEADS_LOCK:
        hit = _HEADS.get(id(table))
        if hit is None or hit[0] is not table:  # the table is kept, so its id is not reused
            if len(_HEADS) >= 4:
                _HEADS.pop(next(iter(_HEADS)))
            hit = _HEADS[id(table)] = (table, np.ascontiguousarray(table.T))
        return hit[1]


def unembed_backward(dout, u, table, *, weights: bool = True):
    """Returns (du, dtable); without `weights`, (du, None)."""
    u2 = u.reshape(-1, u.shape[-1])
    d2 = dout.reshape(-1, dout.shape[-1])
    du = (d2 @ table).reshape(*dout.shape[:-1], table.shape[-1])
    return (du, d2.T @ u2) if weights else (du, None)


def log_softmax(z: np.ndarray) -> np.ndarray:
    shifted = z - z.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def cross_entropy(logits: np.ndarray, targets: np.ndarray) -> float:
    """Mean negative log-probability of the targets, in nats per token."""
    logp = log_softmax(logits)
    picked = np.take_along_axis(logp, targets[..., None], axis=-1)
    return float(-picked.mean(dtype=np.float64))


def cross_entropy_with_grad(logits: np.ndarray, targets: np.ndarray) -> tuple[float, np.ndarray]:
    """cross_entropy and its backward, d(mean loss)/d logits = (softmax - one_hot) / N,
    sharing one softmax over the vocabulary.

    The [B, T, vocab] softmax is the largest elementwise pass of a training step.
    """
    # shifted, then exp'd in place; C order, so that `flat` below is a view, not a copy
    probs = np.subtract(logits, logits.max(axis=-1, keepdims=True), order="C")
    picked = np.take_along_axis(probs, targets[..., None], axis=-1)
    np.exp(probs, out=probs)
    total = probs.sum(axis=-1, keepdims=True)
    loss = float(-(picked - np.log(total)).mean(dtype=np.float64))
    n = np.asarray(targets.size, dtype=probs.dtype)
    probs *= 1.0 / (total * n)  # softmax / N in one pass over [B, T, vocab]
    flat = probs.reshape(-1, probs.shape[-1])
    flat[np.arange(flat.shape[0]), targets.reshape(-1)] -= 1.0 / n
    return loss, probs


def probabilities(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Card 10: p_t = exp(z_t / T) / sum_s exp(z_s / T), in float64 so the chances sum to 1.
    Temperature 0 is the limit: all the chance on the highest score (ties share it). The
    trace's `probs` (T = 1) and sampling.probabilities (which checks T first) are this."""
    z = np.asarray(logits, dtype=np.float64)
    if temperature == 0:
        top = z == z.max(axis=-1, keepdims=True)
        return top / top.sum(axis=-1, keepdims=True)
    z = z / temperature
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
