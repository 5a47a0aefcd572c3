"""The optimizers: AdamW with decoupled weight decay (Adam when the decay is 0), which
training, SAEs and the tuned lens all step, and plain SGD for training (TracIn's own setting);
the learning-rate schedule and gradient clipping."""

from __future__ import annotations

import math

import numpy as np


def decays(name: str) -> bool:
    """Weight decay on the matrices and the embedding table; none on biases, norms, positions."""
    return name.rsplit(".", 1)[-1].startswith("W_") and name != "embed.W_pos"


def lr_at(step: int, peak: float, warmup: int, total: int, floor: float = 0.1) -> float:
    """Linear warm-up to `peak`, then cosine decay to `floor * peak` at `total`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def clip_by_global_norm(grads: dict[str, np.ndarray], max_norm: float) -> float:
    """Scale all gradients together so their joint L2 norm is at most max_norm; return the norm."""
    norm = math.sqrt(sum(float(np.vdot(g, g)) for g in grads.values()))
    if max_norm > 0 and norm > max_norm:
        scale = max_norm / (norm + 1e-6)
        for g in grads.values():
            g *= scale
    return norm


class AdamW:
    """Adam's moments per parameter, made at the first step of a parameter not given; decay
    only on the names `decays` picks (the model's matrices; an SAE or a lens asks none)."""

    def __init__(self, params=None, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                 decays=decays):
        self.b1, self.b2 = betas
        self.eps = eps
        self.weight_decay = weight_decay
        self.decays = decays
        self.m = {n: np.zeros_like(p) for n, p in (params or {}).items()}
        self.v = {n: np.zeros_like(p) for n, p in (params or {}).items()}
        self.t = 0

    def step(self, params, grads, lr: float) -> None:
        """One update, in place. Decay is decoupled: p -= lr * wd * p, apart from Adam's step."""
        self.t += 1
        c1 = 1 - self.b1**self.t
        c2 = 1 - self.b2**self.t
        for n, p in params.items():
            g = grads[n]
            m = self.m.setdefault(n, np.zeros_like(p))
            v = self.v.setdefault(n, np.zeros_like(p))
            m *= self.b1
            m += (1 - self.b1) * g
            v *= self.b2
            v += (1 - self.b2) * (g * g)
            if self.weight_decay and self.decays(n):
                p *= 1 - lr * self.weight_decay
            p -= (lr / c1) * m / (np.sqrt(v / c2) + self.eps)

    def state(self) -> dict[str, np.ndarray]:
        out = {f"m/{n}": a for n, a in self.m.items()}
        out.update({f"v/{n}": a for n, a in self.v.items()})
        out["t"] = np.asarray(self.t)
        return out

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        for n in self.m:
            self.m[n][...] = state[f"m/{n}"]
            self.v[n][...] = state[f"v/{n}"]
        self.t = int(state["t"])


class SGD:
    """Plain gradient descent, p -= lr * g, with no momentum: the optimiser under which
    TracIn's scores (lr times a window's gradient dotted with the query's) are the first-order
    change each step made, so `why` is exact up to the snapshots' spacing. Weight decay, on
    the names `decays` picks, is p -= lr * wd * p, as AdamW's; the step count is its state."""

    def __init__(self, params=None, weight_decay=0.0, decays=decays):
        self.weight_decay = weight_decay
        self.decays = decays
        self.t = 0

    def step(self, params, grads, lr: float) -> None:
        """One update, in place."""
        self.t += 1
        for n, p in params.items():
            if self.weight_decay and self.decays(n):
                p *= 1 - lr * self.weight_decay
            p -= lr * grads[n]

    def state(self) -> dict[str, np.ndarray]:
        return {"t": np.asarray(self.t)}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        self.t = int(state["t"])


OPTIMIZERS = {"adamw": AdamW, "sgd": SGD}


SAE_BETAS = (0.9, 0.999)  # Adam's own defaults: what the SAE and the tuned lens are fitted with
