"""The coder (issue 5): the real claude-agent-sdk and its bundled CLI against a scripted Messages API.

Every turn here runs the bundled Claude Code CLI for real; only the model is scripted
(``scripted_api.py``: ``POST /v1/messages`` streamed as SSE on 127.0.0.1). One server, one coder
and one ``AlphaAgent`` (one sandbox) serve the module; each test loads its own script and works in
its own conversation. A turn costs about a second (the CLI's start); the API-error test bounds the
CLI's retries with ``CLAUDE_CODE_MAX_RETRIES=2`` (backoff ~0.5 s, then ~1 s), so it takes ~5 s.

The acceptance cases of issue 5: a whole turn (a), built-in tools refused (b), tool errors as
``is_error`` (c), max turns (d), API errors retried then surfaced (e), no traffic but the model
endpoint (f). The only endpoint the CLI calls on the base URL is ``POST /v1/messages?beta=true``.
"""

from __future__ import annotations

import json
import math
import os
import re
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from assertions import assert_status
from installed import skip_unless_installed
from scripted_api import Reply, ScriptedMessagesAPI, Status, text, tool_use

from alphaagent.api import AlphaAgent
from alphaagent.domain.backend import ConnectorSettings, TurnSettings
from alphaagent.domain.tools import TurnContext
from alphaagent.errors import ModelConfigError
from alphaagent.ids import new_ulid
from alphaagent.models.common import ConversationScope, utcnow
from alphaagent.models.records import Session, TurnResult
from alphaagent.models.run import FileChangeReport, RunResult
from alphaagent.models.spec import parse_spec
from coder.prompts import SYSTEM_PROMPT, max_turns_for, system_prompt_for
from coder.settings import CoderSettings

skip_unless_installed("claude_agent_sdk")

pytestmark = pytest.mark.mcp_sdk  # imports the MCP SDK in this process (tests/conftest.py)

USER = "analyst@example.com"
API_KEY = "sk-ant-test-not-a-key"
MODEL = "claude-sonnet-4-5"
MAX_RETRIES = 2
PENGUINS = "species,mass_g\nAdelie,3700\nAdelie,3800\nGentoo,5076\nGentoo,5200\nChinstrap,3733\n"
NOTES = ["Field notes, Palmer Station 2008.", "Gentoo penguins were the heaviest we weighed."]


def _pdf(lines: list[str]) -> bytes:
    """A one-page PDF whose text is ``lines`` (Helvetica; no library needed to write it)."""
    content = "BT /F1 12 Tf 14 TL 72 720 Td " + " ".join(f"({line}) Tj T*" for line in lines) + " ET"
    objects = [
        "<< /Type /Catalog /Pages 2 0 R >>",
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 4 0 R >> >>"
        " /Contents 5 0 R >>",
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        f"<< /Length {len(content)} >>\nstream\n{content}\nendstream",
    ]
    out, offsets = b"%PDF-1.4\n", []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{offset:010d} 00000 n \n".encode() for offset in offsets)
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return out


# ----------------------------------------------------------------------------- fixtures and helpers


@pytest.fixture(scope="module")
def api() -> Iterator[ScriptedMessagesAPI]:
    with ScriptedMessagesAPI() as server:
        yield server


@pytest.fixture(scope="module")
def settings(api: ScriptedMessagesAPI) -> CoderSettings:
    return CoderSettings(
        provider="anthropic",
        anthropic_api_key=API_KEY,
        anthropic_base_url=api.base_url,
        model=MODEL,
        max_retries=MAX_RETRIES,
    )


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sources")
    (root / "penguins.csv").write_text(PENGUINS)
    (root / "field-notes.pdf").write_bytes(_pdf(NOTES))
    return root


@pytest.fixture(scope="module")
def agent(
    tmp_path_factory: pytest.TempPathFactory, sources: Path, settings: CoderSettings
) -> Iterator[AlphaAgent]:
    from coder.agent import make_coder

    home = tmp_path_factory.mktemp("home")
    with AlphaAgent(
        home,
        connectors=ConnectorSettings(file_roots=(sources,)),
        turns=TurnSettings(lock_wait_s=30),
        coder=make_coder(settings),
    ) as shared:
        yield shared


def _spec(
    conversation: str,
    goal: str = "Which penguin species is heaviest?",
    *,
    sources: Path | None = None,
    outputs: list[dict[str, Any]] | None = None,
    max_runs: int = 20,
) -> dict[str, Any]:
    inputs = []
    if sources is not None:
        inputs = [
            {"kind": "connector", "connector": "file", "request": {"path": str(sources / name)}}
            for name in ("penguins.csv", "field-notes.pdf")
        ]
    return {
        "spec_version": 1,
        "user_id": USER,
        "scope": {"conversation_id": conversation},
        "goal": goal,
        "inputs": inputs,
        "outputs": outputs or [],
        "constraints": {"max_runs": max_runs, "run_timeout_s": 30},
    }


def _lines(agent: AlphaAgent, conversation: str, result: TurnResult) -> list[dict[str, Any]]:
    scope = ConversationScope(conversation_id=conversation)
    raw = agent.read_file(USER, scope, f"work/turns/{result.turn_id}/transcript.jsonl")
    return [json.loads(line) for line in raw.decode().splitlines()]


def _tool_uses(lines: list[dict[str, Any]]) -> list[str]:
    return [
        block["name"]
        for line in lines
        if line["type"] == "AssistantMessage"
        for block in line["message"]["content"]
        if "name" in block
    ]


def call(tool: str, /, **arguments: Any) -> dict[str, Any]:
    """A scripted call of one of the five platform tools."""
    return tool_use(f"mcp__alphaagent__{tool}", arguments)


# ----------------------------------------------------------------------------- (a) a whole turn

FAILING_CODE = """\
import pandas as pd
penguins = pd.read_csv("docs/penguins.csv")
print(penguins.groupby("species")["body_mass"].mean())
"""

FIXED_CODE = """\
import pandas as pd
penguins = pd.read_csv("docs/penguins.csv")
means = penguins.groupby("species")["mass_g"].mean().rename("mean_mass_g").sort_values()
means.to_csv("datasets/mass-by-species.csv")
axes = means.plot.barh(title="Mean body mass (g)")
axes.figure.savefig("charts/mass-by-species.png", bbox_inches="tight")
print(means.to_string())
"""

SUMMARY = "Gentoo penguins are the heaviest (mean 5138 g), ahead of Adelie (3750 g) and Chinstrap (3733 g)."


def test_a_turn_runs_fixes_reads_registers_cites_and_summarises(
    agent: AlphaAgent, api: ScriptedMessagesAPI, sources: Path
) -> None:
    # Given a spec without steps that asks for a dataset and a chart, and a model that fails once
    outputs = [
        {"kind": "dataset", "name": "mass-by-species", "description": "Mean body mass per species"},
        {"kind": "chart", "name": "mass-chart", "path": "charts/mass-by-species.png"},
    ]
    api.load(
        [
            Reply([text("Let me look at the data."), call("run_in_env", code=FAILING_CODE)]),
            Reply([call("run_in_env", code=FIXED_CODE, timeout_s=20)]),
            Reply([call("read_document", path="docs/field-notes.pdf")]),
            Reply(
                [
                    call(
                        "register_artifact",
                        kind="dataset",
                        path="datasets/mass-by-species.csv",
                        name="mass-by-species",
                    ),
                    call(
                        "register_artifact",
                        kind="chart",
                        path="charts/mass-by-species.png",
                        name="mass-chart",
                    ),
                ]
            ),
            Reply(
                [
                    call(
                        "emit_citation",
                        source="docs/field-notes.pdf",
                        locator="page 1",
                        quote=NOTES[1],
                        claim="Gentoo penguins are the heaviest",
                    )
                ]
            ),
            Reply([text(SUMMARY)]),
        ]
    )

    # When the turn runs through the coder
    result = agent.run_analysis(_spec("whole-turn", sources=sources, outputs=outputs))

    # Then it completed with exactly those artifacts, that citation, both runs and the summary
    assert_status(result, "completed")
    assert sorted((a.kind, a.name, a.path) for a in result.artifacts) == [
        ("chart", "mass-chart", "charts/mass-by-species.png"),
        ("dataset", "mass-by-species", "datasets/mass-by-species.csv"),
    ]
    assert [(c.source, c.locator, c.quote) for c in result.citations] == [
        ("docs/field-notes.pdf", "page 1", NOTES[1])
    ]
    assert len(result.run_ids) == 2
    summary, usage_line = result.summary.split("\n\n")
    assert summary == SUMMARY
    assert usage_line.startswith("[coder: 6 model turns, 2 runs, ")
    assert usage_line.endswith(f"work/turns/{result.turn_id}/transcript.jsonl]")

    # and the files are there: the dataset's numbers and a real PNG
    scope = ConversationScope(conversation_id="whole-turn")
    dataset = agent.read_file(USER, scope, "datasets/mass-by-species.csv").decode()
    assert "Gentoo,5138.0" in dataset
    assert agent.read_file(USER, scope, "charts/mass-by-species.png").startswith(b"\x89PNG\r\n\x1a\n")
    first, second = agent.history(USER, scope)
    assert (first.status, first.error and first.error.name) == ("error", "KeyError")
    assert_status(second, "ok")

    # and the model saw the failure as data, the fix's output, the PDF's text and the registrations
    requests = api.message_requests()
    assert len(requests) == 6
    failed = requests[1].tool_results()[0]
    assert (
        not failed["is_error"]
        and "KeyError: 'Column not found: body_mass'" in failed["text"]
        and "[error] exit=1" in failed["text"]
    )
    assert '"status": "error"' in failed["text"] and '"name": "KeyError"' in failed["text"]
    assert failed["text"].count("Traceback (most recent call last)") == 1
    assert re.search(r"\nGentoo +5138\.0\n\[ok\] exit=0 ", requests[2].tool_results()[0]["text"])
    page = requests[3].tool_results()[0]["text"]
    assert NOTES[1] in page and '"type": "pdf", "pages": 1' in page
    registered = [json.loads(r["text"].split("\n\n")[0]) for r in requests[4].tool_results()]
    assert [(r["name"], r["version"]) for r in registered] == [("mass-by-species", 1), ("mass-chart", 1)]
    assert "citation_id" in requests[5].tool_results()[0]["text"]

    # and it was told the spec: the system prompt, and the goal, inputs and outputs in the prompt
    first_request = requests[0].body
    # (the system prompt names the environment and its packages, from the backend's registry)
    system_prompt = system_prompt_for(agent.backend.environments.get("builtin"))
    assert system_prompt.startswith(SYSTEM_PROMPT) and "'builtin'" in system_prompt
    assert system_prompt in [block["text"] for block in first_request["system"]]
    prompt = first_request["messages"][0]["content"][-1]["text"]
    assert "Which penguin species is heaviest?" in prompt
    assert "- docs/penguins.csv" in prompt and "- docs/field-notes.pdf" in prompt
    assert "- chart 'mass-chart': charts/mass-by-species.png" in prompt
    assert "at most 20 runs of run_in_env, 30 s per run" in prompt

    # and the transcript and usage of the turn are in work/turns/{turn_id}/
    lines = _lines(agent, "whole-turn", result)
    assert lines[0]["type"] == "turn_start" and lines[0]["max_turns"] == max_turns_for(
        parse_spec(json.dumps(_spec("x"))).constraints
    )
    assert lines[0]["system_prompt"] == system_prompt and lines[0]["prompt"] == prompt
    assert lines[-1]["type"] == "turn_end" and lines[-1]["outcome"] == "completed"
    assert _tool_uses(lines) == [
        f"mcp__alphaagent__{name}"
        for name in (
            "run_in_env",
            "run_in_env",
            "read_document",
            "register_artifact",
            "register_artifact",
            "emit_citation",
        )
    ]
    assert sum(1 for line in lines if line["type"] == "UserMessage") == 6  # one per tool result
    assert lines[-2]["type"] == "ResultMessage" and lines[-2]["message"]["result"] == SUMMARY
    usage = json.loads(agent.read_file(USER, scope, f"work/turns/{result.turn_id}/usage.json"))
    assert usage["model_turns"] == 6 and usage["runs"] == 2 and usage["outcome"] == "completed"
    assert usage["input_tokens"] == 600 and usage["output_tokens"] == 120 and usage["cost_usd"] > 0
    assert f"${usage['cost_usd']:.4f}" in usage_line


# ----------------------------------------------------------------------------- (b) no built-in tool


def test_built_in_tools_are_refused_and_nothing_runs(
    agent: AlphaAgent, api: ScriptedMessagesAPI, tmp_path: Path
) -> None:
    from coder.tools import ALLOWED_TOOLS

    # Given a model that asks for Bash, Read and Write
    canary = tmp_path / "bash-ran"
    scope = ConversationScope(conversation_id="no-builtins")
    target = agent.workspace.local_root(scope) / "reports" / "pwned.md"
    api.load(
        [
            Reply(
                [
                    tool_use("Bash", {"command": f"touch {canary}"}),
                    tool_use("Read", {"file_path": "/etc/hostname"}),
                    tool_use("Write", {"file_path": str(target), "content": "pwned"}),
                ]
            ),
            Reply([text("I have no tool for that.")]),
        ]
    )

    # When the turn runs
    result = agent.run_analysis(_spec("no-builtins"))

    # Then each is refused as a tool that does not exist, and nothing ran or was written
    refusals = api.message_requests()[1].tool_results()
    assert [r["is_error"] for r in refusals] == [True, True, True]
    for refusal, name in zip(refusals, ("Bash", "Read", "Write"), strict=True):
        assert f"No such tool available: {name}" in refusal["text"]
    assert not canary.exists() and not target.exists()
    assert agent.history(USER, scope) == [] and result.run_ids == []
    assert_status(result, "completed")
    assert result.artifacts == []

    # and the model was only ever offered the five platform tools
    assert sorted(api.message_requests()[0].tool_names()) == sorted(ALLOWED_TOOLS)


# ----------------------------------------------------------------------------- (c) tool errors


def test_a_tool_error_returns_as_is_error_text_and_the_loop_continues(
    agent: AlphaAgent, api: ScriptedMessagesAPI
) -> None:
    # Given a model that registers a file before writing it, and calls a tool with a wrong argument
    api.load(
        [
            Reply([call("register_artifact", kind="dataset", path="datasets/later.csv", name="later")]),
            Reply([call("run_in_env", cod="print(1)")]),
            Reply([call("run_in_env", code="open('datasets/later.csv', 'w').write('a,b\\n1,2\\n')")]),
            Reply([call("register_artifact", kind="dataset", path="datasets/later.csv", name="later")]),
            Reply([text("Registered later.")]),
        ]
    )

    # When the turn runs
    result = agent.run_analysis(_spec("tool-errors", outputs=[{"kind": "dataset", "name": "later"}]))

    # Then both mistakes came back as is_error text the model can act on
    requests = api.message_requests()
    missing, bad_argument = requests[1].tool_results()[0], requests[2].tool_results()[0]
    assert missing["is_error"] and missing["text"].startswith(
        "ArtifactError: path 'datasets/later.csv': no regular file"
    )
    assert bad_argument["is_error"] and "'cod'" in bad_argument["text"]
    assert not requests[4].tool_results()[0]["is_error"]

    # and the turn went on to succeed
    assert_status(result, "completed")
    assert [(a.name, a.version) for a in result.artifacts] == [("later", 1)]
    assert len(result.run_ids) == 1


@pytest.fixture(scope="module")
def answered_once(agent: AlphaAgent, api: ScriptedMessagesAPI) -> tuple[TurnResult, float]:
    """A turn whose model only answers (and skips the spec's declared output), and its wall time
    in seconds: the bundled CLI's start and end, what the turn-timeout test scales its budget by.
    One turn serves both tests (a CLI start is ~1.7 CPU-s)."""
    api.load([Reply([text("Done, I think.")])])
    started = time.monotonic()
    result = agent.run_analysis(_spec("forgot-output", outputs=[{"kind": "report", "name": "findings"}]))
    return result, time.monotonic() - started


def test_a_turn_that_skips_a_declared_output_fails_naming_it(answered_once: tuple[TurnResult, float]) -> None:
    result, _seconds = answered_once

    assert_status(result, "failed")
    assert result.error is not None
    assert result.error.name == "MissingOutputsError"
    assert result.error.value.startswith("outputs: the coder finished without registering report findings")


# ----------------------------------------------------------------------------- (d) max turns


def test_exceeding_max_turns_fails_the_turn_with_the_reason(
    agent: AlphaAgent, api: ScriptedMessagesAPI
) -> None:
    # Given max_runs=1 (so 12 model turns) and a model that never stops calling tools
    limit = max_turns_for(parse_spec(json.dumps(_spec("x", max_runs=1))).constraints)
    assert limit == 12
    api.load([Reply([call("emit_citation", source=f"docs/nothing-{i}.md")]) for i in range(limit + 5)])

    # When the turn runs
    result = agent.run_analysis(_spec("endless", max_runs=1))

    # Then it failed with MaxTurnsError saying so, after exactly 12 model requests
    assert_status(result, "failed")
    assert result.error is not None
    assert result.error.name == "MaxTurnsError"
    assert result.error.value.startswith(
        "max turns: the coder used all 12 model turns (2 x constraints.max_runs + 10) without finishing [coder: 12 model turns"
    )
    assert len(api.message_requests()) == 12
    lines = _lines(agent, "endless", result)
    assert lines[-1]["type"] == "turn_end" and lines[-1]["outcome"] == "failed"
    assert lines[-1]["error"]["name"] == "MaxTurnsError"


# ----------------------------------------------------------------------------- turn timeout


def test_the_turn_timeout_cuts_the_run_and_fails_the_turn(
    agent: AlphaAgent, api: ScriptedMessagesAPI, answered_once: tuple[TurnResult, float]
) -> None:
    # Given what a turn that only answers costs here (the bundled CLI's start and end: a second on
    # a quiet machine, many on a loaded one), a turn budget the CLI and the first run fit in (at
    # least 10 s, three times that cost), and a model that runs code sleeping far longer (runs may
    # take 60 s each)
    _answered, turn_cost = answered_once
    budget = max(10, math.ceil(3 * turn_cost))
    spec = _spec("slow")
    spec["constraints"] = {"max_runs": 5, "run_timeout_s": 60, "turn_timeout_s": budget}
    api.load([Reply([call("run_in_env", code="import time; time.sleep(120)")])] * 3)

    # When the turn runs
    started = time.monotonic()
    result = agent.run_analysis(spec)
    elapsed = time.monotonic() - started

    # Then the run was cut to the turn's remaining time and the turn failed with the reason, on time
    assert_status(result, "failed")
    assert result.error is not None
    assert result.error.name == "CoderTimeoutError"
    assert result.error.value.startswith(
        f"turn timeout: the coder ran past constraints.turn_timeout_s ({budget} s)"
    )
    # (ending it is the cut run's kill and the CLI's exit, each about what the answering turn cost
    # at most: 5 s as on a quiet machine, where that turn costs about a second; more under load)
    slack = max(5.0, 2 * turn_cost)
    assert elapsed < budget + slack, f"the turn ended {elapsed:.1f} s after it started (budget {budget} s)"
    (only,) = agent.history(USER, ConversationScope(conversation_id="slow"))
    assert_status(only, "timeout")
    assert _tool_uses(_lines(agent, "slow", result))[0] == "mcp__alphaagent__run_in_env"

    # and the CLI is gone with its private config dir (it exits on its own once cut off: waited for,
    # as a loaded machine may take more than a moment to schedule its exit)
    deadline = time.monotonic() + 10
    while _cli_environ() is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _cli_environ() is None


# ----------------------------------------------------------------------------- (e) API errors


def test_api_errors_are_retried_then_surfaced_cleanly(agent: AlphaAgent, api: ScriptedMessagesAPI) -> None:
    # Given an API that answers 500, then 529, then recovers
    api.load([Status(500), Status(529, "Overloaded"), Reply([text("Recovered.")])])

    # When a turn runs, the CLI retries and the turn completes
    recovered = agent.run_analysis(_spec("api-flaky"))
    assert_status(recovered, "completed")
    assert recovered.summary.startswith("Recovered.\n\n[coder: 1 model turns")
    assert len(api.message_requests()) == 3
    retries = [line for line in _lines(agent, "api-flaky", recovered) if line["type"] == "SystemMessage"]
    assert [
        r["message"]["data"]["error_status"] for r in retries if r["message"]["subtype"] == "api_retry"
    ] == [500, 529]

    # Given an API that stays overloaded
    api.load([Status(529, "Overloaded")] * (MAX_RETRIES + 2))

    # When a turn runs, it fails after the retries with a clean message
    failed = agent.run_analysis(_spec("api-down"))
    assert_status(failed, "failed")
    assert failed.error is not None
    assert failed.error.name == "ModelApiError"
    assert failed.error.value.startswith(
        f"model API error: HTTP 529 overloaded_error after {MAX_RETRIES} retries: 529 Overloaded [coder: 0 model turns, 0 runs"
    )
    assert len(api.message_requests()) == MAX_RETRIES + 1


# ----------------------------------------------------------------------------- (f) no other traffic


class _Trap(socketserver.BaseRequestHandler):
    """A proxy that lets nothing through: it records the first line of every request (``CONNECT
    api.anthropic.com:443``) so a test can show the CLI tried to reach a host other than the model's."""

    seen: list[str]

    def handle(self) -> None:
        self.request.settimeout(2)
        try:
            first = self.request.recv(4096).split(b"\r\n", 1)[0]
        except OSError:
            return
        self.seen.append(first.decode("latin-1"))


@pytest.fixture
def trap(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Route every proxied request of the CLI (all but 127.0.0.1) to a recording dead end."""
    seen: list[str] = []
    handler = type("Trap", (_Trap,), {"seen": seen})
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    proxy = f"http://127.0.0.1:{server.server_address[1]}"
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy"):
        monkeypatch.setenv(name, proxy)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    try:
        yield seen
    finally:
        server.shutdown()
        server.server_close()


def _cli_environ() -> dict[str, str] | None:
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            if Path(child.cmdline()[0]).name == "claude":
                return dict(child.environ())
        except (psutil.Error, IndexError):
            continue
    return None


def test_the_coder_talks_to_the_model_endpoint_only(
    agent: AlphaAgent, api: ScriptedMessagesAPI, trap: list[str]
) -> None:
    # Given a proxy trap for anything not on 127.0.0.1, and a look at the CLI's environment mid-turn
    seen_env: list[dict[str, str]] = []

    def progress(message: str) -> None:
        if message.startswith("coder: run_in_env") and (environ := _cli_environ()) is not None:
            seen_env.append(environ)

    api.load([Reply([call("run_in_env", code="print('hello')")]), Reply([text("Said hello.")])])

    # When a turn runs
    result = agent.run_analysis(_spec("traffic"), progress=progress)
    time.sleep(0.5)  # anything the CLI sent on its way out has reached the trap by now

    # Then the scripted server saw only model requests, and nothing else left the machine
    assert_status(result, "completed")
    assert api.routes() == {"POST /v1/messages"}
    assert {r.headers.get("x-api-key") for r in api.requests} == {API_KEY}
    assert trap == []

    # and the CLI ran with the traffic switch, the endpoint and a private config dir, gone after the turn
    (environ,) = seen_env
    assert environ["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert environ["ANTHROPIC_BASE_URL"] == api.base_url
    config_dir = Path(environ["CLAUDE_CONFIG_DIR"])
    assert config_dir.name == "config" and config_dir.parent.name.startswith("alphaagent-coder-")
    assert not config_dir.exists()


def test_the_trap_catches_what_the_traffic_switch_stops(
    agent: AlphaAgent, api: ScriptedMessagesAPI, settings: CoderSettings, trap: list[str], tmp_path: Path
) -> None:
    """The control for the test above: without the switch the same CLI does try to reach Anthropic,
    and the trap sees it — so an empty trap there means the switch worked, not that the trap is blind."""
    import anyio

    from coder.agent import CLI_ENV, build_options

    api.load([Reply([text("ok")])])
    ctx = _context(agent, "control")
    options = build_options(ctx, settings, tmp_path)
    options.env = {k: v for k, v in options.env.items() if k not in CLI_ENV}

    async def drive() -> None:
        from claude_agent_sdk import query

        async for _message in query(prompt="hello", options=options):
            pass

    anyio.run(drive)
    deadline = time.monotonic() + 5
    while not trap and time.monotonic() < deadline:
        time.sleep(0.1)
    assert any(line.startswith("CONNECT ") and "anthropic.com:443" in line for line in trap), trap


# ----------------------------------------------------------------------------- options, tools, settings


def _context(agent: AlphaAgent, conversation: str) -> TurnContext:
    spec = parse_spec(json.dumps(_spec(conversation)))
    now = utcnow()
    session = Session(
        session_id="s" * 22, user_id=USER, scope_key=spec.scope.key, created_at=now, last_used_at=now
    )
    return TurnContext(backend=agent.backend, spec=spec, turn_id=new_ulid(), session=session)


def test_options_allow_exactly_the_five_tools_and_nothing_from_disk(
    agent: AlphaAgent, settings: CoderSettings, tmp_path: Path
) -> None:
    from coder.agent import build_options

    options = build_options(_context(agent, "options"), settings, tmp_path)

    assert options.tools == []
    assert options.allowed_tools == [
        "mcp__alphaagent__run_in_env",
        "mcp__alphaagent__read_document",
        "mcp__alphaagent__connector_fetch",
        "mcp__alphaagent__register_artifact",
        "mcp__alphaagent__emit_citation",
    ]
    assert isinstance(options.mcp_servers, dict) and list(options.mcp_servers) == ["alphaagent"]
    assert options.strict_mcp_config
    assert options.permission_mode == "dontAsk" and options.setting_sources == [] and options.skills == []
    assert options.max_turns == 2 * 20 + 10 and options.model == MODEL
    assert options.env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert options.env["CLAUDE_CONFIG_DIR"] == str(tmp_path / "config")
    assert options.env["CLAUDE_CODE_MAX_RETRIES"] == str(MAX_RETRIES)
    assert options.cwd == str(tmp_path / "cwd")


STRICT_REFUSALS = [
    (
        "run_in_env",
        {"code": "print(1)", "timeout_s": "3"},
        'timeout_s: must be a number of seconds > 0, got "3"',
    ),
    ("run_in_env", {"code": "print(1)", "fresh": 1}, "fresh: must be true or false, got 1"),
    (
        "run_in_env",
        {"code": "print(1)", "timeot_s": 3},
        "timeot_s: unknown argument (did you mean 'timeout_s'?)",
    ),
    ("read_document", {"path": "docs/a.txt", "offset": "2"}, 'offset: must be a whole number ≥ 0, got "2"'),
    (
        "read_document",
        {"path": "docs/a.txt", "limit": 2.0},
        "limit: must be a whole number from 1 to 30000, got 2.0",
    ),
    ("connector_fetch", {"connector": "file", "request": "x"}, 'request: must be an object, got "x"'),
    ("connector_fetch", {"connector": 7, "request": {}}, "connector: must be a string, got 7"),
    (
        "register_artifact",
        {"kind": "table", "path": "datasets/a.csv"},
        'kind: must be one of "dataset", "chart", "report", got "table"',
    ),
    ("register_artifact", {"kind": "dataset", "path": ["a"]}, 'path: must be a string, got ["a"]'),
    ("emit_citation", {"source": "docs/a.txt", "quote": 3}, "quote: must be a string, got 3"),
    (
        "emit_citation",
        {"source": "docs/a.txt", "page": 3},
        "page: unknown argument (arguments: source, locator, quote, claim)",
    ),
]


def test_tool_arguments_are_strict_and_refused_as_is_error_text_in_the_spec_words(agent: AlphaAgent) -> None:
    import anyio

    from coder.tools import alphaagent_tools

    # Given the five tools of one turn
    ctx = _context(agent, "strict-arguments")
    tools = {t.name: t for t in alphaagent_tools(ctx)}
    for name, arguments, line in STRICT_REFUSALS:
        # When the model calls one with a value of the wrong JSON type or an unknown argument
        answer = anyio.run(tools[name].handler, arguments)
        # Then it gets one is_error line naming the argument, its rule and the value as JSON
        assert answer == {
            "content": [{"type": "text", "text": f"InvalidArguments: {line}"}],
            "is_error": True,
        }
    # and nothing ran
    assert agent.backend.store.list_runs(USER, ctx.spec.scope.key) == []


def test_tool_schemas_are_plain_and_closed() -> None:
    from coder.tools import RunInEnvArgs, input_schema

    schema = input_schema(RunInEnvArgs)
    assert schema["required"] == ["code"] and schema["additionalProperties"] is False
    assert schema["properties"]["timeout_s"]["type"] == "number"
    assert "title" not in json.dumps(schema)


def test_a_long_run_result_is_clipped_for_the_model_with_a_pointer_to_the_whole_output() -> None:
    from coder.tools import MODEL_TEXT_CHARS, RESULT_HEADING, render_run

    stdout = "".join(f"line {i:06d}\n" for i in range(20_000))
    result = RunResult(
        run_id="01RUN",
        status="ok",
        exit_code=0,
        stdout=stdout,
        stderr="",
        stdout_bytes=len(stdout) * 3,
        stderr_bytes=0,
        stdout_truncated=True,
        stderr_truncated=False,
        error=None,
        duration_ms=5,
        files_changed=[],
        files=FileChangeReport(),
        limits={"timeout_s": 60},
        isolation="process",
        network="off",
        stdout_path="work/runs/01RUN/stdout.txt",
    )

    rendered = render_run(result)

    whole, details = rendered.split(f"\n\n{RESULT_HEADING}\n")
    assert len(whole) <= MODEL_TEXT_CHARS
    status, readable = whole.split("\n", 1)
    assert status.startswith("[run ok] exit 0 · 5 ms")
    assert readable.startswith("line 000000\n") and "line 019999" in readable
    assert "next: the whole stdout is in work/runs/01RUN/stdout.txt" in readable
    assert "characters omitted; the whole text is in work/runs/01RUN/stdout.txt" in readable
    parsed = json.loads(details)
    assert "stdout" not in parsed and parsed["stdout_bytes"] == len(stdout) * 3 and parsed["stdout_truncated"]


def test_settings_come_from_the_environment() -> None:
    assert CoderSettings.from_env({}) is None
    anthropic = CoderSettings.from_env({"ANTHROPIC_API_KEY": API_KEY, "ALPHAAGENT_MODEL": MODEL})
    assert anthropic is not None and anthropic.provider == "anthropic" and anthropic.model == MODEL
    assert API_KEY not in repr(anthropic)
    assert anthropic.cli_env() == {"CLAUDE_CODE_USE_BEDROCK": "", "ANTHROPIC_API_KEY": API_KEY}
    bedrock = CoderSettings.from_env({"CLAUDE_CODE_USE_BEDROCK": "1", "AWS_REGION": "eu-west-1"})
    assert bedrock is not None and bedrock.cli_env() == {
        "CLAUDE_CODE_USE_BEDROCK": "1",
        "AWS_REGION": "eu-west-1",
    }
    with pytest.raises(ModelConfigError, match=r"CLAUDE_CODE_USE_BEDROCK=1 needs AWS_REGION"):
        CoderSettings.from_env({"CLAUDE_CODE_USE_BEDROCK": "1"})
    with pytest.raises(ModelConfigError, match=r"^CLAUDE_CODE_MAX_RETRIES: "):
        CoderSettings.from_env({"ANTHROPIC_API_KEY": API_KEY, "CLAUDE_CODE_MAX_RETRIES": "many"})


def test_the_transcript_keeps_usage_when_the_turn_is_cut_short(agent: AlphaAgent) -> None:
    from coder.transcript import Transcript

    ctx = _context(agent, "no-result")
    transcript = Transcript(ctx.turn_id, MODEL)
    usage = transcript.usage(ctx)
    assert usage.outcome == "no result" and usage.cost_usd is None
    assert usage.line(transcript.path).endswith("0 out tokens, cost unknown; " + transcript.path + "]")


# ----------------------------------------------------------------------------- alphaagent run


def test_alphaagent_run_uses_the_coder_when_a_model_is_configured(
    api: ScriptedMessagesAPI, tmp_path: Path, warm_cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    # Given a spec without steps and a model configured in the environment
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(_spec("cli-turn")))
    env = {
        **os.environ,
        "ALPHAAGENT_HOME": str(tmp_path / "home"),
        "ANTHROPIC_API_KEY": API_KEY,
        "ANTHROPIC_BASE_URL": api.base_url,
        "ALPHAAGENT_MODEL": MODEL,
    }
    api.load([Reply([text("Nothing to compute.")])])

    # When `alphaagent run` runs it (forked from the warm command line: the platform's imports are
    # paid once per test process; the coder and the Agent SDK are imported by the command itself)
    done = warm_cli(["run", str(spec)], env=env, text=True, timeout=120)

    # Then the scripted model answered it, and without a model the CLI says what to set
    assert done.returncode == 0, done.stderr
    assert "completed" in done.stdout and "Nothing to compute." in done.stdout
    assert "[coder: 1 model turns" in done.stderr
    bare = {k: v for k, v in env.items() if k not in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")}
    refused = warm_cli(["run", str(spec)], env=bare, text=True, timeout=120)
    assert refused.returncode == 2 and "set ANTHROPIC_API_KEY" in refused.stderr


def test_a_client_with_a_model_configured_imports_the_agent_sdk_only_for_a_turn_that_needs_it(
    tmp_path: Path,
) -> None:
    # Given a model configured in the environment of a fresh process (the test process has the SDK)
    env = {**os.environ, "ANTHROPIC_API_KEY": API_KEY, "ALPHAAGENT_MODEL": MODEL}
    probe = (
        "import sys\n"
        "from pathlib import Path\n"
        "from alphaagent.client import connect\n"
        "from alphaagent.errors import NotFoundError\n"
        f"with connect(backend='local', user='u@example.com', home=Path({str(tmp_path)!r})) as client:\n"
        "    try:\n"
        "        client.turns({'conversation_id': 'c'})\n"
        "    except NotFoundError as exc:\n"
        "        print(exc, file=sys.stderr)\n"
        "print(sorted(m for m in ('claude_agent_sdk', 'mcp', 'coder.agent') if m in sys.modules))\n"
    )

    # When a client connects and reads (the coder is configured: the test above runs a turn with it)
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)

    # Then neither the Agent SDK nor the MCP SDK was imported (~2.5 CPU-s)
    assert done.returncode == 0, done.stderr
    assert "conversation c not found" in done.stderr
    assert done.stdout.strip() == "[]"


def test_a_tool_call_in_its_thread_is_waited_for_until_its_run_is_recorded(agent: AlphaAgent) -> None:
    import anyio

    from coder.tools import ToolCalls, alphaagent_tools

    # Given the tools of one turn and a run of five seconds started through them in a worker thread
    # (as the SDK does; a turn cut by its timeout stops the CLI, not the thread)
    calls = ToolCalls()
    ctx = _context(agent, "inflight")
    agent.backend.workspace.ensure_scope(ctx.spec.scope)
    (run_tool,) = [t for t in alphaagent_tools(ctx, calls=calls) if t.name == "run_in_env"]
    answers: list[Any] = []
    caller = threading.Thread(
        target=lambda: answers.append(anyio.run(run_tool.handler, {"code": "import time; time.sleep(5)"})),
        daemon=True,
    )
    caller.start()
    deadline = time.monotonic() + 60
    while calls.wait_idle(0) and not answers and time.monotonic() < deadline:
        time.sleep(0.01)

    # When the turn's end looks for calls in flight
    busy_at_first = not calls.wait_idle(0.1)
    idle_later = calls.wait_idle(60)

    # Then the call counted as running until it returned, and by then its run was recorded
    assert busy_at_first and idle_later, answers
    (only,) = agent.backend.store.list_runs(USER, ctx.spec.scope.key)
    assert_status(only, "ok")
    caller.join(10)
