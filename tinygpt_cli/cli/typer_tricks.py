"""Every use of Typer and click beyond their documented API, in one place, so that a Typer
upgrade that breaks one fails tests/test_typer_tricks.py instead of a command line.

- click_errors: the exceptions of the click that typer runs on (newer typer vendors its own
  copy of click, whose exceptions are not click's own).
- click_command(app, name): the click command of one Typer command only, by building the app
  with its other commands set aside (turning every signature into click options would cost
  start-up time for nothing); for `tinygpt --help`, every command as a name and a line only.
- quick_coercion(): plainly valid option values (and those of a parser= option) converted
  without Pydantic (typer 0.2x).
- negative_arguments(command): a negative number is an argument (`sae feature -1`), not an
  option click does not know.
"""

from __future__ import annotations

import re
import typing
from pathlib import Path

import typer

try:  # newer typer carries its own copy of click, whose exceptions are not click's own
    from typer._click import exceptions as click_errors
except ImportError:  # older typer runs on click itself
    from click import exceptions as click_errors

__all__ = ["click_command", "click_errors", "command_name", "negative_arguments",
           "quick_coercion"]


def command_name(command) -> str:
    """The name a registered command (typer's CommandInfo) is typed as."""
    return command.name or command.callback.__name__.replace("_", "-")


def click_command(app: typer.Typer, name: str | None, *,
                  listing: dict[str, str] | None = None):
    """The click group that runs command `name` (None: all of them). Only that command is
    built: turning the others' signatures into click options would cost start-up time for
    nothing. `listing` (with name None: the group only shows its help): each command's name
    and the line its help lists for it; the group lists those, and no command is built or
    even imported."""
    if name is None and listing is not None:
        return _listing(app, listing)
    everything = app.registered_commands
    chosen = [c for c in everything if command_name(c) == name]
    if not chosen:
        return negative_arguments(typer.main.get_command(app))
    app.registered_commands = chosen
    try:
        return negative_arguments(typer.main.get_command(app))
    finally:
        app.registered_commands = everything


NUMBER = re.compile(r"-(\d+\.?\d*|\.\d+)")  # no option of tinygpt is named -1 or -.5


def negative_arguments(command):
    """The command (a group: each of its commands, at every depth) with a negative number
    taken as an argument, as the range messages offer (latent -1, the last): click reads
    every word that starts with '-' as an option. When an argument is a negative number,
    the options (with their values) move before a `--` and the arguments after it, each
    kind in its order; a negative number that is an option's value stays that value."""
    for sub in getattr(command, "commands", {}).values():
        negative_arguments(sub)
    if getattr(command, "commands", None) is not None or getattr(command, "_tinygpt_neg", 0):
        return command
    valued = {name for p in command.params if getattr(p, "param_type_name", "") == "option"
              and not p.is_flag and not p.count for name in (*p.opts, *p.secondary_opts)}
    parse = command.parse_args

    def parse_args(ctx, args):
        return parse(ctx, arguments_last(list(args), valued))

    command.parse_args, command._tinygpt_neg = parse_args, True
    return command


def arguments_last(args: list[str], valued: set[str]) -> list[str]:
    """args unchanged, unless one of its arguments is a negative number: then its options
    (with the values of those in `valued`), `--`, its arguments."""
    end = args.index("--") if "--" in args else len(args)
    options, arguments, i = [], [], 0
    while i < end:
        word = args[i]
        if word.startswith("-") and len(word) > 1 and not NUMBER.fullmatch(word):
            takes = word in valued and i + 1 < end
            options += args[i:i + 2] if takes else [word]
            i += 2 if takes else 1
            continue
        arguments.append(word)
        i += 1
    if not any(NUMBER.fullmatch(a) for a in arguments):
        return args
    return [*options, "--", *arguments, *args[end + 1:]]


def _listing(app: typer.Typer, lines: dict[str, str]):
    """The app's group with its own options, and as its commands only a name and a line."""
    from typer.core import TyperCommand

    kept = app.registered_commands, app.registered_groups
    app.registered_commands, app.registered_groups = [], []
    try:
        group = typer.main.get_command(app)
    finally:
        app.registered_commands, app.registered_groups = kept
    for name, line in lines.items():
        group.add_command(TyperCommand(name=name, help=line))
    return group


_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_NOT_PLAIN = object()


def _plain(annotation, info, value, param, ctx):
    """The value of a plainly valid str, int, float or Path option (or a list of them), as
    typer would make it, or _NOT_PLAIN when typer should decide (and word any error)."""
    parser = getattr(info, "parser", None)
    if parser is str and isinstance(value, str):  # typer gives the parser's result (--weights)
        return value
    if parser is not None or getattr(info, "clamp", False):
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


def quick_coercion() -> None:
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


def plain_type_names() -> None:
    """--help shows a repeatable option's type as Python spells it (`<list[str]>`); a
    user reads `<str>...` (one or more). Uses typer internals, like quick_coercion."""
    try:
        from typer.core import _TyperParameter
    except ImportError:
        return
    shown = getattr(_TyperParameter, "display_type", None)
    if shown is None or getattr(shown, "_tinygpt", False):
        return

    def display_type(self, ctx):
        return re.sub(r"<list\[(\w+)\]>", lambda m: f"<{m[1].lower()}>...", shown(self, ctx))

    display_type._tinygpt = True
    _TyperParameter.display_type = display_type
