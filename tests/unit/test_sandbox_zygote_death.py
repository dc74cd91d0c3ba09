"""A run during which the environment's process (the zygote) ends gets a result that says so.

Found by a red-team review: a run that SIGKILLed its own zygote (a run of the zygote's uid at the
process level can, where Landlock does not scope signals: kernels before 6.12) got ``status=error``
with no reason. The host can do the same (its OOM killer), so here the test kills the zygote while
the run is inside its code, at both levels.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandboxes import light_at

from alphaagent.models.run import RunLimits
from alphaagent.sandbox.supervisor import Sandbox

WAITS = "import time\nprint('inside', flush=True)\ntime.sleep(60)\nprint('not reached')\n"


@pytest.fixture(params=["namespaces", "process"])
def box(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    with light_at(request.param) as sandbox:
        yield sandbox


def test_a_run_whose_zygote_ends_is_an_error_that_names_it(box: Sandbox, tmp_path: Path) -> None:
    # Given a run inside its code
    zygote = int(box.info["pid"])
    killed: list[int] = []

    def kill_zygote_once(stream: str, data: bytes) -> None:
        if b"inside" in data and not killed:
            os.kill(zygote, signal.SIGKILL)
            killed.append(zygote)

    # When the environment's process ends under it
    result = box.run(WAITS, cwd=tmp_path, limits=RunLimits(timeout_s=30), on_output=kill_zygote_once)

    # Then the run is an error whose reason says what happened, long before its timeout
    assert killed == [zygote]
    assert result.status == "error" and result.exit_code is None, result
    assert result.error is not None and result.error.name == "EnvironmentProcessEnded"
    assert result.reason is not None and "environment's process" in result.reason, result.reason
    assert "not reached" not in result.stdout
    assert result.duration_ms < 25_000
    # And the next run gets a new zygote and runs
    again = box.run("print('next')", cwd=tmp_path, limits=RunLimits(timeout_s=30))
    assert (again.status, again.stdout) == ("ok", "next\n")
    assert int(box.info["pid"]) != zygote
