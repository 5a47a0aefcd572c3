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
    progress_report,
    read_text,
    stderr,
    stdout,
    wide,
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
                      view.grid_rows(grids[:, p, : p + 1], labels, cols)]
    group = Group(*parts)
    wide(group).print(group)


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


@app.command()
def why(
    text: str = TEXT,
    target: str = typer.Option(None, "--target", help="The next token to explain, as text "
                               "(' ball') or id; default: the model's likeliest.",
                               show_default=False),
    data: list[Path] = typer.Option(None, "--data", help="The training text: a folder of "
                                    "part-*.txt (the last part, held out, is skipped), or "
                                    "files. Default: the folder WEIGHTS/data.json records.",
                                    show_default=False),
    any_data: bool = typer.Option(False, "--any-data", help="Use --data even where it is not "
                                  "the text WEIGHTS/data.json says the model learned from."),
    top: int = TOP, weights: Path = WEIGHTS, as_json: bool = JSON,
):
    """Where the model learned a prediction: exact matches, and the most influential windows.

    Exact matches: how often the text's last 1 to 8 tokens are followed by the target in the
    training text. Influential windows: every training window ranked by how much its
    gradient raised the target's chance (TracIn over the snapshots in WEIGHTS/history, with
    each snapshot's learning rate), from an index built once per model and text (minutes, on
    every core; Ctrl-C keeps what is done), then the top ones re-scored exactly.

    Example: tinygpt why "Once upon a time, there was a little" --target " girl"
    """
    from ..analysis import why as whys
    from ..corpus import training_text
    from ..render import history as view
    from ..render import jsonout
    from ..render.text import escape_line
    from ..session import Session

    t0 = time.perf_counter()
    model = load(weights)
    session = Session.open(read_text(text), model=model)
    found = training_text(model.folder, data, any_data=any_data)
    with progress_report("indexing every window's gradient") as report:
        result = whys.answer(model, session.ids, target, found.files, top, report)
    if found.note:  # once the answer stands: an error is then the only line
        stderr().print(escape_line(found.note), soft_wrap=True)
    if as_json:
        jsonout.emit(jsonout.document("scores", result.scores(), session.ids, session.tokens,
                                      **result.facts(), seconds=round(time.perf_counter() - t0,
                                                                      2)))
        return
    stdout().print(view.why_view(result, model.tokenizer.token_str))
    stderr().print(f"({time.perf_counter() - t0:.1f} s; {result.index_note()})", style="dim")
