"""Writing and fingerprinting files: every file the tool writes goes through write_atomically."""

from __future__ import annotations

import errno
import functools
import json
import os
import re
from pathlib import Path

from ..errors import WriteError


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


def write_atomically(path: str | Path, data: bytes | list, *, mode: int = 0o644) -> None:
    """Write to a temporary file beside `path`, flush it to disk, then rename over `path`.
    `data`: the bytes, or a list of pieces (bytes or memoryviews) written one after another.

    A reader (or a run killed with SIGKILL) sees the old file or the new one, never half.
    The rename replaces a symlink at `path` with the file itself: the link's target, which a
    downloaded folder could aim anywhere, is never written. The temporary, `.NAME.PID.XXXXXXXX
    .tmp`, names its writer: one that a killed writer left is removed by the next write into
    the folder (remove_temporaries).
    """
    import tempfile  # here, not at the top: commands that write nothing start 2 ms sooner

    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp",
                                   dir=path.parent)
    except OSError as e:
        raise cannot_write(path, e) from None
    try:
        os.chmod(tmp, mode)  # mkstemp makes 0600; weights and reports are meant to be read
        with os.fdopen(fd, "wb") as f:
            for piece in [data] if isinstance(data, bytes | bytearray) else data:
                f.write(piece)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        remove_temporaries(path.parent, only_dead=True)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise cannot_write(path, e) from None
        raise


@functools.cache
def _temporary():
    """The compiled pattern of write_atomically's temporaries (made when first needed: re is
    not imported on every command's start-up)."""

    return re.compile(r"\.(.+)\.(\d+)\.[a-z0-9_]{8}\.tmp")


def remove_temporaries(folder: str | Path, *, only_dead: bool = False) -> None:
    """Remove write_atomically's temporaries from `folder`: those whose writer process is
    gone (`only_dead`), or every one (the caller holds the folder: no one else writes there).
    Nothing else is touched, and a file that cannot be removed is left."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        m = _temporary().fullmatch(name) if name.endswith(".tmp") else None
        if m is None or (only_dead and _alive(int(m.group(2)))):
            continue
        try:
            os.unlink(os.path.join(folder, name))
        except OSError:
            pass  # gone already (a concurrent clean-up), or not ours to remove


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # another user's process (or a number no process has: left alone)
    return True


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


# A file that must be verified when read (a cache entry, a piece of the why index) is written
# with its checksum beside it, NAME.sha256, written right after it.

SUM = ".sha256"


def sum_file(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(path.name + SUM)


def write_checked(path: str | Path, data: bytes) -> None:
    """write_atomically, then the checksum beside it: a file whose checksum is missing or
    disagrees with its bytes (a kill between the two, an edit in place) is never trusted."""
    import hashlib

    write_atomically(path, data)
    write_atomically(sum_file(path), (hashlib.sha256(data).hexdigest() + "\n").encode())


def verified(path: str | Path) -> bool:
    """Whether a file's bytes match the checksum written with it (write_checked)."""
    try:
        return Path(path).is_file() and sha256(path) == sum_file(path).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return False


def discard(path: str | Path) -> None:
    """Remove a file and its checksum."""
    Path(path).unlink(missing_ok=True)
    sum_file(path).unlink(missing_ok=True)


def sha256(path: str | Path) -> str:
    import hashlib  # here, not at import: OpenSSL takes a while to load

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_json_object(path: str | Path, limit: int) -> dict:
    """The JSON object in a file of at most `limit` bytes (read no further: a lying file
    cannot make us hold more); ValueError saying what is wrong. OSError passes through."""
    with open(path, "rb") as f:
        raw = f.read(limit + 1)
    if len(raw) > limit:
        raise ValueError(f"larger than {limit:,} bytes")
    try:
        obj = json.loads(raw.decode("utf-8"))  # JSON and UTF-8 errors are ValueErrors
    except RecursionError:
        raise ValueError("nested too deeply") from None
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    return obj
