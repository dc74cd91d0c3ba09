"""The coder worker (DESIGN §3 step 5): a long-lived loop on the CoderQueue that runs one turn per
message and answers the waiting Step Functions task.

The turn state machine sends ``{"task_token", "spec_key", "inputs"}`` with
``sqs:sendMessage.waitForTaskToken`` after its AcquireLock and Prepare steps: the scope's lease is
held by the execution (named by the turn id), the turn record, the spec's claim check
(``spec_key``) and the inputs in ``docs/`` exist. The worker then runs only the coding step
(``alphaagent.domain.turns.code_prepared_turn``), renewing the execution's lease while it runs, and
leaves the turn record and the lease to the machine's Finalize and ReleaseLock steps. A message
with the spec inline (``"spec"``, no machine around it) runs the whole turn (``run_turn``).

For each message the worker heartbeats the task while the turn runs, answers ``SendTaskSuccess``
with a small pointer to the turn result or ``SendTaskFailure`` with the error class name (the
contract the machine's ``Retry``/``Catch`` match on), and only then deletes the message.

The backend is injected: ``python -m coder`` builds the AWS one (``alphaagent.aws.backend.
coder_backend``) when ``STATE_TABLE_NAME`` is set, else the local one; the tests use the local one.

Example::

    worker = CoderWorker(backend, coder, settings, sqs=boto3.client("sqs"),
                         sfn=boto3.client("stepfunctions"))
    signal.signal(signal.SIGTERM, lambda *_: worker.stop())
    worker.run()  # returns once stopped and every in-flight turn is answered
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from functools import lru_cache
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from alphaagent.aws.sdk import error_code
from alphaagent.domain.backend import Backend
from alphaagent.domain.turns import Coder, abandon_turn, code_prepared_turn, run_turn
from alphaagent.errors import (
    AlphaAgentError,
    InvalidMessageError,
    InvalidSettingError,
    InvalidSpecError,
    NotFoundError,
    contract_name,
)
from alphaagent.ids import new_ulid
from alphaagent.models.common import scope_from_key
from alphaagent.models.records import PreparedInput, TurnResult
from alphaagent.models.spec import Spec, parse_spec
from alphaagent.settings import describe_error

logger = logging.getLogger(__name__)

MAX_CAUSE_CHARS = 32_768
"""``SendTaskFailure`` accepts a cause of at most 32,768 characters (Step Functions API limit)."""

FAILURE_CONTRACT: tuple[type[AlphaAgentError], ...] = (InvalidMessageError, InvalidSpecError, NotFoundError)
"""The classes whose names the turn machine's Code state catches (``statemachines/turn.asl.yaml``): a
failure that is one of them is answered under that class's name, so a subclass still matches
(Step Functions compares exact names); any other failure under its own class name."""
WORKER_STOPPING = "WorkerStopping"
"""The error of a task whose turn did not end before the worker's stop deadline."""
FAILURE_NAMES = frozenset(kind.__name__ for kind in FAILURE_CONTRACT) | {WORKER_STOPPING}
"""Every contract name the worker's ``SendTaskFailure`` can carry (``tests/unit/test_error_contract.py``)."""

_GONE_TASK_ERRORS = ("TaskDoesNotExist", "TaskTimedOut", "InvalidToken")
"""Answers meaning nobody waits for this task token any more: stop heartbeating, drop the message."""


class WorkerSettings(BaseModel):
    """The worker's configuration (seconds throughout).

    - ``coder_queue_url``: the CoderQueue (``CODER_QUEUE_URL``).
    - ``concurrency``: turns run at once, one thread each (``WORKER_CONCURRENCY``, default 1).
    - ``heartbeat_seconds``: interval of ``SendTaskHeartbeat`` while a turn runs
      (``HEARTBEAT_SECONDS``, default and maximum 40: a turn's heartbeat must reach the machine,
      whose ``HeartbeatSeconds`` also covers the wait on the queue, and the message's visibility is
      renewed with it, so at least four renewals fall within ``visibility_timeout_seconds``).
    - ``stop_timeout_seconds``: after SIGTERM, how long in-flight turns may still run before they
      are failed with ``WorkerStopping`` (``STOP_TIMEOUT_SECONDS``, default 100: below ECS's
      maximum ``stopTimeout`` of 120 s, which ends in SIGKILL).
    - ``wait_time_seconds``: SQS long polling (20, the SQS maximum); a stop waits at most this long
      for an idle poll to return.
    - ``visibility_timeout_seconds``: renewed on every heartbeat, so a long turn's message is not
      delivered to another worker meanwhile.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    ENV_NAMES: ClassVar[dict[str, str]] = {
        "coder_queue_url": "CODER_QUEUE_URL",
        "concurrency": "WORKER_CONCURRENCY",
        "heartbeat_seconds": "HEARTBEAT_SECONDS",
        "stop_timeout_seconds": "STOP_TIMEOUT_SECONDS",
    }
    """The variable of each field read from the environment (the others keep their defaults)."""

    coder_queue_url: str = Field(min_length=1, description="The CoderQueue (required).")
    concurrency: int = Field(1, ge=1, le=64, description="Turns run at once, one thread each (default 1).")
    heartbeat_seconds: float = Field(
        40.0,
        gt=0,
        le=40,
        description="SendTaskHeartbeat interval while a turn runs (default and maximum 40 s).",
    )
    stop_timeout_seconds: float = Field(
        100.0,
        gt=0,
        le=120,
        description="After SIGTERM, how long in-flight turns may still run (default 100 s).",
    )
    wait_time_seconds: int = Field(20, ge=0, le=20)
    visibility_timeout_seconds: int = Field(180, ge=1, le=43_200)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> WorkerSettings:
        """The settings in ``env``; raises ``InvalidSettingError`` (a ``ValueError``): one line naming
        the variable, the rule and the value (``HEARTBEAT_SECONDS: must be a number of seconds > 0
        and ≤ 40, got 'x'``; ``alphaagent.settings.describe_error``)."""
        names = cls.ENV_NAMES
        values = {field: env[name] for field, name in names.items() if env.get(name, "").strip()}
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise InvalidSettingError(describe_error(cls, exc)) from None


@lru_cache(maxsize=1)
def worker_settings() -> WorkerSettings:
    """The process's worker settings, read from the environment once."""
    return WorkerSettings.from_env(os.environ)


class CoderMessage(BaseModel):
    """The body of a CoderQueue message, as the state machine's ``MessageBody`` builds it.

    - ``task_token``: ``$$.Task.Token`` of the waiting ``sqs:sendMessage.waitForTaskToken`` task.
    - ``spec``: the spec (DESIGN §4.5) inline, or
    - ``spec_key``: a claim check: the workspace key of the spec written by the machine's prepare
      step, ``{scope key}/spec/{turn_id}.json``; the turn is prepared and only its coding step runs.
    - ``spec_sha256``: with ``spec_key``, the SHA-256 of the spec's bytes as the prepare step wrote
      them; a file that no longer matches is refused (``InvalidMessageError``).
    - ``inputs``: with ``spec_key``, the prepare step's ``PreparedTurn.inputs``.
    Exactly one of ``spec`` and ``spec_key``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    task_token: str = Field(min_length=1, max_length=1024)
    spec: dict[str, Any] | None = None
    spec_key: str | None = Field(None, pattern=r"^.+/spec/[^/]+\.json$", max_length=1024)
    spec_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")
    inputs: list[PreparedInput] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_spec(self) -> CoderMessage:
        if (self.spec is None) == (self.spec_key is None):
            raise ValueError("give exactly one of spec and spec_key")
        if self.spec_key is not None and self.spec_sha256 is None:
            raise ValueError("spec_key needs spec_sha256 (the prepare step's hash of the spec it wrote)")
        return self

    def load_spec(self, backend: Backend) -> Spec:
        """The spec, read from the workspace when the message carries a claim check.

        Raises ``InvalidSpecError`` for a malformed spec, ``FileNotFoundError`` for a missing key,
        ``ValueError`` for a key outside any scope.
        """
        if self.spec is not None:
            return parse_spec(json.dumps(self.spec))
        assert self.spec_key is not None
        scope_key, _, name = self.spec_key.partition("/spec/")
        try:
            scope = scope_from_key(scope_key)
            data = backend.workspace.read_bytes(scope, f"spec/{name}")
        except (ValueError, FileNotFoundError) as exc:
            raise InvalidMessageError(f"spec_key: {self.spec_key!r}: {str(exc).splitlines()[0]}") from None
        if hashlib.sha256(data).hexdigest() != self.spec_sha256:
            # Not the bytes the prepare step wrote: the file lives in a tree that run code can write.
            raise InvalidMessageError(
                f"spec_key: {self.spec_key!r} no longer holds the spec the turn was given"
            )
        spec = parse_spec(data)
        # The file lives in a tree that run code can write: it must still be the spec this key was
        # made for (its scope and turn), or a rewritten file could carry a turn into another scope.
        if spec.scope.key != scope.key or f"{spec.turn_id}.json" != name:
            raise InvalidMessageError(
                f"spec_key: {self.spec_key!r} does not hold the spec of that scope and turn"
            )
        return spec


class TurnPointer(BaseModel):
    """The ``SendTaskSuccess`` output: where the turn's result is, not the result itself (it may be
    larger than the 256 KiB state limit). ``result_key`` is relative to the scope."""

    model_config = ConfigDict(extra="forbid")

    turn_id: str
    status: str
    scope_key: str
    result_key: str

    @classmethod
    def of(cls, spec: Spec, result: TurnResult) -> TurnPointer:
        """The pointer to ``result`` (stored at ``work/turns/{turn_id}/result.json``)."""
        return cls(
            turn_id=result.turn_id,
            status=result.status,
            scope_key=spec.scope.key,
            result_key=f"work/turns/{result.turn_id}/result.json",
        )


class _Task:
    """One message in flight: answered exactly once, whichever of the turn and the stop comes first."""

    def __init__(self, receipt: str, token: str) -> None:
        self.receipt, self.token = receipt, token
        self.done = threading.Event()
        self.answered = False
        self.lock = threading.Lock()
        self.outcome: TurnPointer | BaseException | None = None
        self.spec: Spec | None = None  # known once the message's spec is read


class CoderWorker:
    """Takes messages from the CoderQueue and runs their turns; see the module docstring.

    ``sqs`` and ``sfn`` are boto3 clients (``sqs``, ``stepfunctions``), created by the caller
    (never at import). ``coder`` is ``None`` when no model is configured: specs with pinned steps
    still run, specs without steps fail with ``InvalidSpecError``.

    ``SendTaskFailure`` errors (the contract with the state machine's ``Retry``/``Catch``): what
    ``run_turn`` raised, named by ``FAILURE_CONTRACT`` (``InvalidSpecError``, ``NotFoundError``, or
    the class's own name: ``ScopeBusyError``, a defect's ``RuntimeError``); ``WorkerStopping`` when
    a stop's deadline passed before the turn ended; ``InvalidMessageError`` for a body with a task
    token but no valid spec.
    A turn that ends ``failed`` is a result, answered with ``SendTaskSuccess`` (``status: failed``):
    the turn driver has already recorded it and published ``TurnFailed``.
    """

    def __init__(
        self,
        backend: Backend,
        coder: Coder | None,
        settings: WorkerSettings,
        *,
        sqs: Any,
        sfn: Any,
    ) -> None:
        self.backend, self.coder, self.settings = backend, coder, settings
        self.sqs, self.sfn = sqs, sfn
        self._stopping = threading.Event()
        self._deadline: float | None = None
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Stop taking messages; in-flight turns get ``stop_timeout_seconds`` to finish, then are
        failed with ``WorkerStopping``. Safe to call from a signal handler and more than once."""
        if not self._stopping.is_set():
            self._deadline = time.monotonic() + self.settings.stop_timeout_seconds
            self._stopping.set()

    @property
    def stopping(self) -> bool:
        """Whether ``stop()`` was called."""
        return self._stopping.is_set()

    def run(self) -> None:
        """Run ``concurrency`` polling threads until ``stop()``; returns when every thread is done
        (each in-flight task answered). Joins with a timeout so signals reach the main thread."""
        self._threads = [
            threading.Thread(target=self._poll, name=f"coder-worker-{i}", daemon=True)
            for i in range(self.settings.concurrency)
        ]
        for thread in self._threads:
            thread.start()
        for thread in self._threads:
            while thread.is_alive():
                thread.join(timeout=0.5)

    # ------------------------------------------------------------------ one thread

    def _poll(self) -> None:
        while not self._stopping.is_set():
            try:
                response = self.sqs.receive_message(
                    QueueUrl=self.settings.coder_queue_url,
                    MaxNumberOfMessages=1,
                    WaitTimeSeconds=self.settings.wait_time_seconds,
                    VisibilityTimeout=self.settings.visibility_timeout_seconds,
                )
            except Exception:  # a network or throttling error must not end the worker
                logger.exception("receiving from the CoderQueue failed; retrying")
                self._stopping.wait(1.0)
                continue
            for message in response.get("Messages", []):
                if self._stopping.is_set():
                    # Received during the stop: give it back at once for another worker.
                    self._release(message["ReceiptHandle"])
                    continue
                self.handle(message)

    def handle(self, message: Mapping[str, Any]) -> None:
        """Run the turn of one SQS message (``Body``, ``ReceiptHandle``) and answer its task."""
        receipt = message["ReceiptHandle"]
        try:
            body = CoderMessage.model_validate_json(message["Body"])
        except ValidationError as exc:
            detail = f"the CoderQueue message is not a coder message: {exc.errors()[0]['msg']}"
            token = _task_token_of(message["Body"])
            if token is None:
                # Nobody to answer: the message is delivered again until the queue's DLQ keeps it.
                logger.error("%s (and it carries no task token)", detail)
                return
            self._answer_failure(_Task(receipt, token), InvalidMessageError.__name__, detail)
            return
        task = _Task(receipt, body.task_token)
        if self._task_expired(task):
            # The execution gave up on this task while its message waited in the queue (its
            # HeartbeatSeconds count from the send, and a saturated service has no bound on that
            # wait): it released the scope's lease and nobody waits for the answer, so the turn must
            # not run at all. The message is dropped; the execution's failure path already ended it.
            logger.warning(
                "task %s…%s timed out before a worker took it; dropping its message",
                task.token[:8],
                task.token[-4:],
            )
            self._delete(task)
            return
        turn = threading.Thread(target=self._run_turn, args=(task, body), name="coder-turn", daemon=True)
        turn.start()
        self._attend(task)

    def _run_turn(self, task: _Task, body: CoderMessage) -> None:
        try:
            spec = body.load_spec(self.backend)
            if spec.turn_id is None:  # named here, so a stop can record the turn it interrupts
                spec = spec.model_copy(update={"turn_id": new_ulid()})
            task.spec = spec
            if body.spec_key is not None:
                # Inside the machine: the execution (named by the turn id) holds the scope's lease.
                assert spec.turn_id is not None  # load_spec checked it against the key's name
                result = code_prepared_turn(
                    self.backend, spec, coder=self.coder, holder=spec.turn_id, inputs=body.inputs
                )
            else:
                result = run_turn(self.backend, spec, coder=self.coder)
            task.outcome = TurnPointer.of(spec, result)
        except BaseException as exc:  # the turn's failure is the task's failure, whatever it is
            if not isinstance(exc, AlphaAgentError):
                logger.exception("turn of task %s…%s crashed", task.token[:8], task.token[-4:])
            task.outcome = exc
        finally:
            task.done.set()

    def _attend(self, task: _Task) -> None:
        """Heartbeat until the turn ends or the stop deadline passes, then answer once."""
        interval = self.settings.heartbeat_seconds
        next_beat = time.monotonic() + interval
        alive = True
        while True:
            # Wake at least every second: a stop() may come at any time and set a deadline sooner
            # than the next heartbeat.
            wait = min(next_beat - time.monotonic(), 1.0)
            if self._deadline is not None:
                wait = min(wait, self._deadline - time.monotonic())
            if task.done.wait(max(wait, 0.0)):
                break
            now = time.monotonic()
            if self._deadline is not None and now >= self._deadline:
                reason = (
                    f"the worker stopped before the turn ended ({self.settings.stop_timeout_seconds:g} s)"
                )
                if task.spec is not None and task.spec.turn_id is not None:
                    # Never leave the turn "running": record it failed (TurnFailed) before answering.
                    with contextlib.suppress(Exception):
                        abandon_turn(self.backend, task.spec.user_id, task.spec.turn_id, reason)
                self._answer_failure(
                    task,
                    WORKER_STOPPING,
                    f"the worker was stopped and the turn did not finish within"
                    f" {self.settings.stop_timeout_seconds:g} s",
                )
                return
            if now >= next_beat:
                if alive:
                    alive = self._heartbeat(task)
                next_beat = now + interval
        outcome = task.outcome
        if isinstance(outcome, TurnPointer):
            self._answer_success(task, outcome)
        else:
            assert outcome is not None
            name, cause = contract_name(outcome, FAILURE_CONTRACT), str(outcome) or type(outcome).__name__
            if name != type(outcome).__name__:
                cause = f"{type(outcome).__name__}: {cause}"  # the concrete class, kept for the reader
            self._answer_failure(task, name, cause)

    # ------------------------------------------------------------------ AWS calls

    def _heartbeat(self, task: _Task) -> bool:
        """One heartbeat (and a longer visibility for the message); False once the task is gone."""
        try:
            self.sfn.send_task_heartbeat(taskToken=task.token)
        except Exception as exc:
            if error_code(exc) in _GONE_TASK_ERRORS:
                logger.warning(
                    "task gone (%s); the turn runs on, its answer will be dropped", error_code(exc)
                )
                return False
            logger.warning("SendTaskHeartbeat failed: %s", exc)
        try:
            self.sqs.change_message_visibility(
                QueueUrl=self.settings.coder_queue_url,
                ReceiptHandle=task.receipt,
                VisibilityTimeout=self.settings.visibility_timeout_seconds,
            )
        except Exception as exc:
            logger.warning("extending the message's visibility failed: %s", exc)
        return True

    def _task_expired(self, task: _Task) -> bool:
        """One heartbeat before the turn starts: True when Step Functions says the task is over
        (``TaskTimedOut``, ``TaskDoesNotExist``). Any other answer, a failure included, lets the turn
        run: its answer settles the task either way."""
        try:
            self.sfn.send_task_heartbeat(taskToken=task.token)
        except Exception as exc:
            return error_code(exc) in ("TaskTimedOut", "TaskDoesNotExist")
        return False

    def _delete(self, task: _Task) -> None:
        try:
            self.sqs.delete_message(QueueUrl=self.settings.coder_queue_url, ReceiptHandle=task.receipt)
        except Exception:
            logger.exception("deleting the message failed; it will be delivered again")

    def _answer_success(self, task: _Task, pointer: TurnPointer) -> None:
        self._answer(task, "send_task_success", output=pointer.model_dump_json())

    def _answer_failure(self, task: _Task, error: str, cause: str) -> None:
        self._answer(task, "send_task_failure", error=error[:256], cause=cause[:MAX_CAUSE_CHARS])

    def _answer(self, task: _Task, action: str, **kwargs: str) -> None:
        """Answer the task once (retrying transient errors), then delete the message. When the
        answer cannot be given, the message stays: it is delivered again after its visibility
        timeout, and ``run_turn`` returns the stored result of a finished turn without running it
        twice."""
        with task.lock:
            if task.answered:
                return
            task.answered = True
        for attempt in range(4):
            try:
                getattr(self.sfn, action)(taskToken=task.token, **kwargs)
                break
            except Exception as exc:
                if error_code(exc) in _GONE_TASK_ERRORS:
                    logger.warning("%s: task gone (%s); dropping the message", action, error_code(exc))
                    break
                if attempt == 3:
                    logger.exception("%s failed; the message will be delivered again", action)
                    return
                time.sleep(0.5 * 2**attempt)
        try:
            self.sqs.delete_message(QueueUrl=self.settings.coder_queue_url, ReceiptHandle=task.receipt)
        except Exception:
            logger.exception("deleting the answered message failed")

    def _release(self, receipt: str) -> None:
        try:
            self.sqs.change_message_visibility(
                QueueUrl=self.settings.coder_queue_url, ReceiptHandle=receipt, VisibilityTimeout=0
            )
        except Exception:
            logger.exception("giving a message back to the CoderQueue failed")


def _task_token_of(body: str) -> str | None:
    """The ``task_token`` of a message body that is not a valid ``CoderMessage``, if it has one."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    token = data.get("task_token") if isinstance(data, dict) else None
    return token if isinstance(token, str) and token else None
