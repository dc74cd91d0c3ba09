"""The Claude Agent SDK as the *orchestrator*, with ``alphaagent mcp`` as its only MCP server
(issue 15 acceptance).

The real SDK and its bundled Claude Code CLI run against the scripted Messages API on 127.0.0.1
(``scripted_api.py``, as the coder tests do); the CLI starts the real ``alphaagent mcp`` over stdio
as an MCP server of its configuration. The scripted orchestrator calls ``run_analysis`` with a spec
of pinned steps, so the turn itself needs no model; then it reads an artifact back.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from assertions import assert_status
from installed import skip_unless_installed
from sandboxes import register_light
from scripted_api import Reply, ScriptedMessagesAPI, text, tool_use

skip_unless_installed("claude_agent_sdk", "mcp")

pytestmark = pytest.mark.mcp_sdk  # imports the MCP SDK in this process (tests/conftest.py)

if TYPE_CHECKING:
    from claude_agent_sdk import ClaudeAgentOptions

USER = "orchestrator@example.com"
API_KEY = "sk-ant-test-not-a-key"
SERVER = "alphaagent"
TOOLS = [
    f"mcp__{SERVER}__{name}" for name in ("run_analysis", "list_artifacts", "read_artifact", "list_turns")
]
STEP = (
    "import pandas as pd\n"
    "df = pd.DataFrame({'region': ['north', 'south'], 'growth': [0.12, 0.31]})\n"
    "df.to_csv('datasets/growth.csv', index=False)\n"
    "open('reports/growth.md', 'w').write('# Growth\\n\\nsouth grew fastest (31%).\\n')\n"
)


def orchestrator_options(api: ScriptedMessagesAPI, home: Path, private: Path) -> ClaudeAgentOptions:
    from claude_agent_sdk import ClaudeAgentOptions

    from coder.agent import CLI_ENV

    (private / "config").mkdir(parents=True)
    (private / "cwd").mkdir()
    server_env = {
        "ALPHAAGENT_HOME": str(home),
        # The turn runs pinned steps: the server gets no model of its own.
        "ANTHROPIC_API_KEY": "",
        "ANTHROPIC_BASE_URL": "",
    }
    return ClaudeAgentOptions(
        tools=[],
        allowed_tools=TOOLS,
        mcp_servers={
            SERVER: {
                "type": "stdio",
                "command": sys.executable,
                "args": ["-m", "alphaagent.cli", "mcp", "--user", USER],
                "env": server_env,
            }
        },
        strict_mcp_config=True,
        permission_mode="dontAsk",
        setting_sources=[],
        system_prompt="You orchestrate analyses with the alphaagent tools.",
        max_turns=6,
        model="claude-sonnet-4-5",
        cwd=str(private / "cwd"),
        env={
            "ANTHROPIC_API_KEY": API_KEY,
            "ANTHROPIC_BASE_URL": api.base_url,
            "CLAUDE_CODE_USE_BEDROCK": "",
            **CLI_ENV,
            "CLAUDE_CONFIG_DIR": str(private / "config"),
            "XDG_CACHE_HOME": str(private / "config" / "cache"),
            # The server starts a Python process and its sandbox: give it time on a loaded machine.
            "MCP_TIMEOUT": "120000",
            "MCP_TOOL_TIMEOUT": "300000",
        },
    )


def test_the_agent_sdk_orchestrates_a_turn_through_alphaagent_mcp(tmp_path: Path) -> None:
    import anyio
    from claude_agent_sdk import ResultMessage

    home = tmp_path / "home"
    spec: dict[str, Any] = {
        "spec_version": 1,
        "scope": {"conversation_id": "growth"},
        # The orchestration is the subject, not the builtin preload: the light environment's zygote
        # costs ~0.2 CPU-s to start, builtin's ~2 (the step imports pandas itself).
        "environment_id": register_light(home),
        "goal": "Which region grew fastest?",
        "outputs": [
            {"kind": "dataset", "name": "growth"},
            {"kind": "report", "name": "growth-report", "path": "reports/growth.md"},
        ],
        "steps": [{"title": "compute growth", "code": STEP}],
    }
    script = [
        Reply([text("I'll run the analysis."), tool_use(TOOLS[0], {"spec": spec})]),
        Reply(
            [
                tool_use(
                    TOOLS[2], {"scope": {"conversation_id": "growth"}, "name": "growth-report", "limit": 200}
                )
            ]
        ),
        Reply([text("The south region grew fastest (31%).")]),
    ]
    messages: list[Any] = []

    with ScriptedMessagesAPI(script) as api:
        options = orchestrator_options(api, home, tmp_path / "private")

        async def drive() -> None:
            import anyio
            from claude_agent_sdk import query

            with anyio.fail_after(300):
                async for message in query(prompt="Which region grew fastest?", options=options):
                    messages.append(message)

        # When the orchestrator's loop runs
        anyio.run(drive)
        loop = api.message_requests()

    # Then the model was offered the server's four tools and nothing else
    assert sorted(loop[0].tool_names()) == sorted(TOOLS)

    # And run_analysis came back to the model with the completed turn and its artifacts (Claude
    # Code hands the model the structured content, as JSON, when a tool returns one)
    [ran] = loop[1].tool_results()
    assert not ran["is_error"], ran["text"]
    shown, _end = json.JSONDecoder().raw_decode(ran["text"])
    assert_status(shown, "completed", shown)
    assert {(a["kind"], a["name"], a["version"], a["path"]) for a in shown["artifacts"]} == {
        ("dataset", "growth", 1, "datasets/growth.csv"),
        ("report", "growth-report", 1, "reports/growth.md"),
    }
    assert Path(shown["scope_root"]) == (home / "conversations" / "growth").resolve()

    # And the artifacts exist in the user's conversation, and read_artifact returned the report
    scope_root = home / "conversations" / "growth"
    assert (scope_root / "datasets/growth.csv").read_text().splitlines()[0] == "region,growth"
    [read] = loop[2].tool_results()
    assert not read["is_error"], read["text"]
    assert "south grew fastest (31%)" in read["text"]
    [result] = [m for m in messages if isinstance(m, ResultMessage)]
    assert not result.is_error and result.result == "The south region grew fastest (31%)."
