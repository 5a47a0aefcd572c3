"""Architecture families: one converter module each, between a family's own files (the
tensor names, orientations and config.json keys that `transformers` writes) and the one
canonical `Model` layout that model.py, ops.py and every analysis read.

A converter module has what the Family protocol below lists:

- MODEL_TYPE, the config.json `model_type` it reads; LABEL, the family as messages name it;
  PREFIX and IGNORED, how its file names tensors (a prefix to drop, buffers to skip);
  PLACES_BFLOAT16, whether params_from_file widens unwidened bfloat16 tensors itself;
  MODULES, Hugging Face's module names of its blocks (hooks name them);
- config_from_hf(d) -> Config and config_to_hf(config) -> dict, the config both ways;
- file_shapes(config) -> {file name: shape}, what the header check expects, before any
  tensor is read;
- params_from_file(tensors, config) -> canonical params (it may empty `tensors` as it goes,
  so that a converted copy never sits beside all the originals), and params_to_file(params, config)
  -> the family's tensors, so that a folder tinygpt saves loads in `transformers`;
- file_name(canonical) -> the family's name of a parameter, and canonical_name(file name)
  -> the canonical one or None, for the commands that take a parameter's name; block_of(file
  name) -> the block a tensor belongs to (None outside the blocks), for the header check.

`family(model_type)` finds one (a loaded Model carries its own: `Model.family`); a
model_type with no converter is refused by name.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Protocol, cast

from ...storage.files import write_atomically
from ..config import MAX_CONFIG_BYTES, Config


class Family(Protocol):
    """Everything a family's converter module provides (tests/test_families.py checks each
    module of KNOWN against this list): found once for a config (`family`), and carried by
    the loaded Model (`Model.family`)."""

    MODEL_TYPE: str  # the config.json `model_type` it reads
    LABEL: str  # the family as messages name it ("GPT-2")
    PREFIX: str  # what its file's tensor names start with ("transformer." for GPT-2's)
    IGNORED: tuple[str, ...]  # endings of tensor names that are no parameter (buffers)
    PLACES_BFLOAT16: bool  # params_from_file widens unwidened bfloat16 tensors in place
    # Hugging Face's module names: the blocks, the norm before the MLP, attention's output
    # projection (hooks of SAEs and transcoders name them: jobs/dictionaries/gemmascope.py)
    MODULES: tuple[str, str, str]

    def config_from_hf(self, d: dict) -> Config: ...

    def config_to_hf(self, config: Config) -> dict: ...

    def file_shapes(self, config: Config) -> dict[str, tuple[int, ...]]: ...

    def params_from_file(self, tensors: dict, config: Config) -> dict: ...

    def params_to_file(self, params: dict, config: Config) -> dict: ...

    def file_name(self, canonical: str) -> str: ...

    def canonical_name(self, name: str) -> str | None: ...

    def block_of(self, name: str) -> int | None: ...


def missing(module) -> list[str]:
    """What a converter module lacks of the Family protocol (nothing, for a whole one)."""
    wanted = [*Family.__annotations__, *(n for n, v in vars(Family).items()
                                        if callable(v) and not n.startswith("_"))]
    return [n for n in wanted if not hasattr(module, n)]


# model_type -> module; imported when first asked for (start-up reads one config)
KNOWN = {"gpt2": "gpt2", "gpt_neo": "gpt_neo", "gpt_neox": "gpt_neox", "llama": "llama",
         "qwen2": "llama", "qwen3": "llama", "gemma3_text": "gemma3"}


def family(model_type: str) -> Family:
    if model_type == "gemma3":
        raise ValueError("config: model_type 'gemma3' is Gemma 3 with its vision tower "
                         "(Gemma3ForConditionalGeneration); tinygpt reads the text model alone "
                         "(model_type 'gemma3_text', Gemma3ForCausalLM)")
    if model_type not in KNOWN:
        shown = model_type if isinstance(model_type, str) else type(model_type).__name__
        raise ValueError(f"config: model_type {shown!r} is not a family tinygpt reads "
                         f"({', '.join(sorted(KNOWN))})")
    return cast(Family, importlib.import_module(f".{KNOWN[model_type]}", __name__))


def config_to_dict(config: Config) -> dict:
    """The config.json of this model's family, as `transformers` reads it."""
    return family(config.model_type).config_to_hf(config)


def config_from_dict(d: dict) -> Config:
    """A config.json's object, read by the converter of its `model_type` (a file without
    one is GPT-2's, as older GPT-2 files are); a model_type tinygpt has no converter for
    is refused by name, never read as GPT-2."""
    if not isinstance(d, dict):
        raise ValueError(f"config: expected a JSON object, got {type(d).__name__}")
    return family(d.get("model_type", "gpt2")).config_from_hf(d)


def load_config(path: str | Path) -> Config:
    """Read and check a config.json; any fault is a ValueError with a one-line message."""
    path = Path(path)
    with open(path, "rb") as f:
        raw = f.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise ValueError(f"config: larger than {MAX_CONFIG_BYTES:,} bytes; not a GPT-2 config")
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("config: nested too deeply to be a GPT-2 config") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"config: not valid JSON ({e})") from None
    except ValueError as e:  # Python's own limit on integer strings, with its hint for coders
        if "integer string conversion" not in str(e):
            raise
        raise ValueError("config: a number of more than 4,300 digits; no size of a GPT-2 "
                         "model is anywhere near that large") from None
    return config_from_dict(data)


def _no_constant(name: str):
    raise ValueError(f"config: {name} is not a number JSON allows")


def save_config(config: Config, path: str | Path) -> None:
    text = json.dumps(config_to_dict(config), indent=2, sort_keys=True) + "\n"
    write_atomically(Path(path), text.encode("utf-8"))


