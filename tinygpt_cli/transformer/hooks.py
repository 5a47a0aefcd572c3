"""Hook sets: what the forward pass does with each named value as it passes, `x = hooks(path, x)`.

A hook set is any callable (path, array) -> array. The forward pass calls it with every value
of the schema that it computes, under its concrete path (`layers.1.heads.2.weights`), and
uses what it returns. The sets here:

- Record: keep every value (what a Trace holds); stores references, copies nothing.
- RecordOnly(paths): keep only these.
- Replace({path: fn}): use fn(x) instead of x, e.g. zero a head's output (ablation).
- StopAfter(path): end the forward pass once this value exists (forward returns None).
- Chain(a, b, ...): each in turn; Chain(Replace(...), Record()) records the changed run.
- add_vector(path, v, c): add c * v to every position of a value (steering).

Per-head values are views into the all-heads arrays; a hook that returns a new array for one
head has it written back into that head's slice, so the change reaches everything after it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping

import numpy as np

from .config import Config
from .schema import BY_PATH, PathError, pattern_of, resolve

Hook = Callable[[str, np.ndarray], np.ndarray]


class Stop(Exception):  # noqa: N818 - a signal, not an error
    """Raised by StopAfter to end the forward pass early."""


class Record:
    """Keep every value by path. The values are the arrays the model used, not copies."""

    def __init__(self) -> None:
        self.values: dict[str, np.ndarray] = {}

    def __call__(self, path: str, x: np.ndarray) -> np.ndarray:
        self.values[path] = x
        return x


class RecordOnly(Record):
    """Keep only the values at these concrete canonical paths."""

    who = "record"

    def __init__(self, paths: Iterable[str]) -> None:
        super().__init__()
        self.paths = frozenset(paths)

    def bind(self, config: Config) -> None:
        self.paths = frozenset(hooked_path(p, config, "record") for p in self.paths)

    def unreached(self) -> list[str]:
        return sorted(self.paths - set(self.values))

    def __call__(self, path: str, x: np.ndarray) -> np.ndarray:
        if path in self.paths:
            self.values[path] = x
        return x


class Replace:
    """Use fn(x) in place of the value at each path: {canonical path: fn}. `who` says what
    change the user asked for, to name it when its numbers overflow the pass (None: a change
    an analysis makes itself, part of its computation)."""

    def __init__(self, fns: Mapping[str, Callable[[np.ndarray], np.ndarray]],
                 who: str | None = None) -> None:
        self.fns = dict(fns)
        self.seen: set[str] = set()
        self.who = who

    def blame(self, path: str) -> str | None:
        return self.who

    def bind(self, config: Config) -> None:
        fns = {}
        for p, fn in self.fns.items():
            fns[hooked_path(p, config, "Replace")] = fn
        self.fns, self.seen = fns, set()

    def unreached(self) -> list[str]:
        return sorted(set(self.fns) - self.seen)

    def __call__(self, path: str, x: np.ndarray) -> np.ndarray:
        fn = self.fns.get(path)
        if fn is None:
            return x
        self.seen.add(path)
        out = np.asarray(fn(x), dtype=x.dtype)
        if out.shape != x.shape:  # a scalar or a row: spread it over the value, writable
            out = np.broadcast_to(out, x.shape).copy()
        return out


class StopAfter:
    """End the forward pass right after the value at `path` has passed the hooks before it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def bind(self, config: Config) -> None:
        self.path = hooked_path(self.path, config, "StopAfter")

    def __call__(self, path: str, x: np.ndarray) -> np.ndarray:
        if path == self.path:
            raise Stop(path, x)  # the value too, so that forward can check it is finite
        return x


class Chain:
    """Several hook sets in turn, each seeing what the one before returned."""

    def __init__(self, *hooks: Hook) -> None:
        self.hooks = [h for h in hooks if h is not None]

    def __call__(self, path: str, x: np.ndarray) -> np.ndarray:
        for h in self.hooks:
            x = h(path, x)
        return x


def chained(*hooks: Hook | None) -> Hook | None:
    """The hooks given in turn; the one hook itself, or None for none: a run with no hook
    keeps the forward pass's fast paths, so an unsteered run is the plain run bit for bit."""
    given = [h for h in hooks if h is not None]
    return None if not given else given[0] if len(given) == 1 else Chain(*given)


# ------------------------------------------------------------------ hooks named from Python
# A Session binds the hook sets it is given before it runs them: each user name (a
# TransformerLens or seed spelling, a negative index) becomes the path the forward pass uses,
# a name of no value raises PathError with the CLI's suggestions, and after the run a name the
# run never reached raises too, where a hook set would otherwise do nothing in silence.


def hooked_path(path: str, config: Config, who: str) -> str:
    """The canonical path of a value the forward pass computes, for a hook set `who`."""

    name, rows = resolve(path, config)
    if rows:
        raise PathError(path, f"{who} takes a whole value, not rows of one: {path!r}")
    if BY_PATH[pattern_of(name)].kind != "hooked":
        raise PathError(path, f"{name} is not computed by the forward pass, so no hook sees "
                        "it; try logits, a head's weights (layers.0.heads.0.weights) or "
                        "layers.0.mlp_out")
    return name


def sets_of(hooks) -> list:
    """The hook sets of a hook (a Chain's, in turn)."""
    if isinstance(hooks, Chain):
        return [s for h in hooks.hooks for s in sets_of(h)]
    return [] if hooks is None else [hooks]


def bind(hooks, config: Config) -> None:
    """Resolve every path the hook sets name (PathError, with suggestions, for none)."""
    for h in sets_of(hooks):
        if hasattr(h, "bind"):
            h.bind(config)


def check_reached(hooks, stopped: str | None = None) -> None:
    """PathError for a value a hook set names that the run never reached (a Replace that
    changed nothing, a record that kept nothing)."""

    for h in sets_of(hooks):
        missed = h.unreached() if hasattr(h, "unreached") else []
        if missed:
            why = f" (it stopped after {stopped})" if stopped else ""
            who = getattr(h, "who", None) or type(h).__name__
            raise PathError(missed[0], f"{who} names {missed[0]}, which this run never "
                            f"reached{why}")


def zero(x: np.ndarray) -> np.ndarray:
    return np.zeros_like(x)


def ablation(paths: Iterable[str], config: Config) -> Replace:
    """Zero the value at each user path (`layers.1.heads.2.out`, `blocks.0.hook_mlp_out`).

    A path with row indices (`logits[-1]`) cannot be ablated as a whole value; that and an
    unknown path raise PathError with suggestions.
    """

    def computed(name: str) -> bool:
        return BY_PATH[pattern_of(name)].kind == "hooked" and name != "ids"

    fns = {}
    for p in paths:
        try:
            name, rows = resolve(p, config)
        except PathError as e:  # suggest only what --ablate takes: `tokens` is no value to zero
            e.suggestions = [s for s in e.suggestions if computed(resolve(s, config)[0])]
            raise
        if rows:
            raise PathError(p, f"--ablate takes a whole value, not rows of one: {p!r}")
        if not computed(name):
            raise PathError(p, f"{name} is not computed by the forward pass, so it cannot be "
                            "ablated; try a head's output (layers.0.heads.0.out), "
                            "layers.0.attn_out or layers.0.mlp_out")
        fns[name] = zero
    return Replace(fns)


class Steering(Replace):
    """Add `shift` to every row (every position) of the value at `site`; analyses that split
    a run into parts (dla, attribute) read the two to give the steering a part of its own."""

    def __init__(self, site: str, shift: np.ndarray) -> None:
        super().__init__({site: lambda x: x + shift.astype(x.dtype)},
                         who="the steering vector times --steer-scale")
        self.site, self.shift = site, shift

    def key(self) -> list[str]:
        """What a cache entry of a steered run is kept under: the site and the shift's bytes."""
        shift = np.asarray(self.shift, np.float64)
        return [self.site, hashlib.sha256(shift.tobytes()).hexdigest()]


def add_vector(path: str, vector: np.ndarray, scale: float) -> Steering | None:
    """Add scale * vector to every row (every position) of the value at `path` (steering).

    Scale 0 gives no hook at all rather than x + 0 * v: the run is then the unsteered run bit
    for bit (x + 0.0 would turn a -0.0 into +0.0).
    """
    if scale == 0:
        return None
    return Steering(path, scale * np.asarray(vector, dtype=np.float64))
