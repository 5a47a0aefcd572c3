"""`--ablate` on the command line, the schema's table of values (docs/inspecting.md), and the
session's checks.

The ablated runs are compared with hand computations on the tiny weights: a zeroed head is
the same model with that head's rows of c_proj set to zero.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import TEXT, TEXT_IDS, assert_one_error_line, file_names, without_head

from tinygpt_cli.errors import InputError
from tinygpt_cli.jobs.session import Session
from tinygpt_cli.transformer import ops
from tinygpt_cli.transformer.model import forward
from tinygpt_cli.transformer.schema import VALUES, expand, markdown_table
from tinygpt_cli.transformer.trace import run_traced

# the table of values is on the Inspecting page (docs/inspecting.md, "Any value by name")
README = Path(__file__).resolve().parent.parent / "docs" / "inspecting.md"


def test_logits_with_a_head_ablated_equal_the_model_without_that_head(cli, tiny):
    doc = cli("logits", TEXT, "--ablate", "layers.1.heads.0.out", "--json").json()
    cfg = tiny.model.config
    by_hand = forward(without_head(tiny.model.params, cfg, 1, 0), cfg, np.asarray(TEXT_IDS))
    np.testing.assert_allclose(doc["data"], by_hand[-1], rtol=1e-5, atol=1e-5)
    assert doc["ablated"] == ["layers.1.heads.0.out"]
    plain = cli("logits", TEXT, "--json").json()
    assert "ablated" not in plain
    assert not np.allclose(plain["data"], doc["data"])


def test_ablate_is_repeatable_and_takes_any_spelling(cli, tiny):
    doc = cli("trace", TEXT, "layers.1.resid_post", "--ablate", "blocks.1.hook_mlp_out",
              "--ablate", "layers[-1].attn_out", "--json").json()
    assert doc["ablated"] == ["layers.1.mlp_out", "layers.1.attn_out"]
    tr = tiny.trace(TEXT_IDS)
    # with both of block 1's outputs zeroed, the block passes its input through unchanged
    np.testing.assert_allclose(doc["data"], tr.get("layers.1.resid_pre"), rtol=1e-6, atol=1e-6)


def test_ablating_the_mlp_of_the_last_block_skips_it(cli, tiny):
    doc = cli("final-norm", TEXT, "--ablate", "layers.1.mlp_out", "--json").json()
    p, cfg = file_names(tiny.model.params), tiny.model.config
    h = tiny.trace(TEXT_IDS).get("layers.1.resid_mid")
    u, _, _ = ops.layer_norm(h, p["ln_f.weight"], p["ln_f.bias"], cfg.layer_norm_epsilon)
    np.testing.assert_allclose(doc["data"], u, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("command", [["attn"], ["blocks"], ["probs"], ["sample", "--seed", "2"],
                                     ["review"], ["mlp"], ["embed"]])
def test_every_inspection_command_takes_ablate(cli, command):
    r = cli(command[0], TEXT, *command[1:], "--ablate", "layers.0.heads.1.out", "--json")
    assert r.code == 0, r.err
    assert r.json()["ablated"] == ["layers.0.heads.1.out"]


def test_attention_of_an_ablated_head_is_unchanged_but_later_blocks_differ(cli, tiny):
    """Zeroing a head's output leaves its own attention grid alone (it is computed before),
    but changes what the next block attends with."""
    tr = tiny.trace(TEXT_IDS)
    same = cli("attn", TEXT, "--layer", "0", "--head", "1", "--ablate", "layers.0.heads.1.out",
               "--json").json()
    np.testing.assert_allclose(same["data"], tr.get("layers.0.heads.1.weights"), rtol=1e-6)
    later = cli("attn", TEXT, "--layer", "1", "--head", "0", "--ablate", "layers.0.heads.1.out",
                "--json").json()
    assert not np.allclose(later["data"], tr.get("layers.1.heads.0.weights"))


@pytest.mark.parametrize("path, needles", [
    ("layers.0.mlp_outt", ["no value at path 'layers.0.mlp_outt'",
                           "did you mean layers.0.mlp_out"]),
    ("layers.7.mlp_out", ["layer 7 is out of range"]),
    ("logits[-1]", ["--ablate takes a whole value"]),
    ("tokens", ["not computed by the forward pass"]),
])
def test_a_bad_ablate_path_is_one_error_line(cli, path, needles):
    assert_one_error_line(cli("logits", TEXT, "--ablate", path), 2, *needles)


# ------------------------------------------------------------------ the session


def test_session_checks_indices_and_tokens_with_one_wording(tiny):
    s = Session.open(TEXT, model=tiny.model)
    assert s.ids == TEXT_IDS and s.T == 6
    assert s.layer(-1) == 1 and s.head(-2) == 0 and s.position(-1) == 5
    with pytest.raises(InputError, match=r"layer 2 is out of range: valid layers are 0\.\.1"):
        s.layer(2)
    assert s.token_id(" toys") == tiny.model.tokenizer.encode(" toys")[0]
    assert s.token_id("#17") == 17 and s.token_id("5") == 21  # digits are text
    with pytest.raises(InputError, match="not a single token"):
        s.token_id(" toys and more")
    with pytest.raises(InputError, match="unknown token id 9999"):
        s.token_id("#9999")
    with pytest.raises(InputError, match="reads at most 128 tokens"):
        Session.open("Lily " * 200, model=tiny.model)


def test_session_trace_equals_the_model_trace(tiny):
    s = Session.open(TEXT, model=tiny.model)
    a = s.trace()
    b = run_traced(tiny.model.params, tiny.model.config, np.asarray(TEXT_IDS))
    for path in expand(tiny.model.config, kinds=("hooked",)):
        np.testing.assert_array_equal(a.get(path), b.get(path))
    assert a.get("tokens") == s.tokens


# ------------------------------------------------------------------ docs from the schema


def test_the_readme_table_of_values_is_the_schema():
    text = README.read_text(encoding="utf-8")
    m = re.search(r"<!-- schema:values -->\n(.*?)\n<!-- /schema:values -->", text, re.S)
    assert m, "docs/inspecting.md lost its schema:values markers"
    assert m[1] == markdown_table()  # refresh with python scripts/update_readme.py
    assert len(m[1].splitlines()) == len(VALUES) + 2


def test_trace_list_is_the_schema_expanded(cli, tiny):
    doc = cli("trace", TEXT, "--list", "--json").json()
    assert doc["data"] == expand(tiny.model.config)
    first = {e["path"]: e for e in doc["entries"]}
    assert first["layers.1.heads.0.q"]["about"] == "head 0's queries (card 5)"
    assert first["layers.1.resid_pre"]["about"] == "the residual stream entering block 1 (card 4)"
    assert first["logits"]["shape"] == [6, 4096]
