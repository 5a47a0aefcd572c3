"""The tuned lens (Belrose et al. 2023): the logit lens with a learned affine translator per stage.

Stage i is the residual entering block i (i = 0..L-1; stage 0 is the embeddings). Its readout is

    unembed(ln_final(h + h A_i + b_i))        (A_i = 0, b_i = 0: exactly the logit lens)

with the final LayerNorm's statistics recomputed on the translated stream, as the logit lens
does. The translators are fitted on the KL divergence from the model's final next-token
distribution to the lens's, KL(p_final || p_lens), averaged over tokens; Adam, an explicit
backward through the final norm and the tied head.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError, WeightsError
from ..jobs.cluster import over_windows
from ..jobs.corpus import data_windows, given_or, held_out_files, training_files
from ..storage.files import write_atomically
from ..storage.madefor import check_made_for, made_for, remake_hint, weights_option
from ..storage.safetensors import metadata_strings, read_safetensors, safetensors_bytes
from ..transformer import ops
from ..transformer.config import Config
from ..transformer.hooks import RecordOnly, chained
from ..transformer.model import forward, head_table, norm_weights, read_out
from ..transformer.optim import SAE_BETAS, AdamW
from ..transformer.wiring import FORWARD
from .lens import Lens

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
                 progress: Callable[[int], None] | None = None, hooks=None, engine=None
                 ) -> tuple[list[np.ndarray], np.ndarray]:
    """Each stage's stream [W*T, d], and the stream entering ln_final, over windows [W, T],
    of runs through `hooks` (steering: a steered stage is read with its vector added) when
    given, each shard of windows a task on `engine` (default: this process), joined in window
    order (the same numbers: a shard holds whole batches). `progress(n)` is called with the
    windows done."""

    parts = over_windows(engine, shard_stage_values, windows, (params, config, batch, hooks),
                         progress=progress)
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
                     engine=None) -> LensEval:
    """`evaluate` over the tokens of windows [W, T]: their stage values (of runs through
    `hooks` when given: the steered model), then both lenses.
    `progress(n)` is called with the tokens done, 2 W T in all."""
    per_window = windows.shape[1]
    stages, last = stage_values(params, config, windows,
                                progress=progress and (lambda n: progress(n * per_window)),
                                hooks=hooks, engine=engine)
    return evaluate(stages, last, tr, params, config, progress=progress)


def tuned_stage_logits(trace, tr: Translators, params, config: Config
                       ) -> tuple[list[str], np.ndarray]:
    """The tuned lens of one text: each stage's logits [S, T, V], then the model's own (named
    for the stream they are read from, the last block's resid_post)."""
    names = stage_paths(config)
    hs = [translated(trace.get(p), tr, i) for i, p in enumerate(names)]
    logits = [readout(h, params, config) for h in hs] + [np.asarray(trace.get("logits"))]
    return [*names, f"layers.{config.n_layer - 1}.resid_post"], np.stack(logits)


def save_translators(path: str | Path, tr: Translators, meta: dict[str, str]) -> None:

    t = {f"A.{i}": np.ascontiguousarray(a, np.float32) for i, a in enumerate(tr.A)}
    t.update({f"b.{i}": np.ascontiguousarray(b, np.float32) for i, b in enumerate(tr.b)})
    write_atomically(Path(path), safetensors_bytes(t, metadata_strings(meta)))


def load_translators(path: str | Path, config: Config, weights_file: Path) -> Translators:
    """The translators of a tuned lens file, checked: every stage's A [d, d] and b [d],
    finite, made for `weights_file` (madefor)."""

    path = Path(path)
    if not path.is_file():
        raise InputError(f"no tuned lens at {path}: {fit_hint(weights_file, path)}")
    t, meta = read_safetensors(path)
    d = config.n_embd
    out = Translators([], [], str(path))
    for i in range(config.n_layer):
        for name, shape, into in ((f"A.{i}", (d, d), out.A), (f"b.{i}", (d,), out.b)):
            x = t.get(name)
            if x is None or x.shape != shape or not np.issubdtype(x.dtype, np.floating) \
                    or not np.isfinite(x).all():
                got = "missing" if x is None else f"shape {list(x.shape)}, {x.dtype}"
                raise WeightsError(f"{path}: {name} must be {list(shape)} finite floats "
                                   f"({got})")
            into.append(np.asarray(x, np.float32))
    check_made_for(path, meta, weights_file, "the tuned lens",
                   fit_hint(weights_file, path, "fit one for them"))
    return out


def fit_hint(weights_file: Path, path: Path, verb: str = "fit one") -> str:
    """The command that fits the tuned lens at `path` (the weights folder's, or the --lens
    file named) for these weights, never into the installed package."""


    default = lens_file(weights_file, None)
    if Path(path) != default:
        return (f"{verb} with `tinygpt lens --fit{weights_option(Path(weights_file).parent)} "
                f"--lens {shlex.quote(str(path))}`")
    return remake_hint(verb, "lens --fit", weights_file, default, "--lens", "tuned.safetensors",
                       "--lens")


# ------------------------------------------------------------------ the lens of a weights folder

KINDS = ("logit", "tuned")
FIT_WINDOWS = 200  # 25,600 training tokens
EVAL_WINDOWS = 40  # 5,120 held-out tokens
FIT_STEPS = 300  # Adam steps per stage, 512 tokens each


def check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise InputError(f"--kind must be logit or tuned, not {kind!r}")
    return kind


def lens_file(weights_file: Path, given: Path | None) -> Path:
    """--lens, or the weights folder's lens/tuned.safetensors."""
    return given if given is not None else Path(weights_file).parent / "lens" / "tuned.safetensors"


def tuned_reader(session, given: Path | None):
    """trace -> the tuned lens of the session's text as a Lens (stages, logits), the model's
    logits last: lens_report's reader."""

    def read(trace):
        path = lens_file(session.model.weights_file, given)
        translators = load_translators(path, session.config, session.model.weights_file)
        return Lens(*tuned_stage_logits(trace, translators, session.params, session.config))

    return read


def fit_and_save(model, windows: np.ndarray, path: Path, bar, hooks=None,
                 meta: dict | None = None, engine=None) -> int:
    """Fit the translators on the windows' stages (of runs through `hooks`, when given, on
    `engine`) and write them to `path` with `meta` added to their metadata; the tokens used.
    bar(total, description) is the progress bar's context manager."""

    cfg = model.config
    with bar(len(windows), "values of the stages") as advance:
        stages, last = stage_values(model.params, cfg, windows, progress=advance, hooks=hooks,
                                    engine=engine)
    with bar(FIT_STEPS * cfg.n_layer, "fitting the tuned lens") as advance:
        translators, _ = fit(stages, last, model.params, cfg, steps=FIT_STEPS, progress=advance)
    save_translators(path, translators, {**made_for(model.weights_file),
                                         "tokens": str(len(last)), "steps": str(FIT_STEPS),
                                         **(meta or {})})
    return len(last)


def fit_on_training_text(model, data, path, bar, hooks=None, changes=None, engine=None) -> int:
    """`lens --fit`: translators fitted on FIT_WINDOWS windows of the training text (--data's
    parts but the last, or the project's) and saved to `path`; the number of tokens."""

    x, _ = data_windows(training_files(data), model.tokenizer, model.config.n_positions,
                        FIT_WINDOWS, bar)
    return fit_and_save(model, x, path, bar, hooks, changes, engine)


def evaluate_held_out(model, data, translators, bar, hooks=None, engine=None):
    """`lens --evaluate`: both lenses over EVAL_WINDOWS windows of the held-out text (--data's
    last part, or part-005); (the LensEval, the files' names)."""

    files = given_or(data, held_out_files)
    x, _ = data_windows(files, model.tokenizer, model.config.n_positions, EVAL_WINDOWS, bar)
    with bar(2 * x.size, "evaluating both lenses") as advance:
        result = evaluate_windows(model.params, model.config, x, translators, advance, hooks,
                                  engine)
    return result, [f.name for f in files]
