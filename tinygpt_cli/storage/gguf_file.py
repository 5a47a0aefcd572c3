"""A GGUF file (llama.cpp's format) as a file: its header walked and checked, its tensors'
bytes, and each tensor dequantized by llama.cpp's own `gguf` package. What the file means as a
model (its metadata as a family's config, its tensors as the canonical parameters) is the
model floor's: transformer/gguf.py, and transformer/gguf_vocab.py its tokenizer.

llama.cpp's own `gguf` package (the optional extra `gguf`) dequantizes every tensor
(gguf.quants.dequantize, with its table of types and block sizes), so each number is the
one llama.cpp's Python tools give; nothing here decodes a quantized block by hand. The
header (counts, key-value metadata, the tensor table) is read here, by one walk that checks
every count, length, type and offset against the file's size before anything is allocated:
the package's GGUFReader trusts the file (a string length past the end gives a short
string, an array of 2^60 elements a loop without end) and parses each array element as a
NumPy slice of its memory map, 13 s for a 49,152-token vocabulary where this walk takes a
fraction of a second. tests/test_gguf.py reads every file with GGUFReader too and compares.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import InputError, WeightsError
from ..escapes import shown
from .safetensors import _let_go as let_go

INSTALL = "reading a GGUF file needs the gguf package: pip install 'tinygpt-cli[gguf]'"


MAX_DIMS = 4  # ggml's GGML_MAX_DIMS


MAX_ELEMENTS = 1 << 40


MAX_DEPTH = 2  # an array of arrays at most (llama.cpp writes none deeper)


def require_gguf():
    """The gguf package, or the one line saying how to install it (exit 2)."""
    try:
        import gguf
    except ImportError:
        raise InputError(INSTALL) from None
    return gguf


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


def open_layout(path: Path) -> Layout:
    """The checked header of a GGUF file, with the gguf package at hand for its tensors."""
    require_gguf()
    return layout(path)


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


def release(lay: Layout, e: TensorEntry) -> None:
    """The file's pages of a tensor once dequantized (safetensors._let_go)."""

    begin = lay.data_start + e.offset
    let_go(lay.buf, begin, begin + e.nbytes)


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
