"""The environment function ``alphaagent-env-{environment_id}`` (a container image, DESIGN §3 step 6,
§5): one ``run_in_env`` per asynchronous invocation.

For one ``EnvRequest`` it

1. claims the run: creates ``work/runs/{run_id}/claim.json`` only if it does not exist yet (one
   conditional PutObject). Lambda delivers an asynchronous event at least once, so two deliveries of
   the same request may run at the same time in two execution environments; only the one that
   created the claim runs the code, and the other waits for the first one's claim check and returns
   the same pointer (user code never runs twice on its own, DESIGN §3 step 6). The marker is removed
   once the claim check exists (step 6), and kept if the run ends without one;
2. at once, looks for an earlier delivery's claim check, reads the scope's lease and reconciles the
   working copy under ``/tmp`` with the scope's listing (``alphaagent.aws.sync``): an execution
   environment serves one scope (tenant isolation), so the copy the last run left is kept and only
   what differs from S3 is downloaded (every folder but ``work/runs/``, the spill files and claim
   checks of earlier runs, and ``work/sessions/``, the sessions' live state, of which the same
   listing carries the run's own session's folder: one ListObjectsV2 for a warm run); a scope over
   ``ENV_SYNC_MAX_BYTES`` (default 2 GiB of the function's 4 GiB ephemeral storage, leaving room for
   what the run writes) is refused, naming its size and the cap;
   every other scope's copy is removed (nothing of another scope is visible to this run);
3. runs the code in the process's warm ``Sandbox`` with the working copy as its working directory, the
   wall clock cut to what the invocation has left minus ``SYNC_MARGIN_S`` for the upload;
4. uploads the files the run created or modified (in parallel), deletes in S3 the ones it deleted,
   uploads the spill files ``work/runs/{run_id}/stdout.txt``/``stderr.txt`` if the sandbox wrote them;
   then the session's new live state (``state_up``: the manifest last, under the same deadline and
   lease checks as the run's files);
5. writes the full run result as the claim check ``work/runs/{run_id}/result.json`` LAST: its existence
   means the run is completely synced (``LambdaExecutor`` waits for it);
6. sends the run's notice to the invoking coder process's queue (``notice_queue_url``,
   ``alphaagent.aws.notices``: "look now"; also on a platform failure), then, off the caller's path,
   removes the claim marker, and returns ``EnvPointer`` (``{"run_id", "status", "result_key"}``),
   which the OnSuccess destination carries to the recorder. The working copy stays for the scope's
   next run; after a platform failure it is forgotten and removed.

A failure of user code is data (status ``error``, ``timeout``, ``killed``) and still returns a pointer.
A platform failure (a sync error, the sandbox failing) raises, so the OnFailure destination reports the
run as ``RunFailed``. Nothing a sync leaves out is dropped silently: every file not synced down or not
uploaded is listed in the result's ``files.skipped`` with its reason.

Example (what Lambda does)::

    lambda_handler(json.loads(Path("events/env_invocation.json").read_text()), context)
    # {"run_id": "01JDQ8ZA...", "status": "ok", "result_key": "work/runs/01JDQ8ZA.../result.json"}
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from alphaagent.aws import sdk
from alphaagent.aws.notices import RunNotice, send_notice
from alphaagent.aws.session_state import state_before, state_carry, state_up
from alphaagent.aws.settings import get_env_settings
from alphaagent.aws.store import DynamoStore
from alphaagent.aws.sync import WorkingCopies, client_config
from alphaagent.aws.sync import wipe_tree as wipe_tree  # where it lived before the sync module
from alphaagent.aws.workspace import (
    SKIP_LOCAL_UNSAFE,
    SKIP_NOT_READABLE,
    SKIP_NOT_REGULAR,
    SKIP_PATH_RULE,
    S3Workspace,
    SkippedFile,
    SyncReport,
)
from alphaagent.domain.names import path_rule_broken, settle_run_names
from alphaagent.errors import (
    EnvDuplicateDeliveryError,
    EnvLeaseLostError,
    EnvRequestExpiredError,
    InvalidRequestError,
    PathRuleError,
)
from alphaagent.models.aws import EnvPointer, EnvRequest, run_result_key
from alphaagent.models.common import Scope, check_workspace_path
from alphaagent.models.run import LandlockState, RunLimits, RunResult, SkippedPath
from alphaagent.ports import Store
from alphaagent.sandbox.config import SandboxConfig
from alphaagent.sandbox.session import DEFAULT_STATE_MB, SESSIONS_DIR, StateRequest
from alphaagent.sandbox.supervisor import Sandbox

GiB: Final = 2**30

now: Callable[[], float] = time.time
"""The wall clock (UNIX seconds) that ``EnvRequest.not_after`` is compared with; tests replace it."""

sleep: Callable[[float], None] = time.sleep
"""Pauses (seconds) between two looks for the claim check of a run claimed by another delivery."""


LEASE_CHECK_INTERVAL_S: Final = 1.0
"""Seconds between two reads of the scope's lease while a run's files are synced up."""


SYNC_MARGIN_S: Final = 30.0
"""Seconds of the invocation kept back from the run's wall clock for the upload and the claim check,
so a run that hits its limit still ends inside Lambda's 900 s maximum function timeout."""

MIN_RUN_TIMEOUT_S: Final = 1.0
"""The shortest wall clock a run gets, however little time the invocation has left."""

LOCAL_DIR: Final = Path("/tmp/alphaagent-workspaces")
"""Where working copies live: Lambda's only writable filesystem is ``/tmp`` (ephemeral storage)."""

PLATFORM_FOLDERS: Final = ("spec/", "work/turns/", "work/runs/", "work/events/", "work/sessions/")
"""Folders only the platform writes: the specs the coder reads (claim checks), turn results
(``finalize_turn`` reads them), run results and spill files, event claim checks (the recorder reads
them), sessions' live state (``alphaagent.aws.session_state`` moves the run's own session's). A
run may write there in its working copy, but nothing of it is uploaded or deleted in S3: otherwise
run code could rewrite the spec of its own turn, or forge a result or an event."""

RUNS_FOLDER: Final = "work/runs"
"""Spill files and claim checks of runs: written by the platform, never synced down to a run."""

CLAIM_POLL_START_S: Final = 0.1
"""Seconds before a delivery that lost the claim first looks again for the run's claim check; the pause
doubles after each look, up to ``CLAIM_POLL_MAX_S``."""

CLAIM_POLL_MAX_S: Final = 1.0
"""The longest pause, in seconds, between two looks for the claim check of a run claimed by another
delivery (one HeadObject each)."""

DEFAULT_RUNTIME_API: Final = "127.0.0.1:9001"
"""Where Lambda's Runtime API listens when ``AWS_LAMBDA_RUNTIME_API`` does not say (the documented
default of the runtime interface)."""

LAMBDA_FILE_DESCRIPTORS: Final = 1024
"""Lambda's quota of file descriptors per execution environment (Lambda quotas, "Function
configuration, deployment, and execution": 1,024, not adjustable). A run's ``open_files`` above it
could not be set (``RLIMIT_NOFILE`` above the hard limit fails), so it is cut to this."""

LAMBDA_PROCESSES: Final = 1024
"""Lambda's quota of execution processes/threads per execution environment (same table: 1,024, not
adjustable)."""

PLATFORM_PROCESS_RESERVE: Final = 64
"""Processes and threads of the ``LAMBDA_PROCESSES`` kept for the platform (the runtime and its
threads, the supervisor, the zygote and its spare child): a run's ``processes`` is cut to the quota
minus these, so user code cannot exhaust what the platform needs to report the run."""

_RUN_ID: Final = re.compile(r"[0-9A-Za-z_-]{1,64}")

_DOWN_REASONS: Final = {
    SKIP_LOCAL_UNSAFE: "not synced down: the local path is taken by another key (a file and a folder)",
    SKIP_PATH_RULE: "not synced down: the key breaks a workspace path rule (DESIGN §4.2)",
}


def platform_owned(path: str) -> bool:
    """Whether ``path`` is in a platform folder, or is a platform folder or one of its parents (a run
    that replaces ``spec/`` or ``work/`` with a file would hide the folder from every later run)."""
    return path.startswith(PLATFORM_FOLDERS) or any(
        folder.startswith(f"{path}/") for folder in PLATFORM_FOLDERS
    )


PLATFORM_FOLDER_REASON: Final = (
    "not uploaded: spec/, work/turns/, work/runs/, work/events/ and work/sessions/ are written by the"
    " platform only"
)

_UP_REASONS: Final = {
    SKIP_NOT_REGULAR: "not uploaded: no longer a regular file (a symlink on its path, or removed)",
    SKIP_NOT_READABLE: "not uploaded: the run made it unreadable (its permissions or a folder's)",
    SKIP_PATH_RULE: "not uploaded: the name breaks a workspace path rule (DESIGN §4.2)",
}

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


@functools.cache
def get_sqs() -> Any:
    """The SQS client for run notices (created on first use), with short timeouts and one retry: a
    notice is a hint, and an unreachable SQS (a VPC without an SQS endpoint) must not hold the
    function for botocore's default minute per attempt."""
    return sdk.client("sqs", config={"connect_timeout": 2, "read_timeout": 5, "retries": {"max_attempts": 2}})


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
    workspace = get_workspace()
    tell = functools.partial(send_notice, get_sqs(), request.notice_queue_url)
    try:
        pointer = run_request(
            request,
            workspace=workspace,
            copies=working_copies(workspace),
            store=get_store(),
            sandbox=get_sandbox(),
            max_sync_bytes=get_env_settings().ENV_SYNC_MAX_BYTES,
            time_left_s=lambda: context.get_remaining_time_in_millis() / 1000,
            notify=tell,
            state_max_bytes=get_env_settings().ENV_STATE_MAX_MB * 2**20,
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


def run_request(
    request: EnvRequest,
    *,
    workspace: S3Workspace,
    store: Store,
    sandbox: Sandbox,
    max_sync_bytes: int,
    time_left_s: Callable[[], float],
    copies: WorkingCopies | None = None,
    notify: Callable[[RunNotice], None] = lambda notice: None,
    state_max_bytes: int = DEFAULT_STATE_MB * 2**20,
) -> EnvPointer:
    """Claim, sync down, run, sync up, write the claim check: the whole invocation but the parsing.

    ``max_sync_bytes``: the sync cap, in bytes (a larger scope is refused). ``time_left_s``: seconds
    the invocation has left (read after the sync down; the run gets that minus ``SYNC_MARGIN_S``, at
    most its own ``limits.timeout_s``). ``copies``: the process's working copies
    (``working_copies``); None syncs a fresh copy that is not kept. ``notify``: called with the run's
    ``RunNotice`` right after its claim check is written, before the claim marker is removed.
    ``state_max_bytes``: cap of the session's saved live state (``alphaagent.aws.session_state``).

    Lambda delivers an asynchronous event at least once, and the code must never run twice on its own
    (DESIGN §3 step 6), so a request may arrive again:

    * after the first delivery finished (its claim check exists): the code is not run again and the
      existing result's pointer is returned;
    * while the first delivery still runs, in another execution environment: only the delivery that
      creates the marker ``work/runs/{run_id}/claim.json`` (``claim_key``; a conditional PutObject, so
      exactly one does) runs the code. Another one runs nothing and waits for the claim check
      (``await_claim_check``) outside the working-copy lock, then returns the same pointer. The
      marker is removed once the claim check exists (``release_claim``, after the caller was told),
      and kept when the run ends without one, so that run's code is not run again by a later
      delivery either.

    Only one look at the claim check is needed, and it must come after the claim: a delivery that
    creates the marker and then finds no claim check is the only one running the code, since every
    delivery writes its claim check before it removes its marker. That look, the lease read and the
    scope's listing go out together, so the fixed cost before the run is two round trips.

    The marker is in ``work/runs/``, which is never synced down to a run nor uploaded from one, so run
    code can neither create it in advance nor remove it.

    Raises:
        InvalidRequestError: the run id is not 1-64 of ``[0-9A-Za-z_-]``, or the code is empty, not
            UTF-8 or over 4 MiB (``Sandbox.run``).
        EnvRequestExpiredError: the invocation started, or its run ended, after ``request.not_after``.
        EnvLeaseLostError: the request's turn does not hold its scope's lease (before the run, or
            before one of its uploads, deletes or the claim check): the turn ended and the scope may
            be the next turn's, so nothing (more) is run or kept.
        EnvDuplicateDeliveryError: another delivery claimed the run and its claim check did not appear
            in time (nothing was run here).
        EnvScopeTooLargeError: the scope's files exceed ``max_sync_bytes`` (nothing was run).
        SandboxError: the sandbox failed; botocore errors: S3 failed. The working copy is then
            forgotten (the next run downloads it again).
    """
    if not _RUN_ID.fullmatch(request.run_id):
        raise InvalidRequestError(f"run_id: {request.run_id!r} is not 1-64 of [0-9A-Za-z_-]")
    with one_invocation_at_a_time(workspace.local_dir):
        pointer = _run_locked(
            request,
            workspace,
            copies or WorkingCopies(workspace),
            store,
            sandbox,
            max_sync_bytes,
            time_left_s,
            notify,
            state_max_bytes,
        )
    if pointer is not None:
        return pointer
    # The working copies are not needed to wait, so the lock is released first.
    return await_claim_check(request, workspace, time_left_s)


def claim_key(run_id: str) -> str:
    """The workspace path of a run's claim marker, ``work/runs/{run_id}/claim.json``: created (only if
    missing) by the delivery of the request that runs the code, removed once the run's claim check
    exists (``release_claim``); ``{"run_id", "claimed_at"}`` (UNIX seconds), for people reading the
    bucket."""
    return f"{RUNS_FOLDER}/{run_id}/claim.json"


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
    request: EnvRequest, workspace: S3Workspace, time_left_s: Callable[[], float]
) -> EnvPointer:
    """The pointer of the run that another delivery of ``request`` claimed, once its claim check exists.

    Looks for ``work/runs/{run_id}/result.json`` (HeadObject), pausing ``CLAIM_POLL_START_S`` seconds
    at first and twice as long after each look, up to ``CLAIM_POLL_MAX_S``. Waits at most what the
    invocation has left (``time_left_s()``, seconds) minus ``SYNC_MARGIN_S``, and never past
    ``request.not_after`` (when the caller stops waiting); it looks at least once.

    Raises:
        EnvDuplicateDeliveryError: no claim check appeared in that time.
        botocore errors: S3 failed.
    """
    started = time.monotonic()
    budget_s = time_left_s() - SYNC_MARGIN_S
    if request.not_after is not None:
        budget_s = min(budget_s, request.not_after - now())
    deadline = started + budget_s
    delay = CLAIM_POLL_START_S
    logger.warning("duplicate delivery: another delivery claimed the run; waiting for its result")
    while True:
        pointer = _existing_pointer(request, workspace)
        if pointer is not None:
            return pointer
        left = deadline - time.monotonic()
        if left <= 0:
            raise EnvDuplicateDeliveryError(
                f"run {request.run_id}: another delivery of the same request claimed it"
                f" ({claim_key(request.run_id)}) and its result did not appear within"
                f" {time.monotonic() - started:.1f} s; not run a second time"
            )
        sleep(min(delay, left))
        delay = min(delay * 2, CLAIM_POLL_MAX_S)


def _existing_pointer(request: EnvRequest, workspace: S3Workspace) -> EnvPointer | None:
    """The pointer of the run's claim check if it exists, else None."""
    key = run_result_key(request.run_id)
    if workspace.stat(request.scope, key) is None:
        return None
    done = RunResult.model_validate_json(workspace.read_bytes(request.scope, key))
    return EnvPointer(run_id=request.run_id, status=done.status, result_key=key)


def _run_locked(
    request: EnvRequest,
    workspace: S3Workspace,
    copies: WorkingCopies,
    store: Store,
    sandbox: Sandbox,
    max_sync_bytes: int,
    time_left_s: Callable[[], float],
    notify: Callable[[RunNotice], None],
    state_max_bytes: int,
) -> EnvPointer | None:
    """The run under the working-copy lock; None when another delivery holds the claim (nothing run)."""
    scope, key = request.scope, run_result_key(request.run_id)
    # Before the claim: a session id that cannot name a state folder runs nothing and leaves no marker.
    state = StateRequest(session_id=request.session_id, fresh=request.fresh, max_bytes=state_max_bytes)
    marker = json.dumps({"run_id": request.run_id, "claimed_at": time.time()}).encode("utf-8")
    if not workspace.create_exclusive(scope, claim_key(request.run_id), marker):
        return None  # await_claim_check looks for the result at once: a late duplicate gets it
    check_in_time = _deadline_check(request, store)
    with ThreadPoolExecutor(max_workers=3, thread_name_prefix="claimed") as pool:
        looked = pool.submit(_existing_pointer, request, workspace)
        leased = pool.submit(check_in_time)
        # One listing serves the scope and the run's own session's live state (DESIGN §4.7): the
        # sessions' folder is excluded but for that session's, which the sync carries.
        synced = pool.submit(
            copies.sync_down,
            scope,
            max_bytes=max_sync_bytes,
            exclude=[RUNS_FOLDER, SESSIONS_DIR],
            carry=state_carry(request.session_id, state_max_bytes),
        )
    # Leaving the pool waited for all three.
    # A delivery that ended before the claim wrote its result before it removed its marker (see
    # release_claim), so the result is visible now and the code must not run again. It answers with
    # that result, not a failure: a failure destination would record the run failed after it completed.
    existing = looked.result()
    if existing is not None:
        logger.warning("duplicate delivery: the run has a result already; not run again")
        release_claim(workspace, scope, request.run_id)
        return existing
    try:
        if request.not_after is not None and now() > request.not_after:
            raise EnvRequestExpiredError(
                f"run {request.run_id}: the caller stopped waiting before the invocation started; not run"
            )
        leased.result()  # a turn that no longer holds its scope runs nothing there
        down = synced.result()
        root = workspace.local_root(scope)
        before = state_before(down, root, request.session_id)
        logger.info(
            "synced down",
            files=len(down.transferred),
            bytes=down.bytes_transferred,
            kept=down.kept,
            removed=len(down.removed),
            cold=down.cold,
        )
        seconds_left = time_left_s()
        if request.not_after is not None:
            seconds_left = min(seconds_left, request.not_after - now())
        limits, clamped = lambda_quota_limits(_fit_limits(request.limits, seconds_left - SYNC_MARGIN_S))
        result = sandbox.run(
            request.code,
            cwd=root,
            limits=limits,
            network=request.network,
            run_id=request.run_id,
            state=state,
        )
        if clamped:
            result = result.model_copy(update={"limits": {**result.limits, "clamped": clamped}})
        if "landlock" in sandbox.info:  # whether the Runtime API was out of the run's reach
            result = result.model_copy(
                update={"landlock": LandlockState.model_validate(sandbox.info["landlock"])}
            )
        check_in_time()
        result = settle_run_names(root, result, key_prefix=f"{scope.key}/")
        result = sync_result(
            workspace, scope, result, down, max_sync_bytes, check_in_time=check_in_time, copies=copies
        )
        # Before the claim check: a result never points at a state that is not in S3.
        _, state_error = state_up(
            copies,
            scope,
            root,
            request.session_id,
            before,
            max_bytes=state_max_bytes,
            check_in_time=check_in_time,
        )
        if state_error is not None and result.state is not None:
            result = result.model_copy(
                update={"state": result.state.model_copy(update={"save_error": state_error})}
            )
        check_in_time()
        workspace.write_bytes(scope, key, result.model_dump_json().encode("utf-8"))
    except BaseException:
        # What the run left is not known to match S3: the next run of the scope starts cold.
        copies.forget(scope)
        raise
    notify(RunNotice(run_id=request.run_id, status=result.status))
    release_claim(workspace, scope, request.run_id)  # after the caller heard: off its path
    return EnvPointer(run_id=result.run_id, status=result.status, result_key=key)


def _deadline_check(request: EnvRequest, store: Store) -> Callable[[], None]:
    """A check to call before each change to the scope. It raises ``EnvRequestExpiredError`` once the
    request's ``not_after`` has passed (the caller stopped waiting), and ``EnvLeaseLostError`` when the
    request's turn no longer holds its scope's lease: its execution failed, timed out or was aborted
    and released the scope, which may be the next turn's now. The lease is read at most every
    ``LEASE_CHECK_INTERVAL_S`` seconds (one strongly consistent GetItem). Thread-safe: the parallel
    uploads call it from their threads."""
    checked_at: list[float] = []
    one_read = threading.Lock()  # uploads run in parallel; one lease read serves them all

    def check() -> None:
        with one_read:
            moment = time.monotonic()
            if not checked_at or moment - checked_at[0] >= LEASE_CHECK_INTERVAL_S:
                holder = store.lock_holder(request.scope.key, datetime.now(UTC))
                if not holds_lease(holder, request.turn_id):
                    raise EnvLeaseLostError(
                        f"run {request.run_id}: turn {request.turn_id} no longer holds"
                        f" {request.scope.key}; nothing (more) of the run is kept"
                    )
                checked_at[:] = [moment]
        # The deadline last: waiting for another upload's lease read takes time and the caller may
        # have given up meanwhile; the change starts right after this returns.
        if request.not_after is not None and now() > request.not_after:
            raise EnvRequestExpiredError(
                f"run {request.run_id}: the caller stopped waiting before the run was synced; what was"
                " not uploaded by then was dropped, and there is no result"
            )

    return check


def holds_lease(holder: str | None, turn_id: str) -> bool:
    """Whether the lease ``holder`` is the turn ``turn_id``: the turn machine's execution is named by
    the turn id; a turn driven outside the machine (``run_turn``) holds it as ``{turn_id}/{attempt}``."""
    return holder is not None and (holder == turn_id or holder.startswith(f"{turn_id}/"))


def sync_result(
    workspace: S3Workspace,
    scope: Scope,
    result: RunResult,
    down: SyncReport,
    max_sync_bytes: int,
    *,
    check_in_time: Callable[[], None] = lambda: None,
    copies: WorkingCopies | None = None,
) -> RunResult:
    """Bring the scope in S3 up to date with what the run did; return the result as it is now true.

    ``check_in_time`` is called before each upload and delete; it raises to stop the sync (the
    request's ``not_after`` passed), and the exception propagates.

    Uploads the created and modified regular files (in parallel, through ``copies``: the working copy
    then knows them as synced), deletes the deleted ones, uploads the spill files.
    A file that is not uploaded (its name breaks a path rule, or it stopped being a regular file) is
    taken out of ``files.created``/``modified`` and ``files_changed`` and listed in ``files.skipped``,
    as is every file ``down`` left out; a spill file that is not uploaded is no longer named in
    ``stdout_path``/``stderr_path``.

    Raises:
        botocore errors: S3 failed (a platform failure).
    """
    files = result.files
    skipped = list(files.skipped)
    skipped += [_skipped(item, _DOWN_REASONS, max_sync_bytes, scope) for item in down.skipped]
    canonical: list[str] = []
    for path in [*files.created, *files.modified]:
        if platform_owned(path):
            skipped.append(SkippedPath(path=path, reason=PLATFORM_FOLDER_REASON))
        elif _canonical(scope, path):
            canonical.append(path)
        else:
            skipped.append(SkippedPath(path=path, reason=_UP_REASONS[SKIP_PATH_RULE]))
    copies = copies or WorkingCopies(workspace)
    up = copies.sync_up(scope, canonical, check=check_in_time)
    skipped += [_skipped(item, _UP_REASONS, max_sync_bytes, scope) for item in up.skipped]
    uploaded = set(up.transferred)
    deleted = [path for path in files.deleted if _canonical(scope, path) and not platform_owned(path)]
    skipped += [
        SkippedPath(path=path, reason=PLATFORM_FOLDER_REASON.replace("uploaded", "deleted"))
        for path in files.deleted
        if platform_owned(path)
    ]
    if deleted:
        check_in_time()
        copies.delete(scope, deleted)
    spills = [path for path in (result.stdout_path, result.stderr_path) if path]
    spilled = copies.sync_up(scope, spills, check=check_in_time)
    skipped += [_skipped(item, _UP_REASONS, max_sync_bytes) for item in spilled.skipped]
    created = [path for path in files.created if path in uploaded]
    modified = [path for path in files.modified if path in uploaded]
    report = files.model_copy(
        update={
            "created": created,
            "modified": modified,
            "deleted": deleted,
            "skipped": sorted(skipped, key=lambda item: (item.path, item.reason)),
        }
    )
    kept = set(spilled.transferred)
    return result.model_copy(
        update={
            "files": report,
            "files_changed": sorted({*created, *modified, *deleted}),
            "stdout_path": result.stdout_path if result.stdout_path in kept else None,
            "stderr_path": result.stderr_path if result.stderr_path in kept else None,
        }
    )


def lock_path(local_dir: Path) -> Path:
    """The lock file beside the working copies, ``{local_dir}.lock`` (outside the tree a run can
    reach through its working directory, and outside what ``wipe_tree(local_dir)`` removes)."""
    return local_dir.with_name(f"{local_dir.name}.lock")


@contextlib.contextmanager
def one_invocation_at_a_time(local_dir: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path(local_dir)`` for the body.

    Every invocation rewrites ``local_dir`` (the working copies); the lock makes that safe wherever
    processes or threads share it. Lambda runs one invocation at a time per execution environment, so
    there it never waits; in-process simulations and concurrent test runs sharing ``/tmp`` take turns
    instead of rewriting each other's working copies. The lock is released when the process dies, so
    it never outlives a crash.
    """
    local_dir.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path(local_dir), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def lambda_quota_limits(limits: RunLimits) -> tuple[RunLimits, str]:
    """``limits`` cut to what a Lambda execution environment allows, and a note naming each limit cut
    (empty when none was): ``open_files`` to ``LAMBDA_FILE_DESCRIPTORS`` and ``processes`` to
    ``LAMBDA_PROCESSES - PLATFORM_PROCESS_RESERVE``. The note goes into the run result's
    ``limits["clamped"]``, so whoever asked for more sees what the run really had and why."""
    cuts: dict[str, int] = {}
    notes: list[str] = []
    if limits.open_files > LAMBDA_FILE_DESCRIPTORS:
        cuts["open_files"] = LAMBDA_FILE_DESCRIPTORS
        notes.append(
            f"open_files {limits.open_files} -> {LAMBDA_FILE_DESCRIPTORS}"
            f" (Lambda's quota of {LAMBDA_FILE_DESCRIPTORS:,} file descriptors)"
        )
    most_processes = LAMBDA_PROCESSES - PLATFORM_PROCESS_RESERVE
    if limits.processes > most_processes:
        cuts["processes"] = most_processes
        notes.append(
            f"processes {limits.processes} -> {most_processes} (Lambda's quota of {LAMBDA_PROCESSES:,}"
            f" processes/threads, {PLATFORM_PROCESS_RESERVE} kept for the platform)"
        )
    if not cuts:
        return limits, ""
    logger.info("run limits cut to Lambda's quotas", clamped=notes)
    return limits.model_copy(update=cuts), "; ".join(notes)


def _fit_limits(limits: RunLimits, seconds_left: float) -> RunLimits:
    timeout_s = min(limits.timeout_s, max(seconds_left, MIN_RUN_TIMEOUT_S))
    if timeout_s == limits.timeout_s:
        return limits
    logger.info("run timeout cut to the invocation's remaining time", timeout_s=timeout_s)
    return limits.model_copy(update={"timeout_s": timeout_s})


def _canonical(scope: Scope, path: str) -> bool:
    """True when ``path`` is exactly the NFC spelling of a valid workspace path of ``scope``."""
    try:
        return check_workspace_path(path, prefix=f"{scope.key}/") == path
    except PathRuleError:
        return False


def _skipped(
    item: SkippedFile, reasons: dict[str, str], budget: int, scope: Scope | None = None
) -> SkippedPath:
    reason = reasons.get(item.reason, item.reason).format(budget=budget)
    if item.reason == SKIP_PATH_RULE and scope is not None:
        rule = path_rule_broken(item.path, key_prefix=f"{scope.key}/")
        reason = f"{reason}: {rule}" if rule else reason
    return SkippedPath(path=item.path, reason=reason)
