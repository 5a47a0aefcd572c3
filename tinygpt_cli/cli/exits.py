"""The tool's exit codes, in one place (entry.py, cli/app.py and streams.py use them; neither
imports the others' modules for them) and the one `error: ...` line (the output contract: 2
bad input, 1 a broken file or a runtime fault, no traceback without --debug). Which fault of
a command ends with which code is entry.failed's."""

from __future__ import annotations

import os
import sys

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


def error(message: str, code: int) -> int:
    """Say `error: message` on one line of stderr (escaped); the exit code `code`."""
    from ..escapes import escape_line

    message = " ".join(line.strip() for line in str(message).splitlines() if line.strip())
    try:
        sys.stderr.write(f"error: {escape_line(message)}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # stderr is gone too: the exit code is all that is left
    return code
