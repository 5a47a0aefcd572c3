"""tinygpt's transcoder files, and a folder of transcoders whatever its layout: the weights
folder's transcoders/ (one layers.L.safetensors a block: the SAE's four tensors plus b_in,
metadata kind "transcoder", layer, k, weights_sha256, made for these weights: madefor.py's
rule), Gemma Scope 2's transcoder_all/ (a layer_L_... folder a block) or its clt/ (a
cross-layer transcoder: gemmascope.py), fetched from the hub when named ORG/NAME/PATH."""

from __future__ import annotations

import shlex
from pathlib import Path

import numpy as np

from ...analysis.dictionary import SAE
from ...analysis.transcoder import output_path
from ...errors import InputError, WeightsError
from ...storage.hub import dictionary
from ...storage.madefor import check_made_for, remake_hint, weights_option
from ...storage.safetensors import read_safetensors
from ...transformer.config import Config
from .gemmascope import (
    PARAMS,
    is_cross_layer,
    layer_files,
    load_cross_layer,
    load_gemma_scope,
    transcoder_folders,
)
from .saes import check_tensors

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


def folder_of(weights_file: Path, given: Path | None = None) -> Path:
    """--transcoders DIR (a hub repository's folder, ORG/NAME/PATH, fetched:
    hub.dictionary), or the weights folder's transcoders/."""

    if given is not None:
        return dictionary(given, "--transcoders")
    return Path(weights_file).parent / "transcoders"


def file_of(folder: Path, layer: int) -> Path:
    return Path(folder) / f"layers.{layer}.safetensors"


def load_transcoders(folder: Path, config: Config, weights_file: Path):
    """Every block's transcoder from `folder`, each checked (tensors, shapes, finite, its
    layer, k, made for `weights_file`): a list of per-layer ones, or, from a Gemma Scope 2
    clt/ folder, one cross-layer transcoder (dictionary.CrossLayerTranscoder)."""
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
                           ) -> SAE:
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


def load_transcoder(path: Path, config: Config, weights_file: Path, layer: int) -> SAE:

    if not path.is_file():
        raise InputError(f"no transcoder for block {layer} at {path}: "
                         f"{train_hint(weights_file, path.parent)}")
    t, meta = read_safetensors(path)
    m = check_tensors(path, t, config, "a transcoder", TENSORS)
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
    return SAE(f32["W_enc"], f32["b_enc"], f32["W_dec"], f32["b_dec"], output_path(layer),
                 k, str(path), b_in=f32["b_in"])
