"""TopK sparse autoencoders on one value of the forward pass (a residual stream or an MLP output).

    z = TopK_k(ReLU((x - b_dec) W_enc + b_enc))      the latents, at most k non-zero per token
    x_hat = z W_dec + b_dec                           the reconstruction, W_dec rows unit norm

Trained as in Gao et al. 2024 (OpenAI's TopK paper) and SAELens: b_dec starts at the data mean,
W_enc at W_dec^T, the decoder rows are renormalised after every step with the gradient's
component along each row removed first, and an auxiliary loss (AuxK) lets latents that have not
fired for a while reconstruct what the live ones miss, so few stay dead. Adam with an explicit
backward pass; the tokens come in as arrays (the caller reads the text), never from files here:
the SAE files are jobs/dictionaries/saes.py's, the passes over a corpus jobs/sae.py's.

A transcoder (analysis/transcoder.py) is the same dictionary reading one value and predicting
another: `b_in` (fixed, the input's mean) centres the input in place of b_dec, and the loss
compares the reconstruction with the target `y` instead of x; everything else is shared.

Evaluation follows SAELens' metrics on held-out text: L0, explained variance, dead latents, and
the loss with the reconstruction spliced into the forward pass, against zero *and* mean
ablation of the same site (loss recovered = (L_ablated - L_sae) / (L_ablated - L_clean)).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from ..errors import InputError, WeightsError, check_index
from ..transformer import ops
from ..transformer.config import Config
from ..transformer.hooks import Chain, RecordOnly, Replace, StopAfter, chained
from ..transformer.model import forward, norm_weights, out_matrix, token_table
from ..transformer.optim import SAE_BETAS, AdamW
from ..transformer.wiring import FORWARD
from .dictionary import (
    SAE as SAE,
)
from .dictionary import (
    SITE_KINDS as SITE_KINDS,
)
from .dictionary import (
    _normalised as _normalised,
)
from .dictionary import (
    _scale_out as _scale_out,
)
from .dictionary import (
    activate as activate,
)
from .dictionary import (
    centre as centre,
)
from .dictionary import (
    check_site as check_site,
)
from .dictionary import (
    decode as decode,
)
from .dictionary import (
    decoder_norms as decoder_norms,
)
from .dictionary import (
    encode as encode,
)
from .dictionary import (
    pre_activations as pre_activations,
)
from .dictionary import (
    reconstruct as reconstruct,
)
from .dictionary import (
    top_k_relu as top_k_relu,
)

# The blocks this analysis implements (wiring.require refuses others by name): a recorded value
# encoded.
HANDLES = FORWARD

AUX_SCALE = 1 / 32  # Gao et al.'s alpha for the AuxK loss


def latent_share(sae: SAE, x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """What the latents `rows` add to the reconstruction of x: z_rows W_dec[rows] in x's
    units.  [..., d] -> [..., d]"""
    z = encode(sae, x)[..., rows]  # [..., n]
    if sae.rescale:
        z = z / decoder_norms(sae)[rows]
    share = z @ sae.W_dec[rows]
    return share if sae.normalize == "none" else share * _scale_out(sae, x)[0]


def init_sae(x: np.ndarray, n_latents: int, k: int, site: str, seed: int,
             y: np.ndarray | None = None) -> SAE:
    """Random unit decoder rows, W_enc = W_dec^T, b_enc = 0, b_dec = the data mean. A
    transcoder's (target y): b_dec the mean of y, b_in the mean of x, and W_enc scaled by
    half the ratio of their spreads, so that the first predictions have the target's size
    (unscaled, ln2.out 4x the size of mlp_out, the first thousand steps only shrank them)."""
    rng = np.random.default_rng(seed)
    d = x.shape[-1]
    w_dec = rng.standard_normal((n_latents, d)).astype(np.float32)
    w_dec /= np.linalg.norm(w_dec, axis=1, keepdims=True)
    mean = x.reshape(-1, d).mean(axis=0).astype(np.float32)
    if y is None:
        return SAE(np.ascontiguousarray(w_dec.T), np.zeros(n_latents, np.float32), w_dec,
                   mean, site, k)
    target = y.reshape(-1, d).mean(axis=0).astype(np.float32)
    ratio = 0.5 * np.sqrt(data_scale(y) / max(data_scale(x), 1e-30))
    return SAE(np.ascontiguousarray(w_dec.T * np.float32(ratio)),
               np.zeros(n_latents, np.float32), w_dec, target, site, k, b_in=mean)


# ------------------------------------------------------------------ the loss and its gradient


def loss_and_grads(sae: SAE, x: np.ndarray, scale: float,
                   dead: np.ndarray | None = None, k_aux: int = 0, y: np.ndarray | None = None
                   ) -> tuple[float, dict[str, np.ndarray], np.ndarray]:
    """The training loss, its gradient for each parameter, and the latents z.

    loss = sum ||x_hat - x||^2 / (N scale)                      (scale: the data's variance
         + AUX_SCALE sum ||e_hat - e||^2 / (N scale)             summed over d, so 1 = mean)
    where e = x - x_hat (held constant) and e_hat = z_aux W_dec, z_aux the top k_aux of the
    pre-activations of the dead latents only (Gao et al.'s AuxK). x: [N, d]; a transcoder's
    target y [N, d] in place of x in both errors.
    """
    n = x.shape[0]
    xc = x - centre(sae)  # [N, d]
    a = xc @ sae.W_enc + sae.b_enc  # [N, m]
    z = top_k_relu(a, sae.k)
    r = z @ sae.W_dec + sae.b_dec - (x if y is None else y)  # x_hat - x
    loss = float(np.vdot(r, r)) / (n * scale)
    g = (2.0 / (n * scale)) * r  # d loss / d x_hat
    dw_dec = z.T @ g
    db_dec = g.sum(axis=0)
    da = (g @ sae.W_dec.T) * (z > 0)
    if dead is not None and k_aux > 0 and dead.any():
        z_aux = top_k_relu(np.where(dead, a, 0), min(k_aux, int(dead.sum())))
        e_hat = z_aux @ sae.W_dec
        r_aux = e_hat + r  # e_hat - e, with e = x - x_hat = -r
        loss += AUX_SCALE * float(np.vdot(r_aux, r_aux)) / (n * scale)
        g_aux = (2.0 * AUX_SCALE / (n * scale)) * r_aux
        dw_dec += z_aux.T @ g_aux
        da += (g_aux @ sae.W_dec.T) * (z_aux > 0)
    dw_enc = xc.T @ da
    db_enc = da.sum(axis=0)
    if sae.b_in is None:  # b_dec is also the input's centre
        db_dec -= da.sum(axis=0) @ sae.W_enc.T
    return loss, {"W_enc": dw_enc, "b_enc": db_enc, "W_dec": dw_dec, "b_dec": db_dec}, z


def remove_parallel(dw_dec: np.ndarray, w_dec: np.ndarray) -> np.ndarray:
    """The gradient of each unit decoder row with its component along the row taken out: the
    part a renormalisation would undo anyway."""
    return dw_dec - (dw_dec * w_dec).sum(axis=1, keepdims=True) * w_dec


def normalise_rows(w_dec: np.ndarray) -> None:
    w_dec /= np.linalg.norm(w_dec, axis=1, keepdims=True)


# ------------------------------------------------------------------ training


@dataclass
class TrainState:
    """Everything a resumed run needs: the SAE, Adam's moments, the step, the dead-latent clock."""

    sae: SAE
    adam: AdamW
    lr: float  # the peak learning rate, decayed over the last 20% of the steps
    step: int
    since_fired: np.ndarray  # [m] tokens since each latent last fired
    losses: list[float] = field(default_factory=list)


def new_state(x: np.ndarray, n_latents: int, k: int, site: str, seed: int,
              lr: float, y: np.ndarray | None = None) -> TrainState:
    sae = init_sae(x, n_latents, k, site, seed, y)
    adam = AdamW(sae.params(), betas=SAE_BETAS, weight_decay=0.0)
    return TrainState(sae, adam, lr, 0, np.zeros(n_latents, np.int64))


def data_scale(x: np.ndarray) -> float:
    """The mean squared distance of a token's value from the mean value (the loss's unit)."""
    return float(((x - x.mean(axis=0)) ** 2).sum(axis=1).mean())


def train_steps(state: TrainState, x: np.ndarray, steps: int, *, batch: int = 1024,
                seed: int = 0, k_aux: int | None = None, dead_after: int = 20_000,
                progress: Callable[[TrainState], None] | None = None,
                y: np.ndarray | None = None) -> TrainState:
    """Run until state.step == steps. Batch b is drawn by a generator seeded (seed, step), so
    a resumed run draws what the uninterrupted run would have. x: [N, d] float32 (and a
    transcoder's targets y [N, d])."""
    sae = state.sae
    scale = data_scale(x if y is None else y)
    k_aux = k_aux if k_aux is not None else min(2 * x.shape[1], sae.n_latents // 2)
    params = sae.params()
    while state.step < steps:
        rng = np.random.default_rng([seed, state.step])
        pick = rng.integers(0, len(x), size=batch)
        xb, yb = x[pick], None if y is None else y[pick]
        lr = state.lr * min(1.0, 5 * (steps - state.step) / steps)  # decay over the last 20%
        dead = state.since_fired > dead_after
        loss, grads, z = loss_and_grads(sae, xb, scale, dead, k_aux, yb)
        grads["W_dec"] = remove_parallel(grads["W_dec"], sae.W_dec)
        state.adam.step(params, grads, lr)
        normalise_rows(sae.W_dec)
        fired = (z > 0).any(axis=0)
        state.since_fired += batch
        state.since_fired[fired] = 0
        state.losses.append(loss)
        state.step += 1
        if progress:
            progress(state)
    return state


# ------------------------------------------------------------------ the site's values


def site_values(params, config: Config, windows: np.ndarray, site: str, *, batch: int = 16,
                progress: Callable[[int], None] | None = None, hooks=None) -> np.ndarray:
    """The site's value at every position of windows [W, T] -> [W * T, d] float32, of runs
    through `hooks` (steering) when given; the pass stops at the site. (site_values_over runs
    it shard by shard, on a cluster too.)"""
    out = []
    for b in range(0, len(windows), batch):
        rec = RecordOnly({site})
        forward(params, config, windows[b:b + batch], hooks=Chain(hooks, rec, StopAfter(site)))
        v = site_rows(site, rec.values[site])
        out.append(np.asarray(v, dtype=np.float32).reshape(-1, v.shape[-1]))
        if progress:
            progress(len(windows[b:b + batch]))
    return np.concatenate(out) if out else np.zeros((0, config.n_embd), np.float32)


def site_rows(site: str, value: np.ndarray) -> np.ndarray:
    """A site's value as an SAE reads it, a row a position: the heads' outputs z
    [..., H, T, d_k] side by side, [..., T, H d_k] (o_proj's input); any other as it is."""
    return ops.merge_heads(value) if site.endswith(".z") else value


def shard_site_values(task: tuple, shared: tuple) -> np.ndarray:
    params, config, site, hooks = shared
    return site_values(params, config, task[1], site, hooks=hooks)


# ------------------------------------------------------------------ evaluation


@dataclass
class SAEEval:
    site: str
    k: int
    n_latents: int
    tokens: int
    l0: float  # mean latents active per token
    explained_variance: float
    loss_clean: float
    loss_sae: float
    loss_zero: float
    loss_mean: float
    dead: int  # latents that never fired on the text
    fired: np.ndarray  # [m] how many tokens each latent fired on

    @property
    def recovered_vs_zero(self) -> float:
        return recovered(self.loss_clean, self.loss_sae, self.loss_zero)

    @property
    def recovered_vs_mean(self) -> float:
        return recovered(self.loss_clean, self.loss_sae, self.loss_mean)

    @property
    def loss_increase(self) -> float:
        return self.loss_sae - self.loss_clean


def recovered(clean: float, spliced: float, ablated: float) -> float:
    """(L_ablated - L_spliced) / (L_ablated - L_clean): 1 is as good as the model's own value."""
    return (ablated - spliced) / (ablated - clean)


def summed_loss(params, config: Config, inputs: np.ndarray, targets: np.ndarray,
                hooks=None, batch: int = 16) -> float:
    """Next-token cross-entropy (nats) summed over windows [W, T], with optional hooks."""
    total = 0.0
    for b in range(0, len(inputs), batch):
        logits = forward(params, config, inputs[b:b + batch], hooks=hooks)
        logp = ops.log_softmax(logits.astype(np.float64))
        y = targets[b:b + batch]
        total += float(-np.take_along_axis(logp, y[..., None], axis=-1).sum())
    return total


def mean_loss(params, config: Config, inputs: np.ndarray, targets: np.ndarray,
              hooks=None, batch: int = 16) -> float:
    """Mean next-token cross-entropy (nats) over windows [W, T], with optional hooks."""
    return summed_loss(params, config, inputs, targets, hooks, batch) / targets.size


def splice(sae: SAE, x: np.ndarray) -> np.ndarray:
    return reconstruct(sae, x).astype(x.dtype)


def _constant(value: np.ndarray, x: np.ndarray) -> np.ndarray:
    return value


def shard_loss(task: tuple, shared: tuple) -> float:
    """The summed loss of one shard of windows [w, 2, T] (inputs, next tokens) with the site
    replaced by `replace` (None: the run itself): a task of engine.job."""
    params, config, site, replace, hooks = shared
    run = chained(hooks, None if replace is None else Replace({site: replace}))
    return summed_loss(params, config, task[1][:, 0], task[1][:, 1], run)


def one_pass(fn, windows: np.ndarray, shared, *,
             progress: Callable[[int], None] | None = None) -> list:
    """fn((0, windows), shared) as one task in this process: what `over` is when no job
    shards the windows (jobs.cluster.over_windows: a task per shard, on a cluster too, the
    results in window order)."""
    out = [fn((0, windows), shared)] if len(windows) else []
    if progress and len(windows):
        progress(len(windows))
    return out


def site_values_over(over, params, config: Config, windows: np.ndarray, site: str, *,
                     progress: Callable[[int], None] | None = None, hooks=None) -> np.ndarray:
    """site_values, each shard of windows a task of `over` (one_pass, or a job's), joined in
    window order: the same numbers as one pass (the shards hold whole batches)."""
    parts = over(shard_site_values, windows, (params, config, site, hooks), progress=progress)
    return np.concatenate(parts) if parts else np.zeros((0, config.n_embd), np.float32)


def evaluate(params, config: Config, sae: SAE, inputs: np.ndarray, targets: np.ndarray,
             progress: Callable[[int], None] | None = None, hooks=None,
             over=one_pass) -> SAEEval:
    """SAELens' metrics on windows [W, T] of held-out text (inputs and their next tokens),
    each pass a task per shard of windows of `over` (one_pass: this process at once).

    Mean ablation replaces the site by its mean over these same tokens (every position alike).
    With `hooks` (steering) every run is the steered one: the clean loss is the steered run's,
    and the SAE, the zero and the mean replace the site of the steered run.
    """

    x = site_values_over(over, params, config, inputs, sae.site, hooks=hooks)
    z = encode(sae, x)
    x_hat = decode(sae, z, x)
    ev = 1 - float(((x - x_hat) ** 2).sum()) / float(((x - x.mean(axis=0)) ** 2).sum())
    fired = (z > 0).sum(axis=0)
    mean = x.mean(axis=0)
    pairs = np.stack([inputs, targets], axis=1)  # a shard slices both alike
    losses = []
    for replace in (None, partial(splice, sae), np.zeros_like, partial(_constant, mean)):
        parts = over(shard_loss, pairs, (params, config, sae.site, replace, hooks))
        losses.append(sum(parts) / targets.size)
        if progress:
            progress(1)
    return SAEEval(sae.site, sae.k, sae.n_latents, int(targets.size),
                   float((z > 0).sum(axis=1).mean()), ev, *losses,
                   int((fired == 0).sum()), fired)


# ------------------------------------------------------------------ one latent over a corpus


def sparse_codes(sae: SAE, x: np.ndarray, batch: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """The active latents of every token and their values: (idx [N, w], val [N, w]), w = k
    for a TopK SAE, else the most latents any token has active (the rest of a row: value 0).
    idx is int16 where the latents fit, else int32."""
    idx, val = [], []
    for b in range(0, len(x), batch):
        with np.errstate(all="ignore"):
            a = pre_activations(sae, x[b:b + batch])
            z = np.maximum(a, 0) if sae.architecture == "topk" and not sae.rescale else \
                activate(sae, a)
        w = sae.k if sae.k is not None else max(1, int((z > 0).sum(axis=-1).max(initial=0)))
        top = np.argpartition(-z, min(w, z.shape[-1]) - 1, axis=-1)[:, :w]
        idx.append(top)
        val.append(np.take_along_axis(z, top, axis=-1).astype(np.float32))
    width = max((v.shape[1] for v in val), default=sae.k or 1)
    dtype = np.int16 if sae.n_latents <= np.iinfo(np.int16).max else np.int32
    idx = np.concatenate([np.pad(i, ((0, 0), (0, width - i.shape[1]))) for i in idx]).astype(
        dtype) if idx else np.zeros((0, width), dtype)
    val = np.concatenate([np.pad(v, ((0, 0), (0, width - v.shape[1]))) for v in val]) \
        if val else np.zeros((0, width), np.float32)
    if not np.isfinite(val).all():  # encode's rule
        raise WeightsError(f"{sae.path}: its latents overflow float32 on these values (W_enc "
                           "or b_enc too large to compute with)")
    return idx, val


def valid_codes(e: dict, sae: SAE, config, windows: int) -> bool:
    """The keys, types, shapes and ranges jobs.sae.data_codes writes; anything else is
    rebuilt."""
    if set(e) != {"ids", "idx", "val"}:
        return False
    ids, idx, val = e["ids"], e["idx"], e["val"]
    width = sae.k if sae.k is not None else (idx.shape[1] if idx.ndim == 2 else -1)
    int_type = np.int16 if sae.n_latents <= np.iinfo(np.int16).max else np.int32
    return (ids.dtype == np.uint16 and ids.ndim == 2 and 0 < len(ids) <= windows
            and ids.shape[1] == config.n_positions and idx.dtype == int_type and width >= 1
            and idx.shape == val.shape == (ids.size, width) and val.dtype == np.float32
            and int(ids.max()) < config.vocab_size and 0 <= int(idx.min())
            and int(idx.max()) < sae.n_latents and bool(np.isfinite(val).all()))


@dataclass
class FeatureReport:
    latent: int
    site: str
    tokens: int  # tokens searched
    fired: int  # tokens it fired on
    contexts: list[dict]  # {window, position, value, ids [T], acts [T]}, best first
    promotes: list[tuple[int, float]]  # (token id, logit) through the direct path
    suppresses: list[tuple[int, float]]
    hist_counts: np.ndarray  # [bins] of the non-zero activations
    hist_edges: np.ndarray  # [bins + 1]


def direct_logits(sae: SAE, params, latent: int) -> np.ndarray:
    """W_dec[latent] * ln_final.w @ W_U: the tokens the latent's direction pushes
    (the final norm's centring and per-token 1/std left out).  -> [V]"""

    row = sae.W_dec[latent]
    if sae.site.endswith(".z"):  # the heads' outputs: through the block's W_O first
        row = row @ out_matrix(params, int(sae.site.split(".")[1]))
    return (row * norm_weights(params, "ln_final")[0]) @ token_table(params).T


def feature_report(sae: SAE, params, ids: np.ndarray, idx: np.ndarray, val: np.ndarray,
                   latent: int, top: int, n_tokens: int = 10, bins: int = 12) -> FeatureReport:
    """A latent over windows ids [W, T] whose codes are (idx, val) [W*T, k]."""
    w, t = ids.shape
    acts = np.where(idx == latent, val, 0).max(axis=1).reshape(w, t)  # [W, T]
    peak = acts.max(axis=1)
    order = np.argsort(-peak, kind="stable")[:top]
    contexts = [{"window": int(i), "position": int(acts[i].argmax()), "value": float(peak[i]),
                 "ids": ids[i].astype(np.int64), "acts": acts[i]}
                for i in order if peak[i] > 0]
    on = acts[acts > 0]
    counts, edges = np.histogram(on, bins=bins) if on.size else (np.zeros(bins, int),
                                                                  np.zeros(bins + 1))
    promotes, suppresses = pushed_tokens(direct_logits(sae, params, latent), n_tokens)
    return FeatureReport(latent, sae.site, int(w * t), int(on.size), contexts, promotes,
                         suppresses, counts, edges)


def pushed_tokens(logits: np.ndarray, n: int) -> tuple[list, list]:
    """The n (token id, logit) pairs pushed most up, and the n pushed most down."""
    up = np.argsort(-logits, kind="stable")[:n]
    down = np.argsort(logits, kind="stable")[:n]
    return [(int(i), float(logits[i])) for i in up], [(int(i), float(logits[i])) for i in down]


@dataclass
class LatentOnText:
    """One latent at each token of a text, and the tokens its direction pushes."""

    latent: int
    site: str
    k: int
    acts: np.ndarray  # [T], the latent's value (0 where it is not among the k active)
    promotes: list[tuple[int, float]]
    suppresses: list[tuple[int, float]]


def latent_on_text(sae: SAE, params, values: np.ndarray, latent: int,
                   n_tokens: int = 10) -> LatentOnText:
    """The latent (negative: from the end) over a text whose values at the SAE's site are
    [T, d]."""

    latent = check_index(latent, sae.n_latents, "latent")
    promotes, suppresses = pushed_tokens(direct_logits(sae, params, latent), n_tokens)
    return LatentOnText(latent, sae.site, sae.k,
                        encode(sae, site_rows(sae.site, values))[:, latent], promotes, suppresses)


# ------------------------------------------------------------------ latents as trace values


def parse_latent_path(path: str, config: Config) -> tuple[str, int | None]:
    """`sae.layers.1.resid_post` -> (site, None); `sae.layers.1.resid_post.17` -> (site, 17)."""
    if not path.startswith("sae."):
        raise InputError(f"an SAE path starts with sae., e.g. sae.layers.1.resid_post: {path!r}")
    rest = path[len("sae."):]
    head, _, last = rest.rpartition(".")
    if head and last.lstrip("-").isdigit():
        return check_site(head, config, heads=True), int(last)
    return check_site(rest, config, heads=True), None


def without_latents(sae: SAE, latents: list[int]) -> Callable[[np.ndarray], np.ndarray]:
    """x -> x - sum_j z_j W_dec[j] over the given latents: the latents zeroed, the rest of the
    reconstruction and its error kept as they were."""
    rows = np.asarray(latents)

    def fn(x: np.ndarray) -> np.ndarray:
        if sae.site.endswith(".z"):  # [..., H, T, d_k]: merged, changed, split again
            m = ops.merge_heads(x)
            m = m - latent_share(sae, m, rows)
            return ops.split_heads(m, x.shape[-3]).astype(x.dtype)
        return x - latent_share(sae, x, rows)

    return fn


def latents_of(trace, path: str, saes: Callable[[str], SAE]):
    """`sae.SITE` (every latent) or `sae.SITE.N` (one) of a traced run: (the site, its SAE
    (`saes`: site -> its SAE), z [T, m] or [T], per token its active latents or None)."""

    site, latent = parse_latent_path(path, trace.config)
    sae = saes(site)
    z = encode(sae, site_rows(site, trace.get(site)))  # [T, m]
    if latent is not None:
        return site, sae, z[:, check_index(latent, sae.n_latents, "latent")], None
    return site, sae, z, active_latents(z)


def active_latents(z: np.ndarray) -> list[list[tuple[int, float]]]:
    """Per token, the non-zero latents, strongest first.  [T, m] -> T lists of (latent, value)"""
    out = []
    for row in z:
        on = np.flatnonzero(row)
        on = on[np.argsort(-row[on], kind="stable")]
        out.append([(int(j), float(row[j])) for j in on])
    return out


# ------------------------------------------------------------------ the SAE of a site, and codes


def latent_ablation(config: Config, paths: list[str], saes: Callable[[str], SAE]) -> Replace:
    """A Replace hook zeroing each `sae.SITE.N` latent, its SAE the site's (`saes`: site ->
    its SAE); the reconstruction error stays in the stream."""

    by_site: dict[str, list[int]] = {}
    for p in paths:
        site, latent = parse_latent_path(p, config)
        if latent is None:
            raise InputError(f"--ablate takes one latent, e.g. {p}.17, not the whole SAE {p!r}")
        by_site.setdefault(site, []).append(latent)
    fns = {}
    for site, latents in by_site.items():
        sae = saes(site)
        fns[site] = without_latents(sae, [check_index(j, sae.n_latents, "latent")
                                          for j in latents])
    return Replace(fns)


def shard_codes(task: tuple, shared: tuple) -> dict[str, np.ndarray]:
    """One shard's codes: a task of engine.job."""
    params, config, sae, steer = shared
    x = site_values(params, config, task[1], sae.site, hooks=steer)
    idx, val = sparse_codes(sae, x)
    return {"ids": np.asarray(task[1]).astype(np.uint16), "idx": idx, "val": val}


def joined_codes(parts: list[dict], sae: SAE, config: Config) -> dict[str, np.ndarray]:
    """The shards' codes in window order, as one pass gives them: rows padded to the widest
    shard (a ReLU SAE's width is the most latents a token of the shard has active)."""
    if not parts:
        width = sae.k or 1
        dtype = np.int16 if sae.n_latents <= np.iinfo(np.int16).max else np.int32
        return {"ids": np.zeros((0, config.n_positions), np.uint16),
                "idx": np.zeros((0, width), dtype), "val": np.zeros((0, width), np.float32)}
    width = max(p["idx"].shape[1] for p in parts)

    def wide(a: np.ndarray) -> np.ndarray:
        return np.pad(a, ((0, 0), (0, width - a.shape[1])))

    return {"ids": np.concatenate([p["ids"] for p in parts]),
            "idx": np.concatenate([wide(p["idx"]) for p in parts]),
            "val": np.concatenate([wide(p["val"]) for p in parts])}


