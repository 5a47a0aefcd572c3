"""Commands on a GGUF file: each runs on an F32 GGUF of a tiny model and gives the numbers it
gives on the float folder the file was written from (examples/make_gguf.py, an independent
writer); the commands that need what a GGUF cannot carry (training snapshots) refuse it by
name."""

from __future__ import annotations

import pytest

pytest.importorskip("gguf")

from cli_helpers import TEXT, Runner, assert_one_error_line, clean_env, example  # noqa: E402


@pytest.fixture(scope="module")
def gguf_file(tiny):
    make_gguf = example("make_gguf")
    out = tiny.folder.parent / "gguf" / "tiny-f32.gguf"
    out.parent.mkdir()
    make_gguf.write(tiny.folder, out, "F32")
    return out


@pytest.fixture
def run(capsys, monkeypatch):
    clean_env(monkeypatch)
    return Runner(capsys, monkeypatch)


def numbers(doc) -> list[float]:
    """Every number in a JSON document, in order (strings, which name files, left out)."""
    if isinstance(doc, bool) or doc is None or isinstance(doc, str):
        return []
    if isinstance(doc, (int, float)):
        return [float(doc)]
    if isinstance(doc, dict):
        return [x for k in sorted(doc) for x in numbers(doc[k])]
    return [x for v in doc for x in numbers(v)]


def document(result):
    """One JSON document, or a list of the JSON lines (generate and score stream them)."""
    try:
        return result.json()
    except ValueError:
        return result.ndjson()


COMMANDS = [
    ["map", TEXT], ["trace", TEXT, "layers.1.weights"], ["review", TEXT],
    ["generate", "Lily wanted", "--temperature", "0", "--max-new-tokens", "4",
     "--seed", "1"],
    ["dla", TEXT], ["ablate", TEXT, "--all"], ["patch", TEXT, "Lily wanted to read with her"],
    ["lens", TEXT], ["score", TEXT], ["probs", TEXT], ["heads", "--stories", "1"],
    ["heads", "--file", "STORIES", "--stories", "2"],
]
STORIES = ("Lily wanted to play with her ball. Tom was happy and they ran to the park."
           "<|endoftext|>Once upon a time, a dog named Max ran to the park.<|endoftext|>")


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: a[0])
def test_command_on_gguf_is_the_folder(run, tiny, gguf_file, args):
    """Exit 0, and the same numbers (F32: equal up to float rounding of the two loaders)."""
    stories = gguf_file.parent / "stories.txt"
    stories.write_text(STORIES, encoding="utf-8")
    args = [str(stories) if a == "STORIES" else a for a in args]
    on_file = run(*args, "--json", "--weights", gguf_file)
    assert on_file.code == 0, on_file.err
    on_folder = run(*args, "--json", "--weights", tiny.folder)
    assert on_folder.code == 0, on_folder.err
    got, want = numbers(document(on_file)), numbers(document(on_folder))
    assert got and len(got) == len(want)
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_quant_of_f32_file_moves_nothing(run, tiny, gguf_file):
    """quant: an F32 file against its own float folder moves no residual, no pattern."""
    r = run("quant", TEXT, "--weights", gguf_file, "--against", tiny.folder, "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["ids"] == [608, 429, 267, 346, 336, 314]
    assert numbers(doc["data"]) and max(map(abs, numbers(doc["data"]))) < 1e-9
    assert max(map(abs, numbers(doc["pattern_tv"]))) < 1e-9


@pytest.mark.parametrize("args", [["why", TEXT], ["history", TEXT]], ids=lambda a: a[0])
def test_history_commands_refuse_a_gguf_by_name(run, gguf_file, args):
    """A GGUF carries no training snapshots: said so, not 'no history/ beside it'."""
    r = run(*args, "--weights", gguf_file)
    assert_one_error_line(r, 2, "GGUF", "snapshots")


@pytest.fixture(scope="module")
def gemma_pair(tmp_path_factory):
    """A random Gemma 3 of tinygpt's own (7 blocks, the sixth full, the rest local to 8
    keys; norms away from their 1) saved as a folder with the shipped tokenizer, and its F32
    GGUF: made without torch, so these tests run on a clean install with gguf."""
    import shutil

    import numpy as np

    from tinygpt_cli.jobs.train.loop import arch_config
    from tinygpt_cli.storage.locations import SHIPPED
    from tinygpt_cli.transformer.families import save_config
    from tinygpt_cli.transformer.folder import save_params
    from tinygpt_cli.transformer.model import init_params

    folder = tmp_path_factory.mktemp("gemma") / "folder"
    folder.mkdir()
    cfg = arch_config("gemma3", n_embd=32, n_layer=7, n_head=2, n_inner=64, n_positions=16,
                      bos_token_id=0, eos_token_id=0)
    params = init_params(cfg, np.random.default_rng(3))
    rng = np.random.default_rng(4)
    for name in params:
        if params[name].ndim == 1:
            params[name] = (params[name] + rng.normal(0, 0.3, params[name].shape)).astype(
                np.float32)
    save_params(params, folder / "model.safetensors", cfg)
    save_config(cfg, folder / "config.json")
    shutil.copy(SHIPPED / "tokenizer.json", folder / "tokenizer.json")
    make_gguf = example("make_gguf")
    out = folder.parent / "file" / "gemma3-f32.gguf"
    out.parent.mkdir()
    make_gguf.write(folder, out, "F32")
    return folder, out


GEMMA_COMMANDS = [
    ["map", TEXT], ["trace", TEXT, "layers.5.weights"],
    ["generate", "Lily wanted", "--temperature", "0", "--max-new-tokens", "4", "--seed", "1"],
    ["dla", TEXT], ["lens", TEXT], ["score", TEXT], ["probs", TEXT], ["ablate", TEXT, "--all"],
    ["patch", TEXT, "Lily wanted to read with her"], ["review", TEXT],
]


@pytest.mark.parametrize("args", GEMMA_COMMANDS, ids=lambda a: a[0])
def test_command_on_a_gemma3_gguf_is_its_folder(run, gemma_pair, args):
    """A Gemma 3 GGUF (norm scales stored with their 1, windows and bases as llama.cpp
    reads them) gives the numbers of the folder it was written from, or the same refusal."""
    folder, path = gemma_pair
    on_folder = run(*args, "--json", "--weights", folder)
    on_file = run(*args, "--json", "--weights", path)
    assert on_file.code == on_folder.code, (on_file.err, on_folder.err)
    if on_folder.code != 0:
        assert on_file.err.replace(str(path), "W") == on_folder.err.replace(str(folder), "W")
        return
    got, want = numbers(document(on_file)), numbers(document(on_folder))
    assert got and len(got) == len(want)
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
