"""A long text's attention is computed block of queries by block, skipping the keys after
each block (all masked): the scores, weights and weighted values must be those of the one
whole product, and a hook that changes the scores must still get the plain softmax."""

from __future__ import annotations

import numpy as np
import pytest

from tinygpt_cli.transformer import ops
from tinygpt_cli.transformer.config import Config
from tinygpt_cli.transformer.hooks import Chain, Record, Replace
from tinygpt_cli.transformer.model import forward, record

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
    # the same numbers, bit for bit, as the softmax of every other attention pass
    np.testing.assert_array_equal(weights, ops.attention_softmax(scores))
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
    from tinygpt_cli.transformer.model import all_finite

    big = np.full((3, 5), np.finfo(np.float32).max, np.float32)  # its sum overflows
    assert all_finite(big)
    for bad in (np.nan, np.inf, -np.inf):
        x = big.copy()
        x[1, 2] = bad
        assert not all_finite(x)
    x = np.zeros(6, np.float32)
    x[:2] = [np.inf, -np.inf]
    assert not all_finite(x)


def naive_softmax(z):
    """Row by row in float64, shifted by the row's largest score: the textbook softmax."""
    z = np.asarray(z, np.float64)
    out = np.zeros_like(z)
    for idx in np.ndindex(z.shape[:-1]):
        row = z[idx]
        e = np.exp(row - row.max())
        out[idx] = e / e.sum()
    return out


def test_attention_softmax_equals_the_textbook_softmax():
    rng = np.random.default_rng(3)
    for start, t in ((0, 9), (4, 3), (11, 1)):  # a whole text, a cached chunk, one step
        z = (rng.normal(size=(2, t, start + t)) * 6).astype(np.float32)
        z += np.triu(np.full((t, start + t), -np.inf, np.float32), 1 + start)
        got = ops.attention_softmax(z, start)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, naive_softmax(z), rtol=2e-6, atol=1e-7)
        np.testing.assert_allclose(got.sum(-1), 1, rtol=1e-6)


def test_attention_softmax_shifts_when_exp_would_leave_floats_range():
    # without the shift by the row's largest score, exp(200) overflows float32 and exp of a
    # row of -120s underflows: each is caught by its row's sum, and the textbook softmax
    # (shifted) is taken instead, for the whole grid
    for row in ([200.0, 0.0, 0.0], [-120.0, -121.0, -125.0]):
        z = np.zeros((1, 3, 3), np.float32) + np.triu(np.full((3, 3), -np.inf, np.float32), 1)
        z[0, 2] = row
        got = ops.attention_softmax(z)
        np.testing.assert_array_equal(got, ops.softmax(z))
        np.testing.assert_allclose(got, naive_softmax(z), rtol=1e-6, atol=1e-7)
        assert np.isfinite(got).all()
    # in range, the shift is skipped: the numbers are exp(z) / sum, not softmax's own bits
    z = np.array([[[0.3, -np.inf], [1.7, -2.2]]], np.float32)
    e = np.exp(z)
    np.testing.assert_array_equal(ops.attention_softmax(z), e / e.sum(-1, keepdims=True))


@pytest.mark.parametrize("t", [7, 2 * ops.CAUSAL_BLOCK + 5])  # one block; three blocks
def test_a_text_gets_the_same_weights_alone_and_beside_one_that_needs_the_shift(t):
    # text 1 has a score of 120 (exp overflows float32): it is taken with the shift; text
    # 0 must still get the numbers of its own run, which needs none
    rng = np.random.default_rng(4)
    mask = np.triu(np.full((t, t), -np.inf, np.float32), 1)
    scores = (rng.normal(size=(2, 3, t, t)) * 3).astype(np.float32) + mask
    scores[1, 2, t - 1, 0] = 120.0
    for softmax in (ops.attention_softmax, ops.causal_softmax):
        both = softmax(scores.copy())
        for b in range(2):
            np.testing.assert_array_equal(both[b], softmax(scores[b].copy()))
        np.testing.assert_allclose(both, naive_softmax(scores), rtol=2e-6, atol=1e-7)
    # no text at all: nothing to check, nothing to fail
    assert ops.attention_softmax(np.zeros((0, 3, 4, 4), np.float32)).shape == (0, 3, 4, 4)


def test_weights_written_over_the_scores_are_the_same_numbers_in_the_same_array():
    # the model's whole-text pass, whose scores nobody keeps, writes the pattern over them
    # (one [H, T, T] array a block, not two): the very numbers of the softmax into a new one
    rng = np.random.default_rng(5)
    mask = np.triu(np.full((T, T), -np.inf, np.float32), 1)
    scores = (rng.normal(size=(2, 3, T, T)) * 3).astype(np.float32) + mask
    want = ops.causal_softmax(scores)
    mine = scores.copy()
    got = ops.causal_softmax(mine, overwrite=True)
    assert got is mine
    np.testing.assert_array_equal(got, want)
    # a text that needs the shifted softmax: its scores are gone, so the caller is told
    scores[1, 2, T - 1, 0] = 120.0
    assert ops.causal_softmax(scores.copy(), overwrite=True) is None


def test_a_pass_whose_scores_need_the_shift_makes_them_again_and_kept_scores_stay():
    config = Config(n_embd=8, n_layer=1, n_head=2, n_inner=12, vocab_size=11, n_positions=T)
    from conftest import random_params

    from tinygpt_cli.transformer.hooks import RecordOnly

    params = random_params(config, seed=1)
    params["layers.0.attn.W_QKV"] = params["layers.0.attn.W_QKV"] * 40  # scores past exp's range
    ids = np.arange(T) % config.vocab_size
    rec = Record()  # keeps the scores: they must not be overwritten
    kept = forward(params, config, ids, hooks=rec)
    scores = rec.values["layers.0.scores"]
    assert np.isneginf(scores).sum() == 2 * T * (T - 1) // 2  # scores, not chances
    assert scores[np.isfinite(scores)].max() > np.log(ops.SUMS_WITHOUT_SHIFT[1])  # shifted
    w = rec.values["layers.0.weights"]
    np.testing.assert_allclose(w, naive_softmax(scores), rtol=1e-9, atol=1e-12)
    # no hook (the scores written over, then made again for the shift): the same bits
    np.testing.assert_array_equal(forward(params, config, ids), kept)
    # a hook that keeps one head's scores (a view of the array) keeps them intact
    head = RecordOnly(["layers.0.heads.1.scores", "layers.0.weights"])
    forward(params, config, ids, hooks=head)
    np.testing.assert_array_equal(head.values["layers.0.heads.1.scores"], scores[1])
    np.testing.assert_array_equal(head.values["layers.0.weights"], w)
