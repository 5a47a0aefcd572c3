"""tinygpt from Python and notebooks, in TransformerLens's words where it has them:

    import tinygpt_cli as tg
    model = tg.load()                                  # the shipped model (or a weights folder)
    logits, cache = model.run_with_cache("Lily wanted to play with her")
    cache["layers.0.heads.0.weights"]                  # = cache["blocks.0.attn.hook_pattern"][0]
    model.run_with_hooks(text, fwd_hooks=[("blocks.0.hook_mlp_out", lambda x, hook: 0 * x)])
    model.attn(text, layer=0, head=0)                  # every command, as a function
    model.lens(text, target=" toys")["stages"]         # its --json document, as a dict

Every command of `tinygpt --help` is a method of the model, named as the command (`final-norm`
is `final_norm`, `sae feature` is `sae_feature`), taking the command's arguments by position
and its options by their words (`--all-heads` is `all_heads=True`, `--sum` is `sum=True`; the
Python names of the command's function work too): it runs the command
itself (calls.argv spells the command line; nothing here knows one command from another) and
returns a Result, whose `.document` is what the command's --json prints and which a notebook
shows as the picture its --save writes (`_repr_svg_`, `_repr_html_`; no network).
"""

from __future__ import annotations

import functools
import html as html_text
import io
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from .errors import InputError
from .trace import Trace


def load(weights: str | Path | None = None, threads: int | None = None) -> HookedModel:
    """The model of a weights folder, as `--weights` names it (None: $TINYGPT_WEIGHTS, then
    the shipped model), loaded once; its commands reuse it. The math runs on `threads`
    threads, as the command line's does (default: one, or $TINYGPT_THREADS; the BLAS
    variables when set), so that its numbers are the command line's bit for bit."""
    import os

    from . import threads as pools
    from .weights import load_model

    n = pools.chosen(threads)
    if n is not None or not any(v in os.environ for v in pools.BLAS_VARS):
        pools.use(n or pools.DEFAULT)

    opened: dict = {}
    return HookedModel(load_model(weights, opened=opened), weights, opened)


class HookPoint(NamedTuple):
    """What a hook function of run_with_hooks gets beside the value: the name it was given."""

    name: str


class HookedModel:
    """A loaded model: runs, caches and hooks of texts, and every command as a method."""

    def __init__(self, model, weights=None, opened: dict | None = None):
        self.model, self.weights, self.opened = model, weights, opened

    config = property(lambda self: self.model.config)
    tokenizer = property(lambda self: self.model.tokenizer)
    folder = property(lambda self: self.model.folder)

    def __repr__(self) -> str:
        c = self.config
        return (f"<tinygpt model {self.folder.name}: {c.n_layer} blocks of {c.n_head} heads, "
                f"d = {c.n_embd}, {c.vocab_size:,} tokens>")

    def session(self, text: str):
        """A Session (session.py) of this model and the text: what the analyses take."""
        from .session import Session

        return Session.open(text, model=self.model)

    def to_tokens(self, text: str) -> list[int]:
        return self.session(text).ids

    def to_str_tokens(self, text: str) -> list[str]:
        return self.session(text).tokens

    def __call__(self, text: str) -> np.ndarray:
        """The logits, [T, vocab]."""
        return self.session(text).run()

    def run_with_cache(self, text: str, names: Iterable[str] | None = None
                       ) -> tuple[np.ndarray, Cache]:
        """(logits [T, vocab], the Cache of every value), or of only the values `names`
        names (any spelling: a tinygpt path, a TransformerLens hook name)."""
        s = self.session(text)
        if names is None:
            t = s.trace()
            return t["logits"], Cache(t.values, t.config, t.tokens)
        from .hooks import hooked_path

        wanted = {hooked_path(n, s.config, "run_with_cache") for n in names} | {"ids"}
        logits, values = s.record(wanted)
        return logits, Cache(values, s.config, s.tokens)

    def run_with_hooks(self, text: str, fwd_hooks: Iterable[tuple[str, Callable]] = ()
                       ) -> np.ndarray:
        """The logits of a run in which each hook function `fn(value, hook)` sees the value
        it names (hook.name: the name as given) and what it returns is used instead (None:
        the value as it is, changed in place or not). A name of no value, or of one the run
        never reaches, raises PathError with the command line's suggestions."""
        from .hooks import Chain, Replace

        def use(fn, name):
            def replaced(x):
                out = fn(x, HookPoint(name))
                return x if out is None else out
            return replaced

        hooks = [Replace({name: use(fn, name)}) for name, fn in fwd_hooks]
        return self.session(text).run(hooks=Chain(*hooks) if hooks else None)

    # ------------------------------------------------------------ the commands

    def commands(self) -> list[str]:
        """Every command, by the name of its method."""
        return [name.replace("-", "_").replace(" ", "_") for name in _commands()]

    def __dir__(self):
        return [*super().__dir__(), *self.commands()]

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        found = {n.replace("-", "_").replace(" ", "_"): n for n in _commands()}
        if name not in found:
            raise AttributeError(f"{type(self).__name__!r} has no attribute or command "
                                 f"{name!r}")
        return functools.partial(self.command, found[name])

    def command(self, name: str, *arguments, **options) -> Result | None:
        """Run command `name` (as `tinygpt NAME` names it) on this model: its arguments in
        order (the text first), its options by Python name. Bad input raises InputError
        with the command line's message; generate prints its text as it goes, then returns
        its summary (the whole text as `result["data"]`, its ids and tokens, the seed)."""
        from . import calls
        from .context import RunContext

        command = _commands()[name]
        params = calls.parameters(command)
        positional = [p.name for p in params if p.option is None]
        if len(arguments) > len(positional):
            raise InputError(f"{name} takes {len(positional)} arguments "
                             f"({', '.join(positional)}), not {len(arguments)}")
        words = {p.word: p.name for p in params}  # --sum's word or its Python name (total)
        given = {**dict(zip(positional, arguments, strict=False)),
                 **{words.get(k, k): v for k, v in options.items()}}
        args = calls.argv(name, params, given)
        context = RunContext(weights=self.weights, opened=self.opened, presented=[])
        _run(args, context)
        return Result(name, context.presented[-1]) if context.presented else None


@functools.cache
def _commands() -> dict:
    from . import calls

    return calls.commands()


def _run(args: list[str], context) -> None:
    """The command line, run by the CLI's own group as the shell's is (batch.main: --chat);
    a usage error becomes InputError."""
    from . import calls
    from .cli import batch
    from .cli.typer_tricks import click_errors

    try:
        batch.main(calls.group(), args, context)
    except click_errors.UsageError as e:
        raise InputError(e.format_message()) from None


class Cache(Trace):
    """The values of one run (a Trace: `cache[path]` takes every spelling, TransformerLens's
    hook names too), and the picture of any of them."""

    def __repr__(self) -> str:
        return super().__repr__().replace("<Trace", "<Cache", 1)

    def picture(self, path: str) -> Picture:
        """The value drawn as the card commands' --save draws it: an attention grid as a
        heatmap over the tokens, any other value as a heatmap of its rows."""
        from .render import figure

        value = self[path]
        name, rows = self.canonical(path)
        shown = name + "".join(f"[{i}]" for i in rows)
        if name.endswith((".weights", ".scores")) and np.ndim(value) in (2, 3):
            return Picture(figure.attention_figure(shown, value, self.tokens,
                                                   scores=name.endswith(".scores")))
        return Picture(figure.value_figure(shown, value, self.tokens))


class Picture:
    """A figure (render.figure) that a notebook shows as --save writes it: `_repr_svg_` the
    .svg file's text, `_repr_html_` the .html page's, inside an iframe of its own (its styles
    and script stay in it); both offline."""

    def __init__(self, figure):
        self.figure = figure

    def svg(self) -> str:
        from .render import svg

        return svg.document(self.figure)

    def html(self) -> str:
        from .render import html

        return html.document(self.figure)

    def __repr__(self) -> str:  # a notebook's text/plain beside the picture
        return f"<tinygpt picture: {self.figure.title}>"

    def _repr_svg_(self) -> str:
        return self.svg()

    def _repr_html_(self) -> str:
        height = _svg_height(self.svg()) + 200  # the page's heading and footer, until the
        fit = "this.style.height = this.contentDocument.documentElement.scrollHeight + 'px'"
        return (f'<iframe srcdoc="{html_text.escape(self.html(), quote=True)}" '  # page's known
                f'style="width: 100%; height: {height}px; border: 0" onload="{fit}" '
                f'title="{html_text.escape(self.figure.title, quote=True)}"></iframe>')

    def save(self, path: str | Path, force: bool = False) -> None:
        """Write it as --save does: .svg or .html by the extension, atomically, never over a
        file without force."""
        from .context import RunContext
        from .render.output import save_figure

        save_figure(RunContext(quiet=True), self.figure, Path(path), force)


def _svg_height(svg: str) -> int:
    import re

    m = re.search(r'<svg[^>]*\sheight="([\d.]+)', svg)
    return int(float(m[1])) if m else 480


class Result:
    """What one command gave: `.document` (the dict its --json prints; `result[key]` reads
    it), `.json` (that text), `.picture` (what its --save draws, None for a command that
    draws nothing), shown in a notebook as that picture; `.show()` prints its terminal view."""

    def __init__(self, command: str, presented):
        self.command, self.presented = command, presented

    @functools.cached_property
    def json(self) -> str:
        from .render.jsonout import emit

        out = io.StringIO()
        emit(self.presented.document(), stream=out)
        return out.getvalue()

    @functools.cached_property
    def document(self) -> dict:
        return json.loads(self.json)

    def __getitem__(self, key: str) -> Any:
        return self.document[key]

    def keys(self):
        return self.document.keys()

    @functools.cached_property
    def picture(self) -> Picture | None:
        if self.presented.figure is None:
            return None
        from .context import RunContext
        from .render.output import noted

        return Picture(noted(RunContext(changed=self.presented.changed),
                             self.presented.figure()))

    def _repr_svg_(self) -> str | None:
        return None if self.picture is None else self.picture._repr_svg_()

    def _repr_html_(self) -> str | None:
        return None if self.picture is None else self.picture._repr_html_()

    def save(self, path: str | Path, force: bool = False) -> None:
        if self.picture is None:
            raise InputError(f"{self.command} draws no picture")
        self.picture.save(path, force)

    def show(self) -> None:
        """Print the terminal view, as the command line prints it."""
        from .context import RunContext
        from .render.output import present

        p = self.presented
        present(RunContext(changed=p.changed), False, p.document, p.view, console=p.console,
                show=p.show)

    def __repr__(self) -> str:
        keys = list(self.keys())
        shown = ", ".join(keys[:6]) + (f", ... ({len(keys)} fields)" if len(keys) > 6 else "")
        drawn = "; shown as its picture" if self.presented.figure is not None else ""
        return f"<tinygpt {self.command} result: {shown}{drawn}>"
