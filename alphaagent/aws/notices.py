"""Run notices: the env function tells the coder process that invoked a run "its claim check is there,
look now", so the coder does not poll S3 and DynamoDB on a 0.1-1 s ladder (issue 11 item 3).

The claim-check object ``work/runs/{run_id}/result.json`` stays the source of truth; a notice only
says when to look. A notice that is lost (SQS unreachable from a VPC without an SQS endpoint, the
process restarted, a function killed before it could send) costs latency, never a result: the
executor still looks every ``FALLBACK_POLL_S`` seconds.

How it works (real AWS, least new infrastructure):

- each coder process (``RunNotices``) creates its own queue ``alphaagent-runs-{32 hex}`` on its first
  run (``CreateQueue``: SQS-managed encryption, 60 s retention, the SQS minimum, and 20 s long polling,
  the SQS maximum), and deletes it when it stops (``close``). A queue left by a process that crashed
  holds nothing after 60 s; it carries an expiry tag (``alphaagent.aws.queue_sweeper``) that the
  process pushes ``QUEUE_LEASE_S`` ahead at most every ``RENEW_S`` while it runs runs, and the hourly
  sweeper deletes it once that has passed (a process whose queue was swept makes a new one);
- the executor puts the queue's URL in the ``EnvRequest`` (``notice_queue_url``);
- the env function sends one ``RunNotice`` there right after writing the claim check (or, on a
  platform failure, before re-raising), before it removes its claim marker (``send_notice``);
- one listener thread per process long-polls the queue (``WaitTimeSeconds`` 20, up to 10 messages)
  while runs are awaited, and wakes the thread waiting for each run named.

IAM (template.yaml): the coder task role may ``sqs:CreateQueue``, ``sqs:TagQueue``, ``sqs:DeleteQueue``,
``sqs:ReceiveMessage`` and ``sqs:DeleteMessage`` on ``alphaagent-runs-*`` queues of its account and
Region, the env functions ``sqs:SendMessage`` to them; no queue policy is needed (same account).

Example::

    notices = RunNotices()
    event = notices.expect(run_id)      # before invoking
    url = notices.queue_url             # EnvRequest.notice_queue_url
    event.wait(10)                      # True once the env function said the result is there
    notices.settle(run_id)
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
import uuid
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from alphaagent.aws import sdk
from alphaagent.aws.queue_sweeper import delete_received, expiry_tags, queue_gone, queue_gone_for_good

QUEUE_NAME_PREFIX: Final = "alphaagent-runs-"
"""Names of the per-process notice queues; template.yaml grants the SQS actions on exactly these."""

LONG_POLL_S: Final = 20
"""``WaitTimeSeconds`` of each ReceiveMessage: the SQS maximum (20 s)."""

RETENTION_S: Final = 60
"""``MessageRetentionPeriod`` of a notice queue: the SQS minimum (60 s); a notice is stale after that."""

RECEIVE_BATCH: Final = 10
"""Messages per ReceiveMessage: the SQS maximum."""

FALLBACK_POLL_S: Final = 10.0
"""Seconds between two looks for a result while no notice came: a lost notice costs at most this."""

QUEUE_LEASE_S: Final = 6 * 3600
"""Seconds after its last renewal that the sweeper may delete a process's queue."""

RENEW_S: Final = 3600
"""Seconds between two renewals of the queue's expiry tag (one TagQueue an hour at most)."""

LISTEN_ERROR_PAUSE_S: Final = 1.0
"""Seconds the listener pauses after a failed ReceiveMessage before trying again."""

QUEUE_URL: Final = re.compile(
    r"https://sqs\.[a-z0-9-]+\.amazonaws\.com(?:\.cn)?/[0-9]{12}/"
    + re.escape(QUEUE_NAME_PREFIX)
    + r"[0-9a-f]{32}"
)
"""What an ``EnvRequest.notice_queue_url`` may be: a notice queue of this scheme, nothing else."""

logger = logging.getLogger(__name__)


class RunNotice(BaseModel):
    """The body of a notice: the run whose claim check exists (``status`` its result's status), or
    ``"failed"`` when the env function failed (the failure record follows through the recorder)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    status: Literal["ok", "error", "timeout", "killed", "failed"]


def send_notice(sqs: Any, queue_url: str | None, notice: RunNotice) -> None:
    """Send ``notice`` to ``queue_url`` (nothing when None); a failure is logged, never raised: the
    result is in S3 whether or not the caller hears of it, and it looks again in a few seconds."""
    if queue_url is None:
        return
    try:
        sqs.send_message(QueueUrl=queue_url, MessageBody=notice.model_dump_json())
    except sdk.sdk_errors() as error:
        logger.warning("run %s: the run notice was not sent: %s", notice.run_id, error)


class RunNotices:
    """The notice queue of one coder process and the runs it awaits (thread-safe).

    Args:
        sqs: a boto3 SQS client (created on first use when None).
        pause: ``time.sleep``, injected by tests.
    """

    def __init__(self, sqs: Any = None, *, pause: Any = time.sleep, wall: Any = time.time) -> None:
        self._sqs = sqs
        self._pause = pause
        self._wall = wall
        self._renewed = 0.0
        self._created_at = 0.0
        self._lock = threading.Lock()
        self._queue_url: str | None = None
        self._waiting: dict[str, threading.Event] = {}
        self._heard: dict[str, str] = {}
        self._listener: threading.Thread | None = None
        self._closed = False

    @property
    def sqs(self) -> Any:
        """The SQS client, created on first use."""
        if self._sqs is None:
            self._sqs = sdk.client("sqs")
        return self._sqs

    @property
    def queue_url(self) -> str:
        """The URL of this process's queue, created on first use (one CreateQueue).

        Raises:
            botocore errors: SQS refused (the executor then waits without notices).
        """
        with self._lock:
            if self._queue_url is not None and self._wall() - self._renewed >= RENEW_S:
                self._renew(self._queue_url)
            if self._queue_url is None:
                now = self._wall()
                answer = self.sqs.create_queue(
                    QueueName=f"{QUEUE_NAME_PREFIX}{uuid.uuid4().hex}",
                    Attributes={
                        "MessageRetentionPeriod": str(RETENTION_S),
                        "ReceiveMessageWaitTimeSeconds": str(LONG_POLL_S),
                        "SqsManagedSseEnabled": "true",
                    },
                    tags=expiry_tags(QUEUE_LEASE_S, now),
                )
                self._queue_url, self._renewed = str(answer["QueueUrl"]), now
                self._created_at = time.monotonic()
            return self._queue_url

    def _renew(self, url: str) -> None:
        """Push the queue's expiry on (lock held); a queue the sweeper took is forgotten, so the
        caller makes a new one. Any other failure waits for the next renewal."""
        now = self._wall()
        try:
            self.sqs.tag_queue(QueueUrl=url, Tags=expiry_tags(QUEUE_LEASE_S, now))
        except sdk.sdk_errors() as error:
            if queue_gone(error):
                logger.warning("run notice queue %s was swept; making a new one", url)
                self._queue_url = None
                return
            logger.warning("renewing the run notice queue's expiry failed: %s", error)
        self._renewed = now

    def expect(self, run_id: str) -> threading.Event:
        """Start awaiting ``run_id``: the event is set whenever a notice for it arrives (the caller
        clears it before each look). Starts the listener if it is not running."""
        url = self.queue_url
        with self._lock:
            event = self._waiting.setdefault(run_id, threading.Event())
            if self._listener is None or not self._listener.is_alive():
                self._listener = threading.Thread(
                    target=self._listen, args=(url,), name="run-notices", daemon=True
                )
                self._listener.start()
        return event

    def heard(self, run_id: str) -> str | None:
        """The status of the last notice for ``run_id``, or None."""
        with self._lock:
            return self._heard.get(run_id)

    def settle(self, run_id: str) -> None:
        """Stop awaiting ``run_id``."""
        with self._lock:
            self._waiting.pop(run_id, None)
            self._heard.pop(run_id, None)

    def close(self) -> None:
        """Stop listening and delete the queue (best effort: a leftover queue holds nothing after 60 s)."""
        with self._lock:
            self._closed = True
            url, self._queue_url = self._queue_url, None
            for event in self._waiting.values():
                event.set()  # waiters look one last time
        if url is not None:
            with contextlib.suppress(*sdk.sdk_errors()):
                self.sqs.delete_queue(QueueUrl=url)

    def _listen(self, url: str) -> None:
        """Long-poll while runs are awaited; wake the waiter of each run named; delete what was read."""
        while True:
            with self._lock:
                if self._closed or not self._waiting or self._queue_url != url:
                    self._listener = None
                    return
            try:
                answer = self.sqs.receive_message(
                    QueueUrl=url, MaxNumberOfMessages=RECEIVE_BATCH, WaitTimeSeconds=LONG_POLL_S
                )
            except sdk.sdk_errors() as error:
                if self._closed:
                    return
                if queue_gone(error) and not queue_gone_for_good(error, self._created_at):
                    self._pause(LISTEN_ERROR_PAUSE_S)  # just made: not usable for a moment yet
                    continue
                if queue_gone(error):  # swept: the next expect() makes a new queue and listener
                    with self._lock:
                        if self._queue_url == url:
                            self._queue_url = None
                    continue
                logger.warning("receiving run notices failed; looking again: %s", error)
                self._pause(LISTEN_ERROR_PAUSE_S)
                continue
            messages = answer.get("Messages", [])
            for message in messages:
                try:
                    notice = RunNotice.model_validate_json(message["Body"])
                except ValidationError:
                    continue  # not ours to read: deleted below all the same
                with self._lock:
                    event = self._waiting.get(notice.run_id)
                    if event is not None:
                        self._heard[notice.run_id] = notice.status
                        event.set()
            delete_received(self.sqs, url, messages)
