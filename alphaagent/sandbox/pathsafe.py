"""Opening files inside a tree that untrusted code can modify, without following its symlinks."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final

MAX_WALK_DEPTH: Final = 512
"""Directory levels a walk enters below its root; deeper directories are reported, not listed.

Nothing below is addressable: a file inside a directory 512 levels down has a path of at least
1,025 bytes, over the 1,024-byte limit of a workspace key (DESIGN §4.2). A walk holds one descriptor
per level that still has subdirectories to visit, so the bound also bounds its descriptors; when the
process runs out of them anyway, the directories it cannot open are reported unreadable."""

_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_spill_file(root: Path, relpath: str) -> BinaryIO:
    """Create ``root/relpath`` for writing, creating parent directories, following no symlink.

    Every component is opened relative to its parent with ``O_NOFOLLOW``, so a directory that user
    code replaced by a symlink (``work/runs -> /etc``) makes this fail (``OSError``, ``ELOOP`` or
    ``ENOTDIR``) instead of writing outside the tree. The file itself must not exist (``O_EXCL``).
    """
    parts = [p for p in relpath.split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        raise OSError(f"unsafe relative path: {relpath!r}")
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    dir_fd = os.open(root, flags)
    try:
        for part in parts[:-1]:
            try:
                next_fd = os.open(part, flags, dir_fd=dir_fd)
            except FileNotFoundError:
                with contextlib.suppress(FileExistsError):  # made by a concurrent writer: fine
                    os.mkdir(part, 0o755, dir_fd=dir_fd)
                next_fd = os.open(part, flags, dir_fd=dir_fd)
            os.close(dir_fd)
            dir_fd = next_fd
        fd = os.open(
            parts[-1],
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o644,
            dir_fd=dir_fd,
        )
    finally:
        os.close(dir_fd)
    return os.fdopen(fd, "wb")


class ThresholdSpill:
    """A write-only sink that creates its file only once more than ``threshold`` bytes arrive.

    Output that fits in the stored history (``threshold``, 16 KiB by default) is never spilled: a
    run that prints a line leaves no file behind. Past the threshold, the buffered prefix and
    everything after go to ``open_spill_file(root, relpath)``.
    """

    def __init__(self, root: Path, relpath: str, threshold: int) -> None:
        self.root, self.relpath, self.threshold = root, relpath, threshold
        self._buffer = bytearray()
        self._file: BinaryIO | None = None

    @property
    def opened(self) -> bool:
        """True once the spill file exists."""
        return self._file is not None

    def write(self, data: bytes) -> int:
        """Buffer or write ``data``; raises ``OSError`` when the file cannot be created or written."""
        if self._file is None:
            self._buffer += data
            if len(self._buffer) <= self.threshold:
                return len(data)
            self._file = open_spill_file(self.root, self.relpath)
            data, self._buffer = bytes(self._buffer), bytearray()
        self._file.write(data)
        return len(data)

    def close(self) -> None:
        """Close the file if one was created."""
        if self._file is not None:
            self._file.close()


@dataclass(frozen=True)
class DirVisit:
    """One directory of a ``walk_tree``.

    Attributes:
        parts: its path components below the root (``()`` for the root).
        entries: ``(name, lstat)`` of each entry, sorted by name; None when the directory could not be
            opened or listed, was no longer the directory its parent listed, or is ``too_deep``.
        complete: every entry could be lstat'ed (entries removed since the listing are just absent).
        too_deep: it lies more than ``max_depth`` levels down and was not opened.
    """

    parts: tuple[str, ...]
    entries: list[tuple[str, os.stat_result]] | None
    complete: bool = True
    too_deep: bool = False


def walk_tree(
    root_fd: int,
    *,
    max_depth: int = MAX_WALK_DEPTH,
    enter: Callable[[tuple[str, ...], os.stat_result], bool] | None = None,
) -> Generator[DirVisit, None, None]:
    """Visit every directory below ``root_fd`` depth first (sorted names), following no symlink.

    Each directory is opened relative to its parent's descriptor (``O_NOFOLLOW``) and checked against
    the (dev, ino) its parent listed, so the walk costs O(entries) whatever the depth (re-opening
    each directory from the root made a 6,000-level tree take tens of seconds) and never leaves the
    tree. A parent's descriptor is closed as soon as its last subdirectory is opened, so a deep
    chain holds two descriptors, and no walk more than ``max_depth`` + 1. ``enter(parts, lstat)``
    chooses which subdirectories to visit (all, by default). The caller's ``root_fd`` stays open.
    """
    frames: list[tuple[int, tuple[str, ...], list[tuple[str, os.stat_result]]]] = []
    fd, parts = os.dup(root_fd), tuple[str, ...]()
    try:
        while True:
            if fd >= 0:
                visit = _list(fd, parts)
                yield visit
                subdirs = [
                    (name, st)
                    for name, st in visit.entries or ()
                    if stat.S_ISDIR(st.st_mode) and (enter is None or enter((*parts, name), st))
                ]
                if subdirs:
                    frames.append((fd, parts, subdirs[::-1]))
                else:
                    os.close(fd)
                fd = -1
            if not frames:
                return
            parent_fd, parent_parts, pending = frames[-1]
            name, listed = pending.pop()
            if not pending:
                frames.pop()
            child = (*parent_parts, name)
            try:
                if len(child) > max_depth:
                    yield DirVisit(child, None, complete=False, too_deep=True)
                    continue
                fd = _open_listed(parent_fd, name, listed)
                if fd < 0:
                    yield DirVisit(child, None, complete=False)
                parts = child
            finally:
                if not pending:
                    os.close(parent_fd)
    finally:
        if fd >= 0:
            os.close(fd)
        for frame_fd, _, _ in frames:
            os.close(frame_fd)


def _open_listed(parent_fd: int, name: str, listed: os.stat_result) -> int:
    """``name`` below ``parent_fd`` as a descriptor, if it is still the directory that was listed; else -1."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError:
        return -1
    try:
        opened = os.fstat(fd)
        if (opened.st_dev, opened.st_ino) == (listed.st_dev, listed.st_ino):
            return fd
    except OSError:
        pass
    os.close(fd)
    return -1


def _list(fd: int, parts: tuple[str, ...]) -> DirVisit:
    try:
        # DirEntry.stat() on an fd-based scandir is an fstatat() relative to ``fd``: it stays open.
        with os.scandir(fd) as listing:
            found = sorted(listing, key=lambda item: item.name)
    except OSError:
        return DirVisit(parts, None, complete=False)
    entries: list[tuple[str, os.stat_result]] = []
    complete = True
    for entry in found:
        try:
            entries.append((entry.name, entry.stat(follow_symlinks=False)))
        except FileNotFoundError:
            continue  # removed since the listing: it is simply not there
        except OSError:
            complete = False
    return DirVisit(parts, entries, complete=complete)
