"""Settings and help as a new user meets them (new-user review of the last session's leftovers):

- a malformed setting is refused by every command that reads settings, whether or not it uses the
  setting (``ALPHAAGENT_MAX_BUDGET_USD=abc`` passed a steps-only run), naming the variable; ``help``
  and ``version``, which read none, still work (a bad ``ALPHAAGENT_FILE_ROOTS`` blocked them);
- ``help --home DIR`` says where that data directory is, as every command takes ``--home``;
- ``COMMAND --help --json`` prints the help as JSON, as ``help COMMAND --json`` does;
- a spec's relative ``file`` path outside the roots is refused as the spec has it, and a
  workspace path's refusal shows the value it got.

In process: nothing is run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from alphaagent.cli import build_parser, main
from alphaagent.errors import InvalidSpecError
from alphaagent.models.spec import parse_spec

README = Path(__file__).resolve().parents[2] / "README.md"


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's --help ends the parse
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("variable", "value", "line"),
    [
        ("ALPHAAGENT_MAX_BUDGET_USD", "abc", "ALPHAAGENT_MAX_BUDGET_USD: must be a number > 0, got 'abc'"),
        ("ALPHAAGENT_MAX_BUDGET_USD", "0", "ALPHAAGENT_MAX_BUDGET_USD: must be a number > 0, got '0'"),
        (
            "CLAUDE_CODE_MAX_RETRIES",
            "3.5",
            "CLAUDE_CODE_MAX_RETRIES: must be a whole number from 0 to 20, got '3.5'",
        ),
    ],
)
def test_a_model_setting_is_checked_by_a_command_that_uses_no_model(
    variable: str,
    value: str,
    line: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Given no model configured and a malformed bound of its use
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("CLAUDE_CODE_USE_BEDROCK", raising=False)
    monkeypatch.setenv(variable, value)
    spec = tmp_path / "steps.json"
    spec.write_text(
        json.dumps({"spec_version": 1, "goal": "g", "steps": [{"title": "one", "code": "print(1)"}]})
    )
    home = tmp_path / "home"
    # When a steps-only run and a read are asked for
    for argv in (["run", str(spec), "--conversation", "c"], ["files", "--conversation", "c"]):
        code, out, err = _run([*argv, "--home", str(home)], capsys)
        # Then each is refused in one line naming the variable, and nothing is written
        assert (code, out, err) == (2, "", f"alphaagent: error: {line}\n")
    assert not home.exists()


def test_help_and_version_work_with_a_malformed_file_roots(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a setting every other command refuses
    monkeypatch.setenv("ALPHAAGENT_FILE_ROOTS", "data")
    problem = "ALPHAAGENT_FILE_ROOTS: 'data' is not an absolute path (each root is /... or ~/...)"
    # When the help and the version are asked for, every way
    for argv in (["help"], ["--help"], ["help", "run"], ["run", "--help"], ["version"], ["--version"]):
        code, out, err = _run(argv, capsys)
        # Then they answer, and the program's help names the problem where the data directory goes
        assert (code, err) == (0, ""), argv
        assert out
    code, out, _ = _run(["help"], capsys)
    assert f"data directory: not known: {problem}" in out
    # And any other command still refuses it
    code, out, err = _run(["files", "--conversation", "c"], capsys)
    assert (code, err) == (2, f"alphaagent: error: {problem}\n")


def test_help_takes_home_and_names_that_data_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(["help", "--home", str(tmp_path / "elsewhere")], capsys)
    assert (code, err) == (0, "")
    assert f"data directory: {tmp_path / 'elsewhere'} (from --home)" in out
    assert not (tmp_path / "elsewhere").exists()


def _commands() -> list[list[str]]:
    """Every command and sub-command of the program (``env add``), as words."""
    import argparse

    found: list[list[str]] = []

    def walk(parser: argparse.ArgumentParser, words: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, command in action.choices.items():
                    found.append([*words, name])
                    walk(command, [*words, name])

    walk(build_parser("alphaagent"), [])
    return found


def test_every_command_s_help_json_is_the_help_command_s(capsys: pytest.CaptureFixture[str]) -> None:
    commands = _commands()
    assert ["run"] in commands and ["env", "add"] in commands
    for words in [[], *commands]:
        # When a command's help is asked for as JSON after its name
        code, out, err = _run([*words, "--help", "--json"], capsys)
        # Then it is the JSON `help COMMAND --json` prints
        assert (code, err) == (0, ""), words
        expected_code, expected, _ = _run(["help", *words, "--json"], capsys)
        assert expected_code == 0
        assert json.loads(out) == json.loads(expected), words


def test_a_relative_file_path_outside_the_roots_is_refused_as_typed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a spec beside its data file, and roots that do not hold it
    specs, root = tmp_path / "specs", tmp_path / "root"
    specs.mkdir()
    root.mkdir()
    (specs / "data.csv").write_text("x\n1\n")
    spec = specs / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "spec_version": 1,
                "goal": "g",
                "inputs": [{"kind": "connector", "connector": "file", "request": {"path": "data.csv"}}],
                "steps": [{"title": "one", "code": "print(1)"}],
            }
        )
    )
    monkeypatch.setenv("ALPHAAGENT_FILE_ROOTS", str(root))
    # When it is run
    code, out, err = _run(["run", str(spec), "--home", str(tmp_path / "home"), "--conversation", "c"], capsys)
    # Then the refusal shows the path as the spec has it, and where it resolved
    assert (code, out) == (2, "")
    assert err == (
        f'alphaagent: error: inputs[0].request.path: "data.csv" (resolves to {specs / "data.csv"}) is outside'
        f" the file connector's allowed directories ({root}; set ALPHAAGENT_FILE_ROOTS)\n"
    )
    assert not (tmp_path / "home").exists()


@pytest.mark.parametrize(
    ("path", "line"),
    [
        (
            "../x.csv",
            "outputs[0].path: must stay inside the scope ('.' and '..' segments are not allowed), got \"../x.csv\"",
        ),
        ("/x.csv", "outputs[0].path: must be relative to the scope (no leading '/'), got \"/x.csv\""),
        (
            "datasets//x.csv",
            "outputs[0].path: must not contain empty segments (trailing or doubled '/'), got \"datasets//x.csv\"",
        ),
    ],
)
def test_a_workspace_path_refusal_shows_the_value_it_got(path: str, line: str) -> None:
    document = {
        "spec_version": 1,
        "user_id": "u",
        "scope": {"conversation_id": "c"},
        "goal": "g",
        "outputs": [{"kind": "dataset", "name": "x", "path": path}],
    }
    with pytest.raises(InvalidSpecError) as refused:
        parse_spec(json.dumps(document))
    assert str(refused.value) == line


def test_the_readme_says_what_an_empty_file_roots_means() -> None:
    text = README.read_text(encoding="utf-8")
    assert "An empty value (`ALPHAAGENT_FILE_ROOTS=`) counts as unset" in " ".join(text.split())
