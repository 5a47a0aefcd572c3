"""The tool's exit codes, in one place (entry.py and cli/app.py both use them; neither
imports the other's module for them), the one `error: ...` line, and which fault of a
command ends with which code (the output contract: 2 bad input, 1 a broken file or a runtime
fault, no traceback without --debug)."""

from __future__ import annotations

import errno
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
    from ..render.text import escape_line

    message = " ".join(line.strip() for line in str(message).splitlines() if line.strip())
    try:
        sys.stderr.write(f"error: {escape_line(message)}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # stderr is gone too: the exit code is all that is left
    return code


def too_many_digits(e: Exception) -> bool:
    """Python's own refusal to read an integer string of over 4,300 digits (a guard against
    slow conversions), raised as a plain ValueError by int() wherever the tool reads one."""
    return type(e) is ValueError and "integer string conversion" in str(e)


def failed(e: Exception, debug: bool) -> int:
    """The exit code a command's exception ends with, its error line said; with `debug` the
    exception goes on (its traceback) instead, unless it is a reader gone (`| head`)."""
    from ..errors import InputError, WeightsError  # PathError is an InputError
    from . import streams

    if isinstance(e, BrokenPipeError) or (isinstance(e, OSError) and e.errno == errno.EPIPE):
        return streams.reader_gone()
    if debug:
        raise e
    if isinstance(e, InputError):
        return error(str(e), USAGE)
    if isinstance(e, WeightsError):
        return error(str(e), FAULT)
    if isinstance(e, OSError):
        if not e.filename and streams.stdout_failed():  # `> /dev/full`
            return error(f"cannot write to standard output: {e.strerror or e}", FAULT)
        where = f": {e.filename}" if e.filename else ""
        return error(f"{e.strerror or e}{where}", FAULT)
    if too_many_digits(e):  # wherever a number is read: an option, a path, an id
        return error("a number of more than 4,300 digits: no option, index or token id is "
                     "anywhere near that large", USAGE)
    return error(f"{type(e).__name__}: {e} (run again with --debug for the traceback)", FAULT)
