"""Views for whole texts: a text coloured by surprisal, head-score tables, neuron examples,
diffs. Renderables only; every string from a user or a weights file goes through text.py."""

from __future__ import annotations

import numpy as np
from rich.console import Group
from rich.table import Table
from rich.text import Text

from .tables import Fields, WhenStyled, colour, fmt
from .text import show_text, show_token

# Surprisal bands in bits: a token the model found likely is plain, rarer ones get warmer.
BANDS = [(1.0, None), (3.0, "rgb(120,160,60)"), (6.0, "rgb(220,180,40)"),
         (9.0, "rgb(230,110,40)"), (float("inf"), "rgb(220,40,40)")]


def band_style(bits: float) -> str | None:
    for limit, style in BANDS:
        if bits < limit:
            return style
    return BANDS[-1][1]


def legend() -> WhenStyled:
    """The colours of coloured_text, on a terminal that shows them."""
    t = Text("surprisal: ", style="dim")
    lo = 0.0
    for limit, style in BANDS:
        label = f"<{limit:g}" if np.isfinite(limit) else f"≥{lo:g}"
        t.append(f" {label} bits ", style=f"black on {style}" if style else "")
        lo = limit
    return WhenStyled(t, in_colour=True)


def coloured_text(pieces: list[str], bits: list[float | None]) -> Text:
    """The text as it reads (newlines kept), each token's background by its surprisal; a
    token with no score (the first, with nothing before it) stays plain."""
    t = Text()
    for piece, b in zip(pieces, bits, strict=True):
        style = band_style(b) if b is not None else None
        t.append(show_text(piece), style=f"black on {style}" if style else "")
    return t


def _last(s: str, n: int) -> str:
    """The end of s in n characters: the tokens nearest the scored one are the ones kept."""
    return s if len(s) <= n else "…" + s[len(s) - n + 1:]


def surprising_table(rows: list[dict]) -> Table:
    """rows: position, token, bits, prob, rank, entropy, top (the model's guess)."""
    t = Table(box=None, pad_edge=False, header_style="bold dim")
    # The numbers never give way to a narrow terminal: the context column does, behind "…".
    for name, just in (("pos", "right"), ("token", "left"), ("bits", "right"),
                       ("chance", "right"), ("rank", "right"), ("entropy", "right")):
        t.add_column(name, justify=just, no_wrap=True, min_width=len(name) + 1)
    t.add_column("context", justify="left", no_wrap=True, overflow="ellipsis", max_width=24)
    for r in rows:
        t.add_row(str(r["position"]), Text(show_token(r["token"]), style="bold"),
                  f"{r['bits']:.2f}", f"{r['prob']:.2%}", str(r["rank"]),
                  f"{r['entropy_bits']:.2f}", Text(_last(show_token(r["context"]), 24),
                                                   style="dim"))
    return t


def totals_line(s: dict) -> Text:
    t = Text()
    for key, label, f in (("tokens", "tokens", "{:,}"), ("mean_nats", "mean loss", "{:.4f} nats"),
                          ("perplexity", "perplexity", "{:.2f}"),
                          ("bits_per_byte", "bits per byte", "{:.4f}")):
        if s.get(key) is None:
            continue
        t.append(f"{label} ", style="dim")
        t.append(f.format(s[key]), style="bold")
        t.append("   ")
    return t


def layer_head_table(scores: dict[str, np.ndarray], labels: dict[str, str]) -> Table:
    """One row per (layer, head), one column per score, cells coloured 0..1."""
    first = next(iter(scores.values()))
    n_layer, n_head = first.shape
    t = Table(box=None, pad_edge=False, header_style="bold dim")
    t.add_column("head", no_wrap=True, style="bold")
    for name in scores:
        t.add_column(labels.get(name, name), justify="right", no_wrap=True)
    for layer in range(n_layer):
        for h in range(n_head):
            cells = [f"L{layer}H{h}"]  # the head's one short name (schema.head_name)
            for arr in scores.values():
                x = float(arr[layer, h])
                level = min(max(x, 0.0), 1.0)
                fg = "black" if level > 0.55 else "white"
                cells.append(Text(f" {x:.3f} ", style=f"{fg} on {colour(level)}"))
            t.add_row(*cells)
    return t


def window_line(tokens: list[str], acts: np.ndarray, peak: int, radius: int = 12) -> Text:
    """A window of text around `peak`, the firing token [in brackets] (seen without colour
    too: NO_COLOR, a pipe, a file), bold and coloured; tokens that also fire underlined."""
    lo, hi = max(0, peak - radius), min(len(tokens), peak + radius + 1)
    top = float(acts.max()) if acts.max() > 0 else 1.0
    t = Text("…" if lo > 0 else "", style="dim")
    for i in range(lo, hi):
        piece = show_token(tokens[i]).replace("␣", " ")
        if i == peak:
            space = piece[: len(piece) - len(piece.lstrip(" "))]
            t.append(space + "[", style="bold")
            t.append(piece[len(space):], style="bold black on rgb(253,231,37)")
            t.append("]", style="bold")
        elif acts[i] > 0.25 * top:
            t.append(piece, style="underline")
        else:
            t.append(piece)
    if hi < len(tokens):
        t.append("…", style="dim")
    return t


def token_list(tokens: list[str], values: list[float]) -> Fields:
    """`tok 0.560  tok 0.492 ...`, wrapping between entries (never inside one) when the
    column is narrower than the list."""
    fields = []
    for tok, v in zip(tokens, values, strict=True):
        t = Text(show_token(tok), style="bold")
        t.append(f" {fmt(v)}", style="dim")
        fields.append(t)
    return Fields(fields)


def side_by_side(tokens_a: list[str], tokens_b: list[str], top_a: list[tuple[str, float]],
                 top_b: list[tuple[str, float]], cos: np.ndarray, dist: np.ndarray,
                 stage_names: list[str]) -> Group:
    """Per position: A's token, B's token, the last stage's cosine and distance, both top
    predictions; then a stage x position grid of distances."""
    t = Table(box=None, pad_edge=False, header_style="bold dim")
    for name, just in (("pos", "right"), ("A", "left"), ("B", "left"), ("cos", "right"),
                       ("dist", "right"), ("A predicts", "left"), ("B predicts", "left")):
        t.add_column(name, justify=just, no_wrap=True)
    n = len(top_a)
    for p in range(max(len(tokens_a), len(tokens_b))):
        ta = show_token(tokens_a[p]) if p < len(tokens_a) else ""
        tb = show_token(tokens_b[p]) if p < len(tokens_b) else ""
        same = p < n and tokens_a[p] == tokens_b[p]
        cells = [str(p), Text(ta, style="bold"), Text(tb, style="bold" if same else "bold red")]
        if p < n:
            cells += [f"{cos[-1, p]:.3f}", f"{dist[-1, p]:.3f}",
                      f"{show_token(top_a[p][0])} {top_a[p][1]:.0%}",
                      f"{show_token(top_b[p][0])} {top_b[p][1]:.0%}"]
        t.add_row(*cells)
    grid = Table(box=None, pad_edge=False, header_style="bold dim", title_style="bold")
    grid.add_column("relative distance", no_wrap=True, style="bold")
    for p in range(dist.shape[1]):
        grid.add_column(str(p), justify="right", no_wrap=True)
    top = max(float(dist.max()), 1e-9)
    for name, row in zip(stage_names, dist, strict=True):
        cells = [name]
        for x in row:
            level = float(x) / top
            fg = "black" if level > 0.55 else "white"
            cells.append(Text(f"{x:.2f}", style=f"{fg} on {colour(level)}"))
        grid.add_row(*cells)
    return Group(t, Text(""), grid)


def kl_table(tokens: list[str], kl: np.ndarray, top_a: list[str], top_b: list[str],
             dp: np.ndarray) -> Table:
    t = Table(box=None, pad_edge=False, header_style="bold dim")
    for name, just in (("pos", "right"), ("token", "left"), ("KL", "right"),
                       ("top A", "left"), ("top B", "left"), ("Δp next", "right")):
        t.add_column(name, justify=just, no_wrap=True)
    for p, tok in enumerate(tokens):
        same = top_a[p] == top_b[p]
        t.add_row(str(p), Text(show_token(tok), style="bold"), fmt(float(kl[p])),
                  show_token(top_a[p]), Text(show_token(top_b[p]),
                                             style="" if same else "bold red"),
                  f"{dp[p]:+.3f}" if p < len(dp) else "")
    return t
