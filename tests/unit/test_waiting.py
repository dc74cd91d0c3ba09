"""A wait of more than a second for the environment is said (new-user review: a first run's zygote
start was 3-4 s of silence in the live output), on standard error, never in ``--json``'s output."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path

import pytest
from sandboxes import light

from alphaagent.ids import new_ulid
from alphaagent.local.executor import SandboxExecutor
from alphaagent.models.run import RunLimits
from alphaagent.sandbox import waiting
from alphaagent.sandbox.waiting import announced, waits_told_to


def test_a_long_wait_is_told_once_and_a_short_one_never(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(waiting, "WAIT_NOTICE_S", 0.05)
    told: list[str] = []
    arrived = threading.Event()

    def listener(message: str) -> None:
        told.append(message)
        arrived.set()

    with waits_told_to(listener):
        # When a wait lasts until it has been told (it is told while it goes on)
        with announced("starting the environment builtin …"):
            assert arrived.wait(30), "a long wait was never told"
        # And a wait ends before the notice is due
        monkeypatch.setattr(waiting, "WAIT_NOTICE_S", 60.0)
        with announced("never told"):
            pass
    # Then only the long one was told, once
    assert told == ["starting the environment builtin …"]
    # And with nobody listening, a wait starts no timer at all
    before = threading.active_count()
    with announced("nobody listens"):
        assert threading.active_count() == before


def test_a_cold_start_of_an_environment_is_told_with_its_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(waiting, "WAIT_NOTICE_S", 0.0)  # any zygote start takes longer than no time
    told: list[str] = []
    # When the first run of an executor starts its zygote while someone listens
    executor = SandboxExecutor(light())
    try:
        with waits_told_to(told.append):
            result = executor.run(tmp_path, "print(1)", limits=RunLimits(), run_id=new_ulid())
    finally:
        executor.close()
    # Then the start was told, naming the environment
    assert result.status == "ok" and result.environment_start == "cold"
    assert told[0] == "starting the environment builtin …", told


def test_exec_says_it_on_stderr_and_keeps_json_stdout_clean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from alphaagent import cli

    monkeypatch.setattr(waiting, "WAIT_NOTICE_S", 0.0)
    monkeypatch.setattr(cli, "_exec_environment", lambda args, limits: (light(), limits, False))
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"print(6 * 7)\n")))
    monkeypatch.chdir(tmp_path)
    # When exec --json starts a cold environment
    code = cli.main(["exec", "-", "--json"])
    out, err = capsys.readouterr()
    # Then stderr says so, and stdout is the result's JSON alone
    assert code == 0
    assert err.splitlines()[0] == "starting the environment builtin …", err
    assert json.loads(out)["stdout"] == "42\n"
