"""Identifiers: ULIDs for turns and runs (DESIGN §4.1)."""

from __future__ import annotations

import os
import time

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_ulid(now_ms: int | None = None) -> str:
    """Return a 26-character ULID: 48 bits of Unix time in milliseconds, then 80 random bits.

    ULIDs sort by creation time and are unguessable, so a run's spill directory
    (``work/runs/{run_id}/``) cannot be planted by code that ran before it.
    """
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    value = (ms << 80) | int.from_bytes(os.urandom(10), "big")
    return "".join(_CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5))
