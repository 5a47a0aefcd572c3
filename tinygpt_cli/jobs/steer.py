"""The work of steering (analysis/steer.py): the --pos/--neg files read as pairs of texts,
and the --steer options made a hook (a saved direction read, or the difference of two
texts' mean resid_pre, at the block they name)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..analysis.steer import mean_difference, parse_texts, site
from ..errors import InputError, check_index, check_utf8
from ..transformer.hooks import add_vector
from .corpus import read_user_file
from .dictionaries.directions import read_direction
from .session import encode_checked


def read_pairs(pos: Path, neg: Path) -> tuple[list[str], list[str]]:
    """The texts of the files --pos and --neg; text i of one pairs with text i of the other."""

    pos_texts = parse_texts(read_user_file(pos, "--pos"), "--pos")
    neg_texts = parse_texts(read_user_file(neg, "--neg"), "--neg")
    if len(pos_texts) != len(neg_texts):
        raise InputError(f"--pos holds {len(pos_texts)} texts and --neg {len(neg_texts)}: "
                         "text i of one pairs with text i of the other")
    return pos_texts, neg_texts


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
