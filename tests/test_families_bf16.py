"""A bfloat16 Llama / Qwen2 folder (as the hub ships SmolLM2, Llama 3.2 and Qwen) loads to the
float32 numbers its bits are, each matrix in the canonical (in, out) layout, with q, k and v
side by side: checked against the file's bits widened by hand and transposed by NumPy (no
transformers needed). The loader widens each tensor straight into its place."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from cli_helpers import TOKENIZER

from tinygpt_cli.errors import WeightsError
from tinygpt_cli.jobs.train.loop import arch_config
from tinygpt_cli.transformer.families import llama, save_config
from tinygpt_cli.transformer.folder import load_model
from tinygpt_cli.transformer.model import init_params


def _bf16_file(path, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A safetensors file of these float32 tensors cut to bfloat16 (their top 16 bits), written
    by hand (NumPy has no bfloat16); returns the bits."""
    bits = {n: (np.ascontiguousarray(a, np.float32).view(np.uint32) >> 16).astype("<u2")
            for n, a in tensors.items()}
    header, at = {}, 0
    for name in sorted(bits):
        size = bits[name].nbytes
        header[name] = {"dtype": "BF16", "shape": list(bits[name].shape),
                        "data_offsets": [at, at + size]}
        at += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text
                     + b"".join(bits[n].tobytes() for n in sorted(bits)))
    return bits


def _widened(bits: np.ndarray) -> np.ndarray:  # the reference: a uint32 shift, then a view
    return (bits.astype(np.uint32) << 16).view(np.float32)


@pytest.fixture(params=["llama", "qwen2"])
def bf16_folder(request, tmp_path):
    config = arch_config("llama", n_embd=16, n_layer=2, n_head=4, n_inner=24, vocab_size=4096,
                         n_positions=32)
    if request.param == "qwen2":  # q/k/v biases, which are pieces of one b_QKV too
        config = llama.config_from_hf({**llama.config_to_hf(config), "model_type": "qwen2",
                                       "attention_bias": True})
    params = init_params(config, np.random.default_rng(3))
    tensors = llama.params_to_file(params, config)
    if config.qkv_bias:
        tensors = {n: (a + 0.5 if n.endswith("_proj.bias") else a) for n, a in tensors.items()}
    bits = _bf16_file(tmp_path / "model.safetensors", tensors)
    save_config(config, tmp_path / "config.json")
    shutil.copyfile(TOKENIZER, tmp_path / "tokenizer.json")
    return tmp_path, config, bits


def test_a_bfloat16_folder_loads_to_its_bits_widened_in_the_canonical_layout(bf16_folder):
    folder, config, bits = bf16_folder
    model = load_model(folder)
    want = llama.params_from_file({n: _widened(b) for n, b in bits.items()}, config)
    assert model.params.keys() == want.keys()
    for name, a in model.params.items():
        assert a.dtype == np.float32 and a.flags.c_contiguous, name
        np.testing.assert_array_equal(a, want[name], err_msg=name)
    w_qkv = model.params["layers.1.attn.W_QKV"]  # q's columns, then k's, then v's
    q = _widened(bits["model.layers.1.self_attn.q_proj.weight"])
    v = _widened(bits["model.layers.1.self_attn.v_proj.weight"])
    np.testing.assert_array_equal(w_qkv[:, :q.shape[0]], q.T)
    np.testing.assert_array_equal(w_qkv[:, -v.shape[0]:], v.T)
    if config.qkv_bias:
        b = _widened(bits["model.layers.0.self_attn.k_proj.bias"])
        np.testing.assert_array_equal(model.params["layers.0.attn.b_QKV"][q.shape[0]:][:b.size],
                                      b)


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_a_bfloat16_tensor_with_an_infinity_or_nan_is_named(tmp_path, bad):
    config = arch_config("llama", n_embd=16, n_layer=2, n_head=4, n_inner=24, vocab_size=4096,
                         n_positions=32)
    tensors = llama.params_to_file(init_params(config, np.random.default_rng(4)), config)
    name = "model.layers.1.mlp.up_proj.weight"
    tensors[name] = tensors[name].copy()
    tensors[name][3, 5] = bad
    _bf16_file(tmp_path / "model.safetensors", tensors)
    save_config(config, tmp_path / "config.json")
    shutil.copyfile(TOKENIZER, tmp_path / "tokenizer.json")
    with pytest.raises(WeightsError, match=f"{name} holds NaN or infinite values"):
        load_model(tmp_path)
