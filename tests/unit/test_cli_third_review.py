"""The third new-user review's command-line frictions, each fixed for its kind: a bad id is refused
before a missing required option is reported (``env add 'BAD!ID'`` without ``--python`` said
--python was required), and ``help --json`` prints the help as JSON (it printed a ``cli_error``),
as every ``--json`` prints the command's answer. In process (``main``)."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest
from cli_table import commands, usage_error

from alphaagent.cli import _Id, build_parser, main

README = Path(__file__).resolve().parents[2] / "README.md"


def _required_and_ids() -> dict[str, tuple[list[argparse.Action], list[argparse.Action]]]:
    """Each command with a required option and an id it is given: those options, those ids."""
    found = {}
    for name, command in commands(build_parser()).items():
        required = [a for a in command._actions if a.option_strings and a.required]
        ids = [a for a in command._actions if isinstance(a.type, _Id)]
        if required and ids:
            found[name] = (required, ids)
    return found


def test_a_bad_id_is_named_before_a_missing_required_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    table = _required_and_ids()
    # Given every command with a required option and an id (found by walking the parser)
    assert {"env add", "export"} <= set(table), table
    for name, (required, ids) in table.items():
        for action in ids:
            # When the id is bad and every required option is left out
            if action.option_strings:
                words = [*name.split(), action.option_strings[0], "BAD!ID"]
            else:
                words = [*name.split(), "BAD!ID"]
            code, out, err = usage_error(words, capsys)
            # Then the one line names the id and its rule, not the missing option
            flag = max(action.option_strings, key=len) if action.option_strings else action.metavar
            assert (code, out) == (2, ""), words
            assert err.startswith(f"alphaagent: error: {flag}: "), (words, err)
            assert "required" not in err, (words, err)
            assert not any(f in err for option in required for f in option.option_strings), (words, err)
    assert list(tmp_path.iterdir()) == []


def test_env_add_with_a_bad_id_and_no_python_names_the_id(capsys: pytest.CaptureFixture[str]) -> None:
    # The review's own words: the id first, in the words the command always used for it
    assert usage_error(["env", "add", "BAD!ID"], capsys) == (
        2,
        "",
        "alphaagent: error: ID: must be 1-32 characters of a-z, 0-9 and '-', starting with a letter, got 'BAD!ID'"
        " (see alphaagent env add --help)\n",
    )
    # and a good id without --python still says what is missing
    assert "--python" in usage_error(["env", "add", "good"], capsys)[2]


def _help_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(list(argv)) == 0
    out, err = capsys.readouterr()
    assert err == ""
    answer = json.loads(out)
    assert isinstance(answer, dict) and "cli_error" not in answer
    return answer


def test_help_json_prints_the_command_list_and_each_commands_help_as_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = build_parser()
    top = [name for a in parser._actions if isinstance(a, argparse._SubParsersAction) for name in a.choices]
    # When a script asks for the help as JSON, before or after the command's name
    for argv in (["help", "--json"], ["--json", "help"]):
        answer = _help_json(capsys, *argv)
        # Then it is the list of every command with its one-line summary
        assert [c["name"] for c in answer["commands"]] == top  # type: ignore[union-attr,index]
        assert all(c["summary"] for c in answer["commands"])  # type: ignore[union-attr,index]
    # And `help COMMAND --json` is that command's help: usage, arguments and options, as JSON
    for name, command in commands(parser).items():
        answer = _help_json(capsys, "help", *name.split(), "--json")
        assert answer["command"] == name and name in str(answer["usage"]), name
        flags = {f for option in answer["options"] for f in option["flags"]}  # type: ignore[union-attr,index]
        shown = {  # what its --help lists, but -h itself
            f
            for a in command._actions
            if a.option_strings and a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)
            for f in a.option_strings
        }
        assert flags == shown, name
    env_add = _help_json(capsys, "help", "env", "add", "--json")
    assert [a["name"] for a in env_add["arguments"]] == ["ID"]  # type: ignore[union-attr,index]
    python = next(o for o in env_add["options"] if o["flags"] == ["--python"])  # type: ignore[union-attr]
    assert (python["value"], python["required"]) == ("PATH", True)
    # And an unknown topic is still a one-line error, as JSON when JSON was asked for
    assert main(["help", "histroy", "--json"]) == 2
    out, err = capsys.readouterr()
    assert "did you mean 'history'?" in json.loads(out)["cli_error"]["message"] and err.count("\n") == 1


def _run_a_spec_intro() -> str:
    """The README's "Run a spec" section up to its first example command: what a user reads
    before running a spec of their own."""
    text = README.read_text()
    section = text[text.index("### Run a spec") :]
    return section[: section.index("```")]


def test_the_variable_a_refused_local_file_names_is_explained_where_running_a_spec_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a spec of the user's own whose file input is outside the file connector's roots
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ALPHAAGENT_FILE_ROOTS", raising=False)
    (tmp_path / "sales.csv").write_text("region,total\nnorth,1\n")
    spec = {
        "spec_version": 1,
        "scope": {"conversation_id": "sales"},
        "goal": "sum the sales",
        "inputs": [{"kind": "connector", "connector": "file", "request": {"path": "sales.csv"}}],
        "steps": [{"title": "sum", "code": "print(1)"}],
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    # When it is run, Then the refusal tells the user which variable to set
    assert main(["run", "spec.json", "--home", str(tmp_path / "home")]) == 2
    err = capsys.readouterr().err
    named = re.findall(r"set (ALPHAAGENT_[A-Z_]+)", err)
    assert named == ["ALPHAAGENT_FILE_ROOTS"], err
    # And the README says it where a user reads how to run a spec, before its first command
    assert named[0] in _run_a_spec_intro()
