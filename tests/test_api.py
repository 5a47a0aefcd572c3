"""The notebook API (tinygpt_cli.surfaces.api): tg.load, run_with_cache, run_with_hooks, and every
command as a method whose result is the command line's own --json document and --save picture.

The cache is checked against the naive reference forward pass (test_model_reference), a hook
against the model whose head is taken out of its weights by hand (cli_helpers.without_head),
and each command's result against the command line run in a child process."""

from __future__ import annotations

import html
import json
import subprocess
import sys

import numpy as np
import pytest
from cli_helpers import TEXT, TINY, make_tiny, random_params, without_head
from test_model_reference import reference_forward

import tinygpt_cli as tg
from tinygpt_cli.errors import InputError
from tinygpt_cli.storage.locations import SHIPPED
from tinygpt_cli.transformer.schema import PathError

# the shipped lesson models of the two other families: rotary positions, RMSNorm, grouped
# key/value heads and a gated MLP (Llama), a parallel block (GPT-NeoX)
FAMILIES = ["gpt2", "llama", "neox"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    tiny = make_tiny(tmp_path_factory.mktemp("api") / "weights")
    return {"gpt2": tiny.folder, "llama": SHIPPED / "llama", "neox": SHIPPED / "neox"}


@pytest.fixture(scope="module")
def models(folders):
    return {k: tg.load(str(v)) for k, v in folders.items()}


@pytest.fixture(autouse=True)
def one_thread():
    """This process's BLAS at one thread, as every command's (threads.use_default): the
    numbers are compared bit for bit with a command line's, and must not depend on which
    test changed the pool last (after test_cluster's fixture they differed in the 8th digit)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        yield


def cli_json(*args) -> tuple[str, str]:
    """(stdout, stderr) of `python -m tinygpt_cli ARGS` in a child process."""
    out = subprocess.run([sys.executable, "-m", "tinygpt_cli", *map(str, args)],
                         capture_output=True, text=True, timeout=120)
    return out.stdout, out.stderr


def test_the_cache_holds_the_reference_forward_pass_under_both_names(models, folders):
    model = models["gpt2"]
    logits, cache = model.run_with_cache(TEXT)
    ids = model.to_tokens(TEXT)
    params = random_params(TINY, seed=3)  # make_tiny's weights
    ref = reference_forward({k: v.astype(np.float64) for k, v in params.items()},
                            TINY, ids)
    assert np.allclose(logits, ref["logits"], rtol=1e-4, atol=1e-4)
    pattern = cache["blocks.1.attn.hook_pattern"]  # TransformerLens's name: [H, T, T]
    assert pattern.shape == (2, len(ids), len(ids))
    for h in range(2):
        assert np.array_equal(cache[f"layers.1.heads.{h}.weights"], pattern[h])
        assert np.allclose(pattern[h], ref[f"layers.1.heads.{h}.weights"], atol=1e-5)
    assert np.array_equal(cache["blocks.0.hook_resid_post"], cache["layers.0.resid_post"])


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_caches_logits_equal_to_the_command_lines(models, folders, family):
    logits, cache = models[family].run_with_cache(TEXT)
    out, _ = cli_json("trace", TEXT, "logits", "--json", "--weights", folders[family])
    assert np.array_equal(logits, np.array(json.loads(out)["data"], dtype=np.float32))
    assert np.array_equal(cache["logits"], logits)
    assert np.array_equal(cache["blocks.0.attn.hook_pattern"][0], cache["layers.0.heads.0.weights"])


def test_a_cache_of_named_values_holds_those_alone(models):
    _, cache = models["gpt2"].run_with_cache(TEXT, names=["blocks.1.hook_mlp_out"])
    assert cache["layers.1.mlp_out"].shape == (6, 16)
    with pytest.raises(PathError, match="layers.0.mlp_out was not recorded in this run"):
        cache["layers.0.mlp_out"]


@pytest.mark.parametrize("name", ["layers.1.heads.0.out", "blocks.1.attn.hook_z"])
def test_a_hook_that_zeroes_a_head_is_the_model_without_it(models, folders, tmp_path, name):
    model = models["gpt2"]
    seen = []

    def zero_head(x, hook):
        seen.append((hook.name, x.shape))
        if hook.name.endswith("hook_z"):  # all heads [H, T, d_k]: head 0 only
            x = x.copy()
            x[0] = 0
            return x
        return np.zeros_like(x)

    hooked = model.run_with_hooks(TEXT, fwd_hooks=[(name, zero_head)])
    params = without_head(model.model.params, model.config, 1, 0)
    without = make_tiny(tmp_path / "w", {k: np.asarray(v) for k, v in params.items()})
    assert np.allclose(hooked, tg.load(str(without.folder))(TEXT), atol=1e-5)
    assert seen and seen[0][0] == name


def test_a_hook_returning_nothing_keeps_the_value(models):
    model = models["llama"]
    plain = model(TEXT)
    assert np.array_equal(model.run_with_hooks(TEXT, [("blocks.0.hook_resid_pre",
                                                       lambda x, hook: None)]), plain)


def test_an_unknown_hook_name_raises_with_the_command_lines_suggestion(models):
    with pytest.raises(PathError) as e:
        models["gpt2"].run_with_hooks(TEXT, [("blocks.0.hook_mlp_ou", lambda x, h: x)])
    assert str(e.value).startswith("no value at path 'blocks.0.hook_mlp_ou'; did you mean "
                                   "layers.0.mlp_out")


@pytest.mark.parametrize("family", FAMILIES)
def test_a_hook_whose_numbers_overflow_the_pass_is_named_not_the_weights(models, family):
    from tinygpt_cli.errors import NonFiniteError

    model = models[family]

    def nan(x, hook):
        return np.full_like(x, np.nan)

    def in_place(x, hook):
        x[0] = np.inf

    for fn in (nan, in_place):
        with pytest.raises(InputError) as e:
            model.run_with_hooks(TEXT, [("blocks.0.hook_mlp_out", fn)])
        assert str(e.value) == ("the forward pass overflowed: the hook on blocks.0.hook_mlp_out "
                                "put infinite or NaN numbers into layers.0.mlp_out")
    with pytest.raises(InputError) as e:  # finite, but too large for what comes after it
        model.run_with_hooks(TEXT, [("blocks.0.hook_resid_post", lambda x, hook: x * 1e30)])
    assert "because of the hook on blocks.0.hook_resid_post (the same pass without it is " \
        "finite)" in str(e.value) and "weights" not in str(e.value)
    assert not isinstance(e.value, NonFiniteError)
    assert np.isfinite(model(TEXT)).all()  # the weights are fine


# ------------------------------------------------------------------ commands as functions

CALLS = [  # (method, its arguments, its options by word, the command line's words)
    ("attn", [TEXT], {"layer": 1, "head": -1},
     ["attn", TEXT, "--layer", "1", "--head", "-1"]),
    ("lens", [TEXT], {"target": " toys"}, ["lens", TEXT, "--target", " toys"]),
    ("dla", [TEXT], {"target": " toys", "vs": " mom"},
     ["dla", TEXT, "--target", " toys", "--vs", " mom"]),
    ("final_norm", [TEXT], {"ablate": ["L0H1"]}, ["final-norm", TEXT, "--ablate", "L0H1"]),
    ("pos", ["-5 apples"], {"sum": True}, ["pos", "--sum", "--", "-5 apples"]),
]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("method, args, options, words", CALLS, ids=[c[0] for c in CALLS])
def test_a_commands_result_is_its_json_and_its_picture(models, folders, tmp_path, family,
                                                       method, args, options, words):
    model = models[family]
    result = getattr(model, method)(*args, **options)
    svg, page = tmp_path / "p.svg", tmp_path / "p.html"
    out, _ = cli_json(words[0], "--json", "--save", svg, "--weights", folders[family], *words[1:])
    assert result.json == out
    assert result.document == json.loads(out)
    cli_json(words[0], "--save", page, "--quiet", "--weights", folders[family], *words[1:])
    assert result._repr_svg_() == svg.read_text(encoding="utf-8")
    shown = result._repr_html_()
    assert shown.startswith('<iframe srcdoc="') and "http" not in shown.split("srcdoc")[0]
    assert html.unescape(shown.split('srcdoc="', 1)[1].split('" style=', 1)[0]) == \
        page.read_text(encoding="utf-8")


def test_results_are_kept_not_printed_and_pictures_only_where_drawn(models, capsys):
    info = models["gpt2"].info()
    assert capsys.readouterr().out == ""
    assert info.picture is None and info._repr_svg_() is None and info._repr_html_() is None
    assert info["config"]["n_layer"] == 2
    info.show()  # the terminal view, as the command line prints it
    assert "n_layer" in capsys.readouterr().out


def test_generate_prints_nothing_and_returns_the_command_lines_summary(models, folders,
                                                                      capsys):
    # a library call printed the story, and a seed note, on stdout and stderr
    got = models["gpt2"].generate("Lily wanted", max_new_tokens=6, seed=3)
    printed = capsys.readouterr()
    out, _ = cli_json("generate", "Lily wanted", "-n", "6", "--seed", "3", "--json",
                      "--weights", folders["gpt2"])
    want = json.loads(out.splitlines()[-1])
    assert got.document == want and want["event"] == "end"
    assert printed.out == printed.err == ""
    assert got["data"].startswith("Lily wanted") and len(got["ids"]) == len(got["tokens"])
    unseeded = models["gpt2"].generate("Lily wanted", max_new_tokens=2)
    assert capsys.readouterr().out == ""
    assert unseeded.notes[0] == (f"seed {unseeded['seed']} (pass --seed {unseeded['seed']} to "
                                 "get the same text again)")
    lines = models["gpt2"].generate("Lily wanted", max_new_tokens=6, seed=3, as_json=True)
    assert lines.document == want and capsys.readouterr().out == ""


def test_a_result_saves_what_it_shows_and_never_over_a_file_unasked(models, tmp_path):
    result = models["neox"].lens(TEXT)
    result.save(tmp_path / "lens.svg")
    assert (tmp_path / "lens.svg").read_text(encoding="utf-8") == result._repr_svg_()
    with pytest.raises(InputError, match=r"lens.svg: the file exists; add --force to "
                                         r"overwrite it$"):
        result.save(tmp_path / "lens.svg")
    result.save(tmp_path / "lens.svg", force=True)
    with pytest.raises(InputError, match="^info draws no picture$"):
        models["neox"].info().save(tmp_path / "info.svg")


def test_bad_input_raises_the_command_lines_message(models, folders):
    with pytest.raises(InputError) as e:
        models["gpt2"].attn(TEXT, layer=9)
    _, err = cli_json("attn", TEXT, "--layer", "9", "--weights", folders["gpt2"])
    assert err == f"error: {e.value}\n"
    with pytest.raises(InputError, match=r"^attn takes no argument 'layr'; did you mean "
                                         r"'layer'\? It takes: text, weights, "):
        models["gpt2"].attn(TEXT, layr=1)
    with pytest.raises(InputError, match=r"^Invalid value for '--top' / '-n': ") as e:
        models["gpt2"].probs(TEXT, top=0)  # click's words, which its versions change
    _, err = cli_json("probs", TEXT, "--top", "0", "--weights", folders["gpt2"])
    assert err.startswith(f"error: {e.value} (see 'tinygpt probs --help')")
    with pytest.raises(AttributeError, match="has no attribute or command 'attention'"):
        getattr(models["gpt2"], "attention")  # noqa: B009 - the attribute is the test
    assert "sae_feature" in models["gpt2"].commands() and "final_norm" in dir(models["gpt2"])


def test_importing_the_package_loads_no_api():
    code = ("import sys, tinygpt_cli; "
            "print('tinygpt_cli.surfaces.api' in sys.modules, 'numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout == "False False\n"


def test_a_pictures_text_form_names_what_it_draws(models):
    # beside the SVG a notebook keeps a text form: it was
    # <tinygpt_cli.surfaces.api.Picture at 0x...>
    _, cache = models["gpt2"].run_with_cache("Lily wanted")
    assert repr(cache.picture("layers.0.heads.0.weights")) == (
        "<tinygpt picture: layers.0.heads.0.weights>")
