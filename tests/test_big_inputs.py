"""Big inputs stay bounded (issue 22 item 13): a document's long lists written a piece at a
time, byte for byte the document json.dumps makes of the whole."""

from __future__ import annotations

import io
import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygpt_cli.render import jsonout
from tinygpt_cli.render.documents import encode_document
from tinygpt_cli.weights import load_model


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
        assert written(encode_document(ids, tok, model.config), kind) == written(before, kind)
