"""A refusal names the field it is about, whatever the field is called (new-user review: a
connector input's ``connector`` field shares its name with the union branch pydantic puts in the
error's location, and ``"connector": 5`` was refused as ``inputs[0]: must be a string, got 5``).
Every field of every input and output kind, sent with a value no field takes and left out when
required, is named ``inputs[0].<field>``. In process: nothing is run."""

from __future__ import annotations

import json
from typing import Any, get_args

import pytest
from pydantic import BaseModel

from alphaagent.errors import InvalidSpecError
from alphaagent.models.spec import SpecInput, SpecOutput, parse_spec


def _example(model: type[BaseModel]) -> dict[str, Any]:
    """A valid item of ``model``: every required field with a value its rule takes."""
    values = {
        "path": "docs/a.csv",
        "name": "a",
        "connector": "file",
        "request": {},
        "node_id": "n",
        "artifact": "a",
    }
    item: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        if name == "kind":
            item[name] = get_args(field.annotation)[0]
        elif field.is_required():
            item[name] = values[name]
    return item


_CASES = [
    ("inputs", model, name)
    for model in get_args(get_args(SpecInput)[0])
    for name in model.model_fields
    if name != "kind"
] + [("outputs", SpecOutput, name) for name in SpecOutput.model_fields if name != "kind"]


def _refusal(list_name: str, item: dict[str, Any]) -> str:
    document = {
        "spec_version": 1,
        "user_id": "ann",
        "scope": {"conversation_id": "c"},
        "goal": "count",
        list_name: [item],
    }
    with pytest.raises(InvalidSpecError) as refused:
        parse_spec(json.dumps(document))
    return str(refused.value)


@pytest.mark.parametrize(("list_name", "model", "name"), _CASES, ids=lambda v: getattr(v, "__name__", v))
def test_a_wrong_value_is_refused_under_its_fields_name(
    list_name: str, model: type[BaseModel], name: str
) -> None:
    item = {**_example(model), name: [[]]}  # a list of a list: no field of a spec takes one
    assert _refusal(list_name, item).startswith(f"{list_name}[0].{name}: "), (model.__name__, name)


@pytest.mark.parametrize(
    ("list_name", "model", "name"),
    [case for case in _CASES if case[1].model_fields[case[2]].is_required()],
    ids=lambda v: getattr(v, "__name__", v),
)
def test_a_missing_field_is_refused_under_its_name(list_name: str, model: type[BaseModel], name: str) -> None:
    item = {k: v for k, v in _example(model).items() if k != name}
    assert _refusal(list_name, item).startswith(f"{list_name}[0].{name}: "), (model.__name__, name)


@pytest.mark.parametrize(
    ("value", "line"),
    [
        (5, "inputs[0].connector: must be a string, got 5"),
        ("BAD!", "inputs[0].connector: "),
    ],
)
def test_the_connector_field_of_a_connector_input(value: Any, line: str) -> None:
    refusal = _refusal("inputs", {"kind": "connector", "connector": value, "request": {}})
    assert refusal.startswith(line)
