"""Load, validate and save the weights folder: model.safetensors, config.json, tokenizer.json."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .config import Config, load_config
from .files import write_atomically
from .schema import param_shapes

PREFIX = "transformer."


def _shipped_folder() -> Path:
    """Installed wheels carry the weights inside the package; a source checkout has weights/."""
    here = Path(__file__).resolve().parent
    inside = here / "_weights"
    return inside if inside.is_dir() else here.parent / "weights"


SHIPPED = _shipped_folder()


class WeightsError(Exception):
    """A weights folder or file that cannot be used; the message says which tensor and why."""


def validate_params(tensors: dict[str, np.ndarray], config: Config) -> dict[str, np.ndarray]:
    """Check names, shapes, dtypes and finiteness; return float32 params without the prefix."""
    params = {}
    for name, arr in tensors.items():
        short = name[len(PREFIX):] if name.startswith(PREFIX) else name
        if short == "lm_head.weight":
            continue  # tied to wte; ignored if present
        if short.endswith((".attn.bias", ".attn.masked_bias")):
            continue  # old transformers buffers, not parameters
        params[short] = arr
    expected = param_shapes(config)
    missing = [n for n in expected if n not in params]
    if missing:
        raise WeightsError(
            f"tensor {PREFIX}{missing[0]} is missing ({len(missing)} missing in all)"
        )
    extra = [n for n in params if n not in expected]
    if extra:
        raise WeightsError(f"unexpected tensor {extra[0]!r}: not part of a GPT-2 model")
    out = {}
    for name, shape in expected.items():
        arr = params[name]
        if tuple(arr.shape) != shape:
            raise WeightsError(
                f"tensor {PREFIX}{name} has shape {list(arr.shape)}, expected {list(shape)}"
            )
        if arr.dtype.kind != "f":
            raise WeightsError(
                f"tensor {PREFIX}{name} has dtype {arr.dtype}, expected a float type"
            )
        if not np.isfinite(arr).all():
            raise WeightsError(f"tensor {PREFIX}{name} holds NaN or infinite values")
        out[name] = np.ascontiguousarray(arr, dtype=np.float32)
    return out


_SAFETENSORS_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4",
                       "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}


def map_safetensors(path: Path) -> dict[str, np.ndarray] | None:
    """The tensors of a safetensors file as arrays over the file mapped into memory: nothing
    is read or copied until used, and pages are shared with the page cache (start-up and
    memory). The arrays are read-only, so the file cannot be changed through them, and the
    forward pass may keep derived copies of them (ops.tied_head).

    The format: an 8-byte little-endian header length, a JSON header of
    {name: {dtype, shape, data_offsets: [begin, end]}} relative to the data after it, then the
    data. Returns None for anything but a plain well-formed file (bfloat16, say), which the
    safetensors library then reads, or reports, as before.
    """
    import json
    import mmap

    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            return None
        n = int.from_bytes(f.read(8), "little")
        if not 2 <= n <= size - 8:
            return None
        try:
            header = json.loads(f.read(n))
        except ValueError:
            return None
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    data_size = size - 8 - n
    tensors = {}
    if not isinstance(header, dict):
        return None
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = np.dtype(_SAFETENSORS_DTYPES[info["dtype"]])
            shape = tuple(int(d) for d in info["shape"])
            begin, end = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            return None
        count = int(np.prod(shape, dtype=np.int64))
        if not 0 <= begin <= end <= data_size or end - begin != count * dtype.itemsize:
            return None
        tensors[name] = np.frombuffer(buf, dtype, count, 8 + n + begin).reshape(shape)
    return tensors


def load_params(path: str | Path, config: Config) -> dict[str, np.ndarray]:
    from safetensors import SafetensorError

    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"weights file {path} does not exist")
    try:
        tensors = map_safetensors(path)
        if tensors is None:
            from safetensors.numpy import load_file

            tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise WeightsError(f"{path} is not a readable safetensors file ({e})") from None
    return validate_params(tensors, config)


def save_params(params: dict[str, np.ndarray], path: str | Path) -> None:
    """Float32, Hugging Face GPT-2 names, tied head omitted."""
    from safetensors.numpy import save

    tensors = {PREFIX + n: np.ascontiguousarray(a, dtype=np.float32) for n, a in params.items()}
    write_atomically(Path(path), save(tensors, metadata={"format": "pt"}))


@dataclass
class Model:
    """Everything one weights folder holds, loaded and checked."""

    folder: Path
    config: Config
    params: dict[str, np.ndarray]
    tokenizer: object  # tinygpt_cli.tokenizer.Tokenizer

    @property
    def weights_file(self) -> Path:
        return self.folder / "model.safetensors"


def resolve_folder(folder: str | Path | None) -> Path:
    """--weights DIR, then $TINYGPT_WEIGHTS, then the weights shipped with the package."""
    if folder:
        return Path(folder).expanduser()
    env = os.environ.get("TINYGPT_WEIGHTS")
    if env:
        return Path(env).expanduser()
    return SHIPPED


def load_model(folder: str | Path | None = None) -> Model:
    from .tokenizer import Tokenizer

    root = resolve_folder(folder)
    if not root.is_dir():
        raise WeightsError(f"weights folder {root} does not exist")
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        if not (root / name).is_file():
            raise WeightsError(f"weights folder {root} has no {name}")
    try:
        config = load_config(root / "config.json")
    except (ValueError, OSError) as e:
        raise WeightsError(f"{root / 'config.json'}: {e}") from None
    params = load_params(root / "model.safetensors", config)
    try:
        tokenizer = Tokenizer.from_file(root / "tokenizer.json")
    except Exception as e:  # tokenizers raises a bare Exception on malformed files
        raise WeightsError(f"{root / 'tokenizer.json'} is not a tokenizers file ({e})") from None
    if tokenizer.vocab_size > config.vocab_size:
        raise WeightsError(
            f"tokenizer has {tokenizer.vocab_size} tokens but the model only {config.vocab_size}"
        )
    return Model(root, config, params, tokenizer)
