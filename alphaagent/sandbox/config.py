"""Configuration of a sandbox (one per execution environment and process)."""

from __future__ import annotations

import sys
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from alphaagent.models.run import RunLimits
from alphaagent.sandbox.capture import RETURNED_OUTPUT_CAP_BYTES, SPILL_CAP_BYTES, STORED_HISTORY_CAP_BYTES

BUILTIN_PRELOAD = ("numpy", "pandas", "pyarrow", "matplotlib")
"""Modules the builtin environment imports once in the zygote (issue 2; DESIGN §5)."""

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
    - ``preload``: modules imported once in the zygote.
    - ``isolation``: ``auto`` uses namespaces where the kernel allows them, else processes.
    - ``exclusive``: one run at a time; after each, every other process of the uid is killed and
      ``wipe_paths`` are emptied (except ``wipe_keep`` and the sandbox's own scratch root).
    - ``pool_size``: children forked ahead of time (0 forks on demand).
    - ``returned_output_bytes`` / ``spill_bytes``: DESIGN §4.3 caps, per stream; a stream that passes
      ``spill_bytes`` kills the run (status ``killed``, reason ``output limit``). A stream is spilled
      to ``work/runs/{run_id}/`` only once it exceeds ``spill_threshold_bytes`` (the stored-history
      cap: shorter output is kept whole in the run record).
    - ``use_cgroup``: bound processes with a pids cgroup when running as root (RLIMIT_NPROC does not
      apply to uid 0).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    python: str = sys.executable
    preload: tuple[str, ...] = BUILTIN_PRELOAD
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
    max_tree_entries: int = Field(100_000, ge=100)
    zygote_start_timeout_s: float = Field(120.0, gt=0)
    redact_env: tuple[str, ...] = DEFAULT_REDACT_ENV
    extra_env: dict[str, str] = {}
    threads: int = Field(1, ge=1, le=64)

    @field_validator("extra_env")
    @classmethod
    def _no_platform_variables(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if name.startswith(("AWS_", "_X_AMZN", "LAMBDA_", "_HANDLER")) or name in DEFAULT_REDACT_ENV:
                raise ValueError(f"extra_env: {name} is a platform variable and never reaches user code")
        return value
