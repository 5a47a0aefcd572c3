"""Gemma 3's text model against transformers: small random Gemma3ForCausalLM models that
transformers makes and saves, at odd sizes (heads of 8 numbers in a stream of 24 on 4 heads,
one and two key/value heads, a sliding window shorter than the text, the 5:1 pattern of
sliding and full blocks over 7 blocks, each kind with its own rotary base, a
query_pre_attn_scalar that is not the head size, tied and untied heads, a bfloat16 file),
loaded by tinygpt: logits and every block's input, gradients against torch autograd, greedy
generation, the folder tinygpt saves loading back in transformers, and which commands run."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from tinygpt_cli.storage.locations import SHIPPED
from tinygpt_cli.transformer.families import config_from_dict, config_to_dict
from tinygpt_cli.transformer.folder import load_model, save_params
from tinygpt_cli.transformer.generate import generate
from tinygpt_cli.transformer.model import backward, forward, record
from tinygpt_cli.transformer.schema import is_norm_weight

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

IDS = [5, 300, 17, 900, 42, 8, 1000, 77, 3, 64, 5, 300]  # longer than every window
TOL = 1e-5  # relative to the largest value compared
THETAS = {"sliding_attention": 50.0, "full_attention": 3000.0}  # far apart: a wrong one shows


def _config(n_layer: int, kv: int, tied: bool, window: int, layer_types=None):
    return transformers.Gemma3TextConfig(
        vocab_size=4096, hidden_size=24, intermediate_size=40, num_hidden_layers=n_layer,
        num_attention_heads=4, num_key_value_heads=kv, head_dim=8, query_pre_attn_scalar=11,
        sliding_window=window, layer_types=layer_types, max_position_embeddings=64,
        tie_word_embeddings=tied, bos_token_id=2, eos_token_id=1, pad_token_id=0,
        rope_parameters={k: {"rope_type": "default", "rope_theta": v}
                         for k, v in THETAS.items()})


CASES = {  # name: (blocks, key/value heads, tied head, window, layer types, file dtype)
    "5to1-kv1": (7, 1, True, 3, None, "float32"),  # the default pattern: block 5 full
    "kv2-untied": (2, 2, False, 5, ["full_attention", "sliding_attention"], "float32"),
    "kv2-bf16": (3, 2, True, 4, None, "bfloat16"),
}


def _widened(model, seed: int):
    """Weights far from initialisation: each norm's w (its scale 1 + w) N(0, 0.3), the
    rest N(0, 0.15)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.3 if "norm" in name else 0.15)
    return model


def _bf16_scale(model, dtype: str) -> None:
    """A bfloat16 Gemma multiplies its embeddings by sqrt(d) rounded to bfloat16 (the
    buffer cast to the weights' dtype); the float32 reference is given that scalar."""
    if dtype == "bfloat16":
        emb = model.model.embed_tokens
        emb.embed_scale.fill_(torch.tensor(emb.scalar_embed_scale).to(torch.bfloat16).float())


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    """(name, transformers' model in float32, tinygpt's model of the folder it saved)."""
    n_layer, kv, tied, window, kinds, dtype = CASES[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    model = transformers.Gemma3ForCausalLM(_config(n_layer, kv, tied, window, kinds))
    _widened(model.eval(), seed=len(request.param))
    model.to(getattr(torch, dtype)).save_pretrained(folder)
    shutil.copyfile(SHIPPED / "tokenizer.json", folder / "tokenizer.json")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager").eval()
    _bf16_scale(model, dtype)
    return request.param, model, load_model(folder)


def _close(got, want, what) -> float:
    want = np.asarray(want, np.float64)
    err = np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max()
    assert err <= TOL, f"{what}: {err:.2e}"
    return err


def test_the_config_is_read_as_transformers_reads_it(pair):
    name, hf, ours = pair
    c, h = ours.config, hf.config
    assert c.model_type == "gemma3_text" and c.d_k == 8 and c.kv_heads == h.num_key_value_heads
    assert c.windows == tuple(h.sliding_window if k == "sliding_attention" else 0
                              for k in h.layer_types)
    assert c.rotary_bases == tuple(THETAS[k] for k in h.layer_types)
    assert c.scale == pytest.approx(11 ** -0.5, rel=1e-15)
    assert c.embed_scale == float(hf.model.embed_tokens.embed_scale)  # bf16: 4.90625
    if name == "5to1-kv1":
        assert [w == 0 for w in c.windows] == [False] * 5 + [True, False]


def test_logits_and_every_blocks_input_match_transformers(pair):
    name, hf, ours = pair
    with torch.no_grad():
        out = hf(torch.tensor([IDS]), output_hidden_states=True)
    logits, values = record(ours.params, ours.config, np.array(IDS))
    _close(logits, out.logits[0], f"{name} logits")
    for i in range(ours.config.n_layer):
        _close(values[f"layers.{i}.resid_pre"], out.hidden_states[i][0], f"{name} block {i}")


def test_gradients_match_torch_autograd(pair):
    from tinygpt_cli.transformer.families import family

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
    # d(1 + w) = dw: params_to_file takes the 1 off each scale, so the gradients get it first
    by_file = family("gemma3_text").params_to_file(
        {n: g + 1 if is_norm_weight(n) else g for n, g in grads.items()}, ours.config)
    theirs = {n: p.grad for n, p in hf.named_parameters()}
    assert set(by_file) == set(theirs)
    for file_name, g in by_file.items():
        want = theirs[file_name].numpy()
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
    save_params(ours.params, folder / "model.safetensors", ours.config)
    save_config(ours.config, folder / "config.json")
    shutil.copyfile(SHIPPED / "tokenizer.json", folder / "tokenizer.json")
    back = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    said = json.loads((folder / "config.json").read_text())
    _bf16_scale(back, said["dtype"])
    with torch.no_grad():
        theirs = back.eval()(torch.tensor([IDS])).logits[0].numpy()
    _close(forward(ours.params, ours.config, np.array(IDS)), theirs, f"{name} saved")
    again = load_model(folder)
    assert again.config == ours.config
    for k, v in ours.params.items():  # each scale 1 + w back to itself through w
        assert np.array_equal(again.params[k], v), k


def test_the_embedding_scale_is_sqrt_d_as_each_dtype_rounds_it():
    from tinygpt_cli.transformer.families.gemma3 import rounded

    for d in (24, 640, 1152, 2304, 3072):
        for dtype in ("float32", "bfloat16", "float16"):
            want = float(torch.tensor(math.sqrt(d)).to(getattr(torch, dtype)).float())
            assert rounded(math.sqrt(d), dtype) == want, (d, dtype)
    assert rounded(math.sqrt(3072), "bfloat16") == 55.5  # transformers' own comment's case


# ------------------------------------------------------------------ refused by name


@pytest.mark.parametrize("change, message", [
    ({"final_logit_softcapping": 30.0}, "final_logit_softcapping 30.0 is not implemented"),
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping 50.0 is not implemented"),
    ({"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0}}},
     "rope scaling 'linear' on the full attention blocks is not implemented"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 8.0}}, "rope scaling 'yarn'"),
    ({"hidden_activation": "gelu"}, "hidden_activation 'gelu' is not implemented"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention True"),
    ({"model_type": "gemma3"}, "model_type 'gemma3' is Gemma 3 with its vision tower"),
    ({"layer_types": ["sliding_attention", "chunked_attention"]}, "layer_types must name"),
])
def test_what_is_not_implemented_is_refused_by_name(change, message):

    d = {"model_type": "gemma3_text", "hidden_size": 24, "num_attention_heads": 4,
         "num_hidden_layers": 2, "intermediate_size": 40, "vocab_size": 4096} | change
    with pytest.raises(ValueError, match=message):
        config_from_dict(d)


# ------------------------------------------------------------------ the commands

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TEXT, OTHER = "Lily wanted to play with her", "Tom wanted to play with his"
RUNS = [
    ("encode", TEXT), ("embed", TEXT), ("attn", TEXT, "--all-heads"), ("mlp", TEXT),
    ("norm", TEXT), ("final-norm", TEXT), ("blocks", TEXT), ("logits", TEXT), ("probs", TEXT),
    ("generate", "Lily", "--max-new-tokens", "3"), ("trace", TEXT, "layers.1.ln1_post.out"),
    ("lens", TEXT), ("ablate", TEXT, "--layer", "0", "--head", "1"), ("attribute", TEXT),
    ("score", TEXT), ("heads", TEXT), ("diff", TEXT, OTHER), ("info",), ("patch", TEXT, OTHER),
    ("steer", "--pos", EXAMPLES / "happy.txt", "--neg", EXAMPLES / "sad.txt", "-l", "1"),
    ("generate", "Lily", "--max-new-tokens", "3", "--ablate", "layers.0.mlp_out"),
    ("dla", TEXT, "--neurons"), ("circuit", TEXT, OTHER), ("neurons", TEXT),
    ("qk", TEXT, "--layer", "1", "--head", "2"), ("review", TEXT), ("map", TEXT),
]
REFUSED: list = []  # every analysis that reads the block's parts handles Gemma 3 now


@pytest.mark.slow
def test_the_forward_commands_run_and_the_part_readers_refuse_by_name(pair, capsys,
                                                                        monkeypatch):
    from cli_helpers import Runner, clean_env

    name, _, ours = pair
    if name != "5to1-kv1":
        pytest.skip("one model is enough for the commands")
    clean_env(monkeypatch)
    monkeypatch.setenv("TINYGPT_WEIGHTS", str(ours.folder))
    cli = Runner(capsys, monkeypatch)
    for args in RUNS:
        r = cli(*args)
        assert r.code == 0, (args, r.err[-2000:])
    for args in REFUSED:
        r = cli(*args)
        assert r.code == 2 and r.out == "" and len(r.err.splitlines()) == 1, (args, r)
        assert r.err.startswith(f"error: {args[0]} is not available for this gemma3_text "
                                "model: its block has a step 'norm after attention'"), r.err


def test_direct_logit_attribution_adds_up_through_the_norms_after_each_branch(pair):
    """Each part passes the norm after its branch with that norm's rms frozen at the run,
    then the final norm's: the rows add up to the logit difference, one row by hand, and
    each MLP row is its neurons' sum."""
    from tinygpt_cli.analysis.dla import direct_logit_attribution
    from tinygpt_cli.transformer.trace import run_traced

    name, _, ours = pair
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


def test_train_arch_gemma3_makes_a_model_transformers_reads_as_gemma3(tmp_path):
    """`train --arch gemma3`'s config and a new model of it, saved, give transformers'
    Gemma3ForCausalLM the same logits (its norms' w = scale - 1 = 0 at initialisation, as
    Gemma's own)."""
    from tinygpt_cli.jobs.train.loop import arch_config
    from tinygpt_cli.transformer.families import load_config, save_config
    from tinygpt_cli.transformer.model import init_params

    config = arch_config("gemma3", n_embd=24, n_layer=7, n_head=4, n_inner=40,
                         vocab_size=4096, n_positions=16)
    assert config.windows == (8,) * 5 + (0, 8)
    params = init_params(config, np.random.default_rng(0))
    folder = tmp_path / "new"
    save_params(params, folder / "model.safetensors", config)
    save_config(config, folder / "config.json")
    assert load_config(folder / "config.json") == config
    back = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert type(back).__name__ == "Gemma3ForCausalLM"
    assert all(float(p.detach().abs().max()) == 0 for n, p in back.named_parameters()
               if "norm" in n)
    with torch.no_grad():
        theirs = back.eval()(torch.tensor([IDS])).logits[0].numpy()
    _close(forward(params, config, np.array(IDS)), theirs, "train --arch gemma3")


def test_a_hub_style_config_is_read_as_transformers_reads_it():
    """Gemma 3 270M's config.json as the hub ships it (the older keys: rope_theta,
    rope_local_base_freq, rope_scaling null, torch_dtype bfloat16), against
    Gemma3TextConfig's reading of the same keys."""

    d = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
         "hidden_size": 640, "intermediate_size": 2048, "num_hidden_layers": 18,
         "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
         "vocab_size": 262144, "max_position_embeddings": 32768, "rms_norm_eps": 1e-06,
         "query_pre_attn_scalar": 256, "sliding_window": 512, "_sliding_window_pattern": 6,
         "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "rope_scaling": None,
         "hidden_activation": "gelu_pytorch_tanh", "attn_logit_softcapping": None,
         "final_logit_softcapping": None, "torch_dtype": "bfloat16", "bos_token_id": 2,
         "eos_token_id": 1, "pad_token_id": 0, "tie_word_embeddings": True,
         "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                         for i in range(18)]}
    ours = config_from_dict(d)
    theirs = transformers.Gemma3TextConfig.from_dict(d)
    bases = tuple(theirs.rope_parameters[k]["rope_theta"] for k in theirs.layer_types)
    assert ours.rotary_bases == bases and sorted(set(bases)) == [10000.0, 1000000.0]
    assert ours.windows == tuple(512 if k == "sliding_attention" else 0
                                 for k in theirs.layer_types)
    assert ours.embed_scale == 25.25  # sqrt(640) = 25.298 in bfloat16
    assert ours.scale == 256 ** -0.5 and ours.d_k == 256 and ours.kv_heads == 1
    assert config_from_dict(config_to_dict(ours)) == ours
