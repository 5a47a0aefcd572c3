"""What a newcomer trips on (issue 35): files the tool wrote are never overwritten without
--force, and the refusal names the file and the option."""

from __future__ import annotations

import shutil

import pytest
from cli_helpers import assert_one_error_line
from conftest import SENTENCES

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
    out = tmp_path / "data"
    out.mkdir()
    for i in range(3):
        (out / f"part-00{i}.txt").write_text("\n<|endoftext|>\n".join(SENTENCES * 4) + "\n")
    return out


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
    from tinygpt_cli.analysis.sae import load_sae
    from tinygpt_cli.weights import load_model

    assert load_sae(written, load_model(folder).config).n_latents == 8  # the new SAE
