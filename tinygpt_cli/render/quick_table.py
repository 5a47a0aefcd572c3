"""A Rich table that lays itself out directly where nothing is styled.

Rich measures and renders every cell of a Table through several layers (padding, text
wrapping, justification, cropping): most of the time of a `probs --each-line` run over
thousands of lines written to a file (benchmarks/results.md). Where the output carries no
styles (a pipe, a file, TERM=dumb: the console has no colour system) and the table is a plain
one that fits the width, `QuickTable` writes the same characters Rich would, computed here in
one pass: each column as wide as its widest cell plus its padding, each cell justified in it.
Anywhere else (a terminal, a table too wide for the width, a cell to be cut or holding a line
break, options this does not lay out) it is an ordinary `rich.table.Table`.
"""

from __future__ import annotations

import re

from rich.cells import cell_len
from rich.console import Console, Group
from rich.measure import Measurement
from rich.segment import Segment
from rich.table import Table
from rich.text import Text


class QuickTable(Table):
    def __rich_console__(self, console, options):
        lines = self._quick_lines(console, options.max_width)
        if lines is None:
            yield from super().__rich_console__(console, options)
            return
        newline = Segment.line()
        for line in lines:
            yield Segment(line)
            yield newline

    def __rich_measure__(self, console, options):
        laid = self._layout(console, options.max_width)
        if laid is None:
            return super().__rich_measure__(console, options)
        widths, cells, pads = laid
        least = []
        for column, texts, (left, right) in zip(self.columns, cells, pads, strict=True):
            low = max(_longest_word(t) for t in texts) + left + right
            if column.min_width is not None:
                low = max(low, column.min_width + left + right)
            if column.max_width is not None:
                low = min(low, column.max_width + left + right)
            least.append(low)
        return Measurement(sum(least), sum(widths))

    # ---------------------------------------------------------------- the layout

    def _plain(self, console) -> bool:
        """Whether this console shows no styles and this table uses only what is laid out
        here: no box, title, caption, footer, lines between rows, row styles, fixed widths."""
        return (console.color_system is None and not getattr(console, "_markup", True)
                and not getattr(console, "_emoji", True)
                and self.box is None and not self.title and not self.caption
                and not self.show_footer and not self.show_lines and not self.leading
                and not self.expand and self.width is None and self.min_width is None
                and not self.collapse_padding and not self.row_styles
                and self.padding[0] == 0 and self.padding[2] == 0 and bool(self.columns)
                and all(c.width is None and c.ratio is None
                        and c.justify in ("left", "right", "center") for c in self.columns)
                and all(r.style is None for r in self.rows))

    def _layout(self, console, max_width: int):
        """(each column's widest cell and its padding, each column's cell texts, each
        column's (left, right) padding), or None where Rich's own layout is needed."""
        if not self._plain(console):
            return None
        n_rows = len(self.rows)
        cells, pads, widths = [], [], []
        for j, column in enumerate(self.columns):
            texts = ([_text(column.header)] if self.show_header else []) + \
                [_text(column._cells[i]) if i < len(column._cells) else "" for i in range(n_rows)]
            if not texts or any(t is None for t in texts):  # no cells, or cells Rich lays out
                return None
            left, right = self.padding[3], self.padding[1]
            if not self.pad_edge:
                left = 0 if j == 0 else left
                right = 0 if j == len(self.columns) - 1 else right
            width = max([cell_len(t) + left + right for t in texts] or [0])
            if column.min_width is not None:
                width = max(width, column.min_width + left + right)
            if column.max_width is not None:  # a cell cut to fit is left to Rich
                width = min(width, column.max_width + left + right)
                if any(cell_len(t) > width - left - right for t in texts):
                    return None
            cells.append(texts)
            pads.append((left, right))
            widths.append(width)
        if sum(w or 1 for w in widths) > max_width:  # Rich gives an empty column one cell
            return None
        return widths, cells, pads

    def _quick_lines(self, console, max_width: int) -> list[str] | None:
        laid = self._layout(console, max_width)
        if laid is None:
            return None
        widths, cells, pads = laid
        widths = [w or 1 for w in widths]
        justify = [[_justify_of(self._cell(j, i), c.justify) for i in range(len(cells[j]))]
                   for j, c in enumerate(self.columns)]
        lines = []
        for i in range(len(cells[0])):
            parts = []
            for j, width in enumerate(widths):
                left, right = pads[j]
                parts.append(" " * left + _justified(cells[j][i], width - left - right,
                                                     justify[j][i]) + " " * right)
            lines.append("".join(parts))
        return lines

    def plain_lines(self, console, width: int) -> list[str] | None:
        return self._quick_lines(console, width)

    def _cell(self, j: int, i: int):
        """The renderable at row i of column j, the header being row 0 when shown."""
        column = self.columns[j]
        if self.show_header:
            if i == 0:
                return column.header
            i -= 1
        return column._cells[i] if i < len(column._cells) else ""


_BREAKS = ("\n", "\r", "\t", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029")


def _text(cell) -> str | None:
    """A cell's characters when it is a one-line string or Text, else None."""
    if isinstance(cell, Text):
        plain = cell.plain
        if cell.justify not in (None, "default", "left", "right", "center"):
            return None
    elif isinstance(cell, str):
        plain = cell
    else:
        return None
    if not plain.isprintable() and any(b in plain for b in _BREAKS):  # (all unprintable)
        return None
    return plain


def _justify_of(cell, column_justify: str) -> str:
    own = cell.justify if isinstance(cell, Text) else None
    return own if own not in (None, "default") else column_justify


def _justified(text: str, width: int, justify: str) -> str:
    """As rich.containers.Lines.justify lays out one line that fits."""
    if justify == "left":
        return text + " " * (width - cell_len(text))
    text = text.rstrip()
    spare = width - cell_len(text)
    if justify == "right":
        return " " * spare + text
    return " " * (spare // 2) + text + " " * (spare - spare // 2)


def _longest_word(text: str) -> int:
    words = text.split()
    return max((cell_len(w) for w in words), default=cell_len(text))


class QuickConsole(Console):
    """A Console whose print of one view, where nothing is styled, writes the lines Rich
    would write, laid out directly (plain_lines) when every part of the view is of a kind
    laid out here; anything else, and any print with options, is Rich's own. Where nothing
    is styled (a pipe, a file) no line ends in spaces: a table's last column is not padded."""

    def print(self, *objects, **kwargs) -> None:
        if len(objects) == 1 and not kwargs and _plain_console(self):
            lines = plain_lines(self, objects[0], self.width)
            if lines is not None:
                _write(self, "".join(line.rstrip(" ") + "\n" for line in lines))
                return
        super().print(*objects, **kwargs)

    def _render_buffer(self, buffer) -> str:  # Rich's own layout, on its way to the file
        text = super()._render_buffer(buffer)
        return _TRAILING.sub("\n", text) if self.color_system is None else text


_TRAILING = re.compile(r" +\n")


def _plain_console(console) -> bool:
    return (console.color_system is None and not console.record and not console.is_jupyter
            and not console._buffer_index)


def plain_lines(console, renderable, width: int) -> list[str] | None:
    """The lines Rich prints for a renderable on a console that shows no styles: a Text, a
    Group of such parts, or any part with a plain_lines(console, width) of its own (QuickTable,
    tables.Fields, Sized, WhenStyled); None where Rich's own layout is needed."""
    if isinstance(renderable, Text):
        return text_lines(console, renderable, width)
    if isinstance(renderable, Group):
        out: list[str] = []
        for part in renderable.renderables:
            lines = plain_lines(console, part, width)
            if lines is None:
                return None
            out += lines
        return out
    own = getattr(renderable, "plain_lines", None)
    return own(console, width) if callable(own) else None


def text_lines(console, text: Text, width: int) -> list[str] | None:
    """A Text's lines as Rich prints them: one that fits as it is, a longer one wrapped by
    Rich's own wrap of its characters (the styles never move a line break); None for what
    Rich would treat otherwise (controls, tabs, justification, other overflow or ends)."""
    plain = text.plain
    if (text.end != "\n" or text.justify not in (None, "default") or text.no_wrap
            or text.overflow not in (None, "fold") or has_controls(plain.replace("\n", ""))):
        return None
    if "\n" not in plain and len(plain) <= width and cell_len(plain) <= width:
        return [plain]  # (Rich strips the spaces at the end of a line of more characters)
    return [line.plain for line in Text(plain).wrap(console, width, justify="default",
                                                     overflow="fold", tab_size=8)]


def has_controls(plain: str) -> bool:
    """Characters Rich treats by rules of its own: controls and line separators."""
    return not plain.isprintable() and any(
        ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0 or ch in "\u2028\u2029" for ch in plain)


def _write(console, text: str) -> None:
    if console.quiet:
        return
    try:
        console.file.write(text)
        console.file.flush()
    except BrokenPipeError:
        console.on_broken_pipe()


def print_line(console, text: Text) -> None:
    """console.print(text) for a one-line text (`--each-line`'s `line N:` headings): where
    nothing is styled, the characters are written directly, as Rich would write them;
    otherwise Rich prints it."""
    lines = text_lines(console, text, console.width) if _plain_console(console) else None
    if lines is None:
        console.print(text)
    else:
        _write(console, "".join(line + "\n" for line in lines))
