"""Token strings shown to a person: visible whitespace, escaped control codes, never markup."""

from __future__ import annotations

_VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}


def show_token(token: str) -> str:
    """' wanted' -> '␣wanted'; control characters (ESC included) become \\xNN escapes."""
    out = []
    for ch in token:
        if ch in _VISIBLE:
            out.append(_VISIBLE[ch])
        elif ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


def show_text(text: str) -> str:
    """Free text for a terminal: newlines kept, other control characters escaped."""
    return "".join(
        ch if ch in "\n\t" or not (ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0)
        else f"\\x{ord(ch):02x}"
        for ch in text
    )


def row_label(i: int, token: str, width: int = 14) -> str:
    s = show_token(token)
    if len(s) > width:
        s = s[: width - 1] + "…"
    return f"{i:>3} {s}"
