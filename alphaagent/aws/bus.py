"""The AWS backend's event bus: ``alphaagent.ports.EventBus`` on an EventBridge custom bus (DESIGN §1,
§4.8).

Each ``Event`` becomes one PutEvents entry: ``Source`` = ``event.source``, ``DetailType`` =
``event.detail_type``, ``Detail`` = the detail model as JSON, ``Time`` = ``event.time``, and
``Resources`` = ``["alphaagent:event:{event_id}"]`` (the only place an entry can carry our id without
changing the detail's contract; ``event_from_eventbridge`` reads it back).

**Claim check.** EventBridge refuses an entry over 256 KiB. A larger detail is written to the scope's
workspace at ``work/events/{event_id}.json`` (key ``{scope.key}/work/events/{event_id}.json``) and the
entry carries only ``{"claim_check": key, "schema_version", "turn_id", "scope"}``, so every rule that
matches on the fields every detail has still matches.

**Subscribers.** On AWS, subscribers are EventBridge rules (the recorder Lambda, the spec queue, the
lock release), declared in ``template.yaml``; ``subscribe`` raises ``NotImplementedError`` rather than
call a handler in-process, which would record every event twice.

Example::

    workspace = S3Workspace(bucket)
    bus = EventBridgeBus("alphaagent", claim_check=workspace.write_bytes)
    bus.publish(Event.of(detail, new_ulid()))
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from pydantic import BaseModel, ConfigDict, Field

from alphaagent.aws import sdk
from alphaagent.errors import (
    EventPublishError,
    EventRejectedError,
    EventTooLargeError,
)
from alphaagent.models.common import Scope, check_workspace_path
from alphaagent.models.events import EVENT_MODELS, Event

KiB: Final = 1024
MiB: Final = 1024 * KiB

MAX_ENTRY_BYTES: Final = 256 * KiB
"""EventBridge's documented limit on one PutEvents entry (256 KiB; AWS, "Calculating Amazon
EventBridge PutEvents event entry size"), counted as AWS documents it: 14 bytes for the time, plus the
UTF-8 bytes of source, detail-type, detail and each resource. The default of ``BusLimits``."""

MAX_CONFIGURABLE_ENTRY_BYTES: Final = 1 * MiB
"""The most ``BusLimits.max_entry_bytes`` may be set to: 1 MiB, EventBridge's larger event payload
limit where the account and Region have it (AWS, EventBridge quotas). Above it an entry is always
refused, so a larger setting could only turn a claim check into a failure."""


class BusLimits(BaseModel):
    """The bus's size limit and its retry of failed entries (``EVENT_BUS_*`` settings).

    ``max_entry_bytes``: a detail whose entry is larger goes by claim check (default 256 KiB, at most
    1 MiB: see ``MAX_ENTRY_BYTES`` and ``MAX_CONFIGURABLE_ENTRY_BYTES``). ``max_attempts``: PutEvents
    calls per event for throttling and internal errors (botocore retries a failed *call* itself, but
    not an entry that a successful call reports as failed). ``base_delay_s``/``max_delay_s``: the
    exponential backoff with full jitter between attempts: a random delay in
    ``[0, min(max_delay_s, base_delay_s * 2 ** attempt)]`` (AWS Architecture Blog, "Exponential
    Backoff And Jitter").
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_entry_bytes: int = Field(MAX_ENTRY_BYTES, ge=1 * KiB, le=MAX_CONFIGURABLE_ENTRY_BYTES)
    max_attempts: int = Field(5, ge=1, le=20)
    base_delay_s: float = Field(0.1, ge=0, le=10)
    max_delay_s: float = Field(2.0, ge=0, le=60)


CLAIM_CHECK_FOLDER: Final = "work/events"
"""Workspace folder of oversized details: ``work/events/{event_id}.json``."""

RESOURCE_PREFIX: Final = "alphaagent:event:"
"""Prefix of the entry's resource that carries ``event_id``."""

ClaimCheck = Callable[[Scope, str, bytes], None]
"""Stores ``data`` at a workspace ``path`` of a scope: ``S3Workspace.write_bytes`` fits."""


_RETRYABLE_CODES: Final = frozenset(
    {"ThrottlingException", "InternalException", "InternalFailure", "ServiceUnavailable"}
)
"""PutEvents error codes that are worth another attempt: throttling and EventBridge's internal
failures. Every other code (``ValidationException``, ``InvalidArgument``, ``MalformedDetail``,
``AccessDeniedException``, ``NotAuthorizedForSourceException``, ...) fails the same way again."""


def entry_size(entry: dict[str, Any]) -> int:
    """The size EventBridge counts for one PutEvents entry, in bytes (AWS, "Calculating PutEvents
    event entry size"): 14 for ``Time`` if present, plus the UTF-8 bytes of ``Source``, ``DetailType``,
    ``Detail`` and each of ``Resources``."""
    size = 14 if "Time" in entry else 0
    for name in ("Source", "DetailType", "Detail"):
        if name in entry:
            size += len(str(entry[name]).encode("utf-8"))
    size += sum(len(resource.encode("utf-8")) for resource in entry.get("Resources", []))
    return size


class EventBridgeBus:
    """``alphaagent.ports.EventBus`` on the EventBridge bus ``bus_name``.

    Args:
        bus_name: the custom bus's name or ARN (``EVENT_BUS_NAME``).
        client: a boto3 ``events`` client; created on first use when None.
        claim_check: stores an oversized detail in the scope's workspace (``S3Workspace.write_bytes``);
            without one, such a detail raises ``EventTooLargeError``.
    """

    def __init__(
        self,
        bus_name: str,
        *,
        client: Any = None,
        claim_check: ClaimCheck | None = None,
        limits: BusLimits | None = None,
        sleep: Callable[[float], None] = time.sleep,
        jitter: Callable[[float, float], float] = random.uniform,
    ) -> None:
        self.bus_name = bus_name
        self.limits = limits or BusLimits()
        self._client = client
        self._claim_check = claim_check
        self._sleep = sleep
        self._jitter = jitter

    @property
    def client(self) -> Any:
        """The EventBridge client, created on first use (nothing is created at import or construction)."""
        if self._client is None:
            self._client = sdk.client("events")
        return self._client

    def publish(self, event: Event) -> None:
        """Put ``event`` on the bus as one entry, by claim check if its entry is over
        ``limits.max_entry_bytes``. An entry refused for throttling or an internal error is sent again
        with backoff and jitter, up to ``limits.max_attempts`` calls; any other refusal fails at once.

        Raises:
            EventPublishError: EventBridge refused the entry with a retryable code on every attempt
                (the message names the event, the code and the number of attempts).
            EventRejectedError: EventBridge refused the entry for a reason another attempt cannot fix
                (a validation error: the entry's ``ErrorCode``/``ErrorMessage``).
            EventTooLargeError: the detail is too large and there is no claim check.
            PathRuleError: ``event_id`` cannot name a claim-check file.
            Other client errors of the call itself (access denied, no such bus) propagate unchanged.
        """
        entry = self._entry(event, event.detail.model_dump_json())
        if entry_size(entry) > self.limits.max_entry_bytes:
            entry = self._claim_checked(event, entry)
        attempts = self.limits.max_attempts
        for attempt in range(attempts):
            failed = self._put(entry)
            if failed is None:
                return
            code = failed.get("ErrorCode") or "unknown error"
            said = f"{event.detail_type} {event.event_id}: {code}: {failed.get('ErrorMessage') or ''}".rstrip(
                ": "
            )
            if code not in _RETRYABLE_CODES:
                raise EventRejectedError(f"EventBridge bus {self.bus_name!r} rejected {said}")
            if attempt + 1 < attempts:
                ceiling = min(self.limits.max_delay_s, self.limits.base_delay_s * 2**attempt)
                self._sleep(self._jitter(0.0, ceiling))
        raise EventPublishError(
            f"EventBridge bus {self.bus_name!r} refused {said} ({attempts} attempt{'s' * (attempts > 1)})"
        )

    def _put(self, entry: dict[str, Any]) -> dict[str, Any] | None:
        """One PutEvents call of ``entry``: None if accepted, else the failure as ``{"ErrorCode",
        "ErrorMessage"}`` (a failed entry, or a retryable error of the call itself)."""
        try:
            response = self.client.put_events(Entries=[entry])
        except sdk.client_error() as error:
            details: dict[str, Any] = getattr(error, "response", {}).get("Error", {})
            if details.get("Code") not in _RETRYABLE_CODES:
                raise
            return {"ErrorCode": details.get("Code"), "ErrorMessage": details.get("Message", "")}
        if int(response.get("FailedEntryCount", 0)) == 0:
            return None
        failed: dict[str, Any] = response.get("Entries", [{}])[0]
        return failed

    def subscribe(self, handler: Callable[[Event], None]) -> None:
        """Not available on AWS: subscribers are EventBridge rules declared in ``template.yaml``.

        Raises:
            NotImplementedError: always, naming the alternative.
        """
        raise NotImplementedError(
            "on AWS, subscribers are EventBridge rules on the bus (see template.yaml), not in-process "
            "handlers; route the events to a Lambda, SQS or Step Functions target instead"
        )

    def _entry(self, event: Event, detail: str) -> dict[str, Any]:
        return {
            "EventBusName": self.bus_name,
            "Source": event.source,
            "DetailType": event.detail_type,
            "Detail": detail,
            "Time": event.time,
            "Resources": [f"{RESOURCE_PREFIX}{event.event_id}"],
        }

    def _claim_checked(self, event: Event, entry: dict[str, Any]) -> dict[str, Any]:
        if self._claim_check is None:
            raise EventTooLargeError(
                f"{event.detail_type} {event.event_id} is {entry_size(entry)} bytes, over the bus's "
                f"{self.limits.max_entry_bytes}-byte entry limit, and the bus has no claim check"
            )
        scope = event.detail.scope
        path = check_workspace_path(f"{CLAIM_CHECK_FOLDER}/{event.event_id}.json", prefix=f"{scope.key}/")
        self._claim_check(scope, path, entry["Detail"].encode("utf-8"))
        pointer = {
            "claim_check": f"{scope.key}/{path}",
            **event.detail.model_dump(mode="json", include={"schema_version", "turn_id", "scope"}),
        }
        return self._entry(event, json.dumps(pointer))


def event_from_eventbridge(message: dict[str, Any], *, fetch: Callable[[str], bytes] | None = None) -> Event:
    """Rebuild the ``Event`` from an EventBridge event as a rule target receives it (``source``,
    ``detail-type``, ``time``, ``resources``, ``detail``), following a claim check with ``fetch`` (the
    bytes stored under a bucket key).

    The ``event_id`` is the one ``EventBridgeBus`` put in ``resources``; an event from another publisher
    keeps EventBridge's ``id``. ``time`` has EventBridge's resolution of one second.

    Raises:
        KeyError: the ``detail-type`` is not one of ``EVENT_MODELS``.
        ValueError: a claim-checked detail and no ``fetch``; or a detail that fails its model.
    """
    model = EVENT_MODELS[message["detail-type"]]
    detail = message["detail"]
    if "claim_check" in detail:
        if fetch is None:
            raise ValueError(f"the detail is in the claim check {detail['claim_check']!r}: pass fetch")
        parsed = model.model_validate_json(fetch(detail["claim_check"]))
    else:
        parsed = model.model_validate(detail)
    ids = [
        item[len(RESOURCE_PREFIX) :]
        for item in message.get("resources", [])
        if item.startswith(RESOURCE_PREFIX)
    ]
    return Event.model_validate(
        {
            "event_id": ids[0] if ids else message["id"],
            "source": message["source"],
            "detail-type": message["detail-type"],
            "time": message["time"],
            "detail": parsed,
        }
    )


if TYPE_CHECKING:
    from alphaagent.ports import EventBus

    # mypy proves here that EventBridgeBus satisfies the EventBus Protocol.
    _BUS_PROTOCOL_CHECK: type[EventBus] = EventBridgeBus
