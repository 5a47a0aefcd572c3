"""The CLI's output contract, through the real entry point `tinygpt_cli.cli.main`.

--json documents are compared with an independent forward pass on the same weights; the human
views are checked for their header line, token-labelled rows and literal text. A tiny random
model with the shipped tokenizer keeps every call in milliseconds; a few tests at the end run
on the shipped weights and check properties only, since those weights will be retrained.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import typer
from cli_helpers import (
    TEXT,
    TEXT_IDS,
    TINY,
    Runner,
    assert_one_error_line,
    clean_env,
    make_tiny,
    random_params,
    write_folder,
)
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tinygpt_cli.cli import app
from tinygpt_cli.cli.app import _register
from tinygpt_cli.render.text import show_text, show_token
from tinygpt_cli.storage.locations import SHIPPED
from tinygpt_cli.transformer.families import load_config
from tinygpt_cli.transformer.folder import load_model
from tinygpt_cli.transformer.sampling import create_rng, probabilities, sample
from tinygpt_cli.transformer.trace import run_traced


@pytest.fixture(scope="module")
def tr(tiny):
    """The independent forward pass on the text every test uses."""
    return tiny.trace(TEXT_IDS)


def tokens_of(tiny, ids):
    return [tiny.model.tokenizer.token_str(i) for i in ids]


def tokens_of_text():
    return ["Lily", "␣wanted", "␣to", "␣play", "␣with", "␣her"]


def floats(data) -> np.ndarray:
    """JSON data back to an array, null (masked) as NaN."""
    return np.array(data, dtype=object).astype(float) if data is not None else None


def ok_json(result) -> dict:
    assert result.code == 0, result.err
    doc = result.json()  # the whole of stdout is one document
    assert {"shape", "dtype", "data"} <= doc.keys()
    return doc


# ------------------------------------------------------------------ --json for every command

TEXT_COMMANDS = [
    ["encode"], ["embed"], ["pos"], ["pos", "--sum"], ["norm"], ["norm", "--which", "ln2"],
    ["attn"], ["attn", "--all-heads"], ["attn", "--scores"], ["mlp"], ["blocks"],
    ["final-norm"], ["logits"], ["probs"], ["sample"], ["trace", "-", "logits"],
    ["trace", "-", "--list"], ["review"], ["map"],
]


@pytest.mark.parametrize("args", TEXT_COMMANDS, ids=" ".join)
def test_json_is_one_document_with_shape_dtype_data_ids_tokens(cli, tiny, args):
    # `trace -` reads the text from stdin; the others take it as the argument.
    if args[0] == "trace":
        r = cli(*args, "--json", stdin=TEXT)
    else:
        r = cli(args[0], TEXT, *args[1:], "--json")
    doc = ok_json(r)
    assert r.err == ""
    assert doc["ids"] == TEXT_IDS
    assert doc["tokens"] == tokens_of(tiny, TEXT_IDS)
    assert isinstance(doc["dtype"], str)
    data = doc["data"]
    assert list(np.shape(np.array(data, dtype=object))) == doc["shape"]


def test_json_info_and_decode(cli, tiny):
    doc = ok_json(cli("info", "--json"))
    assert doc["shape"] == [] and doc["dtype"] == "int64"
    assert doc["data"] == doc["parameters"]["total"]
    doc = ok_json(cli("decode", *TEXT_IDS, "--json"))
    assert doc == {"shape": [], "dtype": "str", "data": TEXT, "ids": TEXT_IDS,
                   "tokens": tokens_of(tiny, TEXT_IDS)}


def test_encode_json_ids_and_byte_offsets(cli, tiny):
    text = "Lily saw a café"  # é is two bytes in UTF-8
    doc = ok_json(cli("encode", text, "--json"))
    ids = tiny.model.tokenizer.encode(text)
    assert doc["data"] == doc["ids"] == ids and doc["shape"] == [len(ids)]
    assert doc["vocab_size"] == TINY.vocab_size
    offsets = doc["offsets"]
    assert offsets[0][0] == 0 and offsets[-1][1] == len(text.encode("utf-8"))
    assert all(a[1] == b[0] for a, b in zip(offsets, offsets[1:], strict=False))
    raw = text.encode("utf-8")
    assert b"".join(raw[a:b] for a, b in offsets) == raw


def test_encode_is_not_limited_to_the_model_window(cli):
    r = cli("encode", " a" * 200, "--json")
    assert len(ok_json(r)["ids"]) == 200
    r = cli("encode", " a" * 200)
    assert r.code == 0 and "more than the 128" in r.out


@pytest.mark.parametrize("args, path", [
    (["embed"], "token_embeddings"),
    (["pos"], "position_embeddings"),
    (["pos", "--sum"], "embeddings"),
    (["norm", "--layer", "1", "--which", "ln2"], "layers.1.ln2.out"),
    (["norm", "--layer", "-2"], "layers.0.ln1.out"),
    (["final-norm"], "ln_final.out"),
    (["attn", "--layer", "1", "--head", "1"], "layers.1.heads.1.weights"),
    (["attn", "--layer", "-1", "--head", "-2"], "layers.1.heads.0.weights"),
    (["attn", "--all-heads", "--layer", "1"], "layers.1.weights"),
    (["mlp", "--layer", "1"], "layers.1.mlp_out"),
])
def test_json_data_equals_the_forward_pass(cli, tr, args, path):
    doc = ok_json(cli(args[0], TEXT, *args[1:], "--json"))
    expected = tr.get(path)
    assert doc["path"] == path
    assert doc["shape"] == list(expected.shape)
    assert doc["dtype"] == "float32"
    np.testing.assert_array_equal(np.asarray(doc["data"], dtype=np.float32), expected)


def test_norm_json_carries_each_tokens_mean_and_std(cli, tr):
    doc = ok_json(cli("norm", TEXT, "--layer", "1", "--json"))
    np.testing.assert_allclose(doc["mean"], tr.get("layers.1.resid_pre").mean(-1), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(doc["std"], tr.get("layers.1.ln1.std")[:, 0], rtol=1e-6)
    doc = ok_json(cli("final-norm", TEXT, "--json"))
    np.testing.assert_allclose(doc["std"], tr.get("ln_final.std")[:, 0], rtol=1e-6)


def test_attention_rows_sum_to_one_and_never_look_ahead(cli):
    w = np.asarray(ok_json(cli("attn", TEXT, "--all-heads", "--json"))["data"])
    T = len(TEXT_IDS)
    assert w.shape == (TINY.n_head, T, T)
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-5)
    assert (w[:, np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] == 0).all()


def test_masked_scores_are_null_in_json(cli, tr):
    doc = ok_json(cli("attn", TEXT, "--layer", "1", "--head", "0", "--scores", "--json"))
    s = floats(doc["data"])
    expected = tr.get("layers.1.heads.0.scores")
    above = np.triu(np.ones_like(s, dtype=bool), 1)
    assert all(doc["data"][i][j] is None for i, j in zip(*np.nonzero(above), strict=True))
    np.testing.assert_array_equal(s[~above], expected[~above].astype(float))
    # --all-heads carries the same nulls
    doc = ok_json(cli("attn", TEXT, "--all-heads", "--scores", "--json"))
    assert doc["data"][1][0][-1] is None and doc["data"][1][-1][0] is not None


def test_mlp_json_lists_the_most_active_hidden_neurons(cli, tr):
    doc = ok_json(cli("mlp", TEXT, "--layer", "0", "--top", "3", "--json"))
    post = tr.get("layers.0.mlp_post")
    peak = post.max(axis=0)
    want = list(np.argsort(-peak, kind="stable")[:3])
    assert [n["neuron"] for n in doc["top_neurons"]] == want
    for n in doc["top_neurons"]:
        np.testing.assert_array_equal(np.asarray(n["activations"], np.float32),
                                      post[:, n["neuron"]])
        assert n["max"] == pytest.approx(float(peak[n["neuron"]]))
        assert n["position"] == int(np.argmax(post[:, n["neuron"]]))


def test_blocks_json_norms_and_the_last_stage_guess(cli, tr):
    doc = ok_json(cli("blocks", TEXT, "--json"))
    stages = ["embeddings"] + [f"layers.{i}.resid_post" for i in range(TINY.n_layer)]
    assert doc["shape"] == [TINY.n_layer + 1, len(TEXT_IDS)]
    assert [s["stage"] for s in doc["stages"]] == stages
    norms = np.stack([np.linalg.norm(tr.get(s), axis=-1) for s in stages])
    np.testing.assert_allclose(doc["data"], norms, rtol=1e-5)
    # the lens at the last stage is the model's own output
    last = doc["stages"][-1]
    assert last["top_id"] == int(np.argmax(tr.get("logits")[-1]))
    assert last["top_prob"] == pytest.approx(probabilities(tr.get("logits")[-1]).max())
    change = np.linalg.norm(tr.get("layers.0.resid_post") - tr.get("embeddings"), axis=-1) \
        / np.linalg.norm(tr.get("embeddings"), axis=-1)
    np.testing.assert_allclose(doc["stages"][1]["change"], change, rtol=1e-5)
    assert ok_json(cli("blocks", TEXT, "--position", "2", "--json"))["position"] == 2


def test_logits_json_row_and_top(cli, tiny, tr):
    doc = ok_json(cli("logits", TEXT, "--position", "2", "--top", "4", "--json"))
    row = tr.get("logits")[2]
    assert doc["shape"] == [TINY.vocab_size] and doc["position"] == 2
    np.testing.assert_array_equal(np.asarray(doc["data"], np.float32), row)
    order = np.argsort(-row, kind="stable")[:4]
    assert [t["id"] for t in doc["top"]] == list(order)
    assert [t["token"] for t in doc["top"]] == tokens_of(tiny, order)
    assert [t["logit"] for t in doc["top"]] == pytest.approx(row[order].tolist())
    # -1 is the last position
    assert ok_json(cli("logits", TEXT, "--json"))["position"] == len(TEXT_IDS) - 1


@pytest.mark.parametrize("temperature", [1.0, 0.7, 2.5])
def test_probs_json_is_softmax_of_the_last_row(cli, tr, temperature):
    doc = ok_json(cli("probs", TEXT, "--temperature", temperature, "--json"))
    z = tr.get("logits")[-1].astype(np.float64) / temperature
    e = np.exp(z - z.max())
    p = np.asarray(doc["data"])
    assert doc["shape"] == [TINY.vocab_size] and doc["temperature"] == temperature
    assert p.sum() == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(p, e / e.sum(), rtol=1e-10, atol=1e-15)
    assert [t["id"] for t in doc["top"]] == list(np.argsort(-p, kind="stable")[:10])


def test_probs_at_temperature_zero_is_all_on_the_top_token(cli, tr):
    p = np.asarray(ok_json(cli("probs", TEXT, "-t", "0", "--json"))["data"])
    top = int(np.argmax(tr.get("logits")[-1]))
    assert p[top] == 1.0 and p.sum() == 1.0


def test_sample_json(cli, tiny, tr):
    last = tr.get("logits")[-1]
    doc = ok_json(cli("sample", TEXT, "--temperature", "0", "--json"))
    assert doc["data"] == int(np.argmax(last)) and doc["chance"] == 1.0
    doc = ok_json(cli("sample", TEXT, "--seed", "5", "--json"))
    assert doc["data"] == sample(probabilities(last, 1.0), create_rng(5))
    assert doc["token"] == tiny.model.tokenizer.token_str(doc["data"]) and doc["seed"] == 5
    assert doc["chance"] == pytest.approx(probabilities(last, 1.0)[doc["data"]])
    assert ok_json(cli("sample", TEXT, "--seed", "5", "--json")) == doc
    # top-k 1 leaves only the likeliest token, whatever the seed
    doc = ok_json(cli("sample", TEXT, "--seed", "9", "--top-k", "1", "--json"))
    assert doc["data"] == int(np.argmax(last))


@pytest.mark.parametrize("path, canonical", [
    ("layers.1.heads.0.out", "layers.1.heads.0.out"),
    ("layers[1].heads[0].out", "layers.1.heads.0.out"),
    ("blocks.0.attn.hook_pattern", "layers.0.weights"),
    ("tokenEmbeddings", "token_embeddings"),
    ("lnFinal.out", "ln_final.out"),
    ("layers[-1].mlpOut", "layers.1.mlp_out"),
    ("logits[-1]", "logits[-1]"),
    ("layers.0.q[1]", "layers.0.q[1]"),
])
def test_trace_json_by_path(cli, tr, path, canonical):
    doc = ok_json(cli("trace", TEXT, path, "--json"))
    assert doc["path"] == canonical
    np.testing.assert_array_equal(np.asarray(doc["data"], np.float32), tr.get(path))


def test_trace_json_ints_and_tokens(cli, tiny):
    doc = ok_json(cli("trace", TEXT, "layers.length", "--json"))
    assert doc["data"] == TINY.n_layer and doc["shape"] == []
    assert ok_json(cli("trace", TEXT, "ids", "--json"))["data"] == TEXT_IDS
    assert ok_json(cli("trace", TEXT, "tokens", "--json"))["data"] == tokens_of(tiny, TEXT_IDS)


def test_trace_list_json_has_every_path_with_its_shape(cli, tr):
    doc = ok_json(cli("trace", TEXT, "--list", "--json"))
    paths = [e["path"] for e in doc["entries"]]
    assert paths == doc["data"] == tr.paths()
    assert doc["shape"] == [len(paths)]
    for e in doc["entries"]:
        if e["path"] == "tokens":
            assert e["shape"] == [len(TEXT_IDS)]
        elif e["path"] != "layers.length":
            assert e["shape"] == list(np.shape(tr.get(e["path"]))), e
    about = {e["path"]: e["about"] for e in doc["entries"]}
    assert "card 5" in about["layers.1.heads.1.weights"]


def test_review_json_tells_the_page_with_this_models_numbers(cli, tr):
    doc = ok_json(cli("review", TEXT, "--json"))
    assert doc["facts"] == {"T": 6, "d": TINY.n_embd, "L": TINY.n_layer, "heads": TINY.n_head,
                            "d_k": TINY.d_k, "ffn": TINY.n_inner, "vocab": TINY.vocab_size,
                            "longest": TINY.n_positions}
    cards = doc["cards"]
    assert [c["number"] for c in cards] == list(range(1, 12)) == doc["data"]
    assert all(c["formula"] and c["command"].startswith("tinygpt ") for c in cards)
    # every path resolves; the random pick (card 11) has a formula and no path
    assert all(tr.get(c["path"]) is not None for c in cards if c["number"] != 11)
    assert cards[10]["path"] is None and "sample(probs[-1]" in cards[10]["formula"]
    by = {c["number"]: c for c in cards}
    assert by[1]["value"] == TEXT_IDS
    np.testing.assert_array_equal(np.asarray(by[5]["value"], np.float32),
                                  tr.get("layers.0.heads.0.weights"))
    assert by[7]["value"] == TINY.n_layer
    assert by[9]["shape"] == [6, TINY.vocab_size]
    assert sum(by[10]["value"]) == pytest.approx(1.0)
    assert by[11]["value"] == sample(probabilities(tr.get("logits")[-1]), create_rng(1))


def test_map_json_labels_every_arrow_with_a_shape(cli):
    doc = ok_json(cli("map", TEXT, "--json"))
    assert doc["repeat"]["times"] == TINY.n_layer
    shapes = [s["shape_out"] for s in doc["stages"]]
    assert shapes[0] == "6 ids" and shapes[1] == "6 × 16"
    assert "6 × 4,096" in shapes and shapes[-1] == "1 id"
    assert [s["stage"] for s in doc["stages"]] == doc["data"]


def test_info_json(cli, tiny):
    doc = ok_json(cli("info", "--json"))
    cfg = doc["config"]
    assert (cfg["n_embd"], cfg["n_layer"], cfg["n_head"], cfg["n_inner"]) == (16, 2, 2, 24)
    assert cfg["d_k"] == 8 and cfg["vocab_size"] == 4096 and cfg["n_positions"] == 128
    total = sum(a.size for a in tiny.model.params.values())
    assert doc["parameters"]["total"] == total == sum(doc["parameters"]["groups"].values())
    assert doc["parameters"]["groups"]["wte"] == 4096 * 16
    weights_file = tiny.folder / "model.safetensors"
    assert doc["weights_file"] == str(weights_file.resolve())
    assert doc["sha256"] == hashlib.sha256(weights_file.read_bytes()).hexdigest()
    assert doc["tokenizer"] == {"vocab_size": 4096, "special_tokens": {"<|endoftext|>": 0},
                                "stop_ids": [0]}


def test_weights_option_wins_over_the_environment(cli, tiny, monkeypatch, tmp_path):
    monkeypatch.setenv("TINYGPT_WEIGHTS", str(tmp_path / "nowhere"))
    doc = ok_json(cli("info", "--weights", tiny.folder, "--json"))
    assert doc["weights_file"] == str((tiny.folder / "model.safetensors").resolve())
    assert doc["shipped"] is False
    r = cli("info")
    assert r.code == 2 and "nowhere" in r.err


# ------------------------------------------------------------------ generate


def greedy(tiny, ids, n):
    """The argmax chain, computed independently of the CLI."""
    ids = list(ids)
    new = []
    for _ in range(n):
        nxt = int(np.argmax(tiny.trace(ids).get("logits")[-1]))
        new.append(nxt)
        ids.append(nxt)
    return new


def test_generate_json_is_ndjson_ending_with_a_summary(cli, tiny):
    r = cli("generate", TEXT, "-n", "5", "--seed", "3", "--no-stop", "--json")
    assert r.code == 0 and r.err == ""
    lines = r.ndjson()
    assert len(lines) == 7 and len(r.out.splitlines()) == 7
    prompt, *steps, end = lines
    assert prompt["event"] == "prompt" and prompt["data"] == prompt["ids"] == TEXT_IDS
    assert prompt["tokens"] == tokens_of(tiny, TEXT_IDS) and prompt["text"] == TEXT
    assert [s["event"] for s in steps] == ["token"] * 5 and end["event"] == "end"
    new = [s["id"] for s in steps]
    for i, s in enumerate(steps):
        # each token line carries only its own token: the stream grows linearly, not
        # quadratically (the context is the prompt line plus the tokens before)
        assert {"shape", "dtype", "data"} <= s.keys() and not {"ids", "tokens"} & s.keys()
        assert s["step"] == i and s["data"] == s["id"] and s["shape"] == []
        assert s["token"] == tiny.model.tokenizer.token_str(s["id"])
        assert 0 < s["chance"] <= 1
    assert end["ids"] == TEXT_IDS + new
    assert end["tokens"] == tokens_of(tiny, TEXT_IDS + new)
    assert end["data"] == tiny.model.tokenizer.decode(TEXT_IDS + new)
    assert end["new_tokens"] == 5 and end["seed"] == 3 and end["stop"] == "max_new_tokens"


def test_generate_at_temperature_zero_is_greedy(cli, tiny):
    want = greedy(tiny, TEXT_IDS, 6)
    end = cli("generate", TEXT, "-n", 6, "-t", 0, "--no-stop", "--json").ndjson()[-1]
    assert end["ids"] == TEXT_IDS + want
    # the human view prints the same text, prompt first, on stdout (a pipe here)
    r = cli("generate", TEXT, "-n", 6, "-t", 0, "--no-stop")
    assert r.code == 0
    assert r.out == show_text(tiny.model.tokenizer.decode(TEXT_IDS + want)) + "\n"
    assert "6 new tokens" in r.err


def test_generate_same_seed_same_text_and_seeds_differ(cli):
    def text(seed):
        r = cli("generate", TEXT, "-n", 8, "--seed", seed, "--temperature", 1.5, "--no-stop",
                "--json")
        return r.ndjson()[-1]["data"]

    assert text(11) == text(11)
    assert len({text(s) for s in range(4)}) > 1
    r1 = cli("generate", TEXT, "-n", 8, "--seed", 11, "-t", 1.5, "--no-stop")
    r2 = cli("generate", TEXT, "-n", 8, "--seed", 11, "-t", 1.5, "--no-stop")
    assert r1.out == r2.out == show_text(text(11)) + "\n"


def test_generate_respects_max_new_tokens(cli):
    for n in (1, 3):
        lines = cli("generate", TEXT, "--max-new-tokens", n, "--seed", 0, "--no-stop",
                    "--json").ndjson()
        assert len(lines) == n + 2 and lines[-1]["new_tokens"] == n
    r = cli("generate", TEXT, "-n", 0)
    assert r.code == 2 and r.err.startswith("error: ")


def test_generate_writes_each_token_as_it_is_produced(cli, monkeypatch):
    """Before the model computes token k+1, token k is already on stdout."""
    import tinygpt_cli.transformer.generate as gen

    real = gen.generate  # the command imports it when it runs
    written = []  # length of stdout each time the CLI asks for the next token

    def spy(*args, **kwargs):
        for step in real(*args, **kwargs):
            yield step
            written.append(len(sys.stdout.getvalue()))

    monkeypatch.setattr(gen, "generate", spy)
    r = cli("generate", TEXT, "-n", 4, "--seed", 2, "--no-stop", "--json")
    lines = r.out.splitlines(keepends=True)
    assert written == [sum(map(len, lines[:k])) for k in range(2, 6)]  # after the prompt line
    r = cli("generate", "Lily", "-n", 4, "-t", 0, "--no-stop")
    assert written[4] > len("Lily") and written[-1] > written[4]


def test_generate_without_a_seed_reports_the_seed_on_stderr(cli):
    r = cli("generate", TEXT, "-n", 2, "--no-stop", "--json")
    seed = r.ndjson()[-1]["seed"]
    assert f"--seed {seed}" in r.err
    again = cli("generate", TEXT, "-n", 2, "--no-stop", "--json", "--seed", seed)
    assert again.ndjson()[-1]["ids"] == r.ndjson()[-1]["ids"]


@pytest.fixture(scope="module")
def eot_model(tmp_path_factory, tiny):
    """Weights whose every next-token guess is <|endoftext|>: the final norm outputs a fixed
    direction (weight 0, bias u) and the eot row of the tied table points along it."""
    params = random_params(TINY, seed=4)
    eot = tiny.model.tokenizer.eot_id
    u = np.zeros(TINY.n_embd, np.float32)
    u[0] = 1.0
    params["ln_final.w"][:] = 0.0
    params["ln_final.b"][:] = u
    params["embed.W_E"][:, 0] = 0.0
    params["embed.W_E"][eot] = 30.0 * u
    return make_tiny(tmp_path_factory.mktemp("eot") / "weights", params)


def test_generate_stops_at_endoftext(cli, eot_model):
    for temperature in ("0", "1"):
        r = cli("generate", TEXT, "--weights", eot_model.folder, "-t", temperature, "--seed", 1,
                "--json")
        _, *steps, end = r.ndjson()
        assert [s["id"] for s in steps] == [0]
        assert end["stop"] == "endoftext" and end["new_tokens"] == 1
        assert end["data"] == TEXT  # the end-of-text token is not part of the text
    r = cli("generate", TEXT, "--weights", eot_model.folder, "-t", 0)
    assert r.code == 0 and r.out == TEXT + "\n"
    assert "<|endoftext|>" in r.err


def test_generate_no_stop_goes_on_past_endoftext(cli, eot_model):
    r = cli("generate", TEXT, "--weights", eot_model.folder, "-t", 0, "-n", 3, "--no-stop",
            "--json")
    _, *steps, end = r.ndjson()
    assert [s["id"] for s in steps] == [0, 0, 0] and end["stop"] == "max_new_tokens"
    r = cli("generate", TEXT, "--weights", eot_model.folder, "-t", 0, "-n", 2, "--no-stop")
    assert r.out == TEXT + "<|endoftext|>" * 2 + "\n"


def test_long_text_is_printed_as_it_is_not_wrapped_at_the_pipe_width(cli, tiny):
    prompt = "Once upon a time there was a little girl named Lily. " * 4
    r = cli("generate", prompt, "-n", 3, "-t", 0, "--no-stop")
    end = cli("generate", prompt, "-n", 3, "-t", 0, "--no-stop", "--json").ndjson()[-1]
    assert r.out == show_text(end["data"]) + "\n"
    r = cli("sample", prompt, "--seed", 1)
    assert r.out.splitlines()[1].startswith(prompt)


def test_generate_past_the_window_keeps_going(cli, tiny):
    # 126 prompt tokens + 5 new ones: the model sees the last 128
    prompt = " a" * 126
    r = cli("generate", prompt, "-n", 5, "--seed", 2, "--no-stop", "--json")
    assert r.code == 0 and r.ndjson()[-1]["new_tokens"] == 5


# ------------------------------------------------------------------ human views


def header_fields(line: str) -> dict[str, float]:
    return {k: float(v) for k, v in re.findall(r"\b(min|mean|max|std) (-?[\d.e+-]+)", line)}


def test_embed_human_view(cli, tr):
    r = cli("embed", TEXT)
    assert r.code == 0 and r.err == ""
    lines = r.out.splitlines()
    head = lines[0]
    assert head.startswith("token_embeddings") and "6 × 16" in head and "float32" in head
    stats = header_fields(head)
    assert stats.keys() == {"min", "mean", "max", "std"}
    e = tr.get("token_embeddings")
    assert stats["min"] == pytest.approx(e.min(), abs=1e-3)
    assert stats["max"] == pytest.approx(e.max(), abs=1e-3)
    body = "\n".join(lines[1:])
    for i, tok in enumerate(tokens_of_text()):
        assert re.search(rf"^\s*{i} {re.escape(tok)}\s", body, re.M), tok
    assert "…" in lines[1]  # 16 columns: first and last around an ellipsis
    assert " 15" in lines[1] and " 8 " not in lines[1]


def test_full_shows_every_column(cli):
    r = cli("embed", TEXT, "--full")
    cols = r.out.splitlines()[1].split()
    assert cols == [str(i) for i in range(16)]
    assert "…" not in r.out
    # a pipe is 120 wide, but --full never cuts a table: all 24 hidden neurons appear
    r = cli("trace", TEXT, "layers.0.mlp_pre", "--full")
    lines = r.out.splitlines()
    assert max(map(len, lines)) > 120
    assert lines[1].split() == [str(i) for i in range(TINY.n_inner)]
    assert all(len(line.split()) == TINY.n_inner + 2 for line in lines[2:])  # #, token, values


@pytest.mark.parametrize("args, path, shape", [
    (["pos"], "position_embeddings", "6 × 16"),
    (["pos", "--sum"], "embeddings", "6 × 16"),
    (["norm", "--layer", "1"], "layers.1.ln1.out", "6 × 16"),
    (["final-norm"], "ln_final.out", "6 × 16"),
    (["mlp"], "layers.0.mlp_out", "6 × 16"),
    (["attn"], "layers.0.heads.0.weights", "6 × 6"),
    (["attn", "--all-heads"], "layers.0.weights", "2 × 6 × 6"),
    (["logits"], "logits[5]", "4096"),
    (["probs"], "probs[5]", "4096"),
    (["probs", "-t", "0.5"], "softmax(logits[5] / 0.5)", "4096"),
    (["blocks"], "blocks.norm", "3 × 6"),
    (["trace", TEXT, "layers.0.ln2.out"], "layers.0.ln2.out", "6 × 16"),
])
def test_human_views_start_with_a_header_line(cli, args, path, shape):
    argv = args if args[0] == "trace" else [args[0], TEXT, *args[1:]]
    r = cli(*argv)
    assert r.code == 0, r.err
    head = r.out.splitlines()[0]
    assert head.startswith(path + "  "), head
    assert f"  {shape}  " in head
    assert header_fields(head).keys() == {"min", "mean", "max", "std"}
    assert "float" in head


def test_attention_heatmap_is_labelled_by_tokens(cli):
    r = cli("attn", TEXT, "--layer", "1", "--head", "1")
    lines = r.out.splitlines()
    assert lines[1].split() == ["Lily", "␣want", "␣to", "␣play", "␣with", "␣her"]
    assert lines[2].split()[:3] == ["0", "Lily", "1.00"]
    assert lines[2].count("·") == 5 and lines[7].count("·") == 0
    assert "each row sums to 1" in r.out
    r = cli("attn", TEXT, "--all-heads")
    assert "head 0" in r.out and "head 1" in r.out
    r = cli("attn", TEXT, "--scores")
    assert "·: keys after the query, -inf" in r.out


def test_long_heatmaps_fit_the_width_and_full_shows_every_column(cli):
    text = " ".join(f"w{i}" for i in range(30))
    n = len(cli("encode", text, "--json").json()["ids"])
    assert n > 20
    lines = cli("attn", text, "--full").out.splitlines()
    assert len(lines[-2].split()) == 2 + n  # the last row: position, token, n cells
    lines = cli("attn", text).out.splitlines()  # a pipe: 120 columns
    assert max(map(len, lines)) <= 120 and "…" in lines[-2].split()
    assert lines[-2].split()[-1] == lines[-2].split()[-1]  # the last key column is kept


def test_other_human_views(cli, tiny):
    r = cli("encode", TEXT)
    assert "T = 6 tokens" in r.out
    assert re.search(r"1\s+429\s+␣wanted\s+4–11", r.out)
    assert cli("decode", "608,429", "267").out == "Lily wanted to\n"
    r = cli("mlp", TEXT, "--top", "3")
    assert "most active hidden neurons" in r.out
    assert len(re.findall(r"\bn\d+\b", r.out)) == 3
    r = cli("logits", TEXT, "--top", "3")
    assert len(re.findall(r"^\s*[123]\s+\d+\s", r.out, re.M)) >= 3
    assert "these 10 hold" in cli("probs", TEXT).out
    r = cli("blocks", TEXT)
    assert "layers.1.resid_post" in r.out and "top guess" in r.out
    r = cli("sample", TEXT, "--seed", 1)
    assert r.out.startswith("next token") and r.out.splitlines()[1].startswith(TEXT)
    r = cli("trace", TEXT, "--list")
    assert re.search(r"layers\.1\.heads\.1\.weights\s+6 × 6", r.out)
    assert cli("trace", TEXT, "layers.length").out == "layers.length = 2\n"
    assert cli("trace", TEXT, "tokens").out.split() == tokens_of_text()
    head = cli("trace", TEXT, "logits[0][5]").out.splitlines()[0]
    assert head.startswith("logits[0][5]  scalar")
    r = cli("info")
    assert "n_embd" in r.out and "sha256" in r.out and "<|endoftext|> = 0" in r.out


def test_trace_rows_of_per_head_values_are_labelled_by_tokens(cli):
    r = cli("trace", TEXT, "layers.0.q")
    assert "layers.0.q[1]" in r.out
    assert re.search(r"^\s*1 ␣wanted\s", r.out, re.M)
    r = cli("trace", TEXT, "layers.0.weights[1]")
    assert re.search(r"^\s*5 ␣her\s", r.out, re.M)


def test_review_shows_the_facts_and_all_eleven_cards_in_order(cli):
    r = cli("review", TEXT)
    assert r.code == 0
    for fact in ("T = 6", "d = 16", "L = 2", "heads = 2", "d_k = 8", "ffn = 24",
                 "vocab = 4,096 tokens", "longest = 128 tokens"):
        assert fact in r.out, fact
    titles = ["Inputs", "Embedding", "Position", "Add and norm", "Masked attention",
              "Feed forward", "Repeated blocks", "Final norm", "Linear", "Softmax", "Output"]
    where = [r.out.index(f"{i}. {t}") for i, t in enumerate(titles, 1)]
    assert where == sorted(where)
    # the canonical paths, as trace prints them (the seed page's camelCase is only accepted)
    for path in ("layers.0.heads.0.weights", "ln_final.out", "layers.0.mlp_out"):
        assert path in r.out
    assert "mlpOut" not in r.out and "lnFinal" not in r.out
    assert "2 × Block" in r.out and "6 × 4096" in r.out and "Lily=608" in r.out


def test_map_draws_the_model_with_shapes(cli):
    r = cli("map", TEXT)
    assert r.code == 0
    assert "× 2 blocks" in r.out and "6 × 16" in r.out and "4,096" in r.out
    order = [r.out.index(s) for s in ("Inputs", "Embedding", "Position", "Masked attention",
                                      "Feed forward", "Final norm", "Linear", "Softmax",
                                      "Output")]
    assert order == sorted(order)


@pytest.mark.parametrize("width", ["60", "80"])
def test_map_wraps_a_long_stage_under_itself_not_at_the_frame(cli, monkeypatch, width):
    # a Llama's attention and feed-forward stages are longer than 80 columns: their rest
    # went on at the block frame's left edge, breaking the diagram
    monkeypatch.setenv("COLUMNS", width)
    r = cli("map", TEXT, "--weights", "weights/llama")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    top = next(i for i, ln in enumerate(lines) if "blocks (card 7)" in ln)
    inside = lines[top + 1:next(i for i in range(top + 1, len(lines))
                                if lines[i].lstrip().startswith("╰─"))]
    assert any("SiLU" in ln for ln in inside) and all(len(ln) <= int(width) for ln in lines)
    # past the frame's border, its padding and the residual stream's two columns of rails
    bodies = [ln[ln.index("│") + 1:ln.rindex("│")][3:] for ln in inside]
    wrapped = [b for b in bodies if not b.strip().startswith(("▣", "⊕", "│", "─"))]
    assert wrapped  # the long stages do wrap at this width
    for body in wrapped:  # and each goes on where its stage's text began
        assert len(body) - len(body.lstrip()) >= 21, body


# ------------------------------------------------------------------ literal text, no ANSI

MARKUP = "[bold]x[/bold] and \x1b[31mred"


ALL_HUMAN = [["encode"], ["embed"], ["pos"], ["norm"], ["attn"], ["attn", "--all-heads"],
             ["mlp"], ["blocks"], ["final-norm"], ["logits"], ["probs"], ["sample"],
             ["generate", "-n", "3", "--seed", "1"], ["trace", "-", "tokens"],
             ["trace", "-", "embeddings"], ["review"], ["map"]]


@pytest.mark.parametrize("args", ALL_HUMAN, ids=" ".join)
def test_no_escape_codes_reach_a_pipe(cli, args):
    """Neither colour nor the ESC in the user's text reaches stdout; the text is escaped."""
    argv = [args[0], "-", *args[2:]] if args[0] == "trace" else [args[0], *args[1:]]
    r = cli(*argv, stdin=MARKUP)
    assert r.code == 0, r.err
    assert "\x1b" not in r.out and "\x1b" not in r.err
    assert "\\x1b" in r.out or args[0] in ("logits", "probs", "blocks")


def test_markup_in_the_text_is_shown_literally(cli, tiny):
    shown = show_text(MARKUP)
    assert shown == "[bold]x[/bold] and \\x1b[31mred"
    r = cli("generate", MARKUP, "-n", 2, "-t", 0, "--no-stop")
    assert r.out.startswith(shown)
    r = cli("sample", MARKUP)
    assert r.out.splitlines()[1].startswith(shown)
    assert shown in cli("map", MARKUP).out  # repr of the text escapes ESC the same way
    out = cli("review", MARKUP).out
    assert "[bold]x[/bold]" in out and "\\x1b" in out
    out = cli("embed", MARKUP).out
    toks = [show_token(t) for t in tokens_of(tiny, tiny.model.tokenizer.encode(MARKUP))]
    assert "[" in toks and "\\x1b" in toks
    for i, tok in enumerate(toks):
        assert re.search(rf"^\s*{i} {re.escape(tok)}\s", out, re.M), tok
    # a token made of markup is a heatmap column label, shown as it is
    assert "[" in cli("attn", MARKUP).out.splitlines()[1]
    assert cli("decode", *tiny.model.tokenizer.encode(MARKUP)).out == MARKUP + "\n"


def test_a_terminal_gets_colour_and_still_sees_the_text_literally(cli, monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("COLORTERM", "truecolor")
    r = cli("attn", TEXT)
    assert re.search("\x1b\\[[0-9;]*48;2;", r.out)  # heatmap cells on a coloured background
    r = cli("sample", MARKUP)
    plain = re.sub("\x1b\\[[0-9;]*m", "", r.out)
    assert plain.splitlines()[1].startswith(show_text(MARKUP))


# Control characters but newline and tab: text keeps those two (generate writes a tab in the
# text as a tab by design); every other one, ESC and C1 included, is shown as an escape.
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


# Each example runs six commands: a few in CI (a fixed set there), more under the dev profile.
@settings(max_examples=max(8, settings.default.max_examples // 15), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=24))
def test_any_text_round_trips_and_is_shown_without_control_characters(cli, tiny, text):
    assume(text != "-")  # '-' means: read stdin
    ids = tiny.model.tokenizer.encode(text)
    # '--' ends the options, so a text may start with '-'
    assert ok_json(cli("encode", "--json", "--", text))["ids"] == ids
    assert ok_json(cli("decode", "--json", *ids))["data"] == text
    for argv in (["embed"], ["attn"], ["sample"], ["generate", "-n", "2", "-t", "0"]):
        r = cli(*argv, "--", text)
        assert r.code == 0, (argv, r.err)
        assert not CONTROL.search(r.out), (argv, r.out)
    assert r.out.startswith(show_text(text))  # generate writes the text as it is


# ------------------------------------------------------------------ stdin


@pytest.mark.parametrize("command", ["embed", "probs", "review", "encode", "map"])
def test_text_from_stdin_with_dash_or_without_argument(cli, command):
    by_arg = cli(command, TEXT, "--json").json()
    assert cli(command, "-", "--json", stdin=TEXT + "\n").json() == by_arg
    assert cli(command, "--json", stdin=TEXT).json() == by_arg


def test_stdin_keeps_inner_newlines_and_drops_one_trailing(cli, tiny):
    text = "Lily wanted.\nShe played.\n"
    doc = cli("encode", "--json", stdin=text + "\n").json()
    assert doc["ids"] == tiny.model.tokenizer.encode(text)


def test_generate_trace_and_decode_read_stdin(cli, tiny):
    doc = cli("generate", "-n", 2, "--seed", 1, "--json", stdin=TEXT).ndjson()[-1]
    assert doc["ids"][:6] == TEXT_IDS
    assert cli("trace", "-", "ids", "--json", stdin=TEXT).json()["data"] == TEXT_IDS
    assert cli("decode", stdin="608 429\n").out == "Lily wanted\n"
    assert cli("decode", "-", "--json", stdin="[608, 429]").json()["data"] == "Lily wanted"


# ------------------------------------------------------------------ help


def command_names() -> list[str]:
    _register()  # main() does this before it runs a command
    return sorted(typer.main.get_command(app).commands)


def test_every_issue_command_exists():
    want = {"encode", "decode", "embed", "pos", "norm", "attn", "mlp", "blocks", "final-norm",
            "logits", "probs", "sample", "generate", "trace", "review", "map", "info"}
    assert want <= set(command_names())


@pytest.mark.parametrize("command", command_names())
def test_help_has_examples_each_whole_on_its_own_line_at_80_columns(cli, command, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    r = cli(command, "--help")
    assert r.code == 0 and r.err == ""
    lines = r.out.splitlines()
    assert max(map(len, lines)) <= 80, r.out
    examples = lines[lines.index("  Examples:") + 1:]
    examples = examples[:next(i for i, ln in enumerate(examples) if not ln.strip())]
    assert examples, r.out
    # a long example continues with the shell's ` \`, never mid-word
    examples = "\n".join(ln.strip() for ln in examples).replace(" \\\n", " ").splitlines()
    for line in examples:  # a whole command each: nothing joined to it, nothing cut off
        assert line.startswith(f"tinygpt {command}"), line
        assert line.count('"') % 2 == 0, line
    # the docstring's examples, one for one
    doc = [ln.strip()[len("Example:"):].strip() for ln in
           (typer.main.get_command(app).commands[command].callback.__doc__ or "").splitlines()
           if ln.strip().startswith("Example:")]
    assert examples == doc
    assert "\b" not in r.out


def test_top_level_help(cli):
    for argv in ([], ["--help"], ["-h"]):
        r = cli(*argv)
        assert r.code == 0 and r.err == ""
        assert "Usage: tinygpt" in r.out and "generate" in r.out


# ------------------------------------------------------------------ the shipped weights

shipped = pytest.mark.skipif(not (SHIPPED / "model.safetensors").is_file(),
                             reason="no shipped weights")


@pytest.fixture
def on_shipped(capsys, monkeypatch):
    """The CLI with neither --weights nor $TINYGPT_WEIGHTS: the shipped model."""
    clean_env(monkeypatch)
    return Runner(capsys, monkeypatch)


@pytest.fixture(scope="module")
def shipped_model():
    return load_model(SHIPPED)


@shipped
def test_shipped_tokenizer_and_model(on_shipped, shipped_model):
    cfg = load_config(SHIPPED / "config.json")
    doc = ok_json(on_shipped("encode", TEXT, "--json"))
    assert doc["ids"] == TEXT_IDS
    assert on_shipped("decode", *TEXT_IDS).out == TEXT + "\n"
    info = ok_json(on_shipped("info", "--json"))
    assert info["config"]["n_embd"] == cfg.n_embd and info["config"]["n_layer"] == cfg.n_layer
    assert info["tokenizer"]["vocab_size"] == cfg.vocab_size
    assert info["weights_file"] == str((SHIPPED / "model.safetensors").resolve())
    assert info["shipped"] is True
    # the view names the shipped model, never where it was installed (the README's block is
    # the same on every machine)
    assert "weights   the shipped model.safetensors (--json: its path)\n" in on_shipped("info").out
    facts = ok_json(on_shipped("review", TEXT, "--json"))["facts"]
    assert facts == {"T": 6, "d": cfg.n_embd, "L": cfg.n_layer, "heads": cfg.n_head,
                     "d_k": cfg.d_k, "ffn": cfg.n_inner, "vocab": cfg.vocab_size,
                     "longest": cfg.n_positions}


@shipped
def test_shipped_values_are_well_formed(on_shipped, shipped_model):
    cfg = shipped_model.config
    p = np.asarray(ok_json(on_shipped("probs", TEXT, "--json"))["data"])
    assert p.shape == (cfg.vocab_size,) and p.sum() == pytest.approx(1.0) and (p >= 0).all()
    w = np.asarray(ok_json(on_shipped("attn", TEXT, "--all-heads", "--layer", -1,
                                      "--json"))["data"])
    assert w.shape == (cfg.n_head, 6, 6)
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-5)
    assert np.allclose(np.triu(w, 1), 0)
    doc = ok_json(on_shipped("trace", TEXT, "logits[-1]", "--json"))
    tr = run_traced(shipped_model.params, cfg, np.asarray(TEXT_IDS))
    np.testing.assert_array_equal(np.asarray(doc["data"], np.float32), tr.get("logits")[-1])


@shipped
def test_shipped_greedy_generation_is_repeatable(on_shipped):
    a = on_shipped("generate", "Lily wanted", "-n", 5, "-t", 0)
    b = on_shipped("generate", "Lily wanted", "-n", 5, "-t", 0)
    assert a.code == 0 and a.out == b.out and a.out.startswith("Lily wanted")


@shipped
def test_the_shipped_weights_are_found_from_any_directory(tmp_path):
    """No --weights, no $TINYGPT_WEIGHTS, a working directory far from the repository."""
    from cli_helpers import run_module

    env = {"TINYGPT_WEIGHTS": ""}
    proc = run_module("info", "--json", env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    weights_file = Path(doc["weights_file"])
    assert weights_file.is_file() and weights_file.name == "model.safetensors"
    assert doc["sha256"] == hashlib.sha256(weights_file.read_bytes()).hexdigest()
    proc = run_module("generate", "Lily wanted", "--temperature", "0", "-n", "5", env=env,
                      cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("Lily wanted"), proc.stderr


def test_version_and_help_list_the_cards_in_page_order(cli):
    from tinygpt_cli import __version__

    result = cli("--version")
    assert result.code == 0 and result.out == f"tinygpt {__version__}\n"
    listed = re.findall(r"^  (\S+)\s+Card (\d+):", cli("--help").out, re.M)
    assert [int(n) for _, n in listed] == list(range(1, 12)), listed


def test_generate_writes_the_text_to_a_pipe_byte_for_byte_tabs_included(tiny):
    from cli_helpers import run_module

    proc = run_module("generate", "-", "--temperature", "0", "-n", "3", "--weights",
                      tiny.folder, stdin="Lily\twanted")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Lily\twanted") and proc.stdout.endswith("\n")
    assert "\x1b" not in proc.stdout


BIDI = "abc\u202edef\u2066g\u200fh"  # a right-to-left override, an isolate and a mark


def test_bidirectional_controls_are_escaped_wherever_text_is_shown(cli):
    # Invisible, they would show the rest of a line in another order ("Trojan Source").
    from tinygpt_cli.escapes import escape_line

    want = "abc\\u202edef\\u2066g\u200fh"  # the right-to-left mark belongs to such text
    assert show_text(BIDI) == escape_line(BIDI) == show_token(BIDI) == want
    assert show_text("\x1b\n") == "\\x1b\n"  # the C0 escapes keep their short form
    r = cli("generate", BIDI, "-n", 1, "-t", 0, "--no-stop")
    assert r.code == 0 and r.out.startswith(want) and "\u202e" not in r.out
    r = cli("attn", BIDI, "--weights", "/nowhere\u202e")
    assert r.code == 2 and "/nowhere\\u202e" in r.err and "\u202e" not in r.err


def test_each_line_reads_a_pipe_and_ends_lines_at_newlines_only(cli, tmp_path):
    import os

    r = cli("encode", "--each-line", "-", "--json", stdin="Lily\u2028Tom\r\nTom\n")
    assert r.code == 0, r.err
    docs = [json.loads(x) for x in r.out.split("\n") if x]
    assert [(d["line"], d["text"]) for d in docs] == [(1, "Lily\u2028Tom"), (2, "Tom")]
    import threading

    fifo = tmp_path / "texts"  # as <(command) gives: a pipe, not a regular file
    os.mkfifo(fifo)

    def writer():  # the other end, as a shell's process substitution would be
        with open(fifo, "w") as f:
            f.write("Lily\n")

    threading.Thread(target=writer, daemon=True).start()  # daemon: never holds pytest up
    r = cli("encode", "--each-line", fifo, "--json")
    assert r.code == 0 and json.loads(r.out)["text"] == "Lily", r.err
    assert_one_error_line(cli("encode", "--each-line", tmp_path), 2, "is a folder")



def test_each_line_refuses_a_device_that_never_ends(cli):
    assert_one_error_line(cli("encode", "--each-line", "/dev/zero"), 2,
                          "neither a file nor a pipe")


def test_attention_x_grad_shows_every_head_of_a_wide_layer(cli, tmp_path, monkeypatch):
    # one grid per layer flows to fit the terminal, but a grid itself is never cut: heads
    # past the edge would vanish without a `…` to say so
    # replace, not Config(**TINY.__dict__): the dict also holds what a pass kept on TINY
    config = dataclasses.replace(TINY, n_embd=24, n_head=12, n_layer=1)
    folder = write_folder(tmp_path / "h12", random_params(config, seed=5), config)
    monkeypatch.setenv("COLUMNS", "80")
    r = cli("attribute", TEXT, "--method", "attention-x-grad", "--weights", folder)
    assert r.code == 0, r.err
    heads = next(line for line in r.out.splitlines() if "h0" in line).split()
    assert heads == [f"h{h}" for h in range(12)]


def test_each_line_puts_the_line_in_the_texts_place(cli, tmp_path):
    # trace takes TEXT then PATH: the line is the text, the one argument given is the path
    texts = tmp_path / "texts.txt"
    texts.write_text("Lily wanted\n-x\n")
    r = cli("trace", "--each-line", texts, "logits[-1]", "--json")
    assert r.code == 0, r.err
    docs = [json.loads(x) for x in r.out.splitlines()]
    assert [(d["text"], d["result"]["path"]) for d in docs] == [("Lily wanted", "logits[-1]"),
                                                                 ("-x", "logits[-1]")]
    one = cli("trace", "Lily wanted", "logits[-1]", "--json").json()
    assert docs[0]["result"]["data"] == one["data"]
