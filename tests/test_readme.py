"""The README shows what a terminal shows: the real `error:` lines, no path of one machine."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()


def update_readme():
    spec = importlib.util.spec_from_file_location("update_readme",
                                                  ROOT / "scripts" / "update_readme.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_refresh_script_keeps_stderr_in_order_and_drops_the_checkout_path():
    run = update_readme().run
    assert run("echo out; echo 'error: bad' >&2; echo code $?") == "out\nerror: bad\ncode 0"
    assert run(f"echo {ROOT}/weights/model.safetensors") == "weights/model.safetensors"


def test_every_error_example_shows_its_error_line():
    blocks = re.findall(r"<!-- run: (.*?) -->\n```text\n(.*?)```", README, re.S)
    errors = [(cmd, out) for cmd, out in blocks if "exit code $?" in cmd]
    assert len(errors) >= 3
    for cmd, out in errors:
        lines = out.strip().splitlines()
        assert lines[-1] in ("exit code 1", "exit code 2"), cmd
        assert lines[-2].startswith("error: "), (cmd, out)


def test_no_path_of_the_authors_machine():
    for prefix in ("/work/", "/home/", "/root/", "/tmp/", "/Users/"):
        assert prefix not in README, prefix


def test_when_something_goes_wrong_lists_the_messages():
    section = README[README.index("### When something goes wrong"):]
    for message in ("no text", "the text is empty", "out of range", "no value at path",
                    "unknown token id", "goes after '--'", "weights folder", "--debug"):
        assert message in section, message
