"""Direction files: a safetensors file holding the tensor `direction` [d] (float32), or, for
a set of directions (an SAE's `W_dec` [m, d], a multiclass probe's `directions` [C, d]), a
2-D tensor from which `FILE#N` picks row N. Its metadata (all optional) says what it is:
`site` (the trace path it lives at; a resid_pre/resid_post site gives the layer to steer),
`kind` (steer, probe, sae) and `source` (how it was made, JSON). A .npy file holding a [d]
array (or [n, d] with #N) works too, and a SAELens folder DIR#N is its W_dec row N. Written
by `steer --out` and `probe --out`, read for `--steer-vector`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...analysis.steer import layer_of_site
from ...errors import InputError, WeightsError
from ...storage.madefor import check_made_for
from ...storage.safetensors import metadata_strings, read_safetensors, safetensors_bytes
from .saelens import load_saelens

ROWS = ("W_dec", "directions")


def direction_file(vector: np.ndarray, site_path: str, kind: str, source: dict,
                   rows: np.ndarray | None = None, meta: dict[str, str] | None = None) -> bytes:
    """The safetensors bytes (safetensors.safetensors_bytes: the same vector gives the same
    bytes). `meta` is more metadata (metadata_strings: the steering of the run it was found
    in)."""

    tensors = {"direction": np.ascontiguousarray(vector, dtype="<f4")}
    if rows is not None:
        tensors["directions"] = np.ascontiguousarray(rows, dtype="<f4")
    return safetensors_bytes(tensors, {"site": site_path, "kind": kind,
                                       "source": json.dumps(source, sort_keys=True),
                                       **metadata_strings(meta or {})})


@dataclass
class Direction:
    vector: np.ndarray  # [d] float32
    layer: int | None  # the layer whose resid_pre it belongs to, if the file says
    name: str  # the file (and #row) it came from


def read_direction(spec: str, d: int, n_layer: int, weights_file, config=None) -> Direction:
    """The vector named by --steer-vector FILE or FILE#N: InputError for a file that is not
    one of the forms above (exit 2), WeightsError for one that cannot be read (exit 1). A
    file whose metadata names the weights it was made for (madefor) must name these. A
    folder is a SAELens SAE (read for the model of `config`): DIR#N is its W_dec row N."""


    path, _, row = spec.rpartition("#") if "#" in spec else (spec, "", "")
    if row and not row.isdigit():
        raise InputError(f"--steer-vector {spec}: after '#' give a row number, not {row!r}")
    if Path(path).is_dir() and config is not None:

        sae = load_saelens(Path(path), config, weights_file)  # checked as every SAE is
        if not row:
            raise InputError(f"--steer-vector {spec}: a SAELens folder holds {sae.n_latents} "
                             f"directions (W_dec's rows); pick one with {path}#N")
        vector = _pick({"W_dec": sae.W_dec}, int(row), spec)
        return Direction(vector, layer_of_site(sae.site, n_layer), spec)
    if not Path(path).is_file():
        raise InputError(f"--steer-vector {path}: no such file")
    tensors, meta = _read_tensors(Path(path))
    check_made_for(f"--steer-vector {path}", meta, weights_file, "the vector",
                   "find it again on these weights (tinygpt steer --out)", required=False)
    vector = _pick(tensors, int(row) if row else None, spec)
    if vector.dtype.kind != "f":
        raise InputError(f"--steer-vector {spec}: the vector holds {vector.dtype.name} values; "
                         "a vector is real floating-point numbers")
    if vector.shape != (d,):
        raise InputError(f"--steer-vector {spec}: the vector has shape {list(vector.shape)}; "
                         f"this model's residual stream has {d} numbers")
    if not np.all(np.isfinite(vector)):
        raise WeightsError(f"--steer-vector {spec}: the vector holds NaN or infinite numbers")
    return Direction(vector.astype(np.float32), layer_of_site(meta.get("site"), n_layer), spec)


def _read_npy(path) -> np.ndarray:
    """A .npy file's array, its header checked before anything is allocated: real floating
    point numbers (not strings, objects or complex numbers, whose imaginary part would be
    dropped: InputError, exit 2), and as many as the file holds (WeightsError, exit 1)."""
    fmt = np.lib.format
    try:
        with open(path, "rb") as f:
            version = fmt.read_magic(f)
            shape, _, dtype = (fmt.read_array_header_1_0(f) if version == (1, 0)
                               else fmt.read_array_header_2_0(f))
            start = f.tell()
    except (ValueError, OSError, EOFError, SyntaxError, TypeError) as e:
        raise WeightsError(f"--steer-vector {path}: not a readable .npy file "
                         f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    if dtype.kind != "f" or dtype.fields is not None:
        raise InputError(f"--steer-vector {path}: the file holds {dtype.name} values "
                         f"(dtype {dtype.str!r}); a vector is real floating-point numbers")
    count = int(np.prod(shape, dtype=object))
    size = path.stat().st_size - start
    if count * dtype.itemsize != size:
        raise WeightsError(f"--steer-vector {path}: its header claims {count:,} numbers "
                         f"({count * dtype.itemsize:,} bytes) and the file holds {size:,} "
                         "bytes after it")
    return np.load(path, allow_pickle=False)


def _read_tensors(path) -> tuple[dict[str, np.ndarray], dict]:
    if path.suffix == ".npy":
        return {"direction": _read_npy(path)}, {}

    return read_safetensors(path, label=f"--steer-vector {path}")


def _pick(tensors: dict[str, np.ndarray], row: int | None, spec: str) -> np.ndarray:
    if row is None:
        if "direction" in tensors:
            return np.asarray(tensors["direction"])
        if len(tensors) == 1:
            return np.asarray(next(iter(tensors.values())))
        raise InputError(f"--steer-vector {spec}: the file holds {len(tensors)} tensors and "
                         "none is named 'direction'; pick a row with FILE#N")
    table = next((tensors[k] for k in ROWS if k in tensors), None)
    if table is None and len(tensors) == 1:
        table = next(iter(tensors.values()))
    if table is None or np.ndim(table) != 2:
        raise InputError(f"--steer-vector {spec}: #N picks a row of a 2-D tensor "
                         f"({' or '.join(ROWS)}); the file has none")
    if not 0 <= row < len(table):
        raise InputError(f"--steer-vector {spec}: row {row} is out of range: the file has "
                         f"rows 0..{len(table) - 1}")
    return np.asarray(table[row])
