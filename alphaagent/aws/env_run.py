"""One invocation of an env function, but the parsing (DESIGN §3 step 6, §5): claim, sync down, run,
sync up, claim check.

For one ``EnvRequest`` ``run_request``

1. claims the run (``alphaagent.aws.claim``): only the delivery that created the claim marker runs the
   code; another one waits for the first one's claim check and returns the same pointer;
2. at once, looks for an earlier delivery's claim check, reads the scope's lease and reconciles the
   working copy under ``/tmp`` with the scope's listing (``alphaagent.aws.sync``): only what differs
   from S3 is downloaded (every folder but ``work/runs/``, and ``work/sessions/`` but for the run's
   own session's folder, from the same single listing); a scope whose files and carried session state
   together exceed the sync cap (``sync_cap_bytes``: half of ``/tmp``'s real size, or less if
   ``ENV_SYNC_MAX_BYTES`` says so) is refused, naming the figures and the cap;
3. runs the code in the process's warm ``Sandbox`` with the working copy as its working directory, the
   wall clock cut to what the invocation has left minus the sync margin (``sync_margin_s``: the run's
   files and the claim check, plus the largest session state at a stated throughput);
4. uploads the run's files (``alphaagent.aws.run_sync``), then the session's new live state
   (``alphaagent.aws.session_state``), each request under the deadline and lease checks;
5. writes the full run result as the claim check ``work/runs/{run_id}/result.json`` LAST;
6. tells the invoking coder process (``notify``), removes the claim marker and returns ``EnvPointer``.

A failure of user code is data (status ``error``, ``timeout``, ``killed``) and still returns a pointer.
A platform failure (a sync error, the sandbox failing) raises. Every reading of the time goes through
the ``Clock`` it is handed, so a test moves time instead of sleeping through it.

Example::

    pointer = run_request(
        request, workspace=workspace, store=store, sandbox=sandbox, max_sync_bytes=2 * 2**30,
        time_left_s=lambda: 600.0, copies=WorkingCopies(workspace),
    )
    pointer.result_key  # "work/runs/01JDQ8ZA.../result.json"
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

from aws_lambda_powertools import Logger

from alphaagent.aws.claim import (
    RUNS_FOLDER,
    await_claim_check,
    claim_run,
    existing_pointer,
    release_claim,
)
from alphaagent.aws.notices import RunNotice
from alphaagent.aws.run_sync import sync_result
from alphaagent.aws.session_state import STATE_SLACK_BYTES, state_before, state_carry, state_up
from alphaagent.aws.sync import WorkingCopies
from alphaagent.aws.workspace import S3Workspace
from alphaagent.clock import SYSTEM_CLOCK, Clock
from alphaagent.domain.names import settle_run_names
from alphaagent.errors import EnvLeaseLostError, EnvRequestExpiredError, InvalidRequestError
from alphaagent.models.aws import EnvPointer, EnvRequest, run_result_key
from alphaagent.models.run import LandlockState, RunLimits
from alphaagent.ports import Store
from alphaagent.sandbox.session import DEFAULT_STATE_MB, SESSIONS_DIR, StateRequest
from alphaagent.sandbox.supervisor import Sandbox

MiB: Final = 2**20

LEASE_CHECK_INTERVAL_S: Final = 1.0
"""Seconds between two reads of the scope's lease while a run's files are synced up."""

SYNC_MARGIN_S: Final = 30.0
"""Seconds of the invocation kept back from the run's wall clock for the upload of the run's files and
the claim check, so a run that hits its limit still ends inside Lambda's 900 s maximum function
timeout. The session state's upload is added on top (``sync_margin_s``)."""

STATE_UPLOAD_BYTES_PER_S: Final = 32 * MiB
"""The throughput, in bytes per second, the sync margin assumes for a session state's upload: about
half of the ~600 Mbit/s (75 MB/s) a Lambda function reaches to S3 in its region (the figure issue 11's
estimates used), since a state is a few large files sent by multipart upload and the function's network
is shared with the run's own files. The largest state (512 MiB + ``STATE_SLACK_BYTES``) then adds 18 s."""

MIN_RUN_TIMEOUT_S: Final = 1.0
"""The shortest wall clock a run gets, however little time the invocation has left."""

TMP_SHARE_FOR_SCOPE: Final = 2
"""The sync cap is at most ``/tmp``'s size divided by this (half): the run can write as much again."""

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

logger = Logger(service="alphaagent-env")


def sync_margin_s(state_max_bytes: int) -> float:
    """Seconds of the invocation kept back from the run for what follows it: ``SYNC_MARGIN_S`` for the
    run's files and the claim check, plus the largest session state the run may leave (``state_max_bytes``
    + ``STATE_SLACK_BYTES``) at ``STATE_UPLOAD_BYTES_PER_S``: 48 s for the default 512 MiB cap."""
    return SYNC_MARGIN_S + (state_max_bytes + STATE_SLACK_BYTES) / STATE_UPLOAD_BYTES_PER_S


def tmp_size_bytes(local_dir: Path) -> int:
    """The size in bytes of the filesystem that holds ``local_dir`` (its nearest existing folder), from
    ``statvfs``: on Lambda, ``/tmp``'s ephemeral storage (the function's ``EphemeralStorage``)."""
    folder = local_dir
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    info = os.statvfs(folder)
    return info.f_blocks * info.f_frsize


def sync_cap_bytes(setting: int | None, tmp_bytes: int) -> int:
    """The sync cap in bytes: what a scope's files and the run's session state may add up to in the
    working copy. ``tmp_bytes`` (``tmp_size_bytes``) divided by ``TMP_SHARE_FOR_SCOPE``, so the cap
    follows the function's ephemeral storage whatever stack set it; ``setting``
    (``ENV_SYNC_MAX_BYTES``) lowers it, never raises it (a scope filling ``/tmp`` would leave the run
    no room to write)."""
    cap = tmp_bytes // TMP_SHARE_FOR_SCOPE
    return cap if setting is None else min(setting, cap)


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
    state_max_bytes: int = DEFAULT_STATE_MB * MiB,
    clock: Clock = SYSTEM_CLOCK,
) -> EnvPointer:
    """Claim, sync down, run, sync up, write the claim check: the whole invocation but the parsing.

    ``max_sync_bytes``: the sync cap, in bytes (``sync_cap_bytes``; a larger scope is refused).
    ``time_left_s``: seconds the invocation has left (read after the sync down; the run gets that minus
    ``sync_margin_s(state_max_bytes)``, at most its own ``limits.timeout_s``). ``copies``: the
    process's working copies; None syncs a fresh copy that is not kept. ``notify``: called with the
    run's ``RunNotice`` right after its claim check is written, before the claim marker is removed.
    ``state_max_bytes``: cap of the session's saved live state (``alphaagent.aws.session_state``).
    ``clock``: what ``request.not_after``, the lease and the waits are measured with.

    Lambda delivers an asynchronous event at least once, and the code must never run twice on its own
    (DESIGN §3 step 6), so a request may arrive again:

    * after the first delivery finished (its claim check exists): the code is not run again and the
      existing result's pointer is returned;
    * while the first delivery still runs, in another execution environment: only the delivery that
      creates the claim marker (``alphaagent.aws.claim``; a conditional PutObject, so exactly one
      does) runs the code. Another one runs nothing and waits for the claim check outside the
      working-copy lock, then returns the same pointer.

    Only one look at the claim check is needed, and it must come after the claim: a delivery that
    creates the marker and then finds no claim check is the only one running the code, since every
    delivery writes its claim check before it removes its marker. That look, the lease read and the
    scope's listing go out together, so the fixed cost before the run is two round trips.

    Raises:
        InvalidRequestError: the run id is not 1-64 of ``[0-9A-Za-z_-]``, or the code is empty, not
            UTF-8 or over 4 MiB (``Sandbox.run``).
        EnvRequestExpiredError: the invocation started, or its run ended, after ``request.not_after``.
        EnvLeaseLostError: the request's turn does not hold its scope's lease (before the run, or
            before one of its uploads, deletes or the claim check): the turn ended and the scope may
            be the next turn's, so nothing (more) is run or kept.
        EnvDuplicateDeliveryError: another delivery claimed the run and its claim check did not appear
            in time (nothing was run here).
        EnvScopeTooLargeError: the scope's files and the session's state exceed ``max_sync_bytes``
            (nothing was run).
        SandboxError: the sandbox failed; botocore errors: S3 failed. The working copy is then
            forgotten (the next run downloads it again).
    """
    if not _RUN_ID.fullmatch(request.run_id):
        raise InvalidRequestError(f"run_id: {request.run_id!r} is not 1-64 of [0-9A-Za-z_-]")
    run = _Invocation(
        request,
        workspace=workspace,
        copies=copies or WorkingCopies(workspace),
        store=store,
        sandbox=sandbox,
        max_sync_bytes=max_sync_bytes,
        time_left_s=time_left_s,
        notify=notify,
        state_max_bytes=state_max_bytes,
        clock=clock,
    )
    with one_invocation_at_a_time(workspace.local_dir):
        pointer = run.claimed()
    if pointer is not None:
        return pointer
    # The working copies are not needed to wait, so the lock is released first.
    budget_s = time_left_s() - sync_margin_s(state_max_bytes)
    return await_claim_check(request, workspace, budget_s, clock=clock)


class _Invocation:
    """One request's run, under the working-copy lock (``claimed``)."""

    def __init__(
        self,
        request: EnvRequest,
        *,
        workspace: S3Workspace,
        copies: WorkingCopies,
        store: Store,
        sandbox: Sandbox,
        max_sync_bytes: int,
        time_left_s: Callable[[], float],
        notify: Callable[[RunNotice], None],
        state_max_bytes: int,
        clock: Clock,
    ) -> None:
        self.request, self.workspace, self.copies = request, workspace, copies
        self.store, self.sandbox, self.notify, self.clock = store, sandbox, notify, clock
        self.max_sync_bytes, self.time_left_s, self.state_max_bytes = (
            max_sync_bytes,
            time_left_s,
            state_max_bytes,
        )

    def expired(self) -> bool:
        """Whether the caller stopped waiting (``request.not_after`` passed)."""
        return self.request.not_after is not None and self.clock.time() > self.request.not_after

    def claimed(self) -> EnvPointer | None:
        """The run, if this delivery claims it; None when another delivery holds the claim."""
        request, workspace, copies = self.request, self.workspace, self.copies
        scope, key = request.scope, run_result_key(request.run_id)
        # Before the claim: a session id that cannot name a state folder runs nothing and leaves no marker.
        state = StateRequest(
            session_id=request.session_id, fresh=request.fresh, max_bytes=self.state_max_bytes
        )
        if not claim_run(workspace, scope, request.run_id, clock=self.clock):
            return None  # await_claim_check looks for the result at once: a late duplicate gets it
        check_in_time = deadline_check(request, self.store, clock=self.clock)
        with ThreadPoolExecutor(max_workers=3, thread_name_prefix="claimed") as pool:
            looked = pool.submit(existing_pointer, request, workspace)
            leased = pool.submit(check_in_time)
            # One listing serves the scope and the run's own session's live state (DESIGN §4.7): the
            # sessions' folder is excluded but for that session's, which the sync carries.
            synced = pool.submit(
                copies.sync_down,
                scope,
                max_bytes=self.max_sync_bytes,
                exclude=[RUNS_FOLDER, SESSIONS_DIR],
                carry=state_carry(request.session_id, self.state_max_bytes),
            )
        # Leaving the pool waited for all three.
        # A delivery that ended before the claim wrote its result before it removed its marker (see
        # release_claim), so the result is visible now and the code must not run again. It answers with
        # that result, not a failure: a failure destination would record the run failed after it
        # completed.
        existing = looked.result()
        if existing is not None:
            logger.warning("duplicate delivery: the run has a result already; not run again")
            release_claim(workspace, scope, request.run_id)
            return existing
        try:
            if self.expired():
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
            seconds_left = self.time_left_s()
            if request.not_after is not None:
                seconds_left = min(seconds_left, request.not_after - self.clock.time())
            run_s = seconds_left - sync_margin_s(self.state_max_bytes)
            limits, clamped = lambda_quota_limits(fit_limits(request.limits, run_s))
            result = self.sandbox.run(
                request.code,
                cwd=root,
                limits=limits,
                network=request.network,
                run_id=request.run_id,
                state=state,
            )
            if clamped:
                result = result.model_copy(update={"limits": {**result.limits, "clamped": clamped}})
            if "landlock" in self.sandbox.info:  # whether the Runtime API was out of the run's reach
                result = result.model_copy(
                    update={"landlock": LandlockState.model_validate(self.sandbox.info["landlock"])}
                )
            check_in_time()
            result = settle_run_names(root, result, key_prefix=f"{scope.key}/")
            result = sync_result(
                workspace,
                scope,
                result,
                down,
                self.max_sync_bytes,
                check_in_time=check_in_time,
                copies=copies,
            )
            # Before the claim check: a result never points at a state that is not in S3.
            _, state_error = state_up(
                copies,
                scope,
                root,
                request.session_id,
                before,
                max_bytes=self.state_max_bytes,
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
        self.notify(RunNotice(run_id=request.run_id, status=result.status))
        release_claim(workspace, scope, request.run_id)  # after the caller heard: off its path
        return EnvPointer(run_id=result.run_id, status=result.status, result_key=key)


def deadline_check(request: EnvRequest, store: Store, *, clock: Clock = SYSTEM_CLOCK) -> Callable[[], None]:
    """A check to call before each change to the scope. It raises ``EnvRequestExpiredError`` once the
    request's ``not_after`` has passed on ``clock`` (the caller stopped waiting), and
    ``EnvLeaseLostError`` when the request's turn no longer holds its scope's lease: its execution
    failed, timed out or was aborted and released the scope, which may be the next turn's now. The
    lease is read at most every ``LEASE_CHECK_INTERVAL_S`` seconds of ``clock.monotonic()`` (one
    strongly consistent GetItem). Thread-safe: the parallel uploads call it from their threads."""
    checked_at: list[float] = []
    one_read = threading.Lock()  # uploads run in parallel; one lease read serves them all

    def check() -> None:
        with one_read:
            moment = clock.monotonic()
            if not checked_at or moment - checked_at[0] >= LEASE_CHECK_INTERVAL_S:
                holder = store.lock_holder(request.scope.key, clock.utcnow())
                if not holds_lease(holder, request.turn_id):
                    raise EnvLeaseLostError(
                        f"run {request.run_id}: turn {request.turn_id} no longer holds"
                        f" {request.scope.key}; nothing (more) of the run is kept"
                    )
                checked_at[:] = [moment]
        # The deadline last: waiting for another upload's lease read takes time and the caller may
        # have given up meanwhile; the change starts right after this returns.
        if request.not_after is not None and clock.time() > request.not_after:
            raise EnvRequestExpiredError(
                f"run {request.run_id}: the caller stopped waiting before the run was synced; what was"
                " not uploaded by then was dropped, and there is no result"
            )

    return check


def holds_lease(holder: str | None, turn_id: str) -> bool:
    """Whether the lease ``holder`` is the turn ``turn_id``: the turn machine's execution is named by
    the turn id; a turn driven outside the machine (``run_turn``) holds it as ``{turn_id}/{attempt}``."""
    return holder is not None and (holder == turn_id or holder.startswith(f"{turn_id}/"))


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


def fit_limits(limits: RunLimits, seconds_left: float) -> RunLimits:
    """``limits`` with ``timeout_s`` cut to ``seconds_left`` (at least ``MIN_RUN_TIMEOUT_S``)."""
    timeout_s = min(limits.timeout_s, max(seconds_left, MIN_RUN_TIMEOUT_S))
    if timeout_s == limits.timeout_s:
        return limits
    logger.info("run timeout cut to the invocation's remaining time", timeout_s=timeout_s)
    return limits.model_copy(update={"timeout_s": timeout_s})
