"""The run's view of the file systems at the namespaces level, where a new user met it failing:

- an interpreter reached through a symbolic link under /tmp (``/tmp/x/py -> a venv``): the run's
  /tmp is a fresh tmpfs, and binding back only the link's resolved folders left the name that
  ``sys.prefix``, ``sys.path`` and ``sys.executable`` use dangling: every import from
  site-packages and every ``subprocess.run([sys.executable, ...])`` failed;
- a scope on a file system mounted after the sandbox started: the spares, forked with a copy of the
  mount table, did not have it, and the run failed with ``could not start: FileNotFoundError``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from assertions import assert_status
from sandboxes import light_at

from alphaagent.errors import SandboxError
from alphaagent.models.run import RunLimits

THROUGH_THE_LINK = """
import os, subprocess, sys
import annotated_types  # from site-packages, never imported by the zygote
child = subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True)
print(sys.prefix, os.path.islink(sys.prefix), child.stdout.strip() or child.stderr)
"""


@contextlib.contextmanager
def _own_folder(parent: str) -> Iterator[Path]:
    """A new folder of our own right under ``parent``, removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="s7view", dir=parent))
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


@pytest.fixture
def link_dir() -> Iterator[Path]:
    """A folder of our own right under /tmp (pytest's own may be elsewhere on another machine)."""
    with _own_folder("/tmp") as folder:
        yield folder


def test_an_interpreter_reached_through_a_link_under_tmp_imports_and_execs_itself(
    link_dir: Path, tmp_path: Path
) -> None:
    # Given this venv reached through a link under /tmp (its interpreter is a link itself)
    venv = Path(sys.prefix)
    if venv == Path(sys.base_prefix):
        pytest.skip("the tests run outside a venv: no prefix of their own to link to")
    link = link_dir / "py"
    link.symlink_to(venv)
    scope = tmp_path / "scope"
    scope.mkdir()
    # When a run of a sandbox started with that interpreter imports from site-packages and runs it
    with light_at("namespaces", python=str(link / "bin" / "python")) as sandbox:
        result = sandbox.run(THROUGH_THE_LINK, cwd=scope, limits=RunLimits(timeout_s=60))
    # Then both work, through the link's own name
    assert_status(result, "ok")
    assert result.stdout == f"{link} True 42\n"


def test_the_link_is_made_again_only_in_the_run_s_own_tmp(link_dir: Path, tmp_path: Path) -> None:
    # Given the same interpreter through a link, next to a file that is not the interpreter's
    venv = Path(sys.prefix)
    if venv == Path(sys.base_prefix):
        pytest.skip("the tests run outside a venv: no prefix of their own to link to")
    (link_dir / "py").symlink_to(venv)
    (link_dir / "secret.txt").write_text("not for runs")
    scope = tmp_path / "scope"
    scope.mkdir()
    code = f"import os\nprint(sorted(os.listdir({str(link_dir)!r})))\nos.remove({str(link_dir / 'py')!r})\n"
    # When a run lists the link's folder and removes the link
    with light_at("namespaces", python=str(link_dir / "py" / "bin" / "python")) as sandbox:
        result = sandbox.run(code, cwd=scope, limits=RunLimits(timeout_s=60))
    # Then it saw the link alone (nothing else of the folder), and the host's link is untouched
    assert_status(result, "ok")
    assert result.stdout == "['py']\n"
    assert (link_dir / "py").is_symlink() and (link_dir / "secret.txt").exists()


_libc = ctypes.CDLL(None, use_errno=True)


def _mount_tmpfs(target: Path) -> None:
    if _libc.mount(b"tmpfs", str(target).encode(), b"tmpfs", 0, b"size=1m") != 0:
        pytest.skip(f"cannot mount a tmpfs here: {os.strerror(ctypes.get_errno())}")


def _unmount(target: Path) -> None:
    _libc.umount2(str(target).encode(), 2)  # MNT_DETACH


def test_a_scope_on_a_file_system_mounted_after_the_start_runs(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a file system needs root here")
    late = tmp_path / "late"
    late.mkdir()
    with light_at("namespaces") as sandbox:
        # Given a sandbox whose spares are ready (a first run was served)
        first = sandbox.run("print(1)", cwd=tmp_path, limits=RunLimits(timeout_s=60))
        assert_status(first, "ok")
        # When a file system is mounted after that, and a run's scope is on it
        _mount_tmpfs(late)
        try:
            scope = late / "scope"
            scope.mkdir()
            result = sandbox.run(
                "open('made.txt', 'w').write('here')", cwd=scope, limits=RunLimits(timeout_s=60)
            )
            # Then the run works, and its file is on the new file system
            assert_status(result, "ok")
            assert (scope / "made.txt").read_text() == "here"
        finally:
            _unmount(late)


def test_a_run_whose_directory_is_missing_from_its_view_says_which(tmp_path: Path) -> None:
    from alphaagent.sandbox import zygote

    # Given a working directory that is not there
    missing = tmp_path / "gone"
    # When the run's view is prepared for it, Then the refusal names the directory
    with pytest.raises(zygote.SetupError) as refused:
        zygote._hold(str(missing), "the working directory")
    assert str(refused.value) == (
        f"the working directory {missing}: No such file or directory in the run's view of the file systems"
    )


def test_a_link_rewritten_after_the_start_never_binds_back_a_hidden_folder(
    link_dir: Path, tmp_path: Path
) -> None:
    # Given a sandbox whose interpreter is reached through a link under /tmp, and a hidden folder
    venv = Path(sys.prefix)
    if venv == Path(sys.base_prefix):
        pytest.skip("the tests run outside a venv: no prefix of their own to link to")
    hidden = tmp_path / "hidden"
    (hidden / "bin").mkdir(parents=True)
    (hidden / "secret.txt").write_text("not for runs")
    link = link_dir / "py"
    link.symlink_to(venv)
    scope = tmp_path / "scope"
    scope.mkdir()
    look = (
        f"import os\nprint(os.path.exists({str(hidden / 'secret.txt')!r}),"
        f" os.path.exists({str(link / 'pyvenv.cfg')!r}))\n"
    )
    with light_at("namespaces", python=str(link / "bin" / "python"), hidden_paths=(str(hidden),)) as sandbox:
        first = sandbox.run(look, cwd=scope, limits=RunLimits(timeout_s=60))
        assert_status(first, "ok")
        # When the link is pointed at the hidden folder after the start (as a process-level run of
        # the same uid could do in the host's /tmp, or a run in a scope holding the interpreter)
        link.unlink()
        link.symlink_to(hidden)
        second = sandbox.run(look, cwd=scope, limits=RunLimits(timeout_s=60))
    # Then the next run still sees the interpreter the environment started with, and not the folder
    assert_status(second, "ok")
    assert second.stdout == first.stdout == "False True\n"


def test_a_mount_table_that_changes_all_the_time_delays_runs_but_never_starves_them(tmp_path: Path) -> None:
    import threading

    if os.geteuid() != 0:
        pytest.skip("mounting a file system needs root here")
    churn = tmp_path / "churn"
    churn.mkdir()
    stop = threading.Event()

    def mount_and_unmount() -> None:
        while not stop.is_set():
            _mount_tmpfs(churn)
            _unmount(churn)
            stop.wait(0.01)

    with light_at("namespaces") as sandbox:
        assert_status(sandbox.run("print(1)", cwd=tmp_path, limits=RunLimits(timeout_s=60)), "ok")
        # Given the host's mount table changing every 10 ms (containers starting, an automounter)
        churner = threading.Thread(target=mount_and_unmount, daemon=True)
        churner.start()
        try:
            # When runs are asked for one after another
            results = [
                sandbox.run("print(1)", cwd=tmp_path, limits=RunLimits(timeout_s=60)) for _ in range(5)
            ]
        finally:
            stop.set()
            churner.join(timeout=10)
    # Then each is served by a spare forked after it arrived at the latest: no run waits for the
    # churn to stop (dropping every spare at each change left requests waiting for minutes)
    for result in results:
        assert_status(result, "ok")
    waits = [result.queued_ms for result in results]
    assert max(waits) < 10_000, waits


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    """A folder of our own in the host's /dev/shm, which a namespaced run never sees."""
    with _own_folder("/dev/shm") as folder:
        yield folder


def _bare_venv(where: Path) -> Path:
    """A venv of this interpreter without pip (the zygote needs only the standard library)."""
    import venv

    venv.EnvBuilder(with_pip=False, symlinks=True).create(where)
    return where / "bin" / "python"


def test_an_interpreter_folder_under_dev_shm_swapped_for_a_link_is_refused(
    shm_dir: Path, tmp_path: Path
) -> None:
    # Given a sandbox whose interpreter lives under the host's /dev/shm (bound back into each run's
    # own /dev/shm), and a hidden folder
    python = _bare_venv(shm_dir / "venv")
    hidden = tmp_path / "hidden"
    for module_path in {Path(p).relative_to(sys.prefix) for p in sys.path if p.startswith(sys.prefix + "/")}:
        (hidden / module_path).mkdir(parents=True, exist_ok=True)  # the venv's layout, so each path holds
    (hidden / "secret.txt").write_text("not for runs")
    scope = tmp_path / "scope"
    scope.mkdir()
    look = f"import os\nprint(os.path.exists({str(shm_dir / 'venv' / 'secret.txt')!r}))\n"
    with light_at("namespaces", python=str(python), hidden_paths=(str(hidden),)) as sandbox:
        assert sandbox.run(look, cwd=scope, limits=RunLimits(timeout_s=60)).stdout == "False\n"
        # When a process of the same uid on the host puts a link to the hidden folder in its place
        (shm_dir / "venv").rename(shm_dir / "venv.real")
        (shm_dir / "venv").symlink_to(hidden)
        try:
            # Then the run is refused, naming the folder, rather than shown the hidden one
            with pytest.raises(SandboxError, match="resolves elsewhere than when the environment started"):
                sandbox.run(look, cwd=scope, limits=RunLimits(timeout_s=60))
        finally:
            (shm_dir / "venv").unlink()
            (shm_dir / "venv.real").rename(shm_dir / "venv")


def test_an_interpreter_folder_outside_every_cover_may_become_a_link(tmp_path: Path) -> None:
    # Given a sandbox whose interpreter's folder is not under any cover (a blue/green install)
    with _own_folder("/var/tmp") as base:
        python = _bare_venv(base / "venv")
        scope = tmp_path / "scope"
        scope.mkdir()
        with light_at("namespaces", python=str(python)) as sandbox:
            assert_status(sandbox.run("print(1)", cwd=scope, limits=RunLimits(timeout_s=60)), "ok")
            # When the folder becomes a link to a copy of itself
            (base / "venv").rename(base / "venv.blue")
            (base / "venv").symlink_to(base / "venv.blue")
            result = sandbox.run("print(2)", cwd=scope, limits=RunLimits(timeout_s=60))
        # Then runs go on (nothing of it is bound back, so nothing is refused)
        assert_status(result, "ok")
        assert result.stdout == "2\n"
