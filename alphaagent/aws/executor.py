"""``run_in_env`` on AWS: the coder invokes ``alphaagent-env-{environment_id}`` asynchronously and reads
the result as soon as it exists (DESIGN §3 step 6).

The invocation is ``InvocationType="Event"``: the function's ``MaximumRetryAttempts: 0`` then means
user code never runs twice on its own, and its destinations record every run on the bus. The executor
does not wait for those hops; it looks for whichever comes first:

- the claim-check object ``work/runs/{run_id}/result.json`` in the scope, which the env function writes
  after every file of the run is synced: the ``RunResult``;
- a run record with status ``failed`` in the store, which the recorder writes from the OnFailure
  destination (the function crashed, timed out or ran out of memory): ``EnvFunctionError``.

With ``notices`` (``alphaagent.aws.notices.RunNotices``, the coder's per-process SQS queue), it looks
once after the invoke and then only when the env function's notice arrives (a long poll, no request
per look), or every ``FALLBACK_POLL_S`` seconds if none comes; after a ``failed`` notice it polls the
failure record on the ladder below until the recorder has written it. Without, it polls from
``poll_start_s`` to ``poll_max_s`` (two requests per look).

Example::

    executor = LambdaExecutor(
        lambda_client=boto3.client("lambda"),
        workspace=S3Workspace(bucket),
        store=DynamoStore(table),
        tenant_isolation=True,
    )
    result = executor.run(workdir, "print(1)", limits=RunLimits(), run_id=run_id, origin=origin)
"""

from __future__ import annotations

import functools
import json
import logging
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from alphaagent.aws import sdk
from alphaagent.aws.notices import FALLBACK_POLL_S, RunNotices
from alphaagent.errors import (
    EnvFunctionError,
    EnvInvokeError,
    EnvPayloadTooLargeError,
    EnvResultTimeoutError,
    EnvThrottledError,
    MissingOriginError,
)
from alphaagent.models.aws import EnvRequest, run_result_key
from alphaagent.models.records import RunRecord
from alphaagent.models.run import RunLimits, RunOrigin, RunResult
from alphaagent.ports import OutputSink, Store, Workspace

MAX_ASYNC_PAYLOAD_BYTES: Final = 256 * 1024
"""256 KiB (262,144 bytes): the limit an invocation payload must stay within. It was Lambda's limit on
asynchronous (``Event``) payloads (AWS's Invoke reference now gives 1 MB), and it is still EventBridge's
limit on one event (PutEvents entry size), which binds here: the payload travels back to the bus as the
``requestPayload`` of the env function's destination record."""

DESTINATION_HEADROOM_BYTES: Final = 8 * 1024
"""Bytes of those 256 KiB kept for the rest of the destination record: the event envelope, the request
and response contexts and the response payload (a pointer, or Lambda's error with its stack trace)."""

DEFAULT_FUNCTION_PREFIX: Final = "alphaagent-env-"
"""Environment functions are named ``alphaagent-env-{environment_id}`` (template.yaml)."""

DEFAULT_STARTUP_MARGIN_S: Final = 120.0
"""Seconds allowed beyond the run's own timeout for a cold start (image pull, zygote preload), the
sync down and the upload. The function itself stops at Lambda's 900 s maximum timeout."""

POLL_START_S: Final = 0.1
POLL_MAX_S: Final = 1.0

THROTTLE_ATTEMPTS: Final = 5
"""Invoke calls per run while Lambda answers 429: a throttled invocation was not accepted, so
calling again cannot run the code twice."""

THROTTLE_BASE_S: Final = 0.5
THROTTLE_MAX_S: Final = 8.0
"""Backoff between throttled attempts: a random delay in ``[0, min(THROTTLE_MAX_S, THROTTLE_BASE_S *
2 ** attempt)]`` seconds (full jitter), about 7.5 s at most over five attempts."""

logger = logging.getLogger(__name__)

_THROTTLE_CODES: Final = frozenset({"TooManyRequestsException", "ThrottlingException"})
"""Error codes of a throttled Invoke (HTTP 429): concurrency or request-rate limits."""


@functools.cache
class LambdaExecutor:
    """``alphaagent.ports.Executor`` for the coder on AWS: each run is one asynchronous invocation of
    the environment function.

    Args:
        lambda_client: a boto3 Lambda client (``boto3.client("lambda")``; created on first use if None).
        workspace: the workspaces bucket (``S3Workspace``), where the claim check appears.
        store: the record store (``DynamoStore``), where the recorder writes a failed run.
        tenant_isolation: the function runs in Lambda's tenant isolation mode (template.yaml always
            creates env functions so): every Invoke then carries the scope key as ``TenantId``, so
            execution environments are never shared between scopes. False only for a function made
            without it (tests, a hand-made function); Lambda refuses an Invoke without ``TenantId``
            in that mode.
        function_prefix: functions are ``{function_prefix}{environment_id}``.
        startup_margin_s: seconds allowed beyond ``limits.timeout_s`` (``DEFAULT_STARTUP_MARGIN_S``).
        poll_start_s, poll_max_s: the polling interval starts at the first and doubles up to the second.
        sleep, clock, wall, jitter: ``time.sleep``, ``time.monotonic``, ``time.time`` (seconds) and
            ``random.uniform`` (the backoff's jitter); injected by tests. The request's ``not_after``
            is ``wall()`` plus the time the executor waits, so the function never changes the scope
            after the executor gave up on the run.
        notices: the process's notice queue (``RunNotices``), or None to poll.
        fallback_poll_s: with notices, seconds between two looks while no notice came.
    """

    publishes_run_events = True

    def __init__(
        self,
        *,
        lambda_client: Any = None,
        workspace: Workspace,
        store: Store,
        tenant_isolation: bool,
        function_prefix: str = DEFAULT_FUNCTION_PREFIX,
        startup_margin_s: float = DEFAULT_STARTUP_MARGIN_S,
        poll_start_s: float = POLL_START_S,
        poll_max_s: float = POLL_MAX_S,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        jitter: Callable[[float, float], float] = random.uniform,
        notices: RunNotices | None = None,
        fallback_poll_s: float = FALLBACK_POLL_S,
    ) -> None:
        self._lambda = lambda_client
        self.workspace = workspace
        self.store = store
        self.tenant_isolation = tenant_isolation
        self.function_prefix = function_prefix
        self.startup_margin_s = startup_margin_s
        self.poll_start_s = poll_start_s
        self.poll_max_s = poll_max_s
        self._sleep = sleep
        self._clock = clock
        self._wall = wall
        self._jitter = jitter
        self.notices = notices
        self.fallback_poll_s = fallback_poll_s

    @property
    def lambda_client(self) -> Any:
        """The Lambda client, created on first use (nothing is created at import or construction)."""
        if self._lambda is None:
            self._lambda = sdk.client("lambda")
        return self._lambda

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
        """Invoke ``{function_prefix}{origin.environment_id}`` with the ``EnvRequest`` of the run and
        wait for its result. ``workdir`` is not used: the code runs in the function's own working copy
        of ``origin.scope``. A failure of user code is a result (status ``error``, ``timeout``...).
        ``on_output`` is ignored: the function is invoked asynchronously and its output arrives
        with its result, all at once.

        Waits at most ``limits.timeout_s + startup_margin_s`` seconds, polling from ``poll_start_s``
        to ``poll_max_s``.

        Raises:
            MissingOriginError: ``origin`` is None.
            EnvPayloadTooLargeError: the payload, with ``DESTINATION_HEADROOM_BYTES`` for its
                destination record, exceeds ``MAX_ASYNC_PAYLOAD_BYTES`` (256 KiB).
            EnvThrottledError: Lambda throttled the Invoke (429) on each of ``THROTTLE_ATTEMPTS``
                calls, spaced by jittered backoff (retryable; ``recorded`` False).
            EnvInvokeError: the Invoke call failed otherwise (``recorded`` False).
            EnvFunctionError: the function failed and the run is recorded failed (``recorded`` True).
            EnvResultTimeoutError: no result and no failure record in time (``recorded`` False).
        """
        if origin is None:
            raise MissingOriginError("origin: the Lambda executor needs the run's turn, user and scope")
        waited_s = limits.timeout_s + self.startup_margin_s
        notice = self._expect(run_id)
        request = EnvRequest.of(
            origin,
            run_id=run_id,
            code=code,
            limits=limits,
            network=network,
            not_after=self._wall() + waited_s,
            notice_queue_url=None if notice is None or self.notices is None else self.notices.queue_url,
        )
        payload = request.model_dump_json().encode("utf-8")
        # Measured as ASCII-escaped JSON, the longest spelling a re-serialised record may use.
        size = len(json.dumps(request.model_dump(mode="json"), ensure_ascii=True))
        if size + DESTINATION_HEADROOM_BYTES > MAX_ASYNC_PAYLOAD_BYTES:
            raise EnvPayloadTooLargeError(
                f"code: the invocation payload is {size:,} bytes; with its destination record it exceeds"
                f" the 256 KiB ({MAX_ASYNC_PAYLOAD_BYTES:,} bytes) limit of an asynchronous invocation's"
                " event; write large inputs to files in the scope and read them from shorter code"
            )
        function = f"{self.function_prefix}{origin.environment_id}"
        try:
            self._invoke(function, payload, origin)
            deadline = self._clock() + waited_s
            return self._await_result(function, origin, run_id, deadline, notice)
        finally:
            if notice is not None and self.notices is not None:
                self.notices.settle(run_id)

    def _expect(self, run_id: str) -> threading.Event | None:
        """The event a notice of ``run_id`` sets, or None to poll (no notices, or no queue)."""
        if self.notices is None:
            return None
        try:
            return self.notices.expect(run_id)
        except sdk.sdk_errors() as error:  # e.g. CreateQueue refused: polling still finds the result
            logger.warning("run notices unavailable; polling for the result: %s", error)
            return None

    def _invoke(self, function: str, payload: bytes, origin: RunOrigin) -> None:
        arguments: dict[str, Any] = {"FunctionName": function, "InvocationType": "Event", "Payload": payload}
        if self.tenant_isolation:
            arguments["TenantId"] = origin.scope.key
        for attempt in range(THROTTLE_ATTEMPTS):
            try:
                response = self.lambda_client.invoke(**arguments)
            except sdk.sdk_errors() as error:
                if not _throttled(error):
                    raise EnvInvokeError(f"invoking {function} failed: {error}") from error
                if attempt + 1 == THROTTLE_ATTEMPTS:
                    raise EnvThrottledError(
                        f"invoking {function}: throttled by Lambda (429) on {THROTTLE_ATTEMPTS} attempts;"
                        " the run did not start, try again later"
                    ) from error
                self._sleep(self._jitter(0.0, min(THROTTLE_MAX_S, THROTTLE_BASE_S * 2**attempt)))
                continue
            break
        status = response.get("StatusCode")
        if status != 202:  # what Lambda answers an accepted asynchronous invocation
            raise EnvInvokeError(f"invoking {function} failed: status {status}, expected 202")

    def _await_result(
        self,
        function: str,
        origin: RunOrigin,
        run_id: str,
        deadline: float,
        notice: threading.Event | None = None,
    ) -> RunResult:
        key = run_result_key(run_id)
        delay = self.poll_start_s
        while True:
            if notice is not None:
                notice.clear()  # set again by a notice that arrives from now on
            try:
                return RunResult.model_validate_json(self.workspace.read_bytes(origin.scope, key))
            except FileNotFoundError:
                pass
            record = self.store.get_run(origin.user_id, run_id)
            if record is not None and record.status == "failed" and not _another_delivery(record):
                name, value = (record.error.name, record.error.value) if record.error else ("Unknown", "")
                raise EnvFunctionError(f"{function} failed for run {run_id}: {name}: {value}")
            left = deadline - self._clock()
            if left <= 0:
                raise EnvResultTimeoutError(
                    f"{function}: no result for run {run_id} within its timeout plus"
                    f" {self.startup_margin_s:g} s; it may still finish and be recorded"
                )
            failed = self.notices is not None and self.notices.heard(run_id) == "failed"
            if notice is not None and not failed:
                notice.wait(min(self.fallback_poll_s, left))
                continue
            self._sleep(min(delay, left))
            delay = min(delay * 2, self.poll_max_s)


def _throttled(error: BaseException) -> bool:
    """Whether an Invoke error is Lambda throttling: code ``TooManyRequestsException`` (or
    ``ThrottlingException``), or HTTP status 429."""
    response: dict[str, Any] = getattr(error, "response", None) or {}
    code = response.get("Error", {}).get("Code")
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code in _THROTTLE_CODES or status == 429


def _another_delivery(record: RunRecord) -> bool:
    """A failure recorded by a duplicate delivery of the invocation that gave up waiting for the
    first one (``alphaagent.errors.EnvDuplicateDeliveryError``): it says nothing of the run itself, whose
    result may still come."""
    return record.error is not None and record.error.name == "EnvDuplicateDeliveryError"


if TYPE_CHECKING:
    from alphaagent.ports import Executor

    # mypy proves here that LambdaExecutor satisfies the Executor Protocol.
    _EXECUTOR_PROTOCOL_CHECK: type[Executor] = LambdaExecutor
