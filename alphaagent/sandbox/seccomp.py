"""A seccomp filter for runs at the ``process`` level: no call that acts on another process's limits,
scheduling or memory, and no kernel keyring.

At the ``process`` level a run shares its uid with the supervisor, the zygote and the shell that
started the CLI. Landlock keeps it from ptracing or signalling them, but has no hook on
``prlimit64`` (a red-team run set ``RLIMIT_FSIZE`` 1 and ``RLIMIT_NOFILE`` 64 on the supervisor
and the user's shell), ``setpriority``, ``sched_setaffinity`` and kin, which the kernel allows
between processes of one uid. Nor on the keyrings: a run read a key from its uid's user keyring
(``keyctl``), which Docker's default seccomp profile blocks too. This filter returns ``EPERM`` for:

- ``prlimit64``, ``sched_setaffinity``, ``sched_setscheduler``, ``sched_setparam``,
  ``sched_setattr``, ``migrate_pages``, ``move_pages`` whose pid argument is not 0 (the caller);
- ``setpriority`` unless ``PRIO_PROCESS`` with who 0, ``ioprio_set`` unless
  ``IOPRIO_WHO_PROCESS`` with who 0;
- ``process_madvise`` (its target is a pidfd, which the filter cannot tell from the caller's own),
  ``keyctl``, ``add_key``, ``request_key``;
- every call of another ABI than the kernel's native one (i386 on x86_64, arm32 on aarch64: their
  numbers differ, so they could step around the filter), and the x32 ABI on x86_64.

Naming oneself by pid rather than 0 is refused too (``os.sched_setaffinity(os.getpid(), ...)``,
``pthread_setaffinity_np``): a classic-BPF filter sees the arguments, not who the caller is.
``resource.setrlimit``, ``os.nice`` and ``os.sched_setaffinity(0, ...)`` pass 0 and keep working.

Stdlib only (the zygote loads it by path). Built for x86_64 and aarch64 (``SYSCALLS``); elsewhere
``program`` is None and the caller reports the calls ``open``. Sources: the kernel's
``Documentation/userspace-api/seccomp_filter.rst``, ``include/uapi/linux/{seccomp,filter,audit}.h``,
``arch/x86/entry/syscalls/syscall_64.tbl`` and ``include/uapi/asm-generic/unistd.h``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform

PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000

# Classic BPF (include/uapi/linux/filter.h): ld word at an absolute offset, jump if equal / if set, return.
BPF_LD_W_ABS = 0x00 | 0x00 | 0x20
BPF_JEQ_K = 0x05 | 0x10 | 0x00
BPF_JSET_K = 0x05 | 0x40 | 0x00
BPF_RET_K = 0x06 | 0x00

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6] (little-endian
# on both architectures here, so an argument's low 32 bits are at 16 + 8 * i).
OFFSET_NR, OFFSET_ARCH = 0, 4


def _arg_low(i: int) -> int:
    return 16 + 8 * i


X32_SYSCALL_BIT = 0x40000000

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
        "keyctl": 250,
        "add_key": 248,
        "request_key": 249,
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
        "keyctl": 219,
        "add_key": 217,
        "request_key": 218,
    },
}
"""Syscall numbers of the filtered calls, per ``platform.machine()``."""

SELF_IN_ARG0 = (
    "prlimit64",
    "sched_setaffinity",
    "sched_setscheduler",
    "sched_setparam",
    "sched_setattr",
    "migrate_pages",
    "move_pages",
)
"""Calls whose first argument is a pid, 0 meaning the caller: allowed only with 0."""
WHICH_AND_WHO = {"setpriority": 0, "ioprio_set": 1}
"""Calls taking (which, who): allowed only for ``which`` == the value (PRIO_PROCESS,
IOPRIO_WHO_PROCESS) and who 0."""
ALWAYS_DENIED = ("process_madvise", "keyctl", "add_key", "request_key")


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


def program(machine: str | None = None) -> list[tuple[int, int, int, int]] | None:
    """The filter for ``machine`` (default: this one) as (code, jt, jf, k) tuples, or None when
    its syscall numbers are not known here."""
    machine = machine or platform.machine()
    numbers = SYSCALLS.get(machine)
    if numbers is None:
        return None
    lines: list[Instruction | str] = [
        (BPF_LD_W_ABS, 0, 0, OFFSET_ARCH),
        (BPF_JEQ_K, 0, "deny", AUDIT_ARCH[machine]),
        (BPF_LD_W_ABS, 0, 0, OFFSET_NR),
    ]
    if machine == "x86_64":
        lines.append((BPF_JSET_K, "deny", 0, X32_SYSCALL_BIT))
    for name in SELF_IN_ARG0:
        lines.append((BPF_JEQ_K, "self_arg0", 0, numbers[name]))
    for name, which in WHICH_AND_WHO.items():
        lines.append((BPF_JEQ_K, f"which_{which}", 0, numbers[name]))
    for name in ALWAYS_DENIED:
        lines.append((BPF_JEQ_K, "deny", 0, numbers[name]))
    lines += [(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW), "self_arg0"]
    lines += [(BPF_LD_W_ABS, 0, 0, _arg_low(0)), (BPF_JEQ_K, "allow", "deny", 0)]
    for which in sorted(set(WHICH_AND_WHO.values())):
        lines += [f"which_{which}", (BPF_LD_W_ABS, 0, 0, _arg_low(0)), (BPF_JEQ_K, 0, "deny", which)]
        lines += [(BPF_LD_W_ABS, 0, 0, _arg_low(1)), (BPF_JEQ_K, "allow", "deny", 0)]
    lines += ["allow", (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW)]
    lines += ["deny", (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.EPERM)]
    return _assemble(lines)


def install() -> None:
    """Install the filter in this thread (and all it will fork or start). Needs ``no_new_privs``
    (or CAP_SYS_ADMIN). Raises OSError when the kernel refuses it, RuntimeError on an unknown arch."""
    code = program()
    if code is None:
        raise RuntimeError(f"seccomp: no syscall numbers for {platform.machine()}")
    filters = (_SockFilter * len(code))(*(_SockFilter(*line) for line in code))
    prog = _SockFprog(len(code), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(prog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_SECCOMP): {os.strerror(err)}")


def probe() -> str | None:
    """Why the filter cannot be in force here, or None: installed in a throwaway child (with
    ``no_new_privs``), ``prlimit`` on its parent must fail with EPERM and on itself must not."""
    if program() is None:
        return f"no syscall numbers for {platform.machine()}"
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        reason = b""
        try:
            os.close(r)
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(38, ctypes.c_ulong(1), ctypes.c_ulong(0), 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
            install()
            import resource

            resource.prlimit(0, resource.RLIMIT_NOFILE)  # itself: allowed
            try:
                resource.prlimit(os.getppid(), resource.RLIMIT_NOFILE)
                reason = b"prlimit on another process still allowed"
            except PermissionError:
                pass
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
