"""Local execution environments (issue 12, items 1-2): `alphaagent env add/list/show/remove`, the
registry in the data directory, and the executor's one warm zygote per environment.

The second environment is a virtual environment made here without pip and without the system's
site-packages: it has the standard library only, so `import pandas` fails there while `builtin`
(the interpreter running these tests) has it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import venv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sandboxes import light_agent

from alphaagent.api import AlphaAgent
from alphaagent.cli import main
from alphaagent.environments import Environment, EnvironmentLimits, LambdaStart, StaticRegistry, builtin_local
from alphaagent.errors import EnvStartError
from alphaagent.ids import new_ulid
from alphaagent.local.executor import SandboxExecutor
from alphaagent.models.common import ConversationScope
from alphaagent.models.run import RunLimits, RunOrigin
from alphaagent.sandbox.config import SandboxConfig

USER = "env-tester"

PROBE_STEP = """
import json, sys
try:
    import pandas
    has_pandas = True
except ImportError:
    has_pandas = False
print(json.dumps({"executable": sys.executable, "pandas": has_pandas}))
"""


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A venv's interpreter with the standard library only (no pip: it is made in ~0.1 s)."""
    where = tmp_path_factory.mktemp("bare-venv") / "venv"
    venv.EnvBuilder(with_pip=False, system_site_packages=False, symlinks=True).create(where)
    python = where / "bin" / "python"
    assert subprocess.run([python, "-c", "import pandas"], capture_output=True).returncode != 0
    return str(python)


@pytest.fixture(scope="module")
def old_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A stand-in for a Python 3.10 (this machine has no interpreter older than 3.11): it answers
    the version probe the way a real 3.10 runs it, and anything else fails."""
    script = tmp_path_factory.mktemp("old-python") / "python3.10"
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in *interpreter_probe.py)'
        ' echo \'{"version": [3, 10, 14], "executable": "\'"$0"\'", "packages": []}\'; exit 0;; esac\n'
        "exit 1\n"
    )
    script.chmod(0o755)
    return str(script)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("env-home")


@pytest.fixture(scope="module")
def agent(home: Path, bare_python: str) -> Iterator[AlphaAgent]:
    """The local backend with `bare` registered beside builtin; builtin's zygote preloads nothing
    (tests/sandboxes.py: which interpreter runs a step, and its libraries, do not depend on it)."""
    with light_agent(home) as shared:
        shared.add_environment("bare", bare_python, description="the standard library only")
        yield shared


def _cli(home: Path, *args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = main(["--home", str(home), *args])
    except SystemExit as exited:  # a bad option value is refused by the parser
        code = int(exited.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def _spec(conversation: str, environment_id: str, *codes: str) -> dict[str, Any]:
    return {
        "spec_version": 1,
        "user_id": USER,
        "scope": {"conversation_id": conversation},
        "environment_id": environment_id,
        "goal": "which interpreter runs this",
        "steps": [{"title": f"step {i}", "code": code} for i, code in enumerate(codes, start=1)],
    }


def _reports(agent: AlphaAgent, conversation: str) -> list[dict[str, Any]]:
    runs = agent.history(USER, ConversationScope(conversation_id=conversation))
    return [json.loads(run.stdout) for run in runs]


def _rows(home: Path) -> list[Any]:
    """Every row of the environments table, as stored."""
    with contextlib.closing(sqlite3.connect(home / "alphaagent.db")) as db:
        return db.execute("SELECT * FROM environments ORDER BY environment_id").fetchall()


def _registered_ids(home: Path) -> list[str]:
    with AlphaAgent(home, read_only=True) as reader:
        return [e.environment_id for e in reader.environments.list()]


# ----------------------------------------------------------------------------- runs


def test_a_second_environment_runs_steps_under_its_own_interpreter_while_builtin_keeps_its_libraries(
    agent: AlphaAgent, bare_python: str
) -> None:
    # Given `bare` registered beside builtin (the fixture)
    conversation_bare, conversation_builtin = f"c-{new_ulid().lower()}", f"c-{new_ulid().lower()}"
    # When a spec in each runs the same two steps
    bare = agent.run_analysis(_spec(conversation_bare, "bare", PROBE_STEP, PROBE_STEP))
    builtin = agent.run_analysis(_spec(conversation_builtin, "builtin", PROBE_STEP))
    # Then bare's steps ran under the venv's interpreter, without pandas
    assert bare.status == "completed", bare.error
    assert _reports(agent, conversation_bare) == [{"executable": bare_python, "pandas": False}] * 2
    # And builtin's under alphaagent's own interpreter, with pandas
    assert builtin.status == "completed", builtin.error
    assert _reports(agent, conversation_builtin) == [{"executable": sys.executable, "pandas": True}]


def test_two_environments_running_two_conversations_at_once_never_share_a_zygote(
    agent: AlphaAgent, bare_python: str
) -> None:
    # Given two conversations, one per environment, whose turns start together
    conversations = {"bare": f"c-{new_ulid().lower()}", "builtin": f"c-{new_ulid().lower()}"}
    step = PROBE_STEP + "import time; time.sleep(0.5)\n"
    results: dict[str, Any] = {}
    start = threading.Barrier(2)

    def turn(environment_id: str) -> None:
        start.wait(timeout=30)
        results[environment_id] = agent.run_analysis(
            _spec(conversations[environment_id], environment_id, step)
        )

    threads = [threading.Thread(target=turn, args=(eid,)) for eid in conversations]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    # Then both completed, each under its own environment's interpreter
    assert {eid: r.status for eid, r in results.items()} == {"bare": "completed", "builtin": "completed"}
    assert _reports(agent, conversations["bare"])[0]["executable"] == bare_python
    assert _reports(agent, conversations["builtin"])[0]["executable"] == sys.executable
    # And by two different zygotes, one per environment
    zygotes = agent.executor.zygotes()
    assert set(zygotes) >= {"bare", "builtin"} and zygotes["bare"] != zygotes["builtin"]


def test_the_environment_limits_are_ceilings_a_run_may_lower_but_never_raise(tmp_path: Path) -> None:
    # Given an environment whose runs may take at most 5 s and 512 MiB
    capped = builtin_local().model_copy(
        update={"limits": EnvironmentLimits(timeout_s=5, memory_mb=512), "preload": ()}
    )
    config = SandboxConfig(preload=(), warmup="", pool_size=0)
    executor = SandboxExecutor(config, environments=StaticRegistry([capped]))
    origin = RunOrigin(
        turn_id=new_ulid(), session_id="s", user_id=USER, scope=ConversationScope(conversation_id="c")
    )
    try:
        # When one run asks for more and another for less
        more = executor.run(
            tmp_path,
            "print(1)",
            limits=RunLimits(timeout_s=60, memory_mb=4096),
            run_id=new_ulid(),
            origin=origin,
        )
        less = executor.run(
            tmp_path,
            "print(1)",
            limits=RunLimits(timeout_s=2, memory_mb=300),
            run_id=new_ulid(),
            origin=origin,
        )
    finally:
        executor.close()
    # Then the first was lowered to the ceilings and the second kept its own
    assert (more.limits["timeout_s"], more.limits["memory_mb"]) == (5, 512)
    assert (less.limits["timeout_s"], less.limits["memory_mb"]) == (2, 300)


def test_an_idle_zygote_is_stopped_and_the_next_run_starts_a_new_one(tmp_path: Path) -> None:
    # Given an executor whose zygotes stop after 60 s without a run, on a clock the test moves
    now = [1000.0]
    config = SandboxConfig(preload=(), warmup="", pool_size=0)
    threads_before = set(threading.enumerate())
    executor = SandboxExecutor(config, idle_s=60, clock=lambda: now[0])
    try:
        executor.run(tmp_path, "print(1)", limits=RunLimits(), run_id=new_ulid())
        first = executor.zygotes()["builtin"]
        # When less than the idle time passes, nothing stops; when it has passed, the zygote stops
        now[0] += 59
        assert executor.reap_idle() == [] and executor.zygotes() == {"builtin": first}
        now[0] += 1
        assert executor.reap_idle() == ["builtin"] and executor.zygotes() == {}
        assert not _alive(first)
        # And the next run starts a new zygote
        result = executor.run(tmp_path, "print(2)", limits=RunLimits(), run_id=new_ulid())
        assert result.status == "ok" and result.environment_start == "cold"
        assert executor.zygotes()["builtin"] != first
    finally:
        executor.close()
    # And closing leaves no reaper thread behind
    assert not [t for t in set(threading.enumerate()) - threads_before if t.name == "sandbox-reaper"]


def test_a_run_in_an_environment_removed_meanwhile_is_refused_and_its_zygote_stopped(
    home: Path, bare_python: str, tmp_path: Path
) -> None:
    # Given a registry and an executor in another process's hands (a long-running server)
    with AlphaAgent(tmp_path / "home", sandbox=SandboxConfig(preload=(), warmup="", pool_size=0)) as server:
        server.add_environment("short-lived", bare_python)
        origin = RunOrigin(
            turn_id=new_ulid(),
            session_id="s",
            user_id=USER,
            scope=ConversationScope(conversation_id="c"),
            environment_id="short-lived",
        )
        server.executor.run(tmp_path, "print(1)", limits=RunLimits(), run_id=new_ulid(), origin=origin)
        pid = server.executor.zygotes()["short-lived"]
        # When the environment is removed (here through the same data directory)
        with AlphaAgent(tmp_path / "home") as other:
            other.remove_environment("short-lived")
        # Then the next run of it is refused, naming it, and its zygote is gone
        with pytest.raises(EnvStartError, match="environment 'short-lived' was removed"):
            server.executor.run(tmp_path, "print(1)", limits=RunLimits(), run_id=new_ulid(), origin=origin)
        assert "short-lived" not in server.executor.zygotes() and not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie not yet reaped by its parent counts as gone.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


# ----------------------------------------------------------------------------- the command line


def test_env_list_always_includes_builtin_and_json_objects_carry_environment_id(
    agent: AlphaAgent, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # When the environments are listed as JSON
    code, out, _ = _cli(home, "env", "list", "--json", capsys=capsys)
    listed = json.loads(out)
    # Then builtin comes first, then bare, each with its id and how it starts
    assert code == 0 and [e["environment_id"] for e in listed][:2] == ["builtin", "bare"]
    assert listed[0]["start"] == {"kind": "local", "python": sys.executable}
    assert listed[1]["description"] == "the standard library only"
    # And builtin lists this interpreter's packages for the coder's prompt
    assert any(p.startswith("pandas==") for p in listed[0]["packages"])


def test_env_list_of_a_new_data_directory_is_builtin_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "never-used"
    code, out, _ = _cli(home, "env", "list", "--json", capsys=capsys)
    assert code == 0 and [e["environment_id"] for e in json.loads(out)] == ["builtin"]
    assert not home.exists()


def test_env_show_gives_the_interpreter_preload_limits_and_packages(
    agent: AlphaAgent, home: Path, bare_python: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _cli(home, "env", "show", "bare", "--json", capsys=capsys)
    shown = json.loads(out)
    assert code == 0 and shown["environment_id"] == "bare" and shown["start"]["python"] == bare_python
    assert shown["status"] == "ready" and shown["limits"]["network"] is False
    # A venv without pip has no distributions at all
    assert shown["packages"] == []
    code, out, _ = _cli(home, "env", "show", "builtin", capsys=capsys)
    assert code == 0 and "numpy" in out and "network off" in out


def test_env_add_with_preload_and_network_records_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given this interpreter registered again, preloading json and csv, with network on
    home = tmp_path / "home"
    code, out, err = _cli(
        home,
        "env",
        "add",
        "netted",
        "--python",
        sys.executable,
        "--preload",
        "json, csv",
        "--network",
        "on",
        "--timeout",
        "30",
        "--json",
        capsys=capsys,
    )
    assert code == 0, err
    added = json.loads(out)
    # Then the registry holds exactly that
    assert added["preload"] == ["json", "csv"] and added["limits"]["network"] is True
    assert added["limits"]["timeout_s"] == 30
    assert _registered_ids(home) == ["builtin", "netted"]


def test_removing_an_environment_refuses_its_specs_with_exit_2_naming_the_available_ones(
    tmp_path: Path, bare_python: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given an environment registered, then removed
    home = tmp_path / "home"
    assert _cli(home, "env", "add", "gone", "--python", bare_python, capsys=capsys)[0] == 0
    code, out, _ = _cli(home, "env", "remove", "gone", capsys=capsys)
    assert code == 0 and "removed environment gone" in out
    # When a spec names it
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(_spec("c-gone", "gone", "print(1)")))
    code, _, err = _cli(home, "run", str(spec), capsys=capsys)
    # Then it is refused before anything is written: exit 2, one line naming what is available
    assert code == 2 and err.count("\n") == 1, err
    assert 'environment_id: removed environment "gone" (available: builtin)' in err
    assert not (home / "conversations" / "c-gone").exists()
    # And it is listed no more, but shown as removed
    assert _registered_ids(home) == ["builtin"]
    code, out, _ = _cli(home, "env", "show", "gone", "--json", capsys=capsys)
    assert code == 0 and json.loads(out)["status"] == "removed"
    # And it can be registered again under the same id
    assert _cli(home, "env", "add", "gone", "--python", bare_python, capsys=capsys)[0] == 0


def test_builtin_cannot_be_removed_and_an_unknown_one_is_not_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    code, _, err = _cli(home, "env", "remove", "builtin", capsys=capsys)
    assert code == 2 and err == "alphaagent: error: ID: 'builtin' is built in and cannot be removed\n"
    code, _, err = _cli(home, "env", "remove", "nowhere", capsys=capsys)
    assert code == 1 and err == "alphaagent: error: environment 'nowhere' is not registered\n"
    # Neither refusal made the data directory
    assert not home.exists()


@pytest.fixture(scope="module")
def home_with_taken(tmp_path_factory: pytest.TempPathFactory, bare_python: str) -> Path:
    """A data directory where `taken` (bare's interpreter) was added through the command line, once
    for the module: each case below starts from a copy (an add probes the interpreter twice)."""
    home = tmp_path_factory.mktemp("taken") / "home"
    assert main(["--home", str(home), "env", "add", "taken", "--python", bare_python]) == 0
    return home


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing-interpreter", "--python: {missing}: no such interpreter"),
        ("old-python", "--python: {old} is Python 3.10.14; an environment needs Python >= 3.11"),
        ("not-python", "--python: /bin/false: did not run as a Python interpreter"),
        (
            "preload-fails",
            "--preload: module 'no_such_module_here' does not import under {bare}:"
            " ModuleNotFoundError: No module named 'no_such_module_here'",
        ),
        ("preload-missing-in-env", "--preload: module 'pandas' does not import under {bare}:"),
        ("preload-not-a-name", "--preload: 'os path' is not a module name"),
        (
            "bad-id",
            "ID: must be 1-32 characters of a-z, 0-9 and '-', starting with a letter, got 'Not_Valid'",
        ),
        ("builtin-id", "ID: 'builtin' is built in and always registered"),
        ("taken-id", "ID: 'taken' is registered already (alphaagent env remove taken first)"),
        ("long-description", "--description: must be at most 1000 characters, got 1001 characters"),
        ("timeout-above-lambda", "--timeout: must be a number of seconds > 0 and ≤ 900, got '901'"),
    ],
)
def test_each_bad_env_add_gets_its_one_line_error_and_registers_nothing(
    case: str,
    expected: str,
    tmp_path: Path,
    home_with_taken: Path,
    bare_python: str,
    old_python: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Given a data directory with one environment, `taken`
    home = tmp_path / "home"
    shutil.copytree(home_with_taken, home)
    missing = str(tmp_path / "no" / "python3")
    args = {
        "missing-interpreter": ["fresh", "--python", missing],
        "old-python": ["fresh", "--python", old_python],
        "not-python": ["fresh", "--python", "/bin/false"],
        "preload-fails": ["fresh", "--python", bare_python, "--preload", "json,no_such_module_here"],
        "preload-missing-in-env": ["fresh", "--python", bare_python, "--preload", "pandas"],
        "preload-not-a-name": ["fresh", "--python", bare_python, "--preload", "os path"],
        "bad-id": ["Not_Valid", "--python", bare_python],
        "builtin-id": ["builtin", "--python", bare_python],
        "taken-id": ["taken", "--python", sys.executable],
        "long-description": ["fresh", "--python", bare_python, "--description", "x" * 1001],
        "timeout-above-lambda": ["fresh", "--python", bare_python, "--timeout", "901"],
    }[case]
    before = _rows(home)
    # When it is added
    code, out, err = _cli(home, "env", "add", *args, capsys=capsys)
    # Then one line names the problem, exit 2
    line = expected.format(missing=missing, old=old_python, bare=bare_python)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith(f"alphaagent: error: {line}"), err
    # And nothing was registered or changed
    assert _rows(home) == before and _registered_ids(home) == ["builtin", "taken"]


def test_an_environment_that_runs_on_lambda_is_not_run_locally(tmp_path: Path) -> None:
    # Given a registry holding an AWS environment
    remote = Environment(environment_id="gpu-ml", start=LambdaStart(function_name="alphaagent-env-gpu-ml"))
    executor = SandboxExecutor(SandboxConfig(preload=(), warmup=""), environments=StaticRegistry([remote]))
    origin = RunOrigin(
        turn_id=new_ulid(),
        session_id="s",
        user_id=USER,
        scope=ConversationScope(conversation_id="c"),
        environment_id="gpu-ml",
    )
    # Then the local executor refuses to run it, naming why
    with pytest.raises(EnvStartError, match="'gpu-ml' runs on AWS Lambda, not locally"):
        executor.run(tmp_path, "print(1)", limits=RunLimits(), run_id=new_ulid(), origin=origin)
    executor.close()


def test_every_env_subcommand_has_a_description_and_examples_that_parse() -> None:
    import argparse
    import shlex

    from alphaagent.cli import _ENV_EXAMPLES, build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    env_sub = next(a for a in sub.choices["env"]._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in env_sub.choices.items():
        assert command.description and "exit status:" in (command.epilog or ""), name
    for name, examples in _ENV_EXAMPLES.items():
        for example in examples:
            args = parser.parse_args(shlex.split(example)[1:])  # a wrong flag exits 2 here
            assert (args.command, args.env_command) == ("env", name)


def test_env_add_under_json_fails_as_json_on_stdout_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "python")
    code, out, err = _cli(tmp_path, "env", "add", "x", "--python", missing, "--json", capsys=capsys)
    message = f"--python: {missing}: no such interpreter"
    assert code == 2 and err == f"alphaagent: error: {message}\n"
    assert json.loads(out) == {"cli_error": {"message": message, "exit_code": 2}}


def test_env_add_finds_a_bare_interpreter_name_on_path(
    tmp_path: Path, bare_python: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the venv's bin directory first on PATH
    monkeypatch.setenv("PATH", f"{Path(bare_python).parent}{os.pathsep}{os.environ['PATH']}")
    # When an environment is added by the interpreter's name
    code, out, err = _cli(tmp_path, "env", "add", "by-name", "--python", "python", "--json", capsys=capsys)
    # Then the path found on PATH is recorded, the venv's own (not the interpreter it links to)
    assert code == 0, err
    assert json.loads(out)["start"]["python"] == bare_python


# ----------------------------------------------------------------------------- exec --env and turns


def test_exec_runs_in_a_registered_environment_within_its_ceilings(
    tmp_path: Path, bare_python: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given an environment `tight` whose runs may take at most 5 s
    home = tmp_path / "home"
    assert _cli(home, "env", "add", "tight", "--python", bare_python, "--timeout", "5", capsys=capsys)[0] == 0
    code_file = tmp_path / "probe.py"
    code_file.write_text(PROBE_STEP)
    # When `exec --env tight` asks for 60 s
    code, out, err = _cli(
        home, "exec", str(code_file), "--env", "tight", "--timeout", "60", "--json", capsys=capsys
    )
    # Then the code ran under its interpreter (no pandas), with the run's timeout lowered to 5 s
    assert code == 0, err
    result = json.loads(out)
    assert json.loads(result["stdout"]) == {"executable": bare_python, "pandas": False}
    assert result["limits"]["timeout_s"] == 5


@pytest.mark.parametrize(
    ("env", "line"),
    [
        ("nope", "--env: unknown environment 'nope' (available: builtin)"),
        # A typo gets the same suggestion as `env show buitin`, and still the list
        ("buitin", "--env: unknown environment 'buitin' (did you mean 'builtin'?) (available: builtin)"),
    ],
)
def test_exec_in_an_unknown_environment_is_one_line_naming_the_flag_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], env: str, line: str
) -> None:
    home = tmp_path / "home"
    code_file = tmp_path / "job.py"
    code_file.write_text("print(1)\n")
    code, out, err = _cli(home, "exec", str(code_file), "--env", env, capsys=capsys)
    assert (code, out) == (2, "")
    assert err == f"alphaagent: error: {line}\n"
    assert not home.exists()


def test_turns_and_history_say_which_environment_a_turn_used(
    agent: AlphaAgent, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a turn run in `bare`
    conversation = f"c-{new_ulid().lower()}"
    assert agent.run_analysis(_spec(conversation, "bare", "print(1)")).status == "completed"
    # When its turns and history are listed
    code, out, _ = _cli(
        home, "turns", "--conversation", conversation, "--user", USER, "--json", capsys=capsys
    )
    [turn] = json.loads(out)
    _, plain, _ = _cli(home, "turns", "--conversation", conversation, "--user", USER, capsys=capsys)
    _, history, _ = _cli(home, "history", "--conversation", conversation, "--user", USER, capsys=capsys)
    # Then each names the environment
    assert code == 0 and turn["environment_id"] == "bare"
    assert "env bare" in plain.splitlines()[0]
    assert "env bare" in history.splitlines()[0]
