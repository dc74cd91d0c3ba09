"""A spec is JSON, and JSON (RFC 8259) has no ``NaN`` and no infinity, but Python's ``json`` reads
``NaN``, ``Infinity`` and ``-Infinity``, and ``1e400`` overflows to infinity (new-user review:
``"run_timeout_s": NaN`` was refused as ``got nan``, ``1e400`` as ``got inf``). Such a number is
refused by ``parse_spec`` naming where it is, in the project's words, before anything is checked,
written or run; every surface parses a spec through it: the CLI, the Python client, the MCP
``run_analysis`` tool and the starter on AWS. In process: nothing is run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from alphaagent.cli import main
from alphaagent.errors import InvalidSpecError
from alphaagent.models.spec import parse_spec

pytestmark = pytest.mark.mcp_sdk  # imports the MCP SDK in this process (tests/conftest.py)

_HEAD = '{"spec_version": 1, "user_id": "ann", "scope": {"conversation_id": "c"}, "goal": "count", '


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("NaN", "constraints.run_timeout_s: must be a finite JSON number, got NaN"),
        ("Infinity", "constraints.run_timeout_s: must be a finite JSON number, got Infinity"),
        ("-Infinity", "constraints.run_timeout_s: must be a finite JSON number, got -Infinity"),
        (
            "1e400",
            "constraints.run_timeout_s: must be a finite JSON number, got 1e400"
            " (beyond the largest number, about 1.8e308)",
        ),
    ],
)
def test_a_number_json_has_not_is_refused_naming_its_field(text: str, line: str) -> None:
    with pytest.raises(InvalidSpecError) as refused:
        parse_spec(_HEAD + '"constraints": {"run_timeout_s": ' + text + "}}")
    assert str(refused.value) == line


def test_one_deep_in_a_connector_request_is_named_where_it_is() -> None:
    raw = _HEAD + '"inputs": [{"kind": "connector", "connector": "http", "request": {"a b": [1, NaN]}}]}'
    with pytest.raises(InvalidSpecError) as refused:
        parse_spec(raw)
    assert str(refused.value) == 'inputs[0].request["a b"][1]: must be a finite JSON number, got NaN'


def test_a_key_too_long_to_show_is_cut_in_the_line_as_a_value_is() -> None:
    # A first-deploy audit sent a 60,000-character key: the refusal repeated it whole
    key = "k" * 60_000
    raw = _HEAD + '"inputs": [{"kind": "connector", "connector": "http", "request": {"' + key + '": NaN}}]}'
    with pytest.raises(InvalidSpecError) as refused:
        parse_spec(raw)
    line = str(refused.value)
    assert line.startswith('inputs[0].request["kkk') and line.endswith(
        ": must be a finite JSON number, got NaN"
    )
    assert len(line) < 200, len(line)


def test_finite_numbers_and_the_string_nan_are_taken() -> None:
    spec = parse_spec(_HEAD + '"constraints": {"run_timeout_s": 1.5e2}, "goal": "NaN"}')
    assert spec.constraints.run_timeout_s == 150.0
    assert spec.goal == "NaN"


def test_the_same_line_through_the_cli_the_client_and_the_starter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from alphaagent.client import connect
    from alphaagent.domain.turn_steps import rejection_of, spec_from_message

    raw = _HEAD + '"constraints": {"run_timeout_s": NaN}}'
    line = "constraints.run_timeout_s: must be a finite JSON number, got NaN"
    home = tmp_path / "home"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "spec.json").write_text(raw)
    assert main(["run", "spec.json", "--home", str(home), "--user", "ann"]) == 2
    assert capsys.readouterr() == ("", f"alphaagent: error: {line}\n")
    document: dict[str, Any] = json.loads(raw)  # a program's mapping, holding float("nan")
    with connect(backend="local", user="ann", home=home, coder=None) as client:
        with pytest.raises(InvalidSpecError) as refused:
            client.run_analysis(document, wait=False)
        assert str(refused.value) == line
        document["constraints"]["run_timeout_s"] = float("inf")
        with pytest.raises(InvalidSpecError) as refused:
            client.run_analysis(document, wait=False)
        assert str(refused.value) == "constraints.run_timeout_s: must be a finite JSON number, got Infinity"
    assert not (home / "conversations").exists()
    for body in (raw, json.dumps({"detail-type": "SpecSubmitted", "detail": {"spec": json.loads(raw)}})):
        with pytest.raises(InvalidSpecError) as refused:
            spec_from_message(body, message_id="m-1", sent_ms=0)
        assert rejection_of(body, message_id="m-1", reason=str(refused.value)).reason == line


def test_the_same_line_through_the_mcp_run_analysis_tool(tmp_path: Path) -> None:
    pytest.importorskip("mcp")
    import anyio
    from mcp import types

    from alphaagent.client import connect
    from alphaagent.mcp_server import build_server

    # The request as the stdio transport reads it: the SDK's JSON parser takes NaN (a float nan).
    # (The SDK's in-memory client would send it as null: the server would never see the NaN.)
    spec = _HEAD.replace('"user_id": "ann", ', "") + '"constraints": {"run_timeout_s": NaN}}'
    line = '{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "run_analysis",'
    line += ' "arguments": {"spec": ' + spec + "}}}"
    request = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    assert isinstance(request, types.JSONRPCRequest) and request.params is not None
    arguments = request.params["arguments"]
    with connect(backend="local", user="ann", home=tmp_path, coder=None) as client:
        server = build_server(client)
        result = anyio.run(server.call_tool, "run_analysis", arguments)
    assert result.is_error  # type: ignore[union-attr]
    assert [block.text for block in result.content] == [  # type: ignore[union-attr]
        "constraints.run_timeout_s: must be a finite JSON number, got NaN"
    ]
