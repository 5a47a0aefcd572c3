"""The attribution graph in the field's format: the JSON that circuit-tracer writes
(`create_graph_files`) and its viewer and Neuronpedia's read (schema version 1), and the views
of `graph --open FILE`, which re-checks such a file here.

The node ids are circuit-tracer's (its current release, frontend/graph_models.py):

| node | node_id | feature | layer | feature_type | jsNodeId |
| --- | --- | --- | --- | --- | --- |
| feature F of block L at P | L_F_P | cantor(L, F) | "L" | cross layer transcoder | L_F-0 |
| error of block L at P | 0_L_P | -1 | "L" | mlp reconstruction error | L_P-0 |
| token V at P | E_V_P | P | "E" | embedding | E_V-P |
| logit of V (at the last P) | (n+1)_V_P | V | "n+1" | logit | L_V-P |

circuit-tracer writes "cross layer transcoder" for per-layer transcoders too, and its viewer
colours by these names, so they are kept. Its error ids 0_L_P can be a feature's too (block
0's feature L at P); such an error node is written L_-1_P instead, the spelling of another
copy of circuit-tracer's models, so that no id names two nodes.
"""

from __future__ import annotations

import numpy as np
from rich.console import Group
from rich.text import Text

from ..escapes import escape_line
from . import jsonout
from .graph import kept_nodes

SCHEMA_VERSION = 1


def cantor(x: int, y: int) -> int:
    """circuit-tracer's one number for (layer, feature): the Cantor pairing."""
    return (x + y) * (x + y + 1) // 2 + y


def _node(node_id, feature, layer, pos, kind, js, **extra) -> dict:
    return {"node_id": node_id, "feature": int(feature), "layer": str(layer),
            "ctx_idx": int(pos), "feature_type": kind, "token_prob": 0.0,
            "is_target_logit": False, "run_idx": 0, "reverse_ctx_idx": 0, "jsNodeId": js,
            "clerp": "", "influence": None, "activation": None} | extra


def field_doc(g, tokenizer, prompt: str, meta: dict, influence: np.ndarray, ids: dict,
              labels: dict | None = None) -> dict:
    """The pruned graph `g` (built with demean=True) in circuit-tracer's graph JSON. `meta`:
    slug, scan, transcoder_list, node_threshold, edge_threshold; `influence`: each node's
    cumulative influence rank (as circuit-tracer's prune_graph scores it); `labels`:
    (layer, latent) -> {"label"}. Written beyond its models (its viewer ignores them): the
    target node's `logit` (its value, the logit minus the mean), `constants` (what the biases
    add: no node of the field's format carries them) and `unexplained` (logit minus the sum of
    its written edges: the constants and the edges cut), and metadata's `token_ids`."""
    nl = int(g.layer.max(initial=0))
    keep = (set(kept_nodes(g)) | {i for i, k in enumerate(g.kinds) if k == "embedding"}) \
        & set(ids)  # no bias node: the field's format has none
    probs = _softmax(g.real_logits)
    first_logit = len(g.kinds) - len(g.tokens_of_logits)
    nodes = []
    for i in sorted(keep):
        kind, lay, pos = g.kinds[i], int(g.layer[i]), int(g.pos[i])
        inf = float(influence[i])
        if kind == "feature":
            lat = int(g.feature[i])
            found = (labels or {}).get((lay, lat))
            nodes.append(_node(ids[i], cantor(lay, lat), lay, pos, "cross layer transcoder",
                               f"{lay}_{lat}-0", influence=inf,
                               activation=float(g.activation[i]),
                               clerp=found["label"] if found else ""))
        elif kind == "error":
            nodes.append(_node(ids[i], -1, lay, pos, "mlp reconstruction error",
                               f"{lay}_{pos}-0", influence=inf))
        elif kind == "embedding":
            v = g.ids[pos]
            nodes.append(_node(ids[i], pos, "E", pos, "embedding", f"E_{v}-{pos}",
                               influence=inf))
        elif kind == "logit":
            v = g.tokens_of_logits[i - first_logit]
            p = float(probs[v])
            node = _node(ids[i], v, nl + 1, pos, "logit", f"L_{v}-{pos}", token_prob=p,
                         is_target_logit=i == g.target,
                         clerp=f'Output "{tokenizer.decode([v])}" (p={p:.3f})')
            nodes.append(node | _completeness(g, i) if i == g.target else node)
    targets = [int(x) for x in g.targets]
    rows, cols = np.nonzero(g.edge_mask)
    weights = g.adjacency[rows, cols].tolist()
    links = [{"source": ids[c], "target": ids[targets[r]], "weight": w}
             for r, c, w in zip(rows.tolist(), cols.tolist(), weights, strict=True)
             if c in keep and targets[r] in keep]
    if any(n["is_target_logit"] for n in nodes):
        into = sum(x["weight"] for x in links if x["target"] == ids[g.target])
        for n in nodes:
            if n["is_target_logit"]:
                n["unexplained"] = n["logit"] - into
    metadata = {"slug": meta["slug"], "scan": meta["scan"],
                "transcoder_list": list(meta["transcoder_list"]),
                "prompt_tokens": [tokenizer.decode([t]) for t in g.ids], "prompt": prompt,
                "node_threshold": meta["node_threshold"], "schema_version": SCHEMA_VERSION,
                "edge_threshold": meta["edge_threshold"], "token_ids": list(g.ids)}
    qparams = {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "",
               "sg_pos": ""}
    return jsonout.jsonable({"metadata": metadata, "qParams": qparams, "nodes": nodes}) \
        | {"links": links}


def _completeness(g, i: int) -> dict:
    """The target's value and what its incoming edges hold, from the whole graph's row."""
    row = g.adjacency[g.row(i)]
    bias = [j for j, k in enumerate(g.kinds) if k == "bias"]
    return {"logit": float(g.activation[i]), "constants": float(row[bias].sum())}


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


# ------------------------------------------------------------------ graph --open


def opened_doc(fg, check: dict) -> dict:
    """A field-format graph read from a file (analysis.graph_file.FieldGraph) as the viewer's
    graph document (graph_doc's keys), so `graph --open FILE --save x.html` shows it."""
    kinds = {"feature": "feature", "error": "error", "embedding": "embedding",
             "logit": "logit"}
    nodes = []
    for n in fg.nodes:
        node = {"id": n.node_id, "kind": kinds[n.kind],
                "layer": n.layer - 1 if n.kind == "logit" else n.layer,  # tinygpt's: n blocks
                "position": n.pos, "influence": n.influence or 0.0}
        if n.kind == "feature":
            node.update(feature=n.latent, activation=n.activation or 0.0)
            if n.label:
                node["label"] = n.label
        elif n.kind == "embedding":
            node["token"] = fg.prompt_tokens[n.pos]
        elif n.kind == "logit":
            node.update(token=n.token, value=n.value if n.value is not None else 0.0,
                        is_target=n.is_target, probability=n.token_prob)
        nodes.append(node)
    edges = [{"source": s, "target": t, "weight": w} for s, t, w in fg.links]
    target = next((n for n in fg.nodes if n.is_target), fg.nodes[-1])
    into = sum(w for _, t, w in fg.links if t == target.node_id)
    value = target.value if target.value is not None else into
    summary = (f"A graph read from a file ({fg.slug}): {check['agree']:,} of its "
               f"{check['checked']:,} edges checked agree with the graph recomputed here (within "
               f"{check['tolerance']:g} of the largest edge into their target). The target is "
               f"the logit minus the vocabulary's mean, {value:.4f}; its written edges sum to "
               f"{into:.4f} (the rest: the biases and the edges pruning cut).")
    return {"summary": summary, "ids": fg.token_ids, "tokens": fg.prompt_tokens,
            "positions": list(range(len(fg.token_ids))), "position": len(fg.token_ids) - 1,
            "target_logit": {"token": target.token, "id": target.latent, "vs": None,
                             "value": value, "incoming_total": into},
            "explained": check["agree_share"], "explained_unpruned": check["agree_share"],
            "counts": {"active_features": fg.n_features, "visited_features": fg.n_features,
                       "kept_features": fg.n_features, "edges_unpruned": len(edges),
                       "edges": len(edges)},
            "nodes": nodes, "edges": edges}


def recheck_doc(path: str, fg, check: dict) -> dict:
    return jsonout.jsonable({"file": path, "slug": fg.slug, "scan": fg.scan,
                             "tokens": fg.prompt_tokens, "token_ids": fg.token_ids,
                             "nodes": len(fg.nodes), **check})


def recheck_view(doc: dict) -> Group:
    """The verdict: how many of the file's edges agree with the graph computed here."""
    head = Text(f"{escape_line(doc['file'])}: {doc['links']:,} edges among {doc['nodes']:,} "
                f"nodes over {len(doc['tokens'])} tokens "
                f"({escape_line(''.join(doc['tokens']))[:60]})", style="bold cyan")
    tol = doc["tolerance"]
    verdict = Text(f"{doc['agree']:,} of {doc['checked']:,} edges agree with the graph "
                   f"recomputed here (within {tol:g} of the largest edge into their target); "
                   f"{doc['checked'] - doc['agree']:,} do not",
                   style="bold green" if doc["agree"] == doc["checked"] else "bold red")
    parts = [head, verdict]
    if doc["checked"] < doc["links"]:
        parts.append(Text(f"{doc['links'] - doc['checked']:,} edges not checked: into "
                          "features whose inputs were not computed here (past "
                          "--max-features)", style="yellow"))
    if doc.get("target_logit") is not None:
        t = doc["target_logit"]
        parts.append(Text(f"target {escape_line(t['node'])}: the file's logit "
                          f"{_num(t['file'])}, here {t['here']:.4f} (logit minus the "
                          "vocabulary's mean)"))
    if doc["features_inactive"]:
        parts.append(Text(f"{doc['features_inactive']:,} of the file's features are not "
                          "active here", style="red"))
    if doc["worst"]:
        parts.append(Text("the worst that do not:"))
        for w in doc["worst"]:
            parts.append(Text(f"  {escape_line(w['source'])} -> {escape_line(w['target'])}: "
                              f"file {w['file']:+.6f}, here {w['here']:+.6f}"))
    return Group(*parts)


def _num(x) -> str:
    return "absent" if x is None else f"{x:.4f}"
