"""``alphaagent mcp`` driven by the ``mcp`` SDK's own client (issue 15 acceptance).

Each test starts the real server as a subprocess (``python -m alphaagent.cli mcp``) on the local
backend, over stdio (or streamable HTTP for the token tests), with its own data directory, and talks
to it exactly as an orchestrating agent's MCP client does. The specs carry pinned steps, so no
model is involved.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from assertions import assert_status
from installed import skip_unless_installed
from sandboxes import register_light

from alphaagent.client import connect

skip_unless_installed("mcp")

pytestmark = pytest.mark.mcp_sdk  # imports the MCP SDK in this process (tests/conftest.py)

if TYPE_CHECKING:
    from mcp import Client
    from mcp.types import CallToolResult

ALICE, BOB = "alice@example.com", "bob@example.com"
PENGUINS = "species,mass_g\nAdelie,3700\nAdelie,3800\nGentoo,5076\nGentoo,5200\nChinstrap,3733\n"
STEPS = [
    {
        "title": "mean mass per species",
        "code": (
            "import pandas as pd\n"
            "means = pd.read_csv('docs/penguins.csv').groupby('species')['mass_g'].mean().round(1)\n"
            "means.to_csv('datasets/mass-by-species.csv')\n"
            "print(means.to_string())\n"
        ),
    },
    {
        "title": "chart it",
        "code": (
            "import pandas as pd\n"
            "means = pd.read_csv('datasets/mass-by-species.csv', index_col=0)['mass_g']\n"
            "means.plot.barh(title='Mean body mass (g)').figure.savefig('charts/mass.png')\n"
        ),
    },
]
TOOLS = {"run_analysis", "list_artifacts", "read_artifact", "list_turns"}


@pytest.fixture
def sources(tmp_path: Path) -> Path:
    root = tmp_path / "sources"
    root.mkdir()
    (root / "penguins.csv").write_text(PENGUINS)
    return root


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def server_env(home: Path, sources: Path) -> dict[str, str]:
    # No model: a spec without steps is refused, so nothing here can reach an API.
    return {
        "ALPHAAGENT_HOME": str(home),
        "ALPHAAGENT_FILE_ROOTS": str(sources),
        "ANTHROPIC_API_KEY": "",
        "CLAUDE_CODE_USE_BEDROCK": "",
    }


@asynccontextmanager
async def mcp_session(home: Path, sources: Path, user: str = ALICE) -> AsyncIterator[Client]:
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "alphaagent.cli", "mcp", "--user", user],
        env=server_env(home, sources),
    )
    async with Client(params, read_timeout_seconds=120) as client:
        yield client


@dataclass
class Alice:
    """The module's one stdio server (``alphaagent mcp --user alice``, ~2.5 CPU-s to start) on a data
    directory the tests share, and how a test talks to it: ``run(scenario)`` awaits
    ``scenario(client)`` on the event loop that holds the server's session."""

    home: Path
    sources: Path
    run: Callable[[Callable[[Client], Awaitable[Any]]], Any]


@pytest.fixture(scope="module")
def alice(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Alice]:
    import anyio.from_thread

    root = tmp_path_factory.mktemp("mcp")
    sources = root / "sources"
    sources.mkdir()
    (sources / "penguins.csv").write_text(PENGUINS)
    home = root / "home"
    with (
        anyio.from_thread.start_blocking_portal() as portal,
        portal.wrap_async_context_manager(mcp_session(home, sources)) as client,
    ):
        yield Alice(home, sources, lambda scenario: portal.call(scenario, client))


def penguin_spec(sources: Path, conversation: str, **fields: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "spec_version": 1,
        "scope": {"conversation_id": conversation},
        "goal": "Which penguin species is heaviest?",
        "inputs": [
            {"kind": "connector", "connector": "file", "request": {"path": str(sources / "penguins.csv")}}
        ],
        "outputs": [{"kind": "dataset", "name": "mass-by-species"}, {"kind": "chart", "name": "mass"}],
        "steps": STEPS,
    }
    spec.update(fields)
    return spec


def text_of(result: CallToolResult) -> str:
    from mcp.types import TextContent

    return "\n".join(block.text for block in result.content if isinstance(block, TextContent))


# ----------------------------------------------------------------------------- the happy path


def test_an_orchestrator_runs_a_spec_and_reads_its_artifacts_over_stdio(alice: Alice) -> None:
    from mcp.types import ImageContent

    home, sources = alice.home, alice.sources
    progress: list[tuple[float, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, message))

    async def scenario(client: Client) -> dict[str, Any]:
        # Given the server's tools
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        # When the orchestrator runs a spec with pinned steps, asking for progress
        result = await client.call_tool(
            "run_analysis", {"spec": penguin_spec(sources, "penguins")}, progress_callback=on_progress
        )
        scope = {"conversation_id": "penguins"}
        table = await client.call_tool("read_artifact", {"scope": scope, "name": "mass-by-species"})
        page = await client.call_tool(
            "read_artifact", {"scope": scope, "name": "mass-by-species", "offset": 8, "limit": 10}
        )
        chart = await client.call_tool("read_artifact", {"scope": scope, "name": "mass"})
        listed = await client.call_tool("list_artifacts", {"scope": scope})
        turns = await client.call_tool("list_turns", {"scope": scope})
        return {
            "tools": tools,
            "result": result,
            "table": table,
            "page": page,
            "chart": chart,
            "listed": listed,
            "turns": turns,
        }

    got = alice.run(scenario)

    # Then it sees exactly the four tools, described for a model, each with an output schema
    tools = got["tools"]
    assert set(tools) == TOOLS
    assert "spec_version" in (tools["run_analysis"].description or "")
    assert {"status", "summary", "artifacts", "citations", "error", "scope_root"} <= set(
        tools["run_analysis"].output_schema["properties"]
    )
    assert all(tools[name].output_schema for name in ("run_analysis", "list_artifacts", "list_turns"))

    # And the turn completed; its artifacts are files on disk with the registered bytes
    result: CallToolResult = got["result"]
    assert not result.is_error, text_of(result)
    structured = result.structured_content
    assert structured is not None, text_of(result)
    assert_status(structured, "completed", text_of(result))
    assert {(a["kind"], a["name"], a["version"]) for a in structured["artifacts"]} == {
        ("dataset", "mass-by-species", 1),
        ("chart", "mass", 1),
    }
    root = Path(structured["scope_root"])
    assert root == (home / "conversations" / "penguins").resolve()
    for artifact in structured["artifacts"]:
        data = (root / artifact["path"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == artifact["sha256"]
    assert "mass-by-species" in text_of(result) and "completed" in text_of(result)

    # And progress came as notifications while it ran: each step and its run
    messages = [message or "" for _value, message in progress]
    assert any(m.startswith("step 1/2: mean mass per species") for m in messages), messages
    assert any(m.startswith("step 2/2: ok") for m in messages), messages
    assert [value for value, _ in progress] == sorted(value for value, _ in progress)

    # And the readers return the artifact's text a page at a time, and the chart as an image
    csv = (root / "datasets/mass-by-species.csv").read_text()
    header, body = text_of(got["table"]).split("\n", 1)
    assert body == csv and header.endswith(f"characters 0-{len(csv)} of {len(csv)}; the end")
    header, body = text_of(got["page"]).split("\n", 1)
    assert body == csv[8:18] and header.endswith(
        f"characters 8-18 of {len(csv)}; call again with offset=18 for more"
    )
    [image] = [block for block in got["chart"].content if isinstance(block, ImageContent)]
    assert image.mime_type == "image/png"
    assert base64.b64decode(image.data) == (root / "charts/mass.png").read_bytes()
    listed = got["listed"].structured_content["artifacts"]
    assert [(a["name"], a["version"]) for a in listed] == [("mass", 1), ("mass-by-species", 1)]
    [turn] = got["turns"].structured_content["turns"]
    assert_status(turn, "completed")
    assert turn["turn_id"] == structured["turn_id"]


# ----------------------------------------------------------------------------- refusals


def test_a_bad_spec_is_an_error_result_naming_the_field_and_writes_nothing(alice: Alice) -> None:
    home, sources = alice.home, alice.sources
    bad = {
        "missing goal": (penguin_spec(sources, "bad-1", goal=None), "goal: Input should be a valid string"),
        "unknown field": (penguin_spec(sources, "bad-2", colour="red"), "colour: unknown field"),
        "bad scope id": (
            penguin_spec(sources, "bad/3"),
            "scope.conversation_id: must be 1-80 characters of letters, digits, '_' and '-', got \"bad/3\"",
        ),
        "bad output name": (
            penguin_spec(sources, "bad-4", outputs=[{"kind": "chart", "name": "Mass Chart"}]),
            "outputs[0].name: must be 1-64 characters of a-z, 0-9, '.', '_' and '-', starting with a letter or digit, got \"Mass Chart\"",
        ),
        "no steps, no model": (
            penguin_spec(sources, "bad-5", steps=None),
            "steps: this spec has no pinned steps",
        ),
    }
    del bad["missing goal"][0]["goal"]
    bad["missing goal"] = (bad["missing goal"][0], "goal: Field required")

    async def scenario(client: Client) -> dict[str, CallToolResult]:
        answers = {
            name: await client.call_tool("run_analysis", {"spec": spec}) for name, (spec, _) in bad.items()
        }
        answers["reader scope"] = await client.call_tool(
            "list_artifacts", {"scope": {"conversation_id": "a b"}}
        )
        answers["reader version"] = await client.call_tool(
            "read_artifact", {"scope": {"conversation_id": "x"}, "name": "n", "version": 0}
        )
        return answers

    answers = alice.run(scenario)
    for name, (_spec, expected) in bad.items():
        assert answers[name].is_error, name
        assert text_of(answers[name]).startswith(expected), (name, text_of(answers[name]))
        assert "\n" not in text_of(answers[name]), name
    assert answers["reader scope"].is_error
    assert text_of(answers["reader scope"]).startswith("scope.conversation_id: ")
    assert answers["reader version"].is_error
    assert text_of(answers["reader version"]) == "version: must be a whole number ≥ 1, got 0"
    # (the server is shared: the other tests' conversations are there, none of these)
    written = (
        {p.name for p in (home / "conversations").iterdir()} if (home / "conversations").exists() else set()
    )
    assert not {name for name in written if name.startswith("bad")}, written


def test_another_users_spec_or_scope_is_refused_exactly_like_a_missing_scope(
    alice: Alice, monkeypatch: pytest.MonkeyPatch
) -> None:
    home, sources = alice.home, alice.sources
    # Given bob's conversation, with one turn in it
    monkeypatch.setenv("ALPHAAGENT_FILE_ROOTS", str(sources))
    # (his outputs made without pandas, in an environment without the builtin preload: what alice
    # is told, not the analysis, is the subject; a builtin zygote costs ~2 CPU-s)
    light_steps = [
        {"title": "table", "code": "open('datasets/mass-by-species.csv', 'w').write('species,mass_g\\n')"},
        {"title": "chart", "code": "open('charts/mass.png', 'wb').write(b'\\x89PNG\\r\\n\\x1a\\n')"},
    ]
    bobs = penguin_spec(sources, "bobs", environment_id=register_light(home), steps=light_steps)
    with connect(backend="local", user=BOB, home=home, coder=None) as bob:
        assert_status(bob.run_analysis(bobs), "completed")

    async def scenario(client: Client) -> dict[str, CallToolResult]:
        scope = {"conversation_id": "bobs"}
        return {
            # a spec that names bob, in a new conversation and in bob's
            "names bob, new": await client.call_tool(
                "run_analysis", {"spec": penguin_spec(sources, "fresh", user_id=BOB)}
            ),
            "names bob, his": await client.call_tool(
                "run_analysis", {"spec": penguin_spec(sources, "bobs", user_id=BOB)}
            ),
            # alice's own spec aimed at bob's conversation
            "alice in bobs": await client.call_tool("run_analysis", {"spec": penguin_spec(sources, "bobs")}),
            "list bobs": await client.call_tool("list_artifacts", {"scope": scope}),
            "read bobs": await client.call_tool("read_artifact", {"scope": scope, "name": "mass"}),
            "turns bobs": await client.call_tool("list_turns", {"scope": scope}),
            # and the answers for conversations that do not exist
            "list missing": await client.call_tool("list_artifacts", {"scope": {"conversation_id": "fresh"}}),
            "turns missing": await client.call_tool("list_turns", {"scope": {"conversation_id": "bobs-x"}}),
        }

    answers = alice.run(scenario)

    # Then every answer is an error, and bob's answers are the missing scope's, word for word
    assert all(answer.is_error for answer in answers.values())
    missing = text_of(answers["list missing"])
    assert missing == "conversation fresh not found"
    assert text_of(answers["names bob, new"]) == missing
    for name in ("names bob, his", "alice in bobs", "list bobs", "read bobs", "turns bobs"):
        assert text_of(answers[name]) == "conversation bobs not found", name
    assert text_of(answers["turns missing"]) == "conversation bobs-x not found"
    assert all(answer.structured_content is None for answer in answers.values())

    # And nothing was written: no new conversation, bob's still has its one turn
    assert not (home / "conversations" / "fresh").exists()
    with connect(backend="local", user=BOB, home=home, coder=None) as bob:
        assert len(bob.turns({"conversation_id": "bobs"})) == 1


# ----------------------------------------------------------------------------- streamable HTTP


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture
def http_server(home: Path, sources: Path) -> Iterator[tuple[str, str]]:
    port, token = free_port(), "t-" + "x" * 40
    env = {**os.environ, **server_env(home, sources), "ALPHAAGENT_MCP_TOKEN": token}
    process = subprocess.Popen(
        [sys.executable, "-m", "alphaagent.cli", "mcp", "--user", ALICE, "--http", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"the server did not start: {process.stderr.read()!r}") from None
                time.sleep(0.2)
        yield url, token
    finally:
        process.terminate()
        process.wait(timeout=30)
        assert process.stderr is not None
        process.stderr.close()


def post(url: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}).encode()
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            **headers,
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()


def test_streamable_http_refuses_a_request_without_the_bearer_token(http_server: tuple[str, str]) -> None:
    import anyio.from_thread

    url, token = http_server

    # When a request comes without a token, with a wrong one, or with the token not as a bearer
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": token}):
        status, response_headers, body = post(url, headers)
        # Then it is refused with 401 before the MCP app sees it
        assert status == 401, (headers, body)
        assert response_headers.get("www-authenticate", "").startswith("Bearer")
        assert b"tools" not in body

    # And even with the token, a page of another origin cannot use it (DNS rebinding: the Host and
    # Origin a browser would send for evil.example are refused)
    bearer = {"Authorization": f"Bearer {token}"}
    assert post(url, {**bearer, "Host": "evil.example"})[0] == 421
    assert post(url, {**bearer, "Origin": "http://evil.example"})[0] == 403

    # And with the token, the SDK's own client lists the tools
    async def scenario() -> set[str]:
        import httpx2
        from mcp import ClientSession
        from mcp.client.streamable_http import streamable_http_client

        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http,
            streamable_http_client(url, http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            return {tool.name for tool in (await session.list_tools()).tools}

    assert anyio.run(scenario) == TOOLS


# ----------------------------------------------------------------------------- usage errors


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--http", "0"], "alphaagent: error: --http: must be a whole number from 1 to 65535, got '0'"),
        (
            ["--queue-url", "https://sqs.eu-west-1.amazonaws.com/1/q"],
            "alphaagent: error: --queue-url, --table",
        ),
        (["--backend", "aws"], "alphaagent: error: --queue-url: give the stack's SpecQueueUrl output"),
        (["--user", "two words"], "alphaagent: error: --user: must be 1-128 characters"),
    ],
)
def test_a_usage_error_is_one_line_and_exit_2_before_anything_starts(
    argv: list[str], expected: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from alphaagent.aws.client import client_settings
    from alphaagent.cli import main

    for name in ("ALPHAAGENT_SPEC_QUEUE_URL", "ALPHAAGENT_STATE_TABLE", "ALPHAAGENT_WORKSPACES_BUCKET"):
        monkeypatch.delenv(name, raising=False)
    client_settings.cache_clear()
    try:
        code = main(["mcp", *argv])
    except SystemExit as exited:  # a bad option value is refused by the parser
        code = exited.code
    finally:
        client_settings.cache_clear()
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(expected) and err.count("\n") == 1, err
