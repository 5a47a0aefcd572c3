"""Tokenizers as real models ship them (shipped_tokenizers.py builds them): the ids equal
transformers' AutoTokenizer's on hard texts for every family, the <bos> its post-processor
adds included; a byte-level BPE lacking bytes is read, and a text needing one is refused in
one line; a SentencePiece-style BPE's tokens are the bytes of the text they stand for."""

from __future__ import annotations

import json
from itertools import pairwise

import pytest
from cli_helpers import assert_one_error_line
from shipped_tokenizers import FAMILIES, HARD, model_folder, tokenizer_files

from tinygpt_cli.errors import InputError
from tinygpt_cli.transformer.folder import open_folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("shipped")
    return {kind: model_folder(root / kind, *tokenizer_files(kind)) for kind in FAMILIES}


@pytest.mark.parametrize("kind", FAMILIES)
def test_ids_equal_transformers_on_hard_texts(folders, kind):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(folders[kind]))
    tok = open_folder(folders[kind]).tokenizer
    for text in HARD:
        assert tok.text_ids(text) == hf(text)["input_ids"], (kind, text)
    bos = {"gemma": "<bos>", "gemma_no_bos": "<bos>", "llama2": "<s>",
           "llama2_legacy": "<s>"}.get(kind)
    first = tok.text_ids("Hi")[0]
    assert (hf.convert_ids_to_tokens(first) == bos) if bos else tok.affix == ([], [])


def test_a_text_needing_a_byte_smollm2_lacks_is_refused_where_transformers_drops_it(folders):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(folders["smollm2"]))
    text = "ab\x01c"
    assert hf.decode(hf(text)["input_ids"]) == "abc"  # silently read without the byte
    with pytest.raises(InputError, match=r"character 2 \(U\+0001, a control character\) "
                       r"needs byte 0x01"):
        open_folder(folders["smollm2"]).tokenizer.text_ids(text)


def test_smollm2s_vocabulary_lacking_19_bytes_is_read(folders):
    tok = open_folder(folders["smollm2"]).tokenizer
    assert tok.kind() is None and tok.missing_bytes == bytes(range(6))  # the rest: not UTF-8
    text = "Tab\there, ÿ and 🙂 \x7f"
    ids = tok.text_ids(text)
    assert b"".join(tok.token_bytes(i) for i in ids) == text.encode("utf-8")


@pytest.mark.parametrize("kind", ["gemma", "llama2"])
def test_sentencepiece_tokens_stand_for_the_texts_bytes(folders, kind):
    tok = open_folder(folders[kind]).tokenizer
    assert tok.byte_fallback and tok.kind() is None
    text = "Lily  ran 🐻 東京\n\tx ſ"
    ids = tok.encode(text)
    made = b"".join(tok.token_bytes(i) for i in ids)
    # Llama 2's Metaspace writes a space before the text (prepend "first"): its first token
    # stands for it too; Gemma's normaliser only turns spaces into ▁
    assert made == (" " if kind == "llama2" else "").encode() + text.encode("utf-8")
    assert tok.decode(ids) == text
    fox = [tok.token_str(i) for i in tok.encode("🦊")]  # no piece: 4 <0xNN> tokens
    assert fox[-4:] == ["\\xf0", "\\x9f", "\\xa6", "\\x8a"]
    for i in tok.encode("Lily ran to the ball"):  # a token's text names it back
        assert tok.token_to_id(tok.token_str(i)) == i
    assert tok.token_bytes(tok.token_to_id("\x07")) == b"\x07"  # only its <0x07> token


def test_encode_shows_the_bos_the_post_processor_adds(folders, cli):
    r = cli("encode", "Hi there", "--json", "--weights", folders["gemma"])
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["tokens"][0] == "<bos>" and doc["ids"][0] == 2 and "".join(
        doc["tokens"][1:]) == "Hi there"
    r = cli("encode", "Hi there", "--json", "--weights", folders["smollm2"])
    assert "".join(json.loads(r.out)["tokens"]) == "Hi there"  # no BOS: none added


def test_a_missing_byte_is_refused_in_one_line_by_every_text_command(folders, cli):
    for argv in (["encode"], ["generate", "-n", "2", "-t", "0"], ["attn"]):
        r = cli(*argv, "Lily\x03!", "--weights", folders["smollm2"])
        assert_one_error_line(r, 2, "character 4 (U+0003, a control character) needs byte 0x03")


def test_score_reads_a_text_after_the_bos_the_tokenizer_puts_there(folders, cli):
    import numpy as np

    from tinygpt_cli.transformer.folder import load_model
    from tinygpt_cli.transformer.model import forward

    model = load_model(folders["gemma"])
    ids = model.tokenizer.encode("Lily ran to the ball")
    logits = forward(model.params, model.config, np.array([2, *ids]))[0].astype(np.float64)
    chance = np.exp(logits[ids[0]] - logits.max()) / np.exp(logits - logits.max()).sum()
    r = cli("score", "Lily ran to the ball", "--json", "--weights", folders["gemma"])
    first = json.loads(r.out.splitlines()[0])
    assert first["id"] == ids[0] and first["chance"] == pytest.approx(chance, rel=1e-5)


def test_each_line_blames_the_line_with_the_missing_byte_alone(folders, cli, tmp_path):
    lines = tmp_path / "lines.txt"
    lines.write_text("Hello there\nsecond line\nbad \x01 line\nfourth\n", encoding="utf-8")
    r = cli("probs", "--each-line", lines, "--json", "--weights", folders["smollm2"])
    assert r.code == 2
    assert [json.loads(x)["line"] for x in r.out.splitlines()] == [1, 2, 4]
    assert r.err.count("error:") == 1 and "error: line 3:" in r.err and "0x01" in r.err


@pytest.mark.parametrize("kind", ["gemma", "smollm2"])
def test_encodes_byte_offsets_are_transformers_offsets_the_bos_taking_no_byte(folders, cli,
                                                                             kind):
    """encode's offsets are places in the text's UTF-8 bytes: a <bos> the post-processor adds
    is not in the text, so it spans (0, 0), as transformers' offset mapping gives it, and the
    text's first token starts at byte 0 (it said (0, 5) and shifted every token by 5)."""
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(folders[kind]))
    text = "Lily saw é and 🙂 there"
    got = json.loads(cli("encode", text, "--json", "--weights", folders[kind]).out)
    at = [len(text[:i].encode("utf-8")) for i in range(len(text) + 1)]  # char -> byte
    want = hf(text, return_offsets_mapping=True)
    assert got["ids"] == want["input_ids"]
    # where a token ends between characters; the bytes of one character split over tokens
    # share that character's span in transformers' (character) offsets
    ends = [at[e] for _, e in want["offset_mapping"]]
    mine = [e for _, e in got["offsets"] if e in at]
    assert [e for i, e in enumerate(mine) if i == 0 or e != mine[i - 1]] == \
        [e for i, e in enumerate(ends) if i == 0 or e != ends[i - 1]]
    assert got["offsets"][-1][1] == len(text.encode("utf-8"))
    if kind != "smollm2":
        assert got["offsets"][0] == [0, 0] and got["offsets"][1][0] == 0


# texts whose offsets are hard for a tokenizer putting `▁` before a text: spaces before,
# after and doubled, lines, byte-fallback tokens, accents, and added tokens cutting the text
# into pieces (each its own `▁` in Llama 2's legacy files)
OFFSET_TEXTS = [*HARD, " ", "  ", "\n", "x  ", "🙂", " 🙂x", "\n\nHi", "Hi <s> there",
                "Hi<s>there", "<s> x", "<s>", " <s>  "]


def _spans_by_hand(tok, text: str, ids: list[int]) -> list[tuple[int, int]]:
    """Each token's bytes laid along the text's: the first token of a piece of text (its
    start, or after an added token) drops the space the tokenizer put before it when the text
    there does not start with that token's bytes; a <bos> put around the text holds none."""
    raw, at, spans, piece_starts = text.encode("utf-8"), 0, [], True
    before = len(tok.affix[0])
    for n, i in enumerate(ids):
        b = tok.token_bytes(i)
        if n < before:
            spans.append((0, 0))
            continue
        if piece_starts and b.startswith(b" ") and not raw.startswith(b, at):
            b = b[1:]
        assert raw.startswith(b, at), (text, n)
        spans.append((at, at + len(b)))
        at += len(b)
        piece_starts = i in tok.special_tokens.values()
    assert at == len(raw)
    return spans


@pytest.mark.parametrize("kind", ["llama2", "llama2_legacy", "gemma"])
def test_offsets_are_the_texts_bytes_not_the_space_put_before_it(folders, kind):
    """Llama 2's `▁` before the text is no byte of it: every token's span ran one byte late
    (and the last past the text's end). Each token's span holds its own bytes of the text."""
    tok = open_folder(folders[kind]).tokenizer
    for text in OFFSET_TEXTS:
        ids = tok.text_ids(text)
        assert tok.text_byte_offsets(text, ids) == _spans_by_hand(tok, text, ids), text


@pytest.mark.parametrize("kind", ["llama2", "llama2_legacy", "gemma"])
def test_offsets_are_transformers_offset_mapping_in_bytes(folders, cli, kind):
    """transformers' offset mapping, its characters turned into bytes: where it gives a token
    a span no other token's overlaps, encode's is the same; where spans are shared (the
    bytes of one character split over <0xNN> tokens, or the `▁` put before the text, which
    transformers places on the text's first character), encode's lie inside it, one after
    the other, and a `▁` put there holds no byte, as <bos> (0, 0)."""
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(folders[kind]))
    tok = open_folder(folders[kind]).tokenizer
    for text in OFFSET_TEXTS:
        at = [len(text[:i].encode("utf-8")) for i in range(len(text) + 1)]
        want = hf(text, return_offsets_mapping=True)
        theirs = [(at[a], at[b]) for a, b in want["offset_mapping"]]
        ids = tok.text_ids(text)
        assert ids == want["input_ids"], text
        mine = tok.text_byte_offsets(text, ids)
        assert mine[0] == (0, 0) and mine[-1][1] == len(text.encode("utf-8")), text
        assert all(a[1] == b[0] for a, b in pairwise(mine[1:])), text
        for k, (m, h) in enumerate(zip(mine, theirs, strict=True)):
            assert h[0] <= m[0] <= m[1] <= h[1], (text, k)
            alone = not any(o[0] < h[1] and h[0] < o[1] for q, o in enumerate(theirs) if q != k)
            assert m == h or not alone, (text, k)
    got = json.loads(cli("encode", "Hello world", "--json", "--weights", folders[kind]).out)
    assert [tuple(o) for o in got["offsets"]] == tok.text_byte_offsets(
        "Hello world", got["ids"])
    assert got["offsets"][-1][1] == len("Hello world")


@pytest.mark.parametrize("kind", ["gemma", "llama2"])
def test_probe_marks_find_their_tokens_after_the_bos(folders, cli, tmp_path, kind):
    """A --labels mark is a place in the line's bytes: with the <bos> Gemma's tokenizer adds
    (no byte of the line) every mark still lands right after its token, each one labelled
    (the offsets counted <bos> as 5 bytes, and the first mark was refused); so with the `▁`
    Llama 2's puts before the line (it counted one byte more, and refused every mark)."""
    labels = tmp_path / "labels.txt"
    labels.write_text("Tom[name] ran\nI am Tom[name]\nTom[name] sat\nI ran\nTom[name] and I "
                      "ran\nI sat\nTom[name] ran and I sat\nI am\n", encoding="utf-8")
    r = cli("probe", "--site", "layers.1.resid_post", "--labels", str(labels), "--default",
            "other", "--json", "--weights", folders[kind])
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    name = doc["classes"].index("name")
    assert doc["train_counts"][name] + doc["held_out_counts"][name] == 5


@pytest.mark.parametrize("kind", ["gemma", "llama2", "llama2_legacy"])
def test_probe_marks_label_the_token_that_ends_at_the_mark(folders, kind):
    """Each mark labels the token whose text ends where the mark is: with Llama 2's `▁` put
    before the line counted as a byte, a mark after "Tom" labelled the token before the one
    ending "Tom" (or was refused as in the middle of a token)."""
    from tinygpt_cli.analysis.probe import parse_labels
    from tinygpt_cli.jobs.probe import probe_inputs
    from tinygpt_cli.transformer.folder import load_model

    model = load_model(folders[kind])
    lines = parse_labels("Tom[name] ran\nI am Tom[name]\n  Tom[name] and 🙂[face] sat\n")
    ids, marks, _ = probe_inputs(model, lines, "layers.0.resid_post", None)
    tok = model.tokenizer
    for line, i, labels in zip(lines, ids, marks, strict=True):
        text = b"".join(tok.token_bytes(t) for t in i).decode("utf-8", errors="replace")
        labelled = [(n, lab) for n, lab in enumerate(labels) if lab]
        assert [lab for _, lab in labelled] == [lab for _, lab in line.marks], line.text
        for n, lab in labelled:  # the tokens up to it spell the line up to the mark
            upto = b"".join(tok.token_bytes(t) for t in i[:n + 1]).decode("utf-8", "replace")
            word = "Tom" if lab == "name" else "🙂"
            assert upto.endswith(word), (text, n)


def test_heads_reads_each_text_after_the_bos_gemmas_tokenizer_puts_first(folders, cli):
    """The head detector reads a text after the token the folder's tokenizer starts a text
    with (Gemma's <bos>, without which a real Gemma 3 writes junk), not after an end token;
    a tokenizer that adds none keeps <|endoftext|>, the separator stories were trained after."""
    from tinygpt_cli.jobs.heads import texts_for_heads

    gemma = open_folder(folders["gemma"]).tokenizer
    ids, _ = texts_for_heads(gemma, 64, "Tom ran", lambda t: t, None, 1)
    assert ids == [gemma.text_ids("Tom ran")] and gemma.token_str(ids[0][0]) == "<bos>"
    gpt2 = open_folder(folders["gpt2"]).tokenizer
    ids, _ = texts_for_heads(gpt2, 64, "Tom ran", lambda t: t, None, 1)
    assert ids[0][0] == gpt2.eot_id and gpt2.token_str(gpt2.eot_id) == "<|endoftext|>"
    assert cli("heads", "Tom ran and Tom ran", "--weights", folders["gemma"]).code == 0


def test_a_tokenizer_as_large_as_gemma_3s_is_read_for_a_vocabulary_as_large(tmp_path):
    """Gemma 3's tokenizer.json is 33.4 MB (262,144 tokens, 514,906 merges, indented): every
    real Gemma 3 folder was refused as 'larger than 16,777,216 bytes'. The cap grows with the
    config's vocabulary (256 bytes a token); a small model's stays 16 MB."""
    from tinygpt_cli.errors import WeightsError
    from tinygpt_cli.transformer.config import Config
    from tinygpt_cli.transformer.folder import read_tokenizer

    tokenizer_json, _ = tokenizer_files("gemma")
    path = tmp_path / "tokenizer.json"
    path.write_text(tokenizer_json + " " * (34 << 20), encoding="utf-8")  # 34 MB in all
    gemma = Config(n_embd=16, n_layer=1, n_head=2, n_inner=24, vocab_size=262144,
                   n_positions=32)
    assert read_tokenizer(path, gemma).byte_fallback
    small = Config(n_embd=16, n_layer=1, n_head=2, n_inner=24, vocab_size=4096, n_positions=32)
    with pytest.raises(WeightsError, match="larger than 16,777,216 bytes: not the tokenizer "
                       "of a 4,096-token model"):
        read_tokenizer(path, small)


def test_the_vocabulary_is_counted_once_not_once_a_token(folders):
    """The library counts its added tokens on every get_vocab_size call (0.1 ms with Gemma
    3's 6,400): score's labels of the whole vocabulary asked once a token, 28 s on 262,144
    tokens. Counted through a proxy of the library's tokenizer."""
    tok = open_folder(folders["gemma"]).tokenizer
    real, calls = tok._tok, []

    class Counting:
        def __getattr__(self, name):
            if name == "get_vocab_size":
                calls.append(name)
            return getattr(real, name)

    tok.__dict__.pop("vocab_size", None)
    tok._tok = Counting()
    assert len(tok.token_strs) == tok.n_rows > 500
    assert len(calls) == 1


def test_smollm2s_digits_are_split_as_its_tokenizer_json_says(folders):
    """SmolLM2's tokenizer.json splits digits off before its byte-level words, so a run of
    spaces before a digit is one word ('\\n 12  3': ĊĠ 1 2 ĠĠ 3), as the tokenizers library,
    transformers' generic backend and llama.cpp (pre-tokenizer smollm) read it. transformers
    5's GPT2Tokenizer class, SmolLM2's tokenizer_class, rebuilds the pre-tokenizer without
    the split (Ċ Ġ 1 2 Ġ Ġ 3): tinygpt keeps the file's, the way the model was trained."""
    transformers = pytest.importorskip("transformers")
    backend = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(folders["smollm2"] / "tokenizer.json"))
    tok = open_folder(folders["smollm2"]).tokenizer
    for text in ("\n 12  3", "x =  1\n\t 2", "  7 ", "\n\n 42"):
        assert tok.text_ids(text) == backend(text)["input_ids"], text
    assert [tok.token_str(i) for i in tok.text_ids("\n 12  3")] == ["\n ", "1", "2", "  ", "3"]


def test_only_added_tokens_may_lie_past_the_models_rows(tmp_path):
    """Gemma 3's <image_soft_token> (an added token) one past the rows is read, the rows
    then being the ids a model predicts; a vocabulary entry past them is still refused."""
    from tokenizers import AddedToken
    from tokenizers import Tokenizer as HFTokenizer

    from tinygpt_cli.errors import WeightsError
    from tinygpt_cli.transformer.config import Config
    from tinygpt_cli.transformer.folder import check_vocabulary
    from tinygpt_cli.transformer.tokenizer import Tokenizer

    tokenizer_json, _ = tokenizer_files("gemma")
    hf = HFTokenizer.from_str(tokenizer_json)
    rows = hf.get_vocab_size(with_added_tokens=True)
    hf.add_special_tokens([AddedToken("<image_soft_token>", special=True, normalized=False)])
    config = Config(n_embd=16, n_layer=1, n_head=2, n_inner=24, vocab_size=rows,
                    n_positions=32)
    tok = Tokenizer.from_str(hf.to_str())
    check_vocabulary(tok, config, tmp_path)
    assert (tok.vocab_size, tok.n_rows, len(tok.token_strs)) == (rows + 1, rows, rows)
    fewer = Config(n_embd=16, n_layer=1, n_head=2, n_inner=24, vocab_size=rows - 1,
                   n_positions=32)
    with pytest.raises(WeightsError, match=f"tokenizer has {rows + 1:,} tokens but the model "
                       f"{rows - 1:,}"):
        check_vocabulary(Tokenizer.from_str(hf.to_str()), fewer, tmp_path)
