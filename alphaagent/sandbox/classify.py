"""What a run's end means: the child's status line parsed and checked against what the kernel
reported, and the ``RunResult`` built from the supervision's outcome (status, reason, error).
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass
from typing import Any

from alphaagent.errors import SandboxError
from alphaagent.models.run import (
    FileChangeReport,
    IsolationReport,
    RunError,
    RunLimits,
    RunResult,
    StateReport,
)
from alphaagent.sandbox.capture import REDACTED


@dataclass
class Outcome:
    pid: int
    cgroup: str | None = None
    stdout: Any = None
    stderr: Any = None
    status_line: dict[str, Any] | None = None
    exit_event: dict[str, Any] | None = None
    timed_out: bool = False
    kill_reason: str | None = None
    hint: str | None = None
    processes_at_kill: int | None = None
    process_limit_hit: bool = False
    oom_kills: int = 0
    disk_over_after_run: bool = False
    stdout_spilled: bool = False
    stderr_spilled: bool = False
    code_started: bool = False
    memory_bound: bool = False


def parse_status(data: bytes) -> dict[str, Any] | None:
    """The child's report, read defensively: the status pipe is writable by the user's code.

    Only the child writes before its ``started`` line, so a ``setup_error`` counts only before it;
    after it, the last well-formed ``done`` line counts. Anything malformed is ignored, so forged or
    broken lines can make a run look failed, never make ``run()`` raise.
    """
    started, report = False, None
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            message = json.loads(line)
        except (
            ValueError,
            RecursionError,
        ):  # the code writes here too: nesting deep enough to exhaust the parser
            continue
        if not isinstance(message, dict):
            continue
        phase = message.get("phase")
        if phase == "started":
            started = True
        elif phase == "setup_error" and not started:
            return {"phase": "setup_error", "message": str(message.get("message"))[:2000]}
        elif phase == "done" and started and well_formed_done(message):
            report = message
    return report


def well_formed_done(message: dict[str, Any]) -> bool:
    error = message.get("error")
    error_ok = error is None or (
        isinstance(error, dict) and all(isinstance(error.get(k), str) for k in ("name", "value", "traceback"))
    )
    numbers_ok = all(isinstance(message.get(k, 0), int | float) for k in ("cpu_s", "maxrss_kb"))
    return (
        isinstance(message.get("exit_code"), int)
        and not isinstance(message.get("exit_code"), bool)
        and error_ok
        and numbers_ok
        and all(isinstance(message.get(k, False), bool) for k in ("memory_error", "interrupted"))
    )


def code_started(data: bytes) -> bool:
    """Whether the child wrote its ``started`` line (the first line of the status pipe, written
    just before the code runs; only the child writes before it)."""
    first = data.split(b"\n", 1)[0]
    try:
        return bool(json.loads(first).get("phase") == "started")
    except (ValueError, AttributeError, RecursionError):
        return False


def unexplained_sigkill(limits: RunLimits, *, memory_bound: bool) -> str:
    """What a SIGKILL with no recorded cause says: none of this run's limits and none of the
    sandbox's own kills (timeout, output, disk, memory cgroup, CPU) sent it."""
    memory = (
        "the memory cgroup counted no OOM kill"
        if memory_bound
        else "no memory cgroup watched the run (the machine's OOM killer may pick a run below"
        f" {limits.memory_mb} MB; see dmesg)"
    )
    return (
        f": not by a limit of this run nor by the sandbox (no timeout, output, disk or CPU limit was"
        f" reached; {memory}); sent by the code itself or from outside the run"
    )


ZYGOTE_DIED_REASON = (
    "the environment's process (its zygote, which starts every run) ended during the run, so the"
    " run's exit status is unknown and it was stopped; its own report was ignored. A run that kills"
    " the zygote, or the host's OOM killer, does this; the next run starts a new one"
)


def contradiction(
    status_line: dict[str, Any], wait_code: int | None, *, zygote_died: bool = False
) -> str | None:
    """Why the child's report cannot be believed, or None when it agrees with the wait status.

    The genuine report is written just before the child exits with the very code it names, so a
    ``done`` report whose ``exit_code`` differs from what ``waitpid`` says was written by the code
    (and the genuine one suppressed); a run whose exit status is unknown (``zygote_died``, or none was
    reported even after the sandbox killed the run) cannot be confirmed at all. A run killed by a
    signal is decided by the signal, whatever was reported.
    """
    if status_line.get("phase") != "done":
        return None
    if wait_code is None:
        why = "the zygote died" if zygote_died else "no exit was reported for it, even after it was killed"
        return f"the run's exit status could not be read ({why}): its own report was ignored"
    reported = status_line.get("exit_code")
    if wait_code >= 0 and reported != wait_code:
        return (
            f"the run's status report (exit {reported}) contradicts its real exit status ({wait_code});"
            " the report was written by the code and is ignored"
        )
    return None


def credentials_refusal(holders: list[dict[str, Any]]) -> str:
    """The one-line refusal of the process level when a run could read a credential (README,
    "What is isolated"): which process holds which variable names (never their values)."""
    first = holders[0]
    others = f" and {len(holders) - 1} other process(es)" if len(holders) > 1 else ""
    return (
        f"process isolation refused: pid {first['pid']} ({first['command']}){others} holds"
        f" {', '.join(first['names'])} in an environment a run of this uid could read, and neither"
        " namespaces nor Landlock are available to hide it; start alphaagent from an environment"
        " without credentials (for example `env -u AWS_SECRET_ACCESS_KEY ...`), or on a kernel that"
        " allows user namespaces or Landlock"
    )


def mib(size: int) -> str:
    return f"{size / 2**20:g} MiB"


def redact(text: str, secrets: tuple[str, ...]) -> str:
    """Replace every secret in ``text`` (an error's value or traceback) with ``[REDACTED]``."""
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return text


def timeout_traceback(interrupted: str, reason: str) -> str:
    """The traceback of a run cut by its timeout: where the code was when the sandbox interrupted
    it, ending in the ``TimeoutError`` the result names. The child is interrupted with SIGINT
    (zygote ``_run_user_code``), so its own traceback ends in ``KeyboardInterrupt``, which is how
    it was stopped, not why: that last line becomes ``TimeoutError: <reason>``. A traceback that
    ends otherwise (the code caught the interrupt and raised something else) keeps its lines, and
    the timeout is said after them. "" stays "" (the code was not running its own lines)."""
    if not interrupted:
        return ""
    lines = interrupted.rstrip("\n").split("\n")
    if lines[-1] == "KeyboardInterrupt" or lines[-1].startswith("KeyboardInterrupt: "):
        lines[-1] = f"TimeoutError: {reason}"
    else:
        lines += ["", f"TimeoutError: {reason}"]
    return "\n".join(lines) + "\n"


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def process_limit_reached(outcome: Outcome, limits: RunLimits) -> bool:
    """Whether the run reached its process limit: a fork refused at its pids cgroup's ``pids.max``
    (counted by the zygote when it reaped the run, before it removed the cgroup; or read by the
    supervisor's kill while the cgroup was there), else, without a cgroup, as many processes as the
    limit found at the kill.

    The zygote's count is what holds under load: a run interrupted at its timeout may exit, and its
    cgroup go, before the supervisor's kill reads anything."""
    refused = (outcome.exit_event or {}).get("refused_forks", 0)
    return (
        outcome.process_limit_hit
        or (isinstance(refused, int) and refused > 0)
        or (outcome.processes_at_kill or 0) >= limits.processes
    )


def build_result(
    *,
    run_id: str,
    outcome: Outcome,
    limits: RunLimits,
    duration_ms: int,
    queued_ms: int,
    changes: FileChangeReport,
    isolation: IsolationReport,
    network: str,
    spill_rel: str,
    secrets: tuple[str, ...],
) -> RunResult:
    status_line = outcome.status_line or {}
    if status_line.get("phase") == "setup_error":
        raise SandboxError(f"run {run_id} could not start: {status_line.get('message')}")
    exit_event = outcome.exit_event or {}
    wait_code = exit_event.get("exit_code")  # negative: killed by that signal
    signum = -wait_code if wait_code is not None and wait_code < 0 else None
    zygote_died = exit_event.get("event") == "zygote_died" and outcome.code_started
    tampered = None if zygote_died else contradiction(status_line, wait_code)
    if tampered is not None or zygote_died:
        status_line = {}  # the report is ignored: the wait status alone decides below
    error_data = status_line.get("error")
    error = RunError(**{k: redact(str(v), secrets) for k, v in error_data.items()}) if error_data else None
    reason: str | None = None
    if outcome.timed_out:
        status = "timeout"
        reason = f"wall-clock limit of {limits.timeout_s:g} s exceeded"
        if process_limit_reached(outcome, limits):
            reason += f"; the process limit ({limits.processes}) was reached"
        if outcome.hint:
            reason += f"; {outcome.hint}"
        where = error.traceback if error and status_line.get("interrupted") else ""
        error = RunError(name="TimeoutError", value=reason, traceback=timeout_traceback(where, reason))
        exit_code = wait_code
    elif outcome.kill_reason == "output_limit":
        status = "killed"
        reason = f"output limit: {outcome.hint}"
        error = RunError(name="OutputLimitExceeded", value=reason, traceback="")
        exit_code = -signal.SIGKILL
    elif zygote_died:
        # The code can do this (at the process level a run of the zygote's uid may signal it where
        # Landlock does not scope signals), and so can the host (its OOM killer): either way the
        # run's own report cannot be confirmed, and the run was killed with it.
        status = "error"
        exit_code = None
        reason = ZYGOTE_DIED_REASON
        error = RunError(name="EnvironmentProcessEnded", value=reason, traceback="")
    elif tampered is not None:
        status = "error"
        exit_code = wait_code
        reason = tampered
        error = RunError(name="StatusReportTampered", value=reason, traceback="")
    elif outcome.kill_reason == "disk_limit":
        # Killed while it ran; or over the budget only by the time it ended (a burst between two
        # polls): it then finished on its own, and its exit status is its own.
        after_run = outcome.disk_over_after_run
        status = "error" if after_run else "killed"
        reason = f"disk limit: {outcome.hint}"
        error = RunError(name="DiskLimitExceeded", value=reason, traceback="")
        exit_code = wait_code if wait_code is not None or after_run else -signal.SIGKILL
    elif outcome.oom_kills:
        status = "killed"
        exit_code = wait_code
        reason = (
            f"memory limit exceeded ({limits.memory_mb} MB for the whole run, its /tmp and /dev/shm"
            f" included): the kernel killed {outcome.oom_kills} of its processes at the memory"
            " cgroup's limit"
        )
        error = RunError(name="MemoryLimitExceeded", value=reason, traceback="")
    elif status_line.get("memory_error") and signum is None:
        status = "killed"
        reason = f"memory limit exceeded ({limits.memory_mb} MB)"
        error = RunError(name="MemoryLimitExceeded", value=reason, traceback=error.traceback if error else "")
        exit_code = wait_code
    elif status_line.get("phase") == "done" and signum is None:
        exit_code = int(status_line.get("exit_code", 0))
        status = "ok" if exit_code == 0 and error is None else "error"
    elif signum is not None:
        status = "killed"
        exit_code = -signum
        if signum in (signal.SIGXCPU,) or (
            signum == signal.SIGKILL and exit_event.get("cpu_s", 0) >= limits.effective_cpu_s()
        ):
            reason = f"CPU time limit exceeded ({limits.effective_cpu_s()} s)"
            name = "CpuLimitExceeded"
        elif not outcome.code_started:
            # Its child died before it ran a line of the code: the platform lost the run.
            raise SandboxError(
                f"run {run_id}: its child was killed by {signal_name(signum)} before the code started"
                " (a platform failure, not the code's; see zygote.log)"
            )
        else:
            reason = f"killed by {signal_name(signum)}"
            if signum in (signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS):
                reason += f" (possibly the memory limit of {limits.memory_mb} MB)"
            elif signum == signal.SIGKILL:
                # Every kill of the sandbox and every limit has a reason of its own above: say so.
                reason += unexplained_sigkill(limits, memory_bound=outcome.memory_bound)
            name = "Killed"
        error = RunError(name=name, value=reason, traceback="")
    elif wait_code is not None:
        status = "error"
        exit_code = wait_code
        reason = "the run exited without reporting (os._exit or a crash)"
    else:
        raise SandboxError(f"run {run_id}: lost track of the child (the zygote died)")
    stdout, stderr = outcome.stdout, outcome.stderr
    # The zygote's wait4 figures (the run and every child it reaped), never the code's own report.
    usage = exit_event if "cpu_s" in exit_event else status_line
    return RunResult(
        run_id=run_id,
        status=status,
        exit_code=exit_code,
        stdout=stdout.text,
        stderr=stderr.text,
        stdout_bytes=stdout.total_bytes,
        stderr_bytes=stderr.total_bytes,
        stdout_truncated=stdout.truncated,
        stderr_truncated=stderr.truncated,
        error=error,
        reason=reason,
        duration_ms=duration_ms,
        queued_ms=queued_ms,
        files_changed=sorted({*changes.created, *changes.modified, *changes.deleted}),
        files=changes,
        limits={
            **limits.model_dump(exclude={"cpu_s", "tmp_mb"}),
            "cpu_s": limits.effective_cpu_s(),
            "tmp_mb": limits.effective_tmp_mb(),
        },
        isolation=isolation,
        network=network,
        non_utf8_output=stdout.replaced or stderr.replaced,
        stdout_path=f"{spill_rel}/stdout.txt" if outcome.stdout_spilled else None,
        stderr_path=f"{spill_rel}/stderr.txt" if outcome.stderr_spilled else None,
        cpu_ms=int(usage["cpu_s"] * 1000) if "cpu_s" in usage else None,
        peak_rss_mb=round(usage["maxrss_kb"] / 1024, 1) if "maxrss_kb" in usage else None,
        state=StateReport.from_child(status_line.get("state")),
    )
