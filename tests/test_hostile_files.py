"""Issue 34: the files *around* the model (snapshots, SAEs, tuned lenses, means, steering
vectors, data.json, the `why` index, the cache's temporaries) are checked as strictly as
model.safetensors. Every case ends as test_hostile's do: exit 2 (what the user gave) or 1 (a
broken file), nothing on stdout, one `error:` line naming the file, no catch-all.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import test_hostile as hostile
from cli_helpers import TEXT, TINY, random_params
from safetensors.numpy import save_file
from test_hostile import Ctx, assert_error, run, snapshot

from tinygpt_cli.weights import PREFIX

W = ["--weights", "{broken}"]
ctx, data, trained = hostile.ctx, hostile.data, hostile.trained  # its fixtures


def snapshot_meta(**meta):
    """A snapshot of the tiny model's sizes with `meta` as its metadata."""
    def write(path: Path) -> None:
        t = {PREFIX + n: a for n, a in random_params(TINY, seed=3).items()}
        save_file(t, str(path), metadata=meta)
    return write


def snapshots(*writes):
    """history/ holding step-000010 and step-000020 written by `writes`."""
    def setup(ctx: Ctx) -> None:
        (ctx.broken / "history").mkdir()
        for i, write in enumerate(writes):
            write(ctx.broken / "history" / f"step-{10 * (i + 1):06d}.safetensors")
    return setup


def loop(ctx: Ctx) -> None:
    (ctx.broken / "history").symlink_to(ctx.broken / "history")


# (id, setup, argv, exit code, words the error line must hold)
CASES = [
    # -------------------------------------------------- 1. snapshots' step and lr
    ("snapshot-lr-nan", snapshot(snapshot_meta(step="10", lr="nan")), ["history", TEXT, *W], 1,
     ["step-000010.safetensors: its metadata's learning rate 'nan' is not a finite positive"]),
    ("snapshot-lr-inf", snapshot(snapshot_meta(step="10", lr="inf")), ["history", TEXT, *W], 1,
     ["learning rate 'inf' is not a finite positive number"]),
    ("snapshot-lr-negative", snapshot(snapshot_meta(step="10", lr="-5")),
     ["history", TEXT, *W], 1, ["learning rate '-5' is not a finite positive number"]),
    ("snapshot-lr-zero", snapshot(snapshot_meta(step="10", lr="0")), ["history", TEXT, *W], 1,
     ["learning rate '0' is not"]),
    ("snapshot-step-against-name", snapshot(snapshot_meta(step="120", lr="0.001")),
     ["history", TEXT, *W], 1,
     ["step-000010.safetensors: its metadata says step 120 but its name says step 10"]),
    ("snapshot-step-negative", snapshot(snapshot_meta(step="-10", lr="0.001")),
     ["history", TEXT, *W], 1, ["step '-10' is not a number (a whole number of steps)"]),
    ("snapshot-header-nested-deep", snapshot(lambda p: p.write_bytes(
        (20_000).to_bytes(8, "little") + b"[" * 10_000 + b"]" * 10_000)),
     ["history", TEXT, *W], 1, ["step-000010.safetensors is not a readable safetensors file",
                                "maximum recursion depth"]),
    ("history-symlink-loop", loop, ["history", TEXT, *W], 1,
     ["history is not a folder (a symbolic link that leads nowhere or to itself"]),
]


@pytest.mark.parametrize("setup, argv, code, needles",
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_file(ctx, setup, argv, code, needles):
    def too_long(signum, frame):  # noqa: ARG001 - the signal handler's signature
        raise TimeoutError("the case ran for over 60 s: something blocked or looped")

    previous = signal.signal(signal.SIGALRM, too_long)
    signal.alarm(60)
    try:
        setup(ctx)
        assert_error(run(ctx, *argv), code, *needles)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_two_snapshots_of_one_step_are_refused(ctx):
    """step-000010 and a file renamed from it: two rows "step 10" would follow."""
    snapshots(snapshot_meta(step="10", lr="0.001"))(ctx)
    h = ctx.broken / "history"
    (h / "copy.safetensors").write_bytes((h / "step-000010.safetensors").read_bytes())
    assert_error(run(ctx, "history", TEXT, *W), 1, "history: two snapshots say they are step 10")


def test_good_snapshots_still_give_their_rows(ctx):
    snapshots(snapshot_meta(step="10", lr="0.001"), snapshot_meta(lr="2e-3"))(ctx)
    r = run(ctx, "history", TEXT, "--json", *W)
    assert r.code == 0, r.err
    rows = json.loads(r.out)["snapshots"]
    assert [(x["label"], x["lr"]) for x in rows] == [("step 10", 0.001), ("step 20", 0.002),
                                                     ("final", None)]
