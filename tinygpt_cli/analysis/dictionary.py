"""The dictionary every SAE format reads into (tinygpt's own files, SAELens' folders, Gemma
Scope 2's): the SAE type and its maths (encode, decode, reconstruct), a cross-layer
transcoder's, and the sites an SAE may read. sae.py trains and evaluates one; the files are
read into it by jobs/dictionaries/ (saes.py, saelens.py, gemmascope.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InputError, WeightsError
from ..transformer.config import Config
from ..transformer.model import all_finite
from ..transformer.schema import PathError, resolve

SITE_KINDS = ("resid_pre", "resid_mid", "resid_post", "mlp_out")


def check_site(path: str, config: Config, heads: bool = False) -> str:
    """The canonical path of an SAE site: layers.N.resid_pre|resid_mid|resid_post|mlp_out;
    `heads`: also layers.N.z, the heads' outputs side by side (an attention-output SAE read,
    Gemma Scope 2's; tinygpt trains none), and Gemma's ln2_post.out (the MLP's output after
    its norm, Gemma Scope 2's mlp_out)."""
    try:
        name, rows = resolve(path, config)
    except PathError as e:
        if "is not a value of this model" in e.message and path.split(".")[-1] in SITE_KINDS:
            raise InputError(e.message) from None  # a site this family has not (resid_mid
        name, rows = None, None  # of a parallel block, GPT-NeoX's), with why
    parts = (name or "").split(".")
    kinds = [k for k in SITE_KINDS if k != "resid_mid" or not config.parallel]
    if heads:
        kinds = [*kinds[:-1], "ln2_post.out", "z", kinds[-1]] if config.post_norms \
            else [*kinds[:-1], "z", kinds[-1]]
    if heads and len(parts) == 4 and parts[2:] == ["ln2_post", "out"] and config.post_norms:
        parts = [parts[0], parts[1], "ln2_post.out"]
    if not heads and not rows and parts[2:] == ["ln2_post", "out"]:  # Gemma's hook_mlp_out
        said = path if path == name else f"{path} ({name})"
        raise InputError(f"{said} is the MLP's output after Gemma's norm (TransformerLens's "
                         f"hook_mlp_out): an SAE tinygpt trains reads layers.{parts[1]}.mlp_out, "
                         "before that norm, or the residual stream")
    if rows or len(parts) != 3 or parts[0] != "layers" or parts[2] not in kinds:
        raise InputError(f"an SAE reads layers.N.{', '.join(kinds[:-1])} or {kinds[-1]} "
                         f"(N = 0..{config.n_layer - 1}), not {path!r}")
    return name


# ------------------------------------------------------------------ the autoencoder


@dataclass
class SAE:
    """tinygpt's own SAEs are TopK ones with the defaults below; a SAELens dictionary
    (jobs/dictionaries/saelens.py) may be any of SAELens' three inference architectures,
    with its settings:

        topk       z = TopK_k(ReLU(a)), a * ||W_dec[j]|| first when `rescale`
        standard   z = ReLU(a)
        jumprelu   z = ReLU(a) where a > threshold, else 0
    where a = (x' - b_dec) W_enc + b_enc (x' without "- b_dec" when not `b_dec_in`), x' the
    value x normalised per token as `normalize` says (none; constant_norm_rescale:
    x sqrt(d) / ||x||; layer_norm: (x - mean) / (std + 1e-5)), undone on the reconstruction.
    """

    W_enc: np.ndarray  # noqa: N815 [d, m]
    b_enc: np.ndarray  # [m]
    W_dec: np.ndarray  # noqa: N815 [m, d], rows unit norm (tinygpt's own)
    b_dec: np.ndarray  # [d]
    site: str
    k: int | None  # TopK's k; None for the other architectures
    path: str = "the SAE"  # the file it was read from, for errors
    architecture: str = "topk"
    threshold: np.ndarray | None = None  # jumprelu's [m]
    b_dec_in: bool = True  # SAELens' apply_b_dec_to_input
    normalize: str = "none"  # SAELens' normalize_activations
    rescale: bool = False  # SAELens' rescale_acts_by_decoder_norm (topk)
    b_in: np.ndarray | None = None  # [d] a transcoder's fixed input centre; None: b_dec
    skip: np.ndarray | None = None  # [d, d] a transcoder's affine skip: + x skip (Gemma Scope 2)

    @property
    def n_latents(self) -> int:
        return self.W_enc.shape[1]

    def params(self) -> dict[str, np.ndarray]:
        return {"W_enc": self.W_enc, "b_enc": self.b_enc, "W_dec": self.W_dec, "b_dec": self.b_dec}


def pre_activations(sae: SAE, x: np.ndarray) -> np.ndarray:
    """(x - b_dec) W_enc + b_enc (a transcoder's: x - b_in), of x normalised as the SAE
    says.  [..., d] -> [..., m]"""
    if sae.normalize != "none":
        x = _normalised(sae, x)
    return (x - centre(sae) if sae.b_dec_in else x) @ sae.W_enc + sae.b_enc


def centre(sae: SAE) -> np.ndarray:
    """What the encoder subtracts from its input: b_dec, or a transcoder's b_in."""
    return sae.b_dec if sae.b_in is None else sae.b_in


def _normalised(sae: SAE, x: np.ndarray) -> np.ndarray:
    """SAELens' run-time normalisation of the input, per token. A value of all zeros has no
    norm to scale to sqrt(d) (SAELens computes 0 * inf, NaN): InputError naming it."""
    if sae.normalize == "constant_norm_rescale":
        norms = np.linalg.norm(x, axis=-1, keepdims=True)
        if not norms.all():
            where = np.argwhere(norms[..., 0] == 0)[0]
            at = f" at token {where[-1]}" if len(where) else ""
            raise InputError(f"{sae.path}: the SAE scales each value to norm sqrt(d_in) "
                             f"(normalize_activations constant_norm_rescale), and {sae.site}"
                             f"{at} is all zeros, which has no norm to scale")
        return x * (np.sqrt(x.shape[-1]) / norms)
    centred = x - x.mean(axis=-1, keepdims=True)  # layer_norm: torch's std is unbiased
    return centred / (centred.std(axis=-1, ddof=1, keepdims=True) + 1e-5)


def _scale_out(sae: SAE, x: np.ndarray) -> tuple[np.ndarray | float, np.ndarray | float]:
    """(s, c) such that the reconstruction in x's units is y s + c (the normalisation of x,
    undone as SAELens undoes it)."""
    if sae.normalize == "constant_norm_rescale":
        return np.linalg.norm(x, axis=-1, keepdims=True) / np.sqrt(x.shape[-1]), 0.0
    if sae.normalize == "layer_norm":
        mean = x.mean(axis=-1, keepdims=True)
        return (x - mean).std(axis=-1, ddof=1, keepdims=True), mean
    return 1.0, 0.0


def decoder_norms(sae: SAE) -> np.ndarray:
    return np.linalg.norm(sae.W_dec, axis=1)  # [m]


def activate(sae: SAE, a: np.ndarray) -> np.ndarray:
    """The latents of pre-activations a [..., m], by the SAE's architecture."""
    if sae.architecture == "topk":
        return top_k_relu(a * decoder_norms(sae) if sae.rescale else a, sae.k)
    z = np.maximum(a, 0)
    return z * (a > sae.threshold) if sae.architecture == "jumprelu" else z


def top_k_relu(a: np.ndarray, k: int) -> np.ndarray:
    """ReLU, then keep the k largest of each row (ties: the lower index), zero the rest."""
    a = np.maximum(a, 0)
    if k >= a.shape[-1]:
        return a
    keep = np.argpartition(-a, k - 1, axis=-1)[..., :k]
    z = np.zeros_like(a)
    np.put_along_axis(z, keep, np.take_along_axis(a, keep, axis=-1), axis=-1)
    return z


def encode(sae: SAE, x: np.ndarray) -> np.ndarray:
    """The latents z [..., m] of values x [..., d]; they must stay finite (an encoder of
    3e38 made every latent inf): WeightsError naming the file otherwise."""
    with np.errstate(all="ignore"):
        z = activate(sae, pre_activations(sae, x))
    if not all_finite(z):
        raise WeightsError(f"{sae.path}: its latents overflow float32 on these values (W_enc "
                           "or b_enc too large to compute with)")
    return z


def decode(sae: SAE, z: np.ndarray, x: np.ndarray | None = None) -> np.ndarray:
    """z W_dec + b_dec, in the units of the values x that z encodes (needed only when the
    SAE normalises its input, or adds a skip connection x skip).  [..., m] -> [..., d]"""
    y = (z / decoder_norms(sae) if sae.rescale else z) @ sae.W_dec + sae.b_dec
    if sae.skip is not None:
        if x is None:
            raise ValueError("a skip connection's output needs the input x")
        y = y + x @ sae.skip
    if sae.normalize == "none":
        return y
    scale, shift = _scale_out(sae, x)
    return y * scale + shift


def reconstruct(sae: SAE, x: np.ndarray) -> np.ndarray:
    return decode(sae, encode(sae, x), x)


# ------------------------------------------------------------------ cross-layer transcoders
# Gemma Scope 2's clt/ (jobs/dictionaries/gemmascope.py reads it): block L's latents write into
# every block's MLP output from L on.


@dataclass
class CrossLayerTranscoder:
    encoders: list[SAE]  # per block: its latents' encoder (reads ln2.out; W_dec unused)
    w_dec: list[np.ndarray]  # per block L: [m, n - L, d], into the MLP outputs of L..n-1
    b_dec: np.ndarray  # [n, d] each block's output bias
    skip: list[np.ndarray] | None  # per block [d, d], or None
    site: str = "mlp_out"  # the value each block's output stands for (Gemma: ln2_post.out)

    @property
    def n_layers(self) -> int:
        return len(self.encoders)


def cross_layer_outputs(clt: CrossLayerTranscoder, xs: list[np.ndarray]) -> list[np.ndarray]:
    """Each block's MLP output as the cross-layer transcoder predicts it from every block's
    MLP input xs[L] [T, d]: y_j = sum over L <= j of z_L w_dec[L][:, j - L] + b_dec[j]
    (+ xs[j] skip[j])."""

    zs = [encode(tc, x) for tc, x in zip(clt.encoders, xs, strict=True)]
    out = []
    for j in range(clt.n_layers):
        y = clt.b_dec[j] + sum(zs[i] @ clt.w_dec[i][:, j - i] for i in range(j + 1))
        out.append(y + xs[j] @ clt.skip[j] if clt.skip is not None else y)
    return out
