"""The error contract between the turn machine and the code it waits on (issue 9, STYLE §4 and §6).

Step Functions matches ``ErrorEquals`` against the exact ``errorType`` (a Lambda's concrete class
name, the worker's ``SendTaskFailure`` error): inheritance does not count. These tests read the
contract each producer declares (``state_machine_errors`` on each step's handler,
``coder.worker.FAILURE_CONTRACT``) and fail both ways: a name the machine retries or catches that no
producer can send, and a name a producer can send that the machine neither retries nor catches by
name. No AWS.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from botocore.exceptions import ClientError, EndpointConnectionError
from cfn import load_template

import alphaagent.errors
from alphaagent.aws.step_errors import state_machine_errors
from alphaagent.errors import (
    AlphaAgentError,
    InvalidSpecError,
    NotFoundError,
    RetryableError,
    ScopeBusyError,
    StoreConflictError,
    contract_name,
)
from coder.worker import FAILURE_CONTRACT, FAILURE_NAMES

ROOT = Path(__file__).resolve().parents[2]
ASL = ROOT / "statemachines" / "turn.asl.yaml"
ASL_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""``yaml.safe_load``'s loader with libyaml's parser where installed (the same data, a tenth of the CPU)."""
SERVICE_ERROR = re.compile(r"(States|Lambda|SQS|EventBridge)\.\w+$")
"""Names Step Functions or the integrated service produce, not our code."""

ERROR_CLASSES = [
    value
    for value in vars(alphaagent.errors).values()
    if inspect.isclass(value) and issubclass(value, AlphaAgentError)
]


def _states() -> dict[str, Any]:
    states: dict[str, Any] = yaml.load(ASL.read_text(), Loader=ASL_LOADER)["States"]
    return states


def _names(rules: list[dict[str, Any]]) -> set[str]:
    return {name for rule in rules for name in rule["ErrorEquals"] if not SERVICE_ERROR.match(name)}


def _invoking(states: dict[str, Any]) -> dict[str, Any]:
    """The ``lambda:invoke`` Task states of ``states``."""
    return {
        name: state
        for name, state in states.items()
        if state.get("Resource") == "arn:aws:states:::lambda:invoke"
    }


def _lambda_handlers() -> dict[str, Any]:
    """Each ``lambda:invoke`` Task state -> the handler of the function the template substitutes."""
    template = load_template(ROOT / "template.yaml")
    substitutions = template["Resources"]["TurnStateMachine"]["Properties"]["DefinitionSubstitutions"]
    handlers = {}
    for name, state in _invoking(_states()).items():
        variable = re.fullmatch(r"\$\{(\w+)\}", state["Parameters"]["FunctionName"])
        assert variable, f"{name}: FunctionName is not a substitution"
        logical = substitutions[variable.group(1)]["Fn::GetAtt"][0]
        module, _, function = template["Resources"][logical]["Properties"]["Handler"].rpartition(".")
        handlers[name] = getattr(importlib.import_module(module.replace("/", ".")), function)
    return handlers


@functools.cache
def _contracts() -> dict[str, tuple[set[str], set[str]]]:
    """Each Task state fed by our code -> (the names it can produce, those of them that are retryable).

    Read by the first test that needs it: it imports every step's handler, and with them Powertools'
    tracer (~1 CPU-s), which a worker collecting this module should not pay."""
    contracts = {}
    for name, handler in _lambda_handlers().items():
        classes = getattr(handler, "error_contract", None)
        assert classes is not None, f"{name}: its handler has no @state_machine_errors contract"
        produced = {c.__name__ for c in classes}
        contracts[name] = (produced, {c.__name__ for c in classes if issubclass(c, RetryableError)})
    contracts["Code"] = (set(FAILURE_NAMES), set())  # a coder failure is final (DESIGN §3 step 6)
    return contracts


STATES = sorted({*_invoking(_states()), "Code"})
"""The Task states fed by our code (the keys of ``_contracts()``), listed at collection from the
machine's definition alone: the parametrize ids need only names."""


@pytest.mark.parametrize("state", STATES)
def test_every_name_a_step_retries_or_catches_is_one_it_can_produce(state: str) -> None:
    # Given the Task state's Retry and Catch, and the names its producer can send
    task = _states()[state]
    produced, _ = _contracts()[state]

    # Then nothing is matched that never arrives (a base class, a renamed class, a typo)
    matched = _names(task.get("Retry", [])) | _names(task.get("Catch", []))
    assert matched <= produced, f"{state}: matches {sorted(matched - produced)}, never produced"


@pytest.mark.parametrize("state", STATES)
def test_every_name_a_step_can_produce_is_retried_or_caught_by_name(state: str) -> None:
    # Given the names the step's producer can send
    task = _states()[state]
    produced, retryable = _contracts()[state]

    # Then each retryable one is retried, each other one caught by name, and the rest by States.ALL
    retried, caught = _names(task.get("Retry", [])), _names(task.get("Catch", []))
    assert retryable <= retried, f"{state}: does not retry {sorted(retryable - retried)}"
    assert produced - retryable <= caught, f"{state}: does not catch {sorted(produced - retryable - caught)}"
    assert any("States.ALL" in rule["ErrorEquals"] for rule in task["Catch"]), f"{state}: no States.ALL"


@pytest.mark.parametrize(
    "error", [c for c in ERROR_CLASSES if issubclass(c, RetryableError)], ids=lambda c: c.__name__
)
def test_every_retryable_error_reaches_every_lambda_step_under_a_retried_name(error: type) -> None:
    # Given any error class of the hierarchy that says "retry me"
    for state, handler in _lambda_handlers().items():
        # When a step raises it, Then the name the machine sees is one the step's Retry lists
        name = contract_name(error.__new__(error), handler.error_contract)
        assert name in _names(_states()[state]["Retry"]), f"{state}: {error.__name__} arrives as {name}"


# ----------------------------------------------------------------------------- the mechanism


class _OwnConflict(StoreConflictError):
    """A subclass the contract does not name."""


@state_machine_errors(ScopeBusyError, NotFoundError)
def _step(error: BaseException) -> None:
    raise error


@pytest.mark.parametrize(
    ("raised", "arrives_as", "message"),
    [
        (
            _OwnConflict("the next version was taken"),
            "RetryableError",
            "_OwnConflict: the next version was taken",
        ),
        (ScopeBusyError("held"), "ScopeBusyError", "held"),
        (NotFoundError("c-1 not found"), "NotFoundError", "c-1 not found"),
        (InvalidSpecError("goal: empty"), "InvalidSpecError", "goal: empty"),
        (
            ClientError({"Error": {"Code": "ThrottlingException", "Message": "slow down"}}, "PutItem"),
            "RetryableError",
            "ClientError: An error occurred (ThrottlingException)",
        ),
        (
            EndpointConnectionError(endpoint_url="https://dynamodb"),
            "RetryableError",
            "EndpointConnectionError",
        ),
        (
            ClientError({"Error": {"Code": "AccessDeniedException", "Message": "no"}}, "GetItem"),
            "ClientError",
            "AccessDeniedException",
        ),
        (ValueError("a defect"), "ValueError", "a defect"),
    ],
)
def test_a_step_reports_each_error_under_its_contract_name_with_the_concrete_one_in_the_message(
    raised: BaseException, arrives_as: str, message: str
) -> None:
    # When the step's handler raises the error
    with pytest.raises(Exception) as caught:
        _step(raised)

    # Then Lambda's errorType (the class name) is the contract's, and the message keeps the rest
    assert type(caught.value).__name__ == arrives_as
    assert message in str(caught.value)


def test_the_worker_answers_a_subclass_under_the_name_the_code_state_catches() -> None:
    class OtherUsersScope(NotFoundError):
        """A refinement the contract does not name."""

    assert contract_name(OtherUsersScope("c-1 not found"), FAILURE_CONTRACT) == "NotFoundError"
    assert contract_name(RuntimeError("defect"), FAILURE_CONTRACT) == "RuntimeError"
