"""Rich renderables for arrays: the header line, token-labelled tables, heatmaps, top-k bars."""

from __future__ import annotations

import numpy as np
from rich.console import Group
from rich.table import Table
from rich.text import Text

from .text import row_label, show_token

EDGE = 4  # columns shown on each side of the ellipsis when a tensor is wide


def shape_str(shape) -> str:
    return " × ".join(str(n) for n in shape) if len(shape) else "scalar"


def stats(arr: np.ndarray) -> dict:
    """min, mean, max, std over the finite entries (masked scores are -inf)."""
    a = np.asarray(arr, dtype=np.float64)
    finite = a[np.isfinite(a)]
    if finite.size == 0:
        return {"min": None, "mean": None, "max": None, "std": None}
    return {"min": float(finite.min()), "mean": float(finite.mean()),
            "max": float(finite.max()), "std": float(finite.std())}


def fmt(x: float, width: int = 0) -> str:
    if not np.isfinite(x):
        return "-inf" if x < 0 else ("inf" if x > 0 else "nan")
    if x != 0 and (abs(x) >= 1e4 or abs(x) < 1e-3):
        return f"{x:.2e}"
    return f"{x:.3f}" if abs(x) < 100 else f"{x:.1f}"


def header(path: str, arr: np.ndarray, note: str = "") -> Text:
    """`layers.0.ln1.out  6 × 128  float32  min … mean … max … std …`"""
    s = stats(arr)
    t = Text()
    t.append(path, style="bold cyan")
    t.append(f"  {shape_str(arr.shape)}", style="bold")
    t.append(f"  {arr.dtype}", style="dim")
    for k in ("min", "mean", "max", "std"):
        v = s[k]
        t.append(f"  {k} ", style="dim")
        exact = arr.dtype.kind in "iu" and k in ("min", "max")
        t.append("-" if v is None else (str(int(v)) if exact else fmt(v)))
    if note:
        t.append(f"  {note}", style="dim")
    return t


def _columns(n: int, full: bool) -> list[int | None]:
    """Indices to show, None standing for the ellipsis."""
    if full or n <= 2 * EDGE + 1:
        return list(range(n))
    return list(range(EDGE)) + [None] + list(range(n - EDGE, n))


def _cell(x) -> Text:
    if isinstance(x, np.integer | int):  # ids and counts print as whole numbers
        return Text(str(int(x)))
    s = fmt(float(x))
    if s == "-inf":
        return Text("-inf", style="dim")
    return Text(s, style="red" if x < 0 else "")


def matrix(
    arr: np.ndarray, row_labels: list[str], *, full: bool = False,
    col_labels: list[str] | None = None, extra: dict[str, np.ndarray] | None = None,
) -> Table:
    """A 2-D array as a table whose rows are labelled (usually by token)."""
    arr = np.atleast_2d(arr)
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold dim")
    table.add_column("", no_wrap=True, style="bold")
    cols = _columns(arr.shape[1], full)
    for c in cols:
        label = "…" if c is None else (col_labels[c] if col_labels else str(c))
        table.add_column(label, justify="right", no_wrap=True)
    for name in extra or {}:
        table.add_column(name, justify="right", no_wrap=True, style="magenta")
    for i, row in enumerate(arr):
        cells = [Text(row_labels[i])]
        cells += [Text("…", style="dim") if c is None else _cell(row[c]) for c in cols]
        cells += [_cell(v[i]) for v in (extra or {}).values()]
        table.add_row(*cells)
    return table


def token_rows(tokens: list[str]) -> list[str]:
    return [row_label(i, t) for i, t in enumerate(tokens)]


def tensor_view(path: str, arr: np.ndarray, tokens: list[str] | None, *, full: bool = False):
    """Header line plus the best table for the array's rank."""
    arr = np.asarray(arr)
    parts = [header(path, arr)]
    if arr.ndim == 0:
        parts.append(Text(fmt(float(arr))))
    elif arr.ndim == 1:
        labels = token_rows(tokens) if tokens and len(tokens) == arr.shape[0] else None
        if labels:
            parts.append(matrix(arr[:, None], labels, full=True, col_labels=["value"]))
        else:
            parts.append(matrix(arr[None, :], [""], full=full))
    elif arr.ndim == 2:
        labels = token_rows(tokens) if tokens and len(tokens) == arr.shape[0] else [
            str(i) for i in range(arr.shape[0])]
        col_labels = ([show_token(t)[:8] for t in tokens]
                      if tokens and arr.shape[1] == len(tokens) == arr.shape[0] else None)
        parts.append(matrix(arr, labels, full=full, col_labels=col_labels))
    else:
        for j in range(arr.shape[0]):
            parts.append(Text(f"{path}[{j}]", style="bold dim"))
            parts += tensor_view(f"{path}[{j}]", arr[j], tokens, full=full).renderables[1:]
    return Group(*parts)


# ------------------------------------------------------------------ heatmaps

_VIRIDIS = [(68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37)]


def colour(x: float) -> str:
    """A viridis colour for x in [0, 1]."""
    x = min(max(x, 0.0), 1.0) * (len(_VIRIDIS) - 1)
    i = min(int(x), len(_VIRIDIS) - 2)
    f = x - i
    r, g, b = (round(a + (c - a) * f) for a, c in zip(_VIRIDIS[i], _VIRIDIS[i + 1], strict=True))
    return f"rgb({r},{g},{b})"


def heatmap(grid: np.ndarray, tokens: list[str], title: str = "", *, lo=None, hi=None) -> Table:
    """A T × T attention grid: rows are queries, columns keys; masked cells show a dot."""
    finite = grid[np.isfinite(grid)]
    lo = float(finite.min()) if lo is None and finite.size else (lo or 0.0)
    hi = float(finite.max()) if hi is None and finite.size else (hi if hi is not None else 1.0)
    span = hi - lo if hi > lo else 1.0
    table = Table(title=title or None, box=None, pad_edge=False, show_edge=False,
                  header_style="bold dim", padding=(0, 1, 0, 0), title_style="bold")
    table.add_column("", no_wrap=True, style="bold")
    for t in tokens:
        table.add_column(show_token(t)[:5], justify="center", no_wrap=True, min_width=5)
    for i, row in enumerate(grid):
        cells = [Text(row_label(i, tokens[i]) + " ")]
        for j, x in enumerate(row):
            if j > i or not np.isfinite(x):
                cells.append(Text("  ·  ", style="dim"))
                continue
            level = (float(x) - lo) / span
            fg = "black" if level > 0.55 else "white"
            cells.append(Text(f"{x:5.2f}"[-5:] if abs(x) < 10 else f"{x:5.1f}"[-5:],
                              style=f"{fg} on {colour(level)}"))
        table.add_row(*cells)
    return table


# ------------------------------------------------------------------ top-k lists


def top_table(rows: list[dict], value_name: str, *, bar_of: str | None = None) -> Table:
    """Ranked tokens: rank, id, token, value (and a bar for chances)."""
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold dim")
    for name, just in (("#", "right"), ("id", "right"), ("token", "left"),
                       (value_name, "right")):
        table.add_column(name, justify=just, no_wrap=True)
    if bar_of:
        table.add_column("", no_wrap=True)
    for r, row in enumerate(rows, 1):
        cells = [str(r), str(row["id"]), Text(show_token(row["token"]), style="bold"),
                 fmt(row[value_name])]
        if bar_of:
            n = round(float(row[bar_of]) * 40)
            cells.append(Text("█" * n, style="green"))
        table.add_row(*cells)
    return table
