"""tinygpt: a command-line microscope for a small GPT-2-style language model, in NumPy."""

import importlib

__version__ = "0.1.0"

# What `tinygpt_cli.NAME` gives from the module that defines it, imported when first asked for
# (PEP 562): `import tinygpt_cli as tg; tg.load()` is the notebook API (api.py), which the
# command line never loads. tests/test_structure.py reads this table: `from tinygpt_cli import
# load` imports api.
LAZY = {"load": "surfaces.api", "HookedModel": "surfaces.api"}


def __getattr__(name: str):
    if name in LAZY:

        return getattr(importlib.import_module(f".{LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
