"""The cluster never hangs (issue 53): a scheduler with no workers, a job whose next result
does not come, and a scheduler lost mid-job each end with one line after the wait
(--cluster-wait, $TINYGPT_CLUSTER_WAIT); an address scheme this Dask cannot use is
"cannot reach the scheduler"; Dask's own log lines stay off the terminal. Real schedulers on
127.0.0.1, each test bounded by a wait of a second or two."""

from __future__ import annotations

import threading
import time

import pytest
from cli_helpers import Runner, assert_one_error_line, clean_env, make_tiny

from tinygpt_cli.errors import WeightsError
from tinygpt_cli.jobs import cluster

distributed = pytest.importorskip("distributed")


@pytest.fixture
def cli(capsys, monkeypatch, tmp_path):
    clean_env(monkeypatch)
    monkeypatch.setenv("TINYGPT_WEIGHTS", str(make_tiny(tmp_path / "weights").folder))
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "data.txt").write_text("Lily wanted to play with her ball. Tom saw a dog.\n"
                                       * 60, encoding="utf-8")
    return Runner(capsys, monkeypatch)


def _neurons(cli, tmp_path, *before):
    return cli(*before, "neurons", "--neuron", "0", "--layer", "0", "--data",
               tmp_path / "data.txt")


def _local(workers: int):
    """A cluster on 127.0.0.1 whose workers are threads of this process (quick to start)."""
    return distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=False,
                                    protocol="tcp",
                                    host="127.0.0.1", **cluster.NO_DASHBOARD)


FINISHED: list = []  # the tasks done (the workers are threads of this process)


def _sleep(seconds, shared):
    time.sleep(seconds)
    FINISHED.append(seconds)
    return seconds


def test_a_scheduler_with_no_workers_ends_after_the_wait(cli, tmp_path, monkeypatch):
    local = _local(0)
    try:
        r = _neurons(cli, tmp_path, "--cluster", local.scheduler_address, "--cluster-wait",
                     "0.5")
        assert_one_error_line(r, 2, f"the Dask scheduler at '{local.scheduler_address}' has "
                              "no workers (waited 0.5 s, --cluster-wait)")
        monkeypatch.setenv("TINYGPT_CLUSTER_WAIT", "0.7")
        monkeypatch.setenv("TINYGPT_CLUSTER", local.scheduler_address)
        assert_one_error_line(_neurons(cli, tmp_path), 2, "has no workers (waited 0.7 s")
        monkeypatch.setenv("TINYGPT_CLUSTER_WAIT", "soon")
        assert_one_error_line(_neurons(cli, tmp_path), 2,
                              "$TINYGPT_CLUSTER_WAIT 'soon' is not a positive number of seconds")
        assert_one_error_line(_neurons(cli, tmp_path, "--cluster-wait", "0"), 2,
                              "--cluster-wait '0.0' is not a positive number of seconds")
    finally:
        local.close()


@pytest.mark.parametrize("scheme", ["tls", "ucx"])
def test_an_address_scheme_dask_cannot_use_here_cannot_be_reached(cli, tmp_path, scheme):
    r = _neurons(cli, tmp_path, "--cluster", f"{scheme}://127.0.0.1:9", "--cluster-wait", "1")
    assert_one_error_line(r, 2, f"cannot reach the Dask scheduler at '{scheme}://127.0.0.1:9'",
                          "(start one with `dask scheduler`, or give --cluster local)")


def test_a_job_whose_next_result_does_not_come_ends_after_the_wait():
    local = _local(1)
    try:
        FINISHED.clear()
        with cluster.engine(local.scheduler_address, wait=1) as e, e.job(None) as run:
            with pytest.raises(WeightsError, match=r"finished no task in 1 s \(--cluster-wait\)"):
                list(run(_sleep, [0.05, 2.5]))
            assert 2.5 not in FINISHED  # the wait ended it, not the task
    finally:
        local.close()


def test_a_scheduler_lost_mid_job_is_one_error_and_dask_says_nothing(capfd, monkeypatch):
    monkeypatch.setattr(cluster, "CONNECT_SECONDS", 1)  # the client's reconnection time
    local = _local(1)
    capfd.readouterr()
    try:
        with cluster.engine(local.scheduler_address, wait=20) as e, e.job(None) as run:
            with pytest.raises(WeightsError, match="lost its scheduler; what it finished is "
                                                   "kept"):  # not the wait's 20 s
                for _ in run(_sleep, [0.05, 1, 1, 1]):
                    threading.Thread(target=local.close).start()
    finally:
        local.close()
    out, err = capfd.readouterr()
    assert err == "" and out == ""  # no "Failed to reconnect", no asyncio traceback
