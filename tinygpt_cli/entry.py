"""The console script's first code: Ctrl-C is caught from here on, before the slow imports.

Python turns Ctrl-C into a KeyboardInterrupt wherever it lands; during the imports of numpy,
rich and typer that would print a traceback. Until `app.main` takes over (and turns the
interrupt into exit 130 itself, so that `finally` blocks still run), a Ctrl-C ends the process
at once with exit 130 on a fresh line.
"""

from __future__ import annotations

import os
import signal
import sys

from .exits import INTERRUPTED, fresh_line


def _interrupted_at_start(signum, frame) -> None:  # noqa: ARG001 - the signal handler's signature
    fresh_line()
    os._exit(INTERRUPTED)


def main(argv: list[str] | None = None) -> None:
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupted_at_start)
    try:
        from .threads import use_default

        use_default()  # before NumPy loads: BLAS reads its thread count only then
        from .cli.app import main as run  # the slow imports

        run(argv)
    except KeyboardInterrupt:  # in the instant between two handlers
        fresh_line()
        sys.exit(INTERRUPTED)
    finally:
        # Shutting down: a second Ctrl-C now must not print a traceback either.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
