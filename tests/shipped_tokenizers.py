"""Tokenizers laid out as real models ship them, built here with the `tokenizers` library (no
download) and saved with a tokenizer_config.json into small random Llama folders:

- smollm2: byte-level BPE, digits split apart, lacking 19 bytes as SmolLM2-135M-Instruct does
  (six control characters, and 0xC0, 0xC1, 0xF5-0xFF, which no UTF-8 text holds), ChatML
  special tokens, no BOS added;
- gemma: SentencePiece-style BPE with byte fallback, spaces written `▁` by a normalizer,
  Gemma's Split, a TemplateProcessing post-processor adding <bos>, add_bos_token true;
- llama2: the same with a Metaspace pre-tokenizer (prepend "first", as transformers writes
  Llama 2's) and <s>;
- gemma_no_bos: gemma's files with tokenizer_config.json's add_bos_token false, which
  overrides the post-processor in transformers;
- llama3, qwen2 (test_tokenizer_families' builders), gpt2 (the shipped tokenizer).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from tinygpt_cli.jobs.train.loop import arch_config
from tinygpt_cli.storage.locations import SHIPPED
from tinygpt_cli.transformer.families import llama, save_config
from tinygpt_cli.transformer.folder import save_params
from tinygpt_cli.transformer.model import init_params
from tinygpt_cli.transformer.tokenizer import _bytes_to_unicode

STORIES = ["Once upon a time, Lily wanted to play with her ball. She was 3 years old!",
           "Tom's dog ran 1234 metres.\nThey didn't stop; it's fun.\n\n  Mama said: \"Yes\".",
           "Café crème, naïve façade, 東京, 🐻 and 🙂 — the end.",
           "def square(x):\n    return x ** 2  # the square\n\tprint(square(3))\n",
           "The user asked the assistant a question, and the assistant answered it."]

# bytes SmolLM2-135M's vocabulary has no token for
SMOL_MISSING = (0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0xC0, 0xC1, *range(0xF5, 0x100))

CHATML = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
GEMMA = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
LLAMA2 = ["<unk>", "<s>", "</s>"]

# the texts every family's ids are checked on
HARD = ["Hello world", " leading space", "trailing space ", "double  space", "  two leading",
        "line\nbreak\n\nparagraph\n", "\ttab\tstop", "Café crème naïve façade",
        "e\u0301 decomposed", "東京 🐻 🙂 👩\u200d👩\u200d👧", "a\x07bell",
        "def f(x):\n    return x**2  # square\n", "1234567 3.14",
        "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
        "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
        "<s>[INST] hi [/INST]", "<bos>twice", "ſ ﬁ ǅ Ⅻ ①"]


def smollm2(specials: list[str] = CHATML) -> tuple[str, dict]:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    lacking = {_bytes_to_unicode()[b] for b in SMOL_MISSING}
    alphabet = [c for c in pre_tokenizers.ByteLevel.alphabet() if c not in lacking]
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=specials,
                                  initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(STORIES * 30, trainer)
    settings = {"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": False,
                "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
                "unk_token": "<|endoftext|>", "pad_token": "<|im_end|>"}
    return tok.to_str(), settings


def sentencepiece(kind: str) -> tuple[str, dict]:
    """A BPE with byte fallback whose 256 <0xNN> tokens are ordinary vocabulary entries, as
    the hub's Gemma and Llama 2 files have them."""
    specials = GEMMA if kind.startswith("gemma") else LLAMA2
    tok = HFTokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    if kind.startswith("gemma"):
        tok.normalizer = normalizers.Replace(" ", "\u2581")
        tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
        tail = []
    elif kind == "llama2_legacy":  # Llama 2's own file: a normalizer prepends and replaces
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                               normalizers.Replace(" ", "\u2581")])
        tail = [decoders.Strip(" ", 1, 0)]
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581",
                                                     prepend_scheme="first", split=False)
        tail = [decoders.Strip(" ", 1, 0)]
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), *tail])
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=800, special_tokens=specials + byte_tokens,
                                  show_progress=False)
    tok.train_from_iterator(STORIES * 30, trainer)
    bos = specials[2] if kind.startswith("gemma") else "<s>"
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))])
    doc = json.loads(tok.to_str())
    doc["added_tokens"] = [t for t in doc["added_tokens"] if not t["content"].startswith("<0x")]
    if kind.startswith("gemma"):
        settings = {"tokenizer_class": "GemmaTokenizer", "bos_token": "<bos>",
                    "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
                    "add_bos_token": kind == "gemma", "add_eos_token": False}
    else:
        settings = {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
                    "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False,
                    "legacy": kind == "llama2_legacy"}
    return json.dumps(doc, ensure_ascii=False), settings


def byte_level(kind: str) -> tuple[str, dict]:
    if kind == "gpt2":
        return ((SHIPPED / "tokenizer.json").read_text(encoding="utf-8"),
                {"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>",
                 "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"})
    from test_tokenizer_families import built

    cls = "PreTrainedTokenizerFast" if kind == "llama3" else "Qwen2Tokenizer"
    end = "<|end_of_text|>" if kind == "llama3" else "<|endoftext|>"
    return built(kind).to_str(), {"tokenizer_class": cls, "eos_token": end,
                                  **({"bos_token": "<|begin_of_text|>"} if kind == "llama3"
                                     else {})}


FAMILIES = ("smollm2", "gemma", "gemma_no_bos", "llama2", "llama2_legacy", "llama3", "qwen2",
            "gpt2")


def tokenizer_files(kind: str) -> tuple[str, dict]:
    if kind == "smollm2":
        return smollm2()
    if kind in ("gemma", "gemma_no_bos", "llama2", "llama2_legacy"):
        return sentencepiece(kind)
    return byte_level(kind)


def model_folder(folder: Path, tokenizer_json: str, settings: dict | None,
                 generation: dict | None = None, eos: int | None = None) -> Path:
    """A random Llama folder (2 blocks of 16) with these tokenizer files."""
    folder.mkdir(parents=True, exist_ok=True)
    n = HFTokenizer.from_str(tokenizer_json).get_vocab_size(with_added_tokens=True)
    config = arch_config("llama", n_embd=16, n_layer=2, n_head=4, n_inner=24, vocab_size=n,
                         n_positions=128)
    hf = {**llama.config_to_hf(config), "eos_token_id": 0 if eos is None else eos,
          "bos_token_id": 0}
    config = llama.config_from_hf(hf)
    save_params(init_params(config, np.random.default_rng(1)), folder / "model.safetensors",
                config)
    save_config(config, folder / "config.json")
    (folder / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    if settings is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(settings), encoding="utf-8")
    if generation is not None:
        (folder / "generation_config.json").write_text(json.dumps(generation),
                                                       encoding="utf-8")
    return folder


# SmolLM2-135M-Instruct's chat template (ChatML with a default system turn)
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}")

# Gemma's (2 and 3, text): <bos> written by the template, roles alternating, "model" turns
GEMMA_TEMPLATE = (
    "{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n    {%- set first_user_prefix"
    " = messages[0]['content'] + '\n\n' -%}\n    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n    {%- set first_user_prefix = \"\" -%}\n    {%- set loop_messages = "
    "messages -%}\n{%- endif -%}\n{%- for message in loop_messages -%}\n    {%- if (message"
    "['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n        {{ raise_exception(\"Conversa"
    "tion roles must alternate user/assistant/user/assistant/...\") }}\n    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n        {%- set role = message['role'] -%}\n    {%- endif -%}\n    {{ "
    "'<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n    "
    "{%- if message['content'] is string -%}\n        {{ message['content'] | trim }}\n    "
    "{%- else -%}\n        {{ raise_exception(\"Invalid content type\") }}\n    {%- endif -%}"
    "\n    {{ '<end_of_turn>\n' }}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n    "
    "{{'<start_of_turn>model\n'}}\n{%- endif -%}\n")
