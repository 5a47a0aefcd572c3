"""Gemma 3's text model (`Gemma3ForCausalLM`, model_type `gemma3_text`: Gemma 3 270M, 1B):
the Hugging Face file layout <-> the canonical one.

What it does beside Llama's block (read from transformers' modeling_gemma3.py):

- every RMSNorm multiplies by (1 + w), in float32: the file keeps w, the canonical scale is
  1 + w, made once here in float32 (the very product transformers multiplies by), so the
  norm is the plain RMSNorm every pass already computes; saving writes (1 + w) - 1, which
  gives back the same float32 scale;
- four norms per block: ln1 (input_layernorm), ln1_post after attention
  (post_attention_layernorm), ln2 before the MLP (pre_feedforward_layernorm) and ln2_post
  after it (post_feedforward_layernorm), each post norm before its residual add;
- q and k each RMS-normed over the head before the turn (qk_norm, the same (1 + w) form);
- scores scaled by query_pre_attn_scalar ** -0.5; head_dim set apart from d / heads;
- `layer_types`: sliding blocks see the last `sliding_window` keys (themselves included:
  transformers keeps key j for query i when j > i - sliding_window) and turn by their own
  rotary base, full blocks see all;
- a GeGLU MLP with the tanh GELU (gelu_pytorch_tanh is gelu_new's formula);
- the token embeddings times sqrt(hidden_size) as the weights' dtype rounds that scalar.

What it does not (refused by name): logit soft-capping, scaled rotary positions, the
bidirectional variant, the multimodal `gemma3` folders (Gemma3ForConditionalGeneration).
"""

from __future__ import annotations

import math
import re

import numpy as np

from ...escapes import shown
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
    side_by_side,
    specials,
    transposed,
    whole,
)

MODEL_TYPE = "gemma3_text"
LABEL = "Gemma 3"
PREFIX = ""
IGNORED = ()
PLACES_BFLOAT16 = True
# Hugging Face's module names (hooks name them): the blocks, the norm before the MLP,
# attention's output projection (the MLP is `mlp` in every family)
# (Gemma 3's post_attention_layernorm is its norm after attention, not before the MLP)
MODULES = ("model.layers", "pre_feedforward_layernorm", "self_attn.o_proj")

_BLOCK = re.compile(r"^model\.layers\.(\d+)\.")
NAMES: dict[str, tuple[str, bool]] = {  # canonical pattern -> (file pattern, transposed)
    "embed.W_E": ("model.embed_tokens.weight", False),
    "layers.L.ln1.w": ("model.layers.L.input_layernorm.weight", False),
    "layers.L.attn.q_norm.w": ("model.layers.L.self_attn.q_norm.weight", False),
    "layers.L.attn.k_norm.w": ("model.layers.L.self_attn.k_norm.weight", False),
    "layers.L.attn.W_O": ("model.layers.L.self_attn.o_proj.weight", True),
    "layers.L.ln1_post.w": ("model.layers.L.post_attention_layernorm.weight", False),
    "layers.L.ln2.w": ("model.layers.L.pre_feedforward_layernorm.weight", False),
    "layers.L.mlp.W_gate": ("model.layers.L.mlp.gate_proj.weight", True),
    "layers.L.mlp.W_in": ("model.layers.L.mlp.up_proj.weight", True),
    "layers.L.mlp.W_out": ("model.layers.L.mlp.down_proj.weight", True),
    "layers.L.ln2_post.w": ("model.layers.L.post_feedforward_layernorm.weight", False),
    "ln_final.w": ("model.norm.weight", False),
    "unembed.W_U": ("lm_head.weight", False),
}
DEFAULT_THETA = {"full_attention": 1_000_000.0, "sliding_attention": 10_000.0}


def file_name(canonical: str) -> str:
    pattern, i = pattern_of(canonical)
    if pattern == "layers.L.attn.W_QKV":
        return f"model.layers.{i}.self_attn.{{q,k,v}}_proj.weight"
    return filled(NAMES[pattern][0], i)


def canonical_name(name: str) -> str | None:
    return canonical_of(NAMES, name, block_of(name))


def block_of(name: str) -> int | None:
    return block_index(name, _BLOCK)


def _is_scale(canonical: str) -> bool:
    """A norm's scale, kept as w in the file and used as 1 + w."""
    return canonical.endswith("norm.w") or re.search(r"(^|\.)ln\w*\.w$", canonical) is not None


def _qkv(name: str) -> int | None:
    m = re.match(r"layers\.(\d+)\.attn\.W_QKV$", name)
    return int(m[1]) if m else None


def file_shapes(config: Config) -> dict[str, tuple[int, ...]]:

    out: dict[str, tuple[int, ...]] = {}
    for name, shape in param_shapes(config).items():
        i = _qkv(name)
        if i is not None:
            for file, rows in zip(qkv_files(i), qkv_sizes(config), strict=True):
                out[file] = (rows, config.n_embd)
            continue
        out[file_name(name)] = tuple(reversed(shape)) if is_transposed(NAMES, name) else shape
    return out


def params_from_file(tensors: dict, config: Config) -> dict:
    """The file's tensors -> canonical params: matrices (in, out), q k v side by side, each
    norm's w as its scale 1 + w (float32, as transformers adds it)."""

    out = {}
    for name in param_shapes(config):
        i = _qkv(name)
        if i is not None:
            out[name] = side_by_side([tensors.pop(f) for f in qkv_files(i)])
            continue
        a = tensors.pop(file_name(name))
        if _is_scale(name):
            a = floats(a)
            out[name] = a + a.dtype.type(1)
        else:
            out[name] = transposed(a) if is_transposed(NAMES, name) else floats(a)
    return out


def params_to_file(params: dict, config: Config) -> dict:
    """Canonical params -> the tensors Gemma3ForCausalLM.save_pretrained writes, each norm's
    scale as w = (1 + w) - 1."""
    out = {}
    for name, a in params.items():
        if _is_scale(name):
            a = a - a.dtype.type(1)
        i = _qkv(name)
        if i is not None:
            for file, piece in zip(qkv_files(i), cut(a, qkv_sizes(config)), strict=True):
                out[file] = np.ascontiguousarray(piece.T)
            continue
        out[file_name(name)] = np.ascontiguousarray(a.T) if is_transposed(NAMES, name) else a
    return out


# ------------------------------------------------------------------ config.json


def rounded(x: float, dtype: str) -> float:
    """x as a scalar of this dtype holds it (torch.tensor(x).to(dtype)): bfloat16 keeps 8
    bits of the float32's mantissa, rounded to nearest, ties to even."""
    f = np.float32(x)
    if dtype == "bfloat16":
        bits = int(f.view(np.uint32))
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return float(np.uint32(bits).view(np.float32))
    if dtype == "float16":
        return float(np.float16(x))
    return float(f)


def _dtype(d: dict) -> str:
    kind = d.get("dtype") or d.get("torch_dtype") or "float32"
    if kind not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"config: dtype {shown(kind)} is not one tinygpt reads (float32, "
                         "bfloat16, float16)")
    return kind


def _layer_types(d: dict, n_layer: int) -> list[str]:
    kinds = d.get("layer_types")
    if kinds is None:  # transformers' default: every sliding_window_pattern-th block full
        every = d.get("sliding_window_pattern", d.get("_sliding_window_pattern", 6))
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ValueError(f"config: sliding_window_pattern {shown(every)} is not a whole "
                             "number from 1")
        kinds = ["full_attention" if (i + 1) % every == 0 else "sliding_attention"
                 for i in range(n_layer)]
    if not isinstance(kinds, list) or len(kinds) != n_layer or \
            not set(kinds) <= set(DEFAULT_THETA):
        raise ValueError(f"config: layer_types must name sliding_attention or full_attention "
                         f"for each of the {n_layer} blocks, got {shown(kinds)}")
    return kinds


def _rope_bases(d: dict) -> dict[str, float]:
    """Each layer type's rotary base, as Gemma3TextConfig reads them: `rope_parameters` per
    type, or the older rope_theta (full blocks), rope_local_base_freq (sliding ones) and
    rope_scaling (full blocks)."""
    given = d.get("rope_parameters")
    if given is not None and (not isinstance(given, dict)
                              or not set(given) <= set(DEFAULT_THETA)):
        raise ValueError("config: rope_parameters must be given per layer type "
                         f"(sliding_attention, full_attention), got {shown(given)}")
    params = {k: dict(v or {}) for k, v in (given or {}).items()}
    if d.get("rope_scaling"):
        params.setdefault("full_attention", {}).update(d["rope_scaling"])
    old = {"full_attention": "rope_theta", "sliding_attention": "rope_local_base_freq"}
    out = {}
    for kind, default in DEFAULT_THETA.items():
        p = params.get(kind, {})
        rope_type = p.get("rope_type", p.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"config: rope scaling {shown(rope_type)} on the "
                             f"{kind.replace('_', ' ')} blocks is not implemented for Gemma 3 "
                             "(only unscaled rotary positions)")
        base = p.get("rope_theta", d.get(old[kind], default))
        if not isinstance(base, int | float) or isinstance(base, bool) or not base > 0:
            raise ValueError(f"config: the {kind} rope_theta must be a positive number, got "
                             f"{shown(base)}")
        out[kind] = float(base)
    return out


def config_from_hf(d: dict) -> Config:
    """Gemma3TextConfig's keys -> Config."""
    refuse(d, {"hidden_activation": "gelu_pytorch_tanh", "attention_bias": False,
               "attn_logit_softcapping": None, "final_logit_softcapping": None,
               "use_bidirectional_attention": False})
    vocab = d.get("vocab_size", 262_208)
    ids, unused = specials(d, vocab)
    n_embd, n_head = whole(d, "hidden_size"), whole(d, "num_attention_heads")
    n_layer = whole(d, "num_hidden_layers")
    kinds = _layer_types(d, n_layer)
    bases = _rope_bases(d)
    window = d.get("sliding_window", 4096)
    if "sliding_attention" in kinds and (not isinstance(window, int) or isinstance(window, bool)
                                         or window < 1):
        raise ValueError(f"config: sliding_window must be a whole number from 1, got "
                         f"{shown(window)}")
    scalar = d.get("query_pre_attn_scalar", 256)
    if not isinstance(scalar, int | float) or isinstance(scalar, bool) or not scalar > 0:
        raise ValueError(f"config: query_pre_attn_scalar must be a positive number, got "
                         f"{shown(scalar)}")
    head_dim = d.get("head_dim", 256)
    return Config(
        n_embd=n_embd, n_layer=n_layer, n_head=n_head,
        n_inner=whole(d, "intermediate_size"), vocab_size=vocab,
        n_positions=d.get("max_position_embeddings", 131_072),
        layer_norm_epsilon=d.get("rms_norm_eps", 1e-6), **ids,
        model_type=MODEL_TYPE, norm="rms", positions="rotary", mlp="gated", act="gelu_new",
        tied=d.get("tie_word_embeddings", True) is True,
        head_dim=0 if head_dim * n_head == n_embd else head_dim,
        n_kv_head=d.get("num_key_value_heads", 4),
        rotary_base=bases["full_attention"],
        rotary_bases=tuple(bases[k] for k in kinds),
        windows=tuple(window if k == "sliding_attention" else 0 for k in kinds),
        attn_scale=float(scalar) ** -0.5, qk_norm=True, post_norms=True,
        embed_scale=rounded(math.sqrt(n_embd), _dtype(d)),
        qkv_bias=False, out_bias=False, mlp_bias=False, unused=unused,
    )


def config_to_hf(config: Config) -> dict:
    """A config.json Gemma3TextConfig reads back to the same model; `dtype` says which
    rounding of sqrt(d) the embedding scale is."""
    root = math.sqrt(config.n_embd)
    dtype = next((k for k in ("float32", "bfloat16", "float16")
                  if rounded(root, k) == config.embed_scale), None)
    if dtype is None:
        raise ValueError(f"config: an embedding scale of {config.embed_scale!r} is not "
                         f"sqrt({config.n_embd}) in any dtype Gemma 3 has")
    bases = config.rotary_bases or (config.rotary_base,) * config.n_layer
    kinds = ["sliding_attention" if config.window(i) else "full_attention"
             for i in range(config.n_layer)]
    # a kind with no block: its default (the full blocks': rotary_base, read from there)
    theta = {k: {b for b, kk in zip(bases, kinds, strict=True) if kk == k} or
             {config.rotary_base if k == "full_attention" else DEFAULT_THETA[k]}
             for k in DEFAULT_THETA}
    if len(set(config.windows) - {0}) > 1 or any(len(v) > 1 for v in theta.values()):
        raise ValueError("config: Gemma 3 has one sliding window and one rotary base per "
                         "layer type; this model's blocks differ")
    theta = {k: v.pop() for k, v in theta.items()}
    scalar = config.scale ** -2
    scalar = round(scalar) if abs(scalar - round(scalar)) < 1e-9 * scalar else scalar
    return dict(
        model_type=MODEL_TYPE, architectures=["Gemma3ForCausalLM"], vocab_size=config.vocab_size,
        hidden_size=config.n_embd, intermediate_size=config.n_inner,
        num_hidden_layers=config.n_layer, num_attention_heads=config.n_head,
        num_key_value_heads=config.kv_heads, head_dim=config.d_k,
        hidden_activation="gelu_pytorch_tanh", max_position_embeddings=config.n_positions,
        rms_norm_eps=config.layer_norm_epsilon, tie_word_embeddings=config.tied,
        attention_bias=False, bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id, layer_types=kinds,
        sliding_window=max(config.windows, default=0) or None,
        query_pre_attn_scalar=scalar,
        rope_parameters={k: {"rope_type": "default", "rope_theta": v} for k, v in theta.items()},
        final_logit_softcapping=None, attn_logit_softcapping=None, use_cache=True,
        attention_dropout=0.0, dtype=dtype,
    )
