"""The tree state kept between runs (``alphaagent.sandbox.treestate``): every created, modified and
deleted file reported at any scale, nothing else's writes passed off as a run's, no silent cap."""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from trees import make_empty_files, tmpfs_dir

from alphaagent.models.run import RunResult
from alphaagent.sandbox.snapshot import HashCache, SkippedEntry
from alphaagent.sandbox.supervisor import Sandbox
from alphaagent.sandbox.treestate import RACY_NS, TreeState, TreeStates

FILES = 120_000
PER_DIR = 500


def _write(path: Path, data: bytes = b"x") -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _make(root: Path, files: int) -> list[str]:
    paths = []
    for start in range(0, files, PER_DIR):
        names = (f"f{index:06d}.csv" for index in range(start, min(start + PER_DIR, files)))
        paths += make_empty_files(root, f"datasets/d{start // PER_DIR:04d}", names)
    return paths


@pytest.fixture
def big_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory on tmpfs when /dev/shm is writable: creating 120,000 files there takes ~1 s, on
    this machine's ext4 under load ~50 s. The walk does the same system calls on both. On /dev/shm,
    not a mount of its own: the worker's sandbox, already running, must see it."""
    with tmpfs_dir(tmp_path, own_mount=False) as path:
        yield path


@pytest.fixture(scope="module")
def scope_of_120000(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[str]]]:
    """One scope of ``FILES`` empty files, built once for the module (~1 s of system calls); a test
    that changes it puts it back (``pristine_120000``)."""
    with tmpfs_dir(tmp_path_factory.mktemp("scale")) as root:
        yield root, _make(root, FILES)


def _the_runs_changes(paths: list[str]) -> tuple[list[str], list[str], list[str], list[str]]:
    """What the run of the 120,000-file test does, spread over the tree and past the 100,000th
    entry: the files it creates, rewrites with one byte, rewrites longer, and deletes."""
    created = [f"datasets/d{d:04d}/new.csv" for d in range(0, FILES // PER_DIR, 7)] + ["reports/r.md"]
    return created, [*paths[5::9973], paths[-1]], [paths[-2]], [*paths[11::10007], paths[-3]]


@pytest.fixture
def pristine_120000(scope_of_120000: tuple[Path, list[str]]) -> Iterator[tuple[Path, list[str]]]:
    """The module's 120,000-file scope as ``_make`` left it, and put back so after the test."""
    root, paths = scope_of_120000
    yield root, paths
    created, same_size, longer, deleted = _the_runs_changes(paths)
    for path in created:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(root / path)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(root / "reports")
    for path in [*same_size, *longer]:
        with contextlib.suppress(FileNotFoundError):
            os.truncate(root / path, 0)
    for path in deleted:
        with contextlib.suppress(FileExistsError):
            os.mknod(root / path, 0o644 | stat.S_IFREG)


def _changed(result: RunResult) -> list[str]:
    return [*result.files.created, *result.files.modified, *result.files.deleted]


def _past_racy() -> None:
    time.sleep(RACY_NS / 1e9 * 2)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("trust_events", [False, True], ids=["walk", "events"])
def test_every_change_in_a_120000_file_scope_is_reported(
    pristine_120000: tuple[Path, list[str]], trust_events: bool
) -> None:
    tmp_path, paths = pristine_120000
    # Given a scope of 120,000 files (more than the old 100,000-entry cap), its state kept (found
    # by the walk, as at the process level, or from inotify's events, as at the namespaces level)
    states = TreeStates()
    state = states.checkout(tmp_path, exclude=["work/runs"])
    state.prepare()
    assert len(state.entries) == FILES + FILES // PER_DIR + 1  # the files, their folders, datasets/
    _past_racy()
    state.update(report=False, trust_events=trust_events)
    state.prepare()
    state.settle()

    # When a run creates, modifies (same size, and another size) and deletes files spread over the
    # tree, among them the entries past the 100,000th
    created, modified, longer, deleted = _the_runs_changes(paths)
    (tmp_path / "reports").mkdir()
    for path in created:
        _write(tmp_path / path, b"new")
    for path in modified:
        _write(tmp_path / path, b"y")  # same size: only the timestamps say so
    for path in longer:
        _write(tmp_path / path, b"longer")
    modified += longer
    for path in deleted:
        os.unlink(tmp_path / path)
    changes = state.update(
        report=True, max_reported=1_000_000, hash_cache=HashCache(), trust_events=trust_events
    )

    # Then each is reported exactly, and nothing else
    assert (changes.created, changes.modified, changes.deleted) == (
        tuple(sorted(created)),
        tuple(sorted(modified)),
        tuple(sorted(deleted)),
    )
    assert (changes.truncated, changes.unreported) == (False, 0)
    # And the walk listed only the directories that changed (and the root, datasets/, reports/)
    assert state.listed <= len(created) + len(deleted) + 3, (state.listed, state.pruned)
    assert (state.found_by, state.fallback) == (("events", "") if trust_events else ("walk", ""))
    states.close()


def test_writes_between_runs_are_not_the_runs_changes(tmp_path: Path) -> None:
    # Given a scope whose state was kept after a run
    _make(tmp_path, 50)
    states = TreeStates()
    state = states.checkout(tmp_path)
    state.prepare()
    state.update(report=True)
    states.checkin(state)
    _past_racy()

    # When the backend copies a dataset and rewrites another between runs, and the run then writes one file
    _write(tmp_path / "datasets/d0000/copied.csv", b"copied")
    _write(tmp_path / "datasets/d0000/f000001.csv", b"z")
    state = states.checkout(tmp_path)
    assert state.prepare() is True  # inotify said something wrote: the state was refreshed
    state.settle()
    _write(tmp_path / "datasets/d0000/out.csv", b"1")
    changes = state.update(report=True)

    # Then only the run's file is reported
    assert (changes.created, changes.modified, changes.deleted) == (("datasets/d0000/out.csv",), (), ())
    states.checkin(state)
    # And a quiet scope is not walked at all before the next run
    _past_racy()
    assert states.checkout(tmp_path).prepare() is False
    states.close()


def test_a_reached_cap_is_reported_and_the_rest_comes_with_the_next_run(tmp_path: Path) -> None:
    # Given a kept state
    _make(tmp_path, 10)
    state = TreeState(root=str(tmp_path), exclude=frozenset())
    state.prepare()
    state.settle()

    # When a run changes 7 files and a report may list 3
    for index in range(5):
        _write(tmp_path / f"datasets/d0000/n{index}.csv")
    os.unlink(tmp_path / "datasets/d0000/f000000.csv")
    _write(tmp_path / "datasets/d0000/f000001.csv", b"longer")
    first = state.update(report=True, max_reported=3)

    # Then the result says it is truncated and how many it left out
    assert (first.truncated, first.unreported) == (True, 4)
    assert len(first.created + first.modified + first.deleted) == 3
    # And the next runs, which change nothing, report the rest, until nothing is left
    state.settle()
    second = state.update(report=True, max_reported=3)
    state.settle()
    third = state.update(report=True, max_reported=3)
    reported = {*first.changed, *second.changed, *third.changed}
    assert reported == {
        *(f"datasets/d0000/n{index}.csv" for index in range(5)),
        "datasets/d0000/f000000.csv",
        "datasets/d0000/f000001.csv",
    }
    assert (second.unreported, third.unreported, third.truncated) == (1, 0, False)
    assert "datasets/d0000/f000000.csv" in second.deleted + third.deleted + first.deleted
    state.close()


def test_a_rewrite_that_sets_the_mtime_back_is_still_modified(tmp_path: Path) -> None:
    # Given a file whose digest is known (an earlier run changed it)
    _make(tmp_path, 3)
    target = tmp_path / "datasets/d0000/f000001.csv"
    state = TreeState(root=str(tmp_path), exclude=frozenset())
    cache = HashCache()
    state.prepare()
    state.settle()
    _write(target, b"a")
    assert state.update(report=True, hash_cache=cache).modified == ("datasets/d0000/f000001.csv",)
    state.settle()

    # When a run rewrites it with the same size and restores its mtime (only the ctime moves)
    before = os.stat(target)
    _write(target, b"b")
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    changes = state.update(report=True, hash_cache=cache)

    # Then it is modified; and an identical rewrite after that is not
    assert changes.modified == ("datasets/d0000/f000001.csv",)
    state.settle()
    _write(target, b"b")
    assert state.update(report=True, hash_cache=cache).modified == ()
    state.close()


def test_kinds_symlinks_and_hostile_names_survive_the_incremental_walk(tmp_path: Path) -> None:
    # Given a kept state with a file and a directory
    (tmp_path / "work").mkdir()
    _write(tmp_path / "work/a")
    (tmp_path / "work/b").mkdir()
    _write(tmp_path / "work/b/inner")
    state = TreeState(root=str(tmp_path), exclude=frozenset({"work/runs"}))
    state.prepare()
    _past_racy()
    state.prepare()
    state.settle()

    # When the run swaps the file for a directory, the directory for a symlink to /usr, plants a
    # name that is not UTF-8, a FIFO, and writes into the excluded spill directory
    os.unlink(tmp_path / "work/a")
    (tmp_path / "work/a").mkdir()
    _write(tmp_path / "work/a/x")
    for name in os.listdir(tmp_path / "work/b"):
        os.unlink(tmp_path / "work/b" / name)
    os.rmdir(tmp_path / "work/b")
    os.symlink("/usr", tmp_path / "work/b")
    os.close(os.open(os.fsencode(tmp_path / "work") + b"/bad\xff", os.O_CREAT | os.O_WRONLY, 0o644))
    os.mkfifo(tmp_path / "work/pipe")
    (tmp_path / "work/runs/01ABC").mkdir(parents=True)
    _write(tmp_path / "work/runs/01ABC/stdout.txt")
    changes = state.update(report=True)

    # Then the files are reported, the link was not followed, the rest is skipped with its reason
    assert changes.created == ("work/a/x",)
    assert changes.deleted == ("work/a", "work/b/inner")
    assert changes.skipped == (
        SkippedEntry("work/b", "symlink to directory (not followed)"),
        SkippedEntry("work/bad\\xff", "name is not valid UTF-8"),
        SkippedEntry("work/pipe", "fifo"),
    )
    assert not [path for path in state.entries if path.startswith(("work/b/", "work/runs/"))]
    state.close()


def test_a_run_in_a_big_scope_reports_its_changes_end_to_end(big_dir: Path, builtin_sandbox: Sandbox) -> None:
    tmp_path, sandbox = big_dir, builtin_sandbox
    # Given a sandbox (the worker's default one: the scope is new to it) and a scope of 20,000
    # files, run in once (the first run walks it whole)
    paths = _make(tmp_path, 20_000)
    assert _changed(sandbox.run("print(1)", cwd=tmp_path)) == []
    _past_racy()

    # When a run creates, modifies and deletes one file each
    code = (
        "import os\n"
        "open('reports_new.csv', 'w').write('1')\n"
        f"open({paths[12345]!r}, 'w').write('longer')\n"
        f"os.unlink({paths[19999]!r})\n"
    )
    result = sandbox.run(code, cwd=tmp_path)

    # Then the result says exactly that
    assert result.status == "ok", result.stderr
    assert (result.files.created, result.files.modified, result.files.deleted) == (
        ["reports_new.csv"],
        [paths[12345]],
        [paths[19999]],
    )
    # And a file written from outside before the next run is not that run's change
    _write(tmp_path / "outside.csv")
    _past_racy()
    assert _changed(sandbox.run("print(2)", cwd=tmp_path)) == []
