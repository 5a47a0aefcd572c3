"""Why this token: logit lens, direct logit attribution, ablation, patching, input attribution.

Each command reads its texts, opens a Session, calls one analysis of tinygpt_cli.analysis and
renders the result (render.explain) or prints one JSON document with the options it used.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ..errors import WeightsError
from ..render.text import escape_line
from .app import app
from .common import (
    FORCE,
    JSON,
    POSITION,
    QUIET,
    SAVE,
    TARGET,
    TEXT,
    TOP,
    VS,
    WEIGHTS,
    InputError,
    load,
    progress,
    read_text,
    save_figure,
    stdout,
)

if TYPE_CHECKING:  # NumPy and the model are imported inside the commands
    import numpy as np

    from ..session import Session


NEURONS = 20  # --neurons lists this many
LENS_KIND = typer.Option("logit", "--kind", help="logit, or tuned: each block's input read "
                         "through the translator of --lens.")
LENS_FIT = typer.Option(False, "--fit", help="Fit the tuned lens on the training text and "
                        "write it to --lens.")
LENS_EVALUATE = typer.Option(False, "--evaluate", help="KL to the final distribution and "
                             "top-1 agreement of both lenses, per stage, on held-out text.")
LENS_FILE = typer.Option(None, "--lens", help="The tuned lens file (default: the weights "
                         "folder's lens/tuned.safetensors).", show_default=False)
LENS_DATA = typer.Option(None, "--data", help="Stories for --fit (all parts but the last) or "
                         "--evaluate (the last part, or this file).", show_default=False)


def open_session(weights: Path | None, text: str | None, model=None) -> Session:
    from ..session import Session

    return Session.open(read_text(text), model=model if model is not None else load(weights))


def scored(s: Session, logits_row: np.ndarray, target: str | None, vs: str | None):
    """(target id, vs id or None): the given tokens, or the top guess of `logits_row`."""
    import numpy as np

    t = s.token_id(target) if target is not None else int(np.argmax(logits_row))
    v = s.token_id(vs) if vs is not None else None
    if v is not None and v == t:
        raise InputError(f"--vs is the target itself ({s.model.tokenizer.token_str(t)!r}): "
                         "the logit difference would be 0")
    return t, v


def describe(s: Session, t: int, v: int | None) -> str:
    tok = s.model.tokenizer.token_str
    return f"logit[{tok(t)!r}]" + (f" − logit[{tok(v)!r}]" if v is not None else "")


def token_doc(s: Session, i: int | None) -> dict | None:
    return None if i is None else {"id": i, "token": s.model.tokenizer.token_str(i)}


def console(width: int):
    """stdout, widened to `width` columns when the view needs more (a grid of many stages or
    heads). The width is counted from the grid's shape: measuring a large Rich table first
    costs as much as printing it."""
    out = stdout()
    return stdout(width=width) if width > out.width else out


LABEL = 20  # a token row label and its padding


def emit(s: Session, path: str, value, options: dict, **extra) -> None:
    from ..render import jsonout

    jsonout.emit(jsonout.document(path, value, s.ids, s.tokens, options=options, **extra))


# ------------------------------------------------------------------ lens


@app.command()
def lens(text: str = TEXT, weights: Path = WEIGHTS, target: str = TARGET,
         position: int = POSITION, as_json: bool = JSON, save: Path = SAVE,
         force: bool = FORCE, quiet: bool = QUIET, kind: str = LENS_KIND,
         fit: bool = LENS_FIT, evaluate: bool = LENS_EVALUATE, lens_file: Path = LENS_FILE,
         data: Path = LENS_DATA):
    """Logit lens: the likeliest next token at every position after every stage.

    Each stage (the embeddings, each block's resid_mid and resid_post) goes through the final
    LayerNorm with its mean and std recomputed from that stage, then the tied head. Also shows
    the target's chance and rank at --position after every stage. --kind tuned reads the
    stream entering each block through its learned translator first: ln_final(h + h A + b).

    \b
    Example: tinygpt lens "Lily wanted to play with her" --target " toys"
    Example: tinygpt lens "Lily wanted to play with her" --kind tuned
    Example: tinygpt lens --evaluate
    """
    from ..analysis.lens import logit_lens
    from ..render import explain as view
    from .features import check_lens_kind, tuned_lens, tuned_lens_work

    if fit or evaluate:
        return tuned_lens_work(weights, fit, evaluate, lens_file, data, as_json)
    s = open_session(weights, text)
    p = s.position(position)
    tr = s.trace()
    t, _ = scored(s, tr.get("logits")[p], target, None)
    result = (tuned_lens(s, tr, lens_file) if check_lens_kind(kind) == "tuned"
              else logit_lens(tr, s.params, s.config))
    top_ids, top_probs = result.top()  # [S, T]
    probs, ranks = result.target(t, p)
    tok = s.model.tokenizer.token_str
    top_tokens = [[tok(int(i)) for i in row] for row in top_ids.T]
    if save is not None:
        from ..render.analysis_pictures import lens_figure

        save_figure(lens_figure(result.stages, s.tokens, top_tokens, top_probs, (t, tok(t)), p,
                                probs, ranks), save, force)
    if as_json:
        emit(s, "lens", top_probs.T, {"target": target, "position": position},
             stages=result.stages, top_ids=top_ids.T, top_tokens=top_tokens, position=p,
             target=token_doc(s, t), target_probs=probs, target_ranks=ranks)
        return
    v = view.lens_view(result.stages, s.tokens, top_tokens, top_probs.T, (t, tok(t)), p, probs,
                       ranks)
    stdout().print(v)  # the grid drops middle stages behind `…` to fit the width


# ------------------------------------------------------------------ direct logit attribution


@app.command()
def dla(text: str = TEXT, weights: Path = WEIGHTS, target: str = TARGET, vs: str = VS,
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
    from ..analysis.dla import direct_logit_attribution
    from ..render import explain as view

    s = open_session(weights, text)
    p = s.position(position)
    tr = s.trace()
    t, v = scored(s, tr.get("logits")[p], target, vs)
    r = direct_logit_attribution(tr, s.params, s.config, p, t, v, NEURONS if neurons else 0)
    if save is not None:
        from ..render.analysis_pictures import dla_figure

        save_figure(dla_figure(r.labels, r.values, r.heads, r.score, describe(s, t, v), p,
                               s.tokens[p], r.neurons, top), save, force)
    if as_json:
        emit(s, "dla", r.values, {"target": target, "vs": vs, "position": position,
                                  "neurons": neurons},
             labels=r.labels, heads=r.heads, score=r.score, total=r.total, position=p,
             target=token_doc(s, t), vs=token_doc(s, v), top_neurons=r.neurons)
        return
    stdout().print(view.dla_view(r.labels, r.values, r.heads, r.score, describe(s, t, v), p,
                                 s.tokens[p], r.neurons, top))


# ------------------------------------------------------------------ ablation


def mean_values(s: Session, data: Path | None, as_json: bool) -> dict[str, np.ndarray]:
    """Means over the validation text of `data`, or the ones stored beside the weights."""
    from ..analysis import means as mean_stats
    from ..files import sha256

    weights_sha = sha256(s.model.weights_file)
    if data is None:
        return mean_stats.load_means(s.model.folder / mean_stats.FILE, s.config, weights_sha)[0]
    return compute_means(s.model, data, weights_sha, as_json)[0]


def compute_means(model, data: Path, weights_sha: str, quiet: bool):
    """The means over the validation file of `data`, cached by the weights' and data's sha256."""
    from .. import cache
    from ..analysis import means as mean_stats
    from ..files import sha256
    from ..train.data import encode_stories, eval_windows, read_stories, split_data

    if data.is_file():
        val = [data]  # the reference text itself
    else:
        try:
            _, val = split_data([data])
        except ValueError as e:
            raise InputError(str(e)) from None
        if not val:
            raise InputError(f"{data} holds a single text file: give that file itself, or a "
                             "folder whose last part-*.txt is the validation text")
    meta = {"weights_sha256": weights_sha, "data": val[0].name, "data_sha256": sha256(val[0])}
    entry = cache.entry("means", cache.key_of(weights_sha, meta["data_sha256"]), ".safetensors")
    if entry.is_file():
        try:
            return mean_stats.load_means(entry, model.config, weights_sha)
        except (InputError, WeightsError):
            pass  # a damaged cache entry is computed again, and replaced
    stream = encode_stories(read_stories(val), model.tokenizer)
    windows, _ = eval_windows(stream.ids, model.config.n_positions)
    values = {}
    with progress(None, f"averaging over {escape_line(val[0].name)}", enabled=not quiet):
        values = mean_stats.value_means(model.params, model.config, windows)
    meta["tokens"] = str(windows.size)
    mean_stats.save_means(entry, values, meta)
    return values, meta


@app.command()
def ablate(
    text: str = TEXT, weights: Path = WEIGHTS, target: str = TARGET, position: int = POSITION,
    layer: int = typer.Option(None, "--layer", "-l", help="The block of the component.",
                              show_default=False),
    head: int = typer.Option(None, "--head", help="Take out this head's output.",
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
    top: int = typer.Option(5, "--top", "-k", min=1, help="How many top tokens to show."),
    as_json: bool = JSON, save: Path = SAVE, force: bool = FORCE, quiet: bool = QUIET,
):
    """Ablation: take out a head or an MLP; the change in log p(target) and the KL divergence.

    Example: tinygpt ablate "Lily wanted to play with her" --layer 2 --head 1 --mode mean
    Example: tinygpt ablate "Lily wanted to play with her" --all
    Example: tinygpt ablate "Lily wanted to play" --all --mode resample --from "Tom wanted to play"
    """
    import numpy as np

    from ..analysis import ablate as ablation
    from ..render import explain as view

    s = open_session(weights, text)
    p = s.position(position)
    components = check_components(s, layer, head, mlp, every)
    edit = replacements(s, components, mode, source, data, as_json)
    before_logits = s.run()[p]
    t, _ = scored(s, before_logits, target, None)
    groups = [[c] for c in components]
    before, found = ablation.ablate(s.params, s.config, s.ids, groups, edit, p, t)
    tok = s.model.tokenizer.token_str
    options = {"target": target, "position": position, "layer": layer, "head": head,
               "mlp": mlp, "all": every, "mode": mode, "from": source,
               "data": str(data) if data else None}
    rows = [{"component": e.paths[0], "label": ablation.component_label(e.paths[0]),
             "delta": e.delta, "kl": e.kl, "logp_before": e.logp_before,
             "logp_after": e.logp_after,
             "top_after": [{"id": i, "token": tok(i), "prob": q}
                           for i, q in ablation.top_tokens(e.logits, top)]} for e in found]
    if every:
        rows.sort(key=lambda r: -abs(r["delta"]))
    top_before = [{"id": i, "token": tok(i), "prob": q}
                  for i, q in ablation.top_tokens(before, top)]
    if save is not None:
        from ..render import analysis_pictures as pics

        r = rows[0]
        save_figure(pics.ablate_all_figure(rows, s.config.n_layer, s.config.n_head, mode,
                                           (t, tok(t)), p, r["logp_before"]) if every else
                    pics.ablate_figure(r["label"], mode, (t, tok(t)), p, r["logp_before"],
                                       r["logp_after"], r["kl"], top_before, r["top_after"]),
                    save, force)
    if as_json:
        emit(s, "ablate", np.array([[r["delta"], r["kl"]] for r in rows]), options,
             columns=["delta_logp", "kl"], position=p, target=token_doc(s, t),
             top_before=top_before, components=rows)
        return
    if every:
        stdout().print(view.ablate_all_view(
            [r | {"top": r["top_after"][0]["token"], "top_prob": r["top_after"][0]["prob"]}
             for r in rows], mode, (t, tok(t)), p, rows[0]["logp_before"]))
        return
    r = rows[0]
    stdout().print(view.ablate_view(
        r["label"], mode, (t, tok(t)), p, r["logp_before"], r["logp_after"], r["kl"],
        [(d["token"], d["prob"]) for d in top_before],
        [(d["token"], d["prob"]) for d in r["top_after"]]))


def check_components(s: Session, layer, head, mlp: bool, every: bool) -> list[str]:
    from ..analysis import ablate as ablation

    if every:
        if layer is not None or head is not None or mlp:
            raise InputError("--all takes out every component in turn: give it without "
                             "--layer, --head or --mlp")
        return ablation.all_components(s.config)
    if layer is None:
        raise InputError("say what to take out: --layer L with --head H or --mlp, or --all")
    if (head is None) == (not mlp):
        raise InputError("give exactly one of --head H or --mlp with --layer")
    i = s.layer(layer)
    return [ablation.mlp_path(i) if mlp else ablation.head_path(i, s.head(head))]


def replacements(s: Session, components: list[str], mode: str, source: str | None,
                 data: Path | None, quiet: bool) -> dict:
    from ..analysis import ablate as ablation
    from ..session import Session

    if mode not in ablation.MODES:
        raise InputError(f"unknown --mode {mode!r}: use zero, mean or resample")
    if (source is not None) != (mode == "resample"):
        raise InputError("--from TEXT goes with --mode resample (and resample needs it)")
    if data is not None and mode != "mean":
        raise InputError("--data DIR goes with --mode mean")
    means = mean_values(s, data, quiet) if mode == "mean" else None
    values = None
    if mode == "resample":
        other = Session.open(source, model=s.model)
        if other.T < s.T:
            raise InputError(f"the --from text is {other.T} tokens long and the text "
                             f"{s.T}: resampling needs a value at every position, so give a "
                             "--from text at least as long")
        values = ablation.source_values(s.params, s.config, other.ids)
    return {c: ablation.replacement(mode, c, means=means, source=values) for c in components}


@app.command()
def means(
    data: Path = typer.Option(..., "--data", help="A folder of part-*.txt files, whose last "
                              "one (the validation text) is averaged over, or one text file."),
    weights: Path = WEIGHTS,
    out: Path = typer.Option(None, "--out", help="Where to write (default: means.safetensors "
                             "in the weights folder).", show_default=False),
    as_json: bool = JSON,
):
    """Store each head's and MLP's mean output over the validation text, for --mode mean.

    One vector per head output, attn_out and mlp_out, averaged over every position of every
    128-token window of the last part-*.txt; float32, written atomically with the sha256 of
    the weights it belongs to. Re-run it whenever the weights change.

    \b
    Example: tinygpt means --data ../shared/data/tinystories
    """
    from ..analysis import means as mean_stats
    from ..files import sha256
    from ..render import jsonout

    if out is not None and out.is_dir():  # checked before the work ('' is '.', a folder)
        raise InputError(f"--out {escape_line(str(out))!r} is a folder: give the file to "
                         "write, e.g. --out means.safetensors")
    model = load(weights)
    values, meta = compute_means(model, data, sha256(model.weights_file), as_json)
    target = out if out is not None else model.folder / mean_stats.FILE
    mean_stats.save_means(target, values, meta)
    if as_json:
        jsonout.emit({"path": str(target), **meta, "values": sorted(values)})
        return
    stdout().print(f"wrote {escape_line(str(target))}: {len(values)} mean vectors over "
                   f"{meta['tokens']} tokens of {escape_line(meta['data'])}")


# ------------------------------------------------------------------ activation patching


@app.command()
def patch(
    clean: str = typer.Argument(..., metavar="CLEAN", help="The text whose values are copied "
                                "in.", show_default=False),
    corrupt: str = typer.Argument(..., metavar="CORRUPT", help="The text they are copied "
                                  "into (same number of tokens).", show_default=False),
    weights: Path = WEIGHTS, target: str = TARGET, vs: str = VS, position: int = POSITION,
    method: str = typer.Option("activation", "--method", help="activation (run every patch) or "
                               "atp (attribution patching: one backward pass)."),
    as_json: bool = JSON, save: Path = SAVE, force: bool = FORCE, quiet: bool = QUIET,
):
    """Activation patching: how much of the clean prediction each clean value restores.

    For every block and position, resid_pre, resid_mid, resid_post, attn_out and mlp_out are
    copied from the clean run into the corrupt one, then each head's output at every position;
    each cell is (patched − corrupt) / (clean − corrupt) of logit[target] − logit[vs] (default:
    the clean run's top guess against the corrupt run's). --method atp estimates every cell
    from one backward pass and prints its correlation with the real patching.

    Example: tinygpt patch "Lily wanted to play with her" "Lily wanted to read with her"
    Example: tinygpt patch "Lily wanted to play" "Lily wanted to read" --method atp
    """
    import numpy as np

    from ..analysis import patch as patching
    from ..render import explain as view

    if method not in ("activation", "atp"):
        raise InputError(f"unknown --method {method!r}: use activation or atp")
    s = open_session(weights, clean)
    c = open_session(None, corrupt, model=s.model)
    if c.T != s.T:
        raise InputError(f"the clean text is {s.T} tokens and the corrupt text {c.T}: "
                         "patching copies values position by position, so they must have the "
                         "same number of tokens")
    p = s.position(position)
    t, _ = scored(s, s.run()[p], target, None)
    v = s.token_id(vs) if vs is not None else int(np.argmax(c.run()[p]))
    if v == t:
        raise InputError(f"the target and --vs are the same token "
                         f"({s.model.tokenizer.token_str(t)!r}): give --target and --vs that "
                         "differ")
    runs = patching.patch_count(s.config, p)
    with progress(runs, f"patching ({runs} runs)", enabled=not as_json and runs > 500) as step:
        real = patching.activation_patching(s.params, s.config, s.ids, c.ids, t, v, p, step)
    result, corr = real, None
    if method == "atp":
        result = patching.attribution_patching(s.params, s.config, s.ids, c.ids, t, v, p)
        corr = patching.correlation(result, real)
    what = describe(s, t, v)
    if save is not None:
        from ..render.analysis_pictures import patch_figure

        save_figure(patch_figure(result.stream, result.heads, s.tokens, p, result.clean,
                                 result.corrupt, what, method, corr), save, force)
    if as_json:
        emit(s, "patch", np.stack([result.stream[k] for k in patching.STREAM]),
             {"target": target, "vs": vs, "position": position, "method": method},
             kinds=list(patching.STREAM), axes=["kind", "layer", "position"], heads=result.heads,
             clean=result.clean, corrupt=result.corrupt, position=p, target=token_doc(s, t),
             vs=token_doc(s, v), corrupt_ids=c.ids, corrupt_tokens=c.tokens,
             correlation=corr)
        return
    out = view.patch_view(result.stream, result.heads, s.tokens, p, result.clean,
                          result.corrupt, what, method, corr)
    # the grids flow onto as many lines as the width needs: room for one is enough
    console(LABEL + 7 * max(s.config.n_layer, s.config.n_head) + 8).print(out)


# ------------------------------------------------------------------ input attribution


@app.command()
def attribute(
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
    """
    import numpy as np

    from ..analysis import attribute as attribution
    from ..render import explain as view
    from ..session import Session

    if method not in attribution.METHODS:
        raise InputError(f"unknown --method {method!r}: use {', '.join(attribution.METHODS)}")
    if baseline is not None and method != "integrated-gradients":
        raise InputError("--baseline goes with --method integrated-gradients")
    s = open_session(weights, text)
    p = s.position(position)
    t, v = scored(s, s.run()[p], target, vs)
    args = (s.params, s.config, s.ids, p, t, v)
    if method == "integrated-gradients":
        base = None
        if baseline is not None:
            b = Session.open(baseline, model=s.model)
            if b.T != s.T:
                raise InputError(f"the --baseline text is {b.T} tokens and the text {s.T}: "
                                 "integrated gradients need the same number of tokens")
            base = s.params["wte.weight"][np.asarray(b.ids)]
        r = attribution.integrated_gradients(*args, steps=steps, baseline=base)
    else:
        r = {"grad": attribution.grad, "grad-x-input": attribution.grad_x_input,
             "attention-x-grad": attribution.attention_x_grad}[method](*args)
    complete = None if r.gap is None else (float(r.scores.sum()), r.f - r.f_baseline, r.gap)
    if as_json:
        extra = {"axes": ["layer", "head", "position"]} if r.scores.ndim == 3 else {}
        emit(s, f"attribute.{method}", r.scores,
             {"target": target, "vs": vs, "position": position, "method": method,
              "steps": steps if method == "integrated-gradients" else None,
              "baseline": baseline}, position=p, target=token_doc(s, t), vs=token_doc(s, v),
             f=r.f, grad_norm=r.grad_norm, f_baseline=r.f_baseline,
             completeness_gap=r.gap, **extra)
        return
    out = view.attribute_view(method, r.scores, s.tokens, describe(s, t, v), r.f, p,
                              r.grad_norm, complete)
    # attention-x-grad: one grid per layer, side by side as the width allows; never narrower
    # than one whole grid, whose heads would otherwise fall off the edge unmarked
    grid = view.grid_width(s.tokens, s.config.n_head) if r.scores.ndim == 3 else 0
    console(grid).print(out)
