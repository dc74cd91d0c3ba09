"""Turn notices: the recorder tells whoever waits for a turn "it has ended, read its record now", so
``alphaagent submit --wait`` and the Python client's wait on the aws backend do not read the state
table every 2 s (issue 11 item 3). The turn record stays the source of truth: a notice carries the
turn id only, and the waiter reads the record when one comes, or every ``FALLBACK_READ_S`` seconds if
none does (a notice lost, or a turn that ended on a path that publishes no event).

How it works (real AWS):

- the waiter creates one queue for the turn it waits for, named by the turn
  (``queue_name(user_id, turn_id)``: ``alphaagent-turns-`` and 32 hex digits of a SHA-256 of the user
  and the turn id), *before* its first read of the record, so an end that comes after that read is
  never missed; SQS-managed encryption, 60 s retention (the SQS minimum: a notice is stale after
  that, the record is not), 20 s long polling (the SQS maximum), and the sweeper's expiry tag
  (``alphaagent.aws.queue_sweeper``) at the end of the wait plus ``EXPIRY_MARGIN_S``;
- every path that ends a turn (the coder worker, finalize_turn on the success and the failure path,
  the orphan release, the state machine's own ``TurnFailed``) publishes ``TurnCompleted`` or
  ``TurnFailed`` on the bus after the record is written, and the recorder receives every one of them
  (its ``TurnEvents`` rule). After persisting it, the recorder sends one ``TurnNotice`` to the queue
  the turn's name gives (``send_turn_notice``); no queue (nobody waits) answers
  ``NonExistentQueue``, which is the common case and costs one request;
- a listener thread long-polls the queue and sets an event; the waiter pauses on the event with the
  injected clock (``Clock.wait``), so the fallback timing stays testable;
- the waiter deletes the queue when it stops (``close``); a waiter killed hard leaves it to the
  hourly sweeper.

Why not the alternatives: an EventBridge rule per waiter (to its own queue) runs into the 300 rules
per bus quota, takes an IAM-sensitive ``events:PutRule``/``PutTargets`` plus a queue policy per
wait, and rules are eventually consistent (a turn that ends in the first seconds is missed); one
rule to one shared queue (or an SNS topic with a filter per waiter) is a fan-out every waiter must
filter or subscribe to, and a subscription left by a dead waiter outlives its queue. A queue named
by the turn needs nothing carried through the spec, the state machine or the events (no contract
changes), and serves a wait on a turn submitted elsewhere (``Client.result(turn_id)``) too.

Limits: two waiters of the same turn share the queue, so one of them gets the notice and the other
its fallback read; a queue deleted less than 60 s ago cannot be created again under its name
(``QueueDeletedRecently``), so a second wait within a minute of the first falls back to reading. A
principal allowed these actions on ``alphaagent-turns-*`` could create the queue of another user's
turn if it knew both the user and the turn id, and would learn when that turn ended (the notice says
nothing else); README, "Waiting for a turn".

Example::

    waiter = TurnWaiter(sqs, user_id, turn_id, lifetime_s=3600)
    waiter.open()                  # botocore error: no notices, poll instead
    try:
        waiter.wait(15)            # True once the turn's end was announced
    finally:
        waiter.close()
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import time
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, ValidationError

from alphaagent.aws import sdk
from alphaagent.aws.queue_sweeper import delete_received, expiry_tags, queue_gone, queue_gone_for_good
from alphaagent.clock import SYSTEM_CLOCK, Clock

QUEUE_NAME_PREFIX: Final = "alphaagent-turns-"
"""Names of the turn-notice queues; template.yaml grants the SQS actions on exactly these."""

LONG_POLL_S: Final = 20
"""``WaitTimeSeconds`` of each ReceiveMessage: the SQS maximum (20 s)."""

RETENTION_S: Final = 60
"""``MessageRetentionPeriod`` of a turn-notice queue: the SQS minimum (60 s)."""

FALLBACK_READ_S: Final = 15.0
"""Seconds between two reads of the turn record while no notice came: a lost notice costs at most
this (against 2 s reads for the whole wait without notices: 240 reads an hour instead of 1,800)."""

EXPIRY_MARGIN_S: Final = 600
"""Seconds past the end of the wait after which the sweeper may delete a queue left behind."""

LISTEN_ERROR_PAUSE_S: Final = 1.0
"""Seconds the listener pauses after a failed ReceiveMessage before trying again."""

logger = logging.getLogger(__name__)


def queue_name(user_id: str, turn_id: str) -> str:
    """The name of the turn-notice queue of ``user_id``'s turn ``turn_id`` (SQS names: at most 80 of
    letters, digits, ``-`` and ``_``; a user id may hold other characters, hence the digest)."""
    digest = hashlib.sha256(f"{user_id}\n{turn_id}".encode()).hexdigest()[:32]
    return f"{QUEUE_NAME_PREFIX}{digest}"


class TurnNotice(BaseModel):
    """The body of a turn notice: the turn whose record now holds its end."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    turn_id: str


def send_turn_notice(sqs: Any, account: str, user_id: str, turn_id: str) -> bool:
    """Tell the waiter of ``user_id``'s turn ``turn_id`` (if any) that its record holds the end;
    ``account`` is the stack's AWS account (the queue is in the client's region). Returns whether a
    waiter's queue took the notice. Never raises: the record is there whether or not anyone hears."""
    url = f"{sqs.meta.endpoint_url}/{account}/{queue_name(user_id, turn_id)}"
    try:
        sqs.send_message(QueueUrl=url, MessageBody=TurnNotice(turn_id=turn_id).model_dump_json())
    except sdk.sdk_errors() as error:
        if not queue_gone(error):
            logger.warning("turn %s: the turn notice was not sent: %s", turn_id, error)
        return False
    return True


class TurnWaiter:
    """The notice queue of one wait for one turn (``open``, then ``wait`` as often as needed, then
    ``close``; thread-safe).

    Args:
        sqs: a boto3 SQS client.
        user_id, turn_id: the turn waited for.
        lifetime_s: seconds the wait may last (the queue's expiry tag is that plus
            ``EXPIRY_MARGIN_S``).
        clock: the clock the waits pause on (a test's fake one moves only when told).
        long_poll_s: ``WaitTimeSeconds`` of each receive (tests shorten it).
    """

    def __init__(
        self,
        sqs: Any,
        user_id: str,
        turn_id: str,
        *,
        lifetime_s: float,
        clock: Clock = SYSTEM_CLOCK,
        long_poll_s: int = LONG_POLL_S,
    ) -> None:
        self.sqs, self.user_id, self.turn_id = sqs, user_id, turn_id
        self._lifetime_s, self._clock, self._long_poll_s = lifetime_s, clock, long_poll_s
        self._heard = threading.Event()
        self._closed = threading.Event()
        self._listener: threading.Thread | None = None
        self.queue_url: str | None = None
        self.notices = 0

    def open(self) -> str:
        """Create the queue and start listening; returns its URL.

        Raises:
            botocore errors: SQS refused (``AccessDenied`` without ``sqs:CreateQueue`` and
                ``sqs:TagQueue`` on ``alphaagent-turns-*``; ``QueueDeletedRecently``): wait without
                notices.
        """
        answer = self.sqs.create_queue(
            QueueName=queue_name(self.user_id, self.turn_id),
            Attributes={
                "MessageRetentionPeriod": str(RETENTION_S),
                "ReceiveMessageWaitTimeSeconds": str(self._long_poll_s),
                "SqsManagedSseEnabled": "true",
            },
            tags=expiry_tags(self._lifetime_s + EXPIRY_MARGIN_S, time.time()),
        )
        self.queue_url = str(answer["QueueUrl"])
        self._listener = threading.Thread(
            target=self._listen, args=(self.queue_url, time.monotonic()), name="turn-notices", daemon=True
        )
        self._listener.start()
        return self.queue_url

    def wait(self, seconds: float) -> bool:
        """Pause up to ``seconds`` on the clock, ending early when a notice of the turn arrives;
        True if one did (then cleared: the next wait waits for the next notice)."""
        heard = self._clock.wait(self._heard, seconds)
        if heard:
            self._heard.clear()
        return heard

    def close(self) -> None:
        """Stop listening and delete the queue (best effort: the sweeper deletes a queue left)."""
        self._closed.set()
        url, self.queue_url = self.queue_url, None
        if url is not None:
            with contextlib.suppress(*sdk.sdk_errors()):
                self.sqs.delete_queue(QueueUrl=url)

    def _listen(self, url: str, created_at: float) -> None:
        while not self._closed.is_set():
            try:
                answer = self.sqs.receive_message(
                    QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=self._long_poll_s
                )
            except sdk.sdk_errors() as error:
                if self._closed.is_set() or queue_gone_for_good(error, created_at):
                    return  # deleted by close() or by the sweeper: the waiter reads on its timer
                # (a queue just made answers "does not exist" for a moment: tried again below)
                logger.warning("receiving turn notices failed; trying again: %s", error)
                self._closed.wait(LISTEN_ERROR_PAUSE_S)
                continue
            messages = answer.get("Messages", [])
            for message in messages:
                with contextlib.suppress(ValidationError):
                    if TurnNotice.model_validate_json(message["Body"]).turn_id == self.turn_id:
                        self.notices += 1
                        self._heard.set()
            delete_received(self.sqs, url, messages)
