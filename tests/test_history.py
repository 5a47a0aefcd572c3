"""`tinygpt history` and `tinygpt why` on a tiny model trained here, with snapshots, on stories
holding a planted fact (a rare name always followed by one word); and their math checked
against naive loops and finite differences."""

from __future__ import annotations

import hashlib
import io
import json
import re
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import Runner, assert_one_error_line, clean_env
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygpt_cli.analysis import heads, why
from tinygpt_cli.jobs import history as snapshots_of
from tinygpt_cli.jobs import why as why_job
from tinygpt_cli.jobs.corpus import read_stories
from tinygpt_cli.jobs.threads import on_cores
from tinygpt_cli.jobs.train.loop import HISTORY, Settings, snapshot_steps, train
from tinygpt_cli.transformer import ops
from tinygpt_cli.transformer.config import Config
from tinygpt_cli.transformer.folder import load_model, load_params
from tinygpt_cli.transformer.model import forward
from tinygpt_cli.transformer.tokenizer import END_OF_TEXT, save_tokenizer, train_tokenizer

TINY = Config(n_embd=16, n_layer=2, n_head=2, n_inner=32, n_positions=32, vocab_size=512)

STORIES = [
    "Tom had a red ball. He threw the ball to Sam. Sam threw the ball back to Tom.",
    "The cat sat on the mat. The cat was happy. The dog came and sat on the mat too.",
    "Every day the bird sings to Lily, and Lily sings back to the bird. Lily is happy.",
    "Ben found a big box. In the box was a small hat. Ben put the hat on his head.",
    "Mia sings in the park. The dog sat by Mia and the sun was warm.",
]
# The planted fact: the rare name Quixby appears only in these stories, and always followed by
# " zooms", which appears nowhere else. (When the word also follows other names, the plain
# dot product ranks windows with many of its occurrences high too: TracIn's known bias.)
FACT = ["At night Quixby zooms to the moon.", "The old frog Quixby zooms away.",
        "Then Quixby zooms and zooms."]
VAL = ["Sam and Tom sat on the mat. The ball was red.", "The birds liked the hat.",
       "Ben and Mia sat in the sun. The dog found a red box. Lily put the box on the mat."]
STEPS, SNAPSHOTS = 120, 4


def CFG(run: Path) -> Config:  # noqa: N802  (reads like the constant it stands in for)
    """The trained folder's own config: TINY with the tokenizer's vocabulary size."""
    return load_model(run).config


def write_stories(path: Path, stories: list[str]) -> Path:
    path.write_text(f"\n{END_OF_TEXT}\n".join(stories) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A weights folder with history/, trained on data/part-000.txt (part-001 held out)."""
    root = tmp_path_factory.mktemp("history")
    data = root / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    stories = STORIES * 6 + FACT
    stories = [stories[i] for i in rng.permutation(len(stories))]
    train_file = write_stories(data / "part-000.txt", stories)
    val_file = write_stories(data / "part-001.txt", VAL)
    out = root / "weights"
    # Every merge the text allows (fewer than 512), so the planted name is one token; the
    # model's vocabulary is then the tokenizer's own size, as train requires.
    tok = train_tokenizer(read_stories([train_file]), TINY.vocab_size)
    save_tokenizer(tok, out / "tokenizer.json")
    config = replace(TINY, vocab_size=tok.vocab_size)
    s = Settings(steps=STEPS, batch_size=8, lr=1e-2, warmup=10, dropout=0.0, eval_every=STEPS,
                 checkpoint_every=STEPS, seed=0, snapshots=SNAPSHOTS, config=asdict(config))
    train([train_file], [val_file], out, s)
    return out


@pytest.fixture
def cli(capsys, monkeypatch, run, tmp_path):
    clean_env(monkeypatch)
    monkeypatch.setenv("TINYGPT_WEIGHTS", str(run))
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "cache"))
    return Runner(capsys, monkeypatch)


# --- history ------------------------------------------------------------------------------------


def test_history_loss_is_each_snapshots_cross_entropy_and_falls(cli, run):
    text = "The cat sat on the mat."
    doc = cli("history", text, "--json").json()
    steps = snapshot_steps(STEPS, SNAPSHOTS)
    model = load_model(run)
    snapshots = [load_params(run / HISTORY / f"step-{s:06d}.safetensors", model.config)
                 for s in steps]
    # the last snapshot is the exported weights in float16: the timeline keeps the float32
    # weights in its place, with its step and learning rate
    assert [r["label"] for r in doc["snapshots"]] == [
        *(f"step {s}" for s in steps[:-1]), f"step {steps[-1]} (final)"]
    assert doc["snapshots"][-1]["lr"] is not None
    snapshots[-1] = model.params
    ids = np.asarray(doc["ids"])
    for row, params in zip(doc["snapshots"], snapshots, strict=True):
        logits = forward(params, model.config, ids).astype(np.float64)
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        expected = -np.mean([logp[i, ids[i + 1]] for i in range(len(ids) - 1)])
        assert row["loss"] == pytest.approx(expected, rel=1e-5)
        assert row["top_id"] == int(np.argmax(logits[-1]))
    losses = doc["data"]
    assert losses[-1] < losses[0] - 0.5  # training taught it this (repeated) text
    one = cli("history", "The", "--json").json()  # one token: no next token to score
    assert one["data"] == [None] * len(steps) and one["snapshots"][0]["top_id"] >= 0
    shown = cli("history", text)
    assert shown.code == 0 and shown.out.startswith("loss on the text") and "\x1b[" not in shown.out


def test_timeline_ends_with_the_final_weights_when_they_are_not_a_snapshot(run):
    import dataclasses

    model = load_model(run)
    changed = dataclasses.replace(model, params={n: a + 0.01 for n, a in model.params.items()})
    found = snapshots_of.find_snapshots(run / HISTORY, run / "model.safetensors")
    timeline = snapshots_of.timeline(changed, found)
    assert [s.label for s in timeline] == [s.label for s in found] + ["final"]
    assert timeline[-1].lr is None and timeline[-1].params is changed.params


def test_history_follows_a_value_and_a_parameter(cli, run):
    doc = cli("history", "The cat sat", "layers.1.heads.0.weights", "--json").json()
    grids = np.asarray(doc["weights"])
    assert grids.shape[1:] == (len(doc["ids"]),) * 2
    np.testing.assert_allclose(grids.sum(-1), 1.0, rtol=1e-5)  # each row is a distribution
    assert doc["data"] == pytest.approx(np.linalg.norm(grids.reshape(len(grids), -1), axis=1))
    doc = cli("history", "The cat", "h.0.ln_1.weight", "--json").json()
    first = load_params(run / HISTORY / f"step-{snapshot_steps(STEPS, SNAPSHOTS)[0]:06d}"
                        ".safetensors", CFG(run))["layers.0.ln1.w"]
    assert doc["snapshots"][0]["mean"] == pytest.approx(float(first.mean()), rel=1e-6)
    shown = cli("history", "The cat sat", "layers.0.weights", "--position", "0")
    assert shown.code == 0 and "attention of position 0 head 1 over training" in shown.out


def test_history_heads_scores_match_a_naive_loop(cli, run):
    from tinygpt_cli.transformer.trace import run_traced

    doc = cli("history", "The cat sat on the mat.", "--heads", "--json").json()
    prev, induction = np.asarray(doc["previous_token"]), np.asarray(doc["data"])
    cfg = CFG(run)
    assert prev.shape == induction.shape == (len(doc["snapshots"]), cfg.n_layer, cfg.n_head)
    params = load_params(run / HISTORY / f"step-{snapshot_steps(STEPS, SNAPSHOTS)[0]:06d}"
                         ".safetensors", CFG(run))
    ids = np.asarray(doc["ids"])
    grids = run_traced(params, CFG(run), ids)
    n = doc["induction_length"]
    repeated = heads.repeated_random_tokens(np.random.default_rng(doc["induction_seed"]),
                                            cfg.vocab_size, n, 4, cfg.bos_token_id)
    rgrids = run_traced(params, CFG(run), repeated)
    for layer in range(CFG(run).n_layer):
        for h in range(CFG(run).n_head):
            a = grids[f"layers.{layer}.heads.{h}.weights"]
            naive = sum(a[i, i - 1] for i in range(1, len(ids))) / len(ids)  # rows sum to 1
            assert prev[0, layer, h] == pytest.approx(naive, rel=1e-5)
            r = rgrids[f"layers.{layer}.weights"][:, h]  # [B, 2n+1, 2n+1]
            stripe = [r[b, n + j, j + 1] for b in range(4) for j in range(1, n + 1)]
            assert induction[0, layer, h] == pytest.approx(np.mean(stripe), rel=1e-5)


def test_detector_and_induction_scores_by_hand():
    rng = np.random.default_rng(1)
    a = ops.softmax(rng.normal(size=(3, 7, 7)) + np.triu(np.full((7, 7), -np.inf), 1))
    naive = [sum(a[h, i, i - 1] for i in range(1, 7)) / a[h].sum() for h in range(3)]
    np.testing.assert_allclose(heads.detection_score(a, heads.previous_token_pattern(7)), naive)
    n = 3  # [BOS, r1 r2 r3, r1 r2 r3]: r_j at n + j attends to j + 1
    grid = rng.random((2 * n + 1, 2 * n + 1))
    expected = np.mean([grid[n + j, j + 1] for j in range(1, n + 1)])
    got = heads.induction_stripe(grid[None, None, None], n)  # [B, L, H, S, S] -> [L, H]
    np.testing.assert_allclose(got, [[expected]])
    toks = heads.repeated_random_tokens(np.random.default_rng(5), TINY.vocab_size, n, 2,
                                        TINY.bos_token_id)
    assert (toks[:, 0] == TINY.bos_token_id).all()
    np.testing.assert_array_equal(toks[:, 1 : n + 1], toks[:, n + 1 :])


def test_chance_level_of_previous_token_is_evenly_spread_attention():
    for t in (1, 2, 6, 51):
        even = np.tril(np.ones((t, t))) / np.arange(1, t + 1)[:, None]  # row i: 1 / (i + 1)
        naive = sum(even[i, i - 1] for i in range(1, t)) / t
        assert heads.uniform_previous_token(t) == pytest.approx(naive, abs=1e-12)
    assert heads.uniform_previous_token(6) == pytest.approx(0.2417, abs=1e-4)


def _points(svg: str) -> list[tuple[float, float]]:
    """The plotted points of a curve: (cx, cy) of each circle of class point."""
    import re

    return [(float(x), float(y)) for x, y in
            re.findall(r'<circle class="point" cx="([-\d.]+)" cy="([-\d.]+)"', svg)]


def test_history_save_draws_the_loss_against_the_step_on_a_log_scale(cli, run, tmp_path):
    import math

    text = "The cat sat on the mat."
    doc = cli("history", text, "--json").json()
    out = tmp_path / "h.svg"
    done = cli("history", text, "--save", str(out), "-q")
    assert done.code == 0 and done.out == "" and out.is_file()
    svg = out.read_text()
    points = _points(svg)
    steps = [r["step"] for r in doc["snapshots"]]
    assert len(points) == len(steps) == len(doc["data"])
    # x: where log10(step) falls between the first and the last step's, along the axis
    xs = np.array([p[0] for p in points])
    logs = np.log10(steps)
    expected = xs[0] + (logs - logs[0]) / (logs[-1] - logs[0]) * (xs[-1] - xs[0])
    np.testing.assert_allclose(xs, expected, atol=0.02)
    # y: a higher loss is drawn higher (SVG's y grows downwards), in proportion
    ys = np.array([p[1] for p in points])
    losses = np.array(doc["data"])
    slope = np.polyfit(losses, ys, 1)[0]
    assert slope < 0
    np.testing.assert_allclose(ys, np.polyval(np.polyfit(losses, ys, 1), losses), atol=0.02)
    assert f"ln V = {math.log(CFG(run).vocab_size):.2f}" in svg and "(log scale)" in svg
    again = cli("history", text, "--save", str(out))
    assert again.code == 2 and "exists" in again.err  # never overwritten without --force


def test_history_heads_save_follows_the_head_that_rose_most(cli, run, tmp_path):
    text = "The cat sat on the mat."
    doc = cli("history", text, "--heads", "--json").json()
    prev = np.asarray(doc["previous_token"])
    assert doc["previous_token_chance"] == pytest.approx(
        sum(1 / (i + 1) for i in range(1, len(doc["ids"]))) / len(doc["ids"]))
    rise = prev[-1] - prev[0]
    layer, head = np.unravel_index(int(np.argmax(rise)), rise.shape)
    out = tmp_path / "heads.svg"
    assert cli("history", text, "--heads", "--save", str(out), "-q").code == 0
    svg = out.read_text()
    assert f"layer {layer} head {head}: the previous-token score that rose most" in svg
    assert len(_points(svg)) == len(doc["snapshots"])
    assert f"evenly spread attention: {doc['previous_token_chance']:.3f}" in svg


def test_history_errors_when_the_folder_has_no_history(cli, tmp_path, run):
    import shutil

    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        shutil.copyfile(run / name, bare / name)
    result = cli("history", "The cat", "--weights", bare)
    assert_one_error_line(result, 2, "no training history", str(bare / HISTORY), "--snapshots")
    (bare / HISTORY).mkdir()
    assert_one_error_line(cli("history", "The cat", "--weights", bare), 2, "holds no")
    result = cli("why", "The cat", "--data", tmp_path / "nowhere")
    assert_one_error_line(result, 2, "training data", "does not exist")
    assert_one_error_line(cli("why", "The cat", "--data", run.parent / "data", "--weights",
                              bare), 2, "no training history")


def test_a_run_stamps_its_snapshots_and_history_refuses_another_runs(cli, tmp_path, run):
    """Each snapshot's metadata names the sha256 of the weights its run ended with (checked
    here with hashlib); the history of this run beside other weights is refused."""
    import hashlib
    import shutil

    final = hashlib.sha256((run / "model.safetensors").read_bytes()).hexdigest()
    snaps = sorted((run / HISTORY).glob("*.safetensors"))
    assert len(snaps) == SNAPSHOTS
    assert all(snapshots_of._metadata(p)["weights_sha256"] == final for p in snaps)
    other = tmp_path / "other"
    shutil.copytree(run, other)
    params = load_params(run / "model.safetensors", CFG(run))
    from tinygpt_cli.transformer.folder import save_params

    save_params({n: a * 1.01 for n, a in params.items()}, other / "model.safetensors", CFG(run))
    result = cli("history", "The cat", "--weights", other)
    assert_one_error_line(result, 2, "the snapshot was made for other weights",
                          f"weights_sha256 {final[:16]}...")


# --- why: exact matches ---------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=60),
       st.lists(st.integers(0, 3), min_size=1, max_size=4))
def test_suffix_array_sorts_suffixes_and_counts_like_a_scan(tokens, pattern):
    stream = np.asarray(tokens, np.uint16)
    sa = why.suffix_array(stream)
    assert [tokens[i:] for i in sa] == sorted(tokens[i:] for i in range(len(tokens)))
    naive = sum(tokens[i : i + len(pattern)] == pattern for i in range(len(tokens)))
    assert why.count(stream, sa, pattern) == naive


def test_exact_matches_count_the_texts_tail_and_the_target():
    stream = np.asarray([1, 2, 3, 9, 2, 3, 4, 1, 2, 3, 4, 2, 3], np.uint16)
    sa = why.suffix_array(stream)
    rows = why.exact_matches(stream, sa, [7, 1, 2, 3], target=4)
    assert [(r["n"], r["count"], r["followed_by_target"]) for r in rows] == [
        (1, 4, 2), (2, 4, 2), (3, 2, 1), (4, 0, 0)]
    assert why.longest_seen(stream, sa, [7, 1, 2, 3]) == 3
    assert why.longest_seen(stream, sa, [7, 1, 2, 3], target=4) == 3
    assert why.longest_seen(stream, sa, [9, 2, 3], target=9) == 2  # 2 3 then 9 occurs
    assert why.longest_seen(stream, sa, [9, 2, 3], target=1) == 0  # 3 then 1 never does


# --- why: TracIn --------------------------------------------------------------------------------


def test_the_power_steps_find_the_top_singular_vector():
    """top_singular_pair's u against NumPy's SVD of G = A^T D, for windows whose G has a
    clear gap (to sign), and v = G^T u."""
    from tinygpt_cli.analysis import tracin

    rng = np.random.default_rng(4)
    a, d = rng.standard_normal((3, 7, 5)), rng.standard_normal((3, 7, 4))
    d[:, 0] *= 20  # one position leads: a gap between the first two singular values
    u, v = tracin.top_singular_pair(a, d, 30)
    for w in range(3):
        g = a[w].T @ d[w]
        left, s, _ = np.linalg.svd(g)
        assert s[0] > 2 * s[1]
        assert abs(abs(u[w] @ left[:, 0]) - 1) < 1e-8
        np.testing.assert_allclose(v[w], g.T @ u[w], rtol=1e-10)


def test_top_chances_are_the_likeliest_in_order():
    """From d loss / d logits = (s - e_y) / T, each position's k likeliest tokens by s (the
    next token y among them when it is likely), against a sort of s itself; ties to the
    lower id."""
    from tinygpt_cli.analysis import tracin

    rng = np.random.default_rng(5)
    s = rng.dirichlet(np.full(9, 0.3), size=(3, 4))
    s[0, 0] = [0.1, 0.4, 0.05, 0.2, 0.05, 0.2, 0, 0, 0]  # a tie: the lower id first
    y = rng.integers(0, 9, (3, 4))
    y[1, :] = s[1].argmax(-1)  # the next token is the likeliest: it must be kept
    dlogits = s.copy()
    np.put_along_axis(dlogits, y[..., None], np.take_along_axis(s, y[..., None], -1) - 1, -1)
    ids, chances = tracin.top_chances((dlogits / 4).astype(np.float32), y, 3)
    for i in np.ndindex(3, 4):
        naive = sorted(range(9), key=lambda j, i=i: (-s[i][j], j))[:3]
        assert ids[i].tolist() == naive, i
        np.testing.assert_allclose(chances[i], s[i][naive], atol=1e-6)
    assert ids[0, 0].tolist() == [1, 3, 5]


def test_a_shard_mapped_in_place_holds_what_np_load_reads(tmp_path):
    """mapped_arrays (the query's reader) against np.load, array by array, for a shard as the
    index writes it (uncompressed; an empty array among them) and for a compressed .npz,
    which it reads by np.load; the mapping is read-only."""
    from tinygpt_cli.jobs.why_index import mapped_arrays
    from tinygpt_cli.storage.cache import npz_bytes

    rng = np.random.default_rng(0)
    arrays = {"rank1": rng.integers(0, 2**16, (5, 7)).astype(np.uint16),
              "top_ids": rng.integers(0, 300, (5, 3, 2)).astype(np.uint16),
              "tokens": np.arange(11, dtype=np.uint16), "empty": np.zeros((0, 4), np.float32),
              "scale": rng.standard_normal(3)}
    (tmp_path / "a.npz").write_bytes(npz_bytes(**arrays))
    np.savez_compressed(tmp_path / "b.npz", **arrays)
    for name in ("a.npz", "b.npz"):
        got = mapped_arrays(tmp_path / name)
        assert sorted(got) == sorted(arrays)
        for k, a in arrays.items():
            assert got[k].dtype == a.dtype and got[k].shape == a.shape
            np.testing.assert_array_equal(got[k], a)
    with pytest.raises(ValueError):
        mapped_arrays(tmp_path / "a.npz")["rank1"][0, 0] = 1


def test_bfloat16_rounds_to_the_nearest_of_its_two_neighbours():
    """to_bfloat16 keeps float32's top 16 bits, rounded to nearest (ties to even): checked
    against the two candidates, truncated and one step up, in float64."""
    from tinygpt_cli.analysis import tracin

    rng = np.random.default_rng(3)
    a = (rng.standard_normal(10_000) * 10.0 ** rng.uniform(-30, 30, 10_000)).astype(np.float32)
    back = tracin.from_bfloat16(tracin.to_bfloat16(a))
    assert back.dtype == np.float32
    bits = a.view(np.uint32)
    down = (bits & np.uint32(0xFFFF0000)).view(np.float32).astype(np.float64)
    up = ((bits & np.uint32(0xFFFF0000)) + np.uint32(0x10000)).view(np.float32).astype(np.float64)
    nearest = np.where(np.abs(a - down) < np.abs(up - a), down, up)
    tie = np.abs(a - down) == np.abs(up - a)
    np.testing.assert_array_equal(back[~tie], nearest[~tie])
    assert np.all(np.abs(back - a) <= 2.0**-8 * np.abs(a))
    np.testing.assert_array_equal(tracin.from_bfloat16(tracin.to_bfloat16(back)), back)
    # ties go to the even neighbour; infinities, zeros and NaN (whatever its payload) keep
    # what they are: a rounding carry must never turn a NaN into an infinity or a zero
    bits = np.array([0x3F808000, 0x3F818000, 0x00008000, 0x00018000, 0x7F800000, 0xFF800000,
                     0x80000000, 0x7F800001, 0x7FFFFFFF, 0xFFFFFFFF, 0x7F7FFFFF], np.uint32)
    got = tracin.to_bfloat16(bits.view(np.float32))
    assert got.tolist()[:7] == [0x3F80, 0x3F82, 0x0000, 0x0002, 0x7F80, 0xFF80, 0x8000]
    assert np.isnan(tracin.from_bfloat16(got[7:10])).all()
    assert np.isposinf(tracin.from_bfloat16(got[10]))  # the largest float32 rounds up


def test_a_fitted_projection_is_orthonormal_and_keeps_its_sample(make_params):
    """Fitted directions are orthonormal: a gradient inside them is kept exactly (so the
    projection of a projected gradient is itself), and its dot products never grow."""
    from tinygpt_cli.analysis import tracin

    config = Config(n_embd=8, n_layer=1, n_head=2, n_inner=12, vocab_size=13, n_positions=6)
    params = make_params(config, seed=2)
    rng = np.random.default_rng(3)
    x, y = rng.integers(0, 13, (6, 6)), rng.integers(0, 13, (6, 6))
    p = tracin.Projection.fit(params, config, x, y, sizes={"top": 3, "steps": 5})
    for name, a in p.left.items():
        if name != tracin.POSITIONS:  # the position side is random: every position alike
            np.testing.assert_allclose(a.T @ a, np.eye(a.shape[1]), atol=1e-5)
    assert p.dim == tracin.K_POSITIONS ** 2 + 3 * tracin.K_VECTOR
    assert (p.left["u"].shape, p.left["m"].shape) == ((8, min(8, tracin.K_U)), (8, tracin.K_M))
    again = tracin.Projection.from_arrays(p.arrays())
    assert (again.dim, again.top, again.steps) == (p.dim, 3, 5)
    assert all(np.array_equal(again.left[n], p.left[n]) for n in p.left)


def test_the_index_ranks_every_window_as_exact_tracin_does(run, tmp_path, monkeypatch):
    """The whole index (fitted projections, worker processes, stored bfloat16 numbers) against
    TracIn computed window by window from full gradients, over every window (20 here): rank
    correlation at least 0.95 on average over several questions, and 0.85 for each (a
    one-token text, whose query gradient is rank one per matrix, is the hardest). Scoring
    the snapshots on two threads gives the one-thread numbers exactly."""
    from tinygpt_cli.jobs.why_index import open_index

    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "cache"))
    model = load_model(run)
    config, tok = model.config, model.tokenizer
    index = why_job.load_index([run.parent / "data" / "part-000.txt"], tok, run / "tokenizer.json")
    x, y = why.windows(index.stream, config.n_positions)
    found = snapshots_of.find_snapshots(run / HISTORY, run / "model.safetensors")
    timeline = [s for s in snapshots_of.timeline(model, found) if s.lr is not None]
    grads = open_index(index.key, [s.path for s in timeline], config, len(x))
    seen = []
    grads.build(index.stream, config, workers=2, progress=lambda d, t: seen.append((d, t)),
                chunk=4)
    total = len(timeline) * len(x)
    assert grads.complete and seen[0] == (0, total) and seen[-1] == (total, total)
    assert grads.built_now == total
    lrs = np.asarray([s.lr for s in timeline])
    rhos = []
    for text, target in (("The frog Quixby", " zooms"), ("The cat sat on the", " mat"),
                         ("Tom threw the", " ball"), ("Lily", " sings")):
        ids, t = tok.encode(text), tok.encode(target)[0]
        per_snapshot = grads.scores([s.params for s in timeline], config, x, y, ids, t)
        np.testing.assert_array_equal(
            grads.scores([s.params for s in timeline], config, x, y, ids, t, workers=2),
            grads.scores([s.params for s in timeline], config, x, y, ids, t, workers=1))
        got = (per_snapshot * lrs[:, None]).sum(0)
        exact = why.exact_tracin([(s.params, s.lr) for s in timeline], config, x, y, ids, t)
        rhos.append(spearman(got, exact))
        assert rhos[-1] >= 0.85, (text, rhos[-1])
    assert np.mean(rhos) >= 0.95, rhos


def test_a_stream_position_is_named_by_file_story_and_offset():
    stream = np.array([5, 6, 0, 7, 8, 9, 0, 1, 2, 0, 3], np.uint16)  # 0 ends a story
    index = why.Index(stream, None, "k", ["a.txt", "b.txt"], np.array([7, 4]))
    naive = []
    for p in range(len(stream)):
        f = 0 if p < 7 else 1
        begin = 0 if f == 0 else 7
        ends = [i for i in range(begin, p) if stream[i] == 0]
        naive.append({"file": ["a.txt", "b.txt"][f], "story": len(ends) + 1,
                      "offset": p - (ends[-1] + 1 if ends else begin)})
    assert [index.place(p, 0) for p in range(len(stream))] == naive


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def _interrupted_build(run, tmp_path, monkeypatch):
    """A why index of part-000 over the run's first two snapshots, its build stopped by
    Ctrl-C after 8 windows (chunks of 4) in a cache under tmp_path/a: (index, snapshot files,
    config, windows, the unfinished why_index)."""
    from tinygpt_cli.jobs.why_index import open_index

    model = load_model(run)
    config = model.config
    index = why_job.load_index([run.parent / "data" / "part-000.txt"], model.tokenizer,
                           run / "tokenizer.json")
    n = len(why.windows(index.stream, config.n_positions)[0])
    found = snapshots_of.find_snapshots(run / HISTORY, run / "model.safetensors")
    files = [s.path for s in snapshots_of.timeline(model, found) if s.lr is not None][:2]

    def stop_after_some(done, total):
        if done >= 8:
            raise KeyboardInterrupt

    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "a"))
    first = open_index(index.key, files, config, n)
    with pytest.raises(KeyboardInterrupt):
        first.build(index.stream, config, workers=1, progress=stop_after_some, chunk=4)
    return index, files, config, n, first


def index_files(folder: Path) -> dict:
    """Every file of a gradient index, by name: its bytes, and index.json's manifest
    without the stamps (inode and mtime differ between copies)."""
    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.name != "index.json"}
    manifest = json.loads((folder / "index.json").read_text())
    del manifest["stamps"]
    return {**files, "index.json": manifest}


def test_an_interrupted_build_resumes_to_the_same_index(run, tmp_path, monkeypatch):
    """Ctrl-C mid-build keeps the finished shards; the next build computes only the rest,
    and the index equals one built in one go, file for file."""
    from tinygpt_cli.jobs.why_index import open_index

    index, files, config, n, first = _interrupted_build(run, tmp_path, monkeypatch)
    assert not first.complete and list(first.folder.glob("shard-*.npz"))
    first.build(index.stream, config, workers=1, chunk=4)
    assert first.complete and 0 < first.built_now < 2 * n
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "b"))
    second = open_index(index.key, files, config, n)
    second.build(index.stream, config, workers=2, chunk=4)
    assert index_files(first.folder) == index_files(second.folder)
    manifest = json.loads((first.folder / "index.json").read_text())
    spans = [(a, min(a + 4, n)) for a in range(0, n, 4)]
    assert [(r["snapshot"], r["windows"], r["rows"]) for r in manifest["shards"]] == \
        [(s, [a, b], b - a) for s in range(2) for a, b in spans]
    for r in manifest["shards"]:  # each shard: its windows' tokens, and its sha256
        with np.load(first.folder / r["file"]) as z:
            a, b = r["windows"]
            t = config.n_positions
            assert np.array_equal(z["tokens"], index.stream[a * t : b * t + 1])
            assert len(z["rows"]) == len(z["u"]) == b - a
        assert r["sha256"] == hashlib.sha256((first.folder / r["file"]).read_bytes()).hexdigest()


def test_damaged_why_caches_are_rebuilt_not_failed_on(cli, run, tmp_path):
    """Both of why's cache entries, the token index and the gradient index, damaged in the
    ways a cache can be (truncated, a key missing, positions out of range, another shape):
    the next run rebuilds them and answers as the first did."""
    text = "Tom saw a dog. The dog"
    first = cli("why", text, "--json")
    assert first.code == 0, first.err
    (tokens,) = (tmp_path / "cache" / "why-index").glob("*.npz")
    (grads,) = (tmp_path / "cache" / "why-tracin").glob("*/index.json")
    good = dict(np.load(tokens))
    (rows, *_) = sorted(grads.parent.glob("shard-0-*.npz"))
    for damage in (lambda: tokens.write_bytes(tokens.read_bytes()[:200]),
                   lambda: np.savez(tokens, **{k: v for k, v in good.items() if k != "sa"}),
                   lambda: np.savez(tokens, **{**good, "sa": good["sa"] + 7}),
                   lambda: np.savez(tokens, **{**good, "sa": good["sa"][::-1]}),  # in range
                   lambda: rows.write_bytes(rows.read_bytes()[:300]),
                   lambda: np.savez(rows, **{k: v[:-1] for k, v in np.load(rows).items()})):
        damage()
        again = cli("why", text, "--json")
        assert again.code == 0, again.err
        assert again.json()["top_windows"] == first.json()["top_windows"]
        drop = {"index", "top_windows", "seconds"}  # how much it computed, and how long
        assert {k: v for k, v in again.json().items() if k not in drop} == \
            {k: v for k, v in first.json().items() if k not in drop}
    assert set(np.load(tokens).files) == set(good) and grads.is_file()


def _overwrite(path: Path, offset: int, data: bytes) -> None:
    """Bytes written into a file in place, as a stray program (or a bad disk) would."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def _values_of(path: Path, name: str) -> tuple[int, int]:
    """Where the numbers of array `name` lie in an uncompressed .npz: (offset, bytes), past
    the zip entry's header and the .npy header (so that the zip and .npy stay readable)."""
    import zipfile

    with zipfile.ZipFile(path) as z:
        info = z.getinfo(f"{name}.npy")
        with z.open(info) as f:
            np.lib.format.read_magic(f)
            np.lib.format.read_array_header_1_0(f)
            npy_header = f.tell()
    with open(path, "rb") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = np.frombuffer(f.read(4), "<u2")
    start = info.header_offset + 30 + int(name_len) + int(extra_len) + npy_header
    return start, info.file_size - npy_header


def test_why_index_values_overwritten_in_place_are_found_and_rebuilt(cli, run, tmp_path):
    """The header stays good; the values change (NaN, or exponent bits flipped): their
    checksum no longer holds, so the arrays are computed again and the answer is the first
    one, never null scores or scores of 1e32."""
    text = "Tom saw a dog. The dog"
    first = cli("why", text, "--json")
    assert first.code == 0, first.err
    (grads,) = (tmp_path / "cache" / "why-tracin").glob("*/index.json")
    (rows, *_), (*_, u) = sorted(grads.parent.glob("shard-0-*.npz")), \
        sorted(grads.parent.glob("shard-1-*.npz"))
    nan = np.array([0x7FC0] * 64, "<u2").tobytes()  # bfloat16 NaN
    (r0, r_size), (u0, u_size) = _values_of(rows, "rows"), _values_of(u, "u")
    flipped = bytes(b ^ 0x70 for b in u.read_bytes()[u0 + u_size - 4000 : u0 + u_size])
    for damage in (lambda: _overwrite(rows, r0 + r_size - 128, nan),  # 2,000 numbers' exponents
                   lambda: _overwrite(u, u0 + u_size - 4000, flipped)):
        damage()
        again = cli("why", text, "--json")
        assert again.code == 0, again.err
        assert again.json()["top_windows"] == first.json()["top_windows"]
        assert again.json()["index"]["computed_now"] > 0  # rebuilt, not read as it was
    manifest = json.loads(grads.read_text())  # the folder holds what it lists, and only that
    pieces = [r["file"] for r in manifest["shards"]] + \
        [w["projection"] for w in manifest["weights"]]
    assert sorted(p.name for p in grads.parent.iterdir()) == \
        sorted(["index.json"] + [f + e for f in pieces for e in ("", ".sha256")])


def test_an_unfinished_why_index_trusts_no_unverified_piece(run, tmp_path, monkeypatch):
    """An interrupted build whose chunk, projection and stream files were then damaged
    (junk, or cut short): the next build computes them again (no catch-all, no worker dying
    in its start, respawned for ever) and gives the index one build gives."""
    from tinygpt_cli.jobs.why_index import open_index

    index, files, config, n, first = _interrupted_build(run, tmp_path, monkeypatch)
    (shard, *_) = sorted(first.folder.glob("shard-*.npz"))
    shard.write_bytes(b"PK junk")
    (first.folder / "projection-0.npz").write_bytes(b"junk")
    (first.folder / ".shard-0-0-4.npz.999999999.abcdefgh.tmp").write_bytes(b"a killed write")
    first.build(index.stream, config, workers=1, chunk=4)
    assert first.complete
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "b"))
    second = open_index(index.key, files, config, n)
    second.build(index.stream, config, workers=1, chunk=4)
    assert index_files(first.folder) == index_files(second.folder)
    assert not [p for p in first.folder.iterdir() if p.name.startswith(".")]


def test_a_task_that_fails_in_a_worker_ends_the_build_with_its_error(tmp_path):
    """A snapshot file damaged after the index was keyed: the worker process's task raises,
    and the build ends with that error (never a pool waiting for ever)."""
    import signal
    from dataclasses import asdict

    from tinygpt_cli.errors import WeightsError
    from tinygpt_cli.jobs import why_index
    from tinygpt_cli.jobs.cluster import Here

    config = Config(n_embd=8, n_layer=1, n_head=2, n_inner=12, vocab_size=11, n_positions=6)
    (tmp_path / "w.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00short")
    x = np.zeros((2, 6), np.uint16)
    previous = signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError()))
    signal.alarm(60)
    try:
        with pytest.raises(WeightsError, match=r"w\.safetensors"), \
                Here(1).job(asdict(config), spread="processes") as run:
            list(run(why_index.build_task, [("fit", 0, str(tmp_path / "w.safetensors"),
                                             str(tmp_path / "p.npz"), x, x)]))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _why_process(run: Path, cache: Path):
    import os
    import subprocess
    import sys

    env = {**{k: v for k, v in os.environ.items() if k != "TINYGPT_WEIGHTS"},
           "TINYGPT_CACHE": str(cache)}
    return subprocess.Popen([sys.executable, "-m", "tinygpt_cli", "why", "Tom saw a dog. The dog",
                             "--json", "--weights", str(run)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)


@pytest.mark.slow  # 10 builds killed and resumed: 10 s
def test_builds_killed_at_random_moments_then_started_in_pairs_leave_one_index(run, tmp_path):
    """Builds into one cache killed with SIGKILL at seeded random moments (a write cut
    anywhere), then two started together: they end with one complete index, the same answer
    from both, and nothing else in the folder (no temporary, chunk, stream or second index).
    The moments are random, what is asserted holds whatever they are."""
    import random
    import time

    cache = tmp_path / "cache"
    rng = random.Random(34)
    for _ in range(3):
        proc = _why_process(run, cache)
        time.sleep(rng.uniform(1.0, 4.0))  # start-up is ~1 s: killed while building
        proc.kill()
        proc.communicate()
    pair = [_why_process(run, cache), _why_process(run, cache)]
    done = [p.communicate(timeout=300) for p in pair]
    assert [p.returncode for p in pair] == [0, 0], [e.decode()[-500:] for _, e in done]
    first, second = (json.loads(out)["top_windows"] for out, _ in done)
    assert first == second
    (index,) = (cache / "why-tracin").iterdir()
    names = sorted(p.name for p in index.iterdir())
    manifest = json.loads((index / "index.json").read_text())
    pieces = [r["file"] for r in manifest["shards"]] + \
        [w["projection"] for w in manifest["weights"]]
    assert len(manifest["weights"]) == manifest["snapshots"]
    assert names == sorted(["index.json", *(f + e for f in pieces for e in ("", ".sha256"))])
    leftovers = [p for p in cache.rglob("*") if p.name.startswith(".") or "tmp" in p.name]
    assert leftovers == []


def test_a_write_killed_at_random_moments_leaves_no_temporary_after_the_next(tmp_path):
    """A writer killed inside write_atomically leaves its .NAME.PID.XXXXXXXX.tmp; the next
    write into the folder removes it (its writer is gone), and the target is always whole."""
    import random
    import subprocess
    import sys
    import time

    from tinygpt_cli.storage.files import write_atomically

    target = tmp_path / "picture.svg"
    script = ("import sys; from tinygpt_cli.storage.files import write_atomically as w\n"
              "i = 0\n"
              "while True:\n"
              "    w(sys.argv[1], bytes([65 + i % 2]) * 4_000_000); i += 1\n")
    rng = random.Random(8)
    for _ in range(6):
        proc = subprocess.Popen([sys.executable, "-c", script, str(target)])
        time.sleep(rng.uniform(0.3, 0.8))
        proc.kill()
        proc.wait()
        if target.exists():
            assert target.read_bytes() in (b"A" * 4_000_000, b"B" * 4_000_000)
    write_atomically(tmp_path / "other.txt", b"next")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.txt", "picture.svg"]


def test_why_with_an_unwritable_cache_says_where_its_index_must_go(cli, tmp_path,
                                                                   monkeypatch):
    """The gradient index is files every query reads back, so without a writable cache why
    ends with one line saying where it goes, before anything else is tried (the token
    index's note that it is not kept made it two lines)."""
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "a-file" / "cache"))
    r = cli("why", "Tom saw a dog. The dog")
    assert (r.code, r.out) == (1, "")
    (line,) = r.err.splitlines()
    assert line.startswith(f"error: cannot write the gradient index {tmp_path}/a-file/cache/"
                           "why-tracin/")
    assert line.endswith(": Not a directory; why keeps it in the cache folder (set "
                         "TINYGPT_CACHE to a writable one)"), r.err


def test_query_gradient_matches_finite_differences(make_params):
    config = Config(n_embd=8, n_layer=1, n_head=2, n_inner=12, vocab_size=11, n_positions=6)
    params = make_params(config, seed=4)
    ids, target = [3, 1, 4, 1], 5
    grads = why.query_gradient(params, config, ids, target)

    def nll(p):
        z = forward(p, config, np.asarray(ids))[-1]
        return -(z[target] - np.log(np.exp(z - z.max()).sum()) - z.max())

    rng = np.random.default_rng(0)
    for name in ("embed.W_E", "layers.0.attn.W_QKV", "ln_final.b"):
        idx = tuple(rng.integers(0, n) for n in params[name].shape)
        up = {k: v.copy() for k, v in params.items()}
        down = {k: v.copy() for k, v in params.items()}
        up[name][idx] += 1e-6
        down[name][idx] -= 1e-6
        assert grads[name][idx] == pytest.approx((nll(up) - nll(down)) / 2e-6, rel=1e-4,
                                                 abs=1e-8)


def definition_scores(run: Path, text: str, target: int) -> tuple[np.ndarray, np.ndarray]:
    """(the training stream of run's data/part-000.txt, TracIn of each of its windows by the
    definition: one full gradient per window at every snapshot of run's history)."""
    model = load_model(run)
    stream = why_job.load_index([run.parent / "data" / "part-000.txt"], model.tokenizer,
                            run / "tokenizer.json").stream
    x, y = why.windows(stream, model.config.n_positions)
    found = snapshots_of.find_snapshots(run / HISTORY, run / "model.safetensors")
    timeline = [s for s in snapshots_of.timeline(model, found) if s.lr is not None]
    return stream, why.exact_tracin([(s.params, s.lr) for s in timeline], model.config, x, y,
                                    model.tokenizer.encode(text), target)


def fact_windows(stream: np.ndarray, name: int, target: int, t: int) -> set[int]:
    """Windows that train the fact: some input is the name and its next token the target."""
    x, y = why.windows(stream, t)
    return {w for w in range(len(x)) if ((x[w] == name) & (y[w] == target)).any()}


def test_why_ranks_the_windows_holding_the_planted_fact_first(cli, run, monkeypatch):
    monkeypatch.delenv("TINYGPT_PROGRESS")  # the build's lines are part of what is checked
    model = load_model(run)
    tok = model.tokenizer
    (name,), (target,) = tok.encode(" Quixby"), tok.encode(" zooms")  # one token each
    result = cli("why", "The frog Quixby", "--target", f"#{target}", "--data",
                 run.parent / "data", "--json")
    assert result.code == 0, result.err
    doc = result.json()
    # the index build reports on stderr even in a pipe, and never on stdout
    assert "indexing every window's gradient: " in result.err
    assert "indexing" not in result.out
    index_stream = why_job.load_index([run.parent / "data" / "part-000.txt"], tok,
                                  run / "tokenizer.json").stream
    planted = fact_windows(index_stream, name, target, TINY.n_positions)
    assert 1 <= len(planted) <= 3 and doc["windows_scored"] > 5 * len(planted)
    ranked = [r["window"] for r in doc["top_windows"]]
    assert set(ranked[: len(planted)]) == planted
    # the fact is in the exact matches: the name's last token is followed by the target
    assert doc["exact_matches"][0]["followed_by_target"] == len(FACT)
    assert doc["longest_context_then_target"] >= 1
    # the highlighted spans point at the target, right after the name
    top = doc["top_windows"][0]
    assert any(top["ids"][s["position"]] == target and s["context"] >= 1 for s in top["targets"])
    # the token whose prediction mattered most is the fact itself: the name, then the target
    c = np.asarray(top["contributions"])
    j = int(np.argmax(c))
    assert top["ids"][j - 1 : j + 1] == [name, target]
    assert top["exact_score"] == pytest.approx(c.sum())
    # a second question on the same data reads every window from the index
    again = cli("why", "The frog Quixby", "--target", f"#{target}", "--data",
                run.parent / "data", "--json").json()
    n_snapshots = len(doc["snapshots"])
    assert doc["windows_scored"] == doc["windows"] == len(why.windows(index_stream,
                                                                      TINY.n_positions)[0])
    assert doc["index"]["computed_now"] == doc["windows"] * n_snapshots
    assert again["index"]["computed_now"] == 0
    assert again["top_windows"] == doc["top_windows"]
    view = cli("why", "The frog Quixby", "--target", " zooms", "--data", run.parent / "data")
    assert view.code == 0 and "exact matches in the training text" in view.out
    assert "TracIn over 4 snapshots" in view.out and "\x1b[" not in view.out
    # windows are named by file, story and offset, and the target is marked in plain text
    assert top["file"] == "part-000.txt" and top["story"] >= 1 and top["offset"] >= 0
    assert f"part-000.txt #{top['story']:,} +{top['offset']}" in view.out
    assert "Quixby ⟦zooms⟧" in view.out and "exact: the same sum" in view.out
    n = doc["windows_scored"]
    assert f"all {n:,} windows scored from the index" in view.err


def assert_query_is_the_values_gradient(q, params, value, entries) -> None:
    """A --value query's gradient is minus the value's (TracIn raises the value), checked by
    central differences at each (parameter, index) of `entries`."""
    for name, idx in entries:
        up = {k: v.copy() for k, v in params.items()}
        down = {k: v.copy() for k, v in params.items()}
        up[name][idx] += 1e-6
        down[name][idx] -= 1e-6
        assert -q.grads[name][idx] == pytest.approx((value(up) - value(down)) / 2e-6,
                                                    rel=1e-5, abs=1e-9), name


def assert_exact_scores_are_the_naive_loops(q, params, config, lr, windows, batch) -> None:
    """The exact pass with query q over a random stream of `windows` windows equals lr times
    the dot product of q with each window's explicit gradient."""
    from tinygpt_cli.analysis import exact_tracin as ex

    stream = np.random.default_rng(2).integers(0, config.vocab_size,
                                               config.n_positions * windows + 1)
    x, y = why.windows(stream, config.n_positions)
    got = ex.scores_over_stream([(params, lr, [q])], config, stream, batch=batch)
    names = sorted(params)
    flat = why.flatten(q.grads, names)
    naive = [lr * why.flatten(why.window_gradient(params, config, x[w], y[w]), names) @ flat
             for w in range(len(x))]
    np.testing.assert_allclose(got[0, 0], naive, rtol=1e-10, atol=1e-12)


def test_an_attention_weights_gradient_and_its_exact_scores(make_params):
    """why --value's query for an attention weight: its gradient from the block's pattern
    down (model.backward_from_attention) against finite differences of the weight itself,
    zero for what it does not read; and the exact pass with that query against the naive
    loop of explicit window gradients."""
    from tinygpt_cli.analysis import exact_tracin as ex
    from tinygpt_cli.transformer.trace import run_traced

    config = Config(n_embd=8, n_layer=2, n_head=2, n_inner=12, vocab_size=13, n_positions=6)
    params = make_params(config, seed=3)
    ids = [4, 2, 9, 4, 1]

    def seed(w):
        d = np.zeros_like(w)
        d[1, 3, 1] = -1.0  # the gradient of minus the weight: TracIn raises the value
        return d

    q = ex.query(params, config, ids, hooks=None, attention=(1, seed))

    def weight(p):
        return run_traced(p, config, np.asarray(ids)).values["layers.1.weights"][1, 3, 1]

    assert_query_is_the_values_gradient(q, params, weight, (
        ("embed.W_E", (4, 2)), ("layers.0.attn.W_QKV", (1, 5)), ("layers.1.attn.W_QKV", (2, 3)),
        ("layers.1.ln1.w", (0,)), ("layers.0.mlp.W_out", (3, 1)), ("embed.W_pos", (1, 1))))
    for name in ("layers.1.attn.W_O", "layers.1.mlp.W_in", "ln_final.w"):
        assert not q.grads[name].any()
    assert_exact_scores_are_the_naive_loops(q, params, config, 0.5, windows=5, batch=2)


def test_an_sae_latents_gradient_and_its_exact_scores(make_params, monkeypatch):
    """why --value sae.SITE.N[P]: the query starts at the residual stream
    (model.backward_from_stream) with the latent's encoder column; against finite differences
    of the latent itself, and its exact scores against the naive loop."""
    from types import SimpleNamespace

    from tinygpt_cli.analysis import sae as sae_mod
    from tinygpt_cli.transformer.trace import run_traced

    config = Config(n_embd=8, n_layer=2, n_head=2, n_inner=12, vocab_size=13, n_positions=6)
    params = make_params(config, seed=5)
    rng = np.random.default_rng(4)
    m = 6
    sae = sae_mod.SAE(rng.normal(size=(8, m)), rng.normal(size=m) + 2.0,
                      rng.normal(size=(m, 8)), rng.normal(size=8) * 0.1,
                      "layers.0.resid_post", k=m)
    ids = [4, 2, 9, 4, 1]
    z = sae_mod.encode(sae, run_traced(params, config, np.asarray(ids)).values[
        "layers.0.resid_post"])
    latent = int(np.argmax(z[2]))
    model = SimpleNamespace(config=config, params=params, weights_file=Path("w"))
    v = why.value_of(model, ids, f"sae.layers.0.resid_post.{latent}[2]", 0, None,
                     saes=lambda site: sae)
    assert v.amount == pytest.approx(z[2, latent])
    q = v.make(params)

    def latent_of(p):
        h = run_traced(p, config, np.asarray(ids)).values["layers.0.resid_post"]
        return sae_mod.encode(sae, h)[2, latent]

    assert_query_is_the_values_gradient(q, params, latent_of, (
        ("embed.W_E", (9, 2)), ("layers.0.attn.W_QKV", (1, 5)), ("layers.0.mlp.W_in", (2, 3)),
        ("embed.W_pos", (2, 1))))
    assert not q.grads["layers.1.attn.W_QKV"].any() and not q.grads["ln_final.w"].any()
    assert_exact_scores_are_the_naive_loops(q, params, config, 2.0, windows=4, batch=3)
    from tinygpt_cli.errors import InputError

    off = int(np.flatnonzero(z[2] == 0)[0]) if (z[2] == 0).any() else None
    if off is not None:
        with pytest.raises(InputError, match="not active"):
            why.value_of(model, ids, f"sae.layers.0.resid_post.{off}[2]", 0, None,
                         saes=lambda site: sae)
    with pytest.raises(InputError, match="residual stream"):
        why.value_of(model, ids, "sae.layers.0.mlp_out.1", 0, None)


def test_an_edges_gradient_and_its_exact_scores(make_params):
    """why --value edge:U->V: the query is minus the gradient of circuit's exact edge score
    (the patched corrupt run's metric minus the corrupt run's), against central differences
    of circuit.exact_scores itself, for a receiver of every kind (a head's q, k and v, an
    MLP, the logits) and a sender of every kind; the exact pass with the combined query
    against the naive loop; a malformed or backward edge, or one without --corrupt, is
    refused naming the forms."""
    from types import SimpleNamespace

    from tinygpt_cli.analysis import circuit
    from tinygpt_cli.errors import InputError

    config = Config(n_embd=8, n_layer=2, n_head=2, n_inner=12, vocab_size=13, n_positions=6)
    params = make_params(config, seed=3)
    clean, corrupt, target, vs = [4, 2, 9, 4, 1], [4, 7, 9, 3, 6], 5, 8
    model = SimpleNamespace(config=config, params=params, weights_file=Path("w"))
    names = circuit.build_graph(config).edge_names()
    for k, edge in enumerate(("embed -> L1H0.k", "L0H1 -> L1H1.q", "L0H1 -> L1H0.v",
                              "L0.mlp -> logits", "L0H0 -> L0.mlp", "L1H1 -> L1.mlp")):
        def score(p, e=names.index(edge)):
            pair = circuit.prepare(p, config, clean, corrupt, target, vs)
            return circuit.exact_scores(pair)[e]

        v = why.value_of(model, clean, "edge:" + edge.replace(" ", "", k % 2), target, vs,
                         corrupt=corrupt)  # with and without circuit's spaces
        assert v.amount == pytest.approx(score(params), rel=1e-9, abs=1e-12)
        assert abs(v.amount) > 1e-3  # a real edge: its gradient is not trivially zero
        assert v.name.endswith(f", logit[{target}] - logit[{vs}]")  # what it compares
        q = v.make(params)
        assert_query_is_the_values_gradient(q, params, score, (
            ("embed.W_E", (4, 2)), ("embed.W_E", (7, 1)), ("embed.W_pos", (1, 3)),
            ("layers.0.attn.W_QKV", (1, 5)), ("layers.0.attn.W_O", (3, 2)),
            ("layers.0.ln1.w", (2,)), ("layers.1.ln1.w", (4,)), ("layers.1.attn.W_QKV", (2, 9)),
            ("layers.1.attn.W_QKV", (6, 20)), ("layers.0.mlp.W_in", (3, 7)),
            ("layers.1.mlp.W_out", (5, 1)), ("ln_final.w", (3,)), ("ln_final.b", (1,))))
        if k < 2:  # the combined query's products, rows and factors, in the exact pass
            assert_exact_scores_are_the_naive_loops(q, params, config, 0.5, windows=4, batch=3)
    for bad in ("edge:L0H1->L0H1.q", "edge:L1.mlp->L1H0.q", "edge:L2H0->logits",
                "edge:L0H1", "edge:L0H1->L1H1.z"):
        with pytest.raises(InputError, match="give an edge as tinygpt circuit names it"):
            why.value_of(model, clean, bad, target, vs, corrupt=corrupt)
    with pytest.raises(InputError, match="quote it, or the shell reads its > as a"):
        why.value_of(model, clean, "edge:L0H1-", target, vs, corrupt=corrupt)  # `> logits`
    with pytest.raises(InputError, match="give --corrupt TEXT"):
        why.value_of(model, clean, "edge:L0H1->logits", target, vs)
    with pytest.raises(InputError, match="same number of tokens"):
        why.value_of(model, clean, "edge:L0H1->logits", target, vs, corrupt=corrupt[:4])


def test_why_exact_scores_every_window_by_the_definition_and_finds_the_fact(cli, run,
                                                                           monkeypatch, tmp_path):
    """why --exact: the planted fact's windows first, each row's score TracIn by its
    definition (explicit window gradients), found by the exact pass, and no gradient index
    built; --check reports the index's recall and rank correlation against the exact scores,
    computed here from both rankings; under --each-line the lines share one exact pass and
    each gets the answer it gets alone."""
    from tinygpt_cli.analysis import exact_tracin as ex

    passes = []
    real = ex.scores_over_stream
    monkeypatch.setattr(ex, "scores_over_stream",
                        lambda q, *a, **k: passes.append(len(q[0][2])) or real(q, *a, **k))
    model = load_model(run)
    tok, config = model.tokenizer, model.config
    (name,), (target,) = tok.encode(" Quixby"), tok.encode(" zooms")
    data = ["--data", run.parent / "data"]
    got = cli("why", "The frog Quixby", "--target", f"#{target}", *data, "--exact", "--json")
    assert got.code == 0, got.err
    doc = got.json()
    assert passes == [1]
    assert not (tmp_path / "cache" / "why-tracin").exists()
    stream, naive = definition_scores(run, "The frog Quixby", target)
    x, _ = why.windows(stream, config.n_positions)
    rows = doc["top_windows"]
    planted = fact_windows(stream, name, target, config.n_positions)
    assert {r["window"] for r in rows[: len(planted)]} == planted
    assert [r["window"] for r in rows] == list(np.argsort(-naive, kind="stable")[: len(rows)])
    for r in rows:
        assert r["found_by"] == "exact"
        assert r["score"] == pytest.approx(naive[r["window"]], rel=1e-4, abs=1e-6)
        assert r["exact_score"] == pytest.approx(r["score"], rel=1e-2, abs=1e-4)
    assert doc["index"]["method"].startswith("exact")
    # --check: the index's answer, and its agreement with the exact ranking
    checked = cli("why", "The frog Quixby", "--target", f"#{target}", *data, "--check",
                  "--json").json()
    assert all(r["found_by"] == "index" for r in checked["top_windows"])
    c = checked["check"]
    assert c["exact_top_10"] == list(np.argsort(-naive, kind="stable")[:10])
    approx_top = set(c["index_top_10"])
    assert c["recall_at_10"] == len(approx_top & set(c["exact_top_10"])) / 10
    assert 0.9 <= c["spearman"] <= 1 and c["windows"] == len(x)
    view = cli("why", "The frog Quixby", "--target", f"#{target}", *data, "--check")
    assert "the index against exact TracIn over all" in view.out
    assert f"{round(10 * c['recall_at_10'])} of the exact top 10" in view.out
    # --each-line: two texts, one pass, each line's own answer
    lines = tmp_path / "lines.txt"
    lines.write_text("The frog Quixby\nThe cat sat on the\n")
    passes.clear()
    both = cli("why", "--each-line", lines, "--target", f"#{target}", *data, "--exact",
               "--json")
    assert both.code == 0, both.err
    assert passes == [2]  # one pass, both texts' queries
    records = [json.loads(line) for line in both.out.splitlines()]
    alone = cli("why", "The cat sat on the", "--target", f"#{target}", *data, "--exact",
                "--json").json()
    for shared, own in ((records[0]["result"], doc), (records[1]["result"], alone)):
        # the same windows; the scores to float32's rounding (the products' sizes differ)
        assert [r["window"] for r in shared["top_windows"]] == \
            [r["window"] for r in own["top_windows"]]
        np.testing.assert_allclose([r["score"] for r in shared["top_windows"]],
                                   [r["score"] for r in own["top_windows"]], rtol=1e-5)


def _raised_by_each_window(run, value_of_params) -> np.ndarray:
    """TracIn of a scalar by its definition, independently of any backward pass from it: for
    each window and snapshot, how fast the scalar rises along minus the window's explicit
    loss gradient (a central difference in float64), times the snapshot's lr, summed."""
    model = load_model(run)
    config = model.config
    stream = why_job.load_index([run.parent / "data" / "part-000.txt"], model.tokenizer,
                            run / "tokenizer.json").stream
    x, y = why.windows(stream, config.n_positions)
    found = snapshots_of.find_snapshots(run / HISTORY, run / "model.safetensors")
    total = np.zeros(len(x))
    for s in [s for s in snapshots_of.timeline(model, found) if s.lr is not None]:
        p = {k: np.asarray(a, np.float64) for k, a in s.params.items()}
        for w in range(len(x)):
            g = why.window_gradient(p, config, x[w], y[w])
            eps = 1e-4 / np.sqrt(sum(np.sum(np.square(a)) for a in g.values()))
            down = value_of_params({k: p[k] - eps * g[k] for k in p})
            up = value_of_params({k: p[k] + eps * g[k] for k in p})
            total[w] += s.lr * (down - up) / (2 * eps)
    return total


def test_why_value_ranks_windows_by_how_much_they_raised_that_scalar(cli, run):
    """why --value (an attention weight, a head's detector score) and --vs (a logit
    difference): every window's exact score is the rise of that scalar along the window's
    training step, computed by central differences; for the planted fact a window
    holding it raises logit[' zooms'] - logit[' sat'] most."""
    from tinygpt_cli.analysis import heads
    from tinygpt_cli.transformer.trace import run_traced

    model = load_model(run)
    tok, config = model.tokenizer, model.config
    data = ["--data", run.parent / "data"]
    ids = tok.encode("The frog Quixby sat. The frog Quixby")
    n_windows = len(why.windows(why_job.load_index([run.parent / "data" / "part-000.txt"], tok,
                                               run / "tokenizer.json").stream,
                                config.n_positions)[0])

    def weight(p):
        return run_traced(p, config, np.asarray(ids)).values["layers.1.weights"][0, -1, 2]

    def induction(p):
        w = run_traced(p, config, np.asarray(ids)).values["layers.1.weights"][1]
        return float(heads.detection_score(w, heads.pattern("induction", ids)))

    for value, of in (("layers.1.heads.0.weights[-1,2]", weight), ("induction:L1H1",
                                                                      induction)):
        got = cli("why", "The frog Quixby sat. The frog Quixby", "--value", value, *data,
                  "--top", str(n_windows), "--json")
        assert got.code == 0, got.err
        doc = got.json()
        assert doc["explained"]["name"] == value
        assert doc["explained"]["value"] == pytest.approx(of(model.params), rel=1e-5)
        naive = _raised_by_each_window(run, of)
        rows = doc["top_windows"]
        assert len(rows) == n_windows and all(r["found_by"] == "exact" for r in rows)
        np.testing.assert_allclose([r["score"] for r in rows],
                                   naive[[r["window"] for r in rows]], rtol=1e-3,
                                   atol=1e-4 * np.abs(naive).max())
    (name,), (target,), (the,) = tok.encode(" Quixby"), tok.encode(" zooms"), tok.encode(" sat")
    doc = cli("why", "The frog Quixby", "--target", " zooms", "--vs", " sat", *data,
              "--json").json()
    stream = why_job.load_index([run.parent / "data" / "part-000.txt"], tok,
                            run / "tokenizer.json").stream
    planted = fact_windows(stream, name, target, config.n_positions)
    assert doc["top_windows"][0]["window"] in planted  # by twice the next window's score
    assert doc["top_windows"][0]["score"] > 1.5 * doc["top_windows"][1]["score"] > 0
    assert doc["explained"]["name"] == f"logit[{target}] - logit[{the}]"
    q = tok.encode("The frog Quixby")
    z = forward(model.params, config, np.asarray(q))[-1]
    assert doc["explained"]["value"] == pytest.approx(float(z[target] - z[the]), rel=1e-5)
    bad = cli("why", "The frog Quixby", "--value", "layers.1.heads.0.weights[1,2]", *data)
    assert bad.code == 2 and "the column at most the row" in bad.err
    assert_one_error_line(cli("why", "The frog Quixby", "--value", "logits[3]", *data), 2,
                          "--value 'logits[3]': give an attention weight")
    assert_one_error_line(cli("why", "The frog Quixby", "--value", "edge:L0H0->L0H1.q",
                              "--corrupt", "The cat Quixby", *data), 2,
                          "--value 'edge:L0H0->L0H1.q': give an edge as tinygpt circuit")
    assert_one_error_line(cli("why", "The frog Quixby", "--value", "edge:embed->logits",
                              *data), 2, "--value edge:embed->logits: an edge's score")
    assert_one_error_line(cli("why", "The frog Quixby", "--corrupt", "The cat", *data), 2,
                          "--corrupt is the corrupt text of an edge's score")
    assert_one_error_line(cli("why", "The frog Quixby", "--vs", " the", "--check", *data), 2,
                          "--check compares the index with the exact pass: give it alone")
    same = cli("why", "The frog Quixby", "--target", " zooms", "--vs", " zooms", *data)
    assert same.code == 2 and "the target itself" in same.err


def test_token_contributions_add_up_to_the_gradient_dot_product(make_params):
    config = Config(n_embd=8, n_layer=2, n_head=2, n_inner=12, vocab_size=13, n_positions=6)
    params = make_params(config, seed=6)
    rng = np.random.default_rng(7)
    x, y = rng.integers(0, 13, 6), rng.integers(0, 13, 6)
    query = why.query_gradient(params, config, [4, 2, 9], 3)
    parts = why.token_contributions(params, config, x, y, query)
    names = sorted(params)
    window = why.window_gradient(params, config, x, y)
    assert parts.sum() == pytest.approx(why.flatten(window, names) @ why.flatten(query, names),
                                        rel=1e-6)
    # and each part is the dot product with that one token's loss gradient
    one = why.window_gradient(params, config, x[:3], y[:3])  # position 2 sees only 0..2
    two = why.window_gradient(params, config, x[:2], y[:2])
    last = 3 * why.flatten(one, names) - 2 * why.flatten(two, names)  # the CE at position 2
    assert parts[2] == pytest.approx(last @ why.flatten(query, names) / 6, rel=1e-5)
    # several windows at once, in chunks, give each window's own parts
    x2, y2 = np.stack([x, y]), np.stack([y, x])
    both = why.token_contributions(params, config, x2, y2, query, chunk=1)
    np.testing.assert_allclose(both[0], parts, rtol=1e-9)
    np.testing.assert_allclose(both[1], why.token_contributions(params, config, y, x, query),
                               rtol=1e-9)


def test_exact_pass_equals_explicit_window_gradients_over_two_snapshots(make_params):
    """why --exact's pass (no window's gradient formed: per-position terms of one batched
    forward and backward pass) against TracIn by its definition, one full gradient per
    window: every window, three queries sharing the pass (one steered, one repeating a
    token, one with the window's length), two snapshots with their learning rates, batches
    cutting the windows unevenly, on two threads: equal in float64."""
    from tinygpt_cli.analysis import exact_tracin as ex
    from tinygpt_cli.transformer.hooks import add_vector

    config = Config(n_embd=8, n_layer=2, n_head=2, n_inner=12, vocab_size=13, n_positions=6)
    snapshots = [(make_params(config, seed=8), 0.5), (make_params(config, seed=9), 2.0)]
    stream = np.random.default_rng(9).integers(0, 13, 6 * 7 + 1)
    x, y = why.windows(stream, 6)
    shift = np.random.default_rng(1).normal(size=8)
    steer = add_vector("layers.0.resid_pre", shift, 1.0)
    asked = [([4, 2, 9, 4], 3, None), ([1, 2], 5, steer), ([7, 0, 7, 1, 12, 3], 0, None)]
    assert ex.covered(config, snapshots[0][0]) == set(snapshots[0][0])  # no parameter left out
    got = ex.scores_over_stream(
        [(p, lr, [ex.next_token_query(p, config, ids, t, h) for ids, t, h in asked])
         for p, lr in snapshots], config, stream, batch=3, each=on_cores(2))
    assert got.shape == (3, 2, len(x))
    names = sorted(snapshots[0][0])
    for k, (ids, t, h) in enumerate(asked):
        for s, (p, lr) in enumerate(snapshots):
            q = why.flatten(why.query_gradient(p, config, ids, t, h), names)
            naive = [lr * why.flatten(why.window_gradient(p, config, x[w], y[w]), names) @ q
                     for w in range(len(x))]
            np.testing.assert_allclose(got[k, s], naive, rtol=1e-10, atol=1e-12)
    # a chosen set of windows gets the same numbers, in its own order
    some = np.array([5, 0, 3])
    part = ex.scores_over_stream(
        [(p, lr, [ex.next_token_query(p, config, ids, t, h) for ids, t, h in asked])
         for p, lr in snapshots], config, stream, windows=some, batch=2)
    np.testing.assert_allclose(part, got[:, :, some], rtol=1e-12)


@pytest.mark.parametrize("width", [40, 80, 120])
def test_head_scores_of_16_heads_flow_to_fit_the_width(width):
    """history --heads: one small grid per layer, side by side when they fit, never wider
    than the terminal; every score is shown whole."""
    import io

    from rich.console import Console

    from tinygpt_cli.render.history import head_grids

    values = np.round(np.random.default_rng(0).random((8, 4, 4)), 2)  # [S, L, H]
    labels = [f"step {s}" for s in (50, 103, 213, 440, 909, 1876, 3875)] + ["final"]
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(head_grids(values, labels))
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= width
    assert sum(line.count("layer ") for line in lines) == 4
    shown = [float(x) for line in lines for x in line.split() if re.fullmatch(r"\d\.\d\d", x)]
    assert sorted(shown) == sorted(values.ravel().tolist())
    side_by_side = max(line.count("layer ") for line in lines)
    assert side_by_side == {40: 1, 80: 2, 120: 3}[width]


def test_why_on_training_text_shorter_than_one_window_says_so(cli, run, tmp_path):
    data = tmp_path / "short"
    data.mkdir()
    write_stories(data / "part-000.txt", ["Once."])
    write_stories(data / "part-001.txt", ["Held out."])
    assert_one_error_line(cli("why", "The frog", "--data", data, "--weights", run,
                              "--any-data"), 2, "too short for one window")


# --- the data record ------------------------------------------------------------------------


def test_train_records_the_files_it_learned_from(run):
    import hashlib
    import json

    record = json.loads((run / "data.json").read_text())
    data = run.parent / "data"
    for entry, path in ((record["train"][0], data / "part-000.txt"),
                        (record["validation"][0], data / "part-001.txt")):
        assert entry == {"name": path.name, "bytes": path.stat().st_size,
                         "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    assert len(record["train"]) == 1 and (run / record["folder"]).resolve() == data.resolve()


def altered_copy(data: Path, to: Path, name: str) -> None:
    """A copy of the data folder whose file `name` has one more line: not the recorded text."""
    import shutil

    shutil.copytree(data, to)
    with open(to / name, "a", encoding="utf-8") as f:
        f.write("One more line the model never saw.\n")


def test_why_finds_the_recorded_text_and_refuses_other_text(cli, run, tmp_path):

    given = cli("why", "The frog Quixby", "--target", " zooms", "--data", run.parent / "data",
                "--json").json()
    found = cli("why", "The frog Quixby", "--target", " zooms", "--json")
    assert found.code == 0, found.err
    assert found.json()["top_windows"] == given["top_windows"]
    other = tmp_path / "other"
    altered_copy(run.parent / "data", other, "part-000.txt")
    refused = cli("why", "The frog Quixby", "--target", " zooms", "--data", other)
    assert_one_error_line(refused, 2, "not the text these weights were trained on",
                          str(other / "part-000.txt"), "differs", "--any-data")
    anyway = cli("why", "The frog Quixby", "--target", " zooms", "--data", other,
                 "--any-data", "--json")
    assert anyway.code == 0 and anyway.json()["windows"] >= given["windows"]


def test_a_folder_without_a_record_says_so_once_and_goes_on(cli, run, tmp_path):
    import shutil

    old = tmp_path / "old"
    shutil.copytree(run, old)
    (old / "data.json").unlink()
    result = cli("why", "The frog Quixby", "--target", " zooms", "--data", run.parent / "data",
                 "--weights", old, "--json")
    assert result.code == 0
    assert result.err.count("has no record of its training text") == 1
    assert_one_error_line(cli("why", "The frog", "--weights", old), 2, "give --data",
                          "no record")


def test_means_score_and_neurons_find_the_recorded_text(cli, run, tmp_path):
    """Without --data (or --file), the text comes from the weights' record: the validation
    file for means and score --stream, the training files for neurons."""
    out = tmp_path / "means.safetensors"
    made = cli("means", "--out", out, "--json")
    assert made.code == 0, made.err
    assert made.json()["data"] == "part-001.txt"
    given = cli("means", "--data", run.parent / "data", "--out", tmp_path / "b.safetensors",
                "--json").json()
    assert given["data_sha256"] == made.json()["data_sha256"]
    scored = cli("score", "--stream", "--json")
    assert scored.code == 0, scored.err
    by_file = cli("score", "--stream", "--file", run.parent / "data" / "part-001.txt", "--json")
    assert scored.out == by_file.out
    searched = cli("neurons", "--layer", "0", "--neuron", "1", "--json")
    assert searched.code == 0, searched.err
    given = cli("neurons", "--layer", "0", "--neuron", "1", "--data",
                run.parent / "data" / "part-000.txt", "--json").json()
    assert searched.json()["examples"] == given["examples"]


def test_history_attention_grid_of_a_long_text_fits_the_width(cli, monkeypatch):
    """117 tokens made 848-character lines: the middle keys give way behind `…`, the first
    and those nearest the query stay."""
    monkeypatch.setenv("COLUMNS", "60")  # this model reads 32 tokens: a narrower width
    text = " ".join(["The cat sat on the mat."] * 4)
    r = cli("history", text, "layers.1.heads.0.weights")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert all(len(line) <= 60 for line in lines), max(lines, key=len)
    grid = lines[[i for i, ln in enumerate(lines) if "attention of position" in ln][0] + 1:]
    assert grid[0].split()[0] == "snapshot" and "…" in grid[0].split()
    assert all(row.split()[-1] != "…" for row in grid if row.strip())


def test_means_and_neurons_refuse_data_the_weights_do_not_record(cli, run, tmp_path):
    """A --data file that is not one the weights' record names (or differs from it) is one
    error line naming it, for means and neurons as for why; --any-data reads it anyway; a
    recorded file (training or validation) passes as it is."""

    other = tmp_path / "other"
    altered_copy(run.parent / "data", other, "part-001.txt")
    out = tmp_path / "means.safetensors"
    refused = cli("means", "--data", other, "--out", out)
    assert_one_error_line(refused, 2, "not the held-out text these weights record",
                          str(other / "part-001.txt"), "differs", "--any-data")
    assert not out.exists()
    training = run.parent / "data" / "part-000.txt"  # recorded, but not as the held-out text
    assert_one_error_line(cli("means", "--data", training, "--out", out), 2,
                          "is recorded as training text, not validation text")
    assert cli("means", "--data", other, "--out", out, "--any-data").code == 0 and out.exists()
    stranger = tmp_path / "stranger.txt"
    stranger.write_text("Tom had a red ball. He liked it a lot.\n" * 40, encoding="utf-8")
    refused = cli("neurons", "--layer", "0", "--neuron", "1", "--data", stranger)
    assert_one_error_line(refused, 2, str(stranger), "is not in the record", "--any-data")
    anyway = cli("neurons", "--layer", "0", "--neuron", "1", "--data", stranger, "--any-data",
                 "--json")
    assert anyway.code == 0, anyway.err
    assert anyway.json()["files"] == [str(stranger)]
    assert np.asarray(anyway.json()["data"]).shape == tuple(anyway.json()["shape"])
    kept = cli("neurons", "--layer", "0", "--neuron", "1", "--data",
               run.parent / "data" / "part-001.txt", "--json")
    assert kept.code == 0, kept.err


def test_top_windows_on_two_threads_equal_one_thread(make_params):
    """The exact re-scoring runs each snapshot on its own thread: the rows, their order and
    every number are those of one thread."""
    config = Config(n_embd=8, n_layer=2, n_head=2, n_inner=12, vocab_size=13, n_positions=6)
    snapshots = []
    for seed, lr in ((1, 0.5), (2, 1.0), (3, 0.25)):
        params = make_params(config, seed=seed)
        snapshots.append((params, lr, why.query_gradient(params, config, [4, 2, 9], 3)))
    stream = np.random.default_rng(5).integers(0, 13, 6 * 9 + 1)
    per_snapshot = np.random.default_rng(6).standard_normal((3, 9))
    rows = [why.top_windows(stream, config, np.arange(9), per_snapshot, snapshots, [4, 2, 9], 3,
                            top=3, each=on_cores(w)) for w in (1, 2)]
    for a, b in zip(*rows, strict=True):
        assert a["window"] == b["window"] and a["exact_score"] == b["exact_score"]
        np.testing.assert_array_equal(a["contributions"], b["contributions"])
    first = rows[0][0]
    assert first["exact_score"] == pytest.approx(sum(
        lr * why.token_contributions(p, config, stream[first["start"]:first["start"] + 6],
                                     stream[first["start"] + 1:first["start"] + 7], q).sum()
        for p, lr, q in snapshots), rel=1e-9)


# --- steering (issue 20): history and why take the --steer options ---------------------------
# Steering block 0's input adds the shift to every position's embedding: the same run as the
# position table plus the shift, which is how the expectations below are computed.


def steered_at_the_embeddings(params: dict, shift: np.ndarray) -> dict:
    table = params["embed.W_pos"]
    return {**params, "embed.W_pos": (table + shift).astype(table.dtype)}


def test_history_and_why_run_the_steered_text(cli, run, tmp_path):
    model = load_model(run)
    v = np.random.default_rng(5).normal(size=model.config.n_embd).astype(np.float32)
    np.save(tmp_path / "v.npy", v)
    steer = ["--steer-vector", tmp_path / "v.npy", "--steer-layer", "0", "--steer-scale", "2"]
    text = "The cat sat on the mat."
    doc = cli("history", text, *steer, "--json").json()
    assert doc["steered"]["site"] == "layers.0.resid_pre"
    ids = np.asarray(doc["ids"])
    final = forward(steered_at_the_embeddings(model.params, 2 * v), model.config, ids)
    logp = ops.log_softmax(final.astype(np.float64))
    want = -np.mean([logp[i, ids[i + 1]] for i in range(len(ids) - 1)])
    assert doc["snapshots"][-1]["loss"] == pytest.approx(want, rel=1e-5)
    assert doc["snapshots"][-1]["loss"] != cli("history", text, "--json").json()["data"][-1]
    view = cli("history", text, *steer)
    assert view.out.startswith("steered before this view: layers.0.resid_pre + 2 * v")
    # why: the default target is the steered run's top guess, and the document says so
    got = cli("why", "The frog Quixby", *steer, "--data", run.parent / "data", "--top", "2",
              "--json")
    assert got.code == 0, got.err
    w = got.json()
    ids = model.tokenizer.encode("The frog Quixby")
    z = forward(steered_at_the_embeddings(model.params, 2 * v), model.config, np.asarray(ids))
    assert w["target"]["id"] == int(np.argmax(z[-1])) and w["steered"]["scale"] == 2


def test_a_steered_query_gradient_matches_finite_differences(make_params):
    from tinygpt_cli.transformer.hooks import add_vector

    config = Config(n_embd=8, n_layer=1, n_head=2, n_inner=12, vocab_size=11, n_positions=6)
    params = make_params(config, seed=4)
    ids, target = [3, 1, 4, 1], 5
    shift = np.random.default_rng(1).normal(size=8)
    grads = why.query_gradient(params, config, ids, target,
                               hooks=add_vector("layers.0.resid_pre", shift, 1.0))

    def nll(p):
        z = forward(steered_at_the_embeddings(p, shift), config, np.asarray(ids))[-1]
        return -(z[target] - np.log(np.exp(z - z.max()).sum()) - z.max())

    for name, idx in (("embed.W_E", (3, 2)), ("layers.0.attn.W_QKV", (1, 5)),
                      ("ln_final.b", (4,))):
        up = {k: v.copy() for k, v in params.items()}
        down = {k: v.copy() for k, v in params.items()}
        up[name][idx] += 1e-6
        down[name][idx] -= 1e-6
        assert grads[name][idx] == pytest.approx((nll(up) - nll(down)) / 2e-6, rel=1e-4,
                                                 abs=1e-8)


def test_weights_moved_away_from_their_text_find_it_through_tinygpt_data(cli, run, tmp_path,
                                                                         monkeypatch):
    """An installed package's weights sit far from the data their record names: why finds
    the recorded text through $TINYGPT_DATA, when its files are the recorded ones, and says
    how to point at it when not."""
    import json
    import shutil

    moved = tmp_path / "site-packages" / "weights"
    shutil.copytree(run, moved)
    record = json.loads((moved / "data.json").read_text())
    record["folder_absolute"] = None  # as the shipped record: a path relative to the weights
    (moved / "data.json").write_text(json.dumps(record))
    monkeypatch.setenv("TINYGPT_DATA", str(tmp_path / "nowhere"))
    lost = cli("why", "The frog Quixby", "--target", " zooms", "--weights", moved)
    assert_one_error_line(lost, 2, "is not reachable", "set TINYGPT_DATA")
    monkeypatch.setenv("TINYGPT_DATA", str(run.parent / "data"))
    found = cli("why", "The frog Quixby", "--target", " zooms", "--weights", moved, "--json")
    assert found.code == 0, found.err
    here = cli("why", "The frog Quixby", "--target", " zooms", "--json")
    assert found.json()["top_windows"] == here.json()["top_windows"]
    other = tmp_path / "other"
    altered_copy(run.parent / "data", other, "part-000.txt")
    monkeypatch.setenv("TINYGPT_DATA", str(other))  # not the recorded text: not used
    assert_one_error_line(cli("why", "The frog", "--weights", moved), 2, "is not reachable")


def test_why_says_where_its_table_of_exact_matches_stops():
    # the table lists tails of 1 .. 8 tokens; a text whose last 11 tokens occur verbatim says
    # so, and that the table stops at 8 (it read "the last 11" above 8 rows)
    from types import SimpleNamespace

    from rich.console import Console

    from tinygpt_cli.render.history import why_view

    def shown(longest, rows):
        matches = [{"n": n, "context": [1] * n, "count": 3, "followed_by_target": 1,
                    "fraction": 1 / 3} for n in range(1, rows + 1)]
        r = SimpleNamespace(target=5, target_token="x", longest=longest, longest_then=2,
                            matches=matches, snapshots=[1, 2],
                            influence={"windows": 10, "top_windows": []})
        console = Console(width=200, record=True, file=io.StringIO())
        console.print(why_view(r, lambda i: "a"))
        return console.export_text()

    assert "the last 11 tokens of the text occur verbatim in the training text, the last 2 " \
           "followed by the target (the table stops at 8)" in shown(11, 8)
    assert "table stops" not in shown(5, 6)


def test_small_window_scores_keep_three_figures():
    # 1.447e-3, 1.205e-3 and 1.003e-3 all printed as 0.001: three windows that looked tied
    from tinygpt_cli.render.history import score_text

    assert [score_text(x) for x in (1.447e-3, 1.205e-3, 1.003e-3)] == [
        "1.45e-03", "1.20e-03", "1.00e-03"]
    assert [score_text(x) for x in (0.112, -0.0163, 0.0, 3.39e-4)] == [
        "0.112", "-0.016", "0.000", "3.39e-04"]
