"""The analyses that were written for GPT-2's block, on the other families' blocks, each
against an independent computation on a tiny float64 random model: activation patching of a
parallel block (GPT-NeoX) cell by cell against a forward pass patched by hand through the
model's hooks, attribution patching against a finite difference of the real metric."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from cli_helpers import TOKENIZER
from conftest import patched_slope

from tinygpt_cli.analysis import patch as pa
from tinygpt_cli.analysis.qk import qk_attribution
from tinygpt_cli.jobs.train.loop import arch_config
from tinygpt_cli.transformer.config import Config
from tinygpt_cli.transformer.families import save_config
from tinygpt_cli.transformer.folder import save_params
from tinygpt_cli.transformer.hooks import Replace
from tinygpt_cli.transformer.model import forward, record
from tinygpt_cli.transformer.trace import run_traced

IDS = np.array([3, 17, 5, 9, 22, 1])
OTHER = np.array([4, 17, 8, 9, 2, 1])  # same length, three tokens changed
TARGET, VS = 4, 7


@pytest.fixture(scope="module")
def neox(make_params):
    """A GPT-NeoX block: parallel attention and MLP, rotary on a part of each head."""
    config = arch_config("neox", n_embd=12, n_layer=2, n_head=2, n_inner=20, vocab_size=23,
                         n_positions=8)
    assert config.parallel and config.rotary
    return config, make_params(config, seed=4)


# ------------------------------------------------------------------ patch on parallel blocks


def _by_hand(params, config, path: str, edit, c: float, r: float) -> float:
    """The fraction restored by one patch, made through Replace on the corrupt text."""
    z = forward(params, config, OTHER, hooks=Replace({path: edit}))[len(OTHER) - 1]
    return (z[TARGET] - z[VS] - r) / (c - r)


def _row(value: np.ndarray, t: int):
    def edit(x):
        x = x.copy()
        x[t] = value[t]
        return x
    return edit


def test_patching_a_parallel_block_has_its_rows_and_each_cell_is_the_hand_made_patch(neox):
    config, params = neox
    real = pa.activation_patching(params, config, IDS, OTHER, TARGET, VS)
    assert list(real.stream) == ["resid_pre", "resid_post", "attn_out", "mlp_out"]
    clean = run_traced(params, config, IDS)
    c, r = real.clean, real.corrupt
    for kind, grid in real.stream.items():
        for layer in range(config.n_layer):
            path = f"layers.{layer}.{kind}"
            for t in range(len(IDS)):
                want = _by_hand(params, config, path, _row(clean[path], t), c, r)
                assert grid[layer, t] == pytest.approx(want, abs=1e-9), (path, t)
    for layer in range(config.n_layer):
        for h in range(config.n_head):
            path = f"layers.{layer}.heads.{h}.out"
            z = clean[path].copy()
            want = _by_hand(params, config, path, lambda x, z=z: z, c, r)
            assert real.heads[layer, h] == pytest.approx(want, abs=1e-9), path
    assert real.stream["resid_post"][-1, -1] == pytest.approx(1.0, abs=1e-9)
    assert np.abs(real.stream["mlp_out"]).max() > 1e-3  # patches that matter
    variants, _ = pa.patch_variants(clean.values, config, len(IDS) - 1)
    assert pa.patch_count(config, len(IDS) - 1) == len(variants)


@pytest.mark.parametrize("kind, layer, t", [("resid_pre", 1, 2), ("attn_out", 0, 5),
                                             ("mlp_out", 1, 3), ("mlp_out", 0, 0)])
def test_attribution_patching_a_parallel_block_is_the_directional_derivative(neox, kind,
                                                                              layer, t):
    config, params = neox
    atp = pa.attribution_patching(params, config, IDS, OTHER, TARGET, VS)
    assert list(atp.stream) == ["resid_pre", "resid_post", "attn_out", "mlp_out"]
    fd = patched_slope(params, config, IDS, OTHER, f"layers.{layer}.{kind}", t, TARGET, VS) \
        / (atp.clean - atp.corrupt)
    assert atp.stream[kind][layer, t] == pytest.approx(fd, rel=1e-5, abs=1e-8)
    # the estimate follows the real patching as on GPT-2's block (this model's: 0.82)
    real = pa.activation_patching(params, config, IDS, OTHER, TARGET, VS)
    assert pa.correlation(atp, real) > 0.5


@pytest.fixture(scope="module")
def neox_folder(tmp_path_factory, make_params):
    import shutil

    config = arch_config("neox", n_embd=16, n_layer=2, n_head=2, n_inner=24, vocab_size=4096,
                         n_positions=64)
    folder = tmp_path_factory.mktemp("neox")
    save_params(make_params(config, seed=5, dtype=np.float32), folder / "model.safetensors",
                config)
    save_config(config, folder / "config.json")
    shutil.copyfile(TOKENIZER, folder / "tokenizer.json")
    return folder


@pytest.mark.parametrize("method", ["activation", "atp"])
def test_patch_runs_on_a_parallel_block_with_its_own_grids(cli, neox_folder, method):
    """The JSON's kinds and the table's grids are the block's: no resid_mid."""
    args = ("patch", "Lily wanted to play with her", "Tom wanted to play with his",
            "--weights", neox_folder, "--method", method)
    r = cli(*args, "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["kinds"] == ["resid_pre", "resid_post", "attn_out", "mlp_out"]
    assert np.asarray(doc["data"]).shape[:2] == (4, 2) and doc["shape"][0] == 4
    assert (doc["correlation"] is None) == (method == "activation")
    r = cli(*args)
    assert r.code == 0, r.err
    assert "resid_post" in r.out and "mlp_out" in r.out and "resid_mid" not in r.out


# ------------------------------------------------------------------ qk on rotary, RMSNorm, Qwen3

QK_FAMILIES = {
    "neox": arch_config("neox", n_embd=12, n_layer=2, n_head=2, n_inner=20, vocab_size=23,
                        n_positions=8),
    "llama": arch_config("llama", n_embd=16, n_layer=2, n_head=4, n_inner=20, vocab_size=23,
                         n_positions=8),
    # each head's q and k RMS-normed; heads of 6 numbers though d / H is 4
    "qwen3": Config(n_embd=16, n_layer=2, n_head=4, n_kv_head=2, head_dim=6, n_inner=20,
                    vocab_size=23, n_positions=8, model_type="qwen3", norm="rms",
                    positions="rotary", mlp="gated", act="silu", tied=False, qk_norm=True,
                    qkv_bias=False, out_bias=False, mlp_bias=False),
}


@pytest.fixture(params=list(QK_FAMILIES))
def qk_case(request, make_params):
    config = QK_FAMILIES[request.param]
    params = make_params(config, seed=6)
    _, values = record(params, config, IDS)
    return config, params, values


def test_qk_terms_sum_to_every_recorded_score_of_every_head(qk_case):
    """Each (query part, key part) term through the frozen norms and the rotation: their sum
    is the score the forward pass itself recorded, for every head, query and key."""
    config, params, values = qk_case
    for layer in range(config.n_layer):
        for head in range(config.n_head):
            for query in range(len(IDS)):
                r = qk_attribution(params, config, values, layer, head, query)
                assert "position" not in r.sources  # rotary: no position part
                want = values[f"layers.{layer}.heads.{head}.scores"][query, :query + 1]
                np.testing.assert_allclose(r.terms.sum(axis=(0, 1)), want, rtol=1e-10,
                                           atol=1e-10, err_msg=f"L{layer}H{head} q{query}")


def _turned(x: np.ndarray, position: int, rot: int, base: float) -> np.ndarray:
    """x [d_k] with each pair (x_i, x_{i + rot/2}), i < rot/2, turned by position *
    base^(-2i / rot) radians, as a plane rotation written out pair by pair."""
    out = x.copy()
    for i in range(rot // 2):
        a = position * base ** (-2 * i / rot)
        c, s = np.cos(a), np.sin(a)
        out[i] = c * x[i] - s * x[i + rot // 2]
        out[i + rot // 2] = s * x[i] + c * x[i + rot // 2]
    return out


def test_a_qwen3_qk_term_is_the_hand_made_product_through_both_norms_and_the_turn(
        make_params):
    """One term by hand from the weights: the token embedding at the query and at the key,
    each through ln1 (divided by the rms of the whole stream there), the head's W_q (W_k),
    the head's own norm (divided by the rms of the whole unnormed q, k), then turned by its
    position; the dot product times 1/sqrt(d_k)."""
    config = QK_FAMILIES["qwen3"]
    params = make_params(config, seed=6)
    _, values = record(params, config, IDS)
    layer, head, query, key = 1, 3, 5, 2
    r = qk_attribution(params, config, values, layer, head, query)
    dk, eps, kv = config.d_k, config.layer_norm_epsilon, head // 2
    w = params[f"layers.{layer}.attn.W_QKV"]
    wq = w[:, head * dk:(head + 1) * dk]
    wk = w[:, (config.n_head + kv) * dk:(config.n_head + kv + 1) * dk]
    g = params[f"layers.{layer}.ln1.w"]
    stream = values[f"layers.{layer}.resid_pre"]
    token = params["embed.W_E"][IDS]

    def one_side(t: int, wx: np.ndarray, scale: np.ndarray) -> np.ndarray:
        rms = np.sqrt(np.mean(stream[t] ** 2) + eps)
        whole = (stream[t] / rms * g) @ wx  # the whole unnormed q (or k) at t
        rms_head = np.sqrt(np.mean(whole ** 2) + eps)
        return _turned((token[t] / rms * g) @ wx / rms_head * scale, t, dk, config.rotary_base)

    q = one_side(query, wq, params[f"layers.{layer}.attn.q_norm.w"])
    k = one_side(key, wk, params[f"layers.{layer}.attn.k_norm.w"])
    at = r.sources.index("token")
    assert r.terms[at, at, key] == pytest.approx(q @ k / np.sqrt(dk), rel=1e-10)
    assert abs(r.terms[at, at, key]) > 1e-3


def test_qk_runs_on_a_qwen3_folder_and_its_terms_sum_to_the_score(cli, tmp_path, make_params):
    import shutil

    config = replace(QK_FAMILIES["qwen3"], vocab_size=4096, n_positions=64)
    folder = tmp_path / "qwen3"
    save_params(make_params(config, seed=7, dtype=np.float32), folder / "model.safetensors",
                config)
    save_config(config, folder / "config.json")
    shutil.copyfile(TOKENIZER, folder / "tokenizer.json")
    r = cli("qk", "Lily wanted to play with her", "--weights", folder, "--layer", "1",
            "--head", "2", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    np.testing.assert_allclose(np.asarray(doc["data"]).sum(axis=(0, 1)), doc["scores"],
                               rtol=1e-4, atol=1e-4)
    assert "position" not in doc["sources"]
