"""Configuration of a sandbox (one per execution environment and process)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from alphaagent.models.run import RunLimits
from alphaagent.sandbox.capture import RETURNED_OUTPUT_CAP_BYTES, SPILL_CAP_BYTES, STORED_HISTORY_CAP_BYTES

BUILTIN_PRELOAD = ("numpy", "pandas", "pyarrow", "matplotlib")
"""Modules the builtin environment imports once in the zygote (issue 2; DESIGN §5)."""

BUILTIN_WARMUP = """
import io
import numpy as np
import pandas as pd
import matplotlib.pyplot as plt
frame = pd.read_csv(io.StringIO("k,v\\na,1\\nb,2\\na,3\\n"))
frame.groupby("k")["v"].agg(["sum", "mean"]).reset_index().merge(frame, on="k").describe()
frame.to_csv(io.StringIO())
np.linalg.inv(np.eye(3))
fig, ax = plt.subplots()
ax.plot([1, 2], [3, 4])
fig.savefig(io.BytesIO(), format="png")
plt.close("all")
"""
"""Run once in the zygote after the preload, so every run starts with pandas' and matplotlib's
one-off set-up already done (a first DataFrame operation costs ~10 ms in a fresh fork)."""

DEFAULT_REDACT_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
)
"""Variables of the supervisor whose values are redacted from output, as a last line of defence:
the child never receives them in the first place."""


class SandboxConfig(BaseModel):
    """How a ``Sandbox`` runs code. Defaults are the local backend's; the env Lambda sets
    ``exclusive=True``, ``isolation="process"`` and ``wipe_paths=("/tmp",)``.

    - ``python``: the environment's interpreter (the zygote runs under it).
    - ``preload``: modules imported once in the zygote; ``warmup``: code the zygote runs once after.
      Left unset, ``warmup`` is ``BUILTIN_WARMUP`` only when ``preload`` holds every builtin module
      (``_warmup_follows_preload``), else empty.
    - ``isolation``: ``auto`` uses namespaces where the kernel allows them, else processes.
    - ``exclusive``: one run at a time; after each, every other process of the uid is killed and
      ``wipe_paths`` are emptied (except ``wipe_keep`` and the sandbox's own scratch root, which is
      reset instead to what it held when the zygote became ready).
    - ``pool_size``: children forked ahead of time (0 forks on demand).
    - Serving spares (``bench/turn.py`` measures it): a run waits in the zygote's queue until a spare
      is ready, and that wait is its ``queued_ms``, never part of its ``duration_ms`` or timeout.
      ``max_preparing_spares``: spares being prepared at once (one is forked per waiting run, up to
      this; their set-up mostly waits on the kernel, so a few overlap well on two cores).
      ``spawn_timeout_s``: how long the zygote may take to acknowledge a request (past it, it is
      stopped or wedged and is replaced), and a spare to become ready or to take the run it was
      handed (past it, that spare is killed and replaced: no other run is touched).
      ``queue_timeout_s``: how long a run may wait for a spare before it fails alone.
      ``max_concurrent_runs``: runs of this sandbox in progress at once (0: no bound); a run over
      it waits for a slot, and that wait is part of its ``queued_ms``.
    - ``returned_output_bytes`` / ``spill_bytes``: DESIGN §4.3 caps, per stream; a stream that passes
      ``spill_bytes`` kills the run (status ``killed``, reason ``output limit``). A stream is spilled
      to ``work/runs/{run_id}/`` only once it exceeds ``spill_threshold_bytes`` (the stored-history
      cap: shorter output is kept whole in the run record).
    - ``use_cgroup``: bound processes with a pids cgroup when running as root (RLIMIT_NPROC does not
      apply to uid 0).
    - ``landlock``: put each run, at both levels, in a Landlock domain of its own where the kernel
      has Landlock ABI 2+ (5.19+), so at the ``process`` level it cannot read another process's
      ``/proc/<pid>/environ`` nor write beneath the kernel's filesystems, and at the ``namespaces``
      level it writes only where its mounts let it (``IsolationReport.landlock_abi``).
      Without namespaces and without Landlock, the sandbox refuses to start while any process a run
      could read holds one of ``redact_env`` (``False`` forces that path; tests use it).
    - ``memory_cgroup``: hold each run to ``memory_mb`` in all with a memory cgroup where one can be
      created (root); the result's ``isolation.memory_bound`` says whether it was in force.
    - ``private_dev`` / ``sized_tmp``: at the ``namespaces`` level, give each run a minimal ``/dev``
      of its own and a sized tmpfs for ``/tmp``. Turning them off restores the earlier behaviour (the
      host's ``/dev`` read-only, ``/tmp`` an unsized directory in host RAM) and exists to measure the
      difference (``bench/sandbox.py``), not for production use.
    - ``disk_poll_s``: how often the supervisor checks the scope's filesystem for growth while a run
      runs (one ``statvfs``; the scope is walked only when the filesystem grew by more than what is
      left of the run's ``disk_mb``, and at most every 20 walk-durations, see ``ScopeDiskBudget``).
    - ``max_tree_entries``: with ``incremental_snapshot``, the changed paths one run's result lists
      (created + modified + deleted); past it the result says ``truncated`` with the ``unreported``
      count, and those paths are reported by the next run (the walk itself records every entry). On
      the old full-walk path, the entries a snapshot records before it stops.
    - ``incremental_snapshot``: keep each scope's tree state between runs and walk only what changed
      (``alphaagent.sandbox.treestate``). ``False`` restores the walk-before-and-after snapshot and
      exists to measure the difference (``bench/scale.py``), not for production use.
    - ``clone_spares``: at the ``namespaces`` level, make each spare with one ``clone(2)`` straight
      into its fresh namespaces (``zygote._clone_into_namespaces``) rather than a fork and a helper
      that unshares (one fork of the preloaded interpreter more per run). Where the zygote's probe
      of the clone path fails, it uses the helper path by itself (the ready message's ``spares``
      and ``clone_refused`` say which). ``False`` forces the helper path and exists to measure the
      difference (``bench/spare.py``), not for production use.
    - ``hidden_paths``: directories a run must not see at the ``namespaces`` level (covered by an
      empty tmpfs): by default the supervisor's home (``~/.ssh``, ``~/.aws``...); the local backend
      adds its data directory, where the other conversations live.
    - ``deny_tcp_connect_ports``: TCP ports no run may connect to, on any address, enforced with
      Landlock where the kernel has it (ABI 4+, ``alphaagent.sandbox.landlock``): the env Lambda
      denies the Runtime API's 9001. Whether it is in force is the ready message's ``landlock``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    python: str = sys.executable
    preload: tuple[str, ...] = BUILTIN_PRELOAD
    warmup: str = BUILTIN_WARMUP
    isolation: Literal["auto", "namespaces", "process"] = "auto"
    exclusive: bool = False
    pool_size: int = Field(2, ge=0, le=16)
    returned_output_bytes: int = Field(RETURNED_OUTPUT_CAP_BYTES, ge=4096)
    spill_bytes: int = Field(SPILL_CAP_BYTES, ge=4096)
    spill_threshold_bytes: int = Field(STORED_HISTORY_CAP_BYTES, ge=0)
    default_limits: RunLimits = RunLimits()
    scratch_dir: str | None = None
    wipe_paths: tuple[str, ...] = ()
    wipe_keep: tuple[str, ...] = ()
    use_cgroup: bool = True
    memory_cgroup: bool = True
    private_dev: bool = True
    sized_tmp: bool = True
    disk_poll_s: float = Field(0.05, gt=0, le=10)
    max_tree_entries: int = Field(100_000, ge=100)
    incremental_snapshot: bool = True
    clone_spares: bool = True
    zygote_start_timeout_s: float = Field(120.0, gt=0)
    spawn_timeout_s: float = Field(15.0, gt=0)
    queue_timeout_s: float = Field(300.0, gt=0)
    max_preparing_spares: int = Field(8, ge=1, le=64)
    max_concurrent_runs: int = Field(0, ge=0, le=4096)
    redact_env: tuple[str, ...] = DEFAULT_REDACT_ENV
    landlock: bool = True
    extra_env: dict[str, str] = {}
    threads: int = Field(1, ge=1, le=64)
    hidden_paths: tuple[str, ...] = Field(default_factory=lambda: (str(Path.home()),))
    deny_tcp_connect_ports: tuple[int, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _warmup_follows_preload(cls, data: Any) -> Any:
        # BUILTIN_WARMUP imports numpy, pandas and matplotlib itself: under a preload without them it
        # would import them anyway (a zygote start of ~2 CPU-s instead of ~0.2) or fail where they
        # are missing. An explicit ``warmup`` is kept as given.
        if (
            isinstance(data, dict)
            and "preload" in data
            and "warmup" not in data
            and not set(BUILTIN_PRELOAD) <= set(data["preload"] or ())
        ):
            return {**data, "warmup": ""}
        return data

    @model_validator(mode="after")
    def _tmp_needs_host_dev(self) -> SandboxConfig:
        # The unsized /tmp is a directory in the scratch root, usually under the host's /dev/shm,
        # which a private /dev hides.
        if not self.sized_tmp and self.private_dev:
            raise ValueError("sized_tmp: False (the unsized scratch /tmp) needs private_dev=False too")
        return self

    @field_validator("extra_env")
    @classmethod
    def _no_platform_variables(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if name.startswith(("AWS_", "_X_AMZN", "LAMBDA_", "_HANDLER")) or name in DEFAULT_REDACT_ENV:
                raise ValueError(f"extra_env: {name} is a platform variable and never reaches user code")
        return value
