"""Steering: the --steer options of every command that runs a text, checked against a torch
forward pre-hook in Hugging Face `transformers`; `tinygpt steer` and its vector files."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_helpers import TEXT, assert_one_error_line

from tinygpt_cli.analysis import steer as st
from tinygpt_cli.files import write_atomically

STEER = ["--steer", "Lily was happy", "--steer-away", "Lily was sad", "--steer-layer", "1"]


def hf_model(folder):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(folder), attn_implementation="eager")
    hf.eval()
    return torch, hf


def hf_vector(torch, hf, tok, toward: str, away: str, layer: int) -> np.ndarray:
    """v from transformers' own hidden states (hidden_states[L] is the input of block L)."""
    def mean_input(text):
        with torch.no_grad():
            out = hf(torch.tensor([tok.encode(text)]), output_hidden_states=True)
        return out.hidden_states[layer][0].double().mean(0).numpy()
    return mean_input(toward) - mean_input(away)


def hf_steered_logits(torch, hf, ids, vector, layer, scale) -> np.ndarray:
    """The logits with scale * v added to block `layer`'s input by a forward pre-hook."""
    shift = torch.tensor(scale * vector, dtype=torch.float32)

    def pre_hook(module, args, kwargs):
        if args:
            return (args[0] + shift, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": kwargs["hidden_states"] + shift}

    handle = hf.transformer.h[layer].register_forward_pre_hook(pre_hook, with_kwargs=True)
    try:
        with torch.no_grad():
            return hf(torch.tensor([ids])).logits[0].numpy()
    finally:
        handle.remove()


def test_steer_equals_a_torch_pre_hook_in_transformers(cli, tiny):
    torch, hf = hf_model(tiny.folder)
    tok = tiny.model.tokenizer
    v = hf_vector(torch, hf, tok, "Lily was happy", "Lily was sad", 1)
    doc = cli("trace", TEXT, "logits", *STEER, "--steer-scale", "3", "--json").json()
    want = hf_steered_logits(torch, hf, tok.encode(TEXT), v, 1, 3.0)
    np.testing.assert_allclose(doc["data"], want, rtol=1e-5, atol=1e-5)
    plain = cli("trace", TEXT, "logits", "--json").json()
    assert np.abs(np.asarray(plain["data"]) - want).max() > 0.1  # the hook did something
    assert doc["steered"]["site"] == "layers.1.resid_pre"
    assert doc["steered"]["norm"] == pytest.approx(np.linalg.norm(v), rel=1e-5)
    assert "steered" not in plain


def test_steered_generation_equals_a_greedy_loop_in_transformers(cli, tiny):
    torch, hf = hf_model(tiny.folder)
    tok = tiny.model.tokenizer
    v = hf_vector(torch, hf, tok, "Lily was happy", "Lily was sad", 1)
    lines = cli("generate", TEXT, *STEER, "--steer-scale", "4", "-t", "0", "-n", "6",
                "--no-stop", "--json").ndjson()
    got = [line["id"] for line in lines if line["event"] == "token"]
    ids = tok.encode(TEXT)
    for _ in range(6):  # no cache: the whole text each step, the hook at every position
        ids.append(int(np.argmax(hf_steered_logits(torch, hf, ids, v, 1, 4.0)[-1])))
    assert got == ids[-6:]


def test_scale_zero_is_bit_identical_to_no_steering(cli):
    plain = cli("trace", TEXT, "layers.1.resid_post", "--json").json()
    zero = cli("trace", TEXT, "layers.1.resid_post", *STEER, "--steer-scale", "0", "--json")
    assert zero.json()["data"] == plain["data"]
    base = cli("generate", TEXT, "--seed", "3", "-n", "8", "--json").out
    same = cli("generate", TEXT, "--seed", "3", "-n", "8", *STEER, "--steer-scale", "0",
               "--json").out
    assert same == base


def test_steering_reaches_the_views_and_says_so(cli):
    r = cli("probs", TEXT, *STEER, "--steer-scale", "2", "-n", "3")
    assert r.code == 0
    assert "steered: layers.1.resid_pre + 2 * v, v = 'Lily was happy' - 'Lily was sad'" in r.err
    assert "steered" not in cli("probs", TEXT, "-n", "3").err


def test_a_saved_vector_steers_as_the_texts_do(cli, tiny, tmp_path):
    pair = [tiny.model.tokenizer.encode(t) for t in ("Lily was happy", "Lily was sad")]
    v = st.mean_difference(tiny.model.params, tiny.model.config, [tuple(pair)], 1)
    np.save(tmp_path / "v.npy", v)
    write_atomically(tmp_path / "v.safetensors",
                     st.direction_file(v, "layers.0.resid_post", "steer", {}))
    by_text = cli("trace", TEXT, "logits", *STEER, "--steer-scale", "2", "--json").json()
    by_npy = cli("trace", TEXT, "logits", "--steer-vector", tmp_path / "v.npy",
                 "--steer-layer", "1", "--steer-scale", "2", "--json").json()
    # the file's site, layers.0.resid_post, is the input of block 1: no --steer-layer needed
    by_file = cli("trace", TEXT, "logits", "--steer-vector", tmp_path / "v.safetensors",
                  "--steer-scale", "2", "--json").json()
    assert by_npy["data"] == by_text["data"] == by_file["data"]


def test_an_sae_decoder_row_is_a_vector(cli, tiny, tmp_path):
    from safetensors.numpy import save_file

    rows = np.random.default_rng(0).normal(size=(5, tiny.model.config.n_embd))
    save_file({"W_dec": rows.astype(np.float32)}, str(tmp_path / "sae.safetensors"),
              metadata={"site": "layers.1.resid_pre"})
    got = cli("trace", TEXT, "layers.1.resid_pre", "--steer-vector",
              f"{tmp_path}/sae.safetensors#3", "--json").json()
    plain = cli("trace", TEXT, "layers.1.resid_pre", "--json").json()
    np.testing.assert_allclose(np.asarray(got["data"]) - plain["data"],
                               np.broadcast_to(rows[3], np.shape(plain["data"])), atol=1e-5)


def bad_files(tmp):
    np.save(tmp / "wide.npy", np.zeros(7, np.float32))
    np.save(tmp / "nan.npy", np.full(16, np.nan, np.float32))
    (tmp / "junk.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    (tmp / "junk.npy").write_bytes(b"not an array")


ERRORS = [
    (["--steer", "a"], 2, "--steer needs --steer-away"),
    (["--steer-away", "a", "--steer-layer", "0"], 2, "--steer-away needs --steer"),
    (["--steer", "a", "--steer-away", "b"], 2, "--steer needs --steer-layer L"),
    (["--steer", "a", "--steer-away", "b", "--steer-layer", "5"], 2,
     "--steer-layer 5 is out of range"),
    (["--steer-scale", "2"], 2, "--steer-layer and --steer-scale need a direction"),
    (["--steer", "a", "--steer-away", "b", "--steer-layer", "0", "--steer-scale", "nan"], 2,
     "--steer-scale must be a finite number"),
    (["--steer-vector", "{tmp}/none.npy"], 2, "no such file"),
    (["--steer-vector", "{tmp}/wide.npy", "--steer-layer", "0"], 2,
     "shape [7]; this model's residual stream has 16 numbers"),
    (["--steer-vector", "{tmp}/wide.npy#x"], 2, "after '#' give a row number"),
    (["--steer-vector", "{tmp}/wide.npy#2"], 2, "#N picks a row of a 2-D tensor"),
    (["--steer-vector", "{tmp}/nan.npy", "--steer-layer", "0"], 1, "NaN or infinite"),
    (["--steer-vector", "{tmp}/junk.safetensors"], 1, "not a readable safetensors file"),
    (["--steer-vector", "{tmp}/junk.npy"], 1, "not a readable .npy file"),
    (["--steer-vector", "{tmp}/nan.npy"], 1, "NaN or infinite"),
]


@pytest.mark.parametrize(("argv", "code", "needle"), ERRORS, ids=[e[2] for e in ERRORS])
def test_bad_steering_is_one_error_line(cli, tmp_path, argv, code, needle):
    bad_files(tmp_path)
    r = cli("logits", TEXT, *[a.format(tmp=tmp_path) for a in argv])
    assert_one_error_line(r, code, needle)


def test_no_steering_options_on_commands_that_read_no_text(cli):
    r = cli("info", "--steer", "a")
    assert r.code == 2 and "No such option" in r.err
    assert "--steer-vector" in cli("generate", "--help").out
    assert json.loads(cli("logits", TEXT, "--json").out)["path"].startswith("logits")
