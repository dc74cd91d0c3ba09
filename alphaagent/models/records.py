"""Records persisted by the store (SQLite locally, DynamoDB on AWS): sessions, turns, runs,
artifacts and their versions, citations (DESIGN §4.3, §4.7)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from alphaagent.models.common import ArtifactKind, utcnow
from alphaagent.models.run import RunError, StateReport

SESSION_IDLE_TIMEOUT_S = 15 * 60
"""A session expires after 15 minutes without use (DESIGN §4.7)."""

SESSION_MAX_LIFETIME_S = 8 * 60 * 60
"""A session expires 8 hours after it was created, used or not (DESIGN §4.7)."""


class Session(BaseModel):
    """An ephemeral session of one user in one scope. Files outlive it; nothing else does."""

    model_config = ConfigDict(extra="forbid")

    session_id: str
    user_id: str
    scope_key: str
    created_at: datetime
    last_used_at: datetime
    idle_timeout_s: int = SESSION_IDLE_TIMEOUT_S
    max_lifetime_s: int = SESSION_MAX_LIFETIME_S
    ended_at: datetime | None = None

    @property
    def expires_at(self) -> datetime:
        """The earlier of idle expiry and the end of the maximum lifetime."""
        return min(
            self.last_used_at + timedelta(seconds=self.idle_timeout_s),
            self.created_at + timedelta(seconds=self.max_lifetime_s),
        )

    def is_active(self, now: datetime | None = None) -> bool:
        """Checked on every read (DynamoDB's TTL deletes late, so it is never trusted)."""
        return self.ended_at is None and (now or utcnow()) < self.expires_at


TurnStatus = Literal["running", "completed", "failed"]


class ArtifactRef(BaseModel):
    """What ``register_artifact`` returns and a turn result lists."""

    artifact_id: str
    kind: ArtifactKind
    name: str
    version: int
    path: str
    sha256: str
    size_bytes: int


class CitationRef(BaseModel):
    """A citation as a turn result lists it."""

    citation_id: str
    source: str
    locator: str | None = None
    quote: str | None = None
    claim: str | None = None


class PreparedInput(BaseModel):
    """A declared input the prepare step brought into ``docs/``: its workspace path and where it came
    from (``note``, e.g. ``"fetched from https://..."``; cited by pinned steps). A registered
    artifact (a ``dataset`` or ``node_artifact`` input) also names the ``artifact``, the
    ``version`` copied and its ``sha256``: its copy has a stable name that each turn replaces, so
    this is how a turn records which version it read."""

    model_config = ConfigDict(extra="forbid")

    path: str
    note: str
    artifact: str | None = None
    version: int | None = None
    sha256: str | None = None


class TurnResult(BaseModel):
    """The outcome of one turn: the coder's summary, what was registered and cited, and the runs."""

    turn_id: str
    status: TurnStatus
    summary: str = ""
    artifacts: list[ArtifactRef] = Field(default_factory=list)
    citations: list[CitationRef] = Field(default_factory=list)
    run_ids: list[str] = Field(default_factory=list)
    error: RunError | None = None
    failed_step: str | None = None
    inputs: list[PreparedInput] = Field(default_factory=list)


class Turn(BaseModel):
    """One turn: a spec run end to end in a scope. Terminal statuses never regress."""

    model_config = ConfigDict(extra="forbid")

    turn_id: str
    user_id: str
    scope_key: str
    session_id: str
    status: TurnStatus
    goal: str
    started_at: datetime
    finished_at: datetime | None = None
    result: TurnResult | None = None
    spec_sha256: str | None = None
    """``Spec.digest()`` of the spec the turn runs: its ``turn_id`` is an idempotency key for that
    spec only. None for turns recorded before the digest was kept (any spec replays them)."""
    environment_id: str | None = None
    """The execution environment the turn's runs used (the spec's ``environment_id``). None for
    turns recorded before it was kept."""


class RunRecord(BaseModel):
    """A run as kept in history: outputs truncated a second time to the stored-history cap (16 KiB
    per stream, DESIGN §4.3); the full output stays in the spill files named here."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    turn_id: str
    session_id: str
    user_id: str
    scope_key: str
    status: str
    exit_code: int | None
    code: str
    stdout: str
    stderr: str
    stdout_bytes: int
    stderr_bytes: int
    stdout_truncated: bool
    stderr_truncated: bool
    error: RunError | None
    reason: str | None
    duration_ms: int
    files_changed: list[str]
    stdout_path: str | None = None
    stderr_path: str | None = None
    created_at: datetime
    state: StateReport | None = None
    """The session's live state around the run (what was restored, and each name not kept with
    the reason); None outside a session and in records written before history kept it."""


class ArtifactVersion(BaseModel):
    """One immutable version of an artifact: its bytes are kept by content address (sha256)."""

    model_config = ConfigDict(extra="forbid")

    artifact_id: str
    scope_key: str
    kind: ArtifactKind
    name: str
    version: int
    path: str
    sha256: str
    size_bytes: int
    description: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    turn_id: str
    user_id: str
    created_at: datetime

    def ref(self) -> ArtifactRef:
        return ArtifactRef(
            artifact_id=self.artifact_id,
            kind=self.kind,
            name=self.name,
            version=self.version,
            path=self.path,
            sha256=self.sha256,
            size_bytes=self.size_bytes,
        )


class Citation(BaseModel):
    """A claim's source as the coder cited it."""

    model_config = ConfigDict(extra="forbid")

    citation_id: str
    turn_id: str
    scope_key: str
    user_id: str
    source: str
    locator: str | None = None
    quote: str | None = None
    claim: str | None = None
    created_at: datetime

    def ref(self) -> CitationRef:
        return CitationRef(
            citation_id=self.citation_id,
            source=self.source,
            locator=self.locator,
            quote=self.quote,
            claim=self.claim,
        )


class ScopeSummary(BaseModel):
    """One scope of a user's work as ``Store.list_scopes`` lists it: how many turns the user ran
    there and the newest one's status, goal and start (for ``alphaagent conversations`` and the
    viewer's front page)."""

    model_config = ConfigDict(extra="forbid")

    scope_key: str
    turn_count: int
    last_status: TurnStatus
    last_goal: str
    last_started_at: datetime
