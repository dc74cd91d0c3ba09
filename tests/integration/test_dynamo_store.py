"""Behaviour of the DynamoDB record store under moto, side by side with the SQLite store.

The behavioural tests run against both stores (``store`` is parametrised), so the two backends are
held to the same assertions: ownership inside every read (ISO-01), guarded turn transitions and
idempotent writes (IDEM-01), session expiry on read, artifact versioning under concurrency, lease
locks. The DynamoDB-only tests cover what SQLite has no counterpart for: the table's shape and the
400 KB item guard (PER-01).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from assertions import assert_status
from moto_account import MotoAccount

from alphaagent.aws.store import RECORD_BUDGET_BYTES, TTL_ATTRIBUTE, DynamoStore
from alphaagent.errors import StoreError
from alphaagent.ids import new_ulid
from alphaagent.local.store import SqliteStore
from alphaagent.models.common import ConversationScope
from alphaagent.models.events import Event, RunCompleted, TurnStarted
from alphaagent.models.records import ArtifactVersion, Citation, RunRecord, Session, Turn, TurnResult
from alphaagent.ports import Store

T0 = datetime(2025, 3, 1, 9, 0, 0, tzinfo=UTC)
CONV = "conversations/c1"
ALICE = "alice@example.com"
BOB = "bob@example.com"
TABLE = "alphaagent-state-test"


@pytest.fixture
def aws_region() -> str:
    return "eu-west-1"


@pytest.fixture
def aws(moto: MotoAccount) -> Any:
    """A DynamoDB client of the moto account, with the state table."""
    return moto.state_table(TABLE)


class AtomicCalls:
    """A client whose calls run one at a time. DynamoDB executes each request atomically, but moto's
    in-memory tables are not thread-safe (a query racing a put fails inside moto); the store's own
    races are between its requests, and those interleave freely here."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return attribute(*args, **kwargs)

        return call


@pytest.fixture
def dynamo(aws: Any) -> DynamoStore:
    return DynamoStore(TABLE, client=AtomicCalls(aws))


@pytest.fixture(params=["sqlite", "dynamodb"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        with SqliteStore(tmp_path / "state.db") as opened:
            yield opened
    else:
        yield request.getfixturevalue("dynamo")


def snapshot_of(store: Store) -> Callable[[], Any]:
    """Everything the store holds, for asserting that reads wrote nothing."""
    if isinstance(store, SqliteStore):
        return lambda: list(_sqlite_dump(store.path))
    assert isinstance(store, DynamoStore)

    def scan() -> Any:
        client = store._client
        items = client.scan(TableName=store.table_name, ConsistentRead=True)["Items"]
        return sorted(json.dumps(item, sort_keys=True) for item in items)

    return scan


def _sqlite_dump(path: Path) -> Iterator[str]:
    import sqlite3

    with sqlite3.connect(path) as raw:
        yield from raw.iterdump()


def minutes(n: float) -> timedelta:
    return timedelta(minutes=n)


def make_session(session_id: str = "s" * 32, *, user_id: str = ALICE, created_at: datetime = T0) -> Session:
    return Session(
        session_id=session_id, user_id=user_id, scope_key=CONV, created_at=created_at, last_used_at=created_at
    )


def make_turn(turn_id: str, *, user_id: str = ALICE, started_at: datetime = T0) -> Turn:
    return Turn(
        turn_id=turn_id,
        user_id=user_id,
        scope_key=CONV,
        session_id="s" * 32,
        status="running",
        goal="revenue by region",
        started_at=started_at,
    )


def finished(turn: Turn, status: str, summary: str) -> Turn:
    return turn.model_copy(
        update={
            "status": status,
            "finished_at": T0 + minutes(2),
            "result": TurnResult.model_validate(
                {"turn_id": turn.turn_id, "status": status, "summary": summary}
            ),
        }
    )


def make_run(
    run_id: str, *, status: str = "ok", created_at: datetime = T0, user_id: str = ALICE, stdout: str = "1\n"
) -> RunRecord:
    return RunRecord(
        run_id=run_id,
        turn_id="T1",
        session_id="s" * 32,
        user_id=user_id,
        scope_key=CONV,
        status=status,
        exit_code=0,
        code="print(1)",
        stdout=stdout,
        stderr="",
        stdout_bytes=len(stdout.encode()),
        stderr_bytes=0,
        stdout_truncated=False,
        stderr_truncated=False,
        error=None,
        reason=None,
        duration_ms=12,
        files_changed=[],
        created_at=created_at,
    )


def make_artifact(
    name: str = "revenue",
    *,
    scope_key: str = CONV,
    turn_id: str = "T1",
    metadata: dict[str, Any] | None = None,
) -> ArtifactVersion:
    return ArtifactVersion(
        artifact_id=new_ulid(),
        scope_key=scope_key,
        kind="dataset",
        name=name,
        version=0,
        path=f"datasets/{name}.csv",
        sha256="ab" * 32,
        size_bytes=10,
        metadata={"rows": 3} if metadata is None else metadata,
        turn_id=turn_id,
        user_id=ALICE,
        created_at=T0,
    )


def make_citation(citation_id: str, turn_id: str) -> Citation:
    return Citation(
        citation_id=citation_id,
        turn_id=turn_id,
        scope_key=CONV,
        user_id=ALICE,
        source="docs/report.pdf",
        locator="p. 3",
        created_at=T0,
    )


def make_event(event_id: str, turn_id: str = "T1", *, at: datetime = T0) -> Event:
    detail = TurnStarted(
        turn_id=turn_id, scope=ConversationScope(conversation_id="c1"), user_id=ALICE, session_id="s"
    )
    return Event.of(detail, event_id).model_copy(update={"time": at})


# the table


def test_the_table_has_the_documented_keys_and_ttl_attribute(aws: Any) -> None:
    # Given the table made by create_table / When it is described
    table = aws.describe_table(TableName=TABLE)["Table"]
    ttl = aws.describe_time_to_live(TableName=TABLE)["TimeToLiveDescription"]

    # Then it has string keys pk/sk, on-demand billing, and TTL on expires_at_epoch
    assert {(k["AttributeName"], k["KeyType"]) for k in table["KeySchema"]} == {
        ("pk", "HASH"),
        ("sk", "RANGE"),
    }
    assert {(a["AttributeName"], a["AttributeType"]) for a in table["AttributeDefinitions"]} == {
        ("pk", "S"),
        ("sk", "S"),
    }
    assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    assert (ttl["TimeToLiveStatus"], ttl["AttributeName"]) == ("ENABLED", TTL_ATTRIBUTE)


def test_no_client_is_created_before_first_use(monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3

    # Given a store built without a client, and boto3 that would fail if asked for one
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a client was created")

    monkeypatch.setattr(boto3, "client", refuse)

    # When / Then constructing it touches nothing
    assert DynamoStore("whatever").table_name == "whatever"


# ownership


def test_first_claim_wins_and_a_second_claim_returns_the_first_owner(store: Store) -> None:
    # Given nobody owns the conversation
    assert store.owner_of(CONV) is None

    # When Alice claims it, then Bob does
    first = store.claim_owner(CONV, ALICE, T0)
    second = store.claim_owner(CONV, BOB, T0 + minutes(1))

    # Then Alice owns it, and Bob is told so
    assert (first, second) == (ALICE, ALICE)
    assert store.owner_of(CONV) == ALICE


def test_another_users_records_are_answered_exactly_like_missing_ones(store: Store) -> None:
    # Given Alice owns a conversation with a session, a turn, a run and an artifact
    store.claim_owner(CONV, ALICE, T0)
    store.create_session(make_session())
    store.create_turn(make_turn("T1"))
    store.put_run(make_run("R1"))
    store.add_artifact_version(make_artifact())
    snapshot = snapshot_of(store)
    before = snapshot()

    # When Bob asks for each of them, and for ids that do not exist
    reads: list[tuple[Any, Any]] = [
        (store.get_session(BOB, "s" * 32), store.get_session(BOB, "x" * 32)),
        (store.active_session(BOB, CONV, T0), store.active_session(BOB, "conversations/none", T0)),
        (store.list_sessions(BOB, CONV), store.list_sessions(BOB, "conversations/none")),
        (store.get_turn(BOB, "T1"), store.get_turn(BOB, "T404")),
        (store.list_turns(BOB, CONV), store.list_turns(BOB, "conversations/none")),
        (store.get_run(BOB, "R1"), store.get_run(BOB, "R404")),
        (store.list_runs(BOB, CONV), store.list_runs(BOB, "conversations/none")),
        (store.get_artifact(BOB, CONV, "revenue", None), store.get_artifact(BOB, CONV, "nothing", None)),
        (
            store.get_artifact(BOB, CONV, "revenue", 1),
            store.get_artifact(BOB, "conversations/none", "revenue", 1),
        ),
        (store.list_artifacts(BOB, CONV), store.list_artifacts(BOB, "conversations/none")),
        (store.list_artifacts(BOB, "not a scope"), []),
        (store.list_scopes(BOB), store.list_scopes("nobody")),
        (store.get_artifact(BOB, "not a scope", "revenue", None), None),
    ]

    # Then each answer is identical to the nonexistent one (None or []), Alice still sees her
    # records, and the reads changed nothing in the store
    for as_other_user, as_missing in reads:
        assert as_other_user == as_missing
        assert as_other_user in (None, [])
    assert store.get_session(ALICE, "s" * 32) is not None
    assert store.get_turn(ALICE, "T1") is not None
    assert store.get_run(ALICE, "R1") is not None
    assert store.get_artifact(ALICE, CONV, "revenue", None) is not None
    assert snapshot() == before


# sessions


def test_a_session_is_active_until_its_idle_timeout(store: Store) -> None:
    # Given a session created at T0 with the default 15 minute idle timeout
    store.create_session(make_session())

    # When it is looked up just before and at the idle expiry
    before = store.active_session(ALICE, CONV, T0 + minutes(14.99))
    at_expiry = store.active_session(ALICE, CONV, T0 + minutes(15))

    # Then it is active before and expired at the timeout, though no TTL has deleted it
    assert before is not None and before.session_id == "s" * 32
    assert at_expiry is None
    assert store.get_session(ALICE, "s" * 32) is not None


def test_touching_extends_the_idle_timer_but_not_the_maximum_lifetime(store: Store) -> None:
    # Given a session used every 10 minutes for almost 8 hours
    store.create_session(make_session())
    for step in range(1, 48):
        store.touch_session("s" * 32, T0 + minutes(10 * step))
    last_touch = T0 + minutes(470)

    # When it is looked up shortly after the last touch, and again at 8 hours
    still = store.active_session(ALICE, CONV, last_touch + minutes(5))
    at_lifetime = store.active_session(ALICE, CONV, T0 + timedelta(hours=8))

    # Then it is active, then expired by its maximum lifetime although it was used 10 minutes ago
    assert still is not None and still.last_used_at == last_touch
    assert at_lifetime is None


def test_reads_never_refresh_the_idle_timer_and_a_late_touch_never_moves_it_back(store: Store) -> None:
    # Given a session last used at T0, read repeatedly as active
    store.create_session(make_session())
    for offset in (1, 5, 10, 14):
        assert store.active_session(ALICE, CONV, T0 + minutes(offset)) is not None
    unchanged = store.get_session(ALICE, "s" * 32)

    # When it is touched at 10 min, then by a late, out-of-order touch carrying 3 min
    store.touch_session("s" * 32, T0 + minutes(10))
    store.touch_session("s" * 32, T0 + minutes(3))

    # Then the reads left last_used_at at T0, and the later touch stands
    assert unchanged is not None and unchanged.last_used_at == T0
    stored = store.get_session(ALICE, "s" * 32)
    assert stored is not None and stored.last_used_at == T0 + minutes(10)


def test_an_expired_session_is_not_revived_by_a_touch(store: Store) -> None:
    # Given a session idle for 20 minutes / When it is touched / Then it stays expired
    store.create_session(make_session())
    store.touch_session("s" * 32, T0 + minutes(20))
    assert store.active_session(ALICE, CONV, T0 + minutes(21)) is None


def test_the_most_recent_live_session_is_returned_and_an_ended_one_never(store: Store) -> None:
    # Given an older and a newer session of Alice in the scope, and a session of Bob
    store.create_session(make_session("a" * 32))
    store.create_session(make_session("b" * 32, created_at=T0 + minutes(1)))
    store.create_session(make_session("c" * 32, user_id=BOB, created_at=T0 + minutes(2)))

    # When the newer one is ended (twice: the first end stands)
    newest = store.active_session(ALICE, CONV, T0 + minutes(3))
    store.end_session("b" * 32, T0 + minutes(3))
    store.end_session("b" * 32, T0 + minutes(4))
    after_end = store.active_session(ALICE, CONV, T0 + minutes(4))

    # Then the newest live session of Alice is returned each time, and both remain listed
    assert newest is not None and newest.session_id == "b" * 32
    assert after_end is not None and after_end.session_id == "a" * 32
    assert [s.session_id for s in store.list_sessions(ALICE, CONV)] == ["a" * 32, "b" * 32]
    ended = store.get_session(ALICE, "b" * 32)
    assert ended is not None and ended.ended_at == T0 + minutes(3)


def test_a_reused_session_id_is_refused(store: Store) -> None:
    # Given Alice's session / When Bob's session is created with the same id / Then it is refused
    store.create_session(make_session())
    with pytest.raises(StoreError, match="exists already"):
        store.create_session(make_session(user_id=BOB))
    assert store.get_session(BOB, "s" * 32) is None


def test_timestamps_come_back_timezone_aware_in_utc(store: Store) -> None:
    # Given a session created with a naive time / When it is read back / Then it is aware UTC
    store.create_session(make_session(created_at=datetime(2025, 3, 1, 9, 0, 0)))
    stored = store.get_session(ALICE, "s" * 32)
    assert stored is not None and stored.created_at == T0 and stored.created_at.utcoffset() == timedelta(0)


# turns


def test_a_duplicate_turn_is_refused_and_a_terminal_status_never_regresses(store: Store) -> None:
    # Given a running turn
    assert store.create_turn(make_turn("T1")) is True

    # When the same spec is delivered again (also as Bob), the turn completes, then a late failure
    duplicate = store.create_turn(make_turn("T1").model_copy(update={"goal": "something else"}))
    duplicate_as_bob = store.create_turn(make_turn("T1", user_id=BOB))
    completed = store.finish_turn(finished(make_turn("T1"), "completed", "done"))
    late_failure = store.finish_turn(finished(make_turn("T1"), "failed", "late"))

    # Then only the first creation and the first finish took effect
    assert (duplicate, duplicate_as_bob, completed, late_failure) == (False, False, True, False)
    turn = store.get_turn(ALICE, "T1")
    assert turn is not None
    assert (turn.status, turn.goal) == ("completed", "revenue by region")
    assert turn.result is not None and turn.result.summary == "done"
    assert turn.finished_at == T0 + minutes(2)
    assert [t.turn_id for t in store.list_turns(ALICE, CONV)] == ["T1"]
    assert store.turn_id_taken("T1") is True and store.turn_id_taken("T2") is False
    assert store.get_turn(BOB, "T1") is None


def test_a_turn_keeps_its_environment_through_its_finish(store: Store) -> None:
    # Given a turn recorded with the environment it runs in, and one recorded without
    store.create_turn(make_turn("T1").model_copy(update={"environment_id": "stats"}))
    store.create_turn(make_turn("T2"))
    # When the first finishes
    store.finish_turn(finished(make_turn("T1"), "completed", "done"))
    # Then both backends give it back, and the other reads as not recorded
    turns = {t.turn_id: t.environment_id for t in store.list_turns(ALICE, CONV)}
    assert turns == {"T1": "stats", "T2": None}


def test_a_run_record_keeps_the_session_state_report(store: Store) -> None:
    from alphaagent.models.run import StateReport

    state = StateReport(saved=["n"], saved_count=1, skipped={"lock": "a lock or event (TypeError: no)"})
    store.put_run(make_run("R1").model_copy(update={"state": state}))
    run = store.get_run(ALICE, "R1")
    assert run is not None and run.state == state


def test_a_spec_delivered_concurrently_creates_exactly_one_turn(store: Store) -> None:
    # Given the same turn delivered 8 times at once, by 8 threads
    outcomes: list[bool] = []

    def deliver() -> None:
        outcomes.append(store.create_turn(make_turn("T1")))

    threads = [threading.Thread(target=deliver) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    # Then exactly one delivery created it, and there is one turn
    assert sorted(outcomes) == [False] * 7 + [True]
    assert [t.turn_id for t in store.list_turns(ALICE, CONV)] == ["T1"]


def test_concurrent_finishes_let_exactly_one_terminal_status_win(store: Store) -> None:
    # Given a running turn, and 8 threads finishing it at once, half completed, half failed
    store.create_turn(make_turn("T1"))
    outcomes: list[bool] = []
    statuses = ["completed", "failed"] * 4

    def finish(status: str) -> None:
        outcomes.append(store.finish_turn(finished(make_turn("T1"), status, status)))

    threads = [threading.Thread(target=finish, args=(status,)) for status in statuses]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    # Then exactly one succeeded, and the stored status is its summary's
    assert sorted(outcomes) == [False] * 7 + [True]
    turn = store.get_turn(ALICE, "T1")
    assert turn is not None and turn.result is not None and turn.status == turn.result.summary


def test_finishing_an_unknown_or_another_users_turn_does_nothing(store: Store) -> None:
    # Given Alice's running turn T1 and no turn T9
    store.create_turn(make_turn("T1"))

    # When T9 is finished, T1 is finished as Bob, and finished with a running status
    assert store.finish_turn(finished(make_turn("T9"), "failed", "x")) is False
    assert store.finish_turn(finished(make_turn("T1", user_id=BOB), "failed", "x")) is False
    with pytest.raises(ValueError, match="terminal status"):
        store.finish_turn(make_turn("T1"))

    # Then nothing is stored and T1 still runs
    assert store.get_turn(ALICE, "T9") is None
    turn = store.get_turn(ALICE, "T1")
    assert turn is not None
    assert_status(turn, "running")


def test_turns_are_listed_oldest_first(store: Store) -> None:
    # Given turns started out of id order / When listed / Then by start time
    store.create_turn(make_turn("TB", started_at=T0 + minutes(1)))
    store.create_turn(make_turn("TA", started_at=T0 + minutes(2)))
    store.create_turn(make_turn("TC", started_at=T0))
    assert [t.turn_id for t in store.list_turns(ALICE, CONV)] == ["TC", "TB", "TA"]


def test_scopes_are_listed_newest_turn_first_with_counts_and_the_newest_status(store: Store) -> None:
    # Given Alice's conversation c1 with two turns (the newer one failed), a newer conversation c2
    # with one running turn, and a node of her workflow run with one turn
    node = "workflows/w1/nodes/n1"
    for owner_key in (CONV, "conversations/c2", "workflows/w1"):
        store.claim_owner(owner_key, ALICE, T0)
    store.create_turn(make_turn("T1"))
    second = make_turn("T2", started_at=T0 + minutes(5))
    store.create_turn(second)
    store.finish_turn(finished(second, "failed", "boom"))
    c2 = make_turn("T3", started_at=T0 + minutes(9)).model_copy(update={"scope_key": "conversations/c2"})
    store.create_turn(c2)
    store.create_turn(make_turn("T4", started_at=T0 + minutes(7)).model_copy(update={"scope_key": node}))

    # When her scopes are listed
    scopes = store.list_scopes(ALICE)

    # Then newest turn first, each with her turn count and the newest turn's status, goal and start
    assert [(s.scope_key, s.turn_count, s.last_status) for s in scopes] == [
        ("conversations/c2", 1, "running"),
        (node, 1, "running"),
        (CONV, 2, "failed"),
    ]
    assert scopes[2].last_started_at == T0 + minutes(5)
    assert scopes[2].last_goal == "revenue by region"


def test_a_scope_is_listed_only_for_its_owner_even_where_another_user_has_a_turn(store: Store) -> None:
    # Given Alice's conversation, where Bob's refused turn was recorded as his own failed turn, and
    # a conversation where nobody has claimed ownership
    store.claim_owner(CONV, ALICE, T0)
    store.create_turn(make_turn("T1"))
    store.create_turn(make_turn("TB", user_id=BOB, started_at=T0 + minutes(1)))
    unclaimed = make_turn("TU", started_at=T0 + minutes(2)).model_copy(
        update={"scope_key": "conversations/unclaimed"}
    )
    store.create_turn(unclaimed)
    before = snapshot_of(store)()

    # When each lists their scopes
    # Then Alice sees her conversation with her one turn; Bob sees nothing (not even its existence),
    # exactly like a user with no turns at all; and listing wrote nothing
    assert [(s.scope_key, s.turn_count) for s in store.list_scopes(ALICE)] == [(CONV, 1)]
    assert store.list_scopes(BOB) == store.list_scopes("nobody") == []
    assert snapshot_of(store)() == before


# runs


def test_put_run_is_idempotent_on_run_id(store: Store) -> None:
    # Given a run recorded once, and an older run
    store.put_run(make_run("R2", created_at=T0 + minutes(1)))
    store.put_run(make_run("R1"))

    # When the same run is recorded again with a different status (a redelivered destination record)
    store.put_run(make_run("R2", status="error", created_at=T0 + minutes(1)))

    # Then there is one record per run id, the latest copy, oldest run first
    runs = store.list_runs(ALICE, CONV)
    assert [(r.run_id, r.status) for r in runs] == [("R1", "ok"), ("R2", "error")]
    assert store.get_run(ALICE, "R2") == make_run("R2", status="error", created_at=T0 + minutes(1))


def test_a_failure_written_only_over_failed_never_replaces_a_result(store: Store) -> None:
    # Given a run with a result, one with a failure, and none for a third id
    assert store.put_run(make_run("R1")) is True
    store.put_run(make_run("R2", status="failed"))

    # When failures are written with only_over_failed
    kept = store.put_run(make_run("R1", status="failed", stdout=""), only_over_failed=True)
    replaced = store.put_run(make_run("R2", status="failed", stdout="again"), only_over_failed=True)
    new = store.put_run(make_run("R3", status="failed"), only_over_failed=True)

    # Then the result stays, the earlier failure and the missing record are written
    assert (kept, replaced, new) == (False, True, True)
    assert store.get_run(ALICE, "R1") == make_run("R1")
    assert store.get_run(ALICE, "R2") == make_run("R2", status="failed", stdout="again")
    assert store.get_run(ALICE, "R3") == make_run("R3", status="failed")


# artifacts


def test_versions_count_up_per_scope_and_name_with_a_stable_artifact_id(store: Store) -> None:
    # Given Alice owns two conversations
    store.claim_owner(CONV, ALICE, T0)
    store.claim_owner("conversations/c2", ALICE, T0)

    # When "revenue" is registered three times, "costs" once, and "revenue" once in another scope
    revenue = [store.add_artifact_version(make_artifact(turn_id=f"T{i}")) for i in (1, 2, 3)]
    costs = store.add_artifact_version(make_artifact("costs", turn_id="T1"))
    elsewhere = store.add_artifact_version(make_artifact(scope_key="conversations/c2", turn_id="T4"))

    # Then versions are 1, 2, 3 with one artifact id, and the other name and scope start at 1
    assert [a.version for a in revenue] == [1, 2, 3]
    assert len({a.artifact_id for a in revenue}) == 1
    assert (costs.version, elsewhere.version) == (1, 1)
    assert len({revenue[0].artifact_id, costs.artifact_id, elsewhere.artifact_id}) == 3
    # And the latest resolves, a named version resolves, a missing one does not
    assert store.get_artifact(ALICE, CONV, "revenue", None) == revenue[2]
    assert store.get_artifact(ALICE, CONV, "revenue", 2) == revenue[1]
    assert store.get_artifact(ALICE, CONV, "revenue", 4) is None
    assert [(a.name, a.version) for a in store.list_artifacts(ALICE, CONV)] == [
        ("costs", 1),
        ("revenue", 1),
        ("revenue", 2),
        ("revenue", 3),
    ]
    assert [(a.name, a.version) for a in store.artifacts_of_turn("T1")] == [("revenue", 1), ("costs", 1)]


def test_artifacts_of_a_workflow_node_are_readable_by_the_workflow_owner_only(store: Store) -> None:
    # Given Alice owns workflow execution E and registered an artifact in its node n1
    node = "workflows/E/nodes/n1"
    store.claim_owner("workflows/E", ALICE, T0)
    stored = store.add_artifact_version(make_artifact(scope_key=node))

    # When each user reads it / Then only Alice sees it
    assert store.get_artifact(ALICE, node, "revenue", None) == stored
    assert store.get_artifact(BOB, node, "revenue", None) is None
    assert store.list_artifacts(BOB, node) == []


def test_concurrent_registrations_from_threads_get_distinct_gap_free_versions(store: Store) -> None:
    # Given one store shared by 8 threads
    store.claim_owner(CONV, ALICE, T0)
    errors: list[BaseException] = []

    def register() -> None:
        try:
            for _ in range(5):
                store.add_artifact_version(make_artifact())
        except BaseException as error:
            errors.append(error)

    # When each registers the same artifact 5 times at once
    threads = [threading.Thread(target=register) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    # Then the versions are exactly 1..40, under one artifact id
    assert errors == []
    versions = store.list_artifacts(ALICE, CONV)
    assert [a.version for a in versions] == list(range(1, 41))
    assert len({a.artifact_id for a in versions}) == 1
    assert len(store.artifacts_of_turn("T1")) == 40


# citations


def test_citations_are_listed_per_turn_once_each(store: Store) -> None:
    # Given two citations of T1, one delivered twice, and one of T2
    for citation_id, turn_id in (("C1", "T1"), ("C2", "T1"), ("C1", "T1"), ("C3", "T2")):
        store.add_citation(make_citation(citation_id, turn_id))

    # When T1's citations are listed / Then each appears once, in emission order
    assert store.citations_of_turn("T1") == [make_citation("C1", "T1"), make_citation("C2", "T1")]


# locks


def test_a_lease_is_exclusive_until_it_expires_and_only_its_holder_renews_or_releases_it(
    store: Store,
) -> None:
    # Given turn A holds the scope's lease for 60 s
    assert store.acquire_lock(CONV, "turn-A", T0, 60) is True

    # When turn B contends while it is live / Then it is refused, and B cannot renew or release it
    assert store.acquire_lock(CONV, "turn-B", T0 + timedelta(seconds=30), 60) is False
    assert store.renew_lock(CONV, "turn-B", T0 + timedelta(seconds=30), 60) is False
    store.release_lock(CONV, "turn-B")
    assert store.acquire_lock(CONV, "turn-B", T0 + timedelta(seconds=31), 60) is False

    # When A renews at 50 s / Then its lease runs to 110 s
    assert store.renew_lock(CONV, "turn-A", T0 + timedelta(seconds=50), 60) is True
    assert store.acquire_lock(CONV, "turn-B", T0 + timedelta(seconds=100), 60) is False

    # When the lease expires / Then B takes it over, and A has lost it
    assert store.acquire_lock(CONV, "turn-B", T0 + timedelta(seconds=110), 60) is True
    assert store.renew_lock(CONV, "turn-A", T0 + timedelta(seconds=111), 60) is False
    store.release_lock(CONV, "turn-A")
    assert store.acquire_lock(CONV, "turn-C", T0 + timedelta(seconds=112), 60) is False

    # When B releases it / Then it is free at once
    store.release_lock(CONV, "turn-B")
    assert store.acquire_lock(CONV, "turn-C", T0 + timedelta(seconds=113), 60) is True


def test_concurrent_contenders_get_the_lease_exactly_once(store: Store) -> None:
    # Given 8 turns contending for one scope's lease at the same moment
    winners: list[str] = []

    def contend(holder: str) -> None:
        if store.acquire_lock(CONV, holder, T0, 60):
            winners.append(holder)

    threads = [threading.Thread(target=contend, args=(f"turn-{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    # Then exactly one holds it, and only it can renew it
    assert len(winners) == 1
    assert store.renew_lock(CONV, winners[0], T0 + timedelta(seconds=10), 60) is True
    losers = [f"turn-{i}" for i in range(8) if f"turn-{i}" != winners[0]]
    assert not any(store.renew_lock(CONV, loser, T0 + timedelta(seconds=10), 60) for loser in losers)


def test_an_expired_lease_cannot_be_renewed_and_locks_of_scopes_are_independent(store: Store) -> None:
    # Given A's 60 s lease / When A renews at 61 s / Then it is lost, but A may acquire it again
    store.acquire_lock(CONV, "turn-A", T0, 60)
    assert store.renew_lock(CONV, "turn-A", T0 + timedelta(seconds=61), 60) is False
    assert store.acquire_lock(CONV, "turn-A", T0 + timedelta(seconds=61), 60) is True
    # And another scope's lease is independent
    assert store.acquire_lock("conversations/c2", "turn-B", T0, 60) is True
    with pytest.raises(ValueError, match="lease_s"):
        store.acquire_lock(CONV, "turn-A", T0, 0)


def test_the_lock_holder_is_the_live_leases_holder_or_none(store: Store) -> None:
    # Given no lease, then A's 60 s lease, then its expiry, then its release
    assert store.lock_holder(CONV, T0) is None
    store.acquire_lock(CONV, "turn-A", T0, 60)
    # When the holder is asked at various moments / Then it is A while the lease lives, else None
    assert store.lock_holder(CONV, T0 + timedelta(seconds=59)) == "turn-A"
    assert store.lock_holder(CONV, T0 + timedelta(seconds=60)) is None
    assert store.lock_holder("conversations/c2", T0) is None
    store.release_lock(CONV, "turn-A")
    assert store.lock_holder(CONV, T0) is None


# events


def test_events_are_appended_once_per_event_id_and_listed_oldest_first(store: Store) -> None:
    # Given three events of two turns, one of them delivered twice
    later = make_event("E2", "T1", at=T0 + minutes(1))
    earlier = make_event("E1", "T1", at=T0)
    other = make_event("E3", "T2", at=T0 + minutes(2))
    for event in (later, earlier, later, other):
        store.append_event(event)

    # When the log is listed / Then each event appears once, in time order, with its typed detail
    assert [e.event_id for e in store.list_events()] == ["E1", "E2", "E3"]
    of_t1 = store.list_events("T1")
    assert of_t1 == [earlier, later]
    assert isinstance(of_t1[0].detail, TurnStarted) and of_t1[0].detail.session_id == "s"


# the 400 KB item guard (PER-01), DynamoDB only


def _item_sizes(client: Any) -> list[int]:
    """DynamoDB's measure of each item: UTF-8 bytes of attribute names and values (numbers and
    booleans counted generously)."""
    items = client.scan(TableName=TABLE, ConsistentRead=True)["Items"]
    return [
        sum(
            len(name.encode()) + len(str(next(iter(value.values()))).encode()) for name, value in item.items()
        )
        for item in items
    ]


def test_an_oversized_run_is_stored_truncated_and_marked_instead_of_failing(
    dynamo: DynamoStore, aws: Any
) -> None:
    # Given a run whose code is 500 KB and whose stdout is 16 KiB (over DynamoDB's 400 KB item limit)
    run = make_run("R1", stdout="x" * 16384).model_copy(update={"code": "# é\n" * 125_000})

    # When it is recorded
    dynamo.put_run(run)

    # Then the write succeeded, every item is under the budget, and the record says it was cut
    stored = dynamo.get_run(ALICE, "R1")
    assert stored is not None
    assert len(stored.model_dump_json().encode()) <= RECORD_BUDGET_BYTES
    assert "[truncated by the store:" in stored.code and f"of {len(run.code.encode())} bytes" in stored.code
    assert stored.stdout == run.stdout and stored.stdout_truncated is False
    assert max(_item_sizes(aws)) < 400_000
    main = aws.get_item(
        TableName=TABLE, Key={"pk": {"S": f"USER#{ALICE}#SCOPE#{CONV}"}, "sk": {"S": "RUN#R1"}}
    )["Item"]
    assert main["truncated"] == {"BOOL": True}
    assert int(main["original_bytes"]["N"]) > 500_000


def test_oversized_artifact_metadata_and_event_details_are_cut_to_fit(dynamo: DynamoStore, aws: Any) -> None:
    # Given artifact metadata of 600 KB in many small values, and a run event with a 1 MB result
    dynamo.claim_owner(CONV, ALICE, T0)
    metadata = {"preview": [f"row {i}: " + "v" * 40 for i in range(12_000)], "rows": 12_000}
    detail = RunCompleted(
        turn_id="T1",
        scope=ConversationScope(conversation_id="c1"),
        run_id="R1",
        session_id="s",
        user_id=ALICE,
        status="ok",
        result={"stdout": "y" * 1_000_000},
    )

    # When both are recorded
    stored = dynamo.add_artifact_version(make_artifact(metadata=metadata))
    dynamo.append_event(Event.of(detail, "E1"))

    # Then both writes succeeded with items under the limit, keeping what fits
    assert max(_item_sizes(aws)) < 400_000
    artifact = dynamo.get_artifact(ALICE, CONV, "revenue", None)
    assert artifact == stored and artifact.version == 1
    assert artifact.metadata == {"preview": [], "rows": 12_000}
    (event,) = dynamo.list_events("T1")
    assert isinstance(event.detail, RunCompleted) and event.detail.result is not None
    assert event.detail.result["stdout"].startswith("y" * 1000)
    assert "[truncated by the store:" in event.detail.result["stdout"]
    # And a record within the budget is stored unchanged
    small = dynamo.add_artifact_version(make_artifact())
    assert dynamo.get_artifact(ALICE, CONV, "revenue", 2) == small and small.metadata == {"rows": 3}


def test_an_oversized_stream_and_turn_result_are_cut_and_flagged(dynamo: DynamoStore, aws: Any) -> None:
    # Given a run whose stderr is 450 KB, and a running turn
    run = make_run("R1").model_copy(update={"stderr": "traceback line\n" * 30_000})
    dynamo.create_turn(make_turn("T1"))

    # When the run is recorded and the turn finishes with a 500 KB summary
    dynamo.put_run(run)
    assert dynamo.finish_turn(finished(make_turn("T1"), "completed", "s" * 500_000)) is True

    # Then both are stored under the limit, the stream flagged as truncated, the turn completed
    stored = dynamo.get_run(ALICE, "R1")
    assert stored is not None and stored.stderr_truncated is True and stored.stdout_truncated is False
    assert stored.stderr.startswith("traceback line\n" * 60) and "[truncated by the store:" in stored.stderr
    turn = dynamo.get_turn(ALICE, "T1")
    assert turn is not None
    assert_status(turn, "completed")
    assert turn.result is not None
    assert turn.result.summary.startswith("s" * 1000) and len(turn.result.summary) < RECORD_BUDGET_BYTES
    assert max(_item_sizes(aws)) < 400_000


def test_the_ttl_attribute_follows_the_session_expiry(dynamo: DynamoStore, aws: Any) -> None:
    # Given a session created at T0 (idle expiry at T0 + 15 min)
    dynamo.create_session(make_session())
    key = {
        "pk": {"S": f"USER#{ALICE}#SCOPE#{CONV}"},
        "sk": {"S": f"SESSION#{T0.isoformat(timespec='microseconds')}#{'s' * 32}"},
    }

    def ttl() -> int:
        return int(aws.get_item(TableName=TABLE, Key=key)["Item"][TTL_ATTRIBUTE]["N"])

    created = ttl()

    # When it is touched at T0 + 10 min
    dynamo.touch_session("s" * 32, T0 + minutes(10))

    # Then TTL deletion is due at the idle expiry each time, in Unix seconds
    assert created == int((T0 + minutes(15)).timestamp())
    assert ttl() == int((T0 + minutes(25)).timestamp())
