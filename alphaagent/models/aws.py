"""Models of the AWS edges (STYLE §3): the turn state machine's task inputs and outputs, the starter's
message bodies, Lambda destination records and Step Functions status-change events.

The state (JSONPath) of one turn execution starts as ``TurnInput``; the machine passes the fields each
step needs. Our own contracts forbid unknown fields; envelopes written by AWS (destination records,
status changes) ignore them, since AWS adds fields over time.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from alphaagent.models.common import ConversationScope, NodeScope
from alphaagent.models.records import PreparedInput, TurnResult, TurnStatus
from alphaagent.models.run import RunLimits, RunOrigin
from alphaagent.models.spec import Spec


class _Ours(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Theirs(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


# ------------------------------------------------------------------------- turn state machine


class TurnInput(_Ours):
    """The execution input the starter gives the turn machine (``StartExecution(name=turn_id)``):
    ``{"turn_id", "spec"}``, the spec carrying the same ``turn_id`` (statemachines/turn.asl.yaml)."""

    turn_id: str
    spec: Spec

    @classmethod
    def of(cls, spec: Spec) -> TurnInput:
        """The input of ``spec``, which must have its ``turn_id``."""
        if spec.turn_id is None:
            raise ValueError("spec.turn_id: required in a turn execution's input")
        return cls(turn_id=spec.turn_id, spec=spec)

    @property
    def scope_key(self) -> str:
        """The key of the spec's scope (``conversations/{id}`` or the node's)."""
        return self.spec.scope.key

    @property
    def user_id(self) -> str:
        """The spec's user."""
        return self.spec.user_id


def execution_name(execution: str) -> str:
    """The name of an execution given by its ARN (``$$.Execution.Id``) or by its name: the lease
    holder. Execution names cannot contain ``:``, so the last ARN field is the name."""
    return execution.rsplit(":", 1)[-1]


class LockGranted(_Ours):
    """Output of ``acquire_lock``: the lease and when it ends (ISO 8601, UTC)."""

    scope_key: str
    holder: str
    lease_s: float
    expires_at: str


class AcquireLockInput(TurnInput):
    """Input of ``acquire_lock``: the turn and ``execution_id`` (``$$.Execution.Id``, the ARN)."""

    execution_id: str = Field(min_length=1)

    @property
    def holder(self) -> str:
        """The lease holder: the execution's name (the turn id, as the starter names it)."""
        return execution_name(self.execution_id)


class ReleaseLockInput(TurnInput):
    """Input of ``release_lock``: the turn and the lease ``acquire_lock`` granted (``$.lock.result``)."""

    lock: LockGranted


class LockReleased(_Ours):
    """Output of ``release_lock`` and ``release_orphan_lock``."""

    scope_key: str
    holder: str
    released: bool = True


class PrepareInput(TurnInput):
    """Input of ``prepare_turn``: the turn and the lease it holds (not needed by the step itself)."""

    lock: LockGranted | None = None


class PreparedTurn(_Ours):
    """Output of ``prepare_turn``: what the coder's task message and ``finalize_turn`` need.

    ``spec_key`` is the bucket key of the stored spec, ``{scope key}/spec/{turn_id}.json``, and
    ``spec_sha256`` the SHA-256 of its bytes: the coder reads the spec from there and checks it
    (claim check, ``coder.worker.CoderMessage``), so the task message stays far below 256 KiB.
    ``inputs`` are the declared inputs brought into ``docs/`` (the coder's message carries them, for
    citations). ``turn_timeout_s`` is the Code state's timeout (``TimeoutSecondsPath``), in whole
    seconds: the spec's turn timeout plus ``turn_steps.CODE_STATE_MARGIN_S``. ``finished`` is true
    when an earlier attempt finished the turn.
    """

    turn_id: str
    user_id: str
    scope_key: str
    session_id: str
    spec_key: str
    spec_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    turn_timeout_s: int = Field(ge=1)
    inputs: list[PreparedInput] = Field(default_factory=list)
    finished: bool = False


class CoderPointer(_Ours):
    """What the coder worker sends with ``SendTaskSuccess`` (``coder.worker.TurnPointer``): where the
    turn's result is, not the result (it may exceed the 256 KiB state limit). ``result_key`` is the
    workspace path in the scope, ``work/turns/{turn_id}/result.json``."""

    turn_id: str
    status: str
    scope_key: str
    result_key: str


class TaskFailure(_Theirs):
    """A Step Functions error as a ``Catch`` puts it in the state (``ResultPath``): ``Error`` is the
    error name (our exception class names are a contract, STYLE §4), ``Cause`` the message or JSON."""

    error: str = Field(alias="Error")
    cause: str = Field("", alias="Cause")

    @field_validator("cause", mode="before")
    @classmethod
    def _no_cause(cls, value: Any) -> Any:
        # SendTaskFailure's cause is optional: the Catch then puts "Cause": null (or nothing).
        return "" if value is None else value

    def message(self) -> str:
        """``Cause`` as a readable line: the ``errorMessage`` of a Lambda error's JSON cause if any."""
        try:
            parsed = json.loads(self.cause)
        except ValueError:
            return self.cause
        if isinstance(parsed, dict) and isinstance(parsed.get("errorMessage"), str):
            return str(parsed["errorMessage"])
        return self.cause


class FinalizeInput(TurnInput):
    """Input of ``finalize_turn``: the turn, the prepare step's output, and exactly one of ``coded``
    (the coder's ``SendTaskSuccess`` pointer, ``$.coded``) or ``error`` (a ``Catch``'s ``$.error``)."""

    prepared: PreparedTurn | None = None
    coded: CoderPointer | None = None
    error: TaskFailure | None = None
    failed_step: str | None = None


class FinalizeOutput(_Ours):
    """What ``finalize_turn`` returns to the turn machine (``$.finalized.result``): the turn's status
    and where its result is, never the result itself. A turn result grows with the turn (summary,
    artifacts, citations, run ids) and the execution's state is limited to 256 KiB, a limit whose
    error (``States.DataLimitExceeded``) no ``Catch`` can take: the turn would end neither completed
    nor released. A Lambda task's whole payload counts against the limit before any
    ``ResultSelector``, so the function itself returns only this.

    The result is the turn record's (``Store.get_turn(user_id, turn_id)``, DynamoDB) and, for a turn
    that started in its scope, the copy ``result_key`` (``work/turns/{turn_id}/result.json``) there.
    ``error_name`` is the error's name only (its message may be long): the record has the rest.
    """

    turn_id: str
    user_id: str
    scope_key: str
    status: TurnStatus
    result_key: str
    failed_step: str | None = Field(None, max_length=128)
    error_name: str | None = Field(None, max_length=256)

    @classmethod
    def of(cls, request: TurnInput, result: TurnResult) -> FinalizeOutput:
        """The pointer to ``result``, the result of ``request``'s turn."""
        return cls(
            turn_id=result.turn_id,
            user_id=request.user_id,
            scope_key=request.scope_key,
            status=result.status,
            result_key=turn_result_key(result.turn_id),
            failed_step=(result.failed_step or "")[:128] or None,
            error_name=result.error.name[:256] if result.error else None,
        )


def turn_result_key(turn_id: str) -> str:
    """The workspace path of a turn's result copy in its scope, ``work/turns/{turn_id}/result.json``."""
    return f"work/turns/{turn_id}/result.json"


# ------------------------------------------------------------------------- Lambda destinations


class EnvRequest(_Ours):
    """The payload the coder gives ``alphaagent-env-{environment_id}`` (``InvocationType="Event"``),
    and so the destination record's ``requestPayload``: who runs what, where, within which limits.

    Shape (JSON)::

        {"run_id", "turn_id", "session_id", "user_id",
         "scope": {"conversation_id"} | {"workflow_execution_id", "node_id"},
         "code": "<Python source>", "limits": {"timeout_s", "memory_mb", ...},
         "network": false, "environment_id": "builtin"}

    The serialised payload must fit the asynchronous invocation payload limit (256 KiB), with room
    left for the destination record that carries it back to the bus (an EventBridge event, also 256
    KiB at most), so the code is a little less than 256 KiB at most (``alphaagent.aws.executor``
    refuses larger payloads before invoking). ``limits``, ``network`` and ``environment_id`` have
    defaults, so records written before they existed (``events/destination_*.json``) still validate.
    Unknown fields are refused (our own contract, STYLE §3): Lambda passes the payload through to the
    destination record unchanged.

    ``not_after`` (UNIX time, seconds) is when the caller stops waiting for the result: an invocation
    that starts later does not run, and a run that ends later changes nothing in the scope (no upload,
    no claim check): by then the turn may have failed and released its scope to the next turn.

    ``notice_queue_url`` is the invoking coder process's notice queue (``alphaagent.aws.notices``):
    the function sends a ``RunNotice`` there once the claim check exists, so the coder looks at once
    instead of polling. None: no notice (the coder polls).
    """

    run_id: str
    turn_id: str
    session_id: str
    user_id: str
    scope: ConversationScope | NodeScope
    code: str = ""
    limits: RunLimits = RunLimits()
    network: bool = False
    environment_id: str = "builtin"
    not_after: float | None = None
    notice_queue_url: str | None = Field(None, max_length=256)

    @field_validator("notice_queue_url")
    @classmethod
    def _notice_queue(cls, url: str | None) -> str | None:
        from alphaagent.aws.notices import QUEUE_URL  # the scheme lives with the notices

        if url is not None and not QUEUE_URL.fullmatch(url):
            raise ValueError("must be the URL of an alphaagent-runs-* SQS queue (alphaagent.aws.notices)")
        return url

    fresh: bool = False
    """Run with empty globals, leaving the session's saved live state as it is (DESIGN §4.7)."""

    @classmethod
    def of(
        cls,
        origin: RunOrigin,
        *,
        run_id: str,
        code: str,
        limits: RunLimits,
        network: bool,
        not_after: float | None = None,
        notice_queue_url: str | None = None,
    ) -> EnvRequest:
        """The request for one run of ``code`` on behalf of ``origin`` (turn, session, user, scope
        and environment); ``not_after`` and ``notice_queue_url``: see the class."""
        return cls(
            run_id=run_id,
            turn_id=origin.turn_id,
            session_id=origin.session_id,
            user_id=origin.user_id,
            scope=origin.scope,
            code=code,
            limits=limits,
            network=network,
            environment_id=origin.environment_id,
            not_after=not_after,
            notice_queue_url=notice_queue_url,
            fresh=origin.fresh,
        )


def run_result_key(run_id: str) -> str:
    """The workspace path of a run's claim-check object, ``work/runs/{run_id}/result.json``: the full
    run result, written by the env function after every file of the run is synced (its existence
    means the run is complete in the scope)."""
    return f"work/runs/{run_id}/result.json"


class EnvPointer(_Theirs):
    """The env function's small return value: the run's status and its claim-check object
    (``result_key``: the workspace path of the full run result, ``run_result_key(run_id)``)."""

    run_id: str
    status: str
    result_key: str


class LambdaError(_Theirs):
    """The ``responsePayload`` of a failed invocation, as Lambda writes it."""

    error_type: str = Field("Unhandled", alias="errorType")
    error_message: str = Field("", alias="errorMessage")
    stack_trace: list[str] = Field(default_factory=list, alias="stackTrace")


class DestinationRequestContext(_Theirs):
    request_id: str = Field(alias="requestId")
    function_arn: str = Field(alias="functionArn")
    condition: str
    approximate_invoke_count: int = Field(alias="approximateInvokeCount")


class DestinationResponseContext(_Theirs):
    status_code: int = Field(alias="statusCode")
    executed_version: str = Field("$LATEST", alias="executedVersion")
    function_error: str | None = Field(None, alias="functionError")


class DestinationRecord(_Theirs):
    """An asynchronous invocation record (Lambda destinations, version 1.0)."""

    version: str
    timestamp: str
    request_context: DestinationRequestContext = Field(alias="requestContext")
    request_payload: EnvRequest = Field(alias="requestPayload")
    response_context: DestinationResponseContext = Field(alias="responseContext")
    response_payload: Any = Field(None, alias="responsePayload")

    @property
    def succeeded(self) -> bool:
        """True for an OnSuccess record (the function returned); an error of user code is still a
        success here: it is data in the run result."""
        return self.response_context.function_error is None and self.request_context.condition == "Success"


DESTINATION_SUCCESS = "Lambda Function Invocation Result - Success"
DESTINATION_FAILURE = "Lambda Function Invocation Result - Failure"


class DestinationEvent(_Theirs):
    """A destination record as the EventBridge destination delivers it (``source: lambda``)."""

    id: str
    source: Literal["lambda"]
    detail_type: Literal[
        "Lambda Function Invocation Result - Success", "Lambda Function Invocation Result - Failure"
    ] = Field(alias="detail-type")
    time: str
    detail: DestinationRecord


# ------------------------------------------------------------------------- Step Functions status


class ExecutionStatusDetail(_Theirs):
    """The detail of ``Step Functions Execution Status Change``; ``input`` is the execution's input JSON."""

    execution_arn: str = Field(alias="executionArn")
    state_machine_arn: str = Field(alias="stateMachineArn")
    name: str
    status: Literal["RUNNING", "SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED", "PENDING_REDRIVE"]
    input: str | None = None

    def turn_input(self) -> TurnInput:
        """The execution's ``TurnInput`` (raises ``pydantic.ValidationError`` if it is not one)."""
        return TurnInput.model_validate_json(self.input or "null")


class ExecutionStatusChange(_Theirs):
    """The EventBridge event AWS emits when a Step Functions execution changes status."""

    id: str
    source: Literal["aws.states"]
    detail_type: Literal["Step Functions Execution Status Change"] = Field(alias="detail-type")
    time: str
    detail: ExecutionStatusDetail
