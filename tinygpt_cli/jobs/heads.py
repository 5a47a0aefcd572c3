"""The texts the head detector reads: a file's first stories, a text, a few validation
stories of the project's data, or the built-in sentences (analysis.heads scores them)."""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError
from .corpus import BUILT_IN, HELD_OUT_PART, find_data, read_stories, stories_of


def texts_for_heads(tokenizer, context: int, text: str | None, read_text, file, stories: int
                    ) -> tuple[list[list[int]], str]:
    """Each text as [separator, ids...] cut to the context (the separator: start_id, Gemma's
    <bos>), and where they came from: the file's first stories, else the text
    (read_text(text): '-' is stdin), else a few validation stories, else the built-in
    sentences."""

    if text is not None and file is not None:
        raise InputError("give a text or --file, not both")
    if file is not None:
        texts, source = stories_of(Path(file))[:stories], str(file)
    elif text is not None:  # stdin only for '-': a `while read` loop's input is not ours
        texts, source = [read_text(text)], "stdin" if text == "-" else "the text"
    else:  # nothing given: the defaults
        data = find_data()
        val = data / HELD_OUT_PART if data else None
        if val is not None and val.is_file():
            texts, source = read_stories([val])[:stories], f"{val} (first {stories} stories)"
        else:
            texts, source = BUILT_IN, "built-in sentences"
    ids = [([tokenizer.start_id] + t)[:context] for t in tokenizer.encode_batch(texts)]
    if any(len(t) < 2 for t in ids):
        raise InputError("each text needs at least one token")
    return ids, source
