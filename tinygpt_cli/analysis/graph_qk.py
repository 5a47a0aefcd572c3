"""`graph --qk`: why an attention edge of the attribution graph exists (circuit-tracer #53).

An edge from a source at position k to a target at a later position p goes through attention:
some head, in a block between the two, read the source's position k from the query position p.
The head's pre-softmax score there is q . k * scale, and (the norms frozen at the real run,
as the graph freezes them) both q and k are sums of one term per part of the stream entering
that block, at p and at k:

    stream = embedding + sum over earlier blocks (their features' a_j W_dec[j], their error
             node, their attention output) + the transcoders' b_dec (and a steering vector)
    q      = sum over parts (part, through the frozen ln1) W_Q[h]  +  (ln1's shift W_Q[h] + b_Q)

(with Qwen3's and Gemma 3's per-head norm of q and k, each term divided by the run's rms of
the head's q, or k, and multiplied by the norm's scale, the rms frozen as ln1's scale is; then
turned by the position for rotary models, with the block's own base: the turn is linear). On
Gemma 3 each earlier block's attention output enters the stream through its norm after
attention, and its MLP output through the norm after the MLP, both frozen at the run: a
dictionary that predicts the MLP's own output (mlp_out) has its features, error and b_dec
scaled by that norm's frozen scale; one that predicts the output after it (Gemma Scope 2's
transcoders: ln2_post.out) writes into the stream as it is. So the score splits
two ways, each exact: by query part, q_a . k * scale summed over a (the key whole), and by key
part, q . k_b * scale summed over b (the query whole). Those are qk.py's terms with the parts
the graph's nodes: features, error nodes, embeddings; an earlier block's attention output (not
a node of the graph) and the constants are parts of their own.

Which head: every head of the blocks the edge crosses can carry it; the one shown carries the
most of it in one hop (the source's vector at k, through that head's frozen pattern and its
value and output weights to p, read by the target there, every other hop left out): a way to
pick the head, stated with its value (`one_hop`), beside the edge's exact weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..transformer import ops
from ..transformer.config import Config
from ..transformer.model import (
    head_out_matrix,
    head_qkv,
    norm_weights,
    qk_norm_rms,
    qk_norm_weights,
    record,
    unembed_rows,
)
from ..transformer.wiring import FAMILIES, describe, handles, require
from . import sae as S
from .circuit import norm_after
from .graph import Graph, shift_of
from .qk import through_head_norm

# The blocks this analysis implements (wiring.require refuses others by name): the graph's frozen
# pass, and the score split by the parts of the stream, Gemma 3's norms after each branch too.
HANDLES = handles(step=FAMILIES["step"] + ("norm after attention", "norm after the MLP"))


@dataclass
class EdgeQK:
    """One edge's attention score, split: parts are graph node indices (>= 0) or the names
    of parts that are not nodes ("attn L<i>" outputs, "biases", "constant")."""

    row: int  # the adjacency row (the target) and column (the source) of the edge
    col: int
    layer: int
    head: int
    query: int  # the target's position
    key: int  # the source's position
    score: float  # the recorded pre-softmax score
    weight: float  # the recorded attention weight
    one_hop: float  # the edge's part this head carries in one hop
    query_parts: list  # parts at the query position
    query_terms: np.ndarray  # q_a . k * scale per part, summing to score
    key_parts: list
    key_terms: np.ndarray  # q . k_b * scale per part, summing to score


def site_of(transcoder: S.SAE) -> str:
    """The value of its block a transcoder predicts: mlp_out, or Gemma's ln2_post.out."""
    return transcoder.site.split(".", 2)[2]


def attn_written(config: Config, i: int) -> str:
    """What block i's attention adds to the stream: attn_out, or (Gemma 3) the output of the
    norm after it."""
    name = norm_after(config, i, "attn_out")
    return "attn_out" if name is None else f"{name}.out"


def into_stream(params, config: Config, values: dict, transcoders: list[S.SAE], i: int,
                position: int, vec: np.ndarray) -> np.ndarray:
    """vec, a part of what block i's transcoder predicts at `position`, as the block adds it
    to the stream: through the norm after the MLP frozen at the run's scale there (Gemma 3)
    when the transcoder predicts the MLP's own output; unchanged otherwise."""
    name = norm_after(config, i, "mlp_out") if site_of(transcoders[i]) == "mlp_out" else None
    return vec if name is None else _norm_fwd(params, values, f"layers.{i}.{name}", position,
                                               vec)


def stream_parts(params, config: Config, graph: Graph, values: dict, transcoders: list[S.SAE],
                 layer: int, position: int, shift) -> tuple[list, np.ndarray]:
    """The parts of the real stream entering block `layer` at `position`: (parts, [P, d])."""
    nf = graph.n_features
    parts, vecs = [], []
    feats = np.flatnonzero((graph.layer[:nf] < layer) & (graph.pos[:nf] == position))
    for n in feats:
        i = int(graph.layer[n])
        tc = transcoders[i]
        parts.append(int(n))
        vecs.append(into_stream(params, config, values, transcoders, i, position,
                                graph.activation[n] * np.asarray(tc.W_dec[graph.feature[n]],
                                                                 np.float64)))
    biases = np.zeros(len(values["embeddings"][0]))
    first_error = nf
    t = len(graph.ids)
    for i in range(layer):
        z = S.encode(transcoders[i], values[f"layers.{i}.ln2.out"][position:position + 1])
        recon = np.asarray(S.decode(transcoders[i], z), np.float64)[0]
        site = site_of(transcoders[i])
        parts.append(first_error + i * t + position)
        vecs.append(into_stream(params, config, values, transcoders, i, position,
                                np.asarray(values[f"layers.{i}.{site}"][position], np.float64)
                                - recon))
        parts.append(f"attn L{i}")
        vecs.append(np.asarray(values[f"layers.{i}.{attn_written(config, i)}"][position],
                               np.float64))
        biases += into_stream(params, config, values, transcoders, i, position,
                              np.asarray(transcoders[i].b_dec, np.float64))
    parts.append(first_error + len(transcoders) * t + position)  # the embedding node
    vecs.append(np.asarray(values["embeddings"][position], np.float64))
    if shift is not None and shift[0] <= layer:
        biases += np.asarray(shift[1], np.float64)
    parts.append("biases")
    vecs.append(biases)
    return parts, np.stack(vecs)


def side(config: Config, params, values: dict, parts: np.ndarray, layer: int, position: int,
         w: np.ndarray, bias: np.ndarray, head_norm: tuple | None = None) -> np.ndarray:
    """Each part's term of q (or k) at `position` through the frozen ln1, then (`head_norm`,
    Qwen3's: the run's rms of this head's q or k here, and the norm's scale) through the
    head's frozen norm, turned by the position when rotary, and a last row, the constant:
    [P + 1, d_k]."""
    g, b = (None if a is None else np.asarray(a, np.float64)
            for a in norm_weights(params, f"layers.{layer}.ln1"))
    stat = "rms" if b is None else "std"
    s = float(np.asarray(values[f"layers.{layer}.ln1.{stat}"], np.float64)[position, 0])
    centred = parts if b is None else parts - parts.mean(axis=-1, keepdims=True)
    terms = np.concatenate([(centred / s * g) @ w, [(0.0 if b is None else b @ w) + bias]])
    if head_norm is not None:
        terms = through_head_norm(terms, *head_norm)
    a = describe(config, layer).attention
    if a.rotary:  # the block's own base (Gemma 3: one for sliding blocks, one for full)
        rope = (a.rotary, a.rotary_base, a.rope_scaling)
        terms = ops.rotary(terms[:, None, :], position, *rope)[:, 0]
    return terms


def edge_qk(params, config: Config, graph: Graph, transcoders: list[S.SAE], steering=None,
            rows: np.ndarray | None = None, cols: np.ndarray | None = None) -> list[EdgeQK]:
    """The split score of every kept edge (graph.edge_mask, or the edges rows x cols given)
    whose source is at an earlier position than its target (of the run steered by
    `steering`, as graph.build's: its vector a part of "biases" from its block on)."""

    require(config, "graph --qk", HANDLES)  # graph's own HANDLES take more blocks than this
    shift = shift_of(steering)
    _, values = record(params, config, np.asarray(graph.ids), hooks=steering)
    if rows is None:
        rows, cols = np.nonzero(graph.edge_mask)
    reads = _reads(params, config, graph, transcoders)
    cache: dict = {}
    out = []
    for r, c in zip(rows, cols, strict=True):
        t_node = int(graph.targets[r])
        p, k = int(graph.pos[t_node]), int(graph.pos[c])
        if graph.kinds[c] == "bias" or k >= p:
            continue
        lay, head, hop = _carrier(params, config, graph, values, transcoders, reads, t_node,
                                  int(c), p, k)
        if lay < 0:
            continue
        out.append(_split(params, config, graph, values, transcoders, shift, cache,
                          (int(r), int(c), lay, head, p, k, hop)))
    return out


def _split(params, config, graph, values, transcoders, shift, cache, edge) -> EdgeQK:
    r, c, lay, head, p, k, hop = edge
    key = (lay, head, p, k)
    if key not in cache:
        wq, wk, _, bq, bk, _ = (np.asarray(a, np.float64) for a in head_qkv(params, config, lay))
        kv = head // (config.n_head // config.kv_heads)
        qp, qv = stream_parts(params, config, graph, values, transcoders, lay, p, shift)
        kp, kvec = stream_parts(params, config, graph, values, transcoders, lay, k, shift)
        if config.qk_norm and ("rms", lay) not in cache:  # one product per block, not per edge
            cache["rms", lay] = qk_norm_rms(params, config, values, lay)
        norm_q, norm_k = head_norms(params, config, cache.get(("rms", lay)), lay, head, p, k)
        q = side(config, params, values, qv, lay, p, wq[head], bq[head], norm_q)
        kk = side(config, params, values, kvec, lay, k, wk[kv], bk[kv], norm_k)
        path = f"layers.{lay}.heads.{head}."
        cache[key] = (float(values[path + "scores"][p, k]),
                      float(values[path + "weights"][p, k]),
                      [*qp, "constant"], q @ kk.sum(axis=0) * config.scale,
                      [*kp, "constant"], kk @ q.sum(axis=0) * config.scale)
    score, weight, qp, qt, kp, kt = cache[key]
    return EdgeQK(r, c, lay, head, p, k, score, weight, hop, qp, qt, kp, kt)


def head_norms(params, config: Config, rms: tuple | None, layer: int, head: int, query: int,
               key: int) -> tuple:
    """side's head_norm for the query at `query` and the key at `key` of head `head` of
    block `layer`: (the run's rms of that q or k, the norm's scale [d_k]) each, from `rms`,
    model.qk_norm_rms of the block; (None, None) without Qwen3's norms of q and k."""
    if not config.qk_norm:
        return None, None
    rms_q, rms_k = rms
    w_q, w_k = (np.asarray(a, np.float64) for a in qk_norm_weights(params, layer))
    kv = head // (config.n_head // config.kv_heads)
    return ((float(rms_q[head, query, 0]), w_q), (float(rms_k[kv, key, 0]), w_k))


def _reads(params, config: Config, graph: Graph, transcoders) -> dict:
    """Each logit node's read vector (a feature's is its W_enc column)."""
    first = len(graph.kinds) - len(graph.tokens_of_logits)
    out = {}
    for i, tok in enumerate(graph.tokens_of_logits):
        if tok >= 0:
            out[first + i] = unembed_rows(params, config, [tok])[0].astype(np.float64)
        else:
            rows = unembed_rows(params, config,
                                [graph.target_token, graph.vs]).astype(np.float64)
            out[first + i] = rows[0] - rows[1]
    return out


def _carrier(params, config, graph, values, transcoders, reads, t_node, s_node, p, k):
    """(block, head, one-hop value) of the head that carries the most of the edge s -> t
    in one hop, among the blocks between the source's write and the target's read; (-1, -1,
    0) when there is none."""
    nl = config.n_layer
    kind = graph.kinds[s_node]
    if kind == "feature":
        lay = int(graph.layer[s_node])
        vec = into_stream(params, config, values, transcoders, lay, k, graph.activation[s_node]
                          * np.asarray(transcoders[lay].W_dec[graph.feature[s_node]],
                                       np.float64))
        low = lay + 1
    elif kind == "error":
        lay = int(graph.layer[s_node])
        z = S.encode(transcoders[lay], values[f"layers.{lay}.ln2.out"][k:k + 1])
        site = site_of(transcoders[lay])
        vec = into_stream(params, config, values, transcoders, lay, k,
                          np.asarray(values[f"layers.{lay}.{site}"][k], np.float64)
                          - np.asarray(S.decode(transcoders[lay], z), np.float64)[0])
        low = lay + 1
    else:  # an embedding
        vec, low = np.asarray(values["embeddings"][k], np.float64), 0
    if graph.kinds[t_node] == "logit":
        read, name, high = reads[t_node], "ln_final", nl
    else:
        lt = int(graph.layer[t_node])
        read = np.asarray(transcoders[lt].W_enc[:, graph.feature[t_node]], np.float64)
        b = describe(config, lt)  # the MLP's norm reads resid_pre (parallel) or resid_mid
        name = f"layers.{lt}.{b.norm_of('mlp')}"
        high = lt if b.input_of("mlp") == "resid_pre" else lt + 1
    back = _norm_at(params, values, name, p, read)  # d target / d stream at p
    best = (-1, -1, 0.0)
    for lay in range(low, high):
        _, _, wv, _, _, bv = head_qkv(params, config, lay)
        wo = head_out_matrix(params, config, lay)
        x = _norm_fwd(params, values, f"layers.{lay}.ln1", k, vec)
        after = norm_after(config, lay, "attn_out")  # Gemma 3's, frozen at p
        read = back if after is None else _norm_at(params, values, f"layers.{lay}.{after}", p,
                                                   back)
        for h in range(config.n_head):
            kv = h // (config.n_head // config.kv_heads)
            w = float(values[f"layers.{lay}.heads.{h}.weights"][p, k])
            hop = w * float((x @ wv[kv]) @ wo[h] @ read)
            if abs(hop) > abs(best[2]):
                best = (lay, h, hop)
    return best


def _norm_fwd(params, values, name: str, pos: int, vec: np.ndarray) -> np.ndarray:
    """The frozen norm's linear part at `pos` applied to vec (no shift)."""
    g, b = (None if a is None else np.asarray(a, np.float64) for a in norm_weights(params, name))
    stat = "rms" if b is None else "std"
    s = float(np.asarray(values[f"{name}.{stat}"], np.float64)[pos, 0])
    return (vec if b is None else vec - vec.mean()) / s * g


def _norm_at(params, values, name: str, pos: int, read: np.ndarray) -> np.ndarray:
    """The derivative of read . norm(h) at `pos` by h (the norm frozen): its transpose."""
    g, b = (None if a is None else np.asarray(a, np.float64) for a in norm_weights(params, name))
    stat = "rms" if b is None else "std"
    s = float(np.asarray(values[f"{name}.{stat}"], np.float64)[pos, 0])
    out = read * g / s
    return out if b is None else out - out.mean()
