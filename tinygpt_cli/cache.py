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


def load(path: Path, valid: Callable[[dict], bool]) -> dict | None:
    """The arrays of an .npz entry, or None when there is none or it cannot be used: damaged,
    or with other keys, shapes or ranges than `valid` accepts (a stale format, a file put
    there by hand). The caller then computes the entry again and stores it over the bad one."""
    import numpy as np

    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        return arrays if valid(arrays) else None
    except (OSError, ValueError, KeyError, IndexError, TypeError, EOFError):
        return None


def store(path: Path, arrays: dict) -> None:
    """Keep an entry for later runs. A cache that cannot be written (read-only, a full disk)
    loses only that: one note on stderr, and the result just computed is still shown."""
    import io

    import numpy as np

    from .errors import WriteError
    from .files import write_atomically

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    try:
        write_atomically(path, buf.getvalue())
    except WriteError as e:
        _note_once(f"note: {e}; the result is not kept for the next run (set TINYGPT_CACHE "
                   "to a writable folder)")


_noted: set[str] = set()


def _note_once(message: str) -> None:
    import sys

    from .render.text import escape_line

    if message in _noted:
        return
    _noted.add(message)
    try:
        sys.stderr.write(escape_line(message) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass  # stderr is gone: nothing to tell
