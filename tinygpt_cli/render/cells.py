"""The cells of an attention grid as both of its layouts show them (render.heads' plain one,
render.tables' Rich one): five characters a cell, a masked cell's dot, and which columns stay
when they do not all fit."""

from __future__ import annotations

MASKED = "  ·  "  # a key after its query (or a -inf score)
OUTSIDE = "  -  "  # a key before the query's sliding window (Gemma 3's local blocks)


def cell_text(x: float) -> str:
    """One finite cell of the grid, five characters wide."""
    return f"{x:5.2f}"[-5:] if abs(x) < 10 else f"{x:5.1f}"[-5:]


def keep(n: int, m: int) -> list[int | None]:
    """m of n column indices, the first and last around None (the `…` column)."""
    if m >= n:
        return list(range(n))
    left = (m + 1) // 2
    return list(range(left)) + [None] + list(range(n - (m - left), n))


ROWS = "rows: the token looking; columns: the tokens it looks at"


def window_note(window: int, scores: bool = False) -> str:
    """What the dashes of a sliding block's grid are."""
    if not window:
        return ""
    return (f"-: keys before the query's window (this block sees the last {window} tokens)"
            + (", -inf too" if scores else ""))


def grid_note(scores: bool, window: int = 0) -> str:
    """The note under an attention grid, one head's or every head's: what its rows, columns
    and marks are, in the characters the cells show (a dot after the query, a dash before a
    sliding block's window)."""
    said = ROWS + ("; ·: keys after the query, -inf (a token cannot look ahead)"
                   if scores else "; each row sums to 1")
    return said + ("; " + window_note(window, scores) if window else "")
