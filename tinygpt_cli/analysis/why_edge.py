"""`why --value edge:SENDER->RECEIVER`: the gradient of one edge's score from `tinygpt circuit`.

The score is circuit's `exact` one (denoising; EAP is its first-order estimate): with
m = logit[target] - logit[vs] at the text's last position,

    S = m(corrupt run, receiver v's input alone given sender u's clean output) - m(corrupt run).

In that patched run v's input is the corrupt run's plus delta = out_u(clean) - out_u(corrupt),
both functions of the weights, so

    grad S = grad m(patched) at fixed delta + J_delta^T g - grad m(corrupt),
    g = d m(patched) / d delta,

and J_delta^T g is a backward pass from u's output with g in the clean run, minus one in the
corrupt run. A head's q, k or v input is read by that head alone, through the block's
norm (LayerNorm or RMSNorm), its projection and the family's q/k norm and turn, and a
parallel block's MLP reads its input through ln2 apart from the heads: the patched receiver
reads x + delta where the pass's backward went through x, so its parameters' gradients on
that way are mended (the read's minus the pass's) and a fifth pass carries the difference
down from the block's input. Each pass is a part of the query (exact_tracin.combine), their
positions side by side. Every family: grouped key/value heads are ungrouped as circuit
ungroups them, and the query regrouped at the end.
"""

from __future__ import annotations

import re

import numpy as np

from ..errors import InputError
from ..transformer import ops
from ..transformer.config import Config
from ..transformer.hooks import Chain, Record
from ..transformer.model import (
    Gradients,
    _identity,
    backward,
    backward_from_part,
    backward_from_stream,
    forward,
    head_qkv,
    norm,
    norm_backward,
    turned,
    turned_backward,
)
from ..transformer.wiring import describe
from . import exact_tracin as ex
from .circuit import (
    Graph,
    build_graph,
    default_tokens,
    grouped_columns,
    sender_outputs,
    ungrouped,
)
from .tracin import has_bias

EDGE = r"edge:\s*(\S+?)\s*->\s*(\S+)"
RECEIVER_HEAD = r"L(\d+)H(\d+)\.([qkv])"
SENDER_HEAD = r"L(\d+)H(\d+)"
MLP = r"L(\d+)\.mlp"


def parse_edge(value: str, graph: Graph, config: Config) -> tuple[int, int]:
    """edge:SENDER->RECEIVER (the spaces of `circuit --json`'s "L0H1 -> L2H3.q" allowed) ->
    (sender index, receiver index) in the graph."""
    found = re.fullmatch(EDGE, value.strip())
    u = graph.senders.index(found.group(1)) if found and found.group(1) in graph.senders \
        else None
    r = graph.receivers.index(found.group(2)) if found and found.group(2) in graph.receivers \
        else None
    if u is None or r is None or graph.sender_stage[u] >= graph.receiver_stage[r]:
        raise InputError(
            f"--value {value!r}: give an edge as tinygpt circuit names it, "
            "edge:SENDER->RECEIVER, SENDER embed, LxHy or Lx.mlp, RECEIVER LxHy.q, .k or .v, "
            "Lx.mlp or logits, the sender computed before the receiver reads the stream "
            f"(this model: blocks L0 to L{config.n_layer - 1}, heads H0 to "
            f"H{config.n_head - 1})" + ("; quote it, or the shell reads its > as a "
                                        "redirection" if value.endswith("-") else ""))
    return u, r


def _dlogits(logits: np.ndarray, target: int, vs: int, sign: float) -> np.ndarray:
    """d (sign * m) / d logits, m = logit[target] - logit[vs] at the last position."""
    d = np.zeros_like(logits)
    d[-1, target], d[-1, vs] = sign, -sign
    return d


def _run(params, config: Config, ids: np.ndarray, hooks):
    rec = Record()
    logits = forward(params, config, ids, hooks=Chain(hooks, rec))
    return logits, rec.values


def _read(receiver: str, config: Config) -> tuple[int, str, int | None, str | None] | None:
    """A receiver that reads the stream through a norm of its own, apart from the rest of
    its block: (block, norm, head, part) for a head's q, k or v (ln1), (block, ln2, None,
    None) for a parallel block's MLP, whose input is the block's own; None for the logits
    and a sequential MLP, whose input is a value of the stream (moved by shifting it)."""
    head, mlp = re.fullmatch(RECEIVER_HEAD, receiver), re.fullmatch(MLP, receiver)
    if head:
        i = int(head.group(1))
        return i, describe(config, i).norm_of("attention"), int(head.group(2)), head.group(3)
    if mlp and describe(config, i := int(mlp.group(1))).input_of("mlp") == "resid_pre":
        return i, describe(config, i).norm_of("mlp"), None, None
    return None


def _projected(params, config: Config, i: int, h: int, part: str, normed: np.ndarray
               ) -> np.ndarray:
    """Head h's q, k or v of block i from its normed input, as attention reads it: after
    the family's q/k norm and turn (model.turned; v is not turned).  [T, d] -> [T, d_k]"""
    qkv = head_qkv(params, config, i)
    p = "qkv".index(part)
    y = normed @ qkv[p][h] + qkv[3 + p][h]
    return y if part == "v" else turned(params, config, i, part, y[None], 0)[0]


def _patched(params, config: Config, ids: np.ndarray, receiver: str, delta: np.ndarray,
             hooks):
    """The run on `ids` with `receiver`'s input alone moved by delta [T, d]: (logits, values).
    A head reads x + delta through ln1, its projection and the family's turn of q and k; a
    parallel block's MLP reads it through ln2; the others' input is the stream itself."""
    n = config.n_layer
    mlp = re.fullmatch(MLP, receiver)
    read = _read(receiver, config)
    if receiver == "logits":
        shifts = {f"layers.{n - 1}.resid_post": delta}
    elif mlp and read is None:  # the MLP reads resid_mid + delta; the stream past it goes on
        L = f"layers.{mlp.group(1)}."  # without delta
        shifts = {L + "resid_mid": delta, L + "resid_post": -delta}
    else:
        shifts = {}
    seen = {}

    def shift(path: str, x: np.ndarray) -> np.ndarray:
        if read is None:
            return x + shifts[path].astype(x.dtype) if path in shifts else x
        i, ln, h, part = read
        L = f"layers.{i}."
        if path == L + "resid_pre":
            seen["x"] = x
            return x
        normed = lambda: norm(params, config, seen["x"] + delta, L + ln, _identity)  # noqa: E731
        if h is None and path == L + "ln2.out":
            return normed().astype(x.dtype)
        if h is not None and path == L + part:
            x = x.copy()
            x[h] = _projected(params, config, i, h, part, normed())  # ungrouped: head h's own
            return x
        return x

    return _run(params, config, ids, Chain(hooks, shift))


def _patched_parts(params, config: Config, ids: np.ndarray, receiver: str, delta: np.ndarray,
                   target: int, vs: int, hooks) -> tuple[list, np.ndarray]:
    """The parts of minus the gradient of m(patched) at fixed delta, and
    g = d (-m(patched)) / d delta [T, d]."""
    logits, v = _patched(params, config, ids, receiver, delta, hooks)
    dlogits = _dlogits(logits, target, vs, -1.0)
    grads, dv = backward(params, config, v, dlogits, wrt_values=True)
    n = config.n_layer
    mlp, read = re.fullmatch(MLP, receiver), _read(receiver, config)
    whole = ex.from_pass(params, config, ids, v, dv, grads, dlogits)
    if receiver == "logits":
        return [whole], dv[f"layers.{n - 1}.resid_post"]
    if read is None:  # d/d resid_mid holds the stream's own path on; the MLP's input is the rest
        L = f"layers.{mlp.group(1)}."
        return [whole], dv[L + "resid_mid"] - dv[L + "resid_post"]
    # The receiver read x + delta through its norm (and a head its projection and turn), where
    # the pass took the gradient back at x: what it found for the parameters on that way, and
    # for the stream below, is mended by the read's own minus the pass's.
    i, ln, h, part = read
    L, name = f"layers.{i}.", f"layers.{i}.{ln}"
    x = v[L + "resid_pre"]
    rec = Record()
    normed = norm(params, config, x + delta, name, rec)
    at_read = Gradients(params, config, rec.values, None, False)  # the read's norm values
    at_pass = Gradients(params, config, v, None, False)
    fix = {k: np.zeros_like(a) for k, a in params.items()}
    # two rows a position (the read's product, then minus the pass's) at every product, as
    # the exact pass takes a query's positions alike at each
    sites = {p: (np.zeros((2 * len(a), a.shape[1]), a.dtype),
                 np.zeros((2 * len(d), d.shape[1]), d.dtype)) for p, (a, d) in whole.sites.items()}
    if h is None:  # a parallel block's MLP: d ln2.out is the same either way
        e_read = e_pass = dv[name + ".out"]
    else:
        e_read, e_pass, dy = _head_read_back(params, config, v, dv, read, at_read, at_pass)
        w = L + "attn.W_QKV"
        ones = np.full((len(ids), 1), 1.0 if has_bias(config, w) else 0.0, normed.dtype)
        a, d = sites[w] = (np.concatenate([np.concatenate([normed, ones], 1),
                                           np.concatenate([v[L + "ln1.out"], ones], 1)]),
                           np.concatenate(dy))
        fix[w] = a[:, :-1].T @ d  # the product the site stands for, as the pass's term reads it
        if has_bias(config, w):
            fix[L + "attn.b_QKV"] = d.sum(0)
    dx_read = norm_backward(at_read, e_read, x + delta, name)
    dx_pass = norm_backward(at_pass, e_pass, x, name)
    for k in set(at_read.grads) | set(at_pass.grads):
        if k in fix:
            fix[k] = fix[k] + at_read.grads.get(k, 0) - at_pass.grads.get(k, 0)
    fix_part = ex.Query(fix, sites, np.zeros((config.vocab_size, 0)), np.zeros((0, x.shape[1])),
                        np.zeros(0, np.int64), np.zeros((0, x.shape[1])))
    below, dv_below = backward_from_stream(params, config, v, i - 1, dx_read - dx_pass)
    return [whole, fix_part, ex.from_pass(params, config, ids, v, dv_below, below)], dx_read


def _head_read_back(params, config: Config, v: dict, dv: dict, read, at_read: Gradients,
                    at_pass: Gradients):
    """Head h's d m / d (its normed input), read (from its own projection of x + delta) and
    as the pass took it (from the block's), and d m / d W_QKV's output in h's columns, the
    read's and minus the pass's: each back through the family's turn at its own q or k
    (turned_backward; at_read and at_pass gather the q/k norms' scales' gradients)."""
    i, _, h, part = read
    L, dk = f"layers.{i}.", config.d_k
    p = "qkv".index(part)
    w = head_qkv(params, config, i)[p][h]  # [d, d_k]
    d_post = dv[L + part][h]  # [T, d_k]: the pass's gradient at what the head read
    cols = p * config.n_head * dk + h * dk
    out = []
    for g in (at_read, at_pass):
        d = d_post
        if part != "v":  # back through the q/k norm (at this run's q or k) and the turn
            full = np.zeros_like(dv[L + "q"]), np.zeros_like(dv[L + "k"])
            full["qk".index(part)][h] = d_post
            d = turned_backward(g, i, *full)["qk".index(part)][h]
        dy = np.zeros((len(d), 3 * config.n_head * dk), d.dtype)
        dy[:, cols:cols + dk] = d
        out.append((d @ w.T, dy))
    (e_read, dy_read), (e_pass, dy_pass) = out
    return e_read, e_pass, (dy_read, -dy_pass)


def _sender_part(params, config: Config, ids: np.ndarray, values: dict, sender: str,
                 d: np.ndarray) -> ex.Query:
    """The gradient of <out_sender, d> in the recorded run: a backward pass from it."""
    if sender == "embed":
        grads, dv = backward_from_stream(params, config, values, -1, d)
        return ex.from_pass(params, config, ids, values, dv, grads)
    head, mlp = re.fullmatch(SENDER_HEAD, sender), re.fullmatch(MLP, sender)
    layer = int((head or mlp).group(1))
    part = int(head.group(2)) if head else "mlp"
    grads, dv = backward_from_part(params, config, values, layer, part, d)
    sites = None
    if head:  # W_O's rows of this head, no bias: z_h alone pairs with d
        L, w_o = f"layers.{layer}.", f"layers.{layer}.attn.W_O"
        whole = ops.merge_heads(values[L + "z"])
        z = np.zeros_like(whole)
        dk = config.d_k
        z[:, part * dk:(part + 1) * dk] = values[L + "z"][part]
        x, dy = np.concatenate([z, np.zeros((len(z), 1))], 1), d
        post = next((s.name for s in describe(config, layer).steps
                     if s.op == "norm" and s.reads == ("attn_out",)), None)
        if post is not None:  # Gemma 3: the part is z_h W_O[h] / rms * w, and the rms reads
            # the whole of W_O's product: its rows pair with d * w / rms, and all of them with
            # d attn_out through the rms (model.backward_from_part)
            scale = params[f"{L}{post}.w"] / values[f"{L}{post}.rms"]
            ones = np.full((len(z), 1), 1.0 if has_bias(config, w_o) else 0.0, z.dtype)
            x = np.concatenate([x, np.concatenate([whole, ones], 1)])
            dy = np.concatenate([d * scale, dv[L + "attn_out"]])
        sites = {w_o: (x, dy)}
    q = ex.from_pass(params, config, ids, values, dv, grads, sites=sites)
    if sites and len(sites[w_o][0]) > len(ids):  # every product the same rows: zeros added
        q.sites = {p: (a, d) if p == w_o else
                   (np.concatenate([a, np.zeros_like(a)]), np.concatenate([d, np.zeros_like(d)]))
                   for p, (a, d) in q.sites.items()}
    return q


def edge_score(params, config: Config, clean: list[int], corrupt: list[int], edge: str,
               target: int, vs: int, hooks=None, want_query: bool = True):
    """(S, its query: minus its gradient, or None) for the edge at these weights. Grouped
    key/value heads are ungrouped first, as circuit takes them (each query head its own
    copy of its group's keys and values, so a head's k or v input is its own); the query
    is then taken back to the grouped model's parameters (regrouped)."""
    grouped = config
    params, config = ungrouped(params, config)
    graph = build_graph(config)
    u, r = parse_edge(edge, graph, config)
    sender, receiver = graph.senders[u], graph.receivers[r]
    c, k = np.asarray(clean), np.asarray(corrupt)
    _, clean_values = _run(params, config, c, hooks)
    corrupt_logits, corrupt_values = _run(params, config, k, hooks)
    delta = (sender_outputs(params, config, clean_values)[u]
             - sender_outputs(params, config, corrupt_values)[u]).astype(params["embed.W_E"]
                                                                         .dtype)
    m = lambda z: float(z[-1, target] - z[-1, vs])  # noqa: E731
    patched_logits, _ = _patched(params, config, k, receiver, delta, hooks)
    score = m(patched_logits) - m(corrupt_logits)
    if not want_query:
        return score, None
    parts, g = _patched_parts(params, config, k, receiver, delta, target, vs, hooks)
    dlogits = _dlogits(corrupt_logits, target, vs, 1.0)
    grads, dv = backward(params, config, corrupt_values, dlogits, wrt_values=True)
    parts += [ex.from_pass(params, config, k, corrupt_values, dv, grads, dlogits),
              _sender_part(params, config, c, clean_values, sender, g),
              _sender_part(params, config, k, corrupt_values, sender, -g)]
    return score, regrouped(ex.combine(parts), grouped)


def regrouped(q: ex.Query, config: Config) -> ex.Query:
    """A query on the ungrouped model (circuit.ungrouped) as one on the grouped model of
    `config`: W_QKV's and its bias's gradients, and its products' output gradients, taken
    back to the grouped columns (circuit.grouped_columns)."""
    if config.n_head == config.kv_heads:
        return q
    grads, sites = dict(q.grads), dict(q.sites)
    for i in range(config.n_layer):
        w, b = f"layers.{i}.attn.W_QKV", f"layers.{i}.attn.b_QKV"
        grads[w] = grouped_columns(grads[w], config)
        if b in grads:
            grads[b] = grouped_columns(grads[b], config)
        sites[w] = (sites[w][0], grouped_columns(sites[w][1], config))
    return ex.Query(grads, sites, q.left, q.right, q.tokens, q.rows)


def edge_tokens(params, config: Config, clean: list[int], corrupt: list[int], target: int,
                vs: int | None, hooks=None) -> tuple[int, int]:
    """(target, vs) as circuit takes them: vs by default the corrupt run's top guess (its
    best other token when that is the target)."""
    z = forward(params, config, np.asarray(corrupt), hooks=hooks)[-1]
    return default_tokens(np.zeros(1), z, target, vs)[:2]
