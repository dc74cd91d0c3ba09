"""Landlock (Linux's unprivileged sandboxing LSM) through ``ctypes``: deny a process, and everything it
forks, TCP connections to a few ports. Standard library only, so the zygote (which imports nothing
from ``alphaagent``) loads this file by its path.

Why: on Lambda, code in the execution environment can reach the Runtime API on 127.0.0.1:9001 (the
address is in ``AWS_LAMBDA_RUNTIME_API``, and it is well known). A run could post a forged response
for the current invocation or ask for the next event. Without namespaces (Lambda allows none), the
zygote restricts itself before it forks any child: ``restrict_tcp_connect((9001,))`` makes every
run's ``connect()`` to port 9001 fail with ``EACCES``, whatever the address.

How (kernel ``Documentation/userspace-api/landlock.rst``):

- ``landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)`` answers the ABI version;
  network rules (``LANDLOCK_ACCESS_NET_CONNECT_TCP``) exist from ABI 4 (Linux 6.7).
- A ruleset that *handles* TCP connect denies every port it has no rule for, so the ruleset has one
  ``LANDLOCK_RULE_NET_PORT`` rule allowing each port 1-65535 except the denied ones (port 0 is no
  connectable port). Building it is about 65,000 ``landlock_add_rule`` calls, and enforcing it
  copies them into the domain: a few hundred milliseconds of CPU, paid once per zygote (it is
  inherited by every fork), never per run.
- ``landlock_restrict_self`` needs ``no_new_privs`` (or ``CAP_SYS_ADMIN``); it is set first. It
  cannot be undone by the process or its children; a child may only add restrictions of its own.

Example::

    state = restrict_tcp_connect((9001,))
    state["in_force"]   # True where the kernel has Landlock ABI >= 4
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
from collections.abc import Collection
from typing import Any, Final

NET_ABI: Final = 4
"""The first Landlock ABI with network rules (TCP bind and connect by port; Linux 6.7)."""

_SYSCALLS: Final = {"create_ruleset": 444, "add_rule": 445, "restrict_self": 446}
"""Landlock's system call numbers: the same on every architecture of the generic table Linux 5.13
introduced them in (x86_64 and aarch64 included)."""

_CREATE_RULESET_VERSION: Final = 1 << 0
_ACCESS_NET_CONNECT_TCP: Final = 1 << 1
_RULE_NET_PORT: Final = 2
_PR_SET_NO_NEW_PRIVS: Final = 38
_MAX_PORT: Final = 65535


class LandlockError(OSError):
    """Landlock was available but a ruleset could not be built or enforced (the caller must not run
    untrusted code as if it were restricted)."""


class _RulesetAttr(ctypes.Structure):
    # struct landlock_ruleset_attr, as of ABI 4: handled_access_fs, handled_access_net. The kernel
    # takes the size it is given, so a shorter struct than the running ABI's is valid.
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64)]


class _NetPortAttr(ctypes.Structure):
    # struct landlock_net_port_attr: allowed_access, port.
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


def _libc() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def abi_version() -> int:
    """The kernel's Landlock ABI version; 0 where Landlock is missing (not built, not enabled at boot:
    ``ENOSYS``/``EOPNOTSUPP``) or the machine is not Linux."""
    if platform.system() != "Linux":
        return 0
    libc = _libc()
    call = _SYSCALLS["create_ruleset"]
    version = int(libc.syscall(call, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION))
    return max(version, 0)


def restrict_tcp_connect(denied_ports: Collection[int]) -> dict[str, Any]:
    """Deny this process and its future children TCP ``connect()`` to ``denied_ports`` (every other
    port stays allowed). Returns what is in force, for the run result::

        {"in_force": bool, "abi": int, "denied_tcp_ports": [9001], "detail": "..."}

    ``in_force`` is False, with the reason in ``detail``, where the kernel has no Landlock or an ABI
    below ``NET_ABI`` (nothing is changed then). An empty ``denied_ports`` changes nothing.

    Raises:
        ValueError: a port is not 1-65535.
        LandlockError: the kernel offers network rules but building or enforcing them failed.
    """
    ports = sorted(set(denied_ports))
    if any(not 1 <= port <= _MAX_PORT for port in ports):
        raise ValueError(f"denied_ports: {ports} must be TCP ports 1-65535")
    abi = abi_version()
    state: dict[str, Any] = {"in_force": False, "abi": abi, "denied_tcp_ports": ports}
    if not ports:
        return state | {"detail": "no port to deny"}
    if abi < NET_ABI:
        reason = "Landlock is not available" if abi == 0 else f"Landlock ABI {abi} has no network rules"
        return state | {"detail": f"{reason} (ABI {NET_ABI}, Linux 6.7, needed): TCP connect not restricted"}
    libc = _libc()
    attr = _RulesetAttr(handled_access_fs=0, handled_access_net=_ACCESS_NET_CONNECT_TCP)
    ruleset = int(libc.syscall(_SYSCALLS["create_ruleset"], ctypes.byref(attr), ctypes.sizeof(attr), 0))
    if ruleset < 0:
        raise _error("landlock_create_ruleset")
    try:
        rule = _NetPortAttr(allowed_access=_ACCESS_NET_CONNECT_TCP, port=0)
        denied = set(ports)
        for port in range(1, _MAX_PORT + 1):
            if port in denied:
                continue
            rule.port = port
            if libc.syscall(_SYSCALLS["add_rule"], ruleset, _RULE_NET_PORT, ctypes.byref(rule), 0) != 0:
                raise _error(f"landlock_add_rule (port {port})")
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise _error("prctl(PR_SET_NO_NEW_PRIVS)")
        if libc.syscall(_SYSCALLS["restrict_self"], ruleset, 0) != 0:
            raise _error("landlock_restrict_self")
    finally:
        os.close(ruleset)
    listed = ", ".join(str(port) for port in ports)
    return state | {"in_force": True, "detail": f"TCP connect to port {listed} denied (Landlock ABI {abi})"}


def _error(call: str) -> LandlockError:
    code = ctypes.get_errno() or errno.EPERM
    return LandlockError(code, f"{call} failed: {os.strerror(code)}")
