"""Architecture families: one converter module each, between a family's own files (the
tensor names, orientations and config.json keys that `transformers` writes) and the one
canonical `Model` layout that model.py, ops.py and every analysis read.

A converter module has:

- MODEL_TYPE, the config.json `model_type` it reads;
- config_from_hf(d) -> Config and config_to_hf(config) -> dict, the config both ways;
- file_shapes(config) -> {file name: shape}, what the header check expects, before any
  tensor is read;
- params_from_file(tensors, config) -> canonical params (it may empty `tensors` as it goes,
  so that a converted copy never sits beside all the originals), and params_to_file(params, config)
  -> the family's tensors, so that a folder tinygpt saves loads in `transformers`;
- file_name(canonical) -> the family's name of a parameter, and canonical_name(file name)
  -> the canonical one or None, for the commands that take a parameter's name.

`family(model_type)` finds one; a model_type with no converter is refused by name.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType

from ...storage.files import write_atomically
from ..config import MAX_CONFIG_BYTES, Config

# model_type -> module; imported when first asked for (start-up reads one config)
KNOWN = {"gpt2": "gpt2", "gpt_neo": "gpt_neo", "gpt_neox": "gpt_neox", "llama": "llama",
         "qwen2": "llama", "qwen3": "llama", "gemma3_text": "gemma3"}


def family(model_type: str) -> ModuleType:
    if model_type == "gemma3":
        raise ValueError("config: model_type 'gemma3' is Gemma 3 with its vision tower "
                         "(Gemma3ForConditionalGeneration); tinygpt reads the text model alone "
                         "(model_type 'gemma3_text', Gemma3ForCausalLM)")
    if model_type not in KNOWN:
        shown = model_type if isinstance(model_type, str) else type(model_type).__name__
        raise ValueError(f"config: model_type {shown!r} is not a family tinygpt reads "
                         f"({', '.join(sorted(KNOWN))})")
    return importlib.import_module(f".{KNOWN[model_type]}", __name__)


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


