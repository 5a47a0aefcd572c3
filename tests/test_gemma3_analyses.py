"""The analyses that read Gemma 3's block by its parts (circuit, qk, neurons), on small random
Gemma3ForCausalLM models that transformers makes: every number that claims to be exact
against transformers' own forward pass, run in float64 and changed by torch hooks (an edge
patched into one head's q, k or v projection, into an MLP's or the final norm's input), or
against its weights read by hand."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from tinygpt_cli.storage.locations import SHIPPED
from tinygpt_cli.transformer.folder import load_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CLEAN = np.array([5, 300, 17, 900, 42, 8, 1000, 77])
CORRUPT = np.array([5, 301, 17, 900, 43, 8, 1000, 77])  # same length, two tokens changed
TARGET, VS = 123, 77
KINDS = ["sliding_attention", "full_attention", "sliding_attention"]
THETAS = {"sliding_attention": 50.0, "full_attention": 3000.0}


def gemma3(folder, kv: int, seed: int):
    """transformers' model in float64 and tinygpt's of the float32 folder it saved: 3 blocks
    (sliding, full, sliding: a window of 3 keys, each kind its own rotary base), 4 heads of
    8 numbers in a stream of 24, `kv` key/value heads, every weight far from its start."""
    config = transformers.Gemma3TextConfig(
        vocab_size=4096, hidden_size=24, intermediate_size=40, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=kv, head_dim=8, query_pre_attn_scalar=11,
        sliding_window=3, layer_types=KINDS, max_position_embeddings=64,
        tie_word_embeddings=True, bos_token_id=2, eos_token_id=1, pad_token_id=0,
        rope_parameters={k: {"rope_type": "default", "rope_theta": v}
                         for k, v in THETAS.items()})
    model = transformers.Gemma3ForCausalLM(config).eval()
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.3 if "norm" in name else 0.15)
    model.save_pretrained(folder)
    shutil.copyfile(SHIPPED / "tokenizer.json", folder / "tokenizer.json")
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float64, attn_implementation="eager").eval()
    return hf.requires_grad_(False), load_model(folder)


@pytest.fixture(scope="module", params=[1, 4], ids=["kv1", "kv4"])
def pair(request, tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny products: more threads only wait for each other
    yield gemma3(tmp_path_factory.mktemp(f"kv{request.param}"), request.param, request.param)
    torch.set_num_threads(threads)


def _run(hf, ids, hooks=()):
    """logits [T, V] and hidden states of transformers' run, with forward (pre-)hooks."""
    handles = [(m.register_forward_pre_hook(f) if pre else m.register_forward_hook(f))
               for m, f, pre in hooks]
    try:
        with torch.no_grad():
            out = hf(torch.tensor([list(ids)]), output_hidden_states=True, output_attentions=True)
    finally:
        for h in handles:
            h.remove()
    return out


def _metric(out) -> float:
    return float(out.logits[0, -1, TARGET] - out.logits[0, -1, VS])


# ------------------------------------------------------------------ neurons


def test_neurons_are_transformers_down_proj_inputs_and_push_through_both_norms(pair):
    from tinygpt_cli.analysis.neurons import output_logits
    from tinygpt_cli.transformer.model import record

    hf, ours = pair
    seen = {}
    layer = hf.model.layers[1]
    hook = (layer.mlp.down_proj, lambda m, a: seen.__setitem__("post", a[0][0].numpy()), True)
    _run(hf, CLEAN, [hook])
    _, values = record(ours.params, ours.config, CLEAN)
    post = values["layers.1.mlp_post"]
    assert np.abs(post - seen["post"]).max() <= 1e-5 * np.abs(seen["post"]).max()
    w = hf.model.layers[1].mlp.down_proj.weight.numpy()  # [d, ff]
    g2 = 1 + layer.post_feedforward_layernorm.weight.numpy()
    gf = 1 + hf.model.norm.weight.numpy()
    e = hf.model.embed_tokens.weight.numpy()
    want = (w[:, [3, 17]].T * g2 * gf) @ e.T
    got = output_logits(ours.params, ours.config, 1, [3, 17])
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


# ------------------------------------------------------------------ qk


def test_qk_terms_sum_to_the_score_whose_softmax_is_transformers_pattern(pair):
    """Every head of a sliding and a full block, every query: the terms (through the frozen
    norms after each earlier branch, ln1, the (1 + w) q/k norms and the block's own rotary
    base) add up to the recorded score; their softmax over the keys the block sees is the
    pattern transformers' eager attention returns."""
    from tinygpt_cli.analysis.qk import qk_attribution
    from tinygpt_cli.transformer.model import record

    hf, ours = pair
    out = _run(hf, CLEAN)
    params = {k: v.astype(np.float64) for k, v in ours.params.items()}  # sums to 1e-9
    _, values = record(params, ours.config, CLEAN)
    for layer in (1, 2):
        window = ours.config.window(layer) or len(CLEAN)
        for head in range(4):
            for query in range(len(CLEAN)):
                r = qk_attribution(params, ours.config, values, layer, head, query)
                seen = slice(max(0, query - window + 1), query + 1)
                total = r.terms.sum(axis=(0, 1))[seen]
                assert np.abs(total - r.scores[seen]).max() <= 1e-9 * np.abs(total).max()
                p = np.exp(total - total.max())
                want = out.attentions[layer][0, head, query].numpy()
                assert np.abs(p / p.sum() - want[seen]).max() <= 1e-5
                assert np.abs(want[: seen.start]).max(initial=0) == 0  # outside the window


# ------------------------------------------------------------------ circuit


def _senders(hf, ids) -> dict[str, np.ndarray]:
    """Each sender's output in transformers' run on ids, as the stream receives it: the
    scaled embeddings; head h's z_h W_O[h] divided by the rms of its block's whole attention
    output, times the post-attention norm's (1 + w); the MLP after its post norm."""
    seen: dict[str, torch.Tensor] = {}
    hooks = []
    for i, layer in enumerate(hf.model.layers):
        hooks += [(layer.self_attn.o_proj, lambda m, a, i=i: seen.__setitem__(f"z{i}", a[0]),
                   True),
                  (layer.post_feedforward_layernorm,
                   lambda m, a, o, i=i: seen.__setitem__(f"mlp{i}", o), False)]
    out = _run(hf, ids, hooks)
    parts = {"embed": out.hidden_states[0][0].numpy()}
    for i, layer in enumerate(hf.model.layers):
        z = seen[f"z{i}"][0].numpy()  # [T, H d_k]
        w_o = layer.self_attn.o_proj.weight.numpy()  # [d, H d_k]
        whole = z @ w_o.T
        eps = layer.post_attention_layernorm.eps
        scale = (1 + layer.post_attention_layernorm.weight.numpy()) / np.sqrt(
            (whole ** 2).mean(-1, keepdims=True) + eps)
        for h in range(4):
            cols = slice(8 * h, 8 * h + 8)
            parts[f"L{i}H{h}"] = z[:, cols] @ w_o[:, cols].T * scale
        parts[f"L{i}.mlp"] = seen[f"mlp{i}"][0].numpy()
    return parts


def _by_hand(hf, senders, sender: str, receiver: str) -> float:
    """The corrupt run with only `receiver`'s input moved by the sender's clean - corrupt
    output: torch hooks recompute that receiver's projection (one head's rows of q_proj,
    k_proj or v_proj) from the moved stream through its own norm, or move the input of the
    MLP's norm or of the final norm."""
    delta = torch.tensor(senders[0][sender] - senders[1][sender])[None]
    stream = _run(hf, CORRUPT).hidden_states
    if receiver == "logits":
        hooks = [(hf.model.norm, lambda m, a: (a[0] + delta,), True)]
    elif receiver.endswith(".mlp"):
        layer = hf.model.layers[int(receiver[1:-4])]
        hooks = [(layer.pre_feedforward_layernorm, lambda m, a: (a[0] + delta,), True)]
    else:
        i, h, part = int(receiver[1]), int(receiver[3]), receiver[-1]
        layer = hf.model.layers[i]
        proj = getattr(layer.self_attn, f"{part}_proj")
        with torch.no_grad():
            moved = proj(layer.input_layernorm(stream[i] + delta))

        def fn(m, a, o):
            o = o.clone()
            o[..., 8 * h:8 * h + 8] = moved[..., 8 * h:8 * h + 8]
            return o
        hooks = [(proj, fn, False)]
    return _metric(_run(hf, CORRUPT, hooks))


EDGES = [("embed", "logits"), ("embed", "L0H1.q"), ("L0H0", "L1H1.k"), ("L0H1", "L2H0.v"),
         ("L0.mlp", "L1H2.q"), ("L0H1", "L0.mlp"), ("L1.mlp", "logits"), ("L2H3", "logits"),
         ("L1H0", "L2.mlp"), ("L0H2", "L2H3.k")]


@pytest.fixture(scope="module")
def scored(pair):
    from tinygpt_cli.analysis import circuit as C

    hf, ours = pair
    p = C.prepare(ours.params, ours.config, CLEAN, CORRUPT, TARGET, VS)
    return p, C.exact_scores(p)


def test_exact_edge_scores_are_transformers_runs_patched_by_torch_hooks(pair, scored):
    hf, ours = pair
    p, exact = scored
    corrupt = _metric(_run(hf, CORRUPT))
    assert p.corrupt == pytest.approx(corrupt, abs=1e-5)
    assert p.clean == pytest.approx(_metric(_run(hf, CLEAN)), abs=1e-5)
    names, tol = p.graph.edge_names(), 1e-5 * max(1.0, np.abs(exact).max())
    senders = _senders(hf, CLEAN), _senders(hf, CORRUPT)
    for sender, receiver in EDGES:
        if receiver[-1] in "kv" and ours.config.kv_heads < 4:
            continue  # a shared key is not one head's to move in transformers' model
        want = _by_hand(hf, senders, sender, receiver) - corrupt
        assert exact[names.index(f"{sender} -> {receiver}")] == pytest.approx(want, abs=tol)
    assert np.abs(exact).max() > 1e-2


def test_every_edge_live_is_the_forward_pass_and_eap_its_derivative(pair, scored):
    from tinygpt_cli.analysis import circuit as C
    from tinygpt_cli.transformer.model import forward

    hf, ours = pair
    p, _ = scored
    e = len(p.graph.edges)
    fixed = np.random.default_rng(0).normal(size=p.clean_out.shape)
    got = C.edge_forward(p.params, p.config, p.graph, CLEAN, np.ones((1, e)), fixed,
                         [TARGET, VS], 5)[0]
    want = forward(p.params, p.config, CLEAN)[5, [TARGET, VS]]
    np.testing.assert_allclose(got, want, atol=1e-12, rtol=0)
    assert got == pytest.approx(_run(hf, CLEAN).logits[0, 5, [TARGET, VS]].numpy(), abs=1e-4)
    eap, eps = C.eap_scores(p), 1e-5
    picks = [0, 7, e // 3, e // 2, e - 2, e - 1]
    live = np.ones((2 * len(picks), e))
    for row, k in enumerate(picks):
        live[2 * row, k], live[2 * row + 1, k] = 1 - eps, 1 + eps
    m = p.metric_of(p.corrupt_ids, live, p.clean_out)
    for row, k in enumerate(picks):
        fd = (m[2 * row] - m[2 * row + 1]) / (2 * eps)
        assert eap[k] == pytest.approx(fd, rel=1e-5, abs=1e-8), p.graph.edge_names()[k]
    f = C.faithfulness(p, np.stack([np.ones(e), np.zeros(e)]))
    assert abs(f[0] - 1) < 1e-9 and abs(f[1]) < 1e-9


# ------------------------------------------------------------------ the cards, review and map


@pytest.fixture(scope="module")
def seven(tmp_path_factory):
    """transformers' Gemma 3 of 7 blocks in the default 5:1 pattern (block 5 full, the others
    a window of 3 keys; each kind its own rotary base) and the folder it saved."""
    config = transformers.Gemma3TextConfig(
        vocab_size=4096, hidden_size=24, intermediate_size=40, num_hidden_layers=7,
        num_attention_heads=4, num_key_value_heads=1, head_dim=8, query_pre_attn_scalar=11,
        sliding_window=3, max_position_embeddings=64, tie_word_embeddings=True,
        bos_token_id=2, eos_token_id=1, pad_token_id=0,
        rope_parameters={k: {"rope_type": "default", "rope_theta": v}
                         for k, v in THETAS.items()})
    model = transformers.Gemma3ForCausalLM(config).eval()
    torch.manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.3 if "norm" in name else 0.15)
    folder = tmp_path_factory.mktemp("seven")
    model.save_pretrained(folder)
    shutil.copyfile(SHIPPED / "tokenizer.json", folder / "tokenizer.json")
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float64, attn_implementation="eager").eval()
    return hf.requires_grad_(False), folder


@pytest.fixture
def gcli(seven, capsys, monkeypatch):
    from cli_helpers import Runner, clean_env

    clean_env(monkeypatch)
    monkeypatch.setenv("TINYGPT_WEIGHTS", str(seven[1]))
    monkeypatch.setenv("COLUMNS", "120")
    return Runner(capsys, monkeypatch)


TEXT = "Lily wanted to play with her ball"


def _hf_ids(gcli) -> list[int]:
    import json

    return json.loads(gcli("encode", TEXT, "--json").out)["ids"]


def test_the_pos_card_shows_each_rotary_base_and_its_blocks(seven, gcli):
    import json

    hf, _ = seven
    r = gcli("pos", TEXT, "--json")
    kinds = hf.config.layer_types
    want = [{"base": THETAS[k], "blocks": [i for i, x in enumerate(kinds) if x == k]}
            for k in dict.fromkeys(kinds)]
    doc = json.loads(r.out)
    assert [{k: v for k, v in b.items() if k != "angles"} for b in doc["rotary_bases"]] == want
    assert want[1]["blocks"] == [5]  # every sixth block full
    # each base's angles t * inv_freq, transformers' own frequencies of that kind of block;
    # the document's data are the config's own base's (the full blocks')
    t = np.arange(len(doc["ids"]))[:, None]
    for b, kind in zip(doc["rotary_bases"], dict.fromkeys(kinds), strict=True):
        inv = getattr(hf.model.rotary_emb, f"{kind}_inv_freq").numpy()
        np.testing.assert_allclose(b["angles"], t * inv, rtol=1e-6)
        if b["base"] == doc["base"]:
            np.testing.assert_allclose(doc["data"], t * inv, rtol=1e-6)
    assert doc["base"] == THETAS["full_attention"]
    r = gcli("pos", TEXT)
    assert "two rotary bases: base 50 turns blocks 0-4, 6; base 3000 turns block 5" in r.out
    # the other base's angles, written out: position 3 turns pair 1 by 3 * 50^(-2/8)
    line = next(s for s in r.out.splitlines()[r.out.splitlines().index(
        next(s for s in r.out.splitlines() if s.startswith("rotary angles at base 50"))):]
        if s.lstrip().startswith("3 "))
    assert float(line.split()[3]) == pytest.approx(3 * 50 ** (-2 / 8), abs=5e-4)


def test_the_norm_card_has_the_four_norms_each_as_transformers_computes_it(seven, gcli):
    import json

    hf, _ = seven
    layer = hf.model.layers[2]
    names = {"ln1": layer.input_layernorm, "ln1_post": layer.post_attention_layernorm,
             "ln2": layer.pre_feedforward_layernorm, "ln2_post": layer.post_feedforward_layernorm}
    seen = {}
    hooks = [(m, lambda mod, a, o, n=n: seen.__setitem__(n, o[0].numpy()), False)
             for n, m in names.items()]
    _run(hf, _hf_ids(gcli), hooks)
    for name, want in seen.items():
        doc = json.loads(gcli("norm", TEXT, "--layer", "2", "--which", name, "--json").out)
        assert doc["norms"] == ["ln1", "ln1_post", "ln2", "ln2_post"] and doc["scale"] == "1 + w"
        got = np.asarray(doc["data"])
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), name
    out = gcli("norm", TEXT).out
    assert "four norms a block, each x / rms * (1 + w)" in out and "ln2_post after the MLP" in out
    r = gcli("norm", TEXT, "--which", "ln3")
    assert r.code == 2 and r.err == ("error: --which must be ln1, ln1_post, ln2 or ln2_post, "
                                     "not 'ln3'\n")


def test_the_attn_card_draws_the_sliding_window(seven, gcli):
    import json

    hf, _ = seven
    out = _run(hf, _hf_ids(gcli))
    doc = json.loads(gcli("attn", TEXT, "--layer", "0", "--head", "1", "--json").out)
    assert doc["window"] == hf.config.sliding_window == 3
    want = out.attentions[0][0, 1].numpy()
    assert np.abs(np.asarray(doc["data"]) - want).max() <= 1e-5
    assert "window" not in json.loads(gcli("attn", TEXT, "--layer", "5", "--json").out)
    rows = gcli("attn", TEXT, "--layer", "0", "--head", "1").out.splitlines()[2:2 + len(want)]
    for i, row in enumerate(rows):  # a dash before the window, a dot after the query
        cells = row.split()[2:]
        assert cells == ["-"] * max(0, i - 2) + [f"{x:.2f}" for x in want[i, max(0, i - 2):i + 1]] \
            + ["·"] * (len(want) - i - 1), row
    assert "-: keys before the query's window (this block sees the last 3 tokens)" in \
        gcli("attn", TEXT, "--layer", "0", "--all-heads").out.replace("\n", " ")


def test_the_mlp_card_shows_gate_up_and_their_product_as_transformers_has_them(seven, gcli):
    import json

    hf, _ = seven
    mlp = hf.model.layers[3].mlp
    seen = {}
    hooks = [(getattr(mlp, f"{p}_proj"), lambda m, a, o, p=p: seen.__setitem__(p, o[0].numpy()),
              False) for p in ("gate", "up")]
    _run(hf, _hf_ids(gcli), hooks)
    doc = json.loads(gcli("mlp", TEXT, "--layer", "3", "--json").out)
    for n in doc["top_neurons"]:
        k = n["neuron"]
        gate, up = seen["gate"][:, k], seen["up"][:, k]
        assert np.asarray(n["gate"]) == pytest.approx(gate, abs=1e-5)
        assert np.asarray(n["up"]) == pytest.approx(up, abs=1e-5)
        gelu = 0.5 * gate * (1 + np.tanh(np.sqrt(2 / np.pi) * (gate + 0.044715 * gate ** 3)))
        assert np.asarray(n["activations"]) == pytest.approx(gelu * up, abs=1e-5)
    first = doc["top_neurons"][0]["neuron"]
    out = gcli("mlp", TEXT, "--layer", "3").out
    assert "gate = x W_gate (layers.3.mlp_pre), up = x W_in (layers.3.mlp_up), out = GELU(gate) " \
        "* up" in out and f"n{first} gate" in out and f"n{first} out" in out


def test_review_and_map_show_the_sandwich_of_four_norms(gcli):
    import json

    stages = json.loads(gcli("map", TEXT, "--json").out)["stages"]
    ops = [s["op"] for s in stages]
    assert ops[3] == "ln1 (RMSNorm, 1 + w)" and ops[6] == "ln2 (RMSNorm, 1 + w)"
    assert ops[5].startswith("resid_mid = h + ln1_post(attn_out)")
    assert ops[8].startswith("resid_post = resid_mid + ln2_post(mlp_out)")
    assert "6 of 7 blocks see the last 3 keys" in ops[4]
    assert ops[1] == "W_E[ids] * 4.89898"  # sqrt(24) in float32
    shown = gcli("map", TEXT).out
    assert "ln1_post(attn_out)" in shown and "ln2_post(mlp_out)" in shown
    review = gcli("review", TEXT)
    assert review.code == 0
    page = " ".join(review.out.replace("│", " ").split())  # the cards are framed
    for said in ("Four RMSNorms per block: before attention (ln1) and after it (ln1_post), before "
                 "the feed-forward layer (ln2) and after it (ln2_post)", "multiplies by 1 + w",
                 "base 50 in blocks 0-4, 6; base 3000 in block 5",
                 "Blocks 0-4, 6 see only the last 3 tokens (a sliding window). Block 5 sees "
                 "every token before it."):
        assert said in page, said
    cards = {c["number"]: c for c in json.loads(gcli("review", TEXT, "--json").out)["cards"]}
    assert cards[4]["formula"] == "x + RMSNorm(Sublayer(RMSNorm(x)))"
    assert cards[5]["formula"].endswith("M_ij = -inf when j > i or j <= i - w")


# ------------------------------------------------------------------ generation's cache


def test_greedy_generation_past_the_window_keeps_only_the_window_and_transformers_tokens(
        seven):
    """40 greedy tokens after a 5-token prompt (the window is 3 keys): transformers' own
    tokens; each sliding block's cache holds 2 w rows however long the text, the full
    block's one row a position."""
    from tinygpt_cli.transformer.generate import CachedContext, generate

    hf, folder = seven
    ours = load_model(folder)
    prompt = [5, 300, 17, 900, 42]
    with torch.no_grad():
        theirs = hf.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False,
                             pad_token_id=0, eos_token_id=None)[0, len(prompt):].tolist()
    steps = generate(ours.params, ours.config, prompt, 40, temperature=0.0,
                     rng=np.random.default_rng(0))
    assert [s.id for s in steps] == theirs
    long = list(range(100, 109))  # a prompt longer than the buffer's 2 w rows
    with torch.no_grad():
        want = hf.generate(torch.tensor([long]), max_new_tokens=12, do_sample=False,
                           pad_token_id=0, eos_token_id=None)[0, len(long):].tolist()
    assert [s.id for s in generate(ours.params, ours.config, long, 12, temperature=0.0,
                                   rng=np.random.default_rng(0))] == want
    c = ours.config
    row = 2 * c.kv_heads * c.d_k * 4  # a position's keys and values, float32
    held = []
    for n in (10, 40):
        context = CachedContext(ours.params, c, prompt)
        for t in theirs[:n]:
            context.append(t)
        cache = context.cache
        assert cache.length == len(prompt) + n
        for i in range(c.n_layer):
            w = c.window(i)
            assert cache.k[i].shape[-2] == (2 * w if w else c.n_positions), i
        held.append(cache.held_bytes())
        assert held[-1] == row * (6 * 2 * 3 + cache.length)  # 6 sliding blocks, 1 full
    assert held[1] - held[0] == row * 30  # the full block's rows alone grow


# ------------------------------------------------------------------ TransformerLens's names


def test_transformerlens_names_are_the_values_transformerlens_hooks_on_gemma(seven, gcli):
    """TransformerLens hooks a Gemma block's attention and MLP outputs after their norms
    (hook_attn_out, hook_mlp_out: what the block adds), and every RMSNorm's hook_scale is its
    rms: each name gives transformers' own value, in trace and in the notebook API."""
    import json

    import tinygpt_cli as tg

    hf, folder = seven
    layer = hf.model.layers[2]
    seen = {}
    hooks = [(m, lambda mod, a, o, n=n: seen.__setitem__(n, (a[0][0].numpy(), o[0].numpy())),
              False)
             for n, m in (("attn", layer.post_attention_layernorm),
                          ("mlp", layer.post_feedforward_layernorm),
                          ("ln1", layer.input_layernorm), ("final", hf.model.norm))]
    _run(hf, _hf_ids(gcli), hooks)

    def rms(x):
        return np.sqrt((x ** 2).mean(-1, keepdims=True) + hf.config.rms_norm_eps)

    want = {"blocks.2.hook_attn_out": seen["attn"][1], "blocks.2.hook_mlp_out": seen["mlp"][1],
            "blocks.2.ln1_post.hook_normalized": seen["attn"][1],
            "blocks.2.ln1_post.hook_scale": rms(seen["attn"][0]),
            "blocks.2.ln2_post.hook_scale": rms(seen["mlp"][0]),
            "blocks.2.ln1.hook_scale": rms(seen["ln1"][0]),
            "ln_final.hook_scale": rms(seen["final"][0])}
    model = tg.load(str(folder))
    _, cache = model.run_with_cache(TEXT, names_filter=lambda name: name in want)
    for name, value in want.items():
        got = np.asarray(json.loads(gcli("trace", TEXT, name, "--json").out)["data"])
        assert np.abs(got - value).max() <= 1e-5 * np.abs(value).max(), name
        assert np.abs(cache[name] - value).max() <= 1e-5 * np.abs(value).max(), name
    # tinygpt's own names keep the values before the norms
    attn_out = np.asarray(json.loads(gcli("trace", TEXT, "layers.2.attn_out", "--json").out)
                          ["data"])
    np.testing.assert_allclose(attn_out, seen["attn"][0], rtol=0, atol=1e-5)


def test_a_saelens_sae_of_hook_mlp_out_reads_gemmas_mlp_output_after_its_norm(seven, tmp_path):
    """SAELens names a Gemma SAE's site by TransformerLens's hook: hook_mlp_out is the MLP's
    output after its norm; an SAE tinygpt trained on mlp_out, before it, is not exported
    under that name."""
    import json

    from tinygpt_cli.analysis.dictionary import SAE
    from tinygpt_cli.errors import InputError
    from tinygpt_cli.jobs.dictionaries.saelens import load_saelens, saelens_files

    _, folder = seven
    ours = load_model(folder)
    d, m = ours.config.n_embd, 8
    sae_dir = tmp_path / "sae"
    sae_dir.mkdir()
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    save_file({"W_enc": rng.normal(size=(d, m)).astype(np.float32),
               "b_enc": np.zeros(m, np.float32),
               "W_dec": rng.normal(size=(m, d)).astype(np.float32),
               "b_dec": np.zeros(d, np.float32)}, str(sae_dir / "sae_weights.safetensors"))
    (sae_dir / "cfg.json").write_text(json.dumps({
        "architecture": "standard", "d_in": d, "d_sae": m, "dtype": "float32",
        "apply_b_dec_to_input": True, "normalize_activations": "none",
        "metadata": {"hook_name": "blocks.3.hook_mlp_out"}}))
    sae = load_saelens(sae_dir, ours.config, ours.weights_file)
    assert sae.site == "layers.3.ln2_post.out"
    mine = SAE(**{**sae.__dict__, "site": "layers.3.mlp_out", "architecture": "topk",
                  "k": 2})
    with pytest.raises(InputError, match="layers.3.mlp_out has no TransformerLens hook"):
        saelens_files(mine, ours.config, {}, "gemma")


def test_qk_refuses_a_key_before_a_sliding_blocks_window(gcli):
    """A key the window masks has the score -inf, which no sum of finite terms makes: qk
    says which keys the query sees rather than print a split of a score that is not there."""
    import json

    last = len(_hf_ids(gcli)) - 1  # 6: the window of 3 keys sees 4..6
    r = gcli("qk", TEXT, "--layer", "0", "--head", "1", "--key", "1")
    assert r.code == 2 and r.err == (f"error: --key 1 is before the window of block 0: query "
                                     f"position {last} sees keys {last - 2}..{last} alone "
                                     "(the last 3)\n")
    assert gcli("qk", TEXT, "--layer", "0", "--head", "1", "--key", str(last - 2)).code == 0
    doc = json.loads(gcli("qk", TEXT, "--layer", "5", "--head", "1", "--key", "1",
                          "--json").out)  # the full block sees every key
    assert doc["key"] == 1 and doc["scores"][1] is not None


def test_the_blocks_card_shows_what_each_branch_adds_after_its_norm(seven, gcli):
    """Card 7's per-block sizes are of what the block adds to the stream: on Gemma the
    outputs of the norms after attention and after the MLP, transformers' own."""
    import json

    hf, _ = seven
    seen = {}
    hooks = [(m, lambda mod, a, o, k=(i, n): seen.__setitem__(k, o[0].numpy()), False)
             for i, layer in enumerate(hf.model.layers)
             for n, m in (("attn", layer.post_attention_layernorm),
                          ("mlp", layer.post_feedforward_layernorm))]
    _run(hf, _hf_ids(gcli), hooks)
    doc = json.loads(gcli("blocks", TEXT, "--json").out)
    for i, stage in enumerate(doc["stages"][1:]):
        assert (stage["attn_added"], stage["mlp_added"]) == ("ln1_post.out", "ln2_post.out")
        for branch in ("attn", "mlp"):
            want = np.linalg.norm(seen[(i, branch)], axis=-1)
            np.testing.assert_allclose(stage[f"{branch}_norm"], want, rtol=1e-5)
    assert "‖ln1_post‖  ‖ln2_post‖" in gcli("blocks", TEXT).out


def test_trace_list_says_what_gemmas_block_adds_and_which_norms_it_has(gcli):
    """trace --list in the model's own words: the sums it states are the run's (resid_mid is
    resid_pre + ln1_post.out, not + attn_out), its norms RMSNorms, its scores windowed."""
    import json

    about = {e["path"]: e["about"]
             for e in json.loads(gcli("trace", TEXT, "--list", "--json").out)["entries"]}
    assert about["layers.2.resid_mid"].startswith("resid_pre + ln1_post.out")
    assert about["layers.2.resid_post"].startswith("resid_mid + ln2_post.out")
    assert about["layers.2.ln1.out"] == "RMSNorm before attention (card 4)"
    assert about["ln_final.out"] == "the final RMSNorm (card 8)"
    assert "before the query's window" in about["layers.2.scores"]

    def value(path):
        return np.asarray(json.loads(gcli("trace", TEXT, path, "--json").out)["data"])

    np.testing.assert_allclose(value("layers.2.resid_mid"),
                               value("layers.2.resid_pre") + value("layers.2.ln1_post.out"),
                               rtol=0, atol=1e-5)
    np.testing.assert_allclose(value("layers.2.resid_post"),
                               value("layers.2.resid_mid") + value("layers.2.ln2_post.out"),
                               rtol=0, atol=1e-5)


def test_the_final_norm_card_says_its_scale_and_offers_no_which(seven, gcli):
    """final-norm: transformers' final norm, and the note of its (1 + w), not the block's
    note of --which, an option final-norm does not take."""
    import json

    hf, _ = seven
    seen = {}
    _run(hf, _hf_ids(gcli), [(hf.model.norm, lambda m, a, o: seen.__setitem__("o", o[0]),
                              False)])
    got = np.asarray(json.loads(gcli("final-norm", TEXT, "--json").out)["data"])
    np.testing.assert_allclose(got, seen["o"].numpy(), rtol=0, atol=1e-5)
    out = " ".join(gcli("final-norm", TEXT).out.split())
    assert "the final norm multiplies by 1 + w with the file's w" in out
    assert "four norms a block" not in out


def test_review_draws_the_window_in_its_attention_preview(gcli):
    """The review page's card 5 marks a key before block 0's window with "-" as attn does
    (its weight is 0 because the window masks it, not because the head ignores it)."""
    page = [" ".join(line.replace("│", " ").split()) for line in gcli("review", TEXT).out
            .splitlines()]
    at = next(i for i, line in enumerate(page) if line.startswith("command tinygpt attn"))
    rows = page[at + 1:at + 8]  # window of 3: row i sees keys i - 2 .. i
    for i, row in enumerate(rows):
        cells = row.split()[1:]
        assert cells[:max(0, i - 2)] == ["-"] * max(0, i - 2), row
        assert all(c != "-" for c in cells[max(0, i - 2):i + 1]), row


def test_dla_head_rows_are_transformers_head_outputs_through_both_frozen_norms(seven, gcli):
    """A head's DLA row on Gemma: its share of o_proj, divided by the run's rms of the whole
    attention output and multiplied by the post-attention norm's 1 + w, then through the
    final norm's rms and 1 + w onto the target's row, from transformers' own tensors; the
    view and --json say both norms."""
    import json

    hf, _ = seven
    layer, h = hf.model.layers[4], 2
    seen = {}
    hooks = [(layer.self_attn.o_proj, lambda m, a: seen.__setitem__("z", a[0][0]), True),
             (layer.post_attention_layernorm,
              lambda m, a, o: seen.__setitem__("attn", a[0][0]), False),
             (hf.model.norm, lambda m, a, o: seen.__setitem__("final", a[0][0]), False)]
    _run(hf, _hf_ids(gcli), hooks)
    doc = json.loads(gcli("dla", TEXT, "--json").out)
    assert doc["frozen_norms"] == {"heads": ["ln1_post", "ln_final"],
                                   "mlp": ["ln2_post", "ln_final"]}
    eps, dk = hf.config.rms_norm_eps, hf.config.head_dim

    def rms(x):
        return torch.sqrt((x[-1] ** 2).mean() + eps)

    part = seen["z"][-1, h * dk:(h + 1) * dk] @ layer.self_attn.o_proj.weight[:, h * dk:
                                                                            (h + 1) * dk].T
    part = part / rms(seen["attn"]) * (1 + layer.post_attention_layernorm.weight)
    want = float(part / rms(seen["final"]) * (1 + hf.model.norm.weight)
                 @ hf.lm_head.weight[doc["target"]["id"]])
    got = doc["data"][doc["labels"].index(f"L4H{h}")]
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert "through ln1_post's and the final norm's real scales" in gcli("dla", TEXT).out


def test_an_sae_site_named_hook_mlp_out_on_gemma_says_which_value_it_is(seven):
    """TransformerLens's hook_mlp_out on Gemma is the output after the MLP's norm, which a
    Gemma Scope 2 or SAELens SAE reads and tinygpt's own training does not: the refusal says
    which value the name is and the site to train on instead."""
    from tinygpt_cli.analysis.dictionary import check_site
    from tinygpt_cli.errors import InputError

    config = load_model(seven[1]).config
    with pytest.raises(InputError) as e:
        check_site("blocks.5.hook_mlp_out", config)
    assert str(e.value) == ("blocks.5.hook_mlp_out (layers.5.ln2_post.out) is the MLP's output "
                            "after Gemma's norm (TransformerLens's hook_mlp_out): an SAE tinygpt "
                            "trains reads layers.5.mlp_out, before that norm, or the residual "
                            "stream")
    assert check_site("blocks.5.hook_mlp_out", config, heads=True) == "layers.5.ln2_post.out"
    assert check_site("layers.5.mlp_out", config) == "layers.5.mlp_out"


def test_info_shows_each_blocks_rotary_base_the_post_norms_and_the_embedding_scale(seven,
                                                                                    gcli):
    """info lists the knobs in which Gemma's block differs: the sliding blocks' own rotary
    base beside the full blocks' (transformers' per-kind frequencies), the norms after each
    branch, and the embedding scale transformers multiplies by."""
    import json

    hf, _ = seven
    cfg = json.loads(gcli("info", "--json").out)["config"]
    assert cfg["rotary_bases"] == [THETAS[k] for k in hf.config.layer_types]
    assert cfg["post_norms"] is True
    assert cfg["embed_scale"] == pytest.approx(float(hf.model.embed_tokens.embed_scale),
                                               rel=1e-7)
    shown = gcli("info").out
    assert "post_norms" in shown and "rotary_bases" in shown


def test_hook_rot_q_is_transformers_q_normed_and_turned_and_hook_q_is_refused(seven, gcli):
    """TransformerLens's hook_rot_q, _k are q and k as the scores read them: transformers'
    q_proj output, normed per head and turned by the sliding block's own base, what tinygpt's
    layers.L.q holds; its hook_q is the q before both, which tinygpt does not keep: refused
    in one line rather than answered with the turned one."""
    import json

    from transformers.models.gemma3.modeling_gemma3 import apply_rotary_pos_emb

    hf, _ = seven
    attn = hf.model.layers[1].self_attn  # a sliding block
    seen = {}
    _run(hf, _hf_ids(gcli), [(attn.q_proj, lambda m, a, o: seen.__setitem__("q", o[0]), False),
                             (attn.k_proj, lambda m, a, o: seen.__setitem__("k", o[0]), False)])
    t, dk = seen["q"].shape[0], hf.config.head_dim
    q = attn.q_norm(seen["q"].view(t, -1, dk)).transpose(0, 1)[None]  # [1, H, T, d_k]
    k = attn.k_norm(seen["k"].view(t, -1, dk)).transpose(0, 1)[None]
    cos, sin = hf.model.rotary_emb(q, torch.arange(t)[None], "sliding_attention")
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    for name, want in (("blocks.1.attn.hook_rot_q", q[0]), ("blocks.1.attn.hook_rot_k", k[0])):
        got = np.asarray(json.loads(gcli("trace", TEXT, name, "--json").out)["data"])
        np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=1e-5 * float(want.abs().max()))
    r = gcli("trace", TEXT, "blocks.1.attn.hook_q")
    assert r.code == 2 and r.err == (
        "error: blocks.1.attn.hook_q is TransformerLens's q before its q norm and the rotary "
        "turn, which tinygpt does not keep; hook_rot_q (tinygpt's layers.1.q) is q as the "
        "scores read it\n")
