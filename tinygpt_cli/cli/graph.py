"""Transcoders (`tinygpt transcoder train|eval`) and the attribution graph of a prediction
(`tinygpt graph TEXT`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import typer

from ..errors import InputError
from ..escapes import escape_line
from ..render.output import picture_format, refuse_inside_package, save_page
from ..render.text import examples_block, show_token
from .app import app
from .common import (
    FORCE,
    FORCE_FILE,
    JSON,
    POSITION,
    QUIET,
    SAVE,
    TARGET,
    TEXT,
    TOP,
    TRAINING_SEED,
    TRAINING_TEXT,
    VS,
    WEIGHTS,
    bar,
    check_index,
    check_save,
    encode_text,
    load,
    present,
    steered,
)
from .process import small_pages
from .steering import keep_default_file, steerable

if TYPE_CHECKING:
    from .context import RunContext


def _transcoder() -> None:
    """Transcoders: one sparse dictionary per block's MLP, from ln2.out to mlp_out.

    Example: tinygpt transcoder train
    Example: tinygpt transcoder eval --json
    """


transcoder_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None)
transcoder_app.callback(help=examples_block(_transcoder.__doc__))(_transcoder)
app.add_typer(transcoder_app, name="transcoder")

TRANSCODERS = typer.Option(None, "--transcoders", metavar="DIR", show_default=False,
                           help="The folder of transcoders, layers.L.safetensors (default: the "
                           "weights folder's transcoders/).")


@transcoder_app.command("train")
@steerable  # on the steered run's values: --steer needs --transcoders DIR
def transcoder_train(
    context: RunContext,
    weights: Path = WEIGHTS,
    data: Path = TRAINING_TEXT,
    out: Path = TRANSCODERS,
    latents: int = typer.Option(1024, "--latents", min=1, help="Latents per block."),
    k: int = typer.Option(32, "--k", min=1, help="Latents active per token (TopK's k)."),
    steps: int = typer.Option(4000, "--steps", min=1, help="Adam steps per block."),
    batch: int = typer.Option(1024, "--batch", min=1, help="Tokens per step."),
    lr: float = typer.Option(2e-3, "--lr", min=0.0, help="Adam's learning rate."),
    windows: int = typer.Option(800, "--windows", min=1, help="Windows of training text "
                                "whose values are the training set."),
    seed: int = TRAINING_SEED,
    force: bool = FORCE_FILE,
    as_json: bool = JSON,
):
    """Train one TopK transcoder per block, from its MLP's input to its output.

    z = TopK(ReLU((x - b_in) W_enc + b_enc)) of the block's ln2.out, y_hat = z W_dec + b_dec
    predicting its mlp_out. Adam on the squared error plus the AuxK loss (the SAE's trainer).
    TopK, not JumpReLU: k fixes L0 exactly and there is no threshold to learn. Resumable:
    each block's checkpoint DIR/layers.L.safetensors.checkpoint.npz is written every 100
    steps and picked up by the same command; a block whose file exists is kept unless --force.

    Example: tinygpt transcoder train
    Example: tinygpt transcoder train --transcoders mine --latents 2048 --k 16
    """
    from ..analysis import transcoder as T
    from ..jobs import transcoder as tcj
    from ..jobs.corpus import data_windows, training_files
    from ..jobs.dictionaries import transcoders as tcf
    from ..storage.files import sha256

    keep_default_file(context, out, "the weights folder's transcoders/", "--transcoders")
    model = load(context, weights)
    folder = Path(out) if out is not None else tcf.folder_of(model.weights_file)  # made here
    if out is None:
        refuse_inside_package(folder, "--transcoders")
    hooks, changes = steered(context, model)
    if k > latents:
        raise InputError(f"--k {k} is more than the {latents} latents")
    todo = [i for i in range(model.config.n_layer)
            if force or not tcf.file_of(folder, i).exists()]
    if folder.exists() and not folder.is_dir():
        raise InputError(f"--transcoders {escape_line(str(folder))}: that is a file; give a "
                         "folder (it is made when it is not there)")
    x_in, _ = data_windows(training_files(data), model.tokenizer, model.config.n_positions,
                           windows)
    with bar()(len(x_in), "the MLPs' inputs and outputs") as advance:
        values = T.mlp_values(model.params, model.config, x_in, progress=advance, hooks=hooks)
    settings = {"latents": latents, "k": k, "steps": steps, "batch": batch, "lr": lr,
                "windows": windows, "seed": seed}
    trained = []
    for i in todo:
        state = tcj.train_layer(*values[i], tcf.file_of(folder, i), i, settings,
                              sha256(model.weights_file), bar(), changes)
        trained.append({"layer": i, "path": str(tcf.file_of(folder, i)), "steps": state.step,
                        "final_loss": sum(state.losses[-50:]) / len(state.losses[-50:])})
    doc = {"folder": str(folder), "latents": latents, "k": k, "tokens": len(values[0][0]),
           "trained": trained, **changes}
    present(context, as_json, lambda: doc, lambda: _trained_view(doc))


def _trained_view(doc: dict):
    from rich.text import Text

    lines = [f"transcoders in {escape_line(doc['folder'])}: {doc['latents']} latents, "
             f"k = {doc['k']}, over {doc['tokens']:,} tokens"]
    lines += [f"  block {t['layer']}: {t['steps']} steps, final loss {t['final_loss']:.4f} "
              "(squared error / the data's variance)" for t in doc["trained"]]
    if not doc["trained"]:
        lines.append("  every block's file exists already (--force trains them again)")
    return Text("\n".join(lines))


@transcoder_app.command("eval")
@steerable  # every run the steered one; the transcoders replace its MLPs
def transcoder_eval(context: RunContext, weights: Path = WEIGHTS,
                    transcoders: Path = TRANSCODERS,
                    data: Path = typer.Option(None, "--data", help="Held-out stories: a file, "
                                              "or a folder whose last part is read (default: "
                                              "the project's part-005.txt).",
                                              show_default=False),
                    windows: int = typer.Option(64, "--windows", min=1, help="Windows of the "
                                                "held-out text to evaluate on."),
                    as_json: bool = JSON):
    """Evaluate the transcoders on held-out text: L0, variance explained, loss recovered, dead.

    loss_recovered = (L_mean - L_replaced) / (L_mean - L_clean): L_replaced with every MLP
    replaced by its transcoder at once, L_mean with every MLP's output at its mean over the
    same tokens. variance_explained: of each block's mlp_out, from the real run's ln2.out.

    Example: tinygpt transcoder eval
    Example: tinygpt transcoder eval --data story.txt --json
    """
    from ..jobs import transcoder as tcj
    from ..jobs.dictionaries import transcoders as tcf
    from ..render import graph as view

    model = load(context, weights)
    found = tcf.load_transcoders(tcf.folder_of(model.weights_file, transcoders), model.config,
                               model.weights_file)
    hooks, changes = steered(context, model)
    with bar()(4, "evaluating") as advance:
        result, names = tcj.evaluate_held_out(model, found, data, windows, advance, hooks)
    present(context, as_json, lambda: {**view.eval_doc(result, names), **changes},
            lambda: view.eval_view(result, names))


# ------------------------------------------------------------------ the attribution graph


NODE_THRESHOLD = typer.Option(0.8, "--node-threshold", min=0.0, max=1.0, help="Keep the "
                              "features carrying this share of the influence on the target.")
EDGE_THRESHOLD = typer.Option(0.98, "--edge-threshold", min=0.0, max=1.0, help="Then keep the "
                              "edges carrying this share of what flows among the kept nodes.")
LOGITS = typer.Option(5, "--logits", min=1, help="Logit nodes: the top tokens at the position "
                      "(and the target).")
MAX_FEATURES = typer.Option(4096, "--max-features", min=1, help="Compute the incoming edges of "
                            "at most this many features, those of most influence first (time "
                            "and memory then grow linearly with the text).")
FORMAT = typer.Option("tinygpt", "--format", metavar="tinygpt|circuit-tracer",
                      help="circuit-tracer: print the graph as the JSON that circuit-tracer's "
                      "and Neuronpedia's viewers read (their node ids; logits minus the "
                      "vocabulary's mean).")
OPEN = typer.Option(None, "--open", metavar="FILE", show_default=False, help="Read a graph in "
                    "circuit-tracer's JSON made elsewhere for this model and transcoders, and "
                    "check its edges against the graph computed here (--save x.html: show it "
                    "in the viewer).")
TOLERANCE = typer.Option(1e-3, "--tolerance", min=0.0, help="--open: an edge agrees within "
                         "this share of the largest edge into its target.")


@app.command()
@steerable  # the real run steered: its vector a constant of the frozen model (the bias node)
def graph(context: RunContext, text: str = TEXT, weights: Path = WEIGHTS,
          transcoders: Path = TRANSCODERS, target: str = TARGET, vs: str = VS,
          position: int = POSITION, node_threshold: float = NODE_THRESHOLD,
          edge_threshold: float = EDGE_THRESHOLD, logits: int = LOGITS,
          max_features: int = MAX_FEATURES,
          data: Path = typer.Option(None, "--data", show_default=False, help="Stories searched "
                                    "for each feature's top windows and label (default: the "
                                    "project's training parts; cached)."),
          windows: int = typer.Option(100, "--windows", min=1, help="Windows of --data "
                                      "searched for the features' top windows."),
          ablate: list[str] = typer.Option(None, "--ablate", metavar="FEATURE",
                                           show_default=False, help="Set this feature "
                                           "(LAYER_FEATURE_POSITION, as the JSON names it) "
                                           "to 0; print the graph's and the real change of "
                                           "the target logit (repeatable)."),
          set_to: list[str] = typer.Option(None, "--set", metavar="FEATURE=VALUE",
                                           show_default=False, help="Set this feature to "
                                           "VALUE instead (repeatable; --steer is the "
                                           "residual-stream steering of every command)."),
          group: bool = typer.Option(False, "--group", help="Also merge the kept features "
                                     "into supernodes (by attribution profile and top "
                                     "windows, per position) and say what they keep."),
          qk: bool = typer.Option(False, "--qk", help="Split the attention score behind each "
                                  "kept edge between positions into its query-side and "
                                  "key-side terms (features, errors, embeddings; the JSON's "
                                  "edges' qk, the viewer's hover); norms and rotary as in "
                                  "qk --help."),
          fmt: str = FORMAT, open_file: Path = OPEN, tolerance: float = TOLERANCE,
          top: int = TOP, as_json: bool = JSON, save: Path = SAVE, force: bool = FORCE,
          quiet: bool = QUIET):
    """Attribution graph: the transcoder features, tokens and errors behind a prediction.

    Every MLP is replaced by its transcoder plus an error node, every attention pattern and
    norm scale frozen at the real run: the model is then linear, and an edge's weight is the
    source's activation times the derivative of the target's pre-activation along the
    source's decoder vector. Each node's value (and the target logit) is exactly the sum of
    its incoming edges, biases a node of their own. Pruned by influence on the target
    (circuit-tracer's rule); explained: the share of that influence the pruned graph still
    traces to the tokens and biases rather than to error nodes or cut edges. Past
    --max-features active features, only the most influential ones' inputs are computed
    (circuit-tracer's order); the others stay nodes, their edges out exact, their inputs not.

    Example: tinygpt graph "Lily wanted to play with her"
    Example: tinygpt graph "Lily wanted to play with her" --target " ball" --vs " mom" --json
    Example: tinygpt graph "Lily wanted to play with her" --save graph.html
    Example: tinygpt graph "Lily wanted to play with her" --format circuit-tracer > g.json
    Example: tinygpt graph --open g.json --save g.html
    """
    from ..analysis import graph as G
    from ..jobs.dictionaries import transcoders as tcf
    from ..jobs.session import token_id
    from ..render import graph as view

    check_save(save, force)
    _check_modes(fmt, open_file, text, save, {"--ablate": ablate, "--set": set_to,
                                              "--group": group, "--qk": qk, "--vs": vs,
                                              "--target": target})
    model = load(context, weights)
    small_pages(context)  # the console script's process: 4 kB pages for every graph below
    if open_file is not None:
        return _open(context, model, open_file, transcoders, (tolerance, max_features), save,
                     as_json)
    if fmt == "circuit-tracer":
        return _field(context, model, text, transcoders, target, vs, position, logits,
                      (node_threshold, edge_threshold), max_features, (data, windows))
    ids = encode_text(context, model, text)
    position = check_index(position, len(ids), "position")
    folder = tcf.folder_of(model.weights_file, transcoders)
    found = tcf.load_transcoders(folder, model.config, model.weights_file)
    want, other = (None if t is None else token_id(model, t) for t in (target, vs))
    hooks, changes = steered(context, model)
    options = {"target": target, "vs": vs, "position": position, "logits": logits,
               "node_threshold": node_threshold, "edge_threshold": edge_threshold,
               "max_features": max_features}
    g = G.prune(G.build(model.params, model.config, ids[:position + 1], found, target=want,
                        vs=other, n_logits=logits, steering=hooks,
                        max_features=max_features), node_threshold, edge_threshold)
    examples = _examples(model, found, folder, g, data, windows, as_json)
    doc = {**view.graph_doc(g, model.tokenizer, examples, options=options,
                            qk=_qk(model, g, found, hooks) if qk else None), **changes}
    if group:
        doc["supernodes"], doc["grouped"] = _supernodes(g, examples, model.tokenizer)
    if ablate or set_to:
        doc["intervention"] = _intervene(model, ids[:position + 1], found, g, ablate, set_to,
                                         hooks)
    if save is not None:
        from ..render.graph_page import page

        save_page(context, page(doc, model.config.n_layer), save)
    present(context, as_json, lambda: doc, lambda: view.graph_view(doc, top))


def _check_modes(fmt: str, open_file, text, save, extras: dict) -> None:
    """--save is a page; --format circuit-tracer and --open leave out what tinygpt's own
    graph adds: refused by name rather than silently dropped."""
    if save is not None and picture_format(save) != "html":
        raise InputError(f"--save {save}: the graph is an interactive page; give a .html file")
    if fmt not in ("tinygpt", "circuit-tracer"):
        raise InputError(f"--format {escape_line(fmt)!r}: give tinygpt or circuit-tracer")
    if open_file is not None and (text is not None or fmt != "tinygpt"):
        raise InputError("--open FILE reads the text and the graph from the file: give no "
                         "TEXT and no --format")
    mode = "--open" if open_file is not None else "--format circuit-tracer"
    skip = () if open_file is not None else ("--vs", "--target")  # --vs: _field says why
    given = [k for k, v in extras.items() if v and k not in skip]
    if (open_file is not None or fmt != "tinygpt") and given:
        raise InputError(f"{mode} does not take {given[0]}")


def _field(context, model, text, transcoders, target, vs, position, n_logits, thresholds,
           max_features, data) -> None:
    """--format circuit-tracer: the pruned graph of the logit minus the vocabulary's mean, in
    circuit-tracer's graph JSON on stdout."""
    from ..analysis import graph as G
    from ..analysis import graph_file as F
    from ..analysis import transcoder as T
    from ..jobs.dictionaries import transcoders as tcf
    from ..jobs.session import token_id
    from ..render.graph_field import field_doc

    if vs is not None:
        raise InputError("--format circuit-tracer has no --vs: its logit nodes are single "
                         "tokens' logits minus the vocabulary's mean")
    ids = encode_text(context, model, text)
    position = check_index(position, len(ids), "position")
    folder = tcf.folder_of(model.weights_file, transcoders)
    found = tcf.load_transcoders(folder, model.config, model.weights_file)
    want = None if target is None else token_id(model, target)
    hooks, _ = steered(context, model)
    g = G.prune(G.build(model.params, model.config, ids[:position + 1], found, target=want,
                        n_logits=n_logits, steering=hooks, max_features=max_features,
                        demean=True), *thresholds)
    labels = _examples(model, found, folder, g, *data, True)
    shown = model.tokenizer.decode(ids[:position + 1])
    meta = {"slug": F.slug_of(shown), "scan": model.weights_file.parent.name,
            "transcoder_list": [f"{folder.name}/{Path(e.path).name}"
                                for e in T.encoders_of(found)],
            "node_threshold": thresholds[0], "edge_threshold": thresholds[1]}
    doc = field_doc(g, model.tokenizer, shown, meta, F.cumulative_influence(g.influence),
                    F.field_node_ids(g), labels)
    present(context, True, lambda: doc, lambda: None)


def _open(context, model, path: Path, transcoders, limits, save, as_json) -> None:
    """--open FILE: a graph in circuit-tracer's JSON, checked against this model and its
    transcoders, its edges against the graph computed here (the inputs of at most
    --max-features features, those of most influence first, as `graph` computes them)."""
    from ..analysis import graph as G
    from ..analysis import graph_file as F
    from ..analysis import transcoder as T
    from ..jobs.dictionaries import transcoders as tcf
    from ..render import graph_field as view

    if not path.is_file():
        raise InputError(f"--open {escape_line(str(path))}: no such file")
    if steered(context, model)[0] is not None:
        raise InputError("--open re-checks a graph of the model as it is: give no --steer")
    fg = F.read_field_graph(path)
    found = tcf.load_transcoders(tcf.folder_of(model.weights_file, transcoders), model.config,
                               model.weights_file)
    F.check_fits(fg, model.config.n_layer, [tc.n_latents for tc in T.encoders_of(found)],
                 model.config.vocab_size, model.tokenizer.decode, model.config.n_positions)
    logits = F.logit_tokens(fg)
    g = G.build(model.params, model.config, fg.token_ids, found,
                target=F.target_of(fg).latent, n_logits=len(logits), max_features=limits[1],
                demean=True)
    check = F.recheck(fg, g, limits[0])
    if save is not None:
        from ..render.graph_page import page

        save_page(context, page(view.opened_doc(fg, check), model.config.n_layer), save)
    doc = view.recheck_doc(str(path), fg, check)
    present(context, as_json, lambda: doc, lambda: view.recheck_view(doc))


def _qk(model, g, transcoders, steering) -> list:
    """--qk: the split score of every kept edge between positions."""
    from ..analysis import graph_qk

    if not isinstance(transcoders, list):
        raise InputError("--qk splits scores through per-layer transcoders; with a "
                         "cross-layer one it is not computed yet")
    if any(tc.skip is not None for tc in transcoders):
        raise InputError("--qk splits scores into the stream's parts; a transcoder's skip "
                         "connection (_affine) is a part it does not split yet")
    return graph_qk.edge_qk(model.params, model.config, g, transcoders, steering)


def _intervene(model, ids, transcoders, g, ablate, set_to, steering) -> dict:
    """--ablate / --set: the features' new values, and the target's change as the graph
    predicts it and as the real model gives it."""
    from ..analysis import graph as G
    from ..analysis import transcoder as T

    width = [tc.n_latents for tc in T.encoders_of(transcoders)]  # each block's own
    changes = {G.feature_node(g, f, width): 0.0 for f in ablate or []}
    for item in set_to or []:
        name, eq, value = item.partition("=")
        node = G.feature_node(g, name, width)
        try:
            changes[node] = float(value) if eq else float("nan")
        except ValueError:
            raise InputError(f"--set takes FEATURE=VALUE, e.g. 0_314_5=2.5, not "
                             f"{escape_line(item)!r}") from None
        if not np.isfinite(changes[node]):
            raise InputError(f"--set {escape_line(item)}: the value must be a finite number")
    from ..render.graph import node_id

    return {"features": [{"id": node_id(g, n), "from": float(g.activation[n]), "to": v}
                         for n, v in changes.items()],
            "predicted_change": G.predicted_change(g, changes),
            "real_change": G.real_change(model.params, model.config, ids, transcoders, g,
                                         changes, steering)}


def _supernodes(g, examples: dict, tokenizer) -> tuple[list, dict]:
    """--group: the supernodes (members, position, layers, their labels) and the grouped
    graph's explained fraction beside the ungrouped one's, within GROUP_TOLERANCE or not."""
    from ..analysis import graph as G
    from ..render.graph import node_id

    peaks = {}
    for n in range(g.n_features):
        found = examples.get((int(g.layer[n]), int(g.feature[n])))
        if found is not None:
            peaks[n] = {e["ids"][e["peak"]] for e in found["examples"]}
    groups = G.group(g, peaks if peaks else None)
    nodes = [{"id": f"S{i}", "members": [node_id(g, n) for n in members],
              "position": int(g.pos[members[0]]),
              "layers": sorted({int(g.layer[n]) for n in members}),
              "labels": sorted({examples[int(g.layer[n]), int(g.feature[n])]["label"]
                                for n in members if (int(g.layer[n]), int(g.feature[n]))
                                in examples})}
             for i, members in enumerate(groups)]
    grouped = G.grouped_explained(g, groups)
    return nodes, {"explained": grouped, "ungrouped": g.explained,
                   "tolerance": G.GROUP_TOLERANCE,
                   "within_tolerance": abs(grouped - g.explained) <= G.GROUP_TOLERANCE,
                   "method": "average linkage per position on the mean of the attribution "
                             "profiles' cosine and the top-window peak tokens' overlap, "
                             f"merged down to {G.GROUP_SIMILARITY}"}


def _examples(model, transcoders, folder, g, data, windows: int, as_json: bool = False
              ) -> dict:
    """(layer, latent) -> {"examples", "label"} of the pruned graph's features, from their
    top windows of the training text ({} when there is no data to search)."""
    from ..analysis import transcoder as T
    from ..jobs import transcoder as tcj
    from ..jobs.corpus import find_data, given_or, training_files
    from ..render.graph import kept_nodes

    if data is None and find_data() is None:
        return {}
    files = given_or(data, training_files)
    tok = model.tokenizer.token_str
    latents: dict[int, set[int]] = {}  # per block, its features the pruned graph keeps
    for i in kept_nodes(g):
        if g.kinds[i] == "feature":
            latents.setdefault(int(g.layer[i]), set()).add(int(g.feature[i]))
    out = {}
    # a block's codes read once for all of its features, the text once for all the blocks
    codes_of = tcj.blocks_codes(model, transcoders, folder, sorted(latents), files, windows,
                                bar())
    for lay, wanted in sorted(latents.items()):
        for lat, ex in T.top_windows_of(codes_of[lay], sorted(wanted)).items():
            out[lay, lat] = {"examples": ex,
                             "label": T.label_of(ex, lambda t: show_token(tok(t)))}
    return out


for _command in transcoder_app.registered_commands:  # each Example: line on a line of its own
    _command.help = examples_block(_command.callback.__doc__)
