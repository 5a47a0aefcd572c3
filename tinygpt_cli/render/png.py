"""--save x.png: the SVG drawing rasterised by resvg (the `png` extra), with no browser.

resvg renders SVG as the specification says, text with the system's fonts; the picture is
the same drawing --save x.svg writes, at its own size in pixels, on white."""

from __future__ import annotations

import importlib.util

from ..errors import InputError

EXTRA = 'pip install "tinygpt-cli[png]"'


def check_available(path) -> None:
    """Refuse a .png path before anything runs when resvg is not installed."""
    if importlib.util.find_spec("resvg_py") is None:
        raise InputError(f"--save {path}: a PNG needs resvg, the png extra: {EXTRA} (or save "
                         ".svg or .html, which need nothing)")


def png_bytes(svg_text: str) -> bytes:
    import resvg_py

    return bytes(resvg_py.svg_to_bytes(svg_string=svg_text, background="#ffffff"))
