"""Training: the schedule, AdamW, clipping, the data pipeline, and the loop end to end
(loss goes down, runs are reproducible, the exported weights are the best checkpoint, a run
killed with SIGKILL resumes to exactly the uninterrupted result, bad input exits 2).

Every model here is tiny and every run a few dozen steps, so the file runs in seconds.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import assert_one_error_line

from tinygpt_cli.errors import InputError
from tinygpt_cli.jobs.corpus import read_stories, split_data
from tinygpt_cli.jobs.train.loop import CHECKPOINT, LOG, Settings, evaluate, train
from tinygpt_cli.transformer.config import Config
from tinygpt_cli.transformer.families import load_config
from tinygpt_cli.transformer.folder import load_params
from tinygpt_cli.transformer.model import param_shapes
from tinygpt_cli.transformer.optim import SGD, AdamW, clip_by_global_norm, decays, lr_at
from tinygpt_cli.transformer.tokenizer import END_OF_TEXT, Tokenizer, train_tokenizer
from tinygpt_cli.transformer.windows import encode_stories, eval_windows, random_windows

TINY = Config(n_embd=16, n_layer=2, n_head=2, n_inner=32, n_positions=16, vocab_size=300)

STORIES = [
    "Tom had a red ball. He threw the ball to Sam. Sam threw the ball back to Tom.",
    "The cat sat on the mat. The cat was happy. The dog came and sat on the mat too.",
    "Lily liked to sing. She sang to the birds every day, and the birds sang back to her.",
    "Ben found a big box. In the box was a small hat. Ben put the hat on his head.",
]
VAL_STORIES = [
    "Sam and Tom sat on the mat. The ball was red.",
    "The birds liked the hat. Lily sang to the cat.",
]


def write_stories(path: Path, stories: list[str]) -> Path:
    """Stories separated by lines holding exactly <|endoftext|>, as the data files are."""
    path.write_text(f"\n{END_OF_TEXT}\n".join(stories) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def data(tmp_path) -> tuple[Path, Path]:
    train_file = write_stories(tmp_path / "train.txt", STORIES * 8)  # repetitive: easy to learn
    val_file = write_stories(tmp_path / "val.txt", VAL_STORIES)
    return train_file, val_file


def settings(**kw) -> Settings:
    base = dict(steps=30, batch_size=4, lr=1e-2, warmup=5, dropout=0.1, eval_every=5,
                checkpoint_every=10, seed=0, config=asdict(TINY))
    return Settings(**{**base, **kw})


def read_log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / LOG).read_text().splitlines() if line]


def checkpoint_params(out: Path) -> dict[str, np.ndarray]:
    with np.load(out / CHECKPOINT) as z:
        return {k[2:]: z[k] for k in z.files if k.startswith("p/")}


# --- the learning-rate schedule ----------------------------------------------------------------


def test_lr_warms_up_linearly_then_decays_by_cosine_to_the_floor():
    peak, warmup, total, floor = 1e-3, 10, 110, 0.1
    lr = lambda step: lr_at(step, peak, warmup, total, floor)  # noqa: E731
    # warm-up: step s (counting from 0) gets peak * (s + 1) / warmup
    assert lr(0) == pytest.approx(1e-4)
    assert lr(4) == pytest.approx(5e-4)
    assert lr(9) == pytest.approx(1e-3)
    # cosine over the remaining 100 steps: peak * (floor + (1 - floor) * (1 + cos(pi p)) / 2)
    assert lr(10) == pytest.approx(1e-3)
    assert lr(35) == pytest.approx(1e-3 * (0.1 + 0.45 * (1 + math.sqrt(0.5))))  # p = 1/4
    assert lr(60) == pytest.approx(5.5e-4)  # p = 1/2: halfway between peak and floor
    assert lr(85) == pytest.approx(1e-3 * (0.1 + 0.45 * (1 - math.sqrt(0.5))))  # p = 3/4
    assert lr(110) == pytest.approx(1e-4)  # the floor, min_lr_ratio * peak
    assert lr(500) == pytest.approx(1e-4)  # and it stays there
    after = [lr(s) for s in range(warmup, total + 1)]
    assert all(a >= b for a, b in zip(after, after[1:], strict=False))


def test_lr_without_warmup_starts_at_the_peak():
    assert lr_at(0, 2e-3, 0, 100, 0.1) == pytest.approx(2e-3)
    assert lr_at(100, 2e-3, 0, 100, 0.1) == pytest.approx(2e-4)


# --- AdamW -------------------------------------------------------------------------------------


def adamw_reference(p, g, m, v, t, lr, b1, b2, eps, wd, decay):
    """AdamW as written in Loshchilov & Hutter / torch.optim.AdamW, in float64."""
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    m_hat = m / (1 - b1**t)
    v_hat = v / (1 - b2**t)
    if decay:
        p = p - lr * wd * p
    p = p - lr * m_hat / (np.sqrt(v_hat) + eps)
    return p, m, v


def test_adamw_matches_a_float64_reference():
    rng = np.random.default_rng(0)
    shapes = {"embed.W_E": (7, 4), "embed.W_pos": (5, 4), "layers.0.ln1.w": (4,),
              "layers.0.attn.W_QKV": (4, 12), "layers.0.attn.b_QKV": (12,),
              "ln_final.w": (4,)}
    params = {n: rng.normal(size=s) for n, s in shapes.items()}
    ref = {n: (p.copy(), np.zeros_like(p), np.zeros_like(p)) for n, p in params.items()}
    opt = AdamW(params, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for t, lr in enumerate([1e-2, 3e-2, 2e-2], start=1):
        grads = {n: rng.normal(size=p.shape) * 10 ** rng.uniform(-4, 1) for n, p in params.items()}
        opt.step(params, grads, lr)
        for n in params:
            ref[n] = adamw_reference(*ref[n][:1], grads[n], *ref[n][1:], t, lr, 0.9, 0.95, 1e-8,
                                     0.1, decays(n))
            np.testing.assert_allclose(params[n], ref[n][0], rtol=1e-13, atol=1e-15, err_msg=n)
            np.testing.assert_allclose(opt.m[n], ref[n][1], rtol=1e-13, err_msg=n)
            np.testing.assert_allclose(opt.v[n], ref[n][2], rtol=1e-13, err_msg=n)


def test_adamw_first_step_moves_every_entry_by_about_lr():
    """With bias correction the first step is lr * g / (|g| + eps): size lr, sign of g."""
    params = {"layers.0.attn.b_QKV": np.zeros(5)}
    g = np.array([3.0, -2.0, 1e-3, -1e-2, 50.0])
    AdamW(params, weight_decay=0.0).step(params, {"layers.0.attn.b_QKV": g}, 0.1)
    np.testing.assert_allclose(params["layers.0.attn.b_QKV"], -0.1 * np.sign(g), rtol=1e-4)


def test_adamw_weight_decay_is_decoupled_from_the_gradient():
    """With a zero gradient only the decay acts: p *= 1 - lr * wd, on decayed tensors only."""
    params = {"layers.0.mlp.W_in": np.full((2, 2), 2.0), "layers.0.mlp.b_in": np.full(2, 2.0)}
    grads = {n: np.zeros_like(p) for n, p in params.items()}
    AdamW(params, weight_decay=0.5).step(params, grads, 0.1)
    np.testing.assert_allclose(params["layers.0.mlp.W_in"], 2.0 * (1 - 0.1 * 0.5))
    np.testing.assert_allclose(params["layers.0.mlp.b_in"], 2.0)


def test_adamw_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    names = ["embed.W_E", "layers.0.mlp.W_out", "layers.0.ln2.b", "embed.W_pos"]
    params = {n: rng.normal(size=(3, 4)) for n in names}
    tparams = {n: torch.tensor(p.copy(), requires_grad=True) for n, p in params.items()}
    groups = [{"params": [tparams[n] for n in names if decays(n)], "weight_decay": 0.1},
              {"params": [tparams[n] for n in names if not decays(n)], "weight_decay": 0.0}]
    topt = torch.optim.AdamW(groups, lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    opt = AdamW(params, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for _ in range(3):
        grads = {n: rng.normal(size=(3, 4)) for n in names}
        for n in names:
            tparams[n].grad = torch.tensor(grads[n])
        topt.step()
        opt.step(params, grads, 1e-2)
    for n in names:
        np.testing.assert_allclose(params[n], tparams[n].detach().numpy(), rtol=1e-12, err_msg=n)


def test_sgd_steps_by_the_gradient_alone_and_decays_as_adamw_does():
    rng = np.random.default_rng(3)
    params = {"layers.0.attn.W_QKV": rng.normal(size=(3, 4)), "ln_final.w": rng.normal(size=4)}
    grads = {n: rng.normal(size=p.shape) for n, p in params.items()}
    want = {"layers.0.attn.W_QKV": params["layers.0.attn.W_QKV"] * (1 - 0.5 * 0.1)
            - 0.5 * grads["layers.0.attn.W_QKV"],  # decayed: a matrix
            "ln_final.w": params["ln_final.w"] - 0.5 * grads["ln_final.w"]}  # not: a norm
    opt = SGD(params, weight_decay=0.1)
    opt.step(params, grads, 0.5)
    for n in params:
        np.testing.assert_array_equal(params[n], want[n])
    assert opt.state()["t"] == 1


def test_training_with_sgd_takes_the_hand_computed_steps(tmp_path, data):
    """--optimizer sgd: each step is p -= lr_t * grad of that step's batch (no momentum, no
    per-weight scaling), the steps TracIn's scores are the first-order change of."""
    from tinygpt_cli.transformer.model import init_params, loss_and_grads

    train_file, val_file = data
    out = tmp_path / "out"
    s = settings(steps=2, warmup=1, dropout=0.0, grad_clip=0.0, optimizer="sgd", lr=0.5)
    train([train_file], [val_file], out, s)
    rng = np.random.default_rng(s.seed)
    params = init_params(TINY, rng)
    stream = encode_stories(read_stories([train_file]), Tokenizer.from_file(
        out / "tokenizer.json")).ids
    for step in range(s.steps):
        x, y = random_windows(stream, s.batch_size, TINY.n_positions, rng)
        _, grads = loss_and_grads(params, TINY, x, y)
        lr = lr_at(step, s.lr, s.warmup, s.steps, s.min_lr_ratio)
        for n, p in params.items():
            p *= 1 - lr * s.weight_decay if decays(n) else 1.0
            p -= lr * grads[n]
    got = checkpoint_params(out)
    for n, p in params.items():
        np.testing.assert_allclose(got[n], p, rtol=1e-6, atol=1e-7, err_msg=n)
    with pytest.raises(InputError, match="--optimizer sgd, not adamw"):
        train([train_file], [val_file], out, settings(steps=4, warmup=1), resume=True)
    with pytest.raises(ValueError, match="--optimizer must be one of adamw, sgd"):
        settings(optimizer="adam")


def test_weight_decay_applies_to_matrices_and_the_token_table_only():
    names = set(param_shapes(TINY))
    decayed = {n for n in names if decays(n)}
    expected = {"embed.W_E"} | {
        f"layers.{i}.{m}" for i in range(TINY.n_layer)
        for m in ("attn.W_QKV", "attn.W_O", "mlp.W_in", "mlp.W_out")
    }
    assert decayed == expected
    for n in ("embed.W_pos", "ln_final.w", "ln_final.b", "layers.0.ln1.w", "layers.1.ln2.w",
              "layers.0.attn.b_QKV", "layers.1.mlp.b_out"):
        assert not decays(n), n


# --- gradient clipping -------------------------------------------------------------------------


def test_clip_scales_all_gradients_jointly_to_the_max_norm():
    grads = {"a": np.array([3.0, 0.0]), "b": np.array([[0.0], [4.0]])}  # joint norm 5
    norm = clip_by_global_norm(grads, 1.0)
    assert norm == pytest.approx(5.0)
    np.testing.assert_allclose(grads["a"], [0.6, 0.0], rtol=1e-6)
    np.testing.assert_allclose(grads["b"], [[0.0], [0.8]], rtol=1e-6)
    joint = math.sqrt(sum(float((g**2).sum()) for g in grads.values()))
    assert joint == pytest.approx(1.0, rel=1e-6)


def test_clip_leaves_small_gradients_alone_and_zero_disables_it():
    grads = {"a": np.array([0.3, 0.4])}
    assert clip_by_global_norm(grads, 1.0) == pytest.approx(0.5)
    np.testing.assert_array_equal(grads["a"], [0.3, 0.4])
    grads = {"a": np.array([30.0, 40.0])}
    assert clip_by_global_norm(grads, 0.0) == pytest.approx(50.0)
    np.testing.assert_array_equal(grads["a"], [30.0, 40.0])


# --- data --------------------------------------------------------------------------------------


def test_read_stories_splits_on_endoftext_lines(tmp_path):
    a = tmp_path / "a.txt"
    a.write_text("First story.\nIt has two lines.\n<|endoftext|>\nSecond story.\n\n"
                 "A paragraph after a blank line.\n<|endoftext|>\n\n<|endoftext|>\nThird.\n")
    b = write_stories(tmp_path / "b.txt", ["Fourth.", "Fifth."])
    assert read_stories([a, b]) == [
        "First story.\nIt has two lines.",
        "Second story.\n\nA paragraph after a blank line.",
        "Third.",  # the empty story between two separators is dropped
        "Fourth.",
        "Fifth.",
    ]


def test_encode_stories_puts_the_eot_id_after_each_story():
    tok = train_tokenizer(STORIES, vocab_size=300)
    stream = encode_stories(STORIES[:3], tok)
    expected: list[int] = []
    for s in STORIES[:3]:
        expected += tok.encode(s) + [tok.eot_id]
    assert stream.ids.dtype == np.uint16
    assert stream.ids.tolist() == expected
    assert int((stream.ids == tok.eot_id).sum()) == 3
    assert stream.ids[-1] == tok.eot_id
    assert stream.n_bytes == sum(len(s.encode()) + 1 for s in STORIES[:3])


def test_random_windows_targets_are_inputs_shifted_by_one():
    stream = (np.arange(200) * 7 % 251).astype(np.uint16)
    x, y = random_windows(stream, 16, 10, np.random.default_rng(0))
    assert x.shape == y.shape == (16, 10)
    assert x.dtype == y.dtype == np.int64
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])
    for xi, yi in zip(x, y, strict=True):  # each row is a real stretch of the stream
        start = int(np.flatnonzero(stream == xi[0])[0])
        np.testing.assert_array_equal(xi, stream[start : start + 10])
        np.testing.assert_array_equal(yi, stream[start + 1 : start + 11])


def test_random_windows_follow_the_generator():
    stream = np.arange(100, dtype=np.uint16)
    a = random_windows(stream, 4, 8, np.random.default_rng(5))
    b = random_windows(stream, 4, 8, np.random.default_rng(5))
    np.testing.assert_array_equal(a[0], b[0])


@pytest.mark.parametrize("n", [41, 45, 48])
def test_eval_windows_cover_the_stream_without_overlap(n):
    t = 8
    stream = np.arange(n, dtype=np.uint16)
    x, y = eval_windows(stream, t)
    k = (n - 1) // t  # as many whole windows as have a target for every input
    assert x.shape == y.shape == (k, t)
    np.testing.assert_array_equal(x.ravel(), np.arange(k * t))  # consecutive, each token once
    np.testing.assert_array_equal(y, x + 1)
    assert n - 1 - k * t < t  # what is left over would not fill another window


# --- the training loop -------------------------------------------------------------------------


def test_training_lowers_the_loss(tmp_path, data):
    train_file, val_file = data
    train([train_file], [val_file], tmp_path / "out", settings(steps=60, eval_every=20))
    log = read_log(tmp_path / "out")
    assert [r["step"] for r in log] == list(range(1, 61))
    losses = [r["train_loss"] for r in log]
    assert np.mean(losses[-10:]) < np.mean(losses[:5]) - 1.5  # nats per token
    assert losses[0] == pytest.approx(math.log(TINY.vocab_size), abs=0.3)  # starts near uniform
    vals = [r["val_loss"] for r in log if "val_loss" in r]
    assert len(vals) == 3 and vals[-1] < vals[0]


def test_same_seed_and_data_give_identical_runs(tmp_path, data):
    train_file, val_file = data
    for name in ("a", "b"):
        train([train_file], [val_file], tmp_path / name, settings(steps=15))
    a, b = read_log(tmp_path / "a"), read_log(tmp_path / "b")
    keys = ("step", "train_loss", "lr", "grad_norm", "tokens", "val_loss")
    assert [[r.get(k) for k in keys] for r in a] == [[r.get(k) for k in keys] for r in b]
    assert (tmp_path / "a/model.safetensors").read_bytes() == \
        (tmp_path / "b/model.safetensors").read_bytes()
    train([train_file], [val_file], tmp_path / "c", settings(steps=15, seed=1))
    assert [r["train_loss"] for r in read_log(tmp_path / "c")] != [r["train_loss"] for r in a]


def test_out_is_a_valid_weights_folder(tmp_path, data):
    train_file, val_file = data
    out = tmp_path / "out"
    result = train([train_file], [val_file], out, settings(steps=10))
    assert {"model.safetensors", "config.json", "tokenizer.json", CHECKPOINT, LOG} <= {
        p.name for p in out.iterdir()}
    tok = Tokenizer.from_file(out / "tokenizer.json")
    assert tok.vocab_size == TINY.vocab_size  # trained by train() with the config's size
    hf = json.loads((out / "config.json").read_text())
    assert hf["model_type"] == "gpt2"
    assert hf["activation_function"] == "gelu_new"
    assert hf["bos_token_id"] == hf["eos_token_id"] == tok.eot_id
    assert hf["tie_word_embeddings"] is True
    config = load_config(out / "config.json")
    for k in ("n_embd", "n_layer", "n_head", "n_inner", "n_positions", "vocab_size"):
        assert getattr(config, k) == getattr(TINY, k), k
    params = load_params(out / "model.safetensors", config)  # names, shapes, finiteness
    assert set(params) == set(param_shapes(config))
    assert result["steps"] == 10 and math.isfinite(result["best_val_loss"])


def test_exported_weights_are_the_best_validation_checkpoint(tmp_path, data):
    """Validation text in letters the training text never uses gets worse as training goes
    on, so the best checkpoint is an early one and the last one is not it."""
    train_file, _ = data
    val_file = write_stories(tmp_path / "odd.txt", ["QXZ JQK 4815 VWX 1623", "ZZQ XJV 42 KQX"])
    out = tmp_path / "out"
    train([train_file], [val_file], out, settings(steps=30, eval_every=3, lr=2e-2))
    log = read_log(out)
    vals = {r["step"]: r["val_loss"] for r in log if "val_loss" in r}
    best_step = min(vals, key=vals.get)
    assert best_step < 30  # the test means something only if the best is not the last

    config = load_config(out / "config.json")
    exported = load_params(out / "model.safetensors", config)
    tok = Tokenizer.from_file(out / "tokenizer.json")
    stream = encode_stories(read_stories([val_file]), tok).ids
    assert round(evaluate(exported, config, stream), 5) == pytest.approx(vals[best_step], abs=2e-5)
    final = checkpoint_params(out)  # the step-30 parameters are not what was exported
    assert round(evaluate(final, config, stream), 5) == pytest.approx(vals[30], abs=2e-5)
    assert any(not np.array_equal(exported[n], final[n]) for n in exported)


def test_without_validation_the_last_weights_are_exported(tmp_path, data):
    train_file, _ = data
    out = tmp_path / "out"
    result = train([train_file], [], out, settings(steps=10))
    assert result["best_val_loss"] == math.inf
    assert all("val_loss" not in r for r in read_log(out))
    exported = load_params(out / "model.safetensors", load_config(out / "config.json"))
    final = checkpoint_params(out)
    for n in exported:
        np.testing.assert_array_equal(exported[n], final[n])


# --- resuming after SIGKILL --------------------------------------------------------------------

RESUME_STEPS = 150


def cli_args(train_file: Path, val_file: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "tinygpt_cli", "train", "--data", str(train_file),
            "--val", str(val_file), "--out", str(out), "--steps", str(RESUME_STEPS),
            "--batch-size", "4", "--lr", "0.01", "--warmup", "5", "--dropout", "0.1",
            "--eval-every", "5", "--checkpoint-every", "10", "--seed", "3",
            "--n-embd", str(TINY.n_embd), "--n-layer", str(TINY.n_layer),
            "--n-head", str(TINY.n_head), "--n-inner", str(TINY.n_inner),
            "--n-positions", str(TINY.n_positions), "--vocab-size", str(TINY.vocab_size)]


def run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_a_run_killed_with_sigkill_resumes_to_the_uninterrupted_result(tmp_path, data):
    train_file, val_file = data
    a, b = tmp_path / "a", tmp_path / "b"
    run_cli(cli_args(train_file, val_file, a), tmp_path)

    # B: the same run, killed once a checkpoint exists and the log has gone past it.
    proc = subprocess.Popen(cli_args(train_file, val_file, b), cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    try:
        while True:
            assert proc.poll() is None, f"the run ended before it was killed:\n{proc.stderr.read()}"
            assert time.monotonic() < deadline, "no checkpoint appeared"
            if (b / CHECKPOINT).is_file() and (b / LOG).is_file() \
                    and len((b / LOG).read_text().splitlines()) >= 15:
                break
            time.sleep(0.001)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    killed_at = len((b / LOG).read_text().splitlines())
    assert 15 <= killed_at < RESUME_STEPS
    # A kill can land inside write_atomically; plant what that leaves so cleanup is tested
    # every time, not only when the kill happens to hit a write.
    (b / f".{CHECKPOINT}.x1y2z3.tmp").write_bytes(b"half a checkpoint")

    resumed = run_cli(cli_args(train_file, val_file, b) + ["--resume"], tmp_path)
    assert "resumed from" in resumed.stderr

    keys = ("step", "train_loss", "lr", "grad_norm", "tokens", "val_loss", "val_bits_per_byte")
    log_a, log_b = read_log(a), read_log(b)
    assert [r["step"] for r in log_b] == list(range(1, RESUME_STEPS + 1))
    for ra, rb in zip(log_a, log_b, strict=True):
        assert [ra.get(k) for k in keys] == [rb.get(k) for k in keys], ra["step"]
    pa, pb = checkpoint_params(a), checkpoint_params(b)
    for n in pa:
        np.testing.assert_array_equal(pa[n], pb[n], err_msg=n)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    result_a, result_b = (json.loads((d / "result.json").read_text()) for d in (a, b))
    assert result_a == result_b
    assert not list(b.glob(".*.tmp")), "temporary files were left behind"


# --- the command line --------------------------------------------------------------------------


def tinygpt(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tinygpt_cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("make_bad", [
    lambda tmp: (["--data", str(tmp / "missing")], "missing"),
    lambda tmp: (["--data", str((tmp / "empty").mkdir() or tmp / "empty")], "no .txt"),
], ids=["missing-path", "folder-without-text"])
def test_train_with_bad_data_exits_2_with_one_error_line(tmp_path, make_bad):
    args, needle = make_bad(tmp_path)
    proc = tinygpt("train", *args, "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_train_with_an_unknown_optimizer_exits_2_with_one_error_line(tmp_path, data):
    train_file, _ = data
    proc = tinygpt("train", "--data", str(train_file), "--out", str(tmp_path / "out"),
                   "--optimizer", "adam", cwd=tmp_path)
    assert_one_error_line(proc, 2, "--optimizer must be one of adamw, sgd, got 'adam'")
    assert not (tmp_path / "out").exists()


def test_train_with_a_missing_validation_file_exits_2(tmp_path, data):
    train_file, _ = data
    proc = tinygpt("train", "--data", str(train_file), "--val", str(tmp_path / "nope.txt"),
                   "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "nope.txt" in lines[0]


def test_split_data_holds_out_the_last_part(tmp_path):
    for i in range(3):
        write_stories(tmp_path / f"part-00{i}.txt", [f"Story {i}."])
    train_files, val_files = split_data([tmp_path])
    assert [f.name for f in train_files] == ["part-000.txt", "part-001.txt"]
    assert [f.name for f in val_files] == ["part-002.txt"]
    train_files, val_files = split_data([tmp_path], tmp_path / "part-000.txt")
    assert [f.name for f in train_files] == ["part-001.txt", "part-002.txt"]
    assert [f.name for f in val_files] == ["part-000.txt"]


def test_train_on_text_shorter_than_one_window_exits_2_and_says_how_long(tmp_path):
    write_stories(tmp_path / "part-000.txt", ["Lily ran.", "Tom sat."])
    write_stories(tmp_path / "part-001.txt", ["Lily ran.", "Tom sat."])
    proc = tinygpt("train", "--data", str(tmp_path), "--out", str(tmp_path / "out"),
                   "--steps", "2", "--vocab-size", "257", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the training text is ") and "at least 130" in last, last
    assert "Traceback" not in proc.stderr


# --- the moving average of the weights and the history snapshots -------------------------------


def test_snapshot_steps_are_log_spaced_and_end_at_the_last_step():
    from tinygpt_cli.jobs.train.loop import snapshot_steps

    steps = snapshot_steps(8000, 8)
    assert steps[0] == 50 and steps[-1] == 8000 and len(steps) == 8
    ratios = np.diff(np.log(steps))
    assert np.allclose(ratios, ratios[0], atol=0.01)  # equal steps in log(step)
    assert snapshot_steps(8000, 0) == [] and snapshot_steps(30, 5) == [30]


def test_ema_decay_ramps_up_then_holds():
    from tinygpt_cli.jobs.train.loop import ema_decay_at

    assert ema_decay_at(0, 0.999) == pytest.approx(0.1)
    assert ema_decay_at(10_000, 0.999) == 0.999


def test_with_ema_the_exported_weights_are_the_average_of_the_steps(tmp_path, data, monkeypatch):
    """The parameters after every step are recorded from the optimiser, averaged by hand
    (decay min(0.8, (1 + s) / (10 + s)) at step s), and compared with what was exported."""
    import tinygpt_cli.jobs.train.loop as loop

    seen: list[dict[str, np.ndarray]] = []

    class RecordingAdamW(loop.AdamW):
        def step(self, params, grads, lr):
            super().step(params, grads, lr)
            seen.append({n: p.astype(np.float64) for n, p in params.items()})

    monkeypatch.setitem(loop.OPTIMIZERS, "adamw", RecordingAdamW)
    train_file, _ = data
    out = tmp_path / "out"
    train([train_file], [], out, settings(steps=12, ema=0.8))
    assert len(seen) == 12
    init = loop.init_params(TINY, np.random.default_rng(0))
    average = {n: init[n].astype(np.float64) for n in init}
    for s, params in enumerate(seen):
        d = min(0.8, (1 + s) / (10 + s))
        average = {n: d * average[n] + (1 - d) * params[n] for n in average}
    exported = load_params(out / "model.safetensors", load_config(out / "config.json"))
    for n in exported:
        np.testing.assert_allclose(exported[n], average[n], rtol=1e-4, atol=1e-6)
    assert not np.allclose(exported["embed.W_E"], seen[-1]["embed.W_E"], atol=1e-4)


def test_snapshots_are_float16_weights_with_their_step_and_learning_rate(tmp_path, data):
    from safetensors import safe_open

    from tinygpt_cli.jobs.train.loop import HISTORY, snapshot_steps

    train_file, val_file = data
    out = tmp_path / "out"
    train([train_file], [val_file], out, settings(steps=60, snapshots=3, eval_every=60))
    names = sorted(p.name for p in (out / HISTORY).iterdir())
    assert names == [f"step-{s:06d}.safetensors" for s in snapshot_steps(60, 3)]
    with safe_open(str(out / HISTORY / names[-1]), "numpy") as f:
        meta = f.metadata()
        assert f.get_tensor("transformer.wte.weight").dtype == np.float16
    assert meta["step"] == "60" and float(meta["lr"]) == pytest.approx(lr_at(59, 1e-2, 5, 60))
    last = load_params(out / HISTORY / names[-1], TINY)
    final = load_params(out / "model.safetensors", load_config(out / "config.json"))
    np.testing.assert_allclose(last["embed.W_E"], final["embed.W_E"], atol=2e-3)


def test_first_snapshot_moves_the_log_spaced_grid_to_the_chance_level_steps(tmp_path, data):
    """--first-snapshot 2: history starts where the loss is still near ln(vocabulary)."""
    from tinygpt_cli.jobs.train.loop import HISTORY

    train_file, val_file = data
    out = tmp_path / "out"
    train([train_file], [val_file], out,
          settings(steps=32, snapshots=4, first_snapshot=2, eval_every=32))
    names = sorted(p.name for p in (out / HISTORY).iterdir())
    assert names == [f"step-{s:06d}.safetensors" for s in (2, 5, 13, 32)]


def test_resuming_a_finished_run_with_more_steps_starts_a_new_warm_up_and_cosine(tmp_path, data):
    """--resume --steps N on a finished run: a warm restart from its last step, its own cycle."""
    from safetensors import safe_open

    from tinygpt_cli.jobs.train.loop import HISTORY

    train_file, val_file = data
    out = tmp_path / "out"
    train([train_file], [val_file], out, settings(steps=20, eval_every=10))  # no snapshots
    first = {r["step"]: r["lr"] for r in read_log(out)}
    train([train_file], [val_file], out, settings(steps=50, lr=5e-3, warmup=4, snapshots=2,
                                                  eval_every=10), resume=True)
    log = {r["step"]: r["lr"] for r in read_log(out)}
    assert all(log[s] == first[s] for s in range(1, 21))  # the first cycle's log is kept
    for s in range(21, 51):  # step s ran at index s - 1, the new cycle's index s - 21
        assert log[s] == pytest.approx(lr_at(s - 21, 5e-3, 4, 30, 0.1))
    assert log[21] == pytest.approx(5e-3 / 4) and log[24] == pytest.approx(5e-3)
    assert log[50] < log[30] < log[24]
    names = sorted(p.name for p in (out / HISTORY).iterdir())
    assert names == ["step-000020.safetensors", "step-000050.safetensors"]  # start and end
    with safe_open(str(out / HISTORY / "step-000020.safetensors"), "numpy") as f:
        assert float(f.metadata()["lr"]) == pytest.approx(first[20])  # the rate it ended on


def test_resuming_an_unfinished_extension_keeps_its_cycle(tmp_path, data):
    train_file, val_file = data
    out = tmp_path / "out"
    train([train_file], [val_file], out, settings(steps=20))
    train([train_file], [val_file], out, settings(steps=50, minutes=1e-9), resume=True)
    stopped = read_log(out)[-1]["step"]
    assert 20 < stopped < 50
    train([train_file], [val_file], out, settings(steps=50), resume=True)
    log = {r["step"]: r["lr"] for r in read_log(out)}
    assert log[50] == pytest.approx(lr_at(29, 1e-2, 5, 30, 0.1))
    assert log[stopped + 1] == pytest.approx(lr_at(stopped - 20, 1e-2, 5, 30, 0.1))


def test_command_txt_keeps_the_recipe_and_the_card_tells_of_the_extension(tmp_path, data):
    from tinygpt_cli.jobs.train.card import write_card

    train_file, val_file = data
    out = tmp_path / "out"
    first, second = "tinygpt train --steps 20", "tinygpt train --resume --steps 40 --lr 5e-3"
    train([train_file], [val_file], out, settings(steps=20, ema=0.9), command=first)
    assert (out / "command.txt").read_text() == first + "\n"
    train([train_file], [val_file], out, settings(steps=40, lr=5e-3, warmup=3, ema=0.9,
                                                  minutes=1e-9), resume=True, command=second)
    train([train_file], [val_file], out, settings(steps=40, lr=5e-3, warmup=3, ema=0.9),
          resume=True, command="tinygpt train --resume --steps 40")  # only continues
    assert (out / "command.txt").read_text() == first + "\n" + second + "\n"
    card = write_card(out, [train_file, val_file])
    # the extension keeps its --resume: that is how it continues the run
    assert "tinygpt train --steps 20\ntinygpt train --resume --steps 40 --lr 5e-3\n" in card
    assert "- Extended: steps 20 to 40 are cycle 2 of the same run" in card
    assert "a new warm-up of 3 steps to a peak learning rate of 0.005" in card
    assert "in the last cycle, peak learning rate 0.005 after 3 warm-up steps" in card


def test_a_retried_extension_replaces_its_line_and_a_short_one_is_refused(tmp_path, data):
    train_file, val_file = data
    out = tmp_path / "out"
    train([train_file], [val_file], out, settings(steps=20), command="first")
    with pytest.raises(InputError, match="extends the run by 5 steps, no more than its "
                                         "--warmup of 5"):
        train([train_file], [val_file], out, settings(steps=25), resume=True, command="short")
    # an extension killed before its first checkpoint (the finished run's checkpoint is
    # still the one on disk), then tried again with another learning rate
    finished = (out / CHECKPOINT).read_bytes()
    train([train_file], [val_file], out, settings(steps=40, minutes=1e-9), resume=True,
          command="try 1")
    assert (out / "command.txt").read_text() == "first\ntry 1\n"
    (out / CHECKPOINT).write_bytes(finished)
    train([train_file], [val_file], out, settings(steps=40, lr=5e-3), resume=True,
          command="try 2")
    assert (out / "command.txt").read_text() == "first\ntry 2\n"


def test_a_checkpoint_with_damaged_settings_is_a_run_error(tmp_path, data):
    from tinygpt_cli.errors import RunError

    train_file, val_file = data
    out = tmp_path / "out"
    train([train_file], [val_file], out, settings(steps=10))
    with np.load(out / CHECKPOINT) as z:
        arrays = dict(z)
    stored = json.loads(str(arrays["settings"]))
    arrays["settings"] = np.asarray(json.dumps({**stored, "steps": None}))
    np.savez(out / CHECKPOINT, **arrays)
    with pytest.raises(RunError, match="is damaged"):
        train([train_file], [val_file], out, settings(steps=20), resume=True)


def test_a_warm_start_begins_at_the_given_weights_and_keeps_their_tokenizer(tmp_path, data):
    """--init: step 0 is the other folder's weights (an evaluation before any step gives
    their loss), its tokenizer is copied unchanged, and the card says where it started."""
    from tinygpt_cli.jobs.corpus import read_stories
    from tinygpt_cli.jobs.train.card import write_card
    from tinygpt_cli.transformer.folder import load_model
    from tinygpt_cli.transformer.windows import encode_stories

    train_file, val_file = data
    first = tmp_path / "first"
    train([train_file], [val_file], first, settings(steps=20))
    second = tmp_path / "second"
    result = train([train_file], [val_file], second,
                   settings(steps=1, lr=1e-9, warmup=0, dropout=0.0, eval_every=1,
                            init=str(first)), command="tinygpt train --init first --steps 1")
    assert (second / "tokenizer.json").read_bytes() == (first / "tokenizer.json").read_bytes()
    model = load_model(first)
    val = encode_stories(read_stories([val_file]), model.tokenizer).ids
    # one step at lr 1e-9 moves nothing visible: the loss is the first run's own
    assert result["best_val_loss"] == pytest.approx(evaluate(model.params, model.config, val),
                                                    rel=1e-5)
    card = write_card(second, [train_file, val_file])
    assert "trained from a warm start (below)" in card
    assert "- Warm start: step 0 is the weights of" in card


def test_a_warm_start_refuses_other_sizes(tmp_path, data):
    train_file, val_file = data
    first = tmp_path / "first"
    train([train_file], [val_file], first, settings(steps=5))
    wider = asdict(TINY) | {"n_inner": TINY.n_inner * 2}
    with pytest.raises(InputError, match="has other sizes: n_inner"):
        train([train_file], [val_file], tmp_path / "second",
              settings(steps=5, config=wider, init=str(first)))


def test_a_resume_with_other_steps_is_kept_in_the_recipe(tmp_path, data):
    train_file, val_file = data
    out = tmp_path / "out"
    first, again = "tinygpt train --steps 40", "tinygpt train --resume --steps 25"
    train([train_file], [val_file], out, settings(steps=40, minutes=1e-9), command=first)
    train([train_file], [val_file], out, settings(steps=25), resume=True, command=again)
    assert (out / "command.txt").read_text() == first + "\n" + again + "\n"
    assert read_log(out)[-1]["step"] == 25


def test_train_writes_the_record_of_its_text(tmp_path, data):
    import hashlib

    train_file, val_file = data
    out = tmp_path / "out"
    train([train_file], [val_file], out, settings(steps=2))
    record = json.loads((out / "data.json").read_text())
    assert [f["name"] for f in record["train"]] == ["train.txt"]
    assert record["validation"][0]["sha256"] == hashlib.sha256(val_file.read_bytes()).hexdigest()
    assert record["train"][0]["bytes"] == train_file.stat().st_size
