"""One settings model per process kind: a bad value is one line naming the variable, every variable
the template sets for a process is a field of that process's model (and every variable a model
needs from the template is set there), and the README's table lists every variable."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from cfn import load_template

from alphaagent.aws import settings as aws_settings
from alphaagent.cli import main
from alphaagent.errors import InvalidSettingError, MissingSettingError
from alphaagent.local.settings import LocalSettings, local_settings
from alphaagent.settings import PROCESS_KINDS, documented_variables, model_of, read_env, settings_table

pytestmark = pytest.mark.mcp_sdk  # imports the MCP SDK in this process (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]


def _template() -> dict[str, Any]:
    return load_template(ROOT / "template.yaml")


@pytest.mark.parametrize(
    ("variable", "value", "line"),
    [
        # The variable (not the model's field), the rule in the CLI's words (not pydantic's "Input
        # should be a valid number"), and the value as set, quoted: a variable's value is text.
        (
            "ALPHAAGENT_LOCK_LEASE_S",
            "soon",
            "ALPHAAGENT_LOCK_LEASE_S: must be a number of seconds > 0 and ≤ 86400, got 'soon'",
        ),
        (
            "ALPHAAGENT_LOCK_LEASE_S",
            "-1",
            "ALPHAAGENT_LOCK_LEASE_S: must be a number of seconds > 0, got '-1'",
        ),
        (
            "ALPHAAGENT_LOCK_WAIT_S",
            "nan",
            "ALPHAAGENT_LOCK_WAIT_S: must be a number of seconds from 0 to 86400, got 'nan'",
        ),
        # inf passed `> 0` and failed the first turn as a raw OverflowError (new-user review)
        (
            "ALPHAAGENT_LOCK_LEASE_S",
            "inf",
            "ALPHAAGENT_LOCK_LEASE_S: must be a number of seconds > 0 and ≤ 86400, got 'inf'",
        ),
        (
            "ALPHAAGENT_SESSION_IDLE_S",
            "0",
            "ALPHAAGENT_SESSION_IDLE_S: must be a whole number of seconds > 0, got '0'",
        ),
        (
            "ALPHAAGENT_SESSION_MAX_S",
            "8h",
            "ALPHAAGENT_SESSION_MAX_S: must be a whole number of seconds > 0, got '8h'",
        ),
        (
            "ALPHAAGENT_SESSION_MAX_S",
            "1.5",
            "ALPHAAGENT_SESSION_MAX_S: must be a whole number of seconds > 0, got '1.5'",
        ),
        (
            "ALPHAAGENT_HTTP_HOSTS",
            "https://data.example.org",
            "ALPHAAGENT_HTTP_HOSTS: 'https://data.example.org' is not a lower-case DNS host name (no scheme,"
            " port or path)",
        ),
    ],
)
def test_a_bad_local_value_is_one_line_naming_the_variable(variable: str, value: str, line: str) -> None:
    with pytest.raises(InvalidSettingError) as caught:
        read_env(LocalSettings, {variable: value})
    assert str(caught.value) == line


def test_the_cli_answers_a_bad_setting_with_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a malformed lease in the environment of a local command
    monkeypatch.setenv("ALPHAAGENT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ALPHAAGENT_LOCK_LEASE_S", "soon")
    # When a command builds the backend; Then it exits 2 with one line naming the variable
    assert main(["conversations"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "alphaagent: error: ALPHAAGENT_LOCK_LEASE_S: must be a number of seconds > 0 and ≤ 86400, got 'soon'"
    ], err


def test_the_local_settings_follow_the_environment_and_empty_is_unset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ALPHAAGENT_LOCK_WAIT_S", "5")
    assert local_settings().turn_settings().lock_wait_s == 5
    assert local_settings() is local_settings()  # read once for one environment
    monkeypatch.setenv("ALPHAAGENT_LOCK_WAIT_S", "")
    assert local_settings().turn_settings().lock_wait_s == 600


@pytest.mark.parametrize(
    ("model", "env", "message"),
    [
        (
            aws_settings.AcquireLockSettings,
            {"STATE_TABLE_NAME": "t", "LOCK_LEASE_S": "-5"},
            "LOCK_LEASE_S: must be a number of seconds > 0, got '-5'",
        ),
        (
            aws_settings.AcquireLockSettings,
            {"STATE_TABLE_NAME": "t", "LOCK_LEASE_S": "abc"},
            "LOCK_LEASE_S: must be a number of seconds > 0, got 'abc'",
        ),
        (
            aws_settings.EnvSettings,
            {"STATE_TABLE_NAME": "t", "WORKSPACES_BUCKET_NAME": "b", "ENV_SYNC_MAX_BYTES": "2GB"},
            "ENV_SYNC_MAX_BYTES: must be a whole number of bytes > 0, got '2GB'",
        ),
        (
            aws_settings.EnvSettings,
            {"STATE_TABLE_NAME": "t", "WORKSPACES_BUCKET_NAME": "b", "ENV_RUN_NOTICES": "maybe"},
            "ENV_RUN_NOTICES: must be true or false, got 'maybe'",
        ),
        (
            aws_settings.PrepareTurnSettings,
            {"STATE_TABLE_NAME": "t", "CONNECTOR_S3_PREFIXES": "open-data/*"},
            "CONNECTOR_S3_PREFIXES: 'open-data/*' is not bucket/prefix",
        ),
    ],
)
def test_a_bad_aws_value_is_one_line_naming_the_variable(
    model: type[Any], env: dict[str, str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    aws_settings.get_lambda_settings.cache_clear()
    aws_settings.get_env_settings.cache_clear()
    try:
        with pytest.raises(InvalidSettingError) as caught:
            if model is aws_settings.EnvSettings:
                aws_settings.get_env_settings()
            else:
                aws_settings.get_lambda_settings(model)
        assert str(caught.value).startswith(message) and "\n" not in str(caught.value), str(caught.value)
        assert "Input should" not in str(caught.value), str(caught.value)
    finally:
        aws_settings.get_lambda_settings.cache_clear()
        aws_settings.get_env_settings.cache_clear()


def test_a_functions_first_invocation_fails_with_the_one_line_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from alphaagent.aws.backend import get_backend

    # Given a malformed lease in a turn function's environment
    monkeypatch.setenv("STATE_TABLE_NAME", "t")
    monkeypatch.setenv("LOCK_LEASE_S", "abc")
    aws_settings.get_lambda_settings.cache_clear()
    get_backend.cache_clear()
    line = "LOCK_LEASE_S: must be a number of seconds > 0, got 'abc'"
    try:
        # When the function builds its backend (its first invocation, after a cold start)
        with caplog.at_level("ERROR"), pytest.raises(InvalidSettingError) as caught:
            get_backend(aws_settings.AcquireLockSettings)
    finally:
        aws_settings.get_lambda_settings.cache_clear()
        get_backend.cache_clear()
    # Then it fails with that line, and the function's log has it as one ERROR record
    assert str(caught.value) == line
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("ERROR", f"InvalidSettingError: {line}")
    ]


def test_a_variable_a_function_needs_is_named_when_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TURN_STATE_MACHINE_ARN", raising=False)
    monkeypatch.delenv("STATE_MACHINE_ARN", raising=False)
    aws_settings.get_lambda_settings.cache_clear()
    try:
        with pytest.raises(MissingSettingError, match=r"^TURN_STATE_MACHINE_ARN: not set"):
            aws_settings.get_lambda_settings(aws_settings.StartTurnSettings)
    finally:
        aws_settings.get_lambda_settings.cache_clear()


def test_a_bad_worker_value_names_the_variable() -> None:
    pytest.importorskip("claude_agent_sdk")
    from coder.worker import WorkerSettings

    # The variable alone (not "WORKER_CONCURRENCY (concurrency)"), the rule, the value as set
    for variable, value, line in [
        ("WORKER_CONCURRENCY", "100", "WORKER_CONCURRENCY: must be a whole number ≤ 64, got '100'"),
        ("HEARTBEAT_SECONDS", "x", "HEARTBEAT_SECONDS: must be a number of seconds > 0 and ≤ 40, got 'x'"),
    ]:
        with pytest.raises(InvalidSettingError) as caught:
            WorkerSettings.from_env({"CODER_QUEUE_URL": "q", variable: value})
        assert str(caught.value) == line


def test_a_bad_model_setting_names_the_variable_and_the_rule() -> None:
    pytest.importorskip("claude_agent_sdk")
    from alphaagent.errors import ModelConfigError
    from coder.settings import CoderSettings

    for variable, value, line in [
        (
            "CLAUDE_CODE_MAX_RETRIES",
            "x",
            "CLAUDE_CODE_MAX_RETRIES: must be a whole number from 0 to 20, got 'x'",
        ),
        ("ALPHAAGENT_MAX_BUDGET_USD", "0", "ALPHAAGENT_MAX_BUDGET_USD: must be a number > 0, got '0'"),
    ]:
        with pytest.raises(ModelConfigError) as caught:
            CoderSettings.from_env({"ANTHROPIC_API_KEY": "k", variable: value})
        assert str(caught.value) == line


def _template_set(model: type[Any]) -> set[str]:
    """The variables ``model`` expects from the template: all it documents, except its tunables
    (left at their defaults) and the ones a runtime sets (``VARIABLES``)."""
    tunables = {
        name
        for name, info in model.model_fields.items()
        if (info.json_schema_extra or {}).get("origin") == "default"
    }
    runtime = set(getattr(model, "VARIABLES", {}))
    return set(documented_variables(model)) - tunables - runtime


def _function_variables(logical_id: str) -> set[str]:
    template = _template()
    globals_ = template["Globals"]["Function"].get("Environment", {}).get("Variables", {})
    own = template["Resources"][logical_id]["Properties"].get("Environment", {}).get("Variables", {})
    return set(globals_) | set(own)


@pytest.mark.parametrize("logical_id", [*aws_settings.FUNCTION_SETTINGS, "EnvBuiltinFunction"])
def test_every_variable_the_template_sets_for_a_function_is_its_models_and_vice_versa(
    logical_id: str,
) -> None:
    model = aws_settings.FUNCTION_SETTINGS.get(logical_id, aws_settings.EnvSettings)
    assert (PROCESS_KINDS[logical_id][0]).endswith(f":{model.__name__}")
    assert _function_variables(logical_id) == _template_set(model)


def test_every_function_of_the_template_has_a_settings_model() -> None:
    functions = {
        name for name, r in _template()["Resources"].items() if r["Type"] == "AWS::Serverless::Function"
    }
    assert functions == {*aws_settings.FUNCTION_SETTINGS, "EnvBuiltinFunction"}


def test_the_coder_task_sets_only_variables_the_worker_reads_and_every_one_it_needs() -> None:
    pytest.importorskip("claude_agent_sdk")
    task = _template()["Resources"]["CoderTaskDefinition"]["Properties"]["ContainerDefinitions"][0]
    given = {variable["Name"] for variable in task["Environment"]}
    models = [model_of(path) for path in PROCESS_KINDS["coder worker"]]
    documented = set().union(*(documented_variables(model) for model in models))
    assert given <= documented, given - documented
    backend = aws_settings.CoderBackendSettings
    needed = {name for name, info in backend.model_fields.items() if info.is_required()} | {"CODER_QUEUE_URL"}
    assert needed <= given, needed - given


def test_every_variable_is_described() -> None:
    for kind, paths in PROCESS_KINDS.items():
        for path in paths:
            for variable, description in documented_variables(model_of(path)).items():
                assert re.fullmatch(r"[A-Z][A-Z0-9_]*", variable), (kind, variable)
                assert description.strip(), f"{kind}: {variable} has no description"


def test_the_readme_lists_every_variable_of_every_process() -> None:
    pytest.importorskip("claude_agent_sdk")
    readme = (ROOT / "README.md").read_text()
    assert settings_table() in readme, "README 'Settings': regenerate with python -m alphaagent.settings"
