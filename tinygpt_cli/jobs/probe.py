"""probe's inputs: the --labels lines encoded (a line too long said by its number), each
token's label, and the values at the site (analysis.probe fits the probe to them)."""

from __future__ import annotations

import numpy as np

from ..analysis.probe import Line, site_values, token_labels
from .session import encode_lines


def probe_inputs(model, lines: list[Line], site: str, default: str | None, hooks=None
                 ) -> tuple[list[list[int]], list[list[str | None]], list[np.ndarray]]:
    """(each line's ids, each token's label or None, each line's values of `site`, one row a
    token, of runs through `hooks`, steering, when given) of the --labels lines."""
    ids = encode_lines(model, [line.text for line in lines], "--labels")
    # a <bos> holds no byte of the line, nor Llama 2's `▁` before it
    offsets = [model.tokenizer.text_byte_offsets(line.text, i) for line, i in zip(lines, ids,
                                                                                   strict=True)]
    marks = [token_labels(line, o, default, n)
             for n, (line, o) in enumerate(zip(lines, offsets, strict=True), 1)]
    return ids, marks, [site_values(model.params, model.config, i, site, hooks) for i in ids]
