"""Scoring speed: `tinygpt score --file part-005.txt` against the same windows in PyTorch.

Times the whole command (reading, tokenizing, every window, per-token surprisal, rank and
entropy, the summary) in-process with the NumPy model, then, when torch can be imported,
the same windows (the same batches, padding and positions scored) through a functional
GPT-2 written below in torch, loaded from the same safetensors file, computing the same
per-token numbers. Both use --threads threads (default 1, as the issue's budget is one core).

    python benchmarks/texts_speed.py                       # part-005 from the shared data
    python benchmarks/texts_speed.py --file story.txt --stride 64 --no-torch

Prints the seconds of each, their mean loss (which must agree), and the ratio numpy/torch of
the times (above 1: NumPy is slower).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from contextlib import redirect_stdout
from pathlib import Path

from train_speed import pin_threads  # the same folder: one way to pin the BLAS threads


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--file", type=Path, default=None, help="stories to score (default: "
                   "part-005.txt of the shared data beside the checkout)")
    p.add_argument("--stride", type=int, default=None, help="as score --stride")
    p.add_argument("--threads", type=int, default=1, help="BLAS and torch threads (default 1)")
    p.add_argument("--no-torch", action="store_true", help="time NumPy only")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    return p.parse_args(argv)


def default_file() -> Path:
    for parent in Path(__file__).resolve().parents:
        f = parent / "shared" / "data" / "tinystories" / "part-005.txt"
        if f.is_file():
            return f
    sys.exit("no part-005.txt found beside the checkout: give --file")


def time_numpy(file: Path, stride: int | None) -> tuple[float, dict]:
    from tinygpt_cli.cli import main

    argv = ["score", "--file", str(file), "--json"] + (["--stride", str(stride)] if stride else [])
    buf = io.StringIO()
    t0, c0 = time.perf_counter(), time.process_time()
    with redirect_stdout(buf):
        try:
            main(argv)
        except SystemExit as e:
            if e.code:
                sys.exit(f"tinygpt score failed with exit code {e.code}")
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    out = buf.getvalue()
    return dt, json.loads(out[out.rindex("\n", 0, -1) + 1 :]) | {"cpu_seconds": cpu}


def torch_forward(params, config):
    """The model as one torch function of a batch of ids -> ln_final output [B, T, d], from
    the tensors of a GPT-2 file (its own names, as transformers reads them)."""
    import torch
    import torch.nn.functional as F

    p = {k: torch.tensor(v) for k, v in params.items()}  # a copy: the file is mapped read-only
    d, h, eps = config.n_embd, config.n_head, config.layer_norm_epsilon

    def run(ids):
        b, t = ids.shape
        x = p["wte.weight"][ids] + p["wpe.weight"][:t]
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        for i in range(config.n_layer):
            pre = f"h.{i}."
            a = F.layer_norm(x, (d,), p[pre + "ln_1.weight"], p[pre + "ln_1.bias"], eps)
            qkv = a @ p[pre + "attn.c_attn.weight"] + p[pre + "attn.c_attn.bias"]
            q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in qkv.split(d, dim=-1))
            s = (q @ k.transpose(-1, -2)) / (d // h) ** 0.5
            z = s.masked_fill(mask, float("-inf")).softmax(-1) @ v
            z = z.transpose(1, 2).reshape(b, t, d)
            x = x + z @ p[pre + "attn.c_proj.weight"] + p[pre + "attn.c_proj.bias"]
            m = F.layer_norm(x, (d,), p[pre + "ln_2.weight"], p[pre + "ln_2.bias"], eps)
            m = F.gelu(m @ p[pre + "mlp.c_fc.weight"] + p[pre + "mlp.c_fc.bias"],
                       approximate="tanh")
            x = x + m @ p[pre + "mlp.c_proj.weight"] + p[pre + "mlp.c_proj.bias"]
        return F.layer_norm(x, (d,), p["ln_f.weight"], p["ln_f.bias"], eps)

    return run, p["wte.weight"]


def time_torch(file: Path, stride: int | None, threads: int) -> tuple[float, dict]:
    """The same work as `score --file`: read, tokenize, the same windows in the same batches,
    the same per-token numbers."""
    import numpy as np
    import torch

    from tinygpt_cli.analysis.score import windows
    from tinygpt_cli.jobs.corpus import read_stories
    from tinygpt_cli.transformer.folder import load_model

    torch.set_num_threads(threads)
    t0, c0 = time.perf_counter(), time.process_time()
    model = load_model()
    cfg, tok = model.config, model.tokenizer
    eot = tok.eot_id
    seqs = [np.asarray([eot] + ids + [eot]) for ids in tok.encode_batch(read_stories([file]))]
    ctx = cfg.n_positions
    jobs = [(i, w) for i, s in enumerate(seqs) for w in windows(len(s), ctx, stride or ctx)]
    jobs.sort(key=lambda j: -(j[1].end - j[1].start))
    from tinygpt_cli.storage.safetensors import read_safetensors

    tensors, _ = read_safetensors(model.weights_file)  # the file's GPT-2 names
    run, wte = torch_forward({k.removeprefix("transformer."): v for k, v in tensors.items()},
                             cfg)
    total, count, records = 0.0, 0, []
    with torch.inference_mode():
        for b in range(0, len(jobs), 32):
            chunk = jobs[b : b + 32]
            width = max(w.end - w.start for _, w in chunk)
            x = np.zeros((len(chunk), width), dtype=np.int64)
            rows, cols, tgt = [], [], []
            for r, (i, w) in enumerate(chunk):
                x[r, : w.end - w.start] = seqs[i][w.start : w.end]
                t = np.arange(w.first, w.end + 1)
                rows.append(np.full(len(t), r))
                cols.append(t - 1 - w.start)
                tgt.append(seqs[i][t])
            u = run(torch.from_numpy(x))
            logits = u[torch.from_numpy(np.concatenate(rows)), torch.from_numpy(
                np.concatenate(cols))] @ wte.T
            target = torch.from_numpy(np.concatenate(tgt).astype(np.int64))
            logp = logits.log_softmax(-1)
            nats = -logp.gather(1, target[:, None])[:, 0]
            entropy = -(logp.exp() * logp).sum(-1)
            rank = 1 + (logits > logits.gather(1, target[:, None])).sum(-1)
            records.append((nats.numpy(), entropy.numpy(), rank.numpy()))
            total += float(nats.double().sum())
            count += len(target)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    return dt, {"tokens": count, "mean_nats": total / count, "cpu_seconds": cpu}


def main(argv=None) -> None:
    args = parse_args(argv)
    pin_threads(args.threads)
    file = args.file or default_file()
    out = {"file": str(file), "threads": args.threads, "stride": args.stride}
    print(f"scoring {file} on {args.threads} thread(s) ...", file=sys.stderr)
    t_np, s_np = time_numpy(file, args.stride)
    out["numpy"] = {"seconds": t_np, "cpu_seconds": s_np["cpu_seconds"],
                    "tokens": s_np["tokens"], "mean_nats": s_np["mean_nats"]}
    lines = [f"numpy  {t_np:6.2f} s (cpu {s_np['cpu_seconds']:.2f} s)  {s_np['tokens']:,} tokens  "
             f"{s_np['tokens'] / t_np:,.0f} tokens/s  mean loss {s_np['mean_nats']:.5f}"]
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and not args.no_torch:
        t_pt, s_pt = time_torch(file, args.stride, args.threads)
        out["torch"] = {"version": torch.__version__, "seconds": t_pt, **s_pt}
        out["ratio_numpy_over_torch"] = t_np / t_pt
        lines.append(f"torch  {t_pt:6.2f} s (cpu {s_pt['cpu_seconds']:.2f} s)  "
                     f"{s_pt['tokens']:,} tokens  "
                     f"{s_pt['tokens'] / t_pt:,.0f} tokens/s  mean loss {s_pt['mean_nats']:.5f}"
                     f"  (torch {torch.__version__})")
        out["cpu_ratio_numpy_over_torch"] = s_np["cpu_seconds"] / s_pt["cpu_seconds"]
        lines.append(f"numpy/torch time ratio {t_np / t_pt:.2f} (cpu time "
                     f"{s_np['cpu_seconds'] / s_pt['cpu_seconds']:.2f})")
    if args.json:
        print(json.dumps(out))
    else:
        print("\n".join(lines))


if __name__ == "__main__":
    main()
