"""tinygpt from Python and notebooks, in TransformerLens's words where it has them:

    import tinygpt_cli as tg
    model = tg.load()                                  # the shipped model (or a weights folder)
    logits, cache = model.run_with_cache("Lily wanted to play with her")
    cache["layers.0.heads.0.weights"]                  # = cache["pattern", 0][0]
    model.run_with_hooks(text, fwd_hooks=[("blocks.0.hook_mlp_out", lambda x, hook: 0 * x)])
    model(text, return_type="loss"), model.cfg.n_layers, model.W_Q[0]   # [n_heads, d, d_head]
    model.attn(text, layer=0, head=0)                  # every command, as a function
    model.lens(text, target=" toys")["stages"]         # its --json document, a read-only Mapping

Every command of `tinygpt --help` is a method of the model, named as the command (`final-norm`
is `final_norm`, `sae feature` is `sae_feature`), taking the command's arguments by position
and its options by their words (`--all-heads` is `all_heads=True`, `--sum` is `sum=True`; the
Python names of the command's function work too): it runs the command
itself (calls.argv spells the command line; nothing here knows one command from another) and
returns a Result, whose `.document` is what the command's --json prints and which a notebook
shows as the picture its --save writes (`_repr_svg_`, `_repr_html_`; no network). A call
prints nothing and reads no stdin; a value of the wrong type is one calls.ArgumentError (a
TypeError) naming the argument, checked against the command's own parameters.
"""

from __future__ import annotations

import contextlib
import functools
import html as html_text
import io
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ..cli import batch
from ..cli.context import RunContext
from ..cli.typer_tricks import click_errors
from ..errors import InputError
from ..jobs import threads as pools
from ..jobs.session import Session
from ..render import figure, html, svg
from ..render.jsonout import emit
from ..render.output import noted, present, save_figure
from ..transformer import model
from ..transformer.folder import load_model
from ..transformer.hooks import Chain, Replace, hooked_path
from ..transformer.ops import log_softmax
from ..transformer.schema import expand, lens_name
from ..transformer.trace import Trace
from . import calls
from .calls import ArgumentError, shown

__all__ = ["ArgumentError", "Cache", "HookedModel", "InputError", "Picture", "Result", "load"]


def load(weights: str | Path | None = None, threads: int | None = None) -> HookedModel:
    """The model of a weights folder, as `--weights` names it (None: $TINYGPT_WEIGHTS, then
    the shipped model), loaded once; its commands reuse it. The math runs on `threads`
    threads, as the command line's does (default: one, or $TINYGPT_THREADS; the BLAS
    variables when set), so that its numbers are the command line's bit for bit."""


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
        self._weights: dict[str, np.ndarray] = {}

    config = property(lambda self: self.model.config)
    tokenizer = property(lambda self: self.model.tokenizer)
    folder = property(lambda self: self.model.folder)

    def __repr__(self) -> str:
        c = self.config
        return (f"<tinygpt model {self.folder.name}: {c.n_layer} blocks of {c.n_head} heads, "
                f"d = {c.n_embd}, {c.vocab_size:,} tokens>")

    def session(self, text: str):
        """A Session (session.py) of this model and the text: what the analyses take."""

        return Session.open(_text(text), model=self.model)

    def to_tokens(self, text: str) -> list[int]:
        return self.session(text).ids

    def to_str_tokens(self, text: str) -> list[str]:
        return self.session(text).tokens

    def __call__(self, text: str, return_type: str | None = "logits",
                 loss_per_token: bool = False):
        """As TransformerLens's model(text, return_type=...): "logits" [T, vocab], "loss"
        (the mean next-token cross-entropy in nats, over the T - 1 predictions; with
        loss_per_token, each of them [T - 1]), "both" (logits, loss), or None (nothing)."""
        if return_type not in RETURN_TYPES:
            raise ValueError(f"return_type takes one of {', '.join(map(repr, RETURN_TYPES))}, "
                             f"not {return_type!r}")
        s = self.session(text)
        logits = s.run()
        if return_type == "logits":
            return logits
        if return_type is None:
            return None
        if s.T < 2:
            raise ValueError(f"a loss needs a text of two tokens or more; {text!r} is one")
        loss = next_token_loss(logits, np.asarray(s.ids), loss_per_token)
        return loss if return_type == "loss" else (logits, loss)

    def run_with_cache(self, text: str, names_filter=None, names=None
                       ) -> tuple[np.ndarray, Cache]:
        """(logits [T, vocab], the Cache of every value), or of only those `names_filter`
        keeps, as TransformerLens takes it: a name, a list of names (any spelling: a tinygpt
        path, a TransformerLens hook name), or a function of a name that says True to keep
        it (asked with each value's TransformerLens hook name, where it has one, and with
        its tinygpt path). `names` is the same as `names_filter`."""
        if names is not None and names_filter is not None:
            raise TypeError("run_with_cache takes names_filter or names, not both")
        wanted = names_filter if names_filter is not None else names
        s = self.session(text)
        if wanted is None:
            t = s.trace()
            return t["logits"], Cache(t.values, t.config, t.tokens)

        if callable(wanted):
            kept = {path for path, lens in hook_names(s.config)
                    if _kept(wanted, lens) or _kept(wanted, path)}
        else:
            kept = {hooked_path(n, s.config, "run_with_cache")
                    for n in _names(wanted, "names_filter")}
        logits, values = s.record(kept | {"ids"})
        return logits, Cache(values, s.config, s.tokens)

    def run_with_hooks(self, text: str, fwd_hooks: Iterable[tuple[str, Callable]] = ()
                       ) -> np.ndarray:
        """The logits of a run in which each hook function `fn(value, hook)` sees the value
        it names (hook.name: the name as given) and what it returns is used instead (None:
        the value as it is, changed in place or not). A name of no value, or of one the run
        never reaches, raises PathError with the command line's suggestions."""

        def use(fn, name):
            def replaced(x):
                out = fn(x, HookPoint(name))
                return x if out is None else out
            return replaced

        if isinstance(fwd_hooks, tuple) and len(fwd_hooks) == 2 and isinstance(fwd_hooks[0], str):
            fwd_hooks = [fwd_hooks]  # one (name, fn) pair
        pairs = list(fwd_hooks)
        for pair in pairs:
            if not (isinstance(pair, tuple | list) and len(pair) == 2
                    and isinstance(pair[0], str) and callable(pair[1])):
                raise TypeError(f"fwd_hooks takes a list of (name, function) pairs, not "
                                f"{pair!r}")
        hooks = [Replace({name: use(fn, name)}, who=f"the hook on {name}")
                 for name, fn in pairs]
        return self.session(text).run(hooks=Chain(*hooks) if hooks else None)

    # --------------------------------------------- the weights, as TransformerLens holds them

    @functools.cached_property
    def cfg(self) -> TLConfig:
        """The configuration in TransformerLens's words (n_layers, d_model, d_head, ...)."""
        return tl_config(self.config, self.folder.name)

    def _stacked(self, name: str) -> np.ndarray:
        if name not in self._weights:
            w = tl_weights(self.model.params, self.config, name)
            w.setflags(write=False)  # a copy: writing to it would change nothing
            self._weights[name] = w
        return self._weights[name]

    W_E = property(lambda self: self._stacked("W_E"))
    W_U = property(lambda self: self._stacked("W_U"))
    b_U = property(lambda self: self._stacked("b_U"))
    W_pos = property(lambda self: self._stacked("W_pos"))
    W_Q = property(lambda self: self._stacked("W_Q"))
    W_K = property(lambda self: self._stacked("W_K"))
    W_V = property(lambda self: self._stacked("W_V"))
    W_O = property(lambda self: self._stacked("W_O"))
    b_Q = property(lambda self: self._stacked("b_Q"))
    b_K = property(lambda self: self._stacked("b_K"))
    b_V = property(lambda self: self._stacked("b_V"))
    b_O = property(lambda self: self._stacked("b_O"))
    W_in = property(lambda self: self._stacked("W_in"))
    W_gate = property(lambda self: self._stacked("W_gate"))
    W_out = property(lambda self: self._stacked("W_out"))
    b_in = property(lambda self: self._stacked("b_in"))
    b_out = property(lambda self: self._stacked("b_out"))

    # ------------------------------------------------------------ the commands

    def commands(self) -> list[str]:
        """Every command, by the name of its method."""
        return [name.replace("-", "_").replace(" ", "_") for name in _commands()]

    def __dir__(self):
        return [*super().__dir__(), *self.commands()]

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if name in ("W_pos", "W_gate"):  # its property raised: say why, not "no attribute"
            tl_weights(self.model.params, self.config, name)
        found = {n.replace("-", "_").replace(" ", "_"): n for n in _commands()}
        if name not in found:
            raise AttributeError(f"{type(self).__name__!r} has no attribute or command "
                                 f"{name!r}")
        return functools.partial(self.command, found[name])

    def command(self, name: str, *arguments, **options) -> Result | None:
        """Run command `name` (as `tinygpt NAME` names it) on this model: its arguments in
        order (the text first), its options by Python name. Bad input raises InputError
        with the command line's message (a value of the wrong type: calls.ArgumentError, a
        TypeError too). It prints nothing: what the command says on stderr (a note, the
        seed it chose) is the result's `.notes`; generate returns its summary (the whole
        text as `result["data"]`, its ids and tokens, the seed)."""

        command = _commands()[name]
        params = calls.parameters(command)
        positional = [p.name for p in params if p.option is None]
        if len(arguments) > len(positional):
            raise InputError(f"{name} takes {len(positional)} arguments "
                             f"({', '.join(positional)}), not {len(arguments)}")
        words = {p.word: p.name for p in params}  # --sum's word or its Python name (total)
        given = {**dict(zip(positional, arguments, strict=False)),
                 **{words.get(k, k): v for k, v in options.items()}}
        for p in params:  # model.attn(None): as model(None), not "read stdin"
            if p.option is None and p.name in given and given[p.name] is None:
                takes = calls.TAKES[p.kind]
                raise ArgumentError(f"{name}: {p.word} takes "
                                    + (f"a list, each item {takes}" if p.multiple else takes)
                                    + ", not None")
        args = calls.argv(name, params, given)
        context = RunContext(weights=self.weights, opened=self.opened, presented=[])
        said = io.StringIO()
        # and no stdin: a library call never reads the process's input for a missing text
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(said), \
                _without_stdin():
            _run(args, context)
        if not context.presented:
            return None
        return Result(name, context.presented[-1], said.getvalue().splitlines())


@contextlib.contextmanager
def _without_stdin():

    kept, sys.stdin = sys.stdin, None
    try:
        yield
    finally:
        sys.stdin = kept


@functools.cache
def _commands() -> dict:

    return calls.commands()


def _run(args: list[str], context) -> None:
    """The command line, run by the CLI's own group as the shell's is (batch.main: --chat);
    a usage error becomes InputError."""

    try:
        batch.main(calls.group(), args, context)
    except click_errors.UsageError as e:
        raise InputError(e.format_message()) from None


class Cache(Trace):
    """The values of one run (a Trace: `cache[path]` takes every spelling, TransformerLens's
    hook names too), and the picture of any of them."""

    def __repr__(self) -> str:
        return super().__repr__().replace("<Trace", "<Cache", 1)

    def get(self, path, *default):
        """As Trace.get, and TransformerLens's short keys: cache["resid_post", 0],
        cache["pattern", 1], cache["scale", 0, "ln1"] (act_name spells them)."""
        return super().get(act_name(*path) if isinstance(path, tuple) else path, *default)

    def __getitem__(self, path):
        return self.get(path)

    def __contains__(self, path) -> bool:
        try:
            return super().__contains__(act_name(*path) if isinstance(path, tuple) else path)
        except TypeError:
            return False

    def picture(self, path: str) -> Picture:
        """The value drawn as the card commands' --save draws it: an attention grid as a
        heatmap over the tokens, any other value as a heatmap of its rows."""

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

        return svg.document(self.figure)

    def html(self) -> str:

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

        save_figure(RunContext(quiet=True), self.figure, Path(path), force)


def _svg_height(svg: str) -> int:

    m = re.search(r'<svg[^>]*\sheight="([\d.]+)', svg)
    return int(float(m[1])) if m else 480


class Result(Mapping):
    """What one command gave, a read-only mapping of its --json document: `result[key]`,
    `key in result`, `list(result)`, `len(result)`, `result.get(key)`; `.document` (that
    dict), `.json` (that text), `.picture` (what its --save draws, None for a command that
    draws nothing), shown in a notebook as that picture; `.notes` (the lines the command
    said on stderr); `.show()` prints its terminal view."""

    def __init__(self, command: str, presented, notes: list[str] | None = None):
        self.command, self.presented, self.notes = command, presented, list(notes or [])

    @functools.cached_property
    def json(self) -> str:

        out = io.StringIO()
        emit(self.presented.document(), stream=out)
        return out.getvalue()

    @functools.cached_property
    def document(self) -> dict:
        return json.loads(self.json)

    def __getitem__(self, key: str) -> Any:
        return self.document[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.document)

    def __len__(self) -> int:
        return len(self.document)

    @functools.cached_property
    def picture(self) -> Picture | None:
        if self.presented.figure is None:
            return None

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

        p = self.presented
        present(RunContext(changed=p.changed), False, p.document, p.view, console=p.console,
                show=p.show)

    def __repr__(self) -> str:
        keys = list(self.keys())
        shown = ", ".join(keys[:6]) + (f", ... ({len(keys)} fields)" if len(keys) > 6 else "")
        drawn = "; shown as its picture" if self.presented.figure is not None else ""
        return f"<tinygpt {self.command} result: {shown}{drawn}>"


# ------------------------------------------------------------------ TransformerLens's words

RETURN_TYPES = ("logits", "loss", "both", None)


def _text(text) -> str:
    """One text, as every run takes it; anything else is one TypeError naming `text`."""
    if isinstance(text, str):
        return text
    if isinstance(text, list | tuple) and text and all(isinstance(t, str) for t in text):
        raise ArgumentError("text takes one str; a list of texts is not batched (texts of "
                            "different lengths would need padding): run each, e.g. "
                            "[model(t) for t in texts]")
    if isinstance(text, bytes | bytearray):
        raise ArgumentError(f"text takes a str, not bytes ({bytes(text)[:20]!r}): decode it "
                            "first, e.g. text.decode('utf-8')")

    raise ArgumentError(f"text takes a str, not {shown(text)}")


def _names(names, what: str) -> list[str]:
    """A name or a list of names (never a str read letter by letter)."""
    if isinstance(names, str):
        return [names]
    if isinstance(names, list | tuple | set | frozenset) \
            and all(isinstance(n, str) for n in names):
        return list(names)
    raise ArgumentError(f"{what} takes a name, a list of names or a function of a name, "
                        f"not {names!r}")


def _kept(function, name: str | None) -> bool:
    if name is None:
        return False
    answer = function(name)
    if not isinstance(answer, bool | np.bool_):
        raise TypeError(f"names_filter must answer True or False; it answered {answer!r} "
                        f"for {name!r}")
    return bool(answer)


def hook_names(config) -> list[tuple[str, str | None]]:
    """(tinygpt path, TransformerLens hook name or None) of every value the forward pass
    computes, in forward order."""

    return [(path, lens_name(path, config)) for path in expand(config, kinds=("hooked",))]


# TransformerLens's short names (its utils.get_act_name), said in our own words
_ATTN = {"k", "v", "q", "z", "rot_k", "rot_q", "result", "pattern", "attn_scores"}
_MLP = {"pre", "post", "mid", "pre_linear"}
_SAME = {"attn": "pattern", "attn_logits": "attn_scores", "key": "k", "query": "q",
         "value": "v", "mlp_pre": "pre", "mlp_mid": "mid", "mlp_post": "post"}
_PART = {"a": "attn", "m": "mlp", "b": "", "block": "", "blocks": "", "attention": "attn"}


def act_name(name: str, layer: int | None = None, layer_type: str | None = None) -> str:
    """The TransformerLens hook name that a short key spells, as cache["resid_post", 0]
    means it: ("resid_post", 0) -> blocks.0.hook_resid_post, ("pattern", 1) ->
    blocks.1.attn.hook_pattern, ("scale", 2, "ln1") -> blocks.2.ln1.hook_scale, ("scale",)
    -> ln_final.hook_scale; a negative layer counts from the end."""
    if not isinstance(name, str) or not (layer is None or isinstance(layer, int | np.integer)) \
            or not (layer_type is None or isinstance(layer_type, str)):
        raise ArgumentError(f"a cache key of a name, a layer and a part (str, int, str), as "
                            f"cache['resid_post', 0]; not {(name, layer, layer_type)!r}")
    name = _SAME.get(name, name)
    part = "attn" if name in _ATTN else "mlp" if name in _MLP else \
        _PART.get(layer_type, layer_type)
    full = ("" if layer is None else f"blocks.{int(layer)}.") + (f"{part}." if part else "") \
        + f"hook_{name}"
    if name in ("scale", "normalized") and layer is None:
        full = f"ln_final.{full}"
    return full


def next_token_loss(logits: np.ndarray, ids: np.ndarray, per_token: bool):
    """The cross-entropy of each next token (nats) under the logits of the position before
    it: [T - 1], or its mean."""

    logp = log_softmax(logits[:-1].astype(np.float64))
    each = -np.take_along_axis(logp, ids[1:, None], axis=-1)[:, 0]
    return each if per_token else float(each.mean())


@dataclass(frozen=True)
class TLConfig:
    """A model's configuration under TransformerLens's names, where they mean the same."""

    model_name: str
    n_layers: int
    d_model: int
    n_heads: int
    d_head: int
    d_mlp: int
    d_vocab: int
    d_vocab_out: int
    n_ctx: int
    act_fn: str
    normalization_type: str  # "LN" or "RMS"
    eps: float
    positional_embedding_type: str  # "standard" (a learned table) or "rotary"
    rotary_dim: int | None
    rotary_base: float
    n_key_value_heads: int | None  # None: every head its own keys and values
    gated_mlp: bool
    parallel_attn_mlp: bool
    attn_scale: float  # the scores are q.k / attn_scale


def tl_config(c, name: str) -> TLConfig:
    return TLConfig(
        model_name=name, n_layers=c.n_layer, d_model=c.n_embd, n_heads=c.n_head,
        d_head=c.d_k, d_mlp=c.n_inner, d_vocab=c.vocab_size, d_vocab_out=c.vocab_size,
        n_ctx=c.n_positions, act_fn=c.act, normalization_type="RMS" if c.norm == "rms" else "LN",
        eps=c.layer_norm_epsilon,
        positional_embedding_type="rotary" if c.positions == "rotary" else "standard",
        rotary_dim=c.rotary or None, rotary_base=c.rotary_base,
        n_key_value_heads=c.kv_heads if c.kv_heads != c.n_head else None,
        gated_mlp=c.mlp == "gated", parallel_attn_mlp=c.parallel,
        attn_scale=float(1 / c.scale))


def tl_weights(params, c, name: str) -> np.ndarray:
    """One of TransformerLens's weight tensors, shaped as it shapes them: W_E [d_vocab,
    d_model], W_U [d_model, d_vocab], W_pos [n_ctx, d_model], W_Q W_K W_V [n_layers, n_heads,
    d_model, d_head] (a key/value head repeated for each query head it serves, as
    TransformerLens repeats it), W_O [n_layers, n_heads, d_head, d_model], b_Q b_K b_V
    [n_layers, n_heads, d_head], b_O [n_layers, d_model], W_in W_gate [n_layers, d_model,
    d_mlp], W_out [n_layers, d_mlp, d_model], b_in [n_layers, d_mlp], b_out [n_layers,
    d_model]; a bias the model has not, zeros."""

    if name == "W_E":
        return np.array(model.token_table(params))
    if name == "W_U":
        return np.array(params[model.head_table(c)]).T
    if name == "b_U":
        return np.zeros(c.vocab_size, np.float32)
    if name == "W_pos":
        if c.positions != "learned":
            raise AttributeError("W_pos: this model has no position table; its positions "
                                 "turn q and k (rotary)")
        return np.array(model.position_table(params))
    if name == "W_gate" and c.mlp != "gated":
        raise AttributeError("W_gate: this model's MLP is not gated")
    group = c.n_head // c.kv_heads
    layers = []
    for i in range(c.n_layer):
        if name[2:] in ("Q", "K", "V"):
            w_q, w_k, w_v, b_q, b_k, b_v = model.head_qkv(params, c, i)
            one = {"W_Q": w_q, "W_K": w_k, "W_V": w_v, "b_Q": b_q, "b_K": b_k,
                   "b_V": b_v}[name]
            layers.append(one if name[2] == "Q" else np.repeat(one, group, axis=0))
        elif name == "W_O":
            layers.append(model.head_out_matrix(params, c, i))
        elif name == "b_O":
            layers.append(model.attn_out_bias(params, c, i))
        else:
            p = f"layers.{i}.mlp."
            width = c.n_inner if name in ("W_in", "W_gate", "b_in") else c.n_embd
            key = {"W_in": "W_in", "W_gate": "W_gate", "W_out": "W_out", "b_in": "b_in",
                   "b_out": "b_out"}[name]
            w = params.get(p + key)
            layers.append(np.zeros(width, np.float32) if w is None else w)
    return np.stack([np.asarray(w) for w in layers])
