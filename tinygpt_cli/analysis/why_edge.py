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
LayerNorm: the patched head norms x + delta where the pass's backward norms x, so a fifth
pass carries the difference down from the block's input. Each pass is a part of the query
(exact_tracin.combine), their positions side by side.
"""

from __future__ import annotations

import re

import numpy as np

from .. import ops
from ..config import Config, require
from ..errors import InputError
from ..hooks import Chain, Record
from ..model import (
    backward,
    backward_from_part,
    backward_from_stream,
    forward,
    head_qkv,
    norm_weights,
)
from . import exact_tracin as ex
from .circuit import Graph, build_graph, default_tokens, sender_outputs

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


def _patched(params, config: Config, ids: np.ndarray, receiver: str, delta: np.ndarray,
             hooks):
    """The run on `ids` with `receiver`'s input alone moved by delta [T, d]: (logits, values)."""
    n = config.n_layer
    head = re.fullmatch(RECEIVER_HEAD, receiver)
    mlp = re.fullmatch(MLP, receiver)
    if receiver == "logits":
        shifts = {f"layers.{n - 1}.resid_post": delta}
    elif mlp:  # the MLP reads resid_mid + delta; the stream past it goes on without delta
        L = f"layers.{mlp.group(1)}."
        shifts = {L + "resid_mid": delta, L + "resid_post": -delta}
    else:
        shifts = {}
    seen = {}

    def shift(path: str, x: np.ndarray) -> np.ndarray:
        if head and path == f"layers.{head.group(1)}.resid_pre":
            seen["x"] = x
        if head and path == f"layers.{head.group(1)}.{head.group(3)}":
            i, h, part = int(head.group(1)), int(head.group(2)), "qkv".index(head.group(3))
            qkv = head_qkv(params, config, i)
            w, b = qkv[part], qkv[3 + part]
            normed = ops.layer_norm(seen["x"] + delta, *norm_weights(params, f"layers.{i}.ln1"),
                                    config.layer_norm_epsilon)[0]
            x = x.copy()
            x[h] = normed @ w[h] + b[h]
            return x
        return x + shifts[path].astype(x.dtype) if path in shifts else x

    return _run(params, config, ids, Chain(hooks, shift))


def _patched_parts(params, config: Config, ids: np.ndarray, receiver: str, delta: np.ndarray,
                   target: int, vs: int, hooks) -> tuple[list, np.ndarray]:
    """The parts of minus the gradient of m(patched) at fixed delta, and
    g = d (-m(patched)) / d delta [T, d]."""
    logits, v = _patched(params, config, ids, receiver, delta, hooks)
    dlogits = _dlogits(logits, target, vs, -1.0)
    grads, dv = backward(params, config, v, dlogits, wrt_values=True)
    n = config.n_layer
    head, mlp = re.fullmatch(RECEIVER_HEAD, receiver), re.fullmatch(MLP, receiver)
    if receiver == "logits":
        return [ex.from_pass(params, config, ids, v, dv, grads, dlogits)], \
            dv[f"layers.{n - 1}.resid_post"]
    if mlp:  # d/d resid_mid holds the stream's own path on; the MLP's input is the rest
        L = f"layers.{mlp.group(1)}."
        return [ex.from_pass(params, config, ids, v, dv, grads, dlogits)], \
            dv[L + "resid_mid"] - dv[L + "resid_post"]
    # the head: the pass took its d q (k, v) back through ln1 at x, the head read x + delta
    i, h, part = int(head.group(1)), int(head.group(2)), "qkv".index(head.group(3))
    L, d, dk = f"layers.{i}.", config.n_embd, config.d_k
    dpart = dv[L + head.group(3)][h]  # [T, d_k]
    e = dpart @ head_qkv(params, config, i)[part][h].T  # d m / d (normed input) of the head
    x, (gain, shift) = v[L + "resid_pre"], norm_weights(params, L + "ln1")
    normed, mean, std = ops.layer_norm(x + delta, gain, shift, config.layer_norm_epsilon)
    dx_read, dgain_read, _ = ops.layer_norm_backward(e, x + delta, gain, mean, std)
    dx_pass, dgain_pass, _ = ops.layer_norm_backward(e, x, gain, v[L + "ln1.mean"],
                                                     v[L + "ln1.std"])
    cols = slice(part * d + h * dk, part * d + (h + 1) * dk)
    dy = np.zeros((len(ids), 3 * d), dpart.dtype)
    dy[:, cols] = dpart
    inp = np.concatenate([normed - v[L + "ln1.out"], np.zeros((len(ids), 1), normed.dtype)],
                         axis=1)
    fix = {k: np.zeros_like(a) for k, a in params.items()}
    fix[L + "attn.W_QKV"] = inp[:, :-1].T @ dy
    fix[L + "ln1.w"] = dgain_read - dgain_pass
    zero_sites = {p: (np.zeros_like(x_), np.zeros_like(y_)) for p, (x_, y_)
                  in ex.from_pass(params, config, ids, v, dv, grads).sites.items()}
    zero_sites[L + "attn.W_QKV"] = (inp, dy)
    fix_part = ex.Query(fix, zero_sites, np.zeros((config.vocab_size, 0)),
                        np.zeros((0, d)), np.zeros(0, np.int64), np.zeros((0, d)))
    below, dv_below = backward_from_stream(params, config, v, i - 1, dx_read - dx_pass)
    return [ex.from_pass(params, config, ids, v, dv, grads, dlogits), fix_part,
            ex.from_pass(params, config, ids, v, dv_below, below)], dx_read


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
        z = np.zeros_like(ops.merge_heads(values[f"layers.{layer}.z"]))
        dk = config.d_k
        z[:, part * dk:(part + 1) * dk] = values[f"layers.{layer}.z"][part]
        sites = {f"layers.{layer}.attn.W_O": (np.concatenate([z, np.zeros((len(z), 1))], 1),
                                              d)}
    return ex.from_pass(params, config, ids, values, dv, grads, sites=sites)


def edge_score(params, config: Config, clean: list[int], corrupt: list[int], edge: str,
               target: int, vs: int, hooks=None, want_query: bool = True):
    """(S, its query: minus its gradient, or None) for the edge at these weights."""
    # the patched head's input is carried back through a LayerNorm and resid_mid above
    require(config, "why --value edge:")
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
    return score, ex.combine(parts)


def edge_tokens(params, config: Config, clean: list[int], corrupt: list[int], target: int,
                vs: int | None, hooks=None) -> tuple[int, int]:
    """(target, vs) as circuit takes them: vs by default the corrupt run's top guess (its
    best other token when that is the target)."""
    z = forward(params, config, np.asarray(corrupt), hooks=hooks)[-1]
    return default_tokens(np.zeros(1), z, target, vs)[:2]
