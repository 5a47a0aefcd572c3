"""generate's output as the tokens come: plain text for a person or a pipe, or one JSON
object a line (the prompt, each token, the end). `steps` is generate.generate's iterator."""

from __future__ import annotations

import numpy as np
from rich.text import Text

from ..escapes import escape_line
from ..words import count
from . import jsonout
from .output import stderr
from .text import show_text


def _stopped(new: list[int], ends: tuple[int, ...], no_stop: bool) -> bool:
    return bool(new) and new[-1] in ends and not no_stop


def ablated_line(ablated: list[str]) -> str:
    return "ablated (set to zero) at every step: " + escape_line(", ".join(ablated))


def write_json(tok, prompt: str, ids: list[int], steps, seed: int, no_stop: bool,
               ablated: list[str] = ()) -> list[int]:
    # the context once, with what the run changed; each token line then carries only its token
    changed = {"ablated": list(ablated)} if ablated else {}
    jsonout.emit(jsonout.document(None, np.asarray(ids, dtype=np.int64), ids,
                                  [tok.token_str(t) for t in ids], event="prompt", text=prompt,
                                  **changed))
    new: list[int] = []
    for i, step in enumerate(steps):
        new.append(step.id)
        jsonout.emit(jsonout.document(None, np.int64(step.id), event="token", step=i,
                                      id=step.id, token=tok.token_str(step.id),
                                      chance=step.chance))
    jsonout.emit(summary(tok, prompt, ids, new, seed, no_stop))
    return new


def summary(tok, prompt: str, ids: list[int], new: list[int], seed: int, no_stop: bool
            ) -> dict:
    """A generation's last JSON line (event "end"): the whole text, every id and token, how
    many are new, the seed and what stopped it; also what the Python API's generate returns."""
    stopped = _stopped(new, tok.stop_ids, no_stop)
    kept = new[:-1] if stopped else new
    # "endoftext": one of the model's end tokens, named by stop_token
    end = {"stop": "endoftext", "stop_token": tok.token_str(new[-1])} if stopped else \
        {"stop": "max_new_tokens"}
    return jsonout.document(None, prompt + tok.continuation(kept), ids + new,
                            [tok.token_str(i) for i in ids + new], event="end",
                            new_tokens=len(new), seed=seed, **end)


def say_window(whole: int | None, limit: int) -> None:
    """generate's note on stderr for a prompt longer than the model reads (`whole` tokens;
    0: longer than was counted; None: it fits, nothing to say)."""

    if whole is None:
        return
    size = f"{whole:,} tokens" if whole else "many thousand tokens"
    stderr().print(f"note: the prompt is {size}; this model reads at most {limit}, so it "
                   f"continues from the prompt's last {limit} tokens", style="dim",
                   soft_wrap=True)


def say_stopped(new: list[int], tok, no_stop: bool, max_new_tokens: int,
                ablated: list[str] = ()) -> None:
    """generate's closing notes on stderr: how many new tokens, and what stopped them (the
    end token it met, by name); then what --ablate zeroed (no view header to say it in:
    said last, as the steering line is)."""

    why = (escape_line(tok.token_str(new[-1])) if _stopped(new, tok.stop_ids, no_stop)
           else f"--max-new-tokens {max_new_tokens}")
    stderr().print(f"({count(len(new), 'new token')}; stopped at {why})", style="dim")
    if ablated:
        stderr().print(ablated_line(ablated), style="bold yellow", soft_wrap=True)


class WordWrap:
    """A terminal's stream of text pieces, broken into lines at spaces, never inside a word
    (the terminal itself would cut 'sleepy b|ear' at its edge): a word is written once it is
    whole (the next space or line break ends it), on the next line when it would not fit."""

    def __init__(self, width: int, column: int = 0) -> None:
        self.width, self.column, self.word = width, column, ""

    def feed(self, piece: str) -> str:
        """What to write now for `piece`."""
        out = []
        for ch in piece:
            if ch == "\n":
                out.append(self._placed() + ch)
                self.column = 0
            elif ch == " ":
                out.append(self._placed() + ch)
                self.column += 1
            else:
                self.word += ch
        return "".join(out)

    def _placed(self) -> str:
        word, self.word = self.word, ""
        if self.column + len(word) >= self.width and self.column > 0:  # the last column free
            self.column = len(word)
            return "\n" + word
        self.column += len(word)
        return word

    def end(self) -> str:
        return self._placed()


def write_text(out, tok, prompt: str, steps, no_stop: bool) -> list[int]:
    """The prompt, then each new piece of text as soon as it is whole (on a terminal, each
    word: WordWrap); the new ids."""
    ends = () if no_stop else tok.stop_ids
    wrap = None
    if out.is_terminal:
        # soft_wrap: the text goes out as it is, broken only between words (WordWrap).
        shown_prompt = show_text(prompt)
        out.print(Text(shown_prompt, style="bold"), end="", soft_wrap=True)
        wrap = WordWrap(out.width, len(shown_prompt.rsplit("\n", 1)[-1]) % out.width)
    else:
        out.file.write(show_text(prompt))  # a pipe gets the text byte for byte
    new: list[int] = []
    shown = ""
    for step in steps:
        new.append(step.id)
        if step.id in ends:
            break
        # Decode everything so far: a character split over two tokens appears whole.
        full = tok.continuation(new)
        if full.endswith("\ufffd"):
            continue
        piece, shown = full[len(shown):], full
        piece = show_text(piece)  # plain text, written as is: tabs stay tabs
        out.file.write(wrap.feed(piece) if wrap else piece)
        out.file.flush()
    rest = show_text(tok.continuation([t for t in new if t not in ends])[len(shown):])
    out.file.write((wrap.feed(rest) + wrap.end() if wrap else rest) + "\n")
    out.file.flush()
    return new
