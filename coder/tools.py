"""The five tools of the ``alphaagent`` MCP server (DESIGN §4.6), thin over ``alphaagent.domain.tools``.

Each tool parses its arguments into a model, calls one domain function in a worker thread (runs
block for seconds; the event loop must keep serving the CLI), and answers with text. Any failure —
an ``AlphaAgentError`` from the domain, arguments that break the schema, or an unexpected
exception — becomes an ``is_error`` result whose text names the problem; nothing is raised into the
SDK. Calls of one turn are serialised, so the run budget and the turn's lists stay consistent even
if the model asks for several tools at once.

What the model gets back is capped at ``MODEL_TEXT_CHARS`` characters per call (head and tail kept,
with a marker naming what was cut and where the whole text is); the full run result, within the
DESIGN §4.3 caps, stays in the run record and the spill files.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
from claude_agent_sdk import SdkMcpTool, ToolAnnotations, create_sdk_mcp_server, tool
from claude_agent_sdk.types import McpSdkServerConfig
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from alphaagent import connectors
from alphaagent.domain import documents
from alphaagent.domain import tools as domain
from alphaagent.domain.tools import TurnContext, tool_error_text
from alphaagent.errors import AlphaAgentError, PathRuleError, ToolError
from alphaagent.models.common import ArtifactKind, check_workspace_path
from alphaagent.models.rules import arguments_refusal
from alphaagent.models.run import RunResult
from alphaagent.sandbox.supervisor import iter_result_lines
from coder import seeing

logger = logging.getLogger(__name__)

SERVER_NAME = "alphaagent"
TOOL_NAMES = ("run_in_env", "read_document", "connector_fetch", "register_artifact", "emit_citation")
ALLOWED_TOOLS = tuple(f"mcp__{SERVER_NAME}__{name}" for name in TOOL_NAMES)
"""The names the model sees (``mcp__<server>__<tool>``): the only tools of a coder turn."""

MODEL_TEXT_CHARS = 30_000
"""Characters of one tool result given to the model (~8k tokens): enough for a page of output or a
document page, small enough that twenty runs fit in the context. Longer text keeps its head and
tail; the middle is named with the spill file to page through with ``read_document``."""

_RESULT_CHARS = MODEL_TEXT_CHARS + 10_000
"""The last bound on a whole tool result: the clipped text plus its JSON (headers, run details)."""

_INLINE_RESULT_CHARS = 2 * MODEL_TEXT_CHARS
"""Told to the CLI (``maxResultSizeChars``) so it never swaps a result for a file the model cannot
open (it has no file tools): every result we send is below it."""


class _Args(BaseModel):
    """A tool's arguments, as strict as the spec: an unknown argument is refused, and a value must
    have its JSON type (``strict``: ``"3"`` is not a number, ``1`` is not ``true``); a refusal is
    the one line ``ARG: must be RULE, got VALUE`` (``alphaagent.models.rules.arguments_refusal``),
    returned to the model as an ``is_error`` result (DESIGN §4.6)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class RunInEnvArgs(_Args):
    """Arguments of ``run_in_env``."""

    code: str = Field(
        min_length=1, description="Python source, run as a script (print what you want to see)."
    )
    timeout_s: float | None = Field(
        None, gt=0, description="Wall-clock limit in seconds; default and maximum: the spec's run_timeout_s."
    )
    fresh: bool = Field(
        False,
        description="Start with empty globals instead of the session's saved ones (kept for later runs).",
    )


class ReadDocumentArgs(_Args):
    """Arguments of ``read_document``."""

    path: str = Field(
        description="Workspace-relative path, e.g. docs/report.pdf or work/runs/<run_id>/stdout.txt."
    )
    offset: int = Field(
        0, ge=0, description="First character to return (0 = the start); for csv, parquet, xlsx: first row."
    )
    limit: int | None = Field(
        None,
        ge=1,
        le=MODEL_TEXT_CHARS,
        description=(
            f"Characters to return (default {documents.DEFAULT_PAGE_CHARS}, at most {MODEL_TEXT_CHARS});"
            f" for csv, parquet, xlsx: rows (default {seeing.DEFAULT_TABLE_ROWS},"
            f" at most {seeing.MAX_TABLE_ROWS})."
        ),
    )


class ConnectorFetchArgs(_Args):
    """Arguments of ``connector_fetch``."""

    connector: str = Field(description="A connector's name (the tool description lists them).")
    request: dict[str, Any] = Field(
        description="The connector's request: its fields are in the tool description ('?': optional)."
    )


class RegisterArtifactArgs(_Args):
    """Arguments of ``register_artifact``."""

    kind: ArtifactKind = Field(description="dataset, chart or report.")
    path: str = Field(description="The file, e.g. datasets/mass.csv, charts/mass.png, reports/summary.md.")
    name: str | None = Field(
        None,
        description=(
            "The artifact's name (1-64 of a-z 0-9 . _ -); use the spec's output name."
            " Default: from the file name."
        ),
    )
    description: str | None = Field(None, max_length=2000, description="One sentence: what it contains.")


class EmitCitationArgs(_Args):
    """Arguments of ``emit_citation``."""

    source: str = Field(
        description="A file of this scope (docs/x.pdf, datasets/y.csv) or a URL fetched by a connector."
    )
    locator: str | None = Field(None, description="Where in the source: page, section, row or column.")
    quote: str | None = Field(None, description="The passage relied on, verbatim and short.")
    claim: str | None = Field(None, description="The statement of your answer this source supports.")


# ----------------------------------------------------------------------------- rendering

RESULT_HEADING = "result (stdout, stderr and the traceback are above):"


def clip(text: str, limit: int = MODEL_TEXT_CHARS, where: str | None = None) -> str:
    """``text`` within ``limit`` characters: head and tail kept, the middle replaced by a marker
    that says how many characters were cut and, when given, where the whole text is."""
    if len(text) <= limit:
        return text
    hint = f"; the whole text is in {where} (page through it with read_document)" if where else ""
    marker = f"\n[... {{}} characters omitted{hint} ...]\n"
    room = max(limit - len(marker) - 8, 0)
    head, tail = text[: room * 2 // 3], text[len(text) - room // 3 :] if room // 3 else ""
    return head + marker.format(len(text) - len(head) - len(tail)) + tail


_NOT_FOR_THE_MODEL: Any = {
    "stdout": True,
    "stderr": True,
    "error": {"traceback"},
    "isolation": True,
    "landlock": True,
    "environment_start_ms": True,
}


def status_line(result: RunResult) -> str:
    """The first line of a run result for the model: status, exit code, duration, files changed
    and, when the session keeps live state, what was restored, e.g.
    ``[run ok] exit 0 · 412 ms · files: 1 created, 1 modified · state restored: df, model``."""
    files = result.files
    counts = [
        f"{len(v)} {k}"
        for k, v in (("created", files.created), ("modified", files.modified), ("deleted", files.deleted))
        if v
    ]
    parts = [
        f"[run {result.status}] exit {result.exit_code if result.exit_code is not None else '-'}",
        f"{result.duration_ms} ms",
        "files: " + (", ".join(counts) if counts else "none changed"),
    ]
    state = result.state
    if state is not None:
        restored = state.restored
        shown = ", ".join(restored[:12]) + (f" (+{len(restored) - 12})" if len(restored) > 12 else "")
        parts.append(f"state restored: {shown}" if restored else "state: nothing restored")
    return " · ".join(parts)


def next_steps(result: RunResult, environments: list[tuple[str, tuple[str, ...]]] | None = None) -> list[str]:
    """What the model can do about a run that did not go well, where the platform knows:
    a timeout (its limit, and how to split the work), a missing module (which registered
    environments list it), output that was cut (where the rest is)."""
    hints = []
    if result.status == "timeout":
        limit = result.limits.get("timeout_s", "?")
        hints.append(
            f"next: the run hit its {limit} s limit and was stopped. Split the work into smaller runs"
            " (save intermediate results to files), sample the data first, or vectorise the slow loop."
        )
    if result.error is not None and result.error.name == "ModuleNotFoundError":
        module = result.error.value.split("'")[1] if result.error.value.count("'") >= 2 else ""
        root = module.split(".")[0].lower().replace("_", "-")
        having = [
            env_id
            for env_id, packages in environments or []
            if any(p.split("==")[0].lower().replace("_", "-") == root for p in packages)
        ]
        where = (
            f" The environment(s) {', '.join(having)} have it: a spec with that environment_id runs there."
            if having
            else " No registered environment lists it: use the libraries this environment has."
        )
        hints.append(f"next: {module or 'the module'} is not installed here; runs cannot pip install.{where}")
    for stream, cut, path in (
        ("stdout", result.stdout_truncated, result.stdout_path),
        ("stderr", result.stderr_truncated, result.stderr_path),
    ):
        if cut:
            whole = (
                f"the whole {stream} is in {path}; page through it with read_document"
                if path
                else (f"{stream} was cut at the capture cap; print less (a summary, head/tail) next time")
            )
            hints.append(f"next: {whole}.")
    return hints


def render_run(result: RunResult, environments: list[tuple[str, tuple[str, ...]]] | None = None) -> str:
    """A run result for the model: one status line (``status_line``), the readable rendering
    (``alphaagent exec``'s, with the capture's truncation markers) clipped to ``MODEL_TEXT_CHARS``,
    the next steps the platform knows (``next_steps``), then the structured result (DESIGN §4.4)
    as JSON without what is already shown above it (the two streams and the traceback)."""
    readable = "\n".join(iter_result_lines(result))
    spill = result.stdout_path if len(result.stdout) >= len(result.stderr) else result.stderr_path
    # High-signal fields only: the streams and the traceback are above, and how the sandbox isolates
    # the run (isolation, Landlock, cold start) tells the model nothing it can act on.
    details = result.model_dump(mode="json", exclude=_NOT_FOR_THE_MODEL)
    hints = "".join(f"\n{hint}" for hint in next_steps(result, environments))
    status = status_line(result)
    # The status line and the hints come out of the output's share, so the whole stays in bounds.
    room = MODEL_TEXT_CHARS - len(status) - len(hints) - 1
    body = f"{status}\n{clip(readable, limit=room, where=spill)}{hints}"
    return f"{body}\n\n{RESULT_HEADING}\n{json.dumps(details)}"


def render_page(page: documents.DocumentPage) -> str:
    """A document page: one JSON line of where it is in the document, then the text itself."""
    end = page.offset + len(page.text)
    header = {
        "path": page.path,
        "offset": page.offset,
        "chars": len(page.text),
        "total_chars": page.total_chars,
        "next_offset": end if end < page.total_chars else None,
        "metadata": page.metadata,
    }
    return f"{json.dumps(header, ensure_ascii=False)}\n\n{page.text}"


# ----------------------------------------------------------------------------- the tools


@dataclass(frozen=True)
class _Answer:
    """What a tool call gives the model (``text``, then ``images``) and the progress line's outcome."""

    text: str
    outcome: str
    images: tuple[dict[str, Any], ...] = ()


def _pictures(ctx: TurnContext, paths: list[str]) -> tuple[str, tuple[dict[str, Any], ...]]:
    """One line about the charts among ``paths`` (what is shown below, or why not) and the
    image blocks themselves; ``("", ())`` when there is no chart."""
    pictures = seeing.chart_pictures(ctx, paths)
    line = "charts: " + "; ".join(pictures.notes) if pictures.notes else ""
    return line, tuple(pictures.blocks)


def _environments(ctx: TurnContext) -> list[tuple[str, tuple[str, ...]]]:
    return [(e.environment_id, e.packages) for e in ctx.backend.environments.list()]


class ToolCalls:
    """The tool calls of one turn running in worker threads. A turn cut by its timeout stops the CLI
    at once, but a call already in its thread (a run being killed, its record being written) cannot
    be cancelled: the turn waits for it (``wait_idle``) so it never ends before its runs' records."""

    def __init__(self) -> None:
        self._idle = threading.Condition()
        self._running = 0

    def __enter__(self) -> None:
        with self._idle:
            self._running += 1

    def __exit__(self, *exc_info: object) -> None:
        with self._idle:
            self._running -= 1
            self._idle.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        """Waits up to ``timeout_s`` seconds for no call to be running; False if one still is."""
        with self._idle:
            return self._idle.wait_for(lambda: self._running == 0, timeout=timeout_s)


@dataclass(frozen=True)
class _Turn:
    """What a tool call works on: the turn's context, its deadline (``time.monotonic()``) and the
    calls in flight."""

    ctx: TurnContext
    deadline: float | None
    calls: ToolCalls


def _run_in_env(turn: _Turn, args: RunInEnvArgs) -> _Answer:
    ctx, timeout = turn.ctx, args.timeout_s
    if turn.deadline is not None:
        # A run never outlives the turn: it gets at most the turn's remaining time.
        remaining = turn.deadline - time.monotonic()
        if remaining < 1:
            raise ToolError("the turn's time (constraints.turn_timeout_s) is up: no more runs; summarise now")
        run_limit = ctx.spec.constraints.run_timeout_s
        if remaining < (timeout or run_limit) <= run_limit:
            timeout = remaining
    result = domain.run_in_env(ctx, args.code, timeout, fresh=args.fresh)
    outcome = f"{result.status} (exit {result.exit_code}, {result.duration_ms} ms)"
    text = render_run(result, _environments(ctx))
    # Charts the run drew come back as pictures, so a blank or mislabelled plot is seen.
    line, images = _pictures(ctx, [*result.files.created, *result.files.modified])
    if line:
        status, rest = text.split("\n", 1)
        text = f"{status}\n{line}\n{rest}"
    return _Answer(text, outcome, images)


def _read_document(turn: _Turn, args: ReadDocumentArgs) -> _Answer:
    try:
        normal = check_workspace_path(args.path, prefix=turn.ctx.scope.key + "/")
    except PathRuleError as exc:
        raise ToolError(f"path {args.path!r}: {exc}") from None
    if normal.lower().endswith(seeing.TABLE_SUFFIXES):
        rows = args.limit if args.limit is not None else seeing.DEFAULT_TABLE_ROWS
        table = seeing.read_table(turn.ctx, normal, args.offset, rows)
        return _Answer(table, f"{normal} rows [{args.offset}:{args.offset + rows}]")
    limit = args.limit if args.limit is not None else documents.DEFAULT_PAGE_CHARS
    page = domain.read_document(turn.ctx, normal, args.offset, limit)
    return _Answer(render_page(page), f"{page.path} [{page.offset}:{page.offset + len(page.text)}]")


def _connector_fetch(turn: _Turn, args: ConnectorFetchArgs) -> _Answer:
    copy = domain.connector_fetch(turn.ctx, args.connector, args.request)
    return _Answer(domain.as_json(copy), f"{copy.path} ({copy.bytes} bytes)")


def _register_artifact(turn: _Turn, args: RegisterArtifactArgs) -> _Answer:
    ctx = turn.ctx
    ref = domain.register_artifact(ctx, args.kind, args.path, name=args.name, description=args.description)
    text, images = domain.as_json(ref), tuple[dict[str, Any], ...]()
    if ref.kind == "dataset":
        # What is in it, from the profile stored with the version: the model checks its own work.
        version = ctx.backend.store.get_artifact(ctx.user_id, ctx.scope.key, ref.name, ref.version)
        if version is not None:
            text += "\n\n" + seeing.render_profile(version.metadata)
    elif ref.kind == "chart":
        line, images = _pictures(ctx, [ref.path])
        text += f"\n\n{line}" if line else ""
    return _Answer(text, f"{ref.kind} {ref.name} v{ref.version} ({ref.path})", images)


def _emit_citation(turn: _Turn, args: EmitCitationArgs) -> _Answer:
    citation = domain.emit_citation(turn.ctx, args.source, args.locator, args.quote, args.claim)
    return _Answer(json.dumps({"citation_id": citation.citation_id}), citation.source)


@dataclass(frozen=True)
class _Spec:
    name: str
    args: type[_Args]
    call: Callable[[_Turn, Any], _Answer]


def _descriptions(ctx: TurnContext) -> dict[str, str]:
    limits = ctx.spec.constraints
    # Every registered connector says what it reads and what this backend allows it.
    allowed = connectors.describe_all(ctx.backend.connectors)
    return {
        "run_in_env": (
            "Run Python code in the analysis environment, with the scope's root folder (docs/, datasets/,"
            " charts/, reports/, work/) as the working directory. Returns stdout, stderr, the traceback of"
            " an error, and the files the run created or changed. Each call is a fresh process, but the"
            " globals persist within the session: what one run defines, the next one has (its result's"
            " 'state:' line names what was restored and what could not be kept)."
            f" This turn allows {limits.max_runs} runs of at most"
            f" {limits.run_timeout_s:g} s each; keep runs small and read each result before the next."
            " The result starts with one status line ([run ok|error|timeout|killed], exit code, duration,"
            " files changed) and ends with next steps when the platform knows them. A chart the run saves"
            " under charts/ as png or jpg comes back as a picture: look at it before you register it."
        ),
        "read_document": (
            "Read a document of this scope as text: txt, md, csv, json, html or pdf. Returns a JSON line"
            " (total_chars, next_offset, metadata such as the page count) and then the text; call again"
            " with offset=next_offset for the next page. Also reads a run's full output from"
            " work/runs/<run_id>/stdout.txt when the run result was cut. csv, parquet and xlsx files are"
            " read as a table instead: offset and limit count rows, and the JSON line gives the columns and"
            " next_offset."
        ),
        "connector_fetch": (
            "Fetch a document through a connector and keep a point-in-time copy in docs/; returns its"
            " path, size, media type and fetch time. Use it only for sources the spec did not already"
            f" bring into docs/. {allowed} Requests: {connectors.request_help()}."
        ),
        "register_artifact": (
            "Register a file you wrote as an artifact of this turn (the next version if the name exists)."
            " Register every output the spec names, with the spec's kind and name. datasets/: csv, parquet,"
            " json, xlsx; charts/: png, svg, jpg, html; reports/: md, html, pdf, txt. Returns"
            " artifact_id, name, version, path and sha256; for a dataset also its profile (rows, columns"
            " and types, nulls, first rows) and for a png or jpg chart its picture: check that they are"
            " what you meant to deliver."
        ),
        "emit_citation": (
            "Cite a source your answer relies on: a document in docs/, a dataset, or a fetched URL. Give"
            " a locator (page, section, row) or a short verbatim quote, and the claim it supports."
            " Returns the citation_id."
        ),
    }


_SPECS = (
    _Spec("run_in_env", RunInEnvArgs, _run_in_env),
    _Spec("read_document", ReadDocumentArgs, _read_document),
    _Spec("connector_fetch", ConnectorFetchArgs, _connector_fetch),
    _Spec("register_artifact", RegisterArtifactArgs, _register_artifact),
    _Spec("emit_citation", EmitCitationArgs, _emit_citation),
)


def input_schema(args: type[BaseModel]) -> dict[str, Any]:
    """The JSON Schema the model sees for an arguments model: pydantic's, without titles, and with an
    optional field as its plain type (leaving it out means the default)."""

    def simplify(node: Any) -> Any:
        if isinstance(node, dict):
            options = node.get("anyOf")
            if isinstance(options, list) and {"type": "null"} in options and len(options) == 2:
                (kept,) = [o for o in options if o != {"type": "null"}]
                node = {**{k: v for k, v in node.items() if k not in ("anyOf", "default")}, **kept}
            return {k: simplify(v) for k, v in node.items() if k != "title"}
        if isinstance(node, list):
            return [simplify(item) for item in node]
        return node

    schema: dict[str, Any] = simplify(args.model_json_schema())
    schema["additionalProperties"] = False
    return schema


def _error(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "is_error": True}


def _argument_error(exc: ValidationError, args: type[BaseModel]) -> str:
    return f"InvalidArguments: {arguments_refusal(exc, args)}"


def alphaagent_tools(
    ctx: TurnContext, deadline: float | None = None, calls: ToolCalls | None = None
) -> list[SdkMcpTool[Any]]:
    """The five tools, bound to one turn's context; with a ``deadline`` (``time.monotonic()``), a
    run's timeout is cut to the turn's remaining time; ``calls`` counts the calls in flight. Every
    call is reported through ``ctx.progress`` (``coder: <tool> -> <outcome>``)."""
    turn = _Turn(ctx, deadline, calls if calls is not None else ToolCalls())

    def call_in_thread(spec: _Spec, parsed: BaseModel) -> _Answer:
        with turn.calls:
            return spec.call(turn, parsed)

    descriptions = _descriptions(ctx)
    serial = anyio.Lock()
    annotations = ToolAnnotations(maxResultSizeChars=_INLINE_RESULT_CHARS)

    def bind(spec: _Spec) -> SdkMcpTool[Any]:
        async def handler(arguments: dict[str, Any]) -> dict[str, Any]:
            try:
                parsed = spec.args.model_validate(arguments)
            except ValidationError as exc:
                return _error(_argument_error(exc, spec.args))
            async with serial:
                try:
                    answer = await anyio.to_thread.run_sync(call_in_thread, spec, parsed)
                except AlphaAgentError as exc:
                    ctx.progress(f"coder: {spec.name} -> {type(exc).__name__}")
                    return _error(tool_error_text(exc))
                except Exception as exc:  # a defect must reach the model as text, not kill the loop
                    logger.exception("tool %s failed unexpectedly", spec.name)
                    ctx.progress(f"coder: {spec.name} -> {type(exc).__name__}")
                    return _error(f"{type(exc).__name__}: {exc}"[:2000])
            ctx.progress(f"coder: {spec.name} -> {answer.outcome}")
            return {"content": [{"type": "text", "text": clip(answer.text, _RESULT_CHARS)}, *answer.images]}

        return tool(spec.name, descriptions[spec.name], input_schema(spec.args), annotations)(handler)

    return [bind(spec) for spec in _SPECS]


def alphaagent_server(
    ctx: TurnContext, deadline: float | None = None, calls: ToolCalls | None = None
) -> McpSdkServerConfig:
    """The in-process MCP server ``alphaagent`` with exactly the five tools of one turn."""
    return create_sdk_mcp_server(SERVER_NAME, tools=alphaagent_tools(ctx, deadline, calls))
