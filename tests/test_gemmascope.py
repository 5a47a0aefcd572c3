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
from tinygpt_cli.transformer.families import save_config
from tinygpt_cli.transformer.folder import load_model, save_params
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
                     d_in: int = D, drop: str | None = None, d_out: int = D
                     ) -> dict[str, np.ndarray]:
    """params.safetensors (and config.json) as the release writes them: lower-case w_enc
    [d_in, m], w_dec [m, d], b_enc, b_dec, threshold, affine_skip_connection [d_in, d]."""
    rng = np.random.default_rng(seed)
    t = {"w_enc": rng.normal(0, 0.6, (d_in, M)), "b_enc": rng.normal(0, 0.2, M),
         "threshold": np.abs(rng.normal(0.3, 0.2, M)), "w_dec": rng.normal(0, 0.3, (M, d_out)),
         "b_dec": rng.normal(0, 0.1, d_out)}
    if skip:
        t["affine_skip_connection"] = rng.normal(0, 0.1, (d_in, d_out))
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


def whole_graph(cli, tmp_path: Path, transcoders, weights, *more):
    """`graph TEXT --json` keeping every node and edge, the features' top windows searched in
    a small story file: not the whole training text, which the test's tokenizer would encode
    first (about 4 s a test)."""
    story = tmp_path / "story.txt"
    story.write_text((TEXT + ". Tom was happy.\n\n") * 20, encoding="utf-8")
    return cli("graph", TEXT, "--transcoders", transcoders, "--weights", weights, "--json",
               "--node-threshold", "1", "--edge-threshold", "1", "--data", story,
               "--windows", "2", *more)


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
    r = whole_graph(cli, tmp_path, folder, llama)  # the features' labels: the dictionaries' own
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
    from tinygpt_cli.jobs.dictionaries.gemmascope import load_gemma_scope

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


def test_a_graph_through_skip_connections_adds_up(cli, llama, tmp_path):
    """_affine transcoders: the skip is a path of the frozen model (every edge through it
    against torch: tests/test_graph_clt.py); the target is still the sum of its edges."""
    folder, _ = transcoders(tmp_path, skip=True)
    r = whole_graph(cli, tmp_path, folder, llama)
    assert r.code == 0, r.err
    tl = r.json()["target_logit"]
    assert tl["incoming_total"] == pytest.approx(tl["value"], abs=1e-4)


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
    ({"hf_hook_point_in": "model.layers.1.self_attn.o_proj.input"}, 1,
     ("resid_post_all", "attn_out")),
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
    from tinygpt_cli.jobs.dictionaries.gemmascope import load_gemma_scope

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
    from tinygpt_cli.analysis.dictionary import cross_layer_outputs
    from tinygpt_cli.jobs.dictionaries.gemmascope import load_cross_layer

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
    from tinygpt_cli.errors import InputError
    from tinygpt_cli.jobs.dictionaries.gemmascope import load_cross_layer

    folder, _ = write_clt(tmp_path, layers_in_file=3)
    with pytest.raises(InputError, match="into 3 blocks; this model has 2"):
        load_cross_layer(folder, load_model(llama).config)
    folder, _ = write_clt(tmp_path / "b")
    shutil.rmtree(folder / "layer_1_width_12_l0_medium")
    with pytest.raises(InputError, match="0 cross-layer transcoders for block 1"):
        load_cross_layer(folder, load_model(llama).config)


def test_graph_takes_a_cross_layer_transcoders_folder(cli, llama, tmp_path):
    """graph --transcoders clt/: its latents in every block, the target logit the sum of
    its incoming edges (the edges themselves: tests/test_graph_clt.py, against torch);
    what does not compute a cross-layer path yet refuses it by name."""
    folder, made = write_clt(tmp_path)
    r = whole_graph(cli, tmp_path, folder, llama)
    assert r.code == 0, r.err
    doc = r.json()
    tl = doc["target_logit"]
    assert tl["incoming_total"] == pytest.approx(tl["value"], abs=1e-4)
    x = values(llama, TEXT, ["layers.0.ln2.out", "layers.1.ln2.out"])
    active = sum(int((jumprelu(made[i], x[f"layers.{i}.ln2.out"]) > 0).sum()) for i in (0, 1))
    assert doc["counts"]["active_features"] == active
    assert_one_error_line(cli("graph", TEXT, "--transcoders", folder, "--weights", llama,
                              "--qk"), 2, "--qk", "cross-layer")
    assert_one_error_line(cli("transcoder", "eval", "--transcoders", folder, "--weights",
                              llama), 2, "cross-layer", "graph only")
    one = folder / "layer_0_width_12_l0_medium"
    assert_one_error_line(cli("trace", TEXT, "sae.layers.0.mlp_out", "--sae", one,
                              "--weights", llama), 2, "cross-layer transcoder", "clt/")


def test_on_gemma_3_the_hooks_are_its_own_modules(cli, tmp_path):
    """On a Gemma 3 model the norm before the MLP is pre_feedforward_layernorm (its
    post_attention_layernorm is the norm after attention, never read as ln2), and the MLP's
    output after its norm, Gemma Scope 2's mlp_out site, is its ln2_post.out."""
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
    from tinygpt_cli.jobs.dictionaries.gemmascope import hook_value

    assert hook_value("model.layers.1.pre_feedforward_layernorm.output", config, "x") == \
        ("ln2.out", 1)
    assert hook_value("model.layers.0.post_feedforward_layernorm.output", config, "x") == \
        ("ln2_post.out", 0)
    with pytest.raises(InputError, match="not a value tinygpt maps"):
        hook_value("model.layers.0.post_attention_layernorm.output", config, "x")


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma")
    config = arch_config("gemma3", n_embd=D, n_layer=2, n_head=4, n_inner=24,
                         vocab_size=4096, n_positions=64)
    save_params(init_params(config, np.random.default_rng(4)), path / "model.safetensors",
                config)
    save_config(config, path / "config.json")
    shutil.copyfile(TOKENIZER, path / "tokenizer.json")
    return path


def gemma_transcoders(root: Path, cross: bool = False) -> tuple[Path, list[dict]]:
    """transcoder_all/ (or clt/) as the release writes them for Gemma 3: each block's latents
    read pre_feedforward_layernorm's output and predict post_feedforward_layernorm's."""
    folder = root / ("clt" if cross else "transcoder_all")
    made = []
    for i in range(2):
        b = f"model.layers.{i}"
        sub = folder / f"layer_{i}_width_12_l0_small"
        t = write_dictionary(sub, {
            "architecture": "jump_relu", "model_name": "google/gemma-3-270m",
            "hf_hook_point_in": f"{b}.pre_feedforward_layernorm.output",
            "hf_hook_point_out": f"{b}.post_feedforward_layernorm.output",
            "affine_connection": False}, seed=40 + i)
        if cross:
            t["w_dec"] = np.random.default_rng(50 + i).normal(0, 0.3, (M, 2, D)).astype(
                np.float32)
            save_file(t, str(sub / "params.safetensors"))
        made.append(t)
    return folder, made


def release_clt(root: Path, n: int = 2, affine: bool = False) -> tuple[Path, list[dict]]:
    """The release's cross-layer transcoder: clt/width_12_l0_medium[_affine]/ holding
    params_layer_L.safetensors, a file a block, no config (hooks inferred: Gemma 3's norm
    before the MLP to its norm after), w_dec [m, n_layers, d]."""
    folder = root / "clt" / ("width_12_l0_medium" + ("_affine" if affine else ""))
    folder.mkdir(parents=True)
    made = []
    for i in range(n):
        rng = np.random.default_rng(70 + i)
        t = {"w_enc": rng.normal(0, 0.6, (D, M)), "b_enc": rng.normal(0, 0.2, M),
             "threshold": np.abs(rng.normal(0.3, 0.2, M)),
             "w_dec": rng.normal(0, 0.3, (M, n, D)), "b_dec": rng.normal(0, 0.1, D)}
        if affine:
            t["affine_skip_connection"] = rng.normal(0, 0.1, (D, D))
        t = {k: v.astype(np.float32) for k, v in t.items()}
        save_file(t, str(folder / f"params_layer_{i}.safetensors"))
        made.append(t)
    return folder, made


def test_the_releases_cross_layer_transcoder_files_are_read(gemma, llama, tmp_path):
    """params_layer_L.safetensors: block L's latents read its ln2.out and write ln2_post.out
    of blocks L.. (w_dec[:, L:]); each block's output by a loop written here; a file for a
    block the model has not, a missing one, or the layout on a Llama (no
    pre_feedforward_layernorm) refused by name."""
    from tinygpt_cli.analysis.dictionary import cross_layer_outputs
    from tinygpt_cli.jobs.dictionaries import transcoders as TF

    folder, made = release_clt(tmp_path)
    model = load_model(gemma)
    clt = TF.load_transcoders(folder, model.config, model.weights_file)
    assert clt.site == "ln2_post.out" and clt.skip is None
    got = values(gemma, TEXT, ["layers.0.ln2.out", "layers.1.ln2.out"])
    xs = [got["layers.0.ln2.out"], got["layers.1.ln2.out"]]
    zs = [jumprelu(made[i], xs[i]) for i in range(2)]
    for j, y in enumerate(cross_layer_outputs(clt, xs)):
        want = made[j]["b_dec"].astype(np.float64) + sum(zs[i] @ made[i]["w_dec"][:, j]
                                                         for i in range(j + 1))
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
    affine, _ = release_clt(tmp_path / "a", affine=True)
    assert TF.load_transcoders(affine, model.config, model.weights_file).skip is not None
    three, _ = release_clt(tmp_path / "b", n=3)
    with pytest.raises(InputError, match="a file for block 2; this model has 2"):
        TF.load_transcoders(three, model.config, model.weights_file)
    (folder / "params_layer_1.safetensors").unlink()
    with pytest.raises(InputError, match="no params_layer_1.safetensors"):
        TF.load_transcoders(folder, model.config, model.weights_file)
    other, _ = release_clt(tmp_path / "c")
    llama_model = load_model(llama)
    with pytest.raises(InputError, match="pre_feedforward_layernorm"):
        TF.load_transcoders(other, llama_model.config, llama_model.weights_file)


@pytest.mark.parametrize("cross", [False, True, "release"])
def test_a_graph_on_gemma_3_with_gemma_scope_2s_transcoders_adds_up(cli, gemma, tmp_path,
                                                                     cross):
    """On Gemma 3 the transcoders' outputs are the MLP's after its norm (ln2_post.out): the
    graph's target is the sum of its incoming edges and its errors are those of that value
    (every edge against torch: tests/test_graph_clt.py); the circuit-tracer document and
    --open's re-check agree with it."""
    folder, made = release_clt(tmp_path) if cross == "release" else \
        gemma_transcoders(tmp_path, cross)
    r = whole_graph(cli, tmp_path, folder, gemma)
    assert r.code == 0, r.err
    doc = r.json()
    tl = doc["target_logit"]
    assert tl["incoming_total"] == pytest.approx(tl["value"], abs=1e-4)
    x = values(gemma, TEXT, ["layers.0.ln2.out", "layers.1.ln2.out"])
    zs = [jumprelu(made[i], x[f"layers.{i}.ln2.out"]) for i in (0, 1)]
    assert doc["counts"]["active_features"] == sum(int((z > 0).sum()) for z in zs) > 0
    out = tmp_path / "g.json"
    r = cli("graph", TEXT, "--transcoders", folder, "--weights", gemma, "--format",
            "circuit-tracer")
    assert r.code == 0, r.err
    out.write_text(r.out, encoding="utf-8")
    r = cli("graph", "--open", out, "--transcoders", folder, "--weights", gemma, "--json")
    assert r.code == 0, r.err
    check = r.json()
    assert check["agree"] == check["checked"] > 0 and not check["features_inactive"], check


# ------------------------------------------------------------------ a latent in the commands


def latent_on(folder: Path, model: Path, sub: str, hook: str, name: str, seed: int = 7):
    """A Gemma Scope 2 SAE at `hook` and a latent of it active at the text's last token."""
    sae = model.parent / sub
    t = write_dictionary(sae, {**SAE_CFG, "model_name": name, "hf_hook_point_in": hook},
                         seed=seed)
    return sae, t


@pytest.mark.parametrize("which", ["llama", "gemma"])
def test_sae_feature_and_ablate_read_a_gemma_scope_latent(cli, llama, gemma, tmp_path, which):
    """sae feature N --sae FOLDER: the latent at each token as the release's formula gives it,
    its top contexts from stories and the tokens it promotes through the tied head; --ablate
    sae.SITE.N --sae FOLDER: the stream less that latent's z W_dec[N], the rest kept."""
    model = {"llama": llama, "gemma": gemma}[which]
    name = {"llama": "meta-llama/Llama-3.2-1B", "gemma": "google/gemma-3-270m"}[which]
    site = "layers.1.resid_post"
    sae, t = latent_on(tmp_path, model, f"{which}-sae/resid_post/layer_1_width_12_l0_small",
                       "model.layers.1.output", name)
    x = values(model, TEXT, [site])[site]
    z = jumprelu(t, x)
    n = int(np.argmax(z[-1]))
    assert z[-1, n] > 0
    r = cli("sae", "feature", str(n), "--sae", sae, "--weights", model, "--text", TEXT,
            "--json")
    assert r.code == 0, r.err
    np.testing.assert_allclose(np.asarray(r.json()["data"]), z[:, n], rtol=1e-4, atol=1e-5)
    story = tmp_path / "story.txt"
    story.write_text((TEXT + ". Tom was happy.\n\n") * 20, encoding="utf-8")
    r = cli("sae", "feature", str(n), "--sae", sae, "--weights", model, "--data", story,
            "--windows", "4", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["site"] == site and doc["contexts"]
    for c in doc["contexts"]:
        assert c["value"] == pytest.approx(max(c["acts"])) and c["value"] > 0
    loaded = load_model(model)
    w = loaded.params["ln_final.w"].astype(np.float64)
    direct = (t["w_dec"][n].astype(np.float64) * w) @ loaded.params["embed.W_E"].T
    assert doc["promotes"][0]["id"] == int(np.argmax(direct))
    assert doc["promotes"][0]["logit"] == pytest.approx(direct.max(), rel=1e-4)
    # --ablate: the stream less z_n w_dec[n] at every position, by a hook written here
    from tinygpt_cli.transformer.hooks import Replace
    from tinygpt_cli.transformer.model import forward

    def minus(v):
        return v - jumprelu(t, v)[:, n:n + 1] * t["w_dec"][n]

    ids = np.asarray(loaded.tokenizer.encode(TEXT))
    want = forward(loaded.params, loaded.config, ids, hooks=Replace({site: minus}, who="t"))
    r = cli("logits", TEXT, "--ablate", f"sae.{site}.{n}", "--sae", sae, "--weights", model,
            "--json")
    assert r.code == 0, r.err
    np.testing.assert_allclose(np.asarray(r.json()["data"]), want[-1], rtol=1e-4, atol=1e-4)
    plain = forward(loaded.params, loaded.config, ids)
    assert np.abs(want[-1] - plain[-1]).max() > 1e-3


def test_why_value_of_a_gemma_scope_latent_is_its_gradient(make_params, llama, tmp_path):
    """why --value sae.SITE.N[P] --sae FOLDER: the latent of a Gemma Scope 2 folder, read
    as the release's formula gives it, its query the latent's gradient (central
    differences of the latent itself); the option is why's."""
    from types import SimpleNamespace

    from test_history import assert_query_is_the_values_gradient

    from tinygpt_cli.analysis import why
    from tinygpt_cli.jobs.dictionaries.saes import finder
    from tinygpt_cli.transformer.trace import run_traced

    config = arch_config("llama", n_embd=D, n_layer=2, n_head=4, n_inner=24, vocab_size=13,
                         n_positions=8)
    params = make_params(config, seed=5)
    sae, t = latent_on(tmp_path, tmp_path / "w", "resid_post/layer_0_width_12_l0_small",
                       "model.layers.0.output", "meta-llama/Llama-3.2-1B", seed=9)
    ids = [4, 2, 9, 4, 1]
    site = "layers.0.resid_post"

    def latent_of(p, n):
        return jumprelu(t, run_traced(p, config, np.asarray(ids)).values[site])[2, n]

    z = jumprelu(t, run_traced(params, config, np.asarray(ids)).values[site])
    n = int(np.argmax(z[2]))
    assert z[2, n] > 0
    model = SimpleNamespace(config=config, params=params, weights_file=tmp_path / "w" / "m")
    v = why.value_of(model, ids, f"sae.{site}.{n}[2]", 0, None, saes=finder(model, (sae,)))
    assert v.amount == pytest.approx(z[2, n], rel=1e-6)
    q = v.make(params)
    assert_query_is_the_values_gradient(q, params, lambda p: latent_of(p, n), (
        ("embed.W_E", (9, 2)), ("layers.0.attn.W_QKV", (1, 5)), ("layers.0.mlp.W_in", (2, 3))))
    assert not q.grads["layers.1.attn.W_QKV"].any()
    with pytest.raises(InputError, match="no SAE file"):  # without --sae: the folder's own
        why.value_of(model, ids, f"sae.{site}.{n}[2]", 0, None, saes=finder(model))


# ------------------------------------------------------------------ attention-output SAEs


@pytest.fixture(scope="module")
def wide_heads(tmp_path_factory):
    """A Gemma 3 model whose heads are wider than d / H: 4 heads of 6, o_proj's input 24."""
    path = tmp_path_factory.mktemp("heads")
    config = arch_config("gemma3", n_embd=D, n_layer=2, n_head=4, head_dim=6, n_inner=24,
                         vocab_size=4096, n_positions=64)
    save_params(init_params(config, np.random.default_rng(6)), path / "model.safetensors",
                config)
    save_config(config, path / "config.json")
    shutil.copyfile(TOKENIZER, path / "tokenizer.json")
    return path


def test_an_attention_output_sae_reads_the_heads_side_by_side(cli, wide_heads, tmp_path):
    """attn_out_all/'s hook, model.layers.L.self_attn.o_proj.input: every head's output side
    by side, head 0's six numbers first (merged here by hand from layers.L.z); trace, sae
    feature and --ablate read it so, the latent's push on the logits through W_O; an SAE of
    the model's width d is refused naming both widths."""
    folder = tmp_path / "attn_out_all" / "layer_1_width_12_l0_small"
    cfg = {"architecture": "jump_relu", "model_name": "google/gemma-3-270m",
           "hf_hook_point_in": "model.layers.1.self_attn.o_proj.input"}
    t = write_dictionary(folder, cfg, seed=11, d_in=24, d_out=24)
    heads = values(wide_heads, TEXT, ["layers.1.z"])["layers.1.z"]  # [H, T, 6]
    merged = np.concatenate([heads[h] for h in range(4)], axis=-1)
    z = jumprelu(t, merged)
    assert (z > 0).any() and (z == 0).any()
    r = cli("trace", TEXT, "sae.layers.1.z", "--sae", folder, "--weights", wide_heads, "--json")
    assert r.code == 0, r.err
    np.testing.assert_allclose(np.asarray(r.json()["data"]), z, rtol=1e-4, atol=1e-5)
    n = int(np.argmax(z[-1]))
    r = cli("sae", "feature", str(n), "--sae", folder, "--weights", wide_heads, "--text", TEXT,
            "--json")
    assert r.code == 0, r.err
    loaded = load_model(wide_heads)
    p = {k: v.astype(np.float64) for k, v in loaded.params.items()}
    push = (t["w_dec"][n] @ p["layers.1.attn.W_O"] * p["ln_final.w"]) @ p["embed.W_E"].T
    assert r.json()["promotes"][0]["id"] == int(np.argmax(push))
    from tinygpt_cli.transformer.hooks import Replace
    from tinygpt_cli.transformer.model import forward

    def minus(v):  # each head's slice of the latent's decoder row, taken from its output
        v = v.copy()
        for h in range(4):
            v[h] -= z[:, n:n + 1] * t["w_dec"][n][6 * h:6 * h + 6]
        return v

    ids = np.asarray(loaded.tokenizer.encode(TEXT))
    want = forward(loaded.params, loaded.config, ids,
                   hooks=Replace({"layers.1.z": minus}, who="t"))[-1]
    r = cli("logits", TEXT, "--ablate", f"sae.layers.1.z.{n}", "--sae", folder, "--weights",
            wide_heads, "--json")
    assert r.code == 0, r.err
    np.testing.assert_allclose(np.asarray(r.json()["data"]), want, rtol=1e-4, atol=1e-4)
    narrow = tmp_path / "b" / "attn_out_all" / "layer_1_width_12_l0_small"
    write_dictionary(narrow, cfg, seed=11)
    assert_one_error_line(cli("trace", TEXT, "sae.layers.1.z", "--sae", narrow, "--weights",
                              wide_heads), 2, "reads 16 numbers", "have 24")


# ------------------------------------------------------------------ hub ids with a path inside


def cache_repo(cache: Path, repo: str, commit: str, source: Path) -> None:
    """The files under `source` (folders kept) as huggingface_hub caches a snapshot of the
    model repository `repo` at `commit`: blobs named by their hash, the snapshot's entries
    relative symbolic links to them, refs/main holding the commit."""
    import hashlib
    import os

    storage = cache / ("models--" + repo.replace("/", "--"))
    (storage / "blobs").mkdir(parents=True, exist_ok=True)
    for file in sorted(p for p in source.rglob("*") if p.is_file()):
        data = file.read_bytes()
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        entry = storage / "snapshots" / commit / file.relative_to(source)
        entry.parent.mkdir(parents=True, exist_ok=True)
        entry.symlink_to(os.path.relpath(blob, entry.parent))
    (storage / "refs").mkdir(exist_ok=True)
    (storage / "refs" / "main").write_text(commit)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An offline hub cache holding org/scope: a resid_post SAE and, for each block, two
    transcoders of two sparsities; the working folder an empty one."""
    pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    src = tmp_path / "src"
    made = {"sae": write_dictionary(src / "resid_post" / "layer_1_width_12_l0_small", SAE_CFG)}
    for l0 in ("small", "big"):
        for i in range(2):
            b = f"model.layers.{i}"
            made[l0, i] = write_dictionary(
                src / "transcoder_all" / f"layer_{i}_width_12_l0_{l0}",
                {"architecture": "jump_relu", "model_name": "meta-llama/Llama-3.2-1B",
                 "hf_hook_point_in": f"{b}.post_attention_layernorm.output",
                 "hf_hook_point_out": f"{b}.mlp.output"}, seed=60 + i + 5 * (l0 == "big"))
    cache_repo(tmp_path / "hf" / "hub", "org/scope", "c" * 40, src)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return made


def test_a_hub_id_with_the_path_inside_the_repository(cli, llama, hub_cache, tmp_path):
    """--sae ORG/NAME/PATH and --transcoders ORG/NAME/PATH read the folder inside the hub
    cache's snapshot (offline here, laid out as huggingface_hub lays it out); a pattern's last
    part picks one transcoder a block where the release has several; a folder the snapshot
    has not is one error line."""
    x = values(llama, TEXT, ["layers.1.resid_post", "layers.0.ln2.out", "layers.1.ln2.out"])
    r = cli("trace", TEXT, "sae.layers.1.resid_post", "--sae",
            "org/scope/resid_post/layer_1_width_12_l0_small", "--weights", llama, "--json")
    assert r.code == 0, r.err
    np.testing.assert_allclose(np.asarray(r.json()["data"]),
                               jumprelu(hub_cache["sae"], x["layers.1.resid_post"]),
                               rtol=1e-4, atol=1e-5)
    r = whole_graph(cli, tmp_path, "org/scope/transcoder_all/layer_*_width_12_l0_big", llama)
    assert r.code == 0, r.err
    active = sum(int((jumprelu(hub_cache["big", i], x[f"layers.{i}.ln2.out"]) > 0).sum())
                 for i in (0, 1))
    assert r.json()["counts"]["active_features"] == active
    assert_one_error_line(cli("graph", TEXT, "--transcoders", "org/scope/transcoder_all",
                              "--weights", llama), 2, "2 transcoders for block 0",
                          "layer_*_width_16k_l0_small")
    assert_one_error_line(cli("trace", TEXT, "sae.layers.1.resid_post", "--sae",
                              "org/scope/mlp_out/layer_1_width_12_l0_small", "--weights", llama),
                          2, "org/scope has no folder mlp_out/layer_1_width_12_l0_small")
    assert_one_error_line(cli("trace", TEXT, "sae.layers.1.resid_post", "--sae",
                              "org/absent/resid_post/x", "--weights", llama), 2,
                          "org/absent/resid_post/x is not a folder here nor in the hub cache")


def test_transcoder_eval_on_gemma_3_replaces_the_mlps_output_after_its_norm(gemma, tmp_path):
    """Gemma Scope 2's transcoders on Gemma 3 predict ln2_post.out: the evaluation reads that
    value (variance explained against the release's formula on the recorded values) and the
    replacement model puts the prediction there (its loss, by a hook written here)."""
    from tinygpt_cli.analysis import transcoder as T
    from tinygpt_cli.jobs.dictionaries import transcoders as TF
    from tinygpt_cli.transformer.hooks import Replace
    from tinygpt_cli.transformer.model import forward

    folder, made = gemma_transcoders(tmp_path)
    model = load_model(gemma)
    tcs = TF.load_transcoders(folder, model.config, model.weights_file)
    assert [tc.site for tc in tcs] == ["layers.0.ln2_post.out", "layers.1.ln2_post.out"]
    ids = np.asarray([model.tokenizer.encode(TEXT)[:6], model.tokenizer.encode(TEXT)[1:7]])
    x, y = ids[:, :-1], ids[:, 1:]
    got = T.evaluate(model.params, model.config, tcs, x, y)
    for i in (0, 1):
        v = record(model.params, model.config, x, [f"layers.{i}.ln2.out",
                                                   f"layers.{i}.ln2_post.out"])[1]
        inp = v[f"layers.{i}.ln2.out"].reshape(-1, D)
        out = v[f"layers.{i}.ln2_post.out"].reshape(-1, D).astype(np.float64)
        pred = jumprelu(made[i], inp) @ made[i]["w_dec"] + made[i]["b_dec"]
        ve = 1 - ((out - pred) ** 2).sum() / ((out - out.mean(axis=0)) ** 2).sum()
        assert got.layers[i].variance_explained == pytest.approx(ve, rel=1e-4, abs=1e-5)
    seen = {}

    def keep(v, i):
        seen[i] = v
        return v

    def predict(v, i):
        return (jumprelu(made[i], seen[i]) @ made[i]["w_dec"] + made[i]["b_dec"]).astype(v.dtype)

    hooks = Replace({**{f"layers.{i}.ln2.out": (lambda v, i=i: keep(v, i)) for i in (0, 1)},
                     **{f"layers.{i}.ln2_post.out": (lambda v, i=i: predict(v, i))
                        for i in (0, 1)}}, who="t")
    logits = forward(model.params, model.config, x, hooks=hooks).astype(np.float64)
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    want = -np.take_along_axis(logp, y[..., None], -1).mean()
    assert got.loss_replaced == pytest.approx(want, rel=1e-4)
    assert got.loss_replaced != pytest.approx(got.loss_clean, rel=1e-4)


def test_saelens_own_gemma_3_loader_agrees(llama, wide_heads, hub_cache, tmp_path,
                                           monkeypatch):
    """Where SAELens installs (not in CI: it brings PyTorch): its own gemma_3 loader
    (gemma_3_sae_huggingface_loader) reads the release's folders from the offline hub cache,
    and the SAE it builds encodes and decodes as tinygpt's reading of the same folder: an
    _affine transcoder (its W_skip the transpose of affine_skip_connection) and an
    attention-output SAE (o_proj's input, merged as tinygpt merges layers.L.z). Only
    get_safetensors_tensor_shapes, an HTTP range request, is answered from the file here."""
    sae_lens = pytest.importorskip("sae_lens")
    torch = pytest.importorskip("torch")
    from sae_lens.loading import pretrained_sae_loaders as loaders
    from sae_lens.registry import get_sae_class

    from tinygpt_cli.analysis import sae as S
    from tinygpt_cli.jobs.dictionaries.gemmascope import load_gemma_scope
    from tinygpt_cli.storage.safetensors import header_bytes, read_header

    src = tmp_path / "src2"
    affine = write_dictionary(src / "transcoder_all" / "layer_0_width_12_l0_small_affine", {
        "architecture": "jump_relu", "model_name": "meta-llama/Llama-3.2-1B",
        "hf_hook_point_in": "model.layers.0.post_attention_layernorm.output",
        "hf_hook_point_out": "model.layers.0.mlp.output", "affine_connection": True},
        seed=80, skip=True)
    attn = write_dictionary(src / "attn_out_all" / "layer_1_width_12_l0_small", {
        "architecture": "jump_relu", "model_name": "google/gemma-3-270m",
        "hf_hook_point_in": "model.layers.1.self_attn.o_proj.input"}, seed=81, d_in=24,
        d_out=24)
    cache_repo(tmp_path / "hf" / "hub", "org/scope2", "d" * 40, src)

    def shapes(repo_id, filename):  # the header, read from the cached file
        snap = tmp_path / "hf" / "hub" / ("models--" + repo_id.replace("/", "--"))
        path = snap / "snapshots" / ("d" * 40) / filename
        return {k: list(v.shape) for k, v in read_header(path, header_bytes(8)).items()}

    monkeypatch.setattr(loaders, "get_safetensors_tensor_shapes", shapes)
    from huggingface_hub import constants  # read once at import: the fixture's, set again

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    x_tc = values(llama, TEXT, ["layers.0.ln2.out"])["layers.0.ln2.out"]
    heads = values(wide_heads, TEXT, ["layers.1.z"])["layers.1.z"]
    for sub, folder_model, x, t in [
            ("transcoder_all/layer_0_width_12_l0_small_affine", llama, x_tc, affine),
            ("attn_out_all/layer_1_width_12_l0_small", wide_heads, S.site_rows("layers.1.z",
                                                                              heads), attn)]:
        cfg, state, _ = loaders.gemma_3_sae_huggingface_loader("org/scope2", sub, "cpu")
        cls, cfg_cls = get_sae_class(cfg["architecture"])
        theirs = cls(cfg_cls.from_dict(cfg))
        theirs.load_state_dict(state)
        ours, _ = load_gemma_scope(src / sub, load_model(folder_model).config)
        with torch.no_grad():
            z_ref = theirs.encode(torch.tensor(x)).numpy()
            y_ref = theirs(torch.tensor(x)).numpy()
        z = S.encode(ours, x)
        assert (z > 0).any()
        np.testing.assert_array_equal(z > 0, z_ref > 0)
        np.testing.assert_allclose(z, z_ref, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(S.decode(ours, z, x), y_ref, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(z, jumprelu(t, x), rtol=1e-4, atol=1e-5)
    assert sae_lens.__version__


def test_graph_qk_on_gemma_3_through_gemma_scope_transcoders(cli, gemma, tmp_path):
    """graph --qk on Gemma 3 with the release's transcoders (they predict ln2_post.out): each
    attention edge's score split two ways, each adding up to the score the model's own pass
    records (the terms: tests/test_graph_clt.py)."""
    folder, _ = gemma_transcoders(tmp_path)
    r = whole_graph(cli, tmp_path, folder, gemma, "--qk")
    assert r.code == 0, r.err
    doc = r.json()
    split = [e for e in doc["edges"] if "qk" in e]
    assert split
    got = values(gemma, TEXT, [f"layers.{i}.heads.{h}.scores" for i in (0, 1)
                               for h in range(4)])
    for e in split:
        q = e["qk"]
        want = got[f"layers.{q['layer']}.heads.{q['head_index']}.scores"][
            q["query_position"], q["key_position"]]
        for side in ("query", "key"):
            total = sum(t["term"] for t in q[side + "_terms"]) + q[side + "_rest"]
            assert total == pytest.approx(float(want), abs=1e-4)
