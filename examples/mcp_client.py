"""An agent's side of `tinygpt mcp`, with the MCP SDK's own client: start the server, list its
tools, call one. Run from the repository root: python examples/mcp_client.py"""

import json
import sys

import anyio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

SERVER = StdioServerParameters(command=sys.executable, args=["-m", "tinygpt_cli", "mcp"])


async def main() -> None:
    async with stdio_client(SERVER) as (read, write), ClientSession(read, write) as client:
        await client.initialize()
        tools = (await client.list_tools()).tools
        print(len(tools), "tools:", " ".join(t.name for t in tools[:12]), "...")
        dla = next(t for t in tools if t.name == "dla")
        print("dla takes:", ", ".join(dla.input_schema["properties"]))
        result = await client.call_tool("dla", {"text": "Lily wanted to play with her",
                                                "target": " toys", "vs": " mom"})
        doc = json.loads(result.content[0].text)  # what `tinygpt dla ... --json` prints
        print("logit difference", round(doc["total"], 4), "from", len(doc["labels"]), "parts")


anyio.run(main)
