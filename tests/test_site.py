"""The documentation as a site: MkDocs builds README.md and docs/ with --strict (a broken link,
a missing page or a page left out of the navigation fails), and the pages open cleanly in
headless Chromium with their title, their navigation and their code blocks.

Needs the `docs` extra (mkdocs, mkdocs-material) and a Chromium; skips cleanly without either.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("mkdocs", reason="the site needs the docs extra: pip install '.[docs]'")
pytest.importorskip("material", reason="the site needs the docs extra: pip install '.[docs]'")


def build(config: Path, out: Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` (never --quiet: it hides the warnings --strict counts)."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about its successor
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f",
                           str(config), "-d", str(out)],
                          capture_output=True, text=True, env=env, cwd=config.parent,
                          check=False)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    r = build(ROOT / "mkdocs.yml", out)
    assert r.returncode == 0, r.stderr
    assert "WARNING" not in r.stderr, r.stderr
    return out


@pytest.mark.slow  # seconds of MkDocs on a busy machine
def test_the_site_builds_strictly_with_every_page(site):
    # every page of docs/ is a page of the site (mkdocs.yml's nav names them all: --strict
    # fails on a page left out), and the README is its front page
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert (site / page.with_suffix(".html").name).is_file(), page.name
    index = (site / "index.html").read_text()
    assert "Lily wanted to play with her" in index and 'href="inspecting.html"' in index
    # the README's pictures, from the front page's folder
    assert 'src="attn_all_heads.svg"' in index and (site / "attn_all_heads.svg").is_file()


@pytest.mark.slow
def test_a_broken_link_fails_the_build(tmp_path):
    """--strict holds: a page linking to a page that does not exist stops the build."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# x\n\n[gone](nowhere.md)\n")
    (tmp_path / "mkdocs.yml").write_text("site_name: x\ntheme:\n  name: material\n")
    r = build(tmp_path / "mkdocs.yml", tmp_path / "out")
    assert r.returncode != 0 and "nowhere.md" in r.stderr, r.stderr



@pytest.mark.slow
@pytest.mark.parametrize("page, title", [("index.html", "tinygpt"),
                                         ("errors.html", "Errors")])
def test_a_page_opens_in_chromium(site, browser, page, title):
    load = browser.open(site / page)
    assert load.errors == [] and load.failed == []
    # nothing from the network: the site is whole on the disk
    assert all(url.startswith(("file://", "data:")) for url in load.requests), load.requests
    assert browser.evaluate("document.querySelector('article h1').textContent").startswith(title)
    code = browser.evaluate("document.querySelectorAll('article pre code').length")
    assert code >= 1
    # the navigation lists every area
    nav = browser.evaluate("[...document.querySelectorAll('nav a')].map(a => a.textContent)")
    assert any("Explaining a token" in n for n in nav)
