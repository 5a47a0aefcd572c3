"""The forward pass against a deliberately naive reference written here from the GPT-2 math.

The reference uses Python lists, loops over tokens, heads and positions, math.tanh and
math.exp, and nothing from tinygpt_cli.transformer.ops, so a shared mistake is unlikely.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from cli_helpers import file_names

from tinygpt_cli.transformer.model import forward
from tinygpt_cli.transformer.trace import PathError, run_traced

TOL = dict(rtol=1e-5, atol=1e-5)

# ---------------------------------------------------------------- the naive reference


def _matvec(x: list[float], w: list[list[float]], b: list[float]) -> list[float]:
    """x W + b for one token, W stored (in, out)."""
    return [math.fsum(x[i] * w[i][j] for i in range(len(x))) + b[j] for j in range(len(b))]


def _dot(a: list[float], b: list[float]) -> float:
    return math.fsum(x * y for x, y in zip(a, b, strict=True))


def _layer_norm(x: list[float], g: list[float], b: list[float], eps: float):
    n = len(x)
    mean = math.fsum(x) / n
    var = math.fsum((xi - mean) ** 2 for xi in x) / n
    std = math.sqrt(var + eps)
    return [(x[i] - mean) / std * g[i] + b[i] for i in range(n)], mean, std


def _gelu(x: float) -> float:
    return 0.5 * x * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def reference_forward(params: dict[str, np.ndarray], config, ids: list[int]) -> dict:
    """Every value of the GPT-2 forward pass for one sequence, by canonical path."""
    P = {name: value.tolist() for name, value in file_names(params).items()}
    d, n_head, eps = config.n_embd, config.n_head, config.layer_norm_epsilon
    dk = d // n_head
    T = len(ids)
    out: dict[str, object] = {}

    tok = [list(P["wte.weight"][i]) for i in ids]
    pos = [list(P["wpe.weight"][t]) for t in range(T)]
    h = [[tok[t][c] + pos[t][c] for c in range(d)] for t in range(T)]
    out["token_embeddings"], out["position_embeddings"], out["embeddings"] = tok, pos, h

    def norm(prefix, name, rows):
        res = [_layer_norm(r, P[name + ".weight"], P[name + ".bias"], eps) for r in rows]
        out[prefix + ".out"] = [r[0] for r in res]
        out[prefix + ".mean"] = [r[1] for r in res]
        out[prefix + ".std"] = [r[2] for r in res]
        return [r[0] for r in res]

    for layer in range(config.n_layer):
        p, L = f"h.{layer}.", f"layers.{layer}."
        out[L + "resid_pre"] = h
        x = norm(L + "ln1", p + "ln_1", h)
        qkv = [_matvec(x[t], P[p + "attn.c_attn.weight"], P[p + "attn.c_attn.bias"])
               for t in range(T)]
        q = [[qkv[t][hd * dk:(hd + 1) * dk] for t in range(T)] for hd in range(n_head)]
        k = [[qkv[t][d + hd * dk:d + (hd + 1) * dk] for t in range(T)] for hd in range(n_head)]
        v = [[qkv[t][2 * d + hd * dk:2 * d + (hd + 1) * dk] for t in range(T)]
             for hd in range(n_head)]
        scores, weights, z = [], [], []
        for hd in range(n_head):
            s_h, w_h, z_h = [], [], []
            for i in range(T):
                row = [_dot(q[hd][i], k[hd][j]) / math.sqrt(dk) if j <= i else -math.inf
                       for j in range(T)]
                top = max(row[: i + 1])
                e = [math.exp(row[j] - top) if j <= i else 0.0 for j in range(T)]
                total = math.fsum(e)
                w = [ej / total for ej in e]
                s_h.append(row)
                w_h.append(w)
                z_h.append([math.fsum(w[j] * v[hd][j][c] for j in range(T)) for c in range(dk)])
            scores.append(s_h)
            weights.append(w_h)
            z.append(z_h)
        for name, value in (("q", q), ("k", k), ("v", v), ("scores", scores),
                            ("weights", weights), ("z", z)):
            out[L + name] = value
        for hd in range(n_head):
            for f, value in (("q", q), ("k", k), ("v", v), ("scores", scores),
                             ("weights", weights), ("out", z)):
                out[f"{L}heads.{hd}.{f}"] = value[hd]
        merged = [[z[hd][t][c] for hd in range(n_head) for c in range(dk)] for t in range(T)]
        out[L + "z_merged"] = merged
        attn = [_matvec(merged[t], P[p + "attn.c_proj.weight"], P[p + "attn.c_proj.bias"])
                for t in range(T)]
        out[L + "attn_out"] = attn
        h = [[h[t][c] + attn[t][c] for c in range(d)] for t in range(T)]
        out[L + "resid_mid"] = h
        x = norm(L + "ln2", p + "ln_2", h)
        pre = [_matvec(x[t], P[p + "mlp.c_fc.weight"], P[p + "mlp.c_fc.bias"]) for t in range(T)]
        post = [[_gelu(a) for a in row] for row in pre]
        mlp = [_matvec(post[t], P[p + "mlp.c_proj.weight"], P[p + "mlp.c_proj.bias"])
               for t in range(T)]
        out[L + "mlp_pre"], out[L + "mlp_post"], out[L + "mlp_out"] = pre, post, mlp
        h = [[h[t][c] + mlp[t][c] for c in range(d)] for t in range(T)]
        out[L + "resid_post"] = h

    u = norm("ln_final", "ln_f", h)
    out["logits"] = [[_dot(u[t], P["wte.weight"][w]) for w in range(config.vocab_size)]
                     for t in range(T)]
    return {name: np.array(value, dtype=np.float64) for name, value in out.items()}


# ---------------------------------------------------------------- helpers and fixtures

SEQUENCES = {
    "one-token": [5],
    "five": [3, 17, 3, 0, 22],
    "full-context": [1, 2, 3, 4, 5, 6, 7, 1],
}

NOT_ARRAYS = {"ids", "tokens", "layers.length", "probs"}


def expected_shape(path: str, config, T: int) -> tuple[int, ...]:
    d, H, dk, ff = config.n_embd, config.n_head, config.d_k, config.n_inner
    last = path.rsplit(".", 1)[-1]
    if path == "logits":
        return (T, config.vocab_size)
    if last in ("mean", "std"):
        return (T, 1)
    if ".heads." in path:
        return (T, T) if last in ("scores", "weights") else (T, dk)
    if last in ("q", "k", "v", "z"):
        return (H, T, dk)
    if last in ("scores", "weights"):
        return (H, T, T)
    if last in ("mlp_pre", "mlp_post"):
        return (T, ff)
    return (T, d)


@pytest.fixture(scope="module", params=list(SEQUENCES), ids=list(SEQUENCES))
def case(request, tiny_params, tiny_config):
    ids = SEQUENCES[request.param]
    return ids, run_traced(tiny_params, tiny_config, np.array(ids)), reference_forward(
        tiny_params, tiny_config, ids
    )


# ---------------------------------------------------------------- every traced value


def test_every_path_matches_the_reference(case, tiny_config):
    ids, trace, ref = case
    T = len(ids)
    paths = [p for p in trace.paths() if p not in NOT_ARRAYS]
    assert set(paths) == set(ref) - {f"layers.{i}.z_merged" for i in range(tiny_config.n_layer)}
    for path in paths:
        got = trace.get(path)
        assert isinstance(got, np.ndarray), path
        assert got.shape == expected_shape(path, tiny_config, T), path
        assert got.dtype == np.float64, path
        np.testing.assert_allclose(got, ref[path].reshape(got.shape), **TOL, err_msg=path)


def test_raw_trace_values_match_the_reference(case, tiny_config):
    """The stored arrays are exactly the hooked values: per-head ones included, nothing else."""
    ids, trace, ref = case
    merged = {f"layers.{i}.z_merged" for i in range(tiny_config.n_layer)}
    assert set(trace.values) == (set(ref) - merged) | {"ids"}
    np.testing.assert_array_equal(trace.values["ids"], ids)
    for name, value in trace.values.items():
        if name != "ids":
            np.testing.assert_allclose(value, ref[name].reshape(value.shape), **TOL, err_msg=name)


def test_probs_are_the_softmax_of_each_row_of_logits(case):
    _, trace, ref = case
    z = ref["logits"]
    expected = np.exp(z - z.max(axis=-1, keepdims=True))
    expected /= expected.sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(trace.get("probs"), expected, rtol=1e-12)
    np.testing.assert_allclose(trace.get("probs[-1]"), expected[-1], rtol=1e-12)


def test_ids_and_layer_count(case, tiny_config):
    ids, trace, _ = case
    np.testing.assert_array_equal(trace.get("ids"), ids)
    assert trace.get("layers.length") == tiny_config.n_layer
    with pytest.raises(PathError):
        trace.get("tokens")  # this trace was made without token strings


def test_scores_are_minus_infinity_exactly_above_the_diagonal(case, tiny_config):
    ids, trace, _ = case
    T = len(ids)
    above = np.triu(np.ones((T, T), dtype=bool), k=1)
    for layer in range(tiny_config.n_layer):
        scores = trace.get(f"layers.{layer}.scores")
        assert np.all(np.isneginf(scores[:, above]))
        assert np.all(np.isfinite(scores[:, ~above]))


def test_attention_rows_sum_to_one_and_never_look_ahead(case, tiny_config):
    ids, trace, _ = case
    T = len(ids)
    above = np.triu(np.ones((T, T), dtype=bool), k=1)
    for layer in range(tiny_config.n_layer):
        for head in range(tiny_config.n_head):
            w = trace.get(f"layers.{layer}.heads.{head}.weights")
            np.testing.assert_allclose(w.sum(axis=-1), 1.0, rtol=0, atol=1e-12)
            assert np.all(w[above] == 0.0)
            assert np.all(w[~above] > 0.0)
            assert w[0, 0] == 1.0  # the first token can only look at itself


def test_attention_is_not_uniform(tiny_params, tiny_config):
    """Guards the fixture: with uniform attention a wrong scale would go unnoticed."""
    w = run_traced(tiny_params, tiny_config, np.array(SEQUENCES["full-context"])).get(
        "layers.0.weights"
    )
    assert w[:, -1].max() > 2.0 / w.shape[-1]


# ---------------------------------------------------------------- batches, limits, dtypes


def test_batched_forward_equals_per_sequence_forward(tiny_params, tiny_config):
    rng = np.random.default_rng(3)
    batch = rng.integers(0, tiny_config.vocab_size, size=(3, 6))
    traced = run_traced(tiny_params, tiny_config, batch)
    for b in range(batch.shape[0]):
        single = run_traced(tiny_params, tiny_config, batch[b])
        assert set(single.values) == set(traced.values)
        for name, value in single.values.items():
            shared = name == "position_embeddings"  # one table row per position, not per text
            batched_value = value if shared else traced.values[name][b]
            if not shared:
                assert traced.values[name].shape == (3, *value.shape), name
            np.testing.assert_allclose(batched_value, value, rtol=1e-12, atol=1e-12,
                                       err_msg=name)
    heads = traced.get("layers.1.heads.1.weights")
    assert heads.shape == (3, 6, 6)
    np.testing.assert_array_equal(heads, traced.values["layers.1.weights"][:, 1])


def test_forward_refuses_more_tokens_than_positions(tiny_params, tiny_config):
    n = tiny_config.n_positions
    forward(tiny_params, tiny_config, np.zeros(n, dtype=np.int64))  # the limit itself is fine
    with pytest.raises(ValueError, match=str(n)):
        forward(tiny_params, tiny_config, np.zeros(n + 1, dtype=np.int64))
    with pytest.raises(ValueError, match=str(n)):
        forward(tiny_params, tiny_config, np.zeros((2, n + 1), dtype=np.int64))


def test_float32_forward_agrees_with_float64(tiny_params, tiny_config):
    ids = np.array(SEQUENCES["full-context"])
    t64 = run_traced(tiny_params, tiny_config, ids)
    t32 = run_traced({n: p.astype(np.float32) for n, p in tiny_params.items()}, tiny_config, ids)
    for path in t64.paths():
        if path in NOT_ARRAYS:
            continue
        a32, a64 = t32.get(path), t64.get(path)
        assert a32.dtype == np.float32, path
        np.testing.assert_allclose(a32, a64, rtol=1e-4, atol=1e-4, err_msg=path)


# ---------------------------------------------------------------- path resolution


def stored(trace, canonical: str) -> np.ndarray:
    """The array behind a canonical path, read straight from trace.values."""
    m = re.fullmatch(r"layers\.(\d+)\.heads\.(\d+)\.(\w+)", canonical)
    if m is None:
        return trace.values[canonical]
    field = "z" if m[3] == "out" else m[3]
    return trace.values[f"layers.{m[1]}.{field}"][int(m[2])]


@pytest.fixture(scope="module")
def trace(tiny_params, tiny_config):
    return run_traced(tiny_params, tiny_config, np.array(SEQUENCES["five"]))


SAME = [
    ("layers[1].heads[0].weights", "layers.1.heads.0.weights"),
    ("layers[0].ln1.out", "layers.0.ln1.out"),
    ("layers.-1.mlp_out", "layers.1.mlp_out"),
    ("layers[-2].resid_post", "layers.0.resid_post"),
    ("layers.0.heads.-1.out", "layers.0.heads.1.out"),
    ("layers[ -1 ].heads[ -2 ].q", "layers.1.heads.0.q"),
    # the seed page's spellings
    ("tokenEmbeddings", "token_embeddings"),
    ("positionEmbeddings", "position_embeddings"),
    ("layers[0].mlpOut", "layers.0.mlp_out"),
    ("layers[1].residPost", "layers.1.resid_post"),
    ("lnFinal.out", "ln_final.out"),
    ("lnFinal.std", "ln_final.std"),
    # TransformerLens hook names
    ("blocks.0.attn.hook_pattern", "layers.0.weights"),
    ("blocks.1.attn.hook_attn_scores", "layers.1.scores"),
    ("blocks.1.attn.hook_z", "layers.1.z"),
    ("blocks.0.attn.hook_q", "layers.0.q"),
    ("hook_embed", "token_embeddings"),
    ("hook_pos_embed", "position_embeddings"),
    ("blocks.0.hook_resid_pre", "layers.0.resid_pre"),
    ("blocks.0.hook_resid_mid", "layers.0.resid_mid"),
    ("blocks.-1.hook_resid_post", "layers.1.resid_post"),
    ("blocks.1.mlp.hook_pre", "layers.1.mlp_pre"),
    ("blocks.1.mlp.hook_post", "layers.1.mlp_post"),
    ("blocks.0.hook_mlp_out", "layers.0.mlp_out"),
    ("blocks.0.hook_attn_out", "layers.0.attn_out"),
    ("blocks.0.ln1.hook_scale", "layers.0.ln1.std"),
    ("ln_final.hook_scale", "ln_final.std"),
    # Hugging Face module names
    ("layers.0.ln_1.out", "layers.0.ln1.out"),
    ("ln_f.out", "ln_final.out"),
]


@pytest.mark.parametrize(("alias", "canonical"), SAME)
def test_spellings_resolve_to_the_same_value(trace, alias, canonical):
    assert trace.canonical(alias) == (canonical, [])
    np.testing.assert_array_equal(trace.get(alias), stored(trace, canonical))


def test_head_paths_are_slices_of_the_layer_arrays(trace, tiny_config):
    for layer in range(tiny_config.n_layer):
        for head in range(tiny_config.n_head):
            for field, whole in (("q", "q"), ("k", "k"), ("v", "v"), ("scores", "scores"),
                                 ("weights", "weights"), ("out", "z")):
                np.testing.assert_array_equal(
                    trace.get(f"layers.{layer}.heads.{head}.{field}"),
                    trace.values[f"layers.{layer}.{whole}"][head],
                )


def test_seed_spellings_named_in_the_design(trace, tiny_config):
    np.testing.assert_array_equal(trace.get("tokenEmbeddings"), trace.values["token_embeddings"])
    np.testing.assert_array_equal(trace.get("embeddings"), trace.values["embeddings"])
    np.testing.assert_array_equal(trace.get("layers[0].ln1.out"), trace.values["layers.0.ln1.out"])
    np.testing.assert_array_equal(
        trace.get("layers[0].heads[0].weights"), trace.values["layers.0.weights"][0]
    )
    np.testing.assert_array_equal(trace.get("layers[0].mlpOut"), trace.values["layers.0.mlp_out"])
    np.testing.assert_array_equal(trace.get("lnFinal.out"), trace.values["ln_final.out"])
    np.testing.assert_array_equal(trace.get("logits"), trace.values["logits"])
    assert trace.get("layers.length") == tiny_config.n_layer == 2
    assert trace["logits"] is trace.get("logits")


def test_trailing_indices_pick_rows(trace):
    logits = trace.values["logits"]
    assert trace.canonical("logits[-1]") == ("logits", [-1])
    np.testing.assert_array_equal(trace.get("logits[-1]"), logits[-1])
    np.testing.assert_array_equal(trace.get("logits.0"), logits[0])
    assert trace.get("logits[-1][3]") == logits[-1, 3]
    np.testing.assert_array_equal(
        trace.get("layers[1].heads[1].weights[2]"), trace.values["layers.1.weights"][1, 2]
    )
    np.testing.assert_array_equal(trace.get("layers.0.q[1]"), trace.values["layers.0.q"][1])
    with pytest.raises(PathError, match="out of range"):
        trace.get("logits[5]")  # five tokens: rows 0..4
    with pytest.raises(PathError, match="out of range"):
        trace.get("logits[-6]")
    with pytest.raises(PathError, match="no rows"):
        trace.get("logits[0][0][0]")


@pytest.mark.parametrize(
    ("typo", "meant"),
    [("layers.0.mlp_outt", "layers.0.mlp_out"), ("logit", "logits"),
     ("ln_final.outt", "ln_final.out"), ("layers.1.resid_psot", "layers.1.resid_post")],
)
def test_near_miss_paths_suggest_the_right_one(trace, typo, meant):
    with pytest.raises(PathError) as info:
        trace.get(typo)
    assert isinstance(info.value, KeyError)
    assert meant in info.value.suggestions
    assert meant in str(info.value)
    assert "did you mean" in str(info.value)


def test_unknown_path_without_any_near_match(trace):
    with pytest.raises(PathError) as info:
        trace.get("zzzzzzzzzzzzzzzzzzzzzzzz")
    assert info.value.suggestions == []
    with pytest.raises(PathError):
        trace.get("")


@pytest.mark.parametrize(
    ("path", "words"),
    [("layers.2.mlp_out", ["layer 2", "out of range", "2 layers"]),
     ("layers[-3].ln1.out", ["layer -3", "out of range"]),
     ("blocks.7.attn.hook_pattern", ["out of range"]),
     ("layers.0.heads.2.weights", ["head 2", "out of range", "2 heads"])],
)
def test_out_of_range_layers_and_heads_say_so(trace, path, words):
    with pytest.raises(PathError) as info:
        trace.get(path)
    for word in words:
        assert word in str(info.value)
