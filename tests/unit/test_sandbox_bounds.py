"""Issue 10, items 1, 4, 5 and 6: what a run can reach and hold beyond its scope -- host device nodes,
host unix sockets, RAM outside ``memory_mb``, disk beyond ``disk_mb`` -- at the ``namespaces`` level
(and the ``process`` level where a bound applies there too), as root and as an unprivileged user.

Every run goes through a supervisor in its own process (``SUPERVISOR``): as root it stays root; for
the unprivileged case it imports everything as root, then drops to a user made for the test with
``useradd`` (or, when the suite itself runs unprivileged, simply runs as that user). The supervisor
also creates the host's listening unix sockets, as the uid that will run the code, and checks from
the host side that they are connectable, so a test that finds them unreachable from the run cannot
pass for the wrong reason.
"""

from __future__ import annotations

import json
import os
import secrets
import selectors
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from assertions import assert_status

from alphaagent.models.run import RunResult
from alphaagent.sandbox.diskbudget import PERIODIC_WALK_S, WALK_COST_FACTOR, ScopeDiskBudget, scope_growth
from alphaagent.sandbox.zygote import landlock_abi

REPO_ROOT = Path(__file__).resolve().parents[2]
MiB = 2**20

SUPERVISOR = """
import json, os, pwd, shutil, socket, sys, tempfile, traceback
from pathlib import Path
from alphaagent.models.run import RunLimits
from alphaagent.sandbox.config import SandboxConfig
from alphaagent.sandbox.supervisor import Sandbox
import alphaagent.sandbox.capture, alphaagent.sandbox.pathsafe, alphaagent.sandbox.diskbudget  # noqa

if sys.argv[1:]:
    user = pwd.getpwnam(sys.argv[1])
    os.setgroups([])
    os.setgid(user.pw_gid)
    os.setuid(user.pw_uid)
    os.environ["HOME"] = user.pw_dir


def serve(spec):
    parent = Path(tempfile.mkdtemp(prefix="alphaagent-bounds-", dir="/tmp"))
    os.chmod(parent, 0o755)
    scope = parent / "scope"
    scope.mkdir()
    listeners, sockets, reachable = [], {}, {}
    results = []
    try:
        for index, label in enumerate(spec["listen"]):
            where = {"$HOME": os.environ["HOME"], "$PARENT": str(parent)}.get(label, label)
            path = os.path.join(where, f"alphaagent-bounds-{os.getpid()}-{spec['serial']}-{index}.sock")
            try:
                server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                server.bind(path)
            except OSError:
                continue  # not writable by this uid: no socket of its own there to reach
            os.chmod(path, 0o777)
            server.listen(8)
            listeners.append((server, path))
            sockets[label] = path
        if spec["listen"]:
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            name = f"\\0alphaagent-bounds-{os.getpid()}-{spec['serial']}"
            server.bind(name)
            server.listen(8)
            listeners.append((server, None))
            sockets["abstract"] = name
        for where, path in sockets.items():
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                reachable[where] = probe.connect_ex(path) == 0
        config = {"python": sys.executable, "preload": [], "warmup": "", "pool_size": 1, **spec["config"]}
        with Sandbox(SandboxConfig(**config)) as box:
            for run in spec["runs"]:
                code = f"SOCKETS = {sockets!r}\\n" + run["code"]
                result = box.run(code, cwd=scope, limits=RunLimits(**run["limits"]), network=run["network"])
                results.append(result.model_dump(mode="json"))
    finally:
        for server, path in listeners:
            server.close()
            if path:
                os.unlink(path)
        shutil.rmtree(parent, ignore_errors=True)
    return {"uid": os.getuid(), "sockets": sockets, "host_reachable": reachable, "results": results}


for line in sys.stdin:
    try:
        answer = serve(json.loads(line))
    except BaseException:
        answer = {"failed": traceback.format_exc()}
    sys.stdout.write(json.dumps(answer) + "\\n")
    sys.stdout.flush()
"""
"""A supervisor serving one spec (a sandbox configuration, host sockets, runs) per line of stdin and
answering each with one line; every spec gets a Sandbox (a zygote) of its own, started and closed for
it, so only the interpreter and its imports are shared: one supervisor per user for the module
(``_SUPERVISORS``), not one per test."""


class _Supervisor:
    """The supervisor process of one user (None: the suite's own), started on first use."""

    def __init__(self, user: str | None) -> None:
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close())
        self.serial = 0
        self.process = subprocess.Popen(
            [sys.executable, "-c", SUPERVISOR, *([user] if user else [])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            cwd=REPO_ROOT,
            env={
                "PATH": "/usr/local/bin:/usr/bin:/bin",
                "LANG": "C.UTF-8",
                "PYTHONPATH": str(REPO_ROOT),
                "HOME": "/root" if os.geteuid() == 0 else os.environ.get("HOME", "/"),
            },
        )

    def ask(self, spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """The supervisor's answer to ``spec``; raises ``AssertionError`` (with its stderr) when it
        died or did not answer within ``timeout_s``."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.serial += 1
        self.process.stdin.write(json.dumps({**spec, "serial": self.serial}).encode() + b"\n")
        self.process.stdin.flush()
        answer, deadline = b"", time.monotonic() + timeout_s
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            while not answer.endswith(b"\n"):
                if not selector.select(max(0.0, deadline - time.monotonic())):
                    self.close()
                    raise AssertionError(f"the supervisor did not answer in {timeout_s} s: {self.log()}")
                chunk = os.read(self.process.stdout.fileno(), 1 << 20)
                if not chunk:
                    self.close()
                    raise AssertionError(f"the supervisor exited: {self.log()}")
                answer += chunk
        return dict(json.loads(answer))

    def log(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-3000:]

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.stderr.close()


_SUPERVISORS: dict[str | None, _Supervisor] = {}


@pytest.fixture(scope="module", autouse=True)
def _close_supervisors() -> Iterator[None]:
    yield
    while _SUPERVISORS:
        _SUPERVISORS.popitem()[1].close()


@pytest.fixture(scope="module")
def unprivileged_user() -> Iterator[str | None]:
    """A user made for these tests (root), or None when the suite already runs unprivileged."""
    if os.geteuid() != 0:
        yield None
        return
    if shutil.which("useradd") is None:
        pytest.skip("useradd is not installed: cannot make an unprivileged user")
    name = f"aa-bounds-{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--create-home", "--shell", "/usr/sbin/nologin", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["userdel", "--remove", name], check=False, capture_output=True)


@pytest.fixture(params=["root", "unprivileged"])
def who(request: pytest.FixtureRequest) -> str | None:
    """Who the supervisor runs as: root (skipped when the suite is not root), or an ordinary user."""
    if request.param == "root":
        if os.geteuid() != 0:
            pytest.skip("the suite does not run as root")
        return None
    return request.getfixturevalue("unprivileged_user") or os.environ.get("USER") or "?"


def supervise(
    who: str | None,
    runs: list[dict[str, Any]],
    *,
    config: dict[str, Any] | None = None,
    listen: list[str] = (),  # type: ignore[assignment]
    level: str = "namespaces",
) -> dict[str, Any]:
    """Run ``runs`` (``{"code", "limits", "network"}``) through a supervisor as ``who`` (a user name,
    or None for the suite's own uid); returns the supervisor's report with ``RunResult`` objects.
    Skips when the ``namespaces`` level is asked for and the kernel refuses it to that uid."""
    user = who if who and os.geteuid() == 0 else None
    python = sys.executable
    if user is not None:
        # The venv's interpreter may live where the user cannot read (/root/.pyenv): the zygote is
        # stdlib-only, so the system interpreter serves for the runs.
        python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    spec = {
        "config": {"isolation": level, "python": python, **(config or {})},
        "listen": list(listen),
        "runs": [
            {
                "network": False,
                **run,
                "code": textwrap.dedent(run["code"]),
                "limits": {"timeout_s": 20, **run.get("limits", {})},
            }
            for run in runs
        ],
    }
    supervisor = _SUPERVISORS.get(user)
    if supervisor is None or supervisor.process.poll() is not None:
        supervisor = _SUPERVISORS[user] = _Supervisor(user)
    report = supervisor.ask(spec, timeout_s=180)
    if "failed" in report and "namespaces unavailable" in report["failed"]:
        pytest.skip(f"the kernel refuses namespaces to this user: {report['failed'].strip()[-300:]}")
    assert "failed" not in report, report["failed"][-3000:]
    report["results"] = [RunResult.model_validate(r) for r in report["results"]]
    return report


# -- item 1: host device nodes -------------------------------------------------------------------

HOST_NODES = (
    "kmsg", "loop-control", "kvm", "console", "tty0", "tty1", "cpu_dma_latency", "fuse", "mem", "kmem",
    "port", "hwrng", "btrfs-control", "net/tun", "loop0", "vda", "sda", "nvme0", "mapper/control",
    "snapshot", "uinput", "vhost-net", "autofs",
)  # fmt: skip
"""Host nodes the red-team pass opened, and their kin: hardware, the kernel log, consoles, loop
devices, block devices, FUSE, KVM. Only those that exist on this host are tried (see the test)."""

DEVICE_PROBE = """
import json, os, pty
opened = []
for name in NODES:
    for flags in (os.O_RDWR, os.O_RDONLY, os.O_WRONLY):
        try:
            os.close(os.open("/dev/" + name, flags | os.O_NONBLOCK | os.O_NOCTTY))
        except OSError:
            continue
        opened.append(name)
        break
made = []
for where in ("/tmp", "/dev/shm", "."):
    try:
        os.mknod(os.path.join(where, "kmsg-copy"), 0o600 | 0o020000, os.makedev(1, 11))
        made.append(where)
    except OSError:
        pass
with open("/dev/zero", "rb") as z, open("/dev/null", "wb") as n, open("/dev/urandom", "rb") as u:
    n.write(z.read(4) + u.read(4))
master, slave = pty.openpty()
print(json.dumps({"opened": opened, "mknod": made, "dev": sorted(os.listdir("/dev")),
                  "pty": os.ttyname(slave)}))
"""


def test_dev_01_a_run_opens_no_host_device_node(who: str | None) -> None:
    # Given host device nodes that exist here (a root process can open them on the host)
    nodes = [name for name in HOST_NODES if os.path.exists(f"/dev/{name}")]
    assert nodes, "no host device node to probe on this machine"

    # When a run at the namespaces level tries to open each, and to make its own device node
    report = supervise(who, [{"code": f"NODES = {nodes!r}\n" + DEVICE_PROBE}])
    result = report["results"][0]
    assert_status(result, "ok")
    probe = json.loads(result.stdout)

    # Then none opens, none can be made, /dev holds only the minimal set, and what programs need works
    assert probe["opened"] == []
    assert probe["mknod"] == []
    assert probe["dev"] == sorted(
        [
            "fd",
            "full",
            "null",
            "ptmx",
            "pts",
            "random",
            "shm",
            "stderr",
            "stdin",
            "stdout",
            "tty",
            "urandom",
            "zero",
        ]
    )
    assert probe["pty"].startswith("/dev/pts/")
    assert (result.isolation.level, result.isolation.dev) == ("namespaces", "private")


# -- item 4: host unix sockets with the network off ----------------------------------------------

SOCKET_PLACES = ["/var/tmp", "/dev/shm", "$HOME", "/root", "/run", "/tmp", "$PARENT"]

CONNECT_PROBE = """
import json, socket
connected = {}
for where, path in SOCKETS.items():
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET):
        try:
            with socket.socket(socket.AF_UNIX, kind) as s:
                s.settimeout(1)
                s.connect(path)
            connected[where] = "connect"
        except OSError:
            pass
    for kind in (socket.SOCK_DGRAM, socket.SOCK_RAW):  # a datagram pair (SOCK_RAW is made one)
        try:  # can sendto any bound address
            a, b = socket.socketpair(socket.AF_UNIX, kind)
            a.sendto(b"x", path)
            connected[where] = "sendto"
        except OSError:
            pass
# What a program needs without network still works: stream socketpairs, a process pool.
a, b = socket.socketpair()
a.sendall(b"ping")
import multiprocessing
with multiprocessing.get_context("fork").Pool(2) as pool:
    squares = pool.map(abs, [-2, -3])
print(json.dumps({"connected": connected, "pair": b.recv(4).decode(), "pool": squares}))
"""


def test_sock_01_no_host_unix_socket_is_connectable_with_the_network_off(who: str | None) -> None:
    # Given listening unix sockets of the run's own uid in every place it could write to on the host,
    # and an abstract one, each connectable from the host
    report = supervise(
        who, [{"code": CONNECT_PROBE}, {"code": CONNECT_PROBE, "network": True}], listen=SOCKET_PLACES
    )
    required = {"/var/tmp", "/dev/shm", "/tmp", "$HOME", "$PARENT", "abstract"} | (
        {"/root", "/run"} if who is None else set()
    )
    assert required <= set(report["sockets"]), report["sockets"]
    assert all(report["host_reachable"].values()), report["host_reachable"]

    # When a run without network tries to connect (or send) to each
    off, on = report["results"]
    assert_status(off, "ok")
    probe = json.loads(off.stdout)

    # Then none is reachable, and socketpairs and a process pool still work
    assert probe["connected"] == {}
    assert (probe["pair"], probe["pool"]) == ("ping", [2, 3])
    assert (off.isolation.host_unix_sockets, off.network) == ("blocked", "off")
    # And with the network on the run shares the host's network namespace: socket files are
    # reachable (the README says so), abstract ones not where Landlock can scope them; the report
    # says which
    assert_status(on, "ok")
    reached = json.loads(on.stdout)["connected"]
    assert "/var/tmp" in reached
    # but not those in /run, where host services listen (the system bus, docker.sock): hidden
    assert "/run" not in reached
    expected = "files_only" if landlock_abi() >= 6 else "reachable"
    assert on.isolation.host_unix_sockets == expected
    assert ("abstract" in reached) == (expected == "reachable")


def test_sock_02_at_the_process_level_no_host_unix_socket_is_reachable(who: str | None) -> None:
    # When a run at the process level tries every host socket (a socket file of its uid, an abstract one)
    report = supervise(who, [{"code": CONNECT_PROBE}], listen=["/var/tmp", "$PARENT"], level="process")
    result = report["results"][0]
    assert_status(result, "ok")
    reached = json.loads(result.stdout)["connected"]
    if result.isolation.process_calls != "filtered":
        pytest.skip("no seccomp filter here: the process level keeps socket files reachable")

    # Then none is reached (its seccomp filter refuses AF_UNIX sockets: a red-team run had handed
    # the uid's tmux server a command, which ran outside the sandbox), and the report says so
    assert report["host_reachable"]["abstract"] and report["host_reachable"]["/var/tmp"]
    assert reached == {} and result.isolation.host_unix_sockets == "blocked"


# -- item 5: memory outside memory_mb ------------------------------------------------------------

FILL = """
import os
block = b"x" * (1 << 20)
written = 0
try:
    with open(PATH, "wb") as fh:
        for _ in range(MIB):
            fh.write(block)
            fh.flush()
            written += 1
except OSError as exc:
    print(written, exc.errno)
else:
    print(written, 0)
"""


@pytest.mark.parametrize(("path", "limit"), [("/tmp/fill", "tmp_mb"), ("/dev/shm/fill", "shm_mb")])
def test_mem_01_tmp_and_shm_are_sized_per_run(who: str | None, path: str, limit: str) -> None:
    # Given a run with a 256 MB memory limit, a 64 MiB /tmp and a 16 MiB /dev/shm
    limits = {"memory_mb": 256, "tmp_mb": 64, "shm_mb": 16}
    code = f"PATH, MIB = {path!r}, 512\n" + FILL

    # When it writes up to 512 MiB to one of them
    result = supervise(who, [{"code": code, "limits": limits}])["results"][0]

    # Then the write stops with ENOSPC at the size (28), and the sizes are reported
    assert_status(result, "ok")
    written, errno = (int(v) for v in result.stdout.split())
    assert (written <= limits[limit], errno) == (True, 28), result.stdout
    assert (result.isolation.tmp_mb, result.isolation.shm_mb) == (64, 16)


MEMFD = """
import os
fd = os.memfd_create("hoard")
block = b"x" * (1 << 20)
for _ in range(2048):
    os.write(fd, block)
print("hoarded 2 GiB")
"""

PROCESSES = """
import os, time
kids = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        hoard = b"x" * (150 << 20)  # 150 MiB each, touched: within RLIMIT_AS, 600 MiB together
        time.sleep(5)
        os._exit(0)
    kids.append(pid)
if all(os.waitpid(pid, 0)[1] == 0 for pid in kids):
    print("600 MiB held")
"""


@pytest.fixture
def root_with_memory_cgroup() -> None:
    from alphaagent.sandbox.cgroup import RunCgroups

    if os.geteuid() != 0:
        pytest.skip("a memory cgroup needs root here")
    cgroups = RunCgroups.detect(("memory",))
    if cgroups is None:
        pytest.skip("no writable memory controller on this machine")
    cgroups.close()


@pytest.mark.parametrize("level", ["namespaces", "process"])
@pytest.mark.parametrize("code", [MEMFD, PROCESSES], ids=["memfd", "processes"])
def test_mem_02_a_memory_cgroup_holds_the_whole_run_to_memory_mb(
    root_with_memory_cgroup: None, level: str, code: str
) -> None:
    # Given a root supervisor that can create memory cgroups, and a 256 MB run
    # When the run holds more than that outside its own address space (memfd pages, child processes)
    result = supervise(None, [{"code": code, "limits": {"memory_mb": 256}}], level=level)["results"][0]

    # Then it is killed at the limit with the reason, and the bound in force is reported
    assert (result.status, result.error and result.error.name) == ("killed", "MemoryLimitExceeded"), result
    assert "hoarded" not in result.stdout and "held" not in result.stdout
    assert result.isolation.memory_bound == "cgroup"


def test_mem_03_without_a_cgroup_the_report_says_rlimit_as(unprivileged_user: str | None) -> None:
    # Given an unprivileged supervisor (it cannot create cgroups)
    # When it runs code
    result = supervise(unprivileged_user or os.environ.get("USER"), [{"code": "print(1)"}])["results"][0]

    # Then the result says that only the address space was bounded, and /tmp was still sized
    assert_status(result, "ok")
    assert result.isolation.memory_bound == "rlimit_as"
    assert result.isolation.tmp_mb == 1024  # half of the default 2048 MB


# -- item 6: disk --------------------------------------------------------------------------------

SCOPE_FILL = """
import time
block = b"x" * (1 << 20)
with open("datasets/big.bin", "wb") as fh:
    for i in range(256):
        fh.write(block)
        fh.flush()
        if i % 8 == 0:
            time.sleep(0.02)  # 256 MiB over ~0.6 s: the page cache alone would take them in 0.1 s
print("wrote 256 MiB")
"""


@pytest.mark.parametrize("level", ["namespaces", "process"])
def test_disk_01_a_run_past_its_scope_budget_is_killed_with_the_reason(who: str | None, level: str) -> None:
    # Given a run with a write budget of 16 MiB
    code = 'import os\nos.makedirs("datasets", exist_ok=True)\n' + SCOPE_FILL
    result = supervise(who, [{"code": code, "limits": {"disk_mb": 16}}], level=level)["results"][0]

    # Then it is killed before it wrote everything, with DiskLimitExceeded and the sizes
    assert (result.status, result.error and result.error.name) == ("killed", "DiskLimitExceeded"), result
    assert "wrote 256 MiB" not in result.stdout
    assert "over its budget of 16 MiB" in (result.reason or "")
    assert result.limits["disk_mb"] == 16


def test_disk_01_a_burst_faster_than_a_poll_is_still_reported() -> None:
    # Given a run with a 16 MiB budget that writes 64 MiB at once and ends
    code = 'open("burst.bin", "wb").write(b"x" * (64 << 20))\nprint("done")'
    result = supervise(None, [{"code": code, "limits": {"disk_mb": 16}}], level="process")["results"][0]

    # Then its result says it went past the budget, even if no poll saw it while it ran (then it
    # finished on its own: an error, not a kill)
    assert_status(result, ("killed", "error"), result)
    assert result.error is not None and result.error.name == "DiskLimitExceeded"
    assert "burst.bin" in result.files_changed


HIDDEN_BURST = """
import os
os.unlink(BALLAST)  # from here the filesystem holds less than before the run: statvfs sees no growth
open("burst.bin", "wb").write(b"x" * (64 << 20))
print("done")
"""


def test_disk_01_a_burst_hidden_by_a_deletion_beside_it_is_still_reported(tmp_path: Path) -> None:
    # Given a 512 MiB file of the run's uid outside the scope, on the scope's filesystem (the
    # supervisor's scopes are made under /tmp)
    ballast = Path(tempfile.mkdtemp(dir="/tmp", prefix="alphaagent-ballast-")) / "ballast.bin"
    try:
        with open(ballast, "wb") as fh:
            os.posix_fallocate(fh.fileno(), 0, 512 * MiB)
        if os.stat(ballast).st_dev != os.stat("/tmp").st_dev:
            pytest.skip("the ballast is not on the scopes' filesystem")
        # When a process-level run with a 16 MiB budget deletes it, writes 64 MiB at once and ends
        # before the periodic walk was due (the filesystem shrank by 448 MiB meanwhile)
        code = f"BALLAST = {str(ballast)!r}\n" + HIDDEN_BURST
        result = supervise(None, [{"code": code, "limits": {"disk_mb": 16}}], level="process")["results"][0]
    finally:
        shutil.rmtree(ballast.parent, ignore_errors=True)
    # Then its result still says it went past the budget
    assert_status(result, ("killed", "error"), result)
    assert result.error is not None and result.error.name == "DiskLimitExceeded", result
    assert "burst.bin" in result.files_changed


def test_disk_01_a_sparse_file_counts_what_it_takes_not_its_length() -> None:
    # Given a run with a 16 MiB budget that makes a 1 GiB sparse file and writes 1 MiB into it
    code = (
        'f = open("sparse.bin", "wb")\nf.truncate(1 << 30)\nf.write(b"x" * (1 << 20))\nf.close()\nprint("ok")'
    )
    result = supervise(None, [{"code": code, "limits": {"disk_mb": 16}}])["results"][0]

    # Then it finishes normally
    assert (result.status, result.stdout) == ("ok", "ok\n"), result.error


class FakeFilesystem:
    """A clock, a filesystem's used bytes and a scope walk that costs ``walk_s`` of the clock."""

    def __init__(self, walk_s: float) -> None:
        self.now = 0.0
        self.used = 0
        self.scope = 0
        self.walk_s = walk_s

    def clock(self) -> float:
        return self.now

    def fs_used(self, _root: Path) -> int:
        return self.used

    def walk(self) -> int:
        self.now += self.walk_s
        return self.scope


def test_disk_02_the_budget_walks_a_big_scope_rarely_whatever_else_writes() -> None:
    # Given a scope whose walk costs 0.5 s, and another writer growing the filesystem all the time
    fs = FakeFilesystem(walk_s=0.5)
    budget = ScopeDiskBudget(
        Path("/scope"),
        budget_bytes=100 * MiB,
        clock=fs.clock,
        fs_used=fs.fs_used,
        walk=fs.walk,
    )

    # When the supervisor polls every 0.1 s for 100 s
    verdicts = []
    for _ in range(1000):
        fs.now += 0.1
        fs.used += 50 * MiB
        verdicts.append(budget.poll())

    # Then the scope (which did not grow) is never over budget, and was walked at most once per
    # 20 walk-durations
    assert set(verdicts) == {None}
    assert budget.walks <= int(fs.now / (WALK_COST_FACTOR * fs.walk_s)) + 1

    # And when the scope itself grows past the budget, the next walk allowed finds it
    fs.scope = 101 * MiB
    for _ in range(int(WALK_COST_FACTOR * fs.walk_s / 0.1) + 2):
        fs.now += 0.1
        fs.used += 50 * MiB
        if (grown := budget.poll()) is not None:
            break
    assert grown == 101 * MiB


def test_disk_02_a_quiet_filesystem_costs_one_statvfs_per_poll_and_a_walk_a_second() -> None:
    # Given a small scope (a 1 ms walk) on a filesystem nothing writes to
    fs = FakeFilesystem(walk_s=0.001)
    budget = ScopeDiskBudget(
        Path("/scope"), budget_bytes=MiB, clock=fs.clock, fs_used=fs.fs_used, walk=fs.walk
    )

    # When the supervisor polls every 0.1 s for 10 s
    for _ in range(100):
        fs.now += 0.1
        assert budget.poll() is None

    # Then the scope was walked about once per PERIODIC_WALK_S only
    assert budget.walks <= int(fs.now / PERIODIC_WALK_S) + 1

    # And the check at the end of the run costs no walk at all
    walks = budget.walks
    assert (budget.final(), budget.walks) == (None, walks)


def test_disk_03_growth_counts_new_spill_files_not_the_old_ones(tmp_path: Path) -> None:
    # Given a scope with a dataset and 300 earlier runs' spill files, snapshotted before a run
    from alphaagent.sandbox.snapshot import take_snapshot

    (tmp_path / "datasets").mkdir()
    (tmp_path / "datasets" / "old.csv").write_bytes(b"x" * MiB)
    for i in range(300):
        run_dir = tmp_path / "work" / "runs" / f"old{i:03d}"
        run_dir.mkdir(parents=True)
        (run_dir / "stdout.txt").write_bytes(b"y" * 20_000)
    before = take_snapshot(tmp_path, exclude=["work/runs"])
    started_ns = time.time_ns()

    # When the run writes 2 MiB to a dataset, 3 MiB into work/runs and its own spill gets 4 MiB
    (tmp_path / "datasets" / "new.csv").write_bytes(b"z" * 2 * MiB)
    (tmp_path / "work" / "runs" / "planted").mkdir()
    (tmp_path / "work" / "runs" / "planted" / "blob").write_bytes(b"p" * 3 * MiB)
    (tmp_path / "work" / "runs" / "this-run").mkdir()
    (tmp_path / "work" / "runs" / "this-run" / "stdout.txt").write_bytes(b"s" * 4 * MiB)
    grown = scope_growth(
        tmp_path, before, started_ns, platform_dir="work/runs", own="this-run", max_entries=100_000
    )

    # Then what it added counts (the old spill files and the run's own spill do not)
    assert 5 * MiB <= grown < 5 * MiB + 64 * 1024


def test_dev_02_a_scope_under_the_hosts_dev_shm_still_works_and_holds_no_host_descriptor() -> None:
    # Given a scope on the host's /dev/shm (a data directory on tmpfs), which the private /dev hides
    if not os.access("/dev/shm", os.W_OK):
        pytest.skip("/dev/shm is not writable here")
    from alphaagent.sandbox.config import SandboxConfig
    from alphaagent.sandbox.supervisor import Sandbox

    scope = Path(f"/dev/shm/alphaagent-bounds-{secrets.token_hex(4)}")
    scope.mkdir()
    try:
        with Sandbox(SandboxConfig(preload=(), warmup="", pool_size=1)) as box:
            if box.isolation != "namespaces":
                pytest.skip(f"namespaces unavailable here: {box.info.get('isolation_detail')}")
            # When a run writes there and lists its descriptors
            code = "import os\nopen('out.txt', 'w').write('x')\nprint(sorted(int(f) for f in os.listdir('/proc/self/fd')))"
            result = box.run(code, cwd=scope)
        # Then the write lands in the scope, and the run holds only 0-3 (and the listing's own)
        assert (result.status, result.files_changed) == ("ok", ["out.txt"]), result.error
        assert json.loads(result.stdout) == [0, 1, 2, 3, 4]
        assert (scope / "out.txt").read_text() == "x"
    finally:
        shutil.rmtree(scope, ignore_errors=True)
