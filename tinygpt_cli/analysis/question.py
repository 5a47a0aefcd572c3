"""What an explanation is about: the prediction at one position of one target token, or of
the target's logit minus another token's (`vs`). lens, dla, ablate, patch and attribute all
ask it the same way, and their results carry it to the renderers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import InputError


@dataclass
class Question:
    tokens: list[str]  # the text's tokens
    position: int  # checked, 0-based
    target: int
    vs: int | None
    token_str: Callable[[int], str]

    @property
    def target_pair(self) -> tuple[int, str]:
        return self.target, self.token_str(self.target)

    @property
    def what(self) -> str:
        """logit['…'] or logit['…'] − logit['…']: the score explained."""
        tok = self.token_str
        return f"logit[{tok(self.target)!r}]" + (
            f" − logit[{tok(self.vs)!r}]" if self.vs is not None else "")

    def token_doc(self, i: int | None) -> dict | None:
        return None if i is None else {"id": i, "token": self.token_str(i)}

    def documents(self) -> dict:
        """The JSON fields every explanation carries: position, target, vs."""
        return {"position": self.position, "target": self.token_doc(self.target),
                "vs": self.token_doc(self.vs)}


def ask(session, logits_row: np.ndarray, position: int, target: str | None,
        vs: str | None) -> Question:
    """The given target and vs tokens (text or id), or the top guess of `logits_row`;
    `position` must be checked already (session.position)."""
    t = session.token_id(target) if target is not None else int(np.argmax(logits_row))
    v = session.token_id(vs) if vs is not None else None
    token_str = session.model.tokenizer.token_str
    if v is not None and v == t:
        raise InputError(f"--vs is the target itself ({token_str(t)!r}): "
                         "the logit difference would be 0")
    return Question(session.tokens, position, t, v, token_str)
