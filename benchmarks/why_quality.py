"""How well `why`'s index ranks the training windows, against exact TracIn (`why --exact`),
for several index sizes: the study that chooses the index's default.

    python benchmarks/why_quality.py [--windows 1024] [--queries 12] [--write]

On the shipped model, its 7 snapshots and its training text: for each of the queries (a
TinyStories prompt and its likeliest next token) exact TracIn of every window in a seeded
sample of `--windows` windows (analysis.exact_tracin, the pass `why --exact` makes), and the
index's score of the same windows for each variant of its sizes (analysis.tracin.SIZES:
u_t's and m_t's directions, the top chances kept, the power steps), fitted as the index fits
them (the same 64 windows, the same seed) and stored as it stores them (bfloat16). One
forward and backward pass per batch of windows serves the exact scores and every variant.

Printed per variant, averaged over the queries: recall@10 and recall@50 (the share of the
exact top k in the index's top k), the rank correlation (Spearman) over the sample, the
recall@10 once the index's top 20 / 50 are re-scored exactly (what `why` reports: the top
POOL * top re-scored), and the index's size on the whole text (every window at every
snapshot, 2 bytes a number). The sample is a subset of the 12,524 windows, so the figures
are of ranking within it (a top 10 of 1,024 windows, not of 12,524): say so beside them.
--write puts the table into benchmarks/results.md (its "why_quality" section).

    python benchmarks/why_quality.py --all-windows [--queries 10] [--write]

The index as `why` builds it (in the cache; built first if missing) against the exact pass
over every window, query by query: the claim on the whole text, not a sample (the exact
pass of 10 queries together takes about as long as the index's build).

    python benchmarks/why_quality.py --lds [--retrains 100] [--steps 500] [--write]

The linear datamodeling score instead (not in CI: minutes to an hour): a small model trained
here by the project's own step on the first windows of part-000.txt, TracIn of every window
for held-out queries (exact, and from the index at its default sizes) from evenly spaced
snapshots of the full-data run, then `--retrains` models trained the same way on random
halves of the windows; per query, the rank correlation over the halves between the sum of
the half's scores and the retrained model's log p(target). --write: the "why_lds" section.
BLAS is held to one thread here, before NumPy loads (a thread setting given in the
environment wins): with its own threads on the 2-core machine each of these tiny steps took
about 40 times as long (0.19 s against 5 ms).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # before NumPy loads, and inherited by --jobs' workers

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPTS = ["Once upon a time, there was a little", "Lily wanted to play with her",
           "The dog barked at the", "Tom and Sam went to the", "She was very happy and",
           "One day, a big", "The sun was shining and the birds were",
           "Mom said, \"You can have", "He looked at the sky and saw a",
           "They played all day in the", "The little bird could not",
           "Ben had a red ball. He threw the"]

# (label, sizes): Projection.fit's sizes; {} is the shipped default (tracin.SIZES)
VARIANTS = [("default (u 16, m 4, top 4, 4 steps)", {}),
            ("m 8", {"m": 8}),
            ("u 8", {"u": 8}),
            ("u 32", {"u": 32}),
            ("top 2", {"top": 2}),
            ("top 8", {"top": 8}),
            ("8 power steps", {"steps": 8})]


def setup(windows: int, n_queries: int, seed: int = 0):
    from tinygpt_cli.jobs import history as snapshots_of
    from tinygpt_cli.jobs import why as why_job
    from tinygpt_cli.transformer.folder import load_model

    model = load_model(ROOT / "weights")
    found = why_job.training_text(model, None)
    index = why_job.load_index(found.files, model.tokenizer, model.folder / "tokenizer.json")
    snaps = snapshots_of.find_snapshots(snapshots_of.history_folder(model), model.weights_file)
    timeline = [s for s in snapshots_of.timeline(model, snaps) if s.lr is not None]
    n = (len(index.stream) - 1) // model.config.n_positions
    rng = np.random.default_rng(seed)
    sample = np.sort(rng.choice(n, size=min(windows, n), replace=False))
    asks = []
    for text in PROMPTS[:n_queries]:
        ids = model.tokenizer.encode(text)
        asks.append((ids, why_job._target_of(model, ids, None, None)))
    return model, index, timeline, n, sample, asks


def fit_sample(n: int, size: int, seed: int = 0) -> np.ndarray:
    """As why_index.fit_windows, with another number of windows."""
    return np.sort(np.random.default_rng(seed).permutation(n)[: min(size, n)])


def measure(model, index, timeline, n, sample, asks, variants, workers=None):
    """-> exact [Q, W], {variant: [Q, W]} (lr-weighted sums over the snapshots)."""
    from tinygpt_cli.analysis import exact_tracin as ex
    from tinygpt_cli.analysis import tracin
    from tinygpt_cli.jobs.threads import map_on_cores
    from tinygpt_cli.jobs.why_index import fit_windows
    from tinygpt_cli.transformer.windows import eval_windows

    config = model.config
    x_all, y_all = eval_windows(index.stream, config.n_positions)
    fit = fit_windows(n)
    exact = np.zeros((len(asks), len(sample)))
    approx = {label: np.zeros((len(asks), len(sample))) for label, _ in variants}
    for s, snap in enumerate(timeline):
        t0 = time.perf_counter()
        params = {k: np.asarray(v, np.float32) for k, v in snap.params.items()}
        exact_queries = [ex.next_token_query(params, config, ids, t) for ids, t in asks]
        stacked = ex.stack(exact_queries, config, params)
        projections = {}
        for label, sizes in variants:
            f = fit if "fit" not in sizes else fit_sample(n, sizes["fit"])
            projections[label] = tracin.Projection.fit(
                params, config, x_all[f], y_all[f],
                sizes={k: v for k, v in sizes.items() if k != "fit"})
        queries = {label: [tracin.query(q, config, p) for q in exact_queries]
                   for label, p in projections.items()}

        def one(i: int, params=params, stacked=stacked, projections=projections,
                queries=queries):
            w = sample[i : i + ex.BATCH]
            x, y = x_all[w], y_all[w]
            v, dv, dl = tracin.values_and_gradients(
                params, config, x, lambda z, y=y: ex.mean_loss_gradient(z, y))
            got = {"exact": ex.scores_from(config, v, dv, dl, x, stacked)}
            for label, p in projections.items():
                g = tracin.projected(config, v, dv, dl, x, y, p)
                stored = tracin.stored([g])  # as a shard keeps them
                got[label] = np.stack([tracin.scores(stored, x, y, q)
                                       for q in queries[label]])
            return i, got

        for i, got in map_on_cores(one, range(0, len(sample), ex.BATCH), workers):
            j = slice(i, i + got["exact"].shape[1])
            exact[:, j] += snap.lr * got["exact"]
            for label in approx:
                approx[label][:, j] += snap.lr * got[label]
        print(f"  snapshot {s + 1}/{len(timeline)}: {time.perf_counter() - t0:.0f} s",
              file=sys.stderr, flush=True)
    return exact, approx


def size_gb(config, sizes: dict, n_windows: int, n_snapshots: int) -> float:
    """The index's size on the whole text: every window at every snapshot, 2 bytes a number
    (bfloat16, and uint16 token ids)."""
    from tinygpt_cli.analysis import tracin

    k = {**tracin.SIZES, **{n: v for n, v in sizes.items() if n != "fit"}}
    d, ff = config.n_embd, config.n_inner
    rank1 = config.n_layer * ((d + 1 + 3 * d) + (d + 1 + d) + (d + 1 + ff) + (ff + 1 + d))
    rows = k["positions"] ** 2 + (2 * config.n_layer + 1) * k["vector"]
    per_position = k["u"] + k["m"] + 2 * k["top"]  # u_t, m_t, the top ids and chances
    per_window = rank1 + rows + config.n_positions * per_position
    return per_window * 2 * n_windows * n_snapshots / 1e9


def table(exact, approx, config, n, n_snapshots, variants) -> list[str]:
    from tinygpt_cli.analysis.why import recall, spearman

    lines = ["| index | size on the whole text | "
             "recall@10 | recall@50 | Spearman | recall@10, top 20 re-scored | "
             "recall@10, top 50 re-scored |", "|---|---:|---:|---:|---:|---:|---:|"]
    for label, sizes in variants:
        a = approx[label]
        r10 = np.mean([recall(a[q], exact[q], 10) for q in range(len(a))])
        r50 = np.mean([recall(a[q], exact[q], 50) for q in range(len(a))])
        rho = np.mean([spearman(a[q], exact[q]) for q in range(len(a))])
        pools = [np.mean([len(set(np.argsort(-a[q])[:k]) & set(np.argsort(-exact[q])[:10]))
                          / 10 for q in range(len(a))]) for k in (20, 50)]
        lines.append(f"| {label} | {size_gb(config, sizes, n, n_snapshots):.2f} GB | "
                     f"{10 * r10:.1f}/10 | {50 * r50:.1f}/50 | {rho:.3f} | "
                     f"{10 * pools[0]:.1f}/10 | {10 * pools[1]:.1f}/10 |")
    return lines


# ------------------------------------------------------------------ --all-windows: the index
# as built, against --exact over every window


RE_SCORED = (1, 2, 3, 5)  # pools (times the top 10) re-scored exactly, as why.POOL


def all_windows(n_queries: int, workers=None) -> tuple[str, list[str]]:
    """The index `why` builds (in the cache: built here if missing) and the exact pass over
    every window, for each query: recall@10 and @50, Spearman over all windows, and the
    recall@10 of what `why` reports (the index's best POOL * 10 ranked by their exact
    scores) and of other pools (RE_SCORED)."""
    from tinygpt_cli.analysis import exact_tracin as ex
    from tinygpt_cli.analysis.why import POOL, recall, spearman
    from tinygpt_cli.jobs.threads import on_cores
    from tinygpt_cli.jobs.why_index import open_index
    from tinygpt_cli.transformer.windows import eval_windows

    t0 = time.perf_counter()
    model, index, timeline, n, _, asks = setup(1, n_queries)
    config = model.config
    grads = open_index(index.key, [s.path for s in timeline], config, n)
    grads.build(index.stream, config, workers)
    built = time.perf_counter() - t0
    x, y = eval_windows(index.stream, config.n_positions)
    lrs = np.asarray([s.lr for s in timeline])
    params = [s.params for s in timeline]
    makers = [lambda p, q=q, t=t: ex.next_token_query(p, config, q, t) for q, t in asks]
    queries = [(s.params, s.lr, [make(s.params) for make in makers]) for s in timeline]
    exact = ex.scores_over_stream(queries, config, index.stream,
                                  each=on_cores(workers)).sum(1)
    took = time.perf_counter() - t0 - built
    rows, kept = [], {"exact": exact}
    for k, (ids, t) in enumerate(asks):
        approx = (grads.scores(params, config, x, y, ids, t, workers=workers)
                  * lrs[:, None]).sum(0)
        kept[f"index {k}"] = approx
        truth = set(np.argsort(-exact[k], kind="stable")[:10].tolist())
        reported = []
        for pool in RE_SCORED:  # the index's best pool * 10, ranked by their exact scores
            best = np.argsort(-approx, kind="stable")[: pool * 10]
            top = best[np.argsort(-exact[k][best], kind="stable")[:10]]
            reported.append(len(truth & set(top.tolist())) / 10)
        rows.append((recall(approx, exact[k], 10), recall(approx, exact[k], 50),
                     spearman(approx, exact[k]), *reported))
    np.savez(Path("/tmp") / "why_quality-all-windows.npz", **kept)
    pools = " | ".join(f"top {10 * p} re-scored" + (" (why's)" if p == POOL else "")
                       for p in RE_SCORED)
    lines = [f"| query | recall@10 | recall@50 | Spearman | {pools} |",
             "|---|---:|---:|---:|" + "---:|" * len(RE_SCORED)]
    for (ids, t), (r10, r50, rho, *rep) in zip(asks, rows, strict=True):
        text = model.tokenizer.decode(ids).replace("|", "\\|")
        lines.append(f"| {text} -> {model.tokenizer.token_str(t)!r} | {10 * r10:.0f}/10 | "
                     f"{50 * r50:.0f}/50 | {rho:.3f} | "
                     + " | ".join(f"{10 * r:.0f}/10" for r in rep) + " |")
    mean = np.mean(rows, axis=0)
    lines.append(f"| **mean** | **{10 * mean[0]:.1f}/10** | **{50 * mean[1]:.1f}/50** | "
                 f"**{mean[2]:.3f}** | " + " | ".join(f"**{10 * r:.1f}/10**" for r in mean[3:])
                 + " |")
    head = (f"{len(asks)} queries, every one of the {n:,} windows, {len(timeline)} snapshots: "
            f"the index `why` builds ({grads.describe()['version']}) against the exact pass "
            f"(`why --exact`, all queries sharing it: {took / 60:.1f} min"
            + (f"; the index built in {built / 60:.1f} min" if grads.built_now else "") + ")")
    return head, lines


# ------------------------------------------------------------------ --lds: does attribution
# predict retraining? (the linear datamodeling score, Park et al. 2023 / dattri)

LDS_DATA = ROOT.parent / "shared" / "data" / "tinystories"  # ../shared from the checkout
LDS_CONFIG = {"n_embd": 32, "n_layer": 2, "n_head": 2, "n_inner": 128, "n_positions": 32}
LDS_WIDER = {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_inner": 256, "n_positions": 64}
LDS_VOCAB = 512
LDS_PEAK, LDS_WARMUP, LDS_BATCH, LDS_SNAPSHOTS = 3e-3, 20, 16, 8


def lds_setup(windows: int, n_queries: int, seed: int = 0, sizes: dict = LDS_CONFIG):
    """A small text (the first stories of part-000 whose windows fill `windows`), a tokenizer
    trained on it, held-out queries (a prefix of a part-005 story and its real next token),
    and the small model's config."""
    from dataclasses import replace

    from tinygpt_cli.jobs.corpus import read_stories
    from tinygpt_cli.transformer.config import Config
    from tinygpt_cli.transformer.tokenizer import train_tokenizer
    from tinygpt_cli.transformer.windows import encode_stories, eval_windows

    stories = read_stories([LDS_DATA / "part-000.txt"])
    t = sizes["n_positions"]
    need = windows * t + 1
    tok = train_tokenizer(stories[:2000], LDS_VOCAB)
    kept, total = [], 0
    for story in stories:
        kept.append(story)
        total += len(tok.encode(story)) + 1
        if total >= need:
            break
    stream = np.asarray(encode_stories(kept, tok).ids[:need], np.int64)
    x, y = eval_windows(stream, t)
    held = read_stories([LDS_DATA / "part-005.txt"])
    rng = np.random.default_rng(seed)
    queries = []
    for story in rng.permutation(len(held)):
        ids = tok.encode(held[story])
        if len(ids) < 12:
            continue
        cut = int(rng.integers(6, min(len(ids) - 1, t)))
        queries.append((ids[:cut], ids[cut]))
        if len(queries) == n_queries:
            break
    config = replace(Config(**sizes), vocab_size=tok.vocab_size)
    return config, stream, x, y, queries


def lds_train(config, x, y, chosen: np.ndarray, steps: int, seed: int, snapshots: int = 0):
    """The project's training step (loss_and_grads, global-norm clip 1, AdamW, warm-up and
    cosine decay) on batches drawn from the windows `chosen`, from the same initial weights
    (seed 0) every time; `seed` draws the batches. -> params, [(params, lr)] at `snapshots`
    evenly spaced steps (TracIn's checkpoints)."""
    from tinygpt_cli.transformer.model import init_params, loss_and_grads
    from tinygpt_cli.transformer.optim import AdamW, clip_by_global_norm, lr_at

    params = init_params(config, np.random.default_rng(0))
    opt, rng = AdamW(params, weight_decay=0.1), np.random.default_rng(seed)
    keep = set(np.linspace(steps / snapshots, steps, snapshots).astype(int) - 1) \
        if snapshots else set()
    kept = []
    for step in range(steps):
        lr = lr_at(step, LDS_PEAK, LDS_WARMUP, steps)
        b = rng.choice(chosen, LDS_BATCH)
        if step in keep:  # the weights the step starts from, with its learning rate
            kept.append(({k: v.copy() for k, v in params.items()}, lr))
        _, g = loss_and_grads(params, config, x[b], y[b])
        clip_by_global_norm(g, 1.0)
        opt.step(params, g, lr)
    return params, kept


def query_log_probs(params, config, queries) -> np.ndarray:
    """log p(target | text) of each query under these weights.  -> [Q]"""
    from tinygpt_cli.transformer import ops
    from tinygpt_cli.transformer.model import forward

    out = []
    for ids, target in queries:
        z = forward(params, config, np.asarray(ids))[-1].astype(np.float64)
        out.append(float(ops.log_softmax(z)[target]))
    return np.asarray(out)


def lds_attributions(config, stream, x, y, snapshots, queries, workers=None):
    """TracIn of every window for every query, exact (analysis.exact_tracin) and from the
    index at its default sizes (analysis.tracin, fitted on 64 windows, bfloat16, as `why`
    stores it).  -> exact [Q, W], index [Q, W]"""
    from tinygpt_cli.analysis import exact_tracin as ex
    from tinygpt_cli.analysis import tracin
    from tinygpt_cli.jobs.why_index import fit_windows

    exact = np.zeros((len(queries), len(x)))
    index = np.zeros_like(exact)
    fit = fit_windows(len(x))
    for params, lr in snapshots:
        exact_queries = [ex.next_token_query(params, config, q, t) for q, t in queries]
        stacked = ex.stack(exact_queries, config, params)
        proj = tracin.Projection.fit(params, config, x[fit], y[fit])
        qs = [tracin.query(q, config, proj) for q in exact_queries]
        for i in range(0, len(x), ex.BATCH):
            xb, yb = x[i:i + ex.BATCH], y[i:i + ex.BATCH]
            v, dv, dl = tracin.values_and_gradients(
                params, config, xb, lambda z, yb=yb: ex.mean_loss_gradient(z, yb))
            exact[:, i:i + len(xb)] += lr * ex.scores_from(config, v, dv, dl, xb, stacked)
            g = tracin.projected(config, v, dv, dl, xb, yb, proj)
            stored = tracin.stored([g])
            index[:, i:i + len(xb)] += lr * np.stack([tracin.scores(stored, xb, yb, q)
                                                      for q in qs])
    return exact, index


def lds(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """Per query, the rank correlation over the subsets between the predicted change (the sum
    of the subset's windows' scores) and the retrained model's log p(target).
    predicted, measured [M, Q] -> [Q]"""
    from tinygpt_cli.analysis.why import spearman

    return np.asarray([spearman(predicted[:, q], measured[:, q])
                       for q in range(predicted.shape[1])])


def _retrain(job) -> np.ndarray:
    config, x, y, chosen, steps, seed, queries = job
    params, _ = lds_train(config, x, y, chosen, steps, seed)
    return query_log_probs(params, config, queries)


def run_lds(windows: int, n_queries: int, retrains: int, steps: int,
            workers: int = 1, wider: bool = False) -> tuple[str, list[str]]:
    from tinygpt_cli.analysis.why import spearman

    t0 = time.perf_counter()
    config, stream, x, y, queries = lds_setup(windows, n_queries,
                                              sizes=LDS_WIDER if wider else LDS_CONFIG)
    full, snaps = lds_train(config, x, y, np.arange(len(x)), steps, seed=0,
                            snapshots=LDS_SNAPSHOTS)
    exact, index = lds_attributions(config, stream, x, y, snaps, queries)
    print(f"  full model and attributions: {time.perf_counter() - t0:.0f} s", file=sys.stderr,
          flush=True)
    from concurrent.futures import ProcessPoolExecutor

    rng = np.random.default_rng(1)
    masks = np.zeros((retrains, len(x)), bool)
    for m in range(retrains):
        masks[m, rng.permutation(len(x))[: len(x) // 2]] = True
    measured = np.zeros((retrains, len(queries)))
    jobs = [(config, x, y, np.flatnonzero(masks[m]), steps, 1 + m, queries)
            for m in range(retrains)]
    with ProcessPoolExecutor(workers) as pool:  # each retrain its own process
        for m, got in enumerate(pool.map(_retrain, jobs)):
            measured[m] = got
            if (m + 1) % 10 == 0:
                print(f"  retrain {m + 1}/{retrains}: {time.perf_counter() - t0:.0f} s",
                      file=sys.stderr, flush=True)
    rows = []
    noise = np.random.default_rng(2).normal(size=exact.shape)  # a baseline that knows nothing
    for label, scores in (("exact TracIn (`why --exact`)", exact),
                          ("the index, default sizes (`why`)", index),
                          ("random scores (baseline)", noise)):
        per_query = lds(masks.astype(np.float64) @ scores.T, measured)
        half = np.sqrt(np.var(per_query) / len(per_query))
        rows.append(f"| {label} | {per_query.mean():.3f} +- {half:.3f} | "
                    f"{np.median(per_query):.3f} | {np.mean(per_query > 0):.2f} |")
    agree = np.mean([spearman(index[q], exact[q]) for q in range(len(queries))])
    took = time.perf_counter() - t0
    spread = measured.std(axis=0).mean()
    head = (f"`python benchmarks/why_quality.py --lds --lds-windows {windows} --lds-queries "
            f"{n_queries} --retrains {retrains} --steps {steps} --jobs {workers}"
            f"{' --lds-wider' if wider else ''}`: a "
            f"{config.n_layer}-block, "
            f"d {config.n_embd}, context {config.n_positions} model ({LDS_VOCAB}-token BPE) "
            f"trained in the benchmark by the project's step (AdamW, peak lr {LDS_PEAK}, "
            f"batch {LDS_BATCH}, {steps} steps) on {len(x)} windows of part-000.txt; TracIn "
            f"from {LDS_SNAPSHOTS} evenly spaced snapshots of the full-data run; {retrains} "
            f"retrains on random halves (same initial weights, their own batch order); "
            f"{len(queries)} held-out queries (a prefix of a part-005 story and its real next "
            f"token), the measured output log p(target). Spread of that output over the "
            f"retrains: {spread:.3f} nats (mean over queries). The index's rank correlation "
            f"with exact TracIn over the windows: {agree:.3f}. {took / 60:.1f} min")
    lines = ["| attribution | LDS (mean over queries +- s.e.) | median | share of queries > 0 |",
             "|---|---:|---:|---:|", *rows]
    return head, lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--windows", type=int, default=1024)
    ap.add_argument("--queries", type=int, default=12)
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--variants", default="all", help="labels of VARIANTS separated by ';', "
                    "or 'all'")
    ap.add_argument("--lds", action="store_true", help="the linear datamodeling score instead")
    ap.add_argument("--all-windows", action="store_true", help="the index as built against "
                    "the exact pass over every window instead")
    ap.add_argument("--lds-windows", type=int, default=1024)
    ap.add_argument("--lds-queries", type=int, default=50)
    ap.add_argument("--retrains", type=int, default=100)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--jobs", type=int, default=1, help="--lds: retrains at once")
    ap.add_argument("--lds-wider", action="store_true", help="--lds: d 64, 4 heads, context 64")
    args = ap.parse_args()
    if args.lds:
        head, lines = run_lds(args.lds_windows, args.lds_queries, args.retrains, args.steps,
                              args.jobs, args.lds_wider)
        print(head)
        print("\n".join(lines))
        if args.write:
            write_results(head, lines, "why_lds", "## why: does attribution predict "
                          "retraining? (`benchmarks/why_quality.py --lds`, issue 31)")
        return
    if args.all_windows:
        head, lines = all_windows(args.queries)
        print(head)
        print("\n".join(lines))
        if args.write:
            write_results(head, lines, "why_all_windows", "## why: the index as built against "
                          "exact TracIn over every window (`benchmarks/why_quality.py "
                          "--all-windows`, issue 31)")
        return
    variants = VARIANTS if args.variants == "all" else [
        v for v in VARIANTS if v[0] in args.variants.split(";")]
    t0 = time.perf_counter()
    model, index, timeline, n, sample, asks = setup(args.windows, args.queries)
    exact, approx = measure(model, index, timeline, n, sample, asks, variants)
    lines = table(exact, approx, model.config, n, len(timeline), variants)
    took = time.perf_counter() - t0
    head = (f"{len(asks)} queries, a seeded sample of {len(sample):,} of the {n:,} windows, "
            f"{len(timeline)} snapshots; exact TracIn from the exact pass; {took / 60:.1f} min")
    print(head)
    print("\n".join(lines))
    np.savez(Path("/tmp") / f"why_quality-{len(sample)}.npz", exact=exact, sample=sample,
             **{label: a for label, a in approx.items()})
    if args.write:
        write_results(head, lines)


def write_results(head: str, lines: list[str], marker: str = "why_quality",
                  title: str = "## why: the index against exact TracIn "
                               "(benchmarks/why_quality.py)") -> None:
    """The section between results.md's <!-- marker --> lines, replaced (or added)."""
    from tinygpt_cli.storage.files import write_atomically

    path = ROOT / "benchmarks" / "results.md"
    text = path.read_text()
    begin, end = f"<!-- {marker} -->", f"<!-- /{marker} -->"
    section = "\n".join([begin, title, "", head, "", *lines, end])
    if begin in text:
        text = text[: text.index(begin)] + section + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    write_atomically(path, text.encode())


if __name__ == "__main__":
    main()
