"""Autoregressive generation: run, pick a token, append it, run again (card 11's loop)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from .config import Config
from .model import forward
from .sampling import check_temperature, next_token_distribution, sample


@dataclass
class Step:
    id: int
    chance: float  # the chance the token had in the distribution it was drawn from


def generate(
    params: dict[str, np.ndarray], config: Config, ids: list[int], max_new_tokens: int, *,
    temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
    rng: np.random.Generator, stop_id: int | None = None,
) -> Iterator[Step]:
    """Yield new tokens one at a time; stop after `stop_id` (yielded) or max_new_tokens.

    When the text outgrows the model's window, the model sees the last n_positions tokens.
    The temperature is checked now, before the caller has shown anything, not at the first
    token.
    """
    check_temperature(temperature)
    return _steps(params, config, list(ids), max_new_tokens, temperature, top_k, top_p, rng,
                  stop_id)


def _steps(params, config, context, max_new_tokens, temperature, top_k, top_p, rng,
           stop_id) -> Iterator[Step]:
    for _ in range(max_new_tokens):
        window = np.asarray(context[-config.n_positions:])
        last = forward(params, config, window, last_only=True)[-1]
        dist = next_token_distribution(last, temperature, top_k, top_p)
        token = sample(dist, rng) if temperature > 0 else int(np.argmax(dist))
        yield Step(token, float(dist[token]))
        if token == stop_id:
            return
        context.append(token)
