"""A command reads its arguments and the run context it is given, and nothing else (issue 28):
no module state carries the weights folder, the steering, --quiet, the note of what was
changed or --each-line's batch from one command to the next."""

from __future__ import annotations

import pytest
from cli_helpers import TEXT, TINY, Runner, clean_env, make_tiny, random_params
from test_steer import STEER

from tinygpt_cli.cli.context import RunContext, SteerOptions

STEERED_NOTE = "steered before this view: layers.1.resid_pre + 1 * v, v = 'Lily was happy' - " \
               "'Lily was sad'"
ABLATED_NOTE = "ablated (set to zero) before this view: layers.0.attn_out"


@pytest.fixture(scope="module")
def other(tmp_path_factory, tiny):
    """A second tiny model, with other weights than `tiny`'s."""
    return make_tiny(tmp_path_factory.mktemp("other") / "weights", random_params(TINY, 7))


@pytest.fixture
def run(capsys, monkeypatch):
    """The CLI in this process with no $TINYGPT_WEIGHTS: only a context names the folder."""
    clean_env(monkeypatch)
    return Runner(capsys, monkeypatch)


def test_two_contexts_in_one_process_share_nothing(run, tiny, other, tmp_path):
    a, b = RunContext(weights=tiny.folder), RunContext(weights=other.folder)
    alone = {c.folder: run("probs", TEXT, "--json", "--weights", c.folder)
             for c in (tiny, other)}
    assert alone[tiny.folder].code == alone[other.folder].code == 0
    assert alone[tiny.folder].json()["data"] != alone[other.folder].json()["data"]
    for _ in range(2):  # in turns: each context gives its own folder's numbers every time
        assert run("probs", TEXT, "--json", context=a).out == alone[tiny.folder].out
        assert run("probs", TEXT, "--json", context=b).out == alone[other.folder].out
    # the group's --weights is this command line's: the context it came with is not changed
    assert run("--weights", other.folder, "probs", TEXT, "--json", context=a).out == \
        alone[other.folder].out
    assert run("probs", TEXT, "--json", context=a).out == alone[tiny.folder].out

    plain = run("embed", TEXT, context=b).out
    steered = run("embed", TEXT, *STEER, context=a)
    assert steered.code == 0 and steered.out.startswith(STEERED_NOTE), steered.out[:200]
    assert steered.err.startswith("steered: layers.1.resid_pre")
    after = run("embed", TEXT, context=b)  # not steered, no note, nothing said
    assert (after.out, after.err) == (plain, "")

    ablated = run("logits", TEXT, "--ablate", "layers.0.attn_out", context=a).out
    assert ablated.startswith(ABLATED_NOTE)
    assert ABLATED_NOTE not in run("logits", TEXT, context=a).out

    quiet = run("attn", TEXT, "--quiet", "--save", tmp_path / "a.svg", context=a)
    assert (quiet.code, quiet.out, quiet.err) == (0, "", "")
    assert run("attn", TEXT, context=a).out == run("attn", TEXT, "--weights", tiny.folder).out

    # --each-line's folders opened once and passes made ahead are its own run's
    (tmp_path / "lines.txt").write_text(f"{TEXT}\nLily was happy\n", encoding="utf-8")
    each = run("probs", "--each-line", tmp_path / "lines.txt", "--json", context=a)
    assert each.code == 0 and len(each.ndjson()) == 2
    assert run("probs", TEXT, "--json", context=b).out == alone[other.folder].out

    assert (a, b) == (RunContext(weights=tiny.folder), RunContext(weights=other.folder))


def test_each_command_run_gets_a_fresh_copy_of_the_context():
    line = RunContext(weights="w", opened={}, ahead=object())
    line.changed, line.said = "left over", ["left over"]
    one = line.for_command("lens", SteerOptions(steer="a", steer_away="b"), quiet=True)
    assert (one.weights, one.opened, one.ahead) == (line.weights, line.opened, line.ahead)
    assert (one.command, one.steer.given, one.quiet, one.changed, one.said, one.steerings) \
        == ("lens", True, True, None, [], {})
    one.said.append("x")
    assert line.said == ["left over"] and one.opened is line.opened  # folders: the line's


def test_a_command_that_runs_the_model_unmarked_fails_loudly(tiny):
    """A command without @steerable has no steering options: asking for its steering is a
    bug of the program (RuntimeError, exit 1 with its message), never a silently unsteered
    run."""
    from tinygpt_cli.cli.steering import steering

    with pytest.raises(RuntimeError, match="command 'encode' runs the model but is not "
                                           r"@steerable \(cli/steering.py\)"):
        steering(RunContext(command="encode"), tiny.model)
    assert steering(RunContext(command="lens", steer=SteerOptions()), tiny.model) == \
        (None, None)


def test_a_picture_is_the_same_whatever_was_drawn_before_it(run, tiny, tmp_path):
    """Each legend's gradient has an id unique in its page; the ids are the document's own
    (scale0, scale1 ...), not a count of every picture drawn so far in the process."""
    context = RunContext(weights=tiny.folder)
    pictures = []
    for n in range(2):
        for ext in ("svg", "html"):
            out = tmp_path / f"{n}.{ext}"
            assert run("attn", TEXT, "--all-heads", "--save", out, "--quiet",
                       context=context).code == 0
            pictures.append(out.read_text(encoding="utf-8"))
    assert pictures[:2] == pictures[2:]
    for page in pictures[:2]:
        assert 'id="scale0"' in page and 'url(#scale0)' in page and 'id="scale2"' not in page


def test_an_entry_the_cache_cannot_keep_is_noted_every_time(tmp_path, capsys):
    """Each command that computes an entry it cannot keep says so (the note of the first was
    once kept for the whole process, so a second command in it was silent)."""
    from tinygpt_cli.storage import cache

    (tmp_path / "a-file").write_text("")
    entry = tmp_path / "a-file" / "neurons" / "key.npz"  # under a file: never written
    for _ in range(2):
        cache.keep(entry, b"numbers")
        err = capsys.readouterr().err
        assert err.startswith(f"note: cannot write {tmp_path}/a-file/neurons/key.npz: ")
        assert err.endswith("; the result is not kept for the next run (set TINYGPT_CACHE to "
                            "a writable folder)\n") and err.count("\n") == 1
