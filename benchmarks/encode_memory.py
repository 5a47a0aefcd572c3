"""Peak memory of encoding one long text, per input byte (issue 53): one word of random
letters, one number of random digits, and ordinary text, each encoded in a fresh process by
the shipped byte-level tokenizer or a SentencePiece-style one (Gemma's layout, Llama 2's; built
as tests/shipped_tokenizers.py builds them, 800 tokens). Two figures a row, each its own
process: the peak resident memory the encoding adds (ru_maxrss after minus before, the text
and the tokenizer already loaded; the library's Rust allocations count), and tracemalloc's
peak (Python's own allocations only: the ids list, the pieces). `--whole` adds the library's
own encode of the whole text in one call, the figure without pieces.

    python benchmarks/encode_memory.py                  # the issue's sizes
    python benchmarks/encode_memory.py --rows word:0.1 text:10 --tokenizers shipped gemma
    python benchmarks/encode_memory.py --whole --rows word:0.1 text:1

tests/test_tokenizer_families.py runs the 4 MB word with -m slow and holds it under 100 bytes
a byte; tests/test_encode_pieces.py the same for a SentencePiece-style tokenizer.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

KINDS = ("word", "digits", "text")
TOKENIZERS = ("shipped", "gemma", "llama2")
ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, random, resource, sys, time, tracemalloc
sys.path.insert(0, sys.argv[5])
from tinygpt_cli.transformer.tokenizer import Tokenizer

n, kind, which, how = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
rng = random.Random(0)
if kind == "word":
    text = "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=n))
elif kind == "digits":
    text = "".join(rng.choices("0123456789", k=n))
else:
    text = ("Lily wanted to play with her ball. Tom said: 'Yes!'\n" * (n // 50 + 1))[:n]
if which == "shipped":
    from tinygpt_cli.storage.locations import SHIPPED
    tok = Tokenizer.from_file(SHIPPED / "tokenizer.json")
else:
    from shipped_tokenizers import sentencepiece
    tok = Tokenizer.from_str(sentencepiece(which)[0])
tok.encode(text[:5000])
# made once per tokenizer, whatever the text: the merges' table, the longest token
tok._merge_index, tok.longest_token_bytes, tok.special_tokens
if tok.byte_fallback:
    tok._known_chars
if how == "tracemalloc":
    tracemalloc.start()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
if how == "whole":
    ids = tok._tok.encode(text, add_special_tokens=False).ids
else:
    ids = tok.encode(text)
seconds = time.perf_counter() - start
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
traced = tracemalloc.get_traced_memory()[1] if how == "tracemalloc" else None
print(json.dumps({"kind": kind, "bytes": n, "tokens": len(ids), "seconds": seconds,
                  "added_bytes": (after - before) * 1024, "traced_bytes": traced}))
"""


def measure(n: int, kind: str, tokenizer: str = "shipped", how: str = "pieces") -> dict:
    """One encoding in a fresh process (`how`: pieces, the library's whole call, or pieces
    under tracemalloc): its figures, bytes_per_byte among them."""
    out = subprocess.run([sys.executable, "-c", CHILD, str(n), kind, tokenizer, how,
                          str(ROOT / "tests")], capture_output=True, text=True, check=True,
                         timeout=1800, cwd=ROOT)
    r = json.loads(out.stdout)
    return {**r, "bytes_per_byte": r["added_bytes"] / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", nargs="+", default=["word:0.1", "word:1", "digits:1", "text:10"],
                    help="KIND:MB, KIND one of word, digits, text")
    ap.add_argument("--tokenizers", nargs="+", default=list(TOKENIZERS), choices=TOKENIZERS)
    ap.add_argument("--whole", action="store_true",
                    help="also the library's own encode of the whole text, in one call")
    args = ap.parse_args()
    print("| tokenizer | text | MB | tokens | seconds | added peak RSS MB | RSS bytes per byte "
          "| tracemalloc peak, bytes per byte | whole text in one call: seconds, RSS bytes "
          "per byte |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for tokenizer in args.tokenizers:
        for row in args.rows:
            kind, mb = row.split(":")
            n = int(float(mb) * 1e6)
            r = measure(n, kind, tokenizer)
            traced = measure(n, kind, tokenizer, "tracemalloc")["traced_bytes"] / n
            whole = "-"
            if args.whole:
                w = measure(n, kind, tokenizer, "whole")
                whole = f"{w['seconds']:.1f} s, {w['bytes_per_byte']:.0f}"
            print(f"| {tokenizer} | {kind} | {float(mb):g} | {r['tokens']:,} | "
                  f"{r['seconds']:.1f} | {r['added_bytes'] / 1e6:.1f} | "
                  f"{r['bytes_per_byte']:.1f} | {traced:.1f} | {whole} |", flush=True)


if __name__ == "__main__":
    main()
