"""Large arrays on memory made 4 kB at a time: on this project's machines (virtual ones with
Linux's transparent huge pages) a large np.empty is made 2 MB at a time, and the first touch
of such pages cost several times what small pages did (benchmarks/results.md, "Why the code
is as it is": the key/value cache, the widened weights, a pass's logits)."""

from __future__ import annotations

import mmap

import numpy as np

WHOLE_AT_ONCE = 128 << 20  # bytes: a bfloat16 tensor widened in one piece (safetensors.py)


def fresh_pages(shape: tuple[int, ...], dtype, whole: bool = False) -> np.ndarray:
    """np.empty(shape, dtype), on private memory whose pages are made 4 kB at a time as they
    are first written (MADV_NOHUGEPAGE). `whole`: every number is about to be written (a
    widened weight, the logits of a pass), so the pages are all made now, in one call
    (MAP_POPULATE): a page fault per 4 kB cost 0.6 s a GB, this 0.38. Small arrays, and
    systems without the advice, get np.empty's own.

    Private, not shared: an anonymous shared mapping is the kernel's shared memory, whose
    page faults cost twice a private one's (671 MB written: 0.47 s of system time against
    0.25)."""
    size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    advice = getattr(mmap, "MADV_NOHUGEPAGE", None)
    if advice is None or size < 4 << 20:  # not Linux, or too small for huge pages to matter
        return np.empty(shape, dtype)
    populate = getattr(mmap, "MAP_POPULATE", 0) if whole else 0
    # not marked for huge pages when populated, so small ones (a system that makes huge pages
    # of every mapping would make them for np.empty's alike)
    pages = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate)
    if not populate:
        try:
            pages.madvise(advice)
        except OSError:  # a kernel without the advice: the pages are as np.empty's would be
            pass
    return np.frombuffer(pages, dtype).reshape(shape)


def weight_pages(shape: tuple[int, ...], dtype) -> np.ndarray:
    """fresh_pages for a weight the loader writes: made at once up to WHOLE_AT_ONCE bytes. A
    larger one is written a piece at a time, the file's pages of each piece let go of as it
    goes, and its pages all made first would be held beside all of the file's (a peak 130 MB
    higher for Gemma-3-270M's embedding): each piece's pages are made just before it is
    written (make_now)."""
    size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return fresh_pages(shape, dtype, whole=size <= WHOLE_AT_ONCE)


MADV_POPULATE_WRITE = 23  # Linux 5.14's advice; Python's mmap module names it from 3.13 on


def mapping_under(a: np.ndarray) -> tuple[mmap.mmap, int] | None:
    """The mmap an array is a view of (np.frombuffer over it, then any slices and reshapes)
    and where the array's first byte lies in it; None for any other array."""
    base = a
    while isinstance(base, np.ndarray) and isinstance(base.base, np.ndarray):
        base = base.base
    view = getattr(base, "base", None)
    if not isinstance(view, memoryview) or not isinstance(view.obj, mmap.mmap):
        return None
    return view.obj, a.ctypes.data - np.frombuffer(view, np.uint8, 1).ctypes.data


def make_now(piece: np.ndarray) -> None:
    """The pages under `piece` (a contiguous slice of a fresh_pages array about to be
    written whole) made in one call, as MAP_POPULATE makes a whole mapping's: 671 MB written
    a piece at a time, 0.30 s of system time a page fault at a time, 0.23 this way. Anything
    else (not over such a mapping, an older kernel) is left to the faults."""
    found = mapping_under(piece) if piece.flags.c_contiguous else None
    if found is None:
        return
    pages, at = found
    begin = at // mmap.PAGESIZE * mmap.PAGESIZE
    try:
        pages.madvise(MADV_POPULATE_WRITE, begin, at + piece.nbytes - begin)
    except (OSError, ValueError):
        pass
