"""The training text: story files read and checked, the data record a trained folder keeps
(data.json), the shipped text unpacked, and the windows of a text the commands search. The
stream of ids and its windows, which need no file, are transformer/windows.py's."""

from __future__ import annotations

import hashlib
import json
import lzma
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError, WeightsError, WriteError
from ..errors import InputError as Refused
from ..storage import cache
from ..storage.files import sha256, write_atomically
from ..storage.locations import SHIPPED
from ..transformer.tokenizer import END_OF_TEXT, Tokenizer
from ..transformer.windows import encode_stories, eval_windows


class TrainingDataError(InputError):
    """Data that cannot train the model (not UTF-8 text, too short for one window); exit 2,
    from every command that reads training data (train, why, neurons, means, score)."""


def read_text_file(path: Path) -> str:
    """A data file as text: UTF-8, no NUL bytes (which mark binary files and UTF-16)."""
    if not Path(path).is_file():  # a FIFO would block the read, a folder fail it
        raise TrainingDataError(f"cannot read {path}: it is not a regular file")
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise TrainingDataError(f"cannot read {path}: {e.strerror or e}") from None
    if data.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\x00" in data:
        kind = "UTF-16" if data[:2] in (b"\xff\xfe", b"\xfe\xff") or \
            data[1::2].count(0) > len(data) // 4 else "binary"
        raise TrainingDataError(f"{path} looks {kind}, not UTF-8 text: convert it first "
                                "(e.g. iconv -f UTF-16 -t UTF-8)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TrainingDataError(f"{path} is not UTF-8 text (byte 0x{data[e.start]:02x} at "
                                f"offset {e.start}): convert it first") from None


def read_user_file(path: Path, option: str) -> str:
    """A user's text file (--pos, --labels), UTF-8; the error names the option."""
    if not path.is_file():
        raise InputError(f"{option} {path}: no such file")
    data = path.read_bytes()
    try:
        return data.decode("utf-8").replace("\r\n", "\n")
    except UnicodeDecodeError as e:
        raise InputError(f"{option} {path}: not UTF-8 text (byte 0x{data[e.start]:02x} at "
                         f"offset {e.start})") from None


def read_stories(files: list[Path]) -> list[str]:
    """Stories are separated by a line holding exactly `<|endoftext|>`."""
    stories = []
    for f in files:
        text = read_text_file(f)
        for part in text.split(END_OF_TEXT):
            part = part.strip("\n")
            if part.strip():
                stories.append(part)
    return stories


def ends_with_separator(path: Path) -> bool:
    """Does the file's text end with `<|endoftext|>` (then only white space)? Read from its end:
    a file's last story is closed by a separator in the file, or only by one a reader adds."""
    size = Path(path).stat().st_size
    tail = 4096
    with open(path, "rb") as f:
        while True:
            f.seek(max(0, size - tail))
            end = f.read().rstrip()
            if end or tail >= size:  # white space all the way back: read further back
                return end.endswith(END_OF_TEXT.encode())
            tail *= 16


def split_data(paths: list[Path], val: Path | None = None) -> tuple[list[Path], list[Path]]:
    """A folder's part-*.txt files (or any *.txt); the last is held out unless `val` is given."""
    files: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            found = sorted(p.glob("part-*.txt")) or sorted(p.glob("*.txt"))
            if not found:
                raise ValueError(f"{p} holds no .txt files")
            files += found
        elif p.is_file():
            files.append(p)
        elif p.exists():
            raise ValueError(f"{p} is neither a folder nor a regular file")
        else:
            raise ValueError(f"{p} does not exist")
    for f in files:  # a FIFO or a device named part-000.txt would block the first read
        if not f.is_file():
            raise ValueError(f"{f} is not a regular file")
    if val is not None:
        if not Path(val).is_file():
            raise ValueError(f"validation file {val} does not exist")
        val_files = [Path(val)]
        train = [f for f in files if f.resolve() != Path(val).resolve()]
    elif len(files) >= 2:
        train, val_files = files[:-1], files[-1:]
    else:
        train, val_files = files, []
    return train, val_files


# ------------------------------------------------------------------ the data record
#
# A weights folder written by `train` names the files it learned from (data.json: names,
# sizes, sha256, and where the folder was), so that `why`, `neurons`, `means` and `score
# --stream` can find the training text without --data, and refuse text the model never saw.

DATA_RECORD = "data.json"
RECORD_FORMAT = 1


def file_record(path: Path) -> dict:

    return {"name": path.name, "bytes": path.stat().st_size, "sha256": sha256(path)}


def data_record(train_files: list[Path], val_files: list[Path], weights: Path) -> dict:
    """What `train` writes: the training and validation files, and their folder as a path
    relative to the weights folder (so the record survives moving both together) and as an
    absolute one."""

    folder = Path(train_files[0]).resolve().parent if train_files else None
    return {
        "format": RECORD_FORMAT,
        "folder": os.path.relpath(folder, Path(weights).resolve()) if folder else None,
        "folder_absolute": str(folder) if folder else None,
        "train": [file_record(Path(f)) for f in train_files],
        "validation": [file_record(Path(f)) for f in val_files],
    }


def write_data_record(weights: Path, train_files: list[Path], val_files: list[Path]) -> None:


    record = data_record(train_files, val_files, weights)
    write_atomically(Path(weights) / DATA_RECORD,
                     (json.dumps(record, indent=2) + "\n").encode("utf-8"))


def read_data_record(weights: Path) -> dict | None:
    """The folder's record, None when it has none (trained before records existed); a record
    that cannot be read is a broken weights folder (WeightsError, exit 1)."""


    path = Path(weights) / DATA_RECORD
    if not (path.exists() or path.is_symlink()):
        return None
    try:
        if not path.is_file() or path.stat().st_size > 1 << 20:
            raise ValueError("not a small regular file")
        record = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(record, dict):
            raise ValueError("it is not a JSON object")
        for key in ("folder", "folder_absolute"):
            if not isinstance(record.get(key), str | None):
                raise ValueError(f"{key} must be a path or null, not {record.get(key)!r:.40}")
        files = record["train"] + record["validation"]
        if not all(isinstance(f["name"], str) and isinstance(f["bytes"], int)
                   and isinstance(f["sha256"], str) for f in files):
            raise ValueError("a file entry lacks its name, bytes or sha256")
        if "/" in "".join(f["name"] for f in files) or not record["train"]:
            raise ValueError("file names must be plain names, and there must be training files")
    except RecursionError:
        raise WeightsError(f"{path} is not a readable data record (it is nested too deep): "
                           "remove it, or retrain") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise WeightsError(f"{path} is not a readable data record ({e}): remove it, or "
                           "retrain") from None
    return record


def recorded_folder(weights: Path, record: dict) -> Path | None:
    """Where the recorded training files are now: beside the weights as recorded, else at the
    absolute path recorded, else the project's data folder ($TINYGPT_DATA, or the layout
    find_data knows: an installed package's weights are far from the data) when its files
    are the recorded ones byte for byte; None when none holds them."""
    for base in (Path(weights) / record["folder"] if record.get("folder") else None,
                 Path(record["folder_absolute"]) if record.get("folder_absolute") else None):
        if base is not None and all((base / f["name"]).is_file() for f in record["train"]):
            return base
    found = find_data()
    if found is not None and found.is_dir() and all(
            (found / f["name"]).is_file() for f in record["train"]) and differs_from_record(
            [found / f["name"] for f in record["train"]], record) is None:
        return found
    return None


def differs_from_record(files: list[Path], record: dict) -> str | None:
    """Why these training files are not the recorded ones (the first difference), or None."""
    want = {f["name"]: f for f in record["train"]}
    have = {Path(f).name: Path(f) for f in files}
    for name in want:
        if name not in have:
            return f"{name} is recorded but missing"
    for name, path in have.items():
        if name not in want:
            return f"{path} is not in the record"
        if path.stat().st_size != want[name]["bytes"]:
            return f"{path} differs from the record ({path.stat().st_size:,} bytes, " \
                f"recorded {want[name]['bytes']:,})"
        if file_record(path)["sha256"] != want[name]["sha256"]:
            return f"{path} differs from the record (its sha256 is not the recorded one)"
    return None


@dataclass
class TrainingText:
    """The training files a command reads, and the note to print about how they were found."""

    files: list[Path]
    note: str | None = None


def training_text(weights: Path, data: list[Path] | None, *, any_data: bool = False
                  ) -> TrainingText:
    """The files a weights folder was trained on: from --data (checked against the record
    unless any_data), or, without --data, from the record's folder."""

    record = read_data_record(weights)
    shown = Path(weights) / DATA_RECORD
    if not data:
        if record is None:
            raise Refused(f"give --data the folder of part-*.txt files the model was trained "
                          f"on: {weights} has no record of it ({DATA_RECORD})")
        folder = recorded_folder(weights, record)
        if folder is None:
            raise Refused(f"the training text recorded in {shown} is not reachable (looked in "
                          f"{Path(weights) / record['folder']} and $TINYGPT_DATA): give --data "
                          "its folder, or set TINYGPT_DATA to it")
        files = [folder / f["name"] for f in record["train"]]
        why = None if any_data else differs_from_record(files, record)
        if why is not None:
            raise Refused(f"the training text recorded in {shown} has changed since training: "
                          f"{why}; give --data the text the model was trained on, or pass "
                          "--any-data to use it anyway")
        return TrainingText(files)
    missing = [p for p in data if not Path(p).exists()]
    if missing:
        raise Refused(f"training data {missing[0]} does not exist: give --data the folder of "
                      "part-*.txt files the model was trained on")
    try:
        files, _ = split_data(data)
    except ValueError as e:
        raise Refused(f"{e}: give --data the folder the model was trained on") from None
    return TrainingText(files, check_data(weights, files, any_data=any_data, whole=True))


def unrecorded(files: list[Path], record: dict,
               kinds: tuple[str, ...] = ("train", "validation")) -> str | None:
    """Why one of these files is not one the record lists under `kinds` (the first
    difference), or None."""
    want = {f["name"]: f for kind in kinds for f in record[kind]}
    listed = {f["name"]: kind for kind in ("train", "validation") for f in record[kind]}
    for path in map(Path, files):
        if path.name not in want:
            if path.name in listed:
                named = {"train": "training", "validation": "validation"}
                return (f"{path} is recorded as {named[listed[path.name]]} text, not "
                        f"{named[kinds[0]]} text")
            return f"{path} is not in the record"
        if path.stat().st_size != want[path.name]["bytes"]:
            return f"{path} differs from the record ({path.stat().st_size:,} bytes, " \
                f"recorded {want[path.name]['bytes']:,})"
        if file_record(path)["sha256"] != want[path.name]["sha256"]:
            return f"{path} differs from the record (its sha256 is not the recorded one)"
    return None


def check_data(weights: Path, files: list[Path], *, any_data: bool = False,
               kinds: tuple[str, ...] = ("train", "validation"), whole: bool = False
               ) -> str | None:
    """Files given with --data, checked against the weights' record of its text, the files
    it lists under `kinds` (`whole`: exactly the recorded training files, as TracIn needs
    them all); refused when one differs, unless any_data. The note to print when there is
    no record."""

    record = read_data_record(weights)
    if record is None:
        return (f"note: {weights} has no record of its training text ({DATA_RECORD}, which "
                "tinygpt train writes): using --data as given")
    why = None if any_data else \
        differs_from_record(files, record) if whole else unrecorded(files, record, kinds)
    if why is not None:
        what = "the text these weights were trained on" if "train" in kinds else \
            "the held-out text these weights record"
        raise Refused(f"--data is not {what}: {why} ({Path(weights) / DATA_RECORD}); pass "
                      "--any-data to use it anyway")
    return None


def validation_text(weights: Path, data: Path | None) -> list[Path]:
    """The held-out text: a given file itself, a given folder's last part, or (without
    --data) the validation files the weights' record names, in its folder."""

    if data is None:
        record = read_data_record(weights)
        folder = recorded_folder(weights, record) if record else None
        if folder is None or not record["validation"]:
            why = "has no record of its text" if record is None else \
                "records a text that is not reachable, or no validation file"
            raise Refused(f"give --data the folder of part-*.txt files (its last part is the "
                          f"validation text), or set TINYGPT_DATA to it: {weights} {why}")
        files = [folder / f["name"] for f in record["validation"]]
        why = unrecorded(files, record, ("validation",))
        if why is not None:
            raise Refused(f"the validation text recorded in {Path(weights) / DATA_RECORD} has "
                          f"changed since training: {why}; give --data the held-out text")
        return files
    if Path(data).is_file():
        return [Path(data)]  # the reference text itself
    try:
        _, val = split_data([data])
    except ValueError as e:
        raise Refused(str(e)) from None
    if not val:
        raise Refused(f"{data} holds a single text file: give that file itself, or a folder "
                      "whose last part-*.txt is the validation text")
    return val


# ------------------------------------------------------------------ the project's data folder
#
# Commands that read stories without being told where (heads, neurons, sae, the tuned lens,
# steer) look for the project's data, laid out next to the checkout.

BUILT_IN = [  # when no text is given and the project's data folder is not there
    "Lily and Tom went to the park. Lily saw a big red ball. Tom saw the ball too. "
    "Lily gave the ball to Tom, and Tom gave the ball to Lily.",
    "Once upon a time, there was a little cat named Tim. Tim liked to play. One day, Tim "
    "saw a bird. The bird was in a tree. Tim wanted to play with the bird.",
    "Sue had a doll. The doll was pink. Sue loved her pink doll. Every day Sue and her doll "
    "had tea. Sue said, \"I love you, doll.\"",
]
HELD_OUT_PART = "part-005.txt"


def find_data() -> Path | None:
    """$TINYGPT_DATA, else shared/data/tinystories beside an ancestor of this package or of
    the working directory (the project's layout: the data lives next to the checkout), else
    the text shipped with the model, unpacked (an installed package has no checkout)."""

    env = os.environ.get("TINYGPT_DATA")
    if env:
        return Path(env).expanduser()
    return beside_checkout() or shipped_text()


def beside_checkout() -> Path | None:
    """shared/data/tinystories beside an ancestor of this package or of the working
    directory, where the project keeps it; None elsewhere (an installed package)."""
    for base in (Path(__file__).resolve(), Path.cwd().resolve()):
        for parent in base.parents:
            folder = parent / "shared" / "data" / "tinystories"
            if folder.is_dir():
                return folder
    return None


# ------------------------------------------------------------------ the text shipped with it
#
# The shipped model's training and held-out text travels inside the package, compressed
# (weights/tinystories: part-*.txt.xz, the manifest text.json of the uncompressed files, and
# the CDLA-Sharing-1.0 licence note and sources beside them; scripts/pack_text.py makes it).
# The commands read files, checked against data records by size and sha256, so the text is
# unpacked once into the cache, each file checked against the manifest as it is written and
# again each time it is found there.

SHIPPED_TEXT = "tinystories"
TEXT_MANIFEST = "text.json"


def shipped_text_folder() -> Path:

    return SHIPPED / SHIPPED_TEXT


def shipped_text() -> Path | None:
    """The folder of the shipped text's part-*.txt files, unpacked into the cache when they
    are not there yet; None when the package ships no text. A damaged compressed file or
    manifest is a broken installation (WeightsError, exit 1)."""

    packed = shipped_text_folder()
    manifest = read_text_manifest(packed)
    if manifest is None:
        return None
    raw = (packed / TEXT_MANIFEST).read_bytes()
    folder = cache.cache_dir() / "text" / cache.key_of(raw)
    for f in manifest:
        target = folder / f["name"]
        if target.is_file() and target.stat().st_size == f["bytes"] and \
                sha256(target) == f["sha256"]:
            continue
        try:
            write_atomically(target, unpacked(packed / f"{f['name']}.xz", f))
        except WriteError as e:
            raise WriteError(f"{e}: the shipped text is unpacked into the cache once; set "
                             "TINYGPT_CACHE to a writable folder, or TINYGPT_DATA to a folder "
                             "of part-*.txt") from None
    return folder


def read_text_manifest(packed: Path) -> list[dict] | None:
    """The shipped text's files (name, bytes, sha256 of each uncompressed file), None when
    there is no manifest."""


    path = packed / TEXT_MANIFEST
    if not path.exists():
        return None
    try:
        files = json.loads(path.read_text(encoding="utf-8"))["files"]
        if not files or not all(
                isinstance(f["name"], str) and "/" not in f["name"] and f["name"]
                and isinstance(f["bytes"], int) and isinstance(f["sha256"], str)
                for f in files):
            raise ValueError("a file entry lacks its name, bytes or sha256")
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
        raise WeightsError(f"{path} is not a readable manifest of the shipped text ({e}): "
                           "reinstall tinygpt-cli, or set TINYGPT_DATA to a folder of "
                           "part-*.txt") from None
    return files


def unpacked(path: Path, entry: dict) -> bytes:
    """One shipped file's text, checked against its manifest entry."""


    try:
        data = lzma.decompress(path.read_bytes(), format=lzma.FORMAT_XZ)
        if len(data) != entry["bytes"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise ValueError("it unpacks to a text other than the one its manifest records")
    except (OSError, lzma.LZMAError, EOFError, ValueError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e) or "truncated"
        raise WeightsError(f"the shipped text {path} is damaged ({reason}): reinstall "
                           "tinygpt-cli, or set TINYGPT_DATA to a folder of part-*.txt") from None
    return data


def stories_of(path: Path) -> list[str]:
    """The stories of one file the user named; the errors say what is wrong with it."""
    if not path.is_file():
        raise InputError(f"{path} " + ("is not a file" if path.exists() else "does not exist"))
    try:
        stories = read_stories([path])
    except UnicodeDecodeError as e:
        raise InputError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not stories:
        raise InputError(f"{path} holds no text")
    return stories


def split_or_refuse(paths: list[Path], val: Path | None = None
                    ) -> tuple[list[Path], list[Path]]:
    """split_data, its refusals as InputError (exit 2): what the user gave is wrong."""
    try:
        return split_data(paths, val)
    except ValueError as e:
        raise InputError(str(e)) from None


def training_files(data: Path | None) -> list[Path]:
    """Every part of --data (default: the project's data) but the last, the held-out one."""
    found = data if data is not None else find_data()
    if found is None:
        raise InputError("no training data found: give --data DIR (a folder of part-*.txt), "
                         "or set TINYGPT_DATA to it")
    return split_or_refuse([found])[0]


def held_out_files(data: Path | None) -> list[Path]:
    """The last part of --data (default: the project's data), or the one file it holds."""
    found = data if data is not None else find_data()
    if found is None:
        raise InputError("no held-out data found: give --data FILE (e.g. part-005.txt), or set "
                         "TINYGPT_DATA to the folder of part-*.txt")
    train, val = split_or_refuse([found])
    return val or train


def given_or(data: Path | None, folder_files) -> list[Path]:
    """--data itself when it names one file, else `folder_files(data)` (a folder's parts);
    InputError naming --data when it is neither (split_data's own words)."""
    if data is None or Path(data).is_dir():
        return folder_files(data)
    if not Path(data).is_file():
        raise InputError(f"--data {data}: " + ("is neither a folder nor a regular file"
                                               if Path(data).exists() else "does not exist"))
    return [Path(data)]


def search_files(data: Path | None, weights: Path, *, any_data: bool = False
                 ) -> tuple[list[Path], str | None]:
    """The stories searched for examples (neurons --neuron): --data's training parts (a file
    of --data is itself searched; either checked against the weights' record unless
    any_data), else the training text the weights record, else the project's data; and the
    note to print when the weights record no text."""
    record = read_data_record(weights) if data is None else None
    if record is not None and recorded_folder(weights, record) is not None:
        return training_text(weights, None).files, None  # the text the weights record
    if data is None:
        found = find_data()
        if found is None or not found.is_dir():
            raise InputError("--neuron needs --data: a file or folder of stories to search")
        return split_or_refuse([found])[0], None
    train, val = split_or_refuse([data])
    files = train if Path(data).is_dir() and train else train + val
    return files, check_data(weights, files, any_data=any_data)


def data_windows(files: list[Path], tokenizer: Tokenizer, context: int, count: int | None,
                 bar=None) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) [W, T]: `count` windows spread evenly over the files' token stream.
    bar(total, description): a progress bar over the encoding (seconds for the shipped
    text), so that a long job shows it is moving from its start."""
    stories = read_stories(files)
    if bar is None:
        stream = encode_stories(stories, tokenizer)
    else:
        with bar(len(stories), "reading the text") as advance:
            stream = encode_stories(stories, tokenizer, advance)
    x, y = eval_windows(stream.ids, context)
    if len(x) == 0:
        raise InputError(f"the data has {len(stream.ids)} tokens, less than one window of "
                         f"{context}")
    if count is not None and count < len(x):
        pick = np.linspace(0, len(x) - 1, count).round().astype(int)
        x, y = x[pick], y[pick]
    return x, y


def held_out_stories(tokenizer: Tokenizer, context: int, data: Path | None, stories: int
                     ) -> list[list[int]]:
    """The first `stories` stories of part-005.txt as ids (<|endoftext|> first), each cut to
    the context plus one; [] when there is no data folder."""
    folder = data if data is not None else find_data()
    part = folder / HELD_OUT_PART if folder is not None else None
    if part is None or not part.is_file():
        if data is not None:
            raise InputError(f"--data {data}: no {HELD_OUT_PART} there")
        return []
    texts = read_stories([part])[:stories]
    return [([tokenizer.eot_id] + ids)[:context + 1] for ids in tokenizer.encode_batch(texts)]
