"""GPT-2 (`GPT2LMHeadModel`): the Hugging Face file layout <-> the canonical one.

GPT-2's Conv1D keeps its matrices as (in, out), the canonical orientation, and its fused
c_attn already is W_QKV (q, then k, then v, each split into heads of d_k), so a parameter's
canonical name is only another name for the same tensor: nothing is copied either way. The
output head is tied to W_E, so no lm_head is written; a file that has one must equal W_E.
"""

from __future__ import annotations

from ...escapes import shown
from ..config import Config, is_int, token_id
from ..schema import param_shapes

MODEL_TYPE = "gpt2"
LABEL = "GPT-2"  # as messages name the family
PREFIX = "transformer."
IGNORED = (".attn.bias", ".attn.masked_bias")  # old transformers buffers, not parameters
PLACES_BFLOAT16 = False  # its params_from_file gets bfloat16 tensors widened
# Hugging Face's module names (hooks name them): the blocks, the norm before the MLP,
# attention's output projection (the MLP is `mlp` in every family)
MODULES = ("transformer.h", "ln_2", "attn.c_proj")

# canonical pattern -> the file's name (without PREFIX), in the file's order
NAMES: dict[str, str] = {
    "embed.W_E": "wte.weight",
    "embed.W_pos": "wpe.weight",
    "layers.L.ln1.w": "h.L.ln_1.weight",
    "layers.L.ln1.b": "h.L.ln_1.bias",
    "layers.L.attn.W_QKV": "h.L.attn.c_attn.weight",
    "layers.L.attn.b_QKV": "h.L.attn.c_attn.bias",
    "layers.L.attn.W_O": "h.L.attn.c_proj.weight",
    "layers.L.attn.b_O": "h.L.attn.c_proj.bias",
    "layers.L.ln2.w": "h.L.ln_2.weight",
    "layers.L.ln2.b": "h.L.ln_2.bias",
    "layers.L.mlp.W_in": "h.L.mlp.c_fc.weight",
    "layers.L.mlp.b_in": "h.L.mlp.c_fc.bias",
    "layers.L.mlp.W_out": "h.L.mlp.c_proj.weight",
    "layers.L.mlp.b_out": "h.L.mlp.c_proj.bias",
    "ln_final.w": "ln_f.weight",
    "ln_final.b": "ln_f.bias",
}
_CANONICAL = {file: canonical for canonical, file in NAMES.items()}


def file_name(canonical: str) -> str:
    """layers.3.attn.W_QKV -> h.3.attn.c_attn.weight (without the transformer. prefix)."""
    head, _, rest = canonical.partition(".")
    if head == "layers":
        i, _, rest = rest.partition(".")
        return NAMES[f"layers.L.{rest}"].replace("h.L.", f"h.{i}.")
    return NAMES[canonical]


def block_of(name: str) -> int | None:
    """The block a tensor of the file belongs to (h.3.ln_1.weight: 3), or None."""
    parts = name.removeprefix(PREFIX).split(".")
    return int(parts[1]) if parts[0] == "h" and len(parts) > 1 and parts[1].isdigit() else None


def canonical_name(name: str) -> str | None:
    """h.3.attn.c_attn.weight (or with the transformer. prefix) -> layers.3.attn.W_QKV, or
    None for a name that is not one of GPT-2's parameters."""
    name = name.removeprefix(PREFIX)
    head, _, rest = name.partition(".")
    if head == "h":
        i, _, rest = rest.partition(".")
        if not i.isdigit():
            return None
        found = _CANONICAL.get(f"h.L.{rest}")
        return found.replace("layers.L.", f"layers.{int(i)}.") if found else None
    return _CANONICAL.get(name)


def file_shapes(config: Config) -> dict[str, tuple[int, ...]]:
    """Every tensor of the file by its short name, with its shape, in file order."""

    return {file_name(name): shape for name, shape in param_shapes(config).items()}


def params_from_file(tensors: dict, config: Config) -> dict:
    """The file's tensors by short name (already checked against file_shapes) -> canonical."""
    return {canonical_name(name): a for name, a in tensors.items() if name != "lm_head.weight"}


def params_to_file(params: dict, config: Config) -> dict:
    """Canonical params -> the tensors GPT2LMHeadModel.save_pretrained writes (tied head
    omitted)."""
    return {PREFIX + file_name(name): a for name, a in params.items()}


def config_from_hf(d: dict) -> Config:
    """Strict: sizes are JSON whole numbers (not 128.0, "128" or true); unknown keys, which
    a GPT-2 config has many of, are ignored."""
    act = d.get("activation_function", "gelu_new")
    if act not in ("gelu_new", "gelu_pytorch_tanh"):
        said = act if isinstance(act, str) else type(act).__name__
        raise ValueError(f"config: activation_function {said!r} is not supported (gelu_new)")
    # GPT-2 options that change the computation, which this model does not implement:
    # refused rather than silently computed the standard way
    for key, standard in (("scale_attn_weights", True),
                          ("scale_attn_by_inverse_layer_idx", False),
                          ("add_cross_attention", False),
                          ("tie_word_embeddings", True)):
        if key in d and d[key] is not standard:
            raise ValueError(f"config: {key} {d[key]!r} is not supported ({standard} only)")
    n_embd = d.get("n_embd", 128)
    n_inner = d.get("n_inner")
    if n_inner is None and is_int(n_embd):
        n_inner = 4 * n_embd
    positions = d["n_positions"] if "n_positions" in d else d.get("n_ctx", 128)
    vocab = d.get("vocab_size", 4096)
    special = {name: token_id(d.get(name), vocab) for name in SPECIAL_IDS}
    return Config(
        n_embd=n_embd,
        n_layer=d.get("n_layer", 4),
        n_head=d.get("n_head", 4),
        n_inner=n_inner,
        vocab_size=d.get("vocab_size", 4096),
        n_positions=positions,
        layer_norm_epsilon=d.get("layer_norm_epsilon", 1e-5),
        **{name: special[name] for name in ("bos_token_id", "eos_token_id")
           if special[name] is not None},
        unused=tuple(f"{name} {shown(d[name])}" for name in SPECIAL_IDS
                     if special[name] is None and d.get(name) is not None),
    )


# Read to be checked; pad_token_id only to be noted when it is outside the vocabulary (nothing
# in tinygpt pads).
SPECIAL_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def config_to_hf(config: Config) -> dict:
    """A valid `transformers.GPT2Config` dictionary."""
    return dict(
        n_embd=config.n_embd, n_layer=config.n_layer, n_head=config.n_head,
        n_inner=config.n_inner, vocab_size=config.vocab_size, n_positions=config.n_positions,
        layer_norm_epsilon=config.layer_norm_epsilon, bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        model_type=MODEL_TYPE,
        architectures=["GPT2LMHeadModel"],
        activation_function="gelu_new",
        n_ctx=config.n_positions,
        tie_word_embeddings=True,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        scale_attn_weights=True,
        use_cache=True,
    )

