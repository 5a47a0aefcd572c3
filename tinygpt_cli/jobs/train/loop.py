"""The training loop: batches, forward, backward, clip, AdamW (or SGD); validation,
checkpoints, export.

A checkpoint holds the parameters, the optimiser's moments, the step and the random
generator's state, so a resumed run continues exactly where the killed one stopped.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from ...errors import InputError, RunError, WriteError
from ...escapes import shown
from ...storage.files import append_line, cannot_write, write_atomically
from ...storage.madefor import made_for
from ...storage.safetensors import safetensors_bytes, with_metadata
from ...transformer import ops
from ...transformer.config import Config
from ...transformer.families import Family, family, load_config, save_config
from ...transformer.families.gemma3 import rounded
from ...transformer.folder import load_params, save_params
from ...transformer.model import forward, init_params, loss_and_grads
from ...transformer.optim import OPTIMIZERS, SGD, AdamW, clip_by_global_norm, lr_at
from ...transformer.schema import param_shapes
from ...transformer.tokenizer import Tokenizer, save_tokenizer, train_tokenizer
from ...transformer.windows import TokenStream, encode_stories, eval_windows, random_windows
from ...words import count
from ..corpus import TrainingDataError, read_stories, write_data_record

CHECKPOINT = "checkpoint.npz"
LOG = "log.jsonl"


@dataclass
class Settings:
    steps: int = 2000
    batch_size: int = 32
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup: int = 200
    weight_decay: float = 0.1
    dropout: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    eval_every: int = 200
    checkpoint_every: int = 100
    minutes: float | None = None  # stop early when this much wall time has passed
    ema: float = 0.0  # decay of an exponential moving average of the weights; 0 = off
    snapshots: int = 0  # weights kept along the run in history/, log-spaced in steps
    # the step of the first snapshot: small enough that history sees the loss near chance
    first_snapshot: int = 50
    # "adamw", or "sgd": plain gradient descent, under which `why`'s TracIn scores are the
    # first-order change of each step (under AdamW they ignore its per-weight scaling)
    optimizer: str = "adamw"
    # The step this learning-rate cycle began: 0, or where --resume extended a finished run
    # to more --steps (a new warm-up and cosine decay from there, a "warm restart").
    cycle_start: int = 0
    cycle: int = 0  # how many cycles came before this one (and lines of command.txt)
    # A weights folder whose parameters (and tokenizer) a fresh run starts from instead of
    # random ones: a warm start on more text, with a new optimiser and schedule.
    init: str | None = None
    config: dict = field(default_factory=lambda: asdict(Config()))

    def __post_init__(self) -> None:
        """Every number finite and in a range that can train; a ValueError says which."""
        for name, lo, hi in (("lr", 0.0, 10.0), ("weight_decay", 0.0, 10.0),
                             ("dropout", 0.0, 0.9), ("ema", 0.0, 0.99999),
                             ("min_lr_ratio", 0.0, 1.0), ("grad_clip", 0.0, 1e6)):
            value = getattr(self, name)
            low_ok = value > lo if name == "lr" else value >= lo  # NaN fails both
            if not (isinstance(value, int | float) and math.isfinite(value) and low_ok
                    and value <= hi):
                bound = f"more than {lo:g}" if name == "lr" else f"from {lo:g}"
                raise ValueError(f"--{name.replace('_', '-')} must be a finite number "
                                 f"{bound} to {hi:g}, got {value!r}")
        if self.minutes is not None and not (math.isfinite(self.minutes) and self.minutes > 0):
            raise ValueError(f"--minutes must be a finite number above 0, got {self.minutes!r}")
        if self.seed < 0:
            raise ValueError(f"--seed must be a whole number of 0 or more, got {self.seed}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"--optimizer must be one of {', '.join(OPTIMIZERS)}, got "
                             f"{self.optimizer!r}")


@dataclass
class StepInfo:
    step: int
    steps: int
    loss: float
    lr: float
    tokens_per_s: float
    val_loss: float | None = None


def evaluate(params, config: Config, stream: np.ndarray, batch_size: int = 32,
             on_batch: Callable[[int], None] | None = None) -> float:
    """Mean cross-entropy (nats per token) over the whole stream, in non-overlapping windows.

    on_batch(windows) is called after each batch, for a progress bar.
    """
    x, y = eval_windows(stream, config.n_positions)
    total = 0.0
    for i in range(0, len(x), batch_size):
        logits = forward(params, config, x[i : i + batch_size])
        total += ops.cross_entropy(logits, y[i : i + batch_size]) * y[i : i + batch_size].size
        if on_batch:
            on_batch(len(x[i : i + batch_size]))
    return total / y.size


def windows_in(stream: np.ndarray, config: Config) -> int:
    """How many windows evaluate() runs over a stream (the total of its on_batch calls)."""
    return (len(stream) - 1) // config.n_positions


def ema_decay_at(step: int, decay: float) -> float:
    """The average's decay, ramped up early so it does not remember the random start.

    min(decay, (1 + step) / (10 + step)): after 10 steps the average spans about half the run.
    """
    return min(decay, (1 + step) / (10 + step))


def ema_update(average: dict[str, np.ndarray], params: dict[str, np.ndarray], decay: float):
    """average <- decay * average + (1 - decay) * params, in place."""
    for n, a in average.items():
        a *= decay
        a += (1.0 - decay) * params[n]


def snapshot_steps(steps: int, count: int, first: int = 50) -> list[int]:
    """`count` steps spaced evenly in log(step) from `first` to the last step, which is included.

    The early steps get most snapshots because that is where the model's parts form.
    """
    if count <= 0:
        return []
    if count == 1 or steps <= first:
        return [steps]
    grid = np.geomspace(first, steps, count)
    return sorted({int(round(s)) for s in grid} | {steps})


HISTORY = "history"


def snapshot_name(step: int) -> str:
    return f"step-{step:06d}.safetensors"


def save_snapshot(out: Path, params, config: Config, fam: Family, step: int, lr: float
                  ) -> None:
    """Float16 weights for `tinygpt history`, with the step and learning rate (for TracIn),
    in the family's own file layout (`fam`, the run's), as model.safetensors."""

    tensors = {n: np.ascontiguousarray(a, dtype=np.float16)
               for n, a in fam.params_to_file(params, config).items()}
    meta = {"format": "pt", "step": str(step), "lr": repr(float(lr))}
    if (out / HISTORY).is_symlink():  # a planted link would aim the snapshots anywhere
        raise WriteError(f"cannot write {out / HISTORY}: it is a symbolic link, which tinygpt "
                         "never writes through")
    write_atomically(out / HISTORY / snapshot_name(step), safetensors_bytes(tensors, meta))


def stamp_snapshots(out: Path) -> None:
    """Name in each snapshot's metadata the weights its run ended with (madefor's one rule):
    history/ then reads only the snapshots of the model beside it. Done when a run ends, as
    the folder's model.safetensors changes at every better validation."""

    weights = out / "model.safetensors"
    if not weights.is_file() or not (out / HISTORY).is_dir():
        return
    claim = made_for(weights)
    for path in sorted((out / HISTORY).glob("step-*.safetensors")):
        write_atomically(path, with_metadata(path, claim))


def prepare_tokenizer(out: Path, train_files: list[Path], vocab_size: int,
                      note=lambda s: None) -> Tokenizer:
    """OUT/tokenizer.json if there is one (a tokenizer trained beforehand, or the resumed
    run's), else one trained on the training files, which `note` says. Its size must be the
    model's."""
    path = out / "tokenizer.json"
    if path.is_file():
        try:
            tok = Tokenizer.from_file(path)
        except Exception as e:  # tokenizers raises a bare Exception on malformed files
            raise RunError(f"{path} is not a tokenizers file ({e})") from None
        if tok.vocab_size != vocab_size:
            raise TrainingDataError(
                f"{path} has {tok.vocab_size:,} tokens but --vocab-size is {vocab_size:,}: "
                f"pass --vocab-size {tok.vocab_size}, or remove that file to train a new one")
        return tok
    stories = read_stories(train_files)  # a file that is not text is refused before the note
    note(f"no {path}: training a tokenizer of {vocab_size:,} tokens on the training text "
         "first (tinygpt train-tokenizer makes one beforehand)")
    tok = train_tokenizer(stories, vocab_size)
    if tok.vocab_size != vocab_size:
        raise TrainingDataError(
            f"the training text gives a tokenizer of only {tok.vocab_size:,} tokens, not the "
            f"{vocab_size:,} of --vocab-size: pass --vocab-size {tok.vocab_size} or more text")
    save_tokenizer(tok, path)
    return tok


def adopt_tokenizer(init: Path, out: Path) -> None:
    """A warm start keeps the tokenizer its weights were trained with: the ids mean the same."""
    src = init / "tokenizer.json"
    if not src.is_file():
        raise TrainingDataError(f"--init {init} has no tokenizer.json")
    dst = out / "tokenizer.json"
    if dst.is_file() and dst.read_bytes() == src.read_bytes():
        return
    if dst.exists() or dst.is_symlink():
        raise TrainingDataError(f"{dst} exists and differs from --init's tokenizer: a warm "
                                "start needs the tokenizer its weights were trained with")
    write_atomically(dst, src.read_bytes())


def warm_start_params(init: Path, config: Config) -> dict[str, np.ndarray]:
    """Writable float32 copies of a weights folder's parameters, checked against the sizes."""

    theirs = load_config(init / "config.json")
    sizes = {k: getattr(theirs, k) for k in SIZES}
    asked = {k: getattr(config, k) for k in SIZES}
    if sizes != asked:
        diff = ", ".join(f"{k} {sizes[k]} (asked {asked[k]})" for k in SIZES
                         if sizes[k] != asked[k])
        raise TrainingDataError(f"--init {init} has other sizes: {diff}")
    return {n: np.array(a, dtype=np.float32) for n, a in
            load_params(init / "model.safetensors", config).items()}


def _save_checkpoint(path: Path, params, opt: AdamW | SGD, step: int, rng, best_val: float,
                     settings, elapsed: float, average=None) -> None:
    arrays = {f"p/{n}": a for n, a in params.items()}
    if average is not None:
        arrays.update({f"ema/{n}": a for n, a in average.items()})
    arrays.update({f"opt/{k}": a for k, a in opt.state().items()})
    arrays["step"] = np.asarray(step)
    arrays["best_val"] = np.asarray(best_val)
    arrays["elapsed"] = np.asarray(elapsed)
    arrays["rng"] = np.asarray(json.dumps(rng.bit_generator.state))
    arrays["settings"] = np.asarray(json.dumps(asdict(settings)))
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    write_atomically(path, buf.getvalue())


SIZES = ("n_embd", "n_layer", "n_head", "n_inner", "vocab_size", "n_positions")


def _load_checkpoint(path: Path, params, opt: AdamW | SGD, rng, average=None):
    try:
        return _read_checkpoint(path, params, opt, rng, average)
    except (OSError, ValueError, KeyError) as e:
        raise RunError(f"{path} cannot be read ({type(e).__name__}: {e}); it is damaged: "
                       "start over with --force") from None


def stored_settings(path: Path) -> dict:
    """The settings a checkpoint was written with: the model sizes, the schedule (steps,
    lr, warmup, floor) and the cycle (start and number), checked to be numbers."""
    try:
        with np.load(path) as z:
            stored = json.loads(str(z["settings"]))
            stored["at_step"] = int(z["step"])  # where the checkpoint is
        stored["config"] = {**stored["config"], **{k: int(stored["config"][k]) for k in SIZES}}
        for key in ("steps", "warmup", "cycle_start", "cycle"):
            stored[key] = int(stored.get(key, 0))
        for key in ("lr", "min_lr_ratio"):
            stored[key] = float(stored.get(key, 0.1))
        return stored
    except Exception as e:  # noqa: BLE001 - zip, JSON, key and type errors alike: a broken file
        raise RunError(f"{path} cannot be read ({type(e).__name__}: {e}); it is damaged: "
                       "start over with --force") from None


def cycle_after_resume(stored: dict, at_step: int, steps: int) -> tuple[int, int]:
    """(start, number) of the learning-rate cycle a resumed run trains in.

    A run that had finished (its checkpoint is at its last step) and is asked for more steps
    starts cycle number + 1 at that step; an unfinished run keeps the cycle it was in.
    """
    if at_step >= stored["steps"] and steps > at_step:
        return at_step, stored["cycle"] + 1
    return stored["cycle_start"], stored["cycle"]


def _read_checkpoint(path: Path, params, opt: AdamW | SGD, rng, average=None):
    with np.load(path) as z:
        for n in params:
            params[n][...] = z[f"p/{n}"]
            if average is not None:
                average[n][...] = z[f"ema/{n}"] if f"ema/{n}" in z.files else z[f"p/{n}"]
        opt.load_state({k[4:]: z[k] for k in z.files if k.startswith("opt/")})
        rng.bit_generator.state = json.loads(str(z["rng"]))
        elapsed = float(z["elapsed"]) if "elapsed" in z.files else 0.0
        return int(z["step"]), float(z["best_val"]), elapsed


def _remove_stale_temporaries(out: Path) -> None:
    """A run killed while writing a file leaves write_atomically's `.NAME.*.tmp` behind."""
    for name in (CHECKPOINT, LOG, "model.safetensors", "config.json", "tokenizer.json"):
        for tmp in out.glob(f".{name}.*.tmp"):
            tmp.unlink(missing_ok=True)


def read_log(path: Path, note: Callable[[str], None] = lambda s: None) -> list[dict]:
    """The log's records. A torn last line (a run killed mid-write) is skipped with a note;
    a bad line anywhere else means the folder is damaged (RunError)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise RunError(f"cannot read {path}: {e}") from None
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                raise ValueError("no step")
        except ValueError:
            if i == len(lines) - 1:
                note(f"skipped the torn last line of {path} (the run was stopped mid-write)")
                continue
            raise RunError(f"{path} line {i + 1} is not a log record: the run folder is "
                           "damaged") from None
        records.append(record)
    return records


def _trim_log(path: Path, step: int, note: Callable[[str], None]) -> None:
    """Drop log lines written after the checkpoint we resume from: they will be redone.
    Rewritten atomically, which also replaces a planted link with a file of our own."""
    if not path.is_file():
        return
    keep = [json.dumps(r, allow_nan=False) for r in read_log(path, note) if r["step"] <= step]
    write_atomically(path, ("\n".join(keep) + "\n" if keep else "").encode())


LOCK = ".train.lock"
RESULT = "result.json"
# What a previous run leaves in its folder; a fresh run refuses to clobber them unasked.
RUN_FILES = (LOG, CHECKPOINT, RESULT, "model.safetensors")


@contextlib.contextmanager
def locked(out: Path):
    """Hold OUT/.train.lock for the whole run, so that a second training into the same
    folder is refused (InputError, exit 2: it is the command that conflicts) instead of
    interleaving two logs. The kernel drops the lock when the process dies, even by SIGKILL."""

    path = out / LOCK
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        raise cannot_write(path, e) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(f"another `tinygpt train` is running into {out} (it holds "
                             f"{path}): wait for it to end, or choose another --out") from None
        yield
    finally:
        os.close(fd)


def _start_fresh(out: Path, resume: bool, force: bool) -> None:
    """Refuse to overwrite a previous run unless --force; with it, remove what it left."""
    found = [name for name in RUN_FILES if (out / name).exists()]
    if not found or resume:
        return
    if not force:
        raise InputError(f"{out} holds a previous run ({', '.join(found)}): pass --resume to "
                         "continue it, --force to start over, or choose another --out")
    for name in (LOG, CHECKPOINT, RESULT):
        (out / name).unlink(missing_ok=True)
    if (out / HISTORY).is_dir() and not (out / HISTORY).is_symlink():
        for old in (out / HISTORY).glob("step-*.safetensors"):
            old.unlink()


COMMAND = "command.txt"


def _record_command(path: Path, command: str, *, fresh: bool, extends: int,
                    reschedules: bool = False) -> None:
    """command.txt holds the run's recipe, one command per cycle: a fresh run writes its
    own; an extension starting cycle `extends` keeps the lines of the cycles before it (not
    an earlier try of the same extension) and adds its own; a plain --resume changes nothing
    (it only continues)."""
    if fresh or path.is_symlink() or not path.is_file():  # a planted link is replaced, unread
        write_atomically(path, (command + "\n").encode("utf-8"))
    elif extends:
        before = path.read_text(encoding="utf-8", errors="replace").splitlines()[:extends]
        write_atomically(path, "".join(line + "\n" for line in [*before, command])
                         .encode("utf-8"))
    elif reschedules:  # a resume with other --steps changed the schedule from here on
        before = path.read_text(encoding="utf-8", errors="replace").splitlines()
        write_atomically(path, "".join(line + "\n" for line in [*before, command])
                         .encode("utf-8"))


def final_lr(stored: dict) -> float:
    """The learning rate of a stored run's last step."""
    total = stored["steps"] - stored["cycle_start"]
    return lr_at(total - 1, stored["lr"], stored["warmup"], total, stored["min_lr_ratio"])


def machine() -> dict:
    """Where the run ran, for the model card: cores and the BLAS thread settings."""
    env = {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                      "MKL_NUM_THREADS") if k in os.environ}
    return {"cpu_count": os.cpu_count(), "blas_threads": env, "numpy": np.__version__}


def _strict(value):
    """JSON has no NaN or Infinity: a missing number is null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    return value


def train(
    train_files: list[Path],
    val_files: list[Path],
    out: Path,
    settings: Settings,
    *,
    resume: bool = False,
    force: bool = False,
    command: str | None = None,
    on_step: Callable[[StepInfo], None] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> dict:
    """Train, writing checkpoints, a JSONL log, result.json and the best weights folder into
    `out` (and `command` into command.txt), holding a lock on the folder throughout.

    A folder with a previous run is refused unless `resume` (continue it) or `force` (start
    over). A loss that stops being finite ends the run with RunError; the last checkpoint
    stays as it was.
    """
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise cannot_write(out, e) from None
    with locked(out):
        return _train(train_files, val_files, out, settings, resume=resume, force=force,
                      command=command, on_step=on_step, on_note=on_note)


def _train(train_files, val_files, out: Path, settings: Settings, *, resume, force, command,
           on_step, on_note) -> dict:
    note = on_note or (lambda s: None)
    _start_fresh(out, resume, force)
    if settings.snapshots and (out / HISTORY).is_symlink():
        raise WriteError(f"cannot write {out / HISTORY}: it is a symbolic link, which tinygpt "
                         "never writes through")
    _remove_stale_temporaries(out)
    ckpt, log_path = out / CHECKPOINT, out / LOG
    config = Config(**settings.config)
    stored = stored_settings(ckpt) if resume and ckpt.is_file() else None
    if stored is not None:
        settings = _resumed_settings(ckpt, stored, config, settings)
    if settings.init is not None and stored is None:
        adopt_tokenizer(Path(settings.init), out)
    tokenizer, config, train_data, val_data = _training_data(out, train_files, val_files,
                                                             config, note)
    rng = np.random.default_rng(settings.seed)
    params = init_params(config, rng)
    if settings.init is not None:
        params = warm_start_params(Path(settings.init), config)
    # With an average on, it is what is validated, exported and snapshotted: the weights
    # that training would ship at that step.
    average = {n: p.copy() for n, p in params.items()} if settings.ema > 0 else None
    # the family of the model trained, looked up once: every export and snapshot writes its
    # file layout
    run = _Run(out, settings, config, family(config.model_type), tokenizer, train_data,
               val_data, params,
               OPTIMIZERS[settings.optimizer](params, weight_decay=settings.weight_decay),
               rng, average)
    keep_at = set(snapshot_steps(settings.steps, settings.snapshots, settings.first_snapshot))
    if 0 < len(keep_at) < settings.snapshots:
        note(f"--snapshots {settings.snapshots} keeps {len(keep_at)}: snapshots are log-spaced "
             f"in steps from step {settings.first_snapshot} to the last, and "
             f"{count(settings.steps, 'step')} have room for only {len(keep_at)}")
    start, elapsed_before = 0, 0.0
    if stored is not None:
        start, run.best_val, elapsed_before = _load_checkpoint(ckpt, params, run.opt, rng,
                                                               average)
        run.saved = start
        _trim_log(log_path, start, note)
        note(f"resumed from {ckpt} at step {start}")
        if settings.cycle > stored["cycle"]:
            note(f"extending the run from step {start} to {settings.steps}: a new warm-up "
                 f"of {settings.warmup} steps to --lr {settings.lr:g}, then cosine decay")
            if settings.snapshots:  # the weights the new cycle starts from
                save_snapshot(out, run.shipped, config, run.family, start, final_lr(stored))
        keep_at = {s for s in keep_at if s > start}
    elif log_path.exists() or log_path.is_symlink():
        log_path.unlink()  # --resume without a checkpoint: the run never got far enough
    if command is not None:
        _record_command(out / COMMAND, command, fresh=start == 0,
                        extends=settings.cycle if settings.cycle_start == start > 0 else 0,
                        reschedules=stored is not None and settings.steps != stored["steps"]
                        and settings.cycle == stored["cycle"])
    step = _loop(run, start, elapsed_before, keep_at, on_step, note)
    if val_data is None:
        export(out, run.shipped, config, run.family, tokenizer)
    stamp_snapshots(out)
    result = {
        "steps": step + 1 if settings.steps > start else start,
        "best_val_loss": run.best_val,
        "val_bytes_per_token": val_data.bytes_per_token if val_data else None,
        "train_tokens": len(train_data.ids),
    }
    document = {**_strict(result), "machine": machine()}
    write_atomically(out / RESULT,
                     (json.dumps(document, indent=2, allow_nan=False) + "\n").encode())
    return result


def _resumed_settings(ckpt: Path, stored: dict, config: Config, settings: Settings
                      ) -> Settings:
    """The settings of a resumed run: refused with other sizes, or an extension by no more
    than a warm-up; more --steps than the run had starts a new cycle."""
    sizes = {k: stored["config"][k] for k in SIZES}
    asked = {k: getattr(config, k) for k in SIZES}
    if sizes != asked:
        diff = ", ".join(f"{k} {sizes[k]} (asked {asked[k]})" for k in SIZES
                         if sizes[k] != asked[k])
        raise TrainingDataError(f"--resume: {ckpt} was trained with other sizes: {diff}; "
                                "resume with the same sizes, or --force to start over")
    before = stored.get("optimizer", "adamw")  # checkpoints from before the choice: AdamW
    if before != settings.optimizer:
        raise InputError(f"--resume: {ckpt} was trained with --optimizer {before}, not "
                         f"{settings.optimizer}; resume with it, or --force to start over")
    at = stored["at_step"]
    cycle_start, cycle = cycle_after_resume(stored, at, settings.steps)
    if cycle > stored["cycle"] and settings.steps - at <= settings.warmup:
        raise InputError(
            f"--steps {settings.steps} extends the run by {settings.steps - at} steps, no "
            f"more than its --warmup of {settings.warmup}: the learning rate would only "
            "rise. Ask for more steps or a shorter --warmup")
    return replace(settings, cycle_start=cycle_start, cycle=cycle)


def _training_data(out: Path, train_files, val_files, config: Config, note):
    """(tokenizer, config with its separator ids, training stream, validation stream or
    None), each stream long enough for a window; the data record written beside them."""
    tokenizer = prepare_tokenizer(out, train_files, config.vocab_size, note)
    config = Config(**{**asdict(config), "bos_token_id": tokenizer.eot_id,
                       "eos_token_id": tokenizer.eot_id})
    train_data = encode_stories(read_stories(train_files), tokenizer)
    write_data_record(out, train_files, val_files)  # read first: the files are text
    val_data: TokenStream | None = (
        encode_stories(read_stories(val_files), tokenizer) if val_files else None
    )
    need = config.n_positions + 2  # one window of inputs and targets, and room to move it
    for name, stream in (("training", train_data), ("validation", val_data)):
        if stream is not None and len(stream.ids) < need:
            raise TrainingDataError(
                f"the {name} text is {len(stream.ids)} tokens; it must be at least {need} "
                f"for windows of {config.n_positions}")
    note(f"training tokens: {len(train_data.ids):,}"
         + (f"; validation tokens: {len(val_data.ids):,}" if val_data else ""))
    return tokenizer, config, train_data, val_data


@dataclass
class _Run:
    """What the training loop carries from step to step."""

    out: Path
    settings: Settings
    config: Config
    family: Family
    tokenizer: Tokenizer
    train_data: TokenStream
    val_data: TokenStream | None
    params: dict
    opt: AdamW | SGD
    rng: np.random.Generator
    average: dict | None  # the moving average of the parameters (--ema), or None
    best_val: float = math.inf
    saved: int = 0  # the step of the last checkpoint written (0: none)

    @property
    def shipped(self) -> dict:
        """The weights validated, exported and snapshotted: the average, when there is one."""
        return self.average if self.average is not None else self.params

    def diverged(self, what: str, value: float, step: int) -> RunError:
        ckpt = self.out / CHECKPOINT
        kept = f"the checkpoint in {ckpt} is from step {self.saved}" \
            if self.saved else "no checkpoint was written"
        return RunError(f"training diverged at step {step}: the {what} is {value}; {kept}. "
                        f"Try a lower --lr (this run: {self.settings.lr:g})")

    def validate(self, step: int) -> float | None:
        """The validation loss of the shipped weights; a new best is exported."""
        if self.val_data is None:
            return None
        val = evaluate(self.shipped, self.config, self.val_data.ids)
        if not math.isfinite(val):
            raise self.diverged("validation loss", val, step)
        if val < self.best_val:
            self.best_val = val
            export(self.out, self.shipped, self.config, self.family, self.tokenizer)
        return val


def _loop(run: _Run, start: int, elapsed_before: float, keep_at: set[int], on_step,
          note) -> int:
    """The training steps from `start` on (validating, logging, checkpointing and keeping
    snapshots as the settings ask); the last step's index."""
    settings, config, params, opt, rng = run.settings, run.config, run.params, run.opt, run.rng
    ckpt, log_path = run.out / CHECKPOINT, run.out / LOG
    t0 = time.perf_counter()
    tokens_per_step = settings.batch_size * config.n_positions
    step = start
    for step in range(start, settings.steps):
        lr = lr_at(step - settings.cycle_start, settings.lr, settings.warmup,
                   settings.steps - settings.cycle_start, settings.min_lr_ratio)
        x, y = random_windows(run.train_data.ids, settings.batch_size, config.n_positions, rng)
        loss, grads = loss_and_grads(params, config, x, y, dropout=settings.dropout, rng=rng)
        gnorm = clip_by_global_norm(grads, settings.grad_clip)
        if not (math.isfinite(loss) and math.isfinite(gnorm)):
            raise run.diverged("loss" if not math.isfinite(loss) else "gradient norm",
                               loss if not math.isfinite(loss) else gnorm, step + 1)
        opt.step(params, grads, lr)
        if run.average is not None:
            ema_update(run.average, params, ema_decay_at(step, settings.ema))
        done = step + 1
        if done in keep_at:
            save_snapshot(run.out, run.shipped, run.config, run.family, done, lr)
        run_time = time.perf_counter() - t0
        elapsed = elapsed_before + run_time  # wall time over all resumed pieces of the run
        tps = (done - start) * tokens_per_step / max(run_time, 1e-9)
        record = {"step": done, "train_loss": round(loss, 5), "lr": lr,
                  "grad_norm": round(gnorm, 4), "tokens": done * tokens_per_step,
                  "elapsed_s": round(elapsed, 2)}
        val = None
        out_of_time = settings.minutes is not None and run_time > settings.minutes * 60
        if done % settings.eval_every == 0 or done == settings.steps or out_of_time:
            val = run.validate(done)
            if val is not None:
                record["val_loss"] = round(val, 5)
                record["val_bits_per_byte"] = round(
                    val / math.log(2) / run.val_data.bytes_per_token, 5)
        append_line(log_path, json.dumps(record, allow_nan=False))
        if done % settings.checkpoint_every == 0 or done == settings.steps or out_of_time:
            _save_checkpoint(ckpt, params, opt, done, rng, run.best_val, settings, elapsed,
                             run.average)
            run.saved = done
        if on_step:
            on_step(StepInfo(done, settings.steps, loss, lr, tps, val))
        if out_of_time:
            note(f"stopped at step {done}: the {settings.minutes} minute limit was reached")
            break
    return step


def export(out: Path, params, config: Config, fam: Family, tokenizer: Tokenizer) -> None:
    """A complete weights folder: model.safetensors (in `fam`'s layout), config.json,
    tokenizer.json."""
    save_params(params, out / "model.safetensors", config, fam)
    save_config(config, out / "config.json")
    if not (out / "tokenizer.json").is_file():
        save_tokenizer(tokenizer, out / "tokenizer.json")


def write_text(path: Path, text: str) -> None:
    write_atomically(path, text.encode("utf-8"))


def check_training_memory(config: Config, batch_size: int) -> None:
    """Refuse sizes whose training state cannot fit in this machine's memory, before NumPy
    fails halfway with a MemoryError: parameters, gradients and two AdamW moments in float32,
    plus the activations of one batch (about 20 values of d per token and layer, and the
    attention grids)."""
    n = sum(math.prod(s) for s in param_shapes(config).values())
    tokens = batch_size * config.n_positions
    acts = tokens * config.n_layer * (20 * config.n_embd + 2 * config.n_inner
                                      + 3 * config.n_head * config.n_positions)
    need = 4 * (4 * n + acts + 2 * tokens * config.vocab_size)
    try:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    if need > have:
        raise ValueError(f"these sizes give {n:,} parameters; training them with batch "
                         f"{batch_size} needs about {need / 2**30:,.1f} GiB, and this machine "
                         f"has {have / 2**30:,.1f} GiB: choose smaller sizes")


def arch_config(arch: str, **sizes) -> Config:
    """A new model of one family's block (`tinygpt train --arch`): GPT-2's; GPT-Neo's
    (unscaled scores, every other block local, seeing the last n_positions / 2 keys);
    GPT-NeoX's (rotary on a quarter of each head, parallel blocks, exact GELU, untied head, as
    Pythia); Llama's (RMSNorm, rotary, SwiGLU, half as many key/value heads, no biases,
    tied as SmolLM2); Gemma 3's (Llama's with four norms a block, q/k norms, one key/value
    head, GeGLU, five of six blocks local to n_positions / 2 keys with base 10,000, the rest
    1,000,000, the embeddings times sqrt(d) in float32)."""
    n_layer, n_head = sizes.get("n_layer", 4), sizes.get("n_head", 4)
    d_k = sizes.get("n_embd", 128) // n_head if n_head else 0
    full = [(i + 1) % 6 == 0 for i in range(n_layer)]
    knobs = {
        "gpt2": {},
        "neo": dict(model_type="gpt_neo", attn_scale=1.0, qkv_bias=False,
                    windows=tuple((sizes.get("n_positions", 128) // 2) * (i % 2)
                                  for i in range(n_layer))),
        "neox": dict(model_type="gpt_neox", positions="rotary", rotary_dim=max(2, d_k // 4),
                     act="gelu", parallel=True, tied=False),
        "llama": dict(model_type="llama", norm="rms", positions="rotary", mlp="gated",
                      act="silu", n_kv_head=n_head // 2 if n_head % 2 == 0 else 0,
                      qkv_bias=False, out_bias=False, mlp_bias=False),
        "gemma3": dict(model_type="gemma3_text", norm="rms", positions="rotary", mlp="gated",
                       act="gelu_new", n_kv_head=1, qk_norm=True, post_norms=True,
                       attn_scale=float(d_k) ** -0.5 if d_k else 0.0,
                       windows=tuple(0 if f else max(1, sizes.get("n_positions", 128) // 2)
                                     for f in full),
                       rotary_base=1e6, rotary_bases=tuple(1e6 if f else 1e4 for f in full),
                       embed_scale=rounded(sizes.get("n_embd", 128) ** 0.5, "float32"),
                       qkv_bias=False, out_bias=False, mlp_bias=False),
    }
    if arch not in knobs:
        raise ValueError(f"--arch must be one of {', '.join(knobs)}, not {shown(arch)}")
    return Config(**sizes, **knobs[arch])
