"""One head's attention grid (`tinygpt attn`), laid out without Rich where nothing is styled.

Where the output shows no styles (a pipe, a file), the heatmap is a plain table of 5-character
cells: the same characters Rich lays out are computed here in one pass, and Rich is never
imported (loading its console and table is most of what `attn` costs beyond its libraries,
issue 19). Anywhere else (a terminal, a changed run's note, a cell whose width is not surely
one column per character, a header or a table that does not fit the width) the view is Rich's
own: render.cards builds it.
"""

from __future__ import annotations

import math

from .cells import MASKED, OUTSIDE, cell_text, grid_note, keep
from .numbers import fmt, shape_str, stats
from .text import row_label, show_token

# Characters surely one column wide (cell_len 1 in Rich): printable ASCII, printable Latin-1
# but the soft hyphen, and the stand-ins show_token and the tables use. Anything else (wide,
# combining, zero-width characters) is left to Rich's own measure.
_NARROW = frozenset(map(chr, range(0x20, 0x7F))) | frozenset(
    chr(c) for c in range(0xA1, 0x100) if c != 0xAD) | frozenset("␣↵⇥␍…·×")


def heads_view(path: str, grids, tokens: list[str], scores: bool, full: bool,
               window: int = 0):
    """Every head's grid side by side: render.cards.heads_view (Rich's layout, loaded now)."""
    from .cards import heads_view as view

    return view(path, grids, tokens, scores, full, window)


def head_view(path: str, grid, tokens: list[str], scores: bool, full: bool, window: int = 0):
    """One head's T x T grid as a heatmap: (the view, None: it measures itself when shown)."""
    return HeadView(path, grid, tokens, scores, full, window), None


class HeadView:
    """The view of one head's T x T grid (a header line, the heatmap, a note), laid out when
    it is shown: `lines(width)` for plain output, `renderables()` for Rich."""

    def __init__(self, path: str, grid, tokens: list[str], scores: bool, full: bool,
                 window: int = 0):
        self.path, self.grid, self.tokens = path, grid, tokens
        self.scores, self.full, self.window = scores, full, window

    @property
    def note(self) -> str:
        return grid_note(self.scores, self.window)

    def renderables(self):
        """(the Rich view, the heatmap whose width it needs), as render.cards lays it out."""
        from rich.console import Group
        from rich.text import Text

        from .tables import header, heatmap

        lo, hi = (None, None) if self.scores else (0.0, 1.0)
        hm = heatmap(self.grid, self.tokens, lo=lo, hi=hi, full=self.full, window=self.window)
        return Group(header(self.path, self.grid), hm, Text(self.note, style="dim")), [hm]

    def lines(self, width: int) -> list[str] | None:
        """The view as plain lines for a console `width` columns wide, or None where only
        Rich's layout would be the same."""
        grid, n = self.grid, self.grid.shape[1]
        labels = [row_label(i, t) + " " for i, t in enumerate(self.tokens[: grid.shape[0]])]
        heads = [show_token(t)[:5] for t in self.tokens[:n]]
        if not all(set(s) <= _NARROW for s in (*labels, *heads, self.path)):
            return None
        first = max(len(s) for s in labels)
        columns = self._columns(n, first, heads, width)
        if columns is None:
            return None
        table = _table(grid, labels, heads, columns, first, self.window)
        if self.full:  # shown as wide as the table (a terminal wraps it, a pipe keeps it)
            width = max(width, len(table[0]))
        head = _header_lines(self.path, grid, width)
        if head is None or len(self.note) > width:
            return None
        return [*head, *table, self.note]

    def _columns(self, n: int, first: int, heads: list[str], width: int):
        """The kept key columns (render.tables.Fit's choice), or None when even the fewest
        do not fit."""
        if self.full:
            return list(range(n))

        def fits(m: int) -> bool:
            return _width(keep(n, m), first, heads) <= width

        if fits(n):
            return list(range(n))
        lo, hi = min(2, n), n  # the largest m in [lo, hi) that fits: widths grow with m
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return keep(n, lo) if fits(lo) else None


def _column_width(j: int | None, heads: list[str]) -> int:
    return 1 if j is None else max(5, len(heads[j]))


def _width(cols: list[int | None], first: int, heads: list[str]) -> int:
    """The table's width: each column as wide as its widest cell, one space after every
    column but the last."""
    return first + 1 + sum(_column_width(j, heads) for j in cols) + len(cols) - 1


def _centre(s: str, width: int) -> str:
    """As Rich centres a cell: trailing spaces dropped first, the odd space on the right."""
    s = s.rstrip()
    left = (width - len(s)) // 2
    return " " * left + s + " " * (width - len(s) - left)


def _table(grid, labels: list[str], heads: list[str], cols: list[int | None],
           first: int, window: int = 0) -> list[str]:
    widths = [_column_width(j, heads) for j in cols]

    def line(label: str, cells: list[str]) -> str:
        return label.ljust(first) + " " + " ".join(
            _centre(c, w) for c, w in zip(cells, widths, strict=True))

    rows = grid.tolist()  # Python floats: one conversion, not one per cell
    out = [line("", ["…" if j is None else heads[j] for j in cols])]
    for i, label in enumerate(labels):
        row = rows[i]
        out.append(line(label, ["…" if j is None else OUTSIDE if window and j <= i - window
                                else MASKED if j > i or not math.isfinite(row[j])
                                else cell_text(row[j]) for j in cols]))
    return out


def _header_lines(path: str, grid, width: int) -> list[str] | None:
    """render.tables.header as plain lines (fields two spaces apart, wrapped between fields
    onto indented lines), or None when a field is wider than the line."""

    s = stats(grid)
    fields = [path, shape_str(grid.shape), str(grid.dtype)] + [
        f"{k} " + ("-" if s[k] is None else fmt(s[k])) for k in ("min", "mean", "max", "std")]
    if any(len(f) + 2 > width for f in fields):
        return None
    lines, line = [], ""
    for f in fields:
        if line and len(line) + 2 + len(f) > width:
            lines.append(line)
            line = "  "
        elif line.strip():
            line += "  "
        line += f
    return [*lines, line]
