"""Damaged, truncated and lying GGUF files: each refused in one `error:` line, exit 1 (a
broken file) or 2 (what the user named), nothing on stdout, no traceback; nothing is read
past the file's end (the header is walked with every length checked before the gguf
package, which trusts it, sees the file). The places to break are found with the gguf
package's own reader (each field's offset), not with tinygpt's."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest
from test_hostile import _run_main, assert_error, clean_env

gguf = pytest.importorskip("gguf")

from cli_helpers import example  # noqa: E402

from tinygpt_cli.storage.locations import SHIPPED  # noqa: E402


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    make_gguf = example("make_gguf")
    out = tmp_path_factory.mktemp("good") / "llama.gguf"
    make_gguf.write(SHIPPED / "llama", out, "Q8_0")
    return out


def field_at(path: Path, key: str) -> tuple[int, int]:
    """(offset of the field, offset of its value) by the gguf package's reader: a key's
    value starts after its length, its bytes and its 4-byte type."""
    f = gguf.GGUFReader(str(path)).fields[key]
    return f.offset, f.offset + 8 + len(key.encode()) + 4


def tensor_field(path: Path, name: str) -> dict[str, int]:
    """Where a tensor's entry keeps its dimension count, dims, type and offset."""
    t = next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == name)
    at = t.field.offset + 8 + len(name.encode())
    n = len(t.shape)
    return {"n_dims": at, "dims": at + 4, "type": at + 4 + 8 * n, "offset": at + 8 + 8 * n}


def patched(good: Path, tmp: Path, at: int, fmt: str, value) -> Path:
    data = bytearray(good.read_bytes())
    struct.pack_into(fmt, data, at, value)
    out = tmp / "bad.gguf"
    out.write_bytes(bytes(data))
    return out


def refused(path: Path, code: int, *needles: str) -> str:
    return assert_error(_run_main(["info", "--weights", str(path)]), code, *needles)


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    clean_env(monkeypatch)


def test_the_good_file_opens(good):
    r = _run_main(["info", "--weights", str(good)])
    assert r.code == 0, r.err
    assert "Q8_0" in r.out and "bits per weight" in r.out


@pytest.mark.parametrize("cut", [0, 10, 23, 200, 5000, -1000])
def test_truncated(good, tmp_path, cut):
    data = good.read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[:cut] if cut >= 0 else data[:len(data) + cut])
    refused(bad, 1, "cut.gguf")


def test_not_a_gguf(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"PK\x03\x04" + bytes(100))
    refused(bad, 1, "does not start with GGUF")


def test_version_and_byte_order(good, tmp_path):
    refused(patched(good, tmp_path, 4, "<I", 1), 1, "version 1")
    refused(patched(good, tmp_path, 4, ">I", 3), 1, "big-endian")


@pytest.mark.parametrize("at", [8, 16])
def test_header_counts_that_lie(good, tmp_path, at):
    """2^40 tensors or metadata entries claimed by a file of a megabyte."""
    refused(patched(good, tmp_path, at, "<Q", 1 << 40), 1, "claims")


def test_a_huge_string_length(good, tmp_path):
    offset, _ = field_at(good, "general.architecture")
    refused(patched(good, tmp_path, offset, "<Q", 1 << 62), 1, "runs past the end")


def test_a_huge_array_count(good, tmp_path):
    _, value = field_at(good, "tokenizer.ggml.tokens")
    refused(patched(good, tmp_path, value + 4, "<Q", 1 << 50), 1, "claims",
            "tokenizer.ggml.tokens")


def test_an_unknown_value_type(good, tmp_path):
    _, value = field_at(good, "general.name")
    refused(patched(good, tmp_path, value - 4, "<I", 99), 1, "unknown value type 99")


def test_an_unknown_tensor_type(good, tmp_path):
    at = tensor_field(good, "blk.0.attn_q.weight")["type"]
    refused(patched(good, tmp_path, at, "<I", 200), 1, "blk.0.attn_q.weight", "type 200")


def test_an_offset_past_the_end(good, tmp_path):
    at = tensor_field(good, "blk.1.ffn_up.weight")["offset"]
    refused(patched(good, tmp_path, at, "<Q", 1 << 30), 1, "blk.1.ffn_up.weight",
            "runs past the end")


def test_an_unaligned_offset(good, tmp_path):
    at = tensor_field(good, "blk.1.ffn_up.weight")["offset"]
    old = struct.unpack_from("<Q", good.read_bytes(), at)[0]
    refused(patched(good, tmp_path, at, "<Q", old + 1), 1, "alignment")


def test_overlapping_tensors(good, tmp_path):
    data = good.read_bytes()
    first = struct.unpack_from("<Q", data, tensor_field(good, "blk.0.ffn_up.weight")["offset"])
    at = tensor_field(good, "blk.0.ffn_down.weight")["offset"]
    refused(patched(good, tmp_path, at, "<Q", first[0]), 1, "overlap")


def test_a_shape_the_metadata_disagrees_with(good, tmp_path):
    """A norm's length changed in its entry (fewer bytes: still inside the file)."""
    at = tensor_field(good, "blk.0.attn_norm.weight")["dims"]
    refused(patched(good, tmp_path, at, "<Q", 64), 1, "blk.0.attn_norm.weight", "[64]",
            "the metadata says [96]")


def test_metadata_that_disagrees_with_the_tensors(good, tmp_path):
    _, value = field_at(good, "llama.block_count")
    refused(patched(good, tmp_path, value, "<I", 5), 1, "blk.4", "missing")
    _, value = field_at(good, "llama.block_count")
    refused(patched(good, tmp_path, value, "<I", 3), 1, "unexpected tensor", "blk.3")


def test_a_vocabulary_size_that_lies(good, tmp_path):
    _, value = field_at(good, "llama.vocab_size")
    refused(patched(good, tmp_path, value, "<I", 5000), 1, "vocab_size is 5000",
            "4,096 rows")


def test_too_many_dimensions(good, tmp_path):
    at = tensor_field(good, "blk.0.attn_norm.weight")["n_dims"]
    refused(patched(good, tmp_path, at, "<I", 9), 1, "9 dimensions")


def test_nan_in_a_tensor(good, tmp_path):
    t = next(t for t in gguf.GGUFReader(str(good)).tensors if t.name == "output_norm.weight")
    refused(patched(good, tmp_path, t.data_offset, "<f", float("nan")), 1,
            "output_norm.weight", "NaN")


def test_an_architecture_not_read(good, tmp_path):
    """general.architecture (the first string "llama" the writer puts down) made mamba."""
    bad = tmp_path / "mamba.gguf"
    bad.write_bytes(good.read_bytes().replace(struct.pack("<Q", 5) + b"llama",
                                              struct.pack("<Q", 5) + b"mamba", 1))
    refused(bad, 1, "architecture 'mamba' is not a family tinygpt reads")


def test_gemma3n_is_refused_by_name(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "g.gguf"), "gemma3n")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    refused(tmp_path / "g.gguf", 1, "architecture gemma3n is not read yet",
            "Gemma 3n's block (per-layer inputs, AltUp) is not in tinygpt")


def test_a_folder_of_two_gguf_files(good, tmp_path):
    (tmp_path / "a.gguf").write_bytes(good.read_bytes())
    (tmp_path / "b.gguf").write_bytes(good.read_bytes())
    refused(tmp_path, 2, "2 GGUF files", "--weights FILE.gguf")


def test_a_folder_of_one_gguf_file_opens(good, tmp_path):
    (tmp_path / "m.gguf").write_bytes(good.read_bytes())
    assert _run_main(["info", "--weights", str(tmp_path)]).code == 0


def test_without_the_gguf_package(good, monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)
    refused(good, 2, "pip install 'tinygpt-cli[gguf]'")
