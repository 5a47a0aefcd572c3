"""`tinygpt mcp`: the inspection and analysis commands as MCP tools, served over stdio with the
official SDK (the `mcp` extra).

Every tool is a command of the one registry (calls.commands), named as the command (`sae
feature` is `sae-feature`: a tool's name has no spaces), its input schema made from the
command's arguments and options (calls.parameters: `text`, `layer`, `head`, `all_heads`, each
option by its word as --help spells it; the options
about a terminal or a file, --json, --save, --force, --quiet, --full, left out), and its
result the text the command's --json prints, made by the command line's own code in this
process (entry.run), so that it is the CLI's document byte for byte. A bad input is the
command line's one `error: ...` line, as an error result. The models opened stay open for the
next calls. The commands that run for minutes or write files are not tools (LEFT_OUT says
why; `tinygpt mcp --list` and the server's instructions list them).
"""

from __future__ import annotations

import contextlib
import io
import threading
from typing import Any

from . import calls

NAME = "tinygpt"

# command: why it is not a tool
LEFT_OUT = {
    "why": "builds a gradient index of every training window the first time it is asked "
           "(minutes, on every core); run it in a shell",
    "means": "averages over the whole validation text and writes a file",
    "train-tokenizer": "trains a tokenizer and writes it",
    "train": "trains a model (minutes to hours) and writes a weights folder",
    "model-card": "writes files into a weights folder",
    "sae train": "trains a sparse autoencoder (minutes) and writes it",
    "sae export": "writes an SAELens folder",
    "mcp": "is this server",
}
# (command, option): why the option is not in the tool's schema
OPTIONS_LEFT_OUT = {
    ("lens", "fit"): "lens --fit trains a tuned lens and writes it",
    ("steer", "out"): "steer --out writes the direction to a file",
    ("probe", "out"): "probe --out writes the direction to a file",
}


def tool_name(command: str) -> str:
    return command.replace(" ", "-")


def tools() -> dict[str, tuple[str, Any, list[calls.Param]]]:
    """tool name -> (command, its click command, the parameters a tool takes); the commands
    without --json are not tools (they print no document)."""
    out = {}
    for name, command in calls.commands().items():
        every = calls.parameters(command)
        if name in LEFT_OUT or not any(p.name == "as_json" for p in every):
            continue
        params = [p for p in every if p.name not in calls.VIEW_ONLY
                  and (name, p.name) not in OPTIONS_LEFT_OUT]
        out[tool_name(name)] = (name, command, params)
    return out


def input_schema(params: list[calls.Param]) -> dict:
    """The JSON Schema of a tool's arguments: one property per argument and option, by its
    Python name, typed, with its bounds, default and help."""
    properties = {}
    for p in params:
        one: dict[str, Any] = {"type": p.kind}
        if p.minimum is not None:
            one["minimum"] = p.minimum
        if p.maximum is not None:
            one["maximum"] = p.maximum
        prop = {"type": "array", "items": one} if p.multiple else dict(one)
        if p.default not in (None, [], ()):
            prop["default"] = p.default
        prop["description"] = p.help
        properties[p.word] = prop
    return {"type": "object", "properties": properties,
            "required": [p.word for p in params if p.required],
            "additionalProperties": False}


def description(command) -> str:
    help_text = (command.help or "").replace("\b\n", "").strip()
    return f"{help_text}\n\nReturns what `tinygpt ... --json` prints: one JSON document."


def left_out_text() -> str:
    lines = [f"- {tool_name(c)}: {why}" for c, why in LEFT_OUT.items()]
    lines += [f"- option {o} of {c}: {why}" for (c, o), why in OPTIONS_LEFT_OUT.items()]
    return "\n".join(lines)


JSON = "--json"  # every call's: the server returns the command's document


class Caller:
    """Runs one tool call at a time as its command line, --json, in this process."""

    def __init__(self, weights=None):
        self.weights, self.opened = weights, {}
        self.lock = threading.Lock()  # the standard streams are the process's: one at a time
        self.tools = tools()

    def call(self, tool: str, arguments: dict | None) -> tuple[str, bool]:
        """(the text the command's --json prints, False), or (its `error: ...` line, True)."""
        from .context import RunContext
        from .entry import run
        from .errors import InputError

        if tool not in self.tools:
            why = LEFT_OUT.get(tool.replace("-", " "), LEFT_OUT.get(tool))
            return (f"error: {tool} is not a tool here" + (f": it {why}" if why else "")
                    + f"; the tools are {', '.join(self.tools)}", True)
        name, _, params = self.tools[tool]
        by_word = {p.word: p.name for p in params}
        given = {by_word.get(k, k): v for k, v in (arguments or {}).items()}
        try:  # the tool's own arguments only: --json is how the server runs every call
            args = calls.argv(name, params, given)
        except InputError as e:
            return f"error: {e}", True
        args.insert(len(name.split()), JSON)  # after the command's words
        out, err = io.StringIO(), io.StringIO()
        with self.lock, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                run(args, context=RunContext(weights=self.weights, opened=self.opened))
                code = 0
            except SystemExit as e:
                code = e.code or 0
        errors = [line for line in err.getvalue().splitlines() if line.startswith("error: ")]
        if code:
            return "\n".join(errors) or f"error: {name} ended with exit code {code}", True
        return out.getvalue(), False


def server(weights=None):
    """The MCP server (mcp.server.lowlevel.Server) of every tool."""
    import anyio
    import mcp_types as types
    from mcp.server.lowlevel import Server

    from . import __version__

    caller = Caller(weights)
    listed = [types.Tool(name=t, description=description(command),
                         input_schema=input_schema(params))
              for t, (_, command, params) in caller.tools.items()]

    async def list_tools(ctx, params) -> types.ListToolsResult:  # noqa: ARG001
        return types.ListToolsResult(tools=listed)

    async def call_tool(ctx, params) -> types.CallToolResult:  # noqa: ARG001
        text, failed = await anyio.to_thread.run_sync(caller.call, params.name,
                                                      params.arguments)
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                    is_error=failed)

    instructions = ("tinygpt: a microscope for small language models. Each tool is a "
                    "command of the tinygpt command line; its result is the command's --json "
                    "document. Not served, and why:\n" + left_out_text())
    return Server(NAME, version=__version__, instructions=instructions,
                  on_list_tools=list_tools, on_call_tool=call_tool)


def serve(weights=None) -> None:
    """Serve over stdin and stdout until the client goes (the SDK points fd 1 at stderr
    meanwhile, so that no stray write reaches the wire)."""
    import anyio
    from mcp.server.stdio import stdio_server

    s = server(weights)

    async def main():
        async with stdio_server() as (read, write):
            await s.run(read, write, s.create_initialization_options())

    anyio.run(main)


def listing() -> tuple[list[dict], dict[str, str]]:
    """(each tool's name and arguments, the commands and options left out: why)."""
    served = [{"name": t, "arguments": [p.word for p in params]}
              for t, (_, _, params) in tools().items()]
    left = {tool_name(c): why for c, why in LEFT_OUT.items()}
    left.update({f"{tool_name(c)} {o}": why for (c, o), why in OPTIONS_LEFT_OUT.items()})
    return served, left
