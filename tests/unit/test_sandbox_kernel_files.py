"""A run cannot write beneath ``/proc``, ``/sys`` or a cgroup filesystem, at either level, so a root
run cannot leave the pids and memory cgroups that bound it.

Found by a red-team review: at the ``process`` level a run as root wrote its pid into the root
``cgroup.procs`` (cgroupfs files are root's, and moving a process needs no capability) and forked
40 processes past ``processes=20``. The ``namespaces`` level mounts those filesystems read-only;
the ``process`` level now denies the writes in the run's Landlock domain (``_enter_landlock_domain``).
"""

from __future__ import annotations

import errno
import json
import os
import platform
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from assertions import assert_status
from sandboxes import light_at

from alphaagent.models.run import RunLimits, RunResult
from alphaagent.sandbox import seccomp, zygote
from alphaagent.sandbox.cgroup import RunCgroups
from alphaagent.sandbox.config import SandboxConfig
from alphaagent.sandbox.supervisor import Sandbox

LEAVE_CGROUPS = """
import glob, json, os
before = open("/proc/self/cgroup").read()
targets = set()
for line in open("/proc/self/mountinfo"):
    left, _, right = line.partition(" - ")
    if right.split()[0] not in ("cgroup", "cgroup2"):
        continue
    mount = left.split()[4]
    targets.add(mount + "/cgroup.procs")  # the root cgroup of every hierarchy
    # Every cgroup of this sandbox it can see: its parent and the other spares' (never another's).
    for own in before.splitlines():
        parts = own.split(":", 2)[2].strip("/").split("/")
        for i, part in enumerate(parts):
            if part.startswith("alphaagent-"):
                top = os.path.join(mount, *parts[: i + 1])
                targets.update(glob.glob(top + "/**/cgroup.procs", recursive=True))
moved = []
for target in sorted(t for t in targets if os.path.exists(t)):
    try:
        with open(target, "w") as fh:
            fh.write(str(os.getpid()))
        moved.append(target)
    except OSError:
        pass
print(json.dumps({"tried": len(targets), "moved": moved, "same": open("/proc/self/cgroup").read() == before}))
"""

FORK_BOMB = """
import os, time
forked = 0
for _ in range(60):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(5)
        os._exit(0)
    forked += 1
print(json.dumps({"forked": forked}))
"""

MEMORY_HOG = """
fd = os.memfd_create("hoard")  # page cache, not address space: only the memory cgroup bounds it
for _ in range(768):
    os.write(fd, b"x" * (1 << 20))
print("hoarded 768 MiB")
"""


@pytest.fixture(scope="module", params=["namespaces", "process"])
def box(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    with light_at(request.param) as sandbox:
        yield sandbox


@pytest.fixture
def root_with_cgroups() -> None:
    if os.geteuid() != 0:
        pytest.skip("run cgroups need root here")
    cgroups = RunCgroups.detect()
    if cgroups is None or cgroups.pids is None or cgroups.memory is None:
        pytest.skip("no writable pids and memory controllers on this machine")
    cgroups.close()


def run(box: Sandbox, code: str, scope: Path, **limits: int) -> RunResult:
    return box.run(textwrap.dedent(code), cwd=scope, limits=RunLimits(timeout_s=30, **limits))


def report(result: RunResult) -> dict:
    return json.loads(result.stdout.splitlines()[0])


def test_a_root_run_cannot_move_itself_out_of_its_pids_cgroup(
    root_with_cgroups: None, box: Sandbox, tmp_path: Path
) -> None:
    # Given a root supervisor whose runs each get a pids cgroup
    if box.info.get("kernel_files") != "read_only":
        pytest.skip(f"this kernel cannot deny the writes: {box.info.get('kernel_files')}")
    # When a run writes its pid into every cgroup.procs it can see, then forks 60 times with processes=20
    result = run(box, LEAVE_CGROUPS + FORK_BOMB, tmp_path, processes=20)

    # Then no write moved it, and the fork bomb is still capped by its own cgroup
    assert_status(result, "ok")
    escape = report(result)
    assert escape["tried"] > 1 and escape["moved"] == [] and escape["same"], escape
    forked = json.loads(result.stdout.splitlines()[1])["forked"]
    assert forked < 20, result.stdout
    assert result.isolation.kernel_files == "read_only"


def test_a_root_run_cannot_move_itself_out_of_its_memory_cgroup(
    root_with_cgroups: None, box: Sandbox, tmp_path: Path
) -> None:
    # Given a root supervisor whose runs each get a memory cgroup
    if box.info.get("kernel_files") != "read_only":
        pytest.skip(f"this kernel cannot deny the writes: {box.info.get('kernel_files')}")
    # When a run tries to leave it, then holds 768 MiB of memfd pages with memory_mb=256
    result = run(box, LEAVE_CGROUPS + MEMORY_HOG, tmp_path, memory_mb=256)

    # Then it is still killed at its own cgroup's limit
    assert (result.status, result.error and result.error.name) == ("killed", "MemoryLimitExceeded"), result
    assert report(result)["moved"] == []
    assert "hoarded" not in result.stdout
    assert result.isolation.memory_bound == "cgroup"


KERNEL_WRITES = """
import json, os
denied = {}
for path in ("/proc/sys/kernel/hostname", "/proc/self/oom_score_adj", "/sys/kernel/mm/transparent_hugepage/enabled"):
    try:
        open(path, "r+").close()
        denied[path] = False
    except FileNotFoundError:
        pass
    except OSError:
        denied[path] = True
print(json.dumps(denied))
"""

ORDINARY_WRITES = """
import os, tempfile
with open("in-scope.txt", "w") as fh:
    fh.write("scope")
with open("in-scope.txt", "a") as fh:
    os.truncate("in-scope.txt", 2)
    with open(f"/proc/self/fd/{fh.fileno()}", "w") as again:  # a re-open through /proc names the file
        again.write("re-opened")
with tempfile.NamedTemporaryFile(dir=os.environ.get("TMPDIR")) as fh:
    fh.write(b"tmp")
with open("/dev/shm/alphaagent-kernel-files-" + str(os.getpid()), "w") as fh:
    fh.write("shm")
os.unlink(fh.name)
with open("/dev/null", "w") as fh:
    fh.write("null")
fd = os.memfd_create("m")
with open(f"/proc/self/fd/{fd}", "w") as fh:
    fh.write("memfd")
import shutil
os.makedirs("made/deeper")  # entries made, renamed and removed in the scope and in /tmp
os.rename("made/deeper", "made/moved")
os.symlink("moved", "made/link")
os.mkfifo("made/fifo")
os.rename("made", "made-too")
shutil.rmtree("made-too")
os.rmdir(tempfile.mkdtemp(dir=os.environ.get("TMPDIR")))
with open("/dev/stdout", "w") as fh:
    fh.write("all written\\n")
"""


def test_writes_beneath_proc_and_sys_are_denied_and_ordinary_ones_are_not(
    box: Sandbox, tmp_path: Path
) -> None:
    # Given a sandbox that says the kernel's files are read-only to its runs
    if box.info.get("kernel_files") != "read_only":
        pytest.skip(f"this kernel cannot deny the writes: {box.info.get('kernel_files')}")
    # When a run opens sysctls, its own /proc files and /sys knobs for writing
    denied = report(run(box, KERNEL_WRITES, tmp_path))
    # Then every open that the uid's permissions alone would allow is refused
    assert denied and all(denied.values()), denied

    # And what runs write every day still works: the scope, /tmp, /dev/shm, /dev/null, a re-open
    # through /proc/self/fd, memfd, /dev/stdout
    result = run(box, ORDINARY_WRITES, tmp_path)
    assert_status(result, "ok")
    assert result.stdout == "all written\n"
    assert (tmp_path / "in-scope.txt").read_text() == "re-opened"


RENAME_SPARES = """
import json, os
renamed, errors = [], []
for line in open("/proc/self/cgroup"):
    _, controllers, path = line.strip().split(":", 2)
    if "alphaagent-" not in path:
        continue
    for mount in [l.split()[4] for l in open("/proc/self/mountinfo") if l.partition(" - ")[2].split()[0] in ("cgroup", "cgroup2")]:
        mine = mount + path
        if not os.path.isdir(mine):
            continue
        parent = os.path.dirname(mine)
        for name in sorted(os.listdir(parent)):
            other = os.path.join(parent, name)
            if other == mine or not name.startswith("spare-"):
                continue
            try:
                os.rename(other, os.path.join(parent, "hidden-" + name))
                os.mkdir(other)  # a decoy under the old name, for the zygote to set limits on
                renamed.append(other)
            except OSError as exc:
                errors.append(exc.errno)
print(json.dumps({"renamed": renamed, "errors": errors}))
"""


def test_a_root_run_cannot_take_the_next_runs_cgroups_away(
    root_with_cgroups: None, box: Sandbox, tmp_path: Path
) -> None:
    # Given a root supervisor whose runs each get pids and memory cgroups made ahead with their spares
    if box.info.get("kernel_files") != "read_only":
        pytest.skip(f"this kernel cannot deny the writes: {box.info.get('kernel_files')}")
    # When a run renames the other spares' cgroups and makes decoys under their names
    first = report(run(box, RENAME_SPARES, tmp_path))
    # Then nothing was renamed
    assert first["renamed"] == [], first
    # And the next run is still held to its limits
    result = run(box, "import json\n" + FORK_BOMB, tmp_path, processes=20)
    assert json.loads(result.stdout.splitlines()[0])["forked"] < 20, result.stdout


def test_a_spare_whose_cgroups_were_moved_is_refused_even_where_runs_can_write_cgroupfs(
    root_with_cgroups: None, tmp_path: Path
) -> None:
    # Given a process-level sandbox without the Landlock rule, so a root run may rename cgroups
    with Sandbox(SandboxConfig(preload=(), isolation="process", landlock=False)) as sandbox:
        assert sandbox.info.get("kernel_files") == "writable"
        # When a run renames the other spares' cgroups and leaves decoys in their place
        first = report(run(sandbox, RENAME_SPARES, tmp_path))
        assert first["renamed"], first
        # Then the next runs get spares whose cgroups are where the zygote made them: each is held
        # to its process and memory limits
        bomb = run(sandbox, "import json\n" + FORK_BOMB, tmp_path, processes=20)
        assert json.loads(bomb.stdout.splitlines()[0])["forked"] < 20, bomb.stdout
        hog = run(sandbox, "import os\n" + MEMORY_HOG, tmp_path, memory_mb=256)
        assert (hog.status, hog.error and hog.error.name) == ("killed", "MemoryLimitExceeded"), hog
        assert hog.isolation.memory_bound == "cgroup"


OUTSIDE_WRITES = """
import errno, json
answers = {}
for path in PATHS:
    try:
        with open(path, "w") as fh:
            fh.write("x")
        answers[path] = "written"
    except OSError as exc:
        answers[path] = errno.errorcode[exc.errno]
print(json.dumps(answers))
"""


def test_a_run_at_each_level_is_in_a_landlock_domain_of_the_kernels_abi(box: Sandbox, tmp_path: Path) -> None:
    # Given a kernel with Landlock (ABI 2+), and a host folder outside /tmp (the run's own at the
    # namespaces level) the uid may write to
    abi = zygote._landlock_abi()
    if abi == 0:
        pytest.skip("this kernel has no usable Landlock")
    if not os.access("/var/tmp", os.W_OK):
        pytest.skip("no writable /var/tmp here")
    scope = tmp_path / "scope"
    scope.mkdir()
    beside = Path(f"/var/tmp/alphaagent-beside-{os.getpid()}-{tmp_path.name}.txt")
    paths = ["/proc/self/oom_score_adj", "in-scope.txt"]
    if box.isolation == "namespaces":
        paths.append(str(beside))  # the process level may write wherever its uid can (README)
    # When a run writes its own /proc file, a file in the scope and (with namespaces) one beside it
    result = run(box, f"PATHS = {paths!r}\n" + OUTSIDE_WRITES, scope)
    written_beside = beside.exists()
    beside.unlink(missing_ok=True)
    # Then the sandbox and the run report the kernel's ABI (the namespaces level had said 0), and
    # only the write in the scope was done
    assert_status(result, "ok")
    assert (box.info.get("landlock_abi"), result.isolation.landlock_abi) == (abi, abi)
    answers = report(result)
    assert answers.pop("in-scope.txt") == "written"
    assert set(answers.values()) <= {"EACCES", "EROFS"}, answers
    assert not written_beside


def test_the_namespaces_levels_landlock_rules_refuse_a_write_even_where_a_mount_would_allow_it(
    tmp_path: Path,
) -> None:
    # Given a process that enters the namespaces level's Landlock domain with one writable folder,
    # on a host where the folder beside it is writable too (no read-only mount in the way)
    abi = zygote._landlock_abi()
    if abi == 0:
        pytest.skip("this kernel has no usable Landlock")
    allowed, beside = tmp_path / "scope", tmp_path / "beside"
    allowed.mkdir()
    beside.mkdir()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child reports through the pipe)
        answers: dict[str, str] = {}
        try:
            zygote._prctl(zygote.PR_SET_NO_NEW_PRIVS, 1)
            zygote._enter_landlock_domain(abi, writable=(str(allowed),))
            for path in (allowed / "x", beside / "x", Path("/dev/null")):
                try:
                    with open(path, "w") as fh:
                        fh.write("x")
                    answers[str(path)] = "written"
                except OSError as exc:
                    answers[str(path)] = errno.errorcode[exc.errno or 0]
        except BaseException as exc:
            answers["failed"] = repr(exc)
        os.write(w, json.dumps(answers).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as fh:
        answers = json.loads(fh.read())
    os.waitpid(pid, 0)
    # Then it writes in that folder and to device files, and nowhere else
    assert answers == {str(allowed / "x"): "written", str(beside / "x"): "EACCES", "/dev/null": "written"}


CGROUP2_OF_ITS_OWN = """
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(name, *args):
    done = libc.syscall(NR[name], *(ctypes.c_long(a) if isinstance(a, int) else a for a in args))
    return done if done >= 0 else -ctypes.get_errno()
answers = {"unshare": call("unshare", 0x10000000 | 0x00020000 | 0x02000000)}  # user, mount, cgroup
fs = call("fsopen", b"cgroup2", 0)
answers["fsopen"] = fs if fs < 0 else "opened"
if fs >= 0:
    call("fsconfig", fs, 6, None, None, 0)  # FSCONFIG_CMD_CREATE
    mount = call("fsmount", fs, 0, 0)
    try:
        fd = os.open("cgroup.procs", os.O_WRONLY, dir_fd=mount)
        os.write(fd, str(os.getpid()).encode())
        answers["cgroup.procs"] = "written"
    except OSError as exc:
        answers["cgroup.procs"] = -exc.errno
print(json.dumps({k: errno.errorcode.get(-v, v) if isinstance(v, int) and v < 0 else v
                  for k, v in answers.items()}))
"""


def test_without_landlock_the_namespaces_level_is_read_only_beneath_cgroupfs_by_its_filter(
    tmp_path: Path,
) -> None:
    # Given a namespaces-level sandbox without the Landlock rules (landlock=False, as on an old kernel)
    with light_at("namespaces", landlock=False) as sandbox:
        if sandbox.info.get("process_calls") != "filtered":
            pytest.skip(f"no seccomp filter here: {sandbox.info.get('process_calls_detail')}")
        # When a run, with the network on and off, makes a user, mount and cgroup namespace of its
        # own to fsmount a writable cgroup2 and write its pid into cgroup.procs (a red-team run did)
        numbers = {name: seccomp.SYSCALLS[platform.machine()][name] for name in ("unshare", *seccomp.MOUNTS)}
        results = [
            sandbox.run(f"NR = {numbers!r}\n" + CGROUP2_OF_ITS_OWN, cwd=tmp_path, network=network)
            for network in (False, True)
        ]
    # Then both are refused, and the report's read_only stands on the filter that refused them
    for result in results:
        assert_status(result, "ok")
        assert json.loads(result.stdout) == {"unshare": "EPERM", "fsopen": "EPERM"}
        assert result.isolation.kernel_files == "read_only"
    assert sandbox.info.get("kernel_files") == "read_only"


@pytest.mark.parametrize(
    ("namespaced", "landlock", "process_calls", "expected"),
    [
        (True, 0, "filtered", "read_only"),  # read-only mounts, and no mount namespace of its own
        (True, 0, "open", "writable"),  # a user namespace and fsmount of a cgroup2 of its own
        (True, 7, "open", "read_only"),  # the Landlock domain grants no write beneath them
        (False, 7, "filtered", "read_only"),
        (False, 0, "filtered", "writable"),  # root writes cgroupfs files
    ],
)
def test_the_report_of_kernel_files_follows_what_is_in_force(
    namespaced: bool, landlock: int, process_calls: str, expected: str
) -> None:
    # When the zygote reports kernel_files for a level, a Landlock ABI and whether its filter works
    # Then it says read_only only where Landlock or (with namespaces) the filter keeps the writes out
    assert zygote.kernel_files(namespaced, landlock, process_calls) == expected
