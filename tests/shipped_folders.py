"""Whole folders as the hub ships google/gemma-3-270m(-it) and HuggingFaceTB/SmolLM2-135M
(-Instruct): config.json, generation_config.json, tokenizer_config.json and
special_tokens_map.json key for key as published (their sources in each constant's comment),
a tokenizer.json of the same structure trained small here (shipped_tokenizers.py), random
weights made by transformers and saved in bfloat16 as shipped. Only the sizes are smaller
(blocks, widths, vocabulary), so the tests stay fast; every other key is the hub's.

What the real Gemma 3 files have that a made-up folder would not: the tokenizer's
<image_soft_token> one past the model's last row (262,144 on 262,144 rows), eos ids [1, 106]
in generation_config.json, the chat template in chat_template.jinja (newer uploads) or in
tokenizer_config.json (older ones), `_sliding_window_pattern` beside `layer_types`,
`attn_logit_softcapping: null`, `rope_scaling: null`, `torch_dtype` or `dtype`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import example
from shipped_tokenizers import STORIES

# google/gemma-3-270m config.json (circuit-tracer's tests copy it whole, tests/
# test_attributions_gemma3.py; the 270M's sizes also in Gemma 3's technical report)
GEMMA3_270M_CONFIG = {
    "_sliding_window_pattern": 6, "architectures": ["Gemma3ForCausalLM"],
    "attention_bias": False, "attention_dropout": 0.0, "attn_logit_softcapping": None,
    "bos_token_id": 2, "eos_token_id": 1, "final_logit_softcapping": None, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 640, "initializer_range": 0.02,
    "intermediate_size": 2048,
    "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                    for i in range(18)],
    "max_position_embeddings": 32768, "model_type": "gemma3_text", "num_attention_heads": 4,
    "num_hidden_layers": 18, "num_key_value_heads": 1, "pad_token_id": 0,
    "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0,
    "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": 512,
    "torch_dtype": "bfloat16", "transformers_version": "4.55.0.dev0",
    "use_bidirectional_attention": False, "use_cache": True, "vocab_size": 262144}

# generation_config.json of Gemma 3's instruction-tuned (and 270M) uploads: two ends,
# <eos> and <end_of_turn>, and sampling on by default
GEMMA3_GENERATION = {"bos_token_id": 2, "cache_implementation": "hybrid", "do_sample": True,
                     "eos_token_id": [1, 106], "pad_token_id": 0, "top_k": 64, "top_p": 0.95,
                     "transformers_version": "4.55.0.dev0"}

# Gemma 3's chat template as its tokenizer_config.json / chat_template.jinja ship it
# (images as <start_of_image>, a system turn folded into the first user turn)
GEMMA3_TEMPLATE = (
    "{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n"
    "    {%- endif -%}\n    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/"
    "assistant/...\") }}\n    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n        {%- set role = message['role'] -%}\n    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n            {%- endif -%}\n"
    "        {%- endfor -%}\n    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n    {%- endif -%}\n"
    "    {{ '<end_of_turn>\n' }}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\n'}}\n{%- endif -%}\n")

# Gemma 3's ids below its vocabulary: 0-4 as Gemma's, 5 [multimodal], 6-104 <unused0-98>,
# 105/106 the turn markers; <start_of_image>/<end_of_image> near the end (255999, 256000),
# <image_soft_token> one past the model's last row
GEMMA3_LOW = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "[multimodal]",
              *(f"<unused{i}>" for i in range(99)), "<start_of_turn>", "<end_of_turn>"]
GEMMA3_IMAGE = ["<start_of_image>", "<end_of_image>"]
IMAGE_SOFT = "<image_soft_token>"


def _token(content: str) -> dict:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False}


def gemma3_tokenizer() -> tuple[str, int]:
    """tokenizer.json laid out as Gemma 3's (a BPE with byte fallback, `▁` by a normalizer,
    the Split pre-tokenizer, <bos> by the post-processor, the decoder's Replace, ByteFallback,
    Fuse), and the number of rows of the model it belongs to (its length less the
    <image_soft_token> at the end)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = HFTokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=900, special_tokens=GEMMA3_LOW + byte_tokens,
                                  show_progress=False)
    tok.train_from_iterator(STORIES * 30, trainer)
    tok.add_special_tokens(GEMMA3_IMAGE)
    tok.add_special_tokens([IMAGE_SOFT])
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", 2)])
    doc = json.loads(tok.to_str())
    # the real file lists its own added tokens; the <0xNN> bytes are vocabulary entries
    doc["added_tokens"] = [t for t in doc["added_tokens"] if not t["content"].startswith("<0x")]
    rows = tok.get_vocab_size(with_added_tokens=True) - 1
    assert tok.token_to_id(IMAGE_SOFT) == rows and tok.token_to_id("<end_of_turn>") == 106
    return json.dumps(doc, ensure_ascii=False), rows


def gemma3_tokenizer_config(tokenizer_json: str, template_inside: bool) -> dict:
    """tokenizer_config.json as Gemma 3's: add_bos_token true, add_eos_token false, every added
    token in added_tokens_decoder, the image tokens named, the chat template inside it (older
    uploads) or in chat_template.jinja (newer)."""
    added = json.loads(tokenizer_json)["added_tokens"]
    decoder = {str(t["id"]): {**_token(t["content"]), "special": True} for t in added}
    settings = {
        "add_bos_token": True, "add_eos_token": False, "added_tokens_decoder": decoder,
        "boi_token": "<start_of_image>", "bos_token": "<bos>",
        "clean_up_tokenization_spaces": False, "eoi_token": "<end_of_image>",
        "eos_token": "<eos>", "extra_special_tokens": {
            "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
            "image_token": IMAGE_SOFT},
        "image_token": IMAGE_SOFT, "model_max_length": 1000000000000000019884624838656,
        "pad_token": "<pad>", "padding_side": "left", "processor_class": "Gemma3Processor",
        "sp_model_kwargs": None, "spaces_between_special_tokens": False,
        "tokenizer_class": "GemmaTokenizer", "unk_token": "<unk>",
        "use_default_system_prompt": False}
    if template_inside:
        settings["chat_template"] = GEMMA3_TEMPLATE
    return settings


GEMMA3_SPECIAL_MAP = {"boi_token": "<start_of_image>", "bos_token": _token("<bos>"),
                      "eoi_token": "<end_of_image>", "eos_token": _token("<eos>"),
                      "image_token": IMAGE_SOFT, "pad_token": _token("<pad>"),
                      "unk_token": _token("<unk>")}


def gemma3_folder(folder: Path, blocks: int = 7, template_inside: bool = False,
                  sizes: dict | None = None, seed: int = 0,
                  tokenizer: tuple[str, int] | None = None) -> Path:
    """A Gemma 3 270M(-it) folder as the hub ships it, smaller: `blocks` blocks (the 5:1
    pattern kept), the given sizes (default: a stream of 64 on 4 heads of 32, one key/value
    head, windows of 4 so that a short text passes them), the small tokenizer's rows (or
    `tokenizer`: its tokenizer.json and the model's rows); random weights (norms' w far
    from 0) saved by transformers in bfloat16."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    tokenizer_json, rows = tokenizer or gemma3_tokenizer()
    sizes = sizes or {"hidden_size": 64, "intermediate_size": 96, "head_dim": 32,
                      "query_pre_attn_scalar": 32, "sliding_window": 4}
    config = {**GEMMA3_270M_CONFIG, **sizes, "num_hidden_layers": blocks, "vocab_size": rows,
              "layer_types": GEMMA3_270M_CONFIG["layer_types"][:blocks]}
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.Gemma3TextConfig.from_dict(config))
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.3 if "norm" in name else 0.15)
    model.to(torch.bfloat16).save_pretrained(folder)
    # the hub's files, not transformers 5's rewrite of them (dtype, rope_parameters)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(GEMMA3_GENERATION, indent=2))
    (folder / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(
        json.dumps(gemma3_tokenizer_config(tokenizer_json, template_inside), indent=2),
        encoding="utf-8")
    (folder / "special_tokens_map.json").write_text(json.dumps(GEMMA3_SPECIAL_MAP, indent=2))
    if not template_inside:
        (folder / "chat_template.jinja").write_text(GEMMA3_TEMPLATE, encoding="utf-8")
    return folder


# HuggingFaceTB/SmolLM2-135M-Instruct's config.json (and the base model's differences:
# bos and eos 0, no pad, transformers 4.40.1, no transformers.js_config)
SMOLLM2_INSTRUCT_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 576,
    "initializer_range": 0.041666666666666664, "intermediate_size": 1536,
    "is_llama_config": True, "max_position_embeddings": 8192, "model_type": "llama",
    "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3,
    "pad_token_id": 2, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_interleaved": False,
    "rope_scaling": None, "rope_theta": 100000, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "transformers_version": "4.42.3",
    "transformers.js_config": {"kv_cache_dtype": {"q4f16": "float16", "fp16": "float16"}},
    "use_cache": True, "vocab_size": 49152}
SMOLLM2_BASE_CHANGES = {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": None,
                        "transformers_version": "4.40.1", "transformers.js_config": None}

# the 17 special tokens at ids 0-16 of SmolLM2's (and StarCoder 2's cosmo2) vocabulary
SMOLLM2_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>",
                    "<file_sep>", "<filename>", "<gh_stars>", "<issue_start>",
                    "<issue_comment>", "<issue_closed>", "<jupyter_start>", "<jupyter_text>",
                    "<jupyter_code>", "<jupyter_output>", "<jupyter_script>", "<empty_output>"]


def smollm2_folder(folder: Path, instruct: bool = True, seed: int = 0) -> Path:
    """SmolLM2-135M(-Instruct) as the hub ships it, smaller (2 blocks, a stream of 72 on 9
    heads of 8 on 3 key/value heads; the small byte-level tokenizer's rows)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from shipped_tokenizers import SMOLLM2_TEMPLATE, smollm2
    from tokenizers import Tokenizer as HFTokenizer

    tokenizer_json, _ = smollm2(SMOLLM2_SPECIALS)
    rows = HFTokenizer.from_str(tokenizer_json).get_vocab_size(with_added_tokens=True)
    config = {**SMOLLM2_INSTRUCT_CONFIG, "hidden_size": 72, "intermediate_size": 96,
              "num_hidden_layers": 2, "vocab_size": rows}
    if not instruct:
        config = {k: v for k, v in {**config, **SMOLLM2_BASE_CHANGES}.items()
                  if v is not None or k == "pad_token_id"}
        config.pop("pad_token_id")
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.LlamaConfig.from_dict(config))
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.15)
    model.to(torch.bfloat16).save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    end = 2 if instruct else 0
    generation = {"bos_token_id": 1 if instruct else 0, "eos_token_id": end,
                  **({"pad_token_id": 2} if instruct else {}),
                  "transformers_version": config["transformers_version"]}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2))
    (folder / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    decoder = {str(i): {**_token(t), "special": True} for i, t in enumerate(SMOLLM2_SPECIALS)}
    names = (("<|im_start|>", "<|im_end|>", "<|im_end|>") if instruct
             else ("<|endoftext|>", "<|endoftext|>", None))
    settings = {"add_prefix_space": False, "added_tokens_decoder": decoder,
                "additional_special_tokens": (["<|im_start|>", "<|im_end|>"] if instruct
                                              else SMOLLM2_SPECIALS),
                "bos_token": names[0], "clean_up_tokenization_spaces": False,
                "eos_token": names[1], "model_max_length": 8192,
                **({"pad_token": names[2]} if instruct else {}),
                "tokenizer_class": "GPT2Tokenizer", "unk_token": "<|endoftext|>",
                "vocab_size": 49152}
    if instruct:
        settings["chat_template"] = SMOLLM2_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(settings, indent=2),
                                                  encoding="utf-8")
    special_map = {"additional_special_tokens": settings["additional_special_tokens"],
                   "bos_token": _token(names[0]), "eos_token": _token(names[1]),
                   "unk_token": _token("<|endoftext|>"),
                   **({"pad_token": _token(names[2])} if instruct else {})}
    (folder / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2))
    return folder


def gemma3_gguf(folder: Path, out: Path) -> Path:
    """The folder as llama.cpp's convert_hf_to_gguf.py writes a Gemma 3 (its Gemma3Model,
    the SentencePiece path the hub's tokenizer.model takes): the tokens of the model's rows
    alone (the <image_soft_token> past them is left out), CONTROL for the special tokens,
    UNKNOWN for <unk>, BYTE for <0xNN>; bos, eos, unk and pad ids, add_bos_token true,
    add_eos_token false, add_space_prefix false, the chat template; no eot id (llama.cpp
    finds <end_of_turn> by its text). Tensors by examples/make_gguf.py (1 added to every
    norm weight)."""

    make_gguf = example("make_gguf")
    tokenizer = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    rows = json.loads((folder / "config.json").read_text())["vocab_size"]
    by_id = {i: t for t, i in tokenizer["model"]["vocab"].items()}
    special = {t["id"]: t["content"] for t in tokenizer["added_tokens"]}
    by_id.update(special)
    template = (folder / "chat_template.jinja").read_text(encoding="utf-8")

    def vocabulary(w, _cfg) -> None:
        tokens = [by_id[i] for i in range(rows)]
        types = [2 if t == "<unk>" else 3 if i in special else
                 6 if t.startswith("<0x") and len(t) == 6 else 1 for i, t in enumerate(tokens)]
        gemma_tokenizer_keys(w, tokens, [-float(i) for i in range(rows)], types)
        w.add_add_eos_token(False)
        w.add_chat_template(template)

    out.parent.mkdir(parents=True, exist_ok=True)
    make_gguf.write(folder, out, "F32", vocab=vocabulary)
    return out


def gemma_tokenizer_keys(w, tokens: list[str], scores: list[float], types: list[int]) -> None:
    """The tokenizer.ggml.* keys llama.cpp's converter writes for a Gemma 3 (its
    Gemma3Model.set_vocab: SentencePiece's "llama" model, <pad> 0, <eos> 1, <bos> 2 added,
    <unk> 3, no space prefix), given the vocabulary's tokens, scores and token types."""
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(False)
