"""``run_in_env`` on the local backend: the sandbox, in-process, one warm zygote per environment.

A run goes to the zygote of its environment (``RunOrigin.environment_id``; ``builtin`` without an
origin). That zygote starts on the environment's first run (~1.5 s with the scientific preload) and
stops once it has been idle for ``idle_s``: a background reaper checks a few times per idle period
and ends with ``close()``. The environment's limits are ceilings: a run's limits are lowered to them
(``EnvironmentLimits.bound``), never raised, and network access is the environment's unless the
caller asks for less.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from alphaagent.domain.names import settle_run_names
from alphaagent.environments import (
    BUILTIN_ID,
    Environment,
    EnvironmentRegistry,
    LocalStart,
    StaticRegistry,
    builtin_local,
)
from alphaagent.errors import EnvStartError, SandboxError
from alphaagent.models.run import RunLimits, RunOrigin, RunResult
from alphaagent.sandbox.capture import OutputSink
from alphaagent.sandbox.config import SandboxConfig
from alphaagent.sandbox.session import DEFAULT_SAVE_S, StateRequest
from alphaagent.sandbox.supervisor import Sandbox

DEFAULT_IDLE_S = 600.0
"""How long an environment's zygote stays warm without a run (10 min): long enough for a coder's
runs of one turn and the next turn of a conversation, short enough that an environment used once
does not hold its preloaded memory (~400 MiB for the scientific stack, plus spares) all day."""

_MAX_REAP_INTERVAL_S = 30.0


@dataclass
class _Warm:
    """One environment's sandbox and its use: runs in flight, when the last one ended (monotonic s)."""

    environment: Environment
    sandbox: Sandbox
    in_flight: int = 0
    runs: int = 0
    last_used: float = 0.0
    retired: bool = False


def _same_start(a: Environment, b: Environment) -> bool:
    """Whether a zygote started for ``a`` serves ``b`` (an id removed and registered again with
    another interpreter or preload must not reach the old zygote)."""
    return (a.start, a.preload, a.registered_at) == (b.start, b.preload, b.registered_at)


def config_for(builtin: SandboxConfig, environment: Environment) -> SandboxConfig:
    """The sandbox settings of a local ``environment``: ``builtin``'s as they are for builtin;
    for another, ``builtin``'s with its own interpreter and preload and no warm-up
    (``BUILTIN_WARMUP`` exercises the scientific stack, which another environment may not have)."""
    if environment.environment_id == BUILTIN_ID:
        return builtin
    assert isinstance(environment.start, LocalStart)  # callers refuse any other kind of start
    return builtin.model_copy(
        update={"python": environment.start.python, "preload": environment.preload, "warmup": ""}
    )


class SandboxExecutor:
    """Runs code in the warm ``Sandbox`` of the run's environment; thread-safe.

    Args:
        config: the sandbox settings of ``builtin``, used as they are; another environment gets
            them with its own interpreter and preload (and no warm-up: ``BUILTIN_WARMUP`` exercises
            the scientific stack, which another environment may not have).
        environments: where environments are looked up on every run (so a removal by another
            process is seen at the next run); default: ``builtin`` alone.
        idle_s: seconds without a run after which an environment's zygote is stopped.
        clock: monotonic seconds (tests inject one and call ``reap_idle``).
    """

    publishes_run_events = False

    def __init__(
        self,
        config: SandboxConfig | None = None,
        *,
        environments: EnvironmentRegistry | None = None,
        idle_s: float = DEFAULT_IDLE_S,
        clock: Callable[[], float] = time.monotonic,
        state_save_s: float = DEFAULT_SAVE_S,
    ) -> None:
        if idle_s <= 0:
            raise ValueError("idle_s: must be > 0 seconds")
        self._config = config or SandboxConfig()
        self._environments = environments or StaticRegistry([builtin_local(self._config.python)])
        self._idle_s = idle_s
        self._clock = clock
        self._state_save_s = state_save_s
        self._warm: dict[str, _Warm] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None
        self._closed = False

    def run(
        self,
        workdir: Path,
        code: str,
        *,
        limits: RunLimits,
        run_id: str,
        network: bool | None = None,
        origin: RunOrigin | None = None,
        on_output: OutputSink | None = None,
    ) -> RunResult:
        """Run ``code`` with ``workdir`` (the scope root) as its working directory in the zygote of
        ``origin.environment_id`` (see ``Sandbox.run``, which streams to ``on_output``), with
        ``limits`` lowered to the environment's ceilings and network access only where the
        environment allows it (``network=None``: the environment's default). Then settle the names
        of the files it wrote as the AWS env function does (``settle_run_names``: stored under their
        NFC name; ``origin.scope`` gives the key's prefix). With an ``origin``, the run restores and
        saves its session's live state (``origin.session_id``; ``origin.fresh``: empty globals, the
        saved state kept), capped at the environment's ``state_mb`` and ``state_save_s`` seconds.

        Raises ``EnvStartError`` when the environment is unknown, removed, not a local one, or its
        zygote does not start; ``SandboxError`` when the executor is closed.
        """
        environment = self._environment(BUILTIN_ID if origin is None else origin.environment_id)
        ceilings = environment.limits
        allowed = ceilings.network if network is None else network and ceilings.network
        state = None
        if origin is not None:
            state = StateRequest(
                session_id=origin.session_id,
                fresh=origin.fresh,
                max_bytes=ceilings.state_mb * 2**20,
                max_save_s=self._state_save_s,
            )
        warm = self._check_out(environment)
        try:
            result = warm.sandbox.run(
                code,
                cwd=workdir,
                limits=ceilings.bound(limits),
                network=allowed,
                run_id=run_id,
                on_output=on_output,
                state=state,
            )
        finally:
            self._check_in(warm)
        prefix = "" if origin is None else f"{origin.scope.key}/"
        return settle_run_names(workdir, result, key_prefix=prefix)

    def sandbox(self, environment_id: str = BUILTIN_ID) -> Sandbox | None:
        """The environment's warm sandbox, or None if it has none now (never starts one)."""
        with self._lock:
            warm = self._warm.get(environment_id)
        return None if warm is None else warm.sandbox

    @property
    def config(self) -> SandboxConfig:
        """The sandbox settings of ``builtin`` (other environments: see the class docstring)."""
        return self._config

    def zygotes(self) -> dict[str, int]:
        """The process id of each environment's running zygote (environments with a warm one)."""
        with self._lock:
            warm = list(self._warm.items())
        return {eid: int(w.sandbox.info["pid"]) for eid, w in warm if w.runs}

    def reap_idle(self) -> list[str]:
        """Stop every zygote without a run in flight whose last run ended ``idle_s`` ago or more;
        the ids of their environments."""
        now = self._clock()
        with self._lock:
            idle = [w for w in self._warm.values() if w.in_flight == 0 and now - w.last_used >= self._idle_s]
            for w in idle:
                del self._warm[w.environment.environment_id]
        for w in idle:
            w.sandbox.close()
        return [w.environment.environment_id for w in idle]

    def close(self) -> None:
        """Stop the reaper and every zygote (their runs are killed)."""
        with self._lock:
            self._closed = True
            warm = list(self._warm.values())
            self._warm.clear()
            reaper, self._reaper = self._reaper, None
        self._stop.set()
        if reaper is not None:
            reaper.join()
        for w in warm:
            w.sandbox.close()

    # ------------------------------------------------------------------ internals

    def _environment(self, environment_id: str) -> Environment:
        found = self._environments.get(environment_id)
        if found is None or found.status != "ready":
            self._retire(environment_id)  # removed meanwhile: its zygote has nothing more to run
            state = "was removed" if found is not None else "is not registered"
            raise EnvStartError(f"environment {environment_id!r} {state}")
        if not isinstance(found.start, LocalStart):
            raise EnvStartError(f"environment {environment_id!r} runs on AWS Lambda, not locally")
        return found

    def _config_for(self, environment: Environment) -> SandboxConfig:
        return config_for(self._config, environment)

    def _check_out(self, environment: Environment) -> _Warm:
        stale: _Warm | None = None
        with self._lock:
            if self._closed:
                raise SandboxError("the executor is closed")
            warm = self._warm.get(environment.environment_id)
            if warm is not None and not _same_start(warm.environment, environment):
                stale = self._retire_locked(environment.environment_id)
                warm = None
            if warm is None:
                sandbox = Sandbox(self._config_for(environment), label=environment.environment_id)
                warm = _Warm(environment, sandbox)
                self._warm[environment.environment_id] = warm
                self._start_reaper()
            warm.in_flight += 1
        if stale is not None:
            stale.sandbox.close()
        return warm

    def _retire(self, environment_id: str) -> None:
        with self._lock:
            stale = self._retire_locked(environment_id)
        if stale is not None:
            stale.sandbox.close()

    def _retire_locked(self, environment_id: str) -> _Warm | None:
        """Take an environment's sandbox out of use (with ``_lock`` held); it, when it has no run in
        flight and the caller must close it (else its last run closes it)."""
        warm = self._warm.pop(environment_id, None)
        if warm is None:
            return None
        warm.retired = True
        return warm if warm.in_flight == 0 else None

    def _check_in(self, warm: _Warm) -> None:
        with self._lock:
            warm.in_flight -= 1
            warm.runs += 1
            warm.last_used = self._clock()
            close = warm.retired and warm.in_flight == 0
        if close:
            warm.sandbox.close()

    def _start_reaper(self) -> None:
        """Start the reaper thread if it is not running (called with ``_lock`` held)."""
        if self._reaper is not None:
            return
        interval = min(max(self._idle_s / 4, 0.05), _MAX_REAP_INTERVAL_S)

        def reap() -> None:
            while not self._stop.wait(interval):
                self.reap_idle()

        self._reaper = threading.Thread(target=reap, name="sandbox-reaper", daemon=True)
        self._reaper.start()
