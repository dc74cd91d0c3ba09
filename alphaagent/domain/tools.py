"""The five coder tools of DESIGN §4.6, written once and model-free.

The steps driver calls them directly; the coder (issue 5) wraps each in an MCP tool that turns an
``AlphaAgentError`` into an ``is_error`` result. Every call is scoped to one turn's
``TurnContext``: its user, scope and session, so a tool can never reach another scope.
"""

from __future__ import annotations

import json
import mimetypes
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from pydantic import BaseModel

from alphaagent.connectors import fetch, names
from alphaagent.domain.artifacts import register_artifact as register_artifact_version
from alphaagent.domain.backend import Backend
from alphaagent.domain.decoding import decode_in_child
from alphaagent.domain.documents import (
    DECODED_IN_CHILD,
    DEFAULT_PAGE_CHARS,
    MAX_DOCUMENT_BYTES,
    MAX_PAGE_CHARS,
    DocumentPage,
    document_text,
)
from alphaagent.domain.recorder import history_view
from alphaagent.errors import (
    AlphaAgentError,
    DecodeRefusedError,
    PathRuleError,
    SandboxError,
    ScopeBusyError,
    ToolError,
)
from alphaagent.ids import new_ulid
from alphaagent.models.common import ArtifactKind, Scope, check_workspace_path, utcnow
from alphaagent.models.events import ArtifactRegistered, CitationEmitted, Event, RunCompleted, RunFailed
from alphaagent.models.records import ArtifactRef, ArtifactVersion, CitationRef, PreparedInput, Session
from alphaagent.models.run import RunError, RunLimits, RunOrigin, RunResult
from alphaagent.models.spec import Spec
from alphaagent.ports import OutputSink
from alphaagent.sandbox.session import is_session_state

MAX_STORED_CODE_CHARS = 64 * 1024
MAX_CITATIONS_PER_TURN = 200
MAX_REGISTRATIONS_PER_TURN = 100
MAX_CITATION_FIELD_CHARS = 2000


@dataclass
class TurnContext:
    """What the tools of one turn share: who, where, and what the turn has produced so far."""

    backend: Backend
    spec: Spec
    turn_id: str
    session: Session
    progress: Callable[[str], None] = lambda _message: None
    run_ids: list[str] = field(default_factory=list)
    artifacts: list[ArtifactVersion] = field(default_factory=list)
    citations: list[CitationRef] = field(default_factory=list)
    fetched: list[str] = field(default_factory=list)
    origins: dict[str, str] = field(default_factory=dict)  # docs/ path -> where it came from
    fetched_sources: set[str] = field(default_factory=set)  # URLs connectors fetched this turn
    lease_held: Callable[[], bool] = lambda: True
    on_output: OutputSink | None = None  # a live view of each run's output (the CLI's terminal)
    inputs: list[PreparedInput] = field(default_factory=list)  # what the turn brought into docs/

    def check_lease(self) -> None:
        """Raise ``ScopeBusyError`` once the turn has lost its scope lease (fencing: no run or
        registration of a turn another turn has already taken over)."""
        if not self.lease_held():
            raise ScopeBusyError(f"turn {self.turn_id} lost its lease on {self.scope.key}")

    @property
    def scope(self) -> Scope:
        return self.spec.scope

    @property
    def user_id(self) -> str:
        return self.spec.user_id

    def publish(self, detail: Any) -> None:
        self.backend.bus.publish(Event.of(detail, new_ulid()))


# ----------------------------------------------------------------------------- run_in_env


def run_in_env(
    ctx: TurnContext, code: str, timeout_s: float | None = None, *, fresh: bool = False
) -> RunResult:
    """Run ``code`` in the scope's environment; the result of DESIGN §4.4 (a failure of the code is
    data). The run's globals are the session's live state (DESIGN §4.7): what earlier runs of the
    session left is restored, what this one leaves is saved; ``fresh``: start with empty globals
    and leave the saved state as it is. Raises ``ToolError`` when the turn's run budget
    (``constraints.max_runs``) is spent or the timeout is out of range, ``SandboxError`` when the
    platform fails (a ``RunFailed`` event is recorded first).

    Each run gets exactly one run event: published here, or by the platform when the executor says
    it records runs itself (``Executor.publishes_run_events``: the env Lambda's destinations on AWS).
    """
    ctx.check_lease()
    constraints = ctx.spec.constraints
    if len(ctx.run_ids) >= constraints.max_runs:
        raise ToolError(
            f"run budget spent: this turn allows {constraints.max_runs} runs (constraints.max_runs)"
        )
    limit = constraints.run_timeout_s if timeout_s is None else timeout_s
    if not 0 < limit <= constraints.run_timeout_s:
        raise ToolError(
            f"timeout_s: must be > 0 and <= {constraints.run_timeout_s:g} (constraints.run_timeout_s)"
        )
    run_id = new_ulid()
    ctx.run_ids.append(run_id)
    ctx.backend.store.touch_session(ctx.session.session_id, utcnow())
    executor = ctx.backend.executor
    workdir = ctx.backend.workspace.local_root(ctx.scope)
    origin = RunOrigin(
        turn_id=ctx.turn_id,
        session_id=ctx.session.session_id,
        user_id=ctx.user_id,
        scope=ctx.scope,
        environment_id=ctx.spec.environment_id,
        fresh=fresh,
    )
    common = {
        "turn_id": ctx.turn_id,
        "scope": ctx.scope,
        "run_id": run_id,
        "session_id": ctx.session.session_id,
        "user_id": ctx.user_id,
        "code": code[:MAX_STORED_CODE_CHARS],
    }
    limits = RunLimits(timeout_s=limit)
    try:
        # Only a caller that wants a live view passes a sink: executors that cannot stream need
        # not know the argument.
        if ctx.on_output is None:
            result = executor.run(workdir, code, limits=limits, run_id=run_id, origin=origin)
        else:
            result = executor.run(
                workdir, code, limits=limits, run_id=run_id, origin=origin, on_output=ctx.on_output
            )
    except SandboxError as exc:
        if not exc.recorded:
            error = RunError(name=type(exc).__name__, value=str(exc), traceback="")
            ctx.publish(RunFailed(**common, error=error))
        raise
    finally:
        # The session was in use until the run ended: a turn whose runs together outlast the idle
        # timeout must not find its session expired between two of them (SES-01).
        ctx.backend.store.touch_session(ctx.session.session_id, utcnow())
    if not executor.publishes_run_events:
        view = history_view(result).model_dump(mode="json")
        ctx.publish(RunCompleted(**common, status=result.status, result=view))
    return result


# ----------------------------------------------------------------------------- read_document


def read_document(
    ctx: TurnContext, path: str, offset: int = 0, limit: int = DEFAULT_PAGE_CHARS
) -> DocumentPage:
    """A page of a document in the scope, by character ``offset`` and ``limit`` (max 200,000)."""
    normal = _scope_path(ctx, path)
    if offset < 0 or not 0 < limit <= MAX_PAGE_CHARS:
        raise ToolError(f"offset must be >= 0 and limit between 1 and {MAX_PAGE_CHARS}")
    info = None if is_session_state(normal) else ctx.backend.workspace.stat(ctx.scope, normal)
    if info is None:  # the sessions' state is platform-owned: answered as a missing file is
        raise ToolError(f"path {normal!r}: no such document in this scope")
    if info.size_bytes > MAX_DOCUMENT_BYTES:
        raise ToolError(
            f"path {normal!r}: {info.size_bytes} bytes is over the {MAX_DOCUMENT_BYTES // 2**20} MiB"
            " read_document limit; read it with code in run_in_env"
        )
    suffix = PurePosixPath(normal).suffix.lower()
    try:
        if suffix in DECODED_IN_CHILD:
            # A pdf's streams are deflated: a few KB can inflate to gigabytes (see decoding.py).
            with ctx.backend.workspace.open_file(ctx.scope, normal) as reader:
                page = decode_in_child(
                    "document_page", reader, {"suffix": suffix, "offset": offset, "limit": limit}
                )
            metadata = {**page["metadata"], "size_bytes": info.size_bytes}
            return DocumentPage(
                path=normal,
                offset=offset,
                text=page["text"],
                total_chars=page["total_chars"],
                metadata=metadata,
            )
        data = ctx.backend.workspace.read_bytes(ctx.scope, normal)
    except FileNotFoundError:
        raise ToolError(f"path {normal!r}: no such document in this scope") from None
    except DecodeRefusedError as exc:
        raise ToolError(f"path {normal!r}: {exc}; read it with code in run_in_env") from None
    text, metadata = document_text(data, suffix)
    metadata["size_bytes"] = len(data)
    return DocumentPage(
        path=normal,
        offset=offset,
        text=text[offset : offset + limit],
        total_chars=len(text),
        metadata=metadata,
    )


# ----------------------------------------------------------------------------- connector_fetch


class FetchedCopy(BaseModel):
    """A point-in-time copy in ``docs/``: path, size in bytes, media type, when it was fetched."""

    path: str
    bytes: int
    type: str
    fetched_at: str
    source: str


def save_fetched(ctx: TurnContext, path: str, data: bytes, source: str) -> FetchedCopy:
    """Write a fetched copy into the scope's ``docs/``."""
    _scope_path(ctx, path)
    ctx.backend.workspace.write_bytes(ctx.scope, path, data)
    ctx.fetched.append(path)
    ctx.fetched_sources.add(source)
    media = mimetypes.guess_type(path)[0] or "application/octet-stream"
    return FetchedCopy(path=path, bytes=len(data), type=media, fetched_at=utcnow().isoformat(), source=source)


def connector_fetch(ctx: TurnContext, connector: str, request: dict[str, Any]) -> FetchedCopy:
    """Fetch through a configured connector into ``docs/`` (a point-in-time copy).

    The request is the connector's ``Request`` model (``alphaagent.connectors``); every fetch is
    capped in size (``ConnectorSettings.max_bytes``).
    """
    path, data, source = fetch(ctx.backend.connectors, connector, request)
    return save_fetched(ctx, path, data, source)


# ----------------------------------------------------------------------------- register_artifact


def register_artifact(
    ctx: TurnContext, kind: ArtifactKind, path: str, name: str | None = None, description: str | None = None
) -> ArtifactRef:
    """Register a file of the scope as the next version of an artifact; ``ArtifactRegistered`` is
    published. Raises ``ArtifactError`` naming the path when it breaks a rule."""
    ctx.check_lease()
    if len(ctx.artifacts) >= MAX_REGISTRATIONS_PER_TURN:
        raise ToolError(f"a turn registers at most {MAX_REGISTRATIONS_PER_TURN} artifact versions")
    version = register_artifact_version(
        ctx.backend.store,
        ctx.backend.workspace,
        scope=ctx.scope,
        user_id=ctx.user_id,
        turn_id=ctx.turn_id,
        kind=kind,
        path=path,
        name=name,
        description=description,
    )
    ctx.artifacts.append(version)
    ctx.publish(
        ArtifactRegistered(
            turn_id=ctx.turn_id,
            scope=ctx.scope,
            user_id=ctx.user_id,
            artifact=version.ref(),
            description=description,
        )
    )
    return version.ref()


# ----------------------------------------------------------------------------- emit_citation


def emit_citation(
    ctx: TurnContext,
    source: str,
    locator: str | None = None,
    quote: str | None = None,
    claim: str | None = None,
) -> CitationRef:
    """Cite a source: a file of this scope (``docs/x.pdf``) or a URL fetched by a connector."""
    if len(ctx.citations) >= MAX_CITATIONS_PER_TURN:
        raise ToolError(f"a turn emits at most {MAX_CITATIONS_PER_TURN} citations")
    if not source or len(source) > 2048:
        raise ToolError("source: give a file of this scope or a URL (1-2048 characters)")
    if "://" in source and source not in ctx.fetched_sources:
        raise ToolError(
            "source: a URL must be one a connector fetched in this turn (cite its docs/ copy otherwise)"
        )
    if "://" not in source:
        normal = _scope_path(ctx, source)
        if is_session_state(normal) or ctx.backend.workspace.stat(ctx.scope, normal) is None:
            raise ToolError(f"source: {normal!r} is not a file of this scope")
        source = normal
    for value, label in ((locator, "locator"), (quote, "quote"), (claim, "claim")):
        if value is not None and len(value) > MAX_CITATION_FIELD_CHARS:
            raise ToolError(f"{label}: at most {MAX_CITATION_FIELD_CHARS} characters")
    citation = CitationRef(citation_id=new_ulid(), source=source, locator=locator, quote=quote, claim=claim)
    ctx.citations.append(citation)
    ctx.publish(CitationEmitted(turn_id=ctx.turn_id, scope=ctx.scope, user_id=ctx.user_id, citation=citation))
    return citation


def _scope_path(ctx: TurnContext, path: str) -> str:
    try:
        return check_workspace_path(path, prefix=ctx.scope.key + "/")
    except PathRuleError as exc:
        raise ToolError(f"path {path!r}: {exc}") from None


def tool_error_text(exc: AlphaAgentError) -> str:
    """The readable text of a failed tool call, as the model sees it."""
    return f"{type(exc).__name__}: {exc}"


def as_json(model: BaseModel) -> str:
    """A tool result as compact JSON text."""
    return json.dumps(model.model_dump(mode="json"), ensure_ascii=False)


def __getattr__(name: str) -> Any:
    # ``CONNECTORS`` follows the registry (a connector registered later is listed too).
    if name == "CONNECTORS":
        return names()
    raise AttributeError(name)
