"""`review` (the whole Quick review page for a text) and `map` (the model as a diagram)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..transformer.page import map_stages, next_token, page_values
from .app import app
from .common import (
    ABLATE,
    FORCE,
    JSON,
    QUIET,
    SAVE,
    TEXT,
    WEIGHTS,
    figures,
    present,
    run,
    stdout,
)
from .steering import steerable

if TYPE_CHECKING:
    from ..jobs.session import Run
    from .context import RunContext

# NumPy and Rich are imported inside the functions: registering the commands stays cheap.


@app.command()
@steerable
def review(context: RunContext, text: str = TEXT, weights: Path = WEIGHTS,
           ablate: list[str] = ABLATE,
           as_json: bool = JSON, save: Path = SAVE, force: bool = FORCE, quiet: bool = QUIET):
    """The whole "Quick review" page for a text: the facts, then all 11 cards with real values.

    Example: tinygpt review "Lily wanted to play with her"
    """
    from ..render.documents import review_document
    from ..transformer.page import cards_for

    r = run(context, weights, text, ablate)
    values = page_values(r)

    def show(values: dict) -> None:  # as wide as the terminal, at most 100 columns
        from ..render.page import page_view

        console = stdout(context)
        console.print(page_view(r, values, min(console.width, 100)))

    present(context, as_json, lambda: review_document(r, values, cards_for(r.model.config)),
            lambda: values,
            figure=lambda: review_figure(r, values), save=save, force=force, show=show)


def review_figure(r: Run, values: dict):
    """The page as a picture (--save page.html): every card with its values, every head."""
    from ..analysis.lens import block_summary
    from ..render import pictures
    from ..transformer.page import cards_for

    cfg = r.model.config
    return pictures.review_figure(
        r.text, r.tokens, list(r.ids), values["header"], cards_for(cfg), values,
        [r.trace.get(f"layers.{i}.weights") for i in range(cfg.n_layer)],
        block_summary(r.trace, r.model.params, cfg, position=r.T - 1),
        r.model.tokenizer.token_str, r.model.tokenizer.decode, map_stages(r), cfg.parallel)


@app.command("map")
@steerable
def map_cmd(context: RunContext, text: str = TEXT, weights: Path = WEIGHTS,
            ablate: list[str] = ABLATE,
            as_json: bool = JSON, save: Path = SAVE, force: bool = FORCE, quiet: bool = QUIET):
    """The model as a diagram, every arrow labelled with its shape for this text.

    Example: tinygpt map "Lily wanted to play with her"
    """
    from ..render import page as page_view
    from ..render.documents import map_document

    r = run(context, weights, text, ablate)
    stages = map_stages(r)
    present(context, as_json, lambda: map_document(r, stages, r.model.config.n_layer),
            lambda: page_view.map_view(r, stages, next_token(r)[1]),
            figure=lambda: figures("pictures").map_figure(
                r.text, stages, r.model.config.n_layer,
                r.model.tokenizer.token_str(next_token(r)[1]), r.model.config.parallel),
            save=save, force=force)
