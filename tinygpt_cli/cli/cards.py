"""One command per card of the seed page: read the text, run the model, pick the value, render."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from .app import app
from .common import (
    ABLATE,
    FORCE,
    FULL,
    HEAD,
    JSON,
    LAYER,
    PICK_SEED,
    POSITION,
    QUIET,
    SAVE,
    TEMPERATURE,
    TEXT,
    TOP,
    TOP_K,
    TOP_P,
    WEIGHTS,
    InputError,
    check_index,
    figures,
    present,
    run,
    show_view,
    stdout,
    wide,
)
from .steering import steerable

if TYPE_CHECKING:
    from ..jobs.session import Run
    from .context import RunContext

# NumPy, Rich and the model are imported inside the commands: registering them (and
# `tinygpt --help`) stays cheap, and each command loads only what it shows.


def show(context: RunContext, r: Run, path: str, as_json: bool, full: bool, *, extra=None,
         below=(), save=None, force=False, figure=None):
    """Print one traced value: JSON document (with `extra`), or header + token-labelled table
    (+ `below`); with --save, write its picture first (`figure`, default the value as a
    heatmap)."""
    from ..render.cards import value_view
    from ..render.documents import session_document

    value = r.trace.get(path)
    present(context, as_json, lambda: session_document(r, path, value, **(extra or {})),
            lambda: value_view(path, value, r.tokens, full, below),
            figure=figure or (lambda: figures("figure").value_figure(path, value, r.tokens)),
            save=save, force=force,  # --full: as wide as the table
            console=lambda view: wide(context, view.renderables[0]) if full
            else stdout(context))


# ------------------------------------------------------------------ cards 2-4, 8


@app.command()
@steerable
def embed(context: RunContext, text: str = TEXT, weights: Path = WEIGHTS,
          ablate: list[str] = ABLATE,
          as_json: bool = JSON, full: bool = FULL,
          save: Path = SAVE, force: bool = FORCE, quiet: bool = QUIET):
    """Card 2: each token id picks its row of the embedding table W_E.

    Example: tinygpt embed "Lily wanted to play with her"
    """
    show(context, run(context, weights, text, ablate), "token_embeddings", as_json, full,
         save=save, force=force)


@app.command()
@steerable
def pos(
    context: RunContext,
    text: str = TEXT, weights: Path = WEIGHTS, ablate: list[str] = ABLATE,
    as_json: bool = JSON, full: bool = FULL,
    total: bool = typer.Option(False, "--sum", help="Show embeddings = tokens + positions."),
    save: Path = SAVE, force: bool = FORCE, quiet: bool = QUIET,
):
    """Card 3: each position's row of W_P, added to the token rows (--sum shows the result).

    A rotary model has no W_P: its positions turn q and k, by the angles shown.

    Example: tinygpt pos "Lily wanted to play with her" --sum
    """
    from ..render.cards import rotary_note
    from ..transformer.page import angles_of_base, bases_by_blocks

    r = run(context, weights, text, ablate)
    cfg = r.model.config
    rotary = cfg.positions == "rotary" and not total
    path = "embeddings" if total else "rotary_angles" if rotary else "position_embeddings"
    bases = bases_by_blocks(cfg) if rotary else []
    # Gemma 3: sliding and full blocks turn by their own base; data is cfg.rotary_base's
    extra = {"base": cfg.rotary_base, "rotary_bases": [
        {"base": b, "blocks": blocks, "angles": angles_of_base(cfg, r.T, b)}
        for b, blocks in bases]} if len(bases) > 1 else None
    show(context, r, path, as_json, full, save=save, force=force, extra=extra,
         below=rotary_note(rotary, cfg.rotary_base, bases, r.tokens, full,
                           lambda b: angles_of_base(cfg, r.T, b)))


def _norm(context: RunContext, r: Run, prefix: str, as_json: bool, full: bool, save=None,
          force=False):
    from rich.text import Text

    from ..render.cards import NORM_NOTE, RMS_NOTE, sandwich_note
    from ..transformer.wiring import describe

    cfg = r.model.config
    if cfg.norm == "rms":  # an RMSNorm divides by each token's rms alone
        rms = r.trace.get(prefix + ".rms")[:, 0]
        norms = describe(cfg, 0).norms
        extra = {"rms": rms}
        if cfg.post_norms:  # Gemma 3: four norms a block, each scale 1 + w (the file's w)
            extra |= {"norms": list(norms), "scale": "1 + w"}
        show(context, r, prefix + ".out", as_json, full, extra=extra, save=save,
             force=force, below=[Text(RMS_NOTE, style="dim"),
                                 *sandwich_note(norms if cfg.post_norms else (),
                                                final=prefix == "ln_final")])
        return
    mean = r.trace.get(prefix + ".mean")[:, 0]
    std = r.trace.get(prefix + ".std")[:, 0]
    show(context, r, prefix + ".out", as_json, full, extra={"mean": mean, "std": std}, save=save,
         force=force, below=[Text(NORM_NOTE, style="dim")])


@app.command()
@steerable
def norm(
    context: RunContext,
    text: str = TEXT, weights: Path = WEIGHTS, ablate: list[str] = ABLATE,
    layer: int = LAYER,
    which: str = typer.Option("ln1", "--which", help="ln1 (before attention) or ln2 (before "
                              "the feed-forward layer); Gemma 3's ln1_post and ln2_post "
                              "(after each)."),
    as_json: bool = JSON, full: bool = FULL,
    save: Path = SAVE, force: bool = FORCE, quiet: bool = QUIET,
):
    """Card 4: a norm of one block (LayerNorm: each token's mean and std; RMSNorm: its rms).

    Example: tinygpt norm "Lily wanted to play with her" --layer 0 --which ln1
    """
    from ..transformer.wiring import describe

    r = run(context, weights, text, ablate)
    norms = describe(r.model.config, 0).norms  # ln1, ln2 (Gemma 3: and after each branch)
    if which not in norms:
        raise InputError(f"--which must be {' or '.join([', '.join(norms[:-1]), norms[-1]])}, "
                         f"not {which!r}")
    layer = check_index(layer, r.model.config.n_layer, "layer")
    _norm(context, r, f"layers.{layer}.{which}", as_json, full, save, force)


@app.command("final-norm")
@steerable
def final_norm(context: RunContext, text: str = TEXT, weights: Path = WEIGHTS,
               ablate: list[str] = ABLATE,
               as_json: bool = JSON, full: bool = FULL,
               save: Path = SAVE, force: bool = FORCE, quiet: bool = QUIET):
    """Card 8: the final norm after the last block.

    Example: tinygpt final-norm "Lily wanted to play with her"
    """
    _norm(context, run(context, weights, text, ablate), "ln_final", as_json, full, save, force)


# ------------------------------------------------------------------ card 5


@app.command()
@steerable
def attn(
    context: RunContext,
    text: str = TEXT, weights: Path = WEIGHTS, ablate: list[str] = ABLATE,
    layer: int = LAYER, head: int = HEAD,
    all_heads: bool = typer.Option(False, "--all-heads", help="Show every head side by side."),
    scores: bool = typer.Option(False, "--scores", help="Show the masked, scaled scores "
                                "QK^T/sqrt(d_k) instead of the softmax weights."),
    as_json: bool = JSON, full: bool = typer.Option(False, "--full", help="Show every "
                                                     "column of a long text, however wide."),
    save: Path = SAVE, force: bool = FORCE, quiet: bool = QUIET,
):
    """Card 5: the T × T attention grid of one head as a heatmap (rows attend to columns).

    Example: tinygpt attn "Lily wanted to play with her" --layer 0 --head 0
    """
    from ..render.heads import head_view, heads_view  # no Rich where nothing is styled

    if all_heads and "head" in context.given:
        raise InputError(f"--all-heads shows every head and --head {head} picks one: give "
                         "one of them")
    r = run(context, weights, text, ablate)
    cfg = r.model.config
    layer = check_index(layer, cfg.n_layer, "layer")
    field = "scores" if scores else "weights"
    if all_heads:
        path, grid_view = f"layers.{layer}.{field}", heads_view
    else:
        head = check_index(head, cfg.n_head, "head")
        path, grid_view = f"layers.{layer}.heads.{head}.{field}", head_view
    grids = r.trace.get(path)
    window = cfg.window(layer)  # a sliding block's: the keys before it are drawn apart

    def document():  # the JSON writer loads only for JSON
        from ..render.documents import session_document

        return session_document(r, path, grids, **({"window": window} if window else {}))

    present(context, as_json, document,
            lambda: grid_view(path, grids, r.tokens, scores, full, window),  # (view, measure)
            figure=lambda: figures("figure").attention_figure(path, grids, r.tokens,
                                                              scores=scores, window=window),
            save=save, force=force,
            show=lambda shown: show_view(context, shown[0], full, measured=shown[1]))


# ------------------------------------------------------------------ card 6


@app.command()
@steerable
def mlp(
    context: RunContext,
    text: str = TEXT, weights: Path = WEIGHTS, ablate: list[str] = ABLATE, layer: int = LAYER,
    top: int = typer.Option(5, "--top", "-n", min=1, help="How many hidden neurons to list "
                            "(capped at the feed-forward width)."),
    as_json: bool = JSON, full: bool = FULL,
    save: Path = SAVE, force: bool = FORCE, quiet: bool = QUIET,
):
    """Card 6: the feed-forward output of one block, and its most active hidden neurons.

    Example: tinygpt mlp "Lily wanted to play with her" --layer 0 --top 5
    """
    from ..analysis.lens import top_neurons
    from ..render.cards import neurons_below

    r = run(context, weights, text, ablate)
    layer = check_index(layer, r.model.config.n_layer, "layer")
    post = r.trace.get(f"layers.{layer}.mlp_post")
    neurons = top_neurons(post, min(top, post.shape[1]))
    if r.model.config.mlp == "gated":  # each neuron's gate and up, whose product it is
        gate, up = (r.trace.get(f"layers.{layer}.{v}") for v in ("mlp_pre", "mlp_up"))
        for n in neurons:
            n["gate"], n["up"] = gate[:, n["neuron"]], up[:, n["neuron"]]
    path = f"layers.{layer}.mlp_out"
    show(context, r, path, as_json, full, extra={"top_neurons": neurons}, save=save, force=force,
         below=() if as_json else neurons_below(layer, post.shape[1], neurons, r.tokens, full,
                                                r.model.config),
         figure=lambda: figures("pictures").neurons_figure(path, r.trace.get(path), r.tokens,
                                                           layer, neurons))


# ------------------------------------------------------------------ card 7


@app.command()
@steerable
def blocks(context: RunContext, text: str = TEXT, weights: Path = WEIGHTS,
           ablate: list[str] = ABLATE,
           as_json: bool = JSON, full: bool = FULL,
           position: int = POSITION, save: Path = SAVE, force: bool = FORCE, quiet: bool = QUIET):
    """Card 7: the residual stream after each block, what each block changed, the top guess.

    The guess reads the stream through the final norm and the output head (the "logit lens").
    Example: tinygpt blocks "Lily wanted to play with her"
    """
    import numpy as np

    from ..analysis.lens import block_summary
    from ..render.documents import blocks_document
    from ..render.tables import blocks_view

    r = run(context, weights, text, ablate)
    p = check_index(position, r.T, "position")
    rows = block_summary(r.trace, r.model.params, r.model.config, position=p)
    tok = r.model.tokenizer.token_str
    norms = np.stack([row["norm"] for row in rows])  # [n_layer + 1, T]
    present(context, as_json, lambda: blocks_document(r, rows, norms, tok, p),
            lambda: blocks_view(rows, tok, p, r.tokens, norms, full),
            figure=lambda: figures("pictures").blocks_figure(rows, tok, p, r.tokens), save=save,
            force=force,  # --full: wide
            console=lambda view: wide(context, view) if full else stdout(context))


# ------------------------------------------------------------------ cards 9-11


@app.command()
@steerable
def logits(context: RunContext, text: str = TEXT, weights: Path = WEIGHTS,
           ablate: list[str] = ABLATE,
           position: int = POSITION, top: int = TOP,
           as_json: bool = JSON, save: Path = SAVE, force: bool = FORCE, quiet: bool = QUIET):
    """Card 9: one score per vocabulary token at a position; lists the highest.

    Example: tinygpt logits "Lily wanted to play with her" --position -1 --top 10
    """
    from ..analysis.lens import top_entries
    from ..render.cards import logits_view
    from ..render.documents import session_document

    r = run(context, weights, text, ablate)
    p = check_index(position, r.T, "position")
    row = r.session.logits()[p]
    path = f"logits[{p}]"
    rows = top_entries(row, top, r.model.tokenizer.token_str, "logit")
    present(context, as_json, lambda: session_document(r, path, row, position=p, top=rows),
            lambda: logits_view(path, row, rows, r.T),
            figure=lambda: figures("pictures").top_figure(path, rows, "logit", r.tokens),
            save=save, force=force)


@app.command()
@steerable
def probs(context: RunContext, text: str = TEXT, weights: Path = WEIGHTS,
          ablate: list[str] = ABLATE,
          position: int = POSITION,
          temperature: float = TEMPERATURE, top: int = TOP, as_json: bool = JSON,
          save: Path = SAVE, force: bool = FORCE, quiet: bool = QUIET):
    """Card 10: softmax turns the scores into chances that add up to 1.

    Example: tinygpt probs "Lily wanted to play with her" --temperature 1 --top 10
    """
    from ..analysis.lens import top_entries
    from ..render.cards import probs_path, probs_view
    from ..render.documents import session_document
    from ..transformer.sampling import probabilities

    r = run(context, weights, text, ablate)
    p = check_index(position, r.T, "position")
    pr = probabilities(r.session.logits()[p], temperature)
    path = probs_path(p, temperature)  # the trace's own probs at 1, else a formula
    rows = top_entries(pr, top, r.model.tokenizer.token_str, "chance")
    formula = {} if temperature == 1 else {"formula": path}
    present(context, as_json, lambda: session_document(
                r, path if temperature == 1 else None, pr, **formula, position=p,
                temperature=temperature, top=rows),
            lambda: probs_view(path, pr, rows),
            figure=lambda: figures("pictures").top_figure(path, rows, "chance", r.tokens,
                                                          percent=True),
            save=save, force=force)


@app.command("sample")
@steerable
def sample_cmd(context: RunContext, text: str = TEXT, weights: Path = WEIGHTS,
               ablate: list[str] = ABLATE,
               seed: int = PICK_SEED,
               temperature: float = TEMPERATURE, top_k: int = TOP_K, top_p: float = TOP_P,
               as_json: bool = JSON):
    """Card 11: pick one next token from the chances with a seeded generator.

    Each run picks with a new seed, shown beside the token, as generate does; --seed gives one
    again.

    Example: tinygpt sample "Lily wanted to play with her" --seed 1
    """
    from ..render.cards import continued_text, sample_view
    from ..render.documents import sample_document
    from ..transformer.sampling import (
        check_top_p,
        create_rng,
        fresh_seed,
        next_token_distribution,
        sample,
    )

    check_top_p(top_p)
    seed = fresh_seed() if seed is None else seed
    r = run(context, weights, text, ablate)
    dist = next_token_distribution(r.session.logits()[-1], temperature, top_k, top_p)
    token_id = sample(dist, create_rng(seed))
    token, chance = r.model.tokenizer.token_str(token_id), float(dist[token_id])

    def show(views) -> None:  # the text as it is, not wrapped by Rich
        stdout(context).print(views[0])
        stdout(context).print(views[1], soft_wrap=True)

    present(context, as_json, lambda: sample_document(r, token_id, token, chance, seed,
                                                      temperature, top_k, top_p),
            lambda: (sample_view(token, token_id, chance, seed),
                     continued_text(r.text, r.model.tokenizer.decode([token_id]))), show=show)
