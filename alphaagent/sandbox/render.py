"""The readable rendering of a run result for people (``alphaagent exec`` without ``--json``) and
for the model (the coder's ``run_in_env`` result).
"""

from __future__ import annotations

from collections.abc import Iterator

from alphaagent.models.common import printable_path
from alphaagent.models.run import (
    RunResult,
    StateReport,
)


def iter_result_lines(result: RunResult, *, full_output: str | None = None) -> Iterator[str]:
    """Readable rendering of a result for people (``alphaagent exec`` without ``--json``);
    ``full_output`` replaces what the last line says of the spill files (where they are, or that
    they were not kept) when the output was truncated."""
    if result.stdout:
        yield result.stdout.rstrip("\n")
    if result.stderr:
        yield from (f"stderr | {line}" for line in result.stderr.rstrip("\n").splitlines())
    if result.error:
        if result.error.traceback:
            yield result.error.traceback.rstrip("\n")
        else:
            yield f"{result.error.name}: {result.error.value}"
    summary = (
        f"[{result.status}] exit={result.exit_code} {result.duration_ms} ms,"
        f" isolation={result.isolation.level}"
    )
    if result.reason:
        summary += f" ({result.reason})"
    yield summary
    for kind in ("created", "modified", "deleted"):
        paths = getattr(result.files, kind)
        if paths:
            yield f"{kind}: {', '.join(printable_path(path) for path in paths)}"
    for skipped in result.files.skipped:
        yield f"skipped: {printable_path(skipped.path)} ({skipped.reason})"
    if result.state is not None and (line := state_line(result.state)):
        yield line
    if result.stdout_truncated or result.stderr_truncated:
        yield full_output or f"full output: {result.stdout_path or '-'} {result.stderr_path or '-'}"


def state_line(state: StateReport) -> str:
    """One readable line on a run's live state: what was restored, and each skipped name once with
    its reason; "" when there is nothing to say."""
    parts = []
    if state.fresh:
        parts.append("fresh globals (the saved state is kept)")
    elif state.restored_count:
        more = state.restored_count - len(state.restored)
        parts.append("restored " + ", ".join(state.restored) + (f" (+{more} more)" if more > 0 else ""))
    if state.skipped:
        parts.append("not kept: " + "; ".join(f"{name} ({why})" for name, why in state.skipped.items()))
    if state.save_error:
        parts.append(f"not saved: {state.save_error}")
    return f"state: {' | '.join(parts)}" if parts else ""
