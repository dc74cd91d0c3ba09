"""Shared test set-up for every test directory."""

from __future__ import annotations

import functools
import threading
from typing import Any


def _serialise_moto_dynamodb() -> None:
    """Make each simulated DynamoDB request atomic, as the real service is.

    moto's DynamoDB backend is not thread-safe: a ``TransactWriteItems`` deep-copies a table while
    another thread's ``PutItem`` changes it ("dictionary changed size during iteration"), so the tests
    that run turns concurrently (three deliveries of one spec, concurrent registrations) failed at
    random. A DynamoDB request calls no other service, so one lock around its dispatch cannot deadlock.
    """
    from moto.dynamodb.responses import DynamoHandler

    if getattr(DynamoHandler.call_action, "_serialised", False):
        return
    lock = threading.RLock()
    original = DynamoHandler.call_action

    @functools.wraps(original)
    def call_action(self: Any) -> Any:
        with lock:
            return original(self)

    call_action._serialised = True  # type: ignore[attr-defined]
    DynamoHandler.call_action = call_action  # type: ignore[method-assign]


_serialise_moto_dynamodb()
