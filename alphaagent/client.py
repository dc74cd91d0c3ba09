"""One Python client for both backends (DESIGN §4.10): what the CLI, the MCP server (``alphaagent
mcp``) and workflows call, so that local and AWS differ only in how the client is made.

A client is bound to one user (``--user``, else ``$ALPHAAGENT_USER``, else ``local``). A spec may
leave ``user_id`` out (the client supplies its user); a spec naming another user, or a scope that
another user owns, is refused with exactly the ``NotFoundError`` a scope that does not exist gets
(``"conversation c1 not found"``), before anything is written or sent (DESIGN §4.7).

- ``local``: turns run in this process on the local backend (``alphaagent.api.AlphaAgent``: files
  under the data directory, records in SQLite, code in the sandbox).
- ``aws``: a spec goes to the deployed stack's SpecQueue (``alphaagent.aws.client.submit_spec``);
  waiting reads the turn's record when a turn notice says it ended (``wait_for_turn``,
  ``alphaagent.aws.turn_notices``), with a fallback read on a timer; reads go to the state
  table and the workspaces bucket. Nothing AWS is imported until an ``aws`` client is made.

Example::

    from alphaagent.client import connect

    with connect(backend="local") as client:          # or connect(backend="aws", queue_url=..., ...)
        result = client.run_analysis(spec_dict)        # waits; progress=print to follow it
        for artifact in result.artifacts:
            data = client.read(spec_dict["scope"], artifact.path)
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from alphaagent.domain.audit import audit_scope
from alphaagent.domain.reads import ScopeReads
from alphaagent.domain.turns import check_spec_against, scope_label
from alphaagent.errors import InvalidArgumentError, InvalidRequestError, InvalidSpecError, NotFoundError
from alphaagent.ids import new_ulid
from alphaagent.models.common import ConversationScope, NodeScope, Scope, UserId
from alphaagent.models.records import ArtifactVersion, Turn, TurnResult
from alphaagent.models.spec import Spec, parse_spec
from alphaagent.ports import FileInfo
from alphaagent.wording import SCOPE_ID_RULE, USER_ID_RULE, id_refusal, shown_json

if TYPE_CHECKING:
    from alphaagent.api import AlphaAgent
    from alphaagent.domain.tools import TurnContext
    from alphaagent.domain.turns import Coder

BackendName = Literal["local", "aws"]
Progress = Callable[[str], None]
"""Called with one line of progress at a time (a step started, a run ended, the turn's status)."""

DEFAULT_WAIT_S = 3600.0
"""How long ``run_analysis`` waits for a turn on AWS by default, in seconds (one hour: above the
default ``constraints.turn_timeout_s`` of 900 s with room for a queue and a cold coder)."""

LOCAL_WORKERS = 4
"""Turns a local client runs at once with ``wait=False`` (more queue; each holds its scope's lease)."""


class SubmittedTurn(BaseModel):
    """What ``run_analysis(spec, wait=False)`` returns: the turn's id and scope, to wait on with
    ``result(turn_id)`` or to look at with ``turn(turn_id)``."""

    model_config = ConfigDict(frozen=True)

    turn_id: str
    scope: ConversationScope | NodeScope


def resolve_user(user: str | None = None) -> str:
    """The identity rule of every surface: ``user``, else ``$ALPHAAGENT_USER``, else ``local``.

    Raises:
        InvalidRequestError: the user id breaks DESIGN §4.1 (the message names ``user``).
    """
    from alphaagent.local.settings import local_settings

    chosen = user if user is not None else local_settings().ALPHAAGENT_USER or "local"
    try:
        return TypeAdapter(UserId).validate_python(chosen)
    except ValidationError:
        raise InvalidRequestError(f"user: {id_refusal(USER_ID_RULE, shown_json(chosen))}") from None


def parse_scope(value: Scope | Mapping[str, Any]) -> Scope:
    """A scope from a model or a mapping (``{"conversation_id": ...}`` or ``{"workflow_execution_id":
    ..., "node_id": ...}``). Raises ``InvalidRequestError`` naming the field (``scope.node_id: ...``)."""
    if isinstance(value, ConversationScope | NodeScope):
        return value
    if not isinstance(value, Mapping):
        raise InvalidRequestError("scope: an object, {conversation_id} or {workflow_execution_id, node_id}")
    keys = set(value)
    try:
        if keys == {"conversation_id"}:
            return ConversationScope.model_validate(dict(value))
        if keys == {"workflow_execution_id", "node_id"}:
            return NodeScope.model_validate(dict(value))
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        raise InvalidRequestError(
            f"scope.{field}: {id_refusal(SCOPE_ID_RULE, shown_json(first['input']))}"
        ) from None
    raise InvalidRequestError(
        "scope: give {conversation_id}, or {workflow_execution_id, node_id};"
        f" got {{{', '.join(sorted(map(str, keys)))}}}"
    )


class Client(ABC):
    """A client of one backend, bound to one user. Made by ``connect``; close it (or use ``with``).

    Attributes:
        user_id: the user every call acts as.
        backend: ``"local"`` or ``"aws"``.
    """

    backend: BackendName

    def __init__(self, user_id: str, reads: ScopeReads) -> None:
        self.user_id = user_id
        self._reads = reads

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @abstractmethod
    def close(self) -> None:
        """Release what the client holds (the local sandbox, its database; waits for local turns)."""

    # ------------------------------------------------------------------ turns

    def bind(self, spec: Spec | Mapping[str, Any] | str | bytes) -> Spec:
        """``spec`` validated as a spec of this client's user (its ``user_id`` supplied when left out).

        Raises:
            InvalidSpecError: the spec breaks a rule (one line naming the field, e.g. ``goal: ...``).
            NotFoundError: the spec names another user, or its scope belongs to another user: exactly
                what a scope that does not exist gets, and nothing is written or sent.
        """
        if isinstance(spec, Spec):
            parsed = spec
        else:
            if isinstance(spec, Mapping):
                try:
                    spec = json.dumps(dict(spec))
                except (TypeError, ValueError) as exc:
                    raise InvalidSpecError(f"spec: not JSON ({exc})") from None
            parsed = parse_spec(spec, defaults={"user_id": self.user_id})
        owner = self._reads.store.owner_of(parsed.scope.owner_key)
        if parsed.user_id != self.user_id or (owner is not None and owner != self.user_id):
            if owner is not None and owner != self.user_id:
                audit_scope(self._reads.audit, self.user_id, parsed.scope)
            raise NotFoundError(f"{scope_label(parsed.scope)} not found")
        return parsed

    @overload
    def run_analysis(
        self,
        spec: Spec | Mapping[str, Any] | str | bytes,
        *,
        wait: Literal[True] = True,
        progress: Progress | None = None,
        timeout_s: float | None = None,
    ) -> TurnResult: ...

    @overload
    def run_analysis(
        self,
        spec: Spec | Mapping[str, Any] | str | bytes,
        *,
        wait: Literal[False],
        progress: Progress | None = None,
        timeout_s: float | None = None,
    ) -> SubmittedTurn: ...

    def run_analysis(
        self,
        spec: Spec | Mapping[str, Any] | str | bytes,
        *,
        wait: bool = True,
        progress: Progress | None = None,
        timeout_s: float | None = None,
    ) -> TurnResult | SubmittedTurn:
        """Run ``spec`` as one turn: with ``wait`` (the default) return its ``TurnResult``, else
        return a ``SubmittedTurn`` at once (the turn goes on; ``result(turn_id)`` waits for it).

        A failing step or coder is a ``failed`` result, not an exception. ``timeout_s`` bounds the
        wait on AWS (default ``DEFAULT_WAIT_S``); locally the turn's own ``turn_timeout_s`` does.

        Raises:
            InvalidSpecError: see ``bind``; locally also a spec the backend cannot run (an unknown
                environment, no steps and no model).
            NotFoundError: another user's spec or scope (see ``bind``).
            TurnWaitTimeoutError: (AWS) no result within ``timeout_s``; the turn goes on.
        """
        parsed = self.bind(spec)
        if parsed.turn_id is None:
            parsed = parsed.model_copy(update={"turn_id": new_ulid()})
        assert parsed.turn_id is not None  # set just above
        self._submit(parsed, progress)
        if not wait:
            return SubmittedTurn(turn_id=parsed.turn_id, scope=parsed.scope)
        return self.result(parsed.turn_id, progress=progress, timeout_s=timeout_s)

    @abstractmethod
    def _submit(self, spec: Spec, progress: Progress | None) -> None:
        """Start the turn of ``spec`` (its ``turn_id`` set); raise for what must be refused up front."""

    @abstractmethod
    def result(
        self, turn_id: str, *, progress: Progress | None = None, timeout_s: float | None = None
    ) -> TurnResult:
        """Wait for the result of a turn this user submitted and return it."""

    def turn(self, turn_id: str) -> Turn:
        """The turn record (``status``; ``result`` once it ended). ``NotFoundError`` if none is visible."""
        return self._reads.turn(self.user_id, turn_id)

    # ------------------------------------------------------------------ reads

    def turns(self, scope: Scope | Mapping[str, Any]) -> list[Turn]:
        """The scope's turns, oldest first."""
        return self._reads.turns(self.user_id, parse_scope(scope))

    def artifacts(self, scope: Scope | Mapping[str, Any]) -> list[ArtifactVersion]:
        """Every version of every artifact of the scope, oldest first."""
        return self._reads.artifacts(self.user_id, parse_scope(scope))

    def artifact(
        self, scope: Scope | Mapping[str, Any], name: str, version: int | None = None
    ) -> tuple[ArtifactVersion, bytes]:
        """One artifact version (``None``: the latest) and its immutable bytes."""
        return self._reads.artifact(self.user_id, parse_scope(scope), name, version)

    def files(self, scope: Scope | Mapping[str, Any], prefix: str = "") -> list[FileInfo]:
        """The scope's regular files under ``prefix`` (a folder such as ``datasets``)."""
        return self._reads.files(self.user_id, parse_scope(scope), prefix)

    def read(self, scope: Scope | Mapping[str, Any], path: str) -> bytes:
        """The current bytes of one file of the scope (``path`` workspace-relative)."""
        return self._reads.read_file(self.user_id, parse_scope(scope), path)

    @abstractmethod
    def scope_root(self, scope: Scope | Mapping[str, Any]) -> str:
        """Where the scope's files live, for people: a directory locally, ``s3://bucket/key`` on AWS.
        Artifact and file paths are relative to it."""


class LocalClient(Client):
    """The local backend in this process (see ``connect``)."""

    backend: BackendName = "local"

    def __init__(self, user_id: str, agent: AlphaAgent) -> None:
        super().__init__(user_id, agent)
        self.agent = agent
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._running: dict[str, concurrent.futures.Future[TurnResult]] = {}

    def _submit(self, spec: Spec, progress: Progress | None) -> None:
        # Refused here, in the caller's thread, so that wait=False reports a bad spec at once.
        check_spec_against(self.agent.backend, spec, self.agent.coder)
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(LOCAL_WORKERS, thread_name_prefix="turn")
        assert spec.turn_id is not None  # run_analysis sets it
        self._running[spec.turn_id] = self._pool.submit(self.agent.run_analysis, spec, progress=progress)

    def result(
        self, turn_id: str, *, progress: Progress | None = None, timeout_s: float | None = None
    ) -> TurnResult:
        """The result of a turn: waits for one this client runs (``timeout_s`` None: until it ends),
        else reads the record of an ended one. Raises what the turn raised (``ScopeBusyError``, ...)
        or ``NotFoundError`` for a turn this user has no record of, or that has not ended."""
        future = self._running.get(turn_id)
        if future is not None:
            try:
                return future.result(timeout=timeout_s)
            finally:
                if future.done():
                    self._running.pop(turn_id, None)
        found = self.turn(turn_id)
        if found.result is None:
            raise NotFoundError(f"turn {turn_id} has no result yet (status {found.status})")
        return found.result

    def scope_root(self, scope: Scope | Mapping[str, Any]) -> str:
        return str(self.agent.home.resolve() / parse_scope(scope).key)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self.agent.close()


class _AwsReads(ScopeReads):
    def __init__(self, store: Any, workspace: Any) -> None:
        self.store, self.workspace = store, workspace


class AwsClient(Client):
    """A deployed stack (see ``connect``): submit to the SpecQueue, read the state table and bucket."""

    backend: BackendName = "aws"

    def __init__(
        self,
        user_id: str,
        *,
        queue_url: str,
        table: str,
        bucket: str,
        region: str | None = None,
        timeout_s: float = DEFAULT_WAIT_S,
        poll_s: float = 2.0,
    ) -> None:
        from alphaagent.aws.client import aws_client, queue_region
        from alphaagent.aws.store import DynamoStore
        from alphaagent.aws.workspace import S3Workspace

        region = region or queue_region(queue_url)
        self.queue_url, self.bucket, self.timeout_s, self.poll_s = queue_url, bucket, timeout_s, poll_s
        self._sqs = aws_client("sqs", region)
        store = DynamoStore(table, client=aws_client("dynamodb", region))
        super().__init__(user_id, _AwsReads(store, S3Workspace(bucket, client=aws_client("s3", region))))

    def _submit(self, spec: Spec, progress: Progress | None) -> None:
        from alphaagent.aws.client import submit_spec

        submit_spec(spec, queue_url=self.queue_url, sqs=self._sqs)
        if progress is not None:
            progress(f"turn {spec.turn_id}: submitted")

    def result(
        self, turn_id: str, *, progress: Progress | None = None, timeout_s: float | None = None
    ) -> TurnResult:
        """Wait until the turn has a result (for ``timeout_s``, default the client's): its record
        is read when the recorder's turn notice says it ended (``alphaagent.aws.turn_notices``),
        else every ``FALLBACK_READ_S`` s; every ``poll_s`` s where the notice queue cannot be made
        (one progress line says so). Raises ``TurnWaitTimeoutError`` (the turn goes on)."""
        from alphaagent.aws.client import open_turn_waiter, wait_for_turn

        def say(status: str) -> None:
            if progress is not None:
                progress(f"turn {turn_id}: {status}")

        wait_s = self.timeout_s if timeout_s is None else timeout_s
        notices = open_turn_waiter(
            self._sqs, self.user_id, turn_id, timeout_s=wait_s, say=say, poll_s=self.poll_s
        )
        try:
            return wait_for_turn(
                self._reads.store,
                self.user_id,
                turn_id,
                timeout_s=wait_s,
                poll_s=self.poll_s,
                progress=say,
                notices=notices,
            )
        finally:
            if notices is not None:
                notices.close()

    def close(self) -> None:
        """Nothing to release: a turn submitted to the stack goes on without this client."""

    def scope_root(self, scope: Scope | Mapping[str, Any]) -> str:
        return f"s3://{self.bucket}/{parse_scope(scope).key}"


def configured_coder(on_missing: Callable[[str], None] | None = None) -> Coder | None:
    """The model-backed coder when a model is configured (``coder.settings``) and the ``coder`` extra
    is installed; else None (a spec without steps is then refused, naming what to set).
    ``on_missing`` is told when a model is configured but the coder is not installed.

    The coder's module (the Agent SDK, which imports the MCP SDK: ~2.5 CPU-s, mostly pydantic
    building a schema for every MCP type) is imported by the first turn that needs the model, not
    here: a client that reads results or runs pinned steps never pays it."""
    try:
        from coder.settings import coder_settings
    except ImportError:
        return None
    settings = coder_settings()
    if settings is None:
        return None
    if importlib.util.find_spec("claude_agent_sdk") is None:
        if on_missing is not None:
            on_missing(
                "a model is configured but the coder is not installed (pip install 'alphaagent[coder]')"
            )
        return None

    def coder(ctx: TurnContext) -> str:
        from coder.agent import run_coder

        return run_coder(ctx, settings)

    return coder


_AUTO: Any = object()


def connect(
    backend: BackendName = "local",
    *,
    user: str | None = None,
    home: Path | None = None,
    coder: Coder | None = _AUTO,
    queue_url: str | None = None,
    table: str | None = None,
    bucket: str | None = None,
    region: str | None = None,
    timeout_s: float = DEFAULT_WAIT_S,
    poll_s: float = 2.0,
) -> Client:
    """A client of ``backend`` bound to ``user`` (``resolve_user``).

    Local: ``home`` is the data directory (default: the local backend's); ``coder`` defaults to the
    configured model (``configured_coder``), None runs only specs with pinned steps.

    AWS: ``queue_url``, ``table`` and ``bucket`` are the stack outputs ``SpecQueueUrl``,
    ``StateTableName`` and ``WorkspacesBucketName`` (defaults ``$ALPHAAGENT_SPEC_QUEUE_URL``,
    ``$ALPHAAGENT_STATE_TABLE``, ``$ALPHAAGENT_WORKSPACES_BUCKET``); ``region`` defaults to the queue
    URL's. ``timeout_s`` (seconds) is how long ``run_analysis`` waits, polling every ``poll_s``.

    Raises:
        InvalidRequestError: a bad user, an unknown backend, or a missing AWS setting (named).
    """
    user_id = resolve_user(user)
    if backend == "local":
        from alphaagent.api import AlphaAgent

        return LocalClient(user_id, AlphaAgent(home, coder=configured_coder() if coder is _AUTO else coder))
    if backend != "aws":
        raise InvalidRequestError(f"backend: {backend!r} is not one of local, aws")
    from alphaagent.aws.client import client_settings

    settings = client_settings()
    queue_url = queue_url or settings.spec_queue_url
    table = table or settings.state_table
    bucket = bucket or settings.workspaces_bucket
    for name, value, output, variable in (
        ("queue_url", queue_url, "SpecQueueUrl", "ALPHAAGENT_SPEC_QUEUE_URL"),
        ("table", table, "StateTableName", "ALPHAAGENT_STATE_TABLE"),
        ("bucket", bucket, "WorkspacesBucketName", "ALPHAAGENT_WORKSPACES_BUCKET"),
    ):
        if not value:
            raise InvalidArgumentError(name, f"give the stack's {output} output, or set {variable}")
    if not queue_url.startswith(("https://", "http://")):
        raise InvalidArgumentError(
            "queue_url", f"{queue_url!r} is not a queue URL (https://sqs.REGION.amazonaws.com/ACCOUNT/NAME)"
        )
    if not 0 < timeout_s < float("inf"):
        raise InvalidArgumentError("timeout_s", "a positive number of seconds")
    return AwsClient(
        user_id,
        queue_url=queue_url,
        table=table,
        bucket=bucket,
        region=region,
        timeout_s=timeout_s,
        poll_s=poll_s,
    )
