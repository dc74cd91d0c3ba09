"""Ownership and sessions on the local backend (issue 3; DESIGN §4.1, §4.2, §4.7; cases ISO-01, SES-01).

Another user's conversation, workflow node, session, run or artifact must get exactly the answer a
nonexistent one gets: same bytes on stdout and stderr, same exit code, same exception type and message,
and no side effect (no record created, no timer refreshed, no file touched). The comparisons use two
homes and the *same* ids: home A, where alice owns them, and home B, where they were never created, so
the expected answers are byte-identical without any substitution.

Sessions expire after an idle timeout or a maximum lifetime, are replaced on the next turn without
touching the scope's files, and are never refreshed by a read.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from assertions import assert_status
from cli_runner import run_cli
from sandboxes import light_agent

from alphaagent.api import AUDIT_FILE, AlphaAgent
from alphaagent.cli import main
from alphaagent.domain.audit import JsonLinesAudit
from alphaagent.domain.backend import ConnectorSettings, TurnSettings
from alphaagent.domain.tools import TurnContext, run_in_env
from alphaagent.errors import AlphaAgentError, InvalidSpecError, NotFoundError
from alphaagent.models.common import ConversationScope, NodeScope, Scope
from alphaagent.wording import shown_typed

ALICE, BOB = "alice", "bob"
CONVERSATION = "c-x"
WORKFLOW, NODE = "w-x", "n-1"
CSV_BYTES = b"a,b\n1,2\n"

WRITE_TINY = "open('datasets/tiny.csv', 'w').write('a,b\\n1,2\\n')\nprint('wrote datasets/tiny.csv')\n"
READ_TINY = (
    "import os\n"
    "print(sorted(os.listdir('datasets')))\n"
    "print(open('datasets/tiny.csv').read(), end='')\n"
    "print(open('docs/tiny.csv').read(), end='')\n"
)

CONVERSATION_SCOPE = {"conversation_id": CONVERSATION}
NODE_SCOPE = {"workflow_execution_id": WORKFLOW, "node_id": NODE}


def tiny_spec(
    user_id: str,
    scope: dict[str, str],
    *,
    code: str = WRITE_TINY,
    register: bool = True,
    inputs: list[dict[str, Any]] | None = None,
    turn_id: str | None = None,
) -> dict[str, Any]:
    """A one-step spec (no connector, no model) that writes ``datasets/tiny.csv`` and registers it."""
    spec: dict[str, Any] = {
        "spec_version": 1,
        "user_id": user_id,
        "scope": scope,
        "goal": "write a tiny dataset",
        "inputs": inputs or [],
        "outputs": [{"kind": "dataset", "name": "tiny", "path": "datasets/tiny.csv"}] if register else [],
        "steps": [{"title": "tiny step", "code": code}],
        "constraints": {"max_runs": 2, "run_timeout_s": 30, "turn_timeout_s": 60},
    }
    if turn_id is not None:
        spec["turn_id"] = turn_id
    return spec


def open_agent(home: Path, turns: TurnSettings | None = None) -> AlphaAgent:
    """An agent whose settings never come from the caller's environment."""
    return light_agent(home, connectors=ConnectorSettings(), turns=turns or TurnSettings())


# ----------------------------------------------------------------------------- state of a home


def listing_of(home: Path) -> dict[str, tuple[int, int, int]]:
    """Every entry below ``home`` with its type, size and mtime (ns).

    Left out: the mtime of ``home`` itself and SQLite's ``-wal``/``-shm`` files, which every opening
    of a WAL database creates and removes (they hold no record once the last connection closes).
    """
    entries: dict[str, tuple[int, int, int]] = {}
    for folder, dirs, files in os.walk(home):
        for name in dirs + files:
            if name.endswith(("-wal", "-shm")):
                continue
            path = Path(folder, name)
            info = path.lstat()
            entries[path.relative_to(home).as_posix()] = (info.st_mode, info.st_size, info.st_mtime_ns)
    return entries


def dump_of(home: Path) -> list[str]:
    """The SQL dump of ``home``'s database, read from a copy so that dumping changes nothing."""
    with tempfile.TemporaryDirectory() as scratch:
        for suffix in ("", "-wal"):
            source = home / f"alphaagent.db{suffix}"
            if source.exists():
                shutil.copyfile(source, Path(scratch, source.name))
        db = sqlite3.connect(Path(scratch, "alphaagent.db"))
        try:
            return list(db.iterdump())
        finally:
            db.close()


State = tuple[dict[str, tuple[int, int, int]], list[str]]


def state_of(home: Path) -> State:
    """What a side effect would change: the listing of ``home`` and the dump of its records. The
    operator's audit trail of probes (``audit.jsonl``) is left out: it is meant to grow with each
    probe, out of the requester's sight, and is checked on its own."""
    files = {path: entry for path, entry in listing_of(home).items() if path != AUDIT_FILE}
    return files, dump_of(home)


# ----------------------------------------------------------------------------- the CLI


@dataclass(frozen=True)
class Answer:
    exit_code: int
    stdout: bytes
    stderr: bytes


def cli(home: Path, cwd: Path, *args: str) -> Answer:
    """``alphaagent ARGS`` as a process of its own (``cli_runner``) with ``ALPHAAGENT_HOME=home`` and
    no other alphaagent setting inherited."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALPHAAGENT_")}
    env["ALPHAAGENT_HOME"] = str(home)
    done = run_cli(args, cwd=cwd, env=env, stdin=subprocess.DEVNULL, timeout=60)
    return Answer(done.returncode, done.stdout, done.stderr)


# ----------------------------------------------------------------------------- the homes


@dataclass(frozen=True)
class Homes:
    """Home A (alice owns conversation c-x and workflow w-x node n-1), home B (neither exists) and
    home C (bob owns a conversation that is also named c-x)."""

    alice: Path
    empty: Path
    turn_id: str
    run_id: str
    session_id: str
    node_run_id: str
    node_session_id: str
    bob_session_id: str


@pytest.fixture(scope="module")
def homes(tmp_path_factory: pytest.TempPathFactory) -> Homes:
    root = tmp_path_factory.mktemp("ownership")
    conversation, node = ConversationScope(**CONVERSATION_SCOPE), NodeScope(**NODE_SCOPE)
    with open_agent(root / "a") as agent:
        for spec in (tiny_spec(ALICE, CONVERSATION_SCOPE), tiny_spec(ALICE, NODE_SCOPE)):
            result = agent.run_analysis(spec)
            assert_status(result, "completed", result)
        # The owner can read everything bob is about to ask for, so bob's "not found" is not vacuous.
        assert agent.read_file(ALICE, conversation, "datasets/tiny.csv") == CSV_BYTES
        assert agent.artifact(ALICE, conversation, "tiny", 1)[1] == CSV_BYTES
        assert agent.artifact(ALICE, node, "tiny")[1] == CSV_BYTES
        (turn,) = agent.turns(ALICE, conversation)
        (run,) = agent.history(ALICE, conversation)
        (node_run,) = agent.history(ALICE, node)
        (node_session,) = agent.sessions(ALICE, node)
    open_agent(root / "b").close()
    with open_agent(root / "c") as agent:
        assert_status(agent.run_analysis(tiny_spec(BOB, CONVERSATION_SCOPE)), "completed")
        (bob_session,) = agent.sessions(BOB, conversation)
    return Homes(
        alice=root / "a",
        empty=root / "b",
        turn_id=turn.turn_id,
        run_id=run.run_id,
        session_id=turn.session_id,
        node_run_id=node_run.run_id,
        node_session_id=node_session.session_id,
        bob_session_id=bob_session.session_id,
    )


@pytest.fixture
def unchanged_homes(homes: Homes) -> Iterator[Homes]:
    """Asserts, after the test, that neither home A nor home B changed at all (ISO-01: no side effect)."""
    before = state_of(homes.alice), state_of(homes.empty)
    yield homes
    after = state_of(homes.alice), state_of(homes.empty)
    assert after[0][0] == before[0][0], "files of home A changed"
    assert after[0][1] == before[0][1], "records of home A changed"
    assert after[1] == before[1], "home B changed"


# ----------------------------------------------------------------------------- ISO-01 through the CLI

SCOPE_FLAGS = {
    "conversation": ["--conversation", CONVERSATION],
    "node": ["--workflow", WORKFLOW, "--node", NODE],
}
NOT_FOUND = {
    "conversation": b"alphaagent: error: conversation c-x not found\n",
    "node": b"alphaagent: error: workflow w-x node n-1 not found\n",
}
READ_COMMANDS = {
    "files": ["files"],
    "cat-path": ["cat", "datasets/tiny.csv"],
    "cat-artifact": ["cat", "--artifact", "tiny"],
    "cat-artifact-v1": ["cat", "--artifact", "tiny", "--version", "1"],
    "history": ["history"],
    "artifacts": ["artifacts"],
    "sessions": ["sessions"],
    "export": ["export", "-o", "out.zip"],
}
# Every read command, with and without --json, on a conversation; on a workflow node (the same code
# path after the scope is parsed) the text form only, to keep the matrix of processes lean.
CLI_CASES = {
    f"{scope}-{name}-{form}": (scope, [*command, "--user", BOB, *SCOPE_FLAGS[scope], *flags])
    for scope, forms in (("conversation", {"text": [], "json": ["--json"]}), ("node", {"text": []}))
    for name, command in READ_COMMANDS.items()
    for form, flags in forms.items()
    if not (command[0] == "cat" and form == "json")  # cat prints bytes; it refuses --json up front
}


HOME_OF = {"a": "alice", "b": "empty"}
"""The ``Homes`` field of each home a case runs in."""


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_cli_answers_bob_about_alices_scope_exactly_as_about_a_missing_one(
    homes: Homes, tmp_path: Path, case: str
) -> None:
    # Given home A, where alice owns the scope, and home B, where it was never created
    args = CLI_CASES[case][1]
    trail = JsonLinesAudit(homes.alice / AUDIT_FILE)
    recorded = len(trail.read())
    before = state_of(homes.alice), state_of(homes.empty)
    workdirs = {label: tmp_path / label for label in ("a", "b")}
    for workdir in workdirs.values():
        workdir.mkdir()

    # When bob runs the same read command against the same scope id in both (one case per test,
    # each a Python start-up per home: a batch of all of them in one fixture outlasted the test
    # timeout on a loaded machine)
    with ThreadPoolExecutor(2) as pool:
        in_a, in_b = pool.map(lambda label: cli(getattr(homes, HOME_OF[label]), workdirs[label], *args), "ab")

    # Then both answers are byte for byte the same not-found, naming only what bob asked for
    assert in_a == in_b
    # (with --json, the same one line is also {"cli_error": ...} on standard output, for scripts)
    message = NOT_FOUND[CLI_CASES[case][0]]
    stdout = b""
    if "--json" in args:
        text = message.decode().removeprefix("alphaagent: error: ").rstrip("\n")
        stdout = (json.dumps({"cli_error": {"message": text, "exit_code": 1}}) + "\n").encode()
    assert in_a == Answer(1, stdout, message)

    # And no record, file, directory or timestamp changed in either home, but for the operator's
    # audit trail in home A: one line for the probe of alice's scope, naming bob and never alice
    (a_files, a_records), home_b = state_of(homes.alice), state_of(homes.empty)
    (a_files_before, a_records_before), home_b_before = before
    assert a_files == a_files_before
    assert [r.requesting_user_id for r in trail.read()[recorded:]] == [BOB]
    assert a_records == a_records_before
    assert home_b == home_b_before
    # and nothing was written where the commands ran (no zip from export)
    assert [p.name for p in workdirs.values() if any(p.iterdir())] == []


def test_cli_gives_alice_her_own_files(unchanged_homes: Homes, tmp_path: Path) -> None:
    # Given home A
    homes = unchanged_homes

    # When alice asks for her artifact through the CLI
    answer = cli(
        homes.alice, tmp_path, "cat", "--user", ALICE, "--conversation", CONVERSATION, "--artifact", "tiny"
    )

    # Then she gets its bytes: the not-found answers above are about ownership, not a broken setup
    assert answer == Answer(0, CSV_BYTES, b"")


def test_cli_refuses_bobs_turn_in_alices_conversation_and_changes_nothing(
    unchanged_homes: Homes, tmp_path: Path
) -> None:
    # Given a spec of bob's aimed at alice's conversation
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(tiny_spec(BOB, CONVERSATION_SCOPE, code="print(sorted(__import__('os').listdir()))"))
    )

    # When bob runs it
    answer = cli(
        unchanged_homes.alice, tmp_path, "run", "--user", BOB, "--conversation", CONVERSATION, str(spec)
    )

    # Then it fails with the not-found a read gets: no progress line, nothing of alice's contents
    assert answer == Answer(1, b"", NOT_FOUND["conversation"])
    # and no turn, session or file was created for bob, nor alice's files touched (fixture)


# ----------------------------------------------------------------------------- ISO-01 through the Python API

ApiCall = Callable[[AlphaAgent, Homes, Scope, Path], object]
API_CALLS: dict[str, ApiCall] = {
    "files": lambda agent, ids, scope, out: agent.files(BOB, scope),
    "files-prefix": lambda agent, ids, scope, out: agent.files(BOB, scope, "datasets"),
    "files-bad-prefix": lambda agent, ids, scope, out: agent.files(BOB, scope, "../../.."),
    "read_file": lambda agent, ids, scope, out: agent.read_file(BOB, scope, "datasets/tiny.csv"),
    "read_file-missing": lambda agent, ids, scope, out: agent.read_file(BOB, scope, "datasets/none.csv"),
    "read_file-bad-path": lambda agent, ids, scope, out: agent.read_file(BOB, scope, "/etc/passwd"),
    "history": lambda agent, ids, scope, out: agent.history(BOB, scope),
    "turns": lambda agent, ids, scope, out: agent.turns(BOB, scope),
    "run_record": lambda agent, ids, scope, out: agent.run_record(
        BOB, ids.run_id if isinstance(scope, ConversationScope) else ids.node_run_id
    ),
    "artifacts": lambda agent, ids, scope, out: agent.artifacts(BOB, scope),
    "artifact": lambda agent, ids, scope, out: agent.artifact(BOB, scope, "tiny"),
    "artifact-v1": lambda agent, ids, scope, out: agent.artifact(BOB, scope, "tiny", 1),
    "artifact-v9": lambda agent, ids, scope, out: agent.artifact(BOB, scope, "tiny", 9),
    "sessions": lambda agent, ids, scope, out: agent.sessions(BOB, scope),
    "session": lambda agent, ids, scope, out: agent.session(
        BOB, ids.session_id if isinstance(scope, ConversationScope) else ids.node_session_id
    ),
    "export": lambda agent, ids, scope, out: agent.export(BOB, scope, out),
}
API_SCOPES: dict[str, Scope] = {
    "conversation": ConversationScope(**CONVERSATION_SCOPE),
    "node": NodeScope(**NODE_SCOPE),
    # a node alice's workflow does not have: the workflow's owner decides, not the node's existence
    "other-node": NodeScope(workflow_execution_id=WORKFLOW, node_id="n-2"),
}


def outcome(call: Callable[[], object]) -> tuple[type[BaseException], str] | object:
    try:
        return call()
    except AlphaAgentError as exc:
        return type(exc), str(exc)


@pytest.mark.parametrize("scope_name", list(API_SCOPES))
@pytest.mark.parametrize("method", list(API_CALLS))
def test_api_answers_bob_about_alices_records_exactly_as_about_missing_ones(
    unchanged_homes: Homes, tmp_path: Path, method: str, scope_name: str
) -> None:
    # Given home A, where alice owns the scope, session and run, and home B, where none exists
    call, scope = API_CALLS[method], API_SCOPES[scope_name]

    # When bob makes the same read call with the same ids in both
    with open_agent(unchanged_homes.alice) as agent:
        in_a = outcome(lambda: call(agent, unchanged_homes, scope, tmp_path / "a.zip"))
    with open_agent(unchanged_homes.empty) as agent:
        in_b = outcome(lambda: call(agent, unchanged_homes, scope, tmp_path / "b.zip"))

    # Then both raise the same NotFoundError with the same message
    assert in_a == in_b
    assert isinstance(in_a, tuple)
    assert in_a[0] is NotFoundError
    # and nothing was written (no zip; the homes are checked by the fixture)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("scope", "message"),
    [
        (CONVERSATION_SCOPE, "conversation c-x not found"),
        ({"workflow_execution_id": WORKFLOW, "node_id": "n-2"}, "workflow w-x node n-2 not found"),
    ],
    ids=["conversation", "new-node-of-alices-workflow"],
)
def test_api_refuses_bobs_turn_in_alices_scope_and_changes_nothing(
    unchanged_homes: Homes, scope: dict[str, str], message: str
) -> None:
    # Given a spec of bob's aimed at alice's conversation, or at a new node of alice's workflow
    spec = tiny_spec(BOB, scope)

    # When bob runs it
    with open_agent(unchanged_homes.alice) as agent, pytest.raises(NotFoundError) as caught:
        agent.run_analysis(spec)

    # Then he gets exactly the not-found a read of a missing scope gets, and no record or file (fixture)
    assert str(caught.value) == message
    with open_agent(unchanged_homes.empty) as agent:
        missing = outcome(
            lambda: agent.files(BOB, ConversationScope(**scope) if len(scope) == 1 else NodeScope(**scope))
        )
    assert missing == (NotFoundError, message)


def test_reads_never_refresh_alices_session(unchanged_homes: Homes, tmp_path: Path) -> None:
    # Given alice's session and its last use
    homes = unchanged_homes
    scope = ConversationScope(**CONVERSATION_SCOPE)
    with open_agent(homes.alice) as agent:
        before = agent.session(ALICE, homes.session_id)

    # When bob asks for it and alice herself lists and reads her sessions (API and CLI)
    with open_agent(homes.alice) as agent:
        with pytest.raises(NotFoundError):
            agent.session(BOB, homes.session_id)
        with pytest.raises(NotFoundError):
            agent.sessions(BOB, scope)
        listed = agent.sessions(ALICE, scope)
        agent.session(ALICE, homes.session_id)
    answer = cli(homes.alice, tmp_path, "sessions", "--json", "--user", ALICE, "--conversation", CONVERSATION)

    # Then no read moved its idle timer (nor changed anything else: fixture)
    assert answer.exit_code == 0, answer.stderr
    (printed,) = json.loads(answer.stdout)
    assert printed["session_id"] == homes.session_id
    assert datetime.fromisoformat(printed["last_used_at"]) == before.last_used_at
    assert [s.last_used_at for s in listed] == [before.last_used_at]
    with open_agent(homes.alice) as agent:
        assert agent.session(ALICE, homes.session_id) == before


def test_a_reused_turn_id_is_refused_before_anything_is_written(homes: Homes, tmp_path: Path) -> None:
    # Turn ids are global idempotency keys (like a Step Functions execution name; ULIDs, so not
    # guessable). A spec reusing another user's id is refused with a clear message and no side
    # effect; nothing of alice's turn is revealed. (Decision recorded in the README.)
    # Given a copy of home A, where alice's turn T exists
    home_a = tmp_path / "a"
    shutil.copytree(homes.alice, home_a)
    before = state_of(home_a)
    spec = tiny_spec(BOB, {"conversation_id": "c-bob"}, turn_id=homes.turn_id)

    # When bob submits a spec for his own conversation that carries turn id T
    with open_agent(home_a) as agent, pytest.raises(InvalidSpecError) as refused:
        agent.run_analysis(spec)

    # Then it is refused naming the field, and nothing was written: no owner, session or folder
    assert str(refused.value) == "turn_id: already used; leave it out to get a fresh one"
    assert state_of(home_a) == before
    # and alice's turn T is still hers, unchanged
    with open_agent(home_a) as agent:
        (turn,) = agent.turns(ALICE, ConversationScope(**CONVERSATION_SCOPE))
        assert (turn.turn_id, turn.status) == (homes.turn_id, "completed")


# ----------------------------------------------------------------------------- SES-01 and §4.7


def wait_until(moment: datetime) -> None:
    delay = (moment - datetime.now(UTC)).total_seconds()
    if delay > 0:
        time.sleep(delay)


def test_a_session_stays_alive_while_its_turn_runs_code_longer_than_the_idle_timeout(tmp_path: Path) -> None:
    # Given a 2 s idle timeout and a coder that runs code for 1.5 s, thinks for 1 s, and runs again
    # (SES-01: measured from the start of the first run, the session would be idle past 2 s)
    def coder(ctx: TurnContext) -> str:
        run_in_env(ctx, "import time; time.sleep(1.5)")
        time.sleep(1.0)
        run_in_env(ctx, "print('second')")
        return "two runs"

    home, scope = tmp_path / "home", ConversationScope(**CONVERSATION_SCOPE)
    settings = TurnSettings(session_idle_timeout_s=2)
    with light_agent(home, connectors=ConnectorSettings(), turns=settings, coder=coder) as agent:
        warm = agent.run_analysis(tiny_spec(ALICE, {"conversation_id": "c-warm"}, register=False))
        assert_status(warm, "completed", warm)
        spec = tiny_spec(ALICE, CONVERSATION_SCOPE, register=False)
        del spec["steps"]
        # When the turn runs
        result = agent.run_analysis(spec)
        # Then the session counted as in use until each run ended: it was touched after the last run,
        # so it is the same, live session at the end of the turn
        assert_status(result, "completed", result)
        (session,) = agent.sessions(ALICE, scope)
        (turn,) = agent.turns(ALICE, scope)
        assert session.session_id == turn.session_id
        assert session.last_used_at >= session.created_at + timedelta(seconds=2.4)
        assert session.ended_at is None


def test_an_idle_session_is_replaced_and_the_scopes_files_survive(tmp_path: Path) -> None:
    # Given alice's first turn, with a 1 s idle timeout, wrote and registered datasets/tiny.csv
    home, scope = tmp_path / "home", ConversationScope(**CONVERSATION_SCOPE)
    with open_agent(home, TurnSettings(session_idle_timeout_s=1)) as agent:
        first = agent.run_analysis(tiny_spec(ALICE, CONVERSATION_SCOPE))
        assert_status(first, "completed", first)
        (session,) = agent.sessions(ALICE, scope)

        # When she runs a second turn after the session has been idle for longer than that
        wait_until(session.last_used_at + timedelta(seconds=1.1))
        second = agent.run_analysis(
            tiny_spec(
                ALICE,
                CONVERSATION_SCOPE,
                code=READ_TINY,
                register=False,
                inputs=[{"kind": "dataset", "name": "tiny"}],
            )
        )
        sessions = agent.sessions(ALICE, scope)
        turns = agent.turns(ALICE, scope)
        history = agent.history(ALICE, scope)
        artifact, artifact_bytes = agent.artifact(ALICE, scope, "tiny", 1)
        events = [(e.detail_type, getattr(e.detail, "session_id", None)) for e in agent.store.list_events()]

    # Then the second turn ran in a new session and the first session was ended
    assert_status(second, "completed", second)
    assert [s.session_id for s in sessions] == [turns[0].session_id, turns[1].session_id]
    old, new = sessions
    assert old.session_id != new.session_id
    assert old.ended_at is not None
    assert [s.is_active(turns[1].finished_at) for s in sessions] == [False, True]
    assert ("SessionExpired", old.session_id) in events
    assert ("SessionCreated", new.session_id) in events
    # and the first turn's dataset was intact and readable in the second turn, by path and as an input
    (second_run,) = [r for r in history if r.turn_id == second.turn_id]
    assert second_run.stdout == "['tiny.csv']\na,b\n1,2\na,b\n1,2\n"
    assert (artifact.turn_id, artifact_bytes) == (first.turn_id, CSV_BYTES)
    # and history shows the runs of both sessions, each under its own session id
    assert [(r.turn_id, r.session_id) for r in history] == [
        (first.turn_id, old.session_id),
        (second.turn_id, new.session_id),
    ]

    # When the CLI lists the sessions
    answer = cli(home, tmp_path, "sessions", "--json", "--user", ALICE, "--conversation", CONVERSATION)

    # Then both are there, the first ended and the second not
    assert answer.exit_code == 0, answer.stderr
    printed = json.loads(answer.stdout)
    assert [(s["session_id"], s["ended_at"] is None) for s in printed] == [
        (old.session_id, False),
        (new.session_id, True),
    ]


def test_a_session_in_continuous_use_still_ends_at_its_maximum_lifetime(tmp_path: Path) -> None:
    # Given a 2 s maximum lifetime, a long idle timeout, and a warm sandbox
    home, scope = tmp_path / "home", ConversationScope(**CONVERSATION_SCOPE)
    max_lifetime = timedelta(seconds=2)
    settings = TurnSettings(session_idle_timeout_s=600, session_max_lifetime_s=2)
    with open_agent(home, settings) as agent:
        assert_status(agent.run_analysis(tiny_spec(ALICE, {"conversation_id": "c-warm"})), "completed")

        # When alice runs turn after turn without pause until a turn gets a new session
        turns = []
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            result = agent.run_analysis(tiny_spec(ALICE, CONVERSATION_SCOPE, register=False))
            assert_status(result, "completed", result)
            turns = agent.turns(ALICE, scope)
            if len({t.session_id for t in turns}) > 1:
                break
            time.sleep(0.1)
        sessions = agent.sessions(ALICE, scope)

    # Then the session was replaced exactly when its lifetime ran out, though it was never idle
    assert len(sessions) == 2, "the session was never replaced"
    first, replacement = sessions
    assert len(turns) >= 3, "the first session should have served several turns"
    assert all(t.session_id == first.session_id for t in turns[:-1])
    assert turns[-1].session_id == replacement.session_id
    assert turns[-2].started_at < first.created_at + max_lifetime <= turns[-1].started_at
    assert first.last_used_at > first.created_at  # it was used, and refreshed, along the way
    assert first.ended_at is not None and replacement.ended_at is None


def test_session_ids_are_random_url_safe_and_at_least_128_bits(homes: Homes) -> None:
    # Given sessions of two users for the same conversation name (c-x) in two homes, and a node session
    ids = [homes.session_id, homes.bob_session_id, homes.node_session_id]

    # Then every id is URL-safe and carries at least 128 bits
    for session_id in ids:
        assert re.fullmatch(r"[A-Za-z0-9_-]+", session_id), session_id
        raw = base64.urlsafe_b64decode(session_id + "=" * (-len(session_id) % 4))
        assert len(raw) * 8 >= 128, session_id
    # and the ids are unrelated to each other and to the user data they were made for
    assert len(set(ids)) == len(ids)
    assert len({session_id[:4] for session_id in ids}) == len(ids)  # 24 equal bits: 1 in 16 million
    for session_id in ids:
        assert ALICE not in session_id and BOB not in session_id


# ----------------------------------------------------------------------------- user ids (§4.1)

SCOPED_COMMANDS = [
    pytest.param(["run", "spec.json"], id="run"),
    pytest.param(["files"], id="files"),
    pytest.param(["cat", "datasets/tiny.csv"], id="cat"),
    pytest.param(["history"], id="history"),
    pytest.param(["artifacts"], id="artifacts"),
    pytest.param(["sessions"], id="sessions"),
    pytest.param(["export", "-o", "out.zip"], id="export"),
]


@pytest.mark.parametrize("command", SCOPED_COMMANDS)
def test_a_bad_user_is_one_line_naming_user_and_exit_2(tmp_path: Path, command: list[str]) -> None:
    # Given no home yet, and a valid spec in the working directory
    home = tmp_path / "home"
    (tmp_path / "spec.json").write_text(json.dumps(tiny_spec(ALICE, CONVERSATION_SCOPE)))

    # When a command is given a user id with a space and a '!'
    answer = cli(home, tmp_path, *command, "--user", "bad user!", "--conversation", CONVERSATION)

    # Then it is refused with one line naming --user, exit 2, and nothing is written
    assert answer.exit_code == 2
    assert answer.stdout == b""
    assert answer.stderr.startswith(b"alphaagent: error: --user: ")
    assert answer.stderr.count(b"\n") == 1 and answer.stderr.endswith(b"\n")
    assert not home.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.json"]


@pytest.mark.parametrize(
    "user", ["", "x" * 129, "a/b", "é", "a b"], ids=["empty", "129-chars", "slash", "non-ascii", "space"]
)
def test_other_bad_users_are_refused_the_same_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], user: str
) -> None:
    # Given no home yet (the entry point itself, in-process: the subprocess form is tested above)
    home = tmp_path / "home"
    monkeypatch.setenv("ALPHAAGENT_HOME", str(home))

    # When files is asked for by a user id outside 1-128 chars of [A-Za-z0-9._@:-]
    code = main(["files", "--user", user, "--conversation", CONVERSATION])

    # Then the answer is the same one line naming --user, exit 2, and no home is created
    out, err = capfd.readouterr()
    assert (code, out, err) == (
        2,
        "",
        f"alphaagent: error: --user: must be 1-128 characters of letters, digits and . _ @ : -, got {shown_typed(user)}\n",
    )
    assert not home.exists()


def test_a_sandbox_the_caller_configures_still_hides_the_data_directory_from_runs(tmp_path: Path) -> None:
    # Given an agent whose sandbox the caller configured (no preload), and Bob's data in its home;
    # the home is outside /tmp, which a run at the namespaces level sees as a tmpfs of its own anyway
    from alphaagent.sandbox.supervisor import Sandbox

    home = Path(tempfile.mkdtemp(prefix="alphaagent-test-home-", dir="/var/tmp"))
    try:
        with light_agent(home, connectors=ConnectorSettings()) as agent:
            assert_status(agent.run_analysis(tiny_spec(BOB, CONVERSATION_SCOPE)), "completed")
            config = agent.sandbox_config
        assert config.preload == ()
        assert {str(home.resolve()), str(Path.home())} <= set(config.hidden_paths)
        assert any(path.name == "tiny.csv" for path in home.rglob("*"))
        # When a run of that configuration walks the home, Then it finds nothing there
        scope = tmp_path / "scope"
        scope.mkdir()
        with Sandbox(config) as box:
            if box.isolation != "namespaces":
                pytest.skip(
                    f"paths are hidden at the namespaces level only: {box.info.get('isolation_detail')}"
                )
            code = (
                f"import os\nprint(os.path.isdir({str(home)!r}), [f for _, _, f in os.walk({str(home)!r})])"
            )
            result = box.run(code, cwd=scope)
        assert (result.status, result.stdout) == ("ok", "True [[]]\n"), result.error
    finally:
        shutil.rmtree(home)
