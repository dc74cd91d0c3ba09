"""A scripted Anthropic Messages API on 127.0.0.1, for running the real Agent SDK and its bundled CLI
offline (DESIGN §6: coder tests).

``POST /v1/messages`` answers with the next entry of a script: a ``Reply`` (streamed as SSE exactly
as the API streams it: ``message_start``, ``content_block_start``/``delta``/``stop`` for text and
``tool_use`` blocks with ``input_json_delta``, ``message_delta`` with the stop reason and usage,
``message_stop``; or as one JSON body when the request does not ask for a stream) or a ``Status``
(an API error such as 500 or 529). Every request the server receives, on any path, is recorded.

Example::

    with ScriptedMessagesAPI([Reply([tool_use("mcp__alphaagent__run_in_env", {"code": "1"})]),
                              Reply([text("done")])]) as api:
        env = {"ANTHROPIC_BASE_URL": api.base_url, "ANTHROPIC_API_KEY": "sk-test"}
        ...
        assert api.message_requests()[1].tool_results()[0]["is_error"] is False
"""

from __future__ import annotations

import itertools
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_ids = itertools.count(1)


def text(value: str) -> dict[str, Any]:
    """A text content block of a scripted reply."""
    return {"type": "text", "text": value}


def tool_use(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A ``tool_use`` content block of a scripted reply (the id is made up, unique per server run)."""
    return {"type": "tool_use", "id": f"toolu_{next(_ids):04d}", "name": name, "input": arguments}


@dataclass
class Reply:
    """One assistant message. ``stop_reason`` defaults to ``tool_use`` when a block calls a tool."""

    content: list[dict[str, Any]]
    stop_reason: str | None = None
    input_tokens: int = 100
    output_tokens: int = 20

    def final_stop_reason(self) -> str:
        if self.stop_reason:
            return self.stop_reason
        return "tool_use" if any(b["type"] == "tool_use" for b in self.content) else "end_turn"


@dataclass
class Status:
    """An API error answer: HTTP ``code`` with the API's error body (529 is ``overloaded_error``) and
    ``x-should-retry: true``, as the API sends for errors worth retrying."""

    code: int
    message: str = "scripted failure"

    def body(self) -> bytes:
        kind = {529: "overloaded_error", 500: "api_error", 429: "rate_limit_error"}.get(
            self.code, "api_error"
        )
        return json.dumps({"type": "error", "error": {"type": kind, "message": self.message}}).encode()


@dataclass
class RecordedRequest:
    """What the server received: method, path (with query), headers and the JSON body (or None)."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any

    @property
    def route(self) -> str:
        return self.path.split("?", 1)[0]

    def tool_names(self) -> list[str]:
        """The names of the tools the request offered the model."""
        if not isinstance(self.body, dict):
            return []
        return [t.get("name", "") for t in self.body.get("tools", []) or []]

    def tool_results(self) -> list[dict[str, Any]]:
        """The ``tool_result`` blocks of the last user message, with their text joined in ``text`` and
        their blocks as sent in ``content`` (text and image blocks)."""
        if not isinstance(self.body, dict) or not self.body.get("messages"):
            return []
        # The CLI may append a system-role reminder after the tool results: the last *user* message.
        users = [m for m in self.body["messages"] if isinstance(m, dict) and m.get("role") == "user"]
        last = users[-1] if users else {}
        content = last.get("content")
        if last.get("role") != "user" or not isinstance(content, list):
            return []
        results = []
        for block in content:
            if block.get("type") != "tool_result":
                continue
            inner = block.get("content")
            if isinstance(inner, list):
                joined = "\n".join(part.get("text", "") for part in inner if isinstance(part, dict))
            else:
                joined = str(inner or "")
            results.append(
                {
                    "tool_use_id": block.get("tool_use_id"),
                    "is_error": bool(block.get("is_error")),
                    "text": joined,
                    "content": inner if isinstance(inner, list) else [],
                }
            )
        return results


@dataclass
class ScriptedMessagesAPI:
    """The server. ``script`` is consumed in order by the requests that carry ``tools`` (the agent
    loop); other message requests (a side query of the CLI, if it makes one) get ``side_reply``.
    When the script runs out, the loop gets ``exhausted`` (a plain final answer)."""

    script: list[Reply | Status] = field(default_factory=list)
    side_reply: Reply = field(default_factory=lambda: Reply([text("ok")]))
    exhausted: Reply = field(default_factory=lambda: Reply([text("script exhausted")]))
    requests: list[RecordedRequest] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> ScriptedMessagesAPI:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        api = self

        class Handler(_Handler):
            owner = api

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="scripted-api", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def base_url(self) -> str:
        assert self._server is not None, "start the server first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def load(self, script: list[Reply | Status]) -> None:
        """Replace the script and forget the recorded requests (one test, one script)."""
        with self._lock:
            self.script = list(script)
            self.requests.clear()

    # ------------------------------------------------------------------ what was received

    def message_requests(self) -> list[RecordedRequest]:
        """The ``POST /v1/messages`` requests of the agent loop (those that offer tools), in order."""
        with self._lock:
            return [r for r in self.requests if r.route == "/v1/messages" and r.tool_names()]

    def routes(self) -> set[str]:
        """Every distinct ``METHOD /path`` received."""
        with self._lock:
            return {f"{r.method} {r.route}" for r in self.requests}

    # ------------------------------------------------------------------ answering

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def _next(self, request: RecordedRequest) -> Reply | Status:
        if request.route != "/v1/messages" or not request.tool_names():
            return self.side_reply
        with self._lock:
            return self.script.pop(0) if self.script else self.exhausted


class _Handler(BaseHTTPRequestHandler):
    owner: ScriptedMessagesAPI
    protocol_version = "HTTP/1.1"

    def _read_body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode("utf-8", "replace")

    def _receive(self, method: str) -> RecordedRequest:
        request = RecordedRequest(
            method=method,
            path=self.path,
            headers={k.lower(): v for k, v in self.headers.items()},
            body=self._read_body(),
        )
        self.owner._record(request)
        return request

    def do_GET(self) -> None:
        self._receive("GET")
        self._send_json(404, {"type": "error", "error": {"type": "not_found_error", "message": "not here"}})

    def do_HEAD(self) -> None:
        self._receive("HEAD")
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        request = self._receive("POST")
        if request.route not in ("/v1/messages", "/v1/messages/count_tokens"):
            self._send_json(
                404, {"type": "error", "error": {"type": "not_found_error", "message": "not here"}}
            )
            return
        if request.route == "/v1/messages/count_tokens":
            self._send_json(200, {"input_tokens": 100})
            return
        answer = self.owner._next(request)
        if isinstance(answer, Status):
            body = answer.body()
            self.send_response(answer.code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("x-should-retry", "true")
            self.end_headers()
            self.wfile.write(body)
            return
        model = request.body.get("model", "claude-test") if isinstance(request.body, dict) else "claude-test"
        if isinstance(request.body, dict) and request.body.get("stream"):
            self._stream(answer, model)
        else:
            self._send_json(200, _message(answer, model, with_content=True))

    def _send_json(self, code: int, payload: Any) -> None:
        body = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _stream(self, reply: Reply, model: str) -> None:
        events: list[tuple[str, dict[str, Any]]] = []
        start = _message(reply, model, with_content=False)
        events.append(("message_start", {"type": "message_start", "message": start}))
        for index, block in enumerate(reply.content):
            if block["type"] == "text":
                events.append(
                    (
                        "content_block_start",
                        {"type": "content_block_start", "index": index, "content_block": text("")},
                    )
                )
                value = block["text"]
                for piece in (value[: len(value) // 2], value[len(value) // 2 :]):
                    delta = {"type": "text_delta", "text": piece}
                    events.append(
                        (
                            "content_block_delta",
                            {"type": "content_block_delta", "index": index, "delta": delta},
                        )
                    )
            else:
                empty = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
                events.append(
                    (
                        "content_block_start",
                        {"type": "content_block_start", "index": index, "content_block": empty},
                    )
                )
                raw = json.dumps(block["input"])
                for piece in (raw[: len(raw) // 2], raw[len(raw) // 2 :]):
                    delta = {"type": "input_json_delta", "partial_json": piece}
                    events.append(
                        (
                            "content_block_delta",
                            {"type": "content_block_delta", "index": index, "delta": delta},
                        )
                    )
            events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        events.append(
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": reply.final_stop_reason(), "stop_sequence": None},
                    "usage": {"output_tokens": reply.output_tokens},
                },
            )
        )
        events.append(("message_stop", {"type": "message_stop"}))
        body = b"".join(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return


def _message(reply: Reply, model: str, *, with_content: bool) -> dict[str, Any]:
    return {
        "id": f"msg_{next(_ids):06d}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": list(reply.content) if with_content else [],
        "stop_reason": reply.final_stop_reason() if with_content else None,
        "stop_sequence": None,
        "usage": {
            "input_tokens": reply.input_tokens,
            "output_tokens": reply.output_tokens if with_content else 1,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }
