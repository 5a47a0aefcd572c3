"""The corpus-wide work on a real Dask cluster (a LocalCluster on the loopback address: two
worker processes, one thread each, no dashboard) gives the one-machine answer bit for bit:
why's index files, top windows and scores, neurons' examples, means' file and sae train's
result; a worker killed during a build loses only the shards in flight."""

from __future__ import annotations

import json
import os
import signal
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import Runner, assert_one_error_line, clean_env
from test_history import index_files, run  # noqa: F401 - run: the trained folder's fixture

from tinygpt_cli.analysis import neurons as nrn
from tinygpt_cli.analysis import why
from tinygpt_cli.jobs import cluster, why_index
from tinygpt_cli.jobs import history as snapshots_of
from tinygpt_cli.jobs import neurons as neuron_job
from tinygpt_cli.jobs import why as why_job
from tinygpt_cli.jobs.why_index import open_index
from tinygpt_cli.transformer.folder import load_model

distributed = pytest.importorskip("distributed")

TEXT = "Tom saw a dog. The dog"


@pytest.fixture(scope="module")
def address():
    """A LocalCluster for the module: 2 worker processes of one thread, on 127.0.0.1."""
    local = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                     host="127.0.0.1", **cluster.NO_DASHBOARD)
    yield local.scheduler_address
    local.close()


@pytest.fixture(autouse=True)
def one_thread():
    """This process's BLAS at one thread, as every command starts it (threads.use_default,
    before NumPy loads; here NumPy was loaded by the test run with its own default): the
    one-machine reference, which a pool of several threads may round differently."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        yield


@pytest.fixture
def on_cluster(address):
    with cluster.engine(address) as e:
        yield e


@pytest.fixture
def cli(capsys, monkeypatch, run, tmp_path):  # noqa: F811 - the fixture imported above
    clean_env(monkeypatch)
    monkeypatch.setenv("TINYGPT_WEIGHTS", str(run))
    return Runner(capsys, monkeypatch)


def _in(monkeypatch, folder: Path) -> Path:
    monkeypatch.setenv("TINYGPT_CACHE", str(folder))
    return folder


def test_why_on_the_cluster_gives_this_machines_index_and_answer(cli, monkeypatch, tmp_path,
                                                                 address):
    """The index built and queried by two cluster workers: the same files (every shard's
    bytes, so its sha256; the manifest but for inodes and times) and the same top windows,
    scores and exact scores as the one-machine path's."""
    _in(monkeypatch, tmp_path / "here")
    here = cli("why", TEXT, "--json")
    assert here.code == 0, here.err
    _in(monkeypatch, tmp_path / "there")
    there = cli("--cluster", address, "why", TEXT, "--json")
    assert there.code == 0, there.err
    assert there.json()["top_windows"] == here.json()["top_windows"]
    assert {k: v for k, v in there.json().items() if k != "seconds"} == \
        {k: v for k, v in here.json().items() if k != "seconds"}
    (a,), (b,) = ((tmp_path / f / "why-tracin").iterdir() for f in ("here", "there"))
    assert index_files(a) == index_files(b)
    again = cli("--cluster", address, "why", TEXT, "--target", " ball", "--json")  # a query
    _in(monkeypatch, tmp_path / "here")  # of the index already built, on both
    assert again.json() == {**cli("why", TEXT, "--target", " ball", "--json").json(),
                            "seconds": again.json()["seconds"]}


def _index(run, tmp_path, monkeypatch, name: str):  # noqa: F811
    model = load_model(run)
    config = model.config
    index = why_job.load_index([run.parent / "data" / "part-000.txt"], model.tokenizer,
                           run / "tokenizer.json")
    n = len(why.windows(index.stream, config.n_positions)[0])
    found = snapshots_of.find_snapshots(run / "history", model.weights_file)
    timeline = [s for s in snapshots_of.timeline(model, found) if s.lr is not None]
    _in(monkeypatch, tmp_path / name)
    return index, timeline, config, open_index(index.key, [s.path for s in timeline], config, n)


def test_the_sharded_query_keeps_the_best_of_every_window(run, tmp_path, monkeypatch,  # noqa: F811
                                                          on_cluster):
    """Each shard keeps its own best 3 (shards of 4 windows), each task the best 3 of its
    shards'; merged, they hold the best 3 of the whole score matrix, with its numbers, on the
    cluster as on this machine; progress counts the shards scored."""
    index, timeline, config, grads = _index(run, tmp_path, monkeypatch, "a")
    grads.build(index.stream, config, workers=1, chunk=4)
    ids, target = load_model(run).tokenizer.encode("The cat sat on the"), 5
    params = [s.params for s in timeline]
    lrs = np.asarray([s.lr for s in timeline])
    x, y = why.windows(index.stream, config.n_positions)
    whole = grads.scores(params, config, x, y, ids, target) * lrs[:, None]  # [S, W]
    queries = grads.queries(params, config, ids, target)
    seen = []
    best3 = np.sort(np.argsort(-whole.sum(0), kind="stable")[:3])
    shards = len(grads.spans())
    assert shards > 4

    def top3(found):  # the best 3 of a query's candidates
        w, per = found
        assert list(w) == sorted(w) and 3 <= len(w) <= 3 * shards
        np.testing.assert_array_equal(per, whole[:, w])  # the numbers of the whole matrix
        keep = np.sort(np.argsort(-per.sum(0), kind="stable")[:3])
        return w[keep].tolist()

    assert top3(grads.best(queries, lrs, 3, config, cluster.Here(1))) == best3.tolist()
    assert top3(grads.best(queries, lrs, 3, config, on_cluster,
                           lambda d, t: seen.append((d, t)))) == best3.tolist()
    assert seen[-1] == (shards, shards) and [d for d, _ in seen] == sorted(d for d, _ in seen)
    monkeypatch.setattr(why_index, "TASKS_PER_WORKER", 1)  # several shards a task: one
    few = grads.best(queries, lrs, 3, config, on_cluster)  # best 3 of each of the 2 tasks
    assert top3(few) == best3.tolist() and len(few[0]) == 3 * on_cluster.workers


def test_a_worker_killed_during_a_build_loses_only_the_shards_in_flight(
        run, tmp_path, monkeypatch, on_cluster):  # noqa: F811
    """SIGKILL to one of the two worker processes once the build is under way: the scheduler
    reruns what it held (or the build ends with an error line's exception); the next build
    finishes, computing no shard that was already written, and the index equals the one the
    one-machine pool builds."""
    index, timeline, config, grads = _index(run, tmp_path, monkeypatch, "killed")
    client = on_cluster.opened().client
    pids = list(client.run(os.getpid).values())
    killed = []

    def kill_one(done, total):
        if done > 0 and not killed:
            os.kill(pids[0], signal.SIGKILL)
            killed.append(done)

    try:
        grads.build(index.stream, config, progress=kill_one, chunk=2, engine=on_cluster)
    except Exception as e:  # noqa: BLE001 - what a lost worker raises is the scheduler's choice
        assert "lost" in str(e) or type(e).__name__ in ("KilledWorker", "CommClosedError")
    assert killed
    kept = {p.name for p in grads.folder.glob("shard-*.npz")}
    before = {n: (grads.folder / n).read_bytes() for n in kept}
    grads.build(index.stream, config, chunk=2, engine=on_cluster)
    assert grads.complete
    assert all((grads.folder / n).read_bytes() == b for n, b in before.items())
    *_, reference = _index(run, tmp_path, monkeypatch, "reference")
    reference.build(index.stream, config, workers=2, chunk=2)
    assert index_files(grads.folder) == index_files(reference.folder)


def test_neurons_examples_on_the_cluster_are_this_machines(cli, run, tmp_path,  # noqa: F811
                                                           monkeypatch, address):
    """neurons --data: the maxima of every neuron (shards of 4 windows, each keeping its best,
    merged) and the examples shown, the same on the cluster; and the same windows as one
    pass over the whole corpus ranks (ties to the earlier window)."""
    model = load_model(run)
    data = run.parent / "data" / "part-000.txt"
    monkeypatch.setattr(cluster, "SHARD", 4)
    x, _ = why.windows(why_job.load_index([data], model.tokenizer, run / "tokenizer.json").stream,
                       model.config.n_positions)
    assert len(x) > 2 * cluster.SHARD
    here = neuron_job.corpus_maxima(model.params, model.config, x, keep=5)
    with cluster.engine(address) as there:
        found = neuron_job.corpus_maxima(model.params, model.config, x, keep=5, engine=there)
    for name in here:
        np.testing.assert_array_equal(found[name], here[name])
    top, _ = nrn.window_maxima(model.params, model.config, x, batch_size=len(x))
    order = np.argsort(-top, axis=1, kind="stable")[:, :5, :].transpose(0, 2, 1)
    np.testing.assert_array_equal(here["window"], order)
    np.testing.assert_allclose(here["value"], np.take_along_axis(
        top, order.transpose(0, 2, 1), axis=1).transpose(0, 2, 1), rtol=1e-6)
    args = ("neurons", "--layer", "1", "--neuron", "3", "--data", data, "--json")
    _in(monkeypatch, tmp_path / "here")
    a = cli(*args)
    _in(monkeypatch, tmp_path / "there")
    b = cli("--cluster", address, *args)
    assert a.code == b.code == 0, (a.err, b.err)
    assert a.json() == b.json()


def test_means_sae_train_eval_and_lens_fit_on_the_cluster_are_this_machines(
        cli, run, tmp_path, monkeypatch, address):  # noqa: F811
    """means, sae train and lens --fit with their passes in shards of 4 windows on two
    workers: the files they write equal the one-machine files byte for byte, and sae eval
    of the trained SAE says the same."""
    monkeypatch.setattr(cluster, "SHARD", 4)
    data = run.parent / "data"
    evals = []
    for where, extra in (("here", ()), ("there", ("--cluster", address))):
        _in(monkeypatch, tmp_path / where / "cache")
        m = cli(*extra, "means", "--data", data, "--out", tmp_path / where / "m.safetensors")
        assert m.code == 0, m.err
        s = cli(*extra, "sae", "train", "--site", "layers.0.mlp_out", "--data", data,
                "--latents", "16", "--k", "4", "--steps", "30", "--batch", "64",
                "--windows", "20", "--out", tmp_path / where / "s.safetensors")
        assert s.code == 0, s.err
        lens = cli(*extra, "lens", "--fit", "--data", data, "--lens",
                   tmp_path / where / "l.safetensors")
        assert lens.code == 0, lens.err
        ev = cli(*extra, "sae", "eval", "--sae", tmp_path / where / "s.safetensors", "--data",
                 data, "--windows", "10", "--json")
        assert ev.code == 0, ev.err
        evals.append(ev.json())
        feat = cli(*extra, "sae", "feature", "3", "--sae", tmp_path / where / "s.safetensors",
                   "--data", data, "--windows", "10", "--json")
        assert feat.code == 0, feat.err
        evals.append(feat.json())
    assert evals[0] == evals[2]  # sae eval's five passes, shard by shard on the workers
    assert evals[1] == evals[3]  # sae feature's codes, a task per shard
    codes = [sorted((tmp_path / w / "cache" / "sae-codes").glob("*/*")) for w in ("here", "there")]
    assert len(codes[0]) == 2 * 3 + 2  # 3 shards of 4 windows and the manifest, each checked
    assert [f.name for f in codes[0]] == [f.name for f in codes[1]]
    assert all(a.read_bytes() == b.read_bytes() for a, b in zip(*codes, strict=True))
    for name in ("m.safetensors", "s.safetensors", "l.safetensors"):
        assert (tmp_path / "here" / name).read_bytes() == (tmp_path / "there" / name).read_bytes()


def test_the_shards_of_a_pass_are_one_pass(run):  # noqa: F811
    """site_values and value_means shard by shard (shards of whole batches) equal one pass
    over all windows, exactly: the default path is the same as before the cluster."""
    from tinygpt_cli.analysis import means, sae
    from tinygpt_cli.jobs import means as mean_job
    from tinygpt_cli.jobs import sae as sae_job
    from tinygpt_cli.transformer.model import record

    model = load_model(run)
    rng = np.random.default_rng(0)
    x = rng.integers(0, model.config.vocab_size, (cluster.SHARD + 40, 8))
    whole = sae.site_values(model.params, model.config, x, "layers.1.mlp_out", batch=len(x))
    np.testing.assert_allclose(sae_job.site_values_on(None, model.params, model.config, x,
                                                      "layers.1.mlp_out"), whole, atol=1e-6)
    np.testing.assert_array_equal(
        sae_job.site_values_on(None, model.params, model.config, x, "layers.1.mlp_out"),
        sae.site_values(model.params, model.config, x, "layers.1.mlp_out"))
    got = mean_job.value_means(model.params, model.config, x)
    paths = means.mean_paths(model.config)
    total = {p: 0.0 for p in paths}
    for start in range(0, len(x), 16):  # the loop value_means ran before it was sharded
        _, values = record(model.params, model.config, x[start:start + 16], paths)
        for p in paths:
            total[p] = total[p] + values[p].astype(np.float64).reshape(
                -1, values[p].shape[-1]).sum(axis=0)
    for p in paths:
        np.testing.assert_array_equal(got[p], total[p] / x.size)


def test_without_dask_cluster_says_what_to_install(cli, run, monkeypatch, tmp_path):  # noqa: F811
    """--cluster with Dask missing: one error line naming the extra, exit 2."""
    import sys

    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed fails
    _in(monkeypatch, tmp_path / "cache")
    r = cli("--cluster", "local", "neurons", "--neuron", "0", "--layer", "0", "--data",
            run.parent / "data" / "part-000.txt")
    line = assert_one_error_line(r, 2, "--cluster needs Dask")
    assert line == 'error: --cluster needs Dask, which is not installed: ' \
                   'pip install "tinygpt-cli[cluster]"'


def test_an_unreachable_scheduler_is_one_error_line(cli, run, monkeypatch, tmp_path):  # noqa: F811
    """$TINYGPT_CLUSTER naming a port where no scheduler listens: one line, exit 2, naming
    the address and how to start one."""
    monkeypatch.setattr(cluster, "CONNECT_SECONDS", 2)
    monkeypatch.setenv("TINYGPT_CLUSTER", "tcp://127.0.0.1:9")
    _in(monkeypatch, tmp_path / "cache")
    r = cli("neurons", "--neuron", "0", "--layer", "0", "--data",
            run.parent / "data" / "part-000.txt")
    line = assert_one_error_line(r, 2, "cannot reach the Dask scheduler at 'tcp://127.0.0.1:9'")
    assert line.endswith("(start one with `dask scheduler`, or give --cluster local)")


def test_the_cluster_is_the_option_then_the_variable_then_this_machine():
    env = {"TINYGPT_CLUSTER": " tcp://10.0.0.1:8786 "}
    assert cluster.chosen(None, env) == "tcp://10.0.0.1:8786"
    assert cluster.chosen("local", env) == "local"
    assert cluster.chosen(None, {}) is None and cluster.chosen(None, {"TINYGPT_CLUSTER": ""}) \
        is None


def test_a_cluster_task_runs_with_one_blas_thread(on_cluster):
    """Every task runs in a worker whose BLAS pools have one thread."""
    with on_cluster.job(None) as tasks:
        found = [r for _, r in tasks(_blas_threads, [0, 1, 2, 3])]
    assert found == [1, 1, 1, 1]


def _blas_threads(task, shared) -> int:
    from threadpoolctl import threadpool_info

    return max(p["num_threads"] for p in threadpool_info())


def test_the_build_tasks_are_the_same_on_both_engines(run, tmp_path, monkeypatch,  # noqa: F811
                                                     on_cluster):
    """One shard task run on this machine's pool and on a cluster worker: the same bytes."""
    from tinygpt_cli.jobs import why_index

    index, timeline, config, grads = _index(run, tmp_path, monkeypatch, "tasks")
    grads.build(index.stream, config, workers=1, chunk=8)
    t = config.n_positions
    outs = [tmp_path / f"{name}.npz" for name in ("here", "there")]
    tasks = [("shard", 0, 0, str(timeline[0].path), str(grads.folder / "projection-0.npz"),
              str(out), np.asarray(index.stream[: 8 * t + 1], np.uint16)) for out in outs]
    with cluster.Here(1).job(asdict(config), spread="processes") as run_here:
        list(run_here(why_index.build_task, tasks[:1]))
    with on_cluster.job(asdict(config)) as run_there:
        list(run_there(why_index.build_task, tasks[1:]))
    assert outs[0].read_bytes() == outs[1].read_bytes() == \
        (grads.folder / json.loads((grads.folder / "index.json").read_text())
         ["shards"][0]["file"]).read_bytes()


def test_score_of_a_file_on_the_cluster_is_this_machines(cli, run, monkeypatch,  # noqa: F811
                                                         address):
    """score --file (every story, its JSON lines in order) and --stream, their batches
    tasks of two workers (two batches a task): the same output, byte for byte."""
    from tinygpt_cli.jobs import score

    monkeypatch.setattr(score, "BATCHES_PER_TASK", 2)
    data = run.parent / "data" / "part-000.txt"
    for args in (("score", "--file", data, "--json"), ("score", "--file", data, "--stream",
                                                       "--json")):
        here, there = cli(*args), cli("--cluster", address, *args)
        assert here.code == there.code == 0, (here.err, there.err)
        assert len(here.out.splitlines()) > 100 and there.out == here.out
