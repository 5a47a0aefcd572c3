"""The console script's code, from the command line to the exit code.

`main` is the first code: Ctrl-C is caught from here on, before the slow imports. Python
turns Ctrl-C into a KeyboardInterrupt wherever it lands; during the imports of numpy, rich
and typer that would print a traceback. Until `run` takes over (and turns the interrupt into
exit 130 itself, so that `finally` blocks still run), a Ctrl-C ends the process at once with
exit 130 on a fresh line.

`run` runs one command line in this process (cli.main is it): the standard streams guarded,
the command that cli.app registers built and run (once per line with --each-line), and
whatever it raises turned into the output contract's one `error: ...` line and exit code.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import sys

from ..surfaces.commands import chosen_command
from .exits import FAULT, INTERRUPTED, OK, USAGE, error, fresh_line


def _interrupted_at_start(signum, frame) -> None:  # noqa: ARG001 - the signal handler's signature
    fresh_line()
    os._exit(INTERRUPTED)


def main(argv: list[str] | None = None) -> None:
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupted_at_start)
    try:
        from ..jobs.threads import use_default

        use_default()  # before NumPy loads: BLAS reads its thread count only then
        from .context import RunContext

        run(argv, RunContext(own_process=True))  # the slow imports first
    except KeyboardInterrupt:  # in the instant between two handlers
        fresh_line()
        sys.exit(INTERRUPTED)
    except SystemExit as e:  # how run ends, its output written
        if argv is not None:  # called with arguments, from a program: it gets SystemExit
            raise
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        exit_now(e)  # the console script
    finally:
        # Shutting down: a second Ctrl-C now must not print a traceback either.
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def exit_now(e: SystemExit) -> None:
    """End the process with e's code without tearing the interpreter down: freeing every
    module and object of NumPy, Rich and Typer one by one costs more CPU than most of what a
    short command does (benchmarks/results.md). What the shutdown does that
    anyone sees is done first: the atexit functions, and the flush of stdout and stderr (a
    flush that fails ends with 120, as Python's own does). While another thread still runs
    (which the shutdown would wait for), or with a code that is not a number, e goes on to
    the usual shutdown."""
    import atexit
    import threading

    code = 0 if e.code is None else e.code
    waited_for = [t for t in threading.enumerate()
                  if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)  # CPython's own, as it exits
    if not isinstance(code, int) or waited_for or run_exitfuncs is None or not _flushed():
        raise e
    run_exitfuncs()
    os._exit(code if _flushed() else 120)


def _flushed() -> bool:
    try:
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        return False
    return True


def _text_like(args: list[str]) -> str | None:
    """The first word that click read as options but looks like a text: `-hello`,
    `-5 degrees` (a mistyped single letter such as `-x` is only an unknown option)."""
    words = args[: args.index("--")] if "--" in args else args
    return next((w for w in words if w.startswith("-") and not w.startswith("--")
                 and (len(w) > 2 or " " in w)), None)


def _hint(e, args: list[str] = (), root=None) -> str:
    """What a usage error adds: where the help is, and how a text starting with '-' is
    given."""
    from .typer_tricks import click_errors

    # the whole command path: `tinygpt sae train`, not `tinygpt train`
    command = (" ".join(["tinygpt", *_names(e.ctx)[1:]]) if e.ctx and e.ctx.parent
               else _command_in(root, list(args)) if e.ctx is None else None)
    see = f"see '{command or 'tinygpt'} --help'"
    name = getattr(e, "option_name", "") or ""
    text = _text_like(list(args))
    if isinstance(e, click_errors.NoSuchOption) and not re.fullmatch(r"--[A-Za-z][\w-]*", name) \
            and text is not None:
        # `tinygpt encode -hello` reads as options; the text itself goes after `--`.
        # (`--layr` is a misspelt option: click's "Possible options" is the help it needs.)
        import shlex

        shown = "tinygpt " + shlex.join(_text_last(list(args), text))
        return f" ({see}; a text that starts with '-' goes after '--': {shown})"
    card = _card_named(e)
    if card is not None:
        return f" (card {card.number}, {card.title}, is `{card.command}`; {see})"
    return f" ({see})"


def _card_named(e):
    """The seed page's card a mistyped command names by its title (`tinygpt softmax`: card 10,
    whose command is probs), or None."""
    m = re.match(r"No such command '(.+?)'\.", getattr(e, "message", "") or "")
    if m is None:
        return None
    from ..transformer.page import CARDS

    word = re.sub(r"[\s_-]+", " ", m[1].strip().lower())
    return next((c for c in CARDS if c.title.lower() == word), None)


def _text_last(args: list[str], text: str) -> list[str]:
    """The user's words with `text` moved after '--' and every other word kept where it was:
    `probs '-5 apples' --top 2` -> `probs --top 2 -- '-5 apples'`."""
    rest = list(args)
    rest.remove(text)
    if "--" in rest:  # texts already there: this one goes first among them
        at = rest.index("--") + 1
        return [*rest[:at], text, *rest[at:]]
    return [*rest, "--", text]


def _command_in(root, args: list[str]) -> str | None:
    """The command path the words name, for an error click raised before it made the
    command's own context (an option's value missing at the end: `attn TEXT --layer`): past
    each group's own options (and their values), words that name its commands."""
    group, names, words = root, [], iter(args)
    for word in words:
        if word.startswith("-"):
            option = next((p for p in getattr(group, "params", ()) if word in p.opts), None)
            if option is not None and not option.is_flag and "=" not in word:
                next(words, None)  # its value
            continue
        sub = getattr(group, "commands", {}).get(word)
        if sub is None:
            break
        group, names = sub, [*names, word]
    return " ".join(["tinygpt", *names]) if names else None


def _names(ctx) -> list[str]:
    """The command names from the root down to ctx (click's own command_path spells the
    root by how it was run: python -m, a script path)."""
    return [*(_names(ctx.parent) if ctx.parent else []), ctx.info_name or ""]


def _completing() -> bool:
    """Is the shell asking for completions (whose words are in the environment, not in args)?
    Then the commands' options are needed too."""
    return any(k.startswith("_") and k.endswith("_COMPLETE") for k in os.environ)


def run(argv: list[str] | None = None, context=None) -> None:
    """Run one command line in this process (cli.main): bad input ends with one `error: ...`
    line and exit 2, faults with exit 1, a reader gone (`| head`) quietly. `context`: the
    run context it runs with (context.RunContext; a fresh one by default), all the state a
    command reads besides its arguments."""
    from . import streams
    from .context import RunContext

    streams.guard_streams()
    args = list(sys.argv[1:] if argv is None else argv)
    end = args.index("--") if "--" in args else len(args)
    debug = "--debug" in args[:end] or os.environ.get("TINYGPT_DEBUG") == "1"
    args = [a for i, a in enumerate(args) if a != "--debug" or i > end]
    try:
        # cheap imports only: NumPy, Rich and the model wait for the command that needs them
        import typer

        from . import batch
        from .app import SUMMARIES, _register, app
        from .typer_tricks import click_command, click_errors, plain_type_names, quick_coercion

        name = chosen_command(args)
        # `tinygpt --help` lists each command by name and line: no command module is imported
        listing = args in ([], ["--help"], ["-h"]) and not _completing()
        if not listing:
            _register(name)
        quick_coercion()
        plain_type_names()
        command = click_command(app, name, listing=SUMMARIES if listing else None)
        if signal.getsignal(signal.SIGINT) not in (signal.SIG_IGN, signal.default_int_handler):
            # From here a Ctrl-C is a KeyboardInterrupt again, so that `finally` blocks run.
            with contextlib.suppress(ValueError):  # not the main thread (mcp_server's calls),
                signal.signal(signal.SIGINT, signal.default_int_handler)  # whose handler stays
    except KeyboardInterrupt:
        fresh_line()
        sys.exit(INTERRUPTED)
    try:
        before = streams.identity(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        before = None
    try:
        # the command, or once per line with --each-line
        code = batch.main(command, args, context if context is not None else RunContext())
        if code == INTERRUPTED:  # typer turns Ctrl-C into exit 130 itself
            fresh_line()
    except SystemExit:
        if not streams.stdout_broken(before):
            raise
        code = streams.reader_gone()  # click's or Rich's broken-pipe handler came first
    except getattr(click_errors, "NoArgsIsHelpError", ()) as e:
        # click >= 8.2 raises this to show help for a bare group; that is not an error.
        typer.echo(e.ctx.get_help())
        code = OK
    except click_errors.UsageError as e:
        if debug:
            raise
        code = error(e.format_message() + _hint(e, args, command), USAGE)
    except (typer.Abort, KeyboardInterrupt):
        fresh_line()
        code = INTERRUPTED
    except Exception as e:  # noqa: BLE001 - the contract: no traceback without --debug
        code = failed(e, debug)
    streams.finish(code if isinstance(code, int) else 0)


def too_many_digits(e: Exception) -> bool:
    """Python's own refusal to read an integer string of over 4,300 digits (a guard against
    slow conversions), raised as a plain ValueError by int() wherever the tool reads one."""
    return type(e) is ValueError and "integer string conversion" in str(e)


def failed(e: Exception, debug: bool) -> int:
    """The exit code a command's exception ends with, its error line said; with `debug` the
    exception goes on (its traceback) instead, unless it is a reader gone (`| head`)."""
    from ..errors import InputError, WeightsError  # PathError is an InputError
    from . import streams

    if isinstance(e, BrokenPipeError) or (isinstance(e, OSError) and e.errno == errno.EPIPE):
        return streams.reader_gone()
    if debug:
        raise e
    if isinstance(e, InputError):
        return error(str(e), USAGE)
    if isinstance(e, WeightsError):
        return error(str(e), FAULT)
    if isinstance(e, OSError):
        if not e.filename and streams.stdout_failed():  # `> /dev/full`
            return error(f"cannot write to standard output: {e.strerror or e}", FAULT)
        where = f": {e.filename}" if e.filename else ""
        return error(f"{e.strerror or e}{where}", FAULT)
    if too_many_digits(e):  # wherever a number is read: an option, a path, an id
        return error("a number of more than 4,300 digits: no option, index or token id is "
                     "anywhere near that large", USAGE)
    return error(f"{type(e).__name__}: {e} (run again with --debug for the traceback)", FAULT)
