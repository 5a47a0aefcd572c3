"""The shipped model's training text ships with the package (weights/tinystories, xz): outside
the project's folder layout every command that reads text finds it, unpacked into the cache
and checked; $TINYGPT_DATA still chooses another text; a damaged file is one error line."""

from __future__ import annotations

import hashlib
import json
import lzma
import shutil
from pathlib import Path

import pytest
from cli_helpers import assert_one_error_line

from tinygpt_cli.jobs import corpus
from tinygpt_cli.storage.locations import SHIPPED

PACKED = SHIPPED / "tinystories"
MODELS = [SHIPPED, SHIPPED / "llama", SHIPPED / "neox"]


def recorded(weights: Path) -> list[dict]:
    record = json.loads((weights / "data.json").read_text())
    return record["train"] + record["validation"]


@pytest.mark.parametrize("weights", MODELS, ids=lambda p: p.name)
def test_the_shipped_text_is_byte_for_byte_what_each_shipped_model_records(weights):
    for entry in recorded(weights):
        text = lzma.decompress((PACKED / f"{entry['name']}.xz").read_bytes())
        assert len(text) == entry["bytes"], entry["name"]
        assert hashlib.sha256(text).hexdigest() == entry["sha256"], entry["name"]
    # the licence and the attribution travel with it; no loose copy of the text
    assert "CDLA-Sharing-1.0" in (PACKED / "LICENSE-NOTE.md").read_text()
    assert "Eldan" in (PACKED / "LICENSE-NOTE.md").read_text()
    assert "## Sources" in (PACKED / "SOURCES.md").read_text()
    assert not list(PACKED.glob("*.txt"))


@pytest.fixture
def installed(monkeypatch, tmp_path):
    """As after `pip install`: no project data beside any folder, no $TINYGPT_DATA, an
    empty cache, and an empty working directory."""
    monkeypatch.delenv("TINYGPT_DATA", raising=False)
    monkeypatch.setattr(corpus, "beside_checkout", lambda: None)
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    return tmp_path


def test_outside_the_checkout_the_shipped_text_is_found_and_passes_the_records_checks(
        installed):
    folder = corpus.find_data()
    assert folder.is_relative_to(installed / "cache")
    names = [e["name"] for e in recorded(SHIPPED)]
    assert sorted(p.name for p in folder.iterdir()) == sorted(names)
    # the record's own checks (sizes and sha256) accept it, for training and held-out text
    assert [p.name for p in corpus.training_text(SHIPPED, None).files] == names[:-1]
    assert [p.name for p in corpus.validation_text(SHIPPED, None)] == ["part-005.txt"]
    assert [p.name for p in corpus.held_out_files(None)] == ["part-005.txt"]
    # a cached copy altered since is unpacked again, not trusted
    (folder / "part-002.txt").write_text("not the story")
    assert corpus.find_data() == folder
    assert hashlib.sha256((folder / "part-002.txt").read_bytes()).hexdigest() == \
        recorded(SHIPPED)[2]["sha256"]


def test_commands_read_the_shipped_text_with_nothing_beside_them(cli, installed, tiny, tmp_path):
    heads = cli("heads", "--json")
    assert heads.code == 0, heads.err
    assert heads.json()["source"] == f"{corpus.find_data() / 'part-005.txt'} (first 8 stories)"
    assert corpus.find_data().is_relative_to(installed / "cache")
    # a model whose record names the shipped text, as the lesson models' do: means finds its
    # held-out part through the record, checked, with no --data
    moved = tmp_path / "site-packages" / "weights"
    shutil.copytree(tiny.folder, moved)
    shutil.copyfile(SHIPPED / "data.json", moved / "data.json")
    means = cli("means", "--weights", moved, "--out", tmp_path / "means.safetensors")
    assert means.code == 0, means.err
    assert "tokens of part-005.txt" in " ".join(means.out.split())


def test_tinygpt_data_still_chooses_another_text(cli, installed):
    other = installed / "other"
    other.mkdir()
    for i in range(6):
        (other / f"part-00{i}.txt").write_text(f"Story {i} of another text.\n<|endoftext|>\n")
    cli.monkeypatch.setenv("TINYGPT_DATA", str(other))
    heads = cli("heads", "--json")
    assert heads.code == 0, heads.err
    assert heads.json()["source"] == f"{other / 'part-005.txt'} (first 8 stories)"
    assert not (installed / "cache" / "text").exists()  # nothing unpacked


@pytest.mark.parametrize("damage", ["flipped", "truncated", "manifest"])
def test_a_damaged_shipped_file_is_one_error_line_exit_1(cli, installed, monkeypatch, damage):
    packed = installed / "packed"
    shutil.copytree(PACKED, packed)
    monkeypatch.setattr(corpus, "shipped_text_folder", lambda: packed)
    xz = packed / "part-003.txt.xz"
    data = bytearray(xz.read_bytes())
    if damage == "flipped":
        data[len(data) // 2] ^= 0x40
        xz.write_bytes(bytes(data))
    elif damage == "truncated":
        xz.write_bytes(bytes(data[: len(data) // 2]))
    else:  # the manifest records another text
        manifest = json.loads((packed / "text.json").read_text())
        manifest["files"][3]["sha256"] = "0" * 64
        (packed / "text.json").write_text(json.dumps(manifest))
    line = assert_one_error_line(cli("heads"), 1, "part-003.txt.xz is damaged", "reinstall",
                                 "TINYGPT_DATA")
    assert len(line) < 400


def test_an_unwritable_cache_says_where_to_unpack_instead(cli, installed, monkeypatch):
    blocked = installed / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("TINYGPT_CACHE", str(blocked))
    assert_one_error_line(cli("heads"), 1, "cannot write", "set TINYGPT_CACHE to a writable "
                          "folder, or TINYGPT_DATA")


def test_the_help_examples_of_commands_that_read_text_need_no_checkout():
    """After pip install there is no ../shared: the examples of the commands that find the
    shipped text by themselves do not name it (training a model of one's own still does)."""
    from tinygpt_cli.cli.app import _register, app

    _register()
    for c in app.registered_commands:
        if c.callback.__name__ not in ("train_cmd", "train_tokenizer_cmd", "model_card_cmd"):
            assert "../shared" not in (c.callback.__doc__ or ""), c.callback.__name__
