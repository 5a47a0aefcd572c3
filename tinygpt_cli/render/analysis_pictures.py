"""The pictures of the analysis commands (lens, dla, ablate, patch, score, heads), built from
the results they already computed.

Like render.pictures: plain arrays, token strings and small dicts in, a Figure out; no Run, no
model, no terminal. Values keep their dtype, so a cell's hover text is the number --json prints.
"""

from __future__ import annotations

import numpy as np

from ..words import count
from .explain import lens_note
from .figure import Bars, Curve, Facts, Figure, Heatmap, Note, Row, Table, token_labels
from .tables import short_stage
from .text import HEAD_KINDS as names
from .text import LN2, neuron_scales, scales, show_token


def _for_text(tokens: list[str]) -> str:
    return "for the text " + " ".join(token_labels(tokens))


def layer_labels(n: int) -> list[str]:
    return [f"layer {i}" for i in range(n)]


def head_labels(n: int) -> list[str]:
    return [f"head {h}" for h in range(n)]


# ------------------------------------------------------------------ lens


def lens_figure(r) -> Figure:
    """A LensReport (analysis.lens): the likeliest next token at every position and stage,
    and its chance, laid out as the terminal lays them out (a row per position, a column per
    stage, named as its columns are); the target's chance at its position."""
    stages, tokens, top_tokens, top_probs = r.stages, r.q.tokens, r.top_tokens, r.top_probs
    target, position = r.q.target_pair, r.q.position
    target_probs, target_ranks = r.target_probs, r.target_ranks
    labels = token_labels(tokens)
    t_id, t_str = target

    short = [short_stage(s) for s in stages]
    return Figure(f"{r.kind} lens", [
        Heatmap(top_probs.T, labels, short, path="lens", lo=0.0, hi=1.0,
                title="the likeliest next token's chance, after each stage",
                note=lens_note(r.kind, r.tied)),
        Table(["position"] + short,
              [[label] + [show_token(x) for x in row]
               for label, row in zip(labels, top_tokens, strict=True)],
              title="the likeliest next token, after each stage",
              note="emb: the embeddings; i.mid: block i's residual stream after its "
                   "attention; i.post: after its MLP"),
        Bars([f"{stage} (rank {int(r)})" for stage, r in zip(stages, target_ranks, strict=True)],
             [float(p) for p in target_probs], percent=True, value_name="chance",
             title=f"the target at position {position} ({labels[position]}): "
                   f"{show_token(t_str)} (id {t_id}), its chance after each stage"),
    ], subtitle=_for_text(tokens))


# ------------------------------------------------------------------ direct logit attribution


def dla_figure(r, top: int) -> Figure:
    """A DLAReport (analysis.dla): the head rows as a layer × head grid (signed: blue takes
    away, red adds), the `top` largest parts, and the largest single neurons when --neurons
    listed them."""
    labels, values, heads, score = r.dla.labels, r.dla.values, r.dla.heads, r.dla.score
    what, position, neurons = r.q.what, r.q.position, r.dla.neurons
    frozen = r.dla.frozen
    token = r.q.tokens[position]
    n_layer, n_head = heads.shape
    order = np.argsort(-np.abs(values), kind="stable")[:top]
    parts: list = [
        Facts([("score", f"{what} = {score:.6g}"),
               ("the parts add up to", f"{float(np.sum(values)):.6g}"),
               ("position", f"{position} ({show_token(token)})")]),
        Heatmap(heads, layer_labels(n_layer), head_labels(n_head), path="dla.heads",
                signed=True, title=f"heads (z_h W_O[h], through {scales(frozen['heads'])})"),
        Bars([labels[k] for k in order], [float(values[k]) for k in order], path="dla",
             value_name="share", title=f"the {len(order)} largest parts of {len(labels)}"),
    ]
    if neurons:
        parts.append(Bars([f"L{n['layer']} n{n['neuron']}" for n in neurons],
                          [float(n["value"]) for n in neurons], value_name="share",
                          path="dla.top_neurons",
                          title=f"the {len(neurons)} largest single neurons",
                          note=f"mlp_post[n] W_2[n]{neuron_scales(frozen['mlp'])}; part of their "
                          "block's mlp row"))
    return Figure("dla", parts, subtitle=f"{len(labels)} parts of the stream at position "
                  f"{position} ({show_token(token)})")


# ------------------------------------------------------------------ ablation


def ablation_figure(r, n_layer: int, n_head: int) -> Figure:
    """An AblationReport (analysis.ablate) as a picture: every component's grids, or one's."""
    target, position, first = r.q.target_pair, r.q.position, r.rows[0]
    if r.every:
        return ablate_all_figure(r.rows, n_layer, n_head, r.mode, target, position,
                                 first["logp_before"])
    return ablate_figure(first["label"], r.mode, target, position, first["logp_before"],
                         first["logp_after"], first["kl"], r.top_before, first["top_after"])


def ablate_all_figure(rows: list[dict], n_layer: int, n_head: int, mode: str,
                      target: tuple[int, str], position: int, logp_before: float) -> Figure:
    """rows: {component (trace path), label, delta, kl}, ranked. Δ log p(target) and the KL
    divergence as layer × (heads, mlp) grids, and Δ log p ranked."""
    delta = np.full((n_layer, n_head + 1), np.nan)
    kl = np.full((n_layer, n_head + 1), np.nan)
    for r in rows:
        parts = r["component"].split(".")  # layers.L.heads.H.out or layers.L.mlp_out
        i, j = int(parts[1]), (int(parts[3]) if parts[2] == "heads" else n_head)
        delta[i, j], kl[i, j] = r["delta"], r["kl"]
    cols = head_labels(n_head) + ["mlp"]
    t_id, t_str = target
    return Figure("ablate --all", [
        Facts([("target", f"{show_token(t_str)} (id {t_id}) at position {position}"),
               ("log p before", f"{logp_before:.6g}"), ("mode", mode)]),
        Row([Heatmap(delta, layer_labels(n_layer), cols, signed=True, path="ablate.delta",
                     title="change in log p(target)"),
             Heatmap(kl, layer_labels(n_layer), cols, lo=0.0, path="ablate.kl",
                     title="KL(before ‖ after), nats")]),
        Bars([r["label"] for r in rows], [float(r["delta"]) for r in rows],
             value_name="Δ log p", path="ablate.delta",
             title=f"{len(rows)} components, ranked by |Δ log p(target)|"),
    ], subtitle=f"each head and each MLP taken out in turn (mode {mode})")


def ablate_figure(label: str, mode: str, target: tuple[int, str], position: int,
                  logp_before: float, logp_after: float, kl: float,
                  top_before: list[dict], top_after: list[dict]) -> Figure:
    """One component taken out: the numbers, and the top tokens before and after."""
    t_id, t_str = target

    def bars(rows: list[dict], title: str) -> Bars:
        return Bars([show_token(d["token"]) for d in rows], [float(d["chance"]) for d in rows],
                    ids=[int(d["id"]) for d in rows], percent=True, value_name="chance",
                    title=title)

    return Figure(f"ablate {label}", [
        Facts([("target", f"{show_token(t_str)} (id {t_id}) at position {position}"),
               ("log p(target)", f"{logp_before:.6g} → {logp_after:.6g} "
                                 f"(change {logp_after - logp_before:+.6g})"),
               ("KL(before ‖ after)", f"{kl:.6g} nats"), ("mode", mode)]),
        Row([bars(top_before, "top before"), bars(top_after, "top after")]),
    ], subtitle=f"{label} taken out (mode {mode})")


# ------------------------------------------------------------------ patching


def patch_figure(r) -> Figure:
    """A PatchReport (analysis.patch): stream[kind] [n_layer, T] fractions restored, as
    layer × position heatmaps (positions after the scored one left blank: they cannot change
    it); heads: [n_layer, n_head]."""
    stream, heads, tokens, position = r.result.stream, r.result.heads, r.q.tokens, r.q.position
    clean, corrupt, what, method, corr = (r.result.clean, r.result.corrupt, r.q.what, r.method,
                                          r.correlation)
    n_layer, n_head = heads.shape
    labels = token_labels(tokens)
    later = np.zeros((n_layer, len(tokens)), dtype=bool)
    later[:, position + 1:] = True
    facts = [("metric", what), ("clean", f"{clean:.6g}"), ("corrupt", f"{corrupt:.6g}"),
             ("scored at", f"position {position} ({labels[position]})"), ("method", method)]
    if corr is not None:
        facts.append(("correlation with activation patching", f"{corr:.3f}"))
    return Figure("patch", [
        Facts(facts),
        Note("each cell: (patched − corrupt) / (clean − corrupt); 1 restores the clean "
             "prediction, 0 changes nothing", "dim"),
        Row([Heatmap(np.asarray(g).T, labels, layer_labels(n_layer), title=kind,
                     path=f"patch.{kind}", masked=later.T, signed=True)
             for kind, g in stream.items()]),
        Heatmap(heads, layer_labels(n_layer), head_labels(n_head), path="patch.heads",
                signed=True, title="each head's output, patched at every position"),
    ], subtitle=f"{method}: fraction of the logit difference restored, " + _for_text(tokens))


# ------------------------------------------------------------------ score


def score_figure(report, token_str: list[str]) -> Figure:
    """The totals of a ScoreReport (analysis.score), each drawn text's tokens coloured by
    surprisal (bits; one row a text, cut to report.drawn_tokens in all: one --stream text can be a
    whole file), and the most surprising tokens."""

    summary, budget, drawn = report.summary, report.drawn_tokens, []
    for d in report.drawn:
        drawn.append(([token_str[int(x)] for x in d.targets[:budget]], d.bits[:budget]))
        budget -= len(drawn[-1][1])
    facts = [(label, f.format(summary[key])) for key, label, f in (
        ("tokens", "tokens", "{:,}"), ("mean_nats", "mean loss", "{:.6g} nats"),
        ("perplexity", "perplexity", "{:.6g}"), ("bits_per_token", "bits per token", "{:.6g}"),
        ("bits_per_byte", "bits per byte", "{:.6g}"), ("sequences", "texts", "{:,}"))
        if summary.get(key) is not None]
    parts: list = [Facts(facts)]
    for k, (tokens, bits) in enumerate(drawn):
        parts.append(Heatmap(np.asarray(bits)[None, :], ["bits"], token_labels(tokens),
                             lo=0.0, path="score.bits",
                             title=f"text {k}" if len(drawn) > 1 else "surprisal"))
    more = len(report.sequences) - len(report.drawn)
    if more:
        parts.append(Note(f"{count(more, 'more text')} scored but not drawn",
                          "dim"))
    if report.worst:
        o = report.offset
        parts.append(Bars([f"{show_token(token_str[int(report.sequences[i][o + p])])} @{p}"
                           for _, i, p, *_ in report.worst],
                          [nats / LN2 for nats, *_ in report.worst], value_name="bits",
                          title="most surprising tokens"))
    return Figure("score", parts, subtitle="surprisal of each token, −log₂ p, in bits")


# ------------------------------------------------------------------ heads


def heads_figure(r) -> Figure:
    """A HeadsReport (analysis.heads): one layer × head heatmap of each detector's score
    (0..1)."""

    table, texts, source, repeat = r.table, r.texts, r.source, r.repeat
    n_layer, n_head = next(iter(table.values())).shape
    return Figure("heads", [
        Facts([("texts", f"{texts} from {source}"),
               ("random repeats", f"{repeat['batch']} × {repeat['length']} tokens, seed "
                                  f"{repeat['seed']}: loss {repeat['loss_first']:.4f} → "
                                  f"{repeat['loss_second']:.4f} nats")]),
        Row([Heatmap(v, layer_labels(n_layer), head_labels(n_head), title=names.get(k, k),
                     path=f"heads.{k}", lo=0.0, hi=1.0) for k, v in table.items()]),
        Note("score = sum(A * P) / sum(A) over each head's attention grid A, with P the "
             "pattern's 0/1 grid; induction (random): attention to the token after the first "
             "copy", "dim"),
    ], subtitle=f"{n_layer} layers × {n_head} heads")


# ------------------------------------------------------------------ history


def _stepped(rows: list[dict], values: list) -> tuple[list[float], list[float]]:
    """The (step, value) points of the snapshots that have both (the final weights of a run
    whose last snapshot is not them have no step)."""
    points = [(r["step"], v) for r, v in zip(rows, values, strict=True)
              if r["step"] is not None and v is not None]
    return [float(s) for s, _ in points], [float(v) for _, v in points]


def loss_history_figure(rows: list[dict], tokens: list[str], uniform: float) -> Figure:
    """history: the loss on the text at every snapshot against its step (log-spaced, so on a
    log scale), with the loss of evenly spread chances (ln V) where training starts."""
    x, y = _stepped(rows, [r["loss"] for r in rows])
    return Figure("history", [
        Curve(x, y, title="the loss on the text over training", x_name="step",
              y_name="loss (nats per token)", log_x=True,
              levels=[(uniform, f"every token equally likely: ln V = {uniform:.2f}")]),
        Table(["snapshot", "loss", "next token", "chance"],
              [[r["label"], r["loss"], show_token(r["top_token"]), r["top_chance"]]
               for r in rows], title="the likeliest next token after the text"),
    ], subtitle=_for_text(tokens))


def heads_history_figure(scores: dict, rows: list[dict], tokens: list[str],
                         induction_length: int) -> Figure:
    """history --heads: every head's previous-token score on the text and induction score on
    repeated random tokens, a snapshot × head grid per layer; and the head whose
    previous-token score rose most, against the step, beside the chance level."""
    prev, induction = scores["previous_token"], scores["induction"]  # [S, L, H]
    chance, labels = scores["previous_token_chance"], [r["label"] for r in rows]
    _, n_layer, n_head = prev.shape
    rise = prev[-1] - prev[0]
    layer, head = np.unravel_index(int(np.argmax(rise)), rise.shape)
    x, y = _stepped(rows, list(prev[:, layer, head]))
    return Figure("history --heads", [
        Curve(x, y, title=f"layer {layer} head {head}: the previous-token score that rose most",
              path=f"layers.{layer}.heads.{head}", x_name="step", y_name="previous-token score",
              log_x=True, levels=[(chance, f"evenly spread attention: {chance:.3f}")]),
        Row([Heatmap(prev[:, i], labels, head_labels(n_head), title=f"layer {i}",
                     path=f"layers.{i}.previous_token", lo=0.0, hi=1.0)
             for i in range(n_layer)]),
        Note(f"previous-token score on the text: the share of each head's attention on the "
             f"token just before; {chance:.3f} if it spread its attention evenly", "dim"),
        Row([Heatmap(induction[:, i], labels, head_labels(n_head), title=f"layer {i}",
                     path=f"layers.{i}.induction", lo=0.0, hi=1.0)
             for i in range(n_layer)]),
        Note(f"induction score on {induction_length} random tokens repeated: attention to the "
             "token after the earlier copy of the current one", "dim"),
    ], subtitle=_for_text(tokens))


def value_history_figure(history, tokens: list[str]) -> Figure:
    """history PATH: the value's norm at every snapshot against its step."""
    rows = history.rows
    x, y = _stepped(rows, [r["norm"] for r in rows])
    return Figure("history", [
        Curve(x, y, title=f"{history.shown}: its norm over training", path=history.shown,
              x_name="step", y_name="norm", log_x=True),
        Table(["snapshot", "norm", "mean", "std"],
              [[r["label"], r["norm"], r["mean"], r["std"]] for r in rows]),
    ], subtitle=_for_text(tokens))


__all__ = ["ablate_all_figure", "ablate_figure", "dla_figure", "heads_figure",
           "heads_history_figure", "lens_figure", "loss_history_figure", "patch_figure",
           "score_figure", "value_history_figure"]
