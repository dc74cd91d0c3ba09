"""The Python client of a deployed stack (DESIGN §3 step 1): put a spec on the SpecQueue, then
(optionally) wait for its turn's result in the state table, told when to read it by a turn notice
(``alphaagent.aws.turn_notices``) where the caller may create the notice queue.

The stack's outputs name what the client needs: ``SpecQueueUrl`` (the queue to submit to) and
``StateTableName`` (the table to read results from). The CLI reads them from
``ALPHAAGENT_SPEC_QUEUE_URL`` and ``ALPHAAGENT_STATE_TABLE`` (``client_settings``).

Nothing AWS happens at import time: boto3 is imported when a client is first needed, so the local
backend and its CLI work without it.

Example::

    settings = client_settings()
    turn_id = submit_spec(spec, queue_url=settings.spec_queue_url)
    result = wait_for_turn(
        DynamoStore(settings.state_table), spec.user_id, turn_id, timeout_s=3600, spec_sha256=spec.digest()
    )
"""

from __future__ import annotations

import functools
import os
import re
import time
from collections.abc import Callable
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from alphaagent.aws import sdk
from alphaagent.aws.turn_notices import FALLBACK_READ_S, TurnWaiter
from alphaagent.errors import InvalidSpecError, TurnWaitTimeoutError
from alphaagent.ids import new_ulid
from alphaagent.models.records import TurnResult
from alphaagent.models.spec import MAX_SPEC_BYTES, TURN_ID_REUSED, Spec
from alphaagent.ports import Store

SQS_MAX_MESSAGE_BYTES = 256 * 1024
"""The largest SQS message body, in bytes (the SQS quota). A spec's own 64 KiB limit
(``MAX_SPEC_BYTES``, DESIGN §4.5) keeps every submitted spec well inside it."""

QUEUED = "queued"
"""The status ``wait_for_turn`` reports while no turn record is visible to the caller."""


class TurnSignal(Protocol):
    """What ``wait_for_turn`` pauses on between two reads (``TurnWaiter``, or a test's fake)."""

    def wait(self, seconds: float) -> bool:
        """Pause up to ``seconds``; True when the turn's end was announced meanwhile."""
        ...


_QUEUE_URL_REGION = re.compile(r"^https://(?:sqs\.)?([a-z]{2}(?:-[a-z]+)+-\d+)\.")


class ClientSettings(BaseModel):
    """Where the client finds a deployed stack; empty when not set.

    ``spec_queue_url`` is the stack output ``SpecQueueUrl`` (env ``ALPHAAGENT_SPEC_QUEUE_URL``);
    ``state_table`` is the stack output ``StateTableName`` (env ``ALPHAAGENT_STATE_TABLE``);
    ``workspaces_bucket`` is the stack output ``WorkspacesBucketName`` (env
    ``ALPHAAGENT_WORKSPACES_BUCKET``), where ``alphaagent.client`` reads artifacts and files.
    """

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    spec_queue_url: str = Field(
        "", alias="ALPHAAGENT_SPEC_QUEUE_URL", description="--backend aws: the stack output SpecQueueUrl."
    )
    state_table: str = Field(
        "", alias="ALPHAAGENT_STATE_TABLE", description="--backend aws: the stack output StateTableName."
    )
    workspaces_bucket: str = Field(
        "",
        alias="ALPHAAGENT_WORKSPACES_BUCKET",
        description="--backend aws: the stack output WorkspacesBucketName (artifacts and files).",
    )


@functools.cache
def client_settings() -> ClientSettings:
    """The client settings from the process environment, read on first call and cached (tests call
    ``client_settings.cache_clear()`` after changing the environment)."""
    return ClientSettings.model_validate(dict(os.environ))


def queue_region(queue_url: str) -> str | None:
    """The AWS region in an SQS queue URL (``https://sqs.eu-west-1.amazonaws.com/123456789012/q``
    or the legacy ``https://eu-west-1.queue.amazonaws.com/...``), or None if it names none."""
    match = _QUEUE_URL_REGION.match(queue_url)
    return match.group(1) if match else None


def aws_client(service: str, region: str | None = None) -> Any:
    """A boto3 client for ``service`` (imported here, on first use: STYLE 2). ``region`` None means
    the region of the environment or profile. boto3 ships without types, so the client is ``Any``."""
    return sdk.client(service, region)


def submit_spec(spec: Spec, *, queue_url: str, sqs: Any = None) -> str:
    """Send ``spec`` to the stack's SpecQueue as one message and return its turn id.

    A spec without ``turn_id`` is given a new ULID first. The message body is the spec's JSON
    (``None`` fields left out), exactly what the starter (``functions/start_turn.py``) parses.

    Idempotent by turn id: the starter names the turn's execution after it, so submitting the same
    spec with the same ``turn_id`` again (a retry after a lost reply, a duplicate delivery) is
    recognised as a duplicate and acknowledged; it never starts a second turn. To ask for a new turn,
    leave ``turn_id`` out.

    Args:
        spec: a validated spec (``parse_spec``).
        queue_url: the stack output ``SpecQueueUrl``.
        sqs: a boto3 SQS client; if None, one is created for the queue URL's region.

    Raises:
        InvalidSpecError: the serialised spec is larger than the 64 KiB spec limit (DESIGN §4.5). The
            starter would refuse such a body, and the limit is what keeps it inside SQS's 256 KiB
            message limit (``SQS_MAX_MESSAGE_BYTES``). Nothing is sent.
        botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError: SQS refused the message
            or could not be reached (no credentials, no connection).
    """
    if spec.turn_id is None:
        spec = spec.model_copy(update={"turn_id": new_ulid()})
    turn_id = spec.turn_id
    assert turn_id is not None  # set just above
    body = spec.model_dump_json(exclude_none=True)
    size = len(body.encode("utf-8"))
    limit = min(MAX_SPEC_BYTES, SQS_MAX_MESSAGE_BYTES)
    if size > limit:
        raise InvalidSpecError(
            f"spec: {size} bytes serialised is larger than the {limit // 1024} KiB limit (spec"
            f" {MAX_SPEC_BYTES // 1024} KiB, SQS message {SQS_MAX_MESSAGE_BYTES // 1024} KiB);"
            " nothing was sent"
        )
    client = sqs if sqs is not None else aws_client("sqs", queue_region(queue_url))
    client.send_message(QueueUrl=queue_url, MessageBody=body)
    return turn_id


def wait_for_turn(
    store: Store,
    user_id: str,
    turn_id: str,
    *,
    timeout_s: float,
    poll_s: float = 2.0,
    progress: Callable[[str], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    spec_sha256: str | None = None,
    notices: TurnSignal | None = None,
    fallback_s: float = FALLBACK_READ_S,
) -> TurnResult:
    """Read ``store`` for the turn ``turn_id`` of ``user_id`` until it has a result; return it.

    With ``notices`` (a ``TurnWaiter`` opened before this call, ``alphaagent.aws.turn_notices``) the
    record is read once, then again each time a notice says the turn ended, or every ``fallback_s``
    seconds if none comes; without, every ``poll_s`` seconds.

    ``spec_sha256`` (``Spec.digest()`` of the spec submitted) guards a reused turn id: when the turn
    of that id runs a different spec, the starter refused the submission (``SpecRejected``), so the
    turn found is not its answer and ``InvalidSpecError`` is raised instead of returning it.

    ``progress`` is called with each new status: ``"queued"`` while no turn record is visible, then
    the record's ``"running"``, then ``"completed"`` or ``"failed"``. Polls every ``poll_s`` seconds
    (never sleeping past the deadline); ``timeout_s`` is the whole wait, in seconds. ``sleep`` and
    ``clock`` (seconds, monotonic) are injectable for tests.

    Ownership (DESIGN §4.7): ``store.get_turn`` answers None both for a turn not started yet and for
    another user's turn, so another user's turn looks queued until the wait times out; nothing tells
    the two apart.

    A turn that fails before its record exists (its scope lease or its prepare step failed) leaves
    no record to read: it shows only as ``TurnFailed`` on the event bus, and this wait times out.

    Raises:
        InvalidSpecError: the turn of that id runs a different spec than ``spec_sha256``
            (``turn_id: already used for a different spec``).
        TurnWaitTimeoutError: no result after ``timeout_s`` seconds (names the turn, the seconds
            waited and the last status seen).
        botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError: the table could not be
            read.
    """
    start = clock()
    deadline = start + timeout_s
    last: str | None = None
    while True:
        turn = store.get_turn(user_id, turn_id)
        if turn is not None and spec_sha256 is not None and turn.spec_sha256 not in (None, spec_sha256):
            raise InvalidSpecError(TURN_ID_REUSED)
        status = QUEUED if turn is None else turn.status
        if status != last:
            last = status
            if progress is not None:
                progress(status)
        if turn is not None and turn.result is not None:
            return turn.result
        remaining = deadline - clock()
        if remaining <= 0:
            raise TurnWaitTimeoutError(turn_id, clock() - start, status)
        if notices is None:
            sleep(min(poll_s, remaining))
        else:
            notices.wait(min(fallback_s, remaining))


def open_turn_waiter(
    sqs: Any,
    user_id: str,
    turn_id: str,
    *,
    timeout_s: float,
    clock: Any = None,
    say: Callable[[str], None] | None = None,
    poll_s: float = 2.0,
) -> TurnWaiter | None:
    """The notice queue of a wait for ``turn_id`` (``alphaagent.aws.turn_notices``), opened; or None
    when SQS refused it, after telling ``say`` in one line that the wait reads the record every
    ``poll_s`` seconds instead (the caller lacks ``sqs:CreateQueue``/``sqs:TagQueue`` on
    ``alphaagent-turns-*``, or SQS is unreachable)."""
    from alphaagent.clock import SYSTEM_CLOCK

    waiter = TurnWaiter(sqs, user_id, turn_id, lifetime_s=timeout_s, clock=clock or SYSTEM_CLOCK)
    try:
        waiter.open()
    except sdk.sdk_errors() as error:
        code = sdk.error_code(error) or type(error).__name__
        if say is not None:
            why = {
                "AccessDenied": "needs sqs:CreateQueue and sqs:TagQueue on alphaagent-turns-*",
                "AccessDeniedException": "needs sqs:CreateQueue and sqs:TagQueue on alphaagent-turns-*",
                "AWS.SimpleQueueService.QueueDeletedRecently": "a wait on this turn ended under a minute ago",
                "QueueDeletedRecently": "a wait on this turn ended under a minute ago",
            }.get(code, "SQS refused the wait's queue")
            say(f"turn notices unavailable ({code}: {why}); reading the turn record every {poll_s:g} s")
        return None
    return waiter
