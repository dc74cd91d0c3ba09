"""The seccomp filter of every run: no call that acts on another process's limits, scheduling or
memory, no kernel keyring, no cgroup chosen at fork, no socket family a run does not need, and
(where the run must reach no host unix socket) no ``AF_UNIX`` socket.

At the ``process`` level a run shares its uid with the supervisor, the zygote and the shell that
started the CLI. Landlock keeps it from ptracing or signalling them, but has no hook on
``prlimit64`` (a red-team run set ``RLIMIT_FSIZE`` 1 and ``RLIMIT_NOFILE`` 64 on the supervisor
and the user's shell), ``setpriority``, ``sched_setaffinity`` and kin, which the kernel allows
between processes of one uid; nor on connecting to a unix socket file (Landlock's
``LANDLOCK_ACCESS_FS_RESOLVE_UNIX`` came after ABI 7, the ABI of Linux 6.18): a red-team run handed
a command to the uid's tmux server through ``/tmp/tmux-UID/default``, and the command ran outside
the run's Landlock domain, this filter and the sweep, and read the environment of the shell that
started the sandbox. Any same-uid server on a socket file does that (tmux, screen, D-Bus and
``systemd --user``, an ssh ControlMaster, an editor's server). Nor on the keyrings: a run read a
key from its uid's user keyring (``keyctl``), and at the ``namespaces`` level read, overwrote and
added keys in the supervisor's session keyring, which a user namespace does not separate.
Docker's default seccomp profile blocks the keyring calls too.

``program(level, unix_sockets)`` refuses, at every level:

- ``keyctl``, ``add_key``, ``request_key`` (``EPERM``);
- ``clone3`` (``ENOSYS``, so glibc falls back to ``clone``, which threads, ``fork`` and
  ``posix_spawn`` then use): its ``CLONE_INTO_CGROUP`` puts the child in any cgroup v2 folder
  whose ``cgroup.procs`` the uid may write, a check Landlock does not hook and a read-only mount
  does not make (a red-team root run moved a child to the v2 root at both levels), and a classic
  BPF filter cannot read the flags, which ``clone3`` passes in memory;
- ``unshare`` and ``clone`` with any ``CLONE_NEW*`` flag, ``setns``, and every mount call:
  ``mount``, ``umount2``, ``pivot_root`` and the new mount API (``fsopen``, ``fsconfig``,
  ``fsmount``, ``fspick``, ``open_tree``, ``move_mount``, ``mount_setattr``) (``EPERM``, what an
  unprivileged caller gets where unprivileged user namespaces are off). In a user and network
  namespace of its own a red-team run had every capability there: the whole rtnetlink write
  surface (veth, dummy links, tc qdiscs and filters: ``net/sched``, the source of many local root
  exploits) and ``fsmount`` of cgroup2 and tmpfs (a cgroup2 mounted so was writable where Landlock
  was off, past the read-only ``/sys/fs/cgroup``). Plain ``clone`` (threads, ``fork``,
  ``posix_spawn``, ``subprocess``) and ``unshare`` of ``CLONE_FILES``/``CLONE_FS`` still work; a
  program that sandboxes itself with user namespaces (Chromium's sandbox, bubblewrap, ``unshare``)
  does not;
- every call of another ABI than the kernel's native one (i386 on x86_64, arm32 on aarch64: their
  numbers differ, so they could step around the filter), and the x32 ABI on x86_64 (``EPERM``);
- ``socket`` of every family but ``AF_INET``, ``AF_INET6``, ``AF_UNIX`` and ``AF_NETLINK``
  (``EAFNOSUPPORT``, what a kernel without that family answers), netlink sockets of every protocol
  but ``NETLINK_ROUTE`` (``EPROTONOSUPPORT``), and ``socketpair`` of every family but ``AF_UNIX``.
  What Python, pandas, requests, psutil and glibc's resolver use stays: TCP/UDP over IPv4 and IPv6
  (ping sockets too), and route netlink, which ``getifaddrs`` (``socket.if_nameindex``,
  ``psutil.net_if_addrs``) and ``getaddrinfo``'s address sorting read. Gone: ``AF_VSOCK`` (this
  machine, a VM, has it: a way to the hypervisor's host, which a network namespace does not
  separate), ``AF_PACKET``, ``AF_ALG``, ``AF_XDP``, Bluetooth, CAN, TIPC, RDS and the rest of the
  kernel's socket code, and the netlink families of ``ss`` (sock_diag), udev (uevents), audit,
  generic netlink (nl80211, taskstats) and xfrm;
- ``io_uring_setup`` (``EACCES``): its requests (``IORING_OP_SOCKET``, ``IORING_OP_CONNECT``...)
  bypass seccomp;

without ``unix_sockets`` (the ``process`` level always; the ``namespaces`` level with the network
off), with ``EACCES`` as a refused connect gives:

- ``socket(AF_UNIX, ...)`` (pathname and abstract sockets alike), and ``socketpair(AF_UNIX, T)``
  for every type ``T`` but ``SOCK_STREAM`` and ``SOCK_SEQPACKET`` (a datagram socket can
  ``sendto`` any bound address, and the kernel makes a ``SOCK_RAW`` unix socket a datagram one);
  stream and seqpacket ``socketpair`` stay (``multiprocessing`` pipes and pools, asyncio's
  self-pipe);

and at the ``process`` level only (with namespaces the run's pid namespace keeps these off the
host's processes), ``EPERM`` for:

- ``prlimit64``, ``sched_setaffinity``, ``sched_setscheduler``, ``sched_setparam``,
  ``sched_setattr``, ``migrate_pages``, ``move_pages`` whose pid argument is not 0 (the caller);
- ``setpriority`` unless ``PRIO_PROCESS`` with who 0, ``ioprio_set`` unless
  ``IOPRIO_WHO_PROCESS`` with who 0;
- ``process_madvise`` (its target is a pidfd, which the filter cannot tell from the caller's own);
- ``ptrace`` with ``PTRACE_ATTACH`` or ``PTRACE_SEIZE``, ``process_vm_readv``,
  ``process_vm_writev`` and ``pidfd_getfd``: where Landlock is off (an old kernel, Lambda's, or
  ``landlock=False``) nothing else keeps a run from another process of its uid outside the sandbox
  that is dumpable (the user's shell, an editor): a red-team run attached to the shell that started
  the supervisor and made it call ``unshare(CLONE_NEWUSER)``, outside this filter, rlimits and
  Landlock. ``PTRACE_TRACEME`` and every request on a tracee stay, so a debugger that starts its
  program as a child (``gdb prog``) works; one that attaches (``strace -p``, ``gdb -p``, py-spy,
  and ``strace prog``, which seizes its child) does not. A dumpable process's ``/proc/<pid>/mem``
  is a path, which a classic-BPF filter cannot see: without Landlock it stays writable (README);
- ``perf_event_open`` of any pid but 0 (a red-team run sampled another process's registers and user
  stack, and read a secret off it), and ``kcmp`` (which files and memory two processes share).

Naming oneself by pid rather than 0 is refused too (``os.sched_setaffinity(os.getpid(), ...)``,
``pthread_setaffinity_np``): a classic-BPF filter sees the arguments, not who the caller is.
``resource.setrlimit``, ``os.nice`` and ``os.sched_setaffinity(0, ...)`` pass 0 and keep working.

Stdlib only (the zygote loads it by path). Built for x86_64 and aarch64 (``SYSCALLS``); elsewhere
``program`` is None and the caller reports the calls ``open``. Sources: the kernel's
``Documentation/userspace-api/seccomp_filter.rst``, ``include/uapi/linux/{seccomp,filter,audit}.h``,
``arch/x86/entry/syscalls/syscall_64.tbl``, ``include/uapi/asm-generic/unistd.h`` and
``include/uapi/linux/keyctl.h``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import socket

PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000

# Classic BPF (include/uapi/linux/filter.h): ld word at an absolute offset, jump if equal / if set,
# and with a constant, return.
BPF_LD_W_ABS = 0x00 | 0x00 | 0x20
BPF_JEQ_K = 0x05 | 0x10 | 0x00
BPF_JSET_K = 0x05 | 0x40 | 0x00
BPF_AND_K = 0x04 | 0x50 | 0x00
BPF_RET_K = 0x06 | 0x00

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6] (little-endian
# on both architectures here, so an argument's low 32 bits are at 16 + 8 * i).
OFFSET_NR, OFFSET_ARCH = 0, 4


def _arg_low(i: int) -> int:
    return 16 + 8 * i


X32_SYSCALL_BIT = 0x40000000
SOCK_TYPE_MASK = 0xF  # include/linux/net.h: the type's bits below SOCK_NONBLOCK / SOCK_CLOEXEC

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}

SYSCALLS: dict[str, dict[str, int]] = {
    "x86_64": {
        "prlimit64": 302,
        "setpriority": 141,
        "sched_setaffinity": 203,
        "sched_setscheduler": 144,
        "sched_setparam": 142,
        "sched_setattr": 314,
        "ioprio_set": 251,
        "migrate_pages": 256,
        "move_pages": 279,
        "process_madvise": 440,
        "ptrace": 101,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "pidfd_getfd": 438,
        "perf_event_open": 298,
        "kcmp": 312,
        "keyctl": 250,
        "add_key": 248,
        "request_key": 249,
        "clone3": 435,
        "clone": 56,
        "unshare": 272,
        "setns": 308,
        "mount": 165,
        "umount2": 166,
        "pivot_root": 155,
        "open_tree": 428,
        "move_mount": 429,
        "fsopen": 430,
        "fsconfig": 431,
        "fsmount": 432,
        "fspick": 433,
        "mount_setattr": 442,
        "socket": 41,
        "socketpair": 53,
        "io_uring_setup": 425,
    },
    "aarch64": {
        "prlimit64": 261,
        "setpriority": 140,
        "sched_setaffinity": 122,
        "sched_setscheduler": 119,
        "sched_setparam": 118,
        "sched_setattr": 274,
        "ioprio_set": 30,
        "migrate_pages": 238,
        "move_pages": 239,
        "process_madvise": 440,
        "ptrace": 117,
        "process_vm_readv": 270,
        "process_vm_writev": 271,
        "pidfd_getfd": 438,
        "perf_event_open": 241,
        "kcmp": 272,
        "keyctl": 219,
        "add_key": 217,
        "request_key": 218,
        "clone3": 435,
        "clone": 220,
        "unshare": 97,
        "setns": 268,
        "mount": 40,
        "umount2": 39,
        "pivot_root": 41,
        "open_tree": 428,
        "move_mount": 429,
        "fsopen": 430,
        "fsconfig": 431,
        "fsmount": 432,
        "fspick": 433,
        "mount_setattr": 442,
        "socket": 198,
        "socketpair": 199,
        "io_uring_setup": 425,
    },
}
"""Syscall numbers of the filtered calls, per ``platform.machine()``."""

LEVELS = ("process", "namespaces")
SELF_IN_ARG0 = (
    "prlimit64",
    "sched_setaffinity",
    "sched_setscheduler",
    "sched_setparam",
    "sched_setattr",
    "migrate_pages",
    "move_pages",
)
"""Calls whose first argument is a pid, 0 meaning the caller: allowed only with 0 (``process``)."""
WHICH_AND_WHO = {"setpriority": 0, "ioprio_set": 1}
"""Calls taking (which, who): allowed only for ``which`` == the value (PRIO_PROCESS,
IOPRIO_WHO_PROCESS) and who 0 (``process``)."""
KEYRINGS = ("keyctl", "add_key", "request_key")
"""Refused at every level: a user namespace does not separate the session keyring."""
MOUNTS = (
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
)
"""Refused at every level (``EPERM``): entering another namespace, and every call that makes, moves
or changes a mount (the old API and the new one of Linux 5.2+). Without a user namespace of its own a
run has no capability for them anyway; refused outright so that a namespace a filter bug let through
would still reach no mount."""
CLONE_NEWTIME = 0x00000080  # include/uapi/linux/sched.h
CLONE_NEWUSER = 0x10000000
CLONE_NEW_IN_CLONE = (
    0x00020000  # CLONE_NEWNS
    | 0x02000000  # CLONE_NEWCGROUP
    | 0x04000000  # CLONE_NEWUTS
    | 0x08000000  # CLONE_NEWIPC
    | CLONE_NEWUSER
    | 0x20000000  # CLONE_NEWPID
    | 0x40000000  # CLONE_NEWNET
)
"""The namespace flags ``clone`` takes (its low byte is the exit signal, so ``CLONE_NEWTIME``, 0x80,
is ``unshare``'s and ``clone3``'s only)."""
CLONE_NEW_IN_UNSHARE = CLONE_NEW_IN_CLONE | CLONE_NEWTIME
"""``unshare``'s namespace flags; its other flags (``CLONE_FILES``, ``CLONE_FS``, ``CLONE_SYSVSEM``)
stay allowed."""
PROCESS_ONLY_DENIED = ("process_madvise", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp")
"""Refused at the ``process`` level whatever their arguments (the module's docstring says why)."""
PTRACE_ATTACH = 16  # include/uapi/linux/ptrace.h
PTRACE_SEIZE = 0x4206
PTRACE_TAKING = (PTRACE_ATTACH, PTRACE_SEIZE)
"""The ``ptrace`` requests that take a process the caller did not start as its tracee; refused at
the ``process`` level (``PTRACE_TRACEME`` and requests on a tracee stay)."""
INET_FAMILIES = (socket.AF_INET, socket.AF_INET6)
"""The families a run's ``socket`` may name besides ``AF_UNIX`` (where allowed) and ``AF_NETLINK``
with ``NETLINK_ROUTE``; every other family is refused at every level with ``EAFNOSUPPORT``."""
NETLINK_ROUTE = 0  # include/uapi/linux/netlink.h: the one netlink protocol runs keep (getifaddrs)
NETLINK_SOCK_DIAG = 4


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


Instruction = tuple[int, int | str, int | str, int]
"""(code, jt, jf, k); a jump target may be a label, resolved by ``_assemble``."""


def _assemble(lines: list[Instruction | str]) -> list[tuple[int, int, int, int]]:
    """Resolve labels (the strings among ``lines``) into forward jump offsets."""
    labels: dict[str, int] = {}
    code: list[Instruction] = []
    for line in lines:
        if isinstance(line, str):
            labels[line] = len(code)
        else:
            code.append(line)
    out = []
    for index, (op, jt, jf, k) in enumerate(code):
        offsets = [labels[j] - index - 1 if isinstance(j, str) else j for j in (jt, jf)]
        if any(not 0 <= o <= 255 for o in offsets):
            raise ValueError(f"seccomp: jump out of range at {index}")
        out.append((op, offsets[0], offsets[1], k))
    return out


def program(
    machine: str | None = None, *, level: str = "process", unix_sockets: bool = False
) -> list[tuple[int, int, int, int]] | None:
    """The filter for a run at ``level`` (``process`` or ``namespaces``) on ``machine`` (default:
    this one) as (code, jt, jf, k) tuples, or None when its syscall numbers are not known here.
    ``unix_sockets`` leaves ``AF_UNIX`` sockets allowed (the ``namespaces`` level with the network
    on); the module's docstring lists the rest.
    """
    if level not in LEVELS:
        raise ValueError(f"seccomp: level must be one of {LEVELS}, not {level!r}")
    machine = machine or platform.machine()
    numbers = SYSCALLS.get(machine)
    if numbers is None:
        return None
    process = level == "process"
    lines: list[Instruction | str] = [
        (BPF_LD_W_ABS, 0, 0, OFFSET_ARCH),
        (BPF_JEQ_K, 0, "deny", AUDIT_ARCH[machine]),
        (BPF_LD_W_ABS, 0, 0, OFFSET_NR),
    ]
    if machine == "x86_64":
        lines.append((BPF_JSET_K, "deny", 0, X32_SYSCALL_BIT))
    lines.append((BPF_JEQ_K, "enosys", 0, numbers["clone3"]))
    for name in KEYRINGS + MOUNTS + (PROCESS_ONLY_DENIED if process else ()):
        lines.append((BPF_JEQ_K, "deny", 0, numbers[name]))
    lines.append((BPF_JEQ_K, "clone", 0, numbers["clone"]))
    lines.append((BPF_JEQ_K, "unshare", 0, numbers["unshare"]))
    if process:
        for name in SELF_IN_ARG0:
            lines.append((BPF_JEQ_K, "self_arg0", 0, numbers[name]))
        for name, which in WHICH_AND_WHO.items():
            lines.append((BPF_JEQ_K, f"which_{which}", 0, numbers[name]))
        lines.append((BPF_JEQ_K, "ptrace", 0, numbers["ptrace"]))
        lines.append((BPF_JEQ_K, "self_arg1", 0, numbers["perf_event_open"]))
    lines.append((BPF_JEQ_K, "eacces", 0, numbers["io_uring_setup"]))
    lines.append((BPF_JEQ_K, "socket", 0, numbers["socket"]))
    lines.append((BPF_JEQ_K, "socketpair", 0, numbers["socketpair"]))
    lines.append((BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW))
    if process:
        lines += ["self_arg0", (BPF_LD_W_ABS, 0, 0, _arg_low(0)), (BPF_JEQ_K, "allow", "deny", 0)]
        for which in sorted(set(WHICH_AND_WHO.values())):
            lines += [f"which_{which}", (BPF_LD_W_ABS, 0, 0, _arg_low(0)), (BPF_JEQ_K, 0, "deny", which)]
            lines += [(BPF_LD_W_ABS, 0, 0, _arg_low(1)), (BPF_JEQ_K, "allow", "deny", 0)]
        # perf_event_open(attr, pid, ...): only the caller (pid 0); a sample of another process's
        # registers and user stack is a read of its memory.
        lines += ["self_arg1", (BPF_LD_W_ABS, 0, 0, _arg_low(1)), (BPF_JEQ_K, "allow", "deny", 0)]
        # ptrace(request, pid, ...): the request is an int in the low word of args[0].
        lines += ["ptrace", (BPF_LD_W_ABS, 0, 0, _arg_low(0))]
        lines += [(BPF_JEQ_K, "deny", 0, request) for request in PTRACE_TAKING]
        lines += [(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW)]
    # clone(flags, ...) and unshare(flags): the flags are args[0] on both architectures, an unsigned
    # long whose namespace bits all lie in its low word. Threads, fork, vfork and posix_spawn pass
    # none of them.
    lines += ["clone", (BPF_LD_W_ABS, 0, 0, _arg_low(0)), (BPF_JSET_K, "deny", "allow", CLONE_NEW_IN_CLONE)]
    lines += [
        "unshare",
        (BPF_LD_W_ABS, 0, 0, _arg_low(0)),
        (BPF_JSET_K, "deny", "allow", CLONE_NEW_IN_UNSHARE),
    ]
    # socket(family, type, protocol) and socketpair(family, type, protocol, sv): the low words of
    # args[0], args[1] and args[2] are the family, the type (with its flags, masked off) and the
    # protocol (all three are ints to the kernel).
    unix = "allow" if unix_sockets else "eacces"
    lines += ["socket", (BPF_LD_W_ABS, 0, 0, _arg_low(0))]
    lines += [(BPF_JEQ_K, "allow", 0, family) for family in INET_FAMILIES]
    lines += [(BPF_JEQ_K, unix, 0, socket.AF_UNIX), (BPF_JEQ_K, 0, "eafnosupport", socket.AF_NETLINK)]
    lines += [(BPF_LD_W_ABS, 0, 0, _arg_low(2)), (BPF_JEQ_K, "allow", "eprotonosupport", NETLINK_ROUTE)]
    lines += ["socketpair", (BPF_LD_W_ABS, 0, 0, _arg_low(0)), (BPF_JEQ_K, 0, "eafnosupport", socket.AF_UNIX)]
    if unix_sockets:
        lines += [(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW)]
    else:
        lines += [(BPF_LD_W_ABS, 0, 0, _arg_low(1)), (BPF_AND_K, 0, 0, SOCK_TYPE_MASK)]
        # Only the two connected types pass: the kernel makes a SOCK_RAW (and any type it does not
        # refuse) unix socket a datagram one, which can sendto any bound address (a red team sent a
        # command to a same-uid datagram server with SOCK_RAW when only SOCK_DGRAM was refused).
        lines += [(BPF_JEQ_K, "allow", 0, socket.SOCK_STREAM)]
        lines += [(BPF_JEQ_K, "allow", "eacces", socket.SOCK_SEQPACKET)]
    lines += ["allow", (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW)]
    lines += ["enosys", (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.ENOSYS)]
    lines += ["eacces", (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.EACCES)]
    lines += ["eafnosupport", (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.EAFNOSUPPORT)]
    lines += ["eprotonosupport", (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.EPROTONOSUPPORT)]
    lines += ["deny", (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.EPERM)]
    return _assemble(lines)


_prepared: dict[tuple[str, bool], tuple[_SockFprog, ctypes.Array[_SockFilter]]] = {}
"""(level, unix_sockets) -> the filter ready for ``prctl``, kept by ``prepare`` (with its instruction
array, which the ``sock_fprog`` only points to)."""
_libc: ctypes.CDLL | None = None


def _c_library() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def prepare(level: str = "process", unix_sockets: bool = False) -> None:
    """Build the filter of ``program(level=..., unix_sockets=...)`` once, for every later ``install``
    in this process and the children it forks: the zygote prepares its level's filters before it
    forks spares, so a run installs one without assembling it (~1.2-1.6 ms of each run's CPU, and
    the pages that assembling wrote to, which a forked child would copy). The filter is the same
    either way: only where it is built moves. Raises RuntimeError on an unknown arch."""
    if (level, unix_sockets) in _prepared:
        return
    code = program(level=level, unix_sockets=unix_sockets)
    if code is None:
        raise RuntimeError(f"seccomp: no syscall numbers for {platform.machine()}")
    filters = (_SockFilter * len(code))(*(_SockFilter(*line) for line in code))
    _prepared[level, unix_sockets] = (_SockFprog(len(code), filters), filters)
    _c_library()


def install(level: str = "process", unix_sockets: bool = False) -> None:
    """Install the filter of ``program(level=..., unix_sockets=...)`` in this thread (and all it
    will fork or start), built now unless ``prepare`` built it before. Needs ``no_new_privs`` (or
    CAP_SYS_ADMIN). Raises OSError when the kernel refuses it, RuntimeError on an unknown arch."""
    prepare(level, unix_sockets)
    prog, _filters = _prepared[level, unix_sockets]
    libc = _c_library()
    if libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(prog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_SECCOMP): {os.strerror(err)}")


KEYCTL_JOIN_SESSION_KEYRING = 1  # include/uapi/linux/keyctl.h


def leave_session_keyring() -> int:
    """Join a new anonymous session keyring (``KEYCTL_JOIN_SESSION_KEYRING`` with no name), so the
    keys of the session this process inherited (the supervisor's, the user's login session) are no
    longer its own: not searchable, and not listed in ``/proc/keys`` where only a possessor may view
    them. Called before the filter refuses ``keyctl``. Returns 0, or the errno (ENOSYS without
    keyrings, EDQUOT past the uid's ``kernel/keys/maxkeys``) for the caller to decide."""
    numbers = SYSCALLS.get(platform.machine())
    if numbers is None:
        return errno.ENOSYS
    libc = _c_library()
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(numbers["keyctl"], ctypes.c_long(KEYCTL_JOIN_SESSION_KEYRING), None) < 0:
        return ctypes.get_errno()
    return 0


def probe(level: str = "process") -> str | None:
    """Why the filter of ``level`` cannot be in force here, or None: installed in a throwaway child
    (with ``no_new_privs``), ``keyctl`` and ``unshare(CLONE_NEWUSER)`` must fail with EPERM,
    ``clone3`` with ENOSYS and a
    ``NETLINK_SOCK_DIAG`` socket with EPROTONOSUPPORT; at the
    ``process`` level ``socket(AF_UNIX)`` must fail with EACCES, and ``prlimit`` on its parent with
    EPERM while on itself it works."""
    numbers = SYSCALLS.get(platform.machine())
    if numbers is None:
        return f"no syscall numbers for {platform.machine()}"
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        reason = b""
        try:
            os.close(r)
            libc = ctypes.CDLL(None, use_errno=True)
            libc.syscall.restype = ctypes.c_long
            if libc.prctl(38, ctypes.c_ulong(1), ctypes.c_ulong(0), 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
            install(level)
            answers = {}
            probes = (("keyctl", (0, -3, 0)), ("clone3", (0, 0)), ("unshare", (CLONE_NEWUSER,)))
            for name, args in probes:
                done = libc.syscall(numbers[name], *(ctypes.c_long(a) for a in args))
                answers[name] = ctypes.get_errno() if done < 0 else 0
            try:  # sock_diag, which any process may otherwise open
                socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG).close()
                answers["netlink"] = 0
            except OSError as exc:
                answers["netlink"] = exc.errno or 0
            expected = {
                "keyctl": errno.EPERM,
                "clone3": errno.ENOSYS,
                "unshare": errno.EPERM,
                "netlink": errno.EPROTONOSUPPORT,
            }
            if level == "process":
                import resource

                resource.prlimit(0, resource.RLIMIT_NOFILE)  # itself: allowed
                try:
                    resource.prlimit(os.getppid(), resource.RLIMIT_NOFILE)
                    answers["prlimit64"] = 0
                except PermissionError:
                    answers["prlimit64"] = errno.EPERM
                try:
                    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close()
                    answers["socket"] = 0
                except PermissionError as exc:
                    answers["socket"] = exc.errno or 0
                expected.update(prlimit64=errno.EPERM, socket=errno.EACCES)
            wrong = [
                f"{n} {errno.errorcode.get(answers[n], answers[n])}"
                for n in expected
                if answers[n] != expected[n]
            ]
            if wrong:
                reason = f"still allowed or not refused as meant: {', '.join(wrong)}".encode()
        except BaseException as exc:  # any failure is the answer, reported below
            reason = f"{type(exc).__name__}: {exc}".encode()
        finally:
            os.write(w, reason)
            os._exit(0)
    os.close(w)
    try:
        with os.fdopen(r, "rb") as fh:
            answer = fh.read().decode(errors="replace")
    finally:
        os.waitpid(pid, 0)
    return answer or None
