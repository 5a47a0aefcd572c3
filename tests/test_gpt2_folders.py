"""GPT-2 folders as `transformers` writes them, at sizes tinygpt never trains (issue 19):
2 x 96 with 3 heads of 32, and the 12 x 768 of GPT-2 small (vocabulary 4,096 to stay cheap).
Their configs carry transformers' defaults (bos/eos 50256, outside the vocabulary; dropout
rates; summary_* keys): loaded as transformers loads them, every inspection command runs,
and `trace` gives transformers' hidden states."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from cli_helpers import TOKENIZER, Runner, clean_env

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TEXT = "Lily wanted to play with her red ball."
SIZES = {"2x96": dict(n_layer=2, n_embd=96, n_head=3, n_positions=64),
         "12x768": dict(n_layer=12, n_embd=768, n_head=12, n_positions=1024)}


def gpt2_folder(folder, n_layer, n_embd, n_head, n_positions, seed=0):
    """save_pretrained of a seeded random GPT2LMHeadModel with the default config, its weights
    widened (N(0, 0.1), LayerNorm scales 1 +- 0.2) so attention is far from uniform."""
    torch.manual_seed(seed)
    config = transformers.GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head,
                                     vocab_size=4096, n_positions=n_positions)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.1)
    model.save_pretrained(folder)
    shutil.copyfile(TOKENIZER, folder / "tokenizer.json")
    return model


@pytest.fixture(scope="module", params=list(SIZES))
def folder(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    model = gpt2_folder(path, **SIZES[request.param])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"))
    with torch.no_grad():
        out = model(torch.tensor([fast(TEXT)["input_ids"]]), output_hidden_states=True)
    hidden = [h[0].numpy() for h in out.hidden_states]
    return path, hidden, out.logits[0].numpy()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """As the console script runs (tinygpt_cli.jobs.threads): in this process NumPy is loaded
    already, so the pool is set through threadpoolctl, and put back afterwards."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    with threadpoolctl.threadpool_limits(1):
        yield


@pytest.fixture
def cli(capsys, monkeypatch):
    clean_env(monkeypatch)
    return Runner(capsys, monkeypatch)


def test_the_default_config_is_read_as_transformers_reads_it(folder, cli):
    path, _, _ = folder
    raw = json.loads((path / "config.json").read_text())
    assert raw["bos_token_id"] == raw["eos_token_id"] == 50256  # transformers' default
    info = cli("info", "--weights", path, "--json").json()
    assert info["config"]["unused"] == ["bos_token_id 50256", "eos_token_id 50256"]
    assert info["config"]["n_head"] == raw["n_head"]
    shown = cli("info", "--weights", path).out
    assert "bos_token_id 50256, eos_token_id 50256 (outside the vocabulary: not used)" in shown


INSPECTION = [
    ["encode", TEXT], ["embed", TEXT], ["pos", TEXT], ["norm", TEXT, "--layer", "1"],
    ["attn", TEXT, "--layer", "1", "--head", "2"], ["mlp", TEXT, "--layer", "1"],
    ["blocks", TEXT], ["final-norm", TEXT], ["logits", TEXT], ["probs", TEXT],
    ["sample", TEXT, "--seed", "1"], ["generate", TEXT, "-n", "5", "-t", "0"],
    ["trace", TEXT, "layers.1.heads.2.weights"], ["review", TEXT], ["map", TEXT],
    ["lens", TEXT], ["dla", TEXT], ["info"],
]


@pytest.mark.parametrize("args", INSPECTION, ids=lambda a: a[0])
def test_every_inspection_command_runs(folder, cli, args):
    path, _, _ = folder
    r = cli(*args, "--weights", path)
    assert r.code == 0, r.err
    assert r.out.strip()


def test_trace_gives_transformers_hidden_states(folder, cli):
    path, hidden, logits = folder

    def traced(value):
        r = cli("trace", TEXT, value, "--weights", path, "--json")
        assert r.code == 0, r.err
        return np.asarray(r.json()["data"])

    n_layer = len(hidden) - 1
    for layer in (0, n_layer - 1):
        want = hidden[layer]
        np.testing.assert_allclose(traced(f"layers.{layer}.resid_pre"), want,
                                   rtol=0, atol=1e-4 * np.abs(want).max())
    np.testing.assert_allclose(traced("ln_final.out"), hidden[-1],
                               rtol=0, atol=1e-4 * np.abs(hidden[-1]).max())
    np.testing.assert_allclose(traced("logits"), logits, rtol=0,
                               atol=1e-4 * np.abs(logits).max())
