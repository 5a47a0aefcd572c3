"""Attribution graphs through a cross-layer transcoder (each block's latents write into every
later block's MLP output, circuit-tracer's CLT) and on Gemma 3 (a norm after attention and one
after the MLP, each frozen at the run as the others are; Gemma Scope 2's transcoders predict
the MLP's output after its norm): every edge against torch autograd on a frozen replacement
model written here from the canonical parameters, the real run's patterns and norm scales, and
the dictionaries' raw arrays; every node the sum of its incoming edges; with the error nodes
the replacement gives the real logits."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_params

from tinygpt_cli.analysis import graph as G
from tinygpt_cli.analysis import sae as S
from tinygpt_cli.analysis.dictionary import CrossLayerTranscoder
from tinygpt_cli.jobs.train.loop import arch_config
from tinygpt_cli.transformer.config import Config
from tinygpt_cli.transformer.model import forward, record

SIZES = dict(n_embd=16, n_layer=3, n_head=4, n_inner=20, vocab_size=23, n_positions=8)
FAMILIES = {
    "gpt2": Config(**SIZES),
    "llama": Config(**{**SIZES, "n_layer": 2}, n_kv_head=2, model_type="llama", norm="rms",
                    positions="rotary", mlp="gated", act="silu", tied=False, qkv_bias=False,
                    out_bias=False, mlp_bias=False),
    "neox": Config(**{**SIZES, "n_layer": 2}, model_type="gpt_neox", parallel=True,
                   positions="rotary", rotary_dim=2, tied=False),
    # Gemma 3: one key/value head, q/k norms, a local window of 4 in blocks 0 and 1, sqrt(d)
    "gemma3": arch_config("gemma3", **SIZES),
}
IDS = [3, 17, 5, 5, 9, 2, 11]
M = 10


def raw_dictionaries(config: Config, cross: bool, seed: int = 0, skip: bool = False) -> dict:
    """Random JumpReLU dictionaries as plain arrays: enc [n, d, m], b_enc, threshold [n, m],
    dec[L] [m, n - L, d] (per-layer: [m, 1, d]), b_dec [n, d], and an affine skip [n, d, d]
    (or None)."""
    rng = np.random.default_rng(seed)
    n, d = config.n_layer, config.n_embd
    return {"enc": rng.normal(0, 0.7, (n, d, M)), "b_enc": rng.normal(0.2, 0.3, (n, M)),
            "threshold": np.abs(rng.normal(0.2, 0.2, (n, M))),
            "dec": [rng.normal(0, 0.4, (M, n - i if cross else 1, d)) for i in range(n)],
            "b_dec": rng.normal(0, 0.2, (n, d)),
            "skip": rng.normal(0, 0.3, (n, d, d)) if skip else None}


def as_tinygpt(raw: dict, site: str, cross: bool):
    """The same dictionaries as the graph takes them: a CrossLayerTranscoder, or a list of
    per-layer transcoders (sae.SAE, nothing subtracted from the input, as Gemma Scope 2's)."""
    n, d = raw["b_dec"].shape
    skip = raw["skip"]
    encoders = [S.SAE(raw["enc"][i], raw["b_enc"][i], raw["dec"][i][:, 0], raw["b_dec"][i],
                      f"layers.{i}.{site}", None, architecture="jumprelu",
                      threshold=raw["threshold"][i], b_in=np.zeros(d),
                      skip=None if skip is None or cross else skip[i]) for i in range(n)]
    if cross:
        return CrossLayerTranscoder(encoders, raw["dec"], raw["b_dec"],
                                    None if skip is None else list(skip), site)
    return encoders


def jumprelu(raw: dict, i: int, x: np.ndarray) -> np.ndarray:
    a = np.asarray(x, np.float64) @ raw["enc"][i] + raw["b_enc"][i]
    return np.where(a > raw["threshold"][i], np.maximum(a, 0), 0.0)


def torch_targets(params, config, values, raw, site, graph, z, err_scale, emb_scale):
    """The frozen replacement model in torch: block j's output at `site` is b_dec[j] plus
    every block i <= j's z_i dec[i][:, j - i] (per-layer: i = j only) plus, with a skip, the
    MLP's input (the frozen ln2 of this model's stream) times skip[j], plus err_scale times
    (the real value there minus the same from the real run's values); Gemma's norms after
    attention and after the MLP (unless the site is after it) frozen at the run's rms.
    Returns the graph's targets' values: its features' pre-activations, then its logits."""
    torch = pytest.importorskip("torch")

    P = {n: torch.tensor(np.asarray(a, np.float64)) for n, a in params.items()}  # noqa: N806
    H, dk, kv = config.n_head, config.d_k, config.kv_heads  # noqa: N806
    stat = ".rms" if config.norm == "rms" else ".std"
    T = len(graph.ids)  # noqa: N806

    def norm(name, h):
        s = torch.tensor(np.asarray(values[name + stat], np.float64))
        if config.norm == "rms":
            return h / s * P[name + ".w"]
        return (h - h.mean(-1, keepdim=True)) / s * P[name + ".w"] + P[name + ".b"]

    def attn(i, h):
        x = norm(f"layers.{i}.ln1", h)
        v = x @ P[f"layers.{i}.attn.W_QKV"][:, (H + kv) * dk:]
        if f"layers.{i}.attn.b_QKV" in P:
            v = v + P[f"layers.{i}.attn.b_QKV"][(H + kv) * dk:]
        v = v.reshape(T, kv, dk)
        pattern = torch.tensor(np.asarray(values[f"layers.{i}.weights"], np.float64))
        z_heads = [pattern[hd] @ v[:, hd // (H // kv)] for hd in range(H)]
        out = torch.cat(z_heads, dim=-1) @ P[f"layers.{i}.attn.W_O"]
        out = out + P[f"layers.{i}.attn.b_O"] if f"layers.{i}.attn.b_O" in P else out
        return norm(f"layers.{i}.ln1_post", out) if config.post_norms else out

    n = config.n_layer
    z_real = [torch.tensor(jumprelu(raw, i, values[f"layers.{i}.ln2.out"])) for i in range(n)]

    def written(zs, j):
        out = torch.tensor(raw["b_dec"][j])
        for i in range(j + 1):
            k = j - i
            if k < raw["dec"][i].shape[1]:
                out = out + zs[i] @ torch.tensor(raw["dec"][i][:, k])
        return out

    h = emb_scale[:, None] * torch.tensor(np.asarray(values["embeddings"], np.float64))
    reads = []
    for j in range(n):
        real = torch.tensor(np.asarray(values[f"layers.{j}.{site}"], np.float64))
        x_real = torch.tensor(np.asarray(values[f"layers.{j}.ln2.out"], np.float64))
        a = attn(j, h)
        if not config.parallel:
            h = h + a
        x = norm(f"layers.{j}.ln2", h)
        reads.append(x)
        y = written(z, j) + err_scale[j][:, None] * (real - written(z_real, j))
        if raw["skip"] is not None:
            s = torch.tensor(raw["skip"][j])
            y = y + x @ s - err_scale[j][:, None] * (x_real @ s)
        if config.post_norms and site == "mlp_out":
            y = norm(f"layers.{j}.ln2_post", y)
        h = h + (a + y if config.parallel else y)
    u = norm("ln_final", h)[-1]
    w_u = P.get("unembed.W_U", P["embed.W_E"])
    out = []
    for node in range(graph.n_features):
        i, p, f = int(graph.layer[node]), int(graph.pos[node]), int(graph.feature[node])
        out.append(reads[i][p] @ torch.tensor(raw["enc"][i][:, f]) + float(raw["b_enc"][i, f]))
    for tok in graph.tokens_of_logits:
        row = w_u[tok] if tok >= 0 else w_u[graph.target_token] - w_u[graph.vs]
        out.append(u @ row)
    return torch.stack(out)


CASES = [("gpt2", "mlp_out", True, False), ("llama", "mlp_out", True, False),
         ("neox", "mlp_out", True, False), ("gemma3", "ln2_post.out", True, False),
         ("gemma3", "ln2_post.out", False, False), ("gemma3", "mlp_out", False, False),
         ("gemma3", "mlp_out", True, False), ("gpt2", "mlp_out", False, True),
         ("neox", "mlp_out", True, True), ("gemma3", "ln2_post.out", True, True),
         ("gemma3", "mlp_out", False, True)]


@pytest.fixture(params=CASES, ids=["-".join(map(str, c[:3])) + ("-skip" if c[3] else "")
                                   for c in CASES])
def case(request):
    family, site, cross, skip = request.param
    config = FAMILIES[family]
    params = random_params(config, seed=3)
    raw = raw_dictionaries(config, cross, skip=skip)
    return config, params, raw, site, cross


def test_every_edge_is_torch_autograd_on_an_independent_frozen_replacement(case, monkeypatch):
    torch = pytest.importorskip("torch")

    config, params, raw, site, cross = case
    monkeypatch.setattr(G, "KEY_BLOCK", 3)  # the causal pattern's products in three blocks
    g = G.build(params, config, IDS, as_tinygpt(raw, site, cross), vs=4, n_logits=3)
    _, values = record(params, config, np.asarray(IDS))
    t, nl = len(IDS), config.n_layer
    z_np = [jumprelu(raw, i, values[f"layers.{i}.ln2.out"]) for i in range(nl)]
    z = torch.tensor(np.stack(z_np))
    ones_err, ones_emb = torch.ones(nl, t, dtype=torch.float64), torch.ones(t, dtype=torch.float64)

    def f(z_, e_, m_):
        return torch_targets(params, config, values, raw, site, g, z_, e_, m_)

    jz, je, jm = torch.autograd.functional.jacobian(f, (z, ones_err, ones_emb))
    nf = g.n_features
    assert nf > 0 and g.adjacency.shape == (nf + len(g.tokens_of_logits), len(g.kinds))
    assert sorted(set(g.layer[:nf].tolist())) == list(range(nl))  # features in every block
    want = np.zeros_like(g.adjacency)
    for node in range(nf):  # a feature source: its activation times the derivative
        i, p, j = int(g.layer[node]), int(g.pos[node]), int(g.feature[node])
        want[:, node] = jz[:, i, p, j].numpy() * z_np[i][p, j]
    want[:, nf:nf + nl * t] = je.reshape(len(want), nl * t).numpy()
    want[:, nf + nl * t:nf + nl * t + t] = jm.numpy()
    zero = f(torch.zeros_like(z), torch.zeros_like(ones_err), torch.zeros_like(ones_emb))
    want[:, nf + nl * t + t] = zero.numpy()
    np.testing.assert_allclose(g.adjacency, want, atol=1e-10, rtol=1e-8)
    values_now = f(z, ones_err, ones_emb).numpy()
    np.testing.assert_allclose(g.adjacency.sum(axis=1), values_now, atol=1e-10)
    np.testing.assert_allclose(values_now[:nf], g.activation[:nf], atol=1e-10)
    if cross:  # block 0's features reach the logits through the last block's output too
        direct = jz[nf:, 0].abs().sum().item()
        assert direct > 0


def test_with_error_nodes_the_replacement_gives_the_real_logits(case):
    config, params, raw, site, cross = case
    g = G.build(params, config, IDS, as_tinygpt(raw, site, cross), n_logits=4)
    real = forward(params, config, np.asarray(IDS))[-1]
    np.testing.assert_allclose(g.adjacency[g.n_features:].sum(axis=1),
                               real[g.tokens_of_logits], atol=1e-10)
    assert g.incoming_total == pytest.approx(g.target_value, abs=1e-10)
    g = G.prune(g, 0.8, 0.98)
    assert 0 <= g.explained <= g.explained_unpruned <= 1 + 1e-9


def test_a_cross_layer_feature_moved_in_the_real_model_moves_every_block_it_writes():
    """real_change: a block-0 feature set to 0 takes its decoder vectors out of every
    block's output, as a hand-made hook on each block's mlp_out does."""
    from tinygpt_cli.transformer.hooks import Replace

    config = FAMILIES["gpt2"]
    params = random_params(config, seed=3)
    raw = raw_dictionaries(config, True)
    g = G.build(params, config, IDS, as_tinygpt(raw, "mlp_out", True), n_logits=2)
    node = int(np.flatnonzero(g.layer[:g.n_features] == 0)[-1])
    p, f, a = int(g.pos[node]), int(g.feature[node]), float(g.activation[node])

    def minus(k):
        def fn(v):
            v = v.copy()
            v[p] -= a * raw["dec"][0][f, k]
            return v
        return fn

    hooks = Replace({f"layers.{k}.mlp_out": minus(k) for k in range(config.n_layer)}, who="t")
    moved = forward(params, config, np.asarray(IDS), hooks=hooks)[-1]
    want = moved[g.target_token] - g.target_value
    got = G.real_change(params, config, IDS, as_tinygpt(raw, "mlp_out", True), g, {node: 0.0})
    assert got == pytest.approx(float(want), abs=1e-9)
    assert abs(got) > 1e-6


@pytest.mark.parametrize("site", ["ln2_post.out", "mlp_out"])
def test_graph_qk_on_gemma_3_splits_each_score_into_terms_that_sum_to_it(site):
    """--qk on Gemma 3: the stream's parts (earlier blocks' attention through the norm after
    it, their MLPs' features, errors and b_dec as the block adds them: through the norm after
    the MLP when the transcoder predicts mlp_out) add up to the recorded stream; each side's
    terms, through the frozen q/k norms and the block's own rotary base, to the recorded q
    and k; both splits of a score to the recorded score. Blocks 0 and 1 are sliding, block 2
    full: another base."""
    from tinygpt_cli.analysis import graph_qk as Q
    from tinygpt_cli.transformer.model import head_qkv, qk_norm_rms

    config = FAMILIES["gemma3"]
    params = random_params(config, seed=3)
    tcs = as_tinygpt(raw_dictionaries(config, cross=False), site, cross=False)
    g = G.build(params, config, IDS, tcs, vs=4, n_logits=3)
    _, values = record(params, config, np.asarray(IDS))
    for layer in range(config.n_layer):
        for position in (2, 6):
            _, vecs = Q.stream_parts(params, config, g, values, tcs, layer, position, None)
            np.testing.assert_allclose(vecs.sum(axis=0),
                                       values[f"layers.{layer}.resid_pre"][position], atol=1e-9)
        wq, wk, _, bq, bk, _ = head_qkv(params, config, layer)
        rms = qk_norm_rms(params, config, values, layer)
        norm_q, norm_k = Q.head_norms(params, config, rms, layer, 3, 6, 2)
        _, qv = Q.stream_parts(params, config, g, values, tcs, layer, 6, None)
        _, kvecs = Q.stream_parts(params, config, g, values, tcs, layer, 2, None)
        q = Q.side(config, params, values, qv, layer, 6, wq[3], bq[3], norm_q)
        k = Q.side(config, params, values, kvecs, layer, 2, wk[0], bk[0], norm_k)
        np.testing.assert_allclose(q.sum(axis=0), values[f"layers.{layer}.heads.3.q"][6],
                                   atol=1e-9)
        np.testing.assert_allclose(k.sum(axis=0), values[f"layers.{layer}.heads.3.k"][2],
                                   atol=1e-9)
    rows, cols = np.nonzero(g.adjacency)
    found = Q.edge_qk(params, config, g, tcs, rows=rows, cols=cols)
    assert {e.layer for e in found} >= {1, 2}
    for e in found:
        want = values[f"layers.{e.layer}.heads.{e.head}.scores"][e.query, e.key]
        assert e.query_terms.sum() == pytest.approx(want, abs=1e-9)
        assert e.key_terms.sum() == pytest.approx(want, abs=1e-9)
