"""Model sizes, read from a GPT-2 `config.json`; nothing else in the code hard-wires a size."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

# The vocabulary sizes training accepts (here, not in tokenizer.py, so that the CLI can name
# them in its help without importing `tokenizers`).
MIN_VOCAB = 257  # the 256 bytes of the byte-level alphabet and <|endoftext|>
MAX_VOCAB = 65535  # training keeps token ids as uint16


FLOAT32_TINY = 1.1754943508222875e-38  # the smallest normal float32


@dataclass(frozen=True)
class Config:
    n_embd: int = 128  # d, numbers per token
    n_layer: int = 4  # blocks
    n_head: int = 4  # heads per block
    n_inner: int = 512  # feed-forward width
    vocab_size: int = 4096
    n_positions: int = 128  # longest text, in tokens
    layer_norm_epsilon: float = 1e-5
    bos_token_id: int = 0
    eos_token_id: int = 0
    # What the config file said that tinygpt reads past (a special token id outside the
    # vocabulary, as transformers' default GPT2Config has), one line each, for `info`.
    unused: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        for name, most in LIMITS.items():
            value = getattr(self, name)
            if not _is_int(value) or value <= 0:
                raise ValueError(f"config: {name} must be a positive whole number, got {value!r}")
            if value > most:
                raise ValueError(f"config: {name} {value:,} is too large (at most {most:,})")
        eps = self.layer_norm_epsilon
        if not _is_number(eps) or not 0 < eps <= 1:  # NaN fails both comparisons
            raise ValueError(f"config: layer_norm_epsilon must be a number in (0, 1], got {eps!r}")
        if eps < FLOAT32_TINY:  # it would be 0 (or lose its digits) in float32
            raise ValueError(f"config: layer_norm_epsilon {eps!r} is 0 in float32, the precision "
                             "the model computes in: give a number from 1.2e-38 to 1")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"config: n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})"
            )
        for name in ("bos_token_id", "eos_token_id"):
            value = getattr(self, name)
            if not _is_int(value) or not 0 <= value < self.vocab_size:
                raise ValueError(f"config: {name} must be a token id from 0 to "
                                 f"{self.vocab_size - 1}, got {value!r}")

    @property
    def d_k(self) -> int:
        """Numbers per head."""
        return self.n_embd // self.n_head

    def to_hf_dict(self) -> dict:
        """A valid `transformers.GPT2Config` dictionary."""
        d = asdict(self)
        del d["unused"]
        d.update(
            model_type="gpt2",
            architectures=["GPT2LMHeadModel"],
            activation_function="gelu_new",
            n_ctx=self.n_positions,
            tie_word_embeddings=True,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            scale_attn_weights=True,
            use_cache=True,
        )
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Config:
        """Strict: sizes are JSON whole numbers (not 128.0, "128" or true); unknown keys, which
        a GPT-2 config has many of, are ignored."""
        if not isinstance(d, dict):
            raise ValueError(f"config: expected a JSON object, got {type(d).__name__}")
        act = d.get("activation_function", "gelu_new")
        if act not in ("gelu_new", "gelu_pytorch_tanh"):
            shown = act if isinstance(act, str) else type(act).__name__
            raise ValueError(f"config: activation_function {shown!r} is not supported (gelu_new)")
        # GPT-2 options that change the computation, which this model does not implement:
        # refused rather than silently computed the standard way
        for key, standard in (("scale_attn_weights", True),
                              ("scale_attn_by_inverse_layer_idx", False),
                              ("add_cross_attention", False)):
            if key in d and d[key] is not standard:
                raise ValueError(f"config: {key} {d[key]!r} is not supported ({standard} only)")
        n_embd = d.get("n_embd", 128)
        n_inner = d.get("n_inner")
        if n_inner is None and _is_int(n_embd):
            n_inner = 4 * n_embd
        positions = d["n_positions"] if "n_positions" in d else d.get("n_ctx", 128)
        vocab = d.get("vocab_size", 4096)
        special = {name: _token_id(d.get(name), vocab) for name in SPECIAL_IDS}
        return cls(
            n_embd=n_embd,
            n_layer=d.get("n_layer", 4),
            n_head=d.get("n_head", 4),
            n_inner=n_inner,
            vocab_size=d.get("vocab_size", 4096),
            n_positions=positions,
            layer_norm_epsilon=d.get("layer_norm_epsilon", 1e-5),
            **{name: special[name] for name in ("bos_token_id", "eos_token_id")
               if special[name] is not None},
            unused=tuple(f"{name} {_shown(d[name])}" for name in SPECIAL_IDS
                         if special[name] is None and d.get(name) is not None),
        )


# Read to be checked; pad_token_id only to be noted when it is outside the vocabulary (nothing
# in tinygpt pads).
SPECIAL_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")

# The largest size the loader accepts: far above GPT-2 XL (48 blocks of 1,600 numbers, 50,257
# tokens, 1,024 positions), far below what would exhaust memory before a file could say no.
LIMITS = {
    "n_embd": 1 << 16,
    "n_layer": 1024,
    "n_head": 1024,
    "n_inner": 1 << 18,
    "vocab_size": 1 << 20,
    "n_positions": 1 << 16,
}

MAX_CONFIG_BYTES = 1 << 20  # a GPT-2 config.json is about 1 kB


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _token_id(x, vocab_size) -> int | None:
    """A special token's id as tinygpt uses it: missing or null means 0, as GPT-2 configs
    without a special token have it; an id outside the vocabulary (transformers' default
    GPT2Config says 50256 whatever the vocabulary) is None: `transformers` loads such a
    config too, and these ids never change the computation, so it is noted, not refused."""
    if x is None:
        return 0
    if _is_int(x) and _is_int(vocab_size) and 0 <= x < vocab_size:
        return x
    return None


def _shown(x, most: int = 40) -> str:
    text = repr(x)
    return text if len(text) <= most else text[: most - 1] + "…"


def load_config(path: str | Path) -> Config:
    """Read and check a config.json; any fault is a ValueError with a one-line message."""
    path = Path(path)
    with open(path, "rb") as f:
        raw = f.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise ValueError(f"config: larger than {MAX_CONFIG_BYTES:,} bytes; not a GPT-2 config")
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("config: nested too deeply to be a GPT-2 config") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"config: not valid JSON ({e})") from None
    except ValueError as e:  # Python's own limit on integer strings, with its hint for coders
        if "integer string conversion" not in str(e):
            raise
        raise ValueError("config: a number of more than 4,300 digits; no size of a GPT-2 "
                         "model is anywhere near that large") from None
    return Config.from_dict(data)


def _no_constant(name: str):
    raise ValueError(f"config: {name} is not a number JSON allows")


def save_config(config: Config, path: str | Path) -> None:
    from .files import write_atomically

    text = json.dumps(config.to_hf_dict(), indent=2, sort_keys=True) + "\n"
    write_atomically(Path(path), text.encode("utf-8"))


def check_vocab_size(vocab_size: int) -> None:
    """A --vocab-size this tokenizer can have; else InputError (exit 2)."""
    from .errors import InputError

    if not MIN_VOCAB <= vocab_size <= MAX_VOCAB:
        raise InputError(f"--vocab-size must be from {MIN_VOCAB} (the 256 bytes and "
                         f"<|endoftext|>) to {MAX_VOCAB:,}, got {vocab_size:,}")


def check_training_memory(config: Config, batch_size: int) -> None:
    """Refuse sizes whose training state cannot fit in this machine's memory, before NumPy
    fails halfway with a MemoryError: parameters, gradients and two AdamW moments in float32,
    plus the activations of one batch (about 20 values of d per token and layer, and the
    attention grids)."""
    import math
    import os

    from .schema import param_shapes

    n = sum(math.prod(s) for s in param_shapes(config).values())
    tokens = batch_size * config.n_positions
    acts = tokens * config.n_layer * (20 * config.n_embd + 2 * config.n_inner
                                      + 3 * config.n_head * config.n_positions)
    need = 4 * (4 * n + acts + 2 * tokens * config.vocab_size)
    try:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    if need > have:
        raise ValueError(f"these sizes give {n:,} parameters; training them with batch "
                         f"{batch_size} needs about {need / 2**30:,.1f} GiB, and this machine "
                         f"has {have / 2**30:,.1f} GiB: choose smaller sizes")
