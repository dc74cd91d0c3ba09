"""The steps of one turn as separate calls, for the AWS state machine (DESIGN §3, steps 2–4 and 8).

``alphaagent.domain.turns.run_turn`` drives the same steps in one process (lease renewed in a thread,
the coder called in between). On AWS each step is a Lambda function and the machine holds the state
in between, so the steps are exposed here one by one. They reuse the in-process driver's input
resolution (``resolve_inputs``) and end-of-turn recording (``record_turn_end``), so both backends write
the same records, files and events. Every step is safe to repeat: Lambda and the state machine
retry, and a repeat must neither create a second turn nor regress a finished one.
"""

from __future__ import annotations

import hashlib
import json
import math
from datetime import timedelta
from typing import Any

from pydantic import TypeAdapter, ValidationError

from alphaagent.domain.audit import audit_scope
from alphaagent.domain.backend import Backend
from alphaagent.domain.inputs import resolve_inputs, write_inputs
from alphaagent.domain.turns import (
    abandon_turn,
    check_output_names,
    check_same_spec,
    check_spec_against,
    claim_scope_and_session,
    record_turn_end,
    scope_label,
    start_turn,
)
from alphaagent.errors import InvalidRequestError, InvalidSpecError, NotFoundError, ScopeBusyError
from alphaagent.ids import new_ulid
from alphaagent.models.aws import (
    AcquireLockInput,
    FinalizeInput,
    LockGranted,
    LockReleased,
    PreparedTurn,
    TurnInput,
)
from alphaagent.models.common import scope_from_key, utcnow
from alphaagent.models.events import MAX_REJECTION_REASON_CHARS, Event, SpecRejected, TurnFailed
from alphaagent.models.records import PreparedInput, Turn, TurnResult
from alphaagent.models.run import RunError
from alphaagent.models.spec import Spec, parse_spec

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

MAX_TURN_TIMEOUT_S = 11 * 60 * 60
"""The longest ``constraints.turn_timeout_s`` a turn may have on AWS (11 hours): the coder's message
must stay invisible on the CoderQueue while the turn runs, and SQS keeps a received message invisible
for at most 12 hours in all; past that another worker would get the same turn."""

CODER_QUEUE_WAIT_S = 900
"""The longest a turn's message may wait on the CoderQueue before a worker takes it (a scale-out
from ``CoderMinTasks``): the Code state's ``HeartbeatSeconds``, whose clock, like its timeout's,
starts when the message is sent (``tests/unit/test_static_timing.py`` keeps the two equal)."""

CODE_STATE_MARGIN_S = CODER_QUEUE_WAIT_S + 300
"""Seconds the machine's Code state waits beyond the spec's ``turn_timeout_s``: the wait for a worker
(the coder's own turn clock starts only when a worker takes the turn), then 300 s in which the coder,
having enforced the turn timeout itself, records its transcript, writes the result and answers. The
state's own timeout is the backstop for a coder that never answers (heartbeats catch a dead one
sooner)."""


def _remote_coder(_ctx: object) -> str:
    raise NotImplementedError("on AWS the coder runs in the Fargate service")  # never called


# ----------------------------------------------------------------------------- start


def turn_id_for_message(message_id: str, sent_ms: int) -> str:
    """A ULID for a spec that came without ``turn_id``, derived from its SQS message: the time part is
    the message's ``SentTimestamp`` (ms), the 80 random bits are the first 10 bytes of
    SHA-256(message id). A redelivery of the same message gets the same turn id, hence the same
    execution name; SQS message ids are random UUIDs, so the id stays unguessable (DESIGN §4.1)."""
    value = (sent_ms << 80) | int.from_bytes(hashlib.sha256(message_id.encode()).digest()[:10], "big")
    return "".join(_CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5))


def spec_from_message(body: str, *, message_id: str, sent_ms: int) -> Spec:
    """The spec of a SpecQueue message, with its ``turn_id``.

    ``body`` is a spec's JSON (``run_analysis``) or an EventBridge ``SpecSubmitted`` event as the rule
    delivers it (``{"detail-type": "SpecSubmitted", "detail": {"spec": {...}, "turn_id": ...}}``).
    The turn id is the spec's own, else the event's, else ``turn_id_for_message``.

    Raises:
        InvalidSpecError: the body is not a spec or a ``SpecSubmitted`` event carrying a valid spec.
    """
    try:
        document: Any = json.loads(body)
    except ValueError:
        document = None
    event_turn_id: str | None = None
    if isinstance(document, dict) and document.get("detail-type") == "SpecSubmitted":
        detail = document.get("detail")
        if not isinstance(detail, dict) or not isinstance(detail.get("spec"), dict):
            raise InvalidSpecError("detail.spec: a SpecSubmitted event must carry the spec as an object")
        event_turn_id = detail.get("turn_id") if isinstance(detail.get("turn_id"), str) else None
        body = json.dumps(detail["spec"])
    spec = parse_spec(body)
    if spec.turn_id is None:
        turn_id = event_turn_id or turn_id_for_message(message_id, sent_ms)
        spec = parse_spec(body, overrides={"turn_id": turn_id})
    return spec


def rejection_of(body: str, *, message_id: str, reason: str) -> SpecRejected:
    """The ``SpecRejected`` detail of a SpecQueue message the starter refuses for ``reason``: what
    the submitter needs to learn why (the reason, the SQS message id) and, where the body lets them
    be read, the turn id, user and scope. Nothing of the body is trusted: a field that does not
    pass its own rule is left out."""
    document: Any
    try:
        document = json.loads(body)
    except ValueError:
        document = None
    spec: Any = document
    fallback_turn_id: Any = None
    if isinstance(document, dict) and isinstance(document.get("detail"), dict):
        fallback_turn_id = document["detail"].get("turn_id")
        spec = document["detail"].get("spec")
    if not isinstance(spec, dict):
        spec = {}
    readable: dict[str, Any] = {}
    for name, value in (
        ("turn_id", spec.get("turn_id") or fallback_turn_id),
        ("user_id", spec.get("user_id")),
        ("scope", spec.get("scope")),
    ):
        annotation = SpecRejected.model_fields[name].annotation
        assert annotation is not None  # every field of the model is annotated
        try:
            readable[name] = TypeAdapter(annotation).validate_python(value)
        except ValidationError:
            continue  # unreadable: left out rather than trusted
    return SpecRejected(message_id=message_id, reason=reason[:MAX_REJECTION_REASON_CHARS], **readable)


# ----------------------------------------------------------------------------- lock


def acquire_scope_lock(backend: Backend, request: AcquireLockInput) -> LockGranted:
    """Take the spec's scope lease for ``request.holder`` (the execution name) for
    ``backend.turns.lock_lease_s`` seconds; re-acquiring by the same holder extends it.

    Raises:
        NotFoundError: the scope belongs to another user (the answer a missing scope gets; nothing
            is locked).
        ScopeBusyError: another execution holds a live lease (the state machine retries with backoff).
    """
    # Ownership first: another user's scope is never locked (no side effect there), and its answer
    # is the one a missing scope gets, whether or not a turn runs there (DESIGN §4.7).
    owner = backend.store.owner_of(request.spec.scope.owner_key)
    if owner is not None and owner != request.user_id:
        audit_scope(backend.audit, request.user_id, request.spec.scope)
        raise NotFoundError(f"{scope_label(request.spec.scope)} not found")
    now = utcnow()
    lease_s = backend.turns.lock_lease_s
    if not backend.store.acquire_lock(request.scope_key, request.holder, now, lease_s):
        raise ScopeBusyError(f"{request.scope_key}: another turn is running there")
    expires_at = now + timedelta(seconds=lease_s)
    return LockGranted(
        scope_key=request.scope_key, holder=request.holder, lease_s=lease_s, expires_at=expires_at.isoformat()
    )


def release_scope_lock(backend: Backend, scope_key: str, holder: str) -> LockReleased:
    """Release the lease of ``scope_key`` if ``holder`` (an execution name) still has it; a no-op
    otherwise (it expired and may belong to another execution now)."""
    backend.store.release_lock(scope_key, holder)
    return LockReleased(scope_key=scope_key, holder=holder)


def release_orphan(backend: Backend, turn_input: TurnInput, execution: str, status: str) -> LockReleased:
    """For an execution that ended ``status`` (FAILED, ABORTED, TIMED_OUT) without its own release
    step: release the scope's lease held under its name ``execution``, and record its turn, if still
    ``running``, as failed (``TurnAbandoned``, ``TurnFailed`` published), so no turn stays running."""
    released = release_scope_lock(backend, turn_input.scope_key, execution)
    abandon_turn(backend, turn_input.user_id, turn_input.turn_id, f"the turn's execution ended {status}")
    return released


# ----------------------------------------------------------------------------- prepare


def prepare_turn(backend: Backend, turn_input: TurnInput) -> PreparedTurn:
    """Step 4 of DESIGN §3, with the scope's lease held: check the spec, claim the scope for its user
    (first turn) or check ownership, get or create the session, create the turn record
    (``TurnStarted``), write the spec to ``spec/{turn_id}.json`` and bring the declared inputs into
    ``docs/``.

    A repeat (a retried step) finds the turn record and rewrites only the spec and inputs; a turn
    finished by an earlier attempt comes back with ``finished=True``.

    Raises:
        InvalidSpecError: the spec cannot run here, an input is missing, or the turn id is taken.
        NotFoundError: the scope belongs to another user (the same answer as a missing scope).
    """
    spec, turn_id = turn_input.spec, turn_input.turn_id
    scope, user_id, store = spec.scope, spec.user_id, backend.store
    if spec.turn_id != turn_id:
        raise InvalidSpecError("turn_id: the execution input disagrees with its spec")
    check_spec_against(backend, spec, _remote_coder)
    if spec.constraints.turn_timeout_s > MAX_TURN_TIMEOUT_S:
        raise InvalidSpecError(
            f"constraints.turn_timeout_s: at most {MAX_TURN_TIMEOUT_S} s on AWS (SQS keeps the coder's"
            " message invisible for at most 12 hours)"
        )
    owner = store.owner_of(scope.owner_key)
    if owner is not None and owner != user_id:
        audit_scope(backend.audit, user_id, scope)
        raise NotFoundError(f"{scope_label(scope)} not found")
    if owner is not None:
        check_output_names(backend, spec)
    existing = store.get_turn(user_id, turn_id)
    if existing is None and store.turn_id_taken(turn_id):
        raise InvalidSpecError("turn_id: already used; leave it out to get a fresh one")
    if existing is not None and existing.scope_key != scope.key:
        raise InvalidSpecError(f"turn_id: already used in another scope ({existing.scope_key})")
    if existing is not None:
        check_same_spec(existing, spec)
    if existing is not None and existing.result is not None:
        return _prepared(existing, spec, [], finished=True)
    inputs = resolve_inputs(backend, spec)
    now = utcnow()
    if existing is None:
        session, _created = claim_scope_and_session(backend, spec, turn_id, now)
        existing = start_turn(backend, spec, turn_id, session, now) or store.get_turn(user_id, turn_id)
        if existing is None:
            raise InvalidSpecError("turn_id: already used; leave it out to get a fresh one")
    spec_bytes = spec.model_dump_json(indent=2).encode()
    backend.workspace.write_bytes(scope, f"spec/{turn_id}.json", spec_bytes)
    written = write_inputs(backend.workspace, scope, turn_id, inputs)
    return _prepared(existing, spec, written, finished=False)


def _prepared(turn: Turn, spec: Spec, inputs: list[PreparedInput], *, finished: bool) -> PreparedTurn:
    # The bytes prepare writes (and rewrites on a retry): the same spec always gives the same hash.
    spec_sha256 = hashlib.sha256(spec.model_dump_json(indent=2).encode()).hexdigest()
    return PreparedTurn(
        spec_sha256=spec_sha256,
        turn_id=turn.turn_id,
        user_id=turn.user_id,
        scope_key=turn.scope_key,
        session_id=turn.session_id,
        spec_key=f"{turn.scope_key}/spec/{turn.turn_id}.json",
        turn_timeout_s=math.ceil(spec.constraints.turn_timeout_s) + CODE_STATE_MARGIN_S,
        inputs=inputs,
        finished=finished,
    )


# ----------------------------------------------------------------------------- finalize


def finalize_turn(backend: Backend, request: FinalizeInput) -> TurnResult:
    """Step 8 of DESIGN §3: record the turn's end (record, ``work/turns/{turn_id}/result.json``,
    ``TurnCompleted`` or ``TurnFailed``) from the coder's result (``coded``: read from the object its
    pointer names) or the caught failure (``error``).

    A turn already finished keeps its result (no status regression): that includes a turn the coder
    worker finished itself. A failure before the turn record existed (the lock or prepare step failed)
    creates the record, failed (with no session), and publishes ``TurnFailed``.

    Raises:
        InvalidRequestError: neither or both of ``coded`` and ``error`` were given, or the pointer
            names another turn.
        FileNotFoundError: the pointer's result object does not exist.
    """
    if (request.coded is None) == (request.error is None):
        raise InvalidRequestError("finalize: give exactly one of coded and error")
    turn = backend.store.get_turn(request.user_id, request.turn_id)
    if turn is not None and turn.result is not None:
        return turn.result
    if request.coded is not None:
        pointer = request.coded
        if pointer.turn_id != request.turn_id or pointer.scope_key != request.scope_key:
            raise InvalidRequestError("coded: the pointer names another turn")
        raw = backend.workspace.read_bytes(scope_from_key(pointer.scope_key), pointer.result_key)
        result = TurnResult.model_validate_json(raw)
        if result.turn_id != request.turn_id:
            raise InvalidRequestError("coded.result_key: the result is another turn's")
    else:
        assert request.error is not None
        error = RunError(name=request.error.error, value=request.error.message(), traceback="")
        result = TurnResult(
            turn_id=request.turn_id, status="failed", error=error, failed_step=request.failed_step
        )
    if turn is not None:
        return record_turn_end(backend, turn, result)
    return _fail_unstarted_turn(backend, request, result)


def _fail_unstarted_turn(backend: Backend, request: FinalizeInput, result: TurnResult) -> TurnResult:
    """The lock or prepare step failed before the turn's record existed (a missing input, a scope
    that is not the user's, a scope that stayed busy). Record the turn as failed all the same, so that
    whoever waits for it (``alphaagent submit --wait``, a reader of the table) sees its end, and
    publish ``TurnFailed``. The record is the requesting user's own; the scope's files are not
    touched (the scope may be another user's: no side effect there, DESIGN §4.7). The turn id stays
    taken, as the execution name does: the same turn never runs again."""
    now = utcnow()
    turn = Turn(
        turn_id=request.turn_id,
        user_id=request.user_id,
        scope_key=request.scope_key,
        session_id="",
        status="running",
        goal=request.spec.goal,
        started_at=now,
        spec_sha256=request.spec.digest(),
        environment_id=request.spec.environment_id,
    )
    if not backend.store.create_turn(turn):
        existing = backend.store.get_turn(request.user_id, request.turn_id)
        if existing is None:  # another user's turn of that id: never touched, nothing revealed
            return result
        if existing.result is not None:
            return existing.result
        turn = existing
    turn.status, turn.finished_at, turn.result = "failed", now, result
    if backend.store.finish_turn(turn):
        assert result.error is not None
        detail = TurnFailed(
            turn_id=request.turn_id,
            scope=scope_from_key(request.scope_key),
            user_id=request.user_id,
            error=result.error,
            result=result,
        )
        backend.bus.publish(Event.of(detail, new_ulid()))
    return result
