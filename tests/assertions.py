"""Assertions that say why: a failed status check prints the result's reason, error and stderr."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from pydantic import BaseModel

WHY_FIELDS = ("reason", "summary", "error", "error_name", "cause", "stderr", "result")
"""Fields that explain a status, printed in this order when present (``cause``: a Step Functions
execution's; ``result``: a turn record's own result)."""

STDERR_TAIL_CHARS = 2000
"""How much of a long stderr a failure message keeps (its end: where a traceback names the error)."""


def _fields(result: Any) -> Mapping[str, Any]:
    if isinstance(result, BaseModel):
        return {name: getattr(result, name) for name in type(result).model_fields}
    if isinstance(result, Mapping):
        return result
    return {name: getattr(result, name) for name in ("status", *WHY_FIELDS) if hasattr(result, name)}


def _show(value: Any) -> str:
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json", exclude_defaults=True)
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= STDERR_TAIL_CHARS else "..." + text[-STDERR_TAIL_CHARS:]


def why(result: Any) -> str:
    """The explanation a result carries: ``field=value`` for each of WHY_FIELDS that is set."""
    fields = _fields(result)
    parts = [
        f"{name}={_show(fields[name])}" for name in WHY_FIELDS if fields.get(name) not in (None, "", b"")
    ]
    return "; ".join(parts) or f"(no reason given) {_show(result)}"


def assert_status(result: Any, expected: str | Collection[str], context: object = None) -> None:
    """Assert that ``result`` (a pydantic model, a mapping or an object with ``status``) has the
    ``expected`` status (one, or any of a collection); on failure say what it carried instead.

    ``context`` is added to the failure message (an execution's history, the step that ran).
    """
    fields = _fields(result)
    status = fields.get("status")
    allowed = {expected} if isinstance(expected, str) else set(expected)
    if status in allowed:
        return
    wanted = expected if isinstance(expected, str) else " or ".join(sorted(allowed))
    message = f"status {status!r}, expected {wanted!r}: {why(result)}"
    if context is not None:
        message += f"\n{context}"
    raise AssertionError(message)
