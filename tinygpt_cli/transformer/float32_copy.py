"""A float32 copy of a large model whose file is not already the model (bfloat16 or float16
numbers to widen, matrices to transpose), kept in the cache folder and mapped by later
commands instead of made again.

Widening Gemma-3-270M's 536 MB of bfloat16 makes 1 GB of new memory in every process: 0.7 s
of each command's start, and on a virtual machine whose host takes freed memory back, 0.5 to
2.2 s of kernel time on some runs for the same page faults (benchmarks/results.md, issue 48).
A copy mapped from the page cache needs no new memory. It is made by the first command that
loads the model, once it is at least COPY_FROM bytes of float32 the load had to make (smaller
ones widen faster than a copy saves): said in one line on stderr, then written while the
command goes on. Its name is a key of what it was made from (the paths, sizes, times and
inodes of the weights files and config.json, and this layout's version), so a changed model
never reads a stale copy; copies whose model is gone are removed when a new one is written.
TINYGPT_FLOAT32_COPY=0 turns it off.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..errors import WeightsError, WriteError
from ..storage.cache import cache_dir, key_of, note
from ..storage.files import cannot_write, write_atomically
from ..storage.safetensors import header_json, read_safetensors, safetensors_chunks
from .config import Config
from .schema import param_shapes

COPY_FROM = 256 << 20  # bytes of float32 a load made
LAYOUT = "1"  # the canonical parameters' layout: a new one makes every copy stale
KIND = "float32"  # cache_dir()/float32/KEY.safetensors
IN_BACKGROUND = True  # the copy written while the command runs (keep)


def wanted() -> bool:
    return os.environ.get("TINYGPT_FLOAT32_COPY", "1") != "0"


def source_of(files: list[Path]) -> list[str]:
    """What a copy was made from, file by file: path, size, modification time and inode
    (a file replaced or written again changes one of them)."""
    out = []
    for p in files:
        st = p.stat()
        out.append(f"{p.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}")
    return out


def copy_path(files: list[Path], family_name: str) -> Path:
    return cache_dir() / KIND / f"{key_of(LAYOUT, family_name, *source_of(files))}.safetensors"


def made_bytes(params: dict[str, np.ndarray]) -> int:
    """Bytes of the parameters the load made (writable arrays); the file's own float32
    tensors are read-only views of it."""
    return sum(a.nbytes for a in params.values() if a.flags.writeable)


def read_copy(path: Path, config: Config) -> dict[str, np.ndarray] | None:
    """The copy's parameters over the mapped file, or None when there is none or it is not
    this model's (every name and shape of the config, float32): a damaged copy is made
    again, never an error."""
    if not path.is_file():
        return None
    try:
        tensors, _ = read_safetensors(path)
    except WeightsError:
        return None
    return tensors if is_the_model(tensors, config) else None


def is_the_model(params: dict[str, np.ndarray], config: Config) -> bool:
    """Every parameter of the config by name and shape, float32, and nothing else."""
    shapes = param_shapes(config)
    return set(params) == set(shapes) and all(
        params[n].dtype == np.float32 and params[n].shape == s for n, s in shapes.items())


def loaded(files: list[Path], config: Config, family_name: str,
           load: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The model's parameters: from its float32 copy when there is one, else load() (and a
    copy kept when the load made COPY_FROM bytes or more)."""
    if not wanted():
        return load()
    try:
        path = copy_path(files, family_name)
    except OSError:
        return load()
    found = read_copy(path, config)
    if found is not None:
        return found
    params = load()
    if made_bytes(params) >= COPY_FROM and is_the_model(params, config):
        keep(path, params, files)
    return params


def keep(path: Path, params: dict[str, np.ndarray], files: list[Path]) -> None:
    """write_copy on a thread of its own when IN_BACKGROUND: the command goes on with its
    work while the file is written and flushed to disk (a gigabyte: seconds of waiting on the
    disk, not on a core). The process waits for it before it exits (atexit: the console
    script runs the exit functions before its os._exit), so a copy is never left half made
    by our own exit; a killed process leaves only a temporary file, removed by the next
    write into the folder."""
    try:  # a cache that cannot take it is found now: one note, not two
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        note(f"note: {cannot_write(path, e)}; the model's float32 copy is not kept (set "
             "TINYGPT_CACHE to a writable folder, or TINYGPT_FLOAT32_COPY=0)")
        return
    size = sum(a.nbytes for a in params.values())
    # said now, before the command shows anything, not from the writer in the middle of it
    note(f"note: keeping a float32 copy of this model ({size / 2**30:.1f} GB) in "
         f"{path.parent}: later commands map it instead of widening the weights again "
         "(TINYGPT_FLOAT32_COPY=0 turns this off)")
    if not IN_BACKGROUND:
        write_copy(path, params, files)
        return
    import atexit
    import threading

    writer = threading.Thread(target=write_copy, args=(path, params, files),
                              name="float32 copy", daemon=True)
    writer.start()
    atexit.register(writer.join)


def write_copy(path: Path, params: dict[str, np.ndarray], files: list[Path]) -> None:
    """Write the copy (atomically, a tensor at a time), say so, and remove the copies whose
    model is gone or changed. A cache that cannot take it loses only that: one note."""
    meta = {"tinygpt_float32_copy": LAYOUT, "made_from": json.dumps(source_of(files))}
    try:
        write_atomically(path, safetensors_chunks(params, meta))
    except WriteError as e:
        note(f"note: {e}; the model's float32 copy is not kept (set TINYGPT_CACHE to a "
             "writable folder, or TINYGPT_FLOAT32_COPY=0)")
        return
    remove_stale(path.parent, keep_name=path.name)


def remove_stale(folder: Path, keep_name: str) -> None:
    """Copies whose model file is gone or changed (the copy's own record of what it was made
    from): no later command can read them."""
    for other in folder.glob("*.safetensors"):
        if other.name == keep_name:
            continue
        try:
            header = header_json(other, 1 << 20)[0]
            made_from = json.loads(header.get("__metadata__", {}).get("made_from", "null"))
            current = source_of([Path(s.split("|", 1)[0]) for s in made_from])
        except (OSError, ValueError, TypeError, AttributeError, WeightsError):
            current, made_from = None, ()
        if current != made_from:
            with contextlib.suppress(OSError):
                other.unlink()

