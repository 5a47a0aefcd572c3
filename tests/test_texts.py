"""score, heads, neurons, diff and --each-line: each checked against an independent
computation (a naive loop, a direct formula, the training code's own evaluation)."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import TEXT, assert_one_error_line, file_names, make_tiny, random_params
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygpt_cli.analysis import diff as diffs
from tinygpt_cli.analysis import heads as detect
from tinygpt_cli.analysis import neurons as nrn
from tinygpt_cli.analysis import score as sc
from tinygpt_cli.transformer.folder import load_model
from tinygpt_cli.transformer.model import forward
from tinygpt_cli.transformer.trace import run_traced

DATA = next((p / "shared" / "data" / "tinystories" for p in Path(__file__).resolve().parents
             if (p / "shared" / "data" / "tinystories" / "part-005.txt").is_file()), None)
LONG = ("Once upon a time, there was a little girl named Lily. She liked to play with her red "
        "ball in the park. One day, Lily saw a big dog. The dog wanted to play too! ") * 5


def log_softmax64(z):
    z = np.asarray(z, np.float64)
    z = z - z.max()
    return z - math.log(np.exp(z).sum())


# ------------------------------------------------------------------ score: windows and maths


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 400), context=st.integers(1, 40), data=st.data())
def test_windows_score_every_target_once_within_the_context(n, context, data):
    stride = data.draw(st.integers(1, context))
    ws = sc.windows(n, context, stride)
    scored = [t for w in ws for t in range(w.first, w.end + 1)]
    assert scored == list(range(1, n))  # each target once, in order
    for w in ws:
        assert 0 < w.end - w.start <= context and w.start < w.first
        # once the text is longer than the context, a target sees context - stride before it
        for t in range(w.first, w.end + 1):
            assert t - w.start >= min(t, context - stride + 1)


def test_full_only_windows_are_the_training_codes_eval_windows():
    from tinygpt_cli.transformer.windows import eval_windows

    stream = np.arange(1000) % 97
    x, y = eval_windows(stream, 128)
    ws = sc.windows(len(stream), 128, 128, full_only=True)
    assert [(w.start, w.end) for w in ws] == [(i * 128, (i + 1) * 128) for i in range(len(x))]
    assert np.array_equal(np.concatenate([stream[w.first:w.end + 1] for w in ws]), y.ravel())


def test_token_scores_match_a_direct_loop():
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, (20, 50)).astype(np.float32)
    logits[3, :] = logits[3, 7]  # a tie: rank counts only the strictly higher
    targets = rng.integers(0, 50, 20)
    s = sc.token_scores(logits, targets)
    for i, t in enumerate(targets):
        lp = log_softmax64(logits[i])
        p = np.exp(lp)
        assert s.nats[i] == pytest.approx(-lp[t], rel=1e-5, abs=1e-6)
        assert s.prob[i] == pytest.approx(p[t], rel=1e-5)
        assert s.entropy[i] == pytest.approx(-(p * lp).sum(), rel=1e-5, abs=1e-6)
        assert s.rank[i] == 1 + sum(logits[i, j] > logits[i, t] for j in range(50))
    assert s.rank[3] == 1


def test_scores_with_a_stride_equal_a_naive_window_per_token(tiny):
    params, cfg = tiny.model.params, tiny.model.config
    seq = np.asarray([0] + tiny.model.tokenizer.encode(LONG))
    assert len(seq) > cfg.n_positions + 40
    stride = 50
    (_, s), = sc.score_sequences(params, cfg, [seq], stride=stride, batch_size=3)
    for t in list(range(1, 6)) + list(range(cfg.n_positions - 3, len(seq), 17)):
        k = max(0, -(-(t - cfg.n_positions) // stride))  # the first window reaching t
        lp = log_softmax64(forward(params, cfg, seq[k * stride : t])[-1])
        assert s.nats[t - 1] == pytest.approx(-lp[seq[t]], rel=1e-4, abs=1e-5), t


# ------------------------------------------------------------------ score: the command


def test_score_agrees_with_minus_log_probs(cli):
    records = cli("score", "--no-bos", TEXT, "--json").ndjson()
    tokens, summary = records[:-1], records[-1]
    assert summary["summary"] and summary["tokens"] == len(tokens) == 5
    for r in tokens:
        prefix = cli("encode", TEXT, "--json").json()["tokens"][: r["position"]]
        probs = cli("probs", "".join(prefix), "--json").json()
        assert r["prob"] == pytest.approx(probs["data"][r["id"]], rel=1e-4)
        assert r["nats"] == pytest.approx(-math.log(probs["data"][r["id"]]), rel=1e-4, abs=1e-5)
        assert r["bits"] == pytest.approx(r["nats"] / math.log(2))
    mean = np.mean([r["nats"] for r in tokens])
    assert summary["mean_nats"] == pytest.approx(mean)
    assert summary["perplexity"] == pytest.approx(math.exp(mean))


def test_score_puts_the_separator_first_by_default(cli):
    records = cli("score", TEXT, "--json").ndjson()[:-1]
    assert [r["position"] for r in records] == list(range(6))
    probs = cli("probs", "<|endoftext|>", "--json").json()  # the separator alone
    assert records[0]["prob"] == pytest.approx(probs["data"][records[0]["id"]], rel=1e-4)


def test_score_file_counts_bytes_as_the_model_card(cli, tmp_path):
    stories = ["Lily saw a dog.\n\nThe dog was big.", "Tom had a red ball. He liked it."]
    f = tmp_path / "s.txt"
    f.write_text("\n<|endoftext|>\n".join(stories) + "\n<|endoftext|>\n", encoding="utf-8")
    out = cli("score", "--file", f, "--json").ndjson()
    summary = out[-1]
    assert summary["sequences"] == 2  # the blank line inside the first story does not split
    assert summary["bytes"] == sum(len(s.encode()) + 1 for s in stories)
    assert [r["token"] for r in out[:-1] if r["token"] == "<|endoftext|>"] == ["<|endoftext|>"] * 2
    assert summary["bits_per_byte"] == pytest.approx(
        sum(r["bits"] for r in out[:-1]) / summary["bytes"])


def test_score_view_colours_the_text_and_lists_surprises(cli):
    r = cli("score", TEXT)
    assert r.code == 0 and "most surprising tokens" in r.out
    assert "surprisal:" not in r.out  # the key to the colours: a pipe shows none
    assert "Lily wanted to play with her" in r.out and "\x1b[" not in r.out


def test_score_view_shows_accents_and_emoji_split_over_tokens_as_text(cli, tiny):
    text = "Zoë went to the café 😀"
    ids = tiny.model.tokenizer.encode(text)
    assert len(ids) > len(text.split())  # some characters are split into byte tokens
    r = cli("score", text)
    assert r.code == 0 and text in r.out.splitlines(), r.out  # the text line, whole
    # (the table's token column still names a lone byte token by its byte: \x98)


@pytest.mark.parametrize("args, needle", [
    (["--stream", TEXT], "--stream reads a file"),
    (["--stride", "500", TEXT], "--stride 500 is longer than the 128-token context"),
    (["--no-bos", "Lily"], "one token alone"),
])
def test_score_bad_input(cli, args, needle):
    assert_one_error_line(cli("score", *args), 2, needle)


@pytest.mark.slow
@pytest.mark.skipif(DATA is None, reason="no TinyStories data beside the checkout")
def test_score_stream_reproduces_the_training_codes_validation_loss(capsys, monkeypatch):
    """The model card's figure is train.loop.evaluate on part-005; score --stream must give it."""
    from cli_helpers import Runner, clean_env

    from tinygpt_cli.jobs.corpus import read_stories
    from tinygpt_cli.jobs.train.card import bits_per_byte
    from tinygpt_cli.jobs.train.loop import evaluate
    from tinygpt_cli.transformer.windows import encode_stories

    clean_env(monkeypatch)
    part = DATA / "part-005.txt"
    out = Runner(capsys, monkeypatch)("score", "--file", part, "--stream", "--json").out
    summary = json.loads(out[out.rindex("\n", 0, -1) + 1 :])  # the last line
    model = load_model()
    stream = encode_stories(read_stories([part]), model.tokenizer)
    loss = evaluate(model.params, model.config, stream.ids, batch_size=64)
    assert summary["mean_nats"] == pytest.approx(loss, rel=2e-5)
    assert summary["bits_per_byte"] == pytest.approx(
        bits_per_byte(loss, stream.bytes_per_token), rel=2e-5)


# ------------------------------------------------------------------ heads


def naive_pattern(kind, ids):
    t = len(ids)
    p = np.zeros((t, t))
    for i in range(t):
        for j in range(t):
            if kind == "previous_token":
                p[i, j] = j == i - 1
            elif kind == "duplicate_token":
                p[i, j] = j < i and ids[j] == ids[i]
            else:
                p[i, j] = 1 <= j <= i and j - 1 < i and ids[j - 1] == ids[i]
    return p


@pytest.mark.parametrize("kind", detect.KINDS)
def test_patterns_match_their_definitions_and_score_themselves_one(kind):
    ids = np.random.default_rng(1).integers(0, 5, 30)
    p = detect.pattern(kind, ids)
    assert np.array_equal(p, naive_pattern(kind, ids))
    assert detect.detection_score(p, p) == pytest.approx(1.0)
    assert detect.detection_score(3.0 * p, p) == pytest.approx(1.0)
    # an attention grid (rows sum to 1) that looks only where the pattern says scores 1 too
    rows = p.sum(axis=1) > 0
    grid = np.where(rows[:, None], p / np.maximum(p.sum(axis=1, keepdims=True), 1), 0)
    assert detect.detection_score(grid, p) == pytest.approx(1.0)


def test_score_is_over_the_whole_grid_and_bos_and_current_can_be_left_out():
    a = np.array([[1.0, 0, 0], [0.5, 0.5, 0], [0.2, 0.6, 0.2]])
    p = detect.previous_token_pattern(3)
    assert detect.detection_score(a, p) == pytest.approx((0.5 + 0.6) / 3)  # not a row mean
    assert detect.detection_score(a, p, exclude_first=True) == pytest.approx(0.6 / 1.3)
    assert detect.detection_score(a, p, exclude_current=True) == pytest.approx(1.1 / 1.3)


def test_head_scores_on_texts_equal_a_loop_over_each_heads_grid(tiny_config, tiny_params):
    texts = [[0, 3, 4, 3, 4, 5], [0, 7, 7, 2]]
    got = detect.text_scores(tiny_params, tiny_config, texts)
    for kind in detect.KINDS:
        want = np.zeros((tiny_config.n_layer, tiny_config.n_head))
        for ids in texts:
            tr = run_traced(tiny_params, tiny_config, np.asarray(ids))
            for layer in range(tiny_config.n_layer):
                for h in range(tiny_config.n_head):
                    a = tr.get(f"layers.{layer}.heads.{h}.weights")
                    want[layer, h] += (a * naive_pattern(kind, ids)).sum() / a.sum() / len(texts)
        np.testing.assert_allclose(got[kind], want, rtol=1e-10)


def test_induction_stripe_is_one_on_a_perfect_induction_grid():
    n = 5
    ids = detect.repeated_random_tokens(np.random.default_rng(0), 50, n, 1, 0)[0]
    assert np.array_equal(ids[1 : 1 + n], ids[1 + n :]) and 0 not in ids[1:]
    p = detect.induction_pattern(ids)
    grid = np.zeros((1, 1, 1, len(ids), len(ids)))
    grid[0, 0, 0] = p
    assert detect.induction_stripe(grid, n)[0, 0] == pytest.approx(1.0)
    assert detect.induction_stripe(np.zeros_like(grid), n)[0, 0] == 0.0


def test_heads_command_json(cli, tiny):
    doc = cli("heads", "Tom saw a dog. Tom saw a dog.", "--json").json()
    cfg = tiny.model.config
    assert doc["shape"] == [4, cfg.n_layer, cfg.n_head]
    assert doc["kinds"] == ["previous_token", "duplicate_token", "induction", "induction_random"]
    eot = tiny.model.tokenizer.eot_id
    assert doc["text_ids"] == [[eot] + tiny.model.tokenizer.encode("Tom saw a dog. Tom saw a dog.")]
    assert ((np.asarray(doc["data"]) >= 0) & (np.asarray(doc["data"]) <= 1)).all()
    rep = doc["repeat"]
    assert rep["loss_drop"] == pytest.approx(rep["loss_first"] - rep["loss_second"])
    again = cli("heads", "--text", "Tom saw a dog. Tom saw a dog.", "--json").json()
    assert again["data"] == doc["data"]  # same seed, same text
    assert cli("heads").code == 0  # the default texts


def test_heads_refuses_texts_the_exclusions_leave_nothing_of(cli, tiny):
    one = tiny.model.tokenizer.decode([tiny.model.tokenizer.encode("Lily")[0]])
    assert len(tiny.model.tokenizer.encode(one)) == 1
    for extra in ((), ("--json",)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a NumPy warning would end in the catch-all
            assert_one_error_line(cli("heads", one, "--exclude-bos", "--exclude-current", *extra),
                                  2, "nothing left to score", "one token")
    for t in range(1, 6):
        for first in (False, True):
            for current in (False, True):
                naive = sum(1 for i in range(t) for j in range(i + 1)
                            if not (first and j == 0) and not (current and i == j))
                assert detect.cells_left(t, exclude_first=first, exclude_current=current) == naive


def test_heads_on_a_file_skips_the_one_token_stories_and_says_how_many(cli, tiny, tmp_path):
    one = tiny.model.tokenizer.decode([tiny.model.tokenizer.encode("Lily")[0]])
    stories = ["Tom saw a dog. Tom saw a dog.", one, "Lily had a red ball and a ball."]
    mixed, clean = tmp_path / "mixed.txt", tmp_path / "clean.txt"
    mixed.write_text("\n<|endoftext|>\n".join(stories), encoding="utf-8")
    clean.write_text("\n<|endoftext|>\n".join([stories[0], stories[2]]), encoding="utf-8")
    flags = ("--exclude-bos", "--exclude-current", "--json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = cli("heads", "--file", mixed, *flags)
    assert got.code == 0, got.err
    doc, want = got.json(), cli("heads", "--file", clean, *flags).json()
    assert doc["skipped_texts"] == 1 and doc["texts"] == 2 and want["skipped_texts"] == 0
    data = np.asarray(doc["data"], dtype=float)
    assert np.isfinite(data).all()  # not one null: the short story is out of the mean
    np.testing.assert_allclose(data, np.asarray(want["data"], dtype=float), rtol=1e-12)
    shown = cli("heads", "--file", mixed, "--exclude-bos", "--exclude-current")
    assert shown.code == 0 and "1 text of one token left out" in shown.out


# ------------------------------------------------------------------ neurons


def test_neuron_output_logits_equal_a_dot_per_token(tiny_params, tiny_config):
    got = nrn.output_logits(tiny_params, tiny_config, 1, [3, 0])
    raw = nrn.output_logits(tiny_params, tiny_config, 1, [3], through_norm=False)
    f = file_names(tiny_params)
    w, g, e = (f[k] for k in ("h.1.mlp.c_proj.weight", "ln_f.weight", "wte.weight"))
    for v in range(e.shape[0]):
        assert got[0, v] == pytest.approx(sum(w[3, i] * g[i] * e[v, i] for i in range(len(g))))
        assert raw[0, v] == pytest.approx(float(np.dot(w[3], e[v])))


def test_neurons_on_a_text_lists_the_most_active(cli, tiny):
    doc = cli("neurons", TEXT, "--layer", "1", "--top", "3", "--json").json()
    post = tiny.trace(doc["ids"]).get("layers.1.mlp_post")
    assert [n["neuron"] for n in doc["top_neurons"]] == list(np.argsort(-post.max(0))[:3])
    assert len(doc["top_neurons"][0]["pushes"]) == 8


def test_neuron_examples_are_the_corpus_maxima_and_are_cached(cli, tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "part-000.txt").write_text(
        (LONG + "\n<|endoftext|>\n") * 3, encoding="utf-8")
    args = ("neurons", "--layer", "1", "--neuron", "5", "--data", tmp_path / "data", "--top", "2",
            "--json")
    doc = cli(*args).json()
    # brute force: every window's activations of that neuron
    from tinygpt_cli.jobs.corpus import read_stories
    from tinygpt_cli.transformer.windows import encode_stories, eval_windows

    stream = encode_stories(read_stories([tmp_path / "data" / "part-000.txt"]),
                            tiny.model.tokenizer)
    x, _ = eval_windows(stream.ids, 128)
    acts = np.stack([tiny.trace(w).get("layers.1.mlp_post")[:, 5] for w in x])
    best = np.argsort(-acts.max(axis=1), kind="stable")[:2]
    assert [e["window"] for e in doc["examples"]] == list(best)
    assert doc["examples"][0]["max"] == pytest.approx(acts.max(), rel=1e-5)
    assert len(list((tmp_path / "cache" / "neurons").glob("*.npz"))) == 1
    real = nrn.window_maxima
    monkeypatch.setattr(nrn, "window_maxima", lambda *a, **k: pytest.fail("not cached"))
    assert cli(*args).json() == doc
    monkeypatch.setattr(nrn, "window_maxima", real)
    with open(tmp_path / "data" / "part-000.txt", "a", encoding="utf-8") as f:
        f.write(LONG)  # other data: another entry, never the stale one
    assert cli(*args).code == 0
    assert len(list((tmp_path / "cache" / "neurons").glob("*.npz"))) == 2


# ------------------------------------------------------------------ diff


def test_a_text_against_itself_differs_by_nothing(cli):
    doc = cli("diff", TEXT, TEXT, "--json").json()
    assert np.allclose(doc["data"], 0) and np.allclose(doc["cosine"], 1)
    kl = cli("diff", TEXT, "--weights-b", cli_weights(), "--json").json()
    assert np.allclose(kl["data"], 0, atol=1e-12) and all(kl["same_top"])
    assert np.allclose(kl["delta_p"], 0)


def cli_weights():
    import os

    return os.environ["TINYGPT_WEIGHTS"]


def test_two_models_kl_and_delta_p_equal_the_formulas(cli, tiny, tmp_path):
    other = make_tiny(tmp_path / "b", random_params(tiny.model.config, seed=9))
    doc = cli("diff", TEXT, "--weights-b", other.folder, "--json").json()
    la, lb = tiny.trace(doc["ids"]).get("logits"), other.trace(doc["ids"]).get("logits")
    for t in range(len(doc["ids"])):
        pa, pb = log_softmax64(la[t]), log_softmax64(lb[t])
        assert doc["data"][t] == pytest.approx((np.exp(pa) * (pa - pb)).sum(), rel=1e-6)
        assert doc["same_top"][t] == (np.argmax(la[t]) == np.argmax(lb[t]))
        if t + 1 < len(doc["ids"]):
            nxt = doc["ids"][t + 1]
            assert doc["delta_p"][t] == pytest.approx(math.exp(pb[nxt]) - math.exp(pa[nxt]),
                                                      abs=1e-9)


def test_two_texts_distance_is_zero_where_nothing_before_differs(cli):
    doc = cli("diff", "Lily wanted to play", "Tom wanted to play with", "--json").json()
    d = np.asarray(doc["data"])  # stages x the 4 positions both texts have
    assert d.shape == (3, 4) and doc["stages"][0] == "embeddings"
    assert np.allclose(d[0, 1:], 0) and (d[1:, 1:] > 0).all()  # attention carries the change
    assert diffs.relative_distance(np.ones(3), 2 * np.ones(3)) == pytest.approx(1.0)
    assert diffs.cosine(np.ones(3), 2 * np.ones(3)) == pytest.approx(1.0)


def test_diff_needs_two_texts(cli):
    assert_one_error_line(cli("diff", TEXT), 2, "two texts")


# ------------------------------------------------------------------ --each-line


@pytest.mark.parametrize("command", [["probs", "--top", "2"], ["score"], ["heads"],
                                     ["neurons", "--layer", "0"], ["diff", TEXT]])
def test_each_line_gives_one_record_per_line_equal_to_a_single_run(cli, tmp_path, command):
    lines = ["Lily wanted to play", "", "  ", "-Tom saw a dog"]
    f = tmp_path / "lines.txt"
    f.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = cli(*command, "--each-line", f, "--json")
    assert out.code == 0, out.err
    records = out.ndjson()
    assert [(r["line"], r["text"]) for r in records] == [(1, lines[0]), (4, lines[3])]
    for r in records:
        single = cli(*command, "--json", "--", r["text"])
        want = single.ndjson() if command == ["score"] else single.json()
        assert r["result"] == want
    via_stdin = cli(*command, "--each-line", "-", "--json", stdin=f.read_text())
    assert via_stdin.ndjson() == records


def test_each_line_view_heads_each_result(cli, tmp_path):
    f = tmp_path / "lines.txt"
    f.write_text("Lily wanted\nTom saw\n", encoding="utf-8")
    out = cli("logits", "--each-line", f)
    assert out.code == 0 and "line 1: Lily wanted" in out.out and "line 2: Tom saw" in out.out


def test_each_line_after_a_group_option_with_a_value(cli, tiny, tmp_path):
    """`tinygpt --weights DIR probs --each-line F`: the command is probs, not DIR (the
    value of the group's --weights was taken for the command's name)."""
    f = tmp_path / "lines.txt"
    f.write_text("Lily wanted\nTom ran\n")
    after = cli("probs", "--each-line", f, "--json", "--weights", tiny.folder)
    for before in (["--weights", tiny.folder], [f"--weights={tiny.folder}"],
                   ["--threads", "1", "--weights", tiny.folder]):
        r = cli(*before, "probs", "--each-line", f, "--json")
        assert (r.code, r.out) == (0, after.out), r.err


def test_each_line_errors_name_the_line(cli, tmp_path):
    f = tmp_path / "lines.txt"
    f.write_text("Lily\n" + "dog " * 200 + "\n", encoding="utf-8")
    r = cli("probs", "--each-line", f, "--json")
    assert r.code == 2 and r.err.startswith("error: line 2: the text is ")
    assert "tokens long" in r.err
    assert len(r.out.splitlines()) == 1  # line 1's result; line 2 has none
    assert_one_error_line(cli("info", "--each-line", f), 2, "info does not read one")
    assert_one_error_line(cli("probs", "--each-line", tmp_path / "nope"), 2, "no such file")


@pytest.mark.parametrize("args, needle", [
    (["heads", "Tom saw a dog. Tom saw a dog."], "induction (random)"),
    (["neurons", TEXT, "--layer", "-1"],
     "pushes up: the logits of W_out[n] * ln_final.weight @ W_E^T"),
    (["neurons", TEXT, "--raw"], "pushes up: the logits of W_out[n] @ W_E^T"),
    (["diff", TEXT, "Tom wanted to play with his"], "relative distance"),
    (["diff", TEXT, "--weights-b", None], "same top token 100%"),
])
def test_views_print_without_escape_codes_in_a_pipe(cli, args, needle):
    args = [cli_weights() if a is None else a for a in args]
    r = cli(*args)
    assert r.code == 0, r.err
    assert needle in r.out and "\x1b[" not in r.out and r.err == ""


@pytest.mark.parametrize("args, needle", [
    (["neurons", "--layer", "0", "--neuron", "99"], "neuron 99 is out of range"),
    (["neurons", TEXT, "--layer", "7"], "layer 7 is out of range"),
    (["heads", "--repeat-length", "70"], "does not fit twice"),
    (["diff", TEXT, "Tom", "--weights-b", "."], "give one text"),
])
def test_bad_input_is_one_error_line(cli, args, needle):
    assert_one_error_line(cli(*args), 2, needle)


def test_each_line_after_double_dash_is_just_text(cli):
    doc = cli("encode", "--json", "--", "--each-line").json()
    assert "".join(doc["tokens"]) == "--each-line"


@pytest.mark.parametrize("width", [30, 50, 80, 200])
def test_a_window_line_narrows_to_fit_the_width_and_keeps_its_peak(width):
    # sae feature's and neurons' context rows wrapped to the next line's first column when
    # the window was wider than the terminal; they now drop tokens each side of the peak
    from rich.console import Console
    from rich.text import Text

    from tinygpt_cli.render.texts import WindowLine, window_line

    tokens = [" Jenny", " watched", " it", " and", " waved", " goodbye", ".", " She",
              " smiled", " and", " said", ",", " happy", " and", " warm"] * 2
    acts = np.zeros(len(tokens))
    acts[12] = 3.0
    console = Console(width=width, record=True, color_system=None)
    console.print(WindowLine(Text("  3.789  "), tokens, acts, 12, radius=7))
    lines = console.export_text().splitlines()
    assert len(lines) == 1 and len(lines[0]) <= width and "[happy]" in lines[0]
    # the widest window that fits: one more token each side would not
    shown = lines[0].rstrip()
    wider = {r: "  3.789  " + window_line(tokens, acts, 12, r).plain for r in range(8)}
    r = next(r for r in range(7, -1, -1) if wider[r] == shown)
    assert r == 7 or len(wider[r + 1]) > width
