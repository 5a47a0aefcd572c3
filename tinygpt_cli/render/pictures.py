"""The pictures of the drawing commands, built from the values they already computed.

Each function takes plain arrays, token strings and small dicts (no Run, no model) and returns
a Figure; the command passes it to `save_figure`.
"""

from __future__ import annotations

import numpy as np

from ..words import held
from .figure import (
    Bars,
    Facts,
    Figure,
    Flow,
    Heatmap,
    Note,
    Row,
    Section,
    Table,
    attention_figure,
    shape_text,
    token_labels,
    value_parts,
)
from .text import added_names, show_text, show_token


def top_bars(path: str, rows: list[dict], value_name: str, *, percent: bool = False,
             title: str = "", note: str = "") -> Bars:
    """Ranked tokens ({"id", "token", value_name}) as bars."""
    return Bars([show_token(r["token"]) for r in rows], [float(r[value_name]) for r in rows],
                title=title, path=path, value_name=value_name, ids=[int(r["id"]) for r in rows],
                percent=percent, note=note)


def top_figure(path: str, rows: list[dict], value_name: str, tokens: list[str], *,
               percent: bool = False, note: str = "") -> Figure:
    """`logits` and `probs`: the highest entries of one vocabulary-sized row."""
    return Figure(path, [top_bars(path, rows, value_name, percent=percent, note=note)],
                  subtitle="for the text " + " ".join(token_labels(tokens)))


def neurons_figure(path: str, value: np.ndarray, tokens: list[str], layer: int,
                   neurons: list[dict]) -> Figure:
    """`mlp`: the block's output, then its most active hidden neurons at every token."""
    acts = np.stack([n["activations"] for n in neurons], axis=1)
    labels = token_labels(tokens)
    return Figure(path, value_parts(path, value, tokens) + [
        Heatmap(acts, labels, [f"n{n['neuron']}" for n in neurons],
                title="most active hidden neurons", path=f"layers.{layer}.mlp_post")],
        subtitle=f"{shape_text(value.shape)} for the text " + " ".join(labels))


def block_table(summary: list[dict], tok, position: int, tokens: list[str]) -> Table:
    """analysis.lens.block_summary's rows at one position, as the `blocks` command shows them."""
    rows = []
    for row in summary:
        has = "change" in row
        rows.append([row["stage"], float(row["norm"].mean()), float(row["norm"][position]),
                     float(row["attn_norm"][position]) if has else "",
                     float(row["mlp_norm"][position]) if has else "",
                     f"{row['change'][position]:.0%}" if has else "",
                     show_token(tok(row["top_id"])), f"{row['top_chance']:.1%}"])
    attn, mlp = added_names(summary)
    return Table(["stage", "‖h‖ mean", "‖h‖ at pos", f"‖{attn}‖", f"‖{mlp}‖", "change",
                  "top guess", "chance"], rows,
                 title=f"residual stream at position {position} "
                       f"({token_labels(tokens)[position]})",
                 note="change = ‖after − before‖ / ‖before‖; the guess reads the stream "
                      "through the final norm and the output head (the logit lens)")


def blocks_figure(summary: list[dict], tok, position: int, tokens: list[str]) -> Figure:
    """`blocks`: ‖h‖ of every token after every stage, and the table at one position."""
    labels = token_labels(tokens)
    norms = np.stack([row["norm"] for row in summary])
    return Figure("blocks.norm", [
        Heatmap(norms, [row["stage"] for row in summary], labels,
                title="‖h‖ of every token after each stage", path="blocks.norm"),
        block_table(summary, tok, position, tokens),
    ], subtitle="for the text " + " ".join(labels))


def model_flow(text: str, stages: list[tuple[str, str, str]], n_layer: int,
               picked: str, parallel: bool = False) -> Flow:
    """The map's stages (name, operation, shape out) as boxes; stages 3..8 are one block,
    the residual stream going around each sublayer to its add (a parallel block's stream and
    attention output both go to the one add its MLP's output joins)."""
    bypass = (((3, 8, "resid_pre goes around both branches to the add"),
               (5, 8, "attn_out goes down to the add")) if parallel else
              ((3, 5, "resid_pre goes around the attention"),
               (6, 8, "resid_mid goes around the MLP")))
    return Flow(stages, top=repr(text), bottom=f"▼ {show_token(picked)}  (seed 1)", start=3,
                stop=9, repeat=f"× {n_layer} blocks (card 7)", bypass=bypass)


def map_figure(text: str, stages: list[tuple[str, str, str]], n_layer: int,
               picked: str, parallel: bool = False) -> Figure:
    """`map`: the model as a diagram, every arrow labelled with its shape for this text."""
    return Figure("map", [model_flow(text, stages, n_layer, picked, parallel)],
                  subtitle="the model, every arrow labelled with its shape for this text")


# ------------------------------------------------------------------ the review page


def _small(number: int, value, tokens: list[str], ids: list[int], tok):
    """One card's real values as a small picture or table."""
    labels = token_labels(tokens)
    if number == 1:
        return [Table(["position", "token", "id"],
                      [[i, t, int(x)] for i, (t, x) in enumerate(zip(labels, ids, strict=True))])]
    if number in (2, 3, 4, 6, 8):
        return value_parts("", value, tokens)
    if number == 9:
        row = np.asarray(value)[-1]
        order = np.argsort(-row, kind="stable")[:10]
        return [top_bars("logits[-1]", [{"id": int(i), "token": tok(int(i)),
                                         "logit": float(row[i])} for i in order], "logit",
                         title="highest scores at the last position")]
    if number == 10:
        order = np.argsort(-value, kind="stable")[:10]
        rows = [{"id": int(i), "token": tok(int(i)), "chance": float(value[i])} for i in order]
        shown = sum(r["chance"] for r in rows)
        return [top_bars("probabilities(logits[T-1], 1)", rows, "chance", percent=True,
                         title="the likeliest next tokens",
                         note=held(len(rows), shown))]
    return []


def review_figure(text: str, tokens: list[str], ids: list[int], facts: dict, cards: list,
                  values: dict, attention: list[np.ndarray], summary: list[dict], tok, decode,
                  map_stages: list[tuple[str, str, str]], parallel: bool = False) -> Figure:
    """The "Quick review" page for a text: header facts, the cards in order (sentences,
    formula, shape, trace path, real values), every head's grid, and the map.

    cards: page.CARDS; values: by card number (page_values); attention: one H × T × T array
    per block; summary: analysis.lens.block_summary at the last position; tok(id) -> token
    string; decode([id]) -> text."""
    picked = int(values[11])
    label = {"T": "Tokens in the text", "d": "Numbers per token", "L": "Blocks",
             "heads": "Heads per block", "d_k": "Numbers per head", "ffn": "Feed-forward width",
             "vocab": "Vocabulary", "longest": "Longest text"}
    pairs = [(name, f"{k} = {facts[k]:,}" + (" tokens" if k in ("vocab", "longest") else ""))
             for k, name in label.items()]
    parts: list = [Section("The model and the text", [Note(show_text(text)), Facts(pairs)],
                           anchor="facts")]
    for c in cards:
        v = values[c.number]
        shape = (f"{v} × Block" if c.number == 7 else "1 id" if c.number == 11
                 else shape_text(np.shape(v)))
        body = [Note(c.what), Note(c.detail.format(vocab_max=facts["vocab"] - 1, **facts),
                                   "detail"),
                Note(c.formula, "formula"),
                Facts([("shape", shape),
                       ("trace", c.path or "none: a random pick, drawn by the formula"),
                       ("command", c.command)])]
        if c.number == 5:
            body += [Row([Heatmap(g, token_labels(tokens), token_labels(tokens),
                                  title=f"layer {layer} head {h}",
                                  path=f"layers.{layer}.heads.{h}.weights", lo=0.0, hi=1.0,
                                  masked=np.triu(np.ones((len(tokens),) * 2, bool), 1))
                          for layer, grids in enumerate(attention)
                          for h, g in enumerate(grids)])]
        elif c.number == 7:
            body += [block_table(summary, tok, len(tokens) - 1, tokens)]
        elif c.number == 11:
            body += [Facts([("next token", f"{show_token(tok(picked))}  (id {picked})"),
                            ("the text becomes", show_text(text + decode([picked])))])]
        else:
            body += _small(c.number, v, tokens, ids, tok)
        parts.append(Section(f"{c.number}. {c.title}", body, anchor=f"card-{c.number}"))
    parts.append(Section("Map", [model_flow(text, map_stages, facts["L"], tok(picked), parallel)],
                         anchor="map"))
    return Figure("Quick review", parts, subtitle=f"of {text!r}")


__all__ = ["attention_figure", "block_table", "blocks_figure", "map_figure", "model_flow",
           "neurons_figure", "review_figure", "top_bars", "top_figure"]
