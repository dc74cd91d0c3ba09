"""One wording for an id that breaks its rule (DESIGN §4.1's rules in words, the value at the end):
``must be RULE, got VALUE``, the value as JSON for a spec's field and as typed for an option or a
setting (new-user review: spec fields used pydantic's ``String should match pattern '^[A-Za-z0-9_-]
{1,80}$'`` with no value, and the CLI said the same rule three ways). A string's length and a
list's item bounds are worded the same way. In process: nothing is run."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from alphaagent.cli import main
from alphaagent.errors import InvalidSpecError
from alphaagent.models.rules import ID_RULES
from alphaagent.models.spec import Spec, parse_spec

SCOPE = "1-80 characters of letters, digits, '_' and '-'"


def _refusal(**fields: Any) -> str:
    document = {"spec_version": 1, "user_id": "ann", "scope": {"conversation_id": "c"}, "goal": "g", **fields}
    with pytest.raises(InvalidSpecError) as refused:
        parse_spec(json.dumps(document))
    return str(refused.value)


@pytest.mark.parametrize(
    ("fields", "line"),
    [
        ({"scope": {"conversation_id": "BAD!"}}, f'scope.conversation_id: must be {SCOPE}, got "BAD!"'),
        (
            {"scope": {"workflow_execution_id": "w", "node_id": "a/b"}},
            f'scope.node_id: must be {SCOPE}, got "a/b"',
        ),
        ({"user_id": "a b"}, 'user_id: must be 1-128 characters of letters, digits and . _ @ : -, got "a b"'),
        (
            {"environment_id": "GPU"},
            "environment_id: must be 1-32 characters of a-z, 0-9 and '-', starting with a letter, got \"GPU\"",
        ),
        (
            {"outputs": [{"kind": "dataset", "name": "Mass Chart"}]},
            "outputs[0].name: must be 1-64 characters of a-z, 0-9, '.', '_' and '-', starting with a letter"
            ' or digit, got "Mass Chart"',
        ),
        ({"steps": [{"title": "", "code": "x"}]}, 'steps[0].title: must be at least 1 character, got ""'),
        ({"steps": []}, "steps: must have at least 1 item, got []"),
        ({"goal": "x" * 16_001}, "goal: must be at most 16000 characters, got 16001 characters"),
    ],
)
def test_a_spec_field_says_its_rule_and_the_value_as_json(fields: dict[str, Any], line: str) -> None:
    assert _refusal(**fields) == line


def _patterns(model: type[BaseModel], seen: set[type[BaseModel]]) -> set[str]:
    found: set[str] = set()
    if model in seen:
        return found
    seen.add(model)
    for field in model.model_fields.values():
        text = repr(field.annotation) + repr(field.metadata)
        found |= set(re.findall(r"pattern='([^']*)'", text))
        from alphaagent.models.spec import _models_in

        for inner in _models_in(field.annotation):
            found |= _patterns(inner, seen)
    return found


def test_every_id_pattern_of_the_spec_has_words() -> None:
    patterns = _patterns(Spec, set())
    ulid = r"^[0-9A-HJKMNP-TV-Z]{26}$"  # turn_id: its own line (leave it out to get a fresh one)
    assert patterns and patterns - {ulid} <= set(ID_RULES), patterns - set(ID_RULES)


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["artifacts", "--conversation", "BAD!"], f"--conversation: must be {SCOPE}, got 'BAD!'"),
        (["files", "--workflow", "w", "--node", "a/b"], f"--node: must be {SCOPE}, got 'a/b'"),
        (
            ["env", "add", "BAD!ID", "--python", "/usr/bin/python3"],
            "ID: must be 1-32 characters of a-z, 0-9 and '-', starting with a letter, got 'BAD!ID'",
        ),
        (
            ["artifacts", "--conversation", "c", "--user", "a b"],
            "--user: must be 1-128 characters of letters,",
        ),
    ],
)
def test_an_option_says_the_same_rule_and_the_value_as_typed(
    argv: list[str], line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main([*argv, "--home", str(tmp_path / "home")])
    except SystemExit as exited:  # argparse's own refusal of an option's value
        code = exited.code  # type: ignore[assignment]
    assert code == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"alphaagent: error: {line}"), err
    assert err.count("\n") == 1


def test_a_setting_says_the_same_rule_and_the_value_as_typed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ALPHAAGENT_USER", "a b")
    assert main(["artifacts", "--conversation", "c", "--home", str(tmp_path / "home")]) == 2
    assert capsys.readouterr().err == (
        "alphaagent: error: $ALPHAAGENT_USER: must be 1-128 characters of letters, digits and . _ @ : -,"
        " got 'a b'\n"
    )
