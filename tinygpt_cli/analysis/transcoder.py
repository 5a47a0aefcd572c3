"""Transcoders: one sparse dictionary per block's MLP, reading the MLP's input and predicting
its output (Dunefsky et al. 2024; circuit-tracer's per-layer transcoders).

    z = TopK_k(ReLU((x - b_in) W_enc + b_enc))     x = layers.L.ln2.out, b_in its mean (fixed)
    y_hat = z W_dec + b_dec                         predicting layers.L.mlp_out

TopK rather than JumpReLU: k fixes L0 exactly (the goal is L0 <= 32, so it is met by
construction, not by tuning a sparsity penalty), there is no threshold to learn through a
straight-through estimator, and the SAE's trainer (analysis/sae.py: Adam, unit decoder rows,
AuxK for dead latents, checkpoints) serves unchanged with the target y in place of x. In an
attribution graph the active set is frozen at the real run either way, so the choice does not
change the graph's arithmetic.

The files live in the weights folder's transcoders/, one per block, layers.L.safetensors,
with the SAE's four tensors plus b_in and metadata (kind "transcoder", layer, k,
weights_sha256: made for these weights, madefor.py's rule).
"""

from __future__ import annotations

import shlex
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..errors import InputError, WeightsError
from ..jobs.corpus import data_windows, given_or, held_out_files
from ..storage.hub import dictionary
from ..storage.madefor import check_made_for, remake_hint, weights_option
from ..storage.safetensors import read_safetensors
from ..transformer.config import Config
from ..transformer.hooks import Chain, RecordOnly, Replace, chained
from ..transformer.model import forward
from ..transformer.wiring import FORWARD
from . import sae as S
from .gemmascope import (
    PARAMS,
    is_cross_layer,
    layer_files,
    load_cross_layer,
    load_gemma_scope,
    transcoder_folders,
)

# The blocks this analysis implements (wiring.require refuses others by name): the MLP's recorded
# input and output.
HANDLES = FORWARD

TENSORS = ("W_enc", "b_enc", "W_dec", "b_dec", "b_in")


def train_hint(weights_file: Path, folder: Path, verb: str = "train them for this model") -> str:
    """The command that trains the transcoders at `folder` (the weights folder's own, or the
    --transcoders folder named) for these weights, never into the installed package."""


    default = folder_of(weights_file)
    if Path(folder) != default:
        return (f"{verb} with `tinygpt transcoder train{weights_option(Path(weights_file).parent)}"
                f" --transcoders {shlex.quote(str(folder))}`")
    return remake_hint(verb, "transcoder train", weights_file, default, "--transcoders",
                       "transcoders", "--transcoders")


def encoders_of(transcoders) -> list[S.SAE]:
    """Per block the SAE that encodes its latents: the transcoders themselves, or a
    cross-layer transcoder's encoders."""
    return list(getattr(transcoders, "encoders", transcoders))


def input_path(layer: int) -> str:
    return f"layers.{layer}.ln2.out"


def output_path(layer: int) -> str:
    return f"layers.{layer}.mlp_out"


def folder_of(weights_file: Path, given: Path | None = None) -> Path:
    """--transcoders DIR (a hub repository's folder, ORG/NAME/PATH, fetched:
    hub.dictionary), or the weights folder's transcoders/."""

    if given is not None:
        return dictionary(given, "--transcoders")
    return Path(weights_file).parent / "transcoders"


def file_of(folder: Path, layer: int) -> Path:
    return Path(folder) / f"layers.{layer}.safetensors"


# ------------------------------------------------------------------ the values they read


def mlp_values(params, config: Config, windows: np.ndarray, *, batch: int = 16,
               progress: Callable[[int], None] | None = None, hooks=None,
               outputs: list[str] | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per block, (ln2.out, its output: mlp_out, or the path outputs[i] a transcoder
    predicts) at every position of windows [W, T]: [W*T, d] each, float32, from one pass
    per batch (through `hooks` when given)."""

    outs = outputs or [output_path(i) for i in range(config.n_layer)]
    paths = [p for i in range(config.n_layer) for p in (input_path(i), outs[i])]
    parts: dict[str, list[np.ndarray]] = {p: [] for p in paths}
    for b in range(0, len(windows), batch):
        rec = RecordOnly(paths)
        forward(params, config, windows[b:b + batch], hooks=Chain(hooks, rec))
        for p in paths:
            v = rec.values[p]
            parts[p].append(np.asarray(v, dtype=np.float32).reshape(-1, v.shape[-1]))
        if progress:
            progress(len(windows[b:b + batch]))
    return [(np.concatenate(parts[input_path(i)]), np.concatenate(parts[outs[i]]))
            for i in range(config.n_layer)]


# ------------------------------------------------------------------ files


def load_transcoders(folder: Path, config: Config, weights_file: Path):
    """Every block's transcoder from `folder`, each checked (tensors, shapes, finite, its
    layer, k, made for `weights_file`): a list of per-layer ones, or, from a Gemma Scope 2
    clt/ folder, one cross-layer transcoder (gemmascope.CrossLayerTranscoder)."""
    folder = Path(folder)
    if "*" in folder.name and folder.parent.is_dir():  # Gemma Scope 2's: one folder a block
        return _gemma_scope_transcoders(folder.parent, config, folder.name)
    if not folder.is_dir():
        raise InputError(f"no transcoders at {folder}: {train_hint(weights_file, folder)}")
    if not file_of(folder, 0).exists() and any(folder.glob("layer_*/params.safetensors")):
        return _gemma_scope_transcoders(folder, config)

    if not file_of(folder, 0).exists() and layer_files(folder):  # the release's clt/ layout
        return load_cross_layer(folder, config)
    return [load_transcoder(file_of(folder, i), config, weights_file, i)
            for i in range(config.n_layer)]


def _gemma_scope_transcoders(folder: Path, config: Config, pattern: str = "*"):
    """A site folder of Gemma Scope 2 (transcoder_all/, clt/), its layer_L_... folders those
    `pattern` matches (layer_*_width_16k_l0_small: one a block, where the release has several
    widths and sparsities): per-layer transcoders, or a cross-layer one."""

    first = transcoder_folders(folder, 0, pattern)
    if len(first) == 1 and is_cross_layer(first[0] / PARAMS):
        return load_cross_layer(folder, config, pattern)
    return [gemma_scope_transcoder(folder, config, i, pattern) for i in range(config.n_layer)]


def gemma_scope_transcoder(folder: Path, config: Config, layer: int, pattern: str = "*"
                           ) -> S.SAE:
    """Block `layer`'s transcoder from a folder in Gemma Scope 2's layout (one
    layer_L_width_W_l0_S folder per block, gemmascope.py), its skip connection (an _affine
    one) with it: the evaluation decodes with it, the graph has it as a path of its own."""

    found = transcoder_folders(folder, layer, pattern)
    if len(found) != 1:
        names = ", ".join(p.name for p in found) or "none"
        raise InputError(f"{folder}: {len(found)} transcoders for block {layer} ({names}); "
                         "give a folder holding one layer_L_... folder per block, or pick "
                         "one a block with a pattern (FOLDER/layer_*_width_16k_l0_small)")
    tc, kind = load_gemma_scope(found[0], config)
    if kind != "transcoder" or tc.site not in (output_path(layer),
                                               f"layers.{layer}.ln2_post.out"):
        raise InputError(f"{found[0]} is not block {layer}'s transcoder (it reads "
                         f"{tc.site})")
    return tc


def load_transcoder(path: Path, config: Config, weights_file: Path, layer: int) -> S.SAE:

    if not path.is_file():
        raise InputError(f"no transcoder for block {layer} at {path}: "
                         f"{train_hint(weights_file, path.parent)}")
    t, meta = read_safetensors(path)
    m = S.check_tensors(path, t, config, "a transcoder", TENSORS)
    if meta.get("kind") != "transcoder" or meta.get("layer") != str(layer):
        raise WeightsError(f"{path}: its metadata must say kind 'transcoder' and layer "
                           f"{layer}; it has kind={meta.get('kind')!r} "
                           f"layer={meta.get('layer')!r}")
    k = int(meta["k"]) if meta.get("k", "").isdigit() else 0
    if not 1 <= k <= m:
        raise WeightsError(f"{path}: k = {meta.get('k')!r} is not between 1 and the {m} "
                           "latents")
    check_made_for(path, meta, weights_file, "the transcoder",
                   train_hint(weights_file, path.parent))
    f32 = {n: np.asarray(t[n], dtype=np.float32) for n in TENSORS}
    return S.SAE(f32["W_enc"], f32["b_enc"], f32["W_dec"], f32["b_dec"], output_path(layer),
                 k, str(path), b_in=f32["b_in"])


def train_layer(x: np.ndarray, y: np.ndarray, out: Path, layer: int, settings: dict,
                weights_sha256: str, bar, changes: dict | None = None) -> S.TrainState:
    """Block `layer`'s transcoder on (x, y) [N, d], resumably (sae.train_resumably);
    `changes` ({"steered": ...}) into its metadata and settings."""
    settings = {**settings, "site": output_path(layer), "layer": layer}
    return S.train_resumably(x, out, settings, weights_sha256, bar, changes, y=y,
                             meta={"kind": "transcoder", "layer": str(layer),
                                   "reads": input_path(layer)})


# ------------------------------------------------------------------ the replacement model


class Replacement:
    """A hook set running the replacement model: each block's mlp_out (or the value its
    transcoder predicts: Gemma's ln2_post.out) is its transcoder's prediction from that same
    run's ln2.out (upstream replacements reaching it)."""

    def __init__(self, transcoders: list[S.SAE]):
        self.transcoders = transcoders
        self.sites = {tc.site for tc in transcoders}
        self.inputs: dict[int, np.ndarray] = {}

    def __call__(self, path: str, x: np.ndarray) -> np.ndarray:
        if not path.startswith("layers.") or not (path.endswith("ln2.out")
                                                  or path in self.sites):
            return x
        layer = int(path.split(".")[1])
        if path.endswith("ln2.out"):
            self.inputs[layer] = x
            return x
        return S.reconstruct(self.transcoders[layer], self.inputs.pop(layer)).astype(x.dtype)


@dataclass
class LayerEval:
    layer: int
    k: int
    n_latents: int
    l0: float
    variance_explained: float
    dead: int


@dataclass
class TranscoderEval:
    tokens: int
    layers: list[LayerEval]
    loss_clean: float
    loss_replaced: float  # every MLP replaced by its transcoder
    loss_mean: float  # every MLP's output replaced by its mean over the tokens

    @property
    def loss_recovered(self) -> float:
        return S.recovered(self.loss_clean, self.loss_replaced, self.loss_mean)

    @property
    def l0(self) -> float:
        return float(np.mean([e.l0 for e in self.layers]))

    @property
    def variance_explained(self) -> float:
        return float(np.mean([e.variance_explained for e in self.layers]))

    @property
    def dead(self) -> int:
        return sum(e.dead for e in self.layers)


def evaluate(params, config: Config, transcoders: list[S.SAE], inputs: np.ndarray,
             targets: np.ndarray, progress: Callable[[int], None] | None = None,
             hooks=None) -> TranscoderEval:
    """On windows [W, T] of held-out text: per block L0, the fraction of mlp_out's variance
    explained (on the real run's inputs) and dead latents; the loss of the real model, of
    the replacement model (all MLPs replaced at once) and with every MLP mean-ablated."""
    if not isinstance(transcoders, list):
        raise InputError("transcoder eval evaluates per-layer transcoders; a cross-layer one "
                         "is read by graph only")
    values = mlp_values(params, config, inputs, hooks=hooks,
                        outputs=[tc.site for tc in transcoders])
    layers, means = [], {}
    for i, ((x, y), tc) in enumerate(zip(values, transcoders, strict=True)):
        z = S.encode(tc, x)
        err = float(((y - S.decode(tc, z)) ** 2).sum())
        ve = 1 - err / float(((y - y.mean(axis=0)) ** 2).sum())
        layers.append(LayerEval(i, tc.k, tc.n_latents, float((z > 0).sum(axis=1).mean()), ve,
                                int(((z > 0).sum(axis=0) == 0).sum())))
        means[tc.site] = y.mean(axis=0)
    if progress:
        progress(1)
    losses = []
    for run in (None, Replacement(transcoders),
                Replace({p: (lambda v, m=m: m) for p, m in means.items()})):
        losses.append(S.mean_loss(params, config, inputs, targets, chained(hooks, run)))
        if progress:
            progress(1)
    return TranscoderEval(int(targets.size), layers, *losses)


def evaluate_held_out(model, transcoders: list[S.SAE], data, windows: int, progress=None,
                      hooks=None):
    """`transcoder eval`: on `windows` windows of --data (a file, or a folder's last part)."""

    files = given_or(data, held_out_files)
    x, y = data_windows(files, model.tokenizer, model.config.n_positions, windows)
    return (evaluate(model.params, model.config, transcoders, x, y, progress, hooks),
            [f.name for f in files])


# ------------------------------------------------------------------ features over the training text


def data_codes(model, transcoders: list[S.SAE], folder: Path, layer: int, files: list[Path],
               windows: int, bar, engine=None) -> dict[str, np.ndarray]:
    """Block `layer`'s transcoder codes at every token of `windows` windows of the files,
    computed once per (weights, transcoder file, data) on `engine` and cached
    (sae.data_codes, reading the transcoder's input ln2.out)."""

    tc = replace(encoders_of(transcoders)[layer], site=input_path(layer))
    source = file_of(folder, layer)
    if not source.is_file():  # a Gemma Scope 2 folder's: the dictionary's own weights
        own = Path(encoders_of(transcoders)[layer].path)
        source = own if own.is_file() else own / "params.safetensors"
    return S.data_codes(model, tc, source, files, windows, bar, engine=engine)


def top_windows(codes: dict[str, np.ndarray], latent: int, n: int = 3, before: int = 8,
                after: int = 2) -> list[dict]:
    """The latent's n strongest windows: ids around each window's peak, best first:
    {ids [before+1+after at most], peak (its index there), value}."""
    return top_windows_of(codes, [latent], n, before, after)[latent]


def top_windows_of(codes: dict[str, np.ndarray], latents, n: int = 3, before: int = 8,
                   after: int = 2) -> dict[int, list[dict]]:
    """top_windows of each latent, from one pass over the codes (a graph labels thousands:
    one scan of the text's codes a latent took most of `graph`'s time). A window's peak is
    the latent's largest value in it, at its first position; ties between windows go to the
    first window."""
    ids = codes["ids"]
    t = ids.shape[1]
    wanted = np.unique(np.asarray(latents, np.int64))
    token, slot = np.nonzero(np.isin(codes["idx"], wanted) & (codes["val"] > 0))
    lat = codes["idx"][token, slot].astype(np.int64)
    val = codes["val"][token, slot]
    window, pos = token // t, token % t
    # each (latent, window)'s peak: its largest value, the first position of it
    order = np.lexsort((pos, -val, window, lat))
    lat, val, window, pos = lat[order], val[order], window[order], pos[order]
    first = np.ones(len(lat), bool)
    first[1:] = (lat[1:] != lat[:-1]) | (window[1:] != window[:-1])
    lat, val, window, pos = lat[first], val[first], window[first], pos[first]
    # each latent's windows, strongest first, the first window among equals
    order = np.lexsort((window, -val, lat))
    lat, val, window, pos = lat[order], val[order], window[order], pos[order]
    starts = np.searchsorted(lat, wanted)
    ends = np.searchsorted(lat, wanted, side="right")
    out = {}
    for latent, a, b in zip(wanted.tolist(), starts, ends, strict=True):
        found = []
        for i in range(a, min(b, a + n)):
            p, lo = int(pos[i]), max(0, int(pos[i]) - before)
            found.append({"ids": [int(x) for x in ids[window[i], lo:p + after + 1]],
                          "peak": p - lo, "value": float(val[i])})
        out[latent] = found
    return out


def label_of(examples: list[dict], show) -> str:
    """A short label from a feature's top windows: the token it fires on and the one before
    it, when most of the windows share them. A summary of examples, not an explanation."""

    if not examples:
        return "no example in the searched text"
    on = Counter(show(e["ids"][e["peak"]]) for e in examples)
    prev = Counter(show(e["ids"][e["peak"] - 1]) for e in examples if e["peak"] > 0)
    most = len(examples) / 2
    tok, count = on.most_common(1)[0]
    p, pc = prev.most_common(1)[0] if prev else ("", 0)
    if count > most and pc > most:
        return f"on {tok} after {p}"
    if count > most:
        return f"on {tok}"
    if pc > most:
        return f"after {p}"
    return "on " + ", ".join(t for t, _ in on.most_common(3)) + " (mixed)"
