"""The small Protocols each backend implements (DESIGN §1): the local backend with files and
SQLite, the AWS backend with S3, DynamoDB, EventBridge and Lambda. Domain code (``alphaagent.domain``)
depends on these only.

Ownership is part of every read: methods that take a ``user_id`` answer ``None`` (or an empty list)
for records of another user, exactly as for records that do not exist (DESIGN §4.7). No read
refreshes a timer or creates a record.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import BinaryIO, Literal, Protocol

from alphaagent.models.common import Scope
from alphaagent.models.events import Event
from alphaagent.models.records import ArtifactVersion, Citation, RunRecord, ScopeSummary, Session, Turn
from alphaagent.models.run import RunLimits, RunOrigin, RunResult
from alphaagent.sandbox.capture import OutputSink as OutputSink  # re-exported: part of Executor


@dataclass(frozen=True)
class FileInfo:
    """A regular file of a scope: workspace-relative POSIX path, size in bytes, mtime (UTC)."""

    path: str
    size_bytes: int
    modified_at: datetime


class Workspace(Protocol):
    """The conversation filesystem: one tree per scope, with the S3 key layout (DESIGN §4.2).

    Every ``path`` is workspace-relative and is checked with ``check_workspace_path`` (raising
    ``PathRuleError``); symlinks are never followed and never listed.
    """

    def ensure_scope(self, scope: Scope) -> None:
        """Create the six folders of the scope if missing (idempotent)."""

    def scope_exists(self, scope: Scope) -> bool:
        """True when the scope has been created."""

    def local_root(self, scope: Scope) -> Path:
        """A local directory holding the scope's files, where code runs (local backend: the scope
        itself; AWS: a working copy synced by the env function)."""

    def read_bytes(self, scope: Scope, path: str) -> bytes:
        """The bytes of a regular file; ``FileNotFoundError`` if missing, not regular, or a symlink."""

    def write_bytes(self, scope: Scope, path: str, data: bytes) -> None:
        """Write atomically (temporary file + rename), creating parent folders."""

    def stat(self, scope: Scope, path: str) -> FileInfo | None:
        """The file's info, or None if it is missing or not a regular file."""

    def list_files(
        self, scope: Scope, prefix: str = "", skipped: list[tuple[str, str]] | None = None
    ) -> list[FileInfo]:
        """Regular files under ``prefix`` (a folder path, '' for all), sorted by path. Entries left
        out (symlinks, special files, names no method can address) are appended to ``skipped`` as
        ``(display path, reason)`` when it is given."""

    def open_file(self, scope: Scope, path: str) -> BinaryIO:
        """A binary reader of a regular file (no symlink followed); ``FileNotFoundError`` otherwise."""

    def put_blob(self, scope: Scope, path: str) -> tuple[str, int]:
        """Copy the file's current bytes into immutable content-addressed storage; return
        ``(sha256 hex, size in bytes)``. The copy is what an artifact version points to."""

    def read_blob(self, sha256: str) -> bytes:
        """The bytes stored under ``sha256``; ``FileNotFoundError`` if none."""

    def drop_session_state(self, scope: Scope, session_id: str) -> None:
        """Delete the session's live state (``work/sessions/{session_id}/``, DESIGN §4.7) once the
        session ended; the scope's files stay. Nothing to delete is not an error."""


class Store(Protocol):
    """Records: owners, sessions, turns, runs, artifacts and versions, citations, locks, events."""

    # ownership
    def claim_owner(self, owner_key: str, user_id: str, now: datetime) -> str:
        """Record ``user_id`` as owner if the key has none; return the owner (first claim wins)."""

    def owner_of(self, owner_key: str) -> str | None:
        """The owner of a conversation or workflow execution, or None."""

    def record_exists(self, kind: Literal["run", "session"], record_id: str) -> bool:
        """Whether a run or session of that id exists for any user. Only for the audit of requests
        for another user's records (``alphaagent.domain.audit``); never part of an answer."""

    # sessions
    def active_session(self, user_id: str, scope_key: str, now: datetime) -> Session | None:
        """The user's unexpired session in the scope, or None (expiry checked here)."""

    def create_session(self, session: Session) -> None:
        """Insert a new session."""

    def touch_session(self, session_id: str, now: datetime) -> None:
        """Set ``last_used_at`` (only ever called by the session's owner's own turn)."""

    def end_session(self, session_id: str, ended_at: datetime) -> None:
        """Mark a session ended (it expired)."""

    def get_session(self, user_id: str, session_id: str) -> Session | None:
        """A session of ``user_id``, or None."""

    def list_sessions(self, user_id: str, scope_key: str) -> list[Session]:
        """The user's sessions in a scope, oldest first."""

    # turns
    def create_turn(self, turn: Turn) -> bool:
        """Insert a turn; False if a turn with that id exists already (a duplicate delivery)."""

    def finish_turn(self, turn: Turn) -> bool:
        """Store a terminal status and result if the turn is still running; False otherwise
        (terminal statuses never regress)."""

    def get_turn(self, user_id: str, turn_id: str) -> Turn | None:
        """A turn of ``user_id``, or None."""

    def turn_id_taken(self, turn_id: str) -> bool:
        """True when a turn with this id exists for any user (turn ids are global idempotency
        keys, like a Step Functions execution name); used only to refuse a reused id."""

    def list_turns(self, user_id: str, scope_key: str) -> list[Turn]:
        """The user's turns in a scope, oldest first."""

    def list_scopes(self, user_id: str) -> list[ScopeSummary]:
        """The scopes the user owns (the owner of their conversation or workflow execution) and ran
        turns in, the newest turn first, each with the count of the user's turns there and the newest
        turn's status, goal and start. A scope of another user is never listed, even where this user
        has a turn record (a turn refused there is recorded as the requester's own failed turn)."""

    # runs
    def put_run(self, run: RunRecord, *, only_over_failed: bool = False) -> bool:
        """Insert or replace a run record (idempotent on ``run_id``); True if written. With
        ``only_over_failed`` the write happens only if the run has no record yet or a ``failed``
        one, in the same atomic step: a failure reported late never replaces a run's result."""

    def get_run(self, user_id: str, run_id: str) -> RunRecord | None:
        """A run of ``user_id``, or None."""

    def list_runs(self, user_id: str, scope_key: str) -> list[RunRecord]:
        """The user's runs in a scope, oldest first."""

    # artifacts
    def add_artifact_version(self, version: ArtifactVersion) -> ArtifactVersion:
        """Insert the next version of the artifact ``(scope_key, name)``: the version number is
        assigned here, atomically (1 for a new artifact); returns the stored record."""

    def get_artifact(
        self, user_id: str, scope_key: str, name: str, version: int | None
    ) -> ArtifactVersion | None:
        """A version (``None`` = latest) of an artifact in a scope the user owns, or None."""

    def list_artifacts(self, user_id: str, scope_key: str) -> list[ArtifactVersion]:
        """Every version of every artifact in the scope, by name then version."""

    def artifacts_of_turn(self, turn_id: str) -> list[ArtifactVersion]:
        """Versions registered by one turn."""

    # citations
    def add_citation(self, citation: Citation) -> None:
        """Insert a citation."""

    def citations_of_turn(self, turn_id: str) -> list[Citation]:
        """Citations emitted by one turn."""

    # locks
    def acquire_lock(self, scope_key: str, holder: str, now: datetime, lease_s: float) -> bool:
        """Take the scope's lease if it is free or expired; False if another holder has it."""

    def renew_lock(self, scope_key: str, holder: str, now: datetime, lease_s: float) -> bool:
        """Extend a lease still held by ``holder``; False if it was lost."""

    def release_lock(self, scope_key: str, holder: str) -> None:
        """Release the lease if ``holder`` has it (a no-op otherwise)."""

    def lock_holder(self, scope_key: str, now: datetime) -> str | None:
        """The holder of the scope's live lease at ``now``, or None (free or expired). A strongly
        consistent read: the env function asks it before each change it makes to a scope."""

    # events
    def append_event(self, event: Event) -> None:
        """Append to the event log (idempotent on ``event_id``)."""

    def list_events(self, turn_id: str | None = None) -> list[Event]:
        """The event log, oldest first, optionally for one turn."""


class EventBus(Protocol):
    """Where events go: in-process locally, EventBridge on AWS."""

    def publish(self, event: Event) -> None:
        """Deliver the event (locally: log it and call subscribers synchronously)."""

    def subscribe(self, handler: Callable[[Event], None]) -> None:
        """Call ``handler`` for every event published after this call."""


class Executor(Protocol):
    """What runs code for ``run_in_env``: the sandbox locally, the env Lambda on AWS.

    ``publishes_run_events``: True when the platform behind the executor records every run itself
    (on AWS, the env function's destinations reach the recorder as ``RunCompleted``/``RunFailed``);
    ``run_in_env`` then publishes no run event of its own, so each run has exactly one. A
    ``SandboxError`` with ``recorded=True`` was recorded there as well.
    """

    publishes_run_events: bool

    def run(
        self,
        workdir: Path,
        code: str,
        *,
        limits: RunLimits,
        run_id: str,
        network: bool = False,
        origin: RunOrigin | None = None,
        on_output: OutputSink | None = None,
    ) -> RunResult:
        """Run ``code`` with ``workdir`` as its working directory; user-code failures are results.
        ``origin`` names the turn, session, user, scope and environment (required by executors that
        run code elsewhere; the local sandbox ignores it). ``on_output``, when the executor can,
        receives the run's output as it is produced (``OutputSink``); callers pass it only when they
        want a live view, and an executor that cannot stream (the env Lambda on AWS, invoked
        asynchronously) ignores it: the result is the same either way."""


def iter_chunks(reader: BinaryIO, size: int = 1 << 20) -> Iterator[bytes]:
    """Read a binary file in 1 MiB chunks."""
    while chunk := reader.read(size):
        yield chunk
