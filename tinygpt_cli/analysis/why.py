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
   positive scores are the windows that taught the prediction ("proponents"). Every window
   is scored, from an index of all windows' gradients kept small (analysis.tracin: built
   once per weights, history and data, in batches, on every core, resumably); the top
   windows are then re-scored exactly.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import words
from ..errors import InputError
from ..jobs.cluster import Here
from ..jobs.corpus import TrainingDataError, read_stories
from ..jobs.corpus import training_text as recorded
from ..jobs.session import token_id
from ..jobs.threads import map_on_cores
from ..storage import cache
from ..storage.cache import key_of
from ..storage.files import sha256
from ..transformer import ops
from ..transformer.config import Config
from ..transformer.hooks import Chain, Record
from ..transformer.model import backward, forward, loss_and_grads
from ..transformer.trace import run_traced
from ..transformer.windows import encode_stories, eval_windows
from ..transformer.wiring import FAMILIES, handles
from . import exact_tracin as ex
from . import heads
from . import history as hist
from . import sae as S
from . import why_edge as we
from .circuit import build_graph
from .exact_tracin import next_token_query
from .sae import encode, parse_latent_path
from .why_index import TracinIndex, cannot_keep, index_folder, open_index, writable_index

# The blocks this analysis implements (wiring.require refuses others by name): TracIn's terms are
# written for the families' parameters and norm sites (tracin, exact_tracin).
HANDLES = handles(step=FAMILIES["step"] + ("norm after attention", "norm after the MLP"))

N_MAX = 8  # the longest tail counted in the exact-match table
DEPTH = 256  # suffixes are sorted by this many tokens: more than any query (n_ctx + 1)
POOL = 2  # the top windows are chosen among POOL * top by the index, then ranked exactly

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
    return eval_windows(stream, t)


def flatten(grads: dict[str, np.ndarray], names: list[str]) -> np.ndarray:
    return np.concatenate([np.ravel(grads[n]) for n in names]).astype(np.float64)


def window_gradient(params, config: Config, x: np.ndarray, y: np.ndarray):
    """d mean cross-entropy of one window / d params (no dropout): the exact definition the
    index approximates."""
    _, grads = loss_and_grads(params, config, x[None], y[None])
    return grads


def query_gradient(params, config: Config, ids: list[int], target: int, hooks=None):
    """d -log p(target | text) / d params, through the project's own backward pass (the
    text run through `hooks`, its steering)."""
    rec = Record()
    logits = forward(params, config, np.asarray(ids), hooks=Chain(hooks, rec))
    dlogits = np.zeros_like(logits)
    dlogits[-1] = ops.softmax(logits[-1])  # d(-log p_y)/dz = softmax(z) - onehot(y)
    dlogits[-1, target] -= 1.0
    grads, _ = backward(params, config, rec.values, dlogits)
    return grads


def exact_tracin(params_and_lrs, config: Config, x: np.ndarray, y: np.ndarray, ids: list[int],
                 target: int) -> np.ndarray:
    """TracIn of each window by its definition, one full gradient at a time (slow: for
    checking the index).  -> [W]"""
    names = sorted(params_and_lrs[0][0])
    total = np.zeros(len(x))
    for params, lr in params_and_lrs:
        q = flatten(query_gradient(params, config, ids, target), names)
        total += lr * np.array([flatten(window_gradient(params, config, x[w], y[w]), names) @ q
                                for w in range(len(x))])
    return total


def token_contributions(params, config: Config, x: np.ndarray, y: np.ndarray, query: dict,
                        eps: float | None = None, chunk: int = 8) -> np.ndarray:
    """Each predicted token's share of <grad loss(window), query>, exactly; they sum to it.

    x, y: [t] for one window ([W, t] for several) -> [t] ([W, t]). The window's loss is the
    mean of t cross-entropies, so its gradient is sum_t J_t^T dL/dz_t, with J_t the Jacobian
    of the logits at t; then <grad L, g> = sum_t <dL/dz_t, J_t g>. J g (how every logit moves
    along g) is a central difference of two forward passes, a step of eps either way along
    the unit direction (1e-2 in float32, 1e-5 in float64), and dL/dz_t = (softmax - onehot)/t
    is taken at their mean, which is the unmoved logits to second order in eps: two forward
    passes in all, where the unmoved logits would be a third. On the shipped model the result
    is within about 3e-4 of the largest score from the backward pass's dot products (float32
    rounding of the two passes); no per-token backward pass is needed.
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
        mean, moved = forward(up, config, xs), forward(down, config, xs)
        np.subtract(mean, moved, out=moved)
        moved *= 0.5  # [W, t, V]: eps times how each logit moves along the query
        mean -= moved  # in place: these are the largest arrays of the query
        p = ops.softmax(mean)
        along = np.einsum("wtv,wtv->wt", p, moved) \
            - np.take_along_axis(moved, ys[..., None], axis=-1)[..., 0]
        out[i : i + chunk] = along * (norm / eps) / t
    return out.reshape(np.shape(x))


def top_windows(stream: np.ndarray, config: Config, chosen: np.ndarray, per_snapshot: np.ndarray,
                snapshots: list[tuple[dict, float, dict]], ids: list[int], target: int,
                top: int, workers: int | None = None, found_by: str = "index") -> list[dict]:
    """The `top` windows: the POOL * top best by the index's score, ranked by their exact score,
    each split over the tokens it predicts (`contributions[j]`: the share of predicting
    token j; 0 for the first token). `snapshots` are (params, lr, query gradient) triples;
    `found_by`: which ranking chose the pool ("index", or "exact": the exact pass's).
    """
    t = config.n_positions
    scores = per_snapshot.sum(axis=0)
    pool = [int(chosen[j]) for j in np.argsort(-scores, kind="stable")[: POOL * top]]
    where = {int(w): j for j, w in enumerate(chosen)}
    segments = np.stack([stream[w * t : w * t + t + 1] for w in pool]).astype(np.int64)
    parts = sum(map_on_cores(
        lambda s: s[1] * token_contributions(s[0], config, segments[:, :-1], segments[:, 1:],
                                             s[2]), snapshots, workers))  # [pool, t]
    rows = []
    for w, segment, c in zip(pool, segments, parts, strict=True):
        rows.append({"window": w, "start": w * t, "found_by": found_by,
                     "score": float(scores[where[w]]),
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
# (tinygpt_cli.storage.cache), keyed by the sha256 of what they were computed from.


def _no_bar(total: int | None, description: str):

    return contextlib.nullcontext(lambda n=1: None)


@dataclass
class Index:
    """The training token stream and its suffix array."""

    stream: np.ndarray  # [N] uint16
    sa: np.ndarray  # [N] int64
    key: str  # the sha256-based key of the data files and the tokenizer
    files: list[str]  # the data files' names, in stream order
    lengths: np.ndarray  # [files] tokens of each

    def place(self, position: int, eot_id: int) -> dict:
        """Where a stream position is: file, story (from 1, in that file) and token offset
        into the story."""
        ends = np.cumsum(self.lengths)
        f = int(np.searchsorted(ends, position, side="right"))
        begin = int(ends[f - 1]) if f else 0
        before = np.flatnonzero(self.stream[begin:position] == eot_id)
        start = begin + (int(before[-1]) + 1 if len(before) else 0)
        return {"file": self.files[f], "story": len(before) + 1, "offset": position - start}


def data_key(files, tokenizer_file) -> str:

    return key_of("why-index-v2", *(sha256(f) for f in files), sha256(tokenizer_file))


def valid_index(z: dict, n_files: int, vocab_size: int) -> bool:
    """What load_index writes: a token stream, its suffix array (a permutation of its
    positions), the files' names and token counts. A damaged or hand-made entry fails here
    and is built again, rather than failing, or silently ranking nothing, on every run."""
    if set(z) != {"stream", "sa", "files", "lengths"}:
        return False
    stream, sa, lengths = z["stream"], z["sa"], z["lengths"]
    if not (stream.ndim == sa.ndim == lengths.ndim == 1 and len(sa) == len(stream) > 0
            and np.issubdtype(stream.dtype, np.integer) and np.issubdtype(sa.dtype, np.integer)
            and np.issubdtype(lengths.dtype, np.integer) and len(lengths) == n_files
            and z["files"].shape == (n_files,) and int(lengths.sum()) == len(stream)):
        return False
    if int(stream.min()) < 0 or int(stream.max()) >= vocab_size:
        return False
    if int(sa.min()) < 0 or int(sa.max()) >= len(sa):
        return False
    if not (np.bincount(sa, minlength=len(sa)) == 1).all():  # each position once
        return False
    first = stream[sa]  # suffixes in order: at least their first tokens are (cheap, O(n))
    return bool((first[:-1] <= first[1:]).all())


def load_index(files, tokenizer, tokenizer_file, bar=_no_bar) -> Index:
    """The cached index of these files' tokens, built (with progress bars) when missing or
    damaged (valid_index)."""

    def build() -> dict[str, np.ndarray]:
        with bar(len(files), "reading the training text") as advance:
            parts = []
            for f in files:
                parts.append(encode_stories(read_stories([f]), tokenizer).ids)
                advance(1)
        stream = np.concatenate(parts).astype(np.uint16)
        with bar(rounds(), "sorting suffixes") as advance:
            sa = suffix_array(stream, on_round=advance)
        return {"stream": stream, "sa": sa.astype(np.int32),
                "files": np.asarray([Path(f).name for f in files]),
                "lengths": np.asarray([len(p) for p in parts], np.int64)}

    key = data_key(files, tokenizer_file)
    z = cache.load_or_compute(cache.entry("why-index", key), cache.load_arrays, build,
                              cache.store_arrays,  # unwritable: a note, the answer all the same
                              lambda z: valid_index(z, len(files), tokenizer.vocab_size))
    return Index(z["stream"], z["sa"].astype(np.int64), key, [str(n) for n in z["files"]],
                 z["lengths"])


def influence(index: Index, snapshots: list, config: Config, ids: list[int], target: int,
              top: int, grads: TracinIndex, hooks=None, workers: int | None = None,
              engine=None, progress=None) -> dict:
    """TracIn end to end over every window: score them all from the index where its shards
    lie (on `engine`: default this machine; each shard keeps its POOL * top best), then
    explain the best of those exactly, the snapshots on `workers` threads (default: every
    core). `snapshots` are analysis.history.Snapshot objects with a learning rate, in the
    index's order; progress(done, total) follows the shards scored."""

    n = (len(index.stream) - 1) // config.n_positions  # windows (never all in memory at once)
    # one backward pass a snapshot: the index's query and the exact re-scoring's gradient
    exact = map_on_cores(lambda s: next_token_query(s.params, config, ids, target, hooks),
                         snapshots, workers)
    queries = grads.in_index_terms(exact, config, workers)
    chosen, per_snapshot = grads.best(queries, np.asarray([s.lr for s in snapshots]),
                                      POOL * top, config, engine or Here(workers), progress)
    rows = top_windows(index.stream, config, chosen, per_snapshot,
                       [(s.params, s.lr, q.grads) for s, q in zip(snapshots, exact, strict=True)],
                       ids, target, top, workers)
    return {"windows": n, "windows_scored": n, "index": grads.describe(), "top_windows": rows}


EXACT_METHOD = {"method": "exact: per-position terms of one forward and backward pass a "
                          "batch of windows (analysis/exact_tracin.py)", "computed_now": 0}


def exact_scores(index: Index, snapshots: list, config: Config, makers: list,
                 workers: int | None = None, bar=_no_bar) -> np.ndarray:
    """Exact TracIn of every window for each query asked (makers: params -> its
    exact_tracin.Query), in one pass over the windows per snapshot.  -> [asks, snapshots,
    windows], each snapshot's part weighted by its learning rate"""

    n = (len(index.stream) - 1) // config.n_positions
    queries = [(s.params, s.lr, [make(s.params) for make in makers]) for s in snapshots]
    label = "scoring every window exactly" + (f" for {len(makers)} texts" if len(makers) > 1
                                              else "")
    with bar(n * len(snapshots), label) as advance:
        return ex.scores_over_stream(queries, config, index.stream, advance, workers)


def exact_influence(index: Index, snapshots: list, config: Config, make, ids: list[int],
                    target: int, per_snapshot: np.ndarray, top: int,
                    workers: int | None = None) -> dict:
    """The `top` windows by their exact scores (per_snapshot [S, W] from exact_scores),
    each split over the tokens it predicts, as influence() gives the index's."""
    n = per_snapshot.shape[1]
    rows = top_windows(index.stream, config, np.arange(n), per_snapshot,
                       [(s.params, s.lr, make(s.params).grads) for s in snapshots],
                       ids, target, top, workers, found_by="exact")
    return {"windows": n, "windows_scored": n, "index": dict(EXACT_METHOD), "top_windows": rows}


# ------------------------------------------------------------------ --value: any scalar

HEAD_WEIGHT = r"layers\.(\d+)\.heads\.(\d+)\.weights\[\s*(-?\d+)\s*,\s*(-?\d+)\s*\]"
DETECTOR = r"(previous_token|duplicate_token|induction):L(\d+)H(\d+)"


@dataclass
class Value:
    """A scalar of the text's forward pass that `why --value` explains: what it is, its
    value on the text (final weights), and its query at any weights (the gradient of minus
    it, so that a window's positive score means its training step raised the value)."""

    name: str
    amount: float
    make: Callable


LATENT = r"(sae\.[\w.]+?)(?:\[\s*(-?\d+)\s*\])?"


def _latent_value(model, ids: list[int], value: str, hooks=None, saes: tuple = ()) -> Value:
    """`sae.SITE.N[P]`: latent N of the SAE at SITE (the first of `saes`, the --sae files or
    folders, that reads it; else the weights folder's) at a residual stream (layers.L.resid_pre
    or resid_post), at position P (default the last). Its gradient at the stream is its
    encoder column where it is active (a TopK, ReLU or JumpReLU SAE, Gemma Scope 2's among
    them, that does not normalise its input)."""


    config, t = model.config, len(ids)
    found = re.fullmatch(LATENT, value)
    site, latent = parse_latent_path(found.group(1) if found else value, config)
    p = int(found.group(2)) if found and found.group(2) is not None else -1
    kind = re.fullmatch(r"layers\.(\d+)\.(resid_pre|resid_post)", site)
    if latent is None or kind is None or not -t <= p < t:
        raise InputError(f"--value {value}: give an SAE latent as sae.SITE.N[POSITION] at a "
                         "residual stream (layers.L.resid_pre or resid_post), the position one "
                         f"of the text's {t} tokens")
    layer = int(kind.group(1)) - (kind.group(2) == "resid_pre")
    sae = S.site_sae(model.weights_file, config, site, saes)
    if sae.normalize != "none" or not 0 <= latent < sae.n_latents:
        raise InputError(f"--value {value}: {sae.path} has latents 0 to {sae.n_latents - 1}"
                         + (" and normalises its input, which --value cannot follow yet"
                            if sae.normalize != "none" else ""))
    x = run_traced(model.params, config, np.asarray(ids), hooks=hooks).values[site]
    z = float(encode(sae, x)[p, latent])
    if z == 0:
        raise InputError(f"--value {value}: latent {latent} is 0 at position {p % t} (not "
                         "active), so no training step moved it; pick an active one "
                         f"(tinygpt trace TEXT {site and 'sae.' + site})")
    column = sae.W_enc[:, latent] * (float(np.linalg.norm(sae.W_dec[latent]))
                                     if sae.rescale else 1.0)

    def seed(h):  # minus the latent's gradient, where it is active at these weights
        d = np.zeros_like(h)
        if encode(sae, h[p])[latent] > 0:
            d[p] = -column
        return d

    return Value(value, z, lambda q: ex.query(q, config, ids, None, hooks,
                                              stream=(layer, seed)))


def _edge_value(model, ids: list[int], value: str, target: int, vs: int | None,
                corrupt: list[int] | None, hooks=None) -> Value:
    """`edge:SENDER->RECEIVER`: that edge's exact score from `tinygpt circuit` (the text the
    clean one, `corrupt` the corrupt one; analysis.why_edge)."""
    config = model.config
    we.parse_edge(value, build_graph(config), config)
    if corrupt is None:
        raise InputError(f"--value {value}: an edge's score compares the text with a corrupt "
                         "one, as tinygpt circuit CLEAN CORRUPT does: give --corrupt TEXT, "
                         "as many tokens as the text")
    if len(corrupt) != len(ids):
        raise InputError(f"the text is {words.count(len(ids), 'token')} and the --corrupt text "
                         f"{len(corrupt)}: an edge is patched position by position, so they "
                         "must have the same number of tokens")
    target, vs = we.edge_tokens(model.params, config, ids, corrupt, target, vs, hooks)
    if vs == target:
        raise InputError(f"--vs is the target itself (id {target}): logit[target] - "
                         "logit[vs] is 0 whatever the weights; give another token")
    amount, _ = we.edge_score(model.params, config, ids, corrupt, value, target, vs, hooks,
                              want_query=False)
    # the tokens the score compares are named, as --vs's are: vs may be circuit's default
    return Value(f"{value}, logit[{target}] - logit[{vs}]", amount,
                 lambda p: we.edge_score(p, config, ids, corrupt, value, target, vs,
                                         hooks)[1])


def value_of(model, ids: list[int], value: str | None, target: int, vs: int | None,
             hooks=None, corrupt: list[int] | None = None, saes: tuple = ()) -> Value:
    """--value PATH (an attention weight layers.L.heads.H.weights[i,j], a head's detector
    score KIND:LxHy on the text, an SAE latent, or an edge's score from `circuit` against the
    `corrupt` text), or the logit difference logit[target] - logit[vs]: as a Value. A path it
    cannot read is an InputError naming the forms it takes."""


    config, t = model.config, len(ids)
    if value is not None and value.startswith("edge:"):
        return _edge_value(model, ids, value, target, vs, corrupt, hooks)
    if value is None:
        if vs == target:
            raise InputError(f"--vs is the target itself (id {target}): logit[target] - "
                             "logit[vs] is 0 whatever the weights; give another token")

        def dlogits_of(z):
            d = np.zeros_like(z)
            d[-1, vs], d[-1, target] = 1.0, -1.0
            return d

        z = forward(model.params, config, np.asarray(ids), hooks=hooks)[-1]
        name = f"logit[{target}] - logit[{vs}]"
        return Value(name, float(z[target] - z[vs]),
                     lambda p: ex.query(p, config, ids, dlogits_of, hooks))
    if value.startswith("sae."):
        return _latent_value(model, ids, value, hooks, saes)
    weight, detector = re.fullmatch(HEAD_WEIGHT, value), re.fullmatch(DETECTOR, value)
    if weight:
        layer, head, i, j = (int(g) for g in weight.groups())
        i, j = i % t if -t <= i < t else -1, j % t if -t <= j < t else -1
        if min(i, j) < 0 or j > i:
            raise InputError(f"--value {value}: row and column must be positions of the "
                             f"text's {t} tokens, the column at most the row (a later one "
                             "is masked)")

        def seed(w):
            d = np.zeros_like(w)
            d[head, i, j] = -1.0
            return d
    elif detector:
        kind, layer, head = detector.group(1), int(detector.group(2)), int(detector.group(3))
        pat = heads.pattern(kind, ids)

        def seed(w):  # score = sum(A P) / sum(A): minus its gradient
            a = w[head].astype(np.float64)
            d = np.zeros_like(w)
            d[head] = -(pat - (a * pat).sum() / a.sum()) / a.sum()
            return d
    else:
        raise InputError(f"--value {value!r}: give an attention weight "
                         "layers.L.heads.H.weights[ROW,COL] or a head's score on the text "
                         "KIND:LxHy (KIND previous_token, duplicate_token or induction), an "
                         "SAE latent sae.SITE.N[POSITION], or an edge's score from tinygpt "
                         "circuit edge:SENDER->RECEIVER (with --corrupt TEXT)")
    if not (0 <= layer < config.n_layer and 0 <= head < config.n_head):
        raise InputError(f"--value {value}: this model has {config.n_layer} layers of "
                         f"{config.n_head} heads")
    w = run_traced(model.params, config, np.asarray(ids), hooks=hooks).values[
        f"layers.{layer}.weights"]
    amount = -float((seed(w) * w).sum()) if weight else float(
        heads.detection_score(w[head], pat))
    return Value(value, amount, lambda p: ex.query(p, config, ids, None, hooks,
                                                   attention=(layer, seed)))


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Rank correlation (ties broken by position: scores of float64 sums rarely tie)."""
    ra = np.argsort(np.argsort(a, kind="stable"), kind="stable").astype(np.float64)
    rb = np.argsort(np.argsort(b, kind="stable"), kind="stable").astype(np.float64)
    return float(np.corrcoef(ra, rb)[0, 1]) if len(a) > 1 else 1.0


def recall(approx: np.ndarray, exact: np.ndarray, k: int) -> float:
    """The share of the exact top k that the approximate top k holds."""
    k = min(k, len(exact))
    top = lambda s: set(np.argsort(-s, kind="stable")[:k].tolist())  # noqa: E731
    return len(top(approx) & top(exact)) / k if k else 1.0


def agreement(approx: np.ndarray, exact: np.ndarray) -> dict:
    """How far the index's ranking of every window agrees with the exact one: why --check."""
    return {"recall_at_10": recall(approx, exact, 10), "recall_at_50": recall(approx, exact, 50),
            "spearman": spearman(approx, exact), "windows": len(exact),
            "exact_top_10": np.argsort(-exact, kind="stable")[:10].tolist(),
            "index_top_10": np.argsort(-approx, kind="stable")[:10].tolist()}


# ------------------------------------------------------------------ the whole answer


@dataclass
class Why:
    """What `why` found: the exact matches and the top windows, with what they came from."""

    target: int
    target_token: str
    training_tokens: int
    longest: int
    longest_then: int
    matches: list[dict]
    snapshots: list  # analysis.history.Snapshot, those with a learning rate
    influence: dict
    index: TracinIndex | None  # None: every window scored exactly (--exact)
    more: list = field(default_factory=list)  # --exact's other texts sharing the pass

    def scores(self) -> np.ndarray:
        return np.asarray([r["score"] for r in self.influence["top_windows"]])

    def facts(self) -> dict:
        return {"target": {"id": self.target, "token": self.target_token},
                "training_tokens": self.training_tokens,
                "longest_context_seen": self.longest,
                "longest_context_then_target": self.longest_then,
                "exact_matches": self.matches,
                "snapshots": [{"label": s.label, "step": s.step, "lr": s.lr}
                              for s in self.snapshots], **self.influence}

    def index_note(self) -> str:
        """Where the window gradients came from, for the closing line."""
        n = self.influence["windows"] * len(self.snapshots)
        if self.index is None:
            return (f"all {self.influence['windows']:,} windows x {len(self.snapshots)} "
                    "snapshots scored exactly")
        now = self.index.built_now
        if now == 0:
            return f"all {self.influence['windows']:,} windows scored from the index"
        if now >= n:
            return (f"the index of {self.influence['windows']:,} windows x "
                    f"{len(self.snapshots)} snapshots built now and kept for next time")
        return (f"the index finished now ({now:,} of {n:,} window gradients computed now, "
                "the rest kept from an interrupted build)")


def training_text(model, data: list[Path] | None, any_data: bool = False):
    """The training text `why` ranks (corpus.training_text). Without --data, the weights
    must first have the snapshots TracIn needs: a folder with no history/ (one from the hub,
    say) is told that, not that it has no record of its text; a --data given is checked
    first, as the user's own input."""

    if not data:
        hist.find_snapshots(hist.history_folder(model), model.weights_file)
    return recorded(model.folder, data, any_data=any_data)


def answer(model, ids: list[int], target: str | int | None, files: list, top: int,
           report=None, workers: int | None = None, hooks=None, engine=None,
           query_report=None, exact: bool = False, check: bool = False,
           more: tuple = (), bar=_no_bar, value: str | None = None,
           vs: str | int | None = None, corrupt: list[int] | None = None,
           saes: tuple = ()) -> Why:
    """`why` end to end: the training text's index, the exact matches, the snapshots, the
    window-gradient index (built when missing, on `engine`: default this machine;
    report(done, total) follows it) and TracIn (query_report(done, total) follows its shards);
    the text (never the training windows) runs through `hooks`, its steering. `exact`: every
    window scored exactly instead (no index: analysis.exact_tracin), with `more` texts' ids
    sharing the pass (their answers in .more); `check`: the index's answer, and how well
    its ranking agrees with the exact one (agreement). `value` (value_of's forms) or `vs`
    (logit[target] - logit[vs]): that scalar explained instead of the next token, exactly;
    `corrupt`: the ids of an edge's corrupt text; `saes`: the --sae dictionaries a latent's
    site is read with before the weights folder's own."""

    config = model.config
    asks = [(q, _target_of(model, q, target, hooks)) for q in [ids, *more]]
    exact = exact or value is not None or vs is not None
    values = [value_of(model, q, value, t, None if vs is None else token_id(model, vs), hooks,
                       corrupt, saes)
              if value is not None or vs is not None else None for q, t in asks]
    makers = [v.make if v is not None else
              (lambda p, q=q, t=t: ex.next_token_query(p, config, q, t, hooks))
              for v, (q, t) in zip(values, asks, strict=True)]
    snapshots = hist.find_snapshots(hist.history_folder(model), model.weights_file)
    timeline = [s for s in hist.timeline(model, snapshots) if s.lr is not None]
    if not timeline:
        raise InputError(f"the snapshots in {hist.history_folder(model)} carry no learning rate "
                         "(metadata 'lr'), which TracIn weighs them by; retrain with --snapshots")
    # an index still to build needs a writable cache: said first, the one line (before the
    # token index's note that it is not kept)
    if not exact:
        writable_index(index_folder(data_key(files, model.folder / "tokenizer.json"),
                                    [s.path for s in timeline], config))
    index = load_index(files, model.tokenizer, model.folder / "tokenizer.json")
    n = (len(index.stream) - 1) // config.n_positions
    if n == 0:
        raise TrainingDataError(f"the training text is {len(index.stream)} tokens: too short "
                                f"for one window of {config.n_positions} (and the token after "
                                "it), so there is nothing to rank")
    grads = None
    if not exact:
        grads = open_index(index.key, [s.path for s in timeline], config, n)
        try:
            grads.build(index.stream, config, workers, report, engine=engine)
        except OSError as e:  # the gradient index is files on disk, read back by every query
            raise cannot_keep(grads.folder, e) from None
    scored = exact_scores(index, timeline, config, makers if exact else makers[:1], workers,
                          bar) if exact or check else None
    answers = []
    for k, (q, t) in enumerate(asks if exact else asks[:1]):
        if exact:
            found = exact_influence(index, timeline, config, makers[k], q, t, scored[k], top,
                                    workers)
            if values[k] is not None:
                found["explained"] = {"name": values[k].name, "value": values[k].amount}
        else:
            found = influence(index, timeline, config, q, t, top, grads, hooks, workers,
                              engine, query_report)
        if check:
            x, y = windows(index.stream, config.n_positions)
            approx = grads.scores([s.params for s in timeline], config, x, y, q, t, hooks,
                                  workers, engine)
            found["check"] = agreement(
                (approx * np.asarray([s.lr for s in timeline])[:, None]).sum(0),
                scored[k].sum(0))
        answers.append(Why(t, model.tokenizer.token_str(t), len(index.stream),
                           longest_seen(index.stream, index.sa, q),
                           longest_seen(index.stream, index.sa, q, t),
                           exact_matches(index.stream, index.sa, q, t), timeline,
                           tokens_named(found, model.tokenizer, index), grads))
    answers[0].more = answers[1:]
    return answers[0]


def _target_of(model, ids: list[int], target: str | int | None, hooks) -> int:
    """The token to explain: the one named, else the text's likeliest next token."""

    if target is not None:
        return token_id(model, target)
    logits = forward(model.params, model.config, np.asarray(ids), hooks=hooks)
    return hist.next_token(logits)[0]


def tokens_named(found: dict, tokenizer, index: Index) -> dict:
    """Each top window's tokens as strings, and its place in the training text."""
    for r in found["top_windows"]:
        r["tokens"] = [tokenizer.token_str(i) for i in r["ids"]]
        r.update(index.place(r["start"], tokenizer.eot_id))
    return found
