"""Big inputs stay bounded (issue 22 item 13): a document's long lists written a piece at a
time, byte for byte the document json.dumps makes of the whole."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygpt_cli.render import jsonout
from tinygpt_cli.render.documents import encode_document
from tinygpt_cli.transformer.folder import load_model


class Narrow(io.StringIO):
    encoding = "ascii"  # a stream that cannot carry UTF-8: everything escaped


def written(doc: dict, stream_type=io.StringIO) -> str:
    out = stream_type()
    jsonout.emit(doc, stream=out)
    return out.getvalue()


texts = st.text(st.characters(codec="utf-8"), max_size=6)


@settings(max_examples=60, deadline=None)
@given(st.lists(texts, max_size=40), st.lists(st.integers(-5, 10**6), max_size=40),
       texts, st.integers(1, 7), st.booleans())
def test_rows_are_written_as_the_whole_list_would_be(strings, numbers, other, piece, narrow):
    jsonout.Rows.PIECE = piece  # pieces of every size, edges included
    try:
        whole = {"path": other, "strings": strings, "n": len(numbers), "numbers": numbers,
                 "pairs": [[x, x + 1] for x in numbers], "last": other}
        lazy = dict(whole, strings=jsonout.Rows(strings), numbers=jsonout.Rows(numbers),
                    pairs=jsonout.Rows(numbers, lambda x: [x, x + 1]))
        kind = Narrow if narrow else io.StringIO
        assert written(lazy, kind) == written(whole, kind)
        assert json.loads(written(lazy, kind)) == whole
    finally:
        jsonout.Rows.PIECE = 16_384


def test_a_document_that_ends_with_rows_and_starts_with_them():
    for doc in ({"a": jsonout.Rows([1, 2])}, {"a": jsonout.Rows([]), "b": 1},
                {"a": 1, "b": jsonout.Rows(["\x1b", "\x9b"])}):
        whole = {k: list(v.source) if isinstance(v, jsonout.Rows) else v for k, v in doc.items()}
        assert written(doc) == written(whole)


def test_encode_json_is_the_document_it_always_was():
    """The document as jsonout.document built it, before the lists were streamed."""
    model = load_model()
    tok = model.tokenizer
    text = "Lily wanted é🙂 to \x1b[31m play\n\twith \"her\" \\ ball \x7f" * 3
    ids = tok.encode(text)
    before = jsonout.document("ids", np.asarray(ids, dtype=np.int64), ids,
                              [tok.token_str(i) for i in ids],
                              offsets=tok.byte_offsets(ids), vocab_size=model.config.vocab_size)
    for kind in (io.StringIO, Narrow):
        assert written(encode_document(ids, tok.byte_starts(ids), tok, model.config), kind) \
            == written(before, kind)


# ------------------------------------------------------------------ score: a long text streams


def test_a_long_text_is_scored_and_given_out_window_by_window(tiny_params, tiny_config):
    from tinygpt_cli.analysis import score as sc

    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, tiny_config.vocab_size, n) for n in (30, 3, 19)]
    events, parts = [], []

    def seen(i, s):
        events.append("scores")
        parts.append((i, s))

    report = sc.score_texts(tiny_params, tiny_config, seqs, np.ones(tiny_config.vocab_size,
                                                                    dtype=np.int64),
                            stride=5, stream=False, offset=0, top=3, keep=True, draw=False,
                            on_scores=seen, progress=lambda n: events.append("window"),
                            hooks=None)
    # every part is given out as soon as the windows before it are done, not at the end
    assert events.index("scores") < len(events) - 1 - events[::-1].index("window")
    whole = dict(sc.score_sequences(tiny_params, tiny_config, seqs, stride=5, batch_size=1))
    for i, seq in enumerate(seqs):
        mine = [s for j, s in parts if j == i]
        assert len(mine) == len(sc.windows(len(seq), tiny_config.n_positions, 5))
        assert [s.first for s in mine] == list(np.cumsum([0] + [len(s.targets)
                                                                 for s in mine])[:-1])
        # batches of 8 windows, the shorter ones right-padded, against windows one by one:
        # the same numbers up to the rounding of products of other sizes
        np.testing.assert_allclose(np.concatenate([s.nats for s in mine]), whole[i].nats,
                                   rtol=1e-12)
        np.testing.assert_allclose(report.shown[i].nats, whole[i].nats, rtol=1e-12)
    assert report.summary["tokens"] == sum(len(s) - 1 for s in seqs)
    assert report.summary["mean_nats"] == pytest.approx(
        np.concatenate([whole[i].nats for i in range(3)]).mean(), rel=1e-12)
    # the most surprising tokens name their place in the text, whichever part they were in
    for nats, i, position, _, _ in report.worst:
        # (batched against one by one: equal up to the rounding of products of other sizes)
        assert whole[i].nats[position - 1] == pytest.approx(nats, rel=1e-12)


def test_score_json_positions_run_on_across_windows(cli):
    text = "Lily wanted to play with her ball. " * 40  # more than one window
    records = cli("score", "--json", text).ndjson()
    tokens = records[:-1]
    assert records[-1]["tokens"] == len(tokens) > 128
    # position 0 is the first token, scored after the separator put before the text
    assert [r["position"] for r in tokens] == list(range(len(tokens)))


def test_score_refuses_a_save_in_the_way_before_reading_the_text(cli, tmp_path, monkeypatch):
    from cli_helpers import assert_one_error_line

    from tinygpt_cli.transformer.tokenizer import Tokenizer

    out = tmp_path / "s.svg"
    out.write_text("mine")

    def never(self, text):
        raise AssertionError("the text was tokenised before the refusal")

    monkeypatch.setattr(Tokenizer, "encode", never)
    r = cli("score", "-", "--save", out, stdin="Lily wanted to play. " * 50_000)
    assert_one_error_line(r, 2, str(out), "exists", "--force")
    assert out.read_text() == "mine"
