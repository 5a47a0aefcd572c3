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

from types import ModuleType

# model_type -> module; imported when first asked for (start-up reads one config)
KNOWN = {"gpt2": "gpt2", "gpt_neo": "gpt_neo", "gpt_neox": "gpt_neox", "llama": "llama",
         "qwen2": "llama", "qwen3": "llama", "gemma3_text": "gemma3"}


def family(model_type: str) -> ModuleType:
    import importlib

    if model_type == "gemma3":
        raise ValueError("config: model_type 'gemma3' is Gemma 3 with its vision tower "
                         "(Gemma3ForConditionalGeneration); tinygpt reads the text model alone "
                         "(model_type 'gemma3_text', Gemma3ForCausalLM)")
    if model_type not in KNOWN:
        shown = model_type if isinstance(model_type, str) else type(model_type).__name__
        raise ValueError(f"config: model_type {shown!r} is not a family tinygpt reads "
                         f"({', '.join(sorted(KNOWN))})")
    return importlib.import_module(f".{KNOWN[model_type]}", __name__)
