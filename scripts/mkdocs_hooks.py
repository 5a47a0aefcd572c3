"""MkDocs hooks (mkdocs.yml): the README is the site's front page, and the few files outside
docs/ that the pages link to (the benchmark results, the model card) are pages of the site.

The Markdown is written for GitHub, where the README sits at the root and the pages in docs/;
the site puts them side by side, so each link is moved to where its file is in the site.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
# files outside docs/ that a page links to: (path from the root, kept at the same path)
OUTSIDE = ("benchmarks/results.md", "benchmarks/graph_scaling.md", "weights/MODEL_CARD.md",
           "weights/loss_curve.svg")
LINK = re.compile(r"\]\((?!https?:|#)([^)\s]+)\)")


def front_page(readme: str) -> str:
    """README.md's links as seen from the site's root: docs/X is X, the rest stays."""
    return LINK.sub(lambda m: "](" + m[1].removeprefix("docs/") + ")", readme)


def from_docs(markdown: str) -> str:
    """A page's links out of docs/ (../benchmarks/X) to the same files inside the site, and
    to the README (../README.md) to the site's front page."""
    def moved(target: str) -> str:
        return "index.md" if target == "../README.md" else target.removeprefix("../")

    return LINK.sub(lambda m: "](" + moved(m[1]) + ")", markdown)


def on_files(files, config):
    files.append(File.generated(config, "index.md",
                                content=front_page((ROOT / "README.md").read_text())))
    for name in OUTSIDE:
        files.append(File.generated(config, name, abs_src_path=str(ROOT / name)))
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri == "index.md" or page.file.src_uri.startswith(("benchmarks/",
                                                                        "weights/")):
        return markdown
    return from_docs(markdown)
