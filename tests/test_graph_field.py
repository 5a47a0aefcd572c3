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

from tinygpt_cli.model import forward

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
    from tinygpt_cli.entry import main

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


def test_circuit_tracer_format_validates_and_adds_up(cli, trained, tiny):
    folder, data = trained
    r = cli("graph", TEXT, "--transcoders", folder, "--data", data, "--windows", "4",
            "--format", "circuit-tracer", "--node-threshold", "1", "--edge-threshold", "1")
    assert r.code == 0, r.err
    doc = r.json()
    assert validate_graph(doc) == []
    print(json.dumps(doc)[:3000])
