"""Why this token: logit lens, direct logit attribution, ablation, patching, input attribution.

Each command reads its texts, opens a Session, calls one analysis of tinygpt_cli.analysis and
renders the result (render.explain) or prints one JSON document with the options it used.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ..escapes import escape_line
from .app import app
from .common import (
    ANY_DATA,
    FORCE,
    FORCE_FILE,
    JSON,
    POSITION,
    QUIET,
    SAVE,
    TARGET,
    TEXT,
    TOP,
    VS,
    WEIGHTS,
    at_least,
    bar,
    engine,
    figures,
    load,
    open_session,
    present,
    progress,
    read_text,
    stderr,
    steered,
)
from .steering import steerable

if TYPE_CHECKING:
    from .context import RunContext

# NumPy and the model are imported inside the commands

NEURONS = 20  # --neurons lists this many
LENS_KIND = typer.Option("logit", "--kind", help="logit, or tuned: each block's input read "
                         "through the translator of --lens.")
LENS_FIT = typer.Option(False, "--fit", help="Fit the tuned lens on the training text and "
                        "write it to --lens (steered: fit to the steered run; give --lens).")
LENS_EVALUATE = typer.Option(False, "--evaluate", help="KL to the final distribution and "
                             "top-1 agreement of both lenses per stage, held out (steered: of "
                             "the steered run).")
LENS_FILE = typer.Option(None, "--lens", help="The tuned lens file (default: the weights "
                         "folder's lens/tuned.safetensors).", show_default=False)
LENS_DATA = typer.Option(None, "--data", help="Stories for --fit (all parts but the last) or "
                         "--evaluate (the last part, or this file).", show_default=False)


# ------------------------------------------------------------------ lens


@app.command()
@steerable
def lens(context: RunContext, text: str = TEXT, weights: Path = WEIGHTS, target: str = TARGET,
         position: int = POSITION, as_json: bool = JSON, save: Path = SAVE,
         force: bool = FORCE_FILE, quiet: bool = QUIET, kind: str = LENS_KIND,
         fit: bool = LENS_FIT, evaluate: bool = LENS_EVALUATE, lens_file: Path = LENS_FILE,
         data: Path = LENS_DATA):
    """Logit lens: the likeliest next token at every position after every stage.

    Each stage (the embeddings, each block's resid_mid and resid_post) goes through the final
    norm with its statistics recomputed from that stage, then the output head. Also shows
    the target's chance and rank at --position after every stage. --kind tuned reads the
    stream entering each block through its learned translator first: ln_final(h + h A + b).

    \b
    Example: tinygpt lens "Lily wanted to play with her" --target " toys"
    Example: tinygpt lens "Lily wanted to play with her" --kind tuned
    Example: tinygpt lens --evaluate
    Example: tinygpt lens --evaluate --steer happy --steer-away sad --steer-layer 1
    """
    from ..analysis import tuned_lens as tl
    from ..analysis.lens import lens_report
    from ..jobs.tuned_lens import tuned_reader
    from ..render import explain as view
    from ..render.documents import lens_document
    from .features import tuned_lens_work

    if fit or evaluate:
        return tuned_lens_work(context, weights, fit, evaluate, lens_file, data, as_json, force)
    s = open_session(context, weights, text)
    tuned = tl.check_kind(kind) == "tuned"
    r = lens_report(s, position, target, tuned_reader(s, lens_file) if tuned else None)
    present(context, as_json, lambda: lens_document(s, r, {"target": target, "position": position}),
            lambda: view.lens_view(r),  # the grid drops middle stages behind `…` to fit
            figure=lambda: figures().lens_figure(r), save=save, force=force)


# ------------------------------------------------------------------ direct logit attribution


@app.command()
@steerable
def dla(context: RunContext, text: str = TEXT, weights: Path = WEIGHTS, target: str = TARGET,
        vs: str = VS,
        position: int = POSITION, neurons: bool = typer.Option(
            False, "--neurons", help=f"Also list the {NEURONS} single MLP neurons with the "
            "largest shares."),
        top: int = TOP, as_json: bool = JSON, save: Path = SAVE, force: bool = FORCE,
        quiet: bool = QUIET):
    """Direct logit attribution: each part of the final stream's share of the target's logit.

    The parts (token and position embeddings, each head through its own rows of c_proj, each
    attention bias, each MLP output) are centred and divided by the final norm's std from the
    real forward pass, then dotted with g * W_E[target] (minus W_E[vs]); the final norm's bias
    is a row of its own, so the rows add up to the logit (or the difference).

    \b
    Example: tinygpt dla "Lily wanted to play with her" --target " toys" --vs " mom"
    """
    from ..analysis.dla import dla_report
    from ..render import explain as view
    from ..render.documents import dla_document

    s = open_session(context, weights, text)
    r = dla_report(s, position, target, vs, NEURONS if neurons else 0)
    present(context, as_json, lambda: dla_document(s, r, {"target": target, "vs": vs,
                                                 "position": position, "neurons": neurons}),
            lambda: view.dla_view(r, top), figure=lambda: figures().dla_figure(r, top),
            save=save, force=force)


# ------------------------------------------------------------------ ablation


@app.command()
@steerable
def ablate(
    context: RunContext,
    text: str = TEXT, weights: Path = WEIGHTS, target: str = TARGET, position: int = POSITION,
    layer: int = typer.Option(None, "--layer", "-l", help="The block of the component.",
                              show_default=False),
    head: int = typer.Option(None, "--head", "-H", help="Take out this head's output.",
                             show_default=False),
    mlp: bool = typer.Option(False, "--mlp", help="Take out the block's MLP output."),
    every: bool = typer.Option(False, "--all", help="Take out each head and each MLP in turn "
                               "and rank them by effect."),
    mode: str = typer.Option("zero", "--mode", help="zero, mean (over --data or the stored "
                             "means) or resample (from --from)."),
    source: str = typer.Option(None, "--from", help="Resample: the text whose values are used "
                               "(at least as many tokens).", show_default=False),
    data: Path = typer.Option(None, "--data", help="Mean: average over the validation file of "
                              "this folder (cached) instead of the stored means.",
                              show_default=False),
    top: int = typer.Option(5, "--top", "-n", min=1, help="How many top tokens to show."),
    as_json: bool = JSON, save: Path = SAVE, force: bool = FORCE, quiet: bool = QUIET,
):
    """Ablation: take out a head or an MLP; the change in log p(target) and the KL divergence.

    Example: tinygpt ablate "Lily wanted to play with her" --layer 2 --head 1 --mode mean
    Example: tinygpt ablate "Lily wanted to play with her" --all
    Example: tinygpt ablate "Lily wanted to play" --all --mode resample --from "Tom wanted to play"
    """
    from ..analysis import ablate as ablation
    from ..jobs.means import ablation_means
    from ..render import explain as view
    from ..render.documents import ablation_document

    ablation.check_mode(mode)
    s = open_session(context, weights, text)
    p = s.position(position)
    components = ablation.components(s, layer, head, mlp, every)
    edit = ablation.replacements(s, components, mode, source, data is not None,
                                 lambda: ablation_means(s.model, data, bar(), s.steering))
    r = ablation.ablation_report(s, components, edit, p, target, top, mode=mode, every=every)
    options = {"target": target, "position": position, "layer": layer, "head": head,
               "mlp": mlp, "all": every, "mode": mode, "from": source,
               "data": str(data) if data else None}
    present(context, as_json, lambda: ablation_document(s, r, options),
            lambda: view.ablation_view(r),
            figure=lambda: figures().ablation_figure(r, s.config.n_layer, s.config.n_head),
            save=save, force=force)


@app.command()
@steerable
def means(
    context: RunContext,
    data: Path = typer.Option(None, "--data", help="A folder of part-*.txt files, whose last "
                              "one (the validation text) is averaged over, or one text file. "
                              "Default: the validation file WEIGHTS/data.json records.",
                              show_default=False),
    any_data: bool = ANY_DATA,
    weights: Path = WEIGHTS,
    out: Path = typer.Option(None, "--out", help="Where to write (default: means.safetensors "
                             "in the weights folder).", show_default=False),
    force: bool = FORCE_FILE,
    as_json: bool = JSON,
):
    """Store each head's and MLP's mean output over the validation text, for --mode mean.

    One vector per head output, attn_out and mlp_out, averaged over every position of every
    128-token window of the last part-*.txt; float32, written atomically with the sha256 of
    the weights it belongs to. Re-run it whenever the weights change. Steered (--steer ...):
    the means of the steered run, written only to --out FILE, whose metadata says so.

    \b
    Example: tinygpt means --out means.safetensors
    Example: tinygpt means --steer happy --steer-away sad --steer-layer 1 --out m.safetensors
    """
    from ..jobs import means as mean_stats
    from ..jobs.corpus import check_data, validation_text
    from ..render.explain import means_written
    from ..render.output import check_out
    from ..storage.files import sha256
    from .steering import keep_default_file

    keep_default_file(context, out, f"the weights folder's {mean_stats.FILE}")
    model = load(context, weights)
    target = out if out is not None else model.folder / mean_stats.FILE
    check_out(out, force, example="--out means.safetensors", folder_made=True, default=target)
    note = None  # means written beside the weights are of the text they record
    if data is not None:
        note = check_data(model.folder, validation_text(model.folder, data), any_data=any_data,
                          kinds=("validation",))
    hooks, changes = steered(context, model)
    with engine(context) as where:
        values, meta = mean_stats.means_over(model, data, sha256(model.weights_file),
                                             bar(), hooks, where)
    if note:  # once the means stand: an error is then the only line
        stderr().print(escape_line(note), soft_wrap=True)
    mean_stats.save_means(target, values, {**meta, **changes})
    present(context, as_json,
            lambda: {"path": str(target), **meta, "values": sorted(values), **changes},
            lambda: means_written(target, len(values), meta))


# ------------------------------------------------------------------ activation patching


@app.command()
@steerable
def patch(
    context: RunContext,
    clean: str = typer.Argument(..., metavar="CLEAN", help="The text whose values are copied "
                                "in. --each-line FILE: a pair a line, CLEAN<TAB>CORRUPT "
                                "(--mean: one JSON document, averaged).", show_default=False),
    corrupt: str = typer.Argument(..., metavar="CORRUPT", help="The text they are copied "
                                  "into (same number of tokens).", show_default=False),
    weights: Path = WEIGHTS, target: str = TARGET, vs: str = VS, position: int = POSITION,
    method: str = typer.Option("activation", "--method", help="activation (run every patch) or "
                               "atp (attribution patching: one backward pass)."),
    as_json: bool = JSON, save: Path = SAVE, force: bool = FORCE, quiet: bool = QUIET,
):
    """Activation patching: how much of the clean prediction each clean value restores.

    For every block and position, resid_pre, resid_mid, resid_post, attn_out and mlp_out are
    copied from the clean run into the corrupt one (a parallel block, GPT-NeoX's, has no
    resid_mid: its grids are the others), then each head's output at every position;
    each cell is (patched − corrupt) / (clean − corrupt) of logit[target] − logit[vs] (default:
    the clean run's top guess against the corrupt run's). --method atp estimates every cell
    from one backward pass and prints its correlation with the real patching.

    Example: tinygpt patch "Lily wanted to play with her" "Lily wanted to read with her"
    Example: tinygpt patch "Lily wanted to play" "Lily wanted to read" --method atp
    """
    from ..analysis import patch as patching
    from ..render import explain as view
    from ..render.documents import patch_document

    patching.check_method(method)
    s = open_session(context, weights, clean)
    c = s.reopen(read_text(corrupt, s.model))
    q, note = patching.patch_question(s, c, s.position(position), target, vs)
    if note:
        stderr().print(note, style="dim")
    runs = patching.patch_count(s.config, q.position)
    with progress(runs, f"patching ({runs} runs)", enabled=not as_json and runs > 500) as step:
        r = patching.patch_report(s, c, q, method, step)
    present(context, as_json, lambda: patch_document(s, c, r, list(r.result.stream), {
                "target": target, "vs": vs, "position": position, "method": method}),
            lambda: view.patch_view(r), figure=lambda: figures().patch_figure(r), save=save,
            force=force,  # the grids flow onto as many lines as the width needs: one fits
            console=lambda _: at_least(context, view.patch_width(s.config.n_layer,
                                                                 s.config.n_head)))


# ------------------------------------------------------------------ input attribution


@app.command()
@steerable
def attribute(
    context: RunContext,
    text: str = TEXT, weights: Path = WEIGHTS, target: str = TARGET, vs: str = VS,
    position: int = POSITION,
    method: str = typer.Option("grad-x-input", "--method", help="grad, grad-x-input, "
                               "integrated-gradients or attention-x-grad."),
    steps: int = typer.Option(64, "--steps", min=1, max=4096, help="Integrated gradients: "
                              "points on the path (midpoint rule); each is a forward and a "
                              "backward pass."),
    baseline: str = typer.Option(None, "--baseline", help="Integrated gradients: start from "
                                 "this text's token embeddings (same token count) instead of "
                                 "zeros; positions are kept either way.", show_default=False),
    faithfulness: bool = typer.Option(False, "--faithfulness", help="Erase the top-k tokens "
                                      "(comprehensiveness) or all but them (sufficiency), "
                                      "against occlusion and random orders."),
    as_json: bool = JSON,
):
    """Input attribution: each input token's share of the target's score, by the backward pass.

    The input is the token embeddings W_E[ids]; the position embeddings are held fixed.
    grad: gradient . the token's direction, and the gradient's norm; grad-x-input: gradient .
    embedding; integrated-gradients: (x − baseline) . mean gradient along the straight path,
    whose scores add up to f(input) − f(baseline) (the gap is printed); attention-x-grad:
    A · dscore/dA per head, summed over queries, for each key token.

    \b
    Example: tinygpt attribute "Lily wanted to play with her" --method integrated-gradients
    Example: tinygpt attribute "Lily wanted to play with her" --faithfulness
    """
    from ..analysis import attribute as attribution
    from ..render import explain as view
    from ..render.documents import attribution_document

    attribution.check_method(method, baseline)
    s = open_session(context, weights, text)
    report = attribution.attribution_report(s, position, target, vs, method, steps, baseline)
    r, q = report.attribution, report.q
    if faithfulness:  # the curves of this attribution's ranking
        from ..analysis.circuit_pairs import describe
        from ..analysis.erasure import erasure_of
        from ..render.circuits import erasure_view
        from ..render.documents import erasure_document

        e, scores = erasure_of(s, r, q.position, q.target, q.vs, baseline)
        return present(context, as_json, lambda: erasure_document(
            s, e, scores, q.position, q.target, q.vs,
            {"position": q.position, "method": r.method, "baseline": baseline}),
            lambda: erasure_view(e, s.tokens, describe(s.model.tokenizer.token_str, q.target,
                                                       q.vs), q.position))
    # attention-x-grad: one grid per layer, side by side as the width allows; never narrower
    # than one whole grid, whose heads would otherwise fall off the edge unmarked
    grid = view.grid_width(s.tokens, s.config.n_head) if r.scores.ndim == 3 else 0
    present(context, as_json, lambda: attribution_document(s, report, {
        "target": target, "vs": vs, "position": position, "method": method,
        "steps": steps if method == "integrated-gradients" else None, "baseline": baseline}),
        lambda: view.attribute_view(report), console=lambda _: at_least(context, grid))
