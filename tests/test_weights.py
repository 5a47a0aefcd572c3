"""Loading, validating and saving the weights folder."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest
from cli_helpers import file_names
from safetensors.numpy import load_file, save_file

from tinygpt_cli.errors import InputError, WeightsError
from tinygpt_cli.storage.files import write_atomically
from tinygpt_cli.transformer.config import Config
from tinygpt_cli.transformer.families import (
    config_from_dict,
    config_to_dict,
    load_config,
    save_config,
)
from tinygpt_cli.transformer.folder import load_model, load_params, save_params
from tinygpt_cli.transformer.model import param_shapes

CONFIG = Config(n_embd=8, n_layer=2, n_head=2, n_inner=12, vocab_size=11, n_positions=6)


@pytest.fixture
def params(make_params):
    return make_params(CONFIG, seed=3)


def hf_named(params) -> dict[str, np.ndarray]:
    return {"transformer." + n: np.asarray(p, dtype=np.float32)
            for n, p in file_names(params).items()}


def write(tmp_path, tensors, name="model.safetensors"):
    path = tmp_path / name
    save_file(tensors, str(path))
    return path


def test_save_then_load_round_trip(tmp_path, params):
    path = tmp_path / "model.safetensors"
    save_params(params, path, CONFIG)
    loaded = load_params(path, CONFIG)
    assert list(loaded) == list(param_shapes(CONFIG))
    for name, value in params.items():
        assert loaded[name].dtype == np.float32
        np.testing.assert_array_equal(loaded[name], value.astype(np.float32))


def test_saved_file_uses_hugging_face_names_without_a_head(tmp_path, params):
    path = tmp_path / "model.safetensors"
    save_params(params, path, CONFIG)
    raw = load_file(str(path))
    assert set(raw) == {"transformer." + n for n in file_names(params)}
    assert "lm_head.weight" not in raw
    assert all(a.dtype == np.float32 for a in raw.values())
    assert raw["transformer.h.0.attn.c_attn.weight"].shape == (8, 24)  # (in, out)


def test_load_accepts_names_without_the_prefix(tmp_path, params):
    bare = {n: np.asarray(p, dtype=np.float32) for n, p in file_names(params).items()}
    loaded = load_params(write(tmp_path, bare), CONFIG)
    assert loaded.keys() == params.keys()
    for name, value in file_names(loaded).items():
        np.testing.assert_array_equal(value, bare[name])


def test_load_ignores_a_tied_head_and_old_attention_buffers(tmp_path, params):
    tensors = hf_named(params)
    tensors["lm_head.weight"] = tensors["transformer.wte.weight"].copy()
    tensors["transformer.h.0.attn.bias"] = np.ones((1, 1, 6, 6), dtype=np.float32)
    tensors["transformer.h.1.attn.masked_bias"] = np.array(-1e4, dtype=np.float32)
    loaded = load_params(write(tmp_path, tensors), CONFIG)
    assert set(loaded) == set(params)


def test_float16_and_float64_files_load_as_float32(tmp_path, params):
    tensors = {n: a.astype(np.float64) for n, a in hf_named(params).items()}
    tensors["transformer.ln_f.bias"] = tensors["transformer.ln_f.bias"].astype(np.float16)
    loaded = load_params(write(tmp_path, tensors), CONFIG)
    assert all(a.dtype == np.float32 for a in loaded.values())


def broken(params, how: str) -> tuple[dict[str, np.ndarray], str]:
    """A tensor dict with one fault, and the tensor name the error must mention."""
    tensors = hf_named(params)
    name = "transformer.h.1.mlp.c_fc.weight"
    if how == "shape":
        tensors[name] = tensors[name].T.copy()
    elif how == "missing":
        del tensors[name]
    elif how == "nan":
        tensors[name][2, 3] = np.nan
    elif how == "inf":
        tensors[name][0, 0] = -np.inf
    elif how == "integer":
        tensors[name] = np.ones(tensors[name].shape, dtype=np.int32)
    elif how == "unexpected":
        name = "transformer.h.2.ln_1.weight"  # a third block in a two-block model
        tensors[name] = np.ones(8, dtype=np.float32)
    return tensors, name


@pytest.mark.parametrize(
    ("how", "words"),
    [("shape", ["shape", "[12, 8]", "[8, 12]"]), ("missing", ["missing"]),
     ("nan", ["NaN"]), ("inf", ["infinite"]), ("integer", ["int32", "float"]),
     ("unexpected", ["unexpected"])],
)
def test_errors_name_the_tensor(tmp_path, params, how, words):
    tensors, name = broken(params, how)
    with pytest.raises(WeightsError) as info:
        load_params(write(tmp_path, tensors), CONFIG)
    message = str(info.value)
    assert name.removeprefix("transformer.") in message
    for word in words:
        assert word in message


def test_finite_weights_whose_sum_overflows_load_and_opposite_infinities_do_not(tmp_path,
                                                                             params):
    # the check sums a tensor first; a sum past float32's range must not refuse finite numbers
    tensors = hf_named(params)
    name = "transformer.h.1.mlp.c_fc.weight"
    tensors[name][:] = np.finfo(np.float32).max
    loaded = load_params(write(tmp_path, tensors), CONFIG)
    assert np.isfinite(loaded["layers.1.mlp.W_in"]).all()
    tensors[name][0, :2] = [np.inf, -np.inf]  # whose sum, NaN, is caught too
    with pytest.raises(WeightsError, match="h.1.mlp.c_fc.weight holds NaN or infinite"):
        load_params(write(tmp_path, tensors, "two.safetensors"), CONFIG)


def test_a_file_that_is_not_safetensors(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"PK\x03\x04 this is a zip, not safetensors" * 10)
    with pytest.raises(WeightsError, match="not a readable safetensors file"):
        load_params(path, CONFIG)
    path.write_bytes(b"")
    with pytest.raises(WeightsError, match="safetensors"):
        load_params(path, CONFIG)


def test_a_missing_file(tmp_path):
    with pytest.raises(WeightsError, match="does not exist"):
        load_params(tmp_path / "nope.safetensors", CONFIG)


# ---------------------------------------------------------------- atomic, readable writes


@pytest.fixture
def strict_umask():
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


def test_write_atomically_leaves_one_readable_file(tmp_path, strict_umask):
    target = tmp_path / "sub" / "model.safetensors"
    write_atomically(target, b"first")
    write_atomically(target, b"second version")
    assert target.read_bytes() == b"second version"
    assert sorted(p.name for p in target.parent.iterdir()) == ["model.safetensors"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_a_failed_write_keeps_the_old_file_and_no_temp(tmp_path):
    target = tmp_path / "config.json"
    write_atomically(target, b"old")
    with pytest.raises(TypeError):
        write_atomically(target, "not bytes")  # fails inside the write
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]


def test_saved_folder_files_are_world_readable(tmp_path, params, tiny_tokenizer, strict_umask):
    from tinygpt_cli.transformer.tokenizer import save_tokenizer

    save_params(params, tmp_path / "model.safetensors", CONFIG)
    save_config(CONFIG, tmp_path / "config.json")
    save_tokenizer(tiny_tokenizer, tmp_path / "tokenizer.json")
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644, name
    assert load_config(tmp_path / "config.json") == CONFIG


# ---------------------------------------------------------------- the whole folder


def test_load_model_reads_a_folder(tiny_folder):
    model = load_model(tiny_folder.folder)
    assert model.config == tiny_folder.config
    assert model.weights_file == tiny_folder.folder / "model.safetensors"
    assert model.tokenizer.vocab_size == tiny_folder.tokenizer.vocab_size
    for name, value in tiny_folder.params.items():
        np.testing.assert_array_equal(model.params[name], value.astype(np.float32))


def test_load_model_names_what_is_missing(tiny_folder):
    (tiny_folder.folder / "tokenizer.json").unlink()
    with pytest.raises(WeightsError, match="tokenizer.json"):
        load_model(tiny_folder.folder)
    with pytest.raises(InputError, match="does not exist"):  # named by the user: exit 2
        load_model(tiny_folder.folder / "nowhere")


def test_load_model_refuses_a_tokenizer_bigger_than_the_model(tiny_folder, make_params):
    small = Config(n_embd=16, n_layer=2, n_head=2, n_inner=24, vocab_size=100, n_positions=32)
    save_config(small, tiny_folder.folder / "config.json")
    save_params(make_params(small), tiny_folder.folder / "model.safetensors", small)
    with pytest.raises(WeightsError, match="tokenizer has"):
        load_model(tiny_folder.folder)


SIZES = {"n_embd": 8, "n_layer": 2, "n_head": 2, "vocab_size": 11, "n_positions": 6}


@pytest.mark.parametrize("ids, bos, eos, unused", [
    # transformers' default GPT2Config: 50256 whatever the vocabulary; read past, noted
    ({"bos_token_id": 50256, "eos_token_id": 50256, "pad_token_id": None}, 0, 0,
     ("bos_token_id 50256", "eos_token_id 50256")),
    ({"bos_token_id": 3, "eos_token_id": 11, "pad_token_id": -1}, 3, 0,
     ("eos_token_id 11", "pad_token_id -1")),
    ({"bos_token_id": True, "eos_token_id": "x" * 100, "pad_token_id": 10}, 0, 0,
     ("bos_token_id True", "eos_token_id 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx…")),
    ({"bos_token_id": 10, "eos_token_id": 9}, 10, 9, ()),
])
def test_special_ids_outside_the_vocabulary_are_noted_not_refused(ids, bos, eos, unused):
    config = config_from_dict({**SIZES, **ids, "summary_type": "cls_index", "attn_pdrop": 0.1})
    assert (config.bos_token_id, config.eos_token_id, config.unused) == (bos, eos, unused)
    assert config == Config(**SIZES, n_inner=32, bos_token_id=bos, eos_token_id=eos)
    assert "unused" not in config_to_dict(config)


@pytest.mark.parametrize("key, value", [("scale_attn_weights", False),
                                        ("add_cross_attention", True),
                                        ("scale_attn_by_inverse_layer_idx", True)])
def test_what_would_change_the_computation_is_still_refused(key, value):
    with pytest.raises(ValueError, match=f"config: {key} {value} is not supported"):
        config_from_dict({**SIZES, key: value})
