"""Where results that are slow to compute and cheap to keep live between runs.

$TINYGPT_CACHE, else $XDG_CACHE_HOME/tinygpt, else ~/.cache/tinygpt. Entries are keyed by
the sha256 of what they were computed from (weights, data), so a changed input never reads
a stale entry; files are written with files.write_atomically.
"""

from __future__ import annotations

import hashlib
import os
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
