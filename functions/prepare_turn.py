"""State machine step: prepare the turn (DESIGN §3 step 4) with the scope's lease held."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.typing import LambdaContext

from alphaagent.aws.backend import get_backend
from alphaagent.aws.settings import PrepareTurnSettings
from alphaagent.aws.step_errors import state_machine_errors
from alphaagent.domain.turn_steps import prepare_turn
from alphaagent.errors import InvalidSpecError, NotFoundError
from alphaagent.models.aws import PrepareInput

logger = Logger(service="alphaagent-turn")
tracer = Tracer(service="alphaagent-turn")


@state_machine_errors(InvalidSpecError, NotFoundError)
@logger.inject_lambda_context
@tracer.capture_lambda_handler
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """``PrepareInput`` -> ``PreparedTurn``."""
    turn_input = parse(event=event, model=PrepareInput)
    return prepare_turn(get_backend(PrepareTurnSettings), turn_input).model_dump(mode="json")
