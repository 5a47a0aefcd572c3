"""The fix-it hints of a file made from the weights (an SAE, the transcoders, a tuned lens, the
means) name the weights they are for, and never ask anyone to write into the installed
package: there they write into the working folder and say how to read the file back."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import assert_one_error_line

from tinygpt_cli.storage import madefor
from tinygpt_cli.storage.locations import SHIPPED

TEXT = "Lily wanted to play with her"


@pytest.mark.parametrize("lesson", ["llama", "neox"])
def test_the_lesson_models_refusals_name_their_weights(cli, lesson):
    w = SHIPPED / lesson
    named = f"--weights weights/{lesson}`"
    assert_one_error_line(cli("trace", TEXT, "sae.layers.2.resid_post", "--weights", w), 2,
                          "no SAE file at", f"`tinygpt sae train --site layers.2.resid_post "
                          f"{named}")
    assert_one_error_line(cli("graph", TEXT, "--weights", w), 2, "no transcoders at",
                          f"`tinygpt transcoder train {named}")
    assert_one_error_line(cli("lens", TEXT, "--kind", "tuned", "--weights", w), 2,
                          f"`tinygpt lens --fit {named}")


@pytest.mark.parametrize("lesson", ["llama", "neox"])
def test_the_lesson_models_ship_their_means_and_an_sae(cli, lesson):
    from safetensors import safe_open

    from tinygpt_cli.storage.files import sha256

    w = SHIPPED / lesson
    for made in (w / "means.safetensors", w / "sae" / "layers.1.resid_post.safetensors"):
        with safe_open(made, "np") as f:
            assert f.metadata()["weights_sha256"] == sha256(w / "model.safetensors"), made
    done = cli("ablate", TEXT, "--layer", "1", "--head", "0", "--mode", "mean", "--weights", w,
               "--json")
    assert done.code == 0, done.err
    latents = cli("trace", TEXT, "sae.layers.1.resid_post", "--weights", w, "--json")
    assert latents.code == 0, latents.err
    active = np.count_nonzero(latents.json()["data"], axis=1)
    assert ((active > 0) & (active <= 16)).all()  # at most k = 16 a token


@pytest.fixture
def installed(cli, tiny, tmp_path, monkeypatch):
    """A model folder as pip installs one: inside the package's own folder."""
    package = tmp_path / "site-packages" / "tinygpt_cli"
    weights = package / "_weights" / "lesson"
    shutil.copytree(tiny.folder, weights)
    monkeypatch.setattr(madefor, "PACKAGE", package)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    return weights


def written_places(line: str) -> list[Path]:
    """Where the commands a hint suggests would write: the values of --out, --lens and
    --transcoders, and the target of a cp -r."""
    places = [Path(p) for p in re.findall(r"--(?:out|lens|transcoders) (\S+?)`?(?:\s|$)",
                                          line)]
    return places + [Path(p) for p in re.findall(r"cp -r \S+ (\S+?) ", line)]


def test_installed_hints_name_the_weights_and_write_outside_the_package(cli, installed):
    w = str(installed)
    hints = [
        assert_one_error_line(cli("sae", "eval", "--weights", w), 2, "no SAE file at",
                              f"--weights {w} --out layers.1.resid_post.safetensors",
                              "then give `--sae layers.1.resid_post.safetensors`"),
        assert_one_error_line(cli("trace", TEXT, "sae.layers.0.resid_post", "--weights", w), 2,
                              "--site layers.0.resid_post", "--out layers.0.resid_post"),
        assert_one_error_line(cli("graph", TEXT, "--weights", w), 2, "no transcoders at",
                              f"`tinygpt transcoder train --weights {w} --transcoders "
                              "transcoders`", "`--transcoders transcoders`"),
        assert_one_error_line(cli("lens", TEXT, "--kind", "tuned", "--weights", w), 2,
                              f"`tinygpt lens --fit --weights {w} --lens tuned.safetensors`"),
        assert_one_error_line(cli("ablate", TEXT, "--layer", "1", "--head", "0", "--mode",
                                  "mean", "--weights", w), 2, "no mean statistics",
                              f"`cp -r {w} lesson && tinygpt means --weights lesson`",
                              "--data DIR"),
    ]
    for line in hints:
        places = written_places(line)
        assert places, line
        for place in places:
            assert not place.is_absolute() and not madefor.inside_package(place), line


def test_installed_weights_are_never_written_by_default(cli, installed):
    w = str(installed)
    before = sorted(p.name for p in installed.rglob("*"))
    for args, option in [(["sae", "train", "--site", "layers.1.resid_post"], "--out"),
                         (["transcoder", "train"], "--transcoders"),
                         (["lens", "--fit"], "--lens"),
                         (["means"], "--out")]:
        assert_one_error_line(cli(*args, "--weights", w), 2, "inside the installed package",
                              f"give {option}")
    assert sorted(p.name for p in installed.rglob("*")) == before
