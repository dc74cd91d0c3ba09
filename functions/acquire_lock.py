"""State machine step: take the scope's lease for this execution (DESIGN §3 step 3).

Raises ``ScopeBusyError`` when another execution holds it; the machine's ``Retry`` on that name waits
with backoff.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.typing import LambdaContext

from alphaagent.aws.backend import get_backend
from alphaagent.aws.settings import AcquireLockSettings
from alphaagent.aws.step_errors import state_machine_errors
from alphaagent.domain.turn_steps import acquire_scope_lock
from alphaagent.errors import NotFoundError, ScopeBusyError
from alphaagent.models.aws import AcquireLockInput

logger = Logger(service="alphaagent-turn")
tracer = Tracer(service="alphaagent-turn")


@state_machine_errors(ScopeBusyError, NotFoundError)
@logger.inject_lambda_context
@tracer.capture_lambda_handler
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """``AcquireLockInput`` -> ``LockGranted``."""
    request = parse(event=event, model=AcquireLockInput)
    return acquire_scope_lock(get_backend(AcquireLockSettings), request).model_dump(mode="json")
