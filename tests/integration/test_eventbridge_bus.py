"""Behaviour of the EventBridge bus under moto (DESIGN §4.8): every event type arrives through a rule
(pointed at an SQS queue, DESIGN §6) exactly as published, oversized details go by claim check, and a
refused entry is a retryable error naming the failure."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from moto_account import MotoAccount

from alphaagent.aws.bus import (
    MAX_CONFIGURABLE_ENTRY_BYTES,
    MAX_ENTRY_BYTES,
    BusLimits,
    EventBridgeBus,
    event_from_eventbridge,
)
from alphaagent.aws.workspace import S3Workspace, workspaces_bucket_name
from alphaagent.errors import EventPublishError, EventRejectedError, EventTooLargeError, RetryableError
from alphaagent.ids import new_ulid
from alphaagent.models.common import ConversationScope, NodeScope
from alphaagent.models.events import (
    EVENT_MODELS,
    EVENT_SOURCES,
    ArtifactRegistered,
    CitationEmitted,
    Event,
    EventDetail,
    RunCompleted,
    RunFailed,
    SessionCreated,
    SessionExpired,
    SpecRejected,
    SpecSubmitted,
    TurnCompleted,
    TurnFailed,
    TurnStarted,
)
from alphaagent.models.records import ArtifactRef, CitationRef, TurnResult
from alphaagent.models.run import RunError

REGION = "us-east-1"
BUS = "alphaagent"
BUCKET = workspaces_bucket_name("123456789012", REGION)
TURN = new_ulid()
SCOPE = ConversationScope(conversation_id="c1")
NODE = NodeScope(workflow_execution_id="wf1", node_id="n1")
ERROR = RunError(name="ZeroDivisionError", value="division by zero", traceback="Traceback ...")
ARTIFACT = ArtifactRef(
    artifact_id="a1",
    kind="chart",
    name="plot",
    version=1,
    path="charts/plot.png",
    sha256="0" * 64,
    size_bytes=3,
)


def sample_details() -> list[EventDetail]:
    """One detail of every event type (DESIGN §4.8), in a conversation and in a workflow node."""
    common: dict[str, Any] = {"turn_id": TURN, "scope": SCOPE}
    return [
        SpecSubmitted(**common, spec={"spec_version": 1, "goal": "count rows"}),
        SpecRejected(**common, user_id="u1", message_id="m-1", reason="turn_id: already used"),
        TurnStarted(**common, user_id="u1", session_id="s" * 32),
        TurnCompleted(**common, user_id="u1", result=TurnResult(turn_id=TURN, status="completed")),
        TurnFailed(**common, user_id="u1", error=ERROR),
        RunCompleted(**common, run_id=new_ulid(), session_id="s" * 32, user_id="u1", status="ok"),
        RunFailed(**common, run_id=new_ulid(), session_id="s" * 32, user_id="u1", error=ERROR),
        ArtifactRegistered(turn_id=TURN, scope=NODE, user_id="u1", artifact=ARTIFACT),
        CitationEmitted(**common, user_id="u1", citation=CitationRef(citation_id="c1", source="docs/a.pdf")),
        SessionCreated(**common, user_id="u1", session_id="s" * 32),
        SessionExpired(**common, user_id="u1", session_id="s" * 32),
    ]


def to_the_second(event: Event) -> Event:
    """The event as EventBridge keeps it: its ``time`` has a resolution of one second."""
    return event.model_copy(update={"time": event.time.replace(microsecond=0)})


class Aws:
    """The moto account of one test: the bus, a rule sending every alphaagent event to a queue, and the
    workspaces bucket."""

    def __init__(self) -> None:
        import boto3

        self.events = boto3.client("events", region_name=REGION)
        self.sqs = boto3.client("sqs", region_name=REGION)
        self.s3 = boto3.client("s3", region_name=REGION)
        self.events.create_event_bus(Name=BUS)
        self.queue_url = self.sqs.create_queue(QueueName="alphaagent-events")["QueueUrl"]
        queue_arn = self.sqs.get_queue_attributes(QueueUrl=self.queue_url, AttributeNames=["QueueArn"])[
            "Attributes"
        ]["QueueArn"]
        self.events.put_rule(
            Name="all-alphaagent-events",
            EventBusName=BUS,
            EventPattern=json.dumps({"source": [{"prefix": "alphaagent."}]}),
        )
        self.events.put_targets(
            Rule="all-alphaagent-events", EventBusName=BUS, Targets=[{"Id": "queue", "Arn": queue_arn}]
        )
        self.s3.create_bucket(Bucket=BUCKET)

    def received(self) -> list[dict[str, Any]]:
        """Every EventBridge event the rule delivered to the queue so far."""
        messages: list[dict[str, Any]] = []
        while batch := self.sqs.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=10).get(
            "Messages", []
        ):
            for message in batch:
                messages.append(json.loads(message["Body"]))
                self.sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"])
        return messages

    def fetch(self, key: str) -> bytes:
        body: bytes = self.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        return body


@pytest.fixture
def aws_region() -> str:
    return REGION


@pytest.fixture
def aws(moto: MotoAccount) -> Aws:
    return Aws()


@pytest.fixture
def workspace(aws: Aws, tmp_path: Path) -> S3Workspace:
    return S3Workspace(BUCKET, client=aws.s3, local_dir=tmp_path)


def test_every_event_type_arrives_through_a_rule_as_published(aws: Aws) -> None:
    # Given a bus with a rule routing alphaagent.* events to a queue, and one event of every type
    bus = EventBridgeBus(BUS, client=aws.events)
    events = [Event.of(detail, new_ulid()) for detail in sample_details()]
    assert {event.detail_type for event in events} == set(EVENT_MODELS)

    # When each is published
    for event in events:
        bus.publish(event)

    # Then each arrives once with its source, detail-type and detail, and rebuilds to the same Event
    received = {message["detail-type"]: message for message in aws.received()}
    assert set(received) == set(EVENT_MODELS)
    for event in events:
        message = received[event.detail_type]
        assert message["source"] == EVENT_SOURCES[event.detail_type]
        assert message["detail"] == event.detail.model_dump(mode="json")
        assert {"schema_version", "turn_id", "scope"} <= set(message["detail"])
        assert event_from_eventbridge(message) == to_the_second(event)


def test_an_oversized_detail_goes_by_claim_check(aws: Aws, workspace: S3Workspace) -> None:
    # Given a RunCompleted whose result is larger than EventBridge's 256 KiB entry limit
    bus = EventBridgeBus(BUS, client=aws.events, claim_check=workspace.write_bytes)
    detail = RunCompleted(
        turn_id=TURN,
        scope=SCOPE,
        run_id=new_ulid(),
        session_id="s" * 32,
        user_id="u1",
        status="ok",
        code="print('x' * 300_000)",
        result={"stdout": "x" * 300_000},
    )
    event = Event.of(detail, new_ulid())
    assert len(detail.model_dump_json()) > MAX_ENTRY_BYTES

    # When it is published
    bus.publish(event)

    # Then the full detail is stored at {scope.key}/work/events/{event_id}.json, and the event carries
    # the key plus the fields every detail has, so rules on turn and scope still match
    key = f"conversations/c1/work/events/{event.event_id}.json"
    assert RunCompleted.model_validate_json(aws.fetch(key)) == detail
    (message,) = aws.received()
    assert message["detail-type"] == "RunCompleted"
    assert message["detail"] == {
        "claim_check": key,
        "schema_version": 1,
        "turn_id": TURN,
        "scope": {"conversation_id": "c1"},
    }
    assert event_from_eventbridge(message, fetch=aws.fetch) == to_the_second(event)


def test_an_oversized_detail_without_a_claim_check_is_refused_before_any_put(aws: Aws) -> None:
    # Given a bus without a claim check and a detail over 256 KiB
    bus = EventBridgeBus(BUS, client=aws.events)
    event = Event.of(
        SpecSubmitted(turn_id=TURN, scope=SCOPE, spec={"goal": "x" * (MAX_ENTRY_BYTES + 1)}), new_ulid()
    )

    # When it is published
    # Then it is refused with an error naming the limit, and nothing reaches the bus
    with pytest.raises(EventTooLargeError, match=str(MAX_ENTRY_BYTES)):
        bus.publish(event)
    assert aws.received() == []


class FailingEvents:
    """An EventBridge client whose PutEvents accepts the request but refuses every entry, as EventBridge
    does under throttling (HTTP 200, ``FailedEntryCount`` > 0)."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []

    def put_events(self, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        self.entries.extend(Entries)
        return {
            "FailedEntryCount": len(Entries),
            "Entries": [
                {"ErrorCode": "ThrottlingException", "ErrorMessage": "Rate exceeded"} for _ in Entries
            ],
        }


def test_a_refused_entry_raises_a_retryable_error_naming_the_failure() -> None:
    # Given EventBridge that refuses the entry
    client = FailingEvents()
    bus = EventBridgeBus(BUS, client=client)
    event = Event.of(SessionCreated(turn_id=TURN, scope=SCOPE, user_id="u1", session_id="s" * 32), new_ulid())

    # When an event is published
    # Then the publisher gets a RetryableError naming the event, the error code and the message
    with pytest.raises(EventPublishError) as caught:
        bus.publish(event)
    assert isinstance(caught.value, RetryableError)
    message = str(caught.value)
    assert "ThrottlingException" in message and "Rate exceeded" in message
    assert event.event_id in message and "SessionCreated" in message
    assert client.entries[0]["EventBusName"] == BUS
    assert client.entries[0]["Time"] == event.time


class ThrottledEvents:
    """An EventBridge client whose PutEvents keeps failing with throttling (after botocore's retries)."""

    def put_events(self, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        from botocore.exceptions import ClientError

        raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}, "PutEvents")


def test_a_throttled_put_is_a_retryable_error_too() -> None:
    # Given EventBridge that throttles the request itself
    bus = EventBridgeBus(BUS, client=ThrottledEvents())
    event = Event.of(SessionExpired(turn_id=TURN, scope=SCOPE, user_id="u1", session_id="s" * 32), new_ulid())

    # When an event is published
    # Then the publisher gets the same RetryableError, naming the code
    with pytest.raises(EventPublishError, match="ThrottlingException: Rate exceeded"):
        bus.publish(event)


def test_subscribing_in_process_is_refused_with_the_aws_way_named() -> None:
    # Given an EventBridge bus (no client is created for this)
    bus = EventBridgeBus(BUS)

    # When a handler subscribes
    # Then it is told that subscribers are EventBridge rules
    with pytest.raises(NotImplementedError, match="EventBridge rules"):
        bus.subscribe(lambda event: None)


def test_the_event_time_is_the_entry_time(aws: Aws) -> None:
    # Given an event stamped at a known moment
    bus = EventBridgeBus(BUS, client=aws.events)
    detail = TurnStarted(turn_id=TURN, scope=SCOPE, user_id="u1", session_id="s" * 32)
    event = Event(
        event_id=new_ulid(),
        source="alphaagent.turn",
        detail_type="TurnStarted",
        time=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        detail=detail,
    )

    # When it is published
    bus.publish(event)

    # Then the delivered event carries that time
    (message,) = aws.received()
    assert message["time"] == "2026-01-02T03:04:05Z"


class ScriptedEvents:
    """An EventBridge client whose PutEvents answers each call with the next of ``answers``: an error
    code refuses the entry (HTTP 200, ``FailedEntryCount`` 1), None accepts it."""

    def __init__(self, *answers: str | None) -> None:
        self.answers = list(answers)
        self.calls: list[list[dict[str, Any]]] = []

    def put_events(self, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        self.calls.append(Entries)
        code = self.answers.pop(0)
        if code is None:
            return {"FailedEntryCount": 0, "Entries": [{"EventId": "e-1"}]}
        return {"FailedEntryCount": 1, "Entries": [{"ErrorCode": code, "ErrorMessage": f"{code} said no"}]}


def _session_event() -> Event:
    return Event.of(SessionCreated(turn_id=TURN, scope=SCOPE, user_id="u1", session_id="s" * 32), new_ulid())


def test_a_throttled_or_internal_failure_is_retried_with_backoff_and_jitter() -> None:
    # Given EventBridge that throttles, then fails internally, then accepts the entry
    client = ScriptedEvents("ThrottlingException", "InternalFailure", None)
    slept: list[float] = []
    ceilings: list[float] = []

    def jitter(low: float, high: float) -> float:
        ceilings.append(high)
        return high / 2

    bus = EventBridgeBus(BUS, client=client, sleep=slept.append, jitter=jitter)
    # When an event is published
    bus.publish(_session_event())
    # Then the same entry went three times, after jittered waits under a doubling ceiling
    assert len(client.calls) == 3 and client.calls[0] == client.calls[1] == client.calls[2]
    assert ceilings == [0.1, 0.2] and slept == [0.05, 0.1]


def test_a_validation_error_fails_at_once_and_retries_stop_at_the_limit() -> None:
    # Given EventBridge that refuses the entry as malformed
    client = ScriptedEvents("MalformedDetail")
    bus = EventBridgeBus(BUS, client=client, sleep=lambda _s: None)
    # When an event is published; Then it fails after one call, not retryable, naming the code
    with pytest.raises(EventRejectedError, match="MalformedDetail: MalformedDetail said no") as caught:
        bus.publish(_session_event())
    assert not isinstance(caught.value, RetryableError) and len(client.calls) == 1
    # And a bus that keeps being throttled gives up after max_attempts calls, saying how many
    throttled = ScriptedEvents(*["ThrottlingException"] * 3)
    limited = EventBridgeBus(BUS, client=throttled, limits=BusLimits(max_attempts=3), sleep=lambda _s: None)
    with pytest.raises(EventPublishError, match=r"ThrottlingException.*\(3 attempts\)"):
        limited.publish(_session_event())
    assert len(throttled.calls) == 3


def test_the_entry_limit_is_configuration_within_what_eventbridge_allows() -> None:
    # Given a bus configured for 1 MiB entries and a detail of ~300 KiB (over the 256 KiB default)
    client = ScriptedEvents(None)
    bus = EventBridgeBus(BUS, client=client, limits=BusLimits(max_entry_bytes=MAX_CONFIGURABLE_ENTRY_BYTES))
    big = Event.of(SpecSubmitted(turn_id=TURN, scope=SCOPE, spec={"goal": "x" * (300 * 1024)}), new_ulid())
    # When it is published; Then it goes inline (no claim check needed, none configured)
    bus.publish(big)
    assert "claim_check" not in client.calls[0][0]["Detail"]
    # And a limit above EventBridge's largest is refused, naming the field
    with pytest.raises(ValueError, match="max_entry_bytes"):
        BusLimits(max_entry_bytes=MAX_CONFIGURABLE_ENTRY_BYTES + 1)
