"""Token strings shown to a person: visible whitespace, escaped control codes, never markup."""

from __future__ import annotations

import errno
import math
import os
import re
import textwrap

from ..escapes import escape_line, escaped, is_control

# Shared by the views and pictures of analyses, which render never imports (they run the
# model): bits = nats / LN2, as analysis.score counts them; the labels of heads' kinds.
LN2 = math.log(2.0)
HEAD_KINDS = {"previous_token": "previous token", "duplicate_token": "duplicate token",
              "induction": "induction", "induction_random": "induction (random)"}

_VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}
def show_token(token: str) -> str:
    """' wanted' -> '␣wanted'; control characters (ESC included) become \\xNN escapes."""
    if token.isprintable():  # no control, line break or bidi override: only spaces to show
        return token.replace(" ", "␣")
    out = []
    for ch in token:
        if ch in _VISIBLE:
            out.append(_VISIBLE[ch])
        elif is_control(ch):
            out.append(escaped(ch))
        else:
            out.append(ch)
    return "".join(out)


# A byte that is only part of a UTF-8 character, as Tokenizer.token_str writes it.
_STRAY_BYTE = re.compile(r"\\x([0-9a-f]{2})")
_PIECE = str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉")


def _token_bytes(token: str) -> bytes | None:
    """The bytes of a token whose stray bytes show as \\xNN, or None when it has none."""
    if "\\x" not in token:
        return None
    parts = _STRAY_BYTE.split(token)  # text, hex, text, hex, ..., text
    return b"".join(bytes([int(p, 16)]) if i % 2 else p.encode("utf-8")
                    for i, p in enumerate(parts))


def whole_characters(tokens: list[str]) -> list[str]:
    """Tokens that each hold part of one character (an emoji is two to four byte tokens)
    named by the text they make together and which piece each is: ['\\xf0\\x9f',
    '\\x90\\xbb'] -> ['🐻₁', '🐻₂']. A picture's 9-pixel label cannot show eight escapes;
    bytes no neighbour completes stay escaped, and other tokens are unchanged."""
    out = list(tokens)
    i = 0
    while i < len(tokens):
        joined = _token_bytes(tokens[i])
        end = i + 1
        while joined is not None and end - i <= 4:
            try:
                text = joined.decode("utf-8")
            except UnicodeDecodeError:
                more = _token_bytes(tokens[end]) if end < len(tokens) else None
                joined = None if more is None else joined + more
                end += 1
                continue
            if end - i > 1:
                out[i:end] = [text + str(k + 1).translate(_PIECE) for k in range(end - i)]
            break
        i = end if joined is not None and end - i > 1 else i + 1
    return out


def show_text(text: str) -> str:
    """Free text for a terminal: newlines kept, other control characters escaped."""
    if text.isprintable():  # nothing to escape (every one of them is unprintable)
        return text
    return "".join(ch if ch in "\n\t" or not is_control(ch) else escaped(ch) for ch in text)


def row_label(i: int, token: str, width: int = 14) -> str:
    s = show_token(token)
    if len(s) > width:
        s = s[: width - 1] + "…"
    return f"{i:>3} {s}"


def examples_block(doc: str) -> str:
    """A docstring with its `Example: ...` lines gathered under "Examples:" in a paragraph
    that click prints line by line (`\\b`), so no example is joined to another or rewrapped
    mid-command."""
    lines = doc.strip("\n").splitlines()
    examples = [ln.strip()[len("Example:"):].strip() for ln in lines
                if ln.strip().startswith("Example:")]
    if not examples:
        return doc
    # click's "\b" (keep this paragraph as it is) was only there for the examples
    rest = [ln for ln in lines if not ln.strip().startswith("Example:") and ln.strip() != "\b"]
    while rest and not rest[-1].strip():
        rest.pop()

    body = textwrap.dedent("\n".join(rest[1:])).strip("\n")
    parts = [rest[0].strip()] + (["", body] if body else [])
    lines = [line for e in examples for line in _shell_lines(e)]
    return "\n".join([*parts, "", "\b", "Examples:", *(f"  {line}" for line in lines)])


def _shell_lines(command: str, width: int = 74) -> list[str]:
    """A command too long for an 80-column help page, broken before its options with the
    shell's own continuation (` \\`), so it can still be copied whole."""
    if len(command) <= width:
        return [command]

    pieces = re.split(r" (?=--?[a-z])", command)
    lines = [pieces[0]]
    for piece in pieces[1:]:
        if len(lines[-1]) + 1 + len(piece) + 2 <= width:
            lines[-1] += " " + piece
        else:
            lines.append("    " + piece)
    return [line + " \\" for line in lines[:-1]] + lines[-1:]


# What the presentation characters become where the output encoding cannot carry them
# (PYTHONIOENCODING=ascii): readable ASCII rather than a UnicodeEncodeError.
ASCII = {
    "␣": "_", "↵": "\\n", "⇥": "\\t", "␍": "\\r", "×": "x", "–": "-", "—": "-", "−": "-",
    "…": "...", "█": "#", "▣": "*", "│": "|", "▼": "v", "→": "->", "·": ".", "‖": "|",
    "╭": "+", "╮": "+", "╰": "+", "╯": "+", "─": "-", "≈": "~", "≤": "<=", "≥": ">=",
}
_ASCII_TABLE = str.maketrans(ASCII)
_SAMPLE = "".join(ASCII)


def to_ascii(text: str) -> str:
    """The ASCII fallback of a text: presentation characters by their ASCII forms, anything
    else outside ASCII as a backslash escape."""
    return text.translate(_ASCII_TABLE).encode("ascii", "backslashreplace").decode("ascii")


class AsciiStream:
    """A text stream for an encoding that cannot show `␣ × …`: it writes their ASCII forms."""

    def __init__(self, stream):
        self.stream = stream
        self.encoding = "ascii"

    def write(self, s: str) -> int:
        self.stream.write(to_ascii(s))
        return len(s)

    def __getattr__(self, name):
        return getattr(self.stream, name)


class ForgivingStream:
    """stderr that cannot be written (`2>/dev/full`, a dead terminal) treated like a closed
    one: the first failed write points the descriptor at /dev/null and the command goes on,
    keeping its output and exit code. Notes are never worth a command's result."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, s: str) -> int:
        try:
            return self._stream.write(s)
        except OSError:
            self._gone()
            return len(s)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError:
            self._gone()

    def _gone(self) -> None:

        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
            self._stream.flush()  # what was buffered now goes to /dev/null, so exit is clean
        except (OSError, ValueError, AttributeError):
            pass

    def __getattr__(self, name):
        return getattr(self._stream, name)


class WatchedStream:
    """stdout, remembering whether a write to it failed (`> /dev/full`), so that the error
    can say it was standard output that could not be written, not just "No space left"."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self.failed = False

    def write(self, s: str) -> int:
        try:
            return self._stream.write(s)
        except OSError as e:
            self.failed = e.errno != errno.EPIPE  # a reader gone is not a failure
            raise

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as e:
            self.failed = e.errno != errno.EPIPE
            raise

    def __getattr__(self, name):
        return getattr(self._stream, name)


def guard_encoding(stream):
    """stream itself when it can encode the presentation characters, else an AsciiStream."""
    encoding = getattr(stream, "encoding", None)
    if not encoding or isinstance(stream, AsciiStream):
        return stream
    try:
        _SAMPLE.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return AsciiStream(stream)
    return stream


def steering_text(d: dict) -> str:
    """A steered run's change, from its description (cli/steering.py): site, scale, vector."""
    what = f"v of {d['vector']}" if "vector" in d else f"v = {d['toward']!r} - {d['away']!r}"
    return show_text(f"{d['site']} + {d['scale']:g} * v, {what}, |v| = {d['norm']:.3g}")


def changed_note(changes: dict) -> str:
    """The first line(s) of every view of a changed run: what was steered and ablated."""
    lines = []
    if changes.get("steered"):
        lines.append(f"steered before this view: {steering_text(changes['steered'])}")
    if changes.get("ablated"):
        lines.append("ablated (set to zero) before this view: "
                     + escape_line(", ".join(changes["ablated"])))
    return "\n".join(lines)


def added_names(rows: list[dict]) -> tuple[str, str]:
    """The values whose norms card 7 shows, as the rows name them: attn_out and mlp_out, or
    Gemma's norms after each branch (ln1_post, ln2_post), which is what the block adds."""
    made = rows[-1] if rows else {}
    return tuple(made.get(k, d).removesuffix(".out")
                 for k, d in (("attn_added", "attn_out"), ("mlp_added", "mlp_out")))


def scales(norms: list[str]) -> str:
    """DLA's words for the norms a part passes, frozen: ["ln1_post", "ln_final"] -> "ln1_post's
    and the final norm's real scales"."""
    said = [("the final norm" if n == "ln_final" else n) + "'s" for n in norms]
    return " and ".join(said) + (" real scales" if len(said) > 1 else " real scale")


def neuron_scales(norms: list[str]) -> str:
    """The norm after the MLP a neuron's part passes, if any, for DLA's note of neurons."""
    after = [n for n in norms if n != "ln_final"]
    return f", through {scales(after)}" if after else ""
