"""--save: pictures you can keep. SVG output is parsed as XML and its cells, labels and hover
values checked against the numbers the CLI prints as JSON; HTML output is opened in a real
headless Chromium (skipped with a reason when none is installed) and checked for errors,
requests, the cards and cells in the rendered DOM, phone and desktop layout, and screenshots.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from browser import decode_png
from cli_helpers import TEXT, TEXT_IDS, TINY, assert_one_error_line

from tinygpt_cli.render import html, svg
from tinygpt_cli.render.figure import Figure, Heatmap, causal_mask
from tinygpt_cli.render.text import show_token
from tinygpt_cli.transformer.page import CARDS
from tinygpt_cli.transformer.sampling import probabilities

NS = "{http://www.w3.org/2000/svg}"
T = len(TEXT_IDS)
TRIANGLE = T * (T + 1) // 2  # the cells a causal attention grid draws
TIP = re.compile(r"^row (\d+) (.*) · column (\d+)(?: (.*))? = (\S+)$")
# Anything that would make a browser reach outside the file.
EXTERNAL = re.compile(r"https?:|//|\bsrc=|\bhref=|@import|@font-face|url\((?!#)", re.I)


def parse(path: Path) -> ET.Element:
    return ET.parse(path).getroot()


def cells(root: ET.Element) -> list[ET.Element]:
    return [e for e in root.iter(NS + "rect") if e.get("class") == "cell"]


def labels(root: ET.Element, cls: str) -> list[str]:
    return [e.text for e in root.iter(NS + "text") if e.get("class") == cls]


def tip(cell: ET.Element) -> tuple[int, str, int, str, str]:
    m = TIP.match(cell.find(NS + "title").text)
    assert m, cell.find(NS + "title").text
    return int(m[1]), m[2], int(m[3]), m[4], m[5]


def tokens_of(tiny) -> list[str]:
    return [tiny.model.tokenizer.token_str(i) for i in TEXT_IDS]


# ------------------------------------------------------------------ SVG


def test_attn_svg_has_a_cell_per_visible_weight_with_its_exact_value(cli, tiny, tmp_path):
    out = tmp_path / "attn.svg"
    r = cli("attn", TEXT, "--layer", 1, "--head", 1, "--save", out)
    assert r.code == 0, r.err
    assert "layers.1.heads.1.weights" in r.out  # the terminal view is still printed
    weights = np.asarray(cli("attn", TEXT, "--layer", 1, "--head", 1, "--json").json()["data"],
                         dtype=np.float64)
    root = parse(out)
    shown = [show_token(t) for t in tokens_of(tiny)]
    assert labels(root, "row") == shown and labels(root, "col") == shown
    found = cells(root)
    assert len(found) == TRIANGLE
    seen = set()
    for cell in found:
        i, row, j, col, value = tip(cell)
        assert j <= i and (row, col) == (shown[i], shown[j])
        # The hover text reads back as the very float32 the JSON document carries.
        assert value == str(np.float32(weights[i, j]))
        seen.add((i, j))
    assert seen == {(i, j) for i in range(T) for j in range(i + 1)}
    # The first token can only look at itself: weight 1, the top colour of the scale (viridis).
    first = next(c for c in found if tip(c)[:3:2] == (0, 0))
    assert first.get("fill") == "#fde725"
    info = " ".join(e.text for e in root.iter(NS + "text"))
    assert "layers.1.heads.1.weights" in info and f"{T} × {T}" in info
    assert "range [0.000, 1.000]" in info
    assert root.find(NS + "title").text.startswith("layers.1.heads.1.weights")


def test_all_heads_svg_draws_every_head(cli, tmp_path):
    out = tmp_path / "heads.svg"
    assert cli("attn", TEXT, "--all-heads", "--save", out, "--quiet").code == 0
    root = parse(out)
    assert len(cells(root)) == TINY.n_head * TRIANGLE
    titles = [e.text for e in root.iter(NS + "text")]
    assert [f"head {h}" for h in range(TINY.n_head)] == [t for t in titles if
                                                         t.startswith("head ")]


def test_scores_svg_leaves_the_masked_cells_blank(cli, tmp_path):
    out = tmp_path / "scores.svg"
    assert cli("attn", TEXT, "--scores", "--save", out).code == 0
    values = [float(tip(c)[4]) for c in cells(parse(out))]
    assert len(values) == TRIANGLE and all(np.isfinite(values))


def test_every_string_is_escaped():
    nasty = ["<b>", "a&b", "\x1b[31m", '"q"', "\x00\x7f", "\ud800"]
    fig = Figure("<title> & \x1b", [Heatmap(np.eye(len(nasty)), nasty, nasty, title="<t>",
                                            path="p<&>", masked=causal_mask(len(nasty)))])
    root = ET.fromstring(svg.document(fig).encode("utf-8"))  # parses: nothing raw got through
    assert labels(root, "row")[:4] == ["<b>", "a&b", "\\x1b[31m", '"q"']
    assert labels(root, "row")[4:] == ["\\x00\\x7f", "\\ud800"]
    page = html.document(fig)
    assert "<b>" not in page and "\x1b" not in page and "<title> &" not in page
    assert "&lt;b&gt;" in page


def test_signed_values_get_a_scale_centred_on_zero(tmp_path):
    grid = np.array([[-1.0, 0.0, 3.0]])
    b = svg.heatmap(Heatmap(grid, ["r"], ["a", "b", "c"]))
    fills = re.findall(r'class="cell"[^>]*fill="(#[0-9a-f]{6})"', b.body)
    assert fills[1] == "#f7f7f7"  # zero is the neutral middle, not a third of the way up
    assert "range [-3.000, 3.000]" in b.body


# ------------------------------------------------------------------ the --save contract


def test_quiet_prints_nothing_and_json_is_unchanged(cli, tmp_path):
    out = tmp_path / "e.svg"
    r = cli("embed", TEXT, "--save", out, "--quiet")
    assert (r.code, r.out, r.err) == (0, "", "") and out.stat().st_size > 0
    plain = cli("embed", TEXT, "--json").out
    r = cli("embed", TEXT, "--json", "--save", tmp_path / "e.html")
    assert r.out == plain and (tmp_path / "e.html").exists()
    assert cli("embed", TEXT).out.startswith("token_embeddings")  # --quiet did not stick


def test_an_existing_file_needs_force(cli, tmp_path):
    out = tmp_path / "p.svg"
    out.write_text("mine")
    r = cli("probs", TEXT, "--save", out)
    assert_one_error_line(r, 2, str(out), "exists", "--force")
    assert out.read_text() == "mine"
    assert cli("probs", TEXT, "--save", out, "--force", "--quiet").code == 0
    assert parse(out).tag == NS + "svg"


@pytest.mark.parametrize("name, needle", [
    ("nowhere/p.svg", "does not exist"),
    ("p.jpg", "unknown extension '.jpg'"),
    ("p", "unknown extension '(none)'"),
])
def test_bad_save_paths_are_one_line_errors(cli, tmp_path, name, needle):
    r = cli("attn", TEXT, "--save", tmp_path / name)
    assert_one_error_line(r, 2, "--save", needle)
    assert list(tmp_path.iterdir()) == [] or name == "nowhere/p.svg"


def test_a_long_texts_grid_stays_readable(cli, tiny, tmp_path):
    """128 tokens: labels of at least 9 px that do not overlap, the last token labelled, every
    token on hover, a page that fits 1,200 px, and a scale under which a weight of 2/T does
    not look like one of 1/T (sqrt: the legend says so)."""
    from tinygpt_cli.transformer.tokenizer import Tokenizer

    tok = Tokenizer.from_file(Path(tiny.folder) / "tokenizer.json")
    text = tok.decode(tok.encode(" ".join(["Lily wanted to play with her ball."] * 30))[:128])
    assert len(tok.encode(text)) == 128
    out = tmp_path / "long.svg"
    r = cli("attn", text, "--layer", 0, "--head", 0, "--save", out, "--quiet")
    assert r.code == 0, r.err
    root = parse(out)
    assert float(root.get("width")) <= 1200
    for cls, axis in (("row", "y"), ("col", "x")):
        shown = [e for e in root.iter(NS + "text") if e.get("class") == cls]
        sizes = {float(e.get("font-size")) for e in shown}
        assert min(sizes) >= 9, sizes
        at = [float(e.get(axis)) for e in shown]
        assert min(np.diff(at)) >= min(sizes), "labels overlap"
        assert len(shown) >= 128 // 2
    found = cells(root)
    assert len(found) == 128 * 129 // 2
    ends = [tip(c) for c in found if tip(c)[0] == 127]
    assert [e[2] for e in ends] == list(range(128)) and all(e[1] for e in ends)
    assert labels(root, "row")[-1] == ends[0][1]  # the last token has its label
    info = " ".join(e.text for e in root.iter(NS + "text"))
    assert "colour ∝ value^0.5" in info
    by_value = {}
    for c in found:
        by_value.setdefault(round(float(tip(c)[4]), 2), c.get("fill"))
    small = sorted(v for v in by_value if v > 0)
    assert len({by_value[v] for v in small[:5]}) == 5  # the smallest weights differ in colour


def test_all_heads_wrap_to_fit_1200_px(cli, tmp_path):
    text = " ".join(["Lily wanted to play with her ball."] * 6)
    out = tmp_path / "heads.svg"
    assert cli("attn", text, "--all-heads", "--save", out, "--quiet").code == 0
    assert float(parse(out).get("width")) <= 1200


def test_png_is_the_svg_drawing_rasterised(cli, tmp_path):
    """--save x.png draws what x.svg describes: its size in pixels, and every cell of the
    attention grid filled, at its centre, with the colour the SVG gives it."""
    pytest.importorskip("resvg_py")
    r = cli("attn", TEXT, "--layer", 1, "--head", 1, "--save", tmp_path / "a.svg", "--quiet")
    assert r.code == 0, r.err
    r = cli("attn", TEXT, "--layer", 1, "--head", 1, "--save", tmp_path / "a.png", "--quiet")
    assert r.code == 0, r.err
    root = parse(tmp_path / "a.svg")
    image = decode_png((tmp_path / "a.png").read_bytes())
    assert image.shape[:2] == (round(float(root.get("height"))), round(float(root.get("width"))))
    found = cells(root)
    assert len(found) == TRIANGLE
    parent = {child: node for node in root.iter() for child in node}
    for cell in found:
        x = float(cell.get("x")) + float(cell.get("width")) / 2
        y = float(cell.get("y")) + float(cell.get("height")) / 2
        node = cell
        while node in parent:  # the groups' translate(dx dy) add up to the page position
            node = parent[node]
            m = re.fullmatch(r"translate\(([-\d.]+) ([-\d.]+)\)", node.get("transform", ""))
            if m:
                x, y = x + float(m[1]), y + float(m[2])
        fill = cell.get("fill")
        want = [int(fill[i:i + 2], 16) for i in (1, 3, 5)]
        assert list(image[int(y), int(x), :3]) == want, (tip(cell), fill)


def test_png_without_its_renderer_says_what_to_install(cli, tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "resvg_py" else real(name, *a))
    r = cli("attn", TEXT, "--save", tmp_path / "a.png")
    assert_one_error_line(r, 2, "a PNG needs resvg, the png extra",
                          'pip install "tinygpt-cli[png]"')
    assert list(tmp_path.iterdir()) == []


def test_pictures_are_written_atomically(cli, tmp_path, monkeypatch):
    written = []
    from tinygpt_cli.render import output

    real = output.write_atomically
    monkeypatch.setattr(output, "write_atomically",
                        lambda path, data: written.append(path) or real(path, data))
    assert cli("logits", TEXT, "--save", tmp_path / "l.html", "--quiet").code == 0
    assert written == [tmp_path / "l.html"]


DRAWING = [("embed",), ("pos",), ("pos", "--sum"), ("norm", "--which", "ln2"), ("final-norm",),
           ("attn",), ("attn", "--all-heads"), ("mlp",), ("blocks",), ("logits",), ("probs",),
           ("map",), ("review",)]


@pytest.mark.parametrize("command", DRAWING, ids=" ".join)
def test_every_drawing_command_saves_svg_and_offline_html(cli, tmp_path, command):
    for ext in ("svg", "html"):
        out = tmp_path / f"pic.{ext}"
        r = cli(*command, TEXT, "--save", out)
        assert r.code == 0, r.err
        assert r.out  # still printed
        data = out.read_text(encoding="utf-8")
        if ext == "svg":
            root = parse(out)
            drawn = root.iter(NS + "rect")
            assert any(e.get("class") in ("cell", "bar", "box") for e in drawn)
        else:
            assert data.startswith("<!DOCTYPE html>") and "<style>" in data
            assert not EXTERNAL.search(data), EXTERNAL.search(data)


# ------------------------------------------------------------------ in a real browser



def non_blank(png: bytes, width: int) -> None:
    pixels = decode_png(png)[..., :3]
    assert pixels.shape[1] == width
    background = pixels[0, 0]
    inked = (pixels != background).any(axis=2).mean()
    colours = len(np.unique(pixels.reshape(-1, 3), axis=0))
    assert inked > 0.03 and colours > 20, (inked, colours)


def test_the_error_checks_can_fail(browser, tmp_path):
    page = tmp_path / "bad.html"
    page.write_text('<img src="missing.png"><img src="https://example.invalid/x.png">'
                    "<script>console.error('boom'); nope();</script>")
    load = browser.open(page)
    assert any("boom" in e for e in load.errors) and any("nope" in e for e in load.errors)
    assert len(load.failed) == 2
    assert "https://example.invalid/x.png" in load.requests


def test_review_page_in_chromium(cli, tiny, browser, tmp_path):
    page = tmp_path / "review.html"
    r = cli("review", TEXT, "--save", page, "--quiet")
    assert (r.code, r.out, r.err) == (0, "", "")
    tokens = [show_token(t) for t in tokens_of(tiny)]
    for width in (390, 1280):
        load = browser.open(page, width=width, height=900)
        assert load.errors == [] and load.failed == []
        assert load.requests == [page.resolve().as_uri()]  # nothing else was asked for
        # The page fits the window: nothing is cut off or needs sideways scrolling.
        assert browser.evaluate("document.documentElement.scrollWidth") <= width
        non_blank(browser.screenshot(width, 900), width)
    dom = browser.evaluate("""(() => {
        const q = (s, root = document) => Array.from(root.querySelectorAll(s));
        return {
          cards: q("section.card[id^=card-]").map(c => ({id: c.id,
              h: c.querySelector("h2").textContent, text: c.textContent,
              cells: q("rect.cell", c).length, bars: q("rect.bar title", c).map(
                  t => t.textContent)})),
          cells: q("rect.cell").length,
          boxes: q("#map rect.box").length,
          colLabels: q("#card-5 svg")[0] ? q("text.col", q("#card-5 svg")[0]).map(
              t => t.textContent) : [],
          facts: document.querySelector("#facts").textContent,
        };
    })()""")
    cards = dom["cards"]
    assert [c["id"] for c in cards] == [f"card-{c.number}" for c in CARDS]
    for got, card in zip(cards, CARDS, strict=True):
        assert got["h"] == f"{card.number}. {card.title}"
        for piece in (card.what, card.formula, card.path or "a random pick"):
            assert piece in got["text"], (card.number, piece)
    d, heads, layers = TINY.n_embd, TINY.n_head, TINY.n_layer
    per_card = {c["id"]: c["cells"] for c in cards}
    assert all(per_card[f"card-{n}"] == T * d for n in (2, 3, 4, 6, 8))
    shapes = {1: f"shape{T}", 2: f"shape{T} × {d}", 5: f"shape{T} × {T}",
              9: f"shape{T} × {TINY.vocab_size}", 10: f"shape{TINY.vocab_size}",
              11: "shape1 id"}
    for n, shape in shapes.items():
        assert shape in cards[n - 1]["text"], (n, shape)
    assert per_card["card-5"] == layers * heads * TRIANGLE
    assert dom["cells"] == 5 * T * d + layers * heads * TRIANGLE
    assert dom["colLabels"] == tokens
    assert dom["boxes"] == 13
    assert f"T = {T}" in dom["facts"] and f"d = {d}" in dom["facts"]
    # The top next tokens, against an independent softmax of the last row of logits.
    logits = tiny.trace(TEXT_IDS).get("logits")[-1]
    probs = probabilities(logits.astype(np.float64), 1.0)
    top = np.argsort(-probs, kind="stable")[:10]
    bars = next(c["bars"] for c in cards if c["id"] == "card-10")
    assert [b.split(": ")[0] for b in bars] == [
        f"{k + 1}. {show_token(tiny.model.tokenizer.token_str(int(i)))}"
        for k, i in enumerate(top)]
    for b, i in zip(bars, top, strict=True):
        assert float(b.rsplit("= ", 1)[1]) == pytest.approx(probs[i], rel=1e-5, abs=1e-9)


def test_tapping_a_cell_shows_its_tokens_and_value(cli, browser, tmp_path):
    page = tmp_path / "attn.html"
    assert cli("attn", TEXT, "--save", page, "--quiet").code == 0
    load = browser.open(page, width=390)
    assert load.errors == []
    shown = browser.evaluate("""(() => {
        const cell = document.querySelectorAll("rect.cell")[4];
        cell.dispatchEvent(new MouseEvent("click", {bubbles: true}));
        return [cell.querySelector("title").textContent,
                document.getElementById("tip").textContent];
    })()""")
    assert shown[0] == shown[1] and TIP.match(shown[1])


def test_page_prints(cli, browser, tmp_path):
    page = tmp_path / "map.html"
    assert cli("map", TEXT, "--save", page, "--quiet").code == 0
    browser.open(page)
    pdf = browser.call("Page.printToPDF", session=True)["data"]
    import base64

    assert base64.b64decode(pdf).startswith(b"%PDF")


def test_svg_opens_cleanly_in_chromium(cli, browser, tmp_path):
    out = tmp_path / "heads.svg"
    assert cli("attn", TEXT, "--all-heads", "--save", out, "--quiet").code == 0
    load = browser.open(out)
    assert load.errors == [] and load.requests == [out.resolve().as_uri()]
    assert browser.evaluate("document.querySelectorAll('rect.cell').length") == \
        TINY.n_head * TRIANGLE


# ------------------------------------------------------------------ the README's picture


def test_readme_picture_is_the_seed_sentence_with_every_head():
    pic = Path(__file__).parent.parent / "docs" / "attn_all_heads.svg"
    root = parse(pic)
    assert len(cells(root)) == 4 * TRIANGLE  # the shipped model's 4 heads, 6 tokens
    assert "Lily" in labels(root, "row")
    readme = (pic.parent.parent / "README.md").read_text()
    assert "docs/attn_all_heads.svg" in readme


def test_save_says_where_the_picture_went(cli, tmp_path):
    """A note on stderr, as `means` says what it wrote (issue 22: --save wrote silently);
    --quiet writes the file and says nothing."""
    out = tmp_path / "attn.svg"
    r = cli("attn", TEXT, "--save", out)
    assert r.code == 0 and r.err == f"wrote {out}\n" and out.is_file()
    assert cli("attn", TEXT, "--save", out, "--force", "--quiet").err == ""


def test_an_emoji_split_over_byte_tokens_is_labelled_by_the_character(cli, tiny, tmp_path):
    """'🐻' is several byte tokens, none a character alone: a picture names each by the
    character they make and its piece number, where the terminal shows the bytes (\\xNN)."""
    text = "a 🐻 bear"
    ids = tiny.model.tokenizer.encode(text)
    raw = [tiny.model.tokenizer.token_str(i) for i in ids]
    pieces = [t for t in raw if "\\x" in t]
    assert len(pieces) >= 2  # the premise: the bear is split into stray bytes
    out = tmp_path / "attn.svg"
    assert cli("attn", text, "--layer", 0, "--head", 0, "--save", out).code == 0
    shown = labels(parse(out), "row")
    assert len(shown) == len(ids) and not any("\\x" in s for s in shown)
    named = [s for s in shown if "🐻" in s]
    assert len(named) == len(pieces)
    assert [s[-1] for s in named] == list("₁₂₃₄"[: len(named)])
    # the bytes the pieces stand for are the bear's own
    assert b"".join(tiny.model.tokenizer.token_bytes(i) for i in ids
                    if "\\x" in tiny.model.tokenizer.token_str(i)).decode().strip() == "🐻"


def test_bytes_no_neighbour_completes_stay_escaped():
    from tinygpt_cli.render.text import whole_characters

    lone = ["\\xbb", "x", " \\xf0"]  # a continuation byte first, a lead byte last
    assert whole_characters(lone) == lone
    assert whole_characters(["\\xf0\\x9f", "\\x90\\xbb", "!"]) == ["🐻₁", "🐻₂", "!"]


def test_a_sliding_windows_attention_picture_blanks_the_keys_before_the_window():
    """attn --save on a sliding block: a cell is blank exactly where the query cannot look,
    after it (causal) or `window` or more tokens before it, as a loop over the cells says."""
    from tinygpt_cli.render.figure import attention_figure

    t, w = 7, 3
    grid = np.tril(np.ones((t, t))) / np.arange(1, t + 1)[:, None]
    fig = attention_figure("layers.0.heads.0.weights", grid, [f"t{i}" for i in range(t)],
                           window=w)
    naive = np.array([[j > i or i - j >= w for j in range(t)] for i in range(t)])
    np.testing.assert_array_equal(fig.parts[0].masked, naive)
    assert "window of 3 tokens" in fig.parts[1].text
    whole = attention_figure("layers.0.heads.0.weights", grid, [f"t{i}" for i in range(t)])
    np.testing.assert_array_equal(whole.parts[0].masked, np.triu(np.ones((t, t), bool), 1))
