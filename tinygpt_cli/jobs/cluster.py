"""Where the corpus-wide work runs: on this machine (the default, the reference), or on a Dask
cluster (`tinygpt --cluster ADDRESS`, or $TINYGPT_CLUSTER; `--cluster local` starts one of
this machine's cores).

A job is a list of tasks, each a pure function of one shard of windows: `fn(task, shared)`,
where `task` carries the shard (its window range and its tokens) and `shared` what every task
of the job reads (the weights, the config, the query), sent once to each worker. Both engines
run the same functions on the same shards, so their answers are equal bit for bit; only where
the tasks run differs:

    Here     this machine: in this process ("here"), on threads ("threads"), or in a pool of
             processes ("processes": spawned, one BLAS thread each), as before the cluster
    Cluster  a dask.distributed Client: `shared` is a task of its own that each worker
             fetches once, the tasks are submitted IN_FLIGHT a worker ahead (the rest and
             their data wait here: a corpus never crosses the network at once), their
             results gathered as each finishes

Every worker process uses one BLAS thread (several workers spinning pools against each other
on the same cores ran four times slower). A task's own error (a damaged file) reaches the
caller as it was raised; a worker lost mid-task is the scheduler's to rerun elsewhere, and a
job that cannot finish ends with one error line. No wait is unbounded: a scheduler with no
workers, a lost scheduler, or a job whose next result does not come within the wait
(--cluster-wait SECONDS, $TINYGPT_CLUSTER_WAIT, default WAIT_SECONDS) ends with one line, and
Dask's own logging is kept off the terminal. Dask is an optional extra: without it,
--cluster says in one line what to install.

Importing this module imports nothing heavy (Dask only when a cluster is asked for).
"""

from __future__ import annotations

import logging
import math
import multiprocessing as mp
import os
import signal
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from typing import Any

from ..errors import InputError, WeightsError
from .threads import BLAS_VARS, cores, map_on_cores, use

ENV = "TINYGPT_CLUSTER"
LOCAL = "local"
INSTALL = 'pip install "tinygpt-cli[cluster]"'
CONNECT_SECONDS = 10
WAIT_ENV = "TINYGPT_CLUSTER_WAIT"
WAIT_SECONDS = 300.0  # the longest wait for a cluster's workers, or for a job's next result
IN_FLIGHT = 4  # tasks submitted a worker ahead: the rest (and their data) wait here
# A LocalCluster without its dashboard, and its scheduler's HTTP routes on a free loopback port
# (by default they take 8787, or warn that another cluster has it)
NO_DASHBOARD = {"dashboard_address": None,
                "scheduler_kwargs": {"dashboard": False, "dashboard_address": "127.0.0.1:0"}}

Task = Callable[[Any, Any], Any]  # fn(task, shared) -> result: a top-level function


def chosen(option: str | None, environ=os.environ) -> str | None:
    """The cluster asked for: --cluster, else $TINYGPT_CLUSTER, else None (this machine)."""
    value = option if option is not None else environ.get(ENV)
    value = (value or "").strip()
    return value or None


def wait_chosen(option: float | None, environ=os.environ) -> float:
    """The longest wait, in seconds: --cluster-wait, else $TINYGPT_CLUSTER_WAIT, else
    WAIT_SECONDS; InputError for what is not a positive number of seconds."""


    value = option if option is not None else environ.get(WAIT_ENV) or WAIT_SECONDS
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not 0 < seconds < math.inf:
        said = "--cluster-wait" if option is not None else f"${WAIT_ENV}"
        raise InputError(f"{said} {str(value)[:40]!r} is not a positive number of seconds")
    return seconds


def quiet_dask() -> None:
    """Dask's own log lines (a lost scheduler's "Failed to reconnect", a closed comm's
    traceback from asyncio) stay off the user's terminal: the command says what happened
    in its one error line."""

    # Dask gives its loggers levels of their own and a handler on "distributed", which the
    # records of distributed.client reach whatever the parent's level: every one is muted
    names = ("distributed", "tornado", "asyncio")
    for name in [n for n in logging.root.manager.loggerDict if n.startswith(names)] + \
            list(names):
        logger = logging.getLogger(name)
        logger.setLevel(logging.CRITICAL + 1)
        if name in names:
            logger.handlers.clear()
            logger.addHandler(logging.NullHandler())
            logger.propagate = False


# ------------------------------------------------------------------ inside a worker

_SHARED: dict = {}  # a pool process's `shared`, set once by its initializer


def one_thread() -> None:
    """One BLAS thread in this worker process, set once (later calls cost nothing)."""
    if not _SHARED.get("one thread"):

        use(1)
        _SHARED["one thread"] = True


def _pool_start(shared: Any) -> None:

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    one_thread()
    _SHARED["shared"] = shared


def _pool_call(item: tuple) -> tuple:
    i, fn, task = item
    return i, fn(task, _SHARED["shared"])


LOST = ("KilledWorker", "FutureCancelledError", "CancelledError", "CommClosedError")


def _shared(shared: Any) -> Any:
    return shared


def _dask_call(i: int, fn: Task, task: Any, shared: Any) -> tuple:
    one_thread()
    return i, fn(task, shared)


# ------------------------------------------------------------------ this machine


class Here:
    """This machine's cores, with no scheduler: the default, and the reference."""

    name = "this machine"

    def __init__(self, workers: int | None = None):

        self.workers = workers or cores()

    @contextmanager
    def job(self, shared: Any = None, spread: str = "here"):
        """A runner for one job's tasks: run(fn, tasks) yields (task index, result) as each
        finishes. spread: "here" (this process, in order), "threads" (NumPy releases the GIL:
        for tasks that are each large), "processes" (a spawned pool, started once for the
        job however many runs it makes)."""
        if spread == "processes":
            with _process_pool(shared, self.workers) as run:
                yield run
            return

        def run(fn: Task, tasks: list) -> Iterator[tuple[int, Any]]:
            if spread == "threads":

                yield from enumerate(map_on_cores(lambda t: fn(t, shared), tasks,
                                                  self.workers))
                return
            for i, task in enumerate(tasks):
                yield i, fn(task, shared)

        yield run


@contextmanager
def _process_pool(shared: Any, workers: int):
    """A spawned pool of `workers` processes, each with one BLAS thread and `shared`;
    Ctrl-C (or any error) stops them at once. A worker that dies mid-task (killed, out of
    memory) ends the job with one error line: concurrent.futures notices a lost worker, where
    multiprocessing.Pool waits for its task forever."""


    saved = {k: os.environ.get(k) for k in BLAS_VARS}
    os.environ.update({k: "1" for k in saved})  # read by each worker's BLAS as it starts
    try:
        pool = ProcessPoolExecutor(workers, mp.get_context("spawn"), _pool_start, (shared,))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def run(fn: Task, tasks: list) -> Iterator[tuple[int, Any]]:
        todo = iter(enumerate(tasks))
        pending: set = set()

        def submit() -> None:  # the next task, if any: a few a worker ahead, as on a cluster
            for item in todo:
                pending.add(pool.submit(_pool_call, (item[0], fn, item[1])))
                return

        for _ in range(IN_FLIGHT * workers):
            submit()
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                pending.discard(future)
                try:
                    result = future.result()
                except BrokenProcessPool:
                    raise WeightsError("a worker process of this machine's pool died (killed, "
                                       "out of memory, or it could not start); what it "
                                       "finished is kept: run again to finish the rest") \
                        from None
                submit()
                yield result

    try:
        yield run
    except BaseException:
        for process in list((pool._processes or {}).values()):  # no public way to stop them
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


# ------------------------------------------------------------------ a Dask cluster


class Cluster:
    """A dask.distributed cluster: its scheduler at `address`, or a LocalCluster started here
    (`local`: this machine's cores, one single-threaded worker process each, no dashboard)."""

    def __init__(self, address: str, workers: int | None = None,
                 wait: float = WAIT_SECONDS):


        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise InputError(f"--cluster needs Dask, which is not installed: {INSTALL}") \
                from None
        quiet_dask()
        self.local, self.wait = None, wait
        try:
            with warnings.catch_warnings():  # a version mismatch, a port in use: Dask's words
                warnings.simplefilter("ignore")
                if address == LOCAL:
                    self.local = LocalCluster(n_workers=workers or cores(),
                                              threads_per_worker=1, processes=True,
                                              host="127.0.0.1", silence_logs=logging.CRITICAL + 1,
                                              **NO_DASHBOARD)
                    self.client = Client(self.local)
                else:
                    self.client = Client(address, timeout=CONNECT_SECONDS)
        except Exception as e:  # noqa: BLE001 - whatever connecting raises (an address scheme
            # this Dask cannot use raises TypeError, ImportError, ValueError...): not reached
            self.close()
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise InputError(f"cannot reach the Dask scheduler at {address!r}: {reason[:200]} "
                             "(start one with `dask scheduler`, or give --cluster local)") \
                from None
        self.name = f"the cluster at {self.client.scheduler.address}"
        try:
            self.client.wait_for_workers(1, timeout=wait)
        except Exception:  # noqa: BLE001 - dask's TimeoutError, or the scheduler gone meanwhile
            self.close()
            raise InputError(f"the Dask scheduler at {address!r} has no workers (waited "
                             f"{wait:g} s, --cluster-wait): start some with `dask worker "
                             f"{address}`, or give --cluster local") from None
        self.workers = max(sum(w.get("nthreads", 1) for w in
                               self.client.scheduler_info()["workers"].values()), 1)

    def close(self) -> None:
        for part in (getattr(self, "client", None), self.local):
            if part is not None:
                try:
                    part.close(timeout=CONNECT_SECONDS)
                except Exception:  # noqa: BLE001, S110 - a scheduler already gone: nothing to close
                    pass

    def _stuck(self) -> Exception:
        """The error for a job whose next result did not come within the wait."""

        workers = None
        if self.client.status == "running":
            try:
                workers = self.client.scheduler_info()["workers"]
            except Exception:  # noqa: BLE001, S110 - the scheduler gone as we ask
                pass
        why = "lost its scheduler" if workers is None else \
            f"has had no workers for {self.wait:g} s (--cluster-wait)" if not workers else \
            f"finished no task in {self.wait:g} s (--cluster-wait)"
        return WeightsError(f"{self.name} {why}; what it finished is kept: run again to "
                            "finish the rest")

    @contextmanager
    def job(self, shared: Any = None, spread: str = "here"):
        """As Here.job; `spread` is this machine's business (every task goes to a worker).
        `shared` is a task of its own (not scattered data, which a lost worker takes with it
        for good): the scheduler holds it, each worker fetches it once, and it is made again
        when the worker holding it is lost."""
        from distributed import wait


        where = self.client.submit(_shared, shared, pure=False)
        pending: set = {where}

        def run(fn: Task, tasks) -> Iterator[tuple[int, Any]]:
            todo = iter(enumerate(tasks))
            running: set = set()

            def submit() -> None:  # the next task, if any: its data leaves only now
                for i, task in todo:
                    future = self.client.submit(_dask_call, i, fn, task, shared=where,
                                                pure=False)
                    pending.add(future)
                    running.add(future)
                    return

            for _ in range(IN_FLIGHT * self.workers):
                submit()
            while running:
                try:  # each result within the wait, or the job is stuck
                    done, _ = wait(running, timeout=self.wait, return_when="FIRST_COMPLETED")
                except Exception as e:  # noqa: BLE001 - dask's TimeoutError, or a lost comm
                    raise self._stuck() from e
                for future in done:
                    running.discard(future)
                    pending.discard(future)
                    try:
                        result = future.result()
                    except Exception as e:
                        if type(e).__name__ in LOST and self.client.status != "running":
                            raise self._stuck() from None  # the scheduler lost
                        if type(e).__name__ in LOST:  # a worker lost again and again, a cut link
                            raise WeightsError(f"{self.name} lost the workers running a task "
                                               f"({type(e).__name__}); what they finished is "
                                               "kept: run again to finish the rest") from None
                        raise
                    submit()
                    yield result

        try:
            yield run
        finally:
            try:
                self.client.cancel(list(pending))
            except Exception:  # noqa: BLE001, S110 - a scheduler gone takes its tasks with it
                pass


class Engine:
    """The engine for `address` (chosen()'s answer: None for this machine), connected on its
    first job (an answer found in the cache needs no cluster) and closed by engine()."""

    def __init__(self, address: str | None = None, workers: int | None = None,
                 wait: float = WAIT_SECONDS):
        self.address, self._workers, self._open, self.wait = address, workers, None, wait
        self.name = ("this machine" if address is None else "a LocalCluster of this "
                     "machine's cores" if address == LOCAL else f"the Dask cluster at {address}")

    def opened(self) -> Here | Cluster:
        if self._open is None:
            self._open = Here(self._workers) if self.address is None else \
                Cluster(self.address, self._workers, self.wait)
        return self._open

    @property
    def workers(self) -> int:
        return self.opened().workers

    @property
    def remote(self) -> bool:
        """Is the work to go to a cluster (not this machine)?"""
        return self.address is not None

    def job(self, shared: Any = None, spread: str = "here"):
        return self.opened().job(shared, spread)

    def close(self) -> None:
        if isinstance(self._open, Cluster):
            self._open.close()
        self._open = None


@contextmanager
def engine(address: str | None = None, workers: int | None = None,
           wait: float = WAIT_SECONDS):
    """The Engine for `address`: this machine when None, else the Dask cluster there
    (`local`: one started for the command, when it first has work, and stopped after it);
    `wait`, the longest wait for its workers or a job's next result."""
    found = Engine(address, workers, wait)
    try:
        yield found
    finally:
        found.close()


def in_order(results: Iterator[tuple[int, Any]], n: int,
             progress: Callable[[int, Any], None] | None = None) -> list:
    """The results of a run, in the tasks' order; progress(i, result) as each arrives."""
    out: list = [None] * n
    for i, result in results:
        out[i] = result
        if progress:
            progress(i, result)
    return out


def in_turn(results: Iterator[tuple[int, Any]]) -> Iterator[tuple[int, Any]]:
    """The results of a run in the tasks' order, each as soon as those before it are in."""
    early: dict = {}
    turn = 0
    for i, result in results:
        early[i] = result
        while turn in early:
            yield turn, early.pop(turn)
            turn += 1


SHARD = 256  # windows per task of an activation pass: a multiple of every pass's batch


def over_windows(engine, fn: Task, windows, shared: Any, *,
                 progress: Callable[[int], None] | None = None, shard: int | None = None
                 ) -> list:
    """fn((first, windows[first : first + shard]), shared) for each shard of `windows`
    [W, T], on `engine` (None: this process, one shard after another), the results in window
    order; progress(windows) as each shard finishes."""
    tasks = [(a, windows[a:b]) for a, b in spans(len(windows), shard or SHARD)]
    with (engine or Here(1)).job(shared) as run:
        return in_order(run(fn, tasks), len(tasks),
                        progress and (lambda i, _: progress(len(tasks[i][1]))))


def spans(n: int, size: int) -> list[tuple[int, int]]:
    """[start, stop) ranges of `size` covering range(n): the shards of n windows."""
    return [(a, min(a + size, n)) for a in range(0, n, size)]
