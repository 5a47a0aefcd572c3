"""Figures as vector SVG: one <rect> per heatmap cell with its exact value in a <title> (shown
on hover), a colour legend, labels on both axes, and every string escaped.

`document(figure)` is a standalone .svg file; `element(part)` is one part as an <svg> element
for inlining in HTML. Sizes are estimated from a monospace font (no font metrics here); the
drawing scales as a whole, so an estimate that is a little off only moves white space.
"""

from __future__ import annotations

import html
import itertools
import re
from dataclasses import dataclass

import numpy as np

from ..words import count
from .figure import (
    Bars,
    Curve,
    Facts,
    Figure,
    Flow,
    Heatmap,
    Highlight,
    Note,
    Row,
    Section,
    Table,
    shape_text,
)
from .tables import fmt
from .text import show_token

FONT = "ui-monospace, 'DejaVu Sans Mono', Menlo, Consolas, monospace"
SIZE = 12  # font size of labels, px
MIN_LABEL = 9  # px: no label is drawn smaller (a dense grid labels every k-th row instead)
CHAR = 0.62  # width of a monospace character, in font sizes
LINE = 17
GAP = 14
INK, DIM, GRID_BG = "#1f2328", "#656d76", "#eef0f2"

_VIRIDIS = [(68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37)]
_DIVERGING = [(49, 54, 149), (116, 173, 209), (247, 247, 247), (244, 109, 67), (165, 0, 38)]
_HIGHLIGHT = [(255, 255, 255), (254, 224, 144), (253, 174, 97), (244, 109, 67)]  # ink stays legible

# Characters XML 1.0 cannot carry at all, and C0/C1 controls a reader cannot see: both are
# shown as \xNN escapes, as the terminal view shows them.
_UNSAFE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")


def esc(s) -> str:
    """Any string (a token, the user's text) as XML/HTML text or attribute content."""
    s = _UNSAFE.sub(lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100
                    else f"\\u{ord(m[0]):04x}", str(s))
    return html.escape(s, quote=True)


def width_of(s: str, size: float = SIZE) -> float:
    return len(s) * size * CHAR


def num(x: float) -> str:
    """A coordinate: short, no exponent."""
    return f"{x:.2f}".rstrip("0").rstrip(".")


def exact(x, dtype) -> str:
    """The value as its own dtype prints it: the shortest text that reads back the same."""
    if not np.isfinite(x):
        return "-inf" if x < 0 else ("inf" if x > 0 else "nan")
    kind = np.dtype(dtype).kind
    return str(np.dtype(dtype).type(x)) if kind in "fiu" else str(x)


def exacts(a: np.ndarray) -> np.ndarray:
    """exact() of every entry at once (NumPy prints the shortest round-tripping digits)."""
    if a.dtype.kind not in "fiu":
        return np.vectorize(lambda x: exact(x, a.dtype))(a)
    out = a.astype(str)
    if a.dtype.kind == "f":
        out[np.isneginf(a)], out[np.isposinf(a)], out[np.isnan(a)] = "-inf", "inf", "nan"
    return out


def ramps(stops, x: np.ndarray) -> np.ndarray:
    """ramp() of every entry at once: '#rrggbb' strings, NaN (undrawn) as black."""
    x = np.clip(np.nan_to_num(np.asarray(x, dtype=np.float64), nan=0.0), 0.0, 1.0)
    x = x * (len(stops) - 1)
    i = np.minimum(x.astype(int), len(stops) - 2)
    f = (x - i)[..., None]
    table = np.asarray(stops, dtype=np.float64)
    rgb = np.rint(table[i] + (table[i + 1] - table[i]) * f).astype(int)
    return np.vectorize(lambda r, g, b: f"#{r:02x}{g:02x}{b:02x}")(rgb[..., 0], rgb[..., 1],
                                                                   rgb[..., 2])


def ramp(stops, x: float) -> str:
    x = min(max(x, 0.0), 1.0) * (len(stops) - 1)
    i = min(int(x), len(stops) - 2)
    f = x - i
    r, g, b = (round(a + (c - a) * f) for a, c in zip(stops[i], stops[i + 1], strict=True))
    return f"#{r:02x}{g:02x}{b:02x}"


def heading(title: str | None, info: str | None, after: float = 20) -> tuple[list[str], float]:
    """A part's bold title and dim info line, each when given: (its elements, the y below)."""
    out, top = [], 0.0
    if title:
        out.append(text(0, 15, title, size=14, weight="bold"))
        top += 22
    if info:
        out.append(text(0, top + 12, info, size=11, fill=DIM))
        top += after
    return out, top


def text(x, y, s, *, size=SIZE, fill=INK, anchor="start", weight="", style="", extra="",
         cls="") -> str:
    attrs = f'x="{num(x)}" y="{num(y)}" font-size="{num(size)}"'
    if fill != INK:
        attrs += f' fill="{fill}"'
    if anchor != "start":
        attrs += f' text-anchor="{anchor}"'
    if weight:
        attrs += f' font-weight="{weight}"'
    if style:
        attrs += f' font-style="{style}"'
    if cls:
        attrs += f' class="{cls}"'
    return f"<text {attrs}{extra}>{esc(s)}</text>"


@dataclass
class Block:
    """A drawn part: SVG content with its top-left corner at 0, 0, and its size."""

    body: str
    w: float
    h: float


_ids = itertools.count()  # unique in a process; each document numbers its own (numbered)


def numbered(markup: str) -> str:
    """The legends' gradient ids renumbered from 0 in the order they appear: still unique in
    a page, and a picture's bytes never depend on the pictures drawn before it in the same
    process (a second command, a second --each-line line)."""
    seen: dict[str, int] = {}

    def one(m: re.Match) -> str:
        return f"{m[1]}scale{seen.setdefault(m[2], len(seen))}{m[3]}"

    return re.sub(r'(id="|url\(#)scale(\d+)([")])', one, markup)


# ------------------------------------------------------------------ heatmaps


def scale(h: Heatmap, grid: np.ndarray, drawn: np.ndarray) -> tuple[float, float, list]:
    """lo, hi and the colour stops: diverging around 0 for signed values without bounds."""
    finite = grid[drawn]
    lo = h.lo if h.lo is not None else (float(finite.min()) if finite.size else 0.0)
    hi = h.hi if h.hi is not None else (float(finite.max()) if finite.size else 1.0)
    if h.lo is None and h.hi is None and (lo < 0 < hi or h.signed):
        lim = max(-lo, hi) or 1.0  # all zeros: still a scale, with 0 in its middle
        return -lim, lim, _DIVERGING
    return lo, hi, _VIRIDIS


def heatmap(h: Heatmap) -> Block:
    raw = np.asarray(h.grid)
    grid = np.atleast_2d(raw.astype(np.float64))
    n, m = grid.shape
    drawn = np.isfinite(grid)
    if h.masked is not None:
        drawn &= ~np.asarray(h.masked, dtype=bool)
    lo, hi, stops = scale(h, grid, drawn)
    span = hi - lo if hi > lo else 1.0
    square = n == m and list(h.row_labels) == list(h.col_labels)
    cw = min(max(480 / m, 8 if square else 3), 30)
    ch = cw if square else min(max(cw, 14), 30)
    if h.every_label:  # a label of MIN_LABEL px fits each cell, with 1 px between two
        cw, ch = max(cw, MIN_LABEL + 1), max(ch, MIN_LABEL + 1)
    fs = max(MIN_LABEL, min(SIZE, ch - 2))
    fc = max(MIN_LABEL, min(fs, cw - 1)) if h.every_label else fs  # the columns' font
    bent = h.gamma != 1.0 and stops is not _DIVERGING
    rw = max((width_of(s, fs) for s in h.row_labels), default=0) + 8
    info = (f"{h.path + '  ' if h.path else ''}{shape_text(raw.shape)}  "
            f"range [{fmt(lo)}, {fmt(hi)}]" + (f"  colour ∝ value^{h.gamma:g}" if bent else ""))
    out, top = heading(h.title, info)
    ch_h = max((width_of(s, fc) for s in h.col_labels), default=0) + 8
    gx, gy = rw, top + ch_h
    for j in labelled(m, cw, fc):  # written upwards; every one that has room (all on hover)
        cx = gx + (j + 0.5) * cw
        out.append(text(cx + fc * 0.35, gy - 5, h.col_labels[j], size=fc, fill=DIM, cls="col",
                        extra=f' transform="rotate(-90 {num(cx + fc * 0.35)} {num(gy - 5)})"'))
    for i in labelled(n, ch, fs):
        out.append(text(gx - 6, gy + (i + 0.5) * ch + fs * 0.35, h.row_labels[i], size=fs,
                        anchor="end", cls="row"))
    out.append(f'<rect x="{num(gx)}" y="{num(gy)}" width="{num(m * cw)}" '
               f'height="{num(n * ch)}" fill="{GRID_BG}"/>')
    numbered = [str(j) for j in range(m)] == list(h.col_labels)
    rows = [esc(f"row {i} {label} · ") for i, label in enumerate(h.row_labels)]
    cols = [esc(f"column {j}" if numbered else f"column {j} {label}")
            for j, label in enumerate(h.col_labels)]
    # Up to 128 × 128 cells a grid, a dozen grids a page: everything per cell is precomputed.
    where = (grid - lo) / span
    if bent:
        where = np.clip(where, 0.0, None) ** h.gamma
    fills = ramps(stops, where).tolist()
    values = exacts(raw.reshape(n, m)).tolist()
    xs = [num(gx + j * cw) for j in range(m)]
    ys = [num(gy + i * ch) for i in range(n)]
    size = f'width="{num(cw)}" height="{num(ch)}"'
    for i, j in zip(*(a.tolist() for a in np.nonzero(drawn)), strict=True):
        out.append(f'<rect class="cell" x="{xs[j]}" y="{ys[i]}" {size} fill="{fills[i][j]}">'
                   f"<title>{rows[i]}{cols[j]} = {values[i][j]}</title></rect>")
    bottom = gy + n * ch
    legend, lh = _legend(lo, hi, stops, masked=bool((~drawn).any()),
                         gamma=h.gamma if bent else 1.0)
    out.append(f'<g transform="translate({num(gx)} {num(bottom + 10)})">{legend}</g>')
    w = max(gx + m * cw, gx + 260, width_of(info, 11), width_of(h.title, 14))
    hgt = bottom + 10 + lh
    if h.note:
        out.append(text(0, hgt + 14, h.note, size=11, fill=DIM))
        w = max(w, width_of(h.note, 11))
        hgt += 20
    return Block("\n".join(out), w, hgt)


def labelled(count: int, cell: float, size: float) -> list[int]:
    """The rows (or columns) of cells `cell` px apart that get a label of `size` px: every
    k-th, k as small as keeps labels from overlapping, and always the last."""
    k = max(1, int(np.ceil((size + 1) / cell)))
    idx = list(range(0, count, k))
    if idx and idx[-1] != count - 1:
        if (count - 1 - idx[-1]) * cell >= size + 1:
            idx.append(count - 1)
        else:
            idx[-1] = count - 1
    return idx


def _legend(lo: float, hi: float, stops, masked: bool, gamma: float = 1.0
            ) -> tuple[str, float]:
    gid = f"scale{next(_ids)}"
    width = 160
    at = [k / (len(stops) - 1) for k in range(len(stops))]
    grad = "".join(f'<stop offset="{num(x)}" stop-color="{ramp(stops, x)}"/>' for x in at)
    out = [f'<defs><linearGradient id="{gid}">{grad}</linearGradient></defs>',
           f'<rect class="legend" width="{width}" height="10" fill="url(#{gid})"/>',
           text(0, 24, fmt(lo), size=10, fill=DIM),
           text(width / 2, 24, fmt(lo + (hi - lo) * 0.5 ** (1 / gamma)), size=10, fill=DIM,
                anchor="middle"),
           text(width, 24, fmt(hi), size=10, fill=DIM, anchor="end")]
    if masked:
        out += [f'<rect x="{width + 16}" width="10" height="10" fill="{GRID_BG}" '
                f'stroke="{DIM}" stroke-width="0.5"/>',
                text(width + 30, 9, "blank: masked", size=10, fill=DIM)]
    return "".join(out), 28


def highlight(h: Highlight, max_width: float = 720) -> Block:
    """The text token by token, each on a <rect class="cell"> coloured by its value, with
    "position i token = value" in its <title>; a line ends after a newline token or where the
    next token would pass max_width."""
    raw = np.asarray(h.values)
    vals = np.nan_to_num(raw.astype(np.float64), nan=0.0)
    hi = h.hi if h.hi is not None else float(vals.max(initial=0.0))
    hi = hi if hi > 0 else 1.0
    fills = ramps(_HIGHLIGHT, np.clip(vals, 0.0, None) / hi).tolist()
    exact_vals = exacts(raw.reshape(-1)).tolist()
    info = (f"{h.path + '  ' if h.path else ''}{count(len(h.tokens), 'token')}  "
            f"range [0, {fmt(hi)}]")
    out, top = heading(h.title, info)
    x, y, pad, w = 0.0, top, 2.0, 0.0
    for i, token in enumerate(h.tokens):
        shown = show_token(token).replace("␣", " ")
        cw = width_of(shown) + 2 * pad
        if x > 0 and x + cw > max_width:
            x, y = 0.0, y + LINE + 4
        tip = esc(f"position {h.start + i} {show_token(token)} = {exact_vals[i]}")
        out.append(f'<rect class="cell" x="{num(x)}" y="{num(y)}" width="{num(cw)}" '
                   f'height="{LINE}" fill="{fills[i]}"><title>{tip}</title></rect>')
        out.append(text(x + pad, y + 13, shown, extra=' xml:space="preserve"'))
        x += cw
        w = max(w, x)
        if token.endswith("\n"):
            x, y = 0.0, y + LINE + 4
    bottom = y + LINE + (0 if x else -LINE - 4) + 10
    legend, lh = _legend(0.0, hi, _HIGHLIGHT, masked=False)
    out.append(f'<g transform="translate(0 {num(bottom)})">{legend}</g>')
    hgt = bottom + lh
    if h.note:
        out.append(text(0, hgt + 14, h.note, size=11, fill=DIM))
        w, hgt = max(w, width_of(h.note, 11)), hgt + 20
    return Block("\n".join(out), max(w, 260, width_of(info, 11), width_of(h.title, 14)), hgt)


# ------------------------------------------------------------------ bars and tables


def bars(b: Bars) -> Block:
    vals = [float(v) for v in b.values]
    show = [f"{v:.1%}" if b.percent else fmt(v) for v in vals]
    lw = max((width_of(s) for s in b.labels), default=0) + 12
    idw = max((width_of(str(i)) for i in (b.ids or [])), default=0) + 10 if b.ids else 0
    rankw = width_of(str(len(vals))) + 10
    barw = 220
    neg = any(v < 0 for v in vals)
    big = max((abs(v) for v in vals), default=0) or 1.0
    zero = barw / 2 if neg else 0
    per = (barw / 2 if neg else barw) / big
    info = f"{b.path + '  ' if b.path else ''}{b.value_name}, {len(vals)} shown"
    out, top = heading(b.title, info, after=22)
    x0 = rankw + idw + lw
    for k, (label, v, s) in enumerate(zip(b.labels, vals, show, strict=True)):
        y = top + k * 20
        out.append(text(rankw - 8, y + 13, str(k + 1), fill=DIM, anchor="end"))
        if b.ids:
            out.append(text(rankw + idw - 8, y + 13, str(b.ids[k]), fill=DIM, anchor="end"))
        out.append(text(rankw + idw, y + 13, label, weight="bold", cls="row"))
        bx = x0 + zero + min(0.0, v * per)
        tip = f"{k + 1}. {label}: {b.value_name} = {exact(v, np.float64)}"
        out.append(f'<rect class="bar" x="{num(bx)}" y="{num(y + 3)}" '
                   f'width="{num(max(abs(v) * per, 0.5))}" height="13" '
                   f'fill="{"#2f81f7" if v >= 0 else "#cf222e"}"><title>{esc(tip)}</title></rect>')
        out.append(text(x0 + barw + 8, y + 13, s))
    if neg:
        out.append(f'<line x1="{num(x0 + zero)}" x2="{num(x0 + zero)}" y1="{num(top)}" '
                   f'y2="{num(top + 20 * len(vals))}" stroke="{DIM}" stroke-width="0.7"/>')
    h = top + 20 * len(vals) + 4
    w = max(x0 + barw + 8 + max((width_of(s) for s in show), default=0), width_of(info, 11))
    if b.note:
        out.append(text(0, h + 12, b.note, size=11, fill=DIM))
        w, h = max(w, width_of(b.note, 11)), h + 18
    return Block("\n".join(out), w, h)


def curve(c: Curve, width: float = 440, height: float = 200) -> Block:
    """The points joined by a line in a framed plot, y from min(0, y) to max(1, y) so that a
    fraction reads against its 0 and 1; x from its least to its largest value."""
    xs, ys = np.asarray(c.x, np.float64), np.asarray(c.y, np.float64)
    show = c.shown or fmt

    def _x(x: float) -> str:  # a count (edges kept) as a whole number
        return str(int(x)) if float(x).is_integer() else fmt(x)

    level_ys = [y for y, _ in c.levels]  # a level outside the points' range still shows
    lo = min(0.0, float(ys.min(initial=0.0)), *level_ys)
    hi = max(1.0, float(ys.max(initial=1.0)), *level_ys)
    log_x = c.log_x and len(xs) > 0 and bool((xs > 0).all())
    at = np.log10 if log_x else (lambda x: x)  # where an x sits along the axis
    x_lo, x_hi = ((float(at(xs.min())), float(at(xs.max()))) if log_x
                  else (float(xs.min(initial=0.0)), float(xs.max(initial=1.0))))
    info = f"{c.path + '  ' if c.path else ''}{c.y_name} against {c.x_name}, " \
           f"{count(len(xs), 'point')}"
    out, top = heading(c.title, info, after=22)
    left = max(width_of(show(lo)), width_of(show(hi))) + 10

    def px(x: float) -> float:
        return left + (float(at(x)) - x_lo) / ((x_hi - x_lo) or 1.0) * width

    def py(y: float) -> float:
        return top + height - (y - lo) / ((hi - lo) or 1.0) * height

    out.append(f'<rect x="{num(left)}" y="{num(top)}" width="{num(width)}" '
               f'height="{num(height)}" fill="none" stroke="#d0d7de"/>')
    for y in sorted({lo, 0.0, 1.0, hi}):  # lo <= 0 and 1 <= hi
        out.append(text(left - 6, py(y) + 4, show(y), fill=DIM, anchor="end", size=11))
    ticks = sorted(set(xs.tolist())) if log_x else [x_lo, x_hi]
    for x in ticks:
        out.append(text(px(x), top + height + 14, _x(x), fill=DIM, anchor="middle", size=11))
    out.append(text(left + width / 2, top + height + 30,
                    c.x_name + (" (log scale)" if log_x else ""), fill=DIM, anchor="middle",
                    size=11))
    label_w = 0.0
    for y, label in c.levels:
        out.append(f'<line x1="{num(left)}" x2="{num(left + width)}" y1="{num(py(y))}" '
                   f'y2="{num(py(y))}" stroke="{DIM}" stroke-width="0.8" stroke-dasharray="4 3"/>')
        out.append(text(left + width + 6, py(y) + 4, label, fill=DIM, size=11))
        label_w = max(label_w, width_of(label, 11) + 6)
    line = " ".join(f"{num(px(x))},{num(py(y))}" for x, y in zip(xs, ys, strict=True))
    out.append(f'<polyline points="{line}" fill="none" stroke="#2f81f7" stroke-width="1.5"/>')
    for x, y in zip(xs, ys, strict=True):
        tip = esc(f"{c.x_name} {_x(x)}: {c.y_name} = {show(y)}")
        out.append(f'<circle class="point" cx="{num(px(x))}" cy="{num(py(y))}" r="2.5" '
                   f'fill="#2f81f7"><title>{tip}</title></circle>')
    for k, (x, y, label) in enumerate(c.marks):
        out.append(f'<circle class="mark" cx="{num(px(x))}" cy="{num(py(y))}" r="6" '
                   f'fill="none" stroke="#cf222e" stroke-width="1.5"><title>'
                   f'{esc(f"{label}: {c.x_name} {_x(x)}, {c.y_name} = {show(y)}")}</title>'
                   '</circle>')
        out.append(text(left, top + height + 48 + 16 * k, f"◯ {label}: {c.x_name} {_x(x)}, "
                        f"{c.y_name} {show(y)}", fill="#cf222e", size=11))
    h = top + height + 38 + 16 * len(c.marks) + (10 if c.marks else 0)
    marks_w = max((width_of(f"◯ {lb}: {c.x_name} {_x(x)}, {c.y_name} {show(y)}", 11)
                   for x, y, lb in c.marks), default=0.0)
    return Block("\n".join(out), max(left + width + label_w, width_of(info, 11), marks_w), h)


def cell_text(v) -> str:
    if isinstance(v, bool | str) or v is None:
        return "" if v is None else str(v)
    if isinstance(v, int | np.integer):
        return str(int(v))
    return fmt(float(v))


def table(t: Table) -> Block:
    cells = [list(t.columns)] + [[cell_text(v) for v in row] for row in t.rows]
    widths = [max(width_of(r[c]) for r in cells if c < len(r)) + 16
              for c in range(max(len(r) for r in cells))]
    out, top = heading(t.title, t.path)
    for k, row in enumerate(cells):
        x = 0.0
        for c, s in enumerate(row):
            header = k == 0 and bool(t.columns)
            out.append(text(x, top + k * LINE + 13, s, fill=DIM if header else INK,
                            weight="bold" if header else ""))
            x += widths[c]
    h = top + len(cells) * LINE + 4
    w = max(sum(widths), width_of(t.path, 11), width_of(t.title, 14))
    if t.note:
        out.append(text(0, h + 12, t.note, size=11, fill=DIM))
        w, h = max(w, width_of(t.note, 11)), h + 18
    return Block("\n".join(out), w, h)


def wrap(s: str, chars: int) -> list[str]:
    lines = []
    for para in s.split("\n"):
        line = ""
        for word in para.split(" "):
            if line and len(line) + 1 + len(word) > chars:
                lines.append(line)
                line = word
            else:
                line = f"{line} {word}" if line else word
        lines.append(line)
    return lines


def note(n: Note, width: float = 640) -> Block:
    style = {"detail": dict(style="italic"), "dim": dict(fill=DIM), "formula": {}}.get(n.kind,
                                                                                    {})
    lines = wrap(n.text, int(width / (SIZE * CHAR)))
    out = [text(0, k * LINE + 13, s, **style) for k, s in enumerate(lines)]
    return Block("\n".join(out), max((width_of(s) for s in lines), default=0),
                 len(lines) * LINE + 2)


def facts(f: Facts) -> Block:
    kw = max((width_of(k) for k, _ in f.pairs), default=0) + 14
    out = []
    for k, (name, value) in enumerate(f.pairs):
        out += [text(0, k * LINE + 13, name, fill=DIM),
                text(kw, k * LINE + 13, value, weight="bold")]
    w = kw + max((width_of(v) for _, v in f.pairs), default=0)
    return Block("\n".join(out), w, len(f.pairs) * LINE + 2)


# ------------------------------------------------------------------ the model map


def flow(f: Flow) -> Block:
    bw, bh, ah = 420, 38, 30
    x0 = 24
    out, y = [], 0.0
    if f.top:
        out.append(text(x0, 14, f.top, weight="bold", fill="#1a7f37"))
        y = 20
        out.append(_arrow(x0 + 20, y, ah, ""))
        y += ah
    frame_top, tops = None, []
    rails = len(f.bypass)  # each bypass has its own lane right of the boxes
    for k, (name, op, below) in enumerate(f.steps):
        if k == f.start and f.stop > f.start:
            frame_top = y
            y += 28 if rails else 22  # a bypass's first fork passes below the frame's title
        tops.append(y)
        out.append(f'<rect class="box" x="{x0}" y="{num(y)}" width="{bw}" height="{bh}" '
                   f'rx="5" fill="#f6f8fa" stroke="#d0d7de"/>')
        out.append(text(x0 + 10, y + 16, name, weight="bold"))
        out.append(text(x0 + 10, y + 31, op, size=11, fill=DIM))
        y += bh
        if k + 1 == f.stop and frame_top is not None:
            y += 8
            out.append(f'<rect x="{x0 - 14}" y="{num(frame_top)}" width="{bw + 28 + 12 * rails}" '
                       f'height="{num(y - frame_top)}" rx="8" fill="none" stroke="#0969da" '
                       f'stroke-dasharray="5 3"/>')
            out.append(text(x0 - 4, frame_top + 15, f.repeat, size=12, fill="#0969da",
                            weight="bold"))
        if below or k + 1 < len(f.steps) or f.bottom:
            out.append(_arrow(x0 + 20, y, ah, below))
            y += ah
    if f.bottom:
        out.append(text(x0, y + 14, f.bottom, weight="bold", fill="#1a7f37"))
        y += 20
    for lane, (fork, join, label) in enumerate(f.bypass):
        out.append(_bypass(x0 + 20, tops[fork] - 4, x0 + bw, tops[join] + bh / 2,
                           x0 + bw + 12 * (lane + 1), label))
    w = max(x0 + bw + 16 + 12 * rails, width_of(f.top) + x0, width_of(f.bottom) + x0)
    return Block("\n".join(out), w, y + 4)


def _bypass(x_main, y_fork, x_box, y_join, x_lane, label) -> str:
    """The residual stream's way around a sublayer: from the main line just above the
    sublayer, right to its lane, down, and into the add's box from the side, where a ⊕
    marks the sum."""
    return (f'<path class="bypass" d="M{num(x_main)} {num(y_fork)} H{num(x_lane)} '
            f'V{num(y_join)} H{num(x_box + 7)}" fill="none" stroke="#bf8700" '
            f'stroke-width="1.4"><title>{esc(label)}</title></path>'
            f'<circle class="join" cx="{num(x_box)}" cy="{num(y_join)}" r="7" fill="#fff8c5" '
            f'stroke="#bf8700" stroke-width="1.4"/>'
            + text(x_box, y_join + 4.5, "+", size=13, anchor="middle", fill="#bf8700",
                   weight="bold"))


def _arrow(x, y, h, label) -> str:
    return (f'<line x1="{num(x)}" y1="{num(y + 2)}" x2="{num(x)}" y2="{num(y + h - 6)}" '
            f'stroke="{DIM}" stroke-width="1.2"/>'
            f'<path d="M{num(x - 4)} {num(y + h - 8)} L{num(x)} {num(y + h - 2)} '
            f'L{num(x + 4)} {num(y + h - 8)}" fill="none" stroke="{DIM}" stroke-width="1.2"/>'
            + (text(x + 12, y + h / 2 + 4, label, size=11, fill="#8250df") if label else ""))


# ------------------------------------------------------------------ composition


def block(part) -> Block:
    if isinstance(part, Heatmap):
        return heatmap(part)
    if isinstance(part, Bars):
        return bars(part)
    if isinstance(part, Highlight):
        return highlight(part)
    if isinstance(part, Curve):
        return curve(part)
    if isinstance(part, Table):
        return table(part)
    if isinstance(part, Note):
        return note(part)
    if isinstance(part, Facts):
        return facts(part)
    if isinstance(part, Flow):
        return flow(part)
    if isinstance(part, Row):
        return row(part.parts)
    if isinstance(part, Section):
        inner = stack([Note(part.heading, "heading")] + list(part.parts))
        return Block(f'<rect x="-10" y="-8" width="{num(inner.w + 20)}" '
                     f'height="{num(inner.h + 14)}" rx="8" fill="none" stroke="#d0d7de"/>'
                     + inner.body, inner.w, inner.h + 8)
    raise TypeError(f"cannot draw {type(part).__name__}")


def stack(parts: list, gap: float = GAP) -> Block:
    out, y, w = [], 0.0, 0.0
    for part in parts:
        if isinstance(part, Note) and part.kind == "heading":
            b = Block(text(0, 16, part.text, size=16, weight="bold"), width_of(part.text, 16),
                      22)
        else:
            b = block(part)
        out.append(f'<g transform="translate(0 {num(y)})">{b.body}</g>')
        y += b.h + gap
        w = max(w, b.w)
    return Block("\n".join(out), w, max(y - gap, 0))


def row(parts: list, max_width: float = 1200) -> Block:
    """Side by side, wrapping onto a new line past max_width."""
    out, x, y, line_h, w = [], 0.0, 0.0, 0.0, 0.0
    for part in parts:
        b = block(part)
        if x > 0 and x + b.w > max_width:
            x, y, line_h = 0.0, y + line_h + GAP * 2, 0.0
        out.append(f'<g transform="translate({num(x)} {num(y)})">{b.body}</g>')
        x += b.w + GAP * 2
        line_h = max(line_h, b.h)
        w = max(w, x - GAP * 2)
    return Block("\n".join(out), w, y + line_h)


def _svg(b: Block, title: str, margin: float = 12, *, standalone: bool) -> str:
    w, h = b.w + 2 * margin, b.h + 2 * margin
    ns = ' xmlns="http://www.w3.org/2000/svg"' if standalone else ""
    return (f'<svg{ns} viewBox="0 0 {num(w)} {num(h)}" width="{num(w)}" height="{num(h)}" '
            f'role="img" font-family="{esc(FONT)}" fill="{INK}">'
            f"<title>{esc(title)}</title>"
            f'<g transform="translate({margin} {margin})">{b.body}</g></svg>')


def element(part, title: str = "") -> str:
    """One part as an inline <svg> element (for HTML)."""
    name = title or getattr(part, "title", "") or getattr(part, "path", "") or "figure"
    return _svg(block(part), name, 6, standalone=False)


def document(figure: Figure) -> str:
    """The whole figure as a standalone SVG file."""
    head = [Note(figure.title, "heading")]
    if figure.subtitle:
        head.append(Note(figure.subtitle, "dim"))
    b = stack(head + list(figure.parts))
    title = figure.title + (f" — {figure.subtitle}" if figure.subtitle else "")
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + numbered(_svg(b, title, standalone=True)) \
        + "\n"
