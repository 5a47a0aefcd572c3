"""What `info` reports about a weights folder: its sizes, parameter counts per group, the
weights file with its sha256, and the tokenizer (the file's facts found by jobs/info.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path


@dataclass
class ModelInfo:
    config: dict  # the sizes, by their config.json names
    groups: dict[str, int]  # parameters per tensor group, blocks folded together (h.*.ln_1)
    total: int
    weights_file: Path  # resolved
    sha256: str
    tokenizer: dict  # vocab_size, special_tokens, stop_ids (where generation ends)
    shipped: bool = False  # the model that comes with tinygpt (wherever it was installed)
    # a GGUF's own account (gguf_file.description): each tensor's type, the bits per weight,
    # where the weights came from (general.*); None for a safetensors folder
    gguf: dict | None = None
    # each tensor pattern (blk.*.attn_q.weight) -> its types and how many blocks have each
    gguf_groups: dict[str, dict[str, int]] | None = None


def tensor_groups(types: dict[str, str]) -> dict[str, dict[str, int]]:
    """GGUF tensor name -> type, folded over the blocks: blk.*.ffn_down.weight -> {Q6_K: 4,
    Q4_K: 26} (mixed quantizations give some blocks more bits)."""
    out: dict[str, dict[str, int]] = {}
    for name, kind in types.items():
        group = out.setdefault(re.sub(r"^blk\.\d+\.", "blk.*.", name), {})
        group[kind] = group.get(kind, 0) + 1
    return out


def architecture(cfg) -> dict:
    """The knobs in which a model's blocks differ from GPT-2's, by name."""
    out = {"norm": cfg.norm, "positions": cfg.positions, "mlp": cfg.mlp,
           "parallel_block": cfg.parallel}
    if cfg.kv_heads != cfg.n_head:
        out["n_kv_head"] = cfg.kv_heads
    if cfg.rotary:
        out.update(rotary_dim=cfg.rotary, rotary_base=cfg.rotary_base)
        if len(set(cfg.rotary_bases)) > 1:  # Gemma 3: the sliding blocks' own base
            out["rotary_bases"] = list(cfg.rotary_bases)
    if cfg.attn_scale:
        out["attn_scale"] = cfg.attn_scale
    if cfg.windows:
        out["windows"] = list(cfg.windows)
    if cfg.qk_norm:
        out["qk_norm"] = True
    if cfg.post_norms:  # Gemma 3: a norm after attention and after the MLP, each 1 + w
        out["post_norms"] = True
    if cfg.embed_scale:
        out["embed_scale"] = cfg.embed_scale
    out["biases"] = ", ".join(n for n, on in (("qkv", cfg.qkv_bias), ("out", cfg.out_bias),
                                               ("mlp", cfg.mlp_bias)) if on) or "none"
    return out


def model_info(model, weights_file: Path, sha256: str, shipped: bool) -> ModelInfo:
    """The model's facts, with its weights file (resolved), the file's sha256 and whether it
    is the shipped model's."""

    cfg = model.config
    fam = model.family
    groups: dict[str, int] = {}
    for name, arr in model.params.items():  # by the names the family's file gives them
        group = re.sub(r"(^|\.)(h|layers)\.\d+\.", r"\1\2.*.", fam.file_name(name))
        group = group.rsplit(".", 1)[0]
        groups[group] = groups.get(group, 0) + arr.size
    facts: dict = {
        "n_embd": cfg.n_embd, "n_layer": cfg.n_layer, "n_head": cfg.n_head, "d_k": cfg.d_k,
        "n_inner": cfg.n_inner, "vocab_size": cfg.vocab_size, "n_positions": cfg.n_positions,
        "layer_norm_epsilon": cfg.layer_norm_epsilon, "activation_function": cfg.act,
        "tie_word_embeddings": cfg.tied,
    }
    if cfg.model_type != "gpt2":  # what differs from GPT-2's block, knob by knob
        facts = {"model_type": cfg.model_type, **facts, **architecture(cfg)}
    if cfg.unused:  # read past, as transformers does: shown so nobody wonders where they went
        facts["unused"] = list(cfg.unused)
    about = getattr(model, "about", None)
    return ModelInfo(facts, groups, sum(a.size for a in model.params.values()), weights_file,
                     sha256, {"vocab_size": model.tokenizer.vocab_size,
                              "special_tokens": model.tokenizer.special_tokens,
                              "stop_ids": list(model.tokenizer.stop_ids)},
                     shipped, about, tensor_groups(about["tensors"]) if about else None)
