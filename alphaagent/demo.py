"""``alphaagent demo`` (what ``make demo`` shows): the main job on the embedded default.

Two turns in one conversation on the local backend, with real public data shipped in
``examples/penguins/`` (Palmer penguins, CC0):

1. ``turn1.json``: the ``file`` connector brings ``penguins.csv`` into ``docs/``; pinned steps write
   an aggregate (dataset), a histogram (PNG chart) and a Markdown report citing the source; all
   three are registered as artifacts.
2. The session is let expire (a 1-second idle timeout here, 15 minutes by default), then
   ``turn2.json`` builds on the registered dataset ``species_summary`` v1 in a new session: files
   and artifacts outlive sessions.

Finally it lists where everything is: files, artifacts, sessions and the run history. It runs in
the data directory every other command uses (``--home``, else ``$ALPHAAGENT_HOME``, else
``${XDG_DATA_HOME:-~/.local/share}/alphaagent``) as the command's user (``--user``, else
``$ALPHAAGENT_USER``, else ``local``), so the commands it prints read its results from anywhere.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from alphaagent.api import (
    AlphaAgent,
    alphaagent_home,
    connector_settings_from_env,
    turn_settings_from_env,
)
from alphaagent.connectors.file import EXAMPLES_DIR
from alphaagent.errors import InvalidRequestError
from alphaagent.models.common import ConversationScope
from alphaagent.models.records import TurnResult
from alphaagent.program import DEFAULT_PROGRAM
from alphaagent.sandbox.waiting import waits_told_to

DEMO_IDLE_TIMEOUT_S = 1


def _load(name: str, conversation_id: str, user_id: str) -> dict[str, Any]:
    path = EXAMPLES_DIR / "penguins" / name
    if not path.is_file():
        raise InvalidRequestError(f"examples: {path} is missing (run the demo from a checkout)")
    spec: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    spec["scope"] = {"conversation_id": conversation_id}
    spec["user_id"] = user_id
    for item in spec.get("inputs", []):
        if item.get("connector") == "file":
            # relative to the spec file, as `alphaagent run` resolves it
            item["request"]["path"] = str(path.parent / item["request"]["path"])
    return spec


def run_demo(
    *,
    json_output: bool = False,
    home: Path | None = None,
    user_id: str = "local",
    program: str = DEFAULT_PROGRAM,
    name_home: bool = True,
) -> int:
    """Run the two demo turns in a new conversation of ``user_id`` in ``home`` (default: the data
    directory, ``alphaagent_home()``); return the CLI exit code. ``program`` is how the CLI was
    started (``alphaagent.program``) and ``name_home`` whether the data directory must be named
    (it is not the per-user default), for the follow-up command it prints."""
    conversation_id = "penguins-" + datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    scope = ConversationScope(conversation_id=conversation_id)
    home = home or alphaagent_home()
    turns = replace(turn_settings_from_env(), session_idle_timeout_s=DEMO_IDLE_TIMEOUT_S)
    connectors = connector_settings_from_env().replace(file_roots=(EXAMPLES_DIR,))

    def say(message: str) -> None:
        print(f"  {message}", file=sys.stderr, flush=True)

    with AlphaAgent(home, connectors=connectors, turns=turns) as agent, waits_told_to(say):
        print(f"turn 1 in conversation {conversation_id}", file=sys.stderr)
        first = agent.run_analysis(_load("turn1.json", conversation_id, user_id), progress=say)
        if first.status != "completed":
            # Turn 2 builds on turn 1's dataset: run anyway, it would fail too, and its error
            # (no species_summary) would hide the cause. Stop with turn 1's own error.
            return _stopped(first, json_output=json_output)
        time.sleep(DEMO_IDLE_TIMEOUT_S + 0.5)
        print("turn 2, after the first session expired, building on species_summary v1", file=sys.stderr)
        second = agent.run_analysis(_load("turn2.json", conversation_id, user_id), progress=say)
        files = agent.files(user_id, scope)
        artifacts = agent.artifacts(user_id, scope)
        sessions = agent.sessions(user_id, scope)
        history = agent.history(user_id, scope)
    root = home / scope.key
    if json_output:
        print(
            json.dumps(
                {
                    "scope": str(root),
                    "turns": [first.model_dump(mode="json"), second.model_dump(mode="json")],
                    "files": [f.path for f in files],
                    "sessions": [s.session_id for s in sessions],
                    "runs": len(history),
                },
                indent=2,
            )
        )
    else:
        for turn in (first, second):
            print(
                f"\nturn {turn.turn_id}: {turn.status} — {turn.summary or (turn.error and turn.error.value)}"
            )
            for artifact in turn.artifacts:
                print(f"  {artifact.kind:8} {artifact.name} v{artifact.version}  {root / artifact.path}")
            for citation in turn.citations:
                print(f"  cites    {citation.source}")
        print(f"\n{(root / 'reports/summary.md').read_text(encoding='utf-8')}")
        print((root / "reports/followup.md").read_text(encoding="utf-8"))
        print(f"where everything is ({root}):")
        for info in files:
            print(f"  {info.size_bytes:>9} B  {info.path}")
        print(f"artifacts: {', '.join(f'{a.name} v{a.version}' for a in artifacts)}")
        print(f"sessions:  {len(sessions)}: the first expired before turn 2; its files carried over")
        command = follow_up_command(program, user_id, conversation_id, home if name_home else None)
        print(f"runs:      {len(history)} ({command})")
        print(f"data:      {home} (every alphaagent command reads it; --home or $ALPHAAGENT_HOME moves it)")
    return 0 if first.status == second.status == "completed" else 1


def _stopped(first: TurnResult, *, json_output: bool) -> int:
    """Report a failed first turn (the demo stops there) and return the exit code 1: its status,
    the step and error that failed it, as ``alphaagent run`` prints a failed turn."""
    if json_output:
        print(json.dumps({"turns": [first.model_dump(mode="json")]}, indent=2))
    where = f" in {first.failed_step}" if first.failed_step else ""
    error = f"{first.error.name}: {first.error.value}" if first.error else "no error recorded"
    print(
        f"turn 1 {first.status}{where}: {error}; the demo stops here (the second turn builds on this one)",
        file=sys.stderr,
    )
    if first.error and first.error.traceback:
        print(first.error.traceback.rstrip(), file=sys.stderr)
    return 1


def follow_up_command(program: str, user_id: str, conversation_id: str, home: Path | None) -> str:
    """The command that lists the demo's runs, pasteable as is in any directory and any shell:
    ``program`` as the CLI was started (already shell-quoted, ``alphaagent.program``), the user,
    and ``--home`` (absolute) when ``home`` is given, i.e. the data directory is not the default."""
    words = [program, "history", "--user", shlex.quote(user_id), "--conversation", conversation_id]
    if home is not None:
        words += ["--home", shlex.quote(str(home.absolute()))]
    return " ".join(words)
