"""What a picture shows, apart from how it is drawn: heatmaps, ranked bars, tables, notes.

A command builds a Figure from plain numbers and display strings; `svg.document` and
`html.document` draw the same Figure as a vector image or as one self-contained web page. No
terminal, no math here: labels are display strings (`token_labels` makes them from tokens),
values are already computed and keep their dtype (the hover text shows float32 digits).

A command that draws something takes the three options and hands the figure to present,
which writes it before it prints anything (so that a refused --save is the only output):

    from ..render.figure import Bars, Figure, Heatmap, Note, Row, Table, token_labels
    from .common import FORCE, QUIET, SAVE, present

    def lens(context: RunContext, ..., save: Path = SAVE, force: bool = FORCE,
             quiet: bool = QUIET):
        ...
        figure = lambda: Figure("logit lens", [Heatmap(probs, stage_names,
                                                       token_labels(r.tokens), path="lens",
                                                       lo=0.0, hi=1.0)])
        present(context, as_json, document, view, figure=figure, save=save, force=force)

The figure is made only when --save asks for it; --quiet prints no view, --json is not
affected.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .text import show_token, whole_characters


@dataclass(frozen=True)
class Heatmap:
    """A 2-D grid of numbers, one coloured cell each. Non-finite entries and entries where
    `masked` is True are drawn blank (a causal mask: `masked=causal_mask(T)`).

    The colour scale runs from lo to hi (default: the finite range); when the values have both
    signs and no bounds are given, or `signed` is set (a signed quantity, such as a share of a
    logit, whose 0 must look neutral even when every value has one sign), it is diverging and
    centred on 0. `gamma` < 1 bends a one-signed scale so that small values separate: the
    colour of v is ((v - lo) / (hi - lo)) ** gamma (the legend says so). A dense grid labels
    every k-th row and column, unless `every_label` (a graph's nodes, each one a name to read):
    then its cells are made wide enough for a label each, in a thinner font if need be."""

    grid: np.ndarray
    row_labels: list[str]
    col_labels: list[str]
    title: str = ""
    path: str = ""  # the trace path the values come from
    lo: float | None = None
    hi: float | None = None
    masked: np.ndarray | None = None
    note: str = ""
    signed: bool = False
    gamma: float = 1.0
    every_label: bool = False  # each row and column labelled (cells widened for it), not every k-th


@dataclass(frozen=True)
class Highlight:
    """A text in reading order, each token on a background as strong as its value (0 or
    less: none; `hi`, default the largest: the full colour), its exact value on hover; lines
    wrap between tokens. `tokens` are the model's token strings (a picture of the text, so
    spaces are drawn as spaces). `start`: the position of the first token (an excerpt of a
    longer text names its tokens' positions in that text)."""

    tokens: list[str]
    values: np.ndarray
    title: str = ""
    path: str = ""
    hi: float | None = None
    note: str = ""
    start: int = 0


@dataclass(frozen=True)
class Bars:
    """Ranked values with a bar each (top tokens, attributions): a bar grows right from 0 for
    a positive value and left for a negative one. `percent` shows values as chances."""

    labels: list[str]
    values: list[float]
    title: str = ""
    path: str = ""
    value_name: str = "value"
    ids: list[int] | None = None  # token ids, shown beside the labels when given
    percent: bool = False
    note: str = ""


@dataclass(frozen=True)
class Curve:
    """y against x as a line through the computed points (each with its exact value on
    hover), a dashed line at each of `levels` (y, label), and `marks` (x, y, label) drawn as
    rings: a circuit's faithfulness f(N) over the edges kept, say. `shown` spells a point's
    y as the terminal does (default: tables.fmt). `log_x` (every x positive) spaces x by its
    logarithm and labels each point's x: training steps kept log-spaced read evenly."""

    x: list[float]
    y: list[float]
    title: str = ""
    path: str = ""
    x_name: str = "x"
    y_name: str = "y"
    levels: list[tuple[float, str]] = ()
    marks: list[tuple[float, float, str]] = ()
    shown: object = None
    log_x: bool = False  # x on a log scale, each point's x labelled (log-spaced snapshots)


@dataclass(frozen=True)
class Table:
    """A table of strings and numbers; numbers are shown rounded, their exact value on hover."""

    columns: list[str]
    rows: list[list]
    title: str = ""
    path: str = ""
    note: str = ""


@dataclass(frozen=True)
class Note:
    """A paragraph. kind: "text", "detail" (italic), "formula" (monospace) or "dim"."""

    text: str
    kind: str = "text"


@dataclass(frozen=True)
class Facts:
    """Name-value pairs (the review page's header, a card's shape and trace path)."""

    pairs: list[tuple[str, str]]


@dataclass(frozen=True)
class Flow:
    """A vertical chain of boxes joined by arrows labelled with what flows (the model map).
    steps: (name, operation, label of the arrow below it); steps[start:stop] are drawn in a
    frame titled `repeat` (the blocks)."""

    steps: list[tuple[str, str, str]]
    top: str = ""  # above the first box (the text)
    bottom: str = ""  # below the last arrow (the picked token)
    start: int = 0
    stop: int = 0
    repeat: str = ""
    # the residual stream's bypasses: (fork, join, label): the stream leaves the main line
    # just above step `fork` and joins step `join` (an add) from the side
    bypass: tuple[tuple[int, int, str], ...] = ()


@dataclass(frozen=True)
class Row:
    """Parts side by side (the heads of a block); they wrap on a narrow screen."""

    parts: list


@dataclass(frozen=True)
class Section:
    """A heading and its parts (a card of the review page). `anchor` names it in a web page
    (id="card-5"), so a link can point at it and a test can find it."""

    heading: str
    parts: list
    anchor: str = ""


@dataclass(frozen=True)
class Figure:
    title: str
    parts: list = field(default_factory=list)
    subtitle: str = ""


# ------------------------------------------------------------------ common figures


def causal_mask(n: int) -> np.ndarray:
    """True above the diagonal: the cells a token cannot look at."""
    return np.triu(np.ones((n, n), dtype=bool), k=1)


def token_labels(tokens: list[str]) -> list[str]:
    return [show_token(t) for t in whole_characters(tokens)]


def shape_text(shape) -> str:
    return " × ".join(str(n) for n in shape) if len(shape) else "scalar"


def value_parts(path: str, value: np.ndarray, tokens: list[str], title: str = "") -> list:
    """The picture of any traced value: a 2-D array as a heatmap (rows labelled by token when
    there is one row per token), a 1-D one as a one-row heatmap, a 3-D one as one heatmap per
    leading index (heads)."""
    value = np.asarray(value)  # kept in its own dtype: the hover text shows float32 digits
    labels = token_labels(tokens)
    if value.ndim == 0:
        return [Table(["value"], [[float(value)]], title=title, path=path)]
    if value.ndim == 1:
        rows = labels if len(labels) == value.shape[0] else [str(i) for i in
                                                              range(value.shape[0])]
        return [Heatmap(value[:, None], rows, ["value"], title=title, path=path)]
    if value.ndim == 2:
        n, m = value.shape
        rows = labels if len(labels) == n else [str(i) for i in range(n)]
        square = n == m == len(labels)
        cols = labels if square else [str(j) for j in range(m)]
        return [Heatmap(value, rows, cols, title=title, path=path)]
    return [Row([p for j in range(value.shape[0])
                 for p in value_parts(f"{path}[{j}]", value[j], tokens, f"{title or path}[{j}]")])]


def value_figure(path: str, value, tokens: list[str], title: str = "", note: str = "") -> Figure:
    """A Figure of one traced value (embed, pos, norm, mlp ...)."""
    value = np.asarray(value)
    parts = value_parts(path, value, tokens)
    if note:
        parts.append(Note(note, "dim"))
    return Figure(title or path, parts, subtitle=f"{shape_text(value.shape)} for the text "
                  + " ".join(token_labels(tokens)))


LONG_GRID = 32  # tokens: from here an attention grid's colours follow sqrt(weight)


def attention_figure(path: str, grids: np.ndarray, tokens: list[str], *,
                     scores: bool = False) -> Figure:
    """Attention grids, T × T (one head) or H × T × T (every head of a block, side by side):
    rows are the token looking, columns the tokens it looks at."""
    grids = np.asarray(grids)
    labels = token_labels(tokens)
    lo, hi = (None, None) if scores else (0.0, 1.0)
    mask = causal_mask(len(labels))
    # a long text's weights are mostly near 1/T: on a linear scale every cell looks alike
    gamma = 0.5 if not scores and len(labels) > LONG_GRID else 1.0
    if grids.ndim == 2:
        body = Heatmap(grids, labels, labels, path=path, lo=lo, hi=hi, masked=mask, gamma=gamma)
    else:
        body = Row([Heatmap(g, labels, labels, title=f"head {h}", path=f"{path}[{h}]", lo=lo,
                            hi=hi, masked=mask, gamma=gamma) for h, g in enumerate(grids)])
    note = ("masked, scaled scores QK^T/sqrt(d_k); blank above the diagonal (-inf)" if scores
            else "rows: the token looking; columns: the tokens it looks at; each row sums to 1")
    return Figure(path, [body, Note(note, "dim")], subtitle=f"{shape_text(grids.shape)} for "
                  "the text " + " ".join(labels))
