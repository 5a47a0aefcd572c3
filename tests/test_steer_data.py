"""Steering reaches the commands that fit or evaluate instruments over data (issue 20): means,
sae train|eval, lens --fit|--evaluate, probe and steer. Each steered figure is checked against
transformers with a torch forward pre-hook adding the same vector (tests/test_steer.py's
hf_steering) and the sums written out here in NumPy; scale 0 is the unsteered run bit for bit;
a steered run never writes over the weights folder's own instrument, and a file it writes
says in its metadata how it was steered."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_helpers import assert_one_error_line, file_names
from safetensors import safe_open
from safetensors.numpy import load_file, save_file
from test_steer import STEER, hf_model, hf_steering, hf_vector

from tinygpt_cli.jobs.corpus import data_windows, read_stories
from tinygpt_cli.storage.madefor import made_for
from tinygpt_cli.transformer.windows import encode_stories, eval_windows

SCALE = 3.0
STEERED = [*STEER, "--steer-scale", str(SCALE)]  # layers.1.resid_pre + 3 v
SAID = {"site": "layers.1.resid_pre", "scale": SCALE, "toward": "Lily was happy",
        "away": "Lily was sad"}


@pytest.fixture
def data(tmp_path, monkeypatch):
    """Two training parts and part-005.txt, the held-out one (the last); a cache of its own."""
    from conftest import SENTENCES

    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "data"
    folder.mkdir()
    for i, name in enumerate(("part-000.txt", "part-001.txt", "part-005.txt")):
        stories = [" ".join(SENTENCES[j % 5] for j in range(s, s + 4 + i)) for s in range(9)]
        (folder / name).write_text("\n<|endoftext|>\n".join(stories) + "\n", encoding="utf-8")
    return folder


@pytest.fixture
def hf(tiny):
    """(torch, the transformers model, v: the --steer vector at block 1)."""
    torch, model = hf_model(tiny.folder)
    return torch, model, hf_vector(torch, model, tiny.model.tokenizer, "Lily was happy",
                                   "Lily was sad", 1)


def metadata(path) -> dict:
    with safe_open(str(path), framework="numpy") as f:
        return f.metadata()


def says_steered(doc: dict) -> None:
    assert {k: doc["steered"][k] for k in SAID} == SAID


def captured(torch, model, ids, modules, scale=SCALE, v=None, pre=()):
    """{name: output (or, for names in `pre`, input) of each module}, and the log-probs, of
    transformers' run on ids [B, T] with scale * v added to block 1's input."""
    seen, handles = {}, []
    with hf_steering(torch, model, v, 1, scale):
        for name, m in modules.items():  # registered after the steering: they see its input
            if name in pre:
                handles.append(m.register_forward_pre_hook(
                    lambda mod, args, name=name: seen.__setitem__(name, args[0].double().numpy())))
            else:
                handles.append(m.register_forward_hook(
                    lambda mod, args, out, name=name: seen.__setitem__(
                        name, (out[0] if isinstance(out, tuple) else out).double().numpy())))
        try:
            logits = model(torch.tensor(ids)).logits.double()
        finally:
            for h in handles:
                h.remove()
    return seen, torch.log_softmax(logits, -1).numpy()


def nll(logp: np.ndarray, targets: np.ndarray) -> float:
    return float(-np.take_along_axis(logp, targets[..., None], -1).mean())


# ------------------------------------------------------------------ means


def test_means_are_the_steered_runs(cli, tiny, hf, data, tmp_path):
    torch, model, v = hf
    out = tmp_path / "m.safetensors"
    r = cli("means", "--data", data, "--out", out, *STEERED, "--json")
    assert r.code == 0, r.err
    says_steered(r.json())
    windows, _ = eval_windows(encode_stories(read_stories([data / "part-005.txt"]),
                                             tiny.model.tokenizer).ids, 128)
    blocks = model.transformer.h
    modules = {**{f"z{i}": b.attn.c_proj for i, b in enumerate(blocks)},
               **{f"attn{i}": b.attn for i, b in enumerate(blocks)},
               **{f"mlp{i}": b.mlp for i, b in enumerate(blocks)}}
    seen, _ = captured(torch, model, windows, modules, v=v, pre={"z0", "z1"})
    got, d_k = load_file(str(out)), tiny.model.config.d_k
    for i in range(len(blocks)):
        want = {f"layers.{i}.attn_out": seen[f"attn{i}"].mean((0, 1)),
                f"layers.{i}.mlp_out": seen[f"mlp{i}"].mean((0, 1)),
                **{f"layers.{i}.heads.{h}.out": seen[f"z{i}"][..., h * d_k:(h + 1) * d_k]
                   .mean((0, 1)) for h in range(tiny.model.config.n_head)}}
        for path, mean in want.items():
            np.testing.assert_allclose(got[path], mean, rtol=1e-4, atol=1e-5, err_msg=path)
    plain = load_file(str(tmp_path / "p.safetensors")) if cli(
        "means", "--data", data, "--out", tmp_path / "p.safetensors").code == 0 else None
    assert np.abs(plain["layers.1.mlp_out"] - got["layers.1.mlp_out"]).max() > 1e-3
    assert json.loads(metadata(out)["steered"]) == r.json()["steered"]
    assert "steered" not in metadata(tmp_path / "p.safetensors")


def test_a_steered_mean_ablation_puts_in_the_steered_models_means(cli, tiny, hf, data):
    """ablate --mode mean under steering: the head's output replaced by its mean over the
    held-out text in the steered model (transformers, the same pre-hook), not the unsteered
    mean."""
    torch, model, v = hf
    text = "Lily wanted to play with her"
    r = cli("ablate", text, "-l", "1", "-H", "1", "--mode", "mean", "--data", data, *STEERED,
            "--json")  # block 1: the steering is added to its input
    assert r.code == 0, r.err
    says_steered(r.json())
    windows, _ = eval_windows(encode_stories(read_stories([data / "part-005.txt"]),
                                             tiny.model.tokenizer).ids, 128)
    proj = model.transformer.h[1].attn.c_proj
    seen, _ = captured(torch, model, windows, {"z": proj}, v=v, pre={"z"})
    d_k = tiny.model.config.d_k
    mean = torch.tensor(seen["z"][..., d_k:2 * d_k].mean((0, 1)), dtype=torch.float32)

    def put_mean(mod, args):
        z = args[0].clone()
        z[..., d_k:2 * d_k] = mean
        return (z,)

    handle = proj.register_forward_pre_hook(put_mean)
    try:
        _, logp = captured(torch, model, [tiny.model.tokenizer.encode(text)], {}, v=v)
    finally:
        handle.remove()
    row = r.json()["components"][0]
    assert row["logp_after"] == pytest.approx(logp[0, -1, r.json()["target"]["id"]], abs=1e-4)


# ------------------------------------------------------------------ sae eval and train


def topk_sae(x: np.ndarray, t: dict, k: int) -> np.ndarray:
    """x_hat of a TopK SAE, written out: z = TopK_k(ReLU((x - b_dec) W_enc + b_enc))."""
    pre = np.maximum((x - t["b_dec"]) @ t["W_enc"] + t["b_enc"], 0.0)
    z = np.where(pre >= np.sort(pre, -1)[..., -k:-k + 1], pre, 0.0)
    return z @ t["W_dec"] + t["b_dec"]


def test_sae_eval_splices_the_sae_into_the_steered_run(cli, tiny, hf, data, tmp_path):
    from test_sae import random_sae

    from tinygpt_cli.jobs.dictionaries import saes as SF

    torch, model, v = hf
    sae = random_sae(tiny.model.config.n_embd, 24, 3, seed=4, dtype=np.float32)
    sae.site = "layers.1.resid_post"
    SF.save_sae(tmp_path / "s.safetensors", sae, made_for(tiny.model.weights_file))
    r = cli("sae", "eval", "--sae", tmp_path / "s.safetensors", "--data", data, "--windows",
            "2", *STEERED, "--json")
    assert r.code == 0, r.err
    doc = r.json()
    says_steered(doc)
    x, y = data_windows([data / "part-005.txt"], tiny.model.tokenizer, 128, 2)
    t = load_file(str(tmp_path / "s.safetensors"))
    seen, logp = captured(torch, model, x, {"site": model.transformer.h[1]}, v=v)
    site = seen["site"]
    losses = {"loss_clean": nll(logp, y)}
    for key, fn in (("loss_sae", lambda h: topk_sae(h, t, 3)), ("loss_zero_ablated", np.zeros_like),
                    ("loss_mean_ablated", lambda h: np.broadcast_to(site.mean((0, 1)), h.shape))):
        def splice(mod, args, out, fn=fn):  # a block returns a tensor or a tuple
            h = out[0] if isinstance(out, tuple) else out
            new = torch.tensor(fn(h.double().numpy()), dtype=h.dtype)
            return (new, *out[1:]) if isinstance(out, tuple) else new
        handle = model.transformer.h[1].register_forward_hook(splice)
        losses[key] = nll(captured(torch, model, x, {}, v=v)[1], y)
        handle.remove()
    for key, want in losses.items():
        assert doc[key] == pytest.approx(want, rel=1e-5), key
    flat = site.reshape(-1, site.shape[-1])
    ev = 1 - ((flat - topk_sae(flat, t, 3)) ** 2).sum() / ((flat - flat.mean(0)) ** 2).sum()
    assert doc["explained_variance"] == pytest.approx(ev, rel=1e-4)
    plain = cli("sae", "eval", "--sae", tmp_path / "s.safetensors", "--data", data,
                "--windows", "2", "--json").json()
    assert "steered" not in plain and plain["loss_clean"] != pytest.approx(doc["loss_clean"])


def test_sae_train_learns_the_steered_values(cli, tiny, hf, data, tmp_path):
    """With --lr 0 the SAE stays at its start, whose b_dec is the mean of the values it was
    given: the steered run's, over the training windows."""
    torch, model, v = hf
    out = tmp_path / "s.safetensors"
    r = cli("sae", "train", "--site", "layers.1.resid_post", "--data", data, "--out", out,
            "--steps", "1", "--latents", "8", "--k", "2", "--batch", "8", "--windows", "3",
            "--lr", "0", *STEERED, "--json")
    assert r.code == 0, r.err
    says_steered(r.json())
    x, _ = data_windows([data / "part-000.txt", data / "part-001.txt"], tiny.model.tokenizer,
                        128, 3)
    seen, _ = captured(torch, model, x, {"site": model.transformer.h[1]}, v=v)
    np.testing.assert_allclose(load_file(str(out))["b_dec"], seen["site"].mean((0, 1)),
                               rtol=1e-4, atol=1e-5)
    meta = metadata(out)
    assert json.loads(meta["steered"]) == r.json()["steered"] and meta["k"] == "2"


# ------------------------------------------------------------------ the tuned lens


def test_lens_evaluate_reads_the_steered_stream(cli, tiny, hf, data, tmp_path, monkeypatch):
    from tinygpt_cli.jobs import tuned_lens as LJ

    monkeypatch.setattr(LJ, "EVAL_WINDOWS", 2)
    torch, model, v = hf
    cfg, p = tiny.model.config, tiny.model.params
    rng = np.random.default_rng(3)
    lens = {**{f"A.{i}": rng.normal(0, 0.1, (cfg.n_embd, cfg.n_embd)).astype(np.float32)
               for i in range(cfg.n_layer)},
            **{f"b.{i}": rng.normal(0, 0.1, cfg.n_embd).astype(np.float32)
               for i in range(cfg.n_layer)}}
    save_file(lens, str(tmp_path / "t.safetensors"), made_for(tiny.model.weights_file))
    r = cli("lens", "--evaluate", "--lens", tmp_path / "t.safetensors", "--data", data,
            *STEERED, "--json")
    assert r.code == 0, r.err
    doc = r.json()
    says_steered(doc)
    x, _ = data_windows([data / "part-005.txt"], tiny.model.tokenizer, 128, 2)
    blocks = {f"in{i}": b for i, b in enumerate(model.transformer.h)}
    seen, logp_final = captured(torch, model, x, blocks, v=v, pre=set(blocks))

    def log_probs(h):
        u = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-5)
        f = file_names(p)
        z = (u * f["ln_f.weight"] + f["ln_f.bias"]) @ f["wte.weight"].T.astype(np.float64)
        z = z - z.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))

    for i in range(cfg.n_layer):
        h = seen[f"in{i}"]  # block i's input in the steered run: block 1's has 3 v in it
        for kind, stream in (("logit", h), ("tuned", h + h @ lens[f"A.{i}"] + lens[f"b.{i}"])):
            logp = log_probs(stream)
            kl = (np.exp(logp_final) * (logp_final - logp)).sum(-1).mean()
            top1 = (logp.argmax(-1) == logp_final.argmax(-1)).mean()
            assert doc[f"kl_{kind}_lens"][i] == pytest.approx(kl, rel=1e-4, abs=1e-6)
            assert doc[f"top1_{kind}_lens"][i] == pytest.approx(top1)
    plain = cli("lens", "--evaluate", "--lens", tmp_path / "t.safetensors", "--data", data,
                "--json").json()
    assert plain["kl_logit_lens"][1] != pytest.approx(doc["kl_logit_lens"][1], rel=1e-3)


# ------------------------------------------------------------------ probe and steer


def test_probe_fits_the_steered_values(cli, tiny, hf, inputs):
    """The probe's weights are the fit on transformers' steered values at the site (the fit
    itself is checked against a Newton solution in test_probe.py)."""
    from tinygpt_cli.analysis import probe as pr

    torch, model, v = hf
    labels, out = inputs[1] / "labels.txt", inputs[1] / "probe.safetensors"
    r = cli("probe", "--site", "layers.1.resid_post", "--labels", labels, "--out", out,
            *STEERED, "--json")
    assert r.code == 0, r.err
    doc = r.json()
    says_steered(doc)
    tok = tiny.model.tokenizer
    lines = pr.parse_labels(labels.read_text())
    ids = [tok.encode(line.text) for line in lines]
    feats = [captured(torch, model, [i], {"s": model.transformer.h[1]}, v=v)[0]["s"][0]
             for i in ids]
    marks = [pr.token_labels(line, tok.byte_offsets(i), None, n)
             for n, (line, i) in enumerate(zip(lines, ids, strict=True), 1)]
    want = pr.probe_report(feats, marks, ids, "layers.1.resid_post", held_out=0.25, seed=1,
                           l2=1e-3)
    np.testing.assert_allclose(doc["data"], want.W, rtol=1e-3, atol=1e-4)
    assert doc["accuracy"] == pytest.approx(want.accuracy)
    assert json.loads(metadata(out)["steered"]) == doc["steered"]


POS = ["The day was happy", "Lily felt happy", "Tom was very happy", "The dog was happy"]
NEG = [t.replace("happy", "sad") for t in POS]


def test_steer_measures_its_vector_on_top_of_the_steering(cli, tiny, hf, data, tmp_path):
    """--steer at block 0 (angry - calm, times 2) under a new vector built at block 1: the
    pairs' values, the prompts and the loss are all of runs steered at block 0 first."""
    torch, model, _ = hf
    tok = tiny.model.tokenizer
    (tmp_path / "pos.txt").write_text("\n".join(POS) + "\n")
    (tmp_path / "neg.txt").write_text("\n".join(NEG) + "\n")
    base = ["--steer", "Tom was angry", "--steer-away", "Tom was calm", "--steer-layer", "0",
            "--steer-scale", "2"]
    out = tmp_path / "v.safetensors"
    r = cli("steer", "--pos", tmp_path / "pos.txt", "--neg", tmp_path / "neg.txt", "--layer",
            "1", "--scale", "2", "--data", data, "--stories", "3", "--out", out, *base,
            "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["steered"]["site"] == "layers.0.resid_pre" and doc["steered"]["scale"] == 2
    vb = hf_vector(torch, model, tok, "Tom was angry", "Tom was calm", 0)

    def run(ids, c=0.0, v=None):  # logits of transformers steered at block 0, then c v at 1
        with hf_steering(torch, model, vb, 0, 2.0), \
                hf_steering(torch, model, np.zeros(vb.shape) if v is None else v, 1, c):
            out = model(torch.tensor([ids]), output_hidden_states=True)
        return out.logits[0].double().numpy(), out.hidden_states[1][0].double().numpy()

    v = np.mean([run(tok.encode(POS[i - 1]))[1].mean(0) - run(tok.encode(NEG[i - 1]))[1].mean(0)
                 for i in doc["train_pairs"]], axis=0)
    np.testing.assert_allclose(doc["vector"], v, rtol=1e-5, atol=1e-6)
    for prompt in doc["prompts"]:
        diffs = [run(prompt["ids"], c, v)[0][-1] for c in doc["scales"]]
        np.testing.assert_allclose(prompt["diffs"], [z[prompt["target"]] - z[prompt["vs"]]
                                                     for z in diffs], rtol=1e-4, atol=1e-4)
    stories = [[tok.eot_id] + ids for ids in tok.encode_batch(
        read_stories([data / "part-005.txt"])[:3])]

    def loss(c):
        return np.mean(np.concatenate([
            -log_softmax(run(s[:-1], c, v)[0])[np.arange(len(s) - 1), s[1:]] for s in stories]))
    assert doc["loss_before"] == pytest.approx(loss(0.0), abs=1e-5)
    assert doc["loss_after"] == pytest.approx(loss(2.0), abs=1e-5)
    assert json.loads(metadata(out)["steered"]) == doc["steered"]


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


# ------------------------------------------------------------------ scale 0, views, refusals


def commands(data, tmp, out) -> dict[str, list]:
    """The argv of each command that runs the model over data; what it writes goes to `out`
    (the SAE that sae eval reads, and the pairs and labels, are in `tmp`)."""
    return {
        "means": ["means", "--data", data, "--out", out / "m.safetensors"],
        "sae train": ["sae", "train", "--site", "layers.0.mlp_out", "--data", data, "--out",
                      out / "s.safetensors", "--steps", "2", "--latents", "8", "--k", "2",
                      "--batch", "16", "--windows", "2"],
        "sae eval": ["sae", "eval", "--sae", tmp / "s.safetensors", "--data", data,
                     "--windows", "2"],
        "lens": ["lens", "--fit", "--evaluate", "--data", data, "--lens", out / "t.safetensors"],
        "probe": ["probe", "--site", "layers.1.resid_pre", "--labels", tmp / "labels.txt",
                  "--out", out / "p.safetensors"],
        "steer": ["steer", "--pos", tmp / "pos.txt", "--neg", tmp / "neg.txt", "--layer", "1",
                  "--data", data, "--stories", "2", "--out", out / "v.safetensors"],
    }


@pytest.fixture
def inputs(tiny, data, tmp_path, monkeypatch):
    """The files the commands read, beside the data; the tuned lens's work made small."""
    from test_sae import random_sae

    from tinygpt_cli.jobs import tuned_lens as LJ
    from tinygpt_cli.jobs.dictionaries import saes as SF

    for name, value in (("FIT_STEPS", 2), ("FIT_WINDOWS", 2), ("EVAL_WINDOWS", 2)):
        monkeypatch.setattr(LJ, name, value)
    sae = random_sae(tiny.model.config.n_embd, 8, 2, seed=1, dtype=np.float32)
    SF.save_sae(tmp_path / "s.safetensors", sae, made_for(tiny.model.weights_file))
    (tmp_path / "pos.txt").write_text("\n".join(POS) + "\n")
    (tmp_path / "neg.txt").write_text("\n".join(NEG) + "\n")
    words = ["Lily", "Tom", "ball", "park", "dog", "ran", "saw", "big"]
    rng = np.random.default_rng(0)
    (tmp_path / "labels.txt").write_text("\n".join(
        " ".join(f"{w}[{'long' if len(w) > 3 else 'short'}]" for w in rng.choice(words, 5))
        for _ in range(12)) + "\n")
    return data, tmp_path


@pytest.mark.parametrize("name", ["means", "sae train", "sae eval", "lens", "probe", "steer"])
def test_scale_zero_is_the_unsteered_run_bit_for_bit(cli, inputs, name):
    data, tmp = inputs
    runs = {}
    for kind, steer in (("plain", []), ("zero", [*STEER, "--steer-scale", "0"])):
        (tmp / kind).mkdir()
        runs[kind] = cli(*commands(data, tmp, tmp / kind)[name], *steer, "--json")
        assert runs[kind].code == 0, runs[kind].err
    plain, zero = runs["plain"].json(), runs["zero"].json()
    assert zero.pop("steered")["scale"] == 0 and "steered" not in plain
    assert {k: v for k, v in zero.items() if k != "path"} == \
        {k: v for k, v in plain.items() if k != "path"}
    assert runs["zero"].err.splitlines()[-1].startswith(
        "steered: layers.1.resid_pre + 0 * v, v = 'Lily was happy' - 'Lily was sad'")
    written = sorted(f.name for f in (tmp / "plain").iterdir())
    assert written == sorted(f.name for f in (tmp / "zero").iterdir())
    for f in written:
        a, b = load_file(str(tmp / "plain" / f)), load_file(str(tmp / "zero" / f))
        assert list(a) == list(b) and all(a[k].tobytes() == b[k].tobytes() for k in a), f
        assert json.loads(metadata(tmp / "zero" / f)["steered"])["scale"] == 0
        assert "steered" not in metadata(tmp / "plain" / f)


@pytest.mark.parametrize("name", ["means", "sae train", "sae eval", "lens", "probe", "steer"])
def test_every_view_of_a_steered_run_says_so(cli, inputs, name):
    data, tmp = inputs
    (tmp / "views").mkdir()  # sae train never writes over the SAE that sae eval reads
    r = cli(*commands(data, tmp, tmp / "views")[name], *STEERED)
    assert r.code == 0, r.err
    assert r.out.startswith("steered before this view: layers.1.resid_pre + 3 * v, v = 'Lily "
                            "was happy' - 'Lily was sad'"), r.out[:200]
    assert r.err.splitlines()[-1].startswith("steered: layers.1.resid_pre + 3 * v")


@pytest.mark.parametrize(("argv", "default", "option"), [
    (["means", "--data", "{data}"], "means.safetensors", "--out"),
    (["sae", "train", "--site", "layers.1.resid_post", "--data", "{data}"],
     "sae/SITE.safetensors", "--out"),
    (["lens", "--fit", "--data", "{data}"], "lens/tuned.safetensors", "--lens"),
    (["lens", "--fit", "--evaluate", "--data", "{data}"], "lens/tuned.safetensors", "--lens"),
])
@pytest.mark.parametrize("data_given", ["the data", "a missing folder"])
def test_a_steered_run_never_writes_over_the_weights_folders_own(cli, tiny, data, argv,
                                                                  default, option, data_given):
    """Refused before any work: even a --data that is not there is not looked at."""
    where = data if data_given == "the data" else data / "nowhere"
    before = sorted(p.name for p in tiny.folder.rglob("*"))
    r = cli(*[a.format(data=where) for a in argv], *STEERED)
    assert r.err == f"error: a steered run does not write over the weights folder's " \
                    f"{default}: give {option} FILE (its metadata records the steering)\n"
    assert_one_error_line(r, 2)
    assert sorted(p.name for p in tiny.folder.rglob("*")) == before


def test_the_data_commands_take_the_steering_options(cli):
    for argv in (["means"], ["steer"], ["probe"], ["sae", "train"], ["sae", "eval"], ["lens"]):
        out = cli(*argv, "--help").out
        for option in ("--steer ", "--steer-away", "--steer-vector", "--steer-layer",
                       "--steer-scale"):
            assert option in out, (argv, option)
