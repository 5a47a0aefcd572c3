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
    HEAD,
    JSON,
    LAYER,
    POSITION,
    QUIET,
    SAVE,
    TARGET,
    TEXT,
    VS,
    WEIGHTS,
    open_session,
    present,
    progress,
    read_text,
    stderr,
)
from .steering import steerable

if TYPE_CHECKING:
    from .context import RunContext

STEPS = typer.Option(20, "--steps", min=1, max=1000, help="eap-ig: points on the path from "
                     "the corrupt to the clean embeddings (one backward pass each); 1 is eap.")


@app.command()
@steerable
def circuit(
    context: RunContext,
    clean: str = typer.Argument(..., metavar="CLEAN", help="The text whose edges are kept. "
                                "--each-line FILE: a pair a line, CLEAN<TAB>CORRUPT.",
                                show_default=False),
    corrupt: str = typer.Argument(..., metavar="CORRUPT", help="The text whose sender outputs "
                                  "the other edges carry (same number of tokens).",
                                  show_default=False),
    weights: Path = WEIGHTS, target: str = TARGET, vs: str = VS, position: int = POSITION,
    method: str = typer.Option("eap-ig", "--method", help="eap (one backward pass), eap-ig "
                               "(gradients along the path), exact (each edge's clean output "
                               "into the corrupt run), exact-noising (each edge's corrupt "
                               "output into the clean run) or exact-mean (their mean, what "
                               "eap-ig estimates)."),
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
    edge patched into the corrupt run), exact-noising (the one edge corrupted in the clean
    run) or exact-mean (their mean: eap follows exact, eap-ig exact-mean). The top-N edges
    form a circuit whose faithfulness f(N) = (circuit − corrupt) / (clean − corrupt) is
    printed as a curve, with the smallest N reaching 0.8 and random circuits of that size as
    a baseline.

    Every family: a rotary model's embeddings are its token rows (positions turn each head's
    q and k), a parallel block's MLP (GPT-NeoX) is not fed by its own heads, and grouped
    key/value heads give each query head k and v inputs of its own.

    Example: tinygpt circuit "Ben had a ball. He liked his" "Ben had a car. He liked his"
    Example: tinygpt circuit "Tom had a ball. He saw his" "Tom had a car. He saw his" --method exact
    """
    from ..analysis import circuit as circuits
    from ..analysis import circuit_pairs as pairing
    from ..render import circuits as view
    from ..render.documents import circuit_document

    pairing.check_options(method, stable, pairs)
    more = None if pairs is None else pairing.read_pairs(pairs)  # a bad file fails first
    s = open_session(context, weights, clean)
    c = s.reopen(read_text(corrupt, s.model))
    pair, note = pairing.prepare_pair(s, c, position, target, vs)
    if note:
        stderr().print(note, style="dim", soft_wrap=True)
    e = len(pair.graph.edges)
    bar, runs = not as_json and method.startswith("exact"), 2 * e if method == "exact-mean" else e
    with progress(runs, f"patching {e} edges", enabled=bar) as step:
        r = circuits.find_circuit(pair, method, steps, seed=seed, advance=step)
    stab = None if more is None else pairing.stability_over(
        s, more, pair, method, steps, r.smallest or top, target, vs, position)
    what = pairing.describe(s.model.tokenizer.token_str, pair.target, pair.vs)
    present(context, as_json, lambda: circuit_document(s, c, pair, r, stab, {
        "target": target, "vs": vs, "position": position, "method": method,
        "steps": steps if method == "eap-ig" else None, "seed": seed}),
        lambda: view.circuit_view(r, what, pair.position, s.tokens[pair.position],
                                  s.config.n_layer, s.config.n_head, top, stab),
        figure=lambda: view.circuit_figure(r, what, top), save=save, force=force)


@app.command()
@steerable
def qk(
    context: RunContext,
    text: str = TEXT, weights: Path = WEIGHTS, layer: int = LAYER, head: int = HEAD,
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

    Other families: an RMSNorm divides each part by the run's rms (no centring). Qwen3's
    norm of each head's q and k divides each term by the run's rms of that q (or k), frozen
    like the block norm's, and multiplies it by the norm's scale. With rotary positions
    (NeoX, Llama, Qwen) there is no position part: each term is then turned by its position,
    the query's by the query's and the key's by the key's, so the terms are those of the
    rotated q and k, and still add up exactly to the score.

    Example: tinygpt qk "Ben had a ball. He liked his" --layer 3 --head 3
    Example: tinygpt qk "Ben had a ball. He liked his" --layer 3 --head 3 --key 3 --json
    """
    from ..analysis import qk as attribution
    from ..render import circuits as view
    from ..render.documents import qk_document

    s = open_session(context, weights, text)
    i, h, p = s.layer(layer), s.head(head), s.position(query)
    r = attribution.qk_attribution(s.params, s.config, s.trace().values, i, h, p, s.steering)
    k = attribution.key_position(r, key)
    present(context, as_json, lambda: qk_document(s, r, i, h, p, k, {"layer": layer, "head": head,
                                                            "query": query, "key": key}),
            lambda: view.qk_view(r, s.tokens, k, top))
