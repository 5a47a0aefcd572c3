"""A GGUF file's tokenizer, from its metadata (`tokenizer.ggml.*`), as a `tokenizers`
Tokenizer that gives the ids of the Hugging Face tokenizer of the same model.

Two kinds are written by llama.cpp's converter:

- `gpt2`: a byte-level BPE, its tokens spelt in GPT-2's byte alphabet, with its merges; the
  pre-tokenizer (how the text is cut into words before the merges) is named by
  `tokenizer.ggml.pre`, and each name is one of the word patterns the Hugging Face files of
  those models write out;
- `llama`: SentencePiece's BPE, tokens with '▁' for a space and `<0xNN>` tokens for the bytes
  no other token covers, and a score per token instead of merges: the merges are the splits
  of each token into two tokens, the best score first (SentencePiece merges the pair whose
  union scores highest).

Tokens the file marks CONTROL are special tokens (matched whole, never merged into); those
marked USER_DEFINED are added tokens, matched whole too (as llama.cpp does).

A Gemma file (general.architecture gemma3) is SentencePiece's with two differences, as
transformers' GGUF tokenizer reads it (its gemma_tokenizer): a token of spaces alone is
stored with real spaces and is the run of '▁' the Hugging Face tokenizer spells (kept as it
is where the vocabulary already has that run); and its
merges rank by the tokens' order in the file, not by their scores (Gemma's scores do not
follow its merge order). Its text gets no '▁' in front (add_space_prefix false).
"""

from __future__ import annotations

from tokenizers import processors

from ..errors import WeightsError
from ..escapes import shown
from .tokenizer import WORD_PATTERNS, _bytes_to_unicode

CONTROL, USER_DEFINED = 3, 4
SPACE = "\u2581"  # SentencePiece's stand-in for a space

# tokenizer.ggml.pre -> the pre-tokenizer: (digits alone first, the word pattern)
PRE = {
    "default": (False, "GPT-2"), "gpt-2": (False, "GPT-2"),
    "llama3": (False, "Llama 3"), "llama-v3": (False, "Llama 3"),
    "llama-bpe": (False, "Llama 3"), "smaug-bpe": (False, "Llama 3"),
    "dbrx": (False, "Llama 3"),
    "qwen2": (False, "Qwen2"), "deepseek-r1-qwen": (False, "Qwen2"),
    # llama.cpp splits each digit off, then GPT-2's words (SmolLM2's tokenizer.json:
    # Digits(individual) before a ByteLevel)
    "smollm": (True, "GPT-2"), "starcoder": (True, "GPT-2"), "refact": (True, "GPT-2"),
}

# the tokens llama.cpp ends generation at by their text, besides the file's eos, eot and eom
# ids (its llama-vocab.cpp, special_eog_ids: "convert scripts should provide these tokens
# through the KV metadata"; they do not, so a Gemma 3 file's <end_of_turn>, 106, is found so)
END_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]",
    "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~["})

# and its fill-in-the-middle pad, repo and file separator tokens, which end generation too:
# the file's fim_*_token_id, else the one token of that text
FIM_TEXTS = {"fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
             "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
             "fim_sep": ("<|file_sep|>",)}

IGNORE_MERGES = {"llama3", "llama-v3", "llama-bpe"}
GEMMA = {"gemma3"}  # general.architecture: the vocabulary read as Gemma's (module docstring)


def build(meta: dict, path) -> tuple[object, dict]:
    """(tinygpt Tokenizer, what the file says about it for `info`) from the metadata."""
    from .tokenizer import Tokenizer

    kind = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise WeightsError(f"{path}: no tokenizer.ggml.tokens: the file has no vocabulary")
    types = _ints(meta.get("tokenizer.ggml.token_type"), len(tokens), "token_type", path)
    if kind == "gpt2":
        tok = _byte_level(tokens, types, meta, path)
    elif kind == "llama":
        tok = _sentencepiece(tokens, types, meta, path,
                             gemma=meta.get("general.architecture") in GEMMA)
    else:
        raise WeightsError(f"{path}: tokenizer {shown(kind)} is not one tinygpt reads "
                           "(gpt2's byte-level BPE, llama's SentencePiece)")
    tok.post_processor = _around(tokens, meta, kind)
    out = Tokenizer(tok)
    out.set_affix()
    wrong = out.kind()
    if wrong is not None:  # what the rest of tinygpt relies on, held for this one too
        raise WeightsError(f"{path}: its tokenizer is not one tinygpt can show ({wrong})")
    about = {"model": kind, "pre": meta.get("tokenizer.ggml.pre", "default"),
             "add_bos_token": meta.get("tokenizer.ggml.add_bos_token"),
             "bos_token_id": meta.get("tokenizer.ggml.bos_token_id")}
    return out, about


def _around(tokens: list[str], meta: dict, kind: str):
    """The post-processor that puts BOS (and EOS) around a text, as transformers' GGUF
    tokenizer builds it: tokenizer.ggml.add_bos_token / add_eos_token when the file has them;
    without the key, BOS for SentencePiece (`llama`) and none for GPT-2's byte-level BPE, EOS
    never; nothing for a token the file names no id for. llama.cpp's own default differs in
    one place: without the key it also adds BOS to a byte-level vocabulary with one of the
    Llama 3 pre-tokenizers (llama3, llama-bpe, ...; its llama-vocab.cpp); we follow
    transformers, the reference the tests hold us to."""

    add_bos = meta.get("tokenizer.ggml.add_bos_token", kind == "llama") is True
    add_eos = meta.get("tokenizer.ggml.add_eos_token", False) is True
    bos = _token(tokens, meta, "bos") if add_bos else None
    eos = _token(tokens, meta, "eos") if add_eos else None
    # names of our own for the template: a byte-level vocabulary spells its tokens otherwise
    before = [("[BOS]", bos)] if bos is not None else []
    after = [("[EOS]", eos)] if eos is not None else []
    return processors.TemplateProcessing(
        single=[f"{n}:0" for n, _ in before] + ["$A:0"] + [f"{n}:0" for n, _ in after],
        special_tokens=before + after)


def _token(tokens: list[str], meta: dict, which: str) -> int | None:
    i = meta.get(f"tokenizer.ggml.{which}_token_id")
    return i if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(tokens) else None


def _ints(values, n: int, what: str, path) -> list[int]:
    if values is None:
        return [1] * n  # NORMAL
    if not isinstance(values, list) or len(values) != n:
        raise WeightsError(f"{path}: tokenizer.ggml.{what} has {_count(values)} entries for "
                           f"{n:,} tokens")
    return values


def _count(values) -> str:
    return f"{len(values):,}" if isinstance(values, list) else "no list of"


def _byte_level(tokens: list[str], types: list[int], meta: dict, path):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers


    merges = meta.get("tokenizer.ggml.merges")
    if not isinstance(merges, list) or not all(isinstance(m, str) and m.count(" ") == 1
                                               for m in merges):
        raise WeightsError(f"{path}: tokenizer.ggml.merges is missing or not pairs of tokens")
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in PRE:
        raise WeightsError(f"{path}: pre-tokenizer {shown(pre)} is not one tinygpt knows "
                           f"({', '.join(sorted(PRE))})")
    alphabet = set(_bytes_to_unicode().values())
    spelt = [t if set(t) <= alphabet else
             "".join(_bytes_to_unicode()[b] for b in t.encode("utf-8")) for t in tokens]
    vocab = _vocab(spelt, path)
    digits, pattern = PRE[pre]
    # a word that is a token is that token, merges or not: Llama 3's tokenizer.json says so
    # (ignore_merges), and llama.cpp does the same for these pre-tokenizers
    tok = Tokenizer(models.BPE(vocab, [tuple(m.split(" ")) for m in merges],
                               fuse_unk=False, byte_fallback=False,
                               ignore_merges=pre in IGNORE_MERGES))
    if pattern == "GPT-2":
        parts = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    else:
        parts = [pre_tokenizers.Split(Regex(WORD_PATTERNS[pattern]), behavior="isolated"),
                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    if digits:
        parts.insert(0, pre_tokenizers.Digits(individual_digits=True))
    tok.pre_tokenizer = parts[0] if len(parts) == 1 else pre_tokenizers.Sequence(parts)
    tok.decoder = decoders.ByteLevel()
    # a control token spelt outside the byte alphabet is no token of a byte-level vocabulary
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, k in zip(tokens, types, strict=True)
                            if k == CONTROL and set(t) <= alphabet])
    tok.add_tokens([AddedToken(s, special=False, normalized=False)
                    for s, k in zip(spelt, types, strict=True) if k == USER_DEFINED])
    return tok


def _vocab(tokens: list[str], path) -> dict[str, int]:
    vocab = {}
    for i, t in enumerate(tokens):
        if t in vocab:
            raise WeightsError(f"{path}: token {shown(t)} appears twice in "
                               f"tokenizer.ggml.tokens (ids {vocab[t]} and {i})")
        vocab[t] = i
    return vocab


def _sentencepiece(tokens: list[str], types: list[int], meta: dict, path, gemma: bool = False):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    scores = meta.get("tokenizer.ggml.scores")
    if not isinstance(scores, list) or len(scores) != len(tokens):
        raise WeightsError(f"{path}: tokenizer.ggml.scores has {_count(scores)} entries for "
                           f"{len(tokens):,} tokens")
    spaces = set()
    if gemma:
        taken = set(tokens)
        spaces = {i for i, t in enumerate(tokens)
                  if t and not t.strip(" ") and SPACE * len(t) not in taken}
        tokens = [SPACE * len(t) if i in spaces else t for i, t in enumerate(tokens)]
        scores = [-float(i) for i in range(len(tokens))]
    vocab = _vocab(tokens, path)
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk] if isinstance(unk, int) and 0 <= unk < len(tokens) else None
    merges = meta.get("tokenizer.ggml.merges")
    pairs = [tuple(m.split(" ")) for m in merges] if isinstance(merges, list) else \
        merges_from_scores(tokens, scores)
    tok = Tokenizer(models.BPE(vocab, pairs, unk_token=unk, fuse_unk=True, byte_fallback=True))
    prefix = meta.get("tokenizer.ggml.add_space_prefix", True) is not False
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=SPACE, prepend_scheme="first" if prefix else "never", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(),
                                     decoders.Fuse()]
                                    + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, k in zip(tokens, types, strict=True) if k == CONTROL])
    # a run of spaces is reached by the merges once the spaces are '▁', not matched whole
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for i, (t, k) in enumerate(zip(tokens, types, strict=True))
                    if k == USER_DEFINED and i not in spaces])
    return tok


def merges_from_scores(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """SentencePiece's merges, which a GGUF does not store: every split of a token into two
    tokens is a merge, ranked by the token's score (higher first), then the longer left piece
    first; equal ones in the order of the tokens, then of the pieces' ids."""
    ids = {t: i for i, t in enumerate(tokens)}
    found = []
    for t, score in zip(tokens, scores, strict=True):
        here = [(ids[t[:k]], ids[t[k:]], t[:k], t[k:]) for k in range(1, len(t))
                if t[:k] in ids and t[k:] in ids]
        found += [(score, left, right) for _, _, left, right in sorted(here)]
    found.sort(key=lambda m: (-m[0], -len(m[1]), -len(m[2])))
    return [(left, right) for _, left, right in found]


def end_ids(meta: dict) -> tuple[int, ...]:
    """Where llama.cpp ends generation with this file: its eos, eot and eom ids, every token
    whose text is one of END_TEXTS, and its fill-in-the-middle tokens (FIM_TEXTS); the
    file's eos first."""
    tokens = meta.get("tokenizer.ggml.tokens") or []
    named = [_token(tokens, meta, which) for which in ("eos", "eot", "eom")]
    for kind, texts in FIM_TEXTS.items():
        found = _token(tokens, meta, kind)
        named.append(found if found is not None else
                     next((i for i, t in enumerate(tokens) if t in texts), None))
    found = list(dict.fromkeys(i for i in named if i is not None))
    found += [i for i, t in enumerate(tokens) if t in END_TEXTS and i not in found]
    return tuple(found)


def chat_settings(meta: dict) -> tuple[str | None, dict[str, str]]:
    """(tokenizer.chat_template, the special tokens a template names, by the file's ids), as
    llama.cpp renders a file's template (bos_token and eos_token its vocabulary's)."""
    tokens = meta.get("tokenizer.ggml.tokens") or []
    template = meta.get("tokenizer.chat_template")
    specials = {f"{which}_token": tokens[i] for which in ("bos", "eos", "unk", "pad")
                if (i := _token(tokens, meta, which)) is not None}
    return (template if isinstance(template, str) and template else None), specials
