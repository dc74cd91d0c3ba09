"""Where the suite's CPU goes, per module: ``make test-profile`` (a pytest plugin, ``-p cpu_profile``).

Each test's cost is the CPU time (user + system, seconds, ``getrusage``) its worker process and the
worker's reaped children used from the test's setup to its teardown, with its wall time. Under
pytest-xdist every worker sends its rows to the controller (``workeroutput``), which prints one table
per module, costliest first, and writes every row to ``test-artifacts/cpu-profile.json``.

A child's CPU counts once the child is reaped (``RUSAGE_CHILDREN``), so a process kept by a module or
session fixture (a warm zygote, the forking CLI runner) is charged to the test during which it ends:
read a module's total, not one test's, for such modules. Collection and session set-up are outside
every test; the table says how much of the whole run's CPU the tests account for.
"""

from __future__ import annotations

import json
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


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class CpuProfile:
    """Collects ``[nodeid, cpu_s, wall_s]`` per test in this process."""

    def __init__(self) -> None:
        self.rows: list[list[Any]] = []
        self.worker_rows: list[list[Any]] = []

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        cpu, wall = _cpu_seconds(), time.monotonic()
        yield
        self.rows.append([item.nodeid, round(_cpu_seconds() - cpu, 3), round(time.monotonic() - wall, 3)])

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:  # an xdist worker: the controller prints everyone's rows
            workeroutput[ROWS_KEY] = json.dumps(self.rows)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        self.worker_rows.extend(json.loads(getattr(node, "workeroutput", {}).get(ROWS_KEY, "[]")))

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
        write(f"CPU per module (user+sys s, incl. reaped children); tests: {in_tests:.0f} CPU-s of the")
        write(f"run's {run_cpu:.0f} (the rest: start-up, collection, session fixtures); rows in {OUTPUT}")
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
