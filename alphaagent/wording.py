"""How a line for people says a number of things: ``1 turn``, ``2 turns`` (no ``turn(s)``).

Stdlib only and tiny: the CLI imports it at startup, the MCP server, the pinned-steps summary and
the export manifest share it so every count reads the same way.
"""

from __future__ import annotations


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``1 older turn``, ``2 older turns``: ``n`` and ``noun``, plural (``noun + "s"`` unless
    ``plural`` is given) when ``n`` is not 1."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"
