"""Views for whole texts: a text coloured by surprisal, head-score tables, neuron examples,
diffs. Renderables only; every string from a user or a weights file goes through text.py."""

from __future__ import annotations

import codecs

import numpy as np
from rich.console import Group
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from ..escapes import escape_line
from ..transformer.schema import head_name
from ..words import count
from .quick_table import QuickTable
from .tables import Fields, WhenStyled, colour, fmt, header
from .text import HEAD_KINDS as KIND_LABELS
from .text import LN2, show_text, show_token

# Surprisal bands in bits: a token the model found likely is plain, rarer ones get warmer.
BANDS = [(1.0, None), (3.0, "rgb(120,160,60)"), (6.0, "rgb(220,180,40)"),
         (9.0, "rgb(230,110,40)"), (float("inf"), "rgb(220,40,40)")]


def band_style(bits: float) -> str | None:
    for limit, style in BANDS:
        if bits < limit:
            return style
    return BANDS[-1][1]


def legend() -> WhenStyled:
    """The colours of coloured_text, on a terminal that shows them."""
    t = Text("surprisal: ", style="dim")
    lo = 0.0
    for limit, style in BANDS:
        label = f"<{limit:g}" if np.isfinite(limit) else f"≥{lo:g}"
        t.append(f" {label} bits ", style=f"black on {style}" if style else "")
        lo = limit
    return WhenStyled(t, in_colour=True)


def coloured_text(pieces: list[str], bits: list[float | None]) -> Text:
    """The text as it reads (newlines kept), each token's background by its surprisal; a
    token with no score (the first, with nothing before it) stays plain."""
    t = Text()
    for piece, b in zip(pieces, bits, strict=True):
        style = band_style(b) if b is not None else None
        t.append(show_text(piece), style=f"black on {style}" if style else "")
    return t


def _last(s: str, n: int) -> str:
    """The end of s in n characters: the tokens nearest the scored one are the ones kept."""
    return s if len(s) <= n else "…" + s[len(s) - n + 1:]


def surprising_table(rows: list[dict], texts: int = 1) -> Table:
    """rows: text (its index), position, token, bits, chance, rank, entropy, top (the model's
    guess); a column of the text each row is in when there are several `texts`."""
    t = QuickTable(box=None, pad_edge=False, header_style="bold dim")
    several = texts > 1
    if several:
        t.add_column("text", justify="right", no_wrap=True, min_width=5)
    # The numbers never give way to a narrow terminal: the context column does, behind "…".
    for name, just in (("pos", "right"), ("token", "left"), ("bits", "right"),
                       ("chance", "right"), ("rank", "right"), ("entropy", "right")):
        t.add_column(name, justify=just, no_wrap=True, min_width=len(name) + 1)
    t.add_column("context", justify="left", no_wrap=True, overflow="ellipsis", max_width=24)
    for r in rows:
        t.add_row(*([str(r["text"])] if several else []), str(r["position"]),
                  Text(show_token(r["token"]), style="bold"),
                  f"{r['bits']:.2f}", f"{r['chance']:.2%}", str(r["rank"]),
                  f"{r['entropy_bits']:.2f}", Text(_last(show_token(r["context"]), 24),
                                                   style="dim"))
    return t


def totals_line(s: dict) -> Text:
    t = Text()
    for key, label, f in (("tokens", "tokens", "{:,}"), ("mean_nats", "mean loss", "{:.4f} nats"),
                          ("perplexity", "perplexity", "{:.2f}"),
                          ("bits_per_byte", "bits per byte", "{:.4f}")):
        if s.get(key) is None:
            continue
        t.append(f"{label} ", style="dim")
        t.append(f.format(s[key]), style="bold")
        t.append("   ")
    return t


def layer_head_table(scores: dict[str, np.ndarray], labels: dict[str, str]) -> Table:
    """One row per (layer, head), one column per score, cells coloured 0..1."""
    first = next(iter(scores.values()))
    n_layer, n_head = first.shape
    t = Table(box=None, pad_edge=False, header_style="bold dim")
    t.add_column("head", no_wrap=True, style="bold")
    for name in scores:
        t.add_column(labels.get(name, name), justify="right", no_wrap=True)
    for layer in range(n_layer):
        for h in range(n_head):
            cells = [head_name(layer, h)]
            for arr in scores.values():
                x = float(arr[layer, h])
                level = min(max(x, 0.0), 1.0)
                fg = "black" if level > 0.55 else "white"
                cells.append(Text(f" {x:.3f} ", style=f"{fg} on {colour(level)}"))
            t.add_row(*cells)
    return t


def window_line(tokens: list[str], acts: np.ndarray, peak: int, radius: int = 12) -> Text:
    """A window of text around `peak`, the firing token [in brackets] (seen without colour
    too: NO_COLOR, a pipe, a file), bold and coloured; tokens that also fire underlined."""
    lo, hi = max(0, peak - radius), min(len(tokens), peak + radius + 1)
    top = float(acts.max()) if acts.max() > 0 else 1.0
    t = Text("…" if lo > 0 else "", style="dim")
    for i in range(lo, hi):
        piece = show_token(tokens[i]).replace("␣", " ")
        if i == peak:
            space = piece[: len(piece) - len(piece.lstrip(" "))]
            t.append(space + "[", style="bold")
            t.append(piece[len(space):], style="bold black on rgb(253,231,37)")
            t.append("]", style="bold")
        elif acts[i] > 0.25 * top:
            t.append(piece, style="underline")
        else:
            t.append(piece)
    if hi < len(tokens):
        t.append("…", style="dim")
    return t


class WindowLine:
    """`lead` then window_line(...) on one line: the window narrows (fewer tokens each side
    of the peak, down to none) until the line fits the width, rather than wrap to the next
    line's first column."""

    def __init__(self, lead: Text, tokens: list[str], acts: np.ndarray, peak: int,
                 radius: int = 12):
        self.lead, self.tokens, self.acts, self.peak, self.radius = lead, tokens, acts, peak, radius

    def __rich_console__(self, console, options):
        for radius in range(self.radius, -1, -1):
            line = self.lead.copy()
            line.append_text(window_line(self.tokens, self.acts, self.peak, radius))
            if line.cell_len <= options.max_width or radius == 0:
                yield line
                return

    def __rich_measure__(self, console, options):

        return Measurement(1, options.max_width)


def token_list(tokens: list[str], values: list[float]) -> Fields:
    """`tok 0.560  tok 0.492 ...`, wrapping between entries (never inside one) when the
    column is narrower than the list."""
    fields = []
    for tok, v in zip(tokens, values, strict=True):
        t = Text(show_token(tok), style="bold")
        t.append(f" {fmt(v)}", style="dim")
        fields.append(t)
    return Fields(fields)


def side_by_side(tokens_a: list[str], tokens_b: list[str], top_a: list[tuple[str, float]],
                 top_b: list[tuple[str, float]], cos: np.ndarray, dist: np.ndarray,
                 stage_names: list[str]) -> Group:
    """Per position: A's token, B's token, the last stage's cosine and distance, both top
    predictions; then a stage x position grid of distances."""
    t = Table(box=None, pad_edge=False, header_style="bold dim")
    for name, just in (("pos", "right"), ("A", "left"), ("B", "left"), ("cos", "right"),
                       ("dist", "right"), ("A predicts", "left"), ("B predicts", "left")):
        t.add_column(name, justify=just, no_wrap=True)
    n = len(top_a)
    for p in range(max(len(tokens_a), len(tokens_b))):
        ta = show_token(tokens_a[p]) if p < len(tokens_a) else ""
        tb = show_token(tokens_b[p]) if p < len(tokens_b) else ""
        same = p < n and tokens_a[p] == tokens_b[p]
        cells = [str(p), Text(ta, style="bold"), Text(tb, style="bold" if same else "bold red")]
        if p < n:
            cells += [f"{cos[-1, p]:.3f}", f"{dist[-1, p]:.3f}",
                      f"{show_token(top_a[p][0])} {top_a[p][1]:.0%}",
                      f"{show_token(top_b[p][0])} {top_b[p][1]:.0%}"]
        t.add_row(*cells)
    grid = Table(box=None, pad_edge=False, header_style="bold dim", title_style="bold")
    grid.add_column("relative distance", no_wrap=True, style="bold")
    for p in range(dist.shape[1]):
        grid.add_column(str(p), justify="right", no_wrap=True)
    top = max(float(dist.max()), 1e-9)
    for name, row in zip(stage_names, dist, strict=True):
        cells = [name]
        for x in row:
            level = float(x) / top
            fg = "black" if level > 0.55 else "white"
            cells.append(Text(f"{x:.2f}", style=f"{fg} on {colour(level)}"))
        grid.add_row(*cells)
    return Group(t, Text(""), grid)


def kl_table(tokens: list[str], kl: np.ndarray, top_a: list[str], top_b: list[str],
             dp: np.ndarray) -> Table:
    t = Table(box=None, pad_edge=False, header_style="bold dim")
    for name, just in (("pos", "right"), ("token", "left"), ("KL", "right"),
                       ("top A", "left"), ("top B", "left"), ("Δp next", "right")):
        t.add_column(name, justify=just, no_wrap=True)
    for p, tok in enumerate(tokens):
        same = top_a[p] == top_b[p]
        t.add_row(str(p), Text(show_token(tok), style="bold"), fmt(float(kl[p])),
                  show_token(top_a[p]), Text(show_token(top_b[p]),
                                             style="" if same else "bold red"),
                  f"{dp[p]:+.3f}" if p < len(dp) else "")
    return t


def decoded_context(tok, ids) -> str:
    """The tokens before a scored one as text: their bytes decoded together, so an accent or
    an emoji split over two tokens reads as itself (a byte cut off at the start is dropped)."""
    return b"".join(tok.token_bytes(int(i)) for i in ids).decode("utf-8", errors="ignore")


def decoded_pieces(tok, ids) -> list[str]:
    """Each token's text as it reads: a character whose bytes span several tokens (an
    accent, an emoji) is given whole to the token that completes it, the others an empty
    piece, so the text shows as text and never as byte escapes."""

    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pieces = [decoder.decode(tok.token_bytes(int(i))) for i in ids]
    if pieces:
        pieces[-1] += decoder.decode(b"", final=True)  # a character cut off at the end
    return pieces


def score_view(report, token_str: list[str], tok) -> Group:
    """score's terminal view of a ScoreReport (analysis.score): the totals, the text coloured
    by surprisal when it is shown, and the most surprising tokens with their context."""

    summary, offset = report.summary, report.offset
    parts: list = [totals_line(summary),
                   Text(f"{count(summary['sequences'], 'text')}, "
                        f"{count(report.n_windows, 'window')} of "
                        f"at most {summary['context']} tokens, stride {summary['stride']}"
                        + ("; one stream, as the model card counts" if summary["stream"]
                           else ""), style="dim")]
    if report.shown is not None:
        parts += [Text(""), legend()]
        for seq, s in zip(report.sequences, report.shown, strict=True):
            pieces = decoded_pieces(tok, seq)
            bits = [None] + [float(b) for b in s.bits] + [None] * (len(seq) - 1 - len(s.bits))
            parts.append(coloured_text(pieces[offset:], bits[offset:]))
    else:
        parts.append(Text("(text not shown; --show-text prints it)", style="dim"))
    if report.worst:
        rows = []
        for nats, i, p, rank, entropy in report.worst:
            seq = report.sequences[i][offset:]
            rows.append({"text": i, "position": p, "token": token_str[int(seq[p])],
                         "bits": nats / LN2, "chance": float(np.exp(-nats)), "rank": rank,
                         "entropy_bits": entropy / LN2,
                         "context": decoded_context(tok, seq[max(0, p - 6):p])})
        parts += [Text(""), Text("most surprising tokens", style="bold"),
                  surprising_table(rows, len(report.sequences))]
    return Group(*parts)


def neuron_examples_view(ex, token_str, files: list[str]) -> Group:
    """A NeuronExamples (analysis.neurons): each window, its peak highlighted."""

    ctx = ex.ids.shape[1]
    lines = [Text(f"{ex.path}  top {len(ex.rows)} of {ex.windows:,} windows of {ctx} "
                  f"tokens in {escape_line(', '.join(files))}", style="bold cyan")]
    for r, row in enumerate(ex.rows):
        tokens = [token_str(int(i)) for i in ex.ids[r]]
        lines.append(WindowLine(Text(f"{row['max']:7.3f}  ", style="bold"), tokens,
                                ex.acts[r], row["position"]))
    return Group(*lines)


def text_neurons_view(tn, tokens: list[str]) -> Group:
    """A TextNeurons (analysis.neurons): the block's header, then each top neuron, its peak,
    where, and the tokens it pushes up."""

    t = Table(box=None, pad_edge=False, header_style="bold dim")
    for name, just in (("neuron", "right"), ("max", "right"), ("at", "left")):
        t.add_column(name, justify=just, no_wrap=True)
    t.add_column("pushes up", ratio=1)  # wraps between tokens to fit the width
    for f in tn.found:
        t.add_row(f"n{f['neuron']}", f"{f['max']:.3f}",
                  Text(f"{f['position']} {show_token(tokens[f['position']])}", style="bold"),
                  token_list([p["token"] for p in f["pushes"]],
                             [p["logit"] for p in f["pushes"]]))
    return Group(header(tn.path, tn.post), Text(f"pushes up: the logits of {tn.read}",
                                                style="dim"), t)


def text_diff_view(d) -> Group:
    """A TextDiff (analysis.diff): both texts side by side with their top tokens, and the
    cosine and distance of every stage."""

    body = side_by_side(d.a.tokens, d.b.tokens, d.top_a, d.top_b, d.cosine, d.distance,
                        d.stages)
    return Group(header("diff.relative_distance", d.distance, "(stages × positions)"),
                 Text("cos and dist: the last stage's (layers."
                      f"{d.a.config.n_layer - 1}.resid_post); dist = ||a - b|| / ||a||",
                      style="dim"), body)


def models_diff_view(d) -> Group:
    """A ModelsDiff (analysis.diff): KL per position, the top tokens, and the summary."""

    summary = d.diff.summary()
    return Group(
        header("diff.kl", d.diff.kl, f"KL(P_a || P_b) per position; a = "
               f"{escape_line(str(d.a.model.folder))}, b = {escape_line(str(d.b.model.folder))}"),
        kl_table(d.a.tokens, d.diff.kl, d.top_a, d.top_b, d.diff.delta_p),
        Text(f"mean KL {summary['mean_kl']:.4g} nats, max {summary['max_kl']:.4g}; same top "
             f"token {summary['same_top']:.0%}"
             + (f"; Δp of the next token: mean {summary['mean_delta_p']:+.4f}, RMS "
                f"{summary['rms_delta_p']:.4f}" if summary["mean_delta_p"] is not None else ""),
             style="dim"),
        *([Text("the models differ in shape (" + ", ".join(
            f"{k} {escape_line(str(a))} vs {escape_line(str(b))}"
            for k, (a, b) in d.differing.items()) + "): only the next-token distributions "
            "are compared", style="dim")] if d.differing else []))


def heads_view(r) -> Group:
    """A HeadsReport (analysis.heads): every head's score of each kind, the best of each,
    and the repeated random tokens' losses."""

    table, rep = r.table, r.repeat
    best = {k: np.unravel_index(np.argmax(v), v.shape) for k, v in table.items()}
    notes = Text("best: " + ", ".join(f"{KIND_LABELS[k]} {head_name(*b)} ({table[k][b]:.2f})"
                                      for k, b in best.items()), style="dim")
    return Group(
        Text(f"heads  {r.n_layer} layers × {r.n_head} heads  on {count(r.texts, 'text')} from "
             f"{escape_line(r.source)}", style="bold cyan"),
        *([Text(f"{count(r.skipped, 'text')} of one token left out: the exclusions leave no "
                "attention in them to score", style="yellow")] if r.skipped else []),
        layer_head_table(table, KIND_LABELS), notes,
        Text(f"random tokens ({rep['batch']} × {rep['length']}, seed {rep['seed']}) repeated: "
             f"loss {rep['loss_first']:.3f} nats on the first copy, {rep['loss_second']:.3f} "
             f"on the second (drop {rep['loss_drop']:.3f})", style="dim"))
