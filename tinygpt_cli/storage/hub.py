"""Weights named by their Hugging Face hub id: `--weights ORG/NAME[@REVISION]`.

A name that is no folder here but has a hub id's form is fetched through `huggingface_hub`
(the optional extra `hub`: pip install "tinygpt-cli[hub]") into the standard hub cache, and
the cached snapshot's folder (HUB_CACHE/models--ORG--NAME/snapshots/COMMIT/) is the weights
folder. Only the files tinygpt reads are fetched: config.json, tokenizer.json, and
model.safetensors or a sharded model's index and shards. The hub's own settings hold:
HF_HOME and HF_HUB_CACHE (where the cache is), HF_HUB_OFFLINE (the cache only, no network),
HF_TOKEN or a stored `hf auth login` token (private and gated models). A local folder of the
same name always wins; locations.resolve_folder is the one caller.

`--weights ORG/NAME[@REVISION]/FILE.gguf` names one GGUF file of a repository (the path
huggingface_hub's HfFileSystem gives it; FILE may lie in a subfolder): only that file is
fetched (hf_hub_download), as a GGUF carries its config and tokenizer itself.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
from pathlib import Path

from ..errors import InputError, WeightsError
from ..escapes import escape_line
from .safetensors import shards_of

# ORG/NAME as the hub spells repository ids (letters, digits, - _ .; no "--" or ".." inside),
# then an optional @REVISION: a branch, a tag or a commit (refs/pr/1 has slashes).
HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95})"
                    r"(?:@(?P<revision>[\w][\w./-]{0,199}))?")
FILES = ["config.json", "tokenizer.json", "model.safetensors", "model.safetensors.index.json",
         "model-*-of-*.safetensors",
         # read when there: the end tokens, the tokenizer's named tokens, the chat template
         "generation_config.json", "tokenizer_config.json", "special_tokens_map.json",
         "chat_template.jinja"]
# ORG/NAME[@REVISION]/PATH.gguf: a revision of one segment here (a branch, a tag, a commit)
HUB_FILE = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95})"
                      r"(?:@(?P<revision>\w[\w.-]{0,199}))?"
                      r"/(?P<file>(?:[\w.-]+/)*[\w.-]+\.gguf)", re.IGNORECASE)
INSTALL = 'pip install "tinygpt-cli[hub]"'


def hub_id(name: str) -> tuple[str, str | None] | None:
    """(ORG/NAME, REVISION or None) when `name` has a hub id's form, else None."""
    m = HUB_ID.fullmatch(name)
    if m is None or ".." in name or "--" in m["repo"] or m["repo"].endswith((".", "-")):
        return None
    return m["repo"], m["revision"]


def hub_file(name: str) -> tuple[str, str | None, str] | None:
    """(ORG/NAME, REVISION or None, the file's path in the repository) when `name` names a
    GGUF file of a hub repository, else None."""
    m = HUB_FILE.fullmatch(name)
    if m is None or ".." in name or "--" in m["repo"] or m["repo"].endswith((".", "-")) \
            or any(part.startswith(".") for part in m["file"].split("/")):
        return None
    return m["repo"], m["revision"], m["file"]


def offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it (1, true, yes, on)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def cache_dir() -> Path:
    """The hub cache: $HF_HUB_CACHE, else $HF_HOME/hub, else huggingface_hub's default
    (~/.cache/huggingface/hub). Read at each call, not once at import as the library does."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def snapshot(name: str, repo: str, revision: str | None) -> Path:
    """The cached snapshot folder of the hub model `repo` at `revision` (default: main),
    fetched when it is not cached and the hub may be reached. `name` is what the user typed."""
    try:
        import huggingface_hub  # noqa: F401 - the extra's presence
    except ImportError:
        raise InputError(f"weights folder {name} does not exist; to fetch {repo} from the "
                         f"Hugging Face hub, install the hub extra: {INSTALL}") from None
    return _snapshot(name, repo, revision, str(cache_dir()), offline())


@functools.lru_cache(maxsize=8)
def _snapshot(name: str, repo: str, revision: str | None, cache: str, local_only: bool) -> Path:
    """Once per process and setting: the command opens the folder and then its model."""
    from huggingface_hub import snapshot_download

    with _refused_in_one_line(name=name, repo=repo, revision=revision, cache=cache,
                              local_only=local_only, kind="model", here="a folder",
                              missing=f"weights folder {name} does not exist",
                              not_id="it is not a hub model id"):
        folder = Path(snapshot_download(repo, revision=revision, allow_patterns=FILES,
                                        cache_dir=cache, local_files_only=local_only,
                                        tqdm_class=_bar()))
    missing = missing_files(folder)
    if missing:
        where = f"the hub cache's snapshot of {name} ({folder})"
        if local_only:
            raise InputError(f"{where} has no {missing} and HF_HUB_OFFLINE is set: "
                             f"{_how(local_only)}")
        raise WeightsError(f"the hub model {name} has no {missing}: tinygpt reads config.json, "
                           "tokenizer.json and safetensors weights")
    return folder


# ORG/NAME[@REVISION]/PATH, as HUB_FILE (HfFileSystem's path form): a folder inside a hub
# repository (a dictionary's: Gemma Scope 2's resid_post/layer_12_width_16k_l0_small, or a
# site's transcoders, transcoder_all/layer_*_...)
IN_REPO = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95})"
                     r"(?:@(?P<revision>\w[\w.-]{0,199}))?"
                     r"/(?P<path>[\w.*-]+(?:/[\w.*-]+)*)")


def in_repo(name: str) -> tuple[str, str, str | None] | None:
    """(ORG/NAME, PATH inside it, REVISION or None) when `name` has that form, else None."""
    m = IN_REPO.fullmatch(name)
    if m is None or ".." in name or "--" in m["repo"] or m["repo"].endswith((".", "-")) \
            or any(part.startswith(".") for part in m["path"].split("/")):
        return None
    return m["repo"], m["path"], m["revision"]


def dictionary(name: str | Path, option: str) -> Path:
    """A dictionary folder named by `option` (--sae, --transcoders): the local path when it
    is one (or its last part a pattern over local folders); else, when it has the form
    ORG/NAME[@REVISION]/PATH, PATH inside the hub cache's snapshot of that repository, only
    its files fetched (PATH's last part may be a pattern: layer_*_width_16k_l0_small picks one
    folder a block). Anything else is returned as it is, for the loader to refuse."""
    path = Path(name)
    if path.exists() or path.parent.is_dir() or (path.parent.exists() and "*" in path.name):
        return path
    found = in_repo(str(name))
    if found is None:
        return path
    repo, inside, revision = found
    try:
        import huggingface_hub  # noqa: F401 - the extra's presence
    except ImportError:
        raise InputError(f"{option} {name} does not exist; to fetch it from the Hugging Face "
                         f"hub, install the hub extra: {INSTALL}") from None
    folder = _fetched(str(name), repo, revision, (f"{inside}/*",), str(cache_dir()),
                      offline()) / inside
    if not (folder.parent.is_dir() if "*" in folder.name else folder.is_dir()):
        how = " and HF_HUB_OFFLINE is set" if offline() else ""
        raise InputError(f"{option} {name}: the hub repository {repo} has no folder {inside} "
                         f"in the hub cache's snapshot{how}")
    return folder


@functools.lru_cache(maxsize=8)
def _fetched(name: str, repo: str, revision: str | None, patterns: tuple, cache: str,
             local_only: bool) -> Path:
    """The snapshot of `repo` holding the files `patterns` match (snapshot_download's
    allow_patterns), refused as `_snapshot` refuses."""
    from huggingface_hub import snapshot_download

    with _refused_in_one_line(name=name, repo=repo, revision=revision, cache=cache,
                              local_only=local_only, kind="repository", here="a folder",
                              missing=f"{name} does not exist here",
                              not_id="it is not a hub repository's folder"):
        return Path(snapshot_download(repo, revision=revision, allow_patterns=list(patterns),
                                      cache_dir=cache, local_files_only=local_only,
                                      tqdm_class=_bar()))


def file(name: str, repo: str, revision: str | None, path: str) -> Path:
    """The hub cache's copy of one file of `repo` at `revision` (default: main), fetched when
    it is not cached and the hub may be reached: its path in the snapshot folder."""
    try:
        import huggingface_hub  # noqa: F401 - the extra's presence
    except ImportError:
        raise InputError(f"{name} is not a file here; to fetch {path} of {repo} from the "
                         f"Hugging Face hub, install the hub extra: {INSTALL}") from None
    return _file(name, repo, revision, path, str(cache_dir()), offline())


@functools.lru_cache(maxsize=8)
def _file(name: str, repo: str, revision: str | None, path: str, cache: str,
          local_only: bool) -> Path:
    from huggingface_hub import hf_hub_download

    with _refused_in_one_line(name=name, repo=repo, revision=revision, cache=cache,
                              local_only=local_only, kind="model", here="a file",
                              missing=f"{name} is not a file here",
                              not_id="not a hub model's file", path=path):
        return Path(hf_hub_download(repo, path, revision=revision, cache_dir=cache,
                                    local_files_only=local_only, tqdm_class=_bar()))



def _how(local_only: bool) -> str:
    """What to do when the hub was not reached, with or without HF_HUB_OFFLINE."""
    return ("fetch it once with the hub reachable (HF_HUB_OFFLINE unset)" if local_only else
            "check the network, or set HF_HUB_OFFLINE=1 to use the cache only")

@contextlib.contextmanager
def _refused_in_one_line(**how):
    """A fetch from the hub whose failure ends in its one line (_refusal, told `how` the
    fetch names what it looks for); what is no fetch's failure is raised on as it is."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - mapped to one line, or raised on as it is
        refused = _refusal(e, **how)
        if refused is None:
            raise
        raise refused from None


def _refusal(e: Exception, *, name: str, repo: str, revision: str | None, cache: str,
             local_only: bool, kind: str, missing: str, not_id: str, here: str,
             path: str | None = None) -> Exception:
    """The one line a failed fetch from the hub ends in, for every kind of fetch (a model's
    snapshot, a dictionary's folder, one file): `kind` names the repository (model,
    repository), `missing` says what the name is not here, `not_id` that it names nothing on
    the hub, `here` what was looked for locally (a folder, a file). None for what is no
    fetch's failure (the caller raises it on)."""
    from huggingface_hub import utils as hub_utils

    if isinstance(e, hub_utils.LocalEntryNotFoundError | hub_utils.OfflineModeIsEnabled):
        why = " (HF_HUB_OFFLINE is set)" if local_only else ""
        return InputError(f"{name} is not {here} here nor in the hub cache ({cache}), and "
                          f"the hub was not reached{why}: {_how(local_only)}")
    if isinstance(e, hub_utils.RevisionNotFoundError):
        return InputError(f"the hub {kind} {repo} has no revision {revision!r} (a branch, a "
                          "tag or a commit)")
    if isinstance(e, hub_utils.GatedRepoError):
        return InputError(f"the hub {kind} {repo} is gated: accept its terms on the hub, then "
                          "log in (hf auth login) or set HF_TOKEN")
    if isinstance(e, hub_utils.RepositoryNotFoundError):
        return InputError(f"{missing}, and the Hugging Face hub has no {kind} {repo} (a "
                          "private one needs a token: hf auth login, or HF_TOKEN)")
    if path is not None and isinstance(e, hub_utils.EntryNotFoundError):
        return InputError(f"the hub {kind} {repo} has no file {path}"
                          + (f" at {revision}" if revision else ""))
    if isinstance(e, hub_utils.HfHubHTTPError):
        return WeightsError(f"cannot fetch {name} from the hub: {str(e).splitlines()[0]}")
    if isinstance(e, ValueError):  # the library's own check of the id (HFValidationError)
        return InputError(f"{missing}, and {not_id} ({str(e).splitlines()[0]})")
    if isinstance(e, OSError):
        return WeightsError(f"cannot fetch {name} into the hub cache {cache}: "
                            f"{e.strerror or e}")
    return None


def missing_files(folder: Path) -> str | None:
    """The first file tinygpt reads that the snapshot lacks (a shard the index names too)."""
    for file in ("config.json", "tokenizer.json"):
        if not (folder / file).is_file():
            return file
    if (folder / "model.safetensors").is_file():
        return None
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        return "model.safetensors"

    for shard in sorted(shards_of(index)):
        if not (folder / shard).is_file():
            return shard
    return None


def _bar():
    """huggingface_hub's progress bar on stderr, where stderr is a terminal (a pipe gets no
    carriage-return lines), with the file names it shows escaped."""

    from huggingface_hub.utils import tqdm as hub_tqdm


    class Bar(hub_tqdm):
        def __init__(self, *args, **kwargs):
            if kwargs.get("desc"):
                kwargs["desc"] = escape_line(str(kwargs["desc"]))
            kwargs["disable"] = kwargs.get("disable") or not sys.stderr.isatty()
            super().__init__(*args, **kwargs)

    return Bar
