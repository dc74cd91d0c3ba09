"""What a run cannot fake or plant (issue 10, items 2, 3, 7, 8, 9, 10): its exit status, the
environment of the processes around it, the modules of later runs; and the walks and copies of what
it leaves behind, whatever their depth or sparseness.

Each test runs at the levels it applies to (``namespaces``, ``process``). Tests about the uid the
run shares with its ancestors run twice: as this uid (root in CI) and as an unprivileged uid inside
a throwaway user + pid namespace (``unshare --user --map-user=1000``). That uid has no capability
and shares nothing with the host's processes, so the test sees exactly the standing of a developer's
shell; a ``useradd`` account would need the test interpreter (here under ``/root``, mode 0700) to be
readable by it, which the namespace does not.
"""

from __future__ import annotations

import errno
import hashlib
import importlib.util
import json
import os
import py_compile
import secrets
import select
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from assertions import assert_status

from alphaagent.local import safefs
from alphaagent.models.run import RunLimits, RunResult
from alphaagent.sandbox.config import SandboxConfig
from alphaagent.sandbox.pathsafe import MAX_WALK_DEPTH
from alphaagent.sandbox.snapshot import REASON_TOO_DEEP, diff_snapshots, take_snapshot
from alphaagent.sandbox.supervisor import Sandbox

MiB = 2**20
SCOPE_FOLDERS = ("spec", "docs", "datasets", "charts", "reports", "work")
FORGED_OK = '{"phase": "done", "exit_code": 0, "error": null, "memory_error": false, "interrupted": false}'


@pytest.fixture(scope="module")
def namespaced() -> Iterator[Sandbox]:
    with Sandbox(SandboxConfig(preload=())) as box:
        if box.isolation != "namespaces":
            pytest.skip(f"user namespaces unavailable: {box.info.get('isolation_detail')}")
        yield box


@pytest.fixture(scope="module")
def process_level() -> Iterator[Sandbox]:
    with Sandbox(SandboxConfig(isolation="process", preload=())) as box:
        yield box


@pytest.fixture(params=["namespaces", "process"])
def box(request: pytest.FixtureRequest) -> Sandbox:
    box: Sandbox = request.getfixturevalue("namespaced" if request.param == "namespaces" else "process_level")
    return box


@pytest.fixture
def scope(tmp_path: Path) -> Path:
    root = tmp_path / "scope"
    for folder in SCOPE_FOLDERS:
        (root / folder).mkdir(parents=True)
    return root


def run(sandbox: Sandbox, code: str, cwd: Path) -> RunResult:
    return sandbox.run(textwrap.dedent(code), cwd=cwd, limits=RunLimits(timeout_s=10))


# == item 2: the real exit status and signal win over anything the code reports ====================


def test_a_forged_done_report_cannot_turn_exit_3_into_ok(box: Sandbox, scope: Path) -> None:
    # Given code that writes a well-formed "done, exit 0" report to the status descriptor, closes it
    # so the genuine report cannot follow, and exits 3
    code = f"""
        import os, sys
        os.write(3, b'{FORGED_OK}\\n')
        os.close(3)
        sys.exit(3)
    """
    # When it runs
    result = run(box, code, scope)

    # Then the exit status from waitpid decides, and the contradiction is named
    assert (result.status, result.exit_code) == ("error", 3), result.reason
    assert result.error is not None and result.error.name == "StatusReportTampered"
    assert "contradicts its real exit status (3)" in (result.reason or "")


def test_a_status_number_reused_for_a_file_changes_nothing(box: Sandbox, scope: Path) -> None:
    # Given code that closes the status descriptor, opens a file that gets its number, writes a
    # forged report there, then fails
    code = f"""
        import os
        os.close(3)
        fd = os.open("work/fake-status", os.O_WRONLY | os.O_CREAT)
        assert fd == 3, fd
        os.write(fd, b'{FORGED_OK}\\n')
        raise SystemExit(3)
    """
    # When it runs
    result = run(box, code, scope)

    # Then the run is a failure with its real exit status
    assert (result.status, result.exit_code) == ("error", 3), result.reason


def test_a_real_signal_wins_over_a_forged_report(box: Sandbox, scope: Path) -> None:
    # Given code that writes a forged "ok" report and then dies of SIGKILL
    code = f"""
        import os, signal
        os.write(3, b'{FORGED_OK}\\n')
        os.kill(os.getpid(), signal.SIGKILL)
    """
    # When it runs
    result = run(box, code, scope)

    # Then the signal decides
    assert (result.status, result.exit_code) == ("killed", -9), result.reason
    assert result.reason is not None and result.reason.startswith(
        "killed by SIGKILL: not by a limit of this run"
    )


@pytest.mark.parametrize("how", ["sys.exit(137)", "os._exit(137)"])
def test_exit_status_137_is_an_exit_status_not_a_signal(box: Sandbox, scope: Path, how: str) -> None:
    # Given code that exits with 137, which a namespace init encoding signals as 128 + N would
    # confuse with SIGKILL
    # When it runs
    result = run(box, f"import os, sys\n{how}\n", scope)

    # Then the result says exit 137, not killed
    assert (result.status, result.exit_code) == ("error", 137), result.reason


def test_usage_figures_come_from_the_wait_status_not_the_report(box: Sandbox, scope: Path) -> None:
    # Given code that burns some CPU and then reports a genuine-looking report claiming none
    code = """
        import os, sys, time
        end = time.process_time() + 0.3
        while time.process_time() < end:
            pass
        os.write(3, b'{"phase": "done", "exit_code": 0, "error": null, "cpu_s": 0, "maxrss_kb": 1}\\n')
        os.close(3)
    """
    # When it runs (exit 0: the report agrees with the exit status)
    result = run(box, code, scope)

    # Then the CPU time is the kernel's account, not the report's
    assert_status(result, "ok", result.reason)
    assert result.cpu_ms is not None and result.cpu_ms >= 250
    assert result.peak_rss_mb is not None and result.peak_rss_mb > 1


# == item 10: the standard streams are the run's pipes ============================================


def test_stdout_can_be_reconfigured_and_says_it_is_not_seekable(box: Sandbox, scope: Path) -> None:
    # Given code that reconfigures both output streams, as users do for their encoding
    code = """
        import sys
        sys.stdout.reconfigure(encoding="utf-8", errors="strict")
        sys.stderr.reconfigure(errors="replace")
        print(sys.stdout.seekable(), sys.stderr.seekable(), type(sys.stdout.buffer).__name__)
        sys.stdout.buffer.write(b"raw bytes\\n")
        sys.stdout.buffer.flush()
        print("caf\\u00e9", file=sys.stderr)
    """
    # When it runs
    result = run(box, code, scope)

    # Then nothing raises, the pipes say they cannot seek, and every write arrives
    assert_status(result, "ok")
    assert result.stdout == "False False BufferedWriter\nraw bytes\n"
    assert result.stderr == "caf\u00e9\n"


# == item 7: nothing planted in the scope runs in a later run =====================================


def test_a_module_planted_under_a_standard_name_does_not_shadow_it(box: Sandbox, scope: Path) -> None:
    # Given a run that leaves json.py and a third-party-named package in the scope
    plant = """
        import os
        with open("json.py", "w") as fh:
            fh.write("print('PLANTED json')\\nPLANTED = True\\n")
        os.makedirs("numpy", exist_ok=True)
        with open("numpy/__init__.py", "w") as fh:
            fh.write("print('PLANTED numpy')\\n")
    """
    assert_status(run(box, plant, scope), "ok")
    # When a later run of the scope imports those names
    code = """
        import json, sys
        print(hasattr(json, "PLANTED"), json.__file__.startswith(sys.base_prefix))
        print(sys.path[-1] == __import__("os").getcwd())
    """
    result = run(box, code, scope)

    # Then it gets the standard library, and the scope is the last place looked in
    assert_status(result, "ok")
    assert result.stdout == "False True\nTrue\n"
    assert "PLANTED" not in result.stdout


def test_files_move_and_link_across_directories(box: Sandbox, scope: Path) -> None:
    # Given code that renames and hard-links files between folders (a Landlock domain refuses both
    # unless it grants them)
    code = """
        import os
        open("work/a.csv", "w").write("1")
        os.rename("work/a.csv", "datasets/a.csv")
        os.link("datasets/a.csv", "reports/a.csv")
        print(sorted(os.listdir("datasets")), sorted(os.listdir("reports")))
    """
    # When it runs
    result = run(box, code, scope)

    # Then both work
    assert (result.status, result.stdout) == ("ok", "['a.csv'] ['a.csv']\n"), result.error


def test_user_modules_in_the_scope_still_import(box: Sandbox, scope: Path) -> None:
    # Given the scope's own module and package (names nothing else has)
    (scope / "work" / "helpers_x1.py").write_text("VALUE = 41\n")
    (scope / "mypkg_x1").mkdir()
    (scope / "mypkg_x1" / "__init__.py").write_text("")
    (scope / "mypkg_x1" / "sub.py").write_text("from . import helper\nVALUE = helper.ONE\n")
    (scope / "mypkg_x1" / "helper.py").write_text("ONE = 1\n")
    code = """
        import sys
        sys.path.append("work")
        import helpers_x1, mypkg_x1.sub
        print(helpers_x1.VALUE + mypkg_x1.sub.VALUE)
    """
    # When a run imports them
    result = run(box, code, scope)

    # Then they import from source, and no bytecode is written into the scope
    assert (result.status, result.stdout) == ("ok", "42\n"), result.error
    assert not list(scope.rglob("*.pyc")) and not list(scope.rglob("__pycache__"))


def _plant_bytecode(scope: Path, module: str, code: str, mode: py_compile.PycInvalidationMode) -> None:
    """Put bytecode compiled from ``code`` where ``module``'s cache file goes, next to its real source."""
    decoy = scope / "decoy_src.py"
    decoy.write_text(code)
    cache = importlib.util.cache_from_source(str(scope / f"{module}.py"))
    py_compile.compile(str(decoy), cfile=cache, invalidation_mode=mode, doraise=True)
    decoy.unlink()
    if mode is py_compile.PycInvalidationMode.TIMESTAMP:
        # Make the header match the real source: same mtime and size.
        source = scope / f"{module}.py"
        header = bytearray(Path(cache).read_bytes())
        st = source.stat()
        header[8:12] = int(st.st_mtime).to_bytes(4, "little")
        header[12:16] = (st.st_size & 0xFFFFFFFF).to_bytes(4, "little")
        Path(cache).write_bytes(bytes(header))


@pytest.mark.parametrize(
    "mode",
    [py_compile.PycInvalidationMode.UNCHECKED_HASH, py_compile.PycInvalidationMode.TIMESTAMP],
    ids=["unchecked-hash", "matching-timestamp"],
)
def test_stale_bytecode_in_the_scope_never_runs(
    box: Sandbox, scope: Path, mode: py_compile.PycInvalidationMode
) -> None:
    # Given a module whose __pycache__ holds bytecode of different code (with a header that claims
    # it is current), and a bare .pyc with no source
    (scope / "report_x1.py").write_text("print('from source')\n")
    _plant_bytecode(scope, "report_x1", "print('PLANTED bytecode')\n", mode)
    py_compile.compile(str(scope / "report_x1.py"), cfile=str(scope / "bare_x1.pyc"), doraise=True)
    code = """
        import report_x1
        try:
            import bare_x1
            print("bare imported")
        except ImportError:
            print("no bare")
    """
    # When a run imports them
    result = run(box, code, scope)

    # Then the source runs, and the bytecode-only module is not importable from the scope
    assert (result.status, result.stdout) == ("ok", "from source\nno bare\n"), result.error


# == item 3: no credential of the processes around the run is readable ============================

ANCESTOR = """
import os, subprocess, sys
# Holds the credentials in its own exec-time environment (as a shell or a CLI wrapper would) and
# starts the supervisor without them, so output redaction cannot help: the supervisor never saw them.
env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
sys.exit(subprocess.run(sys.argv[1:], env=env).returncode)
"""

SUPERVISOR = """
import json, os, sys
from pathlib import Path
from alphaagent.errors import SandboxError
from alphaagent.sandbox.config import SandboxConfig
from alphaagent.sandbox.supervisor import Sandbox

for line in sys.stdin:  # one spec a line (one alone for a single run), one report a line
    spec = json.loads(line)
    report = {"supervisor_pid": os.getpid(), "ancestor_pid": os.getppid()}
    try:
        with Sandbox(SandboxConfig(**spec["config"])) as sandbox:
            report["result"] = sandbox.run(spec["code"], cwd=Path(spec["cwd"])).model_dump(mode="json")
    except SandboxError as exc:
        report["refused"] = str(exc)
    print(json.dumps(report), flush=True)
"""

# An unprivileged uid and a private /proc (see the module docstring).
UNPRIVILEGED = ["unshare", "--user", "--map-user=1000", "--map-group=1000", "--pid", "--fork", "--mount-proc"]


def environ_probe(values: list[str]) -> str:
    """Code that looks for ``values`` in every /proc/<pid>/environ it can read; prints pids only."""
    return f"""
import json, os
NEEDLES = [v.encode() for v in {values!r}]
report = {{"listed": [], "readable": [], "leaks": []}}
for name in filter(str.isdigit, os.listdir("/proc")):
    report["listed"].append(int(name))
    try:
        data = open(f"/proc/{{name}}/environ", "rb").read()
    except OSError:
        continue
    report["readable"].append(int(name))
    if any(n in data for n in NEEDLES):
        report["leaks"].append(int(name))
report["self_readable"] = b"PATH=" in open("/proc/self/environ", "rb").read()
print(json.dumps(report))
"""


class _BehindAnAncestor:
    """A supervisor whose parent process holds fake AWS credentials, serving one spec a line (each
    gets a Sandbox, a zygote, of its own): one pair of processes per kind of uid for the module."""

    def __init__(self, unprivileged: bool) -> None:
        self.fake = {
            "AWS_ACCESS_KEY_ID": f"ASIA{secrets.token_hex(8).upper()}",
            "AWS_SECRET_ACCESS_KEY": f"fakeSecret{secrets.token_hex(16)}",
            "AWS_SESSION_TOKEN": f"FakeSessionToken{secrets.token_hex(24)}",
        }
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp", **self.fake}
        if "PYTHONPATH" in os.environ:
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        self.process = subprocess.Popen(
            [*(UNPRIVILEGED if unprivileged else []), sys.executable, "-c", ANCESTOR, *SUPERVISING],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )

    def ask(self, spec: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(spec) + "\n")
        self.process.stdin.flush()
        # One line a spec: nothing is buffered past it, so the descriptor says when the next is there.
        ready, _, _ = select.select([self.process.stdout], [], [], 120)
        if not ready:
            self.process.kill()
            raise AssertionError("the supervisor did not answer in 120 s")
        line = self.process.stdout.readline()
        assert line, f"the supervisor exited with {self.process.wait()}"
        out: dict[str, Any] = json.loads(line)
        return out

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


SUPERVISING = [sys.executable, "-c", SUPERVISOR]
_ANCESTORS: dict[bool, _BehindAnAncestor] = {}


@pytest.fixture(scope="module", autouse=True)
def _close_ancestors() -> Iterator[None]:
    yield
    while _ANCESTORS:
        _ANCESTORS.popitem()[1].close()


def run_behind_an_ancestor(config: dict[str, Any], scope: Path, *, unprivileged: bool) -> dict[str, Any]:
    """Run one probe in a supervisor whose parent process holds fake AWS credentials."""
    server = _ANCESTORS.get(unprivileged)
    if server is None or server.process.poll() is not None:
        server = _ANCESTORS[unprivileged] = _BehindAnAncestor(unprivileged)
    out = server.ask({"config": config, "code": environ_probe(list(server.fake.values())), "cwd": str(scope)})
    out["fake"] = server.fake
    return out


def _require_unprivileged_namespace() -> None:
    if shutil.which("unshare") is None:
        pytest.skip("util-linux unshare is not installed")
    probe = subprocess.run([*UNPRIVILEGED, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"the kernel refuses an unprivileged user namespace: {probe.stderr.strip()}")


@pytest.fixture(params=["this-uid", "unprivileged"])
def unprivileged(request: pytest.FixtureRequest) -> bool:
    if request.param == "unprivileged":
        _require_unprivileged_namespace()
    return bool(request.param == "unprivileged")


@pytest.mark.parametrize("isolation", ["auto", "process"])
def test_an_ancestors_credentials_are_unreadable_by_the_run(
    tmp_path: Path, isolation: str, unprivileged: bool
) -> None:
    # Given a supervisor started by a process that holds AWS credentials in its environment
    scope = tmp_path / "scope"
    scope.mkdir()
    # When its run reads every /proc/<pid>/environ it can list
    out = run_behind_an_ancestor({"isolation": isolation, "preload": []}, scope, unprivileged=unprivileged)

    # Then no credential is found: the ancestor is invisible (namespaces) or unreadable (Landlock at
    # the process level), or the process level refuses to start at all
    if "refused" in out:
        assert "AWS_" in out["refused"] and not any(v in out["refused"] for v in out["fake"].values())
        return
    result = RunResult.model_validate(out["result"])
    report = json.loads(result.stdout)
    assert_status(result, "ok")
    assert report["self_readable"] and report["leaks"] == []
    if result.isolation == "process":  # (with namespaces, pid numbers are the run's own)
        assert out["ancestor_pid"] in report["listed"]
        assert out["ancestor_pid"] not in report["readable"]


def test_without_landlock_the_process_level_refuses_a_readable_credential(
    tmp_path: Path, unprivileged: bool
) -> None:
    # Given the process level without Landlock, started by a process that holds AWS credentials
    scope = tmp_path / "scope"
    scope.mkdir()
    # When the sandbox starts
    out = run_behind_an_ancestor(
        {"isolation": "process", "preload": [], "landlock": False}, scope, unprivileged=unprivileged
    )

    # Then it refuses, naming the process and the variables, never a value. As root the run could
    # not read the ancestor anyway (its capabilities are a superset of the run's, which have all
    # been dropped: commoncap's ptrace rule), so there the run may start, and must find nothing.
    if "result" in out and not unprivileged:
        assert json.loads(RunResult.model_validate(out["result"]).stdout)["leaks"] == []
        return
    assert "result" not in out, "a run started although its uid could read a credential"
    message = out["refused"]
    assert message.startswith("process isolation refused: pid ")
    assert "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN" in message
    assert not any(value in message for value in out["fake"].values())


def test_without_landlock_the_process_level_runs_when_nothing_readable_holds_one(tmp_path: Path) -> None:
    # Given the process level without Landlock, as an unprivileged uid in a private pid namespace
    # where nothing holds a credential (on the host, this uid's other processes might)
    _require_unprivileged_namespace()
    scope = tmp_path / "scope"
    scope.mkdir()
    spec = {
        "config": {"isolation": "process", "preload": [], "landlock": False},
        "code": "print(1)",
        "cwd": str(scope),
    }
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(scope)}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    completed = subprocess.run(
        [*UNPRIVILEGED, sys.executable, "-c", SUPERVISOR],
        input=json.dumps(spec),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # When the sandbox starts and runs code
    out = json.loads(completed.stdout)

    # Then it runs
    assert "refused" not in out, out
    assert RunResult.model_validate(out["result"]).stdout == "1\n"


# == item 8: walks cost O(entries) and stop at a documented depth =================================


def _chain(root: Path, depth: int) -> Path:
    """``root/d/d/.../d`` ``depth`` levels deep with a file at the bottom; made with descriptors so
    the path length never matters."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            next_fd = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = next_fd
        with open(os.open("bottom.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as fh:
            fh.write("deep")
    finally:
        os.close(fd)
    return root


class _OpenCounter:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = os.open

        def counting(*args: Any, **kwargs: Any) -> int:
            self.count += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(os, "open", counting)


def test_listing_a_deep_tree_opens_each_directory_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a chain of 400 directories with a file at the bottom, and one beside the top
    root = tmp_path / "tree"
    root.mkdir()
    _chain(root, 400)
    (root / "top.txt").write_text("top")
    fd = safefs.open_root(root)
    try:
        # When its regular files are listed
        counter = _OpenCounter(monkeypatch)
        files = [path for path, _ in safefs.iter_regular_files(fd)]
        monkeypatch.undo()
    finally:
        os.close(fd)

    # Then both are found, with one open per directory (re-opening each from the root made it
    # 400 * 401 / 2 = 80,200 opens, tens of seconds at 6,000 levels)
    assert files == ["top.txt", "d/" * 400 + "bottom.txt"]
    assert counter.count <= 401


def test_listing_stops_at_the_depth_bound_and_reports_what_it_skipped(tmp_path: Path) -> None:
    # Given a chain deeper than the bound
    root = tmp_path / "tree"
    root.mkdir()
    _chain(root, MAX_WALK_DEPTH + 20)
    fd = safefs.open_root(root)
    try:
        # When its regular files are listed
        skipped: list[tuple[str, str]] = []
        files = list(safefs.iter_regular_files(fd, skipped))
    finally:
        os.close(fd)

    # Then nothing below the bound is listed, and the first directory below it is reported
    assert files == []
    assert skipped == [("d/" * MAX_WALK_DEPTH + "d", safefs.TOO_DEEP_REASON)]
    assert safefs.TOO_DEEP_REASON == "directory deeper than 512 levels (not listed)"


def test_snapshot_of_a_deep_tree_opens_each_directory_once_and_reports_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a scope, and then a run that leaves a chain deeper than the bound in it
    scope = tmp_path / "scope"
    scope.mkdir()
    before = take_snapshot(scope)
    _chain(scope, MAX_WALK_DEPTH + 5)

    # When it is snapshotted and diffed
    counter = _OpenCounter(monkeypatch)
    after = take_snapshot(scope)
    monkeypatch.undo()
    changes = diff_snapshots(before, after)

    # Then each directory was opened once, and the part below the bound is reported, not claimed
    # created or deleted
    assert counter.count <= MAX_WALK_DEPTH + 2
    deep = "/".join(["d"] * (MAX_WALK_DEPTH + 1))
    assert after.too_deep == (deep,)
    assert changes.created == ()
    assert [(s.path, s.reason) for s in changes.skipped] == [(deep, REASON_TOO_DEEP)]


# == item 9: sparse files stay sparse =============================================================


def _sparse_file(path: Path, size: int, data_at: int) -> str:
    with open(path, "wb") as fh:
        fh.truncate(size)
        fh.seek(data_at)
        fh.write(b"x" * 4096)
    if os.stat(path).st_blocks * 512 >= size:
        pytest.skip(f"{path.parent} is on a filesystem without sparse files")
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(16 * MiB):
            digest.update(block)
    return digest.hexdigest()


def test_a_sparse_file_is_copied_sparsely_with_the_hash_of_its_content(tmp_path: Path) -> None:
    # Given a 256 MiB file holding 4 KiB of data in the middle
    source = tmp_path / "sparse.bin"
    expected = _sparse_file(source, 256 * MiB, 128 * MiB)
    destination = tmp_path / "copy.bin"

    # When it is copied into the blob store's temporary file
    with open(source, "rb") as src, open(destination, "wb") as dst:
        digest, size = safefs.copy_and_hash(src.fileno(), dst.fileno())

    # Then the copy has the same bytes and hash, and takes about what the data takes, not 256 MiB
    assert (digest, size) == (expected, 256 * MiB)
    assert _sha256(destination) == expected
    assert os.stat(destination).st_blocks * 512 <= 1 * MiB


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(16 * MiB):
            digest.update(block)
    return digest.hexdigest()


def test_zero_blocks_of_a_dense_file_are_not_written(tmp_path: Path) -> None:
    # Given a dense file of 8 MiB of zeros and a little data
    source = tmp_path / "dense.bin"
    source.write_bytes(bytes(8 * MiB) + b"tail")
    destination = tmp_path / "copy.bin"

    # When it is copied
    with open(source, "rb") as src, open(destination, "wb") as dst:
        digest, size = safefs.copy_and_hash(src.fileno(), dst.fileno())

    # Then the bytes are the same and the zeros became a hole (where the filesystem has them)
    assert destination.read_bytes() == source.read_bytes()
    assert (digest, size) == (hashlib.sha256(source.read_bytes()).hexdigest(), 8 * MiB + 4)
    probe = tmp_path / "probe"
    _sparse_file(probe, 4 * MiB, 0)
    assert os.stat(destination).st_blocks * 512 <= 2 * MiB


def test_an_empty_file_copies_to_an_empty_file(tmp_path: Path) -> None:
    source, destination = tmp_path / "empty", tmp_path / "copy"
    source.write_bytes(b"")
    with open(source, "rb") as src, open(destination, "wb") as dst:
        assert safefs.copy_and_hash(src.fileno(), dst.fileno()) == (hashlib.sha256(b"").hexdigest(), 0)
    assert destination.read_bytes() == b""


def test_registering_a_sparse_artifact_twice_stores_two_sparse_blobs(tmp_path: Path) -> None:
    # Given a scope with a 128 MiB sparse dataset, registered, then rewritten and registered again
    from alphaagent.local.workspace import LocalWorkspace
    from alphaagent.models.common import ConversationScope

    home = tmp_path / "home"
    workspace = LocalWorkspace(home)
    scope = ConversationScope(conversation_id="c1")
    folder = home / scope.key / "datasets"
    folder.mkdir(parents=True)
    stored = []
    for version in range(2):
        _sparse_file(folder / "big.bin", 128 * MiB, version * 4096)
        # When it is registered
        digest, size = workspace.put_blob(scope, "datasets/big.bin")
        stored.append((digest, size))

    # Then each version is stored whole (128 MiB each, two different blobs) in a few KiB of disk
    assert stored[0][0] != stored[1][0] and {size for _, size in stored} == {128 * MiB}
    blobs = [p for p in (home / "blobs" / "sha256").rglob("*") if p.is_file()]
    assert len(blobs) == 2
    assert sum(os.stat(p).st_blocks * 512 for p in blobs) <= 1 * MiB


def test_a_file_on_a_filesystem_without_seek_data_is_copied_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a filesystem where SEEK_DATA is not supported
    source, destination = tmp_path / "file", tmp_path / "copy"
    source.write_bytes(b"abc" * 1000)
    real_lseek = os.lseek

    def no_seek_data(fd: int, pos: int, how: int) -> int:
        if how in (os.SEEK_DATA, os.SEEK_HOLE):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_lseek(fd, pos, how)

    monkeypatch.setattr(os, "lseek", no_seek_data)
    # When a file is copied there
    with open(source, "rb") as src, open(destination, "wb") as dst:
        digest, size = safefs.copy_and_hash(src.fileno(), dst.fileno())

    # Then it is copied whole
    assert destination.read_bytes() == source.read_bytes() and size == 3000
    assert digest == hashlib.sha256(source.read_bytes()).hexdigest()


def test_a_status_line_nested_past_the_parser_is_ignored_not_a_crash(box: Sandbox, scope: Path) -> None:
    # Given code that writes a done line nested 200,000 levels deep on the status channel
    code = """
        import os
        os.write(3, b'{"phase": "done", "x": ' + b"[" * 200_000 + b"\\\\n")
        os.close(3)
    """
    # When it runs, Then a result comes back: the line is not the child's report
    result = run(box, code, scope)
    assert result.exit_code == 0, result.reason


def test_a_session_manifest_nested_past_the_parser_names_no_state_files(tmp_path: Path) -> None:
    from alphaagent.sandbox.session import MANIFEST, state_files, state_path

    folder = tmp_path / state_path("s-deep")
    folder.mkdir(parents=True)
    (folder / MANIFEST).write_bytes(b'{"pickle": ' + b"[" * 200_000)
    assert state_files(tmp_path, "s-deep") == []
