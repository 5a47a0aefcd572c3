"""What `circuit` (and `attribute --faithfulness`) are asked about: a clean and a corrupt
session prepared as a pair with its scored tokens, more pairs from a file for --stability,
and the metric's name for headings. The circuit itself is analysis.circuit's."""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError
from ..words import count
from . import circuit
from .circuit import METHODS


def prepare_pair(s, c, position: int, target: str | None, vs: str | None):
    """(circuit.prepare's pair of runs, a note when the two runs' top guesses coincide and
    the corrupt run's second guess stands in, else None)."""

    if c.T != s.T:
        raise InputError(f"the clean text is {count(s.T, 'token')} and the corrupt text "
                         f"{c.T}: edges are patched position by position, so they must "
                         "have the same number of tokens")
    p = s.position(position)
    t, v, fell_back = circuit.default_tokens(
        s.run()[p], c.run()[p], None if target is None else s.token_id(target),
        None if vs is None else s.token_id(vs))
    tok = s.model.tokenizer.token_str
    if t == v:
        raise InputError(f"the target and --vs are the same token ({tok(t)!r}): give "
                         "--target and --vs that differ")
    note = (f"note: both runs' top guess is {tok(t)!r}; scoring it against the corrupt run's "
            f"next guess {tok(v)!r}") if fell_back else None
    return circuit.prepare(s.params, s.config, s.ids, c.ids, t, v, p, steer=s.steering), note


def check_options(method: str, stable: bool, pairs: Path | None) -> None:
    """A known --method; --stability and --pairs go together."""

    if method not in METHODS:
        raise InputError(f"unknown --method {method!r}: use {', '.join(METHODS)}")
    if stable != (pairs is not None):
        raise InputError("--stability needs --pairs FILE, and --pairs goes with --stability")


def read_pairs(path: Path) -> list[tuple[str, str]]:
    """Lines CLEAN<TAB>CORRUPT; blank lines and lines starting with '#' are skipped."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise InputError(f"--pairs {path}: not UTF-8 text") from None
    except OSError as e:
        raise InputError(f"--pairs {path}: cannot read it ({e.strerror or e})") from None
    pairs = []
    for n, line in enumerate(lines, 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) != 2 or not all(p.strip() for p in parts):
            raise InputError(f"--pairs {path}, line {n}: expected CLEAN<tab>CORRUPT")
        pairs.append((parts[0], parts[1]))
    if not pairs:
        raise InputError(f"--pairs {path}: no pairs in it (one CLEAN<tab>CORRUPT a line)")
    return pairs


def stability_over(s, texts: list[tuple[str, str]], first, method: str, steps: int,
                   size: int, target: str | None, vs: str | None, position: int):
    """circuit.stability over `first` and the pairs of texts (run as session s is)."""

    pairs = [first]
    for clean, corrupt in texts:
        a = s.reopen(clean)
        pairs.append(prepare_pair(a, a.reopen(corrupt), position, target, vs)[0])
    return circuit.stability(pairs, method, size, steps)


def describe(token_str, t: int, v: int | None) -> str:
    """The metric, for a heading: logit[' ball'] − logit[' car']."""
    return f"logit[{token_str(t)!r}]" + (f" − logit[{token_str(v)!r}]" if v is not None else "")
