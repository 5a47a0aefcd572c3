"""Attribution graphs: every edge weight against torch autograd on an independent
implementation of the frozen replacement model (written here, from the canonical parameters
and the real run's patterns and norm scales), on GPT-2-, Llama-, NeoX- and Qwen3-shaped random
models with random transcoders; every node the sum of its incoming edges; the replacement with its
error nodes reproducing the real logits; pruning's invariants; and the command's document."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from cli_helpers import assert_one_error_line
from conftest import random_params

from tinygpt_cli.analysis import graph as G
from tinygpt_cli.analysis import sae as S
from tinygpt_cli.render.text import show_token
from tinygpt_cli.transformer.config import Config
from tinygpt_cli.transformer.model import forward, record

FAMILIES = {
    "gpt2": Config(n_embd=12, n_layer=3, n_head=2, n_inner=20, vocab_size=23, n_positions=8),
    "llama": Config(n_embd=16, n_layer=2, n_head=4, n_kv_head=2, n_inner=20, vocab_size=23,
                    n_positions=8, model_type="llama", norm="rms", positions="rotary",
                    mlp="gated", act="silu", tied=False, qkv_bias=False, out_bias=False,
                    mlp_bias=False),
    "neox": Config(n_embd=12, n_layer=2, n_head=2, n_inner=20, vocab_size=23, n_positions=8,
                   model_type="gpt_neox", parallel=True, positions="rotary", rotary_dim=4,
                   tied=False),
    # Qwen3: each head's q and k RMS-normed, heads of 6 numbers though d / H is 4
    "qwen3": Config(n_embd=16, n_layer=2, n_head=4, n_kv_head=2, head_dim=6, n_inner=20,
                    vocab_size=23, n_positions=8, model_type="qwen3", norm="rms",
                    positions="rotary", mlp="gated", act="silu", tied=False, qk_norm=True,
                    qkv_bias=False, out_bias=False, mlp_bias=False),
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
    torch = pytest.importorskip("torch")

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


def test_every_edge_is_torch_autograd_on_an_independent_frozen_replacement(case, monkeypatch):
    torch = pytest.importorskip("torch")

    config, params, tcs = case
    monkeypatch.setattr(G, "KEY_BLOCK", 3)  # the causal pattern's products in three blocks
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



def test_a_feature_cap_visits_by_influence_and_computes_the_same_rows(case):
    """max_features below the active features: the logits' rows first, then the features of
    most influence on the target; each visited row is the uncapped graph's row, every logit
    still the sum of its edges; with the cap at the features of any influence, the pruned
    graph is the uncapped one."""
    config, params, tcs = case
    full = G.build(params, config, IDS, tcs, vs=4, n_logits=3)
    nf = full.n_features
    a = np.abs(full.adjacency[full.row(full.target), :nf])
    g = G.build(params, config, IDS, tcs, vs=4, n_logits=3, max_features=5, batch=2)
    assert g.visited == 5 and len(g.targets) == 5 + len(full.tokens_of_logits)
    first = set(np.argsort(-a, kind="stable")[:2].tolist())  # the target's strongest inputs
    assert set(g.targets[:2].tolist()) == first
    for r, node in enumerate(g.targets):
        np.testing.assert_allclose(g.adjacency[r], full.adjacency[full.row(node)], atol=1e-12)
    assert g.incoming_total == pytest.approx(g.target_value, abs=1e-10)
    G.prune(full, 0.8, 0.98)
    capped = G.prune(g, 0.8, 0.98)
    assert capped.explained_unpruned <= full.explained_unpruned + 1e-12  # fewer paths
    reach = int((full.influence[:nf] > 0).sum())
    assert reach < nf  # the last block's earlier features reach nothing
    same = G.prune(G.build(params, config, IDS, tcs, vs=4, n_logits=3, max_features=reach,
                           batch=4), 0.8, 0.98)
    assert same.visited == reach
    np.testing.assert_array_equal(same.node_mask, full.node_mask)
    np.testing.assert_allclose(same.influence, full.influence, atol=1e-12)
    assert same.explained == pytest.approx(full.explained, abs=1e-12)
    kept = {(int(same.targets[r]), c) for r, c in zip(*np.nonzero(same.edge_mask), strict=True)}
    assert kept == {(int(full.targets[r]), c) for r, c in zip(*np.nonzero(full.edge_mask),
                                                               strict=True)}


# ------------------------------------------------------------------ the commands


STORY = "Lily wanted to play with her ball. Tom was happy and they ran to the park.\n\n"


@pytest.fixture
def trained(cli, tmp_path):
    """Transcoders trained by the command on a tiny model and a two-part data folder."""
    data = tmp_path / "data"
    data.mkdir()
    for part in ("part-000.txt", "part-001.txt"):
        (data / part).write_text(STORY * 30, encoding="utf-8")
    folder = tmp_path / "tc"
    r = cli("transcoder", "train", "--data", data, "--transcoders", folder, "--latents", "24",
            "--k", "4", "--steps", "40", "--batch", "64", "--windows", "6", "--json")
    assert r.code == 0, r.err
    return folder, data, r.json()


def test_transcoder_train_writes_one_checked_file_per_block(trained, tiny):
    from safetensors import safe_open

    from tinygpt_cli.jobs.dictionaries import transcoders as TF

    folder, _, doc = trained
    n = tiny.model.config.n_layer
    assert [t["layer"] for t in doc["trained"]] == list(range(n))
    assert sorted(p.name for p in folder.iterdir()) == [f"layers.{i}.safetensors"
                                                        for i in range(n)]
    with safe_open(str(folder / "layers.0.safetensors"), framework="numpy") as f:
        meta = f.metadata()
        assert sorted(f.keys()) == ["W_dec", "W_enc", "b_dec", "b_enc", "b_in"]
    assert (meta["kind"], meta["layer"], meta["k"], meta["reads"]) == (
        "transcoder", "0", "4", "layers.0.ln2.out")
    tcs = TF.load_transcoders(folder, tiny.model.config, tiny.model.weights_file)
    assert [tc.n_latents for tc in tcs] == [24] * n


def test_transcoder_eval_loss_recovered_against_an_independent_replacement(cli, trained,
                                                                          tiny):
    """The replaced loss recomputed here: each MLP's output by hand from its transcoder's
    tensors (TopK of ReLU, decoder), on the eval's own windows."""
    from safetensors.numpy import load_file

    from tinygpt_cli.jobs.corpus import data_windows
    from tinygpt_cli.transformer import ops

    folder, data, _ = trained
    r = cli("transcoder", "eval", "--transcoders", folder, "--data", data / "part-001.txt",
            "--windows", "3", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    m, cfg = tiny.model, tiny.model.config
    files = [load_file(folder / f"layers.{i}.safetensors") for i in range(cfg.n_layer)]
    x, y = data_windows([data / "part-001.txt"], m.tokenizer, cfg.n_positions, 3)

    def by_hand(path, v, seen={}):  # noqa: B006 - the run's ln2.out, kept per block
        if path.endswith("ln2.out"):
            seen[path] = v
            return v
        if path.endswith("mlp_out"):
            t = files[int(path.split(".")[1])]
            a = np.maximum((seen[path.replace("mlp_out", "ln2.out")] - t["b_in"]) @ t["W_enc"]
                           + t["b_enc"], 0)
            kth = -np.sort(-a, axis=-1)[..., 3:4]
            return (np.where(a >= kth, a, 0) @ t["W_dec"] + t["b_dec"]).astype(v.dtype)
        return v

    def loss(hooks=None):
        logp = ops.log_softmax(forward(m.params, cfg, x, hooks=hooks).astype(np.float64))
        return float(-np.take_along_axis(logp, y[..., None], axis=-1).mean())

    assert doc["loss_replaced"] == pytest.approx(loss(by_hand), rel=1e-5)
    assert doc["loss_clean"] == pytest.approx(loss(), rel=1e-6)
    want = (doc["loss_mean_ablated"] - doc["loss_replaced"]) / (
        doc["loss_mean_ablated"] - doc["loss_clean"])
    assert doc["loss_recovered"] == pytest.approx(want, rel=1e-9)
    assert 0 < doc["l0"] <= 4 and doc["dead"] == sum(e["dead"] for e in doc["layers"])
    assert set(doc) >= {"l0", "variance_explained", "loss_recovered", "dead"}


def test_graph_json_sums_to_the_real_logit(cli, trained, tiny):
    folder, _, _ = trained
    text = "Lily wanted to play with her"
    r = cli("graph", text, "--transcoders", folder, "--json")
    assert r.code == 0, r.err
    doc = r.json()
    ids = doc["ids"]
    real = forward(tiny.model.params, tiny.model.config, np.asarray(ids))[-1]
    tl = doc["target_logit"]
    assert tl["id"] == int(real.argmax())
    assert tl["value"] == pytest.approx(float(real.max()), abs=1e-5)
    assert tl["incoming_total"] == pytest.approx(tl["value"], abs=1e-4)
    kinds = {n["kind"] for n in doc["nodes"]}
    assert kinds <= {"feature", "error", "embedding", "bias", "logit"} and "logit" in kinds
    names = {n["id"] for n in doc["nodes"]}
    assert doc["edges"] and all(e["source"] in names and e["target"] in names
                                for e in doc["edges"])
    assert [n["is_target"] for n in doc["nodes"] if n["kind"] == "logit"].count(True) == 1
    assert 0 <= doc["explained"] <= doc["explained_unpruned"] <= 1
    assert doc["tokens"] == [tiny.model.tokenizer.token_str(i) for i in ids]
    vs = cli("graph", text, "--transcoders", folder, "--target", "#5", "--vs", "#7", "--json")
    t = vs.json()["target_logit"]
    assert t["value"] == pytest.approx(float(real[5] - real[7]), abs=1e-5)
    assert t["incoming_total"] == pytest.approx(t["value"], abs=1e-4)
    cut = cli("graph", text, "--transcoders", folder, "--position", "2", "--json").json()
    assert cut["ids"] == ids[:3] and cut["position"] == 2
    assert doc["counts"]["visited_features"] == doc["counts"]["active_features"]
    capped = cli("graph", text, "--transcoders", folder, "--max-features", "3", "--json").json()
    assert capped["counts"]["visited_features"] == 3 and capped["options"]["max_features"] == 3
    assert capped["target_logit"]["incoming_total"] == pytest.approx(tl["value"], abs=1e-4)
    view = cli("graph", text, "--transcoders", folder, "--max-features", "3").out
    assert "(3 of most influence visited: their inputs computed)" in view
    # every top logit is listed with its value and chance, though only the target's edges
    # carry influence and survive the pruning
    top = np.argsort(-real, kind="stable")[:3]
    p = np.exp(real - real.max()) / np.exp(real - real.max()).sum()
    three = cli("graph", text, "--transcoders", folder, "--logits", "3", "--json").json()
    logits = [n for n in three["nodes"] if n["kind"] == "logit"]
    assert [n["token"] for n in logits] == [tiny.model.tokenizer.token_str(int(i)) for i in top]
    for n, i in zip(logits, top, strict=True):
        assert n["value"] == pytest.approx(float(real[i]), abs=1e-5)
        assert n["probability"] == pytest.approx(float(p[i]), abs=1e-6)
    shown = cli("graph", text, "--transcoders", folder, "--logits", "3").out
    assert "top logits " + ", ".join(
        f"{show_token(n['token'])} {n['value']:.2f} (p {n['probability']:.2f})" for n in logits
    ) in " ".join(shown.split())
    # the kept features counted are the ones listed, when the edges cut leave some bare too
    for extra in ((), ("--edge-threshold", "0")):
        d = cli("graph", text, "--transcoders", folder, *extra, "--json").json()
        assert d["counts"]["kept_features"] == sum(n["kind"] == "feature" for n in d["nodes"])
    assert d["counts"]["kept_features"] < doc["counts"]["kept_features"]


def test_transcoder_files_are_checked(cli, trained, tmp_path):
    from safetensors.numpy import load_file, save_file

    folder, _, _ = trained
    assert_one_error_line(cli("graph", "Lily", "--transcoders", tmp_path / "none"), 2,
                          "no transcoders at", "tinygpt transcoder train")
    other = tmp_path / "other"
    other.mkdir()
    for f in folder.iterdir():
        other.joinpath(f.name).write_bytes(f.read_bytes())
    path = other / "layers.1.safetensors"
    t = load_file(path)
    save_file(t, path, metadata={"kind": "transcoder", "layer": "1", "k": "4",
                                 "weights_sha256": "0" * 64})
    assert_one_error_line(cli("transcoder", "eval", "--transcoders", other), 2,
                          "made for other weights")
    t["W_enc"][0, 0] = np.nan  # a planted broken tensor
    save_file(t, path, metadata={"kind": "transcoder", "layer": "1", "k": "4"})
    assert_one_error_line(cli("graph", "Lily", "--transcoders", other), 1,
                          "W_enc is not all finite")
    t["W_enc"][0, 0] = 0.5
    save_file({k: v for k, v in t.items() if k != "b_in"}, path,
              metadata={"kind": "transcoder", "layer": "1", "k": "4"})
    assert_one_error_line(cli("graph", "Lily", "--transcoders", other), 1,
                          "not a transcoder file: it has no b_in tensor")


def test_a_missing_data_path_is_the_users_error_naming_the_option(cli, trained, tmp_path):
    """graph (and sae feature, transcoder eval, lens --evaluate: the one given_or) said
    'No such file or directory' and exited 1 for a --data that is not there."""
    folder, _, _ = trained
    missing = tmp_path / "no-such-stories"
    assert_one_error_line(cli("graph", "Lily", "--transcoders", folder, "--data", missing), 2,
                          f"--data {missing}: does not exist")
    assert_one_error_line(cli("transcoder", "eval", "--transcoders", folder, "--data",
                              missing), 2, "--data", "does not exist")


# ------------------------------------------------------------------ the viewer, in Chromium



def test_the_viewer_in_chromium(cli, trained, browser, tmp_path):
    """Offline (nothing asked for but the file), a node per node of the JSON, hover shows a
    feature's label, top windows and edges, click pins a path that reaches the target, and
    a text that looks like markup stays text."""
    import re

    folder, data, _ = trained
    text = "Lily </script><b>wanted</b> to play with her"
    common = ("graph", text, "--transcoders", folder, "--data", data, "--windows", "4",
              "--group", "--qk")
    doc = cli(*common, "--json").json()
    page = tmp_path / "graph.html"
    r = cli(*common, "--save", page, "--quiet")
    assert (r.code, r.out, r.err) == (0, "", "")
    html = page.read_text(encoding="utf-8")
    assert not re.search(r"https?:|\bsrc=|\bhref=|@import|url\(", html, re.I)
    assert html.count("</script>") == 2  # the data's own "</script>" is escaped
    for width in (390, 1280):
        load = browser.open(page, width=width, height=900)
        assert load.errors == [] and load.failed == []
        assert load.requests == [page.resolve().as_uri()]
    got = browser.evaluate("""(() => {
        const q = s => Array.from(document.querySelectorAll(s));
        const nodes = q(".node").map(n => n.getAttribute("data-id"));
        const f = q(".node").find(n => /^\\d+_\\d+_\\d+$/.test(n.getAttribute("data-id")));
        f.dispatchEvent(new MouseEvent("mouseenter"));
        const side = document.getElementById("side").textContent;
        f.dispatchEvent(new MouseEvent("click", {bubbles: true}));
        return {nodes, id: f.getAttribute("data-id"), side, bold: q("b").length,
                supers: q("rect.super").length,
                path: q(".node.path").map(n => n.getAttribute("data-id")),
                pinned: document.getElementById("pinned").textContent,
                title: document.querySelector("h1").textContent};
    })()""")
    assert sorted(got["nodes"]) == sorted(n["id"] for n in doc["nodes"])
    assert got["supers"] == len(doc["supernodes"])
    node = next(n for n in doc["nodes"] if n["id"] == got["id"])
    assert node["label"] in got["side"] and "not an explanation" in got["side"]
    for ex in node["examples"]:
        assert ex["token"] in got["side"]
    assert "strongest inputs" in got["side"]
    target = next(n["id"] for n in doc["nodes"] if n.get("is_target"))
    assert got["id"] in got["path"] and target in got["path"]
    assert got["pinned"].startswith("pinned: feature")
    assert got["bold"] == sum(len(n.get("examples", [])) for n in [node])  # only the peaks
    # --qk: a node with an attention edge among its six strongest inputs shows its split
    ins = {}
    for e in doc["edges"]:
        ins.setdefault(e["target"], []).append(e)
    shown = next(e for es in ins.values()
                 for e in sorted(es, key=lambda e: -abs(e["weight"]))[:6] if "qk" in e)
    wanted = json.dumps(shown["target"])
    side = browser.evaluate("(() => { const n = Array.from(document.querySelectorAll('.node'))"
                            f".find(m => m.getAttribute('data-id') === {wanted});"
                            " n.dispatchEvent(new MouseEvent('mouseenter'));"
                            " return document.getElementById('side').textContent; })()")
    q = shown["qk"]
    assert (f"via head {q['head']} (attention {q['attention']:.3f}, score {q['score']:.3f})"
            in side)


def test_graph_qk_json(cli, trained, tiny):
    folder, _, _ = trained
    doc = cli("graph", "Lily wanted to play with her", "--transcoders", folder, "--qk",
              "--json").json()
    nodes = {n["id"]: n for n in doc["nodes"]}
    split = [e for e in doc["edges"] if "qk" in e]
    assert split and all(nodes[e["source"]]["position"] < nodes[e["target"]]["position"]
                         for e in split)
    assert not any("qk" in e for e in doc["edges"]
                   if nodes[e["source"]]["position"] >= nodes[e["target"]]["position"])
    _, values = record(tiny.model.params, tiny.model.config, np.asarray(doc["ids"]))
    for e in split:
        q = e["qk"]
        assert (q["key_position"], q["query_position"]) == (
            nodes[e["source"]]["position"], nodes[e["target"]]["position"])
        want = values[f"layers.{q['layer']}.heads.{q['head_index']}.scores"][
            q["query_position"], q["key_position"]]
        for side in ("query", "key"):
            total = sum(t["term"] for t in q[side + "_terms"]) + q[side + "_rest"]
            assert total == pytest.approx(float(want), abs=1e-4)
    out = cli("graph", "Lily wanted to play with her", "--transcoders", folder, "--qk",
              "-n", "2").out
    first = max(split, key=lambda e: abs(e["weight"]))
    assert f"attention edges of most weight (2 of {len(split)};" in out
    assert f"{first['source']} -> {first['target']}" in out and first["qk"]["head"] in out


def test_top_windows_and_labels_say_what_the_examples_share():
    from tinygpt_cli.analysis import transcoder as T

    ids = np.array([[1, 2, 3, 4], [5, 2, 3, 6], [7, 8, 9, 3]], np.uint16)  # 3 windows, T = 4
    idx = np.zeros((12, 2), np.int16)
    val = np.zeros((12, 2), np.float32)
    # latent 1 fires at (0, 2) 3.0, (1, 2) 2.0, (2, 3) 1.0 and weakly at (0, 1)
    for (w, p), v in {(0, 2): 3.0, (1, 2): 2.0, (2, 3): 1.0, (0, 1): 0.5}.items():
        idx[w * 4 + p, 1], val[w * 4 + p, 1] = 1, v
    codes = {"ids": ids, "idx": idx, "val": val}
    ex = T.top_windows(codes, 1, n=3, before=1, after=1)
    assert ex == [{"ids": [2, 3, 4], "peak": 1, "value": 3.0},
                  {"ids": [2, 3, 6], "peak": 1, "value": 2.0},
                  {"ids": [9, 3], "peak": 1, "value": 1.0}]
    name = {2: "a", 3: "b", 9: "c"}.get
    assert T.label_of(ex, name) == "on b after a"  # 3 of 3 on b, 2 of 3 after a
    assert T.label_of(ex[2:], name) == "on b after c"
    assert T.label_of([], name) == "no example in the searched text"
    assert T.top_windows(codes, 0) == []  # never fires


@pytest.mark.parametrize("seed", range(4))
def test_every_latents_top_windows_from_one_pass_are_each_latents_own(seed):
    """top_windows_of (one pass over the codes for every latent a graph labels) against a
    loop per latent and per window: peaks, ties (values drawn from a few levels, so windows
    and positions tie) and latents that never fire."""
    from tinygpt_cli.analysis import transcoder as T

    rng = np.random.default_rng(seed)
    w, t, k, latents = 7, 6, 3, 9
    ids = rng.integers(0, 50, (w, t)).astype(np.uint16)
    idx = np.stack([rng.choice(latents, k, replace=False) for _ in range(w * t)]).astype(np.int16)
    val = rng.choice([0.0, 0.5, 1.0, 2.0], (w * t, k)).astype(np.float32)
    codes = {"ids": ids, "idx": idx, "val": val}

    def naive(latent, n=3, before=8, after=2):
        peaks = []
        for win in range(w):
            best, at = 0.0, None
            for p in range(t):
                for s in range(k):
                    if idx[win * t + p, s] == latent and val[win * t + p, s] > best:
                        best, at = float(val[win * t + p, s]), p
            if at is not None:
                peaks.append((-best, win, at))
        out = []
        for neg, win, p in sorted(peaks)[:n]:
            lo = max(0, p - before)
            out.append({"ids": [int(x) for x in ids[win, lo:p + after + 1]], "peak": p - lo,
                        "value": -neg})
        return out

    got = T.top_windows_of(codes, [8, 0, 3, 3, 11])
    assert sorted(got) == [0, 3, 8, 11]
    for latent in got:
        assert got[latent] == naive(latent)
    assert got[11] == []


def test_the_graphs_predicted_change_is_the_linear_replacement_models(case):
    """Predicted: the torch replacement model of the first test, with each active feature
    recomputed from the stream (its active set frozen) except the intervened one."""
    torch = pytest.importorskip("torch")

    config, params, tcs = case
    g = G.build(params, config, IDS, tcs, n_logits=2)
    _, values = record(params, config, np.asarray(IDS))
    nf, t, nl = g.n_features, len(IDS), config.n_layer
    node = int(np.flatnonzero(g.layer[:nf] == 0)[0])  # a first-block feature: paths onward
    new = 2.5
    z = torch.tensor(np.stack([S.encode(tc, values[f"layers.{i}.ln2.out"])
                               for i, tc in enumerate(tcs)]))
    lay, pos, lat = (torch.tensor(g.layer[:nf]), torch.tensor(g.pos[:nf]),
                     torch.tensor(g.feature[:nf]))
    ones_err, ones_emb = torch.ones(nl, t, dtype=torch.float64), torch.ones(t, dtype=torch.float64)
    before = torch_targets(params, config, values, tcs, g, z, ones_err, ones_emb)
    for _ in range(nl + 1):  # each pass settles one more block
        z[lay[node], pos[node], lat[node]] = new
        out = torch_targets(params, config, values, tcs, g, z, ones_err, ones_emb)
        z[lay, pos, lat] = out[:nf]
    z[lay[node], pos[node], lat[node]] = new
    after = torch_targets(params, config, values, tcs, g, z, ones_err, ones_emb)
    row = g.row(g.target)
    assert G.predicted_change(g, {node: new}) == pytest.approx(
        float(after[row] - before[row]), abs=1e-9)
    assert G.predicted_change(g, {node: float(g.activation[node])}) == pytest.approx(0, abs=1e-12)


def test_the_real_change_of_a_last_block_feature_is_the_read_out_of_the_moved_stream(case):
    config, params, tcs = case
    g = G.build(params, config, IDS, tcs, n_logits=2)
    _, values = record(params, config, np.asarray(IDS))
    nf, last = g.n_features, config.n_layer - 1
    node = int(np.flatnonzero((g.layer[:nf] == last) & (g.pos[:nf] == len(IDS) - 1))[0])
    h = values[f"layers.{last}.resid_post"][-1] - g.activation[node] * tcs[last].W_dec[
        g.feature[node]]  # the feature's contribution taken out
    w, b = params["ln_final.w"], params.get("ln_final.b")
    if config.norm == "rms":
        u = h / np.sqrt((h * h).mean() + config.layer_norm_epsilon) * w
    else:
        c = h - h.mean()
        u = c / np.sqrt((c * c).mean() + config.layer_norm_epsilon) * w + b
    w_u = params.get("unembed.W_U", params["embed.W_E"])
    want = float(u @ w_u[g.target_token]) - g.target_value
    assert G.real_change(params, config, IDS, tcs, g, {node: 0.0}) == pytest.approx(want,
                                                                                   abs=1e-9)
    # the graph's prediction for it: its one edge into the target, taken away
    assert G.predicted_change(g, {node: 0.0}) == pytest.approx(
        -g.adjacency[g.row(g.target), node], abs=1e-12)


def test_graph_ablate_and_steer_print_both_changes(cli, trained, tiny):
    from tinygpt_cli.jobs.dictionaries import transcoders as TF

    folder, _, _ = trained
    text = "Lily wanted to play with her"
    doc = cli("graph", text, "--transcoders", folder, "--json").json()
    feat = next(n for n in doc["nodes"] if n["kind"] == "feature")
    r = cli("graph", text, "--transcoders", folder, "--ablate", feat["id"], "--json")
    iv = r.json()["intervention"]
    assert iv["features"] == [{"id": feat["id"], "from": pytest.approx(feat["activation"]),
                               "to": 0.0}]
    assert set(iv) == {"features", "predicted_change", "real_change"}
    view = cli("graph", text, "--transcoders", folder, "--set", f"{feat['id']}=1.5").out
    assert f"intervention {feat['id']}" in view and "in the real model" in view
    n_layer = tiny.model.config.n_layer
    for bad, says in (("9_9_99", f"there is no layer 9 (the layers are 0-{n_layer - 1})"),
                      ("0_24_0", "there is no feature 24 (the features are 0-23)"),
                      ("0_3_6", "there is no position 6 (the positions are 0-5)"),
                      ("0_3_-1", "there is no position -1")):
        assert_one_error_line(cli("graph", text, "--transcoders", folder, "--ablate", bad), 2,
                              f"feature {bad}: {says}")
    m = tiny.model  # a latent that exists but does not fire at position 0 of block 0
    tcs = TF.load_transcoders(folder, m.config, m.weights_file)
    g = G.build(m.params, m.config, m.tokenizer.encode(text), tcs)
    on = set(g.feature[(g.layer == 0) & (g.pos == 0) & (g.feature >= 0)].tolist())
    idle = f"0_{min(set(range(24)) - on)}_0"
    assert_one_error_line(cli("graph", text, "--transcoders", folder, "--ablate", idle), 2,
                          f"feature {idle} is not active in this text")
    assert_one_error_line(cli("graph", text, "--transcoders", folder, "--target", " her",
                              "--vs", " her"), 2, "the target and --vs are the same token")
    assert_one_error_line(cli("graph", text, "--transcoders", folder, "--set",
                              f"{feat['id']}=big"), 2, "--set takes FEATURE=VALUE")
    for huge in ("1e30", "1e38"):  # overflows later in the pass, or at once
        line = assert_one_error_line(cli("graph", text, "--transcoders", folder, "--set",
                                         f"{feat['id']}={huge}"), 2, "overflowed",
                                     f"the features' new values ({feat['id']}={float(huge):g})")
        assert "weights" not in line
    assert_one_error_line(cli("graph", text, "--transcoders", folder, "--ablate", "L1"), 2,
                          "LAYER_FEATURE_POSITION")


def test_supernodes_group_by_position_and_keep_the_explained_fraction_checkable():
    config = FAMILIES["gpt2"]
    g = G.prune(G.build(random_params(config, seed=3), config, IDS, random_transcoders(config)),
                0.9, 0.95)
    assert G.grouped_explained(g, []) == pytest.approx(g.explained, abs=1e-9)
    assert G.group(g, similarity=1.01) == []  # nothing is that similar
    everything = G.group(g, similarity=-1.0)  # each position's features one supernode
    nf = g.n_features
    kept = set(np.flatnonzero(g.node_mask[:nf] & (g.edge_mask[:, :nf].any(axis=0)
                                                  | g.edge_mask[:nf].any(axis=1))).tolist())
    assert set().union(*map(set, everything)) <= kept
    for members in everything:
        assert len({int(g.pos[n]) for n in members}) == 1
    by_pos = {}
    for n in kept:
        by_pos.setdefault(int(g.pos[n]), []).append(n)
    assert len(everything) == sum(len(v) > 1 for v in by_pos.values())
    assert 0 <= G.grouped_explained(g, everything) <= 1


def test_graph_group_json(cli, trained):
    folder, data, _ = trained
    doc = cli("graph", "Lily wanted to play with her", "--transcoders", folder, "--data", data,
              "--windows", "4", "--group", "--json").json()
    ids = {n["id"] for n in doc["nodes"]}
    for s in doc["supernodes"]:
        assert len(s["members"]) > 1 and set(s["members"]) <= ids
    gr = doc["grouped"]
    assert gr["ungrouped"] == doc["explained"]
    assert gr["within_tolerance"] == (abs(gr["explained"] - gr["ungrouped"]) <= gr["tolerance"])


def test_the_edge_threshold_is_circuit_tracers_cumulative_cut_in_chunks():
    rng = np.random.default_rng(0)
    scores = rng.random(5000) ** 3
    for share in (0.0, 0.5, 0.98, 1.0):
        srt = np.sort(scores)[::-1]
        cum = np.cumsum(srt) / srt.sum()
        want = srt[min(int(np.searchsorted(cum, share)), len(srt) - 1)]
        assert G.threshold_of(scores.copy(), share, chunk=7) == pytest.approx(want, rel=1e-12)
    # past 65,536 scores only those above a sampled bound are sorted: the same threshold,
    # heavy-tailed (a few scores most of the sum) or not, float32 like the adjacency's
    for scores in (rng.random(300_000).astype(np.float32),
                   (rng.pareto(1.2, 300_000) * rng.random(300_000) ** 4).astype(np.float32)):
        srt = np.sort(scores)[::-1]
        cum = np.cumsum(srt, dtype=np.float64)
        for share in (0.5, 0.9, 0.98, 0.999):
            want = srt[int(np.searchsorted(cum, share * float(scores.sum(dtype=np.float64))))]
            assert G.threshold_of(scores.copy(), share) == want


def test_a_steered_graph_sums_to_the_steered_logit(cli, trained, tiny):
    from tinygpt_cli.transformer.hooks import add_vector

    folder, _, _ = trained
    text = "Lily wanted to play with her"
    v = np.linspace(-1, 1, tiny.model.config.n_embd)
    np.save(folder.parent / "v.npy", v)
    doc = cli("graph", text, "--transcoders", folder, "--steer-vector", folder.parent / "v.npy",
              "--steer-layer", "1", "--steer-scale", "2", "--json").json()
    hook = add_vector("layers.1.resid_pre", v, 2.0)
    real = forward(tiny.model.params, tiny.model.config, np.asarray(doc["ids"]), hooks=hook)[-1]
    tl = doc["target_logit"]
    assert tl["value"] == pytest.approx(float(real[tl["id"]]), abs=1e-5)
    assert tl["incoming_total"] == pytest.approx(tl["value"], abs=1e-4)
    assert doc["steered"]


def test_graph_qk_splits_each_attention_edges_score_into_terms_that_sum_to_it(case):
    """Both splits (by the query's parts, by the key's) add up to the score the model's own
    forward pass recorded; the parts at a position add up to the recorded stream."""
    from tinygpt_cli.analysis import graph_qk as Q

    config, params, tcs = case
    g = G.build(params, config, IDS, tcs, vs=4, n_logits=3)
    _, values = record(params, config, np.asarray(IDS))
    rows, cols = np.nonzero(g.adjacency)
    found = Q.edge_qk(params, config, g, tcs, rows=rows, cols=cols)
    assert found
    heads = set()
    for e in found:
        t_node = int(g.targets[e.row])
        assert g.pos[e.col] == e.key < e.query == g.pos[t_node]
        assert g.layer[e.col] < e.layer <= min(g.layer[t_node], config.n_layer - 1)
        want = values[f"layers.{e.layer}.heads.{e.head}.scores"][e.query, e.key]
        assert e.query_terms.sum() == pytest.approx(want, abs=1e-9)
        assert e.key_terms.sum() == pytest.approx(want, abs=1e-9)
        assert len(e.query_parts) == len(e.query_terms) and len(e.key_parts) == len(e.key_terms)
        heads.add((e.layer, e.head))
    assert len(heads) > 1
    parts, vecs = Q.stream_parts(params, config, g, values, tcs, 1, 5, None)
    np.testing.assert_allclose(vecs.sum(axis=0), values["layers.1.resid_pre"][5], atol=1e-10)
    # each side's per-part vectors add up to the q and k the forward pass recorded
    from tinygpt_cli.transformer.model import head_qkv, qk_norm_rms

    wq, wk, _, bq, bk, _ = head_qkv(params, config, 1)
    rms = qk_norm_rms(params, config, values, 1) if config.qk_norm else None
    norm_q, norm_k = Q.head_norms(params, config, rms, 1, 1, 5, 2)
    q = Q.side(config, params, values, vecs, 1, 5, wq[1], bq[1], norm_q)
    np.testing.assert_allclose(q.sum(axis=0), values["layers.1.heads.1.q"][5], atol=1e-10)
    kv = 1 // (config.n_head // config.kv_heads)
    _, kvecs = Q.stream_parts(params, config, g, values, tcs, 1, 2, None)
    k = Q.side(config, params, values, kvecs, 1, 2, wk[kv], bk[kv], norm_k)
    np.testing.assert_allclose(k.sum(axis=0), values["layers.1.heads.1.k"][2], atol=1e-10)
    assert {g.kinds[p] for p in parts if isinstance(p, int)} == {"feature", "error",
                                                                "embedding"}


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_graph_past_the_float64_size_is_the_float64_graph_to_float32s_rounding(
        family, monkeypatch):
    # past ADJACENCY_F64_MB the graph runs at the model's precision: the adjacency and the
    # products with the (float32) patterns in float32. Three or four blocks, so that some
    # rows go through a second and a third attention layer: those products are the float32
    # ones, and each edge must still be the float64 graph's to float32's rounding
    config = dataclasses.replace(FAMILIES[family], n_layer=4 if family == "llama" else 3,
                                 n_positions=48)
    params = random_params(config, seed=5, dtype=np.float32)
    tcs = random_transcoders(config, seed=5)
    ids = [int(i) for i in np.random.default_rng(5).integers(0, config.vocab_size, 40)]
    wide = G.build(params, config, ids, tcs)
    seen = []
    keys_side = G._keys_side
    monkeypatch.setattr(G, "_keys_side", lambda blocks, *a, **k: (
        seen.append(blocks[0].dtype), keys_side(blocks, *a, **k))[1])
    monkeypatch.setattr(G, "ADJACENCY_F64_MB", 0)
    narrow = G.build(params, config, ids, tcs)
    assert wide.adjacency.dtype == np.float64 and narrow.adjacency.dtype == np.float32
    assert seen and set(seen) == {np.dtype(np.float32)}
    np.testing.assert_array_equal(narrow.targets, wide.targets)
    scale = np.abs(wide.adjacency).max(axis=1, keepdims=True)
    assert (np.abs(narrow.adjacency - wide.adjacency) <= 2e-6 * scale).all()
    assert narrow.incoming_total == pytest.approx(narrow.target_value, rel=1e-5)
    assert narrow.target_value == wide.target_value


def test_a_feature_id_is_checked_against_its_own_blocks_transcoder():
    # blocks may have transcoders of different widths: latent 12 exists in block 1's (14
    # latents), not in block 0's (10)
    from tinygpt_cli.errors import InputError

    config = FAMILIES["gpt2"]
    tcs = random_transcoders(config)
    tcs[1] = random_transcoders(config, m=14, seed=1)[1]
    g = G.build(random_params(config, seed=3), config, IDS, tcs)
    widths = [tc.n_latents for tc in tcs]
    with pytest.raises(InputError, match=r"there is no feature 12 \(the features are 0-9\)"):
        G.feature_node(g, "0_12_0", widths)
    on = np.flatnonzero((g.layer[:g.n_features] == 1) & (g.feature[:g.n_features] >= 10))
    assert len(on)  # some latent past block 0's width fires in block 1
    n = int(on[0])
    assert G.feature_node(g, f"1_{g.feature[n]}_{g.pos[n]}", widths) == n


def test_graph_reads_the_text_once_for_every_blocks_examples(cli, trained, monkeypatch,
                                                             tmp_path):
    """The features' examples need each block's codes of the text: every block read and
    encoded the text again, and `graph` printed "reading the text" once per block. Now once,
    however many blocks' codes are made (and not at all when they are cached)."""
    from contextlib import contextmanager

    from tinygpt_cli.cli import graph as graph_cli

    said = []

    @contextmanager
    def recorded(total, description):
        said.append(description)
        yield lambda n=1: None

    monkeypatch.setattr(graph_cli, "bar", lambda: recorded)
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "cache"))  # no block's codes kept yet
    folder, data, _ = trained
    argv = ("graph", "Lily wanted to play with her", "--transcoders", folder, "--data", data,
            "--windows", "4", "--json")
    r = cli(*argv)
    assert r.code == 0, r.err
    blocks = {n["layer"] for n in r.json()["nodes"] if n["kind"] == "feature"}
    assert len(blocks) >= 2 and said.count("latents of the data") == len(blocks)
    assert said.count("reading the text") == 1
    said.clear()
    assert cli(*argv).code == 0 and "reading the text" not in said  # the codes cached
