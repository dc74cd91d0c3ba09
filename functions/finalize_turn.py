"""State machine step: record the turn's end (DESIGN §3 step 8) from the coder's output or a caught
failure."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.typing import LambdaContext

from alphaagent.aws.backend import get_backend
from alphaagent.aws.settings import FinalizeTurnSettings
from alphaagent.aws.step_errors import state_machine_errors
from alphaagent.domain.turn_steps import finalize_turn
from alphaagent.models.aws import FinalizeInput, FinalizeOutput

logger = Logger(service="alphaagent-turn")
tracer = Tracer(service="alphaagent-turn")


@state_machine_errors()
@logger.inject_lambda_context
@tracer.capture_lambda_handler
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """``FinalizeInput`` -> ``FinalizeOutput``: the turn's status and where its result is (the
    result itself stays in the turn record and the scope: the state machine's state is limited)."""
    request = parse(event=event, model=FinalizeInput)
    return FinalizeOutput.of(request, finalize_turn(get_backend(FinalizeTurnSettings), request)).model_dump(
        mode="json"
    )
