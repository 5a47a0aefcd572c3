"""Forward passes of the lines still to come, made in batches: `--each-line`'s speed.

`--each-line` runs a command once per line; the commands that need only the model's output
(probs, logits, sample, score) make one pass over their line. Those passes batch: lines of
one length go through the model together (model.run_to_final_norm), each product still made text
by text, so every line's numbers are bit for bit those of its own pass. cli/batch.py makes
one Ahead for the lines and puts it in the run context (with the folders it opens once); a
session asks its `final_norm(params, config, ids)` before it would run the model; when `ids`
are made from the line being run (alone or after one id such as score's
separator, whole or but its last id: see _form), the answer comes from a batch made on the
first such request for the next lines (CHUNK_TOKENS tokens of them). Anything else (another
text, a steered or ablated run, a line too long for the context, numbers that overflowed, a
second request for one line) gets None, and the caller runs the model as always, so its
errors and notes stay its own.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterator

import numpy as np

from ..errors import InputError
from ..transformer.folder import Model
from ..transformer.model import run_to_final_norm as final_norm_of

CHUNK_TOKENS = 16_384  # tokens of lines computed ahead at a time: 8 MB at 128 numbers
BATCH = 64  # lines of one length in one pass


class Ahead:
    """The texts of a run, the one being run now, and the final-norm outputs made ahead,
    by (line, form: how the pass's ids are made from the line's, see _form). `opened`: the
    run context's folders opened once (folder -> Folder or Model), where the model whose
    parameters a pass is asked for is found (its tokenizer reads the lines)."""

    def __init__(self, lines, opened: dict):
        # get(i): the i-th (number, text), None past the end (a list: see listed)
        self.lines = lines if hasattr(lines, "get") else _Listed(lines)
        self.opened = opened
        self.now = 0
        self.ids: dict[int, list[int] | None] = {}  # the ids of lines from now on, as asked
        self.tokenizer = None
        self.made: dict[tuple[int, tuple], np.ndarray] = {}  # by (line, form: see _form)
        # the lines made ahead in each form: start <= line < end
        self.start: dict[tuple, int] = {}
        self.end: dict[tuple, int] = {}
        # what a command computed for lines still to come, by (its key, line index, text):
        # `why --exact` scores every window once for several lines (taken when their turn comes)
        self.kept: dict[tuple, object] = {}

    def run(self) -> Iterator[tuple[int, str]]:
        """The lines, each marked as the one being run while it is."""
        for now, line in enumerate(self.lines):
            self.now = now
            yield line
        self.now = -1  # all run

    def texts_ahead(self, n: int) -> list[str]:
        """The texts of the line being run and of up to n - 1 lines after it."""
        out = []
        for i in range(self.now, self.now + n):
            text = self._text(i)
            if text is None:
                break
            out.append(text)
        return out

    def _text(self, n: int) -> str | None:
        line = self.lines.get(n)
        return None if line is None else line[1]

    def final_norm(self, params, config, ids) -> np.ndarray | None:
        """ln_final.out [T, d] of ids [T] made ahead in a batch, or None (the caller runs
        the model itself)."""
        model = next((m for m in self.opened.values()
                      if isinstance(m, Model) and m.params is params), None)
        if model is None or self.now < 0 or self._text(self.now) is None:
            return None
        if model.tokenizer is not self.tokenizer:  # the first request (or another model's)
            self.tokenizer, self.made, self.start, self.end = model.tokenizer, {}, {}, {}
            self.ids = {}
        line = self._ids(self.now, config)
        if line is None:
            return None
        form = _form(np.asarray(ids).tolist(), line)
        if form is None:
            return None
        if not self.start.get(form, -1) <= self.now < self.end.get(form, -1):
            self.made = {k: v for k, v in self.made.items() if k[1] != form}
            self._make(params, config, form)
        return self.made.pop((self.now, form), None)  # asked for twice: None, made anew

    def _ids(self, n: int, config) -> list[int] | None:
        """Line n's ids, tokenised with the next lines (ENCODED_AT_ONCE of them) when it is
        not yet; the lines gone by are forgotten, so only a chunk's ids are ever held."""
        if n not in self.ids:
            self.ids = {k: v for k, v in self.ids.items() if k >= self.now}
            block = list(itertools.takewhile(lambda t: t is not None, map(
                self._text, range(n, n + ENCODED_AT_ONCE))))
            self.ids.update(enumerate(_encoded(self.tokenizer, block, config.n_positions), n))
        return self.ids[n]

    def _make(self, params, config, form: tuple[tuple[int, ...], int]) -> None:
        """The final-norm outputs of the next lines in this form, up to CHUNK_TOKENS tokens
        of them, in batches of lines of one length."""
        by_length = defaultdict(list)
        n, tokens = self.now, 0
        while tokens < CHUNK_TOKENS and self._text(n) is not None:
            ids = _in_form(self._ids(n, config), form)
            if ids and len(ids) <= config.n_positions:
                by_length[len(ids)].append((n, ids))
                tokens += len(ids)
            n += 1
        self.start[form], self.end[form] = self.now, n
        for lines in by_length.values():
            for b in range(0, len(lines), BATCH):
                part = lines[b : b + BATCH]
                u = final_norm_of(params, config, np.asarray([ids for _, ids in part]))
                finite = np.isfinite(u).all(axis=(1, 2))
                for (n, _), row, ok in zip(part, u, finite, strict=True):
                    if ok:  # an overflow is left to the line's own pass, which names it
                        self.made[(n, form)] = row


def _form(ids: list[int], line: list[int]) -> tuple[tuple[int, ...], int] | None:
    """How a pass's ids are made from the line's: (the ids put before it, how many of its
    last ids are left out), e.g. ((separator,), 1) for score's one window, whose inputs are
    the separator and every token but the last; None if they are not made so."""
    for before, cut in ((0, 0), (1, 0), (0, 1), (1, 1)):
        if len(ids) == before + len(line) - cut and ids[before:] == line[:len(line) - cut]:
            return tuple(ids[:before]), cut
    return None


def _in_form(line: list[int] | None, form: tuple[tuple[int, ...], int]) -> list[int]:
    before, cut = form
    return [] if not line else [*before, *line[:len(line) - cut]]


ENCODED_AT_ONCE = 512  # texts tokenised together: the library keeps ~600 bytes a token


def _encoded(tokenizer, texts: list[str], limit: int) -> list[list[int] | None]:
    """Each text's ids; None for a text surely longer than the context (it is never batched,
    and a huge line is not tokenised in one piece here), or one needing a byte the vocabulary
    lacks (its own pass refuses it: another line's refusal is not this one's)."""
    most = limit * tokenizer.longest_token_bytes
    ok = [len(t) <= most and _readable(tokenizer, t) for t in texts]
    kept = [t for t, k in zip(texts, ok, strict=True) if k]
    try:
        found = iter(tokenizer.encode_batch(kept))
    except InputError:  # a line naming a token the model has no row for (Gemma 3's image
        found = iter(_each(tokenizer, kept))  # token): its own pass refuses it
    return [next(found) if k else None for k in ok]


def _each(tokenizer, texts: list[str]) -> list[list[int] | None]:
    """Each text's ids one by one; None for one the tokenizer refuses."""
    out = []
    for text in texts:
        try:
            out.append(tokenizer.encode(text))
        except InputError:
            out.append(None)
    return out


def _readable(tokenizer, text: str) -> bool:
    """Whether the tokenizer has a token for every byte of the text (Tokenizer.check_bytes)."""

    try:
        tokenizer.check_bytes(text)
    except InputError:
        return False
    return True


class _Listed:
    """A list of (number, text) with streams.StreamLines' get(i)."""

    def __init__(self, lines: list[tuple[int, str]]):
        self.lines = lines

    def get(self, i: int) -> tuple[int, str] | None:
        return self.lines[i] if 0 <= i < len(self.lines) else None

    def __iter__(self):
        return iter(self.lines)
