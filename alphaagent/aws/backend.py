"""The AWS backend as the zip Lambda functions use it: ``DynamoStore``, ``S3Workspace`` and
``EventBridgeBus`` built from ``LambdaSettings``, their boto3 clients created on first use.

The functions never run user code (the env Lambda does), so the backend's executor refuses to.

Example::

    backend = get_backend()
    backend.store.release_lock(scope_key, execution_name)
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from alphaagent.aws import sdk
from alphaagent.aws.bus import BusLimits, EventBridgeBus, event_from_eventbridge
from alphaagent.aws.environments import DynamoEnvironmentRegistry
from alphaagent.aws.executor import LambdaExecutor
from alphaagent.aws.notices import RunNotice, RunNotices, send_notice
from alphaagent.aws.settings import (
    CoderBackendSettings,
    LambdaSettings,
    TurnFunctionSettings,
    get_lambda_settings,
)
from alphaagent.aws.store import DynamoStore
from alphaagent.aws.turn_notices import send_turn_notice
from alphaagent.aws.workspace import S3Workspace
from alphaagent.domain.audit import emf_audit
from alphaagent.domain.backend import Backend, TurnSettings
from alphaagent.domain.recorder import Recorder, history_view
from alphaagent.errors import ForgedRunResponseError, InvalidSpecError, NoExecutorError
from alphaagent.models.aws import DestinationRecord, EnvPointer, LambdaError, TurnInput, run_result_key
from alphaagent.models.events import Event, RunCompleted, RunFailed, TurnCompleted, TurnFailed
from alphaagent.models.run import RunError, RunLimits, RunOrigin, RunResult
from alphaagent.models.spec import TURN_ID_REUSED
from alphaagent.ports import OutputSink


class NoExecutor:
    """``alphaagent.ports.Executor`` for processes that must never run code."""

    publishes_run_events = False

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
        """Always raises ``NoExecutorError``: on AWS, code runs in the ``alphaagent-env-*`` functions."""
        raise NoExecutorError("this function does not run code; run_in_env invokes an environment function")


@functools.cache
def get_backend(model: type[TurnFunctionSettings] = LambdaSettings) -> Backend:
    """The backend of this Lambda process, built once from ``get_lambda_settings(model)`` (the calling
    function's settings model; by default every zip variable at once).

    No client exists until an adapter first calls AWS. The environments are the stack's registry
    in the state table (``DynamoEnvironmentRegistry``: ``builtin`` and those ``make env-deploy``
    recorded), so the Prepare step refuses a spec naming any other. Oversized event details go by
    claim check into the scope's workspace. The connector allowlists are the stack's
    (``LambdaSettings.connectors``): the prepare step fetches the spec's declared inputs through
    them. Every function needs the state table; the bucket and the bus are named only where a
    function uses them (an unset one fails on first use).

    Raises:
        MissingSettingError: ``STATE_TABLE_NAME`` is not set.
        InvalidSettingError: a variable of ``model`` is malformed (one line naming it).
    """
    settings = get_lambda_settings(model)
    workspace = S3Workspace(settings.value("WORKSPACES_BUCKET_NAME"))
    table = settings.required("STATE_TABLE_NAME")
    return Backend(
        store=DynamoStore(table),
        workspace=workspace,
        bus=EventBridgeBus(
            settings.value("EVENT_BUS_NAME"), claim_check=workspace.write_bytes, limits=_bus_limits(settings)
        ),
        executor=NoExecutor(),
        environments=DynamoEnvironmentRegistry(table),
        connectors=settings.connectors(),
        turns=TurnSettings(lock_lease_s=settings.LOCK_LEASE_S),
        audit=emf_audit(),
    )


@functools.cache
def coder_backend() -> Backend:
    """The backend of the coder worker on AWS (``python -m coder`` in the ECS service): the zip
    functions' adapters, with ``run_in_env`` as asynchronous invocations of the env functions
    (``LambdaExecutor``; always with the scope as the tenant id: the template creates every env
    function in tenant isolation mode), the stack's environment registry (a spec's environment is
    checked again, and the prompt names its packages), the connector allowlists of the stack, and
    the scope lease renewed with the same ``LOCK_LEASE_S`` the AcquireLock step grants. With
    ``RUN_NOTICES`` the executor learns of results from the process's notice queue
    (``alphaagent.aws.notices``).

    Raises:
        MissingSettingError: ``STATE_TABLE_NAME``, ``WORKSPACES_BUCKET_NAME`` or ``EVENT_BUS_NAME``
            is not set.
    """
    settings = get_lambda_settings(CoderBackendSettings)
    workspace = S3Workspace(settings.required("WORKSPACES_BUCKET_NAME"))
    table = settings.required("STATE_TABLE_NAME")
    store = DynamoStore(table)
    notices = RunNotices() if settings.RUN_NOTICES else None
    executor = LambdaExecutor(workspace=workspace, store=store, tenant_isolation=True, notices=notices)
    return Backend(
        store=store,
        workspace=workspace,
        bus=EventBridgeBus(
            settings.required("EVENT_BUS_NAME"),
            claim_check=workspace.write_bytes,
            limits=_bus_limits(settings),
        ),
        executor=executor,
        environments=DynamoEnvironmentRegistry(table),
        connectors=settings.connectors(),
        turns=TurnSettings(lock_lease_s=settings.LOCK_LEASE_S),
        audit=emf_audit(),
    )


@functools.cache
def get_stepfunctions_client() -> Any:
    """The Step Functions client of this process (boto3 has no type information: ``Any``)."""
    return sdk.client("stepfunctions")


def start_turn_execution(state_machine_arn: str, turn_id: str, execution_input: str) -> bool:
    """Start the turn state machine as execution ``turn_id`` with ``execution_input`` (a
    ``TurnInput``'s JSON); True if started, False if that execution exists already for the same spec
    (a duplicate delivery: acknowledged, never a second turn).

    Step Functions keeps execution names unique per state machine for 90 days after they close, so the
    name is the idempotency key of the turn (DESIGN §3 step 2) -- for one spec. A STANDARD machine
    answers a repeat with the same input while the execution runs with success and the existing ARN;
    with another input, or after it closed, with ``ExecutionAlreadyExists``. The existing execution's
    input is then read back (``DescribeExecution``) and the digests of the two specs compared, so a
    redelivery (same spec, however spelled) is a duplicate and a different spec is refused.

    Raises:
        InvalidSpecError: the execution of that name ran a different spec (``turn_id: already used
            for a different spec``).
    """
    client = get_stepfunctions_client()
    try:
        client.start_execution(stateMachineArn=state_machine_arn, name=turn_id, input=execution_input)
    except client.exceptions.ExecutionAlreadyExists:
        described = client.describe_execution(executionArn=execution_arn_of(state_machine_arn, turn_id))
        if _spec_digest(described.get("input", "")) != _spec_digest(execution_input):
            raise InvalidSpecError(TURN_ID_REUSED) from None
        return False
    return True


def _spec_digest(execution_input: str) -> str | None:
    """The digest of the spec in a turn execution's input; None if it is not a turn input."""
    try:
        return TurnInput.model_validate_json(execution_input).spec.digest()
    except ValueError:
        return None


def execution_arn_of(state_machine_arn: str, name: str) -> str:
    """The ARN of execution ``name`` of a state machine:
    ``arn:{partition}:states:{region}:{account}:execution:{machine}:{name}`` (the machine's ARN with
    ``stateMachine`` replaced by ``execution``, then the name)."""
    prefix, machine = state_machine_arn.rsplit(":stateMachine:", 1)
    return f"{prefix}:execution:{machine}:{name}"


@functools.cache
def get_event_bus() -> EventBridgeBus:
    """The bus of a function that only publishes small events (the starter's ``SpecRejected``): no
    claim check, since such a detail stays far below the entry limit.

    Raises:
        MissingSettingError: ``EVENT_BUS_NAME`` is not set.
    """
    settings = get_lambda_settings()
    return EventBridgeBus(settings.required("EVENT_BUS_NAME"), limits=_bus_limits(settings))


def _bus_limits(settings: TurnFunctionSettings) -> BusLimits:
    return BusLimits(max_entry_bytes=settings.EVENT_BUS_MAX_ENTRY_BYTES)


def run_event_of(backend: Backend, record: DestinationRecord, event_id: str) -> Event:
    """The ``RunCompleted``/``RunFailed`` event a Lambda destination record stands for (DESIGN §4.8).

    On success the env function returned an ``EnvPointer``; the full run result is read from the
    run's claim-check object in the scope and carried in the event cut to the stored-history caps
    (``history_view``). The object is the one of the *request's* run id (``run_result_key``), never a
    key the response names: user code in the execution environment can post a response of its own
    through the Runtime API, and a key it chose could point at a file it wrote. Only the handler
    writes ``work/runs/`` (runs cannot), and the result must be that run's.

    On failure (the function crashed, timed out, or ran out of memory: a platform failure, never a
    failure of user code) Lambda's ``errorType``/``errorMessage`` become the error.
    ``event_id`` should be stable across redeliveries (the destination's request id), so recording
    twice changes nothing.

    Raises:
        pydantic.ValidationError: the success payload is not a pointer or the object not a run result.
        FileNotFoundError: the claim-check object does not exist.
        ForgedRunResponseError: the response names another run or another key than the run's own.
    """
    request = record.request_payload
    common = {
        "turn_id": request.turn_id,
        "scope": request.scope,
        "run_id": request.run_id,
        "session_id": request.session_id,
        "user_id": request.user_id,
        "code": request.code,
    }
    if record.succeeded:
        pointer = EnvPointer.model_validate(record.response_payload)
        key = run_result_key(request.run_id)
        if (pointer.run_id, pointer.result_key) != (request.run_id, key):
            raise ForgedRunResponseError(
                f"run {request.run_id}: the response names run {pointer.run_id!r} at {pointer.result_key!r},"
                f" not the run's own claim check {key}; only that object is read"
            )
        result = RunResult.model_validate_json(backend.workspace.read_bytes(request.scope, key))
        if result.run_id != request.run_id:
            raise ForgedRunResponseError(f"run {request.run_id}: its claim check holds run {result.run_id}")
        completed = RunCompleted(
            **common,
            status=result.status,
            result_key=key,
            result=history_view(result).model_dump(mode="json"),
        )
        return Event.of(completed, event_id)
    payload = record.response_payload if isinstance(record.response_payload, dict) else {}
    failure = LambdaError.model_validate(payload)
    error = RunError(
        name=failure.error_type,
        value=failure.error_message
        or f"the environment function failed ({record.request_context.condition})",
        traceback="\n".join(failure.stack_trace),
    )
    return Event.of(RunFailed(**common, error=error), event_id)


def record_destination(record: DestinationRecord) -> Event:
    """Persist a destination record as a run record and an event-log entry; returns the event.

    The event is recorded, not published again: on AWS the recorder is the bus's only consumer of
    run events, so a republished copy would only come back to it. A failure is then notified to the
    invoking coder process (``notice_queue_url``): a function that crashed or timed out sent none.
    """
    backend = get_backend()
    event = run_event_of(backend, record, record.request_context.request_id)
    Recorder(backend.store).handle(event)
    if not record.succeeded:  # the coder watches for this record: tell it it is there
        run_id = record.request_payload.run_id
        send_notice(
            notice_sqs(), record.request_payload.notice_queue_url, RunNotice(run_id=run_id, status="failed")
        )
    return event


@functools.cache
def notice_sqs() -> Any:
    """The recorder's SQS client for run and turn notices (``alphaagent.aws.notices``,
    ``alphaagent.aws.turn_notices``), created on first use; its timeouts are short because a
    notice that cannot go out in a few seconds is better dropped (the waiter reads on its timer)."""
    return sdk.client("sqs", config={"connect_timeout": 2, "read_timeout": 5, "retries": {"max_attempts": 2}})


def record_eventbridge(message: dict[str, Any]) -> Event:
    """Persist one of our events as an EventBridge rule delivers it (claim checks followed). A turn's
    end is then announced to its waiter, if one waits (``alphaagent.aws.turn_notices``): every path
    that ends a turn publishes its event after writing the record, and this is where all of them
    arrive. The queue is in the event's ``account`` (the stack's own)."""
    backend = get_backend()
    event = event_from_eventbridge(message, fetch=fetch_object)
    Recorder(backend.store).handle(event)
    if isinstance(event.detail, TurnCompleted | TurnFailed):
        account = str(message.get("account") or own_account())
        send_turn_notice(notice_sqs(), account, event.detail.user_id, event.detail.turn_id)
    return event


@functools.cache
def own_account() -> str:
    """The AWS account this process runs in (``sts:GetCallerIdentity``, which needs no permission),
    for an event delivered without its ``account`` field."""
    return str(sdk.client("sts").get_caller_identity()["Account"])


def fetch_object(key: str) -> bytes:
    """The bytes of ``key`` in the workspaces bucket (a claim-check object)."""
    workspace = get_backend().workspace
    assert isinstance(workspace, S3Workspace)
    body = workspace.client.get_object(Bucket=workspace.bucket, Key=key)["Body"]
    return bytes(body.read())
