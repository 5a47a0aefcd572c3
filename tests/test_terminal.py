"""The CLI as a shell runs it: readers that go away, closed streams, Ctrl-C, ASCII terminals.

These run real processes: `tests/forked.py` forks one child per command after importing the
CLI once (cheap), and a few cases go through bash itself.
"""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from cli_helpers import RICH_ENV, TEXT

from tinygpt_cli.cli.app import _register, app

HERE = Path(__file__).parent
ROOT = HERE.parent


def child_env(tiny, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in RICH_ENV}
    env.update({"TINYGPT_WEIGHTS": str(tiny.folder), "OMP_NUM_THREADS": "1",
                "OPENBLAS_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                "PYTHONPATH": str(ROOT)}, **extra)
    return env


def forked(tiny, cases: list[dict], **env) -> list[dict]:
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"tinygpt-cases-{os.getpid()}.json"
    path.write_text(json.dumps(cases))
    try:
        r = subprocess.run([sys.executable, str(HERE / "forked.py"), str(path)],
                           capture_output=True, text=True, env=child_env(tiny, **env),
                           timeout=300)
    finally:
        path.unlink()
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


# One invocation per command that prints something; any command not listed (a new one) is
# still covered through its --help.
ARGV = {
    "encode": ["encode", TEXT], "embed": ["embed", TEXT], "pos": ["pos", TEXT, "--sum"],
    "norm": ["norm", TEXT], "attn": ["attn", TEXT, "--all-heads"], "mlp": ["mlp", TEXT],
    "blocks": ["blocks", TEXT], "final-norm": ["final-norm", TEXT], "logits": ["logits", TEXT],
    "probs": ["probs", TEXT], "sample": ["sample", TEXT], "decode": ["decode", "1", "2", "3"],
    "generate": ["generate", TEXT, "-n", "4", "--seed", "1", "--no-stop"],
    "trace": ["trace", TEXT, "--list"], "review": ["review", TEXT], "map": ["map", TEXT],
    "info": ["info"],
}


def all_argvs() -> list[list[str]]:
    _register()
    names = sorted(typer.main.get_command(app).commands)
    argvs = [ARGV.get(name, [name, "--help"]) for name in names]
    argvs += [ARGV[n] + ["--json"] for n in ARGV if n not in ("pos",)]
    return argvs + [["--help"], ["--version"], ["encode", "--help"]]


# ------------------------------------------------------------------ a reader that goes away


@pytest.mark.slow  # every command in a child process: 20-30 s
def test_every_command_ends_quietly_when_the_reader_is_gone(tiny):
    argvs = all_argvs()
    results = forked(tiny, [{"argv": a, "stdout": "broken"} for a in argvs])
    for argv, r in zip(argvs, results, strict=True):
        assert (r["code"], r["err"]) == (0, ""), (argv, r)


@pytest.mark.slow  # every command in a child process: 20-30 s
def test_the_same_commands_print_normally_to_a_file(tiny):
    """The pipe test above means something: each of those commands writes to stdout."""
    argvs = all_argvs()
    results = forked(tiny, [{"argv": a, "stdout": "file"} for a in argvs])
    for argv, r in zip(argvs, results, strict=True):
        assert r["code"] == 0 and r["out"], (argv, r)


@pytest.mark.parametrize("pipeline", [
    "generate 'Lily wanted' --json -n 40 --seed 1 --no-stop | head -1",
    "decode 1 2 3 | head -c 1",
    "review 'Lily wanted' | head -n 2",
])
def test_shell_pipelines_into_head_exit_zero(tiny, pipeline):
    command, reader = pipeline.split(" | ")
    script = (f'"$0" -m tinygpt_cli {command} | {reader}; '
              'echo "status ${PIPESTATUS[0]}" >&2')
    r = subprocess.run(["bash", "-c", script, sys.executable], capture_output=True, text=True,
                       env=child_env(tiny), timeout=120)
    assert r.stderr.splitlines() == ["status 0"], r.stderr
    if "generate" in command:
        assert json.loads(r.stdout)["event"] == "prompt"


# ------------------------------------------------------------------ closed streams


def shell(tiny, script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script, sys.executable], capture_output=True,
                          text=True, env=child_env(tiny), timeout=120)


def test_closed_stdout_is_one_error_line_and_exit_1(tiny):
    for command in ("info", f"encode '{TEXT}'", "decode 1 2 3", f"generate '{TEXT}' -n 2"):
        r = shell(tiny, f'"$0" -m tinygpt_cli {command} >&-')
        assert r.returncode == 1, (command, r.stderr)
        assert r.stderr.splitlines()[-1] == "error: standard output is closed", r.stderr
        assert "Traceback" not in r.stderr and "AttributeError" not in r.stderr


def test_closed_stderr_keeps_exit_codes_and_output(tiny):
    r = shell(tiny, '"$0" -m tinygpt_cli decode 608 429 2>&-')
    assert (r.returncode, r.stdout) == (0, "Lily wanted\n")
    r = shell(tiny, f'"$0" -m tinygpt_cli attn "{TEXT}" --layer 9 2>&-')
    assert (r.returncode, r.stdout) == (2, "")
    r = shell(tiny, f'"$0" -m tinygpt_cli generate "{TEXT}" -n 2 2>&- >&-')
    assert r.returncode == 1 and r.stdout == ""


# ------------------------------------------------------------------ Ctrl-C

# Sends SIGINT to itself while the CLI is importing numpy: an interrupt at start-up, at a
# fixed point instead of a timing guess.
INTERRUPT_AT_IMPORT = """
import os, signal, sys
class Finder:
    def find_spec(self, name, path=None, target=None):
        if name == "numpy":
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, Finder())
from tinygpt_cli.cli.entry import main
main(["info"])
"""


def with_pty_stderr(argv: list[str], env: dict, *, interrupt_after_output: bool = False):
    """Run with stderr on a pseudo-terminal (so the fresh line is due) and stdout a pipe."""
    leader, follower = pty.openpty()
    # Ctrl-C as in a foreground terminal: a shell runs a background job (`pytest ... &`) with
    # SIGINT ignored, which its children would inherit and, as they should, keep
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=follower, env=env,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    os.close(follower)
    if interrupt_after_output:
        assert p.stdout.read(1)  # the command is running: past start-up
        p.send_signal(signal.SIGINT)
    try:  # a child that ignored the signal fails the test instead of hanging the suite
        p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        raise AssertionError("the command went on for 120 s after Ctrl-C") from None
    code = p.wait(timeout=120)
    err = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the pty closes with the child
            break
        if not chunk:
            break
        err += chunk
    os.close(leader)
    return code, err.decode("utf-8", "replace")


def test_ctrl_c_at_start_up_exits_130_on_a_fresh_line(tiny):
    code, err = with_pty_stderr([sys.executable, "-c", INTERRUPT_AT_IMPORT], child_env(tiny))
    assert code == 130 and "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.replace("\r", "") == "\n"


def test_ctrl_c_while_generating_exits_130_on_a_fresh_line(tiny):
    argv = [sys.executable, "-m", "tinygpt_cli", "generate", TEXT, "-n", "100000", "--no-stop",
            "--seed", "1"]
    code, err = with_pty_stderr(argv, child_env(tiny), interrupt_after_output=True)
    assert code == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err and "error" not in err
    assert err.endswith("\n")


@pytest.mark.parametrize("where", ["tinygpt_cli.transformer.folder.load_model",
                                   "tinygpt_cli.render.jsonout.emit",
                                   "tinygpt_cli.render.quick_table.QuickConsole.print"])
def test_ctrl_c_anywhere_in_a_command_exits_130_without_traceback(cli, monkeypatch, where):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(where, interrupted)
    r = cli("probs", TEXT, *(["--json"] if "jsonout" in where else []))
    assert (r.code, r.out) == (130, "")
    assert "Traceback" not in r.err and "error" not in r.err


# ------------------------------------------------------------------ ASCII-only output

ASCII_ARGVS = [["encode", TEXT], ["encode", "héllo\twörld…"], ["map", TEXT], ["review", TEXT],
               ["blocks", TEXT], ["probs", TEXT], ["attn", TEXT], ["sample", TEXT],
               ["decode", "608", "429"], ["generate", "Lily ✓", "-n", "3", "--seed", "1"],
               ["trace", TEXT, "--list"], ["info"], ["encode", "héllo…", "--json"],
               ["mlp", TEXT, "--top", "3"], ["logits", TEXT]]


@pytest.mark.slow  # every command in a child process, twice: 20 s
@pytest.mark.parametrize("env", [{"PYTHONIOENCODING": "ascii"},
                                 {"LANG": "C", "LC_ALL": "C", "PYTHONIOENCODING": ""}])
def test_ascii_only_output_degrades_instead_of_crashing(tiny, env):
    results = forked(tiny, [{"argv": a, "stdout": "file"} for a in ASCII_ARGVS], **env)
    for argv, r in zip(ASCII_ARGVS, results, strict=True):
        assert r["code"] == 0, (argv, r)
        assert "Traceback" not in r["err"] and "Error" not in r["err"], (argv, r)
    if env.get("PYTHONIOENCODING") != "ascii":
        return
    outs = {" ".join(a): r["out"] for a, r in zip(ASCII_ARGVS, results, strict=True)}
    for argv, r in zip(ASCII_ARGVS, results, strict=True):
        assert r["out"].isascii() and r["err"].isascii(), (argv, r["out"])
    assert "_wanted" in outs[f"encode {TEXT}"] and "0-4" in outs[f"encode {TEXT}"]
    assert "| 6 tokens" in outs[f"map {TEXT}"] and "6 x 16" in outs[f"map {TEXT}"]
    # JSON stays exact: non-ASCII characters as \\u escapes, the same document
    assert json.loads(outs["encode héllo… --json"])["ids"] == tiny.model.tokenizer.encode("héllo…")


# ------------------------------------------------------------------ hostile strings

HOSTILE = "\x1b[2J\x9b31m\x07"  # clear screen, a C1 CSI, a bell


def test_strings_from_a_weights_folder_never_reach_the_terminal_raw(cli, monkeypatch, tiny):
    """Token and special-token names come from tokenizer.json: shown escaped like user text."""
    from tinygpt_cli.transformer.tokenizer import Tokenizer

    monkeypatch.setattr(Tokenizer, "token_str", lambda self, i: f"tok{i}{HOSTILE}")
    monkeypatch.setattr(Tokenizer, "special_tokens", property(lambda self: {HOSTILE: 0}))
    for argv in (["info"], ["logits", TEXT], ["probs", TEXT], ["encode", TEXT],
                 ["sample", TEXT], ["blocks", TEXT], ["attn", TEXT], ["review", TEXT],
                 ["map", TEXT], ["trace", TEXT, "tokens"]):
        r = cli(*argv)
        assert r.code == 0, (argv, r.err)
        for raw in ("\x1b", "\x9b", "\x07"):
            assert raw not in r.out and raw not in r.err, (argv, r.out)
    out = cli("info").out
    assert "\\x1b[2J\\x9b31m\\x07 = 0" in out
    for argv in (["logits", TEXT, "--json"], ["info", "--json"],
                 ["generate", TEXT, "-n", "2", "--seed", "1", "--json"]):
        r = cli(*argv)
        assert r.code == 0 and "\x1b" not in r.out and "\x9b" not in r.out, argv
        assert "\\u001b" in r.out and "\\u009b" in r.out, argv
        [json.loads(line) for line in r.out.splitlines()]  # still valid JSON, same strings
    assert HOSTILE in json.loads(cli("info", "--json").out)["tokenizer"]["special_tokens"]


def test_error_lines_escape_control_characters(cli, tmp_path):
    r = cli("info", "--weights", tmp_path / f"no{HOSTILE}where")
    assert r.code != 0 and r.out == ""
    assert r.err.startswith("error: ") and r.err.count("\n") == 1
    assert "\x1b" not in r.err and "\x9b" not in r.err and "\\x1b[2J\\x9b31m\\x07" in r.err


# ------------------------------------------------------------------ options, completion


def test_options_mean_the_same_everywhere(cli, tiny):
    from tinygpt_cli.cli import common

    _register()
    # sampling shares one declaration of each default
    for name in ("temperature", "top_k", "top_p"):
        for command in ("sample", "generate", "probs"):
            params = {p.name: p for p in typer.main.get_command(app).commands[command].params}
            if name in params:
                declared = {"temperature": common.TEMPERATURE, "top_k": common.TOP_K,
                            "top_p": common.TOP_P}[name]
                assert params[name].default == declared.default, (command, name)
    # -k is --top-k, -n the row count, -H the head, -P top-p
    a = cli("sample", TEXT, "-k", 1, "--seed", 1, "--json").json()  # sample picks a new seed
    b = cli("sample", TEXT, "--top-k", 1, "--seed", 1, "--json").json()
    assert a == b and a["top_k"] == 1
    assert len(cli("logits", TEXT, "-n", 3, "--json").json()["top"]) == 3
    assert cli("attn", TEXT, "-H", 1, "--json").json()["path"] == "layers.0.heads.1.weights"
    assert cli("sample", TEXT, "-P", 0.5, "--json").json()["top_p"] == 0.5
    # --weights before the command, and --debug listed in --help
    r = cli("--weights", tiny.folder, "info", "--json")
    assert r.code == 0 and r.json()["weights_file"] == str(
        (tiny.folder / "model.safetensors").resolve())
    assert "--debug" in cli("--help").out and "--install-completion" in cli("--help").out


def test_shell_completion_completes_commands_and_installs(tiny, tmp_path):
    env = child_env(tiny, _TINYGPT_COMPLETE="complete_bash", COMP_WORDS="tinygpt gen",
                    COMP_CWORD="1")
    r = subprocess.run([sys.executable, "-m", "tinygpt_cli"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["generate"], r
    env.update(COMP_WORDS="tinygpt attn --lay", COMP_CWORD="2")  # a command's own options too
    r = subprocess.run([sys.executable, "-m", "tinygpt_cli"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["--layer"], r
    # the shell named, not found among the test's parent processes (a suite run under nohup
    # or cron has no shell there): typer then takes the name as --install-completion's value
    env = child_env(tiny, HOME=str(tmp_path), SHELL="/bin/bash",
                    _TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION="1")
    r = subprocess.run([sys.executable, "-m", "tinygpt_cli", "--install-completion", "bash"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r
    assert "_TINYGPT_COMPLETE" in (tmp_path / ".bash_completions" / "tinygpt.sh").read_text()


def test_a_key_to_styles_shows_only_where_the_styles_do():
    # In a pipe there is no colour, reverse video or underline: a key to them would describe
    # nothing. With NO_COLOR a terminal keeps bold and reverse but not colour.
    import io

    from rich.console import Console
    from rich.text import Text

    from tinygpt_cli.render.tables import WhenStyled

    def shown(key, **console):
        out = io.StringIO()
        Console(file=out, width=80, **console).print(key)
        return "key" in out.getvalue()

    colours, styles = WhenStyled(Text("key"), in_colour=True), WhenStyled(Text("key"))
    assert shown(colours, force_terminal=True) and shown(styles, force_terminal=True)
    assert not shown(colours) and not shown(styles)  # a pipe
    assert not shown(colours, force_terminal=True, no_color=True)
    assert shown(styles, force_terminal=True, no_color=True)


def test_the_piped_views_carry_no_key_to_colours(cli):
    assert "colour:" not in cli("lens", TEXT).out
    assert "surprisal:" not in cli("score", TEXT).out
