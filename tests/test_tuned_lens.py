"""The tuned lens: zero translators are the logit lens exactly, the KL gradient against finite
differences, fitting beats the logit lens on held-out windows, and the `lens` options."""

from __future__ import annotations

import numpy as np
import pytest
from cli_helpers import assert_one_error_line
from conftest import FAMILIES, family_configs, random_params

from tinygpt_cli.analysis import tuned_lens as tl
from tinygpt_cli.analysis.lens import lens_logits
from tinygpt_cli.jobs import tuned_lens as LJ
from tinygpt_cli.jobs.dictionaries import lens as LF
from tinygpt_cli.transformer.trace import run_traced


def _family(arch: str):
    """A small model of the family's block (parallel, untied, RMSNorm, q/k norms...)."""
    config = family_configs(n_embd=8, n_head=2, n_inner=12, vocab_size=13, n_positions=8)[arch]
    return config, random_params(config, seed=0)


@pytest.mark.parametrize("arch", FAMILIES)
def test_zero_translators_are_the_logit_lens_exactly(arch):
    config, params = _family(arch)
    ids = np.array([1, 5, 7, 2, 9, 3])
    tr = run_traced(params, config, ids)
    names, logits = tl.tuned_stage_logits(tr, tl.zero_translators(config), params, config)
    assert names == ["layers.0.resid_pre", "layers.1.resid_pre", "layers.1.resid_post"]
    for i, name in enumerate(names[:-1]):
        np.testing.assert_array_equal(logits[i], lens_logits(tr.get(name), params, config))
    np.testing.assert_array_equal(logits[0], lens_logits(tr.get("embeddings"), params, config))
    np.testing.assert_array_equal(logits[-1], tr.get("logits"))


@pytest.mark.parametrize("arch", FAMILIES)
def test_kl_gradient_matches_finite_differences(arch):
    config, params = _family(arch)
    rng = np.random.default_rng(0)
    d = config.n_embd
    h = rng.normal(size=(5, d))
    a, b = rng.normal(0, 0.2, (d, d)), rng.normal(0, 0.2, d)
    logp_final = tl.final_log_probs(rng.normal(size=(5, d)), params, config)
    _, da, db = tl.kl_and_grads(h, a, b, logp_final, params, config)
    eps = 1e-6
    for p, g in ((a, da), (b, db)):
        num = np.zeros_like(p)
        for i in np.ndindex(p.shape):
            old = p[i]
            p[i] = old + eps
            up = tl.kl_and_grads(h, a, b, logp_final, params, config)[0]
            p[i] = old - eps
            down = tl.kl_and_grads(h, a, b, logp_final, params, config)[0]
            p[i] = old
            num[i] = (up - down) / (2 * eps)
        np.testing.assert_allclose(g, num, rtol=1e-5, atol=1e-8)


def test_fitting_beats_the_logit_lens_on_held_out_windows(tiny_config, tiny_params):
    rng = np.random.default_rng(1)
    ids = rng.integers(0, tiny_config.vocab_size, size=(40, tiny_config.n_positions))
    stages, last = tl.stage_values(tiny_params, tiny_config, ids[:30])
    translators, _ = tl.fit(stages, last, tiny_params, tiny_config, steps=150, batch=64,
                            lr=1e-2)
    r = tl.evaluate(*tl.stage_values(tiny_params, tiny_config, ids[30:]), translators,
                    tiny_params, tiny_config)
    assert (r.kl_tuned < r.kl_logit).all(), (r.kl_tuned, r.kl_logit)
    zero = tl.evaluate(*tl.stage_values(tiny_params, tiny_config, ids[30:]),
                       tl.zero_translators(tiny_config), tiny_params, tiny_config)
    np.testing.assert_array_equal(zero.kl_tuned, zero.kl_logit)


@pytest.fixture
def data(tmp_path):
    from conftest import story_parts

    return story_parts(tmp_path / "data", (4, 5, 6))


def test_lens_fit_kind_tuned_and_evaluate(cli, data, tmp_path, monkeypatch):
    monkeypatch.setattr(LJ, "FIT_STEPS", 3)
    monkeypatch.setattr(LJ, "FIT_WINDOWS", 2)
    monkeypatch.setattr(LJ, "EVAL_WINDOWS", 2)
    out = tmp_path / "tuned.safetensors"
    r = cli("lens", "--fit", "--data", data, "--lens", out, "--json")
    assert r.code == 0, r.err
    assert r.json()["stages"] == ["layers.0.resid_pre", "layers.1.resid_pre"] and out.is_file()
    r = cli("lens", "Lily wanted to play", "--kind", "tuned", "--lens", out, "--json")
    assert r.code == 0, r.err
    assert r.json()["stages"] == ["layers.0.resid_pre", "layers.1.resid_pre",
                                  "layers.1.resid_post"]
    r = cli("lens", "Lily wanted to play", "--kind", "tuned", "--lens", out)
    assert r.code == 0 and "0.pre" in r.out and "1.post" in r.out
    r = cli("lens", "--evaluate", "--data", data, "--lens", out, "--json")
    doc = r.json()
    assert r.code == 0 and doc["data"] == ["part-002.txt"] and len(doc["kl_tuned_lens"]) == 2


def test_lens_errors(cli, tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x00" * 20)
    assert_one_error_line(cli("lens", "Lily", "--kind", "tuned", "--lens", bad), 1,
                          "not a readable safetensors file")
    assert_one_error_line(cli("lens", "Lily", "--kind", "tuned", "--lens",
                              tmp_path / "none.safetensors"), 2, "no tuned lens at")
    assert_one_error_line(cli("lens", "Lily", "--kind", "bent"), 2, "--kind must be logit")


def test_the_shipped_tuned_lens_fits_the_shipped_model():
    from tinygpt_cli.storage.locations import SHIPPED
    from tinygpt_cli.transformer.folder import load_model

    path = SHIPPED / "lens" / "tuned.safetensors"
    if not path.is_file():
        pytest.skip("no shipped tuned lens")
    model = load_model(SHIPPED)
    tr = LF.load_translators(path, model.config, model.weights_file)
    assert len(tr.A) == model.config.n_layer
    assert any(np.abs(a).max() > 0 for a in tr.A)  # fitted, not the zero start


def test_evaluating_windows_reports_every_token_twice_and_equals_evaluate(tiny_config,
                                                                          tiny_params):
    ids = np.random.default_rng(2).integers(0, tiny_config.vocab_size,
                                            size=(5, tiny_config.n_positions))
    tr = tl.zero_translators(tiny_config)
    tr.A[0][:] = np.random.default_rng(3).normal(0, 0.01, tr.A[0].shape)
    done = []
    got = tl.evaluate_windows(tiny_params, tiny_config, ids, tr, progress=done.append)
    want = tl.evaluate(*tl.stage_values(tiny_params, tiny_config, ids), tr, tiny_params,
                       tiny_config)
    assert sum(done) == 2 * ids.size and len(done) > 1
    for name in ("kl_logit", "kl_tuned", "top1_logit", "top1_tuned"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name))


def test_lens_evaluate_reports_its_progress(cli, tiny, data, tmp_path, monkeypatch):
    """lens --evaluate (and --fit) hand cli.common.progress the right totals, and a pipe gets
    lines from it (the bar is for a terminal)."""
    from tinygpt_cli.cli import common

    monkeypatch.setattr(LJ, "FIT_STEPS", 2)
    monkeypatch.setattr(LJ, "FIT_WINDOWS", 2)
    monkeypatch.setattr(LJ, "EVAL_WINDOWS", 3)
    seen = []
    real = common.progress

    def spy(total, description, **kw):
        import contextlib

        assert kw.get("pipe_every"), description  # long work: lines in a pipe too
        done = [0]
        seen.append((description, total, done))

        @contextlib.contextmanager
        def counting():
            with real(total, description, **kw) as advance:
                yield lambda n=1: (done.__setitem__(0, done[0] + n), advance(n))

        return counting()

    monkeypatch.setattr(common, "progress", spy)
    out = tmp_path / "tuned.safetensors"
    assert cli("lens", "--fit", "--evaluate", "--data", data, "--lens", out).code == 0
    assert [d for d, _, _ in seen] == ["reading the text", "values of the stages",
                                       "fitting the tuned lens", "reading the text",
                                       "evaluating both lenses"]
    assert all(total == done[0] for _, total, done in seen)
    assert seen[-1][1] == 2 * 3 * tiny.model.config.n_positions  # two passes, 3 windows


def test_progress_in_a_pipe_prints_lines_from_its_first_second(capsys, monkeypatch):
    import time

    from tinygpt_cli.render.progress import progress

    monkeypatch.delenv("TINYGPT_PROGRESS")
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    with progress(4, "fitting", pipe_every=5) as advance:
        for _ in range(4):
            clock[0] += 0.2  # 0.8 s in all: a quick run says nothing
            advance()
    assert capsys.readouterr().err == ""
    with progress(8, "fitting", pipe_every=5) as advance:
        for _ in range(8):
            clock[0] += 1.5  # a line at 1.5 s (past the first second), then every 5 s
            advance()
    assert capsys.readouterr().err.splitlines() == [
        "fitting: 1/8 (12%), about 10 s left", "fitting: 5/8 (62%), about 4 s left",
        "fitting: 8/8 (100%)"]
    monkeypatch.setenv("TINYGPT_PROGRESS", "0")  # never, however long
    with progress(4, "fitting", pipe_every=5) as advance:
        clock[0] += 60
        advance(4)
    assert capsys.readouterr().err == ""
    monkeypatch.delenv("TINYGPT_PROGRESS")
    with progress(4, "fitting") as advance:  # without pipe_every: the bar only, never lines
        clock[0] += 60
        advance(4)
    assert capsys.readouterr().err == ""
