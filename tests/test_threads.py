"""Threads (issue 19): one BLAS thread unless the user asks for more, read from the pools a
fresh `tinygpt` process really runs with (threadpoolctl), never from timings."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tinygpt_cli import threads

pytest.importorskip("threadpoolctl")

# A fresh process runs the console script's main, then reports the BLAS pools it ended with.
PROBE = """
import atexit, sys
def report():
    from threadpoolctl import threadpool_info
    pools = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
    sys.stderr.write("\\nBLAS " + " ".join(map(str, pools)))
atexit.register(report)
from tinygpt_cli.entry import main
main(sys.argv[1:])
"""

CLEARED = (*threads.BLAS_VARS, threads.ENV, "RAYON_NUM_THREADS", "TINYGPT_WEIGHTS")


def blas_threads(args: list[str], **env: str) -> tuple[list[int], str, int]:
    """(the BLAS pools' thread counts, stderr, exit code) of `tinygpt ARGS` with only `env`
    of the thread variables set."""
    full = {k: v for k, v in os.environ.items() if k not in CLEARED}
    full.update(env)
    r = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                       env=full, timeout=120)
    head, _, pools = r.stderr.rpartition("\nBLAS ")
    return [int(n) for n in pools.split()], head, r.returncode


ENCODE = ["encode", "Lily wanted", "--json"]  # loads NumPy, needs no weights file


def test_the_default_is_one_thread_whatever_the_cores():
    pools, _, code = blas_threads(ENCODE)
    assert code == 0 and pools == [1]


# OpenBLAS runs at most one thread per core: more than 1 needs 2 cores
MANY_CORES = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core")


@MANY_CORES
def test_threads_option_and_variable_choose_the_count():
    assert blas_threads(["--threads", "2", *ENCODE])[0] == [2]
    assert blas_threads(ENCODE, TINYGPT_THREADS="2")[0] == [2]
    # the option wins over the variable, which wins over the BLAS libraries' own variables
    assert blas_threads(["--threads", "1", *ENCODE], TINYGPT_THREADS="2")[0] == [1]
    assert blas_threads(ENCODE, TINYGPT_THREADS="2", OPENBLAS_NUM_THREADS="1",
                        OMP_NUM_THREADS="1")[0] == [2]


@MANY_CORES
def test_the_users_own_blas_variables_are_obeyed():
    pools, _, _ = blas_threads(ENCODE, OPENBLAS_NUM_THREADS="2", OMP_NUM_THREADS="2")
    assert pools == [2]


@pytest.mark.parametrize("value", ["0", "two", "-1", "1025", ""])
def test_a_malformed_variable_is_one_error_line(value):
    _, err, code = blas_threads(ENCODE, TINYGPT_THREADS=value)
    assert code == 2
    assert err.strip() == (f"error: TINYGPT_THREADS must be a whole number from 1 to 1024, "
                           f"got {value!r}")


def test_an_out_of_range_option_is_a_usage_error():
    _, err, code = blas_threads(["--threads", "0", *ENCODE])
    assert code == 2 and err.startswith("error: Invalid value for '--threads'")


@MANY_CORES
def test_use_after_numpy_loaded_changes_the_running_pool():
    import numpy  # noqa: F401  (loaded: the environment no longer matters)
    from threadpoolctl import threadpool_info, threadpool_limits

    env: dict[str, str] = {}
    with threadpool_limits():  # restores the pools afterwards
        threads.use(2, env)
        assert {p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"} == {2}
        threads.use(1, env)
        assert {p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"} == {1}
    assert env["OPENBLAS_NUM_THREADS"] == "1" and env["RAYON_NUM_THREADS"] == "1"


def test_map_on_cores_keeps_the_order_and_the_serial_results():
    """Pieces of NumPy work on two threads: the same arrays, bit for bit, in the items'
    order, as one loop; an empty list and one item need no pool."""
    import numpy as np

    from tinygpt_cli.threads import map_on_cores

    rng = np.random.default_rng(0)
    mats = [rng.standard_normal((200, 200)) for _ in range(5)]

    def work(a):
        return np.linalg.matrix_power(a / 20, 3).sum(axis=0)

    got = map_on_cores(work, mats, workers=2)
    assert len(got) == 5
    for a, g in zip(mats, got, strict=True):
        np.testing.assert_array_equal(g, work(a))
    assert map_on_cores(work, [], workers=2) == []
    np.testing.assert_array_equal(map_on_cores(work, mats[:1])[0], work(mats[0]))
