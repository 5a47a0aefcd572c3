"""What a newcomer trips on (issue 35): files the tool wrote are never overwritten without
--force, and the refusal names the file and the option."""

from __future__ import annotations

import shutil

import pytest
from cli_helpers import assert_one_error_line
from conftest import story_parts

OLD = b"written before\n"


@pytest.fixture
def folder(tmp_path, tiny):
    """A copy of the tiny weights folder holding what a shipped folder holds beside the
    weights: an SAE, a tuned lens, the means and a model card (each a few bytes, to be kept)."""
    copy = tmp_path / "weights"
    shutil.copytree(tiny.folder, copy)
    for name in ("sae/layers.1.mlp_out.safetensors", "lens/tuned.safetensors",
                 "means.safetensors", "MODEL_CARD.md", "loss_curve.svg"):
        (copy / name).parent.mkdir(exist_ok=True)
        (copy / name).write_bytes(OLD)
    return copy


@pytest.fixture
def data(tmp_path):
    return story_parts(tmp_path / "data")


@pytest.mark.parametrize("argv, name, option", [
    (["sae", "train", "--site", "layers.1.mlp_out"], "sae/layers.1.mlp_out.safetensors",
     "--out"),
    (["means"], "means.safetensors", "--out"),
    (["lens", "--fit"], "lens/tuned.safetensors", "--lens"),
])
def test_a_default_file_is_kept_without_force(cli, folder, argv, name, option):
    r = cli(*argv, "--weights", folder)
    assert_one_error_line(r, 2)
    assert r.err == (f"error: {folder / name} exists (the default {option}): add --force to "
                     f"overwrite it, or {option} FILE for another file\n")
    assert (folder / name).read_bytes() == OLD


@pytest.mark.parametrize("argv, option", [
    (["sae", "train", "--site", "layers.1.mlp_out"], "--out"),
    (["means"], "--out"),
    (["lens", "--fit"], "--lens"),
])
def test_an_existing_file_given_is_kept_without_force(cli, folder, tmp_path, argv, option):
    given = tmp_path / "mine.safetensors"
    given.write_bytes(OLD)
    r = cli(*argv, "--weights", folder, option, given)
    assert_one_error_line(r, 2)
    assert r.err == f"error: {option} {given}: the file exists; add --force to overwrite it\n"
    assert given.read_bytes() == OLD


def test_model_card_keeps_a_card_without_force(cli, folder, data):
    r = cli("model-card", folder, "--data", data)
    assert_one_error_line(r, 2)
    assert r.err == f"error: {folder / 'MODEL_CARD.md'} exists: add --force to overwrite it\n"
    (folder / "MODEL_CARD.md").unlink()  # the picture beside it is kept as well
    r = cli("model-card", folder, "--data", data)
    assert r.err == f"error: {folder / 'loss_curve.svg'} exists: add --force to overwrite it\n"
    assert (folder / "loss_curve.svg").read_bytes() == OLD


def test_sae_train_with_force_replaces_the_default_file(cli, folder, data, tmp_path,
                                                        monkeypatch):
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "cache"))
    r = cli("sae", "train", "--site", "layers.1.mlp_out", "--weights", folder, "--data", data,
            "--steps", "2", "--latents", "8", "--k", "2", "--batch", "16", "--windows", "2",
            "--force", "--json")
    assert r.code == 0, r.err
    written = folder / "sae" / "layers.1.mlp_out.safetensors"
    assert r.json()["path"] == str(written)
    from tinygpt_cli.jobs.dictionaries.saes import load_sae
    from tinygpt_cli.transformer.folder import load_model

    model = load_model(folder)
    assert load_sae(written, model.config, model.weights_file).n_latents == 8  # the new SAE


# ------------------------------------------------------------------ a token: its text, or #ID


def test_a_target_is_its_text_and_an_id_is_written_with_a_hash(cli):
    """'5' is the digit (id 21 in the shipped vocabulary), '#5' is id 5 ('%'), and ' 5', which
    is no token, is refused rather than read as id 5."""
    def target(*argv):
        r = cli("lens", "Lily had 4 apples and", *argv, "--json")
        assert r.code == 0, r.err
        return r.json()["target"]

    assert target("--target", "5") == {"id": 21, "token": "5"}
    assert target("--target", "#5") == {"id": 5, "token": "%"}
    assert target("--target", "#") == {"id": 3, "token": "#"}  # '#' alone is the text
    r = cli("lens", "Lily had 4 apples and", "--target", " 5")
    assert r.err == ("error: ' 5' is not a single token of the vocabulary; it is 2 tokens: ' ' "
                     "'5'; for the token with id 5, write #5\n") and r.code == 2
    r = cli("dla", "Lily had 4 apples and", "--vs", "1234")
    assert r.err == ("error: '1234' is not a single token of the vocabulary; it is 4 tokens: "
                     "'1' '2' '3' '4'; for the token with id 1234, write #1234\n") and r.code == 2
    assert_one_error_line(cli("dla", "Lily had 4 apples and", "--vs", "#4096"), 2,
                          "unknown token id 4096: ids run from 0 to 4095")


def test_the_token_rule_is_in_every_help_that_takes_a_token(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # one line each
    for command in ("lens", "dla", "ablate", "patch", "attribute", "circuit", "why"):
        out = cli(command, "--help").out
        assert "or #ID for an id" in out, command
        assert "or its id" not in out and "or id" not in out, command


def test_from_python_an_int_is_an_id_and_a_str_is_text(tiny):
    from tinygpt_cli.jobs.session import token_id

    assert token_id(tiny.model, 5) == 5
    assert token_id(tiny.model, "5") == 21


# ------------------------------------------------------------------ hooks and traces from Python


@pytest.fixture
def session(tiny):
    from tinygpt_cli.jobs.session import Session

    return Session.open("Lily wanted to play with her", model=tiny.model)


def test_a_hook_takes_a_transformerlens_name_as_the_cli_does(session, tiny):
    import numpy as np

    from tinygpt_cli.transformer.hooks import Replace
    from tinygpt_cli.transformer.model import forward

    def double(x):
        return 2 * x

    by_lens = session.run(hooks=Replace({"blocks.0.hook_mlp_out": double}))
    # the same change by hand: the canonical name handed to the forward pass itself
    by_hand = forward(tiny.model.params, tiny.model.config, np.asarray(session.ids),
                      hooks=Replace({"layers.0.mlp_out": double}))
    np.testing.assert_array_equal(by_lens, by_hand)
    assert not np.array_equal(by_lens, session.run())
    _, kept = session.record({"blocks.1.hook_resid_post", "layers[-1].mlp_out"})
    plain = session.trace()
    assert sorted(kept) == ["blocks.1.hook_resid_post", "layers[-1].mlp_out"]  # as asked
    np.testing.assert_array_equal(kept["blocks.1.hook_resid_post"],
                                  plain.values["layers.1.resid_post"])
    np.testing.assert_array_equal(kept["layers[-1].mlp_out"], plain.values["layers.1.mlp_out"])


def test_a_hook_naming_no_value_raises_with_the_clis_suggestion(session, cli):
    from tinygpt_cli.transformer.hooks import Replace
    from tinygpt_cli.transformer.schema import PathError

    with pytest.raises(PathError) as raised:
        session.run(hooks=Replace({"layers.0.mlp_outt": lambda x: x}))
    on_cli = cli("trace", "Lily wanted to play with her", "layers.0.mlp_outt")
    assert on_cli.err == f"error: {raised.value}\n"
    assert str(raised.value) == ("no value at path 'layers.0.mlp_outt'; did you mean "
                                 "layers.0.mlp_out or layers.1.mlp_out?")
    with pytest.raises(PathError, match="did you mean layers.1.resid_post"):
        session.record({"layers.1.resid_postt"})
    with pytest.raises(PathError, match="^Replace takes a whole value, not rows of one: "):
        session.trace(hooks=Replace({"logits[-1]": lambda x: x}))
    with pytest.raises(PathError, match="^probs is not computed by the forward pass"):
        session.record({"probs"})


def test_a_value_the_run_never_reaches_raises(session):
    from tinygpt_cli.transformer.hooks import Chain, Replace, StopAfter
    from tinygpt_cli.transformer.schema import PathError

    with pytest.raises(PathError) as raised:
        session.record({"blocks.1.hook_resid_post"}, stop_after="layers.0.resid_post")
    assert str(raised.value) == ("record names layers.1.resid_post, which this run never "
                                 "reached (it stopped after layers.0.resid_post)")
    late = Replace({"layers.1.mlp_out": lambda x: x})
    with pytest.raises(PathError, match="^Replace names layers.1.mlp_out, which this run never "
                       "reached"):
        session.run(hooks=Chain(StopAfter("layers.0.resid_post"), late))


def test_a_trace_is_a_read_only_mapping_with_a_short_repr(session):
    from collections.abc import Mapping

    import numpy as np

    from tinygpt_cli.transformer.schema import expand

    t = session.trace()
    assert isinstance(t, Mapping)
    assert "logits" in t and "blocks.0.attn.hook_pattern" in t and "layers[-1].mlp_out" in t
    assert "layers.9.mlp_out" not in t and "logitz" not in t and 5 not in t
    assert list(t) == expand(session.config) == list(t.keys())  # every value, forward order
    assert len(t) == len(t.values) + 3  # and the derived tokens, probs and layers.length
    assert t.get("logitz", None) is None
    np.testing.assert_array_equal(dict(t.items())["logits"], t["logits"])
    assert repr(t) == f"<Trace: 6 tokens, {len(t)} values (t.keys() lists them)>"
    with pytest.raises(TypeError):
        t["logits"] = 0  # read-only


# ------------------------------------------------------------------ lens --kind tuned says so


def test_the_tuned_lens_says_so_in_its_view_picture_and_json(cli, tiny, tmp_path):
    from tinygpt_cli.analysis import tuned_lens as tl
    from tinygpt_cli.jobs.dictionaries import lens as LF

    lens = tmp_path / "zero.safetensors"  # the start of a fit: every translator 0
    from tinygpt_cli.storage.madefor import made_for

    LF.save_translators(lens, tl.zero_translators(tiny.model.config),
                        made_for(tiny.model.weights_file))
    text = "Lily wanted to play"
    for kind, first in (("tuned", "tuned lens  "), ("logit", "logit lens  ")):
        given = ["--kind", kind, "--lens", lens]
        doc = cli("lens", text, *given, "--json").json()
        assert doc["options"] == {"target": None, "position": -1, "kind": kind}
        view = cli("lens", text, *given).out.splitlines()
        assert view[0].startswith(first)
        assert view[1] == tl_note(kind)
        picture = tmp_path / f"{kind}.svg"
        assert cli("lens", text, *given, "--save", picture, "-q").code == 0
        assert f"{kind} lens" in picture.read_text()
        assert ("logit lens" if kind == "tuned" else "tuned lens") not in picture.read_text()


def tl_note(kind: str) -> str:
    return {"tuned": "the tuned lens: each block's input through its learned translator, "
                     "ln_final(h + h A + b), then the tied head",
            "logit": "each stage through the final norm (its statistics recomputed) and the "
                     "tied head"}[kind]


# ------------------------------------------------------------------ the suite's own writes


def test_the_suite_keeps_the_tools_cache_in_a_temporary_folder():
    import os
    import tempfile
    from pathlib import Path

    from tinygpt_cli.storage.cache import cache_dir

    where = cache_dir()
    assert where == Path(os.environ["TINYGPT_CACHE"])
    assert where.is_relative_to(tempfile.gettempdir()) and where.name.startswith(
        "tinygpt-tests-cache-")
    assert not where.is_relative_to(Path.home() / ".cache")


# ------------------------------------------------------------------ --each-line and usage hints


def test_each_line_says_a_bad_line_and_runs_the_rest(cli, tiny, tmp_path):
    f = tmp_path / "lines.txt"
    f.write_text("Lily\n" + "dog " * 200 + "\nTom ran\n", encoding="utf-8")
    r = cli("probs", "--each-line", f, "--top", "1")
    assert r.code == 2
    n = len(tiny.model.tokenizer.encode("dog " * 200))
    assert r.err == (f"error: line 2: the text is {n} tokens long; this model reads at most 128 "
                     "tokens; --last N reads its last N tokens\n")
    headings = [ln for ln in r.out.splitlines() if ln.startswith("line ")]
    assert [h.split(":")[0] for h in headings] == ["line 1", "line 2", "line 3"]
    assert r.out.endswith(cli("probs", "Tom ran", "--top", "1").out + "\n")  # line 3 ran whole


def test_the_hint_for_a_text_starting_with_a_dash_keeps_the_other_options(cli):
    r = cli("probs", "-5 apples", "--top", "2")
    assert r.err == ("error: No such option: -5 (see 'tinygpt probs --help'; a text that starts "
                     "with '-' goes after '--': tinygpt probs --top 2 -- '-5 apples')\n")
    assert r.code == 2
    hinted = cli("probs", "--top", "2", "--", "-5 apples")  # the hint, as given, runs
    assert hinted.code == 0 and hinted.out.count("\n") > 2


# ------------------------------------------------------------------ generate past the window


def test_generate_continues_a_long_prompt_from_its_last_tokens_with_a_note(cli, tiny):
    import numpy as np

    from tinygpt_cli.transformer.model import forward

    prompt = "Lily went to the park. " * 40
    ids = tiny.model.tokenizer.encode(prompt)
    assert len(ids) > 128
    r = cli("generate", prompt, "--temperature", "0", "-n", "1", "--json")
    assert r.code == 0, r.err
    assert r.err.splitlines()[0] == (f"note: the prompt is {len(ids)} tokens; this model reads "
                                     "at most 128, so it continues from the prompt's last 128 "
                                     "tokens")
    token = next(d for d in r.ndjson() if d.get("event") == "token")["id"]
    logits = forward(tiny.model.params, tiny.model.config, np.asarray(ids[-128:]))
    assert token == int(np.argmax(logits[-1]))  # the greedy pick of the last 128 tokens
    short = cli("generate", "Lily went to the park.", "--temperature", "0", "-n", "1")
    assert "note:" not in short.err


# ------------------------------------------------------------------ the smaller items


def test_decode_with_no_ids_asks_for_ids_not_characters(cli):
    for stdin in ("", "\n", " , \n"):
        r = cli("decode", stdin=stdin)
        assert r.err == ("error: no token ids given: give at least one, e.g. tinygpt decode 608 "
                         "429\n") and r.code == 2
    r = cli("decode")  # stdin a terminal
    assert r.err == ("error: no token ids: give them as arguments, or pipe them on stdin with "
                     "'-'\n") and r.code == 2
    assert cli("encode").err == ("error: no text: give it as an argument, or pipe it on stdin "
                                 "with '-'\n")


def test_one_token_holds_and_several_hold(cli):
    one = cli("probs", "Lily wanted", "--top", "1")
    share = cli("probs", "Lily wanted", "--top", "1", "--json").json()["top"][0]
    assert one.out.splitlines()[-1] == f"this one holds {share['chance']:.1%} of the chance"
    assert cli("probs", "Lily wanted", "--top", "2").out.splitlines()[-1].startswith(
        "these 2 hold ")


def test_probs_at_temperature_0_names_the_greedy_pick_not_a_division_by_0(cli):
    r = cli("probs", "Lily wanted", "-t", "0", "--top", "1")
    assert r.out.startswith("one_hot(argmax(logits[1]))  4096  float64  min 0.000 ")
    doc = cli("probs", "Lily wanted", "-t", "0", "--json").json()
    assert doc["formula"] == "one_hot(argmax(logits[1]))" and "/ 0" not in r.out
    assert sorted(doc["data"])[-2:] == [0.0, 1.0]


def test_sae_feature_help_keeps_its_sentences_whole_and_names_its_argument(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    out = cli("sae", "feature", "--help").out
    assert out.splitlines()[0] == "Usage: tinygpt sae feature [OPTIONS] {LATENT}"
    about = out.split("\n\n", 1)[1].split("  Examples:")[0]
    for paragraph in about.strip().split("\n\n"):  # none stops mid-sentence
        assert paragraph.rstrip().endswith((".", ")")), paragraph


def test_train_says_it_trains_a_tokenizer_and_that_snapshots_do_not_fit(tmp_path):
    from test_hostile import RUN_SIZES, _run_main, write_parts

    data = write_parts(tmp_path / "stories")
    out = tmp_path / "run"
    r = _run_main(["train", "--data", data, "--out", out, "--steps", "4", "--snapshots", "3",
                   *RUN_SIZES])
    assert r.code == 0, r.err
    def bare(s):  # stderr's notes are wrapped to its width, even inside a long path
        return "".join(s.split())

    assert bare(f"no {out / 'tokenizer.json'}: training a tokenizer of 257 tokens on the "
                "training text first (tinygpt train-tokenizer makes one beforehand)") in bare(r.err)
    assert bare("--snapshots 3 keeps 1: snapshots are log-spaced in steps from step 50 to the "
                "last, and 4 steps have room for only 1") in bare(r.err)
    assert [p.name for p in (out / "history").iterdir()] == ["step-000004.safetensors"]
    again = _run_main(["train", "--data", data, "--out", out, "--steps", "6", "--resume",
                       *RUN_SIZES])
    assert again.code == 0 and "training a tokenizer" not in again.err  # it has one now


def test_a_folder_from_the_hub_is_told_what_it_lacks(cli, tiny, tmp_path):
    """No history/ and no data.json, as a transformers folder has: why names the history it
    needs first, and the note of means no longer says the model is older than the record."""
    r = cli("why", "Lily wanted", "--weights", tiny.folder)
    assert_one_error_line(r, 2, f"no training history: {tiny.folder / 'history'} does not exist")
    data = story_parts(tmp_path / "data")
    r = cli("means", "--weights", tiny.folder, "--data", data, "--out", tmp_path / "m.st")
    assert r.code == 0, r.err
    assert (f"note: {tiny.folder} has no record of its training text (data.json, which "
            "tinygpt train writes): using --data as given") in " ".join(r.err.split())
    assert "trained before" not in r.err


def test_circuit_warns_when_the_gap_is_too_small_to_share_out(cli):
    from types import SimpleNamespace

    from tinygpt_cli.render.circuits import small_gap_warning

    (line,) = small_gap_warning(SimpleNamespace(clean=0.512, corrupt=0.520))
    assert line.plain == ("warning: the gap is only -0.008 (under 0.1): clean and corrupt "
                          "barely differ, so each share of it and f are mostly noise; choose "
                          "texts whose predictions differ")
    assert small_gap_warning(SimpleNamespace(clean=1.5, corrupt=0.2)) == []
    argv = ["circuit", "Lily wanted to play with her", "Lily wanted to read with her",
            "--target", " toys", "--vs", " mom", "--method", "eap"]
    doc = cli(*argv, "--json").json()
    small = abs(doc["clean"] - doc["corrupt"]) < 0.1
    assert ("warning: the gap is only" in cli(*argv).out) == small


def test_a_probability_is_a_chance_in_every_document_the_old_names_beside_it(cli, tmp_path):
    from tinygpt_cli.transformer.schema import OLD_KEYS

    def keys(x, found):  # every key of every object in a document
        if isinstance(x, dict):
            for k, v in x.items():
                found.setdefault(k, []).append(v)
                keys(v, found)
        elif isinstance(x, list):
            for v in x:
                keys(v, found)
        return found

    f = tmp_path / "texts.txt"
    f.write_text("Lily wanted\n<|endoftext|>\nTom ran to the park\n")
    docs = [*cli("score", "--file", f, "--json").ndjson(),
            cli("ablate", "Lily wanted to play", "--layer", "0", "--head", "0", "--json").json(),
            cli("lens", "Lily wanted to play", "--json").json(),
            cli("blocks", "Lily wanted to play", "--json").json()]
    found = {}
    for d in docs:
        keys(d, found)
    for new, old in OLD_KEYS.items():
        assert found.get(new, []) == found.get(old, []), (new, old)  # same values, both there
    for new in ("chance", "top_chance", "target_chances", "text_index"):
        assert new in found, new
    assert sorted({v for v in found["text_index"]}) == [0, 1]


# ------------------------------------------------------------------ views in a pipe


@pytest.mark.parametrize("argv", [
    ["trace", "Lily wanted to play with her", "--list"],
    ["probs", "Lily wanted to play with her", "--top", "3"],
    ["attn", "Lily wanted to play", "--layer", "0", "--head", "0"],
    ["attn", "Lily wanted to play", "--layer", "0", "--all-heads"],
    ["lens", "Lily wanted to play with her"],
    ["dla", "Lily wanted to play with her"],
    ["review", "Lily wanted"],
    ["embed", "Lily wanted", "--full"],
])
def test_no_line_of_a_piped_view_ends_in_spaces(cli, argv):
    r = cli(*argv)
    assert r.code == 0, r.err
    padded = [line for line in r.out.splitlines() if line.endswith(" ")]
    assert padded == [], padded[:3]


def test_score_over_several_texts_says_which_text_each_surprise_is_in(cli, tiny, tmp_path):
    texts = ["Lily wanted to play.", "Tom ran to the big park."]
    f = tmp_path / "texts.txt"
    f.write_text("\n<|endoftext|>\n".join(texts) + "\n")
    out = cli("score", "--file", f).out.splitlines()
    head = next(i for i, ln in enumerate(out) if ln.split()[:2] == ["text", "pos"])
    tok = tiny.model.tokenizer  # each text's tokens, then the <|endoftext|> that ends it
    tokens = {n: [tok.token_str(i) for i in tok.encode(t)] + ["<|endoftext|>"]
              for n, t in enumerate(texts)}
    rows = [ln.split() for ln in out[head + 1:] if ln.strip()]
    assert rows
    for text, pos, token, *_ in rows:  # each row's token is at that position of that text
        assert token.replace("␣", " ") == tokens[int(text)][int(pos)]
    single = cli("score", "Lily wanted to play.").out
    assert "text  pos" not in single and " pos " in single


def test_generate_on_a_terminal_breaks_lines_between_words(tiny):
    import io
    import re

    import numpy as np
    from rich.console import Console

    from tinygpt_cli.render.generation import write_text
    from tinygpt_cli.transformer.generate import Step

    tok = tiny.model.tokenizer
    story = " Lily was a sleepy bear who liked honey and long naps in the warm sun every day."
    steps = [Step(i, 1.0) for i in tok.encode(story)]  # the new tokens, word pieces and all
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=24, color_system=None)
    write_text(console, tok, "Once upon a time", iter(steps), False)
    shown = re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())
    lines = shown.rstrip("\n").split("\n")
    assert all(len(line) < 24 for line in lines), lines
    assert " ".join(line.strip() for line in lines) == ("Once upon a time" + story).strip()
    words = set(("Once upon a time" + story).split())
    assert all(w in words for line in lines for w in line.split())  # none cut in two
    assert np.sum([len(ln) for ln in lines]) > 24  # it did wrap


def test_the_circuit_picture_writes_f_as_the_terminal_does(cli, tmp_path):
    import re

    picture = tmp_path / "c.html"
    argv = ["circuit", "Lily wanted to play with her", "Lily wanted to read with her",
            "--target", " toys", "--vs", " mom", "--method", "eap"]
    assert cli(*argv, "--save", picture, "-q").code == 0
    table = picture.read_text().split("faithfulness", 1)[1]
    assert not re.search(r"\de-\d\d", table)  # no -3.66e-16 for the f of no edge kept
    assert ">0.000<" in table and ">1.000<" in table
