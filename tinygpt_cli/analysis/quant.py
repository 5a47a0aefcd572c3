"""What quantization changed: one text through a reference model and its quantized copy (the
same shapes and tokenizer), value by value.

- Residual stream, per stage s (the embeddings, then after each block) and position t: the
  relative change ||h_q - h_ref|| / ||h_ref||; overall per stage, the same over all positions
  at once (Frobenius norms of the [T, d] matrices).
- Attention, per block, head and query position i: the total variation distance of the two
  patterns, TV = 1/2 sum_j |A_ref[i, j] - A_q[i, j]|, in [0, 1]: the share of the row's
  attention that moved (the per-head figure is its mean over the query positions).
- Next token, per position: KL(P_ref || P_q) in nats (the reference's distribution first, as
  llama-perplexity --kl-divergence takes the base model's), and whether the two top-1 tokens
  agree.
- Tensors: for each quantized tensor W (W_QKV as its q, k and v parts), the first-order change
  of log p(target) at the position if W alone were put back at full precision,
  sum over W's entries of d log p(target)/dW (at the quantized model, exact, by
  model.backward) * (W_ref - W_q); the largest ones are checked by doing it (`restored`).

Both models compute in float32 with the dequantized weights: llama.cpp's CPU products also
round each activation row entering a matrix product (to Q8_0 or Q8_K blocks, float16 or
bfloat16) first, and keep k and v in a float16 cache, which `act_quant_hook` imitates.

Over a text file (`file_kl`), the definitions of llama.cpp's tools/perplexity/perplexity.cpp
(`kl_divergence`, ggml-org/llama.cpp): the token stream cut into chunks of n_ctx tokens
(leftover tokens dropped), each chunk read from a fresh start, and only the logits of its
second half scored, positions first = n_ctx/2 .. n_ctx - 2 (each predicting the next token):
KL(P_base || P_q) = sum_i p_base,i (log p_base,i - log p_q,i), and "same top p", the share of
those positions where the two argmax tokens agree. llama.cpp keeps the base log-probabilities
rounded to 16 bits and skips the terms with log p_base <= -16; here they are exact.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError
from ..transformer import model as mdl
from ..transformer import ops
from ..transformer.gguf import gguf_names
from ..transformer.wiring import FORWARD
from .diff import config_differences, kl_divergence, relative_distance

# the model's own forward and backward passes, whatever steps they walk
HANDLES = FORWARD

# --------------------------------------------------------------------- the measures


def relative_change(ref: np.ndarray, other: np.ndarray) -> np.ndarray:
    """||other - ref|| / ||ref|| row by row.  [..., d] -> [...]"""
    return relative_distance(ref, other)


def overall_change(ref: np.ndarray, other: np.ndarray) -> float:
    """||other - ref||_F / ||ref||_F of whole matrices (all positions at once)."""
    ref, other = np.asarray(ref, np.float64), np.asarray(other, np.float64)
    return float(np.linalg.norm(other - ref) / max(np.linalg.norm(ref), 1e-30))


def total_variation(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """1/2 sum_j |p_j - q_j| over the last axis: the share of probability that moved."""
    return 0.5 * np.abs(np.asarray(p, np.float64) - np.asarray(q, np.float64)).sum(axis=-1)


# --------------------------------------------------------------------- the tensors


@dataclass(frozen=True)
class Unit:
    """One quantized tensor, as a parameter's columns: W_QKV is the file's q, k and v."""

    label: str
    param: str
    cols: tuple[int, int] | None = None


def tensor_units(params: dict, config) -> list[Unit]:
    """Every parameter, W_QKV (and b_QKV) split into q, k and v columns."""
    dk, h, kv = config.d_k, config.n_head, config.kv_heads
    spans = {"q": (0, h * dk), "k": (h * dk, (h + kv) * dk),
             "v": ((h + kv) * dk, (h + 2 * kv) * dk)}
    out = []
    for name in params:
        if name.endswith(("W_QKV", "b_QKV")):
            out += [Unit(f"{name}[{p}]", name, span) for p, span in spans.items()]
        else:
            out.append(Unit(name, name))
    return out


def _part(a: np.ndarray, unit: Unit) -> np.ndarray:
    return a if unit.cols is None else a[..., unit.cols[0]:unit.cols[1]]


def first_order(grads: dict, ref: dict, quant: dict, unit: Unit) -> float:
    """sum over the unit's entries of d log p / dW (at the quantized weights) * (W_ref - W_q)."""
    g = _part(np.asarray(grads[unit.param], np.float64), unit)
    d = _part(np.asarray(ref[unit.param], np.float64), unit) - \
        _part(np.asarray(quant[unit.param], np.float64), unit)
    return float((g * d).sum())


def with_restored(ref: dict, quant: dict, unit: Unit) -> dict:
    """The quantized parameters with this one unit back at the reference's values."""
    out = dict(quant)
    w = quant[unit.param].copy()
    if unit.cols is None:
        w[...] = ref[unit.param]
    else:
        w[..., unit.cols[0]:unit.cols[1]] = ref[unit.param][..., unit.cols[0]:unit.cols[1]]
    out[unit.param] = w
    return out


def log_prob(logits: np.ndarray, position: int, target: int) -> float:
    return float(ops.log_softmax(np.asarray(logits[position], np.float64))[target])


# --------------------------------------------------------------------- one text


@dataclass
class TensorShift:
    label: str  # the parameter (W_QKV as [q], [k], [v])
    relative: float  # ||W_ref - W_q|| / ||W_ref||
    estimate: float  # first-order change of log p(target) from restoring it
    restored: float | None = None  # the real change, computed for the largest estimates
    file: str | None = None  # the GGUF tensor it is, and that tensor's type
    kind: str | None = None


@dataclass
class QuantReport:
    """One text through the reference (ref) and the quantized model (q)."""

    ids: list[int]
    stages: list[str]  # "embeddings", "block 0", ...
    resid: np.ndarray  # [S, T] relative change of the residual stream
    resid_overall: np.ndarray  # [S] over all positions at once
    pattern_tv: np.ndarray  # [L, H, T] total variation of each head's pattern row
    kl: np.ndarray  # [T] KL(P_ref || P_q), nats
    top_ref: np.ndarray  # [T] top-1 ids
    top_q: np.ndarray
    position: int
    target: int
    logp_ref: float
    logp_q: float
    tensors: list[TensorShift] = field(default_factory=list)

    @property
    def same_top(self) -> np.ndarray:
        return self.top_ref == self.top_q

    @property
    def pattern_mean(self) -> np.ndarray:  # [L, H]
        return self.pattern_tv.mean(axis=-1)


def _stage_paths(config) -> list[str]:
    return ["layers.0.resid_pre"] + [f"layers.{i}.resid_post" for i in range(config.n_layer)]


def quant_report(ref: dict, quant: dict, config, ids, *, position: int = -1,
                 target: int | None = None, restore: int = 5,
                 hooks_q=None) -> QuantReport:
    """One text's ids through both parameter sets (the same config); `target` None: the
    reference's top-1 token at `position`. `restore`: how many of the largest first-order
    estimates are checked by putting the tensor back. `hooks_q` runs in the quantized model's
    passes (act_quant_hook); its backward treats it as the identity."""
    ids = np.asarray(ids)
    T = len(ids)
    position = position % T
    weights = [f"layers.{i}.weights" for i in range(config.n_layer)]
    stages = _stage_paths(config)
    l_ref, v_ref = mdl.record(ref, config, ids, stages + weights)
    l_q, v_q = mdl.record(quant, config, ids, hooks=hooks_q)
    top_ref = np.argmax(l_ref, axis=-1)
    target = int(top_ref[position]) if target is None else int(target)
    resid = np.stack([relative_change(v_ref[p], v_q[p]) for p in stages])
    overall = np.array([overall_change(v_ref[p], v_q[p]) for p in stages])
    tv = np.stack([total_variation(v_ref[w], v_q[w]) for w in weights])  # [L, H, T]
    logp_q = log_prob(l_q, position, target)
    shifts = tensor_shifts(ref, quant, config, ids, v_q, l_q, position, target, restore, hooks_q)
    return QuantReport([int(i) for i in ids], ["embeddings"] +
                       [f"block {i}" for i in range(config.n_layer)], resid, overall, tv,
                       kl_divergence(l_ref, l_q), top_ref, np.argmax(l_q, axis=-1), position,
                       target, log_prob(l_ref, position, target), logp_q, shifts)


def target_gradient(params: dict, config, values: dict, logits: np.ndarray, position: int,
                    target: int) -> dict:
    """d log p(target at position) / d every parameter, by the model's backward pass."""
    dlogits = np.zeros_like(logits)
    p = ops.softmax(np.asarray(logits[position], np.float64))
    onehot = np.zeros_like(p)
    onehot[target] = 1.0
    dlogits[position] = (onehot - p).astype(logits.dtype)
    grads, _ = mdl.backward(params, config, values, dlogits)
    return grads


def tensor_shifts(ref: dict, quant: dict, config, ids, values_q: dict, logits_q: np.ndarray,
                  position: int, target: int, restore: int, hooks_q=None) -> list[TensorShift]:
    """Every tensor that quantization changed, ranked by |first-order estimate|; the first
    `restore` also put back for real."""
    grads = target_gradient(quant, config, values_q, logits_q, position, target)
    logp_q = log_prob(logits_q, position, target)
    out = []
    for unit in tensor_units(quant, config):
        r, q = _part(ref[unit.param], unit), _part(quant[unit.param], unit)
        if np.array_equal(r, q):
            continue
        rel = overall_change(r, q)
        out.append((unit, TensorShift(unit.label, rel, first_order(grads, ref, quant, unit))))
    out.sort(key=lambda us: -abs(us[1].estimate))
    for unit, shift in out[:restore]:
        logits = mdl.forward(with_restored(ref, quant, unit), config, np.asarray(ids),
                             hooks=hooks_q)
        shift.restored = log_prob(logits, position, target) - logp_q
    return [s for _, s in out]


# --------------------------------------------------------------------- a text file


@dataclass
class FileKL:
    """llama-perplexity --kl-divergence's figures over a token stream (module docstring)."""

    n_ctx: int
    chunks: int
    kl: np.ndarray  # [chunks * (n_ctx - 1 - n_ctx // 2)] per scored position
    same_top: np.ndarray  # [same] bool
    p_diff: np.ndarray  # p_q(next) - p_ref(next)

    def summary(self) -> dict:
        n = self.kl.size
        return {"n_ctx": self.n_ctx, "chunks": self.chunks, "positions": int(n),
                "mean_kl": float(self.kl.mean()), "median_kl": float(np.median(self.kl)),
                "max_kl": float(self.kl.max()), "same_top": float(self.same_top.mean()),
                "rms_delta_p": float(np.sqrt((self.p_diff ** 2).mean()))}


def scored_positions(n_ctx: int) -> range:
    """The positions of a chunk whose next-token distributions llama.cpp scores."""
    return range(n_ctx // 2, n_ctx - 1)


def file_kl(ref: dict, quant: dict, config, stream, n_ctx: int, *, bos: int | None = None,
            hooks_q=None, progress=None) -> FileKL:
    """The stream (ids) in chunks of n_ctx from a fresh start each (the first token replaced
    by `bos` when given, as llama.cpp does when the vocabulary adds one)."""
    stream = np.asarray(stream)
    chunks = len(stream) // n_ctx
    kls, same, dps = [], [], []
    keep = np.array(scored_positions(n_ctx))
    for c in range(chunks):
        ids = stream[c * n_ctx:(c + 1) * n_ctx].copy()
        if bos is not None:
            ids[0] = bos
        l_ref = mdl.forward(ref, config, ids)[keep]
        l_q = mdl.forward(quant, config, ids, hooks=hooks_q)[keep]
        kls.append(kl_divergence(l_ref, l_q))
        same.append(np.argmax(l_ref, -1) == np.argmax(l_q, -1))
        nxt = stream[c * n_ctx + keep + 1]
        rows = np.arange(len(keep))
        dps.append(ops.softmax(np.asarray(l_q, np.float64))[rows, nxt]
                   - ops.softmax(np.asarray(l_ref, np.float64))[rows, nxt])
        if progress is not None:
            progress(1)
    if not chunks:
        return FileKL(n_ctx, 0, np.zeros(0), np.zeros(0, bool), np.zeros(0))
    return FileKL(n_ctx, chunks, np.concatenate(kls), np.concatenate(same), np.concatenate(dps))


# --------------------------------------------------------------------- --act-quant

# The type llama.cpp's CPU path rounds a product's input rows to before the dot products
# (ggml-cpu's type_traits_cpu[weight type].vec_dot_type). Q4_1 and Q5_1 take Q8_1, whose
# values are Q8_0's (the same scale amax/127 kept in float16, the same rounding; Q8_1 keeps
# the block's sum besides), so Q8_0's rounding stands for both. The K-quants, the IQ types
# but IQ4_NL, and the ternary TQ types take Q8_K (blocks of 256, `q8_k_rounded`).
ACT_TYPE = {"Q4_0": "Q8_0", "Q4_1": "Q8_0", "Q5_0": "Q8_0", "Q5_1": "Q8_0", "Q8_0": "Q8_0",
            "IQ4_NL": "Q8_0", "MXFP4": "Q8_0", "F16": "F16", "BF16": "BF16", "F32": None,
            **{k: "Q8_K" for k in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS",
                                   "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M",
                                   "IQ4_XS", "TQ1_0", "TQ2_0")}}
Q8_K_BLOCK = 256


def product_inputs(config, tied: bool) -> dict[str, list[str]]:
    """Each hooked value that enters a matrix product with a quantized weight -> the GGUF
    tensors it is multiplied by (the products --act-quant covers)."""
    fused = config.model_type in ("gpt2", "gpt_neox")
    out = {}
    for i in range(config.n_layer):
        b = f"blk.{i}."
        out[f"layers.{i}.ln1.out"] = [b + "attn_qkv.weight"] if fused else \
            [b + f"attn_{p}.weight" for p in "qkv"]
        out[f"layers.{i}.z"] = [b + "attn_output.weight"]
        out[f"layers.{i}.ln2.out"] = [b + "ffn_up.weight"] + \
            ([b + "ffn_gate.weight"] if config.mlp == "gated" else [])
        out[f"layers.{i}.mlp_post"] = [b + "ffn_down.weight"]
    out["ln_final.out"] = ["token_embd.weight" if tied else "output.weight"]
    return out


def activation_types(config, tensor_types: dict[str, str], tied: bool) -> dict[str, str | None]:
    """Each product input's rounding (ACT_TYPE of its weights' type: q, k and v of Q4_K and
    Q6_K alike take Q8_K); ValueError naming the first product whose weights' type it does
    not know, or whose weights llama.cpp rounds the input for in two ways (one hook cannot
    round one value twice)."""
    out = {}
    for path, tensors in product_inputs(config, tied).items():
        kinds = {t: tensor_types.get(t, "F32") for t in tensors}
        for t, kind in kinds.items():
            if kind not in ACT_TYPE:
                raise ValueError(f"{t} is {kind}: which rounding llama.cpp gives its input is "
                                 "not known here")
        rounds = {ACT_TYPE[k] for k in kinds.values()}
        if len(rounds) > 1:
            said = ", ".join(f"{k} ({ACT_TYPE[k] or 'none'})" for k in sorted(set(kinds.values())))
            raise ValueError(f"{path} enters products with weights of types {said}, each "
                             "rounding it otherwise: one rounding cannot stand for all")
        out[path] = rounds.pop()
    return out


def q8_0_rounded(x: np.ndarray) -> np.ndarray:
    """Rows of x [..., n] (n a multiple of 32) as Q8_0 blocks hold them when llama.cpp's x86
    CPU path makes them (ggml-cpu's quantize_row_q8_0, AVX): per block of 32, m the largest
    magnitude, the scale d = m/127 kept as a float16, q = round-half-even(x * (127/m)) in
    float32, the value float16(d) * q. (ggml's reference quantizer, and gguf's, multiply by
    1/d and round halves away from zero: they differ at ties.) Q8_1, Q4_1's and Q5_1's,
    holds the same values."""
    x32 = np.ascontiguousarray(x, np.float32)
    blocks = x32.reshape(-1, 32)
    m = np.abs(blocks).max(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(m == 0, np.float32(0), np.float32(127) / np.where(m == 0, 1, m))
    q = np.rint(blocks * inv.astype(np.float32)[:, None])
    d = (m / np.float32(127)).astype(np.float16).astype(np.float32)
    return (d[:, None] * q).astype(np.float32).reshape(x.shape).astype(x.dtype)


def q8_k_rounded(x: np.ndarray) -> np.ndarray:
    """Rows of x [..., n] (n a multiple of 256) as Q8_K blocks hold them (ggml's
    quantize_row_q8_K_ref, which x86's CPU path calls): per block of 256, m the value of the
    largest magnitude (the first such), iscale = -127/m in float32, q = min(127,
    round-half-even(iscale * x)), the value d * q with d = 1/iscale in float32 (Q8_K keeps d as
    a float32, not a float16); a block of zeros stays zeros."""
    x32 = np.ascontiguousarray(x, np.float32)
    blocks = x32.reshape(-1, Q8_K_BLOCK)
    at = np.abs(blocks).argmax(axis=1)
    top = blocks[np.arange(len(blocks)), at]
    zero = top == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(zero, np.float32(0), np.float32(-127) / np.where(zero, 1, top))
        iscale = iscale.astype(np.float32)
        q = np.minimum(np.float32(127), np.rint(iscale[:, None] * blocks))
        d = np.where(zero, np.float32(0), np.float32(1) / np.where(zero, 1, iscale))
    out = (d.astype(np.float32)[:, None] * q).astype(np.float32)
    return out.reshape(x.shape).astype(x.dtype)


def bf16_rounded(x: np.ndarray) -> np.ndarray:
    """x rounded to bfloat16 as ggml's GGML_FP32_TO_BF16 rounds (to nearest, ties to even),
    back in float32."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    up = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return up.view(np.float32).reshape(x.shape).astype(x.dtype)


def rounded_rows(x: np.ndarray, kind: str | None) -> np.ndarray:
    """Rows of x [..., n] as llama.cpp's CPU path hands them to the dot products: Q8_0 blocks
    of 32, Q8_K blocks of 256, float16, bfloat16, or unchanged."""
    if kind is None:
        return x
    if kind == "F16":
        return x.astype(np.float16).astype(x.dtype)
    if kind == "BF16":
        return bf16_rounded(x)
    if kind == "Q8_K":
        return q8_k_rounded(x)
    if kind == "Q8_0":
        return q8_0_rounded(x)
    raise ValueError(f"no rounding {kind}")


class ActQuant:
    """A hook rounding each product input as `activation_types` says: the heads' z [H, T, d_k]
    as the merged rows [T, H d_k] the output product reads."""

    def __init__(self, kinds: dict[str, str | None]):
        self.kinds = kinds

    def __call__(self, path: str, x: np.ndarray) -> np.ndarray:
        if path not in self.kinds or self.kinds[path] is None:
            return x
        if path.endswith(".z"):
            h, t, dk = x.shape[-3:]
            rows = np.swapaxes(x, -3, -2).reshape(*x.shape[:-3], t, h * dk)
            back = rounded_rows(rows, self.kinds[path]).reshape(*x.shape[:-3], t, h, dk)
            return np.ascontiguousarray(np.swapaxes(back, -3, -2))
        return rounded_rows(x, self.kinds[path])


# --------------------------------------------------------------------- two models


def check_pair(quant_model, ref_model) -> None:
    """The quantized model and its reference must read the same ids into the same shapes."""

    why = quant_model.tokenizer.differs_from(ref_model.tokenizer)
    if why is not None:
        raise InputError(f"the two models' tokenizers differ ({why}): quant compares a model "
                         "with its own quantized copy")
    differ = config_differences(quant_model.config, ref_model.config)
    if differ:
        k, (a, b) = next(iter(differ.items()))
        raise InputError(f"the two models differ in {k} ({a} vs {b}): quant compares a model "
                         "with its own quantized copy, of the same shapes")
    missing = set(ref_model.params) ^ set(quant_model.params)
    if missing:
        raise InputError(f"the two models differ in their parameters ({sorted(missing)[0]})")


def file_tensors(config, tensor_types: dict[str, str]) -> dict[str, tuple[str, str]]:
    """Each unit's label (tensor_units) -> (the GGUF tensor it is, its type); a fused
    attn_qkv is q's, k's and v's tensor alike."""

    out = {}
    for canonical, files in gguf_names(config).items():
        if canonical.endswith(("W_QKV", "b_QKV")):
            parts = files if len(files) == 3 else files * 3
            for p, f in zip("qkv", parts, strict=True):
                out[f"{canonical}[{p}]"] = (f, tensor_types.get(f, "?"))
        else:
            out[canonical] = (files[0], tensor_types.get(files[0], "?"))
    return out


def name_files(report: QuantReport, quant_model) -> None:
    """Each tensor shift's GGUF tensor and type, when the quantized model is a GGUF."""
    about = getattr(quant_model, "about", None)
    if not about or "tensors" not in about:
        return
    names = file_tensors(quant_model.config, about["tensors"])
    for s in report.tensors:
        s.file, s.kind = names.get(s.label, (None, None))


# tokenizer.ggml.pre values for which llama.cpp adds BOS to a byte-level BPE vocabulary when
# the file has no tokenizer.ggml.add_bos_token (llama-vocab.cpp's load: Llama 3's and the
# others it sets add_bos for)
BOS_BY_DEFAULT = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                  "midm-2.0", "lfm2", "jina-v5-nano", "tekken", "chameleon"}


def chunk_bos(quant_model) -> int | None:
    """The token llama.cpp puts first in the stream and in each chunk's place 0: the GGUF
    vocabulary's BOS when it adds one (tokenizer.ggml.add_bos_token; without the key,
    llama.cpp's default: SentencePiece vocabularies add it, a byte-level BPE one only with
    a pre-tokenizer of BOS_BY_DEFAULT, Llama 3's among them); None for a weights folder,
    whose tokenizer.json says what it adds itself."""
    about = (getattr(quant_model, "about", None) or {}).get("tokenizer")
    if not about or not isinstance(about.get("bos_token_id"), int):
        return None
    add = about.get("add_bos_token")
    if add is None:
        add = about.get("model") == "llama" or \
            (about.get("model") == "gpt2" and about.get("pre") in BOS_BY_DEFAULT)
    return int(about["bos_token_id"]) if add else None


def act_quant_hook(quant_model) -> tuple[ActQuant, list[str]]:
    """--act-quant for a GGUF model: the hook, and the products it covers (named by their
    inputs). InputError when the weights are no GGUF or of a type it cannot imitate."""

    about = getattr(quant_model, "about", None)
    if not about or "tensors" not in about:
        raise InputError("--act-quant imitates llama.cpp's rounding for the weights' types: "
                         "give the GGUF file as --weights")
    try:
        kinds = activation_types(quant_model.config, about["tensors"], quant_model.config.tied)
    except ValueError as e:
        raise InputError(f"--act-quant: {e}") from None
    kinds.update(attention_types(quant_model.config))
    return ActQuant(kinds), covered(kinds)


def covered(kinds: dict[str, str | None]) -> list[str]:
    """The rounded values folded over the blocks, each with its roundings:
    'layers.*.ln1.out (Q8_0)', 'layers.*.mlp_post (Q8_0, Q8_K)' where the blocks differ."""
    folded: dict[str, list[str]] = {}
    for path, kind in kinds.items():
        if kind is None:
            continue
        seen = folded.setdefault(re.sub(r"^layers\.\d+\.", "layers.*.", path), [])
        if kind not in seen:
            seen.append(kind)
    return [f"{p} ({', '.join(k)})" for p, k in folded.items()]


def attention_types(config) -> dict[str, str]:
    """The attention's own products as llama.cpp computes them with its default KV cache
    (float16, no flash attention): k (after its turn) and v stored as float16, and q and the
    pattern turned to float16 for the products with them (an F16 matrix's vec_dot_type)."""
    return {f"layers.{i}.{part}": "F16" for i in range(config.n_layer)
            for part in ("q", "k", "v", "weights")}
