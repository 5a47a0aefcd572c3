"""Commands about how the model came to be: its history over training, and `why`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from .app import app
from .common import (
    FORCE_FILE,
    JSON,
    POSITION,
    QUIET,
    SAVE,
    TEXT,
    TOP,
    WEIGHTS,
    InputError,
    bar,
    check_index,
    encode_checked,
    engine,
    figures,
    open_session,
    present,
    progress,
    progress_report,
    stderr,
)
from .steering import steerable

if TYPE_CHECKING:
    from .context import RunContext

# NumPy and the model are imported inside the commands


@app.command()
@steerable
def history(
    context: RunContext,
    text: str = TEXT,
    path: str = typer.Argument(None, help="A value (layers.0.heads.1.weights, logits[-1]) or a "
                               "parameter (h.0.attn.c_attn.weight) to follow.",
                               show_default=False),
    heads: bool = typer.Option(False, "--heads", help="Previous-token and induction scores of "
                               "every head, per snapshot."),
    position: int = POSITION, weights: Path = WEIGHTS, as_json: bool = JSON,
    save: Path = SAVE, force: bool = FORCE_FILE, quiet: bool = QUIET,
):
    """How the model's answer, a value or its heads changed over training, snapshot by snapshot.

    Reads WEIGHTS/history/step-NNNNNN.safetensors (kept by `train --snapshots`), then the
    final weights. By default: the loss on the text and the likeliest next token. With PATH:
    that value's norm, mean and std (and, for attention grids, the row of --position).

    \b
    Example: tinygpt history "Lily wanted to play with her"
    Example: tinygpt history "Lily wanted to play with her" layers.0.heads.1.weights
    Example: tinygpt history "Lily saw a cat. Lily saw a" --heads
    Example: tinygpt history "Lily wanted to play with her" --save history.svg
    """
    from ..analysis import history as hist
    from ..jobs import history as snapshots_of
    from ..render import documents as docs
    from ..render import history as view

    s = open_session(context, weights, text)
    if path is not None and heads:
        raise InputError("give a PATH or --heads, not both")
    p = check_index(position, s.T, "position")  # out of range is refused, used or not
    snapshots = snapshots_of.find_snapshots(snapshots_of.history_folder(s.model),
                                            s.model.weights_file)
    timeline = snapshots_of.timeline(s.model, snapshots)
    labels, length = [t.label for t in timeline], hist.induction_length(s.config)
    if heads:  # grids and tables fit the terminal
        with progress(len(timeline), "head scores", enabled=not as_json) as advance:
            scores = hist.heads_over_training(timeline, s.config, s.ids, advance, s.hooks)
        rows = hist.snapshot_rows(timeline)
        return present(context, as_json, lambda: docs.heads_history_document(
            s, scores, rows, length), lambda: view.heads_view(scores, labels, length),
            figure=lambda: figures().heads_history_figure(scores, rows, s.tokens, length),
            save=save, force=force)
    if path is not None:
        h = hist.value_over_training(timeline, s.config, s.model.family, s.ids, s.tokens,
                                     path, s.hooks)
        return present(context, as_json, lambda: docs.value_history_document(s, h),
                       lambda: view.value_view(h, labels, s.tokens, p),
                       figure=lambda: figures().value_history_figure(h, s.tokens),
                       save=save, force=force)
    rows = hist.loss_over_training(timeline, s.config, s.ids, s.model.tokenizer.token_str,
                                   s.hooks)
    uniform = hist.uniform_loss(s.config.vocab_size)
    present(context, as_json, lambda: docs.loss_history_document(s, rows),
            lambda: view.loss_view(rows),
            figure=lambda: figures().loss_history_figure(rows, s.tokens, uniform),
            save=save, force=force)


# ------------------------------------------------------------------ why


@app.command()
@steerable
def why(
    context: RunContext,
    text: str = TEXT,
    target: str = typer.Option(None, "--target", help="The next token to explain: its text "
                               "(' ball'), or #ID for an id; default: the likeliest.",
                               show_default=False),
    data: list[Path] = typer.Option(None, "--data", help="The training text: a folder of "
                                    "part-*.txt (the last part, held out, is skipped), or "
                                    "files. Default: the folder WEIGHTS/data.json records.",
                                    show_default=False),
    any_data: bool = typer.Option(False, "--any-data", help="Use --data even where it is not "
                                  "the text WEIGHTS/data.json says the model learned from."),
    exact: bool = typer.Option(False, "--exact", help="Score every training window by TracIn's "
                               "definition instead of the index (minutes: a forward and "
                               "backward pass of every window at every snapshot); the lines of "
                               "--each-line share that pass."),
    check: bool = typer.Option(False, "--check", help="Also score every window exactly and "
                               "say how far the index's ranking agrees: its recall of the exact "
                               "top 10 and top 50, and the rank correlation (minutes)."),
    value: str = typer.Option(None, "--value", metavar="PATH", help="Explain this scalar of "
                              "the text's forward pass instead of the next token, exactly: an "
                              "attention weight layers.L.heads.H.weights[ROW,COL], a head's "
                              "score on the text induction:L1H2 (previous_token:, "
                              "duplicate_token:), or an SAE latent sae.SITE.N[POSITION] (--sae's "
                              "or the weights folder's SAE; default the last position), or an "
                              "edge's exact score from tinygpt circuit edge:SENDER->RECEIVER "
                              "(edge:L0H1->L2H3.q, edge:embed->L1.mlp, edge:L3.mlp->logits; "
                              "with --corrupt, on logit[target] - logit[vs] at the last "
                              "position, vs by default the corrupt text's top guess).",
                              show_default=False),
    corrupt: str = typer.Option(None, "--corrupt", metavar="TEXT", help="With --value edge:..: "
                                "the corrupt text the edge's score patches into (as many "
                                "tokens as the text).", show_default=False),
    vs: str = typer.Option(None, "--vs", help="Explain logit[target] - logit[vs] at the last "
                           "position instead of the target's chance, exactly.",
                           show_default=False),
    top: int = TOP, weights: Path = WEIGHTS, as_json: bool = JSON,
):
    """Where the model learned a prediction: exact matches, and the most influential windows.

    Exact matches: how often the text's last 1 to 8 tokens are followed by the target in the
    training text. Influential windows: every training window ranked by how much its
    gradient raised the target's chance (TracIn over the snapshots in WEIGHTS/history, with
    each snapshot's learning rate), from an index built once per model and text (for the
    shipped model 15 minutes on an idle 2-core machine, 45 on a busy one, on every core;
    Ctrl-C keeps what is done), then the top ones re-scored exactly.

    Example: tinygpt why "Once upon a time, there was a little" --target " girl"
    Example: tinygpt why "Lily wanted to play with her" --exact
    Example: tinygpt why "Lily saw a cat. Lily saw a" --value induction:L1H2
    Example: tinygpt why "Ben saw a dog." --value "edge:L3H3->logits" --corrupt "Ben saw a cat."
    """
    from ..escapes import escape_line
    from ..jobs import why as whys
    from ..jobs.dictionaries.saes import finder
    from ..render import history as view

    t0 = time.perf_counter()
    session = open_session(context, weights, text)
    model = session.model
    found = whys.training_text(model, data, any_data)
    corrupt_ids = _checked_options(model, check, exact, value, vs, corrupt)
    exact = exact or value is not None or vs is not None
    key = ("why", target, value, vs, corrupt, tuple(map(str, found.files)), top,
           tuple(map(str, context.saes)))
    result, more = _kept_answer(context, key, text, model) if exact else (None, [])
    if result is None:
        with engine(context) as where, progress_report("indexing every window's gradient") \
                as report, progress_report(f"scoring the index's shards on "
                                           f"{escape_line(where.name)}", at_once=False) as scored:
            result = whys.answer(model, session.ids, target, found.files, top, report,
                                 hooks=session.hooks, engine=where, query_report=scored,
                                 exact=exact, check=check, more=more, bar=bar(),
                                 value=value, vs=vs, corrupt=corrupt_ids,
                                 saes=finder(model, context.saes))
        _keep_answers(context, key, result)
    if found.note:  # once the answer stands: an error is then the only line
        stderr().print(escape_line(found.note), soft_wrap=True)

    def document():
        from ..render.documents import why_document

        return why_document(session, result, round(time.perf_counter() - t0, 2))

    present(context, as_json, document,
            lambda: view.why_view(result, model.tokenizer.token_str))
    if not as_json:
        stderr().print(f"({time.perf_counter() - t0:.1f} s; {result.index_note()})",
                       style="dim")


def _checked_options(model, check: bool, exact: bool, value: str | None, vs: str | None,
                     corrupt: str | None) -> list[int] | None:
    """why's options that go together, checked; the ids of --corrupt (None without it)."""
    if check and (exact or value or vs):
        raise InputError("--check compares the index with the exact pass: give it alone, "
                         "without --exact, --value or --vs")
    if corrupt is not None and not (value or "").startswith("edge:"):
        raise InputError("--corrupt is the corrupt text of an edge's score: give it with "
                         "--value edge:SENDER->RECEIVER")
    return None if corrupt is None else encode_checked(model, corrupt)


EXACT_LINES = 16  # --each-line --exact: the lines whose queries share one exact pass


def _kept_answer(context: RunContext, key: tuple, text: str, model):
    """Under --each-line: (this line's answer if an earlier line's pass made it, else None;
    the ids of the next lines to share this line's pass). A line that cannot be encoded
    ends the batch: its turn says why."""
    ahead = context.ahead
    if ahead is None or ahead.now < 0:
        return None, []
    kept = ahead.kept.pop((*key, ahead.now, text), None)
    if kept is not None:
        return kept, []
    more = []
    for later in ahead.texts_ahead(EXACT_LINES)[1:]:
        try:
            more.append(encode_checked(model, later))
        except InputError:
            break
    return None, more


def _keep_answers(context: RunContext, key: tuple, result) -> None:
    """The answers of the lines that shared this line's pass, kept for their turns."""
    ahead = context.ahead
    if ahead is None or not result.more:
        return
    texts = ahead.texts_ahead(len(result.more) + 1)[1:]
    for i, (later, answer) in enumerate(zip(texts, result.more, strict=False), 1):
        ahead.kept[(*key, ahead.now + i, later)] = answer
