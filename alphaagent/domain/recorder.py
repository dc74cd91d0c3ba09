"""The recorder: turns run, registration and session events into records.

The same functions run in the AWS recorder Lambda (fed by EventBridge) and, locally, as a
subscriber of the in-process bus.
"""

from __future__ import annotations

from alphaagent.models.common import utcnow
from alphaagent.models.events import CitationEmitted, Event, RunCompleted, RunFailed
from alphaagent.models.records import Citation, RunRecord
from alphaagent.models.run import RunResult
from alphaagent.ports import Store
from alphaagent.sandbox.capture import STORED_HISTORY_CAP_BYTES, truncate_text

MAX_STORED_CODE_BYTES = 64 * 1024
"""Code kept in a run record (the full code is in the turn's transcript)."""


def run_record_from(detail: RunCompleted | RunFailed, code: str) -> RunRecord:
    """A history record of a run, outputs truncated a second time to 16 KiB per stream
    (DESIGN §4.3), keeping the true byte counts and marking the truncation."""
    if isinstance(detail, RunFailed):
        return RunRecord(
            run_id=detail.run_id,
            turn_id=detail.turn_id,
            session_id=detail.session_id,
            user_id=detail.user_id,
            scope_key=detail.scope.key,
            status="failed",
            exit_code=None,
            code=truncate_text(code, MAX_STORED_CODE_BYTES)[0],
            stdout="",
            stderr="",
            stdout_bytes=0,
            stderr_bytes=0,
            stdout_truncated=False,
            stderr_truncated=False,
            error=detail.error,
            reason=detail.error.value,
            duration_ms=0,
            files_changed=[],
            created_at=utcnow(),
        )
    result = RunResult.model_validate(detail.result)
    stdout, out_cut = truncate_text(
        result.stdout, STORED_HISTORY_CAP_BYTES, printed_bytes=result.stdout_bytes
    )
    stderr, err_cut = truncate_text(
        result.stderr, STORED_HISTORY_CAP_BYTES, printed_bytes=result.stderr_bytes
    )
    return RunRecord(
        run_id=result.run_id,
        turn_id=detail.turn_id,
        session_id=detail.session_id,
        user_id=detail.user_id,
        scope_key=detail.scope.key,
        status=result.status,
        exit_code=result.exit_code,
        code=truncate_text(code, MAX_STORED_CODE_BYTES)[0],
        stdout=stdout,
        stderr=stderr,
        stdout_bytes=result.stdout_bytes,
        stderr_bytes=result.stderr_bytes,
        stdout_truncated=result.stdout_truncated or out_cut,
        stderr_truncated=result.stderr_truncated or err_cut,
        error=result.error,
        reason=result.reason,
        duration_ms=result.duration_ms,
        files_changed=result.files_changed,
        stdout_path=result.stdout_path,
        stderr_path=result.stderr_path,
        created_at=utcnow(),
        state=result.state,
    )


MAX_EVENT_FILES = 1000
"""Paths of ``files_changed`` kept in a run event (the run result given to the coder has them all)."""


def history_view(result: RunResult) -> RunResult:
    """The result as events and records carry it: outputs cut to the stored-history cap (16 KiB per
    stream), ``files_changed`` to 1,000 paths (``files.truncated`` says so), so an event stays far
    below EventBridge's 256 KiB and a record below DynamoDB's 400 KB (case PER-01)."""
    stdout, out_cut = truncate_text(
        result.stdout, STORED_HISTORY_CAP_BYTES, printed_bytes=result.stdout_bytes
    )
    stderr, err_cut = truncate_text(
        result.stderr, STORED_HISTORY_CAP_BYTES, printed_bytes=result.stderr_bytes
    )
    files = result.files
    many = len(result.files_changed) > MAX_EVENT_FILES
    if (
        many
        or len(files.created) + len(files.modified) + len(files.deleted) + len(files.skipped)
        > MAX_EVENT_FILES
    ):
        files = files.model_copy(
            update={
                "created": files.created[:MAX_EVENT_FILES],
                "modified": files.modified[:MAX_EVENT_FILES],
                "deleted": files.deleted[:MAX_EVENT_FILES],
                "skipped": files.skipped[:MAX_EVENT_FILES],
                "truncated": True,
            }
        )
    return result.model_copy(
        update={
            "stdout": stdout,
            "stderr": stderr,
            "stdout_truncated": result.stdout_truncated or out_cut,
            "stderr_truncated": result.stderr_truncated or err_cut,
            "files_changed": result.files_changed[:MAX_EVENT_FILES],
            "files": files,
        }
    )


DUPLICATE_DELIVERY_ERROR = "EnvDuplicateDeliveryError"
"""The error of a duplicate delivery of an env invocation that gave up waiting for the first one
(``alphaagent.errors.EnvDuplicateDeliveryError``)."""


class Recorder:
    """Persists what events report. ``handle`` is idempotent: a redelivered event changes nothing."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def handle(self, event: Event) -> None:
        """Append the event to the log, then persist its record (runs and citations). A run's record
        never goes from a result (``RunCompleted``) back to ``failed``."""
        self.store.append_event(event)
        detail = event.detail
        if isinstance(detail, RunFailed):
            if detail.error.name == DUPLICATE_DELIVERY_ERROR and self.store.get_run(
                detail.user_id, detail.run_id
            ):
                # A duplicate delivery of the invocation gave up waiting for the first one: this says
                # nothing of the run, whose record (a result or its real failure) stays as it is.
                return
            # A failure reported after the run's result (the coder's own deadline, a late duplicate)
            # never replaces it; checked in the write itself, so a concurrent result cannot slip in.
            self.store.put_run(run_record_from(detail, detail.code), only_over_failed=True)
        elif isinstance(detail, RunCompleted):
            self.store.put_run(run_record_from(detail, detail.code))
        elif isinstance(detail, CitationEmitted):
            self.store.add_citation(
                Citation(
                    citation_id=detail.citation.citation_id,
                    turn_id=detail.turn_id,
                    scope_key=detail.scope.key,
                    user_id=detail.user_id,
                    source=detail.citation.source,
                    locator=detail.citation.locator,
                    quote=detail.citation.quote,
                    claim=detail.citation.claim,
                    created_at=event.time,
                )
            )
