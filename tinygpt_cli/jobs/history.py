"""Reading the model's own history: the snapshots `train --snapshots` kept in WEIGHTS/history,
checked, in step order, then the folder's final weights (analysis.history follows scores
across them, why weighs its TracIn by them)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

from ..analysis.history import Snapshot
from ..errors import InputError, WeightsError
from ..storage.madefor import check_made_for
from ..storage.safetensors import header_json
from ..transformer.folder import Model, load_params
from .threads import map_on_cores

HISTORY = "history"  # the folder name train.loop writes (train.loop.HISTORY)
_STEP = re.compile(r"step-(\d+)\.safetensors")


def history_folder(model: Model) -> Path:
    """WEIGHTS/history; InputError for a GGUF file, which carries no training snapshots (and
    a history/ beside it would be some other model's)."""
    if model.file is not None:
        raise InputError(f"{model.file} is a GGUF file: it has no training snapshots "
                         "(history/), which this command reads; pass --weights the float "
                         "folder it was made from")
    return model.folder / HISTORY


def _metadata(path: Path) -> dict:
    """The safetensors header's __metadata__, read without loading the tensors (by the one
    header reader, safetensors.header_json: its limits, its one line for a header that is not
    JSON or nested too deep)."""

    if not path.is_file():  # a FIFO or a device would block the read, a folder fail it
        raise WeightsError(f"{path} is not a regular file")
    meta = header_json(path)[0].get("__metadata__")
    return meta if isinstance(meta, dict) else {}


def find_snapshots(folder: Path, weights_file: Path) -> list[Snapshot]:
    """The snapshots in `folder` of the run that ended in `weights_file`, in step order;
    InputError (exit 2) when there are none. Each one's metadata is checked (snapshot_of): a
    broken snapshot is exit 1, one of other weights exit 2, never a row."""
    hint = ("train with --snapshots N (tinygpt train ... --snapshots 8) or pass --weights "
            "a folder whose history/ holds step-NNNNNN.safetensors files")
    if not folder.is_dir():
        if folder.is_symlink() or folder.exists():  # a link loop, a file: a broken folder
            raise WeightsError(f"{folder} is not a folder (a symbolic link that leads nowhere "
                               "or to itself, or a file): the training history cannot be read")
        raise InputError(f"no training history: {folder} does not exist; {hint}")
    found = [snapshot_of(path, weights_file) for path in folder.glob("*.safetensors")]
    if not found:
        raise InputError(f"no training history: {folder} holds no .safetensors files; {hint}")
    steps = [s.step for s in found]
    twice = next((s for s in found if steps.count(s.step) > 1), None)
    if twice is not None:
        raise WeightsError(f"{folder}: two snapshots say they are step {twice.step}")
    return sorted(found, key=lambda s: s.step)


def snapshot_of(path: Path, weights_file: Path) -> Snapshot:
    """A snapshot's step and learning rate from its metadata, checked: made for these weights
    (madefor: a run stamps its snapshots with the weights it ended with), a whole number of
    steps agreeing with its name (step-NNNNNN), and a finite, positive learning rate (TracIn
    weighs the snapshot's gradients by it). WeightsError (exit 1) otherwise, InputError
    (exit 2) for a snapshot of other weights."""

    meta = _metadata(path)
    m = _STEP.fullmatch(path.name)
    step, lr = meta.get("step"), meta.get("lr")
    if step is None and m is None:
        raise WeightsError(f"{path}: no step in its metadata or its name (step-NNNNNN)")
    if step is not None and not (isinstance(step, str) and step.isascii() and step.isdigit()):
        raise WeightsError(f"{path}: its metadata's step {step!r} is not a number (a whole "
                               "number of steps)")
    if step is not None and m is not None and int(step) != int(m.group(1)):
        raise WeightsError(f"{path}: its metadata says step {int(step)} but its name says "
                           f"step {int(m.group(1))}")
    step = int(step) if step is not None else int(m.group(1))
    if lr is not None:
        try:
            lr = float(lr) if isinstance(lr, str) else None
        except ValueError:
            lr = None
        if lr is None or not math.isfinite(lr) or lr <= 0:
            raise WeightsError(f"{path}: its metadata's learning rate {meta.get('lr')!r} is "
                               "not a finite positive number")
    check_made_for(path, meta, weights_file, "the snapshot",
                   "history/ holds the snapshots of the run that ended in the model beside it "
                   "(a run stamps them when it ends: tinygpt train --resume finishes an "
                   "interrupted one)")
    return Snapshot(f"step {step}", step, lr, path)


def timeline(model: Model, snapshots: list[Snapshot]) -> list[Snapshot]:
    """Load every snapshot (on every core: widening float16 and checking each tensor is
    NumPy's work, which threads share; a broken one raises as the first in step order
    would), then add the final weights; a last snapshot that is the final weights rounded to
    float16 is replaced by them (the same step, full precision)."""
    loaded = map_on_cores(lambda s: load_params(s.path, model.config, model.family), snapshots)
    out = [Snapshot(s.label, s.step, s.lr, s.path, params)
           for s, params in zip(snapshots, loaded, strict=True)]
    final = Snapshot("final", None, None, model.weights_file, model.params)
    if out and all(np.array_equal(out[-1].params[n], a.astype(np.float16).astype(np.float32))
                   for n, a in model.params.items()):
        last = out.pop()
        final = Snapshot(f"step {last.step} (final)", last.step, last.lr, final.path,
                         model.params)
    return [*out, final]
