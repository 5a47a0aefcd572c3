"""The one rule for every file made from a model's weights (the mean statistics, an SAE, a
tuned lens, a steering vector; a transcoder or whatever later analyses add calls the same):
its metadata's `weights_sha256` names the model.safetensors it was made for, and a file made
for other weights is refused, even when its sizes fit (a dictionary of other weights reads
the residual stream in another basis: its numbers would be wrong without a word).

    meta = {**made_for(model.weights_file), ...}          when writing the file
    check_made_for(path, meta, model.weights_file, ...)   when reading it
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from .errors import InputError, WeightsError

FIELD = "weights_sha256"


def weights_sha256(weights_file: str | Path) -> str:
    """The sha256 of a weights file, hashed once per version of the file in a process."""
    st = os.stat(weights_file)
    return _sha256(str(weights_file), st.st_ino, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _sha256(path: str, ino: int, size: int, mtime: int) -> str:  # noqa: ARG001 - the key
    from .files import sha256

    return sha256(path)


def made_for(weights_file: str | Path) -> dict[str, str]:
    """The metadata that says which weights a file was made from."""
    return {FIELD: weights_sha256(weights_file)}


def check_made_for(path: str | Path, meta: dict, weights_file: str | Path, what: str,
                   hint: str, required: bool = True) -> None:
    """Refuse `path` (`what`: "the SAE", "the tuned lens"...) unless its metadata names
    these weights. A file that makes no claim is broken (exit 1) when `required` (tinygpt
    writes the field into every such file), else accepted (a .npy vector, which has no
    metadata); a claim of other weights is exit 2: the wrong file for this model."""
    got = meta.get(FIELD)
    if got is None:
        if required:
            raise WeightsError(f"{path}: its metadata does not say which weights {what} was "
                               f"made for ({FIELD}); {hint}")
        return
    want = weights_sha256(weights_file)
    if got != want:
        shown = got[:16] + "..." if isinstance(got, str) and len(got) > 16 else repr(got)
        raise InputError(f"{path}: {what} was made for other weights ({FIELD} {shown}, this "
                         f"model's is {want[:16]}...); {hint}")
