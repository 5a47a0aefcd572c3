"""Wall time of each "why this token" command on the seed sentence, from a cold shell.

Each command runs as its own `python -m tinygpt_cli ...` process (interpreter start, imports,
loading the weights, the analysis, rendering), stdout to a pipe, `--repeat` times; the table
gives the median and the best wall time, and the child's CPU time (user + system), which
depends less on what else the machine is doing. The targets of the issue: under 0.5 s for
each command, under 2 s for `ablate --all` and `patch` (which patches every head).

    python benchmarks/analysis_speed.py                 # shipped weights, 5 runs each
    python benchmarks/analysis_speed.py --repeat 9 --json
    python benchmarks/analysis_speed.py --threads 1     # BLAS threads of the children
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

TEXT = "Lily wanted to play with her"
CORRUPT = "Lily wanted to read with her"

COMMANDS = [
    ("lens", ["lens", TEXT], 0.5),
    ("dla", ["dla", TEXT], 0.5),
    ("dla --neurons", ["dla", TEXT, "--neurons"], 0.5),
    ("ablate (one head)", ["ablate", TEXT, "--layer", "2", "--head", "1"], 0.5),
    ("ablate --all", ["ablate", TEXT, "--all"], 2.0),
    ("ablate --all --mode mean", ["ablate", TEXT, "--all", "--mode", "mean"], 2.0),
    ("patch", ["patch", TEXT, CORRUPT], 2.0),
    ("patch --method atp", ["patch", TEXT, CORRUPT, "--method", "atp"], 2.0),
    ("attribute grad-x-input", ["attribute", TEXT], 0.5),
    ("attribute integrated-gradients", ["attribute", TEXT, "--method",
                                        "integrated-gradients"], 0.5),
    ("attribute attention-x-grad", ["attribute", TEXT, "--method", "attention-x-grad"], 0.5),
    ("(baseline) blocks", ["blocks", TEXT], None),
]


def run_once(args: list[str], env: dict) -> tuple[float, float]:
    """(wall seconds, child CPU seconds) of one cold run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tinygpt_cli", *args], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"tinygpt {' '.join(args)} failed: {done.stderr.strip()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="BLAS threads in each child")
    ap.add_argument("--weights", default=None)
    ap.add_argument("--json", action="store_true")
    opts = ap.parse_args()
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(opts.threads)
    if opts.weights:
        env["TINYGPT_WEIGHTS"] = opts.weights
    rows = []
    for name, args, limit in COMMANDS:
        runs = [run_once(args, env) for _ in range(opts.repeat)]
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        rows.append({"command": name, "median_s": statistics.median(walls), "best_s": min(walls),
                     "cpu_median_s": statistics.median(cpus), "limit_s": limit})
        print(f"  {name}", file=sys.stderr)
    if opts.json:
        print(json.dumps({"text": TEXT, "repeat": opts.repeat, "threads": opts.threads,
                          "load_average": os.getloadavg(), "rows": rows}))
        return
    print(f"{'command':34} {'median':>8} {'best':>8} {'cpu':>8} {'limit':>6}")
    for r in rows:
        limit = f"{r['limit_s']:.1f}" if r["limit_s"] else ""
        print(f"{r['command']:34} {r['median_s']:8.3f} {r['best_s']:8.3f} "
              f"{r['cpu_median_s']:8.3f} {limit:>6}")
    print(f"load average while measuring: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
