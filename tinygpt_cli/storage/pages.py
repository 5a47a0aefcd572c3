"""Large arrays on memory made 4 kB at a time: on this project's machines (virtual ones with
Linux's transparent huge pages) a large np.empty is made 2 MB at a time, and the first touch
of such pages cost several times what small pages did (benchmarks/results.md, "Why the code
is as it is": the key/value cache, the widened weights)."""

from __future__ import annotations

import mmap

import numpy as np


def fresh_pages(shape: tuple[int, ...], dtype) -> np.ndarray:
    """np.empty(shape, dtype), on memory whose pages are made 4 kB at a time as they are
    first written (MADV_NOHUGEPAGE). Small arrays, and systems without the advice, get
    np.empty's own."""
    size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    advice = getattr(mmap, "MADV_NOHUGEPAGE", None)
    if advice is None or size < 4 << 20:  # not Linux, or too small for huge pages to matter
        return np.empty(shape, dtype)
    pages = mmap.mmap(-1, size)
    try:
        pages.madvise(advice)
    except OSError:  # a kernel without the advice: the pages are as np.empty's would be
        pass
    return np.frombuffer(pages, dtype).reshape(shape)
