"""The warm command line of the tests (``tests/cli_runner.py``) answers exactly as a fresh process."""

from __future__ import annotations

import os
import re
import resource
import subprocess
from pathlib import Path

import pytest
from cli_runner import command, run_cli
from sandboxes import register_light


def _fresh(args: list[str], **options: object) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(command(args), capture_output=True, check=False, **options)  # type: ignore[call-overload]


def test_a_warm_call_answers_as_a_fresh_process(tmp_path: Path) -> None:
    # Given an environment unlike the test's (its own data directory, user and an unset variable),
    # a working directory of its own and a job found relative to it
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALPHAAGENT_")}
    env.update(ALPHAAGENT_HOME=str(tmp_path / "home"), ALPHAAGENT_USER="warm-user")
    (tmp_path / "job.py").write_text("import os, sys\nprint(os.getcwd())\nsys.exit(3)\n")
    # The code runs in an environment without the builtin preload: the runner, not the zygote's
    # imports, is what this compares (four zygotes of ~2 CPU-s each otherwise)
    light = register_light(tmp_path / "home")
    calls: list[tuple[list[str], dict[str, object]]] = [
        (["--help"], {}),  # names the data directory: the environment was replaced
        (["--version"], {}),
        (["files", "--bogus"], {}),  # a usage error: exit 2
        (["files", "--conversation", "c1"], {}),  # not found: exit 1
        (["exec", "job.py", "--workdir", ".", "--env", light], {}),  # relative to cwd; the code's exit 3
        (["exec", "-", "--env", light], {"input": b"print(input())\n"}),
        (["--json", "files", "--conversation", "bad id!"], {"stdin": subprocess.DEVNULL}),
    ]
    for args, options in calls:
        # When it runs warm and fresh
        warm = run_cli(args, env=env, cwd=tmp_path, **options)  # type: ignore[arg-type]
        fresh = _fresh(args, env=env, cwd=tmp_path, **options)
        # Then the exit code and both outputs are the same, byte for byte (timings aside)
        assert warm.returncode == fresh.returncode, (args, warm, fresh)
        assert _untimed(warm.stdout) == _untimed(fresh.stdout), (args, warm.stdout, fresh.stdout)
        assert _unannounced(warm.stderr) == _unannounced(fresh.stderr), (args, warm.stderr, fresh.stderr)
    assert b"warm-user" not in run_cli(["--help"], env=env).stdout
    assert str(tmp_path / "home").encode() in run_cli(["--help"], env=env).stdout


def _unannounced(err: bytes) -> bytes:
    # A zygote start that takes more than a second (a loaded machine) is told on stderr
    # ("starting the environment light …", alphaagent/sandbox/waiting.py), by either call or both.
    return re.sub(rb"(?m)^starting the environment \S+ \xe2\x80\xa6\r?\n?", b"", err)


def _untimed(out: bytes) -> bytes:
    # The status line of `exec` says how long the run took ("[error] exit=3 179 ms, ...").
    return re.sub(rb"\d+ ms", b"N ms", out)


def test_a_warm_call_that_runs_too_long_is_killed_as_subprocess_run_does(tmp_path: Path) -> None:
    # In an environment without the builtin preload: its zygote is up well inside the 2 s, so the
    # call is killed while the code runs (a builtin zygote's start, ~2 CPU-s, would be cut short)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALPHAAGENT_")}
    env["ALPHAAGENT_HOME"] = str(tmp_path / "home")
    light = register_light(tmp_path / "home")
    with pytest.raises(subprocess.TimeoutExpired):
        run_cli(
            ["exec", "-", "--timeout", "60", "--env", light],
            input=b"import time\ntime.sleep(60)\n",
            env=env,
            cwd=tmp_path,
            timeout=2,
        )


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def test_the_fresh_switch_runs_a_real_process(monkeypatch: pytest.MonkeyPatch) -> None:
    # A warm call is a child of the helper, reaped there; a fresh one is this process's child.
    run_cli(["--version"])  # the helper is started
    before = _children_cpu_s()
    assert run_cli(["--version"]).returncode == 0
    warm_cost = _children_cpu_s() - before
    monkeypatch.setenv("ALPHAAGENT_TEST_FRESH_CLI", "1")
    before = _children_cpu_s()
    assert run_cli(["--version"]).returncode == 0
    assert (warm_cost, _children_cpu_s() - before > 0) == (0, True)
