"""Leftover notice queues: the per-process run-notice queues (``alphaagent-runs-*``,
``alphaagent.aws.notices``) and the per-wait turn-notice queues (``alphaagent-turns-*``,
``alphaagent.aws.turn_notices``) are deleted by their owner when it stops; an owner killed hard
(SIGKILL, an ECS task stopped past its timeout, a laptop closed mid-wait) leaves its queue behind, and
SQS has no queue TTL (it only *may* delete a queue inactive for 30 days).

So every notice queue carries an expiry tag, ``alphaagent-expires-at`` (UNIX seconds), set when it is
created and pushed forward by an owner that lives longer (the coder renews it hourly), and the stack's
``SweepNoticeQueuesFunction`` runs every hour: it lists the queues of both prefixes (``ListQueues``
with ``QueueNamePrefix``, paginated: without ``MaxResults`` SQS returns at most 1,000 names and no
token), reads each one's tags (``ListQueueTags``) and deletes those whose expiry has passed. A queue
without the tag (made before the tag existed, or by hand) is deleted once its ``CreatedTimestamp`` is
older than ``UNTAGGED_MAX_AGE_S``. At most ``MAX_DELETES_PER_SWEEP`` queues go per run; the next run
goes on. Deleting a queue whose owner is in fact alive costs that owner its notices only: it falls
back to reading the record (turns) or looking at the claim check (runs) on its own timer, and the
coder makes a new queue on its next run.

Example::

    report = sweep(sdk.client("sqs"), now=time.time())
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from typing import Any, Final

from pydantic import BaseModel

from alphaagent.aws import sdk

EXPIRES_TAG: Final = "alphaagent-expires-at"
"""The tag that says when a notice queue may be deleted (UNIX seconds, an integer as text)."""

SWEPT_PREFIXES: Final = ("alphaagent-runs-", "alphaagent-turns-")
"""The queue name prefixes the sweeper examines (and the only ones its role may delete)."""

UNTAGGED_MAX_AGE_S: Final = 24 * 3600
"""Seconds after which a notice queue without the expiry tag is taken for a leftover."""

MAX_DELETES_PER_SWEEP: Final = 1000
"""Queues one run deletes at most (about one second of DeleteQueue calls each; the function's
timeout is 300 s); the rest wait for the next hourly run."""

LIST_PAGE: Final = 1000
"""``MaxResults`` of a ListQueues page: the SQS maximum (1,000)."""

_GONE: Final = frozenset({"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"})
"""The error codes of a queue deleted meanwhile (by its owner or a sweeper run before)."""

logger = logging.getLogger(__name__)


def expiry_tags(lifetime_s: float, now: float) -> dict[str, str]:
    """The tags of a notice queue that may be swept ``lifetime_s`` seconds after ``now`` (UNIX s)."""
    return {EXPIRES_TAG: str(math.ceil(now + lifetime_s))}


def delete_received(sqs: Any, url: str, messages: list[dict[str, Any]]) -> None:
    """Delete what one ReceiveMessage returned (one DeleteMessageBatch: at most 10, as received);
    best effort, since a notice left behind is only read again, and expires with the queue."""
    if not messages:
        return
    with contextlib.suppress(*sdk.sdk_errors()):
        sqs.delete_message_batch(
            QueueUrl=url,
            Entries=[
                {"Id": str(number), "ReceiptHandle": message["ReceiptHandle"]}
                for number, message in enumerate(messages)
            ],
        )


NEW_QUEUE_SETTLE_S: Final = 5.0
"""Seconds after CreateQueue during which "does not exist" means the queue is not usable yet, not
that it is gone: the CreateQueue API reference says to wait at least one second after creating a
queue before using it; five leave room for a slow propagation."""


def queue_gone_for_good(error: BaseException, created_at: float) -> bool:
    """Whether ``error`` says the queue does not exist, past ``NEW_QUEUE_SETTLE_S`` after it was
    created (``created_at``: ``time.monotonic()`` of the CreateQueue that made it)."""
    return queue_gone(error) and time.monotonic() - created_at >= NEW_QUEUE_SETTLE_S


def queue_gone(error: BaseException) -> bool:
    """Whether ``error`` (a botocore ``ClientError``) says the queue does not exist."""
    return sdk.error_code(error) in _GONE


class SweepReport(BaseModel):
    """What one sweep did: queues examined, deleted, and kept (alive or not expired yet)."""

    examined: int = 0
    deleted: int = 0
    kept: int = 0


def _expired(sqs: Any, url: str, now: float) -> bool:
    tags = sqs.list_queue_tags(QueueUrl=url).get("Tags", {})
    if EXPIRES_TAG in tags:
        try:
            return float(tags[EXPIRES_TAG]) < now
        except ValueError:
            logger.warning("queue %s: unreadable %s tag %r; kept", url, EXPIRES_TAG, tags[EXPIRES_TAG])
            return False
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["CreatedTimestamp"])
    created = float(attributes.get("Attributes", {}).get("CreatedTimestamp", now))
    return now - created > UNTAGGED_MAX_AGE_S


def sweep(
    sqs: Any, *, now: float, prefixes: tuple[str, ...] = SWEPT_PREFIXES, limit: int = MAX_DELETES_PER_SWEEP
) -> SweepReport:
    """Delete the notice queues of ``prefixes`` whose expiry has passed at ``now`` (UNIX s), at most
    ``limit`` of them. A queue that vanishes meanwhile is skipped; any other failure on one queue is
    logged and that queue kept (the next run looks again).

    Raises:
        botocore errors: ListQueues itself failed (the scheduled run is retried by Lambda).
    """
    report = SweepReport()
    for prefix in prefixes:
        pages = sqs.get_paginator("list_queues").paginate(QueueNamePrefix=prefix, MaxResults=LIST_PAGE)
        for page in pages:
            for url in page.get("QueueUrls", []):
                if report.deleted >= limit:
                    return report
                report.examined += 1
                try:
                    if not _expired(sqs, url, now):
                        report.kept += 1
                        continue
                    sqs.delete_queue(QueueUrl=url)
                    report.deleted += 1
                except sdk.sdk_errors() as error:
                    if not queue_gone(error):
                        logger.warning("queue %s: not swept: %s", url, error)
                        report.kept += 1
    return report
