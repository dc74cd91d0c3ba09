"""What a run cannot keep once its result is returned: its processes (even after forging a ``done``
report and closing every pipe), its shared mappings of the scope's files, and (at the
``namespaces`` level) its SysV IPC objects.

Found by a red-team review: a run that wrote ``{"phase": "done"}`` on fd 3 and closed fds 0-3 ended
its supervision while it went on running past its timeout, writing into the scope unreported until
the sandbox closed; and SysV shared memory crossed conversations for want of an IPC namespace.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from alphaagent.models.run import RunLimits, RunResult
from alphaagent.sandbox.classify import contradiction
from alphaagent.sandbox.config import SandboxConfig
from alphaagent.sandbox.supervisor import Sandbox

SCOPE_FOLDERS = ("docs", "work/runs", "work/sessions")
FORGE_AND_CLOSE = """
    import json, os
    os.write(3, (json.dumps({"phase": "done", "exit_code": 0, "error": None}) + "\\n").encode())
    for fd in (0, 1, 2, 3):
        os.close(fd)
"""
# Long past any timeout below: the run ends only if the sandbox ends it.
KEEPS_RUNNING_S = 120


@pytest.fixture(scope="module", params=["cloned", "helper", "process"])
def box(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    config = {
        "cloned": SandboxConfig(preload=()),
        "helper": SandboxConfig(preload=(), clone_spares=False),
        "process": SandboxConfig(preload=(), isolation="process"),
    }[request.param]
    with Sandbox(config) as sandbox:
        if request.param != "process" and sandbox.isolation != "namespaces":
            pytest.skip(f"user namespaces unavailable: {sandbox.info.get('isolation_detail')}")
        yield sandbox


@pytest.fixture
def namespaced(box: Sandbox) -> Sandbox:
    if box.isolation != "namespaces":
        pytest.skip("an IPC namespace of its own needs the namespaces level")
    return box


@pytest.fixture
def scope(tmp_path: Path) -> Path:
    root = tmp_path / "scope"
    for folder in SCOPE_FOLDERS:
        (root / folder).mkdir(parents=True)
    return root


def run(sandbox: Sandbox, code: str, cwd: Path, timeout_s: int = 10) -> RunResult:
    return sandbox.run(textwrap.dedent(code), cwd=cwd, limits=RunLimits(timeout_s=timeout_s))


def still_changing(path: Path, *, for_s: float = 1.0) -> bool:
    """Whether ``path`` changes (mtime or bytes) over ``for_s`` seconds, when its writer writes it
    every 50 ms."""
    before = (path.stat().st_mtime_ns, path.read_bytes())
    time.sleep(for_s)
    return (path.stat().st_mtime_ns, path.read_bytes()) != before


def mappers_of(path: Path) -> list[int]:
    """Pids (this pid namespace's) of every process that maps ``path`` (matched by device and inode,
    which /proc/<pid>/maps shows whatever mount namespace the mapper is in)."""
    st = path.stat()
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/maps") as fh:
                lines = fh.read().splitlines()
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) >= 5 and fields[3] == device and fields[4] == str(st.st_ino):
                found.append(int(name))
                break
    return found


# == a run is over when its exit is observed, not when its pipes close ============================


def test_a_forged_report_and_closed_pipes_do_not_let_a_run_outlive_its_timeout(
    box: Sandbox, scope: Path
) -> None:
    # Given code that forges a "done, exit 0" report, closes fds 0-3 and goes on writing into the
    # scope every 50 ms, far past its 2 s timeout
    code = (
        FORGE_AND_CLOSE
        + f"""
    import time
    end = time.monotonic() + {KEEPS_RUNNING_S}
    while time.monotonic() < end:
        with open("docs/tick", "w") as fh:
            fh.write(str(time.monotonic()))
        time.sleep(0.05)
    """
    )
    # When it runs with a 2 s timeout
    result = run(box, code, scope, timeout_s=2)

    # Then it timed out (its forged report counts for nothing), and nothing of it writes any more
    assert result.status == "timeout", (result.status, result.reason)
    assert (scope / "docs/tick").exists()
    assert not still_changing(scope / "docs/tick")
    # and the next run of the scope reports only its own changes
    after = run(box, "open('docs/mine', 'w').write('x')", scope)
    assert after.files_changed == ["docs/mine"], after.files_changed


def test_a_run_that_closes_its_pipes_and_exits_is_awaited_not_abandoned(box: Sandbox, scope: Path) -> None:
    # Given code that closes its pipes, then works a little longer and exits 3 (no report at all)
    code = """
    import os, time
    for fd in (0, 1, 2, 3):
        os.close(fd)
    time.sleep(0.5)
    open("docs/late", "w").write("late")
    os._exit(3)
    """
    # When it runs
    result = run(box, code, scope)

    # Then its real exit status is the result, and its last write is among its changes
    assert (result.status, result.exit_code) == ("error", 3), result.reason
    assert result.files_changed == ["docs/late"]


# == a shared mapping of the scope is not written after the run's result ==========================


def test_a_mapping_made_by_a_run_is_not_written_after_its_result(box: Sandbox, scope: Path) -> None:
    # Given a file in the scope, and code that maps it shared, forges its report, closes its pipes
    # and writes through the mapping every 50 ms (an mmap write is no syscall: no event, no ctime
    # until writeback)
    target = scope / "docs/mapped"
    target.write_bytes(b"0" * 4096)
    run(box, "pass", scope)  # the scope's state is kept (and trusted) from here on
    code = (
        FORGE_AND_CLOSE
        + f"""
    import mmap, time
    fd = os.open("docs/mapped", os.O_RDWR)
    m = mmap.mmap(fd, 0)
    os.close(fd)
    end, i = time.monotonic() + {KEEPS_RUNNING_S}, 0
    while time.monotonic() < end:
        i += 1
        m[0:8] = b"%08d" % (i % 10**8)
        time.sleep(0.05)
    """
    )
    # When it runs with a 2 s timeout
    result = run(box, code, scope, timeout_s=2)

    # Then when the result is returned, no process maps the file any more (the writer is dead), and
    # its bytes stay as they are
    assert result.status == "timeout", (result.status, result.reason)
    assert mappers_of(target) == []
    assert not still_changing(target)
    # and what the run wrote through the mapping is not reported later as another run's change
    later = run(box, "pass", scope)
    assert later.files_changed == [], later.files_changed


# == IPC: a namespace of the run's own ============================================================

# A key of this test run's own: a segment left on the host by a failed run cannot fail the next one.
SHM_KEY = secrets.randbits(30) + 1
SHMGET = """
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
"""


def _host_has_shm_key(key: int) -> bool:
    with open("/proc/sysvipc/shm") as fh:
        next(fh)
        return any(int(line.split()[0]) == key for line in fh if line.strip())


@pytest.fixture
def host_shm_cleared() -> Iterator[None]:
    """Remove the host's segment of ``SHM_KEY`` after the test, should a run (before the fix) have
    left one there: that key is this test's alone."""
    yield
    libc = ctypes.CDLL(None, use_errno=True)
    shmid = libc.shmget(SHM_KEY, 0, 0)
    if shmid >= 0:
        libc.shmctl(shmid, 0, None)  # IPC_RMID


@pytest.mark.usefixtures("host_shm_cleared")
def test_sysv_shared_memory_does_not_outlive_the_run_or_reach_another(
    namespaced: Sandbox, scope: Path
) -> None:
    assert not _host_has_shm_key(SHM_KEY)
    # Given a run that creates a 1 MiB SysV segment under a fixed key and writes a secret into it
    made = run(
        namespaced,
        SHMGET
        + f"""
    shmid = libc.shmget({SHM_KEY}, 1 << 20, 0o1666)
    assert shmid >= 0, os.strerror(ctypes.get_errno())
    addr = libc.shmat(shmid, None, 0)
    ctypes.memmove(addr, b"secret-of-run-A", 15)
    print(os.readlink("/proc/self/ns/ipc"))
    """,
        scope,
    )
    assert made.status == "ok", (made.reason, made.stderr)

    # Then it lived in an IPC namespace of the run's own, gone with it: not on the host
    assert made.stdout.strip() != os.readlink("/proc/self/ns/ipc")
    assert not _host_has_shm_key(SHM_KEY)
    # and a later run (of any conversation) does not find it by its key
    later = run(
        namespaced,
        SHMGET + f"    print(libc.shmget({SHM_KEY}, 0, 0), ctypes.get_errno())\n",
        scope,
    )
    assert later.stdout.split() == ["-1", "2"], later.stdout  # ENOENT


def test_an_unconfirmed_report_names_why_its_exit_is_unknown() -> None:
    # Given a "done" report and no wait status: the zygote alive (it reported no exit even after the
    # kill), or the zygote dead
    report = {"phase": "done", "exit_code": 0, "error": None}

    # Then the reason says which, and never blames a live zygote
    alive = contradiction(report, None)
    dead = contradiction(report, None, zygote_died=True)
    assert alive is not None and "zygote" not in alive and "even after it was killed" in alive
    assert dead is not None and "the zygote died" in dead
