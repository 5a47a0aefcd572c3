"""Where `why`'s index loses the exact ranking, part by part, and what would keep it.

    python benchmarks/why_anatomy.py [--windows 256] [--queries 10] [--snapshots all]

Exact TracIn of a window is a sum of parts, one per kind of parameter: the weight matrices
(sum_t [x_t, 1] dy_t^T against the query's), the tied table's head part split in two (the
softmax part sum_t s_t u_t^T / T, and the one-hot part -sum_t e_{y_t} u_t^T / T), the table
rows the window reads (sum_t e_{x_t} m_t^T), the position table and the norms. For a seeded
sample of windows and the queries of why_quality.py this prints, lr-weighted over the
snapshots: each part's share of the exact score's variance, the rank correlation of the
index's approximation of that part with the exact part, and the index's whole ranking
(Spearman, recall@10) with each part made exact in turn. Then it scores representations the
index could store instead, with their sizes on the whole text (bfloat16, every window at
every snapshot):

- a weight matrix's gradient G as u (u^T G), u its top left singular vector by power
  iteration (a rank-1 projection: exact for G's part along u), instead of L^T G R on fitted
  directions L, R;
- the head's softmax part from each position's top-k chances (ids and values) with u_t on
  K fitted directions (sum_t (s_t . a)(u_t . b) over the top k: the query's head gradient is
  a b^T), instead of its two-sided 16 x 16 projection.

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
POWER_STEPS = 8
TOP_K = (4, 8)
U_SIZES = (16, 32, 64)


def top_singular_left(g: np.ndarray, steps: int = POWER_STEPS) -> np.ndarray:
    """Each matrix's top left singular vector by power iteration on G G^T, started from
    the row sums' direction.  [B, n, m] -> [B, n] (unit)"""
    u = np.abs(g).sum(-1) + 1e-30
    for _ in range(steps):
        u = np.einsum("bnm,bm->bn", g, np.einsum("bnm,bn->bm", g, u))
        u /= np.linalg.norm(u, axis=-1, keepdims=True) + 1e-300
    return u


def sizes_gb(config, n_windows: int, n_snapshots: int) -> dict[str, float]:
    """Numbers per window (bfloat16) of each representation, as GB on the whole text."""
    from tinygpt_cli.analysis import tracin

    d, t = config.n_embd, config.n_positions
    rank1 = sum(params_in + params_out for params_in, params_out in
                [(d + 1, 3 * d), (d + 1, d), (d + 1, 4 * d), (4 * d + 1, d)]) * config.n_layer
    k = tracin.SIZES
    others = k["matrix"] ** 2 + (2 * config.n_layer + 1) * k["vector"]  # positions, norms
    scale = 2 * n_windows * n_snapshots / 1e9
    out = {"index now": wq.size_gb(config, {}, n_windows, n_snapshots)}
    for ku in U_SIZES:
        for top in TOP_K:
            per = rank1 + others + t * (ku + k["position"]) + t * 2 * top  # u_t, m_t, top-k
            out[f"rank-1 matrices, u {ku}, top {top}"] = per * scale
    return out


def measure(model, index, timeline, n, sample, asks):
    """-> exact parts, index parts, alternatives: {name: [Q, W]} lr-weighted sums."""
    from tinygpt_cli.analysis import exact_tracin as ex
    from tinygpt_cli.analysis import tracin
    from tinygpt_cli.analysis.why_index import fit_windows
    from tinygpt_cli.corpus import eval_windows

    config = model.config
    t_win = config.n_positions
    x_all, y_all = eval_windows(index.stream, t_win)
    fit = fit_windows(n)
    q_n, w_n = len(asks), len(sample)
    acc: dict[str, np.ndarray] = {}

    def add(name, j, value, lr):
        acc.setdefault(name, np.zeros((q_n, w_n)))[:, j] += lr * value

    sites = tracin.linear_sites(config)
    for s, snap in enumerate(timeline):
        t0 = time.perf_counter()
        params = {k: np.asarray(v, np.float32) for k, v in snap.params.items()}
        qs = [ex.next_token_query(params, config, ids, t) for ids, t in asks]
        stacked = ex.stack(qs, config, params)
        proj = tracin.Projection.fit(params, config, x_all[fit], y_all[fit])
        # leading directions first (eigh's order reversed): the first K of the widest fit
        widest = tracin.Projection.fit(params, config, x_all[fit], y_all[fit],
                                       sizes={"position": max(U_SIZES)}).left["u"]
        u_dirs = {ku: widest[:, :ku] for ku in U_SIZES}
        qi = [tracin.query(params, config, proj, ids, t, t_win) for ids, t in asks]
        g_q = {p: np.stack([np.concatenate([q.grads[p], q.grads[tracin.bias_of(p)][None]])
                            for q in qs]).reshape(q_n, -1) for p, _, _ in sites}
        offsets, o = {}, 0
        for name in [p for p, _, _ in sites] + [tracin.TABLE, tracin.POSITIONS] + \
                [p for p, _, _ in tracin.norm_sites(config)]:
            k = proj.left[name].shape[1] * (proj.right[name].shape[1]
                                            if name in proj.right else 1)
            offsets[name], o = slice(o, o + k), o + k
        for i in range(0, w_n, 16):
            w = sample[i: i + 16]
            x, y, b_n, j = x_all[w], y_all[w], len(w), slice(i, i + len(w))
            v, dv, dl = tracin.values_and_gradients(
                params, config, x, lambda z, y=y: ex.mean_loss_gradient(z, y))
            add("exact", j, ex.scores_from(config, v, dv, dl, x, stacked), snap.lr)
            g = tracin.projected(config, v, dv, dl, x, y, proj)
            rows = g.rows.astype(np.float64)
            for p, inp, outp in sites:
                add("exact matrix", j, ex._pairs(v[inp], dv[outp], *stacked.matrices[p],
                                                 stacked.at), snap.lr)
                gw = np.einsum("btn,btm->bnm", tracin.with_ones(v[inp]).astype(np.float64),
                               dv[outp].astype(np.float64))
                u = top_singular_left(gw)
                kept = np.einsum("bn,bm->bnm", u, np.einsum("bn,bnm->bm", u, gw))  # u u^T G
                add("rank-1 matrix", j, (kept.reshape(b_n, -1) @ g_q[p].T).T, snap.lr)
            if stacked.positions is not None:
                add("exact position", j, ex.per_position_sum(np.einsum(
                    "qtd,btd->btq", stacked.positions[:, : x.shape[1]], dv["embeddings"])),
                    snap.lr)
            for p, inp, name in tracin.norm_sites(config):
                add("exact norm", j, stacked.norms[p] @ tracin.norm_gradients(
                    v, dv, inp, name).T, snap.lr)
            u_t, m_t = (a.astype(np.float64) for a in (v["ln_final.out"], dv["embeddings"]))
            soft = tracin.softmax_part(dl, y).astype(np.float64)
            order = np.argsort(-soft, axis=-1)[..., : max(TOP_K)]
            top = np.take_along_axis(soft, order, -1)
            for qn, (q, qq) in enumerate(zip(qs, qi, strict=True)):
                a, b = q.left[:, 0].astype(np.float64), q.right[0].astype(np.float64)
                e = np.zeros((config.vocab_size, config.n_embd))
                e[q.tokens] = q.rows
                row = lambda name: rows[:, offsets[name]] @ qq.rows[offsets[name]]  # noqa
                one = np.zeros((q_n, b_n))

                def put(name, value, qn=qn, one=one, j=j, lr=snap.lr):
                    one[:] = 0
                    one[qn] = value
                    add(name, j, one, lr)

                put("index matrix", sum(row(p) for p, _, _ in sites))
                put("index softmax", row(tracin.TABLE))
                put("index position", row(tracin.POSITIONS))
                put("index norm", sum(row(p) for p, _, _ in tracin.norm_sites(config)))
                put("index one-hot", tracin.table_scores(g.u, y, qq.by_next_token))
                put("index read", tracin.table_scores(g.m, x, qq.by_input_token))
                ub = u_t @ b
                put("exact softmax", ((soft @ a) * ub + np.einsum(
                    "btj,jd,btd->bt", soft[:, :, q.tokens], q.rows, u_t)).sum(1))
                put("exact one-hot", -(a[y] * ub + np.einsum("btd,btd->bt", e[y], u_t))
                    .sum(1) / t_win)
                put("exact read", (a[x] * (m_t @ b) + np.einsum("btd,btd->bt", e[x], m_t))
                    .sum(1))
                for ku, dirs in u_dirs.items():
                    d64 = dirs.astype(np.float64)
                    ut, bt, et = u_t @ d64, b @ d64, e @ d64
                    ubk = ut @ bt
                    put(f"one-hot u {ku}", -(a[y] * ubk + np.einsum(
                        "btk,btk->bt", et[y], ut)).sum(1) / t_win)
                    eu = ut @ et.T
                    for k in TOP_K:
                        ids, p_k = order[..., :k], top[..., :k]
                        sa = (p_k * a[ids]).sum(-1)
                        se = (p_k * np.take_along_axis(eu, ids, -1)).sum(-1)
                        put(f"softmax u {ku} top {k}", (sa * ubk + se).sum(1))
        print(f"  snapshot {s + 1}/{len(timeline)}: {time.perf_counter() - t0:.0f} s",
              file=sys.stderr, flush=True)
    return acc


def report(acc, sizes) -> list[str]:
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
    lines += ["", "| representation | size on the whole text | Spearman | recall@10 |",
              "|---|---:|---:|---:|",
              f"| the index now | {sizes['index now']:.2f} GB | {rho(index, exact):.3f} | "
              f"{top10(index):.1f}/10 |"]
    small = acc["index read"] + acc["index position"] + acc["index norm"]
    for ku in U_SIZES:
        for k in TOP_K:
            head = acc[f"softmax u {ku} top {k}"] + acc[f"one-hot u {ku}"]
            for label, matrix in (("rank-1 matrices", acc["rank-1 matrix"]),
                                  ("index's matrices", acc["index matrix"])):
                whole = matrix + head + small
                size = (f"{sizes[f'rank-1 matrices, u {ku}, top {k}']:.2f} GB"
                        if label.startswith("rank-1") else "")
                lines.append(f"| {label}, u_t on {ku}, top {k} chances | {size} | "
                             f"{rho(whole, exact):.3f} | {top10(whole):.1f}/10 |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--windows", type=int, default=256)
    ap.add_argument("--queries", type=int, default=10)
    ap.add_argument("--snapshots", default="all", help="'all', or 'last' (the final weights)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    model, index, timeline, n, sample, asks = wq.setup(args.windows, args.queries)
    sizes = sizes_gb(model.config, n, len(timeline))  # of the index on every snapshot
    if args.snapshots == "last":
        timeline = timeline[-1:]
    acc = measure(model, index, timeline, n, sample, asks)
    lines = report(acc, sizes)
    print(f"{len(asks)} queries, a seeded sample of {len(sample):,} of the {n:,} windows, "
          f"{len(timeline)} snapshot(s); {(time.perf_counter() - t0) / 60:.1f} min")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
