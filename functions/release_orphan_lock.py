"""Releases the lease of a turn execution that ended FAILED, ABORTED or TIMED_OUT (the rule on Step
Functions status changes): such an execution may never have reached its own release step. Its turn,
if still running (an aborted execution never reached Finalize), is recorded as failed."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.typing import LambdaContext

from alphaagent.aws.backend import get_backend
from alphaagent.aws.settings import ReleaseOrphanLockSettings
from alphaagent.domain.turn_steps import release_orphan
from alphaagent.models.aws import ExecutionStatusChange

logger = Logger(service="alphaagent-turn")
tracer = Tracer(service="alphaagent-turn")


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """``ExecutionStatusChange`` -> ``LockReleased`` (the holder is the execution's name)."""
    change = parse(event=event, model=ExecutionStatusChange).detail
    logger.info("releasing orphan lease", execution=change.name, status=change.status)
    released = release_orphan(
        get_backend(ReleaseOrphanLockSettings), change.turn_input(), change.name, change.status
    )
    return released.model_dump(mode="json")
