"""Sessions (DESIGN §4.7): one per (user, scope), replaced transparently once expired."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from datetime import datetime

from alphaagent.ids import new_ulid
from alphaagent.models.common import Scope
from alphaagent.models.events import Event, SessionCreated, SessionExpired
from alphaagent.models.records import SESSION_IDLE_TIMEOUT_S, SESSION_MAX_LIFETIME_S, Session
from alphaagent.ports import EventBus, Store


def new_session_id() -> str:
    """192 random bits, URL-safe; never derived from user data (DESIGN §4.1)."""
    return secrets.token_urlsafe(24)


def session_for_turn(
    store: Store,
    bus: EventBus,
    *,
    user_id: str,
    scope: Scope,
    turn_id: str,
    now: datetime,
    idle_timeout_s: int = SESSION_IDLE_TIMEOUT_S,
    max_lifetime_s: int = SESSION_MAX_LIFETIME_S,
    drop_state: Callable[[str], None] | None = None,
) -> tuple[Session, bool]:
    """The user's active session in ``scope``, refreshed; or a new one replacing an expired one.

    Returns ``(session, created)``. An expired session is ended (``SessionExpired``) before its
    replacement is created (``SessionCreated``); its live state is deleted (``drop_state`` with its
    id, DESIGN §4.7), the scope's files are not touched.
    """
    active = store.active_session(user_id, scope.key, now)
    if active is not None:
        store.touch_session(active.session_id, now)
        active.last_used_at = now
        return active, False
    for stale in store.list_sessions(user_id, scope.key):
        if stale.ended_at is None:
            store.end_session(stale.session_id, now)
            if drop_state is not None:
                drop_state(stale.session_id)
            bus.publish(
                Event.of(
                    SessionExpired(
                        turn_id=turn_id, scope=scope, user_id=user_id, session_id=stale.session_id
                    ),
                    new_ulid(),
                )
            )
    session = Session(
        session_id=new_session_id(),
        user_id=user_id,
        scope_key=scope.key,
        created_at=now,
        last_used_at=now,
        idle_timeout_s=idle_timeout_s,
        max_lifetime_s=max_lifetime_s,
    )
    store.create_session(session)
    bus.publish(
        Event.of(
            SessionCreated(turn_id=turn_id, scope=scope, user_id=user_id, session_id=session.session_id),
            new_ulid(),
        )
    )
    return session, True
