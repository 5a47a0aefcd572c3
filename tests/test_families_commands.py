"""`sae train` (and eval), `steer` and `probe` on a random Llama and a random GPT-NeoX folder
(tiny: 2 blocks of 16 numbers): each runs on the family's own values, checked against what
the family computes (the steering vector against the mean difference of the recorded
resid_pre, a probe of the token rows that rotary models' first resid_pre is), and a site
the family has not (a parallel block's resid_mid, a LayerNorm model's rms) is refused in
one line, exit 2, saying why."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import TOKENIZER, assert_one_error_line
from safetensors.numpy import load_file

from tinygpt_cli.jobs.train.loop import arch_config
from tinygpt_cli.transformer.families import save_config
from tinygpt_cli.transformer.folder import load_model, save_params
from tinygpt_cli.transformer.model import init_params, record

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module", params=["llama", "neox"])
def folder(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    config = arch_config(request.param, n_embd=16, n_layer=2, n_head=4, n_inner=24,
                         vocab_size=4096, n_positions=64)
    save_params(init_params(config, np.random.default_rng(2)), path / "model.safetensors",
                config)
    save_config(config, path / "config.json")
    shutil.copyfile(TOKENIZER, path / "tokenizer.json")
    return path


@pytest.fixture
def data(tmp_path):
    from conftest import story_parts

    return story_parts(tmp_path / "data", (4, 5, 6))


def test_sae_trains_and_evaluates_on_the_familys_values(cli, folder, data, tmp_path,
                                                        monkeypatch):
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "s.safetensors"
    r = cli("sae", "train", "--site", "layers.1.mlp_out", "--weights", folder, "--data", data,
            "--out", out, "--steps", "5", "--latents", "16", "--k", "2", "--batch", "32",
            "--windows", "4", "--json")
    assert r.code == 0, r.err
    assert r.json()["steps"] == 5
    widths = {a.shape[-1] for a in load_file(str(out)).values() if a.ndim == 2}
    assert widths >= {16}  # the family's d_model: encoder or decoder rows of 16 numbers
    r = cli("sae", "eval", "--sae", out, "--weights", folder, "--data", data / "part-002.txt",
            "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["l0"] <= 2 and np.isfinite(doc["loss_clean"])
    assert doc["loss_recovered_vs_zero"] == pytest.approx(
        (doc["loss_zero_ablated"] - doc["loss_sae"])
        / (doc["loss_zero_ablated"] - doc["loss_clean"]))


def test_steer_builds_the_mean_difference_of_the_familys_resid_pre(cli, folder, tmp_path):
    out = tmp_path / "v.safetensors"
    r = cli("steer", "--pos", EXAMPLES / "happy.txt", "--neg", EXAMPLES / "sad.txt",
            "--layer", "1", "--weights", folder, "--out", out, "--json")
    assert r.code == 0, r.err
    doc = r.json()
    model = load_model(folder)
    pos = (EXAMPLES / "happy.txt").read_text().splitlines()
    neg = (EXAMPLES / "sad.txt").read_text().splitlines()

    def mean_resid_pre(text: str) -> np.ndarray:  # the recorded value, by hand
        ids = model.tokenizer.encode(text)
        _, values = record(model.params, model.config, ids, ["layers.1.resid_pre"])
        return values["layers.1.resid_pre"].astype(np.float64).mean(axis=0)

    want = np.mean([mean_resid_pre(pos[i - 1]) - mean_resid_pre(neg[i - 1])
                    for i in doc["train_pairs"]], axis=0)
    np.testing.assert_allclose(doc["vector"], want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(load_file(str(out))["direction"], want, rtol=1e-5, atol=1e-7)
    # steering a generation by it: scale 0 is the unsteered text
    plain = cli("generate", "Lily", "-n", "6", "-t", "0", "--no-stop", "--json",
                "--weights", folder)
    still = cli("generate", "Lily", "-n", "6", "-t", "0", "--no-stop", "--json",
                "--weights", folder, "--steer-vector", out, "--steer-scale", "0")
    assert plain.code == still.code == 0
    assert plain.ndjson()[-1]["ids"] == still.ndjson()[-1]["ids"]


def test_probe_reads_the_token_rows_a_rotary_models_first_resid_pre_is(cli, folder,
                                                                         tmp_path):
    """Rotary models add no position row: resid_pre of block 0 is the token's row of W_E, so
    two names are told apart exactly on held-out lines (and so is the control task, whose
    labels are a function of the token type too)."""
    labels = tmp_path / "names.txt"
    names = [("Lily", "girl"), ("Tom", "boy"), ("Sue", "girl"), ("Ben", "boy")]
    lines = [f"{a}[{x}] and {b}[{y}] ran" for a, x in names for b, y in names if a != b]
    labels.write_text("\n".join(lines * 3) + "\n")
    r = cli("probe", "--site", "layers.0.resid_pre", "--labels", labels, "--weights", folder,
            "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["classes"] == ["boy", "girl"]
    assert doc["accuracy"] == 1.0 and doc["train_accuracy"] == 1.0
    assert sum(doc["train_counts"]) + sum(doc["held_out_counts"]) == 2 * len(lines) * 3
    w, b = np.asarray(doc["data"]), np.asarray(doc["bias"])
    table = load_model(folder).params["embed.W_E"].astype(np.float64)
    tok = load_model(folder).tokenizer
    for name, label in names:  # the probe itself, applied by hand to each name's row
        row = table[tok.encode(name)[0]]
        assert doc["classes"][int(np.argmax(w @ row + b))] == label


def test_a_site_the_family_has_not_is_refused_in_one_line(cli, folder, data, tmp_path):
    config = json.loads((folder / "config.json").read_text())
    if config["model_type"] == "gpt_neox":  # a parallel block: no resid_mid
        site, why = "layers.1.resid_mid", "so there is no resid_mid"
    else:  # RMSNorm: no std
        site, why = "layers.1.ln1.std", "with no mean or std"
    r = cli("probe", "--site", site, "--labels", EXAMPLES / "quotes.txt", "--default", "out",
            "--weights", folder)
    assert_one_error_line(r, 2, site, "is not a value of this model", why)
    if config["model_type"] == "gpt_neox":
        r = cli("sae", "train", "--site", site, "--weights", folder, "--data", data,
                "--out", tmp_path / "x.safetensors", "--steps", "1")
        assert_one_error_line(r, 2, site, "is not a value of this model", why)
    r = cli("steer", "--pos", EXAMPLES / "happy.txt", "--neg", EXAMPLES / "sad.txt",
            "--layer", "2", "--weights", folder)
    assert_one_error_line(r, 2, "layer 2 is out of range", "0..1")
