"""Commands that read whole texts: score, heads, neurons, diff."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ..render.text import escape_line
from .app import app
from .common import (
    FORCE,
    JSON,
    LAYER,
    QUIET,
    SAVE,
    TEXT,
    WEIGHTS,
    InputError,
    check_index,
    check_save,
    load,
    progress,
    read_text,
    save_figure,
    stdout,
    wide,
)

if TYPE_CHECKING:  # NumPy and the model are imported inside the commands
    import numpy as np

    from ..analysis import score as sc


BUILT_IN = [  # when no text is given and the project's data folder is not there
    "Lily and Tom went to the park. Lily saw a big red ball. Tom saw the ball too. "
    "Lily gave the ball to Tom, and Tom gave the ball to Lily.",
    "Once upon a time, there was a little cat named Tim. Tim liked to play. One day, Tim "
    "saw a bird. The bird was in a tree. Tim wanted to play with the bird.",
    "Sue had a doll. The doll was pink. Sue loved her pink doll. Every day Sue and her doll "
    "had tea. Sue said, \"I love you, doll.\"",
]


def find_data() -> Path | None:
    """$TINYGPT_DATA, else shared/data/tinystories beside an ancestor of this package or of
    the working directory (the project's layout: the data lives next to the checkout)."""
    env = os.environ.get("TINYGPT_DATA")
    if env:
        return Path(env).expanduser()
    for base in (Path(__file__).resolve(), Path.cwd().resolve()):
        for parent in base.parents:
            folder = parent / "shared" / "data" / "tinystories"
            if folder.is_dir():
                return folder
    return None


def _stories_of(path: Path) -> list[str]:
    from ..train.data import read_stories

    if not path.is_file():
        raise InputError(f"{path} " + ("is not a file" if path.exists() else "does not exist"))
    try:
        stories = read_stories([path])
    except UnicodeDecodeError as e:
        raise InputError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not stories:
        raise InputError(f"{path} holds no text")
    return stories


# ------------------------------------------------------------------ score

DRAWN_TOKENS = 2000  # --save draws the first texts' tokens up to this many


@app.command()
def score(
    text: str = TEXT, weights: Path = WEIGHTS,
    file: Path = typer.Option(None, "--file", "-f", help="Score a file of stories separated "
                              "by <|endoftext|> lines, each from a fresh start.",
                              show_default=False),
    stride: int = typer.Option(None, "--stride", min=1, help="Start a new window every this "
                               "many tokens (default: the context length, no overlap); a "
                               "smaller stride gives later tokens more context and costs more.",
                               show_default=False),
    stream: bool = typer.Option(False, "--stream", help="Score the file as one token stream "
                                "in non-overlapping windows, as the model card counts."),
    bos: bool = typer.Option(True, "--bos/--no-bos", help="Put <|endoftext|> before each text "
                             "so its first token is scored too, as after a story separator."),
    top: int = typer.Option(10, "--top", "-n", min=0, help="How many surprising tokens to list."),
    show: bool = typer.Option(None, "--show-text/--no-show-text", help="Print the coloured "
                              "text (default: when it is under 3,000 tokens).",
                              show_default=False),
    as_json: bool = JSON, save: Path = SAVE, force: bool = FORCE, quiet: bool = QUIET,
):
    """How surprised the model is by each token: surprisal, rank, chance, entropy; totals.

    Surprisal is -log p of the token that comes next (nats; bits = nats / ln 2). A file is
    split into stories at <|endoftext|>; each story is read after a separator and its closing
    separator is scored too, so bytes count as in the model card. --json prints one line per
    token, then a summary line.

    Example: tinygpt score "Lily wanted to play with her ball."
    Example: tinygpt score --file ../shared/data/tinystories/part-005.txt --stream --json
    """
    import numpy as np

    from ..analysis import score as sc
    from ..render import jsonout

    model = load(weights)
    tok, cfg = model.tokenizer, model.config
    sequences, offset, stream_bpt = _score_inputs(model, text, file, stride, stream, bos)
    check_save(save, force)  # --json streams its lines before the picture could be refused
    stride = stride or cfg.n_positions
    lengths = [len(s) for s in sequences]
    n_windows = sc.count_windows(lengths, cfg.n_positions, stride, full_only=stream)
    nbytes = sc.byte_lengths(tok)
    token_str = tok.token_strs
    token_json = _token_json(tok)
    total = sc.Totals(0, 0, 0.0)
    kept: list[tuple] = []  # (nats, sequence, target position, rank, entropy) of the top
    per_seq: list[sc.TokenScores] = []
    shown = show if show is not None else (sum(lengths) < 3000 and not stream)
    drawn: list[sc.TokenScores] = []  # --save: the first texts, which the picture shows
    out = sys.stdout
    with progress(n_windows, "scoring", enabled=not as_json) as advance:
        for i, s in sc.score_sequences(model.params, cfg, sequences, stride=stride,
                                       full_only=stream, progress=advance):
            total.tokens += len(s.targets)
            total.nats += float(s.nats.sum())
            total.bytes += int(nbytes[s.targets].sum())
            if save is not None and sum(len(d.targets) for d in drawn) < DRAWN_TOKENS:
                drawn.append(s)
            if as_json:
                _emit_token_records(out, i, s, token_json, stream, offset)
                if save is None:
                    continue
            if top:
                worst = np.argsort(-s.nats, kind="stable")[:top]
                kept += [(float(s.nats[j]), i, 1 + int(j) - offset, int(s.rank[j]),
                          float(s.entropy[j])) for j in worst]
                kept = sorted(kept, reverse=True)[:top]
            if shown and not as_json:
                per_seq.append(s)
    summary = {"summary": True, "path": "score", "tokens": total.tokens, "bytes": total.bytes,
               "mean_nats": total.mean_nats, "perplexity": total.perplexity,
               "bits_per_token": total.bits_per_token, "bits_per_byte": total.bits_per_byte,
               "sequences": len(sequences), "context": cfg.n_positions, "stride": stride,
               "stream": stream, "separator_first": bool(offset)}
    if stream_bpt is not None:
        # the card's count: mean nats / ln 2 / (bytes per token of the whole stream)
        summary["bits_per_byte"] = total.bits_per_token / stream_bpt
        summary["bytes_per_token"] = stream_bpt
    if save is not None:
        from ..render.analysis_pictures import score_figure

        pictured, budget = [], DRAWN_TOKENS
        for d in drawn:  # cut to the budget: one --stream text can be a whole file
            pictured.append(([token_str[int(x)] for x in d.targets[:budget]], d.bits[:budget]))
            budget -= len(pictured[-1][1])
        worst = [(token_str[int(sequences[i][offset + p])], p, nats / sc.LN2)
                 for nats, i, p, *_ in kept]
        save_figure(score_figure(summary, pictured, len(sequences) - len(drawn), worst), save,
                    force)
    if as_json:
        jsonout.emit(jsonout.jsonable(summary))
        return
    _show_score(summary, sequences, per_seq if shown else None, kept, token_str, n_windows,
                offset, hidden=not shown, tok=tok)


def _score_inputs(model, text, file, stride, stream, bos):
    """(the id sequences to score, how many ids were put before each text, the stream's bytes
    per token with --stream), after checking the options."""
    import numpy as np

    from ..train.data import encode_stories

    tok, cfg = model.tokenizer, model.config
    eot = tok.eot_id
    if stream and file is None:
        raise InputError("--stream reads a file: give it with --file")
    if stream and stride not in (None, cfg.n_positions):
        raise InputError(f"--stream uses non-overlapping windows of {cfg.n_positions} "
                         "tokens; leave out --stride")
    if stride is not None and stride > cfg.n_positions:
        raise InputError(f"--stride {stride} is longer than the {cfg.n_positions}-token "
                         "context: give 1 to " + str(cfg.n_positions))
    if file is not None and text is not None:
        raise InputError("give a text or --file, not both")
    if file is not None:
        stories = _stories_of(file)
        if not stream:
            return [np.asarray([eot] + ids + [eot]) for ids in tok.encode_batch(stories)], 1, None
        ts = encode_stories(stories, tok)
        if len(ts.ids) <= cfg.n_positions:
            raise InputError(f"--stream needs more than {cfg.n_positions} tokens; "
                             f"{file} has {len(ts.ids)}")
        return [ts.ids.astype(np.int64)], 0, ts.bytes_per_token
    ids = tok.encode(read_text(text))
    seq = np.asarray(([eot] if bos else []) + ids)
    if len(seq) < 2:
        raise InputError("one token alone has nothing before it to predict it from; "
                         "give a longer text or leave out --no-bos")
    return [seq], int(bos), None


def _context(tok, ids) -> str:
    """The tokens before a scored one as text: their bytes decoded together, so an accent or
    an emoji split over two tokens reads as itself (a byte cut off at the start is dropped)."""
    data = b"".join(tok.token_bytes(int(i)) for i in ids)
    return data.decode("utf-8", errors="ignore")


def _emit_token_records(out, i: int, s: sc.TokenScores, token_json: list[str], stream: bool,
                        offset: int):
    """One NDJSON line per token, formatted directly (json.dumps per record is most of the
    time of a --json run over a whole file); the token strings come JSON-encoded already."""

    head = "{" if stream else f'{{"sequence": {i}, '
    bits = s.bits
    lines = [f'{head}"position": {j + 1 - offset}, "id": {t}, "token": {token_json[t]}, '
             f'"nats": {n!r}, "bits": {b!r}, "prob": {p!r}, "rank": {r}, "entropy": {e!r}}}'
             for j, (t, n, b, p, r, e) in enumerate(zip(
                 s.targets.tolist(), s.nats.tolist(), bits.tolist(), s.prob.tolist(),
                 s.rank.tolist(), s.entropy.tolist(), strict=True))]
    if lines:
        out.write("\n".join(lines) + "\n")
        out.flush()


def _show_score(summary, sequences, per_seq, kept, token_str, n_windows, offset, hidden,
                tok=None):
    import numpy as np
    from rich.console import Group
    from rich.text import Text

    from ..analysis import score as sc
    from ..render import texts as view

    parts: list = [view.totals_line(summary),
                   Text(f"{summary['sequences']:,} text(s), {n_windows:,} window(s) of at most "
                        f"{summary['context']} tokens, stride {summary['stride']}"
                        + ("; one stream, as the model card counts" if summary["stream"]
                           else ""), style="dim")]
    if per_seq is not None:
        parts += [Text(""), view.legend()]
        for seq, s in zip(sequences, per_seq, strict=True):
            pieces = [token_str[int(i)] for i in seq]
            bits = [None] + [float(b) for b in s.bits] + [None] * (len(seq) - 1 - len(s.bits))
            parts.append(view.coloured_text(pieces[offset:], bits[offset:]))
    elif hidden:
        parts.append(Text("(text not shown; --show-text prints it)", style="dim"))
    if kept:
        rows = []
        for nats, i, p, rank, entropy in kept:
            seq = sequences[i][offset:]
            rows.append({"position": p, "token": token_str[int(seq[p])], "bits": nats / sc.LN2,
                         "prob": float(np.exp(-nats)), "rank": rank,
                         "entropy_bits": entropy / sc.LN2,
                         "context": _context(tok, seq[max(0, p - 6):p])})
        parts += [Text(""), Text("most surprising tokens", style="bold"),
                  view.surprising_table(rows)]
    stdout().print(Group(*parts))


# ------------------------------------------------------------------ heads

KIND_LABELS = {"previous_token": "previous token", "duplicate_token": "duplicate token",
               "induction": "induction", "induction_random": "induction (random)"}


def _texts_for_heads(model, text: str | None, file: Path | None, stories: int
                     ) -> tuple[list[list[int]], str]:
    """Each text as [separator, ids...] cut to the context: the texts given, else a few
    validation stories, else the built-in sentences."""
    from ..train.data import read_stories

    tok, limit = model.tokenizer, model.config.n_positions
    if text is not None and file is not None:
        raise InputError("give a text or --file, not both")
    if file is not None:
        texts, source = _stories_of(file)[:stories], str(file)
    elif text is not None:  # stdin only for '-': a `while read` loop's input is not ours
        texts, source = [read_text(text)], "stdin" if text == "-" else "the text"
    else:  # nothing given: the defaults
        data = find_data()
        val = data / "part-005.txt" if data else None
        if val is not None and val.is_file():
            texts, source = read_stories([val])[:stories], f"{val} (first {stories} stories)"
        else:
            texts, source = BUILT_IN, "built-in sentences"
    ids = [([tok.eot_id] + t)[:limit] for t in tok.encode_batch(texts)]
    if any(len(t) < 2 for t in ids):
        raise InputError("each text needs at least one token")
    return ids, source


@functools.lru_cache(maxsize=2)  # one tokenizer per run, even with --each-line
def _token_json(tok) -> list[str]:
    from ..render import jsonout

    return [jsonout.json.dumps(t, ensure_ascii=False) for t in tok.token_strs]


@app.command()
def heads(
    text: str = TEXT, weights: Path = WEIGHTS,
    text_opt: str = typer.Option(None, "--text", help="The text (same as the argument).",
                                 show_default=False),
    file: Path = typer.Option(None, "--file", "-f", help="Stories separated by <|endoftext|>.",
                              show_default=False),
    stories: int = typer.Option(8, "--stories", min=1, help="How many stories of a file."),
    length: int = typer.Option(0, "--repeat-length", min=0, help="Random tokens per repeat in "
                               "the induction test (0: as many as fit twice in the context, "
                               "at most 50)."),
    batch: int = typer.Option(8, "--repeat-batch", min=1, help="Random sequences to average."),
    seed: int = typer.Option(0, "--seed", "-s", help="Seed of the random tokens."),
    exclude_first: bool = typer.Option(False, "--exclude-bos", help="Leave out attention to "
                                       "position 0 (the separator), in numerator and total."),
    exclude_current: bool = typer.Option(False, "--exclude-current", help="Leave out "
                                         "attention of each token to itself."),
    as_json: bool = JSON, save: Path = SAVE, force: bool = FORCE, quiet: bool = QUIET,
):
    """Which heads do known jobs: previous-token, duplicate-token and induction scores.

    Score = sum(A * P) / sum(A) over each head's whole attention grid A, with P the pattern's
    0/1 grid (TransformerLens' head detector), averaged over the texts; each text is read
    after <|endoftext|>. Induction (random): the mean attention from each token of the second
    copy of random tokens to the token after its first copy; the loss drop is how much better
    the second copy is predicted than the first.

    Example: tinygpt heads
    Example: tinygpt heads --file ../shared/data/tinystories/part-005.txt --stories 16 --json
    """
    import numpy as np
    from rich.console import Group
    from rich.text import Text

    from ..analysis import heads as detect
    from ..render import jsonout
    from ..render import texts as view

    model = load(weights)
    cfg = model.config
    if text is not None and text_opt is not None:
        raise InputError("give the text once: as the argument or with --text")
    ids, source = _texts_for_heads(model, text if text is not None else text_opt, file, stories)
    scores = detect.text_scores(model.params, cfg, ids, exclude_first=exclude_first,
                                exclude_current=exclude_current)
    n = length or min(50, (cfg.n_positions - 1) // 2)
    if 1 + 2 * n > cfg.n_positions or n < 2:
        raise InputError(f"--repeat-length {n} does not fit twice in the {cfg.n_positions}-"
                         f"token context after a separator: give 2 to {(cfg.n_positions - 1) // 2}")
    test = detect.induction_test(model.params, cfg, n, batch, seed, model.tokenizer.eot_id)
    table = dict(scores) | {"induction_random": test.score}
    repeat = {"length": n, "batch": batch, "seed": seed, "loss_first": test.loss_first,
              "loss_second": test.loss_second, "loss_drop": test.loss_drop}
    if save is not None:
        from ..render.analysis_pictures import heads_figure

        save_figure(heads_figure(table, KIND_LABELS, len(ids), source, repeat), save, force)
    if as_json:
        data = np.stack([table[k] for k in table])
        jsonout.emit(jsonout.document(
            "heads", data, kinds=list(table), texts=len(ids), source=source, text_ids=ids,
            exclude_bos=exclude_first, exclude_current=exclude_current, repeat=repeat))
        return
    best = {k: np.unravel_index(np.argmax(v), v.shape) for k, v in table.items()}
    notes = Text("best: " + ", ".join(f"{KIND_LABELS[k]} L{b[0]}H{b[1]} ({table[k][b]:.2f})"
                                      for k, b in best.items()), style="dim")
    stdout().print(Group(
        Text(f"heads  {cfg.n_layer} layers × {cfg.n_head} heads  on {len(ids)} text(s) from "
             f"{escape_line(source)}", style="bold cyan"),
        view.layer_head_table(table, KIND_LABELS), notes,
        Text(f"random tokens ({batch} × {n}, seed {seed}) repeated: loss {test.loss_first:.3f}"
             f" nats on the first copy, {test.loss_second:.3f} on the second "
             f"(drop {test.loss_drop:.3f})", style="dim")))


# ------------------------------------------------------------------ neurons

NEURON_TOP = 64  # examples kept per neuron in the cache; --top is capped by it


def _neuron_cache(model, files: list[Path], enabled: bool) -> dict[str, np.ndarray]:
    """The top windows of every neuron of every block over the files, computed once per
    (weights, data) and kept in the cache folder."""
    import numpy as np

    from .. import cache
    from ..analysis import neurons as nrn
    from ..files import sha256
    from ..train.data import encode_stories, eval_windows, read_stories

    cfg = model.config
    key = cache.key_of("neurons-v1", sha256(model.weights_file),
                       *(sha256(f) for f in files), str(cfg.n_positions), str(NEURON_TOP))
    path = cache.entry("neurons", key)
    kept = cache.load(path, lambda e: _valid_neuron_entry(e, cfg))
    if kept is not None:
        return kept
    stream = encode_stories(read_stories(files), model.tokenizer)
    x, _ = eval_windows(stream.ids, cfg.n_positions)
    if len(x) == 0:
        raise InputError(f"the data has {len(stream.ids)} tokens, less than one window of "
                         f"{cfg.n_positions}")
    with progress(len(x), "neuron maxima", enabled=enabled) as advance:
        top, where = nrn.window_maxima(model.params, cfg, x, progress=advance)
    k = min(NEURON_TOP, len(x))
    best = np.argsort(-top, axis=1, kind="stable")[:, :k, :]  # [L, k, ff]
    entry = {"stream": stream.ids.astype(np.uint16),
             "window": best.transpose(0, 2, 1).astype(np.int32),  # [L, ff, k]
             "value": np.take_along_axis(top, best, axis=1).transpose(0, 2, 1),
             "position": np.take_along_axis(where, best, axis=1).transpose(0, 2, 1)}
    cache.store(path, entry)
    return entry


def _valid_neuron_entry(e: dict, cfg) -> bool:
    """The keys, shapes and ranges _neuron_cache writes: [L, ff, k] windows of the stream."""
    import numpy as np

    if set(e) != {"stream", "window", "value", "position"} or e["stream"].ndim != 1:
        return False
    shape = e["window"].shape
    n = (len(e["stream"]) - 1) // cfg.n_positions
    return (len(shape) == 3 and shape[:2] == (cfg.n_layer, cfg.n_inner) and shape[2] >= 1
            and all(e[k].shape == shape for k in ("value", "position"))
            and 0 <= e["window"].min() and e["window"].max() < n
            and 0 <= e["position"].min() and e["position"].max() < cfg.n_positions
            and e["stream"].max() < cfg.vocab_size and bool(np.isfinite(e["value"]).all()))


@app.command()
def neurons(
    text: str = TEXT, weights: Path = WEIGHTS, layer: int = LAYER,
    neuron: int = typer.Option(None, "--neuron", help="One neuron: list the windows of "
                               "--data where it fires most.", show_default=False),
    data: Path = typer.Option(None, "--data", help="Stories to search for --neuron: a file or "
                              "a folder of part-*.txt (default: the training parts of the "
                              "project's data, when it is there).", show_default=False),
    top: int = typer.Option(8, "--top", "-n", min=1, help="How many neurons or windows."),
    raw: bool = typer.Option(False, "--raw", help="Read W_out through W_E^T alone, without "
                             "the final norm's weight."),
    as_json: bool = JSON,
):
    """MLP neurons: which fire most on a text and which tokens each one pushes up.

    Without --neuron: the neurons of the block with the highest activation in the text, and
    the tokens W_out[n] * ln_final.weight @ W_E^T favours most (--raw: without the norm's
    weight). With --neuron N: the windows of the data where it fires most, the firing token
    highlighted; the first run reads the whole data once (cached by the weights' and data's
    sha256), later ones are instant.

    Example: tinygpt neurons "Lily wanted to play with her" --layer 2
    Example: tinygpt neurons --layer 2 --neuron 17 --data ../shared/data/tinystories
    """
    import numpy as np
    from rich.console import Group
    from rich.text import Text

    from ..analysis import neurons as nrn
    from ..render import jsonout
    from ..render import texts as view

    model = load(weights)
    cfg, tok = model.config, model.tokenizer
    layer = check_index(layer, cfg.n_layer, "layer")
    if neuron is None:
        if data is not None:
            raise InputError("--data is searched for one neuron: give --neuron N too")
        _neurons_on_text(model, text, layer, top, raw, as_json)
        return
    neuron = check_index(neuron, cfg.n_inner, "neuron")
    if text is not None:
        raise InputError("--neuron searches --data, not a text: leave the text out")
    files = _data_files(data)
    entry = _neuron_cache(model, files, enabled=not as_json)
    k = min(top, entry["window"].shape[-1])
    wins = entry["window"][layer, neuron, :k]
    ctx = cfg.n_positions
    ids = np.stack([entry["stream"][w * ctx:(w + 1) * ctx] for w in wins]).astype(np.int64)
    acts = nrn.neuron_activations(model.params, cfg, ids, layer, neuron)  # [k, T]
    path = f"layers.{layer}.mlp_post[:, {neuron}]"
    peaks = acts.argmax(axis=1)
    rows = [{"window": int(w), "start": int(w) * ctx, "max": float(acts[r].max()),
             "position": int(peaks[r]), "token": tok.token_str(int(ids[r, peaks[r]]))}
            for r, w in enumerate(wins)]
    if as_json:
        jsonout.emit(jsonout.document(
            path, acts, layer=layer, neuron=neuron, examples=rows, window_ids=ids,
            window_tokens=[[tok.token_str(int(i)) for i in w] for w in ids],
            data=[str(f) for f in files]))
        return
    lines = [Text(f"{path}  top {k} of {len(entry['stream']) // ctx:,} windows of {ctx} "
                  f"tokens in {escape_line(', '.join(f.name for f in files))}",
                  style="bold cyan")]
    for r, row in enumerate(rows):
        tokens = [tok.token_str(int(i)) for i in ids[r]]
        line = Text(f"{row['max']:7.3f}  ", style="bold")
        line.append_text(view.window_line(tokens, acts[r], row["position"]))
        lines.append(line)
    stdout().print(Group(*lines))


def _data_files(data: Path | None) -> list[Path]:
    from ..train.data import split_data

    if data is None:
        found = find_data()
        if found is None or not found.is_dir():
            raise InputError("--neuron needs --data: a file or folder of stories to search")
        try:
            train, _ = split_data([found])
        except ValueError as e:
            raise InputError(str(e)) from None
        return train
    try:
        train, val = split_data([data])
    except ValueError as e:
        raise InputError(str(e)) from None
    return train if Path(data).is_dir() and train else train + val


def _neurons_on_text(model, text, layer, top, raw, as_json):
    from rich.console import Group
    from rich.text import Text

    from ..analysis import neurons as nrn
    from ..analysis.lens import top_neurons
    from ..render import jsonout
    from ..render import texts as view
    from ..render.tables import header
    from ..render.text import show_token
    from ..session import Session

    session = Session.open(read_text(text), model=model)
    post_path = f"layers.{layer}.mlp_post"
    from ..hooks import RecordOnly

    rec = RecordOnly({post_path})
    session.run(rec)
    post = rec.values[post_path]  # [T, ff]
    found = top_neurons(post, min(top, post.shape[1]))
    pushes = nrn.output_logits(model.params, layer, [f["neuron"] for f in found],
                               through_norm=not raw)
    tok = model.tokenizer
    for f, row in zip(found, pushes, strict=True):
        best = nrn.top_ids(row, 8)
        f["pushes"] = [{"id": int(i), "token": tok.token_str(int(i)), "logit": float(row[i])}
                       for i in best]
    read = "W_out[n] @ W_E^T" if raw else "W_out[n] * ln_final.weight @ W_E^T"
    if as_json:
        jsonout.emit(jsonout.document(post_path, post, session.ids, session.tokens,
                                      layer=layer, top_neurons=found, read_through=read))
        return
    from rich.table import Table

    t = Table(box=None, pad_edge=False, header_style="bold dim")
    for name, just in (("neuron", "right"), ("max", "right"), ("at", "left")):
        t.add_column(name, justify=just, no_wrap=True)
    t.add_column("pushes up", ratio=1)  # wraps between tokens to fit the width
    for f in found:
        t.add_row(f"n{f['neuron']}", f"{f['max']:.3f}",
                  Text(f"{f['position']} {show_token(session.tokens[f['position']])}",
                       style="bold"),
                  view.token_list([p["token"] for p in f["pushes"]],
                                  [p["logit"] for p in f["pushes"]]))
    stdout().print(Group(header(post_path, post),
                         Text(f"pushes up: the logits of {read}", style="dim"), t))


# ------------------------------------------------------------------ diff


@app.command()
def diff(
    text_a: str = typer.Argument(None, help="The first text ('-': stdin).", show_default=False),
    text_b: str = typer.Argument(None, help="The second text (not with --weights-b).",
                                 show_default=False),
    weights: Path = WEIGHTS,
    weights_b: Path = typer.Option(None, "--weights-b", help="Compare this weights folder "
                                   "with --weights on the one text.", show_default=False),
    as_json: bool = JSON,
):
    """Where two runs part: two texts through the model, or one text through two models.

    Two texts: per stage of the residual stream and per position (aligned from the start)
    the cosine similarity and relative distance ||a - b|| / ||a||, and both top predictions.
    --weights-b: per position KL(P_a || P_b), whether the top tokens agree and the change in
    the chance of the actual next token (as llama-perplexity --kl-divergence).
    Example: tinygpt diff "Lily wanted to play with her" "Tom wanted to play with his"
    Example: tinygpt diff "Lily wanted to play" --weights-b runs/a
    """
    from rich.console import Group
    from rich.text import Text

    from ..analysis import diff as diffs
    from ..analysis.lens import residual_stages
    from ..render import jsonout
    from ..render import texts as view
    from ..render.tables import header
    from ..sampling import probabilities
    from ..session import Session

    model = load(weights)
    if weights_b is not None:
        if text_b is not None:
            raise InputError("--weights-b compares two models on one text: give one text")
        _diff_models(model, load(weights_b), read_text(text_a), as_json)
        return
    if text_a is None or text_b is None:
        raise InputError("diff needs two texts, or one text and --weights-b DIR")
    a = Session.open(read_text(text_a), model=model)
    b = Session.open(read_text(text_b), model=model)
    ta, tb = a.trace(), b.trace()
    stages = residual_stages(ta, model.config)
    names = [n for n, _ in stages]
    cos, dist = diffs.stream_diff([h for _, h in stages],
                                  [h for _, h in residual_stages(tb, model.config)])
    n = cos.shape[1]
    tok = model.tokenizer

    def tops(tr):
        p = probabilities(tr.get("logits")[:n])
        best = p.argmax(-1)
        return [(tok.token_str(int(i)), float(p[r, i])) for r, i in enumerate(best)]

    top_a, top_b = tops(ta), tops(tb)
    if as_json:
        jsonout.emit(jsonout.document(
            "diff.relative_distance", dist, a.ids, a.tokens, stages=names, cosine=cos,
            ids_b=b.ids, tokens_b=b.tokens,
            top_a=[{"token": t, "chance": c} for t, c in top_a],
            top_b=[{"token": t, "chance": c} for t, c in top_b]))
        return
    body = view.side_by_side(a.tokens, b.tokens, top_a, top_b, cos, dist, names)
    wide(body).print(Group(
        header("diff.relative_distance", dist, "(stages × positions)"),
        Text("cos and dist: the last stage's (layers."
             f"{model.config.n_layer - 1}.resid_post); dist = ||a - b|| / ||a||", style="dim"),
        body))


def _diff_models(model_a, model_b, text: str, as_json: bool):
    from rich.console import Group
    from rich.text import Text

    from ..analysis import diff as diffs
    from ..render import jsonout
    from ..render import texts as view
    from ..render.tables import header
    from ..session import Session

    if model_a.config != model_b.config:
        raise InputError("the two weights folders have different sizes; diff compares models "
                         "of one shape")
    a = Session.open(text, model=model_a)
    ids_b = model_b.tokenizer.encode(text)
    if ids_b != a.ids:
        raise InputError("the two weights folders' tokenizers split the text differently")
    la, lb = a.run(), Session.open(text, model=model_b).run()
    d = diffs.model_diff(la, lb, a.ids)
    tok = model_a.tokenizer
    top_a = [tok.token_str(int(i)) for i in d.top_a]
    top_b = [tok.token_str(int(i)) for i in d.top_b]
    summary = d.summary()
    if as_json:
        jsonout.emit(jsonout.document(
            "diff.kl", d.kl, a.ids, a.tokens, weights_a=str(model_a.folder),
            weights_b=str(model_b.folder), same_top=d.same_top, delta_p=d.delta_p,
            top_a=top_a, top_b=top_b, summary=summary))
        return
    stdout().print(Group(
        header("diff.kl", d.kl, f"KL(P_a || P_b) per position; a = "
               f"{escape_line(str(model_a.folder))}, b = {escape_line(str(model_b.folder))}"),
        view.kl_table(a.tokens, d.kl, top_a, top_b, d.delta_p),
        Text(f"mean KL {summary['mean_kl']:.4g} nats, max {summary['max_kl']:.4g}; same top "
             f"token {summary['same_top']:.0%}"
             + (f"; Δp of the next token: mean {summary['mean_delta_p']:+.4f}, RMS "
                f"{summary['rms_delta_p']:.4f}" if summary["mean_delta_p"] is not None else ""),
             style="dim")))
