"""Circuits: `circuit` scores every edge between components and finds the smallest faithful
circuit; `qk` splits one head's attention scores by where its queries and keys came from.

Each command reads its texts, opens a Session, calls analysis.circuit or analysis.qk and
hands the result to render.circuits (or prints one JSON document).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from .app import app
from .common import (
    FORCE,
    JSON,
    POSITION,
    QUIET,
    SAVE,
    TARGET,
    TEXT,
    VS,
    WEIGHTS,
    InputError,
    open_session,
    progress,
    save_figure,
    stderr,
    stdout,
)

if TYPE_CHECKING:
    from ..session import Session

def emit(s: Session, path: str, value, options: dict, **extra) -> None:
    from ..render.documents import session_document
    from ..render.jsonout import emit as write

    write(session_document(s, path, value, options=options, **extra))


STEPS = typer.Option(20, "--steps", min=1, max=1000, help="eap-ig: points on the path from "
                     "the corrupt to the clean embeddings (one backward pass each); 1 is eap.")


def _pair(s: Session, c: Session, position: int, target: str | None, vs: str | None,
          quiet: bool = False):
    """The prepared pair of runs with its scored tokens; says so on stderr when the two runs'
    top guesses coincide and the corrupt run's second guess stands in."""
    from ..analysis import circuit

    if c.T != s.T:
        raise InputError(f"the clean text is {s.T} tokens and the corrupt text {c.T}: edges "
                         "are patched position by position, so they must have the same "
                         "number of tokens")
    p = s.position(position)
    t, v, fell_back = circuit.default_tokens(
        s.run()[p], c.run()[p], None if target is None else s.token_id(target),
        None if vs is None else s.token_id(vs))
    if t == v:
        raise InputError(f"the target and --vs are the same token "
                         f"({s.model.tokenizer.token_str(t)!r}): give --target and --vs "
                         "that differ")
    if fell_back and not quiet:
        tok = s.model.tokenizer.token_str
        stderr().print(f"note: both runs' top guess is {tok(t)!r}; scoring it against the "
                       f"corrupt run's next guess {tok(v)!r}", style="dim", soft_wrap=True)
    return circuit.prepare(s.params, s.config, s.ids, c.ids, t, v, p)


def _read_pairs(path: Path) -> list[tuple[str, str]]:
    """Lines CLEAN<TAB>CORRUPT; blank lines and lines starting with '#' are skipped."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise InputError(f"--pairs {path}: not UTF-8 text") from None
    except OSError as e:
        raise InputError(f"--pairs {path}: cannot read it ({e.strerror or e})") from None
    pairs = []
    for n, line in enumerate(lines, 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) != 2 or not all(p.strip() for p in parts):
            raise InputError(f"--pairs {path}, line {n}: expected CLEAN<tab>CORRUPT")
        pairs.append((parts[0], parts[1]))
    if not pairs:
        raise InputError(f"--pairs {path}: no pairs in it (one CLEAN<tab>CORRUPT a line)")
    return pairs


def _stability(s: Session, texts: list[tuple[str, str]], first, method: str, steps: int,
               size: int, target: str | None, vs: str | None, position: int):
    from ..analysis import circuit

    pairs = [first]
    for clean, corrupt in texts:
        a = open_session(None, clean, model=s.model)
        pairs.append(_pair(a, open_session(None, corrupt, model=s.model), position, target,
                           vs, quiet=True))
    return circuit.stability(pairs, method, size, steps)


def _circuit_document(s: Session, c: Session, pair, r, stab, options: dict) -> None:
    import numpy as np

    names = r.graph.edge_names()
    edges = [{"rank": k + 1, "edge": names[e], "sender": r.graph.senders[r.graph.edges[e][0]],
              "receiver": r.graph.receivers[r.graph.edges[e][1]], "score": float(r.scores[e])}
             for k, e in enumerate(r.order)]
    extra = {} if stab is None else {"stability": {
        "size": stab.size, "jaccard": stab.overlap, "own_f": stab.own,
        "transfer_f": stab.transfer}}
    emit(s, "circuit", r.scores[r.order], options, axes=["edge"], edges=edges,
         clean=r.clean, corrupt=r.corrupt, position=r.position,
         target=token_doc(s, pair.target), vs=token_doc(s, pair.vs),
         corrupt_ids=c.ids, corrupt_tokens=c.tokens, sizes=r.sizes, faithfulness=r.f, area=r.area,
         smallest=r.smallest, threshold=0.8,
         random_f=None if r.random is None else r.random,
         random_median=None if r.random is None else float(np.median(r.random)), **extra)


@app.command()
def circuit(
    clean: str = typer.Argument(..., metavar="CLEAN", help="The text whose edges are kept.",
                                show_default=False),
    corrupt: str = typer.Argument(..., metavar="CORRUPT", help="The text whose sender outputs "
                                  "the other edges carry (same number of tokens).",
                                  show_default=False),
    weights: Path = WEIGHTS, target: str = TARGET, vs: str = VS, position: int = POSITION,
    method: str = typer.Option("eap-ig", "--method", help="eap (one backward pass), eap-ig "
                               "(gradients along the path), exact (each edge's clean output "
                               "into the corrupt run) or exact-noising (each edge's corrupt "
                               "output into the clean run)."),
    steps: int = STEPS,
    top: int = typer.Option(15, "--top", "-n", min=1, help="How many edges to list."),
    stable: bool = typer.Option(False, "--stability", help="Rerun on the --pairs and report "
                                "how much the circuits overlap and how faithful they are."),
    pairs: Path = typer.Option(None, "--pairs", metavar="FILE", show_default=False,
                               help="With --stability: more pairs, one CLEAN<tab>CORRUPT a "
                               "line."),
    seed: int = typer.Option(0, "--seed", "-s", help="Seed of the random circuits."),
    as_json: bool = JSON, save: Path = SAVE, force: bool = FORCE, quiet: bool = QUIET,
):
    """Edge attribution: which connections between components carry the prediction.

    Nodes: the embeddings, every head (q, k, v inputs apart) and MLP, the logits. An edge's
    score is the change of logit[target] − logit[vs] (default: the clean run's top guess
    against the corrupt run's) it carries from the corrupt to the clean run: eap, eap-ig
    (gradients averaged along the path between the two texts' embeddings), exact (the one
    edge patched into the corrupt run) or exact-noising (the one edge corrupted in the clean
    run). The top-N edges form a circuit whose faithfulness f(N) = (circuit −
    corrupt) / (clean − corrupt) is printed as a curve, with the smallest N reaching 0.8 and
    random circuits of that size as a baseline.

    Example: tinygpt circuit "Ben had a ball. He liked his" "Ben had a car. He liked his"
    Example: tinygpt circuit "Tom had a ball. He saw his" "Tom had a car. He saw his" --method exact
    """
    from ..analysis import circuit as circuits
    from ..render import circuits as view

    if method not in circuits.METHODS:
        raise InputError(f"unknown --method {method!r}: use {', '.join(circuits.METHODS)}")
    if stable != (pairs is not None):
        raise InputError("--stability needs --pairs FILE, and --pairs goes with --stability")
    more = None if pairs is None else _read_pairs(pairs)  # a bad file fails before the work
    s = open_session(weights, clean)
    c = open_session(None, corrupt, model=s.model)
    pair = _pair(s, c, position, target, vs)
    e = len(pair.graph.edges)
    bar = not as_json and method.startswith("exact")
    with progress(e, f"patching {e} edges", enabled=bar) as step:
        r = circuits.find_circuit(pair, method, steps, seed=seed, advance=step)
    stab = None if more is None else _stability(
        s, more, pair, method, steps, r.smallest or top, target, vs, position)
    what = describe(s, pair.target, pair.vs)
    save_figure(view.circuit_figure(r, what, top), save, force)
    if as_json:
        _circuit_document(s, c, pair, r, stab, {
            "target": target, "vs": vs, "position": position, "method": method,
            "steps": steps if method == "eap-ig" else None, "seed": seed})
        return
    stdout().print(view.circuit_view(r, what, pair.position, s.tokens[pair.position],
                                     s.config.n_layer, s.config.n_head, top, stab))


@app.command()
def qk(
    text: str = TEXT, weights: Path = WEIGHTS,
    layer: int = typer.Option(0, "--layer", "-l", help="Block index; negative counts from "
                              "the end."),
    head: int = typer.Option(0, "--head", "-H", help="Head index; negative counts from the end."),
    query: int = typer.Option(-1, "--query", help="The query position; -1 is the last."),
    key: int = typer.Option(None, "--key", help="The key position whose score is split "
                            "(default: the one the query attends to most).", show_default=False),
    top: int = typer.Option(12, "--top", "-n", min=1, help="How many terms to list."),
    as_json: bool = JSON,
):
    """QK attribution: one head's attention scores split by where the query and key came from.

    The stream entering the block is a sum of parts (token and position embeddings, each
    earlier head and MLP, the output biases); through the block's LayerNorm, its scale frozen
    at this run's, each part gives a term of the query and of the key, and each score is the
    sum of one term per (query part, key part) pair, printed with the largest terms.

    Example: tinygpt qk "Ben had a ball. He liked his" --layer 3 --head 3
    Example: tinygpt qk "Ben had a ball. He liked his" --layer 3 --head 3 --key 3 --json
    """
    from ..analysis import qk as attribution
    from ..render import circuits as view

    s = open_session(weights, text)
    i, h, p = s.layer(layer), s.head(head), s.position(query)
    r = attribution.qk_attribution(s.params, s.config, s.trace().values, i, h, p)
    k = int(r.weights.argmax()) if key is None else key
    if not -(p + 1) <= k <= p:
        raise InputError(f"--key {key} is out of range: query position {p} attends to keys "
                         f"0..{p} (or -{p + 1}..-1 from the end)")
    k %= p + 1
    if as_json:
        emit(s, f"qk.layers.{i}.heads.{h}", r.terms, {"layer": layer, "head": head,
             "query": query, "key": key}, axes=["query part", "key part", "key"],
             sources=r.sources, layer=i, head=h, query=p, key=k, scores=r.scores,
             weights=r.weights)
        return
    stdout().print(view.qk_view(r, s.tokens, k, top))


def show_erasure(s: Session, r, position: int, target: int, vs: int | None,
                 baseline: str | None, as_json: bool) -> None:
    """`attribute --faithfulness`: the erasure curves of attribution r against occlusion and
    random orders (attention-x-grad's scores summed over its heads)."""
    from ..analysis import erasure
    from ..render import circuits as view

    base = None
    if baseline is not None:
        b = open_session(None, baseline, model=s.model)
        base = s.params["wte.weight"][b.ids]
    scores = r.scores.reshape(-1, r.scores.shape[-1]).sum(axis=0)
    e = erasure.erasure(s.params, s.config, s.ids, position, target, vs, scores, r.method,
                        base)
    if as_json:
        comp, suff = e.aopc
        emit(s, f"attribute.{r.method}.faithfulness", e.comprehensiveness,
             {"position": position, "method": r.method, "baseline": baseline},
             axes=["ranking", "k"], rankings=e.names, sufficiency=e.sufficiency,
             occlusion=e.occlusion, scores=scores[: position + 1], f=e.f, f_empty=e.f_empty,
             aopc_comprehensiveness=comp, aopc_sufficiency=suff, position=position,
             target=token_doc(s, target), vs=token_doc(s, vs))
        return
    stdout().print(view.erasure_view(e, s.tokens, describe(s, target, vs), position))


def describe(s, t: int, v: int | None) -> str:
    """The metric, for a heading: logit[' ball'] − logit[' car']."""
    tok = s.model.tokenizer.token_str
    return f"logit[{tok(t)!r}]" + (f" − logit[{tok(v)!r}]" if v is not None else "")


def token_doc(s, i: int | None) -> dict | None:
    return None if i is None else {"id": i, "token": s.model.tokenizer.token_str(i)}
