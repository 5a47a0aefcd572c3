"""How a command runs: with its run context, and (when it runs the model) steered.

Every command is written `def name(context: RunContext, ...options)`: `with_context` turns it
into the Typer callback, which takes the run context the entry point made (click's `obj`, a
fresh RunContext when there is none) and gives the command its own copy (for_command). A
command marked @steerable also takes --steer, --steer-away, --steer-vector, --steer-layer and
--steer-scale (declared once: STEER_OPTIONS below), held in its context; `steering(context,
model)` turns them into the hook its session runs with (common.open_session; the commands
whose analyses run the model themselves pass `steering(context, model)[0]` on as their
hooks), and once the command has done its work each steering made is said on stderr.
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Optional

import typer

from ..errors import InputError
from ..render.output import say_steered
from .context import RunContext, SteerOptions

# Every command that reads one text through its session takes this (added here,
# as the steering options are; a command that reads a long text its own way is marked
# @own_length).
LAST = typer.Option(None, "--last", min=1, metavar="N", show_default=False,
                    help="Read only the text's last N tokens (a text longer than the model's "
                    "context is refused without it); --json says how many were dropped.")

# The SAEs whose latents --ablate sae.SITE.N and `trace TEXT sae.SITE` name: every command that
# takes --ablate also takes this (added here, as the steering options are).
SAES = typer.Option(None, "--sae", metavar="SAE", show_default=False,
                    help="An SAE for the latents sae.SITE.N name (repeatable; default: the "
                    "weights folder's sae/SITE.safetensors): a tinygpt SAE file, or a SAELens "
                    "folder (cfg.json + sae_weights.safetensors), or a Gemma Scope 2 one "
                    "(params.safetensors).")

# Steering: every command that runs the model on a text takes these (added to each
# command that takes --ablate; declared here once).
STEER_OPTIONS = {
    "steer": typer.Option(None, "--steer", metavar="TEXT", show_default=False,
                          help="Steer the run: add scale * v to layers.L.resid_pre at every "
                          "position, v = mean resid_pre[L](TEXT) - mean resid_pre[L](AWAY)."),
    "steer_away": typer.Option(None, "--steer-away", metavar="AWAY", show_default=False,
                               help="The text --steer steers away from."),
    "steer_vector": typer.Option(None, "--steer-vector", metavar="FILE[#N]",
                                 show_default=False, help="Steer by a saved direction instead "
                                 "(tinygpt steer/probe --out, .npy, or row N of an SAE's W_dec)."),
    "steer_layer": typer.Option(None, "--steer-layer", metavar="L", show_default=False,
                                help="The block whose input is steered (default: the one the "
                                "--steer-vector file names)."),
    "steer_scale": typer.Option(1.0, "--steer-scale", metavar="C",
                                help="How much of the vector to add; 0 is the unsteered run."),
}


# typer reads the real types of the added parameters from here (the modules' own are strings)
_TYPES = {"steer": Optional[str], "steer_away": Optional[str],  # noqa: UP045 - typer needs it
          "steer_vector": Optional[str], "steer_layer": Optional[int],  # noqa: UP045
          "steer_scale": float}
_SAES_TYPE = Optional[list[Path]]  # noqa: UP045
_LAST_TYPE = Optional[int]  # noqa: UP045
_CLICK = "_click_context"  # the parameter typer fills with click's context


def steerable(fn):
    """Mark a command as one that runs the model: it takes the steering options."""
    fn.steerable = True
    return fn


def own_length(fn):
    """Mark a command that reads a long text its own way (score's windows, generate's end,
    heads' stories, encode's whole text): it takes no --last."""
    fn.own_length = True
    return fn


def with_context(fn, name: str):
    """The Typer callback of command `fn(context, **options)` named `name`: its first
    parameter, the RunContext, is made from the one the command line runs with; the others
    are its options (and the steering options, when it is @steerable)."""
    if getattr(fn, "_with_context", False):
        return fn
    sig = inspect.signature(fn)
    steers = getattr(fn, "steerable", False)
    # --ablate (and why's --value) may name SAE latents: a command that takes it takes --sae
    # too (unless it has an --sae of its own)
    saes = ("ablate" in sig.parameters or "value" in sig.parameters) \
        and "sae" not in sig.parameters
    # a command that reads one text (the argument TEXT) through its session takes --last N
    lasts = "text" in sig.parameters and not getattr(fn, "own_length", False)

    @functools.wraps(fn)
    def command(**kwargs):
        click_context = kwargs.pop(_CLICK)
        line = click_context.find_root().obj
        steer = SteerOptions(**{n: kwargs.pop(n) for n in STEER_OPTIONS}) if steers else None
        given_saes = tuple(kwargs.pop("sae", None) or ()) if saes else ()
        context = (line if line is not None else RunContext()).for_command(
            name, steer, bool(kwargs.get("quiet", False)))
        context.saes = given_saes
        context.last, context.offers_last = (kwargs.pop("last"), True) if lasts else (None, False)
        sources = {n: click_context.get_parameter_source(n) for n in kwargs}
        context.given = frozenset(  # the options the user typed, not left at their default
            n for n, source in sources.items() if source is not None
            and source.name == "COMMANDLINE")
        result = fn(context, **kwargs)
        for d in context.said:  # after the work: an error stays the only line
            say_steered(d)
        return result

    kind = inspect.Parameter.KEYWORD_ONLY
    extra = [inspect.Parameter(n, kind, default=option, annotation=_TYPES[n])
             for n, option in STEER_OPTIONS.items()] if steers else []
    if saes:
        extra.append(inspect.Parameter("sae", kind, default=SAES, annotation=_SAES_TYPE))
    if lasts:
        extra.append(inspect.Parameter("last", kind, default=LAST, annotation=_LAST_TYPE))
    own = [p.replace(kind=kind) for p in list(sig.parameters.values())[1:]]  # 0: context
    command.__signature__ = sig.replace(parameters=[
        inspect.Parameter(_CLICK, kind, annotation=typer.Context), *own, *extra])
    command.__annotations__ = {**{k: v for k, v in getattr(fn, "__annotations__", {}).items()
                                  if k != next(iter(sig.parameters))},
                               _CLICK: typer.Context, **(_TYPES if steers else {}),
                               **({"sae": _SAES_TYPE} if saes else {}),
                               **({"last": _LAST_TYPE} if lasts else {})}
    command._with_context = True
    return command


def _options(context: RunContext) -> SteerOptions:
    if context.steer is None:  # a command that runs the model, not marked: a bug, not input
        raise RuntimeError(f"command {context.command!r} runs the model but is not "
                           "@steerable (cli/steering.py)")
    return context.steer


def steering(context: RunContext, model) -> tuple[object | None, dict | None]:
    """(the hook that steers every run, a description for views) from the command's options;
    (None, None) when it is not steered. Made once per command and model."""
    key = (id(model), _options(context))
    if key not in context.steerings:  # the model is kept so its id stays its own
        context.steerings[key] = (model, _steering(context, model))
    return context.steerings[key][1]


def _steering(context: RunContext, model) -> tuple[object | None, dict | None]:
    o = _options(context)
    if o.steer is None and o.steer_away is None and o.steer_vector is None:
        if o.steer_layer is not None or o.steer_scale != 1.0:
            raise InputError("--steer-layer and --steer-scale need a direction: --steer TEXT "
                             "--steer-away AWAY, or --steer-vector FILE")
        return None, None
    from ..jobs.steer import steering_hook

    hook, described = steering_hook(model, o.steer, o.steer_away, o.steer_vector, o.steer_layer,
                                    o.steer_scale)
    context.said.append(described)
    return hook, described


def steered_hooks(context: RunContext, model, hooks=None):
    """`hooks` with the command's steering before them (generate's hook set)."""
    from ..transformer.hooks import chained

    return chained(steering(context, model)[0], hooks)


def keep_default_file(context: RunContext, given, default: str, option: str = "--out") -> None:
    """InputError (before any work) when a steered run would write over the default file."""
    if given is None and _options(context).given:
        raise InputError(f"a steered run does not write over {default}: give {option} FILE "
                         "(its metadata records the steering)")
