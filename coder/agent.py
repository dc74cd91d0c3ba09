"""The coder of a turn: one Claude Agent SDK loop with the ``alphaagent`` MCP server (DESIGN §4.6).

``make_coder(settings)`` returns the ``Coder`` the turn driver calls for a spec without steps. The
loop runs the bundled Claude Code CLI with no built-in tool (``tools=[]``), only the five platform
tools allowed, ``permission_mode="dontAsk"`` (anything else is refused, never prompted),
``setting_sources=[]`` and no skills (nothing on disk changes the agent), and a private
``CLAUDE_CONFIG_DIR`` per turn (removed after it), so no turn sees another's sessions or the host's
configuration. ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1`` keeps the CLI from calling anything
but the model endpoint (no telemetry, update checks or error reporting).

Example::

    from coder.agent import make_coder
    from coder.settings import CoderSettings

    settings = CoderSettings(provider="anthropic", anthropic_api_key="sk-ant-...")
    with AlphaAgent(coder=make_coder(settings)) as agent:
        result = agent.run_analysis(spec_without_steps)
        print(result.summary)  # the model's summary, then one usage line

The summary the turn result carries is the model's final answer followed by a usage line
(``[coder: N model turns, N runs, tokens, $cost, seconds; work/turns/{turn_id}/transcript.jsonl]``);
a failed turn's error message ends with the same line.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing
from pathlib import Path
from typing import Any, cast

import anyio
from claude_agent_sdk import ClaudeAgentOptions, ClaudeSDKError, Message, ProcessError, ResultError, query

from alphaagent.domain.tools import TurnContext
from alphaagent.domain.turns import Coder
from alphaagent.environments import check_environment
from alphaagent.errors import (
    BudgetExceededError,
    CoderError,
    CoderTimeoutError,
    MaxTurnsError,
    MissingOutputsError,
    ModelApiError,
)
from coder.prompts import max_turns_for, render_prompt, system_prompt_for
from coder.settings import CoderSettings
from coder.tools import ALLOWED_TOOLS, SERVER_NAME, ToolCalls, alphaagent_server
from coder.transcript import Transcript

logger = logging.getLogger(__name__)

CLI_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    # The SDK merges the host's environment into the CLI's: blank what would send traffic anywhere
    # but the model endpoint (telemetry exporters, proxies) or change who we talk to.
    "CLAUDE_CODE_ENABLE_TELEMETRY": "",
    "OTEL_EXPORTER_OTLP_ENDPOINT": "",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "",
    "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "",
    "OTEL_METRICS_EXPORTER": "",
    "OTEL_LOGS_EXPORTER": "",
    "OTEL_TRACES_EXPORTER": "",
    "HTTP_PROXY": "",
    "HTTPS_PROXY": "",
    "http_proxy": "",
    "https_proxy": "",
    "ALL_PROXY": "",
    "ANTHROPIC_AUTH_TOKEN": "",
    "ANTHROPIC_CUSTOM_HEADERS": "",
}
"""Set over the host's environment for the CLI (after the provider's own variables)."""
IN_FLIGHT_WAIT_S = 30.0
"""How long a cut-off turn waits for a tool call still in its thread: a run's timeout is already cut
to the turn's remaining time, so what is left is its kill, the after-run sync and its record."""

MAX_MESSAGE_BYTES = 16 * 2**20
"""The SDK's buffer for one message from the CLI (default 1 MiB, which a long model reply exceeds)."""
"""Set for every CLI this coder starts (on top of the provider's variables)."""


def build_options(
    ctx: TurnContext,
    settings: CoderSettings,
    private_dir: Path,
    transcript: Transcript | None = None,
    deadline: float | None = None,
    calls: ToolCalls | None = None,
) -> ClaudeAgentOptions:
    """The Agent SDK options of one turn. ``private_dir`` (empty, removed by the caller after the
    turn) holds the CLI's ``CLAUDE_CONFIG_DIR`` (``config/``) and working directory (``cwd/``);
    ``deadline`` (``time.monotonic()``) bounds the runs' timeouts by the turn's remaining time;
    ``calls`` counts the tool calls in flight."""
    config_dir, cwd = private_dir / "config", private_dir / "cwd"
    config_dir.mkdir(exist_ok=True)
    cwd.mkdir(exist_ok=True)
    return ClaudeAgentOptions(
        tools=[],
        allowed_tools=list(ALLOWED_TOOLS),
        mcp_servers={SERVER_NAME: alphaagent_server(ctx, deadline, calls)},
        strict_mcp_config=True,
        permission_mode="dontAsk",
        setting_sources=[],
        skills=[],
        system_prompt=system_prompt_for(check_environment(ctx.backend.environments, ctx.spec.environment_id)),
        max_turns=max_turns_for(ctx.spec.constraints),
        max_budget_usd=settings.max_budget_usd,
        model=settings.model,
        cwd=str(cwd),
        env={
            **settings.cli_env(),
            **CLI_ENV,
            "CLAUDE_CONFIG_DIR": str(config_dir),
            # The CLI's caches and MCP logs go to the private directory too, removed after the turn.
            "XDG_CACHE_HOME": str(config_dir / "cache"),
        },
        max_buffer_size=MAX_MESSAGE_BYTES,
        stderr=transcript.stderr_line if transcript is not None else None,
    )


def make_coder(settings: CoderSettings) -> Coder:
    """The model-backed ``Coder``: ``coder(ctx)`` runs the turn's agent loop (see ``run_coder``)."""

    def coder(ctx: TurnContext) -> str:
        return run_coder(ctx, settings)

    return coder


def run_coder(ctx: TurnContext, settings: CoderSettings) -> str:
    """Run the agent loop for ``ctx.spec`` to its end, in the calling thread (which must not be
    running an event loop). Returns the model's summary with the usage line appended.

    The transcript and ``usage.json`` are written to ``work/turns/{turn_id}/`` whatever the outcome.
    Raises a ``CoderError``: ``MaxTurnsError`` (``max_turns_for(constraints)`` used up),
    ``ModelApiError`` (the API kept failing after the CLI's retries), ``CoderTimeoutError``
    (``constraints.turn_timeout_s``, counted from the start of the loop), ``BudgetExceededError``,
    ``MissingOutputsError`` (an output of the spec was not registered), or ``CoderError`` (the CLI
    failed).
    """
    transcript = Transcript(ctx.turn_id, settings.model)
    calls = ToolCalls()
    error: CoderError | None = None
    failure: BaseException | None = None
    summary = ""
    with tempfile.TemporaryDirectory(prefix="alphaagent-coder-", ignore_cleanup_errors=True) as private:
        try:
            summary = anyio.run(_drive, ctx, settings, Path(private), transcript, calls)
        except CoderError as exc:
            error = failure = exc
        except Exception as exc:  # a defect here or in the SDK fails the turn; it must not strand it
            logger.exception("the coder of turn %s failed unexpectedly", ctx.turn_id)
            failure = exc
            error = CoderError(f"the coder failed unexpectedly: {type(exc).__name__}: {exc}"[:2000])
        except BaseException as exc:  # KeyboardInterrupt, SystemExit: recorded, then on their way
            failure = exc
            raise
        finally:
            # A call cut off with the CLI may still be finishing in its thread (a run being killed,
            # its record being written): the turn ends after it, never before its runs' records.
            if not calls.wait_idle(IN_FLIGHT_WAIT_S):
                logger.warning("turn %s ends with a tool call still running", ctx.turn_id)
            transcript.note(
                "turn_end",
                outcome="completed" if failure is None else "failed",
                error=None if failure is None else {"name": type(failure).__name__, "value": str(failure)},
                cli_stderr=list(transcript.stderr),
            )
            usage = transcript.save(ctx)
    line = usage.line(transcript.path)
    ctx.progress(line)
    if error is not None:
        raise error.with_note(line) from None
    return f"{summary}\n\n{line}" if summary else line


async def _drive(
    ctx: TurnContext, settings: CoderSettings, private: Path, transcript: Transcript, calls: ToolCalls
) -> str:
    limit = ctx.spec.constraints.turn_timeout_s
    options = build_options(
        ctx, settings, private, transcript, deadline=time.monotonic() + limit, calls=calls
    )
    prompt = render_prompt(ctx.spec, ctx.fetched)
    max_turns = options.max_turns or 0
    transcript.note(
        "turn_start",
        provider=settings.provider,
        model=settings.model,
        max_turns=max_turns,
        max_budget_usd=settings.max_budget_usd,
        tools=list(ALLOWED_TOOLS),
        system_prompt=options.system_prompt,
        prompt=prompt,
    )
    try:
        with anyio.fail_after(limit):
            # query() is an async generator: aclosing stops the CLI before the config dir goes.
            stream = cast(AsyncGenerator[Message, None], query(prompt=prompt, options=options))
            async with aclosing(stream) as messages:
                async for message in messages:
                    transcript.record(message)
    except TimeoutError:
        raise CoderTimeoutError(
            f"turn timeout: the coder ran past constraints.turn_timeout_s ({limit:g} s)"
        ) from None
    except ResultError as exc:
        raise error_from_result(exc.data, max_turns, transcript.api_retries) from None
    except ProcessError as exc:
        detail = "; ".join(list(transcript.stderr)[-3:]) or str(exc).splitlines()[0]
        raise CoderError(f"the Claude Code CLI failed (exit code {exc.exit_code}): {detail}") from None
    except ClaudeSDKError as exc:
        raise CoderError(f"the Claude Code CLI failed: {str(exc).splitlines()[0]}") from None
    result = transcript.result
    if result is None:
        raise CoderError("the Claude Code CLI ended without a result")
    if result.is_error:
        raise error_from_result(
            {
                "subtype": result.subtype,
                "terminal_reason": result.terminal_reason,
                "api_error_status": result.api_error_status,
                "errors": result.errors,
                "result": result.result,
            },
            max_turns,
            transcript.api_retries,
        )
    _check_outputs(ctx)
    return (result.result or transcript.last_text).strip()


def error_from_result(data: Mapping[str, Any], max_turns: int, retries: int) -> CoderError:
    """The ``CoderError`` for a failed result of the CLI (``ResultError.data`` or the same fields
    of a ``ResultMessage``), with a message that states the reason."""
    subtype, reason = data.get("subtype"), data.get("terminal_reason")
    if subtype == "error_max_turns" or reason == "max_turns":
        return MaxTurnsError(
            f"max turns: the coder used all {max_turns} model turns (2 x constraints.max_runs + 10)"
            " without finishing"
        )
    if subtype == "error_max_budget_usd":
        return BudgetExceededError("budget: the turn spent its model budget (ALPHAAGENT_MAX_BUDGET_USD)")
    status = data.get("api_error_status")
    text = str(data.get("result") or "").strip()
    if isinstance(status, int):
        kind = data.get("api_error_type")
        what = f"HTTP {status}" + (f" {kind}" if isinstance(kind, str) and kind else "")
        detail = text.removeprefix("API Error: ").split(". ", 1)[0]
        tries = f"after {retries} {'retry' if retries == 1 else 'retries'}"
        return ModelApiError(f"model API error: {what} {tries}" + (f": {detail}" if detail else ""))
    errors = [e for e in data.get("errors") or [] if isinstance(e, str) and e.strip()]
    return CoderError(
        f"the coder stopped ({subtype or reason or 'error'}): {'; '.join(errors) or text or 'no detail'}"
    )


def _check_outputs(ctx: TurnContext) -> None:
    """Every output the spec names must be registered by the turn (kind, name, and path if given)."""
    registered = {(a.kind, a.name): a.path for a in ctx.artifacts}
    missing = []
    for output in ctx.spec.outputs:
        path = registered.get((output.kind, output.name))
        if path is None or (output.path is not None and path != output.path):
            missing.append(f"{output.kind} {output.name}" + (f" at {output.path}" if output.path else ""))
    if missing:
        raise MissingOutputsError(f"outputs: the coder finished without registering {', '.join(missing)}")
