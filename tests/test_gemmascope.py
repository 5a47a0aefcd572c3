"""Gemma Scope 2's dictionaries in the release's own layout (SITE/layer_L_width_W_l0_S/
params.safetensors and config.json, as SAELens' gemma_3 loader reads them), on a random Llama
folder: the latents against an independent NumPy JumpReLU of the recorded values, the graph
built on such transcoders adding up, a transcoder's skip connection, the folder's names
inferred without config.json, and every disagreement (a Gemma module on a Llama, another
model's name, a block or width out of range, an attention-output site) refused by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import TOKENIZER, assert_one_error_line
from safetensors.numpy import save_file

from tinygpt_cli.errors import InputError
from tinygpt_cli.jobs.train.loop import arch_config
from tinygpt_cli.storage.weights import load_model, save_params
from tinygpt_cli.transformer.families import save_config
from tinygpt_cli.transformer.model import init_params, record

TEXT = "Lily wanted to play with her ball"
D, M = 16, 12


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    config = arch_config("llama", n_embd=D, n_layer=2, n_head=4, n_inner=24, vocab_size=4096,
                         n_positions=64)
    save_params(init_params(config, np.random.default_rng(2)), path / "model.safetensors",
                config)
    save_config(config, path / "config.json")
    shutil.copyfile(TOKENIZER, path / "tokenizer.json")
    return path


def write_dictionary(folder: Path, cfg: dict | None, seed: int = 0, skip: bool = False,
                     d_in: int = D, drop: str | None = None) -> dict[str, np.ndarray]:
    """params.safetensors (and config.json) as the release writes them: lower-case w_enc
    [d_in, m], w_dec [m, d], b_enc, b_dec, threshold, affine_skip_connection [d_in, d]."""
    rng = np.random.default_rng(seed)
    t = {"w_enc": rng.normal(0, 0.6, (d_in, M)), "b_enc": rng.normal(0, 0.2, M),
         "threshold": np.abs(rng.normal(0.3, 0.2, M)), "w_dec": rng.normal(0, 0.3, (M, D)),
         "b_dec": rng.normal(0, 0.1, D)}
    if skip:
        t["affine_skip_connection"] = rng.normal(0, 0.1, (d_in, D))
    t = {k: v.astype(np.float32) for k, v in t.items() if k != drop}
    folder.mkdir(parents=True)
    save_file(t, str(folder / "params.safetensors"))
    if cfg is not None:
        (folder / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    return t


def jumprelu(t: dict, x: np.ndarray) -> np.ndarray:
    """The release's formula, written here: ReLU(a) where a > threshold, a = x w_enc + b_enc."""
    a = x.astype(np.float64) @ t["w_enc"] + t["b_enc"]
    return np.where(a > t["threshold"], np.maximum(a, 0), 0.0)


def values(folder: Path, text: str, paths: list[str]) -> dict[str, np.ndarray]:
    model = load_model(folder)
    ids = model.tokenizer.encode(text)
    return record(model.params, model.config, np.asarray(ids), paths)[1]


SAE_CFG = {"architecture": "jump_relu", "model_name": "meta-llama/Llama-3.2-1B",
           "hf_hook_point_in": "model.layers.1.output"}


@pytest.mark.parametrize(("sub", "hook", "site"), [
    ("resid_post_all/layer_1_width_12_l0_small", "model.layers.1.output", "layers.1.resid_post"),
    ("mlp_out/layer_0_width_12_l0_big", "model.layers.0.mlp.output", "layers.0.mlp_out"),
])
def test_a_gemma_scope_sae_encodes_as_the_release_says(cli, llama, tmp_path, sub, hook, site):
    folder = tmp_path / sub
    t = write_dictionary(folder, {**SAE_CFG, "hf_hook_point_in": hook})
    x = values(llama, TEXT, [site])[site]
    want = jumprelu(t, x)
    assert (want > 0).any() and (want == 0).any()
    r = cli("trace", TEXT, f"sae.{site}", "--sae", folder, "--weights", llama, "--json")
    assert r.code == 0, r.err
    z = np.asarray(r.json()["data"])
    np.testing.assert_array_equal(z > 0, want > 0)
    np.testing.assert_allclose(z, want, rtol=1e-4, atol=1e-5)


def test_without_config_the_names_say_what_it_reads(cli, llama, tmp_path):
    folder = tmp_path / "resid_post_all" / "layer_1_width_12_l0_small"
    t = write_dictionary(folder, None, seed=3)
    x = values(llama, TEXT, ["layers.1.resid_post"])["layers.1.resid_post"]
    r = cli("trace", TEXT, "sae.layers.1.resid_post", "--sae", folder, "--weights", llama,
            "--json")
    assert r.code == 0, r.err
    np.testing.assert_allclose(np.asarray(r.json()["data"]), jumprelu(t, x), rtol=1e-4,
                               atol=1e-5)
    # a transcoder's inferred hooks are Gemma 3's norms, which a Llama has not
    tc = tmp_path / "transcoder_all" / "layer_0_width_12_l0_small"
    write_dictionary(tc, None)
    assert_one_error_line(cli("graph", TEXT, "--transcoders", tc.parent, "--weights", llama),
                          2, "pre_feedforward_layernorm", "Gemma")


def transcoders(root: Path, skip: bool = False) -> tuple[Path, list[dict]]:
    folder = root / "transcoder_all"
    made = []
    for i in range(2):
        b = f"model.layers.{i}"
        name = f"layer_{i}_width_12_l0_small" + ("_affine" if skip else "")
        made.append(write_dictionary(folder / name, {
            "architecture": "jump_relu", "model_name": "meta-llama/Llama-3.2-1B",
            "hf_hook_point_in": f"{b}.post_attention_layernorm.output",
            "hf_hook_point_out": f"{b}.mlp.output", "affine_connection": skip},
            seed=10 + i, skip=skip))
    return folder, made


def test_a_graph_on_gemma_scope_transcoders_adds_up(cli, llama, tmp_path):
    folder, made = transcoders(tmp_path)
    story = tmp_path / "story.txt"  # the features' labels read the dictionaries' own files
    story.write_text((TEXT + ". Tom was happy.\n\n") * 20, encoding="utf-8")
    r = cli("graph", TEXT, "--transcoders", folder, "--weights", llama, "--json",
            "--node-threshold", "1", "--edge-threshold", "1", "--data", story, "--windows", "2")
    assert r.code == 0, r.err
    assert any("label" in n for n in r.json()["nodes"])
    doc = r.json()
    tl = doc["target_logit"]
    assert tl["incoming_total"] == pytest.approx(tl["value"], abs=1e-4)
    x = values(llama, TEXT, ["layers.0.ln2.out", "layers.1.ln2.out"])
    for n in doc["nodes"]:
        if n["kind"] == "feature":
            want = jumprelu(made[n["layer"]], x[f"layers.{n['layer']}.ln2.out"])
            assert n["activation"] == pytest.approx(want[n["position"], n["feature"]],
                                                    rel=1e-4, abs=1e-5)
    active = sum(int((jumprelu(made[i], x[f"layers.{i}.ln2.out"]) > 0).sum()) for i in (0, 1))
    assert doc["counts"]["active_features"] == active


def test_a_skip_connection_is_read_and_decoded_with_its_input(llama, tmp_path):
    from tinygpt_cli.analysis import sae as S
    from tinygpt_cli.analysis.gemmascope import load_gemma_scope

    folder, made = transcoders(tmp_path, skip=True)
    model = load_model(llama)
    tc, kind = load_gemma_scope(folder / "layer_1_width_12_l0_small_affine", model.config)
    assert kind == "transcoder" and tc.site == "layers.1.mlp_out"
    x = values(llama, TEXT, ["layers.1.ln2.out"])["layers.1.ln2.out"]
    t = made[1]
    z = jumprelu(t, x)
    want = z @ t["w_dec"] + t["b_dec"] + x.astype(np.float64) @ t["affine_skip_connection"]
    got = S.decode(tc, S.encode(tc, x), x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_the_graph_refuses_a_skip_it_does_not_compute(cli, llama, tmp_path):
    folder, _ = transcoders(tmp_path, skip=True)
    assert_one_error_line(cli("graph", TEXT, "--transcoders", folder, "--weights", llama), 2,
                          "skip connection")


def _sae(tmp_path, **change):
    cfg = {**SAE_CFG, **change}
    folder = tmp_path / "resid_post_all" / "layer_1_width_12_l0_small"
    write_dictionary(folder, {k: v for k, v in cfg.items() if v is not None})
    return folder


@pytest.mark.parametrize(("change", "code", "words"), [
    ({"hf_hook_point_in": "model.layers.1.post_feedforward_layernorm.output"}, 2,
     ("post_feedforward_layernorm", "Gemma")),
    ({"model_name": "google/gemma-3-1b-pt"}, 2, ("gemma-3-1b-pt", "llama model")),
    ({"hf_hook_point_in": "model.layers.7.output"}, 2, ("block 7",)),
    ({"hf_hook_point_in": "transformer.h.1.output"}, 2, ("model.layers.L",)),
    ({"hf_hook_point_in": "model.layers.1.self_attn.o_proj.input"}, 2, ("attention-output",)),
    ({"hf_hook_point_in": "model.layers.1.mlp.down_proj.output"}, 2, ("not a value",)),
    ({"architecture": "topk"}, 2, ("jump_relu",)),
    ({"hf_hook_point_in": "model.layers.0.output"}, 1, ("layer 1", "block 0")),
    ({"hf_hook_point_in": "model.layers.1.mlp.output"}, 1, ("resid_post_all", "mlp_out")),
])
def test_what_disagrees_with_the_model_is_refused_by_name(cli, llama, tmp_path, change, code,
                                                         words):
    folder = _sae(tmp_path, **change)
    r = cli("trace", TEXT, "sae.layers.1.resid_post", "--sae", folder, "--weights", llama)
    assert_one_error_line(r, code, *words)


def test_broken_weights_and_other_widths_are_refused(cli, llama, tmp_path):
    folder = tmp_path / "a" / "resid_post_all" / "layer_1_width_12_l0_small"
    write_dictionary(folder, SAE_CFG, d_in=D + 1)
    assert_one_error_line(cli("trace", TEXT, "sae.layers.1.resid_post", "--sae", folder,
                              "--weights", llama), 2, "17 numbers", "another model")
    folder = tmp_path / "b" / "resid_post_all" / "layer_1_width_12_l0_small"
    write_dictionary(folder, SAE_CFG, drop="threshold")
    assert_one_error_line(cli("trace", TEXT, "sae.layers.1.resid_post", "--sae", folder,
                              "--weights", llama), 1, "no threshold tensor")
    (folder / "config.json").write_text("[1]", encoding="utf-8")
    assert_one_error_line(cli("trace", TEXT, "sae.layers.1.resid_post", "--sae", folder,
                              "--weights", llama), 1, "not a JSON object")


def test_a_gpt2_model_has_no_model_layers(cli, tmp_path):
    folder = _sae(tmp_path)  # the model it names is checked first: a llama
    assert_one_error_line(cli("trace", TEXT, "sae.layers.1.resid_post", "--sae", folder), 2,
                          "Llama-3.2-1B", "gpt2 model")
    shutil.rmtree(folder.parent)
    folder = _sae(tmp_path, model_name=None)  # no name: the module names still tell
    assert_one_error_line(cli("trace", TEXT, "sae.layers.1.resid_post", "--sae", folder), 2,
                          "transformer.h.L")


def test_saelens_reads_the_same_latents(llama, tmp_path):
    """SAELens' own JumpReLU SAE on the release's tensors (renamed as its gemma_3 loader
    does: w_enc -> W_enc ...), against tinygpt's reading of the folder."""
    pytest.importorskip("sae_lens")
    torch = pytest.importorskip("torch")
    from sae_lens import JumpReLUSAE, JumpReLUSAEConfig

    from tinygpt_cli.analysis import sae as S
    from tinygpt_cli.analysis.gemmascope import load_gemma_scope

    folder = tmp_path / "resid_post_all" / "layer_1_width_12_l0_small"
    t = write_dictionary(folder, SAE_CFG)
    model = load_model(llama)
    ours, _ = load_gemma_scope(folder, model.config)
    sae = JumpReLUSAE(JumpReLUSAEConfig(d_in=D, d_sae=M, apply_b_dec_to_input=False))
    sae.load_state_dict({"W_enc": torch.tensor(t["w_enc"]), "W_dec": torch.tensor(t["w_dec"]),
                         "b_enc": torch.tensor(t["b_enc"]), "b_dec": torch.tensor(t["b_dec"]),
                         "threshold": torch.tensor(t["threshold"])})
    x = values(llama, TEXT, ["layers.1.resid_post"])["layers.1.resid_post"]
    want = sae.encode(torch.tensor(x, dtype=torch.float32)).detach().numpy()
    np.testing.assert_allclose(S.encode(ours, x), want, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------ cross-layer transcoders


def write_clt(root: Path, n: int = 2, layers_in_file: int = 2, skip: bool = False):
    """The release's clt/: per block a folder whose w_dec [m, layers, d] writes into every
    block (circuit-tracer's load_gemma_scope_2_clt reads block L's as w_dec[:, L:])."""
    folder = root / "clt"
    made = []
    for i in range(n):
        b = f"model.layers.{i}"
        sub = folder / f"layer_{i}_width_12_l0_medium"
        t = write_dictionary(sub, {"architecture": "jump_relu",
                                   "hf_hook_point_in": f"{b}.post_attention_layernorm.output",
                                   "hf_hook_point_out": f"{b}.mlp.output",
                                   "affine_connection": skip}, seed=20 + i, skip=skip)
        rng = np.random.default_rng(30 + i)
        t["w_dec"] = rng.normal(0, 0.3, (M, layers_in_file, D)).astype(np.float32)
        save_file(t, str(sub / "params.safetensors"))
        made.append(t)
    return folder, made


@pytest.mark.parametrize("skip", [False, True])
def test_a_cross_layer_transcoder_writes_into_every_later_block(llama, tmp_path, skip):
    from tinygpt_cli.analysis.gemmascope import cross_layer_outputs, load_cross_layer

    folder, made = write_clt(tmp_path, skip=skip)
    model = load_model(llama)
    clt = load_cross_layer(folder, model.config)
    got = values(llama, TEXT, ["layers.0.ln2.out", "layers.1.ln2.out"])
    xs = [got["layers.0.ln2.out"], got["layers.1.ln2.out"]]
    zs = [jumprelu(made[i], xs[i]) for i in range(2)]
    assert all((z > 0).any() for z in zs)
    for j, y in enumerate(cross_layer_outputs(clt, xs)):  # a loop over sources, by hand
        want = made[j]["b_dec"].astype(np.float64).copy()
        for i in range(j + 1):
            want = want + zs[i] @ made[i]["w_dec"][:, j]
        if skip:
            want = want + xs[j].astype(np.float64) @ made[j]["affine_skip_connection"]
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


def test_a_cross_layer_transcoder_of_another_depth_is_refused(llama, tmp_path):
    from tinygpt_cli.analysis.gemmascope import load_cross_layer
    from tinygpt_cli.errors import InputError

    folder, _ = write_clt(tmp_path, layers_in_file=3)
    with pytest.raises(InputError, match="into 3 blocks; this model has 2"):
        load_cross_layer(folder, load_model(llama).config)
    folder, _ = write_clt(tmp_path / "b")
    shutil.rmtree(folder / "layer_1_width_12_l0_medium")
    with pytest.raises(InputError, match="0 cross-layer transcoders for block 1"):
        load_cross_layer(folder, load_model(llama).config)


def test_graph_says_a_cross_layer_transcoder_is_not_taken_yet(cli, llama, tmp_path):
    folder, _ = write_clt(tmp_path)
    assert_one_error_line(cli("graph", TEXT, "--transcoders", folder, "--weights", llama), 2,
                          "cross-layer transcoder", "no command takes one yet")


def test_on_gemma_3_the_hooks_are_its_own_modules(cli, tmp_path):
    """On a Gemma 3 model the norm before the MLP is pre_feedforward_layernorm (its
    post_attention_layernorm is the norm after attention, never read as ln2), and the MLP's
    output after its norm, Gemma Scope 2's mlp_out site, is refused by name for now."""
    model = tmp_path / "gemma"
    config = arch_config("gemma3", n_embd=D, n_layer=2, n_head=4, n_inner=24,
                         vocab_size=4096, n_positions=64)
    save_params(init_params(config, np.random.default_rng(4)), model / "model.safetensors",
                config)
    save_config(config, model / "config.json")
    shutil.copyfile(TOKENIZER, model / "tokenizer.json")
    gemma = {**SAE_CFG, "model_name": "google/gemma-3-270m"}
    folder = tmp_path / "resid_post_all" / "layer_1_width_12_l0_small"
    t = write_dictionary(folder, gemma)
    x = values(model, TEXT, ["layers.1.resid_post"])["layers.1.resid_post"]
    r = cli("trace", TEXT, "sae.layers.1.resid_post", "--sae", folder, "--weights", model,
            "--json")
    assert r.code == 0, r.err
    np.testing.assert_allclose(np.asarray(r.json()["data"]), jumprelu(t, x), rtol=1e-4,
                               atol=1e-5)
    from tinygpt_cli.analysis.gemmascope import hook_value

    assert hook_value("model.layers.1.pre_feedforward_layernorm.output", config, "x") == \
        ("ln2.out", 1)
    for hook, words in [("post_attention_layernorm.output", "not a value tinygpt maps"),
                        ("post_feedforward_layernorm.output", "layers.0.ln2_post.out")]:
        with pytest.raises(InputError, match=words):
            hook_value(f"model.layers.0.{hook}", config, "x")
