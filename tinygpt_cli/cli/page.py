"""`review` (the whole Quick review page for a text) and `map` (the model as a diagram)."""

from __future__ import annotations

from pathlib import Path

from .app import app
from .common import ABLATE, FORCE, JSON, QUIET, SAVE, TEXT, WEIGHTS, Run, run, save_figure, stdout

# NumPy and Rich are imported inside the functions: registering the commands stays cheap.


def next_token(r: Run) -> tuple:
    """Cards 10 and 11 as the page writes them: probs[-1] (the softmax of logits[-1] at
    temperature 1), then sample(probs[-1], create_rng(1))."""
    from ..sampling import create_rng, sample

    probs = r.trace.get("probs[-1]")
    return probs, sample(probs, create_rng(1))


def page_values(r: Run) -> dict:
    """Every value the page shows, by card number, from one trace (and the header facts)."""
    from ..page import CARDS

    cfg = r.model.config
    probs, picked = next_token(r)
    values: dict = {c.number: r.trace.get(c.path) for c in CARDS if c.number <= 9}
    values.update({
        10: probs,
        11: picked,
        "header": {"T": r.T, "d": cfg.n_embd, "L": cfg.n_layer, "heads": cfg.n_head,
                   "d_k": cfg.d_k, "ffn": cfg.n_inner, "vocab": cfg.vocab_size,
                   "longest": cfg.n_positions},
    })
    return values


def _row_preview(row, n: int = 4) -> str:
    from ..render.tables import fmt

    head = ", ".join(fmt(float(x)) for x in row[:n])
    return f"[{head}, …, {fmt(float(row[-1]))}]" if row.size > n else f"[{head}]"


def preview(r: Run, number: int, value) -> list:
    """A few lines of real values for one card."""
    import numpy as np
    from rich.text import Text

    from ..render.text import show_text, show_token

    tok = r.model.tokenizer.token_str
    if number == 1:
        pairs = "  ".join(f"{show_token(t)}={i}" for t, i in zip(r.tokens, r.ids, strict=True))
        return [Text(pairs)]
    if number in (2, 3, 4, 6, 8):
        rows = [0, r.T - 1] if r.T > 1 else [0]
        return [Text(f"{show_token(r.tokens[i]):>10} {_row_preview(value[i])}") for i in rows]
    if number == 5:
        lines = []
        for i, row in enumerate(value):
            cells = " ".join(f"{x:.2f}" if j <= i else "  · " for j, x in enumerate(row[:8]))
            more = " …" if len(row) > 8 else ""
            lines.append(Text(f"{show_token(r.tokens[i]):>10} {cells}{more}"))
            if i >= 7:
                lines.append(Text("       …"))
                break
        return lines
    if number == 7:
        return [Text(f"{value} blocks")]
    if number == 9:
        top = np.argsort(-value[-1])[:3]
        return [Text(f"last row: {_row_preview(value[-1])}; highest: " + ", ".join(
            f"{show_token(tok(int(i)))} {value[-1][i]:.2f}" for i in top))]
    if number == 10:
        top = np.argsort(-value)[:5]
        return [Text(", ".join(f"{show_token(tok(int(i)))} {value[i]:.1%}" for i in top)
                     + f"  (sum {value.sum():.4f})")]
    if number == 11:
        return [Text(f"id {value} = {show_token(tok(value))!s}  →  ") + Text(
            show_text(r.text + r.model.tokenizer.decode([value])), style="bold")]
    return []


def card_shape(number: int, value) -> str:
    import numpy as np

    from ..render.tables import shape_str

    if number == 7:
        return f"{value} × Block"
    if number == 11:
        return "1 id"
    return shape_str(np.shape(value))


@app.command()
def review(text: str = TEXT, weights: Path = WEIGHTS, ablate: list[str] = ABLATE,
           as_json: bool = JSON, save: Path = SAVE, force: bool = FORCE, quiet: bool = QUIET):
    """The whole "Quick review" page for a text: the facts, then all 11 cards with real values.

    Example: tinygpt review "Lily wanted to play with her"
    """
    import numpy as np
    from rich.console import Group
    from rich.panel import Panel
    from rich.text import Text

    from ..page import CARDS
    from ..render import jsonout

    r = run(weights, text, ablate)
    values = page_values(r)
    facts = values["header"]
    save_figure(review_figure(r, values), save, force)
    if as_json:
        cards = []
        for c in CARDS:
            v = values[c.number]
            cards.append({"number": c.number, "title": c.title, "path": c.path,
                          "formula": c.formula, "command": c.command,
                          "shape": list(np.shape(v)),
                          "value": v if c.number not in (2, 3, 4, 6, 8, 9) else None})
        jsonout.emit(r.document(None, np.asarray([c.number for c in CARDS]), name="review",
                                facts=facts, cards=cards))
        return
    label = {"T": "Tokens in the text", "d": "Numbers per token", "L": "Blocks",
             "heads": "Heads per block", "d_k": "Numbers per head", "ffn": "Feed-forward width",
             "vocab": "Vocabulary", "longest": "Longest text"}
    top = Text()
    top.append("Quick review", style="bold underline")
    top.append(f"  of {r.text!r}\n", style="dim")
    for k, name in label.items():
        unit = " tokens" if k in ("vocab", "longest") else ""
        top.append(f"  {name:<22}", style="dim")
        top.append(f"{k} = {facts[k]:,}{unit}\n", style="bold")
    parts = [top]
    console = stdout()
    width = min(console.width, 100)
    for c in CARDS:
        v = values[c.number]
        detail = c.detail.format(vocab_max=facts["vocab"] - 1, **facts)
        body = [Text(c.what), Text(detail, style="italic"),
                Text.assemble(("shape    ", "dim"), (card_shape(c.number, v), "bold")),
                Text.assemble(("formula  ", "dim"), c.formula),
                Text.assemble(("trace    ", "dim"), (c.path, "cyan")) if c.path else
                Text("trace    none: a random pick, drawn by the formula above", style="dim"),
                Text.assemble(("command  ", "dim"), c.command)]
        body += [Text("  ") + line for line in preview(r, c.number, v)]
        parts.append(Panel(Group(*body), title=f"{c.number}. {c.title}", title_align="left",
                           border_style="dim", width=width))
    console.print(Group(*parts))


def review_figure(r: Run, values: dict):
    """The page as a picture (--save page.html): every card with its values, every head."""
    from ..analysis.lens import block_summary
    from ..page import CARDS
    from ..render import pictures

    cfg = r.model.config
    return pictures.review_figure(
        r.text, r.tokens, list(r.ids), values["header"], CARDS, values,
        [r.trace.get(f"layers.{i}.weights") for i in range(cfg.n_layer)],
        block_summary(r.trace, r.model.params, cfg, position=r.T - 1),
        r.model.tokenizer.token_str, r.model.tokenizer.decode, map_stages(r))


def _arrow(label: str):
    from rich.text import Text

    return Text.assemble(("      │ ", "dim"), (label, "magenta"))


def map_stages(r: Run) -> list[tuple[str, str, str]]:
    """The map's stages for this text: (name, operation, shape of what comes out)."""
    cfg = r.model.config
    T, d, H, dk, ff, V = r.T, cfg.n_embd, cfg.n_head, cfg.d_k, cfg.n_inner, cfg.vocab_size
    td = f"{T} × {d}"
    return [
        ("1 Inputs", "tokenizer.encode(text)", f"{T} ids"),
        ("2 Embedding", "W_E[ids]", td),
        ("3 Position", "+ W_P[0..T-1]", td),
        ("4 Norm", "ln1", td),
        ("5 Masked attention", f"{H} heads: q, k, v {H} × {T} × {dk}; weights {H} × {T} × {T}",
         td),
        ("4 Add", "resid_mid = h + attn_out", td),
        ("4 Norm", "ln2", td),
        ("6 Feed forward", f"{td} → {T} × {ff} → GELU → {td}", td),
        ("4 Add", "resid_post = resid_mid + mlp_out", td),
        ("8 Final norm", "ln_final", td),
        ("9 Linear", "u W_E^T", f"{T} × {V:,}"),
        ("10 Softmax", "probs[-1] = softmax(logits[-1])", f"{V:,}"),
        ("11 Output", "sample(probs[-1], rng)", "1 id"),
    ]


@app.command("map")
def map_cmd(text: str = TEXT, weights: Path = WEIGHTS, ablate: list[str] = ABLATE,
            as_json: bool = JSON, save: Path = SAVE, force: bool = FORCE, quiet: bool = QUIET):
    """The model as a diagram, every arrow labelled with its shape for this text.

    Example: tinygpt map "Lily wanted to play with her"
    """
    import numpy as np
    from rich.console import Group
    from rich.padding import Padding
    from rich.panel import Panel
    from rich.text import Text

    from ..render import jsonout, pictures
    from ..render.text import count, show_token

    r = run(weights, text, ablate)
    cfg = r.model.config
    td = f"{r.T} × {cfg.n_embd}"
    stages = map_stages(r)
    save_figure(pictures.map_figure(r.text, stages, cfg.n_layer, r.model.tokenizer.token_str(
        next_token(r)[1])), save, force)
    if as_json:
        jsonout.emit(r.document(None, np.asarray([s[0] for s in stages]), name="map",
                                      stages=[{"stage": s, "op": o, "shape_out": sh}
                                              for s, o, sh in stages],
                                      repeat={"stages": [3, 8], "times": cfg.n_layer}))
        return

    def box(stage: str, op: str) -> Text:
        return Text.assemble(("  ▣ ", "dim"), (f"{stage:<19}", "bold"), (op, ""))

    head = [Text.assemble(("  ", ""), (repr(r.text), "bold green")),
            _arrow(count(r.T, "token"))]
    for s, o, sh in stages[:3]:
        head += [box(s, o), _arrow(sh)]
    inner: list[Text] = []
    for k, (s, o, sh) in enumerate(stages[3:9]):
        inner.append(box(s, o))
        if k < 5:
            inner.append(_arrow(sh))
    block = Panel(Group(*inner), title=f"× {cfg.n_layer} blocks (card 7)", title_align="left",
                  border_style="cyan", expand=False)
    tail = [_arrow(td)]
    for s, o, sh in stages[9:]:
        tail += [box(s, o), _arrow(sh)]
    _, picked = next_token(r)
    tail.append(Text.assemble(("      ▼ ", "dim"),
                              (show_token(r.model.tokenizer.token_str(picked)), "bold green"),
                              ("  (seed 1)", "dim")))
    stdout().print(Group(*head, Padding(block, (0, 0, 0, 2)), *tail))
