"""Commands about text and the model as a whole: encode, decode, generate, trace, info."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from .app import app
from .common import (
    ABLATE,
    FORCE,
    FULL,
    JSON,
    QUIET,
    SAVE_ARRAYS,
    TEMPERATURE,
    TEXT,
    TOP_K,
    TOP_P,
    WEIGHTS,
    InputError,
    check_save,
    load,
    open_folder,
    present,
    read_text,
    run,
    stderr,
    stdout,
    wide,
)
from .steering import own_length, steerable

if TYPE_CHECKING:
    from .context import RunContext

# NumPy, Rich and the model are imported inside the commands: registering them (and
# `tinygpt --help`) stays cheap, and `encode` never loads the forward pass.


@app.command()
@own_length
def encode(context: RunContext, text: str = TEXT, weights: Path = WEIGHTS, as_json: bool = JSON):
    """Card 1: split the text into tokens; each token is an id from the vocabulary.

    Shows each token's id, its text and its byte offsets in the UTF-8 text.
    Example: tinygpt encode "Lily wanted to play with her"
    """
    model = open_folder(context, weights)
    text = read_text(text)
    tok = model.tokenizer
    ids = (tok.encode if context.chat else tok.text_ids)(text)
    # offsets in the text: a <bos> the post-processor adds is not in it (a template's is)
    starts = tok.byte_starts_in(text, ids) if context.chat else tok.text_byte_starts(text, ids)

    def document():
        from ..render.documents import encode_document

        return encode_document(ids, starts, model.tokenizer, model.config)

    def view():
        from ..render.tables import ENCODE_ROWS, encode_view, kept_rows

        # a person reads the first and last rows of a long text; --json has every token
        rows = kept_rows(len(ids), ENCODE_ROWS)
        tokens = {i: model.tokenizer.token_str(ids[i]) for i in rows if i is not None}
        return encode_view(ids, rows, tokens, starts, model.config)

    present(context, as_json, document, view)


@app.command()
def decode(
    context: RunContext,
    ids: list[str] = typer.Argument(None, metavar="IDS", help="Token ids (spaces or commas); "
                                    "'-' or nothing "
                                    "reads them from stdin.", show_default=False),
    weights: Path = WEIGHTS, as_json: bool = JSON,
):
    """Turn token ids back into text.

    Example: tinygpt decode 608 429 267 346 336 314
    """
    from ..render.text import show_text
    from ..transformer.tokenizer import parse_ids

    model = open_folder(context, weights)
    id_list = parse_ids(ids if ids and ids != ["-"] else [read_text(None, what="token ids")],
                        model.tokenizer.vocab_size)
    text = model.tokenizer.decode(id_list)

    def document():
        from ..render import jsonout

        return jsonout.document(None, text, id_list,
                                [model.tokenizer.token_str(i) for i in id_list])

    def show(text: str) -> None:  # the text itself, escaped only for a terminal
        sys.stdout.write(show_text(text) if sys.stdout.isatty() else text)
        sys.stdout.write("\n")

    present(context, as_json, document, lambda: text, show=show)


@app.command()
@steerable
@own_length
def generate(
    context: RunContext,
    text: str = TEXT, weights: Path = WEIGHTS,
    max_new_tokens: int = typer.Option(120, "--max-new-tokens", "-n", min=1,
                                       help="At most this many new tokens."),
    temperature: float = TEMPERATURE,
    top_k: int = TOP_K, top_p: float = TOP_P,
    seed: int = typer.Option(None, "--seed", "-s", help="Seed for the random picks; the same "
                             "seed gives the same text. Default: a new one, printed on stderr.",
                             show_default=False),
    no_stop: bool = typer.Option(False, "--no-stop", help="Go on past the model's end tokens "
                                 "(<|endoftext|>, or generation_config.json's eos_token_id)."),
    ablate: list[str] = ABLATE,
    as_json: bool = typer.Option(False, "--json", help="One JSON object a line: each token, "
                                 "then a summary."),
):
    """Write a continuation of the text, one token at a time, as it is produced.

    Example: tinygpt generate "Lily wanted" --seed 7
    Example: tinygpt generate "Once upon a time" --temperature 0
    """
    from ..jobs.session import encode_tail
    from ..render import generation
    from ..transformer.generate import generate as generate_tokens
    from ..transformer.sampling import check_temperature, check_top_p, create_rng, fresh_seed
    from .steering import steered_hooks

    check_top_p(top_p)
    check_temperature(temperature)  # before the seed line: an error is the only line
    model = load(context, weights)
    ablated, zeroed = [], None
    if ablate:  # loaded only then: generation starts light
        from ..analysis.ablate import zeroing
        from ..jobs.dictionaries.saes import finder

        ablated, zeroed = zeroing(model, list(ablate), finder(model, context.saes))
    hooks = steered_hooks(context, model, zeroed)
    prompt = read_text(text)  # a long prompt is read whole: the model reads its end
    ids, whole = encode_tail(model, prompt, specials=not context.chat)
    generation.say_window(whole, model.config.n_positions)
    chosen, seed = seed, fresh_seed() if seed is None else seed
    tok = model.tokenizer
    steps = generate_tokens(model.params, model.config, ids, max_new_tokens,
                            temperature=temperature, top_k=top_k or None, top_p=top_p,
                            rng=create_rng(seed), stop_ids=() if no_stop else tok.stop_ids,
                            hooks=hooks)
    if chosen is None and temperature > 0:
        stderr().print(f"seed {seed} (pass --seed {seed} to get the same text again)",
                       style="dim")
    if as_json:
        made = generation.write_json(tok, prompt, ids, steps, seed, no_stop, ablated)
    else:
        made = generation.write_text(stdout(context), tok, prompt, steps, no_stop)
        generation.say_stopped(made, tok, no_stop, max_new_tokens, ablated)
    if context.presented is not None:  # printed as it came; a program gets the summary too
        from ..render.output import present

        done = generation.summary(tok, prompt, ids, made, seed, no_stop)
        present(context, False, lambda: done, lambda: done["data"])


@app.command("trace")
@steerable
def trace_cmd(
    context: RunContext,
    text: str = TEXT,
    path: str = typer.Argument(None, help="Which value: e.g. layers.0.heads.0.weights, "
                               "lnFinal.out, logits[-1].", show_default=False),
    list_paths: bool = typer.Option(False, "--list", help="List every path with its shape."),
    weights: Path = WEIGHTS, ablate: list[str] = ABLATE, as_json: bool = JSON, full: bool = FULL,
    save: Path = SAVE_ARRAYS, force: bool = FORCE, quiet: bool = QUIET,
):
    """Print any value of the forward pass by its path, or --list them all.

    --save writes the value as .npy, or values (a group, or the whole pass) as .safetensors.

    Example: tinygpt trace "Lily wanted to play with her" layers.0.heads.0.weights
    Example: tinygpt trace "Lily wanted to play with her" --list
    Example: tinygpt trace "Lily wanted to play with her" --save cache.safetensors
    """
    import numpy as np

    from ..render.documents import session_document, traced_document
    from ..render.output import save_arrays
    from ..render.tables import paths_table, traced_view

    if path is None and not list_paths and save is None:
        raise InputError("give a PATH to print, or --list to see every path")
    if path is not None and path.startswith("sae."):  # an SAE's latents: cli/features.py
        if save is not None:
            raise InputError("--save writes values of the forward pass; an SAE's latents "
                             "are printed only")
        from .features import trace_latents
        return trace_latents(context, weights, text, path, ablate, as_json)
    check_save(save, force)  # before the run
    r = run(context, weights, text, ablate)
    if save is not None:
        saved = values_to_save(r.trace, path)
        save_arrays(context, save, saved, force)
        list_paths = list_paths or len(saved) > 1  # what was written, listed
    if list_paths:
        entries = [e for e in r.trace.entries() if save is None or e["path"] in saved]
        return present(context, as_json, lambda: session_document(
            r, None, np.asarray([e["path"] for e in entries]), name="paths", entries=entries),
                       lambda: paths_table(entries))
    value = r.trace.get(path)
    name, rows = r.trace.canonical(path)
    shown = name + "".join(f"[{i}]" for i in rows)
    present(context, as_json, lambda: traced_document(r, shown, value),
            lambda: traced_view(shown, value, rows, r.tokens, full),
            console=lambda view: wide(context, view)
            if full and isinstance(value, np.ndarray) else stdout(context))


def values_to_save(trace, path: str | None) -> dict:
    """{trace name: array} that trace --save writes: the value PATH names (under its name as
    printed), the values under a group PATH (layers.0), or without PATH every value of the
    pass; per-head slices (heads.H.*, views of the block's q, k, v, scores, weights, z) and
    the token strings are left out of a group, as a cache holds them."""
    import numpy as np

    from ..transformer.schema import PathError

    def whole(e) -> bool:
        return ".heads." not in e["path"] and e["path"] != "tokens"

    if path is not None:
        try:
            value = trace.get(path)
        except PathError:
            group = [e["path"] for e in trace.entries()
                     if e["path"].startswith(path.rstrip(".") + ".") and whole(e)]
            if not group:
                raise
            return {p: np.asarray(trace.get(p)) for p in group}
        name, rows = trace.canonical(path)
        return {name + "".join(f"[{i}]" for i in rows): np.asarray(value)}
    return {e["path"]: np.asarray(trace.get(e["path"])) for e in trace.entries() if whole(e)}


@app.command()
def info(context: RunContext, weights: Path = WEIGHTS, as_json: bool = JSON):
    """The model's configuration, parameter counts, weights file and tokenizer.

    Example: tinygpt info
    """
    from ..jobs.info import info_of
    from ..render.documents import info_document
    from ..render.tables import info_view

    info = info_of(load(context, weights))
    present(context, as_json, lambda: info_document(info), lambda: info_view(info))
