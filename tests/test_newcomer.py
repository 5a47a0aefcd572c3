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
    from tinygpt_cli.session import token_id

    assert token_id(tiny.model, 5) == 5
    assert token_id(tiny.model, "5") == 21

