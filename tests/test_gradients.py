"""The backward pass against central finite differences in float64 (and torch autograd when
torch is installed): every parameter tensor, every backward op, and training with dropout."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from cli_helpers import file_names

from tinygpt_cli.transformer import ops
from tinygpt_cli.transformer.config import Config
from tinygpt_cli.transformer.model import Dropout, forward, loss_and_grads, param_shapes

CONFIG = Config(n_embd=8, n_layer=2, n_head=2, n_inner=12, vocab_size=11, n_positions=6)
H = 1e-5  # central differences: error ~ H^2 f''' << 1e-6 relative
MAX_REL = 1e-6
ALL_ENTRIES_UP_TO = 200  # larger tensors: a fixed random subset of entries
SUBSET = 60


def relative_error(numeric: np.ndarray, analytic: np.ndarray) -> float:
    scale = np.max(np.abs(numeric))
    assert scale > 0, "the numeric gradient is all zero: the check would prove nothing"
    return float(np.max(np.abs(numeric - analytic)) / scale)


def numeric_grad(f, x: np.ndarray, entries=None, h: float = H) -> np.ndarray:
    """d f / d x[entries] by central differences, perturbing x in place and restoring it."""
    flat = x.reshape(-1)
    entries = range(flat.size) if entries is None else entries
    out = np.zeros(len(entries))
    for n, i in enumerate(entries):
        old = flat[i]
        flat[i] = old + h
        up = f()
        flat[i] = old - h
        down = f()
        flat[i] = old
        out[n] = (up - down) / (2 * h)
    return out


def entries_to_check(size: int, rng: np.random.Generator) -> np.ndarray:
    if size <= ALL_ENTRIES_UP_TO:
        return np.arange(size)
    return np.sort(rng.choice(size, SUBSET, replace=False))


# ---------------------------------------------------------------- the whole model


@pytest.fixture(scope="module")
def problem(make_params):
    rng = np.random.default_rng(11)
    params = make_params(CONFIG, seed=5)
    ids = rng.integers(0, CONFIG.vocab_size, size=(2, 5))
    targets = rng.integers(0, CONFIG.vocab_size, size=(2, 5))
    loss, grads = loss_and_grads(params, CONFIG, ids, targets)
    return params, ids, targets, loss, grads


def loss_of(params, ids, targets, **kw) -> float:
    if kw.get("dropout"):
        kw = {"dropout": Dropout(kw["dropout"], kw["rng"])}
    return ops.cross_entropy(forward(params, CONFIG, ids, **kw), targets)


def test_loss_is_the_mean_negative_log_probability(problem):
    params, ids, targets, loss, grads = problem
    logits = forward(params, CONFIG, ids)
    by_hand = []
    for b in range(ids.shape[0]):
        for t in range(ids.shape[1]):
            z = logits[b, t]
            by_hand.append(np.log(np.exp(z).sum()) - z[targets[b, t]])
    assert loss == pytest.approx(np.mean(by_hand), rel=1e-12)
    assert set(grads) == set(param_shapes(CONFIG))
    for name, g in grads.items():
        assert g.shape == params[name].shape and g.dtype == np.float64, name


@pytest.mark.parametrize("name", list(param_shapes(CONFIG)))
def test_parameter_gradient_matches_finite_differences(problem, name):
    params, ids, targets, _, grads = problem
    p = params[name].copy()
    local = dict(params, **{name: p})
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    entries = entries_to_check(p.size, rng)
    num = numeric_grad(lambda: loss_of(local, ids, targets), p, entries)
    assert relative_error(num, grads[name].reshape(-1)[entries]) <= MAX_REL


def test_unused_positions_get_no_gradient(problem):
    _, ids, _, _, grads = problem
    assert np.all(grads["embed.W_pos"][ids.shape[1]:] == 0.0)
    unused = np.setdiff1d(np.arange(CONFIG.vocab_size), ids)
    # Unused tokens still get gradient from the tied output head, never exactly zero.
    assert np.all(np.abs(grads["embed.W_E"][unused]).sum(axis=-1) > 0)


def test_dropout_gradient_matches_finite_differences_with_repeated_masks(problem):
    params, ids, targets, plain_loss, _ = problem
    p, seed = 0.25, 1234
    loss, grads = loss_and_grads(params, CONFIG, ids, targets, dropout=p,
                                 rng=np.random.default_rng(seed))
    # Same seed, same masks: the loss is a deterministic function of the parameters.
    drop = Dropout(p, np.random.default_rng(seed))
    forward(params, CONFIG, ids, dropout=drop)
    assert loss == loss_of(params, ids, targets, dropout=p, rng=np.random.default_rng(seed))
    assert loss != pytest.approx(plain_loss)
    names = {"embeddings"} | {f"layers.{i}.{n}" for i in range(CONFIG.n_layer)
                              for n in ("attn_out", "mlp_out")}
    assert set(drop.masks) == names
    for mask in drop.masks.values():
        assert set(np.unique(mask)) == {0.0, 1.0 / (1.0 - p)}
    rng = np.random.default_rng(2)
    for name in param_shapes(CONFIG):
        q = params[name].copy()
        local = dict(params, **{name: q})
        entries = np.sort(rng.choice(q.size, min(q.size, 12), replace=False))
        num = numeric_grad(
            lambda local=local: loss_of(local, ids, targets, dropout=p,
                                        rng=np.random.default_rng(seed)),
            q, entries,
        )
        assert relative_error(num, grads[name].reshape(-1)[entries]) <= MAX_REL, name


# ---------------------------------------------------------------- one op at a time
# Each op's output is reduced to a scalar sum(out * R) with a fixed random R, so the
# gradient of that scalar with respect to the output is R: the `dout` the backward gets.


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def check(f, x, analytic):
    assert relative_error(numeric_grad(f, x), analytic.reshape(-1)) <= MAX_REL


def test_layer_norm_backward(rng):
    x = rng.normal(0.5, 2.0, (2, 3, 6))
    g, b = rng.normal(1.0, 0.3, 6), rng.normal(0.0, 0.3, 6)
    R = rng.normal(size=x.shape)

    def f():
        return float((ops.layer_norm(x, g, b, 1e-5)[0] * R).sum())

    _, mean, std = ops.layer_norm(x, g, b, 1e-5)
    dx, dg, db = ops.layer_norm_backward(R, x, g, mean, std)
    check(f, x, dx)
    check(f, g, dg)
    check(f, b, db)


def test_linear_backward(rng):
    x, w, b = rng.normal(size=(2, 3, 4)), rng.normal(size=(4, 5)), rng.normal(size=5)
    R = rng.normal(size=(2, 3, 5))

    def f():
        return float((ops.linear(x, w, b) * R).sum())

    dx, dw, db = ops.linear_backward(R, x, w)
    assert dx.shape == x.shape and dw.shape == w.shape and db.shape == b.shape
    check(f, x, dx)
    check(f, w, dw)
    check(f, b, db)


def test_gelu_backward(rng):
    x = rng.normal(0.0, 2.0, (3, 7))
    R = rng.normal(size=x.shape)
    check(lambda: float((ops.gelu(x) * R).sum()), x, ops.gelu_backward(R, x))


def test_gelu_is_the_tanh_form():
    x = np.array([-3.0, -1.0, 0.0, 0.5, 2.0])
    c = np.sqrt(2.0 / np.pi)
    # rtol: the argument is computed as x (c + c 0.044715 x^2), whose rounding differs; 1 +
    # tanh at x = -3 (0.009) then loses a few digits
    np.testing.assert_allclose(ops.gelu(x), 0.5 * x * (1 + np.tanh(c * (x + 0.044715 * x**3))),
                               rtol=1e-13)


def test_softmax_backward(rng):
    z = rng.normal(size=(3, 5))
    R = rng.normal(size=z.shape)
    check(lambda: float((ops.softmax(z) * R).sum()), z, ops.softmax_backward(R, ops.softmax(z)))


def test_attention_backward(rng):
    q, k, v = (rng.normal(size=(2, 2, 4, 3)) for _ in range(3))
    R = rng.normal(size=(2, 2, 4, 3))

    def f():
        return float((ops.attention(q, k, v)[0] * R).sum())

    _, _, weights = ops.attention(q, k, v)
    dq, dk, dv = ops.attention_backward_parts(R, q, k, v, weights)[:3]
    check(f, q, dq)
    check(f, k, dk)
    check(f, v, dv)


def test_unembed_backward(rng):
    u, wte = rng.normal(size=(2, 3, 4)), rng.normal(size=(7, 4))
    R = rng.normal(size=(2, 3, 7))

    def f():
        return float((ops.unembed(u, wte) * R).sum())

    du, dwte = ops.unembed_backward(R, u, wte)
    check(f, u, du)
    check(f, wte, dwte)


def test_embedding_backward_adds_up_repeated_ids(rng):
    wte = rng.normal(size=(6, 4))
    ids = np.array([[1, 3, 1], [5, 1, 0]])  # id 1 three times, id 2 and 4 never
    R = rng.normal(size=(2, 3, 4))
    dwte = ops.embedding_backward(R, wte, ids)
    check(lambda: float((ops.embedding(wte, ids) * R).sum()), wte, dwte)
    np.testing.assert_allclose(dwte[1], R[0, 0] + R[0, 2] + R[1, 1])
    assert np.all(dwte[[2, 4]] == 0.0)


def test_position_embedding_backward(rng):
    wpe = rng.normal(size=(6, 4))
    R = rng.normal(size=(3, 4, 4))  # a batch of 3 sequences of 4 tokens

    def f():
        return float((np.broadcast_to(ops.position_embedding(wpe, 4), R.shape) * R).sum())

    dwpe = ops.position_embedding_backward(R, wpe)
    check(f, wpe, dwpe)
    assert np.all(dwpe[4:] == 0.0)


def test_cross_entropy_backward(rng):
    logits = rng.normal(0.0, 2.0, (2, 3, 5))
    targets = np.array([[0, 4, 4], [2, 1, 3]])
    check(lambda: ops.cross_entropy(logits, targets), logits,
          ops.cross_entropy_with_grad(logits, targets)[1])


# ---------------------------------------------------------------- torch autograd


def torch_loss(torch, params, ids, targets):
    """The same GPT-2, written with torch ops; returns (loss, leaf tensors by name)."""
    F = torch.nn.functional
    leaves = {n: torch.tensor(p, dtype=torch.float64, requires_grad=True)
              for n, p in file_names(params).items()}  # as GPT-2's file names them
    d, H_, eps = CONFIG.n_embd, CONFIG.n_head, CONFIG.layer_norm_epsilon
    ids_t, T = torch.tensor(ids), ids.shape[1]
    h = leaves["wte.weight"][ids_t] + leaves["wpe.weight"][:T]
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)

    def ln(x, name):
        return F.layer_norm(x, (d,), leaves[name + ".weight"], leaves[name + ".bias"], eps)

    for i in range(CONFIG.n_layer):
        p = f"h.{i}."
        x = ln(h, p + "ln_1")
        qkv = x @ leaves[p + "attn.c_attn.weight"] + leaves[p + "attn.c_attn.bias"]
        q, k, v = (t.reshape(*t.shape[:2], H_, d // H_).transpose(1, 2)
                   for t in qkv.split(d, dim=-1))
        scores = (q @ k.transpose(-1, -2)) / (d // H_) ** 0.5
        z = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v
        z = z.transpose(1, 2).reshape(*h.shape)
        h = h + z @ leaves[p + "attn.c_proj.weight"] + leaves[p + "attn.c_proj.bias"]
        x = ln(h, p + "ln_2")
        x = F.gelu(x @ leaves[p + "mlp.c_fc.weight"] + leaves[p + "mlp.c_fc.bias"],
                   approximate="tanh")
        h = h + x @ leaves[p + "mlp.c_proj.weight"] + leaves[p + "mlp.c_proj.bias"]
    logits = ln(h, "ln_f") @ leaves["wte.weight"].T
    loss = F.cross_entropy(logits.reshape(-1, CONFIG.vocab_size),
                           torch.tensor(targets).reshape(-1))
    return loss, leaves


def test_gradients_match_torch_autograd(problem):
    torch = pytest.importorskip("torch")
    params, ids, targets, loss, grads = problem
    t_loss, leaves = torch_loss(torch, params, ids, targets)
    t_loss.backward()
    assert loss == pytest.approx(t_loss.item(), rel=1e-12)
    by_file_name = file_names(grads)
    assert by_file_name.keys() == leaves.keys()
    for name, leaf in leaves.items():
        np.testing.assert_allclose(by_file_name[name], leaf.grad.numpy(), rtol=1e-9,
                                   atol=1e-12, err_msg=name)


def test_fused_cross_entropy_equals_the_separate_loss_and_backward():
    rng = np.random.default_rng(11)
    logits = rng.normal(0, 3, (3, 5, 17))
    targets = rng.integers(0, 17, (3, 5))
    loss, dlogits = ops.cross_entropy_with_grad(logits, targets)
    assert loss == pytest.approx(ops.cross_entropy(logits, targets), rel=1e-12)
    # the gradient against the textbook formula
    want = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
    want[np.arange(3)[:, None], np.arange(5), targets] -= 1.0
    want /= targets.size
    np.testing.assert_allclose(dlogits, want, atol=1e-15)


def test_gelu_backward_keeps_the_wider_dtype(rng):
    # float32 activations with a float64 upstream gradient: the in-place arithmetic must not
    # round the result to float32
    x = rng.normal(0.0, 2.0, (4, 5)).astype(np.float32)
    R = rng.normal(size=x.shape)
    got = ops.gelu_backward(R, x)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, ops.gelu_backward(R, x.astype(np.float64)), rtol=1e-5,
                               atol=1e-6)


def test_cross_entropy_gradient_of_logits_in_fortran_order():
    # The one-hot is subtracted through a flat view: with logits that are not in C order the
    # view was a copy and the -1/N never reached the gradient.
    rng = np.random.default_rng(12)
    logits = rng.normal(0, 3, (4, 9))
    targets = rng.integers(0, 9, 4)
    want = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
    want[np.arange(4), targets] -= 1.0
    want /= 4
    got = ops.cross_entropy_with_grad(np.asfortranarray(logits), targets)[1]
    np.testing.assert_allclose(got, want, atol=1e-15)


@pytest.mark.parametrize("wide", ["dout", "x", "w", "mean", "std"])
def test_layer_norm_backward_keeps_the_widest_dtype(rng, wide):
    # Recorded values share one dtype in the model, but an intervened run can mix them; in-place
    # arithmetic must not round a float64 input's contribution to float32.
    x = rng.normal(size=(3, 6))
    w = rng.normal(size=6)
    dout = rng.normal(size=x.shape)
    mean = x.mean(axis=-1, keepdims=True)
    std = np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + 1e-5)
    args = {"dout": dout, "x": x, "w": w, "mean": mean, "std": std}
    exact = ops.layer_norm_backward_parts(**args)
    mixed = {k: (v if k == wide else v.astype(np.float32)) for k, v in args.items()}
    names = ("dx", "dw", "db", "dmean", "dstd")
    for name, got, want in zip(names, ops.layer_norm_backward_parts(**mixed), exact, strict=True):
        # db = the sum of dout: it depends on nothing else
        assert got.dtype == (mixed["dout"].dtype if name == "db" else np.float64), name
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=name)


def test_attention_score_gradient_keeps_the_widest_dtype(rng):
    q, k = rng.normal(size=(2, 4, 3)), rng.normal(size=(2, 4, 3)).astype(np.float32)
    dscores = rng.normal(size=(2, 4, 4)).astype(np.float32)
    dq, dk = ops.attention_scores_backward(dscores, q, k)
    assert dq.dtype == dk.dtype == np.float64
    want_dq, want_dk = ops.attention_scores_backward(dscores.astype(np.float64), q,
                                                     k.astype(np.float64))
    np.testing.assert_allclose(dq, want_dq, rtol=1e-6)
    np.testing.assert_allclose(dk, want_dk, rtol=1e-6)


def test_gelu_backward_broadcasts_dout_as_the_formula_does(rng):
    x = rng.normal(0, 2, (1, 5)).astype(np.float32)
    d = rng.normal(size=(3, 5)).astype(np.float32)
    c = np.sqrt(2 / np.pi)
    t = np.tanh(c * (x + 0.044715 * x**3))
    want = d * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x))
    np.testing.assert_allclose(ops.gelu_backward(d, x), want, rtol=1e-5, atol=1e-6)
