"""A neuron's search over a corpus: the stories read into windows, the shards of the pass
run on an engine (analysis.neurons keeps each shard's best windows and merges them), and the
maxima kept in the cache folder, once per (weights, data, steering)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np

from ..analysis.neurons import NEURON_TOP, best_maxima, shard_maxima
from ..errors import InputError
from ..storage import cache
from ..storage.files import sha256
from ..transformer.config import Config
from ..transformer.windows import encode_stories, eval_windows
from .cluster import over_windows
from .corpus import read_stories


def corpus_maxima(params, config: Config, windows: np.ndarray, keep: int = NEURON_TOP,
                  progress: Callable[[int], None] | None = None, hooks=None, engine=None
                  ) -> dict[str, np.ndarray]:
    """The `keep` windows where each neuron of each block peaks highest, best first (ties:
    the earlier window): window [L, ff, k] (its index), value [L, ff, k] (the peak), position
    [L, ff, k]. Each shard of windows keeps its own best (on `engine`: default this process),
    and the best of those are the best of all."""

    parts = over_windows(engine, shard_maxima, windows, (params, config, keep, hooks),
                         progress=progress)
    return best_maxima(parts, keep, len(windows))


def cached_maxima(model, files: list, bar, hooks=None, engine=None) -> dict[str, np.ndarray]:
    """corpus_maxima of every neuron over the files and their token stream ("stream"),
    computed once per (weights, data, steering) on `engine` and kept in the cache folder
    (hooks other than one steering vector are computed afresh and not kept).
    bar(total, description) is the progress bar."""

    cfg = model.config

    def compute():
        stream = encode_stories(read_stories(files), model.tokenizer)
        x, _ = eval_windows(stream.ids, cfg.n_positions)
        if len(x) == 0:
            raise InputError(f"the data has {len(stream.ids)} tokens, less than one window of "
                             f"{cfg.n_positions}")
        with bar(len(x), "neuron maxima") as advance:
            maxima = corpus_maxima(model.params, cfg, x, progress=advance, hooks=hooks,
                                   engine=engine)
        return {"stream": stream.ids.astype(np.uint16), **maxima}

    steered = []  # a steered search is kept under its own key: the site and the vector
    if hooks is not None:
        if getattr(hooks, "shift", None) is None:
            return compute()

        steered = [hooks.site, hashlib.sha256(np.asarray(hooks.shift, np.float64).tobytes())
                   .hexdigest()]
    key = cache.key_of("neurons-v1", sha256(model.weights_file),
                       *(sha256(f) for f in files), str(cfg.n_positions), str(NEURON_TOP),
                       *steered)
    return cache.load_or_compute(cache.entry("neurons", key), cache.load_arrays, compute,
                                 cache.store_arrays, lambda e: valid_maxima(e, cfg))


def valid_maxima(e: dict, cfg: Config) -> bool:
    """The keys, shapes and ranges cached_maxima writes: [L, ff, k] windows of the stream."""
    if set(e) != {"stream", "window", "value", "position"} or e["stream"].ndim != 1:
        return False
    if not all(np.issubdtype(e[k].dtype, np.integer) for k in ("stream", "window", "position")):
        return False  # indices: a float entry would fail every later run when it is used
    shape = e["window"].shape
    n = (len(e["stream"]) - 1) // cfg.n_positions
    return (len(shape) == 3 and shape[:2] == (cfg.n_layer, cfg.n_inner) and shape[2] >= 1
            and all(e[k].shape == shape for k in ("value", "position"))
            and 0 <= e["window"].min() and e["window"].max() < n
            and 0 <= e["position"].min() and e["position"].max() < cfg.n_positions
            and e["stream"].max() < cfg.vocab_size and bool(np.isfinite(e["value"]).all()))
