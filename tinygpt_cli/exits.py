"""The tool's exit codes, in one place (entry.py and cli/app.py both use them; neither
imports the other's module for them)."""

from __future__ import annotations

import os

OK = 0
FAULT = 1  # a broken file or folder, a runtime fault: the machine's side
USAGE = 2  # bad usage or input: the message says what is allowed
INTERRUPTED = 130  # 128 + SIGINT, what shells report for a command stopped by Ctrl-C


def fresh_line() -> None:
    """End the terminal's `^C` echo with a newline, so the prompt starts on its own line."""
    try:
        if os.isatty(2):
            os.write(2, b"\n")
    except OSError:
        pass
