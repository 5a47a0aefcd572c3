"""Steering: the --steer options of every command that runs a text, checked against a torch
forward pre-hook in Hugging Face `transformers`; `tinygpt steer` and its vector files."""

from __future__ import annotations

import contextlib
import json

import numpy as np
import pytest
from cli_helpers import TEXT, assert_one_error_line

from tinygpt_cli.analysis import steer as st
from tinygpt_cli.jobs.dictionaries import directions as DF
from tinygpt_cli.storage.files import write_atomically

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


@contextlib.contextmanager
def hf_steering(torch, hf, vector, layer, scale):
    """transformers with scale * v added to block `layer`'s input by a forward pre-hook, for
    the length of the block (no gradients)."""
    shift = torch.tensor(scale * vector, dtype=torch.float32)

    def pre_hook(module, args, kwargs):
        if args:
            return (args[0] + shift, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": kwargs["hidden_states"] + shift}

    handle = hf.transformer.h[layer].register_forward_pre_hook(pre_hook, with_kwargs=True)
    try:
        with torch.no_grad():
            yield hf
    finally:
        handle.remove()


def hf_steered_logits(torch, hf, ids, vector, layer, scale) -> np.ndarray:
    """The logits with scale * v added to block `layer`'s input by a forward pre-hook."""
    with hf_steering(torch, hf, vector, layer, scale):
        return hf(torch.tensor([ids])).logits[0].numpy()


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
    # said once the work is done, so that an error is still the only line
    assert_one_error_line(cli("probs", TEXT, *STEER, "--position", "99"), 2, "position")


def test_a_saved_vector_steers_as_the_texts_do(cli, tiny, tmp_path):
    pair = [tiny.model.tokenizer.encode(t) for t in ("Lily was happy", "Lily was sad")]
    v = st.mean_difference(tiny.model.params, tiny.model.config, [tuple(pair)], 1)
    np.save(tmp_path / "v.npy", v)
    write_atomically(tmp_path / "v.safetensors",
                     DF.direction_file(v, "layers.0.resid_post", "steer", {}))
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


# ------------------------------------------------------------------ tinygpt steer

POS = ["The day was happy", "Lily felt happy", "Tom was very happy", "The dog was happy",
       "Mom was happy", "She was glad and happy"]
NEG = [t.replace("happy", "sad") for t in POS]


@pytest.fixture
def pairs(tmp_path):
    (tmp_path / "pos.txt").write_text("\n".join(POS) + "\n")
    # JSON lines work too, and may be mixed with plain ones
    (tmp_path / "neg.txt").write_text("\n".join(json.dumps({"text": t}) if i % 2 else t
                                                for i, t in enumerate(NEG)) + "\n")
    data = tmp_path / "data"
    data.mkdir()
    (data / "part-005.txt").write_text("Tom had a red ball.\n<|endoftext|>\nThe sun was hot "
                                       "and Sue was glad.\n<|endoftext|>\nA cat sat.\n")
    return tmp_path


def steer_args(tmp, *more):
    return ["steer", "--pos", tmp / "pos.txt", "--neg", tmp / "neg.txt", "--layer", "1",
            "--scale", "2", "--data", tmp / "data", *more]


def test_steer_reports_what_transformers_computes(cli, tiny, pairs):
    torch, hf = hf_model(tiny.folder)
    tok = tiny.model.tokenizer
    doc = cli(*steer_args(pairs, "--json")).json()
    train, held = doc["train_pairs"], doc["held_out_pairs"]
    assert sorted(train + held) == list(range(1, 7)) and len(held) == 2
    v = np.mean([hf_vector(torch, hf, tok, POS[i - 1], NEG[i - 1], 1) for i in train], axis=0)
    np.testing.assert_allclose(doc["vector"], v, rtol=1e-5, atol=1e-6)
    assert doc["scales"] == [0.0, 0.5, 1.0, 1.5, 2.0]
    for p, line in zip(doc["prompts"], held, strict=True):
        ids = tok.encode(POS[line - 1])
        target, vs = ids[-1], tok.encode(NEG[line - 1])[-1]  # the texts part at the last word
        assert (p["ids"], p["target"], p["vs"]) == (ids[:-1], target, vs)
        diffs = [float(np.diff(hf_steered_logits(torch, hf, ids[:-1], v, 1, c)[-1][[vs, target]])
                       [0]) for c in doc["scales"]]
        np.testing.assert_allclose(p["diffs"], diffs, rtol=1e-4, atol=1e-4)
        assert p["slope"] == pytest.approx(np.polyfit(doc["scales"], diffs, 1)[0], abs=1e-4)
    assert doc["wrong_way"] == np.mean([p["slope"] < 0 for p in doc["prompts"]])
    stories = [[tok.eot_id] + tok.encode(s) for s in
               ("Tom had a red ball.", "The sun was hot and Sue was glad.", "A cat sat.")]

    def loss(scale):
        nll = [-torch.log_softmax(torch.tensor(hf_steered_logits(torch, hf, s[:-1], v, 1, scale),
                                               dtype=torch.float64), -1)[range(len(s) - 1),
                                                                          s[1:]].numpy()
               for s in stories]
        return np.concatenate(nll).mean()
    assert doc["loss_before"] == pytest.approx(loss(0.0), abs=1e-5)
    assert doc["loss_after"] == pytest.approx(loss(2.0), abs=1e-5)
    assert doc["loss_tokens"] == sum(len(s) - 1 for s in stories)


def test_steer_vectors_are_deterministic_and_steer(cli, pairs):
    a, b = pairs / "a.safetensors", pairs / "b.safetensors"
    assert cli(*steer_args(pairs, "--out", a)).code == 0
    assert cli(*steer_args(pairs, "--out", b, "--json")).code == 0
    assert a.read_bytes() == b.read_bytes()
    r = cli(*steer_args(pairs, "--out", a))
    assert_one_error_line(r, 2, f"--out {a}: the file exists; add --force")
    assert cli(*steer_args(pairs, "--out", a, "--force", "--seed", "2")).code == 0
    assert a.read_bytes() != b.read_bytes()  # another split, another vector
    vector = cli(*steer_args(pairs, "--json")).json()["vector"]
    steered = cli("trace", TEXT, "layers.1.resid_pre", "--steer-vector", b, "--steer-scale",
                  "3", "--json").json()  # the file names its site: no --steer-layer
    plain = cli("trace", TEXT, "layers.1.resid_pre", "--json").json()
    np.testing.assert_allclose(np.subtract(steered["data"], plain["data"]),
                               np.broadcast_to(3 * np.asarray(vector), np.shape(plain["data"])),
                               atol=1e-5)


def test_steer_view_fits_80_columns(cli, pairs, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    out = cli(*steer_args(pairs)).out
    assert "wrong way" in out and "loss on part-005" in out
    assert max(len(line) for line in out.splitlines()) <= 80


STEER_ERRORS = [
    (lambda t: (t / "neg.txt").write_text("a\n"), [], 2,
     "--pos holds 6 texts and --neg 1: text i of one pairs with text i of the other"),
    (lambda t: (t / "pos.txt").write_bytes(b"caf\xe9\n"), [], 2,
     "--pos", "not UTF-8 text (byte 0xe9 at offset 3)"),
    (lambda t: (t / "pos.txt").write_text('{"text": 3}\n'), [], 2,
     '--pos line 1: a JSON line must be a text or {"text": "..."}'),
    (lambda t: (t / "pos.txt").unlink(), [], 2, "pos.txt: no such file"),
    (lambda t: [(t / n).write_text("Happy day\nLily\n") for n in ("pos.txt", "neg.txt")],
     ["--held-out", "0.9"], 2, "pair", "the two texts do not part"),
    (lambda t: None, ["--out", "{tmp}"], 2, "that is a folder"),
    (lambda t: (t / "data" / "part-005.txt").unlink(), [], 2, "no part-005.txt there"),
]


@pytest.mark.parametrize(("setup", "more", "code", "needles"),
                         [(e[0], e[1], e[2], e[3:]) for e in STEER_ERRORS],
                         ids=[e[-1] for e in STEER_ERRORS])
def test_bad_steer_input_is_one_error_line(cli, pairs, setup, more, code, needles):
    setup(pairs)
    r = cli(*steer_args(pairs, *[m.format(tmp=pairs) for m in more]))
    assert_one_error_line(r, code, *needles)


@pytest.mark.parametrize(("more", "needle"), [
    (["--scale", "0"], "--scale must be a number above 0, got 0.0"),
    (["--scale", "nan"], "--scale must be a number above 0"),
    (["--seed", "-1"], "--seed must be a whole number of 0 or more"),
])
def test_bad_steer_options_are_one_error_line(cli, pairs, more, needle):
    assert_one_error_line(cli(*steer_args(pairs), *more), 2, needle)


@pytest.mark.parametrize("command", ["embed", "pos", "norm", "attn", "mlp", "blocks",
                                     "final-norm", "logits", "probs", "sample", "generate",
                                     "trace", "review", "map"])
def test_every_command_that_runs_a_text_takes_the_steering_options(cli, command):
    out = cli(command, "--help").out
    for option in ("--steer ", "--steer-away", "--steer-vector", "--steer-layer",
                   "--steer-scale"):
        assert option in out, (command, option)
