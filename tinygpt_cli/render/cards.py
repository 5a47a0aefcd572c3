"""Terminal views of the seed page's cards (embed ... sample) from the traced values: one
function per card, each returning a Rich renderable; the commands pick the console."""

from __future__ import annotations

import numpy as np
from rich.console import Group
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from ..words import held
from .cells import grid_note
from .tables import header, heatmap, matrix, tensor_view, token_rows, top_table
from .text import show_text, show_token

NORM_NOTE = ("mean and std are each token's own, taken before the norm; "
             "out = (x - mean) / std * weight + bias")
ROTARY_NOTE = ("no position table: position t turns each pair of numbers (i, i + r) of every "
               "head's q and k by this angle before q . k, so a score depends on how far apart "
               "the two tokens are; --sum shows the embeddings, which are the tokens' rows alone")
def rotary_note(rotary: bool, base: float = 0.0, bases=(), tokens=(), full: bool = False,
                angles_of=None) -> list:
    """Under the angles: what they are, and with a rotary base per block (Gemma 3) which
    blocks turn by which base, the other bases' angles beside the shown one's (angles_of(b))."""
    if not rotary:
        return []
    out = [Text(ROTARY_NOTE, style="dim")]
    if len(bases) > 1:
        from ..transformer.page import block_list

        out += [Text(""), Text("two rotary bases: " + "; ".join(
            f"base {b:g} turns {block_list(blocks)}" for b, blocks in bases)
            + f" (the angles above are base {base:g}'s)", style="bold")]
        for b, blocks in bases:
            if b != base:
                out += [Text(""), tensor_view(f"rotary angles at base {b:g} ({block_list(blocks)})",
                                              angles_of(b), tokens, full=full)]
    return out


def sandwich_note(norms, final: bool = False) -> list:
    """Gemma 3's four norms a block, in their order, and the scale each multiplies by (the
    final norm's card: that it multiplies by the same)."""
    if not norms:
        return []
    if final:
        return [Text("the final norm multiplies by 1 + w with the file's w, as the four norms "
                     "of each block do (tinygpt norm --which " + "|".join(norms) + ")",
                     style="dim")]
    where = {"ln1": "before attention", "ln1_post": "after attention, before its add",
             "ln2": "before the MLP", "ln2_post": "after the MLP, before its add"}
    return [Text("four norms a block, each x / rms * (1 + w) with the file's w: "
                 + "; ".join(f"{n} {where.get(n, '')}".strip() for n in norms)
                 + " (--which)", style="dim")]


RMS_NOTE = ("rms is each token's own, sqrt(mean(x^2) + eps), taken before the norm; "
            "out = x / rms * weight (an RMSNorm: no centring, no bias)")


def value_view(path: str, value, tokens, full: bool, below=()) -> Group:
    """Header + token-labelled table of one value, and whatever goes below it."""
    return Group(tensor_view(path, value, tokens, full=full), *below)


def heads_view(path: str, grids: np.ndarray, tokens, scores: bool, full: bool,
               window: int = 0):
    """Every head's grid side by side: (the view, the heatmaps whose width it needs); what
    the rows, columns and marks are said below, as under one head's grid (a sliding block's
    keys before each query's window drawn apart, and said too)."""
    lo, hi = (None, None) if scores else (0.0, 1.0)
    maps = [heatmap(g, tokens, f"head {h}", lo=lo, hi=hi, full=full, window=window)
            for h, g in enumerate(grids)]
    note = Text(grid_note(scores, window), style="dim")
    return Group(header(path, grids), EvenRows(maps), note), maps


def even_rows(n: int, per_row: int) -> list[int]:
    """How many of n equal cells go in each row when at most `per_row` fit: as few rows as
    that allows, the cells shared out evenly among them (4 heads where 3 fit: 2 + 2, not
    3 + 1), the longer rows first."""
    per_row = max(1, min(per_row, n))
    rows = -(-n // per_row)
    return [n // rows + (1 if r < n % rows else 0) for r in range(rows)]


class EvenRows:
    """Equal renderables (every head's heatmap) in rows of an even count, each row as many
    as the width allows and the rows shared out evenly (even_rows); Rich's Columns fills
    each row before the next, leaving one head alone under three."""

    GAP = 3  # spaces between two cells of a row

    def __init__(self, cells: list):
        self.cells = cells

    def _rows(self, console, width: int) -> list[list]:

        options = console.options.update_width(width)
        widest = max(Measurement.get(console, options, c).maximum for c in self.cells)
        counts = even_rows(len(self.cells), (width + self.GAP) // (widest + self.GAP))
        out, start = [], 0
        for k in counts:
            out.append(self.cells[start:start + k])
            start += k
        return out

    def _grid(self, row: list):

        grid = Table.grid(padding=(0, self.GAP, 0, 0))
        for _ in row:
            grid.add_column(no_wrap=True)
        grid.add_row(*row)
        return grid

    def __rich_console__(self, console, options):
        for k, row in enumerate(self._rows(console, options.max_width)):
            if k:
                yield Text("")
            yield self._grid(row)

    def __rich_measure__(self, console, options):

        shown = [Measurement.get(console, options, self._grid(row))
                 for row in self._rows(console, options.max_width)]
        return Measurement(max(m.minimum for m in shown), max(m.maximum for m in shown))


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
    out = [Text(""), Text(f"most active hidden neurons of layers.{layer}.mlp_post "
                          f"({what} of {width}), by peak activation:", style="bold"), table]
    if "gate" in neurons[0]:  # a gated MLP: each neuron's two products and what they make
        few = neurons[:3]
        parts = np.stack([a for n in few for a in (n["gate"], n["up"], n["activations"])], 1)
        labels = [f"n{n['neuron']} {k}" for n in few for k in ("gate", "up", "out")]
        out += [Text(""), Text(f"gate = x W_gate (layers.{layer}.mlp_pre), up = x W_in "
                               f"(layers.{layer}.mlp_up), out = {act}(gate) * up:",
                               style="bold"),
                matrix(parts, token_rows(tokens), full=full, edge=None, col_labels=labels)]
    return out


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
