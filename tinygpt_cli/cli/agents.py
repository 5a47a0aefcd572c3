"""For agents: `tinygpt mcp` serves the commands as MCP tools over stdio (mcp_server.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from .app import app
from .common import JSON, WEIGHTS, InputError, present

if TYPE_CHECKING:
    from .context import RunContext

INSTALL = 'pip install "tinygpt-cli[mcp]"'


@app.command()
def mcp(context: RunContext, weights: Path = WEIGHTS,
        list_tools: bool = typer.Option(False, "--list", help="List the tools, and the "
                                        "commands left out with the reason, and exit."),
        allow: list[Path] = typer.Option(None, "--allow", metavar="DIR", help="A folder whose "
                                         "files a tool may read, beside the client's roots "
                                         "(repeat for more)."),
        as_json: bool = JSON):
    """Serve the commands to an agent as MCP tools over stdio (the mcp extra).

    Each tool is a command (its input schema: the command's text, layer, head, ... options);
    its result is the command's --json document. The commands that run for minutes or write
    files (why, train, sae train, ...) are left out; --list says which and why. A file
    argument (score's file, a weights folder, ...) is read only inside the roots the client
    declares or a folder given to --allow. WEIGHTS is the default model of every call.

    Example: tinygpt mcp
    Example: tinygpt mcp --allow ~/texts
    Example: tinygpt mcp --list
    """
    from ..surfaces import mcp_server

    if list_tools:
        from ..render.agents import tools_view

        tools, left = mcp_server.listing()
        return present(context, as_json, lambda: {"tools": tools, "left_out": left},
                       lambda: tools_view(tools, left))
    try:
        import mcp.server.lowlevel  # noqa: F401
    except ImportError:
        raise InputError(f"tinygpt mcp needs the MCP SDK, which is not installed: {INSTALL}") \
            from None
    for folder in allow or ():
        if not folder.is_dir():
            raise InputError(f"--allow {folder}: not a folder")
    mcp_server.serve(weights if weights is not None else context.weights, list(allow or ()))
