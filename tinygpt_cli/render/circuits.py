"""Views of circuits and of QK attribution: a ranked edge list, a layer-by-layer picture of the
kept nodes, the faithfulness curve, and the same as a Figure for --save.

Every function takes a result object of analysis.circuit or analysis.qk and display strings;
nothing here runs the model.
"""

from __future__ import annotations

import numpy as np
from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..transformer.schema import head_name, mlp_name
from .explain import Bar, note
from .figure import Bars, Curve, Figure, Heatmap, Note
from .figure import Table as FigureTable
from .tables import fmt
from .text import show_token

CURVE_POINTS = (0, 1, 2, 5, 10, 20, 40, 64, 128, 256)  # N shown (all computed), then every edge


def _method(r) -> str:
    return f"{r.method} ({r.steps} steps)" if r.steps else r.method


def _f(x: float) -> str:
    """f to three decimals, with no '-0.000' for a rounding error below zero."""
    return f"{x:.3f}" if round(x, 3) != 0 else "0.000"


def _share(x: float, gap: float) -> str:
    return f"{x / gap:+.0%}" if gap else ""


def edge_table(r, top: int) -> Table:
    """The top edges by |score|: score in metric units and as a share of clean - corrupt."""
    gap = r.clean - r.corrupt
    names = r.graph.edge_names()
    big = float(np.abs(r.scores).max()) or 1.0
    table = Table(box=None, pad_edge=False, header_style="bold dim", padding=(0, 1, 0, 0))
    for col, justify in (("#", "right"), ("edge", "left"), ("score", "right"),
                         ("of gap", "right"), ("", "left")):
        table.add_column(col, justify=justify, no_wrap=True)
    for rank, e in enumerate(r.order[:top], 1):
        x = float(r.scores[e])
        table.add_row(str(rank), names[e], fmt(x), _share(x, gap), Bar(x, big, 20))
    return table


def curve_points(total: int, smallest: int | None = None) -> list[int]:
    extra = {smallest} if smallest is not None else set()
    return sorted({n for n in CURVE_POINTS if n < total} | {total} | extra)


def curve_table(r) -> Table:
    """f(N) at a few N: f is 0 with no edge and 1 with every edge."""
    table = Table(box=None, pad_edge=False, header_style="bold dim", padding=(0, 1, 0, 0))
    table.add_column("edges kept", justify="right", no_wrap=True)
    table.add_column("f", justify="right", no_wrap=True)
    table.add_column("", no_wrap=True)
    big = max(1.0, float(np.abs(r.f).max()))
    for n in curve_points(len(r.order), r.smallest):
        table.add_row(str(n), _f(r.f_at(n)), Bar(r.f_at(n), big, 30))
    return table


def node_picture(r, kept: int, n_layer: int, n_head: int) -> Table:
    """One row per block, one column per head and the MLP: how many of the node's input
    edges (q/k/v apart for a head) are in the circuit, '·' for none."""
    ins: dict[str, list[int]] = {}
    for e in r.order[:kept]:
        u, v = r.graph.edges[e]
        ins.setdefault(r.graph.receivers[v], []).append(u)
    table = Table(box=None, pad_edge=False, header_style="bold dim", padding=(0, 2, 0, 0))
    table.add_column("", no_wrap=True, style="bold")
    for h in range(n_head):
        table.add_column(f"h{h} q/k/v", justify="center", no_wrap=True)
    table.add_column("mlp", justify="center", no_wrap=True)
    for i in range(n_layer):
        cells = []
        for h in range(n_head):
            counts = [len(ins.get(f"{head_name(i, h)}.{p}", [])) for p in "qkv"]
            cells.append(Text("/".join(map(str, counts)) if any(counts) else "·",
                              style="bold" if any(counts) else "dim"))
        m = len(ins.get(mlp_name(i), []))
        cells.append(Text(str(m) if m else "·", style="bold" if m else "dim"))
        table.add_row(f"block {i}", *cells)
    table.add_row("logits", Text(str(len(ins.get("logits", []))), style="bold"))
    return table


def summary_lines(r, total: int) -> list[Text]:
    lines = [note(f"area under f over the fraction of edges kept (MIB's CPR): {_f(r.area)}")]
    if r.smallest is None:
        lines.append(note("no circuit reaches f >= 0.8 (f is not monotone in N)"))
        return lines
    lines.append(Text(f"smallest circuit with f >= 0.8: {r.smallest} of {total} edges "
                      f"(f = {_f(r.f_at(r.smallest))})"))
    if r.random is not None:
        q1, med, q3 = np.percentile(r.random, [25, 50, 75])
        lines.append(note(f"{len(r.random)} random circuits of {r.smallest} edges: median f "
                          f"{_f(med)} (quartiles {_f(q1)} .. {_f(q3)})"))
    return lines


SMALL_GAP = 0.1  # a logit difference the texts barely change: its shares are mostly noise


def small_gap_warning(r) -> list[Text]:
    """A line when clean and corrupt barely differ (a random model, two near-equal texts):
    every "% of gap" and f divides by that small number."""
    gap = r.clean - r.corrupt
    if abs(gap) >= SMALL_GAP:
        return []
    return [Text(f"warning: the gap is only {fmt(gap)} (under {SMALL_GAP}): clean and corrupt "
                 "barely differ, so each share of it and f are mostly noise; choose texts "
                 "whose predictions differ", style="bold yellow")]


def circuit_view(r, what: str, position: int, token: str, n_layer: int, n_head: int,
                 top: int, stability=None) -> Group:
    total = len(r.order)
    kept = r.smallest if r.smallest is not None else min(top, total)
    which = ", the smallest circuit with f >= 0.8" if r.smallest is not None else ""
    parts = [
        Text(f"circuit ({_method(r)}), {total} edges: {what} at position {position} "
             f"({show_token(token)})", style="bold"),
        note(f"clean {fmt(r.clean)}, corrupt {fmt(r.corrupt)}, gap {fmt(r.clean - r.corrupt)}; "
             "score: what the edge adds"), *small_gap_warning(r),
        Text(""), Text("edges, by |score|", style="bold"), edge_table(r, top),
        Text(""), Text(f"top {kept} edges{which}: edges into each node",
                       style="bold"),
        node_picture(r, kept, n_layer, n_head),
        Text(""), Text("faithfulness f(N) = (circuit − corrupt) / (clean − corrupt)",
                       style="bold"),
        curve_table(r), *summary_lines(r, total),
    ]
    if stability is not None:
        parts += [Text(""), *stability_lines(stability)]
    return Group(*parts)


def stability_lines(s) -> list[Text]:
    def spread(x: np.ndarray) -> str:
        return f"median {np.median(x):.3f}, min {x.min():.3f}, max {x.max():.3f}"

    return [Text(f"stability over {len(s.overlap)} pairs (the first is CLEAN CORRUPT), "
                 f"circuits of {s.size} edges", style="bold"),
            Text(f"Jaccard overlap with the first pair's circuit: {spread(s.overlap[1:])}"
                 if len(s.overlap) > 1 else "only one pair"),
            Text(f"f of each pair's own circuit: {spread(s.own)}"),
            Text(f"f of the first pair's circuit on each pair: {spread(s.transfer)}")]


def circuit_figure(r, what: str, top: int) -> Figure:
    """The graph as its adjacency grid (senders x receivers, coloured by score; blank where
    there is no edge), the top edges as bars, and the faithfulness curve."""
    g = r.graph
    grid = np.full((len(g.senders), len(g.receivers)), np.nan)
    for (u, v), x in zip(g.edges, r.scores, strict=True):
        grid[u, v] = x
    names = g.edge_names()
    shown = r.order[:top]
    points = curve_points(len(r.order), r.smallest)
    parts = [Note(f"method {_method(r)}; metric {what}; clean {r.clean:.4g}, corrupt "
                  f"{r.corrupt:.4g}; area under f {r.area:.3f}; smallest N with f >= 0.8: "
                  f"{r.smallest}"),
             Heatmap(grid, g.senders, g.receivers, title="edge scores: sender (row) -> "
                     "receiver (column)", signed=True, every_label=True),
             Bars([names[e] for e in shown], [float(r.scores[e]) for e in shown],
                  title=f"top {len(shown)} edges", value_name="score"),
             _faithfulness_curve(r),
             FigureTable(["edges kept", "f"], [[n, _f(r.f_at(n))] for n in points],
                         title="faithfulness")]  # f as the terminal shows it: 0.000, not -3.66e-16
    return Figure("circuit", parts)


def _faithfulness_curve(r) -> Curve:
    """f(N) at every N computed, the 0.8 it must reach, the smallest circuit that does and,
    beside it, the median of random circuits of that size."""
    marks = []
    if r.smallest is not None:
        marks.append((r.smallest, r.f_at(r.smallest), "the smallest circuit with f >= 0.8"))
        if r.random is not None and len(r.random):
            marks.append((r.smallest, float(np.median(r.random)),
                          f"the median of {len(r.random)} random circuits of that size"))
    return Curve([int(n) for n in r.sizes], [float(f) for f in r.f],
                 title="faithfulness f(N) = (circuit − corrupt) / (clean − corrupt)",
                 x_name="edges kept", y_name="f", levels=[(0.8, "f = 0.8")], marks=marks,
                 shown=_f)


# ------------------------------------------------------------------ QK attribution


def _ranked_table(columns: list[str], rows: list[tuple], big: float) -> Table:
    """Rows of labels then one value, shown with a signed bar."""
    table = Table(box=None, pad_edge=False, header_style="bold dim", padding=(0, 1, 0, 0))
    for col in columns:
        table.add_column(col, no_wrap=True)
    table.add_column("term", justify="right", no_wrap=True)
    table.add_column("", no_wrap=True)
    for *labels, x in rows:
        table.add_row(*labels, fmt(x), Bar(x, big, 20))
    return table


def qk_view(r, tokens: list[str], key: int, top: int) -> Group:
    """The query's scores over its keys, then the chosen key's score split into terms."""
    keys = Table(box=None, pad_edge=False, header_style="bold dim", padding=(0, 1, 0, 0))
    for col, justify in (("key", "right"), ("token", "left"), ("score", "right"),
                         ("weight", "right"), ("", "left")):
        keys.add_column(col, justify=justify, no_wrap=True)
    for j, (s, w) in enumerate(zip(r.scores, r.weights, strict=True)):
        keys.add_row(str(j), show_token(tokens[j]), fmt(float(s)), f"{w:.0%}",
                     Bar(float(w), 1.0, 20), style="bold" if j == key else "")
    t = r.terms[:, :, key]
    flat = np.argsort(-np.abs(t), axis=None, kind="stable")[:top]
    big = float(np.abs(t).max()) or 1.0
    pairs = [(r.sources[a], r.sources[b], float(t[a, b]))
             for a, b in zip(*np.unravel_index(flat, t.shape), strict=True)]
    by_q, by_k = t.sum(axis=1), t.sum(axis=0)
    big_side = float(max(np.abs(by_q).max(), np.abs(by_k).max())) or 1.0
    return Group(
        Text(f"qk: {head_name(r.layer, r.head)}, query position {r.query} "
             f"({show_token(tokens[r.query])}): pre-softmax scores by where the query and "
             "the key came from", style="bold"),
        note("parts of the stream through ln1 with its scale frozen at this run's"
             + ("; 'norm bias' is ln1's bias through W_q (or W_k) plus b_q (b_k)"
                if "norm bias" in r.sources else "; 'bias' is b_q (b_k)"
                if "bias" in r.sources else "")),
        Text(""), keys, Text(""),
        Text(f"key {key} ({show_token(tokens[key])}): score {fmt(float(r.scores[key]))} = "
             f"the sum of {t.size} terms ({fmt(float(t.sum()))}); the largest:", style="bold"),
        _ranked_table(["query from", "key from"], pairs, big), Text(""),
        Text("summed by the query's part", style="bold"),
        _ranked_table(["query from"], [(s, float(x)) for s, x in zip(r.sources, by_q,
                                                                      strict=True)], big_side),
        Text(""), Text("summed by the key's part", style="bold"),
        _ranked_table(["key from"], [(s, float(x)) for s, x in zip(r.sources, by_k,
                                                                    strict=True)], big_side))


# ------------------------------------------------------------------ attribute --faithfulness


def erasure_view(e, tokens: list[str], what: str, position: int) -> Group:
    """The comprehensiveness and sufficiency curves, a row per k, and their means."""
    table = Table(box=None, pad_edge=False, header_style="bold dim", padding=(0, 1, 0, 0))
    table.add_column("k", justify="right", no_wrap=True)
    for side in ("comp", "suff"):
        for name in ("ranked", "occl.", "random"):
            table.add_column(f"{side}:{name}", justify="right", no_wrap=True)
    for k in range(e.comprehensiveness.shape[1]):
        table.add_row(str(k), *(fmt(float(x)) for x in e.comprehensiveness[:, k]),
                      *(fmt(float(x)) for x in e.sufficiency[:, k]))
    comp, suff = e.aopc
    return Group(
        Text(f"faithfulness of the {e.names[0]} ranking: {what} at position {position} "
             f"({show_token(tokens[position])}) = {fmt(e.f)}", style="bold"),
        note("comp: f − f(top-k tokens removed), higher is better; suff: f − f(only the "
             "top-k kept), lower is better; ranked by the attribution, by leave-one-out "
             "occlusion, or at random (the mean of 20 orders); a removed token has the "
             f"baseline's embedding, its position kept; all removed, f = {fmt(e.f_empty)}"),
        Text(""), table, Text(""),
        Text("mean over k = 1 .. K (AOPC), comprehensiveness / sufficiency:"),
        *(Text(f"  {n}: {fmt(float(c))} / {fmt(float(s))}")
          for n, c, s in zip(e.names, comp, suff, strict=True)))
