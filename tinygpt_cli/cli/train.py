"""`tinygpt train` and `tinygpt train-tokenizer`."""

from __future__ import annotations

import shlex
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ..escapes import escape_line
from ..transformer.config import MAX_VOCAB, MIN_VOCAB
from .app import app
from .common import InputError

if TYPE_CHECKING:
    from .context import RunContext

VOCAB_SIZE = typer.Option(4096, "--vocab-size", help=f"Tokens in the vocabulary: {MIN_VOCAB} "
                          f"(the 256 bytes and <|endoftext|>) to {MAX_VOCAB:,}.")


@app.command("train-tokenizer")
def train_tokenizer_cmd(
    context: RunContext,
    data: list[Path] = typer.Option(..., "--data", metavar="PATH",
                                    help="Folder of part-*.txt files, or files."),
    out: Path = typer.Option(Path("weights/tokenizer.json"), "--out", help="Where to write it."),
    vocab_size: int = VOCAB_SIZE,
    force: bool = typer.Option(False, "--force", help="Replace OUT if it exists (by default "
                               "OUT is the shipped tokenizer, so it is kept)."),
) -> None:
    """Train the byte-level BPE tokenizer (the held-out last part is left out).

    Example: tinygpt train-tokenizer --data ../shared/data/tinystories --out runs/tokenizer.json
    """
    from ..jobs.corpus import read_stories, split_or_refuse
    from ..transformer.config import check_vocab_size
    from ..transformer.tokenizer import save_tokenizer, train_tokenizer

    check_vocab_size(vocab_size)
    if (out.exists() or out.is_symlink()) and not force:
        raise InputError(f"{out} exists: pass --force to replace it, or --out for another file")
    files, _ = split_or_refuse(data)
    tok = train_tokenizer(read_stories(files), vocab_size)
    save_tokenizer(tok, out)
    sys.stderr.write(f"wrote {escape_line(str(out))}: {tok.vocab_size} tokens from "
                     f"{len(files)} files\n")


@app.command("train")
def train_cmd(
    context: RunContext,
    data: list[Path] = typer.Option(
        ..., "--data", metavar="PATH",
        help="Folder of part-*.txt (the last part is held out), or files."
    ),
    out: Path = typer.Option(..., "--out", help="Folder for checkpoints, the log and the "
                             "weights; one training at a time (a second one exits 2)."),
    val: Path | None = typer.Option(None, "--val", help="Validation file (default: last part)."),
    steps: int = typer.Option(2000, "--steps", min=1, help="Optimiser steps (sets the schedule)."),
    minutes: float | None = typer.Option(None, "--minutes", help="Stop early after this long."),
    batch_size: int = typer.Option(32, "--batch-size", min=1),
    lr: float = typer.Option(2e-3, "--lr", help="Peak learning rate."),
    warmup: int = typer.Option(200, "--warmup", min=0),
    weight_decay: float = typer.Option(0.1, "--weight-decay"),
    optimizer: str = typer.Option("adamw", "--optimizer", help="adamw, or sgd: plain "
                                  "gradient descent (no momentum), under which `why`'s TracIn "
                                  "scores are each step's first-order change (up to the "
                                  "snapshots' spacing)."),
    dropout: float = typer.Option(0.1, "--dropout", min=0.0, max=0.9),
    seed: int = typer.Option(0, "--seed", "-s", min=0),
    ema: float = typer.Option(0.0, "--ema", min=0.0, max=0.99999,
                              help="Validate and export a moving average of the weights "
                                   "with this decay (0.999 spans about 1,000 steps); 0 = off."),
    snapshots: int = typer.Option(0, "--snapshots", min=0,
                                  help="Keep this many float16 weights, log-spaced in steps, "
                                       "in OUT/history/ for `tinygpt history`."),
    first_snapshot: int = typer.Option(50, "--first-snapshot", min=1,
                                       help="The step of the first snapshot; the rest are "
                                            "log-spaced from there to the last step."),
    eval_every: int = typer.Option(200, "--eval-every", min=1),
    checkpoint_every: int = typer.Option(100, "--checkpoint-every", min=1),
    n_embd: int = typer.Option(128, "--n-embd"),
    n_layer: int = typer.Option(4, "--n-layer"),
    n_head: int = typer.Option(4, "--n-head"),
    n_inner: int = typer.Option(512, "--n-inner"),
    vocab_size: int = VOCAB_SIZE,
    n_positions: int = typer.Option(128, "--n-positions"),
    arch: str = typer.Option("gpt2", "--arch", help="The block's family: gpt2, neo (GPT-Neo), "
                             "neox (GPT-NeoX, Pythia), llama (Llama, SmolLM2) or "
                             "gemma3 (Gemma 3)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from OUT/checkpoint.npz. "
                                "A finished run given more --steps starts a new warm-up and "
                                "cosine cycle from its last step."),
    force: bool = typer.Option(False, "--force", help="Start over in an OUT that holds a "
                               "previous run (its log, checkpoint and history are removed)."),
    init: Path | None = typer.Option(None, "--init", help="Start from this weights folder's "
                                     "parameters and tokenizer instead of random ones (a warm "
                                     "start on more text; same sizes)."),
) -> None:
    """Train the model in NumPy; OUT becomes a weights folder holding the best checkpoint.

    Example: tinygpt train --data ../shared/data/tinystories --out runs/a --steps 3000
    Example: tinygpt train --data ../shared/data/tinystories --out runs/b --optimizer sgd --lr 0.3
    """
    from ..jobs.corpus import split_data
    from ..jobs.train.loop import Settings, arch_config, check_training_memory, train
    from ..render.training import TrainingProgress
    from ..transformer.config import check_vocab_size
    from .process import keep_freed_memory

    keep_freed_memory(context)  # the console script's process: training frees and reuses
    if resume and force:
        raise InputError("--resume and --force contradict each other: choose one")
    if resume and init is not None:
        raise InputError(f"--resume continues {out}, --init {init} starts from other weights: "
                         "give one of them")
    check_vocab_size(vocab_size)
    try:
        train_files, val_files = split_data(data, val)
        config = arch_config(arch, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
                             n_inner=n_inner, vocab_size=vocab_size, n_positions=n_positions)
        settings = Settings(steps=steps, batch_size=batch_size, lr=lr, warmup=warmup,
                            weight_decay=weight_decay, dropout=dropout, seed=seed,
                            eval_every=eval_every, checkpoint_every=checkpoint_every,
                            minutes=minutes, ema=ema, snapshots=snapshots,
                            first_snapshot=first_snapshot,
                            optimizer=optimizer,
                            config=asdict(config), init=str(init) if init else None)
        check_training_memory(config, batch_size)
    except ValueError as e:
        raise InputError(str(e)) from None
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} is a file; name a folder")
    with TrainingProgress(train_files, val_files, steps) as shown:
        result = train(train_files, val_files, out, settings, resume=resume, force=force,
                       command="tinygpt " + shlex.join(sys.argv[1:]), on_step=shown.on_step,
                       on_note=shown.on_note)
    shown.finished(result["best_val_loss"], out)


@app.command("model-card")
def model_card_cmd(
    context: RunContext,
    run: Path = typer.Argument(..., help="A weights folder written by `tinygpt train`."),
    data: list[Path] = typer.Option(..., "--data", metavar="PATH",
                                    help="The data it was trained on."),
    force: bool = typer.Option(False, "--force", help="Overwrite the folder's card."),
) -> None:
    """Write MODEL_CARD.md and loss_curve.svg for a trained weights folder.

    Example: tinygpt model-card runs/a --data ../shared/data/tinystories
    """
    from ..jobs.train.card import write_card
    from ..render.output import check_default
    from .common import progress

    if not run.is_dir():
        raise InputError(f"run folder {run} does not exist" if not run.exists()
                         else f"{run} is not a folder")
    for name in ("MODEL_CARD.md", "loss_curve.svg"):
        check_default(run / name, force, None)
    try:
        write_card(run, data, progress=progress, on_note=lambda s: sys.stderr.write(s + "\n"))
    except ValueError as e:  # the data: missing, not UTF-8 (a broken run is a RunError)
        raise InputError(str(e)) from None
    sys.stderr.write(f"wrote {escape_line(str(run / 'MODEL_CARD.md'))} and "
                     f"{escape_line(str(run / 'loss_curve.svg'))}\n")
