"""``run_in_env`` on the local backend: the sandbox, in-process, one warm zygote per environment."""

from __future__ import annotations

import threading
from pathlib import Path

from alphaagent.domain.names import settle_run_names
from alphaagent.models.run import RunLimits, RunOrigin, RunResult
from alphaagent.sandbox.capture import OutputSink
from alphaagent.sandbox.config import SandboxConfig
from alphaagent.sandbox.supervisor import Sandbox


class SandboxExecutor:
    """Runs code in a lazily started ``Sandbox`` (the zygote starts on the first run, ~1.5 s)."""

    publishes_run_events = False

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self._config = config or SandboxConfig()
        self._sandbox: Sandbox | None = None
        self._lock = threading.Lock()

    def run(
        self,
        workdir: Path,
        code: str,
        *,
        limits: RunLimits,
        run_id: str,
        network: bool = False,
        origin: RunOrigin | None = None,
        on_output: OutputSink | None = None,
    ) -> RunResult:
        """Run ``code`` with ``workdir`` (the scope root) as its working directory (see
        ``Sandbox.run``, which streams to ``on_output``), then settle the names of the files it wrote
        as the AWS env function does (``settle_run_names``: stored under their NFC name;
        ``origin.scope`` gives the key's prefix)."""
        with self._lock:
            if self._sandbox is None:
                self._sandbox = Sandbox(self._config)
            sandbox = self._sandbox
        result = sandbox.run(
            code, cwd=workdir, limits=limits, network=network, run_id=run_id, on_output=on_output
        )
        prefix = "" if origin is None else f"{origin.scope.key}/"
        return settle_run_names(workdir, result, key_prefix=prefix)

    def close(self) -> None:
        """Stop the zygote."""
        with self._lock:
            if self._sandbox is not None:
                self._sandbox.close()
                self._sandbox = None
