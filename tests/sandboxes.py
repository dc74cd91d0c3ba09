"""Sandbox configurations for the tests whose subject is not the builtin preload.

A zygote with the builtin preload (numpy, pandas, pyarrow, matplotlib, then ``BUILTIN_WARMUP``)
costs ~2 CPU-s to start and ~70 CPU-ms per run; with no preload ~0.2 CPU-s and ~40 CPU-ms per run
(``bench/zygote_start.py``). A test about capture, limits, isolation or the file report asserts the
same with either, so it uses ``light()``. The tests about the preload itself keep the builtin one:
code that imports the scientific stack (charts, DataFrames, a numpy memory hog), the clone path with
pyarrow's jemalloc thread, the warm-up, the demo, the coder's turns. Those that need only a warm
builtin zygote, not a fresh one, share one per worker and isolation level (``builtin_sandbox``,
``builtin_process_sandbox``: session fixtures of ``tests/conftest.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from alphaagent.api import AlphaAgent
from alphaagent.sandbox.config import SandboxConfig
from alphaagent.sandbox.supervisor import Sandbox


def light(**fields: Any) -> SandboxConfig:
    """A sandbox configuration with nothing preloaded (and so no warm-up), else ``fields``."""
    return SandboxConfig(**{"preload": (), **fields})


def light_agent(home: Path, **kwargs: Any) -> AlphaAgent:
    """An ``AlphaAgent`` on ``home`` whose sandbox preloads nothing (its data directory stays hidden
    from runs as with the default sandbox)."""
    return AlphaAgent(home, sandbox=light(), **kwargs)


@contextlib.contextmanager
def light_at(level: str, **fields: Any) -> Iterator[Sandbox]:
    """A light sandbox at isolation ``level`` ("namespaces" or "process"); the test skips, saying
    why, where the kernel gives no user namespaces for the ``namespaces`` level."""
    isolation = "auto" if level == "namespaces" else "process"
    with Sandbox(light(isolation=isolation, **fields)) as sandbox:
        if sandbox.isolation != level:
            pytest.skip(f"user namespaces unavailable: {sandbox.info.get('isolation_detail')}")
        yield sandbox


LIGHT_ENVIRONMENT = "light"
"""The environment ``register_light`` records: this interpreter, nothing preloaded."""


def register_light(home: Path) -> str:
    """Record environment ``light`` (this interpreter, no preload) in the data directory ``home``
    and return its id, for the command-line tests whose subject is not the builtin preload: a
    command (a fresh process) that runs code starts its environment's zygote, ~2 CPU-s for
    builtin and ~0.2 CPU-s for this one. Written straight to the store, as ``env add`` would after
    its checks (those have tests of their own in test_environments_local.py)."""
    import sys

    from alphaagent.environments import Environment, LocalStart
    from alphaagent.local.store import SqliteStore

    environment = Environment(
        environment_id=LIGHT_ENVIRONMENT,
        description="this interpreter, nothing preloaded (tests)",
        start=LocalStart(python=sys.executable),
    )
    home.mkdir(parents=True, exist_ok=True)
    with SqliteStore(home / "alphaagent.db") as store:
        assert store.add_environment(environment)
    return LIGHT_ENVIRONMENT
