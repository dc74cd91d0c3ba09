"""Set-up shared by the integration modules that run turns through the stack harness
(``test_turn_machine.py`` and the modules that import its ``stack`` fixture)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def env_sandbox() -> Iterator[Any]:
    """The env function's sandbox (the Lambda's: process level, the builtin preload, which the
    analysis steps' pandas uses), one per worker for every module that runs turns: starting it costs
    ~2 CPU-s, each of those modules started its own, and a run sees nothing of the runs before it
    (the sandbox's own tests say so; ``Sandbox.run`` starts another zygote if one was killed). Not
    exclusive: its uid sweep is refused as root. ``tests/conftest.py`` schedules the modules that
    request it one after another, so that one worker runs them all where it can."""
    from alphaagent.sandbox.config import SandboxConfig
    from alphaagent.sandbox.supervisor import Sandbox

    sandbox = Sandbox(SandboxConfig(isolation="process", pool_size=0))
    try:
        # Started here, not by the first run: the start (seconds of wall under load) would count
        # against that turn's 30 s waits alone.
        sandbox.start()
        yield sandbox
    finally:
        sandbox.close()
