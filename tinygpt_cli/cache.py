"""Where results that are slow to compute and cheap to keep live between runs.

$TINYGPT_CACHE, else $XDG_CACHE_HOME/tinygpt, else ~/.cache/tinygpt. Entries are keyed by
the sha256 of what they were computed from (weights, data), so a changed input never reads
a stale entry; files are written with files.write_atomically.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import numpy as np

T = TypeVar("T")


def cache_dir() -> Path:
    env = os.environ.get("TINYGPT_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "tinygpt"


def key_of(*parts: str | bytes) -> str:
    """A short stable key for the inputs an entry was computed from."""
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode("utf-8") if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()[:24]


def entry(kind: str, key: str, suffix: str = ".npz") -> Path:
    """The path of one cache entry: cache_dir()/kind/key.suffix (the folder is not created)."""
    return cache_dir() / kind / f"{key}{suffix}"


def load_or_compute(path: Path, load: Callable[[Path], T], compute: Callable[[], T],
                    store: Callable[[Path, T], None]) -> T:
    """The one way to use an entry: read it with `load`, or, when it is missing or damaged
    (`load` raises), `compute` it and `store` it (atomically, by files.write_atomically) so
    the next run reads it. A damaged entry is replaced, never reported: it is only a cache."""
    from .errors import WeightsError

    if path.is_file():
        try:
            return load(path)
        except (OSError, ValueError, KeyError, WeightsError):
            pass  # computed again, and replaced
    value = compute()
    store(path, value)
    return value


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    """An .npz entry's arrays (store_arrays wrote it)."""
    import numpy as np

    with np.load(path) as z:
        return dict(z)


def store_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    import io

    import numpy as np

    from .files import write_atomically

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    write_atomically(path, buf.getvalue())
