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
import shlex
from pathlib import Path

from ..errors import InputError, WeightsError
from .files import sha256
from .locations import SHIPPED

FIELD = "weights_sha256"


def weights_sha256(weights_file: str | Path) -> str:
    """The sha256 of a weights file, hashed once per version of the file in a process."""
    st = os.stat(weights_file)
    return _sha256(str(weights_file), st.st_ino, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _sha256(path: str, ino: int, size: int, mtime: int) -> str:  # noqa: ARG001 - the key

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


# ------------------------------------------------------------------ the hint that remakes one
#
# A missing or stale file made from the weights is refused with the command that makes it for
# these weights. Its default place is beside the weights; when they are the ones installed
# inside the package, that place is the package's own folder, which no hint ever asks anyone to
# write into (a reinstall replaces it, and it is often not the user's to write): the command
# then writes into the working folder, and the hint says how to read it from there.

PACKAGE = Path(__file__).resolve().parent.parent


def inside_package(path: str | Path) -> bool:
    """Whether `path` lies in the installed package's own folder (site-packages/tinygpt_cli:
    its _weights/); a checkout's weights/ sits beside the package, not in it."""
    try:
        return Path(os.path.abspath(path)).resolve().is_relative_to(PACKAGE)
    except (OSError, RuntimeError):
        return False


def weights_option(folder: str | Path) -> str:
    """` --weights NAME` for a hint's command line: nothing for the default model, weights/NAME
    for a model shipped beside it (a name any folder resolves), else the folder's path."""


    folder = Path(folder)
    if folder.resolve() == SHIPPED.resolve():
        return ""
    if folder.resolve().parent == SHIPPED.resolve():
        return f" --weights weights/{folder.name}"
    return f" --weights {shlex.quote(str(folder))}"


def remake_hint(verb: str, command: str, weights_file: str | Path, default: str | Path,
                out: str, name: str, use: str | None) -> str:
    """`verb` (\"train one\") with the command that makes the file at `default` for these
    weights; inside the package, the command writes `name` here with `out` (`--out`) and
    the file is read back with `use` (`--sae`), or, for a file no option reads (`use` None),
    the hint gives the folder a copy of the weights."""

    folder = Path(weights_file).parent
    line = f"tinygpt {command}{weights_option(folder)}"
    if not inside_package(default):
        return f"{verb} with `{line}`"
    if use is not None:
        return (f"{verb} with `{line} {out} {name}`, then give `{use} {name}` (the "
                "installed package's folder is not written)")
    copy = shlex.quote(folder.name)
    return (f"{verb} in a copy of the weights outside the installed package: `cp -r "
            f"{shlex.quote(str(folder))} {copy} && tinygpt {command} --weights {copy}`")
