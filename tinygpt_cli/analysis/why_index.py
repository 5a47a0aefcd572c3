"""The on-disk index of every training window's gradient at every snapshot (analysis.tracin),
built once per (weights history, training text), on every core, resumable.

Layout, in the cache folder `why-tracin/KEY/` (KEY: the data's and the snapshots' sha256,
the window length and the method's version):

    projection-S.npz        the directions fitted at snapshot S
    chunk-S-C.npz           windows C*CHUNK .. of snapshot S (while building)
    rows-S.npy, u-S.npy, m-S.npy      snapshot S, whole (once its chunks are in), bfloat16
    NAME.sha256             beside every piece: its sha256, written right after it
    index.json              written last: the index is complete (and each piece's size,
                            inode and mtime when its checksum was last verified)

Every file is written whole by files.write_atomically, so a build killed at any moment
(Ctrl-C, a full disk, SIGKILL) leaves only finished pieces, and the next build starts from
them; a piece is trusted only when its bytes match the checksum written with it (a damaged
one is computed again). A complete index's pieces are verified again whenever their size,
inode or mtime differ from those index.json recorded (an edit in place, a copy). One build
at a time holds the folder (a lock on it); under the lock, temporaries left by a killed
build are removed.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..config import Config
from ..corpus import eval_windows
from ..files import discard, verified, write_checked
from . import tracin

VERSION = "tracin-v3"  # v3: bfloat16 arrays (v2: float16)
ARRAYS = ("rows", "u", "m")  # tracin.WindowGradients' fields, stored per snapshot
CHUNK = 256  # windows per task: a few seconds of work, the most a Ctrl-C loses per process
BATCH = 32  # windows per forward and backward pass


def index_key(data_key: str, snapshot_files: list[Path], config: Config) -> str:
    from ..cache import key_of
    from ..files import sha256

    return key_of(VERSION, data_key, *(sha256(f) for f in snapshot_files), str(config),
                  str((tracin.K_MATRIX, tracin.K_TABLE, tracin.K_VECTOR, tracin.K_POSITION,
                       tracin.FIT_WINDOWS, tracin.PROJECTION_SEED)))


def _npy_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def _npz_bytes(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _stamp(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_ino, st.st_mtime_ns]


def fit_windows(n_windows: int, seed: int = tracin.PROJECTION_SEED) -> np.ndarray:
    """The windows whose gradients choose the directions: a fixed seeded sample."""
    rng = np.random.default_rng(seed)
    return np.sort(rng.permutation(n_windows)[: min(tracin.FIT_WINDOWS, n_windows)])


# ------------------------------------------------------------------ the work, in a process

_WORKER: dict = {}  # per process: the snapshot whose weights are loaded, and the stream


def _init_worker(stream_file: str, config: dict) -> None:
    """A worker's start. It never raises: a pool respawns a worker whose initializer fails,
    forever; the failure is kept instead, and the worker's first task raises it, which ends
    the build with one error line."""
    import signal

    from ..threads import use

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    try:
        # One BLAS thread a process: NumPy is loaded already (this module imports it), so the
        # environment set at spawn may come too late; two processes each spinning a pool of
        # two on two cores ran four times slower than this.
        use(1)
        _WORKER["stream"] = np.load(stream_file, mmap_mode="r")
        _WORKER["config"] = Config(**config)
    except Exception as e:  # noqa: BLE001 - whatever a damaged stream raises
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        _WORKER["failed"] = f"{stream_file}: {reason}"


def _params(path: str) -> dict:
    from ..weights import load_params

    if _WORKER.get("path") != path:
        config = _WORKER["config"]
        _WORKER["params"] = {n: np.asarray(a, np.float32)
                             for n, a in load_params(Path(path), config).items()}
        _WORKER["path"] = path
        _WORKER.pop("projection", None)
    return _WORKER["params"]


def run_task(task: tuple) -> tuple:
    """One piece of the build: ("fit", s, weights, out) or
    ("chunk", s, c, chunk size, weights, projection file, out)."""
    from ..errors import WeightsError

    if "failed" in _WORKER:
        raise WeightsError(f"a worker of the gradient index could not start: "
                           f"{_WORKER['failed']}")
    config, stream = _WORKER["config"], _WORKER["stream"]
    x, y = eval_windows(stream, config.n_positions)
    if task[0] == "fit":
        _, s, weights, out = task
        sample = fit_windows(len(x))
        p = tracin.Projection.fit(_params(weights), config, x[sample], y[sample])
        write_checked(Path(out), _npz_bytes(**p.arrays()))
        return task[0], s, 0
    _, s, c, chunk, weights, projection_file, out = task
    params = _params(weights)
    if _WORKER.get("projection_file") != projection_file or "projection" not in _WORKER:
        with np.load(projection_file) as z:
            _WORKER["projection"] = tracin.Projection.from_arrays(dict(z))
        _WORKER["projection_file"] = projection_file
    p = _WORKER["projection"]
    part = slice(c * chunk, min((c + 1) * chunk, len(x)))
    batches = [slice(i, min(i + BATCH, part.stop)) for i in range(part.start, part.stop, BATCH)]
    pieces = [tracin.window_gradients(params, config, x[b], y[b], p) for b in batches]
    write_checked(Path(out), _npz_bytes(**{
        name: tracin.to_bfloat16(np.concatenate([getattr(g, name) for g in pieces]))
        for name in ARRAYS}))
    return task[0], s, part.stop - part.start


# ------------------------------------------------------------------ building and reading


@dataclass
class TracinIndex:
    folder: Path
    n_windows: int
    snapshot_files: list[Path]
    built_now: int = 0  # windows x snapshots computed by this process's build
    _loaded: list = field(default_factory=list, repr=False)

    @property
    def complete(self) -> bool:
        return (self.folder / "index.json").is_file()

    def describe(self) -> dict:
        return {"method": "projected per-window gradients (analysis/tracin.py)",
                "version": VERSION, "numbers_per_window": self._dim(),
                "position_directions": tracin.K_POSITION,
                "computed_now": self.built_now}

    def _dim(self) -> int | None:
        f = self.folder / "projection-0.npz"
        if not f.is_file():
            return None
        with np.load(f) as z:
            return tracin.Projection.from_arrays(dict(z)).dim

    def build(self, stream: np.ndarray, config: Config, workers: int | None = None,
              progress: Callable[[int, int], None] | None = None, chunk: int = CHUNK) -> None:
        """Compute what is missing, with `workers` processes (default: every core).
        progress(done, total) is called as pieces finish (units: window gradients). One
        build at a time: a second one waits for the first, then finds the index complete."""
        if self.complete:
            return
        prune_other_versions(self.folder.parent)
        self.folder.mkdir(parents=True, exist_ok=True)
        with holding(self.folder):
            if not self.complete:  # another build may have finished it meanwhile
                self._build(stream, config, workers, progress, chunk)

    def _build(self, stream, config, workers, progress, chunk) -> None:
        from ..files import remove_temporaries

        remove_temporaries(self.folder)  # under the lock, every one is a killed build's
        stream_file = self.folder / "stream.npy"
        if not verified(stream_file):
            write_checked(stream_file, _npy_bytes(np.asarray(stream, np.uint16)))
        n_chunks = -(-self.n_windows // chunk)
        S = len(self.snapshot_files)
        total = S * self.n_windows
        whole = {s for s in range(S) if all(verified(f) for f in self._files(s)[1:])}
        done = len(whole) * self.n_windows
        chunks_left = []
        for s in sorted(set(range(S)) - whole):
            for c in range(n_chunks):
                if verified(self.folder / f"chunk-{s}-{c}.npz"):
                    done += min(chunk, self.n_windows - c * chunk)
                else:
                    discard(self.folder / f"chunk-{s}-{c}.npz")
                    chunks_left.append((s, c))
        if progress:
            progress(done, total)
        fits = [("fit", s, str(self.snapshot_files[s]), str(self._files(s)[0]))
                for s in range(S) if not verified(self._files(s)[0])]
        tasks = [("chunk", s, c, chunk, str(self.snapshot_files[s]), str(self._files(s)[0]),
                  str(self.folder / f"chunk-{s}-{c}.npz")) for s, c in chunks_left]
        before = done
        for kind, _, n in _run_all([fits, tasks], str(stream_file), config, workers):
            if kind == "chunk":
                done += n
                if progress:
                    progress(done, total)
        self.built_now = done - before
        for s in sorted(set(range(S)) - whole):
            self._join(s, n_chunks)
        self._finish()
        discard(stream_file)

    def _finish(self) -> None:
        """index.json, written last: the index is complete; with each piece's stamp."""
        from ..files import write_atomically

        S = len(self.snapshot_files)
        stamps = {f.name: _stamp(f) for s in range(S) for f in self._files(s)}
        write_atomically(self.folder / "index.json", (json.dumps(
            {"version": VERSION, "windows": self.n_windows, "snapshots": S,
             "stamps": stamps}) + "\n").encode())

    def drop_damaged(self) -> None:
        """A built index's pieces, each checked against the checksum written with it when its
        size, inode or mtime are not those index.json recorded (an edit in place, a copy:
        then recorded anew); the damaged ones are removed with index.json, so build()
        computes just them again: never a failure, nor a wrong score, on a later query."""
        from ..errors import WriteError

        if not self.complete:
            return
        try:
            stamps = json.loads((self.folder / "index.json").read_text()).get("stamps")
        except (OSError, ValueError, AttributeError, RecursionError):
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

    def _files(self, s: int) -> list[Path]:
        return [self.folder / f"projection-{s}.npz",
                *(self.folder / f"{n}-{s}.npy" for n in ARRAYS)]

    def _join(self, s: int, n_chunks: int) -> None:
        """Snapshot s's chunks, joined into one file per array (then the chunks go)."""
        parts = []
        for c in range(n_chunks):
            with np.load(self.folder / f"chunk-{s}-{c}.npz") as z:
                parts.append({k: z[k] for k in ARRAYS})
        for name in ARRAYS:
            write_checked(self.folder / f"{name}-{s}.npy",
                          _npy_bytes(np.concatenate([p[name] for p in parts])))
        for c in range(n_chunks):
            discard(self.folder / f"chunk-{s}-{c}.npz")

    def scores(self, params_list: list[dict], config: Config, x: np.ndarray, y: np.ndarray,
               ids: list[int], target: int, hooks=None, workers: int | None = None
               ) -> np.ndarray:
        """Every window's approximate <window gradient, query gradient>, per snapshot, the
        text run through `hooks`, the snapshots on every core.  -> [S, W] (not yet weighted
        by the learning rates)"""
        from ..threads import map_on_cores

        def one(s: int) -> np.ndarray:
            with np.load(self.folder / f"projection-{s}.npz") as z:
                p = tracin.Projection.from_arrays(dict(z))
            q = tracin.query(params_list[s], config, p, ids, target, config.n_positions, hooks)
            arrays = {n: np.load(self.folder / f"{n}-{s}.npy", mmap_mode="r") for n in ARRAYS}
            return tracin.scores(arrays["rows"], arrays["u"], arrays["m"], x, y, q)

        return np.stack(map_on_cores(one, range(len(params_list)), workers)) \
            if params_list else np.zeros((0, len(x)))


@contextmanager
def holding(folder: Path):
    """An exclusive lock on the index folder while a build writes into it (flock on the
    folder itself: no lock file to leave behind); released when the process ends."""
    import fcntl

    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def prune_other_versions(parent: Path) -> None:
    """Remove whole indexes of another format (an older tinygpt's: nearly 1 GB each for the
    shipped model), which this version can never read, before building a new one."""
    import shutil

    for index_file in parent.glob("*/index.json"):
        try:
            version = json.loads(index_file.read_text()).get("version")
        except (OSError, ValueError, AttributeError):
            continue  # not ours to judge
        if version != VERSION:
            shutil.rmtree(index_file.parent, ignore_errors=True)


def _run_all(phases: list[list[tuple]], stream_file: str, config: Config,
             workers: int | None):
    """Run each phase's tasks to the end before the next, in worker processes that each use
    one BLAS thread (two processes on two cores beat one with two threads: the batches are
    small products); yields each result as it finishes. Ctrl-C stops the workers at once."""
    import multiprocessing as mp
    from dataclasses import asdict

    from ..threads import cores

    workers = workers or cores()
    todo = [p for p in phases if p]
    if not todo:
        return
    saved = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                            "MKL_NUM_THREADS")}
    os.environ.update({k: "1" for k in saved})  # read by each worker's BLAS as it starts
    try:
        pool = mp.get_context("spawn").Pool(
            min(workers, max(len(p) for p in todo)), _init_worker,
            (stream_file, asdict(config)))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        for phase in todo:
            yield from pool.imap_unordered(run_task, phase)
        pool.close()
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()


def index_folder(data_key: str, snapshot_files: list[Path], config: Config) -> Path:
    from ..cache import entry

    return entry("why-tracin", index_key(data_key, snapshot_files, config), suffix="")


def cannot_keep(folder: Path, e: OSError):
    from ..errors import WriteError

    return WriteError(f"cannot write the gradient index {folder}: {e.strerror or e}; why keeps "
                      "it in the cache folder (set TINYGPT_CACHE to a writable one)")


def writable_index(folder: Path) -> None:
    """A complete index is only read; one still to build needs its folder writable: else
    WriteError (exit 1), one line saying where the index goes."""
    import errno

    if (folder / "index.json").is_file():
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not os.access(folder, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
    except OSError as e:
        raise cannot_keep(folder, e) from None


def open_index(data_key: str, snapshot_files: list[Path], config: Config,
               n_windows: int) -> TracinIndex:
    from ..cache import entry

    key = index_key(data_key, snapshot_files, config)
    index = TracinIndex(entry("why-tracin", key, suffix=""), n_windows, list(snapshot_files))
    index.drop_damaged()
    return index
