"""Where results that are slow to compute and cheap to keep live between runs.

$TINYGPT_CACHE, else $XDG_CACHE_HOME/tinygpt, else ~/.cache/tinygpt. Entries are keyed by
the sha256 of what they were computed from (weights, data), so a changed input never reads
a stale entry; files are written with files.write_atomically.
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from ..errors import WriteError
from ..escapes import escape_line
from .files import verified, write_checked

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
                    store: Callable[[Path, T], None],
                    valid: Callable[[T], bool] = lambda value: True) -> T:
    """The one way to use an entry: read it with `load`, or, when it is missing, damaged
    (`load` raises) or not what `valid` accepts (other keys, shapes or ranges: a stale format,
    a file put there by hand), `compute` it and `store` it (atomically) so the next run reads
    it. An entry is read only when its bytes match the checksum written with it (keep), so
    an entry edited in place is computed again too. A bad entry is replaced, never
    reported: it is only a cache."""

    if verified(path):
        try:
            value = load(path)
            if valid(value):
                return value
        except Exception:  # noqa: BLE001 - whatever a damaged entry raises (a truncated
            pass  # zip is BadZipFile, a wrong dtype TypeError...): computed again, replaced
    value = compute()
    store(path, value)
    return value


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    """An .npz entry's arrays (store_arrays wrote it)."""

    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def npz_bytes(**arrays) -> bytes:
    """np.savez's layout (an uncompressed zip of .npy files), without the time of writing
    in each entry: the same arrays give the same bytes, so the same sha256, on any worker."""


    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
        for name, a in arrays.items():
            with z.open(zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0)), "w",
                        force_zip64=True) as f:
                np.lib.format.write_array(f, np.asarray(a), allow_pickle=False)
    return buf.getvalue()


def store_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Keep an entry for later runs. A cache that cannot be written (read-only, a full disk)
    loses only that: one note on stderr, and the result just computed is still shown."""
    keep(path, npz_bytes(**arrays))



def keep(path: Path, data: bytes) -> bool:
    """Write an entry's bytes atomically, with its checksum beside it (files.write_checked);
    an unwritable cache is one note, not an error. Whether the entry was kept."""

    try:
        write_checked(path, data)
    except WriteError as e:
        note(f"note: {e}; the result is not kept for the next run (set TINYGPT_CACHE to a "
              "writable folder)")
        return False
    return True


def note(message: str) -> None:
    """One line on stderr, escaped: an entry not kept (each time: a second command in the
    same process, or the next --each-line line, is told again), a copy kept."""


    try:
        sys.stderr.write(escape_line(message) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass  # stderr is gone: nothing to tell
