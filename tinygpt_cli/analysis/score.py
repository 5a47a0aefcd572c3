"""How surprised the model is by each token of a text: surprisal, rank, chance, entropy.

A sequence of ids is read in windows of at most the context length; window k starts at
k * stride and scores only the targets the window before it did not (as the sliding-window
perplexity recipe of Hugging Face does), so every target is scored once, with at least
context - stride tokens before it once the first window is full. Target t (t >= 1) is
predicted by the input at position t - 1.

Everything here is a pure function of arrays; `progress` is an optional callback.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from ..transformer import ops
from ..transformer.config import Config
from ..transformer.model import all_finite, record, run_to_final_norm, token_table
from ..transformer.wiring import FORWARD

# The blocks this analysis implements (wiring.require refuses others by name): the model's own
# logits.
HANDLES = FORWARD

LN2 = math.log(2.0)


@dataclass(frozen=True)
class Window:
    """Inputs ids[start:end] (at most the context length); scores targets first..end."""

    start: int
    end: int
    first: int


def windows(n: int, context: int, stride: int, *, full_only: bool = False) -> list[Window]:
    """The windows that score targets 1 .. n-1 of a sequence of n ids, each exactly once.

    `full_only` keeps only windows of `context` inputs (the model card's non-overlapping count,
    windows.eval_windows, drops the tail that does not fill one).
    """
    if not 1 <= stride <= context:
        raise ValueError(f"stride must be in 1..{context}, not {stride}")
    out: list[Window] = []
    done = 0  # the last target scored so far
    start = 0
    while done < n - 1:
        end = min(start + context, n - 1)
        if full_only and end - start < context:
            break
        out.append(Window(start, end, max(done + 1, start + 1)))
        done = end
        start += stride
    return out


@dataclass
class TokenScores:
    """Per scored target: -log p (nats), p, rank among the vocabulary (1 = the top guess),
    entropy of the whole next-token distribution (nats)."""

    targets: np.ndarray  # int64 [N]
    nats: np.ndarray  # float64 [N]
    prob: np.ndarray
    rank: np.ndarray  # int64
    entropy: np.ndarray
    first: int = 0  # the index of the first of these among its sequence's targets

    @property
    def bits(self) -> np.ndarray:
        return self.nats / LN2


def token_scores(logits: np.ndarray, targets: np.ndarray) -> TokenScores:
    """Scores of each row's target under softmax(logits).  [N, V], [N] -> N of each.

    One pass of exp over the [N, V] block does for the log-sum-exp, the entropy and the rank.
    """
    picked_raw = np.take_along_axis(logits, targets[:, None], axis=-1)  # [N, 1]
    rank = 1 + np.count_nonzero(logits > picked_raw, axis=-1)
    z = logits - logits.max(axis=-1, keepdims=True)  # [N, V], <= 0; the caller's logits kept
    e = np.exp(z)
    total = e.sum(axis=-1, dtype=np.float64)  # [N]
    log_total = np.log(total)
    picked = np.take_along_axis(z, targets[:, None], axis=-1)[:, 0].astype(np.float64)
    nats = log_total - picked
    # H = -sum p log p = log Z - sum(e z) / Z
    entropy = log_total - np.einsum("ij,ij->i", e, z, dtype=np.float64) / total
    return TokenScores(targets.astype(np.int64), nats, np.exp(-nats), rank.astype(np.int64),
                       np.maximum(entropy, 0.0))


SCORED_ROWS = 128  # rows unembedded and scored at once: a [128, V] block stays in the cache


def unembed_and_score(u: np.ndarray, targets: np.ndarray, w_e: np.ndarray) -> TokenScores:
    """token_scores(unembed(u), targets) for final-norm outputs u [N, d], SCORED_ROWS rows
    at a time: the same numbers as one block (every step is per row), in half the time of
    passes over a [N, V] block that does not fit in the cache."""
    return concat([token_scores(ops.unembed(u[i:i + SCORED_ROWS], w_e),
                                targets[i:i + SCORED_ROWS])
                   for i in range(0, len(u), SCORED_ROWS)])


def concat(scores: list[TokenScores]) -> TokenScores:
    if not scores:
        empty = np.zeros(0)
        return TokenScores(empty.astype(np.int64), empty, empty, empty.astype(np.int64), empty)
    return TokenScores(*(np.concatenate([getattr(s, f) for s in scores])
                         for f in ("targets", "nats", "prob", "rank", "entropy")),
                       first=scores[0].first)


def final_hidden(params, config: Config, ids: np.ndarray, hooks=None, ahead=None
                 ) -> np.ndarray:
    """ln_final.out for a batch [B, T] -> [B, T, d], without the unembedding (the caller
    unembeds only the positions it scores). `ahead`: --each-line's passes made ahead
    (jobs.ahead.Ahead: its final_norm(params, config, ids) gives a line's, or None)."""
    if hooks is None:
        # a clean run: the same numbers without recording (one window as its own pass, or
        # made ahead with the next lines under --each-line; windows as the batch's pass)
        if len(ids) == 1:
            made = None if ahead is None else ahead.final_norm(params, config, ids[0])
            u = run_to_final_norm(params, config, ids) if made is None else made[None]
        else:
            u = run_to_final_norm(params, config, ids, per_text=False)
        if all_finite(u):  # else the recorded pass names the value that overflowed
            return u
    return record(params, config, ids, {"ln_final.out"}, hooks=hooks,
                  stop_after="ln_final.out")[1]["ln_final.out"]


def score_sequences(
    params, config: Config, sequences: list[np.ndarray], *, stride: int | None = None,
    batch_size: int = 8, full_only: bool = False,
    progress: Callable[[int], None] | None = None, hooks=None,
) -> Iterator[tuple[int, TokenScores]]:
    """(index, scores of targets 1..n-1) for each sequence, in order (score_parts, put
    together)."""
    parts: list[TokenScores] = []
    for i, part, last in score_parts(params, config, sequences, stride=stride,
                                     batch_size=batch_size, full_only=full_only,
                                     progress=progress, hooks=hooks):
        parts.append(part)
        if last:
            yield i, concat(parts)
            parts = []


def batch_scores(task: list, shared: tuple) -> list[TokenScores]:
    """The scores of a run of batches, a pure function of their windows: task [(x [B, width],
    rows, cols: where each target is predicted, targets)], shared (params, config, hooks,
    ahead)."""
    params, config, hooks, ahead = shared
    out = []
    for x, rows, cols, targets in task:
        u = final_hidden(params, config, np.asarray(x, np.int64), hooks, ahead)  # [B, width, d]
        out.append(unembed_and_score(u[rows, cols], targets, token_table(params)))
    return out


def scored_here(batches: Iterable[tuple], shared: tuple) -> Iterator[tuple[list, TokenScores]]:
    """(a batch's windows, its scores) for each (windows, task) of score_parts' batches, made
    in this process one after another as they are needed (a long text is never held
    whole); shared (params, config, hooks, ahead). jobs.score.scored_on(engine) makes them
    on a cluster instead."""
    for chunk, task in batches:
        yield chunk, batch_scores([task], shared)[0]


def score_parts(
    params, config: Config, sequences: list[np.ndarray], *, stride: int | None = None,
    batch_size: int = 8, full_only: bool = False,
    progress: Callable[[int], None] | None = None, hooks=None, ahead=None, scored=None,
) -> Iterator[tuple[int, TokenScores, bool]]:
    """(index, scores of the next targets of that sequence, whether they are its last): the
    sequences in order, each one's targets in order, a window's as soon as the windows
    before it are done, so a long text's scores stream out and are never held whole.

    Windows of every sequence are batched together, longest first (right-padded: a causal
    model's earlier positions never see the padding); a sequence's windows are never longer
    than the ones before them, so they are done in order. `progress(k)` is called with the
    windows done. `ahead`: the passes --each-line makes ahead (final_hidden). `scored`
    (default scored_here) makes the batches' scores, in order, from (windows, task) pairs
    and the shared (params, config, hooks, ahead): a job may run them elsewhere.
    """

    context = config.n_positions
    stride = context if stride is None else stride
    jobs = [(i, w) for i, seq in enumerate(sequences)
            for w in windows(len(seq), context, stride, full_only=full_only)]
    # full windows first, then the shorter ends of texts by length, so a batch pads little
    jobs.sort(key=lambda job: -(job[1].end - job[1].start))
    waiting: dict[int, list[TokenScores]] = {}  # done, not yet given out, in window order
    remaining = {i: 0 for i in range(len(sequences))}
    for i, _ in jobs:
        remaining[i] += 1
    next_out = 0

    def ready() -> Iterator[tuple[int, TokenScores, bool]]:
        nonlocal next_out
        while next_out < len(sequences):
            parts = waiting.pop(next_out, [])
            done = remaining[next_out] == 0
            for k, part in enumerate(parts):
                yield next_out, part, done and k == len(parts) - 1
            if not done:
                return
            if not parts:  # no window at all (too short for --stream): nothing scored
                yield next_out, concat([]), True
            next_out += 1

    def batches() -> Iterator[tuple]:  # (the windows of a batch, its task)
        for b in range(0, len(jobs), batch_size):
            chunk = jobs[b : b + batch_size]
            width = max(w.end - w.start for _, w in chunk)
            x = np.zeros((len(chunk), width), dtype=np.int64)
            rows, cols, tgt = [], [], []
            for r, (i, w) in enumerate(chunk):
                x[r, : w.end - w.start] = sequences[i][w.start : w.end]
                # target t is predicted at window position t - 1 - start
                t = np.arange(w.first, w.end + 1)
                rows.append(np.full(len(t), r))
                cols.append(t - 1 - w.start)
                tgt.append(np.asarray(sequences[i])[t])
            yield chunk, (x, np.concatenate(rows), np.concatenate(cols),
                          np.concatenate(tgt).astype(np.int64))

    yield from _collected((scored or scored_here)(batches(), (params, config, hooks, ahead)),
                          waiting, remaining, ready, progress)


def _collected(scored, waiting: dict, remaining: dict, ready, progress):
    """Each batch's scores split by window into its text's waiting parts; what is ready
    yielded at once."""
    for chunk, s in scored:
        offset = 0
        for i, w in chunk:
            n = w.end + 1 - w.first
            waiting.setdefault(i, []).append(TokenScores(
                s.targets[offset : offset + n], s.nats[offset : offset + n],
                s.prob[offset : offset + n], s.rank[offset : offset + n],
                s.entropy[offset : offset + n], first=w.first - 1))
            offset += n
            remaining[i] -= 1
        if progress:
            progress(len(chunk))
        yield from ready()
    yield from ready()


def count_windows(lengths: Iterable[int], context: int, stride: int, full_only=False) -> int:
    return sum(len(windows(n, context, stride, full_only=full_only)) for n in lengths)


@dataclass
class Totals:
    tokens: int
    bytes: int
    nats: float  # sum of surprisals

    @property
    def mean_nats(self) -> float:
        return self.nats / self.tokens if self.tokens else float("nan")

    @property
    def perplexity(self) -> float:
        if not self.tokens:
            return float("nan")
        # past e**709 a float overflows: a model that sure of being wrong has no finite one
        return math.exp(self.mean_nats) if self.mean_nats < 709 else float("inf")

    @property
    def bits_per_token(self) -> float:
        return self.mean_nats / LN2

    @property
    def bits_per_byte(self) -> float:
        return self.nats / LN2 / self.bytes if self.bytes else float("nan")


@functools.lru_cache(maxsize=2)  # once per tokenizer: --each-line scores many texts
def byte_lengths(tokenizer) -> np.ndarray:
    """The UTF-8 bytes each vocabulary token stands for, [V] (read-only); the separator
    counts as one byte (the newline it stands for in the data files), as the model card
    counts."""
    out = np.asarray([len(tokenizer.token_bytes(i)) for i in range(tokenizer.n_rows)],
                     dtype=np.int64)
    out[tokenizer.eot_id] = 1
    out.flags.writeable = False
    return out


DRAWN_TOKENS = 2000  # a picture draws the first texts' tokens up to this many


@dataclass
class ScoreReport:
    """What `score` found over a set of texts: the totals (`summary`, as --json prints it),
    the most surprising tokens, and the per-text scores kept for the view and the picture.

    `offset`: how many ids were put before each text (the separator); positions count from
    the text's first token. `worst`: (nats, text index, position, rank, entropy), most
    surprising first. `shown`: every text's scores, or None when the text is not printed.
    `drawn`: the first texts' scores, up to DRAWN_TOKENS tokens, for a picture."""

    summary: dict
    sequences: list[np.ndarray]
    offset: int
    n_windows: int
    worst: list[tuple[float, int, int, int, float]]
    shown: list[TokenScores] | None
    drawn: list[TokenScores]
    drawn_tokens: int = DRAWN_TOKENS  # the most a picture draws (render cuts `drawn` to it)


def score_texts(params, config: Config, sequences: list[np.ndarray], nbytes: np.ndarray, *,
                stride: int, stream: bool, offset: int, top: int, keep: bool, draw: bool,
                stream_bpt: float | None = None,
                on_scores: Callable[[int, TokenScores], None] | None = None,
                progress: Callable[[int], None] | None = None, hooks=None,
                ahead=None, scored=None) -> ScoreReport:
    """Score every text (`score_parts`), adding up the totals as the scores come, so a
    whole file or text never has to be held: only the `top` most surprising tokens, each
    text's surprisals until it is summed (as one array, as it always was), the texts' scores
    when `keep`, and the first texts' when `draw`. `on_scores(i, s)` sees each part of a
    text's scores as it is done (the --json lines stream from it; s.first says where in the
    text it starts). `stream_bpt`: the bytes per token of a whole stream (--stream), counted
    instead of the tokens' own bytes, as the card does. `hooks` (steering) go into every run;
    `ahead`: the passes --each-line makes ahead (final_hidden); `scored`: where the batches
    are scored (score_parts; jobs.score.scored_on(engine) for a cluster's workers)."""
    total = Totals(0, 0, 0.0)
    worst: list[tuple] = []
    kept: list[TokenScores] = []
    drawn: list[TokenScores] = []
    parts: list[TokenScores] = []  # the current text's, for the sums (and the views)
    for i, s, last in score_parts(params, config, sequences, stride=stride, full_only=stream,
                                  progress=progress, hooks=hooks, ahead=ahead,
                                  scored=scored):
        total.tokens += len(s.targets)
        total.bytes += int(nbytes[s.targets].sum())
        if on_scores is not None:
            on_scores(i, s)
        if top:
            most = np.argsort(-s.nats, kind="stable")[:top]
            worst += [(float(s.nats[j]), i, 1 + s.first + int(j) - offset, int(s.rank[j]),
                       float(s.entropy[j])) for j in most]
            worst = sorted(worst, reverse=True)[:top]
        # only the surprisals are kept for the sum, unless a view needs the whole text
        whole = keep or (draw and sum(len(d.targets) for d in drawn) < DRAWN_TOKENS)
        parts.append(s if whole else TokenScores(s.targets[:0], s.nats, s.prob[:0],
                                                 s.rank[:0], s.entropy[:0], s.first))
        if not last:
            continue
        text = concat(parts)
        parts = []
        total.nats += float(text.nats.sum())
        if whole and draw and sum(len(d.targets) for d in drawn) < DRAWN_TOKENS:
            drawn.append(text)
        if keep:
            kept.append(text)
    summary = {"summary": True, "path": "score", "tokens": total.tokens, "bytes": total.bytes,
               "mean_nats": total.mean_nats, "perplexity": total.perplexity,
               "bits_per_token": total.bits_per_token, "bits_per_byte": total.bits_per_byte,
               "sequences": len(sequences), "context": config.n_positions, "stride": stride,
               "stream": stream, "separator_first": bool(offset)}
    if stream_bpt is not None:
        # the card's count: mean nats / ln 2 / (bytes per token of the whole stream)
        summary["bits_per_byte"] = total.bits_per_token / stream_bpt
        summary["bytes_per_token"] = stream_bpt
    n_windows = count_windows([len(s) for s in sequences], config.n_positions, stride,
                              full_only=stream)
    return ScoreReport(summary, sequences, offset, n_windows, worst,
                       kept if keep else None, drawn)
