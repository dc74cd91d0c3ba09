"""The frictions a new user met and the last review left open: an option's bad value in argparse's
words, no "did you mean" for a name of the user's own data, model field names in command-line
errors, a headless ``serve --open`` saying nothing, and ``history`` showing "no runs" after Ctrl-C.
Every command runs in-process (``main``) on records laid straight through the Store and Workspace
(``viewer_data``): no sandbox starts here."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_cli_newcomer import LEAF_ARGV
from viewer_data import ALICE, BOB, CONV, Home, lay_out

from alphaagent.cli import _Id, _Number, build_parser, main
from alphaagent.local.store import SqliteStore
from alphaagent.local.workspace import LocalWorkspace
from alphaagent.models.common import ConversationScope
from alphaagent.models.run import RunError


class LocalHome(Home):
    def __init__(self, root: Path) -> None:
        super().__init__(SqliteStore(root / "alphaagent.db"), LocalWorkspace(root))
        self.root = root


@pytest.fixture
def home(tmp_path: Path) -> Iterator[LocalHome]:
    """Alice's conversation ``sales`` (artifacts revenue, revenue-chart, vector, summary) and her
    node ``wf1/clean``; Bob's conversation ``bobs-sales``."""
    made = LocalHome(tmp_path / "home")
    lay_out(made)
    bobs = ConversationScope(conversation_id="bobs-sales")
    made.claim(bobs, BOB)
    made.turn(bobs, user=BOB)
    yield made
    made.store.close()


def _main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``alphaagent ARGV``: a usage error exits from the parser."""
    try:
        code = main(list(argv))
    except SystemExit as exited:
        code = int(exited.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


# ----------------------------------------------------------------------------- option values


def _valued_options() -> list[tuple[str, argparse.Action]]:
    """Every option of every command that takes a number or one of some choices."""
    found: list[tuple[str, argparse.Action]] = []

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, command in action.choices.items():
                    walk(command, f"{prefix} {name}".strip())
            elif (
                prefix
                and action.option_strings
                and (action.type is not None or action.choices)
                and not isinstance(action.type, _Id)  # an id is text with a rule, not a number
            ):
                found.append((prefix, action))

    walk(build_parser(), "")
    return found


def test_every_numeric_option_is_typed_by_the_one_rule() -> None:
    # Given every option of every command that is not a plain string
    options = _valued_options()
    flags = {(command, max(a.option_strings, key=len)) for command, a in options}
    # Then it has the project's number type or choices, never argparse's bare int or float
    assert {("turns", "--limit"), ("history", "--limit"), ("cat", "--version"), ("serve", "--port")} <= flags
    assert {
        ("exec", "--timeout"),
        ("exec", "--memory-mb"),
        ("mcp", "--http"),
        ("env add", "--memory-mb"),
    } <= flags
    for command, action in options:
        assert isinstance(action.type, _Number) or action.choices, (command, action.option_strings)


@pytest.mark.parametrize("bad", ["abc", "-7", "1e999"])
def test_a_bad_value_of_any_option_is_one_line_naming_the_option_and_its_rule(
    bad: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    for command, action in _valued_options():
        flag = max(action.option_strings, key=len)
        choices = ", ".join(action.choices or ())
        rule = action.type.rule if isinstance(action.type, _Number) else f"one of {choices}"
        # When the option is given a value it does not take
        argv = [*command.split(), *LEAF_ARGV[command], flag, bad]
        # Then one line names the option, its rule and the value; exit 2; nothing printed or made
        assert _main(capsys, *argv) == (
            2,
            "",
            f"alphaagent: error: {flag}: must be {rule}, got {bad!r} (see alphaagent {command} --help)\n",
        ), argv
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["turns", "--limit", "abc"], "--limit: must be a whole number ≥ 1, got 'abc'"),
        (["turns", "--limit", "0"], "--limit: must be a whole number ≥ 1, got '0'"),
        (["history", "--limit", "2.5"], "--limit: must be a whole number ≥ 1, got '2.5'"),
        (["serve", "--port", "70000"], "--port: must be a whole number from 0 to 65535, got '70000'"),
        (["mcp", "--http", "0"], "--http: must be a whole number from 1 to 65535, got '0'"),
        (
            ["exec", "-", "--timeout", "1000"],
            "--timeout: must be a number of seconds > 0 and ≤ 900, got '1000'",
        ),
        (
            ["exec", "-", "--timeout", "nan"],
            "--timeout: must be a number of seconds > 0 and ≤ 900, got 'nan'",
        ),
        (
            ["exec", "-", "--memory-mb", "100"],
            "--memory-mb: must be a whole number of MiB from 256 to 10240, got '100'",
        ),
        (["submit", "s.json", "--timeout", "0"], "--timeout: must be a number of seconds > 0, got '0'"),
        (["exec", "-", "--network", "maybe"], "--network: must be one of on, off, got 'maybe'"),
        (["turns", "--limit"], "--limit: needs a whole number ≥ 1"),
        (["exec", "-", "--network"], "--network: needs one of on, off"),
    ],
)
def test_the_rule_states_the_range(argv: list[str], line: str, capsys: pytest.CaptureFixture[str]) -> None:
    command = " ".join(argv[:1])
    assert _main(capsys, *argv) == (2, "", f"alphaagent: error: {line} (see alphaagent {command} --help)\n")


def test_a_value_in_range_is_taken(home: LocalHome, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _main(
        capsys, "turns", "--home", str(home.root), "--user", ALICE, "--conversation", "sales", "--limit", " 1"
    )
    assert code == 0 and len(out.splitlines()) == 1


# ----------------------------------------------------------------------------- did you mean


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["cat", "--conversation", "sales", "--artifact", "revenu"],
            "artifact revenu not found in conversation sales (did you mean 'revenue'?)",
        ),
        (
            ["cat", "--conversation", "sales", "--artifact", "revenue", "--version", "7"],
            "artifact revenue v7 not found in conversation sales (its latest is v2)",
        ),
        (
            ["cat", "--conversation", "sales", "--artifact", "totally-else"],
            "artifact totally-else not found in conversation sales",
        ),
        (["files", "--conversation", "sale"], "conversation sale not found (did you mean 'sales'?)"),
        (
            ["turns", "--workflow", "wf1", "--node", "claen"],
            "workflow wf1 node claen not found (did you mean 'clean'?)",
        ),
        (
            ["turns", "--workflow", "wf2", "--node", "clean"],
            "workflow wf2 node clean not found (did you mean 'wf1'?)",
        ),
        (["env", "show", "builtn"], "environment 'builtn' is not registered (did you mean 'builtin'?)"),
        (["env", "remove", "bultin"], "environment 'bultin' is not registered (did you mean 'builtin'?)"),
    ],
)
def test_a_name_of_ones_own_data_a_typo_away_is_offered(
    argv: list[str], line: str, home: LocalHome, capsys: pytest.CaptureFixture[str]
) -> None:
    # When Alice names something of hers with a typo
    who = [] if argv[0] == "env" else ["--user", ALICE]  # environments are the data directory's
    code, out, err = _main(capsys, *argv, "--home", str(home.root), *who)
    # Then the one line offers the closest existing name, exit 1 (not found)
    assert (code, out, err) == (1, "", f"alphaagent: error: {line}\n")


def test_history_turn_offers_the_turn_id_a_typo_away(
    home: LocalHome, capsys: pytest.CaptureFixture[str]
) -> None:
    [turn] = home.store.list_turns(ALICE, CONV.key)
    typo = turn.turn_id[:-1] + ("A" if turn.turn_id[-1] != "A" else "B")
    code, _, err = _main(
        capsys,
        "history",
        "--home",
        str(home.root),
        "--user",
        ALICE,
        "--conversation",
        "sales",
        "--turn",
        typo,
    )
    assert code == 1
    assert (
        err
        == f"alphaagent: error: --turn: no turn {typo!r} in this scope (did you mean {turn.turn_id!r}?) (see turns)\n"
    )


def test_history_turn_without_a_scope_offers_only_the_users_own_turn_id_a_typo_away(
    home: LocalHome, capsys: pytest.CaptureFixture[str]
) -> None:
    [turn] = home.store.list_turns(ALICE, CONV.key)
    typo = turn.turn_id[:-1] + ("A" if turn.turn_id[-1] != "A" else "B")
    # When Alice gives the typo with no scope, Then her own turn id is offered
    code, _, err = _main(capsys, "history", "--home", str(home.root), "--user", ALICE, "--turn", typo)
    assert code == 1
    assert (
        err == f"alphaagent: error: --turn: no turn {typo!r} (did you mean {turn.turn_id!r}?) (see turns)\n"
    )
    # When another user gives the same typo, Then nothing of Alice's is named
    code, _, err = _main(capsys, "history", "--home", str(home.root), "--user", "mallory", "--turn", typo)
    assert (code, err) == (1, f"alphaagent: error: --turn: no turn {typo!r} (see turns)\n")


@pytest.mark.parametrize(
    ("argv", "foreign", "missing"),
    [
        (["files", "--conversation"], "sales", "zzzzz"),  # Alice's conversation; Bob has bobs-sales
        (["files", "--conversation"], "sale", "zzzz"),  # a typo of Alice's, not of Bob's
        (["turns", "--workflow", "wf1", "--node"], "claen", "zzzzz"),
    ],
)
def test_another_users_names_are_never_offered(
    argv: list[str], foreign: str, missing: str, home: LocalHome, capsys: pytest.CaptureFixture[str]
) -> None:
    # When Bob asks for Alice's scope (or a typo of it), and for a name nobody has
    asked = _main(capsys, *argv, foreign, "--home", str(home.root), "--user", BOB)
    nothing = _main(capsys, *argv, missing, "--home", str(home.root), "--user", BOB)
    # Then both answers are the same "not found", with no name of Alice's offered
    assert asked[0] == nothing[0] == 1
    assert asked[2].replace(foreign, "X") == nothing[2].replace(missing, "X")
    assert "did you mean" not in asked[2] and "clean" not in asked[2].replace(foreign, "")


def test_an_artifact_typo_in_another_users_conversation_says_only_not_found(
    home: LocalHome, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _main(
        capsys,
        "cat",
        "--conversation",
        "sales",
        "--artifact",
        "revenu",
        "--home",
        str(home.root),
        "--user",
        BOB,
    )
    assert (code, err) == (1, "alphaagent: error: conversation sales not found\n")


def test_a_users_own_scope_is_offered_to_them(home: LocalHome, capsys: pytest.CaptureFixture[str]) -> None:
    # Bob's own conversation bobs-sales is one edit from what he typed
    code, _, err = _main(
        capsys, "files", "--conversation", "bob-sales", "--home", str(home.root), "--user", BOB
    )
    assert (code, err) == (
        1,
        "alphaagent: error: conversation bob-sales not found (did you mean 'bobs-sales'?)\n",
    )


# ----------------------------------------------------------------------------- flags, not fields


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["exec", "-", "--workdir", "nowhere"], "--workdir: nowhere does not exist"),
        (["exec", "-", "--workdir", "afile"], "--workdir: afile is not a directory"),
        (
            ["env", "add", "Bad_Id", "--python", sys.executable],
            "ID: must be 1-32 characters of a-z, 0-9 and '-', starting with a letter, got 'Bad_Id'"
            " (see alphaagent env add --help)",
        ),
        (["env", "remove", "builtin"], "ID: 'builtin' is built in and cannot be removed"),
        (["--home", "afile", "env", "list"], "--home: {tmp}/afile is not a directory"),
        (["--home", "afile", "demo"], "--home: {tmp}/afile is not a directory"),
        (["--home", "afile", "serve", "--port", "0"], "--home: {tmp}/afile is not a directory"),
    ],
)
def test_an_error_names_the_command_lines_argument_not_the_models_field(
    argv: list[str],
    line: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "stdin", open(__file__))  # exec - reads some code  # noqa: SIM115
    (tmp_path / "afile").write_text("x")
    code, out, err = _main(capsys, *argv)
    assert (code, out, err) == (2, "", f"alphaagent: error: {line.format(tmp=tmp_path)}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_files_prefix_names_the_flag(home: LocalHome, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _main(
        capsys,
        "files",
        "--conversation",
        "sales",
        "--prefix",
        "../x",
        "--home",
        str(home.root),
        "--user",
        ALICE,
    )
    assert (code, err) == (
        2,
        "alphaagent: error: --prefix: '../x': path must stay inside the scope ('.' and '..' segments are not allowed)\n",
    )


# ----------------------------------------------------------------------------- serve --open


@pytest.mark.parametrize("opened", [False, True])
def test_serve_open_on_a_machine_without_a_browser_says_so_with_the_url(
    opened: bool, home: LocalHome, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import uvicorn

    from alphaagent.viewer import serve as viewer

    asked: list[str] = []

    def browser(url: str) -> bool:
        asked.append(url)
        return opened  # False: what webbrowser answers where no browser can run

    monkeypatch.setattr(viewer.webbrowser, "open", browser)
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: None)  # stop at once
    # When the viewer starts with --open
    viewer.serve(viewer.local_reader(home.root, ALICE), port=0, open_browser=True)
    out, err = capsys.readouterr()
    # Then the URL is printed, and, only where no browser opened, one line on stderr says so with it
    [url] = asked
    assert out.endswith(f": {url}\n")
    assert err == ("" if opened else f"alphaagent: no browser could be opened here; open {url}\n")


# ----------------------------------------------------------------------------- history after Ctrl-C


def _cancel(home: LocalHome, scope: ConversationScope) -> str:
    """A turn of Alice's in ``scope`` that Ctrl-C ended 12 s in, after one recorded run: as the turn
    driver records it (``TurnCancelled``), with no record of the run it killed."""
    turn = home.turn(scope, status="running", minute=30)
    home.run(scope, turn)
    error = RunError(name="TurnCancelled", value="interrupted (Ctrl-C) while the turn ran", traceback="")
    home.finish(turn, "failed", error)
    return turn.turn_id


def test_history_says_where_ctrl_c_ended_a_turn(home: LocalHome, capsys: pytest.CaptureFixture[str]) -> None:
    from alphaagent.domain.turns import TURN_CANCELLED

    assert TURN_CANCELLED == "TurnCancelled"  # what the turn driver records (and _cancel lays)
    # Given a turn cut short by Ctrl-C after its first run, newer than the scope's other run
    turn_id = _cancel(home, CONV)
    base = ["history", "--home", str(home.root), "--user", ALICE, "--conversation", "sales"]
    # When the history is read
    code, out, _ = _main(capsys, *base)
    lines = out.splitlines()
    # Then its first line says the turn was interrupted, above that turn's run, newest first
    assert code == 0
    assert lines[0] == (
        f"turn {turn_id}  interrupted (Ctrl-C) 2026-03-01 09:30:12: a run it cut short is not recorded (see turns)"
    )
    assert lines[1].startswith("run ") and len([line for line in lines if line.startswith("run ")]) == 2
    # And --turn of another turn does not show it; --turn of that turn does
    other = next(t.turn_id for t in home.store.list_turns(ALICE, CONV.key) if t.turn_id != turn_id)
    assert "interrupted" not in _main(capsys, *base, "--turn", other)[1]
    assert _main(capsys, *base, "--turn", turn_id)[1].splitlines()[0] == lines[0]
    # And the JSON stays a list of runs (its shape is unchanged)
    assert all("run_id" in row for row in json.loads(_main(capsys, *base, "--json")[1]))


def test_history_of_a_scope_whose_only_turn_was_interrupted_before_any_run_is_not_no_runs(
    home: LocalHome, capsys: pytest.CaptureFixture[str]
) -> None:
    scope = ConversationScope(conversation_id="cut")
    home.claim(scope)
    turn = home.turn(scope, status="running")
    home.finish(turn, "failed", RunError(name="TurnCancelled", value="interrupted (Ctrl-C)", traceback=""))
    code, out, _ = _main(
        capsys, "history", "--home", str(home.root), "--user", ALICE, "--conversation", "cut"
    )
    assert code == 0 and out != "no runs\n"
    assert out.startswith(f"turn {turn.turn_id}  interrupted (Ctrl-C) ")
