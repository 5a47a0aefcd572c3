"""A progress bar on stderr for work that takes over about a second. Rich is imported only
when one is shown, so the commands that offer one still start fast.

TINYGPT_PROGRESS=0 shows none, neither bar nor lines: for output that must be the same
bytes on every machine (the README's examples, the test suite), as a terminal's vanished bar
leaves it."""

from __future__ import annotations

import contextlib
import os
import sys
import time

ENV = "TINYGPT_PROGRESS"
FIRST = 1.0  # s: in a pipe, the first line once the work has run this long


def shown() -> bool:
    return os.environ.get(ENV, "1").strip() != "0"


def progress(total: int | None, description: str, *, enabled: bool = True,
             pipe_every: float | None = None):
    """A progress bar on stderr for work over about a second: shown only on a terminal and
    never with --json (pass enabled=not as_json). Use as a context manager:

        with progress(n, "scoring") as advance:
            for ...: advance(1)

    `pipe_every`: for work that can run for minutes (training, evaluating over a data set),
    where stderr is a pipe or a file, a line once it has run a second (FIRST), then every
    that many seconds, and one at the end, so a log shows it moving from the start; runs
    under a second print nothing.
    """

    if not enabled or not shown():
        return contextlib.nullcontext(lambda n=1: None)
    from rich.console import Console

    err = Console(stderr=True)
    if not err.is_terminal:
        if pipe_every is None or total is None:
            return contextlib.nullcontext(lambda n=1: None)
        return _counted(_lines(description, pipe_every, at_once=False), total)

    @contextlib.contextmanager
    def bar():
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        with Progress(TextColumn("{task.description}"), BarColumn(),
                      TextColumn("{task.completed}/{task.total}"), TimeRemainingColumn(),
                      console=err, transient=True) as p:
            task = p.add_task(description, total=total)
            yield lambda n=1: p.advance(task, n)

    return bar()


def _counted(reporter, total: int):
    """advance(n) over a report(done, total) context."""

    @contextlib.contextmanager
    def counting():
        done = [0]
        with reporter as report:
            def advance(n: int = 1) -> None:
                done[0] += n
                report(done[0], total)

            yield advance

    return counting()


def progress_report(description: str, *, every: float = 5.0, at_once: bool = True):
    """For long work that reports (done, total): a bar with an ETA on a terminal; where
    stderr is a pipe or a file, a line every `every` seconds (the first at once, unless
    at_once is False: then quick work says nothing) and one at the end, so a log shows the
    work moving. Never on stdout. Use as a context manager yielding report(done, total)."""

    if not shown():
        return contextlib.nullcontext(lambda done, total: None)
    from rich.console import Console

    err = Console(stderr=True)

    @contextlib.contextmanager
    def bar():
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        # the count is a field of its own: before the first report the total is None, and
        # "{task.total:,}" cannot format it (every terminal run failed that way)
        with Progress(TextColumn("{task.description}"), BarColumn(),
                      TextColumn("{task.fields[count]}"), TimeRemainingColumn(),
                      console=err, transient=True) as p:
            task = p.add_task(description, total=None, count="")
            yield lambda done, total: p.update(task, completed=done, total=total,
                                               count=f"{done:,}/{total:,}")

    return bar() if err.is_terminal else _lines(description, every, at_once=at_once)


def _lines(description: str, every: float, *, at_once: bool):
    """report(done, total) as a line on stderr every `every` seconds (the first at once, or
    after FIRST seconds), and the last state at the end when the work took that long."""

    @contextlib.contextmanager
    def lines():
        t0 = time.monotonic()
        # the first line after FIRST seconds: the next `every` after it
        # the rate from the start (0 done at t0): an ETA from the first line on
        state = {"shown": -1e9 if at_once else t0 - every + FIRST,
                 "first": None if at_once else (0, t0), "last": None, "said": None}

        def say(done: int, total: int) -> None:
            state["said"] = (done, total)
            with contextlib.suppress(OSError, ValueError):
                left = ""
                if state["first"] is not None and state["first"][0] < done < total:
                    d0, s0 = state["first"]
                    rate = (done - d0) / max(time.monotonic() - s0, 1e-9)
                    left = f", about {format_duration((total - done) / rate)} left"
                sys.stderr.write(f"{description}: {done:,}/{total:,} "
                                 f"({100 * done / max(total, 1):.0f}%){left}\n")
                sys.stderr.flush()

        def report(done: int, total: int) -> None:
            now = time.monotonic()
            if state["first"] is None:
                state["first"] = (done, now)
            state["last"] = (done, total)
            if now - state["shown"] >= every:
                state["shown"] = now
                say(done, total)

        yield report
        if state["last"] not in (None, state["said"]) and time.monotonic() - t0 >= FIRST:
            say(*state["last"])

    return lines()


def format_duration(seconds: float) -> str:
    """'40 s', '3 min', '1 h 5 min'."""
    if seconds < 90:
        return f"{max(seconds, 1):.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds // 3600:.0f} h {(seconds % 3600) / 60:.0f} min"
