"""A fake of ``alphaagent.clock.Clock``: time moves only when the test (or a sleep) moves it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime


class FakeClock:
    """A clock that stands still until ``advance()`` or ``sleep()`` moves it, both readings at once.

    It starts at the real time (records and leases made with the real clock still compare sensibly),
    records every pause asked of it in ``sleeps`` (seconds), and runs an action scheduled with
    ``after()`` once time reaches it (what "another process does X 0.3 s later" becomes).
    """

    def __init__(self, start: float | None = None) -> None:
        self._wall = time.time() if start is None else start
        self._monotonic = 1_000.0
        self._due: list[tuple[float, Callable[[], None]]] = []
        self._lock = threading.RLock()
        self.sleeps: list[float] = []

    def time(self) -> float:
        with self._lock:
            return self._wall

    def monotonic(self) -> float:
        with self._lock:
            return self._monotonic

    def utcnow(self) -> datetime:
        return datetime.fromtimestamp(self.time(), UTC)

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.advance(seconds)

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """A pause that an event set before it ends at once; otherwise the whole ``seconds`` pass (an
        event set by another thread meanwhile is seen at the end, as it would be after the pause)."""
        if event.is_set():
            return True
        self.sleep(seconds)
        return event.is_set()

    def advance(self, seconds: float) -> None:
        """Move both readings on by ``seconds``, then run the actions that have come due, in order."""
        with self._lock:
            self._wall += seconds
            self._monotonic += seconds
            due = sorted((entry for entry in self._due if entry[0] <= self._monotonic), key=lambda e: e[0])
            self._due = [entry for entry in self._due if entry[0] > self._monotonic]
        for _, action in due:
            action()

    def after(self, seconds: float, action: Callable[[], None]) -> None:
        """Run ``action`` once the clock has moved ``seconds`` on from now."""
        with self._lock:
            self._due.append((self._monotonic + seconds, action))
