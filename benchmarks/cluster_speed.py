"""How `why`'s gradient index build and query scale: this machine's pool against 1 and 2
workers of a Dask LocalCluster, and a larger synthetic text on 2 workers.

    python benchmarks/cluster_speed.py                  # a few minutes on 2 idle cores
    python benchmarks/cluster_speed.py --windows 256    # smaller (faster, noisier)
    python benchmarks/cluster_speed.py --windows 1024 --growth 1,2,4 --write

The shipped model and its snapshots (weights/history), the first --windows windows of its
training text (part-000.txt). Each build starts from an index folder holding only the
snapshots' projections (fitted once, timed apart: a fixed cost), so it times the shards, the
part that grows with the text; the cluster, when there is one, is already started (timed
apart). The query is one `why` question on the built index: the query gradients, every shard
scored where it lies keeping its best (tinygpt_cli.jobs.why_index), the winners merged
and re-scored exactly. The growth rows build indexes of a synthetic text of k times
--windows windows: the same stories, copy i rolled by i * T / k tokens so that no window
repeats. --write puts the table into benchmarks/results.md (the section "Past one
machine"), with the machine's load.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = next((p for p in (Path(os.environ.get("TINYGPT_DATA", "/nonexistent")),
                         ROOT.parent / "shared" / "data" / "tinystories",
                         ROOT.parent.parent / "shared" / "data" / "tinystories")
             if p.is_dir()), ROOT.parent / "shared" / "data" / "tinystories")
QUERY = ("Once upon a time, there was a little", " girl")
SECTION = "## Past one machine: why's index on a Dask cluster"


def text_of(model, windows: int, copies: int = 1) -> np.ndarray:
    """The first `windows` windows of part-000's tokens; `copies` of them, copy i rolled by
    i * T / copies tokens."""
    from tinygpt_cli.jobs.corpus import read_stories
    from tinygpt_cli.transformer.windows import encode_stories

    t = model.config.n_positions
    ids = encode_stories(read_stories([DATA / "part-000.txt"]), model.tokenizer).ids
    base = np.asarray(ids[: windows * t], np.uint16)
    parts = [np.roll(base, i * t // copies) for i in range(copies)]
    return np.concatenate([*parts, base[:1]])  # and the token after the last window


def fitted(model, timeline, stream, folder: Path) -> float:
    """Each snapshot's projection, fitted once here (one process, one thread) into `folder`;
    the seconds it took. Every build below starts from copies of them, so that it times the
    part that grows with the text: the shards."""
    from tinygpt_cli.analysis import tracin
    from tinygpt_cli.jobs.why_index import fit_windows
    from tinygpt_cli.storage.cache import npz_bytes
    from tinygpt_cli.storage.files import write_checked

    t = model.config.n_positions
    n = (len(stream) - 1) // t
    sample = fit_windows(n)
    x = np.stack([stream[w * t : w * t + t] for w in sample]).astype(np.int64)
    y = np.stack([stream[w * t + 1 : w * t + t + 1] for w in sample]).astype(np.int64)
    t0 = time.perf_counter()
    for s, snapshot in enumerate(timeline):
        p = tracin.Projection.fit(snapshot.params, model.config, x, y)
        write_checked(folder / f"projection-{s}.npz", npz_bytes(**p.arrays()))
    return time.perf_counter() - t0


def timed_build(model, timeline, stream, engine, cache: Path) -> tuple[float, object]:
    import shutil

    from tinygpt_cli.jobs.why_index import TracinIndex
    from tinygpt_cli.storage.cache import key_of

    config = model.config
    n = (len(stream) - 1) // config.n_positions
    folder = cache / key_of("bench", str(n), str(stream[:64].tolist()), str(time.time()))
    folder.mkdir(parents=True)
    for f in (cache / "projections").iterdir():
        shutil.copy(f, folder / f.name)
    grads = TracinIndex(folder, n, [s.path for s in timeline], "bench")
    t0 = time.perf_counter()
    grads.build(stream, config, engine=engine)
    return time.perf_counter() - t0, grads


def timed_query(model, timeline, stream, grads, engine) -> float:
    from tinygpt_cli.analysis import why
    from tinygpt_cli.jobs import why as why_job

    index = why.Index(stream, None, "bench", ["bench"], np.array([len(stream)]))
    ids = model.tokenizer.encode(QUERY[0])
    target = model.tokenizer.encode(QUERY[1])[0]
    t0 = time.perf_counter()
    why_job.influence(index, timeline, model.config, ids, target, 10, grads, engine=engine)
    return time.perf_counter() - t0


def timed_scoring(model, timeline, grads) -> float:
    """Seconds to score every shard of the index on one core, keeping the best (the part of a
    query that grows with the index; the query's gradients are made before, apart), with the
    shards in the page cache, as they are right after the build."""
    from tinygpt_cli.jobs import cluster

    ids = model.tokenizer.encode(QUERY[0])
    target = model.tokenizer.encode(QUERY[1])[0]
    queries = grads.queries([s.params for s in timeline], model.config, ids, target, workers=1)
    lrs = np.asarray([s.lr for s in timeline])
    t0 = time.perf_counter()
    grads.best(queries, lrs, 20, model.config, cluster.Here(1))
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--windows", type=int, default=512, help="windows of the text (default 512)")
    ap.add_argument("--growth", default="1,2", help="sizes of the synthetic text, in --windows "
                    "(default 1,2: on 2 workers)")
    ap.add_argument("--write", action="store_true", help="write the table to results.md")
    args = ap.parse_args(argv)
    from distributed import LocalCluster

    from tinygpt_cli.jobs import cluster
    from tinygpt_cli.jobs import history as snapshots_of
    from tinygpt_cli.transformer.folder import load_model

    load = os.getloadavg()[0]
    model = load_model(None)
    found = snapshots_of.find_snapshots(model.folder / "history", model.weights_file)
    timeline = [s for s in snapshots_of.timeline(model, found) if s.lr is not None]
    cache = Path(tempfile.mkdtemp(prefix="tinygpt-cluster-bench-"))
    stream = text_of(model, args.windows)
    (cache / "projections").mkdir()
    fit = fitted(model, timeline, stream, cache / "projections")
    print(f"fitting the {len(timeline)} projections (once, one thread): {fit:.1f} s", flush=True)
    S = len(timeline)
    rows = []

    def row(what, workers, build, grads, query):
        wg = grads.n_windows * S
        mb = sum(f.stat().st_size for f in grads.folder.glob("shard-*.npz")) / 1e6
        rows.append((what, workers, grads.n_windows, len(grads.spans()), build, wg / build,
                     query, mb))
        print(f"{what}: {grads.n_windows:,} windows x {S} snapshots, build {build:.1f} s "
              f"({wg / build:.1f} window gradients/s), index {mb:.0f} MB, query {query:.2f} s",
              flush=True)

    here = cluster.Here(2)
    build, grads = timed_build(model, timeline, stream, here, cache)
    row("this machine's pool", 2, build, grads, timed_query(model, timeline, stream, grads, here))
    scored = timed_scoring(model, timeline, grads)
    rate = sum(f.stat().st_size for f in grads.folder.glob("shard-*.npz")) / 1e6 / scored
    print(f"scoring every shard on one core: {scored:.2f} s, {rate:.0f} MB/s", flush=True)
    started = {}
    for n in (1, 2):
        t0 = time.perf_counter()
        local = LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                             host="127.0.0.1", **cluster.NO_DASHBOARD)
        started[n] = time.perf_counter() - t0
        with cluster.engine(local.scheduler_address) as on:
            build, grads = timed_build(model, timeline, stream, on, cache)
            row(f"LocalCluster, {n} worker{'s' if n > 1 else ''}", n, build, grads,
                timed_query(model, timeline, stream, grads, on))
            if n == 2:
                for k in [int(k) for k in args.growth.split(",") if int(k) > 1]:
                    big = text_of(model, args.windows, k)
                    build, grads = timed_build(model, timeline, big, on, cache)
                    row(f"LocalCluster, 2 workers, text x{k}", 2, build, grads,
                        timed_query(model, timeline, big, grads, on))
        local.close()
    end_load = os.getloadavg()[0]
    table = report(rows, started, load, end_load, args, fit, S, rate)
    print(table)
    if args.write:
        write(table)
    return 0


def report(rows, started, load, end_load, args, fit: float, snapshots: int,
           rate: float) -> str:
    base = rows[0][4]
    one = next(r[4] for r in rows if r[1] == 1)
    lines = [SECTION, "",
             f"`python benchmarks/cluster_speed.py --windows {args.windows} --growth "
             f"{args.growth}` on {platform.node() or 'this machine'} "
             f"({os.cpu_count()} cores, {platform.python_version()}), "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average "
             f"{load:.1f} at the start, {end_load:.1f} at the end (the cores were "
             f"{'shared with other work' if max(load, end_load) > 1.5 else 'idle'}). The "
             "shipped model, its snapshots, shards of 256 windows; LocalCluster start-up "
             + ", ".join(f"{n} worker{'s' if n > 1 else ''} {s:.1f} s"
                         for n, s in started.items()) + f"; the {snapshots} snapshots' "
             f"projections fitted once, {fit:.1f} s on one thread (neither is in the build "
             "times: a build below computes every shard, the part that grows with the text).",
             "",
             "| where | workers | windows | shards a snapshot | build | window gradients/s | "
             "vs 1 worker | vs this machine | index | query |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for what, workers, n, shards, build, per_second, query, mb in rows:
        lines.append(f"| {what} | {workers} | {n:,} | {shards} | {build:.1f} s | "
                     f"{per_second:.1f} | "
                     f"{one / build * n / rows[0][2]:.2f}x | "
                     f"{base / build * n / rows[0][2]:.2f}x | {mb:.0f} MB | {query:.2f} s |")
    lines += ["", "Speed-ups are per window (a row of a larger text is scaled by its size). "
              "The query: the query gradients at every snapshot, every shard scored keeping its "
              "best, the best 20 re-scored exactly (the fixed part, which does not grow with "
              "the index). Scoring the shards alone, the part of a query that grows with the "
              f"index, reads {rate:.0f} MB/s on one core (one thread, shards in the page cache)."]
    return "\n".join(lines) + "\n"


def write(table: str) -> None:
    results = ROOT / "benchmarks" / "results.md"
    text = results.read_text(encoding="utf-8")
    if SECTION in text:
        start = text.index(SECTION)
        rest = text.find("\n## ", start + len(SECTION))
        text = text[:start] + table + (text[rest:] if rest >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + table
    from tinygpt_cli.storage.files import write_text

    write_text(results, text)


if __name__ == "__main__":
    raise SystemExit(main())
