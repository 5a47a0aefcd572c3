"""The passes over a corpus that train and evaluate an SAE (analysis/sae.py): the site's
values of the training text (sharded on the engine), training that resumes from a
checkpoint, the evaluation on held-out text, and the sparse codes of a corpus kept in the
cache as shards (jobs/shards.py) for `sae feature`. The SAE files are
jobs/dictionaries/saes.py's."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from ..analysis.sae import (
    SAE,
    TrainState,
    evaluate,
    joined_codes,
    new_state,
    shard_codes,
    site_values_over,
    train_steps,
    valid_codes,
)
from ..errors import InputError, WeightsError
from ..storage import cache
from ..storage.files import sha256, write_atomically
from ..transformer.config import Config
from ..transformer.optim import SAE_BETAS, AdamW
from . import shards
from .cluster import over_windows
from .corpus import data_windows, held_out_files
from .dictionaries.saes import sae_tensors, save_sae


def data_codes(model, sae: SAE, path: Path, files: list[Path], windows: int,
               bar, steer=None, engine=None, windows_of=None) -> dict[str, np.ndarray]:
    """The SAE's sparse codes (ids, indices, values) at every token of `windows` windows of
    the files, of runs steered by `steer` (hooks.Steering) when given, computed once per
    (weights, SAE, data, steering) as a task per shard of windows on `engine` (None: this
    process) and kept in the cache folder as shards with a manifest (tinygpt_cli.jobs.shards): a
    pass cut short keeps its finished shards. bar(total, description) is the progress bar's
    context manager. windows_of(): those windows' ids, when several dictionaries' codes
    read the same text (asked for only when the cache misses); else read here."""

    # a folder (SAELens': cfg.json and its weights; Gemma Scope 2's: params.safetensors and
    # config.json, or none, the site then read from its names): its files and the site
    names = ("cfg.json", "sae_weights.safetensors", "params.safetensors", "config.json")
    files_of_sae = [Path(path) / n for n in names if (Path(path) / n).is_file()] \
        if Path(path).is_dir() else [Path(path)]
    site = [sae.site] if Path(path).is_dir() and not (Path(path) / "cfg.json").is_file() else []
    key = cache.key_of("sae-codes-v2", sha256(model.weights_file), *site,
                       *(sha256(f) for f in files_of_sae),
                       *(sha256(f) for f in files), str(windows),
                       *([] if steer is None else steer.key()))
    folder = cache.entry("sae-codes", key, suffix="")

    def valid(e: dict, n: int) -> bool:
        return valid_codes(e, sae, model.config, n) and len(e["ids"]) == n

    found = shards.read_complete(folder, key, valid)
    if found is None:
        x_in = windows_of() if windows_of is not None else data_windows(
            files, model.tokenizer, model.config.n_positions, windows, bar)[0]
        with bar(len(x_in), "latents of the data") as advance:
            found = shards.computed(folder, key, x_in, shard_codes,
                                    (model.params, model.config, sae, steer), valid,
                                    engine=engine, progress=advance)
    return joined_codes(found, sae, model.config)


def evaluate_held_out(model, sae: SAE, data, windows: int, progress=None, hooks=None,
                      engine=None):
    """`sae eval`: evaluate over `windows` windows of the held-out text (--data's last part,
    or part-005), never training text, on `engine` (None: this process); (the evaluation,
    the files' names)."""

    files = held_out_files(data)
    x, y = data_windows(files, model.tokenizer, model.config.n_positions, windows)
    return (evaluate(model.params, model.config, sae, x, y, progress, hooks,
                     partial(over_windows, engine)), [f.name for f in files])


def site_values_on(engine, params, config: Config, windows: np.ndarray, site: str, *,
                   progress: Callable[[int], None] | None = None, hooks=None) -> np.ndarray:
    """site_values, each shard of windows a task on `engine` (None: this process), joined in
    window order: the same numbers as one pass (the shards hold whole batches)."""

    return site_values_over(partial(over_windows, engine), params, config, windows, site,
                            progress=progress, hooks=hooks)


def train_resumably(x: np.ndarray, out: Path, settings: dict, weights_sha256: str,
                    bar, changes: dict | None = None, y: np.ndarray | None = None,
                    meta: dict | None = None) -> TrainState:
    """`sae train`: a TopK SAE trained on x [N, d] as `settings` ask (site, latents, k, steps,
    batch, lr, windows, seed), resuming from OUT.checkpoint.npz when it holds a run with
    these settings and checkpointing to it every 100 steps; the SAE is saved to `out` and
    the checkpoint removed. bar(total, description): a progress bar. `changes` ({"steered":
    ...} for a steered run's values) go into the file's metadata, and the settings. A
    transcoder's targets y and its metadata (`meta`) come through the same way."""
    settings = {**settings, **(changes or {})}  # resumed only under the same steering
    ckpt = out.with_name(out.name + ".checkpoint.npz")
    steps, seed = settings["steps"], settings["seed"]
    state = load_checkpoint(ckpt, settings) or new_state(
        x, settings["latents"], settings["k"], settings["site"], seed, settings["lr"], y)
    with bar(steps, "training") as advance:
        advance(state.step)

        def each(st):
            advance(1)
            if st.step % 100 == 0 or st.step == steps:
                save_checkpoint(ckpt, st, settings)

        train_steps(state, x, steps, batch=settings["batch"], seed=seed, progress=each, y=y)
    save_sae(out, state.sae, {"steps": str(steps), "tokens": str(len(x)),
                              "weights_sha256": weights_sha256, **(changes or {}),
                              **(meta or {})})
    ckpt.unlink(missing_ok=True)
    return state


def save_checkpoint(path: Path, state: TrainState, settings: dict) -> None:
    """The training state, atomically, with the settings it belongs to."""

    arrays = {f"p/{n}": a for n, a in sae_tensors(state.sae).items()}
    arrays.update({f"m/{n}": a for n, a in state.adam.m.items()})
    arrays.update({f"v/{n}": a for n, a in state.adam.v.items()})
    buf = io.BytesIO()
    np.savez(buf, since_fired=state.since_fired, losses=np.asarray(state.losses),
             step=state.step, t=state.adam.t, settings=json.dumps(settings), **arrays)
    write_atomically(path, buf.getvalue())


def load_checkpoint(path: Path, settings: dict) -> TrainState | None:
    """The run's state from its checkpoint, or None when there is none for these settings."""

    if not path.is_file():
        return None
    try:
        with np.load(path) as z:
            if json.loads(str(z["settings"])) != settings:
                raise InputError(f"{path} is a checkpoint of a run with other settings: "
                                 "delete it or give the same options")
            p = {n: z[f"p/{n}"].copy() for n in ("W_enc", "b_enc", "W_dec", "b_dec")}
            b_in = z["p/b_in"].copy() if "p/b_in" in z else None
            sae = SAE(**p, site=settings["site"], k=settings["k"], b_in=b_in)
            adam = AdamW(sae.params(), betas=SAE_BETAS, weight_decay=0.0)
            adam.load_state(z)
            return TrainState(sae, adam, settings["lr"], int(z["step"]),
                              z["since_fired"].copy(), list(z["losses"]))
    except (OSError, ValueError, KeyError) as e:
        raise WeightsError(f"{path} is not a readable checkpoint ({e}): delete it to start "
                           "over") from None
