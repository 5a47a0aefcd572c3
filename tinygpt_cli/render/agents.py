"""`tinygpt mcp --list`: the MCP tools, their arguments, and the commands left out with why."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..escapes import escape_line


def tools_view(tools: list[dict], left_out: dict[str, str]):

    t = Table(box=None, header_style="bold dim", pad_edge=False)
    t.add_column("tool", style="cyan", no_wrap=True)
    t.add_column("arguments")
    for tool in tools:
        t.add_row(tool["name"], escape_line(", ".join(tool["arguments"])))
    gone = Table(box=None, header_style="bold dim", pad_edge=False)
    gone.add_column("left out", style="cyan", no_wrap=True)
    gone.add_column("why")
    for name, why in left_out.items():
        gone.add_row(name, escape_line(why))
    return Group(Text(f"{len(tools)} tools, each returning its command's --json document",
                      style="bold"), t, Text(""), gone)
