"""Gemma 3 GGUF files: a small random transformers Gemma3ForCausalLM written as llama.cpp's
converter writes it (examples/make_gguf.py: gemma3's metadata keys, 1 added to every norm
weight, no q/k reordering) with a Gemma-style SentencePiece vocabulary (scores that do not
follow the merge order, runs of spaces stored as real spaces, no space prefix). Its
parameters equal the folder's, its logits transformers' from_pretrained(gguf_file=...)'s,
its ids transformers' GGUF tokenizer's; the local blocks, rotary bases and score scale read
as llama.cpp reads them; lying Gemma metadata refused in one line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from cli_helpers import example  # noqa: E402
from shipped_folders import gemma_tokenizer_keys  # noqa: E402
from test_gguf import HARD, IDS, TOL, sentencepiece_vocab  # noqa: E402

from tinygpt_cli.transformer.folder import load_model  # noqa: E402
from tinygpt_cli.transformer.model import forward  # noqa: E402

SPACES = ["generate the story model;", "  two", "a   b", "    four\n  two", " lead", "end   ",
          "\u2581 mixed"]


make_gguf = example("make_gguf")


def gemma_vocab() -> tuple[list[str], list[float], list[int]]:
    """Gemma's layout of a SentencePiece vocabulary: <pad>, <eos>, <bos>, <unk>, a
    user-defined <start_of_turn>, the byte tokens, then pieces in merge order; the runs of
    '▁' stored as real spaces (user-defined, as Gemma's are); scores shuffled, so that
    ranking the merges by score would give other ids than the file's order."""
    tokens, _, types = sentencepiece_vocab()
    pieces = [(t, k) for t, k in zip(tokens[259:], types[259:], strict=True)]
    head = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>"]
    out = head + tokens[3:259]
    kinds = [3, 3, 3, 2, 4] + [6] * 256
    runs = {"\u2581" * n for n in range(2, 9)}
    for t, k in pieces:
        if t in runs:
            out.append(" " * len(t))
            kinds.append(4)
        else:
            out.append(t)
            kinds.append(k)
    for n in range(2, 9):  # every run, whether the shipped vocabulary had it or not
        if " " * n not in out:
            out.append(" " * n)
            kinds.append(4)
    scores = np.random.default_rng(5).permutation(len(out)).astype(float) * -1.0
    return out, scores.tolist(), kinds


def gemma_metadata(w, _cfg) -> None:
    gemma_tokenizer_keys(w, *gemma_vocab())


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """(the folder, its F32 GGUF alone in a folder): 7 blocks (the sixth full, the rest
    local to 4 keys), head_dim 256 (transformers' GGUF loader takes query_pre_attn_scalar
    as its default 256; llama.cpp scales by 1/sqrt(head_dim): the two agree), norms away
    from 0."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    n_vocab = len(gemma_vocab()[0])
    cfg = transformers.Gemma3TextConfig(
        vocab_size=n_vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=7,
        num_attention_heads=2, num_key_value_heads=1, head_dim=256, sliding_window=4,
        max_position_embeddings=64, query_pre_attn_scalar=256, pad_token_id=0,
        eos_token_id=1, bos_token_id=2, rope_theta=100_000.0)
    model = transformers.Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.3 * torch.randn_like(p))
    folder = tmp_path_factory.mktemp("gemma3") / "hf"
    model.save_pretrained(folder)
    out = folder.parent / "file" / "gemma3-F32.gguf"
    out.parent.mkdir()
    make_gguf.write(folder, out, "F32", vocab=gemma_metadata)
    return folder, out


def as_type(gemma, kind: str) -> Path:
    folder, f32 = gemma
    out = f32.parent / f"gemma3-{kind}.gguf"
    if not out.exists():
        make_gguf.write(folder, out, kind, vocab=gemma_metadata)
    return out


def transformers_logits(path: Path, ids) -> np.ndarray:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    m = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                          dtype=torch.float32).eval()
    with torch.no_grad():
        return m(torch.tensor([ids])).logits[0].numpy()


def test_the_config_is_llama_cpps_reading(gemma):
    """Blocks local as llama.cpp's default pattern of 6 says (the sixth full), the window,
    the full blocks' rotary base from rope.freq_base and the local ones' 10,000, scores
    scaled by 1/sqrt(head_dim), the embeddings by sqrtf(64) = 8, norms' scales 1 + w."""
    folder, path = gemma
    c = load_model(path).config
    assert c.model_type == "gemma3_text" and c.n_layer == 7 and c.d_k == 256
    assert c.windows == (4, 4, 4, 4, 4, 0, 4)
    assert c.rotary_bases == (1e4,) * 5 + (1e5,) + (1e4,)
    assert c.scale == 256 ** -0.5 and c.embed_scale == 8.0
    assert c.qk_norm and c.post_norms and c.tied and c.kv_heads == 1


def test_f32_file_is_its_folder(gemma):
    """Every parameter equals the one read from the safetensors folder (where the scale is
    made as 1 + w in float32; in the file the converter added the 1), bit for bit."""
    folder, path = gemma
    b = load_model(path)
    # the folder needs a tokenizer.json of its own: the file's, written out
    (folder / "tokenizer.json").write_text(b.tokenizer._tok.to_str())
    a = load_model(folder)
    assert a.config == dataclasses.replace(b.config,
                                           layer_norm_epsilon=a.config.layer_norm_epsilon,
                                           n_positions=a.config.n_positions,
                                           unused=a.config.unused)
    assert a.params.keys() == b.params.keys()
    for key in a.params:
        assert np.array_equal(a.params[key], b.params[key]), key
    ids = np.array(IDS)
    assert np.array_equal(forward(a.params, a.config, ids), forward(b.params, b.config, ids))


@pytest.mark.slow  # seconds each: transformers loads every file
@pytest.mark.parametrize("kind", ["F32", pytest.param("Q8_0", marks=pytest.mark.slow),
                                  pytest.param("Q4_0", marks=pytest.mark.slow)])
def test_logits_as_transformers(gemma, kind):
    path = as_type(gemma, kind)
    model = load_model(path)
    got = forward(model.params, model.config, np.array(IDS))
    want = transformers_logits(path, IDS)
    assert np.abs(got - want).max() <= TOL * np.abs(want).max()


def test_tokenizer_as_transformers(gemma):
    """The ids of transformers' GGUF tokenizer for Gemma (merges in the file's order, runs of
    spaces as '▁' runs, no space prefix, BOS added), and the text back."""
    transformers = pytest.importorskip("transformers")
    path = gemma[1]
    mine = load_model(path).tokenizer
    theirs = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for text in HARD + SPACES:
        ids = mine.encode(text)
        assert ids == theirs(text, add_special_tokens=False).input_ids, text
        # a '▁' typed in the text comes back a space, in both
        assert mine.decode(ids) == theirs.decode(ids) == text.replace("\u2581", " "), text
        assert mine.text_ids(text) == theirs(text)["input_ids"], text
    assert mine.encode("<start_of_turn>user")[0] == 4


def test_merges_follow_the_file_not_the_scores(gemma):
    """Without transformers: the same vocabulary read as plain SentencePiece (scores
    ranking the merges) cuts the words otherwise; Gemma's order gives the longer pieces."""
    from tinygpt_cli.transformer.gguf_vocab import build

    path = gemma[1]
    meta = _meta(path)
    tokens = meta["tokenizer.ggml.tokens"]
    gemma_tok = build(meta, path)[0]
    plain = build({**meta, "general.architecture": "llama"}, path)[0]
    text = "generate the story model;"
    assert gemma_tok.encode(text) != plain.encode(text)
    # "the" merges as the file orders its pieces: the pair whose token comes first wins
    assert [tokens[i] for i in gemma_tok.encode("the")] == ["t", "he"]
    assert [tokens[i] for i in plain.encode("the")] == ["th", "e"]
    # a run of spaces is reached by the merges as the file's real-space tokens
    assert [tokens[i] for i in gemma_tok.encode("a    b")] == ["a", "   ", "\u2581b"]


def _meta(path: Path) -> dict:
    from tinygpt_cli.storage.gguf_file import layout

    return layout(path).meta


@pytest.mark.parametrize("pattern,want", [
    (None, [True] * 5 + [False] + [True]),  # llama.cpp's default 6
    (2, [True, False] * 3 + [True]),
    (0, [True] * 7),
    (1, [False] * 7),
    ([True, False, False, True, True, True, False], [True, False, False, True, True, True, False]),
])
def test_local_blocks_as_llama_cpp_sets_them(pattern, want):
    """llama_hparams::set_swa_pattern, as a loop: block i local when i % n < n - 1."""
    from tinygpt_cli.transformer.gguf import _local_blocks

    got = _local_blocks(6 if pattern is None else pattern, 7)
    naive = []
    for i in range(7):
        if isinstance(pattern, list):
            naive.append(pattern[i])
        else:
            n = 6 if pattern is None else pattern
            naive.append(n == 0 or i % n < n - 1)
    assert got == want == naive


def test_the_27b_scale_and_the_local_base(tmp_path):
    """The 62-block model's scores scale by 1/sqrt(d / heads), not the head's width; a
    rope.freq_base_swa is the local blocks' base; no sliding_window: every block full."""
    from tinygpt_cli.transformer.families import config_from_dict
    from tinygpt_cli.transformer.gguf import hf_config

    meta = {"gemma3.embedding_length": 5376, "gemma3.attention.head_count": 32,
            "gemma3.block_count": 62, "gemma3.attention.key_length": 128,
            "gemma3.attention.head_count_kv": 16, "gemma3.feed_forward_length": 21504,
            "gemma3.context_length": 32768, "gemma3.attention.sliding_window": 1024,
            "gemma3.rope.freq_base": 1e6, "gemma3.rope.freq_base_swa": 2e4}
    c = config_from_dict(hf_config("gemma3", meta, set(), 262144))
    assert c.scale == (5376 // 32) ** -0.5
    assert c.rotary_bases[0] == 2e4 and c.rotary_bases[5] == 1e6
    del meta["gemma3.attention.sliding_window"]
    c = config_from_dict(hf_config("gemma3", {**meta, "gemma3.block_count": 26}, set(), 262144))
    assert c.windows == (0,) * 26 and c.scale == 128 ** -0.5


@pytest.mark.parametrize("key,value,needle", [
    ("gemma3.attention.value_length", 128, "attention.value_length 128 differs from "
     "attention.key_length 256"),
    ("gemma3.attention.sliding_window_pattern", [True, False], "sliding_window_pattern has 2 "
     "entries for 7 blocks"),
    ("gemma3.final_logit_softcapping", 30.0, "final_logit_softcapping 30.0 is not implemented"),
    ("gemma3.rope.dimension_count", 128, "rope.dimension_count 128 turns part of a 256-number"),
    ("gemma3.attention.key_length", 0, "key_length must be a whole number from 1"),
])
def test_lying_gemma_metadata_is_one_line(gemma, tmp_path, key, value, needle):
    from test_hostile import _run_main, assert_error

    folder = gemma[0]

    def vocab(w, cfg):
        gemma_metadata(w, cfg)
        if isinstance(value, list):
            w.add_array(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_uint32(key, value)

    out = tmp_path / "bad.gguf"
    if key in ("gemma3.attention.value_length", "gemma3.attention.key_length"):
        # the writer's own key would come first and twice is refused: write the file, then
        # patch the value in place
        make_gguf.write(folder, out, "F32", vocab=gemma_metadata)
        _patch_u32(out, key, value)
    else:
        make_gguf.write(folder, out, "F32", vocab=vocab)
    assert_error(_run_main(["info", "--weights", str(out)]), 1, needle)


def _patch_u32(path: Path, key: str, value: int) -> None:
    import struct

    f = gguf.GGUFReader(str(path)).fields[key]
    at = f.offset + 8 + len(key.encode()) + 4
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, at, value)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0", "Q5_1"])
def test_gemma3_dequantized_bit_for_bit(tmp_path, kind):
    """Without torch: a Gemma 3 of tinygpt's own written as llama.cpp's converter writes it;
    every parameter is gguf.quants.dequantize's number of its tensor (read by GGUFReader),
    the norms' scales the file's values as they are (the 1 already in them)."""
    import shutil

    from tinygpt_cli.jobs.train.loop import arch_config
    from tinygpt_cli.storage.locations import SHIPPED
    from tinygpt_cli.transformer.families import save_config
    from tinygpt_cli.transformer.folder import save_params
    from tinygpt_cli.transformer.gguf import _is_matrix, gguf_names
    from tinygpt_cli.transformer.model import init_params

    folder = tmp_path / "folder"
    folder.mkdir()
    cfg = arch_config("gemma3", n_embd=64, n_layer=2, n_head=2, n_inner=128, n_positions=32)
    params = init_params(cfg, np.random.default_rng(6))
    rng = np.random.default_rng(7)
    for name in params:  # the scales away from 1, some past 2 (where w + 1 - 1 rounds)
        if params[name].ndim == 1:
            params[name] = (params[name] + rng.normal(0, 0.8, params[name].shape)).astype(
                np.float32)
    save_params(params, folder / "model.safetensors", cfg)
    save_config(cfg, folder / "config.json")
    shutil.copy(SHIPPED / "tokenizer.json", folder / "tokenizer.json")
    out = tmp_path / f"g-{kind}.gguf"
    make_gguf.write(folder, out, kind)
    model = load_model(out)
    reader = gguf.GGUFReader(str(out))
    want = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in reader.tensors}
    assert {t.tensor_type.name for t in reader.tensors} == {kind, "F32"}
    for canonical, files in gguf_names(model.config).items():
        got = model.params[canonical]
        parts = [want.pop(f) for f in files]
        whole = np.concatenate([p.reshape(-1, p.shape[-1]) if p.ndim > 1 else p for p in parts])
        if _is_matrix(canonical):
            assert np.array_equal(got.T, whole), canonical
        else:
            assert np.array_equal(got.reshape(whole.shape), whole), canonical
    assert not want  # every tensor of the file placed
    folder_model = load_model(folder)
    for name, a in folder_model.params.items():  # the scales: 1 + w, whatever the route
        if name.endswith("norm.w") or name.startswith("ln") or ".ln" in name:
            assert np.array_equal(a, model.params[name]), name
