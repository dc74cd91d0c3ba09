"""The clock seam: what code that waits, times out or compares with a deadline asks for the time.

Production code takes a ``Clock`` (defaulting to ``SYSTEM_CLOCK``, the real one) instead of calling
``time``/``datetime`` directly, so that a test can hand it a fake clock that moves only when told to:
a deadline passes without the test sleeping through it, and a wait of 30 s takes no time at all.
"""

from __future__ import annotations

import functools
import threading
import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    """The time as the code that waits and compares with deadlines sees it."""

    def time(self) -> float:
        """Wall-clock time in UNIX seconds (what an ``EnvRequest.not_after`` is compared with)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for measuring waits); its origin is arbitrary."""
        ...

    def utcnow(self) -> datetime:
        """The wall-clock time as a timezone-aware UTC datetime (what leases and records carry)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Pause for ``seconds``."""
        ...

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Pause for up to ``seconds``, ending early once ``event`` is set; True if it is set."""
        ...


class SystemClock:
    """The real clock: ``time.time``, ``time.monotonic``, ``datetime.now(UTC)`` and ``time.sleep``."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def utcnow(self) -> datetime:
        return datetime.now(UTC)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def wait(self, event: threading.Event, seconds: float) -> bool:
        return event.wait(max(seconds, 0.0))


SYSTEM_CLOCK: Clock = SystemClock()
"""The clock every caller uses unless handed another one."""


@functools.cache
def get_clock() -> Clock:
    """The process's clock, for an edge (a CLI command) that hands it to the code it calls; a test
    replaces this getter with one returning a fake clock."""
    return SYSTEM_CLOCK
