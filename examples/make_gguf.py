"""Write a Hugging Face weights folder (config.json, model.safetensors, tokenizer.json: GPT-2,
GPT-NeoX, Llama, Qwen2, Qwen3, Gemma 3) as a GGUF file, laid out as llama.cpp's
convert_hf_to_gguf.py lays it out: llama.cpp's tensor names (gguf-py's own name map), its
metadata keys, Conv1D matrices transposed (GPT-2), the fused q/k/v rows regrouped
(GPT-NeoX), each head's q and k rows reordered for its rotary kernel (Llama), 1 added to
each norm weight (Gemma 3: the file holds the scale 1 + w), the vocabulary as
`tokenizer.ggml.*`; every matrix quantized with the gguf package's own quantizer.

It reads the folder with NumPy and json alone, never with tinygpt, so that the tests
that read its files back (tests/test_gguf.py) compare tinygpt's reader with an independent
writer. Needs the gguf package (pip install 'tinygpt-cli[gguf]').

    python examples/make_gguf.py weights/llama /tmp/llama-q8_0.gguf --type Q8_0
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

ARCH = {"gpt2": "gpt2", "gpt_neox": "gptneox", "llama": "llama", "qwen2": "qwen2",
        "qwen3": "qwen3", "gemma3_text": "gemma3"}
CONTROL, USER_DEFINED, UNUSED, NORMAL = 3, 4, 5, 1  # gguf.TokenType


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's reordering of a Llama q or k matrix's rows within each head (its
    converter's `permute`): rotate_half's two halves interleaved, as its kernel pairs them."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]) \
        .swapaxes(1, 2).reshape(w.shape)


def llama_cpp_tensors(cfg: dict, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The folder's tensors as llama.cpp's converter hands them to the writer: renamed by
    gguf-py's TensorNameMap, with each family's changes."""
    import gguf

    kind = cfg.get("model_type", "gpt2")
    blocks = cfg.get("num_hidden_layers", cfg.get("n_layer"))
    names = gguf.get_tensor_name_map(_arch_enum(gguf, ARCH[kind]), blocks)
    out = {}
    for name, w in tensors.items():
        if name.endswith((".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq",
                          ".attention.bias", ".attention.masked_bias")):
            continue
        if kind == "gpt2" and name.endswith((".c_attn.weight", ".c_proj.weight",
                                              ".c_fc.weight")):
            w = w.T
        if kind == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
            w = permute(w, cfg["num_attention_heads"])
        if kind == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
            w = permute(w, cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
        if kind == "gpt_neox" and "query_key_value" in name:
            h = cfg["num_attention_heads"]
            d = cfg["hidden_size"]
            w = w.reshape(h, 3, d // h, *w.shape[1:]).swapaxes(0, 1).reshape(w.shape)
        if kind == "gemma3_text" and name.endswith("norm.weight"):
            w = w + np.float32(1)  # the converter's Gemma3Model.norm_shift
        new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise SystemExit(f"no llama.cpp name for tensor {name}")
        out[new] = np.ascontiguousarray(w, dtype=np.float32)
    return out


def _arch_enum(gguf, name: str):
    for a in gguf.MODEL_ARCH:
        if gguf.MODEL_ARCH_NAMES[a] == name:
            return a
    raise SystemExit(f"gguf knows no architecture {name}")


def metadata(w, cfg: dict) -> None:
    """The hyperparameters, under the keys the converter writes for each family."""
    kind = cfg.get("model_type", "gpt2")
    if kind == "gpt2":
        w.add_block_count(cfg["n_layer"])
        w.add_context_length(cfg.get("n_ctx", cfg.get("n_positions")))
        w.add_embedding_length(cfg["n_embd"])
        w.add_feed_forward_length(cfg.get("n_inner") or 4 * cfg["n_embd"])  # GPT2Config's
        w.add_head_count(cfg["n_head"])
        w.add_layer_norm_eps(cfg.get("layer_norm_epsilon", 1e-5))
        return
    if kind == "gemma3_text":
        _gemma3(w, cfg)
        return
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    head = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    if kind == "gpt_neox":
        w.add_rope_dimension_count(int(cfg.get("rotary_pct", 0.25) * head))
        w.add_parallel_residual(cfg.get("use_parallel_residual", True))
        w.add_layer_norm_eps(cfg.get("layer_norm_eps", 1e-5))
        rope = cfg.get("rope_parameters") or {}
        w.add_rope_freq_base(float(rope.get("rope_theta", cfg.get("rotary_emb_base", 10000))))
        return
    if cfg.get("num_key_value_heads") is not None:
        w.add_head_count_kv(cfg["num_key_value_heads"])
    rope = cfg.get("rope_parameters") or {}
    w.add_rope_freq_base(float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))))
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    if cfg.get("head_dim") is not None:
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    if kind == "llama":
        w.add_vocab_size(cfg["vocab_size"])
        w.add_rope_dimension_count(head)


def _gemma3(w, cfg: dict) -> None:
    """The keys the converter's Gemma3Model writes (its defaults for the ones a config.json
    leaves out); no rotary base for the local blocks (llama.cpp takes 10,000) and no
    query_pre_attn_scalar (llama.cpp scales by 1/sqrt(head_dim))."""
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_context_length(cfg.get("max_position_embeddings", 131072))
    w.add_head_count(cfg.get("num_attention_heads", 8))
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    w.add_key_length(cfg.get("head_dim", 256))
    w.add_value_length(cfg.get("head_dim", 256))
    rope = cfg.get("rope_parameters") or {}
    rope = rope.get("full_attention", rope)
    w.add_rope_freq_base(float(rope.get("rope_theta", cfg.get("rope_theta", 1_000_000.0))))
    if cfg.get("final_logit_softcapping"):
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    if cfg.get("sliding_window_pattern") != 1:
        w.add_sliding_window(cfg["sliding_window"])
    w.add_head_count_kv(cfg.get("num_key_value_heads", 4))


def vocabulary(w, cfg: dict, tokenizer: dict, pre: str) -> None:
    """A byte-level BPE tokenizer.json as the converter's _set_vocab_gpt2 writes it: the
    tokens in id order (ids the tokenizer lacks as [PAD i], unused), their types, the merges."""
    vocab = {**tokenizer["model"]["vocab"]}
    added = {t["id"]: t for t in tokenizer.get("added_tokens", [])}
    for i, t in added.items():
        vocab[t["content"]] = i
    by_id = {i: t for t, i in vocab.items()}
    tokens, types = [], []
    for i in range(cfg["vocab_size"]):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
        else:
            tokens.append(by_id[i])
            types.append((CONTROL if added[i].get("special") else USER_DEFINED)
                         if i in added else NORMAL)
    merges = tokenizer["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    for key, add in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id)):
        if isinstance(cfg.get(key), int):
            add(cfg[key])


def chat_template(folder: Path) -> str | None:
    """The folder's chat template as gguf-py's SpecialVocab finds it: chat_template.jinja,
    else tokenizer_config.json's chat_template."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    settings = folder / "tokenizer_config.json"
    found = json.loads(settings.read_text(encoding="utf-8")).get("chat_template") \
        if settings.is_file() else None
    return found if isinstance(found, str) else None


def tensors_of(path: Path) -> dict[str, np.ndarray]:
    """A safetensors file's tensors in float32. The hub ships most models in bfloat16, which
    NumPy has no type for (safetensors.numpy refuses it): those are read from the header and
    widened here (a bfloat16 is the top half of a float32)."""
    import struct

    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    kinds = {"F32": np.float32, "F16": np.float16, "F64": np.float64}
    out = {}
    for name, t in header.items():
        start, end = t["data_offsets"]
        data = raw[8 + n + start:8 + n + end]
        if t["dtype"] == "BF16":
            a = (np.frombuffer(data, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            a = np.frombuffer(data, kinds[t["dtype"]]).astype(np.float32)
        out[name] = a.reshape(t["shape"])
    return out


def quantized(name: str, a: np.ndarray, kind: str):
    """(data, type): matrices in `kind` where their rows are whole blocks of it, else F32;
    vectors (norms, biases) always F32, as llama.cpp's quantize leaves them."""
    import gguf

    qtype = gguf.GGMLQuantizationType[kind]
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if a.ndim < 2 or a.shape[-1] % block or qtype == gguf.GGMLQuantizationType.F32:
        return a.astype(np.float32), gguf.GGMLQuantizationType.F32
    return gguf.quants.quantize(a, qtype), qtype


def write(folder: Path, out: Path, kind: str = "F32", pre: str = "gpt-2",
          types: dict[str, str] | None = None, name: str | None = None,
          quantize=quantized, vocab=None, source_url: str | None = None) -> None:
    """folder -> out.gguf; `types`: a type for some tensors by their llama.cpp name;
    `quantize(name, array, type) -> (data, type)` (the tests give K-quant blocks of their own,
    which gguf dequantizes but cannot make); `vocab(writer, config)`: the tokenizer's
    metadata written otherwise (a SentencePiece one)."""
    import gguf

    cfg = json.loads((folder / "config.json").read_text())
    tokenizer = json.loads((folder / "tokenizer.json").read_text()) if vocab is None else None
    tensors = tensors_of(folder / "model.safetensors")
    mapped = llama_cpp_tensors(cfg, tensors)
    w = gguf.GGUFWriter(str(out), ARCH[cfg.get("model_type", "gpt2")])
    w.add_name(name or folder.resolve().name)
    if source_url:
        w.add_string("general.source.url", source_url)
    metadata(w, cfg)
    if vocab is None:
        vocabulary(w, cfg, tokenizer, pre)
        template = chat_template(folder)
        if template is not None:  # the converter's SpecialVocab writes the folder's
            w.add_chat_template(template)
    else:
        vocab(w, cfg)
    ftype = getattr(gguf.LlamaFileType, "ALL_F32" if kind == "F32" else f"MOSTLY_{kind}", None)
    if ftype is not None:  # the K-quants' name a mix (Q4_K_M): the tests' files say none
        w.add_file_type(ftype)
    if kind not in ("F32", "F16", "BF16"):
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for tname, a in mapped.items():
        data, qtype = quantize(tname, a, (types or {}).get(tname, kind))
        w.add_tensor(tname, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--type", default="Q8_0",
                   help="F32, F16, BF16, Q8_0, Q5_1, Q5_0, Q4_1, Q4_0 (what gguf quantizes)")
    p.add_argument("--pre", default="gpt-2", help="tokenizer.ggml.pre (the word splitter)")
    p.add_argument("--source-url", help="general.source.url: where the weights came from")
    a = p.parse_args()
    write(a.folder, a.out, a.type, a.pre, source_url=a.source_url)
    print(a.out)


if __name__ == "__main__":
    main()
