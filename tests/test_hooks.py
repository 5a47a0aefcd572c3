"""Hooks in the forward pass: the schema is exactly what the model computes, interventions
change what they name and nothing else (checked against hand computations), gradients with
respect to every value match float64 finite differences, and the key/value cache gives the
same logits as a full pass."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from cli_helpers import file_names, without_head

from tinygpt_cli.transformer import ops
from tinygpt_cli.transformer.config import Config
from tinygpt_cli.transformer.hooks import Chain, Record, RecordOnly, Replace, StopAfter, ablation
from tinygpt_cli.transformer.model import KVCache, backward, forward
from tinygpt_cli.transformer.schema import BY_PATH, PathError, expand, pattern_of, resolve, shape_of
from tinygpt_cli.transformer.trace import run_traced

IDS = np.array([3, 17, 5, 9, 22, 1])


def test_the_forward_pass_computes_exactly_the_schemas_values_with_its_shapes(
        tiny_params, tiny_config):
    rec = Record()
    forward(tiny_params, tiny_config, IDS, hooks=rec)
    hooked = expand(tiny_config, kinds=("hooked",))
    assert list(rec.values) == hooked  # same values, same (forward) order, nothing more
    for path, value in rec.values.items():
        expected = shape_of(BY_PATH[pattern_of(path)].shape, tiny_config, t=len(IDS))
        assert value.shape == expected, path


def test_a_batch_adds_a_leading_axis_to_every_value_but_the_position_rows(
        tiny_params, tiny_config):
    rec = Record()
    forward(tiny_params, tiny_config, np.stack([IDS, IDS[::-1]]), hooks=rec)
    for path, value in rec.values.items():
        symbols = BY_PATH[pattern_of(path)].shape
        lead = () if path == "position_embeddings" else (2,)
        assert value.shape == (*lead, *shape_of(symbols, tiny_config, t=len(IDS))), path


def test_replacing_every_value_with_a_copy_of_itself_changes_no_logit(tiny_params, tiny_config):
    plain = forward(tiny_params, tiny_config, IDS)
    fns = {p: (lambda x: x.copy()) for p in expand(tiny_config, kinds=("hooked",))}
    replaced = forward(tiny_params, tiny_config, IDS, hooks=Replace(fns))
    np.testing.assert_array_equal(replaced, plain)


@pytest.mark.parametrize("layer, head", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_zeroing_a_heads_output_equals_removing_its_rows_of_c_proj(
        tiny_params, tiny_config, layer, head):
    ablated = forward(tiny_params, tiny_config, IDS,
                      hooks=ablation([f"layers.{layer}.heads.{head}.out"], tiny_config))
    by_hand = forward(without_head(tiny_params, tiny_config, layer, head), tiny_config, IDS)
    np.testing.assert_allclose(ablated, by_hand, rtol=1e-12, atol=1e-12)
    assert not np.allclose(ablated, forward(tiny_params, tiny_config, IDS))


def test_zeroing_mlp_out_equals_skipping_the_feed_forward_layer(tiny_params, tiny_config):
    """By hand: block 1 is resid_mid = h + attn(ln1(h)), with no feed-forward added."""
    cfg, p = tiny_config, tiny_params
    ablated = forward(p, cfg, IDS, hooks=ablation(["layers.1.mlp_out"], cfg))
    rec = Record()
    forward(p, cfg, IDS, hooks=rec)
    h = rec.values["layers.1.resid_mid"]  # block 1's stream before its feed-forward layer
    f = file_names(p)
    u, _, _ = ops.layer_norm(h, f["ln_f.weight"], f["ln_f.bias"], cfg.layer_norm_epsilon)
    np.testing.assert_allclose(ablated, u @ f["wte.weight"].T, rtol=1e-12, atol=1e-12)


def test_replacing_one_heads_weights_changes_that_head_only(tiny_params, tiny_config):
    rec_plain, rec = Record(), Record()
    forward(tiny_params, tiny_config, IDS, hooks=rec_plain)
    uniform = lambda w: np.tril(np.ones_like(w)) / np.arange(1, w.shape[-1] + 1)[:, None]  # noqa: E731
    forward(tiny_params, tiny_config, IDS,
            hooks=Chain(Replace({"layers.0.heads.1.weights": uniform}), rec))
    np.testing.assert_array_equal(rec.values["layers.0.heads.0.out"],
                                  rec_plain.values["layers.0.heads.0.out"])
    np.testing.assert_allclose(rec.values["layers.0.weights"][1], uniform(np.zeros((6, 6))))
    # head 1's output is now the running mean of its values
    v = rec.values["layers.0.heads.1.v"]
    np.testing.assert_allclose(rec.values["layers.0.heads.1.out"],
                               np.cumsum(v, axis=0) / np.arange(1, 7)[:, None], rtol=1e-12)
    assert not np.allclose(rec.values["layers.0.attn_out"], rec_plain.values["layers.0.attn_out"])


def test_record_only_keeps_what_was_asked_and_stop_after_ends_the_pass(tiny_params, tiny_config):
    only = RecordOnly({"layers.0.mlp_out", "logits"})
    forward(tiny_params, tiny_config, IDS, hooks=only)
    assert set(only.values) == {"layers.0.mlp_out", "logits"}
    rec = Record()
    out = forward(tiny_params, tiny_config, IDS,
                  hooks=Chain(rec, StopAfter("layers.0.resid_post")))
    assert out is None
    assert list(rec.values)[-1] == "layers.0.resid_post"
    assert "layers.1.resid_pre" not in rec.values


def test_ablation_paths_are_checked_with_suggestions(tiny_config):
    with pytest.raises(PathError, match="did you mean layers.1.mlp_out"):
        ablation(["layers.1.mlp_outt"], tiny_config)
    with pytest.raises(PathError, match="whole value"):
        ablation(["logits[-1]"], tiny_config)
    with pytest.raises(PathError, match="not computed by the forward pass"):
        ablation(["tokens"], tiny_config)
    # suggested: only what --ablate takes (trace's own suggestion for 'nonsense' is tokens)
    with pytest.raises(PathError) as e:
        resolve("nonsense", tiny_config)
    assert e.value.suggestions == ["tokens"]
    with pytest.raises(PathError) as e:
        ablation(["nonsense"], tiny_config)
    assert e.value.suggestions == [] and "did you mean" not in str(e.value)
    with pytest.raises(PathError, match=r"did you mean embeddings\?"):
        ablation(["embed"], tiny_config)
    assert set(ablation(["blocks.1.hook_mlp_out"], tiny_config).fns) == {"layers.1.mlp_out"}


# ---------------------------------------------------------------- gradients w.r.t. values


def _scalar(logits: np.ndarray, r: np.ndarray) -> float:
    return float((logits * r).sum())


@pytest.fixture(scope="module")
def grads(tiny_params, tiny_config):
    """d(sum(logits * R))/d(value) for every recorded value, from the backward pass."""
    r = np.random.default_rng(7).normal(size=(len(IDS), tiny_config.vocab_size))
    rec = Record()
    forward(tiny_params, tiny_config, IDS, hooks=rec)
    _, dvalues = backward(tiny_params, tiny_config, rec.values, r, wrt_values=True)
    return r, rec.values, dvalues


def test_every_recorded_value_but_the_ids_has_a_gradient(grads, tiny_config):
    """... and nothing else but the inner gradients the model names (W_QKV's output)."""
    from tinygpt_cli.transformer.model import inner_gradients

    _, values, dvalues = grads
    inner = inner_gradients(tiny_config)
    assert set(dvalues) == set(values) - {"ids"} | inner
    assert inner == {"layers.0.qkv", "layers.1.qkv"}
    for path in inner:
        assert dvalues[path].shape == (len(IDS), 3 * tiny_config.n_embd)
    dvalues = {p: d for p, d in dvalues.items() if p not in inner}
    for path, d in dvalues.items():
        assert d.shape == values[path].shape, path


# conftest's tiny_config, spelled out so the paths can parametrize the test below
TINY = Config(n_embd=12, n_layer=2, n_head=2, n_inner=20, vocab_size=23, n_positions=8)


def test_the_parametrized_paths_are_the_fixtures(tiny_config):
    assert TINY == tiny_config


@pytest.mark.parametrize("path", [p for p in expand(TINY, kinds=("hooked",)) if p != "ids"])
def test_value_gradients_match_float64_finite_differences(grads, tiny_params, tiny_config, path):
    """Nudge entries of the value through a Replace hook and watch the scalar move."""
    r, values, dvalues = grads
    shape = values[path].shape
    rng = np.random.default_rng(zlib.crc32(path.encode()))
    flat = [np.unravel_index(i, shape) for i in rng.choice(int(np.prod(shape)),
                                                             min(6, int(np.prod(shape))),
                                                             replace=False)]
    h = 1e-6
    for idx in flat:
        if path.endswith("scores") and not np.isfinite(values[path][idx]):
            continue  # a masked score: -inf, with no gradient to check

        def nudged(step, idx=idx):
            def fn(x):
                y = x.copy()
                y[idx] += step
                return y
            return _scalar(forward(tiny_params, tiny_config, IDS,
                                   hooks=Replace({path: fn})), r)

        numeric = (nudged(h) - nudged(-h)) / (2 * h)
        analytic = dvalues[path][idx]
        assert analytic == pytest.approx(numeric, rel=1e-6, abs=1e-7), (path, idx)


# ---------------------------------------------------------------- the key/value cache


def test_a_cached_pass_in_pieces_equals_one_full_pass(tiny_params, tiny_config):
    full = forward(tiny_params, tiny_config, IDS)
    cache = KVCache.empty(tiny_config, dtype=np.float64)
    first = forward(tiny_params, tiny_config, IDS[:4], cache=cache, start=0)
    rest = [forward(tiny_params, tiny_config, IDS[t:t + 1], cache=cache, start=t)
            for t in range(4, len(IDS))]
    np.testing.assert_allclose(np.concatenate([first, *rest]), full, rtol=1e-12, atol=1e-12)
    assert cache.length == len(IDS)


def test_last_only_gives_the_last_row_of_the_logits(tiny_params, tiny_config):
    full = forward(tiny_params, tiny_config, IDS)
    last = forward(tiny_params, tiny_config, IDS, last_only=True)
    assert last.shape == (1, tiny_config.vocab_size)
    np.testing.assert_allclose(last[0], full[-1], rtol=1e-12, atol=1e-12)


def test_trace_records_the_intervened_run(tiny_params, tiny_config):
    hooks = ablation(["layers.0.attn_out"], tiny_config)
    t = run_traced(tiny_params, tiny_config, IDS, hooks=hooks)
    assert not t.get("layers.0.attn_out").any()
    np.testing.assert_array_equal(t.get("layers.0.resid_mid"), t.get("layers.0.resid_pre"))


@pytest.mark.parametrize("replace", [
    lambda v: v.astype(np.float64),  # another dtype
    lambda v: np.stack([v, 2 * v]),  # a wider shape that still broadcasts
    lambda v: v.tolist(),  # not an array at all
], ids=["float64", "broadcast", "list"])
def test_a_hooked_std_of_another_kind_is_divided_by_as_the_formula_says(replace):
    # layer_norm divides its own `centred` in place when it can; a hook's replacement std of
    # another dtype or shape must take the plain (x - mean) / std * g + b path instead.
    from tinygpt_cli.transformer.model import layer_norm

    rng = np.random.default_rng(5)
    x = rng.normal(size=(3, 8)).astype(np.float32)
    g, b = rng.normal(size=8).astype(np.float32), rng.normal(size=8).astype(np.float32)
    seen = {}

    def hook(path, v):
        if path.endswith(".std"):
            seen["std"] = replace(v)
            return seen["std"]
        return v

    out = layer_norm(x, g, b, 1e-5, "ln", hook)
    mean = x.mean(axis=-1, keepdims=True)
    want = (x - mean) / np.asarray(seen["std"]) * g + b
    np.testing.assert_allclose(out, want, rtol=1e-6)
