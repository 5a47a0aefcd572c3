"""Views and documents of transcoders and attribution graphs (no model here)."""

from __future__ import annotations

import numpy as np
from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..escapes import escape_line
from . import jsonout
from .tables import Fit
from .text import show_token


def eval_doc(r, files: list[str]) -> dict:
    return jsonout.jsonable({
        "data": files, "tokens": r.tokens, "l0": r.l0,
        "variance_explained": r.variance_explained, "loss_recovered": r.loss_recovered,
        "dead": r.dead, "loss_clean": r.loss_clean, "loss_replaced": r.loss_replaced,
        "loss_mean_ablated": r.loss_mean,
        "layers": [{"layer": e.layer, "k": e.k, "latents": e.n_latents, "l0": e.l0,
                    "variance_explained": e.variance_explained, "dead": e.dead}
                   for e in r.layers]})


def eval_view(r, files: list[str]) -> Group:
    t = Table(box=None, pad_edge=False)
    for name in ("block", "L0", "variance explained", "dead"):
        t.add_column(name, justify="right")
    for e in r.layers:
        t.add_row(str(e.layer), f"{e.l0:.2f}", f"{e.variance_explained:.4f}",
                  f"{e.dead} of {e.n_latents}")
    head = Text(f"transcoders of {len(r.layers)} blocks on {r.tokens:,} held-out tokens of "
                f"{escape_line(', '.join(files))}", style="bold cyan")
    rec = Text(f"loss recovered {r.loss_recovered:.4f} (every MLP replaced at once; mean-"
               "ablated MLPs = 0, the real model = 1)")
    losses = Text(f"loss (nats): real {r.loss_clean:.4f}, replaced {r.loss_replaced:.4f}, "
                  f"MLPs at their means {r.loss_mean:.4f}", style="dim")
    return Group(head, t, rec, losses)


# ------------------------------------------------------------------ the attribution graph


def node_id(g, i: int) -> str:
    """circuit-tracer's spelling where it has one: layer_feature_position, E_token_position
    for embeddings, layer_error_position; ours for the bias and the logits."""
    kind, pos = g.kinds[i], int(g.pos[i])
    if kind == "feature":
        return f"{g.layer[i]}_{g.feature[i]}_{pos}"
    if kind == "error":
        return f"{g.layer[i]}_error_{pos}"
    if kind == "embedding":
        return f"E_{g.ids[pos]}_{pos}"
    if kind == "bias":
        return "bias"
    tok = g.tokens_of_logits[i - (len(g.kinds) - len(g.tokens_of_logits))]
    return f"L_{tok}_{pos}" if tok >= 0 else f"L_{g.target_token}-{g.vs}_{pos}"


def kept_nodes(g) -> list[int]:
    """The pruned graph's nodes: kept features, every error, embedding and bias node that
    has an edge left, and every logit (the top tokens are listed with their values even
    when, influencing nothing but themselves, their edges were all cut)."""
    touched = g.has_edges()
    touched[len(g.kinds) - len(g.tokens_of_logits):] = True
    return [i for i in range(len(g.kinds)) if g.node_mask[i] and touched[i]]


def graph_doc(g, tokenizer, examples: dict | None = None, options: dict | None = None,
              qk: list | None = None) -> dict:
    """The pruned graph in the documented schema (docs/graphs.md); `examples`:
    (layer, latent) -> {"examples": top windows, "label"} of features (analysis.transcoder);
    `qk`: graph_qk.EdgeQK of edges, each put on its edge as "qk"."""
    tok = tokenizer.token_str
    nf = g.n_features
    first_logit = len(g.kinds) - len(g.tokens_of_logits)
    keep = kept_nodes(g)
    nodes = []
    for i in keep:
        node = {"id": node_id(g, i), "kind": g.kinds[i], "layer": int(g.layer[i]),
                "position": int(g.pos[i]), "influence": float(g.influence[i])}
        if g.kinds[i] == "feature":
            node.update(feature=int(g.feature[i]), activation=float(g.activation[i]))
            found = (examples or {}).get((int(g.layer[i]), int(g.feature[i])))
            if found is not None:
                node["label"] = found["label"]
                node["examples"] = [_example(e, tok) for e in found["examples"]]
        elif g.kinds[i] == "embedding":
            node["token"] = tok(g.ids[int(g.pos[i])])
        elif g.kinds[i] == "logit":
            t = g.tokens_of_logits[i - first_logit]
            node.update(token=tok(t) if t >= 0 else f"{tok(g.target_token)} - {tok(g.vs)}",
                        value=float(g.activation[i]), is_target=i == g.target)
            if t >= 0:
                node["probability"] = float(_softmax(g.real_logits)[t])
        nodes.append(node)
    ids = {i: node_id(g, i) for i in keep}
    targets = [int(x) for x in g.targets]
    rows, cols = np.nonzero(g.edge_mask)
    split = {(e.row, e.col): e for e in qk or []}
    weights = jsonout.jsonable(g.adjacency[rows, cols])  # non-finite to null, as below
    edges = [{"source": ids[c], "target": ids[targets[r]], "weight": w}
             | ({"qk": jsonout.jsonable(qk_entry(g, split[r, c]))} if (r, c) in split else {})
             for r, c, w in zip(rows.tolist(), cols.tolist(), weights, strict=True)
             if c in ids and targets[r] in ids]
    # the edges are plain already: jsonable's walk of every one of them (hundreds of
    # thousands at 2,000 tokens) cost more than building them
    return jsonout.jsonable({
        "ids": g.ids, "tokens": [tok(i) for i in g.ids], "positions": list(range(len(g.ids))),
        "position": g.position, "options": options or {},
        "target_logit": {"token": tok(g.target_token), "id": g.target_token,
                         "vs": None if g.vs is None else tok(g.vs),
                         "value": g.target_value, "incoming_total": g.incoming_total},
        "explained": g.explained, "explained_unpruned": g.explained_unpruned,
        "counts": {"active_features": nf, "visited_features": g.visited,
                   "kept_features": sum(i < nf for i in keep),  # those listed
                   "edges_unpruned": int(np.count_nonzero(g.adjacency)),
                   "edges": len(edges)},
        "nodes": nodes}) | {"edges": edges}


def qk_entry(g, e, top: int = 5) -> dict:
    """An edge's split score: the head, its score and weight there, the one-hop share, and
    each side's largest terms (parts named as the nodes are) with the rest summed."""
    out = {"head": f"L{e.layer}H{e.head}", "layer": e.layer, "head_index": e.head,
           "query_position": e.query, "key_position": e.key, "score": e.score,
           "attention": e.weight, "one_hop": e.one_hop}
    for side, parts, terms in (("query", e.query_parts, e.query_terms),
                               ("key", e.key_parts, e.key_terms)):
        order = np.argsort(-np.abs(terms), kind="stable")
        out[side + "_terms"] = [{"part": node_id(g, parts[i]) if isinstance(parts[i], int)
                                 else parts[i], "term": float(terms[i])} for i in order[:top]]
        out[side + "_rest"] = float(terms[order[top:]].sum())
    return out


def fitted(columns, rows: list[list[str]]):
    """A table of these (name, justify) columns that fits the width: too wide, it goes on
    below in bands of columns, each band led by the first column (no cell is ever cut)."""

    def build(keep) -> Table:
        t = Table(box=None, pad_edge=False)
        cols = [0] + [1 + i for i in keep if i is not None]
        for c in cols:
            t.add_column(columns[c][0], justify=columns[c][1], no_wrap=True)
        for row in rows:
            t.add_row(*(row[c] for c in cols))
        return t

    return Fit(build, len(columns) - 1, bands=True)


def _qk_table(edges: list[dict], total: int) -> list:
    """--qk: the strongest edges between positions, the head behind each and the largest
    term of its score on each side that is not a constant (the JSON has them all)."""
    rows = []
    for e in edges:
        q = e["qk"]
        top = []
        for terms in (q["query_terms"], q["key_terms"]):
            part = [x for x in terms if x["part"] not in ("constant", "biases")][:1]
            top.append(f"{escape_line(part[0]['part'])} {part[0]['term']:+.2f}" if part else "")
        rows.append([f"{e['source']} -> {e['target']}", f"{e['weight']:+.3f}", q["head"],
                     f"{q['attention']:.2f}", f"{q['score']:.2f}", *top])
    return [Text(f"attention edges of most weight ({len(edges)} of {total}; each side's "
                 "largest term of the head's score but the constants)"),
            fitted((("edge", "left"), ("weight", "right"), ("head", "left"),
                    ("attn", "right"), ("score", "right"), ("query side", "left"),
                    ("key side", "left")), rows)]


def _example(e: dict, tok) -> dict:
    """A top window as text: before the peak, the token at it, the two after; its value."""
    ids, p = e["ids"], e["peak"]
    return {"before": "".join(tok(i) for i in ids[:p]), "token": tok(ids[p]),
            "after": "".join(tok(i) for i in ids[p + 1:]), "value": e["value"]}


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def graph_view(doc: dict, top: int) -> Group:
    """The header, the explained fraction, and the nodes of most influence."""
    tl = doc["target_logit"]
    what = show_token(tl["token"]) + ("" if tl["vs"] is None else " - " + show_token(tl["vs"]))
    c = doc["counts"]
    pos = doc["position"]
    head = Text(f"attribution graph of the prediction after {show_token(doc['tokens'][pos])} "
                f"(position {pos}): logit {what}", style="bold cyan")
    sums = Text(f"logit {tl['value']:.4f} = the sum of its incoming edges "
                f"{tl['incoming_total']:.4f}\n"
                f"{c['active_features']:,} active features"
                + ("" if c["visited_features"] == c["active_features"] else
                   f" ({c['visited_features']:,} of most influence visited: their inputs "
                   "computed)")
                + f", {c['kept_features']:,} kept, "
                f"{c['edges']:,} of {c['edges_unpruned']:,} edges\n"
                f"explained {doc['explained']:.3f} of the target's influence (unpruned "
                f"{doc['explained_unpruned']:.3f}; the rest: error nodes, cut edges)")
    leaves = {}
    for n in doc["nodes"]:
        if n["kind"] in ("embedding", "error", "bias"):
            leaves[n["kind"]] = leaves.get(n["kind"], 0.0) + n["influence"]
    shares = Text("influence reaching " + ", ".join(
        f"{k} nodes {v:.3f}" for k, v in sorted(leaves.items())), style="dim")
    tops = [n for n in doc["nodes"] if n["kind"] == "logit" and "probability" in n]
    logits = Text("top logits " + ", ".join(
        f"{show_token(n['token'])} {n['value']:.2f} (p {n['probability']:.2f})" for n in tops),
        style="dim")
    shown = sorted((n for n in doc["nodes"] if n["kind"] == "feature"),
                   key=lambda n: -n["influence"])[:top]
    t = fitted((("node", "left"), ("layer", "right"), ("pos", "right"), ("token", "left"),
                ("act", "right"), ("influence", "right"), ("label", "left")),
               [[n["id"], str(n["layer"]), str(n["position"]),
                 show_token(doc["tokens"][n["position"]]), f"{n['activation']:.2f}",
                 f"{n['influence']:.3f}", escape_line(n.get("label", ""))] for n in shown])
    parts = [head, sums, logits, shares, Text("features of most influence"), t]
    split = sorted((e for e in doc["edges"] if "qk" in e), key=lambda e: -abs(e["weight"]))
    if split:
        parts += _qk_table(split[:top], len(split))
    if "supernodes" in doc:
        gr = doc["grouped"]
        parts.append(Text(f"{len(doc['supernodes'])} supernodes of "
                          f"{sum(len(s['members']) for s in doc['supernodes'])} features; "
                          f"the grouped graph explains {gr['explained']:.3f} (ungrouped "
                          f"{gr['ungrouped']:.3f}, "
                          + ("within" if gr["within_tolerance"] else "OUTSIDE")
                          + f" the tolerance {gr['tolerance']})"))
    if "intervention" in doc:
        iv = doc["intervention"]
        what = ", ".join(f"{f['id']} {f['from']:.3f} -> {f['to']:.3f}" for f in iv["features"])
        parts.append(Text(f"intervention {what}: the target changes by "
                          f"{iv['predicted_change']:+.4f} in the graph (linear, features "
                          f"staying active) and {iv['real_change']:+.4f} in the real model",
                          style="bold"))
    return Group(*parts)
