"""The `tinygpt` application object: its group options, and every command registered in the
order `tinygpt --help` lists them (entry.run runs a command line through it)."""

from __future__ import annotations

from pathlib import Path

import typer

from ..render.text import examples_block
from ..surfaces.commands import LISTED
from .typer_tricks import command_name as _command_name

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
    ctx: typer.Context,
    weights: Path = typer.Option(None, "--weights", help="Weights folder (or hub id "
                                 "ORG/NAME[@REV]) for the command (also accepted after it).",
                                 show_default=False),
    debug: bool = typer.Option(False, "--debug", help="Show the traceback of an unexpected "
                               "error (accepted anywhere on the line; or TINYGPT_DEBUG=1)."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
    threads: int = typer.Option(None, "--threads", min=1, max=1024, show_default=False,
                                help="Threads for the math (default 1, or $TINYGPT_THREADS; "
                                "see README, Threads)."),
    cluster: str = typer.Option(None, "--cluster", metavar="ADDRESS", show_default=False,
                                help="Run the corpus-wide work (why's index and query, neurons "
                                "--data, means, sae train, lens --fit/--evaluate, score --file) "
                                "on the Dask scheduler at ADDRESS, or on a LocalCluster of "
                                "this machine's cores with 'local' (or $TINYGPT_CLUSTER; see "
                                "README, Past one machine)."),
    cluster_wait: float = typer.Option(None, "--cluster-wait", metavar="SECONDS",
                                       show_default=False, help="The longest wait for the "
                                       "cluster's workers or a job's next result before the "
                                       "command ends with one error line (default 300, or "
                                       "$TINYGPT_CLUSTER_WAIT)."),
) -> None:
    """A command-line microscope for a small GPT-2-style language model.

    Every value one forward pass computes can be printed by name, as a table for a person or
    with --json for programs.
    """
    from dataclasses import replace

    from ..errors import InputError
    from ..jobs import threads as pools
    from .context import RunContext

    line = ctx.obj if ctx.obj is not None else RunContext()  # the entry point's
    ctx.obj = replace(line, weights=weights) if weights is not None else line
    if cluster is not None:
        ctx.obj = replace(ctx.obj, cluster=cluster)
    if cluster_wait is not None:
        ctx.obj = replace(ctx.obj, cluster_wait=cluster_wait)
    try:
        n = pools.chosen(threads)
    except ValueError as e:
        raise InputError(str(e)) from None
    if n is not None:
        pools.use(n)


# Every command with the module of cli/ that defines it (a command line names one command, and
# only its module is imported), and the line `tinygpt --help` lists for it (the listing
# imports none of them), in the order it lists them.
COMMANDS = {name: module for name, (module, _) in LISTED.items()}
SUMMARIES = {name: line for name, (_, line) in LISTED.items()}
ORDER = list(COMMANDS)


def _register(name: str | None = None) -> None:
    """Import the module of command `name` (or of every command), which registers its
    commands on import, and make them ready to be built (only `name`, when it is given: the
    others of its module are not built either)."""
    import importlib

    for module in [COMMANDS[name]] if name else dict.fromkeys(COMMANDS.values()):
        importlib.import_module(f"{__package__}.{module}")

    def rank(command) -> int:
        name = _command_name(command)
        return ORDER.index(name) if name in ORDER else len(ORDER)

    app.registered_commands.sort(key=rank)
    # groups too: in the table's order, not that of the modules this process imported first
    app.registered_groups.sort(key=lambda group: ORDER.index(group.name)
                               if group.name in ORDER else len(ORDER))
    from .steering import with_context

    for group in app.registered_groups:  # `tinygpt sae train`: a group's commands (built
        for command in group.typer_instance.registered_commands:  # with any command)
            command.callback = with_context(command.callback,
                                            f"{group.name} {_command_name(command)}")
    for command in app.registered_commands:
        # every registered command takes its run context: typer builds all of them, so one a
        # module imported by an earlier command line of this process registered, left
        # unwrapped, breaks this one (with_context is idempotent)
        if command.callback:  # its run context first, and the steering options if it steers
            command.callback = with_context(command.callback, _command_name(command))
        if name and _command_name(command) != name:
            continue
        # Each "Example:" line of a docstring becomes a line of its own in --help (click
        # would otherwise join and rewrap them mid-command).
        doc = command.help or (command.callback.__doc__ if command.callback else None)
        if doc:
            command.help = examples_block(doc)
