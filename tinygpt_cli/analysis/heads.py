"""Which heads do known jobs: the head detector of TransformerLens, and the induction test on
repeated random tokens.

Detection patterns P are T x T, 0/1 and lower-triangular (rows: the token looking, columns:
the tokens it may look at):

- previous-token: P[i, i-1] = 1;
- duplicate-token: P[i, j] = 1 when token j is token i and j < i;
- induction: the duplicate pattern moved one column right, P[i, j] = 1 when token j-1 is
  token i and j-1 < i (so j can be i itself when a token repeats right away), column 0 empty.

A head's score is sum(A * P) / sum(A) over the whole grid, rows taken together (not a mean
of per-row fractions), as TransformerLens' `detect_head` with error_measure="mul". With
exclude_first (TransformerLens: exclude_bos) column 0 of A is zeroed first, in numerator and
denominator alike; exclude_current zeroes A's diagonal. Over several texts the score is the
mean of each text's score, as detect_head does for a list of strings. With both exclusions a
text of one token after the separator keeps no attention at all (0/0): such texts are left out
of the mean and counted, and when none is left there is nothing to score.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..transformer import ops
from ..transformer.config import Config
from ..transformer.model import record
from ..transformer.wiring import FORWARD

# The blocks this analysis implements (wiring.require refuses others by name): the recorded
# attention patterns.
HANDLES = FORWARD

KINDS = ("previous_token", "duplicate_token", "induction")


def previous_token_pattern(t: int) -> np.ndarray:
    return np.eye(t, k=-1)


def uniform_previous_token(t: int) -> float:
    """The previous-token score (detection_score with previous_token_pattern) of a head that
    spreads its attention evenly over all it may see: (1/T) sum_{i=1}^{T-1} 1/(i+1), the chance
    level a head's score starts from before training has shaped it."""
    return float(sum(1.0 / (i + 1) for i in range(1, t)) / t) if t > 0 else 0.0


def duplicate_token_pattern(ids) -> np.ndarray:
    ids = np.asarray(ids)
    same = ids[:, None] == ids[None, :]
    return np.tril(same, k=-1).astype(np.float64)


def induction_pattern(ids) -> np.ndarray:
    dup = duplicate_token_pattern(ids)
    out = np.zeros_like(dup)
    out[:, 1:] = dup[:, :-1]
    return np.tril(out)


def pattern(kind: str, ids) -> np.ndarray:
    if kind == "previous_token":
        return previous_token_pattern(len(ids))
    if kind == "duplicate_token":
        return duplicate_token_pattern(ids)
    if kind == "induction":
        return induction_pattern(ids)
    raise ValueError(f"unknown head kind {kind!r}: one of {', '.join(KINDS)}")


def detection_score(attn: np.ndarray, pat: np.ndarray, *, exclude_first: bool = False,
                    exclude_current: bool = False) -> np.ndarray:
    """sum(A * P) / sum(A) over the last two axes.  [..., T, T], [T, T] -> [...]"""
    a = np.array(attn, dtype=np.float64)
    if exclude_first:
        a[..., :, 0] = 0.0
    if exclude_current:
        idx = np.arange(a.shape[-1])
        a[..., idx, idx] = 0.0
    return (a * pat).sum(axis=(-2, -1)) / a.sum(axis=(-2, -1))


def cells_left(t: int, *, exclude_first: bool = False, exclude_current: bool = False) -> int:
    """How many cells of a causal T x T grid the exclusions leave (cell 0,0 is both column 0
    and the diagonal)."""
    return (t * (t + 1) // 2 - t * exclude_first - t * exclude_current
            + (exclude_first and exclude_current))


def attention_grids(params, config: Config, ids: np.ndarray, hooks=None) -> np.ndarray:
    """Every head's attention weights for a batch [B, T] -> [B, L, H, T, T]."""
    paths = [f"layers.{i}.weights" for i in range(config.n_layer)]
    _, values = record(params, config, ids, paths, hooks=hooks)
    return np.stack([values[p] for p in paths], axis=1)


def text_scores(params, config: Config, texts: list[list[int]], *,
                exclude_first: bool = False, exclude_current: bool = False, hooks=None,
                ) -> dict[str, np.ndarray]:
    """{kind: [L, H]}: each kind's detection score, the mean over the texts."""
    width = max(len(t) for t in texts)
    x = np.zeros((len(texts), width), dtype=np.int64)
    for r, t in enumerate(texts):
        x[r, : len(t)] = t  # right padding: causal rows before it never see it
    grids = attention_grids(params, config, x, hooks)
    out = {}
    for kind in KINDS:
        per_text = [detection_score(grids[r, :, :, : len(t), : len(t)], pattern(kind, t),
                                    exclude_first=exclude_first, exclude_current=exclude_current)
                    for r, t in enumerate(texts)]
        out[kind] = np.mean(per_text, axis=0)
    return out


@dataclass
class InductionTest:
    """Random tokens repeated twice, after a separator: [eot, r_1..r_n, r_1..r_n]."""

    ids: np.ndarray  # [B, 1 + 2n]
    n: int
    score: np.ndarray  # [L, H] mean attention from each second-repeat token to the token after
    #                    its first occurrence (the diagonal n - 1 below the main one)
    loss_first: float  # mean nats per token over the first repeat (positions 2..n)
    loss_second: float  # ... over the second repeat (positions n+1..2n)

    @property
    def loss_drop(self) -> float:
        return self.loss_first - self.loss_second


def repeated_random_tokens(rng: np.random.Generator, vocab: int, n: int, batch: int,
                           first: int) -> np.ndarray:
    """[B, 1 + 2n]: `first` (the separator), then n random ids (never the separator), twice."""
    r = rng.integers(0, vocab - 1, size=(batch, n))
    r = r + (r >= first)  # skip the separator id
    return np.concatenate([np.full((batch, 1), first), r, r], axis=1).astype(np.int64)


def induction_stripe(grids: np.ndarray, n: int) -> np.ndarray:
    """Mean attention from query 1+n+i (the second copy of r_i) to key 2+i (r_{i+1}'s first
    occurrence), i = 0..n-1 (the last one looks at the first token of the second copy).
    [B, L, H, S, S] -> [L, H]"""
    q = 1 + n + np.arange(n)
    k = q - (n - 1)
    return grids[..., q, k].mean(axis=(0, -1))


def induction_test(params, config: Config, n: int, batch: int, seed: int,
                   separator: int, hooks=None) -> InductionTest:
    ids = repeated_random_tokens(np.random.default_rng(seed), config.vocab_size, n, batch,
                                 separator)
    paths = [f"layers.{i}.weights" for i in range(config.n_layer)]
    logits, values = record(params, config, ids, paths, hooks=hooks)  # [B, S, V]
    grids = np.stack([values[p] for p in paths], axis=1)
    logp = ops.log_softmax(logits[:, :-1])
    nats = -np.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0]  # [B, 2n], target t+1
    # target position t in 1..2n; the first repeat is 1..n (1 is a guess from the separator
    # alone; it is left out as every first token is unpredictable), the second n+1..2n
    first = nats[:, 1:n].mean()
    second = nats[:, n:].mean()
    return InductionTest(ids, n, induction_stripe(grids, n), float(first), float(second))


@dataclass
class HeadsReport:
    """Every head's score for each kind ([L, H] by previous_token, duplicate_token, induction
    and induction_random) over the texts, and the repeated-random-tokens test (`repeat`: its
    length, batch, seed and losses)."""

    table: dict[str, np.ndarray]
    texts: int
    source: str
    repeat: dict
    n_layer: int
    n_head: int
    skipped: int = 0  # texts with no attention left to score after the exclusions


def heads_report(params, config: Config, ids: list[list[int]], source: str, *, length: int,
                 batch: int, seed: int, separator: int, exclude_first: bool = False,
                 exclude_current: bool = False, hooks=None) -> HeadsReport:
    """text_scores over the texts, and induction_test on `batch` sequences of `length`
    random tokens (0: as many as fit twice in the context, at most 50). Texts the exclusions
    leave nothing of are left out and counted in `skipped`; none left is the user's error."""
    kept = [t for t in ids if cells_left(len(t), exclude_first=exclude_first,
                                         exclude_current=exclude_current) > 0]
    if not kept:
        raise InputError(f"nothing left to score: with --exclude-bos and --exclude-current "
                         f"{'the text has' if len(ids) == 1 else 'every text has'} one token, "
                         "whose only attention (to the separator and to itself) is left out; "
                         "give texts of two tokens or more, or drop one of the two options")
    scores = text_scores(params, config, kept, exclude_first=exclude_first,
                         exclude_current=exclude_current, hooks=hooks)
    n = length or min(50, (config.n_positions - 1) // 2)
    if 1 + 2 * n > config.n_positions or n < 2:
        raise InputError(f"--repeat-length {n} does not fit twice in the {config.n_positions}-"
                         "token context after a separator: give 2 to "
                         f"{(config.n_positions - 1) // 2}")
    test = induction_test(params, config, n, batch, seed, separator, hooks)
    repeat = {"length": n, "batch": batch, "seed": seed, "loss_first": test.loss_first,
              "loss_second": test.loss_second, "loss_drop": test.loss_drop}
    return HeadsReport(dict(scores) | {"induction_random": test.score}, len(kept), source,
                       repeat, config.n_layer, config.n_head, len(ids) - len(kept))
