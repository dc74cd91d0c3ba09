"""The Python API of the local backend (the CLI is a thin layer over it).

Every call is scoped by ``user_id``. Anything that belongs to another user — a conversation, a
workflow run, a session, a run, an artifact, a file — is answered exactly as if it did not exist:
the same ``NotFoundError`` with the same message, built only from what the caller asked for, and no
side effect (no timer refreshed, no record created) (DESIGN §4.7, case ISO-01).

Example::

    with AlphaAgent() as agent:
        result = agent.run_analysis(spec_dict)
        for version in agent.artifacts("me", ConversationScope(conversation_id="c1")):
            print(version.name, version.version, version.path)
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from alphaagent.domain.backend import Backend, ConnectorSettings, TurnSettings
from alphaagent.domain.recorder import Recorder
from alphaagent.domain.turns import Coder, Progress, run_turn, scope_label
from alphaagent.errors import InvalidRequestError, NotFoundError
from alphaagent.local.bus import InProcessBus
from alphaagent.local.executor import SandboxExecutor
from alphaagent.local.export import ExportReport, export_scope
from alphaagent.local.store import SqliteStore
from alphaagent.local.workspace import LocalWorkspace
from alphaagent.models.common import PathRuleError, Scope, check_workspace_path
from alphaagent.models.records import ArtifactVersion, RunRecord, ScopeSummary, Session, Turn, TurnResult
from alphaagent.models.spec import Spec, parse_spec
from alphaagent.ports import FileInfo
from alphaagent.sandbox.config import SandboxConfig

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "examples"


def alphaagent_home() -> Path:
    """``$ALPHAAGENT_HOME``, default ``./.alphaagent`` (DESIGN §1)."""
    return Path(os.environ.get("ALPHAAGENT_HOME", ".alphaagent"))


def connector_settings_from_env() -> ConnectorSettings:
    """``ALPHAAGENT_FILE_ROOTS`` (``os.pathsep``-separated directories; default: the checkout's
    ``examples/``), ``ALPHAAGENT_HTTP_HOSTS`` (comma-separated host names; default: none) and
    ``ALPHAAGENT_S3_PREFIXES`` (comma-separated ``bucket/prefix`` entries; default: none)."""
    roots = os.environ.get("ALPHAAGENT_FILE_ROOTS")
    file_roots = tuple(Path(p) for p in roots.split(os.pathsep) if p) if roots else (EXAMPLES_DIR,)
    hosts = tuple(h.strip() for h in os.environ.get("ALPHAAGENT_HTTP_HOSTS", "").split(",") if h.strip())
    prefixes = tuple(p.strip() for p in os.environ.get("ALPHAAGENT_S3_PREFIXES", "").split(",") if p.strip())
    return ConnectorSettings(file_roots=file_roots, http_hosts=hosts, s3_prefixes=prefixes)


def turn_settings_from_env() -> TurnSettings:
    """``ALPHAAGENT_LOCK_LEASE_S`` (default 60), ``ALPHAAGENT_LOCK_WAIT_S`` (600),
    ``ALPHAAGENT_SESSION_IDLE_S`` (900) and ``ALPHAAGENT_SESSION_MAX_S`` (28,800)."""
    env = os.environ
    return TurnSettings(
        lock_lease_s=float(env.get("ALPHAAGENT_LOCK_LEASE_S", "60")),
        lock_wait_s=float(env.get("ALPHAAGENT_LOCK_WAIT_S", "600")),
        session_idle_timeout_s=int(env.get("ALPHAAGENT_SESSION_IDLE_S", str(15 * 60))),
        session_max_lifetime_s=int(env.get("ALPHAAGENT_SESSION_MAX_S", str(8 * 60 * 60))),
    )


class AlphaAgent:
    """The local backend: files under ``home``, records in ``home/alphaagent.db``, code in the sandbox."""

    def __init__(
        self,
        home: Path | None = None,
        *,
        connectors: ConnectorSettings | None = None,
        turns: TurnSettings | None = None,
        sandbox: SandboxConfig | None = None,
        coder: Coder | None = None,
    ) -> None:
        self.home = home or alphaagent_home()
        self.home.mkdir(parents=True, exist_ok=True)
        self.store = SqliteStore(self.home / "alphaagent.db")
        self.workspace = LocalWorkspace(self.home)
        self.bus = InProcessBus()
        self.bus.subscribe(Recorder(self.store).handle)
        # Runs must not see the other scopes under home, nor the supervisor's home directory.
        hidden = (str(Path.home()), str(self.home.resolve()))
        self.executor = SandboxExecutor(sandbox or SandboxConfig(hidden_paths=hidden))
        self.coder = coder
        connectors = connectors or connector_settings_from_env()
        connectors = replace(connectors, forbidden_roots=(*connectors.forbidden_roots, self.home))
        self.backend = Backend(
            store=self.store,
            workspace=self.workspace,
            bus=self.bus,
            executor=self.executor,
            connectors=connectors,
            turns=turns or turn_settings_from_env(),
        )

    def __enter__(self) -> AlphaAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the sandbox and close the database."""
        self.executor.close()
        self.store.close()

    # ------------------------------------------------------------------ turns

    def run_analysis(
        self, spec: Spec | dict[str, Any] | str | bytes, *, progress: Progress | None = None
    ) -> TurnResult:
        """Run a spec end to end (see ``run_turn``); raises ``InvalidSpecError`` for a bad spec."""
        if isinstance(spec, dict):
            import json

            spec = json.dumps(spec)
        parsed = spec if isinstance(spec, Spec) else parse_spec(spec)
        return run_turn(self.backend, parsed, coder=self.coder, progress=progress)

    # ------------------------------------------------------------------ reads (owner-scoped)

    def _owned(self, user_id: str, scope: Scope) -> Scope:
        if self.store.owner_of(scope.owner_key) != user_id or not self.workspace.scope_exists(scope):
            raise NotFoundError(f"{scope_label(scope)} not found")
        return scope

    def files(self, user_id: str, scope: Scope, prefix: str = "") -> list[FileInfo]:
        """The scope's regular files under ``prefix``."""
        self._owned(user_id, scope)
        if prefix:
            prefix = _path_or_not_found(prefix.rstrip("/"), scope)
        return self.workspace.list_files(scope, prefix)

    def read_file(self, user_id: str, scope: Scope, path: str) -> bytes:
        """The bytes of one file of the scope."""
        self._owned(user_id, scope)
        normal = _path_or_not_found(path, scope)
        try:
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

    def run_record(self, user_id: str, run_id: str) -> RunRecord:
        """One run."""
        record = self.store.get_run(user_id, run_id)
        if record is None:
            raise NotFoundError(f"run {run_id} not found")
        return record

    def artifacts(self, user_id: str, scope: Scope) -> list[ArtifactVersion]:
        """Every version of every artifact of the scope."""
        self._owned(user_id, scope)
        return self.store.list_artifacts(user_id, scope.key)

    def artifact(
        self, user_id: str, scope: Scope, name: str, version: int | None = None
    ) -> tuple[ArtifactVersion, bytes]:
        """One artifact version (``None``: the latest) and its immutable bytes."""
        self._owned(user_id, scope)
        found = self.store.get_artifact(user_id, scope.key, name, version)
        if found is None:
            wanted = f"{name} v{version}" if version else name
            raise NotFoundError(f"artifact {wanted} not found in {scope_label(scope)}")
        return found, self.workspace.read_blob(found.sha256)

    def sessions(self, user_id: str, scope: Scope) -> list[Session]:
        """The user's sessions in the scope, oldest first (expired ones included)."""
        self._owned(user_id, scope)
        return self.store.list_sessions(user_id, scope.key)

    def session(self, user_id: str, session_id: str) -> Session:
        """One session (reading it never refreshes its idle timer)."""
        found = self.store.get_session(user_id, session_id)
        if found is None:
            raise NotFoundError(f"session {session_id} not found")
        return found

    def export(self, user_id: str, scope: Scope, out: Path) -> ExportReport:
        """A zip of the scope's files (per-file ceiling 25 MiB; omissions listed in the manifest)."""
        self._owned(user_id, scope)
        return export_scope(self.workspace, scope, out)


def _path_or_not_found(path: str, scope: Scope) -> str:
    """A valid workspace path; ``InvalidRequestError`` naming the rule otherwise (checked only
    after ownership, so it says nothing about another user's scope)."""
    try:
        return check_workspace_path(path, prefix=scope.key + "/")
    except PathRuleError as exc:
        raise InvalidRequestError(f"path {path!r}: {exc}") from None
