"""The shipped byte-level BPE tokenizer: its size, its special token, exact round trips, and
the recipe that trained it."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygpt_cli.storage.locations import SHIPPED
from tinygpt_cli.transformer.tokenizer import END_OF_TEXT, Tokenizer, train_tokenizer

SHIPPED_FILE = SHIPPED / "tokenizer.json"
STORIES = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinystories"

pytestmark = pytest.mark.skipif(not SHIPPED_FILE.is_file(), reason="no shipped tokenizer.json")


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_file(SHIPPED_FILE)


def test_vocabulary_size(tok):
    assert tok.vocab_size == 4096


def test_end_of_text_is_the_special_token(tok):
    assert END_OF_TEXT == "<|endoftext|>"
    assert END_OF_TEXT in tok.special_tokens
    assert tok.eot_id == tok.special_tokens[END_OF_TEXT]
    assert tok.encode(END_OF_TEXT) == [tok.eot_id]
    assert tok.token_bytes(tok.eot_id) == END_OF_TEXT.encode()
    assert tok.decode([tok.eot_id]) == END_OF_TEXT
    # Between stories it stays one token, never merged with the text around it.
    ids = tok.encode(f"The end.{END_OF_TEXT}Once")
    assert ids.count(tok.eot_id) == 1
    assert tok.decode(ids) == f"The end.{END_OF_TEXT}Once"


def test_a_story_sentence_is_six_whole_word_tokens(tok):
    ids = tok.encode("Lily wanted to play with her")
    assert len(ids) == 6
    assert [tok.token_str(i) for i in ids] == ["Lily", " wanted", " to", " play", " with", " her"]
    assert tok.byte_offsets(ids) == [(0, 4), (4, 11), (11, 14), (14, 19), (19, 24), (24, 28)]
    assert tok.encode_batch(["Lily wanted to play with her", "Lily"]) == [ids, ids[:1]]


def test_a_character_split_across_tokens_shows_its_bytes(tok):
    text = "\U0001f996"  # a sauropod: four UTF-8 bytes no TinyStories merge covers
    ids = tok.encode(text)
    assert len(ids) > 1
    assert b"".join(tok.token_bytes(i) for i in ids) == text.encode()
    assert "\\x" in "".join(tok.token_str(i) for i in ids)
    assert tok.decode(ids) == text


def test_unknown_id_is_refused(tok):
    with pytest.raises(ValueError, match="4095"):
        tok.token_bytes(4096)


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_decode_encode_round_trip(tok, text):
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_token_bytes_and_offsets_cover_the_utf8_bytes_exactly(tok, text):
    ids = tok.encode(text)
    data = text.encode("utf-8")
    assert b"".join(tok.token_bytes(i) for i in ids) == data
    offsets = tok.byte_offsets(ids)
    assert len(offsets) == len(ids)
    position = 0
    for i, (start, end) in zip(ids, offsets, strict=True):
        assert start == position and end > start
        assert data[start:end] == tok.token_bytes(i)
        position = end
    assert position == len(data)



@pytest.mark.parametrize("repeat", [1, 400])  # a short text, and one past SHORT_IDS tokens
def test_byte_starts_are_where_each_token_starts_in_the_utf8_bytes(tok, repeat):
    from tinygpt_cli.transformer.tokenizer import SHORT_IDS

    text = "Lily sah ein Mädchen 🐱 — and played. " * repeat
    ids = tok.encode(text)
    assert (len(ids) < SHORT_IDS) == (repeat == 1)
    starts = tok.byte_starts(ids)
    # the length of the UTF-8 bytes the first k tokens decode to, at every k (decoding the
    # bytes, not the ids: a token may end inside a character)
    data = text.encode("utf-8")
    assert starts[0] == 0 and starts[-1] == len(data) and len(starts) == len(ids) + 1
    for k in range(0, len(ids), max(1, len(ids) // 97)):
        assert data.startswith(b"".join(tok.token_bytes(i) for i in ids[:k]))
        assert starts[k] == sum(len(tok.token_bytes(i)) for i in ids[:k])

@pytest.mark.skipif(not (STORIES / "part-004.txt").is_file(), reason="no TinyStories data")
def test_retraining_reproduces_the_shipped_vocabulary(tok):
    from tinygpt_cli.jobs.corpus import read_stories

    files = [STORIES / f"part-{i:03d}.txt" for i in range(5)]
    retrained = train_tokenizer(read_stories(files))
    assert retrained.vocab_size == tok.vocab_size
    assert retrained._tok.get_vocab() == tok._tok.get_vocab()
    assert retrained.encode("Lily wanted to play with her") == tok.encode(
        "Lily wanted to play with her"
    )
