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
next calls. The commands that run for minutes or write files are not tools, by the rule the
command table declares for each (commands.EFFECTS; `tinygpt mcp --list` and the server's
instructions say why). A path argument is read only inside the client's roots (the MCP roots
capability) or a folder of `tinygpt mcp --allow DIR`; a call whose client has gone or
cancelled it is stopped in its thread (Job.cancel).
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import threading
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from .. import __version__
from ..cli import entry
from ..cli.context import RunContext
from ..errors import InputError
from ..storage.locations import _shipped_named
from . import calls
from .commands import EFFECTS

NAME = "tinygpt"


def tool_name(command: str) -> str:
    return command.replace(" ", "-")


def left_out() -> dict[str, str]:
    """{command: why} of the commands not served: those that write files or run for minutes,
    as the command table declares them (commands.EFFECTS)."""

    return {name: e.why for name, e in EFFECTS.items() if e.writes_files or e.long_running}


def options_left_out() -> dict[tuple[str, str], str]:
    """{(command, option): why} of the options that write, left out of a served command."""

    return {(name, word): why for name, e in EFFECTS.items() for word, why in e.options_left_out}


def tools() -> dict[str, tuple[str, Any, list[calls.Param]]]:
    """tool name -> (command, its click command, the parameters a tool takes); the commands
    without --json are not tools (they print no document)."""
    gone, options = left_out(), options_left_out()
    out = {}
    for name, command in calls.commands().items():
        every = calls.parameters(command)
        if name in gone or not any(p.name == "as_json" for p in every):
            continue
        params = [p for p in every if p.name not in calls.VIEW_ONLY
                  and (name, p.word) not in options]
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
        prop["description"] = p.help + (READ_ONLY_INSIDE if p.path else "")
        properties[p.word] = prop
    return {"type": "object", "properties": properties,
            "required": [p.word for p in params if p.required],
            "additionalProperties": False}


WEIGHTS = ("weights", "weights_b")  # a folder, a shipped model's name, or a hub id
READ_ONLY_INSIDE = " (read only inside the client's roots or a folder of `tinygpt mcp --allow`)"


def description(command) -> str:
    help_text = (command.help or "").replace("\b\n", "").strip()
    return f"{help_text}\n\nReturns what `tinygpt ... --json` prints: one JSON document."


def left_out_text() -> str:
    lines = [f"- {tool_name(c)}: {why}" for c, why in left_out().items()]
    lines += [f"- option {o} of {c}: {why}" for (c, o), why in options_left_out().items()]
    return "\n".join(lines)


def outside(value: str, folders: list[Path]) -> Path | None:
    """The file or folder a path argument names (relative: to this process's folder, where the
    command reads it; links followed), when it is inside none of `folders`; None when inside."""

    where = Path(os.path.realpath(value))
    for folder in folders:
        root = Path(os.path.realpath(folder))
        if where == root or root in where.parents:
            return None
    return where


def file_rule(folders: list[Path]) -> str:
    said = ", ".join(str(f) for f in folders) or "none"
    return (f"a file argument is read only inside the client's roots or the folders given to "
            f"`tinygpt mcp --allow DIR` (here: {said})")


JSON = "--json"  # every call's: the server returns the command's document


class Cancelled(BaseException):
    """Raised inside a call's thread when its client has gone or cancelled it: a
    BaseException, so that no command's `except Exception` takes it for its own error."""


class Caller:
    """Runs one tool call at a time as its command line, --json, in this process; a path
    argument only inside the folders the call may read."""

    def __init__(self, weights=None, allow: list[Path] | tuple = ()):
        self.weights, self.opened, self.allow = weights, {}, [Path(a) for a in allow]
        self.lock = threading.Lock()  # the standard streams are the process's: one at a time
        self.tools = tools()

    def call(self, tool: str, arguments: dict | None, roots: list[Path] = ()) -> tuple[str, bool]:
        """(the text the command's --json prints, False), or (its `error: ...` line, True).
        A path argument must name something inside `roots` (the client's) or the folders of
        --allow."""

        if tool not in self.tools:
            gone = left_out()
            why = gone.get(tool.replace("-", " "), gone.get(tool))
            return (f"error: {tool} is not a tool here" + (f": it {why}" if why else "")
                    + f"; the tools are {', '.join(self.tools)}", True)
        name, _, params = self.tools[tool]
        if arguments is not None and not isinstance(arguments, dict):
            return f"error: {tool} takes an object of arguments, not {calls.shown(arguments)}", \
                True
        by_word = {p.word: p.name for p in params}
        given = {by_word.get(k, k): v for k, v in (arguments or {}).items()}
        try:  # the tool's own arguments only: --json is how the server runs every call
            args = calls.argv(name, params, given)
            self.check_paths(name, params, calls.checked(name, params, given),
                             [*roots, *self.allow])
        except InputError as e:
            return f"error: {e}", True
        args.insert(len(name.split()), JSON)  # after the command's words
        out, err = io.StringIO(), io.StringIO()
        with self.lock, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                entry.run(args, context=RunContext(weights=self.weights, opened=self.opened))
                code = 0
            except SystemExit as e:
                code = e.code or 0
        errors = [line for line in err.getvalue().splitlines() if line.startswith("error: ")]
        if code:
            return "\n".join(errors) or f"error: {name} ended with exit code {code}", True
        return out.getvalue(), False

    @staticmethod
    def check_paths(name: str, params: list[calls.Param], given: dict, folders: list[Path]):
        """InputError for a path argument outside every folder: an agent's instructions may
        come from untrusted text, and a tool that reads any file would hand it over."""

        for p in params:
            if not p.path or p.name not in given:
                continue
            for value in given[p.name] if p.multiple else [given[p.name]]:
                path = value.split("#")[0] if "FILE[#" in (p.metavar or "") else value
                if p.name in WEIGHTS:  # read as --weights reads it: ~, a shipped name, a hub id
                    path = str(Path(path).expanduser())
                    if not (Path(path).exists() or Path(path).is_symlink()):
                        if _shipped_named(value) is not None:
                            continue  # the package's own lesson models
                        raise InputError(f"{name}: {p.word} {value} is not a folder here; a hub "
                                         "model is not fetched through MCP (that downloads "
                                         "into the hub cache): fetch it in a shell")
                where = outside(path, folders)
                if where is not None:
                    raise InputError(f"{name}: {p.word} {where} is outside the folders this "
                                     f"server may read: {file_rule(folders)}")


class Job:
    """One call run in a worker thread, which `cancel` ends at its next step (Cancelled,
    raised in that thread): a call whose client has gone stops, and writes nothing after."""

    def __init__(self, caller: Caller, tool: str, arguments, roots: list[Path]):
        self.caller, self.tool, self.arguments, self.roots = caller, tool, arguments, roots
        self.state = threading.Lock()
        self.thread: int | None = None
        self.done = False

    def run(self) -> tuple[str, bool]:
        try:
            try:
                with self.state:
                    self.thread = threading.get_ident()
                return self.caller.call(self.tool, self.arguments, self.roots)
            finally:
                with self.state:
                    self.done = True
        except Cancelled:
            return f"error: {self.tool} was cancelled", True

    def cancel(self) -> None:

        with self.state:  # never once run has returned: the thread is anyio's, and reused
            if self.thread is not None and not self.done:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.thread),
                                                           ctypes.py_object(Cancelled))


async def client_roots(session) -> list[Path]:
    """The folders the client declares (the MCP roots capability; file:// URIs), or none."""

    import mcp_types as types

    if not session.check_client_capability(types.ClientCapabilities(roots=types.RootsCapability())):
        return []
    with warnings.catch_warnings():  # the SDK marks roots deprecated; the clients have them
        warnings.simplefilter("ignore")
        listed = await session.list_roots()
    return [Path(unquote(urlparse(str(r.uri)).path)) for r in listed.roots
            if str(r.uri).startswith("file://")]


def server(weights=None, allow: list[Path] | tuple = ()):
    """The MCP server (mcp.server.lowlevel.Server) of every tool."""
    import anyio
    import mcp_types as types
    from mcp.server.lowlevel import Server


    caller = Caller(weights, allow)
    listed = [types.Tool(name=t, description=description(command),
                         input_schema=input_schema(params))
              for t, (_, command, params) in caller.tools.items()]

    async def list_tools(ctx, params) -> types.ListToolsResult:  # noqa: ARG001
        return types.ListToolsResult(tools=listed)

    async def call_tool(ctx, params) -> types.CallToolResult:
        job = Job(caller, params.name, params.arguments, await client_roots(ctx.session))
        try:
            text, failed = await anyio.to_thread.run_sync(job.run, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            job.cancel()  # the client has gone, or cancelled the call
            raise
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                    is_error=failed)

    instructions = ("tinygpt: a microscope for small language models. Each tool is a "
                    "command of the tinygpt command line; its result is the command's --json "
                    "document. A file argument is read only inside the client's roots or the "
                    "folders the server was given (--allow). Not served, and why:\n"
                    + left_out_text())
    return Server(NAME, version=__version__, instructions=instructions,
                  on_list_tools=list_tools, on_call_tool=call_tool)


def serve(weights=None, allow: list[Path] | tuple = ()) -> None:
    """Serve over stdin and stdout until the client goes (the SDK points fd 1 at stderr
    meanwhile, so that no stray write reaches the wire)."""
    import anyio
    from mcp.server.stdio import stdio_server

    s = server(weights, allow)

    async def main():
        async with stdio_server() as (read, write):
            await s.run(read, write, s.create_initialization_options())

    anyio.run(main)


def listing() -> tuple[list[dict], dict[str, str]]:
    """(each tool's name and arguments, the commands and options left out: why)."""
    served = [{"name": t, "arguments": [p.word for p in params]}
              for t, (_, _, params) in tools().items()]
    left = {tool_name(c): why for c, why in left_out().items()}
    left.update({f"{tool_name(c)} {o}": why for (c, o), why in options_left_out().items()})
    return served, left
