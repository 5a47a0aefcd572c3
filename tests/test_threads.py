"""Threads (issue 19): one BLAS thread unless the user asks for more, read from the pools a
fresh `tinygpt` process really runs with (threadpoolctl), never from timings."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tinygpt_cli.jobs import threads

pytest.importorskip("threadpoolctl")

# A fresh process runs the console script's main, then reports the BLAS pools it ended with.
PROBE = """
import atexit, sys
def report():
    from threadpoolctl import threadpool_info
    pools = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
    sys.stderr.write("\\nBLAS " + " ".join(map(str, pools)))
atexit.register(report)
from tinygpt_cli.cli.entry import main
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

    from tinygpt_cli.jobs.threads import map_on_cores

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


def test_map_on_cores_gives_each_thread_a_one_thread_blas_pool():
    """Threads that each drive a BLAS pool of several threads spin against each other (a
    `why --threads 2` query ran 7 times slower): inside map_on_cores the pool is one thread,
    and the user's count is back after it."""
    import numpy  # noqa: F401 - the BLAS library must be loaded for threadpoolctl to see it
    from threadpoolctl import threadpool_info, threadpool_limits

    from tinygpt_cli.jobs.threads import map_on_cores

    def blas_threads(_=None):
        return sorted({p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"})

    with threadpool_limits(2, user_api="blas"):
        before = blas_threads()
        inside = map_on_cores(blas_threads, range(3), workers=2)
        assert blas_threads() == before
    assert inside == [[1]] * 3


def test_an_index_of_another_format_is_removed_before_a_build(tmp_path):
    """An older version's index can never be read again: the next build removes it, and
    leaves indexes of this version and folders it cannot judge alone."""
    import json

    from tinygpt_cli.jobs import why_index

    for name, version in (("old", "tracin-v2"), ("current", why_index.VERSION)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "rows-0.npy").write_bytes(b"x" * 10)
        (tmp_path / name / "index.json").write_text(json.dumps({"version": version}))
    (tmp_path / "partial").mkdir()
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "index.json").write_text("not json")
    why_index.prune_other_versions(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["current", "odd", "partial"]


@pytest.mark.parametrize("reports", [[], [(0, 87_668), (40_000, 87_668)]])
def test_the_progress_report_bar_draws_on_a_terminal_before_and_after_a_report(reports,
                                                                             monkeypatch):
    """why's bar on a terminal: drawn at once with no total yet (an index in the cache never
    reports), then with the count; every terminal run of why failed here once."""
    import io

    from rich.console import Console

    from tinygpt_cli.render import progress as pg

    monkeypatch.delenv("TINYGPT_PROGRESS")
    out = io.StringIO()
    real = Console

    def terminal(*args, **kwargs):
        kwargs.pop("stderr", None)
        return real(*args, file=out, force_terminal=True, width=80, **kwargs)

    monkeypatch.setattr("rich.console.Console", terminal)
    with pg.progress_report("indexing every window's gradient") as report:
        for done, total in reports:
            report(done, total)
    if reports:
        assert "40,000/87,668" in out.getvalue()
