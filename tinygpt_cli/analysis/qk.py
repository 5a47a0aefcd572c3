"""QK attribution: one head's pre-softmax scores split by where the query and the key came from.

The stream entering block L is a sum of parts: the token embedding, the position embedding,
each earlier head's output z_h W_O[h], each earlier MLP's output without its bias, and the
output biases of the earlier blocks (and, in a steered run, the steering vector, from the
block it is added before). With the LayerNorm's mean and scale frozen at the run's
values, ln1 is linear in that sum, so the head's query and key are sums of one term per part,
plus a constant (ln1's bias through W_q, and b_q; the same for keys):

    q = sum_a (centre(part_a) / std) * g W_q[h]  +  (b W_q[h] + b_q[h])

and the score q_P . k_j / sqrt(d_k) is the sum over every (query part, key part) pair. The
terms add up to the recorded score (tests/test_circuit.py and, on every family,
tests/test_families_analyses.py check it).

Other families: an RMSNorm divides by the run's rms alone (no centring, no shift). Qwen3 then
norms each head's q and k on their own, q / rms_q * w_q: with rms_q frozen at the run's (as
ln1's scale is) that is linear too, so each term of q is divided by the query's rms_q and
multiplied by w_q (each term of k by its key's rms_k and w_k). With rotary positions each
term is then turned by its position, as the pass turns the whole q and k: the turn is linear,
so the terms of the rotated vectors still sum to the score.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..transformer import ops
from ..transformer.config import Config
from ..transformer.model import mlp_out_bias, norm_weights, qk_norm_rms, qk_norm_weights
from ..transformer.trace import Trace
from ..transformer.wiring import FAMILIES, describe, handles
from .circuit import head_weights, norm_after

# The blocks this analysis implements (wiring.require refuses others by name): the score split by
# the parts of the stream (Trace.residual_parts, Gemma 3's norms after each branch frozen).
HANDLES = handles(step=FAMILIES["step"] + ("norm after attention", "norm after the MLP"))


@dataclass
class QK:
    layer: int
    head: int
    query: int  # the query position
    sources: list[str]  # the parts, the same list on both sides
    terms: np.ndarray  # [sources (query side), sources (key side), keys 0..query]
    scores: np.ndarray  # [keys] the recorded pre-softmax scores
    weights: np.ndarray  # [keys] the attention weights
    window: int = 0  # keys the query sees, itself included (0: all; Gemma's sliding blocks)


def key_position(r: QK, key: int | None) -> int:
    """--key, checked against the keys query r.query attends to (negatives from the end);
    default: the key it attends to most."""
    p = r.query
    k = int(r.weights.argmax()) if key is None else key
    if not -(p + 1) <= k <= p:
        raise InputError(f"--key {key} is out of range: query position {p} attends to keys "
                         f"0..{p} (or -{p + 1}..-1 from the end)")
    first = max(0, p + 1 - r.window) if r.window else 0
    if k % (p + 1) < first:  # masked: its score is -inf, which no sum of terms makes
        raise InputError(f"--key {key} is before the window of block {r.layer}: query "
                         f"position {p} sees keys {first}..{p} alone (the last {r.window})")
    return k % (p + 1)


def stream_parts(params, config: Config, values: dict[str, np.ndarray], layer: int,
                 steer=None) -> tuple[list[str], np.ndarray]:
    """The parts that add up to the stream entering block `layer`: names, [P, T, d].
    Trace.residual_parts' parts in qk's names (L0H1, L0.mlp; _qk_name), each MLP's output
    without its bias (unless a norm follows it), and every output bias summed into one part,
    "biases". `steer` (hooks.Steering, adding `shift` to layers.S.resid_pre) is a part from
    block S on."""
    labels, parts = Trace(values, config).residual_parts(params, steer=steer, layer=layer)
    names, kept, bias = [], [], np.zeros(config.n_embd)
    for label, part in zip(labels, parts, strict=True):
        if label.endswith(".attn_bias"):  # the same at every position: one vector
            bias = bias + part.reshape(-1, config.n_embd)[0]
            continue
        if label.endswith(".mlp") and not norm_after(config, int(label[1:-4]), "mlp_out"):
            b_mlp = mlp_out_bias(params, config, int(label[1:-4]))
            bias, part = bias + b_mlp, part - b_mlp
        names.append(_qk_name(label))
        kept.append(part)
    return [*names, "biases"], np.stack([*kept, np.broadcast_to(bias, parts[0].shape)])


def _qk_name(label: str) -> str:
    """A label of Trace.residual_parts as qk names it: the heads and MLPs by their one short
    name (L0H1, L0.mlp, as every view), the embeddings as "token" and "position"."""
    return {"token_embedding": "token", "position_embedding": "position"}.get(label, label)


def side_terms(parts: np.ndarray, std: np.ndarray, g: np.ndarray, b: np.ndarray | None,
               w: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """One head's query (or key) split by part through the frozen norm: [P + 1, T, d_k],
    the last row the constant b W + bias. A LayerNorm centres each part and divides by the
    run's std; an RMSNorm (b None) divides by the run's rms alone."""
    centred = parts - parts.mean(axis=-1, keepdims=True) if b is not None else parts
    through = (centred / std * g) @ w  # [P, T, d_k]
    shift = b @ w if b is not None else 0.0
    constant = np.broadcast_to(shift + bias, through.shape[1:])
    return np.concatenate([through, constant[None]])


def has_part(name: str, config: Config) -> bool:
    """Whether the family has the part at all: a model without output biases (Llama) has no
    "biases" in its stream, one with an RMSNorm and no q/k biases no constant "bias" term;
    rows of zeros by construction are left out, not shown."""
    if name == "biases":
        return config.out_bias or config.mlp_bias
    return name != "bias" or config.qkv_bias


def through_head_norm(terms: np.ndarray, rms: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Qwen3's per-head RMSNorm of q (or k) applied to each of its terms, the rms frozen at
    the run's: term / rms * w, linear, so the terms still sum to the normed vector.
    [P + 1, T, d_k] / [T, 1] * [d_k] -> [P + 1, T, d_k]"""
    return terms / rms * w


def qk_attribution(params, config: Config, values: dict[str, np.ndarray], layer: int,
                   head: int, query: int, steer=None) -> QK:
    """The scores of head `head` of block `layer` at query position `query`, split by part
    (the values of a run steered by `steer`, when given, whose vector is a part). With rotary
    positions each part's q and k terms are turned by their positions, as the pass turns the
    whole q and k: the turn is linear, so the terms still sum to the score. With Qwen3's
    norms of q and k each term is first divided by the run's rms of its head's q (or k) and
    multiplied by the norm's scale (through_head_norm). The stream's parts are as the block
    reads them: a part that passed a norm after its branch (Gemma 3) is scaled by that norm's
    weight and the run's rms (Trace.residual_parts)."""
    a = describe(config, layer).attention
    names, parts = stream_parts(params, config, values, layer, steer)
    g, b = (None if a is None else np.asarray(a, np.float64)
            for a in norm_weights(params, f"layers.{layer}.ln1"))
    kv = head // (config.n_head // config.kv_heads)  # the key head this query head reads
    wq, wk, _, bq, bk, _, _ = (np.asarray(a, np.float64)
                               for a in head_weights(params, config, layer))
    scale = "std" if b is not None else "rms"
    std = np.asarray(values[f"layers.{layer}.ln1.{scale}"], np.float64)  # [T, 1]
    q = side_terms(parts[:, query:query + 1], std[query:query + 1], g, b, wq[head], bq[head])
    k = side_terms(parts[:, :query + 1], std[:query + 1], g, b, wk[kv], bk[kv])
    if a.qk_norm:
        rms_q, rms_k = (np.asarray(a, np.float64) for a in qk_norm_rms(params, config, values,
                                                                      layer))
        w_q, w_k = (np.asarray(a, np.float64) for a in qk_norm_weights(params, layer))
        q = through_head_norm(q, rms_q[head, query:query + 1], w_q)
        k = through_head_norm(k, rms_k[kv, :query + 1], w_k)
    if a.rotary:  # the block's own base (Gemma 3: one for sliding blocks, one for full)
        rope = (a.rotary, a.rotary_base, a.rope_scaling)
        q, k = ops.rotary(q, query, *rope), ops.rotary(k, 0, *rope)
    names = [*names, "norm bias" if b is not None else "bias"]
    keep = [i for i, name in enumerate(names) if has_part(name, config)]
    terms = np.einsum("ad,bjd->abj", q[keep, 0], k[keep]) * config.scale
    path = f"layers.{layer}.heads.{head}."
    return QK(layer, head, query, [names[i] for i in keep], terms,
              np.asarray(values[path + "scores"][query, :query + 1], np.float64),
              np.asarray(values[path + "weights"][query, :query + 1], np.float64), a.window)
