"""tinygpt's own SAE files, and the SAE of a site whatever its format: a safetensors file
(W_enc, b_enc, W_dec, b_dec, metadata site and k, made for the weights: madefor.py's rule),
a SAELens folder (saelens.py) or a Gemma Scope 2 one (gemmascope.py), fetched from the hub
when named ORG/NAME/PATH. Read into analysis.dictionary.SAE, checked before any analysis sees
it; `finder` hands an analysis the SAE of each site it asks for (state in an argument)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from ...analysis.dictionary import SAE, check_site
from ...errors import InputError, WeightsError
from ...storage.files import write_atomically
from ...storage.hub import dictionary
from ...storage.madefor import check_made_for, remake_hint
from ...storage.safetensors import metadata_strings, read_safetensors, safetensors_bytes
from ...transformer.config import Config
from .gemmascope import load_gemma_scope
from .saelens import load_saelens

# the site of the weights folder's own SAE, sae/SITE.safetensors (sae feature, eval, export)
SHIPPED_SITE = "layers.1.resid_post"


def sae_tensors(sae: SAE) -> dict[str, np.ndarray]:
    fixed = {} if sae.b_in is None else {"b_in": sae.b_in}
    return {n: np.ascontiguousarray(p, dtype=np.float32)
            for n, p in {**sae.params(), **fixed}.items()}


def save_sae(path: str | Path, sae: SAE, meta: dict[str, str] | None = None) -> None:

    info = {"site": sae.site, "k": str(sae.k), **metadata_strings(meta or {})}
    write_atomically(Path(path), safetensors_bytes(sae_tensors(sae), info))


def load_sae(path: str | Path, config: Config, weights_file: Path, *,
             default_site: str | None = None) -> SAE:
    """An SAE file, checked: the four tensors with agreeing shapes, finite, a known site (the
    one its file name says, when the name is a site), k, made for `weights_file`. A folder
    is a SAELens dictionary (saelens.py). `default_site`: the path is the weights folder's
    SAE of that site (sae_file), not one the user named with --sae."""

    path = Path(path) if default_site is not None else dictionary(path, "--sae")
    if path.is_dir() and (path / "params.safetensors").is_file():
        return _gemma_scope_sae(path, config)
    if path.is_dir():

        return load_saelens(path, config, weights_file)
    if not path.is_file() and default_site is None:
        raise InputError(f"--sae {path} " + ("is not a file" if path.exists() else
                                             "does not exist") +
                         ": give an SAE file (tinygpt sae train --out FILE) or a SAELens folder")
    if not path.is_file():
        raise InputError(f"no SAE file at {path}: " + train_hint(weights_file, default_site))
    if path.name in ("cfg.json", "sae_weights.safetensors") and (path.parent / "cfg.json"
                                                                 ).is_file():
        raise InputError(f"{path} is a file of a SAELens folder: give the folder, "
                         f"--sae {path.parent}")
    t, meta = read_safetensors(path)
    sae = check_sae(path, t, meta, config)
    check_made_for(path, meta, weights_file, "the SAE",
                   train_hint(weights_file, sae.site, "train one for them"))
    return sae


def _gemma_scope_sae(path: Path, config: Config) -> SAE:
    """A Gemma Scope 2 SAE folder (gemmascope.py); a transcoder is refused here (it reads
    another value than the one it writes: --transcoders takes it)."""

    sae, kind = load_gemma_scope(path, config)
    if kind == "transcoder":
        raise InputError(f"{path} is a transcoder (it reads {sae.site.rsplit('.', 1)[0]}"
                         f".ln2.out and predicts {sae.site}): give its folder to "
                         "--transcoders, not --sae")
    return sae


def train_hint(weights_file: Path, site: str, verb: str = "train one") -> str:
    """The command that trains the SAE of `site` for these weights, never into the installed
    package (madefor.remake_hint)."""

    return remake_hint(verb, f"sae train --site {site}", weights_file,
                       sae_file(weights_file, None, site), "--out", f"{site}.safetensors",
                       "--sae")


def check_tensors(path: Path, t: dict[str, np.ndarray], config: Config, what: str = "an SAE",
                  names: tuple[str, ...] = ("W_enc", "b_enc", "W_dec", "b_dec")) -> int:
    """The dictionary's tensors present, finite floats, of agreeing shapes: its latents m."""
    d = config.n_embd
    for name in names:
        if name not in t:
            raise WeightsError(f"{path} is not {what} file: it has no {name} tensor")
        if not np.issubdtype(t[name].dtype, np.floating) or not np.isfinite(t[name]).all():
            raise WeightsError(f"{path}: {name} is not all finite floating-point numbers")
    m = t["b_enc"].shape[0] if t["b_enc"].ndim == 1 else -1
    want = {"W_enc": (d, m), "b_enc": (m,), "W_dec": (m, d), "b_dec": (d,), "b_in": (d,)}
    for name in names:
        if t[name].shape != want[name] or m < 1:
            raise WeightsError(f"{path}: {name} has shape {list(t[name].shape)}, expected "
                               f"{list(want[name])} for {m} latents of a {d}-number value")
    if not np.allclose(np.linalg.norm(t["W_dec"], axis=1), 1, atol=1e-3):
        raise WeightsError(f"{path}: the rows of W_dec are not unit vectors")
    return m


def check_sae(path: Path, t: dict[str, np.ndarray], meta: dict, config: Config) -> SAE:
    m = check_tensors(path, t, config)
    try:
        k = int(meta.get("k", ""))
        site = check_site(meta.get("site", ""), config)
    except (ValueError, InputError):
        raise WeightsError(f"{path}: its metadata must name the site (layers.N.resid_post, ...) "
                           f"and k (1..{m}); it has site={meta.get('site')!r} "
                           f"k={meta.get('k')!r}") from None
    if not 1 <= k <= m:
        raise WeightsError(f"{path}: k = {k} is not between 1 and the {m} latents")
    named = _site_of_name(path, config)
    if named is not None and named != site:
        raise WeightsError(f"{path}: its metadata says it reads {site}, its file name says "
                           f"{named}")
    f32 = {n: np.asarray(a, dtype=np.float32) for n, a in t.items()}
    return SAE(f32["W_enc"], f32["b_enc"], f32["W_dec"], f32["b_dec"], site, k, str(path))


def _site_of_name(path: Path, config: Config) -> str | None:
    """The site a file name like layers.1.resid_post.safetensors names, or None."""
    try:
        return check_site(path.name.removesuffix(".safetensors"), config)
    except InputError:
        return None


def model_sae(model, given: Path | None = None) -> SAE:
    """The SAE at --sae FILE, or the weights folder's shipped one, checked for this model."""
    return load_sae(sae_file(model.weights_file, given), model.config, model.weights_file,
                    default_site=SHIPPED_SITE if given is None else None)


def sae_file(weights_file: Path, sae: Path | None, site: str = SHIPPED_SITE) -> Path:
    """--sae (a hub repository's folder, ORG/NAME/PATH, fetched: hub.dictionary), or the
    weights folder's sae/SITE.safetensors."""

    if sae is not None:
        return dictionary(sae, "--sae")
    return Path(weights_file).parent / "sae" / f"{site}.safetensors"


def site_sae(weights_file: Path, config: Config, site: str, given: tuple[Path, ...] = ()) -> SAE:
    """The SAE of a site: the first of the --sae SAEs given (files or SAELens folders) that
    reads it, else the weights folder's sae/SITE.safetensors."""
    for path in given:
        sae = load_sae(path, config, weights_file)
        if sae.site == site:
            return sae
    return load_sae(sae_file(weights_file, None, site), config, weights_file, default_site=site)


def finder(model, given: tuple[Path, ...] = ()) -> Callable[[str], SAE]:
    """site -> its SAE (site_sae), each read when an analysis asks for it: what analyses
    take as `saes` (a latent sae.SITE.N in --ablate, trace, why --value)."""
    return partial(site_sae, model.weights_file, model.config, given=tuple(given))
