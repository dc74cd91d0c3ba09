"""The workspace viewer's web application (Starlette + Jinja2): read-only pages of one user's work.

Pages (``{scope}`` is ``/c/{conversation_id}`` or ``/w/{workflow_execution_id}/{node_id}``)::

    /                                 the user's conversations and workflow nodes, newest first
    {scope}/                          turns, artifacts (latest previews, every version), file tree
    {scope}/turns/{turn_id}           one turn and its runs; live while it runs
    {scope}/turns/{turn_id}/events    server-sent events: each run as it is recorded, then the end
    {scope}/runs                      the run history with stored (truncated) outputs
    {scope}/artifacts/{name}/{v}      one version: dataset pages, the chart, the rendered report
    {scope}/blob/{name}/{v}           that version's bytes
    {scope}/file/{path}               a file's bytes (a download)

Security (every name and byte of user content is untrusted):

- every request needs the start's token: ``?token=`` once (answered with a cookie and a redirect to
  the same URL without it), then the cookie; anything else is 401;
- Jinja2 autoescapes everything, names go through ``printable_path`` too (no control or bidi
  characters), Markdown is rendered by markdown-it-py and sanitised by nh3;
- every page has a strict CSP (scripts, styles and images from the app only; no inline script or
  style, no frames, no forms posting elsewhere); user bytes are served with ``Content-Security-Policy:
  sandbox`` and ``nosniff``, as a download unless they are a PNG/JPEG/GIF by their magic bytes, and
  SVG or HTML only as a download or (``?view=1``) sandboxed: never script in the app's origin;
- another user's scope, turn, run, artifact or file gets exactly the 404 a missing one gets (one
  fixed body), decided before anything of it is read;
- the Host header must name the loopback address when bound to it (no DNS rebinding).
"""

from __future__ import annotations

import hmac
import json
import posixpath
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote, urlencode

from pydantic import ValidationError

from alphaagent.domain.turns import scope_label
from alphaagent.errors import NotFoundError
from alphaagent.models.common import ConversationScope, NodeScope, Scope, printable_path, utcnow
from alphaagent.models.records import ArtifactVersion, RunRecord, Turn
from alphaagent.models.run import StateReport
from alphaagent.ports import FileInfo, iter_chunks
from alphaagent.viewer.preview import (
    MAX_REPORT_BYTES,
    TablePage,
    dataset_page,
    raster_type,
    render_markdown,
    report_image_resolver,
    url_path,
)
from alphaagent.viewer.reader import WorkspaceReader

if TYPE_CHECKING:  # Starlette is imported when an app is made, not when the CLI loads this module
    from starlette.applications import Starlette

HERE: Final = Path(__file__).resolve().parent

PAGE_CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
"""The CSP of every page of the app: nothing inline, nothing from elsewhere, never framed."""

CONTENT_CSP: Final = "sandbox; default-src 'none'; img-src 'self'; style-src 'unsafe-inline'"
"""The CSP of user bytes: a sandbox (an opaque origin, no script, no forms, no top navigation), so
an SVG or HTML file opened directly can do nothing in the app's origin."""

VIEWABLE_TYPES: Final = {
    ".html": "text/html; charset=utf-8",
    ".htm": "text/html; charset=utf-8",
    ".svg": "image/svg+xml",
    ".txt": "text/plain; charset=utf-8",
    ".md": "text/plain; charset=utf-8",
    ".csv": "text/plain; charset=utf-8",
    ".json": "text/plain; charset=utf-8",
    ".log": "text/plain; charset=utf-8",
}
"""What ``?view=1`` shows in the browser (sandboxed) instead of downloading."""

SCOPE_PREVIEW_ROWS: Final = 10
"""Rows of a dataset shown on the scope page (the artifact page pages through all)."""

LIVE_POLL_S: Final = 1.0
"""How often a live turn's event stream reads the store for new runs (seconds)."""

LIVE_MAX_S: Final = 12 * 3600.0
"""The longest one event stream stays open (seconds): the AWS turn's 12 h ceiling; the page's
EventSource reconnects after it."""

_NOT_FOUND = "not found"


@dataclass(frozen=True)
class TreeRow:
    """A row of the file tree: a folder (``path`` None) or a file, at ``depth``."""

    depth: int
    name: str
    path: str | None = None
    size_bytes: int | None = None
    modified_at: datetime | None = None


def tree_rows(files: Sequence[FileInfo]) -> list[TreeRow]:
    """Files sorted by path as an indented tree, each folder once before its contents."""
    rows: list[TreeRow] = []
    opened: list[str] = []
    for info in files:
        parts = info.path.split("/")
        folders = parts[:-1]
        common = 0
        while common < min(len(opened), len(folders)) and opened[common] == folders[common]:
            common += 1
        rows.extend(TreeRow(depth, folders[depth] + "/") for depth in range(common, len(folders)))
        opened = folders
        rows.append(TreeRow(len(folders), parts[-1], info.path, info.size_bytes, info.modified_at))
    return rows


def scope_url(scope: Scope) -> str:
    """The scope's page, ending in '/'."""
    if isinstance(scope, ConversationScope):
        return f"/c/{quote(scope.conversation_id)}/"
    return f"/w/{quote(scope.workflow_execution_id)}/{quote(scope.node_id)}/"


def file_url(scope: Scope, path: str, *, view: bool = False) -> str:
    """A file's bytes (``view``: shown sandboxed in the browser where it can be)."""
    return scope_url(scope) + "file/" + url_path(path) + ("?view=1" if view else "")


def artifact_url(version: ArtifactVersion, scope: Scope) -> str:
    return f"{scope_url(scope)}artifacts/{quote(version.name)}/{version.version}"


def blob_url(version: ArtifactVersion, scope: Scope, *, view: bool = False) -> str:
    return f"{scope_url(scope)}blob/{quote(version.name)}/{version.version}" + ("?view=1" if view else "")


def human_bytes(size: int | None) -> str:
    """``1536`` -> ``1.5 KiB``."""
    if size is None:
        return ""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"  # pragma: no cover - the loop always returns


def turn_duration(turn: Turn, now: datetime | None = None) -> str:
    """How long the turn took (or has run so far), as ``12.3 s`` or ``4 min 5 s``."""
    end = turn.finished_at or now or utcnow()
    seconds = max(0.0, (end - turn.started_at).total_seconds())
    text = f"{seconds:.1f} s" if seconds < 60 else f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return text if turn.finished_at else f"{text} so far"


def _when(moment: datetime | None) -> str:
    return "" if moment is None else f"{moment:%Y-%m-%d %H:%M:%S} UTC"


def _disposition(kind: str, path: str) -> str:
    """``Content-Disposition`` naming the file: an ASCII fallback and the exact UTF-8 name (RFC 6266)."""
    name = posixpath.basename(path) or "download"
    fallback = "".join(ch if ch.isascii() and (ch.isalnum() or ch in "._-") else "_" for ch in name)
    return f"{kind}; filename=\"{fallback}\"; filename*=UTF-8''{quote(name, safe='')}"


def _scope_of(params: dict[str, Any]) -> Scope:
    try:
        if "conversation_id" in params:
            return ConversationScope(conversation_id=params["conversation_id"])
        return NodeScope(workflow_execution_id=params["workflow_execution_id"], node_id=params["node_id"])
    except ValidationError:
        raise NotFoundError(_NOT_FOUND) from None


def _state_line(state: StateReport | None) -> str:
    """The run's live-state line (what was restored, each name not kept and why), as ``exec`` and
    ``history`` say it; "" for a run outside a session."""
    from alphaagent.sandbox.render import state_line

    return "" if state is None else state_line(state)


def _run_event(run: RunRecord, scope: Scope) -> dict[str, Any]:
    """A run as the live page adds it (the page builds its DOM with textContent only)."""
    return {
        "run_id": run.run_id,
        "status": run.status,
        "exit_code": run.exit_code,
        "duration_ms": run.duration_ms,
        "code": run.code,
        "stdout": run.stdout,
        "stderr": run.stderr,
        "stdout_bytes": run.stdout_bytes,
        "stderr_bytes": run.stderr_bytes,
        "stdout_truncated": run.stdout_truncated,
        "stderr_truncated": run.stderr_truncated,
        "stdout_url": file_url(scope, run.stdout_path, view=True) if run.stdout_path else None,
        "stderr_url": file_url(scope, run.stderr_path, view=True) if run.stderr_path else None,
        "error": None if run.error is None else f"{run.error.name}: {run.error.value}",
        "state": _state_line(run.state),
    }


def create_app(
    reader: WorkspaceReader,
    *,
    token: str,
    cookie_name: str = "alphaagent_viewer",
    allowed_hosts: Sequence[str] = ("127.0.0.1", "localhost", "[::1]"),
    live_poll_s: float = LIVE_POLL_S,
) -> Starlette:
    """The viewer over ``reader`` (one user's work), guarded by ``token``.

    ``cookie_name`` is the cookie that carries the token after the first request (cookies are not
    per port, so the CLI names it after the port); ``allowed_hosts`` the Host headers accepted
    (``("*",)`` when bound to another interface); ``live_poll_s`` how often a live page's stream
    reads the store (seconds).
    """
    import anyio
    from jinja2 import Environment, FileSystemLoader, select_autoescape
    from sse_starlette.sse import EventSourceResponse
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.middleware import Middleware
    from starlette.middleware.trustedhost import TrustedHostMiddleware
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, Response, StreamingResponse
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    templates = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    templates.filters.update(
        shown=printable_path, bytes=human_bytes, when=_when, duration=turn_duration, state=_state_line
    )
    templates.globals.update(
        scope_url=scope_url,
        file_url=file_url,
        artifact_url=artifact_url,
        blob_url=blob_url,
        scope_label=scope_label,
    )
    not_found_body = templates.get_template("not_found.html").render()

    def page(name: str, **context: Any) -> HTMLResponse:
        return HTMLResponse(templates.get_template(name).render(**context))

    async def not_found(_request: Request, _exc: Exception) -> Response:
        return HTMLResponse(not_found_body, status_code=404)

    def index(request: Request) -> Response:
        scopes = reader.scopes()
        return page(
            "index.html",
            user=reader.user_id,
            conversations=[s for s in scopes if isinstance(s[0], ConversationScope)],
            nodes=[s for s in scopes if isinstance(s[0], NodeScope)],
        )

    def scope_page(request: Request) -> Response:
        scope = _scope_of(request.path_params)
        turns = reader.turns(scope)
        versions = reader.artifacts(scope)
        by_name: dict[str, list[ArtifactVersion]] = defaultdict(list)
        for version in versions:
            by_name[version.name].append(version)
        artifacts = []
        for name in sorted(by_name):
            history = sorted(by_name[name], key=lambda v: v.version, reverse=True)
            artifacts.append((history[0], history, _preview(scope, history[0], SCOPE_PREVIEW_ROWS)))
        files, skipped = reader.files(scope)
        return page(
            "scope.html",
            scope=scope,
            turns=turns,
            artifacts=artifacts,
            failed_turns={t.turn_id for t in turns if t.status == "failed"},
            tree=tree_rows(files),
            skipped=skipped,
            run_count=len(reader.runs(scope)),
        )

    def _preview(scope: Scope, version: ArtifactVersion, rows: int, page_number: int = 1) -> dict[str, Any]:
        """What a version shows: an inline image, a table page, a rendered report, or links only."""
        suffix = PurePosixPath(version.path).suffix.lower()
        if version.kind == "chart" and suffix in (".png", ".jpg", ".jpeg"):
            return {"image": blob_url(version, scope)}
        if version.kind == "dataset":
            _, data = reader.artifact(scope, version.name, version.version)
            return {"table": dataset_page(data, suffix, page_number, rows)}
        if version.kind == "report" and suffix in (".md", ".txt"):
            if version.size_bytes > MAX_REPORT_BYTES:
                return {"note": f"not rendered: larger than {MAX_REPORT_BYTES // 2**20} MiB (download it)"}
            _, data = reader.artifact(scope, version.name, version.version)
            text = data.decode("utf-8", "replace")
            if suffix == ".txt":
                return {"text": text}
            resolve = report_image_resolver(version.path, lambda path: file_url(scope, path))
            return {"html": render_markdown(text, resolve)}
        if suffix in (".svg", ".html", ".htm"):
            return {"sandboxed": blob_url(version, scope, view=True)}
        return {}

    def turn_page(request: Request) -> Response:
        scope = _scope_of(request.path_params)
        turn = reader.turn(scope, request.path_params["turn_id"])
        runs = reader.runs(scope, turn.turn_id)
        registered = [v for v in reader.artifacts(scope) if v.turn_id == turn.turn_id]
        events = f"{scope_url(scope)}turns/{quote(turn.turn_id)}/events"
        return page("turn.html", scope=scope, turn=turn, runs=runs, registered=registered, events=events)

    async def turn_events(request: Request) -> Response:
        scope = _scope_of(request.path_params)
        turn_id = request.path_params["turn_id"]
        await run_in_threadpool(reader.turn, scope, turn_id)  # a 404 before the stream starts

        async def stream() -> AsyncIterator[dict[str, str]]:
            sent: set[str] = set()
            deadline = time.monotonic() + LIVE_MAX_S
            while True:
                try:
                    turn = await run_in_threadpool(reader.turn, scope, turn_id)
                    runs = await run_in_threadpool(reader.runs, scope, turn_id)
                except NotFoundError:
                    return
                for run in runs:
                    if run.run_id not in sent:
                        sent.add(run.run_id)
                        yield {"event": "run", "data": json.dumps(_run_event(run, scope))}
                if turn.status != "running" or time.monotonic() > deadline:
                    yield {"event": "turn", "data": json.dumps({"status": turn.status})}
                    return
                await anyio.sleep(live_poll_s)

        return EventSourceResponse(stream(), ping=15)

    def runs_page(request: Request) -> Response:
        scope = _scope_of(request.path_params)
        runs = list(reversed(reader.runs(scope)))
        return page("runs.html", scope=scope, runs=runs)

    def artifact_page(request: Request) -> Response:
        scope = _scope_of(request.path_params)
        name, number = request.path_params["name"], request.path_params["version"]
        version, _ = reader.artifact(scope, name, number)
        history = sorted(
            (v for v in reader.artifacts(scope) if v.name == name), key=lambda v: v.version, reverse=True
        )
        try:
            page_number = max(1, int(request.query_params.get("page", "1")))
        except ValueError:
            page_number = 1
        preview = _preview(scope, version, 50, page_number)
        table: TablePage | None = preview.get("table")
        base = artifact_url(version, scope)
        pages = {
            "previous": f"{base}?{urlencode({'page': page_number - 1})}" if page_number > 1 else None,
            "next": f"{base}?{urlencode({'page': page_number + 1})}" if table and table.has_next else None,
        }
        return page(
            "artifact.html", scope=scope, version=version, history=history, content=preview, pages=pages
        )

    def artifact_blob(request: Request) -> Response:
        scope = _scope_of(request.path_params)
        version, data = reader.artifact(scope, request.path_params["name"], request.path_params["version"])
        return _content(data, version.path, request.query_params.get("view") == "1")

    def file_download(request: Request) -> Response:
        scope = _scope_of(request.path_params)
        path = request.path_params["path"]
        info, stream = reader.file(scope, path)
        head = stream.read(16)
        viewable = request.query_params.get("view") == "1"
        headers, media_type = _content_headers(head, info.path, viewable)

        def chunks() -> Iterator[bytes]:
            with stream:
                yield head
                yield from iter_chunks(stream)

        headers["Content-Length"] = str(info.size_bytes)
        return StreamingResponse(chunks(), media_type=media_type, headers=headers)

    def _content_headers(head: bytes, path: str, view: bool) -> tuple[dict[str, str], str]:
        headers = {"Content-Security-Policy": CONTENT_CSP, "Cross-Origin-Resource-Policy": "same-origin"}
        raster = raster_type(head)
        suffix = PurePosixPath(path).suffix.lower()
        if raster is not None:
            headers["Content-Disposition"] = _disposition("inline", path)
            return headers, raster
        if view and suffix in VIEWABLE_TYPES:
            headers["Content-Disposition"] = _disposition("inline", path)
            return headers, VIEWABLE_TYPES[suffix]
        headers["Content-Disposition"] = _disposition("attachment", path)
        return headers, "application/octet-stream"

    def _content(data: bytes, path: str, view: bool) -> Response:
        headers, media_type = _content_headers(data[:16], path, view)
        return Response(data, media_type=media_type, headers=headers)

    scope_routes = [
        Route("/", scope_page),
        Route("/turns/{turn_id}", turn_page),
        Route("/turns/{turn_id}/events", turn_events),
        Route("/runs", runs_page),
        Route("/artifacts/{name}/{version:int}", artifact_page),
        Route("/blob/{name}/{version:int}", artifact_blob),
        Route("/file/{path:path}", file_download),
    ]
    middleware = [
        # The first is the outermost: a foreign Host header is refused before any token is looked at.
        Middleware(SecurityHeaders),
        Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts)),
        Middleware(TokenGate, token=token, cookie_name=cookie_name),
    ]
    return Starlette(
        routes=[
            Route("/", index),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
            Mount("/c/{conversation_id}", routes=scope_routes),
            Mount("/w/{workflow_execution_id}/{node_id}", routes=scope_routes),
        ],
        middleware=middleware,
        exception_handlers={404: not_found, NotFoundError: not_found},
    )


ASGIApp = Callable[..., Any]


class TokenGate:
    """Pure ASGI middleware: a request passes with the token in its cookie; with ``?token=`` it is
    answered with the cookie (HttpOnly, SameSite=Strict) and a redirect to the same URL without the
    token (kept out of history and logs); anything else is 401 (compared in constant time)."""

    def __init__(self, app: ASGIApp, *, token: str, cookie_name: str) -> None:
        self.app = app
        self.token = token.encode()
        self.cookie_name = cookie_name

    def _valid(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode("utf-8", "replace"), self.token)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from starlette.requests import HTTPConnection
        from starlette.responses import PlainTextResponse, RedirectResponse

        connection = HTTPConnection(scope)
        given = connection.query_params.get("token")
        if self._valid(given):
            rest = [(k, v) for k, v in connection.query_params.multi_items() if k != "token"]
            # One leading '/': '//host/...' would be a redirect to another site.
            target = "/" + quote(connection.url.path.lstrip("/")) + (f"?{urlencode(rest)}" if rest else "")
            response: Any = RedirectResponse(target, status_code=303)
            response.set_cookie(
                self.cookie_name, self.token.decode(), httponly=True, samesite="strict", path="/"
            )
            await response(scope, receive, send)
            return
        if not self._valid(connection.cookies.get(self.cookie_name)):
            response = PlainTextResponse(
                "401: this viewer needs its token: open the URL `alphaagent serve` printed\n", status_code=401
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


class SecurityHeaders:
    """Pure ASGI middleware: every response gets the page CSP (unless it set its own, as user
    bytes do), ``nosniff``, no referrer, no framing and no caching."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                for name, value in (
                    (b"content-security-policy", PAGE_CSP.encode()),
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"no-referrer"),
                    (b"x-frame-options", b"DENY"),
                    (b"cache-control", b"no-store"),
                ):
                    if name not in present:
                        headers.append((name, value))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)
