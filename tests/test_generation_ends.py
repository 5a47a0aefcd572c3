"""Generation ends where the model says: at every end id of generation_config.json (one or a
list) and at the tokenizer's eos_token, naming the one it met; --no-stop goes on. The model is
made so that greedy generation writes one ordinary token twice, then <|im_end|>: its learned
positions dominate the stream, along one direction up to a position and another after it, and
the tied table's rows of the two tokens point along them. transformers' greedy generate on
the same folder stops at the same place."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_helpers import random_params
from shipped_tokenizers import smollm2

from tinygpt_cli.transformer.config import Config
from tinygpt_cli.transformer.families import save_config
from tinygpt_cli.transformer.folder import load_model, save_params

PROMPT = "Hi there"


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(folder maker, prompt length, the ordinary token, the end token)."""
    tokenizer_json, settings = smollm2()
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer_json)
    n, end, word = (tok.get_vocab_size(), tok.token_to_id("<|im_end|>"),
                    tok.token_to_id("\u0120the"))  # " the"
    T = len(tok.encode(PROMPT).ids)
    config = Config(n_embd=16, n_layer=2, n_head=2, n_inner=24, vocab_size=n, n_positions=32)
    params = random_params(config, seed=5)
    e1, e2 = np.eye(16, dtype=np.float32)[1], np.eye(16, dtype=np.float32)[2]
    params["embed.W_pos"][:T + 1] = 1000 * e1  # predicting the 1st and 2nd new token
    params["embed.W_pos"][T + 1:] = 1000 * e2  # the 3rd and on
    params["embed.W_E"][word], params["embed.W_E"][end] = 30 * e1, 30 * e2

    def folder(name: str, generation: dict | None, with_settings: bool = True):
        root = tmp_path_factory.mktemp(name)
        save_params(params, root / "model.safetensors", config)
        save_config(config, root / "config.json")
        (root / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
        if with_settings:
            (root / "tokenizer_config.json").write_text(json.dumps(settings), encoding="utf-8")
        if generation is not None:
            (root / "generation_config.json").write_text(json.dumps(generation),
                                                         encoding="utf-8")
        return root

    return folder, T, word, end


def test_generation_stops_at_an_end_id_of_generation_config_and_says_which(made, cli):
    folder, _, word, end = made
    root = folder("two_ends", {"eos_token_id": [0, end]}, with_settings=False)
    assert load_model(root).tokenizer.stop_ids == (0, end)
    r = cli("generate", PROMPT, "-t", "0", "-n", "6", "--json", "--weights", root)
    _, *steps, last = r.ndjson()
    assert [s["id"] for s in steps] == [word, word, end]
    assert last["stop"] == "endoftext" and last["stop_token"] == "<|im_end|>"
    assert last["data"] == PROMPT + " the the"  # the end token is not part of the text
    r = cli("generate", PROMPT, "-t", "0", "-n", "6", "--weights", root)
    assert r.out == PROMPT + " the the\n"
    assert "(3 new tokens; stopped at <|im_end|>)" in r.err
    r = cli("generate", PROMPT, "-t", "0", "-n", "5", "--no-stop", "--json", "--weights", root)
    _, *steps, last = r.ndjson()
    assert [s["id"] for s in steps] == [word, word, end, end, end]
    assert last["stop"] == "max_new_tokens"


def test_the_tokenizers_eos_ends_generation_too_and_nothing_else_does(made, cli):
    folder, _, word, end = made
    named = folder("named", None)  # tokenizer_config.json's eos_token is <|im_end|>
    assert load_model(named).tokenizer.stop_ids == (0, end)  # config.json's 0, and it
    r = cli("generate", PROMPT, "-t", "0", "-n", "6", "--json", "--weights", named)
    assert [s["id"] for s in r.ndjson()[1:-1]] == [word, word, end]
    bare = folder("bare", {"eos_token_id": 0}, with_settings=False)
    r = cli("generate", PROMPT, "-t", "0", "-n", "4", "--json", "--weights", bare)
    assert [s["id"] for s in r.ndjson()[1:-1]] == [word, word, end, end]
    assert r.ndjson()[-1]["stop"] == "max_new_tokens"


def test_transformers_greedy_generate_stops_at_the_same_token(made):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    folder, _, word, end = made
    root = folder("hf", {"eos_token_id": [0, end]}, with_settings=False)
    model = transformers.GPT2LMHeadModel.from_pretrained(str(root))
    ids = load_model(root).tokenizer.text_ids(PROMPT)
    out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=6,
                         attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         pad_token_id=0)
    assert out[0, len(ids):].tolist() == [word, word, end]


def test_without_generation_config_the_list_of_config_json_is_read(made, cli):
    folder, _, word, end = made
    root = folder("config_list", None, with_settings=False)
    config = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(json.dumps({**config, "eos_token_id": [0, end]}))
    assert load_model(root).tokenizer.stop_ids == (0, end)
    r = cli("generate", PROMPT, "-t", "0", "-n", "6", "--json", "--weights", root)
    assert [s["id"] for s in r.ndjson()[1:-1]] == [word, word, end]
