"""The adapters one process works with, bundled (a local backend or, later, the AWS one)."""

from __future__ import annotations

from dataclasses import dataclass, field

from alphaagent import clock
from alphaagent.clock import Clock
from alphaagent.connectors import ConnectorSettings
from alphaagent.domain.audit import ProbeAudit, discard_audit
from alphaagent.environments import EnvironmentRegistry, StaticRegistry, builtin_local
from alphaagent.ports import EventBus, Executor, Store, Workspace


@dataclass(frozen=True)
class TurnSettings:
    """Timing of turns, in seconds: the scope lease, how long a turn waits for a busy scope, and
    the session timeouts of DESIGN §4.7 (15 minutes idle, 8 hours at most)."""

    lock_lease_s: float = 60.0
    lock_wait_s: float = 600.0
    session_idle_timeout_s: int = 15 * 60
    session_max_lifetime_s: int = 8 * 60 * 60


@dataclass
class Backend:
    """Everything a turn needs: records, files, events and the code executor."""

    store: Store
    workspace: Workspace
    bus: EventBus
    executor: Executor
    environments: EnvironmentRegistry = field(default_factory=lambda: StaticRegistry([builtin_local()]))
    """The environments this backend runs (``alphaagent.environments``)."""
    connectors: ConnectorSettings = field(default_factory=ConnectorSettings)
    """The settings of every registered connector (``alphaagent.connectors``)."""
    turns: TurnSettings = field(default_factory=TurnSettings)
    audit: ProbeAudit = discard_audit
    """Where requests for another user's things are recorded (``alphaagent.domain.audit``)."""
    clock: Clock = field(default_factory=lambda: _process_clock())
    """What the scope's lease is taken, renewed and waited for with (``alphaagent.clock``)."""


def _process_clock() -> Clock:
    """The process's clock, read when a backend is made (a test's fake clock, if it set one)."""
    return clock.get_clock()


__all__ = ["Backend", "ConnectorSettings", "TurnSettings"]
