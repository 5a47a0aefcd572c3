"""Commands that read whole texts: score, heads, neurons, diff."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

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
    stderr,
    stdout,
    wide,
)

if TYPE_CHECKING:  # NumPy and the model are imported inside the commands
    import numpy as np

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
    from ..corpus import read_stories

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
    from ..analysis import score as sc
    from ..render import jsonout
    from ..render.texts import score_view

    model = load(weights)
    tok, cfg = model.tokenizer, model.config
    sequences, offset, stream_bpt = _score_inputs(model, text, file, stride, stream, bos)
    check_save(save, force)  # --json streams its lines before the picture could be refused
    stride = stride or cfg.n_positions
    shown = show if show is not None else (sum(map(len, sequences)) < 3000 and not stream)
    token_str = tok.token_strs  # labelled once per tokenizer, even with --each-line
    token_json = _token_json(tok)
    lines = None if not as_json else \
        lambda i, s: jsonout.token_records(sys.stdout, i, s, token_json, stream, offset)
    n_windows = sc.count_windows(map(len, sequences), cfg.n_positions, stride, full_only=stream)
    with progress(n_windows, "scoring", enabled=not as_json) as advance:
        report = sc.score_texts(
            model.params, cfg, sequences, sc.byte_lengths(tok), stride=stride, stream=stream,
            offset=offset, top=top if not as_json or save is not None else 0,
            keep=shown and not as_json, draw=save is not None, stream_bpt=stream_bpt,
            on_scores=lines, progress=advance)
    if save is not None:
        from ..render.analysis_pictures import score_figure

        save_figure(score_figure(report, token_str), save, force)
    if as_json:
        jsonout.emit(jsonout.jsonable(report.summary))
        return
    stdout().print(score_view(report, token_str, tok))


def _score_inputs(model, text, file, stride, stream, bos):
    """(the id sequences to score, how many ids were put before each text, the stream's bytes
    per token with --stream), after checking the options."""
    import numpy as np

    from ..corpus import encode_stories

    tok, cfg = model.tokenizer, model.config
    eot = tok.eot_id
    if stream and file is None:  # the held-out text the weights record
        from ..corpus import read_data_record, validation_text

        if read_data_record(model.folder) is None:
            raise InputError("--stream reads a file: give it with --file (these weights "
                             "have no data.json naming their validation text)")
        file = validation_text(model.folder, None)[0]
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


# ------------------------------------------------------------------ heads

def _texts_for_heads(model, text: str | None, file: Path | None, stories: int
                     ) -> tuple[list[list[int]], str]:
    """Each text as [separator, ids...] cut to the context: the texts given, else a few
    validation stories, else the built-in sentences."""
    from ..corpus import read_stories

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

    from ..analysis import heads as detect
    from ..render import jsonout
    from ..render import texts as view

    model = load(weights)
    if text is not None and text_opt is not None:
        raise InputError("give the text once: as the argument or with --text")
    ids, source = _texts_for_heads(model, text if text is not None else text_opt, file, stories)
    r = detect.heads_report(model.params, model.config, ids, source, length=length,
                            batch=batch, seed=seed, separator=model.tokenizer.eot_id,
                            exclude_first=exclude_first, exclude_current=exclude_current)
    if save is not None:
        from ..render.analysis_pictures import heads_figure

        save_figure(heads_figure(r), save, force)
    if as_json:
        jsonout.emit(jsonout.document(
            "heads", np.stack(list(r.table.values())), kinds=list(r.table), texts=r.texts,
            source=source, text_ids=ids, exclude_bos=exclude_first,
            exclude_current=exclude_current, repeat=r.repeat))
        return
    stdout().print(view.heads_view(r))


# ------------------------------------------------------------------ neurons

def _neuron_maxima(model, files: list[Path], enabled: bool) -> dict[str, np.ndarray]:
    """corpus_maxima of every neuron over the files and their token stream, computed once per
    (weights, data) and kept in the cache folder."""
    import numpy as np

    from .. import cache
    from ..analysis import neurons as nrn
    from ..corpus import encode_stories, eval_windows, read_stories
    from ..files import sha256

    cfg = model.config

    def compute():
        stream = encode_stories(read_stories(files), model.tokenizer)
        x, _ = eval_windows(stream.ids, cfg.n_positions)
        if len(x) == 0:
            raise InputError(f"the data has {len(stream.ids)} tokens, less than one window of "
                             f"{cfg.n_positions}")
        with progress(len(x), "neuron maxima", enabled=enabled) as advance:
            maxima = nrn.corpus_maxima(model.params, cfg, x, progress=advance)
        return {"stream": stream.ids.astype(np.uint16), **maxima}

    key = cache.key_of("neurons-v1", sha256(model.weights_file),
                       *(sha256(f) for f in files), str(cfg.n_positions), str(nrn.NEURON_TOP))
    return cache.load_or_compute(cache.entry("neurons", key), cache.load_arrays, compute,
                                 cache.store_arrays, lambda e: _valid_neuron_entry(e, cfg))


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
    any_data: bool = typer.Option(False, "--any-data", help="Use --data even where it is not "
                                  "the text WEIGHTS/data.json records."),
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
    from ..analysis import neurons as nrn
    from ..render import jsonout
    from ..render import texts as view
    from ..render.text import escape_line

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
    files, note = _data_files(data, model.folder, any_data)
    maxima = _neuron_maxima(model, files, enabled=not as_json)
    if note:  # once the maxima stand: an error is then the only line
        stderr().print(escape_line(note), soft_wrap=True)
    ex = nrn.neuron_examples(model.params, cfg, maxima, maxima["stream"], layer, neuron, top,
                             tok.token_str)
    if as_json:
        jsonout.emit(jsonout.document(
            ex.path, ex.acts, layer=layer, neuron=neuron, examples=ex.rows, window_ids=ex.ids,
            window_tokens=[[tok.token_str(int(i)) for i in w] for w in ex.ids],
            data=[str(f) for f in files]))
        return
    stdout().print(view.neuron_examples_view(ex, tok.token_str, [f.name for f in files]))


def _data_files(data: Path | None, weights: Path, any_data: bool
                ) -> tuple[list[Path], str | None]:
    """The files to search, and the note to print when the weights record no text."""
    from ..corpus import check_data, read_data_record, recorded_folder, split_data, training_text

    record = read_data_record(weights) if data is None else None
    if record is not None and recorded_folder(weights, record) is not None:
        return training_text(weights, None).files, None  # the text the weights record
    if data is None:
        found = find_data()
        if found is None or not found.is_dir():
            raise InputError("--neuron needs --data: a file or folder of stories to search")
        try:
            train, _ = split_data([found])
        except ValueError as e:
            raise InputError(str(e)) from None
        return train, None
    try:
        train, val = split_data([data])
    except ValueError as e:
        raise InputError(str(e)) from None
    files = train if Path(data).is_dir() and train else train + val
    return files, check_data(weights, files, any_data=any_data)


def _neurons_on_text(model, text, layer, top, raw, as_json):
    from ..analysis import neurons as nrn
    from ..render import jsonout
    from ..render import texts as view
    from ..session import Session

    session = Session.open(read_text(text), model=model)
    tn = nrn.neurons_on_text(session, layer, top, raw=raw)
    if as_json:
        jsonout.emit(jsonout.document(tn.path, tn.post, session.ids, session.tokens,
                                      layer=layer, top_neurons=tn.found, read_through=tn.read))
        return
    stdout().print(view.text_neurons_view(tn, session.tokens))


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
    from ..analysis import diff as diffs
    from ..render import jsonout
    from ..render import texts as view
    from ..session import Session

    model = load(weights)
    if weights_b is not None:
        if text_b is not None:
            raise InputError("--weights-b compares two models on one text: give one text")
        d = diffs.models_diff(model, load(weights_b), read_text(text_a))
        if as_json:
            jsonout.emit(jsonout.document(
                "diff.kl", d.diff.kl, d.a.ids, d.a.tokens, weights_a=str(model.folder),
                weights_b=str(d.b.model.folder), same_top=d.diff.same_top,
                delta_p=d.diff.delta_p, top_a=d.top_a, top_b=d.top_b, summary=d.diff.summary()))
            return
        stdout().print(view.models_diff_view(d))
        return
    if text_a is None or text_b is None:
        raise InputError("diff needs two texts, or one text and --weights-b DIR")
    d = diffs.text_diff(Session.open(read_text(text_a), model=model),
                        Session.open(read_text(text_b), model=model))
    if as_json:
        jsonout.emit(jsonout.document(
            "diff.relative_distance", d.distance, d.a.ids, d.a.tokens, stages=d.stages,
            cosine=d.cosine, ids_b=d.b.ids, tokens_b=d.b.tokens,
            top_a=[{"token": t, "chance": c} for t, c in d.top_a],
            top_b=[{"token": t, "chance": c} for t, c in d.top_b]))
        return
    v = view.text_diff_view(d)
    wide(v.renderables[-1]).print(v)  # as wide as the side-by-side table needs
