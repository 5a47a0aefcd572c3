"""Does `why --value` rank first the windows whose planted pattern built a head? (issue 31)

The third attempt's setup, kept for its figures in results.md (why_planted). The setup that
holds is the test's, tests/test_why_planted.py: a marker no window holds, an untied head and
rotary positions, so that no window's own embedding row speaks for the value.

    python benchmarks/why_planted.py [--seeds 0 1 2 3 4 5] [--shuffle] [--lr 0.5] ...

TracIn's own setting, as far as it can be had: full-batch gradient descent (optim.SGD, no
momentum, every window in every step, no clipping, no decay) on a one-block model (d 16,
2 heads) over synthetic token ids, with a snapshot every `--every` steps, so that the sum of
the windows' scores is the value's first-order change over the run. Each window is one row
of the data, starting with the end-of-text id (so no window's last target is the next row's
unpredictable first token, which otherwise dominates every late gradient):

- `--planted` windows: one fixed "frame" sequence (its own tokens, found nowhere else) with
  the token X at position `--mi`, and from position mi + `--gap` on, `--copies` times
  "zq Y" every `--step` positions: after zq, say Y because X was there;
- `--contrast` windows: the same frame without X (its own token at mi, or with --crand a
  random frame token), and "zq N" in the same places: without them zq -> Y needs no head;
- `--base` windows: a cycle through other tokens (learnt by the direct path), jumping to a
  random phase at position `--jump` (0: a random phase from the start).

The value is each head's attention weight from zq to X on the frame's prefix up to the first
zq (`layers.0.heads.H.weights[-1,mi]`, why.value_of), scored over every window by
why_job.exact_scores, the pass `why --value` takes. `--shuffle` gives the control: Y or N at
random, whatever stands at mi (X no longer tells anything). It prints, per seed and head, the
weight at the end, its course over the snapshots, and the ranks (0 = first) of the planted
and of the contrast windows. A benchmark, not a test: 4 to 14 s a seed on the 2-core
machine with both cores busy (results.md, `why_planted`, has the figures).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tinygpt_cli.analysis import why  # noqa: E402
from tinygpt_cli.jobs import why as why_job  # noqa: E402
from tinygpt_cli.transformer import ops  # noqa: E402
from tinygpt_cli.transformer.config import Config  # noqa: E402
from tinygpt_cli.transformer.model import forward, init_params, loss_and_grads
from tinygpt_cli.transformer.optim import SGD  # noqa: E402
from tinygpt_cli.transformer.trace import run_traced  # noqa: E402


def rows_of(rng, a, shuffle: bool) -> tuple[list[list[int]], list[str], dict]:
    """The windows (each a row of a.T ids, end-of-text first) and their kinds, shuffled, with
    the ids that name the pattern."""
    nf, t = a.filler_vocab, a.T
    eot = nf
    frame_vocab = list(range(nf + 1, nf + 1 + a.frame_vocab))
    x, zq, yes, no = range(nf + 1 + a.frame_vocab, nf + 5 + a.frame_vocab)
    frame = [frame_vocab[i % len(frame_vocab)] for i in range(t)]
    spots = [a.mi + a.gap + a.step * c for c in range(a.copies)]
    assert spots[-1] + 1 < t, "the copies do not fit in the window"
    rows, kinds = [], []
    for _ in range(a.base):
        phase = int(rng.integers(0, nf))
        cut = a.jump or 0
        rows.append([i % nf for i in range(cut)] + [(phase + i) % nf for i in range(t - cut)])
        kinds.append("base")
    for k in range(a.planted + a.contrast):
        has = k < a.planted
        row = list(frame)
        if has:
            row[a.mi] = x
        elif a.crand:
            row[a.mi] = int(rng.choice(frame_vocab))
        says = bool(rng.integers(0, 2)) if shuffle else has
        for s in spots:
            row[s], row[s + 1] = zq, yes if says else no
        rows.append(row)
        kinds.append("planted" if has else "contrast")
    order = rng.permutation(len(rows))
    rows, kinds = [rows[i] for i in order], [kinds[i] for i in order]
    for row in rows:
        row[0] = eot
    query = [eot, *frame[1 : spots[0]], zq]
    query[a.mi] = x
    return rows, kinds, {"vocab": no + 1, "query": query, "yes": yes}


def train_full_batch(config: Config, x: np.ndarray, y: np.ndarray, a, rng) -> list:
    """Gradient descent on every window at once; a snapshot (params, lr) every a.every steps,
    taken before the step it weighs, so that lr * its scores sum to that step's change."""
    params = init_params(config, rng)
    opt, snapshots = SGD(params), []
    for step in range(a.steps):
        _, grads = loss_and_grads(params, config, x, y)
        if step % a.every == 0:
            snapshots.append(SimpleNamespace(params={n: p.copy() for n, p in params.items()},
                                             lr=a.lr * a.every))
        opt.step(params, grads, a.lr)
    return snapshots, params


def ranks(scores: np.ndarray, chosen: list[int]) -> list[int]:
    where = {int(w): r for r, w in enumerate(np.argsort(-scores, kind="stable"))}
    return sorted(where[w] for w in chosen)


def run(seed: int, a, shuffle: bool) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows, kinds, ids = rows_of(rng, a, shuffle)
    stream = np.asarray([i for row in rows for i in row] + [rows[0][0]], dtype=np.int64)
    config = Config(n_embd=a.d, n_layer=1, n_head=2, n_inner=2 * a.d, n_positions=a.T,
                    vocab_size=ids["vocab"])
    x, y = why.windows(stream, a.T)
    t0 = time.time()
    snapshots, params = train_full_batch(config, x, y, a, rng)
    model = SimpleNamespace(config=config, params=params)
    q = ids["query"]
    p_yes = float(ops.softmax(forward(params, config, np.asarray(q))[-1])[ids["yes"]])
    planted = [i for i, k in enumerate(kinds) if k == "planted"]
    contrast = [i for i, k in enumerate(kinds) if k == "contrast"]
    out = []
    for h in range(config.n_head):
        value = why.value_of(model, q, f"layers.0.heads.{h}.weights[-1,{a.mi}]", 0, None)
        scores = why_job.exact_scores(SimpleNamespace(stream=stream), snapshots, config,
                                  [value.make], workers=1)[0].sum(0)
        course = [float(run_traced(s.params, config, np.asarray(q)).values[
            "layers.0.weights"][h, -1, a.mi]) for s in snapshots]
        out.append({"head": h, "start": course[0], "end": value.amount, "course": course,
                    "planted": ranks(scores, planted), "contrast": ranks(scores, contrast),
                    "p_yes": p_yes, "seconds": time.time() - t0})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5])
    p.add_argument("--shuffle", action="store_true", help="the control: Y or N at random")
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--steps", type=int, default=2500)
    p.add_argument("--every", type=int, default=10, help="steps between snapshots")
    p.add_argument("--T", type=int, default=24, help="the context: one window per row")
    p.add_argument("--d", type=int, default=16)
    p.add_argument("--base", type=int, default=8)
    p.add_argument("--planted", type=int, default=4)
    p.add_argument("--contrast", type=int, default=4)
    p.add_argument("--crand", action="store_true", help="contrast: a random frame token at mi")
    p.add_argument("--filler-vocab", type=int, default=24)
    p.add_argument("--frame-vocab", type=int, default=8)
    p.add_argument("--mi", type=int, default=3, help="X's position")
    p.add_argument("--gap", type=int, default=8, help="from X to the first zq")
    p.add_argument("--step", type=int, default=2, help="between one zq and the next")
    p.add_argument("--copies", type=int, default=6, help="zq Y (or N) per window")
    p.add_argument("--jump", type=int, default=13, help="where base rows jump phase")
    a = p.parse_args()
    for seed in a.seeds:
        heads = run(seed, a, a.shuffle)
        print(f"seed {seed}{' (shuffled)' if a.shuffle else ''}: p(Y) {heads[0]['p_yes']:.2f},"
              f" {heads[-1]['seconds']:.1f} s")
        for r in heads:
            course = " ".join(f"{c:.2f}" for c in r["course"][:: max(1, len(r["course"]) // 8)])
            print(f"  H{r['head']} {r['start']:.2f} -> {r['end']:.2f} ({course}): planted "
                  f"{r['planted']} contrast {r['contrast']} of "
                  f"{a.base + a.planted + a.contrast}", flush=True)


if __name__ == "__main__":
    main()
