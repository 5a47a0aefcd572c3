"""Every family against transformers: small random models that transformers makes and saves
(odd sizes: 6 query heads on 2 key/value heads, rotary on a quarter of each head, a local
window shorter than the text, Qwen3's q/k norm, tied and untied heads, a bfloat16 file;
Gemma 3's heads of 8 numbers in a stream of 24 on 4 heads, one and two key/value heads, a
sliding window shorter than the text, the 5:1 pattern of sliding and full blocks over 7
blocks, each kind with its own rotary base, a query_pre_attn_scalar that is not the head
size), loaded by tinygpt: logits and every block's input, gradients of a logit against torch
autograd, greedy generation, the folder tinygpt saves loading back in transformers, and
every command. Gemma 3's config and knobs alone (no model pair): tests/test_gemma3.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tinygpt_cli.storage.locations import SHIPPED
from tinygpt_cli.transformer.folder import load_model, save_params
from tinygpt_cli.transformer.generate import generate
from tinygpt_cli.transformer.model import backward, forward, record
from tinygpt_cli.transformer.schema import is_norm_weight

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

IDS = [5, 300, 17, 900, 42, 8, 1000, 77, 3, 64, 5, 300]  # longer than every window
TOL = 1e-5  # relative to the largest value compared
THETAS = {"sliding_attention": 50.0, "full_attention": 3000.0}  # far apart: a wrong one shows


def _config(kind: str, tied: bool, vocab: int = 4096, **gemma):
    common = dict(vocab_size=vocab, hidden_size=24, intermediate_size=40, num_hidden_layers=2,
                  max_position_embeddings=64, tie_word_embeddings=tied)
    if kind == "gemma3":  # gemma: blocks, kv (key/value heads), window, kinds (layer_types)
        common["num_hidden_layers"] = gemma["blocks"]
        return transformers.Gemma3TextConfig(
            num_attention_heads=4, num_key_value_heads=gemma["kv"], head_dim=8,
            query_pre_attn_scalar=11, sliding_window=gemma["window"],
            layer_types=gemma["kinds"], bos_token_id=2, eos_token_id=1, pad_token_id=0,
            rope_parameters={k: {"rope_type": "default", "rope_theta": v}
                             for k, v in THETAS.items()}, **common)
    if kind in ("llama", "llama3", "qwen2", "qwen3"):
        cls = {"llama": transformers.LlamaConfig, "llama3": transformers.LlamaConfig,
               "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}[kind]
        extra = {"head_dim": 8} if kind == "qwen3" else {}
        if kind == "llama3":  # Llama 3.2's scaled rope, its context cut to the text's scale
            extra = {"rope_parameters": {
                "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16}}
        return cls(num_attention_heads=6, num_key_value_heads=2, **common, **extra)
    if kind == "gpt_neox":
        return transformers.GPTNeoXConfig(num_attention_heads=3, rotary_pct=0.25, **common)
    common["num_layers"] = common.pop("num_hidden_layers")
    return transformers.GPTNeoConfig(num_heads=3, attention_types=[[["global", "local"], 1]],
                                     window_size=3, bos_token_id=0, eos_token_id=0, **common)


CASES = {  # name: (family, tied head, file dtype[, vocabulary or Gemma 3's sizes])
    "gpt_neo": ("gpt_neo", True, torch.float32 if torch else None),
    "gpt_neox": ("gpt_neox", False, torch.float32 if torch else None),
    "llama-untied": ("llama", False, torch.float32 if torch else None),
    "llama-tied-bf16": ("llama", True, torch.bfloat16 if torch else None),
    "qwen2": ("qwen2", True, torch.float32 if torch else None),
    "qwen3": ("qwen3", False, torch.float32 if torch else None),
    "llama3-rope": ("llama3", True, torch.float32 if torch else None),
    # Pythia's and Qwen's vocabularies are padded past their tokenizers' last token: here
    # 4,130 rows for the shipped tokenizer's 4,096 tokens
    "gpt_neox-padded": ("gpt_neox", False, torch.float32 if torch else None, 4130),
    # the default pattern over 7 blocks: block 5 full, the others sliding
    "gemma3-5to1-kv1": ("gemma3", True, torch.float32 if torch else None,
                        dict(blocks=7, kv=1, window=3, kinds=None)),
    "gemma3-kv2-untied": ("gemma3", False, torch.float32 if torch else None,
                          dict(blocks=2, kv=2, window=5,
                               kinds=["full_attention", "sliding_attention"])),
    "gemma3-kv2-bf16": ("gemma3", True, torch.bfloat16 if torch else None,
                        dict(blocks=3, kv=2, window=4, kinds=None)),
}
GEMMA3 = "gemma3_text"


def _widened(model, seed: int):
    """Weights far from initialisation, so attention is far from uniform: norms' scales
    1 +- 0.2 (Gemma's w of its scale 1 + w: N(0, 0.3)), everything else N(0, 0.15)."""
    torch.manual_seed(seed)
    gemma = model.config.model_type == GEMMA3
    with torch.no_grad():
        for name, p in model.named_parameters():
            if gemma:
                p.normal_(0.0, 0.3 if "norm" in name else 0.15)
            elif "norm" in name or ".ln_" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p)) if name.endswith("weight") \
                    else p.normal_(0.0, 0.1)
            else:
                p.normal_(0.0, 0.15)
    return model


def _bf16_scale(model, dtype) -> None:
    """A bfloat16 Gemma multiplies its embeddings by sqrt(d) rounded to bfloat16 (the
    buffer cast to the weights' dtype); the float32 reference is given that scalar."""
    if model.config.model_type == GEMMA3 and dtype in ("bfloat16", torch.bfloat16):
        emb = model.model.embed_tokens
        emb.embed_scale.fill_(torch.tensor(emb.scalar_embed_scale).to(torch.bfloat16).float())


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    """(name, transformers' model in float32, tinygpt's model of the folder it saved)."""
    kind, tied, dtype, *more = CASES[request.param]
    sizes = more[0] if more and isinstance(more[0], dict) else {}
    folder = tmp_path_factory.mktemp(request.param)
    model = transformers.AutoModelForCausalLM.from_config(
        _config(kind, tied, *([] if sizes else more), **sizes), attn_implementation="eager")
    _widened(model.eval(), seed=len(request.param))
    model.to(dtype).save_pretrained(folder)
    shutil.copyfile(SHIPPED / "tokenizer.json", folder / "tokenizer.json")
    # the reference reads the file back in float32: a bf16 file's numbers widened, as
    # tinygpt computes with them (a model cast back with .float() would keep its rotary
    # frequencies rounded to bfloat16)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager").eval()
    _bf16_scale(model, dtype)
    return request.param, model, load_model(folder)


def _close(got, want, what):
    want = np.asarray(want, np.float64)
    err = np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max()
    assert err <= TOL, f"{what}: {err:.2e}"


def test_logits_and_every_blocks_input_match_transformers(pair):
    name, hf, ours = pair
    with torch.no_grad():
        out = hf(torch.tensor([IDS]), output_hidden_states=True)
    logits, values = record(ours.params, ours.config, np.array(IDS))
    _close(logits, out.logits[0], f"{name} logits")
    for i in range(ours.config.n_layer):
        _close(values[f"layers.{i}.resid_pre"], out.hidden_states[i][0], f"{name} block {i}")
    assert ours.config.model_type == hf.config.model_type


def test_gradients_of_a_logit_match_torch_autograd(pair):
    name, hf, ours = pair
    position, target = 7, 123
    hf.zero_grad()
    out = hf(torch.tensor([IDS]), output_hidden_states=True)
    out.hidden_states[1].retain_grad()
    out.logits[0, position, target].backward()
    rec_logits, values = record(ours.params, ours.config, np.array(IDS))
    dlogits = np.zeros_like(rec_logits)
    dlogits[position, target] = 1.0
    grads, dv = backward(ours.params, ours.config, values, dlogits, wrt_values=True)
    _close(dv["layers.1.resid_pre"], out.hidden_states[1].grad[0], f"{name} d resid_pre")
    if ours.config.model_type == GEMMA3:  # d(1 + w) = dw: Gemma's params_to_file takes the
        # 1 off each scale, so the gradients get it first
        grads = {n: g + 1 if is_norm_weight(n) else g for n, g in grads.items()}
    by_file = ours.family.params_to_file(grads, ours.config)
    # GPTNeoXForCausalLM's module is lm_head, though its file calls the tensor embed_out
    theirs = {("embed_out.weight" if n == "lm_head.weight" and "embed_out.weight" in by_file
               else n): p.grad for n, p in hf.named_parameters()}
    assert set(by_file) == set(theirs)
    for file_name, g in by_file.items():
        want = theirs[file_name].numpy()
        if np.abs(want).max() == 0:
            assert np.abs(g).max() == 0, file_name
            continue
        err = np.abs(g - want).max() / np.abs(want).max()
        assert err <= 1e-4, f"{name} {file_name}: {err:.2e}"


def test_greedy_generation_gives_transformers_tokens(pair):
    name, hf, ours = pair
    prompt = IDS[:5]
    with torch.no_grad():
        theirs = hf.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False,
                             pad_token_id=0, eos_token_id=None)[0, len(prompt):].tolist()
    steps = generate(ours.params, ours.config, prompt, 20, temperature=0.0,
                     rng=np.random.default_rng(0))
    assert [s.id for s in steps] == theirs, name


def test_a_folder_tinygpt_saves_loads_in_transformers_with_the_same_logits(pair, tmp_path):
    from tinygpt_cli.transformer.families import save_config

    name, _, ours = pair
    folder = tmp_path / "saved"
    save_params(ours.params, folder / "model.safetensors", ours.config, ours.family)
    save_config(ours.config, folder / "config.json")
    shutil.copyfile(SHIPPED / "tokenizer.json", folder / "tokenizer.json")
    back = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    said = json.loads((folder / "config.json").read_text())
    _bf16_scale(back, said.get("dtype"))
    with torch.no_grad():
        theirs = back.eval()(torch.tensor([IDS])).logits[0].numpy()
    _close(forward(ours.params, ours.config, np.array(IDS)), theirs, f"{name} saved")
    assert said["model_type"] == ours.config.model_type
    again = load_model(folder)
    assert again.config == ours.config
    for k, v in ours.params.items():  # Gemma's: each scale 1 + w back to itself through w
        assert np.array_equal(again.params[k], v), k


# ------------------------------------------------------------------ every command, every family

TEXT, OTHER = "Lily wanted to play with her", "Tom wanted to play with his"
COMMANDS = [
    ("encode", TEXT), ("embed", TEXT), ("attn", TEXT, "--all-heads"), ("mlp", TEXT),
    ("norm", TEXT), ("final-norm", TEXT), ("blocks", TEXT), ("logits", TEXT), ("probs", TEXT),
    ("sample", TEXT, "--seed", "1"), ("generate", "Lily", "--max-new-tokens", "3"),
    ("trace", TEXT, "--list"), ("trace", TEXT, "layers.1.q"), ("review", TEXT), ("map", TEXT),
    ("lens", TEXT), ("dla", TEXT), ("ablate", TEXT, "--layer", "0", "--head", "1"),
    ("attribute", TEXT), ("score", TEXT), ("heads", TEXT), ("neurons", TEXT),
    ("diff", TEXT, OTHER), ("info",), ("qk", TEXT, "--layer", "1", "--head", "2"),
    ("patch", TEXT, OTHER), ("circuit", TEXT, OTHER), ("pos", TEXT),
    ("generate", "Lily", "--max-new-tokens", "3", "--ablate", "layers.0.mlp_out"),
]
# what a family's block cannot answer yet (each says so in one line, exit 2)
NOT_YET: dict[str, set[str]] = {}
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
# a family's own values and the slower commands, on one model of it (slow)
OWN = {"gemma3-5to1-kv1": [
    ("trace", TEXT, "layers.1.ln1_post.out"), ("dla", TEXT, "--neurons"),
    ("steer", "--pos", EXAMPLES / "happy.txt", "--neg", EXAMPLES / "sad.txt", "-l", "1")]}


def test_every_command_runs_on_every_family_or_says_why_not_in_one_line(pair, capsys,
                                                                         monkeypatch):
    from cli_helpers import Runner, clean_env

    name, _, ours = pair
    clean_env(monkeypatch)
    monkeypatch.setenv("TINYGPT_WEIGHTS", str(ours.folder))
    cli = Runner(capsys, monkeypatch)
    for args in COMMANDS:
        r = cli(*args)
        if args[0] in NOT_YET.get(ours.config.model_type, ()):
            assert r.code == 2 and r.out == "" and len(r.err.splitlines()) == 1, (args, r)
            assert r.err.startswith("error: ") and "Traceback" not in r.err, (args, r)
        else:
            assert r.code == 0, (name, args, r.err[-2000:])


def test_qk_terms_sum_to_the_scores_on_every_family(pair):
    """The score split by part, each part's q and k through the frozen norm (and Qwen3's
    frozen per-head norm of q and k) and turned by its position: the terms add up to the
    pass's own scores."""
    from tinygpt_cli.analysis.qk import qk_attribution

    name, _, ours = pair
    _, values = record(ours.params, ours.config, np.array(IDS))
    r = qk_attribution(ours.params, ours.config, values, 1, 2, 9)
    seen = np.isfinite(r.scores)  # a local block masks the keys past its window
    window = ours.config.window(1)
    assert seen.sum() == (min(window, 10) if window else 10)
    np.testing.assert_allclose(r.terms.sum(axis=(0, 1))[seen], r.scores[seen], rtol=1e-4,
                               atol=1e-5)


def test_a_padded_vocabulary_keeps_its_rows_and_names_them_as_rows(pair):
    """The rows past the tokenizer's last token are the model's (its logits, argmax over
    them): they have no text, and say so where a view names a token."""
    name, _, ours = pair
    tok = ours.tokenizer
    if ours.config.vocab_size == tok.vocab_size:
        assert tok.n_rows == tok.vocab_size
        return
    assert tok.n_rows == ours.config.vocab_size == 4130 and tok.vocab_size == 4096
    assert tok.token_str(4100) == "<row 4100>" and tok.token_bytes(4100) == b""
    assert len(tok.token_strs) == 4130
    logits = forward(ours.params, ours.config, np.array(IDS))
    assert logits.shape[-1] == 4130


def test_direct_logit_attribution_rows_sum_to_the_logit_on_every_family(pair):
    """RMSNorm models divide each part by the run's rms with no centring and no bias row;
    every family's rows still add up to the logit."""
    from tinygpt_cli.analysis.dla import direct_logit_attribution
    from tinygpt_cli.transformer.trace import run_traced

    name, _, ours = pair
    tr = run_traced(ours.params, ours.config, np.array(IDS))
    r = direct_logit_attribution(tr, ours.params, ours.config, 5, 123, vs=77)
    assert r.total == pytest.approx(r.score, abs=1e-5 * max(1.0, abs(r.score))), name
    assert (r.labels[-1] == "ln_final.bias") == (ours.config.norm == "layer")
    if ours.config.norm == "rms":  # by hand: one part through the final RMSNorm
        labels, parts = tr.residual_parts(ours.params, 5)
        w = ours.params["ln_final.w"].astype(np.float64)
        rows = ours.params["unembed.W_U" if not ours.config.tied else "embed.W_E"]
        d = rows[123].astype(np.float64) - rows[77]
        k = labels.index("L1.mlp")
        by_hand = parts[k] / tr["ln_final.rms"][5, 0] @ (w * d)
        assert r.values[r.labels.index("L1.mlp")] == pytest.approx(by_hand, rel=1e-9)


@pytest.mark.slow
def test_a_familys_own_values_and_the_slower_commands_run(pair, capsys, monkeypatch):
    from cli_helpers import Runner, clean_env

    name, _, ours = pair
    if name not in OWN:
        pytest.skip("one model of a family is enough for these")
    clean_env(monkeypatch)
    monkeypatch.setenv("TINYGPT_WEIGHTS", str(ours.folder))
    cli = Runner(capsys, monkeypatch)
    for args in OWN[name]:
        r = cli(*args)
        assert r.code == 0, (name, args, r.err[-2000:])


# ------------------------------------------------------------------ Gemma 3's own


def _gemma3(pair):
    if pair[2].config.model_type != GEMMA3:
        pytest.skip("Gemma 3's own knobs")
    return pair


def test_gemma3_config_is_read_as_transformers_reads_it(pair):
    name, hf, ours = _gemma3(pair)
    c, h = ours.config, hf.config
    assert c.d_k == 8 != c.n_embd // c.n_head and c.kv_heads == h.num_key_value_heads
    assert c.windows == tuple(h.sliding_window if k == "sliding_attention" else 0
                              for k in h.layer_types)
    assert c.rotary_bases == tuple(THETAS[k] for k in h.layer_types)
    assert c.scale == pytest.approx(11 ** -0.5, rel=1e-15)
    assert c.embed_scale == float(hf.model.embed_tokens.embed_scale)  # bf16: 4.90625
    if name == "gemma3-5to1-kv1":
        assert [w == 0 for w in c.windows] == [False] * 5 + [True, False]


def test_gemma3_direct_logit_attribution_adds_up_through_the_norms_after_each_branch(pair):
    """Each part passes the norm after its branch with that norm's rms frozen at the run,
    then the final norm's: the rows add up to the logit difference, one row by hand, and
    each MLP row is its neurons' sum."""
    from tinygpt_cli.analysis.dla import direct_logit_attribution
    from tinygpt_cli.transformer.trace import run_traced

    name, _, ours = _gemma3(pair)
    p, c, at = ours.params, ours.config, 9
    tr = run_traced(p, c, np.array(IDS))
    r = direct_logit_attribution(tr, p, c, at, 123, vs=77, neurons=10_000)
    assert r.total == pytest.approx(r.score, abs=1e-5 * max(1.0, abs(r.score))), name
    rows = p["unembed.W_U" if not c.tied else "embed.W_E"].astype(np.float64)
    d = rows[123] - rows[77]
    last = c.n_layer - 1
    mlp = tr[f"layers.{last}.mlp_out"][at].astype(np.float64)
    post = mlp / tr[f"layers.{last}.ln2_post.rms"][at, 0] * p[f"layers.{last}.ln2_post.w"]
    by_hand = post / tr["ln_final.rms"][at, 0] @ (p["ln_final.w"] * d)
    assert r.values[r.labels.index(f"L{last}.mlp")] == pytest.approx(by_hand, rel=1e-9)
    for i in range(c.n_layer):  # every neuron kept: each MLP row is their sum
        mine = sum(n["value"] for n in r.neurons if n["layer"] == i)
        # (the row is the recorded float32 mlp_out; the neurons float64 products)
        assert mine == pytest.approx(r.values[r.labels.index(f"L{i}.mlp")], rel=1e-5, abs=1e-9)
