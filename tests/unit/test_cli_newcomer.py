"""What a new user types first, answered the same way everywhere (new-user review): the global
options in every place with one rule, ``alphaagent``/``help``/``version``, lists of past work in one
order with a selection, and printed commands that paste as they are."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_runner import run_cli
from cli_table import COMMAND_ARGV, commands, usage_error
from sandboxes import LIGHT_ENVIRONMENT, register_light

from alphaagent.cli import build_parser, main

pytestmark = pytest.mark.mcp_sdk  # imports the MCP SDK in this process (tests/conftest.py)

LEAF_ARGV = COMMAND_ARGV

_VALUES = {"json": [], "home": ["/tmp/nowhere-home"], "user": ["bob"]}


def _leaves() -> set[str]:
    return set(commands(build_parser()))


def _placements(command: str, option: str) -> list[list[str]]:
    """``--option`` before the command name, after all its words, and between ``env`` and its
    sub-command."""
    flag = [f"--{option}", *_VALUES[option]]
    words, rest = command.split(), LEAF_ARGV[command]
    placed = [[*flag, *words, *rest], [*words, *rest, *flag]]
    if len(words) == 2:
        placed.append([words[0], *flag, words[1], *rest])
    return placed


def _listed_in_help(parser: argparse.ArgumentParser, command: str, option: str) -> bool:
    for word in command.split():
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return any(a.dest == option and a.help != argparse.SUPPRESS for a in parser._actions)


def test_every_global_option_parses_in_every_place_and_is_taken_or_refused_in_one_line() -> None:
    from alphaagent.cli import _GLOBAL_OPTIONS, _refused_option

    # Given every command (a new one must be added to the table)
    assert _leaves() == set(LEAF_ARGV)
    parser = build_parser()
    for command in LEAF_ARGV:
        for option in _GLOBAL_OPTIONS:
            for argv in _placements(command, option):
                # When the option is given there: Then argparse never refuses it (no usage error)
                args = parser.parse_args(argv)
                refused = _refused_option(args, "alphaagent")
                # And the command either takes it, as its help says, or names it in one line
                if _listed_in_help(parser, command, option):
                    assert refused is None, (argv, refused)
                    expected = True if option == "json" else _VALUES[option][0]
                    assert getattr(args, option) == expected, argv
                elif option == "json":
                    assert refused == f"--json: {command} prints no JSON (see alphaagent {command} --help)"
                else:
                    assert (
                        refused
                        == f"--{option}: {command} takes no --{option} (see alphaagent {command} --help)"
                    )


def _refused_in_one_line(
    argv: list[str], line: str, cwd: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``main(argv)`` from an empty ``cwd`` prints nothing on stdout, ``line`` alone on stderr, exits 2,
    and creates nothing."""
    monkeypatch.chdir(cwd)
    code = main(argv)
    out, err = capsys.readouterr()
    assert (code, out, err) == (2, "", f"alphaagent: error: {line}\n")
    assert list(cwd.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["exec", "--user", "bob", "x.py"], "--user: exec takes no --user (see alphaagent exec --help)"),
        (
            ["env", "list", "--user", "bob"],
            "--user: env list takes no --user (see alphaagent env list --help)",
        ),
        (
            ["env", "--user", "bob", "list"],
            "--user: env list takes no --user (see alphaagent env list --help)",
        ),
        (
            ["--user", "bob", "env", "list"],
            "--user: env list takes no --user (see alphaagent env list --help)",
        ),
        (
            ["submit", "spec.json", "--home", "/x"],
            "--home: submit takes no --home (see alphaagent submit --help)",
        ),
        (["--home", "/x", "version"], "--home: version takes no --home (see alphaagent version --help)"),
    ],
)
def test_an_option_a_command_does_not_take_is_one_line_naming_it(
    argv: list[str],
    line: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # When the option is given to a command it does not apply to
    # Then one line names the option and the command, exit 2, nothing printed or created
    _refused_in_one_line(argv, line, tmp_path, monkeypatch, capsys)


def test_the_global_options_still_reach_the_command_that_takes_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    # When env list is asked for JSON and a data directory between env and list
    assert main(["env", "--home", str(home), "--json", "list"]) == 0
    # Then it answers in JSON from that directory (the builtin environment; nothing created)
    assert [e["environment_id"] for e in json.loads(capsys.readouterr().out)] == ["builtin"]
    assert not home.exists()


# ----------------------------------------------------------------------------- help, version


def test_no_arguments_prints_the_overview_on_stdout_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as helped:
        main(["--help"])
    overview = capsys.readouterr().out
    assert helped.value.code == 0
    # When alphaagent runs with no arguments, or as `alphaagent help`
    for argv in ([], ["help"]):
        code = main(argv)
        out, err = capsys.readouterr()
        # Then it is the overview --help prints, on stdout, exit 0
        assert (code, out, err) == (0, overview, ""), argv
    assert "help" in overview and "version" in overview


@pytest.mark.parametrize("topic", [["run"], ["env"], ["env", "add"]])
def test_help_command_is_that_commands_help(topic: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([*topic, "--help"])
    expected = capsys.readouterr().out
    assert main(["help", *topic]) == 0
    assert capsys.readouterr().out == expected


def test_help_for_a_command_that_does_not_exist_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["help", "env", "nope"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "alphaagent: error: help: env has no command 'nope' (commands: add, list, show, remove)\n"


def test_version_prints_what_dash_dash_version_prints(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    expected = capsys.readouterr().out
    assert main(["version"]) == 0
    assert capsys.readouterr().out == expected
    assert main(["--json", "version"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["name"] == "alphaagent" and expected == f"alphaagent {answer['version']}\n"


# ----------------------------------------------------------------------------- order and selection


def _run_turn(home: Path, spec_file: Path, step: str) -> str:
    spec_file.write_text(
        json.dumps(
            {
                "spec_version": 1,
                "scope": {"conversation_id": "log"},
                "goal": f"turn {step}",
                "environment_id": LIGHT_ENVIRONMENT,  # the lists, not the preload, are the subject
                "steps": [{"title": f"{step}-a", "code": f"print('{step}-a')"}]
                + ([{"title": f"{step}-b", "code": f"print('{step}-b')"}] if step == "second" else []),
            }
        )
    )
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["run", str(spec_file), "--home", str(home), "--json"])
    assert code == 0, err.getvalue()
    turn_id: str = json.loads(out.getvalue())["turn_id"]
    return turn_id


@pytest.fixture(scope="module")
def log_home(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """Three turns in conversation ``log`` (the second with two runs), in a data directory whose
    path has a space; the tests only read it. Returns the directory and the turn ids, oldest first."""
    home = tmp_path_factory.mktemp("log") / "my data"
    spec_file = home.parent / "spec.json"
    register_light(home)  # each `run` starts its environment's zygote: ~0.2 CPU-s, not builtin's ~2
    return home, [_run_turn(home, spec_file, step) for step in ("first", "second", "third")]


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_turns_and_history_list_newest_first_and_select_with_limit_and_turn(
    log_home: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    # Given three turns in one conversation, the second with two runs
    home, ids = log_home
    scope = ["--home", str(home), "--conversation", "log", "--json"]
    # When turns and history are listed, Then the newest comes first, as conversations do
    turns = _json(capsys, "turns", *scope)
    assert [t["turn_id"] for t in turns] == ids[::-1]
    runs = _json(capsys, "history", *scope)
    assert [r["stdout"] for r in runs] == ["third-a\n", "second-b\n", "second-a\n", "first-a\n"]
    # When they are cut to --limit N, Then the N newest, the same objects
    assert _json(capsys, "turns", *scope, "--limit", "2") == turns[:2]
    assert _json(capsys, "history", *scope, "--limit", "1") == runs[:1]
    # When history is asked for one turn, Then only its runs, newest first, the same objects
    assert _json(capsys, "history", *scope, "--turn", ids[1]) == runs[1:3]
    assert _json(capsys, "history", *scope, "--turn", ids[1], "--limit", "1") == runs[1:2]
    # And the text says what the limit left out
    assert main(["turns", *scope[:-1], "--limit", "1"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0].startswith(ids[2]) and text[-1] == "(2 older turns not shown: --limit 1)"


@pytest.mark.parametrize(
    ("extra", "code", "line"),
    [
        (["--limit", "0"], 2, "--limit: must be a whole number ≥ 1, got '0' (see alphaagent history --help)"),
        (
            ["--turn", "01JZZZZZZZZZZZZZZZZZZZZZZZ"],
            1,
            "--turn: no turn '01JZZZZZZZZZZZZZZZZZZZZZZZ' in this scope (see turns)",
        ),
    ],
)
def test_a_bad_selection_is_one_line(
    extra: list[str],
    code: int,
    line: str,
    log_home: tuple[Path, list[str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    home, _ = log_home
    try:
        got = main(["history", "--home", str(home), "--conversation", "log", *extra])
    except SystemExit as exited:  # a bad option value is refused by the parser
        got = exited.code
    assert got == code
    assert capsys.readouterr().err == f"alphaagent: error: {line}\n"


# ----------------------------------------------------------------------------- pasteable commands


def test_the_demos_follow_up_names_a_data_directory_that_is_not_the_default(
    log_home: tuple[Path, list[str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from alphaagent.demo import follow_up_command

    # Given a conversation in a data directory that is not the per-user default
    home, _ = log_home
    # When the demo's follow-up names it, and is pasted in another directory, in a new shell
    command = follow_up_command("alphaagent", "local", "log", home)
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.chdir(other)
    monkeypatch.delenv("ALPHAAGENT_HOME", raising=False)
    monkeypatch.setenv("HOME", str(other))
    words = shlex.split(command)
    # Then it lists that conversation's runs
    assert words[0] == "alphaagent" and main([*words[1:], "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 4
    # And without --home the default is what a new shell finds by itself
    assert "--home" not in follow_up_command("alphaagent", "local", "log", None)


@pytest.mark.parametrize(
    ("argv", "env_home", "named"),
    [([], None, False), ([], "/data/aa", True), (["--home", "rel"], None, True)],
)
def test_the_demo_names_the_data_directory_when_it_was_moved(
    argv: list[str],
    env_home: str | None,
    named: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import alphaagent.demo

    seen: dict[str, Any] = {}
    monkeypatch.setattr(alphaagent.demo, "run_demo", lambda **kwargs: seen.update(kwargs) or 0)
    monkeypatch.chdir(tmp_path)
    if env_home is None:
        monkeypatch.delenv("ALPHAAGENT_HOME", raising=False)
    else:
        monkeypatch.setenv("ALPHAAGENT_HOME", env_home)
    # When the demo starts with the default, $ALPHAAGENT_HOME or a relative --home
    assert main(["demo", *argv], prog="/opt/aa/bin/alphaagent") == 0
    # Then its follow-up names the (absolute) data directory exactly when it was moved
    assert seen["name_home"] is named and seen["home"].is_absolute()
    assert seen["program"] == "/opt/aa/bin/alphaagent"


def test_a_symlink_under_another_name_is_named_as_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from alphaagent.program import program_name

    # Given the console script, and a symlink to it called aa
    real = tmp_path / "venv" / "bin" / "alphaagent"
    real.parent.mkdir(parents=True)
    real.write_text("#!/bin/sh\n")
    real.chmod(0o755)
    links = tmp_path / "my bin"
    links.mkdir()
    (links / "aa").symlink_to(real)
    # When PATH finds aa, Then it is named aa; when it does not, its absolute path, quoted
    monkeypatch.setenv("PATH", str(links))
    assert program_name(str(links / "aa")) == "aa"
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    assert shlex.split(program_name(str(links / "aa"))) == [str(links / "aa")]
    # And an empty argv[0] (an embedded start) is the bare name
    assert program_name("") == "alphaagent"


def test_python_dash_m_is_named_with_the_interpreter_that_has_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from alphaagent.program import module_program

    # Given a venv interpreter, a symlink to the system one as venvs have
    system = tmp_path / "usr" / "bin" / "python3"
    system.parent.mkdir(parents=True)
    system.write_text("#!/bin/sh\n")
    system.chmod(0o755)
    venv_python = tmp_path / "venv" / "bin" / "python3"
    venv_python.parent.mkdir(parents=True)
    venv_python.symlink_to(system)
    # When PATH finds only the system interpreter, Then the venv's is named by its path
    monkeypatch.setenv("PATH", str(system.parent))
    assert module_program(str(venv_python)) == f"{venv_python} -m alphaagent.cli"
    # When PATH finds the venv's, Then the bare name
    monkeypatch.setenv("PATH", str(venv_python.parent))
    assert module_program(str(venv_python)) == "python3 -m alphaagent.cli"


def test_help_run_as_a_module_shows_a_command_that_pastes(tmp_path: Path) -> None:
    # Given a shell whose PATH has neither alphaagent nor this interpreter
    env = {**os.environ, "PATH": str(tmp_path)}
    # When the help is asked for through python -m alphaagent.cli
    done = run_cli(["help", "history"], env=env, text=True, timeout=120)
    # Then its usage line and examples start with this interpreter, which runs them as they are
    assert done.returncode == 0, done.stderr
    program = f"{shlex.quote(sys.executable)} -m alphaagent.cli"
    assert done.stdout.startswith(f"usage: {program} history")
    assert f"  {program} history --conversation penguins\n" in done.stdout


def test_the_console_script_names_itself_as_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from alphaagent import entry

    # Given the console script started by a path PATH does not find
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "bin" / "alphaagent"), "help", "turns"])
    # When it prints help, Then the usage names that path
    assert entry.main() == 0
    assert capsys.readouterr().out.startswith(f"usage: {tmp_path / 'bin' / 'alphaagent'} turns")


# ----------------------------------------------------------------------------- typos


_usage_error = usage_error


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["histroy"], "histroy: unknown command (did you mean 'history'?) (see alphaagent --help)"),
        (["qqqqq"], "qqqqq: unknown command (see alphaagent --help)"),
        (
            ["env", "lst"],
            "lst: unknown command for env (did you mean 'list'?) (see alphaagent env --help)",
        ),
        (
            ["turns", "--conversaton", "sales"],
            "--conversaton: unknown option for turns (did you mean '--conversation'?)"
            " (see alphaagent turns --help)",
        ),
        (
            ["turns", "--conversaton=sales"],
            "--conversaton: unknown option for turns (did you mean '--conversation'?)"
            " (see alphaagent turns --help)",
        ),
        (
            ["env", "--jsn", "list"],
            "--jsn: unknown option for env (did you mean '--json'?) (see alphaagent env --help)",
        ),
        (
            ["env", "list", "--jsn"],
            "--jsn: unknown option for env list (did you mean '--json'?) (see alphaagent env list --help)",
        ),
        (["--jsn", "turns"], "--jsn: unknown option (did you mean '--json'?) (see alphaagent --help)"),
        (["turns", "sales"], "'sales': unexpected argument for turns (see alphaagent turns --help)"),
    ],
)
def test_a_typo_of_a_command_or_an_option_names_it_the_closest_and_that_commands_help(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # When a command name or an option is mistyped
    # Then one line names the word, the command it was given to, the closest known name if one
    # is close, and the help of that command (not the program's), exit 2
    assert _usage_error(argv, capsys) == (2, "", f"alphaagent: error: {line}\n")


def test_a_typo_is_refused_the_same_by_the_program_as_started(tmp_path: Path) -> None:
    # When the program itself (not main()) is given a mistyped command, with --json
    done = run_cli(["histroy", "--json"], text=True, cwd=tmp_path)
    # Then the same one line, and the JSON error for the script that asked for it
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].startswith(
        "alphaagent: error: histroy: unknown command (did you mean"
    )
    assert json.loads(done.stdout)["cli_error"]["exit_code"] == 2


def test_env_alone_prints_its_help_on_stdout_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["env", "--help"])
    expected = capsys.readouterr().out
    # When env is given no sub-command
    code = main(["env"])
    out, err = capsys.readouterr()
    # Then it is env's help on stdout, exit 0, as `alphaagent` alone is the overview
    assert (code, out, err) == (0, expected, "")
    # And no line of it, nor of a usage error under env, names the internal destination
    assert "env_command" not in expected
    assert "env_command" not in _usage_error(["env", "lst"], capsys)[2]
    # And with --json it is that help as JSON, what `help env --json` prints (every --json prints
    # the command's answer as JSON)
    assert main(["env", "--json"]) == 0
    out, err = capsys.readouterr()
    assert main(["help", "env", "--json"]) == 0
    assert (json.loads(out), err) == (json.loads(capsys.readouterr().out), "")
    assert [c["name"] for c in json.loads(out)["commands"]] == [
        "env add",
        "env list",
        "env show",
        "env remove",
    ]


@pytest.mark.parametrize("argv", [["--json", "--version"], ["--version", "--json"]])
def test_dash_dash_version_with_json_is_the_json_of_version_json(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["version", "--json"]) == 0
    expected = capsys.readouterr().out
    # When --version is asked for JSON, before or after
    code = main(argv)
    out, err = capsys.readouterr()
    # Then it is what `version --json` prints, not the line for people
    assert (code, out, err) == (0, expected, "")
    assert json.loads(out)["name"] == "alphaagent"


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--home", "/x", "--version"], "--home: version takes no --home (see alphaagent version --help)"),
        (["--version", "--home", "/x"], "--home: version takes no --home (see alphaagent version --help)"),
        (["--user", "bob", "--version"], "--user: version takes no --user (see alphaagent version --help)"),
        (
            ["--user", "bob", "turns", "--user", "local"],
            "--user: given twice with different values ('bob' and 'local'); give it once",
        ),
        (
            ["env", "--home", "/x", "list", "--home", "/y"],
            "--home: given twice with different values ('/x' and '/y'); give it once",
        ),
    ],
)
def test_version_option_and_a_global_option_given_twice_follow_the_one_rule(
    argv: list[str],
    line: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # When --version comes with an option the version command refuses, or a global option is
    # given twice with different values (argparse would keep the last one silently)
    # Then one line names the option, exit 2, nothing printed or created
    _refused_in_one_line(argv, line, tmp_path, monkeypatch, capsys)


def test_a_global_option_given_twice_with_the_same_value_is_that_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    # When the same data directory is given before and after the command name
    assert main(["--home", str(home), "env", "list", "--json", "--home", f"{home}/."]) == 0
    # Then it is that directory (the builtin environment, nothing created)
    assert [e["environment_id"] for e in json.loads(capsys.readouterr().out)] == ["builtin"]
    assert not home.exists()


def test_no_command_with_an_option_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _usage_error(["--json"], capsys)
    assert (code, err) == (2, "alphaagent: error: name a command (see alphaagent --help)\n")
    assert json.loads(out)["cli_error"]["exit_code"] == 2


# ----------------------------------------------------------------------------- the MCP list


def test_the_mcp_list_of_turns_is_newest_first_as_every_list_of_past_work() -> None:
    pytest.importorskip("mcp")
    from datetime import UTC, datetime, timedelta
    from types import SimpleNamespace

    import anyio
    from mcp import Client as McpClient

    from alphaagent.mcp_server import LIST_TURNS_DESCRIPTION, build_server
    from alphaagent.models.records import Turn

    # Given a scope whose store keeps three turns oldest first (the client's order)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    stored = [
        Turn(
            turn_id=f"T{n}",
            user_id="alice",
            scope_key="conversations/c",
            session_id="s",
            status="completed",
            goal=f"goal {n}",
            started_at=start + timedelta(minutes=n),
        )
        for n in (1, 2, 3)
    ]
    client = SimpleNamespace(turns=lambda scope: list(stored))
    server = build_server(client)  # type: ignore[arg-type]  # only turns() is called

    async def scenario() -> Any:
        async with McpClient(server) as mcp:
            return await mcp.call_tool("list_turns", {"scope": {"conversation_id": "c"}})

    # When the orchestrating agent lists the scope's turns
    listed = anyio.run(scenario)
    # Then the newest comes first, in the structured result and the text alike, as the tool says
    assert not listed.is_error, listed.content
    assert [t["turn_id"] for t in listed.structured_content["turns"]] == ["T3", "T2", "T1"]
    text = listed.content[0].text
    assert text.index("T3") < text.index("T2") < text.index("T1")
    assert "newest first" in LIST_TURNS_DESCRIPTION
