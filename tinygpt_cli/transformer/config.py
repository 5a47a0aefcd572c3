"""Model sizes, read from a GPT-2 `config.json`; nothing else in the code hard-wires a size."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import InputError
from ..escapes import shown

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
    # The architecture: which converter reads and writes the family's files, and the knobs
    # model.py dispatches on (ARCHITECTURES lists the values each knob takes).
    model_type: str = "gpt2"
    norm: str = "layer"  # layer: (x - mean) / std * w + b; rms: x / rms * w
    positions: str = "learned"  # learned: W_pos rows added to the embeddings; rotary: q, k turned
    mlp: str = "gelu"  # gelu: act(x W_in + b_in) W_out + b_out; gated: act(x W_gate) * x W_in
    act: str = "gelu_new"  # gelu_new: GELU's tanh form; gelu: erf's; silu: x sigmoid(x)
    tied: bool = True  # the output head is W_E; untied: its own rows, unembed.W_U
    parallel: bool = False  # attention and MLP both read resid_pre (GPT-NeoX), or in turn
    head_dim: int = 0  # numbers per head; 0: n_embd / n_head
    n_kv_head: int = 0  # heads of keys and values, shared by groups of queries; 0: n_head
    rotary_dim: int = 0  # numbers of each head turned by the rotary positions; 0: all
    rotary_base: float = 10000.0
    # rope scaling: (factor,) linear (every rate divided by factor); Llama 3's (factor,
    # low_freq_factor, high_freq_factor, original context); (): none
    rope_scaling: tuple = ()
    attn_scale: float = 0.0  # scores = q k * attn_scale; 0: 1 / sqrt(d_k); GPT-Neo: 1
    windows: tuple[int, ...] = ()  # per block, the keys a query sees (0: all); (): all, everywhere
    qk_norm: bool = False  # an RMSNorm on each head's q and k (Qwen3)
    # a norm after attention and one after the MLP, each before its residual add (Gemma 3)
    post_norms: bool = False
    rotary_bases: tuple[float, ...] = ()  # per block, its rotary base; (): rotary_base, everywhere
    embed_scale: float = 0.0  # the token embeddings times this (Gemma: sqrt(d)); 0: not scaled
    qkv_bias: bool = True  # biases on q, k, v
    out_bias: bool = True  # a bias on the attention output
    mlp_bias: bool = True  # biases on the MLP's products
    # What the config file said that tinygpt reads past (a special token id outside the
    # vocabulary, as transformers' default GPT2Config has), one line each, for `info`.
    unused: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        # as a JSON record (a checkpoint's) gives them
        for name in ("windows", "rope_scaling", "rotary_bases"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        for name, allowed in ARCHITECTURES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"config: {name} {shown(getattr(self, name))} is not "
                                 f"implemented (only {', '.join(map(repr, allowed))})")
        for name, most in LIMITS.items():
            value = getattr(self, name)
            if not is_int(value) or value <= 0:
                raise ValueError(f"config: {name} must be a positive whole number, got {value!r}")
            if value > most:
                raise ValueError(f"config: {name} {value:,} is too large (at most {most:,})")
        eps = self.layer_norm_epsilon
        if not is_number(eps) or not 0 < eps <= 1:  # NaN fails both comparisons
            raise ValueError(f"config: layer_norm_epsilon must be a number in (0, 1], got {eps!r}")
        if eps < FLOAT32_TINY:  # it would be 0 (or lose its digits) in float32
            raise ValueError(f"config: layer_norm_epsilon {eps!r} is 0 in float32, the precision "
                             "the model computes in: give a number from 1.2e-38 to 1")
        if self.n_embd % self.n_head and not self.head_dim:
            raise ValueError(
                f"config: n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})"
            )
        for name in ("bos_token_id", "eos_token_id"):
            value = getattr(self, name)
            if not is_int(value) or not 0 <= value < self.vocab_size:
                raise ValueError(f"config: {name} must be a token id from 0 to "
                                 f"{self.vocab_size - 1}, got {value!r}")
        self._check_architecture()  # after the sizes: it divides them

    def _check_architecture(self) -> None:
        for name in ("head_dim", "n_kv_head", "rotary_dim"):
            value = getattr(self, name)
            if not is_int(value) or not 0 <= value <= 1 << 16:
                raise ValueError(f"config: {name} must be a whole number from 0, got "
                                 f"{shown(value)}")
        kv = self.kv_heads
        if not is_int(self.n_head) or self.n_head % kv:
            raise ValueError(f"config: n_head ({self.n_head}) must be a multiple of the "
                             f"key/value heads ({kv})")
        rot = self.rotary_dim or self.d_k
        if self.positions == "rotary" and (rot % 2 or rot > self.d_k):
            raise ValueError(f"config: the rotary part of a head ({rot}) must be even and at "
                             f"most the head's {self.d_k} numbers")
        for name in ("rotary_base", "attn_scale"):
            value = getattr(self, name)
            if not is_number(value) or not 0 <= value < 1e30:
                raise ValueError(f"config: {name} must be a finite number, got {shown(value)}")
        if self.rotary_base <= 0 and self.positions == "rotary":
            raise ValueError(f"config: rotary_base must be positive, got {self.rotary_base}")
        if self.windows and (len(self.windows) != self.n_layer
                             or not all(is_int(w) and w >= 0 for w in self.windows)):
            raise ValueError(f"config: windows must give one whole number per block "
                             f"({self.n_layer}), got {shown(self.windows)}")
        if self.rotary_bases and (len(self.rotary_bases) != self.n_layer or not all(
                is_number(b) and 0 < b < 1e30 for b in self.rotary_bases)):
            raise ValueError(f"config: rotary_bases must give one positive number per block "
                             f"({self.n_layer}), got {shown(self.rotary_bases)}")
        if not is_number(self.embed_scale) or not 0 <= self.embed_scale < 1e30:
            raise ValueError(f"config: embed_scale must be a finite number, got "
                             f"{shown(self.embed_scale)}")
        if self.post_norms and self.parallel:
            raise ValueError("config: norms after the branches of a parallel block are not "
                             "implemented")
        if len(self.rope_scaling) not in (0, 1, 4) or not all(
                is_number(v) and v > 0 for v in self.rope_scaling):
            raise ValueError(f"config: rope_scaling must be (), (factor,) or llama3's four "
                             f"positive numbers, got {shown(self.rope_scaling)}")
        if self.mlp == "gated" and self.mlp_bias:
            raise ValueError("config: a gated MLP with biases is not implemented")

    @property
    def d_k(self) -> int:
        """Numbers per head."""
        return self.head_dim or self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        """Heads of keys and values (grouped-query attention shares each among n_head /
        kv_heads queries; GPT-2: every head its own)."""
        return self.n_kv_head or self.n_head

    @property
    def rotary(self) -> int:
        """Numbers of each head that the rotary positions turn (0: learned positions)."""
        return (self.rotary_dim or self.d_k) if self.positions == "rotary" else 0

    @property
    def scale(self) -> float:
        """What q k is multiplied by to make a score."""
        return self.attn_scale or 1.0 / self.d_k ** 0.5

    def window(self, layer: int) -> int:
        """How many keys back a query of block `layer` sees, itself included (0: all)."""
        return self.windows[layer] if self.windows else 0

    def rotary_base_of(self, layer: int) -> float:
        """The rotary base of block `layer` (Gemma 3: one for its sliding-window blocks,
        one for its full-attention blocks)."""
        return self.rotary_bases[layer] if self.rotary_bases else self.rotary_base


# The values of each architecture knob that model.py implements.
ARCHITECTURES = {"norm": ("layer", "rms"), "positions": ("learned", "rotary"),
                 "mlp": ("gelu", "gated"), "act": ("gelu_new", "gelu", "silu"),
                 "tied": (True, False), "parallel": (False, True),
                 "qk_norm": (False, True), "post_norms": (False, True),
                 "qkv_bias": (True, False), "out_bias": (True, False),
                 "mlp_bias": (True, False)}

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


def is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def token_id(x, vocab_size) -> int | None:
    """A special token's id as tinygpt uses it: missing or null means 0, as GPT-2 configs
    without a special token have it; an id outside the vocabulary (transformers' default
    GPT2Config says 50256 whatever the vocabulary) is None: `transformers` loads such a
    config too, and these ids never change the computation, so it is noted, not refused."""
    if x is None:
        return 0
    if is_int(x) and is_int(vocab_size) and 0 <= x < vocab_size:
        return x
    return None


def check_vocab_size(vocab_size: int) -> None:
    """A --vocab-size this tokenizer can have; else InputError (exit 2)."""

    if not MIN_VOCAB <= vocab_size <= MAX_VOCAB:
        raise InputError(f"--vocab-size must be from {MIN_VOCAB} (the 256 bytes and "
                         f"<|endoftext|>) to {MAX_VOCAB:,}, got {vocab_size:,}")


