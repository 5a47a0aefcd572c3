"""--each-line's passes made ahead in batches (ahead.py, model.run_to_final_norm): every number the
same, bit for bit, as the line's own run.

The batched pass is checked against the recorded pass (`trace`, `record`) of each text alone,
on the shipped float32 weights (where BLAS rounds a row of a larger product differently) and
on float64 ones; the commands' outputs against runs of each line on its own, on lines of very
different lengths (one token, a line longer than the context, emoji), with chunks and
batches made small so that lines fall on their edges.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygpt_cli.jobs import ahead
from tinygpt_cli.jobs.session import Session
from tinygpt_cli.storage.locations import SHIPPED
from tinygpt_cli.transformer.folder import load_model
from tinygpt_cli.transformer.hooks import ablation
from tinygpt_cli.transformer.model import forward, record, run_to_final_norm
from tinygpt_cli.transformer.trace import run_traced

shipped = pytest.mark.skipif(not (SHIPPED / "model.safetensors").is_file(),
                             reason="the shipped weights are not here")


@pytest.fixture(scope="module")
def model():
    return load_model(SHIPPED)


def recorded_final_norm(params, config, ids) -> np.ndarray:
    """ln_final.out of one text's recorded pass (as `score` and `trace` make it)."""
    return record(params, config, np.asarray(ids), {"ln_final.out"})[1]["ln_final.out"]


@shipped
@pytest.mark.parametrize("length", [1, 2, 3, 7, 34, 64, 128])
def test_a_batch_of_texts_gives_each_texts_own_numbers(model, length):
    rng = np.random.default_rng(length)
    batch = rng.integers(0, model.config.vocab_size, (5, length))
    u = run_to_final_norm(model.params, model.config, batch)
    assert u.shape == (5, length, model.config.n_embd)
    for ids, row in zip(batch, u, strict=True):
        np.testing.assert_array_equal(row, recorded_final_norm(model.params, model.config, ids))
        traced = run_traced(model.params, model.config, ids)
        np.testing.assert_array_equal(row, traced.values["ln_final.out"])


@shipped
@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.integers(0, 4095), min_size=1, max_size=40), min_size=1,
                max_size=6))
def test_any_texts_batched_by_length_equal_their_own_passes(model, texts):
    for length in {len(t) for t in texts}:
        same = [t for t in texts if len(t) == length]
        u = run_to_final_norm(model.params, model.config, np.asarray(same))
        for ids, row in zip(same, u, strict=True):
            np.testing.assert_array_equal(
                row, recorded_final_norm(model.params, model.config, ids))


def test_float64_batches_too(tiny_params, tiny_config):
    rng = np.random.default_rng(0)
    for length in (1, 5, tiny_config.n_positions):
        batch = rng.integers(0, tiny_config.vocab_size, (3, length))
        u = run_to_final_norm(tiny_params, tiny_config, batch)
        for ids, row in zip(batch, u, strict=True):
            np.testing.assert_array_equal(row, recorded_final_norm(tiny_params, tiny_config, ids))


@shipped
@pytest.mark.parametrize("text", ["a", "Lily", "Once upon a time, there was a little girl."])
def test_session_logits_are_the_traces_own(model, text):
    s = Session.open(text, model=model)
    np.testing.assert_array_equal(s.logits(), s.trace()["logits"])
    # forward without hooks takes generation's one-position shortcut in the norms: what the
    # session's logits avoid, to stay the trace's numbers
    assert s.logits().shape == forward(model.params, model.config, np.asarray(s.ids)).shape
    ablated = Session.open(text, model=model,
                           interventions=ablation(["layers.0.attn_out"], model.config))
    np.testing.assert_array_equal(ablated.logits(), ablated.trace()["logits"])
    assert not np.array_equal(ablated.logits(), s.logits())


# ------------------------------------------------------------------ the commands

LINES = ["a", "Lily", "", "Once upon a time, there was a little girl named Lily.",
         "  ", "She liked to play 🙂 with her red ball in the park, and 🐶 barked.",
         "Tom", "Lily",  # a line again: its own pass, as every line's
         "One day, Lily saw a big dog. " * 6, "The end."]
TOO_LONG = "dog " * 200  # more than the 128-token context


def each_line_equals_single_runs(cli, tmp_path, args, lines, *, json=True):
    f = tmp_path / "lines.txt"
    f.write_text("\n".join(lines) + "\n", encoding="utf-8")
    flag = ["--json"] if json else []
    out = cli(*args, "--each-line", f, *flag)
    assert out.code == 0, out.err
    if not json:
        want = ""
        for n, line in enumerate(lines, 1):
            if line.strip():
                single = cli(*args, "--", line)
                assert single.code == 0, single.err
                want += f"line {n}: {line[:80]}\n" + single.out + "\n"
        assert out.out == want
        return out
    records = out.ndjson()
    assert [r["text"] for r in records] == [x for x in lines if x.strip()]
    for r in records:
        single = cli(*args, "--json", "--", r["text"])
        assert single.code == 0, single.err
        want = single.ndjson() if args[0] == "score" else single.json()
        assert r["result"] == want, r["text"]
    return out


@pytest.fixture
def small_batches(monkeypatch):
    """Chunks of a few lines and batches of two: lines on every kind of edge."""
    monkeypatch.setattr(ahead, "CHUNK_TOKENS", 40)
    monkeypatch.setattr(ahead, "BATCH", 2)


@pytest.fixture
def passes(monkeypatch):
    """How many batched passes ran, and over how many texts."""
    seen = []
    real = ahead.final_norm_of

    def counted(params, config, ids):
        seen.append(len(ids))
        return real(params, config, ids)

    monkeypatch.setattr(ahead, "final_norm_of", counted)
    return seen


@shipped
@pytest.mark.parametrize("args", [["probs"], ["probs", "--position", "0", "--top", "3"],
                                  ["logits"], ["sample", "--seed", "3"], ["score"]])
def test_each_line_equals_each_line_alone_on_the_shipped_model(cli, tmp_path, args, passes):
    lines = LINES + [TOO_LONG] if args[0] == "score" else LINES  # score reads it in windows
    each_line_equals_single_runs(cli, tmp_path, [*args, "--weights", SHIPPED], lines)
    fit = [x for x in lines if x.strip() and x != TOO_LONG]
    assert len(passes) < len(fit) == sum(passes)  # each line that fits once, in batches


@shipped
def test_each_line_views_equal_each_line_alone(cli, tmp_path, small_batches):
    for args in (["probs"], ["score", "--no-show-text"]):
        each_line_equals_single_runs(cli, tmp_path, [*args, "--weights", SHIPPED], LINES,
                                     json=False)


@pytest.mark.parametrize("args", [["probs", "--top", "2"], ["score"],
                                  ["probs", "--ablate", "layers.0.attn_out"]])
def test_small_chunks_and_batches_change_nothing(cli, tmp_path, args, small_batches, passes):
    each_line_equals_single_runs(cli, tmp_path, args, LINES)
    assert (passes == []) == ("--ablate" in args)  # a changed run makes its own pass


def test_a_line_too_long_is_said_and_the_lines_after_it_run(cli, tmp_path):
    f = tmp_path / "lines.txt"
    f.write_text("\n".join(["Lily", "Tom saw", TOO_LONG, "Lily"]) + "\n", encoding="utf-8")
    r = cli("probs", "--each-line", f, "--json")
    assert r.code == 2 and r.err.startswith("error: line 3: the text is ")
    assert len(r.err.splitlines()) == 1
    records = r.ndjson()
    assert [x["line"] for x in records] == [1, 2, 4]
    assert [x["result"] for x in records] == [cli("probs", "--json", t).json()
                                              for t in ("Lily", "Tom saw", "Lily")]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([0.0, -0.0, 1.0, 2.5, -3.0, 1e-30, np.inf, -np.inf, np.nan]),
                min_size=1, max_size=30), st.integers(0, 35))
def test_top_order_is_the_stable_sort_of_the_whole_row(values, k):
    from tinygpt_cli.analysis.lens import top_order

    row = np.asarray(values, dtype=np.float32)
    np.testing.assert_array_equal(top_order(row, k), np.argsort(-row, kind="stable")[:k])


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(codec="utf-8"), max_size=12)
       | st.text(st.sampled_from(" a\n\t\r\x1b\x7f\x9b\u00a0\u2028\u202e\u2067é🙂"), max_size=8))
def test_shown_text_is_the_character_by_character_escape(text):
    """show_token, show_text and escape_line take a shortcut for printable text: the same as
    looking at every character."""
    from tinygpt_cli.render import text as shown

    def control(ch):
        return ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0 or 0x202A <= ord(ch) <= 0x202E \
            or 0x2066 <= ord(ch) <= 0x2069

    def esc(ch):
        return f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"

    visible = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}
    assert shown.show_token(text) == "".join(
        visible.get(ch) or (esc(ch) if control(ch) else ch) for ch in text)
    assert shown.show_text(text) == "".join(
        ch if ch in "\n\t" or not control(ch) else esc(ch) for ch in text)
    assert shown.escape_line(text) == "".join(esc(ch) if control(ch) else ch for ch in text)
