"""The seam between a family's files and the canonical model: the GPT-2 converter's names
both ways, the knobs a config cannot yet take, and a model_type with no converter."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import TEXT, assert_one_error_line, file_tensors, random_params
from safetensors.numpy import load_file

from tinygpt_cli.transformer.config import Config
from tinygpt_cli.transformer.families import KNOWN, config_from_dict, config_to_dict, family, gpt2
from tinygpt_cli.transformer.schema import NEEDS, PARAMS, param_shapes

CONFIG = Config(n_embd=8, n_layer=3, n_head=2, n_inner=12, vocab_size=11, n_positions=6)


def test_every_canonical_parameter_has_one_gpt2_file_name_and_back():
    names = list(param_shapes(CONFIG))
    files = [gpt2.file_name(n) for n in names]
    assert len(set(files)) == len(names)
    assert [gpt2.canonical_name(f) for f in files] == names
    assert [gpt2.canonical_name("transformer." + f) for f in files] == names
    # the file's own order, as GPT2LMHeadModel.save_pretrained lists its state
    assert files[:6] == ["wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.0.ln_1.bias",
                         "h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias"]
    assert gpt2.file_name("layers.2.mlp.W_out") == "h.2.mlp.c_proj.weight"
    assert gpt2.file_name("layers.2.attn.W_O") == "h.2.attn.c_proj.weight"


@pytest.mark.parametrize("name", ["h.x.ln_1.weight", "h.0.ln_3.weight", "lm_head.weight",
                                  "wte", "", "transformer.", "h..attn.c_attn.weight"])
def test_names_that_are_no_gpt2_parameter_have_no_canonical_name(name):
    assert gpt2.canonical_name(name) is None


def test_file_shapes_are_the_canonical_shapes_under_the_files_names():
    shapes = gpt2.file_shapes(CONFIG)
    assert shapes == {gpt2.file_name(n): s for n, s in param_shapes(CONFIG).items()}
    assert shapes["h.1.attn.c_attn.weight"] == (8, 24)  # (in, out), q k v side by side
    assert len(shapes) == 2 + 12 * CONFIG.n_layer + 2  # GPT-2's 16 kinds of tensor
    assert set(row[3] for row in PARAMS) <= set(NEEDS)


def test_gpt2_tensors_are_the_same_arrays_both_ways():
    params = random_params(CONFIG, seed=1)
    tensors = gpt2.params_to_file(params, CONFIG)
    assert all(name.startswith("transformer.") for name in tensors)
    back = gpt2.params_from_file({k.removeprefix("transformer."): v for k, v in tensors.items()},
                                 CONFIG)
    assert back.keys() == params.keys()
    assert all(back[n] is params[n] for n in params)  # a rename: nothing copied


def test_a_saved_folder_holds_exactly_the_files_tensors(tmp_path):
    from tinygpt_cli.transformer.folder import load_params, save_params

    params = random_params(CONFIG, seed=2)
    save_params(params, tmp_path / "model.safetensors", CONFIG)
    raw = load_file(str(tmp_path / "model.safetensors"))
    want = file_tensors(params)
    assert raw.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(raw[name], want[name], err_msg=name)
    loaded = load_params(tmp_path / "model.safetensors", CONFIG)
    assert list(loaded) == list(param_shapes(CONFIG))


def test_the_config_names_its_family_and_writes_it_back():
    assert CONFIG.model_type == "gpt2"
    d = config_to_dict(CONFIG)
    assert d["model_type"] == "gpt2" and d["architectures"] == ["GPT2LMHeadModel"]
    assert config_from_dict(d) == CONFIG
    no_type = {k: v for k, v in d.items() if k != "model_type"}  # older GPT-2 files
    assert config_from_dict(no_type) == CONFIG


@pytest.mark.parametrize(("knob", "value"), [("norm", "batch"), ("positions", "alibi"),
                                             ("mlp", "moe"), ("act", "relu"),
                                             ("parallel", 2)])
def test_a_knob_with_no_step_yet_is_refused_by_name(knob, value):
    with pytest.raises(ValueError) as e:
        Config(**{knob: value})
    assert str(e.value).startswith(f"config: {knob} {value!r} is not implemented (only ")


@pytest.mark.parametrize("model_type", ["mistral", "gemma2", 5, None])
def test_a_model_type_without_a_converter_is_refused_by_name(model_type):
    with pytest.raises(ValueError) as e:
        config_from_dict({**config_to_dict(CONFIG), "model_type": model_type})
    shown = model_type if isinstance(model_type, str) else type(model_type).__name__
    assert str(e.value) == (f"config: model_type {shown!r} is not a family tinygpt reads "
                            f"({', '.join(sorted(KNOWN))})")


def test_a_folder_of_another_family_is_refused_for_its_family_not_its_tensor_count(
        tmp_path, tiny, cli):
    """Issue 29's first symptom: a 3-block Llama folder was taken for a 4-block GPT-2 and
    refused for its tensor count; now its model_type is read first."""
    folder = tmp_path / "mistral"
    shutil.copytree(tiny.folder, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="mistral", architectures=["MistralForCausalLM"])
    (folder / "config.json").write_text(json.dumps(config))
    r = cli("embed", TEXT, "--weights", folder)
    assert_one_error_line(r, 1, "config.json", "model_type 'mistral' is not a family tinygpt "
                          "reads (gemma3_text, gpt2, gpt_neo, gpt_neox, llama, qwen2, qwen3)")


def test_every_known_family_has_the_converters_functions():
    for model_type in KNOWN:
        fam = family(model_type)
        # qwen2 and qwen3 are read as llama; gemma3_text by gemma3.py
        assert KNOWN[fam.MODEL_TYPE] == KNOWN[model_type] == fam.__name__.rsplit(".", 1)[1]
        for name in ("config_from_hf", "config_to_hf", "file_shapes", "params_from_file",
                     "params_to_file", "file_name", "canonical_name"):
            assert callable(getattr(fam, name)), (model_type, name)


# ------------------------------------------------------------------ sharded and refused files


def _sharded(folder, tiny_folder, shards: int = 3):
    """The tiny folder's weights cut into shards with an index, as save_pretrained writes a
    model larger than its max_shard_size."""
    from safetensors.numpy import save_file

    shutil.copytree(tiny_folder.folder, folder)
    tensors = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    names = sorted(tensors)
    weight_map = {}
    for k in range(shards):
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[k::shards]}
        save_file(part, str(folder / file))
        weight_map.update({n: file for n in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return folder


def test_a_sharded_folder_loads_the_same_weights(tmp_path, tiny_folder):
    from tinygpt_cli.transformer.folder import load_model

    folder = _sharded(tmp_path / "sharded", tiny_folder)
    sharded, whole = load_model(folder), load_model(tiny_folder.folder)
    assert sharded.weights_file.name == "model.safetensors.index.json"
    assert sharded.params.keys() == whole.params.keys()
    for name in whole.params:
        np.testing.assert_array_equal(sharded.params[name], whole.params[name], err_msg=name)


@pytest.mark.parametrize(("where", "needle"), [
    ("../elsewhere.safetensors", "not a .safetensors file beside the index"),
    ("model-00009-of-00003.safetensors", "names model-00009-of-00003.safetensors, which "
                                         "does not exist beside it"),
])
def test_an_index_naming_a_file_elsewhere_or_missing_is_refused(tmp_path, tiny_folder,
                                                                where, needle):
    from tinygpt_cli.errors import WeightsError
    from tinygpt_cli.transformer.folder import load_model

    folder = _sharded(tmp_path / "sharded", tiny_folder)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = where
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(WeightsError) as e:
        load_model(folder)
    assert needle in str(e.value)


def test_a_pytorch_bin_alone_is_refused_in_one_line(tmp_path, tiny, cli):
    folder = tmp_path / "bin"
    shutil.copytree(tiny.folder, folder)
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    r = cli("embed", TEXT, "--weights", folder)
    assert_one_error_line(r, 1, "pytorch_model.bin", "only safetensors",
                          "safe_serialization=True")


def test_bfloat16_bits_widen_exactly():
    from tinygpt_cli.storage.safetensors import widen_bfloat16

    want = np.array([1.0, -2.5, 3.140625, 2.0 ** -100, -np.inf, 65280.0], np.float32)
    bits = (want.view(np.uint32) >> 16).astype(np.uint16)  # each is a bfloat16 exactly
    np.testing.assert_array_equal(widen_bfloat16(bits), want)


def test_the_rotary_angles_the_pos_card_shows_are_the_turn_of_each_pair():
    """Turning a head vector with a 1 at i (and 0 at i + r) by ops.rotary at position t
    leaves (cos a, sin a) in (i, i + r): a is the angle `rotary_angles` lists."""
    from tinygpt_cli.transformer import ops
    from tinygpt_cli.transformer.trace import run_traced

    config = Config(n_embd=16, n_layer=1, n_head=2, n_inner=8, vocab_size=11, n_positions=9,
                    positions="rotary", rotary_dim=4, rotary_base=100.0, norm="rms",
                    model_type="llama", mlp="gated", act="silu", mlp_bias=False)
    params = random_params(config, seed=3)
    angles = run_traced(params, config, np.arange(9) % 11)["rotary_angles"]  # [T, r]
    assert angles.shape == (9, 2)
    for i in range(2):
        x = np.zeros((9, 8))
        x[:, i] = 1.0
        turned = ops.rotary(x, 0, 4, 100.0)
        np.testing.assert_allclose(np.cos(angles[:, i]), turned[:, i], atol=1e-12)
        np.testing.assert_allclose(np.sin(angles[:, i]), turned[:, i + 2], atol=1e-12)
        np.testing.assert_array_equal(turned[:, 4:], 0.0)  # past the rotary part: unturned
    np.testing.assert_allclose(angles[5], 5 * 100.0 ** (-np.arange(2) / 2))


def test_the_review_page_says_what_each_family_computes(cli):
    """The page's cards follow the block: GPT-2's are the seed page's own; the rotary,
    parallel NeoX lesson model and the RMSNorm, gated, rotary Llama one say what they do
    instead, each card's path holding a value of that model."""
    from tinygpt_cli.transformer.page import CARDS

    root = Path(__file__).resolve().parent.parent / "weights"
    cards = {}
    for name in ("", "neox", "llama"):
        doc = cli("review", "Lily wanted to play", "--weights", root / name, "--json").json()
        cards[name] = {c["number"]: c for c in doc["cards"]}
    assert [(c["formula"], c["path"]) for c in cards[""].values()] == \
        [(c.formula, c.path) for c in CARDS]
    neox, llama = cards["neox"], cards["llama"]
    assert neox[3]["path"] == llama[3]["path"] == "rotary_angles"
    assert neox[3]["shape"] == [4, 3] and llama[3]["shape"] == [4, 12]  # pairs turned
    assert neox[4]["formula"] == "x + Attn(LayerNorm(x)) + MLP(LayerNorm(x))"
    assert llama[4]["formula"] == "x + Sublayer(RMSNorm(x))"
    assert llama[6]["formula"] == "(SiLU(x W_gate) * (x W_in)) W_out"
    assert neox[6]["formula"] == "GELU(x W_1 + b_1) W_2 + b_2"  # the erf form: its detail
    assert llama[8]["formula"] == "u = RMSNorm(h^(L))" and neox[8]["formula"] == \
        "u = LayerNorm(h^(L))"
    assert neox[9]["formula"] == "z = u W_U^T" and llama[9]["formula"] == "z = u W_E^T"


def test_every_converter_provides_the_whole_family_protocol():
    from types import SimpleNamespace

    from tinygpt_cli.transformer.families import missing

    for model_type in KNOWN:
        fam = family(model_type)
        assert missing(fam) == [], model_type
        assert fam.MODEL_TYPE in KNOWN and isinstance(fam.PLACES_BFLOAT16, bool)
    # a converter without its label (as messages name the family) is caught
    partial = SimpleNamespace(**{n: getattr(gpt2, n) for n in dir(gpt2) if n != "LABEL"})
    assert missing(partial) == ["LABEL"]


def test_a_loaded_model_carries_its_family(tiny_folder):
    from tinygpt_cli.transformer.folder import load_model

    model = load_model(tiny_folder.folder)
    assert model.family is gpt2 and model.family.LABEL == "GPT-2"


def test_the_config_says_whether_the_head_is_tied_not_the_parameters_present():
    from dataclasses import replace

    from tinygpt_cli.transformer import model

    config = Config(n_embd=12, n_layer=1, n_head=2, n_inner=20, vocab_size=23, n_positions=8)
    params = random_params(config, seed=4)
    ids = np.array([1, 5, 7])
    u = model.record(params, config, ids, ["ln_final.out"])[1]["ln_final.out"]
    stray = dict(params, **{"unembed.W_U": -params["embed.W_E"]})  # read by an untied head only
    np.testing.assert_allclose(model.forward(stray, config, ids), u @ params["embed.W_E"].T,
                               rtol=1e-12)
    untied = replace(config, tied=False)
    np.testing.assert_allclose(model.forward(stray, untied, ids), -u @ params["embed.W_E"].T,
                               rtol=1e-12)
