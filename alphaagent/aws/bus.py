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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from alphaagent.aws import sdk
from alphaagent.errors import EventPublishError, EventTooLargeError
from alphaagent.models.common import Scope, check_workspace_path
from alphaagent.models.events import EVENT_MODELS, Event

KiB: Final = 1024

MAX_ENTRY_BYTES: Final = 256 * KiB
"""EventBridge's limit on one PutEvents entry (256 KiB), counted as AWS documents it: 14 bytes for the
time, plus the UTF-8 bytes of source, detail-type, detail and each resource."""

CLAIM_CHECK_FOLDER: Final = "work/events"
"""Workspace folder of oversized details: ``work/events/{event_id}.json``."""

RESOURCE_PREFIX: Final = "alphaagent:event:"
"""Prefix of the entry's resource that carries ``event_id``."""

ClaimCheck = Callable[[Scope, str, bytes], None]
"""Stores ``data`` at a workspace ``path`` of a scope: ``S3Workspace.write_bytes`` fits."""


_RETRYABLE_CODES: Final = frozenset(
    {"ThrottlingException", "InternalException", "InternalFailure", "ServiceUnavailable"}
)
"""PutEvents error codes (after botocore's own retries) that are worth another attempt."""


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

    def __init__(self, bus_name: str, *, client: Any = None, claim_check: ClaimCheck | None = None) -> None:
        self.bus_name = bus_name
        self._client = client
        self._claim_check = claim_check

    @property
    def client(self) -> Any:
        """The EventBridge client, created on first use (nothing is created at import or construction)."""
        if self._client is None:
            self._client = sdk.client("events")
        return self._client

    def publish(self, event: Event) -> None:
        """Put ``event`` on the bus as one entry, by claim check if its detail is over 256 KiB.

        Raises:
            EventPublishError: EventBridge reported the entry as failed (``FailedEntryCount`` > 0), or
                PutEvents itself failed with a throttling or internal error after botocore's retries.
                Other client errors (access denied, no such bus) propagate unchanged.
            EventTooLargeError: the detail is too large and there is no claim check.
            PathRuleError: ``event_id`` cannot name a claim-check file.
        """
        entry = self._entry(event, event.detail.model_dump_json())
        if entry_size(entry) > MAX_ENTRY_BYTES:
            entry = self._claim_checked(event, entry)
        try:
            response = self.client.put_events(Entries=[entry])
        except sdk.client_error() as error:
            details: dict[str, Any] = getattr(error, "response", {}).get("Error", {})
            if details.get("Code") not in _RETRYABLE_CODES:
                raise
            failed = {"ErrorCode": details.get("Code"), "ErrorMessage": details.get("Message", "")}
        else:
            if int(response.get("FailedEntryCount", 0)) == 0:
                return
            failed = response.get("Entries", [{}])[0]
        raise EventPublishError(
            f"EventBridge bus {self.bus_name!r} refused {event.detail_type} {event.event_id}: "
            f"{failed.get('ErrorCode') or 'unknown error'}: {failed.get('ErrorMessage') or ''}".rstrip(": ")
        )

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
                f"{event.detail_type} {event.event_id} is {entry_size(entry)} bytes, over EventBridge's "
                f"{MAX_ENTRY_BYTES}-byte entry limit, and the bus has no claim check"
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
