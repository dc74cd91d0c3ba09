"""The recorder (DESIGN §3 steps 6–7): EventBridge events -> records in DynamoDB.

Two kinds arrive: our own events (``source: alphaagent.*``: registrations, turn and session events)
and Lambda destination records of the env functions (``source: lambda``), which become
``RunCompleted``/``RunFailed``. Recording is idempotent, so EventBridge's retries are harmless.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.typing import LambdaContext

from alphaagent.aws.backend import record_destination, record_eventbridge
from alphaagent.models.aws import DestinationEvent

logger = Logger(service="alphaagent-recorder")
tracer = Tracer(service="alphaagent-recorder")
metrics = Metrics(namespace="alphaagent", service="alphaagent-recorder")


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, str]:
    """One EventBridge event -> ``{"event_id", "detail_type"}`` of what was recorded."""
    if event.get("source") == "lambda":
        recorded = record_destination(parse(event=event, model=DestinationEvent).detail)
    else:
        recorded = record_eventbridge(event)
    metrics.add_metric(name=recorded.detail_type, unit=MetricUnit.Count, value=1)
    logger.info("recorded", event_id=recorded.event_id, detail_type=recorded.detail_type)
    return {"event_id": recorded.event_id, "detail_type": recorded.detail_type}
