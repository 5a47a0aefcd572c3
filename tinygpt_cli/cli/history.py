"""Commands about how the model came to be: its history over training, and `why`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from .app import app
from .common import (
    JSON,
    POSITION,
    TEXT,
    TOP,
    WEIGHTS,
    InputError,
    check_index,
    load,
    progress,
    read_text,
    stderr,
    stdout,
)

if TYPE_CHECKING:  # NumPy and the model are imported inside the commands
    from ..analysis import history as hist


def _rows(timeline: list[hist.Snapshot], **columns) -> list[dict]:
    return [{"label": s.label, "step": s.step, "lr": s.lr,
             **{k: v[i] for k, v in columns.items()}} for i, s in enumerate(timeline)]


def _timeline(model) -> list[hist.Snapshot]:
    from ..analysis import history as hist

    return hist.timeline(model, hist.find_snapshots(hist.history_folder(model)))


@app.command()
def history(
    text: str = TEXT,
    path: str = typer.Argument(None, help="A value (layers.0.heads.1.weights, logits[-1]) or a "
                               "parameter (h.0.attn.c_attn.weight) to follow.",
                               show_default=False),
    heads: bool = typer.Option(False, "--heads", help="Previous-token and induction scores of "
                               "every head, per snapshot."),
    position: int = POSITION, weights: Path = WEIGHTS, as_json: bool = JSON,
):
    """How the model's answer, a value or its heads changed over training, snapshot by snapshot.

    Reads WEIGHTS/history/step-NNNNNN.safetensors (kept by `train --snapshots`), then the
    final weights. By default: the loss on the text and the likeliest next token. With PATH:
    that value's norm, mean and std (and, for attention grids, the row of --position).

    \b
    Example: tinygpt history "Lily wanted to play with her"
    Example: tinygpt history "Lily wanted to play with her" layers.0.heads.1.weights
    Example: tinygpt history "Lily saw a cat. Lily saw a" --heads
    """
    import numpy as np
    from rich.console import Group
    from rich.text import Text

    from ..analysis import history as hist
    from ..model import forward
    from ..render import history as view
    from ..render import jsonout
    from ..session import Session

    model = load(weights)
    session = Session.open(read_text(text), model=model)
    if path is not None and heads:
        raise InputError("give a PATH or --heads, not both")
    check_index(position, session.T, "position")  # out of range is refused, used or not
    timeline = _timeline(model)
    labels = [s.label for s in timeline]
    ids = np.asarray(session.ids)
    if heads:
        _history_heads(session, timeline, labels, as_json)
    elif path is not None:
        _history_value(session, timeline, labels, path, position, as_json)
    else:
        logits = [forward(s.params, model.config, ids) for s in timeline]
        losses = [hist.text_loss(z, ids) for z in logits]
        tops = [hist.next_token(z) for z in logits]
        rows = _rows(timeline, loss=losses, top_id=[t[0] for t in tops],
                     top_token=[model.tokenizer.token_str(t[0]) for t in tops],
                     top_prob=[t[1] for t in tops])
        if as_json:
            data = np.asarray([np.nan if v is None else v for v in losses])
            jsonout.emit(jsonout.document("loss", data, session.ids, session.tokens,
                                          snapshots=rows))
            return
        stdout().print(Group(Text("loss on the text (nats per token) and the next token, "
                                  "over training", style="bold"), view.loss_table(rows)))


def _history_value(session, timeline, labels, path, position, as_json):
    import numpy as np
    from rich.console import Group
    from rich.text import Text

    from ..analysis import history as hist
    from ..render import history as view
    from ..render import jsonout
    from ..schema import param_shapes, resolve
    from ..trace import Trace
    from ..weights import PREFIX

    config = session.config
    name = path[len(PREFIX):] if path.startswith(PREFIX) else path
    if name in param_shapes(config):
        values = [s.params[name] for s in timeline]
        shown = name
    else:
        canonical, rows = resolve(path, config)
        shown = canonical + "".join(f"[{i}]" for i in rows)
        values = [Trace(_record(s.params, config, session.ids), config,
                        tokens=session.tokens).get(path) for s in timeline]
    rows = _rows(timeline, **{k: [hist.summary(v)[k] for v in values]
                              for k in ("norm", "mean", "std")})
    grid = shown.endswith("weights") and not name.endswith(".weight")
    if as_json:
        extra = {"weights": np.stack(values)} if grid else {}
        jsonout.emit(jsonout.document(shown, np.asarray([r["norm"] for r in rows]), session.ids,
                                      session.tokens, snapshots=rows, **extra))
        return
    parts = [Text(f"{shown} over training", style="bold"), view.summary_table(rows)]
    if grid:
        p = check_index(position, session.T, "position")
        stack = np.stack(values)  # [S, (H,) T, T]
        cols = view.token_columns(session.tokens[: p + 1])
        for h, grids in enumerate([stack] if stack.ndim == 3 else np.moveaxis(stack, 1, 0)):
            head = "" if stack.ndim == 3 else f" head {h}"
            parts += [Text(f"\nattention of position {p}{head} over training", style="bold"),
                      view.fitted_grid(grids[:, p, : p + 1], labels, cols)]
    stdout().print(Group(*parts))  # the grids give way to the width, behind `…`


def _record(params, config, ids):
    import numpy as np

    from ..hooks import Record
    from ..model import forward

    rec = Record()
    forward(params, config, np.asarray(ids), hooks=rec)
    return rec.values


def _history_heads(session, timeline, labels, as_json):
    import numpy as np
    from rich.console import Group
    from rich.text import Text

    from ..analysis import history as hist
    from ..render import history as view
    from ..render import jsonout

    config = session.config
    with progress(len(timeline), "head scores", enabled=not as_json) as advance:
        scores = []
        for s in timeline:
            scores.append(hist.head_scores(s.params, config, session.ids))
            advance(1)
    prev = np.stack([s["previous_token"] for s in scores])  # [S, L, H]
    induction = np.stack([s["induction"] for s in scores])
    if as_json:
        jsonout.emit(jsonout.document(
            "induction", induction, session.ids, session.tokens, previous_token=prev,
            snapshots=_rows(timeline), induction_length=hist.induction_length(config),
            induction_seed=0, axes=["snapshot", "layer", "head"]))
        return
    stdout().print(Group(
        Text("previous-token score of each head on the text", style="bold"),
        view.head_grids(prev, labels),
        Text(f"\ninduction score of each head on {hist.induction_length(config)} random tokens "
             "repeated", style="bold"),
        view.head_grids(induction, labels)))


# ------------------------------------------------------------------ why


def _training_files(data: Path) -> list[Path]:
    from ..train.data import split_data

    if not data.exists():
        raise InputError(f"training data {data} does not exist: give --data the folder of "
                         "part-*.txt files the model was trained on")
    try:
        files, _ = split_data([data])
    except ValueError as e:
        raise InputError(f"{e}: give --data the folder the model was trained on") from None
    return files


@app.command()
def why(
    text: str = TEXT,
    target: str = typer.Option(None, "--target", help="The next token to explain, as text "
                               "(' ball') or id; default: the model's likeliest.",
                               show_default=False),
    data: Path = typer.Option(..., "--data", help="The training data: a folder of part-*.txt "
                              "(the last part, held out, is skipped), or files."),
    max_windows: int = typer.Option(256, "--max-windows", help="Score at most this many "
                                    "training windows (those holding the text's last token "
                                    "first); 0 scores all."),
    top: int = TOP, weights: Path = WEIGHTS, as_json: bool = JSON,
):
    """Where the model learned a prediction: exact matches, and the most influential windows.

    Exact matches: how often the text's last 1 to 8 tokens are followed by the target in the
    training text. Influential windows: the training windows whose gradients most raised the
    target's chance (TracIn over the snapshots in WEIGHTS/history, with each snapshot's
    learning rate). The training text's index and each window's gradient sketches are
    cached, so a second question is fast.

    Example: tinygpt why "Once upon a time, there was a little" --data ../shared/data/tinystories
    """
    import numpy as np
    from rich.console import Group
    from rich.text import Text

    from ..analysis import history as hist
    from ..analysis import why as whys
    from ..model import forward
    from ..render import history as view
    from ..render import jsonout
    from ..render.text import show_token
    from ..session import Session, token_id

    t0 = time.perf_counter()
    model = load(weights)
    session = Session.open(read_text(text), model=model)
    files = _training_files(data)
    snapshots = hist.find_snapshots(hist.history_folder(model))
    config, ids = model.config, session.ids
    logits = forward(model.params, config, np.asarray(ids))
    target_id = token_id(model, target) if target is not None else hist.next_token(logits)[0]

    def bar(total, what):
        return progress(total, what, enabled=not as_json)

    index = whys.load_index(files, model.tokenizer, model.folder / "tokenizer.json", bar)
    matches = whys.exact_matches(index.stream, index.sa, ids, target_id)
    longest = whys.longest_seen(index.stream, index.sa, ids)
    longest_then = whys.longest_seen(index.stream, index.sa, ids, target_id)

    timeline = [s for s in hist.timeline(model, snapshots) if s.lr is not None]
    if not timeline:
        raise InputError(f"the snapshots in {hist.history_folder(model)} carry no learning rate "
                         "(metadata 'lr'), which TracIn weighs them by; retrain with --snapshots")
    found = whys.influence(index, timeline, config, ids, target_id, max_windows, top, bar)
    tok = model.tokenizer
    for r in found["top_windows"]:
        r["tokens"] = [tok.token_str(i) for i in r["ids"]]
    seconds = time.perf_counter() - t0
    facts = {"target": {"id": target_id, "token": tok.token_str(target_id)},
             "training_tokens": len(index.stream), "longest_context_seen": longest,
             "longest_context_then_target": longest_then, "exact_matches": matches,
             "snapshots": [{"label": s.label, "step": s.step, "lr": s.lr} for s in timeline],
             **found, "seconds": round(seconds, 2)}
    if as_json:
        scores = np.asarray([r["score"] for r in found["top_windows"]])
        jsonout.emit(jsonout.document("scores", scores, ids, session.tokens, **facts))
        return
    note = (f"target {show_token(tok.token_str(target_id))} (id {target_id}); the last "
            f"{longest} tokens of the text occur verbatim in the training text, the last "
            f"{longest_then} followed by the target")
    out = stdout()
    out.print(Group(
        Text("exact matches in the training text", style="bold"),
        Text(note, style="dim"),
        view.matches_table(matches, tok.token_str),
        Text(f"\ntraining windows that most raised the target's chance (TracIn over "
             f"{len(timeline)} snapshots; {found['windows_scored']:,} of {found['windows']:,} "
             "windows scored)", style="bold"),
        view.windows_table(found["top_windows"])))
    came = cache_note(found["windows_computed_now"], found["windows_scored"])
    stderr().print(f"({seconds:.1f} s; {came})", style="dim")


def cache_note(computed: int, scored: int) -> str:
    """Where the scored windows' gradient sketches came from, for the closing timing line."""
    if computed == 0:
        return f"the gradients of all {scored:,} windows read from the cache"
    if computed >= scored:
        return f"the gradients of all {scored:,} windows computed now and cached"
    return (f"the gradients of {computed:,} windows computed now, the other "
            f"{scored - computed:,} read from the cache")
