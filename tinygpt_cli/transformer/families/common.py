"""What the converters share: cutting a fused canonical parameter (W_QKV) into the pieces a
file keeps apart, the config keys most families spell alike, and the refusal of settings
that would change the computation."""

from __future__ import annotations

import re

import numpy as np

from ...escapes import shown
from ...storage.pages import weight_pages
from ...storage.safetensors import let_go_of
from ..config import Config, is_int, token_id


def pattern_of(canonical: str) -> tuple[str, int | None]:
    """layers.3.mlp.W_in -> ("layers.L.mlp.W_in", 3); embed.W_E -> ("embed.W_E", None)."""
    m = re.match(r"layers\.(\d+)\.(.*)", canonical)
    return (f"layers.L.{m[2]}", int(m[1])) if m else (canonical, None)


def filled(pattern: str, i: int | None) -> str:
    """A file pattern's block: model.layers.L.mlp.up_proj.weight, 3 -> model.layers.3...."""
    return pattern.replace(".L.", f".{i}.") if i is not None else pattern


def block_index(name: str, block: re.Pattern) -> int | None:
    """The block a file tensor belongs to, by the family's pattern of a block's names."""
    m = block.match(name)
    return int(m[1]) if m else None


def canonical_of(names: dict[str, tuple[str, bool]], name: str, i: int | None) -> str | None:
    """A file tensor that is one canonical parameter (the family's table: canonical pattern
    -> (file pattern, transposed)) -> its canonical name, or None."""
    for canonical, (file, _) in names.items():
        if filled(file, i) == name:
            return canonical.replace("layers.L.", f"layers.{i}.") if i is not None else canonical
    return None


def qkv_sizes(config: Config) -> list[int]:
    """The widths of W_QKV's three pieces: q's H d_k, then k's and v's H_kv d_k each."""
    dk = config.d_k
    return [config.n_head * dk, config.kv_heads * dk, config.kv_heads * dk]


def qkv_files(i: int, kind: str = "weight") -> list[str]:
    """Block i's q, k and v projections (`kind`: weight or bias) as Llama's layout names them
    (Qwen's and Gemma's alike): the three file tensors of W_QKV or b_QKV."""
    return [f"model.layers.{i}.self_attn.{p}_proj.{kind}" for p in "qkv"]


def is_transposed(names: dict[str, tuple[str, bool]], canonical: str) -> bool:
    """Whether the file keeps this parameter (out, in), by the family's NAMES table."""
    pattern = re.sub(r"^layers\.\d+\.", "layers.L.", canonical)
    return names[pattern][1] if pattern in names else False


def cut(value: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    """A fused (in, out) parameter's pieces of these sizes along the out axis (W_QKV into
    q, k and v), as views."""
    edges = np.cumsum([0, *sizes])
    return [value[..., a:b] for a, b in zip(edges, edges[1:], strict=False)]


def floats(a) -> np.ndarray:
    """A file tensor as the float32 array it is: a bfloat16 one (safetensors.Bfloat16, the
    converters that set PLACES_BFLOAT16) widened now."""
    return a.widen() if hasattr(a, "widen") else a


def transposed(a) -> np.ndarray:
    """A file matrix (out, in) as the canonical (in, out), a C-ordered copy (BLAS multiplies
    a vector by it faster than by the transposed view), on small pages (pages.py); a
    bfloat16 one widened straight into it."""
    out = weight_pages(a.shape[::-1], np.float32 if hasattr(a, "widen") else a.dtype)
    _place(out, a)
    return out


def side_by_side(pieces: list) -> np.ndarray:
    """File matrices (out_i, in) as one canonical (in, sum out_i): q, k and v into W_QKV,
    each piece (bfloat16 ones widened) written straight into its columns."""
    kinds = {np.float32 if hasattr(p, "widen") else p.dtype for p in pieces}
    out = weight_pages((pieces[0].shape[1], sum(p.shape[0] for p in pieces)),
                       np.result_type(*kinds))
    for part, p in zip(cut(out, [p.shape[0] for p in pieces]), pieces, strict=True):
        _place(part, p)
    return out


def _place(out: np.ndarray, a) -> None:
    """out[...] = a.T, widening a bfloat16 a on the way; the file's pages of `a` are let go
    of then (safetensors.let_go_of: never read again)."""
    if hasattr(a, "widen"):
        a.widen(out, transposed=True)
    else:

        out[...] = a.T
        if a.flags.c_contiguous:  # a whole tensor of the file, not a piece of one
            let_go_of(a)


def first_id(x, vocab: int) -> tuple[int | None, str | None]:
    """A special token id as tinygpt keeps it: a list's first (Llama 3 lists several end
    tokens), with a note of the rest; out of the vocabulary: None."""
    note = None
    if isinstance(x, list) and x and all(is_int(i) for i in x):
        note = f"{len(x)} ids, the first used: {shown(x)}" if len(x) > 1 else None
        x = x[0]
    return token_id(x, vocab), note


def specials(d: dict, vocab: int) -> tuple[dict, tuple[str, ...]]:
    out, unused = {}, []
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value, note = first_id(d.get(name), vocab)
        if value is None and d.get(name) is not None:
            unused.append(f"{name} {shown(d[name])}")
        elif name != "pad_token_id" and value is not None:
            out[name] = value
        if note:
            unused.append(f"{name}: {note}")
    return out, tuple(unused)


def rope(d: dict, theta_key: str = "rope_theta", pct_key: str = "partial_rotary_factor",
         pct_default: float | None = None) -> tuple[float, float, tuple]:
    """(base, fraction of each head turned, the scaling: () none, (factor,) linear, or Llama
    3's (factor, low_freq_factor, high_freq_factor, original context)), read as transformers
    5 reads them: rope_scaling, when given, replaces rope_parameters whole (its rope_theta
    with it); the top-level `theta_key` and `pct_key` (rope_theta and partial_rotary_factor;
    GPT-NeoX: rotary_emb_base and rotary_pct, default 0.25) fill in what the dict leaves out;
    llama3's original context defaults to max_position_embeddings. Another scaled rope (yarn,
    dynamic, longrope, ...) is refused by name: it changes the angles, or scales the cos and
    sin, in a way not implemented."""
    scaling = d.get("rope_scaling")
    params = scaling or d.get("rope_parameters") or {}
    params = dict(params) if isinstance(params, dict) else {"rope_type": params}
    params.setdefault("rope_theta", d.get(theta_key, 10000.0))
    if d.get(pct_key, pct_default) is not None:
        params.setdefault("partial_rotary_factor", d.get(pct_key, pct_default))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ("default", "linear", "llama3"):
        raise ValueError(f"config: rope scaling {shown(kind)} is not implemented (only "
                         "unscaled rotary positions, linear or llama3's)")
    base, fraction = params["rope_theta"], params.get("partial_rotary_factor", 1.0)
    if kind == "default":
        return base, fraction, ()
    keys = ("factor",) if kind == "linear" else (
        "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    if kind == "llama3":
        params.setdefault("original_max_position_embeddings", d.get("max_position_embeddings"))
    values = tuple(params.get(k) for k in keys)
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in values) \
            or (kind == "llama3" and values[1] >= values[2]):
        raise ValueError(f"config: {kind} rope scaling needs positive {', '.join(keys)}"
                         f"{' (low below high)' if kind == 'llama3' else ''}, got "
                         f"{shown(values if len(values) > 1 else values[0])}")
    return base, fraction, values


def refuse(d: dict, settings: dict) -> None:
    """Settings that change the computation in a way not implemented: refused by name,
    never run approximately. `settings`: key -> the value tinygpt computes with."""
    for key, standard in settings.items():
        if key in d and d[key] not in (standard, None) and d[key] != standard:
            raise ValueError(f"config: {key} {shown(d[key])} is not implemented "
                             f"(only {standard!r})")


def whole(d: dict, key: str, default=None):
    value = d.get(key, default)
    if value is None:
        raise ValueError(f"config: {key} is missing")
    return value


def rotary_numbers(head: int, fraction) -> int:
    """Numbers of a head that rotary turns, as transformers counts them (rounded down)."""
    if not isinstance(fraction, int | float) or isinstance(fraction, bool) \
            or not 0 < fraction <= 1:
        raise ValueError(f"config: the rotary fraction must be in (0, 1], got {shown(fraction)}")
    return int(head * fraction)


__all__ = ["cut", "floats", "refuse", "rope", "rotary_numbers", "side_by_side", "specials",
           "transposed", "whole"]
