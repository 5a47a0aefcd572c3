"""Rich renderables for arrays: the header line, token-labelled tables, heatmaps, top-k bars."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from rich.cells import cell_len
from rich.console import Group
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from ..escapes import escape_line
from ..words import count
from .cells import MASKED, OUTSIDE, cell_text
from .cells import keep as _keep
from .numbers import fmt, shape_str, stats  # noqa: F401  (other views import them from here)
from .quick_table import QuickTable, has_controls, plain_lines, text_lines
from .text import added_names, row_label, show_token

if TYPE_CHECKING:  # imported where used: `encode`'s table needs no NumPy
    import numpy as np

EDGE = 4  # columns shown on each side of the ellipsis when a tensor is wide


class WhenStyled:
    """A renderable shown only where styles show: a legend for colours (in_colour=True), or for
    reverse video and underlines, says nothing in a pipe or a file, where there are none."""

    def __init__(self, renderable, *, in_colour: bool = False):
        self.renderable, self.in_colour = renderable, in_colour

    def shown(self, console) -> bool:
        return console.is_terminal and not (self.in_colour and console.no_color)

    def __rich_console__(self, console, options):
        if self.shown(console):
            yield self.renderable

    def __rich_measure__(self, console, options):

        if self.shown(console):
            return Measurement.get(console, options, self.renderable)
        return Measurement(0, 0)

    def plain_lines(self, console, width: int) -> list[str] | None:
        return plain_lines(console, self.renderable, width) if self.shown(console) else []


class Fields:
    """A line of fields separated by two spaces that wraps *between* fields, never inside one
    (`min -0.966` stays whole); continuation lines are indented."""

    def __init__(self, fields: list[Text]):
        self.fields = fields

    @property
    def plain(self) -> str:
        return "  ".join(f.plain for f in self.fields)

    def __rich_console__(self, console, options):
        width = options.max_width
        line = Text()
        for field in self.fields:
            if line.plain and line.cell_len + 2 + field.cell_len > width:
                yield line
                line = Text("  ")
            elif line.plain.strip():
                line.append("  ")
            line.append_text(field)
        yield line

    def plain_lines(self, console, width: int) -> list[str] | None:
        """__rich_console__'s lines as plain text (render.quick_table.plain_lines)."""
        if any(has_controls(f.plain) for f in self.fields):
            return None
        lines, line = [], ""
        for field in self.fields:
            if line and cell_len(line) + 2 + field.cell_len > width:
                lines.append(line)
                line = "  "
            elif line.strip():
                line += "  "
            line += field.plain
        lines.append(line)
        each = [text_lines(console, Text(x), width) for x in lines]  # as Rich prints each
        return None if None in each else [x for one in each for x in one]

    def __rich_measure__(self, console, options):

        widest = max(f.cell_len for f in self.fields)
        return Measurement(min(widest, options.max_width), min(len(self.plain),
                                                                 options.max_width))


def header(path: str, arr: np.ndarray, note: str = "") -> Fields:
    """`layers.0.ln1.out  6 × 128  float32  min … mean … max … std …`"""
    return _header(path, arr.shape, str(arr.dtype), stats(arr), arr.dtype.kind in "iu", note)


def ids_header(ids: list[int]) -> Fields:
    """header("ids", the ids as int64), from the list itself (`encode` imports no NumPy)."""
    n = len(ids)
    mean = sum(ids) / n if n else None
    s = {"min": min(ids, default=None), "mean": mean, "max": max(ids, default=None),
         "std": math.sqrt(sum((i - mean) ** 2 for i in ids) / n) if n else None}
    return _header("ids", (n,), "int64", s, True, "")


def _header(path: str, shape, dtype: str, s: dict, integer: bool, note: str) -> Fields:
    fields = [Text(path, style="bold cyan"), Text(shape_str(shape), style="bold"),
              Text(dtype, style="dim")]
    for k in ("min", "mean", "max", "std"):
        v = s[k]
        exact = integer and k in ("min", "max")
        value = "-" if v is None else (str(int(v)) if exact else fmt(v))
        fields.append(Text.assemble((f"{k} ", "dim"), value))
    if note:
        fields.append(Text(note, style="dim"))
    return Fields(fields)


class Fit:
    """A table that fits the width it is printed at, a number or a name never cut. Too wide,
    it first takes its `narrow` form (shorter labels, the same columns), then, with `bands`,
    goes on below in bands of columns that each fit (every column shown); else its middle
    columns give way behind one `…` column. `build(keep)` makes the table for the kept column
    indices (None: the `…` column); `most` caps how many show even when there is room (the
    first and last EDGE of a wide tensor); full shows every column."""

    def __init__(self, build, n: int, *, most: int | None = None, full: bool = False,
                 narrow=None, bands: bool = False):
        self.build, self.n, self.most, self.full = build, n, most, full
        self.narrow, self.bands = narrow, bands

    def tables(self, console, width: int) -> list[Table]:

        if self.full:
            return [self.build(list(range(self.n)))]
        top = self.n if self.most is None or self.n <= self.most + 1 else self.most
        options = console.options.update_width(10**6)

        def fits(build, keep) -> bool:
            return Measurement.get(console, options, build(keep)).maximum <= width

        for build in (self.build, self.narrow):
            if build is not None and fits(build, _keep(self.n, top)):
                return [build(_keep(self.n, top))]
        build = self.narrow or self.build
        if self.bands and top == self.n:
            return [build(band) for band in _bands(self.n, lambda keep: fits(build, keep))]
        lo, hi = min(2, top), top  # the largest m in [lo, hi) that fits: widths grow with m
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(build, _keep(self.n, mid)) else (lo, mid)
        return [build(_keep(self.n, lo))]

    def table(self, console, width: int) -> Table:
        return self.tables(console, width)[0]

    def __rich_console__(self, console, options):
        for k, table in enumerate(self.tables(console, options.max_width)):
            if k:
                yield Text("")
            yield table

    def __rich_measure__(self, console, options):

        shown = [Measurement.get(console, options, t)
                 for t in self.tables(console, options.max_width)]
        return Measurement(max(m.minimum for m in shown), max(m.maximum for m in shown))


def _bands(n: int, fits) -> list[list[int]]:
    """0..n-1 cut into runs, each as long as fits(run) allows (at least one column)."""
    out, start = [], 0
    while start < n:
        end = start + 1
        while end < n and fits(list(range(start, end + 1))):
            end += 1
        out.append(list(range(start, end)))
        start = end
    return out


def _columns(n: int, full: bool) -> list[int | None]:
    """Indices to show, None standing for the ellipsis."""
    return _keep(n, n if full or n <= 2 * EDGE + 1 else 2 * EDGE)


def _cell(x) -> Text:
    import numpy as np

    if isinstance(x, np.integer | int):  # ids and counts print as whole numbers
        return Text(str(int(x)))
    s = fmt(float(x))
    if s == "-inf":
        return Text("-inf", style="dim")
    return Text(s, style="red" if x < 0 else "")


def matrix(
    arr: np.ndarray, row_labels: list[str], *, full: bool = False,
    col_labels: list[str] | None = None, extra: dict[str, np.ndarray] | None = None,
    edge: int | None = EDGE,
) -> Fit:
    """A 2-D array as a table whose rows are labelled (usually by token); the first and last
    `edge` columns of a wide one (None: as many as fit), fewer when the width asks."""
    import numpy as np

    arr = np.atleast_2d(arr)

    def build(cols: list[int | None]) -> Table:
        table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold dim")
        table.add_column("", no_wrap=True, style="bold")
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

    return Fit(build, arr.shape[1], most=None if edge is None else 2 * edge, full=full)


def token_rows(tokens: list[str]) -> list[str]:
    return [row_label(i, t) for i, t in enumerate(tokens)]


def tensor_view(path: str, arr: np.ndarray, tokens: list[str] | None, *, full: bool = False):
    """Header line plus the best table for the array's rank."""
    import numpy as np

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


def heatmap(grid: np.ndarray, tokens: list[str], title: str = "", *, lo=None, hi=None,
            full: bool = False, window: int = 0) -> Fit:
    """A T × T attention grid: rows are queries, columns keys; masked cells show a dot, and
    (a block with a sliding `window`) the keys before a query's window a dash. A long text
    keeps its first and last key columns around `…` to fit the width (full: all)."""
    import numpy as np


    finite = grid[np.isfinite(grid)]
    lo = float(finite.min()) if lo is None and finite.size else (lo or 0.0)
    hi = float(finite.max()) if hi is None and finite.size else (hi if hi is not None else 1.0)
    span = hi - lo if hi > lo else 1.0

    def cell(i: int, j: int) -> Text:
        x = grid[i, j]
        if window and j <= i - window:
            return Text(OUTSIDE, style="dim")
        if j > i or not np.isfinite(x):
            return Text(MASKED, style="dim")
        level = (float(x) - lo) / span
        fg = "black" if level > 0.55 else "white"
        return Text(cell_text(x), style=f"{fg} on {colour(level)}")

    def build(cols: list[int | None]) -> Table:
        table = Table(title=title or None, box=None, pad_edge=False, show_edge=False,
                      header_style="bold dim", padding=(0, 1, 0, 0), title_style="bold")
        table.add_column("", no_wrap=True, style="bold")
        for j in cols:
            table.add_column("…" if j is None else show_token(tokens[j])[:5], justify="center",
                             no_wrap=True, min_width=1 if j is None else 5)
        for i in range(grid.shape[0]):
            table.add_row(Text(row_label(i, tokens[i]) + " "),
                          *(Text("…", style="dim") if j is None else cell(i, j) for j in cols))
        return table

    return Fit(build, grid.shape[1], full=full)


# ------------------------------------------------------------------ top-k lists


class Sized:
    """A renderable built for the width it is printed at."""

    def __init__(self, build):
        self.build = build

    def __rich_console__(self, console, options):
        yield self.build(console, options.max_width)

    def __rich_measure__(self, console, options):

        return Measurement.get(console, options, self.build(console, options.max_width))

    def plain_lines(self, console, width: int) -> list[str] | None:
        return plain_lines(console, self.build(console, width), width)


BAR = 40  # the longest bar, in characters, when the width allows


def top_table(rows: list[dict], value_name: str, *, bar_of: str | None = None) -> Sized:
    """Ranked tokens: rank, id, token, value (and a bar for chances, as long as the width
    leaves room for: the numbers and names are never the ones to give way)."""

    values = [fmt(row[value_name]) for row in rows]
    tokens = [show_token(row["token"]) for row in rows]
    # what the rank, id and value columns and the gaps between the four take
    beside = (len(str(len(rows))) + max([len(str(r["id"])) for r in rows] + [2])
              + max([len(v) for v in values] + [len(value_name)]) + 6)

    def table(bar: int, most: int) -> Table:
        t = QuickTable(box=None, pad_edge=False, show_edge=False, header_style="bold dim")
        for name, just in (("#", "right"), ("id", "right"), ("token", "left"),
                           (value_name, "right")):
            t.add_column(name, justify=just, no_wrap=True)
        if bar:
            t.add_column("", no_wrap=True)
        longest = max((float(row[bar_of]) for row in rows), default=0.0) if bar_of else 0.0
        for r, row in enumerate(rows, 1):
            token = tokens[r - 1]  # a token longer than the room left is the one cut
            shown = token if len(token) <= most else token[:max(most - 1, 1)] + "…"
            cells = [str(r), str(row["id"]), Text(shown, style="bold"), values[r - 1]]
            if bar:
                share = float(row[bar_of]) / longest if longest > 0 else 0.0
                cells.append(Text("█" * round(share * min(longest, 1.0) * bar), style="green"))
            t.add_row(*cells)
        return t

    def build(console, width: int) -> Table:
        most = max(width - beside, 6)
        if not bar_of:
            return table(0, most)
        bare = Measurement.get(console, console.options.update_width(10**6),
                               table(0, most)).maximum
        return table(max(0, min(BAR, width - bare - 2)), most)

    return Sized(build)


def typed_path(path: Path) -> str:
    """A path below the current folder as the user would type it; others in full."""
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


SPECIALS = 12  # the special tokens info names before it says how many more there are


def info_view(info):
    """A ModelInfo (analysis.info): the configuration, the parameter counts, the weights
    file (as typed_path shows it) with its sha256, and the tokenizer."""


    t = Table(box=None, header_style="bold dim", pad_edge=False, show_header=False)
    t.add_column(style="bold")
    t.add_column()
    for k, v in info.config.items():
        shown = ", ".join(v) + " (outside the vocabulary: not used)" if k == "unused" else v
        t.add_row(k, escape_line(str(shown)))
    p = Table(box=None, header_style="bold dim", pad_edge=False)
    p.add_column("parameters", style="cyan")
    p.add_column("count", justify="right")
    for k, v in info.groups.items():
        p.add_row(k, f"{v:,}")
    p.add_row(Text("total", style="bold"), Text(f"{info.total:,}", style="bold"))
    # names and paths come from the weights folder: shown escaped, like the user's own text
    special = info.tokenizer["special_tokens"]
    # Gemma 3 names 6,400 (<unused0> ... <unused6241>, the image tokens): the first few and
    # the ends of generation are shown; --json has them all
    specials = ", ".join(f"{show_token(k)} = {v}" for k, v in list(special.items())[:SPECIALS])
    if len(special) > SPECIALS:
        specials += f" (the first {SPECIALS} of {len(special):,}; --json lists them all)"
    by_id = {v: k for k, v in special.items()}
    ends = ", ".join(f"{show_token(by_id[i])} = {i}" if i in by_id else f"#{i}"
                     for i in info.tokenizer.get("stop_ids", []))
    return Group(
        Text("configuration", style="bold underline"), t, Text(""), p, Text(""),
        # the shipped model said so, not where pip put it (--json has the path)
        Text("weights   the shipped model.safetensors (--json: its path)" if info.shipped
             else f"weights   {escape_line(typed_path(info.weights_file))}"),
        Text(f"sha256    {info.sha256}"),
        Text(f"tokenizer {info.tokenizer['vocab_size']:,} tokens; special: {specials}"),
        *([Text(f"generation ends at {ends}")] if ends else []),
        *(_gguf_view(info) if info.gguf else ()),
    )


def _gguf_view(info) -> list:
    """A GGUF's quantization: the file's bits per weight, each tensor's type (folded over
    the blocks), and where the weights came from; every string from the file escaped."""
    g = info.gguf
    counts = ", ".join(f"{k} ×{v}" for k, v in g["types"].items())
    lines = [Text(""), Text("quantization", style="bold underline"),
             Text(f"{escape_line(g['format'])}, {g['bits_per_weight']:.3g} bits per weight "
                  f"(tensors: {counts}); computed in float32 after dequantizing")]
    q = Table(box=None, header_style="bold dim", pad_edge=False)
    q.add_column("tensor", style="cyan")
    q.add_column("type")
    for name, kinds in info.gguf_groups.items():
        q.add_row(escape_line(name), ", ".join(k if len(kinds) == 1 else f"{k} ×{n}"
                                               for k, n in kinds.items()))
    lines.append(q)
    if g["source"]:
        s = Table(box=None, header_style="bold dim", pad_edge=False, show_header=False)
        s.add_column(style="bold")
        s.add_column()
        for k, v in g["source"].items():
            s.add_row(escape_line(k), escape_line(str(v)))
        lines += [Text(""), Text("where the weights came from", style="bold underline"), s]
    return lines


def paths_table(entries: list[dict]) -> Table:
    """trace --list: every path with its shape and what it is."""
    t = Table(box=None, header_style="bold dim", pad_edge=False)
    t.add_column("path", no_wrap=True, style="cyan")
    t.add_column("shape", no_wrap=True)
    t.add_column("what it is")
    for e in entries:
        t.add_row(e["path"], shape_str(e["shape"]), e["about"])
    return t


def blocks_view(rows: list[dict], tok, p: int, tokens: list[str], norms,
                full: bool = False) -> Group:
    """Card 7 (analysis.lens.block_summary rows): each stage's stream norm, what its block
    changed at position `p`, and the top guess; middle columns give way to the width."""
    attn, mlp = added_names(rows)
    names = [("‖h‖ mean", "right"), ("‖h‖ at pos", "right"), (f"‖{attn}‖", "right"),
             (f"‖{mlp}‖", "right"), ("change", "right"), ("top guess", "left"),
             ("chance", "right")]
    cells = []
    for row in rows:
        has = "change" in row
        cells.append([fmt(row["norm"].mean()), fmt(row["norm"][p]),
                      fmt(row["attn_norm"][p]) if has else "",
                      fmt(row["mlp_norm"][p]) if has else "",
                      f"{row['change'][p]:.0%}" if has else "",
                      Text(show_token(tok(row["top_id"])), style="bold"),
                      f"{row['top_chance']:.1%}"])

    def build(keep: list[int | None], short: bool = False) -> Table:
        t = Table(box=None, header_style="bold dim", pad_edge=False)
        t.add_column("stage", no_wrap=True)
        for k in keep:
            name, just = ("…", "center") if k is None else names[k]
            t.add_column(name, justify=just, no_wrap=True)
        for row, line in zip(rows, cells, strict=True):
            stage = short_stage(row["stage"]) if short else row["stage"]
            t.add_row(stage, *("…" if k is None else line[k] for k in keep))
        return t

    return Group(
        header("blocks.norm", norms, "(‖h‖ of every token at every stage)"),
        Text(f"residual stream at position {p} ({show_token(tokens[p])}); change = "
             "‖after − before‖ / ‖before‖", style="dim"),
        Fit(build, len(names), full=full, narrow=lambda keep: build(keep, short=True),
            bands=True))


def short_stage(name: str) -> str:
    """A stage as the lens's columns name it where the width is short: embeddings -> emb,
    layers.2.resid_post -> 2.post."""
    if name == "embeddings":
        return "emb"
    _, i, kind = name.split(".")
    return f"{i}.{kind.removeprefix('resid_')}"


ENCODE_ROWS = 200  # rows of the encode table: the first and last hundred of a longer text


def kept_rows(n: int, most: int) -> list[int | None]:
    """0..n-1, or the first and last most/2 of them with None for the gap between."""
    if n <= most:
        return list(range(n))
    half = most // 2
    return [*range(half), None, *range(n - half, n)]


def encode_view(ids: list[int], rows: list[int | None], tokens: dict[int, str],
                starts: list[int], config) -> Group:
    """Card 1: each shown token's position, id, text and byte offsets in the UTF-8 text
    (`rows`: kept_rows; `starts`: each token's first byte, and the text's length last)."""

    t = QuickTable(box=None, header_style="bold dim", pad_edge=False)
    for name, just in (("#", "right"), ("id", "right"), ("token", "left"), ("bytes", "right")):
        t.add_column(name, justify=just, no_wrap=True)
    for i in rows:
        if i is None:
            t.add_row("…", "", Text(f"{len(ids) - len(tokens):,} tokens not shown (--json "
                                    "lists every one)", style="dim"), "")
            continue
        t.add_row(str(i), str(ids[i]), Text(show_token(tokens[i]), style="bold"),
                  f"{starts[i]}–{starts[i + 1]}")
    limit = config.n_positions
    note = f"T = {count(len(ids), 'token')}, each an id from 0 to {config.vocab_size - 1:,}"
    if len(ids) > limit:
        note += f"; more than the {limit} the model reads at once"
    return Group(ids_header(ids), t, Text(note, style="dim"))


def traced_view(shown: str, value, rows: list[int], tokens: list[str], full: bool):
    """`trace TEXT PATH`: an int as `path = n`, the token strings on a line, an array as a
    table whose rows are labelled by tokens where its first axis (or the second, of per-head
    values H x T x ...) is the tokens; each index in the path uses up one leading axis."""


    if isinstance(value, int):
        return Text(f"{shown} = {value}")
    if isinstance(value, list):  # tokens
        return Text("  ".join(show_token(t) for t in value))
    token_axis = (1 if value.ndim + len(rows) == 3 else 0) - len(rows)
    labelled = value.ndim == 3 or (token_axis == 0 and value.ndim > 0)
    return tensor_view(shown, value, tokens if labelled else None, full=full)
