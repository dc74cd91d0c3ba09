"""Benchmark of whole turns on the local backend: the demo spec end to end, and 20 conversations at once.

Prints, as Markdown tables (or one JSON object with ``--json``):

- the end-to-end latency p50/p95 of the demo spec ``examples/penguins/turn1.json`` (three pinned steps:
  aggregate, chart, report): **cold**, as ``python -m alphaagent.cli run`` in a subprocess with a fresh
  ``ALPHAAGENT_HOME`` (interpreter start, imports, zygote start, the three steps, zygote stop), and
  **warm**, through one long-lived ``AlphaAgent`` whose zygote is already running, in a fresh
  conversation each time; and where the time of a turn goes, from the timestamps of its progress lines;
- concurrency: ``CONVERSATIONS`` turns of a 3-step spec (write a CSV of ``ROWS`` rows carrying the
  conversation's marker, aggregate it with pandas into a dataset, write a report; both registered),
  submitted at the same instant from one thread each against ONE ``AlphaAgent``: wall time, throughput,
  turn latency, failures, and a cross-talk check of every conversation's files, artifacts and runs;
- the concurrency table (issue 11, item 4): for ``TABLE_CONVERSATIONS`` (1, 5, 20, 40) conversations
  at once, the same 3-step turns at the ``namespaces`` level and at the ``process`` level
  (``SandboxConfig(isolation="process")``), one warm ``AlphaAgent`` per level, the levels alternated
  within each row: turns/s side by side, and each run's wait for a spare (``queued_ms``) apart from
  its run time (``duration_ms``) and from the step's whole wall time;
- the machine and the sandbox isolation level in force.

Usage, from the repository root::

    .venv/bin/python bench/turn.py [--quick] [--json] [--table-only] [--with-helper]

``--quick`` runs fewer turns (a CI smoke run); the figures are then noisier. ``--table-only`` runs
the concurrency table alone. ``--with-helper`` adds a third level to the table: ``namespaces`` with
``SandboxConfig(clone_spares=False)`` (each spare made through a helper that unshares, the path before
spares were cloned), measured in the same run for a before/after. Progress goes to stderr.
Exit status 1 when a turn failed or the cross-talk check failed (those are correctness, not noise);
slow figures never fail the run.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import math
import os
import re
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import psutil  # noqa: E402
from machine import machine  # noqa: E402

from alphaagent.api import AlphaAgent  # noqa: E402
from alphaagent.connectors.file import EXAMPLES_DIR  # noqa: E402
from alphaagent.domain.backend import ConnectorSettings  # noqa: E402
from alphaagent.errors import AlphaAgentError  # noqa: E402
from alphaagent.models.common import ConversationScope  # noqa: E402
from alphaagent.models.run import RunResult  # noqa: E402
from alphaagent.sandbox.config import SandboxConfig  # noqa: E402

DEMO_SPEC = EXAMPLES_DIR / "penguins" / "turn1.json"
USER = "bench"

CONVERSATIONS = 20
TABLE_CONVERSATIONS = (1, 5, 20, 40)
TABLE_LEVELS = ("namespaces", "process")
HELPER_LEVEL = "namespaces-helper"
"""``--with-helper``: the namespaces level with its spares made through a helper (``clone_spares``
off), to compare with the default in the same run."""
ROWS = 10_000
GROUPS = 10
EXPECTED_TOTAL = sum(i * 3 % 101 for i in range(ROWS))
"""What step 2 of the concurrency spec must find: the sum of the ``value`` column step 1 writes."""

CLI_TIMEOUT_S = 120.0
MS = 1000.0

_STEP_START = re.compile(r"^step (\d+)/(\d+): ")
_STEP_END = re.compile(r"^step (\d+)/(\d+): (\w+) in (\d+) ms$")


def progress(message: str) -> None:
    """One line of progress on stderr, so ``--json`` output on stdout stays clean."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def p50(samples: list[float]) -> float:
    """The median, NaN when there are no samples."""
    return statistics.median(samples) if samples else math.nan


def p95(samples: list[float]) -> float:
    """The 95th percentile (inclusive method, as ``bench/sandbox.py``), NaN when there are no samples."""
    if len(samples) < 2:
        return samples[0] if samples else math.nan
    return statistics.quantiles(samples, n=20, method="inclusive")[18]


# ---------------------------------------------------------------------------------------- turns


@dataclass
class TurnTiming:
    """One turn's wall time and the phases its progress lines reveal, in milliseconds from submission.

    ``lines`` are (milliseconds since submission, progress message). The phases add up to ``total_ms``
    but for the gaps between one step's end and the next one's start (a few milliseconds):

    - ``to_first_line``: cold, interpreter start, imports and opening the store; every turn, the scope
      lease, the owner claim and the session (the first line is ``session … started``);
    - ``inputs``: the spec copy and the fetch of the inputs (first line to the start of step 1);
    - ``runs``: the runs' own durations as the sandbox reports them (spawn to exit of the child);
    - ``sandbox_overhead``: each step's wall time minus its run's duration (the snapshots of the scope
      before and after, the run record; on a cold start, the zygote start, ~1.5 s);
    - ``registration``: the end of the last step to the last progress line (the outputs registered as
      artifacts: hashed, copied to blobs, profiled, recorded);
    - ``close``: the last progress line to the end of the turn (citations, the turn record and result;
      cold, also the CLI's output, the zygote stop and the interpreter exit).
    """

    total_ms: float
    lines: list[tuple[float, str]] = field(repr=False)
    status: str = "completed"
    error: str | None = None

    def phases(self) -> dict[str, float] | None:
        """The phases above, or None when a started step has no end line (the turn stopped inside it)."""
        starts: dict[int, float] = {}
        ends: dict[int, tuple[float, int]] = {}
        for at_ms, message in self.lines:
            if end := _STEP_END.match(message):
                ends[int(end.group(1))] = (at_ms, int(end.group(4)))
            elif start := _STEP_START.match(message):
                starts[int(start.group(1))] = at_ms
        if not self.lines or not starts or set(starts) != set(ends):
            return None
        first, last = min(starts), max(ends)
        runs = sum(duration for _, duration in ends.values())
        steps_wall = sum(ends[i][0] - starts[i] for i in starts)
        return {
            "to_first_line": self.lines[0][0],
            "inputs": starts[first] - self.lines[0][0],
            "runs": float(runs),
            "sandbox_overhead": steps_wall - runs,
            "registration": self.lines[-1][0] - ends[last][0],
            "close": self.total_ms - self.lines[-1][0],
        }

    def step_spans(self) -> list[tuple[float, float]]:
        """(start, end) of each step, in milliseconds since submission."""
        starts: dict[int, float] = {}
        spans: list[tuple[float, float]] = []
        for at_ms, message in self.lines:
            if end := _STEP_END.match(message):
                if int(end.group(1)) in starts:
                    spans.append((starts[int(end.group(1))], at_ms))
            elif start := _STEP_START.match(message):
                starts[int(start.group(1))] = at_ms
        return spans


PHASES = ("to_first_line", "inputs", "runs", "sandbox_overhead", "registration", "close")


def phase_summary(timings: list[TurnTiming]) -> dict[str, float]:
    """The p50 of each phase over the turns whose phases could be read, in milliseconds."""
    rows = [p for p in (t.phases() for t in timings) if p is not None]
    return {name: round(p50([row[name] for row in rows]), 1) for name in PHASES}


def latency_summary(label: str, timings: list[TurnTiming]) -> dict[str, Any]:
    """p50/p95/min/max of the completed turns in seconds, the failures, and the phases' p50s."""
    ok = [t.total_ms / MS for t in timings if t.status == "completed"]
    failed = [t for t in timings if t.status != "completed"]
    return {
        "mode": label,
        "n": len(timings),
        "p50_s": round(p50(ok), 3),
        "p95_s": round(p95(ok), 3),
        "min_s": round(min(ok, default=math.nan), 3),
        "max_s": round(max(ok, default=math.nan), 3),
        "failures": len(failed),
        "first_failure": failed[0].error if failed else None,
        "phases_p50_ms": phase_summary(timings),
        "samples_s": [round(s, 3) for s in ok],
    }


def fresh_id(prefix: str) -> str:
    """A conversation id nobody has used: ``prefix`` and 8 random hex digits."""
    return f"{prefix}-{secrets.token_hex(4)}"


def demo_spec(conversation_id: str) -> dict[str, Any]:
    """``turn1.json`` for ``USER`` in ``conversation_id``, its file input (relative to the spec
    file) made absolute, as ``alphaagent.demo`` and ``alphaagent run`` do."""
    spec: dict[str, Any] = json.loads(DEMO_SPEC.read_text(encoding="utf-8"))
    spec["user_id"] = USER
    spec["scope"] = {"conversation_id": conversation_id}
    for item in spec.get("inputs", []):
        if item.get("connector") == "file":
            item["request"]["path"] = str(DEMO_SPEC.parent / item["request"]["path"])
    return spec


def timed_turn(agent: AlphaAgent, spec: dict[str, Any]) -> TurnTiming:
    """Run ``spec`` through ``agent`` and time it; a failed turn or a raised error is a failed timing."""
    lines: list[tuple[float, str]] = []
    started = time.perf_counter()

    def on_progress(message: str) -> None:
        lines.append(((time.perf_counter() - started) * MS, message))

    try:
        result = agent.run_analysis(spec, progress=on_progress)
    except AlphaAgentError as exc:
        total = (time.perf_counter() - started) * MS
        return TurnTiming(total, lines, "raised", f"{type(exc).__name__}: {exc}")
    total = (time.perf_counter() - started) * MS
    error = None
    if result.status != "completed":
        error = f"{result.failed_step}: {result.error.name}: {result.error.value}" if result.error else None
    return TurnTiming(total, lines, result.status, error)


# ---------------------------------------------------------------------------------------- demo spec


def cold_cli_turn(conversation_id: str) -> TurnTiming:
    """``python -m alphaagent.cli run examples/penguins/turn1.json`` from the repository root with a
    fresh ``ALPHAAGENT_HOME`` (removed afterwards); its stderr lines are timestamped as they arrive."""
    with tempfile.TemporaryDirectory(prefix="alphaagent-bench-cold-") as home:
        env = {
            **os.environ,
            "ALPHAAGENT_HOME": home,
            "ALPHAAGENT_FILE_ROOTS": str(EXAMPLES_DIR),
        }
        command = [
            sys.executable,
            "-m",
            "alphaagent.cli",
            "run",
            str(DEMO_SPEC.relative_to(REPO_ROOT)),
            "--user",
            USER,
            "--conversation",
            conversation_id,
        ]
        lines: list[tuple[float, str]] = []
        started = time.perf_counter()
        process = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        watchdog = threading.Timer(CLI_TIMEOUT_S, process.kill)
        watchdog.start()
        try:
            assert process.stderr is not None and process.stdout is not None
            for line in process.stderr:
                lines.append(((time.perf_counter() - started) * MS, line.rstrip("\n")))
            stdout = process.stdout.read()
            code = process.wait()
        finally:
            watchdog.cancel()
        total = (time.perf_counter() - started) * MS
    first = stdout.splitlines()[0] if stdout else ""
    if code == 0 and first.endswith(": completed"):
        return TurnTiming(total, lines)
    detail = stdout.strip()[-300:] or (lines[-1][1] if lines else "no output")
    return TurnTiming(total, lines, f"exit {code}", detail)


def bench_cold(n: int) -> list[TurnTiming]:
    """``n`` cold CLI turns, one after the other."""
    timings: list[TurnTiming] = []
    for i in range(n):
        timing = cold_cli_turn(fresh_id("cold"))
        progress(f"cold CLI {i + 1}/{n}: {timing.total_ms / MS:.2f} s, {timing.status}")
        timings.append(timing)
    return timings


def bench_warm(agent: AlphaAgent, n: int) -> tuple[TurnTiming, list[TurnTiming]]:
    """One untimed turn that starts the zygote (returned apart), then ``n`` turns, each in a fresh
    conversation of the same ``agent``."""
    first = timed_turn(agent, demo_spec(fresh_id("warmup")))
    progress(f"warm: first turn (starts the zygote) {first.total_ms / MS:.2f} s, {first.status}")
    timings: list[TurnTiming] = []
    for i in range(n):
        timing = timed_turn(agent, demo_spec(fresh_id("warm")))
        progress(f"warm {i + 1}/{n}: {timing.total_ms / MS:.2f} s, {timing.status}")
        timings.append(timing)
    return first, timings


# ---------------------------------------------------------------------------------------- concurrency

STEP_WRITE = """\
import csv

with open("docs/events.csv", "w", newline="", encoding="utf-8") as out:
    writer = csv.writer(out)
    writer.writerow(["marker", "row", "group", "value"])
    for i in range({rows}):
        writer.writerow(["{marker}", i, f"g{{i % {groups}}}", i * 3 % 101])
print("wrote {rows} rows")
"""

STEP_AGGREGATE = """\
import pandas as pd

events = pd.read_csv("docs/events.csv")
markers = events["marker"].unique().tolist()
if markers != ["{marker}"]:
    raise ValueError(f"foreign markers in docs/events.csv: {{markers[:5]}}")
summary = (
    events.groupby("group")
    .agg(rows=("value", "size"), total=("value", "sum"), mean=("value", "mean"))
    .round(3)
    .reset_index()
)
summary.insert(0, "marker", "{marker}")
summary.to_csv("datasets/summary.csv", index=False)
print(len(events), int(summary["total"].sum()))
"""

STEP_REPORT = """\
import pandas as pd

summary = pd.read_csv("datasets/summary.csv")
lines = [
    "# Events of {marker}",
    "",
    f"{{int(summary['rows'].sum())}} rows in {{len(summary)}} groups; total {{int(summary['total'].sum())}}.",
    "",
    "| group | rows | total | mean |",
    "|---|---|---|---|",
]
lines += [f"| {{r.group}} | {{r.rows}} | {{r.total}} | {{r.mean}} |" for r in summary.itertuples()]
open("reports/report.md", "w", encoding="utf-8").write("\\n".join(lines) + "\\n")
print("wrote reports/report.md")
"""


def concurrency_spec(conversation_id: str, marker: str) -> dict[str, Any]:
    """The 3-step spec of one conversation of the concurrency test; ``marker`` is in every file it writes."""
    values = {"marker": marker, "rows": ROWS, "groups": GROUPS}
    return {
        "spec_version": 1,
        "user_id": USER,
        "scope": {"conversation_id": conversation_id},
        "goal": f"Aggregate the events of {marker} by group and report the totals.",
        "outputs": [
            {"kind": "dataset", "name": "summary", "path": "datasets/summary.csv"},
            {"kind": "report", "name": "report", "path": "reports/report.md"},
        ],
        "steps": [
            {"title": "write the events", "code": STEP_WRITE.format(**values)},
            {"title": "aggregate by group", "code": STEP_AGGREGATE.format(**values)},
            {"title": "write the report", "code": STEP_REPORT.format(**values)},
        ],
        "constraints": {"max_runs": 5, "run_timeout_s": 120, "turn_timeout_s": 300},
    }


@dataclass
class Conversation:
    """One conversation of the concurrency test: its id, its marker, and (once run) its turn."""

    conversation_id: str
    marker: str
    timing: TurnTiming | None = None
    submitted_at: float = 0.0
    turn_id: str | None = None


def run_concurrently(agent: AlphaAgent, conversations: list[Conversation]) -> tuple[float, float]:
    """Submit one turn per conversation from one thread each, all released by one barrier; returns the
    wall time from the first submission to the last turn's end (s) and the system CPU busy share (%)."""
    barrier = threading.Barrier(len(conversations))
    ends: dict[str, float] = {}

    def one(conversation: Conversation) -> None:
        spec = concurrency_spec(conversation.conversation_id, conversation.marker)
        barrier.wait()
        conversation.submitted_at = time.perf_counter()
        conversation.timing = timed_turn(agent, spec)
        ends[conversation.conversation_id] = time.perf_counter()

    threads = [
        threading.Thread(target=one, args=(c,), name=f"turn-{c.conversation_id}") for c in conversations
    ]
    psutil.cpu_percent(interval=None)
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    cpu_busy = psutil.cpu_percent(interval=None)
    wall_s = max(ends.values()) - min(c.submitted_at for c in conversations)
    return wall_s, cpu_busy


def max_in_flight(conversations: list[Conversation]) -> int:
    """The largest number of steps running at the same instant, across all conversations."""
    edges: list[tuple[float, int]] = []
    for c in conversations:
        assert c.timing is not None
        for start, end in c.timing.step_spans():
            edges += [(c.submitted_at * MS + start, 1), (c.submitted_at * MS + end, -1)]
    current = peak = 0
    for _, delta in sorted(edges, key=lambda edge: (edge[0], edge[1])):
        current += delta
        peak = max(peak, current)
    return peak


def check_conversation(agent: AlphaAgent, conversation: Conversation, others: list[str]) -> list[str]:
    """Every way ``conversation`` differs from what its own turn alone would leave; empty when none.

    Its files are exactly the expected set; ``docs/events.csv`` holds ``ROWS`` rows all carrying its
    marker; the dataset's totals add up; no file holds another conversation's marker; its artifacts
    are ``summary`` v1 and ``report`` v1 with its marker in their bytes; its one turn completed and its
    three runs belong to it.
    """
    scope = ConversationScope(conversation_id=conversation.conversation_id)
    problems: list[str] = []
    turns = agent.turns(USER, scope)
    if len(turns) != 1 or turns[0].status != "completed":
        problems.append(f"turns: {[(t.turn_id, t.status) for t in turns]}")
        return problems
    turn_id = turns[0].turn_id
    expected = {
        "docs/events.csv",
        "datasets/summary.csv",
        "reports/report.md",
        f"spec/{turn_id}.json",
        f"work/turns/{turn_id}/result.json",
    }
    paths = {f.path for f in agent.files(USER, scope)}
    if paths != expected:
        problems.append(f"files: extra {sorted(paths - expected)}, missing {sorted(expected - paths)}")
    for path in sorted(paths):
        data = agent.read_file(USER, scope, path)
        foreign = [m for m in others if m.encode() in data]
        if foreign:
            problems.append(f"{path}: holds the marker of {len(foreign)} other conversation(s)")
    if "docs/events.csv" in paths:
        rows = list(csv.DictReader(io.StringIO(agent.read_file(USER, scope, "docs/events.csv").decode())))
        markers = {row["marker"] for row in rows}
        if len(rows) != ROWS or markers != {conversation.marker}:
            problems.append(f"docs/events.csv: {len(rows)} rows, markers {sorted(markers)[:3]}")
    if "datasets/summary.csv" in paths:
        summary = list(
            csv.DictReader(io.StringIO(agent.read_file(USER, scope, "datasets/summary.csv").decode()))
        )
        total = sum(int(row["total"]) for row in summary)
        counted = sum(int(row["rows"]) for row in summary)
        if (counted, total) != (ROWS, EXPECTED_TOTAL):
            problems.append(
                f"datasets/summary.csv: {counted} rows, total {total} (expected {EXPECTED_TOTAL})"
            )
    versions = sorted((a.name, a.version) for a in agent.artifacts(USER, scope))
    if versions != [("report", 1), ("summary", 1)]:
        problems.append(f"artifacts: {versions}")
    for name in ("summary", "report"):
        try:
            _version, blob = agent.artifact(USER, scope, name)
        except AlphaAgentError as exc:
            problems.append(f"artifact {name}: {type(exc).__name__}: {exc}")
            continue
        if conversation.marker.encode() not in blob:
            problems.append(f"artifact {name}: its bytes lack the conversation's marker")
    runs = agent.history(USER, scope)
    if len(runs) != 3 or any(r.turn_id != turn_id or r.scope_key != scope.key for r in runs):
        problems.append(f"runs: {[(r.run_id, r.turn_id, r.scope_key) for r in runs]}")
    return problems


def cross_talk(agent: AlphaAgent, conversations: list[Conversation], warmup_id: str) -> dict[str, Any]:
    """``check_conversation`` for every conversation, plus: the home holds no conversation but these."""
    problems: dict[str, list[str]] = {}
    for conversation in conversations:
        others = [c.marker for c in conversations if c is not conversation]
        found = check_conversation(agent, conversation, others)
        if found:
            problems[conversation.conversation_id] = found
    listed = {p.name for p in (agent.home / "conversations").iterdir()}
    wanted = {c.conversation_id for c in conversations} | {warmup_id}
    if listed != wanted:
        problems["home"] = [
            f"conversation directories: extra {sorted(listed - wanted)}, missing {sorted(wanted - listed)}"
        ]
    return {
        "pass": not problems,
        "conversations_checked": len(conversations),
        "conversations_clean": len(conversations) - len(problems.keys() - {"home"}),
        "problems": problems,
    }


def bench_concurrency(home: Path, n: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """``n`` conversations at once against one fresh ``AlphaAgent`` (its zygote warmed by one untimed
    turn first); returns the figures and the cross-talk check."""
    with AlphaAgent(home, connectors=ConnectorSettings(file_roots=(EXAMPLES_DIR,))) as agent:
        warmup_id = fresh_id("conc-warmup")
        first = timed_turn(agent, concurrency_spec(warmup_id, "m" + secrets.token_hex(8)))
        progress(f"concurrency: warm-up turn {first.total_ms / MS:.2f} s, {first.status}")
        conversations = [
            Conversation(f"conc-{i:02d}-{secrets.token_hex(3)}", "m" + secrets.token_hex(8)) for i in range(n)
        ]
        progress(f"concurrency: {n} turns × 3 steps from {n} threads at once")
        load_before = os.getloadavg()[0]
        wall_s, cpu_busy = run_concurrently(agent, conversations)
        timings = [c.timing for c in conversations if c.timing is not None]
        summary = latency_summary("concurrent", timings)
        progress(f"concurrency: {wall_s:.2f} s wall, {summary['failures']} failures; checking cross-talk")
        check = cross_talk(agent, conversations, warmup_id)
        runs_per_turn = 3
        sessions = [timing.phases() for timing in timings]
        to_session = [p["to_first_line"] for p in sessions if p is not None]
        figures = {
            "conversations": n,
            "steps_per_turn": runs_per_turn,
            "rows_per_csv": ROWS,
            "warmup_turn_s": round(first.total_ms / MS, 3),
            "wall_s": round(wall_s, 3),
            "turns_per_s": round(n / wall_s, 2),
            "runs_per_s": round(n * runs_per_turn / wall_s, 2),
            "latency": summary,
            "to_session_p95_ms": round(p95(to_session), 1),
            "to_session_max_ms": round(max(to_session, default=math.nan), 1),
            "max_steps_in_flight": max_in_flight(conversations),
            "system_cpu_busy_percent": cpu_busy,
            "load_1m_before": round(load_before, 2),
            "load_1m_after": round(os.getloadavg()[0], 2),
        }
    return figures, check


# ---------------------------------------------------------------------------------------- table


@dataclass
class RunLog:
    """Every run result of one agent, with the wall time of its ``executor.run`` call (the whole
    step in the sandbox: snapshots, the wait for a spare, the run), appended from many threads."""

    runs: list[tuple[RunResult, float]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self) -> list[tuple[RunResult, float]]:
        with self.lock:
            taken, self.runs = self.runs, []
        return taken


def record_runs(agent: AlphaAgent) -> RunLog:
    """Wrap the agent's executor so each run's result and step wall time land in a ``RunLog``."""
    log = RunLog()
    executor = agent.executor
    inner = executor.run

    def run(*args: Any, **kwargs: Any) -> RunResult:
        started = time.perf_counter()
        result = inner(*args, **kwargs)
        with log.lock:
            log.runs.append((result, (time.perf_counter() - started) * MS))
        return result

    executor.run = run  # type: ignore[method-assign]
    return log


def level_agent(home: Path, level: str) -> AlphaAgent:
    """An ``AlphaAgent`` whose sandbox runs at ``level`` (``namespaces``: the default ``auto``;
    ``namespaces-helper``: the same without cloned spares)."""
    hidden = (str(Path.home()), str(home.resolve()))
    config = SandboxConfig(hidden_paths=hidden, clone_spares=level != HELPER_LEVEL)
    if level == "process":
        config = SandboxConfig(isolation="process", hidden_paths=hidden)
    return AlphaAgent(home, connectors=ConnectorSettings(file_roots=(EXAMPLES_DIR,)), sandbox=config)


def zygote_cpu_ms(agent: AlphaAgent) -> float | None:
    """CPU time of the agent's zygote and every process it reaped (spares, runs, namespace inits:
    ``utime + stime + cutime + cstime`` of ``/proc/<zygote>/stat``), in milliseconds; None when the
    sandbox is not running. Kernel work done elsewhere (a network namespace's teardown runs in a
    kernel worker) is not in it."""
    sandbox = agent.executor.sandbox()
    pid = sandbox.info.get("pid") if sandbox is not None else None
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return sum(int(x) for x in fields[11:15]) * MS / os.sysconf("SC_CLK_TCK")


def own_cpu_ms() -> float:
    """CPU time of this process (the agents' supervisors, the bench's threads), in milliseconds:
    one level's row runs at a time, so a row's difference is that level's."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return (usage.ru_utime + usage.ru_stime) * MS


def table_row(agent: AlphaAgent, log: RunLog, n: int, level: str) -> dict[str, Any]:
    """``n`` conversations at once on ``agent``: throughput, latency and where the steps' time went."""
    conversations = [
        Conversation(f"t{n}-{level[:2]}-{i:02d}-{secrets.token_hex(3)}", "m" + secrets.token_hex(8))
        for i in range(n)
    ]
    log.take()
    cpu_before = zygote_cpu_ms(agent)
    own_before = own_cpu_ms()
    wall_s, cpu_busy = run_concurrently(agent, conversations)
    own_after = own_cpu_ms()
    time.sleep(0.5)  # the last runs' processes reaped, so their CPU is counted
    cpu_after = zygote_cpu_ms(agent)
    runs = log.take()
    timings = [c.timing for c in conversations if c.timing is not None]
    queued = [float(getattr(r, "queued_ms", 0)) for r, _ in runs]  # 0 before issue 11
    durations = [float(r.duration_ms) for r, _ in runs]
    steps = [wall for _, wall in runs]
    ok = [t.total_ms / MS for t in timings if t.status == "completed"]
    failed = [t for t in timings if t.status != "completed"]
    return {
        "conversations": n,
        "level": level,
        "isolation": runs[0][0].isolation.level if runs else None,
        "wall_s": round(wall_s, 3),
        "turns_per_s": round(n / wall_s, 2),
        "turn_p50_s": round(p50(ok), 3),
        "runs": len(runs),
        "queued_p50_ms": round(p50(queued), 1),
        "queued_p95_ms": round(p95(queued), 1),
        "duration_p50_ms": round(p50(durations), 1),
        "step_p50_ms": round(p50(steps), 1),
        "queued_share_percent": round(100 * sum(queued) / sum(steps), 1) if steps else math.nan,
        "zygote_cpu_ms_per_run": round((cpu_after - cpu_before) / len(runs), 1)
        if runs and cpu_before is not None and cpu_after is not None
        else math.nan,
        "supervisor_cpu_ms_per_run": round((own_after - own_before) / len(runs), 1) if runs else math.nan,
        "failures": len(failed),
        "first_failure": failed[0].error if failed else None,
        "system_cpu_busy_percent": cpu_busy,
    }


def bench_table(
    root: Path, sizes: tuple[int, ...], levels: tuple[str, ...] = TABLE_LEVELS
) -> list[dict[str, Any]]:
    """The concurrency table: every size at both levels, with one warm agent per level for the
    whole table; within a row the level that goes first alternates, so the machine's load (shared,
    and rising over a run) weighs on both alike."""
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        agents: dict[str, tuple[AlphaAgent, RunLog]] = {}
        for level in levels:
            agent = stack.enter_context(level_agent(root / f"table-{level}", level))
            log = record_runs(agent)
            first = timed_turn(
                agent, concurrency_spec(fresh_id(f"warm-{level[:2]}"), "m" + secrets.token_hex(8))
            )
            progress(f"table: {level} warm-up turn {first.total_ms / MS:.2f} s, {first.status}")
            agents[level] = (agent, log)
        for index, n in enumerate(sizes):
            order = levels if index % 2 == 0 else tuple(reversed(levels))
            for level in order:
                agent, log = agents[level]
                row = table_row(agent, log, n, level)
                progress(
                    f"table: N={n} {level}: {row['turns_per_s']} turns/s, queued p50"
                    f" {row['queued_p50_ms']} ms, {row['failures']} failures"
                )
                rows.append(row)
    return rows


def table_markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The concurrency table, the two levels side by side, then the ratio per size."""
    lines = [
        "## Concurrency by level (3-step turns, all submitted at once; queueing apart from run time)",
        "",
        "| N | Level | Turns/s | Turn p50 s | Step p50 ms | Run p50 ms | Queued p50 / p95 ms "
        "| Queued share of step time | Zygote-tree CPU ms per run | Supervisor CPU ms per run | Failures |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    order = [*TABLE_LEVELS, HELPER_LEVEL]
    for row in sorted(rows, key=lambda r: (r["conversations"], order.index(r["level"]))):
        lines.append(
            f"| {row['conversations']} | {row['level']} ({row['isolation']}) | {row['turns_per_s']} "
            f"| {row['turn_p50_s']:.2f} | {_ms(row['step_p50_ms'])} | {_ms(row['duration_p50_ms'])} "
            f"| {_ms(row['queued_p50_ms'])} / {_ms(row['queued_p95_ms'])} | {row['queued_share_percent']} % "
            f"| {_ms(row['zygote_cpu_ms_per_run'])} | {_ms(row['supervisor_cpu_ms_per_run'])} "
            f"| {row['failures']} |"
        )
    for row in rows:
        if row["failures"]:
            lines.append(f"- N={row['conversations']} {row['level']}: first failure `{row['first_failure']}`")
    helper = any(r["level"] == HELPER_LEVEL for r in rows)
    lines += [
        "",
        "| N | namespaces turns/s ÷ process turns/s (target ≥ 0.75) |"
        + (" namespaces-helper ÷ process |" if helper else ""),
        "|---|---|" + ("---|" if helper else ""),
    ]
    by = {(r["conversations"], r["level"]): r for r in rows}
    for n in sorted({r["conversations"] for r in rows}):
        ns, proc, old = by.get((n, "namespaces")), by.get((n, "process")), by.get((n, HELPER_LEVEL))
        if ns and proc and proc["turns_per_s"]:
            line = f"| {n} | {ns['turns_per_s'] / proc['turns_per_s']:.2f} |"
            if helper:
                line += f" {old['turns_per_s'] / proc['turns_per_s']:.2f} |" if old else " |"
            lines.append(line)
    return lines


# ---------------------------------------------------------------------------------------- report


def sandbox_info(agent: AlphaAgent, first_turn: TurnTiming) -> dict[str, Any]:
    """The isolation the warm agent's builtin zygote established: the executor's (already started)
    sandbox, rather than a second zygote started to ask."""
    sandbox = agent.executor.sandbox()
    info = sandbox.info if sandbox is not None else {}
    phases = first_turn.phases()
    return {
        "requested_isolation": agent.executor.config.isolation,
        "isolation": info.get("isolation"),
        "isolation_detail": info.get("isolation_detail"),
        "pool_size": agent.executor.config.pool_size,
        "preload_errors": info.get("preload_errors", {}),
        "first_turn_s": round(first_turn.total_ms / MS, 3),
        "first_turn_sandbox_overhead_ms": round(phases["sandbox_overhead"], 1) if phases else None,
    }


def _ms(value: float | None) -> str:
    return "" if value is None or math.isnan(value) else f"{value:,.0f}"


def machine_markdown(m: dict[str, Any]) -> list[str]:
    """The machine's table."""
    return [
        "## Machine",
        "",
        "| CPU | Cores | Memory | Kernel | Python | Root | Load 1m at start | Load 1m at end |",
        "|---|---|---|---|---|---|---|---|",
        f"| {m['cpu']} | {m['cores']} | {m['memory_gib']} GiB | {m['kernel']} | {m['python']} "
        f"| {'yes' if m['root'] else 'no'} | {m['load_1m_start']} | {m['load_1m_end']} |",
    ]


def markdown(report: dict[str, Any]) -> str:
    """The report as Markdown tables."""
    s, conc, check = report["sandbox"], report["concurrency"], report["cross_talk"]
    lines = [
        *machine_markdown(report["machine"]),
        "",
        "## Sandbox",
        "",
        "| Requested | Isolation in force | Pool | Preload errors | First warm turn (starts the zygote) |",
        "|---|---|---|---|---|",
        f"| {s['requested_isolation']} | {s['isolation']} ({s['isolation_detail']}) | {s['pool_size']} "
        f"| {len(s['preload_errors'])} | {s['first_turn_s']} s, of which sandbox overhead "
        f"{_ms(s['first_turn_sandbox_overhead_ms'])} ms |",
        "",
        "## Demo spec end to end (examples/penguins/turn1.json: 3 steps, 3 artifacts)",
        "",
        "| Mode | N | p50 s | p95 s | min s | max s | Failures |",
        "|---|---|---|---|---|---|---|",
    ]
    latency_rows = [report["cold"], report["warm"], conc["latency"]]
    names = {
        "cold": "cold: `python -m alphaagent.cli run` (fresh home, zygote start)",
        "warm": "warm: one `AlphaAgent`, zygote running, fresh conversation",
        "concurrent": f"concurrent: {conc['conversations']} × 3-step spec at once (below)",
    }
    for row in latency_rows[:2]:
        lines.append(
            f"| {names[row['mode']]} | {row['n']} | {row['p50_s']:.2f} | {row['p95_s']:.2f} "
            f"| {row['min_s']:.2f} | {row['max_s']:.2f} | {row['failures']} |"
        )
    lines += [
        "",
        "## Where a turn's time goes (p50 of each phase, ms; see `TurnTiming` for the phases)",
        "",
        "| Mode | To first progress line | Inputs | Runs (child) | Sandbox overhead | Registration | Close "
        "| Total p50 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in latency_rows:
        ph = row["phases_p50_ms"]
        lines.append(
            f"| {row['mode']} | {_ms(ph['to_first_line'])} | {_ms(ph['inputs'])} | {_ms(ph['runs'])} "
            f"| {_ms(ph['sandbox_overhead'])} | {_ms(ph['registration'])} | {_ms(ph['close'])} "
            f"| {_ms(row['p50_s'] * MS)} |"
        )
    lat = conc["latency"]
    lines += [
        "",
        f"## Concurrency ({conc['conversations']} conversations × {conc['steps_per_turn']} steps, "
        f"{conc['rows_per_csv']:,} rows each, one `AlphaAgent`, all submitted at once)",
        "",
        "| Wall s | Turns/s | Runs/s | Turn p50 s | Turn p95 s | Turn max s | Failures | Max steps in flight "
        "| System CPU busy | Cross-talk |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| {conc['wall_s']:.2f} | {conc['turns_per_s']} | {conc['runs_per_s']} | {lat['p50_s']:.2f} "
        f"| {lat['p95_s']:.2f} | {lat['max_s']:.2f} | {lat['failures']} | {conc['max_steps_in_flight']} "
        f"| {conc['system_cpu_busy_percent']:.0f} % | {'PASS' if check['pass'] else 'FAIL'} |",
        "",
        f"Time to each turn's first progress line (scope lease, owner claim, session; SQLite write lock "
        f"waits show here): p50 {_ms(lat['phases_p50_ms']['to_first_line'])} ms, "
        f"p95 {_ms(conc['to_session_p95_ms'])} ms, max {_ms(conc['to_session_max_ms'])} ms. "
        f"Warm-up turn before the burst: {conc['warmup_turn_s']} s.",
        "",
        "## Cross-talk check",
        "",
        "| Check | Conversations clean | Result |",
        "|---|---|---|",
        "| own marker in every CSV row, no other conversation's marker in any file, exactly the expected "
        "files, totals add up, artifacts `summary` v1 and `report` v1 only, one turn and three runs of its "
        f"own | {check['conversations_clean']}/{check['conversations_checked']} "
        f"| {'PASS' if check['pass'] else 'FAIL'} |",
    ]
    for conversation_id, found in check["problems"].items():
        lines.append(f"- {conversation_id}: {'; '.join(found)}")
    failed = [row for row in latency_rows if row["failures"]]
    if failed:
        lines += ["", "Failed turns:", ""]
        for row in failed:
            lines.append(f"- {row['mode']}: {row['failures']} failed; first: `{row['first_failure']}`")
    lines += ["", *table_markdown(report["table"])]
    lines += ["", f"Benchmark wall time: {report['elapsed_s']} s."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run every measurement and print the report; exit 1 when a turn failed or cross-talk was found."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer turns (CI smoke)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.add_argument("--table-only", action="store_true", help="only the concurrency table by level")
    parser.add_argument(
        "--with-helper",
        action="store_true",
        help="add the namespaces level without cloned spares to the table",
    )
    args = parser.parse_args(argv)
    n_cold, n_warm, n_conversations = (2, 3, 8) if args.quick else (5, 10, CONVERSATIONS)
    sizes = (1, 5) if args.quick else TABLE_CONVERSATIONS
    levels = (*TABLE_LEVELS, HELPER_LEVEL) if args.with_helper else TABLE_LEVELS

    started = time.perf_counter()
    load_at_start = os.getloadavg()[0]
    if args.table_only:
        with tempfile.TemporaryDirectory(prefix="alphaagent-bench-turn-") as root:
            table = bench_table(Path(root), sizes, levels)
        report: dict[str, Any] = {
            "machine": machine(load_at_start),
            "table": table,
            "elapsed_s": round(time.perf_counter() - started, 1),
        }
        progress(f"done in {report['elapsed_s']} s")
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            print("\n".join([*machine_markdown(report["machine"]), "", *table_markdown(table)]))
            print(f"\nBenchmark wall time: {report['elapsed_s']} s.")
        return 0 if not any(row["failures"] for row in table) else 1
    cold = bench_cold(n_cold)
    with tempfile.TemporaryDirectory(prefix="alphaagent-bench-turn-") as root:
        warm_home, concurrent_home = Path(root) / "warm", Path(root) / "concurrent"
        with AlphaAgent(warm_home, connectors=ConnectorSettings(file_roots=(EXAMPLES_DIR,))) as agent:
            first, warm = bench_warm(agent, n_warm)
            sandbox = sandbox_info(agent, first)
        concurrency, check = bench_concurrency(concurrent_home, n_conversations)
        table = bench_table(Path(root), sizes, levels)

    report = {
        "machine": machine(load_at_start),
        "quick": args.quick,
        "sandbox": sandbox,
        "cold": latency_summary("cold", cold),
        "warm": latency_summary("warm", warm),
        "concurrency": concurrency,
        "cross_talk": check,
        "table": table,
        "elapsed_s": round(time.perf_counter() - started, 1),
    }
    progress(f"done in {report['elapsed_s']} s")
    print(json.dumps(report, indent=2) if args.json else markdown(report))
    failures = report["cold"]["failures"] + report["warm"]["failures"] + concurrency["latency"]["failures"]
    failures += sum(row["failures"] for row in table)
    return 0 if failures == 0 and check["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
