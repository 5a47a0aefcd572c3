"""Sparse autoencoders: the encoding against a per-token loop, the backward pass against finite
differences and torch, the evaluation against transformers with the SAE spliced in by a hook,
the perfect reconstruction, resuming, and the command's errors."""

from __future__ import annotations

import re
from functools import partial

import numpy as np
import pytest
from cli_helpers import assert_one_error_line, file_names

from tinygpt_cli.analysis import sae as S
from tinygpt_cli.jobs import sae as SJ
from tinygpt_cli.jobs.dictionaries import saes as SF
from tinygpt_cli.storage.madefor import made_for
from tinygpt_cli.transformer.folder import load_model
from tinygpt_cli.transformer.hooks import Replace

SITE = "layers.0.resid_post"


def random_sae(d: int, m: int, k: int, seed: int = 0, dtype=np.float64) -> S.SAE:
    rng = np.random.default_rng(seed)
    w_dec = rng.normal(size=(m, d))
    w_dec /= np.linalg.norm(w_dec, axis=1, keepdims=True)
    return S.SAE(rng.normal(size=(d, m)).astype(dtype), rng.normal(0, 0.3, m).astype(dtype),
                 w_dec.astype(dtype), rng.normal(0, 0.3, d).astype(dtype), SITE, k)


def test_encoding_equals_a_per_token_loop():
    sae = random_sae(6, 10, 3)
    x = np.random.default_rng(1).normal(size=(7, 6))
    z = S.encode(sae, x)
    for t in range(len(x)):
        a = [max(0.0, sum((x[t, i] - sae.b_dec[i]) * sae.W_enc[i, j] for i in range(6))
                 + sae.b_enc[j]) for j in range(10)]
        keep = sorted(range(10), key=lambda j: -a[j])[:3]
        want = [a[j] if j in keep else 0.0 for j in range(10)]
        np.testing.assert_allclose(z[t], want, atol=1e-12)
        np.testing.assert_allclose(S.decode(sae, z)[t],
                                   sum(want[j] * sae.W_dec[j] for j in range(10)) + sae.b_dec)


def _loss(sae, x, scale, dead, k_aux):
    return S.loss_and_grads(sae, x, scale, dead, k_aux)[0]


def test_gradients_match_finite_differences():
    # without the aux loss: it holds the residual e constant, which finite differences cannot
    # (the torch test below detaches e and checks it)
    sae = random_sae(5, 8, 2, seed=2)
    x = np.random.default_rng(3).normal(size=(9, 5))
    dead = None
    _, grads, _ = S.loss_and_grads(sae, x, 1.7, dead, 2)
    eps = 1e-6
    for name, p in sae.params().items():
        num = np.zeros_like(p)
        for i in np.ndindex(p.shape):
            old = p[i]
            p[i] = old + eps
            up = _loss(sae, x, 1.7, dead, 2)
            p[i] = old - eps
            down = _loss(sae, x, 1.7, dead, 2)
            p[i] = old
            num[i] = (up - down) / (2 * eps)
        np.testing.assert_allclose(grads[name], num, rtol=1e-5, atol=1e-7, err_msg=name)


def test_gradients_match_torch():
    torch = pytest.importorskip("torch")
    sae = random_sae(6, 12, 3, seed=4)
    x = np.random.default_rng(5).normal(size=(10, 6))
    dead = np.zeros(12, bool)
    dead[[1, 5, 7, 9]] = True
    loss, grads, _ = S.loss_and_grads(sae, x, 2.0, dead, 2)
    t = {n: torch.tensor(p, requires_grad=True) for n, p in sae.params().items()}
    xt = torch.tensor(x)
    a = (xt - t["b_dec"]) @ t["W_enc"] + t["b_enc"]
    r = torch.relu(a)
    top = torch.topk(r, 3, dim=-1)
    z = torch.zeros_like(r).scatter(-1, top.indices, top.values)
    err = z @ t["W_dec"] + t["b_dec"] - xt
    a_dead = torch.relu(a) * torch.tensor(dead)
    top_aux = torch.topk(a_dead, 2, dim=-1)
    z_aux = torch.zeros_like(r).scatter(-1, top_aux.indices, top_aux.values)
    e = -err.detach()
    total = (err ** 2).sum() / (10 * 2.0) + S.AUX_SCALE * ((z_aux @ t["W_dec"] - e) ** 2).sum() / 20
    total.backward()
    assert loss == pytest.approx(total.item(), rel=1e-12)
    for name in t:
        np.testing.assert_allclose(grads[name], t[name].grad.numpy(), rtol=1e-10, atol=1e-12)


def test_decoder_rows_stay_unit_and_the_loss_falls():
    x = np.random.default_rng(6).normal(size=(400, 8)).astype(np.float32) @ \
        np.random.default_rng(7).normal(size=(8, 8)).astype(np.float32)
    state = S.new_state(x, 32, 4, SITE, seed=0, lr=3e-3)
    S.train_steps(state, x, 60, batch=64)
    np.testing.assert_allclose(np.linalg.norm(state.sae.W_dec, axis=1), 1, rtol=1e-5)
    np.testing.assert_allclose(state.sae.b_dec, x.mean(axis=0), atol=1.0)
    assert np.mean(state.losses[-10:]) < 0.6 * np.mean(state.losses[:3])


def test_a_resumed_run_equals_the_uninterrupted_one(tmp_path):
    x = np.random.default_rng(8).normal(size=(300, 6)).astype(np.float32)
    settings = {"site": SITE, "latents": 16, "k": 3, "lr": 1e-3}
    whole = S.train_steps(S.new_state(x, 16, 3, SITE, 0, 1e-3), x, 8, batch=32, dead_after=64)
    half = S.train_steps(S.new_state(x, 16, 3, SITE, 0, 1e-3), x, 4, batch=32, dead_after=64)
    SJ.save_checkpoint(tmp_path / "c.npz", half, settings)
    resumed = S.train_steps(SJ.load_checkpoint(tmp_path / "c.npz", settings), x, 8, batch=32,
                            dead_after=64)
    for name, p in whole.sae.params().items():
        np.testing.assert_array_equal(resumed.sae.params()[name], p)


# ------------------------------------------------------------------ evaluation on a model


def perfect_sae(d: int, site: str, b_dec: np.ndarray) -> S.SAE:
    """Latents +e_i and -e_i, all kept: z W_dec = relu(x') - relu(-x') = x' exactly."""
    w_dec = np.concatenate([np.eye(d), -np.eye(d)]).astype(np.float32)
    return S.SAE(np.ascontiguousarray(w_dec.T), np.zeros(2 * d, np.float32), w_dec,
                 b_dec.astype(np.float32), site, 2 * d)


@pytest.fixture
def model_and_windows(tiny_folder):
    model = load_model(tiny_folder.folder)
    rng = np.random.default_rng(9)
    ids = rng.integers(0, model.config.vocab_size, size=(3, 13))
    return model, ids[:, :-1], ids[:, 1:]


def test_a_perfect_reconstruction_recovers_all_the_loss(model_and_windows):
    model, x, y = model_and_windows
    sae = perfect_sae(model.config.n_embd, SITE, np.zeros(model.config.n_embd))
    r = S.evaluate(model.params, model.config, sae, x, y)
    assert r.recovered_vs_zero == pytest.approx(1, abs=1e-5)
    assert r.recovered_vs_mean == pytest.approx(1, abs=1e-5)
    assert r.explained_variance == pytest.approx(1, abs=1e-5)
    assert r.l0 <= 2 * model.config.n_embd


def test_the_loss_with_the_sae_equals_transformers_with_a_forward_hook(model_and_windows,
                                                                       tiny_folder):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model, x, y = model_and_windows
    sae = random_sae(model.config.n_embd, 40, 5, seed=10, dtype=np.float32)
    r = S.evaluate(model.params, model.config, sae, x, y)
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(tiny_folder.folder),
                                                      attn_implementation="eager").eval()

    def splice(module, args, out):  # block 0's output is layers.0.resid_post
        h = out[0] if isinstance(out, tuple) else out
        x_hat = S.reconstruct(sae, h.detach().numpy())
        new = torch.tensor(x_hat, dtype=h.dtype)
        return (new, *out[1:]) if isinstance(out, tuple) else new

    handle = hf.transformer.h[0].register_forward_hook(splice)
    try:
        with torch.no_grad():
            logits = hf(torch.tensor(x)).logits
    finally:
        handle.remove()
    logp = torch.log_softmax(logits.double(), dim=-1)
    want = -logp.gather(-1, torch.tensor(y)[..., None]).mean().item()
    assert r.loss_sae == pytest.approx(want, rel=1e-5)
    clean = S.mean_loss(model.params, model.config, x, y)
    assert r.loss_clean == pytest.approx(clean)
    zeroed = S.mean_loss(model.params, model.config, x, y, Replace({SITE: np.zeros_like}))
    assert r.loss_zero == pytest.approx(zeroed)


def test_a_file_round_trips_and_a_damaged_one_is_refused(tmp_path, tiny_folder):
    cfg = tiny_folder.config
    sae = random_sae(cfg.n_embd, 20, 4, dtype=np.float32)
    weights = tiny_folder.folder / "model.safetensors"
    SF.save_sae(tmp_path / "s.safetensors", sae, made_for(weights))
    back = SF.load_sae(tmp_path / "s.safetensors", cfg, weights)
    assert (back.site, back.k) == (SITE, 4)
    np.testing.assert_array_equal(back.W_dec, sae.W_dec)
    from tinygpt_cli.errors import WeightsError

    (tmp_path / "bad.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{garbage")
    with pytest.raises(WeightsError, match="not a readable safetensors file"):
        SF.load_sae(tmp_path / "bad.safetensors", cfg, weights)
    sae.W_dec = sae.W_dec * 2
    SF.save_sae(tmp_path / "long.safetensors", sae, made_for(weights))
    with pytest.raises(WeightsError, match="rows of W_dec are not unit vectors"):
        SF.load_sae(tmp_path / "long.safetensors", cfg, weights)


# ------------------------------------------------------------------ the command


@pytest.fixture
def data(tmp_path):
    from conftest import story_parts

    return story_parts(tmp_path / "data", (4, 5, 6))


def test_sae_train_eval_and_feature_on_a_tiny_model(cli, data, tmp_path, monkeypatch):
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "s.safetensors"
    r = cli("sae", "train", "--site", "layers.1.mlp_out", "--data", data, "--out", out,
            "--steps", "5", "--latents", "16", "--k", "2", "--batch", "32", "--windows", "4",
            "--json")
    assert r.code == 0, r.err
    assert r.json()["steps"] == 5 and out.is_file()
    assert not out.with_name(out.name + ".checkpoint.npz").exists()
    r = cli("sae", "eval", "--sae", out, "--data", data / "part-002.txt", "--json")
    doc = r.json()
    assert r.code == 0 and doc["data"] == ["part-002.txt"] and doc["l0"] <= 2
    assert doc["loss_recovered_vs_zero"] == pytest.approx(
        (doc["loss_zero_ablated"] - doc["loss_sae"])
        / (doc["loss_zero_ablated"] - doc["loss_clean"]))
    r = cli("sae", "feature", "3", "--sae", out, "--data", data, "--windows", "4", "--json")
    doc = r.json()
    assert r.code == 0 and len(doc["promotes"]) == 10
    assert sum(doc["histogram"]["counts"]) == doc["fired"]
    picture = tmp_path / "f.svg"
    r = cli("sae", "feature", "3", "--sae", out, "--data", data, "--windows", "4", "--save",
            picture, "-q")
    assert r.code == 0 and r.out == "" and "latent 3" in picture.read_text()
    # each top context is highlighted text (no heatmap row), its hover values the JSON's
    svg = picture.read_text()
    drawn = re.findall(r"<title>position (\d+) (\S*) = ([-\d.e]+)</title>", svg)
    want = [(c["position"], c["acts"]) for c in doc["contexts"]]
    at = 0
    for peak, acts in want:
        lo, hi = max(0, peak - 10), peak + 11
        shown = drawn[at:at + len(acts[lo:hi])]
        assert [int(i) for i, _, _ in shown] == list(range(lo, lo + len(shown)))
        np.testing.assert_allclose([float(v) for *_, v in shown], acts[lo:hi], rtol=1e-5,
                                   atol=1e-6)
        at += len(shown)
    assert at == len(drawn) and " · column " not in svg  # no heatmap cell


def test_sae_errors(cli, tmp_path):
    assert_one_error_line(cli("sae", "train", "--site", "layers.0.attn.q"), 2,
                          "an SAE reads layers.N.resid_pre")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file at all")
    assert_one_error_line(cli("sae", "eval", "--sae", bad), 1, "not a readable safetensors")
    # a mistyped --sae is that, not a file to train (it said "no SAE file at ...: train one")
    assert_one_error_line(cli("sae", "feature", "0", "--sae", tmp_path / "none.safetensors"),
                          2, f"--sae {tmp_path / 'none.safetensors'} does not exist")


# ------------------------------------------------------------------ latents in trace and --ablate


def test_trace_lists_active_latents_and_ablate_zeroes_one(cli, tiny):
    from tinygpt_cli.transformer.hooks import Record, Replace
    from tinygpt_cli.transformer.model import forward

    cfg = tiny.model.config
    sae = random_sae(cfg.n_embd, 24, 3, seed=11, dtype=np.float32)
    SF.save_sae(tiny.folder / "sae" / f"{SITE}.safetensors", sae,
               made_for(tiny.model.weights_file))
    text = "Lily wanted to play with her"
    ids = np.asarray(tiny.model.tokenizer.encode(text))
    rec = Record()
    clean = forward(tiny.model.params, cfg, ids, hooks=rec)
    z = S.encode(sae, rec.values[SITE])
    r = cli("trace", text, f"sae.{SITE}", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    np.testing.assert_allclose(doc["data"], z, rtol=1e-6)
    assert [[j for j, _ in row] for row in doc["active"]] == \
        [sorted(np.flatnonzero(zt), key=lambda j: -zt[j]) for zt in z]
    silent = int(np.flatnonzero((z == 0).all(axis=0))[0])
    r = cli("trace", text, "logits", "--ablate", f"sae.{SITE}.{silent}", "--json")
    np.testing.assert_array_equal(np.asarray(r.json()["data"], np.float32), clean)
    loud = int(np.argmax(z.sum(axis=0)))

    def drop(x):  # the latent's share of the reconstruction, taken out by hand
        zz = S.encode(sae, x)
        return x - zz[:, loud:loud + 1] * sae.W_dec[loud]

    want = forward(tiny.model.params, cfg, ids, hooks=Replace({SITE: drop}))
    r = cli("trace", text, "logits", "--ablate", f"sae.{SITE}.{loud}", "--json")
    got = np.asarray(r.json()["data"])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert not np.allclose(got, clean, atol=1e-4)
    assert r.json()["ablated"] == [f"sae.{SITE}.{loud}"]
    assert_one_error_line(cli("trace", text, "logits", "--ablate", f"sae.{SITE}"), 2,
                          "--ablate takes one latent")


def test_the_shipped_sae_reads_the_shipped_model():
    from tinygpt_cli.storage.locations import SHIPPED

    path = SHIPPED / "sae" / "layers.1.resid_post.safetensors"
    if not path.is_file():
        pytest.skip("no shipped SAE")
    model = load_model(SHIPPED)
    sae = SF.load_sae(path, model.config, model.weights_file)
    assert (sae.site, sae.k, sae.n_latents) == ("layers.1.resid_post", 16, 1024)
    from safetensors import safe_open

    from tinygpt_cli.storage.files import sha256

    with safe_open(str(path), framework="numpy") as f:
        trained_on = f.metadata()["weights_sha256"]
    if trained_on != sha256(model.weights_file):  # a branch whose model comes at the merge
        pytest.skip("the shipped SAE was trained on other weights than weights/ holds")
    ids = np.asarray(model.tokenizer.encode("Lily wanted to play with her"))
    from tinygpt_cli.transformer.trace import run_traced as run_trace

    x = run_trace(model.params, model.config, ids).get(sae.site)
    z = S.encode(sae, x)
    assert ((z > 0).sum(axis=1) == 16).all()
    ev = 1 - ((S.decode(sae, z) - x) ** 2).sum() / ((x - x.mean(axis=0)) ** 2).sum()
    assert ev > 0.8


def test_feature_over_a_text_draws_the_latent_a_numpy_encoding_gives(cli, tiny, tmp_path):
    """`sae feature N --text T --save`: the picture's value at each token (its hover text),
    the JSON and the view against z = TopK_k(ReLU((x - b_dec) W_enc + b_enc)) computed here
    from the file's tensors."""
    import re

    from safetensors.numpy import load_file

    from tinygpt_cli.transformer.trace import run_traced as run_trace

    cfg = tiny.model.config
    path = tmp_path / "s.safetensors"
    SF.save_sae(path, random_sae(cfg.n_embd, 24, 3, seed=5, dtype=np.float32),
               made_for(tiny.model.weights_file))
    t = load_file(str(path))
    text = "Lily wanted to play with her <b>ball</b>."
    ids = np.asarray(tiny.model.tokenizer.encode(text))
    x = run_trace(tiny.model.params, cfg, ids).get(SITE).astype(np.float64)
    pre = np.maximum((x - t["b_dec"]) @ t["W_enc"] + t["b_enc"], 0.0)
    z = np.zeros_like(pre)
    for i, row in enumerate(pre):  # the k largest of each token, by hand
        keep = sorted(range(len(row)), key=lambda j: -row[j])[:3]
        z[i, keep] = row[keep]
    latent = int(np.argmax((z > 0).sum(axis=0)))
    want = z[:, latent]
    assert 0 < (want > 0).sum() < len(want)
    picture = tmp_path / "f.svg"
    r = cli("sae", "feature", str(latent), "--sae", path, "--text", text, "--save", picture)
    assert r.code == 0, r.err
    assert r.err.strip() == f"wrote {picture}"
    svg = picture.read_text()
    drawn = re.findall(r"<title>position (\d+) (\S*) = ([-\d.e]+)</title>", svg)
    assert [int(i) for i, _, _ in drawn] == list(range(len(ids)))
    np.testing.assert_allclose([float(v) for _, _, v in drawn], want, rtol=1e-5, atol=1e-6)
    assert "&lt;" in svg and "<b>" not in svg and "</b>" not in svg  # the text is escaped
    peak = int(np.argmax(want))
    assert f"strongest {want[peak]:.3f} at {peak} " in r.out
    assert f"fires on {(want > 0).sum()}" in r.out
    doc = cli("sae", "feature", str(latent), "--sae", path, "--text", text, "--json").json()
    assert doc["path"] == f"sae.{SITE}.{latent}" and doc["ids"] == ids.tolist()
    np.testing.assert_allclose(doc["data"], want, rtol=1e-5, atol=1e-6)
    f = file_names(tiny.model.params)
    pushed = (t["W_dec"][latent] * f["ln_f.weight"]) @ f["wte.weight"].T
    assert doc["promotes"][0]["id"] == int(np.argmax(pushed))
    page = tmp_path / "f.html"
    assert cli("sae", "feature", str(latent), "--sae", path, "--text", text, "--save", page,
               "-q").out == ""
    assert len(re.findall(r"<title>position \d+ ", page.read_text())) == len(ids)


def test_a_latent_over_a_steered_text_and_data(cli, tiny, tmp_path, monkeypatch):
    """sae feature on a steered run: over a text, the latent of the site's value with the
    vector added before block 0 (computed here by hand with a hook); over the data, a search
    of its own, cached under the vector's key and never the unsteered one."""
    from safetensors.numpy import load_file

    from tinygpt_cli.transformer.hooks import Chain, Record, Replace
    from tinygpt_cli.transformer.model import forward

    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "cache"))
    cfg = tiny.model.config
    path = tmp_path / "s.safetensors"
    SF.save_sae(path, random_sae(cfg.n_embd, 24, 3, seed=5, dtype=np.float32),
               made_for(tiny.model.weights_file))
    t = load_file(str(path))
    text = "Lily wanted to play with her ball."
    steer = ["--steer", "Lily was happy", "--steer-away", "Lily was sad", "--steer-layer", "0",
             "--steer-scale", "3"]
    tok = tiny.model.tokenizer

    def mean_pre(s):
        rec = Record()
        forward(tiny.model.params, cfg, np.asarray(tok.encode(s)), hooks=rec)
        return rec.values["layers.0.resid_pre"].astype(np.float64).mean(axis=0)

    v = 3 * (mean_pre("Lily was happy") - mean_pre("Lily was sad"))
    rec = Record()
    forward(tiny.model.params, cfg, np.asarray(tok.encode(text)), hooks=Chain(
        Replace({"layers.0.resid_pre": lambda h: h + v.astype(h.dtype)}), rec))
    x = rec.values[SITE].astype(np.float64)
    pre = np.maximum((x - t["b_dec"]) @ t["W_enc"] + t["b_enc"], 0.0)
    kth = np.sort(pre, axis=1)[:, -3][:, None]
    z = np.where(pre >= kth, pre, 0.0)
    latent = int(np.argmax((z > 0).sum(axis=0)))
    r = cli("sae", "feature", str(latent), "--sae", path, "--text", text, *steer, "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["steered"]["site"] == "layers.0.resid_pre"
    np.testing.assert_allclose(doc["data"], z[:, latent], rtol=1e-4, atol=1e-5)
    unsteered = cli("sae", "feature", str(latent), "--sae", path, "--text", text, "--json")
    assert not np.allclose(unsteered.json()["data"], doc["data"])  # the vector moves it
    data = tmp_path / "stories.txt"
    data.write_text("Lily wanted to play with her ball. Tom was happy.\n\n" * 40,
                    encoding="utf-8")
    search = ["sae", "feature", str(latent), "--sae", path, "--data", data, "--windows", "4",
              "--json"]
    calls = []
    real = S.site_values
    monkeypatch.setattr(S, "site_values", lambda *a, **k: calls.append(1) or real(*a, **k))
    steered = cli(*search, *steer)
    assert steered.code == 0, steered.err
    assert cli(*search, *steer).out == steered.out and len(calls) == 1
    plain = cli(*search)
    assert len(calls) == 2 and "steered" not in plain.json() and "steered" in steered.json()


def test_eval_in_shards_of_one_window_gives_the_losses_of_one_pass(model_and_windows,
                                                                    monkeypatch):
    """sae eval's passes run a task per shard of windows (on a cluster too): the summed
    shards are the loss of one pass over every window, here against transformers' hook above
    by way of mean_loss."""
    from tinygpt_cli.jobs import cluster

    model, x, y = model_and_windows
    sae = random_sae(model.config.n_embd, 40, 5, seed=10, dtype=np.float32)
    whole = S.evaluate(model.params, model.config, sae, x, y)
    monkeypatch.setattr(cluster, "SHARD", 1)  # 3 shards of one window, as `sae eval` runs them
    sharded = S.evaluate(model.params, model.config, sae, x, y,
                         over=partial(cluster.over_windows, None))
    for name in ("loss_clean", "loss_sae", "loss_zero", "loss_mean"):
        assert getattr(sharded, name) == pytest.approx(getattr(whole, name), rel=1e-12)
    mean = S.site_values(model.params, model.config, x, SITE).mean(axis=0)
    want = S.mean_loss(model.params, model.config, x, y, Replace({SITE: lambda v: mean}))
    assert sharded.loss_mean == pytest.approx(want, rel=1e-12)
