"""Where `why`'s index loses the exact ranking, part by part.

    python benchmarks/why_anatomy.py [--windows 256] [--queries 10] [--snapshots all]

Exact TracIn of a window is a sum of parts, one per kind of parameter: the weight matrices
(sum_t [x_t, 1] dy_t^T against the query's), the tied table's head part split in two (the
softmax part sum_t s_t u_t^T / T, and the one-hot part -sum_t e_{y_t} u_t^T / T), the table
rows the window reads (sum_t e_{x_t} m_t^T), the position table and the norms. For a seeded
sample of windows and the queries of why_quality.py this prints, lr-weighted over the
snapshots: each part's share of the exact score's variance, the rank correlation of the
index's form of that part (analysis.tracin: rank-one matrices, the top chances, u_t and m_t
on fitted directions, the projected rows) with the exact part, and the index's whole ranking
(Spearman, recall@10) with each part made exact in turn: where the index would gain most.

This study chose the index's form (results.md keeps the table that compared the Kronecker
projections of tracin-v4 with the forms tracin-v5 now stores); it now measures that form.
A benchmark, not a test: minutes on the 2-core machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import why_quality as wq  # noqa: E402

PARTS = ["matrix", "softmax", "one-hot", "read", "position", "norm"]


def measure(model, index, timeline, n, sample, asks):
    """-> {"exact", "exact PART", "index PART": [Q, W]} lr-weighted sums."""
    from tinygpt_cli.analysis import exact_tracin as ex
    from tinygpt_cli.analysis import tracin
    from tinygpt_cli.jobs.why_index import fit_windows
    from tinygpt_cli.transformer.windows import eval_windows

    config = model.config
    t_win = config.n_positions
    x_all, y_all = eval_windows(index.stream, t_win)
    fit = fit_windows(n)
    q_n, w_n = len(asks), len(sample)
    acc: dict[str, np.ndarray] = {}

    def add(name, j, value, lr):
        acc.setdefault(name, np.zeros((q_n, w_n)))[:, j] += lr * np.asarray(value)

    for s, snap in enumerate(timeline):
        t0 = time.perf_counter()
        params = {k: np.asarray(v, np.float32) for k, v in snap.params.items()}
        qs = [ex.next_token_query(params, config, ids, t) for ids, t in asks]
        stacked = ex.stack(qs, config, params)
        proj = tracin.Projection.fit(params, config, x_all[fit], y_all[fit])
        qi = [tracin.query(q, config, proj) for q in qs]
        n_pos = proj.left[tracin.POSITIONS].shape[1] * proj.right[tracin.POSITIONS].shape[1]
        for i in range(0, w_n, 16):
            w = sample[i: i + 16]
            x, y, b_n, j = x_all[w], y_all[w], len(w), slice(i, i + len(w))
            v, dv, dl = tracin.values_and_gradients(
                params, config, x, lambda z, y=y: ex.mean_loss_gradient(z, y))
            add("exact", j, ex.scores_from(config, v, dv, dl, x, stacked), snap.lr)
            g = {k: tracin.as_float32(a) if k != "top_ids" else a.astype(np.int64)
                 for k, a in tracin.stored([tracin.projected(config, v, dv, dl, x, y, proj)])
                 .items()}
            add("exact matrix", j, sum(ex._pairs(v[inp], dv[outp], *stacked.matrices[p],
                                                 stacked.at)
                                       for p, inp, outp in tracin.linear_sites(config)),
                snap.lr)
            add("exact position", j, ex.per_position_sum(np.einsum(
                "qtd,btd->btq", stacked.positions[:, : x.shape[1]], dv["embeddings"])), snap.lr)
            add("exact norm", j, sum(stacked.norms[p] @ tracin.norm_gradients(v, dv, inp, name).T
                                     for p, inp, name in tracin.norm_sites(config)), snap.lr)
            u_t, m_t = (a.astype(np.float64) for a in (v["ln_final.out"], dv["embeddings"]))
            soft = tracin.softmax_part(dl, y).astype(np.float64)
            for qn, (q, qq) in enumerate(zip(qs, qi, strict=True)):
                a, b = q.left[:, 0].astype(np.float64), q.right[0].astype(np.float64)
                e = np.zeros((config.vocab_size, config.n_embd))
                e[q.tokens] = q.rows
                one = np.zeros((q_n, b_n))

                def put(name, value, qn=qn, one=one, j=j, lr=snap.lr):
                    one[:] = 0
                    one[qn] = value
                    add(name, j, one, lr)

                ub = u_t @ b
                put("exact softmax", ((soft @ a) * ub + np.einsum(
                    "btj,jd,btd->bt", soft[:, :, q.tokens], q.rows, u_t)).sum(1))
                put("exact one-hot", -(a[y] * ub + np.einsum("btd,btd->bt", e[y], u_t))
                    .sum(1) / t_win)
                put("exact read", (a[x] * (m_t @ b) + np.einsum("btd,btd->bt", e[x], m_t))
                    .sum(1))
                put("index matrix", tracin.matrix_scores(g["rank1"], qq))
                put("index softmax", tracin.token_scores(
                    g["u"], [(g["top_ids"], g["top_p"] / t_win)], qq.a, qq.b_u, qq.slot,
                    qq.rows_u))
                put("index one-hot", tracin.token_scores(
                    g["u"], [(y[..., None], -1.0 / t_win)], qq.a, qq.b_u, qq.slot, qq.rows_u))
                put("index read", tracin.token_scores(g["m"], [(x[..., None], 1.0)], qq.a,
                                                      qq.b_m, qq.slot, qq.rows_m))
                put("index position", g["rows"][:, :n_pos] @ qq.rows[:n_pos])
                put("index norm", g["rows"][:, n_pos:] @ qq.rows[n_pos:])
        print(f"  snapshot {s + 1}/{len(timeline)}: {time.perf_counter() - t0:.0f} s",
              file=sys.stderr, flush=True)
    return acc


def report(acc) -> list[str]:
    from tinygpt_cli.analysis.why import recall, spearman

    exact = acc["exact"]
    q_n = len(exact)

    def rho(a, b):
        return float(np.mean([spearman(a[q], b[q]) for q in range(q_n)]))

    def top10(a):
        return float(np.mean([recall(a[q], exact[q], 10) for q in range(q_n)])) * 10

    lines = ["| part | share of the exact score's variance | index's part: Spearman with the "
             "exact part | whole index, this part exact: Spearman | recall@10 |",
             "|---|---:|---:|---:|---:|"]
    index = sum(acc[f"index {p}"] for p in PARTS)
    for p in PARTS:
        share = np.mean([np.var(acc[f"exact {p}"][q]) / np.var(exact[q]) for q in range(q_n)])
        swapped = index - acc[f"index {p}"] + acc[f"exact {p}"]
        lines.append(f"| {p} | {share:.3f} | {rho(acc[f'index {p}'], acc[f'exact {p}']):.3f} "
                     f"| {rho(swapped, exact):.3f} | {top10(swapped):.1f}/10 |")
    lines.append(f"| (none: the index as built) | | | {rho(index, exact):.3f} | "
                 f"{top10(index):.1f}/10 |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--windows", type=int, default=256)
    ap.add_argument("--queries", type=int, default=10)
    ap.add_argument("--snapshots", default="all", help="'all', or 'last' (the final weights)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    model, index, timeline, n, sample, asks = wq.setup(args.windows, args.queries)
    if args.snapshots == "last":
        timeline = timeline[-1:]
    acc = measure(model, index, timeline, n, sample, asks)
    lines = report(acc)
    print(f"{len(asks)} queries, a seeded sample of {len(sample):,} of the {n:,} windows, "
          f"{len(timeline)} snapshot(s); {(time.perf_counter() - t0) / 60:.1f} min")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
