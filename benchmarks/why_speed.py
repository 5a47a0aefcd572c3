"""How long `tinygpt why` takes on the shipped model and its whole training text, and how
well the index's ranking recovers exact TracIn's.

    python benchmarks/why_speed.py [--data ../shared/data/tinystories] [--recall]

1. First query, empty cache: the index of every window's gradient is built (wall time of
   the whole process, default settings, both cores), then the answer.
2. Later queries, other texts: a fresh process each (wall time).
3. --recall N (slow: about 15 minutes a query on 2 cores): exact TracIn of every window for each
   query, by directional derivatives (central differences of each window's mean loss along
   the query gradient, batched, one process per core), and how many of the exact top 20 the
   index's top 20 holds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

QUERIES = [("Lily wanted to play with her", " toys"),
           ("Once upon a time, there was a little", " girl"),
           ("The dog barked at the", " cat"),
           ("Tom and Sam went to the", " park")]


def run_why(text: str, target: str, env: dict, data: str | None) -> tuple[float, dict]:
    cmd = [sys.executable, "-m", "tinygpt_cli", "why", text, "--target", target, "--json"]
    if data:
        cmd += ["--data", data]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return time.perf_counter() - t0, json.loads(out.stdout)


def exact_scores_part(args) -> np.ndarray:
    """Exact <grad mean loss(w), q> for windows [lo, hi) at one snapshot, by a central
    difference along q (eps 1e-2 along the unit direction, in float32)."""
    from tinygpt_cli.analysis import why
    from tinygpt_cli.transformer import ops
    from tinygpt_cli.transformer.folder import load_model, load_params
    from tinygpt_cli.transformer.model import forward

    weights, path, ids, target, lo, hi, stream = args
    model = load_model(weights)
    config = model.config
    params = {n: np.asarray(a, np.float32) for n, a in load_params(Path(path), config).items()}
    q = why.query_gradient(params, config, ids, target)
    norm = float(np.sqrt(sum(np.sum(np.square(q[n], dtype=np.float64)) for n in q)))
    eps = 1e-2
    up = {n: (params[n] + eps * q[n] / norm).astype(np.float32) for n in params}
    down = {n: (params[n] - eps * q[n] / norm).astype(np.float32) for n in params}
    x, y = why.windows(np.load(stream), config.n_positions)
    out = []
    for i in range(lo, hi, 32):
        xs, ys = x[i : min(i + 32, hi)], y[i : min(i + 32, hi)]

        def loss(p, xs=xs, ys=ys):
            logp = ops.log_softmax(forward(p, config, xs).astype(np.float64))
            return -np.take_along_axis(logp, ys[..., None], -1)[..., 0].mean(-1)

        out.append((loss(up) - loss(down)) * norm / (2 * eps))
    return np.concatenate(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=None, help="default: the record in weights/data.json")
    ap.add_argument("--recall", type=int, default=0, metavar="N",
                    help="check the first N queries against exact TracIn (slow)")
    ap.add_argument("--cache", default=None, help="use this cache folder (default: a new one)")
    args = ap.parse_args(argv)
    cache = args.cache or tempfile.mkdtemp(prefix="tinygpt-why-bench-")
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    env["TINYGPT_CACHE"] = cache
    env["PYTHONPATH"] = str(ROOT)
    built = not any(Path(cache).glob("why-tracin/*/index.json"))
    first, doc = run_why(*QUERIES[0], env, args.data)
    size = sum(f.stat().st_size for f in Path(cache).rglob("*") if f.is_file())
    what = "first query, empty cache (index built)" if built else "query (index in --cache)"
    print(f"{what}: {first:.1f} s; cache {size / 2**20:.0f} MB;"
          f" {doc['windows']:,} windows x {len(doc['snapshots'])} snapshots")
    docs = {QUERIES[0]: doc}
    for text, target in QUERIES[1:]:
        seconds, docs[(text, target)] = run_why(text, target, env, args.data)
        print(f"later query {text!r} -> {target!r}: {seconds:.2f} s")
    if not args.recall:
        return 0
    from multiprocessing import get_context

    from tinygpt_cli.analysis import why
    from tinygpt_cli.jobs import history as snapshots_of
    from tinygpt_cli.jobs import why as why_job
    from tinygpt_cli.jobs.corpus import training_text
    from tinygpt_cli.jobs.why_index import open_index
    from tinygpt_cli.transformer.folder import load_model

    os.environ["TINYGPT_CACHE"] = cache
    model = load_model(None)
    files = training_text(model.folder, [Path(args.data)] if args.data else None).files
    index = why_job.load_index(files, model.tokenizer, model.folder / "tokenizer.json")
    config = model.config
    x, y = why.windows(index.stream, config.n_positions)
    found = snapshots_of.find_snapshots(model.folder / "history", model.weights_file)
    timeline = [s for s in snapshots_of.timeline(model, found) if s.lr is not None]
    grads = open_index(index.key, [s.path for s in timeline], config, len(x))
    stream_file = Path(cache) / "stream-for-recall.npy"
    np.save(stream_file, index.stream)
    lrs = np.asarray([s.lr for s in timeline])
    for text, target in QUERIES[: args.recall]:
        ids, t = model.tokenizer.encode(text), model.tokenizer.encode(target)[0]
        approx = (grads.scores([s.params for s in timeline], config, x, y, ids, t)
                  * lrs[:, None]).sum(0)
        t0 = time.perf_counter()
        cuts = np.linspace(0, len(x), 9).astype(int)
        jobs = [(str(model.folder), str(s.path), ids, t, lo, hi, str(stream_file))
                for s in timeline for lo, hi in zip(cuts[:-1], cuts[1:], strict=True)]
        with get_context("spawn").Pool(os.cpu_count()) as pool:
            parts = pool.map(exact_scores_part, jobs)
        exact = sum(lr * np.concatenate(parts[i * 8 : (i + 1) * 8])
                    for i, lr in enumerate(lrs))
        top_exact = set(np.argsort(-exact)[:20].tolist())
        top_index = set(np.argsort(-approx)[:20].tolist())
        shown = {r["window"] for r in docs[(text, target)]["top_windows"]}
        ra, rb = np.argsort(np.argsort(approx)), np.argsort(np.argsort(exact))
        print(f"{text!r} -> {target!r}: index top 20 holds {len(top_exact & top_index)} of the "
              f"exact top 20; why's {len(shown)} shown are in the exact top 20: "
              f"{len(shown & top_exact)}; rank correlation {np.corrcoef(ra, rb)[0, 1]:.3f} over "
              f"{len(x):,} windows (exact pass {time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
