"""A queue just created answers "does not exist" for a moment (the SQS CreateQueue reference: wait at
least one second before using a new queue). The listeners of run and turn notices must take that
for "not yet", not for "swept", or the notices they were made for are never heard."""

from __future__ import annotations

import threading
import time
from typing import Any

from alphaagent.aws.notices import RunNotice, RunNotices
from alphaagent.aws.turn_notices import TurnNotice, TurnWaiter


class _NewQueueSQS:
    """An SQS stand-in whose queue is unusable for ``settle_s`` after CreateQueue, then delivers
    what ``pending`` holds."""

    def __init__(self, settle_s: float = 1.0) -> None:
        self.settle_s = settle_s
        self.created = 0.0
        self.pending: list[dict[str, str]] = []
        self.lock = threading.Lock()

    def create_queue(self, **kwargs: Any) -> dict[str, str]:
        self.created = time.monotonic()
        return {"QueueUrl": f"https://sqs.us-east-1.amazonaws.com/123456789012/{kwargs['QueueName']}"}

    def receive_message(self, **kwargs: Any) -> dict[str, Any]:
        from botocore.exceptions import ClientError

        if time.monotonic() - self.created < self.settle_s:
            raise ClientError(
                {"Error": {"Code": "AWS.SimpleQueueService.NonExistentQueue", "Message": "does not exist"}},
                "ReceiveMessage",
            )
        time.sleep(0.05)
        with self.lock:
            out, self.pending = self.pending, []
        return {"Messages": out}

    def delete_message_batch(self, **kwargs: Any) -> None:
        pass

    def delete_queue(self, **kwargs: Any) -> None:
        pass

    def deliver_after_settling(self, body: str) -> None:
        while time.monotonic() - self.created < self.settle_s + 0.2:
            time.sleep(0.05)
        with self.lock:
            self.pending.append({"Body": body, "ReceiptHandle": "r"})


def test_a_turn_waiter_keeps_listening_through_its_new_queues_first_second() -> None:
    # Given a waiter whose new queue says "does not exist" for its first second
    sqs = _NewQueueSQS()
    waiter = TurnWaiter(sqs, "alice", "01TURN", lifetime_s=60, long_poll_s=1)
    waiter.open()
    try:
        # When the turn's notice arrives once the queue is usable
        sqs.deliver_after_settling(TurnNotice(turn_id="01TURN").model_dump_json())

        # Then the waiter hears it (it had not given the queue up for gone)
        assert waiter.wait(10)
    finally:
        waiter.close()


def test_a_coders_run_notices_survive_their_new_queues_first_second() -> None:
    # Given a coder process's notice queue, new, unusable for its first second, and a run awaited
    sqs = _NewQueueSQS()
    notices = RunNotices(sqs)
    try:
        heard = notices.expect("01RUN")

        # When the run's notice arrives once the queue is usable
        sqs.deliver_after_settling(RunNotice(run_id="01RUN", status="ok").model_dump_json())

        # Then it is heard on the same queue (not forgotten as swept)
        assert heard.wait(10)
        assert notices.heard("01RUN") == "ok"
    finally:
        notices.close()
