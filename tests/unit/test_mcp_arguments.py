"""The MCP tools' arguments as an orchestrating agent gets them wrong (second new-user review): every
refusal is one line naming the argument and the rule, an argument a tool does not have is refused
(not dropped), ``list_turns`` takes ``limit`` as ``turns --limit`` does, and ``initialize`` names
the package's version. In process, through the SDK's own client: no backend is needed, as the
arguments are refused before the client is called."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from installed import skip_unless_installed

from alphaagent.models.records import Turn

skip_unless_installed("mcp")

pytestmark = pytest.mark.mcp_sdk  # imports the MCP SDK in this process (tests/conftest.py)

SCOPE = {"conversation_id": "c"}


def _turns() -> list[Turn]:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    return [
        Turn(
            turn_id=f"T{n}",
            user_id="alice",
            scope_key="conversations/c",
            session_id="s",
            status="completed",
            goal=f"goal {n}",
            started_at=start + timedelta(minutes=n),
        )
        for n in (1, 2, 3)
    ]


def _calls(*calls: tuple[str, dict[str, Any]]) -> list[Any]:
    """Each ``(tool, arguments)`` called on a server whose client only lists three turns."""
    import anyio

    from alphaagent.mcp_server import build_server

    called: list[str] = []

    def turns(scope: Any) -> list[Turn]:
        called.append("turns")
        return _turns()

    server = build_server(SimpleNamespace(turns=turns))  # type: ignore[arg-type]

    async def scenario() -> list[Any]:
        from mcp import Client as McpClient

        async with McpClient(server) as mcp:
            return [await mcp.call_tool(name, arguments) for name, arguments in calls]

    return anyio.run(scenario)


@pytest.mark.parametrize(
    ("tool", "arguments", "line"),
    [
        ("run_analysis", {}, "spec: Field required"),
        ("run_analysis", {"spec": [1]}, "spec: must be an object, got [1]"),
        ("run_analysis", {"spec": {}, "user": "x"}, "user: unknown argument (arguments: spec)"),
        ("list_artifacts", {"scop": SCOPE}, "scop: unknown argument (did you mean 'scope'?)"),
        ("read_artifact", {"scope": SCOPE, "name": 5}, "name: must be a string, got 5"),
        # An argument is JSON: its type is strict ("2" is not a version, true not an offset) and
        # its value is shown as JSON, as a spec's field is (alphaagent.wording's rule).
        (
            "read_artifact",
            {"scope": SCOPE, "name": "n", "version": "2"},
            'version: must be a whole number ≥ 1, got "2"',
        ),
        (
            "read_artifact",
            {"scope": SCOPE, "name": "n", "version": 0},
            "version: must be a whole number ≥ 1, got 0",
        ),
        (
            "read_artifact",
            {"scope": SCOPE, "name": "n", "offset": True},
            "offset: must be a whole number ≥ 0, got true",
        ),
        (
            "read_artifact",
            {"scope": SCOPE, "name": "n", "limit": 1.5},
            "limit: must be a whole number from 1 to 100000, got 1.5",
        ),
        (
            "read_artifact",
            {"scope": SCOPE, "name": "n", "verison": 2},
            "verison: unknown argument (did you mean 'version'?)",
        ),
        ("list_turns", {"scope": SCOPE, "lmit": 1}, "lmit: unknown argument (did you mean 'limit'?)"),
        # list_turns' limit follows the CLI's one rule for --limit, in the CLI's words; a string
        # or a boolean is not a number of turns even if pydantic's lax mode would take "2" or true.
        ("list_turns", {"scope": SCOPE, "limit": 0}, "limit: must be a whole number ≥ 1, got 0"),
        ("list_turns", {"scope": SCOPE, "limit": "abc"}, 'limit: must be a whole number ≥ 1, got "abc"'),
        ("list_turns", {"scope": SCOPE, "limit": "2"}, 'limit: must be a whole number ≥ 1, got "2"'),
        ("list_turns", {"scope": SCOPE, "limit": True}, "limit: must be a whole number ≥ 1, got true"),
        ("list_turns", {"scope": SCOPE, "limit": 1.5}, "limit: must be a whole number ≥ 1, got 1.5"),
    ],
)
def test_a_bad_argument_is_one_line_naming_it_and_the_rule(
    tool: str, arguments: dict[str, Any], line: str
) -> None:
    # When a tool is called with an argument missing, of the wrong type or that it does not have
    (result,) = _calls((tool, arguments))
    # Then the call is an error result whose text is that one line (no pydantic URL, no dump)
    assert result.is_error and [block.text for block in result.content] == [line]


def test_list_turns_keeps_the_n_newest_as_turns_limit_does() -> None:
    # Given a scope with three turns: When list_turns is asked for the newest two, or for all
    two, every = _calls(("list_turns", {"scope": SCOPE, "limit": 2}), ("list_turns", {"scope": SCOPE}))
    # Then the two newest, newest first; and the text says what the limit left out
    assert [t["turn_id"] for t in two.structured_content["turns"]] == ["T3", "T2"]
    assert two.content[0].text.splitlines()[0] == "2 turns, newest first (1 older not shown: limit 2):"
    assert [t["turn_id"] for t in every.structured_content["turns"]] == ["T3", "T2", "T1"]


def test_the_tools_publish_that_they_take_no_other_argument_and_initialize_names_the_version() -> None:
    import anyio

    from alphaagent.cli import _version
    from alphaagent.mcp_server import TOOL_ARGUMENTS, build_server

    server = build_server(SimpleNamespace())  # type: ignore[arg-type]

    async def scenario() -> tuple[Any, Any]:
        from mcp import Client as McpClient

        async with McpClient(server) as mcp:
            return mcp.server_info, await mcp.list_tools()

    info, listed = anyio.run(scenario)
    assert (info.name, info.version) == ("alphaagent", _version()) and info.version
    schemas = {tool.name: tool.input_schema for tool in listed.tools}
    assert set(schemas) == set(TOOL_ARGUMENTS)
    for name, schema in schemas.items():
        # the published schema and the check agree: the same arguments, no others
        assert schema["additionalProperties"] is False, name
        assert set(schema["properties"]) == set(TOOL_ARGUMENTS[name].model_fields), name
