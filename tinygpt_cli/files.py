"""Writing and fingerprinting files: every file the tool writes goes through write_atomically."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from .errors import WriteError


def cannot_write(path: Path, e: OSError) -> WriteError:
    """One line for the user: which file, and the system's reason (disk full, read-only)."""
    reason = e.strerror or str(e)
    if e.errno == errno.ELOOP:
        reason = "it is a symbolic link, which tinygpt never writes through"
    elif e.errno in (errno.EEXIST, errno.ENOTDIR):  # mkdir's "File exists" for a file/x
        blocking = next((p for p in Path(path).parents if p.exists() and not p.is_dir()), None)
        if blocking is not None:
            reason = f"{blocking} is a file, not a folder"
    return WriteError(f"cannot write {path}: {reason}")


def write_atomically(path: str | Path, data: bytes, *, mode: int = 0o644) -> None:
    """Write to a temporary file beside `path`, flush it to disk, then rename over `path`.

    A reader (or a run killed with SIGKILL) sees the old file or the new one, never half.
    The rename replaces a symlink at `path` with the file itself: the link's target, which a
    downloaded folder could aim anywhere, is never written.
    """
    import tempfile  # here, not at the top: commands that write nothing start 2 ms sooner

    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise cannot_write(path, e) from None
    try:
        os.chmod(tmp, mode)  # mkstemp makes 0600; weights and reports are meant to be read
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise cannot_write(path, e) from None
        raise


def append_line(path: str | Path, line: str) -> None:
    """Append one line to a log, never through a symlink (O_NOFOLLOW) nor into a file that
    has another name too (a hard link planted in a downloaded folder).

    A log grows by one line a step, so it is appended rather than rewritten; a run killed
    mid-line leaves a torn last line, which the reader skips.
    """
    path = Path(path)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        raise cannot_write(path, e) from None
    try:
        if os.fstat(fd).st_nlink > 1:
            raise WriteError(f"cannot write {path}: it is a hard link to another file")
        data = (line.rstrip("\n") + "\n").encode("utf-8")
        while data:
            data = data[os.write(fd, data):]
    except OSError as e:
        raise cannot_write(path, e) from None
    finally:
        os.close(fd)


def write_text(path: str | Path, text: str) -> None:
    write_atomically(path, text.encode("utf-8"))


def sha256(path: str | Path) -> str:
    import hashlib  # here, not at import: OpenSSL takes a while to load

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
