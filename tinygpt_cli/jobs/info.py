"""info's facts of the files: the weights file resolved, its sha256, and whether it is the
model that comes with tinygpt (analysis.info reports them with the model's own)."""

from __future__ import annotations

from ..analysis.info import ModelInfo, model_info
from ..storage.files import sha256
from ..storage.locations import SHIPPED


def info_of(model) -> ModelInfo:
    """analysis.info.model_info of a loaded model, with its weights file's facts."""

    weights_file = model.weights_file.resolve()
    return model_info(model, weights_file, sha256(weights_file),
                      weights_file.parent == SHIPPED.resolve())
