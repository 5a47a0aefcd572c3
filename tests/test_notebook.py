"""examples/tour.ipynb, executed by nbclient on a real IPython kernel: every cell runs, and its
outputs hold the pictures the command line's --save writes and the numbers its --json prints
(each compared with the CLI run in a child process). Skipped without the `notebook` extra."""

from __future__ import annotations

import html
import json
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

TOUR = Path(__file__).resolve().parent.parent / "examples" / "tour.ipynb"
TEXT = "Lily wanted to play with her"

# the line of a cell -> the command line whose --save picture the cell shows, and what of its
# --json document the cell prints (None: it prints nothing)
CELLS = {
    "model.embed(text)": (["embed", TEXT], None),
    "model.pos(text, sum=True)": (["pos", TEXT, "--sum"], None),
    'model.norm(text, layer=0, which="ln1")': (["norm", TEXT, "--layer", "0"], None),
    "attn = model.attn(text, layer=0, head=0)": (["attn", TEXT],
                                                  lambda d: d["data"][-1]),
    'cache.picture("blocks.0.attn.hook_pattern")  # every head of block 0': (
        ["attn", TEXT, "--all-heads"], None),
    "model.mlp(text, layer=0)": (["mlp", TEXT, "--layer", "0"], None),
    "model.blocks(text)": (["blocks", TEXT], None),
    "model.final_norm(text)": (["final-norm", TEXT], None),
    "model.logits(text, top=5)": (["logits", TEXT, "--top", "5"], None),
    "probs = model.probs(text, top=5)": (["probs", TEXT, "--top", "5"], lambda d: d["top"]),
    'lens = model.lens(text, target=" toys")': (["lens", TEXT, "--target", " toys"],
                                                lambda d: d["target_chances"]),
    'dla = model.dla(text, target=" toys", vs=" mom")': (
        ["dla", TEXT, "--target", " toys", "--vs", " mom"],
        lambda d: {"score": d["score"], "total": d["total"]}),
    "ablate = model.ablate(text, all=True)": (["ablate", TEXT, "--all"],
                                              lambda d: d["components"][:3]),
}


def tinygpt(*args) -> str:
    out = subprocess.run([sys.executable, "-m", "tinygpt_cli", *map(str, args)],
                         capture_output=True, text=True, timeout=120, env=_env())
    assert out.returncode == 0, out.stderr
    return out.stdout


def _env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k != "TINYGPT_WEIGHTS"}


@pytest.fixture(scope="module")
def cells():
    nb = nbformat.read(TOUR, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")  # kept clean
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(TOUR.parent)}})
    with pytest.MonkeyPatch.context() as m:
        m.delenv("TINYGPT_WEIGHTS", raising=False)  # the shipped model, as the CLI's here
        client.execute()
    return [c for c in nb.cells if c.cell_type == "code"]


def _cell(cells, line: str):
    found = [c for c in cells if line in c.source.splitlines()]
    assert len(found) == 1, line
    return found[0]


def test_every_cell_runs_and_the_cards_are_all_there(cells):
    assert not [o for c in cells for o in c.outputs if o.output_type == "error"]
    source = "\n".join(c.source for c in cells)
    for card in ("encode", "embed", "pos", "norm", "attn", "mlp", "blocks", "final_norm",
                 "logits", "probs", "sample"):  # the page's 11 cards
        assert f"model.{card}(text" in source, card
    assert "run_with_cache" in source and "run_with_hooks" in source


@pytest.mark.parametrize("line", list(CELLS))
def test_a_cells_picture_and_numbers_are_the_command_lines(cells, tmp_path, line):
    words, printed = CELLS[line]
    cell = _cell(cells, line)
    shown = [o for o in cell.outputs if o.output_type == "execute_result"]
    assert len(shown) == 1
    data = shown[0]["data"]
    svg, page = tmp_path / "p.svg", tmp_path / "p.html"
    document = json.loads(tinygpt(*words, "--json", "--save", svg))
    tinygpt(*words, "--save", page, "--quiet")
    assert data["image/svg+xml"] == svg.read_text(encoding="utf-8")
    assert html.unescape(data["text/html"].split('srcdoc="', 1)[1].split('" style=', 1)[0]) \
        == page.read_text(encoding="utf-8")
    assert "<script src" not in data["text/html"] and "https://" not in data["text/html"]
    if printed is not None:
        text = "".join(o.text for o in cell.outputs if o.output_type == "stream"
                       and o.name == "stdout")
        assert json.loads(text) == printed(document)


def test_the_notebook_is_what_its_script_writes(tmp_path):
    written = tmp_path / "tour.ipynb"
    subprocess.run([sys.executable, str(TOUR.parent / "make_tour.py"), str(written)],
                   check=True, timeout=60)
    assert written.read_bytes() == TOUR.read_bytes()


def test_the_inputs_and_the_sample_are_the_command_lines(cells):
    encoded = json.loads(tinygpt("encode", TEXT, "--json"))
    cell = _cell(cells, "encoded = model.encode(text)")
    assert json.loads(cell.outputs[0].text) == {"ids": encoded["ids"],
                                                "tokens": encoded["tokens"]}
    sample = json.loads(tinygpt("sample", TEXT, "--seed", "1", "--json"))
    cell = _cell(cells, "sample = model.sample(text, seed=1)")
    assert json.loads(cell.outputs[0].text) == {"token": sample["token"],
                                                "chance": sample["chance"]}
