"""Config variants read as transformers 5 reads them (issue 53): rope_scaling beside
rope_parameters (transformers lets rope_scaling replace them whole), a top-level
partial_rotary_factor, GPT-NeoX's rotary_pct default, Qwen3's head_dim default, the
tie_word_embeddings defaults. Each variant's config.json is read by transformers (its
effective settings) and by tinygpt (Config.from_dict): the same settings, or a refusal naming
the key; where tinygpt computes it, the logits of a small random model match transformers'."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tinygpt_cli.storage.locations import SHIPPED
from tinygpt_cli.transformer.config import Config
from tinygpt_cli.transformer.families import config_from_dict
from tinygpt_cli.transformer.folder import load_model
from tinygpt_cli.transformer.model import forward

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

IDS = [5, 300, 17, 900, 42, 8, 1000, 77, 3, 64, 5, 300, 12, 19, 700, 2]
SIZES = {"vocab_size": 4096, "hidden_size": 24, "intermediate_size": 40,
         "num_hidden_layers": 2, "num_attention_heads": 6, "max_position_embeddings": 64}
LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **SIZES,
         "num_key_value_heads": 2}
NEOX = {"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"], **SIZES,
        "num_attention_heads": 3}
DEFAULT_500K = {"rope_type": "default", "rope_theta": 500000.0}

# name: (config.json, what tinygpt does: None computes, else words of its refusal)
VARIANTS = {
    "llama rope_parameters and rope_scaling linear": (
        {**LLAMA, "rope_parameters": DEFAULT_500K,
         "rope_scaling": {"rope_type": "linear", "factor": 4.0}}, None),
    "llama rope_theta and rope_scaling linear (old style)": (
        {**LLAMA, "rope_theta": 1000.0, "rope_scaling": {"type": "linear", "factor": 2.0}},
        None),
    "llama rope_parameters and rope_scaling yarn": (
        {**LLAMA, "rope_parameters": DEFAULT_500K,
         "rope_scaling": {"type": "yarn", "factor": 4.0}},
        "rope scaling 'yarn' is not implemented"),
    "llama llama3 without its original context": (
        {**LLAMA, "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0,
                                      "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0}}, None),
    "llama top-level partial_rotary_factor": (
        {**LLAMA, "rope_parameters": DEFAULT_500K, "partial_rotary_factor": 0.5},
        "partial_rotary_factor 0.5 is not implemented for llama"),
    "llama partial_rotary_factor inside rope_parameters": (
        {**LLAMA, "rope_parameters": {**DEFAULT_500K, "partial_rotary_factor": 0.5}},
        "partial_rotary_factor 0.5 is not implemented for llama"),
    "llama no tie_word_embeddings": ({**LLAMA}, None),
    "qwen3 without head_dim": (
        {**LLAMA, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}, None),
    "qwen2 without head_dim": (
        {**LLAMA, "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}, None),
    "gpt_neox without rotary_pct": ({**NEOX}, None),
    "gpt_neox top-level partial_rotary_factor": (
        {**NEOX, "partial_rotary_factor": 0.5, "rotary_emb_base": 500.0}, None),
    "gpt_neox rope_scaling linear": (
        {**NEOX, "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
        "linear rope scaling is not implemented for gpt_neox"),
    "gpt2 untied": ({"model_type": "gpt2", "n_embd": 24, "n_layer": 2, "n_head": 2,
                     "vocab_size": 4096, "tie_word_embeddings": False},
                    "tie_word_embeddings False is not supported"),
}


def hf_config(d: dict, tmp_path):
    """transformers' reading of the config.json `d` (AutoConfig.from_pretrained)."""
    folder = tmp_path / "cfg"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(d))
    return transformers.AutoConfig.from_pretrained(folder)


def effective(c) -> dict:
    """What transformers computes with: head size, turned numbers, base, scaling, tied."""
    if c.model_type == "gpt2":
        return {"tied": c.tie_word_embeddings}
    rp = c.rope_parameters
    head = (c.hidden_size // c.num_attention_heads if c.model_type == "gpt_neox"
            else getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)
    kind = rp["rope_type"]
    scaling = () if kind == "default" else (float(rp["factor"]),) if kind == "linear" else \
        tuple(float(rp[k]) for k in ("factor", "low_freq_factor", "high_freq_factor",
                                     "original_max_position_embeddings")) \
        if kind == "llama3" else None
    return {"head": head, "rotary": int(head * rp.get("partial_rotary_factor", 1.0)),
            "base": float(rp["rope_theta"]), "scaling": scaling, "kind": kind,
            "tied": c.tie_word_embeddings}


def ours(config: Config) -> dict:
    if config.model_type == "gpt2":
        return {"tied": config.tied}
    kind = {0: "default", 1: "linear", 4: "llama3"}[len(config.rope_scaling)]
    return {"head": config.d_k, "rotary": config.rotary, "base": config.rotary_base,
            "scaling": tuple(map(float, config.rope_scaling)), "kind": kind,
            "tied": config.tied}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_each_variant_is_read_as_transformers_reads_it_or_refused_by_name(name, tmp_path):
    d, refusal = VARIANTS[name]
    want = effective(hf_config(d, tmp_path))
    if refusal is not None:  # what transformers computes and tinygpt does not
        assert want == {"tied": False} or want["kind"] in ("yarn", "linear") \
            or want["rotary"] == want["head"] // 2
        with pytest.raises(ValueError) as e:
            config_from_dict(d)
        assert refusal in str(e.value)
        return
    assert ours(config_from_dict(d)) == want


COMPUTED = [n for n, (_, refusal) in VARIANTS.items() if refusal is None
            and VARIANTS[n][0]["model_type"] != "gpt2"]


@pytest.mark.parametrize("name", COMPUTED)
def test_the_logits_of_each_computed_variant_match_transformers(name, tmp_path):
    d, _ = VARIANTS[name]
    torch.manual_seed(len(name))
    model = transformers.AutoModelForCausalLM.from_config(hf_config(d, tmp_path),
                                                          attn_implementation="eager")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.15)
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(d))  # the variant, not transformers' rewrite
    shutil.copyfile(SHIPPED / "tokenizer.json", folder / "tokenizer.json")
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        want = hf(torch.tensor([IDS])).logits[0].numpy().astype(np.float64)
    m = load_model(folder)
    got = forward(m.params, m.config, np.array(IDS)).astype(np.float64)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err <= 1e-5, f"{name}: {err:.2e}"
