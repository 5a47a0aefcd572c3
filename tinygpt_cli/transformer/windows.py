"""Stories as one stream of token ids, and the stream cut into windows of the model's context:
arrays alone (no file), for the training loop and the analyses of a corpus alike."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .tokenizer import Tokenizer


@dataclass
class TokenStream:
    ids: np.ndarray  # uint16 [N]: story, <|endoftext|>, story, <|endoftext|>, ...
    n_bytes: int  # UTF-8 bytes the ids stand for (each separator counts as one byte, a newline)

    @property
    def bytes_per_token(self) -> float:
        return self.n_bytes / max(len(self.ids), 1)


def encode_stories(stories: list[str], tokenizer: Tokenizer, progress=None) -> TokenStream:
    """The stories' ids, each followed by <|endoftext|>; progress(n) after each batch of
    stories encoded."""
    eot = tokenizer.eot_id
    out: list[int] = []
    for start in range(0, len(stories), STORIES_PER_BATCH):
        batch = stories[start:start + STORIES_PER_BATCH]
        for ids in tokenizer.encode_batch(batch):
            out += ids
            out.append(eot)
        if progress is not None:
            progress(len(batch))
    n_bytes = sum(len(s.encode("utf-8")) + 1 for s in stories)
    return TokenStream(np.asarray(out, dtype=np.uint16), n_bytes)


STORIES_PER_BATCH = 512  # a fraction of a second of encoding: the progress moves often


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
