"""The commands as functions of named arguments, for the programs that are not a shell: the
notebook API (api.py) and the MCP server (mcp_server.py).

Both read the one command registry (commands.LISTED, the commands cli.app registers): a
command's parameters are its click parameters, and a call with {name: value} arguments is the
command line those arguments spell (`argv`), run by the CLI's own code. Nothing here lists a
command or an option by hand.
"""

from __future__ import annotations

import difflib
import functools
import numbers
import os
import reprlib
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy

from ..cli.app import _register, app
from ..cli.batch import CHAT, TEXT_PARAMS
from ..cli.typer_tricks import click_command, plain_type_names, quick_coercion
from ..errors import InputError

# The words every command takes but that are about a terminal or a file, never about a result.
VIEW_ONLY = ("as_json", "save", "force", "quiet", "full")


@dataclass(frozen=True)
class Param:
    """One argument or option of a command, as a program names it (its Python name)."""

    name: str
    option: str | None  # the option word (--layer); None for an argument (TEXT)
    kind: str  # string, integer, number or boolean
    help: str
    default: Any = None
    required: bool = False
    multiple: bool = False  # a list (a repeatable option: --ablate A --ablate B)
    off: str | None = None  # a boolean option's word for False (--no-stop's twin), if any
    minimum: float | None = None
    maximum: float | None = None
    path: bool = False  # a file or folder the command reads or writes (a Path option)
    metavar: str | None = None  # as --help shows the value (FILE[#N])

    @property
    def word(self) -> str:
        """The name as --help spells it: the option's word (--all-heads: all_heads, --from:
        from), an argument's own name (text)."""
        return self.name if self.option is None else self.option[2:].replace("-", "_")


@functools.cache
def group():
    """The click group of `tinygpt` with every command built."""

    _register()
    quick_coercion()
    plain_type_names()
    return click_command(app, None)


def commands(root=None) -> dict[str, Any]:
    """Every command by its name, in the order `tinygpt --help` lists them; the commands of a
    group by the group's name and theirs (`sae feature`)."""
    root = root if root is not None else group()
    out = {}
    for name, command in root.commands.items():
        subs = getattr(command, "commands", None)
        if subs:
            out.update({f"{name} {sub}": c for sub, c in subs.items()})
        else:
            out[name] = command
    return out


def _kind(param) -> str:
    """string, integer, number or boolean: from the annotation the command declares (typer
    0.2x keeps it on the parameter), else from click's type (older typer)."""
    if getattr(param, "is_flag", False):
        return "boolean"

    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    while typing.get_args(annotation):  # list[int] -> int, Optional[int] -> int
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    if annotation is None:
        name = type(getattr(param, "type", None)).__name__.lower()
        annotation = int if "int" in name else float if "float" in name else str
    return {int: "integer", float: "number", bool: "boolean"}.get(annotation, "string")


def _is_path(param) -> bool:
    """A file or folder (the command's annotation is Path, or a list of them)."""

    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    while typing.get_args(annotation):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    if str(getattr(param, "metavar", None) or "").startswith(("FILE", "DIR")):
        return True  # --steer-vector FILE[#N], a str that names a file
    if annotation is None:
        return type(getattr(param, "type", None)).__name__ == "Path"
    return isinstance(annotation, type) and issubclass(annotation, Path)


def _bound(param, which: str):
    """--top's min=1, --top-p's max=1: on the parameter (typer 0.2x) or its click type."""
    value = getattr(param, which, None)
    return value if value is not None else getattr(getattr(param, "type", None), which, None)


def parameters(command) -> list[Param]:
    """The command's arguments and options, --help's own left out."""
    out = []
    for p in command.params:
        if p.name in ("help",) or getattr(p, "hidden", False):
            continue
        option = None
        if p.param_type_name == "option":
            option = max(p.opts, key=len)  # --layer, not -l
        default = p.default if not callable(p.default) else None
        out.append(Param(
            name=p.name, option=option, kind=_kind(p), help=getattr(p, "help", None) or "",
            default=list(default) if isinstance(default, tuple) else default,
            required=bool(p.required),
            multiple=bool(getattr(p, "multiple", False)) or getattr(p, "nargs", 1) != 1,
            off=(p.secondary_opts or [None])[0] if getattr(p, "is_flag", False) else None,
            minimum=_bound(p, "min"), maximum=_bound(p, "max"), path=_is_path(p),
            metavar=getattr(p, "metavar", None)))

    if any(p.name in TEXT_PARAMS for p in command.params):  # batch.py's, on every such command
        out.append(Param(name="chat", option=CHAT, kind="string", help=(
            "A user's message, put in the model's chat template (its assistant turn opened) "
            "as the text.")))
    return out


class ArgumentError(InputError, TypeError):
    """An argument of the wrong type: a TypeError to Python (and the InputError, exit 2, of
    the command line), its message naming the argument and what it takes."""


# what a value of each kind is, as a message says it
TAKES = {"string": "a str", "integer": "a whole number (int)", "number": "a number",
         "boolean": "True or False (a bool; JSON true or false)"}


def shown(value) -> str:
    """A wrong value in a message: a number or None as itself, else its type and repr."""

    if value is None or isinstance(value, bool | int | float):
        return repr(value)
    return f"{type(value).__name__} {reprlib.repr(value)}"


def _one(name: str, p: Param, value):
    """The value, checked against p's kind: never coerced by truthiness or str(); a whole
    float (JSON's 2.0) is the int it spells, a path may be a Path."""

    if p.kind == "boolean" and isinstance(value, bool | getattr(_np(), "bool_", bool)):
        return bool(value)
    if p.kind == "integer" and isinstance(value, numbers.Integral) \
            and not isinstance(value, bool | _np().bool_):
        return int(value)
    if p.kind == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    if p.kind == "number" and isinstance(value, numbers.Real) \
            and not isinstance(value, bool | _np().bool_):
        return float(value) if not isinstance(value, numbers.Integral) else int(value)
    if p.kind == "string" and isinstance(value, str):
        return value
    if p.kind == "string" and p.path and isinstance(value, os.PathLike):
        return os.fspath(value)
    takes = "a path (str)" if p.path else TAKES[p.kind]
    if p.multiple:
        takes = f"a list, each item {takes}"
    raise ArgumentError(f"{name}: {p.word} takes {takes}, not {shown(value)}")


def _np():

    return numpy


def checked(name: str, params: list[Param], arguments: dict[str, Any]) -> dict[str, Any]:
    """The arguments ({Python name: value}) checked against the command's own parameters,
    the one schema the API and the MCP server share: an unknown name is an InputError naming
    the ones there are, a value of the wrong type an ArgumentError naming the argument and
    what it takes (a list option takes a list or tuple of them). None: not given."""
    by_name = {p.name: p for p in params}
    unknown = sorted(set(arguments) - set(by_name))
    if unknown:

        close = difflib.get_close_matches(unknown[0], list(by_name), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else "."
        raise InputError(f"{name} takes no argument {unknown[0]!r}{hint} It takes: "
                         + ", ".join(by_name))
    out = {}
    for key, value in arguments.items():
        p = by_name[key]
        if value is None:
            continue
        if p.multiple:
            if not isinstance(value, list | tuple):
                takes = "a path (str)" if p.path else TAKES[p.kind]
                raise ArgumentError(f"{name}: {p.word} takes a list, each item {takes}, "
                                    f"not {shown(value)}")
            out[key] = [_one(name, p, v) for v in value]
        else:
            out[key] = _one(name, p, value)
    return out


def argv(name: str, params: list[Param], arguments: dict[str, Any]) -> list[str]:
    """The command line that `arguments` ({Python name: value}) spell for command `name`
    (`sae feature`: two words), once `checked`: each option as --option=VALUE (a value
    starting with '-' stays a value), a list as the option repeated, True as the flag, and
    the arguments after `--` in the command's order (a text starting with '-' stays text)."""
    arguments = checked(name, params, arguments)
    words, positional = name.split(), []
    for p in params:
        if p.name not in arguments:
            continue
        value = arguments[p.name]
        if p.option is None:
            before = [q.name for q in params[:params.index(p)] if q.option is None]
            missing = [n for n in before if n not in arguments]
            if missing:  # the words would land in the wrong places
                raise InputError(f"{name}: {p.name} is given, so give {missing[0]} too")
            positional += [str(v) for v in value] if p.multiple else [str(value)]
        elif p.kind == "boolean" and not p.multiple:
            if value:
                words.append(p.option)
            elif p.off is not None:
                words.append(p.off)
        else:
            values = value if p.multiple else [value]
            words += [f"{p.option}={v}" for v in values]
    return [*words, "--", *positional] if positional else words
