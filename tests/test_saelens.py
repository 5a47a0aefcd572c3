"""SAELens' dictionaries: folders of cfg.json and sae_weights.safetensors written here for the
tiny model, read through --sae DIR, their latents checked against SAELens' encoding written
out below in NumPy from the file's own tensors; and tinygpt's SAE exported to that format."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import TEXT, TINY, assert_one_error_line
from safetensors.numpy import load_file, save_file

from tinygpt_cli.storage.locations import SHIPPED

D, M = TINY.n_embd, 40  # the tiny model's residual stream, the dictionary's latents
SITE, HOOK = "layers.1.resid_post", "blocks.1.hook_resid_post"


def write_saelens(folder: Path, architecture: str = "standard", seed: int = 0,
                  dtype=np.float32, old: bool = False, **settings) -> Path:
    """A SAELens folder: random tensors of SAELens' names and shapes, and a cfg.json as
    SAELens 6 writes it (hook_name in metadata) or, `old`, as SAELens 5 did (hook_name and
    hook_layer at the top, a TopK SAE as activation_fn topk with activation_fn_kwargs.k)."""
    rng = np.random.default_rng(seed)
    t = {"W_enc": rng.normal(0, 0.5, (D, M)), "b_enc": rng.normal(0, 0.3, M),
         "W_dec": rng.normal(0, 0.5, (M, D)), "b_dec": rng.normal(0, 0.2, D)}
    if architecture == "jumprelu":
        t["threshold"] = rng.uniform(0.0, 0.8, M)
    folder.mkdir(parents=True)
    save_file({n: a.astype(dtype) for n, a in t.items()}, str(folder / "sae_weights.safetensors"))
    cfg = {"d_in": D, "d_sae": M, "dtype": "float32", "device": "cpu",
           "apply_b_dec_to_input": True, "normalize_activations": "none",
           "reshape_activations": "none"}
    hook = settings.pop("hook_name", HOOK)
    if old:
        cfg.update({"hook_name": hook, "hook_layer": 1, "sae_lens_version": "5.3.0",
                    "activation_fn": "topk" if architecture == "topk" else "relu"})
        if architecture == "topk":
            cfg["activation_fn_kwargs"] = {"k": settings.pop("k", 5)}
        cfg.pop("reshape_activations")
    else:
        cfg.update({"architecture": architecture,
                    "metadata": {"hook_name": hook, "model_name": "tiny",
                                 "sae_lens_version": "6.5.1"}})
        if architecture == "topk":
            cfg.update({"k": 5, "rescale_acts_by_decoder_norm": False})
    cfg.update(settings)
    (folder / "cfg.json").write_text(json.dumps(cfg))
    return folder


def saelens_encode(folder: Path, x: np.ndarray) -> np.ndarray:
    """SAELens' SAE.encode of x [T, d], step by step as its StandardSAE, TopKSAE and
    JumpReLUSAE do it: process_sae_in (normalise, subtract b_dec), the affine map, then the
    activation."""
    cfg = json.loads((folder / "cfg.json").read_text())
    t = {n: a.astype(np.float64) for n, a in load_file(str(folder / "sae_weights.safetensors"))
         .items()}
    x = x.astype(np.float64)
    norm = cfg.get("normalize_activations", "none")
    if norm == "constant_norm_rescale":
        x = x * np.sqrt(D) / np.sqrt((x * x).sum(axis=1, keepdims=True))
    elif norm == "layer_norm":
        mu = x.mean(axis=1, keepdims=True)
        std = np.sqrt(((x - mu) ** 2).sum(axis=1, keepdims=True) / (D - 1))
        x = (x - mu) / (std + 1e-5)
    if cfg.get("apply_b_dec_to_input", True):
        x = x - t["b_dec"]
    hidden = x @ t["W_enc"] + t["b_enc"]
    arch = cfg.get("architecture", cfg.get("activation_fn") == "topk" and "topk" or "standard")
    if arch == "jumprelu":
        return np.maximum(hidden, 0) * (hidden > t["threshold"])
    if arch == "standard":
        return np.maximum(hidden, 0)
    k = cfg.get("k") or cfg["activation_fn_kwargs"]["k"]
    if cfg.get("rescale_acts_by_decoder_norm"):
        hidden = hidden * np.sqrt((t["W_dec"] ** 2).sum(axis=1))
    z = np.zeros_like(hidden)
    for row, h in zip(z, hidden, strict=True):  # torch.topk, then ReLU of the k kept
        top = np.argsort(-h)[:k]
        row[top] = np.maximum(h[top], 0)
    return z


def saelens_share(folder: Path, x: np.ndarray, j: int) -> np.ndarray:
    """What latent j adds to SAELens' SAE.decode(encode(x)) [T, d]: decode with and without
    it, back in x's units."""
    cfg = json.loads((folder / "cfg.json").read_text())
    t = {n: a.astype(np.float64) for n, a in load_file(str(folder / "sae_weights.safetensors"))
         .items()}
    z = saelens_encode(folder, x)
    if cfg.get("rescale_acts_by_decoder_norm"):
        z = z / np.sqrt((t["W_dec"] ** 2).sum(axis=1))
    kept = z.copy()
    kept[:, j] = 0
    share = (z - kept) @ t["W_dec"]
    norm = cfg.get("normalize_activations", "none")
    if norm == "constant_norm_rescale":
        share = share * np.sqrt((x.astype(np.float64) ** 2).sum(axis=1, keepdims=True)) / \
            np.sqrt(D)
    elif norm == "layer_norm":
        c = x - x.mean(axis=1, keepdims=True)
        share = share * np.sqrt((c.astype(np.float64) ** 2).sum(axis=1, keepdims=True) / (D - 1))
    return share


VARIANTS = {
    "standard": dict(architecture="standard"),
    "topk": dict(architecture="topk"),
    "jumprelu": dict(architecture="jumprelu"),
    "topk rescaled by decoder norms": dict(architecture="topk",
                                           rescale_acts_by_decoder_norm=True),
    "standard, b_dec not subtracted": dict(architecture="standard", apply_b_dec_to_input=False),
    "jumprelu, layer_norm": dict(architecture="jumprelu", normalize_activations="layer_norm"),
    "topk, constant_norm_rescale": dict(architecture="topk",
                                        normalize_activations="constant_norm_rescale"),
    "float16 tensors": dict(architecture="standard", dtype=np.float16),
    "SAELens 5 topk": dict(architecture="topk", old=True, k=7),
    "SAELens 5 relu": dict(architecture="standard", old=True),
    "hook_name of mlp_out": dict(architecture="standard", hook_name="blocks.0.hook_mlp_out"),
}


def _site(folder: Path) -> str:
    cfg = json.loads((folder / "cfg.json").read_text())
    hook = cfg.get("hook_name") or cfg["metadata"]["hook_name"]
    return {"blocks.1.hook_resid_post": SITE, "blocks.0.hook_mlp_out": "layers.0.mlp_out"}[hook]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_trace_gives_the_latents_saelens_encoding_gives(cli, tmp_path, variant):
    folder = write_saelens(tmp_path / "sae", seed=len(variant), **VARIANTS[variant])
    site = _site(folder)
    x = np.asarray(cli("trace", TEXT, site, "--json").json()["data"], dtype=np.float32)
    want = saelens_encode(folder, x)
    assert (want > 0).any() and (want == 0).any()  # a real test of which latents fire
    got = cli("trace", TEXT, f"sae.{site}", "--sae", folder, "--json")
    assert got.code == 0, got.err
    z = np.asarray(got.json()["data"])
    np.testing.assert_array_equal(z > 0, want > 0)
    np.testing.assert_allclose(z, want, rtol=1e-4, atol=1e-5)
    one = cli("trace", TEXT, f"sae.{site}.3", "--sae", folder, "--json").json()
    np.testing.assert_allclose(one["data"], want[:, 3], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("variant", ["topk rescaled by decoder norms", "jumprelu, layer_norm",
                                     "topk, constant_norm_rescale", "standard"])
def test_ablating_a_latent_takes_out_its_share_of_saelens_reconstruction(cli, tmp_path, variant):
    folder = write_saelens(tmp_path / "sae", seed=5, **VARIANTS[variant])
    x = np.asarray(cli("trace", TEXT, SITE, "--json").json()["data"], dtype=np.float32)
    j = int(np.argmax((saelens_encode(folder, x) > 0).sum(axis=0)))  # fires most often
    got = cli("trace", TEXT, SITE, "--ablate", f"{'sae.' + SITE}.{j}", "--sae", folder, "--json")
    assert got.code == 0, got.err
    np.testing.assert_allclose(got.json()["data"], x - saelens_share(folder, x, j), rtol=1e-4,
                               atol=1e-4)


def test_steering_by_a_latent_of_a_saelens_folder_is_its_decoder_row(cli, tmp_path):
    folder = write_saelens(tmp_path / "sae", seed=2)
    row = load_file(str(folder / "sae_weights.safetensors"))["W_dec"][7]
    np.save(tmp_path / "row.npy", row)
    by_row = cli("probs", TEXT, "--steer-vector", f"{tmp_path / 'row.npy'}", "--steer-layer",
                 "1", "--steer-scale", "3", "--json")
    # resid_post of the last block is no block's input: the folder cannot say which to steer
    by_folder = cli("probs", TEXT, "--steer-vector", f"{folder}#7", "--steer-scale", "3")
    assert_one_error_line(by_folder, 2, "does not say which block it steers")
    by_folder = cli("probs", TEXT, "--steer-vector", f"{folder}#7", "--steer-layer", "1",
                    "--steer-scale", "3", "--json")
    assert by_folder.code == 0, by_folder.err
    assert by_folder.json()["top"] == by_row.json()["top"]
    assert by_folder.json()["top"] != cli("probs", TEXT, "--json").json()["top"]
    whole = cli("probs", TEXT, "--steer-vector", str(folder), "--steer-layer", "1")
    assert_one_error_line(whole, 2, f"holds {M} directions", f"{folder}#N")


def test_feature_and_eval_read_a_saelens_folder(cli, tmp_path, monkeypatch):
    from conftest import story_parts

    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "cache"))
    data = story_parts(tmp_path / "data")
    folder = write_saelens(tmp_path / "sae", "jumprelu", seed=3)
    x = np.asarray(cli("trace", TEXT, SITE, "--json").json()["data"], dtype=np.float32)
    want = saelens_encode(folder, x)
    on_text = cli("sae", "feature", "4", "--sae", folder, "--text", TEXT, "--json")
    assert on_text.code == 0, on_text.err
    np.testing.assert_allclose(on_text.json()["data"], want[:, 4], rtol=1e-4, atol=1e-5)
    search = cli("sae", "feature", "4", "--sae", folder, "--data", data, "--windows", "3",
                 "--json")
    assert search.code == 0, search.err
    assert sum(search.json()["histogram"]["counts"]) == search.json()["fired"] > 0
    ev = cli("sae", "eval", "--sae", folder, "--data", data / "part-002.txt", "--windows", "2",
             "--json")
    assert ev.code == 0, ev.err
    assert ev.json()["k"] is None and ev.json()["latents"] == M
    assert 0 < ev.json()["l0"] <= M


def test_the_shipped_sae_round_trips_through_export(cli, tmp_path, monkeypatch):
    shipped = SHIPPED / "sae" / f"{SITE}.safetensors"
    monkeypatch.delenv("TINYGPT_WEIGHTS")
    out = tmp_path / "exported"
    got = cli("sae", "export", "--out", out, "--json")
    assert got.code == 0, got.err
    assert got.json()["hook_name"] == HOOK and sorted(p.name for p in out.iterdir()) == \
        ["cfg.json", "sae_weights.safetensors"]
    cfg = json.loads((out / "cfg.json").read_text())
    assert (cfg["architecture"], cfg["d_in"], cfg["d_sae"], cfg["k"], cfg["metadata"]
            ["hook_name"], cfg["apply_b_dec_to_input"], cfg["normalize_activations"]) == \
        ("topk", 128, 1024, 16, HOOK, True, "none")
    ours, theirs = load_file(str(shipped)), load_file(str(out / "sae_weights.safetensors"))
    assert sorted(theirs) == ["W_dec", "W_enc", "b_dec", "b_enc"]
    for name, value in ours.items():
        np.testing.assert_array_equal(theirs[name], value)
    text = "Tom waved at the bird. The bird flew away."
    again = cli("trace", text, f"sae.{SITE}", "--sae", out, "--json")
    assert again.code == 0, again.err
    assert again.json()["data"] == cli("trace", text, f"sae.{SITE}", "--json").json()["data"]
    assert again.json()["k"] == 16
    refused = cli("sae", "export", "--out", out)
    assert_one_error_line(refused, 2, "it holds an SAE already (cfg.json)", "--force")
    assert cli("sae", "export", "--out", out, "--force").code == 0
    assert_one_error_line(cli("sae", "export", "--out", out, "--format", "npz"), 2,
                          "the one format sae export writes is saelens")


def test_an_exported_folder_is_refused_on_other_weights(cli, tmp_path):
    """Exported from the shipped model, cut to the tiny model's sizes: it still names the
    shipped weights, and the tiny model (the cli fixture's) refuses it."""
    out = tmp_path / "exported"
    assert cli("sae", "export", "--out", out, "--weights", SHIPPED).code == 0
    cfg = json.loads((out / "cfg.json").read_text())
    cfg["d_in"] = D
    w = load_file(str(out / "sae_weights.safetensors"))
    save_file({"W_enc": w["W_enc"][:D], "b_enc": w["b_enc"], "W_dec": w["W_dec"][:, :D],
               "b_dec": w["b_dec"][:D]}, str(out / "sae_weights.safetensors"))
    (out / "cfg.json").write_text(json.dumps(cfg))
    got = cli("trace", TEXT, f"sae.{SITE}", "--sae", out)
    assert_one_error_line(got, 2, "the SAE was made for other weights (weights_sha256")


GONE = object()  # a cfg.json key taken out


def _broken(folder: Path, cfg=None, tensors=None, drop=()):
    if cfg is not None:
        old = json.loads((folder / "cfg.json").read_text())
        old.update(cfg)
        old = {k: v for k, v in old.items() if v is not GONE}
        (folder / "cfg.json").write_text(json.dumps(old))
    if tensors is not None or drop:
        t = load_file(str(folder / "sae_weights.safetensors"))
        t.update(tensors or {})
        for name in drop:
            t.pop(name)
        save_file(t, str(folder / "sae_weights.safetensors"))
    return folder


REFUSED = [  # (what is changed, exit code, the words the one error line has)
    ({"normalize_activations": "expected_average_only_in"}, 2,
     "normalize_activations 'expected_average_only_in' needs a scaling factor"),
    ({"architecture": "gated"}, 2, "architecture 'gated' is not one tinygpt computes"),
    ({"architecture": "standard", "reshape_activations": "hook_z",
      "metadata": {"hook_name": "blocks.1.attn.hook_z"}}, 2, "reshaped per head"),
    ({"metadata": {"hook_name": "blocks.1.attn.hook_pattern"}}, 2,
     "hook_name 'blocks.1.attn.hook_pattern': an SAE reads layers.N.resid_pre"),
    ({"metadata": {"hook_name": "blocks.1.hook_resid_post", "hook_head_index": 2}}, 2,
     "it reads one head"),
    ({"d_in": 12}, 2, "the SAE reads 12 numbers (d_in) and this model's values have 16"),
    ({"d_sae": "forty"}, 1, "d_sae is 'forty', not a positive whole number"),
    ({"d_in": GONE}, 1, "cfg.json: it has no d_in"),
    ({"architecture": "topk", "k": GONE}, 1, "a topk SAE, it has no k"),
    ({"hook_layer": 0}, 1, "hook_layer 0 disagrees with hook_name 'blocks.1.hook_resid_post'"),
    ({"hook_name": "blocks.0.hook_resid_post"}, 1, "hook_name is 'blocks.0.hook_resid_post' "
     "at the top level but 'blocks.1.hook_resid_post' in metadata"),
    ({"dtype": "int8"}, 1, "dtype 'int8' is not one of"),
    ({"apply_b_dec_to_input": "yes"}, 1, "apply_b_dec_to_input is 'yes', not true or false"),
    ({"metadata": {"hook_name": HOOK, "weights_sha256": "0" * 64}}, 2,
     "the SAE was made for other weights"),
]


@pytest.mark.parametrize("change, code, words", REFUSED, ids=[w for _, _, w in REFUSED])
def test_a_config_tinygpt_cannot_honour_is_refused_by_name(cli, tmp_path, change, code, words):
    folder = _broken(write_saelens(tmp_path / "sae"), cfg=change)
    got = cli("trace", TEXT, f"sae.{SITE}", "--sae", folder)
    assert_one_error_line(got, code, str(folder / "cfg.json"), words)


def test_a_dead_latent_under_rescaling_and_a_zero_value_under_constant_norm_are_named(
        cli, tmp_path):
    # SAELens divides each latent by its decoder row's norm (rescale_acts_by_decoder_norm)
    # and scales each value by sqrt(d) / its norm (constant_norm_rescale): 0/0 and 0 * inf,
    # NaN, which ended in "W_enc or b_enc too large" or the forward pass's "weights too large"
    dead = write_saelens(tmp_path / "dead", **VARIANTS["topk rescaled by decoder norms"])
    w_dec = load_file(str(dead / "sae_weights.safetensors"))["W_dec"]
    w_dec[[3, 17]] = 0
    _broken(dead, tensors={"W_dec": w_dec})
    x = np.asarray(cli("trace", TEXT, SITE, "--json").json()["data"], dtype=np.float32)
    j = int(np.argmax((saelens_encode(dead, x) > 0).sum(axis=0)))
    for args in (("trace", TEXT, f"sae.{SITE}"), ("trace", TEXT, SITE, "--ablate",
                                                  f"sae.{SITE}.{j}")):
        line = assert_one_error_line(cli(*args, "--sae", dead), 1,
                                     str(dead / "sae_weights.safetensors"),
                                     "W_dec has 2 rows of norm 0 (latents 3, 17)",
                                     "rescale_acts_by_decoder_norm")
        assert "too large" not in line
    w_dec[[3, 17]] = 1e-3  # small but not zero: computed as SAELens does
    _broken(dead, tensors={"W_dec": w_dec})
    got = cli("trace", TEXT, SITE, "--ablate", f"sae.{SITE}.{j}", "--sae", dead, "--json")
    assert got.code == 0, got.err
    np.testing.assert_allclose(got.json()["data"], x - saelens_share(dead, x, j), rtol=1e-4,
                               atol=1e-4)

    constant = write_saelens(tmp_path / "constant", hook_name="blocks.0.hook_mlp_out",
                             **VARIANTS["topk, constant_norm_rescale"])
    zeroed = cli("trace", TEXT, "sae.layers.0.mlp_out", "--sae", constant, "--ablate",
                 "layers.0.mlp_out")
    line = assert_one_error_line(zeroed, 2, str(constant), "constant_norm_rescale",
                                 "layers.0.mlp_out at token 0 is all zeros")
    assert "too large" not in line
    from tinygpt_cli.analysis import sae as S
    from tinygpt_cli.errors import InputError
    from tinygpt_cli.jobs.dictionaries.saelens import load_saelens

    sae = load_saelens(constant, TINY, tmp_path / "none")
    values = np.ones((4, D), np.float32)
    values[2] = 0
    with pytest.raises(InputError, match="at token 2 is all zeros"):
        S.encode(sae, values)
    values[2] = 1e-20  # tiny but not zero: scaled as SAELens scales it
    np.testing.assert_allclose(S.encode(sae, values)[2], saelens_encode(constant, values)[2],
                               rtol=1e-4, atol=1e-5)


def test_a_file_of_the_folder_given_for_the_folder_is_told_so(cli, tmp_path):
    # --sae DIR/cfg.json was read as a tinygpt SAE file: "not a readable safetensors file
    # (its header claims 7,521,981,564,148,779,643 bytes)"
    folder = write_saelens(tmp_path / "sae")
    for name in ("cfg.json", "sae_weights.safetensors"):
        got = cli("trace", TEXT, f"sae.{SITE}", "--sae", folder / name)
        assert_one_error_line(got, 2, f"{folder / name} is a file of a SAELens folder: give the "
                              f"folder, --sae {folder}")


def test_broken_weights_are_refused(cli, tmp_path):
    cases = [
        (dict(drop=("W_dec",)), "is not a standard SAE's weights: it has no W_dec tensor"),
        (dict(tensors={"W_enc": np.zeros((D, M + 1), np.float32)}),
         f"W_enc has shape [{D}, {M + 1}], expected [{D}, {M}]"),
        (dict(tensors={"b_enc": np.full(M, np.nan, np.float32)}), "b_enc is not all finite"),
        (dict(tensors={"b_dec": np.zeros(D, np.int32)}), "b_dec is I32, not floating-point"),
    ]
    for i, (how, words) in enumerate(cases):
        folder = _broken(write_saelens(tmp_path / f"sae{i}"), **how)
        got = cli("trace", TEXT, f"sae.{SITE}", "--sae", folder)
        assert_one_error_line(got, 1, str(folder / "sae_weights.safetensors"), words)
    jump = _broken(write_saelens(tmp_path / "jump", "jumprelu"), drop=("threshold",))
    assert_one_error_line(cli("trace", TEXT, f"sae.{SITE}", "--sae", jump), 1,
                          "is not a jumprelu SAE's weights: it has no threshold tensor")
    (tmp_path / "nocfg").mkdir()
    assert_one_error_line(cli("trace", TEXT, f"sae.{SITE}", "--sae", tmp_path / "nocfg"), 2,
                          "is not a SAELens SAE folder: it has no cfg.json")
    garbled = write_saelens(tmp_path / "garbled")
    (garbled / "cfg.json").write_text("{not json")
    assert_one_error_line(cli("trace", TEXT, f"sae.{SITE}", "--sae", garbled), 1,
                          "cfg.json is not a readable SAELens config")
    (garbled / "cfg.json").write_text(json.dumps({"d_in": D, "d_sae": M, "architecture":
                                                  "standard", "metadata": {"hook_name": HOOK}}))
    (garbled / "sae_weights.safetensors").unlink()
    assert_one_error_line(cli("trace", TEXT, f"sae.{SITE}", "--sae", garbled), 1,
                          "has cfg.json but no sae_weights.safetensors")


def test_saelens_itself_reads_the_export_and_writes_what_tinygpt_reads(tmp_path):
    """Where SAELens is installed (it is not in CI: it brings PyTorch and TransformerLens):
    its own SAE.load_from_disk of the shipped SAE's export, and SAEs of each architecture
    made and saved by SAELens, give tinygpt's latents and reconstructions."""
    torch = pytest.importorskip("torch")
    sae_lens = pytest.importorskip("sae_lens")
    from sae_lens.saes.sae import SAEMetadata

    from tinygpt_cli.analysis import sae as S
    from tinygpt_cli.jobs.dictionaries import saes as SF
    from tinygpt_cli.jobs.dictionaries.saelens import export_saelens
    from tinygpt_cli.storage.madefor import made_for
    from tinygpt_cli.transformer.folder import load_model
    from tinygpt_cli.transformer.trace import run_traced

    model = load_model(SHIPPED)
    ids = np.asarray(model.tokenizer.encode("Tom waved at the bird. The bird flew away."))
    x = run_traced(model.params, model.config, ids).get(SITE)
    shipped = SF.load_sae(SHIPPED / "sae" / f"{SITE}.safetensors", model.config,
                         model.weights_file)
    export_saelens(shipped, tmp_path / "exported", model.config,
                   made_for(model.weights_file), "weights")
    made = [(sae_lens.SAE.load_from_disk(str(tmp_path / "exported"), device="cpu"),
             tmp_path / "exported")]
    torch.manual_seed(0)
    for i, (cls, cfg_cls, extra) in enumerate([
            (sae_lens.StandardSAE, sae_lens.StandardSAEConfig, {}),
            (sae_lens.TopKSAE, sae_lens.TopKSAEConfig,
             {"k": 7, "rescale_acts_by_decoder_norm": True}),
            (sae_lens.JumpReLUSAE, sae_lens.JumpReLUSAEConfig, {}),
            (sae_lens.StandardSAE, sae_lens.StandardSAEConfig,
             {"normalize_activations": "layer_norm"}),
            (sae_lens.TopKSAE, sae_lens.TopKSAEConfig,
             {"k": 9, "normalize_activations": "constant_norm_rescale"}),
            (sae_lens.JumpReLUSAE, sae_lens.JumpReLUSAEConfig,
             {"apply_b_dec_to_input": False})]):
        theirs = cls(cfg_cls(d_in=128, d_sae=96, metadata=SAEMetadata(hook_name=HOOK), **extra))
        with torch.no_grad():
            for p in theirs.parameters():
                p.copy_(torch.randn_like(p) * 0.3)
            if hasattr(theirs, "threshold"):
                theirs.threshold.copy_(torch.rand_like(theirs.threshold) * 0.5)
        theirs.save_model(str(tmp_path / f"sl{i}"))
        made.append((theirs, tmp_path / f"sl{i}"))
    for theirs, folder in made:
        ours = SF.load_sae(folder, model.config, model.weights_file)
        with torch.no_grad():
            z_ref = theirs.encode(torch.tensor(x)).numpy()
            x_ref = theirs(torch.tensor(x)).numpy()
        z = S.encode(ours, x)
        np.testing.assert_array_equal(z > 0, z_ref > 0)
        np.testing.assert_allclose(z, z_ref, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(S.reconstruct(ours, x), x_ref, rtol=1e-5, atol=1e-4)
