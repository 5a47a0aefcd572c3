"""Tokenizers as Llama 3 and Qwen2 ship them: byte-level BPE whose words are split by a regex
written out in a `Split` (Llama 3's, Qwen2's), before a ByteLevel that no longer splits
(use_regex false), and Qwen's NFC normaliser. Built here with the `tokenizers` library (no
download), then used by a random Llama / Qwen2 folder: exact round trips (Qwen's: of the
NFC form), long texts in pieces to the same ids, Llama 3's <|end_of_text|> as the end token
its config names, the text's control characters escaped on the terminal, and the refusals
(a byte without a token, a pattern or normaliser tinygpt does not know)."""

from __future__ import annotations

import json
import random
import re
import shutil
import unicodedata

import numpy as np
import pytest
from cli_helpers import assert_one_error_line, run_module
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from tinygpt_cli.jobs.train.loop import arch_config
from tinygpt_cli.transformer.families import llama, save_config
from tinygpt_cli.transformer.folder import load_model, save_params
from tinygpt_cli.transformer.model import init_params
from tinygpt_cli.transformer.tokenizer import CHUNK, PIECE_MAX, WORD_PATTERNS, Tokenizer

SPECIALS = {"llama3": ["<|begin_of_text|>", "<|end_of_text|>"],
            "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]}
STORIES = ["Once upon a time, Lily wanted to play with her ball. She was 3 years old!",
           "Tom's dog ran 1234 metres.\nThey didn't stop; it's fun.\n\n  Mama said: \"Yes\".",
           "Café crème, naïve façade, 東京, 🐻 and 🙂 — the end."]


def built(kind: str) -> HFTokenizer:
    """A byte-level BPE in the hub's layout for `kind`, trained on a few stories."""
    pattern = WORD_PATTERNS["Llama 3" if kind == "llama3" else "Qwen2"]
    tok = HFTokenizer(models.BPE())
    if kind == "qwen2":
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=SPECIALS[kind],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(STORIES * 30, trainer)
    return tok


def folder_with(tmp_path, kind: str, tokenizer_json: str):
    """A random Llama (Qwen2) folder: 5 padding rows past the tokenizer's last token, as
    Qwen pads; the end token its config names is the tokenizer's own."""
    n = HFTokenizer.from_str(tokenizer_json).get_vocab_size(with_added_tokens=True)
    config = arch_config("llama", n_embd=16, n_layer=2, n_head=4, n_inner=24,
                         vocab_size=n + 5, n_positions=64)
    end = SPECIALS[kind].index("<|end_of_text|>" if kind == "llama3" else "<|endoftext|>")
    hf = {**llama.config_to_hf(config), "model_type": kind.removesuffix("3"),
          "eos_token_id": end, "bos_token_id": 0}
    if kind == "qwen2":
        hf["attention_bias"] = True
    config = llama.config_from_hf(hf)
    save_params(init_params(config, np.random.default_rng(1)), tmp_path / "model.safetensors",
                config)
    save_config(config, tmp_path / "config.json")
    (tmp_path / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    return tmp_path


@pytest.fixture(scope="module", params=["llama3", "qwen2"])
def family(request, tmp_path_factory):
    kind = request.param
    folder = folder_with(tmp_path_factory.mktemp(kind), kind, built(kind).to_str())
    return kind, folder, load_model(folder)


def _form(kind: str, text: str) -> str:  # what the tokens stand for: Qwen's NFC form
    return unicodedata.normalize("NFC", text) if kind == "qwen2" else text


def test_the_folder_loads_with_its_tokenizer_and_its_end_token(family):
    kind, _, model = family
    tok = model.tokenizer
    assert tok.kind() is None and tok.n_rows == tok.vocab_size + 5
    end = "<|end_of_text|>" if kind == "llama3" else "<|endoftext|>"
    assert tok.token_str(tok.eot_id) == end and tok.encode(end) == [tok.eot_id]
    assert model.config.model_type == ("llama" if kind == "llama3" else "qwen2")


@settings(max_examples=150, deadline=None)
@given(text=st.text())
def test_decode_encode_round_trip_and_the_tokens_are_the_texts_bytes(family, text):
    kind, _, model = family
    tok = model.tokenizer
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == _form(kind, text)
    assert b"".join(tok.token_bytes(i) for i in ids) == _form(kind, text).encode("utf-8")
    starts = tok.byte_starts(ids)
    assert starts[-1] == len(_form(kind, text).encode("utf-8"))


def test_qwens_nfc_makes_a_decomposed_accent_the_composed_one(family):
    kind, _, model = family
    tok = model.tokenizer
    decomposed, composed = "Cafe\u0301 cre\u0300me", "Caf\u00e9 cr\u00e8me"
    if kind == "qwen2":
        assert tok.encode(decomposed) == tok.encode(composed)
        assert tok.decode(tok.encode(decomposed)) == composed
    else:  # no normaliser: the combining accents are bytes of their own
        assert tok.decode(tok.encode(decomposed)) == decomposed != composed


def test_a_long_text_is_encoded_in_pieces_to_the_ids_of_one_call(family):
    """Cut where GPT-2's pattern always starts a word: Llama 3's and Qwen2's do too."""
    _, _, model = family
    tok = model.tokenizer
    rng = random.Random(3)
    words = ["Lily", "wanted", "1234567", "!", "'s", "DON'T", "caf\u00e9", "e\u0301",
             "\u00a0", "\u3000", "<|im_end|>", "\t", "\r\n", "\n", "\n\n", " ", "  ", ".\n",
             "\U0001f600", "\u202e"]
    text = "".join(rng.choice(words) + rng.choice(["", " ", "  ", "\n", " \n "])
                   for _ in range(40_000))
    assert len(text) > 2 * CHUNK
    assert tok.encode(text) == tok._tok.encode(text, add_special_tokens=False).ids


def test_the_texts_control_characters_are_escaped_on_the_terminal(family, cli):
    _, folder, _ = family
    text = "[bold]x[/bold] and \x1b[31mred \u202e"
    for argv in (["encode", text], ["generate", text, "-n", "3", "-t", "0", "--no-stop"],
                 ["attn", text]):
        r = cli(*argv, "--weights", folder)
        assert r.code == 0, r.err
        assert "\x1b" not in r.out and "\u202e" not in r.out, argv
        assert "\\x1b" in r.out, argv
        if argv[0] == "generate":  # the text itself, whole: markup shown as it is
            assert r.out.startswith("[bold]x[/bold] and \\x1b[31mred \\u202e"), r.out


def _edited(kind: str, edit) -> str:
    doc = json.loads(built(kind).to_str())
    edit(doc)
    return json.dumps(doc)


def _no_token_for_byte_0(doc) -> None:
    vocab = doc["model"]["vocab"]
    vocab["\u0100-renamed"] = vocab.pop("\u0100")


def _unknown_pattern(doc) -> None:
    doc["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\w+|\W"


def _prefix_space(doc) -> None:
    doc["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = True


def _no_split(doc) -> None:  # a ByteLevel told not to split, and nothing else that does
    doc["pre_tokenizer"] = doc["pre_tokenizer"]["pretokenizers"][1]


def _nfkc(doc) -> None:
    doc["normalizer"] = {"type": "NFKC"}


@pytest.mark.parametrize(("edit", "why"), [
    (_unknown_pattern, "splits words by a pattern tinygpt does not know"),
    (_prefix_space, "adds a space before the text"),
    (_no_split, "does not split the text into words"),
    (_nfkc, "it has a normalizer, NFKC"),
])
@pytest.mark.parametrize("kind", ["llama3", "qwen2"])
def test_a_tokenizer_tinygpt_cannot_keep_its_guarantees_with_is_refused(
        tmp_path, cli, kind, edit, why):
    folder = folder_with(tmp_path, kind, _edited(kind, edit))
    r = cli("encode", "Lily", "--weights", folder)
    assert_one_error_line(r, 1, "is not a tokenizer whose tokens are bytes", why)


@pytest.mark.parametrize("kind", ["llama3", "qwen2"])
def test_a_vocabulary_lacking_a_byte_is_read_and_a_text_needing_it_refused(tmp_path, cli, kind):
    folder = folder_with(tmp_path, kind, _edited(kind, _no_token_for_byte_0))
    r = cli("encode", "Lily", "--weights", folder)
    assert r.code == 0, r.err
    r = cli("encode", "Lily \x00", "--weights", folder)
    assert_one_error_line(r, 2, "character 5 (U+0000, a control character) needs byte 0x00")


def _subword_prefix(doc) -> None:  # "##" before a word's later pieces: no merge's right has it
    doc["model"]["continuing_subword_prefix"] = "##"


def test_a_merge_the_tokenizers_library_would_panic_on_is_one_error_line(tmp_path):
    """The library aborts with a Rust panic (its trace on stderr, a BaseException) on a merge
    whose right side lacks the model's continuing_subword_prefix: refused before it reads."""
    edited = _edited("llama3", _subword_prefix)
    first = json.loads(edited)["model"]["merges"][0]
    left, right = first.split(" ") if isinstance(first, str) else first
    with pytest.raises(ValueError, match=re.escape(
            f"merge 0 ('{left}' '{right}') does not continue a word with the "
            "continuing_subword_prefix '##'")):
        Tokenizer.from_str(edited)
    folder = folder_with(tmp_path, "llama3", built("llama3").to_str())
    (folder / "tokenizer.json").write_text(edited, encoding="utf-8")
    r = run_module("encode", "Lily", "--weights", folder)
    assert "panicked" not in r.stderr
    assert_one_error_line(r, 1, "tokenizer.json is not a tokenizers file (merge 0")


def test_the_refusal_names_the_patterns_it_knows():
    tok = Tokenizer.from_str(_edited("llama3", _unknown_pattern))
    assert re.search(r"it knows GPT-2, Llama 3, Qwen2's", tok.kind())


def test_gpt2s_pattern_written_out_and_smollm2s_digits_are_gpt2s_kind(tmp_path):
    """GPT-2's pattern in a Split is its ByteLevel's own; SmolLM2 puts each digit apart first
    (Digits) before GPT-2's ByteLevel: both only split further, and both are accepted."""
    from tinygpt_cli.storage.locations import SHIPPED

    doc = json.loads((SHIPPED / "tokenizer.json").read_text())
    shipped = HFTokenizer.from_str(json.dumps(doc))
    text = "Lily's 1234 toys, café!\n\n  Then 56."
    doc["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": WORD_PATTERNS["GPT-2"]}, "behavior": "Isolated",
         "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
         "use_regex": False}]}
    written = Tokenizer.from_str(json.dumps(doc))
    assert written.kind() is None
    assert written.encode(text) == shipped.encode(text, add_special_tokens=False).ids
    doc["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
         "use_regex": True}]}
    smol = Tokenizer.from_str(json.dumps(doc))
    assert smol.kind() is None
    assert [smol.token_str(i) for i in smol.encode("1234")] == ["1", "2", "3", "4"]
    shutil.rmtree(tmp_path)


# ------------------------------------------------------------------ one long word in pieces


AWKWARD = ["Lily", "wanted", "a", "zq", "xj", "1234567", "12", "9", "!", "!!", "'s", "'re",
           "'ll", "DON'T", "don't", "caf\u00e9", "e\u0301", "\u6771\u4eac", "\U0001f600",
           ",", ".", "_", "-", "(", "\"", " ", "\n", "\t", "e", "s", "re", "t"]


def awkward_text(rng: random.Random, n: int) -> str:
    """Long runs with no space: words, numbers and symbols glued together, contractions,
    accents composed and not, CJK, emoji: where exact_cut has to tell the places apart."""
    return "".join(rng.choice(AWKWARD) * rng.choice([1, 1, 1, 3, 17]) for _ in range(n))


def shipped_and_built():
    from tinygpt_cli.storage.locations import SHIPPED

    out = {"shipped": Tokenizer.from_file(SHIPPED / "tokenizer.json")}
    for kind in ("llama3", "qwen2"):
        out[kind] = Tokenizer.from_str(built(kind).to_str())
    ignoring = json.loads(built("llama3").to_str())  # Llama 3's own: a word in the vocabulary
    ignoring["model"]["ignore_merges"] = True  # is one token, its merges ignored
    out["llama3 ignore_merges"] = Tokenizer.from_str(json.dumps(ignoring))
    return out


@pytest.mark.parametrize("name", ["shipped", "llama3", "qwen2", "llama3 ignore_merges"])
def test_every_exact_cut_gives_the_ids_of_the_whole(name):
    """Where exact_cut allows a cut, the two parts encoded alone are the whole's ids: every
    allowed place of texts made to be awkward, each checked against one encode call."""
    from tinygpt_cli.transformer.tokenizer import _run_class, exact_cut

    tok = shipped_and_built()[name]
    whole = tok._tok.normalizer is None
    margin = tok.longest_token_bytes + 1 if "ignore" in name else 1
    words = margin if "ignore" in name else 0  # each part of a word longer than any token
    rng = random.Random(len(name))
    checked = 0
    for _ in range(12):
        text = awkward_text(rng, 40)
        ids = tok._tok.encode(text, add_special_tokens=False).ids
        run, cls = 0, _run_class(text[0])
        for i in range(1, len(text)):
            c = _run_class(text[i])
            if c != cls or c == 2:
                run, cls = i, c
            if margin <= i <= len(text) - margin and exact_cut(text, i, run, tok._crosses,
                                                               whole, words):
                left = tok._tok.encode(text[:i], add_special_tokens=False).ids
                right = tok._tok.encode(text[i:], add_special_tokens=False).ids
                assert left + right == ids, (name, text[max(0, i - 8):i], text[i:i + 8])
                checked += 1
    assert checked > 100  # the places are many, of both kinds


@pytest.mark.parametrize("name", ["shipped", "llama3", "qwen2", "llama3 ignore_merges"])
def test_a_long_run_is_encoded_in_short_pieces_to_the_ids_of_one_call(name):
    from tinygpt_cli.transformer.tokenizer import added_spans, blocked_by, exact_cut, exact_pieces

    tok = shipped_and_built()[name]
    rng = random.Random(7)
    shortest = tok.longest_token_bytes + 1
    specials = list(tok.special_tokens)  # never cut: "<|endoftext|>" has "t|" inside
    glued = "".join(rng.choice(["ab1", "xyz", "9", "Tom", ","] + specials) for _ in range(900))
    for text in (awkward_text(rng, 600), glued,
                 "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(5000)),
                 "".join(rng.choice("0123456789") for _ in range(5000))):
        blocked = blocked_by(added_spans(text, specials))
        words = shortest if tok._tok.model.ignore_merges else 0

        def allowed(i, run, text=text, blocked=blocked, words=words):
            return exact_cut(text, i, run, tok._crosses, tok._tok.normalizer is None,
                             words) and not blocked(i)
        pieces = list(exact_pieces(text, allowed, shortest, len(text) // 4))
        assert len(pieces) >= 4 and pieces[0][0] == 0 and pieces[-1][1] == len(text)
        assert all(b == c for (_, b), (c, _) in zip(pieces, pieces[1:], strict=False))
        ids = [i for a, b in pieces for i in tok._tok.encode(text[a:b],
                                                              add_special_tokens=False).ids]
        assert ids == tok._tok.encode(text, add_special_tokens=False).ids


def test_one_long_word_is_encoded_in_pieces_and_a_run_with_no_exact_cut_refused(cli):
    from tinygpt_cli.errors import InputError

    tok = shipped_and_built()["shipped"]
    rng = random.Random(1)
    word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(3 * CHUNK))
    assert tok.encode(word) == tok._tok.encode(word, add_special_tokens=False).ids
    assert tok.encode_batch(["Lily", word, "Tom"]) == [tok.encode("Lily"), tok.encode(word),
                                                       tok.encode("Tom")]
    numbers = "".join(rng.choice("0123456789") for _ in range(3 * CHUNK))
    assert tok.encode("Lily " + numbers) == tok._tok.encode("Lily " + numbers).ids
    with pytest.raises(InputError, match=r"more than 65,536 characters from character 0 that "
                                         r"cannot be encoded in pieces exactly"):
        tok.encode("Lily " + "!" * (PIECE_MAX + 10))
    assert_one_error_line(cli("encode", "-", stdin="Lily " + "!" * (PIECE_MAX + 10)), 2,
                          "cannot be encoded in pieces exactly")


@pytest.mark.slow
def test_encoding_one_4_mb_word_adds_under_100_bytes_a_byte():
    """The peak resident memory encoding adds, measured in a fresh process (the library's Rust
    allocations count): one word of random letters cost about 210 bytes a byte before."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "encode_memory.py"
    spec = importlib.util.spec_from_file_location("encode_memory", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for kind in ("word", "digits"):
        r = bench.measure(4_000_000, kind)
        assert r["bytes_per_byte"] < 100, r
