"""GGUF files against llama.cpp's gguf package and transformers: small random transformers
models of each family written as llama.cpp's converter writes them (examples/make_gguf.py,
which reads the folder with safetensors alone), in every type the gguf package can write and
in the K-quants (blocks of random bytes, which it dequantizes but cannot make). tinygpt's
parameters equal gguf.quants.dequantize bit for bit, its logits equal transformers'
from_pretrained(gguf_file=...) (which dequantizes with its own torch code), its tokenizer
gives transformers' GGUF tokenizer's ids."""

from __future__ import annotations

import dataclasses
import json
import shutil
import zlib
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from cli_helpers import example  # noqa: E402

from tinygpt_cli.storage.locations import SHIPPED  # noqa: E402
from tinygpt_cli.transformer.families import config_to_dict, family  # noqa: E402
from tinygpt_cli.transformer.folder import load_model  # noqa: E402
from tinygpt_cli.transformer.model import forward  # noqa: E402

TOL = 1e-5  # of the largest logit
IDS = [5, 300, 17, 900, 42, 8, 1000, 77, 3, 64, 5, 300]
HARD = ["Once upon a time, a dog named Max ran.", "  two spaces\n\nand\tnewlines \n",
        "naïve café — Ünïcödé àçcents", "emoji 🐶🚀 and 👩‍👩‍👧 family",
        "def f(x):\n    return x**2  # 42",
        "numbers 1234567 and 3.14159", "<|endoftext|>", "   ", "x" * 300]


make_gguf = example("make_gguf")
GT = gguf.GGMLQuantizationType
# where each K-quant's (and IQ4's) float16 scales sit in its block
HALVES = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
          "IQ4_NL": (0,), "IQ4_XS": (0,)}


def random_blocks(name: str, a: np.ndarray, kind: str):
    """A matrix as random blocks of a type gguf cannot quantize to, their scales small float16
    numbers; anything else as make_gguf quantizes it."""
    if kind not in HALVES or a.ndim < 2:
        return make_gguf.quantized(name, a, kind)
    qtype = GT[kind]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    # seeded by the name's crc32, not hash(): Python salts str hashes per process, and the
    # blocks (so the logits' range against the tolerance) changed from run to run
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    raw = rng.integers(0, 256, (a.shape[0], a.shape[1] // block, size), dtype=np.uint8)
    small = 0.02 if kind == "IQ4_XS" else 1.0  # its 6-bit block scales times levels to 127
    for at in HALVES[kind]:
        raw[..., at:at + 2] = rng.uniform(0.001 * small, 0.004 * small, raw.shape[:2]).astype(
            np.float16).view(np.uint8).reshape(*raw.shape[:2], 2)
    return raw.reshape(a.shape[0], -1), qtype


def hf_folder(tmp: Path, kind: str, width: int = 64, tied: bool = True) -> Path:
    """A small random transformers model of `kind` saved with the shipped tokenizer."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    common = dict(vocab_size=4096, hidden_size=width, intermediate_size=2 * width,
                  num_hidden_layers=2, max_position_embeddings=64, tie_word_embeddings=tied)
    if kind == "llama":
        cfg = transformers.LlamaConfig(num_attention_heads=4, num_key_value_heads=2, **common)
    elif kind == "qwen2":
        cfg = transformers.Qwen2Config(num_attention_heads=4, num_key_value_heads=2, **common)
    elif kind == "qwen3":  # transformers' GGUF reader takes Qwen3's head_dim as 128
        cfg = transformers.Qwen3Config(num_attention_heads=2, num_key_value_heads=1,
                                       head_dim=width // 2, **common)
    elif kind == "gpt2":  # transformers' GGUF reader leaves n_positions at its 1024
        cfg = transformers.GPT2Config(n_embd=width, n_layer=2, n_head=4, n_positions=1024,
                                      vocab_size=4096)
    else:
        raise ValueError(kind)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # norms and biases away from their 1 and 0, so they are tested
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
    folder = tmp / kind
    model.save_pretrained(folder)
    shutil.copy(SHIPPED / "tokenizer.json", folder / "tokenizer.json")
    config = json.loads((folder / "config.json").read_text())
    config.update(bos_token_id=0, eos_token_id=0)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def gguf_file(folder: Path, kind: str, pre: str = "gpt-2") -> Path:
    out = folder / f"model-{kind}.gguf"
    make_gguf.write(folder, out, kind, pre=pre, quantize=random_blocks)
    return out


def as_llama_cpp(model) -> dict[str, np.ndarray]:
    """tinygpt's parameters written back in the family's Hugging Face layout, then laid out
    as llama.cpp's converter lays them out (make_gguf: its names, transposes, permutation)."""
    cfg = model.config
    hf = family(cfg.model_type).params_to_file(model.params, cfg)
    return make_gguf.llama_cpp_tensors(config_to_dict(cfg), hf)


def dequantized_file(path: Path) -> dict[str, np.ndarray]:
    reader = gguf.GGUFReader(str(path))
    return {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in reader.tensors}


def transformers_logits(path: Path, ids) -> np.ndarray:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # transformers loads a GGUF only with it
    m = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                          dtype=torch.float32).eval()
    with torch.no_grad():
        return m(torch.tensor([ids])).logits[0].numpy()


FLOATS = ["F32", "F16", "BF16"]
MADE = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]  # what gguf.quants.quantize writes
RANDOM = list(HALVES)  # blocks of random bytes
WIDE = ["TQ1_0", "TQ2_0", "MXFP4"]  # written by gguf too, in blocks of up to 256
SHIPPED_FOLDERS = {"gpt2": SHIPPED, "llama": SHIPPED / "llama", "gpt_neox": SHIPPED / "neox"}


@pytest.fixture(scope="module")
def wide_llama(tmp_path_factory):
    """A random Llama 256 numbers wide (the K-quants' blocks are 256 long), saved by tinygpt
    in the Hugging Face layout with the shipped tokenizer."""
    from tinygpt_cli.jobs.train.loop import arch_config
    from tinygpt_cli.transformer.families import save_config
    from tinygpt_cli.transformer.folder import save_params
    from tinygpt_cli.transformer.model import init_params

    folder = tmp_path_factory.mktemp("wide")
    cfg = arch_config("llama", n_embd=256, n_layer=1, n_head=4, n_inner=512)
    save_params(init_params(cfg, np.random.default_rng(0)), folder / "model.safetensors", cfg)
    save_config(cfg, folder / "config.json")
    shutil.copy(SHIPPED / "tokenizer.json", folder / "tokenizer.json")
    return folder


@pytest.fixture(scope="module")
def qwen_folders(tmp_path_factory):
    """Random Qwen2 (q/k/v biases, untied) and Qwen3 (q/k norms) folders saved by tinygpt."""
    from tinygpt_cli.transformer.config import Config
    from tinygpt_cli.transformer.families import save_config
    from tinygpt_cli.transformer.folder import save_params
    from tinygpt_cli.transformer.model import init_params

    out = {}
    for kind in ("qwen2", "qwen3"):
        folder = tmp_path_factory.mktemp(kind)
        cfg = Config(n_embd=64, n_layer=2, n_head=4, n_inner=128, vocab_size=4096,
                     n_positions=64, model_type=kind, norm="rms", positions="rotary",
                     mlp="gated", act="silu", n_kv_head=2, tied=kind == "qwen3",
                     qk_norm=kind == "qwen3", qkv_bias=kind == "qwen2", out_bias=False,
                     mlp_bias=False, rotary_base=1e6)
        params = init_params(cfg, np.random.default_rng(1))
        for name in params:  # norms and biases away from 1 and 0
            if params[name].ndim == 1:
                params[name] = params[name] + np.random.default_rng(2).normal(
                    0, 0.1, params[name].shape).astype(np.float32)
        save_params(params, folder / "model.safetensors", cfg)
        save_config(cfg, folder / "config.json")
        shutil.copy(SHIPPED / "tokenizer.json", folder / "tokenizer.json")
        out[kind] = folder
    return out


def gguf_of(folder: Path, tmp: Path, kind: str, pre: str = "gpt-2") -> Path:
    out = tmp / f"{folder.name}-{kind}-{pre}.gguf"
    make_gguf.write(folder, out, kind, pre=pre, quantize=random_blocks)
    return out


@pytest.mark.parametrize("name", list(SHIPPED_FOLDERS))
def test_f32_file_is_the_folder(tmp_path, name):
    """An F32 GGUF gives exactly the parameters of the safetensors folder it was made from:
    Llama's q/k reordering undone, GPT-NeoX's fused q/k/v regrouped, every matrix the right
    way round, the same config and the same ids."""
    folder = SHIPPED_FOLDERS[name]
    a, b = load_model(folder), load_model(gguf_of(folder, tmp_path, "F32"))
    # a GGUF keeps the norm's epsilon as a float32, 1e-5 as 9.99999975e-06
    assert np.float32(a.config.layer_norm_epsilon) == b.config.layer_norm_epsilon
    assert a.config == dataclasses.replace(b.config,
                                           layer_norm_epsilon=a.config.layer_norm_epsilon)
    assert a.params.keys() == b.params.keys()
    for key in a.params:
        assert np.array_equal(a.params[key], b.params[key]), key
    for text in HARD:
        assert a.tokenizer.encode(text) == b.tokenizer.encode(text)


@pytest.mark.parametrize("name", ["qwen2", "qwen3"])
def test_f32_qwen_file_is_the_folder(qwen_folders, tmp_path, name):
    """Qwen's q and k rows are kept in Hugging Face's order (llama.cpp reorders Llama's
    only); Qwen2's biases and Qwen3's q/k norms land where they belong."""
    folder = qwen_folders[name]
    a, b = load_model(folder), load_model(gguf_of(folder, tmp_path, "F32", pre="qwen2"))
    assert a.config == dataclasses.replace(b.config,
                                           layer_norm_epsilon=a.config.layer_norm_epsilon)
    for key in a.params:
        assert np.array_equal(a.params[key], b.params[key]), key


def test_smollm_splits_each_digit(tmp_path):
    """tokenizer.ggml.pre smollm: each digit its own word before GPT-2's (SmolLM2's
    tokenizer.json: Digits(individual) then ByteLevel), checked against that tokenizer built
    with the tokenizers library from the shipped vocabulary."""
    from tokenizers import Tokenizer, pre_tokenizers

    tok = load_model(gguf_of(SHIPPED, tmp_path, "Q8_0", pre="smollm")).tokenizer
    ref = Tokenizer.from_file(str(SHIPPED / "tokenizer.json"))
    ref.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    for text in HARD:
        assert tok.encode(text) == ref.encode(text, add_special_tokens=False).ids, text
    assert len(tok.encode("1234567")) == 7


@pytest.mark.parametrize("kind", FLOATS + MADE)
def test_dequantized_bit_for_bit(tmp_path, kind):
    """Every parameter is gguf.quants.dequantize's number, placed where it belongs (the file's
    layout rebuilt from tinygpt's parameters by the converter's own rules)."""
    path = gguf_of(SHIPPED_FOLDERS["llama"], tmp_path, kind)
    model = load_model(path)
    want = dequantized_file(path)
    got = as_llama_cpp(model)
    assert set(got) == set(want)
    for name, a in got.items():
        assert np.array_equal(a, want[name].reshape(a.shape)), name


@pytest.mark.parametrize("name", ["gpt2", "gpt_neox"])
def test_other_families_bit_for_bit(tmp_path, name):
    path = gguf_of(SHIPPED_FOLDERS[name], tmp_path, "Q4_1")
    want = dequantized_file(path)
    for key, a in as_llama_cpp(load_model(path)).items():
        assert np.array_equal(a, want[key].reshape(a.shape)), key


@pytest.mark.parametrize("kind", RANDOM + WIDE)
def test_k_quants_bit_for_bit(wide_llama, tmp_path, kind):
    path = gguf_of(wide_llama, tmp_path, kind)
    want = dequantized_file(path)
    for name, a in as_llama_cpp(load_model(path)).items():
        assert np.array_equal(a, want[name].reshape(a.shape)), name


# ------------------------------------------------------------------ against transformers


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gguf")
    return {"llama": hf_folder(tmp, "llama"), "llama256": hf_folder(tmp / "k", "llama", 256),
            "qwen2": hf_folder(tmp, "qwen2", tied=False), "qwen3": hf_folder(tmp, "qwen3", 256),
            "gpt2": hf_folder(tmp, "gpt2")}


@pytest.mark.slow  # seconds each: transformers loads every file
@pytest.mark.parametrize("family_name", ["llama", "qwen2", "qwen3", "gpt2"])
@pytest.mark.parametrize("kind", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1"])
def test_logits_as_transformers(folders, family_name, kind):
    path = gguf_file(folders[family_name], kind,
                     pre="qwen2" if family_name.startswith("qwen") else "gpt-2")
    model = load_model(path)
    got = forward(model.params, model.config, np.array(IDS))
    want = transformers_logits(path, IDS)
    assert np.abs(got - want).max() <= TOL * np.abs(want).max()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"])
def test_k_quant_logits_as_transformers(folders, kind):
    path = gguf_file(folders["llama256"], kind)
    model = load_model(path)
    got = forward(model.params, model.config, np.array(IDS))
    want = transformers_logits(path, IDS)
    assert np.abs(got - want).max() <= TOL * np.abs(want).max()


@pytest.mark.parametrize("pre", ["gpt-2", "llama-bpe", "qwen2"])
def test_byte_level_tokenizer_as_transformers(tmp_path, pre):
    transformers = pytest.importorskip("transformers")
    path = gguf_of(SHIPPED, tmp_path, "Q8_0", pre=pre)
    model = load_model(path)
    theirs = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for text in HARD:
        assert model.tokenizer.encode(text) == \
            theirs(text, add_special_tokens=False).input_ids, text
        assert model.tokenizer.decode(model.tokenizer.encode(text)) == text


def sentencepiece_vocab() -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece BPE vocabulary as llama.cpp writes one (tokenizer.ggml.model llama):
    <unk>, <s>, </s>, the 256 byte tokens <0xNN>, then the shipped tokenizer's tokens that
    are whole UTF-8 text, a space spelt '▁', scored by their merge order."""
    from tinygpt_cli.transformer.tokenizer import _byte_decoder

    shipped = json.loads((SHIPPED / "tokenizer.json").read_text())["model"]["vocab"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256  # UNKNOWN, CONTROL, BYTE
    seen = set(tokens)
    for piece, _ in sorted(shipped.items(), key=lambda kv: kv[1]):
        try:
            text = bytes(_byte_decoder()[c] for c in piece).decode("utf-8")
        except (KeyError, UnicodeDecodeError):
            continue
        sp = text.replace(" ", "\u2581")
        if sp and sp not in seen and sp != "<|endoftext|>":
            seen.add(sp)
            tokens.append(sp)
            types.append(1)
    scores = [0.0] * 259 + [-float(i) for i in range(len(tokens) - 259)]
    return tokens, scores, types


@pytest.fixture(scope="module")
def sentencepiece_file(tmp_path_factory):
    """A small Llama with that vocabulary, as a GGUF."""
    from tinygpt_cli.jobs.train.loop import arch_config
    from tinygpt_cli.transformer.families import save_config
    from tinygpt_cli.transformer.folder import save_params
    from tinygpt_cli.transformer.model import init_params

    tokens, scores, types = sentencepiece_vocab()
    folder = tmp_path_factory.mktemp("sp")
    cfg = arch_config("llama", n_embd=64, n_layer=1, n_head=4, n_inner=128,
                      vocab_size=len(tokens), bos_token_id=1, eos_token_id=2)
    save_params(init_params(cfg, np.random.default_rng(0)), folder / "model.safetensors", cfg)
    save_config(cfg, folder / "config.json")

    out = folder / "file" / "sp.gguf"  # alone: transformers reads no tokenizer.json beside it
    out.parent.mkdir()
    make_gguf.write(folder, out, "Q8_0", vocab=sentencepiece_metadata(add_bos=True))
    return out


def sentencepiece_metadata(**adds):
    """make_gguf's `vocab` writer for that vocabulary; `adds`: add_bos / add_eos keys to
    write (a key left out is absent from the file)."""
    tokens, scores, types = sentencepiece_vocab()

    def vocab(w, _):
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        _flags(w, adds)
    return vocab


def _flags(w, adds: dict) -> None:
    for key, value in adds.items():
        getattr(w, f"add_{key}_token")(value)


def byte_level_metadata(pre: str = "gpt-2", **adds):
    """make_gguf's own byte-level vocabulary, with add_bos / add_eos keys as `adds` says."""
    def vocab(w, cfg):
        make_gguf.vocabulary(w, cfg, json.loads((SHIPPED / "tokenizer.json").read_text()), pre)
        _flags(w, adds)
    return vocab


ADDS = [{}, {"add_bos": True}, {"add_bos": False}, {"add_bos": True, "add_eos": True},
        {"add_eos": True}]


@pytest.mark.parametrize("adds", ADDS, ids=lambda a: ",".join(f"{k}={v}" for k, v in a.items())
                         or "absent")
@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_bos_as_transformers_puts_it(sentencepiece_file, tmp_path, kind, adds):
    """The tokens around a text (text_ids, what encode-style commands feed the model) are the
    ones transformers' GGUF tokenizer puts there, with the add_bos_token / add_eos_token
    keys true, false or absent (SentencePiece then adds BOS, GPT-2's BPE nothing)."""
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "file" / f"{kind}.gguf"
    out.parent.mkdir()
    if kind == "llama":
        make_gguf.write(sentencepiece_file.parent.parent, out, "Q8_0",
                        vocab=sentencepiece_metadata(**adds))
    else:
        make_gguf.write(SHIPPED, out, "Q8_0", vocab=byte_level_metadata(**adds))
    mine = load_model(out).tokenizer
    theirs = transformers.AutoTokenizer.from_pretrained(str(out.parent), gguf_file=out.name)
    for text in ["Once upon a time", "a café 🐶", HARD[1]]:
        assert mine.text_ids(text) == theirs(text)["input_ids"], text
    if kind == "llama" and adds.get("add_bos", True):
        assert mine.affix[0] == [1]


def test_sentencepiece_tokenizer_as_transformers(sentencepiece_file):
    """SentencePiece's BPE with no merges in the file: the merges rebuilt from the scores,
    the bytes no token covers as <0xNN> tokens, the first word given its '▁'."""
    transformers = pytest.importorskip("transformers")
    path = sentencepiece_file
    mine = load_model(path).tokenizer
    theirs = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for text in HARD:
        ids = mine.encode(text)
        assert ids == theirs(text, add_special_tokens=False).input_ids, text
        assert mine.decode(ids) == theirs.decode(ids), text
    ids = mine.encode("a café 🐶")
    assert b"".join(mine.token_bytes(i) for i in ids) == " a café 🐶".encode()


def test_sentencepiece_tokenizer_alone(sentencepiece_file):
    """Without transformers: bytes of each token, the byte tokens, the special tokens."""
    tok = load_model(sentencepiece_file).tokenizer
    assert tok.token_bytes(3 + 0x41) == b"A"
    assert tok.special_tokens["</s>"] == 2 and tok.eot_id == 2
    assert tok.decode(tok.encode("Once upon a time")) == "Once upon a time"
