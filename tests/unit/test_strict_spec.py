"""A spec is JSON from another program: every field's type is strict (``"3"`` is not a number,
``true`` is not 1), and a type error is one line in the project's words naming the field path, the
rule and the value as sent, as JSON (third new-user review: ``max_runs: "3"`` ran with 3, ``true``
with 1, and ``1.5`` got pydantic's "Input should be a valid integer, got a number with a fractional
part"). The same line through every surface: ``parse_spec``, the CLI's ``run``, the Python client,
the MCP ``run_analysis`` tool, and the starter's ``SpecRejected`` reason on AWS.

In process: nothing here runs code (every spec is refused before anything is written or run)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import BaseModel

from alphaagent.cli import main
from alphaagent.errors import InvalidSpecError
from alphaagent.models.spec import Spec, parse_spec

pytestmark = pytest.mark.mcp_sdk  # imports the MCP SDK in this process (tests/conftest.py)


def _spec(**fields: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "spec_version": 1,
        "user_id": "ann",
        "scope": {"conversation_id": "c"},
        "goal": "count",
        "steps": [{"title": "t", "code": "print(1)"}],
    }
    document.update(fields)
    return document


def _refusal(document: dict[str, Any]) -> str:
    with pytest.raises(InvalidSpecError) as refused:
        parse_spec(json.dumps(document))
    return str(refused.value)


@pytest.mark.parametrize(
    ("fields", "line"),
    [
        (
            {"constraints": {"max_runs": "3"}},
            'constraints.max_runs: must be a whole number from 1 to 500, got "3"',
        ),
        (
            {"constraints": {"max_runs": True}},
            "constraints.max_runs: must be a whole number from 1 to 500, got true",
        ),
        (
            {"constraints": {"max_runs": 1.5}},
            "constraints.max_runs: must be a whole number from 1 to 500, got 1.5",
        ),
        (
            {"constraints": {"run_timeout_s": "60"}},
            'constraints.run_timeout_s: must be a number of seconds > 0 and ≤ 900, got "60"',
        ),
        (
            {"constraints": {"turn_timeout_s": False}},
            "constraints.turn_timeout_s: must be a number of seconds > 0 and ≤ 86400, got false",
        ),
        (
            {"steps": [{"title": "t", "code": "x", "fresh": "yes"}]},
            'steps[0].fresh: must be true or false, got "yes"',
        ),
        (
            {"steps": [{"title": "t", "code": "x", "fresh": 1}]},
            "steps[0].fresh: must be true or false, got 1",
        ),
        ({"spec_version": True}, "spec_version: must be 1, got true"),
        ({"spec_version": "1"}, 'spec_version: must be 1, got "1"'),
        (
            {"inputs": [{"kind": "dataset", "name": "d", "version": "2"}]},
            'inputs[0].version: must be a whole number ≥ 1, got "2"',
        ),
        (
            {"inputs": [{"kind": "doc", "path": "docs/x.csv"}]},
            'inputs[0].kind: must be one of "document", "dataset", "connector", "node_artifact", got "doc"',
        ),
        (
            {"inputs": [{"path": "docs/x.csv"}]},
            'inputs[0].kind: required, one of "document", "dataset", "connector", "node_artifact"',
        ),
        ({"inputs": "docs/x.csv"}, 'inputs: must be a list, got "docs/x.csv"'),
        ({"constraints": 5}, "constraints: must be an object, got 5"),
        ({"goal": 5}, "goal: must be a string, got 5"),
        ({"scope": {"conversation_id": 7}}, "scope.conversation_id: must be a string, got 7"),
        (
            {"outputs": [{"kind": "graph", "name": "x"}]},
            'outputs[0].kind: must be one of "dataset", "chart", "report", got "graph"',
        ),
        # the bounds, as before (the value shown as JSON too)
        ({"constraints": {"max_runs": 0}}, "constraints.max_runs: must be a whole number ≥ 1, got 0"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_in_the_projects_words(
    fields: dict[str, Any], line: str
) -> None:
    assert _refusal(_spec(**fields)) == line


def _scalar_fields(model: type[BaseModel], path: str) -> list[tuple[str, str, Any]]:
    """Every number and boolean field under ``model`` as ``(path, kind, annotation)``."""
    found = []
    for name, info in model.model_fields.items():
        kinds = get_args(info.annotation) or (info.annotation,)
        if bool in kinds:
            found.append((f"{path}{name}", "bool", info.annotation))
        elif int in kinds or float in kinds:
            found.append((f"{path}{name}", "number", info.annotation))
    return found


# Each model of the spec with a number or boolean field, in a spec that holds it.
_HOLDERS: dict[str, tuple[dict[str, Any], str]] = {
    "Spec": ({}, ""),
    "Constraints": ({"constraints": {}}, "constraints."),
    "Step": ({"steps": [{"title": "t", "code": "x"}]}, "steps[0]."),
    "DatasetInput": ({"inputs": [{"kind": "dataset", "name": "d"}]}, "inputs[0]."),
    "NodeArtifactInput": (
        {"inputs": [{"kind": "node_artifact", "node_id": "n", "artifact": "a"}]},
        "inputs[0].",
    ),
}


def _spec_models() -> list[type[BaseModel]]:
    seen: list[type[BaseModel]] = []

    def walk(annotation: Any) -> None:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel) and annotation not in seen:
            seen.append(annotation)
            for info in annotation.model_fields.values():
                walk(info.annotation)
        for arg in get_args(annotation):
            walk(arg)

    walk(Spec)
    return seen


def test_every_number_and_boolean_of_the_spec_model_is_strict() -> None:
    # Given every number and boolean field of every model the spec holds (found by walking the
    # model: a field added later is covered without editing this test)
    fields = [
        (model.__name__, path, kind)
        for model in _spec_models()
        for path, kind, _ in _scalar_fields(model, "")
    ]
    assert {model for model, _, _ in fields} <= set(_HOLDERS), fields
    assert len(fields) >= 6, fields  # max_runs, both timeouts, fresh, both versions
    for model_name, name, kind in fields:
        document, prefix = _HOLDERS[model_name]
        for wrong in ["1", True] if kind == "number" else ["true", 1]:
            spec = json.loads(json.dumps(_spec(**document)))
            holder = spec
            for part in prefix.rstrip(".").replace("[0]", ".0").split("."):
                if part:
                    holder = holder[int(part)] if part.isdigit() else holder[part]
            holder[name] = wrong
            # When that field is sent as a string or a boolean (a number) instead
            line = _refusal(spec)
            # Then the refusal names its path and shows the value as JSON, in the project's words
            assert line.startswith(f"{prefix}{name}: must be "), line
            assert line.endswith(f", got {json.dumps(wrong)}"), line
            assert "Input should" not in line, line


def test_the_same_line_through_the_cli_the_client_and_the_starter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from alphaagent.client import connect
    from alphaagent.domain.turn_steps import rejection_of, spec_from_message

    document = _spec(constraints={"max_runs": "3"})
    line = 'constraints.max_runs: must be a whole number from 1 to 500, got "3"'
    home = tmp_path / "home"
    # The CLI: `alphaagent run spec.json` exits 2 with that line and writes nothing
    monkeypatch.chdir(tmp_path)
    (tmp_path / "spec.json").write_text(json.dumps(document))
    assert main(["run", "spec.json", "--home", str(home), "--user", "ann"]) == 2
    assert capsys.readouterr() == ("", f"alphaagent: error: {line}\n")
    # The Python client, given the spec as a mapping (what a program holds)
    with connect(backend="local", user="ann", home=home, coder=None) as client:
        with pytest.raises(InvalidSpecError) as refused:
            client.run_analysis(document, wait=False)
        assert str(refused.value) == line
    assert not (home / "conversations").exists()
    # The starter on AWS: the message is refused with that reason in its SpecRejected event
    body = json.dumps(document)
    with pytest.raises(InvalidSpecError) as refused:
        spec_from_message(body, message_id="m-1", sent_ms=0)
    assert rejection_of(body, message_id="m-1", reason=str(refused.value)).reason == line


def test_the_same_line_through_the_mcp_run_analysis_tool(tmp_path: Path) -> None:
    pytest.importorskip("mcp")
    import anyio
    from mcp import Client as McpClient

    from alphaagent.client import connect
    from alphaagent.mcp_server import build_server

    document = _spec(steps=[{"title": "t", "code": "x", "fresh": "yes"}])
    del document["user_id"]  # the server acts for one user
    with connect(backend="local", user="ann", home=tmp_path, coder=None) as client:

        async def scenario() -> Any:
            async with McpClient(build_server(client)) as mcp:
                return await mcp.call_tool("run_analysis", {"spec": document})

        result = anyio.run(scenario)
    assert result.is_error
    assert [block.text for block in result.content] == ['steps[0].fresh: must be true or false, got "yes"']


def test_a_connector_request_is_strict_and_worded_the_same_way(tmp_path: Path) -> None:
    from alphaagent.client import connect

    document = _spec(inputs=[{"kind": "connector", "connector": "file", "request": {"path": 5}}])
    with (
        connect(backend="local", user="ann", home=tmp_path, coder=None) as client,
        pytest.raises(InvalidSpecError) as refused,
    ):
        client.run_analysis(document, wait=False)
    assert str(refused.value) == "inputs[0].request.path: must be a string, got 5"
