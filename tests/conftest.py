"""Shared test set-up for every test directory."""

from __future__ import annotations

import functools
import gc
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import module_weights
import pytest
import rewrite_once
from after_import import when_imported
from clocks import FakeClock
from moto_account import (
    FAKE_CREDENTIALS,
    MotoAccount,
    remember_response_methods,
    serialise_conditional_writes,
    share_sdk_data,
)


def _serialise_moto_dynamodb() -> None:
    """Make each simulated DynamoDB request atomic, as the real service is.

    moto's DynamoDB backend is not thread-safe: a ``TransactWriteItems`` deep-copies a table while
    another thread's ``PutItem`` changes it ("dictionary changed size during iteration"), so the tests
    that run turns concurrently (three deliveries of one spec, concurrent registrations) failed at
    random. A DynamoDB request calls no other service, so one lock around its dispatch cannot deadlock.
    """
    from moto.dynamodb.responses import DynamoHandler

    if getattr(DynamoHandler.call_action, "_serialised", False):
        return
    lock = threading.RLock()
    original = DynamoHandler.call_action

    @functools.wraps(original)
    def call_action(self: Any) -> Any:
        with lock:
            return original(self)

    call_action._serialised = True  # type: ignore[attr-defined]
    DynamoHandler.call_action = call_action  # type: ignore[method-assign]


def _start_executions_atomically() -> None:
    """Make a simulated ``StartExecution`` atomic, as the real service's is.

    moto's Step Functions parser lists a new execution before it starts it (``exec_status`` still
    None), so a ``DescribeExecution`` or a duplicate ``StartExecution`` of the same name from another
    thread in that window failed inside moto (``'NoneType' object has no attribute 'value'``): seen
    once in test_the_same_spec_delivered_three_times_is_one_turn, whose three deliveries start one
    execution at once. ``start()`` only starts the execution's worker thread, so holding one lock
    across it and the reads cannot deadlock with the worker.
    """
    from moto.stepfunctions.parser.models import StepFunctionsParserBackend

    if getattr(StepFunctionsParserBackend.start_execution, "_serialised", False):
        return
    lock = threading.RLock()
    for name in ("start_execution", "describe_execution"):
        original = getattr(StepFunctionsParserBackend, name)

        def serialised(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            with lock:
                return _original(*args, **kwargs)

        functools.update_wrapper(serialised, original)
        serialised._serialised = True  # type: ignore[attr-defined]
        setattr(StepFunctionsParserBackend, name, serialised)


# The process's patches of moto and botocore, each applied as its module is first imported (by
# whichever test needs it): a worker that runs no AWS test never imports them.
when_imported("moto.dynamodb.responses", _serialise_moto_dynamodb)
# moto's check-then-write of a conditional S3 write, atomic as in S3
when_imported("moto.s3.responses", serialise_conditional_writes)
# moto's listing of a new execution before it has started
when_imported("moto.stepfunctions.parser.models", _start_executions_atomically)
# moto's handler methods, listed once per response class
when_imported("moto.core.responses", remember_response_methods)


def _take_ctrl_c_as_a_terminal_does() -> None:
    """Give SIGINT its default handling when the suite was started with it ignored.

    A shell without job control (a script running ``make test &``, a CI step in the background) starts
    background commands with SIGINT ignored, and an ignored signal stays ignored across ``exec``: every
    CLI process the Ctrl-C tests start inherited it and went on running after their SIGINT. Those tests
    stand for a command in a terminal's foreground, where SIGINT has its default action; a handled
    signal is reset to that default in each child at ``exec``.
    """
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


_take_ctrl_c_as_a_terminal_does()


# The collector's passes over a test process's heap. A worker holds a few million objects of its own
# (the collected tests, moto's and botocore's models, pydantic's validators) and the default
# thresholds (700, 10, 10) walk the older generations over and over: in a whole-suite `perf record`
# the collector (gc_collect_main, visit_decref, visit_reachable) was 6.5% of all the suite's CPU in the
# four workers alone, and a moto module (test_env_function) ran in 20% less CPU with the settings
# below. Larger generations keep the young passes short; what collection imported and built is frozen
# once collected (it lives until the worker ends), so no later pass walks it.
GC_THRESHOLDS = (50_000, 50, 1000)
gc.set_threshold(*GC_THRESHOLDS)


def pytest_collection_finish(session: pytest.Session) -> None:
    gc.collect()
    gc.freeze()


# Every test's new boto3 session would re-parse the SDK's data files.
when_imported("botocore.session", share_sdk_data)


@pytest.fixture(scope="session", autouse=True)
def warm_cli() -> Iterator[Callable[..., Any]]:
    """``cli_runner.run_cli``: the command line forked from a warm helper; the helper (started on
    first use) is stopped when the session ends."""
    from cli_runner import close_helper, run_cli

    yield run_cli
    close_helper()


# -- the builtin sandbox ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def builtin_sandbox() -> Iterator[Any]:
    """The default ``Sandbox`` (``SandboxConfig()``: the builtin preload and warm-up, namespaces where
    the kernel allows them), one per worker: a start costs ~2 CPU-s, and no run changes the zygote it
    is forked from (``Sandbox.run`` starts another if one was killed). For tests that need the real
    preload but not a zygote of their own (tests/sandboxes.py)."""
    from alphaagent.sandbox.config import SandboxConfig
    from alphaagent.sandbox.supervisor import Sandbox

    with Sandbox(SandboxConfig()) as sandbox:
        yield sandbox


@pytest.fixture(scope="session")
def builtin_process_sandbox() -> Iterator[Any]:
    """``builtin_sandbox`` at the Lambda's level of isolation (``isolation="process"``)."""
    from alphaagent.sandbox.config import SandboxConfig
    from alphaagent.sandbox.supervisor import Sandbox

    with Sandbox(SandboxConfig(isolation="process")) as sandbox:
        yield sandbox


# -- the clock ---------------------------------------------------------------------------------------


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """The process's clock (``alphaagent.clock.get_clock``), standing still until the test moves it."""
    from alphaagent import clock

    fake = FakeClock()
    monkeypatch.setattr(clock, "get_clock", lambda: fake)
    return fake


# -- the simulated AWS account (moto) ------------------------------------------------------------------
# One set-up for every test that needs AWS: fake credentials (no profile can leak a real account in),
# a region, and mock_aws around the test. A module picks its region or moto's configuration by
# overriding the ``aws_region`` or ``moto_config`` fixture.


@pytest.fixture
def aws_region() -> str:
    """The region of the test's moto account."""
    return "us-east-1"


@pytest.fixture
def moto_config() -> dict[str, Any] | None:
    """moto's configuration for the test (None: moto's defaults)."""
    return None


@pytest.fixture
def moto(monkeypatch: pytest.MonkeyPatch, aws_region: str, moto_config: Any) -> Iterator[MotoAccount]:
    """A moto account with fake credentials in ``aws_region``, live for the test."""
    from moto import mock_aws

    for name, value in {**FAKE_CREDENTIALS, "AWS_DEFAULT_REGION": aws_region}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with mock_aws(config=moto_config):
        yield MotoAccount(aws_region)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under xdist, the test modules' rewritten assertions are compiled once here, in the controller,
    before the workers start (tests/rewrite_once.py): on a fresh clone each worker compiled them all."""
    rewrite_once.rewrite_before_workers(session.config)


# -- the order of the modules ---------------------------------------------------------------------
# `make test` spreads the tests over two workers (pytest-xdist, --dist worksteal). A worker idle at
# the end can steal only tests not yet started, so one long module scheduled last keeps the other
# worker idle for its whole length. The costliest modules of the last run (their summed durations,
# kept in pytest's cache) therefore go first; a module's tests stay together and in their order,
# so its module-scoped fixtures are set up once per worker as before. A module the cache has no
# figure for (every module, on a fresh clone) weighs what tests/module_weights.json says.
# Modules that request one of _WORKER_SHARED's session fixtures go one after another, as one unit
# weighing their sum: the worker that sets the fixture up (and imports what they all import) then
# runs them all, where each started on a worker of its own before. Modules marked with one of
# _SHARED_MARKERS go together the same way (a shared fixture wins where a module has both).

_MODULE_COSTS_KEY = module_weights.CACHE_KEY
_WORKER_SHARED: tuple[str, ...] = ("env_sandbox",)
"""Session fixtures (one per worker) that several modules need and that cost seconds to set up:
``env_sandbox`` (tests/integration/conftest.py), the env function's sandbox of every module that
runs turns through the stack harness."""
_SHARED_MARKERS: tuple[str, ...] = ("mcp_sdk",)
"""Markers of modules scheduled as one unit because each imports, in the test process, something that
costs seconds once per process: ``mcp_sdk``, the official MCP SDK (``mcp``, ``claude_agent_sdk``,
``coder.agent``/``coder.tools``, ``alphaagent.mcp_server``): ``mcp.types`` builds a pydantic schema
for every MCP type, ~1.7-2.4 CPU-s a process. Spread by cost alone, the modules that import it began
on all four workers (worksteal first hands each worker a contiguous quarter of this order, and
steals from the end of a queue, so a unit stays on the worker that starts it)."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "mcp_sdk: the module imports the MCP SDK in the test process (scheduled with the others that do)",
    )


def _shared_unit(item: pytest.Item) -> str | None:
    """The shared unit ``item``'s module is scheduled in: a shared fixture's, a shared marker's, or None."""
    fixture = next((n for n in _WORKER_SHARED if n in getattr(item, "fixturenames", ())), None)
    if fixture is not None:
        return fixture
    closest = getattr(item, "get_closest_marker", None)
    return next((n for n in _SHARED_MARKERS if closest is not None and closest(n) is not None), None)


def _module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cache = getattr(config, "cache", None)
    cached: dict[str, float] = cache.get(_MODULE_COSTS_KEY, {}) if cache is not None else {}
    costs = {**module_weights.committed(), **cached}
    if not costs:
        return
    first_seen: dict[str, int] = {}
    unit: dict[str, str] = {}  # module -> the unit it is scheduled in (a shared fixture, or itself)
    for index, item in enumerate(items):
        module = _module_of(item.nodeid)
        first_seen.setdefault(module, index)
        shared = _shared_unit(item)
        if shared is not None:
            unit[module] = shared
        unit.setdefault(module, module)
    unit_costs: dict[str, float] = {}
    for module, name in unit.items():
        unit_costs[name] = unit_costs.get(name, 0.0) + costs.get(module, 0.0)
    unit_first_seen = {name: min(first_seen[m] for m in unit if unit[m] == name) for name in unit_costs}

    def key(item: pytest.Item) -> tuple[float, int, float, int]:
        module = _module_of(item.nodeid)
        name = unit[module]
        return (-unit_costs[name], unit_first_seen[name], -costs.get(module, 0.0), first_seen[module])

    # sorted() is stable: within a module the collected order holds.
    items.sort(key=key)


_module_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Sums each module's setup, call and teardown times (under xdist: the controller's reports)."""
    _module_seconds[_module_of(report.nodeid)] = _module_seconds.get(_module_of(report.nodeid), 0.0) + (
        report.duration
    )


def pytest_sessionfinish(session: pytest.Session) -> None:
    cache = getattr(session.config, "cache", None)
    if cache is None or not _module_seconds or hasattr(session.config, "workerinput"):
        return  # an xdist worker: the controller saw every report and writes the figures once
    kept: dict[str, float] = cache.get(_MODULE_COSTS_KEY, {})
    kept.update({module: round(seconds, 2) for module, seconds in _module_seconds.items()})
    cache.set(_MODULE_COSTS_KEY, kept)
