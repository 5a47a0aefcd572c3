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


def heads_document(r, ids, exclude_bos: bool, exclude_current: bool) -> dict:
    """analysis.heads.HeadsReport of the texts `ids`."""
    import numpy as np

    return jsonout.document("heads", np.stack(list(r.table.values())), kinds=list(r.table),
                            texts=r.texts, source=r.source, text_ids=ids,
                            exclude_bos=exclude_bos, exclude_current=exclude_current,
                            repeat=r.repeat)


def neuron_examples_document(ex, token_str, files) -> dict:
    """analysis.neurons.NeuronExamples found in `files`."""
    return jsonout.document(ex.path, ex.acts, layer=ex.layer, neuron=ex.neuron,
                            examples=ex.rows, window_ids=ex.ids,
                            window_tokens=[[token_str(int(i)) for i in w] for w in ex.ids],
                            data=[str(f) for f in files])


def text_neurons_document(tn, s, layer: int) -> dict:
    """analysis.neurons.TextNeurons of session `s`."""
    return jsonout.document(tn.path, tn.post, s.ids, s.tokens, layer=layer,
                            top_neurons=tn.found, read_through=tn.read)


def models_diff_document(d, weights_a) -> dict:
    """analysis.diff's two models on one text."""
    return jsonout.document(
        "diff.kl", d.diff.kl, d.a.ids, d.a.tokens, weights_a=str(weights_a),
        weights_b=str(d.b.model.folder), same_top=d.diff.same_top, delta_p=d.diff.delta_p,
        top_a=d.top_a, top_b=d.top_b, summary=d.diff.summary())


def text_diff_document(d) -> dict:
    """analysis.diff's two texts through one model."""
    return jsonout.document(
        "diff.relative_distance", d.distance, d.a.ids, d.a.tokens, stages=d.stages,
        cosine=d.cosine, ids_b=d.b.ids, tokens_b=d.b.tokens,
        top_a=[{"token": t, "chance": c} for t, c in d.top_a],
        top_b=[{"token": t, "chance": c} for t, c in d.top_b])
