"""The audit trail of requests for another user's things (DESIGN §4.7, case ISO-01).

A request naming a conversation, workflow run, session, run or artifact that belongs to another user
is answered exactly as a nonexistent one is: same error, same message, same exit code, no side effect
the requester can see. That answer leaves the operator blind to probing, so each such request is
recorded here, out of the requester's sight: who asked (``requesting_user_id``), for what kind of
thing, and which one. The owner is never named in the record either (the id is enough to look it up).

Where it goes depends on the process (``Backend.audit``):

- locally, one JSON line per request appended to ``$ALPHAAGENT_HOME/audit.jsonl`` (``JsonLinesAudit``):
  never printed, so a CLI user cannot see it on their terminal, and the home is hidden from runs;
- in the AWS functions, one CloudWatch Embedded Metric Format line on the function's log
  (``emf_audit``): a ``ForeignRequests`` metric (namespace ``alphaagent``, dimension ``kind``) that
  an alarm can watch, with the requesting user and the id as log fields.

The check that finds out whether a missing thing is another user's costs the same for a thing that
does not exist at all (one lookup either way), so the answer's timing does not tell them apart.

Example::

    audit_foreign(backend.audit, user_id, "run", run_id)
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Final, Literal, TextIO

from pydantic import BaseModel, ConfigDict, Field

from alphaagent.models.common import ConversationScope, Scope, utcnow

ForeignKind = Literal["conversation", "workflow", "session", "turn", "run", "artifact"]


class ForeignRequest(BaseModel):
    """One request for another user's thing, as the audit records it."""

    model_config = ConfigDict(extra="forbid")

    requesting_user_id: str
    kind: ForeignKind
    requested: str = Field(max_length=300)
    """The id or key the request named (a scope key, a run or session id), cut to 300 characters."""
    at: datetime = Field(default_factory=utcnow)


ProbeAudit = Callable[[ForeignRequest], None]
"""Records one ``ForeignRequest``; must not raise into the request it records."""

METRIC_NAME: Final = "ForeignRequests"
METRIC_NAMESPACE: Final = "alphaagent"


def audit_foreign(audit: ProbeAudit, user_id: str, kind: ForeignKind, requested: str) -> None:
    """Record that ``user_id`` asked for another user's ``kind`` ``requested``. A failing audit
    sink is swallowed: the requester's answer must not change because the trail could not be written."""
    try:
        audit(ForeignRequest(requesting_user_id=user_id, kind=kind, requested=requested[:300]))
    except Exception:  # the answer must stay the same whatever the sink does
        return


def audit_scope(audit: ProbeAudit, user_id: str, scope: Scope, kind: ForeignKind | None = None) -> None:
    """Record a request of ``user_id`` for another user's scope (or, with ``kind``, for a thing in
    it, such as an artifact): the kind defaults to the scope's own (conversation or workflow)."""
    own: ForeignKind = "conversation" if isinstance(scope, ConversationScope) else "workflow"
    audit_foreign(audit, user_id, kind or own, scope.key)


def discard_audit(_request: ForeignRequest) -> None:
    """A sink that records nothing (tests and processes without a trail)."""


class JsonLinesAudit:
    """Appends each request as one JSON line to ``path`` (created with mode 0600, never truncated).

    The request thread only queues the record; a writer thread appends it (one ``write`` of one line
    with ``O_APPEND``, so concurrent processes do not interleave lines). That keeps the foreign answer
    in the timing class of the missing one: the file write (~15 µs here) is not on its path
    (``bench/probes.py``). ``flush`` waits for the queue; ``close`` flushes and stops the writer.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._queue: queue.SimpleQueue[ForeignRequest | None] = queue.SimpleQueue()
        self._pending = 0
        self._idle = threading.Condition()
        self._writer: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def __call__(self, request: ForeignRequest) -> None:
        """Queue ``request`` for the writer."""
        with self._start_lock:
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_all, name="audit-writer", daemon=True)
                self._writer.start()
        with self._idle:
            self._pending += 1
        self._queue.put(request)

    def _write_all(self) -> None:
        while (request := self._queue.get()) is not None:
            try:
                line = (request.model_dump_json() + "\n").encode("utf-8")
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    os.write(fd, line)
                finally:
                    os.close(fd)
            except OSError:
                pass  # a trail that cannot be written must not stop the next lines
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until every queued request is written (at most ``timeout_s`` seconds)."""
        with self._idle:
            self._idle.wait_for(lambda: self._pending == 0, timeout=timeout_s)

    def close(self) -> None:
        """Write what is queued, then stop the writer."""
        self.flush()
        with self._start_lock:
            if self._writer is not None:
                self._queue.put(None)
                self._writer.join(timeout=5)
                self._writer = None

    def read(self) -> list[ForeignRequest]:
        """Every request recorded so far, oldest first ([] before the first); flushes first."""
        self.flush()
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        return [ForeignRequest.model_validate_json(line) for line in text.splitlines() if line]


def emf_audit(stream: TextIO | None = None) -> ProbeAudit:
    """A sink printing each request as one CloudWatch Embedded Metric Format line to ``stream``
    (stdout: the Lambda function's log, where CloudWatch turns it into the ``ForeignRequests``
    metric with dimension ``kind``; AWS, "Specification: Embedded metric format")."""

    def record(request: ForeignRequest) -> None:
        document = {
            "_aws": {
                "Timestamp": int(request.at.timestamp() * 1000),
                "CloudWatchMetrics": [
                    {
                        "Namespace": METRIC_NAMESPACE,
                        "Dimensions": [["kind"]],
                        "Metrics": [{"Name": METRIC_NAME, "Unit": "Count"}],
                    }
                ],
            },
            "kind": request.kind,
            METRIC_NAME: 1,
            "requesting_user_id": request.requesting_user_id,
            "requested": request.requested,
            "message": "request for another user's resource (answered as not found)",
        }
        print(json.dumps(document), file=stream or sys.stdout, flush=True)

    return record
