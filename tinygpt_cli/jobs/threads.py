"""How many threads the math may use: one, unless the user says otherwise.

OpenBLAS starts one thread per core and, between products, its threads spin waiting for the
next one. The products of this tool are small (one position while decoding, 128 x 128 blocks
of a traced pass), so on a machine whose cores are busy with other work the spinning threads
fight that work and each other. One thread is never far from the best on such products, and
it cannot collapse, so it is the default for every command, training included (the figures:
benchmarks/results.md).

A user chooses more with `tinygpt --threads N COMMAND` or TINYGPT_THREADS=N (in that order of
precedence); without either, the usual variables (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS,
MKL_NUM_THREADS), when set, are obeyed as they are. BLAS reads its thread count once, when
NumPy is first imported, so the count is put in those variables before that (`use_default`,
first thing in `entry.main`); once NumPy is loaded (a second command in the same process)
`threadpoolctl` changes the running pools.

Importing this module costs nothing: it imports only `os` and `sys`.
"""

from __future__ import annotations

import os
import sys

ENV = "TINYGPT_THREADS"
BLAS_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
DEFAULT = 1
MOST = 1024


def parse(text: str, where: str) -> int:
    """A thread count from the command line or the environment; ValueError names `where`."""
    value = text.strip()
    if not value.isdigit() or not 1 <= int(value) <= MOST:
        raise ValueError(f"{where} must be a whole number from 1 to {MOST}, got {text!r}")
    return int(value)


def use_default(environ=os.environ) -> None:
    """Before NumPy loads: one thread (or TINYGPT_THREADS) unless the BLAS variables are set.

    A malformed TINYGPT_THREADS is left for `chosen` to report once the CLI can word errors;
    until then the default holds.
    """
    if ENV not in environ and any(v in environ for v in BLAS_VARS):
        return  # the user's own settings, as the BLAS libraries document them
    try:
        n = parse(environ[ENV], ENV) if ENV in environ else DEFAULT
    except ValueError:
        n = DEFAULT
    _set_env(n, environ)


def chosen(option: int | None, environ=os.environ) -> int | None:
    """The count the user asked for: --threads, else TINYGPT_THREADS, else None (the default
    or their BLAS variables hold). ValueError for a malformed TINYGPT_THREADS."""
    if option is not None:
        return option
    if ENV in environ:
        return parse(environ[ENV], ENV)
    return None


def use(n: int, environ=os.environ) -> None:
    """n threads from now on: through the environment before NumPy loads, through
    threadpoolctl after (which changes the running BLAS and OpenMP pools)."""
    _set_env(n, environ)
    if "numpy" in sys.modules:
        from threadpoolctl import threadpool_limits

        threadpool_limits(n)


def _set_env(n: int, environ) -> None:
    # tokenizers' Rayon pool, which encodes a batch of texts, follows the same count
    for v in (*BLAS_VARS, "RAYON_NUM_THREADS"):
        environ[v] = str(n)


def map_on_cores(fn, items, workers: int | None = None) -> list:
    """[fn(item) for item in items], on up to `workers` Python threads (default: one per core
    this process may use).

    For independent pieces of NumPy work that are each large (a snapshot's whole pass):
    NumPy releases the GIL inside them, so the threads run on separate cores, each calling a
    one-thread BLAS pool (set for the duration when the user chose more: several threads
    each driving a pool of several would spin against each other). Nothing waits spinning
    for anything: on busy cores the threads just get less time, never collapse. The results
    are in the items' order and equal to the serial ones bit for bit.
    """
    items = list(items)
    n = min(workers or cores(), len(items))
    if n <= 1:
        return [fn(item) for item in items]
    from concurrent.futures import ThreadPoolExecutor

    from threadpoolctl import threadpool_limits

    with threadpool_limits(1), ThreadPoolExecutor(n) as pool:
        return list(pool.map(fn, items))


def on_cores(workers: int | None = None):
    """map_on_cores as a map of (fn, items): what a job hands an analysis to run its
    independent pieces with (the analysis itself knows no threads)."""
    return lambda fn, items: map_on_cores(fn, items, workers)


def cores() -> int:
    """The cores this process may run on (its affinity mask, which containers and taskset
    narrow), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on every platform
        return os.cpu_count() or 1
