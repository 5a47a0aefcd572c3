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

# and Gemma 3's block: norms after each branch (their gains are TracIn sites too), the
# embeddings read times sqrt(d), a window shorter than the text, a rotary base per block
WHY_FAMILIES = (*FAMILIES, "gemma3")


def _configs(**sizes) -> dict:
    from dataclasses import replace

    from tinygpt_cli.jobs.train.loop import arch_config

    sizes = dict(n_embd=24, n_layer=2, n_head=6, n_inner=20, vocab_size=23,
                 n_positions=12) | sizes
    gemma = arch_config("gemma3", **sizes)
    return {**family_configs(**sizes), "gemma3": replace(
        gemma, windows=(3, 0), rotary_bases=(50.0, 3000.0), n_kv_head=sizes["n_head"] // 2)}


def _small(arch: str):
    return _configs(n_inner=10, vocab_size=13, n_positions=6)[arch]


@pytest.mark.parametrize("arch", WHY_FAMILIES)
def test_exact_pass_equals_explicit_window_gradients_on_every_family(arch):
    config = _small(arch)
    snapshots = [(random_params(config, seed=8), 0.5), (random_params(config, seed=9), 2.0)]
    assert ex.covered(config, snapshots[0][0]) == set(snapshots[0][0])  # nothing left out
    stream = np.random.default_rng(9).integers(0, 13, 6 * 5 + 1)
    x, y = why.windows(stream, 6)
    asked = [([4, 2, 9, 4], 3), ([7, 0, 7, 1, 12, 3], 0)]
    got = ex.scores_over_stream(
        [(p, lr, [ex.next_token_query(p, config, ids, t) for ids, t in asked])
         for p, lr in snapshots], config, stream, batch=2)
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


@pytest.mark.parametrize("arch", WHY_FAMILIES)
def test_the_index_is_exact_but_for_rank_one_on_every_family(arch):
    """With nothing projected away, the index's parts (the head's and the rows read per
    position, each matrix's rank-one pair, the rest per window) add up to TracIn by its
    definition once each matrix's gradient is swapped for its top singular part (NumPy's
    SVD: the power steps find that part, and every other term is exact): the
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
    # and the rank-one part is not the whole: the matrices' other directions count here
    assert np.abs(got - why.exact_tracin([(params, 1.0)], config, x, y, ids, target)).max() \
        > 1e-2 * np.abs(want).max()
    # stored as the index stores them (bfloat16), the scores move by little
    quantised = tracin.scores(tracin.stored([g]), x, y, tracin.query(exact_query, config, p))
    np.testing.assert_allclose(quantised, got, rtol=0.05, atol=0.02 * np.abs(got).max())
    assert np.any(quantised != got)


@pytest.fixture(scope="module", params=["llama", "neox"])
def trained(request, tmp_path_factory):
    """A tiny model of the family trained here by the project's own loop, with snapshots,
    on test_history's stories with its planted fact (a rare name always followed by one
    word); its data folder beside it."""
    from dataclasses import asdict, replace

    from test_history import FACT, STORIES, VAL, write_stories

    from tinygpt_cli.jobs.corpus import read_stories
    from tinygpt_cli.jobs.train.loop import Settings, arch_config, train
    from tinygpt_cli.transformer.tokenizer import save_tokenizer, train_tokenizer

    root = tmp_path_factory.mktemp(request.param)
    (root / "data").mkdir()
    rng = np.random.default_rng(0)
    stories = STORIES * 6 + FACT
    train_file = write_stories(root / "data" / "part-000.txt",
                               [stories[i] for i in rng.permutation(len(stories))])
    val_file = write_stories(root / "data" / "part-001.txt", VAL)
    out = root / "weights"
    tok = train_tokenizer(read_stories([train_file]), 512)
    save_tokenizer(tok, out / "tokenizer.json")
    config = replace(arch_config(request.param, n_embd=16, n_layer=2, n_head=4, n_inner=32,
                                 n_positions=32, vocab_size=512), vocab_size=tok.vocab_size)
    train([train_file], [val_file], out,
          Settings(steps=120, batch_size=8, lr=1e-2, warmup=10, dropout=0.0, eval_every=120,
                   checkpoint_every=120, seed=0, snapshots=4, config=asdict(config)))
    return out


def test_why_on_a_trained_family_model_ranks_by_exact_tracin(trained, tmp_path, monkeypatch,
                                                             capsys):
    """`why --exact` on a Llama and a NeoX model trained here: its windows are TracIn's top
    by the definition (explicit window gradients at every snapshot), a window of the
    planted fact first; the index's answer (`why`) re-scores its top exactly and
    --check measures its agreement with the exact ranking."""
    from cli_helpers import Runner, clean_env
    from test_history import definition_scores, fact_windows

    from tinygpt_cli.transformer.folder import load_model

    clean_env(monkeypatch)
    monkeypatch.setenv("TINYGPT_WEIGHTS", str(trained))
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "cache"))
    cli = Runner(capsys, monkeypatch)
    model = load_model(trained)
    tok, config = model.tokenizer, model.config
    (name,), (target,) = tok.encode(" Quixby"), tok.encode(" zooms")
    data = ["--data", trained.parent / "data"]
    got = cli("why", "The frog Quixby", "--target", f"#{target}", *data, "--exact", "--json")
    assert got.code == 0, got.err
    rows = got.json()["top_windows"]
    stream, naive = definition_scores(trained, "The frog Quixby", target)
    assert [r["window"] for r in rows] == list(np.argsort(-naive, kind="stable")[: len(rows)])
    for r in rows:
        assert r["score"] == pytest.approx(naive[r["window"]], rel=1e-4, abs=1e-6)
    planted = fact_windows(stream, name, target, config.n_positions)
    # the first window teaches the fact (on the NeoX model the other one is fifth: windows
    # with many of the query's words score high too, TracIn's known bias)
    assert rows[0]["window"] in planted
    checked = cli("why", "The frog Quixby", "--target", f"#{target}", *data, "--check",
                  "--json")
    assert checked.code == 0, checked.err
    doc = checked.json()
    assert all(r["found_by"] == "index" for r in doc["top_windows"])
    for r in doc["top_windows"]:  # re-scored exactly
        assert r["exact_score"] == pytest.approx(naive[r["window"]], rel=1e-2, abs=1e-4)
    assert doc["check"]["exact_top_10"] == list(np.argsort(-naive, kind="stable")[:10])
    assert doc["check"]["spearman"] >= 0.9


@pytest.mark.parametrize("arch", WHY_FAMILIES)
def test_an_edges_gradient_on_every_family(arch):
    """why --value edge:U->V on every family: the query is minus the gradient of circuit's
    exact edge score, against central differences of circuit.exact_scores itself (which
    runs the family's own steps) at entries of every parameter, for a receiver of every
    kind (a head's q, k and v, read through the family's norm, projection and turn; an MLP,
    a parallel block's through its own ln2; the logits); grouped key/value heads summed
    back from their copies; and the exact pass with the query against the naive loop."""
    from types import SimpleNamespace

    from test_history import assert_exact_scores_are_the_naive_loops

    from tinygpt_cli.analysis import circuit

    config = _configs(n_embd=8, n_head=2, n_inner=12, vocab_size=13, n_positions=6)[arch]
    params = random_params(config, seed=3)
    clean, corrupt, target, vs = [4, 2, 9, 4, 1], [4, 7, 9, 3, 6], 5, 8
    model = SimpleNamespace(config=config, params=params, weights_file=None)
    names = circuit.build_graph(config).edge_names()
    rng = np.random.default_rng(0)
    # GELU by erf (NeoX) is computed with Abramowitz and Stegun's erf (error 1.5e-7) and
    # differentiated by the exact formula: its gradients are that far from its own slope
    near = 1e-6 if config.act == "gelu" else 1e-8
    for k, edge in enumerate(("embed -> L1H0.k", "L0H1 -> L1H1.q", "L0H1 -> L1H0.v",
                              "L0.mlp -> logits", "embed -> L0.mlp", "L0H0 -> L1.mlp")):
        def score(p, e=names.index(edge)):
            pair = circuit.prepare(p, config, clean, corrupt, target, vs)
            return circuit.exact_scores(pair)[e]

        v = why.value_of(model, clean, "edge:" + edge, target, vs, corrupt=corrupt)
        assert v.amount == pytest.approx(score(params), rel=1e-9, abs=1e-12)
        assert abs(v.amount) > 1e-4, edge  # a real edge: its gradient is not trivially zero
        q = v.make(params)
        for name in sorted(params):  # two entries of every parameter
            for _ in range(2):
                idx = tuple(int(rng.integers(0, n)) for n in params[name].shape)
                up = {n: a.copy() for n, a in params.items()}
                down = {n: a.copy() for n, a in params.items()}
                up[name][idx] += 1e-6
                down[name][idx] -= 1e-6
                assert -q.grads[name][idx] == pytest.approx(
                    (score(up) - score(down)) / 2e-6, rel=1e-5, abs=near), (edge, name, idx)
        if k in (0, 1, 4):  # the combined query's products, rows and factors, in the pass
            assert_exact_scores_are_the_naive_loops(q, params, config, 0.5, windows=4, batch=3)


def test_history_on_a_trained_family_model_is_each_snapshots_loss(trained, tmp_path,
                                                                    monkeypatch, capsys):
    """`history` on a Llama and a NeoX model trained here: each snapshot's loss on the text
    is the cross-entropy of that snapshot's own forward pass, and it falls."""
    from cli_helpers import Runner, clean_env

    from tinygpt_cli.jobs import history as snapshots_of
    from tinygpt_cli.transformer.folder import load_model
    from tinygpt_cli.transformer.model import forward

    clean_env(monkeypatch)
    monkeypatch.setenv("TINYGPT_WEIGHTS", str(trained))
    doc = Runner(capsys, monkeypatch)("history", "The cat sat on the mat.", "--json").json()
    model = load_model(trained)
    timeline = snapshots_of.timeline(model, snapshots_of.find_snapshots(
        trained / snapshots_of.HISTORY, trained / "model.safetensors"))
    ids = np.asarray(doc["ids"])
    assert len(doc["snapshots"]) == len(timeline) == 4
    for row, snap in zip(doc["snapshots"], timeline, strict=True):
        logits = forward(snap.params, model.config, ids).astype(np.float64)
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        assert row["loss"] == pytest.approx(-np.mean(logp[np.arange(len(ids) - 1), ids[1:]]),
                                            rel=1e-5)
    assert doc["data"][-1] < doc["data"][0] - 0.5


@pytest.mark.parametrize("r", [0, 1, 3])
def test_the_tables_part_of_a_score_is_its_naive_sum(r):
    """tracin.token_scores (one gather from the head's factor per term, the rows read only
    where the query's text read the token) against its definition summed term by term:
    sum_t sum_j weight (a[id] . (b u_t) + rows[slot[id]] . u_t), for several pairs of
    (ids, weights), weights per term or one for all, a head of rank 0, 1 or more."""
    rng = np.random.default_rng(r)
    w, t, k, v, n = 3, 5, 4, 11, 3
    values = rng.standard_normal((w, t, k)).astype(np.float32)
    a = rng.standard_normal((v, r)).astype(np.float32)
    b = rng.standard_normal((r, k)).astype(np.float32)
    rows = np.concatenate([rng.standard_normal((n, k)), np.zeros((1, k))]).astype(np.float32)
    slot = np.full(v, n)
    slot[[2, 7, 9]] = np.arange(n)  # the query's text read tokens 2, 7 and 9
    top = rng.integers(0, v, (w, t, 2))
    pairs = [(top, rng.random((w, t, 2)).astype(np.float32)),
             (rng.integers(0, v, (w, t, 1)), np.float32(-0.25))]
    want = np.zeros(w)
    for ids, weights in pairs:
        weights = np.broadcast_to(weights, ids.shape)
        for i in range(w):
            for p in range(t):
                for j in range(ids.shape[-1]):
                    token = ids[i, p, j]
                    term = float(a[token] @ (b @ values[i, p])) if r else 0.0
                    want[i] += weights[i, p, j] * (term + float(rows[slot[token]] @ values[i, p]))
    got = tracin.token_scores(values, pairs, a, b, slot, rows)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert np.any(slot[top] < n)  # the rows' part was reached, not only the zero row


def test_an_attention_weight_a_sliding_window_masks_is_refused():
    """why --value layers.L.heads.H.weights[i,j] with j before block L's window: that weight
    is 0 whatever the parameters (its gradient too), so every window would score 0; refused
    as a later column is, and the same column of the full block is a value."""
    from types import SimpleNamespace

    from tinygpt_cli.errors import InputError

    config = _configs(n_embd=8, n_head=2, n_inner=12, vocab_size=13, n_positions=6)["gemma3"]
    model = SimpleNamespace(config=config, params=random_params(config, seed=3),
                            weights_file=None)
    ids, target = [4, 2, 9, 4, 1], 5  # block 0 sees the last 3 keys, block 1 all
    with pytest.raises(InputError, match=r"block 0 is a sliding block, where row 4 sees "
                                         r"columns 2\.\.4 alone \(the last 3\); column 1 is "
                                         r"masked"):
        why.value_of(model, ids, "layers.0.heads.1.weights[4,1]", target, None)
    assert why.value_of(model, ids, "layers.0.heads.1.weights[4,2]", target, None).amount > 0
    assert why.value_of(model, ids, "layers.1.heads.1.weights[4,1]", target, None).amount > 0
