"""Attribution graphs: every edge weight against torch autograd on an independent
implementation of the frozen replacement model (written here, from the canonical parameters
and the real run's patterns and norm scales), on GPT-2-, Llama- and NeoX-shaped random models
with random transcoders; every node the sum of its incoming edges; the replacement with its
error nodes reproducing the real logits; pruning's invariants; and the command's document."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_params

from tinygpt_cli.analysis import graph as G
from tinygpt_cli.analysis import sae as S
from tinygpt_cli.config import Config
from tinygpt_cli.model import forward, record

FAMILIES = {
    "gpt2": Config(n_embd=12, n_layer=3, n_head=2, n_inner=20, vocab_size=23, n_positions=8),
    "llama": Config(n_embd=16, n_layer=2, n_head=4, n_kv_head=2, n_inner=20, vocab_size=23,
                    n_positions=8, model_type="llama", norm="rms", positions="rotary",
                    mlp="gated", act="silu", tied=False, qkv_bias=False, out_bias=False,
                    mlp_bias=False),
    "neox": Config(n_embd=12, n_layer=2, n_head=2, n_inner=20, vocab_size=23, n_positions=8,
                   model_type="gpt_neox", parallel=True, positions="rotary", rotary_dim=4,
                   tied=False),
}
IDS = [3, 17, 5, 5, 9, 2, 11]


def random_transcoders(config: Config, m: int = 10, k: int = 3, seed: int = 0) -> list[S.SAE]:
    rng = np.random.default_rng(seed)
    d, out = config.n_embd, []
    for i in range(config.n_layer):
        w_dec = rng.normal(size=(m, d))
        w_dec /= np.linalg.norm(w_dec, axis=1, keepdims=True)
        out.append(S.SAE(rng.normal(size=(d, m)), rng.normal(0.5, 0.3, m), w_dec,
                         rng.normal(0, 0.3, d), f"layers.{i}.mlp_out", k,
                         b_in=rng.normal(0, 0.3, d)))
    return out


def torch_targets(params, config, values, tcs, graph, z, err_scale, emb_scale):
    """The frozen replacement model in torch: each block's MLP output is z W_dec + b_dec +
    err_scale * (the real output minus the transcoder's); returns the graph's target values
    (its features' pre-activations, then its logits) as one vector."""
    import torch

    P = {n: torch.tensor(np.asarray(a, np.float64)) for n, a in params.items()}  # noqa: N806
    H, dk, kv = config.n_head, config.d_k, config.kv_heads  # noqa: N806
    stat = ".rms" if config.norm == "rms" else ".std"

    def norm(name, h):
        s = torch.tensor(values[name + stat])
        if config.norm == "rms":
            return h / s * P[name + ".w"]
        return (h - h.mean(-1, keepdim=True)) / s * P[name + ".w"] + P[name + ".b"]

    def attn(i, h):
        x = norm(f"layers.{i}.ln1", h)
        w = P[f"layers.{i}.attn.W_QKV"][:, (H + kv) * dk:]
        v = x @ w
        if f"layers.{i}.attn.b_QKV" in P:
            v = v + P[f"layers.{i}.attn.b_QKV"][(H + kv) * dk:]
        v = v.reshape(len(IDS), kv, dk)
        pattern = torch.tensor(values[f"layers.{i}.weights"])
        z_heads = [pattern[hd] @ v[:, hd // (H // kv)] for hd in range(H)]
        out = torch.cat(z_heads, dim=-1) @ P[f"layers.{i}.attn.W_O"]
        return out + P[f"layers.{i}.attn.b_O"] if f"layers.{i}.attn.b_O" in P else out

    h = emb_scale[:, None] * torch.tensor(values["embeddings"])
    reads = []
    for i in range(config.n_layer):
        tc = tcs[i]
        real = torch.tensor(values[f"layers.{i}.mlp_out"])
        z_real = torch.tensor(S.encode(tc, values[f"layers.{i}.ln2.out"]))
        w_dec, b_dec = torch.tensor(tc.W_dec), torch.tensor(tc.b_dec)
        mlp = z[i] @ w_dec + b_dec + err_scale[i][:, None] * (real - (z_real @ w_dec + b_dec))
        a = attn(i, h)
        if config.parallel:
            reads.append(norm(f"layers.{i}.ln2", h))
            h = h + a + mlp
        else:
            h = h + a
            reads.append(norm(f"layers.{i}.ln2", h))
            h = h + mlp
    u = norm("ln_final", h)[-1]
    w_u = P.get("unembed.W_U", P["embed.W_E"])
    out = []
    for n in range(graph.n_features):
        i, p, j = int(graph.layer[n]), int(graph.pos[n]), int(graph.feature[n])
        tc = tcs[i]
        out.append((reads[i][p] - torch.tensor(tc.b_in)) @ torch.tensor(tc.W_enc[:, j])
                   + float(tc.b_enc[j]))
    for t in graph.tokens_of_logits:
        row = w_u[t] if t >= 0 else w_u[graph.target_token] - w_u[graph.vs]
        out.append(u @ row)
    return torch.stack(out)


@pytest.fixture(params=list(FAMILIES))
def case(request):
    config = FAMILIES[request.param]
    params = random_params(config, seed=3)
    tcs = random_transcoders(config)
    return config, params, tcs


def test_every_edge_is_torch_autograd_on_an_independent_frozen_replacement(case):
    import torch

    config, params, tcs = case
    g = G.build(params, config, IDS, tcs, vs=4, n_logits=3)
    _, values = record(params, config, np.asarray(IDS))
    z_np = [S.encode(tc, values[f"layers.{i}.ln2.out"]) for i, tc in enumerate(tcs)]
    t, nl = len(IDS), config.n_layer
    z = torch.tensor(np.stack(z_np))
    ones_err, ones_emb = torch.ones(nl, t, dtype=torch.float64), torch.ones(t, dtype=torch.float64)

    def f(z_, e_, m_):
        return torch_targets(params, config, values, tcs, g, z_, e_, m_)

    jz, je, jm = torch.autograd.functional.jacobian(f, (z, ones_err, ones_emb))
    nf = g.n_features
    assert nf > 0 and g.adjacency.shape == (nf + len(g.tokens_of_logits), len(g.kinds))
    want = np.zeros_like(g.adjacency)
    for n in range(nf):  # a feature source: its activation times the derivative
        i, p, j = int(g.layer[n]), int(g.pos[n]), int(g.feature[n])
        want[:, n] = jz[:, i, p, j].numpy() * z_np[i][p, j]
    want[:, nf:nf + nl * t] = je.reshape(len(want), nl * t).numpy()
    want[:, nf + nl * t:nf + nl * t + t] = jm.numpy()
    zero = f(torch.zeros_like(z), torch.zeros_like(ones_err), torch.zeros_like(ones_emb))
    want[:, nf + nl * t + t] = zero.numpy()
    np.testing.assert_allclose(g.adjacency, want, atol=1e-10, rtol=1e-8)
    # an edge into a feature only from an earlier block's features: the direct effect
    assert np.abs(want[:nf, :nf][g.layer[:nf, None] <= g.layer[None, :nf]]).max() == 0
    # every target is the sum of its incoming edges; each feature's is its activation
    values_now = f(z, ones_err, ones_emb).numpy()
    np.testing.assert_allclose(g.adjacency.sum(axis=1), values_now, atol=1e-10)
    np.testing.assert_allclose(values_now[:nf], g.activation[:nf], atol=1e-10)


def test_with_error_nodes_the_replacement_reproduces_the_real_logits(case):
    config, params, tcs = case
    g = G.build(params, config, IDS, tcs, n_logits=4)
    real = forward(params, config, np.asarray(IDS))[-1]
    logit_rows = g.adjacency[g.n_features:]
    np.testing.assert_allclose(logit_rows.sum(axis=1), real[g.tokens_of_logits], atol=1e-10)
    assert g.target_value == pytest.approx(real.max(), abs=1e-12)
    assert g.incoming_total == pytest.approx(g.target_value, abs=1e-10)
    # and the frozen model run forward with every source as it was gives every logit
    _, values = record(params, config, np.asarray(IDS))
    fz = G.freeze(params, config, values)
    outs = [values[f"layers.{i}.mlp_out"] for i in range(config.n_layer)]
    _, u = G.frozen_forward(fz, values["embeddings"], outs)
    w_u = params.get("unembed.W_U", params["embed.W_E"])
    np.testing.assert_allclose(u @ w_u.T, forward(params, config, np.asarray(IDS)),
                               atol=1e-10)


def test_pruning_keeps_the_target_and_explains_less_than_the_whole():
    config = FAMILIES["gpt2"]
    g = G.build(random_params(config, seed=3), config, IDS, random_transcoders(config))
    full = G.prune(g, 1.0, 1.0)
    nf = g.n_features
    # every feature with any influence kept; the last block's features before the last
    # position reach nothing that reads the target's position
    assert (full.node_mask[:nf] == (full.influence[:nf] > 0)).all()
    assert not full.node_mask[:nf][(g.layer[:nf] == 2) & (g.pos[:nf] < 6)].any()
    # the whole graph's influence on the target reaches its leaves entirely
    leaves = np.array([k in ("embedding", "bias", "error") for k in g.kinds])
    assert full.influence[leaves].sum() == pytest.approx(1.0, abs=1e-9)
    assert full.explained == pytest.approx(full.explained_unpruned, abs=1e-9)
    g2 = G.prune(G.build(random_params(config, seed=3), config, IDS,
                         random_transcoders(config)), 0.5, 0.9)
    assert g2.node_mask[g2.target]
    assert g2.node_mask[: g2.n_features].sum() < g2.n_features
    assert 0 < g2.explained < g2.explained_unpruned <= 1
