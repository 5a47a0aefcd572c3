"""--steer, --steer-away, --steer-vector, --steer-layer, --steer-scale on every command that
runs the model: on a text, or over data (means, steer, probe, sae train|eval, lens --fit).

The options are declared once (common.STEER_OPTIONS). `steerable` adds them to a command's
signature when the app is built (app._register wraps every command that takes --ablate, and
those of STEERED), and keeps their values for the length of the command; `steering(model)`
turns them into the hook the command's session runs with (common.open_session; the commands
whose analyses run the model themselves pass `steering(model)[0]` on as their hooks).
"""

from __future__ import annotations

import functools
import inspect
from typing import NamedTuple, Optional

from ..errors import InputError
from ..render.output import say_steered
from .common import STEER_OPTIONS

# typer reads the real types of the added parameters from here (the modules' own are strings)
_TYPES = {"steer": Optional[str], "steer_away": Optional[str],  # noqa: UP045 - typer needs it
          "steer_vector": Optional[str], "steer_layer": Optional[int],  # noqa: UP045
          "steer_scale": float}


class SteerOptions(NamedTuple):  # not a frozen dataclass: 0.5 ms less of every start-up
    steer: str | None = None
    steer_away: str | None = None
    steer_vector: str | None = None
    steer_layer: int | None = None
    steer_scale: float = 1.0


# Commands without --ablate that run the model take them too (sae's are marked @steerable).
STEERED = {"lens", "dla", "ablate", "patch", "attribute", "score", "heads", "neurons", "diff",
           "history", "why", "qk", "circuit", "means", "steer", "probe"}

_chosen = SteerOptions()  # the running command's options
_made: dict = {}  # (id(model), options) -> steering(model): once a command, one stderr line
_said: list = []  # the steering line, said once the command has done its work


def steerable(fn):
    """fn with the steering options added to its signature (once), held while it runs."""
    if getattr(fn, "_steerable", False):
        return fn
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def command(*args, **kwargs):
        global _chosen
        _chosen = SteerOptions(**{name: kwargs.pop(name) for name in STEER_OPTIONS})
        try:
            result = fn(*args, **kwargs)
            for d in _said:  # after the work: an error stays the only line
                say_steered(d)
            return result
        finally:
            _chosen = SteerOptions()
            _made.clear()
            _said.clear()

    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option,
                               annotation=_TYPES[name]) for name, option in STEER_OPTIONS.items()]
    kept = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
            if p.kind == inspect.Parameter.VAR_KEYWORD else p for p in sig.parameters.values()]
    command.__signature__ = sig.replace(parameters=[*kept, *extra])
    command.__annotations__ = {**getattr(fn, "__annotations__", {}), **_TYPES}
    command._steerable = True
    return command


def steering(model) -> tuple[object | None, dict | None]:
    """(the hook that steers every run, a description for views) from the running command's
    options; (None, None) when it is not steered. Made once per command and model."""
    key = (id(model), _chosen)
    if key not in _made:
        _made[key] = (model, _steering(model))  # the model is kept so its id stays its own
    return _made[key][1]


def _steering(model) -> tuple[object | None, dict | None]:
    o = _chosen
    if o.steer is None and o.steer_away is None and o.steer_vector is None:
        if o.steer_layer is not None or o.steer_scale != 1.0:
            raise InputError("--steer-layer and --steer-scale need a direction: --steer TEXT "
                             "--steer-away AWAY, or --steer-vector FILE")
        return None, None
    from ..analysis.steer import steering_hook

    hook, described = steering_hook(model, o.steer, o.steer_away, o.steer_vector, o.steer_layer,
                                    o.steer_scale)
    _said.append(described)
    return hook, described


def steered_hooks(model, hooks=None):
    """`hooks` with the running command's steering before them (generate's hook set)."""
    from ..hooks import chained

    return chained(steering(model)[0], hooks)


def keep_default_file(given, default: str, option: str = "--out") -> None:
    """InputError (before any work) when a steered run would write over the default file."""
    if given is None and (_chosen.steer, _chosen.steer_away, _chosen.steer_vector) != (None,) * 3:
        raise InputError(f"a steered run does not write over {default}: give {option} FILE "
                         "(its metadata records the steering)")
