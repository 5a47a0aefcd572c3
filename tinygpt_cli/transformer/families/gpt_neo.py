"""GPT-Neo (`GPTNeoForCausalLM`: the TinyStories models): the Hugging Face file layout <->
the canonical one.

GPT-2's block, but q, k and v are three nn.Linear without bias ((out, in): transposed both
ways), the scores are not scaled by 1 / sqrt(d_k), and the blocks `attention_types` calls
local see only the last `window_size` keys.
"""

from __future__ import annotations

import re

import numpy as np

from ...escapes import shown
from ..config import Config
from ..schema import param_shapes
from .common import block_index, canonical_of, cut, filled, pattern_of, refuse, specials, whole

MODEL_TYPE = "gpt_neo"
LABEL = "GPT-Neo"
PREFIX = "transformer."
IGNORED = (".attention.bias", ".attention.masked_bias")
PLACES_BFLOAT16 = False  # its params_from_file gets bfloat16 tensors widened
# Hugging Face's module names (hooks name them): the blocks, the norm before the MLP,
# attention's output projection (the MLP is `mlp` in every family)
MODULES = ("transformer.h", "ln_2", "attn.attention.out_proj")

_BLOCK = re.compile(r"^(?:transformer\.)?h\.(\d+)\.")
NAMES: dict[str, tuple[str, bool]] = {
    "embed.W_E": ("wte.weight", False),
    "embed.W_pos": ("wpe.weight", False),
    "layers.L.ln1.w": ("h.L.ln_1.weight", False),
    "layers.L.ln1.b": ("h.L.ln_1.bias", False),
    "layers.L.attn.W_O": ("h.L.attn.attention.out_proj.weight", True),
    "layers.L.attn.b_O": ("h.L.attn.attention.out_proj.bias", False),
    "layers.L.ln2.w": ("h.L.ln_2.weight", False),
    "layers.L.ln2.b": ("h.L.ln_2.bias", False),
    "layers.L.mlp.W_in": ("h.L.mlp.c_fc.weight", True),
    "layers.L.mlp.b_in": ("h.L.mlp.c_fc.bias", False),
    "layers.L.mlp.W_out": ("h.L.mlp.c_proj.weight", True),
    "layers.L.mlp.b_out": ("h.L.mlp.c_proj.bias", False),
    "ln_final.w": ("ln_f.weight", False),
    "ln_final.b": ("ln_f.bias", False),
}
QKV = ("q_proj", "k_proj", "v_proj")



def _qkv_files(i: int) -> list[str]:
    return [f"h.{i}.attn.attention.{p}.weight" for p in QKV]


def file_name(canonical: str) -> str:
    pattern, i = pattern_of(canonical)
    if pattern == "layers.L.attn.W_QKV":
        return f"h.{i}.attn.attention.{{q,k,v}}_proj.weight"
    return filled(NAMES[pattern][0], i)


def block_of(name: str) -> int | None:
    return block_index(name, _BLOCK)


def canonical_name(name: str) -> str | None:
    name = name.removeprefix(PREFIX)
    i = block_of(name)
    return canonical_of(NAMES, name, i)


def file_shapes(config: Config) -> dict[str, tuple[int, ...]]:

    out: dict[str, tuple[int, ...]] = {}
    for name, shape in param_shapes(config).items():
        pattern, i = pattern_of(name)
        if pattern == "layers.L.attn.W_QKV":
            for file in _qkv_files(i):
                out[file] = (config.n_embd, config.n_embd)
            continue
        out[file_name(name)] = tuple(reversed(shape)) if NAMES[pattern][1] else shape
    return out


def params_from_file(tensors: dict, config: Config) -> dict:

    out = {}
    for name in param_shapes(config):
        pattern, i = pattern_of(name)
        if pattern == "layers.L.attn.W_QKV":
            out[name] = np.concatenate([tensors.pop(f).T for f in _qkv_files(i)], axis=-1)
            continue
        a = tensors.pop(file_name(name))  # let go of the file's copy once ours is made
        out[name] = np.ascontiguousarray(a.T) if NAMES[pattern][1] else a
    return out


def params_to_file(params: dict, config: Config) -> dict:
    out = {}
    for name, a in params.items():
        pattern, i = pattern_of(name)
        if pattern == "layers.L.attn.W_QKV":
            for file, piece in zip(_qkv_files(i), cut(a, [config.n_embd] * 3), strict=True):
                out[PREFIX + file] = np.ascontiguousarray(piece.T)
            continue
        out[PREFIX + file_name(name)] = np.ascontiguousarray(a.T) if NAMES[pattern][1] else a
    return out


def windows_of(d: dict, n_layer: int) -> tuple[int, ...]:
    """attention_types ([[["global", "local"], 12]]) as one window per block (0: global)."""
    kinds = []
    for item in d.get("attention_types") or [[["global", "local"], 12]]:
        if (not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], list)
                or not isinstance(item[1], int) or item[1] > 1 << 16):
            raise ValueError(f"config: attention_types {shown(d.get('attention_types'))} is "
                             "not a list of [kinds, count] pairs")
        kinds += item[0] * item[1]
    if len(kinds) != n_layer or any(k not in ("global", "local") for k in kinds):
        raise ValueError(f"config: attention_types names {len(kinds)} blocks of global or "
                         f"local attention, but num_layers is {n_layer}")
    window = d.get("window_size", 256)
    return tuple(window if k == "local" else 0 for k in kinds)


def config_from_hf(d: dict) -> Config:
    refuse(d, {"activation_function": "gelu_new", "tie_word_embeddings": True})
    vocab = d.get("vocab_size", 50257)
    ids, unused = specials(d, vocab)
    n_embd, n_layer = whole(d, "hidden_size"), whole(d, "num_layers")
    return Config(
        n_embd=n_embd, n_layer=n_layer, n_head=whole(d, "num_heads"),
        n_inner=d.get("intermediate_size") or 4 * n_embd, vocab_size=vocab,
        n_positions=d.get("max_position_embeddings", 2048),
        layer_norm_epsilon=d.get("layer_norm_epsilon", 1e-5), **ids,
        model_type=MODEL_TYPE, attn_scale=1.0, qkv_bias=False,
        windows=windows_of(d, n_layer), unused=unused,
    )


def config_to_hf(config: Config) -> dict:
    kinds = ["local" if w else "global" for w in config.windows] or ["global"] * config.n_layer
    window = max(config.windows, default=0) or 256
    return dict(
        model_type=MODEL_TYPE, architectures=["GPTNeoForCausalLM"],
        vocab_size=config.vocab_size, hidden_size=config.n_embd, num_layers=config.n_layer,
        num_heads=config.n_head, intermediate_size=config.n_inner,
        max_position_embeddings=config.n_positions, attention_types=[[[k], 1] for k in kinds],
        window_size=window, activation_function="gelu_new",
        layer_norm_epsilon=config.layer_norm_epsilon, bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id, tie_word_embeddings=True, resid_dropout=0.0,
        embed_dropout=0.0, attention_dropout=0.0, use_cache=True,
    )
