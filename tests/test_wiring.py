"""The block's wiring stated once (tinygpt_cli/transformer/wiring.py), held by every pass.

Every pass is checked, for every combination of the knobs the families use (norm kind,
positions, MLP kind, parallel, key/value groups, windows, q/k norms, tied head), against
things computed apart from it: the forward pass against a naive reference written here (loops
over heads, its own norms, turn and activations); the backward pass against finite
differences of the forward; the Decoder's steps against the forward's logits; DLA's residual
parts against the final stream; the graph's frozen pass against the real run and its
backward against the frozen forward's own differences (it is linear); circuit's edge pass
with every edge live against the logits; TracIn's norm sites against the recorded norms.

A planted wiring (Gemma's norms after attention and after the MLP, before each add, as new
steps of the description) is then computed by the passes written over the description
(forward, backward, the Decoder: against the reference with those norms), and refused by
name by every analysis written for the families' blocks (exit 2 on the command line, the
InputError or ValueError of their passes in Python): none answers as if the norm were not
there. An op no pass has is refused by every command, the model's own cards too.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import sys

import numpy as np
import pytest
from cli_helpers import TEXT
from conftest import random_params

from tinygpt_cli.errors import InputError
from tinygpt_cli.transformer import wiring
from tinygpt_cli.transformer.config import Config
from tinygpt_cli.transformer.model import KVCache, backward, decode_step, forward, record
from tinygpt_cli.transformer.trace import Trace
from tinygpt_cli.transformer.wiring import Step

IDS = np.array([3, 7, 1, 9, 4, 11, 2, 8])

# ------------------------------------------------------------------ the knobs


KNOBS = {  # knob -> (GPT-2's value, the other the families use)
    "norm": ("layer", "rms"), "positions": ("learned", "rotary"), "mlp": ("gelu", "gated"),
    "parallel": (False, True), "groups": (False, True), "windows": (False, True),
    "qk_norm": (False, True), "tied": (True, False),
    # Gemma 3's: norms after attention and after the MLP, the embedding scaled, a rotary
    # base per block
    "post_norms": (False, True), "embed_scale": (False, True), "bases": (False, True),
}


def knob_config(norm, positions, mlp, parallel, groups, windows, qk_norm, tied,
                post_norms=False, embed_scale=False, bases=False) -> Config:
    """A small config with these knobs (the families' other settings follow them: a gated
    MLP has SiLU and no biases, a rotary model turns half of each head)."""
    gated = mlp == "gated"
    more = dict(post_norms=post_norms, embed_scale=4.75 if embed_scale else 0.0,
                rotary_bases=(10000.0, 37.0) if bases else ())
    return Config(n_embd=24, n_layer=2, n_head=4, n_inner=20, vocab_size=19, n_positions=12,
                  norm=norm, positions=positions, mlp=mlp,
                  act="silu" if gated else "gelu" if parallel else "gelu_new",
                  parallel=parallel, n_kv_head=2 if groups else 0,
                  rotary_dim=4 if positions == "rotary" else 0,
                  windows=(3, 0) if windows else (), qk_norm=qk_norm, tied=tied,
                  attn_scale=0.0, mlp_bias=not gated, qkv_bias=norm == "layer",
                  out_bias=norm == "layer", **more)


def _possible(c) -> bool:
    k = dict(zip(KNOBS, c, strict=True))
    return not (k["parallel"] and k["post_norms"])  # Gemma's norms: a sequential block


def _combos():
    quick = [tuple(v[0] for v in KNOBS.values())]  # GPT-2, then each knob flipped alone
    quick += [tuple(v[k == j] for k, v in enumerate(KNOBS.values())) for j in range(len(KNOBS))]
    quick.append(tuple(v[1] for v in KNOBS.values()))  # every knob the other way
    quick.append(tuple(v[k != 3] for k, v in enumerate(KNOBS.values())))  # ... but parallel
    gemma = ("rms", "rotary", "gated", False, True, True, True, True, True, True, True)
    quick = [c for c in quick + [gemma] if _possible(c)]
    out = [pytest.param(c, id="-".join(map(str, c))) for c in quick]
    out += [pytest.param(c, id="-".join(map(str, c)), marks=pytest.mark.slow)
            for c in itertools.product(*KNOBS.values()) if c not in quick and _possible(c)]
    return out


COMBOS = _combos()


# ------------------------------------------------------------------ an independent reference


def ref_norm(kind, x, w, b, eps):
    if kind == "rms":
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w
    c = x - x.mean(-1, keepdims=True)
    return c / np.sqrt((c * c).mean(-1, keepdims=True) + eps) * w + b


def ref_act(name, x):
    if name == "silu":
        return x / (1 + np.exp(-x))
    if name == "gelu":
        return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def ref_turn(x, rot, base):
    """Each position t's pairs (x_i, x_{i + rot/2}) turned by t base^(-2i/rot), one by one."""
    out = x.copy()
    for t in range(x.shape[0]):
        for i in range(rot // 2):
            a = t * base ** (-2 * i / rot)
            u, v = x[t, i], x[t, i + rot // 2]
            out[t, i], out[t, i + rot // 2] = u * math.cos(a) - v * math.sin(a), \
                u * math.sin(a) + v * math.cos(a)
    return out


def ref_forward(p, c: Config, ids, post_norms: bool = False):
    """The logits by the definitions, head by head and query by query."""
    eps, dk, hkv = c.layer_norm_epsilon, c.d_k, c.kv_heads
    post_norms = post_norms or c.post_norms
    t = len(ids)
    h = p["embed.W_E"][ids] * (c.embed_scale or 1) \
        + (p["embed.W_pos"][:t] if c.positions == "learned" else 0)

    def nrm(name, x):
        return ref_norm(c.norm, x, p[name + ".w"], p.get(name + ".b"), eps)

    for i in range(c.n_layer):
        L = f"layers.{i}."
        x = nrm(L + "ln1", h)
        qkv = x @ p[L + "attn.W_QKV"] + p.get(L + "attn.b_QKV", 0)
        q = qkv[:, :c.n_head * dk]
        k = qkv[:, c.n_head * dk:(c.n_head + hkv) * dk]
        v = qkv[:, (c.n_head + hkv) * dk:]
        z = np.zeros((t, c.n_head * dk))
        for hd in range(c.n_head):
            g = hd // (c.n_head // hkv)
            qh, kh, vh = q[:, hd * dk:(hd + 1) * dk], k[:, g * dk:(g + 1) * dk], \
                v[:, g * dk:(g + 1) * dk]
            if c.qk_norm:
                qh = ref_norm("rms", qh, p[L + "attn.q_norm.w"], None, eps)
                kh = ref_norm("rms", kh, p[L + "attn.k_norm.w"], None, eps)
            if c.rotary:
                base = c.rotary_bases[i] if c.rotary_bases else c.rotary_base
                qh, kh = ref_turn(qh, c.rotary, base), ref_turn(kh, c.rotary, base)
            for a in range(t):
                seen = [j for j in range(a + 1) if not c.window(i) or a - j < c.window(i)]
                s = np.array([qh[a] @ kh[j] for j in seen]) * c.scale
                w = np.exp(s - s.max())
                z[a, hd * dk:(hd + 1) * dk] = (w / w.sum()) @ vh[seen]
        attn = z @ p[L + "attn.W_O"] + p.get(L + "attn.b_O", 0)
        if post_norms:
            attn = nrm(L + "ln1_post", attn)
        mid = h if c.parallel else h + attn
        x2 = nrm(L + "ln2", mid)
        if c.mlp == "gated":
            post = ref_act(c.act, x2 @ p[L + "mlp.W_gate"]) * (x2 @ p[L + "mlp.W_in"])
        else:
            post = ref_act(c.act, x2 @ p[L + "mlp.W_in"] + p[L + "mlp.b_in"])
        m = post @ p[L + "mlp.W_out"] + p.get(L + "mlp.b_out", 0)
        if post_norms:
            m = nrm(L + "ln2_post", m)
        h = h + attn + m if c.parallel else mid + m
    u = nrm("ln_final", h)
    return u @ p["unembed.W_U" if "unembed.W_U" in p else "embed.W_E"].T


# ------------------------------------------------------------------ the planted wiring


def post_norm_steps(steps):
    """Gemma's wiring: a norm after attention and one after the MLP, before each add."""
    out = []
    for s in steps:
        if s.op in ("attention", "mlp"):
            name = "ln1_post" if s.op == "attention" else "ln2_post"
            out += [dataclasses.replace(s, dropped=False),
                    Step("norm", name + ".out", (s.out,), name, dropped=True,
                         what="norm after attention" if s.op == "attention"
                         else "norm after the MLP")]
        elif s.op == "add":
            out.append(dataclasses.replace(s, reads=tuple(
                {"attn_out": "ln1_post.out", "mlp_out": "ln2_post.out"}.get(r, r)
                for r in s.reads)))
        else:
            out.append(s)
    return tuple(out)


def plant(monkeypatch, change_steps):
    """Every pass's wiring.describe gives the blocks with their steps changed."""
    described = wiring.describe

    def planted(config, i):
        b = wiring._describe(config, i)
        return dataclasses.replace(b, steps=change_steps(b.steps))

    for name, module in list(sys.modules.items()):  # wiring's own, and each module's name
        if name.startswith("tinygpt_cli") and getattr(module, "describe", None) is described:
            monkeypatch.setattr(module, "describe", planted)


def with_post_norms(params, config: Config, seed: int = 5) -> dict:
    rng = np.random.default_rng(seed)
    out = dict(params)
    for i in range(config.n_layer):
        for name in ("ln1_post", "ln2_post"):
            out[f"layers.{i}.{name}.w"] = 1 + rng.normal(0, 0.3, config.n_embd)
            if config.norm == "layer":
                out[f"layers.{i}.{name}.b"] = rng.normal(0, 0.1, config.n_embd)
    return out


# ------------------------------------------------------------------ the passes


def check_forward(params, config, post_norms=False):
    got = forward(params, config, IDS)
    # the model's erf is Abramowitz and Stegun's, to 1.5e-7 (NumPy has none): GELU by erf
    # agrees to that, every other step to float64's rounding
    tol = 1e-6 if config.act == "gelu" else 1e-10
    np.testing.assert_allclose(got, ref_forward(params, config, IDS, post_norms), atol=tol)


def check_backward(params, config):
    """d sum(logits * R) along a random direction of every parameter, by finite differences."""
    rng = np.random.default_rng(2)
    logits, values = record(params, config, IDS)
    r = rng.normal(size=logits.shape)
    grads, _ = backward(params, config, values, r)
    direction = {k: rng.normal(size=v.shape) for k, v in params.items()}
    eps = 1e-6

    def f(s):
        moved = {k: v + s * direction[k] for k, v in params.items()}
        return float((forward(moved, config, IDS) * r).sum())

    want = (f(eps) - f(-eps)) / (2 * eps)
    got = sum(float((grads[k] * direction[k]).sum()) for k in params)
    # a central difference along every parameter at once is good to about 1e-6 here; GELU
    # by erf: the backward is the exact erf's derivative, the forward's erf to 1.5e-7
    assert got == pytest.approx(want, rel=1e-4 if config.act == "gelu" else 1e-5, abs=1e-7)


def check_decoder(params, config):
    cache = KVCache.empty(config, dtype=np.float64)
    steps = np.stack([decode_step(params, config, int(t), cache) for t in IDS])
    np.testing.assert_allclose(steps, forward(params, config, IDS), atol=1e-12)


def check_residual_parts(params, config, values):
    _, parts = Trace(values, config).residual_parts(params)
    np.testing.assert_allclose(parts.sum(0), values[f"layers.{config.n_layer - 1}.resid_post"],
                               atol=1e-10)


def check_graph(params, config, values):
    """The frozen model at the real run is the run; its backward is its own derivative."""
    from tinygpt_cli.analysis import graph as G

    fz = G.freeze(params, config, values)
    n = config.n_layer
    outs = [values[f"layers.{i}.mlp_out"] for i in range(n)]
    emb = values["embeddings"]
    reads, u = G.frozen_forward(fz, emb, outs)
    np.testing.assert_allclose(u, values["ln_final.out"], atol=1e-10)
    for i in range(n):
        np.testing.assert_allclose(reads[i], values[f"layers.{i}.ln2.out"], atol=1e-10)
    rng = np.random.default_rng(4)
    delta, g = rng.normal(size=emb.shape), rng.normal(size=emb.shape)
    moved, u2 = G.frozen_forward(fz, emb + delta, outs)
    for layer, change in [(n, u2 - u), (1, moved[1] - reads[1])]:
        name = "ln_final" if layer == n else f"layers.{layer}.ln2"
        _, d_emb = G.frozen_backward(fz, G.norm_backward(fz, name, g[None]), layer)
        assert float((d_emb[0] * delta).sum()) == pytest.approx(float((g * change).sum()),
                                                                 rel=1e-8, abs=1e-9)


def check_circuit(params, config):
    from tinygpt_cli.analysis import circuit as C

    want = forward(params, config, IDS)[-1]
    params, config = C.ungrouped(params, config)  # as circuit runs a grouped model
    graph = C.build_graph(config)
    _, values = record(params, config, IDS[::-1].copy())
    fixed = C.sender_outputs(params, config, values)  # another text's: every edge live
    live = np.ones((1, len(graph.edges)))
    got = C.edge_forward(params, config, graph, IDS, live, fixed, range(config.vocab_size), -1)
    np.testing.assert_allclose(got[0], want, atol=1e-9)


def check_tracin_sites(params, config, values):
    from tinygpt_cli.analysis.tracin import norm_params, norm_sites

    for name, read, trace in norm_sites(config):
        if read is None:  # Qwen3's per-head norms: a value the backward keeps
            continue
        w, *b = (params[k] for k in norm_params(config, name))
        want = ref_norm(config.norm, values[read], w, b[0] if b else None,
                        config.layer_norm_epsilon)
        np.testing.assert_allclose(values[trace + ".out"], want, atol=1e-10)


@pytest.mark.parametrize("knobs", COMBOS)
def test_every_pass_follows_the_block_for_every_combination_of_the_families_knobs(knobs):
    config = knob_config(*knobs)
    params = random_params(config, seed=3)
    _, values = record(params, config, IDS)
    check_forward(params, config)
    check_backward(params, config)
    check_decoder(params, config)
    if config.post_norms:  # Gemma's wiring: computed above, refused by the part-readers
        check_refused_by_the_part_readers(params, config, values)
        check_tracin_sites(params, config, values)
        return
    check_residual_parts(params, config, values)
    check_graph(params, config, values)
    check_circuit(params, config)
    check_tracin_sites(params, config, values)


# ------------------------------------------------------------------ a planted wiring


@pytest.mark.parametrize("knobs", [c for c in COMBOS if not c.marks])
def test_a_planted_norm_after_each_branch_is_computed_or_refused_by_name(knobs, monkeypatch):
    config = knob_config(*knobs)
    plant(monkeypatch, post_norm_steps)
    params = with_post_norms(random_params(config, seed=3), config)
    _, values = record(params, config, IDS)
    # the passes written over the description compute it, as the reference with the norms
    check_forward(params, config, post_norms=True)
    check_backward(params, config)
    check_decoder(params, config)
    check_tracin_sites(params, config, values)  # the sites are the description's norms
    check_refused_by_the_part_readers(params, config, values)


def check_refused_by_the_part_readers(params, config, values):
    """The analyses written for the families' blocks refuse a norm after a branch, never
    answering for the families' wiring; DLA's parts take each norm frozen at the run and still
    add up to the stream; circuit computes Gemma 3's (an RMSNorm, no biases) and refuses
    another."""
    check_residual_parts(params, config, values)
    if config.norm == "rms" and not (config.out_bias or config.mlp_bias):
        check_circuit(params, config)  # Gemma 3's: each sender through the norm after it
    else:
        with pytest.raises(InputError, match="circuit is not available .* a norm after a "
                                             "branch with a LayerNorm or biases"):
            check_circuit(params, config)
    from tinygpt_cli.analysis import graph as G

    with pytest.raises(InputError, match="graph is not available .* 'norm after attention'"):
        G.build(params, config, list(IDS), [])
    with pytest.raises(ValueError, match="frozen pass has no norm ln[12]_post"):
        check_graph(params, config, values)


def _commands() -> dict[str, bool]:
    """Every command of the real table (as test_steer_everywhere reads it): runs the model?"""
    from tinygpt_cli.cli.app import _register, app
    from tinygpt_cli.cli.typer_tricks import command_name

    _register()
    found = {command_name(c): c.callback for c in app.registered_commands}
    found.update({f"{g.name} {command_name(c)}": c.callback for g in app.registered_groups
                  for c in g.typer_instance.registered_commands})
    return {name: getattr(f.__wrapped__, "steerable", False) for name, f in found.items()}


RUNS_THE_MODEL = sorted(name for name, runs in _commands().items() if runs)
ARGS = {"circuit": [TEXT, "Lily wanted to read with her"], "attn": [TEXT, "--layer", "0",
        "--head", "0"], "qk": [TEXT, "--layer", "1", "--head", "0"], "why": [TEXT]}


@pytest.mark.parametrize("command", RUNS_THE_MODEL)
def test_every_command_handles_the_planted_norms_or_refuses_them_by_name(command, cli,
                                                                          monkeypatch):
    """Each command's analysis declares what it handles (its module's HANDLES, named in
    commands.ANALYSES); one that does not take a norm after a branch says so, exit 2."""
    from tinygpt_cli.cli.common import handles_of

    can = handles_of(command)
    assert isinstance(can, wiring.Handles)
    if can.any_step:  # it runs the model's own passes only, which compute the plant
        return
    if {"norm after attention", "norm after the MLP"} <= set(can.allowed("step")):
        return  # dla: each norm frozen at the run (test_gemma3 runs it on Gemma's weights)
    plant(monkeypatch, post_norm_steps)
    r = cli(*command.split(), *ARGS.get(command, [TEXT]))
    assert r.code == 2, (command, r)
    assert r.err.startswith(f"error: {command} is not available for this gpt2 model: its block "
                            "has a step 'norm after attention', a step 'norm after the MLP', "
                            f"which {command} does not implement"), r.err
    assert len(r.err.splitlines()) == 1


def test_the_analyses_written_for_the_families_blocks_are_the_ones_that_read_its_parts():
    from tinygpt_cli.cli.common import handles_of

    refusing = {c for c in RUNS_THE_MODEL if not handles_of(c).any_step}
    assert refusing == {"review", "map", "dla", "graph", "circuit", "qk", "neurons", "why"}


@pytest.mark.parametrize("command", ["attn", "generate", "lens", "dla"])
def test_a_step_no_pass_computes_is_refused_by_every_command(command, cli, monkeypatch):
    plant(monkeypatch, lambda steps: steps[:2] + (Step("mystery", "m", ("attn_out",),
                                                       what="mystery"),) + steps[2:])
    r = cli(command, *ARGS.get(command, [TEXT]))
    assert r.code == 2, r
    assert "its block has a step 'mystery'" in r.err and len(r.err.splitlines()) == 1


def test_a_knob_name_an_analysis_declares_must_exist():
    with pytest.raises(ValueError, match="no knob colour"):
        wiring.handles(colour=("red",))
