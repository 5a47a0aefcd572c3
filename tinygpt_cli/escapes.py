"""What a message quotes from a file or from the user, made safe for a terminal: a line
with its control characters escaped, a value's repr cut short. A leaf beside errors.py:
every floor's messages use it (storage's too), and it imports nothing of the package."""

from __future__ import annotations

# Bidirectional embeddings, overrides and isolates: invisible, yet they make a terminal show
# the rest of the line in another order than it is (the "Trojan Source" trick). The marks
# (U+200E, U+200F, U+061C) only place neutral characters and belong to right-to-left text:
# they are shown as they are.
_BIDI = frozenset("".join(map(chr, range(0x202A, 0x202F))) + "".join(map(chr, range(0x2066,
                                                                                     0x206A))))


def escaped(ch: str) -> str:
    if 0xDC80 <= ord(ch) <= 0xDCFF:  # a byte of a file name that is not UTF-8, as Python
        return f"\\x{ord(ch) - 0xDC00:02x}"  # keeps it (surrogateescape): the byte itself
    return f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"


def is_control(ch: str) -> bool:
    return ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0 or ch in _BIDI or 0xD800 <= ord(ch) < 0xE000


def escape_line(text: str) -> str:
    """One line for an error message: every control character (tab and newline included, so
    the line stays one line; ESC and C1 such as U+009B, so a terminal never obeys them) as an
    escape."""
    if text.isprintable():  # nothing to escape (every one of them is unprintable)
        return text
    return "".join(escaped(ch) if is_control(ch) else ch for ch in text)


def shown(x, most: int = 40) -> str:
    text = repr(x)
    return text if len(text) <= most else text[: most - 1] + "…"
