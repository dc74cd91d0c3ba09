"""The run contract (DESIGN §4.4): what ``run_in_env`` takes and returns.

A failure of user code is data (``status`` and ``error``), never an exception.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# The bounds of the per-run limits (Lambda's quotas) live where the command line reads them
# without pydantic; re-exported here, where they always were.
from alphaagent.models.bounds import MAX_MEMORY_MB as MAX_MEMORY_MB
from alphaagent.models.bounds import MAX_TIMEOUT_S as MAX_TIMEOUT_S
from alphaagent.models.bounds import MIN_MEMORY_MB as MIN_MEMORY_MB
from alphaagent.models.common import ConversationScope, NodeScope

RunStatus = Literal["ok", "error", "timeout", "killed"]
IsolationLevel = Literal["namespaces", "process"]

DEFAULT_DISK_MB = 10_240
"""A run's default write budget for its scope: 10 GiB, Lambda's largest ephemeral storage (where the
env function's working copy lives), so a run that passes locally also fits there."""
MAX_DISK_MB = 1_048_576


class RunLimits(BaseModel):
    """Resource limits of one run. Units are in the field names; defaults are the product's defaults.

    ``memory_mb`` caps each process's address space (``RLIMIT_AS``; the preloaded scientific stack
    already maps about 400 MiB of it) and, where the supervisor can create a memory cgroup (root), all
    the RAM the run holds: its processes together, its ``/tmp`` and ``/dev/shm`` pages, ``memfd``
    files and page cache. ``tmp_mb`` / ``shm_mb`` size the run's private ``/tmp`` and ``/dev/shm``
    tmpfs at the ``namespaces`` level (``tmp_mb`` defaults to half of ``memory_mb``); a write past
    them fails with ``ENOSPC``. ``disk_mb`` is the budget of what the run may add to its scope
    (allocated bytes, so a sparse file counts what it really takes); a run past it is killed
    (``DiskLimitExceeded``). ``processes`` is ``RLIMIT_NPROC`` (or a pids cgroup when the supervisor
    runs as root, where ``RLIMIT_NPROC`` does not apply). ``cpu_s`` defaults to the timeout.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout_s: float = Field(60.0, gt=0, le=MAX_TIMEOUT_S)
    memory_mb: int = Field(2048, ge=MIN_MEMORY_MB, le=MAX_MEMORY_MB)
    cpu_s: int | None = Field(None, ge=1, le=MAX_TIMEOUT_S * 4)
    file_size_mb: int = Field(1024, ge=1, le=10 * 1024)
    open_files: int = Field(1024, ge=16, le=65_536)
    processes: int = Field(256, ge=1, le=4096)
    tmp_mb: int | None = Field(None, ge=1, le=MAX_MEMORY_MB)
    shm_mb: int = Field(64, ge=1, le=MAX_MEMORY_MB)
    disk_mb: int = Field(DEFAULT_DISK_MB, ge=1, le=MAX_DISK_MB)

    def effective_cpu_s(self) -> int:
        """CPU seconds allowed: ``cpu_s``, or the wall-clock timeout rounded up."""
        return self.cpu_s if self.cpu_s is not None else max(1, int(self.timeout_s + 0.999))

    def effective_tmp_mb(self) -> int:
        """Size of the private ``/tmp`` in MiB: ``tmp_mb``, or half of ``memory_mb``."""
        return self.tmp_mb if self.tmp_mb is not None else self.memory_mb // 2


class RunOrigin(BaseModel):
    """Whose run it is and where: what an executor that runs code elsewhere (the env Lambda) needs
    besides the code, so the run's records and events can be written there (``EnvRequest``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    turn_id: str
    session_id: str
    user_id: str
    scope: ConversationScope | NodeScope
    environment_id: str = "builtin"
    fresh: bool = False
    """Run with empty globals, leaving the session's saved live state as it is (DESIGN §4.7)."""


MAX_STATE_NAMES = 100
"""Names listed per field of ``StateReport`` (the child caps them too; the counts say how many)."""


class StateReport(BaseModel):
    """What a run kept of its session's live state (DESIGN §4.7): the names restored into its globals
    before the code ran, the names saved after it, the names left out with the reason, and the whole
    saved state's size. Lists hold at most ``MAX_STATE_NAMES`` names (``*_count`` are the totals);
    ``fresh``: the run started with empty globals and left the saved state as it was
    (``run_in_env(fresh=True)``); ``save_error``: the state could not be written (the previous one
    stays); ``written_bytes``: bytes this run wrote (unchanged objects are not written again)."""

    restored: list[str] = []
    restored_count: int = 0
    saved: list[str] = []
    saved_count: int = 0
    skipped: dict[str, str] = {}
    bytes: int = 0
    written_bytes: int = 0
    restore_ms: int | None = None
    save_ms: int | None = None
    fresh: bool = False
    save_error: str | None = None

    @classmethod
    def from_child(cls, data: object) -> StateReport | None:
        """The report in the child's status line, read defensively (the code may have written it):
        names and reasons cut to size, anything malformed dropped; never raises."""
        if not isinstance(data, dict):
            return None

        def names(key: str) -> list[str]:
            value = data.get(key)
            return [str(n)[:200] for n in value[:MAX_STATE_NAMES]] if isinstance(value, list) else []

        def number(key: str) -> int | None:
            value = data.get(key)
            # The code may have written it: NaN, infinity and absurd sizes are no number at all.
            if isinstance(value, bool) or not isinstance(value, int | float):
                return None
            return int(value) if 0 <= value < 2**63 else None

        skipped = data.get("skipped")
        restored, saved = names("restored"), names("saved")
        return cls(
            restored=restored,
            restored_count=max(number("restored_count") or 0, len(restored)),
            saved=saved,
            saved_count=max(number("saved_count") or 0, len(saved)),
            skipped={str(k)[:200]: str(v)[:300] for k, v in list(skipped.items())[:MAX_STATE_NAMES]}
            if isinstance(skipped, dict)
            else {},
            bytes=number("bytes") or 0,
            written_bytes=number("written_bytes") or 0,
            restore_ms=number("restore_ms"),
            save_ms=number("save_ms"),
            fresh=data.get("fresh") is True,
            save_error=str(data["save_error"])[:500] if data.get("save_error") else None,
        )


class RunError(BaseModel):
    """Why user code did not finish normally, in the shape of E2B's execution error."""

    name: str
    value: str
    traceback: str


class SkippedPath(BaseModel):
    """A path the run created or changed that is not reported as content (a symlink, a FIFO...)."""

    path: str
    reason: str


class FileChangeReport(BaseModel):
    """Regular files the run created, modified or deleted, relative to the working directory."""

    created: list[str] = []
    modified: list[str] = []
    deleted: list[str] = []
    skipped: list[SkippedPath] = []
    truncated: bool = False
    unreported: int = 0
    """Changed paths left out of this report because more changed than one result lists
    (``SandboxConfig.max_tree_entries``); the next run in the same scope reports them."""


class LandlockState(BaseModel):
    """Whether the run was denied TCP connections to ``denied_tcp_ports`` by Landlock
    (``alphaagent.sandbox.landlock``): on Lambda, the Runtime API's port. ``in_force`` False says why
    in ``detail`` (the kernel has no Landlock, or an ABI below 4 without network rules); ``abi`` is
    the kernel's Landlock ABI version (0: none)."""

    in_force: bool
    abi: int
    denied_tcp_ports: list[int]
    detail: str


class IsolationReport(BaseModel):
    """Which isolation level and which bounds were in force for one run (DESIGN §4.4).

    - ``memory_bound``: ``cgroup`` when a memory cgroup held the whole run to ``memory_mb`` (tmpfs and
      ``memfd`` pages included), ``rlimit_as`` when only each process's address space was capped.
    - ``dev``: ``private`` (a minimal ``/dev`` of the run's own) or ``host`` (the host's, read-only
      at the ``namespaces`` level; all of it at the ``process`` level).
    - ``tmp_mb`` / ``shm_mb``: sizes of the run's private ``/tmp`` and ``/dev/shm`` tmpfs, or None when
      they are not sized per run (the ``process`` level).
    - ``host_unix_sockets``: ``blocked`` when the run can create no socket that reaches a host unix
      socket (its seccomp filter refuses ``socket(AF_UNIX)``, datagram ``socketpair`` and io_uring:
      network off at the ``namespaces`` level, and the ``process`` level wherever ``process_calls``
      is ``filtered``); ``files_only`` when host abstract sockets are out of reach (Landlock 6+) but
      socket files are not (from Landlock ABI 9, ``blocked`` there too: the domain reaches no
      socket file it did not bind); ``reachable`` otherwise. A socket file of the run's uid (a tmux or
      screen server, D-Bus and ``systemd --user``, an ssh ControlMaster) takes commands that run
      outside the sandbox, so ``files_only`` and ``reachable`` mean the run can leave it.
    - ``kernel_files``: ``read_only`` when the run could write nothing beneath ``/proc``, ``/sys`` or
      a cgroup filesystem (the run's Landlock domain, Linux 5.19+, at either level; at the
      ``namespaces`` level also read-only mounts, which hold where the seccomp filter refuses the
      run a user namespace and mount of its own), so a root run cannot move itself out of its pids
      and memory cgroups; ``writable`` otherwise (then only the uid's file permissions stand in the
      way).
    - ``process_calls``: ``filtered`` when the run's seccomp filter (``alphaagent.sandbox.seccomp``)
      was in force. At both levels it refuses the kernel keyrings (``keyctl``, ``add_key``,
      ``request_key``: a user namespace does not separate the supervisor's session keyring) and
      ``clone3`` (``ENOSYS``: its ``CLONE_INTO_CGROUP`` could put a child in another cgroup v2
      folder), and each run first leaves the session keyring it inherited. At the ``process``
      level it also refuses ``AF_UNIX`` sockets (see ``host_unix_sockets``) and any change to
      another process's limits, priority, CPU affinity, scheduling or memory placement
      (``prlimit64``, ``setpriority``, ``sched_set*``, ``ioprio_set``, ``migrate_pages``,
      ``move_pages``, ``process_madvise``) and any taking of another process (``ptrace``'s
      ``PTRACE_ATTACH``/``PTRACE_SEIZE``, ``process_vm_readv``/``writev``, ``pidfd_getfd``), which
      at the ``namespaces`` level the run's pid namespace keeps off the host's processes. ``open``
      otherwise (seccomp unavailable, or an architecture other than x86_64 and aarch64): then a
      run may use its uid's keyrings, and at the ``process`` level change every process of its
      uid and connect to its unix sockets.
      The filter also refuses, at both levels, every socket family but ``AF_INET``, ``AF_INET6``,
      ``AF_UNIX`` and ``AF_NETLINK`` (``EAFNOSUPPORT``: ``AF_VSOCK``, ``AF_PACKET``, ``AF_ALG``...),
      netlink protocols but ``NETLINK_ROUTE`` (``EPROTONOSUPPORT``) and ``io_uring_setup``, and
      (``EPERM``) ``unshare``/``clone`` with a ``CLONE_NEW*`` flag, ``setns`` and every mount call.
    - ``landlock_abi``: the ABI of the Landlock domain the run was in (the kernel's; 0: none, where
      the kernel has no Landlock, only ABI 1, or the sandbox's ``landlock`` setting is off). At the
      ``process`` level its file rules deny writes beneath ``/proc``, ``/sys`` and cgroupfs; at the
      ``namespaces`` level they grant writes only beneath the scope, ``/tmp`` and ``/dev/shm`` (and
      to device files), behind the read-only mounts. At both it keeps the run out of the
      ``/proc/<pid>`` files of every process outside it, and from ABI 6 its signals in.
    """

    level: IsolationLevel
    memory_bound: Literal["cgroup", "rlimit_as"] = "rlimit_as"
    dev: Literal["private", "host"] = "host"
    tmp_mb: int | None = None
    shm_mb: int | None = None
    host_unix_sockets: Literal["blocked", "files_only", "reachable"] = "reachable"
    kernel_files: Literal["read_only", "writable"] = "writable"
    process_calls: Literal["filtered", "open"] = "open"
    landlock_abi: int = 0

    @model_validator(mode="before")
    @classmethod
    def _from_level(cls, value: object) -> object:
        # Records written before the report existed hold the level alone.
        return {"level": value} if isinstance(value, str) else value


class RunResult(BaseModel):
    """The result of one run (DESIGN §4.4), plus diagnostics a user of a sandbox expects.

    Output fields hold cleaned text (carriage-return redraws collapsed, ANSI escapes stripped,
    invalid UTF-8 replaced by U+FFFD) within the returned-output cap; ``*_bytes`` are the true byte
    totals the code wrote. The full raw output is in ``stdout_path``/``stderr_path`` (spill files in
    the workspace, up to the spill cap).
    """

    run_id: str
    status: RunStatus
    exit_code: int | None
    stdout: str
    stderr: str
    stdout_bytes: int
    stderr_bytes: int
    stdout_truncated: bool
    stderr_truncated: bool
    error: RunError | None
    reason: str | None = None
    duration_ms: int
    files_changed: list[str]
    files: FileChangeReport
    limits: dict[str, float | int | str]
    isolation: IsolationReport
    network: Literal["on", "off"]
    non_utf8_output: bool = False
    stdout_path: str | None = None
    stderr_path: str | None = None
    cpu_ms: int | None = None
    peak_rss_mb: float | None = None
    landlock: LandlockState | None = None
    """Set by the env Lambda (its sandbox asks for the restriction); None where none was asked for."""
    environment_start: Literal["cold", "warm"] | None = None
    """``cold``: the environment (its zygote, with the preloads) started for this run; ``warm``: it
    was running already. None where the executor does not know. An environment that fails to start
    is no result at all: ``EnvStartError`` (on AWS, the run's ``RunFailed`` carries that name)."""
    environment_start_ms: int | None = None
    """Milliseconds the cold start took (0 when warm): part of the wait, never of ``duration_ms``."""
    queued_ms: int = 0
    """Milliseconds the run waited before its code could start: for a free run slot
    (``SandboxConfig.max_concurrent_runs``, or exclusive mode's one run at a time) and for a spare
    child of the zygote to be ready and take it. Never part of ``duration_ms`` nor of the run's
    ``timeout_s``, which both start once a spare has the run. 0 in records made before it existed."""
    state: StateReport | None = None
    """The session's live state around this run (DESIGN §4.7); None for a run outside a session
    (``alphaagent exec``) and in records written before sessions kept state."""
