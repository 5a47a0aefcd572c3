"""The two kinds of failure the tool reports, shared by the core and the command line.

InputError: bad usage or input; the message says what was wrong and what is allowed (exit 2).
WeightsError lives in `weights.py`: a weights folder that cannot be used (exit 1).
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad usage or input: the message says what was wrong and what is allowed. Exit 2."""
