"""The `tinygpt` application object and the error handling every command shares."""

from __future__ import annotations

import sys

import typer

app = typer.Typer(
    name="tinygpt",
    help="A command-line microscope for a small GPT-2-style language model.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


class UsageError(Exception):
    """Bad usage or input: exit code 2."""


def fail(message: str, code: int = 2):
    sys.stderr.write(f"error: {message}\n")
    raise typer.Exit(code)


def _register() -> None:
    from . import train  # noqa: F401  (commands register themselves on import)


def main() -> None:
    _register()
    app()
