"""Text files of stories -> one stream of token ids -> (B, T) windows."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..tokenizer import END_OF_TEXT, Tokenizer


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


@dataclass
class TokenStream:
    ids: np.ndarray  # uint16 [N]: story, <|endoftext|>, story, <|endoftext|>, ...
    n_bytes: int  # UTF-8 bytes the ids stand for (each separator counts as one byte, a newline)

    @property
    def bytes_per_token(self) -> float:
        return self.n_bytes / max(len(self.ids), 1)


def encode_stories(stories: list[str], tokenizer: Tokenizer) -> TokenStream:
    eot = tokenizer.eot_id
    out: list[int] = []
    for ids in tokenizer.encode_batch(stories):
        out += ids
        out.append(eot)
    n_bytes = sum(len(s.encode("utf-8")) + 1 for s in stories)
    return TokenStream(np.asarray(out, dtype=np.uint16), n_bytes)


def random_windows(stream: np.ndarray, batch: int, t: int, rng: np.random.Generator):
    """B windows of t+1 tokens at random offsets -> (inputs [B, t], targets [B, t])."""
    starts = rng.integers(0, len(stream) - t - 1, size=batch)
    w = stream[starts[:, None] + np.arange(t + 1)].astype(np.int64)
    return w[:, :-1], w[:, 1:]


def eval_windows(stream: np.ndarray, t: int) -> tuple[np.ndarray, np.ndarray]:
    """Consecutive non-overlapping windows covering the stream once."""
    n = (len(stream) - 1) // t
    x = stream[: n * t].reshape(n, t).astype(np.int64)
    y = stream[1 : n * t + 1].reshape(n, t).astype(np.int64)
    return x, y
