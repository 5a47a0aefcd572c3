"""GPT-NeoX (`GPTNeoXForCausalLM`: Pythia): the Hugging Face file layout <-> the canonical one.

LayerNorms, rotary positions on the first `rotary_pct` of each head's numbers, attention and
MLP side by side (use_parallel_residual), exact (erf) GELU, biases everywhere, and an untied
head `embed_out`. Its fused query_key_value interleaves the heads (head 0's q, k, v, then
head 1's ...): here they are regrouped as W_QKV's q, then k, then v.
"""

from __future__ import annotations

import re

import numpy as np

from ..config import Config
from ..schema import param_shapes
from .common import (
    block_index,
    canonical_of,
    filled,
    pattern_of,
    refuse,
    rope,
    rotary_numbers,
    specials,
    whole,
)

MODEL_TYPE = "gpt_neox"
LABEL = "GPT-NeoX"
PREFIX = ""
IGNORED = (".attention.bias", ".attention.masked_bias", ".rotary_emb.inv_freq")
PLACES_BFLOAT16 = False  # its params_from_file gets bfloat16 tensors widened
# Hugging Face's module names (hooks name them): the blocks, the norm before the MLP,
# attention's output projection (the MLP is `mlp` in every family)
MODULES = ("gpt_neox.layers", "post_attention_layernorm", "attention.dense")

_BLOCK = re.compile(r"^gpt_neox\.layers\.(\d+)\.")
NAMES: dict[str, tuple[str, bool]] = {
    "embed.W_E": ("gpt_neox.embed_in.weight", False),
    "layers.L.ln1.w": ("gpt_neox.layers.L.input_layernorm.weight", False),
    "layers.L.ln1.b": ("gpt_neox.layers.L.input_layernorm.bias", False),
    "layers.L.attn.W_QKV": ("gpt_neox.layers.L.attention.query_key_value.weight", True),
    "layers.L.attn.b_QKV": ("gpt_neox.layers.L.attention.query_key_value.bias", False),
    "layers.L.attn.W_O": ("gpt_neox.layers.L.attention.dense.weight", True),
    "layers.L.attn.b_O": ("gpt_neox.layers.L.attention.dense.bias", False),
    "layers.L.ln2.w": ("gpt_neox.layers.L.post_attention_layernorm.weight", False),
    "layers.L.ln2.b": ("gpt_neox.layers.L.post_attention_layernorm.bias", False),
    "layers.L.mlp.W_in": ("gpt_neox.layers.L.mlp.dense_h_to_4h.weight", True),
    "layers.L.mlp.b_in": ("gpt_neox.layers.L.mlp.dense_h_to_4h.bias", False),
    "layers.L.mlp.W_out": ("gpt_neox.layers.L.mlp.dense_4h_to_h.weight", True),
    "layers.L.mlp.b_out": ("gpt_neox.layers.L.mlp.dense_4h_to_h.bias", False),
    "ln_final.w": ("gpt_neox.final_layer_norm.weight", False),
    "ln_final.b": ("gpt_neox.final_layer_norm.bias", False),
    "unembed.W_U": ("embed_out.weight", False),
}



def file_name(canonical: str) -> str:
    pattern, i = pattern_of(canonical)
    return filled(NAMES[pattern][0], i)


def block_of(name: str) -> int | None:
    return block_index(name, _BLOCK)


def canonical_name(name: str) -> str | None:
    i = block_of(name)
    return canonical_of(NAMES, name, i)


def file_shapes(config: Config) -> dict[str, tuple[int, ...]]:

    return {file_name(n): tuple(reversed(s)) if NAMES[pattern_of(n)[0]][1] else s
            for n, s in param_shapes(config).items()}


def _grouped(a: np.ndarray, config: Config, back: bool = False) -> np.ndarray:
    """The out axis [.., H * 3 * d_k] by head (q k v of head 0, then of head 1 ...) <->
    by kind (every head's q, then every k, then every v)."""
    lead, h, dk = a.shape[:-1], config.n_head, config.d_k
    shape = (*lead, 3, h, dk) if back else (*lead, h, 3, dk)
    return np.ascontiguousarray(np.swapaxes(a.reshape(shape), -3, -2).reshape(*lead, -1))


def params_from_file(tensors: dict, config: Config) -> dict:

    out = {}
    for name in param_shapes(config):
        a = tensors.pop(file_name(name))  # let go of the file's copy once ours is made
        a = np.ascontiguousarray(a.T) if NAMES[pattern_of(name)[0]][1] else a
        out[name] = _grouped(a, config) if name.endswith("_QKV") else a
    return out


def params_to_file(params: dict, config: Config) -> dict:
    out = {}
    for name, a in params.items():
        a = _grouped(a, config, back=True) if name.endswith("_QKV") else a
        out[file_name(name)] = np.ascontiguousarray(a.T) if NAMES[pattern_of(name)[0]][1] else a
    return out


def config_from_hf(d: dict) -> Config:
    refuse(d, {"hidden_act": "gelu", "attention_bias": True})
    vocab = d.get("vocab_size", 50432)
    ids, unused = specials(d, vocab)
    n_embd, n_head = whole(d, "hidden_size"), whole(d, "num_attention_heads")
    base, fraction, scaling = rope(d, "rotary_emb_base", "rotary_pct", 0.25)
    if scaling:
        raise ValueError(f"config: {'linear' if len(scaling) == 1 else 'llama3'} rope scaling "
                         "is not implemented for gpt_neox")
    d_k = n_embd // n_head if isinstance(n_embd, int) and isinstance(n_head, int) and n_head else 0
    return Config(
        n_embd=n_embd, n_layer=whole(d, "num_hidden_layers"), n_head=n_head,
        n_inner=d.get("intermediate_size") or 4 * n_embd, vocab_size=vocab,
        n_positions=d.get("max_position_embeddings", 2048),
        layer_norm_epsilon=d.get("layer_norm_eps", 1e-5), **ids,
        model_type=MODEL_TYPE, norm="layer", positions="rotary", mlp="gelu", act="gelu",
        tied=d.get("tie_word_embeddings", False) is True,
        parallel=d.get("use_parallel_residual", True) is True,
        rotary_dim=rotary_numbers(d_k, fraction), rotary_base=float(base), unused=unused,
    )


def config_to_hf(config: Config) -> dict:
    return dict(
        model_type=MODEL_TYPE, architectures=["GPTNeoXForCausalLM"],
        vocab_size=config.vocab_size, hidden_size=config.n_embd,
        intermediate_size=config.n_inner, num_hidden_layers=config.n_layer,
        num_attention_heads=config.n_head, hidden_act="gelu",
        max_position_embeddings=config.n_positions, layer_norm_eps=config.layer_norm_epsilon,
        rotary_pct=config.rotary / config.d_k, rotary_emb_base=config.rotary_base,
        rope_parameters={"rope_type": "default", "rope_theta": config.rotary_base,
                         "partial_rotary_factor": config.rotary / config.d_k},
        use_parallel_residual=config.parallel, tie_word_embeddings=config.tied,
        attention_bias=True, bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id, use_cache=True, hidden_dropout=0.0,
        attention_dropout=0.0,
    )
