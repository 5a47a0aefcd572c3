"""A GGUF file (llama.cpp's format) read as a model: its metadata into a Config, its tensors
dequantized into the canonical parameters, its vocabulary into a tokenizer (gguf_vocab.py).

llama.cpp's own `gguf` package (the optional extra `gguf`) dequantizes every tensor
(gguf.quants.dequantize, with its table of types and block sizes), so each number is the
one llama.cpp's Python tools give; nothing here decodes a quantized block by hand. The
header (counts, key-value metadata, the tensor table) is read here, by one walk that checks
every count, length, type and offset against the file's size before anything is allocated:
the package's GGUFReader trusts the file (a string length past the end gives a short
string, an array of 2^60 elements a loop without end) and parses each array element as a
NumPy slice of its memory map, 13 s for a 49,152-token vocabulary where this walk takes a
fraction of a second. tests/test_gguf.py reads every file with GGUFReader too and compares.

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
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import InputError, WeightsError
from ..transformer.config import Config, shown
from ..transformer.schema import param_shapes
from .pages import weight_pages
from .safetensors import _let_go as let_go

INSTALL = "reading a GGUF file needs the gguf package: pip install 'tinygpt-cli[gguf]'"

# general.architecture -> the family (config.json's model_type) it is
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gpt2": "gpt2",
                 "gptneox": "gpt_neox", "gemma3": "gemma3_text"}
# named, so that the refusal says why rather than "unknown"
NOT_YET = {"gemma3n": "Gemma 3n's block (per-layer inputs, AltUp) is not in tinygpt",
           "gemma2": "Gemma 2's block (logit soft-capping) is not in tinygpt"}

MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
MAX_ELEMENTS = 1 << 40
MAX_DEPTH = 2  # an array of arrays at most (llama.cpp writes none deeper)
CHUNK_BYTES = 8 << 20  # a tensor is dequantized this many float32 bytes of rows at a time


def require_gguf():
    """The gguf package, or the one line saying how to install it (exit 2)."""
    try:
        import gguf
    except ImportError:
        raise InputError(INSTALL) from None
    return gguf


# ------------------------------------------------------------------ the header, checked


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dims: tuple[int, ...]  # ggml's order: dims[0] is the row (the input side of a matrix)
    kind: int  # GGMLQuantizationType
    offset: int  # from the start of the data section
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """As NumPy holds it once dequantized: (rows, row), ggml's dims reversed."""
        return tuple(reversed(self.dims))


@dataclass
class Layout:
    version: int
    meta: dict  # key -> value (a string, a number, a bool, or a list of them)
    tensors: list[TensorEntry]
    data_start: int
    size: int
    alignment: int = 32
    buf: object = field(default=None, repr=False)  # the file mapped read-only


# value type -> its size in bytes (8 STRING and 9 ARRAY are walked)
_SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


class _Walk:
    """A cursor over the mapped header that refuses to read past the file."""

    def __init__(self, buf, size: int, path: Path):
        self.buf, self.size, self.path, self.at = buf, size, path, 0

    def fail(self, why: str) -> WeightsError:
        return WeightsError(f"{self.path} is not a readable GGUF file ({why})")

    def take(self, n: int, what: str) -> int:
        if n < 0 or n > self.size - self.at:
            raise self.fail(f"{what} runs past the end of the file at byte {self.at:,} "
                            f"({self.size:,} bytes): truncated, or a length that lies")
        start, self.at = self.at, self.at + n
        return start

    def u32(self, what: str) -> int:
        return struct.unpack_from("<I", self.buf, self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack_from("<Q", self.buf, self.take(8, what))[0]

    def string(self, what: str) -> str:
        n = self.u64(what)
        start = self.take(n, f"{what} ({n:,} bytes)")
        try:
            return bytes(self.buf[start:start + n]).decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} at byte {start:,} is not UTF-8") from None

    def skip_string(self, what: str) -> None:
        self.take(self.u64(what), what)

    def value(self, kind: int, what: str, depth: int = 0):
        """One value, read: a number, a bool, a string, or a list of them."""
        if kind in _SCALARS:
            start = self.take(_SCALARS[kind], what)
            value = struct.unpack_from("<" + _CODES[kind], self.buf, start)[0]
            return bool(value) if kind == 7 else value
        if kind == 8:
            return self.string(what)
        if kind == 9:
            inner, n = self.u32(what), self.u64(what)
            if depth >= MAX_DEPTH:
                raise self.fail(f"{what} nests arrays deeper than {MAX_DEPTH}")
            least = _SCALARS.get(inner, 8 if inner == 8 else 12 if inner == 9 else None)
            if least is None:
                raise self.fail(f"{what}: unknown value type {inner}")
            if n * least > self.size - self.at:
                raise self.fail(f"{what} claims {n:,} elements; the file has "
                                f"{self.size - self.at:,} bytes left")
            if inner in _SCALARS:
                start = self.take(n * least, what)
                values = np.frombuffer(self.buf, "<" + _CODES[inner], n, start).tolist()
                return [bool(v) for v in values] if inner == 7 else values
            return [self.value(inner, what, depth + 1) for _ in range(n)]
        raise self.fail(f"{what}: unknown value type {kind}")


_CODES = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
          12: "d"}


def layout(path: Path) -> Layout:
    """The header of a GGUF file, walked with every length and offset checked against the
    file: WeightsError (exit 1) naming the first thing wrong, before anything else reads it.
    Tensor types are checked against the gguf package's table of sizes."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            if size < 24:
                raise WeightsError(f"{path} is not a readable GGUF file ({size} bytes)")
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise WeightsError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        return _walked(buf, size, path, GGML_QUANT_SIZES, GGMLQuantizationType)
    except BaseException:
        buf.close()
        raise


def _walked(buf, size: int, path: Path, sizes: dict, types) -> Layout:
    """layout's walk over the mapped file (`sizes`, `types`: gguf's GGML_QUANT_SIZES and
    GGMLQuantizationType)."""
    w = _Walk(buf, size, path)
    if bytes(buf[:4]) != b"GGUF":
        raise w.fail("it does not start with GGUF")
    w.at = 4
    version = w.u32("the version")
    if version not in (2, 3):
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        raise w.fail("a big-endian file, which tinygpt does not read" if swapped in (2, 3)
                     else f"version {version}; tinygpt reads versions 2 and 3")
    n_tensors, n_kv = w.u64("the tensor count"), w.u64("the metadata count")
    # a key-value pair takes at least 13 bytes, a tensor's entry at least 33
    if n_kv * 13 + n_tensors * 33 > size - w.at:
        raise w.fail(f"its header claims {n_tensors:,} tensors and {n_kv:,} metadata "
                     f"entries; the file has {size:,} bytes")
    alignment, meta = 32, {}
    for i in range(n_kv):
        key = w.string(f"metadata key {i}")
        if key in meta:
            raise w.fail(f"metadata key {shown(key)} appears twice")
        value = meta[key] = w.value(w.u32(f"the type of {shown(key)}"),
                                    f"metadata {shown(key)}")
        if key == "general.alignment":
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0 \
                    or value & (value - 1) or value > 1 << 16:
                raise w.fail(f"general.alignment {shown(value)} is not a power of two")
            alignment = value
    tensors, names = [], set()
    for i in range(n_tensors):
        name = w.string(f"tensor name {i}")
        if name in names:
            raise w.fail(f"tensor {shown(name)} appears twice")
        names.add(name)
        n_dims = w.u32(f"tensor {shown(name)}'s dimension count")
        if not 1 <= n_dims <= MAX_DIMS:
            raise w.fail(f"tensor {shown(name)} has {n_dims} dimensions (1 to {MAX_DIMS})")
        dims = tuple(w.u64(f"tensor {shown(name)}'s shape") for _ in range(n_dims))
        raw = w.u32(f"tensor {shown(name)}'s type")
        offset = w.u64(f"tensor {shown(name)}'s offset")
        try:
            kind = types(raw)
            block, type_size = sizes[kind]
        except (ValueError, KeyError):
            raise w.fail(f"tensor {shown(name)} has type {raw}, which the gguf package "
                         "does not know") from None
        count = math.prod(dims)
        if not all(d >= 1 for d in dims) or count > MAX_ELEMENTS:
            raise w.fail(f"tensor {shown(name)} has shape {list(dims)}")
        if dims[0] % block:
            raise w.fail(f"tensor {shown(name)}'s rows of {dims[0]} are not whole blocks "
                         f"of {kind.name} ({block})")
        tensors.append(TensorEntry(name, dims, int(kind), offset,
                                   count // block * type_size))
    data_start = -(-w.at // alignment) * alignment
    _check_spans(w, tensors, data_start, alignment)
    return Layout(version, meta, tensors, data_start, size, alignment, buf)


def _check_spans(w: _Walk, tensors: list[TensorEntry], data_start: int, alignment: int) -> None:
    """Each tensor's bytes inside the file, aligned as the format requires, and no two
    sharing bytes."""
    for t in tensors:
        if t.offset % alignment:
            raise w.fail(f"tensor {shown(t.name)}'s offset {t.offset:,} is not a multiple "
                         f"of the alignment {alignment}")
        if data_start + t.offset + t.nbytes > w.size:
            raise w.fail(f"tensor {shown(t.name)} runs past the end of the file "
                         f"({t.nbytes:,} bytes at {data_start + t.offset:,} of "
                         f"{w.size:,}): truncated?")
    spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in tensors)
    for (_, end, before), (begin, _, name) in zip(spans, spans[1:], strict=False):
        if begin < end:
            raise w.fail(f"the bytes of tensor {shown(name)} overlap those of "
                         f"{shown(before)}")


# ------------------------------------------------------------------ metadata


def open_layout(path: Path) -> Layout:
    """The checked header of a GGUF file, with the gguf package at hand for its tensors."""
    require_gguf()
    return layout(path)


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


# ------------------------------------------------------------------ tensors


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


def tensor_bytes(lay: Layout, e: TensorEntry):
    """A tensor as the gguf package's dequantize takes it: its numbers (F32, F16) or its
    blocks' bytes (one row of bytes per row of numbers), a read-only view of the mapping."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import quant_shape_to_byte_shape

    kind = GGMLQuantizationType(e.kind)
    start = lay.data_start + e.offset
    if kind in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        dtype = np.float32 if kind == GGMLQuantizationType.F32 else np.float16
        return np.frombuffer(lay.buf, dtype, math.prod(e.dims), start).reshape(e.shape)
    shape = quant_shape_to_byte_shape(e.shape, kind)
    return np.frombuffer(lay.buf, np.uint8, e.nbytes, start).reshape(shape)


def dequantized(lay: Layout, e: TensorEntry, rows: slice | None = None):
    """gguf.quants.dequantize of a tensor's rows (all, or a slice): float32, (rows, row)."""
    from gguf.quants import dequantize

    data = tensor_bytes(lay, e)
    flat = data.reshape(-1, data.shape[-1])
    part = flat if rows is None else flat[rows]
    out = dequantize(part, e.kind)
    return np.asarray(out, dtype=np.float32).reshape(len(part), -1)


def check_types(lay: Layout, path: Path) -> None:
    """Every tensor's type one the gguf package dequantizes (not an integer type, not one
    it only names), tried on one block of zeros before any tensor is read."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    for kind in sorted({t.kind for t in lay.tensors}):
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        zeros = np.zeros((1, block if kind in (0, 1) else size),
                         np.float32 if kind == 0 else np.float16 if kind == 1 else np.uint8)
        try:
            dequantize(zeros, kind)
        except (NotImplementedError, ValueError, TypeError):
            name = next(t.name for t in lay.tensors if t.kind == kind)
            raise WeightsError(f"{path}: tensor {name} has type {type_name(kind)}, which the "
                               "gguf package cannot dequantize (not a weight type tinygpt "
                               "reads)") from None


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
            _let_go(lay, e)
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


def _let_go(lay: Layout, e: TensorEntry) -> None:
    """The file's pages of a tensor once dequantized (safetensors._let_go)."""

    begin = lay.data_start + e.offset
    let_go(lay.buf, begin, begin + e.nbytes)


# ------------------------------------------------------------------ what the file is


def type_name(kind: int) -> str:
    from gguf.constants import GGMLQuantizationType

    return GGMLQuantizationType(kind).name


def description(lay: Layout, meta: dict) -> dict:
    """What `info` shows of a GGUF: each tensor's type, the types counted, the bits per
    weight of the whole file's tensors, and where the weights came from (general.*)."""
    types = {t.name: type_name(t.kind) for t in lay.tensors}
    counts: dict[str, int] = {}
    for t in types.values():
        counts[t] = counts.get(t, 0) + 1
    n = sum(math.prod(t.dims) for t in lay.tensors)
    bits = 8 * sum(t.nbytes for t in lay.tensors) / n if n else 0.0
    source = {k: v for k, v in meta.items() if k.startswith("general.")
              and isinstance(v, str | int | float) and k != "general.alignment"}
    if isinstance(source.get("general.file_type"), int):  # 7 -> MOSTLY_Q8_0, by gguf's names
        from gguf.constants import LlamaFileType

        try:
            source["general.file_type"] = LlamaFileType(source["general.file_type"]).name
        except ValueError:
            pass
    return {"format": f"GGUF version {lay.version}", "bits_per_weight": round(bits, 3),
            "types": counts, "tensors": types, "source": source}
