"""The command line's features of issue 51: --each-line --save one file per line, score's
closing separator, --last N, diff of two models of one tokenizer, --each-line --mean, and
trace --save of arrays."""

from __future__ import annotations

import dataclasses
import io
import json
import sys

import numpy as np
import pytest
from cli_helpers import TEXT, assert_one_error_line

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
    from tinygpt_cli.jobs.corpus import ends_with_separator

    f = tmp_path / "s.txt"
    for text, closed in [("a\n<|endoftext|>" + " \n" * 10_000, True), ("a" + "\n" * 9000, False),
                         ("<|endoftext|>\nb", False), ("", False)]:
        f.write_text(text, encoding="utf-8")
        assert ends_with_separator(f) is closed, text[:20]


# ------------------------------------------------------------------ --last N

LONG = " ".join(["Lily wanted to play with her ball."] * 30)  # 240 tokens, the context 128


@pytest.mark.parametrize("last", [1, 50, 128])
def test_last_n_reads_the_texts_last_n_tokens_and_says_how_many_were_dropped(cli, tiny, last):
    ids = tiny.model.tokenizer.encode(LONG)
    assert len(ids) > 128
    r = cli("trace", LONG, "ln_final.out", "--last", last, "--json")
    assert r.code == 0, r.err
    d = r.json()
    assert d["ids"] == ids[-last:]
    assert d["cut"] == {"last": last, "dropped": len(ids) - last}
    assert f"{len(ids) - last} before them left out" in r.err
    np.testing.assert_allclose(d["data"], tiny.trace(ids[-last:])["ln_final.out"], rtol=1e-5,
                               atol=1e-5)


def test_last_serves_every_command_that_reads_one_text(cli, tiny):
    from tinygpt_cli.cli.app import _register, app

    _register()
    import typer.main

    group = typer.main.get_command(app)
    own = {"score", "heads", "generate", "encode"}  # each reads a long text its own way
    for name, command in group.commands.items():
        params = {p.name for p in command.params}
        if "text" in params:
            assert ("last" in params) == (name not in own), name
    tail = tiny.model.tokenizer.encode(LONG)[-20:]
    for args in (["probs"], ["dla"], ["lens"], ["attn"], ["qk"], ["blocks"],
                 ["ablate", "--all"], ["attribute"]):
        r = cli(*args, LONG, "--last", 20, "--json")
        assert r.code == 0, (args, r.err)
        d = r.json()
        assert d["cut"] == {"last": 20, "dropped": len(tiny.model.tokenizer.encode(LONG)) - 20}
        assert d.get("ids", tail) == tail, args
    # without it, the refusal names the way out; a short text is read whole, nothing said
    assert_one_error_line(cli("dla", LONG), 2, "tokens long", "--last N")
    r = cli("probs", TEXT, "--last", 100, "--json")
    assert r.code == 0 and "cut" not in r.json() and r.err == ""
    assert_one_error_line(cli("probs", LONG, "--last", 129), 2, "--last 129", "1 to 128")
    assert cli("probs", LONG, "--last", 0).code == 2


class Generated(io.RawIOBase):
    """stdin's bytes made as they are read: `size` bytes of `unit` over and over, so a long
    input costs no memory of its own (--last N on a stream)."""

    def __init__(self, unit: bytes, size: int):
        self.unit, self.left, self.at = unit, size, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = min(len(b), self.left)
        reps = self.unit * (n // len(self.unit) + 2)
        b[:n] = reps[self.at:self.at + n]
        self.at, self.left = (self.at + n) % len(self.unit), self.left - n
        return n


def stdin_of(monkeypatch, unit: bytes, size: int) -> None:
    stream = io.TextIOWrapper(io.BufferedReader(Generated(unit, size)), encoding="utf-8")
    stream.isatty = lambda: False
    monkeypatch.setattr(sys, "stdin", stream)


UNIT = "Lily wanted to play with her ball.\r\nTom said: naïve 42!  ".encode()


def test_last_on_stdin_keeps_the_end_exactly_and_counts_what_streamed_past(cli, tiny,
                                                                          monkeypatch):
    """A stdin of several read pieces (a \r\n cut between two of them, a 2-byte character
    too): --last N's ids and dropped count are those of the whole text encoded at once."""
    from tinygpt_cli.cli import main, streams

    monkeypatch.setattr(streams, "STDIN_CHUNK", 1001)  # odd: cuts through \r\n and 'ï'
    size = 300_000 - 300_000 % len(UNIT)
    whole = (UNIT * (size // len(UNIT))).decode().replace("\r\n", "\n")
    ids = tiny.model.tokenizer.encode(whole)
    stdin_of(monkeypatch, UNIT, size)
    cli.capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["trace", "-", "ln_final.out", "--last", "9", "--json"])
    d = json.loads(cli.capsys.readouterr().out)
    assert d["ids"] == ids[-9:]
    assert d["cut"] == {"last": 9, "dropped": len(ids) - 9}


@pytest.mark.slow  # about 30 s: 12 MB of text tokenised under tracemalloc
def test_last_on_stdin_holds_a_bounded_tail_of_an_unbounded_stream(cli, monkeypatch):
    """probs --last 5 - on 12 MB of stdin: the Python memory at its peak is no more than on
    a stdin of 100 kB, bar a few MB (it read stdin whole before: the text, then its
    millions of ids, over 100 MB)."""
    import tracemalloc

    from tinygpt_cli.cli import main

    def peak(size: int) -> int:
        stdin_of(monkeypatch, UNIT, size)
        tracemalloc.start()
        try:
            with pytest.raises(SystemExit) as e:
                main(["probs", "-", "--last", "5", "--json"])
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            assert e.value.code in (0, None)

    small, large = peak(100_000), peak(12 << 20)
    assert large - small < 4 << 20, f"{small / 2**20:.1f} MiB, then {large / 2**20:.1f} MiB"


# ------------------------------------------------------------------ trace --save


def read_safetensors_by_hand(path) -> dict:
    """The format read from its definition (an 8-byte little-endian header length, a JSON
    header of dtype, shape and offsets, then the bytes), not by the project's reader."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    dtypes = {"F32": "<f4", "I64": "<i8", "F64": "<f8"}
    return {k: np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]],
                             dtype=dtypes[v["dtype"]]).reshape(v["shape"])
            for k, v in header.items() if k != "__metadata__"}


def test_trace_save_writes_a_value_as_npy_and_values_as_safetensors(cli, tiny, tmp_path):
    ids = tiny.model.tokenizer.encode(TEXT)
    ref = tiny.trace(ids)  # the forward pass run here, not by the command
    r = cli("trace", TEXT, "logits[-1]", "--save", tmp_path / "a.npy", "--json")
    assert r.code == 0 and json.loads(r.out)["path"] == "logits[-1]", r.err
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), ref["logits"][-1])
    assert cli("trace", TEXT, "--save", tmp_path / "all.safetensors", "-q").code == 0
    cache = read_safetensors_by_hand(tmp_path / "all.safetensors")
    assert "layers.1.resid_post" in cache and "logits" in cache and "ids" in cache
    assert not any(".heads." in k for k in cache) and "tokens" not in cache
    for k in ("embeddings", "layers.0.weights", "layers.1.mlp_post", "ln_final.out", "logits"):
        np.testing.assert_array_equal(cache[k], ref[k])
    assert cache["ids"].tolist() == ids
    # a group: the values under it; one head's pattern under its own name
    assert cli("trace", TEXT, "layers.1", "--save", tmp_path / "l1.safetensors").code == 0
    group = read_safetensors_by_hand(tmp_path / "l1.safetensors")
    assert set(group) == {k for k in cache if k.startswith("layers.1.")}
    one = tmp_path / "h.safetensors"
    assert cli("trace", TEXT, "layers[0].heads[1].weights", "--save", one).code == 0
    (name, value), = read_safetensors_by_hand(tmp_path / "h.safetensors").items()
    assert name == "layers.0.heads.1.weights"
    np.testing.assert_array_equal(value, ref["layers.0.heads.1.weights"])
    # refusals: one line, before the run, nothing written
    assert_one_error_line(cli("trace", TEXT, "logits", "--save", tmp_path / "a.npy"), 2,
                          "the file exists", "--force")
    assert_one_error_line(cli("trace", TEXT, "logits", "--save", tmp_path / "x.svg"), 2,
                          "unknown extension", ".npy", ".safetensors")
    assert_one_error_line(cli("trace", TEXT, "layers.0", "--save", tmp_path / "x.npy"), 2,
                          "holds one value")
    assert not (tmp_path / "x.npy").exists()
    assert_one_error_line(cli("trace", TEXT, "tokens", "--save", tmp_path / "t.safetensors"),
                          2, "tokens is text", ".npy")
    assert cli("trace", TEXT, "tokens", "--save", tmp_path / "t.npy").code == 0
    assert np.load(tmp_path / "t.npy").tolist() == [tiny.model.tokenizer.token_str(i)
                                                    for i in ids]


# ------------------------------------------------------------------ diff of two shapes


def test_diff_compares_models_of_other_shapes_that_share_the_tokenizer(cli, tiny, tmp_path):
    from cli_helpers import TINY, random_params, write_folder

    from tinygpt_cli.transformer.folder import load_model
    from tinygpt_cli.transformer.model import forward

    shape = dataclasses.replace(TINY, n_embd=24, n_layer=1, n_head=3, n_inner=40,
                                n_positions=64)  # TINY.__dict__ also holds a pass's cache
    other = load_model(write_folder(tmp_path / "b", random_params(shape, seed=9), shape))
    doc = cli("diff", TEXT, "--weights-b", other.folder, "--json").json()
    ids = doc["ids"]
    la = tiny.trace(ids)["logits"].astype(np.float64)
    lb = forward(other.params, other.config, np.asarray(ids)).astype(np.float64)
    for t in range(len(ids)):  # KL(P_a || P_b) and top-1 agreement, from the logits by hand
        pa = la[t] - la[t].max() - np.log(np.exp(la[t] - la[t].max()).sum())
        pb = lb[t] - lb[t].max() - np.log(np.exp(lb[t] - lb[t].max()).sum())
        assert doc["data"][t] == pytest.approx((np.exp(pa) * (pa - pb)).sum(), rel=1e-6)
        assert doc["same_top"][t] == (la[t].argmax() == lb[t].argmax())
    assert doc["shapes_differ"] == {"n_layer": [2, 1], "n_embd": [16, 24], "n_head": [2, 3],
                                    "n_inner": [24, 40], "n_positions": [128, 64]}
    view = cli("diff", TEXT, "--weights-b", other.folder)
    assert "differ in shape" in view.out and "only the next-token distributions" in view.out
    # longer than the second model's context: refused in one line
    assert_one_error_line(cli("diff", " ".join([TEXT] * 12), "--weights-b", other.folder), 2,
                          "72 tokens long", "second model reads at most 64")


def test_diff_refuses_tokenizers_that_would_give_other_ids(cli, tiny, tmp_path):
    from cli_helpers import TOKENIZER

    spec = json.loads(TOKENIZER.read_text(encoding="utf-8"))
    variants = {
        "same": spec,  # merges written "a b" instead of ["a", "b"]: the same tokenizer
        "merges": {**spec, "model": {**spec["model"], "merges": spec["model"]["merges"][:-1]}},
        "normaliser": {**spec, "normalizer": {"type": "NFC"}},
        "vocabulary": {**spec, "model": {**spec["model"], "vocab": {
            k: (v if v not in (5, 6) else 11 - v) for k, v in spec["model"]["vocab"].items()}}},
    }
    variants["same"] = {**spec, "model": {**spec["model"], "merges": [
        " ".join(m) for m in spec["model"]["merges"]]}}
    for what, variant in variants.items():
        folder = tmp_path / what
        folder.mkdir()
        for name in ("model.safetensors", "config.json"):
            (folder / name).write_bytes((tiny.folder / name).read_bytes())
        (folder / "tokenizer.json").write_text(json.dumps(variant), encoding="utf-8")
        r = cli("diff", TEXT, "--weights-b", folder, "--json")
        if what == "same":
            assert r.code == 0 and max(r.json()["data"]) == pytest.approx(0, abs=1e-9), r.err
        else:
            assert_one_error_line(r, 2, f"tokenizers differ ({what})")


# ------------------------------------------------------------------ --each-line --mean

MEAN_LINES = ["Lily wanted to play with her", "Tom saw a big dog", "The sun was hot and"]


def alone(cli, *args) -> list[dict]:
    return [cli(*args[:1], line, *args[1:], "--json").json() for line in MEAN_LINES]


def test_each_line_mean_averages_dla_and_lens_over_the_lines(cli, tmp_path):
    f = lines_file(tmp_path, MEAN_LINES)
    r = cli("dla", "--each-line", f, "--mean")  # one JSON document, --json or not
    assert r.code == 0, r.err
    d = r.json()
    docs = alone(cli, "dla")
    assert (d["path"], d["command"], d["lines"]) == ("mean", "dla", 3)
    np.testing.assert_allclose(d["mean"]["data"], np.mean([x["data"] for x in docs], axis=0))
    np.testing.assert_allclose(d["std"]["data"], np.std([x["data"] for x in docs], axis=0))
    assert d["mean"]["score"] == pytest.approx(np.mean([x["score"] for x in docs]))
    assert d["mean"]["labels"] == docs[0]["labels"]  # the same on every line: kept
    assert {"ids", "tokens", "target.id"} <= set(d["not_averaged"])  # names, not measures
    lens = cli("lens", "--each-line", f, "--mean", "--json").json()
    docs = alone(cli, "lens")
    np.testing.assert_allclose(lens["mean"]["target_probs"],
                               np.mean([x["target_probs"] for x in docs], axis=0))
    assert "data" in lens["not_averaged"]  # per position of texts of other lengths


def test_each_line_mean_matches_ablate_rows_by_component_and_patch_reads_pairs(cli, tmp_path):
    r = cli("ablate", "--each-line", lines_file(tmp_path, MEAN_LINES), "--all", "--mean")
    assert r.code == 0, r.err
    d = r.json()
    docs = alone(cli, "ablate", "--all")
    for row, data in zip(d["mean"]["components"], d["mean"]["data"], strict=True):
        each = [next(c for c in x["components"] if c["label"] == row["label"]) for x in docs]
        assert row["delta"] == pytest.approx(np.mean([c["delta"] for c in each]))
        assert data == pytest.approx([row["delta"], row["kl"]])  # data's rows follow
    pairs = [("Lily wanted to play with her", "Lily wanted to read with her"),
             ("Tom saw a big dog", "Tom saw a big cat"), ("no tab here", "")]
    f = tmp_path / "pairs.txt"
    f.write_text("".join(f"{a}\t{b}\n" if b else f"{a}\n" for a, b in pairs), encoding="utf-8")
    r = cli("patch", "--each-line", f, "--mean", "--vs", " his")
    assert r.code == 2 and "error: line 3: expected CLEAN<tab>CORRUPT" in r.err
    d = json.loads(r.out)
    docs = [cli("patch", a, b, "--vs", " his", "--json").json() for a, b in pairs[:2]]
    assert d["lines"] == 2
    np.testing.assert_allclose(d["mean"]["heads"], np.mean([x["heads"] for x in docs], axis=0))


def test_mean_is_refused_where_it_means_nothing(cli, tmp_path):
    f = lines_file(tmp_path, MEAN_LINES)
    assert_one_error_line(cli("probs", "--each-line", f, "--mean"), 2, "--mean averages",
                          "dla, lens, patch, ablate, attribute")
    assert_one_error_line(cli("dla", TEXT, "--mean"), 2, "give --each-line")
