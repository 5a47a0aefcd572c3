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
   is scored, from an index of all windows' gradients kept small (analysis.tracin's math;
   built once per weights, history and data, in batches, on every core, resumably, by
   jobs.why_index); the top windows are then re-scored exactly.

The math is here, as functions of arrays, a Model and token ids; reading the training text,
the snapshots and the caches, and running on threads or a cluster, is jobs.why's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .. import words
from ..errors import InputError
from ..transformer import ops
from ..transformer.config import Config
from ..transformer.hooks import Chain, Record
from ..transformer.model import backward, forward, loss_and_grads
from ..transformer.trace import run_traced
from ..transformer.windows import eval_windows
from ..transformer.wiring import FAMILIES, handles
from . import exact_tracin as ex
from . import heads
from . import sae as S
from . import why_edge as we
from .circuit import build_graph
from .exact_tracin import Each, one_by_one
from .sae import encode, parse_latent_path

if TYPE_CHECKING:
    from ..jobs.why_index import TracinIndex

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
                top: int, each: Each = one_by_one, found_by: str = "index") -> list[dict]:
    """The `top` windows: the POOL * top best by the index's score, ranked by their exact score,
    each split over the tokens it predicts (`contributions[j]`: the share of predicting
    token j; 0 for the first token). `snapshots` are (params, lr, query gradient) triples,
    mapped by `each` (a job's threads.on_cores: on every core); `found_by`: which ranking
    chose the pool ("index", or "exact": the exact pass's).
    """
    t = config.n_positions
    scores = per_snapshot.sum(axis=0)
    pool = [int(chosen[j]) for j in np.argsort(-scores, kind="stable")[: POOL * top]]
    where = {int(w): j for j, w in enumerate(chosen)}
    segments = np.stack([stream[w * t : w * t + t + 1] for w in pool]).astype(np.int64)
    parts = sum(each(
        lambda s: s[1] * token_contributions(s[0], config, segments[:, :-1], segments[:, 1:],
                                             s[2]), snapshots))  # [pool, t]
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


# ------------------------------------------------------------------ the training text's index
#
# Built and kept in the cache by jobs.why (keyed by the sha256 of the files and the tokenizer),
# as the window gradients' index is (jobs.why_index); these take the arrays read.


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


def valid_index(z: dict, n_files: int, vocab_size: int) -> bool:
    """What jobs.why.load_index writes: a token stream, its suffix array (a permutation of its
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


EXACT_METHOD = {"method": "exact: per-position terms of one forward and backward pass a "
                          "batch of windows (analysis/exact_tracin.py)", "computed_now": 0}


def exact_influence(index: Index, snapshots: list, config: Config, make, ids: list[int],
                    target: int, per_snapshot: np.ndarray, top: int,
                    each: Each = one_by_one) -> dict:
    """The `top` windows by their exact scores (per_snapshot [S, W] from jobs.why's
    exact_scores), each split over the tokens it predicts, as jobs.why.influence gives the
    index's."""
    n = per_snapshot.shape[1]
    rows = top_windows(index.stream, config, np.arange(n), per_snapshot,
                       [(s.params, s.lr, make(s.params).grads) for s in snapshots],
                       ids, target, top, each, found_by="exact")
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


def _latent_value(model, ids: list[int], value: str, hooks=None,
                  saes: Callable[[str], S.SAE] | None = None) -> Value:
    """`sae.SITE.N[P]`: latent N of the SAE at SITE as `saes` finds it (jobs.dictionaries.
    saes.finder: the first --sae file or folder that reads it; else the weights folder's) at
    a residual stream (layers.L.resid_pre or resid_post), at position P (default the last).
    Its gradient at the stream is its encoder column where it is active (a TopK, ReLU or
    JumpReLU SAE, Gemma Scope 2's among them, that does not normalise its input)."""

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
    if saes is None:
        raise InputError(f"--value {value}: no SAE was given to read the latent from")
    sae = saes(site)
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
             hooks=None, corrupt: list[int] | None = None,
             saes: Callable[[str], S.SAE] | None = None) -> Value:
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
    w_keys = config.window(layer)
    if weight and w_keys and j <= i - w_keys:  # masked: 0 whatever the weights, no gradient
        raise InputError(f"--value {value}: block {layer} is a sliding block, where row {i} "
                         f"sees columns {i - w_keys + 1}..{i} alone (the last {w_keys}); "
                         f"column {j} is masked")
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


def tokens_named(found: dict, tokenizer, index: Index) -> dict:
    """Each top window's tokens as strings, and its place in the training text."""
    for r in found["top_windows"]:
        r["tokens"] = [tokenizer.token_str(i) for i in r["ids"]]
        r.update(index.place(r["start"], tokenizer.eot_id))
    return found
