"""Start-up: the weights are mapped, not copied, and a command imports only what it needs
(checked by the modules a fresh interpreter loaded, never by timing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tinygpt_cli.storage.locations import SHIPPED
from tinygpt_cli.storage.safetensors import map_safetensors


def test_mapped_tensors_equal_the_library_and_share_the_file(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {"a": rng.normal(size=(3, 5)).astype(np.float32),
               "b": rng.normal(size=(7,)).astype(np.float64),
               "c": np.arange(6, dtype=np.int64).reshape(2, 3),
               "d": rng.normal(size=(2, 2)).astype(np.float16),
               "empty": np.zeros((0, 4), np.float32)}
    path = tmp_path / "t.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    before = path.read_bytes()
    got = map_safetensors(path)
    want = load_file(str(path))
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape
        np.testing.assert_array_equal(got[name], want[name])
    assert not got["a"].flags.owndata  # a view of the mapping, not a copy
    with pytest.raises(ValueError, match="read-only"):
        got["a"][0, 0] = 123.0
    assert path.read_bytes() == before


def test_loaded_params_are_read_only_views_and_the_head_copy_is_the_same_numbers(tiny_folder):
    from tinygpt_cli.transformer import ops
    from tinygpt_cli.transformer.folder import load_model

    params = load_model(tiny_folder.folder).params
    wte = params["embed.W_E"]
    assert not wte.flags.writeable and not wte.flags.owndata
    head = ops.tied_head(wte)
    assert head.flags.c_contiguous and head is ops.tied_head(wte)  # made once
    np.testing.assert_array_equal(head, wte.T)
    writable = wte.copy()
    assert ops.tied_head(writable).base is writable  # a training table: the live view
    u = np.random.default_rng(1).normal(size=(3, wte.shape[1])).astype(np.float32)
    np.testing.assert_allclose(ops.unembed(u, wte), u @ writable.T, rtol=1e-5, atol=1e-5)


def test_a_large_read_only_table_is_multiplied_as_the_view_never_copied():
    """A copy of Gemma-3-270M's 671 MB table took 2.6 s; BLAS multiplies by the view as fast."""
    from tinygpt_cli.transformer import ops

    rows = ops.HEAD_BY_ROWS_FROM // (4 * 64)
    table = np.zeros((rows, 64), np.float32)  # calloc'd: never written, nothing made
    table[::997, :] = 1.0
    table.flags.writeable = False  # as a mapped float32 copy's is
    assert ops.tied_head(table).base is table
    u = np.ones((2, 64), np.float32)
    z = ops.unembed(u, table)
    assert z.shape == (2, rows) and z[0, 997] == 64.0 and z[0, 1] == 0.0


def test_a_large_heads_logits_one_position_or_many_are_the_products_in_float64(monkeypatch):
    """One position of a table past VIEW_HEAD_FROM (a dot product per row), and several
    written into pages made for them (model.unembed past its size), against the products
    computed in float64."""
    from tinygpt_cli.transformer import model, ops
    from tinygpt_cli.transformer.config import Config
    from tinygpt_cli.transformer.hooks import Record

    rng = np.random.default_rng(3)
    table = rng.normal(size=(ops.VIEW_HEAD_FROM // 256 + 7, 256)).astype(np.float32)
    u = rng.normal(size=(128, 256)).astype(np.float32)  # 4 MB of logits: pages of their own
    want = u.astype(np.float64) @ table.astype(np.float64).T
    monkeypatch.setattr(ops, "HEAD_BY_ROWS_FROM", 1 << 20)  # this 8 MB table counts as large
    one = ops.unembed(u[2:3], table)
    assert one.shape == (1, table.shape[0]) and one.dtype == np.float32
    np.testing.assert_allclose(one[0], want[2], rtol=0, atol=1e-4)
    monkeypatch.setattr(model, "LOGITS_ON_SMALL_PAGES", 1 << 20)  # these count as large
    rec = Record()
    many = model.unembed({"embed.W_E": table}, Config(tied=True), u, rec)
    assert many is rec.values["logits"] and many.shape == want.shape and many.flags.writeable
    assert many.base is not None  # written into the pages made for it, not NumPy's own
    np.testing.assert_allclose(many, want, rtol=0, atol=1e-4)


@pytest.mark.parametrize("data", [b"", b"\x05\x00\x00\x00\x00\x00\x00\x00{}", b"\xff" * 40,
                                  b"\x02\x00\x00\x00\x00\x00\x00\x00[]"])
def test_malformed_files_are_left_to_the_library(tmp_path, data):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(data)
    assert map_safetensors(path) is None


def test_offsets_past_the_end_are_left_to_the_library(tmp_path):
    header = json.dumps({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    path = tmp_path / "short.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\x00" * 8)
    assert map_safetensors(path) is None


def test_bfloat16_is_mapped_and_widened_exactly(tmp_path):
    header = json.dumps({"a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}).encode()
    path = tmp_path / "bf16.safetensors"
    # 1.0 and -2.5 as bfloat16: the top 16 bits of their float32 forms
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\x80\x3f\x20\xc0")
    a = map_safetensors(path)["a"]
    assert a.dtype == np.float32 and a.tolist() == [1.0, -2.5]


def imported_by(args: list[str]) -> set[str]:
    """The top-level packages and tinygpt modules a fresh `tinygpt ARGS` imported."""
    code = ("import sys\nfrom tinygpt_cli.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "sys.stderr.write('\\nMODULES ' + ' '.join(sorted(sys.modules)))\n")
    env = {k: v for k, v in os.environ.items() if k != "TINYGPT_WEIGHTS"}
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                       env=env, timeout=120)
    names = r.stderr.rsplit("MODULES ", 1)[1].split()
    return {n for n in names if n.startswith("tinygpt_cli.")} | {n.split(".")[0] for n in names}


def test_help_imports_neither_numpy_nor_rich_nor_the_model():
    mods = imported_by(["--help"])
    assert "typer" in mods
    for heavy in ("numpy", "rich", "tokenizers", "safetensors", "tinygpt_cli.transformer.model"):
        assert heavy not in mods


@pytest.mark.skipif(not (SHIPPED / "model.safetensors").is_file(), reason="no shipped weights")
def test_inspection_commands_leave_training_and_analysis_out():
    encode = imported_by(["encode", "Lily wanted"])
    assert "tokenizers" in encode and "tinygpt_cli.transformer.model" not in encode
    attn = imported_by(["attn", "Lily wanted to play with her", "--layer", "0", "--head", "0",
                        "--weights", str(SHIPPED)])
    assert "tinygpt_cli.transformer.model" in attn
    assert "pydantic" not in attn  # typer checks options with it; plain values need not wait
    for mods in (encode, attn):
        assert not any(m.startswith(("tinygpt_cli.jobs.train", "tinygpt_cli.analysis"))
                       for m in mods)
        assert "torch" not in mods and "transformers" not in mods


def test_every_command_is_listed_with_the_module_that_defines_it():
    from tinygpt_cli.cli.app import COMMANDS, _command_name, _register, app

    _register()
    defined = {_command_name(c): c.callback.__module__.rsplit(".", 1)[1]
               for c in app.registered_commands}
    for group in app.registered_groups:  # `sae train|eval|feature`: a group of commands
        callback = group.typer_instance.registered_callback.callback
        defined[group.name] = callback.__module__.rsplit(".", 1)[1]
    assert defined == COMMANDS


def test_every_command_says_what_it_does_in_one_line():
    # --help prints a docstring's first line as a paragraph of its own, and the list of
    # commands shows only that line: a sentence running on into the next line is cut in two.
    from tinygpt_cli.cli.app import _register, app

    _register()
    for c in app.registered_commands:
        lines = c.callback.__doc__.strip().splitlines()
        assert len(lines) == 1 or not lines[1].strip(), c.callback.__name__


@pytest.mark.skipif(not (SHIPPED / "model.safetensors").is_file(), reason="no shipped weights")
def test_a_command_imports_only_its_own_module_of_commands():
    attn = imported_by(["attn", "Lily wanted to play with her", "--layer", "0", "--head", "0"])
    groups = {m.rsplit(".", 1)[1] for m in attn if m.startswith("tinygpt_cli.cli.")}
    assert groups & {"cards", "inspect", "page", "explain", "texts", "history", "train"} == \
        {"cards"}
    # the listing of every command is the table's (cli.app.SUMMARIES); an unknown command,
    # whose error suggests a near name, still brings them all
    commands = {"tinygpt_cli.cli." + m for m in ("cards", "inspect", "train", "explain")}
    assert not commands & imported_by(["--help"])
    assert commands <= imported_by(["atn"])
    # the group's options before the command are passed over: still one module
    for lead in (["--weights", str(SHIPPED)], ["--threads", "1", "--debug"],
                 [f"--weights={SHIPPED}"]):
        probs = imported_by([*lead, "probs", "Lily wanted"])
        assert {m for m in probs if m.startswith("tinygpt_cli.cli.")} & commands == \
            {"tinygpt_cli.cli.cards"}, lead


@pytest.mark.skipif(not (SHIPPED / "model.safetensors").is_file(), reason="no shipped weights")
def test_encode_needs_no_numpy_and_no_weights_file():
    encode = imported_by(["encode", "Lily wanted"])
    assert "numpy" not in encode and "safetensors" not in encode
    assert "numpy" in imported_by(["encode", "Lily wanted", "--json"])


@pytest.mark.parametrize("argv, code", [(["decode", "1", "2"], 0), (["nosuch"], 2)])
def test_the_console_script_ends_without_the_teardown_but_as_shutdown_would(argv, code):
    # the console script (entry.main with no arguments: sys.argv) ends with os._exit once
    # the command is done (the interpreter's teardown costs 20-25 ms): the exit code, the
    # atexit functions, the output printed last and a thread still running (waited for)
    # must be as the usual shutdown leaves them
    script = ("import atexit, sys, threading, time\n"
              "from tinygpt_cli.cli.entry import main\n"
              "atexit.register(lambda: print('atexit ran', flush=False))\n"
              "late = lambda: (time.sleep(0.3), print('thread done'))\n"
              "mode, sys.argv = sys.argv[1], ['tinygpt', *sys.argv[2:]]\n"
              "if mode == 'thread':\n"
              "    threading.Thread(target=late).start()\n"
              "main()\n")
    env = {k: v for k, v in os.environ.items() if k != "TINYGPT_WEIGHTS"}
    for mode in ("plain", "thread"):
        r = subprocess.run([sys.executable, "-c", script, mode, *argv], capture_output=True,
                           text=True, env=env, timeout=120)
        assert r.returncode == code, r
        assert r.stdout.endswith("atexit ran\n"), r
        assert ("thread done" in r.stdout) == (mode == "thread"), r


def test_main_called_with_arguments_gives_the_caller_its_exit():
    # a program calling entry.main([...]) gets SystemExit back, not the end of its process
    import signal

    from tinygpt_cli.cli.entry import main

    handler = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit) as e:
            main(["decode", "1", "2"])
    finally:
        signal.signal(signal.SIGINT, handler)  # main leaves Ctrl-C ignored as it ends
    assert e.value.code in (0, None)
