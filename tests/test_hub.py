"""`--weights ORG/NAME[@REVISION]`: a hub id, read from a hub cache laid out exactly as
huggingface_hub lays it out (models--ORG--NAME/refs/REF, snapshots/COMMIT/FILE -> a symbolic
link to ../../blobs/HASH), always in offline mode: there is no network here."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import TEXT, assert_one_error_line, example, random_params, write_folder

from tinygpt_cli.errors import InputError
from tinygpt_cli.transformer.folder import load_model

pytest.importorskip("huggingface_hub")

COMMIT_A = "a" * 40  # what refs/main names
COMMIT_B = "b" * 40  # another commit, named by the tag v2


def cache_model(cache: Path, repo: str, commit: str, source: Path, refs=("main",),
                skip: tuple[str, ...] = ()) -> Path:
    """The files of `source` as huggingface_hub caches a snapshot of `repo` at `commit`:
    each file a blob named by its hash, the snapshot's entry a relative symbolic link to it,
    and each ref a file holding the commit. Returns the snapshot folder."""
    storage = cache / ("models--" + repo.replace("/", "--"))
    snap = storage / "snapshots" / commit
    (storage / "blobs").mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True)
    for file in sorted(source.iterdir()):
        if file.name in skip:
            continue
        data = file.read_bytes()
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / file.name).symlink_to(Path("..", "..", "blobs", blob.name))
    (storage / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (storage / "refs" / ref).write_text(commit)  # no newline, as the library writes it
    return snap


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """HF_HOME with a cache holding org/tiny at two commits (main: A, tag v2: B, other
    weights), offline; the working folder an empty one. Returns (cache, snapshot A, B, the
    source folders A and B)."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("TINYGPT_WEIGHTS", raising=False)
    a = write_folder(tmp_path / "src-a", random_params(_tiny(), seed=11), _tiny())
    b = write_folder(tmp_path / "src-b", random_params(_tiny(), seed=12), _tiny())
    cache = tmp_path / "hf" / "hub"
    snap_a = cache_model(cache, "org/tiny", COMMIT_A, a)
    snap_b = cache_model(cache, "org/tiny", COMMIT_B, b, refs=("v2",))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return cache, snap_a, snap_b, a, b


def _tiny():
    from cli_helpers import TINY

    return TINY


def test_a_hub_id_is_the_cached_snapshot_of_main(hub):
    cache, snap_a, _, a, _ = hub
    model = load_model("org/tiny")
    assert model.folder == snap_a
    assert model.weights_file == snap_a / "model.safetensors"
    assert model.weights_file.resolve().parent == cache / "models--org--tiny" / "blobs"
    direct = load_model(a)
    for name, value in direct.params.items():
        np.testing.assert_array_equal(model.params[name], value)


def test_a_revision_picks_its_snapshot(hub):
    _, snap_a, snap_b, _, b = hub
    assert load_model("org/tiny@v2").folder == snap_b  # a tag, through refs/v2
    assert load_model(f"org/tiny@{COMMIT_B}").folder == snap_b  # a commit, no ref needed
    assert load_model("org/tiny@main").folder == snap_a
    np.testing.assert_array_equal(load_model("org/tiny@v2").params["embed.W_E"],
                                  load_model(b).params["embed.W_E"])


def test_the_cli_reads_the_snapshot_through_weights_and_the_environment(hub, cli, monkeypatch):
    _, _, _, a, b = hub
    monkeypatch.delenv("TINYGPT_WEIGHTS", raising=False)
    for given, source in (("org/tiny", a), ("org/tiny@v2", b)):
        got = cli("probs", TEXT, "--weights", given, "--json")
        assert got.code == 0, got.err
        assert got.json() == cli("probs", TEXT, "--weights", source, "--json").json()
    monkeypatch.setenv("TINYGPT_WEIGHTS", "org/tiny@v2")
    assert cli("probs", TEXT, "--json").json() == \
        cli("probs", TEXT, "--weights", b, "--json").json()
    assert cli("--weights", "org/tiny", "probs", TEXT, "--json").json() == \
        cli("probs", TEXT, "--weights", a, "--json").json()


def test_a_local_folder_of_that_name_wins(hub, cli, monkeypatch):
    _, _, _, _, b = hub
    monkeypatch.delenv("TINYGPT_WEIGHTS", raising=False)
    local = write_folder(Path("org") / "tiny", random_params(_tiny(), seed=13), _tiny())
    model = load_model("org/tiny")
    assert model.folder == local
    assert not np.array_equal(model.params["embed.W_E"], load_model(b).params["embed.W_E"])


def test_offline_and_not_cached_is_one_error_line(hub, cli, monkeypatch):
    cache = hub[0]
    monkeypatch.delenv("TINYGPT_WEIGHTS", raising=False)
    got = cli("probs", TEXT, "--weights", "org/absent")
    assert_one_error_line(got, 2, "org/absent is not a folder here nor in the hub cache",
                          str(cache), "HF_HUB_OFFLINE is set",
                          "fetch it once with the hub reachable (HF_HUB_OFFLINE unset)")
    got = cli("probs", TEXT, "--weights", "org/tiny@v9")  # no such ref cached
    assert_one_error_line(got, 2, "org/tiny@v9 is not a folder here nor in the hub cache")


def test_a_snapshot_missing_a_file_names_it(hub, cli, monkeypatch):
    cache, _, _, a, _ = hub
    monkeypatch.delenv("TINYGPT_WEIGHTS", raising=False)
    snap = cache_model(cache, "org/partial", COMMIT_A, a, skip=("tokenizer.json",))
    got = cli("encode", TEXT, "--weights", "org/partial")
    assert_one_error_line(got, 2, f"the hub cache's snapshot of org/partial ({snap}) has no "
                          "tokenizer.json and HF_HUB_OFFLINE is set")


def test_hf_hub_cache_overrides_hf_home(hub, monkeypatch, tmp_path):
    cache_model(tmp_path / "elsewhere", "org/tiny", COMMIT_B, hub[4])
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert load_model("org/tiny").folder == tmp_path / "elsewhere" / "models--org--tiny" / \
        "snapshots" / COMMIT_B


def test_without_the_hub_extra_the_error_says_what_to_install(hub, cli, monkeypatch):
    monkeypatch.delenv("TINYGPT_WEIGHTS", raising=False)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails
    got = cli("probs", TEXT, "--weights", "org/tiny")
    assert_one_error_line(got, 2, "weights folder org/tiny does not exist; to fetch org/tiny "
                          "from the Hugging Face hub, install the hub extra: "
                          'pip install "tinygpt-cli[hub]"')


@pytest.mark.parametrize("name", ["nowhere", "a/b/c", "/abs/path", "org/..", "org/x--y",
                                  "-org/x", "org/x@"])
def test_names_that_are_not_hub_ids_stay_folders(hub, cli, monkeypatch, name):
    monkeypatch.delenv("TINYGPT_WEIGHTS", raising=False)
    got = cli("probs", TEXT, "--weights", name)
    assert_one_error_line(got, 2, f"weights folder {name} does not exist")
    assert "hub" not in got.err


def test_the_readmes_weights_names_reach_the_shipped_folders_from_anywhere(hub, tmp_path):
    # the README runs `--weights weights/llama` from the repository's root; from any other
    # folder that name is the copy shipped with the package, not a hub id "weights/llama"
    from tinygpt_cli.storage.locations import SHIPPED

    assert load_model("weights/llama").folder == SHIPPED / "llama"
    assert load_model("weights/llama/").config.model_type == "llama"
    with pytest.raises(InputError, match="does not exist"):  # spelt as a path: a path
        load_model("./weights/llama")
    # a folder of that name here still wins
    local = write_folder(Path("weights") / "llama", random_params(_tiny(), seed=13), _tiny())
    assert load_model("weights/llama").folder == local
    # a name the package does not ship is looked up as a hub id, as before (offline: refused)
    with pytest.raises(InputError, match="weights/nothing is not a folder here nor in the hub"):
        load_model("weights/nothing")
    with pytest.raises(InputError):  # transcoders ship there, but are no model
        load_model("weights/transcoders")


# ------------------------------------------------------------------ one GGUF file of a repo


@pytest.fixture
def hub_gguf(hub, tmp_path):
    """org/quants cached at commit A (main) with two GGUF files (one in a subfolder) and no
    config.json or tokenizer.json, as GGUF repositories are; the F32 file is the shipped
    Llama's."""
    pytest.importorskip("gguf")

    from tinygpt_cli.storage.locations import SHIPPED

    make_gguf = example("make_gguf")
    src = tmp_path / "src-gguf"
    (src / "q8").mkdir(parents=True)
    make_gguf.write(SHIPPED / "llama", src / "model-f32.gguf", "F32")
    make_gguf.write(SHIPPED / "llama", src / "q8" / "model-q8_0.gguf", "Q8_0")
    cache = hub[0]
    storage = cache / "models--org--quants"
    snap = storage / "snapshots" / COMMIT_A
    (storage / "blobs").mkdir(parents=True)
    for file in ("model-f32.gguf", "q8/model-q8_0.gguf"):
        data = (src / file).read_bytes()
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / file).parent.mkdir(parents=True, exist_ok=True)
        depth = file.count("/")
        (snap / file).symlink_to(Path(*[".."] * (depth + 2), "blobs", blob.name))
    (storage / "refs").mkdir()
    (storage / "refs" / "main").write_text(COMMIT_A)
    return snap, src, SHIPPED / "llama"


def test_a_hub_gguf_file_is_the_cached_file(hub_gguf, cli, monkeypatch):
    snap, src, folder = hub_gguf
    monkeypatch.delenv("TINYGPT_WEIGHTS", raising=False)
    model = load_model("org/quants/model-f32.gguf")
    assert model.file == snap / "model-f32.gguf"
    assert load_model(f"org/quants@{COMMIT_A}/model-f32.gguf").file == model.file
    assert load_model("org/quants@main/q8/model-q8_0.gguf").file == \
        snap / "q8" / "model-q8_0.gguf"
    direct = load_model(folder)
    for name, value in direct.params.items():  # F32: the folder's numbers exactly
        np.testing.assert_array_equal(model.params[name], value)
    got = cli("probs", TEXT, "--weights", "org/quants/q8/model-q8_0.gguf", "--json")
    assert got.code == 0, got.err
    assert got.json() == cli("probs", TEXT, "--weights", src / "q8" / "model-q8_0.gguf",
                             "--json").json()


def test_a_hub_gguf_file_not_cached_is_one_error_line(hub_gguf, cli, monkeypatch):
    cache = hub_gguf[0].parents[2]
    monkeypatch.delenv("TINYGPT_WEIGHTS", raising=False)
    got = cli("probs", TEXT, "--weights", "org/quants/model-q4_0.gguf")
    assert_one_error_line(got, 2, "org/quants/model-q4_0.gguf is not a file here nor in the "
                          f"hub cache ({cache}), and the hub was not reached "
                          "(HF_HUB_OFFLINE is set)")
    got = cli("probs", TEXT, "--weights", "org/quants@v9/model-f32.gguf")
    assert_one_error_line(got, 2, "org/quants@v9/model-f32.gguf is not a file here nor in "
                          "the hub cache")
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    got = cli("probs", TEXT, "--weights", "org/quants/model-f32.gguf")
    assert_one_error_line(got, 2, "org/quants/model-f32.gguf is not a file here; to fetch "
                          "model-f32.gguf of org/quants from the Hugging Face hub, install "
                          'the hub extra: pip install "tinygpt-cli[hub]"')


def test_a_local_gguf_of_that_name_wins(hub_gguf, monkeypatch):
    _, src, _ = hub_gguf
    local = Path("org") / "quants" / "model-f32.gguf"
    local.parent.mkdir(parents=True)
    local.write_bytes((src / "q8" / "model-q8_0.gguf").read_bytes())
    assert load_model(str(local)).file == local
    assert load_model(str(local)).about["types"].get("Q8_0")


@pytest.mark.parametrize("name,parsed", [
    ("org/x/m.gguf", ("org/x", None, "m.gguf")),
    ("org/x@v2/a/b/m.Q4_K_M.GGUF", ("org/x", "v2", "a/b/m.Q4_K_M.GGUF")),
    ("org/x/m.bin", None), ("org/x/../m.gguf", None), ("org/x/.hidden/m.gguf", None),
    ("org/x--y/m.gguf", None), ("org/x@/m.gguf", None), ("/abs/org/x/m.gguf", None)])
def test_what_names_a_hub_gguf_file(name, parsed):
    from tinygpt_cli.storage.hub import hub_file

    assert hub_file(name) == parsed


@pytest.mark.parametrize("error,code,needle", [
    ("entry", 2, "the hub model org/quants has no file model-q2.gguf"),
    ("oserror", 1, "cannot fetch org/quants/model-q2.gguf into the hub cache"),
    ("invalid", 2, "org/quants/model-q2.gguf is not a file here, and not a hub model's file"),
])
def test_a_hub_gguf_file_the_hub_refuses_is_one_error_line(hub, cli, monkeypatch, error, code,
                                                            needle):
    """What hf_hub_download raises when the hub answers (a file the repository lacks, a disk
    that fails, an id it rejects), said in one line: the network is not reached here."""
    import huggingface_hub
    from huggingface_hub import utils as hub_utils

    def fail(*args, **kwargs):
        if error == "entry":
            raise hub_utils.EntryNotFoundError("404: no such file")
        if error == "oserror":
            raise OSError(28, "No space left on device")
        raise ValueError("Repo id must use alphanumeric chars")

    monkeypatch.delenv("TINYGPT_WEIGHTS", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fail)
    got = cli("probs", TEXT, "--weights", "org/quants/model-q2.gguf")
    assert_one_error_line(got, code, needle)
