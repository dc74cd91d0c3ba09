"""Saying that a run waits, when it waits long: a first run's zygote start is 3-4 s of preloading
(``bench/zygote_start.py``), which a person watching the live output took for a hang (new-user
review). A command that shows live output (``run``, ``exec``) listens (``waits_told_to``); the
sandbox marks each wait (``announced``); a wait still going after ``WAIT_NOTICE_S`` is told once.
Without a listener (the Python API, the MCP server, the env function) nothing is started at all."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

WAIT_NOTICE_S = 1.0
"""Seconds a wait goes on before it is told: a warm run starts in milliseconds and is never told."""

_listeners: list[Callable[[str], None]] = []


@contextlib.contextmanager
def waits_told_to(listener: Callable[[str], None]) -> Iterator[None]:
    """While inside, every long wait (``announced``) of this process is told to ``listener`` (called
    from a timer thread, with the message)."""
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)


@contextlib.contextmanager
def announced(message: str) -> Iterator[None]:
    """Mark a wait (``starting the environment builtin …``): if it lasts ``WAIT_NOTICE_S`` or more,
    ``message`` is told to the listeners once; a shorter one says nothing."""
    if not _listeners:
        yield
        return
    listeners = list(_listeners)
    timer = threading.Timer(WAIT_NOTICE_S, lambda: [listener(message) for listener in listeners])
    timer.daemon = True  # never keeps a process alive
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
