"""The process-wide caches of tests/moto_account.py: the SDK's data files (``share_sdk_data``) and moto's
parsed state machines (``reuse_parsed_state_machines``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from moto_account import reuse_parsed_state_machines, share_sdk_data


def test_new_sessions_share_the_parsed_service_models_and_nothing_else() -> None:
    import boto3

    # Given the shared cache (conftest installs it; again here, as it is idempotent)
    share_sdk_data()
    # When two sessions load the same model
    first, second = boto3.Session(region_name="us-east-1"), boto3.Session(region_name="us-east-1")
    model = first._loader.load_service_model("sqs", "service-2")
    # Then the second reads the first's parse, not the file
    assert second._loader.load_service_model("sqs", "service-2") is model
    # And each session keeps its own event handlers
    assert second._session.get_component("event_emitter") is not first._session.get_component("event_emitter")


def test_a_loader_with_another_search_path_has_its_own_cache(tmp_path: Path) -> None:
    import boto3
    import botocore.session

    # Given a data path with a model of its own (as AWS_DATA_PATH would add)
    share_sdk_data()
    (tmp_path / "sqs" / "2012-11-05").mkdir(parents=True)
    (tmp_path / "sqs" / "2012-11-05" / "service-2.json").write_text('{"metadata": {"probe": true}}')
    session = botocore.session.Session()
    session.set_config_variable("data_path", str(tmp_path))
    # When it loads the model, Then it reads its own file, not the default path's cached parse
    assert session.get_component("data_loader").load_service_model("sqs", "service-2") == {
        "metadata": {"probe": True}
    }
    assert "probe" not in boto3.Session()._loader.load_service_model("sqs", "service-2")["metadata"]


def _entrypoint_of(definition: str) -> Any:
    """What moto's execution worker evaluates for ``definition`` (as it calls it per execution)."""
    from moto.stepfunctions.parser.backend.execution_worker import ExecutionWorker

    details = SimpleNamespace(state_machine_details=SimpleNamespace(definition=definition))
    return ExecutionWorker._get_evaluation_entrypoint(SimpleNamespace(_evaluation_details=details))  # type: ignore[arg-type]


def _components(node: Any, seen: set[int]) -> Iterator[Any]:
    from moto.stepfunctions.parser.asl.component.component import Component

    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, Component):
        yield node
        children: Any = vars(node).values()
    elif isinstance(node, dict):
        children = node.values()
    elif isinstance(node, list | tuple):
        children = node
    else:
        return
    for child in children:
        yield from _components(child, seen)


def test_a_state_machine_is_parsed_once_per_definition_with_its_heap_keys_fixed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from moto.stepfunctions.parser.asl.component.common.retry.max_attempts_decl import MaxAttemptsDecl
    from moto.stepfunctions.parser.asl.component.eval_component import EvalComponent

    # Given the shared parse, and a definition with a retrier (whose attempt count lives on the heap)
    reuse_parsed_state_machines(monkeypatch)
    task = {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke", "End": True}
    retried = {"StartAt": "A", "States": {"A": task | {"Retry": [{"ErrorEquals": ["X"], "MaxAttempts": 2}]}}}
    definition = json.dumps(retried)
    # When two executions start
    first, second = _entrypoint_of(definition), _entrypoint_of(definition)
    # Then they evaluate one program, every component of which already has its heap key
    assert first is second
    components = list(_components(first, set()))
    assert any(isinstance(c, MaxAttemptsDecl) for c in components)
    assert all(c._EvalComponent__heap_key is not None for c in components if isinstance(c, EvalComponent))
    # And another definition is parsed on its own
    assert _entrypoint_of(json.dumps(retried | {"Comment": "changed"})) is not first
