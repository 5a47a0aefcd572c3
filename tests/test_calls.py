"""calls.checked: the one check of a call's arguments, made from each command's own
parameters, that the Python API and the MCP server share (issue 53). Held over every
parameter of every command: a value of another JSON type is refused naming the argument,
never coerced by truthiness or str()."""

from __future__ import annotations

import pytest

from tinygpt_cli.errors import InputError
from tinygpt_cli.surfaces import calls

# for each kind, values of every other JSON type (a whole float is an int: JSON's 2.0)
WRONG = {"string": [1, 2.5, True, {"a": 1}, ["a"], b"a"],
         "integer": ["1", 2.5, True, {"a": 1}, [1]],
         "number": ["1.0", True, {"a": 1}, [1.0]],
         "boolean": ["false", "true", 0, 1, {"a": 1}, [True]]}
RIGHT = {"string": "Lily", "integer": 2, "number": 0.5, "boolean": False}


def every_parameter():
    for name, command in calls.commands().items():
        for p in calls.parameters(command):
            yield name, p


@pytest.mark.parametrize("name, p", list(every_parameter()),
                         ids=[f"{n}-{p.name}" for n, p in every_parameter()])
def test_every_parameter_refuses_every_other_type_naming_itself(name, p):
    for value in WRONG[p.kind]:
        given = [value] if p.multiple else value  # as an item of a list option
        with pytest.raises(calls.ArgumentError) as e:
            calls.checked(name, [p], {p.name: given})
        assert str(e.value).startswith(f"{name}: {p.word} takes "), str(e.value)
        assert isinstance(e.value, TypeError) and isinstance(e.value, InputError)
    right = [RIGHT[p.kind]] if p.multiple else RIGHT[p.kind]
    assert calls.checked(name, [p], {p.name: right}) == {p.name: right}
    if p.multiple:  # a list option given one value, not a list: refused, not wrapped
        with pytest.raises(calls.ArgumentError, match=f"^{name}: {p.word} takes a list"):
            calls.checked(name, [p], {p.name: RIGHT[p.kind]})


def test_a_whole_float_is_its_int_and_a_path_may_be_a_path():
    from pathlib import Path

    attn = calls.parameters(calls.commands()["attn"])
    assert calls.checked("attn", attn, {"layer": 1.0, "weights": Path("w")}) == \
        {"layer": 1, "weights": "w"}
    assert calls.argv("attn", attn, {"text": "-5 apples", "all_heads": False,
                                     "ablate": ["L0H1", "L1H0"]}) == \
        ["attn", "--ablate=L0H1", "--ablate=L1H0", "--", "-5 apples"]
    decode = calls.parameters(calls.commands()["decode"])
    # a list argument was one str() of the list: "['464', '3290']"
    assert calls.argv("decode", decode, {"ids": ["464", "3290"]}) == \
        ["decode", "--", "464", "3290"]
