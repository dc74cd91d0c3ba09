"""The env function's claim-check protocol (DESIGN §3 step 6): which delivery of a run's request runs its
code, and how every other delivery gets the same answer.

Lambda delivers an asynchronous event at least once, so two deliveries of one ``EnvRequest`` may run at
the same time in two execution environments, and user code must never run twice on its own. Three
objects of the scope's ``work/runs/{run_id}/`` carry the protocol:

* the claim marker ``claim.json`` (``claim_key``): created only if missing (``claim_run``, one
  conditional PutObject), so exactly one delivery runs the code;
* the claim check ``result.json`` (``run_result_key``): the full run result, written LAST by the
  delivery that ran the code; its existence means the run is completely synced;
* the pointer ``EnvPointer`` (``existing_pointer``): what every delivery returns, read from the claim
  check.

A delivery that loses the claim waits for the claim check (``await_claim_check``); the winner removes
its marker once the claim check exists (``release_claim``). ``work/runs/`` is never synced down to a
run nor uploaded from one, so run code can neither claim a run in advance nor remove a claim.

Example::

    if claim_run(workspace, scope, run_id, clock=clock):
        ...  # run the code, write work/runs/{run_id}/result.json
        release_claim(workspace, scope, run_id)
    else:
        pointer = await_claim_check(request, workspace, budget_s=600.0, clock=clock)
"""

from __future__ import annotations

import json
from typing import Final

from aws_lambda_powertools import Logger

from alphaagent.aws.workspace import S3Workspace
from alphaagent.clock import SYSTEM_CLOCK, Clock
from alphaagent.errors import EnvDuplicateDeliveryError
from alphaagent.models.aws import EnvPointer, EnvRequest, run_result_key
from alphaagent.models.common import Scope
from alphaagent.models.run import RunResult

RUNS_FOLDER: Final = "work/runs"
"""Spill files and claim checks of runs: written by the platform, never synced down to a run."""

CLAIM_POLL_START_S: Final = 0.1
"""Seconds before a delivery that lost the claim first looks again for the run's claim check; the pause
doubles after each look, up to ``CLAIM_POLL_MAX_S``."""

CLAIM_POLL_MAX_S: Final = 1.0
"""The longest pause, in seconds, between two looks for the claim check of a run claimed by another
delivery (one HeadObject each)."""

logger = Logger(service="alphaagent-env")


def claim_key(run_id: str) -> str:
    """The workspace path of a run's claim marker, ``work/runs/{run_id}/claim.json``: created (only if
    missing) by the delivery of the request that runs the code, removed once the run's claim check
    exists (``release_claim``); ``{"run_id", "claimed_at"}`` (UNIX seconds), for people reading the
    bucket."""
    return f"{RUNS_FOLDER}/{run_id}/claim.json"


def claim_run(workspace: S3Workspace, scope: Scope, run_id: str, *, clock: Clock = SYSTEM_CLOCK) -> bool:
    """Create the run's claim marker if no delivery has (one conditional PutObject): True when this
    delivery is the one that runs the code, False when another one claimed it first.

    Raises:
        botocore errors: S3 failed.
    """
    marker = json.dumps({"run_id": run_id, "claimed_at": clock.time()}).encode("utf-8")
    return workspace.create_exclusive(scope, claim_key(run_id), marker)


def existing_pointer(request: EnvRequest, workspace: S3Workspace) -> EnvPointer | None:
    """The pointer of the run's claim check if it exists (one HeadObject, then one GetObject), else None.

    Raises:
        botocore errors: S3 failed.
    """
    key = run_result_key(request.run_id)
    if workspace.stat(request.scope, key) is None:
        return None
    done = RunResult.model_validate_json(workspace.read_bytes(request.scope, key))
    return EnvPointer(run_id=request.run_id, status=done.status, result_key=key)


def release_claim(workspace: S3Workspace, scope: Scope, run_id: str) -> None:
    """Remove the run's claim marker once its claim check (``result.json``) exists, so a finished run
    leaves only its result and spill files in ``work/runs/{run_id}/``.

    Safe because the claim check is written first and never removed: a delivery that claims the run
    after this looks for the claim check again before running (strong read-after-write consistency,
    so it sees it) and runs nothing. A run that ended without a claim check (a platform failure, an
    expired request) keeps its marker, so no later delivery runs its code again. A failed delete is
    only logged: the marker left behind changes nothing once the claim check exists.
    """
    try:
        workspace.delete(scope, claim_key(run_id))
    except Exception as error:  # the run is complete either way
        logger.warning("the run's claim marker was not removed", error=str(error))


def await_claim_check(
    request: EnvRequest, workspace: S3Workspace, budget_s: float, *, clock: Clock = SYSTEM_CLOCK
) -> EnvPointer:
    """The pointer of the run that another delivery of ``request`` claimed, once its claim check exists.

    Looks for ``work/runs/{run_id}/result.json`` (HeadObject), pausing ``CLAIM_POLL_START_S`` seconds
    at first and twice as long after each look, up to ``CLAIM_POLL_MAX_S``. Waits at most ``budget_s``
    seconds (what the invocation has left minus its sync margin, from the caller), and never past
    ``request.not_after`` (when the caller stops waiting, compared with ``clock.time()``); it looks at
    least once.

    Raises:
        EnvDuplicateDeliveryError: no claim check appeared in that time.
        botocore errors: S3 failed.
    """
    started = clock.monotonic()
    if request.not_after is not None:
        budget_s = min(budget_s, request.not_after - clock.time())
    deadline = started + budget_s
    delay = CLAIM_POLL_START_S
    logger.warning("duplicate delivery: another delivery claimed the run; waiting for its result")
    while True:
        pointer = existing_pointer(request, workspace)
        if pointer is not None:
            return pointer
        left = deadline - clock.monotonic()
        if left <= 0:
            raise EnvDuplicateDeliveryError(
                f"run {request.run_id}: another delivery of the same request claimed it"
                f" ({claim_key(request.run_id)}) and its result did not appear within"
                f" {clock.monotonic() - started:.1f} s; not run a second time"
            )
        clock.sleep(min(delay, left))
        delay = min(delay * 2, CLAIM_POLL_MAX_S)
