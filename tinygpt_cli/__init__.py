"""tinygpt: a command-line microscope for a small GPT-2-style language model, in NumPy."""

__version__ = "0.1.0"


def __getattr__(name: str):
    """`tinygpt_cli.load`, the notebook API (api.py), imported when first asked for: the
    command line never loads it."""
    if name in ("load", "HookedModel"):
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
