"""The supervisor: runs untrusted Python through a warm zygote, enforces limits, captures output and
builds the run result (DESIGN §4.4, §5).

This module holds the zygote's lifecycle and the supervise loop of a run. What a run's end means
(the status line checked against the kernel, the ``RunResult``) is ``alphaagent.sandbox.classify``;
the readable rendering is ``render``; the scratch areas put back after a run are ``scratch``; the
``/proc`` helpers that find and wait for a run's processes are ``procs``.

One ``Sandbox`` serves one execution environment (one interpreter and its preloaded modules). It is
used unchanged by the local backend and by the env Lambda (``exclusive=True`` there: one run at a
time, and after each run every other process of the uid is killed and the shared ``/tmp`` wiped).

Example::

    with Sandbox(SandboxConfig()) as sandbox:
        result = sandbox.run("print(1)", cwd=Path("conversations/c1"))
        assert result.status == "ok" and result.stdout == "1\\n"
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import queue
import selectors
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alphaagent.errors import EnvStartError, InvalidRequestError, SandboxError
from alphaagent.ids import new_ulid
from alphaagent.models.run import (
    FileChangeReport,
    IsolationReport,
    RunLimits,
    RunResult,
    SkippedPath,
)
from alphaagent.sandbox import fontcache
from alphaagent.sandbox.capture import OutputSink, StreamCapture
from alphaagent.sandbox.cgroup import RunCgroups, oom_kills, pids_limit_reached
from alphaagent.sandbox.classify import (
    Outcome,
    build_result,
    code_started,
    credentials_refusal,
    mib,
    parse_status,
)
from alphaagent.sandbox.config import SandboxConfig
from alphaagent.sandbox.diskbudget import ScopeDiskBudget, scope_growth
from alphaagent.sandbox.environment import child_environment, secrets_to_redact, zygote_environment
from alphaagent.sandbox.pathsafe import ThresholdSpill
from alphaagent.sandbox.procs import (
    DEATH_WAIT_S,
    descendants,
    diagnose_hang,
    proc_stat,
    send_signal,
    wait_until_gone,
)
from alphaagent.sandbox.render import iter_result_lines, state_line
from alphaagent.sandbox.scratch import (
    ZYGOTE_LOG,
    ScratchBaseline,
    default_scratch_dir,
    remove_path,
    sweep_uid_except_ancestors,
    wipe_contents,
    write_all,
)
from alphaagent.sandbox.session import SESSIONS_DIR, StateRequest
from alphaagent.sandbox.snapshot import FileChanges, HashCache, TreeSnapshot, diff_snapshots, take_snapshot
from alphaagent.sandbox.treestate import TreeState, TreeStates
from alphaagent.sandbox.waiting import announced

ZYGOTE_PATH = Path(__file__).with_name("zygote.py")
MAX_CODE_BYTES = 4 * 2**20
_READ_CHUNK = 1 << 16
_PR_SET_DUMPABLE = 4
_GRACE_AFTER_INTERRUPT_S = 0.5
_DRAIN_AFTER_KILL_S = 2.0
_SPILL_DIR = "work/runs"
_PLATFORM_DIRS = [_SPILL_DIR, SESSIONS_DIR]
"""Where the platform writes in a scope (spill files; sessions' live state): never the code's changes."""


def _set_not_dumpable() -> None:
    """PR_SET_DUMPABLE=0: a child of the same uid cannot read our /proc/<pid>/environ or memory."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


@dataclass
class _RunChannel:
    """What the zygote reader thread hands to the run that is waiting for it."""

    events: queue.Queue[dict[str, Any]] = field(default_factory=queue.Queue)


class Sandbox:
    """A warm zygote plus the supervision of each run; thread-safe, runs may be concurrent.

    Raises ``SandboxError`` when the zygote cannot start or dies, ``InvalidRequestError`` for code or
    a working directory that breaks the rules of ``run``.
    """

    def __init__(self, config: SandboxConfig | None = None, *, label: str = "builtin") -> None:
        self.config = config or SandboxConfig()
        self.label = label
        """The environment's id, as a wait for it is told (``alphaagent.sandbox.waiting``)."""
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._channels: dict[str, _RunChannel] = {}
        self._zygote: subprocess.Popen[bytes] | None = None
        self._ctl: socket.socket | None = None
        self._reader: threading.Thread | None = None
        self._ready: dict[str, Any] = {}
        self._scratch_root: Path | None = None
        self._scratch_baseline: ScratchBaseline | None = None
        self._hash_cache = HashCache()
        self._trees = TreeStates()
        self._cgroup: RunCgroups | None = None
        self._exclusive_lock = threading.Lock()
        self._run_slots = (
            threading.BoundedSemaphore(self.config.max_concurrent_runs)
            if self.config.max_concurrent_runs
            else None
        )
        self._secrets = secrets_to_redact(self.config.redact_env)

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def isolation(self) -> str:
        """``namespaces`` or ``process``: the isolation level the zygote could establish."""
        self.start()
        return str(self._ready.get("isolation", "process"))

    @property
    def info(self) -> dict[str, Any]:
        """The zygote's ready message: pid, python version, isolation, preloaded modules and errors."""
        self.start()
        return dict(self._ready)

    def start(self) -> bool:
        """Start the zygote if it is not running; blocks until it has preloaded its modules. Returns
        True if it started one now (a cold start), False if the zygote was warm.

        Raises ``SandboxError`` when the interpreter cannot be started or the zygote dies during
        start-up (its log is quoted); nothing is left behind then.
        """
        with self._lock:
            if self._zygote is not None and self._zygote.poll() is None:
                return False
            self._teardown()  # a zygote that died: remove what it left before starting anew
            try:
                with announced(f"starting the environment {self.label} …"):
                    self._start_zygote()
            except BaseException:
                self._teardown()
                raise
            return True

    def _start_zygote(self) -> None:
        _set_not_dumpable()
        self._scratch_root = Path(
            tempfile.mkdtemp(
                prefix="alphaagent-sandbox-", dir=self.config.scratch_dir or default_scratch_dir()
            )
        )
        controllers = (("pids",) if self.config.use_cgroup else ()) + (
            ("memory",) if self.config.memory_cgroup else ()
        )
        self._cgroup = RunCgroups.detect(controllers)
        mpl_dir = self._scratch_root / "mplconfig"
        mpl_dir.mkdir()
        fontcache.seed(mpl_dir, self.config.python)
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._ctl = parent
        zygote_config = {
            "control_fd": child.fileno(),
            "preload": list(self.config.preload),
            "warmup": self.config.warmup,
            "pool_size": self.config.pool_size,
            "max_preparing": self.config.max_preparing_spares,
            "spare_timeout_s": self.config.spawn_timeout_s,
            "isolation": self.config.isolation,
            "cgroup_parents": {c: str(p) for c, p in self._cgroup.parents.items()} if self._cgroup else {},
            "private_dev": self.config.private_dev,
            "clone_spares": self.config.clone_spares,
            "scratch_root": str(self._scratch_root),
            "deny_tcp_connect_ports": list(self.config.deny_tcp_connect_ports),
            "landlock": self.config.landlock,
            "credential_names": list(self.config.redact_env),
        }
        log_path = self._scratch_root / ZYGOTE_LOG
        try:
            # O_APPEND: exclusive mode empties the log after each run, and the zygote's next line then
            # starts at offset 0 rather than after a hole.
            with open(log_path, "ab") as log:
                self._zygote = subprocess.Popen(
                    [self.config.python, str(ZYGOTE_PATH), json.dumps(zygote_config)],
                    pass_fds=[child.fileno()],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                    env=zygote_environment(self.config, mpl_dir),
                    cwd=self._scratch_root,
                    start_new_session=True,
                )
        except OSError as exc:
            raise SandboxError(f"cannot start the zygote with {self.config.python}: {exc}") from exc
        finally:
            child.close()
        parent.settimeout(self.config.zygote_start_timeout_s)
        try:
            ready = json.loads(parent.recv(1 << 16) or b"null")
        except (TimeoutError, OSError, ValueError) as exc:
            raise SandboxError(f"the zygote did not start: {exc}") from exc
        if not ready or ready.get("event") != "ready":
            self._kill_zygote()
            log_text = log_path.read_text(errors="replace")[-2000:].strip()
            raise SandboxError(f"the zygote exited during start-up: {log_text or 'no output'}")
        parent.settimeout(None)
        if ready.get("readable_credentials"):
            self._kill_zygote()
            raise SandboxError(credentials_refusal(ready["readable_credentials"]))
        self._ready = ready
        fontcache.remember(mpl_dir, self.config.python)  # no run was handed to this zygote yet
        if self.config.exclusive:
            self._scratch_baseline = ScratchBaseline.capture(self._scratch_root, log_path)
        self._reader = threading.Thread(target=self._read_zygote, name="zygote-reader", daemon=True)
        self._reader.start()

    def close(self) -> None:
        """Stop the zygote (it kills every run and spare it has) and remove the scratch root."""
        with self._lock:
            self._teardown()
        self._trees.close()

    def _teardown(self) -> None:
        self._kill_zygote()
        if self._scratch_root is not None:
            remove_path(self._scratch_root)
            self._scratch_root = None
        self._scratch_baseline = None
        if self._cgroup is not None:
            self._cgroup.close()
            self._cgroup = None

    def _kill_zygote(self) -> None:
        if self._ctl is not None:
            with contextlib.suppress(OSError):
                self._ctl.shutdown(socket.SHUT_RDWR)
            self._ctl.close()
            self._ctl = None
        if self._zygote is not None:
            try:
                self._zygote.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self._zygote.kill()
                self._zygote.wait()
            self._zygote = None
        for channel in list(self._channels.values()):
            channel.events.put({"event": "zygote_died"})

    def _read_zygote(self) -> None:
        ctl = self._ctl
        assert ctl is not None
        while True:
            try:
                data = ctl.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                for channel in list(self._channels.values()):
                    channel.events.put({"event": "zygote_died"})
                return
            message = json.loads(data)
            waiting = self._channels.get(str(message.get("id")))
            if waiting is not None:
                waiting.events.put(message)

    def _send(self, message: dict[str, Any], fds: list[int] | None = None) -> None:
        with self._send_lock:
            if self._ctl is None:
                raise SandboxError("the sandbox is closed")
            payload = [json.dumps(message).encode()]
            try:
                if fds:
                    self._ctl.sendmsg(
                        payload, [(socket.SOL_SOCKET, socket.SCM_RIGHTS, bytes(_fd_array(fds)))]
                    )
                else:
                    self._ctl.sendmsg(payload)
            except OSError as exc:
                self._abandon_zygote()
                raise SandboxError(f"the zygote is gone ({exc}); it will be restarted") from exc

    def _abandon_zygote(self) -> None:
        """Kill a zygote that died or stopped answering; ``start()`` makes a new one next time."""
        zygote = self._zygote
        if zygote is not None and zygote.poll() is None:
            with contextlib.suppress(OSError):
                zygote.kill()
            # Gone before the next run asks ``start()``, which would otherwise find it still alive.
            with contextlib.suppress(subprocess.TimeoutExpired):
                zygote.wait(timeout=DEATH_WAIT_S)

    # ------------------------------------------------------------------ runs

    def run(
        self,
        code: str | bytes,
        *,
        cwd: Path,
        limits: RunLimits | None = None,
        network: bool = False,
        run_id: str | None = None,
        on_output: OutputSink | None = None,
        state: StateRequest | None = None,
    ) -> RunResult:
        """Run ``code`` in a fresh child with ``cwd`` as its working directory; return its result.

        ``code``: Python source, UTF-8, 1 byte to 4 MiB. ``cwd``: an existing directory (the scope
        root). ``limits``: per-run limits (``RunLimits`` defaults). ``network``: allow network access
        (only meaningful at the ``namespaces`` level; ``process`` isolation cannot take it away).
        ``on_output``: called as ``on_output("stdout" | "stderr", data)`` with the run's output as it
        arrives (redacted, uncapped, untrusted bytes), for a live view; the result is the same
        with or without it. ``state``: the session whose live state the child restores before the
        code and saves after it (``work/sessions/{session_id}/`` under ``cwd``, DESIGN §4.7); the
        result's ``state`` says what was kept. None: empty globals, nothing saved.

        Raises ``InvalidRequestError`` for empty or non-UTF-8 code or a bad ``cwd`` (nothing is
        written), ``SandboxError`` when the platform fails. User code failing is a result.
        """
        source = _validate_code(code)
        workdir = _validate_workdir(cwd)
        limits = limits or self.config.default_limits
        started_at = time.monotonic()
        try:
            cold = self.start()
        except SandboxError as exc:
            # Labelled, so the run's failure says the environment never came up (not the code).
            raise EnvStartError(f"the environment did not start: {exc}") from exc
        start = {
            "environment_start": "cold" if cold else "warm",
            "environment_start_ms": round((time.monotonic() - started_at) * 1000) if cold else 0,
        }
        run_id = run_id or new_ulid()
        waiting_since = time.monotonic()
        with self._run_slot():
            slot_ms = round((time.monotonic() - waiting_since) * 1000)
            result = self._run(source, workdir, limits, network, run_id, on_output, state)
        return result.model_copy(update={**start, "queued_ms": result.queued_ms + slot_ms})

    @contextlib.contextmanager
    def _run_slot(self) -> Iterator[None]:
        """One of the runs this sandbox lets progress at once: the only one in exclusive mode, one
        of ``max_concurrent_runs`` when that is set; the wait is part of the run's ``queued_ms``."""
        with contextlib.ExitStack() as held:
            if self.config.exclusive:
                held.enter_context(self._exclusive_lock)
            if self._run_slots is not None:
                held.enter_context(self._run_slots)
            yield

    def _run(
        self,
        source: str,
        workdir: Path,
        limits: RunLimits,
        network: bool,
        run_id: str,
        on_output: OutputSink | None = None,
        state: StateRequest | None = None,
    ) -> RunResult:
        assert self._scratch_root is not None
        namespaced = self._ready.get("isolation") == "namespaces"
        scratch = self._scratch_root / run_id
        spill_rel = f"{_SPILL_DIR}/{run_id}"
        (scratch / "tmp").mkdir(parents=True, mode=0o700)
        code_fd = os.memfd_create(f"code-{run_id}", os.MFD_CLOEXEC)
        write_all(code_fd, source.encode("utf-8"))
        tmp_dir = "/tmp" if namespaced else str(scratch / "tmp")
        tmp_bytes = limits.effective_tmp_mb() * 2**20 if self.config.sized_tmp else 0
        # Where the AF_UNIX filter may be off (network on with namespaces; the process level, whose
        # filter a kernel may refuse), Landlock 6+ keeps host abstract sockets out of reach; the child
        # refuses to start if the kernel then declines.
        scoped_abstract = (
            self.config.landlock
            and not (namespaced and not network)
            and int(self._ready.get("kernel_landlock_abi", 0)) >= 6
        )
        request = {
            "cwd": str(workdir),
            "tmp_dir": str(scratch / "tmp"),
            "tmp_bytes": tmp_bytes,
            "shm_bytes": limits.shm_mb * 2**20,
            "network": network,
            "scope_abstract_sockets": int(self._ready.get("kernel_landlock_abi", 0))
            if scoped_abstract
            else 0,
            "hidden_paths": list(self.config.hidden_paths),
            "env": child_environment(self.config, tmp_dir=tmp_dir),
            "limits": _rlimits(limits),
            "state": {
                **state.for_child(),
                "run_timeout_s": limits.timeout_s,
                # The child may be dumpable for one open of its pagemap only where no other process
                # can reach it then: alone with its uid (exclusive) or in its own pid namespace.
                "pagemap_window": self.config.exclusive or namespaced,
            }
            if state is not None
            else None,
        }
        # work/runs/ holds the platform's spill files: never reported as the code's changes.
        tree, before = self._tree_before(workdir)
        before_walks = tree.walks if tree is not None else 0
        channel = _RunChannel()
        self._channels[run_id] = channel
        pipes = [os.pipe2(os.O_CLOEXEC) for _ in range(3)]
        asked = time.monotonic()
        started_ns = time.time_ns()  # before the spawn: what the run changes has a later ctime
        # Its filesystem's baseline is read before the spawn too: read once a spare had taken the run
        # (the news relayed through two busy processes), it could already hold a burst of the run's.
        disk = ScopeDiskBudget(
            workdir,
            budget_bytes=limits.disk_mb * 2**20,
            walk=lambda: scope_growth(
                workdir,
                before,
                started_ns,
                platform_dir=_SPILL_DIR,
                other_platform_dirs=(SESSIONS_DIR,),
                own=run_id,
                max_entries=self.config.max_tree_entries,
            ),
        )
        try:
            try:
                self._send(
                    {
                        "op": "spawn",
                        "id": run_id,
                        "network": network,
                        "max_processes": limits.processes,
                        "memory_bytes": limits.memory_mb * 2**20,
                        "request": request,
                    },
                    [*(w for _, w in pipes), code_fd],
                )
            finally:
                for _, w in pipes:
                    os.close(w)
                os.close(code_fd)
            with announced(f"waiting for a free process of the environment {self.label} …"):
                pid, cgroup, memory_cgroup, took_at = self._await_spawn(channel, run_id)
            # The run started when a spare took it (the spare's own clock: CLOCK_MONOTONIC is the
            # machine's); the wait for one is not the code's time, nor is the relay of the news.
            started = min(max(took_at, asked), time.monotonic())
            queued_ms = round((started - asked) * 1000)
            try:
                outcome = self._supervise(
                    run_id,
                    pid,
                    cgroup,
                    [r for r, _ in pipes],
                    workdir,
                    limits,
                    channel,
                    started,
                    disk,
                    on_output,
                )
            except BaseException:
                # Ctrl-C (KeyboardInterrupt) in the caller, or any other way out mid-run: the run
                # ends with it, never goes on unsupervised.
                self._kill_run(pid, Outcome(pid=pid, cgroup=cgroup))
                remove_path(scratch)
                raise
            outcome.memory_bound = memory_cgroup is not None
            if memory_cgroup:
                # Read at once (the zygote removes the cgroup a while after the run): a process the
                # kernel killed at the limit may not be the run's main one, which then reports.
                outcome.oom_kills = oom_kills(memory_cgroup)
            duration_ms = int((time.monotonic() - started) * 1000)
            if self.config.exclusive:
                self._exclusive_cleanup(run_id, channel)
            # The run's exit was observed (or it was killed): nothing of it runs any more (its namespace's
            # init killed the rest, or the zygote swept its orphans before reporting), so the tree is final.
            changes = self._tree_changes(tree, before, workdir, namespaced=namespaced)
            if outcome.kill_reason is None:
                # A burst shorter than one poll (page cache takes GB/s) is caught here, after the run,
                # by the tree's own growth where statvfs cannot tell (a deletion beside it hid it).
                grown = disk.final(tree_growth=self._tree_growth(tree, before, workdir))
                if grown is not None:
                    outcome.kill_reason = "disk_limit"
                    outcome.disk_over_after_run = True
                    outcome.hint = (
                        f"the run added {mib(grown)} to its scope, over its budget of"
                        f" {mib(disk.budget_bytes)} (disk_mb; found when the run ended)"
                    )
            remove_path(scratch)
            # The wait status decides, always, even after a report (``_supervise`` waited for it): the
            # status pipe is the code's to write (or to close and reopen); the zygote's waitpid is
            # not (DESIGN §4.4).
            outcome.oom_kills = max(outcome.oom_kills, int((outcome.exit_event or {}).get("oom_kills", 0)))
        finally:
            for r, _ in pipes:
                with contextlib.suppress(OSError):
                    os.close(r)
            self._channels.pop(run_id, None)
            if tree is not None:
                # Kept only when the run's after-walk brought it up to date; else walked afresh next time.
                (self._trees.checkin if tree.walks > before_walks else self._trees.discard)(tree)
        # The run's seccomp filter (``alphaagent.sandbox.seccomp``): what it refuses at each level is
        # in ``IsolationReport.process_calls``; at the process level it takes AF_UNIX sockets away.
        filtered = self._ready.get("process_calls") == "filtered"
        # From Landlock ABI 9 the run's domain reaches no socket file it did not bind (zygote.py).
        resolves_unix = scoped_abstract and int(self._ready.get("landlock_abi") or 0) >= 9
        return build_result(
            run_id=run_id,
            outcome=outcome,
            limits=limits,
            duration_ms=duration_ms,
            queued_ms=queued_ms,
            changes=FileChangeReport(
                created=list(changes.created),
                modified=list(changes.modified),
                deleted=list(changes.deleted),
                skipped=[SkippedPath(path=s.path, reason=s.reason) for s in changes.skipped],
                truncated=changes.truncated,
                unreported=changes.unreported,
            ),
            isolation=IsolationReport(
                level="namespaces" if namespaced else "process",
                memory_bound="cgroup" if memory_cgroup else "rlimit_as",
                dev="private" if namespaced and self.config.private_dev else "host",
                tmp_mb=tmp_bytes // 2**20 if namespaced and tmp_bytes else None,
                shm_mb=limits.shm_mb if namespaced else None,
                host_unix_sockets="blocked"
                if (namespaced and not network) or (not namespaced and filtered) or resolves_unix
                else ("files_only" if scoped_abstract else "reachable"),
                kernel_files="read_only" if self._ready.get("kernel_files") == "read_only" else "writable",
                process_calls="filtered" if filtered else "open",
                landlock_abi=int(self._ready.get("landlock_abi") or 0),
            ),
            network="off" if namespaced and not network else "on",
            spill_rel=spill_rel,
            secrets=self._secrets,
        )

    def _tree_before(self, workdir: Path) -> tuple[TreeState | None, TreeSnapshot | int]:
        """The scope's state before a run: its kept ``TreeState`` (brought up to date, usually without a
        walk) and its allocated bytes, or on the old path a full snapshot (``incremental_snapshot``)."""
        if not self.config.incremental_snapshot:
            return None, take_snapshot(
                workdir, exclude=_PLATFORM_DIRS, max_entries=self.config.max_tree_entries
            )
        # work/runs/ holds the platform's spill files, work/sessions/ the sessions' live state: never
        # reported as the code's changes.
        tree = self._trees.checkout(workdir, exclude=_PLATFORM_DIRS)
        try:
            tree.prepare()
        except BaseException:
            self._trees.discard(tree)
            raise
        tree.settle()
        return tree, tree.allocated_bytes

    def _tree_changes(
        self, tree: TreeState | None, before: TreeSnapshot | int, workdir: Path, *, namespaced: bool
    ) -> FileChanges:
        """What the run changed in its scope, by the kept state's incremental update or the old full diff.

        At the ``namespaces`` level the state trusts inotify's events for the run's own changes: the
        scope's bind mount is the run's only writable mount of its filesystem, so every name the run
        can give one of its files (link(2) and rename(2) across mounts fail with EXDEV) lies in the
        scope, where inotify watches (``TreeState.update``). At the process level the run could link
        a file of the scope from anywhere else it can write on that filesystem: every entry is lstat'ed."""
        if tree is not None:
            return tree.update(
                report=True,
                max_reported=self.config.max_tree_entries,
                hash_cache=self._hash_cache,
                trust_events=namespaced,
            )
        assert isinstance(before, TreeSnapshot)
        after = take_snapshot(workdir, exclude=_PLATFORM_DIRS, max_entries=self.config.max_tree_entries)
        return diff_snapshots(before, after, hash_cache=self._hash_cache)

    def _tree_growth(self, tree: TreeState | None, before: TreeSnapshot | int, workdir: Path) -> int | None:
        """Bytes the scope's tree (platform folders left out) grew by during the run, from the kept
        state's after-run update (no walk); None on the old path, whose after-snapshot is not kept."""
        if tree is None or isinstance(before, TreeSnapshot):
            return None
        return tree.allocated_bytes - before

    def _await_spawn(self, channel: _RunChannel, run_id: str) -> tuple[int, str | None, str | None, float]:
        """Wait for a spare to take the run: (pid, pids cgroup, memory cgroup, when it took it as
        ``time.monotonic()``).

        The zygote acknowledges a request at once (``queued``). Silence past ``spawn_timeout_s``
        from a zygote that is stopped (``SIGSTOP`` by a run of the same uid) or gone gets it
        replaced; one that is merely slow (a machine so loaded that the zygote gets little CPU) is
        waited for, as every run in progress depends on it. The wait for a spare may be long under
        load, and ends in this run's failure alone after ``queue_timeout_s`` (the request is
        cancelled; a spare that took it in the meantime is killed)."""
        waiting_since = time.monotonic()
        while True:
            try:
                message = channel.events.get(timeout=self.config.spawn_timeout_s)
                break
            except queue.Empty:
                if not self._zygote_serving():
                    self._abandon_zygote()
                    raise SandboxError(
                        f"run {run_id}: the zygote did not answer (stopped or gone); it will be restarted"
                    ) from None
                if time.monotonic() - waiting_since > self.config.queue_timeout_s:
                    message = self._cancel_spawn(channel, run_id)
                    break
        if message["event"] == "queued":
            left = self.config.queue_timeout_s - (time.monotonic() - waiting_since)
            try:
                message = channel.events.get(timeout=max(left, 0.001))
            except queue.Empty:
                message = self._cancel_spawn(channel, run_id)
        if message["event"] == "spawned":
            took_at = message.get("started_at")
            return (
                int(message["pid"]),
                message.get("cgroup"),
                message.get("memory_cgroup"),
                float(took_at) if isinstance(took_at, int | float) else time.monotonic(),
            )
        if message["event"] == "zygote_died":
            # Before it relayed that a spare took the run: the spare, and the code if it had started,
            # died with it (PR_SET_PDEATHSIG; with namespaces, the namespace's init).
            raise SandboxError(
                f"run {run_id}: the environment's process (its zygote) ended before it reported the"
                " run's start; the run was stopped with it, and the next run starts a new one"
            )
        raise SandboxError(f"run {run_id}: {message.get('message', 'the zygote died')}")

    def _zygote_serving(self) -> bool:
        """Whether the zygote runs (or waits for the CPU or for events): not exited, not stopped."""
        zygote = self._zygote
        if zygote is None or zygote.poll() is not None:
            return False
        fields = proc_stat(zygote.pid)
        return fields is not None and fields[0] not in ("T", "t", "Z", "X")

    def _cancel_spawn(self, channel: _RunChannel, run_id: str) -> dict[str, Any]:
        """``queue_timeout_s`` passed with no spare: withdraw the request and fail this run only."""
        waited = (
            f"no spare took the run within {self.config.queue_timeout_s:g} s (queue_timeout_s): the"
            " environment is overloaded, or its spares fail to start (see zygote.log)"
        )
        self._send({"op": "cancel", "id": run_id})
        try:
            answer = channel.events.get(timeout=self.config.spawn_timeout_s)
        except queue.Empty:
            answer = {"event": "spawn_failed"}
        if answer["event"] == "spawned":  # taken just before the cancel arrived: end it unstarted
            pid = int(answer["pid"])
            self._kill_run(pid, Outcome(pid=pid, cgroup=answer.get("cgroup")))
            self._await_exit(channel)
        return {"event": "spawn_failed", "message": waited}

    def _supervise(
        self,
        run_id: str,
        pid: int,
        cgroup: str | None,
        fds: list[int],
        workdir: Path,
        limits: RunLimits,
        channel: _RunChannel,
        started: float,
        disk: ScopeDiskBudget,
        on_output: OutputSink | None = None,
    ) -> Outcome:
        """Read stdout, stderr and status concurrently until EOF and the run's exit is observed; enforce
        the wall clock, the output cap and the scope's write budget (polled every ``disk_poll_s``).

        The run is over only when the zygote reports its exit (its wait status): the pipes are the
        code's to close, and a ``done`` line on the status pipe is the code's to forge, so neither ends
        the supervision. The deadline holds until the exit; a run whose exit does not come (after the
        pipes closed, or past the drain after a kill) is killed here, before anyone reads the scope:
        at the ``namespaces`` level through the pid namespace's init (every process in it dies), at
        the process level its process group and every descendant (the zygote sweeps orphans when it
        reaps the run, before it reports the exit)."""
        out_fd, err_fd, status_fd = fds
        spills = {
            fd: ThresholdSpill(
                workdir, f"{_SPILL_DIR}/{run_id}/{name}.txt", self.config.spill_threshold_bytes
            )
            for fd, name in ((out_fd, "stdout"), (err_fd, "stderr"))
        }
        captures = {
            fd: StreamCapture(
                self.config.returned_output_bytes,
                spill_opener=lambda spill=spill: spill,  # type: ignore[misc]
                spill_cap_bytes=self.config.spill_bytes,
                redact=self._secrets,
                on_data=None if on_output is None else _sink_for(on_output, fd == out_fd),
            )
            for fd, spill in spills.items()
        }
        status_buf = bytearray()
        outcome = Outcome(pid=pid, cgroup=cgroup)
        deadline = started + limits.timeout_s
        next_disk_poll = started + self.config.disk_poll_s
        kill_at: float | None = None
        drain_until: float | None = None
        sel = selectors.DefaultSelector()
        for fd in fds:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        open_fds = set(fds)
        try:
            while open_fds or outcome.exit_event is None:
                now = time.monotonic()
                if drain_until is not None and now >= drain_until:
                    break  # something outside the run's tree holds a pipe open; stop waiting for it
                if outcome.kill_reason is None and now >= deadline:
                    outcome.timed_out = True
                    outcome.kill_reason = "timeout"
                    outcome.hint = diagnose_hang(pid)
                    send_signal(pid, signal.SIGINT)  # a traceback of where the code was stuck
                    kill_at = now + _GRACE_AFTER_INTERRUPT_S
                if outcome.kill_reason is None and now >= next_disk_poll:
                    next_disk_poll = now + self.config.disk_poll_s
                    grown = disk.poll()
                    if grown is not None:
                        outcome.kill_reason = "disk_limit"
                        outcome.hint = (
                            f"the run added {mib(grown)} to its scope, over its budget of"
                            f" {mib(disk.budget_bytes)} (disk_mb)"
                        )
                        self._kill_run(pid, outcome)
                        drain_until = time.monotonic() + _DRAIN_AFTER_KILL_S
                if kill_at is not None and now >= kill_at:
                    self._kill_run(pid, outcome)
                    kill_at = None
                    drain_until = now + _DRAIN_AFTER_KILL_S
                polls = (next_disk_poll,) if outcome.kill_reason is None else ()
                wake = [t for t in (deadline, kill_at, drain_until, *polls) if t is not None and t > now]
                timeout = min(wake) - now if wake else 0.05
                if not open_fds:
                    # Every pipe closed: the exit is what ends the run, not the closing (the code can
                    # close its descriptors and go on running).
                    outcome.exit_event = self._next_exit(channel, timeout)
                    continue
                for key, _ in sel.select(timeout=timeout):
                    fd = int(key.fd)
                    try:
                        chunk = os.read(fd, _READ_CHUNK)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        sel.unregister(fd)
                        open_fds.discard(fd)
                        continue
                    if fd == status_fd:
                        status_buf += chunk
                        if len(status_buf) > 1 << 20:  # flooded by the code: keep the head and the tail
                            status_buf = status_buf[: 1 << 16] + b"\n" + status_buf[-(1 << 16) :]
                        continue
                    if outcome.kill_reason in ("output_limit", "disk_limit"):
                        continue  # what is still in flight after the kill is not counted
                    capture = captures[fd]
                    capture.feed(chunk)
                    if capture.total_bytes > self.config.spill_bytes and outcome.kill_reason is None:
                        stream = "stdout" if fd == out_fd else "stderr"
                        outcome.kill_reason = "output_limit"
                        outcome.hint = (
                            f"{stream} exceeded {mib(self.config.spill_bytes)}; write large results"
                            " to files (datasets/) instead of printing them"
                        )
                        self._kill_run(pid, outcome)
                        drain_until = time.monotonic() + _DRAIN_AFTER_KILL_S
        finally:
            sel.close()
        outcome.stdout = captures[out_fd].finish()
        outcome.stderr = captures[err_fd].finish()
        outcome.stdout_spilled, outcome.stderr_spilled = spills[out_fd].opened, spills[err_fd].opened
        outcome.status_line = parse_status(bytes(status_buf))
        outcome.code_started = code_started(bytes(status_buf))
        if outcome.exit_event is None or outcome.exit_event["event"] == "zygote_died":
            # A pipe still held open past the drain after a kill, an exit that never came, or no
            # zygote left to wait for it: nothing of the run may go on once its result is built (it
            # would write into the scope unseen).
            self._kill_run(pid, outcome)
            if outcome.exit_event is None:
                outcome.exit_event = self._await_exit(channel)
        return outcome

    def _kill_run(self, pid: int, outcome: Outcome) -> None:
        """SIGKILL the run's tree: its process group, every descendant found, then the run itself
        (with namespaces, the death of the namespace's init also ends everything left in it)."""
        tree = descendants(pid)
        if outcome.processes_at_kill is None:
            outcome.processes_at_kill = 1 + len(tree)
            outcome.process_limit_hit = outcome.cgroup is not None and pids_limit_reached(outcome.cgroup)
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
        for member in tree:
            send_signal(member, signal.SIGKILL)
        send_signal(pid, signal.SIGKILL)
        wait_until_gone(pid, tree, DEATH_WAIT_S)

    @staticmethod
    def _next_exit(channel: _RunChannel, timeout: float) -> dict[str, Any] | None:
        """The run's exit event if one arrives within ``timeout`` seconds, else None."""
        try:
            message = channel.events.get(timeout=max(timeout, 0.001))
        except queue.Empty:
            return None
        return message if message["event"] in ("exited", "zygote_died") else None

    def _await_exit(self, channel: _RunChannel) -> dict[str, Any] | None:
        deadline = time.monotonic() + 5
        while (left := deadline - time.monotonic()) > 0:
            try:
                message = channel.events.get(timeout=left)
            except queue.Empty:
                return None
            if message["event"] in ("exited", "zygote_died"):
                return message
        return None

    def _exclusive_cleanup(self, run_id: str, channel: _RunChannel) -> None:
        """Exclusive mode: kill every other process of the uid, wipe the shared scratch paths and put
        the sandbox's own scratch root back as it was when the zygote became ready.

        The zygote does the sweep (it knows its spares); if it is gone (a run killed it), the
        supervisor sweeps itself, sparing only its own ancestors."""
        swept = False
        self._channels[run_id] = channel
        try:
            self._send({"op": "sweep_uid", "id": run_id})
            deadline = time.monotonic() + 5
            while not swept and (left := deadline - time.monotonic()) > 0:
                event = channel.events.get(timeout=left)["event"]
                swept = event == "swept"
                if event == "zygote_died":
                    break
        except (SandboxError, queue.Empty):
            pass
        finally:
            self._channels.pop(run_id, None)
        if not swept:
            sweep_uid_except_ancestors()
        keep = {Path(k) for k in self.config.wipe_keep}
        if self._scratch_root is not None:
            keep.add(self._scratch_root)
        for root in self.config.wipe_paths:
            wipe_contents(Path(root), keep=keep)
        self._reset_scratch_root()

    def _reset_scratch_root(self) -> None:
        """Empty the scratch root but for the zygote's log (emptied in place: the zygote writes to it)
        and what was there when the zygote became ready (matplotlib's config dir, restored from memory).

        Every run's private TMPDIR/HOME lives there, and a run of the same uid can write anywhere in it
        (``$TMPDIR/../..``): without this, the next run -- maybe another tenant -- would read it. When the
        root cannot be reset (the root or the log was replaced, linked elsewhere or removed, an entry
        resists removal), the zygote is stopped and its scratch root removed: the next run starts a
        new one in a new scratch root.
        """
        root, baseline = self._scratch_root, self._scratch_baseline
        if root is None or baseline is None:
            return
        if not baseline.restore(root):
            with self._lock:
                self._teardown()


def _sink_for(on_output: OutputSink, is_stdout: bool) -> Callable[[bytes], None]:
    stream = "stdout" if is_stdout else "stderr"
    return lambda data: on_output(stream, data)


def _fd_array(fds: list[int]) -> bytes:
    import array

    return array.array("i", fds).tobytes()


def _rlimits(limits: RunLimits) -> dict[str, int]:
    return {
        "memory_bytes": limits.memory_mb * 2**20,
        "cpu_s": limits.effective_cpu_s(),
        "file_size_bytes": limits.file_size_mb * 2**20,
        "open_files": limits.open_files,
        "processes": limits.processes,
    }


def _validate_code(code: str | bytes) -> str:
    if isinstance(code, bytes):
        try:
            code = code.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidRequestError(f"code: not valid UTF-8 (invalid byte at offset {exc.start})") from exc
    if not code.strip():
        raise InvalidRequestError("code: must not be empty")
    if len(code.encode("utf-8")) > MAX_CODE_BYTES:
        raise InvalidRequestError(f"code: larger than {MAX_CODE_BYTES // 2**20} MiB")
    if "\x00" in code:
        raise InvalidRequestError("code: contains a NUL character")
    return code


def _validate_workdir(cwd: Path) -> Path:
    path = Path(cwd)
    if not path.exists():
        raise InvalidRequestError(f"workdir: {path} does not exist")
    if not path.is_dir():
        raise InvalidRequestError(f"workdir: {path} is not a directory")
    return path.resolve()


__all__ = ["Sandbox", "iter_result_lines", "state_line"]
