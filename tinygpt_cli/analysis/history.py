"""The model's own history: the snapshots training kept, and the scores followed across them.

A weights folder may hold `history/step-NNNNNN.safetensors` (float16 weights with the step
and learning rate in their metadata, written by `train --snapshots`). The timeline is those
snapshots in step order, then the folder's own model.safetensors as the final entry.

The head scores follow TransformerLens' head detector: a pattern P (1 where a head of that
kind would attend) and score = sum(A * P) / sum(A) over the attention grid A. The induction
score is the mean attention on the induction stripe of a repeated random token sequence.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError, WeightsError
from ..storage.madefor import check_made_for
from ..storage.safetensors import header_json
from ..transformer import ops
from ..transformer.config import Config
from ..transformer.families import Family
from ..transformer.folder import Model, load_params
from ..transformer.model import forward, record
from ..transformer.schema import param_shapes, resolve, with_old_keys
from ..transformer.trace import Trace
from ..transformer.wiring import FORWARD
from . import heads as detect
from .heads import uniform_previous_token

# The blocks this analysis implements (wiring.require refuses others by name): the model's own
# passes on each snapshot.
HANDLES = FORWARD

HISTORY = "history"  # the folder name train.loop writes (train.loop.HISTORY)
_STEP = re.compile(r"step-(\d+)\.safetensors")


@dataclass
class Snapshot:
    """One point of the timeline: a snapshot file, or the folder's final weights."""

    label: str  # "step 50", or "final"
    step: int | None  # None for final weights whose step is not recorded
    lr: float | None  # the learning rate at that step (None when unknown)
    path: Path
    params: dict[str, np.ndarray] | None = None


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
    """Load every snapshot, then add the final weights; a last snapshot that is the final
    weights rounded to float16 is replaced by them (the same step, full precision)."""
    out = [Snapshot(s.label, s.step, s.lr, s.path, load_params(s.path, model.config,
                                                                  model.family))
           for s in snapshots]
    final = Snapshot("final", None, None, model.weights_file, model.params)
    if out and all(np.array_equal(out[-1].params[n], a.astype(np.float16).astype(np.float32))
                   for n, a in model.params.items()):
        last = out.pop()
        final = Snapshot(f"step {last.step} (final)", last.step, last.lr, final.path,
                         model.params)
    return [*out, final]


# ------------------------------------------------------------------ loss and next token


def text_loss(logits: np.ndarray, ids: np.ndarray) -> float | None:
    """Mean cross-entropy (nats per token) of each next token of the text; None for 1 token."""
    if len(ids) < 2:
        return None
    return ops.cross_entropy(logits[:-1], np.asarray(ids[1:]))


def next_token(logits: np.ndarray) -> tuple[int, float]:
    """The likeliest token after the text and its chance."""
    p = ops.softmax(np.asarray(logits[-1], dtype=np.float64))
    top = int(np.argmax(p))
    return top, float(p[top])


def summary(value: np.ndarray) -> dict:
    """norm (Frobenius), mean and std of a value."""
    a = np.asarray(value, dtype=np.float64)
    finite = a[np.isfinite(a)]  # masked attention scores are -inf
    return {"norm": float(np.linalg.norm(finite)), "mean": float(finite.mean()),
            "std": float(finite.std())}


# ------------------------------------------------------------------ head scores


def induction_length(config: Config) -> int:
    """The repeated sequence's length: 50 tokens as TransformerLens' examples, or what fits."""
    return min(50, (config.n_positions - 1) // 2)


def head_scores(params, config: Config, ids: np.ndarray, seed: int = 0,
                batch: int = 4, hooks=None) -> dict[str, np.ndarray]:
    """previous_token [L, H] on the text, induction [L, H] on repeated random tokens, with
    the detectors of `heads` (the same definitions as `tinygpt heads`)."""

    names = [f"layers.{i}.weights" for i in range(config.n_layer)]
    _, values = record(params, config, np.asarray(ids), names, hooks=hooks)
    grids = np.stack([values[n] for n in names])  # [L, H, T, T]
    prev = detect.detection_score(grids, detect.previous_token_pattern(len(ids)))
    induction = detect.induction_test(params, config, induction_length(config), batch, seed,
                                      config.bos_token_id, hooks).score
    return {"previous_token": prev, "induction": induction}


# ------------------------------------------------------------------ over the whole timeline


def snapshot_rows(snapshots: list[Snapshot], **columns) -> list[dict]:
    """One row per snapshot: its label, step and learning rate, and the given columns."""
    return [{"label": s.label, "step": s.step, "lr": s.lr,
             **{k: v[i] for k, v in columns.items()}} for i, s in enumerate(snapshots)]


def loss_over_training(snapshots: list[Snapshot], config: Config, ids,
                       token_str, hooks=None) -> list[dict]:
    """Per snapshot: the loss on the text and the likeliest next token with its chance."""

    ids = np.asarray(ids)
    logits = [forward(s.params, config, ids, hooks=hooks) for s in snapshots]
    losses = [text_loss(z, ids) for z in logits]
    tops = [next_token(z) for z in logits]
    return snapshot_rows(snapshots, loss=losses, top_id=[t[0] for t in tops],
                         top_token=[token_str(t[0]) for t in tops],
                         **with_old_keys({"top_chance": [t[1] for t in tops]}))


@dataclass
class ValueHistory:
    """One value or parameter at every snapshot: `shown` is its canonical name, `rows` its
    norm, mean and std per snapshot; `grid`: it is an attention grid (shown row by row)."""

    shown: str
    values: list[np.ndarray]
    rows: list[dict]
    grid: bool


def value_over_training(snapshots: list[Snapshot], config: Config, fam: Family, ids, tokens,
                        path: str, hooks=None) -> ValueHistory:
    """A parameter, by its canonical name (layers.0.attn.W_QKV) or its family's file name
    (h.0.attn.c_attn.weight), read from each snapshot, or a value of the forward pass
    (layers.0.heads.1.weights, logits[-1]) on the text under each snapshot."""

    param = path if path in param_shapes(config) else fam.canonical_name(path)
    if param is not None:
        values = [s.params[param] for s in snapshots]
        shown = path.removeprefix(fam.PREFIX)
    else:
        canonical, rows = resolve(path, config)
        shown = canonical + "".join(f"[{i}]" for i in rows)
        values = [Trace(record(s.params, config, ids, hooks=hooks)[1], config,
                        tokens=tokens).get(path) for s in snapshots]
    rows = snapshot_rows(snapshots, **{k: [summary(v)[k] for v in values]
                                       for k in ("norm", "mean", "std")})
    return ValueHistory(shown, values, rows, param is None and shown.endswith("weights"))


def heads_over_training(snapshots: list[Snapshot], config: Config, ids,
                        progress=None, hooks=None) -> dict:
    """previous_token and induction [S, L, H]: head_scores at every snapshot (`hooks`, the
    steering, in every run); previous_token_chance: the score of evenly spread attention on
    this text, where an untrained head starts."""
    scores = []
    for s in snapshots:
        scores.append(head_scores(s.params, config, ids, hooks=hooks))
        if progress:
            progress(1)
    return {**{k: np.stack([s[k] for s in scores]) for k in ("previous_token", "induction")},
            "previous_token_chance": uniform_previous_token(len(ids))}


def uniform_loss(vocab_size: int) -> float:
    """The loss (nats per token) of a model that gives every token the same chance: ln V,
    where training starts from."""
    return math.log(vocab_size)
