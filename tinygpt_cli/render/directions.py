"""Views of learned directions: a steering vector's report, a probe's report.

They take the result objects (analysis.steer.SteerReport, analysis.probe.ProbeReport) and
already looked-up strings; every text from the user or the model passes through show_text /
show_token. All fit 80 columns.
"""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from .tables import Fields, fmt
from .text import show_text, show_token

PROMPT = 30  # characters of a prompt shown: its end, where the steered token comes


def _line(*pairs: tuple[str, str]) -> Fields:
    return Fields([Text.assemble((f"{k} ", "dim"), v) for k, v in pairs])


def _tail(text: str, width: int = PROMPT) -> str:
    text = show_text(text)
    return text if len(text) <= width else "…" + text[-(width - 1):]


def _table(*columns: tuple[str, str]) -> Table:
    t = Table(box=None, pad_edge=False, show_edge=False, header_style="bold dim")
    for name, justify in columns:
        t.add_column(name, justify=justify, no_wrap=True)
    return t


def steer_view(r, tok, *, top: int) -> Group:
    """The vector, the held-out prompts' steerability, and the price in loss (`tok` names
    the prompts' tokens)."""
    prompts = [tok.decode(p.ids) for p in r.prompts]
    targets, against = [tok.token_str(p.target) for p in r.prompts], \
        [tok.token_str(p.vs) for p in r.prompts]
    title = Fields([Text(f"steer  layers.{r.layer}.resid_pre", style="bold cyan"),
                    Text(f"{len(r.train_pairs)} pairs build v, {len(r.held_out_pairs)} "
                         "held out", style="dim")])
    slopes = r.slopes
    summary = _line(("|v|", fmt(r.norm)), ("scales", f"0..{r.scale:g} in {len(r.scales)}"),
                    ("mean slope", fmt(float(slopes.mean()))),
                    ("wrong way", f"{r.wrong_way:.0%} ({int((slopes < 0).sum())} of "
                     f"{len(slopes)})"))
    t = _table(("prompt (its end)", "left"), ("target", "left"), ("vs", "left"),
               ("at 0", "right"), (f"at {r.scale:g}", "right"), ("slope", "right"))
    order = sorted(range(len(r.prompts)), key=lambda i: -r.prompts[i].slope)
    for i in order[:top]:
        p = r.prompts[i]
        t.add_row(_tail(prompts[i]), Text(show_token(targets[i]), style="bold"),
                  show_token(against[i]), fmt(float(p.diffs[0])), fmt(float(p.diffs[-1])),
                  Text(fmt(p.slope), style="red" if p.slope < 0 else "green"))
    rows = [title, summary, Text("logit[target] - logit[vs] at the prompt's last position, "
                                 "by scale; slope per unit of scale", style="dim"), t]
    if len(order) > top:
        rows.append(Text(f"… {len(order) - top} more prompts (--top, or --json)", style="dim"))
    rows.append(_loss_line(r))
    return Group(*rows)


def _loss_line(r) -> Text | Fields:
    if r.loss_increase is None:
        return Text("loss on held-out stories: not measured (no part-005.txt; give --data)",
                    style="dim")
    return _line(("loss on part-005", f"{r.loss_before:.4f} -> {r.loss_after:.4f} nats"),
                 ("increase", f"{r.loss_increase:+.4f} at scale {r.scale:g}"),
                 ("tokens", f"{r.n_loss_tokens:,}"))


def _pct(x: float) -> str:
    return "-" if x != x else f"{x:.1%}"


def probe_view(r) -> Group:
    """Held-out accuracy beside the control task's, the selectivity, the labels' counts."""
    title = Fields([Text(f"probe  {r.site}", style="bold cyan"),
                    Text(f"{len(r.classes)} labels  {r.lines[0]} lines fit, {r.lines[1]} "
                         f"held out  l2 {r.l2:g}  {r.steps} Newton steps", style="dim")])
    t = _table(("", "left"), ("held out", "right"), ("train", "right"))
    t.add_row(Text("probe", style="bold"), _pct(r.accuracy), _pct(r.train_accuracy))
    t.add_row("control task", _pct(r.control_accuracy), _pct(r.control_train_accuracy))
    t.add_row("commonest label", _pct(r.majority), "")
    style = "green" if r.selectivity > 0 else "red"
    verdict = Text.assemble(("selectivity ", "bold"), (f"{r.selectivity:+.1%}", style),
                            ("  probe - control, held out: known beyond the token itself",
                             "dim"))
    counts = _table(("label", "left"), ("train tokens", "right"), ("held-out tokens", "right"))
    for c, name in enumerate(r.classes):
        counts.add_row(show_text(name), f"{int(r.train_counts[c]):,}",
                       f"{int(r.held_counts[c]):,}")
    return Group(title, t, verdict, Text(""), counts)
