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


def window_note(window: int) -> str:
    """What the dashes of a sliding block's grid are."""
    return (f"-: keys before the query's window (this block sees the last {window} tokens)"
            if window else "")
