"""The activation caches kept as shards with a manifest (tinygpt_cli.jobs.shards): an SAE's codes
over a corpus equal one pass's codes, a complete cache is read without computing, and a pass
cut short, or a damaged shard, costs only the missing shards on the next run."""

from __future__ import annotations

import contextlib
import json

import numpy as np
import pytest
from conftest import SENTENCES
from test_sae import SITE, random_sae

from tinygpt_cli.analysis import sae as S
from tinygpt_cli.jobs import cluster, shards
from tinygpt_cli.jobs import sae as SJ
from tinygpt_cli.jobs.corpus import data_windows
from tinygpt_cli.jobs.dictionaries import saes as SF
from tinygpt_cli.storage.madefor import made_for
from tinygpt_cli.transformer.folder import load_model

WINDOWS = 7  # shards of 2 windows: 4 shards, the last one short


@contextlib.contextmanager
def no_bar(total, description):
    yield lambda n=1: None


@pytest.fixture
def setup(tiny_folder, tmp_path, monkeypatch):
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cluster, "SHARD", 2)
    stories = tmp_path / "stories.txt"
    stories.write_text("\n<|endoftext|>\n".join(SENTENCES * 6) + "\n")
    model = load_model(tiny_folder.folder)
    sae = random_sae(model.config.n_embd, 24, 3, seed=4, dtype=np.float32)
    sae_path = tmp_path / "sae.safetensors"
    SF.save_sae(sae_path, sae, made_for(model.weights_file))
    return model, SF.load_sae(sae_path, model.config, model.weights_file), sae_path, [stories]


def codes(setup):
    model, sae, path, files = setup
    return SJ.data_codes(model, sae, path, files, WINDOWS, no_bar)


def folder_of(tmp_path):
    (found,) = (tmp_path / "cache" / "sae-codes").iterdir()
    return found


def test_the_codes_of_shards_are_the_codes_of_one_pass(setup, tmp_path):
    model, sae, _, files = setup
    got = codes(setup)
    x_in, _ = data_windows(files, model.tokenizer, model.config.n_positions, WINDOWS)
    x = S.site_values(model.params, model.config, x_in, SITE, batch=len(x_in))
    idx, val = S.sparse_codes(sae, x)
    np.testing.assert_array_equal(got["ids"], x_in)
    # the same latents with the same values at every token (order within a row may differ)
    for r in range(len(x)):
        want = dict(zip(idx[r].tolist(), val[r].tolist(), strict=True))
        have = dict(zip(got["idx"][r].tolist(), got["val"][r].tolist(), strict=True))
        assert have.keys() == want.keys()
        np.testing.assert_allclose([have[k] for k in want], list(want.values()), rtol=1e-5)
    doc = json.loads((folder_of(tmp_path) / "index.json").read_text())
    assert [s["windows"] for s in doc["shards"]] == [[0, 2], [2, 4], [4, 6], [6, 7]]
    for shard in doc["shards"]:
        a, b = shard["windows"]
        assert shard["rows"] == b - a and len(shard["sha256"]) == 64
        assert shard["arrays"]["idx"] == {"dtype": "int16",
                                          "shape": [(b - a) * model.config.n_positions, 3]}


def test_a_complete_cache_is_read_and_a_cut_pass_computes_only_the_rest(setup, tmp_path,
                                                                         monkeypatch):
    first = codes(setup)
    folder = folder_of(tmp_path)
    ran = []
    real = S.shard_codes

    def counted(task, shared):
        ran.append(task[0])
        return real(task, shared)

    monkeypatch.setattr(SJ, "shard_codes", counted)  # the task the job hands the engine
    again = codes(setup)
    assert ran == [] and all(np.array_equal(first[k], again[k]) for k in first)
    # a pass cut short: no manifest, one shard never written, another damaged in place
    (folder / "index.json").unlink()
    (folder / "shard-2-4.npz").unlink()
    damaged = folder / "shard-6-7.npz"
    damaged.write_bytes(damaged.read_bytes()[:-9] + b"123456789")
    third = codes(setup)
    assert sorted(ran) == [2, 6]
    assert all(np.array_equal(first[k], third[k]) for k in first)
    assert shards.read_complete(folder, folder.name, lambda e, n: True) is not None


def test_an_unwritable_cache_is_one_note_and_the_codes_still_come(setup, tmp_path, capsys,
                                                                   monkeypatch):
    first = codes(setup)
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder would be")
    monkeypatch.setenv("TINYGPT_CACHE", str(blocked))
    again = codes(setup)
    assert all(np.array_equal(first[k], again[k]) for k in first)
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "not kept for the next run" in notes[0]
