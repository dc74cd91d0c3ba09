"""The AWS environment registry (issue 12, item 4) under moto: ``DynamoEnvironmentRegistry`` over the
state table, and ``python -m alphaagent.aws.env_deploy``, which ``make env-deploy`` runs once an
environment's stack is deployed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from alphaagent.aws import env_deploy
from alphaagent.aws.environments import DynamoEnvironmentRegistry
from alphaagent.aws.store import create_table
from alphaagent.environments import BUILTIN_PACKAGES, Environment, LambdaStart, check_environment
from alphaagent.errors import InvalidRequestError, InvalidSpecError

REGION = "eu-west-1"
TABLE = "alphaagent-state-registry"
IMAGE = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/alphaagent-env-gpu-ml:abc"


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    import boto3
    from moto import mock_aws

    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
    }.items():
        monkeypatch.setenv(name, value)
    with mock_aws():
        create_table(boto3.client("dynamodb", region_name=REGION), TABLE)
        yield TABLE


def gpu_ml(**fields: object) -> Environment:
    return Environment.model_validate(
        {
            "environment_id": "gpu-ml",
            "description": "torch",
            "start": LambdaStart(function_name="alphaagent-env-gpu-ml", image_uri=IMAGE),
            "packages": ("torch==2.9.0",),
        }
        | fields
    )


def test_builtin_is_always_there_and_a_registered_environment_is_read_back(table: str) -> None:
    registry = DynamoEnvironmentRegistry(table)
    # Given an empty table, builtin is the one environment, with its packages
    [builtin] = registry.list()
    assert builtin.environment_id == "builtin" and builtin.packages == BUILTIN_PACKAGES
    assert registry.get("gpu-ml") is None
    # When gpu-ml is registered, Then it is read back whole, after builtin
    registry.register(gpu_ml())
    assert [e.environment_id for e in registry.list()] == ["builtin", "gpu-ml"]
    assert registry.get("gpu-ml") == gpu_ml().model_copy(
        update={"registered_at": registry.get("gpu-ml").registered_at}
    )  # type: ignore[union-attr]
    assert check_environment(registry, "gpu-ml").packages == ("torch==2.9.0",)


def test_a_removed_environment_is_refused_naming_the_available_ones(table: str) -> None:
    registry = DynamoEnvironmentRegistry(table)
    registry.register(gpu_ml())
    registry.register(gpu_ml(environment_id="stats", start=LambdaStart(function_name="alphaagent-env-stats")))
    # When gpu-ml is removed
    registry.remove("gpu-ml")
    # Then its record is kept (removed), it is not listed, and its specs are refused
    assert registry.get("gpu-ml") is not None and registry.get("gpu-ml").status == "removed"  # type: ignore[union-attr]
    assert [e.environment_id for e in registry.list()] == ["builtin", "stats"]
    with pytest.raises(InvalidSpecError, match=r'removed environment "gpu-ml" \(available: builtin, stats\)'):
        check_environment(registry, "gpu-ml")
    with pytest.raises(InvalidSpecError, match=r'unknown environment "nope" \(available: builtin, stats\)'):
        check_environment(registry, "nope")


def test_builtin_and_a_mismatched_function_cannot_be_registered(table: str) -> None:
    registry = DynamoEnvironmentRegistry(table)
    with pytest.raises(InvalidRequestError, match="builtin is the main stack's own"):
        registry.register(
            gpu_ml(environment_id="builtin", start=LambdaStart(function_name="alphaagent-env-builtin"))
        )
    with pytest.raises(InvalidRequestError, match="runs in the function alphaagent-env-gpu-ml"):
        registry.register(gpu_ml(start=LambdaStart(function_name="alphaagent-env-other")))
    with pytest.raises(InvalidRequestError, match="builtin cannot be removed"):
        registry.remove("builtin")
    assert [e.environment_id for e in registry.list()] == ["builtin"]


def test_env_deploy_registers_from_the_core_stacks_table_with_the_packages_file(
    table: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3
    from botocore.stub import Stubber

    # Given the core stack (its StateTableName output: botocore's Stubber answers DescribeStacks, with
    # the shapes the service model checks) and an environment's packages file
    cloudformation = boto3.client("cloudformation", region_name=REGION)
    stubber = Stubber(cloudformation)
    stubber.add_response(
        "describe_stacks",
        {
            "Stacks": [
                {
                    "StackName": "alphaagent",
                    "CreationTime": datetime(2026, 1, 1, tzinfo=UTC),
                    "StackStatus": "CREATE_COMPLETE",
                    "Outputs": [{"OutputKey": "StateTableName", "OutputValue": table}],
                }
            ]
        },
        {"StackName": "alphaagent"},
    )
    stubber.activate()
    real_client = env_deploy.sdk.client
    monkeypatch.setattr(
        env_deploy.sdk,
        "client",
        lambda service, region=None: (
            cloudformation if service == "cloudformation" else real_client(service, region)
        ),
    )
    packages = tmp_path / "packages.txt"
    packages.write_text("# main ones\ntorch==2.9.0\nscikit-learn == 1.7.2\n")
    # When make env-deploy's register runs
    status = env_deploy.main(
        [
            "register",
            "--core-stack",
            "alphaagent",
            "--environment-id",
            "gpu-ml",
            "--image",
            IMAGE,
            "--packages-file",
            str(packages),
            "--memory-mb",
            "10240",
            "--timeout-s",
            "600",
        ]
    )
    # Then the environment is in the registry with its image, packages and ceilings
    assert status == 0, capsys.readouterr().err
    found = DynamoEnvironmentRegistry(table).get("gpu-ml")
    assert found is not None and isinstance(found.start, LambdaStart) and found.start.image_uri == IMAGE
    assert found.packages == ("torch==2.9.0", "scikit-learn==1.7.2")
    assert (found.limits.memory_mb, found.limits.timeout_s) == (10240, 600)
    # and list shows it, as JSON objects carrying environment_id
    assert env_deploy.main(["list", "--table", table, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert [e["environment_id"] for e in listed] == ["builtin", "gpu-ml"]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            ["--environment-id", "GPU", "--image", IMAGE],
            "environment_id: must be 1-32 characters of a-z, 0-9 and '-', starting with a letter, got 'GPU'",
        ),
        (["--environment-id", "gpu-ml", "--image", IMAGE, "--memory-mb", "64"], "limits.memory_mb:"),
        (["--environment-id", "builtin", "--image", IMAGE], "builtin is the main stack's own"),
        (
            ["--environment-id", "gpu-ml", "--image", IMAGE, "--packages-file", "/nonexistent"],
            "--packages-file:",
        ),
    ],
)
def test_bad_register_arguments_are_one_line_and_register_nothing(
    table: str, capsys: pytest.CaptureFixture[str], arguments: list[str], message: str
) -> None:
    assert env_deploy.main(["register", "--table", table, *arguments]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert [e.environment_id for e in DynamoEnvironmentRegistry(table).list()] == ["builtin"]


def test_a_core_stack_that_is_missing_or_not_a_core_stack_is_one_line() -> None:
    import boto3
    from botocore.stub import Stubber

    cloudformation = boto3.client("cloudformation", region_name=REGION)
    with Stubber(cloudformation) as stubber:
        stubber.add_client_error("describe_stacks", "ValidationError", "Stack with id nope does not exist")
        with pytest.raises(InvalidRequestError, match="--core-stack: cannot describe stack 'nope'"):
            env_deploy.table_of_stack("nope", client=cloudformation)
        created = datetime(2026, 1, 1, tzinfo=UTC)
        stubber.add_response(
            "describe_stacks",
            {"Stacks": [{"StackName": "x", "CreationTime": created, "StackStatus": "CREATE_COMPLETE"}]},
        )
        with pytest.raises(InvalidRequestError, match="has no StateTableName output"):
            env_deploy.table_of_stack("x", client=cloudformation)


def test_a_packages_file_line_that_is_not_a_requirement_names_the_line(tmp_path: Path) -> None:
    packages = tmp_path / "packages.txt"
    packages.write_text("numpy==2.4.6\nrm -rf /\n")
    with pytest.raises(InvalidRequestError, match=r"packages.txt:2: 'rm -rf /' is not a package requirement"):
        env_deploy.read_packages(packages)
