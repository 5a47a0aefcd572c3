"""A progress bar on stderr for work that takes over about a second. Rich is imported only
when one is shown, so the commands that offer one still start fast."""

from __future__ import annotations


def progress(total: int | None, description: str, *, enabled: bool = True):
    """A progress bar on stderr for work over about a second: shown only on a terminal and
    never with --json (pass enabled=not as_json). Use as a context manager:

        with progress(n, "scoring") as advance:
            for ...: advance(1)
    """
    import contextlib

    from rich.console import Console

    err = Console(stderr=True)
    if not enabled or not err.is_terminal:
        return contextlib.nullcontext(lambda n=1: None)

    @contextlib.contextmanager
    def bar():
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        with Progress(TextColumn("{task.description}"), BarColumn(),
                      TextColumn("{task.completed}/{task.total}"), TimeRemainingColumn(),
                      console=err, transient=True) as p:
            task = p.add_task(description, total=total)
            yield lambda n=1: p.advance(task, n)

    return bar()
