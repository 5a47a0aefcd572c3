"""Peak memory of encoding one long text, per input byte (issue 53): one word of random
letters, one number of random digits, and ordinary text, each encoded by the shipped
tokenizer in a fresh process; the peak resident memory the encoding adds (ru_maxrss after
minus before; the tokenizer's own Rust allocations count, which tracemalloc would miss).

    python benchmarks/encode_memory.py            # 1 and 4 MB of each kind
    python benchmarks/encode_memory.py --mb 16

tests/test_tokenizer_families.py runs the 4 MB word with -m slow and holds it under 100 bytes
a byte.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

KINDS = ("word", "digits", "text")

CHILD = r"""
import json, random, resource, sys, time
from tinygpt_cli.transformer.tokenizer import Tokenizer
from tinygpt_cli.storage.weights import SHIPPED

n, kind = int(sys.argv[1]), sys.argv[2]
rng = random.Random(0)
if kind == "word":
    text = "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=n))
elif kind == "digits":
    text = "".join(rng.choices("0123456789", k=n))
else:
    text = ("Lily wanted to play with her ball. Tom said: 'Yes!'\n" * (n // 50 + 1))[:n]
tok = Tokenizer.from_file(SHIPPED / "tokenizer.json")
tok.encode(text[:5000])
getattr(tok, "_joinable", None)  # the merge table: made once per tokenizer
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
ids = tok.encode(text)
seconds = time.perf_counter() - start
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"kind": kind, "bytes": n, "tokens": len(ids), "seconds": seconds,
                  "added_bytes": (after - before) * 1024}))
"""


def measure(n: int, kind: str) -> dict:
    """One encoding in a fresh process: its figures, bytes_per_byte among them."""
    out = subprocess.run([sys.executable, "-c", CHILD, str(n), kind], capture_output=True,
                         text=True, check=True, timeout=600)
    r = json.loads(out.stdout)
    return {**r, "bytes_per_byte": r["added_bytes"] / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, nargs="+", default=[1, 4])
    args = ap.parse_args()
    print("| text | MB | tokens | seconds | added peak MB | bytes per byte |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for mb in args.mb:
        for kind in KINDS:
            r = measure(int(mb * 1e6), kind)
            print(f"| {kind} | {mb:g} | {r['tokens']:,} | {r['seconds']:.1f} | "
                  f"{r['added_bytes'] / 1e6:.0f} | {r['bytes_per_byte']:.0f} |")


if __name__ == "__main__":
    main()
