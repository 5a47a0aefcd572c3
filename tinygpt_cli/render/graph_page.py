"""`graph --save graph.html`: the attribution graph as one offline, interactive page.

The graph document (render.graph.graph_doc) is embedded as JSON; a short script lays the nodes
out by position (columns, one per token) and layer (rows: embeddings at the bottom, then each
block, the logits on top), draws the edges (blue adds to the target, red takes away, width by
weight), shows a node's details on hover (its label, its top windows from the training text,
its strongest incoming and outgoing edges) and, on click, pins the node's strongest path down
to a token and up to the target. No URL of any kind: it opens the same without a network.
Every string from the model or the text is set as text (textContent), never as markup.
"""

from __future__ import annotations

import json
from pathlib import Path

from .html import page_head
from .svg import esc
from .text import show_token

CSS = """
:root { --ink: #1f2328; --dim: #656d76; --line: #d0d7de; }
* { box-sizing: border-box; }
body { margin: 0; padding: 12px; color: var(--ink); background: #fff;
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
h1 { font-size: 1.3rem; margin: 0 0 4px; overflow-wrap: anywhere; }
p { margin: 4px 0; overflow-wrap: anywhere; }
.dim { color: var(--dim); }
#wrap { display: flex; flex-wrap: wrap; gap: 12px; align-items: flex-start; }
#plot { flex: 3 1 560px; min-width: 0; overflow-x: auto; border: 1px solid var(--line);
  border-radius: 8px; }
#plot svg { display: block; }
#side { flex: 1 1 280px; min-width: 0; max-width: 100%; border: 1px solid var(--line);
  border-radius: 8px; padding: 8px 10px; font-size: 0.86rem; }
#side h2 { font-size: 1rem; margin: 0 0 4px; overflow-wrap: anywhere; }
#side ol { margin: 2px 0 6px; padding-left: 1.4em; }
#side code, .ex { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, monospace; }
.ex b { background: #ffe08a; }
circle.node, rect.node { cursor: pointer; stroke: #fff; stroke-width: 1; }
.node.on { stroke: #000; stroke-width: 2.5; }
line.edge { stroke-linecap: round; }
svg.pinned line.edge:not(.path) { opacity: 0.08; }
svg.pinned .node:not(.path) { opacity: 0.25; }
text.tok { font: 11px ui-monospace, monospace; fill: var(--ink); }
text.lay { font: 11px system-ui, sans-serif; fill: var(--dim); }
"""

SCRIPT_FILE = Path(__file__).with_name("graph_page.js")  # its lines as long as they need


def page(doc: dict, n_layers: int) -> str:
    """The viewer of graph document `doc` (a model of `n_layers` blocks)."""
    data = {**doc, "n_layers": n_layers, "shown": [show_token(t) for t in doc["tokens"]]}
    for n in data["nodes"]:
        if n["kind"] == "logit":
            n["shown"] = show_token(n["token"])
    # JSON inside <script>: "<" written as \u003c, so no text can close the element
    blob = json.dumps(data, ensure_ascii=True, allow_nan=False).replace("<", "\\u003c")
    tl = doc["target_logit"]
    what = show_token(tl["token"]) + ("" if tl["vs"] is None else " − " + show_token(tl["vs"]))
    title = f"Attribution graph: {what} after {show_token(doc['tokens'][doc['position']])}"
    c = doc["counts"]
    summary = esc(doc["summary"]) if "summary" in doc else f"""logit {tl['value']:.4f} = \
the sum of its incoming edges {tl['incoming_total']:.4f};
{c['kept_features']:,} of {c['active_features']:,} active features and {c['edges']:,} edges
kept; the pruned graph explains {doc['explained']:.3f} of the target's influence (the whole
graph {doc['explained_unpruned']:.3f}; the rest reaches error nodes)."""
    return page_head(title, CSS) + f"""<body>
<h1>{esc(title)}</h1>
<p>{summary}</p>
<p class="dim">Nodes by position (columns) and layer (rows): features ●, error nodes and
embeddings ■, logits on top. Blue edges add to their target, red ones take away. Hover a node
for its top windows and strongest edges; click it to pin its strongest path.</p>
<p id="pinned" class="dim" aria-live="polite"></p>
<div id="wrap"><div id="plot"><svg id="canvas"></svg></div><aside id="side"></aside></div>
<script type="application/json" id="graph">{blob}</script>
<script>{SCRIPT_FILE.read_text(encoding="utf-8")}</script>
</body>
</html>
"""
