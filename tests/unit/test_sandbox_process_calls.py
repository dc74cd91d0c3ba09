"""A run cannot change another process's limits or scheduling, nor read the kernel keyrings, at
either level; ordinary code that sets its own limits, niceness and affinity keeps working.

Found by a red-team review: at the ``process`` level a run of the supervisor's uid set
``RLIMIT_FSIZE`` 1 and ``RLIMIT_NOFILE`` 64 on the supervisor and the user's shell with ``prlimit``
(Landlock has no hook on it), and read a key from the uid's user keyring. The ``namespaces`` level
keeps both out of reach with its pid and user namespaces; the ``process`` level now installs a
seccomp filter in every run (``alphaagent.sandbox.seccomp``).
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import resource
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from assertions import assert_status
from sandboxes import light_at

from alphaagent.models.run import RunLimits, RunResult
from alphaagent.sandbox import seccomp
from alphaagent.sandbox.supervisor import Sandbox


@pytest.fixture(scope="module", params=["namespaces", "process"])
def box(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    with light_at(request.param) as sandbox:
        if sandbox.info.get("process_calls") != "filtered":
            pytest.skip(f"no seccomp filter here: {sandbox.info.get('process_calls_detail')}")
        yield sandbox


def run(box: Sandbox, code: str, scope: Path) -> RunResult:
    return box.run(textwrap.dedent(code), cwd=scope, limits=RunLimits(timeout_s=60))


PRLIMIT_OTHERS = """
import json, os, resource
refused = {}
for name, pid in (("supervisor", SUPERVISOR), ("parent", os.getppid())):
    if pid <= 1:
        continue
    for limit in (resource.RLIMIT_FSIZE, resource.RLIMIT_NOFILE):
        try:
            resource.prlimit(pid, limit, (64, 64))
            refused[f"{name} {limit}"] = False
        except (PermissionError, ProcessLookupError):
            refused[f"{name} {limit}"] = True
for name, call in (
    ("setpriority", lambda: os.setpriority(os.PRIO_PROCESS, SUPERVISOR, 19)),
    ("setpriority user", lambda: os.setpriority(os.PRIO_USER, os.getuid(), 19)),
    ("sched_setaffinity", lambda: os.sched_setaffinity(SUPERVISOR, {0})),
    ("sched_setscheduler", lambda: os.sched_setscheduler(SUPERVISOR, os.SCHED_IDLE, os.sched_param(0))),
):
    try:
        call()
        refused[name] = False
    except (PermissionError, ProcessLookupError):
        refused[name] = True
print(json.dumps(refused))
"""


def test_a_run_cannot_change_the_supervisors_limits_or_scheduling(box: Sandbox, tmp_path: Path) -> None:
    # Given the supervisor's limits, priority and affinity before
    me = os.getpid()
    before = [resource.prlimit(me, r) for r in (resource.RLIMIT_FSIZE, resource.RLIMIT_NOFILE)]
    priority, affinity, policy = (
        os.getpriority(os.PRIO_PROCESS, me),
        os.sched_getaffinity(me),
        os.sched_getscheduler(me),
    )
    # When a run of the same uid sets them on the supervisor and on its own parent (the zygote)
    try:
        result = run(box, PRLIMIT_OTHERS.replace("SUPERVISOR", str(me)), tmp_path)
    finally:
        after = [resource.prlimit(me, r) for r in (resource.RLIMIT_FSIZE, resource.RLIMIT_NOFILE)]
        for limit, value in zip((resource.RLIMIT_FSIZE, resource.RLIMIT_NOFILE), before, strict=True):
            resource.prlimit(me, limit, value)  # so a failure here does not break the tests after it
    # Then every call is refused and nothing changed
    assert_status(result, "ok")
    refused = json.loads(result.stdout)
    assert refused and all(refused.values()), refused
    assert after == before
    assert (os.getpriority(os.PRIO_PROCESS, me), os.sched_getaffinity(me), os.sched_getscheduler(me)) == (
        priority,
        affinity,
        policy,
    )
    assert result.isolation.process_calls == "filtered"


KEY_SPEC_USER_KEYRING = -4
SEARCH_KEY = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
kid = libc.syscall(KEYCTL, 10, -4, b"user", b"alphaagent-test-secret", 0)  # KEYCTL_SEARCH
print(kid, ctypes.get_errno())
"""


def test_a_run_cannot_read_its_uids_keyring(box: Sandbox, tmp_path: Path) -> None:
    # Given a key in the supervisor uid's user keyring
    numbers = seccomp.SYSCALLS[platform.machine()]
    libc = ctypes.CDLL(None, use_errno=True)
    key = libc.syscall(
        numbers["add_key"], b"user", b"alphaagent-test-secret", b"secret", 6, KEY_SPEC_USER_KEYRING
    )
    if key < 0:
        pytest.skip(f"no keyrings here: {os.strerror(ctypes.get_errno())}")
    try:
        # When a run searches that keyring for it
        result = run(box, SEARCH_KEY.replace("KEYCTL", str(numbers["keyctl"])), tmp_path)
        # Then it is not found (refused at the process level, another user namespace's keyring with namespaces)
        assert_status(result, "ok")
        found, _ = map(int, result.stdout.split())
        assert found < 0, result.stdout
    finally:
        libc.syscall(numbers["keyctl"], 9, key, KEY_SPEC_USER_KEYRING)  # KEYCTL_UNLINK


ORDINARY = """
import json, multiprocessing, os, resource, subprocess, sys
import numpy, pandas
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
resource.prlimit(0, resource.RLIMIT_CORE, (0, 0))
os.nice(1)
os.setpriority(os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, 0) + 1)
os.sched_setaffinity(0, os.sched_getaffinity(0))
out = subprocess.run([sys.executable, "-c", "print('child')"], capture_output=True, text=True, check=True).stdout
with multiprocessing.get_context("fork").Pool(2) as pool:
    squares = pool.map(abs, [-1, -2, -3])
frame = pandas.DataFrame({"x": numpy.arange(1000.0)})
print(json.dumps({"nofile": resource.getrlimit(resource.RLIMIT_NOFILE), "child": out.strip(),
                  "squares": squares, "sum": float(frame.x.sum()), "dot": float(numpy.ones(300) @ numpy.ones(300))}))
"""


def test_ordinary_code_that_sets_its_own_limits_and_scheduling_still_works(
    box: Sandbox, tmp_path: Path
) -> None:
    # When a run sets its own limits, niceness and affinity, starts a subprocess and a pool, uses numpy
    result = run(box, ORDINARY, tmp_path)
    # Then all of it works
    assert_status(result, "ok")
    assert json.loads(result.stdout) == {
        "nofile": [256, 256],
        "child": "child",
        "squares": [1, 2, 3],
        "sum": 499500.0,
        "dot": 300.0,
    }


@pytest.mark.parametrize("machine", sorted(seccomp.SYSCALLS))
def test_the_filter_assembles_for_each_known_architecture(machine: str) -> None:
    code = seccomp.program(machine)
    assert code and code[-1] == (seccomp.BPF_RET_K, 0, 0, seccomp.SECCOMP_RET_ERRNO | 1)
    assert seccomp.program("sparc64") is None


def test_on_an_unknown_architecture_the_filter_is_reported_open_not_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a machine whose syscall numbers the filter does not know
    monkeypatch.setattr(platform, "machine", lambda: "sparc64")
    # Then the probe says why it cannot hold (the zygote then reports process_calls "open"), and
    # installing it is refused rather than loading a filter built for another architecture
    assert seccomp.probe() == "no syscall numbers for sparc64"
    with pytest.raises(RuntimeError, match="sparc64"):
        seccomp.install()


TAKING_CALLS = {
    "x86_64": {
        "ptrace": 101,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "pidfd_getfd": 438,
        "perf_event_open": 298,
        "kcmp": 312,
    },
    "aarch64": {
        "ptrace": 117,
        "process_vm_readv": 270,
        "process_vm_writev": 271,
        "pidfd_getfd": 438,
        "perf_event_open": 241,
        "kcmp": 272,
    },
}
"""The kernel's numbers of the calls that take another process (its unistd tables), the test's own."""

TAKE_ANOTHER_PROCESS = """
import ctypes, errno, json, os, struct
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
PTRACE_TRACEME, PTRACE_DETACH, PTRACE_ATTACH, PTRACE_SEIZE = 0, 17, 16, 0x4206


def call(*args):
    done = libc.syscall(*(ctypes.c_long(a) for a in args))
    return "ok" if done >= 0 else errno.errorcode[ctypes.get_errno()]


class Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


answers = {}
for name, request in (("attach", PTRACE_ATTACH), ("seize", PTRACE_SEIZE)):
    answers[name] = call(NR["ptrace"], request, TARGET, 0, 0)
    if answers[name] == "ok":
        call(NR["ptrace"], PTRACE_DETACH, TARGET, 0, 0)
mine = ctypes.create_string_buffer(8)
local, remote = Iovec(ctypes.addressof(mine), 8), Iovec(ctypes.addressof(mine), 8)
for name in ("process_vm_readv", "process_vm_writev"):
    # Its own buffer's address: unmapped in the target (EFAULT) or, by chance, read or written
    answers[name] = call(NR[name], TARGET, ctypes.addressof(local), 1, ctypes.addressof(remote), 1, 0)
pidfd = os.pidfd_open(TARGET)
answers["pidfd_getfd"] = call(NR["pidfd_getfd"], pidfd, 0, 0)
# A software clock sampling the target's user space (registers and stack: a read of its memory)
attr = ctypes.create_string_buffer(128)
struct.pack_into("<IIQQQQQ", attr, 0, 1, 128, 0, 0, 0, 0, 1 | 1 << 5 | 1 << 6)
answers["perf_event_open"] = call(NR["perf_event_open"], ctypes.addressof(attr), TARGET, -1, -1, 0)
answers["kcmp"] = call(NR["kcmp"], TARGET, os.getpid(), 0, 0, 0)  # KCMP_FILE of fd 0
# A debugger that starts its program as a child (gdb prog): the child asks to be traced
child = os.fork()
if child == 0:
    os._exit(0 if call(NR["ptrace"], PTRACE_TRACEME, 0, 0, 0) == "ok" else 1)
answers["traceme"] = "ok" if os.waitpid(child, 0)[1] == 0 else "refused"
print(json.dumps(answers))
"""


def _without_capabilities() -> None:
    # A root run has no capabilities, and the kernel lets a tracer take only a process whose
    # capabilities it has all of: the outside process gets none either, as a user's shell has none
    # (PR_CAPBSET_DROP of every capability; a non-root test has none to drop).
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    for capability in range(64):
        prctl(24, capability, 0, 0, 0)  # PR_CAPBSET_DROP


def test_without_landlock_a_process_level_run_cannot_take_over_a_process_outside_it(tmp_path: Path) -> None:
    # Given a process-level sandbox where Landlock is not in force (an old kernel, Lambda's, or
    # landlock=False), and a dumpable process of the same uid outside it (the user's shell)
    numbers = TAKING_CALLS.get(platform.machine())
    if numbers is None:
        pytest.skip(f"no syscall numbers for {platform.machine()} here")
    target = subprocess.Popen(["sleep", "120"], preexec_fn=_without_capabilities)
    try:
        with light_at("process", landlock=False) as sandbox:
            if sandbox.info.get("process_calls") != "filtered":
                pytest.skip(f"no seccomp filter here: {sandbox.info.get('process_calls_detail')}")
            # When a run attaches to it, reads or writes its memory and takes its descriptors
            code = f"NR = {numbers!r}\nTARGET = {target.pid}\n" + TAKE_ANOTHER_PROCESS
            result = run(sandbox, code, tmp_path)
        # Then every way in is refused (a red-team run attached to the shell that started the
        # supervisor and made it unshare a user namespace, outside the filter), the process is
        # untouched, and a child that asks its parent to trace it still may
        assert_status(result, "ok")
        answers = json.loads(result.stdout)
        assert answers == {
            "attach": "EPERM",
            "seize": "EPERM",
            "process_vm_readv": "EPERM",
            "process_vm_writev": "EPERM",
            "pidfd_getfd": "EPERM",
            "perf_event_open": "EPERM",
            "kcmp": "EPERM",
            "traceme": "ok",
        }, answers
        assert target.poll() is None
    finally:
        target.kill()
        target.wait()
