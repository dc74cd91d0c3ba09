"""Events (DESIGN §4.8): ``source = "alphaagent.<component>"``, past-tense detail-types, one model
per detail. Every detail carries ``schema_version``, ``turn_id`` and the scope.

The same envelopes go on the in-process bus locally and on the EventBridge bus on AWS; the README's
event catalogue is checked against ``EVENT_MODELS`` by a test.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from alphaagent.models.common import ConversationScope, NodeScope, Ulid, UserId, utcnow
from alphaagent.models.records import ArtifactRef, CitationRef, TurnResult
from alphaagent.models.run import RunError

SCHEMA_VERSION: Final = 1


class EventDetail(BaseModel):
    """Fields every detail carries."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = SCHEMA_VERSION
    turn_id: str
    scope: ConversationScope | NodeScope


class SpecSubmitted(EventDetail):
    spec: dict[str, Any]


MAX_REJECTION_REASON_CHARS: Final = 2000
"""A ``SpecRejected`` reason is cut to 2,000 characters: the detail stays far below EventBridge's
256 KiB entry limit, so it never needs a claim check (whose key needs a scope it may not have)."""


class SpecRejected(EventDetail):
    """The starter refused a SpecQueue message: it is not a valid spec, or its ``turn_id`` is taken by
    a different spec. ``turn_id``, ``scope`` and ``user_id`` are what could be read from the message
    (None when unreadable); ``message_id`` is the SQS message's, so the submitter can match it."""

    turn_id: Ulid | None = None  # type: ignore[assignment]  # unreadable in a malformed message
    scope: ConversationScope | NodeScope | None = None  # type: ignore[assignment]
    user_id: UserId | None = None
    message_id: str
    reason: str = Field(max_length=MAX_REJECTION_REASON_CHARS)


class TurnStarted(EventDetail):
    user_id: str
    session_id: str


class TurnCompleted(EventDetail):
    user_id: str
    result: TurnResult


class TurnFailed(EventDetail):
    user_id: str
    error: RunError
    result: TurnResult | None = None


class RunCompleted(EventDetail):
    """The sandbox produced a result (the code may still have failed: see ``status``)."""

    run_id: str
    session_id: str
    user_id: str
    status: str
    code: str = ""
    result_key: str | None = None
    result: dict[str, Any] | None = None


class RunFailed(EventDetail):
    """The platform failed to run the code (the environment crashed or timed out)."""

    run_id: str
    session_id: str
    user_id: str
    code: str = ""
    error: RunError


class ArtifactRegistered(EventDetail):
    user_id: str
    artifact: ArtifactRef
    description: str | None = None


class CitationEmitted(EventDetail):
    user_id: str
    citation: CitationRef


class SessionCreated(EventDetail):
    user_id: str
    session_id: str


class SessionExpired(EventDetail):
    user_id: str
    session_id: str


EVENT_MODELS: dict[str, type[EventDetail]] = {
    model.__name__: model
    for model in (
        SpecSubmitted,
        SpecRejected,
        TurnStarted,
        TurnCompleted,
        TurnFailed,
        RunCompleted,
        RunFailed,
        ArtifactRegistered,
        CitationEmitted,
        SessionCreated,
        SessionExpired,
    )
}
"""detail-type -> detail model."""

EVENT_SOURCES: dict[str, str] = {
    "SpecSubmitted": "alphaagent.client",
    "SpecRejected": "alphaagent.starter",
    "TurnStarted": "alphaagent.turn",
    "TurnCompleted": "alphaagent.turn",
    "TurnFailed": "alphaagent.turn",
    "RunCompleted": "alphaagent.env",
    "RunFailed": "alphaagent.env",
    "ArtifactRegistered": "alphaagent.coder",
    "CitationEmitted": "alphaagent.coder",
    "SessionCreated": "alphaagent.turn",
    "SessionExpired": "alphaagent.turn",
}


class Event(BaseModel):
    """An envelope: what EventBridge calls source, detail-type and detail."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    event_id: str
    source: str
    detail_type: str = Field(alias="detail-type")
    time: datetime = Field(default_factory=utcnow)
    detail: EventDetail

    @classmethod
    def of(cls, detail: EventDetail, event_id: str) -> Event:
        """Wrap a detail with its source and detail-type."""
        name = type(detail).__name__
        return cls(event_id=event_id, source=EVENT_SOURCES[name], detail_type=name, detail=detail)
