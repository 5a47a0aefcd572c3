"""The Python API behaves like Python (issue 51) and checks what it is given (issue 53): a
Result is a read-only Mapping; TransformerLens's habits mean what they mean there (cache keys
("resid_post", 0), names_filter, return_type, model.cfg, W_E ... W_out in its shapes); a call
prints nothing; a wrong type is one TypeError naming the argument.

The weights are checked by recomputing the cached values from them by hand (NumPy products
and a softmax written here), the loss by a plain loop over the logits, the configuration
against the weights folder's config.json read as a file."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Mapping

import numpy as np
import pytest
from cli_helpers import TEXT, make_tiny

import tinygpt_cli as tg
from tinygpt_cli.errors import InputError
from tinygpt_cli.storage.locations import SHIPPED


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("api_python") / "weights")


@pytest.fixture(scope="module")
def gpt2(tiny):
    return tg.load(str(tiny.folder))


@pytest.fixture(scope="module")
def llama():
    return tg.load(str(SHIPPED / "llama"))


# ------------------------------------------------------------------ a Result is a Mapping

def test_a_result_is_a_read_only_mapping_of_the_json_document(gpt2, tiny):
    # `"stages" in r` and `list(r)` raised KeyError: 0; len(r) and r.get failed
    r = gpt2.lens(TEXT, target=" toys")
    out = subprocess.run([sys.executable, "-m", "tinygpt_cli", "lens", TEXT, "--target",
                          " toys", "--json", "--weights", str(tiny.folder)],
                         capture_output=True, text=True, timeout=120).stdout
    doc = json.loads(out)
    assert isinstance(r, Mapping)
    assert "stages" in r and "no such key" not in r and 0 not in r
    assert list(r) == list(doc) and len(r) == len(doc)
    assert r.get("stages") == doc["stages"] and r.get("nope") is None and r.get("x", 5) == 5
    assert dict(r.items()) == doc and list(r.values()) == list(doc.values())
    with pytest.raises(TypeError):
        r["stages"] = []  # type: ignore[index]
    with pytest.raises(TypeError):
        del r["stages"]  # type: ignore[attr-defined]


# ------------------------------------------------------------- TransformerLens's habits

@pytest.mark.parametrize("key, name", [
    (("resid_post", 0), "blocks.0.hook_resid_post"),
    (("resid_pre", -1), "blocks.1.hook_resid_pre"),  # from the end, as TransformerLens
    (("pattern", 1), "blocks.1.attn.hook_pattern"),
    (("attn", 1), "blocks.1.attn.hook_pattern"),
    (("attn_scores", 0), "blocks.0.attn.hook_attn_scores"),
    (("z", 0), "blocks.0.attn.hook_z"),
    (("q", 1, "a"), "blocks.1.attn.hook_q"),
    (("pre", 1), "blocks.1.mlp.hook_pre"),
    (("mlp_post", 0), "blocks.0.mlp.hook_post"),
    (("mlp_out", 1), "blocks.1.hook_mlp_out"),
    (("scale", 0, "ln1"), "blocks.0.ln1.hook_scale"),
    (("normalized", 1, "ln2"), "blocks.1.ln2.hook_normalized"),
    (("normalized",), "ln_final.hook_normalized"),
    (("embed",), "hook_embed"),
])
def test_a_caches_short_keys_are_transformerlens_names(gpt2, key, name):
    # cache["resid_post", 0] raised AttributeError: 'tuple' object has no attribute 'strip'
    _, cache = gpt2.run_with_cache(TEXT)
    assert key in cache
    assert np.array_equal(cache[key], cache[name])
    assert np.array_equal(cache.get(key), cache[name])


def test_a_short_key_of_no_value_is_a_path_error_and_a_bad_one_a_type_error(gpt2):
    from tinygpt_cli.transformer.schema import PathError

    _, cache = gpt2.run_with_cache(TEXT)
    with pytest.raises(PathError):
        cache["result", 0]  # TransformerLens's per-head outputs: no such value here
    assert ("resid_post", 9) not in cache
    assert cache.get(("result", 0), None) is None and cache.get("hook_result", 7) == 7
    with pytest.raises(TypeError, match="a cache key of a name, a layer and a part"):
        cache[0, "resid_post"]


def test_names_filter_takes_a_name_a_list_or_a_function(gpt2):
    # run_with_cache(names="layers.0.mlp_out") was read letter by letter: no value at 'l'
    _, one = gpt2.run_with_cache(TEXT, names_filter="blocks.0.hook_mlp_out")
    assert [k for k in one if k.startswith("layers.")] == ["layers.0.mlp_out", "layers.length"]
    _, by_names = gpt2.run_with_cache(TEXT, names="layers.0.mlp_out")
    assert np.array_equal(by_names["layers.0.mlp_out"], one["blocks.0.hook_mlp_out"])
    _, some = gpt2.run_with_cache(TEXT, names_filter=["blocks.1.attn.hook_pattern",
                                                      "layers.0.resid_post"])
    assert {"layers.1.weights", "layers.0.resid_post"} <= set(some)
    assert "layers.0.weights" not in some
    _, full = gpt2.run_with_cache(TEXT)
    _, patterns = gpt2.run_with_cache(TEXT, names_filter=lambda n: n.endswith("hook_pattern"))
    assert [k for k in patterns if k not in ("ids", "tokens", "layers.length")] == \
        ["layers.0.weights", "layers.1.weights"]
    assert np.array_equal(patterns["pattern", 1], full["pattern", 1])
    _, ours = gpt2.run_with_cache(TEXT, names_filter=lambda n: n == "layers.1.heads.0.out")
    assert "layers.1.heads.0.out" in ours and "layers.1.z" not in ours
    with pytest.raises(TypeError, match="names_filter must answer True or False"):
        gpt2.run_with_cache(TEXT, names_filter=lambda n: n)
    with pytest.raises(TypeError, match="names_filter takes a name, a list of names"):
        gpt2.run_with_cache(TEXT, names_filter=5)


def test_return_type_loss_is_the_mean_next_token_cross_entropy(gpt2):
    logits = gpt2(TEXT)
    ids = gpt2.to_tokens(TEXT)
    each = []
    for t in range(len(ids) - 1):  # by hand, in float64: -log softmax(logits[t])[ids[t + 1]]
        row = [float(v) for v in logits[t]]
        top = max(row)
        each.append(-(row[ids[t + 1]] - top - math.log(sum(math.exp(v - top) for v in row))))
    loss = gpt2(TEXT, return_type="loss")
    assert isinstance(loss, float) and loss == pytest.approx(sum(each) / len(each), rel=1e-9)
    assert np.allclose(gpt2(TEXT, return_type="loss", loss_per_token=True), each, rtol=1e-9)
    both = gpt2(TEXT, return_type="both")
    assert np.array_equal(both[0], logits) and both[1] == loss
    assert gpt2(TEXT, return_type=None) is None
    with pytest.raises(ValueError, match="return_type takes one of 'logits', 'loss', 'both', "
                                         "None, not 'los'"):
        gpt2(TEXT, return_type="los")
    with pytest.raises(ValueError, match="a loss needs a text of two tokens or more"):
        gpt2("Lily", return_type="loss")


@pytest.mark.parametrize("which", ["gpt2", "llama"])
def test_cfg_says_the_config_in_transformerlens_words(gpt2, llama, tiny, which):
    model = {"gpt2": gpt2, "llama": llama}[which]
    folder = tiny.folder if which == "gpt2" else SHIPPED / "llama"
    raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    cfg = model.cfg
    if which == "gpt2":
        assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_mlp, cfg.d_vocab, cfg.n_ctx) == \
            (raw["n_layer"], raw["n_embd"], raw["n_head"], raw["n_inner"], raw["vocab_size"],
             raw["n_positions"])
        assert cfg.d_head == raw["n_embd"] // raw["n_head"]
        assert (cfg.normalization_type, cfg.positional_embedding_type, cfg.act_fn) == \
            ("LN", "standard", raw.get("activation_function", "gelu_new"))
        assert cfg.n_key_value_heads is None and not cfg.gated_mlp
    else:
        assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_mlp, cfg.n_ctx) == \
            (raw["num_hidden_layers"], raw["hidden_size"], raw["num_attention_heads"],
             raw["head_dim"], raw["intermediate_size"], raw["max_position_embeddings"])
        assert (cfg.normalization_type, cfg.positional_embedding_type, cfg.act_fn) == \
            ("RMS", "rotary", "silu")
        assert cfg.n_key_value_heads == raw["num_key_value_heads"] and cfg.gated_mlp
        assert cfg.rotary_base == raw["rope_theta"] and cfg.eps == raw["rms_norm_eps"]
    assert cfg.attn_scale == pytest.approx(math.sqrt(cfg.d_head))


def _softmax_causal(scores):
    t = scores.shape[-1]
    s = np.where(np.tril(np.ones((t, t), bool)), scores, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_the_weights_in_transformerlens_shapes_recompute_the_cached_values(gpt2):
    cfg, (_, c) = gpt2.cfg, gpt2.run_with_cache(TEXT)
    L, H, d, dh, ff, V = (cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.d_head, cfg.d_mlp,
                          cfg.d_vocab)
    assert gpt2.W_E.shape == (V, d) and gpt2.W_U.shape == (d, V) and gpt2.b_U.shape == (V,)
    assert gpt2.W_pos.shape == (cfg.n_ctx, d)
    for name in ("W_Q", "W_K", "W_V"):
        assert getattr(gpt2, name).shape == (L, H, d, dh)
    assert gpt2.W_O.shape == (L, H, dh, d) and gpt2.b_O.shape == (L, d)
    assert gpt2.b_Q.shape == gpt2.b_K.shape == gpt2.b_V.shape == (L, H, dh)
    assert gpt2.W_in.shape == (L, d, ff) and gpt2.W_out.shape == (L, ff, d)
    assert gpt2.b_in.shape == (L, ff) and gpt2.b_out.shape == (L, d)
    ids, T = gpt2.to_tokens(TEXT), len(gpt2.to_tokens(TEXT))
    f64 = np.float64
    close = dict(rtol=1e-4, atol=1e-5)
    assert np.allclose(c["hook_embed"], gpt2.W_E[ids], **close)
    assert np.allclose(c["hook_pos_embed"], gpt2.W_pos[:T], **close)
    for layer in range(L):
        x = c["normalized", layer, "ln1"].astype(f64)
        for h in range(H):
            q = x @ gpt2.W_Q[layer, h] + gpt2.b_Q[layer, h]
            k = x @ gpt2.W_K[layer, h] + gpt2.b_K[layer, h]
            v = x @ gpt2.W_V[layer, h] + gpt2.b_V[layer, h]
            pattern = _softmax_causal(q @ k.T / cfg.attn_scale)
            assert np.allclose(pattern, c["pattern", layer][h], **close)
            assert np.allclose(pattern @ v, c["z", layer][h], **close)
        out = sum(c["z", layer][h].astype(f64) @ gpt2.W_O[layer, h] for h in range(H))
        assert np.allclose(out + gpt2.b_O[layer], c["attn_out", layer], **close)
        x2 = c["normalized", layer, "ln2"].astype(f64)
        assert np.allclose(x2 @ gpt2.W_in[layer] + gpt2.b_in[layer], c["pre", layer], **close)
        assert np.allclose(c["post", layer].astype(f64) @ gpt2.W_out[layer] + gpt2.b_out[layer],
                           c["mlp_out", layer], **close)
    assert np.allclose(c["normalized",].astype(f64) @ gpt2.W_U + gpt2.b_U, c["logits"], **close)
    with pytest.raises(ValueError):
        gpt2.W_E[0, 0] = 1.0  # a copy: writing to it would change nothing, so it is refused
    with pytest.raises(AttributeError, match="this model's MLP is not gated"):
        gpt2.W_gate  # noqa: B018


def test_grouped_key_value_heads_are_repeated_per_query_head_and_the_gate_is_w_gate(llama):
    cfg, (_, c) = llama.cfg, llama.run_with_cache(TEXT)
    L, H, d, dh = cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.d_head
    assert llama.W_K.shape == llama.W_V.shape == (L, H, d, dh)  # 2 key/value heads, as 4
    group = H // cfg.n_key_value_heads
    close = dict(rtol=1e-4, atol=1e-5)
    for layer in range(L):
        x = c["normalized", layer, "ln1"].astype(np.float64)
        for h in range(H):
            assert np.array_equal(llama.W_V[layer, h], llama.W_V[layer, h // group * group])
            v = x @ llama.W_V[layer, h] + llama.b_V[layer, h]
            assert np.allclose(c["pattern", layer][h] @ v, c["z", layer][h], **close)
        x2 = c["normalized", layer, "ln2"].astype(np.float64)
        assert np.allclose(x2 @ llama.W_gate[layer], c["pre", layer], **close)
        assert np.allclose(x2 @ llama.W_in[layer], c["pre_linear", layer], **close)
    with pytest.raises(AttributeError, match="no position table; its positions turn q and k"):
        llama.W_pos  # noqa: B018


# ------------------------------------------------------------------ wrong types

@pytest.mark.parametrize("call, message", [
    (lambda m: m(123), "text takes a str, not 123"),
    (lambda m: m(None), "text takes a str, not None"),
    (lambda m: m.run_with_cache({"text": TEXT}), "text takes a str, not dict {'text': "),
    (lambda m: m.to_tokens(b"Lily"), "text takes a str, not bytes (b'Lily'): decode it"),
    (lambda m: m(["Lily", "Tom"]), "text takes one str; a list of texts is not batched"),
    (lambda m: m.encode(b"Lily"), "encode: text takes a str, not bytes b'Lily'"),
    (lambda m: m.probs(123), "probs: text takes a str, not 123"),
    (lambda m: m.attn(TEXT, all_heads="false"),
     "attn: all_heads takes True or False (a bool; JSON true or false), not str 'false'"),
    (lambda m: m.attn(TEXT, layer=True), "attn: layer takes a whole number (int), not True"),
    (lambda m: m.attn(TEXT, layer="1"), "attn: layer takes a whole number (int), not str '1'"),
    (lambda m: m.attn(["Lily"]), "attn: text takes a str, not list ['Lily']"),
    (lambda m: m.attn(TEXT, ablate="L0H1"),
     "attn: ablate takes a list, each item a str, not str 'L0H1'"),
    (lambda m: m.probs(TEXT, temperature="hot"), "probs: temperature takes a number, not str"),
    (lambda m: m.run_with_hooks(TEXT, [("blocks.0.hook_mlp_out", 3)]),
     "fwd_hooks takes a list of (name, function) pairs"),
])
def test_a_wrong_type_is_one_type_error_naming_the_argument(gpt2, call, message):
    with pytest.raises(TypeError) as e:
        call(gpt2)
    assert str(e.value).startswith(message)
    assert "\n" not in str(e.value)


def test_a_wrong_type_is_still_the_command_lines_input_error(gpt2):
    # a program that catches InputError (exit 2 on the command line) catches these too
    with pytest.raises(InputError):
        gpt2.probs(123)
    assert gpt2.attn(TEXT, all_heads=False)["shape"] == gpt2.attn(TEXT)["shape"]
    assert len(gpt2.attn(TEXT, all_heads=True)["shape"]) == 3
    assert gpt2.attn(TEXT, layer=1.0)["data"] == gpt2.attn(TEXT, layer=1)["data"]


def test_a_call_never_reads_the_processs_stdin(gpt2, monkeypatch):
    # model.attn(None), or no text, read the process's stdin as the text (in a notebook, the
    # kernel's): a missing text is the command line's "no text" error, None a TypeError
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO("Tom and Lily"))
    with pytest.raises(TypeError, match=r"^attn: text takes a str, not None$"):
        gpt2.attn(None)
    with pytest.raises(InputError, match=r"^no text: stdin is closed; give the text as an "
                                         r"argument$"):
        gpt2.attn()
    with pytest.raises(InputError, match=r"^no text: stdin is closed"):
        gpt2.attn("-")
    assert sys.stdin.read() == "Tom and Lily"  # left as it was
