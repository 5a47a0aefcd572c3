"""--each-line FILE: run a command once per non-empty line of FILE ('-': stdin), in one process.

Any command that reads a text takes it: the line is given as the command's (last) text
argument, in that argument's place among the others (`trace LINE PATH`; `diff TEXT LINE`),
after `--` so a line starting with '-' stays text. A person gets each result under
a `line N:` heading; with --json every line's result is one JSON object on one line,
{"line": N, "text": ..., "result": document (or the list of documents a streaming command
printed)}, so the output is NDJSON with one record per input line. A bad line gets one
`error: line N: ...` line and no record, the rest still run, and the exit code is then 2.
A command of two texts (patch, circuit) reads a pair a line, CLEAN<TAB>CORRUPT. With --mean,
dla, lens, patch, ablate and attribute print one JSON document instead, each of their numbers
averaged over the lines (render.jsonout.mean_document).
`--save x.svg` writes one picture per line, x-001.svg, x-002.svg ... (numbered_save: the
line's number, three digits at least), each atomically as any --save.
"""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import replace
from typing import TYPE_CHECKING

from ..errors import InputError

if TYPE_CHECKING:
    from .context import RunContext

OPTION = "--each-line"
CHAT = "--chat"
TEXT_PARAMS = ("text", "text_a")
PAIR_PARAMS = ("clean", "corrupt")  # a line gives both: CLEAN<TAB>CORRUPT (as --pairs)
MEAN = "--mean"
# The commands whose JSON numbers measure the same thing on every line (a target's logit
# parts, a lens's stages, a patch's grid, an ablation's effect, an attribution's score),
# so that their mean over lines means something (render.jsonout.mean_document)
MEANS = ("dla", "lens", "patch", "ablate", "attribute")


def main(command, args: list[str], context: RunContext):
    """command.main(args) with the run context, or once per line when args hold --each-line
    FILE (the context then opens each folder once and makes the lines' passes ahead)."""
    options = args[: args.index("--")] if "--" in args else args  # after '--' all is text
    check_once(options, "--weights")
    each = any(a == OPTION or a.startswith(OPTION + "=") for a in options)
    mean = MEAN in options
    if mean and not each:
        raise InputError(f"{MEAN} averages a command's numbers over the lines of "
                         f"{OPTION} FILE: give {OPTION} too")
    if any(a == CHAT or a.startswith(CHAT + "=") for a in options):
        if each:
            raise InputError(f"{CHAT} gives the command one message; {OPTION} one text a "
                             "line: give one of them")
        return _chat(command, args, context)
    if not each:
        return command.main(args=args, prog_name="tinygpt", standalone_mode=False,
                            obj=context)
    source, rest = take_option(args)
    name, sub = _text_command(command, rest, reads_lines, f"{OPTION} runs a command that "
                              "reads a text once per line")
    if mean:
        if name not in MEANS:
            raise InputError(f"{MEAN} averages the JSON numbers of {', '.join(MEANS)} over "
                             f"the lines; {name}'s do not measure one thing from line to line")
        at = rest.index("--") if "--" in rest else len(rest)
        rest = [a for a in rest[:at] if a != MEAN] + rest[at:]
    from ..jobs.ahead import Ahead
    from .streams import text_lines

    opened = {} if context.opened is None else context.opened  # weights once
    # the passes in batches, over the lines as they are read (streams.StreamLines)
    ahead = Ahead(text_lines(source, OPTION), opened)
    each = replace(context, opened=opened, ahead=ahead)
    return _each_line(command, rest, name, sub, ahead.run(), each, mean)


def reads_lines(command) -> bool:
    """Does the command read a text (or a clean and corrupt pair) that a line can give?"""
    names = {p.name for p in command.params}
    return bool(names & set(TEXT_PARAMS)) or set(PAIR_PARAMS) <= names


def reads_text(command) -> bool:
    """Does the command read one text (the place --chat puts its message)?"""
    return any(p.name in TEXT_PARAMS for p in command.params)


def line_texts(command, line: str) -> list[str]:
    """The text argument(s) a line gives: itself, or CLEAN and CORRUPT split at its tab."""
    if any(p.name in TEXT_PARAMS for p in command.params):
        return [line]
    parts = line.split("\t")
    if len(parts) != 2 or not all(p.strip() for p in parts):
        raise InputError("expected CLEAN<tab>CORRUPT, the two texts of a pair")
    return parts


def _text_command(command, rest: list[str], reads, what: str):
    """(name, click command) of the command in `rest`, which must read what `reads(command)`
    asks (a text: reads_text; a text or a pair: reads_lines); else InputError saying `what`
    and naming those that do."""
    name = command_word(command, rest)
    sub = getattr(command, "commands", {}).get(name) if name else None
    if sub is None or not reads(sub):
        readers = sorted(n for n, c in getattr(command, "commands", {}).items() if reads(c))
        raise InputError(f"{what}; {name or 'no command'} does not read one"
                         + (". Commands that do: " + ", ".join(readers) if readers else ""))
    return name, sub


def _chat(command, args: list[str], context: RunContext) -> int:
    """--chat MESSAGE: the message rendered in the folder's chat template (chat.py) is the
    command's text, in the text argument's place as --each-line puts a line; the run's
    context says so, and the folder's <bos> is not added to it again."""
    from ..transformer.chat import prompt

    message, rest = take_option(args, CHAT, "the user's message, e.g. --chat \"Hi!\"")
    if message.startswith("--"):  # `--chat --weights DIR`: the message was left out
        raise InputError(f"{CHAT} needs the user's message, not {message}; a message that "
                         f"starts with '--' is written {CHAT}=MESSAGE")
    name, sub = _text_command(command, rest, reads_text, f"{CHAT} gives its message to a "
                              "command that reads a text")
    at = rest.index(name) + 1
    options, before, after = split_arguments(sub, rest[at:])
    if _value(options, "--last") is not None:  # its cut would drop the template's opening
        raise InputError(f"--last cannot cut a {CHAT} text: it would drop the chat template's "
                         "opening (its <bos>, the turn's header); give a shorter message")
    others = [p for p in sub.params if p.param_type_name == "argument"]
    if len(before) + len(after) >= len(others):  # the text given too: it would be one more
        raise InputError(f"give the text once: as the argument, or as {CHAT}'s message")
    weights = _value(options, "--weights") or _value(rest[:at], "--weights") or context.weights
    # the folder read once, for the template and the command (Gemma 3's 33 MB tokenizer
    # takes 0.7 s to read)
    opened = {} if context.opened is None else context.opened
    text = prompt(weights, message, opened)
    return command.main(args=[*rest[:at], *options, "--", *before, text, *after],
                        prog_name="tinygpt", standalone_mode=False,
                        obj=replace(context, chat=True, opened=opened))


def _value(options: list[str], name: str) -> str | None:
    """The value of option `name` among the option words, as given; None if absent."""
    for i, a in enumerate(options):
        if a == name and i + 1 < len(options):
            return options[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def _each_line(command, rest: list[str], name: str, sub, lines, context: RunContext,
               mean: bool = False) -> int:
    from rich.text import Text

    from ..render.jsonout import emit, emit_record, mean_document
    from ..render.quick_table import print_line
    from ..render.text import show_text
    from .common import stdout
    from .exits import USAGE, error

    as_json = "--json" in rest or mean  # --mean: the lines' documents, averaged
    code = bad = 0
    at = rest.index(name) + 1
    options, before, after = split_arguments(sub, rest[at:])
    if mean and "--json" not in options:
        options.append("--json")
    documents = []
    for number, line in lines:
        try:
            # the line goes where the text argument goes: last for most, first for
            # `trace TEXT PATH`; both of a pair's texts for patch
            argv = [*rest[:at], *numbered_save(options, number), "--", *before,
                    *line_texts(sub, line), *after]
            if as_json:
                buf = io.StringIO()
                with contextlib.redirect_stdout(buf):
                    code = command.main(args=argv, prog_name="tinygpt", standalone_mode=False,
                                        obj=context)
                printed = [x for x in buf.getvalue().splitlines() if x.strip()]
                if mean:
                    documents += [json.loads(x) for x in printed]
                else:
                    emit_record(number, line, printed)
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
    if mean and documents:
        emit(mean_document(name, documents))
    return bad or code


def numbered(path: str, number: int) -> str:
    """The picture of line `number` of --each-line --save PATH: x.svg -> x-001.svg (the
    number before the extension, so the format stays the one asked for; three digits at
    least, so the first thousand lines list in order)."""
    from pathlib import Path

    p = Path(path)
    return str(p.with_name(f"{p.stem}-{number:03d}{p.suffix}"))


def numbered_save(options: list[str], number: int) -> list[str]:
    """The option words with --save's file numbered for this line (numbered): each line's
    picture is a file of its own, never the last one's overwritten."""
    out, words = [], iter(options)
    for word in words:
        if word == "--save":
            out += [word, numbered(next(words, ""), number)]
        elif word.startswith("--save="):
            out.append("--save=" + numbered(word.split("=", 1)[1], number))
        else:
            out.append(word)
    return out


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
    place = max(i for i, n in enumerate(arguments) if n in (*TEXT_PARAMS, "text_b", "clean"))
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


def command_word(group, args: list[str]) -> str | None:
    """The command's name in args: the first word that is not an option of the group or the
    value of one (`tinygpt --weights DIR probs`: probs, not DIR)."""
    takes_value = {o for p in group.params if not getattr(p, "is_flag", True) for o in p.opts}
    words = iter(args)
    for a in words:
        if a in takes_value:
            next(words, None)
        elif not a.startswith("-"):
            return a
    return None


def check_once(options: list[str], name: str) -> None:
    """An option of one value given twice (`--weights A probs --weights B`: click keeps the
    last without a word, even when the first names no folder) is refused, naming both."""
    values = [a[len(name) + 1:] if a.startswith(name + "=") else
              (options[i + 1] if i + 1 < len(options) else None)
              for i, a in enumerate(options) if a == name or a.startswith(name + "=")]
    values = [v for v in values if v is not None]  # a value missing is click's to say
    if len(values) > 1:
        shown = " and ".join(f"{name} {v}" for v in values[:2])
        raise InputError(f"{name} is given twice ({shown}): give it once")
