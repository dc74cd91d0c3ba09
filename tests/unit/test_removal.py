"""Removing trees a run built (alphaagent/sandbox/removal.py): any depth without recursion, never
through a symlink, within a bound on work, and folders the owner locked given back first; and every
cleanup of a tree a run can reach uses it (a session's state, the scratch area, the AWS working copy)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from alphaagent.aws import sync
from alphaagent.sandbox import removal
from alphaagent.sandbox.removal import TreeTooLargeError, remove_tree
from alphaagent.sandbox.scratch import remove_path
from alphaagent.sandbox.session import drop_state, state_path

DEPTH = 3_000  # past Python's recursion limit (1,000) and, with its names, past PATH_MAX (4,096)

# The trees are built and removed on tmpfs where there is one: on this machine's ext4 (mounted with
# ``discard``) an rmdir waits ~4 ms for the disk, 25 s for one test's 10,000 folders, and nothing here
# depends on the filesystem (the remover's walk, its descriptors and its budget are the same on each).
FAST_DIR = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


@pytest.fixture
def tmp_path(tmp_path: Path) -> Iterator[Path]:
    """A fresh folder on tmpfs (``FAST_DIR``), else pytest's own; removed by GNU ``rm`` afterwards
    (never by the code under test), whatever depth a failed test left."""
    if FAST_DIR is None or shutil.which("rm") is None:
        yield tmp_path
        return
    where = Path(tempfile.mkdtemp(prefix="alphaagent-removal-test-", dir=FAST_DIR))
    try:
        yield where
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(where)], check=False)


def deep_chain(
    top: Path, depth: int, *, name: str = "d", every: int = 0, outside: Path | None = None
) -> None:
    """``top/d/d/.../d`` ``depth`` levels deep, made through descriptors (the path is too long to
    name); every ``every`` levels a file, and a symlink to ``outside`` when given."""
    top.mkdir(parents=True, exist_ok=True)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for level in range(depth):
            os.mkdir(name, dir_fd=fd)
            below = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = below
            if every and level % every == 0:
                os.close(os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
                if outside is not None:
                    os.symlink(outside, "link", dir_fd=fd)
    finally:
        os.close(fd)


def test_a_session_state_nested_thousands_deep_is_dropped_and_links_are_not_followed(tmp_path: Path) -> None:
    # Given a session folder a run nested 3,000 levels deep, with links to a folder outside
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    root = tmp_path / "scope"
    deep_chain(root / state_path("s1"), DEPTH, name="x" * 40, every=250, outside=outside)

    # When the session ends
    assert drop_state(root, "s1") is True

    # Then the folder is gone and nothing outside it was touched
    assert not (root / state_path("s1")).exists()
    assert (outside / "keep.txt").read_text() == "mine"
    assert drop_state(root, "s1") is False


def test_a_symlink_at_the_top_is_unlinked_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    (tmp_path / "link").symlink_to(outside, target_is_directory=True)
    remove_tree(tmp_path / "link")
    assert not (tmp_path / "link").is_symlink() and (outside / "keep.txt").exists()
    remove_tree(tmp_path / "missing")  # nothing to do


def test_a_wide_tree_with_deep_branches_is_removed_holding_few_descriptors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a tree both wide and deep, and a walk allowed to hold only 8 levels open
    monkeypatch.setattr(removal, "MAX_OPEN_LEVELS", 8)
    top = tmp_path / "t"
    for branch in range(20):
        deep_chain(top / f"b{branch}", 50, every=7)
    for index in range(300):
        (top / f"file{index}").write_bytes(b"x")
    # (counted, not read off the descriptor numbers: other fixtures of the worker may leave holes in
    # the descriptor table, and a hole makes the numbers of a few descriptors far apart)
    held: set[int] = set()
    opened, most_held = [0], [0]
    real_open, real_close = os.open, os.close

    def counting_open(*args: object, **kwargs: object) -> int:
        fd = real_open(*args, **kwargs)  # type: ignore[arg-type]
        held.add(fd)
        opened[0] += 1
        most_held[0] = max(most_held[0], len(held))
        return fd

    def counting_close(fd: int) -> None:
        real_close(fd)
        held.discard(fd)

    monkeypatch.setattr(os, "open", counting_open)
    monkeypatch.setattr(os, "close", counting_close)
    remove_tree(top)
    assert not top.exists()
    # Then it opened a descriptor per folder (over a thousand) but held at most 8 levels and a few
    # more at once, and none is left open
    assert opened[0] > 20 * 50
    assert most_held[0] < 8 + 8, "descriptors are reused, never one per level"
    assert held == set()


def test_the_work_is_bounded(tmp_path: Path) -> None:
    top = tmp_path / "t"
    top.mkdir()
    for index in range(50):
        (top / str(index)).write_bytes(b"")
    with pytest.raises(TreeTooLargeError, match="more entries than this removal makes at most"):
        remove_tree(top, max_entries=10)
    remove_tree(top)
    assert not top.exists()


def _locked_tree_removed_as(uid: int, top: Path) -> int:
    """In a forked child running as ``uid``: build a deep tree with folders locked at several
    depths (chmod 000 and 500), remove it, exit 0 when it is gone (1 left, 2 failed)."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 2
        try:
            os.setgid(uid)
            os.setuid(uid)
            deep_chain(top, 1_500)
            fd = os.open(top, os.O_RDONLY)
            for level in range(1_500):
                below = os.open("d", os.O_RDONLY, dir_fd=fd)  # before its folder is locked
                if level % 300 == 0:
                    os.close(os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
                    os.fchmod(fd, 0o500 if level % 600 else 0o000)
                os.close(fd)
                fd = below
            os.close(fd)
            remove_tree(top)
            code = 1 if os.path.lexists(top) else 0
        except BaseException as error:  # said on stderr, for the assertion's reader
            os.write(2, f"{type(error).__name__}: {error}\n".encode())
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the removal as another user")
def test_folders_the_owner_locked_are_given_back_and_removed() -> None:
    # Given, as an ordinary user, a deep tree with folders locked at several depths (in a folder of
    # its own: pytest's tmp_path is root's, closed to others)
    owned = Path(tempfile.mkdtemp(prefix="removal-test-", dir=FAST_DIR))
    try:
        os.chown(owned, 65534, 65534)
        # When that user removes it, Then it is gone
        assert _locked_tree_removed_as(65534, owned / "t") == 0
    finally:
        remove_tree(owned)


def test_the_scratch_area_and_the_aws_working_copy_are_cleaned_at_any_depth(tmp_path: Path) -> None:
    # The scratch area (and exec's temporary folder, which uses the same remover)
    deep_chain(tmp_path / "scratch" / "junk", DEPTH)
    assert remove_path(tmp_path / "scratch") is True

    # The env function's working copy: a cold sync wipes it, a warm one scans it and prunes what is
    # empty; neither recurses nor walks a path past PATH_MAX
    deep_chain(tmp_path / "copy" / "work", DEPTH, name="y" * 30)
    (tmp_path / "copy" / "work" / "kept.txt").write_text("k")
    deep_chain(tmp_path / "copy" / "empty", DEPTH // 3)
    assert sorted(sync._scan(tmp_path / "copy")) == ["work/kept.txt"]
    sync._prune_empty(tmp_path / "copy")
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == ["work"]
    assert [p.name for p in (tmp_path / "copy" / "work").iterdir()] == ["kept.txt"]
    deep_chain(tmp_path / "copy" / "again", DEPTH)
    sync.wipe_tree(tmp_path / "copy")
    assert not (tmp_path / "copy").exists()


def test_ending_a_session_never_deletes_through_a_symlinked_sessions_folder(tmp_path: Path) -> None:
    # Given a run that made work/sessions a link to a folder outside the scope, holding a folder
    # named like the session
    outside = tmp_path / "elsewhere"
    (outside / "s1").mkdir(parents=True)
    (outside / "s1" / "precious.txt").write_text("not the scope's")
    root = tmp_path / "scope"
    (root / "work").mkdir(parents=True)
    (root / "work" / "sessions").symlink_to(outside, target_is_directory=True)

    # When the session ends, Then nothing outside is touched (there is no state here to drop)
    assert drop_state(root, "s1") is False
    assert (outside / "s1" / "precious.txt").read_text() == "not the scope's"

    # And with work itself a link, likewise
    (root / "work" / "sessions").unlink()
    (root / "work").rmdir()
    (root / "work").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (outside / "sessions" / "s1").mkdir(parents=True)
    assert drop_state(root, "s1") is False and (outside / "sessions" / "s1").is_dir()
