"""--save on the analysis commands (lens, dla, patch, ablate, score, heads): each SVG parses as
XML, has one cell per number with the expected labels, and every hover value reads back as the
number the same command prints with --json; the HTML names no URL; an existing file needs
--force, and --quiet prints nothing.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np
import pytest
from browser import Browser, find_chromium
from cli_helpers import TEXT, TEXT_IDS, TINY, assert_one_error_line
from test_pictures import EXTERNAL, NS, parse, tip

from tinygpt_cli.render.text import show_token

T = len(TEXT_IDS)
L, H = TINY.n_layer, TINY.n_head
CORRUPT = "Tom wanted to eat with her"  # as many tokens as TEXT
VS = ("--target", " toys", "--vs", " mom")
LAYERS = [f"layer {i}" for i in range(L)]
HEADS = [f"head {h}" for h in range(H)]


def same(hover: str, number: float) -> bool:
    """The hover text is the JSON number: exactly, as float64, or as the float32 it was."""
    return float(hover) == number or float(np.float32(hover)) == number


def heatmaps(root: ET.Element) -> dict[str, dict]:
    """Each drawn heatmap by the path (or title) in its info line: its row and column labels
    and {(row, column): hover value}. A heatmap's texts and cells are the children of one <g>."""
    found = {}
    for g in root.iter(NS + "g"):
        cells = [e for e in g if e.tag == NS + "rect" and e.get("class") == "cell"]
        if not cells:
            continue
        texts = [e for e in g if e.tag == NS + "text"]
        title = next((e.text for e in texts if e.get("font-weight") == "bold"), "")
        info = next(e.text for e in texts if e.get("font-size") == "11")
        values = {}
        for c in cells:
            i, _, j, _, value = tip(c)
            values[i, j] = value
        found[title or info.split("  ")[0]] = {
            "info": info, "values": values,
            "rows": [e.text for e in texts if e.get("class") == "row"],
            "cols": [e.text for e in texts if e.get("class") == "col"]}
    return found


def bars(root: ET.Element) -> list[tuple[str, str]]:
    """Every bar's (label, value) from its hover text "k. label: name = value"."""
    out = []
    for e in root.iter(NS + "rect"):
        if e.get("class") == "bar":
            head, value = e.find(NS + "title").text.rsplit(" = ", 1)
            out.append((head.split(". ", 1)[1].rsplit(": ", 1)[0], value))
    return out


@pytest.fixture
def shown(tiny) -> list[str]:
    return [show_token(tiny.model.tokenizer.token_str(i)) for i in TEXT_IDS]


def saved(cli, tmp_path, *args) -> ET.Element:
    out = tmp_path / "pic.svg"
    r = cli(*args, "--save", out)
    assert r.code == 0, r.err
    assert r.out  # the terminal view is still printed
    return parse(out)


def test_lens(cli, tmp_path, shown):
    root = saved(cli, tmp_path, "lens", TEXT, "--target", " toys")
    doc = cli("lens", TEXT, "--target", " toys", "--json").json()
    stages = doc["stages"]
    assert len(stages) == 1 + 2 * L
    grid = heatmaps(root)["the likeliest next token's chance, after each stage"]
    # as the terminal lays it out (position × stage, its short stage names); it was transposed
    short = ["emb"] + [f"{i}.{k}" for i in range(L) for k in ("mid", "post")]
    assert grid["rows"] == shown and grid["cols"] == short
    assert len(grid["values"]) == len(stages) * T
    data = doc["data"]  # [T][S], as the picture
    assert all(same(v, data[t][s]) for (t, s), v in grid["values"].items())
    # The top tokens, a table row per position, as the terminal's.
    texts = [e.text for e in root.iter(NS + "text")]
    for t in range(T):
        assert all(show_token(doc["top_tokens"][t][s]) in texts for s in range(len(stages)))
    # The target's chance at the position, stage by stage, with its rank, under a title that
    # says so as the terminal's header does (it was the trace name "lens.target_probs").
    p = doc["position"]
    title = (f"the target at position {p} ({shown[p]}): {show_token(doc['target']['token'])} "
             f"(id {doc['target']['id']}), its chance after each stage")
    assert title in texts
    assert not any("target_probs" in t for t in texts if t)
    got = bars(root)
    assert [label for label, _ in got] == [f"{s} (rank {r})" for s, r in
                                           zip(stages, doc["target_ranks"], strict=True)]
    assert [float(v) for _, v in got] == doc["target_probs"]


def test_dla(cli, tmp_path):
    root = saved(cli, tmp_path, "dla", TEXT, *VS, "--neurons", "--top", "7")
    doc = cli("dla", TEXT, *VS, "--neurons", "--json").json()
    grid = heatmaps(root)["heads (z_h W_O[h], through the final norm's real scale)"]
    assert (grid["rows"], grid["cols"]) == (LAYERS, HEADS)
    assert len(grid["values"]) == L * H
    assert all(same(v, doc["heads"][i][h]) for (i, h), v in grid["values"].items())
    lo, hi = grid["info"].split("range [")[1].rstrip("]").split(", ")
    assert float(lo) == -float(hi)  # signed: 0 is the neutral middle of the scale
    share = dict(zip(doc["labels"], doc["data"], strict=True))
    got = bars(root)
    parts, neurons = got[:7], got[7:]
    assert [abs(float(v)) for _, v in parts] == sorted(np.abs(doc["data"]), reverse=True)[:7]
    assert all(float(v) == share[label] for label, v in parts)
    assert [(f"L{n['layer']} n{n['neuron']}", n["value"]) for n in doc["top_neurons"]] == \
        [(label, float(v)) for label, v in neurons]


def test_patch_masks_the_positions_after_the_scored_one(cli, tmp_path, shown):
    p = 3
    root = saved(cli, tmp_path, "patch", TEXT, CORRUPT, *VS, "--position", p)
    doc = cli("patch", TEXT, CORRUPT, *VS, "--position", p, "--json").json()
    grids = heatmaps(root)
    for k, kind in enumerate(doc["kinds"]):
        g = grids[kind]
        # positions down, layers across, as the terminal view draws them
        assert (g["rows"], g["cols"]) == (shown, LAYERS)
        assert set(g["values"]) == {(t, i) for i in range(L) for t in range(p + 1)}
        assert all(same(v, doc["data"][k][i][t]) for (t, i), v in g["values"].items())
    heads = grids["each head's output, patched at every position"]
    assert (heads["rows"], heads["cols"]) == (LAYERS, HEADS)
    assert len(heads["values"]) == L * H
    assert all(same(v, doc["heads"][i][h]) for (i, h), v in heads["values"].items())
    texts = " ".join(e.text for e in root.iter(NS + "text"))
    assert f"position {p}" in texts and str(round(doc["clean"], 4))[:5] in texts


def test_ablate_all(cli, tmp_path):
    root = saved(cli, tmp_path, "ablate", TEXT, "--all")
    doc = cli("ablate", TEXT, "--all", "--json").json()
    rows = doc["components"]
    assert len(rows) == L * (H + 1)
    cols = HEADS + ["mlp"]

    def where(path: str) -> tuple[int, int]:
        parts = path.split(".")
        return int(parts[1]), int(parts[3]) if parts[2] == "heads" else H

    grids = heatmaps(root)
    for title, key in (("change in log p(target)", "delta"),
                       ("KL(before ‖ after), nats", "kl")):
        g = grids[title]
        assert (g["rows"], g["cols"]) == (LAYERS, cols)
        assert len(g["values"]) == L * (H + 1)
        assert all(same(g["values"][where(r["component"])], r[key]) for r in rows)
    assert bars(root) == [(r["label"], str(np.float64(r["delta"]))) for r in rows]  # ranked


def test_ablate_one_component(cli, tmp_path):
    root = saved(cli, tmp_path, "ablate", TEXT, "--layer", 1, "--head", 0, "--top", 3)
    doc = cli("ablate", TEXT, "--layer", 1, "--head", 0, "--top", 3, "--json").json()
    want = [(show_token(d["token"]), d["prob"]) for d in doc["top_before"]
            + doc["components"][0]["top_after"]]
    assert [(label, float(v)) for label, v in bars(root)] == want


def test_score(cli, tmp_path, shown):
    root = saved(cli, tmp_path, "score", TEXT)
    records = cli("score", TEXT, "--json").ndjson()
    tokens, summary = records[:-1], records[-1]
    assert len(tokens) == T  # after the separator, every token is scored
    g = heatmaps(root)["surprisal"]
    assert (g["rows"], g["cols"]) == (["bits"], shown)
    assert len(g["values"]) == T
    assert all(same(g["values"][0, j], tokens[j]["bits"]) for j in range(T))
    worst = sorted(tokens, key=lambda r: -r["bits"])
    assert [(label, float(v)) for label, v in bars(root)] == [
        (f"{show_token(r['token'])} @{r['position']}", r["bits"]) for r in worst]
    facts = [e.text for e in root.iter(NS + "text")]
    assert str(summary["tokens"]) in facts and f"{summary['perplexity']:.6g}" in facts


def test_score_of_many_texts_draws_one_row_each(cli, tmp_path):
    stories = tmp_path / "s.txt"
    stories.write_text("Lily ran.\n<|endoftext|>\nTom saw a dog.\n")
    root = saved(cli, tmp_path, "score", "--file", stories)
    records = cli("score", "--file", stories, "--json").ndjson()[:-1]
    grids = heatmaps(root)
    assert sorted(grids) == ["text 0", "text 1"]
    for k in (0, 1):
        mine = [r for r in records if r["sequence"] == k]
        assert len(grids[f"text {k}"]["values"]) == len(mine)
        assert all(same(grids[f"text {k}"]["values"][0, j], r["bits"])
                   for j, r in enumerate(mine))


def test_heads(cli, tmp_path):
    text = "Tom saw a dog. Tom saw a dog."
    root = saved(cli, tmp_path, "heads", text, "--repeat-length", 5)
    doc = cli("heads", text, "--repeat-length", 5, "--json").json()
    grids = heatmaps(root)
    names = {"previous_token": "previous token", "duplicate_token": "duplicate token",
             "induction": "induction", "induction_random": "induction (random)"}
    assert doc["kinds"] == list(names)
    for k, kind in enumerate(doc["kinds"]):
        g = grids[names[kind]]
        assert (g["rows"], g["cols"]) == (LAYERS, HEADS)
        assert len(g["values"]) == L * H
        assert all(same(v, doc["data"][k][i][h]) for (i, h), v in g["values"].items())
        assert "range [0.000, 1.000]" in g["info"]


# ------------------------------------------------------------------ the --save contract

COMMANDS = [("lens", TEXT), ("dla", TEXT), ("patch", TEXT, CORRUPT, *VS),
            ("ablate", TEXT, "--all"), ("ablate", TEXT, "--layer", 0, "--mlp"),
            ("score", TEXT), ("heads", TEXT, "--repeat-length", 5)]
IDS = ["lens", "dla", "patch", "ablate-all", "ablate", "score", "heads"]


@pytest.mark.parametrize("command", COMMANDS, ids=IDS)
def test_html_is_offline_and_quiet_prints_nothing(cli, tmp_path, command):
    page = tmp_path / "pic.html"
    r = cli(*command, "--save", page, "--quiet")
    assert (r.code, r.out, r.err) == (0, "", "")
    data = page.read_text(encoding="utf-8")
    assert data.startswith("<!DOCTYPE html>") and "<svg" in data
    assert not EXTERNAL.search(data), EXTERNAL.search(data)
    assert cli(*command).out  # --quiet did not stick


@pytest.mark.parametrize("command", COMMANDS, ids=IDS)
@pytest.mark.parametrize("as_json", [False, True], ids=["view", "json"])
def test_an_existing_file_needs_force(cli, tmp_path, command, as_json):
    out = tmp_path / "pic.svg"
    out.write_text("mine")
    flags = ("--json",) if as_json else ()
    # Nothing on stdout, not even score's streamed --json lines: the refusal is the only output.
    assert_one_error_line(cli(*command, *flags, "--save", out), 2, str(out), "exists",
                          "--force")
    assert out.read_text() == "mine"
    r = cli(*command, *flags, "--save", out, "--force")
    assert r.code == 0, r.err
    assert parse(out).tag == NS + "svg"
    if as_json:  # --json is unaffected by --save
        assert r.out == cli(*command, *flags).out


def test_pages_open_cleanly_in_chromium(cli, tmp_path):
    exe = find_chromium()
    if exe is None:
        pytest.skip("no Chromium on PATH (apt-get install chromium; .ci/run installs it): "
                    "the HTML pages cannot be opened in a real browser here")
    pages = {"patch": ((TEXT, CORRUPT, *VS), 5 * L * T + L * H),
             "ablate": ((TEXT, "--all"), 2 * L * (H + 1)),
             "heads": ((TEXT, "--repeat-length", 5), 4 * L * H)}
    b = Browser(exe)
    try:
        for name, (args, n_cells) in pages.items():
            page = tmp_path / f"{name}.html"
            assert cli(name, *args, "--save", page, "--quiet").code == 0
            load = b.open(page, width=390)
            assert load.errors == [] and load.requests == [page.resolve().as_uri()]
            assert b.evaluate("document.querySelectorAll('rect.cell').length") == n_cells
            assert b.evaluate("document.documentElement.scrollWidth") <= 390  # fits a phone
    finally:
        b.close()


@pytest.fixture(scope="module")
def four_by_four(tmp_path_factory):
    """The tiny model with 4 layers of 4 heads, as the shipped one: its circuit graph has 53
    receivers (q, k and v of 16 heads, 4 MLPs, the logits) and 21 senders."""
    from dataclasses import replace

    from cli_helpers import random_params, write_folder

    config = replace(TINY, n_layer=4, n_head=4)
    return write_folder(tmp_path_factory.mktemp("four") / "weights",
                        random_params(config, 5), config)


def test_circuit_labels_every_column_and_row(cli, tmp_path, four_by_four):
    """circuit --save labelled 27 of 53 receivers (every other column, the font too big for
    the cells): each sender and receiver of the graph now has its label, none smaller than
    the smallest label drawn anywhere, and no two columns' labels overlap."""
    from tinygpt_cli.render.svg import MIN_LABEL

    args = ("circuit", TEXT, CORRUPT, "--weights", four_by_four)
    root = saved(cli, tmp_path, *args)
    doc = cli(*args, "--json").json()
    g = heatmaps(root)["edge scores: sender (row) -> receiver (column)"]
    receivers = [f"L{i}H{h}.{x}" for i in range(4) for h in range(4) for x in "qkv"]
    receivers += [f"L{i}.mlp" for i in range(4)] + ["logits"]
    senders = ["embed"] + [f"L{i}H{h}" for i in range(4) for h in range(4)] + \
        [f"L{i}.mlp" for i in range(4)]
    assert sorted(g["cols"]) == sorted(receivers) and len(g["cols"]) == 53
    assert sorted(g["rows"]) == sorted(senders)
    named = {e["receiver"] for e in doc["edges"]} | {e["sender"] for e in doc["edges"]}
    assert named <= set(g["cols"]) | set(g["rows"])  # the JSON's names are the labels
    cols = [e for e in root.iter(NS + "text") if e.get("class") == "col"]
    sizes = {float(e.get("font-size")) for e in cols}
    xs = sorted(float(e.get("x")) for e in cols)
    assert min(sizes) >= MIN_LABEL
    assert min(b - a for a, b in zip(xs, xs[1:], strict=False)) >= max(sizes)
