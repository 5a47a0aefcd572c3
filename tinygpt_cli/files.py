"""Writing and fingerprinting files: every file the tool writes goes through write_atomically."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path


def write_atomically(path: str | Path, data: bytes, *, mode: int = 0o644) -> None:
    """Write to a temporary file beside `path`, flush it to disk, then rename over `path`.

    A reader (or a run killed with SIGKILL) sees the old file or the new one, never half.
    The rename replaces a symlink at `path` with the file itself: the link's target, which a
    downloaded folder could aim anywhere, is never written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, mode)  # mkstemp makes 0600; weights and reports are meant to be read
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text(path: str | Path, text: str) -> None:
    write_atomically(path, text.encode("utf-8"))


def sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
