"""Training speed: full NumPy training steps against the same step in PyTorch.

One step is what `tinygpt train` does per batch: sample B windows of T tokens, forward with
dropout, cross-entropy, backward, clip the global gradient norm to 1, AdamW. The model has
the shipped sizes (tinygpt_cli.transformer.config.Config()). When torch can be imported, the
same step runs in PyTorch in the same process, the two taking steps in turns, on a plain
GPT-2 written below with the same shapes, dropout sites, tied head, weight-decay groups and
thread count.

    python benchmarks/train_speed.py --steps 20          # B=32, T=128, 2 threads
    python benchmarks/train_speed.py --steps 20 --no-torch --threads 1

Prints tokens/s for each (from the median step) and the ratio numpy/torch (below 1: NumPy
is slower).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time

THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20, help="timed steps per framework (default 20)")
    p.add_argument("--warmup-steps", type=int, default=1,
                   help="untimed steps first, for caches and allocators (default 1)")
    p.add_argument("--batch", type=int, default=32, help="B, windows per step (default 32)")
    p.add_argument("--seq", type=int, default=128, help="T, tokens per window (default 128)")
    p.add_argument("--threads", type=int, default=2,
                   help="BLAS threads for NumPy and torch.set_num_threads (default 2)")
    p.add_argument("--dropout", type=float, default=0.1, help="as in training (default 0.1)")
    p.add_argument("--torch-attention", choices=("manual", "sdpa"), default="manual",
                   help="manual: scores, mask, softmax as the NumPy code does (default); "
                        "sdpa: torch's fused scaled_dot_product_attention")
    p.add_argument("--no-torch", action="store_true", help="time NumPy only")
    p.add_argument("--json", action="store_true", help="print one JSON document instead")
    args = p.parse_args(argv)
    for name in ("steps", "batch", "seq", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    if args.warmup_steps < 0 or not 0.0 <= args.dropout < 1.0:
        p.error("--warmup-steps must be >= 0 and --dropout in [0, 1)")
    return args


def pin_threads(threads: int) -> None:
    """BLAS libraries read their thread count once, when loaded: set it first, or re-exec."""
    wanted = str(threads)
    if all(os.environ.get(v) == wanted for v in THREAD_VARS):
        return
    for v in THREAD_VARS:
        os.environ[v] = wanted
    if "numpy" in sys.modules:  # too late for this interpreter: start again with the variables
        os.execv(sys.executable, [sys.executable, *sys.argv])


def summary(name: str, version: str, times: list[float], tokens_per_step: int,
            losses: list[float]) -> dict:
    total = sum(times)
    return {
        "framework": name,
        "version": version,
        "steps": len(times),
        "ms_per_step_mean": 1000 * total / len(times),
        "ms_per_step_median": 1000 * statistics.median(times),
        # from the median step, as every other figure: one step slowed by the machine (this
        # VM has them) moves a mean of ten by a tenth of its delay
        "tokens_per_s": tokens_per_step / statistics.median(times),
        "loss_first": losses[0],
        "loss_last": losses[-1],
    }


# ------------------------------------------------------------------------------------- NumPy


def numpy_trainer(config, args, stream, seed: int):
    """One NumPy training step per call -> (seconds, loss)."""
    import numpy as np

    from tinygpt_cli.transformer.model import init_params, loss_and_grads
    from tinygpt_cli.transformer.optim import AdamW, clip_by_global_norm
    from tinygpt_cli.transformer.windows import random_windows

    rng = np.random.default_rng(seed)
    params = init_params(config, rng)
    opt = AdamW(params, weight_decay=0.1)

    def step() -> tuple[float, float]:
        t0 = time.perf_counter()
        x, y = random_windows(stream, args.batch, args.seq, rng)
        loss, grads = loss_and_grads(params, config, x, y, dropout=args.dropout, rng=rng)
        clip_by_global_norm(grads, 1.0)
        opt.step(params, grads, 1e-3)
        return time.perf_counter() - t0, loss

    return step


# ------------------------------------------------------------------------------------- torch


def torch_model(config, dropout: float, attention: str = "manual"):
    """GPT-2 in torch with the NumPy model's layout: pre-norm blocks, tanh GELU, dropout on
    the embeddings and on each attention and MLP output, head tied to the token table."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    d, h, p_drop = config.n_embd, config.n_head, dropout

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(d, eps=config.layer_norm_epsilon)
            self.c_attn = nn.Linear(d, 3 * d)
            self.c_proj = nn.Linear(d, d)
            self.ln_2 = nn.LayerNorm(d, eps=config.layer_norm_epsilon)
            self.c_fc = nn.Linear(d, config.n_inner)
            self.mlp_proj = nn.Linear(config.n_inner, d)

        def attention(self, x):
            b, t, _ = x.shape
            q, k, v = self.c_attn(x).split(d, dim=-1)  # 3 x [B, T, d]
            q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))  # [B, H, T, dk]
            if attention == "sdpa":
                z = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                scores = q @ k.transpose(-1, -2) / math.sqrt(d // h)  # [B, H, T, T]
                mask = torch.ones(t, t, dtype=torch.bool).triu(1)
                z = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
            return self.c_proj(z.transpose(1, 2).reshape(b, t, d))

        def forward(self, x):
            x = x + F.dropout(self.attention(self.ln_1(x)), p_drop, self.training)
            mlp = self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
            return x + F.dropout(mlp, p_drop, self.training)

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(config.vocab_size, d)
            self.wpe = nn.Embedding(config.n_positions, d)
            self.h = nn.ModuleList(Block() for _ in range(config.n_layer))
            self.ln_f = nn.LayerNorm(d, eps=config.layer_norm_epsilon)
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                elif "ln_" in name:
                    nn.init.ones_(p)
                elif name.endswith(("c_proj.weight", "mlp_proj.weight")):
                    nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * config.n_layer))
                else:
                    nn.init.normal_(p, 0.0, 0.02)

        def forward(self, ids):
            t = ids.shape[1]
            x = F.dropout(self.wte(ids) + self.wpe.weight[:t], p_drop, self.training)
            for block in self.h:
                x = block(x)
            return self.ln_f(x) @ self.wte.weight.T  # tied head, no bias

    return GPT()


def torch_trainer(config, args, stream, seed: int):
    """One PyTorch training step per call -> (seconds, loss)."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from tinygpt_cli.transformer.optim import decays
    from tinygpt_cli.transformer.windows import random_windows

    torch.set_num_threads(args.threads)
    torch.manual_seed(seed)
    model = torch_model(config, args.dropout, args.torch_attention).train()

    named = list(model.named_parameters())  # decays(): the NumPy rule works on these names
    groups = [{"params": [p for n, p in named if decays(n)], "weight_decay": 0.1},
              {"params": [p for n, p in named if not decays(n)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    rng = np.random.default_rng(seed)

    def step() -> tuple[float, float]:
        t0 = time.perf_counter()
        x, y = random_windows(stream, args.batch, args.seq, rng)
        x, y = torch.from_numpy(x), torch.from_numpy(y)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return time.perf_counter() - t0, loss.item()

    return step


def in_turns(steps: list, warmup: int, timed: int) -> list[tuple[list[float], list[float]]]:
    """Each trainer's (times, losses), its steps taken in turns (numpy, torch, numpy, ...):
    this machine's speed drifts by tens of percent over a minute, and in turns a drift slows
    both alike instead of whichever ran second."""
    out: list[tuple[list[float], list[float]]] = [([], []) for _ in steps]
    for i in range(warmup + timed):
        for step, (times, losses) in zip(steps, out, strict=True):
            time.sleep(0.2)  # untimed: the other side's BLAS/OpenMP threads stop spinning
            dt, loss = step()
            if i >= warmup:
                times.append(dt)
                losses.append(loss)
    return out


# -------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pin_threads(args.threads)

    import numpy as np

    from tinygpt_cli.transformer.config import Config

    shipped = Config()
    config = Config(**{**shipped.__dict__, "n_positions": max(shipped.n_positions, args.seq)})
    # Token ids drawn at random: speed does not depend on the text.
    stream = np.random.default_rng(0).integers(0, config.vocab_size, 200_000).astype(np.uint16)
    tokens_per_step = args.batch * args.seq
    shape = (f"B={args.batch} T={args.seq} d={config.n_embd} layers={config.n_layer} "
             f"heads={config.n_head} ff={config.n_inner} vocab={config.vocab_size} "
             f"dropout={args.dropout} threads={args.threads}")
    log = (lambda s: None) if args.json else (lambda s: print(s, file=sys.stderr, flush=True))

    trainers = [("numpy", np.__version__, numpy_trainer(config, args, stream, 0))]
    log(f"numpy {np.__version__}: {args.warmup_steps}+{args.steps} steps, {shape}")
    torch_note = None
    if args.no_torch:
        torch_note = "skipped (--no-torch)"
    else:
        try:
            import torch
        except ImportError:
            torch_note = "not installed: NumPy only"
        else:
            log(f"torch {torch.__version__}: {args.warmup_steps}+{args.steps} steps, {shape}, "
                f"attention {args.torch_attention}; the two in turns")
            trainers.append(("torch", torch.__version__, torch_trainer(config, args, stream, 0)))
    runs = in_turns([t[2] for t in trainers], args.warmup_steps, args.steps)
    results = [summary(name, version, times, tokens_per_step, losses)
               for (name, version, _), (times, losses) in zip(trainers, runs, strict=True)]

    ratio = (results[0]["tokens_per_s"] / results[1]["tokens_per_s"]) if len(results) > 1 else None
    if args.json:
        print(json.dumps({"batch": args.batch, "seq": args.seq, "threads": args.threads,
                          "dropout": args.dropout, "torch_attention": args.torch_attention,
                          "config": config.__dict__, "machine": platform.machine(),
                          "python": platform.python_version(), "results": results,
                          "numpy_over_torch": ratio, "torch": torch_note}, indent=2))
        return 0
    for r in results:
        print(f"{r['framework']:<6} {r['version']:<14} {r['tokens_per_s']:>10,.0f} tokens/s  "
              f"{r['ms_per_step_mean']:>8.1f} ms/step (median {r['ms_per_step_median']:.1f})  "
              f"loss {r['loss_first']:.3f} -> {r['loss_last']:.3f}")
    if ratio is not None:
        print(f"numpy/torch tokens/s: {ratio:.2f}")
    else:
        print(f"torch: {torch_note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
