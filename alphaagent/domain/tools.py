"""The five coder tools of DESIGN §4.6, written once and model-free.

The steps driver calls them directly; the coder (issue 5) wraps each in an MCP tool that turns an
``AlphaAgentError`` into an ``is_error`` result. Every call is scoped to one turn's
``TurnContext``: its user, scope and session, so a tool can never reach another scope.
"""

from __future__ import annotations

import json
import mimetypes
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel

from alphaagent.domain.artifacts import register_artifact as register_artifact_version
from alphaagent.domain.backend import Backend, ConnectorSettings
from alphaagent.domain.recorder import history_view
from alphaagent.errors import (
    AlphaAgentError,
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

MAX_STORED_CODE_CHARS = 64 * 1024
TEXT_SUFFIXES = (
    ".txt",
    ".md",
    ".csv",
    ".json",
    ".html",
    ".htm",
    ".tsv",
    ".py",
    ".log",
    ".xml",
    ".yaml",
    ".yml",
)
DEFAULT_PAGE_CHARS = 20_000
MAX_PAGE_CHARS = 200_000
MAX_DOCUMENT_BYTES = 25 * 2**20
"""read_document reads documents up to the connector cap (25 MiB): larger files are for code."""
MAX_PDF_PAGES = 500
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


class DocumentPage(BaseModel):
    """A page of a document's text: ``text`` starts at character ``offset``; ``total_chars`` is the
    document's full length, so the caller can page on with ``offset + len(text)``."""

    path: str
    offset: int
    text: str
    total_chars: int
    metadata: dict[str, Any]


def _document_text(data: bytes, suffix: str) -> tuple[str, dict[str, Any]]:
    if suffix == ".pdf":
        try:
            from pypdf import PdfReader  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            raise ToolError("PDF documents need the coder's dependencies (pypdf) installed") from None
        reader = PdfReader(__import__("io").BytesIO(data))
        total = len(reader.pages)
        pages = [page.extract_text() or "" for page in reader.pages[:MAX_PDF_PAGES]]
        return "\n\f".join(pages), {"type": "pdf", "pages": total, "pages_read": len(pages)}
    if suffix in (".html", ".htm"):
        from html.parser import HTMLParser

        parts: list[str] = []

        class _Text(HTMLParser):
            def handle_data(self, chunk: str) -> None:
                parts.append(chunk)

        _Text().feed(data.decode("utf-8", "replace"))
        return "".join(parts), {"type": "html"}
    if suffix in TEXT_SUFFIXES or not suffix:
        return data.decode("utf-8", "replace"), {"type": suffix.lstrip(".") or "text"}
    raise ToolError(f"cannot read {suffix} documents as text; read txt, md, csv, json, html or pdf")


def read_document(
    ctx: TurnContext, path: str, offset: int = 0, limit: int = DEFAULT_PAGE_CHARS
) -> DocumentPage:
    """A page of a document in the scope, by character ``offset`` and ``limit`` (max 200,000)."""
    normal = _scope_path(ctx, path)
    if offset < 0 or not 0 < limit <= MAX_PAGE_CHARS:
        raise ToolError(f"offset must be >= 0 and limit between 1 and {MAX_PAGE_CHARS}")
    info = ctx.backend.workspace.stat(ctx.scope, normal)
    if info is None:
        raise ToolError(f"path {normal!r}: no such document in this scope")
    if info.size_bytes > MAX_DOCUMENT_BYTES:
        raise ToolError(
            f"path {normal!r}: {info.size_bytes} bytes is over the {MAX_DOCUMENT_BYTES // 2**20} MiB"
            " read_document limit; read it with code in run_in_env"
        )
    try:
        data = ctx.backend.workspace.read_bytes(ctx.scope, normal)
    except FileNotFoundError:
        raise ToolError(f"path {normal!r}: no such document in this scope") from None
    text, metadata = _document_text(data, PurePosixPath(normal).suffix.lower())
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


def _safe_name(name: str) -> str:
    cleaned = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in name).strip("._") or "document"
    return cleaned[:120]


def _fetch_file(settings: ConnectorSettings, request: dict[str, Any]) -> tuple[bytes, str, str]:
    raw = request.get("path")
    if not isinstance(raw, str) or not raw:
        raise ToolError("request.path: the file connector needs an absolute 'path'")
    if "\x00" in raw:
        raise ToolError("request.path: must not contain NUL")
    requested = Path(raw)
    real = requested.resolve()
    if any(
        real == hidden.resolve() or hidden.resolve() in real.parents for hidden in settings.forbidden_roots
    ):
        raise ToolError(f"request.path: {raw} is inside the platform's data directory")
    roots = [root.resolve() for root in settings.file_roots]
    if not any(real == root or root in real.parents for root in roots):
        allowed = ", ".join(str(r) for r in roots) or "none configured"
        raise ToolError(
            f"request.path: {raw} resolves to {real}, outside the file connector's allowed"
            f" directories ({allowed}; set ALPHAAGENT_FILE_ROOTS)"
        )
    if not real.is_file():
        raise ToolError(f"request.path: {raw} is not a file")
    size = real.stat().st_size
    if size > settings.max_bytes:
        raise ToolError(
            f"request.path: {raw} is {size} bytes, over the connector cap of {settings.max_bytes}"
        )
    fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(settings.max_bytes + 1)
    return data, request.get("name") or real.name, f"file://{real}"


def _allowed_url(settings: ConnectorSettings, url: str, field: str) -> urllib.parse.SplitResult:
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ToolError(f"{field}: must be an http or https URL")
    if parsed.hostname not in settings.http_hosts:
        raise ToolError(f"{field}: host {parsed.hostname} is not in the http connector's allowlist")
    return parsed


def _fetch_http(settings: ConnectorSettings, request: dict[str, Any]) -> tuple[bytes, str, str]:
    url = request.get("url")
    if not isinstance(url, str):
        raise ToolError("request.url: the http connector needs a 'url'")
    try:
        parsed = _allowed_url(settings, url, "request.url")
    except ValueError:
        raise ToolError("request.url: not a valid URL") from None

    class _CheckedRedirects(urllib.request.HTTPRedirectHandler):
        # A redirect is a new request: it must pass the allowlist too (no SSRF by 302).
        def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
            _allowed_url(settings, newurl, "request.url (redirect)")
            return super().redirect_request(req, fp, code, msg, headers, newurl)

    opener = urllib.request.build_opener(_CheckedRedirects)
    deadline = time.monotonic() + settings.timeout_s
    chunks, size = [], 0
    try:
        with opener.open(url, timeout=settings.timeout_s) as response:
            while chunk := response.read(1 << 16):
                chunks.append(chunk)
                size += len(chunk)
                if size > settings.max_bytes:
                    raise ToolError(
                        f"request.url: the response is over the connector cap of {settings.max_bytes} bytes"
                    )
                if time.monotonic() > deadline:
                    raise ToolError(f"request.url: the fetch took longer than {settings.timeout_s:g} s")
    except (urllib.error.URLError, TimeoutError, OSError, ValueError) as exc:
        raise ToolError(f"request.url: fetching {url} failed: {exc}") from None
    name = request.get("name") or PurePosixPath(parsed.path).name or parsed.hostname or "document"
    return b"".join(chunks), name, url


def s3_allowed(settings: ConnectorSettings, bucket: str, key: str) -> bool:
    """Whether ``ConnectorSettings.s3_prefixes`` lets the ``s3`` connector read ``bucket``/``key``
    (the bucket matches exactly and the key starts with the entry's prefix)."""
    for entry in settings.s3_prefixes:
        allowed_bucket, _, prefix = entry.partition("/")
        if allowed_bucket == bucket and key.startswith(prefix):
            return True
    return False


def _fetch_s3(settings: ConnectorSettings, request: dict[str, Any]) -> tuple[bytes, str, str]:
    bucket, key = request.get("bucket"), request.get("key")
    if not isinstance(bucket, str) or not bucket:
        raise ToolError("request.bucket: the s3 connector needs a 'bucket'")
    if not isinstance(key, str) or not key or key.endswith("/") or len(key.encode()) > 1024:
        raise ToolError("request.key: the s3 connector needs the 'key' of one object (at most 1,024 bytes)")
    if not s3_allowed(settings, bucket, key):
        allowed = ", ".join(settings.s3_prefixes) or "none configured"
        raise ToolError(
            f"request.key: s3://{bucket}/{key} is outside the s3 connector's allowed prefixes ({allowed})"
        )
    try:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        raise ToolError("the s3 connector needs boto3 installed (the coder's dependencies)") from None
    # Created per fetch, never at import: the region and credentials are those of the moment.
    timeout = Config(connect_timeout=settings.timeout_s, read_timeout=settings.timeout_s)
    client = boto3.client("s3", config=timeout)
    source = f"s3://{bucket}/{key}"
    try:
        # The size cap is checked before any byte is downloaded; the read is capped again in case
        # the object was replaced between the two calls.
        size = int(client.head_object(Bucket=bucket, Key=key)["ContentLength"])
        if size > settings.max_bytes:
            raise ToolError(
                f"request.key: {source} is {size} bytes, over the connector cap of {settings.max_bytes}"
            )
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        data = body.read(settings.max_bytes + 1)
        body.close()
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in ("404", "NoSuchKey", "NoSuchBucket"):
            raise ToolError(f"request.key: {source} does not exist") from None
        raise ToolError(f"request.key: fetching {source} failed ({code or 'error'})") from None
    except BotoCoreError as exc:
        raise ToolError(f"request.key: fetching {source} failed: {exc}") from None
    if len(data) > settings.max_bytes:
        raise ToolError(f"request.key: {source} is over the connector cap of {settings.max_bytes} bytes")
    return data, request.get("name") or PurePosixPath(key).name, source


_FETCHERS: dict[str, Callable[[ConnectorSettings, dict[str, Any]], tuple[bytes, str, str]]] = {
    "file": _fetch_file,
    "http": _fetch_http,
    "s3": _fetch_s3,
}
CONNECTORS = tuple(_FETCHERS)
"""The connectors a spec input or ``connector_fetch`` may name."""


def fetch(settings: ConnectorSettings, connector: str, request: dict[str, Any]) -> tuple[str, bytes, str]:
    """Fetch through a connector into memory: ``(docs/ path it will get, bytes, source)``; nothing
    is written. Raises ``ToolError`` naming the request field for anything not allowed."""
    if connector not in _FETCHERS:
        raise ToolError(f"connector: unknown connector {connector!r} (available: {', '.join(CONNECTORS)})")
    data, name, source = _FETCHERS[connector](settings, request)
    return f"docs/{_safe_name(str(name))}", data, source


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

    ``file``: ``{"path": absolute path, "name"?}`` inside an allowed directory. ``http``: ``{"url",
    "name"?}`` on an allowed host. ``s3``: ``{"bucket", "key", "name"?}`` under an allowed
    ``"bucket/prefix"``. All are capped in size (``ConnectorSettings.max_bytes``).
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
        if ctx.backend.workspace.stat(ctx.scope, normal) is None:
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
