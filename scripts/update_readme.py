"""Refresh the README's example outputs by running each command on the shipped model.

Each example is a marker line followed by a code block:

    <!-- run: tinygpt encode "Lily wanted to play with her" -->
    ```text
    (replaced by the command's real output)
    ```

A picture is a marker line whose command writes a file with --save, followed by the
Markdown that shows it; the command is run and the file rewritten, the Markdown left alone:

    <!-- picture: tinygpt attn "Lily wanted to play with her" --all-heads --save docs/a.svg -->
    ![every head of layer 0](docs/a.svg)

Run from the repository root, with `tinygpt` on PATH: python scripts/update_readme.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

MARKER = re.compile(r"^<!-- run: (.*) -->$")
PICTURE = re.compile(r"^<!-- picture: (.*) -->$")
ROOT = Path(__file__).resolve().parent.parent


def run(command: str) -> str:
    """What a terminal shows for the command: stdout and stderr interleaved as written (the
    `error:` lines included), at 100 columns, from the repository root, so paths print
    relative to it and nothing of this machine's layout reaches the README."""
    # a terminal's progress bar vanishes when the work ends: no progress lines, as it shows
    env = {**os.environ, "COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb",
           "TINYGPT_PROGRESS": "0"}
    env.pop("TINYGPT_WEIGHTS", None)
    out = subprocess.run(["bash", "-o", "pipefail", "-c", command], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, env=env, check=False,
                         cwd=ROOT)
    text = out.stdout.replace(str(ROOT) + os.sep, "")
    return "\n".join(line.rstrip() for line in text.rstrip("\n").splitlines())


def draw(command: str) -> None:
    """Run a command that writes a picture (--force: the old picture is replaced)."""
    sys.stderr.write(f"$ {command}\n")
    env = {**os.environ, "NO_COLOR": "1", "TERM": "dumb"}
    env.pop("TINYGPT_WEIGHTS", None)
    subprocess.run(["bash", "-o", "pipefail", "-c", f"{command} --force --quiet"], env=env,
                   check=True)


def refresh(readme: str) -> str:
    lines = readme.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        m = MARKER.match(line)
        i += 1
        if picture := PICTURE.match(line):
            draw(picture[1])
        if not m:
            continue
        if i < len(lines) and lines[i].startswith("```"):
            fence = lines[i]
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                i += 1
            i += 1  # past the closing fence
        else:
            fence = "```text"
        sys.stderr.write(f"$ {m[1]}\n")
        out += [fence, f"$ {m[1]}", run(m[1]), "```"]
    return "\n".join(out)


TABLE = re.compile(r"(<!-- schema:values -->\n)(?:.*?\n)?(<!-- /schema:values -->)", re.S)


def refresh_table(readme: str) -> str:
    """The table of values between the schema markers, from tinygpt_cli.schema."""
    from tinygpt_cli.schema import markdown_table

    return TABLE.sub(lambda m: m[1] + markdown_table() + "\n" + m[2], readme)


if __name__ == "__main__":
    path = ROOT / "README.md"
    path.write_text(refresh_table(refresh(path.read_text())))
