"""Ablation: take one component out of the forward pass and see what the prediction loses.

A component is one head's output (`layers.L.heads.H.out`, before W_O) or one block's MLP
output (`layers.L.mlp_out`). Its value is replaced by

- zero: as if the head's rows of W_O (or the whole MLP) were cut out; the bias stays;
- mean: its average over a reference text, the same vector at every position;
- resample: its value at the same positions in the run of another text.

The effect is the change in the target's log-probability at the scored position and the KL
divergence KL(before || after) of the whole next-token distribution there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..transformer import ops
from ..transformer.config import Config
from ..transformer.hooks import Chain, ablation
from ..transformer.model import record
from ..transformer.schema import head_name, mlp_name, resolve, with_old_keys
from ..transformer.wiring import FORWARD
from ..words import count
from .question import ask
from .sae import latent_ablation
from .variants import Edit, run_variants, set_all, widen

# The blocks this analysis implements (wiring.require refuses others by name): a value changed,
# the model's own pass run on.
HANDLES = FORWARD

MODES = ("zero", "mean", "resample")


def head_path(layer: int, head: int) -> str:
    return f"layers.{layer}.heads.{head}.out"


def mlp_path(layer: int) -> str:
    return f"layers.{layer}.mlp_out"


def component_label(path: str) -> str:
    """layers.1.heads.2.out -> L1H2; layers.1.mlp_out -> L1.mlp (schema's short names)."""
    parts = path.split(".")
    return head_name(int(parts[1]), int(parts[3])) if parts[2] == "heads" \
        else mlp_name(int(parts[1]))


def all_components(config: Config) -> list[str]:
    """Every head of every block, then every MLP."""
    return [head_path(i, h) for i in range(config.n_layer) for h in range(config.n_head)] + \
        [mlp_path(i) for i in range(config.n_layer)]


def replacement(mode: str, path: str, *, means: Mapping[str, np.ndarray] | None = None,
                source: Mapping[str, np.ndarray] | None = None) -> Edit:
    """What the component's value becomes: zeros, its mean vector, or another run's value."""
    if mode == "zero":
        return np.zeros_like
    if mode == "mean":
        return set_all(np.asarray(means[path]))
    if mode == "resample":
        other = np.asarray(source[path])
        return lambda x: other[: x.shape[0]]
    raise ValueError(f"unknown ablation mode {mode!r}: use one of {', '.join(MODES)}")


def source_values(params: dict[str, np.ndarray], config: Config,
                  ids: Sequence[int], hooks=None) -> dict[str, np.ndarray]:
    """Every value of another text's run, for resampling; in float64 like the ablated runs."""
    return record(widen(params), config, np.asarray(ids), hooks=hooks)[1]


@dataclass
class Effect:
    """What taking out `paths` did to the prediction at one position."""

    paths: list[str]
    logp_before: float  # log p(target), the unchanged run
    logp_after: float
    kl: float  # KL(before || after) in nats
    logits: np.ndarray  # [V] after

    @property
    def delta(self) -> float:
        return self.logp_after - self.logp_before


def kl_divergence(logp: np.ndarray, logq: np.ndarray) -> float:
    """KL(P || Q) = sum p (log p - log q), from log-probabilities, in nats."""
    p = np.exp(logp)
    return float(np.sum(p * (logp - logq)))


def effects(before: np.ndarray, after: np.ndarray, target: int,
            paths: Sequence[list[str]]) -> list[Effect]:
    """One Effect per row of `after` [N, V], against the unchanged logits `before` [V]."""
    logp = ops.log_softmax(np.asarray(before, np.float64))
    out = []
    for row, ps in zip(np.asarray(after, np.float64), paths, strict=True):
        logq = ops.log_softmax(row)
        out.append(Effect(list(ps), float(logp[target]), float(logq[target]),
                          max(kl_divergence(logp, logq), 0.0), row))
    return out


def ablate(params: dict[str, np.ndarray], config: Config, ids: Sequence[int],
           groups: Sequence[Sequence[str]], edit: Mapping[str, Edit], position: int,
           target: int, hooks=None) -> tuple[np.ndarray, list[Effect]]:
    """Take out each group of components, each in its own run, all in one float64 batch.

    `edit` maps a component's path to its replacement. Returns the unchanged run's logits at
    `position` [V] and one Effect per group; an empty group is the unchanged run again.
    """
    variants = [{}] + [{p: edit[p] for p in group} for group in groups]
    logits = run_variants(widen(params), config, ids, variants, position, hooks=hooks)
    return logits[0], effects(logits[0], logits[1:], target, [list(g) for g in groups])


def top_tokens(logits: np.ndarray, k: int) -> list[tuple[int, float]]:
    """(id, chance) of the k likeliest next tokens."""
    p = np.exp(ops.log_softmax(np.asarray(logits, np.float64)))
    order = np.argsort(-p, kind="stable")[:k]
    return [(int(i), float(p[i])) for i in order]


@dataclass
class AblationReport:
    """Each component taken out, as a row {component, label, delta (change in log p of the
    target), kl, logp_before, logp_after, top_after}; with `every`, ranked by |delta|."""

    q: object  # analysis.question.Question
    mode: str
    every: bool
    rows: list[dict]
    top_before: list[dict]  # {id, token, prob} of the unchanged run


def ablation_report(session, components: list[str], edit: Mapping[str, Edit], position: int,
                    target: str | None, top: int, *, mode: str, every: bool) -> AblationReport:
    """Take out each component in its own run (`position` checked already) and compare the
    next-token distribution at `position` with the unchanged run's."""

    q = ask(session, session.run()[position], position, target, None)
    before, found = ablate(session.params, session.config, session.ids,
                           [[c] for c in components], edit, position, q.target,
                           session.hooks)
    tok = q.token_str
    rows = [{"component": e.paths[0], "label": component_label(e.paths[0]),
             "delta": e.delta, "kl": e.kl, "logp_before": e.logp_before,
             "logp_after": e.logp_after,
             "top_after": [with_old_keys({"id": i, "token": tok(i), "chance": p})
                           for i, p in top_tokens(e.logits, top)]} for e in found]
    if every:
        rows.sort(key=lambda r: -abs(r["delta"]))
    top_before = [with_old_keys({"id": i, "token": tok(i), "chance": p})
                  for i, p in top_tokens(before, top)]
    return AblationReport(q, mode, every, rows, top_before)


def components(session, layer: int | None, head: int | None, mlp: bool,
               every: bool) -> list[str]:
    """The paths ablate takes out: every head and MLP (--all), or one (--layer with --head
    or --mlp), checked against the model's sizes."""
    if every:
        if layer is not None or head is not None or mlp:
            raise InputError("--all takes out every component in turn: give it without "
                             "--layer, --head or --mlp")
        return all_components(session.config)
    if layer is None:
        raise InputError("say what to take out: --layer L with --head H or --mlp, or --all")
    if (head is None) == (not mlp):
        raise InputError("give exactly one of --head H or --mlp with --layer")
    i = session.layer(layer)
    return [mlp_path(i) if mlp else head_path(i, session.head(head))]


def check_mode(mode: str) -> str:
    """--mode, checked before anything else is (a mistyped mode is the first thing to say)."""
    if mode not in MODES:
        raise InputError(f"unknown --mode {mode!r}: use zero, mean or resample")
    return mode


def replacements(session, paths: list[str], mode: str, source: str | None, data: bool,
                 means: Callable[[], Mapping[str, np.ndarray]]) -> dict[str, Edit]:
    """{path: its replacement} for the mode, the options checked first: zero; mean (`means()`
    is called only then: stored, or over --data); resample (the values of the run of the text
    `source`, which must be at least as long)."""
    check_mode(mode)
    if (source is not None) != (mode == "resample"):
        raise InputError("--from TEXT goes with --mode resample (and resample needs it)")
    if data and mode != "mean":
        raise InputError("--data DIR goes with --mode mean")
    found = means() if mode == "mean" else None
    values = None
    if mode == "resample":
        other = session.reopen(source)
        if other.T < session.T:
            raise InputError(f"the --from text is {count(other.T, 'token')} long and the text "
                             f"{session.T}: resampling needs a value at every position, so "
                             "give a --from text at least as long")
        values = source_values(session.params, session.config, other.ids, other.hooks)
    return {p: replacement(mode, p, means=found, source=values) for p in paths}


def zeroing(model, paths: list[str], saes=None):
    """--ablate: (the canonical names of the values, the hook that zeroes them in every run)
    or ([], None); sae.SITE.N names one latent of the SAE of SITE (sae.latent_ablation: `saes`
    finds it, site -> SAE: jobs.dictionaries.saes.finder, one of the --sae SAEs given, else
    the weights folder's)."""
    if not paths:
        return [], None

    latents = [p for p in paths if p.startswith("sae.")]
    values = [p for p in paths if p not in latents]
    hooks = None
    if latents:

        hooks = latent_ablation(model.config, latents, saes)
    zeroed = ablation(values, model.config) if values else None  # checks each path first
    names = [resolve(p, model.config)[0] for p in values] + latents
    return names, Chain(zeroed, hooks)
