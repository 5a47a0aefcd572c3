"""`why`'s work around its math (analysis.why): the training text read and its token index kept
in the cache, the snapshots read, the window gradients' index opened or built (jobs.why_index)
and scored where its shards lie, the exact pass run on every core, each with its progress.

The slow steps are kept in the cache (tinygpt_cli.storage.cache), keyed by the sha256 of what
they were computed from: the token index by the data files' and the tokenizer's, the gradient
index by those and the snapshots'.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..analysis import exact_tracin as ex
from ..analysis.dictionary import SAE
from ..analysis.history import next_token
from ..analysis.why import (
    POOL,
    Index,
    Why,
    agreement,
    exact_influence,
    exact_matches,
    longest_seen,
    rounds,
    suffix_array,
    tokens_named,
    top_windows,
    valid_index,
    value_of,
    windows,
)
from ..errors import InputError
from ..storage import cache
from ..storage.cache import key_of
from ..storage.files import sha256
from ..transformer.config import Config
from ..transformer.model import forward
from ..transformer.windows import encode_stories
from . import history as hist
from .cluster import Here
from .corpus import TrainingDataError, read_stories
from .corpus import training_text as recorded
from .session import token_id
from .threads import map_on_cores, on_cores
from .why_index import TracinIndex, cannot_keep, index_folder, open_index, writable_index


def _no_bar(total: int | None, description: str):

    return contextlib.nullcontext(lambda n=1: None)


def data_key(files, tokenizer_file) -> str:

    return key_of("why-index-v2", *(sha256(f) for f in files), sha256(tokenizer_file))


def load_index(files, tokenizer, tokenizer_file, bar=_no_bar, key: str | None = None) -> Index:
    """The cached index of these files' tokens, built (with progress bars) when missing or
    damaged (valid_index). `key`: their data_key, when the caller has it already."""

    def build() -> dict[str, np.ndarray]:
        with bar(len(files), "reading the training text") as advance:
            parts = []
            for f in files:
                parts.append(encode_stories(read_stories([f]), tokenizer).ids)
                advance(1)
        stream = np.concatenate(parts).astype(np.uint16)
        with bar(rounds(), "sorting suffixes") as advance:
            sa = suffix_array(stream, on_round=advance)
        return {"stream": stream, "sa": sa.astype(np.int32),
                "files": np.asarray([Path(f).name for f in files]),
                "lengths": np.asarray([len(p) for p in parts], np.int64)}

    key = key or data_key(files, tokenizer_file)
    z = cache.load_or_compute(cache.entry("why-index", key), cache.load_arrays, build,
                              cache.store_arrays,  # unwritable: a note, the answer all the same
                              lambda z: valid_index(z, len(files), tokenizer.vocab_size))
    return Index(z["stream"], z["sa"].astype(np.int64), key, [str(n) for n in z["files"]],
                 z["lengths"])


def influence(index: Index, snapshots: list, config: Config, ids: list[int], target: int,
              top: int, grads: TracinIndex, hooks=None, workers: int | None = None,
              engine=None, progress=None) -> dict:
    """TracIn end to end over every window: score them all from the index where its shards
    lie (on `engine`: default this machine; each shard keeps its POOL * top best), then
    explain the best of those exactly, the snapshots on `workers` threads (default: every
    core). `snapshots` are analysis.history.Snapshot objects with a learning rate, in the
    index's order; progress(done, total) follows the shards scored."""

    n = (len(index.stream) - 1) // config.n_positions  # windows (never all in memory at once)
    # one backward pass a snapshot: the index's query and the exact re-scoring's gradient
    exact = map_on_cores(lambda s: ex.next_token_query(s.params, config, ids, target, hooks),
                         snapshots, workers)
    queries = grads.in_index_terms(exact, config, workers)
    chosen, per_snapshot = grads.best(queries, np.asarray([s.lr for s in snapshots]),
                                      POOL * top, config, engine or Here(workers), progress)
    rows = top_windows(index.stream, config, chosen, per_snapshot,
                       [(s.params, s.lr, q.grads) for s, q in zip(snapshots, exact, strict=True)],
                       ids, target, top, on_cores(workers))
    return {"windows": n, "windows_scored": n, "index": grads.describe(), "top_windows": rows}


def exact_scores(index: Index, snapshots: list, config: Config, makers: list,
                 workers: int | None = None, bar=_no_bar) -> np.ndarray:
    """Exact TracIn of every window for each query asked (makers: params -> its
    exact_tracin.Query), in one pass over the windows per snapshot.  -> [asks, snapshots,
    windows], each snapshot's part weighted by its learning rate"""

    n = (len(index.stream) - 1) // config.n_positions
    queries = [(s.params, s.lr, [make(s.params) for make in makers]) for s in snapshots]
    label = "scoring every window exactly" + (f" for {len(makers)} texts" if len(makers) > 1
                                              else "")
    with bar(n * len(snapshots), label) as advance:
        return ex.scores_over_stream(queries, config, index.stream, advance, on_cores(workers))


def training_text(model, data: list[Path] | None, any_data: bool = False):
    """The training text `why` ranks (corpus.training_text). Without --data, the weights
    must first have the snapshots TracIn needs: a folder with no history/ (one from the hub,
    say) is told that, not that it has no record of its text; a --data given is checked
    first, as the user's own input."""

    if not data:
        hist.find_snapshots(hist.history_folder(model), model.weights_file)
    return recorded(model.folder, data, any_data=any_data)


def answer(model, ids: list[int], target: str | int | None, files: list, top: int,
           report=None, workers: int | None = None, hooks=None, engine=None,
           query_report=None, exact: bool = False, check: bool = False,
           more: tuple = (), bar=_no_bar, value: str | None = None,
           vs: str | int | None = None, corrupt: list[int] | None = None,
           saes: Callable[[str], SAE] | None = None) -> Why:
    """`why` end to end: the training text's index, the exact matches, the snapshots, the
    window-gradient index (built when missing, on `engine`: default this machine;
    report(done, total) follows it) and TracIn (query_report(done, total) follows its shards);
    the text (never the training windows) runs through `hooks`, its steering. `exact`: every
    window scored exactly instead (no index: analysis.exact_tracin), with `more` texts' ids
    sharing the pass (their answers in .more); `check`: the index's answer, and how well
    its ranking agrees with the exact one (agreement). `value` (value_of's forms) or `vs`
    (logit[target] - logit[vs]): that scalar explained instead of the next token, exactly;
    `corrupt`: the ids of an edge's corrupt text; `saes`: site -> its SAE, for a latent's value
    (jobs.dictionaries.saes.finder: the --sae dictionaries, then the weights folder's own)."""

    config = model.config
    asks = [(q, _target_of(model, q, target, hooks)) for q in [ids, *more]]
    exact = exact or value is not None or vs is not None
    values = [value_of(model, q, value, t, None if vs is None else token_id(model, vs), hooks,
                       corrupt, saes)
              if value is not None or vs is not None else None for q, t in asks]
    makers = [v.make if v is not None else
              (lambda p, q=q, t=t: ex.next_token_query(p, config, q, t, hooks))
              for v, (q, t) in zip(values, asks, strict=True)]
    snapshots = hist.find_snapshots(hist.history_folder(model), model.weights_file)
    timeline = [s for s in hist.timeline(model, snapshots) if s.lr is not None]
    if not timeline:
        raise InputError(f"the snapshots in {hist.history_folder(model)} carry no learning rate "
                         "(metadata 'lr'), which TracIn weighs them by; retrain with --snapshots")
    # an index still to build needs a writable cache: said first, the one line (before the
    # token index's note that it is not kept); each key is hashed once
    key, folder = data_key(files, model.folder / "tokenizer.json"), None
    if not exact:
        folder = index_folder(key, [s.path for s in timeline], config)
        writable_index(folder)
    index = load_index(files, model.tokenizer, model.folder / "tokenizer.json", key=key)
    n = (len(index.stream) - 1) // config.n_positions
    if n == 0:
        raise TrainingDataError(f"the training text is {len(index.stream)} tokens: too short "
                                f"for one window of {config.n_positions} (and the token after "
                                "it), so there is nothing to rank")
    grads = None
    if not exact:
        grads = open_index(index.key, [s.path for s in timeline], config, n, folder)
        try:
            grads.build(index.stream, config, workers, report, engine=engine)
        except OSError as e:  # the gradient index is files on disk, read back by every query
            raise cannot_keep(grads.folder, e) from None
    scored = exact_scores(index, timeline, config, makers if exact else makers[:1], workers,
                          bar) if exact or check else None
    answers = []
    for k, (q, t) in enumerate(asks if exact else asks[:1]):
        if exact:
            found = exact_influence(index, timeline, config, makers[k], q, t, scored[k], top,
                                    on_cores(workers))
            if values[k] is not None:
                found["explained"] = {"name": values[k].name, "value": values[k].amount}
        else:
            found = influence(index, timeline, config, q, t, top, grads, hooks, workers,
                              engine, query_report)
        if check:
            x, y = windows(index.stream, config.n_positions)
            approx = grads.scores([s.params for s in timeline], config, x, y, q, t, hooks,
                                  workers, engine)
            found["check"] = agreement(
                (approx * np.asarray([s.lr for s in timeline])[:, None]).sum(0),
                scored[k].sum(0))
        answers.append(Why(t, model.tokenizer.token_str(t), len(index.stream),
                           longest_seen(index.stream, index.sa, q),
                           longest_seen(index.stream, index.sa, q, t),
                           exact_matches(index.stream, index.sa, q, t), timeline,
                           tokens_named(found, model.tokenizer, index), grads))
    answers[0].more = answers[1:]
    return answers[0]


def _target_of(model, ids: list[int], target: str | int | None, hooks) -> int:
    """The token to explain: the one named, else the text's likeliest next token."""

    if target is not None:
        return token_id(model, target)
    logits = forward(model.params, model.config, np.asarray(ids), hooks=hooks)
    return next_token(logits)[0]
