"""``alphaagent.client`` and ``alphaagent mcp`` on the aws backend, under moto (issue 15 acceptance).

The stack is the turn machine harness of ``test_turn_machine.py`` (its fixture, imported): the real
state machine, starter, recorder, coder worker and env function. The client submits to its
SpecQueue, waits on its state table and reads its bucket; the MCP server is the real one, called
in-process through the ``mcp`` SDK's client. moto enforces no IAM here (see that module).
"""

from __future__ import annotations

from typing import Any

import pytest
from assertions import assert_status
from installed import skip_unless_installed

from alphaagent.client import AwsClient, connect
from alphaagent.errors import NotFoundError
from integration.test_turn_machine import (  # the fixture is used by name below
    BUCKET,
    REGION,
    TABLE,
    USER,
    Stack,
    analysis_spec,
    conversation,
    iam_template,  # noqa: F401 - the stack fixture requests it
    stack,
    turn_stack,  # noqa: F401 - the stack fixture requests it (one stack per module)
    upload_measurements,
)

skip_unless_installed("mcp")

pytestmark = pytest.mark.mcp_sdk  # imports the MCP SDK in this process (tests/conftest.py)

__all__ = ["stack"]


def aws_client(stack: Stack, user: str = USER) -> AwsClient:
    client = connect(
        backend="aws",
        user=user,
        queue_url=stack.spec_queue,
        table=TABLE,
        bucket=BUCKET,
        region=REGION,
        timeout_s=120,
        poll_s=0.2,
    )
    assert isinstance(client, AwsClient)
    return client


def unbound(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec as an orchestrator writes it: no user_id (the client is bound to one)."""
    return {k: v for k, v in spec.items() if k != "user_id"}


def test_run_analysis_submits_waits_and_returns_the_turn_result(stack: Stack) -> None:
    # Given the user's conversation with a document, and the stack running
    scope = conversation()
    upload_measurements(stack, scope)
    spec = unbound(analysis_spec(scope))
    stack.start()
    client = aws_client(stack)
    progress: list[str] = []

    # When the client runs the spec
    result = client.run_analysis(spec, progress=progress.append)

    # Then it came back completed, with the artifacts the stack registered
    assert_status(result, "completed")
    assert result.turn_id == spec["turn_id"]
    assert {(a.kind, a.name, a.version) for a in result.artifacts} == {
        ("dataset", "summary", 1),
        ("report", "mass", 1),
    }
    assert progress[0] == f"turn {spec['turn_id']}: submitted" and progress[-1].endswith(": completed")

    # And the same client reads them back from the table and the bucket
    assert_status(client.turn(result.turn_id), "completed")
    assert [t.turn_id for t in client.turns(scope)] == [result.turn_id]
    versions = client.artifacts(scope)
    assert {v.name for v in versions} == {"summary", "mass"}
    version, data = client.artifact(scope, "summary")
    assert data == client.read(scope, version.path)
    assert data.decode().splitlines() == ["species,mass_g", "Adelie,3750.0", "Gentoo,5050.0"]
    assert client.scope_root(scope) == f"s3://{BUCKET}/{scope.key}"

    # And wait=False returns at once with the turn id, and result() waits for it
    again = unbound(analysis_spec(scope, turn_id=None))
    del again["turn_id"]
    submitted = client.run_analysis(again, wait=False)
    assert submitted.scope == scope
    assert_status(client.result(submitted.turn_id), "completed")


def test_another_users_spec_is_refused_before_anything_is_sent(stack: Stack) -> None:
    # Given alice's conversation
    scope = conversation()
    upload_measurements(stack, scope)
    stack.start(worker=False)
    mallory = aws_client(stack, user="mallory@example.com")

    # When mallory runs a spec in it, or one that names alice
    refusals = []
    for spec in (unbound(analysis_spec(scope)), analysis_spec(conversation())):
        with pytest.raises(NotFoundError) as refused:
            mallory.run_analysis(spec)
        refusals.append((str(refused.value), spec["scope"]["conversation_id"]))
    with pytest.raises(NotFoundError) as missing:
        mallory.artifacts(conversation())

    # Then each refusal is the answer a missing conversation gets, and nothing reached the queue
    for message, conversation_id in refusals:
        assert message == f"conversation {conversation_id} not found"
    assert str(missing.value).startswith("conversation c-") and str(missing.value).endswith(" not found")
    assert stack.starter.handled == 0 and stack.executions() == []


def test_the_mcp_server_on_the_aws_backend_returns_the_same_result_shape(stack: Stack) -> None:
    import anyio

    from alphaagent.mcp_server import build_server

    # Given the MCP server of a client of the stack
    scope = conversation()
    upload_measurements(stack, scope)
    spec = unbound(analysis_spec(scope))
    stack.start()
    server = build_server(aws_client(stack))
    progress: list[str] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(message or "")

    async def scenario() -> tuple[Any, Any, Any]:
        from mcp import Client as McpClient

        async with McpClient(server) as client:
            ran = await client.call_tool("run_analysis", {"spec": spec}, progress_callback=on_progress)
            listed = await client.call_tool("list_artifacts", {"scope": scope.model_dump()})
            read = await client.call_tool("read_artifact", {"scope": scope.model_dump(), "name": "mass"})
            return ran, listed, read

    # When an orchestrator calls run_analysis
    ran, listed, read = anyio.run(scenario)

    # Then the result is the local backend's shape, with the scope root in the bucket
    assert not ran.is_error, ran.content
    result = ran.structured_content
    assert_status(result, "completed")
    assert result["turn_id"] == spec["turn_id"]
    assert result["scope_root"] == f"s3://{BUCKET}/{scope.key}"
    assert {(a["kind"], a["name"]) for a in result["artifacts"]} == {
        ("dataset", "summary"),
        ("report", "mass"),
    }
    assert set(result) >= {"summary", "citations", "run_ids", "error", "failed_step", "scope"}
    assert any(message.endswith(": completed") for message in progress), progress
    assert {a["name"] for a in listed.structured_content["artifacts"]} == {"summary", "mass"}
    assert "Heaviest: Gentoo" in read.content[0].text


def test_aws_refusing_the_submit_is_an_error_result_not_a_crash(stack: Stack) -> None:
    import anyio

    from alphaagent.mcp_server import build_server

    # Given a server whose client names a queue that does not exist
    client = connect(
        backend="aws",
        user=USER,
        queue_url=stack.spec_queue + "-gone",
        table=TABLE,
        bucket=BUCKET,
        region=REGION,
    )
    server = build_server(client)

    async def scenario() -> Any:
        from mcp import Client as McpClient

        async with McpClient(server) as mcp:
            return await mcp.call_tool("run_analysis", {"spec": unbound(analysis_spec(conversation()))})

    # When run_analysis is called, then the model reads what AWS said, in one line
    result = anyio.run(scenario)
    assert result.is_error
    [block] = result.content
    assert block.text.startswith("AWS: ") and "\n" not in block.text, block.text
    assert "queue" in block.text.lower()
