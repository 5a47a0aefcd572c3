"""why on every family: the exact pass (per-position terms, no window's gradient) and the
index's parts against TracIn by its definition, one full gradient per window, on a small
random model of each family's block (biases or none, RMSNorm, a gated MLP, parallel
blocks, rotary positions, grouped keys and values, q/k norms, an untied head)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import FAMILIES, family_configs, random_params

from tinygpt_cli.analysis import exact_tracin as ex
from tinygpt_cli.analysis import tracin, why


def _small(arch: str):
    config = family_configs(n_inner=10, vocab_size=13, n_positions=6)[arch]
    return config


@pytest.mark.parametrize("arch", FAMILIES)
def test_exact_pass_equals_explicit_window_gradients_on_every_family(arch):
    config = _small(arch)
    snapshots = [(random_params(config, seed=8), 0.5), (random_params(config, seed=9), 2.0)]
    assert ex.covered(config, snapshots[0][0]) == set(snapshots[0][0])  # nothing left out
    stream = np.random.default_rng(9).integers(0, 13, 6 * 5 + 1)
    x, y = why.windows(stream, 6)
    asked = [([4, 2, 9, 4], 3), ([7, 0, 7, 1, 12, 3], 0)]
    got = ex.scores_over_stream(
        [(p, lr, [ex.next_token_query(p, config, ids, t) for ids, t in asked])
         for p, lr in snapshots], config, stream, batch=2, workers=1)
    names = sorted(snapshots[0][0])
    for k, (ids, t) in enumerate(asked):
        for s, (p, lr) in enumerate(snapshots):
            q = why.flatten(why.query_gradient(p, config, ids, t), names)
            naive = [lr * why.flatten(why.window_gradient(p, config, x[w], y[w]), names) @ q
                     for w in range(len(x))]
            np.testing.assert_allclose(got[k, s], naive, rtol=1e-10,
                                       atol=1e-12 * np.abs(naive).max())


def _full_projection(config, params, steps: int = 500) -> tracin.Projection:
    """Every direction kept (identity bases) and every chance: the index's scores are then
    exact but for each weight matrix, kept as its top rank-one part."""
    eye = lambda k: np.eye(k, dtype=np.float32)  # noqa: E731
    d = config.n_embd
    left = {"u": eye(d), "m": eye(d)}
    right = {}
    if tracin.POSITIONS in params:
        left[tracin.POSITIONS], right[tracin.POSITIONS] = eye(config.n_positions), eye(d)
    for prefix, _, _ in tracin.norm_sites(config):
        left[prefix] = eye(sum(params[n].size for n in tracin.norm_params(config, prefix)))
    return tracin.Projection(left, right, top=config.vocab_size, steps=steps)


@pytest.mark.parametrize("arch", FAMILIES)
def test_the_index_is_exact_but_for_rank_one_on_every_family(arch):
    """With nothing projected away, the index's parts add up to TracIn by its definition
    once each matrix's gradient is swapped for its top singular part (NumPy's SVD): the
    head's part (the tied table's, or W_U's), the rows read, the norms (LayerNorm, RMSNorm,
    q/k norms), with or without biases and a position table."""
    config = _small(arch)
    params = random_params(config, seed=8)
    rng = np.random.default_rng(9)
    x, y = rng.integers(0, 13, (5, 6)), rng.integers(0, 13, (5, 6))
    ids, target = [4, 2, 9, 4], 3
    p = _full_projection(config, params)
    g = tracin.window_gradients(params, config, x, y, p)
    exact_query = ex.next_token_query(params, config, ids, target)
    got = tracin.scores(vars(g), x, y, tracin.query(exact_query, config, p))
    want = why.exact_tracin([(params, 1.0)], config, x, y, ids, target)
    v, dv, _ = tracin.values_and_gradients(
        params, config, x, lambda z: tracin.window_loss_gradient_of_logits(z, y))
    for prefix, inp, outp in tracin.linear_sites(config):
        a, d = exact_query.sites[prefix]
        g_q = a.T.astype(np.float64) @ d
        for w in range(len(x)):
            full = tracin.with_ones(v[inp][w], tracin.has_bias(config, prefix)).T \
                .astype(np.float64) @ dv[outp][w]
            left, s, right = np.linalg.svd(full)
            want[w] += ((s[0] * np.outer(left[:, 0], right[0]) - full) * g_q).sum()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
