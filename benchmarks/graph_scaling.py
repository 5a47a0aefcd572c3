"""How the attribution graph's time and memory grow with the text (issue 32, circuit-tracer #92).

Each length runs in a fresh process (its peak resident size is the memory figure): the first
N tokens of the held-out text, `graph.build` then `graph.prune` with the defaults, on the
shipped model and its shipped transcoders; wall time of the two (the machine is shared, so the
load average is recorded beside it). Writes benchmarks/graph_scaling.md.

    python benchmarks/graph_scaling.py [32 64 128]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHILD = """
import json, resource, sys, time
import numpy as np
from tinygpt_cli.weights import load_model
from tinygpt_cli.corpus import held_out_files, read_stories
from tinygpt_cli.analysis import transcoder as T, graph as G
n = int(sys.argv[1])
m = load_model(None)
tcs = T.load_transcoders(T.folder_of(m.weights_file), m.config, m.weights_file)
text = " ".join(read_stories(held_out_files(None))[:40])
ids = m.tokenizer.encode(text)[:n]
t0 = time.perf_counter()
g = G.prune(G.build(m.params, m.config, ids, tcs))
wall = time.perf_counter() - t0
print(json.dumps({"tokens": len(ids), "seconds": wall, "features": g.n_features,
                  "adjacency_mb": g.adjacency.nbytes / 2**20, "explained": g.explained,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def main(lengths: list[int]) -> None:
    rows = []
    for n in lengths:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        out = subprocess.run([sys.executable, "-c", CHILD, str(n)], capture_output=True,
                             text=True, check=True, cwd=ROOT, env=env)
        rows.append(json.loads(out.stdout.splitlines()[-1]) | {"load": os.getloadavg()[0]})
        print(rows[-1], file=sys.stderr)
        write(rows)  # after each length: a long one cut short leaves the shorter ones


def write(rows: list[dict]) -> None:
    from tinygpt_cli.files import write_text

    lines = ["# Attribution graph: time and memory against the text's length", "",
             "Written by `python benchmarks/graph_scaling.py` on the shipped model and its",
             "shipped transcoders (4 blocks x 1,024 latents, k = 32), one thread, each length a",
             "fresh process; time is the wall time of build + prune, memory the process's peak",
             "resident size (the model and transcoders included).", "",
             f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             "| tokens | active features | build + prune (s) | adjacency (MB) | peak memory (MB)"
             " | explained | load average |", "| --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['tokens']} | {r['features']:,} | {r['seconds']:.1f} | "
              f"{r['adjacency_mb']:.0f} | {r['peak_mb']:.0f} | {r['explained']:.3f} | "
              f"{r['load']:.1f} |" for r in rows]
    write_text(ROOT / "benchmarks" / "graph_scaling.md", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [32, 64, 128])
