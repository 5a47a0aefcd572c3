"""The JSON documents of the analyses, each made from its result object.

One function per result: which of its fields go out, under which names (the names are part
of the output contract, so they stay as they are). Every document is then finished by
jsonout.document / jsonout.jsonable, the one writer: adding an analysis adds a function here
and never touches the writer. No Rich here: a --json run never imports it.
"""

from __future__ import annotations

from . import jsonout


def steer_document(r, tok) -> dict:
    """analysis.steer.SteerReport; `tok` names the prompts' tokens."""
    return jsonout.document("steer", r.slopes, **{
        "site": f"layers.{r.layer}.resid_pre", "norm": r.norm, "scale": r.scale,
        "scales": r.scales, "wrong_way": r.wrong_way, "mean_slope": float(r.slopes.mean()),
        "train_pairs": r.train_pairs, "held_out_pairs": r.held_out_pairs,
        "loss_before": r.loss_before, "loss_after": r.loss_after,
        "loss_increase": r.loss_increase, "loss_tokens": r.n_loss_tokens,
        "prompts": [{"text": tok.decode(p.ids), "ids": p.ids, "target": p.target, "vs": p.vs,
                     "target_token": tok.token_str(p.target), "vs_token": tok.token_str(p.vs),
                     "diffs": p.diffs, "slope": p.slope} for p in r.prompts],
        "vector": r.vector})


def probe_document(r) -> dict:
    """analysis.probe.ProbeReport."""
    return jsonout.document(r.site, r.W, **{
        "classes": r.classes, "bias": r.b, "accuracy": r.accuracy,
        "train_accuracy": r.train_accuracy, "control_accuracy": r.control_accuracy,
        "control_train_accuracy": r.control_train_accuracy, "selectivity": r.selectivity,
        "majority": r.majority, "train_counts": r.train_counts,
        "held_out_counts": r.held_counts, "lines": list(r.lines), "l2": r.l2,
        "newton_steps": r.steps})
