"""An activation cache kept as shards with a manifest: what a pass over a corpus computes per
window (an SAE's or a transcoder's codes at every token), one file per shard of windows, so
that a pass killed at any moment, or run on a cluster whose worker is lost, loses only the
shards in flight, and the next run computes just the rest.

Layout, in the cache folder `KIND/KEY/` (KEY: the sha256 of everything the values depend on):

    shard-A-B.npz        windows A .. B: their arrays (an uncompressed .npz, cache.npz_bytes)
    shard-A-B.npz.sha256 its checksum, written right after it (files.write_checked)
    index.json           written last: the cache is complete. The manifest: the key, the
                         windows, and each shard's window range, rows (of its first array:
                         the windows' tokens), file, sha256 and its arrays' dtypes and shapes

The same format as `why`'s index (jobs.why_index), for the same reasons: NumPy's own
files, each checked by one sha256, readable from any shared folder with plain reads. The
tasks run on the engine (tinygpt_cli.jobs.cluster) and send their arrays back; this process writes
each shard as it arrives, so no shared folder is needed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..storage.cache import keep, load_arrays, npz_bytes
from ..storage.files import sum_file, verified
from . import cluster
from .cluster import Here, in_order, spans

FORMAT = "tinygpt-shards-v1"
MANIFEST = "index.json"

Valid = Callable[[dict, int], bool]  # valid(arrays, windows in the shard)


def shard_name(a: int, b: int) -> str:
    return f"shard-{a}-{b}.npz"


def _read_shard(path: Path, windows: int, valid: Valid) -> dict | None:
    """A shard's arrays when its bytes match its checksum and `valid` accepts them, else None
    (a damaged or stale shard is computed again: it is only a cache)."""

    if not verified(path):
        return None
    try:
        arrays = load_arrays(path)
    except Exception:  # noqa: BLE001 - whatever a damaged file raises
        return None
    return arrays if valid(arrays, windows) else None


def read_complete(folder: Path, key: str, valid: Valid) -> list[dict] | None:
    """The shards of a complete cache (its manifest names this key, every shard is verified
    and valid), in window order; None when any of that is not so."""

    manifest = folder / MANIFEST
    if not verified(manifest):
        return None
    try:
        doc = json.loads(manifest.read_text())
        if doc.get("format") != FORMAT or doc.get("key") != key:
            return None
        spans = [tuple(s["windows"]) for s in doc["shards"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    out = []
    for a, b in spans:
        arrays = _read_shard(folder / shard_name(a, b), b - a, valid)
        if arrays is None:
            return None
        out.append(arrays)
    return out


def computed(folder: Path, key: str, windows: np.ndarray, fn, shared: Any, valid: Valid, *,
             engine=None, progress: Callable[[int], None] | None = None,
             shard: int | None = None) -> list[dict]:
    """fn((first, windows[first : first + shard]), shared) -> {name: array} for each shard
    of `windows` [W, T] that the folder does not already hold (verified and valid), on
    `engine` (None: this process); each written as it arrives, the manifest last. The
    shards' arrays in window order; progress(windows) as each shard is read or computed."""

    parts = spans(len(windows), shard or cluster.SHARD)  # read when run: tests set it
    found: dict[int, dict] = {}
    for i, (a, b) in enumerate(parts):
        arrays = _read_shard(folder / shard_name(a, b), b - a, valid)
        if arrays is not None:
            found[i] = arrays
            if progress:
                progress(b - a)
    todo = [i for i in range(len(parts)) if i not in found]
    entries: dict[int, dict] = {}
    writable = [True]  # an unwritable cache: one note (keep's), not one a shard

    def arrived(j: int, arrays: dict) -> None:
        a, b = parts[todo[j]]
        if writable[0]:
            writable[0] = keep(folder / shard_name(a, b), npz_bytes(**arrays))
        entries[todo[j]] = arrays
        if progress:
            progress(b - a)

    if todo:

        tasks = [(parts[i][0], windows[slice(*parts[i])]) for i in todo]
        with (engine or Here(1)).job(shared) as run:
            in_order(run(fn, tasks), len(tasks), arrived)
    shards = [found.get(i, entries.get(i)) for i in range(len(parts))]
    if writable[0]:
        keep(folder / MANIFEST, json.dumps(_manifest(folder, key, parts, shards), indent=1)
             .encode())
    return shards


def _manifest(folder: Path, key: str, parts: list[tuple[int, int]], shards: list[dict]
              ) -> dict:

    def checksum(a: int, b: int) -> str:
        try:
            return sum_file(folder / shard_name(a, b)).read_text().strip()
        except OSError:
            return ""  # not kept (an unwritable cache): the manifest says so

    return {"format": FORMAT, "key": key, "windows": parts[-1][1] if parts else 0,
            "shards": [{"windows": [a, b], "file": shard_name(a, b), "sha256": checksum(a, b),
                        "rows": int(len(next(iter(arrays.values())))) if arrays else 0,
                        "arrays": {k: {"dtype": str(v.dtype), "shape": list(v.shape)}
                                   for k, v in arrays.items()}}
                       for (a, b), arrays in zip(parts, shards, strict=True)]}

