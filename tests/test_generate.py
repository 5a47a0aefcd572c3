"""Cached generation gives the tokens of the uncached loop: before the context is full, as the
window slides past it, and with an ablation applied to every new position."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import FAMILIES, family_configs

from tinygpt_cli.storage.locations import SHIPPED
from tinygpt_cli.transformer.config import Config
from tinygpt_cli.transformer.folder import load_model
from tinygpt_cli.transformer.generate import CachedContext, generate, next_logits_uncached
from tinygpt_cli.transformer.hooks import ablation
from tinygpt_cli.transformer.sampling import create_rng

PROMPT = [608, 429, 267, 346, 336, 314]  # "Lily wanted to play with her"


def tokens(params, config, ids, n, *, cached, hooks=None, temperature=0.0, seed=0):
    return [s.id for s in generate(params, config, ids, n, temperature=temperature,
                                   rng=create_rng(seed), hooks=hooks, cached=cached)]


@pytest.fixture(scope="module")
def shipped():
    if not (SHIPPED / "model.safetensors").is_file():
        pytest.skip("the shipped weights are absent")
    return load_model()


@pytest.mark.slow
def test_greedy_cached_equals_uncached_over_300_tokens_on_the_shipped_model(shipped):
    # 6 + 300 tokens: the window slides 178 times past the 128-token context.
    p, c = shipped.params, shipped.config
    cached = tokens(p, c, PROMPT, 300, cached=True)
    assert len(cached) == 300
    assert cached == tokens(p, c, PROMPT, 300, cached=False)


def test_cached_equals_uncached_on_a_tiny_model_with_a_small_context(make_params):
    config = Config(n_embd=12, n_layer=2, n_head=2, n_inner=20, vocab_size=23, n_positions=8)
    params = {k: v.astype(np.float32) for k, v in make_params(config, seed=3).items()}
    for prompt in ([1], [4, 5, 6], list(range(8)), list(range(12))):
        cached = tokens(params, config, prompt, 300, cached=True)
        assert cached == tokens(params, config, prompt, 300, cached=False)
        assert len(set(cached)) > 1  # not a degenerate repetition of one token
    # sampling draws the same numbers from the same distributions
    for seed in range(3):
        assert (tokens(params, config, [1, 2], 40, cached=True, temperature=1.0, seed=seed)
                == tokens(params, config, [1, 2], 40, cached=False, temperature=1.0, seed=seed))


def test_each_cached_step_gives_the_logits_of_a_full_pass(make_params):
    config = Config(n_embd=12, n_layer=2, n_head=2, n_inner=20, vocab_size=23, n_positions=8)
    params = make_params(config, seed=4)  # float64: the cache keeps the dtype
    ctx = CachedContext(params, config, [3, 1])
    text = [3, 1]
    for token in [7, 2, 9, 9, 0, 5, 11, 4, 4, 8, 1]:  # runs 5 tokens past the context
        text.append(token)
        got = ctx.append(token)
        assert ctx.cache.k[0].dtype == np.float64
        np.testing.assert_allclose(got, next_logits_uncached(params, config, text),
                                   rtol=1e-12, atol=1e-12)


def test_a_sliding_blocks_cache_keeps_its_window_alone_with_a_full_passs_logits(make_params):
    """A block with a window of 3 keys in a context of 20: its cache is 6 rows however long
    the text, moved to the front as it fills (and sized to a prompt longer than that), every
    step's logits a full pass's, with and without an ablation (the general pass's steps)."""
    from dataclasses import replace

    from tinygpt_cli.jobs.train.loop import arch_config

    config = replace(arch_config("neo", n_embd=12, n_layer=2, n_head=2, n_inner=20,
                                 vocab_size=23, n_positions=20), windows=(3, 0))
    params = make_params(config, seed=5)
    for prompt, hooks in (([3, 1], None), (list(range(9)), None),
                          ([3, 1], ablation(["layers.0.mlp_out"], config))):
        ctx = CachedContext(params, config, prompt, hooks)
        text = list(prompt)
        for token in [7, 2, 9, 9, 0, 5, 11, 4, 4, 8, 1]:
            text.append(token)
            got = ctx.append(token)
            np.testing.assert_allclose(got, next_logits_uncached(params, config, text, hooks),
                                       rtol=1e-12, atol=1e-12)
            assert ctx.cache.k[0].shape[-2] == 6 and ctx.cache.k[1].shape[-2] == 20
        row = 2 * config.kv_heads * config.d_k * 8
        assert ctx.cache.held_bytes() == row * (6 + len(text))


def test_cached_and_ablated_equals_uncached_and_ablated(make_params):
    config = Config(n_embd=12, n_layer=2, n_head=2, n_inner=20, vocab_size=23, n_positions=8)
    params = {k: v.astype(np.float32) for k, v in make_params(config, seed=5).items()}
    for path in ("layers.0.heads.1.out", "layers.1.mlp_out", "layers.0.k"):
        hooks = ablation([path], config)
        for t in (0.0, 1.0):
            ablated = tokens(params, config, [2, 7], 30, cached=True, hooks=hooks, temperature=t)
            assert ablated == tokens(params, config, [2, 7], 30, cached=False, hooks=hooks,
                                     temperature=t)
    # and the ablation changes something, so the hooks really reached the new positions
    hooks = ablation(["layers.0.attn_out", "layers.1.attn_out"], config)
    assert (tokens(params, config, [2, 7], 30, cached=True, hooks=hooks, temperature=1.0)
            != tokens(params, config, [2, 7], 30, cached=True, temperature=1.0))


def test_generation_records_nothing(make_params, monkeypatch):
    config = Config(n_embd=12, n_layer=2, n_head=2, n_inner=20, vocab_size=23, n_positions=8)
    params = make_params(config, seed=6)
    seen = []
    import tinygpt_cli.transformer.generate as gen

    real = gen.forward

    def spy(*args, hooks=None, **kwargs):
        seen.append((hooks, kwargs.get("last_only"), np.shape(args[2])))
        return real(*args, hooks=hooks, **kwargs)

    real_step = gen.decode_step
    steps = []

    def spy_step(params, config, token, cache, hooks=None):
        steps.append((token, cache.length, hooks))
        return real_step(params, config, token, cache, hooks)

    monkeypatch.setattr(gen, "forward", spy)
    monkeypatch.setattr(gen, "decode_step", spy_step)
    out = tokens(params, config, [1, 2, 3], 4, cached=True)
    # the prompt once through forward, hooks off, last position only ...
    assert seen == [(None, True, (3,))]
    # ... then one position per step through decode_step, with no hooks either
    assert steps == [(out[0], 3, None), (out[1], 4, None), (out[2], 5, None)]


def test_the_generate_command_applies_ablate_to_every_new_token(cli, tiny):
    from cli_helpers import TEXT, TEXT_IDS

    m = tiny.model
    for path in ("layers.0.mlp_out", "layers.1.heads.0.out"):
        want = [s.id for s in generate(m.params, m.config, TEXT_IDS, 12, temperature=1.0,
                                       rng=create_rng(5), cached=False,
                                       hooks=ablation([path], m.config))]
        r = cli("generate", TEXT, "-n", 12, "--seed", 5, "-t", 1, "--no-stop", "--json",
                "--ablate", path)
        assert r.code == 0, r.err
        assert r.ndjson()[-1]["ids"] == TEXT_IDS + want
        assert r.ndjson()[0]["ablated"] == [path]  # the run says what it changed
        shown = cli("generate", TEXT, "-n", 2, "--seed", 5, "--ablate", path)
        assert shown.err.splitlines()[-1] == f"ablated (set to zero) at every step: {path}"
    plain = cli("generate", TEXT, "-n", 12, "--seed", 5, "-t", 1, "--no-stop", "--json")
    assert plain.ndjson()[-1]["ids"] != TEXT_IDS + want  # the ablation changed the text
    assert "ablated" not in plain.ndjson()[0] and "ablated" not in plain.err
    r = cli("generate", TEXT, "--ablate", "layers.9.mlp_out")
    assert r.code == 2 and r.err.startswith("error: ")


def test_decode_step_gives_the_last_logits_of_a_full_pass_on_the_shipped_model(shipped):
    from tinygpt_cli.transformer.model import KVCache, decode_step, forward

    p, c = shipped.params, shipped.config
    cache = KVCache.empty(c)
    forward(p, c, np.asarray(PROMPT[:1]), cache=cache, start=0, last_only=True)
    text = PROMPT[:1]
    for token in PROMPT[1:] + [267] * 20:
        text = text + [token]
        got = decode_step(p, c, token, cache)
        assert cache.length == len(text)
        np.testing.assert_allclose(got, forward(p, c, np.asarray(text))[-1], atol=2e-5,
                                   rtol=1e-5)


def test_decode_step_refuses_a_position_past_the_context(make_params):
    from tinygpt_cli.transformer.model import KVCache, decode_step

    config = Config(n_embd=12, n_layer=2, n_head=2, n_inner=20, vocab_size=23, n_positions=4)
    params = make_params(config, seed=1)
    cache = KVCache.empty(config, dtype=np.float64)
    for token in (1, 2, 3, 4):
        decode_step(params, config, token, cache)
    with pytest.raises(ValueError, match="5 tokens is more than the model's limit of 4"):
        decode_step(params, config, 5, cache)


@pytest.mark.parametrize("arch", FAMILIES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_decode_steps_are_the_general_passes_numbers_bit_for_bit(arch, dtype):
    """decode_step without hooks (model.Decoder) against forward's own pass over the same
    cache, position by position to the end of the context, on every family's block: a local
    window shorter than the text (neo), parallel blocks and a quarter of each head turned
    (neox), 3 key/value heads for 6 queries, q/k/v biases (qwen2), q/k norms (qwen3)."""
    from tinygpt_cli.transformer.model import KVCache, decode_step, forward, init_params

    config = family_configs()[arch]
    params = init_params(config, np.random.default_rng(7), dtype)
    params = {n: a + 0.1 if n.endswith(".b_QKV") else a for n, a in params.items()}
    ours, theirs = KVCache.empty(config, dtype=dtype), KVCache.empty(config, dtype=dtype)
    forward(params, config, np.asarray([3]), cache=ours, start=0, last_only=True)
    forward(params, config, np.asarray([3]), cache=theirs, start=0, last_only=True)
    for token in [5, 1, 22, 7, 7, 0, 9, 4, 13, 2, 8]:
        start = theirs.length
        want = forward(params, config, np.asarray([token]), cache=theirs, start=start,
                       last_only=True)[-1]
        got = decode_step(params, config, token, ours)
        assert ours.decoder is not None and ours.length == theirs.length == start + 1
        np.testing.assert_array_equal(got, want)
        for i in range(config.n_layer):
            np.testing.assert_array_equal(ours.k[i][..., :start + 1, :],
                                          theirs.k[i][..., :start + 1, :])
    with pytest.raises(ValueError, match="13 tokens is more than the model's limit of 12"):
        decode_step(params, config, 5, ours)


def test_a_decode_step_that_overflows_names_the_first_value_as_the_general_pass_does(
        make_params):
    from tinygpt_cli.errors import NonFiniteError
    from tinygpt_cli.transformer.model import KVCache, decode_step, forward

    config = Config(n_embd=12, n_layer=2, n_head=2, n_inner=20, vocab_size=23, n_positions=8)
    params = {n: a.astype(np.float32) for n, a in make_params(config, seed=2).items()}
    cache = KVCache.empty(config)
    decode_step(params, config, 1, cache)
    params = {**params, "layers.1.mlp.W_out": params["layers.1.mlp.W_out"] * np.float32(1e38)}
    with pytest.raises(NonFiniteError) as general:
        forward(params, config, np.asarray([1, 2]))
    assert "ln_final.std is the first value" in str(general.value)
    with pytest.raises(NonFiniteError) as step:
        decode_step(params, config, 2, cache)
    assert str(step.value) == str(general.value)
