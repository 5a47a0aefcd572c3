"""Llama (`LlamaForCausalLM`: SmolLM2, Llama 3.2), and Qwen2 / Qwen3, which are Llama plus
q/k/v biases (Qwen2) or an RMSNorm on each head's q and k (Qwen3): the Hugging Face file
layout <-> the canonical one.

RMSNorm, rotary positions on every number of a head (rotate_half pairing), grouped-query
attention, a SwiGLU MLP (silu(x W_gate) * x W_in), no biases but Qwen2's, a head tied to
W_E or its own `lm_head`. nn.Linear keeps (out, in): each matrix is transposed both ways,
and q, k, v are three tensors in the file and one W_QKV here.
"""

from __future__ import annotations

import re

import numpy as np

from ..config import Config
from ..schema import param_shapes
from .common import (
    block_index,
    canonical_of,
    cut,
    filled,
    floats,
    is_transposed,
    pattern_of,
    qkv_files,
    qkv_sizes,
    refuse,
    rope,
    side_by_side,
    specials,
    transposed,
    whole,
)

MODEL_TYPE = "llama"
LABEL = "Llama"
PREFIX = ""  # the file's names are whole: model.layers.0..., lm_head.weight
IGNORED = (".rotary_emb.inv_freq",)  # an old buffer, not a parameter
# a bfloat16 file's tensors come unwidened (safetensors.Bfloat16): params_from_file widens each
# straight into its canonical place
PLACES_BFLOAT16 = True
# Hugging Face's module names (hooks name them): the blocks, the norm before the MLP,
# attention's output projection (the MLP is `mlp` in every family)
MODULES = ("model.layers", "post_attention_layernorm", "self_attn.o_proj")

_BLOCK = re.compile(r"^model\.layers\.(\d+)\.")
# canonical pattern -> (file pattern, transposed)
NAMES: dict[str, tuple[str, bool]] = {
    "embed.W_E": ("model.embed_tokens.weight", False),
    "layers.L.ln1.w": ("model.layers.L.input_layernorm.weight", False),
    "layers.L.attn.q_norm.w": ("model.layers.L.self_attn.q_norm.weight", False),
    "layers.L.attn.k_norm.w": ("model.layers.L.self_attn.k_norm.weight", False),
    "layers.L.attn.W_O": ("model.layers.L.self_attn.o_proj.weight", True),
    "layers.L.ln2.w": ("model.layers.L.post_attention_layernorm.weight", False),
    "layers.L.mlp.W_gate": ("model.layers.L.mlp.gate_proj.weight", True),
    "layers.L.mlp.W_in": ("model.layers.L.mlp.up_proj.weight", True),
    "layers.L.mlp.W_out": ("model.layers.L.mlp.down_proj.weight", True),
    "ln_final.w": ("model.norm.weight", False),
    "unembed.W_U": ("lm_head.weight", False),  # the head's rows [V, d], as W_E's
}


def file_name(canonical: str) -> str:
    """layers.3.mlp.W_in -> model.layers.3.mlp.up_proj.weight; W_QKV and b_QKV, three
    tensors in the file, by the q one's name with {q,k,v}."""
    pattern, i = pattern_of(canonical)
    if pattern in ("layers.L.attn.W_QKV", "layers.L.attn.b_QKV"):
        kind = "weight" if pattern.endswith("W_QKV") else "bias"
        return f"model.layers.{i}.self_attn.{{q,k,v}}_proj.{kind}"
    return filled(NAMES[pattern][0], i)


def canonical_name(name: str) -> str | None:
    """A file tensor that is one canonical parameter -> its name (q, k and v are pieces of
    W_QKV: None)."""
    return canonical_of(NAMES, name, block_of(name))


def block_of(name: str) -> int | None:
    return block_index(name, _BLOCK)


def file_shapes(config: Config) -> dict[str, tuple[int, ...]]:
    """Every tensor of the file by its name, with its shape, in the file's order."""

    out: dict[str, tuple[int, ...]] = {}
    for name, shape in param_shapes(config).items():
        m = re.match(r"layers\.(\d+)\.attn\.([Wb])_QKV$", name)
        if m:
            kind = "weight" if m[2] == "W" else "bias"
            for file, rows in zip(qkv_files(int(m[1]), kind), qkv_sizes(config), strict=True):
                out[file] = (rows, config.n_embd) if kind == "weight" else (rows,)
            continue
        out[file_name(name)] = tuple(reversed(shape)) if is_transposed(NAMES, name) else shape
    return out


def params_from_file(tensors: dict, config: Config) -> dict:
    """The file's tensors (checked against file_shapes) -> canonical params: matrices
    transposed to (in, out), q k v side by side."""

    out = {}
    for name in param_shapes(config):
        m = re.match(r"layers\.(\d+)\.attn\.([Wb])_QKV$", name)
        if m:
            kind = "weight" if m[2] == "W" else "bias"
            pieces = [tensors.pop(f) for f in qkv_files(int(m[1]), kind)]
            out[name] = side_by_side(pieces) if kind == "weight" else \
                np.concatenate([floats(p) for p in pieces])
            continue
        a = tensors.pop(file_name(name))  # let go of the file's copy once ours is made
        out[name] = transposed(a) if is_transposed(NAMES, name) else floats(a)
    return out


def params_to_file(params: dict, config: Config) -> dict:
    """Canonical params -> the tensors LlamaForCausalLM.save_pretrained writes."""
    out = {}
    for name, a in params.items():
        m = re.match(r"layers\.(\d+)\.attn\.([Wb])_QKV$", name)
        if m:
            kind = "weight" if m[2] == "W" else "bias"
            for file, piece in zip(qkv_files(int(m[1]), kind), cut(a, qkv_sizes(config)),
                                   strict=True):
                out[file] = np.ascontiguousarray(piece.T if kind == "weight" else piece)
            continue
        out[file_name(name)] = np.ascontiguousarray(a.T) if is_transposed(NAMES, name) else a
    return out


def config_from_hf(d: dict) -> Config:
    """LlamaConfig, Qwen2Config or Qwen3Config's keys -> Config."""
    kind = d.get("model_type", MODEL_TYPE)
    refuse(d, {"hidden_act": "silu", "mlp_bias": False, "use_sliding_window": False,
               "pretraining_tp": 1, "attn_logit_softcapping": None,
               "final_logit_softcapping": None})
    if kind != "qwen2":
        refuse(d, {"attention_bias": False})
    vocab = d.get("vocab_size", 32000)
    ids, unused = specials(d, vocab)
    base, fraction, scaling = rope(d)
    if fraction != 1.0:
        raise ValueError(f"config: partial_rotary_factor {fraction!r} is not implemented "
                         "for llama (every number of a head turns)")
    n_embd, n_head = whole(d, "hidden_size"), whole(d, "num_attention_heads")
    return Config(
        n_embd=n_embd, n_layer=whole(d, "num_hidden_layers"), n_head=n_head,
        n_inner=whole(d, "intermediate_size"), vocab_size=vocab,
        n_positions=d.get("max_position_embeddings", 2048),
        layer_norm_epsilon=d.get("rms_norm_eps", 1e-6), **ids,
        model_type=kind, norm="rms", positions="rotary", mlp="gated", act="silu",
        tied=d.get("tie_word_embeddings", False) is True,
        # transformers' Qwen3Config has head_dim 128 when the file names none; the others
        # hidden_size / num_attention_heads
        head_dim=_unless(d.get("head_dim", 128 if kind == "qwen3" else None),
                         n_embd // n_head if _whole(n_embd, n_head) else 0),
        n_kv_head=_unless(d.get("num_key_value_heads"), n_head), rotary_base=float(base),
        rope_scaling=scaling,
        qk_norm=kind == "qwen3", qkv_bias=kind == "qwen2", out_bias=False, mlp_bias=False,
        unused=unused,
    )


def _rope_parameters(config: Config) -> dict:
    if not config.rope_scaling:
        return {"rope_type": "default", "rope_theta": config.rotary_base}
    if len(config.rope_scaling) == 1:
        return {"rope_type": "linear", "rope_theta": config.rotary_base,
                "factor": config.rope_scaling[0]}
    factor, low, high, context = config.rope_scaling
    return {"rope_type": "llama3", "rope_theta": config.rotary_base, "factor": factor,
            "low_freq_factor": low, "high_freq_factor": high,
            "original_max_position_embeddings": context}


def _unless(value, default):
    """0 (the default: Config works it out) for a value equal to its default."""
    return 0 if value is None or value == default else value


def _whole(*xs) -> bool:
    return all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in xs)


def config_to_hf(config: Config) -> dict:
    """A config.json LlamaConfig (Qwen2Config, Qwen3Config) reads back to the same model."""
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
            "qwen3": "Qwen3ForCausalLM"}[config.model_type]
    out = dict(
        model_type=config.model_type, architectures=[arch], vocab_size=config.vocab_size,
        hidden_size=config.n_embd, intermediate_size=config.n_inner,
        num_hidden_layers=config.n_layer, num_attention_heads=config.n_head,
        num_key_value_heads=config.kv_heads, head_dim=config.d_k, hidden_act="silu",
        max_position_embeddings=config.n_positions, rms_norm_eps=config.layer_norm_epsilon,
        tie_word_embeddings=config.tied, attention_bias=config.qkv_bias, mlp_bias=False,
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
        rope_parameters=_rope_parameters(config),
        rope_theta=config.rotary_base, use_cache=True, attention_dropout=0.0,
    )
    if config.model_type != "llama":
        out["use_sliding_window"] = False
    return out
