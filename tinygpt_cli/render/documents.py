"""The JSON documents of the analyses, each made from its result object.

One function per result: which of its fields go out, under which names (the names are part
of the output contract, so they stay as they are). Every document is then finished by
jsonout.document / jsonout.jsonable, the one writer: adding an analysis adds a function here
and never touches the writer. No Rich here: a --json run never imports it.
"""

from __future__ import annotations

import numpy as np

from ..transformer.schema import with_old_keys
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


def heads_document(r, ids, exclude_bos: bool, exclude_current: bool,
                   changes: dict | None = None) -> dict:
    """analysis.heads.HeadsReport of the texts `ids` (`changes`: {"steered": ...})."""

    return jsonout.document("heads", np.stack(list(r.table.values())), **(changes or {}),
                            kinds=list(r.table), texts=r.texts, source=r.source,
                            text_ids=ids, exclude_bos=exclude_bos,
                            exclude_current=exclude_current, skipped_texts=r.skipped,
                            repeat=r.repeat)


def neuron_examples_document(ex, token_str, files, changes: dict | None = None) -> dict:
    """analysis.neurons.NeuronExamples found in `files` (`changes`: {"steered": ...})."""
    return jsonout.document(ex.path, ex.acts, **(changes or {}), layer=ex.layer,
                            neuron=ex.neuron,
                            examples=ex.rows, window_ids=ex.ids,
                            window_tokens=[[token_str(int(i)) for i in w] for w in ex.ids],
                            files=[str(f) for f in files])


def text_neurons_document(tn, s, layer: int) -> dict:
    """analysis.neurons.TextNeurons of session `s`."""
    return session_document(s, tn.path, tn.post, layer=layer, top_neurons=tn.found,
                            read_through=tn.read)


def models_diff_document(d, weights_a) -> dict:
    """analysis.diff's two models on one text."""
    return session_document(
        d.a, "diff.kl", d.diff.kl, weights_a=str(weights_a),
        weights_b=str(d.b.model.folder), same_top=d.diff.same_top, delta_p=d.diff.delta_p,
        top_a=d.top_a, top_b=d.top_b, summary=d.diff.summary(),
        compared="next-token distributions", shapes_differ={k: list(v) for k, v in
                                                            d.differing.items()})


def text_diff_document(d) -> dict:
    """analysis.diff's two texts through one model."""
    return session_document(
        d.a, "diff.relative_distance", d.distance, stages=d.stages,
        cosine=d.cosine, ids_b=d.b.ids, tokens_b=d.b.tokens,
        top_a=[{"token": t, "chance": c} for t, c in d.top_a],
        top_b=[{"token": t, "chance": c} for t, c in d.top_b])


def session_document(s, path: str | None, value, **extra) -> dict:
    """A document of a value of session `s`: its ids and tokens, and what was changed in the
    run ("steered", "ablated": absent for a clean run)."""
    changes = {k: s.changes[k] for k in ("steered", "ablated") if s.changes.get(k)}
    return jsonout.document(path, value, s.ids, s.tokens, **changes, **extra)


def blocks_document(s, rows: list[dict], norms, token_str, position: int) -> dict:
    """analysis.lens.block_summary's rows at `position` of session `s` (the norms of every
    stage at every position, [n_layer + 1, T], are the document's value)."""
    stages = [{k: v for k, v in row.items() if k != "norm"}
              | {"top_token": token_str(row["top_id"])} for row in rows]
    return session_document(s, None, norms, name="blocks.norm", position=position, stages=stages)


def sample_document(s, token_id: int, token: str, chance: float, seed: int, temperature: float,
                    top_k: int, top_p: float) -> dict:
    """The token card 11 picks for session `s`'s text, and how."""

    return session_document(s, None, np.int64(token_id),
                            formula="sample(softmax(logits[-1] / temperature), top_k, top_p, "
                            "create_rng(seed))", top_k=top_k, top_p=top_p, token=token,
                            chance=chance, seed=seed, temperature=temperature)


def review_document(s, values: dict, cards: list) -> dict:
    """The whole page of session `s`: its facts and every card with its value (the cards
    whose value is a table of the text give its shape only)."""

    shown = [{"number": c.number, "title": c.title, "path": c.path, "formula": c.formula,
              "command": c.command, "shape": list(np.shape(values[c.number])),
              "value": values[c.number] if c.number not in (2, 3, 4, 6, 8, 9) else None}
             for c in cards]
    return session_document(s, None, np.asarray([c.number for c in cards]), name="review",
                            facts=values["header"], cards=shown)


def map_document(s, stages: list[tuple[str, str, str]], n_layer: int) -> dict:
    """The map of session `s`'s text: each stage, its operation and the shape it gives."""

    return session_document(s, None, np.asarray([st[0] for st in stages]), name="map",
                            stages=[{"stage": st, "op": o, "shape_out": sh}
                                    for st, o, sh in stages],
                            repeat={"stages": [3, 8], "times": n_layer})


# ------------------------------------------------------------------ why this token
# Each carries the options it was run with ("options"), then the question's position, target
# and vs (analysis.question.Question).


def lens_document(s, r, options: dict) -> dict:
    """analysis.lens.LensReport; options.kind says which lens, logit or tuned."""
    return session_document(s, "lens", r.top_probs.T, options={**options, "kind": r.kind},
                            stages=r.stages,
                            top_ids=r.top_ids.T, top_tokens=r.top_tokens,
                            position=r.q.position, target=r.q.token_doc(r.q.target),
                            **with_old_keys({"target_chances": r.target_probs}),
                            target_ranks=r.target_ranks)


def dla_document(s, r, options: dict) -> dict:
    """analysis.dla.DLAReport."""
    d, q = r.dla, r.q
    return session_document(s, "dla", d.values, options=options, labels=d.labels,
                            heads=d.heads, score=d.score, total=d.total, position=q.position,
                            target=q.token_doc(q.target), vs=q.token_doc(q.vs),
                            top_neurons=d.neurons, frozen_norms=d.frozen)


def ablation_document(s, r, options: dict) -> dict:
    """analysis.ablate.AblationReport."""

    return session_document(s, "ablate", np.array([[c["delta"], c["kl"]] for c in r.rows]),
                            options=options, columns=["delta_logp", "kl"],
                            position=r.q.position, target=r.q.token_doc(r.q.target),
                            top_before=r.top_before, components=r.rows)


def patch_document(s, c, r, kinds: list[str], options: dict) -> dict:
    """analysis.patch.PatchReport of clean session `s` and corrupt session `c`."""

    q = r.q
    return session_document(s, "patch", np.stack([r.result.stream[k] for k in kinds]),
                            options=options, kinds=kinds, axes=["kind", "layer", "position"],
                            heads=r.result.heads, clean=r.result.clean,
                            corrupt=r.result.corrupt, position=q.position,
                            target=q.token_doc(q.target), vs=q.token_doc(q.vs),
                            corrupt_ids=c.ids, corrupt_tokens=c.tokens,
                            correlation=r.correlation)


def attribution_document(s, report, options: dict) -> dict:
    """analysis.attribute.AttributionReport."""
    r, q = report.attribution, report.q
    extra = {"axes": ["layer", "head", "position"]} if r.scores.ndim == 3 else {}
    if r.steer is not None:
        extra["steer"] = r.steer  # the steering vector's own term
    return session_document(s, f"attribute.{r.method}", r.scores, options=options,
                            position=q.position, target=q.token_doc(q.target),
                            vs=q.token_doc(q.vs), f=r.f, grad_norm=r.grad_norm,
                            f_baseline=r.f_baseline, completeness_gap=r.gap, **extra)


# ------------------------------------------------------------------ circuits


def token_doc(token_str, i: int | None) -> dict | None:
    return None if i is None else {"id": i, "token": token_str(i)}


def circuit_document(s, c, pair, r, stab, options: dict) -> dict:
    """analysis.circuit's result `r` for the pair of sessions s (clean) and c (corrupt),
    with its stability `stab` (or None)."""

    tok = s.model.tokenizer.token_str
    names = r.graph.edge_names()
    edges = [{"rank": k + 1, "edge": names[e], "sender": r.graph.senders[r.graph.edges[e][0]],
              "receiver": r.graph.receivers[r.graph.edges[e][1]], "score": float(r.scores[e])}
             for k, e in enumerate(r.order)]
    extra = {} if stab is None else {"stability": {
        "size": stab.size, "jaccard": stab.overlap, "own_f": stab.own,
        "transfer_f": stab.transfer}}
    return session_document(
        s, "circuit", r.scores[r.order], options=options, axes=["edge"], edges=edges,
        clean=r.clean, corrupt=r.corrupt, position=r.position, target=token_doc(tok, pair.target),
        vs=token_doc(tok, pair.vs), corrupt_ids=c.ids, corrupt_tokens=c.tokens, sizes=r.sizes,
        faithfulness=r.f, area=r.area, smallest=r.smallest, threshold=0.8,
        random_f=None if r.random is None else r.random,
        random_median=None if r.random is None else float(np.median(r.random)), **extra)


def erasure_document(s, e, scores, position: int, target: int, vs: int | None,
                     options: dict) -> dict:
    """analysis.erasure's curves of one attribution's ranking (`scores`)."""
    tok = s.model.tokenizer.token_str
    comp, suff = e.aopc
    return session_document(
        s, f"attribute.{options['method']}.faithfulness", e.comprehensiveness, options=options,
        axes=["ranking", "k"], rankings=e.names, sufficiency=e.sufficiency,
        occlusion=e.occlusion, scores=scores[: position + 1], f=e.f, f_empty=e.f_empty,
        aopc_comprehensiveness=comp, aopc_sufficiency=suff, position=position,
        target=token_doc(tok, target), vs=token_doc(tok, vs))


def qk_document(s, r, i: int, h: int, p: int, k: int, options: dict) -> dict:
    """analysis.qk's split of head (i, h)'s scores from query p (key k shown)."""
    return session_document(s, f"qk.layers.{i}.heads.{h}", r.terms, options=options,
                            axes=["query part", "key part", "key"], sources=r.sources,
                            layer=i, head=h, query=p, key=k, scores=r.scores,
                            weights=r.weights)


# ------------------------------------------------------------------ the model and its text


def encode_document(ids: list[int], starts: list[int], tokenizer, config) -> dict:
    """jsonout.document("ids", ids as int64, ids, tokens, offsets=..., vocab_size=...), its
    lists as jsonout.Rows: a text of millions of tokens is written out piece by piece
    (`starts`: each token's first byte in the text, and the text's length last)."""
    return {"path": "ids", "shape": [len(ids)], "dtype": "int64", "data": jsonout.Rows(ids),
            "ids": jsonout.Rows(ids), "tokens": jsonout.Rows(ids, tokenizer.token_str),
            "offsets": jsonout.Rows(range(len(ids)), lambda i: [starts[i], starts[i + 1]]),
            "vocab_size": config.vocab_size}


def info_document(info) -> dict:
    """analysis.info.ModelInfo."""

    return jsonout.document(None, np.int64(info.total), None, None, name="parameters",
                            config=info.config,
                            parameters={"total": info.total, "groups": info.groups},
                            weights_file=str(info.weights_file), shipped=info.shipped,
                            sha256=info.sha256, tokenizer=info.tokenizer,
                            **({"gguf": info.gguf} if info.gguf else {}))


def traced_document(r, shown: str, value) -> dict:
    """`trace TEXT PATH`: one value of run r (an int, the token strings, or an array)."""

    if isinstance(value, int):
        value = np.int64(value)
    elif isinstance(value, list):
        value = np.asarray(value)
    return session_document(r, shown, value)


# ------------------------------------------------------------------ history


def heads_history_document(s, scores: dict, snapshots: list[dict], length: int) -> dict:
    """history --heads: induction and previous-token scores [snapshot, layer, head]."""
    return session_document(s, "induction", scores["induction"],
                            previous_token=scores["previous_token"], snapshots=snapshots,
                            previous_token_chance=scores["previous_token_chance"],
                            induction_length=length, induction_seed=0,
                            axes=["snapshot", "layer", "head"])


def value_history_document(s, h) -> dict:
    """history PATH: analysis.history.ValueHistory (an attention grid's rows in full)."""

    extra = {"weights": np.stack(h.values)} if h.grid else {}
    return session_document(s, h.shown, np.asarray([r["norm"] for r in h.rows]),
                            snapshots=h.rows, **extra)


def loss_history_document(s, rows: list[dict]) -> dict:
    """history: the loss on the text per snapshot (null where there is none)."""

    losses = np.asarray([np.nan if r["loss"] is None else r["loss"] for r in rows])
    return session_document(s, "loss", losses, snapshots=rows)


def why_document(s, result, seconds: float) -> dict:
    """analysis.why's answer for session `s`, found in `seconds`."""
    return session_document(s, "scores", result.scores(), **result.facts(), seconds=seconds)
