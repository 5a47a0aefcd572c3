"""Where a command's output goes: stdout and stderr consoles (markup off, widths that suit a
terminal or a pipe), --save pictures written atomically, --quiet, and the line that starts
every view and picture of a changed (steered or ablated) run. --quiet and that line are the
command's run context's (context.RunContext: `quiet`, `changed`), passed to each function.

Imported when the commands are registered: Rich and the SVG/HTML writers load inside the
functions that use them.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from ..errors import InputError
from ..escapes import escape_line
from ..storage.files import write_atomically
from .text import changed_note, steering_text

if TYPE_CHECKING:
    from rich.console import Console

    from ..cli.context import RunContext

PIPE_WIDTH = 120  # a pipe or file has no width; wide enough that header lines never wrap
MIN_WIDTH, TERMINAL_WIDTH = 20, 80  # a narrower stated width is a mistake: use the classic one


def checked_save(path: Path | None) -> Path | None:
    """--save's path, its format checked at once (not after the model has run)."""
    if path is not None:
        picture_format(path)
    return path


def picture_format(path: Path) -> str:
    """'svg', 'html' or 'png' from the extension of a --save path, checked before anything
    runs (a PNG's renderer too)."""
    kind = {".svg": "svg", ".html": "html", ".htm": "html", ".png": "png"}.get(
        path.suffix.lower())
    if kind is None:
        raise InputError(f"--save {path}: unknown extension {path.suffix or '(none)'!r}; use "
                         ".svg (a vector drawing), .html (a web page) or .png (an image)")
    if not path.parent.is_dir():
        raise InputError(f"--save {path}: the folder {path.parent} "
                         + ("is a file" if path.parent.exists() else "does not exist"))
    if path.is_dir():
        raise InputError(f"--save {path}: that is a folder; give a file name ending .svg, "
                         ".html or .png")
    if kind == "png":
        from .png import check_available

        check_available(path)
    return kind


ARRAY_FORMATS = (".npy", ".safetensors")


def checked_arrays(path: Path | None) -> Path | None:
    """trace's --save path, its format checked at once: .npy (one value) or .safetensors."""
    if path is None:
        return None
    path = Path(path)
    if path.suffix not in ARRAY_FORMATS:
        raise InputError(f"--save {path}: unknown extension {path.suffix or '(none)'!r}; use "
                         ".npy (one value) or .safetensors (values by their trace names)")
    if path.is_dir():
        raise InputError(f"--save {path}: that is a folder; give a file name ending .npy or "
                         ".safetensors")
    return path


def save_arrays(context: RunContext, path: Path, arrays: dict, force: bool = False) -> None:
    """Write `arrays` ({trace name: array}) to the --save path atomically: .npy holds one
    (NumPy's format, no pickles), .safetensors any number under their names."""

    import numpy as np

    check_save(path, force)
    if path.suffix == ".npy":
        if len(arrays) != 1:
            raise InputError(f"--save {path}: a .npy file holds one value and these are "
                             f"{len(arrays)}; give one PATH, or a .safetensors file")
        buf = io.BytesIO()
        np.save(buf, np.asarray(next(iter(arrays.values()))), allow_pickle=False)
        data = buf.getvalue()
    else:
        from ..storage.safetensors import safetensors_bytes

        arrays = {k: np.asarray(v) for k, v in arrays.items()}
        text = [k for k, v in arrays.items() if v.dtype.kind not in "biuf"]
        if text:  # safetensors holds numbers only
            raise InputError(f"--save {path}: {text[0]} is text, which a .safetensors file "
                             "cannot hold; save it to a .npy file (or save ids)")
        data = safetensors_bytes(arrays)
    write_atomically(path, data)
    if not context.quiet:

        stderr().print(f"wrote {escape_line(str(path))}", style="dim", soft_wrap=True)


def save_figure(context: RunContext, figure, path: Path | None, force: bool = False) -> None:
    """Write `figure` (render.figure.Figure) to the --save path, if one was given: SVG or HTML
    by the extension, atomically, never over an existing file without --force. Call it before
    printing the terminal view, so a refusal is the only output."""
    if path is None:
        return
    path = Path(path)
    kind = picture_format(path)
    check_save(path, force)
    from . import html, svg

    figure = noted(context, figure)
    if kind == "png":
        from .png import png_bytes

        data = png_bytes(svg.document(figure))
    else:
        data = (svg.document if kind == "svg" else html.document)(figure).encode("utf-8")
    write_atomically(path, data)
    if not context.quiet:  # where the picture went, as a note on stderr (--quiet: nothing)

        stderr().print(f"wrote {escape_line(str(path))}", style="dim", soft_wrap=True)


def noted(context: RunContext, figure):
    """The figure, headed by what was changed (steered, ablated) when the run was changed: a
    picture of a changed run says so first, as its view does."""
    if not context.changed:
        return figure

    from .figure import Note

    return replace(figure, parts=[*(Note(line) for line in context.changed.splitlines()),
                                  *figure.parts])


def check_save(path: Path | None, force: bool) -> None:
    """Refuse an existing --save file without --force: save_figure does it when it writes; a
    command that prints before its picture is ready calls this first."""
    if path is not None and Path(path).exists() and not force:
        raise InputError(f"--save {path}: the file exists; add --force to overwrite it")


def check_out(out: Path | None, force: bool, *, example: str = "--out FILE.safetensors",
              folder_made: bool = False, option: str = "--out",
              default: Path | None = None) -> None:
    """--out FILE (means, steer, probe), before any work: refuse a folder ('' is '.', one
    too), a folder that is not there (unless the command makes it: `folder_made`), or an
    existing file without --force; with no --out, the `default` file too (check_default)."""

    if out is None:
        return None if default is None else check_default(default, force, option)
    if out.is_dir() or str(out) in ("", "."):
        raise InputError(f"{option} {escape_line(str(out))}: that is a folder; give a file "
                         f"name, e.g. {example}")
    if not folder_made and not out.parent.is_dir():
        raise InputError(f"{option} {out}: the folder {out.parent} does not exist")
    if out.exists() and not force:
        raise InputError(f"{option} {out}: the file exists; add --force to overwrite it")


def refuse_inside_package(path: Path, option: str | None) -> None:
    """InputError when a command's default file is in the installed package (the weights
    shipped inside it): a reinstall would replace it, and it is often not the user's to
    write."""
    from ..storage.madefor import inside_package

    if option is not None and inside_package(path):
        raise InputError(f"{escape_line(str(path))} is inside the installed package, which "
                         f"tinygpt does not write into: give {option} with a path outside it")


def check_default(path: Path, force: bool, option: str | None = "--out") -> None:
    """The file a command writes when `option` is not given (the weights folder's sae/,
    lens/, means; the model card, which has no option): never overwritten without --force,
    never written into the installed package's own folder."""

    refuse_inside_package(path, option)
    if (path.exists() or path.is_symlink()) and not force:
        raise InputError(f"{escape_line(str(path))} exists: add --force to overwrite it"
                         if option is None else f"{escape_line(str(path))} exists (the "
                         f"default {option}): add --force to overwrite it, or {option} FILE "
                         "for another file")


def stdout(context: RunContext, width: int | None = None) -> Console:
    """Markup and highlighting off: text from the user or the model is shown literally.
    The width is the terminal's, or $COLUMNS, or pipe_width() for a pipe. Nothing is printed
    under --quiet; the first console of a changed run prints what was changed."""
    from .quick_table import QuickConsole as Console  # a view in a pipe laid out directly

    console = Console(markup=False, highlight=False, emoji=False, soft_wrap=False, width=width,
                      quiet=context.quiet)
    if context.changed:  # the view of a changed run says so first, whatever view it is
        from rich.text import Text

        note, context.changed = context.changed, None
        stdout(context, width).print(Text(note, style="bold magenta"))
    # the width set on the console made (as if it were made with it: one Console, not two,
    # for each view of --each-line's thousands)
    if width is None and not console.is_terminal and not _columns():
        console.width = pipe_width()
    elif width is None and console.width < MIN_WIDTH:  # COLUMNS=0 on a terminal: no view
        console.width = TERMINAL_WIDTH
    return console


def _columns() -> int | None:
    value = os.environ.get("COLUMNS", "")
    return int(value) if value.isdigit() and int(value) >= MIN_WIDTH else None


def wide(context: RunContext, *renderables) -> Console:
    """stdout, widened to the natural width of the renderables, so that a table of numbers
    (--full, a heatmap of a long text) is never cut at the edge: a terminal wraps the long
    lines and a pipe keeps them whole."""
    console = stdout(context)
    options = console.options.update_width(10**5)
    need = max(console.measure(r, options=options).maximum for r in renderables)
    return stdout(context, width=need) if need > console.width else console


def stderr():
    from rich.console import Console

    console = Console(stderr=True, markup=False, highlight=False, emoji=False)
    if console.width < MIN_WIDTH:  # COLUMNS=0: notes would print nothing
        console = Console(stderr=True, markup=False, highlight=False, emoji=False,
                          width=TERMINAL_WIDTH)
    return console


def set_changed(context: RunContext, changes: dict | None) -> None:
    """What a terminal view (and a saved picture) of a changed run starts with; nothing for a
    clean run. JSON documents say it in their "steered" and "ablated" fields instead."""

    context.changed = changed_note(changes) if changes else None


def say_steered(d: dict) -> None:
    """Every steered run is announced by this line on stderr (its views and JSON say it too):
    `d` is the steering's description (jobs.steer.steering_hook)."""

    stderr().print(f"steered: {steering_text(d)}", style="bold yellow", soft_wrap=True)


def show_view(context: RunContext, view, full: bool = False, measured=None) -> None:
    """Print a view on stdout; with `full` (every column) as wide as the renderables
    `measured` (default: the view) need, which a terminal wraps and a pipe keeps whole.

    A view with `lines(width)` and `renderables()` (render.heads) is written as its plain
    lines where nothing is styled and it can lay them out, without loading Rich; anywhere
    else its renderables are printed."""
    if hasattr(view, "lines"):
        width = plain_width(context)
        lines = view.lines(width) if width is not None else None
        if lines is not None:
            if not context.quiet:
                sys.stdout.write("".join(line.rstrip(" ") + "\n" for line in lines))
                sys.stdout.flush()
            return
        view, measured = view.renderables()
    (wide(context, *(measured or [view])) if full else stdout(context)).print(view)


def plain_width(context: RunContext) -> int | None:
    """The width stdout() would have where it would show no styles (a pipe or a file, as Rich
    decides it: no FORCE_COLOR or TTY_COMPATIBLE, not a terminal, not a notebook), with no
    changed run's note to show first; else None."""
    if context.changed or any(v in os.environ for v in ("FORCE_COLOR", "TTY_COMPATIBLE")):
        return None
    if "IPython" in sys.modules:  # a notebook's console is Rich's own kind
        return None
    try:
        if sys.stdout.isatty():
            return None
    except (AttributeError, ValueError):  # no stream, or a closed one: Rich's own handling
        return None
    return _columns() or pipe_width()


def pipe_width() -> int:
    """The width of a view sent into a pipe or a file: that of the terminal the command was
    typed at, when its stderr still is one (`tinygpt trace ... | head` is read there), else
    PIPE_WIDTH."""
    try:
        if sys.stderr.isatty():
            return max(os.get_terminal_size(sys.stderr.fileno()).columns, MIN_WIDTH)
    except (AttributeError, ValueError, OSError):  # no stream, a closed one, or no size
        pass
    return PIPE_WIDTH


def at_least(context: RunContext, width: int):
    """stdout, widened to `width` columns when the view needs more (a grid of many stages or
    heads). The width is counted from the grid's shape: measuring a large Rich table first
    costs as much as printing it."""
    out = stdout(context)
    return stdout(context, width=width) if width > out.width else out


class Presented(NamedTuple):
    """What a command handed to present(), kept (context.presented) instead of printed: the
    functions that make its JSON document, its terminal view and its picture (None: it has
    none), how the view is printed (present's `console` and `show`), and the note a changed
    run's view and picture start with."""

    document: Callable
    view: Callable
    figure: Callable | None
    console: Callable | None
    show: Callable | None
    changed: str | None


def present(context: RunContext, as_json: bool, document, view, *, figure=None,
            save: Path | None = None, force: bool = False, console=None, show=None) -> None:
    """A command's result, out, the one exit of every command: its picture first (--save: a
    refusal is then the only output), then one JSON document on stdout, or the terminal
    view. `document`, `view` and `figure` are functions of nothing, called only for the
    output asked for, so a view's Rich and a picture's modules load only then.
    `console(view)`: the console a view that may be wide is printed on (default:
    stdout(context)); `show(view)`, instead, prints what `view()` made itself (a view with
    plain lines, several parts, raw text)."""
    if save is not None and figure is not None:
        save_figure(context, figure(), save, force)
    if context.cut:  # --last cut the text: every document says so
        document = _with_cut(document, context.cut)
    if context.presented is not None:  # kept for a program (tinygpt_cli.surfaces.api), not printed
        context.presented.append(Presented(document, view, figure, console, show,
                                           context.changed))
        context.changed = None
        return
    if context.cut and not context.quiet:
        last, dropped = context.cut["last"], context.cut["dropped"]
        stderr().print(f"note: --last {last}: read the text's last {last} tokens, "
                       f"{dropped:,} before them left out", style="dim", soft_wrap=True)
    if as_json:
        from .jsonout import emit

        emit(document())
        return
    shown = view()
    if show is not None:
        show(shown)
        return
    (console(shown) if console is not None else stdout(context)).print(shown)


def _with_cut(document, cut: dict):
    """The document function, its dict carrying "cut": {"last": N, "dropped": tokens}."""
    def made():
        d = document()
        return {**d, "cut": cut} if isinstance(d, dict) else d
    return made


def save_page(context: RunContext, html: str, path: Path) -> None:
    """Write a page made whole by its command (graph's viewer) to --save, atomically, and say
    where it went (as save_figure does; --force was checked before any work)."""
    write_atomically(Path(path), html.encode("utf-8"))
    if not context.quiet:

        stderr().print(f"wrote {escape_line(str(path))}", style="dim", soft_wrap=True)
