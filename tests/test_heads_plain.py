"""`attn`'s one-head view laid out without Rich (render.heads) writes exactly the characters
Rich writes for the same view where nothing is styled: checked against Rich itself on
generated grids (weights, scores with -inf and large or negative numbers, texts long enough
to need the `…` column, narrow and wide consoles, --full), and it gives way to Rich wherever
its characters might differ (wide characters, a header wider than the line)."""

from __future__ import annotations

import io

import numpy as np
import pytest
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


def printed(renderable, width: int) -> list[str]:
    c = Console(file=io.StringIO(), width=width, markup=False, highlight=False, emoji=False,
                soft_wrap=False, color_system=None)
    c.print(renderable)
    return c.file.getvalue().rstrip("\n").split("\n")


@pytest.mark.parametrize("scores", [False, True])
@pytest.mark.parametrize("window", [0, 3])
def test_the_note_names_the_marks_the_cells_show_one_head_and_every_head(scores, window):
    """The note under the grid says what the cells show: `--scores` said "-inf above the
    diagonal" where the cells show `·` (and nothing of a sliding block's `-`), and
    `--all-heads` had no "rows: ... columns: ..." line at all. Both views now end in the same
    note, which names each mark drawn (a weight's dot is its 0), and for scores that its keys
    are masked to -inf."""
    from tinygpt_cli.render.cards import heads_view

    t, tokens = 7, ["Lily", " wanted", " to", " play", " with", " her", " ball"]
    grid = grid_of(t, scores, 1, 3.0)
    if window:
        grid[np.tril_indices(t, -window)] = -np.inf if scores else 0.0
    view = HeadView("layers.0.heads.0.scores", grid, tokens, scores, False, window)
    one = view.lines(300) or rich_lines(view, 300)
    every, _ = heads_view("layers.0.scores", np.stack([grid, grid]), tokens, scores, False,
                          window)
    every = printed(every, 300)
    assert one[-1] == every[-1]  # the same note, the last line of each
    note = one[-1]
    assert note.startswith("rows: the token looking; columns: the tokens it looks at")
    cells = " ".join(line.split(maxsplit=2)[-1] for line in one[2:-1])
    drawn = [m for m in "·-" if f" {m} " in f" {cells} "]
    assert drawn == (["·", "-"] if window else ["·"])
    clauses = dict(c.split(": ", 1) for c in note.split("; ")[2:] if c[1:3] == ": ")
    # each mark drawn is said, none that is not (the weights' dots: a weight of 0, unsaid)
    assert set(clauses) == {m for m in drawn if scores or m == "-"}
    assert all(("-inf" in said) == scores for said in clauses.values())
    assert "each row sums to 1" in note.split("; ") or scores
    assert "above the diagonal" not in note
