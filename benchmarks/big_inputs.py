"""Big inputs (issue 22 items 13-14): time, CPU time and peak memory of whole commands.

    python benchmarks/big_inputs.py                     # this checkout
    python benchmarks/big_inputs.py --root ../old      # another checkout (git archive REV)
    python benchmarks/big_inputs.py --only probs-each score-each --lines 2000

Builds its inputs in a temporary folder from the shared stories (never kept, never in the
repository), as benchmarks/run.py does: 5 MB of the stories on stdin for score, encode and
embed, and 10,000 of their lines (without separators, under 250 characters: each fits the
context) for --each-line. Each command runs once in a fresh process under /usr/bin/time -v,
stdout to a file; the table gives wall seconds, CPU seconds (user + system), peak resident
memory, the exit code, and the sha256 of stdout, so two checkouts can be compared for
identical output. The load average is printed first: on a shared machine the wall times
mean little without it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
COMMANDS = {  # name: (arguments, stdin is the big text)
    "probs-each": (["probs", "--each-line", "{lines}"], False),
    "score-each": (["score", "--each-line", "{lines}"], False),
    "score-stdin": (["score", "-"], True),
    "score-stdin-json": (["score", "-", "--json"], True),
    "encode-stdin": (["encode", "-"], True),
    "encode-stdin-json": (["encode", "-", "--json"], True),
    "embed-stdin": (["embed", "-"], True),
}


def data_folder() -> Path:
    for base in (os.environ.get("TINYGPT_DATA"), HERE.parent / ".." / "shared" / "data" /
                 "tinystories", HERE.parent / ".." / ".." / "shared" / "data" / "tinystories"):
        if base and Path(base).is_dir():
            return Path(base)
    sys.exit("no shared stories found: set TINYGPT_DATA")


def make_inputs(folder: Path, n_lines: int, n_bytes: int) -> tuple[Path, Path]:
    text = "".join(p.read_text(encoding="utf-8") for p in sorted(data_folder().glob("part-*.txt")))
    lines = [x for x in text.split("\n") if x.strip() and "<|endoftext|>" not in x
             and len(x) < 250][:n_lines]
    big, each = folder / "big.txt", folder / "lines.txt"
    big.write_bytes(text.encode("utf-8")[:n_bytes].decode("utf-8", "ignore").encode("utf-8"))
    each.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return big, each


def measured(root: Path, args: list[str], stdin: Path | None, out: Path) -> dict:
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "tinygpt_cli", *args]
    with open(out, "wb") as o, open(stdin or os.devnull, "rb") as i:
        r = subprocess.run(cmd, stdin=i, stdout=o, stderr=subprocess.PIPE, cwd=root, text=True)
    report = dict(re.findall(r"^\s*(.+?): (.+)$", r.stderr, re.M))
    wall = report["Elapsed (wall clock) time (h:mm:ss or m:ss)"].split(":")
    return {"wall_s": sum(float(x) * 60 ** k for k, x in enumerate(reversed(wall))),
            "cpu_s": float(report["User time (seconds)"]) + float(report["System time (seconds)"]),
            "peak_mb": int(report["Maximum resident set size (kbytes)"]) / 1024,
            "exit": r.returncode, "sha256": hashlib.sha256(out.read_bytes()).hexdigest()[:12]}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", type=Path, default=HERE.parent, help="the checkout to run")
    p.add_argument("--lines", type=int, default=10_000)
    p.add_argument("--bytes", type=int, default=5_000_000)
    p.add_argument("--only", nargs="*", choices=sorted(COMMANDS), default=sorted(COMMANDS))
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = p.parse_args(argv)
    load = os.getloadavg()
    print(f"root {args.root}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on "
          f"{os.cpu_count()} cores", file=sys.stderr)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        big, each = make_inputs(Path(tmp), args.lines, args.bytes)
        for name in args.only:
            words, on_stdin = COMMANDS[name]
            words = [w.format(lines=each) for w in words]
            results[name] = measured(args.root.resolve(), words, big if on_stdin else None,
                                     Path(tmp) / "out")
            r = results[name]
            print(f"{name:18} {r['wall_s']:7.1f} s wall {r['cpu_s']:7.1f} s cpu "
                  f"{r['peak_mb']:6.0f} MB  exit {r['exit']}  stdout {r['sha256']}",
                  file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps({"root": str(args.root), "load": load, "results": results}))


if __name__ == "__main__":
    main()
