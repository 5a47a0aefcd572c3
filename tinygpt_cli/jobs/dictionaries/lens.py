"""A tuned lens's file (analysis/tuned_lens.py's translators): every stage's A.i [d, d] and
b.i [d] in a safetensors file, the weights folder's lens/tuned.safetensors or --lens, made
for the weights (madefor.py's rule)."""

from __future__ import annotations

import shlex
from pathlib import Path

import numpy as np

from ...analysis.tuned_lens import Translators
from ...errors import InputError, WeightsError
from ...storage.files import write_atomically
from ...storage.madefor import check_made_for, remake_hint, weights_option
from ...storage.safetensors import metadata_strings, read_safetensors, safetensors_bytes
from ...transformer.config import Config


def save_translators(path: str | Path, tr: Translators, meta: dict[str, str]) -> None:

    t = {f"A.{i}": np.ascontiguousarray(a, np.float32) for i, a in enumerate(tr.A)}
    t.update({f"b.{i}": np.ascontiguousarray(b, np.float32) for i, b in enumerate(tr.b)})
    write_atomically(Path(path), safetensors_bytes(t, metadata_strings(meta)))


def load_translators(path: str | Path, config: Config, weights_file: Path) -> Translators:
    """The translators of a tuned lens file, checked: every stage's A [d, d] and b [d],
    finite, made for `weights_file` (madefor)."""

    path = Path(path)
    if not path.is_file():
        raise InputError(f"no tuned lens at {path}: {fit_hint(weights_file, path)}")
    t, meta = read_safetensors(path)
    d = config.n_embd
    out = Translators([], [], str(path))
    for i in range(config.n_layer):
        for name, shape, into in ((f"A.{i}", (d, d), out.A), (f"b.{i}", (d,), out.b)):
            x = t.get(name)
            if x is None or x.shape != shape or not np.issubdtype(x.dtype, np.floating) \
                    or not np.isfinite(x).all():
                got = "missing" if x is None else f"shape {list(x.shape)}, {x.dtype}"
                raise WeightsError(f"{path}: {name} must be {list(shape)} finite floats "
                                   f"({got})")
            into.append(np.asarray(x, np.float32))
    check_made_for(path, meta, weights_file, "the tuned lens",
                   fit_hint(weights_file, path, "fit one for them"))
    return out


def fit_hint(weights_file: Path, path: Path, verb: str = "fit one") -> str:
    """The command that fits the tuned lens at `path` (the weights folder's, or the --lens
    file named) for these weights, never into the installed package."""


    default = lens_file(weights_file, None)
    if Path(path) != default:
        return (f"{verb} with `tinygpt lens --fit{weights_option(Path(weights_file).parent)} "
                f"--lens {shlex.quote(str(path))}`")
    return remake_hint(verb, "lens --fit", weights_file, default, "--lens", "tuned.safetensors",
                       "--lens")


def lens_file(weights_file: Path, given: Path | None) -> Path:
    """--lens, or the weights folder's lens/tuned.safetensors."""
    return given if given is not None else Path(weights_file).parent / "lens" / "tuned.safetensors"
