"""Commands that read whole texts: score, heads, neurons, diff, quant."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from .app import app
from .common import (
    ANY_DATA,
    FORCE,
    JSON,
    LAYER,
    POSITION,
    QUIET,
    SAVE,
    TARGET,
    TEXT,
    WEIGHTS,
    InputError,
    bar,
    check_index,
    check_save,
    cut,
    engine,
    figures,
    load,
    offering_last,
    open_session,
    present,
    progress,
    read_text,
    read_whole,
    stderr,
    steered,
    wide,
)
from .steering import own_length, steerable

if TYPE_CHECKING:
    from .context import RunContext

# NumPy and the model are imported inside the commands

# ------------------------------------------------------------------ score

@app.command()
@steerable
@own_length
def score(
    context: RunContext,
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
                             "so its first token is scored too, as after a story separator "
                             "(a text: the folder's <bos> instead, when its tokenizer puts "
                             "one; none before a --chat text, which holds its own)."),
    closing: bool = typer.Option(True, "--closing-separator/--no-closing-separator",
                                 help="--file: score a closing <|endoftext|> after the last "
                                 "story even where the file does not end with one, as the "
                                 "model card counts (a note says when it is added); --no-...: "
                                 "only the separators the file holds."),
    top: int = typer.Option(10, "--top", "-n", min=0, help="How many surprising tokens to list."),
    show: bool = typer.Option(None, "--show-text/--no-show-text", help="Print the coloured "
                              "text (default: when it is under 3,000 tokens).",
                              show_default=False),
    as_json: bool = JSON, save: Path = SAVE, force: bool = FORCE, quiet: bool = QUIET,
):
    """How surprised the model is by each token: surprisal, rank, chance, entropy; totals.

    Surprisal is -log p of the token that comes next (nats; bits = nats / ln 2). A file is
    split into stories at <|endoftext|>; each story is read after a separator and its closing
    separator is scored too, so bytes count as in the model card (the last story's, when the
    file does not end with one, only with a note; --no-closing-separator leaves it out).
    --json prints one line per token, then a summary line (closing_separator_added).

    Example: tinygpt score "Lily wanted to play with her ball."
    Example: tinygpt score --stream --json
    """
    from ..analysis import score as sc
    from ..jobs.score import score_inputs, scored_on
    from ..render import jsonout
    from ..render.texts import score_view

    model = load(context, weights)
    tok, cfg = model.tokenizer, model.config
    hooks, changes = steered(context, model)
    check_save(save, force)  # before a long text is read and tokenised, and lines stream
    # a --chat text holds its own <bos>: nothing is put before it
    sequences, offset, stream_bpt, added = score_inputs(model, text, read_text, file, stride,
                                                        stream, bos and not context.chat,
                                                        closing)
    stride = stride or cfg.n_positions
    shown = show if show is not None else (sum(map(len, sequences)) < 3000 and not stream)
    token_str = tok.token_strs  # labelled once per tokenizer, even with --each-line
    token_json = jsonout.token_json(tok)
    lines = None if not as_json else \
        lambda i, s: jsonout.token_records(sys.stdout, i, s, token_json, stream, offset)
    n_windows = sc.count_windows(map(len, sequences), cfg.n_positions, stride, full_only=stream)
    with progress(n_windows, "scoring", enabled=not as_json, pipe_every=5) as advance, \
            engine(context) as where:
        report = sc.score_texts(
            model.params, cfg, sequences, sc.byte_lengths(tok), stride=stride, stream=stream,
            offset=offset, top=top if not as_json or save is not None else 0,
            keep=shown and not as_json, draw=save is not None, stream_bpt=stream_bpt,
            on_scores=lines, progress=advance, hooks=hooks, ahead=context.ahead,
            scored=scored_on(where if where.remote else None))
    if added and not context.quiet:  # a token the file does not hold is in the totals
        stderr().print("note: scored a closing <|endoftext|> after the last story, which the "
                       "file does not end with (--no-closing-separator leaves it out)",
                       style="dim", soft_wrap=True)
    summary = {**report.summary, "closing_separator_added": bool(added), **changes}
    present(context, as_json, lambda: jsonout.jsonable(summary),
            lambda: score_view(report, token_str, tok),
            figure=lambda: figures().score_figure(report, token_str), save=save, force=force)


# ------------------------------------------------------------------ heads


@app.command()
@steerable
@own_length
def heads(
    context: RunContext,
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
    Example: tinygpt heads --stories 16 --json
    """
    from ..analysis import heads as detect
    from ..jobs.heads import texts_for_heads
    from ..render import texts as view
    from ..render.documents import heads_document

    model = load(context, weights)
    if text is not None and text_opt is not None:
        raise InputError("give the text once: as the argument or with --text")
    ids, source = texts_for_heads(model.tokenizer, model.config.n_positions,
                                  text if text is not None else text_opt, read_text, file,
                                  stories)
    hooks, changes = steered(context, model)
    r = detect.heads_report(model.params, model.config, ids, source, length=length,
                            batch=batch, seed=seed, separator=model.tokenizer.start_id,
                            exclude_first=exclude_first, exclude_current=exclude_current,
                            hooks=hooks)
    present(context, as_json,
            lambda: heads_document(r, ids, exclude_first, exclude_current, changes),
            lambda: view.heads_view(r), figure=lambda: figures().heads_figure(r), save=save,
            force=force)


# ------------------------------------------------------------------ neurons

@app.command()
@steerable
def neurons(
    context: RunContext,
    text: str = TEXT, weights: Path = WEIGHTS, layer: int = LAYER,
    neuron: int = typer.Option(None, "--neuron", help="One neuron: list the windows of "
                               "--data where it fires most.", show_default=False),
    data: Path = typer.Option(None, "--data", help="Stories to search for --neuron: a file or "
                              "a folder of part-*.txt (default: the training parts of the "
                              "project's data, when it is there).", show_default=False),
    any_data: bool = ANY_DATA,
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
    Example: tinygpt neurons --layer 2 --neuron 17
    """
    from ..analysis import neurons as nrn
    from ..escapes import escape_line
    from ..jobs.corpus import search_files
    from ..jobs.neurons import cached_maxima
    from ..render import texts as view
    from ..render.documents import neuron_examples_document, text_neurons_document

    model = load(context, weights)
    cfg, tok = model.config, model.tokenizer
    layer = check_index(layer, cfg.n_layer, "layer")
    if neuron is None:
        if data is not None:
            raise InputError("--data is searched for one neuron: give --neuron N too")
        s = open_session(context, None, text, model=model)
        tn = nrn.neurons_on_text(s, layer, top, raw=raw)
        return present(context, as_json, lambda: text_neurons_document(tn, s, layer),
                       lambda: view.text_neurons_view(tn, s.tokens))
    neuron = check_index(neuron, cfg.n_inner, "neuron")
    if text is not None:
        raise InputError("--neuron searches --data, not a text: leave the text out")
    files, note = search_files(data, model.folder, any_data=any_data)
    hooks, changes = steered(context, model)
    with engine(context) as where:
        maxima = cached_maxima(model, files, bar(), hooks, where)
    if note:  # once the maxima stand: an error is then the only line
        stderr().print(escape_line(note), soft_wrap=True)
    ex = nrn.neuron_examples(model.params, cfg, maxima, maxima["stream"], layer, neuron, top,
                             tok.token_str, hooks)
    present(context, as_json, lambda: neuron_examples_document(ex, tok.token_str, files, changes),
            lambda: view.neuron_examples_view(ex, tok.token_str, [f.name for f in files]))


# ------------------------------------------------------------------ diff


@app.command()
@steerable
def diff(
    context: RunContext,
    text_a: str = typer.Argument(None, help="The first text ('-': stdin).", show_default=False),
    text_b: str = typer.Argument(None, help="The second text (not with --weights-b).",
                                 show_default=False),
    weights: Path = WEIGHTS,
    weights_b: Path = typer.Option(None, "--weights-b", help="Compare this weights folder "
                                   "with --weights on the one text: any model of the same "
                                   "tokenizer, whatever its shape.", show_default=False),
    as_json: bool = JSON,
):
    """Where two runs part: two texts through the model, or one text through two models.

    Two texts: per stage of the residual stream and per position (aligned from the start)
    the cosine similarity and relative distance ||a - b|| / ||a||, and both top predictions.
    --weights-b: per position KL(P_a || P_b), whether the top tokens agree and the change in
    the chance of the actual next token (as llama-perplexity --kl-divergence). The two models
    may differ in every size and family: only their tokenizers must give the same ids (same
    vocabulary, merges, special tokens and normalisation); the JSON's shapes_differ lists
    what differs.
    Example: tinygpt diff "Lily wanted to play with her" "Tom wanted to play with his"
    Example: tinygpt diff "Lily wanted to play" --weights-b runs/a
    """
    from ..analysis import diff as diffs
    from ..jobs.diff import second_session
    from ..render import texts as view
    from ..render.documents import models_diff_document, text_diff_document

    model = load(context, weights)
    if weights_b is not None:
        if text_b is not None:
            raise InputError("--weights-b compares two models on one text: give one text")
        from .steering import steering

        model_b = load(context, weights_b)
        a = open_session(context, None, text_a, model=model)
        d = diffs.models_diff(a, second_session(a, model_b, steering(context, model_b)[0]))
        return present(context, as_json, lambda: models_diff_document(d, model.folder),
                       lambda: view.models_diff_view(d))
    if text_a is None or text_b is None:
        raise InputError("diff needs two texts, or one text and --weights-b DIR")
    a = open_session(context, None, text_a, model=model)
    d = diffs.text_diff(a, a.reopen(read_text(text_b, model)))
    present(context, as_json, lambda: text_diff_document(d), lambda: view.text_diff_view(d),
            console=lambda v: wide(context, v.renderables[-1]))  # as wide as the side-by-side table


# ------------------------------------------------------------------ quant


@app.command()
def quant(
    context: RunContext,
    text: str = TEXT, weights: Path = WEIGHTS,
    against: Path = typer.Option(..., "--against", help="The reference: the float weights "
                                 "folder (or GGUF file) the quantized --weights was made from; "
                                 "the same tokenizer and shapes.", show_default=False),
    file: Path = typer.Option(None, "--file", "-f", help="Over a text file instead: mean KL and "
                              "top-1 agreement as llama-perplexity --kl-divergence counts them.",
                              show_default=False),
    ctx: int = typer.Option(None, "--ctx", min=4, help="--file: tokens per chunk (default: "
                            "the model's context).", show_default=False),
    position: int = POSITION, target: str = TARGET,
    top: int = typer.Option(12, "--top", "-n", min=1, help="How many tensors to list."),
    restore: int = typer.Option(5, "--restore", min=0, help="Check the largest this many "
                                "first-order estimates by putting the tensor back."),
    act_quant: bool = typer.Option(False, "--act-quant", help="Round each matrix product's "
                                   "input as llama.cpp's CPU path does for the weight type "
                                   "(Q8_0 blocks of 32 for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, Q8_K "
                                   "blocks of 256 for the K-quants, float16 for F16; q, k, v "
                                   "and the pattern float16 as its default KV cache) in the "
                                   "quantized model's passes."),
    as_json: bool = JSON, save: Path = SAVE, force: bool = FORCE, quiet: bool = QUIET,
):
    """What quantization changed: one text through a model and its quantized copy.

    Per stage of the residual stream (embeddings, after each block) and position the relative
    change ||h_q - h_ref|| / ||h_ref|| (and over all positions); per head the total variation
    of its attention pattern, 1/2 sum_j |A_ref[i,j] - A_q[i,j]| (the share of a row's attention
    that moved), averaged over the rows; per position KL(P_ref || P_q) of the next token
    (nats) and whether the top-1 tokens agree; and the tensors ranked by the first-order
    change of log p(target) were each put back at full precision alone, sum dlogp/dW *
    (W_ref - W_q) with the exact gradient, the largest --restore checked by doing it.
    --file: the stream in chunks of --ctx tokens, each chunk's second half scored, mean KL
    and "same top p" as llama-perplexity --kl-divergence.
    Both models compute in float32 with the dequantized weights; llama.cpp's CPU matrix
    products also round the activations (to Q8_0 or Q8_K) first: --act-quant imitates that.
    Example: tinygpt quant "Lily wanted to play" --weights q4_0.gguf --against weights/llama
    """
    from ..analysis import quant as qa
    from ..render import quant as view

    check_save(save, force)
    model, ref = load(context, weights), load(context, against)
    qa.check_pair(model, ref)
    hook, act = qa.act_quant_hook(model) if act_quant else (None, None)
    names = str(model.weights_file), str(ref.weights_file)
    if file is not None:
        from ..jobs.corpus import read_user_file

        n_ctx = ctx or model.config.n_positions
        if n_ctx > model.config.n_positions:
            raise InputError(f"--ctx {n_ctx}: the model reads at most "
                             f"{model.config.n_positions} tokens")
        bos = qa.chunk_bos(model)
        stream = [bos] * (bos is not None) + model.tokenizer.encode(read_user_file(file, "--file"))
        with progress(len(stream) // n_ctx, "chunks", enabled=not (as_json or quiet)) as step:
            f = qa.file_kl(ref.params, model.params, model.config, stream, n_ctx, bos=bos,
                           hooks_q=hook, progress=step)
        if not f.chunks:
            raise InputError(f"--file {file}: {len(stream)} tokens, fewer than one chunk of "
                             f"{n_ctx}")
        return present(context, as_json, lambda: view.file_kl_document(f, *names, act),
                       lambda: view.file_kl_view(f, *names, act))
    from ..jobs.session import Session

    with offering_last(context):  # no steering: the two models' own runs
        whole, before = read_whole(context, text, model)
        s = Session.open(whole, model=model, last=context.last, before=before)
    if s.dropped:
        cut(context, s.dropped)
    r = qa.quant_report(ref.params, model.params, model.config, s.ids,
                        position=s.position(position),
                        target=None if target is None else s.token_id(target),
                        restore=restore, hooks_q=hook)
    qa.name_files(r, model)
    tok = model.tokenizer.token_str
    present(context, as_json, lambda: view.quant_document(r, s.tokens, tok, *names, act),
            lambda: view.quant_view(r, s.tokens, tok, *names, top, act),
            figure=lambda: view.quant_figure(r, s.tokens, tok, names[0], act),
            save=save, force=force)
