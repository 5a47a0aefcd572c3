"""What quantization changed (analysis.quant), as a JSON document, a terminal view and a
picture. Renderables and plain data only; every string from a user or a file goes through
text.py."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..escapes import escape_line
from . import jsonout
from .figure import Bars, Facts, Figure, Heatmap, Note, token_labels
from .text import show_token

COMPUTED = ("both models computed in float32 with the dequantized weights; llama.cpp's CPU "
            "products also round each activation row to Q8_0 or Q8_K first")


def _computed(act: list[str] | None) -> str:
    if act is None:
        return COMPUTED + " (--act-quant does that)"
    return "--act-quant: the inputs of " + ", ".join(act) + " rounded as llama.cpp's CPU path " \
        "rounds them (q, k, v and the pattern as its default float16 KV cache has them)"


def quant_document(r, tokens: list[str], token_str, quant: str, against: str,
                   act: list[str] | None) -> dict:
    """One text: the document's value is the per-stage, per-position residual change."""
    return jsonout.document(
        "quant.resid", r.resid, r.ids, tokens, quantized=quant, reference=against,
        stages=r.stages, resid_overall=r.resid_overall,
        pattern_tv=r.pattern_tv, pattern_tv_mean=r.pattern_mean,
        kl=r.kl, kl_direction="KL(P_reference || P_quantized), nats",
        pattern_measure="total variation, 1/2 sum_j |A_ref[i,j] - A_q[i,j]|",
        top_reference=[token_str(int(i)) for i in r.top_ref],
        top_quantized=[token_str(int(i)) for i in r.top_q], same_top=r.same_top,
        summary={"mean_kl": float(r.kl.mean()), "max_kl": float(r.kl.max()),
                 "same_top": float(r.same_top.mean())},
        position=r.position, target={"id": r.target, "token": token_str(r.target)},
        logp_reference=r.logp_ref, logp_quantized=r.logp_q,
        tensors=[{"tensor": s.label, "file_tensor": s.file, "type": s.kind,
                  "relative_change": s.relative,
                  "first_order": s.estimate, "restored": s.restored} for s in r.tensors],
        tensor_measure="change of log p(target) if the tensor alone were put back at full "
                       "precision: first order sum dlogp/dW * (W_ref - W_q), and for the "
                       "largest the real change",
        computed=_computed(act))


def quant_view(r, tokens: list[str], token_str, quant: str, against: str, top: int,
               act: list[str] | None) -> Group:
    shown = list(range(len(tokens)))[-12:]
    last = f" (the last {len(shown)} positions; --json has all)" if len(shown) < len(tokens) \
        else ""
    stage_table = Table(title="relative change of the residual stream, ||Δh|| / ||h_ref||"
                        + last, title_justify="left")
    stage_table.add_column("stage")
    stage_table.add_column("overall", justify="right")
    for t in shown:
        stage_table.add_column(escape_line(show_token(tokens[t])), justify="right")
    for s, name in enumerate(r.stages):
        stage_table.add_row(name, f"{r.resid_overall[s]:.4f}",
                            *[f"{r.resid[s, t]:.4f}" for t in shown])
    heads = Table(title="attention pattern change per head: mean total variation over the rows",
                  title_justify="left")
    heads.add_column("block")
    for h in range(r.pattern_tv.shape[1]):
        heads.add_column(f"head {h}", justify="right")
    for i, row in enumerate(r.pattern_mean):
        heads.add_row(str(i), *[f"{v:.4f}" for v in row])
    nxt = Table(title="next token: KL(P_ref || P_q) in nats, top-1 of each", title_justify="left")
    for c in ("pos", "token", "KL", "top ref", "top quant", ""):
        nxt.add_column(c, justify="right" if c in ("pos", "KL") else "left")
    for t in shown:
        nxt.add_row(str(t), escape_line(show_token(tokens[t])), f"{r.kl[t]:.5f}",
                    escape_line(show_token(token_str(int(r.top_ref[t])))),
                    escape_line(show_token(token_str(int(r.top_q[t])))),
                    "" if r.same_top[t] else "differs")
    target = escape_line(show_token(token_str(r.target)))
    tens = Table(title=f"tensors by their pull on log p({target})"
                       f" at position {r.position}: the change if put back at full precision",
                 title_justify="left")
    named = any(s.file for s in r.tensors)
    for c in ("tensor", *(("file's", "type") if named else ()), "||ΔW||/||W||", "first order",
              "restored"):
        tens.add_column(c, justify="left" if c in ("tensor", "file's", "type") else "right")
    for s in r.tensors[:top]:
        tens.add_row(s.label, *((escape_line(s.file or ""), escape_line(s.kind or ""))
                                if named else ()), f"{s.relative:.4f}", f"{s.estimate:+.5f}",
                     "" if s.restored is None else f"{s.restored:+.5f}")
    return Group(
        Text(f"quant  {escape_line(quant)}  against  {escape_line(against)}", style="bold cyan"),
        stage_table, heads, nxt,
        Text(f"mean KL {r.kl.mean():.5f} nats, max {r.kl.max():.5f}; same top token "
             f"{r.same_top.mean():.0%}; log p(target) {r.logp_ref:.5f} -> {r.logp_q:.5f}",
             style="dim"),
        tens, Text(_computed(act), style="dim"))


def quant_figure(r, tokens: list[str], token_str, quant: str, act: list[str] | None) -> Figure:
    labels = token_labels(tokens)
    n_layer, n_head = r.pattern_mean.shape
    top = r.tensors[:12]
    return Figure("what quantization changed", [
        Facts([("quantized", quant), ("mean KL(P_ref ‖ P_q)", f"{r.kl.mean():.5g} nats"),
               ("same top token", f"{r.same_top.mean():.1%}")]),
        Heatmap(r.resid, list(r.stages), labels, path="quant.resid", lo=0.0,
                title="relative change of the residual stream, ||Δh|| / ||h_ref||"),
        Heatmap(r.pattern_mean, [f"block {i}" for i in range(n_layer)],
                [f"head {h}" for h in range(n_head)], path="quant.pattern_tv_mean", lo=0.0,
                title="each head's pattern: mean total variation over the rows"),
        Heatmap(r.kl[None, :], ["KL"], labels, path="quant.kl", lo=0.0,
                title="next-token KL(P_ref ‖ P_q), nats"),
        Bars([f"{s.file} ({s.kind})" if s.file else s.label for s in top],
             [s.estimate for s in top], path="quant.tensors",
             value_name="Δ log p",
             title=f"restoring one tensor: first-order change of log p("
                   f"{show_token(token_str(r.target))}) at position {r.position}"),
        Note(_computed(act), "dim"),
    ], subtitle="for the text " + " ".join(labels))


def file_kl_document(f, quant: str, against: str, act: list[str] | None) -> dict:
    return jsonout.jsonable({"quantized": quant, "reference": against, **f.summary(),
                             "kl_direction": "KL(P_reference || P_quantized), nats",
                             "scored": "positions n_ctx/2 .. n_ctx-2 of each chunk "
                                       "(llama-perplexity --kl-divergence)",
                             "computed": _computed(act)})


def file_kl_view(f, quant: str, against: str, act: list[str] | None) -> Group:
    s = f.summary()
    if not f.chunks:
        return Group(Text("no chunk: the file is shorter than one context", style="yellow"))
    return Group(
        Text(f"quant  {escape_line(quant)}  against  {escape_line(against)}", style="bold cyan"),
        Text(f"{s['chunks']} chunks of {s['n_ctx']} tokens, {s['positions']:,} positions scored "
             "(each chunk's second half, as llama-perplexity --kl-divergence)"),
        Text(f"mean KL(P_ref || P_q) {s['mean_kl']:.6f} nats, median {s['median_kl']:.6f}, max "
             f"{s['max_kl']:.6f}"),
        Text(f"same top token {100 * s['same_top']:.3f} %, RMS Δp {100 * s['rms_delta_p']:.3f} %"),
        Text(_computed(act), style="dim"))
