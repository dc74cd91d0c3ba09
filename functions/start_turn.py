"""The starter (DESIGN §3 step 2): SpecQueue messages -> one turn execution each.

Each message body is a spec or an EventBridge ``SpecSubmitted`` event (the rule's target is the
queue). The execution is named by the turn id, so a duplicate delivery finds the existing execution
and is acknowledged: at-least-once delivery never produces two turns.

An invalid spec is logged and acknowledged, not failed: it can never succeed, and failing it would
only send it through ``maxReceiveCount`` pointless retries to the DLQ. The log line (with the message
id and the field at fault) and the ``InvalidSpecs`` metric are where it shows. Any other error
(throttling, a network failure) fails only that record, which SQS redelivers and finally
dead-letters.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from alphaagent.aws.backend import start_turn_execution
from alphaagent.aws.settings import get_lambda_settings
from alphaagent.domain.turn_steps import spec_from_message
from alphaagent.errors import InvalidSpecError
from alphaagent.models.aws import TurnInput

logger = Logger(service="alphaagent-starter")
tracer = Tracer(service="alphaagent-starter")
metrics = Metrics(namespace="alphaagent", service="alphaagent-starter")
processor = BatchProcessor(event_type=EventType.SQS)


@tracer.capture_method
def start_record(record: SQSRecord) -> str | None:
    """Start the turn of one message; returns its turn id, or None for an invalid spec (acknowledged)."""
    sent_ms = int(record.attributes.sent_timestamp or 0)
    try:
        spec = spec_from_message(record.body, message_id=record.message_id, sent_ms=sent_ms)
    except InvalidSpecError as exc:
        logger.warning("invalid spec acknowledged", message_id=record.message_id, error=str(exc))
        metrics.add_metric(name="InvalidSpecs", unit=MetricUnit.Count, value=1)
        return None
    turn = TurnInput.of(spec)
    started = start_turn_execution(
        get_lambda_settings().required("TURN_STATE_MACHINE_ARN"),
        turn.turn_id,
        turn.model_dump_json(exclude_none=True),
    )
    logger.info("turn started" if started else "duplicate acknowledged", turn_id=turn.turn_id)
    metrics.add_metric(name="TurnsStarted" if started else "DuplicateSpecs", unit=MetricUnit.Count, value=1)
    return turn.turn_id


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    """SQS batch -> ``{"batchItemFailures": [...]}`` (only the records to retry)."""
    return process_partial_response(
        event=event, record_handler=start_record, processor=processor, context=context
    )
