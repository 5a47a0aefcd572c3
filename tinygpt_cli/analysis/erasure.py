"""Is an input attribution faithful? Erase the tokens it ranks first and watch the score.

The score f = logit[target] (- logit[vs]) at one position, as in `attribute`. A token is
removed by giving it the baseline's token embedding (zeros, or the --baseline text's), its
position embedding kept, as integrated gradients' path starts. Only tokens up to the scored
position are ranked: later ones cannot change it. For a ranking and k = 0 .. K:

    comprehensiveness(k) = f(x) - f(x with its top-k tokens removed)     (higher: better)
    sufficiency(k)       = f(x) - f(x with only its top-k tokens kept)   (lower: better)

each summarised by its mean over k (the AOPC of DeYoung et al.'s ERASER). Rankings compared:
the attribution's (largest score first), leave-one-out occlusion's (the drop of f when the
token alone is removed) and random orders (their curves averaged).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..transformer.config import Config
from ..transformer.hooks import Chain, Replace
from ..transformer.model import cut_head, forward, token_embeddings_of

RANDOM_ORDERS = 20


def erased_scores(params, config: Config, ids: Sequence[int], position: int, target: int,
                  vs: int | None, keep: np.ndarray, baseline: np.ndarray | None = None,
                  steer=None) -> np.ndarray:
    """f for each row of keep [N, T] (True: the token's own embedding, False: the
    baseline's), in one batch, each run steered by `steer` when given: [N]."""
    ids = np.asarray(ids)[: position + 1]
    keep = np.asarray(keep, bool)[:, : position + 1]
    x = token_embeddings_of(params, config, ids).astype(np.float64)
    b = np.zeros_like(x) if baseline is None else np.asarray(baseline, np.float64)[
        : position + 1]
    tokens = np.where(keep[..., None], x[None], b[None])  # [N, T, d]
    rows = [target] + ([vs] if vs is not None else [])
    head = {k: np.asarray(v, np.float64) for k, v in cut_head(params, config, rows).items()}
    logits = forward(head, config, np.zeros(keep.shape, np.int64),
                     hooks=Chain(Replace({"token_embeddings": lambda _: tokens}), steer))
    last = logits[:, position, :]
    return last[:, 0] - (last[:, 1] if vs is not None else 0.0)


@dataclass
class Erasure:
    names: list[str]  # the rankings: the method's, "occlusion", "random"
    comprehensiveness: np.ndarray  # [rankings, K + 1]
    sufficiency: np.ndarray  # [rankings, K + 1]
    occlusion: np.ndarray  # [K] leave-one-out drops of f
    f: float  # f(x)
    f_empty: float  # f with every ranked token removed

    @property
    def aopc(self) -> tuple[np.ndarray, np.ndarray]:
        """Mean over k = 1 .. K of each ranking's comprehensiveness and sufficiency."""
        return self.comprehensiveness[:, 1:].mean(axis=1), self.sufficiency[:, 1:].mean(axis=1)


def order_of(scores: np.ndarray) -> np.ndarray:
    """Token positions by score, largest first (ties: the earlier token first)."""
    return np.argsort(-np.asarray(scores, np.float64), kind="stable")


def _curves(params, config, ids, position, target, vs, order: np.ndarray, baseline, steer
            ) -> tuple[np.ndarray, np.ndarray, float]:
    k_max = len(order)
    top = np.zeros((k_max + 1, k_max), bool)  # row k: the top-k tokens
    for k in range(1, k_max + 1):
        top[k] = top[k - 1]
        top[k, order[k - 1]] = True
    f = erased_scores(params, config, ids, position, target, vs,
                      np.concatenate([~top, top]), baseline, steer)
    full = f[0]
    return full - f[: k_max + 1], full - f[k_max + 1:], float(full)


def erasure_of(s, r, position: int, target: int, vs: int | None, baseline: str | None
               ) -> tuple[Erasure, np.ndarray]:
    """`attribute --faithfulness`: the curves of attribution r's ranking in session s
    (attention-x-grad's scores summed over its heads), a token erased to the token
    embedding of the `baseline` text (as many tokens) or to zeros; (curves, the scores)."""
    base = None if baseline is None else token_embeddings_of(s.params, s.config,
                                                     s.reopen(baseline).ids)
    scores = r.scores.reshape(-1, r.scores.shape[-1]).sum(axis=0)
    return erasure(s.params, s.config, s.ids, position, target, vs, scores, r.method, base,
                   steer=s.steering), scores


def erasure(params, config: Config, ids: Sequence[int], position: int, target: int,
            vs: int | None, scores: np.ndarray, method: str,
            baseline: np.ndarray | None = None, seed: int = 0, steer=None) -> Erasure:
    """The curves of the attribution `scores` [T], of occlusion and of random orders (every
    run steered by `steer`, when given: the tokens are erased, the steering stays)."""
    k_max = position + 1
    single = ~np.eye(k_max, dtype=bool)
    everything = np.ones((1, k_max), bool)
    f_all, *dropped = erased_scores(params, config, ids, position, target, vs,
                                    np.concatenate([everything, single]), baseline, steer)
    occlusion = f_all - np.array(dropped)
    orders = [order_of(np.asarray(scores)[:k_max]), order_of(occlusion)]
    rng = np.random.default_rng(seed)
    orders += [rng.permutation(k_max) for _ in range(RANDOM_ORDERS)]
    comp, suff = [], []
    for order in orders:
        c, s, f = _curves(params, config, ids, position, target, vs, order, baseline, steer)
        comp.append(c)
        suff.append(s)
    comp = np.array(comp[:2] + [np.mean(comp[2:], axis=0)])
    suff = np.array(suff[:2] + [np.mean(suff[2:], axis=0)])
    return Erasure([method, "occlusion", "random"], comp, suff, occlusion, f,
                   float(f - comp[0, -1]))
