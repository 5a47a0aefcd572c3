"""The two kinds of failure the tool reports, shared by the core and the command line.

InputError: bad usage or input; the message says what was wrong and what is allowed (exit 2).
WeightsError: a weights or run folder that cannot be used, or a file that cannot be written
(exit 1). It is defined here, beside InputError, so that low modules (files.py) can raise it;
`weights.WeightsError` is the same class. Its subclasses say more precisely what failed.
"""

from __future__ import annotations

import os


class InputError(ValueError):
    """Bad usage or input: the message says what was wrong and what is allowed. Exit 2."""


class WeightsError(Exception):
    """A weights folder or file that cannot be used; the message says which tensor and why.

    Exit 1, as for every fault of the machine rather than of the command line.
    """


class WriteError(WeightsError):
    """A file could not be written: a read-only folder, a full disk, a path that is a folder."""


class NonFiniteError(WeightsError):
    """The forward pass produced an infinite or NaN value: weights too large for float32."""


class RunError(WeightsError):
    """A training run that cannot go on: its loss diverged or its run folder is broken."""


def check_utf8(text: str, what: str) -> str:
    """The text, whole. Python hands bytes it could not decode (in argv, or in a stdin decoded
    leniently) over as lone surrogates, which no tokenizer can encode. In the POSIX locale
    without UTF-8 mode even valid UTF-8 arrives so: an argument is decoded again from its
    bytes (os.fsencode) as UTF-8; what still is not UTF-8 is refused as bad input."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass

    try:
        return os.fsencode(text).decode("utf-8")
    except (UnicodeError, TypeError):
        pass
    start = next(i for i, ch in enumerate(text) if 0xD800 <= ord(ch) <= 0xDFFF)
    bad = text[start]
    byte = f"byte 0x{ord(bad) - 0xDC00:02x}" if 0xDC80 <= ord(bad) <= 0xDCFF else \
        f"U+{ord(bad):04X}"
    raise InputError(f"{what} is not valid UTF-8 ({byte} at character {start})")


def check_index(value: int, count: int, what: str) -> int:
    """A layer, head or position index, negatives from the end; the error names the range."""
    if not -count <= value < count:
        raise InputError(
            f"{what} {value} is out of range: valid {what}s are 0..{count - 1} "
            f"(or -{count}..-1 from the end)"
        )
    return value % count
