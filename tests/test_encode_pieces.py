"""A long text is encoded in pieces (issue 53: memory bounded by the text, not its longest
word), and the ids must be exactly those of one encode call of the whole text. Checked on
adversarial texts drawn by hypothesis (long words, runs of one character, mixed scripts,
characters whose bytes byte-level tokens split, added tokens glued in) for the shipped
byte-level BPE, Llama 3's and Qwen2's layouts, and SentencePiece-style tokenizers (Gemma's
normaliser, Llama 2's Metaspace, the hub's Llama 2 Prepend normaliser), each against the
`tokenizers` library's own encoding of the whole."""

from __future__ import annotations

import functools
import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shipped_tokenizers import sentencepiece as sentencepiece_files
from test_tokenizer_families import shipped_and_built

from tinygpt_cli.transformer import tokenizer as tk
from tinygpt_cli.transformer.tokenizer import Tokenizer

FRAGMENTS = ["Lily", " wanted", " ", "  ", "\n", "\t", "the", "ing", "'s", "don't", "!", "?!",
             ",", ".", "-", "(", "1", "23", "456", "0", "café", "e\u0301", "naïve", "東京",
             "\u1100\u1161", "한국", "Привет", "مرحبا", "🐻", "👩\u200d👩\u200d👧", "🙂", "ſ",
             "ﬁ", "\u2581", "▁▁", "<0x41>", "x", "q", "z"]
LETTERS = "abcdefghijklmnopqrstuvwxyz"


@st.composite
def adversarial(draw, specials=()):
    """A text of runs: a fragment repeated (1 to 40 times), a long random word, or one
    character repeated, glued with no space or with one."""
    parts = []
    for _ in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(["fragment", "word", "repeat", "special"]
                                    if specials else ["fragment", "word", "repeat"]))
        if kind == "word":
            parts.append(draw(st.text(alphabet=LETTERS, min_size=20, max_size=300)))
        elif kind == "repeat":
            parts.append(draw(st.sampled_from(["a", "!", " ", "1", "é", "東", "🙂", "\n"]))
                         * draw(st.integers(2, 120)))
        elif kind == "special":
            parts.append(draw(st.sampled_from(list(specials))))
        else:
            parts.append(draw(st.sampled_from(FRAGMENTS)) * draw(st.sampled_from([1, 1, 3, 40])))
    return "".join(parts)


@functools.cache
def byte_level(name: str) -> Tokenizer:
    return shipped_and_built()[name]


@functools.cache
def sentencepiece(name: str) -> Tokenizer:
    doc = json.loads(sentencepiece_files("llama2" if name.startswith("llama2") else "gemma")[0])
    if name == "llama2 prepend":  # the hub's Llama 2 file: ▁ put before the text by its
        doc["normalizer"] = {"type": "Sequence", "normalizers": [  # normaliser
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
        doc["pre_tokenizer"] = None
    if name == "llama2 split":  # words split before each ▁, each given one
        doc["pre_tokenizer"].update(split=True, prepend_scheme="always")
    tok = Tokenizer.from_str(json.dumps(doc, ensure_ascii=False))
    assert tok.byte_fallback and tok.kind() is None and tok._merge_index is not None
    return tok


def whole(tok: Tokenizer, text: str) -> list[int]:
    return tok._tok.encode(text, add_special_tokens=False).ids


def spread(cuts: list[int], most: int = 40) -> list[int]:
    """At most `most` of the cuts, spread over the text (each costs two encode calls)."""
    return cuts[::-(-len(cuts) // most)] if cuts else []


BYTE_LEVEL = ["shipped", "llama3", "qwen2", "llama3 ignore_merges"]
SENTENCEPIECE = ["gemma", "llama2", "llama2 prepend", "llama2 split"]
FAST = settings(max_examples=15, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.parametrize("name", BYTE_LEVEL)
@FAST
@given(data=st.data())
def test_every_byte_level_cut_gives_the_ids_of_the_whole(name, data):
    """Every place exact_cut allows (with _crosses reading the merges around it), the two
    parts encoded alone give the whole's ids."""
    from tinygpt_cli.transformer.tokenizer import _run_class, exact_cut

    tok = byte_level(name)
    text = data.draw(adversarial(tuple(tok.special_tokens)))
    ids = whole(tok, text)
    words = tok.longest_token_bytes + 1 if tok._tok.model.ignore_merges else 0
    margin = max(words, 1)
    blocked = tk.blocked_by(tk.added_spans(text, tok.special_tokens))
    run, cls, cuts = 0, _run_class(text[0]), []
    for i in range(1, len(text)):
        c = _run_class(text[i])
        if c != cls or c == 2:
            run, cls = i, c
        if margin <= i <= len(text) - margin and not blocked(i) and exact_cut(
                text, i, run, tok._crosses, tok._tok.normalizer is None, words):
            cuts.append(i)
    for i in spread(cuts):
        assert whole(tok, text[:i]) + whole(tok, text[i:]) == ids, (text[:i], text[i:])


@pytest.mark.parametrize("name", SENTENCEPIECE)
@FAST
@given(data=st.data())
def test_every_sentencepiece_cut_gives_the_ids_of_the_whole(name, data):
    """Every place sentencepiece_cuts allows, the pieces before and after it (each read after
    the overlap before it, as _encode_sentencepiece reads them) give the whole's ids."""
    tok = sentencepiece(name)
    text = data.draw(adversarial(tuple(tok.special_tokens)))
    ids = whole(tok, text)
    allowed, overlap = tok.sentencepiece_cuts(text)
    for i in spread([i for i in range(1, len(text)) if allowed(i)]):
        assert tok.piece_ids(text, 0, i, overlap) + tok.piece_ids(text, i, len(text),
                                                                  overlap) == ids, i


@pytest.mark.parametrize("name", BYTE_LEVEL + SENTENCEPIECE)
@FAST
@given(data=st.data())
def test_encode_in_small_pieces_gives_the_ids_of_one_call(name, data):
    """encode itself, with pieces made tiny (CHUNK 32, PIECE_MIN 1: as many cuts as the text
    allows), against one call of the library on the whole text."""
    tok = (byte_level if name in BYTE_LEVEL else sentencepiece)(name)
    text = data.draw(adversarial(tuple(tok.special_tokens)))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tk, "CHUNK", 32)
        mp.setattr(tk, "PIECE_MIN", 1)
        mp.setattr(tk, "PIECE_MAX", 10**6)
        assert tok.encode(text) == whole(tok, text)


def test_pieces_are_short_and_many_on_a_long_word_and_a_text():
    """The pieces are what bounds the memory: one 100,000-letter word and an ordinary text
    are cut every few thousand characters (no piece past twice PIECE_MIN), for byte-level
    and SentencePiece-style tokenizers alike, where one merge-blind byte pair rule (the
    previous one) left most of a random word in one piece."""
    rng = random.Random(3)
    word = "".join(rng.choices(LETTERS, k=100_000))
    text = "Lily wanted to play with her ball. Tom said: 'Yes!'\n" * 2000
    for name in ("shipped", "gemma", "llama2 prepend"):
        tok = byte_level(name) if name in BYTE_LEVEL else sentencepiece(name)
        for t in (word, text):
            sizes = []
            real = tok._tok

            class Counting:
                def encode(self, s, sizes=sizes, real=real, **kw):
                    sizes.append(len(s))
                    return real.encode(s, **kw)

                def __getattr__(self, attr, real=real):
                    return getattr(real, attr)

            tok._tok = Counting()
            try:
                ids = tok.encode(t)
            finally:
                tok._tok = real
            assert ids == whole(tok, t)
            assert len(sizes) > len(t) // (2 * tk.PIECE_MIN)
            assert max(sizes) <= 2 * tk.PIECE_MIN + 64, (name, max(sizes))
        assert tok.encode_batch(["Lily", text]) == [whole(tok, "Lily"), whole(tok, text)]


@pytest.mark.parametrize("name", ["gemma", "llama2"])
def test_a_sentencepiece_run_with_no_exact_cut_is_refused_in_one_line(name, cli, tmp_path,
                                                                        monkeypatch):
    """A run BPE may merge across anywhere ("aaaa...": a, aa, aaaa are all merges of these
    vocabularies? else "!!!!") past PIECE_MAX characters: refused, exit 2, as for a
    byte-level tokenizer; the same run followed by text is cut after it."""
    from cli_helpers import assert_one_error_line
    from shipped_tokenizers import model_folder

    from tinygpt_cli.errors import InputError

    tok = sentencepiece(name)
    for name_, value in (("CHUNK", 100), ("PIECE_MIN", 100), ("PIECE_MAX", 2000)):
        monkeypatch.setattr(tk, name_, value)  # the sizes made small: fast
    ch = next(ch for ch in "a! " if tok._crosses(ch * 40, 20))
    with pytest.raises(InputError, match=r"more than 2,000 characters from character 0 "):
        tok.encode(ch * 2010)
    fine = ch * 1500 + " Lily wanted to play with her ball." * 60
    assert tok.encode(fine) == whole(tok, fine)
    folder = model_folder(tmp_path / name, *sentencepiece_files(name))
    assert_one_error_line(cli("encode", "--weights", str(folder), "-", stdin=ch * 2010), 2,
                          "cannot be encoded in pieces exactly")


@pytest.mark.parametrize("option", [{"dropout": 0.5}, {"ignore_merges": True}])
def test_a_sentencepiece_tokenizer_that_cannot_be_cut_refuses_past_its_size(option, cli,
                                                                             tmp_path,
                                                                             monkeypatch):
    """With an option under which its BPE reads more than the cut rule knows, a byte-fallback
    tokenizer encodes a text whole, so its memory is held to PIECE_MAX characters' worth:
    longer is refused in one line (exit 2); up to it, the ids of one library call."""
    from cli_helpers import assert_one_error_line
    from shipped_tokenizers import model_folder

    from tinygpt_cli.errors import InputError

    doc = json.loads(sentencepiece_files("gemma")[0])
    doc["model"].update(option)
    files = list(sentencepiece_files("gemma"))
    files[0] = json.dumps(doc, ensure_ascii=False)
    tok = Tokenizer.from_str(files[0])
    assert tok.byte_fallback and tok._merge_index is None
    monkeypatch.setattr(tk, "PIECE_MAX", 3000)
    fine = "Lily wanted to play with her ball. " * 85  # 2,975 characters, past CHUNK
    monkeypatch.setattr(tk, "CHUNK", 100)
    if "dropout" not in option:  # dropout draws its own ids each call
        assert tok.encode(fine) == whole(tok, fine)
    with pytest.raises(InputError, match=r"3,010 characters long.*at most 3,000 characters"):
        tok.encode("a" * 3010)
    folder = model_folder(tmp_path / "g", *files)
    assert_one_error_line(cli("encode", "--weights", str(folder), "-", stdin="a" * 3010), 2,
                          "cannot be encoded in pieces exactly")


def test_an_nfc_tokenizer_reads_the_merges_on_the_composed_text():
    """A vocabulary merging 'étuv' with 'w' (and nothing ending in 'v' with 'w'): in
    "e\\u0301tuvw" the NFC normaliser composes é first, so BPE makes one token of 'étuvw'
    and no cut may fall before the w, though the raw text's bytes there have no merge."""
    from tokenizers import decoders, models, normalizers, pre_tokenizers

    from tinygpt_cli.transformer.tokenizer import _bytes_to_unicode, exact_cut

    chars = list(_bytes_to_unicode().values())
    e_acute = "".join(_bytes_to_unicode()[b] for b in "é".encode())  # 'Ã©'
    merges = [(e_acute[0], e_acute[1]), (e_acute, "t"), (e_acute + "t", "u"),
              (e_acute + "tu", "v"), (e_acute + "tuv", "w")]
    vocab = {c: i for i, c in enumerate(chars)}
    for m in merges:
        vocab["".join(m)] = len(vocab)
    hf = tk.HFTokenizer(models.BPE(vocab, merges))
    hf.normalizer = normalizers.NFC()
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    tok = Tokenizer(hf)
    assert tok.kind() is None
    text = "abcde\u0301tuvwxyz"
    i, run = text.index("w"), text.index("t")  # the letters after the combining mark
    assert exact_cut(text, i, run, lambda t, k: False, False)  # a cut, but for the merges
    assert whole(tok, text[:i]) + whole(tok, text[i:]) != whole(tok, text)
    assert not exact_cut(text, i, run, tok._crosses, False)
    with pytest.MonkeyPatch.context() as mp:
        for name, value in (("CHUNK", 4), ("PIECE_MIN", 1), ("PIECE_MAX", 10**6)):
            mp.setattr(tk, name, value)
        long = text * 5
        assert tok.encode(long) == whole(tok, long)


@pytest.mark.slow
@pytest.mark.parametrize("tokenizer", ["gemma", "llama2"])
def test_a_sentencepiece_long_text_adds_under_100_bytes_a_byte(tokenizer):
    """The peak resident memory encoding adds, measured in a fresh process
    (benchmarks/encode_memory.py): one 2 MB word and 4 MB of ordinary text. Encoded whole,
    as before, 100 kB of one word cost about 180 bytes a byte and 1 MB of text 120."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "encode_memory.py"
    spec = importlib.util.spec_from_file_location("encode_memory", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for n, kind in ((2_000_000, "word"), (4_000_000, "text")):
        r = bench.measure(n, kind, tokenizer)
        assert r["bytes_per_byte"] < 100, r


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet="<|>ab▁ ", max_size=60),
       contents=st.lists(st.text(alphabet="<|>ab▁ ", max_size=5), max_size=8))
def test_added_spans_are_every_occurrence_a_naive_scan_finds(text, contents):
    naive = sorted({(i, i + len(c)) for c in contents if c for i in range(len(text))
                    if text.startswith(c, i)})
    assert tk.added_spans(text, contents) == naive
