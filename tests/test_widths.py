"""Any terminal width: tables drop middle columns behind `…` rather than cut a number or a name,
header lines wrap between fields, and --top never asks for more than there is."""

from __future__ import annotations

import re

import pytest
from cli_helpers import TEXT

LONG = ("Once upon a time there was a little girl named Lily who loved to play in the park "
        "with her dog and her red ball")

COMMANDS = [
    ["embed", TEXT], ["pos", TEXT, "--sum"], ["norm", TEXT], ["final-norm", TEXT],
    ["attn", TEXT], ["attn", LONG], ["attn", LONG, "--all-heads"], ["attn", LONG, "--scores"],
    ["mlp", TEXT, "--top", "20"], ["blocks", TEXT], ["logits", TEXT], ["probs", TEXT],
    ["encode", TEXT], ["trace", TEXT, "layers.0.q"], ["trace", TEXT, "logits[-1]"],
    ["sample", TEXT], ["info"], ["trace", TEXT, "ids"], ["lens", TEXT], ["lens", LONG],
    ["neurons", TEXT, "--top", "5"],
    ["attribute", TEXT, "--method", "attention-x-grad"],
    ["attribute", TEXT, "--method", "integrated-gradients"],
]
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[+-]\d+)?%?")
HEADER_KEYS = ("min", "mean", "max", "std")


def check_fits(out: str, width: int, argv) -> None:
    for line in out.splitlines():
        assert len(line) <= width, (argv, width, line)
        # a cut number or name would end in Rich's `…` glued to it
        assert not re.search(r"\w…|…\w", line), (argv, width, line)
        # header fields stay whole: "min" is never at the end of a line without its value
        if re.search(r"\d", line):  # (a note in prose may end in "std")
            assert not line.rstrip().endswith(HEADER_KEYS), (argv, width, line)


@pytest.mark.parametrize("width", [40, 80, 200])
@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a)[:30])
def test_every_view_fits_the_width_without_cutting(cli, monkeypatch, argv, width):
    monkeypatch.setenv("COLUMNS", str(width))
    r = cli(*argv)
    assert r.code == 0, r.err
    if argv[0] == "info" and width == 40:
        return  # the sha256 and the weights path are single words longer than 40
    check_fits(r.out, width, argv)


def numbers(text: str) -> list[str]:
    return NUMBER.findall(text)


def test_blocks_and_lens_at_80_columns_shrink_or_wrap_and_hide_nothing(cli, monkeypatch):
    """blocks shortens its stage names (layers.2.resid_post -> 2.post), lens goes on below in
    bands of stages: every number of the wide view is there, in the same order, at 80."""
    for argv in (["blocks", TEXT], ["lens", TEXT]):
        monkeypatch.setenv("COLUMNS", "200")
        wide = cli(*argv).out
        monkeypatch.setenv("COLUMNS", "80")
        narrow = cli(*argv).out
        check_fits(narrow, 80, argv)
        assert "…" not in narrow.replace("…)", "")
        assert sorted(numbers(narrow)) == sorted(numbers(wide)), argv
    assert "1.post" in cli("blocks", TEXT).out
    stages = cli("lens", TEXT, "--json").json()["stages"]
    out = cli("lens", TEXT).out
    assert all(f"{s.split('.')[1]}.{s.split('.')[2].removeprefix('resid_')}" in out
               for s in stages if s != "embeddings")


@pytest.mark.parametrize("argv", [["embed", TEXT], ["attn", LONG]])
def test_a_narrow_view_keeps_the_first_and_last_columns_whole(cli, monkeypatch, argv):
    monkeypatch.setenv("COLUMNS", "200")
    wide = cli(*argv, *(["--full"] if argv[0] in ("embed", "attn", "mlp") else [])).out
    monkeypatch.setenv("COLUMNS", "80")
    narrow = cli(*argv).out
    body = [ln for ln in narrow.splitlines() if "…" in ln.split()]
    assert body, narrow  # something was dropped, behind one `…` column
    full_rows = {ln.split()[0] + ln.split()[1]: ln.split() for ln in wide.splitlines()
                 if len(ln.split()) > 2}
    for line in body:
        cells = line.split()
        i = cells.index("…")
        key = cells[0] + cells[1]
        if key in full_rows:  # a data row: the kept cells are the full row's own ends
            whole = full_rows[key]
            tail = cells[i + 1:]
            assert cells[:i] == whole[:i] and tail == whole[len(whole) - len(tail):]


def test_mlp_top_20_at_80_columns_names_its_first_and_last_neuron(cli, monkeypatch):
    doc = cli("mlp", TEXT, "--top", "20", "--json").json()
    neurons = [n["neuron"] for n in doc["top_neurons"]]
    monkeypatch.setenv("COLUMNS", "80")
    out = cli("mlp", TEXT, "--top", "20").out
    assert f"n{neurons[0]}" in out and f"n{neurons[-1]}" in out


def test_header_lines_wrap_between_fields(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    lines = cli("embed", TEXT).out.splitlines()
    head = " ".join(" ".join(lines[:3]).split())
    assert re.search(r"token_embeddings 6 × 16 float32 min -?[\d.]+ mean -?[\d.e+-]+", head)
    assert lines[1].startswith("  ")  # continuation lines are indented


def test_top_larger_than_what_exists_is_capped(cli):
    doc = cli("logits", TEXT, "--top", "100000", "--json").json()
    assert len(doc["top"]) == 4096
    out = cli("probs", TEXT, "--top", "100000").out
    assert "these 4,096 hold 100.0% of the chance" in out
    doc = cli("mlp", TEXT, "--top", "100000", "--json").json()
    assert len(doc["top_neurons"]) == 24  # the feed-forward width of the tiny model
    out = cli("mlp", TEXT, "--top", "100000").out
    assert not any(set(ln.split()) == {"…"} for ln in out.splitlines())
    assert out.count("…") == 2 * 7  # one `…` column in each table: header + 6 rows


@pytest.mark.parametrize("width", [80, 200])
def test_patch_grids_flow_to_fit_the_width(cli, monkeypatch, width):
    """The five position x layer grids stand side by side only when there is room."""
    monkeypatch.setenv("COLUMNS", str(width))
    r = cli("patch", TEXT, "Lily wanted to read with her", "--target", "#1", "--vs", "#2")
    assert r.code == 0, r.err
    check_fits(r.out, width, ["patch"])
    titles = [ln for ln in r.out.splitlines() if "resid_pre" in ln and "resid_mid" in ln]
    assert titles and ("mlp_out" in titles[0]) == (width == 200)
    # the numbers of a column line up (right-aligned: 100% over 86% over 0%)
    rows = [ln for ln in r.out.splitlines() if re.match(r"\s+\d+ \S+\s+-?\d+%", ln)]
    bands = [[]]
    for ln in rows:  # each band of grids starts again at position 0
        if ln.split()[0] == "0" and bands[-1]:
            bands.append([])
        bands[-1].append(ln)
    assert bands[0] and all(len(b) == len(TEXT.split()) for b in bands)
    for band in bands:
        assert len({tuple(m.end() for m in re.finditer("%", ln)) for ln in band}) == 1, band


@pytest.mark.parametrize("columns", ["0", "1", "5"])
@pytest.mark.parametrize("argv", [["embed", TEXT], ["probs", TEXT], ["encode", TEXT]],
                         ids=lambda a: a[0])
def test_a_terminal_width_below_the_minimum_is_ignored(cli, monkeypatch, argv, columns):
    """COLUMNS=0 on a terminal printed nothing at all; a too-narrow width means 80 there,
    and the pipe width (120) in a pipe."""
    monkeypatch.setenv("COLUMNS", columns)
    piped = cli(*argv)
    assert piped.code == 0 and piped.out == cli_at(cli, monkeypatch, "120", argv).out
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # Rich takes stdout for a terminal
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", columns)
    r = cli(*argv)
    assert r.code == 0 and r.out.strip(), r.err
    assert r.out == cli_at(cli, monkeypatch, "80", argv).out


def cli_at(cli, monkeypatch, columns: str, argv):
    monkeypatch.setenv("COLUMNS", columns)
    return cli(*argv)


def test_a_narrow_lens_goes_on_in_bands_with_no_masked_dot(cli, monkeypatch):
    """`·` means a masked cell (attn's future tokens); the lens has none, and at 40 columns
    its 5 stages go on below in bands: each position's row once per band."""
    monkeypatch.setenv("COLUMNS", "40")
    out = cli("lens", LONG).out
    rows = [ln for ln in out.splitlines() if re.match(r"\s+0 ", ln)]
    assert len(rows) >= 2 and "·" not in out and "…" not in out.replace("…)", "")


@pytest.mark.parametrize("width", ["80", "200"])
def test_the_lens_shows_each_guess_whole(cli, monkeypatch, width):
    # cells of 7 characters cut the shipped model's ' favorite' and ' friends' to `␣favori`
    # and `␣friend`, the second a token of its own: the grid named a guess it did not make
    from tinygpt_cli.render.text import show_token

    monkeypatch.setenv("COLUMNS", width)
    out = cli("lens", LONG).out
    doc = cli("lens", LONG, "--json").json()
    guesses = {show_token(g) for row in doc["top_tokens"] for g in row}
    assert max(map(len, guesses)) > 7  # some guess longer than the old cells
    grid = out.split("the target at")[0].splitlines()[3:]
    cells = {c for line in grid for c in line.split()[2:]}  # past each row's label
    assert guesses <= cells | {show_token(t) for t in doc["tokens"]}
    assert {c for c in cells if c not in guesses and not c.isdigit()} <= {
        "emb", "…"} | {c for c in cells if "." in c}  # stage names only


def test_blocks_full_shows_every_column_at_any_width(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    cut, full = cli("blocks", TEXT).out, cli("blocks", TEXT, "--full").out
    names = ("‖h‖ mean", "‖h‖ at pos", "‖attn_out‖", "‖mlp_out‖", "change", "top guess",
             "chance")
    assert all(n in cut for n in names)  # 40 columns: in bands, none hidden
    assert all(n in full for n in names) and "…" not in full.split("change =")[1]


def test_score_context_keeps_the_tokens_nearest_and_decodes_them_together(cli, tiny):
    from tinygpt_cli.render.text import show_token

    text = ("Lily went to the caf\u00e9 with her grandmother and they ate a big cake "
            "\U0001f600 at home")
    ids = cli("encode", text, "--json").json()["ids"]
    tok = tiny.model.tokenizer
    out = cli("score", text, "--top", "30").out
    rows = [ln.split() for ln in out.split("most surprising tokens")[1].splitlines()[2:]
            if ln.strip()]
    assert len(rows) >= 20
    for row in rows:
        p, context = int(row[0]), row[-1]
        before = b"".join(tok.token_bytes(i) for i in ids[max(0, p - 6):p])
        want = show_token(before.decode("utf-8", errors="ignore"))
        want = want if len(want) <= 24 else "\u2026" + want[-23:]  # the end is kept
        if p >= 2:
            assert context == want, (p, context, want)
    assert any("caf\u00e9" in row[-1] for row in rows)
    assert not any("\\x" in row[-1] for row in rows)


@pytest.mark.parametrize("width", [40, 80])
def test_one_ablated_component_wraps_its_values_instead_of_cutting_them(cli, monkeypatch,
                                                                         width):
    monkeypatch.setenv("COLUMNS", str(width))
    r = cli("ablate", TEXT, "-l", "1", "-H", "0", "-n", "8")
    assert r.code == 0, r.err
    check_fits(r.out, width, ["ablate"])
    assert "KL(before ‖ after)" in r.out and "…" not in r.out
    doc = cli("ablate", TEXT, "-l", "1", "-H", "0", "-n", "8", "--json").json()
    flat = " ".join(r.out.split())
    entries = doc["top_before"] + doc["components"][0]["top_after"]
    assert len(entries) == 16
    for entry in entries:  # every token of both lists, with its chance, whole
        shown = f"{entry['token'].replace(' ', chr(0x2423))} {entry['prob']:.1%}"
        assert shown in flat, shown


@pytest.fixture
def tiny_transcoders(tiny, tmp_path):
    """Random transcoders for the tiny model (12 latents, k = 3), made for its weights."""
    import numpy as np

    from tinygpt_cli.analysis import sae as S
    from tinygpt_cli.jobs.dictionaries import saes as SF
    from tinygpt_cli.storage.files import sha256

    rng = np.random.default_rng(0)
    d, m = tiny.model.config.n_embd, 12
    for i in range(tiny.model.config.n_layer):
        w_dec = rng.normal(size=(m, d)).astype(np.float32)
        w_dec /= np.linalg.norm(w_dec, axis=1, keepdims=True)
        tc = S.SAE(rng.normal(size=(d, m)).astype(np.float32),
                   rng.normal(0.5, 0.3, m).astype(np.float32), w_dec,
                   np.zeros(d, np.float32), f"layers.{i}.mlp_out", 3,
                   b_in=np.zeros(d, np.float32))
        SF.save_sae(tmp_path / "tc" / f"layers.{i}.safetensors", tc,
                   {"kind": "transcoder", "layer": str(i), "k": "3",
                    "weights_sha256": sha256(tiny.model.weights_file)})
    return tmp_path / "tc"


@pytest.mark.parametrize("width", [40, 80])
def test_graph_fits_the_width_without_cutting(cli, monkeypatch, tiny_transcoders, width,
                                              tmp_path):
    monkeypatch.setenv("COLUMNS", str(width))
    data = tmp_path / "stories.txt"  # labels from a small text, not the project's data
    data.write_text((LONG + ".\n\n" + TEXT + ".\n\n") * 12, encoding="utf-8")
    for extra in ([], ["--qk", "--group"]):
        argv = ["graph", LONG, "--transcoders", str(tiny_transcoders), "-n", "6", "--data",
                str(data), "--windows", "2", *extra]
        r = cli(*argv)
        assert r.code == 0, r.err
        assert "features of most influence" in r.out
        check_fits(r.out, width, argv)
        if extra:
            assert "attention edges of most weight" in r.out


@pytest.fixture(scope="module")
def four_heads(tmp_path_factory):
    """The tiny test model with 4 heads, the shipped model's count (the 2-head one fits a
    row at 200 columns either way)."""
    from dataclasses import replace

    from cli_helpers import TINY, random_params, write_folder

    config = replace(TINY, n_head=4)
    return write_folder(tmp_path_factory.mktemp("four") / "weights", random_params(config, 3),
                        config)


@pytest.mark.parametrize("width", [80, 120, 200])
def test_all_heads_rows_are_even(cli, monkeypatch, four_heads, width):
    """attn --all-heads at 200 columns laid out 3 heads, then 1 alone: the rows now share
    the heads evenly (counts differ by at most one, the longer rows first), as many to a row
    as fit, and every line fits the width."""
    monkeypatch.setenv("COLUMNS", str(width))
    r = cli("attn", TEXT, "--all-heads", "--weights", four_heads)
    assert r.code == 0, r.err
    check_fits(r.out, width, width)
    rows = [len(re.findall(r"\bhead \d+\b", line)) for line in r.out.splitlines()]
    rows = [k for k in rows if k]
    assert sum(rows) == 4, rows  # 4 heads, each once
    assert max(rows) - min(rows) <= 1 and rows == sorted(rows, reverse=True), (width, rows)
    # as few rows as fit: one row fewer would need a row too wide for the width
    widest = max(len(line) for line in r.out.splitlines()[1:])
    per_head = (widest + 3) // rows[0]
    fewer = len(rows) - 1
    assert not fewer or -(-4 // fewer) * per_head - 3 > width, (width, rows, widest)


@pytest.mark.parametrize("n", range(1, 13))
@pytest.mark.parametrize("fit", range(1, 8))
def test_even_rows_share_any_head_count(n, fit):
    from tinygpt_cli.render.cards import even_rows

    rows = even_rows(n, fit)
    assert sum(rows) == n and max(rows) <= fit
    assert len(rows) == -(-n // fit)  # no more rows than filling each would take
    assert max(rows) - min(rows) <= 1 and rows == sorted(rows, reverse=True)


def test_trace_in_a_pipe_fits_the_pipe_width(cli, monkeypatch):
    """trace TEXT PATH | head: with no COLUMNS and stdout not a terminal, every line fits the
    width every other view uses for a pipe (render.output.PIPE_WIDTH)."""
    from tinygpt_cli.render.output import PIPE_WIDTH

    monkeypatch.delenv("COLUMNS", raising=False)
    for path in ("layers.0.heads.0.weights", "layers.0.weights", "layers.0.resid_post",
                 "tokens", "logits[-1]", "layers.0.q"):
        r = cli("trace", LONG + " " + LONG, path)
        assert r.code == 0, r.err
        check_fits(r.out, PIPE_WIDTH, path)
    r = cli("trace", LONG, "--list")
    check_fits(r.out, PIPE_WIDTH, "--list")


def test_a_pipe_read_at_a_terminal_fits_that_terminal(cli, monkeypatch):
    """trace TEXT PATH | head at a 60-column terminal: stdout is a pipe, stderr still the
    terminal it is read at, so every line fits 60 columns, not the 120 of a file."""
    import os
    import sys

    from tinygpt_cli.render import output

    class Terminal:  # the stderr of a command typed at a terminal
        def __init__(self, stream):
            self.stream = stream

        def isatty(self):
            return True

        def fileno(self):
            return 2

        def __getattr__(self, name):
            return getattr(self.stream, name)

    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(output.os, "get_terminal_size",
                        lambda fd=1: os.terminal_size((60, 24)))
    assert output.pipe_width() == output.PIPE_WIDTH  # stderr captured: no terminal
    monkeypatch.setattr(sys, "stderr", Terminal(sys.stderr))
    assert output.pipe_width() == 60
    for path in ("layers.0.heads.0.weights", "layers.0.resid_post", "logits[-1]"):
        r = cli("trace", LONG + " " + LONG, path)
        assert r.code == 0, r.err
        check_fits(r.out, 60, path)
