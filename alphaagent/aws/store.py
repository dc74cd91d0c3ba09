"""The AWS backend's record store: one DynamoDB table, single-table design (DESIGN §1).

``DynamoStore`` implements ``alphaagent.ports.Store`` with exactly the semantics of the local
``SqliteStore``; where SQLite has a ``WHERE`` clause or a ``UNIQUE`` constraint, DynamoDB has a key
condition or a conditional write.

Table (``create_table`` defines it for tests and local setup; the SAM template declares the same)::

    StateTable:
      Type: AWS::DynamoDB::Table
      Properties:
        BillingMode: PAY_PER_REQUEST
        AttributeDefinitions:
          - {AttributeName: pk, AttributeType: S}
          - {AttributeName: sk, AttributeType: S}
        KeySchema:
          - {AttributeName: pk, KeyType: HASH}
          - {AttributeName: sk, KeyType: RANGE}
        TimeToLiveSpecification: {AttributeName: expires_at_epoch, Enabled: true}
        PointInTimeRecoverySpecification: {PointInTimeRecoveryEnabled: true}

No secondary index: every read is a strongly consistent ``GetItem`` or ``Query``, except
``list_events()`` of the whole log (a ``Scan``, for tests and administration). A role using the store
needs ``dynamodb:GetItem``, ``PutItem``, ``UpdateItem``, ``DeleteItem``, ``Query``, ``Scan`` and
``ConditionCheckItem`` on the table (``TransactWriteItems`` is authorised per contained action).

Items (``u`` user id, ``scope`` scope key, ``tid``/``rid``/``sid``/``cid``/``eid`` ids, ``ns`` the
writer's ``time.time_ns()`` as 20 digits, which keeps registration order)::

    entity            pk                         sk                                  holds
    owner             OWNER#{owner_key}          OWNER                               user_id
    session           USER#{u}#SCOPE#{scope}     SESSION#{created_at}#{sid}          the session's fields
    session pointer   SESSION#{sid}              USER#{u}                            main item's key
    session marker    SESSION#{sid}              SESSION                             main item's key
    turn              USER#{u}#SCOPE#{scope}     TURN#{started_at}#{tid}             status, record
    turn pointer      TURN#{tid}                 USER#{u}                            main item's key
    turn marker       TURN#{tid}                 TURN                                (global id)
    user's scope      USER#{u}                   SCOPE#{scope}                       scope_key (list_scopes)
    run               USER#{u}#SCOPE#{scope}     RUN#{rid}                           record
    run pointer       RUN#{rid}                  USER#{u}                            main item's key
    run marker        RUN#{rid}                  RUN                                 current main key
    artifact counter  SCOPE#{scope}              COUNTER#ARTIFACT#{name}             latest, artifact_id
    artifact version  SCOPE#{scope}              ARTIFACT#{name}#{version:010d}      record
    turn's artifact   TURN#{tid}                 ARTIFACT#{ns}#{scope}#{name}#{v}    record (copy)
    citation marker   CITATION#{cid}             CITATION                            (global id)
    citation          TURN#{tid}                 CITATION#{ns}#{cid}                 record
    lock              LOCK#{scope}               LOCK                                holder, expires_at
    event marker      EVENT#{eid}                EVENT                               (global id)
    event             TURN#{tid}                 EVENT#{time}#{ns}#{eid}             record

Rules, as in the local store:

- **Ownership in the key** (DESIGN §4.7, case ISO-01). Every read that takes a ``user_id`` puts
  ``USER#{u}`` in the key it reads (a pointer ``{ENTITY}#{id}`` / ``USER#{u}``, then the main item in
  the ``USER#{u}#SCOPE#{scope}`` partition), so another user's record is a missing item, answered
  like any missing one. Artifacts are readable by the owner of their scope (as the SQLite join): the
  ``OWNER`` item is read first, and the scope's partition only if it names the user. No read writes.
- **Conditional writes** (case IDEM-01). ``claim_owner``: ``attribute_not_exists`` (first claim
  wins). ``create_turn``: one transaction of marker, pointer and item, the marker under
  ``attribute_not_exists`` (a turn id is global, like an execution name). ``finish_turn``:
  ``#status = :running`` (terminal statuses never regress). Citations and events: a marker per id
  under ``attribute_not_exists``, in the same transaction as the record (idempotent). ``put_run``
  replaces (idempotent on ``run_id``). Artifact versions: one transaction that moves the
  ``(scope, name)`` counter from the version read to the next (``latest = :read`` or
  ``attribute_not_exists``) and puts the version item under ``attribute_not_exists``; a writer that
  lost the race re-reads and retries, so numbers are distinct and gap-free. Locks: put if the item
  does not exist, is expired or is the same holder's; renew and release only by the holder.
- **Sessions expire on read.** DynamoDB's TTL (``expires_at_epoch``) deletes an expired session
  late (typically within days), so ``active_session`` checks ``expires_at`` itself. The pointer and
  marker of a session expire at its maximum lifetime, which no touch extends.
- **Every multi-item write is one transaction**, so no record is ever half-written.
- **Items stay under DynamoDB's 400 KB item limit** (case PER-01). A record whose JSON exceeds
  ``RECORD_BUDGET_BYTES`` (350,000 UTF-8 bytes, leaving room for keys and attributes) is stored with
  its largest strings cut (each cut ends with a marker naming the bytes kept and the original size)
  and, if that is not enough, its largest lists and objects emptied; the item carries
  ``truncated = true`` and ``original_bytes``. A run's ``stdout_truncated``/``stderr_truncated`` are
  set when its streams were cut. The write never fails for size.

Where the two stores differ, by design: TTL eventually deletes a session (main item, pointer and
marker), after which ``get_session`` and ``list_sessions`` no longer return it; records with equal
timestamps are ordered by id (SQLite: by insertion); registration order (``artifacts_of_turn``,
``citations_of_turn``, events with equal times) comes from each writer's clock.

Timestamps are the local store's fixed-width ISO-8601 UTC strings (they compare correctly as text);
a naive datetime is taken to be UTC. The boto3 client is created on first use, never at import.

Example::

    store = DynamoStore("alphaagent-state")
    owner = store.claim_owner("conversations/c1", "user-a", utcnow())   # "user-a"
    store.get_turn("user-b", turn_id)                                   # None: not B's turn
"""

from __future__ import annotations

import copy
import json
import math
import random
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

from alphaagent.aws import sdk
from alphaagent.errors import StoreConflictError, StoreError
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
from alphaagent.models.records import ArtifactVersion, Citation, RunRecord, ScopeSummary, Session, Turn

if TYPE_CHECKING:
    from alphaagent.ports import Store

_Record = TypeVar("_Record", Turn, RunRecord, ArtifactVersion, Citation)

RECORD_BUDGET_BYTES: Final = 350_000
"""Largest serialised record stored as is (UTF-8 bytes): DynamoDB's item limit is 400 KB, and the
keys and other attributes of an item need the rest."""

_MIN_KEPT_BYTES: Final = 1024
"""A string is never cut below this many bytes (UTF-8)."""

VERSION_ATTEMPTS: Final = 64
"""How often ``add_artifact_version`` retries after losing a race for the next number."""

CONFLICT_ATTEMPTS: Final = 8
"""How often a transaction cancelled by a concurrent transaction on the same items is retried."""

TABLE_KEY_SCHEMA: Final[dict[str, Any]] = {
    "AttributeDefinitions": [
        {"AttributeName": "pk", "AttributeType": "S"},
        {"AttributeName": "sk", "AttributeType": "S"},
    ],
    "KeySchema": [
        {"AttributeName": "pk", "KeyType": "HASH"},
        {"AttributeName": "sk", "KeyType": "RANGE"},
    ],
}
"""The state table's key schema (what the SAM template's ``StateTable`` must declare)."""

TTL_ATTRIBUTE: Final = "expires_at_epoch"
"""The table's TTL attribute (Unix seconds): sessions and locks carry it."""


def create_table(client: Any, name: str) -> None:
    """Create the state table ``name`` with its key schema and TTL (for tests and local setup);
    returns when it is active. ``client`` is a boto3 DynamoDB client."""
    client.create_table(TableName=name, BillingMode="PAY_PER_REQUEST", **TABLE_KEY_SCHEMA)
    client.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 60})
    client.update_time_to_live(
        TableName=name, TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE}
    )


class DynamoStore:
    """The record store on the DynamoDB table ``table_name`` (see the module docstring).

    ``client`` is a boto3 DynamoDB client; if omitted, ``boto3.client("dynamodb")`` is created on
    first use (region and credentials from the environment). Safe to share between threads.
    """

    def __init__(self, table_name: str, *, client: Any = None) -> None:
        self._table = table_name
        self._client_value = client
        self._client_lock = threading.Lock()

    @property
    def table_name(self) -> str:
        """The table's name."""
        return self._table

    @property
    def _client(self) -> Any:
        if self._client_value is None:
            with self._client_lock:
                if self._client_value is None:
                    self._client_value = sdk.client("dynamodb")
        return self._client_value

    # ownership

    def claim_owner(self, owner_key: str, user_id: str, now: datetime) -> str:
        """Record ``user_id`` as the owner of ``owner_key`` if it has none, and return the owner:
        the first claim wins, a later claim by anyone returns the first claimant."""
        item = {**_key(f"OWNER#{owner_key}", "OWNER"), "entity": _s("owner"), "user_id": _s(user_id)}
        item["claimed_at"] = _s(iso_utc(now))
        if self._put(item, "attribute_not_exists(pk)"):
            return user_id
        owner = self.owner_of(owner_key)
        if owner is None:  # pragma: no cover - owners are never deleted
            raise StoreError(f"the owner of {owner_key!r} vanished during a claim")
        return owner

    def owner_of(self, owner_key: str) -> str | None:
        """The owner of a conversation or workflow execution, or None if nobody claimed it."""
        item = self._get(f"OWNER#{owner_key}", "OWNER")
        return None if item is None else _str(item, "user_id")

    def record_exists(self, kind: Literal["run", "session"], record_id: str) -> bool:
        """Whether a run or session of that id exists for any user: its marker item (for the probe
        audit only)."""
        marker = {"run": "RUN", "session": "SESSION"}[kind]
        return self._get(f"{marker}#{record_id}", marker) is not None

    # sessions

    def active_session(self, user_id: str, scope_key: str, now: datetime) -> Session | None:
        """The user's most recently created session in the scope that is neither ended nor expired
        at ``now`` (checked here: TTL deletes late), or None. Only reads."""
        moment = as_utc(now)
        for item in self._query(_user_scope(user_id, scope_key), "SESSION#", forward=False):
            session = _session(item)
            if session.is_active(moment):
                return session
        return None

    def create_session(self, session: Session) -> None:
        """Insert a new session. Raises ``StoreError`` if its ``session_id`` exists already."""
        created_at, last_used_at = as_utc(session.created_at), as_utc(session.last_used_at)
        expires_at = session_expires_at(
            created_at, last_used_at, session.idle_timeout_s, session.max_lifetime_s
        )
        main = _key(
            _user_scope(session.user_id, session.scope_key),
            f"SESSION#{iso_utc(created_at)}#{session.session_id}",
        )
        item: dict[str, Any] = {
            **main,
            "entity": _s("session"),
            "session_id": _s(session.session_id),
            "user_id": _s(session.user_id),
            "scope_key": _s(session.scope_key),
            "created_at": _s(iso_utc(created_at)),
            "last_used_at": _s(iso_utc(last_used_at)),
            "idle_timeout_s": _n(session.idle_timeout_s),
            "max_lifetime_s": _n(session.max_lifetime_s),
            "expires_at": _s(iso_utc(expires_at)),
            TTL_ATTRIBUTE: _n(_epoch(expires_at)),
        }
        if session.ended_at is not None:
            item["ended_at"] = _s(iso_utc(session.ended_at))
        lifetime_end = _n(_epoch(created_at + timedelta(seconds=session.max_lifetime_s)))
        links = {"main_pk": main["pk"], "main_sk": main["sk"], TTL_ATTRIBUTE: lifetime_end}
        pk = f"SESSION#{session.session_id}"
        written = self._transact(
            [
                _put(self._table, {**_key(pk, "SESSION"), **links}, "attribute_not_exists(pk)"),
                _put(self._table, {**_key(pk, f"USER#{session.user_id}"), **links}),
                _put(self._table, item),
            ]
        )
        if not written:
            raise StoreError(f"session {session.session_id!r} exists already")

    def touch_session(self, session_id: str, now: datetime) -> None:
        """Set ``last_used_at`` to ``now``, restarting the idle timer (never past the maximum
        lifetime). A no-op for an ended, expired or unknown session, or if ``now`` is not later than
        the current ``last_used_at`` (the timer never goes back)."""
        moment = as_utc(now)
        marker = self._get(f"SESSION#{session_id}", "SESSION")
        if marker is None:
            return
        item = self._get(_str(marker, "main_pk"), _str(marker, "main_sk"))
        if item is None:
            return
        session = _session(item)
        expires_at = session_expires_at(
            as_utc(session.created_at), moment, session.idle_timeout_s, session.max_lifetime_s
        )
        # The condition re-checks what was read, so a concurrent touch or end wins cleanly.
        self._update(
            _key(_str(marker, "main_pk"), _str(marker, "main_sk")),
            f"SET last_used_at = :now, expires_at = :expires, {TTL_ATTRIBUTE} = :epoch",
            "attribute_exists(pk) AND attribute_not_exists(ended_at) "
            "AND last_used_at < :now AND expires_at > :now",
            {
                ":now": _s(iso_utc(moment)),
                ":expires": _s(iso_utc(expires_at)),
                ":epoch": _n(_epoch(expires_at)),
            },
        )

    def end_session(self, session_id: str, ended_at: datetime) -> None:
        """Mark a session ended (it expired). The first end is kept; ending again is a no-op."""
        marker = self._get(f"SESSION#{session_id}", "SESSION")
        if marker is None:
            return
        self._update(
            _key(_str(marker, "main_pk"), _str(marker, "main_sk")),
            "SET ended_at = :ended",
            "attribute_exists(pk) AND attribute_not_exists(ended_at)",
            {":ended": _s(iso_utc(ended_at))},
        )

    def get_session(self, user_id: str, session_id: str) -> Session | None:
        """The session ``session_id`` if it belongs to ``user_id``, else None (expired or not)."""
        item = self._follow(f"SESSION#{session_id}", user_id)
        return None if item is None else _session(item)

    def list_sessions(self, user_id: str, scope_key: str) -> list[Session]:
        """The user's sessions in a scope (ended and expired ones too, until TTL removes them),
        oldest first."""
        return [_session(item) for item in self._query(_user_scope(user_id, scope_key), "SESSION#")]

    # turns

    def create_turn(self, turn: Turn) -> bool:
        """Insert a turn; False if a turn with that id exists already (for any user: a duplicate
        delivery of the same spec, case IDEM-01), in which case nothing is changed."""
        stored = _turn_utc(turn)
        main = _key(
            _user_scope(stored.user_id, stored.scope_key),
            f"TURN#{iso_utc(stored.started_at)}#{stored.turn_id}",
        )
        links = {"main_pk": main["pk"], "main_sk": main["sk"]}
        attributes, _ = _record_attributes("turn", stored)
        pk = f"TURN#{stored.turn_id}"
        return self._transact(
            [
                _put(self._table, {**_key(pk, "TURN"), **links}, "attribute_not_exists(pk)"),
                _put(self._table, {**_key(pk, f"USER#{stored.user_id}"), **links}),
                _put(self._table, {**main, **attributes, "status": _s(stored.status)}),
                # What list_scopes queries (no secondary index): written again by each turn, unchanged.
                _put(
                    self._table,
                    {
                        **_key(f"USER#{stored.user_id}", f"SCOPE#{stored.scope_key}"),
                        "entity": _s("user_scope"),
                        "scope_key": _s(stored.scope_key),
                    },
                ),
            ]
        )

    def finish_turn(self, turn: Turn) -> bool:
        """Store ``turn.status``, ``finished_at`` and ``result`` if the turn (same id and user) is
        still ``running``; False otherwise, leaving the first terminal outcome in place (IDEM-01).

        Raises:
            ValueError: ``turn.status`` is ``running`` (not a terminal status).
        """
        if turn.status == "running":
            raise ValueError("finish_turn needs a terminal status ('completed' or 'failed')")
        pointer = self._get(f"TURN#{turn.turn_id}", f"USER#{turn.user_id}")
        if pointer is None:
            return False
        main = _key(_str(pointer, "main_pk"), _str(pointer, "main_sk"))
        item = self._get(_str(main, "pk"), _str(main, "sk"))
        if item is None:
            return False
        current = Turn.model_validate_json(_str(item, "record"))
        finished = _turn_utc(
            current.model_copy(
                update={"status": turn.status, "finished_at": turn.finished_at, "result": turn.result}
            )
        )
        attributes, _ = _record_attributes("turn", finished)
        return self._update(
            main,
            "SET #status = :status, #record = :record, truncated = :truncated, original_bytes = :bytes",
            "#status = :running",
            {
                ":status": _s(finished.status),
                ":record": attributes["record"],
                ":truncated": attributes["truncated"],
                ":bytes": attributes["original_bytes"],
                ":running": _s("running"),
            },
            names={"#status": "status", "#record": "record"},
        )

    def get_turn(self, user_id: str, turn_id: str) -> Turn | None:
        """The turn ``turn_id`` if it belongs to ``user_id``, else None."""
        item = self._follow(f"TURN#{turn_id}", user_id)
        return None if item is None else Turn.model_validate_json(_str(item, "record"))

    def turn_id_taken(self, turn_id: str) -> bool:
        """True when any user has a turn with this id (turn ids are global idempotency keys)."""
        return self._get(f"TURN#{turn_id}", "TURN") is not None

    def list_turns(self, user_id: str, scope_key: str) -> list[Turn]:
        """The user's turns in a scope, oldest (by ``started_at``) first."""
        items = self._query(_user_scope(user_id, scope_key), "TURN#")
        return [Turn.model_validate_json(_str(item, "record")) for item in items]

    def list_scopes(self, user_id: str) -> list[ScopeSummary]:
        """The scopes ``user_id`` owns and ran turns in, the newest turn first, with the count of the
        user's turns there and the newest one's status, goal and start. The user's ``SCOPE#`` items
        name the scopes; each is listed only if its ``OWNER`` item names the user (as artifacts are
        read), then its turns partition gives the count (``Select=COUNT``) and the newest turn.
        Scopes whose turns were all recorded before the ``SCOPE#`` item existed are not listed."""
        summaries = []
        for item in self._query(f"USER#{user_id}", "SCOPE#"):
            scope_key = _str(item, "scope_key")
            if not self._owns(user_id, scope_key):
                continue
            partition = _user_scope(user_id, scope_key)
            newest = self._query(partition, "TURN#", forward=False, limit=1)
            if not newest:
                continue
            turn = Turn.model_validate_json(_str(newest[0], "record"))
            summaries.append(
                ScopeSummary(
                    scope_key=scope_key,
                    turn_count=self._count(partition, "TURN#"),
                    last_status=turn.status,
                    last_goal=turn.goal,
                    last_started_at=turn.started_at,
                )
            )
        summaries.sort(key=lambda summary: summary.scope_key)
        summaries.sort(key=lambda summary: summary.last_started_at, reverse=True)
        return summaries

    # runs

    def put_run(self, run: RunRecord, *, only_over_failed: bool = False) -> bool:
        """Insert or replace a run record, idempotent on ``run_id`` (the recorder may see the same
        destination record twice); True if written. A replacement under another user or scope moves
        the record. With ``only_over_failed``, the transaction holds only if the run has no record or
        a ``failed`` one (a condition on the run's index item, which carries the status)."""
        stored = run.model_copy(update={"created_at": as_utc(run.created_at)})
        main = _key(_user_scope(stored.user_id, stored.scope_key), f"RUN#{stored.run_id}")
        pk = f"RUN#{stored.run_id}"
        pointer = _key(pk, f"USER#{stored.user_id}")
        links = {"main_pk": main["pk"], "main_sk": main["sk"], "pointer_sk": pointer["sk"]}
        index = {**_key(pk, "RUN"), **links, "run_status": _s(stored.status)}
        guard = (
            ("attribute_not_exists(pk) OR run_status = :failed", {":failed": _s("failed")})
            if only_over_failed
            else (None, None)
        )
        actions = [
            _put(self._table, index, *guard),
            _put(self._table, {**pointer, **links}),
            _put(self._table, {**main, **_record_attributes("run", stored)[0]}),
        ]
        previous = self._get(pk, "RUN")
        if previous is not None and _str(previous, "main_pk") != main["pk"]["S"]:
            actions.append(_delete(self._table, _key(_str(previous, "main_pk"), _str(previous, "main_sk"))))
            if _str(previous, "pointer_sk") != pointer["sk"]["S"]:
                actions.append(_delete(self._table, _key(pk, _str(previous, "pointer_sk"))))
        return self._transact(actions)

    def get_run(self, user_id: str, run_id: str) -> RunRecord | None:
        """The run ``run_id`` if it belongs to ``user_id``, else None."""
        item = self._follow(f"RUN#{run_id}", user_id)
        return None if item is None else RunRecord.model_validate_json(_str(item, "record"))

    def list_runs(self, user_id: str, scope_key: str) -> list[RunRecord]:
        """The user's runs in a scope, oldest (by ``created_at``, then ``run_id``) first."""
        runs = [
            RunRecord.model_validate_json(_str(item, "record"))
            for item in self._query(_user_scope(user_id, scope_key), "RUN#")
        ]
        return sorted(runs, key=lambda run: (run.created_at, run.run_id))

    # artifacts

    def add_artifact_version(self, version: ArtifactVersion) -> ArtifactVersion:
        """Insert the next version of the artifact ``(scope_key, name)`` and return what was stored.

        ``version.version`` is ignored: the number is the latest plus 1 (1 for a new artifact),
        claimed by a conditional transaction, so concurrent registrations from any process get
        distinct, gap-free numbers. ``version.artifact_id`` is used for a new artifact only; later
        versions keep the id of the first.

        Raises:
            StoreConflictError: other writers won the race ``VERSION_ATTEMPTS`` times in a row.
        """
        scope_pk = f"SCOPE#{version.scope_key}"
        counter_key = _key(scope_pk, f"COUNTER#ARTIFACT#{version.name}")
        for attempt in range(VERSION_ATTEMPTS):
            counter = self._get(scope_pk, f"COUNTER#ARTIFACT#{version.name}")
            latest = 0 if counter is None else int(counter["latest"]["N"])
            artifact_id = version.artifact_id if counter is None else _str(counter, "artifact_id")
            stored = version.model_copy(
                update={
                    "artifact_id": artifact_id,
                    "version": latest + 1,
                    "created_at": as_utc(version.created_at),
                }
            )
            attributes, stored = _record_attributes("artifact", stored)
            registered = f"{time.time_ns():020d}"
            counter_update: dict[str, Any] = {
                "Update": {
                    "TableName": self._table,
                    "Key": counter_key,
                    "UpdateExpression": "SET latest = :next, artifact_id = :id, entity = :entity",
                    "ConditionExpression": (
                        "attribute_not_exists(pk)" if counter is None else "latest = :latest"
                    ),
                    "ExpressionAttributeValues": {
                        ":next": _n(stored.version),
                        ":id": _s(artifact_id),
                        ":entity": _s("artifact_counter"),
                        **({} if counter is None else {":latest": _n(latest)}),
                    },
                }
            }
            written = self._transact(
                [
                    counter_update,
                    _put(
                        self._table,
                        {**_key(scope_pk, f"ARTIFACT#{stored.name}#{stored.version:010d}"), **attributes},
                        "attribute_not_exists(pk)",
                    ),
                    _put(
                        self._table,
                        {
                            **_key(
                                f"TURN#{stored.turn_id}",
                                f"ARTIFACT#{registered}#{stored.scope_key}#{stored.name}#{stored.version}",
                            ),
                            **attributes,
                        },
                    ),
                ]
            )
            if written:
                return stored
            # Lost the race: back off a little before reading the counter again.
            time.sleep(_jitter(attempt))
        raise StoreConflictError(
            f"could not register a version of {version.name!r} in {version.scope_key!r}: "
            f"other writers won {VERSION_ATTEMPTS} times in a row"
        )

    def get_artifact(
        self, user_id: str, scope_key: str, name: str, version: int | None
    ) -> ArtifactVersion | None:
        """Version ``version`` (``None`` = the latest) of the artifact ``name`` in ``scope_key``, if
        ``user_id`` owns the scope, else None (also for an unclaimed scope or a malformed key)."""
        if not self._owns(user_id, scope_key):
            return None
        if version is None:
            items = self._query(f"SCOPE#{scope_key}", f"ARTIFACT#{name}#", forward=False, limit=1)
            item = items[0] if items else None
        else:
            item = self._get(f"SCOPE#{scope_key}", f"ARTIFACT#{name}#{version:010d}")
        return None if item is None else ArtifactVersion.model_validate_json(_str(item, "record"))

    def list_artifacts(self, user_id: str, scope_key: str) -> list[ArtifactVersion]:
        """Every version of every artifact in a scope ``user_id`` owns, by name then version; []
        for a scope of another user, an unclaimed scope or a malformed scope key."""
        if not self._owns(user_id, scope_key):
            return []
        versions = [
            ArtifactVersion.model_validate_json(_str(item, "record"))
            for item in self._query(f"SCOPE#{scope_key}", "ARTIFACT#")
        ]
        return sorted(versions, key=lambda stored: (stored.name, stored.version))

    def artifacts_of_turn(self, turn_id: str) -> list[ArtifactVersion]:
        """The versions one turn registered, in registration order (for its turn result)."""
        items = self._query(f"TURN#{turn_id}", "ARTIFACT#")
        return [ArtifactVersion.model_validate_json(_str(item, "record")) for item in items]

    # citations

    def add_citation(self, citation: Citation) -> None:
        """Insert a citation; idempotent on ``citation_id`` (the first record is kept)."""
        stored = citation.model_copy(update={"created_at": as_utc(citation.created_at)})
        registered = f"{time.time_ns():020d}"
        self._transact(
            [
                _put(
                    self._table,
                    {**_key(f"CITATION#{stored.citation_id}", "CITATION"), "turn_id": _s(stored.turn_id)},
                    "attribute_not_exists(pk)",
                ),
                _put(
                    self._table,
                    {
                        **_key(f"TURN#{stored.turn_id}", f"CITATION#{registered}#{stored.citation_id}"),
                        **_record_attributes("citation", stored)[0],
                    },
                ),
            ]
        )

    def citations_of_turn(self, turn_id: str) -> list[Citation]:
        """The citations one turn emitted, in emission order."""
        items = self._query(f"TURN#{turn_id}", "CITATION#")
        return [Citation.model_validate_json(_str(item, "record")) for item in items]

    # locks

    def acquire_lock(self, scope_key: str, holder: str, now: datetime, lease_s: float) -> bool:
        """Take the scope's lease until ``now + lease_s`` (seconds) if it is free, expired, or
        already ``holder``'s (re-acquiring extends it); False if another holder's lease is live.

        Raises:
            ValueError: ``lease_s`` is not positive.
        """
        moment = as_utc(now)
        expires_at = moment + lease_delta(lease_s)
        item = {
            **_key(f"LOCK#{scope_key}", "LOCK"),
            "entity": _s("lock"),
            "holder": _s(holder),
            "expires_at": _s(iso_utc(expires_at)),
            TTL_ATTRIBUTE: _n(_epoch(expires_at)),
        }
        return self._put(
            item,
            "attribute_not_exists(pk) OR holder = :holder OR expires_at <= :now",
            {":holder": _s(holder), ":now": _s(iso_utc(moment))},
        )

    def renew_lock(self, scope_key: str, holder: str, now: datetime, lease_s: float) -> bool:
        """Extend ``holder``'s lease to ``now + lease_s`` (seconds); False if the lease was lost
        (taken over, released, or expired even if nobody has taken it yet).

        Raises:
            ValueError: ``lease_s`` is not positive.
        """
        moment = as_utc(now)
        expires_at = moment + lease_delta(lease_s)
        return self._update(
            _key(f"LOCK#{scope_key}", "LOCK"),
            f"SET expires_at = :expires, {TTL_ATTRIBUTE} = :epoch",
            "holder = :holder AND expires_at > :now",
            {
                ":expires": _s(iso_utc(expires_at)),
                ":epoch": _n(_epoch(expires_at)),
                ":holder": _s(holder),
                ":now": _s(iso_utc(moment)),
            },
        )

    def release_lock(self, scope_key: str, holder: str) -> None:
        """Release the lease if ``holder`` has it; a no-op otherwise (it may have been taken over)."""
        try:
            self._client.delete_item(
                TableName=self._table,
                Key=_key(f"LOCK#{scope_key}", "LOCK"),
                ConditionExpression="holder = :holder",
                ExpressionAttributeValues={":holder": _s(holder)},
            )
        except self._client.exceptions.ConditionalCheckFailedException:
            return

    def lock_holder(self, scope_key: str, now: datetime) -> str | None:
        """The holder of the scope's live lease at ``now`` (it expires after ``now``), or None. One
        strongly consistent ``GetItem``; an expired item that TTL has not deleted yet counts as free."""
        item = self._get(f"LOCK#{scope_key}", "LOCK")
        if item is None or _str(item, "expires_at") <= iso_utc(as_utc(now)):
            return None
        return _str(item, "holder")

    # events

    def append_event(self, event: Event) -> None:
        """Append an event to the log; idempotent on ``event_id`` (the first copy is kept)."""
        document = event_document(event)
        fitted, truncated, size = _fit(document)
        order = f"{document['time']}#{time.time_ns():020d}"
        self._transact(
            [
                _put(
                    self._table,
                    {**_key(f"EVENT#{event.event_id}", "EVENT"), "turn_id": _s(event.detail.turn_id)},
                    "attribute_not_exists(pk)",
                ),
                _put(
                    self._table,
                    {
                        **_key(f"TURN#{event.detail.turn_id}", f"EVENT#{order}#{event.event_id}"),
                        "entity": _s("event"),
                        "event_order": _s(order),
                        "record": _s(json.dumps(fitted)),
                        "truncated": {"BOOL": truncated},
                        "original_bytes": _n(size),
                    },
                ),
            ]
        )

    def list_events(self, turn_id: str | None = None) -> list[Event]:
        """The event log, oldest (by event ``time``, then append order) first, optionally for one
        turn. The whole log is a table scan: meant for tests and administration, not for a turn.

        Raises:
            StoreError: the log holds a detail-type this code has no model for.
        """
        if turn_id is not None:
            items = self._query(f"TURN#{turn_id}", "EVENT#")
        else:
            items = sorted(self._scan_entity("event"), key=lambda item: _str(item, "event_order"))
        return [event_from_json(_str(item, "record")) for item in items]

    # DynamoDB calls

    def _owns(self, user_id: str, scope_key: str) -> bool:
        owner_key = owner_key_of(scope_key)
        return owner_key is not None and self.owner_of(owner_key) == user_id

    def _follow(self, pk: str, user_id: str) -> dict[str, Any] | None:
        """The main item a pointer ``pk`` / ``USER#{user_id}`` names, or None (no such pointer: the
        record is missing or another user's)."""
        pointer = self._get(pk, f"USER#{user_id}")
        return None if pointer is None else self._get(_str(pointer, "main_pk"), _str(pointer, "main_sk"))

    def _get(self, pk: str, sk: str) -> dict[str, Any] | None:
        response = self._client.get_item(TableName=self._table, Key=_key(pk, sk), ConsistentRead=True)
        item: dict[str, Any] | None = response.get("Item")
        return item

    def _query(
        self, pk: str, sk_prefix: str, *, forward: bool = True, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """Items of partition ``pk`` whose sort key starts with ``sk_prefix``, in sort-key order,
        every page (or the first ``limit`` items)."""
        request: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "pk = :pk AND begins_with(sk, :prefix)",
            "ExpressionAttributeValues": {":pk": _s(pk), ":prefix": _s(sk_prefix)},
            "ConsistentRead": True,
            "ScanIndexForward": forward,
        }
        if limit is not None:
            request["Limit"] = limit
        return list(self._pages("query", request, limit))

    def _count(self, pk: str, sk_prefix: str) -> int:
        """How many items of partition ``pk`` have a sort key starting with ``sk_prefix`` (every page)."""
        request: dict[str, Any] = {
            "TableName": self._table,
            "KeyConditionExpression": "pk = :pk AND begins_with(sk, :prefix)",
            "ExpressionAttributeValues": {":pk": _s(pk), ":prefix": _s(sk_prefix)},
            "ConsistentRead": True,
            "Select": "COUNT",
        }
        total = 0
        while True:
            response = self._client.query(**request)
            total += int(response.get("Count", 0))
            last = response.get("LastEvaluatedKey")
            if not last:
                return total
            request["ExclusiveStartKey"] = last

    def _scan_entity(self, entity: str) -> list[dict[str, Any]]:
        request: dict[str, Any] = {
            "TableName": self._table,
            "FilterExpression": "entity = :entity",
            "ExpressionAttributeValues": {":entity": _s(entity)},
            "ConsistentRead": True,
        }
        return list(self._pages("scan", request, None))

    def _pages(self, operation: str, request: dict[str, Any], limit: int | None) -> Iterator[dict[str, Any]]:
        call = getattr(self._client, operation)
        count = 0
        while True:
            response = call(**request)
            for item in response.get("Items", []):
                yield item
                count += 1
                if limit is not None and count >= limit:
                    return
            last = response.get("LastEvaluatedKey")
            if not last:
                return
            request = {**request, "ExclusiveStartKey": last}

    def _put(self, item: dict[str, Any], condition: str, values: dict[str, Any] | None = None) -> bool:
        """Put ``item`` if ``condition`` holds; False if it did not."""
        request: dict[str, Any] = {"TableName": self._table, "Item": item, "ConditionExpression": condition}
        if values:
            request["ExpressionAttributeValues"] = values
        try:
            self._client.put_item(**request)
        except self._client.exceptions.ConditionalCheckFailedException:
            return False
        return True

    def _update(
        self,
        key: dict[str, Any],
        update: str,
        condition: str,
        values: dict[str, Any],
        *,
        names: dict[str, str] | None = None,
    ) -> bool:
        """Update the item ``key`` if ``condition`` holds; False if it did not."""
        request: dict[str, Any] = {
            "TableName": self._table,
            "Key": key,
            "UpdateExpression": update,
            "ConditionExpression": condition,
            "ExpressionAttributeValues": values,
        }
        if names:
            request["ExpressionAttributeNames"] = names
        try:
            self._client.update_item(**request)
        except self._client.exceptions.ConditionalCheckFailedException:
            return False
        return True

    def _transact(self, actions: list[dict[str, Any]]) -> bool:
        """Write ``actions`` in one transaction; False if one of their conditions failed (nothing
        was written). A transaction cancelled only because another one touched the same items
        (``TransactionConflict``) is retried, up to ``CONFLICT_ATTEMPTS`` times with jitter.

        Raises:
            StoreConflictError: the transaction kept conflicting with others.
        """
        for attempt in range(CONFLICT_ATTEMPTS):
            try:
                self._client.transact_write_items(TransactItems=actions)
            except self._client.exceptions.TransactionCanceledException as error:
                reasons = [reason.get("Code") for reason in error.response.get("CancellationReasons", [])]
                if "ConditionalCheckFailed" in reasons:
                    return False
                if "TransactionConflict" not in reasons or set(reasons) - {"None", "TransactionConflict"}:
                    raise
                time.sleep(_jitter(attempt))
                continue
            return True
        raise StoreConflictError(
            f"a write to {self._table} conflicted with other transactions {CONFLICT_ATTEMPTS} times in a row"
        )


def _jitter(attempt: int) -> float:
    """A random pause before retry ``attempt`` (seconds): full jitter, growing to at most 50 ms."""
    return random.uniform(0, min(0.05, 0.002 * (attempt + 1)))  # noqa: S311 - jitter, not secrets


def _s(value: str) -> dict[str, str]:
    return {"S": value}


def _n(value: int) -> dict[str, str]:
    return {"N": str(value)}


def _str(item: dict[str, Any], name: str) -> str:
    return str(item[name]["S"])


def _key(pk: str, sk: str) -> dict[str, Any]:
    return {"pk": _s(pk), "sk": _s(sk)}


def _put(
    table: str, item: dict[str, Any], condition: str | None = None, values: dict[str, Any] | None = None
) -> dict[str, Any]:
    put: dict[str, Any] = {"TableName": table, "Item": item}
    if condition is not None:
        put["ConditionExpression"] = condition
    if values:
        put["ExpressionAttributeValues"] = values
    return {"Put": put}


def _delete(table: str, key: dict[str, Any]) -> dict[str, Any]:
    return {"Delete": {"TableName": table, "Key": key}}


def _user_scope(user_id: str, scope_key: str) -> str:
    return f"USER#{user_id}#SCOPE#{scope_key}"


def _epoch(moment: datetime) -> int:
    """Unix seconds, rounded up (TTL never deletes before the moment)."""
    return math.ceil(as_utc(moment).timestamp())


def _turn_utc(turn: Turn) -> Turn:
    return turn.model_copy(
        update={
            "started_at": as_utc(turn.started_at),
            "finished_at": None if turn.finished_at is None else as_utc(turn.finished_at),
        }
    )


def _session(item: dict[str, Any]) -> Session:
    return Session(
        session_id=_str(item, "session_id"),
        user_id=_str(item, "user_id"),
        scope_key=_str(item, "scope_key"),
        created_at=from_iso(_str(item, "created_at")),
        last_used_at=from_iso(_str(item, "last_used_at")),
        idle_timeout_s=int(item["idle_timeout_s"]["N"]),
        max_lifetime_s=int(item["max_lifetime_s"]["N"]),
        ended_at=from_iso(_str(item, "ended_at")) if "ended_at" in item else None,
    )


def _record_attributes(entity: str, record: _Record) -> tuple[dict[str, Any], _Record]:
    """``(attributes, stored record)``: the ``record`` attribute (the model as JSON, fitted to
    ``RECORD_BUDGET_BYTES``) with its ``entity``, ``truncated`` and ``original_bytes`` attributes,
    and the model as stored (what a read will return)."""
    document = record.model_dump(mode="json")
    fitted, truncated, size = _fit(document)
    if truncated and isinstance(record, RunRecord):
        for stream in ("stdout", "stderr"):
            if fitted.get(stream) != document[stream]:
                fitted[f"{stream}_truncated"] = True
    # Validated again so that what is stored is always a readable record.
    stored = type(record).model_validate(fitted)
    attributes = {
        "entity": _s(entity),
        "record": _s(stored.model_dump_json()),
        "truncated": {"BOOL": truncated},
        "original_bytes": _n(size),
    }
    return attributes, stored


def _json_size(document: Any) -> int:
    return len(json.dumps(document, ensure_ascii=False).encode("utf-8"))


def _fit(document: dict[str, Any]) -> tuple[dict[str, Any], bool, int]:
    """``(document fitted to RECORD_BUDGET_BYTES, whether it was cut, original size in bytes)``.

    The largest strings are cut first (never below ``_MIN_KEPT_BYTES``; each cut ends with a marker
    naming the bytes kept and the original size), then the largest lists and objects are emptied.
    """
    size = _json_size(document)
    if size <= RECORD_BUDGET_BYTES:
        return document, False, size
    fitted = copy.deepcopy(document)
    while (current := _json_size(fitted)) > RECORD_BUDGET_BYTES:
        strings = [
            (len(value.encode("utf-8")), parent, key)
            for parent, key, value in _leaves(fitted)
            if isinstance(value, str) and len(value.encode("utf-8")) > 2 * _MIN_KEPT_BYTES
        ]
        if not strings:
            break
        length, parent, key = max(strings, key=lambda entry: entry[0])
        keep = max(_MIN_KEPT_BYTES, length - (current - RECORD_BUDGET_BYTES) - 512)
        kept = parent[key].encode("utf-8")[:keep].decode("utf-8", errors="ignore")
        parent[key] = f"{kept}\n[truncated by the store: {keep} of {length} bytes kept]"
    while _json_size(fitted) > RECORD_BUDGET_BYTES:
        # Lists first (every list of our records may be empty), then objects (free-form ones such
        # as an artifact's metadata or a run result may be).
        containers = [
            (isinstance(value, list), _json_size(value), parent, key)
            for parent, key, value in _leaves(fitted)
            if isinstance(value, dict | list) and value
        ]
        if not containers:  # pragma: no cover - every record's fixed fields are small
            raise StoreError(f"a record of {size} bytes cannot be fitted into a DynamoDB item")
        _, _, parent, key = max(containers, key=lambda entry: (entry[0], entry[1]))
        parent[key] = {} if isinstance(parent[key], dict) else []
    return fitted, True, size


def _leaves(node: Any) -> Iterator[tuple[Any, Any, Any]]:
    """Every ``(parent, key, value)`` below ``node`` (dict keys and list indexes), depth first."""
    entries: list[tuple[Any, Any]] = (
        list(node.items())
        if isinstance(node, dict)
        else list(enumerate(node))
        if isinstance(node, list)
        else []
    )
    for key, value in entries:
        yield node, key, value
        yield from _leaves(value)


if TYPE_CHECKING:
    # mypy proves here that DynamoStore satisfies the Store Protocol.
    _STORE_PROTOCOL_CHECK: type[Store] = DynamoStore
