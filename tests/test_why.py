"""The "why this token" analyses, each checked against a mathematical property on a tiny float64
model (an independent computation: a forward pass with weights removed by hand, finite
differences, naive loops), then through the CLI on the tiny weights."""

from __future__ import annotations

import numpy as np
import pytest
from cli_helpers import TEXT, TEXT_IDS, assert_one_error_line, make_tiny, without_head
from conftest import patched_slope

from tinygpt_cli.analysis import ablate as ab
from tinygpt_cli.analysis import attribute as at
from tinygpt_cli.analysis import means as ms
from tinygpt_cli.analysis import patch as pa
from tinygpt_cli.analysis.dla import direct_logit_attribution
from tinygpt_cli.analysis.lens import logit_lens
from tinygpt_cli.analysis.variants import run_variants
from tinygpt_cli.jobs import means as mean_job
from tinygpt_cli.transformer import ops
from tinygpt_cli.transformer.hooks import Replace, ablation
from tinygpt_cli.transformer.model import forward
from tinygpt_cli.transformer.trace import run_traced

IDS = np.array([3, 17, 5, 9, 22, 1])
OTHER = np.array([4, 17, 8, 9, 2, 1])  # same length, three tokens changed


def logp(logits):
    return ops.log_softmax(np.asarray(logits, np.float64))


# ------------------------------------------------------------------ lens


def test_the_last_lens_stage_is_the_models_own_logits(tiny_params, tiny_config):
    tr = run_traced(tiny_params, tiny_config, IDS)
    lens = logit_lens(tr, tiny_params, tiny_config)
    assert lens.stages == ["embeddings", "layers.0.resid_mid", "layers.0.resid_post",
                           "layers.1.resid_mid", "layers.1.resid_post"]
    assert (lens.logits[-1] == tr["logits"]).all()  # bit for bit, not within a tolerance


def test_the_last_lens_stage_is_the_logits_bit_for_bit_in_float32():
    """The shipped model computes in float32, where a norm or a product written apart from
    the pass's own rounds differently (by up to 3.8e-6 once): the lens uses the pass's."""
    from tinygpt_cli.transformer.folder import load_model

    model = load_model()
    for text in ("Lily wanted to play with her", "Once"):
        ids = model.tokenizer.encode(text)
        tr = run_traced(model.params, model.config, ids)
        lens = logit_lens(tr, model.params, model.config)
        assert lens.logits.dtype == np.float32
        assert (lens.logits[-1] == tr["logits"]).all(), text


def test_a_lens_stage_recomputes_the_final_norm_on_its_own_stream(tiny_params, tiny_config):
    """The stage after block 1's attention reads the same as the model with block 1's MLP
    taken out: both are ln_final(resid_mid) W_E^T, the norm's statistics from resid_mid."""
    tr = run_traced(tiny_params, tiny_config, IDS)
    lens = logit_lens(tr, tiny_params, tiny_config)
    without_mlp = forward(tiny_params, tiny_config, IDS,
                          hooks=ablation(["layers.1.mlp_out"], tiny_config))
    np.testing.assert_allclose(lens.logits[3], without_mlp, atol=1e-10, rtol=0)


def test_the_lens_targets_chance_and_rank_per_stage(tiny_params, tiny_config):
    lens = logit_lens(run_traced(tiny_params, tiny_config, IDS), tiny_params, tiny_config)
    for token in (0, 7, 22):
        probs, ranks = lens.target(token, 2)
        for s in range(len(lens.stages)):
            z = lens.logits[s, 2]
            assert probs[s] == pytest.approx(np.exp(logp(z)[token]), rel=1e-12)
            assert ranks[s] == 1 + sum(1 for v in z if v > z[token])  # a naive count
    ids, chance = lens.top()
    assert (ids == lens.logits.argmax(-1)).all()
    np.testing.assert_allclose(chance, np.exp(logp(lens.logits).max(-1)), rtol=1e-12)


# ------------------------------------------------------------------ direct logit attribution


@pytest.mark.parametrize("position, target, vs", [(5, 4, None), (2, 11, 19), (0, 0, 1)])
def test_dla_rows_add_up_to_the_logit_or_the_difference(tiny_params, tiny_config, position,
                                                        target, vs):
    tr = run_traced(tiny_params, tiny_config, IDS)
    r = direct_logit_attribution(tr, tiny_params, tiny_config, position, target, vs,
                                 neurons=5)
    z = tr["logits"][position]
    expected = z[target] - (z[vs] if vs is not None else 0.0)
    assert r.total == pytest.approx(expected, abs=1e-4)
    assert r.score == pytest.approx(expected, abs=1e-12)
    assert len(r.labels) == 2 + tiny_config.n_layer * (tiny_config.n_head + 2) + 1
    assert r.labels[-1] == "ln_final.bias"


def test_dla_parts_are_the_final_stream_and_heads_share_the_attention_output(
        tiny_params, tiny_config):
    cfg = tiny_config
    tr = run_traced(tiny_params, cfg, IDS)
    labels, parts = tr.residual_parts(tiny_params, 4)
    np.testing.assert_allclose(parts.sum(0), tr["layers.1.resid_post"][4], atol=1e-12)
    # The heads and the bias of block 0 together are its attention output, seen by the final
    # norm with its real scale: centred(attn_out) / s . (g * W_E[t]).
    t = 6
    r = direct_logit_attribution(tr, tiny_params, cfg, 4, t)
    a = tr["layers.0.attn_out"][4]
    by_hand = (a - a.mean()) / tr["ln_final.std"][4, 0] @ (tiny_params["ln_final.w"]
                                                          * tiny_params["embed.W_E"][t])
    block0 = [k for k, name in enumerate(r.labels) if name.startswith(("L0H", "L0.attn"))]
    assert r.values[block0].sum() == pytest.approx(by_hand, abs=1e-12)
    np.testing.assert_array_equal(r.heads[1], r.values[[r.labels.index(f"L1H{h}")
                                                        for h in range(cfg.n_head)]])


def test_dla_neurons_add_up_to_their_mlp_row(tiny_params, tiny_config):
    cfg = tiny_config
    tr = run_traced(tiny_params, cfg, IDS)
    every = cfg.n_layer * cfg.n_inner
    r = direct_logit_attribution(tr, tiny_params, cfg, 5, 3, 8, neurons=every)
    assert len(r.neurons) == every
    sizes = [abs(n["value"]) for n in r.neurons]
    assert sizes == sorted(sizes, reverse=True)
    d = tiny_params["embed.W_E"][3] - tiny_params["embed.W_E"][8]
    for i in range(cfg.n_layer):
        b = tiny_params[f"layers.{i}.mlp.b_out"]
        bias_share = (b - b.mean()) / tr["ln_final.std"][5, 0] @ (tiny_params["ln_final.w"] * d)
        total = sum(n["value"] for n in r.neurons if n["layer"] == i) + bias_share
        assert total == pytest.approx(r.values[r.labels.index(f"L{i}.mlp")], abs=1e-10)


# ------------------------------------------------------------------ ablation


def test_ablating_nothing_changes_nothing(tiny_params, tiny_config):
    edit = {p: ab.replacement("zero", p) for p in ab.all_components(tiny_config)}
    before, found = ab.ablate(tiny_params, tiny_config, IDS, [[]], edit, 5, 4)
    np.testing.assert_allclose(before, forward(tiny_params, tiny_config, IDS)[5], atol=1e-12)
    assert found[0].delta == 0.0 and found[0].kl == 0.0


def test_resampling_from_the_text_itself_changes_nothing(tiny_params, tiny_config):
    tr = run_traced(tiny_params, tiny_config, IDS)
    comps = ab.all_components(tiny_config)
    edit = {p: ab.replacement("resample", p, source=tr.values) for p in comps}
    _, found = ab.ablate(tiny_params, tiny_config, IDS, [[p] for p in comps], edit, 5, 4)
    for e in found:
        assert abs(e.delta) < 1e-12 and e.kl < 1e-12


def test_zero_ablating_a_head_equals_removing_its_rows_of_c_proj(tiny_params, tiny_config):
    cfg = tiny_config
    comps = ab.all_components(cfg)
    edit = {p: ab.replacement("zero", p) for p in comps}
    before, found = ab.ablate(tiny_params, cfg, IDS, [[p] for p in comps], edit, 3, 9)
    lp = logp(before)
    for layer in range(cfg.n_layer):
        for head in range(cfg.n_head):
            e = found[comps.index(ab.head_path(layer, head))]
            by_hand = forward(without_head(tiny_params, cfg, layer, head), cfg, IDS)[3]
            lq = logp(by_hand)
            assert e.logp_after == pytest.approx(lq[9], abs=1e-12)
            assert e.kl == pytest.approx(float(np.sum(np.exp(lp) * (lp - lq))), abs=1e-12)
            assert e.kl > 0


def test_mean_ablation_puts_the_mean_at_every_position(tiny_params, tiny_config):
    cfg = tiny_config
    path = ab.mlp_path(0)
    mean = np.linspace(-1, 1, cfg.n_embd)
    _, (e,) = ab.ablate(tiny_params, cfg, IDS, [[path]],
                        {path: ab.replacement("mean", path, means={path: mean})}, 5, 2)
    by_hand = forward(tiny_params, cfg, IDS, hooks=Replace({path: lambda x: np.tile(mean, (6, 1))}))
    assert e.logp_after == pytest.approx(logp(by_hand[5])[2], abs=1e-12)


def test_value_means_are_the_average_over_every_position_of_every_window(
        tiny_params, tiny_config):
    windows = np.array([IDS, OTHER, IDS[::-1]])
    means = mean_job.value_means(tiny_params, tiny_config, windows, batch=2)
    assert sorted(means) == sorted(ms.mean_paths(tiny_config))
    for path in ("layers.1.heads.0.out", "layers.0.mlp_out", "layers.1.attn_out"):
        rows = [run_traced(tiny_params, tiny_config, w)[path] for w in windows]
        naive = sum(r.sum(axis=0) for r in rows) / (len(windows) * len(IDS))
        np.testing.assert_allclose(means[path], naive, atol=1e-12)


# ------------------------------------------------------------------ patching


def test_patching_the_last_stream_restores_all_and_patching_nothing_none(
        tiny_params, tiny_config):
    cfg = tiny_config
    r = pa.activation_patching(tiny_params, cfg, IDS, OTHER, 4, 7)
    last = f"layers.{cfg.n_layer - 1}"
    assert r.stream["resid_post"][-1, 5] == pytest.approx(1.0, abs=1e-9)
    # every position of the last block's output at once: the clean run itself
    clean = run_traced(tiny_params, cfg, IDS)
    post = clean[last + ".resid_post"]
    nothing, everything = run_variants(tiny_params, cfg, OTHER,
                                       [{}, {last + ".resid_post": lambda x: post}])
    assert pa.restored(pa.logit_difference(nothing, 4, 7), r.clean, r.corrupt) == \
        pytest.approx(0.0, abs=1e-9)
    assert pa.restored(pa.logit_difference(everything, 4, 7), r.clean, r.corrupt) == \
        pytest.approx(1.0, abs=1e-9)
    # positions that only differ in value, not in token, still matter through attention;
    # positions after the scored one never do
    r2 = pa.activation_patching(tiny_params, cfg, IDS, OTHER, 4, 7, position=2)
    assert (r2.stream["resid_pre"][:, 3:] == 0).all()
    # the first block's input at a position where the tokens agree changes nothing
    assert r.stream["resid_pre"][0, 1] == pytest.approx(0.0, abs=1e-12)


def test_patching_a_heads_output_equals_the_hand_made_run(tiny_params, tiny_config):
    cfg = tiny_config
    r = pa.activation_patching(tiny_params, cfg, IDS, OTHER, 4, 7)
    clean = run_traced(tiny_params, cfg, IDS)
    z = clean["layers.1.heads.0.out"].copy()
    by_hand = forward(tiny_params, cfg, OTHER, hooks=Replace({"layers.1.heads.0.out":
                                                              lambda x: z}))[5]
    expected = (by_hand[4] - by_hand[7] - r.corrupt) / (r.clean - r.corrupt)
    assert r.heads[1, 0] == pytest.approx(expected, abs=1e-10)


def test_patching_a_blocks_output_at_one_position_equals_the_hand_made_run(
        tiny_params, tiny_config):
    """resid_post of block 0 is block 1's resid_pre, and is filled from it: check it by hand."""
    cfg = tiny_config
    r = pa.activation_patching(tiny_params, cfg, IDS, OTHER, 4, 7)
    row = run_traced(tiny_params, cfg, IDS)["layers.0.resid_post"][3].copy()

    def fn(x):
        x = x.copy()
        x[3] = row
        return x

    z = forward(tiny_params, cfg, OTHER, hooks=Replace({"layers.0.resid_post": fn}))[5]
    expected = (z[4] - z[7] - r.corrupt) / (r.clean - r.corrupt)
    assert r.stream["resid_post"][0, 3] == pytest.approx(expected, abs=1e-10)
    assert abs(expected) > 1e-3  # a patch that matters


def test_variants_with_a_cut_head_give_the_same_rows_of_the_logits(tiny_params, tiny_config):
    edits = [{}, {"layers.0.mlp_out": np.zeros_like}]
    full = run_variants(tiny_params, tiny_config, IDS, edits, 4)
    cut = run_variants(tiny_params, tiny_config, IDS, edits, 4, rows=[7, 2])
    np.testing.assert_allclose(cut, full[:, [7, 2]], atol=1e-12)
    np.testing.assert_allclose(full[0], forward(tiny_params, tiny_config, IDS)[4], atol=1e-12)


def test_variants_started_at_their_first_block_match_full_runs(tiny_params, tiny_config):
    cfg = tiny_config
    tr = run_traced(tiny_params, cfg, IDS)
    streams = [tr[f"layers.{i}.resid_pre"] for i in range(cfg.n_layer)] + \
        [tr[f"layers.{cfg.n_layer - 1}.resid_post"]]
    edits = [{}, {"layers.1.mlp_out": np.zeros_like}, {"layers.0.resid_mid": lambda x: x * 2},
             {"layers.1.heads.0.out": np.zeros_like, "layers.0.attn_out": lambda x: x + 1}]
    full = run_variants(tiny_params, cfg, IDS, edits, 3)
    started = run_variants(tiny_params, cfg, IDS, edits, 3, streams=streams)
    np.testing.assert_allclose(started, full, atol=1e-10)


def test_patch_count_is_the_number_of_patched_runs(tiny_params, tiny_config):
    clean = run_traced(tiny_params, tiny_config, IDS).values
    for position in (0, 3, 5):
        variants, _ = pa.patch_variants(clean, tiny_config, position)
        assert pa.patch_count(tiny_config, position) == len(variants)


def test_patching_needs_a_difference_to_restore(tiny_params, tiny_config):
    from tinygpt_cli.errors import InputError

    with pytest.raises(InputError, match="same logit difference"):
        pa.activation_patching(tiny_params, tiny_config, IDS, IDS, 4, 7)


@pytest.mark.parametrize("kind, layer, t", [("resid_pre", 1, 2), ("resid_mid", 0, 5),
                                             ("attn_out", 1, 4), ("mlp_out", 0, 3)])
def test_attribution_patching_is_the_directional_derivative(tiny_params, tiny_config, kind,
                                                            layer, t):
    """Each AtP cell is d metric along (clean - corrupt) at the corrupt run: compare with a
    central finite difference of the real metric."""
    cfg = tiny_config
    atp = pa.attribution_patching(tiny_params, cfg, IDS, OTHER, 4, 7)
    fd = patched_slope(tiny_params, cfg, IDS, OTHER, f"layers.{layer}.{kind}", t, 4, 7, 5) \
        / (atp.clean - atp.corrupt)
    assert atp.stream[kind][layer, t] == pytest.approx(fd, rel=1e-5, abs=1e-8)


def test_attribution_patching_estimates_real_patching(tiny_params, tiny_config):
    real = pa.activation_patching(tiny_params, tiny_config, IDS, OTHER, 4, 7)
    atp = pa.attribution_patching(tiny_params, tiny_config, IDS, OTHER, 4, 7)
    assert atp.clean == pytest.approx(real.clean) and atp.corrupt == pytest.approx(real.corrupt)
    assert -1.0 <= pa.correlation(atp, real) <= 1.0
    # the last block's output enters the score only through the final norm: the first-order
    # estimate of patching it is exact only for the linear part, but its sign must agree
    assert np.sign(atp.stream["resid_post"][-1, 5]) == np.sign(real.stream["resid_post"][-1, 5])


# ------------------------------------------------------------------ input attribution


def _score_at(params, config, x, position=4, target=5, vs=None):
    z = forward(params, config, IDS, hooks=Replace({"token_embeddings": lambda _: x}))[position]
    return z[target] - (z[vs] if vs is not None else 0.0)


def test_gradients_match_finite_differences_of_the_score(tiny_params, tiny_config):
    cfg = tiny_config
    x = tiny_params["embed.W_E"][IDS]
    g = at.grad(tiny_params, cfg, IDS, 4, 5, 2)
    gx = at.grad_x_input(tiny_params, cfg, IDS, 4, 5, 2)
    eps = 1e-6
    for t in range(len(IDS)):
        fd = np.zeros(cfg.n_embd)
        for k in range(cfg.n_embd):
            up, down = x.copy(), x.copy()
            up[t, k] += eps
            down[t, k] -= eps
            fd[k] = (_score_at(tiny_params, cfg, up, vs=2)
                     - _score_at(tiny_params, cfg, down, vs=2)) / (2 * eps)
        assert g.grad_norm[t] == pytest.approx(np.linalg.norm(fd), rel=1e-6, abs=1e-9)
        assert g.scores[t] == pytest.approx(fd @ x[t] / np.linalg.norm(x[t]), rel=1e-6,
                                            abs=1e-9)
        assert gx.scores[t] == pytest.approx(fd @ x[t], rel=1e-6, abs=1e-9)
    assert g.scores[5] == 0.0  # after the scored position nothing matters


@pytest.mark.parametrize("baseline", [None, OTHER])
def test_integrated_gradients_add_up_to_the_change_in_score(tiny_params, tiny_config, baseline):
    cfg = tiny_config
    b = None if baseline is None else tiny_params["embed.W_E"][baseline]
    r = at.integrated_gradients(tiny_params, cfg, IDS, 4, 5, None, steps=64, baseline=b)
    small, at.STEP_TOKENS = at.STEP_TOKENS, 20  # the same sum over batches of 3 steps
    try:
        batched = at.integrated_gradients(tiny_params, cfg, IDS, 4, 5, None, steps=64,
                                          baseline=b)
    finally:
        at.STEP_TOKENS = small
    np.testing.assert_allclose(batched.scores, r.scores, atol=1e-12)
    f_x = _score_at(tiny_params, cfg, tiny_params["embed.W_E"][IDS])
    f_b = _score_at(tiny_params, cfg, np.zeros((6, cfg.n_embd)) if b is None else b)
    assert r.f == pytest.approx(f_x, abs=1e-10) and r.f_baseline == pytest.approx(f_b, abs=1e-10)
    assert abs(r.scores.sum() - (f_x - f_b)) <= 0.01 * abs(f_x - f_b)
    assert r.gap == pytest.approx(r.scores.sum() - (f_x - f_b), abs=1e-12)


def test_attention_x_grad_is_attention_times_its_finite_difference_gradient(
        tiny_params, tiny_config):
    cfg = tiny_config
    r = at.attention_x_grad(tiny_params, cfg, IDS, 4, 5, 2)
    assert r.scores.shape == (cfg.n_layer, cfg.n_head, len(IDS))
    a = run_traced(tiny_params, cfg, IDS)["layers.1.heads.1.weights"]
    eps = 1e-6
    total = np.zeros(len(IDS))
    for q in range(len(IDS)):
        for k in range(q + 1):
            def score(e, q=q, k=k):
                def fn(w):
                    w = w.copy()
                    w[q, k] += e
                    return w
                z = forward(tiny_params, cfg, IDS,
                            hooks=Replace({"layers.1.heads.1.weights": fn}))[4]
                return z[5] - z[2]
            total[k] += a[q, k] * (score(eps) - score(-eps)) / (2 * eps)
    np.testing.assert_allclose(r.scores[1, 1], total, rtol=1e-5, atol=1e-8)


# ------------------------------------------------------------------ the commands, tiny weights


@pytest.fixture(scope="module")
def tr(tiny):
    return tiny.trace(TEXT_IDS)


def ok(result):
    assert result.code == 0, result.err
    return result.json()


def test_lens_json_last_stage_is_the_models_guess(cli, tiny, tr):
    doc = ok(cli("lens", TEXT, "--json"))
    t = len(TEXT_IDS)
    assert doc["shape"] == [t, 2 * tiny.model.config.n_layer + 1]
    assert doc["ids"] == TEXT_IDS and len(doc["tokens"]) == t
    assert [row[-1] for row in doc["top_ids"]] == list(tr["logits"].argmax(-1))
    assert doc["target"]["id"] == int(tr["logits"][-1].argmax())
    assert doc["target_ranks"][-1] == 1
    p = np.exp(logp(tr["logits"][-1]))
    assert doc["target_probs"][-1] == pytest.approx(p.max(), rel=1e-5)
    assert doc["options"] == {"target": None, "position": -1, "kind": "logit"}


def test_lens_view_is_labelled_by_tokens_and_stages(cli):
    r = cli("lens", TEXT, "--target", " toys")
    assert r.code == 0, r.err
    assert "␣wanted" in r.out and "1.post" in r.out and "␣toys" in r.out
    assert "\x1b[" not in r.out


def test_dla_json_rows_add_up_to_the_logit_difference(cli, tiny, tr):
    doc = ok(cli("dla", TEXT, "--target", " toys", "--vs", " mom", "--neurons", "--json"))
    tok = tiny.model.tokenizer
    t, v = tok.token_to_id(" toys"), tok.token_to_id(" mom")
    z = tr["logits"][-1]
    assert sum(doc["data"]) == pytest.approx(z[t] - z[v], abs=1e-4)
    assert doc["score"] == pytest.approx(z[t] - z[v], abs=1e-5)
    assert doc["shape"] == [len(doc["labels"])] and len(doc["top_neurons"]) == 20
    assert doc["target"] == {"id": t, "token": " toys"} and doc["vs"]["id"] == v
    r = cli("dla", TEXT)
    assert r.code == 0 and "layer 1" in r.out and "ln_final.bias" in r.out


def test_ablate_json_zero_head_equals_the_hand_computation(cli, tiny):
    doc = ok(cli("ablate", TEXT, "--layer", "1", "--head", "0", "--json"))
    m = tiny.model
    by_hand = forward(without_head(m.params, m.config, 1, 0), m.config, np.array(TEXT_IDS))
    (row,) = doc["components"]
    assert row["component"] == "layers.1.heads.0.out"
    assert row["logp_after"] == pytest.approx(logp(by_hand[-1])[doc["target"]["id"]], abs=1e-4)
    assert doc["shape"] == [1, 2] and doc["options"]["mode"] == "zero"


def test_ablate_all_ranks_every_head_and_mlp(cli):
    doc = ok(cli("ablate", TEXT, "--all", "--json"))
    assert sorted(r["label"] for r in doc["components"]) == \
        ["L0.mlp", "L0H0", "L0H1", "L1.mlp", "L1H0", "L1H1"]
    deltas = [abs(r["delta"]) for r in doc["components"]]
    assert deltas == sorted(deltas, reverse=True)
    r = cli("ablate", TEXT, "--all")
    assert r.code == 0 and "L1.mlp" in r.out


def test_ablate_resample_from_the_same_text_changes_nothing(cli):
    doc = ok(cli("ablate", TEXT, "--all", "--mode", "resample", "--from", TEXT + " and",
                 "--json"))
    for row in doc["components"]:
        assert abs(row["delta"]) < 1e-9 and row["kl"] < 1e-9


@pytest.mark.parametrize("args, needle", [
    (["--layer", "0"], "exactly one of --head H or --mlp"),
    ([], "--layer L with --head H or --mlp, or --all"),
    (["--all", "--layer", "0"], "without --layer"),
    (["--layer", "0", "--mlp", "--mode", "resample"], "--from TEXT goes with --mode resample"),
    (["--layer", "0", "--mlp", "--mode", "half"], "unknown --mode 'half'"),
    (["--layer", "5", "--mlp"], "layer 5 is out of range"),
    (["--layer", "0", "--mlp", "--mode", "resample", "--from", "Lily"], "at least as long"),
    (["--all", "--target", " zzqx"], "is not a single token"),
])
def test_ablate_input_errors(cli, args, needle):
    assert_one_error_line(cli("ablate", TEXT, *args), 2, needle)


def test_mean_ablation_with_stored_means_and_with_data(cli, tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "cache"))
    folder = make_tiny(tmp_path / "w").folder
    assert_one_error_line(cli("ablate", TEXT, "--weights", folder, "--all", "--mode", "mean"),
                          2, f"compute them with `tinygpt means --weights {folder}`, or give "
                          "--data DIR")
    data = tmp_path / "data"
    data.mkdir()
    (data / "part-000.txt").write_text("Lily and Tom went out.\n")
    story = "Once upon a time, there was a little girl named Lily. She liked to play. " * 30
    (data / "part-001.txt").write_text(story + "\n<|endoftext|>\n" + story)
    r = cli("means", "--data", data, "--weights", folder)
    assert r.code == 0 and "means.safetensors" in r.out, r.err
    from tinygpt_cli.storage.files import sha256
    from tinygpt_cli.transformer.folder import load_model

    m = load_model(folder)
    stored, meta = mean_job.load_means(folder / "means.safetensors", m.config,
                                       sha256(m.weights_file))
    assert meta["data"] == "part-001.txt" and int(meta["tokens"]) % m.config.n_positions == 0
    assert stored["layers.0.heads.1.out"].shape == (m.config.d_k,)
    assert stored["layers.1.mlp_out"].dtype == np.float32
    a = ok(cli("ablate", TEXT, "--weights", folder, "--all", "--mode", "mean", "--json"))
    b = ok(cli("ablate", TEXT, "--weights", folder, "--all", "--mode", "mean", "--data", data,
               "--json"))
    assert a["components"] == b["components"]
    # by hand: layer 0's MLP output replaced by its stored mean at every position
    mean = stored["layers.0.mlp_out"]
    by_hand = forward(m.params, m.config, np.array(TEXT_IDS),
                      hooks=Replace({"layers.0.mlp_out": lambda x: np.tile(mean, (len(x), 1))}))
    row = next(r for r in a["components"] if r["label"] == "L0.mlp")
    assert row["logp_after"] == pytest.approx(logp(by_hand[-1])[a["target"]["id"]], abs=1e-4)


def test_means_refuse_other_weights(cli, tiny, tmp_path):
    folder = make_tiny(tmp_path / "w").folder
    (folder / "means.safetensors").write_bytes(b"")  # placeholder replaced below
    from tinygpt_cli.transformer.families import load_config

    paths = ms.mean_paths(load_config(folder / "config.json"))
    mean_job.save_means(folder / "means.safetensors", {p: np.zeros(1) for p in paths},
                        {"weights_sha256": "0" * 64})
    assert_one_error_line(cli("ablate", TEXT, "--weights", folder, "--layer", "0", "--mlp",
                              "--mode", "mean"), 2, "computed for other weights")


CORRUPT = "Tom wanted to eat with her"
VS = ("--target", " toys", "--vs", " mom")  # the tiny random model guesses alike for both


def test_patch_json_last_block_restores_everything(cli, tiny):
    doc = ok(cli("patch", TEXT, CORRUPT, *VS, "--json"))
    n_layer, t = tiny.model.config.n_layer, len(TEXT_IDS)
    assert doc["shape"] == [5, n_layer, t] and doc["kinds"][2] == "resid_post"
    assert doc["data"][2][-1][-1] == pytest.approx(1.0, abs=1e-9)
    assert np.array(doc["heads"]).shape == (n_layer, tiny.model.config.n_head)
    assert doc["corrupt_ids"] != doc["ids"] and doc["correlation"] is None
    atp = ok(cli("patch", TEXT, CORRUPT, *VS, "--method", "atp", "--json"))
    assert -1 <= atp["correlation"] <= 1 and atp["clean"] == pytest.approx(doc["clean"])
    r = cli("patch", TEXT, CORRUPT, *VS, "--method", "atp")
    assert r.code == 0 and "correlation with activation patching" in r.out
    assert "resid_mid" in r.out and "head 1" in r.out


def test_patch_errors(cli):
    assert_one_error_line(cli("patch", TEXT, "Tom ran"), 2, "same number of tokens")
    assert_one_error_line(cli("patch", TEXT, CORRUPT, "--target", " toys", "--vs", " toys"), 2,
                          "same token")
    assert_one_error_line(cli("patch", TEXT, CORRUPT, "--method", "fast"), 2, "atp")


def test_attribute_json_integrated_gradients_are_complete(cli):
    doc = ok(cli("attribute", TEXT, "--method", "integrated-gradients", "--steps", "64",
                 "--json"))
    diff = doc["f"] - doc["f_baseline"]
    assert abs(sum(doc["data"]) - diff) <= 0.01 * abs(diff)
    assert doc["completeness_gap"] == pytest.approx(sum(doc["data"]) - diff, abs=1e-6)
    r = cli("attribute", TEXT, "--method", "integrated-gradients", "--baseline",
            "Tom went to eat at the")
    assert r.code == 0 and "completeness" in r.out and "gap" in r.out


@pytest.mark.parametrize("method, shape", [("grad", [6]), ("grad-x-input", [6]),
                                           ("attention-x-grad", [2, 2, 6])])
def test_attribute_methods(cli, method, shape):
    doc = ok(cli("attribute", TEXT, "--method", method, "--vs", " mom", "--json"))
    assert doc["shape"] == shape and doc["options"]["method"] == method
    assert (doc["grad_norm"] is not None) == (method == "grad")
    r = cli("attribute", TEXT, "--method", method)
    assert r.code == 0 and "␣wanted" in r.out


def test_attribute_errors(cli):
    assert_one_error_line(cli("attribute", TEXT, "--method", "saliency"), 2, "unknown --method")
    assert_one_error_line(cli("attribute", TEXT, "--method", "integrated-gradients",
                              "--baseline", "Tom"), 2, "same number of tokens")
    assert_one_error_line(cli("attribute", TEXT, "--target", "#99999"), 2, "unknown token id")


@pytest.mark.parametrize("command", ["lens", "dla", "ablate", "patch", "attribute", "means"])
def test_why_commands_have_help_with_an_example(cli, command):
    r = cli(command, "--help")
    assert r.code == 0 and "  Examples:\n    tinygpt " + command in r.out


def test_means_from_one_text_file_to_a_chosen_path(cli, tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "cache"))
    text = tmp_path / "val.txt"
    text.write_text("Once upon a time, there was a little girl named Lily. " * 40)
    out = tmp_path / "m" / "means.safetensors"
    doc = ok(cli("means", "--data", text, "--out", out, "--json"))
    assert doc["path"] == str(out) and doc["data"] == "val.txt" and out.is_file()
    assert "layers.1.heads.1.out" in doc["values"]
    assert_one_error_line(cli("means", "--data", tmp_path / "nothing"), 2, "does not exist")
