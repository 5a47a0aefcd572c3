"""Views of the "why this token" analyses: labelled heatmaps, ranked lists, short summaries.

Renderers take plain numbers and strings (token strings already looked up) and know nothing
of how they were computed. Every token string passes through show_token.
"""

from __future__ import annotations

import numpy as np
from rich.columns import Columns
from rich.console import Group
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from ..escapes import escape_line
from .tables import Fields, Fit, WhenStyled, colour, fmt, header, short_stage, token_rows
from .text import neuron_scales, scales, show_token

# ------------------------------------------------------------------ a general labelled heatmap


def diverging(x: float) -> str:
    """Blue for negative, red for positive, white at 0; x in [-1, 1]."""
    x = min(max(x, -1.0), 1.0)
    if x >= 0:
        c = round(255 * (1 - x))
        return f"rgb(255,{c},{c})" if x > 0 else "rgb(255,255,255)"
    c = round(255 * (1 + x))
    return f"rgb({c},{c},255)"


def cell_text(x: float, percent: bool) -> str:
    if percent:
        if abs(x) >= 99.995:
            return f"{x:.0e}"
        return f"{x:.0%}" if abs(x) >= 0.005 else "0%"
    if abs(x) >= 1000:
        return f"{x:.0e}"
    digits = 0 if abs(x) >= 100 else (1 if abs(x) >= 10 else 2)
    s = f"{x:.{digits}f}"
    return s.lstrip("-") if float(s) == 0 else s


def grid(values: np.ndarray, row_labels: list[str], col_labels: list[str], *,
         title: str = "", signed: bool = True, percent: bool = False,
         text: list[list[str]] | None = None, width: int = 6,
         lo: float | None = None, hi: float | None = None,
         big: float | None = None) -> Table | Group:
    """A heatmap of any [R, C] grid with labelled rows and columns.

    signed: colours diverge around 0, scaled by `big` (default: the largest size); else
    viridis from lo to hi. Grids shown side by side share a scale by passing the same one.
    text: strings to show in the cells instead of the numbers (the numbers still colour them).
    NaN cells (nothing to show) are a dim dot.
    """
    values = np.asarray(values, np.float64)
    finite = values[np.isfinite(values)]
    if big is None:
        big = float(np.abs(finite).max()) if finite.size else 1.0
    lo = (float(finite.min()) if finite.size else 0.0) if lo is None else lo
    hi = (float(finite.max()) if finite.size else 1.0) if hi is None else hi
    shown = [[(text[i][j] if text is not None else cell_text(float(x), percent))
              if np.isfinite(x) else "" for j, x in enumerate(row)]
             for i, row in enumerate(values)]
    # a cell is never cut (-1067% as `-1067`, ␣favorite as `␣favori` say something else):
    # each column as wide as its longest
    widths = [max([width] + [len(row[j]) for row in shown]) for j in range(values.shape[1])]
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold dim",
                  padding=(0, 1, 0, 0))
    table.add_column("", no_wrap=True, style="bold")
    for label, w in zip(col_labels, widths, strict=True):
        table.add_column(label, justify="center" if text is not None else "right",
                         no_wrap=True, min_width=w)
    for i, row in enumerate(values):
        cells = [Text(row_labels[i])]
        for j, x in enumerate(row):
            if not np.isfinite(x):  # a hidden column says so; `·` means masked, as in attn
                glyph = "…" if col_labels[j] == "…" else "·"
                cells.append(Text(glyph.center(widths[j]), style="dim"))
                continue
            # numbers right-aligned (their digits line up: 100% over 86%), tokens centred
            s = (shown[i][j].center if text is not None else shown[i][j].rjust)(widths[j])
            if signed:
                level = float(x) / big if big > 0 else 0.0
                style = f"black on {diverging(level)}"
            else:
                level = (float(x) - lo) / (hi - lo) if hi > lo else 0.0
                style = f"{'black' if level > 0.55 else 'white'} on {colour(level)}"
            cells.append(Text(s, style=style))
        table.add_row(*cells)
    return Group(Text(title, style="bold"), table) if title else table


class Bar:
    """A signed bar, |x| / big of the cells its column gets (at most n): red for positive,
    blue for negative. On a narrow terminal the column gives way before the numbers beside
    it, and every bar in it shrinks alike, so their lengths still compare."""

    def __init__(self, x: float, big: float, n: int = 24):
        self.x, self.big, self.n = x, big, n

    def cells(self, width: int) -> int:
        return round(abs(self.x) / self.big * width) if self.big > 0 else 0

    def __rich_console__(self, console, options):
        width = min(self.n, options.max_width)
        yield Text("█" * self.cells(width), style="red" if self.x > 0 else "blue")

    def __rich_measure__(self, console, options):

        return Measurement(0, min(self.n, options.max_width))


LABEL = 20  # a token row label and its padding


def patch_width(n_layer: int, n_head: int) -> int:
    """Room for one of patch's grids (they flow onto as many lines as the width needs)."""
    return LABEL + 7 * max(n_layer, n_head) + 8


def grid_width(tokens: list[str], columns: int, cell: int = 6) -> int:
    """The columns one `grid` of token rows takes: its labels, then a cell and a space each."""
    return max((len(r) for r in token_rows(tokens)), default=0) + 1 + (cell + 1) * columns


def note(s: str) -> Text:
    return Text(s, style="dim")


def token_line(label: str, token_id: int, token: str) -> Text:
    t = Text(f"{label} ")
    t.append(show_token(token), style="bold")
    t.append(f" (id {token_id})", style="dim")
    return t


# ------------------------------------------------------------------ lens


def stage_grid(probs: np.ndarray, rows: list[str], labels: list[str],
               shown: list[list[str]]) -> Fit:
    """The lens grid [T, S]: where the width is short, the stages go on below in bands, every
    one shown; a token is never cut (`grid`)."""
    def build(keep: list[int | None]):
        cols = [probs[:, j] if j is not None else np.full(len(rows), np.nan) for j in keep]
        text = [[row[j] if j is not None else "" for j in keep] for row in shown]
        return grid(np.stack(cols, axis=1), rows, [labels[j] if j is not None else "…"
                                                   for j in keep],
                    signed=False, text=text, width=7, lo=0.0, hi=1.0)

    return Fit(build, probs.shape[1], bands=True)


def lens_note(kind: str, tied: bool) -> str:
    """What each lens does to a stage, in the view and the picture; the head as the model
    has it (NeoX's is its own W_U, not the embedding table)."""
    head = "the tied head" if tied else "the output head (W_U, untied)"
    return {"logit": f"each stage through the final norm (its statistics recomputed) and {head}",
            "tuned": "the tuned lens: each block's input through its learned translator, "
                     f"ln_final(h + h A + b), then {head}"}[kind]


def lens_view(r) -> Group:
    """A LensReport (analysis.lens): each position's likeliest next token per stage, and the
    target's chance and rank after each stage."""
    stages, tokens, top_tokens, top_probs = r.stages, r.q.tokens, r.top_tokens, r.top_probs.T
    target, position = r.q.target_pair, r.q.position
    target_probs, target_ranks, kind, tied = r.target_probs, r.target_ranks, r.kind, r.tied
    labels = [short_stage(s) for s in stages]
    shown = [[show_token(t) for t in row] for row in top_tokens]
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold dim")
    table.add_column("stage", no_wrap=True)
    table.add_column("chance", justify="right", no_wrap=True)
    table.add_column("rank", justify="right", no_wrap=True)
    table.add_column("", no_wrap=True)
    for name, p, r in zip(stages, target_probs, target_ranks, strict=True):
        table.add_row(name, f"{p:.2%}", str(int(r)), Text("█" * round(p * 30), style="green"))
    return Group(
        header(f"{kind} lens", top_probs, "(top token's chance, position × stage)"),
        note(lens_note(kind, tied)),
        WhenStyled(note("colour: that token's chance"), in_colour=True),
        stage_grid(top_probs, token_rows(tokens), labels, shown),
        Text(""),
        token_line(f"the target at position {position} ({show_token(tokens[position])}):",
                   *target),
        table,
    )


# ------------------------------------------------------------------ direct logit attribution


def dla_view(r, top: int) -> Group:
    """A DLAReport (analysis.dla): the head grid, the `top` largest parts, the neurons."""
    labels, values, heads, score = r.dla.labels, r.dla.values, r.dla.heads, r.dla.score
    what, position, neurons = r.q.what, r.q.position, r.dla.neurons
    frozen = r.dla.frozen
    token = r.q.tokens[position]
    big = float(np.abs(values).max()) if values.size else 1.0
    order = np.argsort(-np.abs(values), kind="stable")[:top]
    ranked = Table(box=None, pad_edge=False, show_edge=False, header_style="bold dim")
    for name, just in (("#", "right"), ("part", "left"), ("share", "right"), ("", "left")):
        ranked.add_column(name, justify=just, no_wrap=bool(name))  # the bars may give way
    for r, k in enumerate(order, 1):
        ranked.add_row(str(r), labels[k], fmt(float(values[k])), Bar(float(values[k]), big))
    n_layer, n_head = heads.shape
    parts = [
        header("dla", values, f"({len(labels)} parts of the stream at position {position} "
               f"({show_token(token)}))"),
        note(f"score: {what} = {fmt(score)}; the parts add up to {fmt(float(values.sum()))}"),
        grid(heads, [f"layer {i}" for i in range(n_layer)], [f"head {h}" for h in range(n_head)],
             title=f"heads (z_h W_O[h], through {scales(frozen['heads'])})"),
        Text(""),
        Text(f"the {len(order)} largest parts of {len(labels)}", style="bold"),
        ranked,
    ]
    if neurons:
        nt = Table(box=None, pad_edge=False, show_edge=False, header_style="bold dim")
        for name in ("layer", "neuron", "activation", "share"):
            nt.add_column(name, justify="right", no_wrap=True)
        nt.add_column("", no_wrap=True)
        nbig = max(abs(n["value"]) for n in neurons)
        for n in neurons:
            nt.add_row(str(n["layer"]), str(n["neuron"]), fmt(n["activation"]),
                       fmt(n["value"]), Bar(n["value"], nbig))
        parts += [Text(""), Text(f"the {len(neurons)} largest single neurons "
                                 f"(mlp_post[n] W_2[n]{neuron_scales(frozen['mlp'])}; part of "
                                 "their block's mlp row)",
                                 style="bold"), nt]
    return Group(*parts)


# ------------------------------------------------------------------ ablation


def ablation_view(r) -> Group:
    """An AblationReport (analysis.ablate): one component's effect, or every one ranked."""
    target, position, first = r.q.target_pair, r.q.position, r.rows[0]
    if r.every:
        return ablate_all_view(
            [row | {"top": row["top_after"][0]["token"], "top_prob": row["top_after"][0]["chance"]}
             for row in r.rows], r.mode, target, position, first["logp_before"])
    return ablate_view(first["label"], r.mode, target, position, first["logp_before"],
                       first["logp_after"], first["kl"],
                       [(d["token"], d["chance"]) for d in r.top_before],
                       [(d["token"], d["chance"]) for d in first["top_after"]])


def ablate_view(label: str, mode: str, target: tuple[int, str], position: int,
                logp_before: float, logp_after: float, kl: float,
                top_before: list[tuple[str, float]], top_after: list[tuple[str, float]]) -> Group:
    t = Table(box=None, pad_edge=False, show_edge=False, header_style="bold dim", show_header=False)
    # the labels stay whole; the values wrap between their fields, never cut at the edge
    t.add_column("", style="dim", no_wrap=True, min_width=len("KL(before ‖ after)"))
    t.add_column("")
    delta = logp_after - logp_before
    t.add_row("log p(target)", Fields([
        Text(f"{logp_before:.4f} → {logp_after:.4f}"),
        Text(f"(change {delta:+.4f}; chance {np.exp(logp_before):.2%} → "
             f"{np.exp(logp_after):.2%})")]))
    t.add_row("KL(before ‖ after)", f"{kl:.4f} nats")
    t.add_row("top before", Fields([Text(f"{show_token(tk)} {p:.1%}") for tk, p in top_before]))
    t.add_row("top after", Fields([Text(f"{show_token(tk)} {p:.1%}") for tk, p in top_after]))
    return Group(
        Text.assemble(("ablate ", "bold cyan"), (label, "bold"), (f"  mode {mode}", "dim"),
                      (f"  position {position}", "dim")),
        token_line("target", *target), t)


def ablate_all_view(rows: list[dict], mode: str, target: tuple[int, str], position: int,
                    logp_before: float) -> Group:
    """rows: {label, delta, kl, top (token string), top_prob}, already ranked."""
    t = Table(box=None, pad_edge=False, show_edge=False, header_style="bold dim")
    for name, just in (("#", "right"), ("component", "left"), ("Δ log p", "right"),
                       ("", "left"), ("KL", "right"), ("new top", "left")):
        t.add_column(name, justify=just, no_wrap=bool(name))  # the bars may give way
    big = max((abs(r["delta"]) for r in rows), default=1.0)
    for k, r in enumerate(rows, 1):
        t.add_row(str(k), r["label"], f"{r['delta']:+.4f}", Bar(r["delta"], big, 16),
                  f"{r['kl']:.4f}",
                  Text(f"{show_token(r['top'])} {r['top_prob']:.1%}"))
    return Group(
        Text.assemble(("ablate --all", "bold cyan"), (f"  mode {mode}", "dim"),
                      (f"  {len(rows)} components, ranked by |Δ log p(target)|", "dim")),
        token_line(f"target at position {position}, log p = {logp_before:.4f}:", *target), t)


# ------------------------------------------------------------------ patching


def patch_view(r) -> Group:
    """A PatchReport (analysis.patch): stream[kind] [n_layer, T] fractions restored, shown
    as T rows x n_layer columns; each head's grid."""
    stream, heads, tokens, position = r.result.stream, r.result.heads, r.q.tokens, r.q.position
    clean, corrupt, what, method, corr = (r.result.clean, r.result.corrupt, r.q.what, r.method,
                                          r.correlation)
    n_layer = heads.shape[0]
    rows = token_rows(tokens)
    cells = []
    for kind, g in stream.items():
        shown = g.T.copy()
        shown[position + 1:] = np.nan  # later positions cannot change the score
        cells.append(grid(shown, rows, [str(i) for i in range(n_layer)], title=kind,
                          percent=True, width=5))
    # Each grid keeps its own row labels, so the grids can flow onto as many lines as the
    # terminal's width needs (all five side by side when there is room).
    maps = Columns(cells, padding=(1, 3))
    parts = [
        header("patch", np.concatenate([g[:, : position + 1].ravel() for g in stream.values()]
                                       + [heads.ravel()]),
               f"({method}: fraction of the logit difference restored)"),
        note(f"metric: {what}; clean {fmt(clean)}, corrupt {fmt(corrupt)}; "
             "(patched − corrupt) / (clean − corrupt)"),
        note(f"rows: positions; columns: layers; scored at position {position}"),
        maps,
        Text(""),
        grid(heads, [f"layer {i}" for i in range(n_layer)],
             [f"head {h}" for h in range(heads.shape[1])], percent=True,
             title="each head's output, patched at every position"),
    ]
    if corr is not None:
        parts.append(note(f"correlation with activation patching over every cell: {corr:.3f}"))
    return Group(*parts)


# ------------------------------------------------------------------ input attribution


def attribute_view(report) -> Group:
    """An AttributionReport (analysis.attribute): each input token's score, or for
    attention-x-grad one key-token × head grid per layer."""
    r, q = report.attribution, report.q
    method, scores, tokens, what, f = r.method, r.scores, q.tokens, q.what, r.f
    position, grad_norm, completeness = q.position, r.grad_norm, report.completeness
    parts = [header(f"attribute.{method}", scores),
             note(f"the score: {what} = {fmt(f)} at position {position} "
                  f"({show_token(tokens[position])})")]
    if scores.ndim == 3:  # attention-x-grad: [n_layer, n_head, T] -> per layer, T rows x heads
        n_layer, n_head, _ = scores.shape
        finite = scores[np.isfinite(scores)]
        big = float(np.abs(finite).max()) if finite.size else 1.0
        heads = [f"h{h}" for h in range(n_head)]
        # one grid per layer on one colour scale, side by side as far as the width allows
        parts += [note("sum over queries of A · ∂score/∂A, per key token and head"),
                  Columns([grid(scores[i].T, token_rows(tokens), heads, title=f"layer {i}",
                                big=big) for i in range(n_layer)], padding=(1, 3))]
        return Group(*parts)
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold dim")
    table.add_column("", no_wrap=True, style="bold")
    table.add_column("score", justify="right", no_wrap=True)
    if grad_norm is not None:
        table.add_column("‖grad‖", justify="right", no_wrap=True)
    table.add_column("")  # bars: the column that gives way on a narrow terminal
    big = float(np.abs(scores).max()) if scores.size else 1.0
    if r.steer is not None:  # one scale for the tokens' bars and the steering's
        big = max(big, abs(r.steer))
    for i, label in enumerate(token_rows(tokens)):
        row = [label, fmt(float(scores[i]))]
        if grad_norm is not None:
            row.append(fmt(float(grad_norm[i])))
        row.append(Bar(float(scores[i]), big))
        table.add_row(*row)
    if r.steer is not None:  # a steered run: the steering vector's own term
        table.add_row("steer", fmt(r.steer), *([""] if grad_norm is not None else []),
                      Bar(r.steer, big))
    parts.append(table)
    if completeness is not None:
        total, diff, gap = completeness
        rel = abs(gap) / abs(diff) if diff else float("inf")
        parts.append(note(f"completeness: sum of scores {fmt(total)}; f(input) − f(baseline) "
                          f"{fmt(diff)}; gap {gap:+.3g} ({rel:.2%})"))
    return Group(*parts)


def means_written(target, n_values: int, meta: dict) -> str:
    """`means`' one line: where the mean vectors went, and over what."""
    return (f"wrote {escape_line(str(target))}: {n_values} mean vectors over {meta['tokens']} "
            f"tokens of {escape_line(meta['data'])}")
