"""A long text's attention is computed block of queries by block, skipping the keys after
each block (all masked): the scores, weights and weighted values must be those of the one
whole product, and a hook that changes the scores must still get the plain softmax."""

from __future__ import annotations

import numpy as np

from tinygpt_cli import ops
from tinygpt_cli.config import Config
from tinygpt_cli.hooks import Chain, Record, Replace
from tinygpt_cli.model import forward, record

T = 2 * ops.CAUSAL_BLOCK + 37  # three blocks, the last one short


def whole(q, k, v):
    """The naive reference: one product, the mask added, a softmax over every key."""
    t = q.shape[-2]
    scores = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    scores = scores + np.triu(np.full((t, t), -np.inf), 1)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights = e / e.sum(axis=-1, keepdims=True)
    return scores, weights, weights @ v


def test_blocks_cover_every_query_once():
    blocks = ops.causal_blocks(T)
    assert len(blocks) == 3 and blocks[0][0] == 0 and blocks[-1][1] == T
    assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:], strict=False))
    assert ops.causal_blocks(ops.CAUSAL_BLOCK) == [(0, ops.CAUSAL_BLOCK)]


def test_blocked_attention_equals_the_whole_product():
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(2, 3, T, 8)) for _ in range(3))  # [B, H, T, d_k], float64
    want_scores, want_weights, want_z = whole(q, k, v)
    scores = ops.attention_scores(q, k)
    assert np.array_equal(np.isneginf(scores), np.isneginf(want_scores))
    np.testing.assert_allclose(scores, want_scores, rtol=1e-12, atol=1e-12)
    weights = ops.causal_softmax(scores)
    np.testing.assert_array_equal(weights, ops.softmax(scores))  # the same numbers, bit for bit
    assert np.all(weights[..., np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] == 0)
    np.testing.assert_allclose(weights, want_weights, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(ops.causal_mix(weights, v), want_z, rtol=1e-12, atol=1e-12)


def test_a_hook_that_changes_the_scores_gets_every_key():
    config = Config(n_embd=8, n_layer=1, n_head=2, n_inner=12, vocab_size=11, n_positions=T)
    from conftest import random_params

    params = random_params(config, seed=1)
    ids = np.arange(T) % config.vocab_size
    # every score 0, the masked ones too: each query then spreads over all T keys (1 / T),
    # which the blocked softmax, assuming -inf past each block, would not give
    rec = Record()
    forward(params, config, ids, hooks=Chain(Replace({"layers.0.scores": np.zeros_like}), rec))
    np.testing.assert_allclose(rec.values["layers.0.weights"], 1.0 / T, rtol=1e-12)
    # a hook that changes nothing takes the whole products: the recorded (blocked) pass
    # gives its numbers
    _, values = record(params, config, ids)
    plain = forward(params, config, ids, hooks=Replace({}))
    np.testing.assert_allclose(values["logits"], plain, rtol=1e-12, atol=1e-12)


def test_the_finiteness_check_of_the_logits_reads_a_sum_but_is_exact():
    from tinygpt_cli.model import all_finite

    big = np.full((3, 5), np.finfo(np.float32).max, np.float32)  # its sum overflows
    assert all_finite(big)
    for bad in (np.nan, np.inf, -np.inf):
        x = big.copy()
        x[1, 2] = bad
        assert not all_finite(x)
    x = np.zeros(6, np.float32)
    x[:2] = [np.inf, -np.inf]
    assert not all_finite(x)
