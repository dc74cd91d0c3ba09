"""The command line's answers at its edges: errors a script can parse under ``--json``, Ctrl-C at
any moment (even while the CLI is still importing), and artifacts a failed turn left behind."""

from __future__ import annotations

import contextlib
import importlib.abc
import io
import json
import sys
from pathlib import Path

import pytest
from sandboxes import LIGHT_ENVIRONMENT, register_light

from alphaagent import entry
from alphaagent.cli import main


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def light(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """``--env light --home DIR``: a data directory (outside every test's own folder) with an
    environment that preloads nothing, for the ``exec`` tests whose subject is the command's
    answer, not the builtin preload (each ``exec`` starts a zygote: ~0.2 CPU-s, not ~2)."""
    home = tmp_path_factory.mktemp("light") / "home"
    return ["--env", register_light(home), "--home", str(home)]


def test_an_error_under_json_is_also_a_json_object_on_stdout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = str(tmp_path / "home")
    code, out, err = _run(capsys, "files", "--home", home, "--conversation", "nope", "--json")
    assert code != 0
    answer = json.loads(out)
    assert answer == {"cli_error": {"message": answer["cli_error"]["message"], "exit_code": code}}
    assert "nope" in answer["cli_error"]["message"]
    assert err.startswith("alphaagent: error: ") and err.count("\n") == 1

    # Without --json, standard output stays empty: the one line goes to standard error only.
    code_plain, out_plain, _ = _run(capsys, "files", "--home", home, "--conversation", "nope")
    assert (code_plain, out_plain) == (code, "")


class _InterruptedImport(importlib.abc.MetaPathFinder):
    """Raises KeyboardInterrupt when ``alphaagent.cli`` is imported, as a Ctrl-C during the
    import would."""

    def find_spec(self, fullname: str, path: object, target: object = None) -> None:
        if fullname == "alphaagent.cli":
            raise KeyboardInterrupt
        return None


def test_ctrl_c_while_the_cli_is_importing_is_one_line_and_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delitem(sys.modules, "alphaagent.cli")
    monkeypatch.setattr(sys, "meta_path", [_InterruptedImport(), *sys.meta_path])
    assert entry.main() == 130
    out, err = capsys.readouterr()
    assert (out, err) == ("", "alphaagent: interrupted\n")


def test_artifacts_of_a_turn_that_failed_are_marked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = {
        "spec_version": 1,
        "user_id": "local",
        "scope": {"conversation_id": "c-failed"},
        "goal": "register one output, then miss the second",
        "environment_id": LIGHT_ENVIRONMENT,  # the marking, not the preload, is the subject
        "steps": [{"title": "write one", "code": "open('datasets/a.csv','w').write('x\\n1\\n')"}],
        "outputs": [
            {"kind": "dataset", "name": "a", "path": "datasets/a.csv"},
            {"kind": "dataset", "name": "b", "path": "datasets/b.csv"},
        ],
    }
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec))
    home = str(tmp_path / "home")
    register_light(Path(home))
    code, _, _ = _run(capsys, "run", str(spec_file), "--home", home)
    assert code == 1, "the turn fails on its missing second output"

    code, out, _ = _run(capsys, "artifacts", "--home", home, "--conversation", "c-failed", "--json")
    assert code == 0
    [version] = json.loads(out)
    assert (version["name"], version["turn_status"]) == ("a", "failed")

    code, out, _ = _run(capsys, "artifacts", "--home", home, "--conversation", "c-failed")
    assert "(its turn failed)" in out

    # The viewer says it too, beside the artifact and its version.
    from starlette.testclient import TestClient

    from alphaagent.viewer.app import create_app
    from alphaagent.viewer.serve import local_reader

    app = create_app(local_reader(Path(home), "local"), token="t" * 32)
    client = TestClient(app, base_url="http://127.0.0.1:8765")
    page = client.get(f"/c/c-failed/?token={'t' * 32}")
    assert page.status_code == 200
    assert "registered by a turn that failed" in page.text and "its turn failed" in page.text


def test_every_command_has_a_description_and_examples_that_parse() -> None:
    import argparse
    import shlex

    from alphaagent.cli import _EXAMPLES, _refused_option, build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in sub.choices.items():
        assert command.description, f"{name}: no description"
        assert "exit status:" in (command.epilog or ""), f"{name}: no exit statuses"
    for name, examples in _EXAMPLES.items():
        assert name in sub.choices, f"examples for a command that does not exist: {name}"
        for example in examples:
            argv = shlex.split(example.split(" | ")[-1])
            assert argv[0] == "alphaagent"
            args = parser.parse_args(argv[1:])  # a wrong flag exits 2 here
            assert args.command == name
            assert _refused_option(args, "alphaagent") is None, example


def test_a_usage_error_under_json_is_json_too(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["env", "add", "q", "--json"])
    out, err = capsys.readouterr()
    assert exited.value.code == 2
    assert json.loads(out)["cli_error"]["message"].startswith(
        "the following arguments are required: --python"
    )
    assert err.startswith("alphaagent: error: the following arguments are required")


def test_exec_without_a_workdir_runs_in_a_new_empty_folder_it_removes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], light: list[str]
) -> None:
    (tmp_path / "mine.txt").write_text("do not touch")
    monkeypatch.chdir(tmp_path)
    code_file = tmp_path / "job.py"
    code_file.write_text("import os; print(os.getcwd()); print(sorted(os.listdir())); open('x', 'w')")
    assert main(["exec", str(code_file), "--json", *light]) == 0
    result = json.loads(capsys.readouterr().out)
    folder, listing = result["stdout"].splitlines()
    assert listing == "[]" and folder != str(tmp_path) and not Path(folder).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.py", "mine.txt"]


def test_pinned_code_that_does_not_parse_is_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = {
        "spec_version": 1,
        "user_id": "local",
        "scope": {"conversation_id": "c-syntax"},
        "goal": "a typo in step 2",
        "steps": [{"title": "ok", "code": "print(1)"}, {"title": "typo", "code": "print(1"}],
    }
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec))
    home = tmp_path / "home"
    code, _, err = _run(capsys, "run", str(spec_file), "--home", str(home))
    assert code == 2
    assert err.startswith("alphaagent: error: steps[1].code: SyntaxError at line 1:")
    code, out, _ = _run(capsys, "conversations", "--home", str(home), "--json")
    assert json.loads(out) == []


_JSON_ARGV = {
    "exec": ["-"],
    "run": ["spec.json"],
    "submit": ["spec.json"],
    "demo": [],
    "help": [],
    "files": [],
    "history": [],
    "artifacts": [],
    "sessions": [],
    "turns": [],
    "conversations": [],
    "export": ["-o", "x.zip"],
    "env": ["list"],
    "env add": ["x", "--python", "p"],
    "env list": [],
    "env show": ["x"],
    "env remove": ["x"],
    "version": [],
}
"""The arguments each command with ``--json`` needs to parse."""


def _commands_with_json() -> set[str]:
    import argparse

    from alphaagent.cli import build_parser

    found: set[str] = set()

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, command in action.choices.items():
                    full = f"{prefix} {name}".strip()
                    # A command that prints no JSON takes the flag hidden, only to refuse it.
                    if any(a.dest == "json" and a.help != argparse.SUPPRESS for a in command._actions):
                        found.add(full)
                    walk(command, full)

    walk(build_parser(), "")
    return found


def test_json_means_the_same_before_or_after_the_command_name() -> None:
    from alphaagent.cli import build_parser

    # Given every command that prints JSON (a new one must be added to the table)
    assert _commands_with_json() == set(_JSON_ARGV)
    parser = build_parser()
    for name, rest in _JSON_ARGV.items():
        words = [*name.split(), *rest]
        # When --json comes before the command name, after it, or not at all
        before = parser.parse_args(["--json", *words])
        after = parser.parse_args([*words, "--json"])
        neither = parser.parse_args(words)
        # Then the first two ask for JSON and the third does not
        assert (before.json, after.json, neither.json) == (True, True, False), name


def test_a_refused_spec_under_a_leading_json_is_a_json_cli_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a spec with a typo in a field
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps({"spec_version": 1, "scope": {"conversation_id": "c"}, "gaol": "x"}))
    home = tmp_path / "home"
    # When it is run with the global --json, before the command name
    code, out, err = _run(capsys, "--json", "run", str(spec_file), "--home", str(home))
    # Then the answer is the command's error under cli_error, one line on stderr, nothing written
    assert code == 2
    answer = json.loads(out)
    assert set(answer) == {"cli_error"} and answer["cli_error"]["exit_code"] == 2
    assert "gaol" in answer["cli_error"]["message"] and err.count("\n") == 1
    assert not home.exists()


NO_JSON_ARGV = {"cat": ["--conversation", "c", "a.txt"], "serve": [], "mcp": []}
"""Every command that prints no JSON, with the arguments it needs to parse."""


@pytest.mark.parametrize("where", ["before", "after"])
@pytest.mark.parametrize("command", sorted(NO_JSON_ARGV))
def test_json_for_a_command_without_json_output_is_named(
    command: str, where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a command that prints no JSON
    words = [command, *NO_JSON_ARGV[command], "--home", str(tmp_path / "home")]
    # When --json is given before or after its name
    argv = ["--json", *words] if where == "before" else [*words, "--json"]
    code, out, err = _run(capsys, *argv)
    # Then it is refused with the one wording every such command uses, and nothing is made
    assert code == 2
    assert err == f"alphaagent: error: --json: {command} prints no JSON (see alphaagent {command} --help)\n"
    assert json.loads(out)["cli_error"]["exit_code"] == 2
    assert not (tmp_path / "home").exists()


def test_the_readme_lists_every_command_that_prints_no_json() -> None:
    from alphaagent.cli import build_parser

    # Given the README's sentence on the leading flags
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    sentence = readme[readme.index("print no JSON") - 80 : readme.index("print no JSON")]
    # Then it names every command without JSON output, which are those this test knows
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    refused = {name for name, c in sub.choices.items() if c.get_default("json_unsupported")}
    assert refused == set(NO_JSON_ARGV)
    assert all(f"`{name}`" in sentence for name in refused), sentence


@pytest.fixture(scope="module")
def bobs_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory where only bob has a conversation (``sales``, one turn), which the tests
    only read."""
    root = tmp_path_factory.mktemp("bob")
    home = root / "home"
    spec = root / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "spec_version": 1,
                "scope": {"conversation_id": "sales"},
                "goal": "one step",
                "environment_id": register_light(home),  # the identity, not the preload, is the subject
                "steps": [{"title": "hi", "code": "print('hi')"}],
            }
        )
    )
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["run", str(spec), "--user", "bob", "--home", str(home)])
    assert code == 0, err.getvalue()
    return home


@pytest.mark.parametrize("where", ["before", "after"])
def test_user_means_the_same_before_or_after_the_command_name(
    where: str, bobs_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a conversation that only bob has
    home = bobs_home
    # When bob's turns are listed with --user before or after the command name
    words = ["turns", "--conversation", "sales", "--home", str(home), "--json"]
    argv = ["--user", "bob", *words] if where == "before" else [*words, "--user", "bob"]
    code, out, err = _run(capsys, *argv)
    # Then both list bob's turn (another user would be told it is not found)
    assert code == 0, err
    assert len(json.loads(out)) == 1


def test_user_before_a_command_that_takes_none_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    # When --user is given before a command that acts for nobody
    code, _, err = _run(capsys, "--user", "bob", "env", "list")
    # Then it is refused in one line naming the command
    assert code == 2
    assert err == "alphaagent: error: --user: env list takes no --user (see alphaagent env list --help)\n"


def test_the_command_error_and_the_code_error_have_different_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], light: list[str]
) -> None:
    # Given code that fails, and a command that fails
    code_file = tmp_path / "job.py"
    code_file.write_text("1/0\n")
    code, out, _ = _run(capsys, "exec", str(code_file), "--json", *light)
    run = json.loads(out)
    bad, out_bad, _ = _run(capsys, "exec", str(tmp_path / "missing.py"), "--json")
    # Then the code's error is "error" in the result, the command's is "cli_error" alone
    assert code == 1 and set(run["error"]) == {"name", "value", "traceback"} and "cli_error" not in run
    assert bad == 2 and set(json.loads(out_bad)) == {"cli_error"}


def test_exec_names_no_spill_file_in_the_folder_it_removed_and_the_real_one_with_a_workdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], light: list[str]
) -> None:
    # Given code that prints more than a result returns (1 MiB; spilled past 16 KiB)
    monkeypatch.chdir(tmp_path)
    code_file = tmp_path / "loud.py"
    code_file.write_text("print('x' * 1_200_000)\n")  # past the 1 MiB a result returns
    # When it runs in exec's own temporary folder, as JSON and as text
    assert main(["exec", str(code_file), "--json", *light]) == 0
    result = json.loads(capsys.readouterr().out)
    assert main(["exec", str(code_file), *light]) == 0
    text = capsys.readouterr().out
    # Then no path points into the removed folder, and the text says the full output was not kept
    assert result["stdout_truncated"] and result["stdout_path"] is None
    assert "full output: not kept (the temporary folder is removed; give --workdir DIR to keep it)" in text
    # When it runs with --workdir; Then the path shown is one the user can open from here
    (tmp_path / "wd").mkdir()
    assert main(["exec", str(code_file), "--workdir", "wd", *light]) == 0
    [line] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("full output: ")]
    shown = line.removeprefix("full output: ").split()[0]
    assert shown.startswith("wd/work/runs/") and (tmp_path / shown).read_text().startswith("x" * 1000)
