"""State machine step: release the scope's lease held by this execution (every exit path)."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.typing import LambdaContext

from alphaagent.aws.backend import get_backend
from alphaagent.aws.settings import ReleaseLockSettings
from alphaagent.aws.step_errors import state_machine_errors
from alphaagent.domain.turn_steps import release_scope_lock
from alphaagent.models.aws import ReleaseLockInput

logger = Logger(service="alphaagent-turn")
tracer = Tracer(service="alphaagent-turn")


@state_machine_errors()
@logger.inject_lambda_context
@tracer.capture_lambda_handler
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """``ReleaseLockInput`` -> ``LockReleased`` (the lease ``acquire_lock`` granted)."""
    request = parse(event=event, model=ReleaseLockInput)
    return release_scope_lock(
        get_backend(ReleaseLockSettings), request.lock.scope_key, request.lock.holder
    ).model_dump(mode="json")
