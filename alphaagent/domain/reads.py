"""Owner-scoped reads of a scope's records and files, written once for both backends.

``ScopeReads`` needs only a ``Store`` and a ``Workspace`` (the ports): the local backend
(``AlphaAgent``: SQLite and a directory tree) and the AWS client (DynamoDB and S3) both inherit it,
so "what another user may learn" is decided in one place.

Every read is scoped by ``user_id``. Anything that belongs to another user — a conversation, a
workflow run, a session, a turn, a run, an artifact, a file — is answered exactly as if it did not
exist: the same ``NotFoundError`` with the same message, built only from what the caller asked for,
and no side effect (no timer refreshed, no record created) (DESIGN §4.7, case ISO-01).
"""

from __future__ import annotations

from typing import Literal

from alphaagent.domain.audit import ForeignKind, ProbeAudit, audit_foreign, audit_scope, discard_audit
from alphaagent.domain.labels import scope_label
from alphaagent.errors import InvalidRequestError, NotFoundError, PathRuleError
from alphaagent.models.common import ConversationScope, NodeScope, Scope, check_workspace_path, scope_from_key
from alphaagent.models.records import ArtifactVersion, RunRecord, ScopeSummary, Session, Turn
from alphaagent.ports import FileInfo, Store, Workspace
from alphaagent.sandbox.session import is_session_state
from alphaagent.suggest import did_you_mean_name


class ScopeReads:
    """The reads of a backend; a subclass sets ``store`` and ``workspace``, and ``audit`` where the
    requests for another user's things are to be recorded (``alphaagent.domain.audit``; the answer
    stays that of a missing thing)."""

    store: Store
    workspace: Workspace
    audit: ProbeAudit = staticmethod(discard_audit)

    def _owned(self, user_id: str, scope: Scope, *, kind: ForeignKind | None = None) -> Scope:
        owner = self.store.owner_of(scope.owner_key)
        if owner != user_id or not self.workspace.scope_exists(scope):
            if owner is not None and owner != user_id:
                audit_scope(self.audit, user_id, scope, kind)
            raise NotFoundError(f"{scope_label(scope)} not found{self._near_scope(user_id, scope)}")
        return scope

    def _near_scope(self, user_id: str, scope: Scope) -> str:
        """`` (did you mean 'penguins'?)`` when one of the user's own scopes is a typo away from
        ``scope``, else ``""``. Only the user's own scopes are compared (``list_scopes`` never lists
        another user's), and with the same one lookup whether ``scope`` is missing or another
        user's: the answer says nothing of anyone else (DESIGN §4.7)."""
        own = [scope_from_key(summary.scope_key) for summary in self.store.list_scopes(user_id)]
        if isinstance(scope, ConversationScope):
            ids = [s.conversation_id for s in own if isinstance(s, ConversationScope)]
            return did_you_mean_name(scope.conversation_id, ids)
        nodes = [s for s in own if isinstance(s, NodeScope)]
        same_run = [s.node_id for s in nodes if s.workflow_execution_id == scope.workflow_execution_id]
        if same_run:
            return did_you_mean_name(scope.node_id, same_run)
        return did_you_mean_name(
            scope.workflow_execution_id, dict.fromkeys(s.workflow_execution_id for s in nodes)
        )

    def files(self, user_id: str, scope: Scope, prefix: str = "") -> list[FileInfo]:
        """The scope's regular files under ``prefix``; the sessions' state (platform-owned) is never
        one of them."""
        self._owned(user_id, scope)
        if prefix:
            prefix = _path_or_not_found(prefix.rstrip("/"), scope)
        return [f for f in self.workspace.list_files(scope, prefix) if not is_session_state(f.path)]

    def read_file(self, user_id: str, scope: Scope, path: str) -> bytes:
        """The bytes of one file of the scope."""
        self._owned(user_id, scope)
        normal = _path_or_not_found(path, scope)
        try:
            if is_session_state(normal):  # platform-owned: answered as a missing file is
                raise FileNotFoundError(normal)
            return self.workspace.read_bytes(scope, normal)
        except FileNotFoundError:
            raise NotFoundError(f"{normal} not found in {scope_label(scope)}") from None

    def history(self, user_id: str, scope: Scope) -> list[RunRecord]:
        """The scope's runs, oldest first, with their stored (16 KiB) outputs."""
        self._owned(user_id, scope)
        return self.store.list_runs(user_id, scope.key)

    def turns(self, user_id: str, scope: Scope) -> list[Turn]:
        """The scope's turns, oldest first."""
        self._owned(user_id, scope)
        return self.store.list_turns(user_id, scope.key)

    def conversations(self, user_id: str) -> list[ScopeSummary]:
        """The user's scopes (conversations and workflow nodes), the newest turn first."""
        return self.store.list_scopes(user_id)

    def turn(self, user_id: str, turn_id: str) -> Turn:
        """One turn (its ``result`` is None while it runs)."""
        found = self.store.get_turn(user_id, turn_id)
        if found is None:
            if self.store.turn_id_taken(turn_id):  # one lookup for a missing turn too
                audit_foreign(self.audit, user_id, "turn", turn_id)
            raise NotFoundError(f"turn {turn_id} not found")
        return found

    def run_record(self, user_id: str, run_id: str) -> RunRecord:
        """One run."""
        record = self.store.get_run(user_id, run_id)
        if record is None:
            raise self._not_found(user_id, "run", run_id)
        return record

    def artifacts(self, user_id: str, scope: Scope) -> list[ArtifactVersion]:
        """Every version of every artifact of the scope."""
        self._owned(user_id, scope)
        return self.store.list_artifacts(user_id, scope.key)

    def artifact(
        self, user_id: str, scope: Scope, name: str, version: int | None = None
    ) -> tuple[ArtifactVersion, bytes]:
        """One artifact version (``None``: the latest) and its immutable bytes."""
        self._owned(user_id, scope, kind="artifact")
        found = self.store.get_artifact(user_id, scope.key, name, version)
        if found is None:
            wanted = f"{name} v{version}" if version else name
            near = self._near_artifact(user_id, scope, name)
            raise NotFoundError(f"artifact {wanted} not found in {scope_label(scope)}{near}")
        return found, self.workspace.read_blob(found.sha256)

    def _near_artifact(self, user_id: str, scope: Scope, name: str) -> str:
        """What the user may have meant by an artifact ``name`` that was not found in their own
        ``scope``: the latest version when the name exists (the version asked for does not), else
        `` (did you mean 'revenue'?)`` for a name of the scope a typo away."""
        versions = self.store.list_artifacts(user_id, scope.key)
        latest = max((v.version for v in versions if v.name == name), default=None)
        if latest is not None:
            return f" (its latest is v{latest})"
        return did_you_mean_name(name, dict.fromkeys(v.name for v in versions))

    def sessions(self, user_id: str, scope: Scope) -> list[Session]:
        """The user's sessions in the scope, oldest first (expired ones included)."""
        self._owned(user_id, scope)
        return self.store.list_sessions(user_id, scope.key)

    def session(self, user_id: str, session_id: str) -> Session:
        """One session (reading it never refreshes its idle timer)."""
        found = self.store.get_session(user_id, session_id)
        if found is None:
            raise self._not_found(user_id, "session", session_id)
        return found

    def _not_found(self, user_id: str, kind: Literal["run", "session"], record_id: str) -> NotFoundError:
        """The answer for a run or session the user does not own: the same as for a missing one,
        after one existence lookup either way; another user's is recorded in the audit trail."""
        if self.store.record_exists(kind, record_id):
            audit_foreign(self.audit, user_id, kind, record_id)
        return NotFoundError(f"{kind} {record_id} not found")


def _path_or_not_found(path: str, scope: Scope) -> str:
    """A valid workspace path; ``InvalidRequestError`` naming the rule otherwise (checked only
    after ownership, so it says nothing about another user's scope)."""
    try:
        return check_workspace_path(path, prefix=scope.key + "/")
    except PathRuleError as exc:
        raise InvalidRequestError(f"path {path!r}: {exc}") from None
