"""`attn`'s one-head view laid out without Rich (render.heads) writes exactly the characters
Rich writes for the same view where nothing is styled: checked against Rich itself on
generated grids (weights, scores with -inf and large or negative numbers, texts long enough
to need the `…` column, narrow and wide consoles, --full), and it gives way to Rich wherever
its characters might differ (wide characters, a header wider than the line)."""

from __future__ import annotations

import io

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st
from rich.console import Console

from tinygpt_cli.render.heads import HeadView

PIECES = st.text(alphabet=st.sampled_from(list("ab Zy.,'\n\té…·-0123")), min_size=1,
                 max_size=16)


def rich_lines(view: HeadView, width: int) -> list[str]:
    """What output.show_view prints through Rich on a console with no styles."""
    renderable, measured = view.renderables()
    c = Console(file=io.StringIO(), width=width, markup=False, highlight=False, emoji=False,
                soft_wrap=False, color_system=None)
    if view.full:  # output.wide: as wide as the heatmap needs
        need = c.measure(measured[0], options=c.options.update_width(10**5)).maximum
        if need > width:
            c = Console(file=io.StringIO(), width=need, markup=False, highlight=False,
                        emoji=False, soft_wrap=False, color_system=None)
    c.print(renderable)
    return c.file.getvalue().split("\n")[:-1]


def grid_of(t: int, scores: bool, seed: int, scale: float) -> np.ndarray:
    rng = np.random.default_rng(seed)
    z = (rng.standard_normal((t, t)) * scale).astype(np.float32)
    z[np.triu_indices(t, 1)] = -np.inf
    if scores:
        return z
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 40), st.booleans(), st.integers(0, 10**6),
       st.sampled_from([0.5, 3.0, 40.0, 400.0]), st.integers(20, 220), st.booleans(),
       st.lists(PIECES, min_size=40, max_size=40))
@example(6, False, 0, 1.0, 120, False, ["Lily", " wanted", " to", " play", " with", " her"]
         + ["x"] * 34)
def test_the_plain_lines_are_what_rich_prints(t, scores, seed, scale, width, full, tokens):
    view = HeadView(f"layers.0.heads.0.{'scores' if scores else 'weights'}",
                    grid_of(t, scores, seed, scale), tokens[:t], scores, full)
    lines = view.lines(width)
    if lines is not None:
        assert lines == rich_lines(view, width)


def test_it_lays_out_the_usual_cases_itself():
    """Short and long texts of plain tokens, narrow and wide: no fallback to Rich."""
    for t, width in ((6, 120), (40, 120), (40, 80), (3, 80), (128, 120)):
        view = HeadView("layers.1.heads.2.weights", grid_of(t, False, t, 1.0),
                        [" word"] * t, False, False)
        assert view.lines(width) == rich_lines(view, width), (t, width)


def test_it_gives_way_to_rich_where_widths_could_differ():
    grid = grid_of(3, False, 0, 1.0)
    assert HeadView("p", grid, ["漢字", "a", "b"], False, False).lines(120) is None  # wide
    assert HeadView("p", grid, ["e\u0301", "a", "b"], False, False).lines(120) is None
    assert HeadView("layers.0.heads.0.weights", grid, ["a", "b", "c"], False,
                    False).lines(20) is None  # the header's path alone fills the line
