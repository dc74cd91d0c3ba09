"""The sweeper (hourly): deletes the run and turn notice queues whose owners died without deleting
them (``alphaagent.aws.queue_sweeper``)."""

from __future__ import annotations

import time
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from alphaagent.aws import sdk
from alphaagent.aws.queue_sweeper import sweep

logger = Logger(service="alphaagent-sweeper")
metrics = Metrics(namespace="alphaagent", service="alphaagent-sweeper")


@logger.inject_lambda_context
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, int]:
    """A scheduled event -> ``SweepReport`` (queues examined, deleted, kept)."""
    report = sweep(sdk.client("sqs"), now=time.time())
    metrics.add_metric(name="NoticeQueuesSwept", unit=MetricUnit.Count, value=report.deleted)
    logger.info("swept", examined=report.examined, deleted=report.deleted, kept=report.kept)
    return report.model_dump()
