"""Circuits: which connections between components carry a behaviour.

The graph. Senders are the embeddings (token + position, one node; a rotary model's are the
token rows alone), every head (its output z_h W_O[h], without the shared bias b_O) and every
MLP (mlp_out). Receivers are each head's q, k and v inputs apart, each MLP's input and the
logits. Sender u feeds receiver v when u is computed before v reads the stream: the
embeddings feed everything, the heads of block l feed block l's MLP and everything later, MLP
l feeds every later block and the logits. A parallel block's MLP (GPT-NeoX) reads the
block's input, as its heads do: its own block's heads do not feed it.

Every receiver's input is a sum of sender outputs (plus the attention biases b_O of the
blocks before it, and in a steered run the steering vector from the block it is added before:
constants, the same in every run), so one edge can be patched on its own: v's input is
normed by v's own norm (ln1 for q/k/v, ln2 for an MLP, ln_final for the logits; LayerNorm or
RMSNorm) after the sum, and the rest of v is the family's own step: the head's projection,
then its q/k norm (Qwen3) and rotation by the query's or key's position (rotary), or the
MLP (GELU or gated). `edge_forward` runs the model that way, with the model's own functions.
A block with a norm after a branch (Gemma 3's RMSNorms after attention and after the MLP)
passes each sender's output through it: a head's output is z_h W_O[h] divided by the rms of
its block's whole attention output in the same run, times the norm's scale (the heads of a
block add up to the norm's output), so a patched edge into one head rescales its block's
other heads as the model does.
Grouped key/value heads (Llama, Qwen) are ungrouped first: each query head reads its own
copy of its group's keys and values, so its k and v inputs are receivers of its own.

Scores of edge u -> v, on the metric m = logit[target] - logit[vs] at one position:

    eap     (clean output of u - corrupt output of u) . d m / d (input of v), at the corrupt run
    eap-ig  the same difference . the gradient averaged over `steps` runs whose embeddings are
            corrupt + a (clean - corrupt), a = k / steps for k = 0 .. steps-1 (the left end of
            each interval, so one step is eap exactly; the EAP-IG paper interpolates the
            input embeddings too)
    exact   m(corrupt run with only v's input given u's clean output) - m(corrupt run)
            (denoising: the question EAP answers to first order at the corrupt run)
    exact-noising  m(clean run) - m(clean run with only v's input given u's corrupt output)
            (noising: what removing the edge from the full circuit costs)
    exact-mean  (exact + exact-noising) / 2, the oracle EAP-IG estimates (below)

Which oracle each estimate answers. Let M(l) be the metric when each edge e carries its
sender's corrupt output + l_e (clean - corrupt) (l = 0: the corrupt run, l = 1: the clean
run), M_e and M_ef its derivatives at l = 0. To second order, exact = M_e + M_ee / 2 and
exact-noising = M(1) - M(1 - e) = M_e + sum_f M_ef - M_ee / 2. EAP is M_e, the tangent of
`exact`, missing only the edge's own curvature. EAP-IG averages the gradient along the
straight path of the input embeddings, on which every l moves together (to first order):
M_e + sum_f M_ef / 2, the mean of the two oracles, off `exact` by sum_(f != e) M_ef / 2, the
edge's interactions with all the others. So EAP ranks edges as `exact` does and EAP-IG as
`exact-mean` does. (The EAP-IG paper's EAP takes the gradient at the clean run and its exact
score is the noising one, the mirror image; the integral is the same.) The figures over 24
TinyStories pairs on the shipped model are in docs/circuits.md.

All sums run over every position: an edge is a connection between components, not positions.
A circuit (a set of edges) is scored as MIB does: run the clean text, and give every edge
outside the circuit its sender's corrupt output; f = (circuit - corrupt) / (clean - corrupt).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from ..errors import InputError
from ..transformer import ops
from ..transformer.config import Config
from ..transformer.hooks import Chain, Record, Replace
from ..transformer.model import (
    Gradients,
    _identity,
    attn_out_bias,
    backward,
    cut_head,
    embed,
    feed_forward,
    forward,
    head_out_matrix,
    head_qkv,
    norm,
    norm_backward,
    turned,
    turned_backward,
    unembed_rows,
)
from ..transformer.schema import head_name, mlp_name
from ..transformer.trace import Trace
from ..transformer.wiring import FAMILIES, describe, handles, require
from ..words import count
from .patch import check_gap, logit_difference
from .variants import widen

# The blocks this analysis implements (wiring.require refuses others by name): every receiver's
# input a sum of the heads' and MLPs' outputs, as the families add them, or (Gemma 3) of what
# the norm after each branch makes of them.
HANDLES = handles(step=FAMILIES["step"] + ("norm after attention", "norm after the MLP"))

METHODS = ("eap", "eap-ig", "exact", "exact-noising", "exact-mean")
EDGE_TOKENS = 1024  # edge-patched runs x tokens computed together: [B, senders, T, d] stays
# a few MB (larger batches were slower: the arrays leave the cache)
THRESHOLD = 0.8  # the faithfulness a circuit must reach
STEP_TOKENS = 2048  # eap-ig: tokens per batched forward and backward pass


# ------------------------------------------------------------------ the graph


@dataclass(frozen=True)
class Graph:
    """Nodes and edges. A node's stage orders the computation: the embeddings 0, the heads
    of block l 2l+1, MLP l 2l+2, the logits 2 n_layer + 1; u feeds v when stage u < stage v.
    A parallel block's MLP (GPT-NeoX) reads the block's input as its heads do: as a receiver
    its stage is theirs, 2l+1, so its own block's heads do not feed it."""

    senders: list[str]
    receivers: list[str]
    sender_stage: np.ndarray  # [S]
    receiver_stage: np.ndarray  # [R]
    edges: list[tuple[int, int]]  # (sender index, receiver index), senders in stage order

    def edge_names(self) -> list[str]:
        return [f"{self.senders[u]} -> {self.receivers[v]}" for u, v in self.edges]

    def adjacency(self) -> np.ndarray:
        """[S, R] bool: which pairs are edges."""
        return self.sender_stage[:, None] < self.receiver_stage[None, :]


def require_splittable(config: Config) -> None:
    """wiring.require for circuit, and a norm after a branch only as Gemma 3 has it: an
    RMSNorm, with no attention output bias inside it (a LayerNorm's shift, or b_O, would be
    a part of no sender that the run's own statistics scale)."""
    require(config, "circuit", HANDLES)  # the senders are the families' branches
    post = any(norm_after(config, i, b) for i in range(config.n_layer)
               for b in ("attn_out", "mlp_out"))
    if post and (config.norm != "rms" or config.out_bias or config.mlp_bias):
        raise InputError(f"circuit is not available for this {config.model_type} model: its "
                         "block has a norm after a branch with a LayerNorm or biases before "
                         "it; circuit splits an RMSNorm after a branch without biases "
                         "(Gemma 3's) only")


def build_graph(config: Config) -> Graph:
    require_splittable(config)
    senders, s_stage = ["embed"], [0]
    receivers: list[str] = []
    r_stage: list[int] = []
    for i in range(config.n_layer):
        for h in range(config.n_head):
            senders.append(head_name(i, h))  # the names every view and `trace` use
            s_stage.append(2 * i + 1)
            for part in "qkv":
                receivers.append(f"{head_name(i, h)}.{part}")
                r_stage.append(2 * i + 1)
        senders.append(mlp_name(i))
        s_stage.append(2 * i + 2)
        receivers.append(mlp_name(i))
        # the MLP reads the stream after its block's heads, or (parallel) the block's input
        r_stage.append(2 * i + 1 if describe(config, i).input_of("mlp") == "resid_pre"
                       else 2 * i + 2)
    receivers.append("logits")
    r_stage.append(2 * config.n_layer + 1)
    ss, rs = np.array(s_stage), np.array(r_stage)
    edges = [(u, v) for v in range(len(rs)) for u in range(len(ss)) if ss[u] < rs[v]]
    return Graph(senders, receivers, ss, rs, edges)


def head_index(config: Config, i: int, h: int) -> int:
    """The sender index of head h of block i."""
    return 1 + i * (config.n_head + 1) + h


def mlp_index(config: Config, i: int) -> int:
    return 1 + i * (config.n_head + 1) + config.n_head


# ------------------------------------------------------------------ sender outputs and gradients


def head_weights(params, config: Config, i: int) -> tuple[np.ndarray, ...]:
    """Block i's attention per head: W_q, W_k, W_v [H, d, d_k], their biases [H, d_k], and
    W_O [H, d_k, d]."""
    return (*head_qkv(params, config, i), head_out_matrix(params, config, i))


def sender_outputs(params, config: Config, values: dict[str, np.ndarray]) -> np.ndarray:
    """Every sender's output in a recorded run: [S, *batch, T, d], float64: the embeddings,
    then per block each head and the MLP, as Trace.residual_parts splits the stream (the
    attention biases are no sender: edge_forward adds them to every later input)."""
    labels, parts = Trace(values, config).residual_parts(params)
    senders = [p for label, p in zip(labels, parts, strict=True)
               if label.startswith("L") and not label.endswith(".attn_bias")]
    return np.stack([np.asarray(values["embeddings"], np.float64), *senders])


def mlp_stream(config: Config, i: int) -> str:
    """The stream block i's MLP reads: resid_mid, or a parallel block's own input."""
    return f"layers.{i}." + describe(config, i).input_of("mlp")


def receiver_gradients(params, config: Config, values, grads) -> np.ndarray:
    """d metric / d (input of each receiver), from one backward pass: [R, *batch, T, d].

    Head h's q input reaches the metric only through q_h = turned(ln1(input) W_q[h] + b_q[h])
    (turned: the family's q/k norm and rotation, model.turned), so its gradient is d q_h taken
    back through the turn, then times W_q[h]^T, then back through ln1 at the run's stream,
    each step the model's own backward (an ungrouped model: every head its own k and v)."""
    g = Gradients(params, config, values, None, wrt_values=False)
    out = []
    for i in range(config.n_layer):
        L, b = f"layers.{i}.", describe(config, i)
        wq, wk, wv = head_weights(params, config, i)[:3]
        dq, dk = turned_backward(g, i, grads[L + "q"], grads[L + "k"])
        for h in range(config.n_head):
            for d, w in zip((dq, dk, grads[L + "v"]), (wq, wk, wv), strict=True):
                dx = d[..., h, :, :] @ w[h].T  # [*batch, T, d]
                out.append(norm_backward(g, dx, values[L + b.input_of("attention")],
                                         L + b.norm_of("attention")))
        out.append(norm_backward(g, grads[L + b.step("mlp").reads[0]],
                                 values[mlp_stream(config, i)], L + b.norm_of("mlp")))
    last = f"layers.{config.n_layer - 1}.resid_post"
    out.append(norm_backward(g, grads["ln_final.out"], values[last], "ln_final"))
    return np.stack(out)


def metric_gradients(params, config: Config, embeddings: np.ndarray, target: int, vs: int,
                     position: int, steer=None) -> np.ndarray:
    """Receiver gradients of the metric at runs whose embeddings are `embeddings` [B, T, d],
    averaged over the B runs: [R, T, d]. The head is cut to the rows of target and vs (the
    embeddings come in through a hook, so the table is not needed as an embedding)."""
    head = cut_head(params, config, [target, vs])
    rec = Record()
    logits = forward(head, config, np.zeros(embeddings.shape[:2], np.int64),
                     hooks=Chain(Replace({"embeddings": lambda _: embeddings}), steer, rec))
    dlogits = np.zeros_like(logits)
    dlogits[:, position, 0] = 1.0
    dlogits[:, position, 1] = -1.0
    _, grads = backward(head, config, rec.values, dlogits, wrt_values=True)
    return receiver_gradients(head, config, rec.values, grads).mean(axis=1)


# ------------------------------------------------------------------ the edge-decomposed forward


def _heads(params, config: Config, i: int, x: np.ndarray, last_only: bool = False
           ) -> np.ndarray:
    """Block i's heads on their own inputs x [B, H, 3, T, d] (q, k, v apart) -> each head's
    output z_h W_O[h]: [B, H, T, d] (last_only: the last query alone, [B, H, 1, d]). Each
    input goes through the block's own norm, its head's projection and the family's turn
    of q and k (model.norm, model.turned), then the block's attention step."""
    wq, wk, wv, bq, bk, bv, wo = head_weights(params, config, i)
    ln1, t = f"layers.{i}.{describe(config, i).norm_of('attention')}", x.shape[-2]
    xq = x[:, :, 0, -1:] if last_only else x[:, :, 0]
    q = norm(params, config, xq, ln1, _identity) @ wq + bq[:, None, :]  # [B, H, T, d_k]
    n = norm(params, config, x[:, :, 1:], ln1, _identity)
    k = n[:, :, 0] @ wk + bk[:, None, :]
    v = n[:, :, 1] @ wv + bv[:, None, :]
    q = turned(params, config, i, "q", q, t - 1 if last_only else 0)  # at the query's place
    k = turned(params, config, i, "k", k, 0)
    scale, window = config.attn_scale, config.window(i)
    if last_only:  # one query, the last: it sees every key in its window
        z = ops.softmax(ops.attention_scores(q, k, k.shape[-2] - 1, scale, window)) @ v
    else:  # [B, H, T, d_k], the pass's own steps
        z = ops.attention(q, k, v, scale=scale, window=window)[0]
    return z @ wo  # [B, H, T, d]


def _mlp(params, config: Config, i: int, x: np.ndarray) -> np.ndarray:
    """Block i's MLP on its input x: the block's own norm and feed-forward step (GELU or
    gated, as the family has it), then the norm after it where the block has one."""
    n = norm(params, config, x, f"layers.{i}.{describe(config, i).norm_of('mlp')}", _identity)
    out = feed_forward(params, config, i, n, _identity)
    return _post_normed(params, config, i, "mlp_out", out[..., None, :, :])[..., 0, :, :]


def norm_after(config: Config, i: int, branch: str) -> str | None:
    """The name of block i's norm after its branch `branch` (attn_out, mlp_out) and before
    the residual add (Gemma 3's ln1_post, ln2_post), or None."""
    return next((s.name for s in describe(config, i).steps
                 if s.op == "norm" and s.reads == (branch,)), None)


def _post_normed(params, config: Config, i: int, branch: str, parts: np.ndarray
                 ) -> np.ndarray:
    """parts [..., P, T, d] whose sum is block i's `branch` (attn_out, mlp_out), as the block
    adds them to its stream: through the RMSNorm after that branch (Gemma 3), each part
    divided by the rms of their sum, times the norm's scale; unchanged with no such norm."""
    name = norm_after(config, i, branch)
    if name is None:
        return parts
    rms = ops.rms_of(parts.sum(axis=-3), config.layer_norm_epsilon)  # [..., T, 1]
    return parts / rms[..., None, :, :] * params[f"layers.{i}.{name}.w"]


def edge_forward(params, config: Config, graph: Graph, ids: Sequence[int], live: np.ndarray,
                 fixed: np.ndarray, rows: Sequence[int], position: int, start: int = 0,
                 known: np.ndarray | None = None, steer=None) -> np.ndarray:
    """The model run on `ids` with each receiver's input summed edge by edge.

    live [B, E]: 1 where edge e carries its sender's output in this run, 0 where it carries
    the sender's output in `fixed` [S, T, d] instead (a number between mixes them). Returns
    the logits of `rows` at `position`: [B, len(rows)]. With every edge live this is the
    ordinary forward pass. `start` > 0 begins at that block, taking the outputs of the
    senders before it from `known` [S, T, d] (valid when no edge into them is patched).
    `steer` (hooks.Steering at layers.L.resid_pre) adds its shift to every input from block
    L's on.
    """
    require_splittable(config)  # receivers' inputs as the families' sums
    # nothing after `position` can change it; in the last block, nothing but `position`
    position = position % len(ids)
    ids, fixed = np.asarray(ids)[: position + 1], fixed[:, : position + 1]
    known = None if known is None else known[:, : position + 1]
    b, s_count, t = len(live), len(graph.senders), len(ids)
    coef = np.zeros((b, len(graph.receivers), s_count))  # [B, R, S]
    us, vs = np.array(graph.edges).T
    coef[:, vs, us] = live
    # input of v = sum over its senders of fixed[u] + live (run[u] - fixed[u]) + earlier b_O
    base = np.einsum("rs,std->rtd", graph.adjacency().T.astype(np.float64), fixed)
    for i in range(config.n_layer):
        later = graph.receiver_stage > 2 * i + 1
        base[later] += attn_out_bias(params, config, i)
    if steer is not None:
        entry = int(steer.site.split(".")[1])
        base[graph.receiver_stage >= 2 * entry + 1] += np.asarray(steer.shift, np.float64)
    diff = np.zeros((b, s_count, t, config.n_embd))  # run[u] - fixed[u], stage by stage
    if start == 0:
        diff[:, 0] = embed(params, ids, 0, _identity, config.embed_scale) - fixed[0]
    else:
        s0 = head_index(config, start, 0) if start < config.n_layer else s_count
        diff[:, :s0] = known[:s0] - fixed[:s0]
    per_block = 3 * config.n_head + 1
    for i in range(start, config.n_layer):
        r0, s0, m = i * per_block, head_index(config, i, 0), mlp_index(config, i)
        last = i == config.n_layer - 1  # after it only the last position is read
        x = base[r0:r0 + per_block - 1] + (coef[:, r0:r0 + per_block - 1, :s0]
                                           @ diff[:, :s0].reshape(b, s0, -1)
                                           ).reshape(b, per_block - 1, t, -1)
        heads = _post_normed(params, config, i, "attn_out",
                             _heads(params, config, i, x.reshape(b, config.n_head, 3, t, -1),
                                    last))
        keep = slice(t - 1, t) if last else slice(None)
        diff[:, s0:m, keep] = heads - fixed[s0:m, keep]
        x_mlp = base[r0 + per_block - 1, keep] + (
            coef[:, r0 + per_block - 1, None, :m] @ diff[:, :m, keep].reshape(b, m, -1)
        ).reshape(b, -1, config.n_embd)
        diff[:, m, keep] = _mlp(params, config, i, x_mlp) - fixed[m, keep]
    x = base[-1][-1] + (coef[:, -1, None, :] @ diff[:, :, -1])[:, 0]
    u = norm(params, config, x, "ln_final", _identity)
    return u @ unembed_rows(params, config, list(rows)).T


def edge_metric(params, config, graph, ids, live, fixed, target, vs, position, start=0,
                known=None, steer=None) -> np.ndarray:
    """logit[target] - logit[vs] of each edge-patched run, in batches: [B]."""
    out = np.empty(len(live))
    step = max(4, EDGE_TOKENS // (position % len(ids) + 1))
    for first in range(0, len(live), step):
        rows = edge_forward(params, config, graph, ids, live[first:first + step], fixed,
                            [target, vs], position, start, known, steer)
        out[first:first + step] = rows[:, 0] - rows[:, 1]
    return out


# ------------------------------------------------------------------ the two runs and the scores


@dataclass
class Pair:
    """A clean and a corrupt text cut after the scored position (nothing later can change
    it), their sender outputs and metrics, in float64."""

    params: dict[str, np.ndarray]
    config: Config
    graph: Graph
    clean_ids: np.ndarray
    corrupt_ids: np.ndarray
    target: int
    vs: int
    position: int
    clean_out: np.ndarray  # [S, T, d]
    corrupt_out: np.ndarray
    clean: float  # the metric of the clean run
    corrupt: float
    steer: object = None  # hooks.Steering of both runs, or None

    def metric_of(self, ids, live: np.ndarray, fixed: np.ndarray) -> np.ndarray:
        return edge_metric(self.params, self.config, self.graph, ids, live, fixed,
                           self.target, self.vs, self.position, steer=self.steer)


def _run(params, config: Config, ids: np.ndarray, steer=None):
    rec = Record()
    logits = forward(params, config, ids, hooks=Chain(steer, rec))
    return logits, rec.values


def ungrouped(params, config: Config) -> tuple[dict[str, np.ndarray], Config]:
    """The same model with every query head given its own copy of its group's key and value
    weights (grouped-query attention, Llama and Qwen): the same function, each head now with
    k and v inputs of its own, so that an edge into head h's k is read by head h alone, as
    in GPT-2. (For EAP the k or v scores of a group's heads add up to those of the shared
    key or value.) A model without groups is returned as it is."""
    group = config.n_head // config.kv_heads
    if group == 1:
        return params, config
    out = dict(params)
    for i in range(config.n_layer):
        wq, wk, wv, bq, bk, bv = head_qkv(params, config, i)
        w = np.concatenate([wq, np.repeat(wk, group, 0), np.repeat(wv, group, 0)])  # [3H, d, d_k]
        out[f"layers.{i}.attn.W_QKV"] = w.transpose(1, 0, 2).reshape(config.n_embd, -1)
        if f"layers.{i}.attn.b_QKV" in params:  # [3H, d_k] -> [3 H d_k], as W_QKV's columns
            b = np.concatenate([bq, np.repeat(bk, group, 0), np.repeat(bv, group, 0)])
            out[f"layers.{i}.attn.b_QKV"] = b.reshape(-1)
    return out, replace(config, n_kv_head=0)


def grouped_columns(a: np.ndarray, config: Config) -> np.ndarray:
    """ungrouped in reverse for a gradient: W_QKV's columns (or its bias's) of the ungrouped
    model, [..., 3 H d_k], as the grouped model's, [..., (H + 2 H_kv) d_k]: each group's
    copies of a key or value head summed (the chain rule through the copying)."""
    group = config.n_head // config.kv_heads
    if group == 1:
        return a
    lead = a.shape[:-1]
    qs, ks, vs = np.split(a, 3, axis=-1)
    fold = lambda x: x.reshape(*lead, config.kv_heads, group, config.d_k).sum(-2) \
        .reshape(*lead, -1)  # noqa: E731
    return np.concatenate([qs, fold(ks), fold(vs)], axis=-1)


def prepare(params, config: Config, clean_ids, corrupt_ids, target: int, vs: int,
            position: int = -1, graph: Graph | None = None, steer=None) -> Pair:
    """The two runs of an edge attribution on any family: grouped key/value heads ungrouped
    first (ungrouped), everything in float64."""
    if len(clean_ids) != len(corrupt_ids):
        raise InputError(f"the clean text is {count(len(clean_ids), 'token')} and the "
                         f"corrupt text {len(corrupt_ids)}: edges are patched position by "
                         "position, so they must have the same number of tokens")
    position = position % len(clean_ids)
    params, config = ungrouped(widen(params), config)
    clean_ids = np.asarray(clean_ids)[: position + 1]
    corrupt_ids = np.asarray(corrupt_ids)[: position + 1]
    clean_logits, clean = _run(params, config, clean_ids, steer)
    corrupt_logits, corrupt = _run(params, config, corrupt_ids, steer)
    c = float(logit_difference(clean_logits[position], target, vs))
    r = float(logit_difference(corrupt_logits[position], target, vs))
    check_gap(c, r)
    return Pair(params, config, graph or build_graph(config), clean_ids, corrupt_ids, target,
                vs, position, sender_outputs(params, config, clean),
                sender_outputs(params, config, corrupt), c, r, steer)


def _embeddings(pair: Pair, ids: np.ndarray) -> np.ndarray:
    """The embeddings as the model makes them (a rotary model's: the token rows alone)."""
    return embed(pair.params, ids, 0, _identity, pair.config.embed_scale)


def edge_products(pair: Pair, gradients: np.ndarray) -> np.ndarray:
    """(clean - corrupt output of u) . gradient of v, for every edge: [E]."""
    delta = pair.clean_out - pair.corrupt_out  # [S, T, d]
    full = np.einsum("std,rtd->sr", delta, gradients)
    us, vs = np.array(pair.graph.edges).T
    return full[us, vs]


def eap_ig_scores(pair: Pair, steps: int) -> np.ndarray:
    """EAP-IG: the gradient averaged over embeddings corrupt + a (clean - corrupt),
    a = 0, 1/steps, .., (steps-1)/steps; steps = 1 is EAP. The runs go in batches of about
    STEP_TOKENS tokens, so that their recorded values stay small."""
    corrupt = _embeddings(pair, pair.corrupt_ids)
    clean = _embeddings(pair, pair.clean_ids)
    alphas = np.arange(steps, dtype=np.float64) / steps
    total = 0.0
    per_batch = max(1, STEP_TOKENS // len(pair.corrupt_ids))
    for first in range(0, steps, per_batch):
        a = alphas[first:first + per_batch, None, None]
        points = corrupt[None] + a * (clean - corrupt)[None]
        total = total + len(a) * metric_gradients(pair.params, pair.config, points,
                                                  pair.target, pair.vs, pair.position,
                                                  pair.steer)
    return edge_products(pair, total / steps)


def eap_scores(pair: Pair) -> np.ndarray:
    """EAP: the gradient at the corrupt run alone (its own forward and backward pass, not
    eap_ig_scores with one step, so that the two can be checked against each other)."""
    logits, values = _run(pair.params, pair.config, pair.corrupt_ids, pair.steer)
    dlogits = np.zeros_like(logits)
    dlogits[pair.position, pair.target] = 1.0
    dlogits[pair.position, pair.vs] = -1.0
    _, grads = backward(pair.params, pair.config, values, dlogits, wrt_values=True)
    return edge_products(pair, receiver_gradients(pair.params, pair.config, values, grads))


def _single_edges(pair: Pair, ids: np.ndarray, fixed: np.ndarray, known: np.ndarray,
                  advance=None) -> np.ndarray:
    """The metric of the run on `ids` with each edge in turn given its sender's output in
    `fixed`. Edges into block l leave the blocks before it as in the run (`known`), so those
    runs start at block l."""
    g, e = pair.graph, len(pair.graph.edges)
    block = np.array([(g.receiver_stage[v] - 1) // 2 for _, v in g.edges])  # logits: n_layer
    out = np.empty(e)
    for start in np.unique(block):
        group = np.flatnonzero(block == start)
        live = np.ones((len(group), e))
        live[np.arange(len(group)), group] = 0.0
        out[group] = edge_metric(pair.params, pair.config, g, ids, live, fixed, pair.target,
                                 pair.vs, pair.position, int(start), known, pair.steer)
        if advance is not None:
            advance(len(group))
    return out


def exact_scores(pair: Pair, advance=None) -> np.ndarray:
    """Each edge patched on its own into the corrupt run (denoising): v's input given u's
    clean output; the score is the metric's rise."""
    return _single_edges(pair, pair.corrupt_ids, pair.clean_out, pair.corrupt_out,
                         advance) - pair.corrupt


def exact_noising_scores(pair: Pair, advance=None) -> np.ndarray:
    """Each edge corrupted on its own in the clean run (noising, the question of pruning an
    edge from a circuit): v's input given u's corrupt output; the score is the metric's fall."""
    return pair.clean - _single_edges(pair, pair.clean_ids, pair.corrupt_out, pair.clean_out,
                                      advance)


def exact_mean_scores(pair: Pair, advance=None) -> np.ndarray:
    """The mean of the denoising and the noising effect of each edge: what EAP-IG estimates
    (to second order; the module's docstring says why)."""
    return (exact_scores(pair, advance) + exact_noising_scores(pair, advance)) / 2


def scores(pair: Pair, method: str, steps: int = 20, advance=None) -> np.ndarray:
    if method == "eap":
        return eap_scores(pair)
    if method == "eap-ig":
        return eap_ig_scores(pair, steps)
    if method == "exact":
        return exact_scores(pair, advance)
    if method == "exact-noising":
        return exact_noising_scores(pair, advance)
    if method == "exact-mean":
        return exact_mean_scores(pair, advance)
    raise InputError(f"unknown --method {method!r}: use {', '.join(METHODS)}")


# ------------------------------------------------------------------ circuits and faithfulness


def ranked(edge_scores: np.ndarray) -> np.ndarray:
    """Edge indices by |score|, largest first (ties in graph order)."""
    return np.argsort(-np.abs(edge_scores), kind="stable")


def circuit_masks(order: np.ndarray, sizes: Sequence[int]) -> np.ndarray:
    """live [len(sizes), E]: the top-N edges of `order` for each N."""
    masks = np.zeros((len(sizes), len(order)))
    for row, n in enumerate(sizes):
        masks[row, order[:n]] = 1.0
    return masks


def faithfulness(pair: Pair, masks: np.ndarray) -> np.ndarray:
    """f of each circuit (row of masks, 1 = in the circuit): the clean run with every other
    edge given its sender's corrupt output, (m - corrupt) / (clean - corrupt)."""
    m = pair.metric_of(pair.clean_ids, masks, pair.corrupt_out)
    return (m - pair.corrupt) / (pair.clean - pair.corrupt)


def area(sizes: np.ndarray, f: np.ndarray, total: int) -> float:
    """The area under f over the fraction of edges kept, 0 .. 1 (trapezoids), as MIB's CPR."""
    x = np.asarray(sizes, np.float64) / total
    return float(np.sum((x[1:] - x[:-1]) * (f[1:] + f[:-1]) / 2))


def smallest_faithful(sizes: np.ndarray, f: np.ndarray, threshold: float = THRESHOLD
                      ) -> int | None:
    hits = np.flatnonzero(f >= threshold)
    return int(sizes[hits[0]]) if len(hits) else None


def random_faithfulness(pair: Pair, size: int, count: int = 100, seed: int = 0) -> np.ndarray:
    """f of `count` circuits of `size` edges drawn uniformly at random."""
    rng = np.random.default_rng(seed)
    e = len(pair.graph.edges)
    masks = np.zeros((count, e))
    for row in masks:
        row[rng.choice(e, size, replace=False)] = 1.0
    return faithfulness(pair, masks)


@dataclass
class Circuit:
    """Edge scores (metric units) and the faithfulness of the top-N circuits."""

    graph: Graph
    method: str
    steps: int | None
    scores: np.ndarray  # [E]
    order: np.ndarray  # edge indices, largest |score| first
    clean: float
    corrupt: float
    position: int
    sizes: np.ndarray  # the N computed (curve_sizes, and the gap before the first >= 0.8)
    f: np.ndarray  # f at each of sizes
    area: float
    smallest: int | None  # the smallest N with f >= THRESHOLD
    random: np.ndarray | None  # f of random circuits of that size

    def f_at(self, n: int) -> float:
        """f of the top-n circuit; n must be one of the sizes computed."""
        i = int(np.searchsorted(self.sizes, n))
        if i == len(self.sizes) or self.sizes[i] != n:
            raise KeyError(f"f was not computed for {n} edges")
        return float(self.f[i])


def curve_sizes(total: int, every_to: int = 64, step: int = 8) -> np.ndarray:
    """The N at which f is computed: every N up to `every_to`, then every `step`-th, and
    `total` (each N costs a forward pass; the gaps below where f first reaches 0.8 are
    filled in)."""
    return np.unique(np.r_[np.arange(min(total, every_to) + 1),
                           np.arange(every_to, total, step), total])


def faithful_curve(pair: Pair, order: np.ndarray, every_to: int = 64, step: int = 8
                   ) -> tuple[np.ndarray, np.ndarray, int | None]:
    """(sizes, f, smallest N with f >= THRESHOLD): f on curve_sizes, then on every N below
    the first grid point that reaches the threshold (f need not rise with N), so that the
    smallest N is exact."""
    sizes = curve_sizes(len(order), every_to, step)
    f = faithfulness(pair, circuit_masks(order, sizes))
    first = smallest_faithful(sizes, f)
    if first is not None:
        gap = np.setdiff1d(np.arange(first), sizes)
        if len(gap):
            sizes = np.r_[sizes, gap]
            f = np.r_[f, faithfulness(pair, circuit_masks(order, gap))]
            by_size = np.argsort(sizes, kind="stable")
            sizes, f = sizes[by_size], f[by_size]
    return sizes, f, smallest_faithful(sizes, f)


def find_circuit(pair: Pair, method: str, steps: int = 20, random_count: int = 100,
                 seed: int = 0, advance=None) -> Circuit:
    edge_scores = scores(pair, method, steps, advance)
    order = ranked(edge_scores)
    sizes, f, smallest = faithful_curve(pair, order)
    rand = (random_faithfulness(pair, smallest, random_count, seed)
            if smallest is not None and random_count > 0 else None)
    return Circuit(pair.graph, method, steps if method == "eap-ig" else None, edge_scores,
                   order, pair.clean, pair.corrupt, pair.position, sizes, f,
                   area(sizes, f, len(order)), smallest, rand)


# ------------------------------------------------------------------ stability over pairs


def jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a | b else 1.0


@dataclass
class Stability:
    """The circuit of each pair, against the first pair's circuit of `size` edges."""

    size: int
    overlap: np.ndarray  # [P] Jaccard of each pair's top-`size` edges with the first's
    own: np.ndarray  # [P] f of each pair's own top-`size` circuit
    transfer: np.ndarray  # [P] f of the first pair's circuit on each pair


def stability(pairs: Sequence[Pair], method: str, size: int, steps: int = 20) -> Stability:
    orders = [ranked(scores(p, method, steps)) for p in pairs]
    first = set(orders[0][:size].tolist())
    overlap = np.array([jaccard(first, set(o[:size].tolist())) for o in orders])
    own = np.array([faithfulness(p, circuit_masks(o, [size]))[0]
                    for p, o in zip(pairs, orders, strict=True)])
    transfer = np.array([faithfulness(p, circuit_masks(orders[0], [size]))[0] for p in pairs])
    return Stability(size, overlap, own, transfer)


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation: Pearson's of the ranks, ties given their mean rank."""
    return float(np.corrcoef(_ranks(x), _ranks(y))[0, 1])


def _ranks(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    order = np.argsort(x, kind="stable")
    r = np.empty(len(x))
    r[order] = np.arange(len(x), dtype=np.float64)
    ordered = x[order]
    for value in np.unique(ordered[1:][np.diff(ordered) == 0]):
        tied = x == value
        r[tied] = r[tied].mean()
    return r


def default_tokens(clean_row: np.ndarray, corrupt_row: np.ndarray, target: int | None,
                   vs: int | None) -> tuple[int, int, bool]:
    """(target, vs, fell back): the given tokens, else the clean run's top guess against the
    corrupt run's; when those coincide, against the corrupt run's best other token (and
    fell back is True, for the caller to say so)."""
    t = int(np.argmax(clean_row)) if target is None else target
    if vs is not None:
        return t, vs, False
    ranking = np.argsort(-np.asarray(corrupt_row, np.float64), kind="stable")
    v = int(ranking[0])
    if v != t:
        return t, v, False
    return t, int(ranking[1]), True
