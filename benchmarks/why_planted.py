"""Does `why --value` rank first the windows whose planted pattern built a head? (issue 31)

    python benchmarks/why_planted.py [--seeds 0 1 2] [--lr 1e-2] [--steps 2000] [--decoys 3]

A one-block model (d 32, 2 heads, context 32) is trained by the project's `train` (AdamW,
no dropout, batch 8, `--snapshots` log-spaced snapshots) on stories of exactly one window
each (31 tokens and <|endoftext|>, so a window is a story): `--base` filler stories, `--per`
planted stories for each of four made-up markers M ("The M came. ... Then zq M. ... Then
zq M.": after zq, copy the marker seen earlier; zq and the markers occur nowhere else), and
`--decoys` stories per marker holding the marker but not the pattern ("The M came. ...").
For each marker the value is `layers.0.heads.H.weights[-1,1]` on "The M came. The dog was
happy. Then zq" (zq's attention to M) for each head, scored exactly (why.exact_scores, the
pass `why --value` takes); it prints each head's attention at the end and the ranks (0 =
first of all windows) of the marker's planted windows and of its decoys.

A benchmark, not a test: about 6 s a seed on the 2-core machine.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tinygpt_cli.analysis import history as hist  # noqa: E402
from tinygpt_cli.analysis import why  # noqa: E402
from tinygpt_cli.config import Config  # noqa: E402
from tinygpt_cli.model import run_traced  # noqa: E402
from tinygpt_cli.tokenizer import END_OF_TEXT, save_tokenizer, train_tokenizer  # noqa: E402
from tinygpt_cli.train.loop import Settings, train  # noqa: E402
from tinygpt_cli.weights import load_model  # noqa: E402

FILL = ["The cat sat on the mat.", "The dog was happy.", "Tom had a red ball.",
        "Lily sings to the bird.", "The sun was warm.", "Ben found a box.",
        "Mia ran in the park.", "The hat was small."]
MARKERS = ["blick", "dax", "wug", "toma"]
QUERY = "The {m} came. The dog was happy. Then zq"


def filler(rng) -> str:
    return " ".join(rng.choice(FILL, 4, replace=False))


def story(kind: str, rng, copies: int) -> str:
    if kind == "base":
        return filler(rng)
    what, m = kind.split(":")
    if what == "decoy":
        return f"The {m} came. " + filler(rng)
    f = rng.choice(FILL, copies + 1)
    return f"The {m} came. {f[0]}" + "".join(f" Then zq {m}. {f[i + 1]}" for i in range(copies))


def one_window(tok, text: str, rng, t: int = 31) -> str:
    """The story padded with filler, then cut, to exactly t tokens."""
    while len(tok.encode(text)) < t:
        text += " " + rng.choice(FILL)
    return tok.decode(tok.encode(text)[:t])


def ranks(scores: np.ndarray, chosen: list[int]) -> list[int]:
    where = {int(w): r for r, w in enumerate(np.argsort(-scores, kind="stable"))}
    return sorted(where[w] for w in chosen)


def run(seed: int, a, root: Path) -> None:
    rng = np.random.default_rng(100 + seed)
    kinds = ([f"planted:{m}" for m in MARKERS for _ in range(a.per)] + ["base"] * a.base
             + [f"decoy:{m}" for m in MARKERS for _ in range(a.decoys)])
    kinds = [kinds[i] for i in rng.permutation(len(kinds))]
    raw = [story(k, rng, a.copies) for k in kinds]
    tok = train_tokenizer(raw + FILL * 20, 512)
    stories = [one_window(tok, s, rng) for s in raw] + [filler(rng)]
    folder = root / f"seed-{seed}"
    data = folder / "data"
    data.mkdir(parents=True)
    train_file = data / "part-000.txt"
    val_file = folder / "val.txt"
    train_file.write_text(f"\n{END_OF_TEXT}\n".join(stories) + "\n", encoding="utf-8")
    val_file.write_text(f"\n{END_OF_TEXT}\n".join(filler(rng) for _ in range(3)) + "\n",
                        encoding="utf-8")
    out = folder / "weights"
    save_tokenizer(tok, out / "tokenizer.json")
    config = Config(n_embd=32, n_layer=1, n_head=2, n_inner=64, n_positions=32,
                    vocab_size=tok.vocab_size)
    t0 = time.time()
    train([train_file], [val_file], out, Settings(
        steps=a.steps, batch_size=8, lr=a.lr, warmup=10, dropout=0.0, weight_decay=a.wd,
        eval_every=a.steps, checkpoint_every=a.steps, seed=seed, snapshots=a.snapshots,
        config=asdict(config)))
    model = load_model(out)
    config = model.config
    index = why.load_index([train_file], model.tokenizer, out / "tokenizer.json")
    x, _ = why.windows(index.stream, config.n_positions)
    assert all(x[w][-1] == model.tokenizer.eot_id for w in range(len(kinds))), "not aligned"
    timeline = [s for s in hist.timeline(model, hist.find_snapshots(
        hist.history_folder(model), model.weights_file)) if s.lr is not None]
    print(f"seed {seed}: {len(x)} windows, trained in {time.time() - t0:.1f} s")
    for m in MARKERS:
        ids = model.tokenizer.encode(QUERY.format(m=m))
        j = ids.index(model.tokenizer.encode(" " + m)[0])
        w = run_traced(model.params, config, np.asarray(ids)).values["layers.0.weights"]
        line = f"  {m:6s}"
        for h in range(config.n_head):
            value = why.value_of(model, ids, f"layers.0.heads.{h}.weights[-1,{j}]", 0, None)
            scores = why.exact_scores(index, timeline, config, [value.make])[0].sum(0)
            planted = [i for i, k in enumerate(kinds) if k == f"planted:{m}"]
            decoys = [i for i, k in enumerate(kinds) if k == f"decoy:{m}"]
            line += (f" | H{h} attention {w[h, -1, j]:.2f}: planted {ranks(scores, planted)}"
                     f" decoys {ranks(scores, decoys)}")
        print(line, flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--wd", type=float, default=0.1)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--snapshots", type=int, default=16)
    p.add_argument("--per", type=int, default=3, help="planted stories per marker")
    p.add_argument("--decoys", type=int, default=3, help="decoy stories per marker")
    p.add_argument("--base", type=int, default=24, help="filler stories")
    p.add_argument("--copies", type=int, default=2, help="zq M copies per planted story")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as root:
        for seed in a.seeds:
            run(seed, a, Path(root))


if __name__ == "__main__":
    main()
