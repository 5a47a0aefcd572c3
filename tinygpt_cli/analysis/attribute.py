"""Input attribution: how much each input token matters to one score, from the backward pass.

The score is f = logit[target] (- logit[vs]) at one position, seen as a function of the token
embeddings x = W_E[ids] [T, d], with the position embeddings held as they are (they are not
the input a person chose). With g = df/dx:

- grad: g_t . x_t / |x_t| (signed: does moving along the token's own direction raise f?)
  and |g_t|;
- grad-x-input: g_t . x_t, the first-order share of x_t;
- integrated gradients: (x_t - b_t) . mean_k g(b + a_k (x - b)), a_k = (k + 1/2) / N (the
  midpoint rule), b the baseline (zeros, or another text's token embeddings); the scores add
  up to f(x) - f(b) as N grows, and the gap is reported;
- attention-x-grad: for each head, sum over queries of A[q, k] * df/dA[q, k], per key token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..transformer.config import Config
from ..transformer.hooks import Replace
from ..transformer.model import backward, cut_head, record, token_embeddings_of
from ..transformer.wiring import FORWARD
from ..words import count
from .dla import steering
from .question import ask

# The blocks this analysis implements (wiring.require refuses others by name): the model's own
# backward to the embeddings.
HANDLES = FORWARD

STEP_TOKENS = 2048  # integrated gradients: tokens per batched pass

METHODS = ("grad", "grad-x-input", "integrated-gradients", "attention-x-grad")


def gradients(params, config: Config, ids: Sequence[int], position: int, target: int,
              vs: int | None, token_embeddings: np.ndarray | None = None, steer=None,
              amounts: np.ndarray | None = None):
    """f and df/d values at the given token embeddings ([T, d] or a batch [N, T, d]; default
    the text's own). Returns (f, value gradients by path, recorded values).

    The head is cut to the rows of target and vs (f reads nothing else), and the token
    embeddings enter through a hook, so the passes never touch the 4,096-row table. `steer`
    (hooks.Steering) adds its shift to its site, times `amounts` [N] for a batch (default 1).
    """
    x = token_embeddings_of(params, config, ids) if token_embeddings is None else token_embeddings
    rows = [target] + ([vs] if vs is not None else [])
    head = cut_head(params, config, rows)
    zeros = np.zeros(x.shape[:-1], dtype=np.int64)
    fns = {"token_embeddings": lambda _: x}
    if steer is not None:
        c = np.ones(x.shape[:-2]) if amounts is None else np.asarray(amounts, np.float64)
        shift = c[..., None, None] * steer.shift  # [.., 1, d]: every position
        fns[steer.site] = lambda h: h + shift.astype(h.dtype)
    logits, values = record(head, config, zeros, hooks=Replace(fns))  # [.., T, R]
    sign = np.array([1.0, -1.0][: len(rows)], dtype=logits.dtype)
    dlogits = np.zeros_like(logits)
    dlogits[..., position, :] = sign
    _, grads = backward(head, config, values, dlogits, wrt_values=True)
    f = np.asarray(logits[..., position, :], np.float64) @ sign.astype(np.float64)
    return f, grads, values


@dataclass
class Attribution:
    method: str
    scores: np.ndarray  # [T], or [n_layer, n_head, T] for attention-x-grad
    f: float  # the score at the input
    grad_norm: np.ndarray | None = None  # [T], for grad
    f_baseline: float | None = None  # integrated gradients
    steps: int | None = None
    steer: float | None = None  # a steered run: the steering vector's own term

    @property
    def gap(self) -> float | None:
        """sum(scores) (+ steer) - (f(input) - f(baseline)): how far IG is from complete."""
        if self.f_baseline is None:
            return None
        total = self.scores.sum() + self.steer if self.steer is not None else self.scores.sum()
        return float(total - (self.f - self.f_baseline))


def steer_term(g: dict, steer, scale: bool = True) -> float | None:
    """The steering vector's term: its shift . the gradient at its site summed over the
    positions (scale=False: . the shift's unit direction, as `grad` reads the tokens)."""
    if steer is None:
        return None
    shift = np.asarray(steer.shift, np.float64)
    total = g[steer.site].astype(np.float64).reshape(-1, shift.shape[-1]).sum(axis=0)
    norm = float(np.linalg.norm(shift))
    return float(total @ shift / (1.0 if scale or norm == 0 else norm))


def grad(params, config, ids, position, target, vs=None, steer=None) -> Attribution:
    f, g, values = gradients(params, config, ids, position, target, vs, steer=steer)
    x = values["token_embeddings"].astype(np.float64)
    gx = g["token_embeddings"].astype(np.float64)
    norm_x = np.linalg.norm(x, axis=-1)
    signed = (gx * x).sum(-1) / np.where(norm_x > 0, norm_x, 1.0)
    return Attribution("grad", signed, float(f), grad_norm=np.linalg.norm(gx, axis=-1),
                       steer=steer_term(g, steer, scale=False))


def grad_x_input(params, config, ids, position, target, vs=None, steer=None) -> Attribution:
    f, g, values = gradients(params, config, ids, position, target, vs, steer=steer)
    x = values["token_embeddings"].astype(np.float64)
    return Attribution("grad-x-input", (g["token_embeddings"] * x).sum(-1), float(f),
                       steer=steer_term(g, steer))


def integrated_gradients(params, config, ids, position, target, vs=None, *, steps: int = 64,
                         baseline: np.ndarray | None = None, steer=None) -> Attribution:
    """IG on the token embeddings along the straight line from `baseline` (default zeros).
    A steered run's steering grows along the same line, from none at the baseline to all of
    it at the input, and gets its own term: the terms add up to f(input, steered) -
    f(baseline, unsteered)."""
    x = token_embeddings_of(params, config, ids)  # [T, d]
    b = np.zeros_like(x) if baseline is None else np.asarray(baseline, x.dtype)
    alphas = (np.arange(steps) + 0.5) / steps
    total = np.zeros(x.shape, np.float64)
    steer_total = 0.0
    per_batch = max(1, STEP_TOKENS // len(ids))  # the recorded values of a batch stay small
    for start in range(0, steps, per_batch):
        a = alphas[start : start + per_batch, None, None].astype(x.dtype)
        path = b + a * (x - b)  # [n, T, d]
        _, g, _ = gradients(params, config, ids, position, target, vs, token_embeddings=path,
                            steer=steer, amounts=alphas[start : start + per_batch])
        total += g["token_embeddings"].astype(np.float64).sum(axis=0)
        steer_total += steer_term(g, steer) or 0.0
    mean_grad = total / steps  # [T, d]
    scores = ((x - b).astype(np.float64) * mean_grad).sum(-1)
    ends = np.stack([x, b])
    f_x, f_b = gradients(params, config, ids, position, target, vs, token_embeddings=ends,
                         steer=steer, amounts=np.array([1.0, 0.0]))[0]
    return Attribution("integrated-gradients", scores, float(f_x), f_baseline=float(f_b),
                       steps=steps, steer=steer_total / steps if steer is not None else None)


def attention_x_grad(params, config, ids, position, target, vs=None, steer=None
                     ) -> Attribution:
    """[n_layer, n_head, T]: A * dA summed over the queries, for each key token (of the
    steered run, with `steer`; the steering has no attention of its own to score)."""
    f, g, values = gradients(params, config, ids, position, target, vs, steer=steer)
    scores = np.stack([(values[f"layers.{i}.weights"].astype(np.float64)
                        * g[f"layers.{i}.weights"]).sum(axis=-2)
                       for i in range(config.n_layer)])
    return Attribution("attention-x-grad", scores, float(f))


METHOD_FUNCTIONS = {"grad": grad, "grad-x-input": grad_x_input,
                    "attention-x-grad": attention_x_grad}


@dataclass
class AttributionReport:
    q: object  # analysis.question.Question
    attribution: Attribution

    @property
    def completeness(self) -> tuple[float, float, float] | None:
        """(sum of scores and any steer term, f(input) − f(baseline), the gap) for integrated
        gradients."""
        r = self.attribution
        if r.gap is None:
            return None
        total = float(r.scores.sum()) + r.steer if r.steer is not None else float(r.scores.sum())
        return total, r.f - r.f_baseline, r.gap


def check_method(method: str, baseline: str | None) -> None:
    """A known --method; --baseline only with integrated gradients."""
    if method not in METHODS:
        raise InputError(f"unknown --method {method!r}: use {', '.join(METHODS)}")
    if baseline is not None and method != "integrated-gradients":
        raise InputError("--baseline goes with --method integrated-gradients")


def attribution_report(session, position: int, target: str | None, vs: str | None,
                       method: str, steps: int, baseline: str | None) -> AttributionReport:
    """`method`'s scores for the prediction at `position`; integrated gradients start from
    the token embeddings of the `baseline` text (same token count) or from zeros."""

    p = session.position(position)
    q = ask(session, session.run()[p], p, target, vs)
    args = (session.params, session.config, session.ids, p, q.target, q.vs)
    steer = steering(session)
    if method != "integrated-gradients":
        return AttributionReport(q, METHOD_FUNCTIONS[method](*args, steer=steer))
    base = None
    if baseline is not None:
        b = session.reopen(baseline)
        if b.T != session.T:
            raise InputError(f"the --baseline text is {count(b.T, 'token')} and the text "
                             f"{session.T}: integrated gradients need the same number of "
                             "tokens")
        base = token_embeddings_of(session.params, session.config, b.ids)
    return AttributionReport(q, integrated_gradients(*args, steps=steps, baseline=base,
                                                     steer=steer))
