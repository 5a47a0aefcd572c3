"""The on-disk index of every training window's gradient at every snapshot (analysis.tracin's
math), built once per (weights history, training text), resumable, as shards that any worker
of a cluster can write and any query can read where they lie (tinygpt_cli.jobs.cluster).

Layout, in the cache folder `why-tracin/KEY/` (KEY: the data's and the snapshots' sha256,
the window length and the method's version), which may be shared storage:

    projection-S.npz        the directions fitted at snapshot S
    shard-S-A-B.npz         windows A .. B (CHUNK of them) of snapshot S: their gradients
                            (rows, u, m: bfloat16) and their tokens (uint16), one shard
    NAME.sha256             beside every piece: its sha256, written right after it
    index.json              written last: the index is complete. The manifest: the data's key,
                            each snapshot's file and projection, each shard's window range,
                            rows and sha256, the arrays' dtypes and shapes, and each piece's
                            size, inode and mtime when its checksum was last verified

The shards are uncompressed .npz files of .npy arrays: NumPy's own format, no new dependency,
each shard one file written whole and checked by one sha256 (the project's rule for every
cached piece), readable from any shared folder with plain file reads. A shard is small (a few
MB: a query task reads it whole), so neither memory-mapping nor Zarr's chunked stores (a
dependency, and checksums of their own kind) earn their place. The shards are never joined:
at the full TinyStories' 280 GB a join would be one machine copying the whole index.

Every file is written whole by files.write_atomically, so a build killed at any moment
(Ctrl-C, a full disk, SIGKILL, a lost worker) leaves only finished shards, and the next build
starts from them; a piece is trusted only when its bytes match the checksum written with it (a
damaged one is computed again). A complete index's pieces are verified again whenever their
size, inode or mtime differ from those index.json recorded (an edit in place, a copy). One
build at a time holds the folder (a lock on it); under the lock, temporaries left by a killed
build are removed.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import io
import json
import mmap
import os
import shutil
import struct
import threading
import zipfile
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..analysis import tracin
from ..analysis.exact_tracin import next_token_query
from ..errors import WriteError
from ..storage.cache import entry, key_of, npz_bytes
from ..storage.files import (
    discard,
    remove_temporaries,
    sha256,
    sum_file,
    verified,
    write_atomically,
    write_checked,
)
from ..transformer.config import Config
from ..transformer.folder import load_params
from ..transformer.windows import eval_windows
from .cluster import Here, in_order, spans
from .threads import map_on_cores

VERSION = "tracin-v5"  # v5: rank-one matrices and top chances (v4: Kronecker projections)
ARRAYS = ("rank1", "rows", "u", "m", "top_ids", "top_p")  # tracin.WindowGradients' fields
CHUNK = 256  # windows per shard: a few seconds of work, the most a Ctrl-C loses per worker
BATCH = 32  # windows per forward and backward pass


def index_key(data_key: str, snapshot_files: list[Path], config: Config) -> str:

    return key_of(VERSION, data_key, *(sha256(f) for f in snapshot_files), str(config),
                  str((sorted(tracin.SIZES.items()), tracin.FIT_WINDOWS,
                       tracin.PROJECTION_SEED)))


def mapped_arrays(path: str | Path) -> dict[str, np.ndarray]:
    """An uncompressed .npz's arrays, memory-mapped in place (read-only): a query reads every
    shard whole, and np.load would copy each array out of the zip and check its CRC-32 on the
    way, a fifth of a query's time on the shipped model's 2 GB index. The shard's bytes were
    checked against their sha256 when written and whenever their stamp changed
    (TracinIndex.drop_damaged), so the CRC adds nothing. A member that is compressed, or not
    a plain .npy array, is read by np.load instead."""

    out = {}
    with open(path, "rb") as f, zipfile.ZipFile(f) as z:
        for info in z.infolist():
            name = info.filename.removesuffix(".npy")
            f.seek(info.header_offset)
            local = f.read(30)
            if info.compress_type != zipfile.ZIP_STORED or len(local) < 30 or \
                    local[:4] != b"PK\x03\x04":
                return _loaded(path)
            start = info.header_offset + 30 + sum(struct.unpack("<HH", local[26:30]))
            f.seek(start)
            raw = f.read(12)  # the magic string, the version and the header's length
            raw += f.read(struct.unpack("<H", raw[8:10])[0] - 2 if raw[6:7] == b"\x01" else
                          struct.unpack("<I", raw[8:12])[0]) if len(raw) == 12 else b""
            found = _npy_header(raw)
            if found is None:
                return _loaded(path)
            shape, fortran, dtype = found
            if dtype.hasobject or fortran or len(raw) + dtype.itemsize * \
                    int(np.prod(shape)) > info.file_size:
                return _loaded(path)
            out[name] = (start + len(raw), shape, dtype)
        whole = _mapped(f)
    return {name: np.frombuffer(whole, dtype, int(np.prod(shape)), at).reshape(shape)
            for name, (at, shape, dtype) in out.items()}


@functools.lru_cache(maxsize=256)
def _npy_header(raw: bytes) -> tuple | None:
    """A .npy header's (shape, fortran order, dtype), or None when it is not one NumPy
    reads. Every shard's members have the same few headers, and NumPy parses each with
    Python's own parser: kept by their bytes, they are parsed once a process, not at every
    query's every member (a tenth of the shards' reading)."""
    fmt = np.lib.format
    f = io.BytesIO(raw)
    try:
        header = fmt.read_array_header_1_0 if fmt.read_magic(f) == (1, 0) \
            else fmt.read_array_header_2_0
        found = header(f)
    except ValueError:
        return None
    return found if f.tell() == len(raw) else None


def _mapped(f):
    """The whole file mapped read-only. (MAP_POPULATE, every page read in at once, made the
    shipped model's queries slower: 4.2-5.4 s against 3.4-3.7 s.)"""

    return mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)


def _loaded(path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return dict(z)


def _stamp(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_ino, st.st_mtime_ns]


def fit_windows(n_windows: int, seed: int = tracin.PROJECTION_SEED) -> np.ndarray:
    """The windows whose gradients choose the directions: a fixed seeded sample."""
    rng = np.random.default_rng(seed)
    return np.sort(rng.permutation(n_windows)[: min(tracin.FIT_WINDOWS, n_windows)])


# ------------------------------------------------------------------ the work, in a worker
#
# Each task is a pure function of its windows' tokens (carried in the task) and of the files it
# names (the snapshot it reads, the piece it writes): this machine's pool and a Dask cluster's
# workers run the same ones. A worker keeps the last weights and projections it read.

_KEPT: dict = {}  # (kind, path, size, mtime) -> the loaded weights or projection
_KEEP = 4


def _kept(kind: str, path: str, make: Callable):

    lock = _KEPT.setdefault("lock", threading.Lock())
    st = os.stat(path)
    key = (kind, path, st.st_size, st.st_mtime_ns)
    with lock:
        if key in _KEPT:
            return _KEPT[key]
    value = make()
    with lock:
        _KEPT[key] = value
        while len(_KEPT) > _KEEP + 1:  # the lock stays
            _KEPT.pop(next(k for k in _KEPT if k != "lock"))
    return value


def _params(path: str, config: Config) -> dict:

    return _kept("weights", path, lambda: {n: np.asarray(a, np.float32) for n, a in
                                           load_params(Path(path), config).items()})


def _projection(path: str) -> tracin.Projection:
    def load():
        with np.load(path) as z:
            return tracin.Projection.from_arrays(dict(z))

    return _kept("projection", path, load)


def build_task(task: tuple, config: dict) -> tuple:
    """One piece of the build: ("fit", s, weights, out, x, y) fits snapshot s's directions on
    the sample windows x, y; ("shard", s, c, weights, projection file, out, tokens) writes
    shard c of snapshot s: its windows' gradients and their tokens [w * T + 1]."""
    config = Config(**config)
    if task[0] == "fit":
        _, s, weights, out, x, y = task
        p = tracin.Projection.fit(_params(weights, config), config, x.astype(np.int64),
                                  y.astype(np.int64))
        write_checked(Path(out), npz_bytes(**p.arrays()))
        return task[0], s, 0
    _, s, c, weights, projection_file, out, tokens = task
    params, p = _params(weights, config), _projection(projection_file)
    x, y = eval_windows(tokens, config.n_positions)
    pieces = [tracin.window_gradients(params, config, x[i : i + BATCH], y[i : i + BATCH], p)
              for i in range(0, len(x), BATCH)]
    write_checked(Path(out), npz_bytes(tokens=np.asarray(tokens, np.uint16),
                                       **tracin.stored(pieces)))
    return task[0], s, len(x)


def score_task(task: list, shared: tuple) -> tuple:
    """A run of window ranges' scores, read where their shards lie: task [(c, first window,
    the shard file of each snapshot)], shared (the query of each snapshot, their learning
    rates or None, how many windows to keep or None, T) -> (windows [k], per snapshot [S, k]):
    the `keep` best by the sum over snapshots (every window when keep is None), in window
    order, ties to the earlier window."""
    found = [_shard_scores(item, shared) for item in task]
    windows = np.concatenate([w for w, _ in found])
    per = np.concatenate([p for _, p in found], axis=1)
    return _best(windows, per, shared[2])


def _shard_scores(item: tuple, shared: tuple) -> tuple[np.ndarray, np.ndarray]:
    """One window range: its windows' scores at each snapshot, its own `keep` best."""
    _, first, files = item
    queries, lrs, keep, t = shared
    per = []
    x = y = None
    for f, q in zip(files, queries, strict=True):
        z = mapped_arrays(f)
        if x is None:  # every snapshot's shard of the range holds the same windows
            x, y = eval_windows(np.asarray(z["tokens"]), t)
        per.append(tracin.scores({name: z[name] for name in ARRAYS}, x, y, q))
    per = np.stack(per)  # [S, w]
    if lrs is not None:
        per *= np.asarray(lrs)[:, None]
    return _best(np.arange(first, first + per.shape[1]), per, keep)


def _best(windows: np.ndarray, per: np.ndarray, keep: int | None):
    """The `keep` columns of the highest sum over snapshots (a stable sort: ties to the
    earlier column, so to the earlier window), in window order."""
    if keep is None or keep >= len(windows):
        return windows, per
    best = np.sort(np.argsort(-per.sum(axis=0), kind="stable")[:keep])
    return windows[best], per[:, best]


TASKS_PER_WORKER = 4  # a query's tasks: enough to balance, few enough to schedule quickly


def runs(items: list, n: int) -> list[list]:
    """items in n consecutive runs (fewer when there are fewer items), their lengths
    differing by one at most, the longer first."""
    n = max(min(n, len(items)), 1)
    size, extra = divmod(len(items), n)
    bounds = np.cumsum([0] + [size + (i < extra) for i in range(n)])
    return [items[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


# ------------------------------------------------------------------ building and reading


@dataclass
class TracinIndex:
    folder: Path
    n_windows: int
    snapshot_files: list[Path]
    data_key: str = ""
    shard_windows: int = CHUNK  # windows per shard
    built_now: int = 0  # windows x snapshots computed by this process's build
    _loaded: list = field(default_factory=list, repr=False)

    @property
    def complete(self) -> bool:
        return (self.folder / "index.json").is_file()

    def describe(self) -> dict:
        return {"method": "each weight matrix's gradient as its top rank-one part, the head's "
                          "from each position's top chances, the rest projected "
                          "(analysis/tracin.py)",
                "version": VERSION, "numbers_per_window": self._numbers(),
                "top_chances": tracin.TOP, "u_directions": tracin.K_U,
                "m_directions": tracin.K_M, "computed_now": self.built_now}

    def _numbers(self) -> int | None:
        """Numbers stored per window (every array of a shard but its tokens), from the
        first shard."""
        f = self.shard(0, 0) if self.n_windows else None
        if f is None or not f.is_file():
            return None
        with np.load(f) as z:
            return sum(z[n][0].size for n in ARRAYS)

    def spans(self) -> list[tuple[int, int]]:

        return spans(self.n_windows, self.shard_windows)

    def shard(self, s: int, c: int) -> Path:
        """Snapshot s's shard of the c-th window range, named by that range (so a build
        resumed with other shard sizes never takes one range's shard for another's)."""
        a, b = self.spans()[c]
        return self.folder / f"shard-{s}-{a}-{b}.npz"

    def build(self, stream: np.ndarray, config: Config, workers: int | None = None,
              progress: Callable[[int, int], None] | None = None, chunk: int | None = None,
              engine=None) -> None:
        """Compute what is missing, on `engine` (default: this machine's `workers` processes,
        every core). progress(done, total) is called as pieces finish (units: window
        gradients). One build at a time: a second one waits for the first, then finds the
        index complete."""

        self.shard_windows = chunk or self.shard_windows
        if self.complete:
            return
        prune_other_versions(self.folder.parent)
        self.folder.mkdir(parents=True, exist_ok=True)
        with holding(self.folder):
            if not self.complete:  # another build may have finished it meanwhile
                self._build(stream, config, progress, engine or Here(workers))

    def _build(self, stream, config, progress, engine) -> None:


        remove_temporaries(self.folder)  # under the lock, every one is a killed build's
        t, S = config.n_positions, len(self.snapshot_files)
        total, done, left = S * self.n_windows, 0, []
        for s in range(S):
            for c, (a, b) in enumerate(self.spans()):
                if verified(self.shard(s, c)):
                    done += b - a
                else:
                    discard(self.shard(s, c))
                    left.append((s, c, a, b))
        if progress:
            progress(done, total)
        sample = fit_windows(self.n_windows)  # their tokens alone (not every window's copy)
        x = np.stack([stream[w * t : w * t + t] for w in sample]).astype(np.uint16)
        y = np.stack([stream[w * t + 1 : w * t + t + 1] for w in sample]).astype(np.uint16)
        fits = [("fit", s, str(self.snapshot_files[s]), str(self._projection(s)), x, y)
                for s in range(S) if not verified(self._projection(s))]
        tasks = [("shard", s, c, str(self.snapshot_files[s]), str(self._projection(s)),
                  str(self.shard(s, c)), np.asarray(stream[a * t : b * t + 1], np.uint16))
                 for s, c, a, b in left]
        before = done
        with engine.job(asdict(config), spread="processes") as run:
            for phase in (fits, tasks):
                for _, (kind, _, n) in run(build_task, phase) if phase else ():
                    if kind == "shard":
                        done += n
                        if progress:
                            progress(done, total)
        self.built_now = done - before
        self._finish(config)
        keep = {f.name for s in range(S) for f in self._files(s)}
        for f in self.folder.glob("shard-*.npz"):  # an interrupted build's of other sizes
            if f.name not in keep:
                discard(f)

    def _finish(self, config: Config | None = None) -> None:
        """index.json, written last: the index is complete. Its manifest: what the index was
        computed from (the data's key, each snapshot's file and sha256), each shard's window
        range, rows, arrays and sha256, and each piece's stamp."""

        def checksum(f: Path) -> str:
            return sum_file(f).read_text().strip()

        S, spans = len(self.snapshot_files), self.spans()
        manifest = {"version": VERSION, "windows": self.n_windows, "snapshots": S,
                    "data": self.data_key, "shard_windows": self.shard_windows,
                    "format": {"file": "uncompressed .npz of .npy arrays, one per snapshot and "
                               "window range",
                               "rank1": "[windows, R] bfloat16: each weight matrix's u, then "
                               "v = G^T u, in the order of tracin.linear_sites",
                               "rows": "[windows, projected numbers] bfloat16: the position "
                               "table's, then each norm's",
                               "u": "[windows, T, u_directions] bfloat16",
                               "m": "[windows, T, m_directions] bfloat16",
                               "top_ids": "[windows, T, top_chances] uint16",
                               "top_p": "[windows, T, top_chances] bfloat16",
                               "tokens": "[windows * T + 1] uint16", "bfloat16": "stored as "
                               "uint16: the high half of float32"}}
        if config is not None:
            manifest["window_tokens"] = config.n_positions
        manifest["weights"] = [{"file": str(f), "projection": self._projection(s).name,
                                "projection_sha256": checksum(self._projection(s))}
                               for s, f in enumerate(self.snapshot_files)]
        manifest["shards"] = [{"file": self.shard(s, c).name, "snapshot": s, "windows": [a, b],
                               "rows": b - a, "sha256": checksum(self.shard(s, c))}
                              for s in range(S) for c, (a, b) in enumerate(spans)]
        manifest["stamps"] = {f.name: _stamp(f) for s in range(S) for f in self._files(s)}
        write_atomically(self.folder / "index.json", (json.dumps(manifest) + "\n").encode())

    def drop_damaged(self) -> None:
        """A built index's pieces, each checked against the checksum written with it when its
        size, inode or mtime are not those index.json recorded (an edit in place, a copy:
        then recorded anew); the damaged ones are removed with index.json, so build()
        computes just them again: never a failure, nor a wrong score, on a later query."""

        if not self.complete:
            return
        try:
            recorded = json.loads((self.folder / "index.json").read_text())
            stamps = recorded.get("stamps")
            self.shard_windows = int(recorded.get("shard_windows", self.shard_windows)) or 1
        except (OSError, ValueError, AttributeError, RecursionError, TypeError):
            stamps = None
        stamps = stamps if isinstance(stamps, dict) else {}
        files = [f for s in range(len(self.snapshot_files)) for f in self._files(s)]
        seen = {f: f.is_file() and stamps.get(f.name) == _stamp(f) for f in files}
        bad = [f for f, fresh in seen.items() if not fresh and not verified(f)]
        if bad:
            (self.folder / "index.json").unlink(missing_ok=True)
            for f in bad:
                discard(f)
        elif not all(seen.values()):
            try:
                self._finish()
            except WriteError:
                pass  # a read-only cache: verified again next time

    def _projection(self, s: int) -> Path:
        return self.folder / f"projection-{s}.npz"

    def _files(self, s: int) -> list[Path]:
        return [self._projection(s), *(self.shard(s, c) for c in range(len(self.spans())))]

    def queries(self, params_list: list[dict], config: Config, ids: list[int], target: int,
                hooks=None, workers: int | None = None) -> list:
        """The query's gradient in each snapshot's terms (tracin.query), the text run through
        `hooks`, the snapshots on every core."""

        exact = map_on_cores(lambda p: next_token_query(p, config, ids, target, hooks),
                             params_list, workers)
        return self.in_index_terms(exact, config, workers)

    def in_index_terms(self, exact: list, config: Config, workers: int | None = None) -> list:
        """Each snapshot's exact_tracin.Query in that snapshot's index terms (its fitted
        directions), for a caller that needs the exact gradients too (why.influence)."""

        def one(s: int):
            with np.load(self._projection(s)) as z:
                p = tracin.Projection.from_arrays(dict(z))
            return tracin.query(exact[s], config, p)

        return map_on_cores(one, range(len(exact)), workers)

    def _score(self, queries: list, lrs, keep: int | None, config: Config, engine,
               progress=None) -> list[tuple]:
        """score_task on every window range, where its shards lie: on a cluster the ranges in
        runs, TASKS_PER_WORKER tasks a worker (a task costs a round trip to schedule), their
        lengths differing by one at most (49 ranges in runs of 7 would be 7 tasks, 4 for one
        of two workers and 3 for the other); on this machine one range a task, each thread
        taking the next as it finishes (the last to finish waits for one range at most);
        progress(ranges done, ranges) as the tasks finish."""

        ranges = [(c, a, [str(self.shard(s, c)) for s in range(len(queries))])
                  for c, (a, _) in enumerate(self.spans())]
        tasks = runs(ranges, len(ranges) if isinstance(engine, Here) else
                     TASKS_PER_WORKER * engine.workers)
        done = [0]

        def step(i: int, _) -> None:
            done[0] += len(tasks[i])
            if progress:
                progress(done[0], len(ranges))

        with engine.job((queries, lrs, keep, config.n_positions), spread="threads") as run:
            return in_order(run(score_task, tasks), len(tasks), step)

    def scores(self, params_list: list[dict], config: Config, x: np.ndarray, y: np.ndarray,
               ids: list[int], target: int, hooks=None, workers: int | None = None,
               engine=None) -> np.ndarray:
        """Every window's approximate <window gradient, query gradient>, per snapshot, the
        text run through `hooks`, on `engine` (default: this machine, every core).  -> [S, W]
        (not yet weighted by the learning rates)"""

        if not params_list:
            return np.zeros((0, len(x)))
        queries = self.queries(params_list, config, ids, target, hooks, workers)
        found = self._score(queries, None, None, config, engine or Here(workers))
        return np.concatenate([per for _, per in found], axis=1)

    def best(self, queries: list, lrs: np.ndarray, keep: int, config: Config, engine,
             progress=None) -> tuple[np.ndarray, np.ndarray]:
        """The `keep` best windows by the learning-rate-weighted sum of their scores over the
        snapshots: each window range keeps its own best where it lies, each task the best of
        its ranges', only those cross the network, and the best of them are the best of all
        (ties to the earlier window). -> (windows [n], per snapshot [S, n]), in window order,
        n >= keep (or every window)."""
        found = self._score(queries, lrs, keep, config, engine, progress)
        return (np.concatenate([w for w, _ in found]),
                np.concatenate([per for _, per in found], axis=1))


@contextmanager
def holding(folder: Path):
    """An exclusive lock on the index folder while a build writes into it (flock on the
    folder itself: no lock file to leave behind); released when the process ends."""

    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def prune_other_versions(parent: Path) -> None:
    """Remove whole indexes of another format (an older tinygpt's: nearly 1 GB each for the
    shipped model), which this version can never read, before building a new one."""

    for index_file in parent.glob("*/index.json"):
        try:
            version = json.loads(index_file.read_text()).get("version")
        except (OSError, ValueError, AttributeError):
            continue  # not ours to judge
        if version != VERSION:
            shutil.rmtree(index_file.parent, ignore_errors=True)


def index_folder(data_key: str, snapshot_files: list[Path], config: Config) -> Path:

    return entry("why-tracin", index_key(data_key, snapshot_files, config), suffix="")


def cannot_keep(folder: Path, e: OSError):

    return WriteError(f"cannot write the gradient index {folder}: {e.strerror or e}; why keeps "
                      "it in the cache folder (set TINYGPT_CACHE to a writable one)")


def writable_index(folder: Path) -> None:
    """A complete index is only read; one still to build needs its folder writable: else
    WriteError (exit 1), one line saying where the index goes."""

    if (folder / "index.json").is_file():
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not os.access(folder, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
    except OSError as e:
        raise cannot_keep(folder, e) from None


def open_index(data_key: str, snapshot_files: list[Path], config: Config,
               n_windows: int, folder: Path | None = None) -> TracinIndex:
    """The index of these windows at these snapshots; `folder`: its index_folder, when the
    caller has it already (its key hashes every snapshot file)."""

    folder = folder or index_folder(data_key, snapshot_files, config)
    index = TracinIndex(folder, n_windows, list(snapshot_files), data_key)
    index.drop_damaged()
    return index
