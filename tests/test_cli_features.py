"""The command line's features of issue 51: --each-line --save one file per line, score's
closing separator, --last N, diff of two models of one tokenizer, --each-line --mean, and
trace --save of arrays."""

from __future__ import annotations

LINES = ["Lily wanted to play", "Tom saw a big dog"]


def lines_file(tmp_path, lines=LINES):
    f = tmp_path / "lines.txt"
    f.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return f


# ------------------------------------------------------------------ --each-line --save


def test_each_line_save_writes_one_numbered_picture_per_line(cli, tmp_path):
    r = cli("attn", "--each-line", lines_file(tmp_path), "--save", tmp_path / "x.svg", "-q")
    assert r.code == 0, r.err
    assert sorted(p.name for p in tmp_path.glob("x*")) == ["x-001.svg", "x-002.svg"]
    for n, line in enumerate(LINES, 1):  # each the picture of its line run alone
        one = tmp_path / f"one{n}.svg"
        assert cli("attn", line, "--save", one, "-q").code == 0
        assert (tmp_path / f"x-{n:03d}.svg").read_bytes() == one.read_bytes()
    # a second run finds the files: refused line by line, none overwritten without --force
    r = cli("attn", "--each-line", lines_file(tmp_path), "--save=" + str(tmp_path / "x.svg"))
    assert r.code == 2 and r.err.count("the file exists") == 2 and "x-002.svg" in r.err
    assert cli("attn", "--each-line", lines_file(tmp_path), "--save", tmp_path / "x.svg",
               "--force", "-q").code == 0
