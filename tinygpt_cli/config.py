"""Model sizes, read from a GPT-2 `config.json`; nothing else in the code hard-wires a size."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path


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

    def __post_init__(self) -> None:
        for name in ("n_embd", "n_layer", "n_head", "n_inner", "vocab_size", "n_positions"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"config: {name} must be a positive integer")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"config: n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})"
            )

    @property
    def d_k(self) -> int:
        """Numbers per head."""
        return self.n_embd // self.n_head

    def to_hf_dict(self) -> dict:
        """A valid `transformers.GPT2Config` dictionary."""
        d = asdict(self)
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
        n_embd = int(d.get("n_embd", 128))
        n_inner = d.get("n_inner")
        act = d.get("activation_function", "gelu_new")
        if act not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"config: activation_function {act!r} is not supported (gelu_new)")
        return cls(
            n_embd=n_embd,
            n_layer=int(d.get("n_layer", 4)),
            n_head=int(d.get("n_head", 4)),
            n_inner=int(n_inner) if n_inner is not None else 4 * n_embd,
            vocab_size=int(d.get("vocab_size", 4096)),
            n_positions=int(d.get("n_positions", d.get("n_ctx", 128))),
            layer_norm_epsilon=float(d.get("layer_norm_epsilon", 1e-5)),
            bos_token_id=int(d.get("bos_token_id", 0) or 0),
            eos_token_id=int(d.get("eos_token_id", 0) or 0),
        )


def load_config(path: str | Path) -> Config:
    return Config.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))


def save_config(config: Config, path: str | Path) -> None:
    from .files import write_atomically

    text = json.dumps(config.to_hf_dict(), indent=2, sort_keys=True) + "\n"
    write_atomically(Path(path), text.encode("utf-8"))
