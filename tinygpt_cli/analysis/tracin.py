"""Every training window's loss gradient, kept small, for TracIn over the whole text.

A window's gradient has 1.3 million numbers; the training text has about 12,500 windows and
the history 7 snapshots, so gradients are never stored whole. What is stored follows the
parts exact TracIn splits into (analysis.exact_tracin), each kept in the form that ranks it
best for its size (benchmarks/why_anatomy.py measured each part's share and how well each
form ranks it; benchmarks/why_quality.py chose the sizes):

1. Each weight matrix's gradient G = sum_t [x_t, 1] dy_t^T (bias included) as its best
   rank-one part u v^T: u its top left singular vector, found by power steps in factor form
   (G G^T u = A^T (D (D^T (A u))) with A = [x, 1] and D = dy per position, never G itself),
   and v = G^T u. Against a query's G_q = A_q^T D_q the score u^T G_q v is read in the same
   factor form: sum over the query's positions of (A_q u)_t' (D_q v)_t'. A window's gradient
   of one matrix is dominated by a few directions (a few positions carry most of the loss),
   so one pair keeps most of each dot product; two fitted projections per side (LoGra's
   Kronecker pair, the index's form before) kept much less of the window-specific part.
2. The tied table's head part, sum_t (s_t - e_{y_t}) u_t^T / T (s_t the predicted
   distribution, y_t the next token, u_t = ln_final.out): from each position's TOP chances
   (their token ids and values) and its one next token, with u_t on K_U fitted directions.
   The query's table gradient is a b^T (+ the rows its text read), so each pair (token j,
   weight w) scores w (a_j (b . u_t) + row_j . u_t): the softmax mass is in its top few
   tokens, and this part carries most of the score's variance.
3. The table rows the window read, sum_t e_{x_t} m_t^T (m_t the gradient at the
   embeddings): m_t on K_M fitted directions, scored the same way.
4. The position table and the norms (a small share of any score): projected as before, the
   position table by a Kronecker pair (left random: every position alike) and each norm's
   gain and bias by fitted directions.

Scores from these are an approximation that ranks; `why` re-scores its top windows exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..transformer import ops
from ..transformer.config import Config
from ..transformer.hooks import Record
from ..transformer.model import backward, forward
from ..transformer.wiring import FAMILIES, describe, handles

# The blocks this analysis implements (wiring.require refuses others by name): its rank-one terms
# and norm sites are the families' steps'.
HANDLES = handles(step=FAMILIES["step"] + ("norm after attention", "norm after the MLP"))

K_U = 16  # u_t (ln_final.out) at each position, for the head's part
K_M = 4  # m_t (the embeddings' gradient) at each position, for the rows read
K_POSITIONS = 8  # each side of the position table's projection: 64 numbers
K_VECTOR = 8  # a LayerNorm's gain and bias together
TOP = 4  # each position's likeliest next tokens kept, with their chances
POWER_STEPS = 4  # for each matrix's top singular vector
PROJECTION_SEED = 0
# the sizes by name, as Projection.fit takes others (benchmarks/why_quality.py)
SIZES = {"u": K_U, "m": K_M, "positions": K_POSITIONS, "vector": K_VECTOR, "top": TOP,
         "steps": POWER_STEPS}
POSITIONS = "embed.W_pos"  # the position table's site, by parameter name
FIT_WINDOWS = 64  # windows whose gradients choose the projections' directions


def linear_sites(config: Config) -> list[tuple[str, str, str]]:
    """(weight W, input value, output-gradient value) of every y = x W (+ b, when
    has_bias): the attention's fused W_QKV (its output gradient taken before any turn or
    q/k norm), W_O, and the MLP's products (a gated MLP's W_gate and W_in both read ln2.out).
    The untied head is not among them: it is the head's part, as the tied table's."""
    out = []
    for i in range(config.n_layer):
        L = f"layers.{i}."
        mlp = ([(L + "mlp.W_gate", L + "ln2.out", L + "mlp_pre"),
                (L + "mlp.W_in", L + "ln2.out", L + "mlp_up")] if config.mlp == "gated"
               else [(L + "mlp.W_in", L + "ln2.out", L + "mlp_pre")])
        out += [(L + "attn.W_QKV", L + "ln1.out", L + "qkv"),
                (L + "attn.W_O", L + "z", L + "attn_out"),
                *mlp,
                (L + "mlp.W_out", L + "mlp_post", L + "mlp_out")]
    return out


def bias_of(weight: str) -> str:
    """layers.0.attn.W_QKV -> layers.0.attn.b_QKV: the bias added after that product."""
    return weight.replace(".W_", ".b_")


def has_bias(config: Config, weight: str) -> bool:
    """Whether this family adds a bias after that product (GPT-Neo's q, k, v have none,
    Llama's products none at all)."""
    if ".attn.W_QKV" in weight:
        return config.qkv_bias
    if ".attn.W_O" in weight:
        return config.out_bias
    return config.mlp_bias


def norm_sites(config: Config) -> list[tuple[str, str | None, str]]:
    """(norm, input value, trace name) of every norm with parameters; its parameters are
    norm_params(config, norm). Each block's norm steps as its description has them, with the
    value each reads (a parallel block's ln2 reads resid_pre); Qwen3's per-head q/k norms have
    input None (their gain's terms are a value the backward pass keeps)."""
    out = []
    for i in range(config.n_layer):
        L, b = f"layers.{i}.", describe(config, i)
        out += [(L + s.name, L + s.reads[0], L + s.name) for s in b.steps if s.op == "norm"]
        if b.attention.qk_norm:
            out += [(L + "attn.q_norm", None, L + "attn.q_norm"),
                    (L + "attn.k_norm", None, L + "attn.k_norm")]
    last = f"layers.{config.n_layer - 1}.resid_post"
    return out + [("ln_final", last, "ln_final")]


def norm_params(config: Config, norm: str) -> list[str]:
    """A norm's parameters, gain first: a LayerNorm's gain and bias, an RMSNorm's gain."""
    if config.norm == "layer" and not norm.endswith(("q_norm", "k_norm")):
        return [norm + ".w", norm + ".b"]
    return [norm + ".w"]


# ------------------------------------------------------------------ values and their gradients


def window_loss_gradient_of_logits(logits: np.ndarray, y: np.ndarray) -> np.ndarray:
    """d (each window's mean cross-entropy) / d logits: (softmax - onehot) / T.  [B, T, V]"""
    d = ops.softmax(logits.astype(np.float32))
    np.put_along_axis(d, y[..., None], np.take_along_axis(d, y[..., None], axis=-1) - 1.0,
                      axis=-1)
    return d / y.shape[-1]


def values_and_gradients(params, config: Config, x: np.ndarray, dlogits_of):
    """Every recorded value and its gradient, for d loss / d logits = dlogits_of(logits);
    with the heads' outputs merged (`z`)."""
    rec = Record()
    logits = forward(params, config, x, hooks=rec)
    v = rec.values
    dlogits = dlogits_of(logits)
    _, dv = backward(params, config, v, dlogits, wrt_values=True, param_grads=False)
    merged(config, v)
    return v, dv, dlogits


def merged(config: Config, v: dict) -> None:
    """The heads' outputs merged, in place: `z` as W_O reads it. (W_QKV's output gradient,
    `qkv`, the backward pass keeps merged, before the turn and the q/k norms.)"""
    for i in range(config.n_layer):
        v[f"layers.{i}.z"] = ops.merge_heads(v[f"layers.{i}.z"])


def rows_read(config: Config, dv: dict) -> np.ndarray:
    """d W_E of the rows a text read, at each position: the gradient at the embeddings,
    times the number each row is read with (Gemma 3's sqrt(d)).  [..., T, d]"""
    m = dv["embeddings"]
    return m * m.dtype.type(config.embed_scale) if config.embed_scale else m


def with_ones(x: np.ndarray, bias: bool = True) -> np.ndarray:
    """[..., n] -> [..., n + 1]: the bias is a weight on a constant input; a product
    without one gets a 0 there, so that every site has the same layout and the
    missing bias adds nothing to a score."""
    return np.concatenate([x, np.full((*x.shape[:-1], 1), 1 if bias else 0, x.dtype)],
                          axis=-1)


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


def softmax_part(dlogits: np.ndarray, y: np.ndarray) -> np.ndarray:
    """s_t / T from (s_t - e_{y_t}) / T: the dense part of the unembedding's gradient."""
    s = dlogits.copy()
    np.put_along_axis(s, y[..., None], np.take_along_axis(s, y[..., None], axis=-1)
                      + 1.0 / y.shape[-1], axis=-1)
    return s


@dataclass(frozen=True)
class Projection:
    """The fitted directions, by name: the position table's `left`/`right` pair, `left`
    alone for the norms and for the per-position `u`, `m`; and how many chances (`top`) and
    power steps (`steps`) each window keeps and takes."""

    left: dict[str, np.ndarray]
    right: dict[str, np.ndarray]
    top: int = TOP
    steps: int = POWER_STEPS

    @property
    def dim(self) -> int:
        """Projected numbers per window (the position table's and the norms')."""
        return sum(a.shape[1] * self.right[n].shape[1] if n in self.right else a.shape[1]
                   for n, a in self.left.items() if n not in ("u", "m"))

    @classmethod
    def fit(cls, params, config: Config, x: np.ndarray, y: np.ndarray,
            seed: int = PROJECTION_SEED, sizes: dict | None = None) -> Projection:
        """Directions from a sample of windows' gradients at these weights: for a gradient
        sum_t l_t r_t^T, the top eigenvectors of sum_t |l_t|^2 r_t r_t^T (orthonormal: a
        gradient lying in them is kept exactly)."""
        rng = np.random.default_rng(seed)
        k = {**SIZES, **(sizes or {})}
        v, dv, _ = values_and_gradients(
            params, config, x, lambda z: window_loss_gradient_of_logits(z, y))
        u, demb = v["ln_final.out"], dv["embeddings"]
        left, right = {}, {}
        if POSITIONS in params:  # every position carries about the same energy: random
            left[POSITIONS] = (rng.standard_normal((config.n_positions, k["positions"]))
                               / np.sqrt(k["positions"])).astype(np.float32)
            right[POSITIONS] = top_eigenvectors(
                weighted_gram(demb, np.ones_like(demb[..., :1])), k["positions"])
        for prefix, inp, name in norm_sites(config):
            gb = norm_gradients(v, dv, inp, name)
            left[prefix] = top_eigenvectors(gb.T.astype(np.float64) @ gb, k["vector"])
        left["u"] = top_eigenvectors(weighted_gram(u, np.ones_like(u[..., :1])), k["u"])
        m = rows_read(config, dv)
        left["m"] = top_eigenvectors(weighted_gram(m, np.ones_like(m[..., :1])), k["m"])
        return cls(left, right, int(k["top"]), int(k["steps"]))

    def arrays(self) -> dict[str, np.ndarray]:
        return {**{f"left/{n}": a for n, a in self.left.items()},
                **{f"right/{n}": a for n, a in self.right.items()},
                "top": np.asarray(self.top), "steps": np.asarray(self.steps)}

    @classmethod
    def from_arrays(cls, arrays) -> Projection:
        return cls({k[5:]: np.asarray(arrays[k]) for k in arrays if k.startswith("left/")},
                   {k[6:]: np.asarray(arrays[k]) for k in arrays if k.startswith("right/")},
                   int(arrays["top"]), int(arrays["steps"]))


def norm_gradients(v, dv, inp: str | None, name: str) -> np.ndarray:
    """Per window, a norm's gradient as norm_params orders it: a LayerNorm's [d gain,
    d bias], an RMSNorm's [d gain]; a q/k norm's (inp None) summed over heads too.
    -> [B, 2d], [B, d] or [B, d_k]"""
    if inp is None:
        return dv[name + ".dw"].sum(axis=(-3, -2))
    dout = dv[name + ".out"]
    if name + ".rms" in v:
        return (dout * (v[inp] / v[name + ".rms"])).sum(axis=-2)
    xhat = (v[inp] - v[name + ".mean"]) / v[name + ".std"]
    return np.concatenate([(dout * xhat).sum(axis=-2), dout.sum(axis=-2)], axis=-1)


def top_singular_pair(a: np.ndarray, d: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """For each window's G = A^T D (A [T, n], D [T, m]): u, G's top left singular vector by
    `steps` power steps on G G^T in factor form, and v = G^T u, so that u v^T is G's best
    rank-one part. Started from sum_t |d_t| a_t (the positions with the largest output
    gradient lead).  a [B, T, n], d [B, T, m] -> u [B, n] (unit), v [B, m]"""
    def gt(u: np.ndarray) -> np.ndarray:  # G^T u = D^T (A u)
        return (np.matmul(a, u[..., None]).transpose(0, 2, 1) @ d)[:, 0]

    def g(w: np.ndarray) -> np.ndarray:  # G w = A^T (D w)
        return (np.matmul(d, w[..., None]).transpose(0, 2, 1) @ a)[:, 0]

    u = (np.linalg.norm(d, axis=-1)[:, None] @ a)[:, 0]
    for _ in range(steps):
        u /= np.linalg.norm(u, axis=-1, keepdims=True) + np.float32(1e-30)
        u = g(gt(u))
    u /= np.linalg.norm(u, axis=-1, keepdims=True) + np.float32(1e-30)
    return u, gt(u)


def top_chances(dlogits: np.ndarray, y: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each position's k likeliest tokens and their chances s, the likeliest first (ties to
    the lower id), from d loss / d logits = (s - e_y) / T: y's entry is the row's least, so
    the k largest entries are the likeliest tokens but y, and y is the one more candidate.
    k passes of argmax, several times faster in NumPy than a partition of each row.
    [..., V], y [...] -> ids [..., k] int64, chances [..., k] float32"""
    v = dlogits.shape[-1]
    k = min(k, v)
    t = y.shape[-1]
    flat, yf = dlogits.reshape(-1, v), y.reshape(-1)
    rows = np.arange(len(flat))
    work = flat.copy()
    ids = np.empty((len(flat), k + 1), np.int64)
    for j in range(k):
        ids[:, j] = work.argmax(axis=-1)
        work[rows, ids[:, j]] = -np.inf
    ids[:, k] = yf
    chances = np.take_along_axis(flat, ids, -1).astype(np.float32) * t
    chances[:, k] += 1.0
    chances[:, :k][ids[:, :k] == yf[:, None]] = -np.inf  # y once, with its own chance
    order = np.lexsort((ids, -chances), axis=-1)[:, :k]
    shape = (*dlogits.shape[:-1], k)
    return (np.take_along_axis(ids, order, -1).reshape(shape),
            np.take_along_axis(chances, order, -1).reshape(shape))


# ------------------------------------------------------------------ windows


@dataclass
class WindowGradients:
    """A batch of windows' gradients, kept small."""

    rank1: np.ndarray  # [B, R]: each weight matrix's u then v, site after site
    rows: np.ndarray  # [B, dim]: the position table and the norms, projected
    u: np.ndarray  # [B, T, K_U]: ln_final.out at each position, projected
    m: np.ndarray  # [B, T, K_M]: the gradient at the embeddings, projected
    top_ids: np.ndarray  # [B, T, TOP]: each position's likeliest next tokens
    top_p: np.ndarray  # [B, T, TOP]: their chances


def stored(pieces: list[WindowGradients]) -> dict[str, np.ndarray]:
    """Batches of windows' gradients joined, as the index keeps them: bfloat16 bits, the
    token ids as uint16."""
    joined = {name: np.concatenate([getattr(g, name) for g in pieces]) for name in vars(pieces[0])}
    return {name: a.astype(np.uint16) if name == "top_ids" else to_bfloat16(a)
            for name, a in joined.items()}


def window_gradients(params, config: Config, x: np.ndarray, y: np.ndarray,
                     projection: Projection) -> WindowGradients:
    """Each window's mean-loss gradient from one batched forward and backward pass (no
    dropout).  x, y [B, T]"""
    v, dv, dlogits = values_and_gradients(
        params, config, x, lambda z: window_loss_gradient_of_logits(z, y))
    return projected(config, v, dv, dlogits, x, y, projection)


def projected(config: Config, v: dict, dv: dict, dlogits: np.ndarray, x: np.ndarray,
              y: np.ndarray, projection: Projection) -> WindowGradients:
    """The windows' gradients, kept small, from their pass's values and value-gradients."""
    p = projection
    pairs = []
    for w, inp, outp in linear_sites(config):
        pairs += top_singular_pair(with_ones(v[inp], has_bias(config, w)), dv[outp], p.steps)
    u, demb = v["ln_final.out"], dv["embeddings"]
    ids, chances = top_chances(dlogits, y, p.top)
    rows = []
    if POSITIONS in p.left:
        pos = p.left[POSITIONS][: x.shape[1]]
        rows.append(np.einsum("tk,btl->bkl", pos, demb @ p.right[POSITIONS]).reshape(len(x), -1))
    for prefix, inp, name in norm_sites(config):
        rows.append(norm_gradients(v, dv, inp, name) @ p.left[prefix])
    return WindowGradients(np.concatenate(pairs, axis=1).astype(np.float32),
                           np.concatenate(rows, axis=1).astype(np.float32),
                           (u @ p.left["u"]).astype(np.float32),
                           (rows_read(config, dv) @ p.left["m"]).astype(np.float32),
                           ids.astype(np.uint16), chances.astype(np.float32))


# ------------------------------------------------------------------ the query


@dataclass
class Query:
    """A query's gradient (analysis.exact_tracin.Query) in the index's terms: for each weight
    matrix, what u^T G_q v is read from (its factors A_q^T [n, P], D_q^T [m, P] when the
    query has few positions, else G_q itself, with D = None); the projected rows; and the
    table, as the head's factors a [V, r] and b on u's and m's directions, plus the rows the
    query's text read, on each (token v's at slot[v]; the last row is zero, for the
    tokens it did not read)."""

    matrices: list[tuple[np.ndarray, np.ndarray | None]]
    rows: np.ndarray  # [dim]
    a: np.ndarray  # [V, r]
    b_u: np.ndarray  # [r, K_U]
    b_m: np.ndarray  # [r, K_M]
    slot: np.ndarray  # [V]
    rows_u: np.ndarray  # [n + 1, K_U]
    rows_m: np.ndarray  # [n + 1, K_M]


def query(exact, config: Config, projection: Projection) -> Query:
    """The index's terms of an exact_tracin.Query (its gradient's factors and rows); the
    head's factors are W_U's gradient when the head is untied."""
    p = projection
    matrices = []
    for prefix, _, _ in linear_sites(config):
        a, d = (np.asarray(f, np.float32) for f in exact.sites[prefix])
        n, m = a.shape[1], d.shape[1]
        matrices.append((a.T.copy(), d.T.copy()) if len(a) * (n + m) < n * m
                        else (a.T @ d, None))
    rows = []
    if POSITIONS in p.left:
        rows.append((p.left[POSITIONS].T @ exact.grads[POSITIONS] @ p.right[POSITIONS]).ravel())
    for prefix, _, _ in norm_sites(config):
        gb = np.concatenate([exact.grads[n] for n in norm_params(config, prefix)])
        rows.append(gb @ p.left[prefix])
    right = np.asarray(exact.right, np.float64)
    e = np.asarray(exact.rows, np.float64)
    f32 = lambda z: np.ascontiguousarray(z, np.float32)  # noqa: E731
    n = len(exact.tokens)
    slot = np.full(len(exact.left), n)
    slot[np.asarray(exact.tokens)] = np.arange(n)
    e = np.concatenate([e, np.zeros((1, e.shape[1]))])
    # tied, the head's gradient and the rows read are one table's, so each window's part of
    # either meets both of the query's; untied, the head (a b^T) and the table (its rows)
    # are two parameters, and each part meets its own only
    tied = float(config.tied)
    return Query(matrices, f32(np.concatenate(rows)), f32(exact.left), f32(right @ p.left["u"]),
                 f32(tied * (right @ p.left["m"])), slot, f32(tied * (e @ p.left["u"])),
                 f32(e @ p.left["m"]))


def matrix_scores(rank1: np.ndarray, q: Query) -> np.ndarray:
    """sum over the weight matrices of u^T G_q v.  rank1 [W, R] float32 -> [W] float64"""
    out = np.zeros(len(rank1))
    at = 0
    for first, second in q.matrices:
        n = first.shape[0]
        m = first.shape[1] if second is None else second.shape[0]
        u, v = rank1[:, at : at + n], rank1[:, at + n : at + n + m]
        at += n + m
        if second is None:
            out += np.einsum("wm,wm->w", u @ first, v, dtype=np.float64)
        else:  # the query's few positions: summed in float32 by a product
            out += sum_last((u @ first) * (v @ second))
    return out


def sum_last(a: np.ndarray) -> np.ndarray:
    """a summed over its last axis, which is short (a query's positions, a position's top
    chances): as a product with ones, which NumPy does many times faster than a reduction
    over a short inner axis.  [..., k] -> [...]"""
    return a[..., 0] if a.shape[-1] == 1 else a @ np.ones(a.shape[-1], a.dtype)


def token_scores(values: np.ndarray, pairs: list[tuple[np.ndarray, object]], a: np.ndarray,
                 b: np.ndarray, slot: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """sum_t sum_j weights[w, t, j] (a[ids_j] . (b values_t) + row[ids_j] . values_t) over
    each (ids, weights) of `pairs`: the table's part of the score for terms
    e_{ids_j} (values_t)^T of a window's table gradient, against the query's a b^T + its rows
    (token v's is rows[slot[v]]; the last row is zero, the slot of every token the query's
    text did not read).

    The head's part as sum_t (b values_t) . sum_j weights_j a[ids_j]: one gather from a per
    term. The rows' part only where a term's token is one the query's text read (a few in a
    hundred): every other slot is the zero row.
    values [W, T, K], ids [W, T, J], weights broadcast to ids -> [W]"""
    r, n = a.shape[1], len(rows) - 1
    out = np.zeros(len(values))
    if r:
        lhs = sum(sum_last(a[:, 0].take(ids) * weights) if r == 1 else
                  np.einsum("wtjr,wtj->wtr", a[ids], np.broadcast_to(weights, ids.shape))
                  for ids, weights in pairs)  # [W, T] (r = 1) or [W, T, r]
        head = values @ b.T  # [W, T, r]
        out += np.einsum("wt,wt->w", lhs, head[..., 0], dtype=np.float64) if r == 1 else \
            np.einsum("wtr,wtr->w", lhs, head, dtype=np.float64)
    read = slot < n  # [V]: the tokens the query's text read
    for ids, weights in pairs:
        hit = np.flatnonzero(read.take(ids))
        if hit.size:
            w, t, _ = np.unravel_index(hit, ids.shape)
            found = np.einsum("hk,hk->h", values[w, t], rows[slot[ids.reshape(-1)[hit]]])
            found *= np.broadcast_to(weights, ids.shape).reshape(-1)[hit]
            out += np.bincount(w, found, minlength=len(values))
    return out


def scores(window: dict, x: np.ndarray, y: np.ndarray, q: Query,
           chunk: int = 256) -> np.ndarray:
    """<window gradient, query gradient> for every window of one snapshot: `window` holds
    WindowGradients' arrays by name (bfloat16 bits, or floats; top_ids as integers).
    x, y [W, T] -> [W]"""
    t = x.shape[1]
    out = np.empty(len(x), np.float64)
    for i in range(0, len(x), chunk):
        j = slice(i, i + chunk)
        out[j] = matrix_scores(as_float32(window["rank1"][j]), q) \
            + as_float32(window["rows"][j]) @ q.rows \
            + token_scores(as_float32(window["u"][j]),
                           [(np.asarray(window["top_ids"][j]),
                             as_float32(window["top_p"][j]) / np.float32(t)),
                            (y[j, :, None], np.float32(-1 / t))], q.a, q.b_u, q.slot, q.rows_u) \
            + token_scores(as_float32(window["m"][j]), [(x[j, :, None], np.float32(1))], q.a,
                           q.b_m, q.slot, q.rows_m)
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
    """uint16 bfloat16 bits -> float32 (exact). A widening copy, then a shift in place: twice
    as fast as one shift that widens as it goes (NumPy casts that in small buffers)."""
    out = b.astype(np.uint32)
    out <<= 16
    return out.view(np.float32)


def as_float32(a: np.ndarray) -> np.ndarray:
    """The index's arrays as float32: uint16 ones are bfloat16 bits (to_bfloat16's)."""
    return from_bfloat16(a) if a.dtype == np.uint16 else np.asarray(a, np.float32)
