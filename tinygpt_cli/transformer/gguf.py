"""A GGUF file (llama.cpp's format) read as a model: its metadata into a Config, its tensors
dequantized into the canonical parameters, its vocabulary into a tokenizer (gguf_vocab.py).
The file itself (its header walked and checked, each tensor dequantized by llama.cpp's `gguf`
package) is storage's: storage/gguf_file.py.

A GGUF is one more file layout of the families tinygpt knows: its tensor names
(`blk.3.attn_q.weight`) and orientations are mapped straight to the canonical parameters
here, as families/ does for the Hugging Face layouts. Every matrix is kept (out, in), as
nn.Linear keeps it, whatever the family (llama.cpp's converter transposes GPT-2's Conv1D),
and is transposed into the canonical (in, out); GPT-NeoX's fused q, k, v rows are already
q, then k, then v (the converter regroups them), and Llama's q and k rows are reordered
within each head for llama.cpp's rotary kernel, which `_unpermuted` undoes. Gemma 3's norm
weights are stored as the scale itself, 1 + w (the converter adds the 1, its
Gemma3Model.norm_shift), which is the canonical scale: read as they are.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..errors import WeightsError
from ..escapes import shown
from ..storage.gguf_file import Layout, TensorEntry, dequantized, release
from ..storage.pages import weight_pages
from .config import Config
from .schema import param_shapes

# general.architecture -> the family (config.json's model_type) it is
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gpt2": "gpt2",
                 "gptneox": "gpt_neox", "gemma3": "gemma3_text"}


# named, so that the refusal says why rather than "unknown"
NOT_YET = {"gemma3n": "Gemma 3n's block (per-layer inputs, AltUp) is not in tinygpt",
           "gemma2": "Gemma 2's block (logit soft-capping) is not in tinygpt"}


CHUNK_BYTES = 8 << 20  # a tensor is dequantized this many float32 bytes of rows at a time


def architecture(meta: dict, path: Path) -> str:
    """The family of general.architecture; anything else refused by name."""
    arch = meta.get("general.architecture")
    if arch in NOT_YET:
        raise WeightsError(f"{path}: architecture {arch} is not read yet: {NOT_YET[arch]}")
    if arch not in ARCHITECTURES:
        raise WeightsError(f"{path}: architecture {shown(arch)} is not a family tinygpt reads "
                           f"(it reads {', '.join(ARCHITECTURES)})")
    return arch


def hf_config(arch: str, meta: dict, names: set[str], vocab: int) -> dict:
    """The metadata as the config.json of the family (the keys transformers' GGUF loader
    reads), for the family's own config_from_hf to check and read."""
    def m(key, default=None):
        return meta.get(f"{arch}.{key}", default)

    if m("rope.scaling.type", "none") not in ("none", None):
        raise ValueError(f"config: rope scaling {shown(m('rope.scaling.type'))} is not "
                         "implemented (only unscaled rotary positions)")
    if "rope_freqs.weight" in names:
        raise ValueError("config: per-frequency rope factors (rope_freqs.weight, Llama 3's "
                         "scaling) are not implemented for GGUF files")
    said = m("vocab_size")
    if said is not None and said != vocab:
        raise ValueError(f"config: {arch}.vocab_size is {shown(said)} but the token table "
                         f"token_embd.weight has {vocab:,} rows")
    ids = {k: meta[f"tokenizer.ggml.{g}_token_id"] for k, g in (("bos_token_id", "bos"),
                                                                ("eos_token_id", "eos"))
           if f"tokenizer.ggml.{g}_token_id" in meta}
    ctx = m("context_length")
    if arch == "gemma3":
        return _gemma3_config(m, names, vocab, ids)
    if arch == "gpt2":
        d = dict(model_type="gpt2", n_embd=m("embedding_length"), n_layer=m("block_count"),
                 n_head=m("attention.head_count"), n_inner=m("feed_forward_length"),
                 vocab_size=vocab, n_positions=ctx,
                 layer_norm_epsilon=m("attention.layer_norm_epsilon", 1e-5), **ids)
        return {k: v for k, v in d.items() if v is not None}
    d = dict(model_type=ARCHITECTURES[arch], hidden_size=m("embedding_length"),
             num_hidden_layers=m("block_count"), num_attention_heads=m("attention.head_count"),
             intermediate_size=m("feed_forward_length"), vocab_size=vocab,
             max_position_embeddings=ctx, tie_word_embeddings="output.weight" not in names,
             **ids)
    heads, width = d["num_attention_heads"], d["hidden_size"]
    head = m("attention.key_length")
    if head is None and isinstance(heads, int) and isinstance(width, int) and heads > 0:
        head = width // heads
    rot = m("rope.dimension_count", head)
    if arch == "gptneox":
        d.update(layer_norm_eps=m("attention.layer_norm_epsilon", 1e-5),
                 rotary_emb_base=m("rope.freq_base", 10000.0),
                 rotary_pct=rot / head if isinstance(rot, int) and head else rot,
                 use_parallel_residual=m("use_parallel_residual", True))
    else:
        if rot != head:
            raise ValueError(f"config: rope.dimension_count {shown(rot)} turns part of a "
                             f"{shown(head)}-number head; {arch} turns it whole")
        d.update(num_key_value_heads=m("attention.head_count_kv", heads),
                 rms_norm_eps=m("attention.layer_norm_rms_epsilon", 1e-6),
                 rope_theta=m("rope.freq_base", 10000.0), head_dim=head)
    return {k: v for k, v in d.items() if v is not None}


def _gemma3_config(m, names: set[str], vocab: int, ids: dict) -> dict:
    """Gemma 3's metadata as Gemma3TextConfig's keys, read as llama.cpp reads them
    (src/models/gemma3.cpp; the converter's Gemma3Model writes them): the local blocks
    from attention.sliding_window_pattern (a flag per block, or every n-th block full; 6
    without the key), none without attention.sliding_window; their rotary base from
    rope.freq_base_swa (10,000 without it), the full blocks' from rope.freq_base; scores
    scaled by 1/sqrt(head_dim), but by 1/sqrt(d / heads) for the 62-block model (27B), as
    llama.cpp does: the file has no query_pre_attn_scalar; the embeddings times sqrt(d) in
    float32 (sqrtf)."""
    width, heads, blocks = m("embedding_length"), m("attention.head_count"), m("block_count")
    for key, value in (("embedding_length", width), ("attention.head_count", heads),
                       ("block_count", blocks)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"config: gemma3.{key} must be a whole number from 1, got "
                             f"{shown(value)}")
    head = m("attention.key_length", width // heads)
    if not isinstance(head, int) or isinstance(head, bool) or head < 1:
        raise ValueError(f"config: gemma3.attention.key_length must be a whole number from 1, "
                         f"got {shown(head)}")
    if m("attention.value_length", head) != head:
        raise ValueError(f"config: attention.value_length {shown(m('attention.value_length'))}"
                         f" differs from attention.key_length {shown(head)}; Gemma 3's are one")
    if m("rope.dimension_count", head) != head:
        raise ValueError(f"config: rope.dimension_count {shown(m('rope.dimension_count'))} "
                         f"turns part of a {shown(head)}-number head; gemma3 turns it whole")
    window = m("attention.sliding_window", 0)
    kinds = ["full_attention"] * blocks
    if isinstance(window, int) and not isinstance(window, bool) and window > 0:
        local = _local_blocks(m("attention.sliding_window_pattern", 6), blocks)
        kinds = ["sliding_attention" if x else "full_attention" for x in local]
    elif window not in (0, None):
        raise ValueError(f"config: gemma3.attention.sliding_window must be a whole number, "
                         f"got {shown(window)}")
    d = dict(model_type="gemma3_text", hidden_size=width, num_hidden_layers=blocks,
             num_attention_heads=heads, num_key_value_heads=m("attention.head_count_kv", heads),
             intermediate_size=m("feed_forward_length"), vocab_size=vocab,
             max_position_embeddings=m("context_length"), head_dim=head,
             rms_norm_eps=m("attention.layer_norm_rms_epsilon", 1e-6),
             tie_word_embeddings="output.weight" not in names, layer_types=kinds,
             sliding_window=window or None,
             query_pre_attn_scalar=width // heads if blocks == 62 else head,
             rope_parameters={
                 "full_attention": {"rope_type": "default",
                                    "rope_theta": m("rope.freq_base", 10000.0)},
                 "sliding_attention": {"rope_type": "default",
                                       "rope_theta": m("rope.freq_base_swa", 10000.0)}},
             final_logit_softcapping=m("final_logit_softcapping"),
             attn_logit_softcapping=m("attn_logit_softcapping"), dtype="float32", **ids)
    return {k: v for k, v in d.items() if v is not None}


def _local_blocks(pattern, blocks: int) -> list[bool]:
    """Which blocks attend within the window: the pattern's flag per block, or, for a
    number n, all but every n-th (llama_hparams::set_swa_pattern; 0: all of them)."""
    if isinstance(pattern, list):
        if len(pattern) != blocks or not all(isinstance(x, bool) for x in pattern):
            raise ValueError(f"config: gemma3.attention.sliding_window_pattern has "
                             f"{len(pattern)} entries for {blocks} blocks (a flag each)")
        return pattern
    if not isinstance(pattern, int) or isinstance(pattern, bool) or pattern < 0:
        raise ValueError(f"config: gemma3.attention.sliding_window_pattern must be a whole "
                         f"number or a flag per block, got {shown(pattern)}")
    return [pattern == 0 or i % pattern < pattern - 1 for i in range(blocks)]


def gguf_names(config: Config) -> dict[str, list[str]]:
    """Each canonical parameter -> the GGUF tensor(s) it is made of (W_QKV of three, or of
    one fused attn_qkv), llama.cpp's names (gguf-py's tensor_mapping)."""

    fused = config.model_type in ("gpt2", "gpt_neox")
    out = {}
    for name in param_shapes(config):
        parts = name.split(".")
        if parts[0] == "layers":
            i, rest = parts[1], ".".join(parts[2:])
            b = f"blk.{i}."
            if rest in ("attn.W_QKV", "attn.b_QKV"):
                kind = "weight" if rest.endswith("W_QKV") else "bias"
                out[name] = [f"{b}attn_qkv.{kind}"] if fused else \
                    [f"{b}attn_{p}.{kind}" for p in "qkv"]
                continue
            out[name] = [b + _BLOCK[rest]]
        else:
            out[name] = [_OUTSIDE[name]]
    return out


_OUTSIDE = {"embed.W_E": "token_embd.weight", "embed.W_pos": "position_embd.weight",
            "ln_final.w": "output_norm.weight", "ln_final.b": "output_norm.bias",
            "unembed.W_U": "output.weight"}


_BLOCK = {"ln1.w": "attn_norm.weight", "ln1.b": "attn_norm.bias",
          "ln2.w": "ffn_norm.weight", "ln2.b": "ffn_norm.bias",
          "attn.q_norm.w": "attn_q_norm.weight", "attn.k_norm.w": "attn_k_norm.weight",
          "ln1_post.w": "post_attention_norm.weight", "ln2_post.w": "post_ffw_norm.weight",
          "attn.W_O": "attn_output.weight", "attn.b_O": "attn_output.bias",
          "mlp.W_gate": "ffn_gate.weight", "mlp.W_in": "ffn_up.weight",
          "mlp.b_in": "ffn_up.bias", "mlp.W_out": "ffn_down.weight",
          "mlp.b_out": "ffn_down.bias"}


def check_tensors(lay: Layout, config: Config, path: Path) -> dict[str, list[TensorEntry]]:
    """Each canonical parameter's GGUF tensors, with names and shapes checked against the
    config the metadata gave, before any is read. A tied GPT-2 file may also hold output.weight
    (llama.cpp's converter writes the table twice): it must then equal the table (checked
    when read)."""

    by_name = {t.name: t for t in lay.tensors}
    wanted = gguf_names(config)
    shapes = param_shapes(config)
    out = {}
    for canonical, files in wanted.items():
        entries = []
        for f in files:
            if f not in by_name:
                raise WeightsError(f"{path}: tensor {f} is missing (the metadata describes a "
                                   f"{config.model_type} model of {config.n_layer} blocks)")
            entries.append(by_name.pop(f))
        want = _file_shapes(canonical, shapes[canonical], config)
        for e, shape in zip(entries, want, strict=True):
            if e.shape != shape:
                raise WeightsError(f"{path}: tensor {e.name} has shape {list(e.shape)}, but "
                                   f"the metadata says {list(shape)}")
        out[canonical] = entries
    extra = by_name.pop("output.weight", None)
    if extra is not None:  # a tied model's second copy of the table
        table = out["embed.W_E"][0]
        if extra.shape != table.shape:
            raise WeightsError(f"{path}: tensor output.weight has shape {list(extra.shape)}, "
                               f"the token table {list(table.shape)}")
        out["<tied head>"] = [extra]
    if by_name:
        odd = sorted(by_name)[0]
        raise WeightsError(f"{path}: unexpected tensor {shown(odd)}: not part of a "
                           f"{config.model_type} model with the metadata's {config.n_layer} "
                           "blocks")
    return out


def _file_shapes(canonical: str, shape: tuple[int, ...], config: Config) -> list[tuple]:
    """The GGUF shapes (rows, row) a canonical parameter's tensors must have."""
    if canonical.endswith("W_QKV"):
        if config.model_type in ("gpt2", "gpt_neox"):
            return [(shape[1], shape[0])]
        dk = config.d_k
        return [(config.n_head * dk, shape[0]), (config.kv_heads * dk, shape[0]),
                (config.kv_heads * dk, shape[0])]
    if canonical.endswith("b_QKV") and config.model_type not in ("gpt2", "gpt_neox"):
        dk = config.d_k
        return [(config.n_head * dk,), (config.kv_heads * dk,), (config.kv_heads * dk,)]
    if _is_matrix(canonical):
        return [(shape[1], shape[0])]
    return [shape]


def _is_matrix(canonical: str) -> bool:
    """A parameter kept (in, out) here and (out, in) in the file."""
    return canonical.rsplit(".", 1)[-1] in ("W_QKV", "W_O", "W_gate", "W_in", "W_out")


def read_params(path: Path, lay: Layout, config: Config,
                entries: dict[str, list[TensorEntry]]) -> dict:
    """Canonical float32 parameters, each tensor dequantized a few megabytes of rows at a
    time straight into its place (transposed, and for W_QKV into its columns): no tensor is
    held both whole and dequantized, and the file's pages of it are let go of once read."""
    shapes = _shapes(config)
    params = {}
    for canonical, parts in entries.items():
        if canonical == "<tied head>":
            continue
        out = weight_pages(shapes[canonical], np.float32)
        at = 0
        for e in parts:
            rows = e.shape[0] if len(e.shape) > 1 else 1
            width = math.prod(e.shape) // rows
            step = max(1, CHUNK_BYTES // (4 * width))
            perm = _permutation(config, e.name)
            if perm is not None:  # whole heads at a time
                step = max(perm, step // perm * perm)
            for r in range(0, rows, step):
                block = dequantized(lay, e, slice(r, min(rows, r + step)))
                if perm is not None:
                    block = _unpermuted(block, perm)
                _place(out, block, canonical, at + r, len(e.shape) == 1)
            at += rows if len(e.shape) > 1 else e.shape[0]
            release(lay, e)
        _check_finite(out, canonical, parts, path)
        params[canonical] = out
    if "<tied head>" in entries:
        _same_as_table(lay, entries["<tied head>"][0], params["embed.W_E"], path)
    return params


def _shapes(config: Config) -> dict[str, tuple[int, ...]]:

    return param_shapes(config)


def _place(out, block, canonical: str, at: int, vector: bool) -> None:
    """Rows at..at+n of the file's tensor (one piece of a fused parameter) into the
    canonical array: a matrix's rows are its columns here."""
    if vector:
        flat = block.reshape(-1)
        out.reshape(-1)[at:at + flat.size] = flat
    elif _is_matrix(canonical):
        out[:, at:at + block.shape[0]] = block.T
    else:
        out[at:at + block.shape[0]] = block


def _permutation(config: Config, name: str) -> int | None:
    """The rows of one head of a Llama q or k matrix, which llama.cpp's converter reorders
    (its `permute`, for the llama architecture only: Qwen's files keep Hugging Face's order)."""
    if config.model_type != "llama":
        return None
    if name.endswith(("attn_q.weight", "attn_k.weight")):
        return config.d_k
    return None


def _unpermuted(block, head: int):
    """llama.cpp stores each head's rows as (half, pair) interleaved: row 2j + i of a head is
    Hugging Face's row i * head/2 + j. Back to Hugging Face's order (rotate_half's halves)."""
    rows, width = block.shape
    return block.reshape(rows // head, head // 2, 2, width).swapaxes(1, 2).reshape(rows, width)


def _check_finite(out, canonical: str, parts: list[TensorEntry], path: Path) -> None:
    flat = out.reshape(-1)
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(np.dot(flat, flat)) or np.isfinite(flat).all():
            return
    raise WeightsError(f"{path}: tensor {parts[0].name} holds NaN or infinite values")


def _same_as_table(lay: Layout, entry: TensorEntry, table, path: Path) -> None:
    rows = entry.shape[0]
    step = max(1, CHUNK_BYTES // (4 * entry.shape[1]))
    for r in range(0, rows, step):
        if not np.array_equal(dequantized(lay, entry, slice(r, r + step)),
                              table[r:r + step]):
            raise WeightsError(f"{path}: tensor output.weight differs from token_embd.weight: "
                               "tinygpt ties a GPT-2 model's head to its token table")
