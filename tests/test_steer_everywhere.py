"""Steering reaches every command that runs the model on a text (issue 20): lens, dla, ablate,
patch, attribute, score, heads, neurons, diff (and history and why, in test_history.py), each
against transformers with a torch forward pre-hook adding the same vector; dla and attribute
give the vector a term of its own, so the terms still add up; every view, JSON document and
picture of a steered run says what was steered."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_helpers import TEXT, file_names
from test_steer import STEER, hf_model, hf_steered_logits, hf_steering, hf_vector

SCALE = 3.0
STEERED = [*STEER, "--steer-scale", str(SCALE)]
OTHER = "Lily wanted to read with her"  # as many tokens as TEXT


@pytest.fixture
def hf(tiny):
    """(torch, the transformers model, v, a function ids -> steered logits [T, V])."""
    torch, model = hf_model(tiny.folder)
    v = hf_vector(torch, model, tiny.model.tokenizer, "Lily was happy", "Lily was sad", 1)
    return torch, model, v, lambda ids, scale=SCALE: hf_steered_logits(torch, model, ids, v, 1,
                                                                         scale)


def log_softmax(z):
    z = np.asarray(z, np.float64)
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _table() -> dict[str, bool]:
    """Every command of the real table (cli.app, all registered, `sae train` as two words):
    is it declared @steerable?"""
    from tinygpt_cli.cli.app import _register, app
    from tinygpt_cli.cli.typer_tricks import command_name

    _register()
    found = {command_name(c): c.callback for c in app.registered_commands}
    found.update({f"{g.name} {command_name(c)}": c.callback for g in app.registered_groups
                  for c in g.typer_instance.registered_commands})
    return {name: getattr(f.__wrapped__, "steerable", False) for name, f in found.items()}


TABLE = _table()
# the commands that never run the model: they read or write text, files, a configuration
# (mcp serves the others: each tool call is its command's own run, steerable as it is)
NEVER_RUN = {"encode", "decode", "info", "train-tokenizer", "train", "model-card", "mcp",
             "sae export"}
# runs two models and compares their own runs: a steering vector would be a third change
OWN_RUNS = {"quant"}


def test_every_command_that_runs_the_model_is_steerable():
    assert {name for name, steers in TABLE.items() if not steers} == NEVER_RUN | OWN_RUNS
    assert len(TABLE) > 30


@pytest.mark.parametrize("command", sorted(TABLE))
def test_the_steerable_commands_and_only_they_take_the_steering_options(cli, command):
    out = cli(*command.split(), "--help").out
    for option in ("--steer ", "--steer-away", "--steer-vector", "--steer-layer",
                   "--steer-scale"):
        assert (option in out) == TABLE[command], (command, option)


def test_lens_reads_the_steered_run(cli, tiny, hf):
    doc = cli("lens", TEXT, *STEERED, "--json").json()
    want = np.exp(log_softmax(hf[3](tiny.model.tokenizer.encode(TEXT))))  # [T, V]
    # the last stage is the model's own output: its top chance at every position
    np.testing.assert_allclose(np.asarray(doc["data"])[:, -1], want.max(-1), rtol=1e-4)
    assert doc["steered"]["site"] == "layers.1.resid_pre"
    assert "steered" not in cli("lens", TEXT, "--json").json()


def test_dla_has_a_steer_row_and_its_rows_add_up_to_the_steered_logit(cli, tiny, hf):
    torch, model, v, steered = hf
    ids = tiny.model.tokenizer.encode(TEXT)
    doc = cli("dla", TEXT, *STEERED, "--target", " toys", "--vs", " mom", "--json").json()
    t, vs = doc["target"]["id"], doc["vs"]["id"]
    z = steered(ids)[-1].astype(np.float64)
    assert sum(doc["data"]) == pytest.approx(z[t] - z[vs], abs=1e-4)
    assert doc["total"] == pytest.approx(doc["score"], abs=1e-6)
    # the steer row: the shift, centred, divided by the final norm's std of the steered
    # run (read from transformers' ln_f input), dotted with g * (W_E[t] - W_E[vs])
    seen = {}

    def keep(module, args):  # returns None: the input goes on unchanged
        seen["x"] = args[0][0, -1].double().numpy()

    handle = model.transformer.ln_f.register_forward_pre_hook(keep)
    steered(ids)
    handle.remove()
    x = seen["x"]
    s = np.sqrt(((x - x.mean()) ** 2).mean() + 1e-5)
    p = file_names(tiny.model.params)
    w = p["wte.weight"].astype(np.float64)
    shift = SCALE * v
    want = (shift - shift.mean()) / s @ (p["ln_f.weight"] * (w[t] - w[vs]))
    assert doc["labels"].count("steer") == 1
    assert doc["data"][doc["labels"].index("steer")] == pytest.approx(want, rel=1e-4)
    plain = cli("dla", TEXT, "--target", " toys", "--json").json()
    assert "steer" not in plain["labels"]


def test_attribute_gives_the_steering_its_own_term(cli, tiny, hf):
    torch, model, v, steered = hf
    ids = tiny.model.tokenizer.encode(TEXT)
    # grad-x-input: the term is shift . df/dshift, the derivative along the scale times it
    doc = cli("attribute", TEXT, *STEERED, "--method", "grad-x-input", "--target", " toys",
              "--json").json()
    t = doc["target"]["id"]
    eps = 1e-2
    slope = (steered(ids, SCALE + eps)[-1, t] - steered(ids, SCALE - eps)[-1, t]) / (2 * eps)
    assert doc["steer"] == pytest.approx(SCALE * slope, rel=2e-2, abs=2e-3)
    assert doc["f"] == pytest.approx(float(steered(ids)[-1, t]), abs=1e-4)
    # integrated gradients: tokens and steering grow together from a zero, unsteered
    # baseline, and their terms add up to f(input, steered) - f(baseline)
    ig = cli("attribute", TEXT, *STEERED, "--method", "integrated-gradients", "--target",
             " toys", "--steps", "256", "--json").json()
    wpe = model.transformer.wpe.weight[: len(ids)]
    with torch.no_grad():
        base = model(inputs_embeds=torch.zeros(1, len(ids), wpe.shape[1])).logits[0, -1, t]
    assert ig["f_baseline"] == pytest.approx(float(base), abs=1e-4)
    assert ig["f"] == pytest.approx(float(steered(ids)[-1, t]), abs=1e-4)
    total = sum(ig["data"]) + ig["steer"]
    assert total == pytest.approx(ig["f"] - ig["f_baseline"], abs=2e-2)
    assert abs(ig["completeness_gap"]) < 2e-2
    assert "steer" not in cli("attribute", TEXT, "--json").json()


def test_score_surprisal_is_the_steered_runs(cli, tiny, hf):
    lines = cli("score", TEXT, *STEERED, "--json").ndjson()
    tok = tiny.model.tokenizer
    ids = [tok.eot_id] + tok.encode(TEXT)
    logp = log_softmax(hf[3](ids))
    nats = [line["nats"] for line in lines if "nats" in line]
    np.testing.assert_allclose(nats, [-logp[i, ids[i + 1]] for i in range(len(ids) - 1)],
                               rtol=1e-4, atol=1e-5)
    assert lines[-1]["steered"]["scale"] == SCALE


def test_heads_score_the_steered_attention(cli, tiny, hf):
    torch, model, v, _ = hf
    tok = tiny.model.tokenizer
    ids = [tok.eot_id] + tok.encode(TEXT)
    doc = cli("heads", TEXT, *STEERED, "--json").json()
    shift = torch.tensor(SCALE * v, dtype=torch.float32)
    handle = model.transformer.h[1].register_forward_pre_hook(
        lambda m, args, kwargs: ((args[0] + shift, *args[1:]), kwargs) if args else
        (args, {**kwargs, "hidden_states": kwargs["hidden_states"] + shift}), with_kwargs=True)
    with torch.no_grad():
        att = model(torch.tensor([ids]), output_attentions=True).attentions
    handle.remove()
    grids = np.stack([a[0].double().numpy() for a in att])  # [L, H, T, T]
    prev = np.zeros(grids.shape[-2:])
    prev[np.arange(1, len(ids)), np.arange(len(ids) - 1)] = 1.0
    want = (grids * prev).sum((-1, -2)) / grids.sum((-1, -2))
    np.testing.assert_allclose(np.asarray(doc["data"])[doc["kinds"].index("previous_token")],
                               want, rtol=1e-4, atol=1e-6)
    assert doc["steered"]["site"] == "layers.1.resid_pre"


def test_neurons_on_a_text_are_the_steered_runs(cli, tiny, hf):
    torch, model, v, steered = hf
    doc = cli("neurons", TEXT, *STEERED, "--layer", "1", "--json").json()
    seen = {}

    def keep(module, args, out):  # returns None: the output goes on unchanged
        seen["post"] = out[0].double().numpy()

    handle = model.transformer.h[1].mlp.act.register_forward_hook(keep)
    steered(tiny.model.tokenizer.encode(TEXT))
    handle.remove()
    np.testing.assert_allclose(doc["data"], seen["post"], rtol=1e-4, atol=1e-5)
    assert doc["steered"]["norm"] == pytest.approx(np.linalg.norm(v), rel=1e-5)


def test_diff_steers_both_texts(cli, tiny, hf):
    doc = cli("diff", TEXT, OTHER, *STEERED, "--json").json()
    tok = tiny.model.tokenizer
    for key, text in (("top_a", TEXT), ("top_b", OTHER)):
        p = np.exp(log_softmax(hf[3](tok.encode(text))))
        assert [r["chance"] for r in doc[key]] == pytest.approx(list(p.max(-1)), rel=1e-4)
    assert "steered" in doc


def test_patch_steers_the_clean_and_the_corrupt_run(cli, tiny, hf):
    tok = tiny.model.tokenizer
    doc = cli("patch", TEXT, OTHER, *STEERED, "--target", " toys", "--vs", " mom",
              "--json").json()
    t, vs = doc["target"]["id"], doc["vs"]["id"]
    for key, text in (("clean", TEXT), ("corrupt", OTHER)):
        z = hf[3](tok.encode(text))[-1].astype(np.float64)
        assert doc[key] == pytest.approx(z[t] - z[vs], abs=1e-4)
    # patching the last block's output at the scored position restores the clean run exactly
    restored = np.asarray(doc["data"])[doc["kinds"].index("resid_post"), -1, -1]
    assert restored == pytest.approx(1.0, abs=1e-6)


def test_ablate_compares_with_the_steered_run(cli, tiny, hf):
    tok = tiny.model.tokenizer
    doc = cli("ablate", TEXT, *STEERED, "--layer", "1", "--head", "0", "--json").json()
    p = np.exp(log_softmax(hf[3](tok.encode(TEXT))[-1]))
    assert doc["top_before"][0]["prob"] == pytest.approx(float(p.max()), rel=1e-4)
    assert doc["top_before"][0]["id"] == int(np.argmax(p))


@pytest.mark.parametrize(("command", "extra"), [
    ("lens", []), ("dla", []), ("score", []), ("neurons", ["--layer", "1"]),
    ("attribute", []), ("heads", []), ("diff", [OTHER]), ("ablate", ["--all"]),
    ("patch", [OTHER])])
def test_scale_zero_is_the_unsteered_run_bit_for_bit(cli, command, extra):
    def without_steered(out):  # the documents with their "steered" field taken out
        docs = [json.loads(line) for line in out.splitlines()]
        return [{k: v for k, v in d.items() if k != "steered"} for d in docs]
    plain = cli(command, TEXT, *extra, "--json")
    zero = cli(command, TEXT, *extra, *STEER, "--steer-scale", "0", "--json")
    assert plain.code == zero.code == 0, zero.err
    assert '"steered"' in zero.out
    assert without_steered(zero.out) == without_steered(plain.out)
    assert zero.out.count('"steered"') == 1 and '"steered"' not in plain.out


def test_every_view_and_picture_of_a_steered_run_says_so(cli, tmp_path):
    note = "steered before this view: layers.1.resid_pre + 3 * v, v = 'Lily was happy' - " \
           "'Lily was sad'"
    for argv in (["lens", TEXT], ["dla", TEXT], ["score", TEXT], ["heads", TEXT],
                 ["neurons", TEXT], ["diff", TEXT, OTHER], ["ablate", TEXT, "--all"],
                 ["attribute", TEXT], ["embed", TEXT], ["patch", TEXT, OTHER]):
        r = cli(*argv, *STEERED)
        assert r.code == 0, (argv, r.err)
        assert r.out.startswith(note), (argv, r.out[:200])
        assert note not in cli(*argv).out
    cli("dla", TEXT, *STEERED, "--save", tmp_path / "d.svg", "--quiet")
    assert "steered before this view: layers.1.resid_pre" in (tmp_path / "d.svg").read_text()
    cli("attn", TEXT, "--ablate", "L1H0", "--save", tmp_path / "a.html", "--quiet")
    assert "ablated (set to zero) before this view: layers.1.heads.0.out" in \
        (tmp_path / "a.html").read_text()


def test_the_trace_holds_the_stream_by_stage_and_by_part(tiny):
    """Trace.stages and Trace.residual_parts, which lens, dla and diff read: the parts of a
    steered run (its shift one of them) add up to its last resid_post at every position."""
    from tinygpt_cli.transformer.hooks import add_vector
    from tinygpt_cli.transformer.trace import run_traced

    m = tiny.model
    ids = m.tokenizer.encode(TEXT)
    shift = np.random.default_rng(2).normal(size=m.config.n_embd)
    steer = add_vector("layers.1.resid_pre", shift, 1.5)
    tr = run_traced(m.params, m.config, ids, hooks=steer)
    names = [n for n, _ in tr.stages(mid=True)]
    assert names == ["embeddings", "layers.0.resid_mid", "layers.0.resid_post",
                     "layers.1.resid_mid", "layers.1.resid_post"]
    assert [n for n, _ in tr.stages()] == ["embeddings", "layers.0.resid_post",
                                           "layers.1.resid_post"]
    for p in range(len(ids)):
        labels, parts = tr.residual_parts(m.params, p, steer)
        np.testing.assert_allclose(parts.sum(0), tr["layers.1.resid_post"][p], atol=2e-5)
        np.testing.assert_array_equal(parts[labels.index("steer")], 1.5 * shift)
    assert "steer" not in tr.residual_parts(m.params, 0)[0]


def test_qk_of_a_steered_run_has_a_steer_part_and_its_terms_add_up(cli, tiny, hf):
    """qk on a steered run: the attention weights are transformers' with the pre-hook; the
    steering vector is a part of the stream from its block on, on both sides, and the terms
    still add up to the scores."""
    torch, model, v, _ = hf
    ids = tiny.model.tokenizer.encode(TEXT)
    with hf_steering(torch, model, v, 1, SCALE):
        attn = model(torch.tensor([ids]), output_attentions=True).attentions
    for layer in (1, -1):  # the block the vector is added before, and the last
        r = cli("qk", TEXT, "--layer", str(layer), "--head", "1", *STEERED, "--json")
        assert r.code == 0, r.err
        doc = r.json()
        assert doc["steered"]["site"] == "layers.1.resid_pre"
        np.testing.assert_allclose(doc["weights"], attn[layer][0, 1, -1, : len(ids)].numpy(),
                                   atol=1e-5)
        terms = np.asarray(doc["data"])
        np.testing.assert_allclose(terms.sum(axis=(0, 1)), doc["scores"], atol=1e-4)
        at = doc["sources"].index("steer")
        assert np.abs(terms[at]).max() > 0 and np.abs(terms[:, at]).max() > 0
    unsteered = cli("qk", TEXT, "--layer", "0", "--head", "1", *STEERED, "--json").json()
    assert "steer" not in unsteered["sources"]  # block 0 reads the stream before the vector


def test_attribute_faithfulness_erases_tokens_of_the_steered_run(cli, tiny, hf):
    """attribute --faithfulness on a steered run: f is the steered run's (transformers with
    the pre-hook), and the occlusion drops are those of steered runs with one token's
    embedding zeroed."""
    torch, model, v, steered = hf
    ids = tiny.model.tokenizer.encode(TEXT)
    r = cli("attribute", TEXT, "--faithfulness", *STEERED, "--target", " toys", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    t = doc["target"]["id"]
    assert doc["steered"]["site"] == "layers.1.resid_pre"
    assert doc["f"] == pytest.approx(float(steered(ids)[-1, t]), abs=1e-4)
    with hf_steering(torch, model, v, 1, SCALE):
        embeds = model.transformer.wte(torch.tensor([ids]))
        embeds[0, 2] = 0.0  # token 2 erased (the zero baseline)
        z = model(inputs_embeds=embeds).logits[0, -1, t].item()
    assert doc["occlusion"][2] == pytest.approx(doc["f"] - z, abs=1e-4)
    plain = cli("attribute", TEXT, "--faithfulness", "--target", " toys", "--json").json()
    assert "steered" not in plain and plain["f"] != pytest.approx(doc["f"], abs=1e-3)


def test_a_steered_neuron_search_is_kept_under_its_own_key(cli, tmp_path, monkeypatch):
    """neurons --neuron on a steered run reads the data once per steering vector, like the
    unsteered search, and never answers one from the other's cache entry."""
    import tinygpt_cli.jobs.neurons as nrn

    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "cache"))
    stories = tmp_path / "stories.txt"
    stories.write_text("Lily wanted to play with her ball. Tom was happy.\n\n" * 60,
                       encoding="utf-8")
    calls = []
    real = nrn.corpus_maxima
    monkeypatch.setattr(nrn, "corpus_maxima", lambda *a, **k: calls.append(1) or real(*a, **k))
    search = ["neurons", "--layer", "1", "--neuron", "3", "--data", stories, "--any-data",
              "--json"]
    first = cli(*search, *STEERED)
    assert first.code == 0, first.err
    again = cli(*search, *STEERED)
    assert again.out == first.out and len(calls) == 1
    plain = cli(*search)
    assert len(calls) == 2 and "steered" not in plain.json()
    assert plain.json()["files"] == [str(stories)]
    assert plain.json()["data"] != first.json()["data"]
    other = cli(*search, *STEER, "--steer-scale", "1")
    assert len(calls) == 3 and other.json()["data"] != first.json()["data"]
