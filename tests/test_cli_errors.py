"""Bad input and broken weights: one `error: ...` line on stderr, exit 2 for usage and input,
exit 1 for weights that cannot be used, never a traceback unless --debug. The last tests run
`python -m tinygpt_cli` as a child process with pipes, as a shell would."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from cli_helpers import (
    TEXT,
    TEXT_IDS,
    TINY,
    assert_one_error_line,
    clean_env,
    random_params,
    run_module,
    write_folder,
)

from tinygpt_cli.cli import main
from tinygpt_cli.cli.common import InputError
from tinygpt_cli.jobs.session import Session
from tinygpt_cli.transformer.families.gpt2 import PREFIX


def _text_commands() -> list[str]:
    """Every command of the real table (cli.app, all registered) whose TEXT argument is a
    text: the argument named `text` (a command that joins the table is checked with them)."""
    import inspect

    from tinygpt_cli.cli.app import _register, app
    from tinygpt_cli.cli.typer_tricks import command_name

    _register()
    return [command_name(c) for c in app.registered_commands
            if "text" in inspect.signature(c.callback).parameters]


# trace: TEXT PATH; quant: a required --against model (its text errors: tests/test_quant.py)
TEXT_COMMANDS = [c for c in _text_commands() if c not in ("trace", "quant")]
WINDOWED = {"score", "heads"}  # a text of any length, read in windows of the context
OWN_TEXTS = {"heads"}  # with no text: the project's data


# ------------------------------------------------------------------ bad input: exit 2


@pytest.mark.parametrize("command", TEXT_COMMANDS)
def test_empty_text(cli, command):
    assert_one_error_line(cli(command, ""), 2, "empty")
    assert_one_error_line(cli(command, "-", stdin="\n"), 2, "empty")


# (encode reads any length; generate continues a long prompt from its end, test_newcomer)
@pytest.mark.parametrize("command", [c for c in TEXT_COMMANDS
                                     if c not in ("encode", "generate") and c not in WINDOWED])
def test_more_than_128_tokens_says_how_many(cli, tiny, command):
    text = " a" * 150
    n = len(tiny.model.tokenizer.encode(text))
    assert n == 150
    assert_one_error_line(cli(command, text), 2, "150 tokens", "128")


def test_exactly_128_tokens_is_fine(cli):
    r = cli("logits", " a" * 128, "--json")
    assert r.code == 0 and len(r.json()["ids"]) == 128
    assert_one_error_line(cli("logits", " a" * 129), 2, "129 tokens", "at most 128")


@pytest.mark.parametrize("command", [*(c for c in TEXT_COMMANDS if c not in OWN_TEXTS),
                                     "trace"])
def test_missing_text_with_a_terminal_on_stdin(cli, command):
    argv = [command, "--list"] if command == "trace" else [command]
    assert_one_error_line(cli(*argv), 2, "no text", "stdin")


def test_missing_ids_with_a_terminal_on_stdin(cli):
    assert_one_error_line(cli("decode"), 2, "no token ids")


@pytest.mark.parametrize("args, needles", [
    (["norm", "--layer", "2"], ["layer 2", "0..1"]),
    (["norm", "--layer", "-3"], ["layer -3", "0..1"]),
    (["attn", "--layer", "5"], ["layer 5", "0..1"]),
    (["attn", "--head", "2"], ["head 2", "0..1"]),
    (["attn", "--all-heads", "--layer", "9"], ["layer 9", "0..1"]),
    (["mlp", "--layer", "7"], ["layer 7", "0..1"]),
    (["logits", "--position", "6"], ["position 6", "0..5"]),
    (["probs", "--position", "-7"], ["position -7", "0..5"]),
    (["blocks", "--position", "10"], ["position 10", "0..5"]),
    (["trace", TEXT, "layers.2.mlp_out"], ["layer 2", "0..1"]),
    (["trace", TEXT, "layers.0.heads.3.weights"], ["head 3", "0..1"]),
    (["trace", TEXT, "logits[6]"], ["index 6", "0..5"]),
])
def test_index_out_of_range_gives_the_valid_range(cli, args, needles):
    argv = args if args[0] == "trace" else [args[0], TEXT, *args[1:]]
    assert_one_error_line(cli(*argv), 2, *needles)


@pytest.mark.parametrize("path, suggestion", [
    ("layers.0.heads.0.weigts", "layers.0.heads.0.weights"),
    ("embedings", "embeddings"),
    ("ln_final.outt", "ln_final.out"),
    ("layers.1.mlp_outt", "layers.1.mlp_out"),
])
def test_unknown_trace_path_suggests_the_nearest(cli, path, suggestion):
    line = assert_one_error_line(cli("trace", TEXT, path), 2, repr(path), "did you mean")
    assert suggestion in line.split("did you mean", 1)[1]


def test_trace_needs_a_path_or_list(cli):
    assert_one_error_line(cli("trace", TEXT), 2, "PATH", "--list")


@pytest.mark.parametrize("args, needles", [
    (["decode", "99999"], ["99999", "0 to 4095"]),
    (["decode", "608", "4096"], ["4096", "0 to 4095"]),
    (["decode", "608,abc"], ["'abc'", "not a token id"]),
    (["decode", "1.5"], ["'1.5'", "whole numbers"]),
])
def test_decode_rejects_unknown_ids(cli, args, needles):
    assert_one_error_line(cli(*args), 2, *needles)


def test_decode_rejects_a_negative_id_from_stdin(cli):
    assert_one_error_line(cli("decode", stdin="608 -1"), 2, "-1", "0 to 4095")
    assert_one_error_line(cli("decode", stdin=" , \n"), 2, "no token ids")


@pytest.mark.parametrize("args, needles", [
    (["embed", TEXT, "--bogus"], ["No such option", "--bogus", "tinygpt embed --help"]),
    (["embed", TEXT, "--layer", "0"], ["No such option", "--layer"]),
    (["logits", TEXT, "--top", "0"], ["--top"]),
    (["logits", TEXT, "--top", "many"], ["--top"]),
    (["logits", TEXT, "-n"], ["-n", "requires an argument"]),
    (["probs", TEXT, "--temperature", "-1"], ["--temperature"]),
    (["generate", TEXT, "--top-p", "1.5"], ["--top-p"]),
    (["generate", TEXT, "--top-p", "0"], ["--top-p", "(0, 1]"]),
    (["sample", TEXT, "--top-k", "-1"], ["--top-k"]),
    (["generate", TEXT, "--max-new-tokens", "0"], ["--max-new-tokens"]),
    (["norm", TEXT, "--which", "ln3"], ["--which", "ln1 or ln2", "'ln3'"]),
    (["attn", TEXT, "extra"], ["unexpected extra argument"]),
    (["bogus"], ["No such command", "'bogus'"]),
])
def test_bad_options_are_one_error_line(cli, args, needles):
    assert_one_error_line(cli(*args), 2, *needles)


def test_debug_shows_the_exception(cli, monkeypatch):
    clean_env(monkeypatch)
    with pytest.raises(InputError):
        main(["embed", "", "--debug"])
    monkeypatch.setenv("TINYGPT_DEBUG", "1")
    with pytest.raises(InputError):
        main(["embed", ""])


def test_an_unexpected_fault_is_one_line_with_exit_1(cli, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("something broke\ninside")

    monkeypatch.setattr(Session, "trace", boom)
    line = assert_one_error_line(cli("embed", TEXT), 1, "RuntimeError: something broke inside")
    assert "--debug" in line
    with pytest.raises(RuntimeError):
        main(["embed", TEXT, "--debug"])


def test_interrupt_exits_130_quietly(cli, monkeypatch):
    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Session, "trace", stop)
    r = cli("embed", TEXT)
    assert r.code == 130 and r.out == "" and "Traceback" not in r.err


# ------------------------------------------------------------------ broken weights: exit 1


@pytest.fixture
def broken(tmp_path, tiny, cli):
    """A copy of the tiny folder to break, and a runner pointed at it."""
    folder = tmp_path / "broken"
    shutil.copytree(tiny.folder, folder)

    def run(*args):
        return cli(*(args or ("embed", TEXT)), "--weights", folder)

    run.folder = folder
    return run


def test_truncated_weights_file(broken):
    f = broken.folder / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    assert_one_error_line(broken(), 1, "model.safetensors", "not a readable safetensors")


def test_garbage_weights_file(broken):
    (broken.folder / "model.safetensors").write_bytes(b"\x00\xffnot safetensors at all" * 7)
    assert_one_error_line(broken(), 1, "model.safetensors")


def test_empty_weights_file(broken):
    (broken.folder / "model.safetensors").write_bytes(b"")
    assert_one_error_line(broken("info"), 1, "model.safetensors")


@pytest.mark.parametrize(("name", "in_file"), [("layers.0.mlp.W_in", "h.0.mlp.c_fc.weight"),
                                              ("ln_final.b", "ln_f.bias"),
                                              ("embed.W_pos", "wpe.weight")])
def test_a_tensor_with_the_wrong_shape_is_named(broken, name, in_file):
    params = random_params(TINY, seed=3)
    params[name] = np.zeros(params[name].shape[:-1] + (params[name].shape[-1] + 1,), np.float32)
    write_folder(broken.folder, params)
    assert_one_error_line(broken(), 1, PREFIX + in_file, "shape")


def test_a_missing_or_non_finite_tensor_is_named(broken):
    params = random_params(TINY, seed=3)
    params["layers.1.attn.W_O"][0, 0] = np.nan
    write_folder(broken.folder, params)
    assert_one_error_line(broken(), 1, "h.1.attn.c_proj.weight", "NaN")
    del params["layers.1.ln2.b"]
    write_folder(broken.folder, params)
    assert_one_error_line(broken(), 1, "h.1.ln_2.bias", "missing")


def test_a_missing_folder_or_file(broken):
    (broken.folder / "tokenizer.json").unlink()
    assert_one_error_line(broken(), 1, "tokenizer.json")
    shutil.rmtree(broken.folder)  # a folder the user named that is not there: bad input
    assert_one_error_line(broken(), 2, "does not exist")


def test_a_broken_config_or_tokenizer(broken):
    (broken.folder / "tokenizer.json").write_text("{not json")
    assert_one_error_line(broken(), 1, "tokenizer.json")
    (broken.folder / "config.json").write_text("{not json")
    assert_one_error_line(broken(), 1, "config.json")


def test_weights_errors_come_before_reading_stdin(broken):
    (broken.folder / "model.safetensors").write_bytes(b"junk")
    r = broken("generate", "-")  # stdin is a terminal: still the weights are the error
    assert_one_error_line(r, 1, "model.safetensors")


# ------------------------------------------------------------------ a real process, real pipes


def test_module_runs_with_pipes_and_no_escape_codes(tiny):
    r = run_module("attn", "--weights", tiny.folder, stdin=TEXT + "\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith("layers.0.heads.0.weights  6 × 6  float32")
    assert "\x1b" not in r.stdout and r.stderr == ""
    r = run_module("--help")
    assert r.returncode == 0 and "Usage: tinygpt" in r.stdout and r.stderr == ""


def test_module_generate_streams_ndjson(tiny):
    r = run_module("generate", "-", "-n", "3", "--seed", "4", "--no-stop", "--json",
                   env={"TINYGPT_WEIGHTS": str(tiny.folder)}, stdin=TEXT)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert [d["event"] for d in lines] == ["prompt"] + ["token"] * 3 + ["end"]
    assert lines[-1]["ids"][:6] == TEXT_IDS
    # seeded, so a second process writes the same lines
    again = run_module("generate", TEXT, "-n", "3", "--seed", "4", "--no-stop", "--json",
                       "--weights", tiny.folder)
    assert again.stdout == r.stdout


def test_module_errors_without_traceback(tiny, tmp_path):
    r = run_module("embed", "", "--weights", tiny.folder)
    assert_one_error_line(r, 2, "empty")
    r = run_module("embed", TEXT, "--weights", tiny.folder, "--no-such-option")
    assert_one_error_line(r, 2, "No such option")
    broken = tmp_path / "broken"
    shutil.copytree(tiny.folder, broken)
    (broken / "model.safetensors").write_bytes(b"\x01" * 100)
    r = run_module("embed", TEXT, "--weights", broken)
    assert_one_error_line(r, 1, "model.safetensors")
    r = run_module("embed", TEXT, "--weights", broken, "--debug")
    assert r.returncode != 0 and "Traceback" in r.stderr and "WeightsError" in r.stderr


@pytest.mark.parametrize("args", [("encode", TEXT), ("decode", "5", "6"),
                                  ("encode", TEXT, "--json")])
def test_encode_and_decode_report_a_broken_weights_file_though_they_never_read_it(broken, args):
    """encode and decode read only config and tokenizer, but a broken folder is reported by
    every command alike: exit 1, one line naming the file."""
    f = broken.folder / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    assert_one_error_line(broken(*args), 1, "model.safetensors", "truncated")
    f.write_bytes(b"\x00\xffnot safetensors at all" * 7)
    assert_one_error_line(broken(*args), 1, "model.safetensors", "not a readable safetensors")


def test_a_text_read_as_options_is_told_about_dashdash_and_a_misspelt_option_is_not(cli):
    err = assert_one_error_line(cli("encode", "-hello"), 2, "No such option",
                                "goes after '--'", "tinygpt encode -- -hello")
    assert "Possible options" not in err
    err = assert_one_error_line(cli("attn", TEXT, "--layr", "0"), 2, "No such option: --layr",
                                "Possible options:", "--layer", "tinygpt attn --help")
    assert "goes after" not in err
