"""The Quick review page and the map of one text, for a terminal. `r` is a traced text
(session.Run: its trace, model, text, ids, tokens and T); the values come from
page.page_values and page.map_stages."""

from __future__ import annotations

import numpy as np
from rich.console import Group
from rich.measure import Measurement
from rich.padding import Padding
from rich.panel import Panel
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from ..transformer.page import cards_for
from ..words import count
from .tables import fmt, shape_str
from .text import show_text, show_token


def _row_preview(row, n: int = 4) -> str:
    head = ", ".join(fmt(float(x)) for x in row[:n])
    return f"[{head}, …, {fmt(float(row[-1]))}]" if row.size > n else f"[{head}]"


def preview(r, number: int, value) -> list:
    """A few lines of real values for one card."""
    tok = r.model.tokenizer.token_str
    if number == 1:
        pairs = "  ".join(f"{show_token(t)}={i}" for t, i in zip(r.tokens, r.ids, strict=True))
        return [Text(pairs)]
    if number in (2, 3, 4, 6, 8):
        rows = [0, r.T - 1] if r.T > 1 else [0]
        return [Text(f"{show_token(r.tokens[i]):>10} {_row_preview(value[i])}") for i in rows]
    if number == 5:  # block 0's grid: a sliding block's keys before the window are "-"
        lines, w = [], r.model.config.window(0)
        for i, row in enumerate(value):
            cells = " ".join("  · " if j > i else "  - " if w and j <= i - w else f"{x:.2f}"
                             for j, x in enumerate(row[:8]))
            more = " …" if len(row) > 8 else ""
            lines.append(Text(f"{show_token(r.tokens[i]):>10} {cells}{more}"))
            if i >= 7:
                lines.append(Text("       …"))
                break
        return lines
    if number == 7:
        return [Text(f"{value} blocks")]
    if number == 9:
        top = np.argsort(-value[-1])[:3]
        return [Text(f"last row: {_row_preview(value[-1])}; highest: " + ", ".join(
            f"{show_token(tok(int(i)))} {value[-1][i]:.2f}" for i in top))]
    if number == 10:
        top = np.argsort(-value)[:5]
        return [Text(", ".join(f"{show_token(tok(int(i)))} {value[i]:.1%}" for i in top)
                     + f"  (sum {value.sum():.4f})")]
    if number == 11:
        return [Text(f"id {value} = {show_token(tok(value))!s}  →  ") + Text(
            show_text(r.text + r.model.tokenizer.decode([value])), style="bold")]
    return []


def card_shape(number: int, value) -> str:
    if number == 7:
        return f"{value} × Block"
    if number == 11:
        return "1 id"
    return shape_str(np.shape(value))


def page_view(r, values: dict, width: int):
    """The page for a terminal: the facts, then every card in a panel `width` wide."""

    facts = values["header"]
    label = {"T": "Tokens in the text", "d": "Numbers per token", "L": "Blocks",
             "heads": "Heads per block", "d_k": "Numbers per head", "ffn": "Feed-forward width",
             "vocab": "Vocabulary", "longest": "Longest text"}
    top = Text()
    top.append("Quick review", style="bold underline")
    top.append(f" of {r.text!r}\n", style="dim")
    for k, name in label.items():
        unit = " tokens" if k in ("vocab", "longest") else ""
        top.append(f"  {name:<22}", style="dim")
        top.append(f"{k} = {facts[k]:,}{unit}\n", style="bold")
    parts = [top]
    for c in cards_for(r.model.config):
        v = values[c.number]
        detail = c.detail.format(vocab_max=facts["vocab"] - 1, **facts)
        body = [Text(c.what), Text(detail, style="italic"),
                Text.assemble(("shape    ", "dim"), (card_shape(c.number, v), "bold")),
                Text.assemble(("formula  ", "dim"), c.formula),
                Text.assemble(("trace    ", "dim"), (c.path, "cyan")) if c.path else
                Text("trace    none: a random pick, drawn by the formula above", style="dim"),
                Text.assemble(("command  ", "dim"), c.command)]
        body += [Text("  ") + line for line in preview(r, c.number, v)]
        parts.append(Panel(Group(*body), title=f"{c.number}. {c.title}", title_align="left",
                           border_style="dim", width=width))
    return Group(*parts)


def _arrow(label: str, rails: str = ""):
    return Text.assemble((rails, RAIL), (" " * (6 - len(rails)) + "│ ", "dim"),
                         (label, "magenta"))


RAIL = "yellow"  # the residual stream's bypass, in the text view
# Each sublayer of a block reads the residual stream and adds its output back into it: the
# stream forks around the sublayer (FORK) and the sublayer's output joins it at an add (JOIN).
FORK, JOIN = "╭─────┤", "╰─⊕"


def block_lines(stages, parallel: bool, box) -> list:
    """The inside of the map's block panel: the six stages 4..9 with the residual stream's
    bypass drawn beside them: in a serial block it goes around the attention to the first add
    and around the MLP to the second; in a parallel block (GPT-NeoX) attention and MLP both
    read the block's input, and the stream and the attention's output go down to the one add
    the MLP's output joins too."""
    (n1, o1, s1), (at, oa, sa), (a1, oa1, _), (n2, o2, s2), (ff, of, sf), (a2, oa2, _) = stages

    def fork(label: str, rails: str = "") -> Text:
        return Text.assemble((rails + FORK[len(rails):], RAIL), (" " + label, "dim"))

    if not parallel:
        return [fork("resid_pre goes around the attention"),
                box(n1, o1, "│"), _arrow(s1, "│"), box(at, oa, "│"), _arrow(sa, "│"),
                box(a1, oa1, JOIN),
                fork("resid_mid goes around the MLP"),
                box(n2, o2, "│"), _arrow(s2, "│"), box(ff, of, "│"), _arrow(sf, "│"),
                box(a2, oa2, JOIN)]
    return [fork("resid_pre goes around both branches to the add"),
            box(n1, o1, "│"), _arrow(s1, "│"), box(at, oa, "│"),
            Text.assemble(("│╭────┤", RAIL), (f" attn_out {sa} goes down to the add", "dim")),
            Text.assemble(("├┼────╮", RAIL), (" resid_pre into the MLP branch (" + oa1 + ")",
                                              "dim")),
            box(n2, o2, "││"), _arrow(s2, "││"), box(ff, of, "││"), _arrow(sf, "││"),
            box(a2, oa2, "╰┴⊕")]


class Railed:
    """A renderable with the residual stream's rails before each of its lines: `first`
    before the first, `rest` before the others (a box whose operation wraps)."""

    def __init__(self, body, first: str, rest: str):
        self.body, self.first, self.rest = body, first, rest

    def __rich_console__(self, console, options):

        width = options.max_width - len(self.first)
        lines = console.render_lines(self.body, options.update_width(width), pad=False)
        for k, line in enumerate(lines):
            yield Segment(self.rest if k else self.first, console.get_style(RAIL))
            yield from line
            yield Segment.line()

    def __rich_measure__(self, console, options):

        m = Measurement.get(console, options.update_width(options.max_width - len(self.first)),
                            self.body)
        return Measurement(m.minimum + len(self.first), m.maximum + len(self.first))


def map_view(r, stages: list[tuple[str, str, str]], picked: int):
    """`map`: the stages as boxes joined by arrows labelled with shapes, the blocks in one
    panel with the residual stream's bypass around each sublayer (block_lines), ending in the
    token the page's seed picks."""
    cfg = r.model.config
    td = f"{r.T} × {cfg.n_embd}"

    def box(stage: str, op: str, rails: str = "") -> Railed:
        # the op wraps under itself, not at the frame's edge (a Llama's are long)
        row = Table.grid()
        row.add_column(no_wrap=True)
        row.add_column(no_wrap=True, width=19)
        row.add_column()
        joins = rails.endswith("⊕")
        row.add_row(Text("⊕ " if joins else "▣ ", RAIL if joins else "dim"),
                    Text(stage, "bold"), Text(op))
        rails = rails[:2].ljust(2)
        # a wrapped op's lines keep the rails that go on past the box (none past an add)
        return Railed(row, rails, "  " if joins else rails)

    head = [Text.assemble(("  ", ""), (repr(r.text), "bold green")), _arrow(count(r.T, "token"))]
    for s, o, sh in stages[:3]:
        head += [box(s, o), _arrow(sh)]
    inner = block_lines(stages[3:9], cfg.parallel, box)
    block = Panel(Group(*inner), title=f"× {cfg.n_layer} blocks (card 7)", title_align="left",
                  border_style="cyan", expand=False)
    tail = [_arrow(td)]
    for s, o, sh in stages[9:]:
        tail += [box(s, o), _arrow(sh)]
    tail.append(Text.assemble(("      ▼ ", "dim"),
                              (show_token(r.model.tokenizer.token_str(picked)), "bold green"),
                              ("  (seed 1)", "dim")))
    return Group(*head, Padding(block, (0, 0, 0, 2)), *tail)
