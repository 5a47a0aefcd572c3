"""The tuned lens: zero translators are the logit lens exactly, the KL gradient against finite
differences, fitting beats the logit lens on held-out windows, and the `lens` options."""

from __future__ import annotations

import numpy as np
import pytest
from cli_helpers import assert_one_error_line

from tinygpt_cli.analysis import tuned_lens as tl
from tinygpt_cli.analysis.lens import lens_logits
from tinygpt_cli.model import trace


def test_zero_translators_are_the_logit_lens_exactly(tiny_config, tiny_params):
    ids = np.array([1, 5, 7, 2, 9, 3])
    tr = trace(tiny_params, tiny_config, ids)
    names, logits = tl.tuned_stage_logits(tr, tl.zero_translators(tiny_config), tiny_params,
                                          tiny_config)
    assert names == ["layers.0.resid_pre", "layers.1.resid_pre", "layers.1.resid_post"]
    for i, name in enumerate(names[:-1]):
        np.testing.assert_array_equal(logits[i], lens_logits(tr.get(name), tiny_params,
                                                             tiny_config))
    np.testing.assert_array_equal(logits[0], lens_logits(tr.get("embeddings"), tiny_params,
                                                         tiny_config))
    np.testing.assert_array_equal(logits[-1], tr.get("logits"))


def test_kl_gradient_matches_finite_differences(tiny_config, tiny_params):
    rng = np.random.default_rng(0)
    d = tiny_config.n_embd
    h = rng.normal(size=(5, d))
    a, b = rng.normal(0, 0.2, (d, d)), rng.normal(0, 0.2, d)
    logp_final = tl.final_log_probs(rng.normal(size=(5, d)), tiny_params, tiny_config)
    _, da, db = tl.kl_and_grads(h, a, b, logp_final, tiny_params, tiny_config)
    eps = 1e-6
    for p, g in ((a, da), (b, db)):
        num = np.zeros_like(p)
        for i in np.ndindex(p.shape):
            old = p[i]
            p[i] = old + eps
            up = tl.kl_and_grads(h, a, b, logp_final, tiny_params, tiny_config)[0]
            p[i] = old - eps
            down = tl.kl_and_grads(h, a, b, logp_final, tiny_params, tiny_config)[0]
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
    from conftest import SENTENCES

    folder = tmp_path / "data"
    folder.mkdir()
    for i in range(3):
        (folder / f"part-00{i}.txt").write_text(
            "\n<|endoftext|>\n".join(SENTENCES * (4 + i)) + "\n")
    return folder


def test_lens_fit_kind_tuned_and_evaluate(cli, data, tmp_path, monkeypatch):
    monkeypatch.setattr(tl, "FIT_STEPS", 3)
    monkeypatch.setattr(tl, "FIT_WINDOWS", 2)
    monkeypatch.setattr(tl, "EVAL_WINDOWS", 2)
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
    from tinygpt_cli.weights import SHIPPED, load_model

    path = SHIPPED / "lens" / "tuned.safetensors"
    if not path.is_file():
        pytest.skip("no shipped tuned lens")
    model = load_model(SHIPPED)
    tr = tl.load_translators(path, model.config)
    assert len(tr.A) == model.config.n_layer
    assert any(np.abs(a).max() > 0 for a in tr.A)  # fitted, not the zero start
