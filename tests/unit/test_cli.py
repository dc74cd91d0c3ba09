"""`alphaagent exec`: exit codes, output forms and bad input (issue 2, CLI and Bad input)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from assertions import assert_status
from cli_runner import run_cli
from sandboxes import register_light


def _exec(*args: str, cwd: Path, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    done = run_cli(["exec", *args], cwd=cwd, input=stdin, timeout=120)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


@pytest.fixture(scope="module")
def light(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """``--env light --home DIR``: an environment that preloads nothing, for the tests whose
    subject is exec's answer, not the builtin preload (each exec starts a zygote: ~0.2 CPU-s, not ~2)."""
    home = tmp_path_factory.mktemp("light") / "home"
    return ["--env", register_light(home), "--home", str(home)]


def test_ok_run_prints_readably_and_exits_0(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(
        "import pandas as pd\nprint(pd.Series([1, 2, 3]).sum())\nopen('out.txt','w').write('x')"
    )
    done = _exec("--workdir", str(tmp_path), "job.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("6\n[ok] exit=0 ")
    assert "created: out.txt" in done.stdout


def test_names_the_code_created_cannot_drive_the_terminal_or_forge_lines(
    tmp_path: Path, light: list[str]
) -> None:
    # Given code that creates files named with a title-setting escape, a forged status line and a
    # right-to-left override (PATH-01: names from code are untrusted text)
    (tmp_path / "job.py").write_text(
        "open('t\\x1b]0;pwned\\x07.txt', 'w').write('x')\n"
        "open('x\\n[ok] exit=0 1 ms.txt', 'w').write('x')\n"
        "open('rtl-\\u202egnp.exe', 'w').write('x')\n"
    )
    # When it runs
    done = _exec("--workdir", str(tmp_path), "job.py", *light, cwd=tmp_path)
    # Then the names are shown escaped: no escape byte, one status line, no override character
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\u202e" not in done.stdout
    assert [line for line in done.stdout.splitlines() if line.startswith("[ok]")] == [
        done.stdout.splitlines()[0]
    ]
    assert "t\\x1b]0;pwned\\x07.txt" in done.stdout and "rtl-\\u202egnp.exe" in done.stdout


def test_json_output_is_the_run_result(tmp_path: Path, light: list[str]) -> None:
    done = _exec("--json", "--workdir", str(tmp_path), "-", *light, cwd=tmp_path, stdin=b"print('hi')\n1/0\n")
    assert done.returncode == 1
    result = json.loads(done.stdout)
    assert_status(result, "error")
    assert result["stdout"] == "hi\n"
    assert result["error"]["name"] == "ZeroDivisionError"
    assert {
        "run_id",
        "exit_code",
        "stdout_bytes",
        "stderr_truncated",
        "duration_ms",
        "files_changed",
        "limits",
    } <= set(result)


def test_timeout_exits_1_and_says_so(tmp_path: Path, light: list[str]) -> None:
    # A run that outlasts the wall-clock limit by waiting, not spinning: the limit is wall-clock, and
    # a busy loop would spend a CPU-s to show the same answer (a spinning run's kill: test_sandbox)
    code = b"import time\ntime.sleep(60)\n"
    done = _exec("--timeout", "1", "--workdir", str(tmp_path), "-", *light, cwd=tmp_path, stdin=code)
    assert done.returncode == 1
    assert "[timeout]" in done.stdout and "wall-clock limit of 1 s exceeded" in done.stdout


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (["-"], b"", "code: must not be empty"),
        (["-"], b"print('caf\xe9')\n", "code: not valid UTF-8"),
        (["missing.py"], None, "missing.py: no such file"),
        (["--workdir", "nowhere", "-"], b"print(1)", "--workdir: nowhere does not exist"),
        (["--workdir", "afile", "-"], b"print(1)", "--workdir: afile is not a directory"),
        (
            ["--timeout", "0", "-"],
            b"print(1)",
            "--timeout: must be a number of seconds > 0 and ≤ 900, got '0'",
        ),
        (
            ["--timeout", "5000", "-"],
            b"print(1)",
            "--timeout: must be a number of seconds > 0 and ≤ 900, got '5000'",
        ),
        (
            ["--memory-mb", "10", "-"],
            b"print(1)",
            "--memory-mb: must be a whole number of MiB from 256 to 10240, got '10'",
        ),
        (["--network", "maybe", "-"], b"print(1)", "--network: must be one of on, off, got 'maybe'"),
        (
            ["--timeout", "soon", "-"],
            b"print(1)",
            "--timeout: must be a number of seconds > 0 and ≤ 900, got 'soon'",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    tmp_path: Path, args: list[str], stdin: bytes | None, message: str
) -> None:
    # Given a directory with one file in it
    (tmp_path / "afile").write_text("x")
    before = sorted(p.name for p in tmp_path.iterdir())
    # When exec is called with bad input
    done = _exec(*args, cwd=tmp_path, stdin=stdin)
    # Then it exits 2 with one line naming the problem, and nothing was written
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == before
