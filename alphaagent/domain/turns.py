"""The turn's lifecycle (DESIGN §3, steps 3–8) and its local driver, in-process: the scope lease,
the claim and the session, the coding step and the turn's end, shared with the AWS state machine's
steps (``turn_steps``). A turn's inputs are ``inputs``; the steps driver for pinned code is ``pinned``.

lock the scope (a lease that expires) -> prepare (claim, session, ``spec/{turn_id}.json``, inputs
into ``docs/``) -> code (pinned steps, or the coder) -> finalize (turn record, result JSON,
``TurnCompleted``/``TurnFailed``) -> unlock. The AWS state machine performs the same steps with the
same functions.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Final

from alphaagent import connectors
from alphaagent.domain.artifacts import check_output_paths
from alphaagent.domain.audit import audit_scope
from alphaagent.domain.backend import Backend
from alphaagent.domain.inputs import (
    ResolvedInput,
    bring_inputs,
    check_connector_inputs,
    resolve_inputs,
)
from alphaagent.domain.labels import scope_label as scope_label  # re-exported: named here before
from alphaagent.domain.pinned import StepFailed, run_steps
from alphaagent.domain.sessions import session_for_turn
from alphaagent.domain.tools import (
    TurnContext,
)
from alphaagent.environments import BUILTIN_ID, check_environment
from alphaagent.errors import (
    AlphaAgentError,
    InvalidSpecError,
    NotFoundError,
    PathRuleError,
    ScopeBusyError,
    ToolError,
)
from alphaagent.ids import new_ulid
from alphaagent.models.common import NodeScope, Scope, utcnow
from alphaagent.models.events import Event, TurnCompleted, TurnFailed, TurnStarted
from alphaagent.models.records import PreparedInput, Session, Turn, TurnResult
from alphaagent.models.run import RunError
from alphaagent.models.spec import (
    TURN_ID_REUSED,
    ConnectorInput,
    NodeArtifactInput,
    Spec,
    check_spec_rules,
)
from alphaagent.ports import OutputSink
from alphaagent.wording import shown_json

Coder = Callable[[TurnContext], str]
"""Writes and runs code for a spec without steps; returns the turn's summary (issue 5)."""

Progress = Callable[[str], None]


TURN_CANCELLED: Final = "TurnCancelled"
"""The error name of a turn that an interrupt (Ctrl-C) ended: its run was killed with no result, so
``history`` says where it happened instead of showing nothing."""


def check_spec_against(backend: Backend, spec: Spec, coder: Coder | None) -> None:
    """Refuse, before anything is written, a spec this backend cannot run."""
    environment = check_environment(backend.environments, spec.environment_id)
    if environment.environment_id == BUILTIN_ID:
        # Pinned code that cannot even parse fails before the conversation, the session or the
        # inputs exist (the builtin interpreter is this one; another environment's Python may
        # accept syntax this one does not, so its steps are left to run).
        for i, step in enumerate(spec.steps or []):
            try:
                compile(step.code, f"steps[{i}].code", "exec", dont_inherit=True)
            except SyntaxError as exc:
                raise InvalidSpecError(
                    f"steps[{i}].code: {type(exc).__name__} at line {exc.lineno}: {exc.msg}"
                ) from None
            except ValueError as exc:  # NUL bytes in the source
                raise InvalidSpecError(f"steps[{i}].code: {exc}") from None
    if spec.steps is None and coder is None:
        raise InvalidSpecError(
            "steps: this spec has no pinned steps and no model is configured; set ANTHROPIC_API_KEY"
            " (or CLAUDE_CODE_USE_BEDROCK=1 with AWS_REGION) so the coder can write the code, or add steps"
        )
    check_spec_rules(spec)  # parse_spec checked them already; a Spec may have been built otherwise
    check_output_paths(spec.scope, spec.outputs)
    for i, item in enumerate(spec.inputs):
        if isinstance(item, NodeArtifactInput) and not isinstance(spec.scope, NodeScope):
            raise InvalidSpecError(f"inputs[{i}]: node_artifact inputs need a workflow node scope")
        if isinstance(item, ConnectorInput):
            # The registry knows every connector and its request model: an unknown one, or a
            # request with a missing, mistyped or unknown field, is refused before anything runs.
            try:
                connectors.connector(item.connector)
                connectors.check_request(item.connector, item.request)
            except ToolError as exc:
                raise InvalidSpecError(f"inputs[{i}].{exc}") from None


def check_output_names(backend: Backend, spec: Spec) -> None:
    """Refuse, before anything is written or run, an output whose name is already an artifact of
    another kind in the scope: its registration after the code would be refused (one name, one
    kind: ``register_artifact``), so the turn could never finish. Only for the scope's owner (called
    after the ownership check): another user's names are never looked at. Raises
    ``InvalidSpecError`` naming ``outputs[i].name``; the registration checks again (a concurrent turn
    may register the name meanwhile)."""
    for i, output in enumerate(spec.outputs):
        latest = backend.store.get_artifact(spec.user_id, spec.scope.key, output.name, None)
        if latest is not None and latest.kind != output.kind:
            raise InvalidSpecError(
                f"outputs[{i}].name: {shown_json(output.name)} is already a {latest.kind} in this scope;"
                f" give the {output.kind} another name"
            )


class _Lease:
    """The scope's lease, renewed in the background while the turn runs (a crashed turn's lease
    simply expires, so it never blocks the scope for longer than ``lease_s``)."""

    def __init__(self, backend: Backend, scope_key: str, holder: str) -> None:
        self.backend, self.scope_key, self.holder = backend, scope_key, holder
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost = False

    def hold(self) -> None:
        """Take over renewing a lease ``holder`` acquired elsewhere (the state machine's AcquireLock
        step). Raises ``ScopeBusyError`` if it is no longer ``holder``'s."""
        if not self.backend.store.renew_lock(
            self.scope_key, self.holder, self.backend.clock.utcnow(), self.backend.turns.lock_lease_s
        ):
            raise ScopeBusyError(
                f"{self.scope_key}: the lease of {self.holder} is gone; another turn may own it"
            )
        self._start_renewing()

    def acquire(self, say: Progress, label: str) -> None:
        """Take the lease, waiting up to ``TurnSettings.lock_wait_s`` for a busy scope (``label`` in
        messages); ``say`` is told when the wait starts, for how long at most, and when it ends."""
        settings, clock = self.backend.turns, self.backend.clock
        started = clock.monotonic()
        deadline = started + settings.lock_wait_s
        delay = 0.05
        waited = False
        while not self.backend.store.acquire_lock(
            self.scope_key, self.holder, clock.utcnow(), settings.lock_lease_s
        ):
            if not waited:
                waited = True
                say(
                    f"{label} is busy: another turn is running there; waiting for it"
                    f" (at most {settings.lock_wait_s:g} s)"
                )
            if clock.monotonic() >= deadline:
                raise ScopeBusyError(
                    f"{self.scope_key}: another turn is running there; waited {settings.lock_wait_s:g} s;"
                    " try again later"
                )
            clock.sleep(delay)
            delay = min(delay * 2, 1.0)
        if waited:
            say(f"{label} is free after {clock.monotonic() - started:.1f} s of waiting")
        self._start_renewing()

    def _start_renewing(self) -> None:
        self._thread = threading.Thread(target=self._renew, name=f"lease-{self.holder}", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        lease, clock = self.backend.turns.lock_lease_s, self.backend.clock
        # The renewals' pace is real time (the thread must wake while the turn runs); what a lease
        # ends at is the clock's.
        while not self._stop.wait(lease / 3):
            if not self.backend.store.renew_lock(self.scope_key, self.holder, clock.utcnow(), lease):
                self.lost = True  # paused past the lease (a sleeping laptop): another turn may own it
                return

    def held(self) -> bool:
        """False once a renewal failed: the turn must not run, register or finish any more."""
        return not self.lost

    def stop_renewing(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def release(self) -> None:
        self.stop_renewing()
        self.backend.store.release_lock(self.scope_key, self.holder)


def run_turn(
    backend: Backend,
    spec: Spec,
    *,
    coder: Coder | None = None,
    progress: Progress | None = None,
    on_output: OutputSink | None = None,
) -> TurnResult:
    """Run one turn of ``spec`` end to end and return its result (also stored and published).
    ``progress`` is told each step; ``on_output`` gets each run's output as it is produced.

    An interrupt (``KeyboardInterrupt``, Ctrl-C) while the turn runs kills the run, records the
    turn as failed (``TurnCancelled``), releases the lease and is raised again.

    Raises ``InvalidSpecError`` for a spec this backend cannot run (nothing written),
    ``NotFoundError`` when the scope belongs to another user (the same answer as for a scope that
    cannot be found), ``ScopeBusyError`` when the scope stays locked. A failing step or coder ends
    the turn as ``failed`` (a result, not an exception).
    """
    say = progress or (lambda _message: None)
    check_spec_against(backend, spec, coder)
    scope, user_id = spec.scope, spec.user_id
    owner = backend.store.owner_of(scope.owner_key)
    if owner is not None and owner != user_id:
        audit_scope(backend.audit, user_id, scope)
        raise NotFoundError(f"{scope_label(scope)} not found")
    if owner is not None:
        check_output_names(backend, spec)
    turn_id = spec.turn_id or new_ulid()
    existing = backend.store.get_turn(user_id, turn_id)
    if existing is not None and existing.scope_key != scope.key:
        raise InvalidSpecError(f"turn_id: already used in another scope ({existing.scope_key}); leave it out")
    if existing is not None:
        check_same_spec(existing, spec)
    if existing is not None and existing.result is not None:
        say(f"turn {turn_id} was already delivered; showing its result (nothing ran)")
        return existing.result  # a duplicate delivery: acknowledged, never a second turn
    if existing is None and backend.store.turn_id_taken(turn_id):
        # Turn ids are global idempotency keys (ULIDs: unguessable). Another user's id is refused
        # before anything is written; nothing of that turn is revealed.
        raise InvalidSpecError("turn_id: already used; leave it out to get a fresh one")
    # A scope nobody owns yet has no documents or datasets, and connectors do not depend on the
    # scope: its inputs are checked and fetched before the lease, so a refused input writes nothing.
    # An owned scope's inputs are fetched under the lease (its documents may change until then), but
    # its connector inputs are checked first: a bad one is refused without waiting for a busy scope.
    if owner is not None:
        check_connector_inputs(backend, spec)
    inputs = resolve_inputs(backend, spec) if owner is None else None
    # Each attempt holds the lease under its own name, so a duplicate of a running turn waits for
    # it instead of sharing (and then releasing) its lease.
    lease = _Lease(backend, scope.key, f"{turn_id}/{new_ulid()}")
    lease.acquire(say, scope_label(scope))
    try:
        existing = backend.store.get_turn(user_id, turn_id)
        if existing is not None:
            check_same_spec(existing, spec)
            if existing.result is not None:
                return existing.result
            # Still "running" while we hold the lease: its process died and its lease expired.
            return record_turn_end(backend, existing, _abandoned(existing.turn_id))
        return _locked_turn(backend, spec, turn_id, coder, say, lease, on_output, inputs)
    finally:
        lease.release()


def check_same_spec(turn: Turn, spec: Spec) -> None:
    """Refuse ``spec`` for the existing ``turn`` unless it is the spec the turn runs: a turn id is an
    idempotency key for one spec (a redelivery replays; a new spec under an old id would silently get
    the old result). A turn recorded without a digest accepts any spec.

    Raises:
        InvalidSpecError: the turn's spec digest differs from ``spec.digest()``.
    """
    if turn.spec_sha256 is not None and turn.spec_sha256 != spec.digest():
        raise InvalidSpecError(TURN_ID_REUSED)


def abandon_turn(backend: Backend, user_id: str, turn_id: str, reason: str) -> bool:
    """Record a turn that is still ``running`` as failed (``TurnAbandoned``) and publish
    ``TurnFailed``: for a process that must stop before its turn ends (a worker at its stop
    deadline). The scope's lease then simply expires. Returns False if the turn had ended already."""
    turn = backend.store.get_turn(user_id, turn_id)
    if turn is None or turn.status != "running":
        return False
    error = RunError(name="TurnAbandoned", value=reason, traceback="")
    record_turn_end(backend, turn, TurnResult(turn_id=turn_id, status="failed", error=error))
    return True


def claim_scope_and_session(
    backend: Backend, spec: Spec, turn_id: str, now: datetime
) -> tuple[Session, bool]:
    """Claim the scope for the spec's user (``NotFoundError`` if another user has it), make its
    folders, and get or create the user's session there: ``(session, created)``. Shared by the
    local turn driver and the AWS prepare step."""
    scope, user_id = spec.scope, spec.user_id
    if backend.store.claim_owner(scope.owner_key, user_id, now) != user_id:
        audit_scope(backend.audit, user_id, scope)
        raise NotFoundError(f"{scope_label(scope)} not found")
    backend.workspace.ensure_scope(scope)
    return session_for_turn(
        backend.store,
        backend.bus,
        user_id=user_id,
        scope=scope,
        turn_id=turn_id,
        now=now,
        idle_timeout_s=backend.turns.session_idle_timeout_s,
        max_lifetime_s=backend.turns.session_max_lifetime_s,
        drop_state=lambda session_id: backend.workspace.drop_session_state(scope, session_id),
    )


def start_turn(backend: Backend, spec: Spec, turn_id: str, session: Session, now: datetime) -> Turn | None:
    """Create the turn's record (``running``, in ``session``) and publish ``TurnStarted``; None if a
    turn with that id exists already (nothing published). Shared by the local turn driver and the AWS
    prepare step."""
    scope, user_id = spec.scope, spec.user_id
    turn = Turn(
        turn_id=turn_id,
        user_id=user_id,
        scope_key=scope.key,
        session_id=session.session_id,
        status="running",
        goal=spec.goal,
        started_at=now,
        spec_sha256=spec.digest(),
        environment_id=spec.environment_id,
    )
    if not backend.store.create_turn(turn):
        return None
    started = TurnStarted(turn_id=turn_id, scope=scope, user_id=user_id, session_id=session.session_id)
    backend.bus.publish(Event.of(started, new_ulid()))
    return turn


def _abandoned(turn_id: str) -> TurnResult:
    error = RunError(
        name="TurnAbandoned", value="the turn's process stopped and its lease expired", traceback=""
    )
    return TurnResult(turn_id=turn_id, status="failed", error=error)


def _locked_turn(
    backend: Backend,
    spec: Spec,
    turn_id: str,
    coder: Coder | None,
    say: Progress,
    lease: _Lease,
    on_output: OutputSink | None = None,
    resolved: list[ResolvedInput] | None = None,
) -> TurnResult:
    scope, user_id = spec.scope, spec.user_id
    # Before anything is written: a bad input leaves nothing (already done for a new scope).
    inputs = resolve_inputs(backend, spec) if resolved is None else resolved
    now = utcnow()
    session, created = claim_scope_and_session(backend, spec, turn_id, now)
    _fail_abandoned_turns(backend, scope, user_id, turn_id)
    if created:
        say(f"session {session.session_id[:8]}… started")
    turn = start_turn(backend, spec, turn_id, session, now)
    if turn is None:
        raise ScopeBusyError(f"turn {turn_id} exists already")
    spec_with_id = spec.model_copy(update={"turn_id": turn_id})
    ctx = TurnContext(
        backend=backend,
        spec=spec_with_id,
        turn_id=turn_id,
        session=session,
        progress=say,
        lease_held=lease.held,
        on_output=on_output,
    )
    deadline = time.monotonic() + spec.constraints.turn_timeout_s
    try:
        spec_json = spec_with_id.model_dump_json(indent=2).encode()
        backend.workspace.write_bytes(scope, f"spec/{turn_id}.json", spec_json)
        bring_inputs(ctx, inputs)
        result = _code(ctx, coder, deadline)
    except (AlphaAgentError, PathRuleError, OSError) as exc:
        result = _failed(ctx, RunError(name=type(exc).__name__, value=str(exc), traceback=""), None)
    except KeyboardInterrupt:
        # Ctrl-C: the sandbox has killed the run's processes; the turn ends as failed, never left
        # running, and the interrupt goes on to the caller (the CLI exits 130).
        cancelled = RunError(
            name=TURN_CANCELLED, value="interrupted (Ctrl-C) while the turn ran", traceback=""
        )
        _finish_checked(backend, turn, _failed(ctx, cancelled, None), lease)
        raise
    except Exception as exc:
        # A crash (a bug, a custom coder's exception): the turn is still recorded as failed, never
        # left running, and the exception goes on to the caller (the worker reports its class).
        _finish_checked(
            backend,
            turn,
            _failed(ctx, RunError(name=type(exc).__name__, value=str(exc), traceback=""), None),
            lease,
        )
        raise
    return _finish_checked(backend, turn, result, lease)


def _code(ctx: TurnContext, coder: Coder | None, deadline: float) -> TurnResult:
    """Step 5 of DESIGN §3: the pinned steps, or the coder, until ``deadline`` (``time.monotonic()``).
    A failing step, tool or rule ends the turn as ``failed`` (a result); anything else (a defect)
    propagates."""
    try:
        if ctx.spec.steps is not None:
            summary = run_steps(ctx, deadline)
        else:
            assert coder is not None
            summary = coder(ctx)
    except StepFailed as failure:
        return _failed(ctx, failure.error, failure.step)
    except (AlphaAgentError, PathRuleError, OSError) as exc:
        return _failed(ctx, RunError(name=type(exc).__name__, value=str(exc), traceback=""), None)
    return TurnResult(
        turn_id=ctx.turn_id,
        status="completed",
        summary=summary,
        artifacts=[a.ref() for a in ctx.artifacts],
        citations=list(ctx.citations),
        run_ids=list(ctx.run_ids),
        inputs=list(ctx.inputs),
    )


def code_prepared_turn(
    backend: Backend,
    spec: Spec,
    *,
    coder: Coder | None,
    holder: str,
    inputs: Sequence[PreparedInput] = (),
    progress: Progress | None = None,
) -> TurnResult:
    """Step 5 alone, for a turn that the AWS state machine locked and prepared and will finalize:
    run the spec's pinned steps or the coder, write the result to ``work/turns/{turn_id}/result.json``
    (where ``finalize_turn`` reads it; the turn record is not touched here) and return it.

    ``holder`` is the lease holder, the execution's name (the turn id): its lease is renewed while
    the turn runs, and once it is lost no run or registration of this turn happens any more.
    ``inputs`` are the prepare step's ``PreparedTurn.inputs`` (what came into ``docs/``, cited by the
    pinned steps). A turn that already has a result returns it; nothing runs twice.

    Raises:
        InvalidSpecError: the spec has no turn id, or cannot run here.
        NotFoundError: no prepared turn (or session) of the spec's user has this id.
        ScopeBusyError: ``holder`` does not hold the scope's lease, or lost it while the turn ran.
    """
    if spec.turn_id is None:
        raise InvalidSpecError("turn_id: a prepared turn's spec carries its turn id")
    check_spec_against(backend, spec, coder)
    store, turn_id = backend.store, spec.turn_id
    turn = store.get_turn(spec.user_id, turn_id)
    if turn is None or turn.scope_key != spec.scope.key:
        raise NotFoundError(f"turn {turn_id} not found (the state machine's prepare step creates it)")
    if turn.result is not None:
        return turn.result
    session = store.get_session(spec.user_id, turn.session_id)
    if session is None:
        raise NotFoundError(f"session of turn {turn_id} not found")
    lease = _Lease(backend, spec.scope.key, holder)
    lease.hold()
    try:
        ctx = TurnContext(
            backend=backend,
            spec=spec,
            turn_id=turn_id,
            session=session,
            progress=progress or (lambda _message: None),
            lease_held=lease.held,
        )
        for item in inputs:
            ctx.fetched.append(item.path)
            ctx.origins[item.path] = item.note
            ctx.inputs.append(item)
        result = _code(ctx, coder, time.monotonic() + spec.constraints.turn_timeout_s)
        if not lease.held():
            raise ScopeBusyError(f"turn {turn_id} lost its lease on {turn.scope_key}")
        payload = result.model_dump_json(indent=2).encode()
        backend.workspace.write_bytes(spec.scope, f"work/turns/{turn_id}/result.json", payload)
        return result
    finally:
        lease.stop_renewing()  # the machine's ReleaseLock step releases it


def _finish_checked(backend: Backend, turn: Turn, result: TurnResult, lease: _Lease) -> TurnResult:
    if not lease.held():
        # Another turn took the scope after our lease lapsed and recorded this one as abandoned.
        raise ScopeBusyError(
            f"turn {turn.turn_id} lost its lease on {turn.scope_key} and was recorded as abandoned"
        )
    return record_turn_end(backend, turn, result)


def _failed(ctx: TurnContext, error: RunError, step: str | None) -> TurnResult:
    return TurnResult(
        turn_id=ctx.turn_id,
        status="failed",
        summary="",
        artifacts=[a.ref() for a in ctx.artifacts],
        citations=list(ctx.citations),
        run_ids=list(ctx.run_ids),
        error=error,
        failed_step=step,
        inputs=list(ctx.inputs),
    )


def record_turn_end(backend: Backend, turn: Turn, result: TurnResult) -> TurnResult:
    """Record the turn's end: the record first (it must never stay ``running``), then the result
    file (best effort: the code may have broken ``work/``), then the event."""
    scope = _scope_of(turn)
    turn.status = result.status
    turn.finished_at = utcnow()
    turn.result = result
    backend.store.finish_turn(turn)
    try:
        backend.workspace.ensure_scope(scope)
        payload = result.model_dump_json(indent=2).encode()
        backend.workspace.write_bytes(scope, f"work/turns/{turn.turn_id}/result.json", payload)
    except (PathRuleError, OSError):
        pass  # the record and the event carry the result; the file is a convenience copy
    if result.status == "completed":
        detail: TurnCompleted | TurnFailed = TurnCompleted(
            turn_id=turn.turn_id, scope=scope, user_id=turn.user_id, result=result
        )
    else:
        assert result.error is not None
        detail = TurnFailed(
            turn_id=turn.turn_id, scope=scope, user_id=turn.user_id, error=result.error, result=result
        )
    backend.bus.publish(Event.of(detail, new_ulid()))
    return result


def _scope_of(turn: Turn) -> Scope:
    from alphaagent.models.common import scope_from_key

    return scope_from_key(turn.scope_key)


def _fail_abandoned_turns(backend: Backend, scope: Scope, user_id: str, turn_id: str) -> None:
    """Turns still ``running`` when we hold the lease were abandoned (their process died and the
    lease expired): record them as failed, so no status stays ``running`` forever."""
    for stale in backend.store.list_turns(user_id, scope.key):
        if stale.status == "running" and stale.turn_id != turn_id:
            record_turn_end(backend, stale, _abandoned(stale.turn_id))


# ----------------------------------------------------------------------------- prepare


# ----------------------------------------------------------------------------- steps


def result_json(result: TurnResult) -> str:
    """A turn result as indented JSON (the CLI's ``--json``)."""
    return json.dumps(result.model_dump(mode="json"), indent=2)
