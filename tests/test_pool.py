"""This machine's process pool (cluster.Here, spread="processes"), the default engine of the
corpus-wide jobs: every task's result comes back once, and a worker killed mid-task ends the
job with one error, never a wait forever (multiprocessing.Pool's behaviour)."""

from __future__ import annotations

import faulthandler
import os
import signal

import pytest

from tinygpt_cli.errors import WeightsError
from tinygpt_cli.jobs.cluster import Here


def square_plus_shared(task, shared):  # top level: the spawned workers import it by name
    return task * task + shared


def dies_on_three(task, shared):
    if task == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return task


@pytest.fixture
def watchdog():
    """A job that hangs fails the suite after 120 s instead of holding it forever."""
    faulthandler.dump_traceback_later(120, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def test_every_task_of_a_pool_job_comes_back_once(watchdog):
    with Here(2).job(shared=10, spread="processes") as run:
        got = dict(run(square_plus_shared, list(range(25))))
    assert got == {i: i * i + 10 for i in range(25)}


def test_a_worker_killed_mid_task_ends_the_job_with_one_error(watchdog):
    with pytest.raises(WeightsError, match="worker process of this machine's pool died"):
        with Here(2).job(shared=0, spread="processes") as run:
            list(run(dies_on_three, list(range(8))))
