"""Exact TracIn of every training window, without any window's gradient.

A window's mean-loss gradient is never formed: its dot product with a query's gradient G (one
full gradient, materialised once per snapshot) is read off the values and value-gradients
that one batched forward and backward pass over the windows already has. Site by site:

- a product y = x W + b: with x_t extended by a 1 (the bias), the window's gradient is
  sum_t x_t dy_t^T and the query's sum_t' x'_t' dy'_t'^T, so their dot product is
  sum_t sum_t' (x_t . x'_t')(dy_t . dy'_t'): two thin products against the query's few
  positions (a query of 10 tokens: 20 columns where G_W itself would be 512);
- the embedding table, tied to the unembedding: the rows the window read,
  sum_t G_E[x_t] . m_t (m_t the gradient at the embeddings), and the head's part,
  logits = u W_E^T so dW_E = sum_t dlogits_t u_t^T and the term is sum_t dlogits_t . (G_E u_t),
  with the query's G_E = dlogits'^T u' (rank one for a next token) + its few rows read:
  never a product of the logits' size;
- an untied head W_U: the same head part against W_U's gradient, and W_E only the rows read;
- the position table: sum_t G_pos[t] . m_t;
- each LayerNorm's gain and bias: (sum_t dout_t * xhat_t) . G_w + (sum_t dout_t) . G_b; an
  RMSNorm's gain alone (xhat_t = x_t / rms_t), Qwen3's q/k norms summed over heads too.

Several queries share the pass: their positions are stacked side by side, so a batch of
queries costs little more than the pass itself (on the shipped model ten queries take the
time of one: 0.5 s per 32 windows on one core). The sum over snapshots of lr times these is
TracIn by its definition (analysis.why.exact_tracin, one explicit gradient per window, is the
slow check the tests hold it to).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..transformer import ops
from ..transformer.config import Config
from ..transformer.hooks import Chain, Record
from ..transformer.model import (
    backward,
    backward_from_attention,
    backward_from_stream,
    forward,
    head_table,
)
from ..transformer.windows import eval_windows
from ..transformer.wiring import FAMILIES, handles
from .tracin import (
    bias_of,
    has_bias,
    linear_sites,
    merged,
    norm_gradients,
    norm_params,
    norm_sites,
    rows_read,
    values_and_gradients,
    with_ones,
)

# The blocks this analysis implements (wiring.require refuses others by name): its per-window sums
# are written for the families' products and norms.
HANDLES = handles(step=FAMILIES["step"] + ("norm after attention", "norm after the MLP"))

BATCH = 32  # windows per forward and backward pass

Each = Callable[[Callable, list], list]  # [fn(item) for item in items], in the items' order


def one_by_one(fn: Callable, items: list) -> list:
    """The map an analysis uses when its caller gives none: one item after another. A job
    gives threads.on_cores's instead, the same results on every core."""
    return [fn(item) for item in items]




def mean_loss_gradient(logits: np.ndarray, y: np.ndarray) -> np.ndarray:
    """d (each window's mean cross-entropy) / d logits, in the logits' own precision.  [B, T, V]"""
    d = ops.softmax(logits)
    np.put_along_axis(d, y[..., None], np.take_along_axis(d, y[..., None], axis=-1) - 1.0,
                      axis=-1)
    return d / y.shape[-1]


@dataclass
class Query:
    """One query's full gradient (by parameter name), with the embedding table's split in
    its two parts: the head's, dlogits^T u = left @ right (rank: the positions whose logits
    the scalar reads, one for a next token), and the rows the text read, `rows` at `tokens`."""

    grads: dict[str, np.ndarray]
    sites: dict[str, tuple[np.ndarray, np.ndarray]]  # each product's [x_t, 1] and dy_t
    left: np.ndarray  # [V, r]
    right: np.ndarray  # [r, d]
    tokens: np.ndarray  # [n] distinct
    rows: np.ndarray  # [n, d]


def query(params, config: Config, ids: list[int], dlogits_of=None, hooks=None,
          attention: tuple | None = None, stream: tuple | None = None) -> Query:
    """The gradient of a scalar of the text `ids` run through `hooks` (steering): one of its
    logits, d scalar / d logits = dlogits_of(logits [T, V]); or, with attention = (layer,
    dweights_of), one of block `layer`'s attention weights, d scalar / d weights =
    dweights_of(weights [H, T, T]); or, with stream = (layer, dh_of), one of the residual
    stream after block `layer` (-1: the embeddings), d scalar / d it = dh_of(it [T, d])."""

    rec = Record()
    x = np.asarray(ids)
    logits = forward(params, config, x, hooks=Chain(hooks, rec))
    v = rec.values
    if stream is not None:
        layer, dh_of = stream
        dlogits = np.zeros_like(logits)
        at = f"layers.{layer}.resid_post" if layer >= 0 else "embeddings"
        grads, dv = backward_from_stream(params, config, v, layer, dh_of(v[at]))
    elif attention is None:
        dlogits = dlogits_of(logits)
        grads, dv = backward(params, config, v, dlogits, wrt_values=True)
    else:
        layer, dweights_of = attention
        dlogits = np.zeros_like(logits)
        grads, dv = backward_from_attention(params, config, v, layer,
                                            dweights_of(v[f"layers.{layer}.weights"]))
    return from_pass(params, config, x, v, dv, grads, dlogits)


def from_pass(params, config: Config, ids: np.ndarray, values: dict, dv: dict, grads: dict,
              dlogits: np.ndarray | None = None, sites: dict | None = None) -> Query:
    """A query from one backward pass over the text `ids`: its recorded values, their
    gradients `dv` (what the pass did not reach: zero), the parameters' `grads`, and
    d scalar / d logits (None: the scalar does not read them); `sites` overrides some
    products' ([x_t, 1], dy_t) where the pass's own values are not what the scalar's
    gradient pairs (analysis.why_edge)."""
    v, dv = dict(values), dict(dv)  # merged() below replaces entries: the callers' stay
    x = np.asarray(ids)
    for prefix, _, outp in linear_sites(config):  # above what the scalar reads: no gradient
        dv.setdefault(outp, np.zeros((len(x), params[prefix].shape[1]),
                                     v["embeddings"].dtype))
    merged(config, v)
    own = {p: (with_ones(v[inp], has_bias(config, p)), dv[outp])
           for p, inp, outp in linear_sites(config)}
    own.update(sites or {})
    tokens, where = np.unique(x, return_inverse=True)
    rows = np.zeros((len(tokens), config.n_embd), dv["embeddings"].dtype)
    np.add.at(rows, where, rows_read(config, dv))
    if dlogits is None:
        left = np.zeros((config.vocab_size, 0), rows.dtype)
        return Query(grads, own, left, np.zeros((0, config.n_embd), rows.dtype), tokens, rows)
    read = np.flatnonzero(np.any(dlogits != 0, axis=-1))
    return Query(grads, own, dlogits[read].T, v["ln_final.out"][read], tokens, rows)


def combine(parts: list[Query]) -> Query:
    """The query of a scalar whose gradient is the sum of several passes' (several runs of
    the model, as an edge's score takes): the gradients summed, each product's positions and
    the head's factors side by side, the rows read summed by token. The exact pass's score
    is linear in the query, so it scores the sum."""
    grads = {n: sum(q.grads[n] for q in parts) for n in parts[0].grads}
    sites = {p: (np.concatenate([q.sites[p][0] for q in parts]),
                 np.concatenate([q.sites[p][1] for q in parts])) for p in parts[0].sites}
    tokens = np.unique(np.concatenate([q.tokens for q in parts]))
    rows = np.zeros((len(tokens), parts[0].rows.shape[1]), parts[0].rows.dtype)
    for q in parts:
        np.add.at(rows, np.searchsorted(tokens, q.tokens), q.rows)
    return Query(grads, sites, np.concatenate([q.left for q in parts], axis=1),
                 np.concatenate([q.right for q in parts]), tokens, rows)


def next_token_query(params, config: Config, ids: list[int], target: int,
                     hooks=None) -> Query:
    """d -log p(target | text) / d params: TracIn's query."""
    def dlogits_of(z: np.ndarray) -> np.ndarray:
        d = np.zeros_like(z)
        d[-1] = ops.softmax(z[-1])  # d(-log p_y)/dz = softmax(z) - onehot(y)
        d[-1, target] -= 1.0
        return d

    return query(params, config, ids, dlogits_of, hooks)


@dataclass
class Stacked:
    """Q queries laid out for a few thin products per site: a matrix's inputs [x_t, 1] and
    output gradients dy_t at every query position, side by side (P positions in all); the
    table [V, Q * d] whole (for the rows a window reads) and in its parts (for the head:
    the low-rank factors' columns side by side, `owner` the query of each, and every
    query's rows at the union of their tokens); the position table [Q, n_pos, d]; the
    norms' [Q, 2d]."""

    n: int
    matrices: dict[str, tuple[np.ndarray, np.ndarray]]  # [n_in + 1, P], [n_out, P]
    at: np.ndarray  # [P, Q] one-hot: the query of each of the P query positions
    table: np.ndarray
    left: np.ndarray  # [V, C]
    right: np.ndarray  # [C, d]
    owner: np.ndarray  # [C, Q] one-hot
    tokens: np.ndarray  # [J]
    rows: np.ndarray  # [Q * J, d]
    positions: np.ndarray | None
    norms: dict[str, np.ndarray]
    tied: bool = True  # the head is the table: its part meets the query's rows read too


def covered(config: Config, params: dict) -> set[str]:
    """The parameter names the exact pass takes a term for (every one, of every family)."""
    names = {"embed.W_E", head_table(config)} | ({"embed.W_pos"} & set(params))
    for prefix, _, _ in linear_sites(config):
        names |= {prefix} | ({bias_of(prefix)} if has_bias(config, prefix) else set())
    for prefix, _, _ in norm_sites(config):
        names |= set(norm_params(config, prefix))
    return names


def stack(queries: list[Query], config: Config, params: dict) -> Stacked:
    """The queries in the pass's layout: the head's factors are the tied table's part or,
    untied, all of W_U's gradient; `table` is W_E's whole gradient either way."""
    grads = [q.grads for q in queries]

    def side(name: str) -> np.ndarray:  # [n, m] each -> [n, Q * m]
        return np.concatenate([g[name] for g in grads], axis=1)

    def one_hot(of: np.ndarray) -> np.ndarray:
        return np.eye(len(queries))[of]

    matrices = {p: (np.concatenate([q.sites[p][0] for q in queries]).T,
                    np.concatenate([q.sites[p][1] for q in queries]).T)
                for p, _, _ in linear_sites(config)}
    at = np.concatenate([np.full(len(q.sites[linear_sites(config)[0][0]][0]), i)
                         for i, q in enumerate(queries)])
    norms = {p: np.stack([np.concatenate([g[n] for n in norm_params(config, p)])
                          for g in grads])
             for p, _, _ in norm_sites(config)}
    positions = np.stack([g["embed.W_pos"] for g in grads]) if "embed.W_pos" in params \
        else None
    owner = one_hot(np.concatenate([np.full(q.left.shape[1], i, int)
                                    for i, q in enumerate(queries)]))
    tokens = np.unique(np.concatenate([q.tokens for q in queries]))
    rows = np.zeros((len(queries), len(tokens), config.n_embd), queries[0].rows.dtype)
    for i, q in enumerate(queries):
        rows[i, np.searchsorted(tokens, q.tokens)] = q.rows
    return Stacked(len(grads), matrices, one_hot(at), side("embed.W_E"),
                   np.concatenate([q.left for q in queries], axis=1),
                   np.concatenate([q.right for q in queries]), owner, tokens,
                   rows.reshape(-1, config.n_embd), positions, norms, config.tied)


def _pairs(x: np.ndarray, dy: np.ndarray, a: np.ndarray, d: np.ndarray,
           at: np.ndarray) -> np.ndarray:
    """<sum_t [x_t, 1] dy_t^T, sum_t' a_t' d_t'^T> = sum_t sum_t' ([x_t, 1] . a_t')(dy_t . d_t')
    for each query (its positions t' by `at`) and window: x [B, T, n], dy [B, T, m], a
    [n + 1, P], d [m, P] -> [Q, B] (float64)"""
    b, t, _ = dy.shape
    inner = x.reshape(b * t, -1) @ a[:-1] + a[-1]  # [BT, P]
    inner *= dy.reshape(b * t, -1) @ d
    return per_position_sum((inner @ at).reshape(b, t, -1))


def per_position_sum(p: np.ndarray) -> np.ndarray:
    """[B, T, Q] dot products per position -> [Q, B], summed over positions in float64."""
    return p.sum(axis=1, dtype=np.float64).T


def head_scores(dlogits: np.ndarray, u: np.ndarray, q: Stacked) -> np.ndarray:
    """sum_t dlogits_t . (G_q u_t), G_q the query's table = left right + its rows: by the
    factors and the few rows, never a [V, Q * d] product.  [B, T, V], [B, T, d] -> [Q, B]"""
    b, t, _ = dlogits.shape
    flat, uf = dlogits.reshape(b * t, -1), u.reshape(b * t, -1)
    low = (flat @ q.left) * (uf @ q.right.T)  # [BT, C]
    out = per_position_sum((low @ q.owner).reshape(b, t, q.n))
    if not q.tied:  # W_U's gradient is the factors alone; the rows read are W_E's
        return out
    picked = flat[:, q.tokens]  # [BT, J]
    read = (uf @ q.rows.T).reshape(b * t, q.n, len(q.tokens))  # u_t . row_j of each query
    return out + per_position_sum(np.einsum("pqj,pj->pq", read, picked).reshape(b, t, q.n))


def window_scores(params, config: Config, x: np.ndarray, y: np.ndarray,
                  q: Stacked) -> np.ndarray:
    """<grad mean loss(window), G_q> for each query q and each window of the batch, from one
    forward and backward pass.  x, y [B, T] -> [Q, B] (float64)"""
    v, dv, dlogits = values_and_gradients(params, config, x,
                                          lambda z: mean_loss_gradient(z, y))
    return scores_from(config, v, dv, dlogits, x, q)


def scores_from(config: Config, v: dict, dv: dict, dlogits: np.ndarray, x: np.ndarray,
                q: Stacked) -> np.ndarray:
    """window_scores from the windows' pass: its values, value-gradients and d loss/d logits."""
    n, b = q.n, len(x)
    out = np.zeros((n, b))
    for prefix, inp, outp in linear_sites(config):
        out += _pairs(v[inp], dv[outp], *q.matrices[prefix], q.at)
    u, m = v["ln_final.out"], dv["embeddings"]
    out += head_scores(dlogits, u, q)
    # the rows read: sum_t G[x_t] . m_t
    out += per_position_sum(np.einsum("btqd,btd->btq",
                                      q.table[x].reshape(b, x.shape[1], n, -1),
                                      rows_read(config, dv)))
    if q.positions is not None:
        out += per_position_sum(np.einsum("qtd,btd->btq", q.positions[:, : x.shape[1]], m))
    for prefix, inp, name in norm_sites(config):
        out += (q.norms[prefix] @ norm_gradients(v, dv, inp, name).T).astype(np.float64)
    return out


def scores_over_stream(snapshots: list[tuple[dict, float, list[dict]]], config: Config,
                       stream: np.ndarray, advance: Callable[[int], None] | None = None,
                       each: Each = one_by_one, windows: np.ndarray | None = None,
                       batch: int = BATCH) -> np.ndarray:
    """Exact TracIn of every window of the stream (or of `windows`, their numbers), for each
    query: `snapshots` are (params, lr, [the queries at those params: Query]) triples.
    advance(n) after each batch of n windows at one snapshot; the batches mapped by `each`
    (the caller's: threads.on_cores runs them on every core).  -> [Q, S, W] (weighted by
    each snapshot's lr)"""

    lock = threading.Lock()
    t = config.n_positions
    x, y = eval_windows(stream, t)
    chosen = np.arange(len(x)) if windows is None else np.asarray(windows)
    stacked = [stack(g, config, p) for p, _, g in snapshots]
    jobs = [(s, i) for s in range(len(snapshots)) for i in range(0, len(chosen), batch)]

    def one(job) -> np.ndarray:
        s, i = job
        w = chosen[i : i + batch]
        params, lr, _ = snapshots[s]
        got = lr * window_scores(params, config, x[w].astype(np.int64),
                                 y[w].astype(np.int64), stacked[s])
        if advance:
            with lock:  # the bar's count is no thread's alone
                advance(len(w))
        return got

    found = each(one, jobs)
    n = stacked[0].n if stacked else 0
    out = np.zeros((n, len(snapshots), len(chosen)))
    for (s, i), got in zip(jobs, found, strict=True):
        out[:, s, i : i + got.shape[1]] = got
    return out
