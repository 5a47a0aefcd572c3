"""Steering vectors: a direction added to the residual stream entering a block.

    v = mean_t resid_pre[L](toward)_t - mean_t resid_pre[L](away)_t        (ActAdd)
    v = mean over pairs i of the same difference of pos_i and neg_i           (CAA)

and the steered run adds c * v to `layers.L.resid_pre` at every position (hooks.add_vector).
A vector is judged on held-out pairs: each pair's shared opening is a prompt, and the first
tokens where the two texts part are the target and the token it is scored against. The
steerability of a prompt is the least-squares slope of logit[target] - logit[vs] at its last
position against the scale; a negative slope is a prompt steered the wrong way (Tan et al.
2024 found up to half of inputs are). The price is the loss increase on held-out stories.

Vectors are saved as a direction file (see `direction_file`), also read for `--steer-vector`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError, WeightsError, check_utf8
from ..jobs.corpus import read_user_file
from ..jobs.session import check_index, encode_checked
from ..storage.madefor import check_made_for
from ..storage.safetensors import metadata_strings, read_safetensors, safetensors_bytes
from ..transformer.config import Config
from ..transformer.hooks import Chain, RecordOnly, StopAfter, add_vector, chained
from ..transformer.model import forward
from ..transformer.sampling import create_rng
from ..transformer.wiring import FORWARD
from .saelens import load_saelens

# The blocks this analysis implements (wiring.require refuses others by name): a vector added to
# the stream, the model's own pass run on.
HANDLES = FORWARD


def site(layer: int) -> str:
    return f"layers.{layer}.resid_pre"


# ------------------------------------------------------------------ building a vector


def mean_resid_pre(params, config: Config, ids: list[int], layer: int,
                   hooks=None) -> np.ndarray:
    """mean over positions of resid_pre[layer] of one text (a run through `hooks`, when
    given), in float64.  [T] -> [d]"""
    keep = RecordOnly({site(layer)})
    forward(params, config, np.asarray(ids), hooks=Chain(hooks, keep, StopAfter(site(layer))))
    return keep.values[site(layer)].astype(np.float64).mean(axis=0)


def mean_difference(params, config: Config, pairs: list[tuple[list[int], list[int]]],
                    layer: int, hooks=None) -> np.ndarray:
    """The mean over pairs of mean resid_pre(pos) - mean resid_pre(neg), as float32 [d], of
    runs through `hooks` (a steering already in place) when given.

    Summed in float64 in the pairs' order, so the same pairs give the same bytes."""
    total = np.zeros(config.n_embd)
    for pos, neg in pairs:
        total += mean_resid_pre(params, config, pos, layer, hooks) - mean_resid_pre(
            params, config, neg, layer, hooks)
    return (total / len(pairs)).astype(np.float32)


# ------------------------------------------------------------------ pairs and prompts


def parse_texts(content: str, name: str) -> list[str]:
    """The texts of a --pos/--neg file: one a line, or JSON lines (a string or {"text": ...}).

    Blank lines are skipped; a line starting with '{' or '"' is read as JSON."""
    texts = []
    for n, line in enumerate(content.splitlines(), 1):
        if not line.strip():
            continue
        if line.lstrip()[:1] in ('{', '"'):
            try:
                value = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{name} line {n}: not valid JSON ({e.msg})") from None
            if isinstance(value, dict):
                value = value.get("text")
            if not isinstance(value, str) or not value:
                raise InputError(f'{name} line {n}: a JSON line must be a text or '
                                 '{"text": "..."} with a non-empty text')
            line = value
        texts.append(line)
    if not texts:
        raise InputError(f"{name} holds no text")
    return texts


def read_pairs(pos: Path, neg: Path) -> tuple[list[str], list[str]]:
    """The texts of the files --pos and --neg; text i of one pairs with text i of the other."""

    pos_texts = parse_texts(read_user_file(pos, "--pos"), "--pos")
    neg_texts = parse_texts(read_user_file(neg, "--neg"), "--neg")
    if len(pos_texts) != len(neg_texts):
        raise InputError(f"--pos holds {len(pos_texts)} texts and --neg {len(neg_texts)}: "
                         "text i of one pairs with text i of the other")
    return pos_texts, neg_texts


def split_pairs(n: int, held_out: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out) pair indices: a seeded shuffle, at least one pair on each side."""
    if n < 2:
        raise InputError(f"steer needs at least 2 pairs (one to build the vector, one to "
                         f"test it); the files hold {n}")
    order = create_rng(seed).permutation(n)
    k = min(max(1, round(held_out * n)), n - 1)
    return np.sort(order[k:]), np.sort(order[:k])


@dataclass(frozen=True)
class Prompt:
    """A held-out pair as a test: the shared opening, and where the two texts part."""

    ids: list[int]
    target: int  # the pos text's next token
    vs: int  # the neg text's next token


def prompt_of(pos: list[int], neg: list[int], line: int) -> Prompt:
    shared = 0
    while shared < min(len(pos), len(neg)) and pos[shared] == neg[shared]:
        shared += 1
    if shared == 0 or shared == min(len(pos), len(neg)):
        why = "share no first token" if shared == 0 else "do not part (one ends first)"
        raise InputError(f"pair {line}: the two texts {why}; a held-out pair must start the "
                         "same and then differ, e.g. 'The day was happy' / 'The day was sad'")
    return Prompt(pos[:shared], pos[shared], neg[shared])


# ------------------------------------------------------------------ judging a vector


def logit_difference(params, config: Config, prompt: Prompt, vector: np.ndarray, layer: int,
                     scale: float, hooks=None) -> float:
    run = chained(hooks, add_vector(site(layer), vector, scale))
    logits = forward(params, config, np.asarray(prompt.ids), hooks=run, last_only=True)[-1]
    return float(logits[prompt.target]) - float(logits[prompt.vs])


def slope(xs: np.ndarray, ys: np.ndarray) -> float:
    """The least-squares slope of ys against xs."""
    xc = xs - xs.mean()
    return float(xc @ (ys - ys.mean()) / (xc @ xc))


def mean_loss(params, config: Config, texts: list[list[int]], hooks=None) -> float:
    """Mean next-token loss (nats) over every target of the texts (each <= n_positions)."""
    total, count = 0.0, 0
    for ids in texts:
        ids = np.asarray(ids)
        logits = forward(params, config, ids[:-1], hooks=hooks).astype(np.float64)
        z = logits - logits.max(axis=-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
        total -= float(logp[np.arange(len(ids) - 1), ids[1:]].sum())
        count += len(ids) - 1
    return total / count


@dataclass
class PromptResult:
    ids: list[int]
    target: int
    vs: int
    diffs: np.ndarray  # [S] logit[target] - logit[vs] at each scale
    slope: float


@dataclass
class SteerReport:
    """A mean-difference vector and how it steers held-out prompts."""

    layer: int
    vector: np.ndarray  # [d] float32
    train_pairs: list[int]  # line numbers (from 1) of the pairs that built it
    held_out_pairs: list[int]
    scales: np.ndarray  # [S]
    prompts: list[PromptResult]
    scale: float  # the chosen scale, at which the loss is measured
    loss_before: float | None  # nats per token on held-out stories, None without them
    loss_after: float | None
    n_loss_tokens: int

    @property
    def norm(self) -> float:
        return float(np.linalg.norm(self.vector))

    @property
    def slopes(self) -> np.ndarray:
        return np.array([p.slope for p in self.prompts])

    @property
    def wrong_way(self) -> float:
        """The fraction of held-out prompts whose logit difference falls as the scale grows."""
        return float(np.mean(self.slopes < 0))

    @property
    def loss_increase(self) -> float | None:
        return None if self.loss_before is None else self.loss_after - self.loss_before


def steer_report(params, config: Config, pos: list[list[int]], neg: list[list[int]], *,
                 layer: int, scale: float, held_out: float = 0.25, seed: int = 0, steps: int = 5,
                 loss_texts: list[list[int]] = (), hooks=None) -> SteerReport:
    """Build the vector from the training pairs, judge it on the held-out ones at `steps`
    scales from 0 to `scale`, and measure the loss on `loss_texts` unsteered and at `scale`.

    With `hooks` (a steering already in place: --steer) every run is a run through them: the
    pairs' values, the prompts and the loss; the new vector is measured on top of it."""
    train, held = split_pairs(len(pos), held_out, seed)
    prompts = [prompt_of(pos[i], neg[i], int(i) + 1) for i in held]
    vector = mean_difference(params, config, [(pos[i], neg[i]) for i in train], layer, hooks)
    scales = np.linspace(0.0, scale, steps)
    results = []
    for p in prompts:
        diffs = np.array([logit_difference(params, config, p, vector, layer, c, hooks)
                          for c in scales])
        results.append(PromptResult(p.ids, p.target, p.vs, diffs, slope(scales, diffs)))
    before = after = None
    if loss_texts:
        before = mean_loss(params, config, loss_texts, hooks)
        after = mean_loss(params, config, loss_texts,
                          chained(hooks, add_vector(site(layer), vector, scale)))
    return SteerReport(layer, vector, [int(i) + 1 for i in train], [int(i) + 1 for i in held],
                       scales, results, scale, before, after,
                       sum(len(t) - 1 for t in loss_texts))


# ------------------------------------------------------------------ the direction file


# A direction file is a safetensors file holding the tensor `direction` [d] (float32), or, for
# a set of directions (an SAE's `W_dec` [m, d], a multiclass probe's `directions` [C, d]), a
# 2-D tensor from which `FILE#N` picks row N. Its metadata (all optional) says what it is:
# `site` (the trace path it lives at; a resid_pre/resid_post site gives the layer to steer),
# `kind` (steer, probe, sae) and `source` (how it was made, JSON). A .npy file holding a [d]
# array (or [n, d] with #N) works too.

ROWS = ("W_dec", "directions")


def direction_file(vector: np.ndarray, site_path: str, kind: str, source: dict,
                   rows: np.ndarray | None = None, meta: dict[str, str] | None = None) -> bytes:
    """The safetensors bytes (safetensors.safetensors_bytes: the same vector gives the same
    bytes). `meta` is more metadata (metadata_strings: the steering of the run it was found
    in)."""

    tensors = {"direction": np.ascontiguousarray(vector, dtype="<f4")}
    if rows is not None:
        tensors["directions"] = np.ascontiguousarray(rows, dtype="<f4")
    return safetensors_bytes(tensors, {"site": site_path, "kind": kind,
                                       "source": json.dumps(source, sort_keys=True),
                                       **metadata_strings(meta or {})})


@dataclass
class Direction:
    vector: np.ndarray  # [d] float32
    layer: int | None  # the layer whose resid_pre it belongs to, if the file says
    name: str  # the file (and #row) it came from


def layer_of_site(path: str | None, n_layer: int) -> int | None:
    """resid_pre[L] is L; resid_post[L] is resid_pre[L + 1]; anything else says nothing."""
    parts = (path or "").split(".")
    if len(parts) != 3 or parts[0] != "layers" or not parts[1].isdigit():
        return None
    layer = int(parts[1]) + (parts[2] == "resid_post")
    return layer if parts[2] in ("resid_pre", "resid_post") and layer < n_layer else None


def read_direction(spec: str, d: int, n_layer: int, weights_file, config=None) -> Direction:
    """The vector named by --steer-vector FILE or FILE#N: InputError for a file that is not
    one of the forms above (exit 2), WeightsError for one that cannot be read (exit 1). A
    file whose metadata names the weights it was made for (madefor) must name these. A
    folder is a SAELens SAE (read for the model of `config`): DIR#N is its W_dec row N."""


    path, _, row = spec.rpartition("#") if "#" in spec else (spec, "", "")
    if row and not row.isdigit():
        raise InputError(f"--steer-vector {spec}: after '#' give a row number, not {row!r}")
    if Path(path).is_dir() and config is not None:

        sae = load_saelens(Path(path), config, weights_file)  # checked as every SAE is
        if not row:
            raise InputError(f"--steer-vector {spec}: a SAELens folder holds {sae.n_latents} "
                             f"directions (W_dec's rows); pick one with {path}#N")
        vector = _pick({"W_dec": sae.W_dec}, int(row), spec)
        return Direction(vector, layer_of_site(sae.site, n_layer), spec)
    if not Path(path).is_file():
        raise InputError(f"--steer-vector {path}: no such file")
    tensors, meta = _read_tensors(Path(path))
    check_made_for(f"--steer-vector {path}", meta, weights_file, "the vector",
                   "find it again on these weights (tinygpt steer --out)", required=False)
    vector = _pick(tensors, int(row) if row else None, spec)
    if vector.dtype.kind != "f":
        raise InputError(f"--steer-vector {spec}: the vector holds {vector.dtype.name} values; "
                         "a vector is real floating-point numbers")
    if vector.shape != (d,):
        raise InputError(f"--steer-vector {spec}: the vector has shape {list(vector.shape)}; "
                         f"this model's residual stream has {d} numbers")
    if not np.all(np.isfinite(vector)):
        raise WeightsError(f"--steer-vector {spec}: the vector holds NaN or infinite numbers")
    return Direction(vector.astype(np.float32), layer_of_site(meta.get("site"), n_layer), spec)


def _read_npy(path) -> np.ndarray:
    """A .npy file's array, its header checked before anything is allocated: real floating
    point numbers (not strings, objects or complex numbers, whose imaginary part would be
    dropped: InputError, exit 2), and as many as the file holds (WeightsError, exit 1)."""
    fmt = np.lib.format
    try:
        with open(path, "rb") as f:
            version = fmt.read_magic(f)
            shape, _, dtype = (fmt.read_array_header_1_0(f) if version == (1, 0)
                               else fmt.read_array_header_2_0(f))
            start = f.tell()
    except (ValueError, OSError, EOFError, SyntaxError, TypeError) as e:
        raise WeightsError(f"--steer-vector {path}: not a readable .npy file "
                         f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    if dtype.kind != "f" or dtype.fields is not None:
        raise InputError(f"--steer-vector {path}: the file holds {dtype.name} values "
                         f"(dtype {dtype.str!r}); a vector is real floating-point numbers")
    count = int(np.prod(shape, dtype=object))
    size = path.stat().st_size - start
    if count * dtype.itemsize != size:
        raise WeightsError(f"--steer-vector {path}: its header claims {count:,} numbers "
                         f"({count * dtype.itemsize:,} bytes) and the file holds {size:,} "
                         "bytes after it")
    return np.load(path, allow_pickle=False)


def _read_tensors(path) -> tuple[dict[str, np.ndarray], dict]:
    if path.suffix == ".npy":
        return {"direction": _read_npy(path)}, {}

    return read_safetensors(path, label=f"--steer-vector {path}")


def _pick(tensors: dict[str, np.ndarray], row: int | None, spec: str) -> np.ndarray:
    if row is None:
        if "direction" in tensors:
            return np.asarray(tensors["direction"])
        if len(tensors) == 1:
            return np.asarray(next(iter(tensors.values())))
        raise InputError(f"--steer-vector {spec}: the file holds {len(tensors)} tensors and "
                         "none is named 'direction'; pick a row with FILE#N")
    table = next((tensors[k] for k in ROWS if k in tensors), None)
    if table is None and len(tensors) == 1:
        table = next(iter(tensors.values()))
    if table is None or np.ndim(table) != 2:
        raise InputError(f"--steer-vector {spec}: #N picks a row of a 2-D tensor "
                         f"({' or '.join(ROWS)}); the file has none")
    if not 0 <= row < len(table):
        raise InputError(f"--steer-vector {spec}: row {row} is out of range: the file has "
                         f"rows 0..{len(table) - 1}")
    return np.asarray(table[row])


# ------------------------------------------------------------------ the --steer options


def steering_direction(model, toward: str | None, away: str | None, vector_file: str | None,
                       layer: int | None) -> tuple[np.ndarray, int, dict]:
    """(v, the block it steers, where v came from) from the --steer options: a saved
    direction (--steer-vector FILE[#N], its block from the file unless --steer-layer), or
    mean_difference of the --steer and --steer-away texts at --steer-layer."""

    config = model.config
    if vector_file is not None:
        if toward is not None or away is not None:
            raise InputError("give --steer-vector or --steer/--steer-away, not both")
        d = read_direction(vector_file, config.n_embd, config.n_layer, model.weights_file,
                           config)
        layer = layer if layer is not None else d.layer
        if layer is None:
            raise InputError(f"--steer-vector {vector_file}: the file does not say which "
                             "block it steers; give --steer-layer L")
        return d.vector, layer, {"vector": vector_file}
    if toward is None or away is None:
        given, missing = ("--steer", "--steer-away") if toward is not None else \
            ("--steer-away", "--steer")
        raise InputError(f"{given} needs {missing}: v is the difference of the two texts' "
                         "mean resid_pre")
    if layer is None:
        raise InputError("--steer needs --steer-layer L: the block whose input is steered")
    layer = check_index(layer, config.n_layer, "--steer-layer")
    for text, name in ((toward, "--steer"), (away, "--steer-away")):
        check_utf8(text, name)
    pair = (encode_checked(model, toward), encode_checked(model, away))
    vector = mean_difference(model.params, config, [pair], layer)
    return vector, layer, {"toward": toward, "away": away}


def steering_hook(model, toward: str | None, away: str | None, vector_file: str | None,
                  layer: int | None, scale: float) -> tuple[object, dict]:
    """(the hook that adds scale * v to the input of the block, its description: site,
    scale, the norm of v and where v came from) from the --steer options
    (steering_direction)."""

    if not math.isfinite(scale):
        raise InputError(f"--steer-scale must be a finite number, got {scale!r}")
    vector, layer, source = steering_direction(model, toward, away, vector_file, layer)
    layer = check_index(layer, model.config.n_layer, "--steer-layer")
    described = {"site": site(layer), "scale": scale,
                 "norm": float(math.sqrt(float(vector.astype(float) @ vector))), **source}
    return add_vector(site(layer), vector, scale), described
