"""Where a prediction came from: exact matches in the training text, and TracIn influence.

1. Exact matches. A suffix array over the training token stream (every suffix's start, sorted
   by its first DEPTH tokens) answers "how often does this token sequence occur" with two
   binary searches. For n = 1 .. 8 we count the text's last n tokens, and how often the target
   follows them; the longest tail of the text seen verbatim tells a memorised continuation
   from a generalised one.

2. TracIn (Pruthi et al. 2020). The training stream is cut into non-overlapping windows of the
   model's context. A window's influence on the prediction is

       score(w) = sum over snapshots s of lr_s * < grad loss(w; s), grad -log p(target | text; s) >

   where loss(w) is the window's mean next-token cross-entropy: a gradient step on the window
   lowers -log p(target) (raises the target's chance) by about lr_s times that dot product, so
   positive scores are the windows that taught the prediction ("proponents"). Gradients are
   compared through a CountSketch (a seeded hash of every parameter to one of k buckets with a
   random sign; E<Sa, Sb> = <a, b>), so each window keeps k numbers per snapshot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .. import ops
from ..config import Config
from ..hooks import Record
from ..model import backward, forward, loss_and_grads
from ..train.data import TrainingDataError

N_MAX = 8  # the longest tail counted in the exact-match table
DEPTH = 256  # suffixes are sorted by this many tokens: more than any query (n_ctx + 1)
SKETCH_DIM = 1024  # noise of a sketched dot product ~ |a| |b| / sqrt(k)
POOL = 2  # the top windows are chosen among POOL * top by sketch, then ranked exactly
SKETCH_SEED = 0

Progress = Callable[[int], None]


# ------------------------------------------------------------------ 1. exact matches


def suffix_array(stream: np.ndarray, depth: int = DEPTH,
                 on_round: Progress | None = None) -> np.ndarray:
    """Start positions of all suffixes, sorted by their first `depth` tokens (prefix doubling).

    Each round sorts by twice as many tokens: key = (rank of the first k, rank of the next k),
    the end of the stream ranking below every token.  [N] -> [N] int64
    """
    n = len(stream)
    rank = stream.astype(np.int64) + 1  # 0 is reserved for "past the end"
    order = np.argsort(rank, kind="stable")
    k = 1
    while k < depth:
        after = np.zeros(n, np.int64)
        after[: max(n - k, 0)] = rank[k:]
        key = rank * (n + 2) + after
        order = np.argsort(key, kind="stable")
        sorted_key = key[order]
        rank = np.empty(n, np.int64)
        rank[order] = np.concatenate([[1], 1 + np.cumsum(sorted_key[1:] != sorted_key[:-1])])
        k *= 2
        if on_round:
            on_round(1)
        if rank.max() == n:  # every suffix already distinct
            break
    return order


def rounds(depth: int = DEPTH) -> int:
    """How many doubling rounds suffix_array does at most (for a progress bar)."""
    return max(int(np.ceil(np.log2(depth))), 1)


def occurrences(stream: np.ndarray, sa: np.ndarray, pattern: list[int]) -> tuple[int, int]:
    """The range [lo, hi) of the suffix array whose suffixes start with `pattern`."""
    m = len(pattern)

    def prefix(i: int) -> list[int]:
        return stream[sa[i] : sa[i] + m].tolist()

    lo, hi = 0, len(sa)
    while lo < hi:  # first suffix >= pattern
        mid = (lo + hi) // 2
        if prefix(mid) < pattern:
            lo = mid + 1
        else:
            hi = mid
    start, hi = lo, len(sa)
    while lo < hi:  # first suffix whose prefix > pattern
        mid = (lo + hi) // 2
        if prefix(mid) <= pattern:
            lo = mid + 1
        else:
            hi = mid
    return start, lo


def count(stream: np.ndarray, sa: np.ndarray, pattern: list[int]) -> int:
    lo, hi = occurrences(stream, sa, list(pattern))
    return hi - lo


def exact_matches(stream, sa, ids: list[int], target: int, n_max: int = N_MAX) -> list[dict]:
    """For n = 1 .. n_max: how often the last n tokens occur, and how often the target follows."""
    rows = []
    for n in range(1, min(n_max, len(ids)) + 1):
        tail = list(ids[-n:])
        seen = count(stream, sa, tail)
        followed = count(stream, sa, tail + [target]) if seen else 0
        rows.append({"n": n, "context": tail, "count": seen, "followed_by_target": followed,
                     "fraction": followed / seen if seen else None})
    return rows


def longest_seen(stream, sa, ids: list[int], target: int | None = None) -> int:
    """The longest n such that the text's last n tokens (then the target, if given) occur."""
    best = 0
    for n in range(1, len(ids) + 1):
        tail = list(ids[-n:]) + ([target] if target is not None else [])
        if count(stream, sa, tail) == 0:
            break
        best = n
    return best


# ------------------------------------------------------------------ 2. TracIn


def windows(stream: np.ndarray, t: int) -> tuple[np.ndarray, np.ndarray]:
    """Non-overlapping windows covering the stream: inputs and targets.  -> [W, t] each"""
    n = (len(stream) - 1) // t
    x = stream[: n * t].reshape(n, t).astype(np.int64)
    y = stream[1 : n * t + 1].reshape(n, t).astype(np.int64)
    return x, y


def choose_windows(x: np.ndarray, last_id: int, limit: int, seed: int = 0) -> np.ndarray:
    """Which windows to score when not all of them: those holding the text's last token come
    first, then the others, each group in one fixed seeded order (so queries share cached
    windows); limit <= 0 means all.  -> sorted window indices"""
    n = len(x)
    if limit <= 0 or limit >= n:
        return np.arange(n)
    order = np.random.default_rng(seed).permutation(n)
    holds = (x[order] == last_id).any(axis=1)
    ranked = np.concatenate([order[holds], order[~holds]])
    return np.sort(ranked[:limit])


@dataclass
class CountSketch:
    """A seeded linear map from every parameter to k numbers: bucket h(i), sign s(i).

    sketch(g)[b] = sum over i with h(i) = b of s(i) g_i; E<sketch(a), sketch(b)> = <a, b>.
    """

    names: list[str]
    k: int
    bucket: np.ndarray  # [P] int64
    sign: np.ndarray  # [P] float64

    @classmethod
    def for_params(cls, params: dict[str, np.ndarray], k: int = SKETCH_DIM,
                   seed: int = SKETCH_SEED) -> CountSketch:
        names = sorted(params)
        total = sum(params[n].size for n in names)
        rng = np.random.default_rng(seed)
        return cls(names, k, rng.integers(0, k, size=total),
                   rng.choice(np.array([-1.0, 1.0]), size=total))

    def __call__(self, grads: dict[str, np.ndarray]) -> np.ndarray:
        """[k] for the gradient dict (parameters in sorted-name order)."""
        return np.bincount(self.bucket, weights=flatten(grads, self.names) * self.sign,
                           minlength=self.k)


def flatten(grads: dict[str, np.ndarray], names: list[str]) -> np.ndarray:
    return np.concatenate([np.ravel(grads[n]) for n in names]).astype(np.float64)


def window_gradient(params, config: Config, x: np.ndarray, y: np.ndarray):
    """d mean cross-entropy of one window / d params (no dropout)."""
    _, grads = loss_and_grads(params, config, x[None], y[None])
    return grads


def query_gradient(params, config: Config, ids: list[int], target: int):
    """d -log p(target | text) / d params, through the project's own backward pass."""
    rec = Record()
    logits = forward(params, config, np.asarray(ids), hooks=rec)
    dlogits = np.zeros_like(logits)
    dlogits[-1] = ops.softmax(logits[-1])  # d(-log p_y)/dz = softmax(z) - onehot(y)
    dlogits[-1, target] -= 1.0
    grads, _ = backward(params, config, rec.values, dlogits)
    return grads


def tracin_scores(window_sketches: np.ndarray, query_sketches: np.ndarray,
                  lrs: np.ndarray) -> np.ndarray:
    """Per snapshot lr_s <S g_w, S g_q>.  [S, W, k], [S, k], [S] -> [S, W] (sum over S: score)"""
    return lrs[:, None] * np.einsum("swk,sk->sw", window_sketches, query_sketches)


def token_contributions(params, config: Config, x: np.ndarray, y: np.ndarray, query: dict,
                        eps: float | None = None, chunk: int = 8) -> np.ndarray:
    """Each predicted token's share of <grad loss(window), query>, exactly; they sum to it.

    x, y: [t] for one window ([W, t] for several) -> [t] ([W, t]). The window's loss is the
    mean of t cross-entropies, so its gradient is sum_t J_t^T dL/dz_t, with J_t the Jacobian
    of the logits at t; then <grad L, g> = sum_t <dL/dz_t, J_t g>. J g (how every logit moves
    along g) is a central difference of two forward passes (a step of eps along the unit
    direction: 1e-2 in float32, which measured within 1e-4 of the backward pass's dot product
    on the shipped model; 1e-5 in float64), so no per-token backward pass is needed.
    """
    names = sorted(params)
    dtype = params[names[0]].dtype
    eps = eps if eps is not None else (1e-2 if dtype == np.float32 else 1e-5)
    x2, y2 = np.atleast_2d(x), np.atleast_2d(y)
    norm = float(np.sqrt(sum(np.sum(np.square(query[n], dtype=np.float64)) for n in names)))
    out = np.zeros(x2.shape)
    if norm == 0.0:
        return out.reshape(np.shape(x))
    up = {n: (params[n] + eps * query[n] / norm).astype(dtype) for n in names}
    down = {n: (params[n] - eps * query[n] / norm).astype(dtype) for n in names}
    t = x2.shape[-1]
    for i in range(0, len(x2), chunk):
        xs, ys = x2[i : i + chunk], y2[i : i + chunk]
        jg = (forward(up, config, xs).astype(np.float64) - forward(down, config, xs)) \
            * (norm / (2 * eps))  # [W, t, V]: how each logit moves along the query gradient
        dz = ops.softmax(forward(params, config, xs).astype(np.float64))  # (softmax-onehot)/t
        np.put_along_axis(dz, ys[..., None],
                          np.take_along_axis(dz, ys[..., None], axis=-1) - 1.0, axis=-1)
        out[i : i + chunk] = (dz * jg).sum(axis=-1) / t
    return out.reshape(np.shape(x))


def top_windows(stream: np.ndarray, config: Config, chosen: np.ndarray, per_snapshot: np.ndarray,
                snapshots: list[tuple[dict, float, dict]], ids: list[int], target: int,
                top: int) -> list[dict]:
    """The `top` windows: the POOL * top best by sketched score, ranked by their exact score,
    each split over the tokens it predicts (`contributions[j]`: the share of predicting
    token j; 0 for the first token). `snapshots` are (params, lr, query gradient) triples.
    """
    t = config.n_positions
    scores = per_snapshot.sum(axis=0)
    pool = [int(chosen[j]) for j in np.argsort(-scores, kind="stable")[: POOL * top]]
    where = {int(w): j for j, w in enumerate(chosen)}
    segments = np.stack([stream[w * t : w * t + t + 1] for w in pool]).astype(np.int64)
    parts = sum(lr * token_contributions(params, config, segments[:, :-1], segments[:, 1:], q)
                for params, lr, q in snapshots)  # [pool, t]
    rows = []
    for w, segment, c in zip(pool, segments, parts, strict=True):
        rows.append({"window": w, "start": w * t, "score": float(scores[where[w]]),
                     "exact_score": float(np.sum(c)), "per_snapshot": per_snapshot[:, where[w]],
                     "ids": segment.tolist(), "contributions": np.concatenate([[0.0], c]),
                     "targets": target_spans(segment, ids, target)})
    rows.sort(key=lambda r: -r["exact_score"])
    return rows[:top]


def target_spans(window: np.ndarray, ids: list[int], target: int,
                 n_max: int = N_MAX) -> list[dict]:
    """Where the window holds the target: its position and how many tokens before it match the
    text's tail (up to n_max), the tokens to highlight."""
    spans = []
    tail = list(ids[-n_max:])
    for j in np.flatnonzero(window == target).tolist():
        n = 0
        while n < len(tail) and j - n - 1 >= 0 and window[j - n - 1] == tail[-n - 1]:
            n += 1
        spans.append({"position": j, "context": n})
    return spans


# ------------------------------------------------------------------ the cached steps
#
# Building the index and the window sketches is the slow part; both are kept in the cache
# (tinygpt_cli.cache), keyed by the sha256 of what they were computed from.


def _no_bar(total: int | None, description: str):
    import contextlib

    return contextlib.nullcontext(lambda n=1: None)


@dataclass
class Index:
    """The training token stream and its suffix array."""

    stream: np.ndarray  # [N] uint16
    sa: np.ndarray  # [N] int64
    key: str  # the sha256-based key of the data files and the tokenizer


def data_key(files, tokenizer_file) -> str:
    from ..cache import key_of
    from ..files import sha256

    return key_of("why-index-v1", *(sha256(f) for f in files), sha256(tokenizer_file))


def load_index(files, tokenizer, tokenizer_file, bar=_no_bar) -> Index:
    """The cached index of these files' tokens, built (with progress bars) when missing."""
    import io

    from ..cache import entry
    from ..files import write_atomically
    from ..train.data import encode_stories, read_stories

    key = data_key(files, tokenizer_file)
    path = entry("why-index", key)
    if path.is_file():
        with np.load(path) as z:
            return Index(z["stream"], z["sa"].astype(np.int64), key)
    with bar(len(files), "reading the training text") as advance:
        parts = []
        for f in files:
            parts.append(encode_stories(read_stories([f]), tokenizer).ids)
            advance(1)
    stream = np.concatenate(parts).astype(np.uint16)
    with bar(rounds(), "sorting suffixes") as advance:
        sa = suffix_array(stream, on_round=advance)
    buf = io.BytesIO()
    np.savez(buf, stream=stream, sa=sa.astype(np.int32))
    write_atomically(path, buf.getvalue())
    return Index(stream, sa, key)


def sketch_key(index_key: str, snapshot_files, t: int, k: int, seed: int) -> str:
    from ..cache import key_of
    from ..files import sha256

    return key_of("why-sketch-v2", index_key, *(sha256(f) for f in snapshot_files),
                  str(t), str(k), str(seed))


def window_sketches(index: Index, snapshots: list[tuple[dict, str]], config: Config,
                    chosen: np.ndarray, sketch: CountSketch, bar=_no_bar
                    ) -> tuple[np.ndarray, int]:
    """Sketches of each chosen window's loss gradient at each snapshot [S, W, k] (zeros for
    windows not chosen), computing only those the cache lacks; returns them and how many
    windows were computed now. `snapshots` are (params, file) pairs."""
    import io

    from ..cache import entry
    from ..files import write_atomically

    t = config.n_positions
    x, y = windows(index.stream, t)
    path = entry("why-sketch", sketch_key(index.key, [f for _, f in snapshots], t, sketch.k,
                                          SKETCH_SEED))
    sketches = np.zeros((len(snapshots), len(x), sketch.k), np.float32)
    done = np.zeros(len(x), bool)
    if path.is_file():  # only the windows computed so far are stored
        with np.load(path) as z:
            sketches[:, z["windows"]] = z["sketches"]
            done[z["windows"]] = True
    todo = [int(w) for w in chosen if not done[w]]
    try:
        with bar(len(todo), "window gradients") as advance:
            for w in todo:
                for s, (params, _) in enumerate(snapshots):
                    sketches[s, w] = sketch(window_gradient(params, config, x[w], y[w]))
                done[w] = True
                advance(1)
    finally:  # keep what was computed, even when interrupted
        if todo:
            buf = io.BytesIO()
            kept = np.flatnonzero(done)
            np.savez(buf, windows=kept, sketches=sketches[:, kept])
            write_atomically(path, buf.getvalue())
    return sketches, len(todo)


def influence(index: Index, snapshots: list, config: Config, ids: list[int], target: int,
              max_windows: int, top: int, bar=_no_bar) -> dict:
    """TracIn end to end: choose the windows, sketch (or read) their gradients at each
    snapshot, score them against the query, and explain the top ones. `snapshots` are
    analysis.history.Snapshot objects with a learning rate."""
    x, _ = windows(index.stream, config.n_positions)
    if len(x) == 0:
        raise TrainingDataError(f"the training text is {len(index.stream)} tokens: too short "
                                f"for one window of {config.n_positions} (and the token after "
                                "it), so there is nothing to rank")
    chosen = choose_windows(x, ids[-1], max_windows)
    sketch = CountSketch.for_params(snapshots[0].params)
    sketches, computed = window_sketches(index, [(s.params, s.path) for s in snapshots],
                                         config, chosen, sketch, bar)
    queries = [query_gradient(s.params, config, ids, target) for s in snapshots]
    per_snapshot = tracin_scores(sketches[:, chosen], np.stack([sketch(q) for q in queries]),
                                 np.asarray([s.lr for s in snapshots]))
    rows = top_windows(index.stream, config, chosen, per_snapshot,
                       [(s.params, s.lr, q) for s, q in zip(snapshots, queries, strict=True)],
                       ids, target, top)
    return {"windows": len(x), "windows_scored": len(chosen), "windows_computed_now": computed,
            "sketch": {"kind": "CountSketch", "k": sketch.k, "seed": SKETCH_SEED},
            "top_windows": rows}
