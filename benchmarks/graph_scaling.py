"""How the attribution graph's time and memory grow with the text (issue 32, circuit-tracer #92).

Each length runs in a fresh process (its peak resident size is the memory figure): the first
N tokens of the held-out text, `graph.build` then `graph.prune` with the defaults (at most
4,096 features visited), wall and CPU time of the two, one thread, the run of least CPU time of
five (the machine is shared, so the load average is recorded beside it). The models:

- the shipped one and its shipped transcoders, at 32, 64 and 128 tokens (its context);
- `long` and `long4`: a random Llama folder with a 2,048-token context made here by
  transformers (2 or 4 blocks of 64, 4 heads on 2 key/value heads, the shipped tokenizer), with
  small transcoders trained here on its own values (256 latents, k = 8, 500 steps a block;
  weights drawn with std 0.1, so that the MLPs write enough for a transcoder to learn), at
  512, 1,000 and 2,000 tokens.

Writes benchmarks/graph_scaling.md. Run from the repository root:

    python benchmarks/graph_scaling.py                 # every model
    python benchmarks/graph_scaling.py shipped 32 64   # some lengths of one
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LONG = ROOT / "benchmarks" / ".graph_long"  # made once, ignored by git
LENGTHS = {"shipped": [32, 64, 128], "long": [512, 1000, 2000], "long4": [512, 1000, 2000]}
BLOCKS = {"long": 2, "long4": 4}
REPEAT = 5
LONG_CONFIG = dict(vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                   tie_word_embeddings=True, rms_norm_eps=1e-5, initializer_range=0.1)
CHILD = """
import json, os, resource, sys, time
import numpy as np
from tinygpt_cli.weights import load_model
from tinygpt_cli.corpus import held_out_files, read_stories
from tinygpt_cli.analysis import transcoder as T, graph as G
n, folder = int(sys.argv[1]), (None if sys.argv[2] == "shipped" else sys.argv[2])
m = load_model(folder)
tcs = T.load_transcoders(T.folder_of(m.weights_file), m.config, m.weights_file)
text = " ".join(read_stories(held_out_files(None))[:400])
ids = m.tokenizer.encode(text)[:n]
t0, cpu0, times0 = time.perf_counter(), time.process_time(), os.times()
g = G.build(m.params, m.config, ids, tcs)
built = time.perf_counter() - t0
G.prune(g)
wall = time.perf_counter() - t0
times = os.times()
print(json.dumps({"tokens": len(ids), "seconds": wall, "build": built,
                  "features": g.n_features, "visited": g.visited,
                  "adjacency_mb": g.adjacency.nbytes / 2**20, "explained": g.explained,
                  "cpu": time.process_time() - cpu0, "system": times.system - times0.system,
                  "user": times.user - times0.user,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

NOTES = """\
What makes it linear: at most 4,096 features (`--max-features`) have their incoming edges
computed, those of most influence on the target first (circuit-tracer's order, `graph.visit`);
every other active feature stays a node, its edges out exact, its own inputs not computed. The
adjacency is then [4,096 + logits, every node]: its columns, and every backward pass's
positions, grow with the text, its rows do not. Each pass stops at its own last target's
position; the first attention after a target's read is an outer product along one pattern row
(linear); a pass's edges into every position's features are one batched product.

The adjacency is mostly zeros that are never written: a row has edges only from the blocks
before its own (features, errors), the embeddings and the bias, and only from positions up to
its own. The influence passes that order the visit, the normalised copy and `prune` read and
write each run of rows of one block over those columns only (`graph.source_columns`), and
`build` and `prune` run without NumPy's 2 MB page advice, under which a write mapped the 2 MB
around it: the untouched zeros cost neither time nor memory. prune's edge threshold sorts only
the scores above a sampled bound when those alone reach the share (the same threshold; sorting
every score grew faster than the scores).

What still grows with the square of the text, and why:

- the attention products deeper than a target's first. The exact derivative of a target at
  position p through two attention layers needs, at every key position k <= p, the sum over
  the queries between them of the pattern's column times what came back to those queries: a
  p-long vector times a p x p softmax pattern for every row and head (d_k columns a head), p^2
  multiply-adds that no exact rearrangement avoids for a dense pattern (only rows at the same
  position could share them, and they are shared where that holds). They are kept as small
  as that allows: each row only over the queries up to its own position; the first of them
  with 1 + H position profiles instead of d_k columns a head, the profile at the row's own
  position read off the pattern, the others shared by the rows at one position; the patterns
  held as float64 causal blocks (no cast in every product, no more memory than the float32
  square); the columns each product's short side; each block's own keys in two bands. How
  many rows go that deep is the graph's own: with `long4` at 2,000 tokens 180 rows reach a
  third attention layer, against 115 at 1,000. With 2 blocks none does. They run at 18-22
  GF/s of useful multiply-adds, where this core's BLAS reaches 35-40 on wide products: these
  are narrow (a median of 54-72 columns, the rows of one block in one visiting round);
  merging a round's rows of every block at each attention layer would widen them (not done).
- the model's own forward pass: attention scores and softmax, [H, T, T] a block, and the
  patterns kept for the backward passes (75 MB a block at 2,000 tokens).

Under cProfile (process time, the lower of two runs, 2026-12-03), `long4` from 1,000 to 2,000
tokens:

| part | 1,000 tokens (s) | 2,000 tokens (s) | x |
| --- | --- | --- | --- |
| the attention products deeper than a target's first (`_keys_side`) | 0.37 | 1.49 | 4.0 |
| the forward pass's attention (scores, softmax, mix) | 0.09 | 0.47 | 5.2 |
| the rest | 1.78 | 3.28 | 1.84 |
| total | 2.25 | 5.24 | 2.33 |

(Before these changes, the same profile: 9.6 s at 1,000 tokens and 18.1 s at 2,000, of which
the deeper products 0.67 and 2.56 s; the influence passes 2.1 and 4.1 s, the normalised copy
1.8 and 3.2 s, prune 2.2 and 3.8 s, much of it the kernel's fresh pages.) cProfile's overhead
inflates the small calls; the deeper products and the forward's attention are the only parts
that grow faster than the text: the rest 1.84x, the whole about 2.3x with them at 4 blocks.
With 2 blocks the deeper products are 0.03 s at 2,000 tokens, and the forward's attention and
its fresh pages alone put `long` at 1.85-2.2x. The least CPU time of five moves between runs:
two runs of the benchmark earlier the same hour (load 1.3-3.5) gave, 1,000 -> 2,000 tokens,
`long4` 2.02x and 2.61x, `long` 2.10x and 2.06x; 512 -> 1,000 `long4` 1.29x and 1.20x, `long`
2.04x and 1.80x; shipped 64 -> 128 tokens 1.91x and 1.70x.

The `of it kernel` column is the kernel's share of the CPU time, mostly handing the process
fresh pages: on this virtual machine 0.5-2 s a GB touched for the first time, and it moves from
run to run (the code before these changes on 2,000 tokens of `long4`: 3.2-9.0 s in runs of the
same hour). Peak memory: the adjacency's written part, its normalised copy's, the edge mask
(a byte an entry) and the patterns.

Before and after these changes, alternating in one session (the code of `main` at 4989ca0 and
of this table, the least CPU time of three, load 2.4-3.0):

| model | tokens | before: CPU s (kernel) | x | peak MB | x | after: CPU (kernel) | x | MB | x |
| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |
| long | 512 | 2.17 (0.93) |  | 433 |  | 0.66 (0.06) |  | 186 |  |
| long | 1,000 | 4.55 (2.25) | 2.15 | 836 | 1.97 | 1.21 (0.09) | 1.87 | 244 | 1.33 |
| long | 2,000 | 9.00 (4.05) | 1.98 | 1,515 | 1.81 | 2.24 (0.40) | 1.85 | 411 | 1.68 |
| long4 | 512 | 4.34 (1.27) |  | 776 |  | 1.65 (0.18) |  | 312 |  |
| long4 | 1,000 | 8.83 (3.85) | 2.09 | 1,543 | 2.04 | 2.19 (0.23) | 1.34 | 385 | 1.24 |
| long4 | 2,000 | 18.17 (7.35) | 2.06 | 2,871 | 1.86 | 4.64 (0.65) | 2.12 | 717 | 1.86 |

Before the cap (the same benchmark on the code where every feature was a row of one dense
adjacency, 2026-12-01, load about 10): 32 tokens 35.3 s / 432 MB, 64 tokens 155.9 s / 805 MB,
128 tokens stopped after 12 min at 2.3 GB. What the cap costs: with every feature visited
(`max_features=None`: 10.0 s / 739 MB at 64 tokens and 21.9 s / 2,723 MB at 128, before the
later speed-ups), the shipped model's graphs explain 0.697 (64 tokens) and 0.711 (128),
against 0.695 and 0.702 capped; with no more active features than the cap (32 tokens) the
graph is the uncapped one. Wall times on the shared 2-core machine vary with its load, and so,
less, does the CPU time (the process's own): from run to run a doubling's ratio moves by as
much as 0.3.
"""


def long_folder(name: str = "long") -> Path:
    """The random long-context Llama folder and its transcoders (made once): `long` of 2
    blocks, `long4` of 4."""
    blocks = BLOCKS[name]
    folder = LONG if name == "long" else LONG.with_name(LONG.name + str(blocks))
    if (folder / "transcoders" / f"layers.{blocks - 1}.safetensors").exists():
        return folder
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tinygpt_cli.analysis import transcoder as T
    from tinygpt_cli.corpus import data_windows, training_files
    from tinygpt_cli.files import sha256
    from tinygpt_cli.weights import SHIPPED, load_model

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**LONG_CONFIG | {"num_hidden_layers": blocks})
                     ).save_pretrained(folder)
    shutil.copyfile(SHIPPED / "tokenizer.json", folder / "tokenizer.json")
    m = load_model(folder)
    x, _ = data_windows(training_files(None), m.tokenizer, 512, 16)
    values = T.mlp_values(m.params, m.config, x)
    settings = {"latents": 256, "k": 8, "steps": 500, "batch": 512, "lr": 2e-3,
                "windows": 16, "seed": 0}
    for i, (xi, yi) in enumerate(values):
        T.train_layer(xi, yi, T.file_of(folder / "transcoders", i), i, settings,
                      sha256(m.weights_file), _no_bar)
    return folder


class _no_bar:  # noqa: N801 - a progress bar that shows nothing
    def __init__(self, total, what):
        pass

    def __enter__(self):
        return lambda n: None

    def __exit__(self, *exc):
        return False


def main(which: list[str], lengths: list[int]) -> None:
    rows = []
    for model in which:
        folder = "shipped" if model == "shipped" else str(long_folder(model))
        for n in lengths or LENGTHS[model]:
            env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
            runs = []
            for _ in range(REPEAT):  # the fastest of a few: the machine is shared
                out = subprocess.run([sys.executable, "-c", CHILD, str(n), folder],
                                     capture_output=True, text=True, check=True, cwd=ROOT,
                                     env=env)
                runs.append(json.loads(out.stdout.splitlines()[-1])
                            | {"model": model, "load": os.getloadavg()[0]})
            rows.append(min(runs, key=lambda r: r["cpu"]))
            print(rows[-1], file=sys.stderr)
            write(rows)  # after each length: a long one cut short leaves the shorter ones


def write(rows: list[dict]) -> None:
    from tinygpt_cli.files import write_text

    lines = ["# Attribution graph: time and memory against the text's length", "",
             "Written by `python benchmarks/graph_scaling.py`: `graph.build` + `graph.prune`",
             "with the defaults (node threshold 0.8, edge threshold 0.98, at most 4,096",
             "features visited), one thread, each length a fresh process, the run of least",
             "CPU time of five; memory is the",
             "process's peak resident size (model and transcoders included). `shipped`: the",
             "shipped model and transcoders (4 blocks x 1,024 latents, k = 32); `long`,",
             "`long4`: a random 2- or 4-block Llama (d = 64, context 2,048) with transcoders",
             "trained here (256 latents, k = 8). x per doubling: the CPU time's (or the peak",
             "memory's) ratio to the row before, per doubling of the text. adjacency: its",
             "size as allocated, most of it zeros never written (not resident).", "",
             f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             "| model | tokens | active features | visited | wall (s) | CPU (s) | x per doubling"
             " | of it kernel (s) | user CPU x per doubling | adjacency (MB) | peak memory (MB)"
             " | x per doubling | explained | load |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
             " --- |"]
    for i, r in enumerate(rows):
        prev = rows[i - 1] if i and rows[i - 1]["model"] == r["model"] else None
        lines.append(f"| {r['model']} | {r['tokens']:,} | {r['features']:,} | "
                     f"{r['visited']:,} | {r['seconds']:.1f} | {r['cpu']:.1f} | "
                     f"{_per(prev, r, 'cpu')} | {r['system']:.1f} | {_per(prev, r, 'user')} | "
                     f"{r['adjacency_mb']:.0f} | {r['peak_mb']:.0f} | "
                     f"{_per(prev, r, 'peak_mb')} | {r['explained']:.3f} | {r['load']:.1f} |")
    write_text(ROOT / "benchmarks" / "graph_scaling.md", "\n".join(lines + ["", NOTES]))


def _per(prev: dict | None, r: dict, key: str) -> str:
    """The growth of `key` from prev to r, as a factor per doubling of the tokens."""
    import math

    if prev is None:
        return ""
    doublings = math.log2(r["tokens"] / prev["tokens"])
    return f"{(r[key] / prev[key]) ** (1 / doublings):.2f}"


if __name__ == "__main__":
    args = sys.argv[1:]
    names = [a for a in args if a in LENGTHS]
    main(names or list(LENGTHS), [int(a) for a in args if a not in LENGTHS])
