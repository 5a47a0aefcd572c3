"""The passes over a corpus that train and evaluate transcoders (analysis/transcoder.py): a
block's training resumable as an SAE's (jobs/sae.py), the evaluation on held-out text, and a
block's codes of the training text, cached, for the features of `graph`. The files are
jobs/dictionaries/transcoders.py's."""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from pathlib import Path

import numpy as np

from ..analysis.sae import SAE, TrainState
from ..analysis.transcoder import encoders_of, evaluate, input_path, output_path
from . import sae as jobs_sae
from .corpus import data_windows, given_or, held_out_files
from .dictionaries.transcoders import file_of


def train_layer(x: np.ndarray, y: np.ndarray, out: Path, layer: int, settings: dict,
                weights_sha256: str, bar, changes: dict | None = None) -> TrainState:
    """Block `layer`'s transcoder on (x, y) [N, d], resumably (jobs.sae.train_resumably);
    `changes` ({"steered": ...}) into its metadata and settings."""
    settings = {**settings, "site": output_path(layer), "layer": layer}
    return jobs_sae.train_resumably(x, out, settings, weights_sha256, bar, changes, y=y,
                                    meta={"kind": "transcoder", "layer": str(layer),
                                          "reads": input_path(layer)})


def evaluate_held_out(model, transcoders: list[SAE], data, windows: int, progress=None,
                      hooks=None):
    """`transcoder eval`: on `windows` windows of --data (a file, or a folder's last part)."""

    files = given_or(data, held_out_files)
    x, y = data_windows(files, model.tokenizer, model.config.n_positions, windows)
    return (evaluate(model.params, model.config, transcoders, x, y, progress, hooks),
            [f.name for f in files])


def data_codes(model, transcoders: list[SAE], folder: Path, layer: int, files: list[Path],
               windows: int, bar, engine=None, windows_of=None) -> dict[str, np.ndarray]:
    """Block `layer`'s transcoder codes at every token of `windows` windows of the files,
    computed once per (weights, transcoder file, data) on `engine` and cached
    (jobs.sae.data_codes, reading the transcoder's input ln2.out; windows_of: its)."""

    tc = replace(encoders_of(transcoders)[layer], site=input_path(layer))
    source = file_of(folder, layer)
    if not source.is_file():  # a Gemma Scope 2 folder's: the dictionary's own weights
        own = Path(encoders_of(transcoders)[layer].path)
        source = own if own.is_file() else own / "params.safetensors"
    return jobs_sae.data_codes(model, tc, source, files, windows, bar, engine=engine,
                               windows_of=windows_of)


def blocks_codes(model, transcoders: list[SAE], folder: Path, layers: list[int],
                 files: list[Path], windows: int, bar, engine=None) -> dict[int, dict]:
    """data_codes of each block of `layers`, the files read into windows once for them all,
    and only if a block's codes are not cached (each block read and encoded the whole text
    again: `graph` said "reading the text" once per block)."""

    @cache
    def windows_of() -> np.ndarray:
        return data_windows(files, model.tokenizer, model.config.n_positions, windows, bar)[0]

    return {lay: data_codes(model, transcoders, folder, lay, files, windows, bar, engine,
                            windows_of) for lay in layers}
