"""Where the suite's CPU goes, per module: ``make test-profile`` (a pytest plugin, ``-p cpu_profile``).

Each test's cost is the CPU time (user + system, seconds) its worker's whole process tree used from
the test's setup to its teardown, with its wall time. The tree is the worker and every live
descendant, read from ``/proc/<pid>/stat`` (each process's own time and its reaped children's): a
process a fixture keeps for the module or the session (a warm zygote, the forking CLI runner, a
decode server) is charged to the tests during which it works, not to the test during which it ends,
as ``getrusage(RUSAGE_CHILDREN)`` alone would. A descendant that is orphaned and reaped by a process
outside the tree takes its time with it (a test's figure can then be low, even negative).

Under pytest-xdist every worker sends its rows and its own figures (CPU before its first test, i.e.
start-up and collection; CPU in tests; CPU after its last; when it finished) to the controller
(``workeroutput``), which prints one table per module, costliest first, one line per worker, and
writes every row to ``test-artifacts/cpu-profile.json``.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

OUTPUT = Path("test-artifacts") / "cpu-profile.json"
ROWS_KEY = "alphaagent_cpu_profile"
TABLE_LENGTH = 40  # modules printed; the JSON file has every test


WORKERS_KEY = "alphaagent_cpu_profile_worker"
_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds() -> float:
    """This process's CPU and its reaped children's (``getrusage``), seconds."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _tree_cpu_seconds() -> float:
    """The CPU of this process and every live descendant, each with its reaped children (seconds):
    fields 14-17 of ``/proc/<pid>/stat`` (utime, stime, cutime, cstime, in clock ticks) of every
    process whose parent chain leads here; this process's own from ``getrusage`` (finer)."""
    parents: dict[int, int] = {}
    times: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                text = stat.read()
        except OSError:  # ended while we looked
            continue
        fields = text[text.rfind(b")") + 2 :].split()  # the name may hold spaces and parentheses
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        times[pid] = sum(int(field) for field in fields[11:15])
    me = os.getpid()
    total = 0
    for pid, ticks in times.items():
        ancestor, hops = parents.get(pid, 0), 0
        while ancestor not in (me, 0, 1) and hops < 64:
            ancestor, hops = parents.get(ancestor, 0), hops + 1
        if ancestor == me and pid != me:
            total += ticks
    return _cpu_seconds() + total / _TICKS


class CpuProfile:
    """Collects ``[nodeid, cpu_s, wall_s]`` per test in this process."""

    def __init__(self) -> None:
        self.rows: list[list[Any]] = []
        self.worker_rows: list[list[Any]] = []
        self.workers: list[dict[str, Any]] = []
        self.first_test_cpu: float | None = None
        self.last_test_cpu = 0.0
        self.in_tests = 0.0
        self.epoch = time.time()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        cpu, wall = _tree_cpu_seconds(), time.monotonic()
        if self.first_test_cpu is None:
            self.first_test_cpu = cpu
        yield
        spent = _tree_cpu_seconds() - cpu
        self.in_tests += spent
        self.last_test_cpu = cpu + spent
        self.rows.append([item.nodeid, round(spent, 3), round(time.monotonic() - wall, 3)])

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:  # an xdist worker: the controller prints everyone's rows
            workeroutput[ROWS_KEY] = json.dumps(self.rows)
            workeroutput[WORKERS_KEY] = json.dumps(
                {
                    "id": session.config.workerinput.get("workerid", "?"),  # type: ignore[attr-defined]
                    "before_tests": round(self.first_test_cpu or 0.0, 1),
                    "in_tests": round(self.in_tests, 1),
                    "between_and_after": round(
                        _tree_cpu_seconds() - (self.first_test_cpu or 0.0) - self.in_tests, 1
                    ),
                    "ended_at": time.time(),
                    "tests": len(self.rows),
                }
            )

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        output = getattr(node, "workeroutput", {})
        self.worker_rows.extend(json.loads(output.get(ROWS_KEY, "[]")))
        if WORKERS_KEY in output:
            self.workers.append(json.loads(output[WORKERS_KEY]))

    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config) -> None:
        if hasattr(config, "workerinput"):
            return
        rows = self.worker_rows or self.rows
        if not rows:
            return
        OUTPUT.parent.mkdir(exist_ok=True)
        OUTPUT.write_text(json.dumps(sorted(rows, key=lambda row: -row[1]), indent=0))
        modules: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
        for nodeid, cpu, wall in rows:
            totals = modules[nodeid.split("::", 1)[0]]
            totals[0] += cpu
            totals[1] += wall
            totals[2] += 1
        run_cpu = _cpu_seconds()  # the controller's and, once reaped, its workers' CPU
        in_tests = sum(totals[0] for totals in modules.values())
        write = terminalreporter.write_line
        write("")
        write(f"CPU per module (user+sys s of the worker's process tree); tests: {in_tests:.0f} CPU-s of")
        write(f"the run's {run_cpu:.0f} (the rest: start-up, collection, session fixtures); rows in {OUTPUT}")
        for worker in sorted(self.workers, key=lambda worker: worker["id"]):
            write(
                f"  {worker['id']}: {worker['tests']} tests; CPU-s before its first test"
                f" {worker['before_tests']}, in tests {worker['in_tests']}, between and after"
                f" {worker['between_and_after']}; ended {worker['ended_at'] - self.epoch:.0f} s after start"
            )
        write(f"{'cpu_s':>8} {'wall_s':>8} {'tests':>6}  module")
        ranked = sorted(modules.items(), key=lambda kv: -kv[1][0])
        for module, (cpu, wall, count) in ranked[:TABLE_LENGTH]:
            write(f"{cpu:8.1f} {wall:8.1f} {int(count):6d}  {module}")
        if len(ranked) > TABLE_LENGTH:
            rest = ranked[TABLE_LENGTH:]
            cpu, wall, count = (sum(totals[i] for _, totals in rest) for i in range(3))
            write(f"{cpu:8.1f} {wall:8.1f} {int(count):6d}  ({len(rest)} more modules)")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(CpuProfile(), "alphaagent-cpu-profile")
