"""The safetensors format, and nothing of a model: a file's header read and checked (its
size, its tensors tiling the data, no duplicate names), tensors read or mapped (bfloat16
widened exactly: NumPy has none), the bytes of a file written (metadata strings only), a
sharded model's index, and the mapped pages of a tensor let go of once it is copied. The
loader of a weights folder (transformer/folder.py) and every file made from the weights read
through it."""

from __future__ import annotations

import contextlib
import json
import math
import mmap
import re
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from ..errors import WeightsError

if TYPE_CHECKING:  # NumPy is imported by the functions that use it: `encode` needs none
    import numpy as np


# Tensors the loader reads, with the NumPy type each safetensors dtype becomes. The model
# computes in float32; F16, BF16 (widened exactly: NumPy has none) and F64 files are
# converted. F8 and integers are refused: an integer tensor is not a weight.
FLOAT_DTYPES = {"F32": "float32", "F16": "float16", "F64": "float64", "BF16": "bfloat16"}


MAX_HEADER_BYTES = 100 << 20


DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
               "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1,
               "BOOL": 1}  # the safetensors library's own limit


class TensorInfo(NamedTuple):  # not a frozen dataclass: built on every start-up
    name: str  # as in the file
    dtype: str  # safetensors spelling: F32, F16, BF16, I64, ...
    shape: tuple[int, ...]
    shard: str = ""  # a sharded model's file holding it (model-00001-of-00002.safetensors)


def header_bytes(entries: int) -> int:
    """The header bytes a safetensors file of this many tensors may take: 512 bytes each
    (an entry is about 100) and 64 KB of metadata."""
    return entries * 512 + (64 << 10)


def header_json(path: Path, limit: int = MAX_HEADER_BYTES) -> tuple[dict, int, int]:
    """The one reader of a safetensors header: an 8-byte little-endian length, then that many
    bytes of JSON. Returns (the JSON object, its length n, the file's size; the data starts
    at byte 8 + n). Checked before anything is allocated, so a file cannot make a reader
    take more than it holds (nor more than `limit` header bytes); WeightsError when it is not
    a header."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise WeightsError(f"{path} is not a readable safetensors file ({size} bytes)")
        n = int.from_bytes(head, "little")
        if n > size - 8:
            raise WeightsError(f"{path} is not a readable safetensors file (its header claims "
                               f"{n:,} bytes; the file has {size:,})")
        if n > limit:
            raise WeightsError(f"{path}: its header is {n:,} bytes, more than a file of a "
                               f"GPT-2 model of the config's sizes needs ({limit:,})")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (ValueError, RecursionError) as e:
        raise WeightsError(f"{path} is not a readable safetensors file (header: {e})") from None
    if not isinstance(header, dict):
        raise WeightsError(f"{path} is not a readable safetensors file (header is not an object)")
    return header, n, size


def read_header(path: Path, limit: int = MAX_HEADER_BYTES) -> dict[str, TensorInfo]:
    """The tensors a safetensors header names, each's dtype, shape and byte range checked
    against the file without loading any tensor."""
    header, n, size = header_json(path, limit)
    data_bytes = size - 8 - n
    out, spans = {}, []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            ok = (isinstance(dtype, str) and isinstance(shape, list)
                  and all(_whole(x) for x in (*shape, begin, end)) and 0 <= begin <= end)
        except (TypeError, KeyError, ValueError):
            ok = False
        if not ok:
            raise WeightsError(f"{path} is not a readable safetensors file (the header entry "
                               f"of {name!r} is malformed)")
        size = DTYPE_BYTES.get(dtype)
        if size is not None and end - begin != size * math.prod(shape):
            raise WeightsError(f"{path} is not a readable safetensors file (tensor {name}: "
                               f"{end - begin:,} bytes for shape {shape} of {dtype})")
        if end > data_bytes:
            raise WeightsError(f"{path} is not a readable safetensors file (tensor {name} "
                               "runs past its end: truncated?)")
        out[name] = TensorInfo(name, dtype, tuple(shape))
        spans.append((begin, end, name))
    covered = _check_tiling(path, spans)
    if covered != data_bytes:  # as the safetensors library: the file is its tensors, whole
        raise WeightsError(f"{path} is not a readable safetensors file ({data_bytes - covered:,} "
                           "bytes after its last tensor)")
    return out


def _check_tiling(path: Path, spans: list[tuple[int, int, str]]) -> int:
    """The tensors' byte ranges must follow one another without gaps or overlaps, as the
    safetensors library requires: two tensors sharing bytes would be aliases of each other.
    Returns how many bytes of data they cover."""
    spans = sorted(spans)
    for (_, end, before), (begin, _, name) in zip(spans, spans[1:], strict=False):
        if begin < end:
            raise WeightsError(f"{path} is not a readable safetensors file (the bytes of "
                               f"tensor {name} overlap those of tensor {before})")
    at, before = 0, "the header"
    for begin, end, name in spans:
        if begin != at:
            raise WeightsError(f"{path} is not a readable safetensors file (tensor {name} "
                               f"starts {begin - at:,} bytes after the end of {before})")
        at, before = end, f"tensor {name}"
    return at


def _whole(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _no_duplicates(pairs):
    seen = {}
    for k, v in pairs:
        if k in seen:
            raise ValueError(f"the name {k!r} appears twice")
        seen[k] = v
    return seen


def dtype_name(dtype: np.dtype) -> str:
    import numpy as np

    names = {np.dtype(t): n for n, t in FLOAT_DTYPES.items() if n != "BF16"}
    return names.get(np.dtype(dtype), str(np.dtype(dtype)))


_SAFETENSORS_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4",
                       "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}


def _map_read_only(fd: int):
    """The whole file mapped read-only; on Linux with its pages mapped at once (MAP_POPULATE):
    every command reads every weight (the finiteness check, then the pass), and one call
    that maps them all costs less than a page fault per 4 kB."""

    populate = getattr(mmap, "MAP_POPULATE", 0)
    if populate:
        try:
            return mmap.mmap(fd, 0, flags=mmap.MAP_SHARED | populate, prot=mmap.PROT_READ)
        except OSError:
            pass
    return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)


def map_safetensors(path: Path, lazy_bf16: bool = False) -> dict[str, np.ndarray] | None:
    """The tensors of a safetensors file as arrays over the file mapped into memory: nothing
    is read or copied until used, and pages are shared with the page cache (start-up and
    memory). The arrays are read-only, so the file cannot be changed through them, and the
    forward pass may keep derived copies of them (ops.tied_head).

    The format: an 8-byte little-endian header length, a JSON header of
    {name: {dtype, shape, data_offsets: [begin, end]}} relative to the data after it, then the
    data. Returns None for anything but a plain well-formed file (bfloat16, say), which the
    safetensors library then reads, or reports, as before.
    """
    import numpy as np

    try:
        header, n, size = header_json(path)
    except WeightsError:
        return None
    with open(path, "rb") as f:
        buf = _map_read_only(f.fileno())
        if buf.size() != size:  # changed under us: the library reads it, or reports it
            return None
    data_size = size - 8 - n
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            bf16 = info["dtype"] == "BF16"  # NumPy has no bfloat16: its bits, widened below
            dtype = np.dtype("<u2" if bf16 else _SAFETENSORS_DTYPES[info["dtype"]])
            shape = tuple(int(d) for d in info["shape"])
            begin, end = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            return None
        count = int(np.prod(shape, dtype=np.int64))
        if not 0 <= begin <= end <= data_size or end - begin != count * dtype.itemsize:
            return None
        tensors[name] = np.frombuffer(buf, dtype, count, 8 + n + begin).reshape(shape)
        if bf16:
            bits = Bfloat16(tensors[name], buf, 8 + n + begin, 8 + n + end)
            tensors[name] = bits if lazy_bf16 else bits.widen()
    return tensors


class Bfloat16:
    """A bfloat16 tensor of a mapped file as its uint16 bits, not yet widened: a family's
    converter widens it straight into the place its float32 copy is to live (transposed, or
    one piece of a fused matrix: families/common.py), with no float32 copy in the file's
    layout made first, and the file's pages of it are then let go of (_let_go)."""

    def __init__(self, bits: np.ndarray, buf, begin: int, end: int) -> None:
        self.bits, self._buf, self._span = bits, buf, (begin, end)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.bits.shape

    @property
    def dtype(self):
        """What it becomes (the header check has seen BF16 already)."""
        import numpy as np

        return np.dtype(np.float32)

    def widen(self, out: np.ndarray | None = None, transposed: bool = False) -> np.ndarray:
        """The float32 numbers (transposed: of the matrix's transpose), written into `out`
        (a float32 array of that shape, a view into a larger one, say) or a new array."""
        import numpy as np

        from .pages import make_now, weight_pages

        bits, (begin, end) = self.bits, self._span
        if out is None:
            out = weight_pages(bits.T.shape if transposed else bits.shape, np.float32)
        # a large tensor (a 262,144-row embedding) a piece at a time, each piece's file pages
        # let go of once widened: never the whole file mapped beside the whole float32 copy
        rows = max(1, (64 << 20) // max(1, bits[:1].nbytes)) if bits.ndim > 1 else len(bits)
        step = bits[:1].nbytes if bits.ndim > 1 else 0
        for r in range(0, len(bits), rows):
            part = slice(r, r + rows)
            if not transposed:
                make_now(out[part])
            widen_bfloat16(bits[part].T if transposed else bits[part],
                           out[..., part] if transposed else out[part])
            if step:
                _let_go(self._buf, begin + r * step, min(end, begin + (r + rows) * step))
        _let_go(self._buf, begin, end)
        return out

    def finite(self) -> bool:
        """No infinity and no NaN (an exponent of all ones), read a million at a time."""
        import numpy as np

        flat = self.bits.reshape(-1)
        part = np.empty(min(flat.size, 1 << 20), np.uint16)
        for i in range(0, flat.size, part.size):
            chunk = part[: min(part.size, flat.size - i)]
            np.bitwise_and(flat[i: i + chunk.size], 0x7F80, out=chunk)
            if (chunk == 0x7F80).any():
                return False
        return True


def _let_go(buf, begin: int, end: int) -> None:
    """Drop the mapped file's pages that lie wholly within bytes begin .. end from this
    process (they stay in the page cache; read again, they are mapped again): a bfloat16
    tensor, once widened, is never read from the file again, and its mapped pages would
    count in the process's memory beside the float32 copy (269 MB for a 135M-parameter
    model)."""

    advice = getattr(mmap, "MADV_DONTNEED", None)
    page = mmap.PAGESIZE
    first, last = -(-begin // page) * page, end // page * page
    if advice is None or last <= first:
        return
    with contextlib.suppress(OSError, ValueError):
        buf.madvise(advice, first, last - first)


def let_go_of(a) -> None:
    """Drop the mapped file's pages under array `a` (a view of a file map_safetensors
    mapped) from this process, as _let_go does for a widened bfloat16 tensor: a converter
    calls it once its canonical copy of `a` is made (transposed, or one piece of a fused
    matrix), so a float32 file's pages and their copies are never all resident together
    (the file is mapped whole at once). Anything else is left as it is."""

    from .pages import mapping_under

    found = mapping_under(a)
    if found is not None:
        buf, begin = found
        _let_go(buf, begin, begin + a.nbytes)


def read_safetensors(path: Path, names=None, *, limit: int = MAX_HEADER_BYTES,
                     label: str | None = None, hint: str | None = None,
                     lazy_bf16: bool = False) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The one reader of a safetensors file: its tensors (`names`, or all) and metadata.
    Mapped read-only where map_safetensors can (nothing copied until used), else read by the
    library; whatever either finds wrong is one WeightsError (exit 1): "LABEL is not a
    readable safetensors file (why)", then "; HINT" when given. LABEL defaults to the path."""
    from safetensors import SafetensorError, safe_open

    label = label or str(path)
    try:
        header, _, _ = header_json(path, limit)
        meta = header.get("__metadata__")
        meta = dict(meta) if isinstance(meta, dict) else {}
        mapped = map_safetensors(path, lazy_bf16)
        if mapped is not None:
            wanted = list(mapped) if names is None else names
            tensors = {n: mapped.pop(n) for n in wanted}  # held once: map_params frees as it goes
            del mapped
            return tensors, meta
        with safe_open(str(path), framework="numpy") as f:  # what the mapping does not take on
            wanted = list(f.keys()) if names is None else names
            return {n: f.get_tensor(n) for n in wanted}, dict(f.metadata() or {})
    except WeightsError as e:
        if label == str(path) and not hint:
            raise
        raise WeightsError(str(e).replace(str(path), label, 1)
                           + (f"; {hint}" if hint else "")) from None
    except (SafetensorError, OSError, ValueError, TypeError, KeyError) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise WeightsError(f"{label} is not a readable safetensors file ({why})"
                           + (f"; {hint}" if hint else "")) from None


def widen_bfloat16(bits: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """bfloat16 numbers, given as their uint16 bits, as float32: the same sign, exponent and
    the top 7 bits of the fraction, the rest zeros. Exact: every bfloat16 is a float32.
    Written into `out` (float32, bits' shape) when given, else into a new array."""
    import numpy as np

    from .pages import weight_pages

    # one pass into small pages (pages.py), no uint32 copy of the bits made first
    out = weight_pages(bits.shape, np.float32) if out is None else out
    np.left_shift(bits, 16, out=out.view(np.uint32), dtype=np.uint32)
    return out


INDEX = "model.safetensors.index.json"  # a sharded model's map of tensor -> file


SHARD = re.compile(r"[\w.-]+\.safetensors")


def shards_of(index: Path) -> dict[str, set[str]]:
    """A sharded model's index (model.safetensors.index.json, as save_pretrained writes it):
    each shard's file name and the tensors in it. Shards are plain file names beside the
    index, never a path elsewhere."""
    with open(index, "rb") as f:
        raw = f.read(MAX_HEADER_BYTES + 1)
    try:
        if len(raw) > MAX_HEADER_BYTES:
            raise ValueError(f"larger than {MAX_HEADER_BYTES:,} bytes")
        weight_map = json.loads(raw.decode("utf-8"))["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise WeightsError(f"{index} is not a safetensors index ({e})") from None
    shards: dict[str, set[str]] = {}
    for name, file in weight_map.items():
        if not isinstance(file, str) or not SHARD.fullmatch(file) or file.startswith("."):
            raise WeightsError(f"{index}: tensor {name!r} is in {file!r}, not a .safetensors "
                               "file beside the index")
        shards.setdefault(file, set()).add(name)
    return shards


def safetensors_bytes(tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None
                      ) -> bytes:
    """A safetensors file, the same bytes for the same tensors and metadata every time: the
    safetensors library writes its metadata in a random order (a Rust HashMap), so two runs
    of `means` gave files that differed. Names and metadata keys sorted; the header padded
    with spaces to a multiple of 8 bytes, as the library does."""
    return b"".join(safetensors_chunks(tensors, metadata))


def safetensors_chunks(tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None
                       ) -> list:
    """safetensors_bytes as its pieces (the header, then each tensor's bytes as a view of the
    array where it can be one): a file of a gigabyte written without a second gigabyte in
    memory."""
    import numpy as np

    codes = {np.dtype(v): k for k, v in _SAFETENSORS_DTYPES.items()}
    header: dict = {"__metadata__": dict(sorted(metadata.items()))} if metadata else {}
    chunks, at = [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        data = memoryview(a.reshape(-1)).cast("B") if a.size else b""
        header[name] = {"dtype": codes[a.dtype], "shape": list(a.shape),
                        "data_offsets": [at, at + len(data)]}
        chunks.append(data)
        at += len(data)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return [len(text).to_bytes(8, "little") + text, *chunks]


def metadata_strings(meta: dict) -> dict[str, str]:
    """safetensors metadata (strings only): strings as they are, any other value as JSON,
    such as a steered run's {"steered": {site, scale, norm, toward and away or vector}}, by
    which a file made from a steered run says so."""
    return {k: v if isinstance(v, str) else json.dumps(v, sort_keys=True)
            for k, v in meta.items()}


def with_metadata(path: Path, extra: dict[str, str]) -> bytes:
    """The safetensors file at `path` with `extra` merged into its metadata: the tensors' bytes
    as they were (a snapshot stamped with the weights its run ended with stays the same
    float16 weights)."""
    header, _, _ = header_json(path)
    tensors = map_safetensors(path)
    if tensors is None:
        raise WeightsError(f"{path} is not a readable safetensors file")
    meta = header.get("__metadata__")
    return safetensors_bytes(tensors, {**(meta if isinstance(meta, dict) else {}), **extra})
