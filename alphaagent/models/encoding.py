"""How both record stores (SQLite and DynamoDB) encode times, leases and events, so that the two
keep the same formats and comparisons.

Times are stored as fixed-width ISO-8601 UTC text (``iso_utc``): comparing two as strings compares
the moments, which both stores rely on for lease and session expiry in their queries and conditions.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from alphaagent.errors import StoreError
from alphaagent.models.common import scope_from_key
from alphaagent.models.events import EVENT_MODELS, Event


def as_utc(moment: datetime) -> datetime:
    """``moment`` as an aware UTC datetime (a naive one is taken to be UTC already)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def iso_utc(moment: datetime) -> str:
    """Fixed-width ISO-8601 UTC text, so that comparing two of them as strings compares the times."""
    return as_utc(moment).isoformat(timespec="microseconds")


def from_iso(text: str) -> datetime:
    """The datetime ``iso_utc`` wrote."""
    return datetime.fromisoformat(text)


def lease_delta(lease_s: float) -> timedelta:
    """A lease of ``lease_s`` seconds; raises ``ValueError`` unless it is positive."""
    if not lease_s > 0:
        raise ValueError(f"lease_s must be a positive number of seconds, got {lease_s!r}")
    return timedelta(seconds=lease_s)


def session_expires_at(
    created_at: datetime, last_used_at: datetime, idle_timeout_s: int, max_lifetime_s: int
) -> datetime:
    """When a session expires (DESIGN §4.7): idle timeout or maximum lifetime, whichever is first."""
    return min(
        last_used_at + timedelta(seconds=idle_timeout_s), created_at + timedelta(seconds=max_lifetime_s)
    )


def owner_key_of(scope_key: str) -> str | None:
    """The ownership key of a scope key (the conversation, or the workflow execution), or None."""
    try:
        return scope_from_key(scope_key).owner_key
    except ValueError:
        return None


def event_document(event: Event) -> dict[str, Any]:
    """The event as the log stores it: ``{event_id, source, detail-type, time, detail}``."""
    return {
        "event_id": event.event_id,
        "source": event.source,
        "detail-type": event.detail_type,
        "time": iso_utc(event.time),
        # Dumped from the detail itself: through the envelope, pydantic would serialise the declared
        # base class (EventDetail) and drop the subclass's fields.
        "detail": event.detail.model_dump(mode="json"),
    }


def event_from_json(text: str) -> Event:
    """The event of an ``event_document`` as JSON, its detail typed by its detail-type.

    Raises:
        StoreError: the detail-type is not one of ours.
    """
    document = json.loads(text)
    model = EVENT_MODELS.get(document["detail-type"])
    if model is None:
        raise StoreError(f"the event log holds an unknown detail-type {document['detail-type']!r}")
    return Event.model_validate({**document, "detail": model.model_validate(document["detail"])})
