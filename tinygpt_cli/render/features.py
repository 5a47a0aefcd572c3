"""Views of sparse-autoencoder and tuned-lens results: Rich tables within 80 columns, or one
JSON document."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..escapes import escape_line
from ..words import count
from . import jsonout
from .figure import Bars, Facts, Figure, Highlight, Note, token_labels
from .tables import header
from .text import row_label, show_text, show_token
from .texts import WindowLine, window_line


def trained_doc(path, state, n_tokens: int) -> dict:
    sae = state.sae
    doc = {"path": str(path), "site": sae.site, "k": sae.k, "latents": sae.n_latents,
           "steps": state.step, "tokens": n_tokens,
           "final_loss": float(np.mean(state.losses[-50:])) if state.losses else None}
    return jsonout.jsonable(doc)


def trained_view(doc: dict) -> Text:
    return Text(f"wrote {escape_line(doc['path'])}\n{doc['latents']} latents, k = {doc['k']}, "
                f"on {doc['site']}; {count(doc['steps'], 'step')} over "
                f"{count(doc['tokens'], 'token')}\n"
                f"final loss {doc['final_loss']:.4f} (squared error / the data's variance)")


def exported_view(doc: dict) -> Text:

    names = ", ".join(Path(f).name for f in doc["files"])
    return Text(f"wrote {escape_line(doc['path'])}: {escape_line(names)} (SAELens)\n"
                f"{doc['latents']} latents, k = {doc['k']}, on {doc['site']} "
                f"(hook_name {doc['hook_name']})")


def _k(k: int | None) -> str:
    """k = 16, or what an SAE without a fixed k (SAELens' standard, jumprelu) has."""
    return f"k = {k}" if k is not None else "no fixed k"


def eval_doc(r, files: list[str]) -> dict:
    return jsonout.jsonable({
        "site": r.site, "k": r.k, "latents": r.n_latents, "data": files, "tokens": r.tokens,
        "l0": r.l0, "explained_variance": r.explained_variance,
        "loss_clean": r.loss_clean, "loss_sae": r.loss_sae, "loss_zero_ablated": r.loss_zero,
        "loss_mean_ablated": r.loss_mean, "loss_increase": r.loss_increase,
        "loss_recovered_vs_zero": r.recovered_vs_zero,
        "loss_recovered_vs_mean": r.recovered_vs_mean, "dead_latents": r.dead})


def eval_view(r, files: list[str]) -> Group:
    t = Table(box=None, pad_edge=False, show_header=False)
    t.add_column(style="bold")
    t.add_column(justify="right")
    t.add_column(style="dim")
    rows = [("L0", f"{r.l0:.2f}", f"latents active per token ({_k(r.k)})"),
            ("explained variance", f"{r.explained_variance:.4f}", "1 - SSE / total variance"),
            ("loss recovered vs zero", f"{r.recovered_vs_zero:.4f}", "site zeroed = 0"),
            ("loss recovered vs mean", f"{r.recovered_vs_mean:.4f}", "site at its mean = 0"),
            ("loss increase", f"{r.loss_increase:+.4f}", "nats per token"),
            ("dead latents", f"{r.dead} of {r.n_latents}", "never fired on this text")]
    for row in rows:
        t.add_row(*row)
    losses = Text(f"loss (nats): clean {r.loss_clean:.4f}, SAE {r.loss_sae:.4f}, "
                  f"zeroed {r.loss_zero:.4f}, mean {r.loss_mean:.4f}", style="dim")
    head = Text(f"SAE on {r.site}, {r.n_latents} latents, {_k(r.k)}\n{r.tokens:,} held-out "
                f"tokens of {escape_line(', '.join(files))}", style="bold cyan")
    return (Group(head, t, losses))


def feature_doc(r, tokenizer) -> dict:
    tok = tokenizer.token_str
    return jsonout.jsonable({
        "latent": r.latent, "site": r.site, "tokens": r.tokens, "fired": r.fired,
        "contexts": [{**c, "tokens": [tok(int(i)) for i in c["ids"]]} for c in r.contexts],
        "promotes": [{"id": i, "token": tok(i), "logit": v} for i, v in r.promotes],
        "suppresses": [{"id": i, "token": tok(i), "logit": v} for i, v in r.suppresses],
        "histogram": {"counts": r.hist_counts, "edges": r.hist_edges},
        "read_through": "W_dec[latent] * ln_final.weight @ W_E^T"})


def histogram_lines(counts: np.ndarray, edges: np.ndarray, width: int = 40) -> list[Text]:
    top = max(int(counts.max()), 1) if counts.size else 1
    return [Text(f"{edges[i]:7.2f}-{edges[i + 1]:<7.2f} {'█' * round(width * c / top):<{width}}"
                 f" {int(c):,}") for i, c in enumerate(counts)]


def feature_view(r, tokenizer) -> Group:
    tok = tokenizer.token_str
    lines = [Text(f"latent {r.latent} on {r.site}: fires on {r.fired:,} of "
                  f"{r.tokens:,} tokens ({100 * r.fired / max(r.tokens, 1):.2f}%)",
                  style="bold cyan")]
    lines.append(Text("top contexts (the strongest token underlined)", style="dim"))
    for c in r.contexts:
        lines.append(WindowLine(Text(f"{c['value']:7.3f}  ", style="bold"),
                                [tok(int(i)) for i in c["ids"]], c["acts"], c["position"],
                                radius=7))
    for label, pairs in (("promotes", r.promotes), ("suppresses", r.suppresses)):
        line = Text(f"{label:<11}", style="bold")
        line.append(" ".join(f"{show_token(tok(i))}({v:+.2f})" for i, v in pairs[:5]))
        lines.append(line)
    lines.append(Text("through W_dec[latent] * ln_final.weight @ W_E^T", style="dim"))
    lines.append(Text("activation histogram (tokens where it fires)", style="dim"))
    lines += histogram_lines(r.hist_counts, r.hist_edges)
    return (Group(*lines))


# ------------------------------------------------------------------ the tuned lens


def lens_eval_doc(r, files: list[str]) -> dict:
    return jsonout.jsonable({
        "data": files, "tokens": r.tokens, "stages": r.stages,
        "kl_logit_lens": r.kl_logit, "kl_tuned_lens": r.kl_tuned,
        "top1_logit_lens": r.top1_logit, "top1_tuned_lens": r.top1_tuned})


def lens_eval_view(r, files: list[str]) -> Group:
    t = Table(box=None, pad_edge=False, header_style="bold dim")
    for name in ("stage", "KL logit", "KL tuned", "top-1 logit", "top-1 tuned"):
        t.add_column(name, justify="left" if name == "stage" else "right")
    for i, s in enumerate(r.stages):
        t.add_row(s, f"{r.kl_logit[i]:.3f}", f"{r.kl_tuned[i]:.3f}",
                  f"{r.top1_logit[i]:.3f}", f"{r.top1_tuned[i]:.3f}")
    head = Text(f"logit lens vs tuned lens on {r.tokens:,} held-out tokens of "
                f"{escape_line(', '.join(files))}", style="bold cyan")
    note = Text("KL(final || lens) in nats; top-1: how often the lens's top guess is the "
                "model's", style="dim")
    return (Group(head, t, note))


def lens_fit_view(doc: dict) -> Text:
    return Text(f"wrote {escape_line(doc['path'])}: a translator for each of "
                f"{', '.join(doc['stages'])}, fitted on {doc['tokens']:,} training tokens")


def latents_view(path: str, tokens: list[str], z: np.ndarray, active) -> Group:
    """Per token, its active latents strongest first (or one latent's value per token)."""

    t = Table(box=None, pad_edge=False, show_header=False)
    t.add_column(no_wrap=True)
    t.add_column(ratio=1)
    for i, token in enumerate(tokens):
        if active is None:
            t.add_row(row_label(i, token), f"{z[i]:.3f}")
        else:
            t.add_row(row_label(i, token), " ".join(f"{j}:{v:.2f}" for j, v in active[i]))
    return Group(header(path, z), t)


def feature_figure(r, tokenizer, radius: int = 10):
    """The latent over its top contexts (each as highlighted text around the peak, on one
    colour scale), the tokens it promotes and suppresses, and its activation histogram."""

    tok = tokenizer.token_str
    parts: list = [Facts([("site", r.site), ("fires on", f"{r.fired:,} of {r.tokens:,} tokens")])]
    hi = max((c["value"] for c in r.contexts), default=1.0)
    for c in r.contexts:
        lo_, hi_ = max(0, c["position"] - radius), c["position"] + radius + 1
        tokens = [tok(int(i)) for i in c["ids"][lo_:hi_]]
        title = f"window {c['window']}, position {c['position']}: {c['value']:.2f}"
        parts.append(Highlight(tokens, np.asarray(c["acts"][lo_:hi_]), hi=hi, title=title,
                               path=f"sae.{r.site}.{r.latent}", start=lo_))
    for title, pairs in (("promotes", r.promotes), ("suppresses", r.suppresses)):
        parts.append(Bars([show_token(tok(i)) for i, _ in pairs], [v for _, v in pairs],
                          title=title, value_name="logit", ids=[i for i, _ in pairs],
                          note="W_dec[latent] * ln_final.weight @ W_E^T"))
    edges = r.hist_edges
    parts.append(Bars([f"{edges[i]:.2f}–{edges[i + 1]:.2f}" for i in range(len(r.hist_counts))],
                      [float(n) for n in r.hist_counts], title="activation histogram",
                      value_name="tokens"))
    return Figure(f"latent {r.latent}", parts, subtitle=f"SAE on {r.site}")


# ------------------------------------------------------------------ one latent over a text


def _pushed_line(label: str, pairs, tok) -> Text:
    line = Text(f"{label:<11}", style="bold")
    line.append(" ".join(f"{show_token(tok(i))}({v:+.2f})" for i, v in pairs[:5]))
    return line


def text_fields(r, tokenizer) -> dict:
    """What the JSON document of a latent over a text adds to the value's: its SAE, and the
    tokens it pushes (the document is otherwise `trace TEXT sae.SITE.N --json`'s)."""
    tok = tokenizer.token_str
    return jsonout.jsonable({
        "site": r.site, "k": r.k, "active": None,
        "promotes": [{"id": i, "token": tok(i), "logit": v} for i, v in r.promotes],
        "suppresses": [{"id": i, "token": tok(i), "logit": v} for i, v in r.suppresses]})


def text_view(r, tokens: list[str], tokenizer) -> Group:
    """The text with the strongest token [in brackets] and the others where the latent fires
    underlined, then its value at each token with a bar, and the tokens it pushes."""

    acts = np.asarray(r.acts, dtype=np.float64)
    fired = int((acts > 0).sum())
    peak = int(acts.argmax())
    head = f"latent {r.latent} on {r.site} over {count(len(tokens), 'token')}: fires on {fired}"
    if fired:
        head += f", strongest {acts[peak]:.3f} at {peak} {show_token(tokens[peak])}"
    lines = [Text(head, style="bold cyan")]
    lines.append(window_line(tokens, acts, peak, radius=len(tokens)) if fired
                 else Text(show_text("".join(tokens))))
    t = Table(box=None, pad_edge=False, show_header=False)
    t.add_column(no_wrap=True)
    t.add_column(justify="right", no_wrap=True)
    t.add_column(no_wrap=True, style="yellow")
    top = float(acts.max()) if fired else 1.0
    for i, token in enumerate(tokens):
        t.add_row(row_label(i, token), f"{acts[i]:.3f}", "█" * round(30 * max(acts[i], 0) / top))
    lines.append(t)
    tok = tokenizer.token_str
    lines += [_pushed_line("promotes", r.promotes, tok),
              _pushed_line("suppresses", r.suppresses, tok),
              Text("through W_dec[latent] * ln_final.weight @ W_E^T", style="dim")]
    return Group(*lines)


def text_figure(r, tokens: list[str], tokenizer):
    """The text with each token on a background as strong as the latent's value there, the
    tokens where it fires strongest first, and the tokens its direction pushes."""

    acts = np.asarray(r.acts)
    on = [int(i) for i in np.argsort(-acts, kind="stable") if acts[i] > 0]
    labels = token_labels(tokens)
    path = f"sae.{r.site}.{r.latent}"
    parts: list = [Facts([("site", r.site), ("k", str(r.k) if r.k is not None else "none"),
                          ("fires on", f"{len(on)} of {count(len(tokens), 'token')}")]),
                   Highlight(tokens, acts, title="its value at each token", path=path)]
    if on:
        parts.append(Bars([f"{i} {labels[i]}" for i in on[:20]], [float(acts[i]) for i in on[:20]],
                          title="where it fires", path=path, value_name="value"))
    else:
        parts.append(Note("It does not fire on this text.", "dim"))
    tok = tokenizer.token_str
    for title, pairs in (("promotes", r.promotes), ("suppresses", r.suppresses)):
        parts.append(Bars([show_token(tok(i)) for i, _ in pairs], [v for _, v in pairs],
                          title=title, value_name="logit", ids=[i for i, _ in pairs],
                          note="W_dec[latent] * ln_final.weight @ W_E^T"))
    return Figure(f"latent {r.latent} over a text", parts,
                  subtitle=f"SAE on {r.site}; the text " + " ".join(labels))
