"""Issue 34: the files *around* the model (snapshots, SAEs, tuned lenses, means, steering
vectors, data.json, the `why` index, the cache's temporaries) are checked as strictly as
model.safetensors. Every case ends as test_hostile's do: exit 2 (what the user gave) or 1 (a
broken file), nothing on stdout, one `error:` line naming the file, no catch-all.
"""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import test_hostile as hostile
from cli_helpers import TEXT, TINY, file_tensors, random_params
from safetensors.numpy import save_file
from test_hostile import Ctx, assert_error, nothing, run, snapshot

from tinygpt_cli.transformer.families.gpt2 import PREFIX

W = ["--weights", "{broken}"]
ctx, data, trained = hostile.ctx, hostile.data, hostile.trained  # its fixtures


def snapshot_meta(**meta):
    """A snapshot of the tiny model's sizes with `meta` as its metadata, stamped with the
    weights beside its history/ as a finished run stamps it."""
    def write(path: Path) -> None:
        from tinygpt_cli.storage.madefor import made_for

        t = file_tensors(random_params(TINY, seed=3))
        save_file(t, str(path), metadata={**meta,
                                          **made_for(path.parent.parent / "model.safetensors")})
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


OTHER = "ab" * 32  # the sha256 of weights that are not these
SAE = "sae/layers.1.resid_post.safetensors"


def sae_file(name: str = SAE, site: str = "layers.1.resid_post", made_for: str | None = None):
    """An SAE of the tiny model's sizes at {broken}/name, its metadata naming `site` and the
    weights `made_for` (None: no claim; "these": the broken folder's own weights)."""
    def setup(ctx: Ctx) -> None:
        from test_sae import random_sae

        from tinygpt_cli.jobs.dictionaries.saes import save_sae
        from tinygpt_cli.storage.files import sha256

        meta = {} if made_for is None else {"weights_sha256": sha256(
            ctx.broken / "model.safetensors") if made_for == "these" else made_for}
        sae = random_sae(TINY.n_embd, 8, 2, seed=1, dtype=np.float32)
        sae.site = site
        (ctx.broken / name).parent.mkdir(parents=True, exist_ok=True)
        save_sae(ctx.broken / name, sae, meta)
    return setup


def lens_file(made_for: str | None):
    def setup(ctx: Ctx) -> None:
        t = {f"{n}.{i}": np.zeros((16, 16) if n == "A" else 16, np.float32)
             for n in "Ab" for i in range(TINY.n_layer)}
        from tinygpt_cli.storage.files import sha256

        claim = sha256(ctx.broken / "model.safetensors") if made_for == "these" else made_for
        (ctx.broken / "lens").mkdir(exist_ok=True)
        save_file(t, str(ctx.broken / "lens" / "tuned.safetensors"),
                  metadata={} if claim is None else {"weights_sha256": claim})
    return setup


def vector_file(ctx: Ctx) -> None:
    from tinygpt_cli.jobs.dictionaries.directions import direction_file

    (ctx.tmp / "v.safetensors").write_bytes(direction_file(
        np.ones(16, np.float32), "layers.0.resid_pre", "steer", {},
        meta={"weights_sha256": OTHER}))


MEANS_OF_RUN = ["means", "--weights", "{run}", "--out", "{tmp}/m.safetensors"]  # reads data.json


def with_history(setup):
    """`setup`, and {run} given a history/ of one snapshot (its own weights at step 10), so
    that why reaches its training text (a folder without one is refused for that first)."""
    def both(ctx: Ctx) -> None:
        from tinygpt_cli.jobs.train.loop import save_snapshot, stamp_snapshots
        from tinygpt_cli.transformer.folder import load_model

        setup(ctx)
        model = load_model(ctx.run)
        save_snapshot(ctx.run, model.params, model.config, model.family, 10, 1e-3)
        stamp_snapshots(ctx.run)
    return both


def scaled_weights(name: str, factor: float):
    def setup(ctx: Ctx) -> None:
        t = {n: a.astype(np.float32) for n, a in file_tensors(random_params(TINY, seed=3)).items()}
        t[PREFIX + name] = t[PREFIX + name] * np.float32(factor)
        save_file(t, str(ctx.broken / "model.safetensors"))
    return setup


def huge(make, name: str):
    """`make`'s file with tensor `name` filled with 3e38 (finite, and past any use)."""
    def setup(ctx: Ctx) -> None:
        make(ctx)
        path = next(p for p in ctx.broken.rglob("*.safetensors") if p.name != "model.safetensors")
        from safetensors import safe_open
        from safetensors.numpy import load_file

        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata()
        t = load_file(str(path))
        t[name] = np.full_like(t[name], 3e38)
        save_file(t, str(path), metadata=meta)
    return setup


def config_value(**changes):
    def setup(ctx: Ctx) -> None:
        d = json.loads((ctx.broken / "config.json").read_text())
        (ctx.broken / "config.json").write_text(json.dumps({**d, **changes}))
    return setup


def means_file(ctx: Ctx) -> None:
    from tinygpt_cli.analysis.means import mean_paths, mean_size
    from tinygpt_cli.storage.files import sha256

    t = {p: np.zeros(mean_size(p, TINY), np.float32) for p in mean_paths(TINY)}
    save_file(t, str(ctx.broken / "means.safetensors"),
              metadata={"weights_sha256": sha256(ctx.broken / "model.safetensors")})


def recorded_text(edit=None, **record):
    """{run}'s data.json pointing at a copy of the training parts in {tmp}/d, `edit(the
    folder)` run on the copy, and `record` changed."""
    def setup(ctx: Ctx) -> None:
        shutil.copytree(ctx.data, ctx.tmp / "d")
        if edit is not None:
            edit(ctx.tmp / "d")
        path = ctx.run / "data.json"
        d = json.loads(path.read_text())
        path.write_text(json.dumps({**d, "folder": str(ctx.tmp / "d"), "folder_absolute": None,
                                    **record}))
    return setup


def appended(folder: Path) -> None:
    with open(folder / "part-000.txt", "a") as f:
        f.write("A story added after training.\n")


def replaced_same_size(folder: Path) -> None:
    p = folder / "part-000.txt"
    text = p.read_text()
    p.write_text(text.replace("cat", "dog", 1) if "cat" in text else "x" + text[1:])


def data_json(text: str):
    def setup(ctx: Ctx) -> None:
        (ctx.run / "data.json").write_text(text)
    return setup


def npy(name: str, array=None, header: dict | None = None):
    """{tmp}/name: `array` saved as .npy, or a header (`header`) over 64 bytes of zeros."""
    def setup(ctx: Ctx) -> None:
        path = ctx.tmp / name
        if header is None:
            np.save(path, array)
            return
        import io

        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(buf, header)
        path.write_bytes(buf.getvalue() + bytes(64))
    return setup


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
    # -------------------------------------------------- 2. the weights a file was made for
    ("sae-for-other-weights", sae_file(made_for=OTHER),
     ["trace", TEXT, "sae.layers.1.resid_post", *W], 2,
     [f"{SAE}: the SAE was made for other weights (weights_sha256 abababababababab...",
      "train one for them with `tinygpt sae train --site layers.1.resid_post --weights "]),
    ("sae-for-no-weights", sae_file(), ["trace", TEXT, "sae.layers.1.resid_post", *W], 1,
     [f"{SAE}: its metadata does not say which weights the SAE was made for (weights_sha256)"]),
    ("sae-site-against-name", sae_file(site="layers.0.resid_post", made_for="these"),
     ["trace", TEXT, "sae.layers.1.resid_post", *W], 1,
     [f"{SAE}: its metadata says it reads layers.0.resid_post, its file name says "
      "layers.1.resid_post"]),
    ("sae-given-for-other-weights", sae_file("mine.safetensors", made_for=OTHER),
     ["sae", "feature", "0", "--text", TEXT, "--sae", "{broken}/mine.safetensors", *W], 2,
     ["mine.safetensors: the SAE was made for other weights"]),
    ("lens-for-other-weights", lens_file(OTHER), ["lens", TEXT, "--kind", "tuned", *W], 2,
     ["lens/tuned.safetensors: the tuned lens was made for other weights",
      "fit one for them with `tinygpt lens --fit --weights "]),
    ("lens-for-no-weights", lens_file(None), ["lens", TEXT, "--kind", "tuned", *W], 1,
     ["tuned.safetensors: its metadata does not say which weights the tuned lens was made"]),
    ("steer-vector-for-other-weights", vector_file,
     ["generate", TEXT, "--steer-vector", "{tmp}/v.safetensors", *W], 2,
     ["--steer-vector ", "/v.safetensors: the vector was made for other weights",
      "find it again on these weights (tinygpt steer --out)"]),
    # -------------------------------------------------- 3. finite values whose use overflows
    ("weights-norm-squares-overflow", scaled_weights("wte.weight", 1e21),
     ["probs", TEXT, *W], 1, ["the forward pass overflowed: layers.0.ln1.std is the first "
                              "value holding infinite or NaN numbers"]),
    ("weights-norm-squares-overflow-generate", scaled_weights("wte.weight", 1e21),
     ["generate", TEXT, "-n", "2", *W], 1, ["layers.0.ln1.std is the first value"]),
    ("sae-encoder-3e38", huge(sae_file(made_for="these"), "W_enc"),
     ["trace", TEXT, "sae.layers.1.resid_post", *W], 1,
     [f"{SAE}: its latents overflow float32 on these values (W_enc or b_enc too large"]),
    ("sae-encoder-3e38-ablated", huge(sae_file(made_for="these"), "W_enc"),
     ["trace", TEXT, "logits", "--ablate", "sae.layers.1.resid_post.3", *W], 1,
     [f"{SAE}: its latents overflow float32"]),
    ("lens-3e38", huge(lens_file("these"), "A.0"), ["lens", TEXT, "--kind", "tuned", *W], 1,
     ["lens/tuned.safetensors: stage 0's translator (A.0, b.0) overflows float32 on this text"]),
    ("means-3e38", huge(means_file, "layers.0.heads.0.out"),
     ["ablate", TEXT, "--all", "--mode", "mean", *W], 1,
     ["means.safetensors: the mean of layers.0.heads.0.out is too large for a value of a "
      "float32 run (its sum of squares overflows)"]),
    ("config-epsilon-0-in-float32", config_value(layer_norm_epsilon=1e-300),
     ["embed", TEXT, *W], 1,
     ["config: layer_norm_epsilon 1e-300 is 0 in float32, the precision the model computes "
      "in: give a number from 1.2e-38 to 1"]),
    # -------------------------------------------------- 4. data.json: the text edited since
    ("recorded-text-grown", with_history(recorded_text(appended)), ["why", "Lily", "--weights",
                                                                      "{run}"], 2,
     ["the training text recorded in", "data.json has changed since training:",
      "part-000.txt differs from the record (", "give --data the text the model was trained"]),
    ("recorded-text-same-size", with_history(recorded_text(replaced_same_size)),
     ["why", "Lily", "--weights", "{run}"], 2,
     ["part-000.txt differs from the record (its sha256 is not the recorded one)"]),
    ("recorded-validation-edited", recorded_text(lambda d: (d / "part-002.txt").write_text(
        "Edited.\n")), MEANS_OF_RUN, 2,
     ["the validation text recorded in", "has changed since training: ",
      "part-002.txt differs from the record"]),
    # -------------------------------------------------- 6. data.json's types and depth
    ("data-json-folder-a-number", recorded_text(folder=5), MEANS_OF_RUN,
     1, ["data.json is not a readable data record (folder must be a path or null, not 5)"]),
    ("data-json-absolute-a-list", recorded_text(folder=None, folder_absolute=["x"]),
     MEANS_OF_RUN, 1,
     ["data.json is not a readable data record (folder_absolute must be a path or null, "
      "not ['x'])"]),
    ("data-json-nested-deep", data_json("[" * 100_000 + "]" * 100_000),
     MEANS_OF_RUN, 1,
     ["data.json is not a readable data record (it is nested too deep)"]),
    ("data-json-a-list", data_json("[1, 2]"), MEANS_OF_RUN, 1,
     ["data.json is not a readable data record (it is not a JSON object)"]),
    # -------------------------------------------------- 6. --steer-vector .npy files
    ("steer-npy-claims-10-12-floats", npy("big.npy", header={
        "descr": "<f4", "fortran_order": False, "shape": (10**12,)}),
     ["generate", TEXT, "--steer-vector", "{tmp}/big.npy", "--steer-layer", "0", *W], 1,
     ["big.npy: its header claims 1,000,000,000,000 numbers (4,000,000,000,000 bytes) and "
      "the file holds 64 bytes after it"]),
    ("steer-npy-strings", npy("s.npy", np.array(["a"] * 16)),
     ["generate", TEXT, "--steer-vector", "{tmp}/s.npy", "--steer-layer", "0", *W], 2,
     ["s.npy: the file holds str32 values (dtype '<U1'); a vector is real floating-point"]),
    ("steer-npy-complex", npy("c.npy", np.ones(16, np.complex64) * 1j),
     ["generate", TEXT, "--steer-vector", "{tmp}/c.npy", "--steer-layer", "0", *W], 2,
     ["c.npy: the file holds complex64 values (dtype '<c8')"]),
    ("steer-npy-integers", npy("i.npy", np.ones(16, np.int64)),
     ["generate", TEXT, "--steer-vector", "{tmp}/i.npy", "--steer-layer", "0", *W], 2,
     ["i.npy: the file holds int64 values"]),
    ("steer-npy-junk", lambda c: (c.tmp / "j.npy").write_bytes(b"\x93NUMPY\x01\x00junk"),
     ["generate", TEXT, "--steer-vector", "{tmp}/j.npy", "--steer-layer", "0", *W], 1,
     ["j.npy: not a readable .npy file"]),
    # -------------------------------------------------- 9. options that cannot hold together
    ("weights-before-and-after", nothing, ["--weights", "{tmp}/nowhere", "probs", TEXT, *W], 2,
     ["--weights is given twice (--weights ", "/nowhere and --weights ", "/broken): give it "
      "once"]),
    ("weights-twice-after", nothing, ["probs", TEXT, "--weights={tiny}", *W], 2,
     ["--weights is given twice"]),
    ("attn-all-heads-and-head", nothing, ["attn", TEXT, "--all-heads", "--head", "3", *W], 2,
     ["--all-heads shows every head and --head 3 picks one: give one of them"]),
    ("attn-all-heads-and-head-0", nothing, ["attn", TEXT, "--all-heads", "-H", "0", *W], 2,
     ["--all-heads shows every head and --head 0 picks one"]),
    ("train-arch-unknown", nothing, ["train", "--data", "{data}", "--out", "{tmp}/new",
                                     "--arch", "mamba"], 2,
     ["--arch must be one of gpt2, neo, neox, llama, gemma3, not 'mamba'"]),
    ("train-resume-and-init", nothing, ["train", "--data", "{data}", "--out", "{run}",
                                        "--resume", "--init", "{tiny}"], 2,
     ["--resume continues ", "/run, --init ", " starts from other weights: give one of them"]),
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


def test_a_saved_direction_names_its_weights_and_other_weights_refuse_it(ctx):
    """steer --out records the weights it was found on; the run folder's weights (the same
    residual width, other numbers) refuse it, its own take it."""
    examples = Path(__file__).parent.parent / "examples"
    out = ctx.tmp / "happy.safetensors"
    r = run(ctx, "steer", "--pos", examples / "happy.txt", "--neg", examples / "sad.txt",
            "--layer", "1", "--out", out, *W)
    assert r.code == 0, r.err
    r = run(ctx, "generate", TEXT, "-n", "2", "--steer-vector", out, *W)
    assert r.code == 0, r.err
    r = run(ctx, "generate", "a", "-n", "2", "--steer-vector", out, "--weights", "{run}")
    assert_error(r, 2, "happy.safetensors: the vector was made for other weights")


# ------------------------------------------------------------------ 7. bounded stdin reads


def _child(argv, stdin, tiny_folder):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TINYGPT_WEIGHTS"}
    return subprocess.Popen([sys.executable, "-m", "tinygpt_cli", *argv, "--weights",
                             str(tiny_folder)], stdin=stdin, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)


def test_an_endless_stdin_is_refused_after_a_bounded_prefix(ctx):
    """/dev/zero never ends: the text is refused once more bytes came than 128 tokens of
    the tiny vocabulary's longest token can hold (it was read whole: MemoryError)."""
    from tinygpt_cli.transformer.tokenizer import Tokenizer

    longest = Tokenizer.from_file(ctx.tiny / "tokenizer.json").longest_token_bytes
    with open("/dev/zero", "rb") as zero:
        proc = _child(["embed", "-"], zero, ctx.tiny)
        out, err = proc.communicate(timeout=60)
    most = TINY.n_positions * longest
    assert (proc.returncode, out) == (2, b""), err
    assert err.decode() == (f"error: the text on stdin is more than {2 * most + 2:,} bytes long "
                            f"(read no further); this model reads at most 128 tokens (128 "
                            f"tokens never hold more than {most:,} characters)\n")


def test_each_line_streams_an_endless_stdin_with_bounded_memory(ctx):
    """`yes | tinygpt encode --each-line -`: results come while the stream goes on (it
    printed nothing as its memory passed 6 GB), and the process stays small."""
    import subprocess

    yes = subprocess.Popen(["yes", "Lily"], stdout=subprocess.PIPE)
    proc = _child(["encode", "--each-line", "-", "--json"], yes.stdout, ctx.tiny)
    yes.stdout.close()  # the child holds it now
    try:
        first = [proc.stdout.readline() for _ in range(3)]
        sizes = []
        for _ in range(3):
            for _ in range(3000):  # lines flowing, thousands past what it computes ahead
                proc.stdout.readline()
            with open(f"/proc/{proc.pid}/status") as f:
                sizes.append(next(int(x.split()[1]) for x in f if x.startswith("VmRSS")))
    finally:
        proc.kill()
        yes.kill()
        proc.communicate()
        yes.wait()
    assert [json.loads(x)["line"] for x in first] == [1, 2, 3]
    assert sizes[-1] - sizes[0] < 20_000, sizes  # kB: flat, not growing with the stream


def test_each_line_of_a_stream_checks_utf8_and_blank_streams(ctx):
    from io import BytesIO, TextIOWrapper

    cases = [(b"Lily\n\xff\n", 2, "error: stdin is not UTF-8 text (byte 0xff at offset 5)"),
             (b"\n  \n", 2, "error: --each-line stdin has no lines with text")]
    for data, code, want in cases:
        stdin = TextIOWrapper(BytesIO(data), encoding="utf-8")
        r = hostile._run_main(["encode", "--each-line", "-", "--weights", ctx.tiny], stdin)
        assert r.code == code and r.err.splitlines()[-1].startswith(want), r.err


# ------------------------------------------------------------------ 8. no temporaries left


def test_a_killed_writers_temporary_is_removed_by_the_next_save(ctx):
    """A `.NAME.PID.XXXXXXXX.tmp` whose writer is gone (a kill inside write_atomically) is
    removed by the next write into its folder; a live writer's (this process's) is kept."""
    import os

    stale = ctx.tmp / "out" / ".attn.svg.999999999.abcdefgh.tmp"
    live = ctx.tmp / "out" / f".other.svg.{os.getpid()}.abcdefgh.tmp"
    stale.parent.mkdir()
    stale.write_bytes(b"half a picture")
    live.write_bytes(b"being written")
    (ctx.tmp / "out" / ".hidden.tmp").write_bytes(b"not ours")  # not our pattern: left
    r = run(ctx, "attn", TEXT, "--save", "{tmp}/out/attn.svg", *W)
    assert r.code == 0, r.err
    assert sorted(p.name for p in (ctx.tmp / "out").iterdir()) == \
        sorted([".hidden.tmp", live.name, "attn.svg"])


# ------------------------------------------------------------------ 5. cache entries' checksums


def test_a_cache_entry_is_read_only_when_its_checksum_holds(tmp_path):
    """keep writes the entry and its sha256; an entry edited in place (a value changed, the
    file still well formed), without its checksum, or with another one, is computed again."""
    from tinygpt_cli.storage import cache

    path = tmp_path / "means" / "k.safetensors"
    computed = []

    def compute():
        computed.append(1)
        return b"fresh"

    def get():
        return cache.load_or_compute(path, lambda p: p.read_bytes(), compute, cache.keep)

    assert get() == b"fresh" and len(computed) == 1
    assert get() == b"fresh" and len(computed) == 1  # read back, its checksum holds
    for damage in (lambda: path.write_bytes(b"frish"),  # same size, a value changed
                   lambda: (path.parent / "k.safetensors.sha256").unlink(),
                   lambda: (path.parent / "k.safetensors.sha256").write_text("0" * 64)):
        damage()
        assert get() == b"fresh"
    assert len(computed) == 4
    assert sorted(p.name for p in path.parent.iterdir()) == ["k.safetensors",
                                                           "k.safetensors.sha256"]
