"""Figures as one self-contained web page: inline CSS, inline SVG, a few lines of inline script,
and no URL of any kind, so the file opens the same with or without a network, years from now.

Pictures (heatmaps, bars, the map) are the SVG of `svg.element`; tables are HTML tables. The
layout reflows from a phone (~380 px) to a desktop, and prints without the page's chrome.
"""

from __future__ import annotations

import numpy as np

from .. import __version__
from . import svg
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
)
from .svg import cell_text, esc, exact, numbered

CSS = """
:root { --ink: #1f2328; --dim: #656d76; --line: #d0d7de; --bg: #ffffff; --card: #f6f8fa; }
* { box-sizing: border-box; }
html { -webkit-text-size-adjust: 100%; }
body { margin: 0 auto; max-width: 1100px; padding: 16px; color: var(--ink); background: var(--bg);
  font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
h1 { font-size: 1.6rem; margin: 0 0 4px; overflow-wrap: anywhere; }
h2 { font-size: 1.15rem; margin: 0 0 8px; }
h3 { font-size: 1rem; margin: 8px 0 4px; }
p { margin: 6px 0; overflow-wrap: anywhere; }
code, .formula, table, dl { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas,
  monospace; font-size: 0.86rem; }
.sub, .dim { color: var(--dim); }
.detail { font-style: italic; }
.formula { background: var(--card); padding: 4px 8px; border-radius: 4px; display: inline-block;
  max-width: 100%; overflow-wrap: anywhere; }
section.card { border: 1px solid var(--line); border-radius: 8px; padding: 12px 14px;
  margin: 14px 0; background: var(--bg); }
figure.pic { margin: 8px 0; min-width: 0; }
figure.pic svg { display: block; max-width: 100%; height: auto; }
.row { display: flex; flex-wrap: wrap; gap: 8px 20px; align-items: flex-start; }
.row > * { flex: 1 1 240px; max-width: 100%; min-width: 0; }
.scroll { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; margin: 6px 0; }
caption { text-align: left; font-weight: 600; font-family: system-ui, sans-serif; }
th, td { padding: 2px 12px 2px 0; text-align: left; white-space: nowrap; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
th { color: var(--dim); font-weight: 600; border-bottom: 1px solid var(--line); }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 0 14px; margin: 6px 0; }
dl.facts dt { color: var(--dim); }
dl.facts dd { margin: 0; font-weight: 600; overflow-wrap: anywhere; }
rect.cell:hover, rect.bar:hover, rect.cell.on { stroke: #000; stroke-width: 1.5; }
#tip { position: sticky; bottom: 0; display: block; min-height: 1.6em; padding: 4px 8px;
  background: #ffffffee; border-top: 1px solid var(--line); font-family: ui-monospace, monospace;
  font-size: 0.85rem; overflow-wrap: anywhere; }
#tip:empty { display: none; }
footer { color: var(--dim); font-size: 0.8rem; margin-top: 20px; }
@media (max-width: 480px) { body { padding: 10px; font-size: 14px; } h1 { font-size: 1.3rem; }
  section.card { padding: 10px; } }
@media print { body { max-width: none; padding: 0; font-size: 11pt; }
  section.card, figure.pic, table { break-inside: avoid; }
  section.card { border-color: #999; } #tip { display: none; } }
"""

# Touch screens have no hover: a tap on a cell shows its <title> (row token, column token,
# exact value) in a line at the bottom of the window.
SCRIPT = """
(function () {
  var tip = document.getElementById("tip"), last = null;
  function show(e) {
    var r = e.target.closest && e.target.closest("rect.cell, rect.bar");
    if (!r) return;
    var t = r.querySelector("title");
    if (last) last.classList.remove("on");
    r.classList.add("on"); last = r;
    tip.textContent = t ? t.textContent : "";
  }
  document.addEventListener("click", show);
  document.addEventListener("mouseover", show);
})();
"""


def part(p) -> str:
    if isinstance(p, Heatmap | Highlight | Bars | Flow | Curve):
        return f'<figure class="pic">{svg.element(p)}</figure>'
    if isinstance(p, Table):
        return table(p)
    if isinstance(p, Note):
        cls = {"formula": "formula", "detail": "detail", "dim": "dim"}.get(p.kind, "")
        inner = esc(p.text).replace("\n", "<br>")
        return (f'<p><code class="formula">{inner}</code></p>' if p.kind == "formula"
                else f'<p class="{cls}">{inner}</p>' if cls else f"<p>{inner}</p>")
    if isinstance(p, Facts):
        items = "".join(f"<div style=\"display:contents\"><dt>{esc(k)}</dt><dd>{esc(v)}</dd>"
                        "</div>" for k, v in p.pairs)
        return f'<dl class="facts">{items}</dl>'
    if isinstance(p, Row):
        return '<div class="row">' + "".join(f"<div>{part(q)}</div>" for q in p.parts) + "</div>"
    if isinstance(p, Section):
        anchor = f' id="{esc(p.anchor)}"' if p.anchor else ""
        return (f'<section class="card"{anchor}><h2>{esc(p.heading)}</h2>'
                + "\n".join(part(q) for q in p.parts) + "</section>")
    raise TypeError(f"cannot draw {type(p).__name__}")


def table(t: Table) -> str:
    out = ['<div class="scroll"><table>']
    if t.title or t.path:
        out.append(f"<caption>{esc(t.title)}"
                   + (f' <span class="dim">{esc(t.path)}</span>' if t.path else "")
                   + "</caption>")
    if t.columns:
        out.append("<thead><tr>" + "".join(f"<th>{esc(c)}</th>" for c in t.columns)
                   + "</tr></thead>")
    out.append("<tbody>")
    for row in t.rows:
        cells = []
        for v in row:
            number = isinstance(v, float | np.floating)
            attrs = f' class="n" title="{esc(exact(v, np.asarray(v).dtype))}"' if number else (
                ' class="n"' if isinstance(v, int | np.integer) else "")
            cells.append(f"<td{attrs}>{esc(cell_text(v))}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table></div>")
    if t.note:
        out.append(f'<p class="dim">{esc(t.note)}</p>')
    return "".join(out)


def page_head(title: str, css: str) -> str:
    """The start of every page tinygpt writes, up to <body>: one self-contained file."""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="tinygpt {esc(__version__)}">
<title>{esc(title)}</title>
<style>{css}</style>
</head>
"""


def document(figure: Figure) -> str:
    body = numbered("\n".join(part(p) for p in figure.parts))
    sub = f'<p class="sub">{esc(figure.subtitle)}</p>' if figure.subtitle else ""
    return page_head(figure.title, CSS) + f"""<body>
<header><h1>{esc(figure.title)}</h1>{sub}</header>
<main>
{body}
</main>
<output id="tip" aria-live="polite"></output>
<footer>Written by tinygpt {esc(__version__)}. Hover or tap a cell for its exact value.</footer>
<script>{SCRIPT}</script>
</body>
</html>
"""
