"""The math has no side effects on the process: importing tinygpt_cli and running the model
or a command from Python (a notebook, a program, the MCP server's calls) leaves glibc's malloc
and NumPy's huge pages as they were; only the console script's own process tunes them, once,
when its command needs it (cli/process.py)."""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tinygpt_cli.cli import process
from tinygpt_cli.cli.context import RunContext
from tinygpt_cli.transformer import model

PACKAGE = Path(__file__).resolve().parent.parent / "tinygpt_cli"


@pytest.fixture
def settings(monkeypatch):
    """Every call that would change the process's memory settings, recorded instead."""
    calls = []

    class Library:
        def __init__(self, *args, **kwargs):
            pass

        def mallopt(self, *args):
            calls.append(("mallopt", args))
            return 1

    core = getattr(np, "_core", None) or np.core
    monkeypatch.setattr(ctypes, "CDLL", Library)
    monkeypatch.setattr(core.multiarray, "_set_madvise_hugepage",
                        lambda on: calls.append(("hugepage", on)) or True, raising=False)
    process.keep_freed_memory_now.cache_clear()
    yield calls
    process.keep_freed_memory_now.cache_clear()


def test_a_forward_from_python_changes_nothing_in_the_process(settings, tiny_params,
                                                               tiny_config):
    ids = np.array([1, 2, 3, 4])
    model.forward(tiny_params, tiny_config, ids)
    model.run_to_final_norm(tiny_params, tiny_config, ids[None])
    model.loss_and_grads(tiny_params, tiny_config, ids[None, :-1], ids[None, 1:])
    assert settings == []


def test_a_command_run_by_a_program_changes_nothing_but_the_console_script_tunes(settings,
                                                                                cli):
    assert cli("probs", "Lily", context=RunContext()).code == 0
    process.small_pages(RunContext())
    assert settings == []
    assert cli("probs", "Lily", context=RunContext(own_process=True)).code == 0
    process.small_pages(RunContext(own_process=True))
    assert settings == [("mallopt", (-3, 32 << 20)), ("mallopt", (-1, 1 << 30)),
                        ("hugepage", False)]


def test_the_console_script_marks_its_own_process(tiny):
    # a child process, as `tinygpt` runs: its main() must tune the process it owns
    script = ("import ctypes, sys\n"
              "real = ctypes.CDLL\n"
              "class Library:\n"
              "    def __init__(self, *a, **k):\n"
              "        self.lib = real(*a, **k)\n"
              "    def __getattr__(self, name):\n"
              "        if name == 'mallopt':\n"
              "            return lambda *a: sys.stderr.write(f'MALLOPT {a}\\n') or 1\n"
              "        return getattr(self.lib, name)\n"
              "ctypes.CDLL = Library\n"
              "from tinygpt_cli.cli.entry import main\n"
              "sys.argv = ['tinygpt', *sys.argv[1:]]\n"
              "main()\n")
    r = subprocess.run([sys.executable, "-c", script, "probs", "Lily", "--weights",
                        str(tiny.folder)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("MALLOPT") == 2, r.stderr


def test_nothing_but_the_console_scripts_process_module_tunes_memory():
    tuners = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
              if any(w in p.read_text(encoding="utf-8")
                     for w in ("mallopt", "_set_madvise_hugepage"))}
    assert tuners == {"cli/process.py"}
