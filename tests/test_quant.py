"""quant: what quantization changed. The measures against naive loops over the two models'
recorded values; the first-order tensor estimate against putting the tensor back for real on
a small random model quantized to Q8_0 by the gguf package; --file's positions as
llama-perplexity --kl-divergence scores them; --act-quant's roundings as ggml's C code makes
them (transcribed line by line)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from tinygpt_cli.analysis import quant as qa
from tinygpt_cli.transformer import model as mdl

sys.path.insert(0, str(Path(__file__).parent))
from cli_helpers import example
from conftest import family_configs, random_params  # noqa: E402


def small_llama():
    cfg = family_configs(n_embd=64, n_head=4, n_inner=64, vocab_size=40,
                         n_positions=16)["llama"]
    big = ("W_E", "W_QKV", "W_O", "W_in", "W_gate", "W_out")  # weights of a trained model's size
    ref = {k: v * (0.3 if k.endswith(big) else 1.0) for k, v in random_params(cfg, 3).items()}
    return cfg, ref


def q8_0(name: str, a: np.ndarray) -> np.ndarray:
    """As a GGUF holds it: a matrix's rows are its inputs (the table's rows as they are)."""
    gguf = pytest.importorskip("gguf")
    from gguf import quants

    if a.ndim < 2:
        return a
    t = gguf.GGMLQuantizationType.Q8_0
    rows = a if name.startswith("embed") else a.T
    back = quants.dequantize(quants.quantize(np.ascontiguousarray(rows, np.float32), t), t)
    return (back if name.startswith("embed") else back.T).astype(a.dtype)


def naive_kl(p_logits, q_logits):
    out = []
    for a, b in zip(p_logits, q_logits, strict=True):
        pa = [math.exp(x - max(a)) for x in a]
        pb = [math.exp(x - max(b)) for x in b]
        za, zb = sum(pa), sum(pb)
        out.append(sum(x / za * math.log((x / za) / (y / zb)) for x, y in zip(pa, pb,
                                                                              strict=True)))
    return np.array(out)


def test_measures_against_naive_loops():
    cfg, ref = small_llama()
    rng = np.random.default_rng(0)
    quant = {k: v + rng.normal(0, 0.01 * np.abs(v).mean(), v.shape) for k, v in ref.items()}
    ids = rng.integers(0, cfg.vocab_size, 11)
    r = qa.quant_report(ref, quant, cfg, ids, restore=0)
    l_ref, v_ref = mdl.record(ref, cfg, ids)
    l_q, v_q = mdl.record(quant, cfg, ids)
    stages = ["layers.0.resid_pre"] + [f"layers.{i}.resid_post" for i in range(cfg.n_layer)]
    for s, path in enumerate(stages):
        a, b = v_ref[path], v_q[path]
        for t in range(len(ids)):
            num = math.sqrt(sum((float(x) - float(y)) ** 2 for x, y in zip(a[t], b[t],
                                                                           strict=True)))
            den = math.sqrt(sum(float(x) ** 2 for x in a[t]))
            assert r.resid[s, t] == pytest.approx(num / den, rel=1e-9)
        whole = math.sqrt(sum((float(x) - float(y)) ** 2 for x, y in zip(a.ravel(), b.ravel(),
                                                                         strict=True)))
        assert r.resid_overall[s] == pytest.approx(whole / np.sqrt((a ** 2).sum()), rel=1e-9)
    for i in range(cfg.n_layer):
        A, B = v_ref[f"layers.{i}.weights"], v_q[f"layers.{i}.weights"]
        for h in range(cfg.n_head):
            for row in range(len(ids)):
                tv = 0.5 * sum(abs(float(x) - float(y)) for x, y in zip(A[h, row], B[h, row],
                                                                         strict=True))
                assert r.pattern_tv[i, h, row] == pytest.approx(tv, rel=1e-9, abs=1e-15)
    assert r.pattern_tv.max() > 0
    np.testing.assert_allclose(r.kl, naive_kl(l_ref, l_q), rtol=1e-6, atol=1e-15)
    assert list(r.same_top) == [int(np.argmax(a)) == int(np.argmax(b))
                                for a, b in zip(l_ref, l_q, strict=True)]


def test_first_order_matches_restoring_each_tensor():
    """Q8_0 moves each matrix by about 0.5 %: the exact gradient's first-order estimate of
    restoring one tensor agrees with restoring it in sign everywhere, within 5 % where the
    change is not tiny, and ranks the tensors alike."""
    cfg, ref = small_llama()
    quant = {k: q8_0(k, v) for k, v in ref.items()}
    ids = np.arange(12) % cfg.vocab_size
    r = qa.quant_report(ref, quant, cfg, ids, restore=100)
    assert len(r.tensors) == 3 * 2 + 4 * 2 + 1  # q, k, v, W_O, W_in, W_gate, W_out; table
    assert {s.label for s in r.tensors} >= {"layers.0.attn.W_QKV[q]", "embed.W_E"}
    big = max(abs(s.restored) for s in r.tensors)
    for s in r.tensors:
        assert np.sign(s.estimate) == np.sign(s.restored), s
        if abs(s.restored) > 0.1 * big:
            assert s.estimate == pytest.approx(s.restored, rel=0.05), s
        else:
            assert abs(s.estimate - s.restored) < 0.02 * big, s
    by_real = sorted(r.tensors, key=lambda s: -abs(s.restored))
    assert [s.label for s in by_real[:3]] == [s.label for s in r.tensors[:3]]


def test_file_scores_each_chunks_second_half():
    cfg, ref = small_llama()
    rng = np.random.default_rng(1)
    quant = {k: v + rng.normal(0, 0.02 * np.abs(v).mean(), v.shape) for k, v in ref.items()}
    n_ctx = 10
    stream = rng.integers(0, cfg.vocab_size, 3 * n_ctx + 7)  # 7 left over: dropped
    f = qa.file_kl(ref, quant, cfg, stream, n_ctx)
    kls, same = [], []
    for c in range(3):
        ids = stream[c * n_ctx:(c + 1) * n_ctx]
        a, b = mdl.forward(ref, cfg, ids), mdl.forward(quant, cfg, ids)
        for j in range(n_ctx // 2, n_ctx - 1):  # llama.cpp: first = n_ctx/2 .. n_ctx - 2
            kls.append(naive_kl(a[j:j + 1], b[j:j + 1])[0])
            same.append(int(np.argmax(a[j])) == int(np.argmax(b[j])))
    assert f.chunks == 3 and f.kl.size == 3 * 4
    np.testing.assert_allclose(f.kl, kls, rtol=1e-6, atol=1e-15)
    assert f.summary()["same_top"] == pytest.approx(np.mean(same))
    # a vocabulary that adds BOS: llama.cpp puts it in each chunk's place 0 (not in the
    # next tokens scored, which stay the stream's)
    g = qa.file_kl(ref, quant, cfg, stream, n_ctx, bos=7)
    ids = stream[n_ctx:2 * n_ctx].copy()
    ids[0] = 7
    a, b = mdl.forward(ref, cfg, ids), mdl.forward(quant, cfg, ids)
    np.testing.assert_allclose(g.kl[4:8], naive_kl(a[5:9], b[5:9]), rtol=1e-6, atol=1e-15)
    assert not np.allclose(g.kl, f.kl)


def naive_q8_0(x: np.ndarray) -> np.ndarray:
    """ggml-cpu's x86 quantize_row_q8_0 (AVX) then dequantize_row_q8_0, one block at a time
    in float32 scalars: d = m/127 kept as a float16, id = 127/m, q = x * id rounded to the
    nearest, halves to even (_MM_ROUND_NEAREST)."""
    out = np.zeros(x.size, np.float32)
    flat = x.astype(np.float32).reshape(-1)
    for b in range(0, flat.size, 32):
        m = np.float32(max(abs(v) for v in flat[b:b + 32]))
        d = np.float32(np.float16(m / np.float32(127)))
        inv = np.float32(127) / m if m != 0 else np.float32(0)
        for j in range(32):
            v = np.float32(flat[b + j] * inv)
            q = np.floor(v + np.float32(0.5))
            if q - v == 0.5 and q % 2:  # a tie rounded up to an odd number: to even instead
                q -= 1
            out[b + j] = d * np.float32(q)
    return out.reshape(x.shape)


def test_q8_0_rounding_is_llama_cpps_x86_path():
    """Q8_0 as llama.cpp's x86 CPU path rounds (ties to even, 127/m); gguf's reference
    quantizer (ties away from zero, 1/(m/127)) agrees but at ties."""
    rng = np.random.default_rng(8)
    x = rng.normal(size=(6, 64)).astype(np.float32)
    x[0, :32] = 0
    x[1] = np.round(x[1] * 8) / 8  # eighths...
    x[1, 0] = 127 / 8  # ...with 127/m = 8: every x * 8 a whole number...
    x[2] = np.round(x[2] * 8) / 8
    x[2, :32] = np.round(x[2, :32] * 4) / 4 + 1 / 8  # ...or, here, a half: ties
    x[2, 0] = 127 / 4
    got = qa.rounded_rows(x, "Q8_0")
    assert np.array_equal(got, naive_q8_0(x))
    assert np.all(got[0, :32] == 0) and not np.array_equal(got, x)
    gguf = pytest.importorskip("gguf")
    from gguf import quants

    t = gguf.GGMLQuantizationType.Q8_0
    ref = quants.dequantize(quants.quantize(x, t), t)
    assert np.array_equal(got[3:], ref[3:])  # random rows: no ties
    assert not np.array_equal(got[2, :32], ref[2, :32])  # ties: away from zero there


def test_act_quant_rounds_rows_as_llama_cpp_q8_0():
    cfg = family_configs(n_embd=64, n_head=4, n_inner=64)["llama"]
    types = {n: "Q4_0" for n in sum(qa.product_inputs(cfg, True).values(), [])}
    kinds = qa.activation_types(cfg, types, tied=True)
    assert set(kinds.values()) == {"Q8_0"}
    hook = qa.ActQuant(kinds)
    rng = np.random.default_rng(2)
    z = rng.normal(size=(4, 5, 16)).astype(np.float32)  # [H, T, d_k]: rows [T, 64] rounded
    rows = z.transpose(1, 0, 2).reshape(5, 64)
    want = naive_q8_0(rows).reshape(5, 4, 16).transpose(1, 0, 2)
    assert np.array_equal(hook("layers.0.z", z), want)
    assert not np.array_equal(want, z)
    x = rng.normal(size=(5, 64)).astype(np.float32)
    assert np.array_equal(hook("layers.1.ln2.out", x), naive_q8_0(x))
    assert hook("layers.1.resid_post", x) is x
    k_types = dict(types, **{"blk.0.ffn_down.weight": "Q4_K"})
    assert qa.activation_types(cfg, k_types, tied=True)["layers.0.mlp_post"] == "Q8_K"
    mixed = dict(types, **{"blk.0.attn_q.weight": "Q4_K", "blk.0.attn_k.weight": "Q4_K",
                           "blk.0.attn_v.weight": "Q6_K"})
    assert qa.activation_types(cfg, mixed, tied=True)["layers.0.ln1.out"] == "Q8_K"
    with pytest.raises(ValueError, match=r"layers.0.ln1.out enters products with weights of "
                       r"types Q4_0 \(Q8_0\), Q6_K \(Q8_K\)"):
        qa.activation_types(cfg, dict(types, **{"blk.0.attn_v.weight": "Q6_K"}), tied=True)
    with pytest.raises(ValueError, match="is Q9_9: which rounding llama.cpp gives"):
        qa.activation_types(cfg, dict(types, **{"blk.0.ffn_down.weight": "Q9_9"}), tied=True)


def naive_q8_k(x: np.ndarray) -> np.ndarray:
    """ggml's quantize_row_q8_K_ref then dequantize_row_q8_K, line by line in float32 scalars,
    with nearest_int's own trick (add 1.5 * 2^23 and read the low bits)."""
    out = np.zeros(x.size, np.float32)
    flat = x.astype(np.float32).reshape(-1)
    for b in range(0, flat.size, 256):
        amax, top = np.float32(0), np.float32(0)
        for j in range(256):
            ax = abs(flat[b + j])
            if ax > amax:
                amax, top = ax, flat[b + j]
        if amax == 0:
            continue
        iscale = np.float32(-127.0) / top
        for j in range(256):
            f = np.float32(np.float32(iscale * flat[b + j]) + np.float32(12582912.0))
            v = int((int(f.view(np.int32)) & 0x007FFFFF) - 0x00400000)
            out[b + j] = np.float32(np.float32(1) / iscale) * np.float32(min(127, v))
    return out.reshape(x.shape)


def test_q8_k_rounding_is_ggmls():
    """Q8_K blocks (the K-quants' activations) against a transcription of ggml's C: ties,
    a block of zeros, a block whose largest magnitude is negative or repeated."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(3, 512)).astype(np.float32)
    x[0, :256] = 0  # a block of zeros
    x[1, 7] = -9.0  # its largest magnitude negative
    x[1, 300], x[1, 301] = 5.0, -5.0  # the first of two equal magnitudes gives the sign
    x[2, 256:] = np.round(rng.normal(size=256) * 8) / 4  # quarters
    x[2, 256] = 127 / 2  # iscale -2: each odd quarter lands on a tie, x.5
    got = qa.rounded_rows(x, "Q8_K")
    assert np.array_equal(got, naive_q8_k(x))
    assert not np.array_equal(got, x) and np.all(got[0, :256] == 0)
    assert np.abs(got - x).max() <= np.abs(x).max() / 127  # within a step
    ties = np.abs(x[2, 256:] * 4) % 2 == 1
    assert ties.sum() > 20  # half to even, not away from zero: -2 * 0.25 -> 0, 0.75 -> -2
    assert np.array_equal(got[2, 256:][ties] * -2, np.rint(x[2, 256:][ties] * -2))


def test_bf16_rounding_is_ggmls():
    """float32 -> bfloat16 to nearest, ties to even (GGML_FP32_TO_BF16), on exact ties."""
    x = np.array([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -9, -(1 + 2 ** -8)], np.float32)
    want = np.array([1.0, 1.0, 1 + 2 ** -6, 1.0, -1.0], np.float32)
    assert np.array_equal(qa.rounded_rows(x, "BF16"), want)
    torch = pytest.importorskip("torch")
    y = np.random.default_rng(3).normal(size=1000).astype(np.float32)
    assert np.array_equal(qa.rounded_rows(y, "BF16"),
                          torch.from_numpy(y).bfloat16().float().numpy())


def test_act_quant_feeds_the_rounded_rows_into_the_products():
    """On a GPT-2 block: the MLP's input is LayerNorm(resid_mid) rounded to Q8_0 rows, and
    mlp_pre is that rounded input times W_in (a naive LayerNorm, gguf's own rounding)."""
    gguf = pytest.importorskip("gguf")
    from gguf import quants

    cfg = family_configs(n_embd=64, n_head=4, n_inner=64)["gpt2"]
    params = {k: v.astype(np.float32) for k, v in random_params(cfg, 5).items()}
    types = {n: "Q8_0" for n in sum(qa.product_inputs(cfg, True).values(), [])}
    hook = qa.ActQuant(qa.activation_types(cfg, types, tied=True))
    ids = np.arange(7)
    _, v = mdl.record(params, cfg, ids, hooks=hook)
    h = v["layers.1.resid_mid"].astype(np.float64)
    mean = h.mean(-1, keepdims=True)
    x = (h - mean) / np.sqrt(((h - mean) ** 2).mean(-1, keepdims=True) + cfg.layer_norm_epsilon)
    x = x * params["layers.1.ln2.w"] + params["layers.1.ln2.b"]
    t = gguf.GGMLQuantizationType.Q8_0
    want = quants.dequantize(quants.quantize(x.astype(np.float32), t), t)
    np.testing.assert_allclose(v["layers.1.ln2.out"], want, atol=2e-3)  # a Q8_0 step is ~0.03
    assert np.array_equal(v["layers.1.ln2.out"],
                          quants.dequantize(quants.quantize(v["layers.1.ln2.out"], t), t))
    _, plain = mdl.record(params, cfg, ids, ["layers.1.ln2.out"])
    raw = plain["layers.1.ln2.out"]
    assert not np.array_equal(raw, quants.dequantize(quants.quantize(raw, t), t))
    np.testing.assert_allclose(v["layers.1.mlp_pre"], v["layers.1.ln2.out"].astype(np.float64)
                               @ params["layers.1.mlp.W_in"] + params["layers.1.mlp.b_in"],
                               rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------ the command


@pytest.fixture(scope="module")
def llama_q8(tmp_path_factory):
    pytest.importorskip("gguf")

    from tinygpt_cli.storage.locations import SHIPPED

    make_gguf = example("make_gguf")
    out = tmp_path_factory.mktemp("gguf") / "llama-q8_0.gguf"
    make_gguf.write(SHIPPED / "llama", out, "Q8_0")
    return out, SHIPPED / "llama"


def test_command_json_and_errors(llama_q8, tmp_path):
    import json
    import subprocess

    gguf_path, folder = llama_q8
    run = [sys.executable, "-m", "tinygpt_cli"]
    p = subprocess.run(run + ["quant", "Lily wanted to play with her", "--weights",
                              str(gguf_path), "--against", str(folder), "--json", "--save",
                              str(tmp_path / "q.svg")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert len(d["stages"]) == 5 and len(d["kl"]) == len(d["ids"])
    assert 0 < d["summary"]["mean_kl"] < 0.01  # Q8_0: a small change
    first = d["tensors"][0]
    assert first["restored"] is not None and first["type"] == "Q8_0"
    assert first["file_tensor"].startswith(("blk.", "token_embd"))
    assert np.sign(first["first_order"]) == np.sign(first["restored"])
    assert (tmp_path / "q.svg").read_text().count("quant.resid") >= 1
    p = subprocess.run(run + ["quant", "Lily", "--weights", str(gguf_path), "--against",
                              str(Path(folder).parent)], capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.startswith("error: ") and \
        p.stderr.count("\n") == 1, p.stderr
    p = subprocess.run(run + ["quant", "Lily", "--weights", str(folder), "--against",
                              str(folder), "--act-quant"], capture_output=True, text=True)
    assert p.returncode == 2 and "--act-quant" in p.stderr and "GGUF" in p.stderr
    short = tmp_path / "short.txt"
    short.write_text("Lily wanted to play.")
    p = subprocess.run(run + ["quant", "--file", str(short), "--weights", str(gguf_path),
                              "--against", str(folder)], capture_output=True, text=True)
    assert p.returncode == 2 and "fewer than one chunk" in p.stderr, p.stderr


@pytest.mark.parametrize("pre,adds,bos", [
    ("gpt-2", {}, False), ("llama-bpe", {}, True), ("llama3", {}, True),
    ("llama-bpe", {"add_bos": False}, False), ("gpt-2", {"add_bos": True}, True),
    ("qwen2", {}, False), ("smollm", {}, False)])
def test_chunk_bos_as_llama_cpp_defaults_it(tmp_path, pre, adds, bos):
    """The BOS llama-perplexity puts in each chunk's place 0: the file's add_bos_token, else
    llama.cpp's default for the vocabulary (llama-vocab.cpp): a byte-level one adds it for
    Llama 3's pre-tokenizers only; SentencePiece always (tests/test_gguf.py's file)."""
    pytest.importorskip("gguf")
    import test_gguf as tg

    from tinygpt_cli.storage.locations import SHIPPED
    from tinygpt_cli.transformer.folder import load_model

    out = tmp_path / "m.gguf"
    tg.make_gguf.write(SHIPPED / "llama", out, "Q8_0", vocab=tg.byte_level_metadata(pre, **adds))
    model = load_model(out)
    want = model.config.bos_token_id
    assert isinstance(want, int)
    assert qa.chunk_bos(model) == (want if bos else None)


def test_chunk_bos_of_sentencepiece_without_the_key(tmp_path):
    pytest.importorskip("gguf")
    import test_gguf as tg

    from tinygpt_cli.transformer.folder import load_model

    folder = tmp_path / "sp"
    folder.mkdir()
    tokens = tg.sentencepiece_vocab()[0]
    from tinygpt_cli.jobs.train.loop import arch_config
    from tinygpt_cli.transformer.families import save_config
    from tinygpt_cli.transformer.folder import save_params
    from tinygpt_cli.transformer.model import init_params

    cfg = arch_config("llama", n_embd=32, n_layer=1, n_head=2, n_inner=32,
                      vocab_size=len(tokens), bos_token_id=1, eos_token_id=2)
    save_params(init_params(cfg, np.random.default_rng(0)), folder / "model.safetensors", cfg)
    save_config(cfg, folder / "config.json")
    out = tmp_path / "sp.gguf"
    tg.make_gguf.write(folder, out, "Q8_0", vocab=tg.sentencepiece_metadata())
    assert qa.chunk_bos(load_model(out)) == 1


def test_act_quant_keeps_the_attention_in_float16_as_llama_cpps_cache():
    """llama.cpp's default KV cache (float16, no flash attention): k after its turn and v
    stored as float16, q and the pattern turned to float16 for their products. Through a
    Llama block: the recorded q, k, v and pattern are float16 numbers, the pattern is the
    softmax of the rounded q and k, and z is the rounded pattern times the rounded v."""
    cfg = family_configs(n_embd=64, n_head=4, n_inner=64)["llama"]
    params = {k: v.astype(np.float32) for k, v in random_params(cfg, 6).items()}
    kinds = qa.attention_types(cfg)
    assert set(kinds.values()) == {"F16"} and len(kinds) == 4 * cfg.n_layer
    _, v = mdl.record(params, cfg, np.arange(9), hooks=qa.ActQuant(kinds))
    for part in ("q", "k", "v", "weights"):
        a = v[f"layers.0.{part}"]
        assert np.array_equal(a, a.astype(np.float16).astype(np.float32)), part
    q, k, w = v["layers.0.q"], v["layers.0.k"], v["layers.0.weights"]
    group = cfg.n_head // cfg.kv_heads
    k_all = np.repeat(k, group, axis=0)
    scores = q.astype(np.float64) @ np.swapaxes(k_all, -1, -2) * cfg.scale
    scores += np.triu(np.full((9, 9), -np.inf), 1)
    soft = np.exp(scores - scores.max(-1, keepdims=True))
    soft /= soft.sum(-1, keepdims=True)
    np.testing.assert_allclose(soft.astype(np.float16), w, rtol=2e-3, atol=1e-6)
    z = w.astype(np.float64) @ np.repeat(v["layers.0.v"], group, axis=0)
    np.testing.assert_allclose(v["layers.0.z"], z, rtol=1e-5, atol=1e-6)


def test_what_act_quant_covers_is_said_folded_over_the_blocks():
    kinds = {"layers.0.ln1.out": "Q8_0", "layers.1.ln1.out": "Q8_0", "layers.0.mlp_post": "Q8_0",
             "layers.1.mlp_post": "Q8_K", "layers.0.q": "F16", "ln_final.out": None}
    assert qa.covered(kinds) == ["layers.*.ln1.out (Q8_0)", "layers.*.mlp_post (Q8_0, Q8_K)",
                                 "layers.*.q (F16)"]
