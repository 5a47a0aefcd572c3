"""`tinygpt mcp` is safe to hand to an agent (issue 53): a tool's arguments are checked against
the command's own types; no command that writes files or runs for minutes is served, by the
rule the command table declares, held here over every command; a file argument is read only
inside the client's roots or a folder of --allow; a call whose client has gone is stopped and
writes nothing. Spoken to with the MCP SDK's own client; skipped without the `mcp` extra."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest
from cli_helpers import TEXT

from tinygpt_cli.surfaces import calls


def session(folder, work, *, allow=(), roots=None, cwd=None, args=None):
    """Run `work(client)` against a fresh `tinygpt mcp --weights FOLDER [--allow DIR]`, from a
    client that declares `roots` (folders) when given."""
    anyio = pytest.importorskip("anyio")
    pytest.importorskip("mcp")
    import mcp_types as types
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    words = args or ["-m", "tinygpt_cli", "mcp", "--weights", str(folder),
                     *[w for a in allow for w in ("--allow", str(a))]]
    server = StdioServerParameters(command=sys.executable, env=dict(os.environ), args=words,
                                   cwd=str(cwd) if cwd else None)

    async def list_roots(context):  # noqa: ARG001
        return types.ListRootsResult(roots=[types.Root(uri=Path(r).resolve().as_uri())
                                            for r in roots])

    async def main():
        callback = {} if roots is None else {"list_roots_callback": list_roots}
        async with stdio_client(server) as (read, write), \
                ClientSession(read, write, **callback) as client:
            await client.initialize()
            return await work(client)

    return anyio.run(main)


def text_of(result) -> str:
    return result.content[0].text


# ------------------------------------------------------------------ the rule, over the table

def test_no_command_that_writes_files_or_runs_for_minutes_is_served():
    # transcoder-train was served (it trains for minutes and writes four files): the hand
    # list of commands left out had missed it
    from tinygpt_cli.surfaces.commands import EFFECTS
    from tinygpt_cli.surfaces.mcp_server import tools

    every = calls.commands()
    served = tools()
    assert set(EFFECTS) <= set(every)  # no rule for a command that is not there
    for name, command in every.items():
        params = {p.word: p for p in calls.parameters(command)}
        effects = EFFECTS.get(name)
        # --force without --save: the command writes over a file of its own choosing
        if "force" in params and "save" not in params:
            assert effects is not None and (effects.writes_files or effects.options_left_out), \
                f"{name} has --force: declare what it writes in commands.EFFECTS"
        shut = effects is not None and (effects.writes_files or effects.long_running)
        tool = name.replace(" ", "-")
        assert (tool in served) == (not shut and "as_json" in {p.name for p in
                                                                calls.parameters(command)}), name
        if effects is not None:
            for word, _ in effects.options_left_out:
                assert word in params, f"{name} has no option {word}"
                if tool in served:
                    assert word not in {p.word for p in served[tool][2]}
    assert "transcoder-train" not in served and "transcoder-eval" in served
    # their first call reads the whole training text (minutes) to build a cache
    assert "graph" not in served and "sae-feature" not in served and "sae-eval" in served


# ------------------------------------------------------------------ the arguments' types

BAD = [  # (tool, arguments, the error result's text)
    ("attn", {"text": TEXT, "all_heads": "false"},
     "error: attn: all_heads takes True or False (a bool; JSON true or false), not str "
     "'false'"),
    ("attn", {"text": {"a": 1}}, "error: attn: text takes a str, not dict {'a': 1}"),
    ("encode", {"text": ["Lily", "Tom"]}, "error: encode: text takes a str, not list "
                                          "['Lily', 'Tom']"),
    ("probs", {"text": 123}, "error: probs: text takes a str, not 123"),
    ("attn", {"text": TEXT, "layer": "1"},
     "error: attn: layer takes a whole number (int), not str '1'"),
    ("attn", {"text": TEXT, "ablate": "L0H1"},
     "error: attn: ablate takes a list, each item a str, not str 'L0H1'"),
    ("attn", {"text": TEXT, "ablate": [1]},
     "error: attn: ablate takes a list, each item a str, not 1"),
    ("probs", {"text": TEXT, "temperature": True},
     "error: probs: temperature takes a number, not True"),
]


@pytest.fixture(scope="module")
def typed(tiny):
    async def work(client):
        bad = [await client.call_tool(tool, args) for tool, args, _ in BAD]
        off = await client.call_tool("attn", {"text": TEXT, "all_heads": False})
        on = await client.call_tool("attn", {"text": TEXT, "all_heads": True})
        whole = await client.call_tool("attn", {"text": TEXT, "layer": 1.0})
        return bad, off, on, whole

    return session(tiny.folder, work)


@pytest.mark.parametrize("i", range(len(BAD)), ids=[f"{b[0]}-{list(b[1])[-1]}" for b in BAD])
def test_a_wrong_type_is_an_error_result_naming_the_argument(typed, i):
    # all_heads "false" turned the flag on; a dict given as text was encoded as its repr
    result = typed[0][i]
    assert result.is_error and text_of(result) == BAD[i][2]


def test_a_right_type_runs_as_typed(typed):
    _, off, on, whole = typed
    assert json.loads(text_of(off))["shape"] == [6, 6]
    assert json.loads(text_of(on))["shape"] == [2, 6, 6]  # all heads: 2 of the tiny model's
    assert json.loads(text_of(whole))["path"] == "layers.1.heads.0.weights"  # 1.0 is 1


# ------------------------------------------------------------------ files: roots and --allow

@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("mcp_roots")
    inside, elsewhere = root / "inside", root / "elsewhere"
    inside.mkdir()
    elsewhere.mkdir()
    (inside / "story.txt").write_text("Lily wanted to play with her toys.\n", encoding="utf-8")
    (elsewhere / "secret.txt").write_text("Tom had a secret.\n", encoding="utf-8")
    (inside / "link.txt").symlink_to(elsewhere / "secret.txt")  # a way out of the folder
    return inside, elsewhere


@pytest.fixture(scope="module")
def files(tiny, folders):
    """One server given --allow ALLOWED, from a client whose one root is INSIDE, started in
    INSIDE: each file call's result."""
    inside, elsewhere = folders
    allowed = inside.parent / "allowed"
    allowed.mkdir()
    (allowed / "story.txt").write_text((inside / "story.txt").read_text(encoding="utf-8"),
                                       encoding="utf-8")
    calls_ = {  # name: (tool, arguments)
        "passwd": ("score", {"file": "/etc/passwd"}),
        "elsewhere": ("score", {"file": str(elsewhere / "secret.txt")}),
        "root": ("score", {"file": str(inside / "story.txt")}),
        "allowed": ("score", {"file": str(allowed / "story.txt")}),
        "relative": ("score", {"file": "story.txt"}),  # the server's folder: INSIDE
        "link": ("score", {"file": str(inside / "link.txt")}),
        "up": ("score", {"file": "../elsewhere/secret.txt"}),
        "weights": ("info", {"weights": str(tiny.folder)}),
        "hub": ("info", {"weights": "openai-community/gpt2"}),
        "shipped": ("info", {"weights": "weights/llama"}),
        "vector": ("attn", {"text": TEXT, "steer_vector": "/etc/passwd#2"}),  # FILE[#N]
    }

    async def work(client):
        return {k: await client.call_tool(tool, args) for k, (tool, args) in calls_.items()}

    return session(tiny.folder, work, allow=[allowed], roots=[inside], cwd=inside), allowed


def test_a_file_outside_every_folder_is_refused_naming_the_rule(files, folders, tiny):
    # score {"file": "/etc/passwd"} returned the file's tokens to the agent
    results, allowed = files
    inside, elsewhere = folders
    rule = ("a file argument is read only inside the client's roots or the folders given to "
            f"`tinygpt mcp --allow DIR` (here: {inside.resolve()}, {allowed})")
    for key, where, word in (("passwd", Path("/etc/passwd"), "file"),
                             ("elsewhere", elsewhere / "secret.txt", "file"),
                             ("link", elsewhere / "secret.txt", "file"),  # followed
                             ("up", elsewhere / "secret.txt", "file"),
                             ("weights", tiny.folder, "weights"),
                             ("vector", Path("/etc/passwd"), "steer_vector")):
        tool = {"weights": "info", "steer_vector": "attn"}.get(word, "score")
        assert results[key].is_error, key
        assert text_of(results[key]) == (f"error: {tool}: {word} {where.resolve()} is outside "
                                         f"the folders this server may read: {rule}"), key
    # a hub id would download into the hub cache, outside every folder
    assert results["hub"].is_error and text_of(results["hub"]) == (
        "error: info: weights openai-community/gpt2 is not a folder here; a hub model is not "
        "fetched through MCP (that downloads into the hub cache): fetch it in a shell")


def test_a_file_inside_allow_or_the_clients_roots_is_read(files, folders, tiny):
    from test_mcp import run_cli

    results, _ = files
    inside, _ = folders
    want = run_cli(tiny.folder, "score", "--file", str(inside / "story.txt")).stdout
    for key in ("root", "allowed", "relative"):
        assert not results[key].is_error and text_of(results[key]) == want, key
    shipped = results["shipped"]  # the package's own lesson model
    assert not shipped.is_error and json.loads(text_of(shipped))["config"]["model_type"] == \
        "llama"


def test_allow_names_a_folder(cli, tmp_path):
    pytest.importorskip("mcp")
    from cli_helpers import assert_one_error_line

    assert_one_error_line(cli("mcp", "--allow", str(tmp_path / "nowhere")), 2,
                          f"--allow {tmp_path / 'nowhere'}: not a folder")


# ------------------------------------------------------------------ a client that goes

SLOW = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from tinygpt_cli.cli import entry
    from tinygpt_cli.surfaces import mcp_server

    started, stopped, written = (Path(a) for a in sys.argv[1:4])

    def slow(args, context=None):  # the command line of a call that takes minutes
        started.write_text("started")
        try:
            for _ in range(400):
                time.sleep(0.05)
        except BaseException as e:
            stopped.write_text(type(e).__name__)
            raise
        written.write_text("written after its client had gone")

    entry.run = slow
    mcp_server.serve(weights=sys.argv[4])
""")


def test_a_call_its_client_cancels_is_stopped_and_writes_nothing(tiny, tmp_path):
    # the server trained on and wrote the files after its client had gone
    anyio = pytest.importorskip("anyio")
    marks = [tmp_path / n for n in ("started", "stopped", "written")]
    script = tmp_path / "slow_server.py"
    script.write_text(SLOW, encoding="utf-8")

    async def work(client):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(client.call_tool, "encode", {"text": TEXT})
            for _ in range(2400):  # until the call is running (bounded)
                if marks[0].exists():
                    break
                await anyio.sleep(0.05)
            tasks.cancel_scope.cancel()  # the client cancels it (notifications/cancelled)
        for _ in range(1200):  # until the call ends, one way or the other (a bound, not a timing)
            if marks[1].exists() or marks[2].exists():
                break
            await anyio.sleep(0.05)
        # and then goes

    session(tiny.folder, work, args=[str(script), *map(str, marks), str(tiny.folder)])
    assert marks[1].read_text() == "Cancelled"
    assert not marks[2].exists()


def test_a_call_whose_client_has_gone_is_stopped_and_writes_nothing(tiny, tmp_path):
    # a client that closes its stream mid-call, with no word of cancelling (a client that
    # died): the server ran on and wrote after it had gone. JSON-RPC by hand, as such a
    # client speaks it, to a server whose one call takes 20 s unless stopped
    pytest.importorskip("mcp")
    import subprocess

    marks = [tmp_path / n for n in ("started", "stopped", "written")]
    script = tmp_path / "slow_server.py"
    script.write_text(SLOW, encoding="utf-8")
    server = subprocess.Popen([sys.executable, str(script), *map(str, marks),
                               str(tiny.folder)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def send(message):
        server.stdin.write((json.dumps({"jsonrpc": "2.0", **message}) + "\n").encode())
        server.stdin.flush()

    send({"id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "gone", "version": "0"}}})
    assert json.loads(server.stdout.readline())["id"] == 1
    send({"method": "notifications/initialized"})
    send({"id": 2, "method": "tools/call", "params": {"name": "encode",
                                                      "arguments": {"text": TEXT}}})
    for _ in range(2400):  # until the call is running (bounded: a server that failed ends it)
        if marks[0].exists() or server.poll() is not None:
            break
        time.sleep(0.05)
    assert marks[0].exists(), "the call never started"
    server.stdin.close()  # and the client goes
    server.wait(timeout=120)  # a bound, not a timing: the slow call alone takes 20 s
    assert marks[1].read_text() == "Cancelled"
    assert not marks[2].exists()
