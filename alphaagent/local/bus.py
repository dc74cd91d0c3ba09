"""The in-process event bus of the local backend: synchronous, in publish order."""

from __future__ import annotations

import threading
from collections.abc import Callable

from alphaagent.models.events import Event


class InProcessBus:
    """Calls every subscriber with every event, synchronously, in the publisher's thread.

    The recorder subscribes first, so by the time ``publish`` returns the event is in the log and
    its record is written — what the AWS recorder Lambda does a moment later.
    """

    def __init__(self) -> None:
        self._handlers: list[Callable[[Event], None]] = []
        self._lock = threading.Lock()

    def subscribe(self, handler: Callable[[Event], None]) -> None:
        """Call ``handler`` for every event published from now on."""
        with self._lock:
            self._handlers.append(handler)

    def publish(self, event: Event) -> None:
        """Deliver ``event`` to each subscriber; a subscriber's exception propagates to the publisher
        (locally a record that cannot be written must fail the step that produced it)."""
        with self._lock:
            handlers = list(self._handlers)
        for handler in handlers:
            handler(event)
