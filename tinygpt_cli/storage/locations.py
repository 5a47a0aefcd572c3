"""Where the weights are: the folder --weights names (a path, $TINYGPT_WEIGHTS, the folder
shipped with the package, weights/NAME, a hub id's snapshot) and its weights file
(model.safetensors, a sharded model's index, a GGUF). Paths alone: reading them is the model
floor's (transformer/folder.py)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import InputError, WeightsError
from .safetensors import INDEX


def _shipped_folder() -> Path:
    """Installed wheels carry the weights inside the package; a source checkout has weights/."""
    here = Path(__file__).resolve().parent.parent  # the package
    inside = here / "_weights"
    return inside if inside.is_dir() else here.parent / "weights"


SHIPPED = _shipped_folder()


def weights_path(root: Path) -> Path:
    """The folder's weights: model.safetensors, else a sharded model's index. A folder with
    only pytorch_model.bin is refused: tinygpt reads safetensors alone (a pickle can run code
    as it loads)."""
    single = root / "model.safetensors"
    if single.exists() or single.is_symlink() or not (root / INDEX).is_file():
        if not single.exists() and not single.is_symlink() and \
                any(root.glob("pytorch_model*.bin")):
            raise WeightsError(
                f"weights folder {root} holds pytorch_model.bin, which tinygpt does not read: "
                "only safetensors files (save it again with transformers: from_pretrained, "
                "then save_pretrained(folder, safe_serialization=True))")
        return single
    return root / INDEX


def _shipped_named(name: str) -> Path | None:
    """weights/NAME, spelt just so (the README's names), when the shipped weights hold a
    model folder NAME. `./weights/llama` is a path and stays one."""
    m = re.fullmatch(r"weights/([A-Za-z0-9][\w.-]*)/?", name)
    if m:
        inside = SHIPPED / m[1]
        if (inside / "config.json").is_file():
            return inside
    return None


def resolve_folder(folder: str | Path | None) -> tuple[Path, bool]:
    """--weights DIR, then $TINYGPT_WEIGHTS, then the weights shipped with the package; and
    whether the user named it. An empty name is refused, never taken as the current folder.
    A name that is no folder here but a hub id (ORG/NAME[@REVISION]) is the hub cache's
    snapshot of that model, fetched when needed (hub.py); ORG/NAME[@REVISION]/FILE.gguf is
    that one file of it."""
    if folder is not None:
        if str(folder) == "":
            raise InputError("--weights is empty: name a weights folder, or leave the option "
                             "out for the shipped model")
        return _local_or_hub(folder), True
    env = os.environ.get("TINYGPT_WEIGHTS")
    if env:
        return _local_or_hub(env), True
    return SHIPPED, False


def _local_or_hub(name: str | Path) -> Path:
    """The folder `name`; when there is none of that name, a folder shipped with the package
    that the README names from the repository's root (weights/llama: the shipped `llama`,
    from any folder); else, when it is a hub id, the hub cache's snapshot of it. A local
    folder always wins."""
    path = Path(name).expanduser()
    if path.exists() or path.is_symlink():
        return path
    shipped = _shipped_named(str(name))
    if shipped is not None:
        return shipped
    from .hub import file, hub_file, hub_id, snapshot

    one = hub_file(str(name))
    if one is not None:
        return file(str(name), *one)
    found = hub_id(str(name))
    return path if found is None else snapshot(str(name), *found)


def gguf_path(path: Path) -> Path | None:
    """The GGUF file `--weights` names: the file itself, or the one .gguf in a folder that
    has no model.safetensors; None when it names no GGUF. A folder of several is refused."""
    if path.suffix.lower() == ".gguf" and not path.is_dir():
        return path
    if not path.is_dir() or (path / "model.safetensors").exists() \
            or (path / "config.json").exists():
        return None
    found = sorted(p for p in path.glob("*.gguf") if not p.is_dir())
    if len(found) > 1:
        names = ", ".join(p.name for p in found[:3]) + (", ..." if len(found) > 3 else "")
        raise InputError(f"weights folder {path} holds {len(found)} GGUF files ({names}): "
                         "name one with --weights FILE.gguf")
    return found[0] if found else None
