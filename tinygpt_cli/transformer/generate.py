"""Autoregressive generation: run, pick a token, append it, run again (card 11's loop),
with a key/value cache so each step computes one new position instead of the whole text."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass

import numpy as np

from .config import Config
from .hooks import Hook
from .model import KVCache, decode_step, forward, token_table
from .sampling import check_temperature, greedy, next_token_distribution, sample


@dataclass
class Step:
    id: int
    chance: float  # the chance the token had in the distribution it was drawn from


def next_logits_uncached(params, config: Config, context: list[int],
                         hooks: Hook | None = None) -> np.ndarray:
    """The reference: the whole window (the last n_positions tokens) from scratch."""
    window = np.asarray(context[-config.n_positions:])
    return forward(params, config, window, hooks=hooks, last_only=True)[-1]


class CachedContext:
    """The next-token logits of a growing text, computing each new position only once.

    The cache holds every block's keys and values for the tokens of the window so far, in
    preallocated float32 buffers (KVCache). Appending a token runs that one position through
    the model (`forward(..., cache, start=length, last_only=True)`).

    Once the text is longer than the context (n_positions tokens), the window slides by one
    token per step. Every token of the window then sits at a new position, and since the
    position embedding enters at the bottom, every key and value changes: the cache is
    recomputed for the last n_positions tokens, exactly as a full forward pass over them
    would see them. So the logits, and the tokens, equal those of the uncached loop.
    """

    def __init__(self, params, config: Config, ids: list[int],
                 hooks: Hook | None = None) -> None:
        self.params, self.config, self.hooks = params, config, hooks
        self.ids = list(ids)
        # float32 for real weights; float64 test weights keep their precision
        self.cache = KVCache.empty(config, dtype=token_table(params).dtype)
        self.logits = self._fill()

    def _fill(self) -> np.ndarray:
        """Prefill: the whole window into the cache; the last position's logits."""
        window = np.asarray(self.ids[-self.config.n_positions:])
        self.cache.length = 0
        return forward(self.params, self.config, window, hooks=self.hooks, cache=self.cache,
                       start=0, last_only=True)[-1]

    def append(self, token: int) -> np.ndarray:
        """Add one token; return the logits for the token after it."""
        self.ids.append(int(token))
        if len(self.ids) > self.config.n_positions:
            self.logits = self._fill()  # the window slid: recompute, see the class docstring
        else:
            self.logits = decode_step(self.params, self.config, int(token), self.cache,
                                      self.hooks)
        return self.logits


def generate(
    params: dict[str, np.ndarray], config: Config, ids: list[int], max_new_tokens: int, *,
    temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
    rng: np.random.Generator, stop_ids: Collection[int] = (), hooks: Hook | None = None,
    cached: bool = True,
) -> Iterator[Step]:
    """Yield new tokens one at a time; stop after any of `stop_ids` (yielded: the model's
    end tokens) or max_new_tokens.

    When the text outgrows the model's window, the model sees the last n_positions tokens
    (see CachedContext for how the cache follows). `hooks` (an ablation, say) apply to every
    position the model computes; nothing is recorded. `cached=False` recomputes the whole
    window each step: the reference the cached loop is tested against. The temperature is
    checked now, before the caller has shown anything, not at the first token.
    """
    check_temperature(temperature)
    # the prompt's pass now too, so that weights that overflow fail before anything is shown
    context = CachedContext(params, config, ids, hooks) if cached and max_new_tokens > 0 \
        else None
    return _steps(params, config, list(ids), max_new_tokens, temperature, top_k, top_p, rng,
                  frozenset(stop_ids), hooks, context)


def _steps(params, config, ids, max_new_tokens, temperature, top_k, top_p, rng, stop_ids,
           hooks, context: CachedContext | None) -> Iterator[Step]:
    if max_new_tokens <= 0:
        return
    cached = context is not None
    text = list(ids)
    last = context.logits if cached else next_logits_uncached(params, config, text, hooks)
    plain_greedy = temperature == 0 and not top_k and top_p in (None, 1.0)
    for n in range(max_new_tokens):
        if plain_greedy:  # the same token and chance, without an array of chances
            token, chance = greedy(last)
        else:
            dist = next_token_distribution(last, temperature, top_k, top_p)
            token = sample(dist, rng) if temperature > 0 else int(np.argmax(dist))
            chance = float(dist[token])
        yield Step(token, chance)
        if token in stop_ids or n == max_new_tokens - 1:
            return
        text.append(token)
        last = context.append(token) if cached else next_logits_uncached(params, config, text,
                                                                         hooks)
