"""One vocabulary of short options: every command against the table of cli/options.py."""

from __future__ import annotations

import json
import re

import pytest
import typer
from cli_helpers import TEXT

from tinygpt_cli.cli.app import _register, app
from tinygpt_cli.cli.options import LETTER, SHORT


def commands():
    """Every command by its path, the groups' own (`sae train`) too."""
    import click

    _register()

    def walk(group, prefix):
        for name, command in group.commands.items():
            if isinstance(command, click.Group):
                yield from walk(command, f"{prefix}{name} ")
            else:
                yield f"{prefix}{name}", command

    return dict(walk(typer.main.get_command(app), ""))


def test_every_short_option_is_in_the_table_and_every_long_one_has_its_letter():
    seen = set()
    for name, command in commands().items():
        for p in command.params:
            opts = [*getattr(p, "opts", []), *getattr(p, "secondary_opts", [])]
            longs = [o for o in opts if o.startswith("--")]
            for short in (o for o in opts if o.startswith("-") and not o.startswith("--")):
                assert short in SHORT, (name, short, longs)
                assert set(longs) & set(SHORT[short]), (name, short, longs)
                seen.add(short)
            for long in longs:
                if long in LETTER:
                    assert LETTER[long] in opts, (name, long, "lacks", LETTER[long])
    assert seen >= {"-l", "-H", "-p", "-n", "-k", "-P", "-t", "-s", "-f", "-q"}


@pytest.mark.parametrize("argv, long", [
    (["ablate", TEXT, "-l", "1", "-H", "0", "-n", "3"], ["ablate", TEXT, "--layer", "1",
                                                         "--head", "0", "--top", "3"]),
    (["score", TEXT, "-n", "2"], ["score", TEXT, "--top", "2"]),
    (["dla", TEXT, "-n", "4", "-p", "2"], ["dla", TEXT, "--top", "4", "--position", "2"]),
    (["neurons", TEXT, "-l", "1", "-n", "2"], ["neurons", TEXT, "--layer", "1", "--top", "2"]),
])
def test_the_letters_mean_their_long_options(cli, argv, long):
    a, b = cli(*argv, "--json"), cli(*long, "--json")
    assert a.code == 0, a.err
    assert a.out == b.out


def test_the_hint_about_a_text_starting_with_a_dash_only_where_it_could_be_one(cli):
    r = cli("encode", "-hello")
    assert r.code == 2 and "a text that starts with '-' goes after '--'" in r.err
    r = cli("ablate", TEXT, "-x", "1")
    assert r.code == 2
    assert r.err == "error: No such option: -x (see 'tinygpt ablate --help')\n"


def test_the_hint_names_the_whole_command_and_the_text_given(cli):
    r = cli("sae", "train", "--site", "layers.1.resid_post", "-x", "1")
    assert r.code == 2
    assert r.err == "error: No such option: -x (see 'tinygpt sae train --help')\n"
    r = cli("probs", "-Lily wanted")
    assert r.code == 2
    assert r.err.endswith("(see 'tinygpt probs --help'; a text that starts with '-' goes "
                          "after '--': tinygpt probs -- '-Lily wanted')\n"), r.err
    assert cli("probs", "--", "-Lily wanted").code == 0
    # an option's value missing at the end: click has made no context of the command yet
    for argv, help_of in ((("attn", TEXT, "--layer"), "tinygpt attn"),
                          (("sae", "train", "--steps"), "tinygpt sae train"),
                          (("--weights", "w", "probs", TEXT, "--top"), "tinygpt probs"),
                          (("--weights",), "tinygpt")):
        r = cli(*argv)
        assert r.code == 2
        assert r.err == (f"error: Option '{argv[-1]}' requires an argument. "
                         f"(see '{help_of} --help')\n"), r.err
    # a word that names a command elsewhere in the line is not the command: here none is
    assert cli("foo", "attn").err == "error: No such command 'foo'. (see 'tinygpt --help')\n"
    assert cli("--weights", "attn").err == "error: Missing command. (see 'tinygpt --help')\n"


# ------------------------------------------------------------------ one name for a head


def test_a_heads_short_name_is_a_path_trace_and_ablate_accept(cli):
    short, long = cli("trace", TEXT, "L1H0", "--json"), cli("trace", TEXT,
                                                            "layers.1.heads.0.out", "--json")
    assert short.code == 0 and short.json() == long.json()
    assert short.json()["path"] == "layers.1.heads.0.out"
    assert cli("trace", TEXT, "L1H0[-1]", "--json").json()["data"] == long.json()["data"][-1]
    a = cli("logits", TEXT, "--ablate", "L1H0", "--json").json()
    b = cli("logits", TEXT, "--ablate", "layers.1.heads.0.out", "--json").json()
    assert a == b and a["ablated"] == ["layers.1.heads.0.out"]


def test_an_mlps_short_name_is_a_path_trace_accepts(cli):
    short, long = cli("trace", TEXT, "L1.mlp", "--json"), cli("trace", TEXT,
                                                              "layers.1.mlp_out", "--json")
    assert short.code == 0 and short.json() == long.json()
    assert cli("trace", TEXT, "L1.mlp[-1]", "--json").json()["data"] == long.json()["data"][-1]


def test_a_receivers_name_in_circuit_is_a_path_trace_accepts(cli):
    """circuit names a head's v input L1H0.v: trace reads it as that head's v."""
    for part in ("q", "k", "v"):
        short = cli("trace", TEXT, f"L1H0.{part}", "--json")
        assert short.code == 0 and short.json() == cli(
            "trace", TEXT, f"layers.1.heads.0.{part}", "--json").json()


def test_every_view_names_a_head_the_same_way(cli):
    out = cli("heads", TEXT).out
    names = [ln.split()[0] for ln in out.splitlines() if ln.strip()[:1] == "L"]
    assert names == ["L0H0", "L0H1", "L1H0", "L1H1"]
    best = out.split("best: ")[1].splitlines()[0]  # one head per kind, named as the table does
    named = re.findall(r"\b(L\d+H\d+) \(\d", best)
    assert len(named) == 4 and set(named) <= set(names), best
    dla = cli("dla", TEXT).out
    assert "L1H0" in dla


def test_help_shows_no_python_types_and_counts_say_token_or_tokens(cli):
    for name in commands():
        r = cli(name, "--help")
        assert r.code == 0 and "<list[" not in r.out and "list[" not in r.out, name
    assert "T = 1 token," in cli("encode", "Lily").out
    assert "T = 6 tokens," in cli("encode", TEXT).out


# ------------------------------------------------------------------ a changed run says so

ABLATING = [["embed"], ["pos"], ["norm"], ["attn"], ["mlp"], ["blocks"], ["final-norm"],
            ["logits"], ["probs"], ["sample"], ["trace", "logits[-1]"], ["review"], ["map"]]


@pytest.mark.parametrize("argv", ABLATING, ids=lambda a: a[0])
def test_every_view_of_an_ablated_run_says_so_first(cli, argv):
    command, *rest = argv
    r = cli(command, TEXT, *rest, "--ablate", "L1H0")
    assert r.code == 0, r.err
    assert r.out.splitlines()[0] == ("ablated (set to zero) before this view: "
                                     "layers.1.heads.0.out")
    clean = cli(command, TEXT, *rest)
    assert "ablated" not in clean.out.splitlines()[0]
    doc = cli(command, TEXT, *rest, "--ablate", "L1H0", "--json")
    assert doc.code == 0 and json.loads(doc.out.splitlines()[0])  # JSON stays JSON
    assert "ablated (set to zero)" not in doc.out
