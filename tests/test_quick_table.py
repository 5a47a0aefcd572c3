"""QuickTable writes, where nothing is styled, exactly the characters Rich's own Table writes:
checked against Rich itself on generated tables (widths, justifications, wide characters,
padding, empty cells, too narrow a console), and it stays Rich's Table in a terminal."""

from __future__ import annotations

import io

from hypothesis import example, given, settings
from hypothesis import strategies as st
from rich.console import Console, Group
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from tinygpt_cli.render.quick_table import QuickTable

WORDS = st.text(alphabet=st.sampled_from(list("ab xyZ.␣…█é漢🙂-0123")), max_size=9)


def console(width: int, **kw) -> Console:
    return Console(file=io.StringIO(), width=width, markup=False, highlight=False,
                   emoji=False, soft_wrap=False, **kw)


def printed(table, width: int, **kw) -> str:
    c = console(width, **kw)
    c.print(Group(Text("above"), table))
    return c.file.getvalue()


@st.composite
def tables(draw):
    n_cols = draw(st.integers(1, 4))
    columns = [(draw(WORDS), draw(st.sampled_from(["left", "right", "center"])),
                draw(st.booleans()), draw(st.one_of(st.none(), st.integers(0, 6))),
                draw(st.sampled_from([None, "bold", "green"])),
                draw(st.one_of(st.none(), st.integers(1, 8))))
               for _ in range(n_cols)]
    rows = draw(st.lists(st.lists(st.one_of(WORDS, WORDS.map(lambda w: Text(w, style="bold"))),
                                  min_size=n_cols, max_size=n_cols), max_size=6))
    options = {"pad_edge": draw(st.booleans()), "show_header": draw(st.booleans()),
               "padding": draw(st.sampled_from([(0, 1), (0, 1, 0, 0), (0, 2, 0, 0), (0, 0)])),
               "show_edge": draw(st.booleans())}
    return columns, rows, options


def build(kind, columns, rows, options):
    t = kind(box=None, header_style="bold dim", **options)
    for header, justify, no_wrap, min_width, style, max_width in columns:
        t.add_column(header, justify=justify, no_wrap=no_wrap, min_width=min_width, style=style,
                     max_width=max_width, overflow="ellipsis")
    for row in rows:
        t.add_row(*[Text(c.plain, style=c.style) if isinstance(c, Text) else c for c in row])
    return t


@settings(max_examples=300, deadline=None)
@given(tables(), st.integers(1, 60))
def test_it_prints_what_rich_prints(spec, width):
    assert printed(build(QuickTable, *spec), width) == printed(build(Table, *spec), width)


@settings(max_examples=150, deadline=None)
@given(tables())
def test_it_measures_as_rich_measures(spec):
    c = console(10**6)
    quick = Measurement.get(c, c.options, build(QuickTable, *spec))
    rich = Measurement.get(c, c.options, build(Table, *spec))
    assert quick == rich


def test_in_a_terminal_it_is_riches_own_table():
    spec = ([("token", "left", True, None, "bold", None), ("p", "right", True, None, None, None)],
            [["␣her", "0.5"], [Text("␣a", style="bold"), "0.25"]], {"pad_edge": False})
    kw = {"force_terminal": True, "color_system": "truecolor"}
    out = printed(build(QuickTable, *spec), 40, **kw)
    assert out == printed(build(Table, *spec), 40, **kw) and "\x1b[" in out


def test_a_line_break_in_a_cell_is_left_to_rich():
    spec = ([("a", "left", True, None, None, None)], [["x\u2028y"], ["one\ttwo"]], {})
    assert printed(build(QuickTable, *spec), 30) == printed(build(Table, *spec), 30)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab x.␣…é漢🙂\t\x1b\u2028\x85")), max_size=30),
       st.integers(1, 40))
@example("aa\u2028", 10)  # a line separator at the end: Rich drops it (found by hypothesis)
def test_print_line_prints_what_rich_prints(words, width):
    from tinygpt_cli.render.quick_table import print_line

    text = Text("line 1: ", style="bold magenta") + Text(words)
    quick, rich = console(width), console(width)
    print_line(quick, text)
    rich.print(text)
    assert quick.file.getvalue() == rich.file.getvalue()
    quiet = console(width, quiet=True)
    print_line(quiet, text)
    assert quiet.file.getvalue() == ""


# ------------------------------------------------------------------ QuickConsole: whole views

def _printed(console_type, view, width: int) -> str:
    import io as _io

    out = _io.StringIO()
    console_type(file=out, width=width, color_system=None, markup=False, highlight=False,
                 emoji=False, soft_wrap=False).print(view)
    return out.getvalue()


_words = st.text(st.sampled_from("ab é 🙂 中文 ...,\n-\u00a0\u200b\tx"), max_size=40)


@settings(max_examples=300, deadline=None)
@given(st.lists(_words, min_size=1, max_size=6), st.integers(8, 130), st.booleans())
def test_quick_console_prints_a_view_as_rich_does(texts, width, styled):
    """Texts (one line, wrapped, with line breaks), Fields, ranked tables and Groups of them:
    the same characters as Rich's Console, at any width, less the spaces ending a line."""
    from rich.console import Console, Group
    from rich.text import Text

    from tinygpt_cli.render.quick_table import QuickConsole
    from tinygpt_cli.render.tables import Fields, WhenStyled, top_table

    parts = [Text(t, style="bold" if styled else "") for t in texts]
    fields = Fields([Text(t.replace("\n", " ")) for t in texts])
    rows = [{"id": i, "token": t[:6], "chance": 1 / (i + 2)} for i, t in enumerate(texts)]
    for view in (*parts, fields, top_table(rows, "chance", bar_of="chance"),
                 Group(fields, *parts, WhenStyled(Text("legend"))),
                 Group(Text(""), top_table(rows, "chance"))):
        # the same characters, but for the spaces Rich pads a line's end with (QuickConsole
        # drops them where nothing is styled, by either of its layouts)
        rich = "".join(line.rstrip(" ") + "\n" for line in
                       _printed(Console, view, width).splitlines())
        assert _printed(QuickConsole, view, width) == rich


def test_a_token_longer_than_the_width_is_cut_never_the_rank_id_or_value():
    """Gemma's vocabulary has runs of 31 spaces, a trained one whole lines: the probs table
    at 40 and 80 columns once cut the ids to '4…' and the chances to '0.0'."""
    from rich.console import Console

    from tinygpt_cli.render.tables import top_table

    long = "def square(x):\n    return x ** 2  # the square\n\tprint(square(3))\n"
    rows = [{"id": 47, "token": "<unused41>", "chance": 0.0381},
            {"id": 66012, "token": long, "chance": 0.0234}]
    for width in (40, 80):
        lines = _printed(Console, top_table(rows, "chance", bar_of="chance"), width).splitlines()
        assert all(len(line) <= width for line in lines)
        assert lines[0].split() == ["#", "id", "token", "chance"]
        first, second = lines[1].split(), lines[2].split()
        assert first[:3] == ["1", "47", "<unused41>"] and first[3] == "0.038"
        assert second[:2] == ["2", "66012"] and second[2].endswith("…") and second[3] == "0.023"
