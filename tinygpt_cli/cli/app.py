"""The `tinygpt` application object and the error handling every command shares."""

from __future__ import annotations

import errno
import os
import re
import signal
import sys
import typing
from pathlib import Path

import typer

try:  # newer typer carries its own copy of click, whose exceptions are not click's own
    from typer._click import exceptions as click_errors
except ImportError:  # older typer runs on click itself
    from click import exceptions as click_errors

from ..entry import INTERRUPTED, fresh_line
from ..render.text import escape_line, examples_block, guard_encoding

app = typer.Typer(
    name="tinygpt",
    no_args_is_help=True,
    add_completion=True,
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
    weights: Path = typer.Option(None, "--weights", help="Weights folder for the command "
                                 "(also accepted after it).", show_default=False),
    debug: bool = typer.Option(False, "--debug", help="Show the traceback of an unexpected "
                               "error (accepted anywhere on the line; or TINYGPT_DEBUG=1)."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """A command-line microscope for a small GPT-2-style language model.

    Every value one forward pass computes can be printed by name, as a table for a person or
    with --json for programs.
    """
    from .common import set_default_weights

    set_default_weights(weights)


# Every command, in the order `tinygpt --help` lists them (the seed page's cards, then the
# whole page, the analyses, and training), with the module of cli/ that defines it: a command
# line names one command, and only its module is imported.
COMMANDS = {
    "encode": "inspect", "embed": "cards", "pos": "cards", "norm": "cards", "attn": "cards",
    "mlp": "cards", "blocks": "cards", "final-norm": "cards", "logits": "cards",
    "probs": "cards", "sample": "cards", "generate": "inspect", "decode": "inspect",
    "trace": "inspect", "review": "page", "map": "page",
    "lens": "explain", "dla": "explain", "ablate": "explain", "patch": "explain",
    "attribute": "explain", "means": "explain",
    "score": "texts", "heads": "texts", "neurons": "texts", "diff": "texts",
    "history": "history", "why": "history", "sae": "features",
    "info": "inspect", "train-tokenizer": "train", "train": "train", "model-card": "train",
}
ORDER = list(COMMANDS)


def _command_name(command) -> str:
    return command.name or command.callback.__name__.replace("_", "-")


def _chosen(args: list[str]) -> str | None:
    """The one command these arguments run, or None when they need all of them: --help, no
    command, an unknown one, or --each-line (whose errors list the commands that read a
    text). A group option first (--help, --version, --weights) is about the group."""
    name = args[0] if args and not args[0].startswith("-") else None
    options = args[: args.index("--")] if "--" in args else args
    if any(a == "--each-line" or a.startswith("--each-line=") for a in options):
        return None
    return name if name in COMMANDS else None


def _register(name: str | None = None) -> None:
    """Import the module of command `name` (or of every command), which registers its
    commands on import."""
    import importlib

    for module in [COMMANDS[name]] if name else dict.fromkeys(COMMANDS.values()):
        importlib.import_module(f"{__package__}.{module}")

    def rank(command) -> int:
        name = _command_name(command)
        return ORDER.index(name) if name in ORDER else len(ORDER)

    app.registered_commands.sort(key=rank)
    for command in app.registered_commands:
        # Each "Example:" line of a docstring becomes a line of its own in --help (click
        # would otherwise join and rewrap them mid-command).
        doc = command.help or (command.callback.__doc__ if command.callback else None)
        if doc:
            command.help = examples_block(doc)


def _click_command(name: str | None):
    """The click group that runs command `name` (None: all of them). Only that command is
    built: turning the others' signatures into click options would cost start-up time for
    nothing."""
    everything = app.registered_commands
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


def _error(message: str, code: int) -> int:
    message = " ".join(line.strip() for line in str(message).splitlines() if line.strip())
    try:
        sys.stderr.write(f"error: {escape_line(message)}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # stderr is gone too: the exit code is all that is left
    return code


class _Closed:
    """Stands in for a standard stream that was closed (`>&-`): writing to it is an I/O error,
    reported as such, instead of an AttributeError on None."""

    encoding = "utf-8"

    def __init__(self, name: str):
        self.name = name

    def write(self, s: str) -> int:
        raise OSError(errno.EBADF, f"{self.name} is closed")

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        raise OSError(errno.EBADF, f"{self.name} is closed")


def _guard_streams() -> None:
    """Closed streams and encodings that cannot show `␣ × …` must not crash a command."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        if getattr(sys, name) is not None:
            continue
        try:  # hold the descriptor, so that no file the command opens lands on it
            devnull = os.open(os.devnull, os.O_WRONLY)
            if devnull != fd:
                os.dup2(devnull, fd)
                os.close(devnull)
        except OSError:
            pass
        if name == "stdout":
            sys.stdout = _Closed("standard output")
        else:
            sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - for the process's life
    sys.stdout = guard_encoding(sys.stdout)
    sys.stderr = guard_encoding(sys.stderr)


def _reader_gone() -> int:
    """The reader of stdout went away (`| head`): stop quietly with exit 0, as Unix tools do.
    stdout now points at /dev/null, so the final flush at exit cannot fail again."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if type(stream).__name__ == "PacifyFlushWrapper":  # click's own handler came first
            setattr(sys, name, stream.wrapped)
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
    return 0


def _identity(fd: int) -> tuple[int, int] | None:
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _stdout_broken(before: tuple[int, int] | None) -> bool:
    """Did a broken-pipe handler of a library end the command? click's wraps sys.stdout;
    Rich's points stdout at /dev/null; both then exit 1, which is not what a reader that
    went away means."""
    if type(sys.stdout).__name__ == "PacifyFlushWrapper":
        return True
    try:
        now = _identity(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return now is not None and now != before and now == _identity_of_devnull()


def _identity_of_devnull() -> tuple[int, int] | None:
    st = os.stat(os.devnull)
    return st.st_dev, st.st_ino


def _finish(code: int) -> None:
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        code = _reader_gone() if code == 0 else code
    except (OSError, ValueError):
        pass
    sys.exit(code)


def _too_many_digits(e: Exception) -> bool:
    """Python's own refusal to read an integer string of over 4,300 digits (a guard against
    slow conversions), raised as a plain ValueError by int() wherever the tool reads one."""
    return type(e) is ValueError and "integer string conversion" in str(e)


def _hint(e) -> str:
    see = f"see 'tinygpt {e.ctx.info_name} --help'" if e.ctx and e.ctx.parent else \
        "see 'tinygpt --help'"
    name = getattr(e, "option_name", "") or ""
    if isinstance(e, click_errors.NoSuchOption) and not re.fullmatch(r"--[A-Za-z][\w-]*", name):
        # `tinygpt encode -hello` reads as options; the text itself goes after `--`.
        # (`--layr` is a misspelt option: click's "Possible options" is the help it needs.)
        command = e.ctx.info_name if e.ctx and e.ctx.parent else "COMMAND"
        return f" ({see}; a text that starts with '-' goes after '--': tinygpt {command} -- -hello)"
    return f" ({see})"


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; bad input ends with one `error: ...` line and exit 2, faults with exit 1."""
    _guard_streams()
    args = list(sys.argv[1:] if argv is None else argv)
    end = args.index("--") if "--" in args else len(args)
    debug = "--debug" in args[:end] or os.environ.get("TINYGPT_DEBUG") == "1"
    args = [a for i, a in enumerate(args) if a != "--debug" or i > end]
    try:
        # cheap imports only: NumPy, Rich and the model wait for the command that needs them
        from ..errors import InputError, WeightsError  # PathError is an InputError
        from . import batch

        name = _chosen(args)
        _register(name)
        _quick_coercion()
        command = _click_command(name)
        if signal.getsignal(signal.SIGINT) not in (signal.SIG_IGN, signal.default_int_handler):
            # From here a Ctrl-C is a KeyboardInterrupt again, so that `finally` blocks run.
            signal.signal(signal.SIGINT, signal.default_int_handler)
    except KeyboardInterrupt:
        fresh_line()
        sys.exit(INTERRUPTED)
    try:
        before = _identity(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        before = None
    try:
        code = batch.main(command, args)  # the command, or once per line with --each-line
        if code == INTERRUPTED:  # typer turns Ctrl-C into exit 130 itself
            fresh_line()
    except SystemExit:
        if not _stdout_broken(before):
            raise
        code = _reader_gone()  # click's or Rich's broken-pipe handler came first
    except getattr(click_errors, "NoArgsIsHelpError", ()) as e:
        # click >= 8.2 raises this to show help for a bare group; that is not an error.
        typer.echo(e.ctx.get_help())
        code = 0
    except click_errors.UsageError as e:
        if debug:
            raise
        code = _error(e.format_message() + _hint(e), 2)
    except InputError as e:
        if debug:
            raise
        code = _error(str(e), 2)
    except WeightsError as e:
        if debug:
            raise
        code = _error(str(e), 1)
    except typer.Abort:
        fresh_line()
        code = INTERRUPTED
    except KeyboardInterrupt:
        fresh_line()
        code = INTERRUPTED
    except BrokenPipeError:
        code = _reader_gone()
    except OSError as e:
        if e.errno == errno.EPIPE:
            code = _reader_gone()
        elif debug:
            raise
        else:
            where = f": {e.filename}" if e.filename else ""
            code = _error(f"{e.strerror or e}{where}", 1)
    except Exception as e:  # noqa: BLE001 - the contract: no traceback without --debug
        if debug:
            raise
        if _too_many_digits(e):  # wherever a number is read: an option, a path, an id
            code = _error("a number of more than 4,300 digits: no option, index or token id "
                          "is anywhere near that large", 2)
        else:
            code = _error(f"{type(e).__name__}: {e} (run again with --debug for the "
                          "traceback)", 1)
    _finish(code if isinstance(code, int) else 0)
