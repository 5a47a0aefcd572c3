"""QK attribution: one head's pre-softmax scores split by where the query and the key came from.

The stream entering block L is a sum of parts: the token embedding, the position embedding,
each earlier head's output z_h W_O[h], each earlier MLP's output without its bias, and the
output biases of the earlier blocks (and, in a steered run, the steering vector, from the
block it is added before). With the LayerNorm's mean and scale frozen at the run's
values, ln1 is linear in that sum, so the head's query and key are sums of one term per part,
plus a constant (ln1's bias through W_q, and b_q; the same for keys):

    q = sum_a (centre(part_a) / std) * g W_q[h]  +  (b W_q[h] + b_q[h])

and the score q_P . k_j / sqrt(d_k) is the sum over every (query part, key part) pair. The
terms add up to the recorded score (tests/test_circuit_qk.py checks it to 1e-5).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import Config
from .circuit import head_weights


@dataclass
class QK:
    layer: int
    head: int
    query: int  # the query position
    sources: list[str]  # the parts, the same list on both sides
    terms: np.ndarray  # [sources (query side), sources (key side), keys 0..query]
    scores: np.ndarray  # [keys] the recorded pre-softmax scores
    weights: np.ndarray  # [keys] the attention weights


def stream_parts(params, config: Config, values: dict[str, np.ndarray], layer: int,
                 steer=None) -> tuple[list[str], np.ndarray]:
    """The parts that add up to the stream entering block `layer`: names, [P, T, d].
    `steer` (hooks.Steering, adding `shift` to layers.S.resid_pre) is a part from block S on."""
    names, parts = ["token", "position"], [values["token_embeddings"],
                                           values["position_embeddings"]]
    bias = np.zeros(config.n_embd)
    entry = int(steer.site.split(".")[1]) if steer is not None else None
    for i in range(layer + 1):
        if i == entry:
            names.append("steer")
            parts.append(np.broadcast_to(steer.shift, parts[0].shape))
        if i == layer:
            break
        wo = head_weights(params, config, i)[-1]
        for h in range(config.n_head):
            names.append(f"a{i}.h{h}")
            parts.append(values[f"layers.{i}.z"][h] @ wo[h])
        names.append(f"m{i}")
        b_mlp = params[f"h.{i}.mlp.c_proj.bias"]
        parts.append(values[f"layers.{i}.mlp_out"] - b_mlp)
        bias = bias + params[f"h.{i}.attn.c_proj.bias"] + b_mlp
    names.append("biases")
    parts.append(np.broadcast_to(bias, parts[0].shape))
    return names, np.stack([np.asarray(p, np.float64) for p in parts])


def side_terms(parts: np.ndarray, std: np.ndarray, g: np.ndarray, b: np.ndarray,
               w: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """One head's query (or key) split by part through the frozen norm: [P + 1, T, d_k],
    the last row the constant b W + bias."""
    centred = parts - parts.mean(axis=-1, keepdims=True)
    through = (centred / std * g) @ w  # [P, T, d_k]
    constant = np.broadcast_to(b @ w + bias, through.shape[1:])
    return np.concatenate([through, constant[None]])


def qk_attribution(params, config: Config, values: dict[str, np.ndarray], layer: int,
                   head: int, query: int, steer=None) -> QK:
    """The scores of head `head` of block `layer` at query position `query`, split by part
    (the values of a run steered by `steer`, when given, whose vector is a part)."""
    names, parts = stream_parts(params, config, values, layer, steer)
    p = f"h.{layer}."
    g, b = (np.asarray(params[p + n], np.float64) for n in ("ln_1.weight", "ln_1.bias"))
    wq, wk, _, bq, bk, _, _ = (np.asarray(a, np.float64)
                               for a in head_weights(params, config, layer))
    std = np.asarray(values[f"layers.{layer}.ln1.std"], np.float64)  # [T, 1]
    q = side_terms(parts[:, query:query + 1], std[query:query + 1], g, b, wq[head], bq[head])
    k = side_terms(parts[:, :query + 1], std[:query + 1], g, b, wk[head], bk[head])
    terms = np.einsum("ad,bjd->abj", q[:, 0], k) / np.sqrt(wq.shape[-1])
    path = f"layers.{layer}.heads.{head}."
    return QK(layer, head, query, [*names, "norm bias"], terms,
              np.asarray(values[path + "scores"][query, :query + 1], np.float64),
              np.asarray(values[path + "weights"][query, :query + 1], np.float64))
