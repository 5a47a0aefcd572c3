"""`why --value` on a head that a planted pattern built (issue 31): the windows that hold the
pattern rank first for the head's attention weight; the windows with the same words and no
pattern rank below them all and, together, lowered it.

The model is trained here in TracIn's own setting (full-batch gradient descent, a snapshot
every few steps) on stories of made-up words, one story a window:

- planted: "The M f f f f zq M f ...": after zq, say again the marker M (one of six) that
  stands second; only a head looking from zq back to the marker can do it;
- contrast: the same frame and markers, but "zq nope": zq says nothing of the marker;
- base: a cycle through other words (learnt from the previous word alone).

The value is the head's weight from zq to the marker's place on a text whose marker no
training window holds: no window's own embedding row speaks for it, only what the head's
shared weights learnt. (With a marker the windows hold, its own row dominates TracIn's dot
product, and a window's copy of it can lower the weight through that row while its
attention raises it: benchmarks/results.md, why_planted, has the figures.)
"""

from __future__ import annotations

import numpy as np
import pytest

T = 24  # the context: a story of T - 1 words and its <|endoftext|>, one window
MARKERS = ["blick", "dax", "wug", "toma", "fep", "zorp"]
FRESH = "quib"  # a marker of the query only
FRAME = ["red", "green", "blue", "pink", "gray", "gold", "teal", "tan", "lime", "navy",
         "rose", "jade"]
BASE = ["ant", "bee", "cat", "dog", "elk", "fox", "gnu", "hen", "ibis", "jay", "kiwi",
        "lark"]
SPOTS = (6, 11, 16)  # where zq stands in a planted or contrast story
PLANTED, CONTRAST, BASE_STORIES = 3, 1, 16  # stories per marker, per marker, in all
STEPS, EVERY, LR = 600, 10, 0.2


def story(rng, kind: str, marker: str | None = None) -> list[str]:
    if kind == "base":
        phase = int(rng.integers(0, len(BASE)))
        return ["The"] + [BASE[(phase + i) % len(BASE)] for i in range(T - 2)]
    words = ["The", marker] + [FRAME[i % len(FRAME)] for i in range(T - 3)]
    for s in SPOTS:
        words[s], words[s + 1] = "zq", marker if kind == "planted" else "nope"
    return words


def query_text() -> str:
    return " ".join(story(None, "planted", FRESH)[: SPOTS[0] + 1])


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """(weights folder, data folder, each window's kind): a one-block Llama-style model
    (RMSNorm, rotary positions, untied head) trained here, its snapshots in history/."""
    from dataclasses import replace
    from types import SimpleNamespace

    from test_history import write_stories

    from tinygpt_cli.analysis.why import windows
    from tinygpt_cli.jobs.train.loop import arch_config, export, save_snapshot, stamp_snapshots
    from tinygpt_cli.transformer.families import family
    from tinygpt_cli.transformer.model import init_params, loss_and_grads
    from tinygpt_cli.transformer.optim import SGD
    from tinygpt_cli.transformer.tokenizer import train_tokenizer
    from tinygpt_cli.transformer.windows import encode_stories

    rng = np.random.default_rng(0)
    kinds = ["base"] * BASE_STORIES + [k for _ in MARKERS
                                       for k in ["planted"] * PLANTED + ["contrast"] * CONTRAST]
    marks = [None] * BASE_STORIES + [m for m in MARKERS for _ in range(PLANTED + CONTRAST)]
    order = rng.permutation(len(kinds))
    kinds, marks = [kinds[i] for i in order], [marks[i] for i in order]
    stories = [" ".join(story(rng, k, m)) for k, m in zip(kinds, marks, strict=True)]
    root = tmp_path_factory.mktemp("planted")
    data = root / "data"
    data.mkdir()
    # the last story gives the last window the token after it
    write_stories(data / "part-000.txt", stories + ["The"])
    write_stories(data / "part-001.txt", stories[:2])
    tok = train_tokenizer(stories + [query_text()], 512)  # every word one token
    stream = encode_stories(stories + ["The"], tok).ids
    assert len(stream) == T * len(stories) + 2, "a word is more than one token"
    assert tok.encode(" " + FRESH)[0] not in stream
    config = replace(arch_config("llama", n_embd=192, n_layer=1, n_head=1, n_inner=256,
                                 n_positions=T, vocab_size=tok.vocab_size),
                     tied=False, n_kv_head=0)
    x, y = windows(stream, T)
    params = init_params(config, rng)
    out, fam = root / "weights", family(config.model_type)
    opt = SGD(params)
    for step in range(STEPS):
        if step % EVERY == 0:
            save_snapshot(out, params, config, fam, step, LR)
        _, grads = loss_and_grads(params, config, x, y)
        opt.step(params, grads, LR)
    export(out, params, config, fam, tok)
    stamp_snapshots(out)
    return SimpleNamespace(weights=out, data=data, kinds=np.asarray(kinds))


# 600 full-batch steps and 60 snapshots: 80-90 s of a busy 2-core machine, a third of the
# default suite's budget on its own
@pytest.mark.slow
def test_why_value_ranks_the_windows_that_built_the_head_first(planted, tmp_path,
                                                                monkeypatch, capsys):
    from cli_helpers import Runner, clean_env

    from tinygpt_cli.jobs.history import find_snapshots, history_folder
    from tinygpt_cli.transformer.folder import load_model, load_params
    from tinygpt_cli.transformer.trace import run_traced

    clean_env(monkeypatch)
    monkeypatch.setenv("TINYGPT_WEIGHTS", str(planted.weights))
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "cache"))
    cli = Runner(capsys, monkeypatch)
    value = "layers.0.heads.0.weights[-1,1]"  # zq's weight on the marker
    n = len(planted.kinds)
    got = cli("why", query_text(), "--value", value, "--data", planted.data, "--top", str(n),
              "--json")
    assert got.code == 0, got.err
    doc = got.json()
    ranked = [r["window"] for r in doc["top_windows"]]
    assert sorted(ranked) == list(range(n))
    kinds = planted.kinds[ranked]
    scores = np.asarray([r["score"] for r in doc["top_windows"]])
    n_planted = int((kinds == "planted").sum())
    assert list(kinds[:n_planted]) == ["planted"] * n_planted
    assert scores[n_planted - 1] > 0
    # the same words without the copy: below every planted window, and together they lowered it
    assert scores[kinds == "contrast"].sum() < 0
    # the head learnt to look back at the marker (on a marker the windows hold), and a little
    # of it reaches the one no window holds
    model = load_model(planted.weights)
    first = load_params(find_snapshots(history_folder(model), model.weights_file)[0].path,
                        model.config)

    def weight(params, text: str) -> float:
        ids = np.asarray(model.tokenizer.encode(text))
        return float(run_traced(params, model.config, ids).values["layers.0.weights"][0, -1, 1])

    held = query_text().replace(FRESH, MARKERS[0])
    assert weight(model.params, held) > weight(first, held) + 0.1
    assert doc["explained"]["value"] == pytest.approx(weight(model.params, query_text()),
                                                      rel=1e-5)
    assert doc["explained"]["value"] > weight(first, query_text())
