"""Graphs in the field's format: `graph --format circuit-tracer` validated against a schema
written here from circuit-tracer's own pydantic models (decoderesearch/circuit-tracer,
circuit_tracer/frontend/graph_models.py at v0.5.0+, commit 4bb8c0e, schema_version 1), its
node ids, the logit minus the vocabulary's mean recomputed from the model's logits, the
target's edges summing to its value; and `graph --open FILE`'s re-check and refusals."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from cli_helpers import assert_one_error_line

from tinygpt_cli.transformer.model import forward

# ------------------------------------------------------------------ the schema, from the models
# Metadata, QParams, Node, Link and Model of circuit-tracer's graph_models.py, field by field:
# (type, required). "float|None" fields may be null; pydantic ignores unknown fields.

METADATA = {"slug": (str, True), "scan": (str, True), "transcoder_list": ("list[str]", True),
            "prompt_tokens": ("list[str]", True), "prompt": (str, True),
            "node_threshold": ("float|None", False), "schema_version": ("int|None", False)}
QPARAMS = {"pinnedIds": ("list[str]", True), "supernodes": ("list[list[str]]", True),
           "linkType": (str, True), "clickedId": (str, True), "sg_pos": (str, True)}
NODE = {"node_id": (str, True), "feature": (int, True), "layer": (str, True),
        "ctx_idx": (int, True), "feature_type": (str, True), "token_prob": (float, False),
        "is_target_logit": (bool, False), "run_idx": (int, False),
        "reverse_ctx_idx": (int, False), "jsNodeId": (str, True), "clerp": (str, False),
        "influence": ("float|None", False), "activation": ("float|None", False)}
LINK = {"source": (str, True), "target": (str, True), "weight": (float, True)}


def _is(x, kind) -> bool:
    if kind == "float|None":
        return x is None or _is(x, float)
    if kind == "int|None":
        return x is None or _is(x, int)
    if kind == "list[str]":
        return isinstance(x, list) and all(isinstance(s, str) for s in x)
    if kind == "list[list[str]]":
        return isinstance(x, list) and all(_is(s, "list[str]") for s in x)
    if kind is float:  # pydantic takes an int for a float; JSON has no NaN
        return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
    if kind is int:
        return isinstance(x, int) and not isinstance(x, bool)
    return isinstance(x, kind)


def validate(obj, fields: dict, where: str) -> list[str]:
    if not isinstance(obj, dict):
        return [f"{where}: not an object"]
    errors = [f"{where}.{k}: missing" for k, (_, need) in fields.items() if need and k not in obj]
    errors += [f"{where}.{k}: {obj[k]!r} is not {kind}" for k, (kind, _) in fields.items()
               if k in obj and not _is(obj[k], kind)]
    return errors


def validate_graph(doc) -> list[str]:
    errors = []
    for key in ("metadata", "qParams", "nodes", "links"):
        if key not in doc:
            errors.append(f"{key}: missing")
    if errors:
        return errors
    errors += validate(doc["metadata"], METADATA, "metadata")
    errors += validate(doc["qParams"], QPARAMS, "qParams")
    for i, n in enumerate(doc["nodes"]):
        errors += validate(n, NODE, f"nodes[{i}]")
    for i, e in enumerate(doc["links"]):  # Model.links is list[dict]; Link's fields
        errors += validate(e, LINK, f"links[{i}]")
    return errors


def test_the_validator_catches_what_pydantic_would():
    good = {"metadata": {"slug": "s", "scan": "x", "transcoder_list": [],
                         "prompt_tokens": ["a"], "prompt": "a"},
            "qParams": {"pinnedIds": [], "supernodes": [], "linkType": "both",
                        "clickedId": "", "sg_pos": ""},
            "nodes": [{"node_id": "E_1_0", "feature": 0, "layer": "E", "ctx_idx": 0,
                       "feature_type": "embedding", "jsNodeId": "E_1-0"}],
            "links": [{"source": "E_1_0", "target": "E_1_0", "weight": 1}]}
    assert validate_graph(good) == []
    bad = json.loads(json.dumps(good))
    bad["nodes"][0]["layer"] = 0
    del bad["qParams"]["sg_pos"]
    bad["links"][0]["weight"] = "1"
    assert len(validate_graph(bad)) == 3


# ------------------------------------------------------------------ the commands

STORY = "Lily wanted to play with her ball. Tom was happy and they ran to the park.\n\n"
TEXT = "Lily wanted to play with her"


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny):
    """Transcoders trained by the command on the tiny model (the cli fixture is per test)."""
    from tinygpt_cli.cli.entry import main

    tmp = tmp_path_factory.mktemp("field")
    data = tmp / "data"
    data.mkdir()
    for part in ("part-000.txt", "part-001.txt"):
        (data / part).write_text(STORY * 30, encoding="utf-8")
    folder = tmp / "tc"
    with pytest.raises(SystemExit) as done:
        main(["--weights", str(tiny.folder), "transcoder", "train", "--data",
              str(data), "--transcoders", str(folder), "--latents", "24", "--k", "4",
              "--steps", "40", "--batch", "64", "--windows", "6", "--json"])
    assert done.value.code in (0, None)
    return folder, data


def cantor(x: int, y: int) -> int:  # circuit-tracer's pairing, as its paper defines it
    return (x + y) * (x + y + 1) // 2 + y


@pytest.fixture
def field_graph(cli, trained, tmp_path):
    """The whole graph (no pruning) in the field's format, and its file."""
    folder, data = trained
    r = cli("graph", TEXT, "--transcoders", folder, "--data", data, "--windows", "4",
            "--format", "circuit-tracer", "--node-threshold", "1", "--edge-threshold", "1")
    assert r.code == 0, r.err
    path = tmp_path / "g.json"
    path.write_text(r.out, encoding="utf-8")
    return r.json(), path


def test_circuit_tracer_format_validates_against_its_models(field_graph, tiny):
    doc, _ = field_graph
    assert validate_graph(doc) == []
    meta = doc["metadata"]
    assert meta["schema_version"] == 1 and meta["node_threshold"] == 1
    ids = tiny.model.tokenizer.encode(TEXT)
    assert meta["prompt_tokens"] == [tiny.model.tokenizer.decode([i]) for i in ids]
    assert len(meta["transcoder_list"]) == tiny.model.config.n_layer
    nl = tiny.model.config.n_layer
    kinds = {n["feature_type"] for n in doc["nodes"]}
    assert kinds == {"cross layer transcoder", "mlp reconstruction error", "embedding", "logit"}
    names = [n["node_id"] for n in doc["nodes"]]
    assert len(set(names)) == len(names)
    for n in doc["nodes"]:
        lay, pos = n["layer"], n["ctx_idx"]
        if n["feature_type"] == "cross layer transcoder":
            latent = int(n["node_id"].split("_")[1])
            assert n["node_id"] == f"{lay}_{latent}_{pos}"
            assert n["feature"] == cantor(int(lay), latent)
            assert n["jsNodeId"] == f"{lay}_{latent}-0" and n["activation"] > 0
        elif n["feature_type"] == "mlp reconstruction error":
            assert n["node_id"] in (f"0_{lay}_{pos}", f"{lay}_-1_{pos}") and n["feature"] == -1
        elif n["feature_type"] == "embedding":
            assert n["node_id"] == f"E_{ids[pos]}_{pos}" and lay == "E" and n["feature"] == pos
        else:
            assert n["node_id"] == f"{nl + 1}_{n['feature']}_{len(ids) - 1}"
            assert lay == str(nl + 1) and n["jsNodeId"] == f"L_{n['feature']}-{pos}"
    assert sorted(n["ctx_idx"] for n in doc["nodes"] if n["layer"] == "E") == list(
        range(len(ids)))
    ends = set(names)
    assert doc["links"] and all(e["source"] in ends and e["target"] in ends
                                for e in doc["links"])


def test_the_target_is_the_logit_minus_the_mean_and_its_edges_add_up(field_graph, tiny):
    doc, _ = field_graph
    ids = tiny.model.tokenizer.encode(TEXT)
    real = np.asarray(forward(tiny.model.params, tiny.model.config, np.asarray(ids))[-1],
                      np.float64)
    (t,) = [n for n in doc["nodes"] if n["is_target_logit"]]
    assert t["feature"] == int(real.argmax())
    assert t["logit"] == pytest.approx(real.max() - real.mean(), abs=1e-4)
    p = np.exp(real - real.max()) / np.exp(real - real.max()).sum()
    assert t["token_prob"] == pytest.approx(p.max(), abs=1e-5)
    into = sum(e["weight"] for e in doc["links"] if e["target"] == t["node_id"])
    assert into + t["unexplained"] == pytest.approx(t["logit"], abs=1e-12)
    # unpruned, what is unexplained is the constants alone: the edges hold the rest exactly
    assert into + t["constants"] == pytest.approx(t["logit"], abs=1e-6)
    assert t["unexplained"] == pytest.approx(t["constants"], abs=1e-6)


def test_a_pruned_graph_says_what_it_leaves_out(cli, trained):
    folder, _ = trained
    doc = cli("graph", TEXT, "--transcoders", folder, "--format", "circuit-tracer",
              "--node-threshold", "0.3", "--edge-threshold", "0.5").json()
    assert validate_graph(doc) == []
    (t,) = [n for n in doc["nodes"] if n["is_target_logit"]]
    into = sum(e["weight"] for e in doc["links"] if e["target"] == t["node_id"])
    assert into + t["unexplained"] == pytest.approx(t["logit"], abs=1e-12)
    assert abs(t["unexplained"] - t["constants"]) > 1e-6  # edges were cut
    assert_one_error_line(cli("graph", TEXT, "--transcoders", folder, "--format",
                              "circuit-tracer", "--vs", "#5"), 2, "--vs")
    assert_one_error_line(cli("graph", TEXT, "--transcoders", folder, "--format", "dot"), 2,
                          "--format", "circuit-tracer")
    assert_one_error_line(cli("graph", TEXT, "--transcoders", folder, "--format",
                              "circuit-tracer", "--qk"), 2, "does not take --qk")


# ------------------------------------------------------------------ graph --open


def test_open_rechecks_every_edge_and_names_the_worst(cli, trained, field_graph, tmp_path):
    folder, _ = trained
    doc, path = field_graph
    r = cli("graph", "--open", path, "--transcoders", folder, "--json")
    assert r.code == 0, r.err
    got = r.json()
    assert got["links"] == len(doc["links"]) == got["checked"] == got["agree"]
    assert got["worst"] == []
    t = got["target_logit"]
    assert t["here"] == pytest.approx(t["file"], abs=1e-9)
    # one edge changed by 1% of its target's largest: the re-check finds it, and only it
    (t_node,) = [n["node_id"] for n in doc["nodes"] if n["is_target_logit"]]
    into = [e for e in doc["links"] if e["target"] == t_node]
    big = max(abs(e["weight"]) for e in into)
    into[0]["weight"] += 0.01 * big
    lying = tmp_path / "lying.json"
    lying.write_text(json.dumps(doc), encoding="utf-8")
    got = cli("graph", "--open", lying, "--transcoders", folder, "--json").json()
    assert got["agree"] == got["links"] - 1
    assert [(w["source"], w["target"]) for w in got["worst"]] == [(into[0]["source"], t_node)]
    assert got["worst"][0]["file"] == pytest.approx(got["worst"][0]["here"] + 0.01 * big)
    loose = cli("graph", "--open", lying, "--transcoders", folder, "--tolerance", "0.02",
                "--json").json()
    assert loose["agree"] == loose["links"]
    assert_one_error_line(cli("graph", TEXT, "--open", lying, "--transcoders", folder), 2,
                          "give no TEXT")
    assert_one_error_line(cli("graph", "--open", lying, "--transcoders", folder, "--ablate",
                              "0_1_2"), 2, "--open does not take --ablate")
    assert_one_error_line(cli("graph", "--open", lying, "--transcoders", folder, "--steer",
                              "happy", "--steer-away", "sad", "--steer-layer", "1"), 2,
                          "no --steer")
    shown = cli("graph", "--open", lying, "--transcoders", folder,
                "--save", tmp_path / "v.html")
    assert shown.code == 0 and "do not" in shown.out and (tmp_path / "v.html").exists()
    page = (tmp_path / "v.html").read_text(encoding="utf-8")
    said = f"{got['agree']:,} of its {got['checked']:,} edges checked agree"
    assert t_node in page and said in page
    # fewer rows computed here: the edges into the features left out are counted apart
    capped = cli("graph", "--open", path, "--transcoders", folder, "--max-features", "2",
                 "--json").json()
    features = {n["node_id"] for n in doc["nodes"]
                if n["feature_type"] == "cross layer transcoder"}
    into_features = sum(e["target"] in features for e in doc["links"])
    assert into_features > 2 and capped["checked"] < capped["links"]
    assert capped["links"] - capped["checked"] <= into_features
    assert capped["agree"] == capped["checked"]


def test_a_prompt_longer_than_the_model_reads_is_refused(field_graph, tiny):
    from tinygpt_cli.analysis import graph_file
    from tinygpt_cli.errors import InputError

    _, path = field_graph
    fg = graph_file.read_field_graph(path)
    c = tiny.model.config
    args = (fg, c.n_layer, [24] * c.n_layer, c.vocab_size, tiny.model.tokenizer.decode)
    graph_file.check_fits(*args, len(fg.token_ids))
    with pytest.raises(InputError, match=f"has {len(fg.token_ids)} tokens; this model reads"):
        graph_file.check_fits(*args, len(fg.token_ids) - 1)


def _edit(doc: dict, tmp_path, change) -> str:
    doc = json.loads(json.dumps(doc))
    change(doc)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def _node(doc, kind):
    return next(n for n in doc["nodes"] if n["feature_type"] == kind)


@pytest.mark.parametrize(("change", "needle"), [
    (lambda d: _node(d, "embedding").update(node_id="E_4095_0"), "token id 4095 at position 0"),
    (lambda d: _node(d, "cross layer transcoder").update(node_id="0_999_" + str(
        _node(d, "cross layer transcoder")["ctx_idx"]), layer="0"), "latents"),
    (lambda d: [n.update(layer="9") for n in d["nodes"] if n["feature_type"] == "logit"],
     "blocks"),
    (lambda d: _node(d, "mlp reconstruction error").update(layer="7"), "block 7"),
])
def test_open_refuses_a_graph_of_another_model_by_name(cli, trained, field_graph, tmp_path,
                                                       change, needle):
    folder, _ = trained
    doc, _ = field_graph
    if needle == "latents":  # links name nodes by id: keep them pointing at a node
        doc = json.loads(json.dumps(doc))
        n = _node(doc, "cross layer transcoder")
        old = n["node_id"]
        change(doc)
        for e in doc["links"]:
            e["source"] = n["node_id"] if e["source"] == old else e["source"]
            e["target"] = n["node_id"] if e["target"] == old else e["target"]
        path = _edit(doc, tmp_path, lambda d: None)
    elif needle.startswith("token id"):
        doc = json.loads(json.dumps(doc))
        n = _node(doc, "embedding")
        old = n["node_id"]
        change(doc)
        for e in doc["links"]:
            e["source"] = n["node_id"] if e["source"] == old else e["source"]
        path = _edit(doc, tmp_path, lambda d: None)
    else:
        path = _edit(doc, tmp_path, change)
    assert_one_error_line(cli("graph", "--open", path, "--transcoders", folder), 2, needle)


@pytest.mark.parametrize(("change", "needle"), [
    (lambda d: d["links"][0].update(weight="0.5"), "links[0].weight"),
    (lambda d: d.pop("nodes"), "no 'nodes'"),
    (lambda d: d["nodes"][0].update(ctx_idx=1.5), "nodes[0].ctx_idx"),
    (lambda d: d["links"][0].update(source="nowhere"), "is no node"),
    (lambda d: d["metadata"].update(schema_version=2), "schema_version"),
    (lambda d: d["nodes"].append(dict(d["nodes"][0])), "names two nodes"),
    (lambda d: d["nodes"][0].update(feature_type="attention"), "feature_type"),
])
def test_open_refuses_a_damaged_file_in_one_line(cli, trained, field_graph, tmp_path, change,
                                                  needle):
    folder, _ = trained
    doc, _ = field_graph
    assert_one_error_line(cli("graph", "--open", _edit(doc, tmp_path, change),
                              "--transcoders", folder), 1, needle)


def test_open_refuses_what_is_not_a_graph(cli, trained, field_graph, tmp_path, monkeypatch):
    folder, _ = trained
    doc, path = field_graph
    bad = tmp_path / "bad.json"
    for text, needle in (("{", "not valid JSON"), ('{"a": NaN}', "NaN"), ("[1]", "object")):
        bad.write_text(text, encoding="utf-8")
        assert_one_error_line(cli("graph", "--open", bad, "--transcoders", folder), 1, needle)
    bad.write_bytes(b"\xff\xfe")
    assert_one_error_line(cli("graph", "--open", bad, "--transcoders", folder), 1, "UTF-8")
    from tinygpt_cli.analysis import graph_file

    monkeypatch.setattr(graph_file, "MAX_LINKS", 3)  # huge arrays: counted before use
    assert_one_error_line(cli("graph", "--open", path, "--transcoders", folder), 1,
                          "links, more than")
    monkeypatch.setattr(graph_file, "MAX_BYTES", 100)
    assert_one_error_line(cli("graph", "--open", path, "--transcoders", folder), 1, "bytes")
    assert_one_error_line(cli("graph", "--open", tmp_path / "none.json", "--transcoders",
                              folder), 2, "no such file")



def test_an_opened_file_shows_in_the_viewer(cli, trained, field_graph, browser, tmp_path):
    """Every node of the file drawn, offline, no script error, hover and click work."""
    folder, _ = trained
    doc, path = field_graph
    page = tmp_path / "opened.html"
    r = cli("graph", "--open", path, "--transcoders", folder, "--save", page, "--quiet")
    assert r.code == 0, r.err
    load = browser.open(page, width=1280, height=900)
    assert load.errors == [] and load.failed == []
    assert load.requests == [page.resolve().as_uri()]
    got = browser.evaluate("""(() => {
        const q = s => Array.from(document.querySelectorAll(s));
        const f = q(".node").find(n => /^\\d+_\\d+_\\d+$/.test(n.getAttribute("data-id")));
        f.dispatchEvent(new MouseEvent("mouseenter"));
        f.dispatchEvent(new MouseEvent("click", {bubbles: true}));
        return {nodes: q(".node").map(n => n.getAttribute("data-id")),
                side: document.getElementById("side").textContent,
                path: q(".node.path").length};
    })()""")
    assert sorted(got["nodes"]) == sorted(n["node_id"] for n in doc["nodes"])
    assert got["side"] and got["path"] >= 1
