"""Direct logit attribution: how much each part of the final residual stream adds to one logit.

The stream at the end is a plain sum,

    h = W_E[t] + W_P[p] + sum_L ( sum_h z_h W_O[h] + b_O[L] ) + sum_L ( mlp_post W_2 + b_2[L] )

and the logit of token y is ((h - mean h) / s * g + b) . W_E[y], with s the final norm's std
*from the real forward pass*. Centring is linear, so with s held at its real value every part
contributes (part - mean part) / s . (g * W_E[y]), and the final norm's bias adds b . W_E[y]:
the rows add up to the logit exactly. With --vs the direction is W_E[y] - W_E[vs] and the
rows add up to the logit difference.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..transformer.config import Config
from ..transformer.hooks import Steering
from ..transformer.model import neuron_out_rows, norm_weights, unembed_rows
from ..transformer.schema import head_name
from ..transformer.trace import Trace
from ..transformer.wiring import FAMILIES, describe, handles
from .question import ask

# The blocks this analysis implements (wiring.require refuses others by name): the stream split
# into heads' and MLPs' outputs (Trace.residual_parts), each through the norm after its branch
# (Gemma's) with that norm's scale frozen at the run, so the parts still add up.
HANDLES = handles(step=FAMILIES["step"] + ("norm after attention", "norm after the MLP"))

BIAS_ROW = "ln_final.bias"


def unembed_direction(params: dict[str, np.ndarray], config: Config, target: int,
                      vs: int | None) -> np.ndarray:
    """W_U[target] (- W_U[vs]): the direction whose dot with ln_final.out is the score. [d]"""
    rows = unembed_rows(params, config, [target] if vs is None else [target, vs])
    rows = rows.astype(np.float64)
    return rows[0] - (rows[1] if vs is not None else 0.0)


def attribute_parts(parts: np.ndarray, scale: float, gain: np.ndarray,
                    direction: np.ndarray, centre: bool = True) -> np.ndarray:
    """Each part centred (LayerNorm; an RMSNorm does not centre), divided by the final
    norm's std (or rms), dotted with g * direction.  [P, d] -> [P]"""
    centred = parts - parts.mean(axis=-1, keepdims=True) if centre else parts
    return centred @ (np.asarray(gain, np.float64) * direction) / float(scale)


@dataclass
class DLA:
    labels: list[str]  # one per row; the last is the final norm's bias (LayerNorm models)
    values: np.ndarray  # [P]: each row's share of the score, float64
    score: float  # the real logit (or logit difference) at the position
    heads: np.ndarray  # [n_layer, n_head], the head rows as a grid
    neurons: list[dict]  # with --neurons: the largest single neurons, each {layer, neuron, value}
    # the norms whose scales, frozen at the run, each head's and each MLP's part passes
    frozen: dict[str, list[str]] = field(default_factory=lambda: {"heads": ["ln_final"],
                                                                   "mlp": ["ln_final"]})

    @property
    def total(self) -> float:
        return float(self.values.sum())


def direct_logit_attribution(trace: Trace, params: dict[str, np.ndarray], config: Config,
                             position: int, target: int, vs: int | None = None,
                             neurons: int = 0, steer=None) -> DLA:
    """Split the score of `target` (minus `vs`) at `position` into the residual stream's parts
    (with `steer`, a steered run's hooks.Steering, the steering vector is one of them).

    `neurons` > 0 also splits each MLP row into its neurons mlp_post[n] W_2[n] (plus b_2) and
    keeps the `neurons` largest by size; the MLP rows stay whole, so the rows still add up.
    """
    direction = unembed_direction(params, config, target, vs)
    gain, shift = norm_weights(params, "ln_final")
    centre = config.norm == "layer"  # an RMSNorm divides by the rms alone: no mean, no bias
    scale = float(trace.get("ln_final.std" if centre else "ln_final.rms")[position, 0])
    labels, parts = trace.residual_parts(params, position, steer)  # the stream, in parts
    values = attribute_parts(parts, scale, gain, direction, centre)
    logits = trace.get("logits")[position].astype(np.float64)
    score = logits[target] - (logits[vs] if vs is not None else 0.0)
    heads = np.array([[values[labels.index(head_name(i, h))] for h in range(config.n_head)]
                      for i in range(config.n_layer)])
    top = neuron_attribution(trace, params, config, position, scale, gain, direction, neurons) \
        if neurons else []
    frozen = frozen_norms(config)
    if shift is None:
        return DLA(labels, values, float(score), heads, top, frozen)
    bias = float(np.asarray(shift, np.float64) @ direction)
    return DLA(labels + [BIAS_ROW], np.append(values, bias), float(score), heads, top, frozen)


def frozen_norms(config: Config) -> dict[str, list[str]]:
    """The norms a head's part and an MLP's part pass on their way to the logit: a norm after
    the branch (Gemma 3's ln1_post, ln2_post), then the final norm."""
    steps = describe(config, 0).steps
    return {part: [*(s.name for s in steps if s.op == "norm" and s.reads[0] == out),
                   "ln_final"] for part, out in (("heads", "attn_out"), ("mlp", "mlp_out"))}


def neuron_values(trace: Trace, params, config: Config, layer: int, position: int,
                  scale: float, gain: np.ndarray, direction: np.ndarray) -> np.ndarray:
    """Each neuron's share mlp_post[n] * (W_2[n] centred) / s . (g * direction). [ff]

    Their sum plus the bias b_2's share is the layer's MLP row.
    """
    w2 = neuron_out_rows(params, layer).astype(np.float64)  # [ff, d]
    post = trace.get(f"layers.{layer}.mlp_post")[position].astype(np.float64)  # [ff]
    w2 = trace.frozen_post_norm(params, layer, "mlp_out", w2, position)  # Gemma's, frozen
    read = attribute_parts(w2, scale, gain, direction,  # [ff]: one unit of each neuron
                           config.norm == "layer")
    return post * read


def neuron_attribution(trace, params, config: Config, position: int, scale: float, gain,
                       direction, k: int) -> list[dict]:
    """The k neurons of any block with the largest share by size."""
    values = np.stack([neuron_values(trace, params, config, i, position, scale, gain, direction)
                       for i in range(config.n_layer)])  # [n_layer, ff]
    order = np.argsort(-np.abs(values), axis=None, kind="stable")[:k]
    rows = []
    for flat in order:
        i, n = divmod(int(flat), values.shape[1])
        rows.append({"layer": i, "neuron": n, "value": float(values[i, n]),
                     "activation": float(trace.get(f"layers.{i}.mlp_post")[position, n])})
    return rows


@dataclass
class DLAReport:
    q: object  # analysis.question.Question
    dla: DLA


def dla_report(session, position: int, target: str | None, vs: str | None,
               neurons: int = 0) -> DLAReport:

    p = session.position(position)
    tr = session.trace()
    q = ask(session, tr.get("logits")[p], p, target, vs)
    return DLAReport(q, direct_logit_attribution(tr, session.params, session.config, p,
                                                 q.target, q.vs, neurons, steering(session)))


def steering(session):
    """The session's hooks.Steering (site and shift), or None for an unsteered run."""

    return session.steering if isinstance(session.steering, Steering) else None
