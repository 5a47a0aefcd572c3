"""Gemma Scope 2's dictionaries, read from a local folder in the release's own layout.

The layout, as SAELens reads it (its gemma_3 loader; the folder names, hook names and raw
config fields below are those of SAELens' tests of get_gemma_3_config_from_hf and
_infer_gemma_3_raw_cfg_dict, and the math that of the release's own tutorial):

    SITE/layer_L_width_W_l0_S[_affine]/params.safetensors   the weights
    SITE/layer_L_width_W_l0_S[_affine]/config.json          architecture "jump_relu",
        model_name, hf_hook_point_in, and for a transcoder hf_hook_point_out and
        affine_connection; without it SAELens infers them from SITE and the folder name
    SITE: resid_post, resid_post_all (the block's output, model.layers.L.output),
        attn_out_all (the heads before o_proj: model.layers.L.self_attn.o_proj.input),
        mlp_out (model.layers.L.post_feedforward_layernorm.output), transcoder_all
        (pre_feedforward_layernorm.output -> post_feedforward_layernorm.output), clt

    tensors: w_enc [d_in, m], b_enc [m], threshold [m], w_dec [m, d_out], b_dec [d_out],
        and a transcoder's affine_skip_connection [d_in, d_out] where affine_connection
    z = ReLU(a) where a > threshold, else 0      a = x w_enc + b_enc (nothing subtracted)
    y = z w_dec + b_dec (+ x affine_skip_connection)
(the skip's orientation as circuit-tracer's load_gemma_scope_2_transcoder uses it too: its
W_skip is the transpose, applied as x W_skip^T)

The hook names are the module paths of the Hugging Face model the dictionary was trained
on. They are mapped to tinygpt's values for the families tinygpt reads (the block's output,
its norm before the MLP, its MLP, the attention's output projection, each under its
family's own module name); a name this model has no module for (Gemma's
pre/post_feedforward_layernorm on a Llama), a model_name of another family, a d_in of
another width, or a folder name that disagrees with the config is refused by name.
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase
from pathlib import Path

import numpy as np

from ...analysis.dictionary import SAE, CrossLayerTranscoder
from ...errors import InputError, WeightsError
from ...storage.files import read_json_object
from ...storage.safetensors import header_bytes, read_header, read_safetensors
from ...transformer.config import Config
from ...transformer.families import family

PARAMS, CONFIG = "params.safetensors", "config.json"
MAX_CONFIG_BYTES = 1 << 20
NAME = re.compile(r"layer_([0-9]+)_width_([0-9]+[km]?)_l0_([a-z0-9]+?)(_affine)?")
# the release's site folders (SAELens' tests name these) -> what each reads
SITES = {"resid_post": "resid_post", "resid_post_all": "resid_post",
         "attn_out_all": "attn_out", "mlp_out": "mlp_out", "transcoder_all": "transcoder",
         "clt": "clt"}
GEMMA_MODULES = {"pre_feedforward_layernorm": "Gemma 2 and 3's norm before the MLP",
                 "post_feedforward_layernorm": "Gemma 2 and 3's norm after the MLP"}
# a model_name's family, by the words Hugging Face ids use (None: not one to check)
FAMILIES = (("gemma", "gemma"), ("llama", "llama"), ("qwen3", "qwen3"), ("qwen2", "qwen2"),
            ("qwen", "qwen"), ("pythia", "gpt_neox"), ("gpt-neox", "gpt_neox"),
            ("gpt-neo-", "gpt_neo"), ("gpt2", "gpt2"))


def is_gemma_scope(folder: Path) -> bool:
    return (Path(folder) / PARAMS).is_file()


def raw_config(folder: Path) -> dict:
    """config.json, or, without one, what SAELens infers from the folder's names."""
    path = folder / CONFIG
    if not path.is_file():
        return inferred_config(folder)
    try:
        return read_json_object(path, MAX_CONFIG_BYTES)
    except ValueError as e:
        raise WeightsError(f"{path} is not a readable Gemma Scope config ({e})") from None


def inferred_config(folder: Path) -> dict:
    """SAELens' inference for a folder without config.json: the hooks of its SITE folder
    and its layer, under Gemma 3's module names."""
    m = NAME.fullmatch(folder.name)
    site = SITES.get(folder.parent.name)
    if m is None or site is None:
        raise InputError(f"{folder} has {PARAMS} but no {CONFIG}, and its names are not the "
                         "release's (SITE/layer_L_width_W_l0_S) to infer what it reads from")
    b = f"model.layers.{m[1]}"
    cfg = {"architecture": "jump_relu", "hf_hook_point_in": {
        "resid_post": f"{b}.output", "attn_out": f"{b}.self_attn.o_proj.input",
        "mlp_out": f"{b}.post_feedforward_layernorm.output"}.get(
        site, f"{b}.pre_feedforward_layernorm.output")}
    if site in ("transcoder", "clt"):
        cfg["hf_hook_point_out"] = f"{b}.post_feedforward_layernorm.output"
        cfg["affine_connection"] = m[4] is not None
    return cfg


def hook_value(hook, config: Config, where: str) -> tuple[str, int]:
    """(what, layer) of a Hugging Face module path: what is resid_post, ln2.out, mlp_out,
    ln2_post.out (Gemma's MLP output after its norm, what the block adds to the stream) or
    z (the heads' outputs before the projection); refused by name when this model has no
    such module."""
    if not isinstance(hook, str):
        raise WeightsError(f"{where}: the hook is {hook!r}, not a module name")
    blocks, ln2, proj = family(config.model_type).MODULES
    m = re.fullmatch(r"([a-z_.]+?)\.([0-9]+)\.(.+)", hook)
    if m is None or m[1] != blocks:
        raise InputError(f"{where}: {hook!r} is not a module of this {config.model_type} model "
                         f"(its blocks are {blocks}.L): the dictionary was made for another "
                         "model")
    layer, rest = int(m[2]), m[3]
    if not 0 <= layer < config.n_layer:
        raise InputError(f"{where}: {hook!r} is in block {layer}; this model has "
                         f"{config.n_layer}")
    module = rest.rsplit(".", 1)[0]
    gemma = config.model_type.startswith("gemma")
    if gemma and rest == "post_feedforward_layernorm.output":
        return "ln2_post.out", layer
    if module in GEMMA_MODULES and not gemma:
        raise InputError(f"{where}: {hook!r}: this {config.model_type} model has no "
                         f"{module} ({GEMMA_MODULES[module]}): the dictionary was made for "
                         "a Gemma model")
    known = {"output": "resid_post", f"{ln2}.output": "ln2.out", "mlp.output": "mlp_out",
             f"{proj}.input": "z"}
    if rest not in known:
        raise InputError(f"{where}: {hook!r} is not a value tinygpt maps (it reads "
                         f"{blocks}.L.output, .{ln2}.output, .mlp.output and "
                         f".{proj}.input)")
    return known[rest], layer


def check_model_name(name, config: Config, where: str) -> None:
    """A model_name of another family than this model's is refused; one of no family
    tinygpt knows is left unchecked (the sizes still are)."""
    if name is None:
        return
    if not isinstance(name, str):
        raise WeightsError(f"{where}: model_name is {name!r}, not a string")
    fam = next((f for word, f in FAMILIES if word in name.lower()), None)
    if fam is not None and not config.model_type.startswith(fam):
        raise InputError(f"{where}: it says it was trained on {name}, a {fam} model; this is "
                         f"a {config.model_type} model")


def read_params(path: Path, wants: dict[str, tuple]) -> dict[str, np.ndarray]:
    """The tensors named, each of its shape, real floating-point numbers, finite."""

    t, _ = read_safetensors(path, label=str(path))
    out = {}
    for name, shape in wants.items():
        if name not in t:
            raise WeightsError(f"{path} is not a Gemma Scope dictionary's weights: it has no "
                               f"{name} tensor")
        a = t[name]
        if not np.issubdtype(a.dtype, np.floating) or a.shape != shape:
            raise WeightsError(f"{path}: {name} is {a.dtype} {list(a.shape)}, expected "
                               f"floating-point numbers of shape {list(shape)}")
        a = np.asarray(a, np.float32)
        if not np.isfinite(a).all():
            raise WeightsError(f"{path}: {name} is not all finite numbers")
        out[name] = a
    return out


def load_gemma_scope(folder: Path, config: Config) -> tuple[SAE, str]:
    """A Gemma Scope 2 folder as an SAE of this model: (the SAE, its kind: "sae" or
    "transcoder"). A transcoder's SAE reads layers.L.ln2.out (b_in 0: the release subtracts
    nothing) and its site is the mlp_out it predicts; its skip connection, when the release
    has one, is `skip`."""
    folder = Path(folder)
    where = str(folder / CONFIG) if (folder / CONFIG).is_file() else str(folder)
    cfg = raw_config(folder)
    if cfg.get("architecture") != "jump_relu":
        raise InputError(f"{where}: architecture {cfg.get('architecture')!r}; Gemma Scope 2's "
                         "dictionaries are jump_relu")
    check_model_name(cfg.get("model_name"), config, where)
    what, layer = hook_value(cfg.get("hf_hook_point_in"), config, where)
    out = cfg.get("hf_hook_point_out")
    kind = "sae" if out is None else "transcoder"
    if out is not None:
        got = hook_value(out, config, where)
        if what != "ln2.out" or got not in (("mlp_out", layer), ("ln2_post.out", layer)):
            raise InputError(f"{where}: a transcoder from {cfg['hf_hook_point_in']!r} to "
                             f"{out!r}; tinygpt's transcoders read a block's MLP input and "
                             "predict the same block's MLP output (a cross-layer one: its "
                             "clt/ folder, one layer_L_... folder per block)")
        what = got[0]
    elif what not in ("resid_post", "mlp_out", "ln2_post.out", "z"):
        raise InputError(f"{where}: it reads {cfg['hf_hook_point_in']!r} ({what}); tinygpt's "
                         "SAEs read a block's output, its MLP's output or its heads' outputs")
    _agree_with_names(folder, kind, what, layer)
    affine = cfg.get("affine_connection", False)
    if not isinstance(affine, bool):
        raise WeightsError(f"{where}: affine_connection is {affine!r}, not true or false")
    # an attention-output SAE reads o_proj's input: every head's output side by side, head
    # 0's d_k numbers first (tinygpt's layers.L.z merged), and reconstructs it
    d = config.n_head * config.d_k if what == "z" else config.n_embd
    m = _width(folder / PARAMS, d)
    if _decoder_rank(folder / PARAMS) == 3:
        raise InputError(f"{folder} is one block of a cross-layer transcoder (w_dec writes "
                         "into every block): give graph --transcoders its clt/ folder, which "
                         "holds one per block")
    wants = {"w_enc": (d, m), "b_enc": (m,), "threshold": (m,), "w_dec": (m, d), "b_dec": (d,)}
    if affine:
        wants["affine_skip_connection"] = (d, d)
    t = read_params(folder / PARAMS, wants)
    site = f"layers.{layer}.{what}"
    sae = SAE(t["w_enc"], t["b_enc"], t["w_dec"], t["b_dec"], site, None, str(folder),
              "jumprelu", t["threshold"], b_dec_in=kind == "transcoder",
              b_in=np.zeros(d, np.float32) if kind == "transcoder" else None,
              skip=t.get("affine_skip_connection"))
    return sae, kind


def _width(path: Path, d: int) -> int:
    """The latents, from w_enc's header (so a file of another width is named, not misread)."""

    if not path.is_file():
        raise WeightsError(f"{path.parent} has no {PARAMS}")
    try:
        infos = read_header(path, header_bytes(8))
    except ValueError as e:
        raise WeightsError(f"{path} is not a readable safetensors file ({e})") from None
    if "w_enc" not in infos or len(infos["w_enc"].shape) != 2:
        raise WeightsError(f"{path} is not a Gemma Scope dictionary's weights: it has no "
                           "w_enc matrix")
    rows, m = infos["w_enc"].shape
    if rows != d:
        raise InputError(f"{path}: the dictionary reads {rows} numbers (w_enc's rows) and this "
                         f"model's values have {d}: it was made for another model")
    return m


def is_cross_layer(path: Path) -> bool:
    """Whether a dictionary's w_dec writes into every block ([m, n_layers, d])."""
    return _decoder_rank(path) == 3


def _decoder_rank(path: Path) -> int:

    info = read_header(path, header_bytes(8)).get("w_dec")
    return len(info.shape) if info is not None else 0


def _agree_with_names(folder: Path, kind: str, what: str, layer: int) -> None:
    """The release's folder names say the layer and the site: they must agree with the
    config (a folder renamed by hand is not checked)."""
    m = NAME.fullmatch(folder.name)
    if m is not None and int(m[1]) != layer:
        raise WeightsError(f"{folder}: its name says layer {m[1]}, its config block {layer}")
    site = SITES.get(folder.parent.name)
    named = {"transcoder": "transcoder", "clt": "transcoder"}.get(site, site)
    here = "transcoder" if kind == "transcoder" else {"z": "attn_out", "ln2_post.out":
                                                      "mlp_out"}.get(what, what)
    if site is not None and named != here:
        raise WeightsError(f"{folder}: it is in {folder.parent.name}/, but its config reads "
                           f"{here}")


def transcoder_folders(folder: Path, layer: int, pattern: str = "*") -> list[Path]:
    """A transcoder folder's layer_L_* dictionaries for block `layer` (those whose name
    `pattern` matches, fnmatch's: layer_*_width_16k_l0_small)."""

    return sorted(p for p in Path(folder).iterdir() if p.is_dir()
                  and (m := NAME.fullmatch(p.name)) is not None and int(m[1]) == layer
                  and fnmatchcase(p.name, pattern))


# ------------------------------------------------------------------ cross-layer transcoders
# The release's clt/ folder: one layer_L_width_W_l0_S folder per block, its hooks the block's
# MLP input and output (SAELens' tests), its params.safetensors as for a transcoder but with
# w_dec [m, n_layers, d]: block L's latents write into every block's MLP output, of which
# blocks L.. are used (circuit-tracer's load_gemma_scope_2_clt stacks the files and keeps
# w_dec[L, :, L:, :] for block L).


LAYER_FILE = re.compile(r"params_layer_([0-9]+)\.safetensors")


def layer_files(folder: Path) -> dict[int, Path]:
    """The release's cross-layer transcoder: clt/width_W_l0_S[_affine]/params_layer_L.safetensors,
    a file a block (as circuit-tracer's users fetch it for load_gemma_scope_2_clt)."""
    folder = Path(folder)
    if not folder.is_dir():
        return {}
    return {int(m[1]): p for p in folder.iterdir()
            if (m := LAYER_FILE.fullmatch(p.name)) is not None and p.is_file()}


def load_cross_layer(folder: Path, config: Config, pattern: str = "*") -> CrossLayerTranscoder:
    """A cross-layer transcoder of Gemma Scope 2 for this model: the release's folder of
    params_layer_L.safetensors files (its hooks, as SAELens infers them for clt/, Gemma 3's
    norm before the MLP to its norm after; `_affine` in its name: the skip connection), or a
    folder of one layer_L_... folder per block (or those `pattern` matches) with their
    config.json."""
    n, d = config.n_layer, config.n_embd
    files = layer_files(folder)
    if files and max(files) >= n:
        raise InputError(f"{folder}: it has a file for block {max(files)}; this model has {n} "
                         "blocks: it was made for another model")
    encoders, decoders, biases, skips, sites = [], [], [], [], set()
    for layer in range(n):
        if files:
            if layer not in files:
                raise InputError(f"{folder}: no params_layer_{layer}.safetensors for block "
                                 f"{layer}")
            b = f"model.layers.{layer}"
            cfg = {"hf_hook_point_in": f"{b}.pre_feedforward_layernorm.output",
                   "hf_hook_point_out": f"{b}.post_feedforward_layernorm.output",
                   "affine_connection": Path(folder).name.endswith("_affine")}
            params, where = files[layer], str(files[layer])
        else:
            found = transcoder_folders(folder, layer, pattern)
            if len(found) != 1:
                names = ", ".join(p.name for p in found) or "none"
                raise InputError(f"{folder}: {len(found)} cross-layer transcoders for block "
                                 f"{layer} ({names}); give a folder holding one per block")
            cfg, params, where = raw_config(found[0]), found[0] / PARAMS, str(found[0])
        check_model_name(cfg.get("model_name"), config, where)
        ins = hook_value(cfg.get("hf_hook_point_in"), config, where)
        outs = hook_value(cfg.get("hf_hook_point_out"), config, where)
        if ins != ("ln2.out", layer) or outs not in (("mlp_out", layer),
                                                     ("ln2_post.out", layer)):
            raise InputError(f"{where}: block {layer}'s latents must read its MLP input and "
                             f"write its MLP output; it reads "
                             f"{cfg.get('hf_hook_point_in')!r} and writes "
                             f"{cfg.get('hf_hook_point_out')!r}")
        sites.add(outs[0])
        m = _width(params, d)
        wants = {"w_enc": (d, m), "b_enc": (m,), "threshold": (m,), "b_dec": (d,)}
        if cfg.get("affine_connection", False) is True:
            wants["affine_skip_connection"] = (d, d)
        w_dec = _layered_decoder(params, m, n, d)
        t = read_params(params, wants)
        encoders.append(SAE(t["w_enc"], t["b_enc"], w_dec[:, layer], t["b_dec"],
                            f"layers.{layer}.{outs[0]}", None, where, "jumprelu",
                            t["threshold"], b_in=np.zeros(d, np.float32)))
        decoders.append(w_dec[:, layer:])
        biases.append(t["b_dec"])
        skips.append(t.get("affine_skip_connection"))
    has_skip = [s is not None for s in skips]
    if any(has_skip) and not all(has_skip):
        raise WeightsError(f"{folder}: some blocks have a skip connection and some not")
    if len(sites) != 1:
        raise WeightsError(f"{folder}: its blocks write different values ({sorted(sites)})")
    return CrossLayerTranscoder(encoders, decoders, np.stack(biases),
                                skips if all(has_skip) else None, sites.pop())


def _layered_decoder(path: Path, m: int, n: int, d: int) -> np.ndarray:
    """w_dec [m, n_layers, d], its layer count this model's."""

    info = read_header(path, header_bytes(8)).get("w_dec")
    shape = tuple(info.shape) if info is not None else ()
    if len(shape) == 3 and shape[0] == m and shape[2] == d and shape[1] != n:
        raise InputError(f"{path}: its decoders write into {shape[1]} blocks; this model has "
                         f"{n}: it was made for another model")
    return read_params(path, {"w_dec": (m, n, d)})["w_dec"]
