"""A graph in the field's format (circuit-tracer's graph JSON, schema version 1) read from a
file made elsewhere, checked against the model and transcoders here, and its edges checked
against the graph computed here (`graph --open FILE`).

Every field the reader uses is checked for its type and range; a file that breaks them is a
broken file (WeightsError, exit 1) named by the field, one that is well formed but made for
another model or other transcoders (token ids that do not match, blocks or features out of
range) is refused for that, by name. Nothing of the file is trusted for sizes: its byte size,
node and link counts are capped before anything is built from them.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import InputError, WeightsError

MAX_BYTES = 512 << 20  # a graph file larger than this is refused before it is read
MAX_NODES = 1_000_000
MAX_LINKS = 20_000_000
TOLERANCE = 1e-3  # of the largest edge into the same target: float32 GPU runs agree to this
WORST = 5
KINDS = {"cross layer transcoder": "feature", "transcoder": "feature",
         "mlp reconstruction error": "error", "embedding": "embedding", "logit": "logit"}


class GraphFileError(WeightsError):
    """A graph file that is not what it says: a field's type, a missing field, a size."""


@dataclass
class FileNode:
    node_id: str
    kind: str  # feature, error, embedding, logit
    layer: int  # embedding -1, logit: the model's n_layer (the file's n_layer + 1 - 1)
    pos: int
    latent: int  # a feature's latent, a logit's token id, else -1
    influence: float | None
    activation: float | None
    label: str = ""
    token_prob: float = 0.0
    is_target: bool = False
    value: float | None = None  # a logit's `logit` (written by tinygpt), else None
    token: str = ""


@dataclass
class FieldGraph:
    slug: str
    scan: str
    prompt_tokens: list[str]
    token_ids: list[int]
    nodes: list[FileNode]
    links: list[tuple[str, str, float]]
    by_id: dict = field(default_factory=dict)

    @property
    def n_features(self) -> int:
        return sum(n.kind == "feature" for n in self.nodes)


def _fail(path: Path, where: str, what: str):
    raise GraphFileError(f"graph file {path.name}: {where}: {what}")


def _need(path, obj: dict, key: str, kind, where: str, optional=False):
    """obj[key] of this type (int: not a bool; float: a finite int or float)."""
    if key not in obj:
        if optional:
            return None
        _fail(path, where, f"no {key!r}")
    x = obj[key]
    if optional and x is None:
        return None
    if kind is float:
        ok = isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
    elif kind is int:
        ok = isinstance(x, int) and not isinstance(x, bool)
    else:
        ok = isinstance(x, kind)
    if not ok:
        _fail(path, f"{where}.{key}", f"{_shown(x)} is not {_names[kind]}")
    return float(x) if kind is float else x


_names = {float: "a finite number", int: "an integer", str: "a string", list: "a list",
          dict: "an object", bool: "true or false"}


def _shown(x) -> str:
    text = json.dumps(x)[:40] if not isinstance(x, float) or math.isfinite(x) else repr(x)
    return text


def parse(path: Path) -> dict:
    """The file's JSON, within MAX_BYTES, no NaN or Infinity, an object at the top."""
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            _fail(path, "the file", f"{size:,} bytes, more than {MAX_BYTES:,}")
        raw = path.read_bytes()
    except OSError as e:
        raise InputError(f"--open {path}: cannot read it ({e.strerror})") from None
    try:
        doc = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError:
        _fail(path, "the file", "not UTF-8 text")
    except RecursionError:
        _fail(path, "the file", "nested too deeply to be a graph")
    except json.JSONDecodeError as e:
        _fail(path, "the file", f"not valid JSON ({e.msg} at line {e.lineno})")
    except ValueError as e:
        _fail(path, "the file", str(e))
    if not isinstance(doc, dict):
        _fail(path, "the file", "not a JSON object")
    return doc


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def read_field_graph(path: Path) -> FieldGraph:
    """The graph of a field-format file, every field it uses checked (GraphFileError)."""
    doc = parse(path)
    meta = _need(path, doc, "metadata", dict, "the file")
    _need(path, doc, "qParams", dict, "the file")
    nodes = _need(path, doc, "nodes", list, "the file")
    links = _need(path, doc, "links", list, "the file")
    version = _need(path, meta, "schema_version", int, "metadata", optional=True)
    if version not in (None, 1):
        _fail(path, "metadata.schema_version", f"{version}; only version 1 is read")
    tokens = _need(path, meta, "prompt_tokens", list, "metadata")
    if not all(isinstance(t, str) for t in tokens):
        _fail(path, "metadata.prompt_tokens", "not a list of strings")
    if len(nodes) > MAX_NODES or len(links) > MAX_LINKS:
        _fail(path, "the file", f"{len(nodes):,} nodes and {len(links):,} links, more than "
              f"{MAX_NODES:,} and {MAX_LINKS:,}")
    got = [_file_node(path, n, i) for i, n in enumerate(nodes)]
    by_id = {}
    for n in got:
        if n.node_id in by_id:
            _fail(path, "nodes", f"the id {n.node_id!r} names two nodes, so its links cannot "
                  "be told apart (circuit-tracer's error id 0_L_P is also block 0's feature "
                  "L at P)")
        by_id[n.node_id] = n
    edges = [_link(path, x, i, by_id) for i, x in enumerate(links)]
    ids = _token_ids(path, got, len(tokens))
    return FieldGraph(_need(path, meta, "slug", str, "metadata"),
                      _need(path, meta, "scan", str, "metadata"), tokens, ids, got, edges,
                      by_id)


def _file_node(path: Path, n, i: int) -> FileNode:
    where = f"nodes[{i}]"
    if not isinstance(n, dict):
        _fail(path, where, "not an object")
    node_id = _need(path, n, "node_id", str, where)
    kind = KINDS.get(_need(path, n, "feature_type", str, where))
    if kind is None:
        _fail(path, f"{where}.feature_type", f"{_shown(n['feature_type'])} is none of "
              + ", ".join(KINDS))
    layer_s = _need(path, n, "layer", str, where)
    pos = _need(path, n, "ctx_idx", int, where)
    feature = _need(path, n, "feature", int, where)
    if kind == "embedding":
        layer = -1
    elif re.fullmatch(r"[0-9]{1,6}", layer_s):
        layer = int(layer_s)
    else:
        _fail(path, f"{where}.layer", f"{_shown(layer_s)} is not a block number")
    latent = -1
    if kind == "feature":
        m = re.fullmatch(r"([0-9]{1,6})_([0-9]{1,9})_([0-9]{1,7})", node_id)
        if m is None or int(m[1]) != layer or int(m[3]) != pos:
            _fail(path, f"{where}.node_id", f"{_shown(node_id)} is not LAYER_FEATURE_POS "
                  "of its layer and ctx_idx")
        latent = int(m[2])
    elif kind == "logit":
        latent = feature
    elif kind == "embedding":
        m = re.fullmatch(r"E_([0-9]{1,9})_([0-9]{1,7})", node_id)
        if m is None or int(m[2]) != pos:
            _fail(path, f"{where}.node_id", f"{_shown(node_id)} is not E_TOKEN_POS")
        latent = int(m[1])
    clerp = _need(path, n, "clerp", str, where, optional=True) or ""
    tok = re.fullmatch(r'Output "(.*)" \(p=[0-9.e+-]+\)', clerp, re.S) if kind == "logit" \
        else None
    return FileNode(node_id, kind, layer, pos, latent,
                    _need(path, n, "influence", float, where, optional=True),
                    _need(path, n, "activation", float, where, optional=True),
                    clerp if kind == "feature" else "",
                    _need(path, n, "token_prob", float, where, optional=True) or 0.0,
                    bool(_need(path, n, "is_target_logit", bool, where, optional=True)),
                    _need(path, n, "logit", float, where, optional=True),
                    tok[1] if tok else "")


def _link(path: Path, x, i: int, by_id: dict) -> tuple[str, str, float]:
    where = f"links[{i}]"
    if not isinstance(x, dict):
        _fail(path, where, "not an object")
    s, t = _need(path, x, "source", str, where), _need(path, x, "target", str, where)
    for end, name in ((s, "source"), (t, "target")):
        if end not in by_id:
            _fail(path, f"{where}.{name}", f"{_shown(end)} is no node of the file")
    return s, t, _need(path, x, "weight", float, where)


def _token_ids(path: Path, nodes: list[FileNode], t: int) -> list[int]:
    """The prompt's token ids, from the embedding nodes E_ID_POS: one at every position."""
    ids = [-1] * t
    for n in nodes:
        if n.kind == "embedding":
            if not 0 <= n.pos < t or ids[n.pos] != -1:
                _fail(path, n.node_id, f"position {n.pos} of {t} prompt tokens, or twice")
            ids[n.pos] = n.latent
    if -1 in ids:
        _fail(path, "nodes", f"no embedding node at position {ids.index(-1)}: the token ids "
              "cannot be read")
    return ids


def check_fits(fg: FieldGraph, n_layer: int, latents: list[int], vocab: int,
               decode, n_positions: int) -> None:
    """Refuse, by what differs, a file made for another model or other transcoders: its
    tokens, blocks, positions and features must all exist here and its token ids must read
    as its prompt_tokens say."""
    t = len(fg.token_ids)
    if not 1 <= t <= n_positions:
        raise InputError(f"the graph file's prompt has {t:,} tokens; this model reads 1 to "
                         f"{n_positions:,}")
    for p, (v, shown) in enumerate(zip(fg.token_ids, fg.prompt_tokens, strict=True)):
        if v >= vocab:
            raise InputError(f"the graph file's token id {v} at position {p} is past this "
                             f"model's vocabulary of {vocab:,}: made for another model")
        if decode([v]) != shown:
            raise InputError(f"the graph file's token id {v} at position {p} reads "
                             f"{decode([v])!r} here, {shown!r} there: made with another "
                             "tokenizer")
    for n in fg.nodes:
        if n.kind == "logit" and n.layer != n_layer + 1:
            raise InputError(f"the graph file's logit {n.node_id} is at layer {n.layer}: "
                             f"made for a model of {n.layer - 1} blocks, this one has "
                             f"{n_layer}")
        if n.kind in ("feature", "error") and not 0 <= n.layer < n_layer:
            raise InputError(f"the graph file's node {n.node_id} is in block {n.layer}: "
                             f"this model has {n_layer}")
        if n.kind == "feature" and n.latent >= latents[n.layer]:
            raise InputError(f"the graph file's feature {n.node_id}: block {n.layer}'s "
                             f"transcoder here has {latents[n.layer]:,} latents")
        if n.kind == "logit" and not 0 <= n.latent < vocab:
            raise InputError(f"the graph file's logit {n.node_id} is token {n.latent}: not "
                             f"in this model's vocabulary of {vocab:,} (a custom target)")
        if not 0 <= n.pos < t:
            raise InputError(f"the graph file's node {n.node_id} is at position {n.pos} of "
                             f"a prompt of {t} tokens")
    if not any(n.is_target for n in fg.nodes):
        raise InputError("the graph file has no target logit (is_target_logit)")


def target_of(fg: FieldGraph) -> FileNode:
    return next(n for n in fg.nodes if n.is_target)


def logit_tokens(fg: FieldGraph) -> list[int]:
    return [n.latent for n in fg.nodes if n.kind == "logit"]


def recheck(fg: FieldGraph, g, tolerance: float = TOLERANCE, worst: int = WORST) -> dict:
    """Each of the file's edges against the same edge of `g` (the graph built here with
    demean=True): agreed when they differ by at most `tolerance` times the largest |weight|
    of the file's edges into the same target. An edge from or to a feature not active here
    is counted against (its weight here is 0); one into an active feature whose inputs `g`
    did not compute (past its max_features) is counted apart, unchecked."""
    here = _here_index(g)
    theirs = np.array([w for _, _, w in fg.links], np.float64)
    ours = np.zeros(len(fg.links))
    checked = np.ones(len(fg.links), bool)
    scale: dict[str, float] = {}
    for _, t, w in fg.links:
        scale[t] = max(scale.get(t, 0.0), abs(w))
    inactive = set()
    for k, (s, t, _) in enumerate(fg.links):
        a, b = here.get(s), here.get(t)
        for end, idx in ((s, a), (t, b)):
            if idx is None and fg.by_id[end].kind == "feature":
                inactive.add(end)
        row = -1 if b is None else g.row(b)
        checked[k] = not (b is not None and row < 0 and g.kinds[b] == "feature")
        ours[k] = 0.0 if a is None or row < 0 else float(g.adjacency[row, a])
    limit = np.array([tolerance * scale[t] for _, t, _ in fg.links])
    diff = np.abs(ours - theirs)
    agree = (diff <= limit) & checked
    order = np.argsort(-(diff / np.maximum(limit, 1e-300)), kind="stable")
    bad = [int(k) for k in order if checked[k] and not agree[k]][:worst]
    target = target_of(fg)
    tn = here.get(target.node_id)
    n = int(checked.sum())
    return {"links": len(fg.links), "checked": n, "agree": int(agree.sum()),
            "tolerance": tolerance, "agree_share": float(agree.sum() / n) if n else 1.0,
            "features_inactive": len(inactive),
            "worst": [{"source": fg.links[k][0], "target": fg.links[k][1],
                       "file": float(theirs[k]), "here": float(ours[k])} for k in bad],
            "target_logit": {"node": target.node_id, "file": target.value,
                             "here": None if tn is None else float(g.activation[tn])}}


def _here_index(g) -> dict[str, int]:
    """Field-format id -> node index of `g`, an error node under both spellings."""
    ids = {v: k for k, v in field_node_ids(g).items()}
    for i, kind in enumerate(g.kinds):
        if kind == "error":
            ids.setdefault(f"{g.layer[i]}_-1_{g.pos[i]}", i)
    return ids


def cumulative_influence(influence: np.ndarray) -> np.ndarray:
    """circuit-tracer's `influence` of a node: the share of the total influence held by the
    nodes at least as influential as it (its prune_graph's cumulative scores)."""
    order = np.argsort(-influence, kind="stable")
    total = float(influence.sum())
    out = np.zeros(len(influence))
    out[order] = np.cumsum(influence[order]) / (total if total > 0 else 1.0)
    return out


def field_node_ids(g) -> dict[int, str]:
    """Node index -> its id in the field's format, for every node but the bias."""
    nl, first_logit = int(g.layer.max(initial=0)), len(g.kinds) - len(g.tokens_of_logits)
    ids, features = {}, set()
    for i, kind in enumerate(g.kinds):
        if kind == "feature":
            ids[i] = f"{g.layer[i]}_{g.feature[i]}_{g.pos[i]}"
            features.add(ids[i])
    for i, kind in enumerate(g.kinds):
        if kind == "error":
            plain = f"0_{g.layer[i]}_{g.pos[i]}"
            ids[i] = plain if plain not in features else f"{g.layer[i]}_-1_{g.pos[i]}"
        elif kind == "embedding":
            ids[i] = f"E_{g.ids[int(g.pos[i])]}_{g.pos[i]}"
        elif kind == "logit":
            tok = g.tokens_of_logits[i - first_logit]
            ids[i] = f"{nl + 1}_{tok}_{g.pos[i]}"
    return ids




def slug_of(text: str) -> str:
    """A graph's slug (circuit-tracer's name of it, and of its file) from its prompt."""
    words = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return words[:48].rstrip("-") or "graph"
