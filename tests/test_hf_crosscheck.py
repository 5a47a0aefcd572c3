"""A weights folder we write loads unchanged in Hugging Face `transformers`, and its GPT-2
computes the same logits, attention patterns and hidden states as our trace."""

from __future__ import annotations

import numpy as np
import pytest
from cli_helpers import file_tensors

from tinygpt_cli.transformer.folder import load_model
from tinygpt_cli.transformer.trace import run_traced

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = dict(rtol=1e-4, atol=1e-4)
TEXT = "Lily wanted to play with her red ball. The dog ran!"


@pytest.fixture
def both(tiny_folder):
    hf = transformers.GPT2LMHeadModel.from_pretrained(
        str(tiny_folder.folder), attn_implementation="eager"
    )
    hf.eval()
    ours = load_model(tiny_folder.folder)
    ids = ours.tokenizer.encode(TEXT)
    assert 5 < len(ids) <= ours.config.n_positions
    return hf, ours, np.array(ids)


def test_logits_and_attentions_match_transformers(both):
    hf, ours, ids = both
    with torch.no_grad():
        out = hf(torch.tensor(ids[None, :]), output_attentions=True, output_hidden_states=True)
    traced = run_traced(ours.params, ours.config, ids)
    np.testing.assert_allclose(out.logits[0].numpy(), traced.get("logits"), **TOL)
    assert len(out.attentions) == ours.config.n_layer
    for layer, pattern in enumerate(out.attentions):
        np.testing.assert_allclose(pattern[0].numpy(), traced.get(f"layers.{layer}.weights"), **TOL)
        for head in range(ours.config.n_head):
            np.testing.assert_allclose(
                pattern[0, head].numpy(), traced.get(f"layers[{layer}].heads[{head}].weights"),
                **TOL,
            )
    hidden = out.hidden_states  # embeddings, each block's input, then ln_f of the last output
    np.testing.assert_allclose(hidden[0][0].numpy(), traced.get("embeddings"), **TOL)
    for layer in range(ours.config.n_layer):
        np.testing.assert_allclose(hidden[layer][0].numpy(),
                                   traced.get(f"layers.{layer}.resid_pre"), **TOL)
    np.testing.assert_allclose(hidden[-1][0].numpy(), traced.get("ln_final.out"), **TOL)


def test_transformers_reads_our_tensors_and_ties_the_head(both, tiny_folder):
    hf, _, _ = both
    state = {k: v.numpy() for k, v in hf.state_dict().items()}
    for name, value in file_tensors(tiny_folder.params).items():
        np.testing.assert_array_equal(state[name], value.astype(np.float32))
    np.testing.assert_array_equal(state["lm_head.weight"], state["transformer.wte.weight"])


def test_transformers_tokenizer_reads_our_tokenizer(both, tiny_folder):
    _, ours, ids = both
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tiny_folder.folder / "tokenizer.json")
    )
    assert fast(TEXT)["input_ids"] == ids.tolist()
    assert fast.decode(ids.tolist()) == TEXT
