"""`tinygpt mcp`: the server started as a child process and spoken to with the MCP SDK's own
client (mcp.client.stdio); each tool's result must be the command line's --json, byte for
byte. Skipped without the `mcp` extra, except the one error line that says to install it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from cli_helpers import TEXT, assert_one_error_line

CALLS = [  # (tool, its arguments, the command line's words)
    ("attn", {"text": TEXT, "layer": 1, "head": -1}, ["attn", TEXT, "--layer", "1", "--head",
                                                      "-1"]),
    ("attn", {"text": TEXT, "all_heads": True, "ablate": ["L0H1", "L1H0"]},
     ["attn", TEXT, "--all-heads", "--ablate", "L0H1", "--ablate", "L1H0"]),
    ("lens", {"text": TEXT, "target": " toys"}, ["lens", TEXT, "--target", " toys"]),
    ("dla", {"text": TEXT, "target": " toys", "vs": " mom", "neurons": True},
     ["dla", TEXT, "--target", " toys", "--vs", " mom", "--neurons"]),
    ("final-norm", {"text": "-5 apples"}, ["final-norm", "--", "-5 apples"]),
]


def run_cli(folder, *words, json_out: bool = True) -> subprocess.CompletedProcess:
    """`tinygpt WORDS[0] --weights FOLDER [--json] WORDS[1:]` in a child process."""
    return subprocess.run([sys.executable, "-m", "tinygpt_cli", words[0], "--weights",
                           str(folder), *(["--json"] if json_out else []), *words[1:]],
                          capture_output=True, text=True, timeout=120)


def session(folder, work):
    """Run `work(client)` against a fresh `tinygpt mcp --weights FOLDER`."""
    anyio = pytest.importorskip("anyio")
    pytest.importorskip("mcp")
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    # the test's own environment, as run_cli's children have it (the SDK's default keeps only
    # HOME, PATH and a few more: without OPENBLAS_CORETYPE, say, the BLAS picks other kernels
    # and the last bit of a float32 can differ from the command line's)
    server = StdioServerParameters(command=sys.executable, env=dict(os.environ),
                                   args=["-m", "tinygpt_cli", "mcp", "--weights", str(folder)])

    async def main():
        async with stdio_client(server) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            return await work(client)

    return anyio.run(main)


@pytest.fixture(scope="module")
def served(tiny):
    """The tools listed, and each call's result, from one server."""
    async def work(client):
        listed = (await client.list_tools()).tools
        results = [await client.call_tool(tool, args) for tool, args, _ in CALLS]
        bad = await client.call_tool("attn", {"text": TEXT, "layer": 9})
        left = await client.call_tool("why", {"text": TEXT})
        no_text = await client.call_tool("attn", {})  # no stdin to read it from
        return listed, results, bad, left, no_text

    return session(tiny.folder, work)


def test_the_tools_are_the_commands_with_their_options(served):
    tools = {t.name: t for t in served[0]}
    assert {"encode", "attn", "final-norm", "lens", "dla", "patch", "circuit", "info",
            "sae-eval", "generate", "trace"} <= set(tools)
    assert not {"why", "train", "sae-train", "sae-export", "means", "train-tokenizer",
                "model-card", "mcp", "graph", "sae-feature"} & set(tools)  # long or writing
    for name in ("steer", "probe"):  # they run, but write no file: --out is not theirs here
        assert "out" not in tools[name].input_schema["properties"]
    schema = tools["attn"].input_schema
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    props = schema["properties"]
    assert props["layer"] == {"type": "integer", "default": 0,
                              "description": "Block index; negative counts from the end."}
    assert props["all_heads"]["type"] == "boolean"
    assert props["ablate"]["type"] == "array" and props["ablate"]["items"] == {"type": "string"}
    assert props["text"]["type"] == "string"
    assert not {"json", "as_json", "save", "force", "quiet", "full"} & set(props)
    assert tools["probs"].input_schema["properties"]["top"]["minimum"] == 1
    assert tools["ablate"].input_schema["properties"]["from"]["type"] == "string"  # --from
    assert "fit" not in tools["lens"].input_schema["properties"]  # lens --fit trains
    assert tools["attn"].description.startswith("Card 5: the T × T attention grid of one head")


@pytest.mark.parametrize("i", range(len(CALLS)), ids=[c[0] for c in CALLS])
def test_a_tools_result_is_the_command_lines_json(served, tiny, i):
    result = served[1][i]
    out = run_cli(tiny.folder, *CALLS[i][2])
    assert out.returncode == 0, out.stderr
    assert not result.is_error
    assert [c.type for c in result.content] == ["text"]
    assert result.content[0].text == out.stdout
    json.loads(result.content[0].text)


def test_bad_input_is_the_command_lines_error_line(served, tiny):
    bad, left, no_text = served[2], served[3], served[4]
    out = run_cli(tiny.folder, "attn", TEXT, "--layer", "9")
    assert bad.is_error and bad.content[0].text + "\n" == out.stderr
    assert no_text.is_error and no_text.content[0].text.startswith("error: the text is empty")
    assert left.is_error
    assert left.content[0].text.startswith("error: why is not a tool here: it builds a gradient "
                                           "index of every training window")


def test_the_listing_says_what_is_left_out_and_why(tiny):
    out = run_cli(tiny.folder, "mcp", "--list")
    doc = json.loads(out.stdout)
    assert doc["left_out"]["train"] == "trains a model (minutes to hours) and writes a " \
                                       "weights folder"
    assert doc["left_out"]["lens fit"] == "lens --fit trains a tuned lens and writes it"
    attn = next(t for t in doc["tools"] if t["name"] == "attn")
    assert attn["arguments"][:6] == ["text", "weights", "ablate", "layer", "head", "all_heads"]


def test_without_the_sdk_one_error_line_says_what_to_install(cli, monkeypatch):
    for name in ("mcp", "mcp.server", "mcp.server.lowlevel"):
        monkeypatch.setitem(sys.modules, name, None)  # import mcp... raises ImportError
    assert_one_error_line(cli("mcp"), 2, 'tinygpt mcp needs the MCP SDK, which is not '
                          'installed: pip install "tinygpt-cli[mcp]"')


def test_a_call_takes_the_tools_arguments_only(tiny):
    # as_json is how the server runs every call, not an argument of the tool: a client's
    # as_json=false was taken silently; and the message missed its full stop
    from tinygpt_cli.surfaces.mcp_server import Caller

    caller = Caller(weights=tiny.folder)
    text, bad = caller.call("attn", {"text": TEXT, "as_json": False})
    assert bad and text.startswith("error: attn takes no argument 'as_json'. It takes: text,")
    assert "as_json" not in text.split("It takes:")[1]
    text, bad = caller.call("steer", {"pos": "a.txt", "neg": "b.txt", "out": "v.safetensors"})
    assert bad and text.startswith("error: steer takes no argument 'out'")
    text, bad = caller.call("attn", {"text": TEXT, "layr": 1})
    assert bad and "did you mean 'layer'? It takes:" in text
    # a JSON number that is not whole, for an integer: not "unable to parse string"
    assert caller.call("attn", {"text": TEXT, "layer": 1.5}) == (
        "error: attn: layer takes a whole number (int), not 1.5", True)
