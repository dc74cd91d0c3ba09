"""``alphaagent mcp``: the orchestrator's tools over the Model Context Protocol (DESIGN §4.10).

An orchestrating agent does not write code: it hands a compact analysis spec to ``run_analysis``
and reads what came back with ``list_artifacts``, ``read_artifact`` and ``list_turns``. The server
is built on the official ``mcp`` SDK (``MCPServer``), runs over stdio (what Claude Desktop, Claude
Code and the Agent SDK start) or streamable HTTP on 127.0.0.1 behind a bearer token, and calls one
``alphaagent.client.Client`` — so the local and AWS backends differ only in how that client is made.

The server is bound to the client's user: a spec may leave ``user_id`` out; a spec or scope of
another user gets exactly the answer a scope that does not exist gets (``Client.bind``).

Every failure a caller can cause (a bad spec, a missing artifact, another user's scope) is an
``isError`` result with one line naming the field or the thing; nothing is raised into the SDK.

Example::

    from alphaagent.client import connect
    from alphaagent.mcp_server import build_server

    build_server(connect(backend="local", user="me")).run("stdio")
"""

from __future__ import annotations

import base64
import hmac
import json
import secrets
import sys
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Annotated, Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.types import CallToolResult, ImageContent, TextContent, ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema

from alphaagent import connectors
from alphaagent.client import Client, parse_scope
from alphaagent.errors import AlphaAgentError, InvalidRequestError, PathRuleError
from alphaagent.models.common import ConversationScope, NodeScope
from alphaagent.models.records import ArtifactRef, TurnResult
from alphaagent.models.rules import arguments_refusal
from alphaagent.wording import count, shown_json

SERVER_NAME = "alphaagent"

TEXT_PAGE_CHARS = 20_000
"""Characters ``read_artifact`` returns by default: a page a model reads whole (~5k tokens)."""

MAX_TEXT_PAGE_CHARS = 100_000
"""The most characters one ``read_artifact`` call returns (~25k tokens: a tool result that still
leaves room in a 200k-token context)."""

MAX_IMAGE_BYTES = 3_750_000
"""The largest image ``read_artifact`` returns as image content, in bytes: base64 makes it at most
5 MB, the Anthropic API's limit for one image. A larger chart is described, not sent."""

_IMAGE_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)

SCOPE_SCHEMA: dict[str, Any] = {
    "description": "A conversation, or one node of a workflow run.",
    "oneOf": [
        {
            "type": "object",
            "properties": {"conversation_id": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,80}$"}},
            "required": ["conversation_id"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {
                "workflow_execution_id": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,80}$"},
                "node_id": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,80}$"},
            },
            "required": ["workflow_execution_id", "node_id"],
            "additionalProperties": False,
        },
    ],
}

ScopeArg = Annotated[dict[str, Any], WithJsonSchema(SCOPE_SCHEMA)]
SpecArg = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "description": "The analysis spec (see the tool description)."}),
]

VersionArg = Annotated[
    int | None, WithJsonSchema({"type": ["integer", "null"], "minimum": 1, "description": "default: latest"})
]
OffsetArg = Annotated[int, WithJsonSchema({"type": "integer", "minimum": 0, "description": "characters"})]
LimitArg = Annotated[
    int,
    WithJsonSchema(
        {"type": "integer", "minimum": 1, "maximum": MAX_TEXT_PAGE_CHARS, "description": "characters"}
    ),
]
# Any, checked in list_turns: pydantic's lax int would take "2" and true, and word a bad value in
# its own text; the limit follows the CLI's one rule for --limit (cli._Number), in its words.
TurnLimitArg = Annotated[
    Any,
    WithJsonSchema(
        {"type": ["integer", "null"], "minimum": 1, "description": "only the N newest turns (default: all)"}
    ),
]


# ----------------------------------------------------------------------------- tool arguments


class _ToolArguments(BaseModel):
    """A tool's arguments as the server checks them before the SDK calls the tool: an argument the
    tool does not have is refused (the SDK's own check drops it silently: ``list_turns(scope,
    lmit=1)`` would list every turn), a value must have its JSON type (``strict``: ``"2"`` is not a
    version, ``true`` is not an offset), and a refusal is one line naming the argument."""

    model_config = ConfigDict(extra="forbid", strict=True)


class RunAnalysisArguments(_ToolArguments):
    """``run_analysis``: the spec object (checked in full by ``parse_spec``)."""

    spec: dict[str, Any]


class ListArtifactsArguments(_ToolArguments):
    """``list_artifacts``: the scope (checked by ``parse_scope``)."""

    scope: dict[str, Any]


class ReadArtifactArguments(_ToolArguments):
    """``read_artifact``: the ranges as the tool's schema publishes them (``VersionArg``,
    ``OffsetArg``, ``LimitArg``), refused in the spec's words (``version: must be a whole number
    ≥ 1, got 0``)."""

    scope: dict[str, Any]
    name: str
    version: int | None = Field(None, ge=1)
    offset: int = Field(0, ge=0)
    limit: int = Field(TEXT_PAGE_CHARS, ge=1, le=MAX_TEXT_PAGE_CHARS)


class ListTurnsArguments(_ToolArguments):
    """``list_turns``: ``limit`` as the CLI's ``turns --limit`` (the N newest)."""

    scope: dict[str, Any]
    limit: Any = None  # checked by the tool, in the CLI's words (TurnLimitArg)


TOOL_ARGUMENTS: dict[str, type[_ToolArguments]] = {
    "run_analysis": RunAnalysisArguments,
    "list_artifacts": ListArtifactsArguments,
    "read_artifact": ReadArtifactArguments,
    "list_turns": ListTurnsArguments,
}
"""The arguments model of each tool, which ``call_tool`` checks a call's arguments against."""


def describe_arguments_error(exc: ValidationError, model: type[BaseModel]) -> str:
    """One line naming the first offending argument of the tool whose arguments ``model`` is, and
    its rule (``alphaagent.models.rules.arguments_refusal``, which the coder's tools share)."""
    return arguments_refusal(exc, model)


class _Server(MCPServer[Any]):
    """``MCPServer`` that checks a call's arguments against the tool's ``TOOL_ARGUMENTS`` model
    before the SDK does: its check keeps pydantic's multi-line text (with a documentation URL) and
    ignores unknown arguments. ``call_tool`` is the SDK's public entry of every ``tools/call``; a
    ``ToolError`` raised there is the call's ``isError`` result, its message the text."""

    def __init__(self, name: str, *, tools: list[Tool], **options: Any) -> None:
        super().__init__(name, tools=tools, **options)
        self._tools_by_name = {tool.name: tool for tool in tools}

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> Any:
        model, tool = TOOL_ARGUMENTS.get(name), self._tools_by_name.get(name)
        if model is not None and tool is not None:
            try:
                # As the SDK reads them: an object sent as a JSON string (Claude Desktop) is that object.
                model.model_validate(tool.fn_metadata.pre_parse_json(arguments))
            except ValidationError as exc:
                raise ToolError(describe_arguments_error(exc, model)) from None
        return await super().call_tool(name, arguments, context)


def _package_version() -> str:
    """The installed package's version (what ``alphaagent --version`` prints), for ``initialize``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("alphaagent")
    except PackageNotFoundError:  # run from a checkout that was never installed
        from alphaagent import __version__

        return __version__


RUN_ANALYSIS_DESCRIPTION = """\
Run an analysis: a coder writes and runs Python in an isolated environment for you, and registers \
the files it produces (datasets, charts, reports) as versioned artifacts of a scope. Call this \
instead of writing code yourself. Blocks until the turn ends (minutes), with progress notifications.

`spec` is a JSON object:
- spec_version: 1 (required)
- scope (required): {"conversation_id": "..."} or {"workflow_execution_id": "...", "node_id": "..."} \
(ids: 1-80 of A-Z a-z 0-9 _ -). Files persist per scope across turns.
- goal (required): what to find out, in plain words.
- inputs: list of {"kind": "document", "path": "docs/x.csv"} (a file already in the scope), \
{"kind": "dataset", "name": "n", "version": 1?} (a dataset registered earlier in the scope), \
{"kind": "connector", "connector": <name>, "request": {...}} (fetched into docs/; {connectors}), \
{"kind": "node_artifact", "node_id": "a", "artifact": "n"} (another node of the same workflow run).
- outputs: list of {"kind": "dataset"|"chart"|"report", "name": "n", "description": "..."}: \
what must be registered (names: 1-64 of a-z 0-9 . _ -, starting with a letter or digit).
- steps (optional): [{"title": "...", "code": "python"}] runs that code in order without a model.
- constraints (optional): {"max_runs": 20, "run_timeout_s": 60, "turn_timeout_s": 900}.
- user_id: leave it out (this server acts for one user).

Minimal example:
{"spec_version": 1, "scope": {"conversation_id": "sales-q3"}, "goal": "Which region grew fastest?", \
"inputs": [{"kind": "document", "path": "docs/sales.csv"}], \
"outputs": [{"kind": "chart", "name": "growth-by-region"}]}

Returns the turn's status ("completed" or "failed"), the coder's summary, the artifacts \
(kind, name, version, path relative to scope_root), citations, and the error when it failed. \
A bad spec comes back as an error naming the field, e.g. "goal: Field required".\
"""


def run_analysis_description() -> str:
    """``RUN_ANALYSIS_DESCRIPTION`` with the registered connectors and their request fields."""
    return RUN_ANALYSIS_DESCRIPTION.replace("{connectors}", connectors.request_help())


LIST_ARTIFACTS_DESCRIPTION = """\
List every version of every artifact (dataset, chart, report) registered in a scope, by name then version: \
kind, name, version, path, size, sha256, the turn that made it. Read one with read_artifact.\
"""

READ_ARTIFACT_DESCRIPTION = f"""\
Read an artifact of a scope by name (latest version unless `version` is given). Text (CSV, \
Markdown, JSON, SVG) comes back a page at a time: `offset` and `limit` count characters (default \
{TEXT_PAGE_CHARS}, at most {MAX_TEXT_PAGE_CHARS}); the first line says the total length and the \
offset to continue from. PNG, JPEG, GIF and WebP charts come back as an image (up to \
{MAX_IMAGE_BYTES} bytes). Other binary files (xlsx, parquet) are described, not returned.\
"""

LIST_TURNS_DESCRIPTION = """\
List the turns (analyses) run in a scope, newest first (the one just run is the first): \
turn_id, status, goal, start and end times, and the summary of each ended turn. `limit` keeps \
the N newest (default: all).\
"""


# ----------------------------------------------------------------------------- structured output


class AnalysisResult(TurnResult):
    """``run_analysis``'s structured result: the turn result, plus where its artifacts are."""

    scope: ConversationScope | NodeScope
    scope_root: str = Field(description="Where the scope's files are; artifact paths are relative to it.")


class ArtifactEntry(ArtifactRef):
    """One artifact version as ``list_artifacts`` lists it."""

    description: str | None = None
    turn_id: str
    created_at: datetime


class ArtifactList(BaseModel):
    """``list_artifacts``'s structured result."""

    scope_root: str
    artifacts: list[ArtifactEntry]


class TurnEntry(BaseModel):
    """One turn as ``list_turns`` lists it (``summary`` empty while it runs)."""

    turn_id: str
    status: str
    goal: str
    started_at: datetime
    finished_at: datetime | None = None
    summary: str = ""


class TurnList(BaseModel):
    """``list_turns``'s structured result."""

    turns: list[TurnEntry]


# ----------------------------------------------------------------------------- rendering


def _error(message: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)


def _text(text: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)])


def _structured(model: BaseModel, text: str) -> CallToolResult:
    """A result with ``structuredContent`` (what Claude Code shows its model, as JSON) and the same
    facts as ``text`` (what clients that ignore structured content show)."""
    return CallToolResult(
        content=[TextContent(type="text", text=text)],
        structured_content=model.model_dump(mode="json"),
    )


def render_result(result: AnalysisResult) -> str:
    """The turn result as a model reads it: status, summary, error, one line per artifact."""
    lines = [f"turn {result.turn_id}: {result.status}"]
    if result.summary:
        lines.append(result.summary)
    if result.error is not None:
        where = f" in {result.failed_step}" if result.failed_step else ""
        lines.append(f"error{where}: {result.error.name}: {result.error.value}")
        if result.error.traceback:
            lines.append(result.error.traceback.rstrip()[-4000:])
    if result.artifacts:
        lines.append(f"artifacts (paths under {result.scope_root}):")
        lines.extend(
            f"  {a.kind} {a.name} v{a.version}: {a.path} ({a.size_bytes} bytes)" for a in result.artifacts
        )
    lines.extend(f"cites {c.source}" + (f" ({c.claim})" if c.claim else "") for c in result.citations)
    return "\n".join(lines)


def _media_type(data: bytes) -> str | None:
    """The image type of ``data`` by its magic bytes (never by its name: code chose the name)."""
    for magic, media_type in _IMAGE_MAGIC:
        if data.startswith(magic):
            return media_type
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def _as_text(data: bytes) -> str | None:
    """``data`` as text if it is UTF-8 without NUL bytes, else None (a binary file)."""
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


# ----------------------------------------------------------------------------- the server


def _aws_errors() -> tuple[type[Exception], ...]:
    """botocore's errors when boto3 is installed (the aws backend), else none."""
    try:
        from alphaagent.aws.sdk import sdk_errors

        return sdk_errors()
    except ImportError:
        return ()


async def _guarded(call: Callable[[], Awaitable[CallToolResult]]) -> CallToolResult:
    """Run a tool body; a failure the caller caused becomes one ``isError`` line, and so does AWS
    refusing or being out of reach (the model may retry or report it; anything else is the SDK's
    generic error, its detail kept in the server's log)."""
    try:
        return await call()
    except (AlphaAgentError, PathRuleError) as exc:
        return _error(str(exc))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "arguments"
        return _error(f"{where}: {first['msg']}")
    except _aws_errors() as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return _error(f"AWS: {detail}")


def build_server(client: Client) -> MCPServer:
    """The MCP server of ``client``'s user, with the four tools registered (see the module doc)."""

    async def run_analysis(spec: SpecArg, ctx: Context) -> Annotated[CallToolResult, AnalysisResult]:
        token = anyio.lowlevel.current_token()
        sent = 0

        def progress(message: str) -> None:
            nonlocal sent
            sent += 1
            try:
                anyio.from_thread.run(ctx.report_progress, sent, None, message, token=token)
            except Exception:  # progress is advisory: a client gone mid-turn must not fail the turn
                return

        async def body() -> CallToolResult:
            # The turn blocks (the sandbox, the wait on AWS): it runs in a worker thread so the
            # server keeps answering (pings, other calls, progress) meanwhile.
            result = await anyio.to_thread.run_sync(lambda: client.run_analysis(spec, progress=progress))
            scope = parse_scope(spec["scope"])
            answer = AnalysisResult(**result.model_dump(), scope=scope, scope_root=client.scope_root(scope))
            return _structured(answer, render_result(answer))

        return await _guarded(body)

    async def list_artifacts(scope: ScopeArg) -> Annotated[CallToolResult, ArtifactList]:
        async def body() -> CallToolResult:
            parsed = parse_scope(scope)
            versions = await anyio.to_thread.run_sync(client.artifacts, parsed)
            entries = [
                ArtifactEntry(
                    **v.ref().model_dump(),
                    description=v.description,
                    turn_id=v.turn_id,
                    created_at=v.created_at,
                )
                for v in versions
            ]
            root = client.scope_root(parsed)
            lines = [f"{count(len(entries), 'artifact version')} under {root}:"] + [
                f"  {e.kind} {e.name} v{e.version}: {e.path} ({e.size_bytes} bytes, turn {e.turn_id})"
                for e in entries
            ]
            return _structured(ArtifactList(scope_root=root, artifacts=entries), "\n".join(lines))

        return await _guarded(body)

    async def read_artifact(
        scope: ScopeArg,
        name: str,
        version: VersionArg = None,
        offset: OffsetArg = 0,
        limit: LimitArg = TEXT_PAGE_CHARS,
    ) -> CallToolResult:
        async def body() -> CallToolResult:
            # Checked here, not by the SDK, so that the error is one line naming the argument.
            # ReadArtifactArguments refuses these first (call_tool); the same words if not.
            if version is not None and version < 1:
                raise InvalidRequestError(f"version: must be a whole number ≥ 1, got {shown_json(version)}")
            if offset < 0:
                raise InvalidRequestError(f"offset: must be a whole number ≥ 0, got {shown_json(offset)}")
            if not 1 <= limit <= MAX_TEXT_PAGE_CHARS:
                rule = f"a whole number from 1 to {MAX_TEXT_PAGE_CHARS}"
                raise InvalidRequestError(f"limit: must be {rule}, got {shown_json(limit)}")
            found, data = await anyio.to_thread.run_sync(client.artifact, parse_scope(scope), name, version)
            label = f"{found.kind} {found.name} v{found.version} ({found.path}, {found.size_bytes} bytes)"
            media_type = _media_type(data)
            if media_type is not None:
                if len(data) > MAX_IMAGE_BYTES:
                    return _text(
                        f"{label}: a {media_type} image over the {MAX_IMAGE_BYTES}-byte cap; not sent"
                    )
                image = ImageContent(
                    type="image", data=base64.b64encode(data).decode("ascii"), mime_type=media_type
                )
                return CallToolResult(
                    content=[TextContent(type="text", text=f"{label}: {media_type}"), image]
                )
            text = _as_text(data)
            if text is None:
                return _text(f"{label}: a binary file (not UTF-8 text, not an image); not shown")
            chunk = text[offset : offset + limit]
            end = offset + len(chunk)
            more = f"; call again with offset={end} for more" if end < len(text) else "; the end"
            return _text(f"{label}: characters {offset}-{end} of {len(text)}{more}\n{chunk}")

        return await _guarded(body)

    async def list_turns(scope: ScopeArg, limit: TurnLimitArg = None) -> Annotated[CallToolResult, TurnList]:
        async def body() -> CallToolResult:
            if limit is not None and (type(limit) is not int or limit < 1):
                raise InvalidRequestError(f"limit: must be a whole number ≥ 1, got {shown_json(limit)}")
            turns = await anyio.to_thread.run_sync(client.turns, parse_scope(scope))
            # Newest first, as every list of past work (the CLI's turns, the viewer): the question
            # an orchestrator asks is "what did the turn I just ran do". The client keeps the
            # store's order, oldest first.
            entries = [
                TurnEntry(
                    turn_id=t.turn_id,
                    status=t.status,
                    goal=t.goal,
                    started_at=t.started_at,
                    finished_at=t.finished_at,
                    summary=t.result.summary if t.result is not None else "",
                )
                for t in list(reversed(turns))[:limit]
            ]
            left = len(turns) - len(entries)
            older = f" ({left} older not shown: limit {limit})" if left else ""
            lines = [f"{count(len(entries), 'turn')}, newest first{older}:"] + [
                f"  {e.turn_id} {e.status}: {e.goal[:200]}" for e in entries
            ]
            return _structured(TurnList(turns=entries), "\n".join(lines))

        return await _guarded(body)

    reading = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    tools = [
        Tool.from_function(
            run_analysis,
            description=run_analysis_description(),
            annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=True),
        ),
        Tool.from_function(list_artifacts, description=LIST_ARTIFACTS_DESCRIPTION, annotations=reading),
        Tool.from_function(read_artifact, description=READ_ARTIFACT_DESCRIPTION, annotations=reading),
        Tool.from_function(list_turns, description=LIST_TURNS_DESCRIPTION, annotations=reading),
    ]
    for tool in tools:
        tool.parameters["additionalProperties"] = False  # what call_tool enforces, published
    return _Server(
        SERVER_NAME,
        version=_package_version(),
        instructions=(
            "alphaagent runs data analyses for you: call run_analysis with a spec (a goal, inputs,"
            " outputs) and read the artifacts it registers with list_artifacts and read_artifact."
        ),
        tools=tools,
    )


# ----------------------------------------------------------------------------- HTTP


class BearerTokenMiddleware:
    """ASGI middleware: every HTTP request must carry ``Authorization: Bearer <token>``; anything
    else gets 401 with ``WWW-Authenticate: Bearer`` and never reaches the MCP app. Lifespan events
    pass through. The comparison is constant-time (``hmac.compare_digest``)."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Mapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                body = json.dumps({"error": "unauthorized: send Authorization: Bearer <token>"}).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"www-authenticate", b'Bearer realm="alphaagent"'),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


MIN_TOKEN_CHARS = 32
"""The shortest bearer token accepted from ``$ALPHAAGENT_MCP_TOKEN`` (a generated one is 43
URL-safe characters: 256 random bits)."""


def http_token(configured: str | None) -> str:
    """The bearer token: ``configured`` (``$ALPHAAGENT_MCP_TOKEN``) when set, else a fresh one per
    start. Raises ``InvalidRequestError`` for a configured token under ``MIN_TOKEN_CHARS``."""
    if configured:
        if len(configured) < MIN_TOKEN_CHARS:
            raise InvalidRequestError(f"ALPHAAGENT_MCP_TOKEN: at least {MIN_TOKEN_CHARS} characters")
        return configured
    return secrets.token_urlsafe(32)


def serve_http(server: MCPServer, port: int, token: str) -> None:
    """Serve streamable HTTP on ``127.0.0.1:port`` at ``/mcp`` until interrupted. Only 127.0.0.1:
    the server acts for its user with no other authentication than the token, so it must not be
    reachable from another machine (the SDK's DNS-rebinding check is on for this host)."""
    import uvicorn

    app = BearerTokenMiddleware(server.streamable_http_app(host="127.0.0.1"), token)
    print(
        f"alphaagent mcp: http://127.0.0.1:{port}/mcp (Authorization: Bearer {token})",
        file=sys.stderr,
        flush=True,
    )
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    anyio.run(uvicorn.Server(config).serve)


def serve(client: Client, *, http_port: int | None = None, token: str | None = None) -> None:
    """Serve ``client``'s tools until the transport ends: stdio (the client of the MCP connection
    closes it), or streamable HTTP on ``127.0.0.1:http_port`` with ``token`` (``http_token``)."""
    server = build_server(client)
    if http_port is None:
        server.run("stdio")
    else:
        serve_http(server, http_port, http_token(token))
