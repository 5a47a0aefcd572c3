"""The README and the pages of docs/ show what a terminal shows: the real `error:` lines, no
path of one machine; the error table and the module list follow their text to its page."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()
# the README is the front door; each area's text is a page of docs/ (scripts/update_readme.py
# checks the examples of all of them)
PAGES = {p.name: p.read_text()
         for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}
ALL = "\n".join(PAGES.values())


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
    blocks = re.findall(r"<!-- run: (.*?) -->\n```text\n(.*?)```", ALL, re.S)
    errors = [(cmd, out) for cmd, out in blocks if "exit code $?" in cmd]
    assert len(errors) >= 3
    for cmd, out in errors:
        lines = out.strip().splitlines()
        assert lines[-1] in ("exit code 1", "exit code 2"), cmd
        assert lines[-2].startswith("error: "), (cmd, out)


def test_no_path_of_the_authors_machine():
    for name, text in PAGES.items():
        for prefix in ("/work/", "/home/", "/root/", "/tmp/", "/Users/"):
            assert prefix not in text, (name, prefix)


def test_when_something_goes_wrong_lists_the_messages():
    errors = PAGES["errors.md"]
    section = errors[errors.index("## When something goes wrong"):]
    for message in ("no text", "the text is empty", "out of range", "no value at path",
                    "unknown token id", "goes after '--'", "weights folder", "--debug"):
        assert message in section, message


def layout_modules(readme: str) -> set[str]:
    """The modules the Layout section lists, as paths under tinygpt_cli/: a name at two
    spaces is the package's own, a folder (`analysis/`) at two spaces holds the names at
    four spaces below it, a folder at four spaces (`transformer/families/`) those at six;
    description lines are indented further."""
    section = readme[readme.index("## Layout"):]
    block = section[section.index("```\n") + 4:]
    block = block[:block.index("```")]
    listed, folders = set(), []  # the folders the current line is inside, outermost first
    for line in block.splitlines()[1:]:  # the first line is tinygpt_cli/ itself
        if not line.startswith(" "):
            break  # weights/, benchmarks/, tests/: outside the package
        m = re.match(r"( {2}| {4}| {6})(?! )(\S+)", line)
        if not m:
            continue
        depth = len(m[1]) // 2 - 1
        if depth > len(folders):
            continue  # a name under something that is not a folder: a description
        folders = folders[:depth]
        if m[2].endswith("/"):
            folders.append(m[2])
        else:
            listed.add("".join(folders) + m[2])
    return listed


def test_the_layout_lists_every_module():
    package = ROOT / "tinygpt_cli"
    on_disk = {str(p.relative_to(package)) for p in package.rglob("*.py")
               if p.name != "__init__.py"}  # a package's own file is its folder's line
    assert layout_modules(PAGES["development.md"]) == on_disk


def test_the_layout_check_reads_the_sections_lines():
    readme = "## Layout\n\n```\ntinygpt_cli/\n  a.py       one\n                 more\n" \
             "  sub/       a folder\n    b.py     two\n    c.py     three\n" \
             "    deep/    a folder in it\n      f.py   five\n    g.py     six\n" \
             "  d.py  four\n      h.py  under a module: a description\n" \
             "weights/  not the package\n  e.py\n```\n"
    assert layout_modules(readme) == {"a.py", "sub/b.py", "sub/c.py", "sub/deep/f.py",
                                      "sub/g.py", "d.py"}


def test_the_check_lists_each_example_whose_output_differs(capsys):
    """--check runs every example and shows what differs; a duration may differ, nothing else
    (not even trailing text); --quick leaves out why, which builds an index first."""
    readme = "\n".join([
        "<!-- run: echo hello -->", "```text", "$ echo hello", "hello", "```",
        "<!-- run: echo took 1.5 s -->", "```text", "$ echo took 1.5 s", "took 20 s", "```",
        "<!-- run: echo bye -->", "```text", "$ echo bye", "bye bye", "```",
        "<!-- run: tinygpt why x -->", "```text", "$ tinygpt why x", "never run", "```"])
    check = update_readme().check
    assert check(readme, quick=True) == 1
    out = capsys.readouterr().out
    assert "--- echo bye\n" in out and "-bye bye\n+bye\n" in out
    assert "echo hello" not in out and "took" not in out and "why" not in out
    assert out.endswith("3 examples run, 1 differ from the README\n")


def test_every_page_is_checked_by_the_refresh_script():
    """`scripts/update_readme.py` runs the examples of the README and of every page of docs/."""
    names = {p.name for p in update_readme().pages()}
    assert {"README.md", "errors.md", "inspecting.md", "development.md"} <= names
    assert names == set(PAGES)


def test_every_relative_link_of_the_readme_and_the_pages_finds_its_file():
    """A link (or picture) is relative to its own file: the README's `docs/errors.md`, a page's
    `../benchmarks/results.md`, so both read on GitHub and in the site (mkdocs.yml)."""
    link = re.compile(r"(?<!\\)\[[^\]\n]*\]\((?!https?:|#|mailto:)([^)\s#]+)(?:#[^)\s]*)?\)")
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    seen = 0
    for page in pages:
        for target in link.findall(page.read_text()):
            seen += 1
            assert (page.parent / target).exists(), (page.name, target)
    assert seen >= 15  # the README's links to its pages, at least
