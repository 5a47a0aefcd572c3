"""What every inspection command shares: options, reading the text, running the model."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ..errors import InputError, check_index
from ..render.output import (
    at_least,
    check_out,
    check_save,
    checked_arrays,
    checked_save,
    present,
    save_figure,
    set_changed,
    show_view,
    stderr,
    stdout,
    wide,
)
from ..render.progress import progress, progress_report
from .streams import read_text

if TYPE_CHECKING:
    from ..jobs.session import Run, Session
    from ..transformer.folder import Model
    from .context import RunContext

# This module is imported to register every command, including for `tinygpt --help`: it
# imports only typer here, and NumPy, Rich and the model inside the functions that use them.

__all__ = ["FORCE", "InputError", "QUIET", "SAVE", "at_least", "bar", "check_index",
           "check_out", "check_save", "encode_checked", "encode_text", "figures", "load",
           "open_folder", "open_session", "present", "progress", "progress_report",
           "read_text", "run", "save_figure", "show_view", "stderr", "stdout", "wide"]


def encode_checked(model, text: str, specials: bool = True) -> list[int]:
    from ..jobs.session import encode_checked as encode

    return encode(model, text, specials)


# Options, declared once so every command spells and documents them the same way.
TEXT = typer.Argument(None, help="The text; '-' or nothing reads it from stdin. "
                      "--each-line FILE runs the command once per line of FILE ('-': stdin); "
                      "dla, lens, ablate and attribute add --mean for one JSON document of "
                      "their numbers averaged over the lines; "
                      "--chat MESSAGE reads the message in the model's chat template.",
                      show_default=False)
# The name is passed on as typed (parser=str), so that an empty --weights "" stays empty and
# is refused by load_model instead of becoming Path("") == Path("."), the current folder.
WEIGHTS = typer.Option(None, "--weights", help="Weights folder, or a hub id ORG/NAME[@REV] "
                       "(default: $TINYGPT_WEIGHTS, then the shipped model).",
                       show_default=False, parser=str,
                       metavar="DIR")
JSON = typer.Option(False, "--json", help="Print one JSON document on stdout.")
FULL = typer.Option(False, "--full", help="Show every column instead of the first and last.")
LAYER = typer.Option(0, "--layer", "-l", help="Block index; negative counts from the end.")
HEAD = typer.Option(0, "--head", "-H", help="Head index; negative counts from the end.")
POSITION = typer.Option(-1, "--position", "-p", help="Token position; -1 is the last.")
# Short flags mean one thing everywhere (cli/options.py holds the table): -n is always "how
# many" (rows, neurons, new tokens), -k is always --top-k of sampling.
TOP = typer.Option(10, "--top", "-n", min=1, help="How many to list (capped at how many "
                   "there are).")
ABLATE = typer.Option(None, "--ablate", metavar="PATH", help="Zero this value first and show "
                      "the changed run (repeatable): a head's output layers.1.heads.2.out "
                      "(or L1H2), layers.0.mlp_out, layers.0.attn_out.", show_default=False)
# probs, sample and generate share these defaults: the model's own chances, untrimmed.
TEMPERATURE = typer.Option(1.0, "--temperature", "-t", min=0.0,
                           help="Divide the scores by this before softmax; 0 is greedy "
                           "(always the likeliest token).")

SEED = typer.Option(1, "--seed", "-s", help="Seed of the random generator (same seed, same pick).")
# sample and generate agree: a new seed unless one is given, shown so it can be given again
PICK_SEED = typer.Option(None, "--seed", "-s", show_default=False,
                         help="Seed for the random pick; the same seed gives the same token. "
                         "Default: a new one, shown with the token (as generate does).")
TOP_K = typer.Option(0, "--top-k", "-k", min=0,
                     help="Keep only the k likeliest tokens (0: all).")
TOP_P = typer.Option(1.0, "--top-p", "-P", min=0.0, max=1.0,
                     help="Keep the likeliest tokens whose chances add up to p (1: all).")

# What a dictionary (an SAE, a transcoder) is trained on, and from which seed.
TRAINING_TEXT = typer.Option(None, "--data", help="Stories: a folder of part-*.txt, all but "
                             "the last used (default: the project's data).", show_default=False)
TRAINING_SEED = typer.Option(0, "--seed", "-s", help="Seed of the initialisation and the "
                             "batches.")

# Where a prediction is scored ("why this token"): which token, and against which.
TARGET = typer.Option(None, "--target", help="The token whose score is explained: its exact "
                      "text (' toys', with its space; '5' is the digit), or #ID for an id "
                      "(#1234). Default: the model's top guess.", show_default=False)
# A --data that is not the text the weights folder records is refused without this.
ANY_DATA = typer.Option(False, "--any-data", help="Use --data even where it is not the text "
                        "WEIGHTS/data.json records.")
VS = typer.Option(None, "--vs", help="Explain logit[target] - logit[vs] instead of the target's "
                  "logit alone (a token's exact text, or #ID for an id).", show_default=False)

# --save, --force, --quiet: every command that draws something takes all three
# (render/output.py writes the pictures; --quiet is held in the command's run context).

SAVE = typer.Option(None, "--save", callback=checked_save, show_default=False, metavar="FILE",
                    help="Also write the picture to FILE: .svg (a vector drawing), .html "
                    "(one self-contained web page) or .png (an image; the png extra), by the "
                    "extension. With --each-line, one file per line, numbered before the "
                    "extension: x.svg gives x-001.svg, x-002.svg ...")
FORCE = typer.Option(False, "--force", help="Let --save overwrite an existing file.")
# trace's --save writes numbers, not a picture (render/output.py save_arrays)
SAVE_ARRAYS = typer.Option(None, "--save", callback=checked_arrays, show_default=False,
                           metavar="FILE", help="Also write the value to FILE.npy, or the "
                           "values to FILE.safetensors under their trace names (without PATH: "
                           "every value of the pass, per-head slices left out; PATH a group, "
                           "e.g. layers.0: the values under it). With --each-line, one file "
                           "per line: x-001.npy, x-002.npy ...")
FORCE_FILE = typer.Option(False, "--force", help="Overwrite a file that exists, a shipped one too.")
QUIET = typer.Option(False, "--quiet", "-q",
                     help="Print no terminal view (with --save: only write the file).")


def bar():
    """bar(total, description): the progress bars the analyses' slow steps ask for, on
    stderr (with --json too: stdout keeps the one document); where stderr is not a
    terminal, a line once a step has run a second, then every 5 s (steps under a second
    print nothing)."""
    from ..escapes import escape_line

    return lambda total, description: progress(total, escape_line(description),
                                               pipe_every=5)


def engine(context: RunContext):
    """Where the corpus-wide work runs (a context manager): this machine, or the Dask cluster
    --cluster or $TINYGPT_CLUSTER names (tinygpt_cli.jobs.cluster)."""
    from ..jobs import cluster

    address = cluster.chosen(context.cluster)
    return cluster.engine(address, wait=cluster.wait_chosen(context.cluster_wait)
                          if address is not None else cluster.WAIT_SECONDS)


def figures(module: str = "analysis_pictures"):
    """A picture module of render/ (figure, pictures, analysis_pictures), imported only when
    --save asks for a picture (present's figure= calls it)."""
    import importlib

    return importlib.import_module(f"..render.{module}", __package__)


def load(context: RunContext, weights: Path | None) -> Model:
    """The weights folder's Model (folder.Model): the command's --weights, else the one
    given before the command (`tinygpt --weights DIR COMMAND`); refused by name (exit 2)
    when its blocks have a knob value or step the command's analysis does not implement
    (wiring.require, with what the analysis declares: handles_of)."""
    from ..transformer.folder import load_model
    from ..transformer.wiring import require
    from .process import keep_freed_memory

    keep_freed_memory(context)  # the console script's process only: a traced pass keeps every value
    model = load_model(weights if weights is not None else context.weights,
                       opened=context.opened)
    require(model.config, context.command or "this command", handles_of(context.command))
    return model


def handles_of(command: str | None):
    """What the analysis behind `command` declares it handles (wiring.Handles: the HANDLES of
    its module, named in commands.ANALYSES); a command not named there runs only the model's
    own passes (wiring.FORWARD)."""
    import importlib

    from ..surfaces.commands import ANALYSES
    from ..transformer.wiring import FORWARD

    module = ANALYSES.get(command or "")
    if module is None:
        return FORWARD
    return importlib.import_module(f"tinygpt_cli.{module}").HANDLES


def open_folder(context: RunContext, weights: Path | None):
    """The weights folder's sizes and tokenizer only (folder.Folder), for text <-> ids."""
    from ..transformer.folder import open_folder as open_

    return open_(weights if weights is not None else context.weights, opened=context.opened)


def open_session(context: RunContext, weights: Path | None, text: str | None, *, model=None,
                 ablate: list[str] | None = None) -> Session:
    """The one way a command opens its session: the weights folder's model (or `model`, for
    a second text), the text (read_text), steered by the command's --steer options and with
    the values named by --ablate zeroed, in every run of the session. A terminal view of a
    changed run starts with a line saying what was changed (set_changed); under --each-line
    a clean run's pass comes from the batch made ahead (context.ahead)."""
    from ..jobs.session import Session
    from .steering import steering

    model = model if model is not None else load(context, weights)
    hook, steered = steering(context, model)
    ahead = context.ahead.final_norm if context.ahead is not None else None
    with offering_last(context):
        whole, before = read_whole(context, text, model)
        s = Session.open(whole, model=model, steering=hook, ahead=ahead, last=context.last,
                         specials=not context.chat, before=before)
    if s.dropped:
        cut(context, s.dropped)
    ablated = []
    if ablate:  # the analyses load only for a changed run: inspection stays light
        from ..analysis.ablate import zeroing
        from ..jobs.dictionaries.saes import finder

        ablated, s.interventions = zeroing(model, list(ablate), finder(model, context.saes))
    s.changes = {k: v for k, v in (("steered", steered), ("ablated", ablated)) if v}
    set_changed(context, s.changes)
    return s


def encode_text(context: RunContext, model, text: str | None) -> list[int]:
    """The ids of the command's text (read_text), its last N tokens with --last N (said as
    open_session says it), for a command that needs no session."""
    from ..jobs.session import encode_last

    with offering_last(context):
        whole, before = read_whole(context, text, model)
        ids, dropped = encode_last(model, whole, context.last, specials=not context.chat,
                                   before=before)
    if dropped:
        cut(context, dropped)
    return ids


def read_whole(context: RunContext, text: str | None, model) -> tuple[str, int]:
    """(read_text, how many of the text's tokens were left out before it). Without --last,
    stdin is read no further than a text that fits the context; with --last N, all of it,
    but only its end is kept (Tokenizer.tail: enough characters for N tokens of the longest,
    from where no token spans), the tokens before it counted as they stream past."""
    from .streams import stdin_chunks

    if context.last is None or (text is not None and text != "-"):
        return read_text(text, model if context.last is None else None), 0
    n = min(max(context.last, 1), model.config.n_positions)  # a wrong N is refused later
    tail, before = model.tokenizer.tail(stdin_chunks(),
                                        n * model.tokenizer.longest_token_bytes + 1)
    tail = tail[:-1] if tail.endswith("\n") else tail  # echo's newline, as read_text drops
    if not tail and not before:
        raise InputError("the text is empty: give at least one character")
    return tail, before


@contextlib.contextmanager
def offering_last(context: RunContext):
    """A text too long for the context is refused with the way out, where the command
    offers it (--last N)."""
    from ..jobs.session import TooLong

    try:
        yield
    except TooLong as e:
        if not context.offers_last:
            raise
        raise InputError(f"{e}; --last N reads its last N tokens") from None


def cut(context: RunContext, dropped: int) -> None:
    """Note that --last left `dropped` tokens out: present() says it on stderr once the
    command has done its work (an error stays the only line) and adds it to the JSON
    document as "cut"."""
    context.cut = {"last": context.last, "dropped": dropped}


def steered(context: RunContext, model) -> tuple[object | None, dict]:
    """(the steering hook, {"steered": its description} or {}) for a command whose analysis
    runs the model on its own (many texts, windows of a file): it passes the hook on, and
    its view starts with what was steered, as open_session's do."""
    from .steering import steering

    hook, described = steering(context, model)
    changes = {"steered": described} if described else {}
    set_changed(context, changes)
    return hook, changes


def run(context: RunContext, weights: Path | None, text: str | None,
        ablate: list[str] | None = None) -> Run:
    """open_session, and (when asked for) the trace of its forward pass (session.Run)."""
    from ..jobs.session import Run

    return Run(open_session(context, weights, text, ablate=ablate))


