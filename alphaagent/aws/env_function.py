"""The environment function ``alphaagent-env-{environment_id}`` (a container image, DESIGN §3 step 6,
§5): the handler of one ``run_in_env`` per asynchronous invocation, and the process's cached clients.

The handler parses the event into an ``EnvRequest``, refuses a request for another tenant's scope, and
calls ``alphaagent.aws.env_run.run_request`` (claim, sync down, run, sync up, claim check) with the
process's warm sandbox, working copies and clients; it returns the run's ``EnvPointer``
(``{"run_id", "status", "result_key"}``), which the OnSuccess destination carries to the recorder. A
platform failure raises (the OnFailure destination reports the run as ``RunFailed``) after the run's
notice told the coder to look. Where the rest lives:

* ``alphaagent.aws.env_run``: the invocation (deadlines, the lease, the sync cap and margin);
* ``alphaagent.aws.claim``: the claim-check protocol (claim marker, claim check, pointer);
* ``alphaagent.aws.sync``, ``alphaagent.aws.run_sync``, ``alphaagent.aws.session_state``: the working
  copy, what of a run reaches S3, and the session's live state.

Example (what Lambda does)::

    lambda_handler(json.loads(Path("events/env_invocation.json").read_text()), context)
    # {"run_id": "01JDQ8ZA...", "status": "ok", "result_key": "work/runs/01JDQ8ZA.../result.json"}
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from alphaagent import clock
from alphaagent.aws import sdk
from alphaagent.aws.env_run import lock_path, run_request, sync_cap_bytes, tmp_size_bytes
from alphaagent.aws.notices import RunNotice, send_notice
from alphaagent.aws.settings import get_env_settings
from alphaagent.aws.store import DynamoStore
from alphaagent.aws.sync import WorkingCopies, client_config
from alphaagent.aws.workspace import S3Workspace
from alphaagent.errors import InvalidRequestError
from alphaagent.models.aws import EnvRequest
from alphaagent.ports import Store
from alphaagent.sandbox.config import SandboxConfig
from alphaagent.sandbox.supervisor import Sandbox

LOCAL_DIR: Final = Path("/tmp/alphaagent-workspaces")
"""Where working copies live: Lambda's only writable filesystem is ``/tmp`` (ephemeral storage)."""

DEFAULT_RUNTIME_API: Final = "127.0.0.1:9001"
"""Where Lambda's Runtime API listens when ``AWS_LAMBDA_RUNTIME_API`` does not say (the documented
default of the runtime interface)."""

logger = Logger(service="alphaagent-env")
tracer = Tracer(service="alphaagent-env")


@functools.cache
def get_store() -> Store:
    """The state table (``DynamoStore``; its client is created on first use): only the scope's lease
    is read here (``Store.lock_holder``)."""
    return DynamoStore(get_env_settings().STATE_TABLE_NAME)


@functools.cache
def get_workspace() -> S3Workspace:
    """The workspaces bucket with working copies under ``LOCAL_DIR``; its S3 client has a connection
    pool as large as the sync's transfer pool (``alphaagent.aws.sync.client_config``)."""
    client = sdk.client("s3", config=client_config())
    return S3Workspace(get_env_settings().WORKSPACES_BUCKET_NAME, client=client, local_dir=LOCAL_DIR)


SQS_CONFIG: dict[str, Any] = {
    "connect_timeout": 1,
    "read_timeout": 3,
    "retries": {"mode": "standard", "total_max_attempts": 2},
}
"""The notice client's bounds: a notice is a hint, so at most two attempts of one second to connect
(botocore's defaults, 60 s and three to five attempts, would hold the run's caller for minutes
where SQS cannot be reached; ``ENV_RUN_NOTICES`` false skips the notice altogether there)."""


@functools.cache
def get_sqs() -> Any:
    """The SQS client for run notices (created on first use), bounded by ``SQS_CONFIG``."""
    return sdk.client("sqs", config=SQS_CONFIG)


def notice_sender(queue_url: str | None) -> Callable[[RunNotice], None]:
    """What sends this invocation's run notices: to ``queue_url`` through ``get_sqs()``, or nothing
    when there is no queue or this function has no route to SQS (``ENV_RUN_NOTICES`` false: an
    environment in a VPC without an SQS endpoint, where each send would only time out)."""
    if queue_url is None or not get_env_settings().ENV_RUN_NOTICES:
        return lambda notice: None
    return functools.partial(send_notice, get_sqs(), queue_url)


@functools.cache
def working_copies(workspace: S3Workspace) -> WorkingCopies:
    """The working copies of ``workspace`` for the life of this process: what each local file was
    downloaded as, so the next run of the same scope downloads only what changed (DESIGN §3 step 6)."""
    return WorkingCopies(workspace)


def lambda_sandbox_config(local_dir: Path) -> SandboxConfig:
    """The sandbox of an env function: one run at a time (``exclusive``; after each run every other
    process of the uid is killed and ``/tmp`` emptied except the working copies in ``local_dir``, their
    lock and the sandbox's own scratch), ``process`` isolation (Lambda allows no namespaces, DESIGN
    §5), one spare child (runs are sequential), the builtin preload, and TCP connect to the Runtime
    API's port denied with Landlock where the kernel has it (``runtime_api_port``). ``hidden_paths``
    matter only at the ``namespaces`` level, so none are named (their default, the home directory,
    may not even resolve for Lambda's sandbox user)."""
    return SandboxConfig(
        exclusive=True,
        isolation="process",
        pool_size=1,
        wipe_paths=("/tmp", "/dev/shm"),
        wipe_keep=(str(local_dir), str(lock_path(local_dir))),
        hidden_paths=(),
        deny_tcp_connect_ports=(runtime_api_port(),),
    )


def runtime_api_port() -> int:
    """The TCP port of this execution environment's Runtime API (``AWS_LAMBDA_RUNTIME_API``,
    ``host:port``; 9001 by default). Runs are denied connections to it where the kernel offers
    Landlock: a run that reached it could post a response for the current invocation or take the
    next one (README, "What is isolated on Lambda")."""
    address = os.environ.get("AWS_LAMBDA_RUNTIME_API") or DEFAULT_RUNTIME_API
    _, _, port = address.rpartition(":")
    return int(port) if port.isdigit() and 1 <= int(port) <= 65535 else 9001


@functools.cache
def get_sandbox() -> Sandbox:
    """The sandbox of this process (``lambda_sandbox_config``). Its zygote starts on the first run and
    stays warm for the life of the execution environment."""
    return Sandbox(lambda_sandbox_config(get_workspace().local_dir))


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """One ``EnvRequest`` -> the run's ``EnvPointer`` as a dict (see the module docstring).

    Raises:
        pydantic.ValidationError: the event is not an ``EnvRequest``.
        InvalidRequestError: the run id or the code breaks a rule, or the scope is not the invocation's
            tenant (nothing runs).
        SandboxError, botocore errors: a platform failure (the OnFailure destination records it).
    """
    request = EnvRequest.model_validate(event)
    logger.append_keys(run_id=request.run_id, turn_id=request.turn_id, scope=request.scope.key)
    check_tenant(request, getattr(context, "tenant_id", None))
    timer = clock.get_clock()
    # The invocation's end on the clock the run is measured with (Lambda's deadline, read once).
    ends_at = timer.monotonic() + context.get_remaining_time_in_millis() / 1000
    settings, workspace = get_env_settings(), get_workspace()
    tell = notice_sender(request.notice_queue_url)
    try:
        pointer = run_request(
            request,
            workspace=workspace,
            copies=working_copies(workspace),
            store=get_store(),
            sandbox=get_sandbox(),
            max_sync_bytes=sync_cap_bytes(settings.ENV_SYNC_MAX_BYTES, tmp_size_bytes(workspace.local_dir)),
            time_left_s=lambda: ends_at - timer.monotonic(),
            notify=tell,
            state_max_bytes=settings.ENV_STATE_MAX_MB * 2**20,
            clock=timer,
        )
    except Exception:
        # The failure record comes through the OnFailure destination and the recorder; the notice
        # tells the coder to watch for it closely.
        tell(RunNotice(run_id=request.run_id, status="failed"))
        raise
    logger.info("run finished", status=pointer.status)
    return pointer.model_dump()


def check_tenant(request: EnvRequest, tenant_id: str | None) -> None:
    """Refuse a request whose scope is not the invocation's tenant (``context.tenant_id``).

    Under tenant isolation (template.yaml) Lambda gives each tenant id its own execution environments,
    and the coder invokes with ``TenantId = scope.key`` (``LambdaExecutor``): the working copy kept in
    this environment is then only ever the scope's own. A request for another scope under the same
    tenant would break that, so it runs nothing. ``tenant_id`` None (a function made without tenant
    isolation) is accepted: the sync removes every other scope's copy before each run instead.

    Raises:
        InvalidRequestError: ``tenant_id`` is set and is not ``request.scope.key``.
    """
    if tenant_id is not None and tenant_id != request.scope.key:
        raise InvalidRequestError(
            f"scope: the invocation's tenant id {tenant_id!r} is not the request's scope"
            f" {request.scope.key!r}; an execution environment serves only its own scope"
        )
