"""The means of mean ablation over a corpus, and their file: the reference text read into
windows, the shards of the pass run on an engine (analysis.means sums and merges them), the
result cached, and stored beside the weights as means.safetensors (float32, a few KB) with
the sha256 of the weights they were computed from, so a retrained model is never ablated
with another model's means."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..analysis.means import batch_sums, mean_paths, mean_size, merged_means
from ..errors import InputError, WeightsError
from ..storage import cache
from ..storage.files import sha256, write_atomically
from ..storage.madefor import remake_hint
from ..storage.safetensors import (
    header_bytes,
    metadata_strings,
    read_safetensors,
    safetensors_bytes,
)
from ..transformer.config import Config
from ..transformer.windows import encode_stories, eval_windows
from .cluster import over_windows
from .corpus import read_stories, validation_text

FILE = "means.safetensors"


def value_means(params: dict[str, np.ndarray], config: Config, windows: np.ndarray,
                batch: int = 16, hooks=None, engine=None) -> dict[str, np.ndarray]:
    """The mean over windows [N, T] and positions of every path of mean_paths, float64, of
    runs through `hooks` (steering) when given, the shards of windows on `engine` (default:
    this process). The pass stops after the last block's mlp_out: the head over the
    vocabulary is not needed."""

    return merged_means(over_windows(engine, batch_sums, windows, (params, config, batch, hooks)))


def means_bytes(means: dict[str, np.ndarray], meta: dict) -> bytes:

    tensors = {p: np.ascontiguousarray(v, dtype=np.float32) for p, v in means.items()}
    return safetensors_bytes(tensors, metadata_strings(meta))


def save_means(path: str | Path, means: dict[str, np.ndarray], meta: dict) -> None:
    write_atomically(Path(path), means_bytes(means, meta))


def header_limit(config: Config) -> int:
    """The most header bytes a means file of this model needs: a header of a million made-up
    entries is refused before it is parsed, as the weights' is."""

    return header_bytes(len(mean_paths(config)))


def means_hint(path: Path) -> str:
    """How to get the means of the weights folder that holds `path`: compute them (never into
    the installed package: madefor.remake_hint), or give --data to compute them on the fly."""

    made = remake_hint("compute them", "means", Path(path).parent / "model.safetensors",
                       path, "--out", FILE, None)
    return f"{made}, or give --data DIR"


def load_means(path: str | Path, config: Config,
               weights_sha256: str) -> tuple[dict[str, np.ndarray], dict]:
    """The stored means and their metadata, refused when they belong to other weights."""

    path = Path(path)
    hint = means_hint(path)
    if not path.is_file():
        raise InputError(f"no mean statistics at {path}: {hint}")
    means, meta = read_safetensors(path, limit=header_limit(config), hint=hint)
    if meta.get("weights_sha256") != weights_sha256:
        raise InputError(f"the mean statistics at {path} were computed for other weights: {hint}")
    for p in mean_paths(config):
        if p not in means:
            raise InputError(f"{path} has no mean for {p}: {hint}")
        m = means[p]
        if m.shape != (mean_size(p, config),) or not np.isfinite(m).all():
            raise WeightsError(f"{path}: the mean of {p} is not {mean_size(p, config)} finite "
                               f"numbers (shape {list(m.shape)}): {hint}")
        with np.errstate(all="ignore"):  # a mean of a float32 run's values is one such
            square = np.dot(m.astype(np.float32), m.astype(np.float32))  # value: a norm squares it
        if not np.isfinite(square):
            raise WeightsError(f"{path}: the mean of {p} is too large for a value of a float32 "
                               f"run (its sum of squares overflows): {hint}")
    return means, meta


def means_over(model, data: Path | None, weights_sha: str, bar, steer=None, engine=None):
    """(values, meta) over the validation file of `data` (or the one the weights record), of
    runs steered by `steer` (hooks.Steering) when given, on `engine`, cached by the weights'
    and data's sha256 and the steering. bar(total, description) is the progress bar."""

    val = validation_text(model.folder, data)
    meta = {"weights_sha256": weights_sha, "data": val[0].name, "data_sha256": sha256(val[0])}

    def compute():
        stream = encode_stories(read_stories(val), model.tokenizer)
        windows, _ = eval_windows(stream.ids, model.config.n_positions)
        with bar(None, f"averaging over {val[0].name}"):
            values = value_means(model.params, model.config, windows, hooks=steer,
                                 engine=engine)
        return values, {**meta, "tokens": str(windows.size)}

    key = cache.key_of(weights_sha, meta["data_sha256"], *([] if steer is None else steer.key()))
    entry = cache.entry("means", key, ".safetensors")
    return cache.load_or_compute(
        entry, lambda path: load_means(path, model.config, weights_sha), compute,
        lambda path, found: cache.keep(path, means_bytes(*found)))


def ablation_means(model, data: Path | None, bar, steer=None) -> dict[str, np.ndarray]:
    """The means for --mode mean: over --data's validation text, or the ones stored beside
    the weights. A steered run is ablated with the steered model's own means (over --data,
    or the validation text the weights record; computed once and cached): the stored ones
    are the unsteered model's, and putting them in would undo part of the steering."""

    weights_sha = sha256(model.weights_file)
    if data is None and steer is None:
        return load_means(model.folder / FILE, model.config, weights_sha)[0]
    return means_over(model, data, weights_sha, bar, steer)[0]
