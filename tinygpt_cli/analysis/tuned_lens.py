"""The tuned lens (Belrose et al. 2023): the logit lens with a learned affine translator per stage.

Stage i is the residual entering block i (i = 0..L-1; stage 0 is the embeddings). Its readout is

    unembed(ln_final(h + h A_i + b_i))        (A_i = 0, b_i = 0: exactly the logit lens)

with the final LayerNorm's statistics recomputed on the translated stream, as the logit lens
does. The translators are fitted on the KL divergence from the model's final next-token
distribution to the lens's, KL(p_final || p_lens), averaged over tokens; Adam, an explicit
backward through the final norm and the tied head. The translators' file is
jobs/dictionaries/lens.py's, the passes over a corpus jobs/tuned_lens.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import InputError, WeightsError
from ..transformer import ops
from ..transformer.config import Config
from ..transformer.hooks import RecordOnly, chained
from ..transformer.model import forward, head_table, norm_weights, read_out
from ..transformer.optim import SAE_BETAS, AdamW
from ..transformer.wiring import FORWARD

# The blocks this analysis implements (wiring.require refuses others by name): translators of the
# stream's stages: any wiring the passes compute.
HANDLES = FORWARD


def stage_paths(config: Config) -> list[str]:
    """The residual entering each block: layers.i.resid_pre, i = 0..L-1."""
    return [f"layers.{i}.resid_pre" for i in range(config.n_layer)]


@dataclass
class Translators:
    A: list[np.ndarray]  # noqa: N815 per stage [d, d]
    b: list[np.ndarray]  # per stage [d]
    path: str = "the tuned lens"  # the file they were read from, for errors


def zero_translators(config: Config) -> Translators:
    d = config.n_embd
    return Translators([np.zeros((d, d), np.float32) for _ in range(config.n_layer)],
                       [np.zeros(d, np.float32) for _ in range(config.n_layer)])


def translate(h: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """h + h A + b.  [..., d] -> [..., d]"""
    return h + h @ a + b


def translated(h: np.ndarray, tr: Translators, i: int) -> np.ndarray:
    """translate(h) by stage i's translator, whose use must stay finite: a value or a sum of
    squares (the final norm's statistics) past float32 is WeightsError naming the file."""
    with np.errstate(all="ignore"):
        t = translate(h, tr.A[i], tr.b[i])
        ok = np.isfinite(np.einsum("...d,...d->...", t, t)).all()
    if not ok:
        raise WeightsError(f"{tr.path}: stage {i}'s translator (A.{i}, b.{i}) overflows "
                           "float32 on this text: its numbers are too large to compute with")
    return t


def readout(h: np.ndarray, params, config: Config) -> np.ndarray:
    """ln_final(h) W_E^T, the norm's statistics from h itself.  [..., d] -> [..., V]"""
    return read_out(params, config, h)


def kl_divergence(logp_ref: np.ndarray, logp: np.ndarray) -> np.ndarray:
    """KL(p_ref || p) over the last axis, in nats.  [..., V] -> [...]"""
    return (np.exp(logp_ref) * (logp_ref - logp)).sum(axis=-1)


# ------------------------------------------------------------------ fitting


def kl_and_grads(h: np.ndarray, a: np.ndarray, b: np.ndarray, logp_final: np.ndarray,
                 params, config: Config) -> tuple[float, np.ndarray, np.ndarray]:
    """Mean KL(p_final || lens(h)) over tokens h [N, d], and its gradient for A and b."""
    n = h.shape[0]
    t = translate(h, a, b)
    gain, bias = norm_weights(params, "ln_final")
    eps, head = config.layer_norm_epsilon, params[head_table(config)]
    if bias is None:  # an RMSNorm
        u, rms = ops.rms_norm(t, gain, eps)
    else:
        u, mean, std = ops.layer_norm(t, gain, bias, eps)
    logits = ops.unembed(u, head).astype(np.float64)
    logp = ops.log_softmax(logits)
    kl = float(kl_divergence(logp_final, logp).mean())
    dlogits = ((np.exp(logp) - np.exp(logp_final)) / n).astype(np.float32)  # [N, V]
    du = dlogits @ head  # the head's backward: [N, d]
    dt = (ops.rms_norm_backward(du, t, gain, rms) if bias is None
          else ops.layer_norm_backward(du, t, gain, mean, std))[0]
    return kl, h.T @ dt, dt.sum(axis=0)


def final_log_probs(h_last: np.ndarray, params, config: Config) -> np.ndarray:
    return ops.log_softmax(readout(h_last, params, config).astype(np.float64))


def fit(stages: list[np.ndarray], h_last: np.ndarray, params, config: Config, *,
        steps: int = 300, batch: int = 512, lr: float = 1e-3, seed: int = 0,
        progress: Callable[[int], None] | None = None) -> tuple[Translators, list[float]]:
    """Translators for each stage's tokens [N, d], fitted to the final distribution read from
    h_last [N, d] (the stream entering ln_final). Starts at zero: step 0 is the logit lens."""
    tr = zero_translators(config)
    losses = []
    for i, h in enumerate(stages):
        params_i = {"A": tr.A[i], "b": tr.b[i]}
        adam = AdamW(params_i, betas=SAE_BETAS, weight_decay=0.0)
        for step in range(steps):
            rows = np.random.default_rng([seed, i, step]).integers(0, len(h), size=batch)
            logp_final = final_log_probs(h_last[rows], params, config)
            kl, da, db = kl_and_grads(h[rows], tr.A[i], tr.b[i], logp_final, params, config)
            adam.step(params_i, {"A": da, "b": db}, lr * min(1.0, 4 * (steps - step) / steps))
            if step == steps - 1:
                losses.append(kl)
            if progress:
                progress(1)
    return tr, losses


def stage_values(params, config: Config, windows: np.ndarray, batch: int = 16,
                 progress: Callable[[int], None] | None = None, hooks=None, over=None
                 ) -> tuple[list[np.ndarray], np.ndarray]:
    """Each stage's stream [W*T, d], and the stream entering ln_final, over windows [W, T],
    of runs through `hooks` (steering: a steered stage is read with its vector added) when
    given, each shard of windows a task of `over` (a job's jobs.cluster.over_windows, on a
    cluster too; None: this process at once), joined in window order (the same numbers: a
    shard holds whole batches). `progress(n)` is called with the windows done."""

    if over is None:
        return one_pass_stages(params, config, windows, batch, progress, hooks)
    parts = over(shard_stage_values, windows, (params, config, batch, hooks), progress=progress)
    if not parts:
        return one_pass_stages(params, config, windows, batch, hooks=hooks)
    return ([np.concatenate([p[0][i] for p in parts]) for i in range(len(parts[0][0]))],
            np.concatenate([p[1] for p in parts]))


def shard_stage_values(task: tuple, shared: tuple) -> tuple[list[np.ndarray], np.ndarray]:
    params, config, batch, hooks = shared
    return one_pass_stages(params, config, task[1], batch, hooks=hooks)


def one_pass_stages(params, config: Config, windows: np.ndarray, batch: int = 16,
                    progress: Callable[[int], None] | None = None, hooks=None
                    ) -> tuple[list[np.ndarray], np.ndarray]:
    """stage_values in this process, batch after batch."""
    paths = stage_paths(config)
    last = f"layers.{config.n_layer - 1}.resid_post"
    got: dict[str, list] = {p: [] for p in [*paths, last]}
    for b0 in range(0, len(windows), batch):
        rec = RecordOnly(set(got))
        forward(params, config, windows[b0:b0 + batch], hooks=chained(hooks, rec))
        for p in got:
            v = rec.values[p]
            got[p].append(np.asarray(v, np.float32).reshape(-1, v.shape[-1]))
        if progress:
            progress(len(windows[b0:b0 + batch]))
    return [np.concatenate(got[p]) for p in paths], np.concatenate(got[last])


# ------------------------------------------------------------------ reading and evaluating


@dataclass
class LensEval:
    stages: list[str]
    tokens: int
    kl_logit: np.ndarray  # [L] mean KL(final || logit lens), nats
    kl_tuned: np.ndarray  # [L]
    top1_logit: np.ndarray  # [L] fraction of tokens whose top guess is the model's
    top1_tuned: np.ndarray


def evaluate(stages: list[np.ndarray], h_last: np.ndarray, tr: Translators, params,
             config: Config, batch: int = 512,
             progress: Callable[[int], None] | None = None) -> LensEval:
    """KL(final || lens) and top-1 agreement of the logit and the tuned lens at each stage,
    over the tokens [N, d]; `progress(n)` is called with the tokens done."""
    n_stage = len(stages)
    kl = np.zeros((2, n_stage))
    top1 = np.zeros((2, n_stage))
    n = len(h_last)
    for b0 in range(0, n, batch):
        logp_final = final_log_probs(h_last[b0:b0 + batch], params, config)
        best = logp_final.argmax(axis=-1)
        for i, h in enumerate(stages):
            hb = h[b0:b0 + batch]
            for j, x in enumerate((hb, translated(hb, tr, i))):
                logp = ops.log_softmax(readout(x, params, config).astype(np.float64))
                kl[j, i] += kl_divergence(logp_final, logp).sum()
                top1[j, i] += (logp.argmax(axis=-1) == best).sum()
        if progress:
            progress(len(h_last[b0:b0 + batch]))
    kl, top1 = kl / n, top1 / n
    return LensEval(stage_paths(config), n, kl[0], kl[1], top1[0], top1[1])


def evaluate_windows(params, config: Config, windows: np.ndarray, tr: Translators,
                     progress: Callable[[int], None] | None = None, hooks=None,
                     over=None) -> LensEval:
    """`evaluate` over the tokens of windows [W, T]: their stage values (of runs through
    `hooks` when given: the steered model), then both lenses.
    `progress(n)` is called with the tokens done, 2 W T in all."""
    per_window = windows.shape[1]
    stages, last = stage_values(params, config, windows,
                                progress=progress and (lambda n: progress(n * per_window)),
                                hooks=hooks, over=over)
    return evaluate(stages, last, tr, params, config, progress=progress)


def tuned_stage_logits(trace, tr: Translators, params, config: Config
                       ) -> tuple[list[str], np.ndarray]:
    """The tuned lens of one text: each stage's logits [S, T, V], then the model's own (named
    for the stream they are read from, the last block's resid_post)."""
    names = stage_paths(config)
    hs = [translated(trace.get(p), tr, i) for i, p in enumerate(names)]
    logits = [readout(h, params, config) for h in hs] + [np.asarray(trace.get("logits"))]
    return [*names, f"layers.{config.n_layer - 1}.resid_post"], np.stack(logits)


# ------------------------------------------------------------------ the lens asked for

KINDS = ("logit", "tuned")


def check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise InputError(f"--kind must be logit or tuned, not {kind!r}")
    return kind


