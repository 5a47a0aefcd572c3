"""The `tinygpt` application object and the error handling every command shares."""

from __future__ import annotations

import os
import sys

import typer

try:  # newer typer carries its own copy of click, whose exceptions are not click's own
    from typer._click import exceptions as click_errors
except ImportError:  # older typer runs on click itself
    from click import exceptions as click_errors

app = typer.Typer(
    name="tinygpt",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)


def _version(value: bool) -> None:
    if value:
        from .. import __version__

        typer.echo(f"tinygpt {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """A command-line microscope for a small GPT-2-style language model.

    Every value one forward pass computes can be printed by name, as a table for a person or
    with --json for programs. Add --debug anywhere to see tracebacks.
    """


# The order `tinygpt --help` lists commands in: the seed page's cards, then the whole page,
# then training.
ORDER = ["encode", "embed", "pos", "norm", "attn", "mlp", "blocks", "final-norm", "logits",
         "probs", "sample", "generate", "decode", "trace", "review", "map",
         "lens", "dla", "ablate", "patch", "attribute", "means",
         "score", "heads", "neurons", "diff", "history", "why",
         "info", "train-tokenizer", "train", "model-card"]


def _register() -> None:
    # Commands register themselves on import; one module per group.
    from . import cards, explain, history, inspect, page, texts, train  # noqa: F401

    def rank(command) -> int:
        name = command.name or command.callback.__name__
        return ORDER.index(name) if name in ORDER else len(ORDER)

    app.registered_commands.sort(key=rank)


def _error(message: str, code: int) -> int:
    message = " ".join(line.strip() for line in str(message).splitlines() if line.strip())
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    return code


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; bad input ends with one `error: ...` line and exit 2, faults with exit 1."""
    from ..trace import PathError
    from ..weights import WeightsError
    from . import batch
    from .common import InputError

    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or os.environ.get("TINYGPT_DEBUG") == "1"
    args = [a for a in args if a != "--debug"]
    _register()
    command = typer.main.get_command(app)
    try:
        code = batch.main(command, args)  # the command, or once per line with --each-line
    except getattr(click_errors, "NoArgsIsHelpError", ()) as e:
        # click >= 8.2 raises this to show help for a bare group; that is not an error.
        typer.echo(e.ctx.get_help())
        code = 0
    except click_errors.UsageError as e:
        if debug:
            raise
        hint = f" (see 'tinygpt {e.ctx.info_name} --help')" if e.ctx and e.ctx.parent else \
            " (see 'tinygpt --help')"
        code = _error(e.format_message() + hint, 2)
    except (InputError, PathError) as e:
        if debug:
            raise
        code = _error(str(e), 2)
    except WeightsError as e:
        if debug:
            raise
        code = _error(str(e), 1)
    except typer.Abort:
        code = _error("aborted", 130)
    except KeyboardInterrupt:
        code = 130
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, as Unix tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = 0
    except Exception as e:  # noqa: BLE001 - the contract: no traceback without --debug
        if debug:
            raise
        code = _error(f"{type(e).__name__}: {e} (run again with --debug for the traceback)", 1)
    sys.exit(code if isinstance(code, int) else 0)
