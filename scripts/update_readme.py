"""Refresh the README's example outputs by running each command on the shipped model.

Each example is a marker line followed by a code block:

    <!-- run: tinygpt encode "Lily wanted to play with her" -->
    ```text
    (replaced by the command's real output)
    ```

Run from the repository root, with `tinygpt` on PATH: python scripts/update_readme.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

MARKER = re.compile(r"^<!-- run: (.*) -->$")


def run(command: str) -> str:
    env = {**os.environ, "COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb"}
    env.pop("TINYGPT_WEIGHTS", None)
    out = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True,
                         text=True, env=env, check=False)
    text = out.stdout + (out.stderr if out.returncode else "")
    return "\n".join(line.rstrip() for line in text.rstrip("\n").splitlines())


def refresh(readme: str) -> str:
    lines = readme.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        m = MARKER.match(line)
        i += 1
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
    path = Path("README.md")
    path.write_text(refresh_table(refresh(path.read_text())))
