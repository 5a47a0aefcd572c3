"""The command line's features of issue 51: --each-line --save one file per line, score's
closing separator, --last N, diff of two models of one tokenizer, --each-line --mean, and
trace --save of arrays."""

from __future__ import annotations

import pytest

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


# ------------------------------------------------------------------ score's closing separator

STORY = "Lily wanted to play with her ball.\nShe went outside and found it."


def test_score_file_says_when_it_adds_a_closing_separator_and_can_leave_it_out(cli, tmp_path):
    f = tmp_path / "story.txt"
    f.write_text(STORY + "\n", encoding="utf-8")
    alone = cli("score", STORY, "--json").ndjson()  # the same story as an argument
    added = cli("score", "--file", f, "--json")
    assert "note: scored a closing <|endoftext|>" in added.err
    *tokens, summary = added.ndjson()
    assert summary["closing_separator_added"] is True
    assert [t["token"] for t in tokens] == [t["token"] for t in alone[:-1]] + ["<|endoftext|>"]
    left_out = cli("score", "--file", f, "--json", "--no-closing-separator")
    assert left_out.code == 0 and left_out.err == ""
    *tokens, summary = left_out.ndjson()
    assert summary["closing_separator_added"] is False
    assert [t["nats"] for t in tokens] == pytest.approx([t["nats"] for t in alone[:-1]])
    assert summary["mean_nats"] == pytest.approx(alone[-1]["mean_nats"])
    assert summary["bytes"] == len(STORY.encode())
    # a file that ends with the separator holds it: scored, with no note, option or not
    f.write_text(STORY + "\n<|endoftext|>\n\n", encoding="utf-8")
    for flag in ([], ["--no-closing-separator"]):
        r = cli("score", "--file", f, "--json", *flag)
        assert r.err == "" and r.ndjson()[-1]["closing_separator_added"] is False
        assert r.ndjson()[-2]["token"] == "<|endoftext|>"


def test_the_end_of_a_file_is_found_past_a_long_run_of_white_space(tmp_path):
    from tinygpt_cli.corpus import ends_with_separator

    f = tmp_path / "s.txt"
    for text, closed in [("a\n<|endoftext|>" + " \n" * 10_000, True), ("a" + "\n" * 9000, False),
                         ("<|endoftext|>\nb", False), ("", False)]:
        f.write_text(text, encoding="utf-8")
        assert ends_with_separator(f) is closed, text[:20]
