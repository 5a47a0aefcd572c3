"""`circuit` on every family's block: tiny random GPT-2, GPT-Neo (a local window shorter than
the text), GPT-NeoX (rotary on a quarter of each head, parallel blocks), Llama (RMSNorm,
rotary, SwiGLU, 4 query heads on 2 key/value heads), Qwen2 (q/k/v biases) and Qwen3 (q/k
norm, heads wider than n_embd / n_head). Each edge's exact score against the same patch made
by hand: the receiver's input (the run's own plus the sender's clean-minus-corrupt output),
normed, projected, q/k-normed and rotated by the formulas written out here, swapped into the
ordinary forward pass with a hook; and circuit's identities on each family."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import FAMILIES, random_params

from tinygpt_cli.analysis import circuit as C
from tinygpt_cli.jobs.train.loop import arch_config
from tinygpt_cli.transformer.config import Config
from tinygpt_cli.transformer.hooks import Record, Replace
from tinygpt_cli.transformer.model import forward

IDS = np.array([3, 17, 5, 9, 22, 1])
OTHER = np.array([4, 17, 8, 9, 2, 1])  # same length, three tokens changed
TARGET, VS = 4, 7
SIZES = dict(n_layer=2, n_inner=20, vocab_size=23, n_positions=8)
LLAMA = dict(n_embd=16, n_head=4, **SIZES)


def family_config(name: str) -> Config:
    if name == "gpt2":
        return Config(n_embd=12, n_head=2, **SIZES)
    if name == "neo":  # block 1 local: a query sees 4 keys of the text's 6
        return arch_config("neo", n_embd=12, n_head=2, **SIZES)
    if name == "neox":  # d_k 8, rotary on 2 of them
        return arch_config("neox", n_embd=16, n_head=2, **SIZES)
    llama = arch_config("llama", **LLAMA)
    assert llama.kv_heads == 2
    if name == "qwen2":
        return Config(**{**llama.__dict__, "model_type": "qwen2", "qkv_bias": True})
    if name == "qwen3":
        return Config(**{**llama.__dict__, "model_type": "qwen3", "qk_norm": True,
                         "head_dim": 6})
    return llama


@pytest.fixture(scope="module", params=FAMILIES)
def fam(request):
    """(config, float64 params, the prepared pair, its exact and exact-noising scores)."""
    config = family_config(request.param)
    params = random_params(config, seed=FAMILIES.index(request.param))
    pair = C.prepare(params, config, IDS, OTHER, TARGET, VS)
    return config, params, pair, C.exact_scores(pair), C.exact_noising_scores(pair)


# ------------------------------------------------------------------ the patch by hand


def naive_norm(x, params, name, config):
    w, eps = params[name + ".w"], config.layer_norm_epsilon
    if config.norm == "rms":
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w
    c = x - x.mean(-1, keepdims=True)
    return c / np.sqrt((c * c).mean(-1, keepdims=True) + eps) * w + params[name + ".b"]


def naive_rotary(x, config):
    """Each pair (x_j, x_{j + r/2}) of the first r numbers at position p turned by the angle
    p base^(-2j / r)."""
    r = config.rotary
    out = x.copy()
    for p in range(len(x)):
        for j in range(r // 2):
            a = p * config.rotary_base ** (-2 * j / r)
            x1, x2 = x[p, j], x[p, j + r // 2]
            out[p, j], out[p, j + r // 2] = (x1 * np.cos(a) - x2 * np.sin(a),
                                             x2 * np.cos(a) + x1 * np.sin(a))
    return out


def naive_projection(x, params, config, i, part, h):
    """Head h's q (its group's k or v) from normed input x [T, d]: W_QKV's columns read by
    hand (q heads, then the key/value heads), the bias, q/k norm and rotation."""
    dk, n, kv = config.d_k, config.n_head, config.kv_heads
    g = h // (n // kv)
    first = {"q": h * dk, "k": (n + g) * dk, "v": (n + kv + g) * dk}[part]
    cols = slice(first, first + dk)
    y = x @ params[f"layers.{i}.attn.W_QKV"][:, cols]
    if f"layers.{i}.attn.b_QKV" in params:
        y = y + params[f"layers.{i}.attn.b_QKV"][cols]
    if part != "v" and config.qk_norm:
        w = params[f"layers.{i}.attn.{part}_norm.w"]
        y = y / np.sqrt((y * y).mean(-1, keepdims=True) + config.layer_norm_epsilon) * w
    if part != "v" and config.rotary:
        y = naive_rotary(y, config)
    return y


def naive_senders(params, config, values) -> dict[str, np.ndarray]:
    """Each sender's output [T, d] in a recorded run: the embeddings, z_h times head h's rows
    of W_O, the MLP's output."""
    out, dk = {"embed": values["embeddings"]}, config.d_k
    for i in range(config.n_layer):
        w_o = params[f"layers.{i}.attn.W_O"]
        for h in range(config.n_head):
            out[f"L{i}H{h}"] = values[f"layers.{i}.z"][h] @ w_o[h * dk:(h + 1) * dk]
        out[f"L{i}.mlp"] = values[f"layers.{i}.mlp_out"]
    return out


def metric(logits) -> float:
    return float(logits[-1, TARGET] - logits[-1, VS])


def by_hand(params, config, ids, sender, receiver, sign=1.0) -> float:
    """The run on `ids` with only `receiver`'s input moved by sign (clean - corrupt output of
    `sender`), the receiver's computation rewritten by hand and swapped in with a hook. A
    head's q replaces its own q; its k (v) enters through its own scores (output) alone, so
    the other heads of its key/value group still read the group's unmoved keys (values)."""
    runs = []
    for text in (IDS, OTHER):
        rec = Record()
        forward(params, config, text, hooks=rec)
        runs.append(rec.values)
    delta = sign * (naive_senders(params, config, runs[0])[sender]
                    - naive_senders(params, config, runs[1])[sender])
    rec = runs[0] if ids is IDS else runs[1]
    if receiver == "logits":
        last = rec[f"layers.{config.n_layer - 1}.resid_post"]
        fns = {"ln_final.out": lambda _: naive_norm(last + delta, params, "ln_final", config)}
    elif receiver.endswith(".mlp"):
        i = int(receiver[1:-4])
        stream = rec[f"layers.{i}." + ("resid_pre" if config.parallel else "resid_mid")]
        fns = {f"layers.{i}.ln2.out":
               lambda _: naive_norm(stream + delta, params, f"layers.{i}.ln2", config)}
    else:
        m = re.fullmatch(r"L(\d+)H(\d+)\.([qkv])", receiver)
        i, h, part = int(m[1]), int(m[2]), m[3]
        L = f"layers.{i}."
        x = naive_norm(rec[L + "resid_pre"] + delta, params, L + "ln1", config)
        y = naive_projection(x, params, config, i, part, h)
        group = config.n_head // config.kv_heads

        def fn(a):
            a = a.copy()
            if part == "q":
                a[h] = y
            elif part == "k":  # head h's scores, masked where the pass masks them
                a[h] = np.where(np.isneginf(a[h]), -np.inf,
                                rec[L + "q"][h] @ y.T * config.scale)
            else:  # head h's output: its pattern times the moved values
                a[h] = rec[L + "weights"][h] @ y
            return a
        assert rec[L + "k"].shape[0] == config.n_head // group
        fns = {L + {"q": "q", "k": "scores", "v": "z"}[part]: fn}
    return metric(forward(params, config, ids, hooks=Replace(fns)))


EDGES = [("embed", "logits"), ("embed", "L0H1.q"), ("embed", "L0.mlp"), ("L0H0", "L1H1.k"),
         ("L0H1", "L1H0.v"), ("L0.mlp", "L1H1.q"), ("L0H1", "L0.mlp"), ("L1H0", "logits"),
         ("L1.mlp", "logits"), ("L0H0", "L1.mlp"), ("L1H1", "L1.mlp"), ("L0.mlp", "L1.mlp"),
         ("L0H1", "L1H0.k")]


def test_exact_edge_scores_are_patches_made_by_hand(fam):
    config, params, pair, exact, noising = fam
    g = pair.graph
    names = g.edge_names()
    corrupt, clean = metric(forward(params, config, OTHER)), metric(forward(params, config, IDS))
    assert pair.corrupt == pytest.approx(corrupt, abs=1e-10)
    checked = 0
    for sender, receiver in EDGES:
        name = f"{sender} -> {receiver}"
        same_block = re.fullmatch(r"L(\d)H\d", sender) and receiver == f"L{sender[1]}.mlp"
        # a parallel block's MLP reads the block's input: its own heads are no senders
        assert (name in names) == (not (same_block and config.parallel)), name
        if name not in names:
            continue
        k = names.index(name)
        want = by_hand(params, config, OTHER, sender, receiver) - corrupt
        assert exact[k] == pytest.approx(want, abs=1e-9), name
        assert noising[k] == pytest.approx(
            clean - by_hand(params, config, IDS, sender, receiver, -1.0), abs=1e-9), name
        checked += 1
    assert checked >= len(EDGES) - 2
    assert np.abs(exact).max() > 1e-3  # the edges carry something


def test_the_edge_decomposed_forward_is_the_forward_pass(fam):
    config, params, pair, _, _ = fam
    fixed = np.random.default_rng(0).normal(size=pair.clean_out.shape)
    e = len(pair.graph.edges)
    got = C.edge_forward(pair.params, pair.config, pair.graph, IDS, np.ones((1, e)), fixed,
                         [TARGET, VS, 0], 4)[0]
    np.testing.assert_allclose(got, forward(params, config, IDS)[4, [TARGET, VS, 0]],
                               atol=1e-12, rtol=0)


def test_all_edges_kept_none_kept_and_all_patched(fam):
    _, _, pair, _, _ = fam
    e = len(pair.graph.edges)
    f = C.faithfulness(pair, np.stack([np.ones(e), np.zeros(e)]))
    assert abs(f[0] - 1) < 1e-9 and abs(f[1]) < 1e-9
    m = pair.metric_of(pair.corrupt_ids, np.zeros((1, e)), pair.clean_out)
    assert m[0] == pytest.approx(pair.clean, abs=1e-9)


def test_eap_is_the_derivative_along_each_edge_and_eap_ig_one_step(fam):
    config, _, pair, _, _ = fam
    eap = C.eap_scores(pair)
    np.testing.assert_allclose(C.eap_ig_scores(pair, 1), eap, atol=1e-12, rtol=0)
    e, eps = len(pair.graph.edges), 1e-5
    picks = [0, 5, e // 3, e // 2, e - 2, e - 1]
    live = np.ones((2 * len(picks), e))
    for row, k in enumerate(picks):
        live[2 * row, k], live[2 * row + 1, k] = 1 - eps, 1 + eps
    m = pair.metric_of(pair.corrupt_ids, live, pair.clean_out)
    for row, k in enumerate(picks):
        fd = (m[2 * row] - m[2 * row + 1]) / (2 * eps)
        assert eap[k] == pytest.approx(fd, rel=1e-5, abs=1e-8), pair.graph.edge_names()[k]


def test_eap_ig_is_complete_on_the_embeddings(fam):
    _, _, pair, _, _ = fam
    from_embed = [k for k, (u, _) in enumerate(pair.graph.edges) if u == 0]
    gap = pair.clean - pair.corrupt
    errors = [abs(C.eap_ig_scores(pair, m)[from_embed].sum() - gap) for m in (25, 200)]
    assert errors[1] < errors[0] / 4 and errors[1] < 0.02 * abs(gap)


def test_a_key_groups_eap_is_the_shared_keys(fam):
    """Ungrouped, each query head reads its own copy of its group's key and value: the EAP
    scores of the copies add up to the derivative along the shared key's (value's) input,
    taken here by central differences of the grouped model with that input moved by hand."""
    config, params, pair, _, _ = fam
    if config.kv_heads == config.n_head:
        pytest.skip("no key/value groups")
    names, eap = pair.graph.edge_names(), C.eap_scores(pair)
    group = config.n_head // config.kv_heads
    rec = Record()
    forward(params, config, OTHER, hooks=rec)
    clean = Record()
    forward(params, config, IDS, hooks=clean)
    delta = (naive_senders(params, config, clean.values)["L0H1"]
             - naive_senders(params, config, rec.values)["L0H1"])
    L, eps = "layers.1.", 1e-5
    for part in "kv":
        def moved(s, part=part):
            x = naive_norm(rec.values[L + "resid_pre"] + s * delta, params, L + "ln1", config)
            y = naive_projection(x, params, config, 1, part, group)  # head `group`: kv head 1

            def fn(a):
                a = a.copy()
                a[1] = y
                return a
            return metric(forward(params, config, OTHER, hooks=Replace({L + part: fn})))

        fd = (moved(eps) - moved(-eps)) / (2 * eps)
        shared = sum(eap[names.index(f"L0H1 -> L1H{h}.{part}")]
                     for h in range(group, 2 * group))
        assert shared == pytest.approx(fd, rel=1e-5, abs=1e-8), part


def test_circuit_finds_a_faithful_circuit_on_every_family(fam):
    _, _, pair, exact, _ = fam
    r = C.find_circuit(pair, "exact", random_count=5)
    np.testing.assert_array_equal(r.scores, exact)
    assert r.f[0] == pytest.approx(0, abs=1e-9) and r.f[-1] == pytest.approx(1, abs=1e-9)


def test_a_steered_pair_decomposes_the_steered_run(fam):
    """A vector added before block 1 in both runs: every edge live is the steered forward
    pass (a parallel block's MLP reads the shifted block input too), and f(all) = 1."""
    from tinygpt_cli.transformer.hooks import add_vector

    config, params, _, _, _ = fam
    steer = add_vector("layers.1.resid_pre",
                       np.random.default_rng(4).normal(0, 0.5, config.n_embd), 2.0)
    pair = C.prepare(params, config, IDS, OTHER, TARGET, VS, steer=steer)
    e = len(pair.graph.edges)
    fixed = np.random.default_rng(0).normal(size=pair.clean_out.shape)
    got = C.edge_forward(pair.params, pair.config, pair.graph, IDS, np.ones((1, e)), fixed,
                         [TARGET, VS], 5, steer=steer)[0]
    np.testing.assert_allclose(got, forward(params, config, IDS, hooks=steer)[5, [TARGET, VS]],
                               atol=1e-12, rtol=0)
    f = C.faithfulness(pair, np.stack([np.ones(e), np.zeros(e)]))
    assert abs(f[0] - 1) < 1e-9 and abs(f[1]) < 1e-9


def test_a_senders_outgoing_eap_scores_add_up_to_attribution_patching(fam):
    """`patch --method atp`'s score of a head's output, an MLP's output or the embeddings
    (summed over positions, as a share of the gap) is the sum of its edges' EAP scores."""
    from tinygpt_cli.analysis import patch as pa

    config, params, pair, _, _ = fam
    atp = pa.attribution_patching(params, config, IDS, OTHER, TARGET, VS)
    out = np.zeros(len(pair.graph.senders))
    for (u, _), x in zip(pair.graph.edges, C.eap_scores(pair), strict=True):
        out[u] += x
    out /= pair.clean - pair.corrupt
    assert out[0] == pytest.approx(atp.stream["resid_pre"][0].sum(), abs=1e-9)
    for i in range(config.n_layer):
        assert out[C.mlp_index(config, i)] == pytest.approx(atp.stream["mlp_out"][i].sum(),
                                                            abs=1e-9)
        for h in range(config.n_head):
            assert out[C.head_index(config, i, h)] == pytest.approx(atp.heads[i, h], abs=1e-9)
