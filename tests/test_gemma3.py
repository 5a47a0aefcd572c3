"""Gemma 3's config and knobs, without a model pair: the embedding scale as each dtype rounds
it, what is not implemented refused by name, `train --arch gemma3`'s new model read by
transformers, and the hub's own config.json read as transformers reads it. Gemma 3's models
against transformers (logits, gradients, generation, saving, the commands, at odd sizes, the
5:1 pattern, windows, a bfloat16 file) are one family among the others in
tests/test_families_hf.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tinygpt_cli.transformer.families import config_from_dict, config_to_dict
from tinygpt_cli.transformer.folder import save_params
from tinygpt_cli.transformer.model import forward

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

IDS = [5, 300, 17, 900, 42, 8, 1000, 77, 3, 64, 5, 300]
TOL = 1e-5  # relative to the largest value compared


def _close(got, want, what) -> float:
    want = np.asarray(want, np.float64)
    err = np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max()
    assert err <= TOL, f"{what}: {err:.2e}"
    return err


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
