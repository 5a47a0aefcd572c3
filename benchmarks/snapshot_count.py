"""How many snapshots the shipped run keeps: what each one adds to `why`'s answers, and what
each one costs the index.

    python benchmarks/snapshot_count.py [--weights weights] [--windows 1024] [--queries 10]
                                        [--write]

TracIn (`why`) sums, over the snapshots of a run, lr_s * grad L(window) . grad L(query) at
snapshot s. Each snapshot is a whole pass over the training text for the index (its size and
its build time grow in proportion to the count), so the count is a budget: at most 8, for an
index of about 2 GB built in about 20 minutes on one core. This study says what the budget
buys. On a seeded sample of `--windows` training windows and `--queries` prompts (each with
its likeliest next token), the exact per-snapshot scores (analysis.exact_tracin, the pass
`why --exact` makes) are computed once; then, for subsets of the snapshots (the latest k,
the earliest k, every other one), the answer of the subset (the sum over its snapshots) is
compared with the answer of all of them: the share of the full top 10 it keeps and the rank
correlation (Spearman) over the sample. The share each snapshot has of the total score (its
lr times its gradients' agreement) says which part of training an answer comes from.
--write puts the table into benchmarks/results.md (its "snapshot_count" section).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # before NumPy loads

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from why_quality import PROMPTS, write_results  # noqa: E402  (the same queries as its study)


def per_snapshot_scores(weights: Path, windows: int, n_queries: int, seed: int = 0):
    """-> (steps [S], lrs [S], scores [Q, S, W]) of a seeded sample of training windows."""
    from tinygpt_cli.analysis import exact_tracin as ex
    from tinygpt_cli.jobs import history as snapshots_of
    from tinygpt_cli.jobs import why as why_job
    from tinygpt_cli.jobs.threads import on_cores
    from tinygpt_cli.transformer.folder import load_model

    model = load_model(weights)
    found = why_job.training_text(model, None)
    index = why_job.load_index(found.files, model.tokenizer, model.folder / "tokenizer.json")
    snaps = snapshots_of.find_snapshots(snapshots_of.history_folder(model), model.weights_file)
    timeline = [s for s in snapshots_of.timeline(model, snaps) if s.lr is not None]
    n = (len(index.stream) - 1) // model.config.n_positions
    sample = np.sort(np.random.default_rng(seed).choice(n, size=min(windows, n),
                                                        replace=False))
    asks = []
    for text in PROMPTS[:n_queries]:
        ids = model.tokenizer.encode(text)
        asks.append((ids, why_job._target_of(model, ids, None, None)))
    queries = [(s.params, s.lr, [ex.next_token_query(s.params, model.config, ids, t)
                                 for ids, t in asks]) for s in timeline]
    scores = ex.scores_over_stream(queries, model.config, index.stream, windows=sample,
                                    each=on_cores())
    return (np.array([s.step for s in timeline]), np.array([s.lr for s in timeline]),
            scores, n)


def agreement(part: np.ndarray, full: np.ndarray) -> tuple[float, float]:
    """Mean share of the full answer's top 10 kept by `part`'s top 10, and mean Spearman."""
    from tinygpt_cli.analysis.why import recall, spearman

    return (float(np.mean([recall(part[q], full[q], 10) for q in range(len(full))])),
            float(np.mean([spearman(part[q], full[q]) for q in range(len(full))])))


def subsets(n: int) -> list[tuple[str, list[int]]]:
    """The subsets compared with all n snapshots."""
    out = [(f"the latest {k}", list(range(n - k, n))) for k in (1, 2, 4, 6) if k < n]
    out += [(f"the earliest {k}", list(range(k))) for k in (4, 6) if k < n]
    out += [("every other one, ending with the last", list(range(n - 1, -1, -2))[::-1])]
    out += [(f"all but step-index {i}", [j for j in range(n) if j != i]) for i in range(n)]
    return out


def table(steps, lrs, scores, n_windows) -> list[str]:
    full = scores.sum(1)
    share = np.abs(scores).sum(2) / np.abs(scores).sum((1, 2))[:, None]  # [Q, S]
    lines = ["| snapshot step | lr | share of the total score (mean over queries) |",
             "|---:|---:|---:|"]
    lines += [f"| {int(s):,} | {lr:.2e} | {100 * share[:, i].mean():.1f}% |"
              for i, (s, lr) in enumerate(zip(steps, lrs, strict=True))]
    lines += ["", "| snapshots kept | count | top 10 kept | Spearman |", "|---|---:|---:|---:|"]
    for label, kept in subsets(len(steps)):
        if label.startswith("all but"):
            label = f"all but step {int(steps[int(label.split()[-1])]):,}"
        r10, rho = agreement(scores[:, kept].sum(1), full)
        lines.append(f"| {label} | {len(kept)} | {10 * r10:.1f}/10 | {rho:.3f} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weights", type=Path, default=ROOT / "weights")
    ap.add_argument("--windows", type=int, default=1024)
    ap.add_argument("--queries", type=int, default=10)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    t0 = time.perf_counter()
    steps, lrs, scores, n = per_snapshot_scores(args.weights, args.windows, args.queries)
    lines = table(steps, lrs, scores, n)
    head = (f"{scores.shape[0]} queries, a seeded sample of {scores.shape[2]:,} of the {n:,} "
            f"training windows, the {len(steps)} snapshots of the shipped run; exact TracIn "
            f"per snapshot; {(time.perf_counter() - t0) / 60:.1f} min. The index costs the "
            f"same for every snapshot (one pass over the text, the same bytes), so its size "
            f"and build time are in proportion to the count.")
    print(head)
    print("\n".join(lines))
    if args.write:
        write_results(head, lines, "snapshot_count", "## How many snapshots: what each adds "
                      "to why's answers (`benchmarks/snapshot_count.py`, issue 52)")


if __name__ == "__main__":
    main()
