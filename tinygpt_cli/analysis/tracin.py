"""Every training window's loss gradient, kept small, for TracIn over the whole text.

A window's gradient has 1.3 million numbers; the training text has about 12,500 windows and
the history 8 snapshots, so gradients are never stored whole. What is stored splits in two,
because one part of the gradient dominates the dot products TracIn takes and is sparse:

1. The embedding table's rows (tied: it is also the unembedding). For a window,

       G = (1/T) sum_t (s_t - e_{y_t}) u_t^T  +  sum_t e_{x_t} m_t^T            [V, d]

   (s_t the predicted distribution, y_t the next token, u_t = ln_final.out, x_t the input
   token, m_t the gradient at the embeddings). The query's gradient is a b^T + sum_q e_{x_q}
   m_q^T (a = softmax - onehot(target) at the text's last position, b its u). Its dot
   product with the *sparse* terms (the e_y and e_x rows) needs only u_t and m_t per
   position: these are stored, projected on their leading principal directions (K_POSITION
   numbers each), and the dot product is taken exactly in that subspace at query time. On the
   shipped model these terms carry most of the score (their spread is 10 times any other
   parameter's), and a random projection of the whole table lost them entirely (correlation
   with the exact score about 0: a query's rows are a handful of 4,096).
2. Everything else (every weight matrix and bias, the dense softmax part of the table, the
   position table, the norms), projected per window with a Kronecker pair of matrices (LoGra,
   Choe et al. 2024): for y = x W + b over the window's positions,

       P_in^T [dW; db] P_out = ([x, 1] P_in)^T (dy P_out)                    [k_in, k_out]

   so a window's projection costs two thin products of values that one batched forward and
   backward pass already has, never the gradient itself. P_in and P_out are the leading
   eigenvectors of each side's gradient energy over a sample of windows (LoGra's PCA
   initialisation); a norm's gain and bias take a dense projection.

Scores from these are an approximation that ranks; `why` re-scores its top windows exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import ops
from ..config import Config
from ..hooks import Chain, Record
from ..model import backward, forward

K_MATRIX = 8  # each side of a weight matrix's projection: k_in x k_out = 64 numbers
K_TABLE = 16  # the embedding table's dense part: 256 numbers
K_VECTOR = 8  # a LayerNorm's gain and bias together
K_POSITION = 16  # u_t and m_t at each position
PROJECTION_SEED = 0
# the sizes by name, as Projection.fit takes others (benchmarks/why_quality.py)
SIZES = {"matrix": K_MATRIX, "table": K_TABLE, "vector": K_VECTOR, "position": K_POSITION}
TABLE, POSITIONS = "embed.W_E", "embed.W_pos"  # the two tables' sites, by parameter name
FIT_WINDOWS = 64  # windows whose gradients choose the projections' directions


def linear_sites(config: Config) -> list[tuple[str, str, str]]:
    """(weight W, input value, output-gradient value) of every y = x W + b; the bias b is
    bias_of(W)."""
    out = []
    for i in range(config.n_layer):
        L = f"layers.{i}."
        out += [(L + "attn.W_QKV", L + "ln1.out", L + "qkv"),
                (L + "attn.W_O", L + "z", L + "attn_out"),
                (L + "mlp.W_in", L + "ln2.out", L + "mlp_pre"),
                (L + "mlp.W_out", L + "mlp_post", L + "mlp_out")]
    return out


def bias_of(weight: str) -> str:
    """layers.0.attn.W_QKV -> layers.0.attn.b_QKV: the bias added after that product."""
    return weight.replace(".W_", ".b_")


def norm_sites(config: Config) -> list[tuple[str, str, str]]:
    """(norm, input value, trace name) of every LayerNorm; its parameters are norm.w and
    norm.b, as its values are named."""
    out = []
    for i in range(config.n_layer):
        out += [(f"layers.{i}.ln1", f"layers.{i}.resid_pre", f"layers.{i}.ln1"),
                (f"layers.{i}.ln2", f"layers.{i}.resid_mid", f"layers.{i}.ln2")]
    last = f"layers.{config.n_layer - 1}.resid_post"
    return out + [("ln_final", last, "ln_final")]


# ------------------------------------------------------------------ values and their gradients


def window_loss_gradient_of_logits(logits: np.ndarray, y: np.ndarray) -> np.ndarray:
    """d (each window's mean cross-entropy) / d logits: (softmax - onehot) / T.  [B, T, V]"""
    d = ops.softmax(logits.astype(np.float32))
    np.put_along_axis(d, y[..., None], np.take_along_axis(d, y[..., None], axis=-1) - 1.0,
                      axis=-1)
    return d / y.shape[-1]


def values_and_gradients(params, config: Config, x: np.ndarray, dlogits_of):
    """Every recorded value and its gradient, for d loss / d logits = dlogits_of(logits);
    with the attention's inputs and output-gradients merged over heads (`qkv`, `z`)."""
    rec = Record()
    logits = forward(params, config, x, hooks=rec)
    v = rec.values
    dlogits = dlogits_of(logits)
    _, dv = backward(params, config, v, dlogits, wrt_values=True, param_grads=False)
    merged(config, v, dv)
    return v, dv, dlogits


def merged(config: Config, v: dict, dv: dict) -> None:
    """The attention's inputs and output-gradients merged over heads, in place: `z` as W_O
    reads it, `qkv` as W_QKV writes it."""
    for i in range(config.n_layer):
        L = f"layers.{i}."
        v[L + "z"] = ops.merge_heads(v[L + "z"])
        dv[L + "qkv"] = np.concatenate([ops.merge_heads(dv[L + n]) for n in "qkv"], axis=-1)


def with_ones(x: np.ndarray) -> np.ndarray:
    """[..., n] -> [..., n + 1]: the bias is a weight on a constant input."""
    return np.concatenate([x, np.ones((*x.shape[:-1], 1), x.dtype)], axis=-1)


# ------------------------------------------------------------------ the projection


def weighted_gram(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """sum over positions of |b_t|^2 a_t a_t^T: the energy of sum_t a_t b_t^T on a's side.
    [..., n], [..., m] -> [n, n] (float64)"""
    a2 = a.reshape(-1, a.shape[-1]).astype(np.float64)
    w = np.square(b.reshape(-1, b.shape[-1]).astype(np.float64)).sum(-1)
    return (a2 * w[:, None]).T @ a2


def top_eigenvectors(gram: np.ndarray, k: int) -> np.ndarray:
    """The k leading eigenvectors of a symmetric matrix, as float32 columns.  -> [n, <=k]"""
    _, vectors = np.linalg.eigh(gram)
    return np.ascontiguousarray(vectors[:, ::-1][:, :k], dtype=np.float32)


def top_eigenvectors_of_product(a: np.ndarray, w: np.ndarray, k: int, rng,
                                iterations: int = 4) -> np.ndarray:
    """The k leading eigenvectors of a^T diag(w) a by subspace iteration: for the
    vocabulary side the [V, V] matrix costs 30 times more to form than to use."""
    k = min(k, a.shape[1])

    def apply(y: np.ndarray) -> np.ndarray:
        return a.T @ (w[:, None] * (a @ y))

    q = np.linalg.qr(apply(rng.standard_normal((a.shape[1], k + 8))))[0]
    for _ in range(iterations):
        q = np.linalg.qr(apply(q))[0]
    _, vectors = np.linalg.eigh(q.T @ apply(q))
    return np.ascontiguousarray(q @ vectors[:, ::-1][:, :k], dtype=np.float32)


def softmax_part(dlogits: np.ndarray, y: np.ndarray) -> np.ndarray:
    """s_t / T from (s_t - e_{y_t}) / T: the dense part of the unembedding's gradient."""
    s = dlogits.copy()
    np.put_along_axis(s, y[..., None], np.take_along_axis(s, y[..., None], axis=-1)
                      + 1.0 / y.shape[-1], axis=-1)
    return s


@dataclass(frozen=True)
class Projection:
    """The directions, by name: `left`/`right` pairs for matrices (TABLE is the table's
    dense part), `left` alone for the norms, and `u`, `m` for the per-position values."""

    left: dict[str, np.ndarray]
    right: dict[str, np.ndarray]

    @property
    def dim(self) -> int:
        """Numbers per window."""
        return sum(a.shape[1] * self.right[n].shape[1] if n in self.right else a.shape[1]
                   for n, a in self.left.items() if n not in ("u", "m"))

    @classmethod
    def fit(cls, params, config: Config, x: np.ndarray, y: np.ndarray,
            seed: int = PROJECTION_SEED, sizes: dict | None = None) -> Projection:
        """Directions from a sample of windows' gradients at these weights: for a gradient
        sum_t l_t r_t^T, the top eigenvectors of sum_t |r_t|^2 l_t l_t^T and of
        sum_t |l_t|^2 r_t r_t^T (orthonormal: a gradient lying in them is kept exactly)."""
        rng = np.random.default_rng(seed)
        k = {**SIZES, **(sizes or {})}
        k_matrix, k_table, k_vector, k_position = (k[n] for n in SIZES)
        v, dv, dlogits = values_and_gradients(
            params, config, x, lambda z: window_loss_gradient_of_logits(z, y))
        left, right = {}, {}
        for prefix, inp, outp in linear_sites(config):
            a = with_ones(v[inp])
            left[prefix] = top_eigenvectors(weighted_gram(a, dv[outp]), k_matrix)
            right[prefix] = top_eigenvectors(weighted_gram(dv[outp], a), k_matrix)
        u, demb = v["ln_final.out"], dv["embeddings"]
        s = softmax_part(dlogits, y)
        left[TABLE] = top_eigenvectors_of_product(
            s.reshape(-1, s.shape[-1]).astype(np.float64),
            np.square(u.reshape(-1, u.shape[-1]).astype(np.float64)).sum(-1), k_table, rng)
        right[TABLE] = top_eigenvectors(weighted_gram(u, s), k_table)
        # every position carries about the same energy: random directions spread over all
        left[POSITIONS] = (rng.standard_normal((config.n_positions, k_matrix))
                       / np.sqrt(k_matrix)).astype(np.float32)
        right[POSITIONS] = top_eigenvectors(weighted_gram(demb, np.ones_like(demb[..., :1])),
                                        k_matrix)
        for prefix, inp, name in norm_sites(config):
            gb = norm_gradients(v, dv, inp, name)
            left[prefix] = top_eigenvectors(gb.T.astype(np.float64) @ gb, k_vector)
        left["u"] = top_eigenvectors(weighted_gram(u, np.ones_like(u[..., :1])), k_position)
        left["m"] = top_eigenvectors(weighted_gram(demb, np.ones_like(demb[..., :1])),
                                     k_position)
        return cls(left, right)

    def arrays(self) -> dict[str, np.ndarray]:
        return {**{f"left/{n}": a for n, a in self.left.items()},
                **{f"right/{n}": a for n, a in self.right.items()}}

    @classmethod
    def from_arrays(cls, arrays) -> Projection:
        return cls({k[5:]: np.asarray(arrays[k]) for k in arrays if k.startswith("left/")},
                   {k[6:]: np.asarray(arrays[k]) for k in arrays if k.startswith("right/")})


def norm_gradients(v, dv, inp: str, name: str) -> np.ndarray:
    """Per window, a LayerNorm's [d gain, d bias] gradient.  -> [B, 2d]"""
    xhat = (v[inp] - v[name + ".mean"]) / v[name + ".std"]
    dout = dv[name + ".out"]
    return np.concatenate([(dout * xhat).sum(axis=-2), dout.sum(axis=-2)], axis=-1)


# ------------------------------------------------------------------ windows


@dataclass
class WindowGradients:
    """A batch of windows' gradients, kept small."""

    rows: np.ndarray  # [B, dim]: every parameter but the table's sparse rows, projected
    u: np.ndarray  # [B, T, K_POSITION]: ln_final.out at each position, projected
    m: np.ndarray  # [B, T, K_POSITION]: the gradient at the embeddings, projected


def window_gradients(params, config: Config, x: np.ndarray, y: np.ndarray,
                     projection: Projection) -> WindowGradients:
    """Each window's mean-loss gradient from one batched forward and backward pass (no
    dropout).  x, y [B, T]"""
    v, dv, dlogits = values_and_gradients(
        params, config, x, lambda z: window_loss_gradient_of_logits(z, y))
    return projected(config, v, dv, dlogits, x, y, projection)


def projected(config: Config, v: dict, dv: dict, dlogits: np.ndarray, x: np.ndarray,
              y: np.ndarray, projection: Projection) -> WindowGradients:
    """The windows' gradients, projected, from their pass's values and value-gradients."""
    p = projection
    b = len(x)
    parts = []
    for prefix, inp, outp in linear_sites(config):
        a = with_ones(v[inp]) @ p.left[prefix]
        parts.append(np.einsum("btk,btl->bkl", a, dv[outp] @ p.right[prefix]).reshape(b, -1))
    u, demb = v["ln_final.out"], dv["embeddings"]
    dense = softmax_part(dlogits, y) @ p.left[TABLE]
    parts.append(np.einsum("btk,btl->bkl", dense, u @ p.right[TABLE]).reshape(b, -1))
    pos = p.left[POSITIONS][: x.shape[1]]
    parts.append(np.einsum("tk,btl->bkl", pos, demb @ p.right[POSITIONS]).reshape(b, -1))
    for prefix, inp, name in norm_sites(config):
        parts.append(norm_gradients(v, dv, inp, name) @ p.left[prefix])
    return WindowGradients(np.concatenate(parts, axis=1).astype(np.float32),
                           (u @ p.left["u"]).astype(np.float32),
                           (demb @ p.left["m"]).astype(np.float32))


# ------------------------------------------------------------------ the query


@dataclass
class TokenTable:
    """A [V, K] table, row v = weight[v] * direction + (row of `rows` for v, if v is listed):
    what a window position with token v contributes per unit of its u or m. The query's
    softmax makes every row nonzero, but only along one direction; its own tokens add a
    handful of full rows. Kept in that form, scoring a window is one product with the
    direction and a few rows, not a gather of V rows."""

    weight: np.ndarray  # [V]
    direction: np.ndarray  # [K]
    tokens: np.ndarray  # [n] distinct token ids with a row of their own
    rows: np.ndarray  # [n, K]

    def dense(self) -> np.ndarray:
        """The whole [V, K] table (for checks)."""
        table = np.outer(self.weight, self.direction)
        table[self.tokens] += self.rows
        return table


@dataclass
class Query:
    """The query's gradient in the same terms: `rows` for the projected part; for the
    table's sparse rows, a table per side (next token for u, input token for m)."""

    rows: np.ndarray  # [dim]
    by_next_token: TokenTable
    by_input_token: TokenTable


def token_table(weight: np.ndarray, direction: np.ndarray, tokens: np.ndarray,
                rows: np.ndarray) -> TokenTable:
    """Rows of repeated tokens summed, so each listed token appears once."""
    distinct, where = np.unique(tokens, return_inverse=True)
    summed = np.zeros((len(distinct), rows.shape[1]))
    np.add.at(summed, where, rows)
    return TokenTable(weight.astype(np.float32), direction.astype(np.float32), distinct,
                      summed.astype(np.float32))


def query(params, config: Config, projection: Projection, ids: list[int], target: int,
          t_window: int, hooks=None) -> Query:
    """d -log p(target | text) / d params, in the index's terms (windows of t_window), of
    the text's run through `hooks` (steering)."""
    p = projection
    x = np.asarray(ids)[None]

    def dlogits_of(z: np.ndarray) -> np.ndarray:
        d = np.zeros_like(z)
        d[0, -1] = ops.softmax(z[0, -1])  # d(-log p_y)/dz = softmax(z) - onehot(y)
        d[0, -1, target] -= 1.0
        return d

    rec = Record()
    forward(params, config, x, hooks=Chain(hooks, rec))
    v = rec.values
    grads, dv = backward(params, config, v, dlogits_of(v["logits"]), wrt_values=True)
    a = dlogits_of(v["logits"])[0, -1].astype(np.float64)  # [V]
    b = v["ln_final.out"][0, -1].astype(np.float64)  # [d]
    e = dv["embeddings"][0].astype(np.float64)  # [Tq, d]
    # The window's sparse rows: -(1/T) e_{y_t} u_t^T and e_{x_t} m_t^T, against a b^T + E.
    return Query(projected_gradient(config, grads, p),
                 token_table(-a / t_window, b @ p.left["u"], x[0], -(e @ p.left["u"]) / t_window),
                 token_table(a, b @ p.left["m"], x[0], e @ p.left["m"]))


def projected_gradient(config: Config, grads: dict[str, np.ndarray],
                       p: Projection) -> np.ndarray:
    """One full gradient (by parameter name) in the windows' projected terms.  -> [dim]"""
    parts = []
    for prefix, _, _ in linear_sites(config):
        w = np.concatenate([grads[prefix], grads[bias_of(prefix)][None]])
        parts.append((p.left[prefix].T @ w @ p.right[prefix]).ravel())
    for name in (TABLE, POSITIONS):
        parts.append((p.left[name].T @ grads[name] @ p.right[name]).ravel())
    for prefix, _, _ in norm_sites(config):
        gb = np.concatenate([grads[prefix + ".w"], grads[prefix + ".b"]])
        parts.append(gb @ p.left[prefix])
    return np.concatenate(parts).astype(np.float32)


def scores(rows: np.ndarray, u: np.ndarray, m: np.ndarray, x: np.ndarray, y: np.ndarray,
           q: Query, chunk: int = 2048) -> np.ndarray:
    """<window gradient, query gradient> for every window of one snapshot.
    rows [W, dim], u, m [W, T, K] (bfloat16 bits, or floats), x, y [W, T] -> [W]"""
    out = np.empty(len(rows), np.float64)
    for i in range(0, len(rows), chunk):
        j = slice(i, i + chunk)
        out[j] = (as_float32(rows[j]) @ q.rows) + table_scores(u[j], y[j], q.by_next_token) \
            + table_scores(m[j], x[j], q.by_input_token)
    return out


def table_scores(values: np.ndarray, tokens: np.ndarray, table: TokenTable) -> np.ndarray:
    """sum_t values[w, t] . table[tokens[w, t]] for each window w.
    values [W, T, K] (bfloat16 bits, or floats), tokens [W, T] -> [W]"""
    w, t, k = values.shape
    flat = as_float32(values).reshape(w * t, k)
    along = (flat @ table.direction).reshape(w, t)
    out = (along * table.weight[tokens]).sum(axis=1, dtype=np.float64)
    listed = np.zeros(len(table.weight), bool)
    listed[table.tokens] = True
    hit = np.flatnonzero(listed[tokens])  # the few positions with a row of their own
    if len(hit):
        rows = table.rows[np.searchsorted(table.tokens, tokens.ravel()[hit])]
        own = np.einsum("pk,pk->p", flat[hit], rows)
        out += np.bincount(hit // t, weights=own, minlength=w)
    return out


def to_bfloat16(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 (float32's top 16 bits, rounded to nearest even) as uint16.

    Half the bytes of float32 with its range, so gradients of any size keep about 3
    significant digits (a relative error of at most 2**-8 per number); and turning it back
    is a shift, several times faster in NumPy than converting float16, which is what a query
    spends its time on (the index is read whole for every query)."""
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32)
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> 16) & 1))) >> 16
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)  # rounding would carry it
    return np.where(nan, (bits >> 16) | np.uint32(0x40), rounded).astype(np.uint16)  # into inf


def from_bfloat16(b: np.ndarray) -> np.ndarray:
    """uint16 bfloat16 bits -> float32 (exact)."""
    out = np.empty(b.shape, np.uint32)
    np.left_shift(b, 16, out=out, dtype=np.uint32)
    return out.view(np.float32)


def as_float32(a: np.ndarray) -> np.ndarray:
    """The index's arrays as float32: uint16 ones are bfloat16 bits (to_bfloat16's)."""
    return from_bfloat16(a) if a.dtype == np.uint16 else np.asarray(a, np.float32)
