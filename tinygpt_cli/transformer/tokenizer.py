"""A thin wrapper over a `tokenizers.Tokenizer` whose tokens are bytes: a byte-level BPE
(GPT-2's kind), or a SentencePiece-style BPE with byte fallback (Llama 2's, Gemma's: `▁` for a
space, `<0xNN>` for a byte no piece holds); and the recipe that trains the first kind."""

from __future__ import annotations

import bisect
import functools
import json
import re
import unicodedata
from collections.abc import Iterable
from functools import cached_property
from itertools import accumulate, pairwise
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from ..errors import InputError
from ..storage.files import write_atomically

# the vocabulary limits live in config.py, which the CLI imports cheaply; named here too
from .config import MAX_VOCAB, MIN_VOCAB, shown  # noqa: F401

END_OF_TEXT = "<|endoftext|>"
SPACE = "\u2581"  # SentencePiece's stand-in for a space
NEVER_IN_UTF8 = frozenset({0xC0, 0xC1, *range(0xF5, 0x100)})


@functools.cache  # one table for every tokenizer, which only reads it
def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte, reversed."""
    return {ch: b for b, ch in _bytes_to_unicode().items()}


@functools.cache
def _bytes_to_unicode() -> dict[int, str]:
    keep = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)}
    mapping, n = {}, 0
    for b in range(256):
        if b in keep:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + n)
            n += 1
    return mapping


def _parts(pre) -> list:
    """A pre-tokenizer, or the members of a Sequence of them."""
    if type(pre).__name__ != "Sequence":
        return [pre]
    out = []
    for i in range(64):
        try:
            out.append(pre[i])
        except (IndexError, TypeError):
            break
    return out


def _state(part) -> dict:
    """A normalizer's or a pre-tokenizer's settings, as its JSON in tokenizer.json."""

    try:
        return json.loads(part.__getstate__())
    except (AttributeError, TypeError, ValueError):
        return {}


# The word patterns tokenizer.json files write out in a Split before a ByteLevel that does not
# split by its own (use_regex false): GPT-2's own, Llama 3's (numbers of up to 3 digits) and
# Qwen2's (one digit). Each starts a new word at _BOUNDARY, as GPT-2's does (long texts are
# encoded in pieces cut there).
WORD_PATTERNS = {
    "GPT-2": r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
    "Llama 3": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}"
               r"\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "Qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
             r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}


def _pre_tokenizer_kind(parts: list) -> str | None:
    """None for ByteLevel pre-tokenizers that split words by GPT-2's regex (their own, or
    one of WORD_PATTERNS in a Split, Isolated, before them), with Digits beside them
    (SmolLM2's: each digit its own word) at most; else what is wrong, for the error. Each
    of these only splits further, so the words never cross a _BOUNDARY; and no ByteLevel
    adds a space before the text (its tokens would not be the text's bytes)."""
    names = [type(p).__name__ for p in parts]
    if "ByteLevel" not in names:
        return "its pre-tokenizer is not ByteLevel"
    others = sorted(set(names) - {"ByteLevel", "Split", "Digits"})
    if others:
        return f"its pre-tokenizer has {', '.join(others)}"
    words = False
    for part, name in zip(parts, names, strict=True):
        state = _state(part)
        if name == "ByteLevel":
            if state.get("add_prefix_space"):
                return "its ByteLevel pre-tokenizer adds a space before the text"
            words = words or state.get("use_regex", True) is not False
        elif name == "Split":
            pattern = (state.get("pattern") or {}).get("Regex")
            if pattern not in WORD_PATTERNS.values() or state.get("behavior") != "Isolated" \
                    or state.get("invert"):
                return ("its pre-tokenizer splits words by a pattern tinygpt does not know "
                        f"(it knows {', '.join(WORD_PATTERNS)}'s, isolated)")
            words = True
    return None if words else "its pre-tokenizer does not split the text into words"


def _replaces_spaces(state: dict) -> bool:
    return state.get("type") == "Replace" and state.get("pattern") == {"String": " "} \
        and state.get("content") == SPACE


def _sentencepiece_kind(tok: HFTokenizer, byte_ids: dict) -> str | None:
    """None for a BPE with byte fallback whose spaces become `▁` (Gemma's normalizer, alone or
    after Llama 2's Prepend of one; or a Metaspace pre-tokenizer, as transformers writes
    Llama 2's), with all 256 <0xNN> tokens and a decoder; else what is wrong, for the error."""
    if len(byte_ids) < 256:
        return f"it falls back to bytes but {256 - len(byte_ids)} of the 256 <0xNN> tokens " \
            "are missing"
    norm = _state(tok.normalizer) if tok.normalizer is not None else None
    steps = norm.get("normalizers", []) if norm and norm.get("type") == "Sequence" else \
        [norm] if norm else []
    prepend = {"type": "Prepend", "prepend": SPACE}
    if steps and not (_replaces_spaces(steps[-1]) and all(x == prepend for x in steps[:-1])):
        return f"its normalizer does more than write spaces as {SPACE}"
    replaced = bool(steps)
    for part in _parts(tok.pre_tokenizer) if tok.pre_tokenizer is not None else []:
        state = _state(part)
        if state.get("type") == "Metaspace" and state.get("replacement") == SPACE \
                and not replaced:
            replaced = True
        elif not (replaced and state.get("type") == "Split"
                  and state.get("pattern") == {"String": " "}):  # Gemma's: no space is left
            return f"its pre-tokenizer has {state.get('type', type(part).__name__)}"
    if not replaced:
        return f"it does not write spaces as {SPACE}"
    return None if tok.decoder is not None else "it has no decoder"


def special_name(value) -> str | None:
    """A special token as tokenizer_config.json names it: a string, or an AddedToken's
    {"content": ...}; None when it names none."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _named(ch: str) -> str:
    """A character as an error names it: U+0007, never the character itself."""

    return f"U+{ord(ch):04X} {unicodedata.name(ch, '')}".rstrip() if ch.isprintable() else \
        f"U+{ord(ch):04X}, a control character"


# characters: texts longer than this are encoded in pieces. One encode call holds about 200
# bytes a character of bookkeeping, so pieces of 4,096 keep it under a megabyte: 100 bytes a
# byte for any text of 10 kB and more (benchmarks/encode_memory.py)
CHUNK = 1 << 12


# Where GPT-2's pre-tokenizer always starts a new piece: before a space that follows a
# non-space and precedes one (" wanted", " 42", " !": each class may take one leading space,
# a run of whitespace never takes the non-space after it), and after a newline followed by a
# non-space.
_BOUNDARY = re.compile(r"(?<=\S)(?= \S)|(?<=\n)(?=\S)")


def _last_cut(text: str, at: int) -> int:
    """The last such boundary at or before `at` (0 when there is none): looked for in a
    window before `at`, twice as wide each time it holds none."""
    width = 256
    while True:
        lo = max(0, at - width)
        # the lookbehind sees text before lo; +2: the lookahead's space and non-space
        found = [m.start() for m in _BOUNDARY.finditer(text, lo, at + 2) if m.start() <= at]
        if found or lo == 0:
            return found[-1] if found else 0
        width *= 2


TAIL_MAX = 16 << 20  # characters: the most Tokenizer.tail holds of a text it cannot cut


def _cut(text: str, at: int) -> int:
    """The first such boundary at or after `at` (or the end of the text)."""
    m = _BOUNDARY.search(text, at)
    return m.start() if m else len(text)


# A stretch with no such boundary (one long word, number, or run of symbols), and a text for a
# SentencePiece-style tokenizer (whose BPE reads the whole text as one word), are encoded in
# pieces of PIECE_MIN to PIECE_MAX characters, cut where the ids provably stay those of the
# whole: one encode call holds about 200 bytes a character of bookkeeping, and BPE on one word
# more. PIECE_MAX characters with no such cut are refused (the text, not its longest word,
# bounds the memory).
PIECE_MIN, PIECE_MAX = 1 << 12, 1 << 16
_PUNCT = frozenset("!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~")  # ASCII symbols but the apostrophe
_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_DIGITS = frozenset("0123456789")


def merge_sides(merges: Iterable[tuple[str, str]]) -> tuple[dict[str, frozenset[str]], int, int]:
    """The merges as {left side: its right sides}, and the longest left and right side."""
    found: dict[str, set[str]] = {}
    for left, right in merges:
        found.setdefault(left, set()).add(right)
    sides = {left: frozenset(rights) for left, rights in found.items()}
    return (sides, max(map(len, sides), default=0),
            max((len(r) for rights in sides.values() for r in rights), default=0))


def may_merge_across(left: str | bytes, right: str | bytes, sides: dict, longest_left: int,
                     longest_right: int) -> bool:
    """Whether some merge (a, b) has a a suffix of `left` and b a prefix of `right` (the
    symbols BPE reads on either side of a place). When none has, no BPE step can ever join
    a token ending there to one starting there: each side's merges are then those it makes
    alone, in the same order (each is the lowest-ranked pair of the whole when it is made)."""
    starts = {right[:k] for k in range(1, min(longest_right, len(right)) + 1)}
    for k in range(1, min(longest_left, len(left)) + 1):
        rights = sides.get(left[-k:])
        if rights is not None and not rights.isdisjoint(starts):
            return True
    return False


def exact_cut(text: str, i: int, run: int, crosses, unicode_letters: bool,
              whole_words: int = 0) -> bool:
    """Whether `text` may be cut before character i (the run of one class it is in started
    at `run`) with the ids of the two parts, each encoded alone, those of the whole, for each
    pre-tokenizer _pre_tokenizer_kind accepts. Two kinds of cut:

    - an ASCII letter or digit, then an ASCII symbol other than the apostrophe: every word
      pattern ends a word there and starts the next at the symbol, reading neither side
      differently alone (no pattern looks behind; contractions start with the apostrophe),
      and BPE never merges across words;
    - inside a run of letters (ASCII, or any when the text is not normalised) at least 3
      characters in (a contraction's letters are behind), or of ASCII digits a multiple of 3
      in (Llama 3 groups digits by 3 from the run's start), where no merge of the vocabulary
      joins the symbols before i to those after (`crosses(text, i)`, may_merge_across): the
      word's BPE then never merges across the cut, and each part's merges are those of the
      whole, in the same order. A tokenizer that emits a word found in its vocabulary whole
      (ignore_merges) needs each part of the word longer than any token (`whole_words`
      characters before and after i in the run).
    """
    a, b = text[i - 1], text[i]
    if a in _ALNUM and b in _PUNCT:
        return True
    if b in _DIGITS:
        if a not in _DIGITS or (i - run) % 3:
            return False
    elif not (a.isalpha() and b.isalpha() and (unicode_letters or (a in _ALNUM and b in _ALNUM))
              and i - run >= 3):
        return False
    if whole_words and (i - run < whole_words or i + whole_words > len(text)
                        or any(_run_class(ch) != _run_class(b)
                               for ch in text[i:i + whole_words])):
        return False
    return not crosses(text, i)


def _run_class(ch: str) -> int:
    """0 for a digit, 1 for a letter, 2 for anything else (runs of one class)."""
    return 0 if ch in _DIGITS else 1 if ch.isalpha() else 2


def added_spans(text: str, contents: Iterable[str]) -> list[tuple[int, int]]:
    """[start, end) of every occurrence of an added token's text (<|endoftext|>), which the
    tokenizer matches before any word is split: no piece may cut one. One pass over the text
    for the tokens' first characters, however many tokens (Gemma's thousands of <unusedN>),
    each place then looked up by the tokens' lengths."""
    found: dict[str, set[str]] = {}
    for content in contents:
        if content:
            found.setdefault(content[0], set()).add(content)
    if not found:
        return []
    lengths = {first: sorted({len(c) for c in group}) for first, group in found.items()}
    spans = []
    for m in re.finditer("[" + "".join(map(re.escape, found)) + "]", text):
        at, first = m.start(), m.group()
        spans += [(at, at + n) for n in lengths[first]
                  if at + n <= len(text) and text[at:at + n] in found[first]]
    return sorted(spans)


def blocked_by(spans: list[tuple[int, int]], before: int = 0, after: int = 0):
    """blocked(i): whether a cut before character i falls inside one of the spans, or less
    than `before` characters past one's end or `after` before its start."""

    merged: list[list[int]] = []
    for a, b in sorted((a - after, b + before) for a, b in spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    starts = [a for a, _ in merged]

    def blocked(i: int) -> bool:
        k = bisect.bisect_left(starts, i) - 1  # the last span starting before i
        return k >= 0 and i < merged[k][1]
    return blocked


def exact_pieces(text: str, allowed, shortest: int = PIECE_MIN, longest: int = PIECE_MAX,
                 runs: bool = True) -> Iterable[tuple[int, int]]:
    """(start, end) of pieces of `text`, each cut at the first place at least `shortest`
    characters past its start (longer than any token, so that a tokenizer that emits a whole
    word found in its vocabulary, ignore_merges, never does so for a piece) where
    `allowed(i, run)` (exact_cut; `run`: where the run of one class holding i starts, None
    without `runs`); the last piece may be shorter, or up to `longest` characters with no
    such place in it; ValueError(start) for a piece of more than `longest` with none."""
    start, n = 0, len(text)
    while n - start > shortest:
        cut, end = None, min(start + longest, n - 1)
        if runs:
            run = start
            cls = _run_class(text[start])
            for i in range(start + 1, end + 1):
                c = _run_class(text[i])
                if c != cls or c == 2:
                    run, cls = i, c
                if i - start >= shortest and allowed(i, run):
                    cut = i
                    break
        else:
            cut = next((i for i in range(start + shortest, end + 1) if allowed(i, None)), None)
        if cut is None and n - start <= longest:
            break
        if cut is None:
            raise ValueError(start)
        yield start, cut
        start = cut
    if start < n:
        yield start, n


def _with_spaces_around(text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Each span widened over the white space on either side of it."""
    out = []
    for a, b in spans:
        while a > 0 and text[a - 1].isspace():
            a -= 1
        while b < len(text) and text[b].isspace():
            b += 1
        out.append((a, b))
    return out


# Fewer ids than this are measured one by one in byte_starts (the table of every token's
# length costs as much as about 4,000 such lookups).
SHORT_IDS = 1024


def _id_rules(tok: HFTokenizer) -> dict:
    """What decides a text's ids, from the tokenizer's JSON, by what it is called in an
    error: merges as pairs (files write them "a b" or ["a", "b"])."""

    d = json.loads(tok.to_str())
    model = dict(d.get("model") or {})
    vocab, merges = model.pop("vocab", None), model.pop("merges", None) or []
    return {
        "vocabulary": vocab,
        "merges": [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in merges],
        "special tokens": sorted((t["id"], t["content"]) for t in d.get("added_tokens") or []),
        "normaliser": d.get("normalizer"),
        "pre-tokeniser": d.get("pre_tokenizer"),
        "model's options": model,
    }


_SUBWORD_PREFIX = re.compile(rb'"continuing_subword_prefix"\s*:\s*"(?!")')


def unreadable_merge(raw: bytes) -> str | None:
    """What in a tokenizer.json the tokenizers library would panic on rather than refuse (a
    Rust panic: its trace printed on stderr, a BaseException raised): a BPE merge whose
    right side does not begin with the model's continuing_subword_prefix ("a b" with "##").
    None when there is none; the JSON is parsed only when such a prefix is set."""
    if not _SUBWORD_PREFIX.search(raw):
        return None
    try:
        model = json.loads(raw).get("model") or {}
    except (ValueError, AttributeError):
        return None  # not JSON, or not an object: the library refuses it with its message
    prefix = model.get("continuing_subword_prefix")
    merges = model.get("merges")
    if not isinstance(prefix, str) or not prefix or not isinstance(merges, list):
        return None
    for n, merge in enumerate(merges):
        pair = merge.split(" ", 1) if isinstance(merge, str) else merge
        if isinstance(pair, list) and len(pair) == 2 and isinstance(pair[1], str) \
                and not pair[1].startswith(prefix):
            return (f"merge {n:,} ({shown(pair[0])} {shown(pair[1])}) does not "
                    f"continue a word with the continuing_subword_prefix {shown(prefix)}")
    return None


def _parsed(parse, source):
    """parse(source), with a panic of the library (pyo3's PanicException, a BaseException)
    turned into the Exception a malformed file raises."""
    try:
        return parse(source)
    except Exception:
        raise
    except BaseException as e:
        if type(e).__name__ != "PanicException":
            raise  # Ctrl-C, SystemExit
        raise ValueError(f"the tokenizers library cannot read it: {e}") from None


class Tokenizer:
    def __init__(self, tok: HFTokenizer):
        self._tok = tok
        self._byte_of = _byte_decoder()
        self._strs: dict[int, str] = {}  # token_str of each id asked for (--each-line asks again)
        # the model's rows, when it has more than the tokenizer has tokens (Pythia and Qwen pad
        # their vocabularies): the rows past the last token have no text (folder.open_folder)
        self.rows: int | None = None
        self.end: int | None = None  # the config's end token, when there is no <|endoftext|>
        # the tokens put before and after a text (text_ids): set from the folder (set_affix)
        self.affix: tuple[list[int], list[int]] = ([], [])
        self.end_ids: tuple[int, ...] = ()  # where generation ends (weights.end_ids)

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        return cls.from_bytes(Path(path).read_bytes())

    @classmethod
    def from_str(cls, text: str) -> Tokenizer:
        return cls.from_bytes(text.encode("utf-8"))

    @classmethod
    def from_bytes(cls, raw: bytes) -> Tokenizer:
        """A tokenizer.json's bytes, parsed as they are (no str made of them first: start-up);
        what is not a tokenizer fails as from_str of the text does, with its messages (an
        Exception, never the library's panic: see unreadable_merge)."""
        wrong = unreadable_merge(raw)
        if wrong:
            raise ValueError(wrong)
        try:
            return cls(_parsed(HFTokenizer.from_buffer, raw))
        except Exception:  # noqa: BLE001 - tokenizers raises a bare Exception
            return cls(_parsed(HFTokenizer.from_str, raw.decode("utf-8")))

    def differs_from(self, other: Tokenizer) -> str | None:
        """None when the two give every text the same ids: the same vocabulary, merges,
        special tokens, normaliser, pre-tokeniser and tokens put around a text (the folder's
        <bos>: affix); their decoders, which only turn ids back into text, may differ. Else
        what differs first, for the error."""
        if other is self:
            return None
        a, b = _id_rules(self._tok), _id_rules(other._tok)
        a["tokens put around a text"], b["tokens put around a text"] = self.affix, other.affix
        return next((what for what in a if a[what] != b[what]), None)

    def kind(self) -> str | None:
        """None for a tokenizer whose tokens are bytes: a byte-level BPE (GPT-2's kind, and
        Llama 3's, Qwen's and Pythia's, whose words are split by a regex written out and whose
        text may be NFC-normalised first), or a SentencePiece-style BPE with byte fallback;
        else what it is instead, for the error. A byte-level BPE may lack bytes (SmolLM2's
        lacks 0xC0, 0xC1, 0xF5-0xFF, which no UTF-8 text holds, and six control characters):
        a text that needs one is refused when it is encoded (`missing_bytes`)."""
        model = type(self._tok.model).__name__
        if model != "BPE":
            return f"its model is {model}"
        if self.byte_fallback:
            return _sentencepiece_kind(self._tok, self._byte_ids)
        wrong = _pre_tokenizer_kind(_parts(self._tok.pre_tokenizer))
        if wrong:
            return wrong
        decoder = self._tok.decoder
        if type(decoder).__name__ != "ByteLevel":  # what turns the tokens back into text
            return "it has no decoder" if decoder is None else \
                f"its decoder is {type(decoder).__name__}, not ByteLevel"
        norm = self._tok.normalizer  # it changes the text before it is split: only NFC,
        if norm is not None and _state(norm) != {"type": "NFC"}:  # which is the same text
            return f"it has a normalizer, {type(norm).__name__}"
        return None

    @cached_property
    def byte_fallback(self) -> bool:
        """A SentencePiece-style BPE: a character no piece holds is spelt by <0xNN> tokens."""
        return bool(getattr(self._tok.model, "byte_fallback", False))

    @cached_property
    def _byte_ids(self) -> dict[int, int]:
        """id -> byte of the <0xNN> tokens of a byte-fallback vocabulary (none otherwise)."""
        if not self.byte_fallback:
            return {}
        found = {self._tok.token_to_id(f"<0x{b:02X}>"): b for b in range(256)}
        return {i: b for i, b in found.items() if i is not None}

    @cached_property
    def missing_bytes(self) -> bytes:
        """The bytes a byte-level vocabulary has no token for, those UTF-8 text can hold
        (0xC0, 0xC1 and 0xF5-0xFF never occur in it): the library would drop them silently."""
        if self.byte_fallback:
            return b""
        return bytes(b for b, ch in _bytes_to_unicode().items()
                     if self._tok.token_to_id(ch) is None and b not in NEVER_IN_UTF8)

    def check_bytes(self, text: str) -> None:
        """InputError naming the first byte of the text this tokenizer has no token for."""
        missing = self.missing_bytes
        if not missing:
            return
        if missing.isascii():  # control characters: look for the characters themselves
            m = re.search("[" + re.escape(missing.decode("ascii")) + "]", text)
            at = m.start() if m else None
        else:
            at = next((i for i, ch in enumerate(text)
                       if any(b in missing for b in ch.encode("utf-8"))), None)
        if at is None:
            return

        byte = next(b for b in text[at].encode("utf-8") if b in missing)
        raise InputError(f"the text's character {at} ({_named(text[at])}) needs byte "
                         f"0x{byte:02x}, which this model's tokenizer has no token for: the "
                         "model cannot read it; leave it out")

    @cached_property
    def vocab_size(self) -> int:
        # cached: the library counts its added tokens on every call (0.1 ms with Gemma 3's
        # 6,400: score's labels of 262,144 tokens asked 262,144 times, 28 s), and a
        # tokenizer's vocabulary never changes once read
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def n_rows(self) -> int:
        """The ids a model may predict: every token, and its padding rows past them; or, when
        the tokenizer has added tokens past the model's rows, the rows alone."""
        return self.vocab_size if self.rows is None else self.rows

    def only_added_past(self, rows: int) -> bool:
        """Whether every token from id `rows` on is an added token, matched whole in a text
        and never made by the merges (Gemma 3's special <image_soft_token> past its text
        model's rows): a text naming one is refused (check_rows)."""
        decoder = self._tok.get_added_tokens_decoder()
        return all(i in decoder for i in range(rows, self.vocab_size))

    def check_rows(self, ids: list[int]) -> None:
        """InputError for an added token the model has no row for (only_added_past)."""
        if self.rows is None or self.rows >= self.vocab_size:
            return
        bad = next((i for i in ids if i >= self.rows), None)
        if bad is not None:
            raise InputError(
                f"{shown(self._tok.id_to_token(bad))} (id {bad:,}) is a token of the "
                f"tokenizer the model has no row for (its {self.rows:,} rows: ids 0 to "
                f"{self.rows - 1:,}); leave it out")

    @cached_property
    def eot_id(self) -> int:
        """<|endoftext|>'s id, or the end token the model's config names when the tokenizer
        has none of that name (Llama 3's <|end_of_text|>: `ends_with`)."""
        i = self._tok.token_to_id(END_OF_TEXT)
        if i is None and self.end is not None:
            return self.end
        if i is None:
            raise ValueError(f"tokenizer has no {END_OF_TEXT} token")
        return i

    @property
    def start_id(self) -> int:
        """The token a text is read after: the one its post-processor puts first (Gemma's
        <bos>, without which a real Gemma 3 writes junk), else eot_id, the separator the
        stories were trained after."""
        before = self.affix[0]
        return before[0] if len(before) == 1 else self.eot_id

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """The ids generation ends at: the folder's end tokens, else eot_id."""
        return self.end_ids or (self.eot_id,)

    def ends_with(self, token_id: int | None) -> None:
        """The model's own end token (its config's eos_token_id), used as eot_id when the
        tokenizer has no <|endoftext|>: a special token of the tokenizer, or nothing."""
        name = self._tok.id_to_token(token_id) if token_id is not None else None
        if name is not None and name in self.special_tokens:
            self.end = token_id

    @cached_property
    def special_tokens(self) -> dict[str, int]:
        # cached: token_bytes asks for it once per token, and a tokenizer never changes
        return {t.content: i for i, t in self._tok.get_added_tokens_decoder().items()}

    @cached_property
    def longest_token_bytes(self) -> int:
        """The most bytes one token stands for (each character of a byte-level vocabulary
        entry is one byte): a text of more than n * this bytes is more than n tokens."""
        if self.byte_fallback:  # '▁' is one character of three bytes
            return max(len(self.token_bytes(i)) for i in range(self.vocab_size))
        return max(len(piece) for piece in self._tok.get_vocab(with_added_tokens=True))

    @cached_property
    def token_strs(self) -> list[str]:
        """token_str of every id, made once: views that label the whole vocabulary (score,
        and every line of --each-line after the first) take it from here."""
        return [self.token_str(i) for i in range(self.n_rows)]

    def ids_are_0_to(self, last: int) -> bool:
        """Whether the token ids are exactly 0, 1, ..., last (about 1 ms for 4,096)."""
        return set(self._tok.get_vocab(with_added_tokens=True).values()) == set(range(last + 1))

    def encode(self, text: str) -> list[int]:
        """The text's tokens, without the special tokens the folder's tokenizer puts around a
        text (text_ids adds them); InputError for a byte the vocabulary has no token for, or
        a token the model has no row for."""
        ids = self._encode(text)
        self.check_rows(ids)
        return ids

    def _encode(self, text: str) -> list[int]:
        self.check_bytes(text)
        if len(text) > CHUNK and self.byte_fallback:
            if self._merge_index is not None:
                return self._encode_sentencepiece(text)
            if len(text) > PIECE_MAX:  # read as one word: about 200 bytes a character held

                raise InputError(
                    f"the text is {len(text):,} characters long, and this tokenizer's BPE "
                    "(byte fallback with dropout, ignore_merges or a word prefix or suffix) "
                    "reads a text as one word, which cannot be encoded in pieces exactly: "
                    f"give it at most {PIECE_MAX:,} characters")
        if len(text) > CHUNK and not self.byte_fallback:  # byte-level words never span a cut
            return self._encode_long(text)
        return self._tok.encode(text, add_special_tokens=False).ids

    def text_ids(self, text: str) -> list[int]:
        """A text's ids as the folder's tokenizer hands them to the model: encode(text) with
        the tokens its post-processor puts before and after a text (set_affix), as
        transformers' tokenizer(text) does: Gemma's <bos>, Llama 2's <s>."""
        before, after = self.affix
        return [*before, *self.encode(text), *after]

    def as_its_class_reads(self, settings: dict | None) -> None:
        """The spaces as transformers 5's class for the folder (tokenizer_config.json's
        tokenizer_class) writes them: its LlamaTokenizer keeps tokenizer.json's vocabulary
        and merges but not its normaliser or pre-tokeniser, writing each space as `▁` with
        a `▁` put before every piece of text between special tokens (`legacy: true`, Llama
        2's own files) or before the text's first only, never doubled (Llama 2's normaliser
        Prepend would put a second before " leading space")."""
        cls = (settings or {}).get("tokenizer_class")
        if cls not in ("LlamaTokenizer", "LlamaTokenizerFast") or not self.byte_fallback:
            return
        legacy = (settings or {}).get("legacy") is True
        prefix = (settings or {}).get("add_prefix_space") is not False
        scheme = ("always" if legacy else "first") if prefix else "never"
        self._tok.normalizer = None
        self._tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE,
                                                           prepend_scheme=scheme, split=False)

    def set_affix(self) -> None:
        """The tokens around a text (affix), as transformers 5 puts them: tokenizer.json's
        post-processor decides (the library's own, on a probe text). tokenizer_config.json's
        add_bos_token is not read: transformers 5 drops it whenever there is a tokenizer.json
        (transformers 4's Llama and Gemma classes let it rebuild the post-processor; the hub's
        Gemma and Llama 2 files say the same in both places)."""
        probe = self._tok.encode("a", add_special_tokens=True)
        mask = probe.special_tokens_mask
        first = mask.index(0) if 0 in mask else len(mask)
        last = len(mask) - mask[::-1].index(0) if 0 in mask else len(mask)
        self.affix = (probe.ids[:first], probe.ids[last:])

    def tail(self, pieces: Iterable[str], keep: int) -> tuple[str, int]:
        """(the end of a text given in pieces, how many tokens of encode's come before it):
        at least its last `keep` characters, from a place no token spans (_BOUNDARY), so
        its tokens are the text's last ones exactly and the count is the text's own, while
        no more than about 2 keep characters and a piece are held, however long the text
        (--last N from an endless stdin). A tokenizer with byte fallback (SentencePiece,
        whose text is one piece) has no such place: its text is held whole; InputError
        past TAIL_MAX characters held, for it or for a text with no place to cut."""

        text, before = "", 0
        for piece in pieces:
            text += piece
            if len(text) <= 2 * keep + CHUNK:
                continue
            at = 0 if self.byte_fallback else _last_cut(text, len(text) - keep)
            if at > 0:
                before += len(self.encode(text[:at]))
                text = text[at:]
            elif len(text) > TAIL_MAX:
                why = ("this tokenizer (byte fallback) cannot encode a text's end alone"
                       if self.byte_fallback else "no place in it where a token cannot span")
                raise InputError(f"the text on stdin is more than {TAIL_MAX:,} characters "
                                 f"long and {why}; --last reads at most that much of such a "
                                 "text: give it shorter")
        return text, before

    def _encode_long(self, text: str) -> list[int]:
        """A long text in pieces cut where the byte-level pre-tokenizer always starts a new
        piece (_BOUNDARY; no token spans two), so the ids are the same as in one piece, while
        the library's per-token bookkeeping (about 600 bytes a token) is held for one piece
        at a time instead of for millions of tokens. A stretch of more than 2 CHUNK with no
        such boundary is cut further by exact_pieces; InputError where it cannot be."""
        out: list[int] = []
        start = 0
        while start < len(text):
            end = _cut(text, start + CHUNK)
            if end - start <= 2 * CHUNK:
                out += self._tok.encode(text[start:end], add_special_tokens=False).ids
            else:
                out += self._encode_stretch(text, start, end)
            start = end
        return out

    def _encode_stretch(self, text: str, start: int, end: int) -> list[int]:

        stretch = text[start:end]
        shortest = max(PIECE_MIN, self.longest_token_bytes + 1)
        longest = max(PIECE_MAX, 4 * shortest)
        whole_words = self.longest_token_bytes + 1 if self._option("ignore_merges") else 0
        unicode_letters = self._tok.normalizer is None
        blocked = blocked_by(added_spans(stretch, self.special_tokens))

        def allowed(i: int, run: int) -> bool:
            return exact_cut(stretch, i, run, self._crosses, unicode_letters, whole_words) \
                and not blocked(i)
        out: list[int] = []
        try:
            for a, b in exact_pieces(stretch, allowed, shortest, longest):
                out += self._tok.encode(stretch[a:b], add_special_tokens=False).ids
        except ValueError as e:
            raise InputError(self._no_cut(longest, start + e.args[0])) from None
        return out

    @staticmethod
    def _no_cut(longest: int, at: int) -> str:
        return (f"the text has more than {longest:,} characters from character {at:,} that "
                "cannot be encoded in pieces exactly (one word, number or run of symbols, "
                "which BPE may merge across anywhere): give shorter runs of one kind of "
                "character")

    def _encode_sentencepiece(self, text: str) -> list[int]:
        """A long text for a SentencePiece-style tokenizer, whose BPE reads the whole text as
        one word (quadratic-ish memory and time), in pieces cut where no merge can join the
        symbols on either side (_crosses), each encoded after the `overlap` characters before
        it, whose own ids are then dropped: those characters take the space the tokenizer
        puts before a text (Llama 2's ▁), so the piece's own characters are read as inside
        the whole. No cut within `overlap` characters after an added token's text (a new
        section of text, which gets that space again) or next to one (whose lstrip/rstrip
        may take the spaces around it). InputError for PIECE_MAX characters with no cut."""

        allowed, overlap = self.sentencepiece_cuts(text)
        shortest = max(PIECE_MIN, self.longest_token_bytes + 1, overlap + 1)
        longest = max(PIECE_MAX, 4 * shortest)
        out: list[int] = []
        try:
            for a, b in exact_pieces(text, lambda i, _: allowed(i), shortest, longest,
                                     runs=False):
                out += self.piece_ids(text, a, b, overlap)
        except ValueError as e:
            raise InputError(self._no_cut(longest, e.args[0])) from None
        return out

    def sentencepiece_cuts(self, text: str):
        """(allowed(i): whether _encode_sentencepiece may cut `text` before character i,
        the overlap its pieces are read after), for a tokenizer whose _merge_index is known."""
        _, longest_left, _ = self._merge_index
        overlap = longest_left + 1  # more symbols than any merge's left side
        contents = [c for s in self.special_tokens for c in {s, s.replace(SPACE, " ")}]
        blocked = blocked_by(_with_spaces_around(text, added_spans(text, contents)),
                             before=overlap + 1, after=1)
        return (lambda i: i >= overlap and not blocked(i) and not self._crosses(text, i)), \
            overlap

    def piece_ids(self, text: str, a: int, b: int, overlap: int) -> list[int]:
        """The ids of text[a:b] as part of the whole (for a SentencePiece-style tokenizer, at
        places _encode_sentencepiece may cut): text[a - overlap:b]'s, past those of text[a -
        overlap:a] alone."""
        if a == 0:
            return self._tok.encode(text[:b], add_special_tokens=False).ids
        lead = self._tok.encode(text[a - overlap:a], add_special_tokens=False).ids
        return self._tok.encode(text[a - overlap:b], add_special_tokens=False).ids[len(lead):]

    def _option(self, name: str):
        """One of the BPE model's options (ignore_merges, dropout...), None when unset."""
        return getattr(self._tok.model, name, None)

    @cached_property
    def _merge_index(self) -> tuple[dict, int, int] | None:
        """merge_sides of the vocabulary, in the symbols its BPE reads: the text's bytes (a
        byte-level BPE; a merge with a character outside the byte alphabet never applies), or
        its characters with spaces as ▁ and any character outside the vocabulary as its
        <0xNN> tokens (SentencePiece-style). None when BPE reads anything else (a prefix on
        a word's later symbols, a suffix on its last, dropout, a SentencePiece-style
        vocabulary that emits a word found whole, ignore_merges): no cut is made there."""
        if self._option("continuing_subword_prefix") or self._option("end_of_word_suffix") \
                or self._option("dropout") or (self.byte_fallback
                                               and self._option("ignore_merges")):
            return None
        merges = _id_rules(self._tok)["merges"]
        if self.byte_fallback:
            return merge_sides(merges)
        of = self._byte_of
        return merge_sides((bytes(of[c] for c in x), bytes(of[c] for c in y))
                           for x, y in merges if all(c in of for c in x + y))

    def _crosses(self, text: str, i: int) -> bool:
        """Whether BPE might merge across the place before character i (may_merge_across
        on the symbols around it; True where it cannot tell)."""
        index = self._merge_index
        if index is None:
            return True
        sides, longest_left, longest_right = index
        left = self._symbols(text, i, longest_left, before=True)
        right = self._symbols(text, i, longest_right, before=False)
        if left is None or right is None:
            return True
        return may_merge_across(left, right, sides, longest_left, longest_right)

    def _symbols(self, text: str, i: int, n: int, before: bool) -> str | bytes | None:
        """What BPE reads of the text, inside the whole, in (at least) the n symbols before
        or after place i (each character is one symbol or more); None where the tokenizer's
        NFC normaliser might read them otherwise."""
        a, b = (max(i - n, 0), i) if before else (i, min(i + n, len(text)))
        if self.byte_fallback:  # spaces as ▁, characters outside the vocabulary as bytes
            known = self._known_chars
            return "".join(ch if ch in known else
                           "".join(f"<0x{x:02X}>" for x in ch.encode("utf-8", "surrogatepass"))
                           for ch in text[a:b].replace(" ", SPACE))
        if self._tok.normalizer is None:
            return text[a:b].encode("utf-8", "surrogatepass")
        # NFC. Cuts are looked for before an ASCII character only, which composes with
        # nothing before it: NFC(x + y) is NFC(x) + NFC(y) there. The far edge is moved to
        # such a place too, from three times as far (NFC may shrink bytes that much: 3 jamo
        # to one Hangul syllable), within 64 more characters

        end = len(text)
        if before:
            a, limit = max(i - 3 * n, 0), max(i - 3 * n - 64, 0)
            while a > limit and not text[a].isascii():
                a -= 1
            ok = a == 0 or text[a].isascii()
        else:
            b, limit = min(i + 3 * n, end), min(i + 3 * n + 64, end)
            while b < limit and not text[b].isascii():
                b += 1
            ok = b == end or text[b].isascii()
        found = unicodedata.normalize("NFC", text[a:b]).encode("utf-8", "surrogatepass")
        return found if ok and (len(found) >= n or a == 0 or b == end) else None

    @cached_property
    def _known_chars(self) -> frozenset[str]:
        """The characters a SentencePiece-style vocabulary has a token for (any other is
        spelt by its bytes' <0xNN> tokens)."""
        return frozenset(t for t in self._tok.get_vocab(with_added_tokens=False)
                         if len(t) == 1)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        for text in texts:
            self.check_bytes(text)
        # a long one in pieces, as encode does
        whole = [t for t in texts if len(t) <= CHUNK]
        found = iter(e.ids for e in self._tok.encode_batch(whole, add_special_tokens=False))
        out = [next(found) if len(t) <= CHUNK else self._encode(t) for t in texts]
        for ids in out:
            self.check_rows(ids)
        return out

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def continuation(self, ids: Iterable[int]) -> str:
        """The text the ids add after a text: their bytes, as decode gives them for a
        byte-level BPE, but never with the space a SentencePiece decoder strips from the
        start of a text (Llama 2's: " Paris" after "The capital is" keeps its space)."""
        return b"".join(self.token_bytes(i) for i in ids).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes one token stands for."""
        piece = self._tok.id_to_token(int(token_id))
        if piece is None and self.vocab_size <= int(token_id) < self.n_rows:
            return b""  # a padding row of the model: no text
        if piece is None:
            raise ValueError(
                f"token id {token_id} is not in the vocabulary (0..{self.vocab_size - 1})"
            )
        byte = self._byte_ids.get(int(token_id))
        if byte is not None:  # <0xNN>: the byte it falls back to
            return bytes((byte,))
        if piece in self.special_tokens:
            return piece.encode("utf-8")
        if self.byte_fallback:
            return piece.replace(SPACE, " ").encode("utf-8")
        return bytes(self._byte_of[ch] for ch in piece)

    def token_to_id(self, text: str) -> int | None:
        """The id of the token whose text is exactly `text` (' toys', with its space), or None."""
        if text in self.special_tokens:
            return self.special_tokens[text]
        if self.byte_fallback:  # the piece, else the byte's own <0xNN> token
            found = self._tok.token_to_id(text.replace(" ", SPACE))
            if found is not None and found not in self._byte_ids:
                return found
            raw = text.encode("utf-8")
            return self._tok.token_to_id(f"<0x{raw[0]:02X}>") if len(raw) == 1 else None
        to_char = _bytes_to_unicode()
        piece = "".join(to_char[b] for b in text.encode("utf-8"))
        return self._tok.token_to_id(piece)

    def token_str(self, token_id: int) -> str:
        """One token as text; bytes that are part of a longer UTF-8 character show as \\xNN."""
        found = self._strs.get(token_id)
        if found is None and self.vocab_size <= int(token_id) < self.n_rows:
            found = self._strs[token_id] = f"<row {int(token_id)}>"  # padding: no token
        if found is None:
            found = self._strs[token_id] = self.token_bytes(token_id).decode(
                "utf-8", errors="backslashreplace")
        return found

    def byte_starts(self, ids: list[int]) -> list[int]:
        """Where each token starts in the UTF-8 bytes of the decoded text, and the end
        (len(ids) + 1 numbers), from a table of each vocabulary token's length: a million
        tokens in a fraction of a second, without a tuple per token, and without NumPy
        (`encode` never imports it)."""

        if len(ids) < SHORT_IDS:  # a short text: its own tokens, not the whole table (4 ms)
            return list(accumulate((len(self.token_bytes(i)) for i in ids), initial=0))
        lengths = self._byte_lengths
        return list(accumulate((lengths[i] for i in ids), initial=0))

    @cached_property
    def _byte_lengths(self) -> list[int]:  # every token's: made once, for long texts
        return [len(self.token_bytes(i)) for i in range(self.vocab_size)]

    def byte_starts_in(self, text: str, ids: list[int]) -> list[int]:
        """byte_starts of encode(text)'s ids, as places in the text's UTF-8 bytes: a
        SentencePiece tokenizer puts a `▁` before a piece of text (Llama 2's Metaspace or
        normaliser Prepend; a piece is the text between added tokens) that no byte of the text
        is, so the token holding it starts one byte later (a lone `▁` holds none, as <bos>)."""
        starts = self.byte_starts(ids)
        if not self.byte_fallback:  # a byte-level token is its bytes in the text
            return starts
        raw = text.encode("utf-8")
        added = frozenset(self.special_tokens.values())
        out, shift, i = list(starts), 0, 0
        while i < len(ids):
            if ids[i] in added:
                out[i] -= shift
                i += 1
                continue
            j = next((k for k in range(i, len(ids)) if ids[k] in added), len(ids))
            if self._prefixed(raw, starts[i] - shift, starts[j] - starts[i],
                              ids[i], ids[j] if j < len(ids) else None):
                out[i] -= shift
                shift += 1
                out[i + 1:j] = [s - shift for s in starts[i + 1:j]]
            else:
                out[i:j] = [s - shift for s in starts[i:j]]
            i = j
        out[-1] = starts[-1] - shift
        return out

    def _prefixed(self, raw: bytes, at: int, length: int, first: int, after: int | None
                  ) -> bool:
        """Whether the piece of text at byte `at`, made of tokens of `length` bytes in all,
        the first `first`, and followed by the added token `after` (None: the text's end), is
        one byte shorter than its tokens: its first token's space put there by the tokenizer.
        Told by where the text goes on (the added token's text, or its end), and when both
        places would do, by the first token's bytes."""
        head = self.token_bytes(first)
        if not head.startswith(b" "):
            return False
        if after is None:
            return len(raw) - at == length - 1
        follows = self.token_bytes(after)
        short, whole = raw.startswith(follows, at + length - 1), raw.startswith(follows,
                                                                                at + length)
        if short and whole:
            return not raw.startswith(head, at) and raw.startswith(head[1:], at)
        return short

    def text_byte_starts(self, text: str, ids: list[int]) -> list[int]:
        """byte_starts_in of text_ids(text): the tokens the post-processor puts around the
        text (Gemma's <bos>) take none of its bytes, as transformers' offsets give them
        (0, 0)."""
        before, after = (list(a) for a in self.affix)
        b = len(before) if ids[:len(before)] == before else 0
        a = len(after) if after and len(ids) - b >= len(after) and \
            ids[len(ids) - len(after):] == after else 0
        inner = self.byte_starts_in(text, ids[b:len(ids) - a])
        return [0] * b + inner + [inner[-1]] * a

    def text_byte_offsets(self, text: str, ids: list[int]) -> list[tuple[int, int]]:
        """(start, end) of each of text_ids(text)'s tokens in the text's UTF-8 bytes."""

        return list(pairwise(self.text_byte_starts(text, ids)))

    def byte_offsets(self, ids: Iterable[int]) -> list[tuple[int, int]]:
        """(start, end) of each token in the UTF-8 bytes of the decoded text."""

        return list(pairwise(self.byte_starts(list(ids))))


def train_tokenizer(stories: Iterable[str], vocab_size: int = 4096) -> Tokenizer:
    """Byte-level BPE with `<|endoftext|>` as its one special token.

    Trained on stories without their separators, so the special token is never merged into
    ordinary text. No normaliser and no prefix space: decode(encode(text)) == text.
    """
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(stories, trainer)
    return Tokenizer(tok)


def save_tokenizer(tokenizer: Tokenizer, path: str | Path) -> None:

    write_atomically(Path(path), tokenizer._tok.to_str(pretty=True).encode("utf-8"))


def parse_ids(words: list[str], vocab_size: int) -> list[int]:
    """The token ids in `words` (separated by spaces, commas or brackets, as `decode` takes
    them), each in the vocabulary; else InputError."""

    ids = []
    for word in words:
        for part in re.split(r"[\s,\[\]]+", word):
            if not part:
                continue
            if not re.fullmatch(r"-?\d+", part):
                raise InputError(f"{part!r} is not a token id: ids are whole numbers")
            ids.append(int(part))
    if not ids:
        raise InputError("no token ids given: give at least one, e.g. tinygpt decode 608 429")
    for i in ids:
        if not 0 <= i < vocab_size:
            raise InputError(f"unknown token id {i}: ids run from 0 to {vocab_size - 1}")
    return ids
