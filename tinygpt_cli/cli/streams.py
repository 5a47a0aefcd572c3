"""The standard streams of a command-line process: closed ones (`>&-`), encodings that cannot
show the tool's symbols, a reader that goes away (`| head`), which Unix tools answer with a
quiet exit 0, and the text a command reads from stdin. Used by the cli; nothing here knows a
command."""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

from ..errors import InputError, check_utf8
from ..render.text import ForgivingStream, WatchedStream, guard_encoding
from .exits import FAULT, OK


class Closed:
    """Stands in for a standard stream that was closed (`>&-`): writing to it is an I/O error,
    reported as such, instead of an AttributeError on None."""

    encoding = "utf-8"

    def __init__(self, name: str):
        self.name = name

    def write(self, s: str) -> int:
        raise OSError(errno.EBADF, f"{self.name} is closed")

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        raise OSError(errno.EBADF, f"{self.name} is closed")


def guard_streams() -> None:
    """Closed streams and encodings that cannot show `␣ × …` must not crash a command."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        if getattr(sys, name) is not None:
            continue
        try:  # hold the descriptor, so that no file the command opens lands on it
            devnull = os.open(os.devnull, os.O_WRONLY)
            if devnull != fd:
                os.dup2(devnull, fd)
                os.close(devnull)
        except OSError:
            pass
        if name == "stdout":
            sys.stdout = Closed("standard output")
        else:
            sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - for the process's life
    if not isinstance(sys.stdout, WatchedStream | Closed):  # closed: says so itself
        sys.stdout = WatchedStream(guard_encoding(sys.stdout))
    if not isinstance(sys.stderr, ForgivingStream):  # a stderr that fails is dropped
        sys.stderr = ForgivingStream(guard_encoding(sys.stderr))


def stdout_failed() -> bool:
    """Was it a write to stdout that failed (WatchedStream)? If so, stdout now points at
    /dev/null, so that the flush at exit does not fail again."""
    if not getattr(sys.stdout, "failed", False):
        return False
    reader_gone()
    return True


def reader_gone() -> int:
    """The reader of stdout went away (`| head`): stop quietly with exit 0, as Unix tools do.
    stdout now points at /dev/null, so the final flush at exit cannot fail again."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if type(stream).__name__ == "PacifyFlushWrapper":  # click's own handler came first
            setattr(sys, name, stream.wrapped)
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
    return OK


def identity(fd: int) -> tuple[int, int] | None:
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def stdout_broken(before: tuple[int, int] | None) -> bool:
    """Did a broken-pipe handler of a library end the command? click's wraps sys.stdout;
    Rich's points stdout at /dev/null; both then exit 1, which is not what a reader that
    went away means."""
    if type(sys.stdout).__name__ == "PacifyFlushWrapper":
        return True
    try:
        now = identity(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return now is not None and now != before and now == identity_of_devnull()


def identity_of_devnull() -> tuple[int, int] | None:
    st = os.stat(os.devnull)
    return st.st_dev, st.st_ino


def finish(code: int) -> None:
    """Exit with `code`, the output flushed first. Output still buffered that cannot be
    written (`> /dev/full`, with the whole of a short output waiting in the buffer) is an
    error like a failed write during the command: one line, exit 1, and stdout pointed at
    /dev/null so that Python's own flush at exit does not fail again (exit 120)."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        code = reader_gone() if code == 0 else code
    except (OSError, ValueError) as e:
        if stdout_failed() and code == 0:
            try:
                sys.stderr.write("error: cannot write to standard output: "
                                 f"{getattr(e, 'strerror', None) or e}\n")
            except (OSError, ValueError):
                pass
            code = FAULT
    sys.exit(code)


# ------------------------------------------------------------------ the text of a command


def read_text(text: str | None, model=None, what: str = "text") -> str:
    """The argument, or stdin when the argument is '-' or missing and stdin is not a terminal.
    `what` is what the command reads ("token ids" for decode, which says an empty one).

    With `model`, whose context the text must fit, stdin is read no further than a text of
    that many tokens can reach, and a longer one is refused there (`embed - < /dev/zero`
    never ends)."""
    if text is None or text == "-":
        if sys.stdin is None:  # `<&-`
            raise InputError(f"no {what}: stdin is closed; give the {what} as an argument")
        if sys.stdin.isatty():
            them = "them as arguments" if what.endswith("s") else "it as an argument"
            raise InputError(f"no {what}: give {them}, or pipe {them.split()[0]} on stdin "
                             "with '-'")
        text = _read_stdin(None if model is None else (model.config.n_positions,
                                                       model.tokenizer.longest_token_bytes))
        if text.endswith("\n"):
            text = text[:-1]  # the newline `echo` adds is not part of the text
    else:
        text = check_utf8(text, "the text argument")
    if text == "" and what == "text":
        raise InputError("the text is empty: give at least one character")
    return text


STDIN_CHUNK = 1 << 18  # bytes read at a time by stdin_chunks (each cut encodes about as much)


def stdin_chunks():
    """stdin's text in pieces of about STDIN_CHUNK, decoded and its newlines made universal
    as read_text's are (a \r at a piece's end waits for the next piece), so that a caller
    can keep only part of an endless stream (--last N). InputError for a closed stdin, a
    terminal, or bytes that are not UTF-8."""
    import codecs

    if sys.stdin is None:
        raise InputError("no text: stdin is closed; give the text as an argument")
    if sys.stdin.isatty():
        raise InputError("no text: give it as an argument, or pipe it on stdin with '-'")
    buffer = getattr(sys.stdin, "buffer", None)
    stream = sys.stdin if buffer is None else buffer  # a StringIO in tests: already text
    decode = codecs.getincrementaldecoder("utf-8")().decode
    held, offset = "", 0
    while True:
        data = stream.read(STDIN_CHUNK)
        if buffer is None:
            text = check_utf8(data, "stdin")
        else:
            try:
                text = decode(data, final=not data)
            except UnicodeDecodeError as e:
                raise InputError(f"stdin is not UTF-8 text (byte 0x{e.object[e.start]:02x} "
                                 f"near offset {offset + e.start}); convert it first, e.g. "
                                 "with iconv -t UTF-8") from None
            offset += len(data)
        text = held + text
        held = text[-1:] if data and text.endswith("\r") else ""
        text = text[:len(text) - len(held)]
        if text:
            yield text.replace("\r\n", "\n").replace("\r", "\n")
        if not data:
            return


def _read_stdin(limit: tuple[int, int] | None = None) -> str:
    """stdin as UTF-8 whatever the locale says, universal newlines as Python's text mode;
    with `limit`, read no further than _stdin_text says."""
    return _stdin_text(limit).replace("\r\n", "\n").replace("\r", "\n")


def _stdin_text(limit: tuple[int, int] | None = None) -> str:
    """stdin's bytes as UTF-8 whatever the locale says; InputError naming the first byte
    that is not. With `limit` (the most tokens, the most bytes a token stands for), stdin is
    read no further than twice what so many tokens can hold (a \r\n becomes one \n), and a
    text that reaches that is refused: it is surely longer than the limit."""
    buffer = getattr(sys.stdin, "buffer", None)
    stream = sys.stdin if buffer is None else buffer  # a StringIO in tests: already text
    cap = None if limit is None else 2 * limit[0] * limit[1] + 3
    data = stream.read() if cap is None else stream.read(cap)
    if cap is not None and len(data) >= cap:
        raise InputError(f"the text on stdin is more than {cap - 1:,} bytes long (read no "
                         f"further); this model reads at most {limit[0]} tokens ({limit[0]} "
                         f"tokens never hold more than {limit[0] * limit[1]:,} characters)")
    if buffer is None:
        return check_utf8(data, "stdin")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"stdin is not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
                         f"{e.start}); convert it first, e.g. with iconv -t UTF-8") from None
    return text


def text_lines(source: str, option: str):
    """(line number from 1, line) for each line with something besides whitespace of the file
    `source` ('-': stdin), given with `option`; the errors name it. A file gives a list; stdin
    and a pipe give StreamLines, read as the lines are run."""
    if source == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise InputError(f"{option} -: pipe the texts on stdin, one per line")
        return StreamLines(getattr(sys.stdin, "buffer", None) or sys.stdin, "stdin", option)
    else:
        path = Path(source)
        if path.is_dir():
            raise InputError(f"{option} {source} is a folder: give a file of texts")
        if not path.exists():
            raise InputError(f"{option} {source}: no such file")
        if not (path.is_file() or path.is_fifo()):  # a device such as /dev/zero never ends
            raise InputError(f"{option} {source} is neither a file nor a pipe")
        if path.is_fifo():  # <(command), /dev/stdin: read as the lines are run
            return StreamLines(open(path, "rb"), source, option)  # noqa: SIM115 - read to the end
        try:  # a pipe such as <(command) or /dev/stdin is read as a file is
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"{option} {source} is not UTF-8 text ({e.reason} at byte "
                             f"{e.start})") from None
    # lines end at \n (and \r\n) only: str.splitlines would also cut at U+2028, U+0085 and
    # others, which are text here, and shift the line numbers an editor shows
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    found = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
    if not found:
        raise InputError(f"{option} {source} has no lines with text")
    return found


MAX_LINE = 1 << 24  # bytes of one line of a stream (16 MiB): a stream with no newline ends


class StreamLines:
    """The lines with text of a stream (stdin, a pipe) as text_lines gives a file's, read as
    they are asked for and forgotten once run: `yes | tinygpt encode --each-line -` holds a
    few thousand lines at a time (what --each-line computes ahead), never the stream.
    get(i) is the i-th such line (None past the end); iterating runs them in order."""

    def __init__(self, stream, source: str, option: str):
        self.stream, self.source, self.option = stream, source, option
        self.kept: list[tuple[int, str]] = []  # lines base, base + 1, ...
        self.base = 0
        self.number = 0  # lines read, empty ones too
        self.offset = 0  # bytes read
        self.ended = False

    def get(self, i: int) -> tuple[int, str] | None:
        while i >= self.base + len(self.kept):
            if self.ended or not self._read_one():
                return None
        return self.kept[i - self.base] if i >= self.base else None

    def __iter__(self):
        i = 0
        while (line := self.get(i)) is not None:
            del self.kept[: i - self.base]  # the lines run before this one
            self.base = i
            yield line
            i += 1

    def _read_one(self) -> bool:
        """Read up to the next line with text and keep it; False at the end."""
        while True:
            raw = self.stream.readline(MAX_LINE + 1)
            if not raw:
                self.ended = True
                if self.base + len(self.kept) == 0:
                    raise InputError(f"{self.option} {self.source} has no lines with text")
                return False
            self.number += 1
            if len(raw) > MAX_LINE:
                raise InputError(f"{self.option} {self.source}: line {self.number} is longer "
                                 f"than {MAX_LINE:,} bytes")
            line = self._text(raw).removesuffix("\n").removesuffix("\r")
            self.offset += len(raw)
            if line.strip():
                self.kept.append((self.number, line))
                return True

    def _text(self, raw) -> str:
        if isinstance(raw, str):  # a text stream (tests)
            return check_utf8(raw, self.source)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            at = self.offset + e.start
            if self.source == "stdin":
                raise InputError(f"stdin is not UTF-8 text (byte 0x{raw[e.start]:02x} at "
                                 f"offset {at}); convert it first, e.g. with iconv -t UTF-8"
                                 ) from None
            raise InputError(f"{self.option} {self.source} is not UTF-8 text ({e.reason} at "
                             f"byte {at})") from None
