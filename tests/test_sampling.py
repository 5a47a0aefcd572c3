"""Cards 10 and 11: probabilities, temperature, top-k / top-p, and the seeded draw."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from tinygpt_cli.transformer.sampling import (
    create_rng,
    next_token_distribution,
    probabilities,
    sample,
    top_k_filter,
    top_p_filter,
)

logit_vectors = arrays(
    np.float64, st.integers(1, 40), elements=st.floats(-50, 50, allow_nan=False)
)
temperatures = st.floats(0.05, 20.0)


def prob_vectors(min_size=1, max_size=30):
    """Probability vectors, zeros allowed, summing to 1."""
    return arrays(
        np.float64, st.integers(min_size, max_size), elements=st.floats(0.0, 1.0)
    ).filter(lambda w: w.sum() > 1e-3).map(lambda w: w / w.sum())


class FixedRng:
    """Stands in for a Generator whose next uniform number we choose."""

    def __init__(self, u: float):
        self.u = u

    def random(self) -> float:
        return self.u


# ---------------------------------------------------------------- probabilities


@given(logit_vectors, temperatures)
def test_probabilities_sum_to_one(logits, temperature):
    p = probabilities(logits, temperature)
    assert p.dtype == np.float64 and p.shape == logits.shape
    assert np.all(p >= 0)
    assert p.sum() == pytest.approx(1.0, abs=1e-12)
    assert p[np.argmax(logits)] == p.max()  # order kept: the top score gets the top chance


@given(logit_vectors, temperatures, st.floats(-1e3, 1e3))
def test_probabilities_ignore_a_constant_shift(logits, temperature, shift):
    np.testing.assert_allclose(probabilities(logits + shift, temperature),
                               probabilities(logits, temperature), atol=1e-9)


def test_temperature_matches_a_hand_computation():
    logits = [1.0, 2.0, 3.0, -1.0]
    for temperature in (0.5, 1.0, 2.0):
        e = [math.exp(z / temperature) for z in logits]
        np.testing.assert_allclose(probabilities(np.array(logits), temperature),
                                   [x / sum(e) for x in e], rtol=1e-12)
    # Default temperature is 1.
    np.testing.assert_allclose(probabilities(np.array(logits)), probabilities(np.array(logits), 1))


def test_float32_logits_give_float64_probabilities():
    p = probabilities(np.array([0.1, 0.2, 5.0], dtype=np.float32))
    assert p.dtype == np.float64


def test_huge_logits_do_not_overflow():
    p = probabilities(np.array([1000.0, 999.0, -1000.0]))
    assert np.all(np.isfinite(p))
    np.testing.assert_allclose(p[:2], [1 / (1 + math.exp(-1)), 1 / (1 + math.exp(1))])


def test_temperature_zero_is_one_hot_argmax():
    p = probabilities(np.array([0.3, 2.5, -1.0, 2.4]), 0)
    np.testing.assert_array_equal(p, [0.0, 1.0, 0.0, 0.0])


def test_temperature_zero_ties_share_the_chance():
    np.testing.assert_array_equal(probabilities(np.array([1.0, 3.0, 3.0]), 0), [0.0, 0.5, 0.5])


@given(arrays(np.float64, st.integers(1, 30), elements=st.floats(-50, 50), unique=True))
def test_temperature_zero_is_the_limit_of_small_temperatures(logits):
    cold = probabilities(logits, 0)
    assert cold[np.argmax(logits)] == 1.0 and cold.sum() == 1.0
    gaps = np.diff(np.sort(logits))
    if gaps.size and gaps.min() > 1e-3:
        np.testing.assert_allclose(probabilities(logits, 1e-6), cold, atol=1e-12)


def test_higher_temperature_flattens():
    logits = np.array([0.0, 1.0, 3.0])
    ps = [probabilities(logits, t) for t in (0.5, 1.0, 4.0, 100.0)]
    tops = [p[2] for p in ps]
    assert tops == sorted(tops, reverse=True)
    np.testing.assert_allclose(ps[-1], 1 / 3, atol=0.01)


def test_negative_temperature_is_refused():
    with pytest.raises(ValueError, match="temperature"):
        probabilities(np.array([1.0, 2.0]), -0.1)


# ---------------------------------------------------------------- top-k, top-p


def test_top_k_keeps_the_k_most_likely():
    probs = np.array([0.1, 0.4, 0.2, 0.3])
    np.testing.assert_allclose(top_k_filter(probs, 2), [0.0, 4 / 7, 0.0, 3 / 7])
    np.testing.assert_allclose(top_k_filter(probs, 1), [0.0, 1.0, 0.0, 0.0])
    np.testing.assert_allclose(top_k_filter(probs, 3), [0.0, 4 / 9, 2 / 9, 3 / 9])


def test_top_k_off_or_too_big_changes_nothing():
    probs = np.array([0.1, 0.4, 0.2, 0.3])
    for k in (None, 0, 4, 99):
        np.testing.assert_array_equal(top_k_filter(probs, k), probs)


def test_top_k_keeps_ties_at_the_edge():
    np.testing.assert_allclose(top_k_filter(np.array([0.3, 0.3, 0.2, 0.2]), 1),
                               [0.5, 0.5, 0.0, 0.0])


def test_top_k_negative_is_refused():
    with pytest.raises(ValueError, match="top-k"):
        top_k_filter(np.array([0.5, 0.5]), -1)


@given(prob_vectors(), st.integers(1, 35))
def test_top_k_properties(probs, k):
    kept = top_k_filter(probs, k)
    assert kept.sum() == pytest.approx(1.0)
    on = kept > 0
    if k >= probs.size:
        np.testing.assert_array_equal(kept, probs)
        return
    n_positive = int((probs > 0).sum())
    assert on.sum() >= min(k, n_positive)
    assert np.all(probs[~on] <= probs[on].min())  # nothing dropped beats anything kept
    if on.sum() > k:  # more than k only through a tie at the edge
        assert np.sum(probs == probs[on].min()) > 1
    np.testing.assert_allclose(kept[on], probs[on] / probs[on].sum())


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = np.array([0.125, 0.5, 0.125, 0.25])  # exact in binary
    cases = {0.1: [1], 0.5: [1], 0.6: [1, 3], 0.75: [1, 3], 0.76: [0, 1, 3], 0.99: [0, 1, 2, 3]}
    for p, keep in cases.items():
        kept = top_p_filter(probs, p)
        assert np.flatnonzero(kept).tolist() == keep, p
        np.testing.assert_allclose(kept[keep], probs[keep] / probs[keep].sum())


def test_top_p_off_changes_nothing_and_bad_p_is_refused():
    probs = np.array([0.2, 0.8])
    np.testing.assert_array_equal(top_p_filter(probs, None), probs)
    np.testing.assert_array_equal(top_p_filter(probs, 1.0), probs)
    for bad in (0.0, -0.5):
        with pytest.raises(ValueError, match="top-p"):
            top_p_filter(probs, bad)


@given(prob_vectors(), st.floats(0.01, 0.99))
def test_top_p_properties(probs, p):
    kept = top_p_filter(probs, p)
    on = kept > 0
    assert kept.sum() == pytest.approx(1.0)
    assert probs[on].sum() >= p - 1e-9  # enough chance kept
    assert np.all(probs[~on] <= probs[on].min())  # the most likely ones
    if on.sum() > 1:  # and no more than needed: dropping the least likely falls short of p
        assert probs[on].sum() - probs[on].min() < p + 1e-9


def test_next_token_distribution_applies_temperature_then_k_then_p():
    logits = np.array([2.0, 1.0, 0.0, -1.0, 3.0])
    t = probabilities(logits, 0.7)
    np.testing.assert_allclose(next_token_distribution(logits, 0.7), t)
    expected = top_p_filter(top_k_filter(t, 3), 0.8)
    np.testing.assert_allclose(next_token_distribution(logits, 0.7, top_k=3, top_p=0.8), expected)
    assert np.count_nonzero(expected) == 2  # p cut within k
    np.testing.assert_array_equal(next_token_distribution(logits, 0), [0, 0, 0, 0, 1])


# ---------------------------------------------------------------- sample


def test_sample_is_inverse_cdf_on_one_uniform_number():
    probs = np.array([0.25, 0.25, 0.5])
    for u, expected in [(0.0, 0), (0.2, 0), (0.25, 1), (0.4999, 1), (0.5, 2), (0.9999999, 2)]:
        assert sample(probs, FixedRng(u)) == expected, u


def test_sample_never_picks_a_zero_chance_token():
    probs = np.array([0.0, 0.5, 0.0, 0.5, 0.0])
    for u in (0.0, 0.3, 0.5, 0.7, 1 - 1e-16):
        assert sample(probs, FixedRng(u)) in (1, 3)


def test_sample_with_the_same_seed_gives_the_same_id():
    probs = probabilities(np.random.default_rng(0).normal(size=50))
    first = [sample(probs, create_rng(s)) for s in range(20)]
    assert first == [sample(probs, create_rng(s)) for s in range(20)]
    assert len(set(first)) > 3  # different seeds do differ


def test_one_hot_always_samples_its_token():
    rng = create_rng(1)
    assert {sample(np.eye(6)[4], rng) for _ in range(200)} == {4}


def test_sample_frequencies_match_probabilities():
    probs = np.array([0.05, 0.1, 0.2, 0.3, 0.35, 0.0])
    rng, n = create_rng(2024), 20_000
    counts = np.bincount([sample(probs, rng) for _ in range(n)], minlength=probs.size)
    assert counts[-1] == 0
    expected = probs[:-1] * n
    chi2 = float((((counts[:-1] - expected) ** 2) / expected).sum())
    assert chi2 < 18.47  # 4 degrees of freedom, p = 0.001


@settings(max_examples=30)
@given(prob_vectors(max_size=8), st.integers(0, 2**32 - 1))
def test_sample_returns_a_possible_token(probs, seed):
    i = sample(probs, create_rng(seed))
    assert 0 <= i < probs.size
    assert probs[i] > 0
    assert i == sample(probs, create_rng(seed))


@pytest.mark.parametrize("logits", [
    [0.5, 2.0, -1.0, 2.0, 1.9],  # two tokens tie for the highest score
    [3.0, 3.0, 3.0],
    [-7.25],
    list(np.random.default_rng(4).normal(size=4096).astype(np.float32)),
])
def test_greedy_is_temperature_0s_token_and_chance(logits):
    from tinygpt_cli.transformer.sampling import greedy, next_token_distribution

    z = np.asarray(logits, np.float32)
    dist = next_token_distribution(z, 0.0)
    want = int(np.argmax(dist))
    assert greedy(z) == (want, float(dist[want]))
    assert want == int(np.flatnonzero(z == z.max())[0])  # the first of the highest, by hand
