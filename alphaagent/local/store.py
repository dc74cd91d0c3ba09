"""The local backend's record store: one SQLite file in ``$ALPHAAGENT_HOME`` (DESIGN §1).

``SqliteStore`` implements ``alphaagent.ports.Store`` with the same rules the DynamoDB adapter
enforces with key conditions and conditional writes:

- **Ownership inside the lookup** (DESIGN §4.7, case ISO-01). Every read that takes a ``user_id`` puts
  it in the ``WHERE`` clause (artifacts: a join on the scope's owner), so another user's record is
  answered exactly like a missing one, and no read writes anything (no timer refresh, no record).
- **Guarded writes** (case IDEM-01). ``create_turn`` inserts only a new id, ``finish_turn`` updates
  only ``WHERE status = 'running'`` (terminal statuses never regress), ``put_run`` and
  ``append_event`` are idempotent on their ids, artifact versions are numbered inside one
  ``BEGIN IMMEDIATE`` transaction under ``UNIQUE(scope_key, name, version)``.
- **One transaction per method**, so no record is ever half-written.

Concurrency: the database runs in WAL mode (readers never block the one writer) with
``synchronous=NORMAL`` (a process crash loses nothing; a power loss may lose the last commits but
never corrupts the file) and a 10 s busy timeout. Each thread of each process gets its own
connection; every write starts with ``BEGIN IMMEDIATE``, which takes the write lock up front, so a
read-modify-write never fails half-way on a lock upgrade. A write still locked out after the busy
timeout raises ``StoreBusyError`` (a ``RetryableError``).

Timestamps are stored as fixed-width ISO-8601 UTC strings (``2024-05-01T12:00:00.000000+00:00``), so
that SQL compares them correctly as text, and are returned as aware datetimes; a naive datetime
handed in is taken to be UTC already (every timestamp alphaagent makes comes from ``utcnow``).

Example::

    store = SqliteStore(Path(".alphaagent/state.db"))
    owner = store.claim_owner("conversations/c1", "user-a", utcnow())   # "user-a"
    store.get_turn("user-b", turn_id)                                   # None: not B's turn
    store.close()
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal

from alphaagent.environments import Environment
from alphaagent.errors import StoreBusyError, StoreError, StoreSchemaError
from alphaagent.models.encoding import (
    as_utc,
    event_document,
    event_from_json,
    from_iso,
    iso_utc,
    lease_delta,
    owner_key_of,
    session_expires_at,
)
from alphaagent.models.events import Event
from alphaagent.models.records import (
    ArtifactVersion,
    Citation,
    RunRecord,
    ScopeSummary,
    Session,
    Turn,
    TurnResult,
)

if TYPE_CHECKING:
    from alphaagent.ports import Store

BUSY_TIMEOUT_S: Final = 10.0
"""How long a connection waits for another writer's lock before giving up (seconds)."""

_MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (
    # Version 1. No foreign keys between records: on AWS they arrive through at-least-once events in
    # any order (a run may be recorded before its turn), and the local store must accept what
    # DynamoDB accepts. Lookups that carry a user_id lead their index with it.
    (
        """CREATE TABLE owners (
            owner_key TEXT PRIMARY KEY,
            user_id TEXT NOT NULL,
            claimed_at TEXT NOT NULL
        )""",
        """CREATE TABLE sessions (
            session_id TEXT PRIMARY KEY,
            user_id TEXT NOT NULL,
            scope_key TEXT NOT NULL,
            created_at TEXT NOT NULL,
            last_used_at TEXT NOT NULL,
            idle_timeout_s INTEGER NOT NULL,
            max_lifetime_s INTEGER NOT NULL,
            expires_at TEXT NOT NULL,
            ended_at TEXT
        )""",
        "CREATE INDEX sessions_by_user_scope ON sessions (user_id, scope_key, created_at)",
        """CREATE TABLE turns (
            turn_id TEXT PRIMARY KEY,
            user_id TEXT NOT NULL,
            scope_key TEXT NOT NULL,
            session_id TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('running', 'completed', 'failed')),
            goal TEXT NOT NULL,
            started_at TEXT NOT NULL,
            finished_at TEXT,
            result TEXT
        )""",
        "CREATE INDEX turns_by_user_scope ON turns (user_id, scope_key, started_at)",
        """CREATE TABLE runs (
            run_id TEXT PRIMARY KEY,
            turn_id TEXT NOT NULL,
            user_id TEXT NOT NULL,
            scope_key TEXT NOT NULL,
            created_at TEXT NOT NULL,
            record TEXT NOT NULL
        )""",
        "CREATE INDEX runs_by_user_scope ON runs (user_id, scope_key, created_at)",
        """CREATE TABLE artifact_versions (
            artifact_id TEXT NOT NULL,
            scope_key TEXT NOT NULL,
            name TEXT NOT NULL,
            version INTEGER NOT NULL CHECK (version >= 1),
            turn_id TEXT NOT NULL,
            user_id TEXT NOT NULL,
            created_at TEXT NOT NULL,
            record TEXT NOT NULL,
            UNIQUE (scope_key, name, version)
        )""",
        "CREATE INDEX artifact_versions_by_turn ON artifact_versions (turn_id)",
        """CREATE TABLE citations (
            citation_id TEXT PRIMARY KEY,
            turn_id TEXT NOT NULL,
            scope_key TEXT NOT NULL,
            user_id TEXT NOT NULL,
            created_at TEXT NOT NULL,
            record TEXT NOT NULL
        )""",
        "CREATE INDEX citations_by_turn ON citations (turn_id)",
        """CREATE TABLE locks (
            scope_key TEXT PRIMARY KEY,
            holder TEXT NOT NULL,
            expires_at TEXT NOT NULL
        )""",
        """CREATE TABLE events (
            event_id TEXT PRIMARY KEY,
            turn_id TEXT NOT NULL,
            detail_type TEXT NOT NULL,
            time TEXT NOT NULL,
            event TEXT NOT NULL
        )""",
        "CREATE INDEX events_by_time ON events (time)",
        "CREATE INDEX events_by_turn ON events (turn_id, time)",
    ),
    # Version 2: the digest of the spec a turn runs (a turn id is an idempotency key for one spec).
    ("ALTER TABLE turns ADD COLUMN spec_sha256 TEXT",),
    # Version 3: the registered execution environments (``builtin`` is never stored: it is code).
    # A removed one keeps its row, with its status, for the turns that used it.
    (
        """CREATE TABLE environments (
            environment_id TEXT PRIMARY KEY,
            status TEXT NOT NULL CHECK (status IN ('ready', 'removed')),
            registered_at TEXT NOT NULL,
            record TEXT NOT NULL
        )""",
    ),
    # Version 4: the execution environment a turn ran in (NULL for turns recorded before).
    ("ALTER TABLE turns ADD COLUMN environment_id TEXT",),
)
"""Schema migrations: entry ``i`` takes a database from version ``i`` to ``i + 1``. Append only."""

SCHEMA_VERSION: Final = len(_MIGRATIONS)
"""The schema version this code writes (``PRAGMA user_version`` of an up-to-date database)."""


class _Connection:
    """A connection and the process that opened it (a connection must never cross a ``fork``)."""

    __slots__ = ("__weakref__", "connection", "in_memory", "pid")

    def __init__(self, connection: sqlite3.Connection, pid: int, *, in_memory: bool = False) -> None:
        self.connection = connection
        self.pid = pid
        self.in_memory = in_memory


class SqliteStore:
    """The ``Store`` of the local backend: owners, sessions, turns, runs, artifact versions,
    citations, locks and the event log in one SQLite file.

    Safe to share between the threads of a process (one connection per thread) and to open from
    several processes at once (the CLI next to a running turn). Opening applies pending schema
    migrations in one transaction; see the module docstring for the rules every method keeps.

    Args:
        path: the database file; it and its parent folders are created if missing.
        create: ``"now"`` creates a missing file (and its folders) when the store is opened;
            ``"on_first_write"`` leaves them to the first write, and until then answers every read
            as an empty store does, so a refused request writes nothing (DESIGN: reads never create;
            bad input leaves nothing).

    Raises:
        StoreSchemaError: the file holds a schema newer than ``SCHEMA_VERSION``.
        StoreError: the file is not a usable SQLite database.
    """

    def __init__(self, path: Path, *, create: Literal["now", "on_first_write"] = "now") -> None:
        self._path = Path(path)
        self._local = threading.local()
        self._lock = threading.Lock()
        # While the file is missing in "on_first_write" mode, each thread reads an empty in-memory
        # database of the current schema; the first write creates the file under _create_lock.
        self._deferred = create == "on_first_write" and not self._path.exists()
        self._create_lock = threading.Lock()
        # Holders of every connection this object opened; a thread's connection is closed with its
        # thread-local holder when the thread ends, or by close().
        self._connections: weakref.WeakSet[_Connection] = weakref.WeakSet()
        # Connections inherited through fork(): closing one in the child could release the parent's
        # POSIX locks on the file, so they are kept open (and unused) for the life of the child.
        self._inherited: list[_Connection] = []
        self._closed = False
        if not self._deferred:
            self._path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._migrate()
        except BaseException:
            self.close()
            raise

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    def close(self) -> None:
        """Close every connection this process opened through this store. Call it when no other
        thread is using the store; any later call raises ``StoreError``."""
        with self._lock:
            self._closed = True
            holders = [holder for holder in self._connections if holder.pid == os.getpid()]
            self._connections.clear()
        for holder in holders:
            holder.connection.close()

    def __enter__(self) -> SqliteStore:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ownership

    def claim_owner(self, owner_key: str, user_id: str, now: datetime) -> str:
        """Record ``user_id`` as the owner of ``owner_key`` (``conversations/{id}`` or
        ``workflows/{execution_id}``) if it has none, and return the owner: the first claim wins,
        a later claim by anyone returns the first claimant (DESIGN §3 step 4)."""
        with self._write() as db:
            db.execute(
                "INSERT INTO owners (owner_key, user_id, claimed_at) VALUES (?, ?, ?) "
                "ON CONFLICT (owner_key) DO NOTHING",
                (owner_key, user_id, iso_utc(now)),
            )
            row = db.execute("SELECT user_id FROM owners WHERE owner_key = ?", (owner_key,)).fetchone()
        return str(row["user_id"])

    def owner_of(self, owner_key: str) -> str | None:
        """The owner of a conversation or workflow execution, or None if nobody claimed it."""
        row = self._read_one("SELECT user_id FROM owners WHERE owner_key = ?", (owner_key,))
        return None if row is None else str(row["user_id"])

    def record_exists(self, kind: Literal["run", "session"], record_id: str) -> bool:
        """Whether a run or session of that id exists for any user (for the probe audit only)."""
        query = {
            "run": "SELECT 1 FROM runs WHERE run_id = ?",
            "session": "SELECT 1 FROM sessions WHERE session_id = ?",
        }[kind]
        return self._read_one(query, (record_id,)) is not None

    # sessions

    def active_session(self, user_id: str, scope_key: str, now: datetime) -> Session | None:
        """The user's most recently created session in the scope that is neither ended nor expired
        at ``now`` (idle timeout or maximum lifetime, DESIGN §4.7), or None. Only reads: the idle
        timer is refreshed by ``touch_session``, never here."""
        moment = as_utc(now)
        rows = self._read_all(
            "SELECT * FROM sessions "
            "WHERE user_id = ? AND scope_key = ? AND ended_at IS NULL AND expires_at > ? "
            "ORDER BY created_at DESC, rowid DESC",
            (user_id, scope_key, iso_utc(moment)),
        )
        for row in rows:
            session = _session(row)
            if session.is_active(moment):
                return session
        return None

    def create_session(self, session: Session) -> None:
        """Insert a new session. Raises ``StoreError`` if its ``session_id`` exists already (ids are
        192 random bits, so this means a caller reused one)."""
        created_at, last_used_at = as_utc(session.created_at), as_utc(session.last_used_at)
        ended_at = None if session.ended_at is None else iso_utc(session.ended_at)
        with self._write() as db:
            inserted = db.execute(
                "INSERT INTO sessions (session_id, user_id, scope_key, created_at, last_used_at, "
                "idle_timeout_s, max_lifetime_s, expires_at, ended_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (session_id) DO NOTHING",
                (
                    session.session_id,
                    session.user_id,
                    session.scope_key,
                    iso_utc(created_at),
                    iso_utc(last_used_at),
                    session.idle_timeout_s,
                    session.max_lifetime_s,
                    iso_utc(
                        session_expires_at(
                            created_at, last_used_at, session.idle_timeout_s, session.max_lifetime_s
                        )
                    ),
                    ended_at,
                ),
            ).rowcount
        if inserted != 1:
            raise StoreError(f"session {session.session_id!r} exists already")

    def touch_session(self, session_id: str, now: datetime) -> None:
        """Set ``last_used_at`` to ``now``, restarting the idle timer (never past the maximum
        lifetime). A no-op for an ended, expired or unknown session, or if ``now`` is not later than the
        current ``last_used_at`` (concurrent turns may touch out of order; the timer never goes back)."""
        moment = as_utc(now)
        with self._write() as db:
            row = db.execute(
                "SELECT created_at, last_used_at, idle_timeout_s, max_lifetime_s, expires_at FROM sessions "
                "WHERE session_id = ? AND ended_at IS NULL",
                (session_id,),
            ).fetchone()
            if row is None or from_iso(row["last_used_at"]) >= moment:
                return
            if from_iso(row["expires_at"]) <= moment:
                return  # expired already: a touch never brings a session back (the next turn replaces it)
            expires_at = session_expires_at(
                from_iso(row["created_at"]), moment, int(row["idle_timeout_s"]), int(row["max_lifetime_s"])
            )
            db.execute(
                "UPDATE sessions SET last_used_at = ?, expires_at = ? WHERE session_id = ?",
                (iso_utc(moment), iso_utc(expires_at), session_id),
            )

    def end_session(self, session_id: str, ended_at: datetime) -> None:
        """Mark a session ended (it expired). The first end is kept; ending again is a no-op."""
        with self._write() as db:
            db.execute(
                "UPDATE sessions SET ended_at = ? WHERE session_id = ? AND ended_at IS NULL",
                (iso_utc(ended_at), session_id),
            )

    def get_session(self, user_id: str, session_id: str) -> Session | None:
        """The session ``session_id`` if it belongs to ``user_id``, else None (expired or not)."""
        row = self._read_one(
            "SELECT * FROM sessions WHERE session_id = ? AND user_id = ?",
            (session_id, user_id),
        )
        return None if row is None else _session(row)

    def list_sessions(self, user_id: str, scope_key: str) -> list[Session]:
        """The user's sessions in a scope (ended and expired ones too), oldest first."""
        rows = self._read_all(
            "SELECT * FROM sessions WHERE user_id = ? AND scope_key = ? ORDER BY created_at, rowid",
            (user_id, scope_key),
        )
        return [_session(row) for row in rows]

    # turns

    def create_turn(self, turn: Turn) -> bool:
        """Insert a turn; False if a turn with that id exists already (a duplicate delivery of the
        same spec, case IDEM-01), in which case nothing is changed."""
        with self._write() as db:
            inserted = db.execute(
                "INSERT INTO turns (turn_id, user_id, scope_key, session_id, status, goal, started_at, "
                "finished_at, result, spec_sha256, environment_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (turn_id) DO NOTHING",
                (
                    turn.turn_id,
                    turn.user_id,
                    turn.scope_key,
                    turn.session_id,
                    turn.status,
                    turn.goal,
                    iso_utc(turn.started_at),
                    None if turn.finished_at is None else iso_utc(turn.finished_at),
                    None if turn.result is None else turn.result.model_dump_json(),
                    turn.spec_sha256,
                    turn.environment_id,
                ),
            ).rowcount
        return inserted == 1

    def finish_turn(self, turn: Turn) -> bool:
        """Store ``turn.status``, ``finished_at`` and ``result`` if the turn (same id and user) is still
        ``running``; False otherwise, leaving the first terminal outcome in place (case IDEM-01).

        Raises:
            ValueError: ``turn.status`` is ``running`` (not a terminal status).
        """
        if turn.status == "running":
            raise ValueError("finish_turn needs a terminal status ('completed' or 'failed')")
        with self._write() as db:
            updated = db.execute(
                "UPDATE turns SET status = ?, finished_at = ?, result = ? "
                "WHERE turn_id = ? AND user_id = ? AND status = 'running'",
                (
                    turn.status,
                    None if turn.finished_at is None else iso_utc(turn.finished_at),
                    None if turn.result is None else turn.result.model_dump_json(),
                    turn.turn_id,
                    turn.user_id,
                ),
            ).rowcount
        return updated == 1

    def get_turn(self, user_id: str, turn_id: str) -> Turn | None:
        """The turn ``turn_id`` if it belongs to ``user_id``, else None."""
        row = self._read_one(
            "SELECT * FROM turns WHERE turn_id = ? AND user_id = ?",
            (turn_id, user_id),
        )
        return None if row is None else _turn(row)

    def turn_id_taken(self, turn_id: str) -> bool:
        """True when any user has a turn with this id (turn ids are global idempotency keys)."""
        return self._read_one("SELECT 1 FROM turns WHERE turn_id = ?", (turn_id,)) is not None

    def list_turns(self, user_id: str, scope_key: str) -> list[Turn]:
        """The user's turns in a scope, oldest (by ``started_at``) first."""
        rows = self._read_all(
            "SELECT * FROM turns WHERE user_id = ? AND scope_key = ? ORDER BY started_at, rowid",
            (user_id, scope_key),
        )
        return [_turn(row) for row in rows]

    def list_scopes(self, user_id: str) -> list[ScopeSummary]:
        """The scopes ``user_id`` owns and ran turns in, the newest turn first, with the count of the
        user's turns there and the newest one's status, goal and start. Ownership is a join on the
        scope's owner (the conversation, or the workflow execution of a node: ids hold no '/', so the
        owner key is everything before ``/nodes/``), as ``list_artifacts`` does."""
        rows = self._read_all(
            "WITH mine AS ("
            " SELECT t.scope_key, t.status, t.goal, t.started_at,"
            "  ROW_NUMBER() OVER (PARTITION BY t.scope_key ORDER BY t.started_at DESC, t.rowid DESC)"
            "   AS newest,"
            "  COUNT(*) OVER (PARTITION BY t.scope_key) AS turn_count"
            " FROM turns AS t JOIN owners AS o ON o.user_id = t.user_id AND o.owner_key = CASE"
            "  WHEN instr(t.scope_key, '/nodes/') > 0"
            "  THEN substr(t.scope_key, 1, instr(t.scope_key, '/nodes/') - 1) ELSE t.scope_key END"
            " WHERE t.user_id = ?)"
            " SELECT scope_key, turn_count, status, goal, started_at FROM mine WHERE newest = 1"
            " ORDER BY started_at DESC, scope_key",
            (user_id,),
        )
        return [
            ScopeSummary(
                scope_key=row["scope_key"],
                turn_count=row["turn_count"],
                last_status=row["status"],
                last_goal=row["goal"],
                last_started_at=from_iso(row["started_at"]),
            )
            for row in rows
        ]

    # runs

    def put_run(self, run: RunRecord, *, only_over_failed: bool = False) -> bool:
        """Insert or replace a run record, idempotent on ``run_id`` (the recorder may see the same
        destination record twice); True if written. A replacement keeps the run's place in
        ``list_runs``. With ``only_over_failed``, an existing record is replaced only if it is
        ``failed`` (one statement: no other write can come in between)."""
        stored = run.model_copy(update={"created_at": as_utc(run.created_at)})
        guard = " WHERE json_extract(runs.record, '$.status') = 'failed'" if only_over_failed else ""
        with self._write() as db:
            written = db.execute(
                "INSERT INTO runs (run_id, turn_id, user_id, scope_key, created_at, record) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (run_id) DO UPDATE SET turn_id = excluded.turn_id, "
                "user_id = excluded.user_id, scope_key = excluded.scope_key, "
                "created_at = excluded.created_at, record = excluded.record" + guard,
                (
                    stored.run_id,
                    stored.turn_id,
                    stored.user_id,
                    stored.scope_key,
                    iso_utc(stored.created_at),
                    stored.model_dump_json(),
                ),
            ).rowcount
        return written == 1

    def get_run(self, user_id: str, run_id: str) -> RunRecord | None:
        """The run ``run_id`` if it belongs to ``user_id``, else None."""
        row = self._read_one("SELECT record FROM runs WHERE run_id = ? AND user_id = ?", (run_id, user_id))
        return None if row is None else RunRecord.model_validate_json(row["record"])

    def list_runs(self, user_id: str, scope_key: str) -> list[RunRecord]:
        """The user's runs in a scope, oldest (by ``created_at``) first."""
        rows = self._read_all(
            "SELECT record FROM runs WHERE user_id = ? AND scope_key = ? ORDER BY created_at, rowid",
            (user_id, scope_key),
        )
        return [RunRecord.model_validate_json(row["record"]) for row in rows]

    # artifacts

    def add_artifact_version(self, version: ArtifactVersion) -> ArtifactVersion:
        """Insert the next version of the artifact ``(scope_key, name)`` and return what was stored.

        ``version.version`` is ignored: the number is the highest existing one plus 1 (1 for a new
        artifact), computed under the write lock so concurrent registrations from any thread or
        process get distinct, gap-free numbers. ``version.artifact_id`` is used for a new artifact
        only; later versions keep the id of the first, so the id names the artifact, not a version.
        """
        with self._write() as db:
            latest = db.execute(
                "SELECT artifact_id, version FROM artifact_versions WHERE scope_key = ? AND name = ? "
                "ORDER BY version DESC LIMIT 1",
                (version.scope_key, version.name),
            ).fetchone()
            stored = version.model_copy(
                update={
                    "artifact_id": version.artifact_id if latest is None else str(latest["artifact_id"]),
                    "version": 1 if latest is None else int(latest["version"]) + 1,
                    "created_at": as_utc(version.created_at),
                }
            )
            db.execute(
                "INSERT INTO artifact_versions (artifact_id, scope_key, name, version, turn_id, user_id, "
                "created_at, record) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    stored.artifact_id,
                    stored.scope_key,
                    stored.name,
                    stored.version,
                    stored.turn_id,
                    stored.user_id,
                    iso_utc(stored.created_at),
                    stored.model_dump_json(),
                ),
            )
        return stored

    def get_artifact(
        self, user_id: str, scope_key: str, name: str, version: int | None
    ) -> ArtifactVersion | None:
        """Version ``version`` (``None`` = the latest) of the artifact ``name`` in ``scope_key``, if
        ``user_id`` owns the scope (the owner of its conversation or workflow execution), else None.
        A scope nobody has claimed, or a malformed scope key, has no readable artifacts."""
        owner_key = owner_key_of(scope_key)
        if owner_key is None:
            return None
        if version is None:
            row = self._read_one(
                "SELECT a.record FROM artifact_versions AS a "
                "JOIN owners AS o ON o.owner_key = ? AND o.user_id = ? "
                "WHERE a.scope_key = ? AND a.name = ? ORDER BY a.version DESC LIMIT 1",
                (owner_key, user_id, scope_key, name),
            )
        else:
            row = self._read_one(
                "SELECT a.record FROM artifact_versions AS a "
                "JOIN owners AS o ON o.owner_key = ? AND o.user_id = ? "
                "WHERE a.scope_key = ? AND a.name = ? AND a.version = ?",
                (owner_key, user_id, scope_key, name, version),
            )
        return None if row is None else ArtifactVersion.model_validate_json(row["record"])

    def list_artifacts(self, user_id: str, scope_key: str) -> list[ArtifactVersion]:
        """Every version of every artifact in a scope ``user_id`` owns, by name then version; [] for
        a scope of another user, an unclaimed scope or a malformed scope key."""
        owner_key = owner_key_of(scope_key)
        if owner_key is None:
            return []
        rows = self._read_all(
            "SELECT a.record FROM artifact_versions AS a "
            "JOIN owners AS o ON o.owner_key = ? AND o.user_id = ? "
            "WHERE a.scope_key = ? ORDER BY a.name, a.version",
            (owner_key, user_id, scope_key),
        )
        return [ArtifactVersion.model_validate_json(row["record"]) for row in rows]

    def artifacts_of_turn(self, turn_id: str) -> list[ArtifactVersion]:
        """The versions one turn registered, in registration order (for its turn result)."""
        rows = self._read_all(
            "SELECT record FROM artifact_versions WHERE turn_id = ? ORDER BY rowid", (turn_id,)
        )
        return [ArtifactVersion.model_validate_json(row["record"]) for row in rows]

    # citations

    def add_citation(self, citation: Citation) -> None:
        """Insert a citation; idempotent on ``citation_id`` (a redelivered ``CitationEmitted`` is
        recorded once, and the first record is kept)."""
        stored = citation.model_copy(update={"created_at": as_utc(citation.created_at)})
        with self._write() as db:
            db.execute(
                "INSERT INTO citations (citation_id, turn_id, scope_key, user_id, created_at, record) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (citation_id) DO NOTHING",
                (
                    stored.citation_id,
                    stored.turn_id,
                    stored.scope_key,
                    stored.user_id,
                    iso_utc(stored.created_at),
                    stored.model_dump_json(),
                ),
            )

    def citations_of_turn(self, turn_id: str) -> list[Citation]:
        """The citations one turn emitted, in emission order."""
        rows = self._read_all("SELECT record FROM citations WHERE turn_id = ? ORDER BY rowid", (turn_id,))
        return [Citation.model_validate_json(row["record"]) for row in rows]

    # locks

    def acquire_lock(self, scope_key: str, holder: str, now: datetime, lease_s: float) -> bool:
        """Take the scope's lease until ``now + lease_s`` (seconds) if it is free, expired, or
        already ``holder``'s (re-acquiring extends it); False if another holder's lease is live
        (DESIGN §3 step 3).

        Raises:
            ValueError: ``lease_s`` is not positive.
        """
        moment = as_utc(now)
        expires_at = iso_utc(moment + lease_delta(lease_s))
        with self._write() as db:
            taken = db.execute(
                "INSERT INTO locks (scope_key, holder, expires_at) VALUES (?, ?, ?) "
                "ON CONFLICT (scope_key) DO UPDATE "
                "SET holder = excluded.holder, expires_at = excluded.expires_at "
                "WHERE locks.holder = excluded.holder OR locks.expires_at <= ?",
                (scope_key, holder, expires_at, iso_utc(moment)),
            ).rowcount
        return taken == 1

    def renew_lock(self, scope_key: str, holder: str, now: datetime, lease_s: float) -> bool:
        """Extend ``holder``'s lease to ``now + lease_s`` (seconds); False if the lease was lost. A
        lease that has expired counts as lost even if nobody has taken it yet: from that moment
        another turn could have been granted the scope, so the holder must not assume it kept it.

        Raises:
            ValueError: ``lease_s`` is not positive.
        """
        moment = as_utc(now)
        expires_at = iso_utc(moment + lease_delta(lease_s))
        with self._write() as db:
            renewed = db.execute(
                "UPDATE locks SET expires_at = ? WHERE scope_key = ? AND holder = ? AND expires_at > ?",
                (expires_at, scope_key, holder, iso_utc(moment)),
            ).rowcount
        return renewed == 1

    def release_lock(self, scope_key: str, holder: str) -> None:
        """Release the lease if ``holder`` has it; a no-op otherwise (it may have been taken over)."""
        with self._write() as db:
            db.execute("DELETE FROM locks WHERE scope_key = ? AND holder = ?", (scope_key, holder))

    def lock_holder(self, scope_key: str, now: datetime) -> str | None:
        """The holder of the scope's live lease at ``now`` (it expires after ``now``), or None."""
        row = self._read_one(
            "SELECT holder FROM locks WHERE scope_key = ? AND expires_at > ?",
            (scope_key, iso_utc(as_utc(now))),
        )
        return None if row is None else str(row["holder"])

    # events

    def append_event(self, event: Event) -> None:
        """Append an event to the log; idempotent on ``event_id`` (the first copy is kept)."""
        document = event_document(event)
        with self._write() as db:
            db.execute(
                "INSERT INTO events (event_id, turn_id, detail_type, time, event) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (event_id) DO NOTHING",
                (
                    event.event_id,
                    event.detail.turn_id,
                    event.detail_type,
                    document["time"],
                    json.dumps(document),
                ),
            )

    def list_events(self, turn_id: str | None = None) -> list[Event]:
        """The event log, oldest (by event ``time``, then append order) first, optionally for one turn.

        Raises:
            StoreError: the log holds a detail-type this code has no model for.
        """
        if turn_id is None:
            rows = self._read_all("SELECT event FROM events ORDER BY time, rowid", ())
        else:
            rows = self._read_all(
                "SELECT event FROM events WHERE turn_id = ? ORDER BY time, rowid", (turn_id,)
            )
        return [event_from_json(row["event"]) for row in rows]

    # environments

    def add_environment(self, environment: Environment) -> bool:
        """Record a ready environment; False (nothing written) if one of that id is registered and
        ready. A removed one of that id is replaced (its id is free again)."""
        with self._write() as db:
            written = db.execute(
                "INSERT INTO environments (environment_id, status, registered_at, record) "
                "VALUES (?, 'ready', ?, ?) ON CONFLICT (environment_id) DO UPDATE SET "
                "status = 'ready', registered_at = excluded.registered_at, record = excluded.record "
                "WHERE environments.status = 'removed'",
                (
                    environment.environment_id,
                    iso_utc(environment.registered_at),
                    environment.model_copy(update={"status": "ready"}).model_dump_json(),
                ),
            ).rowcount
        return written == 1

    def get_environment(self, environment_id: str) -> Environment | None:
        """The environment (ready or removed), or None if it was never registered."""
        row = self._read_one("SELECT record FROM environments WHERE environment_id = ?", (environment_id,))
        return None if row is None else Environment.model_validate_json(row["record"])

    def list_environments(self) -> list[Environment]:
        """The ready environments, by id."""
        rows = self._read_all(
            "SELECT record FROM environments WHERE status = 'ready' ORDER BY environment_id", ()
        )
        return [Environment.model_validate_json(row["record"]) for row in rows]

    def remove_environment(self, environment_id: str, now: datetime) -> Environment | None:
        """Mark a ready environment removed at ``now``; the removed record, or None (nothing
        written) if no ready environment has that id."""
        if self._deferred:
            return None  # no file yet, so no environment: a refused removal creates nothing
        with self._write() as db:
            row = db.execute(
                "SELECT record FROM environments WHERE environment_id = ? AND status = 'ready'",
                (environment_id,),
            ).fetchone()
            if row is None:
                return None
            removed = Environment.model_validate_json(row["record"]).model_copy(
                update={"status": "removed", "removed_at": as_utc(now)}
            )
            db.execute(
                "UPDATE environments SET status = 'removed', record = ? WHERE environment_id = ?",
                (removed.model_dump_json(), environment_id),
            )
        return removed

    # connections and transactions

    def _connection(self) -> sqlite3.Connection:
        """This thread's connection in this process, opened on first use."""
        if self._deferred and self._path.exists():
            # Another process or store made the file since this one was opened (a `run` beside a
            # `serve` started on a new data directory): read what it wrote, not the empty stand-in.
            self._create_file()
        holder: _Connection | None = getattr(self._local, "holder", None)
        pid = os.getpid()
        if holder is not None and holder.pid == pid and not self._closed:
            if holder.in_memory == self._deferred:
                return holder.connection
            holder.connection.close()  # this thread's empty stand-in: the file exists now
            holder = None
        with self._lock:
            if self._closed:
                raise StoreError(f"the store {self._path} is closed")
            if holder is not None:
                self._inherited.append(holder)
            deferred = self._deferred
            holder = _Connection(self._open(in_memory=deferred), pid, in_memory=deferred)
            self._connections.add(holder)
        self._local.holder = holder
        return holder.connection

    def _create_file(self) -> None:
        """The first write of an ``on_first_write`` store: create the folders and the file, migrate
        it, and only then send every thread's reads to it."""
        with self._create_lock:
            if not self._deferred:
                return
            self._path.parent.mkdir(parents=True, exist_ok=True)
            db = self._open(in_memory=False)
            try:
                self._migrate_on(db)
            finally:
                db.close()
            self._deferred = False

    def _open(self, *, in_memory: bool = False) -> sqlite3.Connection:
        # isolation_level=None: the sqlite3 module starts no implicit transactions; _write() does.
        # check_same_thread=False only so that close() may close other threads' connections: each
        # connection is otherwise used by the one thread that opened it.
        try:
            connection = sqlite3.connect(
                ":memory:" if in_memory else self._path,
                timeout=BUSY_TIMEOUT_S,
                isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.Error as error:
            raise StoreError(f"cannot open the store {self._path}: {error}") from error
        connection.row_factory = sqlite3.Row
        try:
            connection.execute("PRAGMA busy_timeout = 10000")  # BUSY_TIMEOUT_S, in milliseconds
            connection.execute("PRAGMA foreign_keys = ON")
            connection.execute("PRAGMA synchronous = NORMAL")
        except sqlite3.Error as error:
            connection.close()
            raise StoreError(f"cannot use the store {self._path}: {error}") from error
        if in_memory:
            self._migrate_on(connection)  # an empty stand-in of the current schema, never on disk
        return connection

    def _migrate(self) -> None:
        """Migrate this thread's connection (the file's, or its empty stand-in's)."""
        self._migrate_on(self._connection())

    def _migrate_on(self, db: sqlite3.Connection) -> None:
        """Refuse a newer schema, switch to WAL, then apply pending migrations in one transaction."""
        try:
            # Checked before anything is written, so a newer database is left exactly as it was.
            _check_version(self._path, _user_version(db))
            db.execute("PRAGMA journal_mode = WAL")
        except sqlite3.DatabaseError as error:
            raise StoreError(f"cannot use the store {self._path}: {error}") from error
        if _user_version(db) == SCHEMA_VERSION:
            return
        with self._transaction(db) as tx:
            # Re-read under the write lock: another process may have migrated in the meantime.
            current = _user_version(tx)
            _check_version(self._path, current)
            for target in range(current + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[target - 1]:
                    tx.execute(statement)
            # user_version is part of the database header, so it commits with the migration.
            tx.execute(f"PRAGMA user_version = {SCHEMA_VERSION:d}")

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taking the write lock up front (``BEGIN IMMEDIATE``): committed if
        the block succeeds, rolled back otherwise. The first write of an ``on_first_write`` store
        creates its file."""
        if self._deferred:
            self._create_file()
        with self._transaction(self._connection()) as db:
            yield db

    @contextmanager
    def _transaction(self, db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
        with _busy_is_retryable(self._path):
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

    def _read_one(self, sql: str, parameters: tuple[Any, ...]) -> sqlite3.Row | None:
        """The first row of one read (a statement outside a transaction reads one snapshot)."""
        with _busy_is_retryable(self._path):
            row: sqlite3.Row | None = self._connection().execute(sql, parameters).fetchone()
        return row

    def _read_all(self, sql: str, parameters: tuple[Any, ...]) -> list[sqlite3.Row]:
        """Every row of one read."""
        with _busy_is_retryable(self._path):
            rows: list[sqlite3.Row] = self._connection().execute(sql, parameters).fetchall()
        return rows


@contextmanager
def _busy_is_retryable(path: Path) -> Iterator[None]:
    """Raise a lock timeout as ``StoreBusyError``; any other error passes through unchanged."""
    try:
        yield
    except sqlite3.OperationalError as error:
        if error.sqlite_errorcode & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            raise StoreBusyError(
                f"the store {path} is busy with other writers (waited {BUSY_TIMEOUT_S:g} s for the lock)"
            ) from error
        raise


def _user_version(db: sqlite3.Connection) -> int:
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def _check_version(path: Path, found: int) -> None:
    if found > SCHEMA_VERSION:
        raise StoreSchemaError(
            f"the store {path} has schema version {found}, but this alphaagent knows versions up to "
            f"{SCHEMA_VERSION}: it was written by a newer alphaagent; upgrade alphaagent to use it"
        )


def _session(row: sqlite3.Row) -> Session:
    return Session(
        session_id=row["session_id"],
        user_id=row["user_id"],
        scope_key=row["scope_key"],
        created_at=from_iso(row["created_at"]),
        last_used_at=from_iso(row["last_used_at"]),
        idle_timeout_s=row["idle_timeout_s"],
        max_lifetime_s=row["max_lifetime_s"],
        ended_at=None if row["ended_at"] is None else from_iso(row["ended_at"]),
    )


def _turn(row: sqlite3.Row) -> Turn:
    return Turn(
        turn_id=row["turn_id"],
        user_id=row["user_id"],
        scope_key=row["scope_key"],
        session_id=row["session_id"],
        status=row["status"],
        goal=row["goal"],
        started_at=from_iso(row["started_at"]),
        finished_at=None if row["finished_at"] is None else from_iso(row["finished_at"]),
        result=None if row["result"] is None else TurnResult.model_validate_json(row["result"]),
        spec_sha256=row["spec_sha256"],
        environment_id=row["environment_id"],
    )


if TYPE_CHECKING:
    # mypy proves here that SqliteStore satisfies the Store Protocol.
    _STORE_PROTOCOL_CHECK: type[Store] = SqliteStore
