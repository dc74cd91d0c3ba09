"""Behaviour of the working-tree snapshot and diff the sandbox supervisor hands to the sync."""

from __future__ import annotations

import errno
import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from trees import make_empty_files, tmpfs_dir

from alphaagent.sandbox.snapshot import (
    HashCache,
    SkippedEntry,
    diff_snapshots,
    sha256_file,
    take_snapshot,
)

SCOPE_FOLDERS = ("spec", "docs", "datasets", "charts", "reports", "work")


@pytest.fixture
def scope(tmp_path: Path) -> Path:
    root = tmp_path / "scope"
    for folder in SCOPE_FOLDERS:
        (root / folder).mkdir(parents=True)
    return root


def write(root: Path, rel: str, content: str | bytes, *, mtime_ns: int | None = None) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))
    return path


def test_created_modified_and_deleted_regular_files_are_reported(scope: Path) -> None:
    # Given a scope holding a dataset that will be rewritten, one that will be removed and one left alone
    write(scope, "datasets/prices.csv", "a,b\n1,2\n")
    write(scope, "datasets/old.csv", "x\n")
    write(scope, "docs/readme.md", "unchanged\n")
    before = take_snapshot(scope)

    # When the run adds a chart and a nested report, grows one file and deletes another
    write(scope, "charts/plot.png", b"\x89PNG...")
    write(scope, "reports/2024/q1/summary.md", "# Q1\n")
    write(scope, "datasets/prices.csv", "a,b\n1,2\n3,4\n")
    (scope / "datasets/old.csv").unlink()
    (scope / "work/empty_dir").mkdir()
    changes = diff_snapshots(before, take_snapshot(scope))

    # Then exactly those files are reported, as sorted workspace-relative POSIX paths; directories are not
    assert changes.created == ("charts/plot.png", "reports/2024/q1/summary.md")
    assert changes.modified == ("datasets/prices.csv",)
    assert changes.deleted == ("datasets/old.csv",)
    assert changes.skipped == ()
    assert changes.truncated is False
    assert changes.changed == (
        "charts/plot.png",
        "datasets/old.csv",
        "datasets/prices.csv",
        "reports/2024/q1/summary.md",
    )


def test_snapshot_records_dirs_and_files_but_not_the_root(scope: Path) -> None:
    # Given a scope with one file in a subfolder
    write(scope, "reports/a.md", "hello")

    # When it is snapshotted
    snapshot = take_snapshot(scope)

    # Then the folders and the file are recorded by relative path with their lstat, and the root is not
    assert snapshot.root == str(scope)
    assert set(snapshot.entries) == {*SCOPE_FOLDERS, "reports/a.md"}
    assert snapshot.entries["reports"].kind == "dir"
    file_entry = snapshot.entries["reports/a.md"]
    assert (file_entry.kind, file_entry.size) == ("file", 5)
    assert file_entry.ino == os.lstat(scope / "reports/a.md").st_ino
    assert snapshot.unreadable == ()
    assert snapshot.truncated is False


def test_same_size_rewrite_is_modified_until_the_cache_knows_the_previous_digest(scope: Path) -> None:
    # Given a dataset and a hash cache shared between runs, as the supervisor keeps it
    cache = HashCache()
    base_ns = 1_700_000_000_000_000_000
    write(scope, "datasets/d.csv", "1,2\n", mtime_ns=base_ns)
    run0 = take_snapshot(scope)

    # When run 1 rewrites it with different bytes of the same size and a new mtime
    write(scope, "datasets/d.csv", "3,4\n", mtime_ns=base_ns + 1_000_000_000)
    run1 = take_snapshot(scope)
    first = diff_snapshots(run0, run1, hash_cache=cache)

    # Then it is modified (no digest of the earlier version was known), and its new digest is now cached
    assert first.modified == ("datasets/d.csv",)
    assert len(cache) == 1

    # When run 2 rewrites the very same bytes with yet another mtime
    write(scope, "datasets/d.csv", "3,4\n", mtime_ns=base_ns + 2_000_000_000)
    run2 = take_snapshot(scope)
    second = diff_snapshots(run1, run2, hash_cache=cache)

    # Then the content comparison says unchanged
    assert second.changed == ()

    # When run 3 writes different bytes of the same size
    write(scope, "datasets/d.csv", "5,6\n", mtime_ns=base_ns + 3_000_000_000)
    third = diff_snapshots(run2, take_snapshot(scope), hash_cache=cache)

    # Then it is modified again
    assert third.modified == ("datasets/d.csv",)


def test_same_size_rewrite_without_a_cache_is_modified(scope: Path) -> None:
    # Given a file rewritten to identical bytes with a new mtime
    write(scope, "work/x.txt", "same", mtime_ns=1_000_000_000)
    before = take_snapshot(scope)
    write(scope, "work/x.txt", "same", mtime_ns=2_000_000_000)

    # When the snapshots are diffed with no hash cache
    changes = diff_snapshots(before, take_snapshot(scope))

    # Then it cannot be proven unchanged and is reported modified
    assert changes.modified == ("work/x.txt",)


def test_unchanged_stat_means_unchanged_without_hashing(scope: Path) -> None:
    # Given a file nobody touches
    write(scope, "docs/a.md", "text")
    cache = HashCache()

    # When two snapshots are diffed
    changes = diff_snapshots(take_snapshot(scope), take_snapshot(scope), hash_cache=cache)

    # Then nothing changed and nothing had to be hashed
    assert changes.changed == ()
    assert len(cache) == 0


def test_path_01_planted_symlinks_are_skipped_never_followed_nor_created(scope: Path) -> None:
    # Given the PATH-01 run: links to the environment, to /etc/passwd and to a system directory
    before = take_snapshot(scope)
    os.symlink("/proc/self/environ", scope / "reports/env.txt")
    os.symlink("/etc/passwd", scope / "datasets/users.csv")
    os.symlink("/usr", scope / "work/runner_src")

    # When the tree is snapshotted and diffed
    after = take_snapshot(scope)
    changes = diff_snapshots(before, after, hash_cache=HashCache())

    # Then the symlinked directory was not entered and no link is reported as a created file
    assert not [path for path in after.entries if path.startswith("work/runner_src/")]
    assert {after.entries[p].kind for p in ("reports/env.txt", "datasets/users.csv", "work/runner_src")} == {
        "symlink"
    }
    assert changes.changed == ()
    # And each link is reported as skipped, with a reason that says nothing about its target
    assert changes.skipped == (
        SkippedEntry("datasets/users.csv", "symlink"),
        SkippedEntry("reports/env.txt", "symlink"),
        SkippedEntry("work/runner_src", "symlink to directory (not followed)"),
    )
    assert not any(word in repr(changes) for word in ("/usr", "passwd", "environ", "/proc"))


def test_untouched_symlinks_are_not_reported_again_but_replaced_ones_are(scope: Path) -> None:
    # Given a symlink planted by an earlier run
    os.symlink("/etc/passwd", scope / "datasets/users.csv")
    os.symlink("/etc/hostname", scope / "datasets/host.txt")
    before = take_snapshot(scope)

    # When the next run leaves one alone and re-plants the other
    (scope / "datasets/host.txt").unlink()
    os.symlink("/etc/hosts", scope / "datasets/host.txt")
    changes = diff_snapshots(before, take_snapshot(scope))

    # Then only the re-planted link is reported
    assert changes.skipped == (SkippedEntry("datasets/host.txt", "symlink"),)


def test_regular_file_replaced_by_a_symlink_is_deleted_and_the_link_skipped(scope: Path) -> None:
    # Given a real dataset
    write(scope, "datasets/users.csv", "id,name\n1,ann\n")
    before = take_snapshot(scope)

    # When the run swaps it for a link to /etc/passwd
    (scope / "datasets/users.csv").unlink()
    os.symlink("/etc/passwd", scope / "datasets/users.csv")
    changes = diff_snapshots(before, take_snapshot(scope))

    # Then the file is deleted, the link skipped, and nothing created
    assert changes.deleted == ("datasets/users.csv",)
    assert changes.created == ()
    assert changes.skipped == (SkippedEntry("datasets/users.csv", "symlink"),)


def test_kind_changes_between_file_and_directory(scope: Path) -> None:
    # Given a file "work/a" and a directory "work/b"
    write(scope, "work/a", "file")
    (scope / "work/b").mkdir()
    before = take_snapshot(scope)

    # When the run turns the file into a directory and the directory into a file
    (scope / "work/a").unlink()
    write(scope, "work/a/inner.txt", "x")
    (scope / "work/b").rmdir()
    write(scope, "work/b", "now a file")
    changes = diff_snapshots(before, take_snapshot(scope))

    # Then the old file is deleted, and both new regular files are created
    assert changes.deleted == ("work/a",)
    assert changes.created == ("work/a/inner.txt", "work/b")


@pytest.mark.timeout(10)
def test_fifo_is_skipped_and_the_walk_does_not_block_on_it(scope: Path) -> None:
    # Given a run that leaves a FIFO nobody writes to
    before = take_snapshot(scope)
    os.mkfifo(scope / "work/pipe")

    # When the tree is snapshotted and diffed (opening the FIFO would hang until the timeout)
    after = take_snapshot(scope)
    changes = diff_snapshots(before, after, hash_cache=HashCache())

    # Then it is recorded as a fifo and reported skipped, not created
    assert after.entries["work/pipe"].kind == "fifo"
    assert changes.skipped == (SkippedEntry("work/pipe", "fifo"),)
    assert changes.created == ()


@pytest.mark.timeout(10)
def test_sha256_file_refuses_symlinks_and_fifos(scope: Path) -> None:
    # Given a symlink to a readable file and a FIFO
    os.symlink("/etc/passwd", scope / "work/link")
    os.mkfifo(scope / "work/pipe")

    # When either is hashed, Then it is refused rather than followed or blocked on
    with pytest.raises(OSError) as link_error:
        sha256_file(scope / "work/link")
    assert link_error.value.errno == errno.ELOOP
    with pytest.raises(OSError) as fifo_error:
        sha256_file(scope / "work/pipe")
    assert fifo_error.value.errno == errno.EINVAL


def test_sha256_file_matches_hashlib_across_block_boundaries(scope: Path) -> None:
    # Given a file of 2.5 MiB, so it spans three 1 MiB blocks
    content = os.urandom(5 * 512 * 1024)
    path = write(scope, "datasets/big.bin", content)

    # When it is hashed, Then the digest is the sha256 of its bytes
    assert sha256_file(path) == hashlib.sha256(content).hexdigest()


def test_exclude_prefixes_drop_whole_subtrees_by_component(scope: Path) -> None:
    # Given the run's own bookkeeping directory and a sibling whose name merely starts the same
    write(scope, "work/runs/01ABC/stdout.txt", "log")
    write(scope, "work/runs/01ABC/deep/more.txt", "log")
    write(scope, "work/runs/01ABCD/result.csv", "1")

    # When snapshotted with that directory excluded (with a stray ./ and trailing /)
    snapshot = take_snapshot(scope, exclude=["./work/runs/01ABC/"])

    # Then nothing at or under the prefix is recorded, and the sibling is
    assert not [path for path in snapshot.entries if path.startswith("work/runs/01ABC/")]
    assert "work/runs/01ABC" not in snapshot.entries
    assert "work/runs/01ABCD/result.csv" in snapshot.entries


@pytest.mark.parametrize("prefix", ["", "/etc", "../outside", "work/../.."])
def test_exclude_prefix_outside_the_scope_is_rejected(scope: Path, prefix: str) -> None:
    # Given an exclude that is empty, absolute or escapes the scope
    # When a snapshot is requested, Then it is refused
    with pytest.raises(ValueError, match="exclude prefix"):
        take_snapshot(scope, exclude=[prefix])


def test_max_entries_truncates_the_walk_and_suppresses_deletions(scope: Path) -> None:
    # Given more entries than the cap (6 folders + 20 files)
    for index in range(20):
        write(scope, f"work/f{index:02}.txt", "x")
    before = take_snapshot(scope)

    # When the after-snapshot is capped at 10 entries
    after = take_snapshot(scope, max_entries=10)
    changes = diff_snapshots(before, after)

    # Then it records exactly 10, says so, and does not claim the unseen files were deleted
    assert len(after.entries) == 10
    assert after.truncated is True
    assert changes.truncated is True
    assert changes.deleted == ()
    assert before.truncated is False


def test_non_utf8_filename_is_skipped_without_crashing(scope: Path) -> None:
    # Given a run that creates files and a directory whose names are not valid UTF-8
    before = take_snapshot(scope)
    reports = os.fsencode(scope / "reports")
    os.close(os.open(reports + b"/bad\xff.csv", os.O_CREAT | os.O_WRONLY, 0o644))
    os.mkdir(reports + b"/dir\xfe")
    os.close(os.open(reports + b"/dir\xfe/inner.csv", os.O_CREAT | os.O_WRONLY, 0o644))
    write(scope, "reports/good.csv", "ok")

    # When the tree is snapshotted and diffed
    after = take_snapshot(scope)
    changes = diff_snapshots(before, after, hash_cache=HashCache())

    # Then the good file is created, the bad names are skipped under escaped display paths
    assert changes.created == ("reports/good.csv",)
    assert changes.skipped == (
        SkippedEntry("reports/bad\\xff.csv", "name is not valid UTF-8"),
        SkippedEntry("reports/dir\\xfe", "name is not valid UTF-8"),
    )
    # And every recorded path is valid UTF-8, so the sync can use it as an object key
    for path in after.entries:
        path.encode("utf-8")
    # And a later run that leaves them alone does not report them again
    assert diff_snapshots(after, take_snapshot(scope)).skipped == ()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a chmod 000 directory anyway")
def test_directory_without_permissions_is_unreadable_and_the_walk_continues(scope: Path) -> None:
    # Given a dataset inside a directory, and a file elsewhere
    write(scope, "datasets/locked/secret.csv", "1")
    write(scope, "docs/a.md", "a")
    before = take_snapshot(scope)

    # When the run removes all permissions from the directory
    locked = scope / "datasets/locked"
    locked.chmod(0o000)
    try:
        after = take_snapshot(scope)
        changes = diff_snapshots(before, after)
    finally:
        locked.chmod(0o755)

    # Then it is reported unreadable, the rest is still walked, and its file is not claimed deleted
    assert after.unreadable == ("datasets/locked",)
    assert "docs/a.md" in after.entries
    assert changes.deleted == ()
    assert changes.skipped == (SkippedEntry("datasets/locked", "unreadable directory"),)


def test_directory_that_cannot_be_opened_is_unreadable_even_as_root(
    scope: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a dataset inside a directory, and a file elsewhere
    write(scope, "datasets/locked/secret.csv", "1")
    write(scope, "docs/a.md", "a")
    before = take_snapshot(scope)

    # When opening that directory fails with EACCES (simulated: root bypasses permission bits)
    locked = os.fspath(scope / "datasets/locked")
    real_open = os.open

    def open_refusing_locked(path: str, flags: int, *args: int, **kwargs: int) -> int:
        # The walk opens each directory by name relative to its parent's descriptor.
        if os.fspath(path) == locked or (os.fspath(path) == "locked" and kwargs.get("dir_fd") is not None):
            raise PermissionError(errno.EACCES, "Permission denied", locked)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_refusing_locked)
    after = take_snapshot(scope)
    monkeypatch.undo()
    changes = diff_snapshots(before, after)

    # Then it is reported unreadable, the rest is still walked, and its file is not claimed deleted
    assert after.unreadable == ("datasets/locked",)
    assert "docs/a.md" in after.entries
    assert changes.deleted == ()
    assert changes.skipped == (SkippedEntry("datasets/locked", "unreadable directory"),)


@pytest.mark.parametrize("swapped_component", ["work/data", "work"])
def test_directory_swapped_for_a_symlink_during_the_walk_is_not_entered(
    tmp_path: Path, scope: Path, monkeypatch: pytest.MonkeyPatch, swapped_component: str
) -> None:
    # Given a directory listed by its parent, and a decoy tree outside the scope
    write(scope, "work/data/a.csv", "1")
    decoy = tmp_path / "decoy"
    write(decoy, "data/secret.txt", "outside the scope")
    data_path = os.fspath(scope / "work/data")
    real_open = os.open

    def open_after_swap(path: str, flags: int, *args: int, **kwargs: int) -> int:
        # Untrusted code wins the race: between the parent's listing and this open, it renames the
        # directory (or one of its ancestors) away and plants a symlink to the decoy in its place.
        # The walk opens "data" by name relative to the descriptor of the "work" it listed.
        opening_data = os.fspath(path) == data_path or (path == "data" and kwargs.get("dir_fd") is not None)
        if opening_data and not (scope / swapped_component).is_symlink():
            (scope / swapped_component).rename(scope / "moved")
            os.symlink(decoy if swapped_component == "work" else decoy / "data", scope / swapped_component)
        return real_open(path, flags, *args, **kwargs)

    # When the tree is snapshotted while that happens
    monkeypatch.setattr(os, "open", open_after_swap)
    snapshot = take_snapshot(scope)
    monkeypatch.undo()

    # Then nothing from the decoy is recorded: a directory swapped for a symlink is reported
    # unreadable; an ancestor swapped after it was opened no longer matters (the walk holds the
    # ancestor's descriptor, so it goes on in the very directory it listed, now named "moved")
    assert (scope / swapped_component).is_symlink()
    assert not [path for path in snapshot.entries if path.endswith("secret.txt")]
    if swapped_component == "work/data":
        assert not [path for path in snapshot.entries if path.startswith("work/data/")]
        assert snapshot.unreadable == ("work/data",)
    else:
        assert snapshot.unreadable == ()


def test_deep_tree_of_500_levels_is_walked(scope: Path) -> None:
    # Given a file 500 directories deep
    before = take_snapshot(scope)
    parts = ["work"]
    for _ in range(500):
        parts.append("d")
        os.mkdir(scope.joinpath(*parts))
    write(scope, "/".join([*parts, "bottom.txt"]), "deep")

    # When the tree is snapshotted and diffed
    changes = diff_snapshots(before, take_snapshot(scope))

    # Then the bottom file is found as created
    assert changes.created == ("work/" + "d/" * 500 + "bottom.txt",)


@pytest.fixture
def tmpfs_scope(tmp_path: Path) -> Iterator[Path]:
    """The scope's folders on tmpfs where it can be (creating 20,000 files on ext4 under load took
    ~40 s of this machine's wall clock; the walk makes the same system calls on both)."""
    with tmpfs_dir(tmp_path) as root:
        for folder in SCOPE_FOLDERS:
            (root / folder).mkdir()
        yield root


@pytest.mark.slow
def test_twenty_thousand_small_files_are_snapshotted(tmpfs_scope: Path) -> None:
    # Given 20,000 empty files in 100 folders
    scope = tmpfs_scope
    for folder in range(100):
        make_empty_files(scope, f"work/batch{folder:03}", (f"part{index:03}.csv" for index in range(200)))

    # When the tree is snapshotted
    started = time.perf_counter()
    snapshot = take_snapshot(scope)
    elapsed = time.perf_counter() - started

    # Then every file and folder is recorded (time shown with -s; not asserted, machines differ)
    print(f"\nsnapshot of 20,000 files took {elapsed * 1000:.0f} ms")
    assert len(snapshot.entries) == 20_000 + 100 + len(SCOPE_FOLDERS)
    assert snapshot.truncated is False


def test_hash_cache_evicts_the_least_recently_used_digest() -> None:
    # Given a cache of two digests where the first has just been read
    cache = HashCache(max_entries=2)
    cache.put((1, 1, 1, 1), "a" * 64)
    cache.put((1, 2, 1, 1), "b" * 64)
    assert cache.get((1, 1, 1, 1)) == "a" * 64

    # When a third digest is stored
    cache.put((1, 3, 1, 1), "c" * 64)

    # Then the least recently used one is gone and the others remain
    assert cache.get((1, 2, 1, 1)) is None
    assert cache.get((1, 1, 1, 1)) == "a" * 64
    assert cache.get((1, 3, 1, 1)) == "c" * 64
    assert len(cache) == 2


def test_missing_root_raises(tmp_path: Path) -> None:
    # Given a scope root that does not exist
    # When it is snapshotted, Then the platform error surfaces
    with pytest.raises(FileNotFoundError):
        take_snapshot(tmp_path / "nope")
