"""The `tinygpt` application object and the error handling every command shares."""

from __future__ import annotations

import os
import re
import sys
import typing

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
         "probs", "sample", "generate", "decode", "trace", "review", "map", "info",
         "train-tokenizer", "train", "model-card"]


def _command_name(command) -> str:
    return command.name or command.callback.__name__.replace("_", "-")


def _register() -> None:
    # Commands register themselves on import; one module per group.
    from . import cards, inspect, page, train  # noqa: F401

    def rank(command) -> int:
        name = _command_name(command)
        return ORDER.index(name) if name in ORDER else len(ORDER)

    app.registered_commands.sort(key=rank)


def _click_command(args: list[str]):
    """The click group for these arguments. `tinygpt NAME ...` builds NAME's command only:
    turning all the others' signatures into click options would cost start-up time for
    nothing; --help, no command or an unknown one builds them all."""
    everything = app.registered_commands
    # a group option first (--help, --version) is about the group as a whole
    name = args[0] if args and not args[0].startswith("-") else None
    chosen = [c for c in everything if _command_name(c) == name]
    if not chosen:
        return typer.main.get_command(app)
    app.registered_commands = chosen
    try:
        return typer.main.get_command(app)
    finally:
        app.registered_commands = everything


_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_NOT_PLAIN = object()


def _plain(annotation, info, value, param, ctx):
    """The value of a plainly valid str, int, float or Path option (or a list of them), as
    typer would make it, or _NOT_PLAIN when typer should decide (and word any error)."""
    from pathlib import Path

    if getattr(info, "parser", None) is not None or getattr(info, "clamp", False):
        return _NOT_PLAIN
    if typing.get_origin(annotation) is list and isinstance(value, (list, tuple)):
        (item,) = typing.get_args(annotation) or (str,)
        out = [_plain(item, info, v, param, ctx) for v in value]
        return _NOT_PLAIN if any(v is _NOT_PLAIN for v in out) else out
    if annotation is str and isinstance(value, str):
        return value
    if annotation in (int, float):
        pattern = _INT if annotation is int else _FLOAT
        if isinstance(value, str) and pattern.fullmatch(value):
            value = annotation(value)
        if type(value) not in ((int,) if annotation is int else (int, float)):
            return _NOT_PLAIN
        value = annotation(value)
        lo, hi = getattr(info, "min", None), getattr(info, "max", None)
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            return _NOT_PLAIN
        return value
    if annotation is Path and isinstance(value, str) and value:
        from typer._param_types import _path_options_requested, coerce_cli_path

        if _path_options_requested(info) or info.path_type is not None:
            return _NOT_PLAIN
        return coerce_cli_path(Path(value), info, path_type=Path, param=param, ctx=ctx)
    return _NOT_PLAIN


def _quick_coercion() -> None:
    """Typer (0.2x) checks every option's value with a Pydantic TypeAdapter, and importing
    Pydantic and building the adapters takes longer than a whole `tinygpt encode` should.
    Plainly valid str, int, float and Path values (what nearly every command line holds)
    are converted here as typer would; anything else, and every error message, is still
    typer's own. Uses typer internals, so a typer without them just runs as it is.
    """
    try:
        from typer._coercion import RuntimeParam, build_runtime_param
        from typer.core import _TyperParameter
    except ImportError:
        return
    if getattr(_TyperParameter, "_tinygpt_quick", False):
        return

    class QuickRuntimeParam(RuntimeParam):
        def __init__(self, descriptor) -> None:
            object.__setattr__(self, "descriptor", descriptor)
            object.__setattr__(self, "full", None)
            super().__init__(parameter_info=descriptor.parameter_info,
                             annotation=descriptor.annotation)

        def _coerce_value(self, value, param, ctx):
            out = _plain(self.annotation, self.parameter_info, value, param, ctx)
            if out is not _NOT_PLAIN:
                return out
            if self.full is None:
                object.__setattr__(self, "full", build_runtime_param(self.descriptor))
            return self.full._coerce_value(value, param=param, ctx=ctx)

    def get_runtime_param(self):
        if self._runtime_param is None:
            self._runtime_param = QuickRuntimeParam(self.type_descriptor)
        return self._runtime_param

    _TyperParameter.get_runtime_param = get_runtime_param
    _TyperParameter._tinygpt_quick = True


def _is_weights_error(e: Exception) -> bool:
    # Only a command that imported weights.py can raise its WeightsError; looking it up here
    # keeps NumPy out of commands (and --help) that never load weights.
    weights = sys.modules.get("tinygpt_cli.weights")
    return weights is not None and isinstance(e, weights.WeightsError)


def _error(message: str, code: int) -> int:
    message = " ".join(line.strip() for line in str(message).splitlines() if line.strip())
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    return code


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; bad input ends with one `error: ...` line and exit 2, faults with exit 1."""
    from ..errors import InputError  # PathError is one too

    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or os.environ.get("TINYGPT_DEBUG") == "1"
    args = [a for a in args if a != "--debug"]
    _register()
    _quick_coercion()
    command = _click_command(args)
    try:
        code = command.main(args=args, prog_name="tinygpt", standalone_mode=False)
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
    except InputError as e:
        if debug:
            raise
        code = _error(str(e), 2)
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
        if _is_weights_error(e):
            code = _error(str(e), 1)
        else:
            code = _error(f"{type(e).__name__}: {e} (run again with --debug for the traceback)",
                          1)
    sys.exit(code if isinstance(code, int) else 0)
