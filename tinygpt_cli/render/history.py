"""Views of the model's history and of `why`: one row per snapshot, ranked training windows."""

from __future__ import annotations

import numpy as np
from rich.columns import Columns
from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..words import count
from .tables import Fit, WhenStyled, colour, fmt
from .text import show_text, show_token


def _table(*columns: tuple[str, str]) -> Table:
    t = Table(box=None, pad_edge=False, show_edge=False, header_style="bold dim")
    for name, just in columns:
        t.add_column(name, justify=just, no_wrap=True)
    return t


def _lr(lr: float | None) -> str:
    return "-" if lr is None else f"{lr:.2e}"


def loss_table(rows: list[dict]) -> Table:
    """snapshot, lr, loss on the text, the likeliest next token and its chance."""
    t = _table(("snapshot", "left"), ("lr", "right"), ("loss", "right"), ("next token", "left"),
               ("chance", "right"), ("", "left"))
    for r in rows:
        loss = "-" if r["loss"] is None else fmt(r["loss"])
        t.add_row(r["label"], _lr(r["lr"]), loss, Text(show_token(r["top_token"]), style="bold"),
                  fmt(r["top_chance"]), Text("█" * round(r["top_chance"] * 30), style="green"))
    return t


def summary_table(rows: list[dict]) -> Table:
    t = _table(("snapshot", "left"), ("norm", "right"), ("mean", "right"), ("std", "right"))
    for r in rows:
        t.add_row(r["label"], fmt(r["norm"]), fmt(r["mean"]), fmt(r["std"]))
    return t


def _shade(x: float, lo: float, hi: float) -> Text:
    level = (x - lo) / (hi - lo) if hi > lo else 0.0
    fg = "black" if level > 0.55 else "white"
    return Text(f"{x:5.2f}", style=f"{fg} on {colour(level)}")


def _span(values: np.ndarray) -> tuple[float, float]:
    finite = values[np.isfinite(values)]
    return (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)


def grid_rows(values: np.ndarray, labels: list[str], columns: list[str], *,
              span: tuple[float, float] | None = None, title: str | None = None) -> Table:
    """A [S, C] array as coloured cells: one row per snapshot (attention rows, head scores),
    coloured over `span` (default: the array's own range)."""
    t = _table(("snapshot", "left"), *((c, "center") for c in columns))
    if title:
        t.title, t.title_justify, t.title_style = title, "left", "bold dim"
    lo, hi = span or _span(values)
    for label, row in zip(labels, values, strict=True):
        t.add_row(label, *(_shade(float(x), lo, hi) if np.isfinite(x) else
                           Text("  …  " if c == "…" else "  ·  ")
                           for c, x in zip(columns, row, strict=True)))
    return t


def fitted_grid(values: np.ndarray, labels: list[str], columns: list[str]) -> Fit:
    """grid_rows whose middle columns give way behind `…` to fit the width (a 117-token text
    made 848-character lines); the first keys and those nearest the query stay."""
    span = _span(values)

    def build(keep: list[int | None]) -> Table:
        cols = ["…" if k is None else columns[k] for k in keep]
        gap = np.full(len(values), np.nan)
        grid = np.stack([gap if k is None else values[:, k] for k in keep], axis=1)
        return grid_rows(grid, labels, cols, span=span)

    return Fit(build, len(columns))


def head_grids(values: np.ndarray, labels: list[str]) -> Columns:
    """[S, L, H] head scores as one small grid per layer (rows: snapshots, columns: heads),
    on one colour scale, flowing onto as many lines as the width needs."""
    span = _span(values)
    return Columns([grid_rows(values[:, i], labels, [f"h{h}" for h in
                                                     range(values.shape[2])],
                              span=span, title=f"layer {i}")
                    for i in range(values.shape[1])], padding=(1, 3))


def token_columns(tokens: list[str]) -> list[str]:
    return [show_token(t)[:6] for t in tokens]


# ------------------------------------------------------------------ why


def matches_table(rows: list[dict], tokens_of) -> Table:
    t = _table(("n", "right"), ("context", "left"), ("seen", "right"),
               ("then target", "right"), ("share", "right"))
    for r in rows:
        ctx = Text(show_token("".join(tokens_of(i) for i in r["context"])), style="bold")
        share = "-" if r["fraction"] is None else f"{r['fraction']:.1%}"
        t.add_row(str(r["n"]), ctx, f"{r['count']:,}", f"{r['followed_by_target']:,}", share)
    return t


def _as_text(token: str) -> str:
    """A token as running text: spaces as spaces, a newline as ⏎, controls escaped."""
    return show_text(token.replace("\n", "⏎")).replace("\t", " ")


def window_text(tokens: list[str], contributions: np.ndarray, spans: list[dict],
                width: int = 42, marked: int = 3) -> Text:
    """The window as text around where it teaches the target: the target ⟦marked⟧ (visible
    without colour, in a pipe too), the text's tail before it underlined, and the `marked`
    tokens whose prediction mattered most in bold."""
    c = np.asarray(contributions, dtype=float)
    top = [int(j) for j in np.argsort(-c)[:marked] if c[j] > 0]
    targets = {s["position"] for s in spans}
    style = {j: "underline" for s in spans for j in range(s["position"] - s["context"],
                                                           s["position"])}
    for j in top:
        style[j] = "bold"
    centre = next((j for j in top if j in targets), top[0] if top else
                  (min(targets) if targets else 0))
    pieces = []
    for j, tok in enumerate(tokens):
        text = _as_text(tok)
        if j in targets:
            lead = len(text) - len(text.lstrip(" "))
            text = text[:lead] + "⟦" + text[lead:] + "⟧"
        pieces.append(text)
    lo, hi, used = centre, centre + 1, len(pieces[centre])
    while used < width and (lo > 0 or hi < len(pieces)):
        if hi < len(pieces) and (hi - centre <= centre - lo or lo == 0):
            used, hi = used + len(pieces[hi]), hi + 1
        elif lo > 0:
            lo -= 1
            used += len(pieces[lo])
    out = Text("…" if lo > 0 else "", style="dim")
    for j in range(lo, hi):
        out.append(pieces[j], style=style.get(j, ""))
    if hi < len(pieces):
        out.append("…", style="dim")
    return out


WINDOWS_KEY = ("score: TracIn from the index, which ranks every window; exact: the same sum "
               "from full gradients, which orders these rows; ⟦ ⟧: where the window predicts "
               "the target; where: file, story number and token offset")


EXACT_KEY = ("score: TracIn by its definition, from the exact pass over every window; exact: "
             "the same sum split over the tokens each window predicts; ⟦ ⟧: where the window "
             "predicts the target; where: file, story number and token offset")


def score_text(x: float) -> str:
    """A window's score in three figures: fmt's 0.001 would show 1.4e-3, 1.2e-3 and 1.0e-3
    as a tie."""
    return f"{x:.2e}" if 0 < abs(x) < 0.01 else fmt(x)


def windows_table(rows: list[dict], exact: bool = False) -> Group:
    t = Table(box=None, pad_edge=False, show_edge=False, header_style="bold dim")
    t.add_column("#", justify="right", no_wrap=True)
    t.add_column("where", no_wrap=True)
    t.add_column("score", justify="right", no_wrap=True)
    t.add_column("exact", justify="right", no_wrap=True)
    t.add_column("text", overflow="fold")
    for i, r in enumerate(rows, 1):
        where = f"{r['file']} #{r['story']:,} +{r['offset']}" if "file" in r else \
            f"window {r['window']}"
        t.add_row(str(i), Text(show_text(where)), score_text(r["score"]),
                  score_text(r["exact_score"]),
                  window_text(r["tokens"], r["contributions"], r["targets"]))
    key = Text("bold: the tokens whose prediction mattered most; underlined: the text's "
               "tail before the target", style="dim")
    return Group(Text(EXACT_KEY if exact else WINDOWS_KEY, style="dim"), WhenStyled(key), t)


def why_view(result, tokens_of) -> Group:
    """`why` for a person: the exact matches, then the top windows."""
    found = result.influence
    note = (f"target {show_token(result.target_token)} (id {result.target}); the last "
            f"{count(result.longest, 'token')} of the text occur verbatim in the training "
            f"text, the last {result.longest_then} followed by the target")
    if result.matches and result.longest > result.matches[-1]["n"]:  # the table is capped
        note += f" (the table stops at {result.matches[-1]['n']})"
    exact = str(found.get("index", {}).get("method", "")).startswith("exact")
    how = "exactly" if exact else "from the index, the top re-scored exactly"
    parts = [Text("exact matches in the training text", style="bold"),
             Text(note, style="dim"),
             matches_table(result.matches, tokens_of),
             Text(f"\ntraining windows that most raised {raised(found)} (TracIn over "
                  f"{len(result.snapshots)} snapshots; all {found['windows']:,} windows "
                  f"scored {how})", style="bold"),
             windows_table(found["top_windows"], exact=exact)]
    if "check" in found:
        parts.append(check_text(found["check"]))
    return Group(*parts)


def raised(found: dict) -> str:
    """What the windows raised: the target's chance, or the --value / --vs scalar."""
    v = found.get("explained")
    if v is None:
        return "the target's chance"
    return f"{show_text(v['name'])} (on the text: {v['value']:.4g})"


def check_text(c: dict) -> Text:
    """why --check: how far the index's ranking agrees with the exact one."""
    return Text(f"\nthe index against exact TracIn over all {c['windows']:,} windows: "
                f"{round(10 * c['recall_at_10'])} of the exact top 10 in its top 10, "
                f"{round(50 * c['recall_at_50'])} of the top 50 in its top 50; rank "
                f"correlation {c['spearman']:.3f}", style="bold")


def loss_view(rows: list[dict]) -> Group:
    return Group(Text("loss on the text (nats per token) and the next token, over training",
                      style="bold"), loss_table(rows))


def value_view(history, labels: list[str], tokens: list[str], position: int | None) -> Group:
    """A ValueHistory (analysis.history): its summary per snapshot, and for an attention
    grid the row of `position` (checked by the caller) under every snapshot."""
    parts = [Text(f"{history.shown} over training", style="bold"),
             summary_table(history.rows)]
    if history.grid:
        p = position
        stack = np.stack(history.values)  # [S, (H,) T, T]
        cols = token_columns(tokens[: p + 1])
        for h, grids in enumerate([stack] if stack.ndim == 3 else np.moveaxis(stack, 1, 0)):
            head = "" if stack.ndim == 3 else f" head {h}"
            parts += [Text(f"\nattention of position {p}{head} over training", style="bold"),
                      fitted_grid(grids[:, p, : p + 1], labels, cols)]
    return Group(*parts)  # the grids give way to the width, behind `…`


def heads_view(scores: dict[str, np.ndarray], labels: list[str], induction_length: int) -> Group:
    return Group(
        Text("previous-token score of each head on the text", style="bold"),
        head_grids(scores["previous_token"], labels),
        Text(f"\ninduction score of each head on {induction_length} random tokens "
             "repeated", style="bold"),
        head_grids(scores["induction"], labels))
