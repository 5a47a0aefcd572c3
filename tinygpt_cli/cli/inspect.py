"""Commands about text and the model as a whole: encode, decode, generate, trace, info."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import typer

from .app import app
from .common import (
    ABLATE,
    FULL,
    JSON,
    TEMPERATURE,
    TEXT,
    TOP_K,
    TOP_P,
    WEIGHTS,
    InputError,
    check_top_p,
    encode_checked,
    load,
    open_folder,
    read_text,
    run,
    stderr,
    stdout,
    wide,
)

# NumPy, Rich and the model are imported inside the commands: registering them (and
# `tinygpt --help`) stays cheap, and `encode` never loads the forward pass.


@app.command()
def encode(text: str = TEXT, weights: Path = WEIGHTS, as_json: bool = JSON):
    """Card 1: split the text into tokens; each token is an id from the vocabulary.

    Shows each token's id, its text and its byte offsets in the UTF-8 text.
    Example: tinygpt encode "Lily wanted to play with her"
    """
    model = open_folder(weights)
    text = read_text(text)
    ids = model.tokenizer.encode(text)
    tokens = [model.tokenizer.token_str(i) for i in ids]
    offsets = model.tokenizer.byte_offsets(ids)
    if as_json:
        import numpy as np

        from ..render import jsonout

        jsonout.emit(jsonout.document("ids", np.asarray(ids, dtype=np.int64), ids, tokens,
                                      offsets=offsets, vocab_size=model.config.vocab_size))
        return
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from ..render.tables import ids_header
    from ..render.text import show_token

    t = Table(box=None, header_style="bold dim", pad_edge=False)
    for name, just in (("#", "right"), ("id", "right"), ("token", "left"), ("bytes", "right")):
        t.add_column(name, justify=just, no_wrap=True)
    for i, (token_id, tok, (a, b)) in enumerate(zip(ids, tokens, offsets, strict=True)):
        t.add_row(str(i), str(token_id), Text(show_token(tok), style="bold"), f"{a}–{b}")
    limit = model.config.n_positions
    note = f"T = {len(ids)} tokens, each an id from 0 to {model.config.vocab_size - 1:,}"
    if len(ids) > limit:
        note += f"; more than the {limit} the model reads at once"
    stdout().print(Group(ids_header(ids), t, Text(note, style="dim")))


def _parse_ids(args: list[str]) -> list[int]:
    ids = []
    for a in args:
        for part in re.split(r"[\s,\[\]]+", a):
            if not part:
                continue
            if not re.fullmatch(r"-?\d+", part):
                raise InputError(f"{part!r} is not a token id: ids are whole numbers")
            ids.append(int(part))
    return ids


@app.command()
def decode(
    ids: list[str] = typer.Argument(None, help="Token ids (spaces or commas); '-' or nothing "
                                    "reads them from stdin.", show_default=False),
    weights: Path = WEIGHTS, as_json: bool = JSON,
):
    """Turn token ids back into text.

    Example: tinygpt decode 608 429 267 346 336 314
    """
    from ..render.text import show_text

    model = open_folder(weights)
    if not ids or ids == ["-"]:
        ids = [read_text(None)]
    id_list = _parse_ids(ids)
    if not id_list:
        raise InputError("no token ids given")
    n = model.tokenizer.vocab_size
    for i in id_list:
        if not 0 <= i < n:
            raise InputError(f"unknown token id {i}: ids run from 0 to {n - 1}")
    text = model.tokenizer.decode(id_list)
    if as_json:
        from ..render import jsonout

        jsonout.emit(jsonout.document(None, text, id_list,
                                      [model.tokenizer.token_str(i) for i in id_list]))
        return
    sys.stdout.write(show_text(text) if sys.stdout.isatty() else text)
    sys.stdout.write("\n")


@app.command()
def generate(
    text: str = TEXT, weights: Path = WEIGHTS,
    max_new_tokens: int = typer.Option(120, "--max-new-tokens", "-n", min=1,
                                       help="At most this many new tokens."),
    temperature: float = TEMPERATURE,
    top_k: int = TOP_K, top_p: float = TOP_P,
    seed: int = typer.Option(None, "--seed", "-s", help="Seed for the random picks; the same "
                             "seed gives the same text. Default: a new one, printed on stderr.",
                             show_default=False),
    no_stop: bool = typer.Option(False, "--no-stop", help="Go on past <|endoftext|>."),
    ablate: list[str] = ABLATE,
    as_json: bool = typer.Option(False, "--json", help="One JSON object a line: each token, "
                                 "then a summary."),
):
    """Write a continuation of the text, one token at a time, as it is produced.

    Example: tinygpt generate "Lily wanted" --seed 7
    Example: tinygpt generate "Once upon a time" --temperature 0
    """
    import numpy as np
    from rich.text import Text

    from ..generate import generate as generate_tokens
    from ..hooks import ablation
    from ..render import jsonout
    from ..render.text import show_text
    from ..sampling import check_temperature, create_rng

    check_top_p(top_p)
    check_temperature(temperature)  # before the seed line: an error is the only line
    model = load(weights)
    hooks = ablation(ablate, model.config) if ablate else None
    prompt = read_text(text)
    ids = encode_checked(model, prompt)
    if seed is None:
        seed = int(np.random.SeedSequence().entropy % 2**31)
        if temperature > 0:
            stderr().print(f"seed {seed} (pass --seed {seed} to get the same text again)",
                           style="dim")
    tok = model.tokenizer
    eot = tok.eot_id
    steps = generate_tokens(model.params, model.config, ids, max_new_tokens,
                            temperature=temperature, top_k=top_k or None, top_p=top_p,
                            rng=create_rng(seed), stop_id=None if no_stop else eot,
                            hooks=hooks)
    new: list[int] = []
    if as_json:  # the context once; each token line then carries only its own token
        jsonout.emit(jsonout.document(None, np.asarray(ids, dtype=np.int64), ids,
                                      [tok.token_str(t) for t in ids], event="prompt",
                                      text=prompt))
    out = stdout()
    shown = ""
    if not as_json and out.is_terminal:
        # soft_wrap: the text goes out as it is; only a terminal wraps it, never Rich.
        out.print(Text(show_text(prompt), style="bold"), end="", soft_wrap=True)
    elif not as_json:
        out.file.write(show_text(prompt))  # a pipe gets the text byte for byte
    for i, step in enumerate(steps):
        new.append(step.id)
        if as_json:
            jsonout.emit(jsonout.document(None, np.int64(step.id), event="token", step=i,
                                          id=step.id, token=tok.token_str(step.id),
                                          chance=step.chance))
            continue
        if step.id == eot and not no_stop:
            break
        # Decode everything so far: a character split over two tokens appears whole.
        full = tok.decode([t for t in new if t != eot or no_stop])
        if full.endswith("\ufffd"):
            continue
        piece, shown = full[len(shown):], full
        out.file.write(show_text(piece))  # plain text, written as is: tabs stay tabs
        out.file.flush()
    stopped = bool(new) and new[-1] == eot and not no_stop
    if as_json:
        kept = new[:-1] if stopped else new
        jsonout.emit(jsonout.document(None, prompt + tok.decode(kept), ids + new,
                                      [tok.token_str(i) for i in ids + new], event="end",
                                      new_tokens=len(new), seed=seed,
                                      stop="endoftext" if stopped else "max_new_tokens"))
        return
    rest = tok.decode([t for t in new if t != eot or no_stop])[len(shown):]
    out.file.write(show_text(rest) + "\n")
    out.file.flush()
    why = "<|endoftext|>" if stopped else f"--max-new-tokens {max_new_tokens}"
    stderr().print(f"({len(new)} new tokens; stopped at {why})", style="dim")


@app.command("trace")
def trace_cmd(
    text: str = TEXT,
    path: str = typer.Argument(None, help="Which value: e.g. layers.0.heads.0.weights, "
                               "lnFinal.out, logits[-1].", show_default=False),
    list_paths: bool = typer.Option(False, "--list", help="List every path with its shape."),
    weights: Path = WEIGHTS, ablate: list[str] = ABLATE, as_json: bool = JSON, full: bool = FULL,
):
    """Print any value of the forward pass by its path, or --list them all.

    Example: tinygpt trace "Lily wanted to play with her" layers.0.heads.0.weights
    Example: tinygpt trace "Lily wanted to play with her" --list
    """
    import numpy as np
    from rich.table import Table
    from rich.text import Text

    from ..render import jsonout
    from ..render.tables import shape_str, tensor_view
    from ..render.text import show_token

    if path is None and not list_paths:
        raise InputError("give a PATH to print, or --list to see every path")
    if path is not None and path.startswith("sae."):  # an SAE's latents: cli/features.py
        from .features import trace_latents

        return trace_latents(weights, text, path, ablate, as_json)
    r = run(weights, text, ablate)
    if list_paths:
        from ..schema import describe

        entries = []
        for p in r.trace.paths():
            value = r.trace.get(p)
            shape = list(np.shape(value)) if not isinstance(value, int) else []
            entries.append({"path": p, "shape": shape, "about": describe(p)})
        if as_json:
            jsonout.emit(r.document(None, np.asarray([e["path"] for e in entries]),
                                    name="paths",
                                    entries=entries))
            return
        t = Table(box=None, header_style="bold dim", pad_edge=False)
        t.add_column("path", no_wrap=True, style="cyan")
        t.add_column("shape", no_wrap=True)
        t.add_column("what it is")
        for e in entries:
            t.add_row(e["path"], shape_str(e["shape"]), e["about"])
        stdout().print(t)
        return
    value = r.trace.get(path)
    name, rows = r.trace.canonical(path)
    shown = name + "".join(f"[{i}]" for i in rows)
    if isinstance(value, int):
        if as_json:
            jsonout.emit(r.document(shown, np.int64(value)))
        else:
            stdout().print(Text(f"{shown} = {value}"))
        return
    if isinstance(value, list):  # tokens
        if as_json:
            jsonout.emit(r.document(shown, np.asarray(value)))
        else:
            stdout().print(Text("  ".join(show_token(t) for t in value)))
        return
    if as_json:
        jsonout.emit(r.document(shown, value))
        return
    # The tokens are the first axis, or the second of per-head values (H × T × ...);
    # each index in the path (logits[-1]) uses up one leading axis.
    token_axis = (1 if value.ndim + len(rows) == 3 else 0) - len(rows)
    labelled = value.ndim == 3 or (token_axis == 0 and value.ndim > 0)
    view = tensor_view(shown, value, r.tokens if labelled else None, full=full)
    (wide(view) if full else stdout()).print(view)


def _as_typed(path: Path) -> str:
    """A path below the current folder as the user would type it; others in full."""
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


@app.command()
def info(weights: Path = WEIGHTS, as_json: bool = JSON):
    """The model's configuration, parameter counts, weights file and tokenizer.

    Example: tinygpt info
    """
    import numpy as np
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from ..files import sha256
    from ..render import jsonout
    from ..render.text import escape_line, show_token

    model = load(weights)
    cfg = model.config
    groups: dict[str, int] = {}
    for name, arr in model.params.items():
        group = re.sub(r"^h\.\d+\.", "h.*.", name).rsplit(".", 1)[0]
        groups[group] = groups.get(group, 0) + arr.size
    total = sum(a.size for a in model.params.values())
    facts = {
        "n_embd": cfg.n_embd, "n_layer": cfg.n_layer, "n_head": cfg.n_head, "d_k": cfg.d_k,
        "n_inner": cfg.n_inner, "vocab_size": cfg.vocab_size, "n_positions": cfg.n_positions,
        "layer_norm_epsilon": cfg.layer_norm_epsilon, "activation_function": "gelu_new",
        "tie_word_embeddings": True,
    }
    weights_file = model.weights_file.resolve()
    shown_file = _as_typed(weights_file)
    digest = sha256(weights_file)
    tokenizer = {"vocab_size": model.tokenizer.vocab_size,
                 "special_tokens": model.tokenizer.special_tokens}
    if as_json:
        jsonout.emit(jsonout.document(None, np.int64(total), None, None, name="parameters",
                                      config=facts,
                                      parameters={"total": total, "groups": groups},
                                      weights_file=str(weights_file), sha256=digest,
                                      tokenizer=tokenizer))
        return
    t = Table(box=None, header_style="bold dim", pad_edge=False, show_header=False)
    t.add_column(style="bold")
    t.add_column()
    for k, v in facts.items():
        t.add_row(k, str(v))
    p = Table(box=None, header_style="bold dim", pad_edge=False)
    p.add_column("parameters", style="cyan")
    p.add_column("count", justify="right")
    for k, v in groups.items():
        p.add_row(k, f"{v:,}")
    p.add_row(Text("total", style="bold"), Text(f"{total:,}", style="bold"))
    # names and paths come from the weights folder: shown escaped, like the user's own text
    specials = ", ".join(f"{show_token(k)} = {v}" for k, v in tokenizer["special_tokens"].items())
    stdout().print(Group(
        Text("configuration", style="bold underline"), t, Text(""), p, Text(""),
        Text(f"weights   {escape_line(shown_file)}"), Text(f"sha256    {digest}"),
        Text(f"tokenizer {tokenizer['vocab_size']:,} tokens; special: {specials}"),
    ))
