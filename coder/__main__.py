"""``python -m coder``: the coder worker of the ECS service (see ``coder.worker``).

Reads ``CODER_QUEUE_URL``, ``WORKER_CONCURRENCY``, ``HEARTBEAT_SECONDS``, ``STOP_TIMEOUT_SECONDS``
and the model's variables (``coder.settings``). SIGTERM (ECS stopping the task) and SIGINT stop it:
no new message is taken and in-flight turns finish or are failed within the stop timeout.

With ``STATE_TABLE_NAME`` set (the ECS task definition in ``template.yaml``), turns run on the AWS
backend (``alphaagent.aws.backend.coder_backend``: DynamoDB, S3, EventBridge, the env functions);
without it, on the local backend under ``$ALPHAAGENT_HOME``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from types import FrameType


def main() -> int:
    """Run the worker until SIGTERM; returns the process's exit status."""
    from alphaagent.errors import AlphaAgentError
    from coder.settings import coder_settings
    from coder.worker import CoderWorker, worker_settings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        settings = worker_settings()
        model = coder_settings()
    except (ValueError, AlphaAgentError) as exc:
        print(f"coder worker: {exc}", file=sys.stderr)
        return 2
    # boto3 and the local platform only once the settings hold: a misconfigured task stops in about
    # half the time (~0.5 CPU-s less), which counts when ECS restarts it over and over.
    import boto3

    from alphaagent.api import AlphaAgent

    coder = None
    if model is not None:
        from coder.agent import make_coder

        coder = make_coder(model)
    else:
        logging.getLogger("coder").warning("no model configured: only specs with pinned steps can run")
    with contextlib.ExitStack() as resources:
        if os.environ.get("STATE_TABLE_NAME"):
            from alphaagent.aws.backend import coder_backend

            backend = coder_backend()
            notices = getattr(backend.executor, "notices", None)
            if notices is not None:  # the process's run-notice queue goes with the process
                resources.callback(notices.close)
        else:
            backend = resources.enter_context(AlphaAgent()).backend
        worker = CoderWorker(
            backend, coder, settings, sqs=boto3.client("sqs"), sfn=boto3.client("stepfunctions")
        )

        def _stop(signum: int, _frame: FrameType | None) -> None:
            logging.getLogger("coder").info("signal %d: stopping", signum)
            worker.stop()

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        worker.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
