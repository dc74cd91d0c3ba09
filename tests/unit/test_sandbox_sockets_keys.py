"""A run reaches no unix socket of its uid at the ``process`` level, no keyring of the supervisor at
either level, and cannot fork into a cgroup of its choosing; ordinary concurrent code still works.

Found by a red-team review of main at 7b369f7:

- at the ``process`` level a run handed a command to the uid's tmux server through its socket
  file; the command ran outside the run's Landlock domain, seccomp filter and sweep, read the
  ``AWS_SECRET_ACCESS_KEY`` of the shell that started the sandbox, and outlived the run (any
  same-uid server on a socket file does this: screen, D-Bus, ``systemd --user``, ssh ControlMaster);
- a root run moved a child into another cgroup v2 folder with ``clone3(CLONE_INTO_CGROUP)`` at both
  levels, though the write to ``cgroup.procs`` was refused;
- at the ``namespaces`` level a run read, overwrote and added keys in the supervisor's session
  keyring, and the run's report said ``process_calls: filtered`` while no filter was installed.

The run's seccomp filter (``alphaagent.sandbox.seccomp``) now refuses ``socket(AF_UNIX)`` at the
``process`` level, ``clone3`` and the keyring calls at both, and each run leaves its inherited
session keyring first.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import platform
import secrets
import shutil
import signal
import socket
import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from assertions import assert_status
from sandboxes import light_at

from alphaagent.models.run import RunLimits, RunResult
from alphaagent.sandbox import seccomp, zygote
from alphaagent.sandbox.cgroup import _controller_mounts
from alphaagent.sandbox.supervisor import Sandbox


@pytest.fixture(scope="module", params=["namespaces", "process"])
def box(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    with light_at(request.param) as sandbox:
        if sandbox.info.get("process_calls") != "filtered":
            pytest.skip(f"no seccomp filter here: {sandbox.info.get('process_calls_detail')}")
        yield sandbox


@pytest.fixture(scope="module")
def process_box() -> Iterator[Sandbox]:
    with light_at("process") as sandbox:
        if sandbox.info.get("process_calls") != "filtered":
            pytest.skip(f"no seccomp filter here: {sandbox.info.get('process_calls_detail')}")
        yield sandbox


def run(box: Sandbox, code: str, scope: Path, network: bool = False) -> RunResult:
    return box.run(textwrap.dedent(code), cwd=scope, limits=RunLimits(timeout_s=60), network=network)


# -- unix sockets of the run's uid (process level) -------------------------------------------------

CONNECT = """
import errno, json, socket
answers = {}
for name, path in SOCKETS.items():
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(path)
        answers[name] = "connected"
    except OSError as exc:
        answers[name] = errno.errorcode[exc.errno]
# a socketpair of any type but stream and seqpacket is a datagram socket (the kernel makes SOCK_RAW
# one), which can sendto any bound address
for kind in ("SOCK_DGRAM", "SOCK_RAW", "SOCK_RDM", "SOCK_PACKET"):
    try:
        a, b = socket.socketpair(socket.AF_UNIX, getattr(socket, kind, 10))
        a.sendto(b"x", DGRAM)
        answers[kind + " sendto"] = "sent"
    except OSError as exc:
        answers[kind + " sendto"] = errno.errorcode[exc.errno]
print(json.dumps(answers))
"""


def test_a_process_level_run_reaches_no_unix_socket_of_its_uid(process_box: Sandbox, tmp_path: Path) -> None:
    # Given a listening socket file and an abstract socket of the supervisor's uid, connectable from here
    scope, place = tmp_path / "scope", tmp_path / "sockets"
    scope.mkdir()
    place.mkdir(mode=0o777)
    sockets = {"file": str(place / "server.sock"), "abstract": f"\0alphaagent-test-{secrets.token_hex(4)}"}
    servers = []
    for path in sockets.values():
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        server.listen(4)
        servers.append(server)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.connect(sockets["file"])
        # When a run at the process level connects to each, and sends to the file from a datagram pair
        dgram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        servers.append(dgram)
        dgram.bind(str(place / "dgram.sock"))
        os.chmod(place / "dgram.sock", 0o777)
        dgram.setblocking(False)
        code = f"SOCKETS = {sockets!r}\nDGRAM = {str(place / 'dgram.sock')!r}\n" + CONNECT
        result = run(process_box, code, scope)
        try:
            received: bytes | None = dgram.recv(16)
        except BlockingIOError:
            received = None
    finally:
        for server in servers:
            server.close()
    # Then every attempt is refused as a refused connect is (EACCES), nothing reached the datagram
    # server, and the report says so
    assert_status(result, "ok")
    refused = {f"{kind} sendto": "EACCES" for kind in ("SOCK_DGRAM", "SOCK_RAW", "SOCK_RDM", "SOCK_PACKET")}
    assert json.loads(result.stdout) == {"file": "EACCES", "abstract": "EACCES", **refused}
    assert received is None
    assert (result.isolation.host_unix_sockets, result.isolation.process_calls) == ("blocked", "filtered")


TMUX = """
import subprocess
done = subprocess.run(["tmux", "-S", SOCKET, "new-window", "-d", "touch " + PROOF], capture_output=True, text=True)
print(done.returncode)
"""


def test_a_process_level_run_cannot_hand_a_command_to_its_uids_tmux_server(
    process_box: Sandbox, tmp_path: Path
) -> None:
    # Given a tmux server of the supervisor's uid that takes commands from here
    tmux = shutil.which("tmux")
    if tmux is None:
        pytest.skip("tmux is not installed")
    scope, server = tmp_path / "scope", tmp_path / "tmux.sock"
    scope.mkdir()
    proof, control = tmp_path / "proof", tmp_path / "control"
    subprocess.run([tmux, "-S", str(server), "new-session", "-d", "sleep 60"], check=True, timeout=10)
    try:
        subprocess.run(
            [tmux, "-S", str(server), "new-window", "-d", f"touch {control}"], check=True, timeout=10
        )
        deadline = time.monotonic() + 10
        while not control.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert control.exists(), "the tmux server did not run a command from the host"
        # When a run asks it to run a command (which would run outside the sandbox)
        result = run(process_box, f"SOCKET, PROOF = {str(server)!r}, {str(proof)!r}\n" + TMUX, scope)
        time.sleep(0.5)  # as long as the host's command took, at most, to leave its mark
    finally:
        subprocess.run([tmux, "-S", str(server), "kill-server"], check=False, timeout=10)
    # Then tmux cannot reach its server, and no command ran
    assert_status(result, "ok")
    assert result.stdout.strip() != "0", result.stderr
    assert not proof.exists()


# -- ordinary concurrency, with AF_UNIX sockets and clone3 refused -----------------------------------

CONCURRENCY = """
import asyncio, concurrent.futures, json, multiprocessing, os, subprocess, sys, threading

async def main():
    reader, writer = await asyncio.open_connection(sock=__import__("socket").socketpair()[0])
    writer.close()
    child = await asyncio.create_subprocess_exec(sys.executable, "-c", "print(6 * 7)", stdout=asyncio.subprocess.PIPE)
    out, _ = await child.communicate()
    slow = await asyncio.gather(*(asyncio.sleep(0.01, result=i) for i in range(3)))
    on_thread = await asyncio.get_running_loop().run_in_executor(None, sum, [1, 2, 3])
    return int(out), slow, on_thread

results = []
threads = [threading.Thread(target=results.append, args=(i,)) for i in range(4)]
for t in threads: t.start()
for t in threads: t.join()
with multiprocessing.get_context("fork").Pool(2) as pool:
    squares = pool.map(abs, [-1, -2, -3])
with multiprocessing.get_context("spawn").Pool(1) as pool:
    spawn_pool = pool.map(abs, [-8])
with concurrent.futures.ProcessPoolExecutor(2) as executor:
    negated = list(executor.map(abs, [-4, -5]))
with concurrent.futures.ThreadPoolExecutor(2) as executor:
    doubled = list(executor.map(abs, [-6, -7]))
spawned = os.waitstatus_to_exitcode(os.waitpid(os.posix_spawn("/bin/true", ["true"], {}), 0)[1])
child = subprocess.run([sys.executable, "-c", "print('child')"], capture_output=True, text=True, check=True)
print(json.dumps({"asyncio": asyncio.run(main()), "threads": sorted(results), "pool": squares,
                  "spawn_pool": spawn_pool, "process_pool": negated, "thread_pool": doubled, "posix_spawn": spawned,
                  "subprocess": child.stdout.strip()}))
"""


def test_threads_subprocesses_asyncio_and_process_pools_still_work(box: Sandbox, tmp_path: Path) -> None:
    # When a run uses asyncio (its self-pipe is a socketpair; a subprocess; a thread), threads (glibc
    # tries clone3 first), a multiprocessing pool, a process pool, posix_spawn and subprocess
    result = run(box, CONCURRENCY, tmp_path)
    # Then all of it works
    assert_status(result, "ok")
    assert json.loads(result.stdout) == {
        "asyncio": [42, [0, 1, 2], 6],
        "threads": [0, 1, 2, 3],
        "pool": [1, 2, 3],
        "spawn_pool": [8],
        "process_pool": [4, 5],
        "thread_pool": [6, 7],
        "posix_spawn": 0,
        "subprocess": "child",
    }


# -- namespaces and mounts of the run's own --------------------------------------------------------

NAMESPACES = """
import ctypes, errno, json, os, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(name, *args):
    done = libc.syscall(NR[name], *(ctypes.c_long(a) if isinstance(a, int) else a for a in args))
    return done if done >= 0 else errno.errorcode[ctypes.get_errno()]
answers = {}
# the red team's way in: a user and network namespace of its own, every capability there
answers["unshare user+net"] = call("unshare", 0x10000000 | 0x40000000)
if answers["unshare user+net"] == 0:  # then the rtnetlink write surface: a dummy link
    import struct
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as nl:
        name = struct.pack("=HH", 8, 3) + b"rt0\\0"
        kind = struct.pack("=HH", 16, 18) + struct.pack("=HH", 10, 1) + b"dummy\\0\\0\\0"
        body = struct.pack("=BxHiII", 0, 0, 0, 0, 0) + name + kind
        nl.send(struct.pack("=LHHLL", 16 + len(body), 16, 0x605, 1, 0) + body)
        answers["new link"] = -struct.unpack("=i", nl.recv(4096)[16:20])[0]
for flag, bit in (("user", 0x10000000), ("net", 0x40000000), ("mount", 0x20000), ("cgroup", 0x02000000),
                  ("pid", 0x20000000), ("ipc", 0x08000000), ("uts", 0x04000000), ("time", 0x80)):
    answers[f"unshare {flag}"] = call("unshare", bit)
pid = call("clone", 0x10000000 | 17, 0, 0, 0, 0)  # CLONE_NEWUSER | SIGCHLD, on a copy of this stack
if pid == 0:
    os._exit(0)
if isinstance(pid, int):
    os.waitpid(pid, 0)
answers["clone user"] = pid if isinstance(pid, str) else "cloned"
fs = call("fsopen", b"cgroup2", 0)
answers["fsopen cgroup2"] = fs if isinstance(fs, str) else "opened"
answers["fspick /"] = call("fspick", -100, b"/", 0)
answers["open_tree clone"] = call("open_tree", -100, b"/tmp", 1 | 0x80000)  # OPEN_TREE_CLONE | CLOEXEC
answers["mount tmpfs"] = call("mount", b"none", b"/tmp", b"tmpfs", 0, None)
answers["umount2 /tmp"] = call("umount2", b"/tmp", 2)  # MNT_DETACH
answers["pivot_root"] = call("pivot_root", b"/tmp", b"/tmp")
answers["setns"] = call("setns", os.open("/proc/self/ns/net", os.O_RDONLY), 0)
answers["move_mount"] = call("move_mount", -1, b"", -100, b"/tmp", 4)
answers["fsconfig"] = call("fsconfig", -1, 6, None, None, 0)
answers["fsmount"] = call("fsmount", -1, 0, 0)
answers["mount_setattr"] = call("mount_setattr", -100, b"/tmp", 0, None, 0)
# what stays: unshare without a namespace flag, threads and fork (clone without one)
answers["unshare files"] = call("unshare", 0x400)
child = os.fork()
if child == 0:
    os._exit(0)
answers["fork"] = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
print(json.dumps(answers))
"""


@pytest.mark.parametrize("network", [False, True], ids=["network off", "network on"])
def test_a_run_can_make_no_namespace_nor_mount_of_its_own(
    box: Sandbox, tmp_path: Path, network: bool
) -> None:
    # When a run tries to make a user (and network, mount, cgroup...) namespace of its own, by
    # unshare and by clone, to enter one, and to mount (cgroup2 by the new mount API, tmpfs by the old)
    numbers = {
        name: seccomp.SYSCALLS[platform.machine()][name] for name in ("unshare", "clone", *seccomp.MOUNTS)
    }
    result = run(box, f"NR = {numbers!r}\n" + NAMESPACES, tmp_path, network=network)
    # Then every one of them is refused with EPERM, and unshare without a namespace flag and fork work
    assert_status(result, "ok")
    answers = json.loads(result.stdout)
    assert answers.pop("unshare files") == 0 and answers.pop("fork") == 0
    assert answers == dict.fromkeys(answers, "EPERM")  # a "new link" entry would be a number


# -- clone3(CLONE_INTO_CGROUP) ---------------------------------------------------------------------

CLONE_INTO_CGROUP = 0x200000000  # include/uapi/linux/sched.h
CLONE3_NR = 435  # one number on every architecture (include/uapi/asm-generic/unistd.h, syscall_64.tbl)
CLONE3 = """
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
class Args(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("flags", "pidfd", "child_tid", "parent_tid", "exit_signal",
                "stack", "stack_size", "tls", "set_tid", "set_tid_size", "cgroup")]
answers = {}
for name, target in TARGETS.items():
    args = Args(exit_signal=17)
    if target:
        args.flags, args.cgroup = CLONE_INTO_CGROUP, os.open(target, os.O_RDONLY | os.O_DIRECTORY)
    pid = libc.syscall(CLONE3, ctypes.byref(args), ctypes.sizeof(args))
    if pid == 0:
        os._exit(0)
    if pid > 0:
        os.waitpid(pid, 0)
        answers[name] = "forked"
    else:
        answers[name] = errno.errorcode[ctypes.get_errno()]
print(json.dumps(answers))
"""


def _cgroup2_mount() -> Path | None:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split()[:1] == ["cgroup2"]:
            return Path(left.split()[4])
    return None


def test_clone3_is_refused_so_no_child_lands_in_a_cgroup_of_the_runs_choosing(
    box: Sandbox, tmp_path: Path
) -> None:
    # Given a cgroup v2 folder the run's uid may write to (as root), where cgroup v2 is mounted
    scope = tmp_path / "scope"
    scope.mkdir()
    v2 = _cgroup2_mount()
    target: Path | None = None
    if v2 is not None and os.geteuid() == 0:
        target = v2 / f"alphaagent-test-{secrets.token_hex(4)}"
        target.mkdir()
    targets = {"plain": "", **({"into_cgroup": str(target)} if target else {})}
    code = f"TARGETS, CLONE3, CLONE_INTO_CGROUP = {targets!r}, {CLONE3_NR}, "
    try:
        # When a run calls clone3, plainly and with CLONE_INTO_CGROUP into that folder
        result = run(box, code + f"{CLONE_INTO_CGROUP}\n" + CLONE3, scope)
        members = (target / "cgroup.procs").read_text().split() if target else []
    finally:
        if target is not None:
            target.rmdir()
    # Then the kernel seems not to have clone3 (glibc falls back to clone), and nothing joined the folder
    assert_status(result, "ok")
    assert json.loads(result.stdout) == dict.fromkeys(targets, "ENOSYS")
    assert members == []


def test_a_spare_whose_cgroup_another_process_joined_is_refused() -> None:
    # Given a spare's pids cgroup (root, a writable pids controller) holding the spare and its child
    parent = _controller_mounts().get("pids")
    if os.geteuid() != 0 or parent is None:
        pytest.skip("needs root and a pids cgroup controller")
    folder = parent / f"alphaagent-test-{secrets.token_hex(4)}"
    folder.mkdir()
    spare = subprocess.Popen(["sh", "-c", "read go; sleep 60 & wait"], stdin=subprocess.PIPE)
    other = subprocess.Popen(["sleep", "60"])
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        (folder / "cgroup.procs").write_text(str(spare.pid))
        assert spare.stdin is not None
        spare.stdin.write(b"go\n")  # its child (sleep) is forked now, in the folder
        spare.stdin.flush()
        deadline = time.monotonic() + 10
        while len((folder / "cgroup.procs").read_text().split()) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len((folder / "cgroup.procs").read_text().split()) == 2
        assert zygote._cgroup_intruded(spare.pid, {str(folder): fd}) is None
        # When a process that is not the spare's joins it
        (folder / "cgroup.procs").write_text(str(other.pid))
        # Then the spare is refused, naming the intruder
        assert zygote._cgroup_intruded(spare.pid, {str(folder): fd}) == (
            f"process {other.pid} joined its cgroup {folder}"
        )
    finally:
        os.close(fd)
        for member in (folder / "cgroup.procs").read_text().split():  # the spare's sleep too
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(member), signal.SIGKILL)
        for process in (spare, other):
            process.kill()
            process.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                folder.rmdir()
                break
            except OSError:
                time.sleep(0.05)


# -- keyrings ----------------------------------------------------------------------------------------

KEY_SPEC_SESSION_KEYRING, KEY_SPEC_USER_SESSION_KEYRING = -3, -5
KEYCTL_GET_KEYRING_ID, KEYCTL_UPDATE, KEYCTL_SETPERM, KEYCTL_READ, KEYCTL_INVALIDATE = 0, 2, 5, 11, 21
POSSESSOR_ONLY, POSSESSOR_AND_USER_VIEW = 0x3F000000, 0x3F010000  # include/uapi/linux/keyctl.h KEY_*_


class _Keys:
    """The keyctl calls of the tests, through libc's ``syscall`` (the stdlib has no keyctl)."""

    def __init__(self) -> None:
        self.numbers = seccomp.SYSCALLS[platform.machine()]
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.syscall.restype = ctypes.c_long

    def keyctl(self, *args: int | bytes | ctypes.Array) -> int:
        wrapped = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
        return int(self.libc.syscall(self.numbers["keyctl"], *wrapped))

    def add(self, description: str, payload: bytes, keyring: int, perm: int) -> int:
        key = int(
            self.libc.syscall(
                self.numbers["add_key"],
                b"user",
                description.encode(),
                payload,
                ctypes.c_size_t(len(payload)),
                ctypes.c_long(keyring),
            )
        )
        if key < 0:
            pytest.skip(f"no keyrings here: {os.strerror(ctypes.get_errno())}")
        assert self.keyctl(KEYCTL_SETPERM, key, perm) == 0
        return key

    def read(self, key: int) -> bytes:
        buffer = ctypes.create_string_buffer(256)
        size = self.keyctl(KEYCTL_READ, key, buffer, 256)
        return buffer.raw[: max(size, 0)]


@pytest.fixture
def session_keys() -> Iterator[dict[str, int | str]]:
    """Two keys in the session keyring the supervisor's runs inherit (its own, or the user-session
    keyring a process without one searches instead): one only a possessor may view, one the uid may
    view (so a run finds its serial in /proc/keys)."""
    keys = _Keys()
    session = keys.keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0)
    user_session = keys.keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_SESSION_KEYRING, 0)
    keyring = (
        KEY_SPEC_SESSION_KEYRING
        if session >= 0 and session != user_session
        else KEY_SPEC_USER_SESSION_KEYRING
    )
    tag = secrets.token_hex(4)
    hidden = keys.add(f"alphaagent-test-possessed-{tag}", b"possessed", keyring, POSSESSOR_ONLY)
    viewable = keys.add(f"alphaagent-test-viewable-{tag}", b"original", keyring, POSSESSOR_AND_USER_VIEW)
    try:
        yield {"tag": tag, "hidden": hidden, "viewable": viewable}
    finally:
        for key in (hidden, viewable):
            keys.keyctl(KEYCTL_INVALIDATE, key)


KEYRING_PROBE = """
import ctypes, errno, json
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(number, *args):
    done = libc.syscall(number, *(ctypes.c_long(a) if isinstance(a, int) else a for a in args))
    return "ok" if done >= 0 else errno.errorcode[ctypes.get_errno()]
listed = [line for line in open("/proc/keys") if TAG in line]
viewable = [int(line.split()[0], 16) for line in listed if "viewable" in line]
buffer = ctypes.create_string_buffer(256)
print(json.dumps({
    "listed": sorted(line.split()[8].rstrip(":") for line in listed),
    "session id": call(KEYCTL, 0, -3, 0),
    "read": [call(KEYCTL, 11, key, buffer, 256) for key in viewable],
    "update": [call(KEYCTL, 2, key, b"overwritten", 11) for key in viewable],
    "add to session": call(ADD_KEY, b"user", b"planted-" + TAG.encode(), b"x", 1, -3),
}))
"""


def test_a_run_can_neither_use_nor_see_the_supervisors_session_keyring(
    box: Sandbox, tmp_path: Path, session_keys: dict[str, int | str]
) -> None:
    # Given a key only a possessor of the supervisor's session keyring may view, and one the uid may
    tag = str(session_keys["tag"])
    numbers = seccomp.SYSCALLS[platform.machine()]
    code = f"TAG, KEYCTL, ADD_KEY = {tag!r}, {numbers['keyctl']}, {numbers['add_key']}\n" + KEYRING_PROBE
    # When a run lists /proc/keys, reads and overwrites the viewable key and adds one to its session
    result = run(box, code, tmp_path, network=box.isolation == "namespaces")
    # Then it does not possess the supervisor's session (the possessor-only key is not listed), every
    # keyring call is refused, and the supervisor's keys are as they were
    assert_status(result, "ok")
    probe = json.loads(result.stdout)
    keys = _Keys()
    assert probe["listed"] == [f"alphaagent-test-viewable-{tag}"], probe
    assert probe["session id"] == probe["add to session"] == "EPERM"
    assert probe["read"] == probe["update"] == ["EPERM"]
    assert keys.read(int(session_keys["viewable"])) == b"original"
    assert not [line for line in Path("/proc/keys").read_text().splitlines() if f"planted-{tag}" in line]
    assert result.isolation.process_calls == "filtered"


SECCOMP_STATUS = """
print([line.split(":")[1].strip() for line in open("/proc/self/status") if line.startswith("Seccomp_filters:")][0])
"""


@pytest.mark.parametrize("network", [False, True], ids=["network off", "network on"])
def test_the_report_says_filtered_only_where_a_filter_is_in_force(
    box: Sandbox, tmp_path: Path, network: bool
) -> None:
    if network and box.isolation == "process":
        pytest.skip("the process level has no network switch")
    # When a run reads how many seccomp filters it is under
    result = run(box, SECCOMP_STATUS, tmp_path, network=network)
    # Then its report's process_calls says "filtered", and a filter is there
    assert_status(result, "ok")
    assert result.isolation.process_calls == "filtered"
    assert int(result.stdout) >= 1


FAMILIES = """
import errno, json, socket
def attempt(make):
    try:
        make().close()
        return "made"
    except OSError as exc:
        return errno.errorcode[exc.errno]
families = {}
for family in range(1, 46):  # AF_MAX is 46 on Linux 6.x
    if family not in (socket.AF_INET, socket.AF_INET6, socket.AF_UNIX, socket.AF_NETLINK):
        answers = {attempt(lambda: socket.socket(family, kind)) for kind in (1, 2, 3, 5)}
        families[family] = sorted(answers)
netlink = {proto: attempt(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, proto)) for proto in range(32)}
import psutil
print(json.dumps({
    "families": families,
    "netlink": netlink,
    "inet socketpair": attempt(lambda: socket.socketpair(socket.AF_INET)[0]),
    "tcp": attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM)),
    "udp6": attempt(lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)),
    "if_nameindex": "lo" in dict(socket.if_nameindex()).values(),
    "getaddrinfo": sorted({a[4][0] for a in socket.getaddrinfo("localhost", 80, type=socket.SOCK_STREAM)}),
    "psutil": "lo" in psutil.net_if_addrs(),
}))
"""


@pytest.mark.parametrize("network", [False, True], ids=["network off", "network on"])
def test_a_run_makes_sockets_of_no_family_it_does_not_need(
    box: Sandbox, tmp_path: Path, network: bool
) -> None:
    # Given this machine (a VM) has AF_VSOCK, a way to its hypervisor's host that no network
    # namespace separates, and AF_PACKET, AF_ALG, AF_XDP and netlink's sock_diag and uevents
    if network and box.isolation == "process":
        pytest.skip("the process level has no network switch")
    # When a run makes a socket of every family and type, and a netlink socket of every protocol
    result = run(box, FAMILIES, tmp_path, network=network)
    # Then every family but IPv4, IPv6, unix and netlink answers as an absent one, and netlink only
    # NETLINK_ROUTE, while what getifaddrs, getaddrinfo and psutil read still works
    assert_status(result, "ok")
    probe = json.loads(result.stdout)
    assert {int(f): a for f, a in probe["families"].items() if a != ["EAFNOSUPPORT"]} == {}
    assert {int(p): a for p, a in probe["netlink"].items() if a != "EPROTONOSUPPORT"} == {0: "made"}
    assert probe["inet socketpair"] == "EAFNOSUPPORT"
    assert (probe["tcp"], probe["udp6"], probe["if_nameindex"], probe["psutil"]) == (
        "made",
        "made",
        True,
        True,
    )
    assert "127.0.0.1" in probe["getaddrinfo"]


IO_URING = """
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
params = (ctypes.c_char * 120)()
fd = libc.syscall(425, 4, params)
print("made" if fd >= 0 else errno.errorcode[ctypes.get_errno()])
"""


def test_io_uring_is_refused_even_where_unix_sockets_are_allowed(box: Sandbox, tmp_path: Path) -> None:
    # When a run sets up an io_uring (whose IORING_OP_SOCKET would make any family's socket past
    # the filter), with the network on where there is a switch (AF_UNIX allowed at the namespaces level)
    if platform.machine() != "x86_64":
        pytest.skip("the io_uring_setup number here is x86_64's")
    result = run(box, IO_URING, tmp_path, network=box.isolation == "namespaces")
    # Then it is refused
    assert_status(result, "ok")
    assert result.stdout.strip() == "EACCES"


RUN_USER = """
import errno, json, os, socket
try:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(PATH)
    answer = "connected"
except OSError as exc:
    answer = errno.errorcode[exc.errno]
print(json.dumps({"connect": answer, "listing": sorted(os.listdir("/run/user")) if os.path.isdir("/run/user") else []}))
"""


def test_with_the_network_on_run_user_is_hidden(tmp_path: Path) -> None:
    # Given a socket of the supervisor's uid in /run/user (where session buses, systemd --user and
    # agents listen), connectable from here
    if not Path("/run/user").is_dir() or not os.access("/run/user", os.W_OK):
        pytest.skip("no writable /run/user here")
    path = f"/run/user/alphaagent-test-{secrets.token_hex(4)}.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.connect(path)
        with light_at("namespaces") as box:
            # When a run with the network on (AF_UNIX sockets allowed) connects to it
            result = run(box, f"PATH = {path!r}\n" + RUN_USER, tmp_path, network=True)
    finally:
        server.close()
        os.unlink(path)
    # Then /run/user is empty or gone (all of /run is hidden)
    assert_status(result, "ok")
    assert json.loads(result.stdout) == {"connect": "ENOENT", "listing": []}


@pytest.mark.parametrize("machine", sorted(seccomp.SYSCALLS))
@pytest.mark.parametrize("level", seccomp.LEVELS)
@pytest.mark.parametrize("unix_sockets", [False, True])
def test_each_levels_filter_assembles_for_each_known_architecture(
    machine: str, level: str, unix_sockets: bool
) -> None:
    # When the filter of a level is built for an architecture (aarch64 is not exercised here)
    code = seccomp.program(machine, level=level, unix_sockets=unix_sockets)
    # Then it checks the architecture first, and answers ENOSYS, EACCES, EAFNOSUPPORT, EPROTONOSUPPORT
    # (sockets) or EPERM as meant
    assert code is not None and code[0] == (seccomp.BPF_LD_W_ABS, 0, 0, seccomp.OFFSET_ARCH)
    returns = {k for op, _, _, k in code if op == seccomp.BPF_RET_K}
    answers = (errno.ENOSYS, errno.EACCES, errno.EPERM, errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT)
    errors = {seccomp.SECCOMP_RET_ERRNO | e for e in answers}
    assert returns == {seccomp.SECCOMP_RET_ALLOW} | errors
    assert code[-1] == (seccomp.BPF_RET_K, 0, 0, seccomp.SECCOMP_RET_ERRNO | errno.EPERM)
    with pytest.raises(ValueError, match="level"):
        seccomp.program(machine, level="vm")


def _view_with_resolver_under_run(scope: Path) -> dict[str, object]:
    """In a forked child's private mount namespace: a host whose /etc/resolv.conf links into a folder
    of /run that also holds a service's socket (systemd-resolved's /run/systemd/resolve), then the
    run's view with the network on (``zygote._private_view``); what of that folder the view shows."""
    libc = ctypes.CDLL(None, use_errno=True)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - reports through the pipe
        answer: dict[str, object] = {}
        try:
            os.close(r)
            if libc.unshare(0x00020000) != 0:  # CLONE_NEWNS
                raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
            zygote._mount("none", "/", None, zygote.MS_REC | zygote.MS_PRIVATE)  # nothing leaks out
            zygote._mount("tmpfs", "/run", "tmpfs", 0, "size=64k")
            os.makedirs("/run/rtfake")
            Path("/run/rtfake/resolv.conf").write_text("nameserver 10.255.255.53\n")
            with socket.socket(socket.AF_UNIX) as service:
                service.bind("/run/rtfake/service.sock")
                zygote._mount("tmpfs", "/etc", "tmpfs", 0, "size=64k")
                os.symlink("/run/rtfake/resolv.conf", "/etc/resolv.conf")
                zygote._private_view({"cwd": str(scope), "tmp_bytes": 1 << 20, "shm_bytes": 1 << 20}, True)
                answer = {
                    "folder": sorted(os.listdir("/run/rtfake")),
                    "resolv.conf": Path("/etc/resolv.conf").read_text(),
                    "run": sorted(os.listdir("/run")),
                }
        except BaseException as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            os.write(w, json.dumps(answer).encode())
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        answer = json.loads(fh.read() or b"{}")
    os.waitpid(pid, 0)
    return answer


def test_with_the_network_on_only_resolv_confs_target_file_comes_back_not_its_folder(tmp_path: Path) -> None:
    # Given a host whose /etc/resolv.conf links into a folder of /run holding a service's socket
    # (simulated in a private mount namespace, as root)
    if os.geteuid() != 0:
        pytest.skip("the simulation mounts: root only")
    # When the run's view is made with the network on
    answer = _view_with_resolver_under_run(tmp_path)
    if str(answer.get("error", "")).startswith("PermissionError"):
        pytest.skip(f"no private mount namespace here: {answer['error']}")
    # Then DNS's configuration reads, and nothing else of its folder (the socket) is there
    assert answer == {
        "folder": ["resolv.conf"],
        "resolv.conf": "nameserver 10.255.255.53\n",
        "run": ["rtfake"],
    }
