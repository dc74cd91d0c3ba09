"""The record of one coder turn, kept under ``work/turns/{turn_id}/`` in the scope:

- ``transcript.jsonl``: one JSON object per line — ``turn_start`` (model, limits, system prompt,
  user prompt, tools), then every message of the Agent SDK stream in order (``AssistantMessage``
  with its text and ``tool_use`` blocks, ``UserMessage`` with the ``tool_result`` blocks,
  ``SystemMessage`` such as ``api_retry``, the final ``ResultMessage``), then ``turn_end``
  (outcome, error, the last lines the CLI wrote to stderr).
- ``usage.json``: the turn's tokens, cost and durations (``TurnUsage``).

Both are written once, when the turn ends, whatever the outcome.
"""

from __future__ import annotations

import dataclasses
import json
from collections import deque
from datetime import UTC, datetime
from typing import Any

from claude_agent_sdk import AssistantMessage, Message, ResultMessage, SystemMessage, TextBlock
from pydantic import BaseModel

from alphaagent.domain.tools import TurnContext

STDERR_LINES_KEPT = 50
SYNTHETIC_MODEL = "<synthetic>"
"""The model name of messages the CLI makes up itself (e.g. the text of an API error): not a model turn."""


class TurnUsage(BaseModel):
    """Model use of one turn. Tokens and cost come from the CLI's final result; without one (the
    turn was cut short) they are summed from the messages received and ``cost_usd`` is unknown."""

    turn_id: str
    model: str | None
    outcome: str
    model_turns: int
    runs: int
    api_retries: int
    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int
    cost_usd: float | None
    duration_ms: int | None
    api_duration_ms: int | None
    model_usage: dict[str, Any]

    def line(self, transcript_path: str) -> str:
        """One line for people, e.g. ``[coder: 6 model turns, 2 runs, 1,200 in / 340 out tokens,
        $0.0123, 8.1 s; work/turns/01J.../transcript.jsonl]``."""
        cost = f"${self.cost_usd:.4f}" if self.cost_usd is not None else "cost unknown"
        seconds = f", {self.duration_ms / 1000:.1f} s" if self.duration_ms is not None else ""
        tokens = f"{self.input_tokens + self.cache_read_input_tokens + self.cache_creation_input_tokens:,} in"
        return (
            f"[coder: {self.model_turns} model turns, {self.runs} runs, {tokens} / {self.output_tokens:,} out"
            f" tokens, {cost}{seconds}; {transcript_path}]"
        )


def _now() -> str:
    return datetime.now(UTC).isoformat()


class Transcript:
    """Collects the turn's messages in memory and writes them to the scope at the end."""

    def __init__(self, turn_id: str, model: str | None) -> None:
        self.turn_id, self.model = turn_id, model
        self.lines: list[str] = []
        self.result: ResultMessage | None = None
        self.stderr: deque[str] = deque(maxlen=STDERR_LINES_KEPT)
        self._usage_by_message: dict[str, dict[str, Any]] = {}
        self._last_text = ""
        self._retries = 0
        self._assistant_turns: set[str] = set()

    @property
    def path(self) -> str:
        """Where ``transcript.jsonl`` goes, relative to the scope."""
        return f"work/turns/{self.turn_id}/transcript.jsonl"

    def note(self, kind: str, **data: Any) -> None:
        """Append a line of our own (``turn_start``, ``turn_end``)."""
        self.lines.append(json.dumps({"type": kind, "at": _now(), **data}, ensure_ascii=False, default=str))

    def stderr_line(self, line: str) -> None:
        """The CLI's stderr callback: keep the last lines, for the error message and ``turn_end``."""
        self.stderr.append(line.rstrip()[:2000])

    def record(self, message: Message) -> None:
        """Append one message of the SDK stream, as its dataclass fields."""
        body = dataclasses.asdict(message) if dataclasses.is_dataclass(message) else {"value": repr(message)}
        self.note(type(message).__name__, message=body)
        if isinstance(message, AssistantMessage) and message.model != SYNTHETIC_MODEL:
            key = message.message_id or f"#{len(self._assistant_turns)}"
            self._assistant_turns.add(key)
            if message.usage:
                self._usage_by_message[key] = message.usage
            texts = [block.text for block in message.content if isinstance(block, TextBlock)]
            if texts:
                self._last_text = "\n".join(texts)
        elif isinstance(message, SystemMessage) and message.subtype == "api_retry":
            self._retries += 1
        elif isinstance(message, ResultMessage):
            self.result = message

    @property
    def last_text(self) -> str:
        """The text of the model's last message that had any."""
        return self._last_text

    @property
    def api_retries(self) -> int:
        """How many times the CLI retried a failed API request."""
        return self._retries

    def usage(self, ctx: TurnContext) -> TurnUsage:
        """The turn's usage so far."""
        result = self.result
        if result is not None and result.usage is not None:
            totals = result.usage
        else:
            totals = {}
            for usage in self._usage_by_message.values():
                for key, value in usage.items():
                    if isinstance(value, int):
                        totals[key] = totals.get(key, 0) + value
        return TurnUsage(
            turn_id=self.turn_id,
            model=self.model,
            outcome=(result.terminal_reason or result.subtype) if result is not None else "no result",
            model_turns=len(self._assistant_turns),
            runs=len(ctx.run_ids),
            api_retries=self._retries,
            input_tokens=int(totals.get("input_tokens") or 0),
            output_tokens=int(totals.get("output_tokens") or 0),
            cache_read_input_tokens=int(totals.get("cache_read_input_tokens") or 0),
            cache_creation_input_tokens=int(totals.get("cache_creation_input_tokens") or 0),
            cost_usd=result.total_cost_usd if result is not None else None,
            duration_ms=result.duration_ms if result is not None else None,
            api_duration_ms=result.duration_api_ms if result is not None else None,
            model_usage=dict(result.model_usage or {}) if result is not None else {},
        )

    def save(self, ctx: TurnContext) -> TurnUsage:
        """Write ``transcript.jsonl`` and ``usage.json`` to the scope; return the usage."""
        usage = self.usage(ctx)
        folder = f"work/turns/{self.turn_id}"
        data = ("\n".join(self.lines) + "\n").encode()
        ctx.backend.workspace.write_bytes(ctx.scope, f"{folder}/transcript.jsonl", data)
        ctx.backend.workspace.write_bytes(
            ctx.scope, f"{folder}/usage.json", usage.model_dump_json(indent=2).encode()
        )
        return usage
