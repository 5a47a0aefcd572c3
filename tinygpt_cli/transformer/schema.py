"""The one list of values: every value a forward pass computes, and every parameter, once.

Each row names a value by its canonical path (`L` stands for a block index, `H` for a head),
gives its shape in symbols, the seed card it belongs to, a one-line description, its
TransformerLens hook name and the seed page's spelling. `trace --list`, path lookup, aliases,
"did you mean" suggestions, the parameter shapes the loader checks and the README's table of
paths are all derived from these two tables. Adding a value is one row here plus the line of
math in `model.py` that computes it and passes it through `hooks(path, x)`.

Symbols: T tokens, d numbers per token, H heads, d_k numbers per head, ff feed-forward width,
V vocabulary, n_ctx longest text, 1 a kept axis of size one.
"""

from __future__ import annotations

import difflib
import re
from typing import NamedTuple

from ..errors import InputError
from . import wiring
from .config import Config


class Value(NamedTuple):  # not a frozen dataclass: built on every command's start-up
    path: str  # canonical, with L / H placeholders
    shape: str  # in symbols, for one text (a batch adds a leading B)
    card: int | None  # the seed page's card
    about: str
    lens: str | None = None  # TransformerLens hook name
    seed: str | None = None  # the seed page's spelling
    kind: str = "hooked"  # hooked: passes through hooks in forward; derived: computed on read
    also: tuple[str, ...] = ()  # other spellings that resolve here
    needs: str = ""  # the architecture that has it (NEEDS); "": every model


VALUES: list[Value] = [
    Value("ids", "T", 1, "token ids", seed="ids"),
    Value("tokens", "T", 1, "each token's text", kind="derived"),
    Value("token_embeddings", "T d", 2, "W_E[ids], each id's row of the embedding table "
          "(Gemma: times sqrt(d))",
          "hook_embed", "tokenEmbeddings"),
    Value("position_embeddings", "T d", 3, "W_P[0..T-1], each position's row",
          "hook_pos_embed", "positionEmbeddings", needs="learned"),
    Value("rotary_angles", "T r", 3, "the angle (radians) position t turns each pair (i, "
          "i + r) of every head's q and k by: t base^(-2i / 2r)", kind="derived",
          needs="rotary"),
    Value("embeddings", "T d", 3, "token_embeddings + position_embeddings", seed="embeddings"),
    Value("layers.L.resid_pre", "T d", 4, "the residual stream entering block L",
          "blocks.L.hook_resid_pre"),
    Value("layers.L.ln1.mean", "T 1", 4, "each token's mean, removed by ln1", needs="layer"),
    Value("layers.L.ln1.std", "T 1", 4, "each token's sqrt(var + eps), divided out by ln1",
          "blocks.L.ln1.hook_scale", needs="layer"),
    Value("layers.L.ln1.rms", "T 1", 4, "each token's sqrt(mean(x^2) + eps), divided out by "
          "ln1 (RMSNorm)", "blocks.L.ln1.hook_scale", needs="rms"),
    Value("layers.L.ln1.out", "T d", 4, "LayerNorm before attention",
          "blocks.L.ln1.hook_normalized", "layers[L].ln1.out", also=("layers.L.ln_1.out",)),
    Value("layers.L.q", "H T d_k", 5, "queries, every head", "blocks.L.attn.hook_q",
          also=("blocks.L.attn.hook_rot_q",)),
    Value("layers.L.k", "H_kv T d_k", 5, "keys, every key/value head", "blocks.L.attn.hook_k",
          also=("blocks.L.attn.hook_rot_k",)),
    Value("layers.L.v", "H_kv T d_k", 5, "values, every key/value head",
          "blocks.L.attn.hook_v"),
    Value("layers.L.heads.H.q", "T d_k", 5, "head H's queries"),
    Value("layers.L.heads.H.k", "T d_k", 5, "head H's keys"),
    Value("layers.L.heads.H.v", "T d_k", 5, "head H's values"),
    Value("layers.L.scores", "H T T", 5,
          "Q K^T / sqrt(d_k) + M, every head; -inf above the diagonal",
          "blocks.L.attn.hook_attn_scores"),
    Value("layers.L.heads.H.scores", "T T", 5, "head H's masked, scaled scores"),
    Value("layers.L.weights", "H T T", 5, "softmax of the scores: the attention grid, every head",
          "blocks.L.attn.hook_pattern"),
    Value("layers.L.heads.H.weights", "T T", 5, "head H's attention grid; rows sum to 1",
          seed="layers[L].heads[H].weights"),
    Value("layers.L.z", "H T d_k", 5, "weights V, every head's output before c_proj",
          "blocks.L.attn.hook_z"),
    Value("layers.L.heads.H.out", "T d_k", 5, "head H's output, weights V"),
    Value("layers.L.attn_out", "T d", 5, "all heads merged and projected by c_proj",
          "blocks.L.hook_attn_out"),
    Value("layers.L.ln1_post.mean", "T 1", 4, "each token's mean, removed by the norm after "
          "attention", needs="post_layer"),
    Value("layers.L.ln1_post.std", "T 1", 4, "each token's sqrt(var + eps), divided out by "
          "the norm after attention", "blocks.L.ln1_post.hook_scale", needs="post_layer"),
    Value("layers.L.ln1_post.rms", "T 1", 4, "each token's sqrt(mean(x^2) + eps), divided out "
          "by the norm after attention (Gemma)", "blocks.L.ln1_post.hook_scale",
          needs="post_rms"),
    # TransformerLens hooks Gemma's attention output after this norm: what the block adds
    Value("layers.L.ln1_post.out", "T d", 4, "the norm of attn_out, added to the stream "
          "(Gemma)", "blocks.L.hook_attn_out", needs="post_out",
          also=("blocks.L.ln1_post.hook_normalized",)),
    Value("layers.L.resid_mid", "T d", 4, "resid_pre + attn_out (add)",
          "blocks.L.hook_resid_mid", needs="sequential"),
    Value("layers.L.ln2.mean", "T 1", 4, "each token's mean, removed by ln2", needs="layer"),
    Value("layers.L.ln2.std", "T 1", 4, "each token's sqrt(var + eps), divided out by ln2",
          "blocks.L.ln2.hook_scale", needs="layer"),
    Value("layers.L.ln2.rms", "T 1", 4, "each token's sqrt(mean(x^2) + eps), divided out by "
          "ln2 (RMSNorm)", "blocks.L.ln2.hook_scale", needs="rms"),
    Value("layers.L.ln2.out", "T d", 4, "LayerNorm before the feed-forward layer",
          "blocks.L.ln2.hook_normalized", also=("layers.L.ln_2.out",)),
    Value("layers.L.mlp_pre", "T ff", 6, "x W_1 + b_1, the hidden layer before GELU",
          "blocks.L.mlp.hook_pre"),
    Value("layers.L.mlp_up", "T ff", 6, "x W_in, the gated MLP's linear half",
          "blocks.L.mlp.hook_pre_linear", needs="gated"),
    Value("layers.L.mlp_post", "T ff", 6, "GELU(mlp_pre), the hidden neurons (gated: "
          "act(mlp_pre) * mlp_up)", "blocks.L.mlp.hook_post"),
    Value("layers.L.mlp_out", "T d", 6, "mlp_post W_2 + b_2", "blocks.L.hook_mlp_out",
          "layers[L].mlpOut"),
    Value("layers.L.ln2_post.mean", "T 1", 6, "each token's mean, removed by the norm after "
          "the MLP", needs="post_layer"),
    Value("layers.L.ln2_post.std", "T 1", 6, "each token's sqrt(var + eps), divided out by "
          "the norm after the MLP", "blocks.L.ln2_post.hook_scale", needs="post_layer"),
    Value("layers.L.ln2_post.rms", "T 1", 6, "each token's sqrt(mean(x^2) + eps), divided out "
          "by the norm after the MLP (Gemma)", "blocks.L.ln2_post.hook_scale",
          needs="post_rms"),
    Value("layers.L.ln2_post.out", "T d", 6, "the norm of mlp_out, added to the stream "
          "(Gemma)", "blocks.L.hook_mlp_out", needs="post_out",
          also=("blocks.L.ln2_post.hook_normalized",)),
    Value("layers.L.resid_post", "T d", 7, "resid_mid + mlp_out, the block's output",
          "blocks.L.hook_resid_post"),
    Value("layers.length", "", 7, "how many blocks", seed="layers.length", kind="derived"),
    Value("ln_final.mean", "T 1", 8, "each token's mean, removed by the final norm",
          needs="layer"),
    Value("ln_final.std", "T 1", 8, "each token's sqrt(var + eps), divided out by the final norm",
          "ln_final.hook_scale", needs="layer"),
    Value("ln_final.rms", "T 1", 8, "each token's sqrt(mean(x^2) + eps), divided out by the "
          "final norm (RMSNorm)", "ln_final.hook_scale", needs="rms"),
    Value("ln_final.out", "T d", 8, "the final LayerNorm", "ln_final.hook_normalized",
          "lnFinal.out", also=("ln_f.out",)),
    Value("logits", "T V", 9, "ln_final.out W_E^T, a score for every vocabulary token",
          seed="logits"),
    Value("probs", "T V", 10, "softmax(logits) at temperature 1: each position's next-token "
          "chances", kind="derived"),
]

# Parameters by their canonical names, the same for every family (each family's converter,
# families/, maps its file's names to these), in (in, out) orientation; W_QKV holds W_Q, W_K
# and W_V side by side, each split into heads of d_k (model.W_Q and the others are those
# views, [H, d, d_k]).
PARAMS: list[tuple[str, str, str, str]] = [
    ("embed.W_E", "V d", "W_E, the token embedding table; also the output head (tied)", ""),
    ("embed.W_pos", "n_ctx d", "W_P, the position table", "learned"),
    ("layers.L.ln1.w", "d", "ln1's scale", ""),
    ("layers.L.ln1.b", "d", "ln1's shift", "layer"),
    ("layers.L.attn.W_QKV", "d qkv", "W_Q, W_K, W_V side by side, each split into heads", ""),
    ("layers.L.attn.b_QKV", "qkv", "their biases", "qkv_bias"),
    ("layers.L.attn.q_norm.w", "d_k", "the scale of each head's RMSNorm of q", "qk_norm"),
    ("layers.L.attn.k_norm.w", "d_k", "the scale of each head's RMSNorm of k", "qk_norm"),
    ("layers.L.attn.W_O", "Hd_k d", "W_O: merged heads back into the stream", ""),
    ("layers.L.attn.b_O", "d", "its bias", "out_bias"),
    ("layers.L.ln1_post.w", "d", "the scale of the norm after attention", "post_norms"),
    ("layers.L.ln1_post.b", "d", "its shift", "post_shift"),
    ("layers.L.ln2.w", "d", "ln2's scale", ""),
    ("layers.L.ln2.b", "d", "ln2's shift", "layer"),
    ("layers.L.mlp.W_gate", "d ff", "W_gate, the gated MLP's gate", "gated"),
    ("layers.L.mlp.W_in", "d ff", "W_1", ""),
    ("layers.L.mlp.b_in", "ff", "b_1", "mlp_bias"),
    ("layers.L.mlp.W_out", "ff d", "W_2", ""),
    ("layers.L.mlp.b_out", "d", "b_2", "mlp_bias"),
    ("layers.L.ln2_post.w", "d", "the scale of the norm after the MLP", "post_norms"),
    ("layers.L.ln2_post.b", "d", "its shift", "post_shift"),
    ("ln_final.w", "d", "the final norm's scale", ""),
    ("ln_final.b", "d", "the final norm's shift", "layer"),
    ("unembed.W_U", "V d", "the output head's rows, when not tied to W_E", "untied"),
]

# What each `needs` above asks of the architecture.
NEEDS = {
    "": lambda c: True,
    "layer": lambda c: c.norm == "layer",
    "rms": lambda c: c.norm == "rms",
    "learned": lambda c: c.positions == "learned",
    "rotary": lambda c: c.positions == "rotary",
    "sequential": lambda c: not c.parallel,
    "gated": lambda c: c.mlp == "gated",
    "qkv_bias": lambda c: c.qkv_bias,
    "out_bias": lambda c: c.out_bias,
    "mlp_bias": lambda c: c.mlp_bias,
    "qk_norm": lambda c: c.qk_norm,
    "untied": lambda c: not c.tied,
    # the parameters as the config has them; the values as its blocks' steps compute them
    "post_norms": lambda c: c.post_norms,
    "post_shift": lambda c: c.post_norms and c.norm == "layer",
    "post_out": lambda c: _post_normed(c),
    "post_rms": lambda c: _post_normed(c) and c.norm == "rms",
    "post_layer": lambda c: _post_normed(c) and c.norm == "layer",
}


def _post_normed(config: Config) -> bool:
    """Its blocks have a norm after a branch (Gemma's): as the wiring states the block."""
    return any(s.op == "norm" and s.reads[0] in ("attn_out", "mlp_out")
               for s in wiring.describe(config, 0).steps)


def has(value: Value, config: Config) -> bool:
    """Whether this model computes the value (an RMSNorm model has no ln1.mean)."""
    return NEEDS[value.needs](config)


BY_PATH: dict[str, Value] = {v.path: v for v in VALUES}


def sizes(config: Config, t: int | None = None) -> dict[str, int]:
    """What each shape symbol stands for in this model (T only when a text is given)."""
    d, dk = config.n_embd, config.d_k
    out = {"d": d, "H": config.n_head, "H_kv": config.kv_heads, "d_k": dk,
           "Hd_k": config.n_head * dk, "qkv": (config.n_head + 2 * config.kv_heads) * dk,
           "ff": config.n_inner, "V": config.vocab_size, "n_ctx": config.n_positions, "1": 1,
           "r": config.rotary // 2}
    if t is not None:
        out["T"] = t
    return out


def shape_of(symbols: str, config: Config, t: int | None = None) -> tuple[int, ...]:
    table = sizes(config, t)
    return tuple(table[s] for s in symbols.split())


def param_shapes(config: Config) -> dict[str, tuple[int, ...]]:
    """Every parameter's name and shape, in file order."""
    out: dict[str, tuple[int, ...]] = {}
    kept = [(n, s) for n, s, _, needs in PARAMS if NEEDS[needs](config)]
    blocks = [(n, s) for n, s in kept if n.startswith("layers.L.")]
    for n, s in kept:
        if n.startswith("layers.L."):
            if n == blocks[0][0]:
                for i in range(config.n_layer):
                    for bn, bs in blocks:
                        out[fill(bn, i)] = shape_of(bs, config)
            continue
        out[n] = shape_of(s, config)
    return out


def is_bias(name: str) -> bool:
    """A parameter that is a bias (b, b_QKV, b_O, b_in, b_out): zero at initialisation."""
    last = name.rsplit(".", 1)[-1]
    return last == "b" or last.startswith("b_")


def is_norm_weight(name: str) -> bool:
    """A norm's scale (ln1.w, ln2.w, ln_final.w): one at initialisation."""
    return name.endswith(".w")


def fill(pattern: str, layer: int | None = None, head: int | None = None) -> str:
    """`layers.L.heads.H.out`, 1, 2 -> `layers.1.heads.2.out`"""
    if layer is not None:
        pattern = pattern.replace("layers.L.", f"layers.{layer}.")
    if head is not None:
        pattern = pattern.replace("heads.H.", f"heads.{head}.")
    return pattern


def pattern_of(path: str) -> str:
    """`layers.1.heads.2.out` -> `layers.L.heads.H.out`"""
    path = re.sub(r"^layers\.\d+\.", "layers.L.", path)
    return re.sub(r"\.heads\.\d+\.", ".heads.H.", path)


def expand(config: Config, kinds: tuple[str, ...] = ("hooked", "derived")) -> list[str]:
    """Every concrete path, in forward order: per-block values block by block."""
    out: list[str] = []
    values = [v for v in VALUES if v.kind in kinds and has(v, config)]
    per_block = [v for v in values if v.path.startswith("layers.L.")]
    for v in values:
        if v.path.startswith("layers.L."):
            if v is per_block[0]:
                for i in range(config.n_layer):
                    for b in per_block:
                        if ".heads.H." in b.path:
                            out += [fill(b.path, i, h) for h in range(config.n_head)]
                        else:
                            out.append(fill(b.path, i))
            continue
        out.append(v.path)
    return out


# The sentences that GPT-2's block words otherwise: (the model has it, pattern, sentence)
OWN_WORDS = [
    (lambda c: c.norm == "rms", "layers.L.ln1.out", "RMSNorm before attention"),
    (lambda c: c.norm == "rms", "layers.L.ln2.out", "RMSNorm before the feed-forward layer"),
    (lambda c: c.norm == "rms", "ln_final.out", "the final RMSNorm"),
    (lambda c: _post_normed(c), "layers.L.resid_mid",
     "resid_pre + ln1_post.out, attention's output after its norm (add)"),
    (lambda c: _post_normed(c), "layers.L.resid_post",
     "resid_mid + ln2_post.out, the MLP's output after its norm: the block's output"),
    (lambda c: any(c.windows), "layers.L.scores",
     "Q K^T * scale + M, every head; -inf above the diagonal and, in a sliding block, before "
     "the query's window"),
]


def describe(path: str, config: Config | None = None) -> str:
    """The schema's sentence for a concrete path, with its block and head filled in; with a
    config, in this model's own words (its norms, what its block adds)."""
    v = BY_PATH[pattern_of(path)]
    about = v.about if config is None else next(
        (said for mine, pattern, said in OWN_WORDS if pattern == v.path and mine(config)),
        v.about)
    m = re.match(r"layers\.(\d+)\.(?:heads\.(\d+)\.)?", path)
    if m:
        about = re.sub(r"\bblock L\b", f"block {m[1]}", about)
        if m[2] is not None:
            about = re.sub(r"\bhead H\b", f"head {m[2]}", about)
    return about + (f" (card {v.card})" if v.card else "")


# ------------------------------------------------------------------ path lookup


class PathError(InputError, KeyError):
    """A path that names no value; carries the nearest valid paths."""

    def __init__(self, path: str, message: str, suggestions: list[str] | None = None):
        super().__init__(message)
        self.path = path
        self.message = message
        self.suggestions = suggestions or []

    def __str__(self) -> str:
        if self.suggestions:
            return self.message + f"; did you mean {' or '.join(self.suggestions)}?"
        if self.message.startswith("no value at path"):
            return self.message + "; 'tinygpt trace TEXT --list' lists every path"
        return self.message


def _snake(segment: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", segment).lower()


def _aliases() -> dict[str, tuple[str, ...]]:
    """Every other spelling (TransformerLens, the seed page, `also`) -> the canonical patterns
    it may name, which depend on the model (alias)."""
    out: dict[str, tuple[str, ...]] = {}
    for v in VALUES:
        for other in (v.lens, v.seed, *v.also):
            if other:
                key = _spelling(other)
                out[key] = (*out.get(key, ()), v.path)
    return out


def _spelling(name: str) -> str:
    """A spelling as lookup sees it: snake case, `L` and `H` for the indices."""
    key = ".".join(_snake(p) for p in split_path(name.replace("[L]", ".L").replace("[H]", ".H")))
    key = key.replace("blocks.l.", "blocks.L.").replace("layers.l.", "layers.L.")
    return key.replace("heads.h.", "heads.H.")


def alias(pattern: str, config: Config) -> str:
    """The canonical pattern another spelling names on this model: of the values it may name,
    one this model computes, the one its architecture asks for first. TransformerLens's
    `hook_scale` is a LayerNorm's std or an RMSNorm's rms, and on Gemma its `hook_attn_out`
    and `hook_mlp_out` are what the block adds, the outputs of the norms after each branch."""
    names = ALIASES.get(pattern, (pattern,))
    mine = sorted((p for p in names if p in BY_PATH and has(BY_PATH[p], config)),
                  key=lambda p: BY_PATH[p].needs == "")
    return (mine or list(names))[0]


# TransformerLens's q and k before the rotary turn (and a q/k norm), which tinygpt does not
# keep: its layers.L.q and k are as the scores read them, TransformerLens's hook_rot_q, _k
TURNED = {"blocks.L.attn.hook_q": "blocks.L.attn.hook_rot_q",
          "blocks.L.attn.hook_k": "blocks.L.attn.hook_rot_k"}


def _turned(config: Config) -> bool:
    return config.positions == "rotary" or config.qk_norm


def lens_name(path: str, config: Config) -> str | None:
    """The TransformerLens hook name of a concrete path on this model, or None: none where
    that name means another value here (Gemma's attn_out, before its norm)."""
    lens = BY_PATH[pattern_of(path)].lens
    if lens in TURNED and _turned(config):
        lens = TURNED[lens]
    if lens is None or alias(_spelling(lens), config) != pattern_of(path):
        return None
    m = re.match(r"layers\.(\d+)\.", path)
    return lens.replace("blocks.L.", f"blocks.{m[1]}.") if m else lens


def split_path(path: str) -> list[str]:
    """`layers[0].heads[-1].weights` -> ['layers', '0', 'heads', '-1', 'weights']"""
    text = re.sub(r"\[\s*(-?\d+)\s*\]", r".\1", path.strip())
    return [s for s in text.split(".") if s != ""]


def _is_int(s: str) -> bool:
    return re.fullmatch(r"-?\d+", s) is not None


def _name(parts: list[str], config: Config) -> str | None:
    """Parts of a path without trailing row indices -> a concrete canonical path, or None."""
    parts = list(parts)
    idx: dict[str, int] = {}
    for key, count, ph in (("layers", config.n_layer, "L"), ("blocks", config.n_layer, "L"),
                           ("heads", config.n_head, "H")):
        if key in parts:
            j = parts.index(key)
            if j + 1 < len(parts) and _is_int(parts[j + 1]):
                n = int(parts[j + 1])
                if not -count <= n < count:
                    raise PathError(
                        ".".join(parts),
                        f"{key[:-1]} {n} is out of range: this model has {count} "
                        f"{key} (0..{count - 1}, or -{count}..-1)",
                    )
                idx[ph] = n % count
                parts[j + 1] = ph
    pattern = ".".join(parts)
    if pattern in TURNED and _turned(config) and "L" in idx:
        which, layer = pattern[-1], idx["L"]
        before = " and ".join(w for w in (f"its {which} norm" if config.qk_norm else "",
                                          "the rotary turn" if config.positions == "rotary"
                                          else "") if w)
        raise PathError(f"blocks.{layer}.attn.hook_{which}", f"blocks.{layer}.attn.hook_"
                        f"{which} is TransformerLens's {which} before {before}, which tinygpt "
                        "does not keep; "
                        f"hook_rot_{which} (tinygpt's layers.{layer}.{which}) is {which} as the "
                        "scores read it")
    pattern = alias(pattern, config)
    if pattern not in BY_PATH:
        return None
    if ("layers.L." in pattern and "L" not in idx) or ("heads.H." in pattern and "H" not in idx):
        return None  # the placeholder itself was typed, not an index
    name = fill(pattern, idx.get("L"), idx.get("H"))
    if not has(BY_PATH[pattern], config):
        raise PathError(name, f"{name} is not a value of this model: "
                        f"{WITHOUT[BY_PATH[pattern].needs]}")
    return name


# Why a model lacks a value that needs its architecture to be otherwise.
WITHOUT = {
    "layer": "its norms are RMSNorms (x / rms * w: see .rms), with no mean or std",
    "rms": "its norms are LayerNorms (mean and std), with no rms",
    "learned": "its positions turn q and k (rotary), with no position table: see "
               "rotary_angles",
    "rotary": "its positions are a learned table added to the embeddings, with no rotary "
              "angles",
    "sequential": "its attention and MLP both read resid_pre (a parallel block), so there is "
                  "no resid_mid",
    "gated": "its MLP is not gated: mlp_pre goes through the activation alone",
    "post_out": "its blocks have no norm after attention or after the MLP (Gemma's)",
    "post_rms": "its blocks have no RMSNorm after attention or after the MLP",
    "post_layer": "its blocks have no LayerNorm after attention or after the MLP",
}


MAX_PATH = 200  # characters; the longest path with indices is under 40
# L2H1: head 1 of block 2 (its output); L2H1.v: a value of that head, as circuit names the
# receivers of its q, k and v inputs
HEAD_NAME = re.compile(r"L(-?\d+)H(-?\d+)(?:\.([a-z_]+))?((?:\[-?\d+\])*)")
MLP_NAME = re.compile(r"L(-?\d+)\.mlp((?:\[-?\d+\])*)")  # L2.mlp: block 2's MLP output


def head_name(layer: int, head: int) -> str:
    """The one short name of a head, in every view and accepted wherever a path is."""
    return f"L{layer}H{head}"


def mlp_name(layer: int) -> str:
    """The one short name of a block's MLP (its output, layers.N.mlp_out), as head_name."""
    return f"L{layer}.mlp"


def resolve(path: str, config: Config) -> tuple[str, list[int]]:
    """A user's path -> (canonical concrete path, trailing row indices).

    Dots or brackets, negative indices, camelCase, TransformerLens names all work:
    `layers[-1].mlpOut`, `blocks.0.attn.hook_pattern`, `logits[-1]`; and a head's short name
    as the views print it, `L2H1` for its output layers.2.heads.1.out, `L2.mlp` for
    layers.2.mlp_out.
    """
    if len(path) > MAX_PATH:  # matching tries every split of the path: keep that small
        raise PathError(path, f"a path of {len(path):,} characters: value paths are at most "
                        f"a few dozen (e.g. layers.0.heads.0.weights[-1])")
    short = HEAD_NAME.fullmatch(path.strip())
    if short:
        path = f"layers.{short[1]}.heads.{short[2]}.{short[3] or 'out'}{short[4]}"
    short = MLP_NAME.fullmatch(path.strip())
    if short:
        path = f"layers.{short[1]}.mlp_out{short[2]}"
    parts = [_snake(p) if not _is_int(p) else p for p in split_path(path)]
    if not parts:
        raise PathError(path, "empty path: give a value's name, e.g. layers.0.heads.0.weights")
    # The longest prefix that names a value; what follows must be indices into it.
    for cut in range(len(parts), 0, -1):
        head, rest = parts[:cut], parts[cut:]
        if not all(_is_int(r) for r in rest):
            continue
        name = _name(head, config)
        if name is not None:
            return name, [int(r) for r in rest]
    raise PathError(path, f"no value at path {path!r}", suggest(path, config))


def suggest(path: str, config: Config) -> list[str]:

    return difflib.get_close_matches(path.strip(), expand(config), n=2, cutoff=0.5)


ALIASES = _aliases()


def markdown_table() -> str:
    """The README's table of values, one row per schema entry."""
    rows = ["| path | shape | card | what it is | TransformerLens |",
            "| --- | --- | ---: | --- | --- |"]
    for v in VALUES:
        shape = " × ".join(v.shape.split()) or "scalar"
        lens = f"`{v.lens}`" if v.lens else ""
        rows.append(f"| `{v.path}` | {shape} | {v.card or ''} | {v.about} | {lens} |")
    return "\n".join(rows)


# One word for a probability in every JSON document: "chance", as the views say it (probs,
# generate and diff's documents did already). The names other documents used before are kept
# beside the new ones for one release, then dropped; a text's index is "text_index".
OLD_KEYS = {"chance": "prob", "top_chance": "top_prob", "top_chances": "top_probs",
            "target_chances": "target_probs", "text_index": "sequence"}


def with_old_keys(d: dict) -> dict:
    """`d` with each renamed key's old name beside it, the same value (OLD_KEYS)."""
    return {**d, **{OLD_KEYS[k]: v for k, v in d.items() if k in OLD_KEYS}}
