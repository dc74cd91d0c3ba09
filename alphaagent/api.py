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

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alphaagent import clock
from alphaagent.domain.audit import JsonLinesAudit
from alphaagent.domain.reads import ScopeReads
from alphaagent.local.settings import alphaagent_home as alphaagent_home  # re-exported: public here too
from alphaagent.local.settings import local_settings
from alphaagent.local.store import SqliteStore
from alphaagent.local.workspace import LocalWorkspace
from alphaagent.models.common import Scope

# The rest of the backend (the event bus, the sandbox and its executor, the environments, the
# connectors, the turn driver, the export) is imported when a command first uses it: a read
# command (files, cat, turns, history, artifacts) needs only the store and the workspace
# (bench/cli_start.py measures what a command costs before it does its work).
if TYPE_CHECKING:
    from alphaagent.domain.backend import Backend, ConnectorSettings, TurnSettings
    from alphaagent.domain.turns import Coder, Progress
    from alphaagent.environments import Environment, EnvironmentLimits
    from alphaagent.local.bus import InProcessBus
    from alphaagent.local.environments import LocalEnvironmentRegistry
    from alphaagent.local.executor import SandboxExecutor
    from alphaagent.local.export import ExportReport
    from alphaagent.models.records import TurnResult
    from alphaagent.models.spec import Spec
    from alphaagent.ports import OutputSink
    from alphaagent.sandbox.config import SandboxConfig

DATABASE_NAME = "alphaagent.db"

AUDIT_FILE = "audit.jsonl"
"""The audit trail of requests for another user's things, in the home (``JsonLinesAudit``)."""


def connector_settings_from_env() -> ConnectorSettings:
    """Every registered connector's local variables (``ALPHAAGENT_FILE_ROOTS``: ``os.pathsep``-separated
    directories, default the checkout's ``examples/``; ``ALPHAAGENT_HTTP_HOSTS``,
    ``ALPHAAGENT_S3_PREFIXES``: comma-separated, default none; see ``ConnectorSettings.from_env``)."""
    return local_settings().connector_settings


def zygote_idle_s_from_env() -> float:
    """``ALPHAAGENT_ZYGOTE_IDLE_S``: seconds an environment's zygote stays warm without a run
    (default 600, ``alphaagent.local.executor.DEFAULT_IDLE_S``)."""
    return local_settings().ALPHAAGENT_ZYGOTE_IDLE_S


def turn_settings_from_env() -> TurnSettings:
    """``ALPHAAGENT_LOCK_LEASE_S`` (default 60), ``ALPHAAGENT_LOCK_WAIT_S`` (600),
    ``ALPHAAGENT_SESSION_IDLE_S`` (900) and ``ALPHAAGENT_SESSION_MAX_S`` (28,800), from
    ``local_settings()``; raises ``InvalidSettingError`` naming a malformed one."""
    return local_settings().turn_settings()


class AlphaAgent(ScopeReads):
    """The local backend: files under ``home``, records in ``home/alphaagent.db``, code in the sandbox.

    The owner-scoped reads (``files``, ``read_file``, ``turns``, ``turn``, ``artifacts``, ``artifact``,
    ...) come from ``ScopeReads``, which the AWS client shares.

    ``read_only=True`` (the CLI's read commands) creates nothing: no data directory, no database.
    Otherwise the data directory and its database are created by the first write (a turn that
    starts, an environment registered), never by a request that is refused.
    A data directory without a database answers exactly like an empty one (every scope not found,
    every list empty), through an empty in-memory store."""

    def __init__(
        self,
        home: Path | None = None,
        *,
        connectors: ConnectorSettings | None = None,
        turns: TurnSettings | None = None,
        sandbox: SandboxConfig | None = None,
        coder: Coder | None = None,
        read_only: bool = False,
    ) -> None:
        self.home = home or alphaagent_home()
        # Every setting is checked now, as before the backend was built lazily: a malformed one is
        # refused by any command that opens the data directory, not only by the first that runs code.
        local_settings()
        database = self.home / DATABASE_NAME
        if read_only and not database.is_file():
            database = Path(":memory:")  # sqlite3's name for a private database that is never on disk
        # The data directory and its database appear with the first write, so a refused spec (or
        # environment) leaves nothing behind in a new home.
        self.store: SqliteStore = SqliteStore(database, create="now" if read_only else "on_first_write")
        self.workspace: LocalWorkspace = LocalWorkspace(self.home)
        self.coder = coder
        self.audit_trail = JsonLinesAudit(self.home / AUDIT_FILE)
        self.audit = self.audit_trail
        self._sandbox = sandbox
        self._connectors = connectors
        self._turns = turns
        self._clock = clock.get_clock()  # the process's clock when the agent is made, as before
        self._built: dict[str, Any] = {}
        self._building = threading.RLock()  # one executor (and its zygotes) however many threads ask

    def _once(self, name: str, build: Any) -> Any:
        """The part ``name`` of the backend, built by ``build()`` on first use."""
        with self._building:
            if name not in self._built:
                self._built[name] = build()
            return self._built[name]

    @property
    def sandbox_config(self) -> SandboxConfig:
        """The sandbox configuration of this agent's runs (the given one, ``home`` hidden)."""

        def build() -> SandboxConfig:
            from alphaagent.sandbox.config import SandboxConfig

            # Runs must not see the other scopes under home, nor the supervisor's home directory:
            # a caller's configuration (a lighter preload, say) hides them too.
            base = self._sandbox or SandboxConfig()
            hidden = (*base.hidden_paths, str(Path.home()), str(self.home.resolve()))
            return base.model_copy(update={"hidden_paths": tuple(dict.fromkeys(hidden))})

        config: SandboxConfig = self._once("sandbox_config", build)
        return config

    @property
    def bus(self) -> InProcessBus:
        """The event bus; the recorder writes its events to the store."""

        def build() -> InProcessBus:
            from alphaagent.domain.recorder import Recorder
            from alphaagent.local.bus import InProcessBus

            bus = InProcessBus()
            bus.subscribe(Recorder(self.store).handle)
            return bus

        bus: InProcessBus = self._once("bus", build)
        return bus

    @property
    def environments(self) -> LocalEnvironmentRegistry:
        """``builtin`` and the environments registered in the data directory."""

        def build() -> LocalEnvironmentRegistry:
            from alphaagent.environments import builtin_local
            from alphaagent.local.environments import LocalEnvironmentRegistry

            return LocalEnvironmentRegistry(self.store, builtin_local(self.sandbox_config.python))

        environments: LocalEnvironmentRegistry = self._once("environments", build)
        return environments

    @property
    def executor(self) -> SandboxExecutor:
        """Runs code in the environments' sandboxes (each zygote starts with its first run)."""

        def build() -> SandboxExecutor:
            from alphaagent.local.executor import SandboxExecutor

            return SandboxExecutor(
                self.sandbox_config, environments=self.environments, idle_s=zygote_idle_s_from_env()
            )

        executor: SandboxExecutor = self._once("executor", build)
        return executor

    @property
    def backend(self) -> Backend:
        """Everything a turn needs (``alphaagent.domain.backend.Backend``)."""

        def build() -> Backend:
            from alphaagent.domain.backend import Backend

            connectors = self._connectors or connector_settings_from_env()
            connectors = connectors.replace(forbidden_roots=(*connectors.forbidden_roots, self.home))
            return Backend(
                store=self.store,
                workspace=self.workspace,
                bus=self.bus,
                executor=self.executor,
                environments=self.environments,
                connectors=connectors,
                turns=self._turns or turn_settings_from_env(),
                audit=self.audit,
                clock=self._clock,
            )

        backend: Backend = self._once("backend", build)
        return backend

    def __enter__(self) -> AlphaAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the sandbox (if a run started it), write the audit trail's queued lines and close
        the database."""
        with self._building:
            executor = self._built.get("executor")
        if executor is not None:
            executor.close()
        self.audit_trail.close()
        self.store.close()

    # ------------------------------------------------------------------ turns

    def run_analysis(
        self,
        spec: Spec | dict[str, Any] | str | bytes,
        *,
        progress: Progress | None = None,
        on_output: OutputSink | None = None,
    ) -> TurnResult:
        """Run a spec end to end (see ``run_turn``: ``progress`` gets each step, ``on_output`` each
        run's output as it is produced); raises ``InvalidSpecError`` for a bad spec."""
        from alphaagent.domain.turns import run_turn
        from alphaagent.models.spec import Spec, parse_spec

        if isinstance(spec, dict):
            import json

            spec = json.dumps(spec)
        parsed = spec if isinstance(spec, Spec) else parse_spec(spec)
        return run_turn(self.backend, parsed, coder=self.coder, progress=progress, on_output=on_output)

    # ------------------------------------------------------------------ environments

    def add_environment(
        self,
        environment_id: str,
        python: str,
        *,
        preload: tuple[str, ...] = (),
        description: str = "",
        limits: EnvironmentLimits | None = None,
    ) -> Environment:
        """Register a local execution environment after starting its zygote once (see
        ``register_environment``); raises ``InvalidEnvironmentError`` naming the field, with
        nothing registered."""
        from alphaagent.local.environments import register_environment

        return register_environment(
            self.environments,
            self.sandbox_config,
            environment_id=environment_id,
            python=python,
            preload=preload,
            description=description,
            limits=limits,
        )

    def remove_environment(self, environment_id: str) -> Environment:
        """Remove an environment: specs naming it are refused from now on (exit 2, naming the
        available ones); its record is kept. ``builtin`` cannot be removed."""
        return self.environments.remove(environment_id)

    # ------------------------------------------------------------------ local-only reads

    def export(self, user_id: str, scope: Scope, out: Path) -> ExportReport:
        """A zip of the scope's files (per-file ceiling 25 MiB; omissions listed in the manifest)."""
        from alphaagent.local.export import export_scope

        self._owned(user_id, scope)
        return export_scope(self.workspace, scope, out)
