"""Refresh the example outputs of the README and of every page of docs/ by running each
command on the shipped model.

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
[FILE ...] (README.md and every docs/*.md when no file is named; a picture's --save path is
the repository's, its Markdown relative to its page).

`--check` rewrites nothing: it runs every example and lists the blocks whose output differs
from the page's (exit 1 if any), as a fresh install is checked: with the `tinygpt` of PATH,
whichever install that is. A duration (`1.3 s`) is the one thing allowed to differ. `--quick`
leaves out the examples that build an index first (why: minutes on an empty cache).
"""

from __future__ import annotations

import difflib
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


DURATION = re.compile(r"\b\d+(?:\.\d+)? (?:ms|s|min|h)\b")
SLOW = ("tinygpt why ",)  # their first run builds an index: left out by --quick


def blocks(readme: str):
    """(command, the README's output lines) of every example."""
    lines = readme.split("\n")
    for i, line in enumerate(lines):
        m = MARKER.match(line)
        if not m or i + 2 >= len(lines) or not lines[i + 1].startswith("```"):
            continue
        end = next(j for j in range(i + 2, len(lines)) if lines[j].startswith("```"))
        yield m[1], lines[i + 3:end]  # past the fence and the "$ command" line


def check(readme: str, quick: bool, name: str = "README.md") -> int:
    """The number of examples whose output differs from the page's, each shown as a diff."""
    differ = checked = 0
    for command, want in blocks(readme):
        if quick and command.startswith(SLOW):
            continue
        checked += 1
        got = run(command).split("\n")
        if [DURATION.sub("<time>", x) for x in got] != [DURATION.sub("<time>", x) for x in want]:
            differ += 1
            sys.stdout.write(f"--- {command}\n" + "".join(
                difflib.unified_diff([x + "\n" for x in want], [x + "\n" for x in got],
                                     name, "now", n=1)))
    what = "the README" if name == "README.md" else name
    sys.stdout.write(f"{checked} examples run, {differ} differ from {what}\n")
    return differ


TABLE = re.compile(r"(<!-- schema:values -->\n)(?:.*?\n)?(<!-- /schema:values -->)", re.S)


def refresh_table(readme: str) -> str:
    """The table of values between the schema markers, from tinygpt_cli.transformer.schema."""
    from tinygpt_cli.transformer.schema import markdown_table

    return TABLE.sub(lambda m: m[1] + markdown_table() + "\n" + m[2], readme)


def pages() -> list[Path]:
    """The README and every page of the site: each one's examples are checked alike."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def main(argv: list[str]) -> int:
    named = [Path(a).resolve() for a in argv if not a.startswith("--")]
    paths = named or pages()
    if "--check" in argv:
        differ = sum(check(p.read_text(), quick="--quick" in argv,
                           name=str(p.relative_to(ROOT))) for p in paths)
        return 1 if differ else 0
    for path in paths:
        path.write_text(refresh_table(refresh(path.read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
