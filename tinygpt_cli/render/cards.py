"""Terminal views of the seed page's cards (embed ... sample) from the traced values: one
function per card, each returning a Rich renderable; the commands pick the console."""

from __future__ import annotations

import numpy as np
from rich.console import Group
from rich.text import Text

from ..words import held
from .tables import header, heatmap, matrix, tensor_view, token_rows, top_table
from .text import show_text, show_token

NORM_NOTE = ("mean and std are each token's own, taken before the norm; "
             "out = (x - mean) / std * weight + bias")
ROTARY_NOTE = ("no position table: position t turns each pair of numbers (i, i + r) of every "
               "head's q and k by this angle before q . k, so a score depends on how far apart "
               "the two tokens are; --sum shows the embeddings, which are the tokens' rows alone")
def rotary_note(rotary: bool) -> list:
    from rich.text import Text

    return [Text(ROTARY_NOTE, style="dim")] if rotary else []


RMS_NOTE = ("rms is each token's own, sqrt(mean(x^2) + eps), taken before the norm; "
            "out = x / rms * weight (an RMSNorm: no centring, no bias)")


def value_view(path: str, value, tokens, full: bool, below=()) -> Group:
    """Header + token-labelled table of one value, and whatever goes below it."""
    return Group(tensor_view(path, value, tokens, full=full), *below)


def heads_view(path: str, grids: np.ndarray, tokens, scores: bool, full: bool):
    """Every head's grid side by side: (the view, the heatmaps whose width it needs)."""
    from rich.columns import Columns

    lo, hi = (None, None) if scores else (0.0, 1.0)
    maps = [heatmap(g, tokens, f"head {h}", lo=lo, hi=hi, full=full)
            for h, g in enumerate(grids)]
    return Group(header(path, grids), Columns(maps, padding=(1, 3))), maps


# what a hidden neuron is, by the MLP's activation (config.act) and whether it is gated
NEURON_OF = {"gelu_new": "GELU", "gelu": "GELU (erf)", "silu": "SiLU"}


def neurons_below(layer: int, width: int, neurons: list[dict], tokens, full: bool,
                  config) -> list:
    """Under mlp_out: the most active hidden neurons' activations at every token."""
    act = NEURON_OF[config.act]
    what = f"{act}(gate) * up" if config.mlp == "gated" else act
    acts = np.stack([n["activations"] for n in neurons], axis=1)
    table = matrix(acts, token_rows(tokens), full=full, edge=None,
                   col_labels=[f"n{n['neuron']}" for n in neurons])
    return [Text(""), Text(f"most active hidden neurons of layers.{layer}.mlp_post "
                           f"({what} of {width}), by peak activation:", style="bold"), table]


def logits_view(path: str, row: np.ndarray, rows: list[dict], T: int) -> Group:  # noqa: N803
    return Group(header(path, row, f"(logits is {T} × {row.shape[0]})"), top_table(rows, "logit"))


def probs_path(p: int, temperature: float) -> str:
    """What probs shows: the trace's probs[P] at temperature 1, else the formula (at 0,
    greedy, all the chance on the top token: no division by 0)."""
    if temperature == 1:
        return f"probs[{p}]"
    return f"softmax(logits[{p}] / {temperature:g})" if temperature > 0 else \
        f"one_hot(argmax(logits[{p}]))"


def probs_view(path: str, probs: np.ndarray, rows: list[dict]) -> Group:
    shown = sum(x["chance"] for x in rows)
    return Group(header(path, probs), top_table(rows, "chance", bar_of="chance"),
                 Text(held(len(rows), shown), style="dim"))


def sample_view(token: str, token_id: int, chance: float, seed: int) -> Text:
    t = Text()
    t.append("next token ", style="dim")
    t.append(show_token(token), style="bold green")
    t.append(f"  id {token_id}  chance {chance:.1%}  seed {seed}", style="dim")
    return t


def continued_text(text: str, new: str) -> Text:
    """The text as it is, the sampled token's text after it in green."""
    out = Text(show_text(text))
    out.append(show_text(new), style="bold green")
    return out
