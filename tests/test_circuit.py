"""Circuits: the edge-decomposed forward pass against the model's own, single-edge patches
against hand-made hook interventions, EAP against finite differences and attribution patching,
the faithfulness identities, and (on the shipped model) EAP and EAP-IG against the three exact
oracles over TinyStories-like pairs."""

from __future__ import annotations

import re

import numpy as np
import pytest
from cli_helpers import assert_one_error_line

from tinygpt_cli.analysis import circuit as C
from tinygpt_cli.analysis import patch as pa
from tinygpt_cli.analysis.attribute import integrated_gradients
from tinygpt_cli.analysis.erasure import erasure
from tinygpt_cli.analysis.qk import qk_attribution
from tinygpt_cli.storage.locations import SHIPPED
from tinygpt_cli.transformer import ops
from tinygpt_cli.transformer.config import Config
from tinygpt_cli.transformer.folder import load_model
from tinygpt_cli.transformer.hooks import Record, Replace
from tinygpt_cli.transformer.model import forward

IDS = np.array([3, 17, 5, 9, 22, 1])
OTHER = np.array([4, 17, 8, 9, 2, 1])  # same length, three tokens changed
TARGET, VS = 4, 7


@pytest.fixture(scope="module")
def pair(tiny_params, tiny_config):
    return C.prepare(tiny_params, tiny_config, IDS, OTHER, TARGET, VS)


def edge(graph: C.Graph, sender: str, receiver: str) -> int:
    return graph.edges.index((graph.senders.index(sender), graph.receivers.index(receiver)))


# ------------------------------------------------------------------ the graph


def count_edges(n_layer: int, n_head: int) -> int:
    """Counted by hand: the embeddings feed every receiver; a head of block l feeds MLP l,
    every receiver of later blocks and the logits; MLP l every later receiver and the logits."""
    per_block = 3 * n_head + 1
    receivers = n_layer * per_block + 1
    total = receivers
    for layer in range(n_layer):
        later = (n_layer - 1 - layer) * per_block + 1
        total += n_head * (1 + later) + later
    return total


def test_the_graph_has_the_edges_counted_by_hand(tiny_config):
    g = C.build_graph(tiny_config)
    assert len(g.edges) == count_edges(2, 2) == 46
    assert g.senders == ["embed", "L0H0", "L0H1", "L0.mlp", "L1H0", "L1H1", "L1.mlp"]
    assert "L0H1 -> L0.mlp" in g.edge_names() and "L1H0 -> L1H1.q" not in g.edge_names()
    assert "L0.mlp -> L0H0.q" not in g.edge_names() and "L1.mlp -> logits" in g.edge_names()
    shipped = Config(n_embd=8, n_layer=4, n_head=4, n_inner=8, vocab_size=8, n_positions=8)
    assert len(C.build_graph(shipped).edges) == count_edges(4, 4) == 479


# ------------------------------------------------------------------ the decomposed forward


def test_the_edge_decomposed_forward_is_the_forward_pass(tiny_params, tiny_config, pair):
    """Every edge live: the model itself, whatever the fixed outputs are."""
    rng = np.random.default_rng(0)
    e = len(pair.graph.edges)
    fixed = rng.normal(size=pair.clean_out.shape)
    got = C.edge_forward(pair.params, tiny_config, pair.graph, IDS, np.ones((2, e)), fixed,
                         [TARGET, VS, 0], 3)
    want = forward(pair.params, tiny_config, IDS)[3, [TARGET, VS, 0]]
    np.testing.assert_allclose(got, np.broadcast_to(want, got.shape), atol=1e-12, rtol=0)


def ln(x, params, name, eps):
    return ops.layer_norm(x, params[name + ".w"], params[name + ".b"], eps)[0]


def by_hooks(pair, config, sender: str, receiver: str, ids=OTHER, sign: float = 1.0) -> float:
    """The run on `ids` (the corrupt text) with `sender`'s clean-minus-corrupt output added
    (sign -1: subtracted, from the clean run) to `receiver`'s input only: the receiver's normed
    input recomputed by hand and swapped in with a hook."""
    p, eps = pair.params, config.layer_norm_epsilon
    delta = sign * (pair.clean_out - pair.corrupt_out)[pair.graph.senders.index(sender)]
    recorder = Record()
    forward(p, config, ids, hooks=recorder)
    rec = recorder.values
    if receiver == "logits":
        last = f"layers.{config.n_layer - 1}.resid_post"
        fns = {"ln_final.out": lambda _: ln(rec[last] + delta, p, "ln_final", eps)}
    elif receiver.endswith(".mlp"):
        i = int(receiver[1:-4])
        fns = {f"layers.{i}.ln2.out": lambda _: ln(rec[f"layers.{i}.resid_mid"] + delta, p,
                                                    f"layers.{i}.ln2", eps)}
    else:
        m = re.fullmatch(r"L(\d+)H(\d+)\.([qkv])", receiver)
        i, h, part = int(m[1]), int(m[2]), m[3]
        wq, wk, wv, bq, bk, bv, _ = C.head_weights(p, config, i)
        w, b = {"q": (wq, bq), "k": (wk, bk), "v": (wv, bv)}[part]

        def fn(x):
            x = x.copy()
            x[h] = ln(rec[f"layers.{i}.resid_pre"] + delta, p, f"layers.{i}.ln1", eps) @ w[h] + b[h]
            return x
        fns = {f"layers.{i}.{part}": fn}
    logits = forward(p, config, ids, hooks=Replace(fns))
    return float(logits[-1, TARGET] - logits[-1, VS])


@pytest.mark.parametrize("sender,receiver", [
    ("embed", "logits"), ("L0H1", "L0.mlp"), ("L0.mlp", "L1H0.k"), ("embed", "L0H1.q"),
    ("L0H0", "L1H1.v"), ("L1H1", "logits")])
def test_exact_edge_scores_are_those_single_patches_made_with_hooks(pair, tiny_config, sender,
                                                               receiver):
    k = edge(pair.graph, sender, receiver)
    want = by_hooks(pair, tiny_config, sender, receiver) - pair.corrupt
    assert C.exact_scores(pair)[k] == pytest.approx(want, abs=1e-10)
    noising = pair.clean - by_hooks(pair, tiny_config, sender, receiver, IDS, -1.0)
    assert C.exact_noising_scores(pair)[k] == pytest.approx(noising, abs=1e-10)
    assert C.scores(pair, "exact-mean")[k] == pytest.approx((want + noising) / 2, abs=1e-10)


# ------------------------------------------------------------------ identities


def test_all_edges_kept_is_the_clean_run_and_none_the_corrupt_run(pair):
    e = len(pair.graph.edges)
    f = C.faithfulness(pair, np.stack([np.ones(e), np.zeros(e)]))
    assert abs(f[0] - 1) < 1e-6 and abs(f[1]) < 1e-6


def test_exact_with_every_edge_patched_is_the_clean_run(pair):
    e = len(pair.graph.edges)
    m = pair.metric_of(pair.corrupt_ids, np.zeros((1, e)), pair.clean_out)
    assert m[0] == pytest.approx(pair.clean, abs=1e-9)


def test_eap_ig_with_one_step_is_eap(pair):
    np.testing.assert_allclose(C.eap_ig_scores(pair, 1), C.eap_scores(pair), atol=1e-12,
                               rtol=0)


def test_eap_is_the_derivative_along_the_edge(pair, tiny_config):
    """Central finite differences of the metric as v's input moves by eps (clean - corrupt
    output of u), through the decomposed forward pass (checked above against the model)."""
    eap = C.eap_scores(pair)
    e, eps = len(pair.graph.edges), 1e-5
    for k in (0, 7, 20, 33, e - 1):
        live = np.ones((2, e))
        live[0, k], live[1, k] = 1 - eps, 1 + eps  # live mixes run and clean: +-eps of delta
        m = pair.metric_of(pair.corrupt_ids, live, pair.clean_out)
        assert eap[k] == pytest.approx((m[0] - m[1]) / (2 * eps), rel=1e-5, abs=1e-9)


def test_a_nodes_outgoing_eap_scores_add_up_to_attribution_patching(tiny_params, tiny_config,
                                                                     pair):
    """`patch --method atp` scores each head's output (z, at every position), each MLP's
    output and the embeddings (resid_pre of block 0) per position, as a share of the gap."""
    atp = pa.attribution_patching(tiny_params, tiny_config, IDS, OTHER, TARGET, VS)
    eap, g = C.eap_scores(pair), pair.graph
    gap = pair.clean - pair.corrupt
    out = np.zeros(len(g.senders))
    for (u, _), x in zip(g.edges, eap, strict=True):
        out[u] += x
    assert out[0] / gap == pytest.approx(atp.stream["resid_pre"][0].sum(), abs=1e-9)
    for i in range(tiny_config.n_layer):
        assert out[C.mlp_index(tiny_config, i)] / gap == pytest.approx(
            atp.stream["mlp_out"][i].sum(), abs=1e-9)
        for h in range(tiny_config.n_head):
            assert out[C.head_index(tiny_config, i, h)] / gap == pytest.approx(
                atp.heads[i, h], abs=1e-9)


def test_eap_ig_is_complete_on_the_embeddings(pair):
    """The embeddings are what EAP-IG interpolates, so their outgoing scores add up to
    clean - corrupt (integrated gradients' completeness), the left sums converging as 1/steps."""
    g = pair.graph
    from_embed = [k for k, (u, _) in enumerate(g.edges) if u == 0]
    gap = pair.clean - pair.corrupt
    errors = [abs(C.eap_ig_scores(pair, m)[from_embed].sum() - gap) for m in (50, 400)]
    assert errors[1] < errors[0] / 4 and errors[1] < 0.01 * abs(gap)


def test_the_curve_is_computed_on_a_grid_and_exactly_where_it_first_reaches_08(pair):
    sizes = C.curve_sizes(479)
    assert list(sizes[:65]) == list(range(65)) and sizes[-1] == 479
    assert set(np.diff(sizes[64:-1])) == {8}
    order = C.ranked(C.eap_scores(pair))
    every = np.arange(len(order) + 1)
    f = C.faithfulness(pair, C.circuit_masks(order, every))
    want = C.smallest_faithful(every, f)
    assert want is not None and want > 3
    # a grid of every N up to 2, then every 7th: every N below its first crossing is added
    got_sizes, got_f, smallest = C.faithful_curve(pair, order, every_to=2, step=7)
    assert smallest == want and want in got_sizes and len(got_sizes) < len(every)
    np.testing.assert_allclose(got_f, f[got_sizes], atol=1e-12)


def test_the_curve_area_and_the_smallest_faithful_circuit():
    sizes = np.arange(5)
    f = np.array([0.0, 0.5, 0.9, 0.7, 1.0])
    assert C.area(sizes, f, 4) == pytest.approx((0.25 + 0.7 + 0.8 + 0.85) / 4)
    assert C.smallest_faithful(sizes, f) == 2
    assert C.smallest_faithful(sizes, f * 0.5) is None


def test_random_circuits_have_the_size_asked_for(pair):
    rng_f = C.random_faithfulness(pair, 5, count=7, seed=3)
    assert rng_f.shape == (7,)
    again = C.random_faithfulness(pair, 5, count=7, seed=3)
    np.testing.assert_array_equal(rng_f, again)
    e = len(pair.graph.edges)
    assert C.random_faithfulness(pair, e, count=2) == pytest.approx([1.0, 1.0], abs=1e-9)


def naive_spearman(x, y):
    def ranks(a):
        return np.array([sum(b < v for b in a) + (sum(b == v for b in a) - 1) / 2 for v in a])
    rx, ry = ranks(list(x)), ranks(list(y))
    rx, ry = rx - rx.mean(), ry - ry.mean()
    return float((rx * ry).sum() / np.sqrt((rx * rx).sum() * (ry * ry).sum()))


@pytest.mark.parametrize("x,y", [([1, 2, 3, 4], [2, 1, 4, 3]),
                                 ([1, 1, 2, 5, 5, 5], [3, 1, 2, 2, 9, 0]),
                                 ([0.5, -1, 3, 3], [1, 2, 3, 4])])
def test_spearman_against_a_naive_count(x, y):
    assert C.spearman(np.array(x, float), np.array(y, float)) == pytest.approx(
        naive_spearman(x, y), abs=1e-12)


def test_default_tokens_fall_back_to_the_corrupt_runs_next_guess():
    clean, corrupt = np.array([0.0, 5.0, 1.0, 2.0]), np.array([0.0, 4.0, 3.0, 1.0])
    assert C.default_tokens(clean, corrupt, None, None) == (1, 2, True)
    assert C.default_tokens(clean, corrupt + np.array([0, 0, 2, 0]), None, None) == (1, 2, False)
    assert C.default_tokens(clean, corrupt, 3, None) == (3, 1, False)
    assert C.default_tokens(clean, corrupt, None, 0) == (1, 0, False)


# ------------------------------------------------------------------ against the oracle

# TinyStories-like pairs of equal token length: a name, an object or a word swapped.
PAIRS = [
    ("Lily and Tom went to the park. Lily gave the ball to",
     "Lily and Tom went to the park. Tom gave the ball to"),
    ("Once upon a time, there was a little girl named Lily. She",
     "Once upon a time, there was a little boy named Tom. He"),
    ("Ben had a red ball. He liked to play with his",
     "Ben had a red car. He liked to play with his"),
    ("Sue saw a big dog. The dog was", "Sue saw a big cat. The cat was"),
    ("Tom and Sue found a cat. Tom gave the cat to",
     "Tom and Sue found a cat. Sue gave the cat to"),
    ("The bird sat on the tree. The bird liked to", "The fish sat on the tree. The fish liked to"),
    ("Mom made a cake for Lily. Lily said thank you to",
     "Mom made a cake for Tom. Tom said thank you to"),
    ("Max had a toy car. He played with the car in the",
     "Max had a toy boat. He played with the boat in the"),
    ("Anna went to the store with her mom. Anna wanted a",
     "Anna went to the park with her mom. Anna wanted a"),
    ("Lily liked to draw. She took her", "Lily liked to read. She took her"),
    ("The sun was hot. Tim wanted to go to the", "The snow was cold. Tim wanted to go to the"),
    ("Sam found a shiny rock. He showed the rock to his",
     "Sam found a shiny shell. He showed the shell to his"),
    ("Mia and Ben played in the garden. Ben gave a flower to",
     "Mia and Ben played in the garden. Mia gave a flower to"),
    ("The little dog was hungry. He wanted to eat", "The little dog was tired. He wanted to sleep"),
    ("Lily had a doll. She loved her doll very", "Lily had a kite. She loved her kite very"),
    ("Tom saw a frog in the pond. The frog said", "Tom saw a duck in the pond. The duck said"),
    ("Jack and Jill went up the hill. Jill said to",
     "Jack and Jill went up the hill. Jack said to"),
    ("The girl was sad because she lost her", "The girl was happy because she found her"),
    ("Bob had a big box. Inside the box was a", "Bob had a big bag. Inside the bag was a"),
    ("Amy wanted to bake cookies. She asked her mom for",
     "Amy wanted to plant flowers. She asked her mom for"),
    ("Kitty the cat liked milk. Every day she drank",
     "Kitty the cat liked fish. Every day she ate"),
    ("Lucy put on her coat because it was", "Lucy put on her hat because it was"),
    ("Once upon a time there was a big bear. The bear",
     "Once upon a time there was a small mouse. The mouse"),
    ("Sara gave Tom a hug. Tom smiled at", "Tom gave Sara a hug. Sara smiled at"),
]

shipped = pytest.mark.skipif(not (SHIPPED / "model.safetensors").is_file(),
                             reason="no shipped weights")


def shipped_pair(model, clean: str, corrupt: str) -> C.Pair:
    a, b = model.tokenizer.encode(clean), model.tokenizer.encode(corrupt)
    assert len(a) == len(b), (clean, corrupt)
    la, lb = (forward(model.params, model.config, np.array(x))[-1] for x in (a, b))
    t, v, _ = C.default_tokens(la, lb, None, None)
    return C.prepare(model.params, model.config, a, b, t, v)


@pytest.mark.slow
@shipped
def test_eap_follows_exact_and_eap_ig_the_mean_of_both_oracles():
    """Spearman correlation of each method's 479 edge scores with the exact oracles, per pair,
    over 24 pairs, on the signed scores and on |score| (what a circuit ranks by); and how far
    each method's top-N circuits are from f = 1.

    Measured on the shipped model (mean, lowest over the pairs), signed | |score|:
      against exact:          EAP 0.928 (0.88) | 0.976 (0.96), EAP-IG 0.852 (0.44) | 0.910 (0.82)
      against exact-noising:  EAP 0.575 (0.08) | 0.842 (0.75), EAP-IG 0.803 (0.43) | 0.899 (0.81)
      against exact-mean:     EAP 0.810 (0.36) | 0.904 (0.81), EAP-IG 0.948 (0.82) | 0.966 (0.92)
    EAP-IG is ahead of EAP against exact-mean on all 24 pairs and against exact-noising on
    all 24 signed (22 by |score|), and behind it against exact on all 24 (|score|): to second
    order EAP is the tangent of `exact` and EAP-IG the mean of the two oracles
    (analysis/circuit.py's docstring), so "EAP-IG at least as close to `exact` as EAP" does not
    hold; what holds is asserted. Its circuits are the more faithful: mean |1 - f| over N = 5,
    10, 20, 40, 80 is 0.35 for EAP-IG, 0.45 for EAP (a ratio of 0.78; 0.51 on the model shipped
    before this one, a warm start), median f at N = 20: 0.89 and 0.76. The bounds leave a margin
    for retraining."""
    model = load_model(SHIPPED)
    signed_and_abs = (lambda x: x, np.abs)
    rho, off = [], []  # [pair, signed/|score|, (exact, noising, mean) x (EAP, EAP-IG)]
    for clean, corrupt in PAIRS:
        pair = shipped_pair(model, clean, corrupt)
        exact, noising = C.exact_scores(pair), C.exact_noising_scores(pair)
        methods = (C.eap_scores(pair), C.eap_ig_scores(pair, 20))
        rho.append([[C.spearman(f(x), f(oracle)) for oracle in (exact, noising,
                                                               (exact + noising) / 2)
                     for x in methods] for f in signed_and_abs])
        masks = [C.circuit_masks(C.ranked(x), [5, 10, 20, 40, 80]) for x in methods]
        off.append([np.abs(1 - C.faithfulness(pair, m)).mean() for m in masks])
    rho, off = np.array(rho), np.array(off)
    assert len(rho) >= 20
    mean = rho.mean(axis=0)
    # against exact: both follow it, EAP-IG on every pair by |score|, EAP the closer
    assert mean[0, 0] >= 0.9 and mean[0, 1] >= 0.8 and mean[1, 1] >= 0.85
    assert rho[:, 1, 1].min() >= 0.75 and (rho[:, 1, 0] > rho[:, 1, 1]).mean() >= 0.9
    # against the noising and the mean oracle: EAP-IG ahead, on nearly every pair
    assert mean[0, 5] >= 0.9 and mean[1, 5] >= 0.93
    for k in (3, 5):
        assert (rho[:, :, k] > rho[:, :, k - 1]).mean() >= 0.9
    # and its circuits nearer the full model's behaviour
    assert off[:, 1].mean() < 0.85 * off[:, 0].mean()


# ------------------------------------------------------------------ QK attribution


def test_qk_terms_add_up_to_the_recorded_scores(tiny_params, tiny_config):
    rec = Record()
    forward(tiny_params, tiny_config, IDS, hooks=rec)
    for layer in range(tiny_config.n_layer):
        for head in range(tiny_config.n_head):
            for query in (0, 3, 5):
                r = qk_attribution(tiny_params, tiny_config, rec.values, layer, head, query)
                assert r.terms.shape[-1] == query + 1
                np.testing.assert_allclose(r.terms.sum(axis=(0, 1)),
                                           rec.values[f"layers.{layer}.scores"][head, query,
                                                                                :query + 1],
                                           atol=1e-10, rtol=0)


def test_a_query_parts_terms_are_its_share_of_the_query(tiny_params, tiny_config):
    """Summed over the key's parts, the position embedding's terms are the position's own
    query (through the frozen norm, no bias) against the recorded keys: a direct computation."""
    rec = Record()
    forward(tiny_params, tiny_config, IDS, hooks=rec)
    v, layer, head, query = rec.values, 1, 1, 4
    r = qk_attribution(tiny_params, tiny_config, v, layer, head, query)
    wq = C.head_weights(tiny_params, tiny_config, layer)[0][head]
    pos = tiny_params["embed.W_pos"][query]
    g = tiny_params[f"layers.{layer}.ln1.w"]
    q_pos = (pos - pos.mean()) / v[f"layers.{layer}.ln1.std"][query] * g @ wq
    keys = v[f"layers.{layer}.k"][head, :query + 1]
    want = keys @ q_pos / np.sqrt(len(q_pos))
    np.testing.assert_allclose(r.terms[r.sources.index("position")].sum(axis=0), want,
                               atol=1e-12, rtol=0)
    assert r.sources[:2] == ["token", "position"] and r.sources[-2:] == ["biases", "norm bias"]
    assert "L0H1" in r.sources and "L1H0" not in r.sources


@shipped
def test_qk_terms_add_up_on_the_shipped_model():
    model = load_model(SHIPPED)
    ids = model.tokenizer.encode(PAIRS[0][0])
    rec = Record()
    forward(model.params, model.config, np.array(ids), hooks=rec)
    for layer in range(model.config.n_layer):
        for head in range(model.config.n_head):
            r = qk_attribution(model.params, model.config, rec.values, layer, head, len(ids) - 1)
            np.testing.assert_allclose(r.terms.sum(axis=(0, 1)), r.scores, atol=1e-5, rtol=0)


# ------------------------------------------------------------------ the commands (tiny weights)

TEXT = "Lily wanted to play with her"
CORRUPT = "Tom wanted to eat with her"  # as many tokens as TEXT
TOKENS = ("--target", " toys", "--vs", " mom")


def ok_json(result):
    assert result.code == 0, result.err
    import json

    return json.loads(result.out)


def test_circuit_json_ranks_every_edge_and_ends_the_curve_at_0_and_1(cli, tiny):
    doc = ok_json(cli("circuit", TEXT, CORRUPT, *TOKENS, "--method", "exact", "--json"))
    cfg = tiny.model.config
    e = count_edges(cfg.n_layer, cfg.n_head)
    assert doc["shape"] == [e] and len(doc["edges"]) == e
    scores = [edge["score"] for edge in doc["edges"]]
    assert scores == doc["data"] and np.all(np.diff(np.abs(scores)) <= 0)
    assert doc["edges"][0]["edge"] == f"{doc['edges'][0]['sender']} -> " \
                                      f"{doc['edges'][0]['receiver']}"
    f = doc["faithfulness"]
    assert doc["sizes"] == list(range(e + 1))  # a small graph: every N
    assert abs(f[0]) < 1e-6 and abs(f[-1] - 1) < 1e-6
    assert doc["target"]["token"] == " toys" and doc["vs"]["token"] == " mom"
    if doc["smallest"] is not None:
        assert f[doc["smallest"]] >= 0.8 and all(x < 0.8 for x in f[:doc["smallest"]])
        assert len(doc["random_f"]) == 100


def test_circuit_view_and_picture(cli, tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    r = cli("circuit", TEXT, CORRUPT, *TOKENS, "--method", "eap", "--top", "5",
            "--save", tmp_path / "c.svg")
    assert r.code == 0, r.err
    assert "edges, by |score|" in r.out and "faithfulness f(N)" in r.out
    assert "block 1" in r.out and "logits" in r.out
    assert max(len(line) for line in r.out.splitlines()) <= 80
    import re

    edges = re.findall(r"^ *\d+ (\S+) -> (\S+) ", r.out, flags=re.M)  # names whole, not cut
    g = C.build_graph(tiny.model.config)
    assert len(edges) == 5 and all(u in g.senders and v in g.receivers for u, v in edges)
    svg = (tmp_path / "c.svg").read_text()
    assert "<svg" in svg and "edge scores" in svg and "L0H1.q" in svg and "faithfulness" in svg
    # the faithfulness curve: a point at every N computed, its hover f the JSON's, to 3 places
    doc = ok_json(cli("circuit", TEXT, CORRUPT, *TOKENS, "--method", "eap", "--json"))
    points = re.findall(r'<circle class="point"[^>]*><title>edges kept (\d+): f = ([-\d.]+)'
                        r"</title>", svg)
    assert [int(n) for n, _ in points] == doc["sizes"]
    np.testing.assert_allclose([float(f) for _, f in points], doc["faithfulness"], atol=5e-4)
    assert "f = -0.000" not in svg and "f = 0.8" in svg
    rings = re.findall(r'<circle class="mark"[^>]*><title>([^<]*)</title>', svg)
    if doc["smallest"] is not None:
        assert rings[0].startswith("the smallest circuit with f &gt;= 0.8: edges kept "
                                   f"{doc['smallest']}, f = ")
        assert f"{np.median(doc['random_f']):.3f}" in rings[1]


def test_circuit_stability_over_pairs(cli, tmp_path):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text(f"# clean<tab>corrupt\n{CORRUPT}\t{TEXT}\n\nLily wanted to eat with "
                     f"her\t{CORRUPT}\n", encoding="utf-8")
    doc = ok_json(cli("circuit", TEXT, CORRUPT, *TOKENS, "--stability", "--pairs", pairs,
                      "--json"))
    st = doc["stability"]
    assert len(st["jaccard"]) == 3 and st["jaccard"][0] == 1.0
    assert all(0 <= j <= 1 for j in st["jaccard"])
    assert st["own_f"][0] == pytest.approx(st["transfer_f"][0])


def test_circuit_says_which_tokens_it_chose_when_the_guesses_coincide(cli, tiny):
    """The tiny random model's top guess is the same for both texts: the corrupt run's
    second guess stands in, and a note on stderr says so."""
    doc = ok_json(cli("circuit", TEXT, CORRUPT, "--method", "eap", "--json"))
    logits = [forward(tiny.model.params, tiny.model.config, np.array(doc[k]))[-1]
              for k in ("ids", "corrupt_ids")]
    assert doc["target"]["id"] == int(np.argmax(logits[0])) == int(np.argmax(logits[1]))
    assert doc["vs"]["id"] == int(np.argsort(logits[1])[-2])
    r = cli("circuit", TEXT, CORRUPT, "--method", "eap")
    assert r.code == 0 and "both runs' top guess is" in r.err and "next guess" in r.err


@pytest.mark.parametrize("args,needles", [
    (["circuit", TEXT, "Tom ran"], ["same number of tokens"]),
    (["circuit", TEXT, CORRUPT, "--method", "acdc"], ["acdc", "eap, eap-ig, exact"]),
    (["circuit", TEXT, CORRUPT, "--stability"], ["--pairs"]),
    (["circuit", TEXT, CORRUPT, "--target", " toys", "--vs", " toys"], ["same token"]),
    (["qk", TEXT, "--layer", "2"], ["layer 2", "0..1"]),
    (["qk", TEXT, "--query", "3", "--key", "4"], ["--key 4", "0..3"]),
])
def test_circuit_and_qk_errors(cli, args, needles):
    assert_one_error_line(cli(*args), 2, *needles)


def test_circuit_pairs_file_errors(cli, tmp_path):
    bad = tmp_path / "bad.tsv"
    bad.write_text("just one text\n", encoding="utf-8")
    assert_one_error_line(cli("circuit", TEXT, CORRUPT, "--stability", "--pairs", bad), 2,
                          "line 1", "CLEAN<tab>CORRUPT")
    assert_one_error_line(cli("circuit", TEXT, CORRUPT, "--stability", "--pairs",
                              tmp_path / "missing.tsv"), 2, "cannot read")


def test_qk_json_terms_add_up(cli):
    doc = ok_json(cli("qk", TEXT, "--layer", "1", "--head", "1", "--query", "4", "--json"))
    terms = np.array(doc["data"])
    assert terms.shape == (len(doc["sources"]), len(doc["sources"]), 5)
    np.testing.assert_allclose(terms.sum(axis=(0, 1)), doc["scores"], atol=1e-5)
    assert doc["key"] == int(np.argmax(doc["weights"]))
    r = cli("qk", TEXT, "--layer", "1", "--head", "1", "--key", "0")
    assert r.code == 0 and "summed by the key's part" in r.out and "norm bias" in r.out


# ------------------------------------------------------------------ attribute --faithfulness


def f_with_removed(params, config, ids, removed, position=-1):
    """f = logit[TARGET] - logit[VS] with the token embeddings of `removed` zeroed by a hook
    on the ordinary forward pass."""
    def zero(x):
        x = x.copy()
        x[list(removed)] = 0.0
        return x
    logits = forward(params, config, np.asarray(ids), hooks=Replace({"token_embeddings": zero}))
    return float(logits[position, TARGET] - logits[position, VS])


def test_erasure_curves_against_hooked_forward_passes(tiny_params, tiny_config):
    scores = np.array([0.3, -1.0, 2.0, 0.1, 0.5, 0.0])
    e = erasure(tiny_params, tiny_config, IDS, 5, TARGET, VS, scores, "given")
    f = f_with_removed(tiny_params, tiny_config, IDS, [])
    assert e.f == pytest.approx(f, abs=1e-10)
    for i in range(6):
        assert e.occlusion[i] == pytest.approx(f - f_with_removed(tiny_params, tiny_config,
                                                                  IDS, [i]), abs=1e-10)
    # the given ranking: 2, 4, 0, 3, 5, 1
    assert e.comprehensiveness[0, 2] == pytest.approx(
        f - f_with_removed(tiny_params, tiny_config, IDS, [2, 4]), abs=1e-10)
    assert e.sufficiency[0, 3] == pytest.approx(
        f - f_with_removed(tiny_params, tiny_config, IDS, [3, 5, 1]), abs=1e-10)
    np.testing.assert_allclose(e.comprehensiveness[:, 0], 0, atol=1e-12)
    np.testing.assert_allclose(e.sufficiency[:, -1], 0, atol=1e-12)
    np.testing.assert_allclose(e.comprehensiveness[:, -1], f - e.f_empty, atol=1e-10)
    np.testing.assert_allclose(e.sufficiency[:, 0], f - e.f_empty, atol=1e-10)


def test_erasure_ranks_only_tokens_up_to_the_position(tiny_params, tiny_config):
    e = erasure(tiny_params, tiny_config, IDS, 3, TARGET, VS, np.arange(6.0), "given")
    assert e.comprehensiveness.shape == (3, 5) and e.occlusion.shape == (4,)
    assert e.f == pytest.approx(f_with_removed(tiny_params, tiny_config, IDS, [], 3),
                                abs=1e-10)


@pytest.mark.slow
@shipped
def test_integrated_gradients_beat_random_orders_on_the_shipped_model():
    """On every text, erasing IG's top tokens lowers the score more than random orders do
    (comprehensiveness), and keeping them alone keeps more of it (sufficiency). Measured over
    8 texts: AOPC comprehensiveness 9.1 (occlusion 8.7, random 5.1), sufficiency 1.1 (0.7,
    4.8)."""
    model = load_model(SHIPPED)
    for text in (PAIRS[1][0], PAIRS[2][0], "Lucy put on her coat because it was"):
        ids = model.tokenizer.encode(text)
        p = len(ids) - 1
        target = int(np.argmax(forward(model.params, model.config, np.array(ids))[-1]))
        ig = integrated_gradients(model.params, model.config, ids, p, target, None, steps=16)
        comp, suff = erasure(model.params, model.config, ids, p, target, None, ig.scores,
                             ig.method).aopc
        assert comp[0] > comp[2] and suff[0] < suff[2], text


def test_attribute_faithfulness_json_and_view(cli):
    doc = ok_json(cli("attribute", TEXT, "--method", "grad-x-input", "--faithfulness",
                      "--json"))
    assert doc["rankings"] == ["grad-x-input", "occlusion", "random"]
    comp, suff = np.array(doc["data"]), np.array(doc["sufficiency"])
    assert comp.shape == suff.shape == (3, len(doc["ids"]) + 1)
    assert doc["aopc_comprehensiveness"] == pytest.approx(comp[:, 1:].mean(axis=1))
    r = cli("attribute", TEXT, "--faithfulness")
    assert r.code == 0 and "comp:ranked" in r.out and "AOPC" in r.out


def test_a_steered_pair_decomposes_the_steered_run(tiny_params, tiny_config):
    """With a steering vector added before block 1 in both runs, the edge-decomposed forward
    with every edge live is the steered forward pass, all edges kept and none give f = 1 and
    0, and a single-edge patch equals the same patch made with hooks on the steered run."""
    from tinygpt_cli.transformer.hooks import Chain, add_vector

    v = np.random.default_rng(4).normal(0, 0.5, tiny_config.n_embd)
    steer = add_vector("layers.1.resid_pre", v, 2.0)
    pair = C.prepare(tiny_params, tiny_config, IDS, OTHER, TARGET, VS, steer=steer)
    plain = C.prepare(tiny_params, tiny_config, IDS, OTHER, TARGET, VS)
    z = forward(pair.params, tiny_config, IDS, hooks=steer)[-1]
    assert pair.clean == pytest.approx(z[TARGET] - z[VS], abs=1e-10)
    assert abs(pair.clean - plain.clean) > 1e-3  # the vector changes the run
    e = len(pair.graph.edges)
    fixed = np.random.default_rng(0).normal(size=pair.clean_out.shape)
    got = C.edge_forward(pair.params, tiny_config, pair.graph, IDS, np.ones((1, e)), fixed,
                         [TARGET, VS], 5, steer=steer)[0]
    np.testing.assert_allclose(got, forward(pair.params, tiny_config, IDS, hooks=steer)[5,
                               [TARGET, VS]], atol=1e-12, rtol=0)
    f = C.faithfulness(pair, np.stack([np.ones(e), np.zeros(e)]))
    assert abs(f[0] - 1) < 1e-6 and abs(f[1]) < 1e-6
    k = edge(pair.graph, "L0H1", "logits")
    delta = (pair.clean_out - pair.corrupt_out)[pair.graph.senders.index("L0H1")]
    last = f"layers.{tiny_config.n_layer - 1}.resid_post"
    rec = Record()
    forward(pair.params, tiny_config, OTHER, hooks=Chain(steer, rec))
    eps = tiny_config.layer_norm_epsilon
    patched = forward(pair.params, tiny_config, OTHER, hooks=Chain(steer, Replace(
        {"ln_final.out": lambda _: ln(rec.values[last] + delta, pair.params, "ln_final", eps)})))
    want = patched[-1, TARGET] - patched[-1, VS] - pair.corrupt
    assert C.exact_scores(pair)[k] == pytest.approx(want, abs=1e-10)
    np.testing.assert_allclose(C.eap_ig_scores(pair, 1), C.eap_scores(pair), atol=1e-12)


def test_circuit_takes_the_steering_options(cli):
    from test_steer import STEER

    plain = ok_json(cli("circuit", TEXT, CORRUPT, *TOKENS, "--method", "eap", "--json"))
    doc = ok_json(cli("circuit", TEXT, CORRUPT, *TOKENS, "--method", "eap", *STEER,
                      "--steer-scale", "3", "--json"))
    assert doc["steered"]["site"] == "layers.1.resid_pre" and "steered" not in plain
    assert doc["data"] != plain["data"]
    assert abs(doc["faithfulness"][-1] - 1) < 1e-6
