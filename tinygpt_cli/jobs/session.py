"""A Session: one model and one text, its ids and tokens, checked once, run with any hooks.

Everything a command, a test or a notebook needs to look at or change a forward pass, with
no terminal in sight:

    s = Session.open("Lily wanted to play with her")
    s.trace()["layers.0.heads.0.weights"]                  # look
    s.trace(ablate=["layers.1.heads.2.out"])["logits"]      # change, then look
    s.record({"layers.3.resid_post"})[1]                   # only what is needed

Errors are InputError (bad text, index or path: exit 2 in the CLI) or WeightsError.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import InputError, check_index, check_utf8
from ..transformer.folder import Model, load_model
from ..transformer.hooks import Chain, Hook, ablation, bind, check_reached, hooked_path
from ..transformer.model import all_finite, forward, logits_of, record, run_to_final_norm
from ..transformer.schema import PathError
from ..transformer.trace import Trace, run_traced
from ..words import count


def check_text(text: str) -> str:
    if text == "":
        raise InputError("the text is empty: give at least one character")
    return text


class TooLong(InputError):
    """A text longer than the model's context (a command that takes --last says so)."""


def encode_last(model: Model, text: str, last: int | None, specials: bool = True,
                before: int = 0) -> tuple[list[int], int]:
    """(the ids of the text's last `last` tokens, how many tokens before them were dropped):
    --last N. The whole text is tokenised, so the count is the text's own; None: the text
    must fit (encode_checked). `specials` (encode_checked): the tokens the folder's tokenizer
    puts around a text (Gemma's <bos>) are kept and counted among the N, and the text's own
    tokens are cut, so the model still reads its <bos> first. `before`: how many tokens of
    the text came before `text`, already left out (a stream's tail, Tokenizer.tail)."""
    if last is None:
        return encode_checked(model, text, specials), 0
    limit = model.config.n_positions
    if not 1 <= last <= limit:
        raise InputError(f"--last {last}: this model reads 1 to {count(limit, 'token')}")
    tok, earlier = model.tokenizer, before
    before, after = tok.affix if specials else ([], [])
    room = last - len(before) - len(after)
    if room < 1:
        around = " ".join(tok.token_str(i) for i in [*before, *after])
        raise InputError(f"--last {last}: this model's tokenizer puts "
                         f"{count(len(before) + len(after), 'token')} around a text ({around}), "
                         f"so at least {len(before) + len(after) + 1} are needed for one of "
                         "the text's own")
    ids = tok.encode(check_text(text))
    if not ids:
        raise InputError("the text is empty: give at least one character")
    return [*before, *ids[-room:], *after], earlier + max(0, len(ids) - room)


def encode_checked(model: Model, text: str, specials: bool = True) -> list[int]:
    """The text's ids, within the model's context; the errors say how long it was.
    `specials`: with the tokens the folder's tokenizer puts around a text (its <bos>); a
    text rendered by the chat template (--chat) has them written in it already."""
    limit = model.config.n_positions
    # surely too long (a character is a byte or more): say so at once. The longest token is
    # looked up (the whole vocabulary, 1 ms) only for a text that could be that long.
    most = limit * model.tokenizer.longest_token_bytes if len(text) > limit else limit
    if len(text) > most:
        raise TooLong(f"the text is {len(text):,} characters long; this model reads at "
                         f"most {limit} tokens ({limit} tokens never hold more than "
                         f"{most:,} characters)")
    tok = model.tokenizer
    ids = (tok.text_ids if specials else tok.encode)(check_text(text))
    if not ids:
        raise InputError("the text is empty: give at least one character")
    if len(ids) > limit:
        raise TooLong(
            f"the text is {len(ids)} tokens long; this model reads at most "
            f"{count(limit, 'token')}"
        )
    return ids


def encode_tail(model: Model, text: str, specials: bool = True
                ) -> tuple[list[int], int | None]:
    """generate's prompt: the ids of the text's last n_positions tokens, and how many tokens
    the whole text is when it is longer (None when it fits; 0 when only its end was read, a
    text of many thousand characters: the last `most` characters then hold more than
    n_positions tokens, so the window is theirs, bar a cut through one word of hundreds)."""
    limit = model.config.n_positions
    most = limit * model.tokenizer.longest_token_bytes if len(text) > limit else limit
    tail = len(text) > 2 * most
    tok = model.tokenizer
    ids = (tok.text_ids if specials else tok.encode)(check_text(text[-2 * most:] if tail
                                                                else text))
    if not ids:
        raise InputError("the text is empty: give at least one character")
    if len(ids) <= limit:
        return ids, None
    return ids[-limit:], 0 if tail else len(ids)


def encode_lines(model: Model, texts: list[str], option: str) -> list[list[int]]:
    """Each line's ids (encode_checked); the error names the option and the line."""
    out = []
    for n, text in enumerate(texts, 1):
        try:
            out.append(encode_checked(model, text))
        except InputError as e:
            raise InputError(f"{option} line {n}: {e}") from None
    return out


@dataclass
class Session:
    """A model, a text, its ids and token strings. `steering` (a hook, hooks.add_vector)
    applies to every run of the session, before any other intervention; `interventions`
    (ablations) after it. `changes` says what they change, for views and documents:
    {"steered": {site, scale, norm, ...}, "ablated": [paths]}, empty for a clean run.
    `ahead`: where a clean run's ln_final.out may come from ready-made, (params, config, ids)
    -> [T, d] or None (--each-line's batches, ahead.Ahead.final_norm); None: made here.
    `dropped`: how many tokens of a longer text were left out before `ids` (--last N)."""

    model: Model
    text: str
    ids: list[int]
    tokens: list[str]
    steering: Hook | None = None
    interventions: Hook | None = None
    changes: dict = field(default_factory=dict)
    ahead: Callable | None = None
    specials: bool = True  # the folder's <bos> added (encode_checked); not to a --chat text
    dropped: int = 0

    @classmethod
    def open(cls, text: str, weights: str | Path | None = None,
             model: Model | None = None, steering: Hook | None = None,
             interventions: Hook | None = None, changes: dict | None = None,
             ahead: Callable | None = None, last: int | None = None,
             specials: bool = True, before: int = 0) -> Session:
        """`last`: keep only the text's last `last` tokens (--last N), the folder's <bos>
        kept before them (encode_last); None: the whole text, which must fit the context."""
        model = model if model is not None else load_model(weights)
        ids, dropped = encode_last(model, text, last, specials, before)
        if dropped:  # the part read: the text's own tokens kept, without the <bos>
            before, after = model.tokenizer.affix if specials else ([], [])
            text = model.tokenizer.decode(ids[len(before):len(ids) - len(after)])
        return cls(model, text, ids, [model.tokenizer.token_str(i) for i in ids], steering,
                   interventions, dict(changes or {}), ahead, specials, dropped)

    def reopen(self, text: str) -> Session:
        """Another text, run as this one is: the same model, steering and interventions."""
        return Session.open(text, model=self.model, steering=self.steering,
                            interventions=self.interventions, changes=self.changes,
                            ahead=self.ahead, specials=self.specials)

    @property
    def hooks(self) -> Hook | None:
        """What every run of the session goes through (steering, then interventions); None
        for a clean run. Analyses that run the model on their own pass it on."""
        return self.hooks_for()

    @property
    def T(self) -> int:  # noqa: N802  (the seed page's name)
        return len(self.ids)

    @property
    def config(self):
        return self.model.config

    @property
    def params(self):
        return self.model.params

    # ---------------------------------------------------------------- checked indices

    def layer(self, i: int) -> int:
        return check_index(i, self.config.n_layer, "layer")

    def head(self, i: int) -> int:
        return check_index(i, self.config.n_head, "head")

    def position(self, i: int) -> int:
        return check_index(i, self.T, "position")

    def token_id(self, token: str) -> int:
        """A token given as its text (' toys'), or as an id ('#1234'): session.token_id."""
        return token_id(self.model, token)

    # ---------------------------------------------------------------- running

    def hooks_for(self, ablate: Iterable[str] = (), hooks: Hook | None = None) -> Hook | None:
        ablate = list(ablate)
        if not ablate and self.steering is None and self.interventions is None:
            return hooks
        return Chain(self.steering, self.interventions,
                     ablation(ablate, self.config) if ablate else None, hooks)

    def run(self, hooks: Hook | None = None, ablate: Sequence[str] = ()) -> np.ndarray | None:
        """The logits [T, V], with the hooks called on every value. The paths the hook sets
        name may be any spelling the CLI takes; one that names no value, or that the run never
        reaches, raises PathError (hooks.bind, hooks.check_reached)."""
        bind(hooks, self.config)
        logits = forward(self.params, self.config, np.asarray(self.ids),
                         hooks=self.hooks_for(ablate, hooks))
        check_reached(hooks)
        return logits

    def logits(self) -> np.ndarray:
        """The logits [T, V] of the session's run, the very numbers its trace holds, with
        nothing else recorded; a clean run's made in a batch with the next lines when
        --each-line runs (`ahead`)."""
        if self.hooks is not None:
            return self.run()
        u = None if self.ahead is None else self.ahead(self.params, self.config, self.ids)
        if u is None:
            u = run_to_final_norm(self.params, self.config, self.ids)[0]
        logits = logits_of(self.params, self.config, u)
        if not all_finite(logits):
            return self.run()  # which names the first value that overflowed
        return logits

    def record(self, paths: Iterable[str] | None = None, hooks: Hook | None = None,
               ablate: Sequence[str] = (), stop_after: str | None = None
               ) -> tuple[np.ndarray | None, dict[str, np.ndarray]]:
        """(logits, {path: value}) of every value, or only of `paths`, under the names given
        (any spelling the CLI takes: `blocks.3.hook_resid_post`). A path that names no value,
        or that the run never reaches (after `stop_after`), raises PathError."""
        bind(hooks, self.config)
        names = None if paths is None else {p: hooked_path(p, self.config, "record")
                                            for p in paths}
        stop = None if stop_after is None else hooked_path(stop_after, self.config,
                                                           "stop_after")
        logits, values = record(self.params, self.config, self.ids,
                                None if names is None else set(names.values()),
                                hooks=self.hooks_for(ablate, hooks), stop_after=stop)
        check_reached(hooks, stop)
        if names is None:
            return logits, values
        for p, name in names.items():
            if name not in values:
                why = f" (it stopped after {stop})" if stop else ""
                raise PathError(p, f"record names {name}, which this run never reached{why}")
        return logits, {p: values[name] for p, name in names.items()}

    def trace(self, hooks: Hook | None = None, ablate: Sequence[str] = ()) -> Trace:
        """Every value of the forward pass, after any interventions (the hooks' paths as
        `run` takes them)."""
        bind(hooks, self.config)
        t = run_traced(self.params, self.config, np.asarray(self.ids),
                  hooks=self.hooks_for(ablate, hooks), tokens=self.tokens)
        check_reached(hooks)
        return t


@dataclass
class Run:
    """A session and the trace of its forward pass, made when first asked for (probs, logits
    and sample read the logits alone, Session.logits): what the cards and the page read. Its
    JSON documents are made as a session's are (render.documents.session_document)."""

    session: Session

    @functools.cached_property
    def trace(self) -> Trace:
        return self.session.trace()

    model = property(lambda self: self.session.model)
    text = property(lambda self: self.session.text)
    ids = property(lambda self: self.session.ids)
    tokens = property(lambda self: self.session.tokens)
    changes = property(lambda self: self.session.changes)
    T = property(lambda self: self.session.T)  # noqa: N815  (the seed page's name)


def token_id(model: Model, token: str | int) -> int:
    """A token by its exact text (' toys', with its space), or by its id written `#1234` (an
    int from Python is an id); else InputError. The one rule for --target and --vs: digits
    are text ('5' is the digit, id 21 in the shipped vocabulary), never taken for an id."""
    tok = model.tokenizer
    if isinstance(token, (int, np.integer)) and not isinstance(token, bool):
        return _known_id(int(token), tok.n_rows)
    token = check_utf8(token, "the token")
    if token.startswith("#") and token[1:].isdigit() and token.isascii():
        return _known_id(int(token[1:]), tok.n_rows)
    found = tok.token_to_id(token)
    if found is not None:
        tok.check_rows([found])  # a special token past the model's rows (Gemma 3's image)
    if found is None:
        ids = tok.encode(token)
        hint = (f"; it is {len(ids)} tokens: " + " ".join(repr(tok.token_str(i)) for i in ids)
                if len(ids) > 1 else "")
        number = token.strip()
        if number.isdigit() and number.isascii():  # meant an id? say how to write one
            hint += f"; for the token with id {number}, write #{number}"
        raise InputError(f"{token!r} is not a single token of the vocabulary{hint}")
    return found


def _known_id(i: int, vocab_size: int) -> int:
    if not 0 <= i < vocab_size:
        raise InputError(f"unknown token id {i}: ids run from 0 to {vocab_size - 1}")
    return i
