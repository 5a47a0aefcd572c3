"""Probes: the Newton fit against independent solvers in float64, the labels file, the control
task, and `tinygpt probe` on the tiny model."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_helpers import TEXT, assert_one_error_line

from tinygpt_cli.analysis import probe as pr
from tinygpt_cli.errors import InputError


def blobs(n: int, d: int, classes: int, seed: int):
    """Overlapping Gaussian classes, so the optimum is finite even with a small penalty."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    centres = rng.normal(0, 1.0, (classes, d))
    return centres[y] + rng.normal(0, 1.5, (n, d)) + 3.0, y


def test_multiclass_weights_agree_with_torch_lbfgs_in_float64():
    torch = pytest.importorskip("torch")
    X, y = blobs(300, 6, 3, seed=0)
    l2 = 0.05
    W, b, _ = pr.fit_probe(X, y, 3, l2)
    Wt = torch.zeros(3, 6, dtype=torch.float64, requires_grad=True)
    bt = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    Xt, yt = torch.tensor(X), torch.tensor(y)
    opt = torch.optim.LBFGS([Wt, bt], lr=1, max_iter=5000, tolerance_grad=1e-13,
                            tolerance_change=1e-15, history_size=50,
                            line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(Xt @ Wt.T + bt, yt) + 0.5 * l2 * (Wt ** 2).sum()
        loss.backward()
        return loss
    for _ in range(5):
        opt.step(closure)
    np.testing.assert_allclose(W, Wt.detach().numpy(), atol=1e-5)
    np.testing.assert_allclose(b, bt.detach().numpy(), atol=1e-5)


def test_two_labels_agree_with_a_newton_iteration_for_the_sigmoid():
    """Two softmax rows with penalty l2/2 (|W0|^2 + |W1|^2) are one sigmoid w = W1 - W0 with
    penalty l2/4 |w|^2 (at the optimum W0 = -W1): solved here by plain Newton on [w, c]."""
    X, y = blobs(200, 4, 2, seed=1)
    l2 = 0.02
    W, b, _ = pr.fit_probe(X, y, 2, l2)
    X1 = np.hstack([X, np.ones((len(X), 1))])
    theta = np.zeros(5)
    penalty = np.array([l2 / 2] * 4 + [0.0])
    for _ in range(50):
        p = 1 / (1 + np.exp(-X1 @ theta))
        grad = X1.T @ (p - y) / len(y) + penalty * theta
        H = (X1 * (p * (1 - p))[:, None]).T @ X1 / len(y) + np.diag(penalty)
        theta -= np.linalg.solve(H, grad)
    np.testing.assert_allclose(W[1] - W[0], theta[:4], atol=1e-8)
    np.testing.assert_allclose(b[1] - b[0], theta[4], atol=1e-8)
    np.testing.assert_allclose(W[0], -W[1], atol=1e-10)


def test_marks_label_the_token_that_ends_before_them(tiny):
    tok = tiny.model.tokenizer
    (line,) = pr.parse_labels("Lily[name] ran to Tom[name][x]!\n\n")
    assert line.text == "Lily ran to Tom!"
    ids = tok.encode(line.text)
    labels = pr.token_labels(line, tok.byte_offsets(ids), "other", 1)
    tokens = [tok.token_str(i) for i in ids]
    assert dict(zip(tokens, labels, strict=True)) == {
        "Lily": "name", " ran": "other", " to": "other", " Tom": "x", "!": "other"}
    assert pr.token_labels(line, tok.byte_offsets(ids), None, 1)[1] is None


@pytest.mark.parametrize(("content", "message"), [
    ("Lily [name] ran", "--labels line 1: the mark [name] follows a space; put it right"),
    ("[name] ran", "--labels line 1: the mark [name] follows nothing"),
    ("Lil[a]y ran", "--labels line 1: the mark [a] is not right after a token"),
    ('{"text": "Lily ran", "labels": ["a"]}', "--labels line 1: 1 labels for 2 tokens"),
    ('{"text": "Lily ran", "labels": "ab"}', "a JSON line must be"),
    ("{not json", "--labels line 1: not valid JSON"),
    ("\t", "--labels holds no text"),
    ("\n \n", "--labels holds no text"),
])
def test_bad_labels_say_which_line(tiny, content, message):
    tok = tiny.model.tokenizer
    with pytest.raises(InputError) as e:
        for n, line in enumerate(pr.parse_labels(content), 1):
            pr.token_labels(line, tok.byte_offsets(tok.encode(line.text)), None, n)
    assert message in str(e.value)


def test_the_control_task_gives_each_type_one_label_at_the_labels_frequencies():
    rng = np.random.default_rng(0)
    types = rng.integers(0, 2000, 20000)
    y = (rng.random(20000) < 0.3).astype(int)
    yc = pr.control_labels(types, y, 2, seed=4)
    for t in np.unique(types)[:50]:
        assert len(set(yc[types == t])) == 1
    share = np.mean([yc[types == t][0] for t in np.unique(types)])
    assert abs(share - 0.3) < 0.04
    assert np.array_equal(yc, pr.control_labels(types, y, 2, seed=4))


def test_lines_are_split_not_tokens():
    held = pr.split_lines(10, 0.3, seed=0)
    assert held.sum() == 3 and np.array_equal(held, pr.split_lines(10, 0.3, seed=0))
    feats = [np.full((3, 2), float(i)) for i in range(10)]  # a line's rows all carry i
    labels = [["a", "b", "a"]] * 10
    r = pr.probe_report(feats, labels, [[1, 2, 3]] * 10, "s", held_out=0.3, seed=0)
    assert r.lines == (7, 3)
    assert r.train_counts.tolist() == [14, 7] and r.held_counts.tolist() == [6, 3]


# ------------------------------------------------------------------ the command


@pytest.fixture
def labels(tmp_path):
    rng = np.random.default_rng(0)
    words = ["Lily", "Tom", "ball", "park", "dog", "ran", "saw", "big", "red", "cat"]
    lines = []
    for _ in range(40):
        picked = rng.choice(words, 6)
        lines.append(" ".join(f"{w}[{'long' if len(w) > 3 else 'short'}]" if i % 2 else w
                              for i, w in enumerate(picked)))
    lines.append(json.dumps({"text": "Lily ran", "labels": ["long", None]}))
    path = tmp_path / "labels.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_probe_command_fits_what_the_analysis_fits(cli, tiny, labels, tmp_path):
    doc = cli("probe", "--site", "blocks.1.hook_resid_pre", "--labels", labels, "--json").json()
    assert doc["path"] == "layers.1.resid_pre" and doc["classes"] == ["long", "short"]
    assert doc["selectivity"] == pytest.approx(doc["accuracy"] - doc["control_accuracy"])
    assert doc["lines"] == [31, 10]
    tok = tiny.model.tokenizer
    lines = pr.parse_labels(labels.read_text())
    ids = [tok.encode(line.text) for line in lines]
    X = np.concatenate([tiny.trace(i).get("layers.1.resid_pre")[[
        t for t, lab in enumerate(pr.token_labels(line, tok.byte_offsets(i), None, 1)) if lab]]
        for line, i in zip(lines, ids, strict=True)])
    assert sum(doc["train_counts"]) + sum(doc["held_out_counts"]) == len(X)
    out = tmp_path / "probe.safetensors"
    assert cli("probe", "--site", "layers.1.resid_pre", "--labels", labels, "--out", out).code == 0
    from safetensors.numpy import load_file

    saved = load_file(str(out))
    np.testing.assert_allclose(saved["directions"], doc["data"], atol=1e-6)
    np.testing.assert_allclose(saved["direction"], np.subtract(*doc["data"][::-1]), atol=1e-6)
    steered = cli("trace", TEXT, "layers.1.resid_pre", "--steer-vector", f"{out}#0",
                  "--json").json()  # the probe's site is the steered block's input
    plain = cli("trace", TEXT, "layers.1.resid_pre", "--json").json()
    np.testing.assert_allclose(np.subtract(steered["data"], plain["data"])[0], doc["data"][0],
                               atol=1e-5)


def test_probe_view_fits_80_columns(cli, labels, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    out = cli("probe", "--site", "layers.0.mlp_out", "--labels", labels).out
    assert "control task" in out and "selectivity" in out
    assert max(len(line) for line in out.splitlines()) <= 80


@pytest.mark.parametrize(("argv", "code", "needle"), [
    (["--site", "layers.0.heads.0.weights"], 2, "a probe needs a value with one row per token"),
    (["--site", "logits[-1]"], 2, "a probe needs a value with one row per token"),
    (["--site", "layers.9.resid_pre"], 2, "layer"),
    (["--site", "layers.0.resid_pre", "--labels", "{tmp}/none.txt"], 2, "no such file"),
    (["--site", "layers.0.resid_pre", "--labels", "{tmp}/one.txt"], 2,
     "has 1 label; a probe needs at least 2"),
    (["--site", "layers.0.resid_pre", "--out", "{tmp}"], 2, "that is a folder"),
])
def test_bad_probe_input_is_one_error_line(cli, labels, tmp_path, argv, code, needle):
    (tmp_path / "one.txt").write_text("Lily[a] ran\nTom[a] ran\n")
    argv = [a.format(tmp=tmp_path) for a in argv]
    if "--labels" not in argv:
        argv += ["--labels", str(labels)]
    assert_one_error_line(cli("probe", *argv), code, needle)


def test_probe_refuses_a_negative_seed(cli, labels):
    r = cli("probe", "--site", "layers.0.resid_pre", "--labels", labels, "--seed", "-2")
    assert_one_error_line(r, 2, "--seed must be a whole number of 0 or more")
