"""Where two runs part: two texts through one model, or one text through two models.

Two texts: at each stage of the residual stream (the embeddings, then after each block) and
each position both texts have (aligned from the start), the cosine similarity of the two
vectors and their relative distance ||a - b|| / ||a||.

Two models on one text, as `llama-perplexity --kl-divergence` reports: per position the KL
divergence KL(P_a || P_b) of the next-token distributions (a is the base), whether the top
tokens agree, and the change p_b - p_a in the probability of the token that actually comes
next.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError
from ..transformer import ops
from ..transformer.sampling import probabilities
from ..transformer.wiring import FORWARD

# The blocks this analysis implements (wiring.require refuses others by name): recorded values of
# two runs compared.
HANDLES = FORWARD


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity.  [..., d], [..., d] -> [...]"""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    na, nb = np.linalg.norm(a, axis=-1), np.linalg.norm(b, axis=-1)
    return (a * b).sum(axis=-1) / np.maximum(na * nb, 1e-30)


def relative_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """||a - b|| / ||a||, row-wise.  [..., d] -> [...]"""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b, axis=-1) / np.maximum(np.linalg.norm(a, axis=-1), 1e-30)


def stream_diff(stages_a: list[np.ndarray], stages_b: list[np.ndarray]
                ) -> tuple[np.ndarray, np.ndarray]:
    """(cosine, relative distance), each [stages, T] over the positions both runs have."""
    t = min(stages_a[0].shape[0], stages_b[0].shape[0])
    a = np.stack([s[:t] for s in stages_a])
    b = np.stack([s[:t] for s in stages_b])
    return cosine(a, b), relative_distance(a, b)


@dataclass
class ModelDiff:
    kl: np.ndarray  # [T] KL(P_a || P_b) at each position, nats
    top_a: np.ndarray  # [T] top-1 id under a
    top_b: np.ndarray
    p_next_a: np.ndarray  # [T-1] probability of ids[t+1] at position t, under a
    p_next_b: np.ndarray

    @property
    def same_top(self) -> np.ndarray:
        return self.top_a == self.top_b

    @property
    def delta_p(self) -> np.ndarray:
        return self.p_next_b - self.p_next_a

    def summary(self) -> dict:
        dp = self.delta_p
        return {
            "mean_kl": float(self.kl.mean()),
            "median_kl": float(np.median(self.kl)),
            "max_kl": float(self.kl.max()),
            "same_top": float(self.same_top.mean()),
            "mean_delta_p": float(dp.mean()) if dp.size else None,
            "rms_delta_p": float(np.sqrt((dp * dp).mean())) if dp.size else None,
        }


def kl_divergence(logits_a: np.ndarray, logits_b: np.ndarray) -> np.ndarray:
    """KL(softmax(a) || softmax(b)) per row, in nats.  [T, V], [T, V] -> [T]"""
    la = ops.log_softmax(np.asarray(logits_a, np.float64))
    lb = ops.log_softmax(np.asarray(logits_b, np.float64))
    return np.maximum((np.exp(la) * (la - lb)).sum(axis=-1), 0.0)


def model_diff(logits_a: np.ndarray, logits_b: np.ndarray, ids) -> ModelDiff:
    ids = np.asarray(ids)
    pa = ops.softmax(np.asarray(logits_a, np.float64))
    pb = ops.softmax(np.asarray(logits_b, np.float64))
    nxt = ids[1:]
    t = np.arange(len(nxt))
    return ModelDiff(kl_divergence(logits_a, logits_b), pa.argmax(-1), pb.argmax(-1),
                     pa[t, nxt], pb[t, nxt])


@dataclass
class TextDiff:
    """Two texts through one model: per residual stage and position (aligned from the
    start), cosine and relative distance [S, n]; each run's top next token and its chance."""

    a: object  # Session
    b: object
    stages: list[str]
    cosine: np.ndarray
    distance: np.ndarray
    top_a: list[tuple[str, float]]
    top_b: list[tuple[str, float]]


def text_diff(a, b) -> TextDiff:

    ta, tb = a.trace(), b.trace()
    stages = ta.stages()
    cos, dist = stream_diff([h for _, h in stages], [h for _, h in tb.stages()])
    n = cos.shape[1]
    tok = a.model.tokenizer

    def tops(tr):
        p = probabilities(tr.get("logits")[:n])
        return [(tok.token_str(int(i)), float(p[r, i])) for r, i in enumerate(p.argmax(-1))]

    return TextDiff(a, b, [name for name, _ in stages], cos, dist, tops(ta), tops(tb))


@dataclass
class ModelsDiff:
    """One text through two models (sessions a and b): `diff`, and each one's top tokens.
    `differing`: {config field: (a's, b's)} where the two models' shapes or architectures
    differ; only the next-token distributions are compared then, as always (they need only
    the one vocabulary)."""

    a: object  # Session
    b: object
    diff: ModelDiff
    top_a: list[str]
    top_b: list[str]
    differing: dict = field(default_factory=dict)


SHAPE_FIELDS = ("model_type", "n_layer", "n_embd", "n_head", "head_dim", "n_kv_head", "n_inner",
                "n_positions", "vocab_size", "norm", "positions", "mlp", "act", "tied",
                "parallel")


def config_differences(a, b) -> dict:
    """{field: (a's, b's)} of the configs' sizes and architecture knobs that differ."""
    return {f: (getattr(a, f), getattr(b, f)) for f in SHAPE_FIELDS
            if getattr(a, f) != getattr(b, f)}


def check_second_model(a, model_b) -> None:
    """Can session a's ids go through model_b? The models may differ in every size but the
    vocabulary: their tokenizers must give every text the same ids, with the same tokens put
    around it (Tokenizer.differs_from: the folder's <bos>), and the text must fit model_b's
    context."""

    why = a.model.tokenizer.differs_from(model_b.tokenizer)
    if why is not None:
        raise InputError(f"the two weights folders' tokenizers differ ({why}): diff compares "
                         "next-token distributions, which needs one vocabulary")
    limit = model_b.config.n_positions
    if a.T > limit:
        raise InputError(f"the text is {a.T} tokens long; the second model reads at most "
                         f"{limit}")


def models_diff(a, b) -> ModelsDiff:
    """Sessions a and b, of one text's ids (check_second_model; jobs.diff.second_session
    makes b), each through its own model; a vocabulary padded to more rows in one model is
    compared over the tokenizer's tokens."""

    model_a = a.model
    la, lb = a.run(), b.run()
    if la.shape[-1] != lb.shape[-1]:  # padded rows are no token: the tokenizer's alone
        n = min(model_a.tokenizer.vocab_size, la.shape[-1], lb.shape[-1])
        la, lb = la[:, :n], lb[:, :n]
    d = model_diff(la, lb, a.ids)
    tok = model_a.tokenizer
    return ModelsDiff(a, b, d, [tok.token_str(int(i)) for i in d.top_a],
                      [tok.token_str(int(i)) for i in d.top_b],
                      config_differences(model_a.config, b.model.config))
