"""The zip Lambda handlers run in-process on the sample events of ``events/``, under moto.

Each handler is called exactly as Lambda calls it (the event as JSON, a context); the assertions are
on what a user would see: executions, records in DynamoDB, files in S3, events on the bus.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from assertions import assert_status
from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from iam import Iam, Physical
from moto_account import MotoAccount
from pydantic import BaseModel

from alphaagent.aws.backend import get_backend, get_event_bus, get_stepfunctions_client, notice_sqs
from alphaagent.aws.notices import RunNotice
from alphaagent.aws.settings import get_lambda_settings
from alphaagent.domain.turn_steps import CODE_STATE_MARGIN_S, spec_from_message
from alphaagent.errors import ForgedRunResponseError, InvalidSpecError, MissingSettingError, NotFoundError
from alphaagent.models.aws import (
    AcquireLockInput,
    DestinationEvent,
    ExecutionStatusChange,
    FinalizeInput,
    FinalizeOutput,
    PrepareInput,
    ReleaseLockInput,
    TurnInput,
)
from alphaagent.models.common import ConversationScope, utcnow
from alphaagent.models.records import TurnResult
from alphaagent.models.run import FileChangeReport, RunResult

ROOT = Path(__file__).resolve().parents[2]
EVENTS = ROOT / "events"
# functions/ is deployed at the root of the zip artifact, not installed as a package: import it from
# the repository root, as Lambda does (pytest's rootdir insertion only adds tests/).
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
REGION = "eu-west-1"
TABLE = "alphaagent-state-test"
BUCKET = "alphaagent-workspaces-123456789012-eu-west-1"
BUS = "alphaagent-test"
SCOPE = ConversationScope(conversation_id="c-demo")
USER = "alice@example.com"
TURN_ID = "01JDQ8Z6Q4M3W8K2X5V7N9B0CD"
RUN_ID = "01JDQ8ZA0000000000000000RN"


def _sqs_batch(event: dict[str, Any]) -> None:
    from aws_lambda_powertools.utilities.parser.models import SqsModel

    batch = SqsModel.model_validate(event)
    for record in batch.Records:
        spec_from_message(record.body, message_id=record.messageId, sent_ms=0)


MODELS: dict[str, type[BaseModel] | Callable[[dict[str, Any]], None]] = {
    "start_turn_sqs.json": _sqs_batch,
    "start_turn_spec_submitted.json": _sqs_batch,
    "acquire_lock.json": AcquireLockInput,
    "release_lock.json": ReleaseLockInput,
    "prepare_turn.json": PrepareInput,
    "finalize_turn_completed.json": FinalizeInput,
    "finalize_turn_failed.json": FinalizeInput,
    "destination_success.json": DestinationEvent,
    "destination_failure.json": DestinationEvent,
    "env_invocation.json": importlib.import_module("alphaagent.models.aws").EnvRequest,
    "artifact_registered.json": lambda e: _eventbridge(e),
    "citation_emitted.json": lambda e: _eventbridge(e),
    "execution_aborted.json": ExecutionStatusChange,
    "sweep_notice_queues.json": EventBridgeModel,
}
"""Each sample event -> the model (or check) it must satisfy."""


def _eventbridge(event: dict[str, Any]) -> None:
    from alphaagent.aws.bus import event_from_eventbridge

    event_from_eventbridge(event)


def load(name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((EVENTS / name).read_text())
    return document


@dataclass
class Context:
    """The attributes of a Lambda context the Powertools logger reads."""

    function_name: str = "alphaagent-test"
    memory_limit_in_mb: int = 512
    invoked_function_arn: str = f"arn:aws:lambda:{REGION}:123456789012:function:alphaagent-test"
    aws_request_id: str = "req-1"


@pytest.fixture
def aws_region() -> str:
    return REGION


@pytest.fixture
def aws(moto: MotoAccount, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A moto account with the state table, the bucket, the bus, the coder queue and a turn machine."""
    for name, value in {
        "POWERTOOLS_TRACE_DISABLED": "true",
        "POWERTOOLS_METRICS_NAMESPACE": "alphaagent-test",
        "STATE_TABLE_NAME": TABLE,
        "WORKSPACES_BUCKET_NAME": BUCKET,
        "EVENT_BUS_NAME": BUS,
        "IDEMPOTENCY_TABLE_NAME": "alphaagent-idempotency-test",
        "LOCK_LEASE_S": "600",
    }.items():
        monkeypatch.setenv(name, value)
    # Every handler runs with its function's role from template.yaml (tests/iam.py).
    names = {
        "StateTable": TABLE,
        "EventBus": BUS,
        "TurnStateMachine": "alphaagent-turn",
        "CoderQueue": "coder",
    }
    iam = Iam((ROOT / "template.yaml").read_text(), Physical(REGION, "123456789012", names=names))
    for module, logical in iam.handlers().items():
        imported = importlib.import_module(module)  # the test imports its handlers as it runs
        monkeypatch.setattr(imported, "lambda_handler", iam.as_component(logical, imported.lambda_handler))
    iam.install()
    moto.state_table(TABLE)
    s3 = moto.bucket(BUCKET)
    events = moto.client("events")
    events.create_event_bus(Name=BUS)
    sqs = moto.client("sqs")
    sink = moto.queue("bus-sink")
    events.put_rule(Name="all", EventBusName=BUS, EventPattern=json.dumps({"source": [{"prefix": ""}]}))
    events.put_targets(Rule="all", EventBusName=BUS, Targets=[{"Id": "sink", "Arn": moto.queue_arn(sink)}])
    coder_queue = moto.queue("coder")
    machine = moto.client("stepfunctions").create_state_machine(
        name="alphaagent-turn",
        definition=json.dumps({"StartAt": "Done", "States": {"Done": {"Type": "Succeed"}}}),
        roleArn="arn:aws:iam::123456789012:role/alphaagent-turn",
    )["stateMachineArn"]
    monkeypatch.setenv("STATE_MACHINE_ARN", machine)
    monkeypatch.setenv("CODER_QUEUE_URL", coder_queue)
    for getter in (get_lambda_settings, get_backend, get_stepfunctions_client, get_event_bus, notice_sqs):
        getter.cache_clear()
    try:
        yield {"s3": s3, "sqs": sqs, "sink": sink, "machine": machine}
    finally:
        iam.uninstall()
    for getter in (get_lambda_settings, get_backend, get_stepfunctions_client, get_event_bus, notice_sqs):
        getter.cache_clear()
    assert not iam.denied, iam.report()


def published(aws: dict[str, Any]) -> list[str]:
    """Detail-types that reached the bus (through the test rule's queue)."""
    return [event["detail-type"] for event in published_events(aws)]


def published_events(aws: dict[str, Any]) -> list[dict[str, Any]]:
    """The events that reached the bus (through the test rule's queue), as a rule target gets them."""
    found: list[dict[str, Any]] = []
    while (
        messages := aws["sqs"].receive_message(QueueUrl=aws["sink"], MaxNumberOfMessages=10).get("Messages")
    ):
        for message in messages:
            found.append(json.loads(message["Body"]))
            aws["sqs"].delete_message(QueueUrl=aws["sink"], ReceiptHandle=message["ReceiptHandle"])
    return found


def executions(aws: dict[str, Any]) -> list[dict[str, Any]]:
    import boto3

    client = boto3.client("stepfunctions", region_name=REGION)
    found: list[dict[str, Any]] = client.list_executions(stateMachineArn=aws["machine"])["executions"]
    return found


# ----------------------------------------------------------------------------- sample events


@pytest.mark.parametrize("name", sorted(p.name for p in EVENTS.glob("*.json")))
def test_every_sample_event_validates_against_its_model(name: str) -> None:
    # Given a file of events/; When it is checked against its model; Then it is valid.
    assert name in MODELS, f"events/{name} has no model in this test"
    check = MODELS[name]
    if isinstance(check, type):
        check.model_validate(load(name))
    else:
        check(load(name))


def test_every_model_has_its_sample_event() -> None:
    assert sorted(MODELS) == sorted(p.name for p in EVENTS.glob("*.json"))


# ----------------------------------------------------------------------------- start_turn


def test_the_same_spec_delivered_three_times_starts_one_execution(aws: dict[str, Any]) -> None:
    import boto3

    from functions import start_turn

    # Given one spec record, delivered three times (two redeliveries of the message)
    event = load("start_turn_sqs.json")
    # When the starter handles each delivery
    answers = [start_turn.lambda_handler(event, Context()) for _ in range(3)]
    # Then every delivery is acknowledged and exactly one execution, named by the turn id, exists
    assert answers == [{"batchItemFailures": []}] * 3
    assert [e["name"] for e in executions(aws)] == [TURN_ID]
    described = boto3.client("stepfunctions", region_name=REGION).describe_execution(
        executionArn=executions(aws)[0]["executionArn"]
    )
    turn_input = TurnInput.model_validate_json(described["input"])
    assert (turn_input.turn_id, turn_input.scope_key, turn_input.user_id) == (TURN_ID, SCOPE.key, USER)


def test_a_spec_submitted_event_without_turn_id_takes_the_events_turn_id(aws: dict[str, Any]) -> None:
    from functions import start_turn

    # Given a SpecSubmitted event (as the rule puts it on the queue) whose spec has no turn_id
    event = load("start_turn_spec_submitted.json")
    # When the starter handles it twice
    for _ in range(2):
        assert start_turn.lambda_handler(event, Context()) == {"batchItemFailures": []}
    # Then one execution runs, named by the event's turn id
    assert [e["name"] for e in executions(aws)] == ["01JDQ8Z7A1B2C3D4E5F6G7H8JK"]


def test_a_spec_without_turn_id_gets_one_turn_per_message_not_per_delivery(aws: dict[str, Any]) -> None:
    from functions import start_turn

    # Given a spec without turn_id, sent as two messages; the first is delivered twice
    record = load("start_turn_sqs.json")["Records"][0]
    spec = {k: v for k, v in json.loads(record["body"]).items() if k != "turn_id"}
    first = {**record, "messageId": "m-1", "body": json.dumps(spec)}
    second = {**record, "messageId": "m-2", "body": json.dumps(spec)}
    # When the starter handles the deliveries
    for batch in ([first], [first, second]):
        assert start_turn.lambda_handler({"Records": batch}, Context()) == {"batchItemFailures": []}
    # Then each message is one turn: a redelivery derives the same turn id, another message a new one
    names = [e["name"] for e in executions(aws)]
    assert len(names) == 2 and len(set(names)) == 2


def test_a_missing_setting_is_named_and_the_template_alias_is_read(
    aws: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given no state table name, and the machine under its template name TURN_STATE_MACHINE_ARN
    monkeypatch.delenv("STATE_TABLE_NAME")
    monkeypatch.delenv("STATE_MACHINE_ARN")
    monkeypatch.setenv("TURN_STATE_MACHINE_ARN", aws["machine"])
    get_lambda_settings.cache_clear()
    # When the settings are used; Then the machine is found and the missing table is named
    assert get_lambda_settings().required("TURN_STATE_MACHINE_ARN") == aws["machine"]
    with pytest.raises(MissingSettingError, match="STATE_TABLE_NAME"):
        get_backend()


def test_a_poison_record_is_the_only_failure_and_an_invalid_spec_is_acknowledged(
    aws: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from functions import start_turn

    # Given a batch: a good spec, an invalid spec, and a record whose start fails (poison)
    good = load("start_turn_sqs.json")["Records"][0]
    invalid = {**good, "messageId": "bad-spec", "body": json.dumps({"spec_version": 1, "goal": ""})}
    other_turn = "01JDQ8ZD0000000000000000PS"
    poison_spec = {**json.loads(good["body"]), "turn_id": other_turn}
    poison = {**good, "messageId": "poison", "body": json.dumps(poison_spec)}
    real = start_turn.start_turn_execution

    def flaky(arn: str, turn_id: str, execution_input: str) -> bool:
        if turn_id == other_turn:
            raise ConnectionError("network down")
        return real(arn, turn_id, execution_input)

    monkeypatch.setattr(start_turn, "start_turn_execution", flaky)
    # When the starter handles the batch
    answer = start_turn.lambda_handler({"Records": [good, invalid, poison]}, Context())
    # Then only the poison record is retried; the good spec started; the invalid one was acknowledged
    assert answer == {"batchItemFailures": [{"itemIdentifier": "poison"}]}
    assert [e["name"] for e in executions(aws)] == [TURN_ID]


def test_a_turn_id_reused_for_a_different_spec_is_rejected_with_an_event(
    aws: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    from functions import start_turn

    # Given a spec that started its turn, and the same spec respelled (defaults written out)
    record = load("start_turn_sqs.json")["Records"][0]
    spec = json.loads(record["body"])
    respelled = {**record, "messageId": "m-again", "body": json.dumps({"environment_id": "builtin", **spec})}
    other = {**record, "messageId": "m-other", "body": json.dumps({**spec, "goal": "something else"})}
    assert start_turn.lambda_handler({"Records": [record]}, Context()) == {"batchItemFailures": []}
    published_events(aws)
    # When the respelled spec and then a different spec arrive under the same turn id
    answer = start_turn.lambda_handler({"Records": [respelled, other]}, Context())
    # Then both are acknowledged; one execution exists, still with the first spec
    assert answer == {"batchItemFailures": []}
    (execution,) = executions(aws)
    described = get_stepfunctions_client().describe_execution(executionArn=execution["executionArn"])
    assert TurnInput.model_validate_json(described["input"]).spec.goal == spec["goal"]
    # And the different spec (only it) is rejected on the bus, naming the rule, message and turn
    (rejected,) = published_events(aws)
    assert (rejected["source"], rejected["detail-type"]) == ("alphaagent.starter", "SpecRejected")
    detail = rejected["detail"]
    assert detail["reason"].startswith("turn_id: already used for a different spec"), detail
    assert (detail["message_id"], detail["turn_id"], detail["user_id"]) == ("m-other", TURN_ID, USER)
    assert detail["scope"] == SCOPE.model_dump(mode="json")
    # And the rejection is counted in the metrics
    assert '"SpecsRejected"' in capsys.readouterr().out


@pytest.mark.parametrize(
    ("body", "reason", "turn_id"),
    [
        ("not json at all", "", None),
        (json.dumps({"spec_version": 1, "turn_id": TURN_ID, "goal": ""}), "user_id", TURN_ID),
        (
            json.dumps({"detail-type": "SpecSubmitted", "detail": {"turn_id": TURN_ID}}),
            "detail.spec",
            TURN_ID,
        ),
        (json.dumps({"spec_version": 1, "turn_id": "../etc", "user_id": "a b"}), "", None),
    ],
)
def test_a_malformed_message_is_rejected_with_an_event_not_dropped(
    aws: dict[str, Any], capsys: pytest.CaptureFixture[str], body: str, reason: str, turn_id: str | None
) -> None:
    from functions import start_turn

    # Given a message whose body is not a valid spec
    record = {**load("start_turn_sqs.json")["Records"][0], "messageId": "m-bad", "body": body}
    # When the starter handles it
    answer = start_turn.lambda_handler({"Records": [record]}, Context())
    # Then it is acknowledged (it can never succeed), no execution starts, and a SpecRejected event
    # names the message, the readable turn id (only a valid one) and the field at fault
    assert answer == {"batchItemFailures": []} and executions(aws) == []
    (rejected,) = published_events(aws)
    detail = rejected["detail"]
    assert rejected["detail-type"] == "SpecRejected"
    assert (detail["message_id"], detail["turn_id"]) == ("m-bad", turn_id), detail
    assert detail["reason"] and reason in detail["reason"], detail
    assert '"SpecsRejected"' in capsys.readouterr().out


# ----------------------------------------------------------------------------- turn steps


def test_a_turn_longer_than_sqs_can_hide_its_message_is_refused_before_anything_is_written(
    aws: dict[str, Any],
) -> None:
    from functions import prepare_turn

    # Given a spec asking for a 12-hour turn (the coder's message may stay invisible 12 hours at most)
    event = load("prepare_turn.json")
    event["spec"]["constraints"] = {"turn_timeout_s": 12 * 3600}
    # When Prepare runs; Then it refuses the spec naming the field and the limit, and writes nothing
    with pytest.raises(InvalidSpecError, match=r"constraints.turn_timeout_s: at most 39600 s on AWS"):
        prepare_turn.lambda_handler(event, Context())
    assert aws["s3"].list_objects_v2(Bucket=BUCKET).get("KeyCount", 0) == 0


def test_the_turn_steps_lock_prepare_finalize_and_release(aws: dict[str, Any]) -> None:
    from functions import acquire_lock, finalize_turn, prepare_turn, release_lock

    # Given the sample task inputs of one execution
    lock = load("acquire_lock.json")
    # When the lock is taken
    granted = acquire_lock.lambda_handler(lock, Context())
    # Then it is ours, and another execution is refused with the contract's error name
    assert granted["holder"] == TURN_ID
    with pytest.raises(Exception) as busy:
        acquire_lock.lambda_handler({**lock, "execution_id": "someone-else"}, Context())
    assert type(busy.value).__name__ == "ScopeBusyError"

    # When the turn is prepared (twice: a retried step)
    prepared = prepare_turn.lambda_handler(load("prepare_turn.json"), Context())
    again = prepare_turn.lambda_handler(load("prepare_turn.json"), Context())
    # Then the spec is in the scope, one turn record is running, TurnStarted was published once
    assert prepared == again
    spec_key = f"{SCOPE.key}/spec/{TURN_ID}.json"
    assert (prepared["spec_key"], prepared["turn_timeout_s"]) == (spec_key, 900 + CODE_STATE_MARGIN_S)
    stored = json.loads(aws["s3"].get_object(Bucket=BUCKET, Key=spec_key)["Body"].read())
    assert stored["turn_id"] == TURN_ID
    store = get_backend().store
    turn = store.get_turn(USER, TURN_ID)
    assert turn is not None
    assert_status(turn, "running")
    assert turn.session_id == prepared["session_id"]
    assert published(aws).count("TurnStarted") == 1

    # When the coder left its result and pointer, the turn is finalized, then once more with a late failure
    coded = TurnResult(turn_id=TURN_ID, status="completed", summary="1 step ran.", run_ids=[RUN_ID])
    aws["s3"].put_object(
        Bucket=BUCKET, Key=f"{SCOPE.key}/work/turns/{TURN_ID}/result.json", Body=coded.model_dump_json()
    )
    result = finalize_turn.lambda_handler(load("finalize_turn_completed.json"), Context())
    late = finalize_turn.lambda_handler(load("finalize_turn_failed.json"), Context())
    # Then it completed, the result file is in S3, TurnCompleted was published, and nothing regressed;
    # the step returns where the result is, the record holds it
    assert_status(result, "completed")
    assert late == result
    assert result["result_key"] == f"work/turns/{TURN_ID}/result.json"
    finished = store.get_turn(USER, TURN_ID)
    assert finished is not None
    assert_status(finished, "completed")
    assert finished.result is not None
    assert (finished.result.summary, finished.result.run_ids) == ("1 step ran.", [RUN_ID])
    key = f"{SCOPE.key}/work/turns/{TURN_ID}/result.json"
    assert_status(json.loads(aws["s3"].get_object(Bucket=BUCKET, Key=key)["Body"].read()), "completed")
    assert published(aws) == ["TurnCompleted"]

    # When the lock is released, another execution can take it
    release_lock.lambda_handler(load("release_lock.json"), Context())
    assert acquire_lock.lambda_handler({**lock, "execution_id": "next"}, Context())["holder"] == "next"


def test_finalize_returns_a_pointer_however_large_the_turn_result(aws: dict[str, Any]) -> None:
    from functions import acquire_lock, finalize_turn, prepare_turn

    # Given a prepared turn whose coder left a result larger than the 256 KiB execution state
    # (States.DataLimitExceeded, which no Catch takes, would end it neither completed nor released)
    acquire_lock.lambda_handler(load("acquire_lock.json"), Context())
    prepare_turn.lambda_handler(load("prepare_turn.json"), Context())
    summary = "x" * (300 * 1024)
    coded = TurnResult(turn_id=TURN_ID, status="completed", summary=summary, run_ids=[RUN_ID] * 2000)
    aws["s3"].put_object(
        Bucket=BUCKET, Key=f"{SCOPE.key}/work/turns/{TURN_ID}/result.json", Body=coded.model_dump_json()
    )

    # When the turn is finalized
    output = finalize_turn.lambda_handler(load("finalize_turn_completed.json"), Context())

    # Then the step's output is a small pointer with the status; the turn's record ended completed, and
    # the whole result is at the pointer's key in the scope
    assert len(json.dumps(output).encode()) < 1024, output
    pointer = FinalizeOutput.model_validate(output)
    assert_status(pointer, "completed")
    turn = get_backend().store.get_turn(USER, TURN_ID)
    assert turn is not None
    assert_status(turn, "completed")
    stored = aws["s3"].get_object(Bucket=BUCKET, Key=f"{SCOPE.key}/{pointer.result_key}")["Body"].read()
    assert TurnResult.model_validate_json(stored).summary == summary


def test_a_failure_caught_before_prepare_publishes_turn_failed(aws: dict[str, Any]) -> None:
    from functions import finalize_turn

    # Given no turn record (the lock step failed); When finalize runs on the caught failure, twice
    event = load("finalize_turn_failed.json")
    result = finalize_turn.lambda_handler(event, Context())
    again = finalize_turn.lambda_handler(event, Context())
    # Then the turn failed with the error name of the contract, TurnFailed was published once, and the
    # turn's record says so (whoever waits on the table sees the end)
    assert_status(result, "failed")
    assert again == result
    assert result["error_name"] == "States.HeartbeatTimeout"
    assert published(aws) == ["TurnFailed"]
    user, turn_id = event["spec"]["user_id"], event["turn_id"]
    turn = get_backend().store.get_turn(user, turn_id)
    assert turn is not None
    assert_status(turn, "failed")
    assert turn.result is not None
    assert turn.result.error is not None and turn.result.error.name == "States.HeartbeatTimeout"


def test_another_users_scope_is_never_locked_and_answers_as_a_missing_one(aws: dict[str, Any]) -> None:
    from functions import acquire_lock

    # Given alice's conversation, idle
    backend = get_backend()
    backend.store.claim_owner(SCOPE.owner_key, USER, utcnow())
    event = load("acquire_lock.json")
    event["spec"]["user_id"] = "mallory"

    # When mallory's turn asks for its lease; Then it is refused as a missing conversation is, and
    # alice's scope was never locked
    with pytest.raises(NotFoundError, match="conversation c-demo not found"):
        acquire_lock.lambda_handler(event, Context())
    assert backend.store.lock_holder(SCOPE.key, utcnow()) is None

    # And while alice's own turn holds the scope, mallory gets the very same answer, not "busy"
    backend.store.acquire_lock(SCOPE.key, "alice-turn", utcnow(), 600)
    with pytest.raises(NotFoundError, match="conversation c-demo not found"):
        acquire_lock.lambda_handler(event, Context())


def test_a_duplicate_deliverys_failure_never_hides_the_runs_real_failure(aws: dict[str, Any]) -> None:
    from functions import record_event

    # Given a run recorded failed from its failure destination (the function timed out)
    record_event.lambda_handler(load("destination_failure.json"), Context())
    # When a duplicate delivery's "gave up waiting" failure arrives for the same run
    duplicate = load("destination_failure.json")
    duplicate["detail"]["requestContext"]["requestId"] = "c0ffee00-0000-4000-8000-00000000dup1"
    duplicate["detail"]["responsePayload"] = {
        "errorType": "EnvDuplicateDeliveryError",
        "errorMessage": "another delivery claimed the run",
    }
    record_event.lambda_handler(duplicate, Context())
    # Then the run's record still holds the real failure
    run = get_backend().store.get_run(USER, RUN_ID)
    assert run is not None and run.error is not None and run.error.name == "Sandbox.Timedout"


def test_a_turn_refused_for_another_users_scope_touches_nothing_of_that_scope(aws: dict[str, Any]) -> None:
    from functions import finalize_turn

    # Given alice's conversation, and mallory's turn for it that Prepare refused (NotFoundError)
    backend = get_backend()
    backend.store.claim_owner(SCOPE.owner_key, USER, utcnow())
    event = load("finalize_turn_failed.json")
    event["spec"]["user_id"] = "mallory"
    event["error"] = {"Error": "NotFoundError", "Cause": "conversation c-demo not found"}
    event["failed_step"] = "Prepare"
    event.pop("prepared", None)
    before = aws["s3"].list_objects_v2(Bucket=BUCKET).get("KeyCount", 0)

    # When the failure path finalizes it
    result = finalize_turn.lambda_handler(event, Context())

    # Then mallory's own record ends failed, and nothing was written into alice's scope
    assert_status(result, "failed")
    assert result["error_name"] == "NotFoundError"
    turn = backend.store.get_turn("mallory", event["turn_id"])
    assert turn is not None
    assert_status(turn, "failed")
    assert aws["s3"].list_objects_v2(Bucket=BUCKET).get("KeyCount", 0) == before
    assert backend.store.list_turns(USER, SCOPE.key) == []


# ----------------------------------------------------------------------------- recorder


def _run_result() -> RunResult:
    return RunResult(
        run_id=RUN_ID,
        status="ok",
        exit_code=0,
        stdout="total 7\n",
        stderr="",
        stdout_bytes=8,
        stderr_bytes=0,
        stdout_truncated=False,
        stderr_truncated=False,
        error=None,
        duration_ms=42,
        files_changed=["reports/sales-summary.md"],
        files=FileChangeReport(created=["reports/sales-summary.md"]),
        limits={"timeout_s": 60},
        isolation="process",
        network="off",
    )


def test_a_destination_success_record_becomes_a_run_record(aws: dict[str, Any]) -> None:
    from functions import record_event

    # Given the env function wrote its claim-check object and returned the pointer
    key = f"{SCOPE.key}/work/runs/{RUN_ID}/result.json"
    aws["s3"].put_object(Bucket=BUCKET, Key=key, Body=_run_result().model_dump_json().encode())
    # When the recorder handles the destination success event (twice: EventBridge retries)
    for _ in range(2):
        answer = record_event.lambda_handler(load("destination_success.json"), Context())
    # Then one run record holds the result and the event log has RunCompleted
    assert answer["detail_type"] == "RunCompleted"
    run = get_backend().store.get_run(USER, RUN_ID)
    assert run is not None
    assert (run.status, run.exit_code, run.stdout, run.turn_id) == ("ok", 0, "total 7\n", TURN_ID)
    assert [e.detail_type for e in get_backend().store.list_events(TURN_ID)] == ["RunCompleted"]


def test_a_response_pointing_elsewhere_than_the_runs_claim_check_records_nothing(
    aws: dict[str, Any],
) -> None:
    from functions import record_event

    # Given user code that wrote a result of its choosing into the scope and posted, through the
    # Runtime API, a success response pointing at it (the real claim check does not exist yet)
    forged = _run_result().model_copy(update={"stdout": "all tests passed\n"})
    aws["s3"].put_object(
        Bucket=BUCKET, Key=f"{SCOPE.key}/datasets/forged.json", Body=forged.model_dump_json().encode()
    )
    event = load("destination_success.json")
    event["detail"]["responsePayload"]["result_key"] = "datasets/forged.json"

    # When the recorder handles the destination record; Then it refuses it, and nothing is recorded
    with pytest.raises(ForgedRunResponseError, match="not the run's own claim check"):
        record_event.lambda_handler(event, Context())
    assert get_backend().store.get_run(USER, RUN_ID) is None
    assert get_backend().store.list_events(TURN_ID) == []


def test_a_failure_reported_after_the_result_never_turns_the_run_failed(aws: dict[str, Any]) -> None:
    from functions import record_event

    # Given a run recorded from its success destination
    key = f"{SCOPE.key}/work/runs/{RUN_ID}/result.json"
    aws["s3"].put_object(Bucket=BUCKET, Key=key, Body=_run_result().model_dump_json().encode())
    record_event.lambda_handler(load("destination_success.json"), Context())
    # When a failure for the same run arrives later (a duplicate delivery that gave up waiting)
    record_event.lambda_handler(load("destination_failure.json"), Context())
    # Then both events are in the log, and the run's record is still its result
    run = get_backend().store.get_run(USER, RUN_ID)
    assert run is not None
    assert_status(run, "ok")
    assert [e.detail_type for e in get_backend().store.list_events(TURN_ID)] == ["RunCompleted", "RunFailed"]


def test_a_destination_failure_record_becomes_a_failed_run(aws: dict[str, Any]) -> None:
    from functions import record_event

    # When the recorder handles the destination failure event (the function timed out)
    answer = record_event.lambda_handler(load("destination_failure.json"), Context())
    # Then the run is recorded as failed with Lambda's error
    assert answer["detail_type"] == "RunFailed"
    run = get_backend().store.get_run(USER, RUN_ID)
    assert run is not None
    assert_status(run, "failed")
    assert run.error is not None and run.error.name == "Sandbox.Timedout"


def test_a_failed_run_is_notified_to_the_coder_process_that_waits_for_it(aws: dict[str, Any]) -> None:
    import boto3

    from functions import record_event

    # Given a coder process's run-notice queue named in the failed invocation's request (the function
    # timed out: it sent no notice of its own)
    sqs = boto3.client("sqs", region_name=REGION)
    url = sqs.create_queue(QueueName="alphaagent-runs-" + "0" * 32)["QueueUrl"]
    event = load("destination_failure.json")
    event["detail"]["requestPayload"]["notice_queue_url"] = url

    # When the recorder records the failure
    record_event.lambda_handler(event, Context())

    # Then the record exists and the queue says "look now" for that run
    run = get_backend().store.get_run(USER, RUN_ID)
    assert run is not None and run.status == "failed"
    messages = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0).get("Messages", [])
    assert [RunNotice.model_validate_json(m["Body"]) for m in messages] == [
        RunNotice(run_id=RUN_ID, status="failed")
    ]


def test_registration_events_are_recorded(aws: dict[str, Any]) -> None:
    from functions import record_event

    # When the recorder handles an ArtifactRegistered and a CitationEmitted event
    for name in ("artifact_registered.json", "citation_emitted.json"):
        record_event.lambda_handler(load(name), Context())
    # Then both are in the event log and the citation is a record
    store = get_backend().store
    assert sorted(e.detail_type for e in store.list_events(TURN_ID)) == [
        "ArtifactRegistered",
        "CitationEmitted",
    ]
    assert [c.source for c in store.citations_of_turn(TURN_ID)] == ["docs/sales.csv"]


# ----------------------------------------------------------------------------- orphan lock


def test_an_aborted_executions_lock_is_released(aws: dict[str, Any]) -> None:
    from functions import release_orphan_lock

    # Given the aborted execution holds the scope's lease
    store = get_backend().store
    assert store.acquire_lock(SCOPE.key, TURN_ID, utcnow(), 600)
    assert not store.acquire_lock(SCOPE.key, "next", utcnow(), 600)
    # When the status change event arrives
    answer = release_orphan_lock.lambda_handler(load("execution_aborted.json"), Context())
    # Then the lease is released and the next execution takes it
    assert answer == {"scope_key": SCOPE.key, "holder": TURN_ID, "released": True}
    assert store.acquire_lock(SCOPE.key, "next", utcnow(), 600)


def test_prepare_copies_a_dataset_input_to_its_stable_name_with_a_sidecar(aws: dict[str, Any]) -> None:
    # Given a dataset registered twice in the scope on AWS (S3 + DynamoDB), v1 then v2
    from alphaagent.domain.artifacts import register_artifact
    from functions import prepare_turn

    backend = get_backend()
    assert backend.store.claim_owner(SCOPE.owner_key, USER, utcnow()) == USER
    backend.workspace.ensure_scope(SCOPE)
    for rows in (b"n\n1\n", b"n\n1\n2\n"):
        backend.workspace.write_bytes(SCOPE, "datasets/sales.csv", rows)
        register_artifact(
            backend.store,
            backend.workspace,
            scope=SCOPE,
            user_id=USER,
            turn_id=RUN_ID,
            kind="dataset",
            path="datasets/sales.csv",
            name="sales",
        )
    # When the state machine's prepare step brings in the latest, then (a later turn) v1
    event = load("prepare_turn.json")
    prepared = []
    for version, turn_id in ((None, TURN_ID), (1, "01JDQ8Z6Q4M3W8K2X5V7N9B0CE")):
        spec = {
            **event["spec"],
            "turn_id": turn_id,
            "inputs": [{"kind": "dataset", "name": "sales", "version": version}],
        }
        lock = {**event["lock"], "holder": turn_id}
        prepared.append(
            prepare_turn.lambda_handler({"turn_id": turn_id, "spec": spec, "lock": lock}, Context())
        )
        body = aws["s3"].get_object(Bucket=BUCKET, Key=f"{SCOPE.key}/docs/sales.csv")["Body"].read()
        sidecar_key = f"{SCOPE.key}/docs/sales.csv.version.json"
        sidecar = json.loads(aws["s3"].get_object(Bucket=BUCKET, Key=sidecar_key)["Body"].read())
        # Then docs/sales.csv holds the version asked for, and its sidecar says which
        assert body == (b"n\n1\n2\n" if version is None else b"n\n1\n")
        assert (sidecar["artifact"], sidecar["version"], sidecar["copied_by_turn"]) == (
            "sales",
            version or 2,
            turn_id,
        )
    # And the prepared turn records the version each turn was given; no versioned copy exists
    assert [(p["inputs"][0]["path"], p["inputs"][0]["version"]) for p in prepared] == [
        ("docs/sales.csv", 2),
        ("docs/sales.csv", 1),
    ]
    listed = aws["s3"].list_objects_v2(Bucket=BUCKET, Prefix=f"{SCOPE.key}/docs/")["Contents"]
    assert sorted(o["Key"].removeprefix(f"{SCOPE.key}/") for o in listed if not o["Key"].endswith("/")) == [
        "docs/sales.csv",
        "docs/sales.csv.version.json",
    ]


# ----------------------------------------------------------------------------- turn notices, sweeper


def _turn_ended_event(detail_type: str) -> dict[str, Any]:
    """A turn's end as the TurnEvents rule delivers it to the recorder."""
    event = load("artifact_registered.json")
    result = TurnResult(turn_id=TURN_ID, status="completed" if detail_type == "TurnCompleted" else "failed")
    detail: dict[str, Any] = {**event["detail"], "result": result.model_dump(mode="json")}
    detail.pop("artifact")
    if detail_type == "TurnFailed":
        detail["error"] = {"name": "ZeroDivisionError", "value": "division by zero", "traceback": ""}
    return {
        **event,
        "id": "6f1c2a4e-0000-4000-8000-0000000000e1",
        "source": "alphaagent.turn",
        "detail-type": detail_type,
        "detail": detail,
    }


@pytest.mark.parametrize("detail_type", ["TurnCompleted", "TurnFailed"])
def test_a_turns_end_is_announced_on_its_waiters_queue(aws: dict[str, Any], detail_type: str) -> None:
    # Given someone waiting for alice's turn (its notice queue exists, named by the turn)
    from alphaagent.aws.turn_notices import TurnNotice, queue_name
    from functions import record_event

    url = aws["sqs"].create_queue(QueueName=queue_name(USER, TURN_ID))["QueueUrl"]

    # When the recorder records the turn's end
    answer = record_event.lambda_handler(_turn_ended_event(detail_type), Context())

    # Then it is in the event log, and the waiter's queue holds one notice naming the turn only
    assert answer["detail_type"] == detail_type
    assert [e.detail_type for e in get_backend().store.list_events(TURN_ID)] == [detail_type]
    messages = aws["sqs"].receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
    assert [TurnNotice.model_validate_json(m["Body"]) for m in messages] == [TurnNotice(turn_id=TURN_ID)]


def test_a_turns_end_with_nobody_waiting_is_recorded_all_the_same(aws: dict[str, Any]) -> None:
    from functions import record_event

    # Given no notice queue for the turn; When the recorder records its end
    answer = record_event.lambda_handler(_turn_ended_event("TurnCompleted"), Context())
    # Then the end is recorded (the send to a queue that does not exist is not an error)
    assert answer["detail_type"] == "TurnCompleted"
    assert [e.detail_type for e in get_backend().store.list_events(TURN_ID)] == ["TurnCompleted"]


def test_the_sweeper_deletes_expired_and_old_untagged_notice_queues_only(
    aws: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given, a day after they were made: notice queues of owners that died (an expired tag; no tag
    # at all), a live one (renewed: its expiry still ahead), and another kind's queue with the tag
    import time

    from alphaagent.aws import queue_sweeper
    from functions import sweep_notice_queues

    sqs = aws["sqs"]
    now = time.time()
    later = now + queue_sweeper.UNTAGGED_MAX_AGE_S + 60

    def queue(name: str, expires: float | None) -> str:
        tags = {} if expires is None else {queue_sweeper.EXPIRES_TAG: str(int(expires))}
        url: str = sqs.create_queue(QueueName=name, tags=tags)["QueueUrl"]
        return url

    dead_run = queue("alphaagent-runs-" + "1" * 32, now + 60)
    dead_turn = queue("alphaagent-turns-" + "2" * 32, now + 3600)
    untagged = queue("alphaagent-runs-" + "3" * 32, None)
    live = queue("alphaagent-turns-" + "4" * 32, later + 3600)
    other = queue("someone-elses-queue", now)
    monkeypatch.setattr(time, "time", lambda: later)

    # When the hourly schedule runs the sweeper (as its role: ListQueues, ListQueueTags, DeleteQueue)
    answer = sweep_notice_queues.lambda_handler(load("sweep_notice_queues.json"), Context())

    # Then exactly the dead ones are gone
    left = set(sqs.list_queues().get("QueueUrls", []))
    assert not {dead_run, dead_turn, untagged} & left
    assert {live, other} <= left
    assert answer == {"examined": 4, "deleted": 3, "kept": 1}


def test_the_sweeper_keeps_a_queue_whose_expiry_is_ahead(aws: dict[str, Any]) -> None:
    import time

    from alphaagent.aws.queue_sweeper import EXPIRES_TAG, expiry_tags
    from functions import sweep_notice_queues

    # Given a live coder process's queue (renewed: its expiry is hours ahead) and a fresh untagged one
    sqs = aws["sqs"]
    live = sqs.create_queue(QueueName="alphaagent-runs-" + "5" * 32, tags=expiry_tags(6 * 3600, time.time()))
    fresh = sqs.create_queue(QueueName="alphaagent-turns-" + "6" * 32)

    # When the sweeper runs now
    answer = sweep_notice_queues.lambda_handler(load("sweep_notice_queues.json"), Context())

    # Then both are kept
    left = set(sqs.list_queues().get("QueueUrls", []))
    assert {live["QueueUrl"], fresh["QueueUrl"]} <= left
    assert answer == {"examined": 2, "deleted": 0, "kept": 2}
    assert EXPIRES_TAG in sqs.list_queue_tags(QueueUrl=live["QueueUrl"])["Tags"]
