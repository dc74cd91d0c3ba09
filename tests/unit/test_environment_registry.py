"""The ``EnvironmentRegistry`` contract (DESIGN §4.9), run against every registry: ``builtin``
always answers, ``list`` is the ready ones with builtin first then by id, a removed environment is
still found (as removed) but not listed, and ``check_environment`` refuses an unknown or removed id
naming the available ones. A new registry (the AWS state table's) adds its fixture to ``REGISTRIES``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from alphaagent.environments import (
    BUILTIN_ID,
    Environment,
    EnvironmentRegistry,
    LambdaStart,
    LocalStart,
    StaticRegistry,
    builtin_local,
    check_environment,
    function_name,
)
from alphaagent.errors import InvalidSpecError
from alphaagent.local.environments import LocalEnvironmentRegistry
from alphaagent.local.store import SqliteStore

WHEN = datetime(2026, 6, 1, tzinfo=UTC)


def _environment(environment_id: str) -> Environment:
    return Environment(
        environment_id=environment_id, start=LocalStart(python=sys.executable), registered_at=WHEN
    )


# Each factory holds "zeta" and "alpha" (ready) and "gone" (removed).
def _static(_: Path) -> Iterator[EnvironmentRegistry]:
    removed = _environment("gone").model_copy(update={"status": "removed", "removed_at": WHEN})
    yield StaticRegistry([builtin_local(), _environment("zeta"), _environment("alpha"), removed])


def _local(tmp_path: Path) -> Iterator[EnvironmentRegistry]:
    with SqliteStore(tmp_path / "alphaagent.db") as store:
        registry = LocalEnvironmentRegistry(store, builtin_local())
        for environment_id in ("zeta", "alpha", "gone"):
            registry.add(_environment(environment_id))
        registry.remove("gone")
        yield registry


def _aws(_: Path) -> Iterator[EnvironmentRegistry]:
    # The state table's registry (alphaagent/aws/environments.py) under moto; its environments are
    # Lambda functions alphaagent-env-{id}, as make env-deploy records them.
    import boto3
    from moto import mock_aws

    from alphaagent.aws.environments import DynamoEnvironmentRegistry
    from alphaagent.aws.store import create_table

    with mock_aws():
        client = boto3.client("dynamodb", region_name="eu-west-1")
        create_table(client, "alphaagent-state-contract")
        registry = DynamoEnvironmentRegistry("alphaagent-state-contract", client=client)
        for environment_id in ("zeta", "alpha", "gone"):
            start = LambdaStart(function_name=function_name(environment_id))
            registry.register(_environment(environment_id).model_copy(update={"start": start}))
        registry.remove("gone")
        yield registry


REGISTRIES: dict[str, Callable[[Path], Iterator[EnvironmentRegistry]]] = {
    "static": _static,
    "local": _local,
    "aws": _aws,
}


@pytest.fixture(params=sorted(REGISTRIES))
def registry(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EnvironmentRegistry]:
    yield from REGISTRIES[request.param](tmp_path)


def test_builtin_always_answers_and_is_listed_first_then_the_ready_ones_by_id(
    registry: EnvironmentRegistry,
) -> None:
    builtin = registry.get(BUILTIN_ID)
    assert builtin is not None and builtin.status == "ready"
    assert [e.environment_id for e in registry.list()] == [BUILTIN_ID, "alpha", "zeta"]


def test_a_removed_environment_is_found_as_removed_but_not_listed(registry: EnvironmentRegistry) -> None:
    gone = registry.get("gone")
    assert gone is not None and gone.status == "removed" and gone.removed_at is not None
    assert "gone" not in [e.environment_id for e in registry.list()]
    assert registry.get("never") is None


@pytest.mark.parametrize(("environment_id", "state"), [("gone", "removed"), ("never", "unknown")])
def test_a_spec_naming_an_unknown_or_removed_environment_is_refused_naming_the_available_ones(
    registry: EnvironmentRegistry, environment_id: str, state: str
) -> None:
    with pytest.raises(InvalidSpecError) as refused:
        check_environment(registry, environment_id)
    assert str(refused.value) == (
        # the spec's value shown as JSON (alphaagent.wording's rule)
        f'environment_id: {state} environment "{environment_id}" (available: builtin, alpha, zeta)'
    )
    assert check_environment(registry, "alpha").environment_id == "alpha"
