"""What every inspection command shares: options, reading the text, running the model."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import typer
from rich.console import Console

from ..model import forward
from ..trace import Trace
from ..weights import Model, load_model


class InputError(Exception):
    """Bad usage or input: the message says what was wrong and what is allowed. Exit 2."""


# Options, declared once so every command spells and documents them the same way.
TEXT = typer.Argument(None, help="The text; '-' or nothing reads it from stdin.",
                      show_default=False)
WEIGHTS = typer.Option(None, "--weights", help="Weights folder (default: $TINYGPT_WEIGHTS, "
                       "then the shipped model).", show_default=False)
JSON = typer.Option(False, "--json", help="Print one JSON document on stdout.")
FULL = typer.Option(False, "--full", help="Show every column instead of the first and last.")
LAYER = typer.Option(0, "--layer", "-l", help="Block index; negative counts from the end.")
HEAD = typer.Option(0, "--head", help="Head index; negative counts from the end.")
POSITION = typer.Option(-1, "--position", "-p", help="Token position; -1 is the last.")
TOP = typer.Option(10, "--top", "-k", min=1, help="How many to list.")
TEMPERATURE = typer.Option(1.0, "--temperature", "-t", min=0.0,
                           help="Divide the scores by this before softmax; 0 is greedy.")


PIPE_WIDTH = 120  # a pipe or file has no width; wide enough that header lines never wrap


def stdout(width: int | None = None) -> Console:
    """Markup and highlighting off: text from the user or the model is shown literally."""
    console = Console(markup=False, highlight=False, emoji=False, soft_wrap=False, width=width)
    if width is None and not console.is_terminal:
        console = Console(markup=False, highlight=False, emoji=False, soft_wrap=False,
                          width=PIPE_WIDTH)
    return console


def wide(*renderables) -> Console:
    """stdout, widened to the natural width of the renderables, so that a table of numbers
    (--full, a heatmap of a long text) is never cut at the edge: a terminal wraps the long
    lines and a pipe keeps them whole."""
    console = stdout()
    options = console.options.update_width(10**5)
    need = max(console.measure(r, options=options).maximum for r in renderables)
    return stdout(width=need) if need > console.width else console


def stderr() -> Console:
    return Console(stderr=True, markup=False, highlight=False, emoji=False)


def read_text(text: str | None) -> str:
    """The argument, or stdin when the argument is '-' or missing and stdin is not a terminal."""
    if text is None or text == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise InputError("no text: give it as an argument, or pipe it on stdin with '-'")
        text = sys.stdin.read()
        if text.endswith("\n"):
            text = text[:-1]  # the newline `echo` adds is not part of the text
    if text == "":
        raise InputError("the text is empty: give at least one character")
    return text


def load(weights: Path | None) -> Model:
    return load_model(weights)


@dataclass
class Run:
    """A model, a text, its ids and token strings, and the trace of one forward pass."""

    model: Model
    text: str
    ids: list[int]
    tokens: list[str]
    trace: Trace

    @property
    def T(self) -> int:  # noqa: N802  (the seed page's name)
        return len(self.ids)


def encode_checked(model: Model, text: str) -> list[int]:
    ids = model.tokenizer.encode(text)
    limit = model.config.n_positions
    if not ids:
        raise InputError("the text is empty: give at least one character")
    if len(ids) > limit:
        raise InputError(
            f"the text is {len(ids)} tokens long; this model reads at most {limit} tokens"
        )
    return ids


def run(weights: Path | None, text: str | None) -> Run:
    model = load(weights)
    text = read_text(text)
    ids = encode_checked(model, text)
    trace = forward(model.params, model.config, np.asarray(ids))
    tokens = [model.tokenizer.token_str(i) for i in ids]
    trace.tokens = tokens
    return Run(model, text, ids, tokens, trace)


def check_index(value: int, count: int, what: str) -> int:
    """A layer, head or position index, negatives from the end; error names the valid range."""
    if not -count <= value < count:
        raise InputError(
            f"{what} {value} is out of range: valid {what}s are 0..{count - 1} "
            f"(or -{count}..-1 from the end)"
        )
    return value % count
