"""--each-line FILE: run a command once per non-empty line of FILE ('-': stdin), in one process.

Any command that reads a text takes it: the line is given as the command's (last) text
argument, in that argument's place among the others (`trace LINE PATH`; `diff TEXT LINE`),
after `--` so a line starting with '-' stays text. A person gets each result under
a `line N:` heading; with --json every line's result is one JSON object on one line,
{"line": N, "text": ..., "result": document (or the list of documents a streaming command
printed)}, so the output is NDJSON with one record per input line. A bad line gets one
`error: line N: ...` line and no record, the rest still run, and the exit code is then 2.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import replace
from typing import TYPE_CHECKING

from ..errors import InputError

if TYPE_CHECKING:
    from ..context import RunContext

OPTION = "--each-line"
CHAT = "--chat"
TEXT_PARAMS = ("text", "text_a")


def main(command, args: list[str], context: RunContext):
    """command.main(args) with the run context, or once per line when args hold --each-line
    FILE (the context then opens each folder once and makes the lines' passes ahead)."""
    options = args[: args.index("--")] if "--" in args else args  # after '--' all is text
    from ..entry import check_once

    check_once(options, "--weights")
    each = any(a == OPTION or a.startswith(OPTION + "=") for a in options)
    if any(a == CHAT or a.startswith(CHAT + "=") for a in options):
        if each:
            raise InputError(f"{CHAT} gives the command one message; {OPTION} one text a "
                             "line: give one of them")
        return _chat(command, args, context)
    if not each:
        return command.main(args=args, prog_name="tinygpt", standalone_mode=False,
                            obj=context)
    source, rest = take_option(args)
    name, sub = _text_command(command, rest, f"{OPTION} runs a command that reads a text "
                              "once per line")
    from ..ahead import Ahead
    from ..streams import text_lines

    opened = {} if context.opened is None else context.opened  # weights once
    # the passes in batches, over the lines as they are read (streams.StreamLines)
    ahead = Ahead(text_lines(source, OPTION), opened)
    each = replace(context, opened=opened, ahead=ahead)
    return _each_line(command, rest, name, sub, ahead.run(), each)


def _text_command(command, rest: list[str], what: str):
    """(name, click command) of the command in `rest`, which must read a text; else
    InputError saying `what` and naming those that do."""
    from ..entry import command_word

    name = command_word(command, rest)
    sub = getattr(command, "commands", {}).get(name) if name else None
    if sub is None or not any(p.name in TEXT_PARAMS for p in sub.params):
        readers = sorted(n for n, c in getattr(command, "commands", {}).items()
                         if any(p.name in TEXT_PARAMS for p in c.params))
        raise InputError(f"{what}; {name or 'no command'} does not read one"
                         + (". Commands that do: " + ", ".join(readers) if readers else ""))
    return name, sub


def _chat(command, args: list[str], context: RunContext) -> int:
    """--chat MESSAGE: the message rendered in the folder's chat template (chat.py) is the
    command's text, in the text argument's place as --each-line puts a line; the run's
    context says so, and the folder's <bos> is not added to it again."""
    from ..chat import prompt

    message, rest = take_option(args, CHAT, "the user's message, e.g. --chat \"Hi!\"")
    if message.startswith("--"):  # `--chat --weights DIR`: the message was left out
        raise InputError(f"{CHAT} needs the user's message, not {message}; a message that "
                         f"starts with '--' is written {CHAT}=MESSAGE")
    name, sub = _text_command(command, rest, f"{CHAT} gives its message to a command that "
                              "reads a text")
    at = rest.index(name) + 1
    options, before, after = split_arguments(sub, rest[at:])
    others = [p for p in sub.params if p.param_type_name == "argument"]
    if len(before) + len(after) >= len(others):  # the text given too: it would be one more
        raise InputError(f"give the text once: as the argument, or as {CHAT}'s message")
    weights = _value(options, "--weights") or _value(rest[:at], "--weights") or context.weights
    text = prompt(weights, message, context.opened)
    return command.main(args=[*rest[:at], *options, "--", *before, text, *after],
                        prog_name="tinygpt", standalone_mode=False,
                        obj=replace(context, chat=True))


def _value(options: list[str], name: str) -> str | None:
    """The value of option `name` among the option words, as given; None if absent."""
    for i, a in enumerate(options):
        if a == name and i + 1 < len(options):
            return options[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def _each_line(command, rest: list[str], name: str, sub, lines, context: RunContext) -> int:
    from rich.text import Text

    from ..exits import USAGE, error
    from ..render.jsonout import emit_record
    from ..render.quick_table import print_line
    from ..render.text import show_text
    from .common import stdout

    as_json = "--json" in rest
    code = bad = 0
    at = rest.index(name) + 1
    options, before, after = split_arguments(sub, rest[at:])
    for number, line in lines:
        # the line goes where the text argument goes: last for most, first for `trace TEXT PATH`
        argv = [*rest[:at], *options, "--", *before, line, *after]
        try:
            if as_json:
                buf = io.StringIO()
                with contextlib.redirect_stdout(buf):
                    code = command.main(args=argv, prog_name="tinygpt", standalone_mode=False,
                                        obj=context)
                emit_record(number, line, [x for x in buf.getvalue().splitlines() if x.strip()])
            else:
                print_line(stdout(context), Text(f"line {number}: ", style="bold magenta")
                           + Text(show_text(line)[:80]))
                code = command.main(args=argv, prog_name="tinygpt", standalone_mode=False,
                                    obj=context)
                print_line(stdout(context), Text(""))
        except InputError as e:  # this line's fault: said, and the next line runs
            bad = error(f"line {number}: {e}", USAGE)
            continue
        if code:
            return code
    return bad or code


def split_arguments(command, args: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(the option words, the positional arguments before the text's place, those after it)
    of a command's arguments, the text itself left out: `trace --json logits` gives
    (['--json'], [], ['logits']), since trace takes TEXT then PATH."""
    takes_value = {}
    for p in command.params:
        for opt in [*getattr(p, "opts", []), *getattr(p, "secondary_opts", [])]:
            if opt.startswith("-"):
                takes_value[opt] = not getattr(p, "is_flag", False) and p.nargs != 0
    options, positional = [], []
    words = iter(args)
    for word in words:
        if word == "--":
            positional += list(words)
            break
        if word.startswith("-") and len(word) > 1:
            options.append(word)
            if takes_value.get(word.split("=", 1)[0]) and "=" not in word:
                options.append(next(words, ""))
        else:
            positional.append(word)
    arguments = [p.name for p in command.params if p.param_type_name == "argument"]
    # the last text argument: diff's TEXT_B, so `diff TEXT --each-line F` compares TEXT with
    # each line; trace's only one, before PATH
    place = max(i for i, n in enumerate(arguments) if n in (*TEXT_PARAMS, "text_b"))
    return options, positional[:place], positional[place:]


def take_option(args: list[str], option: str = OPTION,
                needs: str = "a file of texts, one per line ('-': stdin)"
                ) -> tuple[str, list[str]]:
    """(FILE, the other arguments) from `--each-line FILE` or `--each-line=FILE` (or another
    option's value: --chat MESSAGE)."""
    rest, source = [], None
    it = iter(range(len(args)))
    for i in it:
        a = args[i]
        if a == "--":  # the rest is text, given as is
            rest += args[i:]
            break
        if a == option:
            if i + 1 >= len(args):
                raise InputError(f"{option} needs {needs}")
            source = args[i + 1]
            next(it, None)
        elif a.startswith(option + "="):
            source = a.split("=", 1)[1]
        else:
            rest.append(a)
    if not source:
        raise InputError(f"{option} needs {needs}")
    return source, rest
