"""The zygote: a stdlib-only process that preloads an environment's modules once and forks a fresh
child for every run.

It runs under the execution environment's own interpreter (any CPython >= 3.11, inside every
environment image and every local environment), so it imports nothing from ``alphaagent``. The
supervisor (``alphaagent.sandbox.supervisor``) starts it as::

    python zygote.py '{"control_fd": 3, "preload": ["numpy", ...], "pool_size": 2, "isolation": "auto"}'

and talks to it over an ``AF_UNIX``/``SOCK_SEQPACKET`` socket (one JSON object per datagram):

supervisor -> zygote
    ``{"op": "spawn", "id": RUN_ID, "network": bool, "max_processes": N, "memory_bytes": N,
    "request": {...}}`` with
    three descriptors attached (``SCM_RIGHTS``): the write ends of the run's stdout, stderr and status
    pipes. ``request`` is what the child applies before it runs the code (see ``_run_child``).
    ``{"op": "cancel", "id": RUN_ID}`` drops a spawn request that still waits for a spare (answered
    ``spawn_failed``; a request a spare has taken already is answered ``spawned`` before it).
    ``{"op": "sweep_uid", "id": RUN_ID}`` kills every process of this uid that is not the zygote, one of
    its ancestors (the supervisor and whatever started it) or one of its spares (exclusive mode).

zygote -> supervisor
    ``{"event": "ready", "pid", "python", "isolation", "isolation_detail", "landlock_abi", "kernel_files",
    "process_calls", "process_calls_detail",
    "preloaded", "preload_errors"}``
    ``{"event": "queued", "id"}`` at once for every spawn request, then, once a ready spare has taken
    it, ``{"event": "spawned", "id", "pid", "cgroup", "memory_cgroup", "started_at"}`` (the run's pids
    and memory cgroup directories, or null; the ``time.monotonic()`` at which the spare took it) /
    ``{"event": "spawn_failed", "id", "message"}``
    ``{"event": "exited", "id", "pid", "exit_code", "maxrss_kb", "cpu_s", "oom_kills", "refused_forks"}``
    (negative: killed by signal; ``oom_kills``: processes the kernel killed at the memory cgroup's
    limit; ``refused_forks``: forks refused at the pids cgroup's ``pids.max``)
    ``{"event": "swept", "id", "killed"}``

The child writes one JSON line to its status pipe (descriptor 3) before it exits:
``{"phase": "done", "exit_code", "error", "memory_error", "interrupted", "state"}`` (``state``: what
was restored and saved of the session's live state, see ``_SessionState``) or
``{"phase": "setup_error", "message"}`` when it could not even start the code.

Spares: the zygote keeps ``pool_size`` children forked ahead of time (and, with namespaces, already
inside their new user, mount, pid, IPC and network namespaces), so a run pays neither the fork of a
large interpreter nor namespace creation. A spare has seen nothing of any run: it is forked from the
zygote, which never runs user code. A namespaced spare is cloned straight into fresh namespaces
(``_clone_into_namespaces``: the clone is the namespace's init, which forks the spare), or, where
that cannot be used, forked through a helper that unshares them.

The zygote is a funnel that never blocks on one spare: a request waits in its queue until a spare
says it is ready (prewarmed, waiting on its socket), one spare is forked per waiting request (up to
``max_preparing`` being prepared at once, each preparing itself in its own process), and a spare
that dies or stalls (``spare_timeout_s``) before it says ``took`` is killed and its request handed
to another. The supervisor counts the wait as the run's ``queued_ms``, never as its run time.

When the control socket closes (the supervisor exited), the zygote kills every run and spare and
exits.
"""

from __future__ import annotations

import array
import builtins
import ctypes
import fcntl
import gc
import io
import json
import os
import re
import resource
import select
import selectors
import signal
import socket
import stat
import sys
import time
import traceback
import types
from typing import Any

STATUS_FD = 3
MAX_MESSAGE = 1 << 16
MAX_ERROR_VALUE_CHARS = 16 * 1024
MAX_TRACEBACK_CHARS = 64 * 1024
MAX_ERROR_NAME_CHARS = 200
CODE_FILENAME = "<code>"

# Linux constants (include/uapi/linux/sched.h, prctl.h, mount.h, capability.h).
CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECBIT_ALL_LOCKED_NOROOT = (
    0x2F  # NOROOT, NOROOT_LOCKED, NO_SETUID_FIXUP, NO_SETUID_FIXUP_LOCKED, KEEP_CAPS_LOCKED
)
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MS_STRICTATIME = 1 << 24
_MOUNT_OPTION_FLAGS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
}
LINUX_CAPABILITY_VERSION_3 = 0x20080522
# Landlock (include/uapi/linux/landlock.h; the syscall numbers are the same on every architecture).
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
LANDLOCK_ACCESS_FS_WRITE_FILE = 1 << 1
LANDLOCK_ACCESS_FS_REMOVE_DIR = 1 << 4
LANDLOCK_ACCESS_FS_REMOVE_FILE = 1 << 5
LANDLOCK_ACCESS_FS_MAKE_CHAR = 1 << 6
LANDLOCK_ACCESS_FS_MAKE_DIR = 1 << 7
LANDLOCK_ACCESS_FS_MAKE_REG = 1 << 8
LANDLOCK_ACCESS_FS_MAKE_SOCK = 1 << 9
LANDLOCK_ACCESS_FS_MAKE_FIFO = 1 << 10
LANDLOCK_ACCESS_FS_MAKE_BLOCK = 1 << 11
LANDLOCK_ACCESS_FS_MAKE_SYM = 1 << 12
LANDLOCK_ACCESS_FS_REFER = 1 << 13
LANDLOCK_ACCESS_FS_TRUNCATE = 1 << 14  # ABI 3
LANDLOCK_ACCESS_FS_RESOLVE_UNIX = 1 << 16  # ABI 9 (Linux 7.1): connect/sendmsg to a socket file
RESOLVE_UNIX_ABI = 9
LANDLOCK_DIR_WRITE_RIGHTS = (
    LANDLOCK_ACCESS_FS_REMOVE_DIR
    | LANDLOCK_ACCESS_FS_REMOVE_FILE
    | LANDLOCK_ACCESS_FS_MAKE_DIR
    | LANDLOCK_ACCESS_FS_MAKE_REG
    | LANDLOCK_ACCESS_FS_MAKE_SOCK
    | LANDLOCK_ACCESS_FS_MAKE_FIFO
    | LANDLOCK_ACCESS_FS_MAKE_SYM
)
"""Rights over a directory's entries (making, removing, and so renaming them): Landlock accepts them
only in a rule on a directory."""
LANDLOCK_SCOPE_SIGNAL = 1 << 1
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1

_libc = ctypes.CDLL(None, use_errno=True)
_ZYGOTE_FILE = os.path.abspath(__file__)


MEMORY_CGROUP_GRACE_S = 5.0
"""How long a finished run's memory cgroup outlives it, so the supervisor can still read it."""
GRACE_SWEEP_S = 0.5
"""How often what is left in memory cgroups in their grace is killed (``_remove_doomed_cgroups``)."""


class SetupError(Exception):
    """The child could not prepare the run (a platform failure, not a failure of user code)."""


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(err)}")


def _prctl(option: int, arg2: int = 0, arg3: int = 0) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(arg2), ctypes.c_ulong(arg3), 0, 0), f"prctl({option})")


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(
        _libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def _write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


# ---------------------------------------------------------------- namespaces


def _namespace_flags(network: bool) -> int:
    """The namespaces every spare gets afresh: user, mount, pid, IPC, and network unless ``network``.

    IPC: SysV shared memory, semaphores and message queues (and POSIX message queues) live in the
    IPC namespace, not in any file system or cgroup the run's limits see: in the host's, a segment a
    run made would outlive it, reach other conversations' runs by its key, and hold memory outside
    ``memory_mb``. A fresh one dies with the run's last process."""
    return CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | (0 if network else CLONE_NEWNET)


def _enter_namespaces(network: bool) -> None:
    """unshare user, mount, pid, IPC (and network unless ``network``) namespaces; map our own ids."""
    uid, gid = os.geteuid(), os.getegid()
    _check(_libc.unshare(_namespace_flags(network)), "unshare")
    _map_own_ids(uid, gid)


def _map_own_ids(uid: int, gid: int) -> None:
    """In a new user namespace: map ``uid``/``gid`` (ours in the parent namespace) to themselves."""
    # A non-dumpable process's /proc/self files belong to root: an ordinary user could not write
    # its own id maps. This process holds nothing secret; dumpable is cleared again right after.
    _prctl(PR_SET_DUMPABLE, 1)
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")
    _prctl(PR_SET_DUMPABLE, 0)


# clone(2) by number (asm/unistd.h): the first argument is the flags on every architecture; with a
# null stack and no tid pointers it forks, like fork(2), into the namespaces the flags name.
_SYS_CLONE = {"x86_64": 56, "aarch64": 220}
SIGCHLD_NUMBER = int(signal.SIGCHLD)


def _clone_into_namespaces(network: bool) -> int:
    """Fork a child that is born pid 1 of fresh user, mount, pid, IPC (and network) namespaces; 0 in
    the child, its pid in the parent. Raises ``OSError`` (the parent only) when the kernel refuses.

    Why not ``os.fork`` then ``unshare``: a new pid namespace holds only the children of whoever
    unshared it, so that path needs a helper fork between the zygote and the namespace's init; each
    fork of the preloaded interpreter copies its page tables (~10-15 ms of CPU here, see
    ``bench/spare.py``). ``clone`` with the namespace flags makes the init in one fork.

    Done as ``os.fork`` does it (CPython's ``PyOS_BeforeFork``/``AfterFork_*``: at-fork hooks, the
    import lock, the interpreter's thread state), with the GIL held across the system call (a
    ``PyDLL`` function). glibc's own fork handlers do not run: its locks are free in a process with
    one thread (``_clone_usable`` checks), and the child's cached thread id (used by ``raise(3)``) is
    the parent's: the init only waits and forwards signals with ``kill(2)``, and the run it forks with
    ``os.fork`` gets its own."""
    number = _SYS_CLONE[os.uname().machine]
    python = ctypes.pythonapi
    syscall = ctypes.PyDLL(None, use_errno=True).syscall
    syscall.restype = ctypes.c_long
    python.PyOS_BeforeFork()
    pid = syscall(
        ctypes.c_long(number),
        ctypes.c_ulong(_namespace_flags(network) | SIGCHLD_NUMBER),
        ctypes.c_ulong(0),
        ctypes.c_ulong(0),
        ctypes.c_ulong(0),
        ctypes.c_ulong(0),
    )
    if pid == 0:
        python.PyOS_AfterFork_Child()
        return 0
    err = ctypes.get_errno()
    python.PyOS_AfterFork_Parent()
    if pid < 0:
        raise OSError(err, f"clone: {os.strerror(err)}")
    return int(pid)


def _clone_usable() -> bool:
    """Whether ``_clone_into_namespaces`` may be used now: a known architecture and one thread.

    With a second thread (a preloaded module's: pyarrow's jemalloc starts one unless told not to,
    see ``environment.zygote_environment``), a lock it holds at the clone would stay held in the
    child forever: the libraries' at-fork handlers (jemalloc's, glibc's malloc) that take their
    locks around a fork are not run by a raw clone. Checked before every clone (~20 µs); the spare
    is then made through the helper instead."""
    return os.uname().machine in _SYS_CLONE and _thread_count() == 1


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0  # no /proc: not usable (and namespaces would have failed their probe)


def _prepare_namespace_init(network: bool, private_dev: bool = True) -> None:
    """In the first process of the new pid namespace: private mounts, its own read-only /proc, every
    other mount read-only (the run gets write access to its scope, /tmp and /dev/shm only, at
    request time), loopback up."""
    _mount("none", "/", None, MS_REC | MS_PRIVATE)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY)
    for point, flags in _mount_table():
        if point == "/proc" or point.startswith("/proc/"):
            continue
        try:
            _mount("none", point, None, MS_BIND | MS_REMOUNT | MS_RDONLY | flags)
        except SetupError as exc:
            if not os.path.exists(point):
                continue  # hidden under another mount: unreachable anyway
            raise SetupError(f"cannot make {point} read-only: {exc}") from None
    if private_dev:
        _minimal_dev()
    if not network:
        _loopback_up()


DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")
"""The host device nodes a run can open: the ones every program expects, none that reaches hardware,
the kernel log, loop devices, consoles or other terminals (``/dev/tty`` is the caller's own)."""


_host_dev_fd: int | None = None
"""The host's /dev (``O_PATH``) in a spare with a private /dev, until the run's view is made: a scope
or an interpreter under the host's /dev/shm is bound back through it, then it is closed."""


def _minimal_dev() -> None:
    """Cover the host's /dev with a /dev of the run's own: a read-only tmpfs (nosuid, noexec) holding
    bind mounts of ``DEV_NODES``, a private devpts instance for pseudo-terminals, the usual ``fd`` and
    ``std*`` links and an empty ``shm`` directory (its tmpfs is mounted per run). Every other host
    node (``/dev/kmsg``, ``/dev/loop-control``, ``/dev/kvm``, ``/dev/console``, ``/dev/tty1``...) has
    no name in the run's view, and a tmpfs made in a user namespace cannot hold a usable device node."""
    global _host_dev_fd
    opened = os.open("/dev", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    host_dev = fcntl.fcntl(opened, fcntl.F_DUPFD_CLOEXEC, 100)  # clear of 0-3, which the spare replaces
    os.close(opened)
    _host_dev_fd = host_dev
    _mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,nr_inodes=64,mode=0755")
    for name in DEV_NODES:
        source = f"/proc/self/fd/{host_dev}/{name}"
        if not os.path.exists(source):
            continue
        os.close(os.open(f"/dev/{name}", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666))
        _mount(source, f"/dev/{name}", None, MS_BIND)
    for directory in ("pts", "shm"):
        os.mkdir(f"/dev/{directory}", 0o755)
    try:
        _mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620")
        os.symlink("pts/ptmx", "/dev/ptmx")
    except SetupError:
        pass  # a kernel without devpts in user namespaces: runs get no pseudo-terminals, nothing more
    os.symlink("/proc/self/fd", "/dev/fd")
    for number, stream in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{number}", f"/dev/{stream}")
    _mount("none", "/dev", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC)


def _mount_point(field: str) -> str:
    """A mountinfo mount point with its octal escapes (``\\040`` for a space) decoded."""
    if "\\" not in field:
        return field  # the usual case: no pattern compiled in a run's child (about 10 ms there)
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mount_table() -> list[tuple[str, int]]:
    """(mount point, its per-mount flags) for every mount this process sees, parents first."""
    table = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            fields = line.split()
            point = _mount_point(fields[4])
            flags = sum(_MOUNT_OPTION_FLAGS.get(option, 0) for option in fields[5].split(","))
            table.append((point, flags))
    return sorted(set(table), key=lambda entry: entry[0].count("/") if entry[0] != "/" else 0)


def _mount_flags_of(path: str) -> int:
    """The per-mount flags of the mount holding ``path`` (the longest mount point above it)."""
    best, flags = "", 0
    for point, point_flags in _mount_table():
        prefix = point.rstrip("/") + "/"
        if (path == point or path.startswith(prefix) or point == "/") and len(point) >= len(best):
            best, flags = point, point_flags
    return flags


def _loopback_up() -> None:
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        ifreq = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _drop_capabilities() -> None:
    """Drop every capability for good: bounding set, ambient set, securebits, then capset to zero."""
    with open("/proc/sys/kernel/cap_last_cap") as fh:
        last = int(fh.read())
    for cap in range(last + 1):
        _libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0)
    _libc.prctl(PR_CAP_AMBIENT, ctypes.c_ulong(PR_CAP_AMBIENT_CLEAR_ALL), 0, 0, 0)
    _prctl(PR_SET_SECUREBITS, SECBIT_ALL_LOCKED_NOROOT)
    header = _CapHeader(LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset")


def _filter() -> Any:
    """``seccomp.py``, the run's seccomp filter, loaded once by its path (``_sibling``)."""
    global _seccomp
    if _seccomp is None:
        _seccomp = _sibling("seccomp")
    return _seccomp


def _install_filter(namespaced: bool, network: bool) -> None:
    """The run's seccomp filter (``seccomp.py`` says what it refuses): the ``namespaces`` level's, or
    the ``process`` level's, which also takes every ``AF_UNIX`` socket away; so does the
    ``namespaces`` level's with the network off (no host unix socket anywhere is connectable then,
    wherever its file lies and whatever its name, abstract sockets too). Inherited by everything
    the run starts; ``no_new_privs`` must be set. Raises SetupError where it cannot be installed."""
    try:
        _filter().install("namespaces" if namespaced else "process", unix_sockets=namespaced and network)
    except (OSError, RuntimeError) as exc:
        raise SetupError(f"cannot install the run's seccomp filter: {exc}") from exc


def _prepare_filters(namespaced: bool) -> None:
    """Build the level's seccomp filters (with and without ``AF_UNIX`` sockets at the namespaces
    level) before the zygote forks, so each run's ``_install_filter`` only installs one. On an
    arch without syscall numbers nothing is built, and a run's install reports that as before."""
    for unix_sockets in (False, True) if namespaced else (False,):
        try:
            _filter().prepare("namespaces" if namespaced else "process", unix_sockets=unix_sockets)
        except RuntimeError:
            return


LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6 (the SYS_LANDLOCK_* numbers are above)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 without Landlock."""
    version = _libc.syscall(
        SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), LANDLOCK_CREATE_RULESET_VERSION
    )
    return max(0, int(version))


def _become_namespace_init(sock: socket.socket) -> None:
    """Be pid 1 of the run's pid namespace; return only in the forked child that runs the code.

    The code must not run as pid 1: the kernel drops signals that pid 1 has no handler for, so
    SIGTERM, SIGALRM or SIGXCPU would not end it. This init forwards SIGINT/SIGTERM to the run,
    reaps orphans, and exits when the run does; its exit ends the namespace, and the kernel kills
    whatever is left in it.

    When the run has exited, the init kills everything else in the namespace and sends the run's
    exact wait status and usage to the zygote on ``sock`` (an exit status has 8 bits, too few to
    tell ``sys.exit(137)`` from a SIGKILL), so the run's end is known without waiting for the
    namespace's teardown (its mounts and network take tens of milliseconds to go). The run
    closes its copy of ``sock`` before any user code runs, so only the init can write there.
    """
    run = os.fork()
    if run == 0:
        return
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda n, _frame: _forward(run, n))
    while True:
        try:
            pid, status, usage = os.wait4(-1, 0)
        except ChildProcessError:
            os._exit(127)
        if pid == run:
            try:
                os.kill(-1, signal.SIGKILL)  # from pid 1: every other process of the namespace
            except OSError:
                pass
            report = {
                "wait_status": status,
                "maxrss_kb": usage.ru_maxrss,
                "cpu_s": usage.ru_utime + usage.ru_stime,
            }
            try:
                sock.send(json.dumps(report).encode())
            except OSError:
                pass
            code = os.waitstatus_to_exitcode(status)
            os._exit(code if code >= 0 else 128 - code)


def _forward(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except OSError:
        pass


def _probe_namespaces(private_dev: bool) -> str | None:
    """Try the full namespace setup in a throwaway child; None when it works, else the reason."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 0
        try:
            _enter_namespaces(network=False)
            inner = os.fork()
            if inner == 0:
                try:
                    _prepare_namespace_init(network=False, private_dev=private_dev)
                    _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=1m")
                    _drop_capabilities()
                    _prctl(PR_SET_NO_NEW_PRIVS, 1)
                    # An architecture without the filter gets process isolation.
                    _install_filter(namespaced=True, network=False)
                    os._exit(0)
                except BaseException as exc:
                    os.write(w, str(exc).encode()[:500])
                    os._exit(1)
            code = os.waitstatus_to_exitcode(os.waitpid(inner, 0)[1])
        except BaseException as exc:
            os.write(w, str(exc).encode()[:500])
            code = 1
        os._exit(code)
    os.close(w)
    reason = os.read(r, 600).decode(errors="replace")
    os.close(r)
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return None if status == 0 else (reason or f"exit status {status}")


def _join_cgroups(cgroups: dict[str, str]) -> None:
    for directory in set(cgroups.values()):
        _write(os.path.join(directory, "cgroup.procs"), "0")


def _probe_clone(private_dev: bool, cgroup_parents: dict[str, str]) -> str | None:
    """Try what a cloned spare does (``_clone_into_namespaces``, its id maps, joining a cgroup from
    inside the new user namespace, the read-only mount view) in a throwaway child; None when it
    works, else the reason (spares are then made through a helper, the slower path)."""
    if not _clone_usable():
        return f"clone: not used on {os.uname().machine} or with threads in the zygote"
    cgroups = {c: os.path.join(parent, f"clone-probe-{os.getpid()}") for c, parent in cgroup_parents.items()}
    r, w = os.pipe()
    try:
        for directory in set(cgroups.values()):
            os.mkdir(directory)
        uid, gid = os.geteuid(), os.getegid()
        try:
            pid = _clone_into_namespaces(network=False)
        except OSError as exc:
            return str(exc)
        if pid == 0:
            try:
                os.close(r)
                _map_own_ids(uid, gid)
                _join_cgroups(cgroups)
                _prepare_namespace_init(network=False, private_dev=private_dev)
                os._exit(0)
            except BaseException as exc:
                os.write(w, str(exc).encode()[:500])
                os._exit(1)
        os.close(w)
        w = -1
        reason = os.read(r, 600).decode(errors="replace")
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        return None if status == 0 else (reason or f"exit status {status}")
    except OSError as exc:
        return f"clone probe: {exc}"
    finally:
        for fd in (r, w):
            if fd >= 0:
                os.close(fd)
        for directory in set(cgroups.values()):
            try:
                os.rmdir(directory)
            except OSError:
                pass


# ---------------------------------------------------------------- landlock


def _landlock_abi() -> int:
    """The kernel's Landlock ABI version if it is 2 (Linux 5.19) or later, else 0 (absent, disabled,
    or ABI 1, whose domains refuse every cross-directory ``rename``/``link``: runs need those)."""
    abi = _libc.syscall(
        SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), LANDLOCK_CREATE_RULESET_VERSION
    )
    return abi if abi >= 2 else 0


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


KERNEL_FS_TYPES = frozenset(
    {
        "proc",
        "sysfs",
        "cgroup",
        "cgroup2",
        "securityfs",
        "debugfs",
        "tracefs",
        "bpf",
        "configfs",
        "efivarfs",
        "pstore",
        "binfmt_misc",
        "fusectl",
        "selinuxfs",
    }
)
"""Filesystems through which a write changes the kernel, not a file: cgroupfs above all (a root run
writing its pid into the root ``cgroup.procs`` leaves its pids and memory cgroups), sysctls under
``/proc/sys``, ``/sys`` knobs. A run at the ``process`` level may write nothing beneath them, as at
the ``namespaces`` level (where they are mounted read-only)."""


def _kernel_mount_points() -> set[str]:
    """``/proc``, ``/sys`` and every mount point of a ``KERNEL_FS_TYPES`` filesystem in this mount
    namespace (``/proc/self/mountinfo``: field 5, octal escapes decoded, and the type after ``-``)."""
    points = {"/proc", "/sys"}
    with open("/proc/self/mountinfo", "rb") as fh:
        for line in fh.read().decode("utf-8", "surrogateescape").splitlines():
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if len(fields) >= 5 and rfields and rfields[0] in KERNEL_FS_TYPES:
                points.add(_mount_point(fields[4]))
    return points


def _writable_beneath(denied: set[str]) -> list[str]:
    """The fewest paths beneath which everything but ``denied`` (absolute, canonical) lies: every
    entry of ``/`` that holds no denied path, and, inside one that does, the same again.

    Landlock rules only grant (a handled right is denied wherever no rule grants it), so "everything
    but the kernel's filesystems" is spelt as rules on their siblings. An entry created later in a
    directory that was split this way is not writable (stricter, never looser); a directory that
    cannot be listed grants nothing beneath it."""
    granted: list[str] = []
    pending = ["/"]
    while pending:
        directory = pending.pop()
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            path = os.path.join(directory, name)
            if path in denied:
                continue
            if any(d.startswith(path + "/") for d in denied):
                pending.append(path)
            else:
                granted.append(path)
    return granted


_writable_paths: tuple[set[str], list[str]] | None = None
"""The kernel's mount points and ``_writable_beneath`` of them, listed by a process-level spare while
it waits for its run (``_prepare_write_rules``), so the run's setup only opens and adds them."""


def _prepare_write_rules() -> None:
    """List, ahead of the run, the paths ``_add_write_rules`` grants writes beneath (about 2 ms)."""
    global _writable_paths
    mounts = _kernel_mount_points()
    _writable_paths = (mounts, _writable_beneath(mounts))


def _add_write_rules(ruleset: int, rights: int) -> None:
    """Grant ``rights`` (writing and truncating files) and ``LANDLOCK_DIR_WRITE_RIGHTS`` (making,
    removing, renaming entries) beneath everything but the kernel's filesystems. Each entry is
    opened ``O_PATH | O_NOFOLLOW`` and a symlink is skipped: following one (``/x -> /sys/fs/cgroup``,
    planted by a root run) would grant writes beneath its target; the real directory it names,
    where it is writable, has a rule of its own."""
    mounts = _kernel_mount_points()  # read again (0.1 ms): a kernel mount made since is denied too
    ready = _writable_paths
    paths = ready[1] if ready is not None and ready[0] == mounts else _writable_beneath(mounts)
    for path in paths:
        try:
            fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # gone since the listing
        try:
            mode = os.fstat(fd).st_mode
            if stat.S_ISLNK(mode):
                continue
            # Landlock accepts directory rights only on a directory: a file gets writing and
            # truncating alone (and its own entry, in a split directory, can be neither removed nor
            # renamed: its parent grants nothing).
            granted = rights | LANDLOCK_DIR_WRITE_RIGHTS if stat.S_ISDIR(mode) else rights
            _add_rule(ruleset, fd, granted, path)
        finally:
            os.close(fd)


def _add_rule(ruleset: int, fd: int, rights: int, path: str) -> None:
    """Grant ``rights`` beneath the file or directory open as ``fd`` (``O_PATH``); ``path`` names
    it in the error."""
    rule = _PathBeneath(rights, fd)
    _check(
        _libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, ctypes.byref(rule), 0),
        f"landlock_add_rule ({path})",
    )


def _add_rules(ruleset: int, grants: list[tuple[str, int]]) -> None:
    """Grant each (directory, rights) of ``grants`` beneath that directory (one that is missing or
    not a directory grants nothing)."""
    for path, rights in grants:
        try:
            fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            _add_rule(ruleset, fd, rights, path)
        finally:
            os.close(fd)


def _enter_landlock_domain(
    abi: int,
    abstract_unix: bool = False,
    deny_kernel_writes: bool = False,
    writable: tuple[str, ...] | None = None,
) -> None:
    """Put this process (and all it will fork) in a Landlock domain of its own.

    A process in a domain cannot ptrace -- nor read ``/proc/<pid>/environ``, ``mem`` or ``fd`` of -- any
    process outside it (Documentation/userspace-api/landlock.rst, "Ptrace restrictions"). At the
    process level the run shares its uid with the supervisor's ancestors (the shell that started
    the CLI, which may hold credentials); this is what keeps their environment out of reach. From
    ABI 6 (Linux 6.12) it cannot signal processes outside its domain either (the zygote, the
    supervisor, other runs). Every domain denies cross-directory ``rename``/``link`` unless it
    handles ``REFER`` and grants it: it is granted beneath ``/``. With ``abstract_unix`` (ABI 6+) the
    run may connect only to abstract unix sockets its own processes bound, never to the host's (in
    the host's network namespace, which a run with network shares: X11, D-Bus, container shims
    listen there). From ABI 9 (Linux 7.1, ``LANDLOCK_ACCESS_FS_RESOLVE_UNIX``) the same holds for
    socket files: the run may connect and send only to those its own processes bound (not exercised
    here: this machine has ABI 7). Needs ``no_new_privs``.

    File rules: it denies making device nodes (no run needs one), and with ``deny_kernel_writes``
    (the process level) opening for writing, truncating, making, removing or renaming anything
    beneath ``/proc``, ``/sys`` and the other ``KERNEL_FS_TYPES`` mounts: dropped capabilities do not
    stop uid 0 there (its ``cgroup.procs`` and sysctl writes need none, nor renaming another spare's
    cgroup and leaving a decoy in its place). With ``writable`` (the ``namespaces`` level: the scope,
    /tmp and /dev/shm, as the run's mount namespace sees them) it grants writes, making, removing and
    renaming beneath those folders only, and writing to files beneath /dev (null, tty, the pts), so
    a write anywhere else is refused even where a mount would allow it. ``chmod``, ``chown`` and
    ``utime`` have no Landlock hook: they are not denied. Reopening a descriptor through ``/proc/self/fd``
    is checked against the file it names, not ``/proc``, and pipes, sockets and ``memfd`` files are
    not in any directory Landlock checks, so they stay writable.
    """
    write_rights = LANDLOCK_ACCESS_FS_WRITE_FILE | (LANDLOCK_ACCESS_FS_TRUNCATE if abi >= 3 else 0)
    handled = LANDLOCK_ACCESS_FS_MAKE_CHAR | LANDLOCK_ACCESS_FS_MAKE_BLOCK | LANDLOCK_ACCESS_FS_REFER
    restricts_writes = deny_kernel_writes or writable is not None
    fields = [handled | (write_rights | LANDLOCK_DIR_WRITE_RIGHTS if restricts_writes else 0)]
    if abi >= RESOLVE_UNIX_ABI:
        # Granted nowhere: the run connects only to socket files its own processes bound.
        fields[0] |= LANDLOCK_ACCESS_FS_RESOLVE_UNIX
    if abi >= 6:
        scoped = LANDLOCK_SCOPE_SIGNAL | (LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET if abstract_unix else 0)
        fields += [0, scoped]  # handled_access_net (none), scoped
    attr = (ctypes.c_uint64 * len(fields))(*fields)
    ruleset = _libc.syscall(
        SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), 0
    )
    if ruleset < 0:
        raise SetupError(f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
    try:
        root = os.open("/", os.O_PATH | os.O_CLOEXEC)
        try:
            _add_rule(ruleset, root, LANDLOCK_ACCESS_FS_REFER, "/")
        finally:
            os.close(root)
        if deny_kernel_writes:
            _add_write_rules(ruleset, write_rights)
        if writable is not None:
            grants = [(path, write_rights | LANDLOCK_DIR_WRITE_RIGHTS) for path in writable]
            _add_rules(ruleset, [*grants, ("/dev", write_rights)])
        _check(_libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0), "landlock_restrict_self")
    finally:
        os.close(ruleset)


def _readable_credentials(names: list[str]) -> list[dict[str, Any]]:
    """Processes whose environment a run would be able to read and that hold a credential: one of
    ``names`` with a non-empty value. Probed in a throwaway child with the run's own standing (no
    capabilities, ``no_new_privs``), so the answer is what a run could read, not what the zygote can.

    Each finding is ``{"pid", "command", "names"}``; values are never read out of the child.
    """
    wanted = {name.encode() for name in names}
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        found: list[dict[str, Any]] = []
        try:
            if os.geteuid() == 0:
                _drop_capabilities()
            _prctl(PR_SET_NO_NEW_PRIVS, 1)
            for entry in os.listdir("/proc"):
                if not entry.isdigit() or int(entry) == os.getpid():
                    continue
                try:
                    with open(f"/proc/{entry}/environ", "rb") as fh:
                        variables = fh.read().split(b"\0")
                    with open(f"/proc/{entry}/comm", "rb") as fh:
                        command = fh.read().decode(errors="replace").strip()
                except OSError:
                    continue
                pairs = (variable.partition(b"=") for variable in variables)
                held = sorted({name.decode() for name, _, value in pairs if name in wanted and value})
                if held:
                    found.append({"pid": int(entry), "command": command[:64], "names": held})
            os.write(w, json.dumps(found[:20]).encode()[: 1 << 15])
            os._exit(0)
        except BaseException:
            os._exit(1)
    os.close(w)
    data = bytearray()
    while chunk := os.read(r, 1 << 16):
        data += chunk
    os.close(r)
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if status != 0:
        return [{"pid": 0, "command": "?", "names": ["(the probe failed: assume they are readable)"]}]
    return list(json.loads(data or b"[]"))


# ---------------------------------------------------------------- processes


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                kids.extend(int(p) for p in fh.read().split())
        except OSError:
            continue
    return kids


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    stack = _children(pid)
    while stack:
        child = stack.pop()
        found.append(child)
        stack.extend(_children(child))
    return found


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _kill_own_descendants(deadline_s: float = 2.0) -> None:
    """SIGKILL every descendant of this process (orphans included: we are a subreaper or pid 1)."""
    me = os.getpid()
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        kids = _descendants(me)
        if not kids:
            return
        _kill_all(kids)
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        time.sleep(0.002)


# ---------------------------------------------------------------- the child


def _reopen_stdio() -> None:
    """New ``sys.std*`` over descriptors 0-2 as they are now, built as Python builds its own (a text
    wrapper over a buffered file). Called again once the run's pipes are in place: a stream caches
    whether its descriptor is seekable, and one made over the zygote's log file would say it is,
    so ``reconfigure()`` would seek a pipe (``OSError: Illegal seek``)."""
    # They live as long as the process, like the interpreter's own: no context manager.
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False)  # noqa: SIM115
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr  # type: ignore[misc]


def _apply_rlimits(limits: dict[str, int]) -> None:
    pairs = {
        "memory_bytes": resource.RLIMIT_AS,
        "file_size_bytes": resource.RLIMIT_FSIZE,
        "open_files": resource.RLIMIT_NOFILE,
        "processes": resource.RLIMIT_NPROC,
    }
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if "cpu_s" in limits:
        # SIGXCPU at the soft limit, SIGKILL one second later (setrlimit(2)).
        resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1))
    for key, which in pairs.items():
        if key in limits:
            resource.setrlimit(which, (limits[key], limits[key]))


def _count_uid_processes(uid: int) -> int:
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    count += 1
            except OSError:
                continue
    return count


def _read_code(fd: int) -> str:
    """The code, from the memfd the supervisor wrote it to (no file on any disk)."""
    size = os.fstat(fd).st_size
    data = bytearray()
    while len(data) < size:
        chunk = os.pread(fd, size - len(data), len(data))
        if not chunk:
            break
        data += chunk
    return data.decode("utf-8")


def _prewarm() -> dict[str, Any]:
    """Request-independent preparation, done by a spare before any request arrives.

    After ``fork`` every page a process writes to is copied; doing this work ahead of time (and
    compiling and running a trivial program once) moves most of those copies off the run's path.
    """
    import mmap

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _reseed()
    _reopen_stdio()
    warm_main = types.ModuleType("__main__")
    sink = io.StringIO()
    exec(compile("print('', end='', file=sink)\n", CODE_FILENAME, "exec"), {"sink": sink})
    try:
        raise ValueError("warm-up")
    except ValueError as exc:
        _format_error(exc)
    return {"reserve": mmap.mmap(-1, 8 << 20), "main": warm_main}


def _interpreter_paths() -> tuple[str, ...]:
    """Where the environment's interpreter and its modules live: they must stay visible to the run
    even when they sit under /tmp or /dev/shm (a checkout in /tmp, say)."""
    return tuple(
        p for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path) if p and os.path.isdir(p)
    )


_interpreter_links: dict[str, str] = {}
"""``_links_on_the_way`` of the interpreter's paths, walked once by the zygote at start (~1 ms on a
busy host: not on every run's path); spares inherit it."""

_interpreter_folders: tuple[str, ...] = ()
"""The interpreter's paths resolved by the zygote at start, with its links: the folders bound back
into every run. Resolved again at each request, a link on the way that someone rewrote since (a
process-level run of the same uid under the host's /tmp, a run in a scope holding the interpreter)
pointed a run's bind-back at a hidden folder (the home, the data directory)."""


def _links_on_the_way(paths: tuple[str, ...]) -> dict[str, str]:
    """Every symbolic link met while resolving ``paths`` (as the kernel walks them, one component at
    a time), as ``{where: its text}``; ``where`` has no link in its folder part. An interpreter
    reached through a link under /tmp (``/tmp/py -> /opt/python``) keeps ``/tmp/py/...`` in
    ``sys.prefix``, ``sys.path`` and ``sys.executable``: binding back only the resolved folders
    left that name dangling in the run's fresh /tmp, and the run could not import or exec it."""
    links: dict[str, str] = {}
    for path in paths:
        current, pending, budget = "/", [p for p in os.path.abspath(path).split("/") if p], 40  # ELOOP's 40
        while pending and budget > 0:
            part = pending.pop(0)
            if part == ".":
                continue
            if part == "..":
                current = os.path.dirname(current)
                continue
            step = os.path.join(current, part)
            host = _on_host(step)
            if not os.path.islink(host):
                current = step
                continue
            budget -= 1
            text = os.readlink(host)
            links[step] = text
            pending = [p for p in text.split("/") if p] + pending
            if text.startswith("/"):
                current = "/"
    return links


def _private_view(req: dict[str, Any], network: bool) -> None:
    """The run's view of the filesystem (everything else is read-only since the spare was made):

    - its own /tmp and /dev/shm (tmpfs of ``tmp_bytes`` and ``shm_bytes``), and its own /dev (made
      when the spare was, see ``_minimal_dev``);
    - ``hidden_paths`` (the supervisor's home, the backend's data directory), /run and /var/run (unix
      sockets of host services), covered by empty tmpfs; with network, resolv.conf's target file
      (only the file) bound back where it lies under them;
    - the working directory bound back read-write at its own path, and the interpreter's prefixes
      and module paths bound back read-only where they were hidden.
    """
    cwd = os.path.realpath(req["cwd"])
    readable = list(_interpreter_folders) or [os.path.realpath(p) for p in _interpreter_paths()]
    links = _interpreter_links
    resolv = resolver_file() if network else None
    try:
        held = {
            path: _hold(path, "the working directory" if path == cwd else "an interpreter path")
            for path in {cwd, *readable}
        }
        resolv_fd = os.open(resolv, os.O_PATH | os.O_CLOEXEC) if resolv else None
    finally:
        _close_host_dev()
    # Sized tmpfs: their pages are RAM, charged to the run's memory cgroup where it has one, and
    # capped here either way (a run writing to an unsized /tmp took host RAM past its memory limit).
    if req.get("tmp_bytes"):
        _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={req['tmp_bytes']},mode=1777")
    else:  # the unsized scratch directory, kept only to measure the difference (``sized_tmp=False``)
        _mount(req["tmp_dir"], "/tmp", None, MS_BIND | MS_REC)
        _mount("none", "/tmp", None, MS_BIND | MS_REMOUNT | _mount_flags_of("/tmp"))
    _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={req['shm_bytes']},mode=1777")
    covered = ["/tmp", "/dev/shm"]
    # /run and /var/run hold host services' unix sockets (the system bus, docker.sock, screen's
    # S-user folders, /run/user's session buses, systemd --user and agents, which run a command
    # outside the sandbox): hidden at every network setting, since with the network on the run may
    # make AF_UNIX sockets and a read-only mount does not stop a connect. With the network on only
    # the file resolv.conf links to comes back (below).
    for hidden in [*req.get("hidden_paths", []), "/run", "/var/run"]:
        real = os.path.realpath(hidden)
        if os.path.isdir(real) and not os.path.islink(hidden) and real not in covered:
            _mount("tmpfs", real, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=64k,mode=0755")
            covered.append(real)

    def is_covered(path: str) -> bool:
        return any(path == c or path.startswith(c.rstrip("/") + "/") for c in covered)

    # Bind back the outermost hidden directories only: binding /tmp/x also brings /tmp/x/.venv.
    lost = sorted(p for p in held if is_covered(p))
    for path in lost:
        if any(path.startswith(q + "/") for q in lost if q != path) and path != cwd:
            continue
        if path != cwd:
            _check_resolves_as(held[path], path, "an interpreter path")
        os.makedirs(path, exist_ok=True)
        _mount(f"/proc/self/fd/{held[path]}", path, None, MS_BIND | MS_REC)
    if resolv is not None and resolv_fd is not None:
        if is_covered(resolv) and not any(resolv.startswith(p + "/") for p in lost):
            # The file alone, on an empty file of its own in the cover, at the same path: its
            # folder (systemd-resolved's /run/systemd/resolve) holds the service's sockets too.
            os.makedirs(os.path.dirname(resolv), exist_ok=True)
            os.close(os.open(resolv, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
            _mount(f"/proc/self/fd/{resolv_fd}", resolv, None, MS_BIND)
        os.close(resolv_fd)
    # The links on the way to the interpreter, made again where they lay in a cover (their text
    # only: what they lead to is bound back above, or was never hidden). Never inside a folder
    # bound back from the host (the link is there already, and a write would reach the host).
    bound = [*lost, cwd]
    for where, text in sorted(links.items()):
        inside_bound = any(where == b or where.startswith(b + "/") for b in bound)
        if is_covered(where) and not inside_bound and not os.path.lexists(where):
            os.makedirs(os.path.dirname(where), exist_ok=True)
            os.symlink(text, where)
    if cwd not in lost:
        _mount(cwd, cwd, None, MS_BIND | MS_REC)
    # The working directory is the one place the run may write outside /tmp and /dev/shm.
    _mount("none", cwd, None, MS_BIND | MS_REMOUNT | _mount_flags_of(cwd))
    for fd in held.values():
        os.close(fd)
    for hidden_dir in covered[2:]:  # the empty covers themselves are not writable either
        _mount("none", hidden_dir, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _hold(path: str, what: str) -> int:
    """An ``O_PATH`` descriptor of the directory ``path`` as the spare sees it. Raises SetupError
    naming ``what`` and the path when it is not there: the spare's copy of the mount table may
    predate the file system the path is on (the zygote renews its spares when it notices)."""
    try:
        return os.open(_on_host(path), os.O_PATH | os.O_DIRECTORY)
    except OSError as exc:
        raise SetupError(f"{what} {path}: {exc.strerror} in the run's view of the file systems") from None


def _check_resolves_as(fd: int, path: str, what: str) -> None:
    """Refuse (SetupError) to bind back the held folder ``fd`` unless it is still at ``path``, the
    folder resolved at the zygote's start: a component replaced by a link since (under /tmp, or
    /dev/shm, by a same-uid process on the host) would bind back whatever it points to, a hidden
    folder included. The bind uses this very descriptor, so nothing can change in between. Only
    folders bound back into a cover are checked: any other is seen as the host has it now."""
    try:
        now = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        now = ""
    if now != path:
        raise SetupError(f"{what} {path}: it resolves elsewhere than when the environment started")


def resolver_file() -> str | None:
    """The file /etc/resolv.conf resolves to, when it is a regular file: with the network on it stays
    readable where it lies under a hidden folder (systemd-resolved's stub-resolv.conf in
    /run/systemd/resolve, NetworkManager's in /run/NetworkManager), and nothing else of that folder."""
    real = os.path.realpath("/etc/resolv.conf")
    return real if os.path.isfile(real) else None


def _on_host(path: str) -> str:
    """``path`` as the host sees it: a path under /dev goes through the host's /dev while the spare
    still holds it (``_host_dev_fd``); anything else is the same path."""
    if _host_dev_fd is not None and (path == "/dev" or path.startswith("/dev/")):
        return f"/proc/self/fd/{_host_dev_fd}{path[len('/dev') :]}"
    return path


def _close_host_dev() -> None:
    global _host_dev_fd
    if _host_dev_fd is not None:
        os.close(_host_dev_fd)
        _host_dev_fd = None


def _setup_child(req: dict[str, Any], namespaced: bool) -> None:
    os.setsid()
    cwd = req["cwd"]
    if namespaced:
        _private_view(req, network=req.get("network", False))
    _close_host_dev()  # never reaches user code
    os.chdir(cwd)
    os.umask(0o022)
    limits = dict(req["limits"])
    if "processes" in limits:
        if os.geteuid() == 0 and not namespaced:
            limits.pop("processes")  # ignored for uid 0 anyway; the pids cgroup bounds it (README)
        elif not namespaced:
            # RLIMIT_NPROC counts every process of the real uid, so the budget sits on top of them.
            limits["processes"] += _count_uid_processes(os.getuid())
    _apply_rlimits(limits)
    os.environ.clear()
    os.environ.update(req["env"])
    if namespaced or os.geteuid() == 0:
        _drop_capabilities()
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    # One Landlock domain: the level's (``landlock_abi``), and/or, wherever the AF_UNIX filter is
    # off, one that keeps host abstract sockets out of reach (``scope_abstract_sockets``:
    # the kernel's ABI, 6+). With namespaces the domain grants writes only where the run's mounts
    # do (the scope, /tmp, /dev/shm, device nodes): a second wall behind the read-only mounts.
    landlock, abstract = int(req.get("landlock_abi") or 0), int(req.get("scope_abstract_sockets") or 0)
    if landlock or abstract:
        _enter_landlock_domain(
            max(landlock, abstract),
            abstract_unix=abstract >= 6,
            deny_kernel_writes=bool(landlock) and not namespaced,
            writable=(cwd, "/tmp", "/dev/shm") if landlock and namespaced else None,
        )
    # Where the zygote's probe found the filter works (``process_calls`` ``filtered``), and always
    # at the namespaces level with the network off (no run there without it). First out of the
    # inherited session keyring (the supervisor's, the login's): even a call the filter missed
    # would then find none of its keys.
    network = bool(req.get("network", False))
    if req.get("filter_process_calls") or (namespaced and not network):
        _filter().leave_session_keyring()  # an errno here leaves only key names visible (README)
        _install_filter(namespaced, network)
    # Not dumpable: another run of the same uid cannot read this one's /proc/<pid>/{environ,mem,cwd}.
    _prctl(PR_SET_DUMPABLE, 0)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans of this run come back to us, so we can sweep them
    # The scope comes last: a file a run leaves there named like a standard or installed module
    # (json.py, pandas/) must not replace it in every later run of the scope.
    sys.path[:] = [p for p in sys.path[1:] if os.path.abspath(p) != os.path.dirname(_ZYGOTE_FILE)] + [
        req["cwd"]
    ]
    _import_scope_from_source_only(req["cwd"])
    sys.argv[:] = [""]


def _import_scope_from_source_only(scope: str) -> None:
    """Modules under ``scope`` are compiled from their ``.py`` source at every import: bytecode there
    (``__pycache__/*.pyc``, a bare ``mod.pyc``) is never read nor written, nor are compiled extensions.

    A ``.pyc`` need not match its source (its header carries a size and mtime the writer chooses, or
    says "unchecked"), so one left in the scope by an earlier run would run instead of the code
    anyone can read. Paths outside the scope keep the normal finders (and their bytecode caches).
    """
    import importlib.machinery as machinery

    root = os.path.realpath(scope)

    class ScopeSourceLoader(machinery.SourceFileLoader):
        def get_code(self, fullname: str) -> types.CodeType:
            return self.source_to_code(self.get_data(self.path), self.path)

    def scope_finder(entry: str) -> machinery.FileFinder:
        real = os.path.realpath(entry or ".")
        if real != root and not real.startswith(root.rstrip("/") + "/"):
            raise ImportError("not in the scope")
        return machinery.FileFinder(entry, (ScopeSourceLoader, list(machinery.SOURCE_SUFFIXES)))

    sys.path_hooks.insert(0, scope_finder)
    # A new, empty cache rather than the zygote's emptied: clearing that one released every finder
    # the preload had cached (hundreds with pandas), whose freeing wrote to as many shared pages,
    # copied one by one (~5 ms of each run). Kept referenced, they are never freed nor written.
    _DROPPED_FINDER_CACHES.append(sys.path_importer_cache)
    sys.path_importer_cache = {}


def _reseed() -> None:
    # `random` reseeds itself after fork; numpy's legacy global generator does not, so every run would
    # otherwise draw the same "random" numbers.
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        np_random.seed()


def _format_error(exc: BaseException) -> dict[str, Any]:
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == _ZYGOTE_FILE:
        tb = tb.tb_next
    try:
        text = "".join(traceback.format_exception(type(exc), exc, tb))
    except BaseException:
        text = "<the traceback could not be formatted>"
    if len(text) > MAX_TRACEBACK_CHARS:
        text = "[... earlier frames omitted ...]\n" + text[-MAX_TRACEBACK_CHARS:]
    value = _safe_str(exc)
    if len(value) > MAX_ERROR_VALUE_CHARS:
        value = value[:MAX_ERROR_VALUE_CHARS] + " [... truncated ...]"
    name = _safe_str(type(exc).__qualname__)
    module = _safe_str(type(exc).__module__)
    if module not in ("builtins", "__main__"):
        name = f"{module}.{name}"
    return {"name": name[:MAX_ERROR_NAME_CHARS], "value": value, "traceback": text}


def _safe_str(value: object) -> str:
    """``str(value)``, or a placeholder when its ``__str__`` raises (user objects may)."""
    try:
        text = str(value)
    except BaseException:
        return f"<{type(value).__name__} whose str() failed>"
    return text if isinstance(text, str) else "<not a string>"


def _run_user_code(req: dict[str, Any], warm: dict[str, Any]) -> dict[str, Any]:
    """Compile and run the code in a fresh ``__main__``; return the status line's fields."""
    reserve = warm["reserve"]  # address space released on MemoryError so the report can be built
    outcome: dict[str, Any] = {
        "phase": "done",
        "exit_code": 0,
        "error": None,
        "memory_error": False,
        "interrupted": False,
    }
    source = req["source"]
    main = warm["main"]
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    import linecache

    linecache.cache[CODE_FILENAME] = (len(source), None, source.splitlines(True), CODE_FILENAME)
    session = _SessionState(req.get("state"), req["cwd"])
    session.restore(main.__dict__)
    try:
        code = compile(source, CODE_FILENAME, "exec", dont_inherit=True)
        exec(code, main.__dict__)
    except SystemExit as exc:
        if exc.code is None or exc.code == 0:
            outcome["exit_code"] = 0
        elif isinstance(exc.code, int):
            outcome["exit_code"] = exc.code & 0xFF or 1
            outcome["error"] = {"name": "SystemExit", "value": str(exc.code), "traceback": ""}
        else:
            value = _safe_str(exc.code)
            print(value, file=sys.stderr)
            outcome["exit_code"] = 1
            outcome["error"] = {"name": "SystemExit", "value": value, "traceback": ""}
    except MemoryError as exc:
        reserve.close()
        main.__dict__.clear()
        gc.collect()
        outcome.update(exit_code=1, memory_error=True, error=_format_error(exc))
    except KeyboardInterrupt as exc:
        outcome.update(exit_code=1, interrupted=True, error=_format_error(exc))
    except BaseException as exc:
        outcome.update(exit_code=1, error=_format_error(exc))
    # A failing run keeps what it had; a run cut by its timeout (interrupted, then killed) or out of
    # memory (its namespace is gone) saves nothing, and the previous state stays as it was.
    if not outcome["interrupted"] and not outcome["memory_error"]:
        session.save(main.__dict__)
    if session.report is not None:
        outcome["state"] = session.report
    return outcome


SAVE_MARGIN_S = 1.0
"""Seconds of the run's wall clock a save leaves for the child's report and exit."""


class _SessionState:
    """The session's live state around one run (``state.py`` does the work; DESIGN §4.7).

    ``request`` (from the supervisor, or None for a run outside a session)::

        {"dir": "work/sessions/S1", "fresh": false, "max_bytes": N, "max_save_s": 10.0,
         "run_timeout_s": 60.0}

    The save gets at most ``max_save_s`` and never more than what the run's wall clock has left
    (less a margin for the report): a save must not turn a finished run into a timeout.

    ``fresh``: the run starts with empty globals and saves nothing, so the saved state is kept.
    ``report``: the fields of the run result's ``state`` (names capped), or None.
    """

    def __init__(self, request: dict[str, Any] | None, cwd: str) -> None:
        self.request = request
        # The scope root, absolute: the code may change its working directory. The state folder is
        # reached from it one component at a time, never through a link (``state.open_state_dir``).
        self.root = cwd
        self.dir = request["dir"] if request else ""
        self.restored: Any = None
        self.started = time.monotonic()
        self.report: dict[str, Any] | None = None
        if request:
            self.report = {
                "restored": [],
                "saved": [],
                "skipped": {},
                "bytes": 0,
                "fresh": bool(request.get("fresh")),
            }

    def restore(self, namespace: dict[str, Any]) -> None:
        if self.report is not None and _STATE is None:
            self.report["skipped"]["*"] = "the zygote could not load state.py: no state is kept"
        if not self.request or self.request.get("fresh") or _STATE is None:
            return
        assert self.report is not None
        # Before any user code: a moment of dumpable only where no other process can reach this one.
        window = bool(self.request.get("pagemap_window"))
        _STATE.open_pagemap((lambda on: _prctl(PR_SET_DUMPABLE, 1 if on else 0)) if window else None)
        try:
            folder = _STATE.open_state_dir(self.root, self.dir, create=False)
            if folder is None:
                return  # no state yet
            try:
                self.restored = _STATE.restore(namespace, folder)
            finally:
                os.close(folder)
        except Exception as exc:  # the run goes on with empty globals; the reason is reported
            self.report["skipped"]["*"] = (
                f"the saved state could not be restored: {type(exc).__name__}: {exc}"
            )
            return
        self.report["restored"] = _STATE.cap_names(self.restored.names)
        self.report["restored_count"] = len(self.restored.names)
        self.report["skipped"].update(self.restored.skipped)
        self.report["restore_ms"] = self.restored.ms
        self.report["bytes"] = self.restored.bytes

    def save(self, namespace: dict[str, Any]) -> None:
        if not self.request or self.request.get("fresh") or _STATE is None:
            return
        assert self.report is not None
        timeout = self.request.get("run_timeout_s")
        left = float(timeout) - (time.monotonic() - self.started) if timeout else float("inf")
        budget = min(float(self.request["max_save_s"]), left - SAVE_MARGIN_S)
        if budget <= 0:
            self.report["save_error"] = (
                "no time left in the run's timeout to save; the previous state is kept"
            )
            return
        try:
            # Walked again: the code ran since the restore, and may have replaced a folder by a link.
            folder = _STATE.open_state_dir(self.root, self.dir, create=True)
            assert folder is not None
            try:
                saved = _STATE.save(
                    namespace,
                    folder,
                    self.restored,
                    max_bytes=int(self.request["max_bytes"]),
                    max_save_s=budget,
                )
            finally:
                os.close(folder)
        except BaseException as exc:  # KeyboardInterrupt too: the timeout came during the save
            self.report["save_error"] = f"{type(exc).__name__}: {exc}"[:500]
            return
        self.report["saved"] = _STATE.cap_names(saved["saved"])
        self.report["saved_count"] = len(saved["saved"])
        self.report["skipped"].update(saved["skipped"])
        self.report["bytes"] = saved["bytes"]
        self.report["save_ms"] = saved["save_ms"]
        self.report["written_bytes"] = saved["written_bytes"]
        skipped = self.report["skipped"]
        if len(skipped) > _STATE.MAX_REPORTED_NAMES:
            self.report["skipped"] = dict(list(skipped.items())[: _STATE.MAX_REPORTED_NAMES])


def _child_main(req: dict[str, Any], namespaced: bool, warm: dict[str, Any]) -> None:
    """Runs in the forked child with descriptors 0-3 in place; never returns.

    Whatever the user code leaves behind (signal handlers, timers, monkeypatched modules), this
    process ends here: the reporting phase blocks every signal and uses functions bound at import,
    and any escape still ends in ``os._exit``, never back in the zygote's code.
    """
    code = 127
    try:
        try:
            _setup_child(req, namespaced)
        except BaseException as exc:
            _report({"phase": "setup_error", "message": f"{type(exc).__name__}: {exc}"})
            return
        _report({"phase": "started"})  # a setup_error after this line is forged by the code: ignored
        try:
            outcome = _run_user_code(req, warm)
        except BaseException as exc:
            outcome = {"phase": "done", "exit_code": 1, "error": _format_error(exc)}
        _signal.pthread_sigmask(_signal.SIG_BLOCK, _ALL_SIGNALS)
        _signal.setitimer(_signal.ITIMER_REAL, 0)
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()  # type: ignore[union-attr]
            except BaseException:
                pass
        try:
            _kill_own_descendants()
            outcome.update(_usage())
        except BaseException:
            pass  # the code broke os or resource in its own process; the zygote sweeps what is left
        for fd in (0, 1, 2):
            try:
                _os_close(fd)
            except OSError:
                pass
        _report(outcome)
        try:
            _os_close(STATUS_FD)  # the supervisor has everything: it need not wait for the teardown
        except OSError:
            pass
        code = int(outcome.get("exit_code", 1)) & 0xFF
    finally:
        _os_exit(code)


_signal = signal
_ALL_SIGNALS = set(signal.Signals) - {signal.SIGKILL, signal.SIGSTOP}
_os_close, _os_exit, _os_write, _dumps = os.close, os._exit, os.write, json.dumps
_getrusage = resource.getrusage


def _usage() -> dict[str, float]:
    """CPU seconds and peak resident memory (KiB) of the run and the children it reaped. ``resource``
    is the zygote's, imported before any run: an import here, after the run's ``_import_scope_from_
    source_only``, built a finder for every ``sys.path`` entry (~1.5 ms), and would take whatever
    module the code left in ``sys.modules`` under that name."""
    own, reaped = _getrusage(resource.RUSAGE_SELF), _getrusage(resource.RUSAGE_CHILDREN)
    cpu = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
    return {"cpu_s": cpu, "maxrss_kb": max(own.ru_maxrss, reaped.ru_maxrss)}


def _report(message: dict[str, Any]) -> None:
    """One JSON line on the status pipe, with functions bound at import (user code may have
    replaced ``json.dumps`` or ``os.write`` in its own process)."""
    try:
        data = (_dumps(message) + "\n").encode()
    except BaseException:
        data = b'{"phase": "done", "exit_code": 1, "error": null}\n'
    try:
        while data:
            data = data[_os_write(STATUS_FD, data) :]
    except OSError:
        pass


# ---------------------------------------------------------------- the zygote


def _recv(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    fds = array.array("i")
    msg, ancdata, _flags, _addr = sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(8 * fds.itemsize))
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    if not msg:
        return None, list(fds)
    return json.loads(msg), list(fds)


class Spare:
    """A child forked ahead of time (its pid known at once, a cloned spare's being its namespace's
    init). On its socket it says, in either order, its pid (only a spare made through a helper, which
    forks it inside the new namespaces) and ``ready`` (it has prewarmed and
    waits for a request); handed a request, it answers ``took`` (with the time it did) before it
    does anything else."""

    def __init__(self, sock: socket.socket, pid: int | None, network: bool, helper_pid: int | None) -> None:
        self.sock = sock
        self.pid = pid  # None until a helper-made spare's helper reports the inner pid
        self.network = network
        self.helper_pid = helper_pid
        self.cgroups: dict[str, str] = {}  # controller -> the spare's cgroup directory
        # Its cgroup directories (path -> descriptor), opened when they were made: limits are
        # written through these, so a directory renamed since (and a decoy made in its place) gets none.
        self.cgroup_fds: dict[str, int] = {}
        self.mount_epoch = 0  # the zygote's ``mount_epoch`` when it was forked (its mount table's age)
        self.ready = False
        self.since = time.monotonic()  # when it was forked; once handed a request, when it was

    def close_cgroup_fds(self) -> None:
        for fd in self.cgroup_fds.values():
            os.close(fd)
        self.cgroup_fds = {}


class Request:
    """A spawn request waiting in the zygote for a ready spare, with the four descriptors it came
    with (kept open until a spare has taken them, so a spare that dies first costs nothing)."""

    def __init__(self, message: dict[str, Any], fds: list[int], network: bool) -> None:
        self.message = message
        self.fds = fds
        self.run_id = str(message["id"])
        self.network = network
        self.attempts = 0  # spares that died or stalled while being handed this request
        self.mount_epoch = 0  # the zygote's ``mount_epoch`` when it arrived: a spare must be as new
        self.memory_cgroup = False
        self.cancelled = False

    def close(self) -> None:
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []


FORKS_PER_TURN = 2
"""Spares forked per turn of the zygote's loop at most (a fork of a large interpreter takes tens of
milliseconds on a loaded machine): the loop goes back to its socket between them."""

DEMAND_MEMORY_S = 10.0
"""How long the zygote remembers a peak of concurrent runs when it sizes its pool of spares."""


class MountWatch:
    """Whether this process's mount table changed since the last look: ``/proc/self/mountinfo`` is
    pollable (proc(5)): a mount or unmount in the namespace marks it ``POLLPRI``, and one poll
    clears the mark. One open file and a poll with no wait per look (a few µs)."""

    def __init__(self) -> None:
        self.fd = os.open("/proc/self/mountinfo", os.O_RDONLY | os.O_CLOEXEC)
        self.poll = select.poll()
        self.poll.register(self.fd, select.POLLPRI | select.POLLERR)

    def changed(self) -> bool:
        return any(events & (select.POLLPRI | select.POLLERR) for _, events in self.poll.poll(0))


MAX_HAND_OVER_ATTEMPTS = 3
"""Spares a request may lose (died, or stalled past ``spare_timeout_s``, before saying ``took``)
before its run fails: a platform failure, local to that run."""


class Zygote:
    def __init__(self, config: dict[str, Any]) -> None:
        self.ctl = socket.socket(fileno=config["control_fd"])
        self.pool_size = int(config.get("pool_size", 2))
        self.spares: list[Spare] = []
        self.pending: dict[int, Spare] = {}  # socket fd -> spare not ready yet (pid maybe unknown)
        self.waiting: list[Request] = []  # requests in arrival order, until a ready spare takes one
        self.handing: dict[int, tuple[Spare, Request]] = {}  # socket fd -> spare handed a request
        # Spares being prepared at once: their set-up (namespaces, mounts) mostly waits on the kernel
        # (RCU grace periods), so several overlap well; a burst never forks one per request at once.
        self.max_preparing = max(1, int(config.get("max_preparing", 8)))
        self.spare_timeout_s = float(config.get("spare_timeout_s", 15.0))
        self.demand_peak = 0  # most runs in progress (or waiting) at once lately, see _provision
        self.demand_peak_at = 0.0
        self.runs: dict[int, str] = {}  # pid -> run id
        self.init_socks: dict[int, socket.socket] = {}  # namespaced run pid -> its init's socket
        self.reported: set[int] = set()  # namespaced runs whose exit was sent from the init's report
        self.helpers: set[int] = set()
        self.clone_failures = 0  # spares the kernel refused to clone (logged; each is forked again)
        self.sel = selectors.DefaultSelector()
        # controller ("pids", "memory") -> parent directory; with cgroup v2 both share one.
        self.cgroup_parents: dict[str, str] = dict(config.get("cgroup_parents") or {})
        self.scratch_root: str | None = config.get("scratch_root")
        self.cgroups: dict[int, dict[str, str]] = {}  # run pid -> its cgroup directories
        self.spare_count = 0
        self.doomed_cgroups: set[str] = set()  # cgroups of finished runs, removed once empty
        self.keep_until: dict[str, float] = {}  # doomed memory cgroup -> when it may be removed
        self.grace_swept_at = 0.0  # monotonic s of the last sweep of the cgroups in their grace
        self.found_empty: set[str] = set()  # doomed memory cgroups in their grace, empty when last read
        self.namespaced = False
        self.isolation_detail = ""
        self.private_dev = bool(config.get("private_dev", True))
        mode = config.get("isolation", "auto")
        if mode in ("auto", "namespaces"):
            reason = _probe_namespaces(self.private_dev)
            self.namespaced = reason is None
            self.isolation_detail = (
                "user, mount, pid, IPC and network namespaces" if reason is None else reason
            )
            if mode == "namespaces" and reason is not None:
                raise SystemExit(f"namespaces unavailable: {reason}")
        else:
            self.isolation_detail = "requested process isolation"
        # How a namespaced spare is made: cloned straight into its namespaces (one fork of the
        # preloaded interpreter less), or, where that probe fails, through a helper that unshares.
        self.clone_refused = (
            "process level"
            if not self.namespaced
            else "clone_spares is off"
            if not config.get("clone_spares", True)
            else _probe_clone(self.private_dev, self.cgroup_parents)
        )
        self.clone_spares = self.clone_refused is None
        # At both levels every run enters a Landlock domain of its own (``_enter_landlock_domain``):
        # its file rules at the process level deny writes beneath the kernel's filesystems, with
        # namespaces they grant writes only where the run's mounts do.
        self.landlock_abi = _landlock_abi() if config.get("landlock", True) else 0
        # Every run gets the seccomp filter of ``seccomp.py`` for its level where the kernel takes it:
        # keyrings and clone3 at both levels; at the process level also AF_UNIX sockets and prlimit
        # and kin on other processes (with namespaces the run's pid namespace keeps those off the
        # host's processes).
        self.process_calls_detail: str | None = _filter().probe(
            "namespaces" if self.namespaced else "process"
        )
        self.process_calls = "open" if self.process_calls_detail else "filtered"
        # Without either, a run can read the environment of every dumpable process of its uid.
        self.readable_credentials: list[dict[str, Any]] = []
        if not self.namespaced and not self.landlock_abi:
            self.readable_credentials = _readable_credentials(list(config.get("credential_names", [])))
        # A namespaced spare holds the copy of the mount table made when it was forked: a file
        # system mounted later (a scope on a disk plugged in since) is not in it. Each change the
        # zygote notices starts a new epoch; a request is served only by a spare of its epoch or a
        # later one (``_take_ready``).
        self.mounts = MountWatch() if self.namespaced else None
        self.mount_epoch = 0

    # -- spares ----------------------------------------------------------------------------

    def spare_path(self) -> str:
        """How spares are made now: ``clone``, ``helper`` (namespaces without the clone) or ``fork``."""
        if not self.namespaced:
            return "fork"
        return "clone" if self.clone_spares and _clone_usable() else "helper"

    def _fork_spare(self, network: bool) -> Spare | None:
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        cgroups: dict[str, str] = {}
        cgroup_fds: dict[str, int] = {}
        if self.cgroup_parents:
            # Made before the fork, so it exists whenever the spare is handed a run; the spare joins
            # it itself before it reads its request, so everything the run forks is counted.
            self.spare_count += 1
            cgroups = {
                controller: os.path.join(parent, f"spare-{self.spare_count}")
                for controller, parent in self.cgroup_parents.items()
            }
            for directory in set(cgroups.values()):
                os.mkdir(directory)
                cgroup_fds[directory] = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        if self.clone_spares and _clone_usable():
            uid, gid = os.geteuid(), os.getegid()  # the child's own ids read 65534 until it maps them
            try:
                pid = _clone_into_namespaces(network)
            except OSError as exc:
                # The kernel refused this one (a user namespace limit reached, memory): the spare is
                # lost like one that died early, never the zygote with every run in flight.
                sys.stderr.write(f"alphaagent zygote: spare not cloned: {exc}\n")
                child_sock.close()
                parent_sock.close()
                for directory in set(cgroups.values()):
                    self.doomed_cgroups.add(directory)
                for fd in cgroup_fds.values():
                    os.close(fd)
                self.clone_failures += 1
                return None
            if pid == 0:
                self._become_spare(child_sock, parent_sock, network, cgroups, cloned=(uid, gid))
            child_sock.close()
            spare = Spare(parent_sock, pid, network, helper_pid=None)
            spare.cgroups, spare.cgroup_fds = cgroups, cgroup_fds
            spare.mount_epoch = self.mount_epoch
            self.pending[parent_sock.fileno()] = spare
            self.sel.register(parent_sock, selectors.EVENT_READ, "spare")
            return spare
        pid = os.fork()
        if pid == 0:
            self._become_spare(child_sock, parent_sock, network, cgroups)
        child_sock.close()
        if self.namespaced:
            spare = Spare(parent_sock, None, network, helper_pid=pid)
            self.helpers.add(pid)
        else:
            spare = Spare(parent_sock, pid, network, helper_pid=None)
        spare.cgroups, spare.cgroup_fds = cgroups, cgroup_fds
        spare.mount_epoch = self.mount_epoch
        self.pending[parent_sock.fileno()] = spare
        self.sel.register(parent_sock, selectors.EVENT_READ, "spare")
        return spare

    def _become_spare(
        self,
        sock: socket.socket,
        parent_sock: socket.socket,
        network: bool,
        cgroups: dict[str, str],
        cloned: tuple[int, int] | None = None,
    ) -> None:
        """In the forked child: become a spare and wait for a request; never returns. ``cloned``:
        the zygote's (uid, gid) when this child was cloned into its namespaces already (it is
        their pid 1)."""
        try:
            parent_sock.close()
            self.ctl.close()
            self.sel.close()
            for spare in self.spares:
                spare.sock.close()
                spare.close_cgroup_fds()
            for spare in self.pending.values():
                spare.sock.close()
                spare.close_cgroup_fds()
            for spare, request in self.handing.values():
                spare.sock.close()
                spare.close_cgroup_fds()
                request.close()
            for request in self.waiting:
                # Other runs' pipes: held here, they would keep those runs' output open after they end.
                request.close()
            for init_sock in self.init_socks.values():
                init_sock.close()
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            if cloned is not None:
                _map_own_ids(*cloned)
            # Joining a cgroup costs ~10 ms (an RCU grace period): spares do it ahead of time.
            _join_cgroups(cgroups)
            if cloned is not None:
                # The zygote's child itself now (no helper between): it dies with the zygote, and
                # its namespace with it, even before its run notices the closed socket (which
                # covers a zygote gone before this line: getppid() reads 0 across the namespace).
                _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
                _prepare_namespace_init(network, self.private_dev)
                _become_namespace_init(sock)  # returns in the forked run process only
            elif self.namespaced:
                _enter_namespaces(network)
                inner = os.fork()
                if inner != 0:
                    sock.send(json.dumps({"pid": inner}).encode())
                    os._exit(0)
                _prepare_namespace_init(network, self.private_dev)
                _become_namespace_init(sock)  # returns in the forked run process only
            else:
                # A spare must not outlive the zygote (pid namespaces give this for free).
                _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
                if self.landlock_abi:
                    _prepare_write_rules()
            warm = _prewarm()
            sock.send(b'{"ready": true}')
            message, fds = _recv(sock)
            if message is None or len(fds) != 4:
                os._exit(0)
            # Before anything else: from here on the run is this process's, and the zygote must not
            # give its request to another spare. The time (CLOCK_MONOTONIC, the same in every
            # process) is when the run starts: the relay of this message to the supervisor through
            # two busy processes is not the code's time.
            sock.send(json.dumps({"took": time.monotonic()}).encode())
            sock.close()
            # Lift the received descriptors clear of 0-3 first, so no dup2 below overwrites another.
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100) for fd in fds]
            message["source"] = _read_code(high[3])
            message["landlock_abi"] = self.landlock_abi
            message["filter_process_calls"] = self.process_calls == "filtered"
            for target, fd in zip((1, 2, STATUS_FD), high, strict=False):
                os.dup2(fd, target, inheritable=target != STATUS_FD)
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            keep = _host_dev_fd if _host_dev_fd is not None else STATUS_FD
            os.closerange(STATUS_FD + 1, keep)
            os.closerange(max(keep, STATUS_FD) + 1, 1 << 16)
            _reopen_stdio()  # over the run's pipes now (the prewarm's were over the zygote's files)
        except BaseException as exc:
            try:
                os.write(2, f"alphaagent zygote: spare failed: {exc}\n".encode())
            finally:
                os._exit(126)
        _child_main(message, self.namespaced, warm)

    def _on_spare_message(self, sock: socket.socket) -> None:
        """Read what a spare not ready yet has said (its pid, ``ready``); a spare that closed its
        socket, or whose init reported its end, died before it was ready and is dropped."""
        spare = self.pending.get(sock.fileno())
        if spare is None or spare.sock is not sock:
            return  # a stale selector event: it is ready, or gone, already
        while True:
            try:
                data = sock.recv(256, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            try:
                said = json.loads(data) if data else None
            except ValueError:
                said = None
            if not isinstance(said, dict) or "wait_status" in said:
                self._drop_spare(spare, "died before it was ready (see the lines above)")
                return
            if "pid" in said:
                spare.pid = int(said["pid"])
            spare.ready = spare.ready or bool(said.get("ready"))
        if spare.ready and spare.pid is not None:
            del self.pending[sock.fileno()]
            self.sel.unregister(sock)
            self.spares.append(spare)

    def _drop_spare(self, spare: Spare, why: str | None = None, *, reaped: bool = False) -> None:
        """Forget ``spare``, kill it (with its namespace) unless it was ``reaped`` already, and doom
        its cgroups; ``why`` is logged.

        Safe to kill: a spare still known here and not reaped keeps its pid (no reuse)."""
        fd = spare.sock.fileno()
        handed = self.handing.get(fd)
        if fd >= 0 and (self.pending.get(fd) is spare or (handed is not None and handed[0] is spare)):
            self.pending.pop(fd, None)
            self.handing.pop(fd, None)
            self.sel.unregister(spare.sock)
        if spare in self.spares:
            self.spares.remove(spare)
        spare.sock.close()
        victims = [p for p in (spare.pid,) if p and not reaped]
        victims += [h for h in (spare.helper_pid,) if h in self.helpers]
        _kill_all(victims)
        spare.close_cgroup_fds()
        self.doomed_cgroups.update(spare.cgroups.values())
        if why:
            sys.stderr.write(f"alphaagent zygote: spare {spare.pid or spare.helper_pid} {why}\n")

    def _take_ready(self, request: Request) -> Spare | None:
        """A ready spare for ``request``: of its network setting, and forked after the last change of
        the mount table noticed before the request arrived. An older spare can serve no later
        request either (their epochs only grow): it is dropped."""
        for spare in list(self.spares):
            if spare.network != request.network:
                continue
            if spare.mount_epoch < request.mount_epoch:
                self._drop_spare(spare)
                continue
            self.spares.remove(spare)
            return spare
        return None

    def _notice_mounts(self) -> None:
        """Start a new mount epoch if the mount table changed since the last look. A spare forked
        after a request arrived always serves it, so a table that changes all the time (containers
        starting on the host, an automounter) delays a request by one spare's preparation at most,
        never starves it."""
        if self.mounts is not None and self.mounts.changed():
            self.mount_epoch += 1

    def _enqueue(self, message: dict[str, Any], fds: list[int]) -> None:
        """A spawn request: acknowledged at once (``queued``), served as soon as a spare is ready."""
        if len(fds) != 4:
            for fd in fds:
                os.close(fd)
            self._send({"event": "spawn_failed", "id": message["id"], "message": "malformed request"})
            return
        request = Request(message, fds, bool(message.get("network")) and self.namespaced)
        self._notice_mounts()
        request.mount_epoch = self.mount_epoch
        self.waiting.append(request)
        self._send({"event": "queued", "id": message["id"]})

    def _cancel(self, run_id: str) -> None:
        """The supervisor gave up waiting: drop the request if it still waits (once a spare has it,
        ``spawned`` is already on its way, and the supervisor ends that run itself)."""
        for request in [r for r in self.waiting if r.run_id == run_id]:
            self.waiting.remove(request)
            request.close()
            self._send({"event": "spawn_failed", "id": run_id, "message": "cancelled while queued"})
        for _spare, request in self.handing.values():
            if request.run_id == run_id:
                request.cancelled = True  # should its spare be lost, the request is not retried

    def _serve_waiting(self) -> None:
        """Hand every waiting request for which a spare is ready to it, oldest first; then fork
        what is missing (``_provision``)."""
        for request in list(self.waiting):
            spare = self._take_ready(request)
            if spare is not None:
                self.waiting.remove(request)
                self._hand_over(request, spare)
        self._provision()

    def _provision(self) -> None:
        """Fork spares: one per waiting request that no spare being prepared will serve, and the
        pool back to its target; at most ``max_preparing`` being prepared at once.

        The target is ``pool_size``, or the most runs in progress at once over the last
        ``DEMAND_MEMORY_S`` if that is more (up to ``max_preparing``): the next step of as many
        conversations then finds its spare ready instead of waiting for one. Forking competes for
        the CPU with the runs (two cores here, one in Lambda): with no request waiting and a spare
        left, the pool is refilled only once no run is active; spares above the target are
        stopped once the zygote is idle."""
        now = time.monotonic()
        demand = len(self.runs) + len(self.handing) + len(self.waiting)
        if demand >= self.demand_peak or now - self.demand_peak_at > DEMAND_MEMORY_S:
            self.demand_peak, self.demand_peak_at = demand, now
        target = max(self.pool_size, min(self.demand_peak, self.max_preparing))
        refill = not self.runs or not self.spares
        for network in (False, True):
            waiting = sum(r.network == network for r in self.waiting)
            # A spare of an older mount epoch may serve no waiting request: it is not counted.
            current = [s for s in self.spares if s.mount_epoch == self.mount_epoch]
            preparing = sum(
                s.network == network and s.mount_epoch == self.mount_epoch for s in self.pending.values()
            )
            ready = sum(s.network == network for s in current)
            pool = target if not network and refill else 0
            need = waiting + pool - preparing - ready
            # A few forks per turn of the loop, so requests are acknowledged between them.
            forks = FORKS_PER_TURN
            while need > 0 and forks > 0 and len(self.pending) < self.max_preparing:
                self._fork_spare(network)
                need -= 1
                forks -= 1
        if not self.runs and not self.waiting and not self.handing and len(self.spares) > target:
            extra = [s for s in self.spares if s.network] + [s for s in self.spares if not s.network]
            for spare in extra[: len(self.spares) - target]:
                self._drop_spare(spare)

    def _hand_over(self, request: Request, spare: Spare) -> None:
        """Set the spare's cgroup limits and send it the request; it is the run's once it says
        ``took`` (``_on_took``). A spare that cannot be handed it is dropped and the request waits
        for another one."""
        assert spare.pid is not None
        message = request.message
        try:
            cgroups = spare.cgroups
            intruder = _cgroup_intruded(spare.pid, spare.cgroup_fds)
            if intruder:
                self._drop_spare(spare, f"refused for run {request.run_id}: {intruder}")
                self._retry(request, intruder)
                return
            if "pids" in cgroups:
                _write_at(spare.cgroup_fds[cgroups["pids"]], "pids.max", str(message["max_processes"]))
            request.memory_cgroup = "memory" in cgroups and _limit_memory(
                spare.cgroup_fds[cgroups["memory"]], message.get("memory_bytes")
            )
            spare.sock.sendmsg(
                [json.dumps(message["request"]).encode()],
                [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", request.fds).tobytes())],
            )
        except OSError as exc:
            self._drop_spare(spare, f"could not be handed run {request.run_id}: {exc}")
            self._retry(request, f"{type(exc).__name__}: {exc}")
            return
        spare.since = time.monotonic()
        self.handing[spare.sock.fileno()] = (spare, request)
        self.sel.register(spare.sock, selectors.EVENT_READ, "handing")

    def _on_took(self, sock: socket.socket) -> None:
        """A spare handed a request answered: ``took`` makes it the run (``spawned`` goes to the
        supervisor); anything else (its end, its init's report) means it died first."""
        entry = self.handing.get(sock.fileno())
        if entry is None or entry[0].sock is not sock:
            return
        spare, request = entry
        try:
            data = sock.recv(256, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        try:
            took = json.loads(data)["took"] if data else None
        except (ValueError, KeyError, TypeError):
            took = None  # its init's report: the spare ended before it took the request
        if not isinstance(took, float):
            self._drop_spare(spare, f"died before it took run {request.run_id}")
            self._retry(request, "the spare died before it took the run")
            return
        del self.handing[sock.fileno()]
        self.sel.unregister(sock)
        assert spare.pid is not None
        request.close()  # the spare has its own copies now
        spare.close_cgroup_fds()
        cgroups = spare.cgroups
        if cgroups:
            self.cgroups[spare.pid] = cgroups
        if self.namespaced:
            self.init_socks[spare.pid] = spare.sock  # the init's wait-status report comes here
            self.sel.register(spare.sock, selectors.EVENT_READ, ("init", spare.pid))
        else:
            spare.sock.close()
        self.runs[spare.pid] = request.run_id
        self._send(
            {
                "event": "spawned",
                "id": request.run_id,
                "pid": spare.pid,
                "cgroup": cgroups.get("pids"),
                "memory_cgroup": cgroups["memory"] if request.memory_cgroup else None,
                "started_at": took,
            }
        )

    def _retry(self, request: Request, why: str) -> None:
        """Put a request whose spare was lost back at the head of the queue, or fail its run (and
        only its run) once ``MAX_HAND_OVER_ATTEMPTS`` spares were lost for it."""
        request.attempts += 1
        if request.attempts < MAX_HAND_OVER_ATTEMPTS and not request.cancelled:
            self.waiting.insert(0, request)
            return
        request.close()
        self._send(
            {
                "event": "spawn_failed",
                "id": request.run_id,
                "message": f"{request.attempts} spares were lost before one could start the run"
                f" (last: {why}); see zygote.log",
            }
        )

    def _expire_slow_spares(self) -> None:
        """Kill spares not ready ``spare_timeout_s`` after their fork, or silent that long after
        being handed a request (stopped, wedged): each is replaced, its request handed to another."""
        now = time.monotonic()
        for spare in [s for s in self.pending.values() if now - s.since > self.spare_timeout_s]:
            self._drop_spare(
                spare, f"not ready {now - spare.since:.1f} s after its fork (spare_timeout_s): killed"
            )
        for spare, request in [e for e in self.handing.values() if now - e[0].since > self.spare_timeout_s]:
            try:
                answered = bool(spare.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
            except OSError:
                answered = False
            if answered:
                self._on_took(spare.sock)  # it did answer, after the last select
                continue
            self._drop_spare(
                spare,
                f"did not take run {request.run_id} within {self.spare_timeout_s:g} s"
                " (spare_timeout_s): killed",
            )
            self._retry(request, f"the spare did not take the run within {self.spare_timeout_s:g} s")

    def _sweep_uid(self, run_id: str) -> None:
        """Exclusive mode: kill every process of our uid that is not us, an ancestor or a spare.

        Meant for a uid that belongs to the sandbox alone (Lambda's sbx_user). As root the sweep
        would kill the host, so it is refused; a pid namespace or cgroup does the job there.
        """
        uid = os.getuid()
        if uid == 0:
            self._send({"event": "swept", "id": run_id, "killed": 0, "refused": "uid 0"})
            return
        keep = {os.getpid()} | self._spare_pids() | self.helpers
        pid = os.getpid()
        while pid > 1:
            pid = _parent_of(pid)
            keep.add(pid)
        killed = 0
        for _ in range(50):
            victims = []
            for name in os.listdir("/proc"):
                if name.isdigit() and int(name) not in keep:
                    try:
                        if os.stat(f"/proc/{name}").st_uid == uid:
                            victims.append(int(name))
                    except OSError:
                        continue
            if not victims:
                break
            killed += len(victims)
            _kill_all(victims)
            self._reap()
            time.sleep(0.005)
        self._send({"event": "swept", "id": run_id, "killed": killed})

    def _send(self, message: dict[str, Any]) -> None:
        try:
            self.ctl.send(json.dumps(message).encode())
        except OSError:
            self._shutdown()

    # -- children --------------------------------------------------------------------------

    def _reap(self) -> None:
        for spare, _request in list(self.handing.values()):
            # A run may take its request, run and exit between two selects: its ``took`` is read
            # before its exit, or the exit would look like a spare dying before it took the run.
            self._on_took(spare.sock)
        reaped_run = False
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            self.helpers.discard(pid)
            run_id = self.runs.pop(pid, None)
            run_cgroups = self.cgroups.pop(pid, {})
            # Read before the cgroup is removed: the kernel's count of processes it killed at the limit.
            oom_kills = _oom_kills(run_cgroups["memory"]) if "memory" in run_cgroups else 0
            refused_forks = _refused_forks(run_cgroups["pids"]) if "pids" in run_cgroups else 0
            self.doomed_cgroups.update(run_cgroups.values())
            if "memory" in run_cgroups:
                # The supervisor reads the cgroup's oom_kill count once the run's pipes close, which
                # may be after this reap: the directory stays a while (its members are killed now).
                self.keep_until[run_cgroups["memory"]] = time.monotonic() + MEMORY_CGROUP_GRACE_S
            if run_id is not None:
                reaped_run = True
                if pid in self.init_socks:
                    self._on_init_report(pid)  # not read yet: it is read now, or it never came
                if pid not in self.reported:
                    # The run's orphans die before its exit is told: the supervisor reads the scope's
                    # tree as final once it knows the run ended (a pid namespace's init does this
                    # itself before its report).
                    self._kill_strays()
                    self._send(
                        {
                            "event": "exited",
                            "id": run_id,
                            "pid": pid,
                            "exit_code": os.waitstatus_to_exitcode(status),
                            "maxrss_kb": usage.ru_maxrss,
                            "cpu_s": usage.ru_utime + usage.ru_stime,
                            "oom_kills": oom_kills,
                            "refused_forks": refused_forks,
                        }
                    )
                self.reported.discard(pid)
            else:
                for spare in [s for s in self._all_spares() if s.pid == pid]:
                    handed = next((r for sp, r in self.handing.values() if sp is spare), None)
                    self._drop_spare(
                        spare,
                        "exited" if handed is None else f"exited before it took run {handed.run_id}",
                        reaped=True,
                    )
                    if handed is not None:
                        self._retry(handed, "the spare exited before it took the run")
        if reaped_run:
            self._kill_strays()
        self._remove_doomed_cgroups()

    def _on_init_report(self, pid: int) -> None:
        """A namespaced run's init sent the run's wait status (or closed its socket): tell the
        supervisor now, before the namespace is torn down; ``_reap`` then sends nothing more."""
        init_sock = self.init_socks.pop(pid)
        self.sel.unregister(init_sock)
        report = _read_init_report(init_sock)
        run_id = self.runs.get(pid)
        if report is None or run_id is None:
            return
        self.reported.add(pid)
        cgroups = self.cgroups.get(pid, {})
        counts = {
            **({"oom_kills": _oom_kills(cgroups["memory"])} if "memory" in cgroups else {}),
            **({"refused_forks": _refused_forks(cgroups["pids"])} if "pids" in cgroups else {}),
        }
        self._send({"event": "exited", "id": run_id, "pid": pid, **report, **counts})

    def _remove_doomed_cgroups(self, force: bool = False) -> None:
        """Kill what is left in finished runs' cgroups, and remove those that are empty (a run's
        memory cgroup only ``MEMORY_CGROUP_GRACE_S`` after the run, unless ``force``). A memory
        cgroup in its grace once found empty is swept again at most every ``GRACE_SWEEP_S``, the
        idle loop's period: the loop comes here after every message too, and with a run every
        ~0.1 s some 50 empty cgroups in their grace were each opened and read several times per
        run (half the zygote's opens). One with members is swept on every pass, as before."""
        now = time.monotonic()
        sweep_grace = force or now - self.grace_swept_at >= GRACE_SWEEP_S
        if sweep_grace:
            self.grace_swept_at = now
        for path in list(self.doomed_cgroups):
            in_grace = not force and self.keep_until.get(path, 0) > now
            if in_grace and not sweep_grace and path in self.found_empty:
                continue
            try:
                with open(os.path.join(path, "cgroup.procs")) as fh:
                    members = [int(p) for p in fh.read().split()]
                _kill_all(members)
                if in_grace:
                    if members:
                        self.found_empty.discard(path)
                    else:
                        self.found_empty.add(path)
                    continue
                os.rmdir(path)
                self.doomed_cgroups.discard(path)
                self.keep_until.pop(path, None)
                self.found_empty.discard(path)
            except FileNotFoundError:
                self.doomed_cgroups.discard(path)
                self.found_empty.discard(path)
            except OSError:
                continue  # still has members that are being killed; retried on the next wake-up

    def _kill_strays(self) -> None:
        """Orphans of finished runs are reparented to us (a subreaper): kill them and their trees.

        Our children are listed first, the spares' pids read after: a namespaced spare becomes our
        child only when its helper exits, which it does after sending the spare's pid. Read in the
        other order, a helper finishing in between made a fresh spare look like a stray: it was
        killed, then (its pid read a moment later) handed a run, which ended "killed by SIGKILL"
        with no reason (the flake of issue 11)."""
        children = _children(os.getpid())
        for spare in list(self.pending.values()):
            self._on_spare_message(spare.sock)
        known = set(self.runs) | self._spare_pids() | self.helpers
        for child in children:
            if child not in known:
                _kill_all([child, *_descendants(child)])

    def _all_spares(self) -> list[Spare]:
        return [*self.spares, *self.pending.values(), *(spare for spare, _ in self.handing.values())]

    def _spare_pids(self) -> set[int]:
        return {s.pid for s in self._all_spares() if s.pid}

    def _doom_all_cgroups(self) -> None:
        for parent in set(self.cgroup_parents.values()):
            try:
                names = os.listdir(parent)
            except OSError:
                continue
            for name in names:
                path = os.path.join(parent, name)
                if os.path.isdir(path):
                    self.doomed_cgroups.add(path)

    def _shutdown(self) -> None:
        """The supervisor is gone (or asked us to stop): kill every run and spare, remove their
        cgroups and the scratch root, exit. A supervisor that crashed leaves nothing behind."""
        _kill_all(list(self.runs) + list(self._spare_pids()) + list(self.helpers))
        self._kill_strays()
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            try:
                os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if not self.cgroup_parents:
                time.sleep(0.01)
                continue
            self._doom_all_cgroups()
            self._remove_doomed_cgroups(force=True)
            time.sleep(0.01)
        for parent in set(self.cgroup_parents.values()):
            try:
                self._doom_all_cgroups()
                self._remove_doomed_cgroups(force=True)
                os.rmdir(parent)
            except OSError:
                pass
        if self.scratch_root:
            import shutil

            try:
                shutil.rmtree(self.scratch_root, ignore_errors=True)
            except RecursionError:
                pass  # a run nested folders past the recursion limit: the supervisor removes them
        os._exit(0)

    # -- main loop -------------------------------------------------------------------------

    def serve(self, ready: dict[str, Any]) -> None:
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        self.sel.register(self.ctl, selectors.EVENT_READ, "ctl")
        self.sel.register(wake_r, selectors.EVENT_READ, "wake")
        self._provision()
        self._send(ready | {"isolation": "namespaces" if self.namespaced else "process"})
        while True:
            idle_wake = (
                0.05
                if any(p not in self.keep_until for p in self.doomed_cgroups)
                or self.pending
                or self.handing
                or self.waiting
                or len(self.spares) < self.pool_size
                else (GRACE_SWEEP_S if self.doomed_cgroups else None)  # memory cgroups in their grace
            )
            for key, _ in self.sel.select(timeout=idle_wake):
                if key.data == "wake":
                    try:
                        os.read(wake_r, 4096)
                    except BlockingIOError:
                        pass
                    self._reap()
                elif key.data == "spare":
                    self._on_spare_message(key.fileobj)  # type: ignore[arg-type]
                elif key.data == "handing":
                    self._on_took(key.fileobj)  # type: ignore[arg-type]
                elif isinstance(key.data, tuple):  # ("init", run pid)
                    if key.data[1] in self.init_socks:
                        self._on_init_report(key.data[1])
                else:
                    message, fds = _recv(self.ctl)
                    if message is None:
                        self._shutdown()
                    elif message.get("op") == "spawn":
                        self._enqueue(message, fds)
                    elif message.get("op") == "cancel":
                        self._cancel(str(message["id"]))
                    elif message.get("op") == "sweep_uid":
                        self._sweep_uid(message["id"])
            self._expire_slow_spares()
            self._serve_waiting()
            self._remove_doomed_cgroups()


def _read_init_report(init_sock: socket.socket) -> dict[str, Any] | None:
    """``{"exit_code", "maxrss_kb", "cpu_s"}`` of a namespaced run from its init's report (exit code
    negative: killed by that signal); None when the init sent none (it was killed itself: its own
    wait status, from ``_reap``, is then the run's). Closes the socket."""
    try:
        init_sock.setblocking(False)
        report = json.loads(init_sock.recv(256) or b"null")
        code = os.waitstatus_to_exitcode(report["wait_status"])
        return {"exit_code": code, "maxrss_kb": int(report["maxrss_kb"]), "cpu_s": float(report["cpu_s"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    finally:
        init_sock.close()


def _limit_memory(cgroup_fd: int, limit: int | None) -> bool:
    """Set a run's memory cgroup (its directory's descriptor) to ``limit`` bytes, swap included,
    before it starts; True once the limit is in force (v1: ``memory.limit_in_bytes`` and
    ``memory.memsw.limit_in_bytes``; v2: ``memory.max``, ``memory.swap.max`` 0 and
    ``memory.oom.group``, so the whole run dies together)."""
    if not limit:
        return False
    try:
        names = set(os.listdir(cgroup_fd))
        if "memory.max" in names:
            _write_at(cgroup_fd, "memory.max", str(limit))
            for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                if name in names:
                    _write_at(cgroup_fd, name, value)
        else:
            _write_at(cgroup_fd, "memory.limit_in_bytes", str(limit))
            if "memory.memsw.limit_in_bytes" in names:
                _write_at(cgroup_fd, "memory.memsw.limit_in_bytes", str(limit))
    except OSError:
        return False
    return True


def _write_at(directory_fd: int, name: str, text: str) -> None:
    """Write ``text`` to ``name`` in the directory open as ``directory_fd`` (never a link)."""
    fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory_fd)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _cgroup_intruded(pid: int, cgroup_fds: dict[str, int]) -> str | None:
    """Why a spare's cgroups cannot bound its run, or None: each directory the zygote made for it
    must still be at its path (the supervisor and the reaper read it there), hold the spare (its
    ``cgroup.procs``) and nothing but the spare and its children (a namespaced spare is its
    namespace's init and the process that will run the code). A run that renamed them, moved the
    spare, or put a process of its own there (by ``cgroup.procs`` where it can write beneath
    cgroupfs, ``kernel_files`` ``writable``; by ``clone3(CLONE_INTO_CGROUP)`` on a kernel where the
    filter is off) is refused this way: that process would count against the next run's limits and
    be swept with it instead of with its own run."""
    for path, fd in cgroup_fds.items():
        try:
            held, named = os.fstat(fd), os.stat(path, follow_symlinks=False)
            if (held.st_dev, held.st_ino) != (named.st_dev, named.st_ino):
                return f"its cgroup {path} was moved (another directory is there now)"
            procs_fd = os.open("cgroup.procs", os.O_RDONLY | os.O_CLOEXEC, dir_fd=fd)
            with os.fdopen(procs_fd) as fh:
                members = fh.read().split()
        except OSError as exc:
            return f"its cgroup {path}: {exc.strerror}"
        if str(pid) not in members:
            return f"it is no longer in its cgroup {path}"
        for member in members:
            if int(member) != pid and os.path.exists(f"/proc/{member}") and _parent_of(int(member)) != pid:
                return f"process {member} joined its cgroup {path}"
    return None


def _oom_kills(cgroup: str) -> int:
    """Processes the kernel killed in ``cgroup`` at its memory limit (``oom_kill`` of memory.events
    with v2, of memory.oom_control with v1)."""
    for name in ("memory.events", "memory.oom_control"):
        try:
            with open(os.path.join(cgroup, name)) as fh:
                for line in fh:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return 0


def _refused_forks(cgroup: str) -> int:
    """Forks the kernel refused in ``cgroup`` because its ``pids.max`` was reached (``max`` of
    pids.events, cgroup v1 and v2); 0 when it cannot be read.

    Read when the run is reaped, before the cgroup is removed: as root, ``RLIMIT_NPROC`` binds
    nothing (setrlimit(2)), so this count is the only record that the process limit was reached."""
    try:
        with open(os.path.join(cgroup, "pids.events")) as fh:
            for line in fh:
                key, _, value = line.partition(" ")
                if key == "max":
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _parent_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 1


def _warm_up(code: str) -> str | None:
    """Run the environment's warm-up code once, so one-off lazy set-up (pandas' first DataFrame,
    matplotlib's first figure) happens here instead of in every run; None, or the error."""
    if not code:
        return None
    try:
        exec(compile(code, "<warm-up>", "exec"), {"__name__": "__warmup__"})
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _preload(modules: list[str]) -> tuple[list[str], dict[str, str]]:
    loaded, errors = [], {}
    for name in modules:
        try:
            __import__(name)
            if name == "matplotlib":
                import matplotlib

                matplotlib.use("Agg")
                __import__("matplotlib.pyplot")
            loaded.append(name)
        except Exception as exc:
            errors[name] = f"{type(exc).__name__}: {exc}"
    return loaded, errors


def _sibling(name: str) -> types.ModuleType:
    """A stdlib-only module beside this file (``alphaagent/sandbox/{name}.py``), loaded by its path
    under a private name: the zygote imports nothing from ``alphaagent``, and user code importing a
    package of the same name must not get ours."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        f"_alphaagent_{name}", os.path.join(os.path.dirname(_ZYGOTE_FILE), f"{name}.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_STATE: Any = None
_DROPPED_FINDER_CACHES: list[dict[str, Any]] = []  # the zygote's, replaced in a run (see above)
_seccomp: Any = None  # ``seccomp.py``, loaded by the zygote (``_filter``)


def kernel_files(namespaced: bool, landlock: int, process_calls: str) -> str:
    """Whether a run can write beneath /proc, /sys and cgroupfs (and so, as root, leave its pids and
    memory cgroups): ``read_only`` where the run's Landlock domain denies it (its rules at either
    level grant no write there), or with namespaces where the read-only mounts hold, which needs the
    seccomp filter: without it a run makes a user and mount namespace of its own and ``fsmount``s a
    writable cgroup2 (a red-team run wrote ``cgroup.procs`` so with Landlock off); else ``writable``."""
    if landlock or (namespaced and process_calls == "filtered"):
        return "read_only"
    return "writable"


"""``state.py`` (live session state), loaded once by the zygote before it forks (``main``)."""


def _load_state_module() -> Any:
    """``state.py``, importable in the child by its private name: pickle names its reconstructors by
    module. The serialiser is imported here once, so no run pays for it."""
    module = _sibling("state")
    sys.modules[module.__name__] = module
    module.serializer()
    return module


def main() -> None:
    global _STATE, _interpreter_links, _interpreter_folders
    # Not dumpable, so are the spares forked from it: a run of the same uid cannot read or write
    # their memory through /proc/<pid>/mem (the next run would start from what it wrote).
    _prctl(PR_SET_DUMPABLE, 0)
    config = json.loads(sys.argv[1])
    zygote = Zygote(config)
    loaded, errors = _preload(list(config.get("preload", [])))
    try:
        _STATE = _load_state_module()
    except Exception as exc:  # runs then keep no state, and say so (see _SessionState)
        errors["state"] = f"{type(exc).__name__}: {exc}"
    warm_error = _warm_up(config.get("warmup", ""))
    if warm_error:
        errors["warm-up"] = warm_error
    if zygote.namespaced:  # after the preload and warm-up, which may have added module paths
        _interpreter_links = _links_on_the_way((*_interpreter_paths(), sys.executable))
        _interpreter_folders = tuple(sorted({os.path.realpath(p) for p in _interpreter_paths()}))
    _prepare_filters(zygote.namespaced)
    # Objects that exist now are never collected or written again, so forked children keep sharing
    # their pages instead of copying them on the first garbage collection.
    gc.collect()
    gc.freeze()
    ready = {
        "event": "ready",
        "pid": os.getpid(),
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "isolation_detail": zygote.isolation_detail,
        # How spares are made (``clone``: straight into their namespaces; ``helper``: through a
        # helper that unshares, where the clone probe said ``clone_refused``; ``fork``: no namespaces).
        "spares": zygote.spare_path(),
        "clone_refused": zygote.clone_refused
        or (None if _clone_usable() else f"{_thread_count()} threads in the zygote after the preload"),
        "landlock_abi": zygote.landlock_abi,
        "kernel_files": kernel_files(zygote.namespaced, zygote.landlock_abi, zygote.process_calls),
        # Whether the run's seccomp filter is in force (``IsolationReport.process_calls`` says what it
        # refuses at each level).
        "process_calls": zygote.process_calls,
        "process_calls_detail": zygote.process_calls_detail,
        "readable_credentials": zygote.readable_credentials,
        "kernel_landlock_abi": landlock_abi(),
        "preloaded": loaded,
        "preload_errors": errors,
    }
    if config.get("deny_tcp_connect_ports"):
        # Before any spare is forked: every run inherits the restriction (landlock.py says why).
        ready["landlock"] = _sibling("landlock").restrict_tcp_connect(config["deny_tcp_connect_ports"])
    try:
        zygote.serve(ready)
    except Exception as exc:
        sys.stderr.write(f"alphaagent zygote: {type(exc).__name__}: {exc}\n")
        zygote._shutdown()


if __name__ == "__main__":
    main()
