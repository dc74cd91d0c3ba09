"""What a second new-user review of the command line found (session 5): an option given twice, an
option put before the command, guesses for one-letter options, a spec without a scope, a closed
pipe, and the wording of the lists of past work."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_runner import run_cli
from cli_table import COMMAND_ARGV, commands, usage_error
from sandboxes import register_light

from alphaagent.cli import _GIVEN, _given_twice, _Number, build_parser, main

BASE_ARGV = COMMAND_ARGV  # a required option is replaced when it is the one given twice


_commands = commands


def _two_values(action: argparse.Action) -> tuple[str, str]:
    if action.choices is not None:
        first, second = list(action.choices)[:2]
        return str(first), str(second)
    if action.dest == "home":
        return "/tmp/nowhere-a", "/tmp/nowhere-b"
    if isinstance(action.type, _Number):  # two values inside the option's own range
        low = int(action.type.low if action.type.low is not None else 1)
        return str(max(low, 1)), str(max(low, 1) + 1)
    return ("1", "2") if action.type in (int, float) else ("dupA", "dupB")


def _single_valued() -> list[tuple[str, argparse.Action]]:
    """Every (command, option) where the option takes one value: the table the rule must cover."""
    commands = _commands(build_parser())
    assert set(commands) == set(BASE_ARGV), "a new command must be added to BASE_ARGV"
    return [
        (name, action)
        for name, command in commands.items()
        for action in command._actions
        if action.option_strings and isinstance(action, argparse._StoreAction) and action.nargs is None
    ]


def test_every_option_that_takes_one_value_is_refused_given_twice_with_different_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    table = _single_valued()
    names = {"/".join(action.option_strings) for _, action in table}
    # (the table is every such option: the ones the review named are in it)
    assert {
        "--conversation",
        "--workflow",
        "--node",
        "-o/--output",
        "--limit",
        "--turn",
        "--version",
    } <= names
    assert {"--timeout", "--home", "--user", "--port", "--network", "--backend", "--python"} <= names
    parser = build_parser()  # one for the checks of argparse's own parse (a parse changes no parser)
    for command, action in table:
        first, second = _two_values(action)
        option = action.option_strings[-1]
        base = list(BASE_ARGV[command])
        for required in ("-o", "--python"):  # the required option under test is given twice instead
            if required in action.option_strings and required in base:
                del base[base.index(required) : base.index(required) + 2]
        argv = [*command.split(), *base, option, first, option, second]
        # When the option is given twice with different values
        code = main(argv)
        out, err = capsys.readouterr()
        # Then one line names it and both values, exit 2, nothing printed or created
        converted = [action.type(v) if callable(action.type) else v for v in (first, second)]
        shown = " and ".join(repr(v) for v in (first, second))  # as typed: '5', not 5.0
        name = "/".join(action.option_strings)
        assert (code, out, err) == (
            2,
            "",
            f"alphaagent: error: {name}: given twice with different values ({shown}); give it once\n",
        ), argv
        assert list(tmp_path.iterdir()) == [], argv
        # And the same value twice is that value (argparse's own parse; main would run the command)
        _GIVEN.clear()
        parsed = parser.parse_args([*command.split(), *base, option, first, option, first])
        assert _given_twice() is None and getattr(parsed, action.dest) == converted[0], argv


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (
            ["exec", "-", "--timeout", "5", "--timeout", "6"],
            "--timeout: given twice with different values ('5' and '6')",
        ),
        (["turns", "--limit", "2", "--limit=3"], "--limit: given twice with different values ('2' and '3')"),
    ],
)
def test_an_option_given_twice_shows_the_values_as_typed(
    argv: list[str],
    shown: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    # When a number is given twice with different values, Then the line quotes what was typed (not 5.0)
    code = main(["--home", str(tmp_path / "home"), *argv])
    assert (code, capsys.readouterr().err) == (2, f"alphaagent: error: {shown}; give it once\n")
    # And the same number typed differently (03 and 3) is the same value: no refusal
    _GIVEN.clear()
    parsed = build_parser().parse_args(["turns", "--limit", "03", "--limit", "3"])
    assert _given_twice() is None and parsed.limit == 3
    assert list(tmp_path.iterdir()) == []


def _spec(conversation: str | None, code: str = "print('hi')", **fields: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "spec_version": 1,
        "goal": "say hi",
        "steps": [{"title": "hi", "code": code}],
        **fields,
    }
    if conversation is not None:
        spec["scope"] = {"conversation_id": conversation}
    return spec


def test_run_with_a_conversation_given_twice_runs_nothing_and_once_runs_there(tmp_path: Path) -> None:
    home = tmp_path / "home"
    spec = tmp_path / "tiny.json"
    spec.write_text(json.dumps(_spec("tiny", environment_id="light")))  # registered below, once refused
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALPHAAGENT_")} | {
        "ALPHAAGENT_HOME": str(home)
    }
    # When run is given two conversations
    done = run_cli(["run", str(spec), "--conversation", "dupA", "--conversation", "dupB"], env=env, text=True)
    # Then it is refused in one line, and no turn ran anywhere (no data directory at all)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "alphaagent: error: --conversation: given twice with different values ('dupA' and 'dupB'); give it once\n"
    )
    assert not home.exists()
    # When the same conversation is given twice, Then the turn runs there (in an environment without
    # the builtin preload: what is checked is where the turn ran, not what its zygote imported)
    register_light(home)
    done = run_cli(
        ["run", str(spec), "--conversation", "dupA", "--conversation", "dupA", "--json"], env=env, text=True
    )
    assert done.returncode == 0, done.stderr
    assert (home / "conversations" / "dupA").is_dir() and not (home / "conversations" / "dupB").exists()


_usage_error = usage_error


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        # a mistyped global option is named, not its value as a command
        (
            ["--hmoe", "/tmp/x", "turns"],
            "--hmoe: unknown option (did you mean '--home'?) (see alphaagent --help)",
        ),
        (["--usr", "bob", "turns"], "--usr: unknown option (did you mean '--user'?) (see alphaagent --help)"),
        (["--zzzzz", "bob", "turns"], "--zzzzz: unknown option (see alphaagent --help)"),
        # a command's own option before the command: where it goes
        (
            ["--conversation", "penguins", "turns"],
            "--conversation: an option of the command; put it after the command:"
            " alphaagent turns --conversation penguins (see alphaagent --help)",
        ),
        (
            ["--conversation=penguins", "turns"],
            "--conversation: an option of the command; put it after the command:"
            " alphaagent turns --conversation=penguins (see alphaagent --help)",
        ),
        (
            ["--conversation", "penguins"],
            "--conversation: an option of a command; give it after the command"
            " (alphaagent COMMAND --conversation ...) (see alphaagent --help)",
        ),
        (
            ["--wait", "submit", "s.json"],
            "--wait: an option of the command; put it after the command: alphaagent submit --wait"
            " (see alphaagent --help)",
        ),
        (
            ["env", "--python", "/usr/bin/python3", "add", "x"],
            "--python: an option of the command; put it after the command:"
            " alphaagent env add --python /usr/bin/python3 (see alphaagent env --help)",
        ),
        # one-letter options get no far-fetched guess; a case slip does get one
        (["-V"], "-V: unknown option (see alphaagent --help)"),
        (["exec", "-c", "print(1)"], "-c: unknown option for exec (see alphaagent exec --help)"),
        (["turns", "-H"], "-H: unknown option for turns (did you mean '-h'?) (see alphaagent turns --help)"),
        # --version after a command is the program's
        (
            ["turns", "--version"],
            "--version: unknown option for turns (the program's version: alphaagent --version)"
            " (see alphaagent turns --help)",
        ),
        # --version takes nothing after it: neither a word nor a command
        (["--version", "extra"], "extra: unknown command (see alphaagent --help)"),
        (
            ["--version", "turns"],
            "--version: goes alone, not with a command; give alphaagent --version, or turns without it"
            " (see alphaagent --help)",
        ),
    ],
)
def test_a_misplaced_or_mistyped_option_is_named_first_with_where_it_goes(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _usage_error(argv, capsys) == (2, "", f"alphaagent: error: {line}\n")


def test_help_for_a_mistyped_command_names_the_closest(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["help", "histroy"]) == 2
    assert capsys.readouterr() == (
        "",
        "alphaagent: error: help: no command 'histroy' (did you mean 'history'?)\n",
    )


@pytest.mark.parametrize(
    ("fields", "line"),
    [
        ({"outpts": []}, "outpts: unknown field (did you mean 'outputs'?)"),
        ({"qqqqqq": []}, "qqqqqq: unknown field (expected one of: "),
        (
            {"outputs": [{"kind": "dataset", "nmae": "x"}]},
            "outputs[0].nmae: unknown field (did you mean 'name'?)",
        ),
    ],
)
def test_a_spec_typo_names_the_closest_field_at_the_top_as_below(fields: dict[str, Any], line: str) -> None:
    from alphaagent.errors import InvalidSpecError
    from alphaagent.models.spec import parse_spec

    with pytest.raises(InvalidSpecError) as refused:
        parse_spec(json.dumps(_spec("c", **fields)), defaults={"user_id": "u"})
    assert str(refused.value).startswith(line), str(refused.value)


@pytest.mark.parametrize(
    ("constraints", "line"),
    [
        ({"max_runs": 0}, "constraints.max_runs: must be a whole number ≥ 1, got 0"),
        ({"max_runs": 501}, "constraints.max_runs: must be a whole number ≤ 500, got 501"),
        ({"run_timeout_s": 0}, "constraints.run_timeout_s: must be a number of seconds > 0, got 0"),
        (
            {"turn_timeout_s": 100000},
            "constraints.turn_timeout_s: must be a number of seconds ≤ 86400, got 100000",
        ),
    ],
)
def test_a_spec_number_out_of_its_range_is_worded_as_an_options_rule(
    constraints: dict[str, Any], line: str
) -> None:
    from alphaagent.errors import InvalidSpecError
    from alphaagent.models.spec import parse_spec

    # When a spec's number breaks its bound, Then the rule in the CLI's words, not pydantic's
    with pytest.raises(InvalidSpecError) as refused:
        parse_spec(json.dumps(_spec("c", constraints=constraints)), defaults={"user_id": "u"})
    assert str(refused.value) == line


def test_run_of_a_spec_without_scope_names_the_flags_that_supply_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "spec.json").write_text(json.dumps(_spec(None)))
    home = tmp_path / "home"
    # When a spec without a scope is run with no scope flag
    code = main(["run", "spec.json", "--home", str(home)])
    # Then one line says how to name it, as turns does; nothing is created
    assert (code, *capsys.readouterr()) == (
        2,
        "",
        "alphaagent: error: scope: name the scope in the spec or with --conversation ID"
        " (or --workflow EXEC --node ID)\n",
    )
    assert not home.exists()


# ----------------------------------------------------------------------------- a closed pipe


def _run_without_a_reader(
    argv: list[str], stream: str, home: Path, cwd: Path, **options: Any
) -> subprocess.CompletedProcess[bytes]:
    """``alphaagent ARGV`` as a fresh process on data directory ``home``, its ``stream`` ("stdout"
    or "stderr") a pipe whose reader is gone before the command writes anything (no race); the
    other stream is captured."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALPHAAGENT_")}
    env["ALPHAAGENT_HOME"] = str(home)
    read, write = os.pipe()
    os.close(read)
    other = "stderr" if stream == "stdout" else "stdout"
    try:
        return subprocess.run(
            [sys.executable, "-m", "alphaagent.cli", *argv],
            **{stream: write, other: subprocess.PIPE},
            env=env,
            cwd=cwd,
            timeout=120,
            **options,
        )
    finally:
        os.close(write)


@pytest.mark.parametrize(
    ("argv", "stdin"),
    [
        # a small answer, flushed at the end: the closed pipe is met at the exit
        (["conversations", "--json"], b""),
        # help, which argparse writes (and would let a failed write pass as success)
        (["help"], b""),
        # output larger than a pipe's buffer, written while the command runs (in an environment
        # without the builtin preload: the pipe is the subject, not what the zygote imports)
        (["exec", "-", "--env", "light"], b"for i in range(20000):\n    print('line', i)\n"),
    ],
)
def test_a_reader_that_went_away_ends_the_command_quietly_with_141(
    argv: list[str], stdin: bytes, tmp_path: Path
) -> None:
    if "--env" in argv:
        register_light(tmp_path / "home")
    done = _run_without_a_reader(argv, "stdout", tmp_path / "home", tmp_path, input=stdin)
    # Then as a Unix tool killed by SIGPIPE: 141, nothing on stderr (no traceback, no "Exception ignored")
    # but the progress line of a wait for the environment's zygote, which is not about the pipe
    said = [
        line for line in done.stderr.decode().splitlines() if not line.startswith("starting the environment")
    ]
    assert (done.returncode, said) == (141, [])


def test_a_reader_of_the_progress_that_went_away_fails_no_turn(tmp_path: Path) -> None:
    # Given a spec of two steps, and a standard error whose reader is gone (run 2>&1 >/dev/null | head)
    home = tmp_path / "home"
    environment = register_light(home)
    steps = [{"title": f"step {n}", "code": f"print({n})"} for n in (1, 2)]
    spec = {**_spec("gone", environment_id=environment), "steps": steps}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    done = _run_without_a_reader(["run", "spec.json", "--json"], "stderr", home, tmp_path)
    # Then the turn completes and is recorded so: the progress was only for whoever watched
    assert done.returncode == 0, done.stdout
    assert json.loads(done.stdout)["status"] == "completed"
    code, out, _ = _out("turns", "--home", str(home), "--conversation", "gone", "--json")
    assert code == 0 and [turn["status"] for turn in json.loads(out)] == ["completed"]


# ----------------------------------------------------------------------------- lists of past work


def _run(home: Path, spec: dict[str, Any], tmp: Path) -> str:
    path = tmp / "spec.json"
    path.write_text(json.dumps(spec))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        main(["run", str(path), "--home", str(home), "--json"])
    turn_id: str = json.loads(out.getvalue())["turn_id"]
    return turn_id


@pytest.fixture(scope="module")
def past_work(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """Two turns in conversation ``a`` (the first prints six lines from four lines of code, the
    second fetches a file), and one in ``b`` whose output cannot be registered. Returns the data directory and the turn ids."""
    tmp = tmp_path_factory.mktemp("past")
    home = tmp / "home"
    light = register_light(home)  # the lists are the subject, not the zygote's preload
    six = "print(1)\nprint(2)\nprint(3)\nprint(4); print(5); print(6)"
    penguins = Path(__file__).parents[2] / "examples" / "penguins" / "penguins.csv"  # a file root by default
    fetched = [{"kind": "connector", "connector": "file", "request": {"path": str(penguins)}}]
    ids = {
        "a1": _run(home, _spec("a", six, environment_id=light), tmp),
        "a2": _run(home, _spec("a", inputs=fetched, environment_id=light), tmp),
        "b1": _run(
            home, _spec("b", outputs=[{"kind": "report", "name": "nowhere"}], environment_id=light), tmp
        ),
    }
    return home, ids


def _out(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_what_a_limit_or_a_cut_leaves_out_is_counted_in_good_english(
    past_work: tuple[Path, dict[str, str]],
) -> None:
    home, ids = past_work
    scope = ["--home", str(home), "--conversation", "a"]
    # When one of two turns (and runs) is shown, Then "1 older turn", not "1 older turns"
    assert _out("turns", *scope, "--limit", "1")[1].splitlines()[-1] == "(1 older turn not shown: --limit 1)"
    assert _out("history", *scope, "--limit", "1")[1].splitlines()[-1] == "(1 older run not shown: --limit 1)"
    # And a run's output and code cut by one line say "1 earlier line" and "1 more line"
    lines = _out("history", *scope, "--turn", ids["a1"])[1].splitlines()
    assert "  | ... (1 more line; --json for all)" in lines, lines
    assert "  > ... (1 earlier line; --json for all)" in lines, lines


def test_conversations_take_a_limit_newest_first(past_work: tuple[Path, dict[str, str]]) -> None:
    home, _ = past_work
    code, out, _ = _out("conversations", "--home", str(home), "--json")
    assert code == 0 and [c["scope"]["conversation_id"] for c in json.loads(out)] == ["b", "a"]
    code, out, _ = _out("conversations", "--home", str(home), "--json", "--limit", "1")
    assert code == 0 and [c["scope"]["conversation_id"] for c in json.loads(out)] == ["b"]
    code, out, _ = _out("conversations", "--home", str(home), "--limit", "1")
    assert out.splitlines()[0].startswith("conversation b  1 turn  failed")
    assert out.splitlines()[-1] == "(1 older conversation not shown: --limit 1)"
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as refused:
        main(["conversations", "--home", str(home), "--limit", "0"])
    assert (refused.value.code, err.getvalue()) == (
        2,
        "alphaagent: error: --limit: must be a whole number ≥ 1, got '0' (see alphaagent conversations --help)\n",
    )


def test_a_failed_output_is_named_once(past_work: tuple[Path, dict[str, str]]) -> None:
    home, _ = past_work
    code, out, _ = _out("turns", "--home", str(home), "--conversation", "b")
    assert code == 0
    error = next(line for line in out.splitlines() if line.startswith("  ! "))
    assert (
        error.startswith("  ! outputs[0]: ArtifactError: path: not given") and error.count("outputs[0]") == 1
    )


def test_history_of_a_turn_needs_no_scope_and_another_users_turn_is_missing(
    past_work: tuple[Path, dict[str, str]],
) -> None:
    home, ids = past_work
    with_scope = _out("history", "--home", str(home), "--conversation", "a", "--turn", ids["a1"], "--json")
    # When history is asked for a turn with no scope, Then the same runs as with its scope
    alone = _out("history", "--home", str(home), "--turn", ids["a1"], "--json")
    assert alone == with_scope and alone[0] == 0 and len(json.loads(alone[1])) == 1
    # When another user asks for it, Then exactly what a turn that does not exist gets
    theirs = _out("history", "--home", str(home), "--user", "mallory", "--turn", ids["a1"])
    missing = _out("history", "--home", str(home), "--turn", "01JZZZZZZZZZZZZZZZZZZZZZZZ")
    assert theirs[0] == missing[0] == 1 and theirs[1] == missing[1] == ""
    assert theirs[2] == missing[2].replace("01JZZZZZZZZZZZZZZZZZZZZZZZ", ids["a1"])
    assert missing[2] == "alphaagent: error: --turn: no turn '01JZZZZZZZZZZZZZZZZZZZZZZZ' (see turns)\n"


def test_a_citation_of_a_fetched_input_says_where_from_without_brackets_in_brackets(
    past_work: tuple[Path, dict[str, str]],
) -> None:
    home, ids = past_work
    code, out, _ = _out("turns", "--home", str(home), "--conversation", "a", "--json")
    assert code == 0
    (turn,) = [t for t in json.loads(out) if t["turn_id"] == ids["a2"]]
    (citation,) = turn["result"]["citations"]
    # `cites docs/sales.csv (CLAIM)` is how it is shown: the claim itself has no brackets
    assert citation["claim"].startswith("input of this turn's pinned steps; fetched from "), citation
    assert "(" not in citation["claim"]
