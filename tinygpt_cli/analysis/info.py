"""What `info` reports about a weights folder: its sizes, parameter counts per group, the
weights file with its sha256, and the tokenizer."""

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
    tokenizer: dict  # vocab_size, special_tokens


def model_info(model) -> ModelInfo:
    from ..families import family
    from ..files import sha256

    cfg = model.config
    fam = family(cfg.model_type)
    groups: dict[str, int] = {}
    for name, arr in model.params.items():  # by the names the family's file gives them
        group = re.sub(r"^h\.\d+\.", "h.*.", fam.file_name(name)).rsplit(".", 1)[0]
        groups[group] = groups.get(group, 0) + arr.size
    facts: dict = {
        "n_embd": cfg.n_embd, "n_layer": cfg.n_layer, "n_head": cfg.n_head, "d_k": cfg.d_k,
        "n_inner": cfg.n_inner, "vocab_size": cfg.vocab_size, "n_positions": cfg.n_positions,
        "layer_norm_epsilon": cfg.layer_norm_epsilon, "activation_function": "gelu_new",
        "tie_word_embeddings": True,
    }
    if cfg.unused:  # read past, as transformers does: shown so nobody wonders where they went
        facts["unused"] = list(cfg.unused)
    weights_file = model.weights_file.resolve()
    return ModelInfo(facts, groups, sum(a.size for a in model.params.values()), weights_file,
                     sha256(weights_file), {"vocab_size": model.tokenizer.vocab_size,
                                            "special_tokens": model.tokenizer.special_tokens})
