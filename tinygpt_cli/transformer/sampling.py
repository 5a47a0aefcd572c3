"""Cards 10 and 11: scores -> chances -> one token. Pure functions of arrays and a seeded rng."""

from __future__ import annotations

import math

import numpy as np

from ..errors import InputError
from .ops import probabilities as chances

# A subnormal temperature (1e-320) divides any score past float64's range and the chances
# become NaN. Far above that, 1e-6 already puts all the chance on the top score of any real
# model's logits: smaller positive values would only be greedy decoding spelled riskily.
MIN_TEMPERATURE = 1e-6


def check_temperature(temperature: float) -> None:
    """0 (greedy) or a finite number of at least MIN_TEMPERATURE; else InputError (exit 2)."""
    t = temperature
    if not (t == 0 or (math.isfinite(t) and t >= MIN_TEMPERATURE)):
        raise InputError(f"--temperature must be 0 (greedy) or a finite number of at least "
                         f"{MIN_TEMPERATURE:g}, got {t!r}")


def check_top_p(top_p: float) -> None:
    """A --top-p in (0, 1]; else InputError (exit 2)."""
    if not 0 < top_p <= 1:  # written so that NaN fails too
        raise InputError(f"--top-p must be in (0, 1], got {top_p!r}")


def probabilities(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """ops.probabilities, the temperature checked first (InputError)."""

    check_temperature(temperature)
    return chances(logits, temperature)


def top_k_filter(probs: np.ndarray, k: int | None) -> np.ndarray:
    """Keep the k most likely tokens (ties at the edge kept), renormalised. k None or 0: all."""
    if not k or k >= probs.shape[-1]:
        return probs
    if k < 0:
        raise ValueError(f"top-k must be >= 0, got {k}")
    kth = np.partition(probs, -k)[-k]
    kept = np.where(probs >= kth, probs, 0.0)
    return kept / kept.sum()


def top_p_filter(probs: np.ndarray, p: float | None) -> np.ndarray:
    """Keep the smallest set of most likely tokens whose chances add up to at least p."""
    if p is None or p == 1.0:
        return probs
    if not 0.0 < p <= 1.0:
        raise InputError(f"--top-p must be in (0, 1], got {p!r}")
    order = np.argsort(-probs, kind="stable")
    cumulative = np.cumsum(probs[order])
    n_keep = int(np.searchsorted(cumulative, p) + 1)
    kept = np.zeros_like(probs)
    kept[order[:n_keep]] = probs[order[:n_keep]]
    return kept / kept.sum()


def fresh_seed() -> int:
    """A new seed for a run not given one (a command prints it, so it can be given again)."""
    return int(np.random.SeedSequence().entropy % 2**31)


def create_rng(seed: int | None) -> np.random.Generator:
    """The seeded generator `sample` draws from (the seed page's createRng).

    A seed is a whole number from 0 (NumPy refuses negative ones); None draws a fresh one.
    """
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise InputError(f"--seed must be a whole number of 0 or more, got {seed!r}")
    return np.random.default_rng(seed)


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id with chance probs[id]: inverse-CDF on one uniform number."""
    cdf = np.cumsum(probs)
    u = rng.random() * cdf[-1]
    return int(min(np.searchsorted(cdf, u, side="right"), len(probs) - 1))


def greedy(logits: np.ndarray) -> tuple[int, float]:
    """The token temperature 0 picks and its chance, as next_token_distribution(logits, 0)
    gives them with no top-k or top-p (the first of the highest scores; 1 / the number of
    tokens that tie for it), without its float64 array of chances: generation asks at every
    step, and on a small model those arrays were a tenth of a step. Logits are finite."""
    token = int(np.argmax(logits))
    return token, 1.0 / int(np.count_nonzero(logits == logits[token]))


def next_token_distribution(
    logits: np.ndarray, temperature: float = 1.0, top_k: int | None = None,
    top_p: float | None = None,
) -> np.ndarray:
    """The chances generation draws from: temperature, then top-k, then top-p."""
    return top_p_filter(top_k_filter(probabilities(logits, temperature), top_k), top_p)
