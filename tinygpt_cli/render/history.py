"""Views of the model's history and of `why`: one row per snapshot, ranked training windows."""

from __future__ import annotations

import numpy as np
from rich.table import Table
from rich.text import Text

from .tables import colour, fmt
from .text import show_token


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
                  fmt(r["top_prob"]), Text("█" * round(r["top_prob"] * 30), style="green"))
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


def grid_rows(values: np.ndarray, labels: list[str], columns: list[str]) -> Table:
    """A [S, C] array as coloured cells: one row per snapshot (attention rows, head scores)."""
    t = _table(("snapshot", "left"), *((c, "center") for c in columns))
    finite = values[np.isfinite(values)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    for label, row in zip(labels, values, strict=True):
        t.add_row(label, *(_shade(float(x), lo, hi) if np.isfinite(x) else Text("  ·  ")
                           for x in row))
    return t


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


def window_text(tokens: list[str], spans: list[dict], width: int = 40) -> Text:
    """The window's tokens around its first best target occurrence, the target in reverse
    video and the tokens before it that match the text's tail underlined."""
    marked: dict[int, str] = {}
    for s in spans:
        marked[s["position"]] = "bold reverse"
        for j in range(s["position"] - s["context"], s["position"]):
            marked.setdefault(j, "bold underline")
    centre = max(spans, key=lambda s: s["context"])["position"] if spans else 0
    lo = max(0, centre - width // 2)
    hi = min(len(tokens), lo + width)
    out = Text("…" if lo > 0 else "", style="dim")
    for j in range(lo, hi):
        out.append(show_token(tokens[j]), style=marked.get(j, ""))
    if hi < len(tokens):
        out.append("…", style="dim")
    return out


def windows_table(rows: list[dict]) -> Table:
    t = Table(box=None, pad_edge=False, show_edge=False, header_style="bold dim")
    t.add_column("#", justify="right", no_wrap=True)
    t.add_column("window", justify="right", no_wrap=True)
    t.add_column("score", justify="right", no_wrap=True)
    t.add_column("targets", justify="right", no_wrap=True)
    t.add_column("text (target reversed, matching context underlined)", overflow="fold")
    for i, r in enumerate(rows, 1):
        t.add_row(str(i), str(r["window"]), fmt(r["score"]), str(len(r["targets"])),
                  window_text(r["tokens"], r["targets"]))
    return t
