"""The attribution graph of one prediction, through the linearised replacement model.

Every block's MLP is replaced by its transcoder (analysis/transcoder.py) plus an error node,
the real mlp_out minus the transcoder's prediction, a fixed vector; with a cross-layer
transcoder (circuit-tracer's CLT) block L's latents write into the outputs of blocks L and
after, and a block's error node is its real output less every write into it (`Writers`).
Every attention pattern and every norm's scale (1/std, or 1/rms; Gemma 3's norms after
attention and after the MLP too) is frozen at the real run's. What is left is linear
in the residual stream: a value at one position reaches later ones only through the frozen
patterns' value-output paths (centred and scaled by the frozen norms). Then

    nodes    active transcoder features (layer, position, latent), error nodes (layer,
             position), embeddings (position: token plus learned position rows), one bias
             node (every constant: the model's and the transcoders' biases, norm shifts),
             and the logits of the top tokens at the position (plus the target)
    edge     s -> t: a_s times the derivative of t's pre-activation along s's decoder
             vector d_s through the frozen model; d_s = W_dec[j] for a feature, the error
             vector for an error node (a = 1), the embedding for a position (a = 1).
             The bias node's edge into t is t's value with every other source at zero.

so every target's pre-activation (a feature's (x - b_in) W_enc[:, j] + b_enc[j], a logit)
is exactly the sum of its incoming edges. Edges are computed one target batch at a time by a
backward pass through the frozen model (the derivative at every residual point), and the
direct effect excludes paths through other features: the features' activations are the
graph's nodes, not functions of the stream (circuit-tracer's stop-gradients).

Pruning follows circuit-tracer (Ameisen et al. 2025): the adjacency's absolute values, each
row normalised to sum 1, give every node's influence on the target (the sum over all paths);
features are kept in order of influence until `node_threshold` of the total, then edges in
order of (normalised weight x the influence of their target) until `edge_threshold`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError
from ..transformer.config import Config
from ..transformer.hooks import Replace, chained
from ..transformer.model import (
    forward,
    head_out_matrix,
    head_qkv,
    norm_weights,
    record,
    unembed_rows,
)
from ..transformer.wiring import (
    FAMILIES,
    Block,
    Step,
    describe,
    handles,
    require,
    run,
    run_backward,
)
from . import sae as S

# The blocks this analysis implements (wiring.require refuses others by name): the frozen pass has
# ops for the families' steps and for Gemma 3's norms after each branch (each frozen at the run
# as the others are); its sources are what the MLPs add to the stream.
HANDLES = handles(step=FAMILIES["step"] + ("norm after attention", "norm after the MLP"))

NODE_THRESHOLD = 0.8
EDGE_THRESHOLD = 0.98
N_LOGITS = 5
BATCH = 256
MAX_FEATURES = 4096
ADJACENCY_F64_MB = 256
KEY_BLOCK = 256
CHUNK = 64
PASS_MB = 16  # a pass's [rows, T, d] arrays kept below this: larger ones cost page faults


# ------------------------------------------------------------------ the frozen model


@dataclass
class Frozen:
    """The real run's attention patterns (as recorded, in the graph's precision:
    `adjacency_dtype`) and norm scales, and the weights the linear model reads, in float64."""

    config: Config
    weights: list[list[np.ndarray]]  # per block: its pattern's row blocks (`pattern_blocks`)
    scales: dict[str, np.ndarray]  # norm name -> [T, 1]: 1/std (LayerNorm) or 1/rms
    norms: dict[str, tuple[np.ndarray, np.ndarray | None]]  # name -> (w, b)
    W_V: list[np.ndarray]  # noqa: N815 [H_kv, d, d_k]
    b_V: list[np.ndarray]  # noqa: N815 [H_kv, d_k]
    W_O: list[np.ndarray]  # noqa: N815 [H, d_k, d]
    b_O: list[np.ndarray]  # noqa: N815 [d]
    shift: tuple[int, np.ndarray] | None = None  # steering: (block, vector added to its input)
    site: str = "mlp_out"  # the value of each block the dictionaries' outputs stand for
    skip: list[np.ndarray] | None = None  # per block [d, d]: its output also gets ln2.out skip


def freeze(params, config: Config, values: dict, steering=None, products=np.float64,
           site: str = "mlp_out", skip: list | None = None) -> Frozen:
    f64 = lambda a: None if a is None else np.asarray(a, np.float64)  # noqa: E731
    names = [f"layers.{i}.{n}" for i in range(config.n_layer) for n in describe(config, i).norms]
    names.append("ln_final")
    stat = ".rms" if config.norm == "rms" else ".std"
    scales = {n: 1.0 / f64(values[n + stat]) for n in names}
    norms = {n: tuple(f64(a) for a in norm_weights(params, n)) for n in names}
    qkv = [head_qkv(params, config, i) for i in range(config.n_layer)]
    b_o = [params.get(f"layers.{i}.attn.b_O") for i in range(config.n_layer)]
    return Frozen(config, [pattern_blocks(values[f"layers.{i}.weights"], products)
                           for i in range(config.n_layer)],
                  scales, norms, [f64(q[2]) for q in qkv], [f64(q[5]) for q in qkv],
                  [f64(head_out_matrix(params, config, i)) for i in range(config.n_layer)],
                  [np.zeros(config.n_embd) if b is None else f64(b) for b in b_o],
                  shift_of(steering), site, skip)


def pattern_blocks(weights: np.ndarray, dtype=np.float64) -> list[np.ndarray]:
    """A causal pattern [H, T, T] as blocks of KEY_BLOCK queries against the keys at or
    before their last, [H, q1 - q0, q1], in dtype: float64 copies in no more memory than the
    float32 square (the upper triangle is not kept), so that no product casts them again;
    float32 (the recorded pattern's own): views of it, no copy."""
    t = weights.shape[-1]
    return [np.asarray(weights[:, q0:q0 + KEY_BLOCK, :min(q0 + KEY_BLOCK, t)], dtype)
            for q0 in range(0, t, KEY_BLOCK)]


def pattern_rows(blocks: list[np.ndarray], at: np.ndarray, t: int) -> np.ndarray:
    """Rows `at` of the pattern the blocks hold, over the first t keys: [H, len(at), t]."""
    kb = blocks[0].shape[1]
    out = np.zeros((blocks[0].shape[0], len(at), t))
    for j, blk in enumerate(blocks):
        sel = np.flatnonzero(at // kb == j)
        if len(sel):
            w = min(blk.shape[2], t)
            out[:, sel, :w] = blk[:, at[sel] - j * kb, :w]
    return out


def read_paths(config: Config, site: str = "mlp_out") -> list[str]:
    """The real run's values the graph reads (freeze, the features, the embeddings, the
    dictionaries' outputs' `site`): only these are kept, not every block's [H, T, T] scores
    beside the patterns."""
    stat = ".rms" if config.norm == "rms" else ".std"
    blocks = range(config.n_layer)
    return ([f"layers.{i}.{n}{stat}" for i in blocks for n in describe(config, i).norms]
            + [f"ln_final{stat}", "embeddings"]
            + [f"layers.{i}.{v}" for i in blocks for v in ("weights", "ln2.out", site)])


def shift_of(steering) -> tuple[int, np.ndarray] | None:
    """A Steering hook on layers.L.resid_pre as (L, its vector): a constant of the linear
    model, part of the bias node."""
    if steering is None:
        return None
    return int(steering.site.split(".")[1]), np.asarray(steering.shift, np.float64)


def norm_forward(fz: Frozen, name: str, h: np.ndarray) -> np.ndarray:
    """The norm with its real run's scale: (h - mean) s w + b, or h s w.  [T, d]"""
    w, b = fz.norms[name]
    s = fz.scales[name][: h.shape[-2]]
    if fz.config.norm == "rms":
        return h * s * w
    return (h - h.mean(axis=-1, keepdims=True)) * s * w + b


def norm_backward(fz: Frozen, name: str, g: np.ndarray) -> np.ndarray:
    """The frozen norm's derivative applied to g [..., T, d] (the mean's is a centring)."""
    w, _ = fz.norms[name]
    gw = g * (w * fz.scales[name][: g.shape[-2]])  # one [T, d] factor, one pass over g
    if fz.config.norm != "rms":
        gw -= gw.mean(axis=-1, keepdims=True)
    return gw


def attention_forward(fz: Frozen, i: int, x: np.ndarray) -> np.ndarray:
    """Block i's attention with frozen patterns, from its frozen norm's output x [T, d]:
    linear in x (plus biases)."""
    t = x.shape[-2]
    v = np.einsum("td,hdk->htk", x, fz.W_V[i]) + fz.b_V[i][:, None, :]  # [H_kv, T, d_k]
    v = np.repeat(v, fz.config.n_head // v.shape[0], axis=0).astype(fz.weights[i][0].dtype)
    z = np.empty(v.shape, v.dtype)  # [H, T, d_k]
    q0 = 0
    for blk in fz.weights[i]:  # causal: a block of queries reads the keys before it
        q1 = min(q0 + blk.shape[1], t)
        if q1 <= q0:
            break
        z[:, q0:q1] = blk[:, :q1 - q0, :q1] @ v[:, :q1]
        q0 = q1
    return np.einsum("htk,hkd->td", z, fz.W_O[i]) + fz.b_O[i]


def attention_backward(fz: Frozen, i: int, g: np.ndarray, ends: np.ndarray | None = None
                       ) -> np.ndarray:
    """The derivative of block i's frozen attention output, g [B, T, d] -> d resid [B, T, d]:
    through W_O, each head's pattern transposed (to the keys' positions) and W_V, three
    products (each group's heads summed into its key/value head by the last). ends[b]: the
    last position where row b can be non-zero (its target's), None: anywhere."""
    b, t, d = g.shape
    h, dk = fz.config.n_head, fz.config.d_k
    gz = (g.reshape(b * t, d) @ fz.W_O[i].reshape(h * dk, d).T).reshape(b, t, h, dk)
    gz = np.ascontiguousarray(gz.transpose(2, 0, 3, 1)).reshape(h, b * dk, t)  # [H, B dk, T]
    gv = _keys_side(fz.weights[i], gz, t, None if ends is None else np.repeat(ends, dk))
    return _values_side(fz, i, gv.reshape(h, b, dk, t).transpose(0, 3, 1, 2))


def attention_backward_factored(fz: Frozen, i: int, prof: np.ndarray, vecs: np.ndarray,
                                ends: np.ndarray) -> np.ndarray:
    """attention_backward of g[b, q] = sum_r prof[b, r, q] vecs[b, r] (prof [B, R, T], vecs
    [B, R, d]): the causal pattern's product is taken with each row's R position profiles,
    not with its d_k columns a head, and each head's result then meets the profiles' vectors
    through W_O (linear in the text). The same sum, in R / d_k of the quadratic products.
    Profile 0 of every row is a one at its own position (ends[b]): the pattern transposed
    takes it to that row of the pattern, read, not multiplied; the others depend on the row's
    position only (its first attention's pattern rows), so rows at one position share them."""
    b, r, t = prof.shape
    c = np.einsum("brd,hkd->hbrk", vecs, fz.W_O[i])  # [H, B, R, d_k]
    pos, first, inverse = np.unique(ends, return_index=True, return_inverse=True)
    cols = prof[first, 1:].reshape(1, -1, t)  # [1, U (R - 1), T]
    m_u = _keys_side(fz.weights[i], cols, t, np.repeat(pos, r - 1))  # [H, U (R - 1), T]
    m_u = m_u.reshape(-1, len(pos), r - 1, t)
    m = np.empty((m_u.shape[0], b, t, r))  # [H, B, T, R]
    m[:, :, :, 0] = pattern_rows(fz.weights[i], ends, t)  # the own-position profile
    m[:, :, :, 1:] = m_u[:, inverse].transpose(0, 1, 3, 2)
    return _values_side(fz, i, (m @ c).transpose(0, 2, 1, 3))


def _values_side(fz: Frozen, i: int, gv: np.ndarray) -> np.ndarray:
    """The derivative at the values' positions, gv [H, T, B, d_k], through W_V (each group's
    heads summed into its key/value head) and the frozen ln1: -> [B, T, d]."""
    h, t, b, dk = gv.shape
    kv, d = fz.W_V[i].shape[0], fz.config.n_embd
    gv = gv.reshape(kv, h // kv, t, b, dk).sum(axis=1)  # [H_kv, T, B, d_k]
    gv = np.ascontiguousarray(gv.transpose(2, 1, 0, 3)).reshape(b * t, kv * dk)
    w_v = fz.W_V[i].transpose(0, 2, 1).reshape(kv * dk, d)  # row (head, k): W_V[head, :, k]
    name = f"layers.{i}.{describe(fz.config, i).norm_of('attention')}"
    return norm_backward(fz, name, (gv @ w_v).reshape(b, t, d))


def _keys_side(blocks: list[np.ndarray], gz: np.ndarray, t: int,
               ends: np.ndarray | None = None) -> np.ndarray:
    """gz [H or 1, X, T] times the pattern (`pattern_blocks`) over its first t positions:
    each column x's derivative at the queries taken to the keys, [H, X, T]. A block of
    queries at a time against the keys at or before it only (the pattern is causal): the
    keys before the block as one rectangle, the block's own keys, a triangle, in two bands
    each against the keys up to its own last. Only the columns still alive there: column x
    of gz is zero past ends[x] (its row's target's position), so the blocks of queries past
    it are skipped for it and no block reads a query past every live column's end. With the
    columns in order of their ends, a row's product costs the square of its own position,
    not of the pass's last. The columns are the products' short side (X a row of gz, the
    pattern's rows read as they are stored): narrow products run faster this way round.
    In the pattern's precision (`adjacency_dtype`): float32 products run twice as fast."""
    gz = gz.astype(blocks[0].dtype, copy=False)
    out = np.zeros((blocks[0].shape[0], *gz.shape[1:]), blocks[0].dtype)
    q0 = 0
    for blk in blocks:
        q1 = min(q0 + blk.shape[1], t)
        if q1 <= q0:
            break
        live = np.arange(gz.shape[1]) if ends is None else np.flatnonzero(ends >= q0)
        if not len(live):
            break
        c = slice(int(live[0]), gz.shape[1])  # from the first column alive on (a view)
        qe = q1 if ends is None else min(q1, int(ends[c].max()) + 1)
        if q0:  # the keys before the block
            out[:, c, :q0] += gz[:, c, q0:qe] @ blk[:, :qe - q0, :q0]
        half = -(-(qe - q0) // 2)
        for s0 in range(q0, qe, half):  # the block's own keys, up to each band's last
            s1 = min(s0 + half, qe)
            out[:, c, q0:s1] += gz[:, c, s0:s1] @ blk[:, s0 - q0:s1 - q0, q0:s1]
        q0 = q1
    return out


def attention_backward_at(fz: Frozen, i: int, g: np.ndarray, at: np.ndarray
                          ) -> tuple[np.ndarray, np.ndarray]:
    """attention_backward of a g [B, T, d] that is zero but at one position per row, at[b]:
    each head sends row b's derivative back to the keys along its pattern's row at[b], an
    outer product (B T H d products, where the whole pattern's would be B T^2 H d_k). As
    factors: the derivative at q is sum_h prof[b, h, q] vecs[b, h] (prof [B, H, T]: the
    pattern's row times the frozen ln1's scale at q; vecs [B, H, d])."""
    b, t, d = g.shape
    h, dk = fz.config.n_head, fz.config.d_k
    kv = fz.W_V[i].shape[0]
    gz = (g[np.arange(b), at] @ fz.W_O[i].reshape(h * dk, d).T).reshape(b, h, dk)
    w_v = np.repeat(fz.W_V[i], h // kv, axis=0)  # [H, d, d_k]: each head's value head
    u = np.einsum("bhk,hdk->bhd", gz, w_v)  # [B, H, d]
    name = f"layers.{i}.{describe(fz.config, i).norm_of('attention')}"
    prof = pattern_rows(fz.weights[i], at, t).transpose(1, 0, 2) * fz.scales[name][:t, 0]
    w, _ = fz.norms[name]
    vecs = u * w  # the norm's derivative at a scale of 1 (the scale is in prof)
    if fz.config.norm != "rms":
        vecs -= vecs.mean(axis=-1, keepdims=True)
    return prof, vecs


def frozen_forward(fz: Frozen, emb: np.ndarray, mlp_outs: list[np.ndarray]
                   ) -> tuple[list[np.ndarray], np.ndarray]:
    """The frozen model from embeddings [T, d], each block's MLP output given ([T, d], at
    fz.site: mlp_out, or Gemma's ln2_post.out, the norm after the MLP then skipped):
    (each block's transcoder input ln2.out, the final norm's output). Each block's steps
    as its description has them (wiring.describe), each add's branches summed in the order
    their steps make them."""
    h, reads = emb, []
    for i in range(fz.config.n_layer):
        if fz.shift is not None and fz.shift[0] == i:
            h = h + fz.shift[1]
        b = describe(fz.config, i)
        order = [s.out for s in b.steps]

        def add(s: Step, stream: np.ndarray, *branches: np.ndarray, order=order) -> np.ndarray:
            for _, x in sorted(zip(s.reads[1:], branches, strict=True),
                               key=lambda rx: order.index(rx[0])):
                stream = stream + x
            return stream

        def written(i: int) -> np.ndarray:  # the block's output, its skip's part too
            return mlp_outs[i] if fz.skip is None else mlp_outs[i] + reads[i] @ fz.skip[i]

        def mlp(s: Step, x: np.ndarray, i=i) -> np.ndarray | None:
            reads.append(x)
            return written(i) if s.out == fz.site else None

        def norm(s: Step, x: np.ndarray | None, i=i) -> np.ndarray:
            if s.out == fz.site:  # the dictionary stands for the MLP and this norm after it
                return written(i)
            return norm_forward(fz, f"layers.{i}.{s.name}", x)

        h = run(b, {"norm": norm, "attention": lambda s, x, i=i: attention_forward(fz, i, x),
                    "mlp": mlp, "add": add}, h)
    return reads, norm_forward(fz, "ln_final", h)


def frozen_backward(fz: Frozen, g: np.ndarray, layer: int, at: np.ndarray | None = None
                    ) -> tuple[list, np.ndarray]:
    """Derivatives at every residual point of targets that read g [B, T, d] at block
    `layer`'s transcoder input (the stream ln2 normalises; `layer` = n_layer: the final
    norm's input): (per block l < layer, at its dictionary's output fz.site (mlp_out, or
    Gemma's ln2_post.out) [B, T, d], or None; at the embeddings). Each block's steps in
    reverse as its description has them, with no path through an MLP: its output is the
    graph's sources. A norm after a branch (Gemma's) is frozen at the run's scale as the
    others are. With `at`, g is zero but at row b's position at[b]: the first attention is
    passed as an outer product, the next with the 1 + H position profiles that leaves (when
    fewer than d_k, and no norm sits between the stream and an attention's output, which
    would rescale the profiles), and every deeper one only up to each row's own position."""
    post: list = [None] * fz.config.n_layer
    factors = None  # g as position profiles times vectors, while that is the cheaper form
    first = True
    factor = (1 + fz.config.n_head < fz.config.d_k and not fz.config.post_norms
              and fz.skip is None)

    def back(i, g):  # through block i's attention and the norm before it (fused)
        nonlocal factors, first
        was_first, first = first, False
        if was_first and at is not None:
            prof, vecs = attention_backward_at(fz, i, g, at)
            if factor:  # g's own part at `at`, then the heads'
                rows = np.arange(len(at))
                delta = np.zeros((len(at), 1, g.shape[1]))
                delta[rows, 0, at] = 1.0
                factors = (np.concatenate([delta, prof], axis=1),
                           np.concatenate([g[rows, at][:, None], vecs], axis=1))
            return prof.transpose(0, 2, 1) @ vecs
        if factors is not None:  # the first attention after: profiles, not d_k columns
            out, factors = attention_backward_factored(fz, i, *factors, at), None
            return out
        return attention_backward(fz, i, g, at)

    def ops_of(i: int, b: Block) -> dict:
        fused = b.norm_of("attention")

        def norm(s: Step, d: np.ndarray) -> tuple:
            if s.out == fz.site:  # the dictionary's output: a source; on only by its skip,
                post[i] = d  # handed to the MLP's step as the derivative at ln2.out
                return (None if fz.skip is None else d @ fz.skip[i].T,)
            if s.name == fused:
                return (d,)  # attention's backward went through it already
            return (norm_backward(fz, f"layers.{i}.{s.name}", d),)  # after a branch, or ln2

        def mlp(s: Step, d: np.ndarray) -> tuple:
            if s.out == fz.site:
                post[i] = d
                return (None if fz.skip is None else d @ fz.skip[i].T,)
            return (d,)  # the skip's derivative at ln2.out, from the norm after the MLP

        return {"attention": lambda s, d: (back(i, d),), "mlp": mlp,
                "norm": norm, "add": lambda s, d: (d,) * len(s.reads)}

    if layer < fz.config.n_layer:  # from the stream the MLP's norm reads, down its block
        b = describe(fz.config, layer)
        g = run_backward(b, ops_of(layer, b), g, start=b.input_of("mlp"))
    for i in reversed(range(layer)):
        b = describe(fz.config, i)
        g = run_backward(b, ops_of(i, b), g)
    return post, g


# ------------------------------------------------------------------ the graph


@dataclass
class Graph:
    ids: list[int]
    position: int
    kinds: list[str]  # per node: feature, error, embedding, bias, logit
    layer: np.ndarray  # per node (embedding -1, logit n_layer, bias -1)
    pos: np.ndarray  # per node (bias -1)
    feature: np.ndarray  # per node: the latent (-1 when not a feature)
    activation: np.ndarray  # per node: a feature's activation, a logit's value, else 1
    tokens_of_logits: list[int]  # the logit nodes' token ids (-1: target minus vs)
    adjacency: np.ndarray  # [rows: the computed targets, sources = every node] edge weights
    targets: np.ndarray  # per adjacency row its node: the visited features, then the logits
    target: int  # the node index of the target logit
    target_token: int
    vs: int | None
    target_value: float
    influence: np.ndarray = field(default_factory=lambda: np.zeros(0))
    node_mask: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    edge_mask: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), bool))
    explained: float = 0.0
    explained_unpruned: float = 0.0
    real_logits: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # memory of the adjacency's shape and dtype that prune may overwrite (visit's normalised
    # copy, already touched): prune's own copy then costs no fresh pages
    scratch: np.ndarray | None = field(default=None, repr=False)
    row_of: np.ndarray = field(init=False)  # per node: its adjacency row, -1 when it has none

    def __post_init__(self):
        self.row_of = np.full(len(self.kinds), -1)
        self.row_of[self.targets] = np.arange(len(self.targets))

    @property
    def n_features(self) -> int:
        return int((self.feature >= 0).sum())

    @property
    def visited(self) -> int:
        """The features whose incoming edges were computed (every one, up to max_features)."""
        return len(self.targets) - len(self.tokens_of_logits)

    @property
    def incoming_total(self) -> float:
        return float(self.adjacency[self.row(self.target)].sum())

    def row(self, node: int) -> int:
        """The adjacency row of a target node (a visited feature or a logit), else -1."""
        return int(self.row_of[node])

    def has_edges(self) -> np.ndarray:
        """Per node: whether a kept edge (edge_mask) goes into it or out of it."""
        touched = self.edge_mask.any(axis=0)
        touched[self.targets[self.edge_mask.any(axis=1)]] = True
        return touched


@dataclass
class Writers:
    """The replacement's dictionaries as the graph reads them, per-layer transcoders and a
    cross-layer one alike: block L's latents read its MLP input (ln2.out) through
    encoders[L], and write decoders[L][k] [m, d] into block L + k's output (per-layer: k = 0
    only; cross-layer: every later block's, circuit-tracer's CLT); block j's output also gets
    b_dec[j]. `site`: the value each block's output stands for (mlp_out; Gemma Scope 2's
    transcoders on Gemma 3: ln2_post.out, the MLP's output after its norm)."""

    encoders: list
    decoders: list[list[np.ndarray]]
    b_dec: list[np.ndarray]
    site: str = "mlp_out"
    skip: list[np.ndarray] | None = None  # per block [d, d]: + ln2.out skip (an affine one)

    @property
    def widths(self) -> list[int]:
        return [e.n_latents for e in self.encoders]

    def written(self, layer: int) -> range:
        """The blocks block `layer`'s latents write into."""
        return range(layer, layer + len(self.decoders[layer]))


def writers_of(transcoders) -> Writers:
    """Writers of a list of per-layer transcoders (analysis/sae.SAE each) or of a
    dictionary.CrossLayerTranscoder. A skip connection (Gemma Scope 2's affine ones) is a
    linear path of the frozen model: the MLP's input, through the frozen ln2, times it."""

    if isinstance(transcoders, Writers):
        return transcoders
    if hasattr(transcoders, "w_dec"):  # a cross-layer transcoder
        return Writers(list(transcoders.encoders),
                       [[np.asarray(w[:, k], np.float64) for k in range(w.shape[1])]
                        for w in transcoders.w_dec],
                       [np.asarray(b, np.float64) for b in transcoders.b_dec],
                       transcoders.site, _skips(transcoders.skip))
    sites = {tc.site.split(".", 2)[2] for tc in transcoders}
    if any(tc.rescale or tc.normalize != "none" for tc in transcoders):
        raise InputError("the graph's decoder vectors are W_dec's rows as they are: a "
                         "transcoder that rescales or normalises is not computed yet")
    skips = [tc.skip is not None for tc in transcoders]
    if len(sites) != 1 or (any(skips) and not all(skips)):
        raise InputError("the transcoders must all predict one value of their block, all with "
                         f"a skip connection or none (they predict {', '.join(sorted(sites))})")
    return Writers(list(transcoders), [[np.asarray(tc.W_dec, np.float64)] for tc in transcoders],
                   [np.asarray(tc.b_dec, np.float64) for tc in transcoders], sites.pop(),
                   _skips([tc.skip for tc in transcoders] if all(skips) else None))


def _skips(skips) -> list[np.ndarray] | None:
    return None if skips is None else [np.asarray(s, np.float64) for s in skips]


def transcoder_features(writers: Writers, values: dict, n_layer: int):
    """Per block the active features of the real run: (layer, pos, latent, act) arrays sorted
    by (layer, position, latent), and each block's error vectors [T, d] (its real output at
    the writers' site less what every dictionary writing into it predicts)."""
    cols, zs = [], []
    for i in range(n_layer):
        z = S.encode(writers.encoders[i], values[f"layers.{i}.ln2.out"])
        pos, lat = np.nonzero(z)
        cols.append((np.full(len(pos), i), pos, lat, z[pos, lat].astype(np.float64)))
        zs.append(z.astype(np.float64))
    errors = [np.asarray(values[f"layers.{j}.{writers.site}"], np.float64) - writers.b_dec[j]
              for j in range(n_layer)]
    if writers.skip is not None:  # the skip's part of the prediction, from the real input
        errors = [e - np.asarray(values[f"layers.{j}.ln2.out"], np.float64) @ writers.skip[j]
                  for j, e in enumerate(errors)]
    for i, z in enumerate(zs):
        for j in writers.written(i):
            errors[j] -= z @ writers.decoders[i][j - i]
    layer, pos, lat, act = (np.concatenate(c) for c in zip(*cols, strict=True))
    return layer, pos, lat, act, errors


def logit_nodes(logits: np.ndarray, target: int | None, vs: int | None, n: int) -> list[int]:
    """The top n tokens at the position, the target (default: the top) among them; with vs,
    a last node for logit[target] - logit[vs] (token -1)."""
    top = [int(i) for i in np.argsort(-logits, kind="stable")[:n]]
    target = top[0] if target is None else target
    if target not in top:
        top.append(target)
    return top + ([-1] if vs is not None else [])


@dataclass
class Sources:
    """What a batch of rows reads: the frozen model, the transcoders, the active features
    (layer, position, latent, activation, sorted), the error vectors and the embeddings, the
    logits' read vectors, and every target's bias edge (features in node order, logits)."""

    fz: Frozen
    writers: Writers
    f_layer: np.ndarray
    f_pos: np.ndarray
    f_lat: np.ndarray
    f_act: np.ndarray
    errors: list[np.ndarray]
    emb: np.ndarray
    logit_reads: np.ndarray
    bias: np.ndarray = field(init=False)
    # per block, per block k after it that its features write into: their a_s W_dec  [T, slots, d]
    slots: list = field(init=False)
    filled: list = field(init=False)  # per block: which slots hold a feature  [T, slots]

    def __post_init__(self):
        self.slots, self.filled = [], []
        t, d = self.emb.shape
        for i in range(len(self.errors)):
            on = self.f_layer == i
            pos = self.f_pos[on]  # in order, each position's features in latent order
            count = np.bincount(pos, minlength=t)
            slot = np.arange(len(pos)) - np.searchsorted(pos, pos)  # its rank at its position
            per = []
            for w in self.writers.decoders[i]:
                vecs = np.zeros((t, max(int(count.max(initial=0)), 1), d))
                vecs[pos, slot] = w[self.f_lat[on]] * self.f_act[on, None]
                per.append(vecs)
            self.slots.append(per)
            self.filled.append(np.arange(per[0].shape[1]) < count[:, None])
        self.bias = _bias_edges(self, t)

    @property
    def nf(self) -> int:
        return len(self.f_lat)


def build(params, config: Config, ids: list[int], transcoders, *,
          target: int | None = None, vs: int | None = None, n_logits: int = N_LOGITS,
          batch: int = BATCH, steering=None, max_features: int | None = MAX_FEATURES,
          demean: bool = False) -> Graph:
    """The unpruned graph of the prediction after the last token of `ids` (of the run
    steered by `steering`, a hooks.Steering on a block's resid_pre, when given: its vector
    is a constant of the frozen model, in the bias node). Every active feature is a node;
    the incoming edges of at most `max_features` of them are computed (None: all), those of
    most influence on the target first (`visit`), so time and memory grow linearly with the
    text once it has more active features than that. `demean`: each logit node is the logit
    minus the vocabulary's mean logit, as circuit-tracer's are (its read vector the head's
    row minus the mean row: the same linear map, so every sum still adds up).
    `transcoders`: per-layer ones (a list of sae.SAE) or a cross-layer one
    (dictionary.CrossLayerTranscoder), as `writers_of` reads them."""
    require(config, "graph", HANDLES)  # its frozen pass has the families' steps only
    writers = writers_of(transcoders)
    real, values = record(params, config, np.asarray(ids), read_paths(config, writers.site),
                          hooks=steering)
    t = len(ids)
    f_layer, f_pos, f_lat, f_act, errors = transcoder_features(writers, values, config.n_layer)
    last = np.asarray(real[-1], np.float64)
    tokens = logit_nodes(last, target, vs, n_logits)
    target = tokens[0] if target is None else target
    if vs == target:

        raise InputError(f"the target and --vs are the same token (id {target}): their "
                         "difference is 0 whatever the text; give --vs another token")
    nf, nl, n = len(f_lat), config.n_layer, config.n_layer * t
    kinds = (["feature"] * nf + ["error"] * n + ["embedding"] * t + ["bias"]
             + ["logit"] * len(tokens))
    cap = nf if max_features is None else max_features
    dtype = adjacency_dtype(min(nf, cap) + len(tokens), len(kinds))
    fz = freeze(params, config, values, steering, dtype, writers.site, writers.skip)
    for i in range(config.n_layer):  # fz holds them now, in causal blocks
        del values[f"layers.{i}.weights"]
    layer = np.concatenate([f_layer, np.repeat(np.arange(nl), t), np.full(t + 1, -1),
                            np.full(len(tokens), nl)]).astype(int)
    pos = np.concatenate([f_pos, np.tile(np.arange(t), nl), np.arange(t), [-1],
                          np.full(len(tokens), t - 1)]).astype(int)
    feature = np.concatenate([f_lat, np.full(len(kinds) - nf, -1)]).astype(int)
    head_rows = unembed_rows(params, config, [i for i in tokens if i >= 0]).astype(np.float64)
    vs_row = unembed_rows(params, config, [vs])[0] if vs is not None else None
    reads = [r for r in head_rows] + ([head_rows[tokens.index(target)] - vs_row]
                                      if vs is not None else [])
    logit_values = [float(last[i]) for i in tokens if i >= 0]
    if demean:  # logit - mean logit; a difference with vs is the same either way
        mean_row = unembed_rows(params, config, slice(None)).mean(axis=0, dtype=np.float64)
        reads = [r - mean_row for r in head_rows] + reads[len(head_rows):]
        logit_values = [v - float(last.mean()) for v in logit_values]
    if vs is not None:
        logit_values.append(float(last[target] - last[vs]))
    activation = np.concatenate([f_act, np.ones(n + t + 1), logit_values])
    src = Sources(fz, writers, f_layer, f_pos, f_lat, f_act, errors,
                  np.asarray(values["embeddings"], np.float64), np.asarray(reads))
    tnode = len(kinds) - len(tokens) + (len(tokens) - 1 if vs is not None
                                        else tokens.index(target))
    adj, targets, scratch = visit(src, len(kinds), tnode, t, batch, cap, dtype)
    return Graph(list(ids), t - 1, kinds, layer, pos, feature, activation, tokens, adj,
                 targets, tnode, target, vs, float(activation[tnode]), real_logits=last,
                 scratch=scratch)


def adjacency_dtype(rows: int, cols: int) -> type:
    """The graph's precision: float64, unless the adjacency would pass ADJACENCY_F64_MB
    (about 45 tokens of the shipped model, every feature visited). Then float32, as the
    model runs: the adjacency, and the products with the frozen patterns (float32 numbers
    already, the real run's), whose p^2 per row is most of a long text's time; the rest of
    each backward pass in float64. The edges are then exact to float32's rounding of sums of
    up to p terms, as the model's own attention is (tested against the float64 graph)."""
    return np.float64 if rows * cols * 8 <= ADJACENCY_F64_MB << 20 else np.float32


def visit(src: Sources, n_nodes: int, tnode: int, t: int, batch: int, cap: int,
          dtype=np.float64) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The adjacency rows and their nodes: the logits' rows first, then the features' (and
    the memory of the rows' normalised copy, for prune to reuse, or None). With
    no more than `cap` features, every one, a block's at a time in position order. With more,
    circuit-tracer's order: the features of most influence on the target (through the rows
    computed so far, as `prune` reckons it) `batch` at a time, until `cap` are visited or no
    unvisited feature has any influence left (then the graph prunes as the uncapped one)."""
    nf, nl = src.nf, len(src.logit_reads)
    rows = min(nf, cap) + nl
    # rows a pass: each [rows, T, d] float64 array of a pass under PASS_MB (past about 32 MB
    # malloc hands out fresh pages every time, and their faults made 2,000 tokens cost 3x
    # 1,000 where the arithmetic is 2x)
    fit = int(max(8, (PASS_MB << 20) // (t * src.fz.config.n_embd * 8)))
    adj = np.zeros((rows, n_nodes), dtype)
    targets = np.full(rows, -1)
    targets[rows - nl:] = np.arange(n_nodes - nl, n_nodes)
    _fill(src, adj, rows - nl, None, t)
    if nf <= cap:
        for lay in range(src.fz.config.n_layer):
            on = np.flatnonzero(src.f_layer == lay)
            per = min(batch, fit)
            for b in range(0, len(on), per):
                _fill(src, adj, int(on[b]), on[b:b + per], t)
        targets[:nf] = np.arange(nf)
        return adj, targets, None
    # the filled rows normalised as prune does, over the columns they can have edges from
    # (only they are read; the rest of the copy is never written)
    a = np.empty_like(adj)
    cols = source_columns(src.f_layer, src.fz.config.n_layer, t)
    row_layer = np.full(rows, -1)
    row_layer[rows - nl:] = src.fz.config.n_layer
    normalise_runs(adj, a, [(slice(rows - nl, rows), cols[-1])])
    seen, done = np.zeros(nf, bool), 0
    while done < cap:
        inf = _influence(a, targets, n_nodes, tnode, runs_of(targets, row_layer, cols))[:nf]
        todo = np.flatnonzero(~seen & (inf > 0))
        if not len(todo):
            break
        take = np.sort(todo[np.argsort(-inf[todo], kind="stable")][:min(batch, cap - done)])
        seen[take] = True
        for lay in np.unique(src.f_layer[take]):  # node order: by block, then position
            on = take[src.f_layer[take] == lay]
            step = min(CHUNK, fit)
            for c in range(0, len(on), step):  # each pass up to its own last position
                nodes = on[c:c + step]
                _fill(src, adj, done, nodes, t)
                targets[done:done + len(nodes)] = nodes
                row_layer[done:done + len(nodes)] = lay
                normalise_runs(adj, a, [(slice(done, done + len(nodes)), cols[lay])])
                done += len(nodes)
    if done < cap:  # every feature of any influence visited: the unused rows go
        keep = np.r_[0:done, rows - nl:rows]
        adj, targets, a = adj[keep], targets[keep], None
    return adj, targets, a


def _fill(src: Sources, adj: np.ndarray, r0: int, nodes: np.ndarray | None, t: int) -> None:
    """Rows r0.. of adj: the incoming edges of the feature nodes `nodes` (one block's, in
    position order) or, None, of the logits. One backward pass through the frozen model,
    over the positions up to the last target's only (nothing later reaches it)."""
    fz, nl = src.fz, src.fz.config.n_layer
    if nodes is None:
        lay, vecs = nl, src.logit_reads
        at = np.full(len(vecs), t - 1)
        bias = src.bias[src.nf:]
    else:
        lay = int(src.f_layer[nodes[0]])
        vecs = src.writers.encoders[lay].W_enc.astype(np.float64)[:, src.f_lat[nodes]].T
        at, bias = src.f_pos[nodes], src.bias[nodes]
    tp = int(at.max()) + 1
    g = np.zeros((len(vecs), tp, fz.config.n_embd))
    g[np.arange(len(vecs)), at] = vecs
    name = "ln_final" if lay == nl else f"layers.{lay}.{describe(fz.config, lay).norm_of('mlp')}"
    post, pre0 = frozen_backward(fz, norm_backward(fz, name, g), lay, at)
    r = slice(r0, r0 + len(vecs))
    for i in range(nl):
        on = np.flatnonzero(src.f_layer == i)
        if not len(on) or post[i] is None:
            continue
        per = 0  # every position's features at once, summed over the blocks they write into
        for j in src.writers.written(i):
            if post[j] is not None:  # [tp, B, d] @ [tp, d, slots]
                per = per + np.matmul(post[j].transpose(1, 0, 2),
                                      src.slots[i][j - i][:tp].transpose(0, 2, 1))
        got = src.filled[i][:tp].ravel()  # the slots in node order: position, latent
        adj[r, on[0]:on[0] + int(got.sum())] = per.transpose(1, 0, 2).reshape(
            len(vecs), -1)[:, got]
    for i, gi in enumerate(post):
        if gi is None:
            continue
        c = src.nf + i * t
        adj[r, c:c + tp] = np.einsum("btd,td->bt", gi, src.errors[i][:tp])
    c = src.nf + nl * t
    adj[r, c:c + tp] = np.einsum("btd,td->bt", pre0, src.emb[:tp])
    adj[r, c + t] = bias


def _bias_edges(src: Sources, t: int) -> np.ndarray:
    """Each target's value in the frozen model with every source at zero (embeddings,
    features, errors): what the constants alone give it (features in node order, logits)."""
    fz = src.fz
    d = fz.config.n_embd
    outs = [np.broadcast_to(b, (t, d)) for b in src.writers.b_dec]
    reads, u = frozen_forward(fz, np.zeros((t, d)), outs)
    out = []
    for lay, x in enumerate(reads):
        tc = src.writers.encoders[lay]
        on = np.flatnonzero(src.f_layer == lay)
        w = tc.W_enc.astype(np.float64)[:, src.f_lat[on]].T  # each feature's own column
        out.append(((x[src.f_pos[on]] - S.centre(tc)) * w).sum(axis=1)
                   + tc.b_enc[src.f_lat[on]])
    out.append(src.logit_reads @ u[t - 1])
    return np.concatenate(out)


# ------------------------------------------------------------------ influence and pruning


def threshold_of(scores: np.ndarray, share: float, chunk: int = 1 << 20) -> float:
    """The smallest score among the largest ones that together make `share` of the total
    (circuit-tracer's find_threshold); the running sum is taken a chunk at a time, so no
    second array of their size is made. Only the scores above a bound are sorted when their
    sum already reaches the share (`_top_part`; the sort of every score was the one part of
    prune that grew faster than the scores), else all of them, in place."""
    if not len(scores):
        return 1.0
    want = share * float(scores.sum(dtype=np.float64))
    top = _top_part(scores, want)
    if top is not None:
        found = _crossing(top, want, chunk)
        if found is not None:
            return found
    found = _crossing(scores, want, chunk)
    return float(scores[0]) if found is None else found  # never reached: the smallest


def _crossing(scores: np.ndarray, want: float, chunk: int) -> float | None:
    """scores sorted in place, then the largest first summed until `want`: the score that
    reaches it (None: they never do)."""
    scores.sort()
    top = scores[::-1]
    running = 0.0
    for start in range(0, len(top), chunk):
        cum = np.cumsum(top[start:start + chunk], dtype=np.float64) + running
        if cum[-1] >= want:
            return float(top[start + int(np.searchsorted(cum, want))])
        running = float(cum[-1])
    return None


def _top_part(scores: np.ndarray, want: float, sample: int = 1 << 14) -> np.ndarray | None:
    """Every score at or above a bound, a new array, when their sum reaches `want`: then the
    largest scores' running sum crosses it among them, at the same score as over them all.
    The bound: the score below which a fixed sample puts most of what the largest may leave
    out (the total less `want`; 0.8 of it; the small scores' sum, unlike the few largest, a sample
    estimates well). None when the scores are few or their top part falls short."""
    n = len(scores)
    if n <= 4 * sample:
        return None
    total = float(scores.sum(dtype=np.float64))
    part = np.sort(scores[np.random.default_rng(0).integers(0, n, sample)])
    below = np.cumsum(part, dtype=np.float64) * (n / sample)  # the sum under each score
    j = int(np.searchsorted(below, (total - want) * 0.8))
    if j == 0:
        return None
    top = scores[scores >= part[j - 1]]
    return top if float(top.sum(dtype=np.float64)) >= want else None


def normalised(adj: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """|adj| with each row divided by its sum (rows of zeros stay zero): a new array, or
    `out` (of adj's shape and dtype) overwritten."""
    a = np.abs(adj, out=out)
    s = a.sum(axis=1, keepdims=True, dtype=np.float64)
    a *= np.divide(1.0, s, out=np.zeros_like(s), where=s > 0).astype(a.dtype)
    return a


def normalise_runs(adj: np.ndarray, out: np.ndarray, runs: list) -> None:
    """`normalised` of adj into out over the runs' rows and columns only (`runs_of`): what
    lies outside them is zero in adj and is neither read nor written."""
    for r, cs in runs:
        s = sum(np.abs(adj[r, c], out=out[r, c]).sum(axis=1, dtype=np.float64) for c in cs)
        inv = np.divide(1.0, s, out=np.zeros_like(s), where=s > 0).astype(out.dtype)[:, None]
        for c in cs:
            out[r, c] *= inv


def source_columns(f_layer: np.ndarray, nl: int, t: int) -> list[list[slice]]:
    """Per target layer L (nl: the logits), the columns where its row of the adjacency can
    be non-zero: a direct effect comes from the features and errors of the blocks before L,
    the embeddings and the bias, never from L's own features or later ones."""
    nf = len(f_layer)
    start = np.searchsorted(f_layer, np.arange(nl + 1))
    emb = nf + nl * t
    return [[c for c in (slice(0, int(start[lay])), slice(nf, nf + lay * t),
                         slice(emb, emb + t + 1)) if c.stop > c.start]
            for lay in range(nl + 1)]


def runs_of(targets: np.ndarray, row_layer: np.ndarray, cols: list | None) -> list:
    """The filled rows (targets >= 0) as runs of consecutive rows of one target layer, each
    with the column slices its rows can be non-zero in (`source_columns`; None: every
    column, the runs then only split where rows are not filled): [(rows, [columns])]."""
    filled = np.flatnonzero(targets >= 0)
    key = np.zeros(len(filled), int) if cols is None else row_layer[filled]
    breaks = np.flatnonzero((np.diff(filled) > 1) | (np.diff(key) != 0)) + 1
    return [(slice(int(r[0]), int(r[-1]) + 1),
             [slice(None)] if cols is None else cols[int(row_layer[r[0]])])
            for r in np.split(filled, breaks) if len(r)]


def graph_runs(graph: Graph, structured: bool = True) -> list:
    """`runs_of` the graph's adjacency rows."""
    nl = int(graph.layer[graph.target])
    cols = (source_columns(graph.layer[:graph.n_features], nl, len(graph.ids))
            if structured else None)
    return runs_of(graph.targets, graph.layer[graph.targets], cols)


def influence_on(graph: Graph, a: np.ndarray, structured: bool = True,
                 runs: list | None = None) -> np.ndarray:
    """Every node's influence on the target through the row-normalised |adjacency| a (rows:
    the visited features' and the logits'), summed over all paths: the target gives 1 to its
    sources in proportion to a's row, each feature passes on what it received the same way
    (a feature without a row, not visited, passes nothing on). structured: a has the
    adjacency's zeros (`source_columns`), whose columns are then not read."""
    return _influence(a, graph.targets, len(graph.kinds), graph.target,
                      graph_runs(graph, structured) if runs is None else runs)


def _influence(a: np.ndarray, targets: np.ndarray, n_nodes: int, start: int, runs: list
               ) -> np.ndarray:
    """influence_on over rows `a` whose nodes are `targets`, a run of rows (`runs_of`) at
    a time over its columns, and only while some of its targets have influence to pass on."""
    total = np.zeros(n_nodes)
    x = np.zeros(n_nodes)
    x[start] = 1.0
    while x.any():
        y = np.zeros(n_nodes, a.dtype)
        for r, cs in runs:
            xr = x[targets[r]]
            if not xr.any():
                continue
            xr = xr.astype(a.dtype)
            for c in cs:
                y[c] += xr @ a[r, c]
        x = y.astype(np.float64)
        total += x
    return total


def prune(graph: Graph, node_threshold: float = NODE_THRESHOLD,
          edge_threshold: float = EDGE_THRESHOLD) -> Graph:
    """Keep the features carrying `node_threshold` of the influence on the target, then the
    edges carrying `edge_threshold` of what flows among the kept nodes (circuit-tracer's
    rule); every embedding, error, bias and logit node stays. Sets influence, the masks and
    the explained fractions. Works in place on one normalised copy of the adjacency, and
    on the columns each row can have edges from only (`source_columns`: the others are
    zero), so the adjacency's never-written zeros are not read and the copy's not written."""
    nf = graph.n_features
    runs = graph_runs(graph)
    a = np.empty_like(graph.adjacency) if graph.scratch is None else graph.scratch
    graph.scratch = None  # a is it now, and goes with this call
    normalise_runs(graph.adjacency, a, runs)
    inf = influence_on(graph, a, runs=runs)
    leaves = np.array([k in ("embedding", "bias") for k in graph.kinds])
    graph.explained_unpruned = float(inf[leaves].sum())
    keep = np.ones(len(graph.kinds), bool)
    order = np.argsort(-inf[:nf], kind="stable")
    cum = np.cumsum(inf[:nf][order]) / max(inf[:nf].sum(), 1e-300)
    keep[:nf] = False
    keep[order[: int(np.searchsorted(cum, node_threshold) + 1)]] = True
    keep[:nf] &= inf[:nf] > 0  # a rounded cumulative sum short of 1 must not take the zeros
    dropped = ~keep[graph.targets]
    for r, cs in runs:  # the dropped features' rows and columns: a_kept
        for c in cs:
            blk = a[r, c]
            blk[dropped[r]] = 0
            blk[:, ~keep[c]] = 0
    inf_kept = influence_on(graph, a, runs=runs)
    row_inf = inf_kept[graph.targets]  # a logit's is 0: nothing reads a logit
    row_inf[graph.row(graph.target)] = 1.0
    scale = row_inf[:, None].astype(a.dtype)
    back = np.where(row_inf > 0, row_inf, 1)[:, None].astype(a.dtype)
    scores = []
    for r, cs in runs:  # each edge's score
        for c in cs:
            blk = a[r, c]
            blk *= scale[r]
            scores.append(blk[blk > 0])
    threshold = threshold_of(np.concatenate(scores) if scores else np.zeros(0), edge_threshold)
    del scores
    edges = np.zeros(a.shape, bool)
    for r, cs in runs:
        for c in cs:
            blk = a[r, c]
            e = edges[r, c]
            np.greater_equal(blk, threshold, out=e)
            blk /= back[r]  # back to a_kept
            blk *= e
    graph.influence, graph.node_mask, graph.edge_mask = inf, keep, edges
    graph.explained = float(influence_on(graph, a, runs=runs)[leaves].sum())
    return graph


# ------------------------------------------------------------------ interventions on features


def feature_node(graph: Graph, spec: str, latents: list[int] | None = None) -> int:
    """The node of a feature named as the JSON names it, LAYER_FEATURE_POSITION (0_314_5);
    `latents`: each block's transcoder's width, to tell a latent that does not exist from
    one that is not active."""

    parts = spec.split("_")
    if len(parts) != 3 or not all(p.lstrip("-").isdigit() for p in parts):
        raise InputError(f"a feature is named LAYER_FEATURE_POSITION, as the graph's JSON "
                         f"names it (e.g. 0_314_5), not {spec!r}")
    lay, lat, pos = (int(p) for p in parts)
    n_layer = int(graph.layer[graph.target])  # the logits' layer: after the last block
    width = latents[lay] if latents is not None and 0 <= lay < len(latents) else None
    for what, value, end in (("layer", lay, n_layer), ("feature", lat, width),
                             ("position", pos, graph.position + 1)):
        if value < 0 or value >= (end if end is not None else value + 1):
            known = f" (the {what}s are 0-{end - 1})" if end is not None else ""
            raise InputError(f"feature {spec}: there is no {what} {value}{known}")
    nf = graph.n_features
    hit = np.flatnonzero((graph.layer[:nf] == lay) & (graph.feature[:nf] == lat)
                         & (graph.pos[:nf] == pos))
    if not len(hit):
        raise InputError(f"feature {spec} is not active in this text (the graph's features "
                         "are its active ones; see graph --json)")
    return int(hit[0])


def predicted_change(graph: Graph, changes: dict[int, float]) -> float:
    """The target's change the graph predicts when feature nodes take new activations
    {node: value}: each change spreads along the edges, a feature's pre-activation moving
    by the sum of its sources' changes times edge / source activation, and moving its
    activation as much while it stays active (the linear replacement model's answer; a
    feature whose incoming edges were not computed, past max_features, stays as it was)."""
    nf = graph.n_features
    delta = np.zeros(len(graph.kinds))
    for node, value in changes.items():
        delta[node] = value - graph.activation[node]
    per_unit = graph.adjacency[:, :nf] / graph.activation[:nf]  # [rows, feature sources]
    order = np.lexsort((graph.pos[:nf], graph.layer[:nf]))  # sources before their targets
    for n in order:
        if n in changes or graph.row_of[n] < 0:  # not visited: its inputs are not known
            continue
        delta[n] = per_unit[graph.row_of[n]] @ delta[:nf]
    return float(per_unit[graph.row(graph.target)] @ delta[:nf])


def real_change(params, config: Config, ids: list[int], transcoders,
                graph: Graph, changes: dict[int, float], steering=None) -> float:
    """The target's change in the real model when each feature's decoder contribution is
    moved to its new activation (mlp_out + (new - old) W_dec[j] at its position, in every
    block a cross-layer feature writes into; the rest of the MLP as it was), downstream
    features free to change as the model computes."""

    writers = writers_of(transcoders)
    fns: dict[str, list] = {}
    named = []
    for node, value in changes.items():
        lay, lat, pos = int(graph.layer[node]), int(graph.feature[node]), int(graph.pos[node])
        for j in writers.written(lay):
            shift = (value - graph.activation[node]) * writers.decoders[lay][j - lay][lat]
            fns.setdefault(f"layers.{j}.{writers.site}", []).append((pos, shift))
        named.append(f"{lay}_{lat}_{pos}={value:g}")

    def adder(items):
        def fn(v):
            v = v.copy()
            for pos, shift in items:
                v[pos] += shift
            return v
        return fn


    logits = forward(params, config, np.asarray(ids),
                     hooks=chained(steering, Replace(
                         {p: adder(items) for p, items in fns.items()},
                         who=f"the features' new values ({', '.join(named)})")))[-1]
    value = logits[graph.target_token] - (0 if graph.vs is None else logits[graph.vs])
    return float(value - graph.target_value)


# ------------------------------------------------------------------ supernodes


GROUP_SIMILARITY = 0.6
GROUP_TOLERANCE = 0.05


def profiles(graph: Graph, nodes: np.ndarray) -> np.ndarray:
    """Each feature's attribution profile in the pruned graph: its kept incoming and
    outgoing edges, each side scaled to unit length.  -> [len(nodes), rows + cols]"""
    a = np.where(graph.edge_mask, graph.adjacency, 0)
    out_edges = a[:, nodes].T  # [n, rows]: into each target
    rows = graph.row_of[nodes]
    in_edges = np.where((rows >= 0)[:, None], a[rows], 0)  # [n, cols]: from each source
    parts = []
    for m in (out_edges, in_edges):
        norm = np.linalg.norm(m, axis=1, keepdims=True)
        parts.append(np.divide(m, norm, out=np.zeros(m.shape), where=norm > 0))
    return np.concatenate(parts, axis=1)


def group(graph: Graph, peaks: dict[int, set] | None = None,
          similarity: float = GROUP_SIMILARITY) -> list[list[int]]:
    """Supernodes: the pruned graph's features at each position merged, average linkage,
    while the mean similarity of two groups is at least `similarity`; two features' similarity
    is the mean of the cosine of their attribution profiles (what they read and what they
    feed) and, when `peaks` (node -> the tokens at its top windows' peaks) is given, the
    overlap (Jaccard) of those tokens. Position first: a supernode stands for one place in
    the text, as the viewer draws it. Returns the groups (node lists) of two or more."""
    nf = graph.n_features
    kept = np.flatnonzero(graph.node_mask[:nf] & graph.has_edges()[:nf])
    groups = []
    for p in np.unique(graph.pos[kept]):
        nodes = kept[graph.pos[kept] == p]
        if len(nodes) < 2:
            continue
        prof = profiles(graph, nodes)
        sim = prof @ prof.T / 2  # two unit halves: the mean of the two cosines
        if peaks is not None:
            for i, a in enumerate(nodes):
                for j, b in enumerate(nodes):
                    pa, pb = peaks.get(int(a), set()), peaks.get(int(b), set())
                    jac = len(pa & pb) / len(pa | pb) if pa | pb else 0.0
                    sim[i, j] = (sim[i, j] + jac) / 2
        groups += [[int(nodes[i]) for i in g] for g in _average_linkage(sim, similarity)
                   if len(g) > 1]
    return groups


def _average_linkage(sim: np.ndarray, threshold: float) -> list[list[int]]:
    clusters = [[i] for i in range(len(sim))]
    while len(clusters) > 1:
        best, pair = -np.inf, None
        for i in range(len(clusters)):
            for j in range(i + 1, len(clusters)):
                s = sim[np.ix_(clusters[i], clusters[j])].mean()
                if s > best:
                    best, pair = s, (i, j)
        if best < threshold:
            break
        i, j = pair
        clusters[i] += clusters.pop(j)
    return clusters


def grouped_explained(graph: Graph, groups: list[list[int]]) -> float:
    """`explained` with each group one node: its members' edges summed (in and out, signed,
    edges among members dropped), normalised over every incoming edge as prune does, an
    edge kept where any member's was; then the same influence from the target."""
    full = _merged(graph, groups, graph.adjacency.astype(np.float64))
    kept = _merged(graph, groups, graph.edge_mask.astype(np.float64)) > 0
    inf = influence_on(graph, normalised(full) * kept, structured=False)
    leaves = np.array([k in ("embedding", "bias") for k in graph.kinds])
    return float(inf[leaves].sum())


def _merged(graph: Graph, groups: list[list[int]], a: np.ndarray) -> np.ndarray:
    """a [rows, nodes] with each group's members' columns added into one member's (the
    first with a row), their rows into its row, the others' zero."""
    n = len(graph.kinds)
    of = np.arange(n)
    reps = []
    for g in groups:
        reps.append(next((m for m in g if graph.row_of[m] >= 0), g[0]))
        of[g] = reps[-1]
    cols = np.zeros((a.shape[0], n))
    np.add.at(cols.T, of, a.T)
    rows = np.zeros_like(cols)
    np.add.at(rows, graph.row_of[of[graph.targets]], cols)
    for rep in reps:
        if graph.row_of[rep] >= 0:
            rows[graph.row_of[rep], rep] = 0  # edges among a group's members are inside it
    return rows
