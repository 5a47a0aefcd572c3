"""The logit lens: read the residual stream after each block as if it were the last one."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..transformer import ops
from ..transformer.config import Config
from ..transformer.model import read_out
from ..transformer.sampling import probabilities
from ..transformer.schema import with_old_keys
from ..transformer.trace import Trace
from ..transformer.wiring import FORWARD
from .question import ask

# The blocks this analysis implements (wiring.require refuses others by name): the stream's stages
# read by the final norm: any wiring the passes compute.
HANDLES = FORWARD


def lens_logits(h: np.ndarray, params: dict[str, np.ndarray], config: Config) -> np.ndarray:
    """ln_final(h) W_U: the next-token scores the model would give if it stopped at h (the
    model's own final norm and head, so the last stage is the logits bit for bit)."""
    return read_out(params, config, h)


ADDED = {"attn_out": "ln1_post.out", "mlp_out": "ln2_post.out"}  # a norm after the branch


def block_summary(trace: Trace, params, config: Config, position: int = -1) -> list[dict]:
    """Per stage: residual norms per token, how much the block changed the stream, the lens guess.

    `change` is ||h_after - h_before|| / ||h_before|| per token; `top` is the most likely next
    token at `position` read through the final norm and the tied head.
    """
    rows = []
    prev = None
    for stage, (name, h) in enumerate(trace.stages()):
        probs = probabilities(lens_logits(h[position], params, config))
        top = int(np.argmax(probs))
        norms = np.linalg.norm(h, axis=-1)
        row = with_old_keys({"stage": name, "norm": norms, "top_id": top,
                             "top_chance": float(probs[top])})
        if prev is not None:
            row["change"] = np.linalg.norm(h - prev, axis=-1) / np.linalg.norm(prev, axis=-1)
            i = stage - 1  # the block that made this stage
            for branch, out in (("attn", "attn_out"), ("mlp", "mlp_out")):
                # what the branch adds: Gemma's norm after it, not its output before that
                added = ADDED.get(out, out) if f"layers.{i}.{ADDED[out]}" in trace else out
                row[f"{branch}_norm"] = np.linalg.norm(trace.get(f"layers.{i}.{added}"),
                                                       axis=-1)
                row[f"{branch}_added"] = added
        rows.append(row)
        prev = h
    return rows


def top_neurons(mlp_post: np.ndarray, k: int) -> list[dict]:
    """The k hidden neurons with the largest activation anywhere in the text. [T, ff] -> k rows"""
    peak = mlp_post.max(axis=0)
    order = np.argsort(-peak, kind="stable")[:k]
    return [{"neuron": int(n), "max": float(peak[n]), "position": int(np.argmax(mlp_post[:, n])),
             "activations": mlp_post[:, n]} for n in order]


def top_entries(values: np.ndarray, k: int, token_str, name: str) -> list[dict]:
    """The k highest entries of a vocabulary-sized row, with their tokens, {id, token, name}."""
    return [{"id": int(i), "token": token_str(int(i)), name: float(values[i])}
            for i in top_order(values, k)]


def top_order(values: np.ndarray, k: int) -> np.ndarray:
    """np.argsort(-values, kind="stable")[:k] (highest first, ties by id), sorting only the
    entries at least as high as the k-th: a whole row's sort was a tenth of a `probs` run."""
    values = np.asarray(values)
    if not 0 < k < len(values) or np.isnan(values).any():
        return np.argsort(-values, kind="stable")[:k]
    kth = np.partition(values, len(values) - k)[len(values) - k]  # the k-th highest
    high = np.flatnonzero(values >= kth)  # in id order, every tie of the k-th included
    return high[np.argsort(-values[high], kind="stable")][:k]


# ------------------------------------------------------------------ the logit lens at every stage


@dataclass
class Lens:
    """The logit lens of one text: every stage read as if it were the last.

    logits[s, t] are the scores stage s would give at position t: the final LayerNorm with
    its mean and std recomputed from that stage's own stream, then the tied head. The last
    stage is the model's own logits.
    """

    stages: list[str]
    logits: np.ndarray  # [S, T, V]

    @property
    def log_probs(self) -> np.ndarray:  # [S, T, V], float64
        z = self.logits.astype(np.float64)
        return ops.log_softmax(z)

    def top(self) -> tuple[np.ndarray, np.ndarray]:
        """The likeliest token at every stage and position, and its chance: [S, T] each."""
        logp = self.log_probs
        ids = np.argmax(logp, axis=-1)
        return ids, np.exp(np.take_along_axis(logp, ids[..., None], axis=-1)[..., 0])

    def target(self, token: int, position: int) -> tuple[np.ndarray, np.ndarray]:
        """The chance of `token` at `position` at every stage [S], and its rank there (1 is
        the top): one more than how many tokens score strictly higher."""
        z = self.logits[:, position, :]
        logp = ops.log_softmax(z.astype(np.float64))
        rank = (z > z[:, token : token + 1]).sum(axis=-1) + 1
        return np.exp(logp[:, token]), rank


def logit_lens(trace: Trace, params: dict[str, np.ndarray], config: Config) -> Lens:
    """Every stage of the stream through ln_final (statistics recomputed) and W_U. Each
    stage on its own, in the shape the pass had it: one product for all stages would round
    some logits differently from the pass's own, and the last stage must be them exactly."""
    stages = trace.stages(mid=True)
    return Lens([name for name, _ in stages],
                np.stack([lens_logits(h, params, config) for _, h in stages]))


@dataclass
class LensReport:
    """The logit lens of a text with the question it answers: each stage's likeliest token
    and its chance ([S, T]), and the target's chance and rank at every stage ([S])."""

    q: object  # analysis.question.Question
    stages: list[str]
    top_ids: np.ndarray
    top_probs: np.ndarray
    top_tokens: list[list[str]]  # [T][S]
    target_probs: np.ndarray
    target_ranks: np.ndarray
    kind: str = "logit"  # or "tuned": which lens read the stages, for every view to say
    tied: bool = True  # whether the output head is the embedding table (GPT-2) or its own W_U


def lens_report(session, position: int, target: str | None, reader=None) -> LensReport:
    """The lens at every stage and position; `reader(trace)` gives another lens's result
    (the tuned lens) in place of the logit lens."""
    p = session.position(position)
    tr = session.trace()
    q = ask(session, tr.get("logits")[p], p, target, None)
    result = reader(tr) if reader else logit_lens(tr, session.params, session.config)
    top_ids, top_probs = result.top()  # [S, T]
    probs, ranks = result.target(q.target, p)
    top_tokens = [[q.token_str(int(i)) for i in row] for row in top_ids.T]
    return LensReport(q, result.stages, top_ids, top_probs, top_tokens, probs, ranks,
                      "tuned" if reader else "logit", session.config.tied)
