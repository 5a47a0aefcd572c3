"""transformer/float32_copy.py: a bfloat16 model's float32 copy, kept in the cache by the first
load and mapped by the next, equal bit for bit to the widened weights; stale, damaged or
unwanted copies are never read. The bound is lowered so a tiny model counts as large."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from cli_helpers import TOKENIZER
from test_families_bf16 import _bf16_file, _widened

from tinygpt_cli.jobs.train.loop import arch_config
from tinygpt_cli.transformer import float32_copy
from tinygpt_cli.transformer.families import llama, save_config
from tinygpt_cli.transformer.folder import load_model
from tinygpt_cli.transformer.model import forward, init_params


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A bfloat16 Llama folder, the cache in tmp_path/cache, any load a large one."""
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TINYGPT_FLOAT32_COPY", raising=False)
    monkeypatch.setattr(float32_copy, "COPY_FROM", 1)
    monkeypatch.setattr(float32_copy, "IN_BACKGROUND", False)  # written before load returns
    config = arch_config("llama", n_embd=16, n_layer=2, n_head=4, n_inner=24, vocab_size=4096,
                         n_positions=32)
    params = init_params(config, np.random.default_rng(5))
    root = tmp_path / "bf16"
    root.mkdir()
    bits = _bf16_file(root / "model.safetensors", llama.params_to_file(params, config))
    save_config(config, root / "config.json")
    shutil.copyfile(TOKENIZER, root / "tokenizer.json")
    return root, bits


def copies(root) -> list:
    return sorted((root.parent / "cache" / "float32").glob("*.safetensors"))


def test_the_first_load_keeps_a_copy_the_next_maps_it_bit_for_bit(folder, capsys):
    root, bits = folder
    first = load_model(root)
    said = capsys.readouterr().err
    assert said.startswith("note: keeping a float32 copy of this model") and said.count("\n") == 1
    assert len(copies(root)) == 1
    # the load widened by hand: the embedding's bits, shifted
    table = bits["model.embed_tokens.weight"]
    assert np.array_equal(first.params["embed.W_E"].view(np.uint32),
                          _widened(table).view(np.uint32))
    second = load_model(root)
    assert capsys.readouterr().err == ""
    assert set(second.params) == set(first.params)
    for name, a in first.params.items():
        b = second.params[name]
        assert not b.flags.writeable  # a view of the mapped copy, not made again
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), name
    ids = np.arange(7)
    assert np.array_equal(forward(first.params, first.config, ids),
                          forward(second.params, second.config, ids))


def test_a_changed_model_never_reads_the_old_copy(folder):
    root, _ = folder
    load_model(root)
    old = copies(root)
    # the same bytes written again (a new download): another time and inode, so another copy,
    # and the old one, whose file no longer is what it was made from, is removed
    data = (root / "model.safetensors").read_bytes()
    (root / "model.safetensors").unlink()
    (root / "model.safetensors").write_bytes(data)
    os.utime(root / "model.safetensors", ns=(1, 1))
    load_model(root)
    new = copies(root)
    assert len(new) == 1 and new != old


def test_a_damaged_copy_is_made_again(folder, capsys):
    root, bits = folder
    load_model(root)
    (path,) = copies(root)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # cut in half
    again = load_model(root)
    assert "keeping a float32 copy" in capsys.readouterr().err
    assert np.array_equal(again.params["embed.W_E"].view(np.uint32),
                          _widened(bits["model.embed_tokens.weight"]).view(np.uint32))
    assert load_model(root).params["embed.W_E"].flags.writeable is False


def test_another_models_copy_under_this_name_is_not_read(folder, tmp_path):
    root, _ = folder
    load_model(root)
    (path,) = copies(root)
    other = arch_config("llama", n_embd=8, n_layer=1, n_head=2, n_inner=8, vocab_size=4096,
                        n_positions=32)
    from tinygpt_cli.storage.safetensors import safetensors_bytes

    path.write_bytes(safetensors_bytes(init_params(other, np.random.default_rng(0))))
    model = load_model(root)
    assert model.params["embed.W_E"].shape == (4096, 16)


def test_turned_off_or_small_keeps_nothing(folder, monkeypatch, capsys):
    root, _ = folder
    monkeypatch.setenv("TINYGPT_FLOAT32_COPY", "0")
    load_model(root)
    assert copies(root) == [] and capsys.readouterr().err == ""
    monkeypatch.delenv("TINYGPT_FLOAT32_COPY")
    monkeypatch.setattr(float32_copy, "COPY_FROM", 256 << 20)  # the real bound: tiny is small
    load_model(root)
    assert copies(root) == []


def test_an_unwritable_cache_is_one_note(folder, monkeypatch, capsys, tmp_path):
    root, _ = folder
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("x")
    monkeypatch.setenv("TINYGPT_CACHE", str(blocked))
    model = load_model(root)
    err = capsys.readouterr().err
    assert err.startswith("note: ") and "float32 copy is not kept" in err
    assert err.count("\n") == 1 and model.params["embed.W_E"].shape == (4096, 16)


def test_a_float32_file_read_in_place_is_not_copied(monkeypatch, tmp_path):
    """The shipped GPT-2 file is the model: its tensors are views of it, nothing to keep."""
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(float32_copy, "COPY_FROM", 1)
    load_model()
    assert not (tmp_path / "cache" / "float32").exists()


def test_in_the_background_the_copy_is_whole_once_its_writer_ends(folder, monkeypatch, capsys):
    root, bits = folder
    monkeypatch.setattr(float32_copy, "IN_BACKGROUND", True)
    import threading

    model = load_model(root)  # returns while the copy is written
    for t in threading.enumerate():
        if t.name == "float32 copy":
            t.join()
    assert "keeping a float32 copy" in capsys.readouterr().err
    again = load_model(root)
    assert not again.params["embed.W_E"].flags.writeable
    assert np.array_equal(again.params["embed.W_E"], model.params["embed.W_E"])


def test_the_console_script_waits_for_the_copy_before_it_exits(folder, tmp_path):
    """A whole process: its last act, os._exit, comes after the copy is written."""
    import subprocess
    import sys

    root, _ = folder
    code = ("import sys; from tinygpt_cli.transformer import float32_copy as c; "
            "c.COPY_FROM = 1; from tinygpt_cli.cli.entry import main; sys.argv = ['tinygpt', "
            f"'probs', 'Lily', '--top', '1', '--weights', {str(root)!r}]; main()")
    env = {**os.environ, "TINYGPT_CACHE": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "keeping a float32 copy" in r.stderr
    (path,) = copies(root)
    assert float32_copy.read_copy(path, load_model(root).config) is not None
