"""Load, validate and save the weights folder (model.safetensors, config.json, tokenizer.json,
or a GGUF file) as one Model: its config, family, tokenizer and canonical parameters."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError, WeightsError
from ..storage.files import write_atomically
from ..storage.locations import gguf_path, resolve_folder, weights_path
from ..storage.safetensors import (
    FLOAT_DTYPES,
    INDEX,
    MAX_HEADER_BYTES,
    Bfloat16,
    TensorInfo,
    dtype_name,
    header_bytes,
    read_header,
    read_safetensors,
    safetensors_bytes,
    shards_of,
)
from .config import Config
from .families import Family, config_from_dict, family, load_config
from .schema import PARAMS
from .tokenizer import Tokenizer, special_name

if TYPE_CHECKING:  # NumPy is imported by the functions that use it: `encode` needs none
    import numpy as np

def header_limit(config: Config) -> int:
    """The most header bytes a GPT-2 model of these sizes can need: every tensor and the old
    attention buffers, a generous 512 bytes each (an entry is about 100), and some metadata.
    A header of a million made-up entries is refused before it is parsed."""
    per_block = sum(1 for row in PARAMS if row[0].startswith("layers.L.")) + 3  # + buffers
    return header_bytes(len(PARAMS) + 1 + per_block * config.n_layer)


def _short_names(infos: dict[str, TensorInfo], fam: Family) -> dict[str, TensorInfo]:
    """Names without the family's prefix (GPT-2's `transformer.`); the ignored buffers
    dropped."""
    out: dict[str, TensorInfo] = {}
    for name, info in infos.items():
        short = name.removeprefix(fam.PREFIX)
        if short.endswith(fam.IGNORED):
            continue
        if short in out:
            raise WeightsError(f"tensor {short} appears twice, as {out[short].name} and {name}: "
                               "the file must name each tensor once")
        out[short] = info
    return out


def check_header(infos: dict[str, TensorInfo], config: Config, fam: Family) -> None:
    """Names, count, shapes and dtypes against the config and its family's file layout,
    before any tensor is read.

    The count comes first, from the config's numbers alone, so that a config claiming a
    million blocks is refused without building a million blocks' worth of names.
    """
    short = _short_names(infos, fam)
    expected = fam.file_shapes(config)
    head = short.pop("lm_head.weight", None) if config.tied else None
    per_block = sum(1 for n in expected if fam.block_of(n) == 0)
    outside = sum(1 for n in expected if fam.block_of(n) is None)
    want = outside + per_block * config.n_layer
    if abs(len(short) - want) >= per_block:  # a block or more apart: the sizes disagree
        blocks = max(len(short) - outside, 0) / per_block
        raise WeightsError(
            f"config.json says n_layer {config.n_layer:,} ({want:,} tensors) but the weights "
            f"file holds {len(short):,} tensors ({blocks:g} blocks' worth)")
    missing = [n for n in expected if n not in short]
    if missing:
        raise WeightsError(
            f"tensor {fam.PREFIX}{missing[0]} is missing ({len(missing)} missing in all)"
        )
    extra = [n for n in short if n not in expected]
    if extra:
        raise WeightsError(f"unexpected tensor {extra[0]!r}: not part of a {fam.LABEL} model "
                           f"with the config's {config.n_layer} blocks")
    if head is not None:
        expected = {**expected, "lm_head.weight": expected[fam.file_name("embed.W_E")]}
        short["lm_head.weight"] = head
    for name, shape in expected.items():
        info = short[name]
        if info.shape != shape:
            raise WeightsError(
                f"tensor {_shown(name, fam)} has shape {list(info.shape)}, expected {list(shape)}"
            )
        if info.dtype not in FLOAT_DTYPES:
            numpy_name = {"I8": "int8", "I16": "int16", "I32": "int32", "I64": "int64",
                          "U8": "uint8", "BOOL": "bool"}.get(info.dtype, info.dtype)
            raise WeightsError(
                f"tensor {_shown(name, fam)} has dtype {info.dtype} ({numpy_name}), expected a "
                "float type tinygpt can use: F32, or F16 / BF16 / F64 (converted to float32)"
            )


def _shown(name: str, fam) -> str:
    return name if name == "lm_head.weight" else fam.PREFIX + name


def validate_params(tensors: dict[str, np.ndarray], config: Config, fam: Family
                    ) -> dict[str, np.ndarray]:
    """Check names, shapes, dtypes and finiteness; return float32 params by their canonical
    names (the family's converter, families/).

    A head (`lm_head.weight`) may be present, as `transformers` can save one: it must be
    finite and equal to the token table, because this model ties the two. `tensors` is
    emptied as it is read, and the converter lets go of each file tensor once its canonical
    copy is made: a bf16 file's widened tensors and their transposes are never all held at
    once.
    """
    import numpy as np

    infos = {n: TensorInfo(n, dtype_name(a.dtype), tuple(a.shape)) for n, a in tensors.items()}
    check_header(infos, config, fam)
    short = {name.removeprefix(fam.PREFIX): tensors.pop(name) for name in list(tensors)}
    expected = fam.file_shapes(config)
    out = {name: _finite_float32(name, short.pop(name), fam) for name in expected}
    table = fam.file_name("embed.W_E")
    if "lm_head.weight" in short and config.tied:
        head = _finite_float32("lm_head.weight", short["lm_head.weight"], fam)
        if not np.array_equal(*(a.widen() if isinstance(a, Bfloat16) else a
                                for a in (head, out[table]))):
            raise WeightsError(
                f"tensor lm_head.weight differs from {fam.PREFIX}{table}: tinygpt ties the "
                "output head to the token embedding table, so it cannot use a separate head"
            )
    del short
    return fam.params_from_file(out, config)


def _finite_float32(name: str, arr: np.ndarray, fam) -> np.ndarray:
    """float32 first, then the check: a float64 value beyond float32's range becomes inf."""
    import numpy as np

    if isinstance(arr, Bfloat16):  # widened by the converter, where it is to live
        if arr.finite():
            return arr
        raise WeightsError(f"tensor {_shown(name, fam)} holds NaN or infinite values")
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.ascontiguousarray(arr, dtype=np.float32)
        # A NaN or an infinity makes the sum of squares NaN or infinite, so a finite one
        # (a BLAS dot product) clears the tensor in one read and no [n] array of flags;
        # only a sum that overflowed needs the number-by-number check.
        flat = out.reshape(-1)
        if np.isfinite(np.dot(flat, flat)) or np.isfinite(out).all():
            return out
    raise WeightsError(f"tensor {_shown(name, fam)} holds NaN or infinite values")


def checked_header(path: Path, config: Config, fam: Family) -> dict[str, TensorInfo]:
    """The safetensors header of the weights file (or of every shard an index names),
    checked against the config and its family (names, shapes, dtypes): reads a few
    kilobytes, needs no NumPy."""
    if not path.is_file():
        raise WeightsError(f"weights file {path} does not exist")
    limit = min(MAX_HEADER_BYTES, header_limit(config))
    try:
        if path.name != INDEX:
            infos = read_header(path, limit)
        else:
            infos = {}
            for shard, names in shards_of(path).items():
                if not (path.parent / shard).is_file():
                    raise WeightsError(f"{path} names {shard}, which does not exist beside it")
                found = read_header(path.parent / shard, limit)
                if set(found) != names:
                    odd = sorted(set(found) ^ names)[0]
                    raise WeightsError(f"{path}: its weight_map and {shard} disagree about "
                                       f"tensor {odd!r}")
                infos.update({n: i._replace(shard=shard) for n, i in found.items()})
    except OSError as e:
        raise WeightsError(f"cannot read {path}: {e.strerror or e}") from None
    with _naming(path):
        check_header(infos, config, fam)
    return infos


@contextlib.contextmanager
def _naming(path: Path):
    """A tensor's fault reported with the file it is in: a weights folder's model, or one of
    its history/ snapshots, which the same loader reads."""
    try:
        yield
    except WeightsError as e:
        raise type(e)(f"{path}: {e}") from None


def load_params(path: str | Path, config: Config, fam: Family | None = None
                ) -> dict[str, np.ndarray]:
    """Read the header, check it against the config, and only then map the tensors. `fam`:
    the Model's family (model.family), when the file is one of a loaded model's (a snapshot
    of its history); looked up once from the config when the caller has no Model.

    The tensors are read-only arrays over the mapped file (map_safetensors); float32 ones
    stay so, F16/F64 ones are converted (a copy). Nothing may write into params in place.
    """
    path, fam = Path(path), fam or family(config.model_type)
    return map_params(path, config, checked_header(path, config, fam), fam)


def map_params(path: Path, config: Config, infos: dict[str, TensorInfo], fam: Family
               ) -> dict[str, np.ndarray]:
    """load_params after its header check: `infos` is checked_header(path, config, fam)."""
    wanted = [n for n in infos if not (n.removeprefix(fam.PREFIX)).endswith(fam.IGNORED)]
    files: dict[Path, list[str]] = {}
    for n in wanted:  # one file, or each shard of a sharded model
        files.setdefault(path.parent / infos[n].shard if infos[n].shard else path, []).append(n)
    tensors = {}
    lazy = fam.PLACES_BFLOAT16  # its converter widens bf16 in place
    for file, names in files.items():
        tensors.update(read_safetensors(file, names, lazy_bf16=lazy)[0])
    with _naming(path):
        return validate_params(tensors, config, fam)


def save_params(params: dict[str, np.ndarray], path: str | Path, config: Config,
                fam: Family | None = None) -> None:
    """Float32, in the family's own file layout (GPT-2: Hugging Face names, tied head
    omitted), so that `transformers` loads the folder. `fam`: the Model's family
    (model.family), or the one a new model's config names (a training run's, looked up once
    by the run)."""
    import numpy as np

    fam = fam or family(config.model_type)
    tensors = {n: np.ascontiguousarray(a, dtype=np.float32)
               for n, a in fam.params_to_file(params, config).items()}
    write_atomically(Path(path), safetensors_bytes(tensors, {"format": "pt"}))


@dataclass
class Model:
    """Everything one weights folder holds, loaded and checked."""

    folder: Path
    config: Config
    params: dict[str, np.ndarray]
    tokenizer: object  # tinygpt_cli.transformer.tokenizer.Tokenizer
    # its family's converter (families.Family), found once when the folder was opened: what
    # reads the model's names (its file's tensor names, its label) asks it, never the
    # model_type
    family: Family = field(repr=False, compare=False)
    file: Path | None = None  # a GGUF file's path (its folder is `folder`)
    about: dict | None = None  # what the GGUF says of itself (storage/gguf_file.description)

    @property
    def weights_file(self) -> Path:
        """model.safetensors, a sharded model's index, or the GGUF file (its sha256 names
        the model)."""
        return self.file if self.file is not None else weights_path(self.folder)


@dataclass
class Folder:
    """A weights folder's sizes and tokenizer, checked to agree with each other and with the
    weights file's header: all that turning text into ids and back needs (`encode`,
    `decode`), without reading the weights themselves."""

    folder: Path
    config: Config
    tokenizer: object  # tinygpt_cli.transformer.tokenizer.Tokenizer
    header: dict[str, TensorInfo]  # model.safetensors' header, checked against the config
    family: Family = field(repr=False, compare=False)  # looked up once, here, for the Model
    file: Path | None = None  # a GGUF file, read by gguf.py instead of the above
    about: dict | None = None
    gguf: tuple = ()  # its checked layout (the file mapped) and the tensors' entries


def _once(kind: str, folder, make, opened: dict | None):
    """make(folder), or what it made before when `opened` (the run context's folders opened
    once: `--each-line` runs a command per line, and reopening the folder (tokenizer,
    header, weights) took most of each line's time) holds it."""
    if opened is None:
        return make(folder)
    key = (kind, resolve_folder(folder)[0])
    if key not in opened:
        opened[key] = make(folder)
    return opened[key]


def open_folder(folder: str | Path | None = None, opened: dict | None = None) -> Folder:
    """A missing folder the user named is bad input (InputError, exit 2); a folder that
    exists but cannot be used, or a missing shipped model, is a WeightsError (exit 1).
    `opened`: folder -> Folder or Model, each opened once (see _once)."""
    return _once("folder", folder, _open_folder, opened)


def _open_folder(folder: str | Path | None) -> Folder:

    root, named = resolve_folder(folder)
    found = gguf_path(root) if root.exists() else None
    if found is not None:
        return _open_gguf(found)
    if not root.is_dir():
        if named and not root.exists() and not root.is_symlink():
            raise InputError(f"weights folder {root} does not exist")
        raise WeightsError(f"weights folder {root} " + _not_a_folder(root))
    weights = weights_path(root)
    for name in ("config.json", weights.name, "tokenizer.json"):
        path = root / name
        if not path.is_file():
            raise WeightsError(f"weights folder {root} has no {name}" if not path.exists()
                               and not path.is_symlink() else f"{path} {_not_a_file(path)}")
    try:
        config = load_config(root / "config.json")
    except (ValueError, OSError) as e:
        raise WeightsError(f"{root / 'config.json'}: {e}") from None
    # the weights' header too, though text <-> ids never reads them: a broken folder is
    # reported by every command alike
    fam = family(config.model_type)
    header = checked_header(weights, config, fam)
    tokenizer = read_tokenizer(root / "tokenizer.json", config)
    check_vocabulary(tokenizer, config, root)
    settings = read_side_json(root / "tokenizer_config.json")
    tokenizer.as_its_class_reads(settings)
    tokenizer.set_affix()
    generation = read_side_json(root / "generation_config.json") or {}
    if "eos_token_id" not in generation:  # transformers then takes the model config's
        generation = {"eos_token_id": (read_side_json(root / "config.json") or {}).get(
            "eos_token_id")}
    tokenizer.end_ids = end_ids(tokenizer, generation, settings)
    return Folder(root, config, tokenizer, header, fam)


def read_side_json(path: Path) -> dict | None:
    """A folder's optional JSON side file (tokenizer_config.json, generation_config.json), as
    a dict; None when the folder has none. Capped in size as tokenizer.json is: Gemma's
    tokenizer_config.json lists its 6,000 added tokens (1.2 MB)."""
    if not path.exists() and not path.is_symlink():
        return None
    raw = read_capped(path, MAX_TOKENIZER_BYTES)
    try:
        found = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise WeightsError(f"{path} is not valid JSON ({str(e).splitlines()[0][:200]})") from None
    if not isinstance(found, dict):
        raise WeightsError(f"{path} is not a JSON object")
    return found


def end_ids(tokenizer, generation: dict | None, settings: dict | None) -> tuple[int, ...]:
    """Where generation ends: every id of generation_config.json's eos_token_id (one or a
    list, as transformers' generate stops at each; without one, config.json's, as
    transformers makes the generation config from it), else the model's end token
    (eot_id), and the tokenizer's own eos_token (tokenizer_config.json's) besides. Ids
    outside the vocabulary can never be generated and are left out."""

    declared = (generation or {}).get("eos_token_id")
    declared = declared if isinstance(declared, list) else [declared]
    found = [i for i in declared if isinstance(i, int) and not isinstance(i, bool)
             and 0 <= i < tokenizer.n_rows] or [tokenizer.eot_id]
    name = special_name((settings or {}).get("eos_token"))
    named = tokenizer.special_tokens.get(name) if name is not None else None
    return tuple(dict.fromkeys([*found, *([named] if named is not None else [])]))


def _not_a_folder(path: Path) -> str:
    if path.is_symlink() and not path.exists():
        return "is a symbolic link that leads nowhere (a loop, or a missing target)"
    return "is not a folder" if path.exists() else "does not exist"


def _not_a_file(path: Path) -> str:
    if path.is_dir():
        return "is a folder, not a file"
    if path.is_symlink() and not path.exists():
        return "is a symbolic link that leads nowhere (a loop, or a missing target)"
    return "is not a regular file (a pipe or a device?)"


def load_model(folder: str | Path | None = None, opened: dict | None = None) -> Model:
    """open_folder, then the weights its header check let through."""
    return _once("model", folder, lambda f: _load_model(open_folder(f, opened)), opened)


def _open_gguf(path: Path) -> Folder:
    """A GGUF file: its metadata, tokenizer and tensor table checked (gguf.py); its
    tensors are read by _load_model."""
    from ..storage.gguf_file import check_types, description, open_layout
    from .gguf import architecture, check_tensors, hf_config
    from .gguf_vocab import build
    from .gguf_vocab import end_ids as gguf_end_ids

    if not path.is_file():
        raise WeightsError(f"{path} {_not_a_file(path)}")
    lay = open_layout(path)
    meta = lay.meta
    arch = architecture(meta, path)
    tokenizer, vocab_about = build(meta, path)
    table = next((t for t in lay.tensors if t.name == "token_embd.weight"), None)
    if table is None or len(table.dims) != 2:
        raise WeightsError(f"{path}: no token table (token_embd.weight of two dimensions)")
    try:
        config = config_from_dict(hf_config(arch, meta, {t.name for t in lay.tensors},
                                            table.dims[1]))
    except ValueError as e:
        raise WeightsError(f"{path}: {e}") from None
    entries = check_tensors(lay, config, path)
    check_types(lay, path)
    _check_gguf_vocabulary(tokenizer, config, path)
    tokenizer.end_ids = tuple(i for i in gguf_end_ids(meta) if i < tokenizer.n_rows)
    about = {**description(lay, meta), "tokenizer": vocab_about}
    return Folder(path.parent, config, tokenizer, {}, family(config.model_type), path, about,
                  (lay, entries))


def _check_gguf_vocabulary(tokenizer, config: Config, path: Path) -> None:
    """As check_vocabulary: every token a row of the model (a file may pad the rows)."""
    if tokenizer.vocab_size > config.vocab_size:
        raise WeightsError(f"{path}: its tokenizer has {tokenizer.vocab_size:,} tokens but the "
                           f"token table {config.vocab_size:,} rows")
    if tokenizer.vocab_size < config.vocab_size:
        tokenizer.rows = config.vocab_size
    tokenizer.ends_with(config.eos_token_id)


def _load_model(f: Folder) -> Model:
    from . import float32_copy  # here: its cache helpers load NumPy, which encode never needs

    if f.file is not None:
        from .gguf import read_params

        lay, entries = f.gguf
        params = float32_copy.loaded([f.file], f.config, f.family.MODEL_TYPE,
                                     lambda: read_params(f.file, lay, f.config, entries))
        return Model(f.folder, f.config, params, f.tokenizer, f.family, f.file, f.about)
    path = weights_path(f.folder)
    shards = sorted({path.parent / i.shard for i in f.header.values() if i.shard})
    params = float32_copy.loaded([path, *shards, f.folder / "config.json"], f.config,
                                 f.family.MODEL_TYPE,
                                 lambda: map_params(path, f.config, f.header, f.family))
    return Model(f.folder, f.config, params, f.tokenizer, f.family)


MAX_TOKENIZER_BYTES = 16 << 20  # GPT-2's own, 50,257 tokens with their merges: 1.4 MB
# a larger vocabulary's file may be larger: Gemma 3's 262,144 tokens and 514,906 merges,
# written with an indent, are 33.4 MB (127 bytes a token)
TOKENIZER_BYTES_A_TOKEN = 256


def tokenizer_cap(vocab_size: int) -> int:
    """The most bytes a tokenizer.json of this many tokens is read to."""
    return max(MAX_TOKENIZER_BYTES, TOKENIZER_BYTES_A_TOKEN * vocab_size)


def read_capped(path: Path, limit: int, why: str = "") -> bytes:
    """A side file's bytes, reading no further than `limit` (a lying file cannot make us hold
    more); WeightsError when it cannot be read or is larger (`why` says what that means)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(limit + 1)
    except OSError as e:
        raise WeightsError(f"cannot read {path}: {e.strerror or e}") from None
    if len(raw) > limit:
        raise WeightsError(f"{path} is larger than {limit:,} bytes{why}")
    return raw


def read_tokenizer(path: Path, config: Config):
    """tokenizer.json, capped in size like config.json, and refused unless its tokens are
    bytes (a byte-level BPE, or a BPE with byte fallback), which every view assumes."""

    raw = read_capped(path, tokenizer_cap(config.vocab_size),
                      f": not the tokenizer of a {config.vocab_size:,}-token model")
    try:
        tokenizer = Tokenizer.from_bytes(raw)
    except Exception as e:  # tokenizers raises a bare Exception on malformed files
        raise WeightsError(f"{path} is not a tokenizers file ({e})") from None
    kind = tokenizer.kind()
    if kind is not None:
        raise WeightsError(f"{path} is not a tokenizer whose tokens are bytes ({kind}); tinygpt "
                           "reads byte-level BPE (GPT-2's kind) and SentencePiece-style BPE with "
                           "byte fallback (Llama 2's, Gemma's)")
    return tokenizer


def check_vocabulary(tokenizer, config: Config, root: Path) -> None:
    """The tokenizer and the model must agree on the vocabulary: a larger tokenizer yields ids
    the model has no row for. A smaller one is another family's padding (Pythia's 50,277
    tokens on 50,304 rows, Qwen's): the rows past its last token are kept as rows no text
    names (tokenizer.rows); GPT-2's own files have none, and a GPT-2 folder with them is
    refused as before. A larger one is accepted only when the tokens past the model's rows
    are added tokens of the tokenizer alone (Gemma 3's special <image_soft_token>, id 262,144
    on 262,144 rows, which only its vision tower reads): a text naming one is refused."""
    padded = tokenizer.vocab_size < config.vocab_size and config.model_type != "gpt2"
    beyond = tokenizer.vocab_size > config.vocab_size and tokenizer.only_added_past(
        config.vocab_size)
    if tokenizer.vocab_size != config.vocab_size and not (padded or beyond):
        raise WeightsError(
            f"tokenizer has {tokenizer.vocab_size:,} tokens but the model "
            f"{config.vocab_size:,} (vocab_size in config.json): {root / 'tokenizer.json'} "
            "does not belong to these weights")
    if padded or beyond:
        tokenizer.rows = config.vocab_size
    last = tokenizer.vocab_size - 1
    if not tokenizer.ids_are_0_to(last):  # each id names a row of the model
        raise WeightsError(f"{root / 'tokenizer.json'}: its token ids are not 0 to {last:,} "
                           f"(the model's rows): it does not belong to these weights")
    tokenizer.ends_with(config.eos_token_id)
    try:
        _ = tokenizer.eot_id  # generation and training stop on it
    except ValueError as e:
        raise WeightsError(f"{root / 'tokenizer.json'}: {e}") from None
