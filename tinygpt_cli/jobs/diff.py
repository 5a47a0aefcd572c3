"""diff's second run: session a's ids opened through the second model (analysis.diff
compares the two)."""

from __future__ import annotations

from ..analysis.diff import check_second_model
from .session import Session


def second_session(a, model_b, steering_b=None) -> Session:
    """Session a's ids as they are (the folder's <bos>, a.specials, or a --chat text's own)
    through model_b, steered by `steering_b`; InputError when model_b cannot read them
    (analysis.diff.check_second_model)."""

    check_second_model(a, model_b)
    return Session(model_b, a.text, list(a.ids), list(a.tokens), steering_b,
                   specials=a.specials, dropped=a.dropped)
