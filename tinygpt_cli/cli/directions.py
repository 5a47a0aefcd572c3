"""Commands that learn directions in the residual stream: steer (a mean-difference steering
vector, judged on held-out pairs) and probe (a logistic regression beside a control task)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from .app import app
from .common import (
    JSON,
    LAYER,
    SEED,
    TOP,
    WEIGHTS,
    InputError,
    check_index,
    check_out,
    load,
    present,
    stderr,
    steered,
)
from .steering import steerable

if TYPE_CHECKING:
    from .context import RunContext

OUT = typer.Option(None, "--out", metavar="FILE", show_default=False,
                   help="Save the direction to FILE (safetensors; --steer-vector reads it).")
HELD_OUT = typer.Option(0.25, "--held-out", min=0.0, max=1.0,
                        help="The share of pairs (steer) or lines (probe) kept out of the fit "
                        "to test on.")
FORCE_OUT = typer.Option(False, "--force", help="Let --out overwrite an existing file.")
DATA = typer.Option(None, "--data", metavar="DIR", show_default=False,
                    help="Folder holding part-005.txt, the held-out stories (default: the "
                    "project's data, or $TINYGPT_DATA).")


@app.command()
@steerable
def steer(
    context: RunContext,
    pos: Path = typer.Option(..., "--pos", metavar="FILE", help="Texts to steer toward: one "
                             "a line, or JSON lines (a string or {\"text\": ...})."),
    neg: Path = typer.Option(..., "--neg", metavar="FILE", help="Texts to steer away from; "
                             "line i pairs with line i of --pos."),
    layer: int = LAYER, scale: float = typer.Option(4.0, "--scale", help="The largest scale "
                                                    "tried, and the one the loss is "
                                                    "measured at."),
    held_out: float = HELD_OUT, seed: int = SEED, data: Path = DATA,
    stories: int = typer.Option(64, "--stories", min=0, help="How many held-out stories "
                                "the loss is measured on (0: none)."),
    out: Path = OUT, force: bool = FORCE_OUT, top: int = TOP, weights: Path = WEIGHTS,
    as_json: bool = JSON,
):
    """Build a steering vector from pairs of texts and test it on held-out pairs.

    v is the mean over the training pairs of mean resid_pre[L](pos) - mean resid_pre[L](neg).
    Each held-out pair is a prompt (the tokens both texts share) with a target (the pos
    text's next token) and a token it is scored against (the neg text's): steerability is
    the slope of logit[target] - logit[vs] against the scale, and a negative slope is a prompt
    steered the wrong way. The loss on part-005 is measured unsteered and at --scale.
    --steer ...: every run (values, prompts, loss) steered first, v measured on top of it.

    Example: tinygpt steer --pos examples/happy.txt --neg examples/sad.txt --out h.safetensors
    Example: tinygpt steer --pos examples/happy.txt --neg examples/sad.txt -l 3 --scale 2 --json

    Then steer any command with it: tinygpt generate TEXT --steer-vector happy.safetensors
    """
    from ..analysis import steer as st
    from ..jobs.corpus import held_out_stories
    from ..jobs.dictionaries.directions import direction_file
    from ..jobs.session import encode_lines
    from ..jobs.steer import read_pairs
    from ..render.directions import steer_view
    from ..render.documents import steer_document
    from ..storage.files import write_atomically
    from ..storage.madefor import made_for

    check_out(out, force)
    if not 0 < scale < float("inf"):  # also refuses NaN
        raise InputError(f"--scale must be a number above 0, got {scale!r}")
    pos_texts, neg_texts = read_pairs(pos, neg)
    model = load(context, weights)
    layer = check_index(layer, model.config.n_layer, "layer")
    hooks, changes = steered(context, model)
    r = st.steer_report(model.params, model.config, encode_lines(model, pos_texts, "--pos"),
                        encode_lines(model, neg_texts, "--neg"), layer=layer, scale=scale,
                        held_out=held_out, seed=seed, hooks=hooks,
                        loss_texts=held_out_stories(model.tokenizer, model.config.n_positions,
                                                    data, stories) if stories else [])
    if out is not None:
        source = {"pos": str(pos), "neg": str(neg), "seed": seed, "held_out": held_out,
                  "train_pairs": r.train_pairs}
        write_atomically(out, direction_file(r.vector, st.site(layer), "steer", source,
                                             meta={**made_for(model.weights_file), **changes}))
    present(context, as_json, lambda: {**steer_document(r, model.tokenizer), **changes},
            lambda: steer_view(r, model.tokenizer, top=top))
    if out is not None and not as_json:
        stderr().print(f"saved the vector to {out}", style="dim")


@app.command()
@steerable
def probe(
    context: RunContext,
    site: str = typer.Option(..., "--site", metavar="PATH", help="The value probed, one row "
                             "per token: layers.1.resid_post, layers.0.mlp_out, ..."),
    labels: Path = typer.Option(..., "--labels", metavar="FILE", help="Texts with [label] "
                                "marks after tokens, or JSON lines {\"text\", \"labels\"}."),
    default: str = typer.Option(None, "--default", metavar="LABEL", show_default=False,
                                help="The label of unmarked tokens (default: leave them out)."),
    held_out: float = HELD_OUT, seed: int = SEED,
    l2: float = typer.Option(1e-3, "--l2", min=0.0, help="The weights' L2 penalty."),
    out: Path = OUT, force: bool = FORCE_OUT, weights: Path = WEIGHTS, as_json: bool = JSON,
):
    """Fit a logistic-regression probe per token, beside a control task.

    The lines are split into fit and held-out (never a line on both sides). The control task
    gives each token type one random label (Hewitt and Liang 2019); selectivity = held-out
    accuracy - the control's held-out accuracy. Labels file: one text a line with [label]
    right after a token (Tom[name] ran), or JSON lines {"text": ..., "labels": [one a token]}.
    Steered (--steer ...): the values probed are the steered run's; --out's metadata says so.

    Example: tinygpt probe --site layers.1.resid_post --labels examples/quotes.txt --default out
    Example: tinygpt probe --site layers.2.resid_pre --labels tags.jsonl --out tag.safetensors
    """
    from ..analysis import probe as pr
    from ..jobs.corpus import read_user_file
    from ..jobs.dictionaries.directions import direction_file
    from ..jobs.probe import probe_inputs
    from ..render.directions import probe_view
    from ..render.documents import probe_document
    from ..storage.files import write_atomically
    from ..storage.madefor import made_for

    check_out(out, force)
    lines = pr.parse_labels(read_user_file(labels, "--labels"))
    model = load(context, weights)
    name = pr.check_site(site, model.config, model.params)
    hooks, changes = steered(context, model)
    ids, marks, feats = probe_inputs(model, lines, name, default, hooks)
    r = pr.probe_report(feats, marks, ids, name, held_out=held_out, seed=seed, l2=l2)
    if out is not None:
        source = {"labels": str(labels), "classes": r.classes, "seed": seed, "l2": l2}
        write_atomically(out, direction_file(r.direction, name, "probe", source, rows=r.W,
                                             meta={**made_for(model.weights_file), **changes}))
    present(context, as_json, lambda: {**probe_document(r), **changes},
            lambda: probe_view(r))
    if out is not None and not as_json:
        stderr().print(f"saved the probe's direction to {out}", style="dim")
