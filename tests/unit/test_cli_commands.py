"""The command line a newcomer expects (issue 14, "The command line"): one data directory, one
identity rule, live output, checks before code, stable dataset copies, `cat -o`, `--version`,
Ctrl-C and exit codes."""

from __future__ import annotations

import contextlib
import io
import json
import os
import pty
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from assertions import assert_status
from cli_runner import run_cli
from sandboxes import light_agent, register_light

from alphaagent.api import AlphaAgent, alphaagent_home
from alphaagent.models.common import ConversationScope, printable_text
from alphaagent.terminal import LIVE_OUTPUT_CAP_BYTES, LiveOutput

ENV_NAMES = ("ALPHAAGENT_HOME", "ALPHAAGENT_USER", "XDG_DATA_HOME")


def _env(**extra: str) -> dict[str, str]:
    """The test's environment without any alphaagent setting or model key, plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ENV_NAMES and not k.startswith(("ANTHROPIC_", "CLAUDE_CODE_"))
    }
    env.update(extra)
    return env


def _cli(
    *args: str, env: dict[str, str], cwd: Path, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    return run_cli(args, env=env, cwd=cwd, text=True, timeout=timeout)


def _spec(conversation: str, *codes: str, **fields: Any) -> dict[str, Any]:
    """A spec without ``user_id``: steps of ``codes`` in ``conversation``."""
    spec: dict[str, Any] = {
        "spec_version": 1,
        "scope": {"conversation_id": conversation},
        "goal": "test the command line",
        "steps": [{"title": f"step {i}", "code": code} for i, code in enumerate(codes, start=1)],
    }
    spec.update(fields)
    return spec


def _write(path: Path, spec: dict[str, Any]) -> Path:
    path.write_text(json.dumps(spec))
    return path


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def empty(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """An empty HOME and an empty working directory elsewhere."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    yield home, cwd


# ----------------------------------------------------------------------------- the data directory


def test_the_data_directory_is_home_then_the_variable_then_the_per_user_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert alphaagent_home() == tmp_path / "h/.local/share/alphaagent"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")  # the XDG specification: ignore it
    assert alphaagent_home() == tmp_path / "h/.local/share/alphaagent"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert alphaagent_home() == tmp_path / "xdg/alphaagent"
    monkeypatch.setenv("ALPHAAGENT_HOME", str(tmp_path / "env"))
    assert alphaagent_home() == tmp_path / "env"
    assert alphaagent_home(tmp_path / "flag") == tmp_path / "flag"
    monkeypatch.chdir(tmp_path)
    assert alphaagent_home("rel") == tmp_path / "rel"  # absolute, so it does not move with the cwd
    assert not (tmp_path / "h").exists() and not (tmp_path / "xdg").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["files", "--conversation", "c1"],
        ["history", "--conversation", "c1"],
        ["artifacts", "--conversation", "c1", "--json"],
        ["sessions", "--conversation", "c1"],
        ["cat", "--conversation", "c1", "reports/x.md"],
        ["export", "--conversation", "c1", "-o", "out.zip"],
    ],
)
def test_a_read_command_in_an_empty_directory_with_an_empty_home_creates_nothing(
    empty: tuple[Path, Path], args: list[str]
) -> None:
    # Given an empty HOME, no ALPHAAGENT_HOME, and an empty working directory
    home, cwd = empty
    # When a read command runs there
    done = _cli(*args, env=_env(HOME=str(home)), cwd=cwd)
    # Then it answers as an empty data directory does (not found, exit 1, one line)
    assert done.returncode == 1, done.stderr
    assert done.stderr == "alphaagent: error: conversation c1 not found\n"
    # And nothing was created: no database, no folder, neither in HOME nor where it ran
    assert _tree(home) == [] and _tree(cwd) == []


def test_help_says_where_the_data_directory_is(empty: tuple[Path, Path], tmp_path: Path) -> None:
    home, cwd = empty
    default = _cli("--help", env=_env(HOME=str(home)), cwd=cwd)
    assert default.returncode == 0
    assert f"data directory: {home / '.local/share/alphaagent'} (the per-user default;" in default.stdout
    moved = _cli("--help", env=_env(HOME=str(home), ALPHAAGENT_HOME=str(tmp_path / "data")), cwd=cwd)
    assert f"data directory: {tmp_path / 'data'} (from $ALPHAAGENT_HOME)\n" in moved.stdout
    assert _tree(home) == [] and _tree(cwd) == []


def test_version_prints_the_package_version(empty: tuple[Path, Path]) -> None:
    from importlib.metadata import version

    home, cwd = empty
    done = _cli("--version", env=_env(HOME=str(home)), cwd=cwd)
    assert done.returncode == 0
    assert done.stdout == f"alphaagent {version('alphaagent')}\n"


# ----------------------------------------------------------------------------- identity


def test_a_spec_without_user_runs_as_alphaagent_user_and_history_finds_it(empty: tuple[Path, Path]) -> None:
    # Given a spec without user_id, whose file input is relative to the spec file, run from elsewhere
    home, cwd = empty
    specs = home / "specs"
    specs.mkdir()
    (specs / "data.csv").write_text("a,b\n1,2\n")
    spec = _spec(
        "c-user",
        "print(open('docs/data.csv').read().splitlines()[1])",
        inputs=[{"kind": "connector", "connector": "file", "request": {"path": "data.csv"}}],
        environment_id=register_light(home / ".local/share/alphaagent"),  # identity, not the preload
    )
    spec_file = _write(specs / "spec-without-user.json", spec)
    env = _env(HOME=str(home), ALPHAAGENT_USER="u", ALPHAAGENT_FILE_ROOTS=str(specs))
    # When `ALPHAAGENT_USER=u alphaagent run spec-without-user.json` runs
    done = _cli("run", str(spec_file), env=env, cwd=cwd)
    assert done.returncode == 0, done.stderr
    # Then `alphaagent history` (same identity rule, no flags) finds the run
    history = _cli("history", "--json", "--conversation", "c-user", env=env, cwd=cwd)
    assert history.returncode == 0, history.stderr
    runs = json.loads(history.stdout)
    assert [(r["user_id"], r["stdout"]) for r in runs] == [("u", "1,2\n")]
    # And another user gets exactly the answer a missing conversation gets
    other = _cli("history", "--conversation", "c-user", "--user", "local", env=env, cwd=cwd)
    assert (other.returncode, other.stderr) == (1, "alphaagent: error: conversation c-user not found\n")
    # And the data is under the per-user default, nothing in the working directory
    assert (home / ".local/share/alphaagent/conversations/c-user/docs/data.csv").is_file()
    assert _tree(cwd) == []


@pytest.mark.parametrize(
    ("flags", "extra_env", "source"),
    [(["--user", "b"], {}, "--user"), ([], {"ALPHAAGENT_USER": "b"}, "$ALPHAAGENT_USER")],
)
def test_a_spec_whose_user_disagrees_with_an_explicit_user_is_refused(
    empty: tuple[Path, Path], flags: list[str], extra_env: dict[str, str], source: str
) -> None:
    # Given a spec of user a
    home, cwd = empty
    spec_file = _write(cwd / "spec.json", _spec("c-a", "print(1)", user_id="a"))
    # When it is run as user b
    done = _cli("run", str(spec_file), *flags, env=_env(HOME=str(home), **extra_env), cwd=cwd)
    # Then one line, exit 2, and nothing written: not even the data directory
    assert done.returncode == 2
    assert (
        done.stderr
        == f"alphaagent: error: user_id: the spec says \"a\" but {source} says 'b'; drop one of them\n"
    )
    assert _tree(home) == [] and _tree(cwd) == ["spec.json"]


def test_a_bad_user_from_the_environment_is_named(empty: tuple[Path, Path]) -> None:
    home, cwd = empty
    done = _cli("files", "--conversation", "c", env=_env(HOME=str(home), ALPHAAGENT_USER="a b"), cwd=cwd)
    assert done.returncode == 2
    assert done.stderr.startswith("alphaagent: error: $ALPHAAGENT_USER: must be 1-128 characters")


# ----------------------------------------------------------------------------- live output


def _read_until(stream: Any, wanted: str, seen: list[str], limit: int = 400) -> bool:
    for _ in range(limit):
        line = stream.readline()
        if not line:
            return False
        seen.append(line)
        if wanted in line:
            return True
    return False


_CLI = [sys.executable, "-m", "alphaagent.cli"]

_CLI_DUMPING = [sys.executable, "-X", "faulthandler", "-m", "alphaagent.cli"]
"""The CLI with faulthandler on: SIGABRT prints every thread's Python stack (``_rest`` on a hang)."""


def _rest(process: subprocess.Popen[str], timeout_s: float = 120) -> tuple[str, str]:
    """The rest of a process's stdout and stderr after ``_read_until``, read through the same
    buffered files (``communicate`` reads the descriptors and would skip what ``readline`` had
    already buffered), each in its own thread so neither pipe can fill up and block the process.

    A process still running after ``timeout_s`` fails the test with its threads' stacks when it
    was started with ``-X faulthandler`` (see ``_CLI_DUMPING``)."""
    import threading

    assert process.stdout is not None and process.stderr is not None
    found: dict[str, str] = {}
    readers = [
        threading.Thread(target=lambda name=name, f=f: found.__setitem__(name, f.read()), daemon=True)
        for name, f in (("out", process.stdout), ("err", process.stderr))
    ]
    for reader in readers:
        reader.start()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        # Still running: SIGABRT makes a CLI started with -X faulthandler print every thread's
        # stack on its stderr before it dies, so the failure says where it was stuck.
        process.send_signal(signal.SIGABRT)
        process.wait(timeout=30)
        for reader in readers:
            reader.join(timeout=30)
        raise AssertionError(
            f"no exit within {timeout_s:g} s; its threads when aborted:\n{found.get('err', '')[-12000:]}"
        ) from None
    for reader in readers:
        reader.join(timeout=timeout_s)
    return found.get("out", ""), found.get("err", "")


def test_run_streams_each_run_output_as_it_is_produced(tmp_path: Path) -> None:
    # Given a step that prints a line, then waits until the test saw that line before it goes on
    home = tmp_path / "data"
    gate = home / "conversations/c-live/work/go"
    code = (
        "import os, sys, time\n"
        "print('first \\x1b]0;pwned\\x07 line', flush=True)\n"
        "sys.stderr.write('warn\\n'); sys.stderr.flush()\n"
        "deadline = time.time() + 60\n"
        "while not os.path.exists('work/go') and time.time() < deadline:\n"
        "    time.sleep(0.05)\n"
        "print('gate seen' if os.path.exists('work/go') else 'gate never opened')\n"
    )
    spec_file = _write(tmp_path / "spec.json", _spec("c-live", code, environment_id=register_light(home)))
    process = subprocess.Popen(
        [sys.executable, "-m", "alphaagent.cli", "run", str(spec_file)],
        env=_env(ALPHAAGENT_HOME=str(home)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: list[str] = []
    try:
        # When the first line arrives on stderr, the run is still going: it waits for the gate
        assert _read_until(process.stderr, "first", seen), seen
        gate.write_text("open")
        _out, err = _rest(process)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    # Then the line came live, made safe (the title escape shown, not obeyed), before the gate opened
    err = "".join(seen) + err
    assert "  | first \\x1b]0;pwned\\x07 line\n" in err and "\x1b" not in err
    assert "  stderr | warn\n" in err
    assert "  | gate seen\n" in err
    assert process.returncode == 0, err
    # And the stored result is the same as without streaming
    with AlphaAgent(home, read_only=True) as agent:
        (run,) = agent.history("local", ConversationScope(conversation_id="c-live"))
    assert run.stdout.startswith("first ") and run.stdout.endswith(" line\ngate seen\n"), run.stdout


def test_exec_streams_output_live_and_keeps_its_format(tmp_path: Path) -> None:
    code = (
        "import os, sys, time\n"
        "print('hello', flush=True)\n"
        "deadline = time.time() + 60\n"
        "while not os.path.exists('go') and time.time() < deadline:\n"
        "    time.sleep(0.05)\n"
        "sys.stderr.write('after the gate\\n')\n"
    )
    job = tmp_path / "job.py"
    job.write_text(code)
    # an environment without the builtin preload: the streaming, not the preload, is the subject
    light = ["--env", register_light(tmp_path / "data"), "--home", str(tmp_path / "data")]
    process = subprocess.Popen(
        [*_CLI, "exec", "--workdir", str(tmp_path), str(job), *light],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    seen: list[str] = []
    try:
        assert _read_until(process.stdout, "hello", seen), seen
        (tmp_path / "go").write_text("")
        rest, err = _rest(process)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    lines = ("".join(seen) + rest).splitlines()
    assert process.returncode == 0, err
    assert lines[:2] == ["hello", "stderr | after the gate"]
    assert lines[2].startswith("[ok] exit=0 ")


def test_live_output_is_safe_whole_and_bounded() -> None:
    # Given a sink writing to a buffer
    out = io.StringIO()
    live = LiveOutput(out, stdout_prefix="| ", stderr_prefix="! ")
    # When output arrives in chunks that split a UTF-8 character, a CRLF and a line
    live("stdout", "caf\u00e9".encode()[:4])
    live("stdout", "caf\u00e9".encode()[4:] + b" ok\r")
    live("stdout", b"\n10%\r100%\n\x1b[2J\xe2\x80\xae")
    live("stderr", b"warn")
    live("stdout", b"end")
    live.end_lines()
    # Then characters stay whole, CRLF is one line end, escapes and controls are shown, not obeyed
    assert out.getvalue() == "| café ok\n| 10%\n| 100%\n| \\x1b[2J\\u202e\n! warn\n| end\n"
    # And at most the cap of a stream is shown, then one line says so
    out = io.StringIO()
    live = LiveOutput(out, stdout_prefix="", stderr_prefix="")
    for _ in range(3):
        live("stdout", b"x" * (LIVE_OUTPUT_CAP_BYTES // 2 + 1))
    live.end_lines()
    text = out.getvalue()
    assert text.count("x") == LIVE_OUTPUT_CAP_BYTES
    assert text.endswith(
        "[live stdout stops after 1 MiB; the run goes on and its result keeps the head and the tail]\n"
    )


def test_printable_text_keeps_lines_and_escapes_the_rest() -> None:
    assert printable_text("a\tb\nc") == "a\tb\nc"
    assert printable_text("\x1b]52;c;ZXZpbA==\x07\r\x9b\u2028") == "\\x1b]52;c;ZXZpbA==\\x07\\r\\x9b\\u2028"


def test_run_says_when_it_waits_for_a_busy_conversation(tmp_path: Path) -> None:
    # Given a conversation whose lease another turn holds
    from alphaagent.local.store import SqliteStore
    from alphaagent.models.common import utcnow

    home = tmp_path / "data"
    with AlphaAgent(home) as agent:
        assert agent.store.acquire_lock("conversations/c-busy", "other-turn", utcnow(), 600)
    spec_file = _write(
        tmp_path / "spec.json", _spec("c-busy", "print('ran')", environment_id=register_light(home))
    )
    # When a turn is run there
    process = subprocess.Popen(
        [sys.executable, "-m", "alphaagent.cli", "run", str(spec_file)],
        env=_env(ALPHAAGENT_HOME=str(home)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: list[str] = []
    try:
        # Then it says that it waits, and for how long at most
        assert _read_until(process.stderr, "is busy", seen), seen
        assert seen[-1] == (
            "conversation c-busy is busy: another turn is running there; waiting for it (at most 600 s)\n"
        )
        # And once the other turn lets go, it runs and says how long it waited
        with SqliteStore(home / "alphaagent.db") as store:
            store.release_lock("conversations/c-busy", "other-turn")
        _out, err = _rest(process)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    assert err.startswith("conversation c-busy is free after ") and "  | ran\n" in err


# ----------------------------------------------------------------------------- checks before code


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"outputs": [{"kind": "chart", "name": "c", "path": "charts/c.csv"}]},
            'outputs[0].path: "charts/c.csv" does not fit kind "chart" (a chart is one of .png, .svg, .jpg,'
            " .jpeg, .html)",
        ),
        (
            {"outputs": [{"kind": "report", "name": "r", "path": "docs/r.md"}]},
            'outputs[0].path: "docs/r.md" must be inside datasets/, charts/, reports/ or work/',
        ),
        (
            {"constraints": {"max_runs": 1}},
            "constraints.max_runs: 1 is fewer than the 2 steps (each step is one run); raise max_runs or drop"
            " steps",
        ),
        ({"inputs": [{"kind": "dataset", "name": "missing"}]}, "inputs[0]: no registered dataset missing"),
        (
            {"inputs": [{"kind": "connector", "connector": "file", "request": {"path": "nope.csv"}}]},
            "inputs[0].request.path: ",
        ),
        ({"environment_id": "nosuch"}, "environment_id: "),
        ({"steps": None}, "steps: this spec has no pinned steps and no model is configured"),
        ({"steps": [{"title": "bad", "code": "print("}]}, "steps[0].code: SyntaxError"),
    ],
)
def test_what_needs_no_code_is_checked_before_any_code(
    tmp_path: Path, fields: dict[str, Any], message: str
) -> None:
    # Given a spec whose first step would leave a trace, with a rule broken that needs no code
    home = tmp_path / "data"
    spec = _spec("c-check", "open('work/ran.txt', 'w').write('x')", "print(2)", **fields)
    spec_file = _write(tmp_path / "spec.json", spec)
    # When it is run
    done = _cli("run", str(spec_file), env=_env(ALPHAAGENT_HOME=str(home)), cwd=tmp_path)
    # Then it is refused in one line naming the field, and nothing was written: not even the
    # data directory or its database (DESIGN: bad input leaves nothing)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"alphaagent: error: {message}"), done.stderr
    assert done.stderr.count("\n") == 1
    assert not home.exists(), _tree(home)


# ----------------------------------------------------------------------------- stable dataset copies


def test_a_dataset_input_has_one_stable_name_replaced_on_each_turn(tmp_path: Path) -> None:
    # Given a dataset registered twice (v1, v2)
    scope = ConversationScope(conversation_id="c-stable")
    make = "open('datasets/sales.csv', 'w').write('n\\n' + '1\\n' * {n})"
    output = [{"kind": "dataset", "name": "sales", "path": "datasets/sales.csv"}]
    read = "print(len(open('docs/sales.csv').read().splitlines()) - 1)"
    with light_agent(tmp_path / "data") as agent:
        for n in (1, 2):
            spec = _spec(scope.conversation_id, make.format(n=n), user_id="me", outputs=output)
            assert_status(agent.run_analysis(spec), "completed")
        # When later turns read it: the latest, then v1 explicitly, then the latest again
        results = []
        for version in (None, 1, None):
            spec = _spec(
                scope.conversation_id,
                read,
                user_id="me",
                inputs=[{"kind": "dataset", "name": "sales", "version": version}],
            )
            results.append(agent.run_analysis(spec))
        runs = agent.history("me", scope)
        files = [f.path for f in agent.files("me", scope, "docs")]
        sidecar = json.loads(agent.read_file("me", scope, "docs/sales.csv.version.json"))
    # Then each turn read the version it asked for under the one name docs/sales.csv
    assert [r.stdout for r in runs[-3:]] == ["2\n", "1\n", "2\n"]
    # And no versioned copy stays behind; the sidecar names the version the copy holds
    assert files == ["docs/sales.csv", "docs/sales.csv.version.json"]
    assert (sidecar["artifact"], sidecar["version"], sidecar["copied_by_turn"]) == (
        "sales",
        2,
        results[-1].turn_id,
    )
    # And each turn's result records the version it was given
    assert [[(i.path, i.artifact, i.version) for i in r.inputs] for r in results] == [
        [("docs/sales.csv", "sales", 2)],
        [("docs/sales.csv", "sales", 1)],
        [("docs/sales.csv", "sales", 2)],
    ]


# ----------------------------------------------------------------------------- cat


def _registered_chart(tmp_path: Path) -> Path:
    home = tmp_path / "data"
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(256))
    code = f"open('charts/c.png', 'wb').write({png!r})\nopen('reports/r.md', 'w').write('# title\\n')"
    outputs = [{"kind": "chart", "name": "c", "path": "charts/c.png"}]
    with light_agent(home) as agent:
        assert_status(agent.run_analysis(_spec("c-cat", code, user_id="local", outputs=outputs)), "completed")
    return home


def _cat_to_terminal(*args: str, home: Path) -> tuple[int, bytes, str]:
    """``alphaagent cat ARGS`` with standard output a terminal (a pty): (exit code, what the
    terminal got, stderr)."""
    controller, terminal = pty.openpty()
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "alphaagent.cli", "cat", *args],
            env=_env(ALPHAAGENT_HOME=str(home)),
            stdout=terminal,
            stderr=subprocess.PIPE,
        )
        os.close(terminal)
        terminal = -1
        shown = b""
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            shown += chunk
        _, err = process.communicate(timeout=120)
    finally:
        os.close(controller)
        if terminal != -1:
            os.close(terminal)
    return process.returncode, shown, err.decode()


def test_cat_refuses_binary_for_a_terminal_and_writes_it_with_o(tmp_path: Path) -> None:
    home = _registered_chart(tmp_path)
    # When a PNG is cat to a terminal: refused in one line that says to use -o, nothing shown
    code, shown, err = _cat_to_terminal("--conversation", "c-cat", "--artifact", "c", home=home)
    assert code == 2
    assert err == (
        "alphaagent: error: cat: c is binary (264 bytes); write it to a file with -o FILE or pipe it"
        " (| less, > file)\n"
    )
    assert shown == b""
    # And text goes to the terminal as before
    code, shown, err = _cat_to_terminal("--conversation", "c-cat", "reports/r.md", home=home)
    assert (code, err) == (0, "")
    assert shown.replace(b"\r\n", b"\n") == b"# title\n"
    # And -o FILE writes the exact bytes, as does a pipe
    out = tmp_path / "c.png"
    done = _cli(
        "cat",
        "--conversation",
        "c-cat",
        "--artifact",
        "c",
        "-o",
        str(out),
        env=_env(ALPHAAGENT_HOME=str(home)),
        cwd=tmp_path,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    piped = run_cli(
        ["cat", "--conversation", "c-cat", "charts/c.png"], env=_env(ALPHAAGENT_HOME=str(home)), timeout=120
    )
    assert piped.returncode == 0 and piped.stdout == out.read_bytes()
    assert out.read_bytes().startswith(b"\x89PNG")
    # And -o into a missing folder is refused before anything is read
    bad = _cli(
        "cat",
        "--conversation",
        "c-cat",
        "charts/c.png",
        "-o",
        str(tmp_path / "no/c.png"),
        env=_env(ALPHAAGENT_HOME=str(home)),
        cwd=tmp_path,
    )
    assert bad.returncode == 2 and "-o: the folder" in bad.stderr


# ----------------------------------------------------------------------------- Ctrl-C and exit codes


def _sleepers(marker: str) -> list[int]:
    """Pids of processes whose command line holds ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
    return found


def _wait_gone(marker: str, timeout_s: float = 20) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := _sleepers(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def test_ctrl_c_ends_the_run_records_the_turn_and_exits_130(tmp_path: Path) -> None:
    # Given a turn whose step starts a long-running child process and says so (in an environment
    # without the builtin preload: Ctrl-C is the subject, not what the zygote imports)
    home = tmp_path / "data"
    light = register_light(home)
    marker = f"{time.monotonic_ns() % 10**9}.25"
    code = (
        "import subprocess, time\n"
        f"subprocess.Popen(['sleep', '{marker}'])\n"
        "print('started', flush=True)\n"
        "time.sleep(600)\n"
    )
    spec_file = _write(
        tmp_path / "spec.json",
        _spec("c-int", code, constraints={"run_timeout_s": 600}, environment_id=light),
    )
    process = subprocess.Popen(
        [*_CLI_DUMPING, "run", str(spec_file)],
        env=_env(ALPHAAGENT_HOME=str(home)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: list[str] = []
    try:
        assert _read_until(process.stderr, "  | started", seen), seen  # the run's line, not the session's
        # When Ctrl-C reaches the command
        process.send_signal(signal.SIGINT)
        _out, err = _rest(process, timeout_s=45)  # an exit takes seconds; fires inside 120 s
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    # Then it exits 130 with one line, and no process of the run is left
    assert process.returncode == 130, err
    assert err.endswith("alphaagent: interrupted\n") and "Traceback" not in err
    assert _wait_gone(marker) == []
    # And the turn is recorded as cancelled, and the lease is released: the next turn starts at once
    with AlphaAgent(home, read_only=True) as agent:
        (turn,) = agent.turns("local", ConversationScope(conversation_id="c-int"))
    assert_status(turn, "failed")
    assert turn.result is not None and turn.result.error is not None
    assert turn.result.error.name == "TurnCancelled"
    again = _cli(
        "run",
        str(_write(tmp_path / "next.json", _spec("c-int", "print('next')", environment_id=light))),
        env=_env(ALPHAAGENT_HOME=str(home), ALPHAAGENT_LOCK_WAIT_S="0.5"),
        cwd=tmp_path,
    )
    assert again.returncode == 0, again.stderr
    assert "busy" not in again.stderr


def test_ctrl_c_during_exec_kills_the_run_and_exits_130(tmp_path: Path) -> None:
    marker = f"{time.monotonic_ns() % 10**9}.75"
    code = f"import subprocess, time\nsubprocess.Popen(['sleep', '{marker}'])\nprint('started', flush=True)\ntime.sleep(600)\n"
    (tmp_path / "job.py").write_text(code)
    home = tmp_path / "data"
    light = register_light(home)  # no builtin preload: Ctrl-C is the subject, not the zygote's imports
    process = subprocess.Popen(
        [
            *_CLI_DUMPING,
            "exec",
            "--timeout",
            "600",
            "--env",
            light,
            "--workdir",
            str(tmp_path),
            str(tmp_path / "job.py"),
        ],
        env=_env(ALPHAAGENT_HOME=str(home)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: list[str] = []
    try:
        assert _read_until(process.stdout, "started", seen), seen
        process.send_signal(signal.SIGINT)
        _out, err = _rest(process, timeout_s=45)  # an exit takes seconds; fires inside 120 s
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, err
    assert _wait_gone(marker) == []


def test_a_platform_error_exits_2(tmp_path: Path) -> None:
    # Given a data directory whose database is not a database
    home = tmp_path / "data"
    home.mkdir()
    (home / "alphaagent.db").write_bytes(b"not sqlite" * 100)
    # When a command reads it
    done = _cli("history", "--conversation", "c", env=_env(ALPHAAGENT_HOME=str(home)), cwd=tmp_path)
    # Then one line, exit 2
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("alphaagent: error: StoreError: ") and done.stderr.count("\n") == 1


def test_the_run_budget_still_binds_the_coder(tmp_path: Path) -> None:
    # Given a coder (a spec without steps) that tries a second run on a budget of one
    from alphaagent.domain.tools import TurnContext, run_in_env
    from alphaagent.errors import ToolError

    refused: list[str] = []

    def coder(ctx: TurnContext) -> str:
        run_in_env(ctx, "print(1)")
        try:
            run_in_env(ctx, "print(2)")
        except ToolError as exc:
            refused.append(str(exc))
        return "done"

    spec = _spec("c-budget", "x", user_id="me", constraints={"max_runs": 1})
    del spec["steps"]
    # When the turn runs
    with light_agent(tmp_path / "data", coder=coder) as agent:
        result = agent.run_analysis(spec)
    # Then the second run was refused, naming the budget, and only one ran
    assert_status(result, "completed")
    assert len(result.run_ids) == 1
    assert refused == ["run budget spent: this turn allows 1 runs (constraints.max_runs)"]


def test_a_node_artifact_input_has_one_stable_name_too(tmp_path: Path) -> None:
    # Given node n-1 of a workflow run that registered a dataset
    from alphaagent.models.common import NodeScope

    first = {"workflow_execution_id": "w-stable", "node_id": "n-1"}
    output = [{"kind": "dataset", "name": "table", "path": "datasets/table.csv"}]
    with light_agent(tmp_path / "data") as agent:
        made = agent.run_analysis(
            _spec("unused", "open('datasets/table.csv', 'w').write('a\\n1\\n')", user_id="me", outputs=output)
            | {"scope": first}
        )
        assert_status(made, "completed")
        # When node n-2 takes it as an input
        second = {"workflow_execution_id": "w-stable", "node_id": "n-2"}
        spec = _spec(
            "unused",
            "print(open('docs/n-1/table.csv').read(), end='')",
            user_id="me",
            inputs=[{"kind": "node_artifact", "node_id": "n-1", "artifact": "table"}],
        ) | {"scope": second}
        result = agent.run_analysis(spec)
        scope = NodeScope(**second)
        sidecar = json.loads(agent.read_file("me", scope, "docs/n-1/table.csv.version.json"))
        (run,) = agent.history("me", scope)
    # Then it is copied under the artifact's own name, with its version in the sidecar and the result
    assert_status(result, "completed")
    assert run.stdout == "a\n1\n"
    assert (sidecar["artifact"], sidecar["version"]) == ("table", 1)
    assert [(i.path, i.artifact, i.version) for i in result.inputs] == [("docs/n-1/table.csv", "table", 1)]


def test_a_spec_with_its_own_user_and_no_identity_given_runs_as_that_user_and_says_so(
    empty: tuple[Path, Path],
) -> None:
    home, cwd = empty
    light = register_light(home / ".local/share/alphaagent")  # the identity, not the preload, is the subject
    spec_file = _write(cwd / "spec.json", _spec("c-own", "print(1)", user_id="alice", environment_id=light))
    done = _cli("run", str(spec_file), env=_env(HOME=str(home)), cwd=cwd)
    assert done.returncode == 0, done.stderr
    assert done.stderr.endswith(
        "ran as user 'alice' (the spec's user_id); read its results with --user alice\n"
    )
    found = _cli(
        "history", "--json", "--user", "alice", "--conversation", "c-own", env=_env(HOME=str(home)), cwd=cwd
    )
    assert found.returncode == 0 and len(json.loads(found.stdout)) == 1


def test_history_shows_the_names_the_session_state_did_not_keep(tmp_path: Path) -> None:
    # Given a turn whose step leaves a lock beside a number
    home = tmp_path / "data"
    light = register_light(home)  # the state's report is the subject, not the builtin preload
    spec_file = _write(
        tmp_path / "spec.json",
        _spec("c-state", "import threading\nlock = threading.Lock()\nn = 1", environment_id=light),
    )
    env = _env(ALPHAAGENT_HOME=str(home))
    assert _cli("run", str(spec_file), env=env, cwd=tmp_path).returncode == 0
    # When its history is read, as text and as JSON
    text = _cli("history", "--conversation", "c-state", env=env, cwd=tmp_path)
    data = _cli("history", "--conversation", "c-state", "--json", env=env, cwd=tmp_path)
    # Then both name the lock as not kept, with the reason, as the run result did
    [state_line] = [line for line in text.stdout.splitlines() if line.startswith("  # state:")]
    assert "not kept: lock (a lock or event (TypeError:" in state_line, text.stdout
    [run] = json.loads(data.stdout)
    assert set(run["state"]["skipped"]) == {"lock"} and "n" in run["state"]["saved"]
    assert run["environment_id"] == light
