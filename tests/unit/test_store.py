"""What only the local record store (SQLite) does: its file, schema and WAL, crash safety across
processes, and artifact versioning under heavy concurrency. The behaviour both stores share
(ownership inside every read, session expiry, guarded turn transitions, idempotent writes, leases,
the event log) is tested once against both, in tests/integration/test_dynamo_store.py."""

from __future__ import annotations

import multiprocessing
import sqlite3
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from alphaagent.errors import AlphaAgentError, StoreError, StoreSchemaError
from alphaagent.ids import new_ulid
from alphaagent.local.store import SCHEMA_VERSION, SqliteStore
from alphaagent.models.records import (
    ArtifactVersion,
    Citation,
    Session,
    Turn,
    TurnResult,
)
from alphaagent.ports import Store

T0 = datetime(2025, 3, 1, 9, 0, 0, tzinfo=UTC)
CONV = "conversations/c1"
ALICE = "alice@example.com"
BOB = "bob@example.com"


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "home" / "state.db"


@pytest.fixture
def store(db_path: Path) -> Iterator[SqliteStore]:
    with SqliteStore(db_path) as opened:
        yield opened


def minutes(n: float) -> timedelta:
    return timedelta(minutes=n)


def make_session(session_id: str = "s" * 32, *, user_id: str = ALICE, created_at: datetime = T0) -> Session:
    return Session(
        session_id=session_id, user_id=user_id, scope_key=CONV, created_at=created_at, last_used_at=created_at
    )


def make_turn(turn_id: str, *, user_id: str = ALICE, status: str = "running") -> Turn:
    return Turn.model_validate(
        {
            "turn_id": turn_id,
            "user_id": user_id,
            "scope_key": CONV,
            "session_id": "s" * 32,
            "status": status,
            "goal": "revenue by region",
            "started_at": T0,
        }
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


def make_artifact(
    name: str = "revenue", *, scope_key: str = CONV, turn_id: str = "T1", artifact_id: str | None = None
) -> ArtifactVersion:
    return ArtifactVersion(
        artifact_id=artifact_id or new_ulid(),
        scope_key=scope_key,
        kind="dataset",
        name=name,
        version=0,
        path=f"datasets/{name}.csv",
        sha256="ab" * 32,
        size_bytes=10,
        metadata={"rows": 3},
        turn_id=turn_id,
        user_id=ALICE,
        created_at=T0,
    )


def dump(path: Path) -> list[str]:
    with sqlite3.connect(path) as raw:
        return list(raw.iterdump())


# schema


def test_schema_is_created_on_first_open_and_records_survive_a_reopen(db_path: Path) -> None:
    # Given a store opened on a path whose folder does not exist yet, holding one claimed conversation
    first = SqliteStore(db_path)
    first.claim_owner(CONV, ALICE, T0)
    first.close()

    # When it is opened again
    with SqliteStore(db_path) as again:
        owner = again.owner_of(CONV)

    # Then the claim is still there and the file carries the current schema version
    assert owner == ALICE
    with sqlite3.connect(db_path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        tables = {row[0] for row in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {
        "owners",
        "sessions",
        "turns",
        "runs",
        "artifact_versions",
        "citations",
        "locks",
        "events",
    } <= tables


def test_the_database_runs_in_wal_mode(store: SqliteStore) -> None:
    # Given an opened store / When the journal mode is read by another connection
    with sqlite3.connect(store.path) as raw:
        mode = raw.execute("PRAGMA journal_mode").fetchone()[0]

    # Then readers and the writer do not block each other
    assert mode == "wal"


def test_a_version_1_database_is_migrated_and_its_turns_keep_reading(db_path: Path) -> None:
    # Given a database written before turns kept their spec's digest (schema version 1), with a turn
    from alphaagent.local.store import _MIGRATIONS

    db_path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(db_path) as raw:
        for statement in _MIGRATIONS[0]:
            raw.execute(statement)
        raw.execute(
            "INSERT INTO turns VALUES ('01OLD', 'u', 'conversations/c', 's', 'running', 'g',"
            " '2026-01-01T00:00:00+00:00', NULL, NULL)"
        )
        raw.execute("PRAGMA user_version = 1")
    # When it is opened; Then it is migrated, and the old turn reads with no digest (any spec replays)
    store = SqliteStore(db_path)
    try:
        turn = store.get_turn("u", "01OLD")
        assert turn is not None and turn.spec_sha256 is None
    finally:
        store.close()
    with sqlite3.connect(db_path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_a_store_created_on_first_write_leaves_nothing_until_then(db_path: Path) -> None:
    # Given a store opened "on_first_write" on a folder that does not exist
    store = SqliteStore(db_path, create="on_first_write")
    try:
        # When it is only read, from two threads
        answers: list[object] = [store.owner_of(CONV), store.list_turns(ALICE, CONV)]
        reader = threading.Thread(target=lambda: answers.append(store.get_turn(ALICE, "01X")))
        reader.start()
        reader.join()
        # Then it answers as an empty store does, and neither the file nor its folder exists
        assert answers == [None, [], None]
        assert not db_path.parent.exists()
        # When it is written once; Then the file exists, and every thread reads what was written
        assert store.claim_owner(CONV, ALICE, T0) == ALICE
        assert db_path.is_file()
        seen: list[str | None] = []
        other = threading.Thread(target=lambda: seen.append(store.owner_of(CONV)))
        other.start()
        other.join()
        assert (store.owner_of(CONV), seen) == (ALICE, [ALICE])
    finally:
        store.close()
    with SqliteStore(db_path) as again:
        assert again.owner_of(CONV) == ALICE


def test_a_store_waiting_for_its_first_write_reads_a_file_made_since_by_another(db_path: Path) -> None:
    # Given a store opened "on_first_write" on a data directory that does not exist yet (a viewer or
    # a long-lived client started on a new home), which has read once
    waiting = SqliteStore(db_path, create="on_first_write")
    try:
        assert waiting.owner_of(CONV) is None
        # When another store (another process's command) creates the file and writes to it
        with SqliteStore(db_path) as other:
            assert other.claim_owner(CONV, ALICE, T0) == ALICE
        # Then the first store reads what was written, from every thread, not its empty stand-in
        seen: list[str | None] = []
        reader = threading.Thread(target=lambda: seen.append(waiting.owner_of(CONV)))
        reader.start()
        reader.join()
        assert (waiting.owner_of(CONV), seen) == (ALICE, [ALICE])
    finally:
        waiting.close()


def test_a_version_3_turn_reads_with_no_environment(db_path: Path) -> None:
    # Given a database of schema version 3 (before turns kept their environment), with a turn
    from alphaagent.local.store import _MIGRATIONS

    db_path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(db_path) as raw:
        for migration in _MIGRATIONS[:3]:
            for statement in migration:
                raw.execute(statement)
        raw.execute(
            "INSERT INTO turns VALUES ('01OLD', 'u', 'conversations/c', 's', 'running', 'g',"
            " '2026-01-01T00:00:00+00:00', NULL, NULL, NULL)"
        )
        raw.execute("PRAGMA user_version = 3")
    # When it is opened; Then the old turn reads with no environment, and a new one keeps its own
    with SqliteStore(db_path) as store:
        old = store.get_turn("u", "01OLD")
        assert old is not None and old.environment_id is None
        store.create_turn(make_turn("01NEW").model_copy(update={"environment_id": "stats"}))
        new = store.get_turn(ALICE, "01NEW")
        assert new is not None and new.environment_id == "stats"


def test_a_database_from_a_newer_alphaagent_is_refused_and_left_untouched(db_path: Path) -> None:
    # Given a database whose schema version is ahead of this code
    db_path.parent.mkdir(parents=True)
    with sqlite3.connect(db_path) as raw:
        raw.execute("CREATE TABLE future (x)")
        raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    before = db_path.read_bytes()

    # When it is opened
    with pytest.raises(
        StoreSchemaError, match=rf"schema version {SCHEMA_VERSION + 1}.*newer alphaagent"
    ) as caught:
        SqliteStore(db_path)

    # Then the error is one of ours, names the file, and the file is byte for byte as it was
    assert isinstance(caught.value, AlphaAgentError)
    assert str(db_path) in str(caught.value)
    assert db_path.read_bytes() == before


def test_a_file_that_is_not_a_database_is_a_clear_error(db_path: Path) -> None:
    # Given a file with text in it
    db_path.parent.mkdir(parents=True)
    db_path.write_text("not a database " * 100)

    # When / Then opening it says so
    with pytest.raises(AlphaAgentError, match="cannot use the store"):
        SqliteStore(db_path)


def test_a_closed_store_refuses_further_use(db_path: Path) -> None:
    # Given a store that was used, then closed
    store = SqliteStore(db_path)
    store.claim_owner(CONV, ALICE, T0)
    store.close()

    # When it is used again / Then it says it is closed
    with pytest.raises(StoreError, match="is closed"):
        store.owner_of(CONV)


def test_sqlite_store_satisfies_the_store_protocol(store: SqliteStore) -> None:
    # Given / When the store is used where a Store is expected / Then it offers every method
    as_port: Store = store
    names = [name for name in vars(Store) if not name.startswith("_")]
    assert all(callable(getattr(as_port, name)) for name in names)


# ownership


# sessions


def test_active_session_never_refreshes_the_idle_timer(store: SqliteStore) -> None:
    # Given a session last used at T0
    store.create_session(make_session())

    # When it is read repeatedly as active
    for offset in (1, 5, 10, 14):
        assert store.active_session(ALICE, CONV, T0 + minutes(offset)) is not None

    # Then last_used_at is unchanged and it still expires 15 minutes after T0
    stored = store.get_session(ALICE, "s" * 32)
    assert stored is not None and stored.last_used_at == T0
    assert store.active_session(ALICE, CONV, T0 + minutes(16)) is None


def test_touch_never_moves_the_idle_timer_back(store: SqliteStore) -> None:
    # Given a session touched at T0 + 10 min
    store.create_session(make_session())
    store.touch_session("s" * 32, T0 + minutes(10))

    # When a late, out-of-order touch carries an earlier time
    store.touch_session("s" * 32, T0 + minutes(3))

    # Then the later time stands
    stored = store.get_session(ALICE, "s" * 32)
    assert stored is not None and stored.last_used_at == T0 + minutes(10)


def test_timestamps_come_back_timezone_aware_in_utc(store: SqliteStore) -> None:
    # Given a session created with a naive time and one with a Berlin time (UTC+1 in March)
    naive = datetime(2025, 3, 1, 9, 0, 0)
    berlin = datetime(2025, 3, 1, 12, 0, 0, tzinfo=ZoneInfo("Europe/Berlin"))
    store.create_session(make_session("a" * 32, created_at=naive))
    store.create_session(make_session("b" * 32, created_at=berlin))

    # When they are read back
    first, second = store.get_session(ALICE, "a" * 32), store.get_session(ALICE, "b" * 32)

    # Then both are aware UTC datetimes for the same instants
    assert first is not None and second is not None
    assert first.created_at == T0 and first.created_at.utcoffset() == timedelta(0)
    assert second.created_at == T0 + timedelta(hours=2) and second.created_at.utcoffset() == timedelta(0)


# turns


def test_finishing_an_unknown_turn_or_with_a_running_status_does_nothing(store: SqliteStore) -> None:
    # Given no turn T9 / When it is finished / Then nothing is stored
    assert store.finish_turn(finished(make_turn("T9"), "failed", "x")) is False
    assert store.get_turn(ALICE, "T9") is None
    # And "running" is not a terminal status
    store.create_turn(make_turn("T1"))
    with pytest.raises(ValueError, match="terminal status"):
        store.finish_turn(make_turn("T1"))


# runs


# artifacts


def _register_many(path: Path, count: int) -> None:
    with SqliteStore(path) as own:
        for _ in range(count):
            own.add_artifact_version(make_artifact())


def test_concurrent_registrations_from_threads_get_distinct_gap_free_versions(store: SqliteStore) -> None:
    # Given one store shared by 8 threads
    store.claim_owner(CONV, ALICE, T0)
    errors: list[BaseException] = []

    def register() -> None:
        try:
            for _ in range(10):
                store.add_artifact_version(make_artifact())
        except BaseException as error:
            errors.append(error)

    # When each registers the same artifact 10 times at once
    threads = [threading.Thread(target=register) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    # Then the versions are exactly 1..80, under one artifact id
    assert errors == []
    versions = store.list_artifacts(ALICE, CONV)
    assert [a.version for a in versions] == list(range(1, 81))
    assert len({a.artifact_id for a in versions}) == 1


def _register_inherited(store: SqliteStore, count: int) -> None:
    # Runs in a forked child: the parent's store object must open its own connection here.
    for _ in range(count):
        store.add_artifact_version(make_artifact())


def test_concurrent_registrations_from_processes_get_distinct_gap_free_versions(store: SqliteStore) -> None:
    # Given a store already used by this process, and 4 forked processes (2 with a store inherited
    # through fork, 2 opening their own, like the CLI next to a running turn)
    store.claim_owner(CONV, ALICE, T0)
    store.add_artifact_version(make_artifact())
    context = multiprocessing.get_context("fork")
    workers: list[tuple[Callable[..., None], tuple[Any, ...]]] = [
        (_register_inherited, (store, 15)),
        (_register_inherited, (store, 15)),
        (_register_many, (store.path, 15)),
        (_register_many, (store.path, 15)),
    ]
    processes = [context.Process(target=target, args=args) for target, args in workers]

    # When they all register the same artifact at once, while this process does too
    for process in processes:
        process.start()
    for _ in range(5):
        store.add_artifact_version(make_artifact())
    for process in processes:
        process.join(timeout=60)

    # Then every process succeeded and the versions are exactly 1..66, with no duplicate
    assert [process.exitcode for process in processes] == [0, 0, 0, 0]
    versions = [a.version for a in store.list_artifacts(ALICE, CONV)]
    assert versions == list(range(1, 67))


# citations


def test_citations_are_listed_per_turn_once_each(store: SqliteStore) -> None:
    # Given two citations of T1, one delivered twice, and one of T2
    def citation(citation_id: str, turn_id: str) -> Citation:
        return Citation(
            citation_id=citation_id,
            turn_id=turn_id,
            scope_key=CONV,
            user_id=ALICE,
            source="docs/report.pdf",
            locator="p. 3",
            created_at=T0,
        )

    for citation_id, turn_id in (("C1", "T1"), ("C2", "T1"), ("C1", "T1"), ("C3", "T2")):
        store.add_citation(citation(citation_id, turn_id))

    # When T1's citations are listed / Then each appears once, in emission order
    assert store.citations_of_turn("T1") == [citation("C1", "T1"), citation("C2", "T1")]


# locks


def test_locks_of_different_scopes_are_independent(store: SqliteStore) -> None:
    # Given / When two turns lock two scopes / Then both succeed
    assert store.acquire_lock(CONV, "turn-A", T0, 60) is True
    assert store.acquire_lock("conversations/c2", "turn-B", T0, 60) is True


def test_an_expired_lease_cannot_be_renewed_even_if_nobody_took_it(store: SqliteStore) -> None:
    # Given A's 60 s lease / When A renews at 61 s / Then it is lost, but A may acquire it again
    store.acquire_lock(CONV, "turn-A", T0, 60)
    assert store.renew_lock(CONV, "turn-A", T0 + timedelta(seconds=61), 60) is False
    assert store.acquire_lock(CONV, "turn-A", T0 + timedelta(seconds=61), 60) is True


# events


# ownership in every read (DESIGN §4.7, case ISO-01)
