"""SAELens' dictionaries: a folder holding cfg.json and sae_weights.safetensors, read into an
SAE (analysis/dictionary.py) and written from one (`sae export --format saelens`).

The weights: W_enc [d_in, d_sae], b_enc [d_sae], W_dec [d_sae, d_in], b_dec [d_in], and for a
JumpReLU SAE threshold [d_sae]. cfg.json: d_in, d_sae, dtype, architecture (standard, topk,
jumprelu), k (topk), apply_b_dec_to_input, normalize_activations, rescale_acts_by_decoder_norm
(topk), reshape_activations, and the hook it reads: hook_name, in `metadata` since SAELens 6,
at the top level (with hook_layer) before; a config older than 6.0 says
activation_fn "topk" with activation_fn_kwargs.k instead of architecture "topk". The hook
name is TransformerLens', mapped to tinygpt's path through the schema's aliases
(blocks.1.hook_resid_post is layers.1.resid_post). What tinygpt cannot compute the way
SAELens does (a head's hook_z, a scaling factor kept outside the weights, another
architecture) is refused by name. A folder written by tinygpt names the weights it was made
for (metadata.weights_sha256, madefor.py) and is checked against them; a published one
names a hub model (metadata.model_name) that tinygpt cannot check, so only its sizes are.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ...analysis.dictionary import SAE, check_site
from ...errors import InputError, WeightsError
from ...storage.files import read_json_object, write_atomically
from ...storage.madefor import check_made_for
from ...storage.safetensors import header_bytes, map_safetensors, read_header, safetensors_bytes
from ...transformer.config import Config
from ...transformer.schema import lens_name

CFG, WEIGHTS = "cfg.json", "sae_weights.safetensors"
ARCHITECTURES = ("standard", "topk", "jumprelu")
NORMALIZATIONS = ("none", "constant_norm_rescale", "layer_norm")
DTYPES = ("float32", "float16", "bfloat16", "float64")
MAX_CFG_BYTES = 1 << 20
VERSION = "6.0.0"  # the cfg.json layout written: hook_name inside metadata


def read_cfg(folder: Path) -> dict:
    path = folder / CFG
    if not path.is_file():
        raise InputError(f"{folder} is not a SAELens SAE folder: it has no {CFG} (a SAELens "
                         f"folder holds {CFG} and {WEIGHTS})")
    try:
        return read_json_object(path, MAX_CFG_BYTES)
    except ValueError as e:
        raise WeightsError(f"{path} is not a readable SAELens config ({e})") from None


def _setting(cfg: dict, name: str, default=None):
    """A setting at the top level, else in metadata (hook_name moved there in SAELens 6).
    Both, with different values, is a config that contradicts itself: ValueError."""
    meta = cfg.get("metadata") if isinstance(cfg.get("metadata"), dict) else {}
    if name in cfg and name in meta and cfg[name] != meta[name]:
        raise ValueError(f"{name} is {cfg[name]!r} at the top level but {meta[name]!r} in "
                         "metadata: which value the SAE reads is not clear")
    return cfg[name] if name in cfg else meta.get(name, default)


def settings(folder: Path, cfg: dict, config: Config) -> dict:
    """The cfg.json's settings, checked and in tinygpt's terms: site, architecture, k,
    b_dec_in, normalize, rescale, d_sae, dtype."""
    path = folder / CFG

    def broken(why: str) -> WeightsError:
        return WeightsError(f"{path}: {why}")

    for name in ("hook_name", "hook_point", "hook_layer", "hook_head_index", "activation_fn",
                 "activation_fn_str"):
        try:
            _setting(cfg, name)
        except ValueError as e:
            raise broken(str(e)) from None

    def refuse(why: str) -> InputError:
        return InputError(f"{path}: {why}; tinygpt reads SAELens' standard, topk and jumprelu "
                          f"SAEs of a residual stream or an MLP output")

    for name in ("d_in", "d_sae"):
        if name not in cfg:
            raise broken(f"it has no {name}")
        if not isinstance(cfg.get(name), int) or isinstance(cfg.get(name), bool) or \
                cfg[name] < 1:
            raise broken(f"{name} is {cfg.get(name)!r}, not a positive whole number")
    if cfg["d_in"] != config.n_embd:
        raise InputError(f"{path}: the SAE reads {cfg['d_in']} numbers (d_in) and this model's "
                         f"values have {config.n_embd}: it was made for another model")
    arch = cfg.get("architecture")
    if arch is None:  # before SAELens 6: the activation function said it
        fn = _setting(cfg, "activation_fn", _setting(cfg, "activation_fn_str", "relu"))
        arch = {"relu": "standard", "topk": "topk"}.get(fn)
        if arch is None:
            raise refuse(f"activation_fn {fn!r} is not relu or topk")
    if arch not in ARCHITECTURES:
        raise refuse(f"architecture {arch!r} is not one tinygpt computes")
    k = None
    if arch == "topk":
        kwargs = cfg.get("activation_fn_kwargs") if isinstance(
            cfg.get("activation_fn_kwargs"), dict) else {}
        k = cfg.get("k", kwargs.get("k"))
        if k is None:
            raise broken("a topk SAE, it has no k (nor activation_fn_kwargs.k)")
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= cfg["d_sae"]:
            raise broken(f"k is {k!r}, not a whole number from 1 to d_sae ({cfg['d_sae']})")
    hook = _setting(cfg, "hook_name", _setting(cfg, "hook_point"))
    if not isinstance(hook, str):
        raise broken("it names no hook_name (the value the SAE reads)")
    if cfg.get("reshape_activations", "none") != "none" or hook.endswith("hook_z"):
        raise refuse(f"it reads {hook} reshaped per head (reshape_activations "
                     f"{cfg.get('reshape_activations', 'none')!r})")
    if _setting(cfg, "hook_head_index") is not None:
        raise refuse(f"it reads one head (hook_head_index {_setting(cfg, 'hook_head_index')})")
    try:
        site = check_site(hook, config, heads=config.post_norms)  # Gemma's hook_mlp_out
    except InputError as e:
        raise refuse(f"hook_name {hook!r}: {e}") from None
    layer = _setting(cfg, "hook_layer")
    if layer is not None and layer != int(site.split(".")[1]):
        raise broken(f"hook_layer {layer!r} disagrees with hook_name {hook!r}")
    norm = cfg.get("normalize_activations", "none")
    norm = {None: "none", False: "none", True: "expected_average_only_in"}.get(norm, norm) \
        if not isinstance(norm, str) else norm
    if norm not in NORMALIZATIONS:
        raise refuse(f"normalize_activations {norm!r} needs a scaling factor the folder does "
                     "not hold (fold it into the weights first: SAELens' "
                     "fold_activation_norm_scaling_factor); tinygpt honours none, "
                     "constant_norm_rescale and layer_norm")
    if cfg.get("finetuning_scaling_factor"):
        raise refuse("finetuning_scaling_factor is set (an older SAELens' rescaled decoder)")
    dtype = str(cfg.get("dtype", "float32")).removeprefix("torch.")
    if dtype not in DTYPES:
        raise broken(f"dtype {cfg.get('dtype')!r} is not one of {', '.join(DTYPES)}")
    b_dec_in = cfg.get("apply_b_dec_to_input", True)
    rescale = cfg.get("rescale_acts_by_decoder_norm", False) if arch == "topk" else False
    for name, value in (("apply_b_dec_to_input", b_dec_in),
                        ("rescale_acts_by_decoder_norm", rescale)):
        if not isinstance(value, bool):
            raise broken(f"{name} is {value!r}, not true or false")
    return {"site": site, "architecture": arch, "k": k, "b_dec_in": b_dec_in,
            "normalize": norm, "rescale": rescale, "d_sae": cfg["d_sae"], "dtype": dtype}


def read_tensors(path: Path, d: int, m: int, arch: str) -> dict[str, np.ndarray]:
    """The weights, checked: the tensors SAELens writes for `arch`, of the sizes cfg.json
    says, real floating-point numbers, all finite; float32 for the math."""

    if not path.is_file():
        raise WeightsError(f"{path.parent} has {CFG} but no {WEIGHTS}")
    infos = read_header(path, header_bytes(8))
    tensors = map_safetensors(path)
    if tensors is None:
        raise WeightsError(f"{path} is not a readable safetensors file")
    want = {"W_enc": (d, m), "b_enc": (m,), "W_dec": (m, d), "b_dec": (d,)}
    if arch == "jumprelu":
        want["threshold"] = (m,)
    if "scaling_factor" in tensors and not np.all(np.asarray(tensors["scaling_factor"]) == 1):
        raise InputError(f"{path}: it holds a scaling_factor that is not all ones (an older "
                         "SAELens' finetuning scale), which tinygpt does not apply")
    out = {}
    for name, shape in want.items():
        if name not in tensors:
            raise WeightsError(f"{path} is not a {arch} SAE's weights: it has no {name} tensor")
        if infos[name].dtype not in ("F32", "F16", "BF16", "F64"):
            raise WeightsError(f"{path}: {name} is {infos[name].dtype}, not floating-point "
                               "numbers")
        if tuple(infos[name].shape) != shape:
            raise WeightsError(f"{path}: {name} has shape {list(infos[name].shape)}, expected "
                               f"{list(shape)} (d_in {d}, d_sae {m} in {CFG})")
        t = np.asarray(tensors[name], dtype=np.float32)
        if not np.isfinite(t).all():
            raise WeightsError(f"{path}: {name} is not all finite numbers")
        out[name] = t
    return out


def load_saelens(folder: Path, config: Config, weights_file: Path) -> SAE:
    """A SAELens folder as an SAE for this model: its config and weights checked, and the
    weights it was made for, when it names them."""

    folder = Path(folder)
    cfg = read_cfg(folder)
    s = settings(folder, cfg, config)
    meta = cfg.get("metadata") if isinstance(cfg.get("metadata"), dict) else {}
    check_made_for(folder / CFG, meta, weights_file, "the SAE", "export one made for them "
                   "with `tinygpt sae export --format saelens`", required=False)
    t = read_tensors(folder / WEIGHTS, config.n_embd, s["d_sae"], s["architecture"])
    if s["rescale"]:
        check_decoder_norms(folder / WEIGHTS, t["W_dec"])
    return SAE(t["W_enc"], t["b_enc"], t["W_dec"], t["b_dec"], s["site"], s["k"],
               str(folder), s["architecture"], t.get("threshold"), s["b_dec_in"],
               s["normalize"], s["rescale"])


def check_decoder_norms(path: Path, w_dec: np.ndarray) -> None:
    """rescale_acts_by_decoder_norm divides each latent by its decoder row's norm on the way
    out: a row of norm 0 (a dead latent zeroed) makes every reconstruction 0/0, NaN, in
    SAELens as here; WeightsError naming the rows."""
    zero = np.flatnonzero(np.linalg.norm(w_dec, axis=1) == 0)  # the norms sae.decode divides by
    if len(zero):
        shown = ", ".join(map(str, zero[:5])) + (", ..." if len(zero) > 5 else "")
        raise WeightsError(f"{path}: W_dec has {len(zero)} row{'s' if len(zero) > 1 else ''} "
                           f"of norm 0 (latent{'s' if len(zero) > 1 else ''} {shown}), and "
                           "rescale_acts_by_decoder_norm divides by that norm: every "
                           "reconstruction would be NaN (0/0), in SAELens as well")


# ------------------------------------------------------------------ writing


def hook_name(site: str, config: Config) -> str:
    """The TransformerLens name of a site on this model, from the schema (layers.1.resid_post
    -> blocks.1.hook_resid_post); InputError for a site TransformerLens hooks under no name
    (Gemma's mlp_out before its norm: SAELens' hook_mlp_out there is ln2_post.out)."""

    lens = lens_name(site, config)
    if lens is None:
        raise InputError(f"{site} has no TransformerLens hook on this model (its "
                         f"hook_mlp_out is {site.rsplit('.', 1)[0]}.ln2_post.out, the MLP's "
                         "output after its norm): SAELens would read the SAE at another value")
    return lens


def saelens_files(sae: SAE, config: Config, made_for: dict[str, str],
                  model_name: str) -> dict[str, bytes]:
    """cfg.json and sae_weights.safetensors of `sae`, as SAELens 6 writes a TopK SAE
    (hook_name also at the top level with hook_layer, for the readers before 6)."""

    if sae.architecture != "topk" or sae.normalize != "none" or not sae.b_dec_in:
        raise InputError(f"{sae.path} is already a SAELens dictionary ({sae.architecture}); "
                         "export writes tinygpt's own TopK SAEs")
    hook, layer = hook_name(sae.site, config), int(sae.site.split(".")[1])
    cfg = {"architecture": "topk", "d_in": config.n_embd, "d_sae": sae.n_latents,
           "dtype": "float32", "device": "cpu", "apply_b_dec_to_input": True,
           "normalize_activations": "none", "reshape_activations": "none", "k": sae.k,
           "rescale_acts_by_decoder_norm": sae.rescale, "hook_name": hook, "hook_layer": layer,
           "metadata": {"sae_lens_version": VERSION, "model_name": model_name,
                        "hook_name": hook, "hook_head_index": None, "prepend_bos": False,
                        "context_size": config.n_positions, **made_for}}
    tensors = {n: np.ascontiguousarray(getattr(sae, n), dtype="<f4")
               for n in ("W_enc", "b_enc", "W_dec", "b_dec")}
    return {CFG: (json.dumps(cfg, indent=2) + "\n").encode("utf-8"),
            WEIGHTS: safetensors_bytes(tensors, {"format": "pt"})}


def export_saelens(sae: SAE, out: Path, config: Config, made_for: dict[str, str],
                   model_name: str) -> list[Path]:
    """Write the folder `out` (made if missing): the weights first, then cfg.json, each
    atomically, so a folder with a cfg.json has its weights."""

    files = saelens_files(sae, config, made_for, model_name)
    written = []
    for name in (WEIGHTS, CFG):
        write_atomically(out / name, files[name])
        written.append(out / name)
    return written
