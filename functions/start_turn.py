"""The starter (DESIGN §3 step 2): SpecQueue messages -> one turn execution each.

Each message body is a spec or an EventBridge ``SpecSubmitted`` event (the rule's target is the
queue). The execution is named by the turn id, so a duplicate delivery finds the existing execution
and is acknowledged: at-least-once delivery never produces two turns.

A message the starter refuses -- not a valid spec, or a ``turn_id`` already used for a different
spec -- is acknowledged, not failed, and the submitter learns why from a ``SpecRejected`` event on
the bus (the reason, the SQS message id, and the turn id, user and scope where readable), a
``SpecsRejected`` metric and a log line. It does not go to the DLQ: it can never succeed, so failing it
would only send it through ``maxReceiveCount`` pointless retries, and the DLQ would then mix specs
that are wrong with specs the platform failed to start; the bus's archive keeps the event. Any other
error (throttling, a network failure, the bus refusing the event) fails only that record, which SQS
redelivers and finally dead-letters.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from alphaagent.aws.backend import get_event_bus, start_turn_execution
from alphaagent.aws.settings import StartTurnSettings, get_lambda_settings
from alphaagent.domain.turn_steps import rejection_of, spec_from_message
from alphaagent.errors import InvalidSpecError
from alphaagent.ids import new_ulid
from alphaagent.models.aws import TurnInput
from alphaagent.models.events import Event

logger = Logger(service="alphaagent-starter")
tracer = Tracer(service="alphaagent-starter")
metrics = Metrics(namespace="alphaagent", service="alphaagent-starter")
processor = BatchProcessor(event_type=EventType.SQS)


@tracer.capture_method
def start_record(record: SQSRecord) -> str | None:
    """Start the turn of one message; returns its turn id, or None for a refused spec (acknowledged
    after its ``SpecRejected`` event is on the bus)."""
    sent_ms = int(record.attributes.sent_timestamp or 0)
    try:
        spec = spec_from_message(record.body, message_id=record.message_id, sent_ms=sent_ms)
        turn = TurnInput.of(spec)
        started = start_turn_execution(
            get_lambda_settings(StartTurnSettings).TURN_STATE_MACHINE_ARN,
            turn.turn_id,
            turn.model_dump_json(exclude_none=True),
        )
    except InvalidSpecError as exc:
        rejected = rejection_of(record.body, message_id=record.message_id, reason=str(exc))
        get_event_bus().publish(Event.of(rejected, new_ulid()))
        logger.warning(
            "spec rejected", message_id=record.message_id, turn_id=rejected.turn_id, reason=rejected.reason
        )
        metrics.add_metric(name="SpecsRejected", unit=MetricUnit.Count, value=1)
        return None
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
