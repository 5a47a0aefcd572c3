"""`review` tells the seed page's story with the loaded model's numbers, and `map` its shapes."""

from __future__ import annotations

import numpy as np
from cli_helpers import TEXT, TEXT_IDS, TINY

from tinygpt_cli.storage.locations import SHIPPED
from tinygpt_cli.transformer.families import load_config
from tinygpt_cli.transformer.page import CARDS
from tinygpt_cli.transformer.sampling import create_rng, probabilities, sample
from tinygpt_cli.transformer.schema import resolve


def test_the_page_has_the_seed_cards_in_order():
    assert [c.title for c in CARDS] == [
        "Inputs", "Embedding", "Position", "Add and norm", "Masked attention", "Feed forward",
        "Repeated blocks", "Final norm", "Linear", "Softmax", "Output"]
    assert [c.number for c in CARDS] == list(range(1, 12))


def test_every_card_path_resolves_and_the_random_pick_is_a_formula(tiny):
    trace = tiny.trace(TEXT_IDS)
    for card in CARDS:
        if card.number == 11:  # a random pick is not a stored value: shown as a formula
            assert card.path is None and "sample(probs[-1]" in card.formula
            continue
        trace.get(card.path)
    np.testing.assert_allclose(trace.get(CARDS[9].path),
                               probabilities(trace.get("logits")[-1], 1.0), rtol=1e-6)


def test_every_trace_path_in_the_readme_resolves():
    """The card table's paths, `tinygpt trace TEXT PATH` commands and "path" fields, in the
    README and every page of docs/."""
    import re
    from pathlib import Path

    root = Path(__file__).parent.parent
    readme = "\n".join(p.read_text() for p in [root / "README.md", *(root / "docs").glob("*.md")])
    paths = set()
    for line in readme.splitlines():
        if re.match(r"\| \d+ [A-Z]", line):
            paths |= set(re.findall(r"`([^`]+)`", line.split("|")[3]))
        paths |= set(re.findall(r"tinygpt trace (?:\"[^\"]*\"|-) \"?([\w.\[\]-]+)\"?", line))
        paths |= set(re.findall(r'"path": ?"([^"]+)"', line))
    # formulas (card 11's random pick) and options are not paths; an SAE's latents
    # (sae.SITE) resolve through its file, not the schema (tests/test_sae.py)
    paths = {p.replace(".L.", ".0.").replace(".H.", ".0.") for p in paths
             if "(" not in p and not p.startswith(("-", "sae."))}
    assert {"probs[-1]", "logits", "layers.0.heads.0.weights"} <= paths
    # the README's examples run on the shipped model's sizes (4 heads)
    config = load_config(SHIPPED / "config.json")
    for path in sorted(paths - {"layers.0.mlp_outt"}):  # the README's own misspelt example
        resolve(path, config)


def test_review_states_this_models_sizes_in_the_pages_sentences(cli):
    out = cli("review", TEXT).out
    T, d = len(TEXT_IDS), TINY.n_embd
    for fact in (f"T = {T}", f"d = {d}", f"L = {TINY.n_layer}", f"heads = {TINY.n_head}",
                 f"d_k = {TINY.d_k}", f"ffn = {TINY.n_inner}", "vocab = 4,096 tokens",
                 "longest = 128 tokens"):
        assert fact in out, fact
    for sentence in (
        f"The text is {T} token ids, each from 0 to 4,095.",
        f"The table has 4,096 rows of {d} numbers. The text becomes {T} rows of {d}.",
        f"This model has {TINY.n_head} heads with {TINY.d_k} numbers each. Each head makes a "
        f"{T} by {T}",
        f"{d} numbers grow to {TINY.n_inner}, pass through GELU, and shrink back to {d}.",
        f"This model stacks {TINY.n_layer} blocks. The paper used 6",
    ):
        assert sentence in " ".join(out.split()), sentence
    positions = [out.index(f"{c.number}. {c.title}") for c in CARDS]
    assert positions == sorted(positions), "cards out of order"
    for card in CARDS:
        assert (card.path or "trace    none") in out and card.formula in out


def test_review_json_carries_the_real_values(cli, tiny):
    doc = cli("review", TEXT, "--json").json()
    cards = {c["number"]: c for c in doc["cards"]}
    trace = tiny.trace(TEXT_IDS)
    assert cards[1]["value"] == TEXT_IDS
    assert cards[5]["shape"] == [len(TEXT_IDS)] * 2
    np.testing.assert_allclose(cards[5]["value"], trace.get("layers.0.heads.0.weights"),
                               rtol=1e-6)
    assert cards[7]["value"] == TINY.n_layer
    probs = probabilities(trace.get("logits")[-1], 1.0)
    np.testing.assert_allclose(cards[10]["value"], probs, rtol=1e-9)
    assert cards[11]["value"] == sample(probs, create_rng(1))


def test_map_labels_every_arrow_with_its_shape_for_the_text(cli):
    out = cli("map", TEXT).out
    T, d = len(TEXT_IDS), TINY.n_embd
    for label in (f"{T} ids", f"{T} × {d}", f"× {TINY.n_layer} blocks",
                  f"q, k, v {TINY.n_head} × {T} × {TINY.d_k}", f"{T} × {TINY.n_inner}",
                  f"{T} × 4,096", "1 id"):
        assert label in out, label
    order = [out.index(s) for s in ("1 Inputs", "2 Embedding", "3 Position", "4 Norm",
                                    "5 Masked attention", "6 Feed forward", "8 Final norm",
                                    "9 Linear", "10 Softmax", "11 Output")]
    assert order == sorted(order)


def _block_lines(out: str) -> list[str]:
    """The lines inside map's block panel (between its top and bottom borders)."""
    lines = out.splitlines()
    top = next(i for i, ln in enumerate(lines) if "blocks (card 7)" in ln)
    bottom = next(i for i in range(top + 1, len(lines)) if lines[i].lstrip().startswith("╰─"))
    return lines[top + 1:bottom]


def test_map_draws_the_residual_bypass_around_each_sublayer(cli):
    """map drew no residual stream: now it forks before each sublayer (its norm) and joins
    the sublayer's output at its add, ⊕: two forks and two adds in a serial block."""
    inside = _block_lines(cli("map", TEXT).out)
    marks = [("fork" if "╭─────┤" in ln else "add" if "╰─⊕" in ln else
              "norm" if "Norm" in ln else "attn" if "Masked attention" in ln else
              "mlp" if "Feed forward" in ln else None) for ln in inside]
    assert [m for m in marks if m] == ["fork", "norm", "attn", "add", "fork", "norm", "mlp",
                                       "add"]
    # the stream's rail runs down the left of every line from a fork to its add
    first, add = marks.index("fork"), marks.index("add")
    body = [ln.split("│", 1)[1] for ln in inside]  # past the panel's own border
    assert all(b.lstrip(" ")[0] in "│╭╰" for b in body[first:add + 1]), body
    assert "resid_mid = h + attn_out" in inside[add]


def test_map_of_a_parallel_block_joins_both_branches_at_one_add(cli):
    inside = _block_lines(cli("map", TEXT, "--weights", "weights/neox").out)
    text = "\n".join(inside)
    assert text.count("⊕") == 1 and text.count("╭─────┤") == 1
    assert "╰┴⊕" in text  # the stream and the attention's output join the MLP's at one add
    assert "resid_post = resid_pre + attn_out + mlp_out" in \
        next(ln for ln in inside if "⊕" in ln)


def _svg_flow(cli, tmp_path, *args):
    import xml.etree.ElementTree as ET

    out = tmp_path / "map.svg"
    assert cli("map", TEXT, *args, "--save", out).code == 0
    ns = "{http://www.w3.org/2000/svg}"
    root = ET.parse(out).getroot()
    boxes = [float(e.get("y")) for e in root.iter(ns + "rect") if e.get("class") == "box"]
    paths = [e.get("d") for e in root.iter(ns + "path") if e.get("class") == "bypass"]
    joins = [float(e.get("cy")) for e in root.iter(ns + "circle") if e.get("class") == "join"]
    return boxes, paths, joins


def _ends(d: str) -> tuple[float, float]:
    """A bypass path's fork y and join y (M x y H x V y H x)."""
    import re

    fork, join = re.fullmatch(r"M[\d.]+ ([\d.]+) H[\d.]+ V([\d.]+) H[\d.]+", d).groups()
    return float(fork), float(join)


def test_map_picture_draws_the_bypass_paths(cli, tmp_path):
    """--save: a path from just above each sublayer's norm (boxes 3 and 6 of the map's 13,
    counted from 0) to the side of its add (boxes 5 and 8), marked there by a ⊕."""
    boxes, paths, joins = _svg_flow(cli, tmp_path)
    assert len(boxes) == 13 and len(paths) == 2 and len(joins) == 2
    height = 38  # a box's
    for d, (fork_box, add_box) in zip(paths, ((3, 5), (6, 8)), strict=True):
        fork, join = _ends(d)
        assert boxes[fork_box - 1] + height < fork < boxes[fork_box]  # above the norm
        assert join == boxes[add_box] + height / 2  # into the add's side
    assert joins == [boxes[5] + height / 2, boxes[8] + height / 2]


def test_map_picture_of_a_parallel_block_has_both_branches_join_one_add(cli, tmp_path):
    boxes, paths, _ = _svg_flow(cli, tmp_path, "--weights", "weights/neox")
    assert len(paths) == 2
    (f1, j1), (f2, j2) = (_ends(d) for d in paths)
    assert j1 == j2 == boxes[8] + 38 / 2  # the stream and attn_out both go to the last add
    assert f1 < boxes[3] and boxes[4] < f2 < boxes[5]  # the block's input; the attention's out
