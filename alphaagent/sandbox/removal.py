"""Removing a tree that untrusted code built: iterative, bounded, never following a symlink.

``shutil.rmtree`` (its descriptor-based walk too) and ``os.walk`` on Python 3.11 recurse once per
directory level, so a tree code nested a few thousand levels deep (``os.makedirs("d/" * 5000)`` is
a one-liner, and 5,000 one-letter levels are only 10 KB of path) raises ``RecursionError`` out of
every cleanup that meets it: a session that ends, the scratch area, exec's temporary folder, the
env function's working copy. ``remove_tree`` is the one remover for every tree a run can reach:

- **Iterative**: a stack, not recursion, whatever the depth;
- **Bounded descriptors**: at most ``MAX_OPEN_LEVELS`` directories are held open. A subdirectory
  deeper than that is moved up (renamed into the tree's top folder, which stays open for the whole
  walk), so the chain is cut into pieces of ``MAX_OPEN_LEVELS`` levels without ever going back up
  through ``..`` (which code renaming folders at the same time could point outside the tree);
- **Never follows a symlink**: every level is opened relative to its parent's descriptor with
  ``O_NOFOLLOW | O_DIRECTORY``; a symlink (or anything else that is not a directory) is unlinked as
  an entry, so a link to ``/`` removes the link, never what it points to;
- **Bounded work**: at most ``max_entries`` removals and renames, so code still writing into the
  tree cannot keep the remover busy forever; past it ``TreeTooLargeError`` says so, the rest left;
- **Owner-locked folders**: a directory its owner made unreadable or unwritable (``chmod 000``) is
  given back to the owner (``u+rwx``) through a descriptor of that very directory (never a path
  that could be swapped for a symlink) and the step is tried once more.

Example::

    remove_tree(scope_root / "work/sessions/s1")   # gone, or OSError saying what is left
"""

from __future__ import annotations

import errno
import functools
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

MAX_OPEN_LEVELS: Final = 64
"""Directories held open at once by one removal (the rest of a deeper chain is moved up first); far
below the 1,024 descriptors a process gets by default, whatever else it has open."""

DEFAULT_MAX_ENTRIES: Final = 5_000_000
"""Removals and renames one call makes at most (~10 s at a few microseconds each on tmpfs, a minute
on a slow disk): more entries than any scope's tree has room for (``max_tree_entries`` of a
snapshot is 200,000), so only code still writing into the tree meets it."""

_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_HOIST_PREFIX: Final = ".alphaagent-removing-"
_MAX_HOIST_TRIES: Final = 1_000


class TreeTooLargeError(OSError):
    """A removal stopped after ``max_entries`` steps; what is left stays where it was."""


@dataclass
class _Level:
    fd: int
    name: str  # its name in the level above (the top's: in the folder the caller named)
    pending: list[str] = field(default_factory=list)  # subdirectories still to visit


def remove_tree(path: Path | str, *, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
    """Remove ``path`` and everything below it; a missing ``path`` is fine, a symlink or a file at
    ``path`` is unlinked (never followed). Every component above ``path`` is the caller's (trusted);
    everything below it may be hostile (see ``remove_at`` when a component above is hostile too).

    Raises:
        TreeTooLargeError: more than ``max_entries`` removals were needed (the rest is left).
        OSError: something could not be removed (a folder of another owner, a read-only mount...).
    """
    text = os.path.abspath(os.fspath(path))
    parent_path, name = os.path.split(text)
    try:
        parent = os.open(parent_path or "/", _DIR_FLAGS & ~os.O_NOFOLLOW)  # the caller's own folder
    except FileNotFoundError:
        return
    try:
        remove_at(parent, name, max_entries=max_entries, label=text)
    finally:
        os.close(parent)


def remove_at(parent: int, name: str, *, max_entries: int = DEFAULT_MAX_ENTRIES, label: str = "") -> bool:
    """Remove the entry ``name`` of the directory open at ``parent`` and everything below it (a
    symlink or a file is unlinked, never followed); True when there was one. ``label`` names it in
    errors. Raises as ``remove_tree``."""
    top = _open_level(parent, name)
    if top is None:  # not a directory (or a symlink to one): the entry itself goes
        try:
            os.unlink(name, dir_fd=parent)
        except FileNotFoundError:
            return False
        return True
    _Walk(parent, top, max_entries, label or name).run()
    return True


class _Walk:
    def __init__(self, parent: int, top: int, max_entries: int, label: str) -> None:
        self.parent, self.top, self.budget, self.label = parent, top, max_entries, label
        self.hoisted = 0

    def spend(self) -> None:
        self.budget -= 1
        if self.budget < 0:
            raise TreeTooLargeError(
                errno.ENOTEMPTY, f"{self.label}: more entries than this removal makes at most; left in part"
            )

    def run(self) -> None:
        stack = [_Level(self.top, os.path.basename(self.label))]
        try:
            while stack:
                level = stack[-1]
                if not level.pending:
                    self.scan(level)
                if not level.pending:  # empty now: remove it from the level above
                    stack.pop()
                    os.close(level.fd)
                    self.rmdir(stack[-1].fd if stack else self.parent, level.name)
                    continue
                sub = level.pending.pop()
                if len(stack) < MAX_OPEN_LEVELS:
                    opened = _open_level(level.fd, sub)
                    if opened is not None:
                        stack.append(_Level(opened, sub))
                    else:
                        self.unlink(level.fd, sub)  # swapped for a file or a symlink meanwhile
                else:
                    self.hoist(level.fd, sub)
        finally:
            for level in stack:
                os.close(level.fd)

    def scan(self, level: _Level) -> None:
        """Unlink every entry of ``level`` that is not a directory; note the directories. A folder
        is removed only after a scan finds nothing in it (so entries made meanwhile are seen)."""
        with os.scandir(level.fd) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    level.pending.append(entry.name)
                else:
                    self.unlink(level.fd, entry.name)

    def unlink(self, fd: int, name: str) -> None:
        self.spend()
        try:
            _retry_granted(lambda: os.unlink(name, dir_fd=fd), lambda: _grant_fd(fd))
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            pass  # became a directory meanwhile: the next scan of its folder finds it

    def rmdir(self, fd: int, name: str) -> None:
        self.spend()
        try:
            _retry_granted(lambda: os.rmdir(name, dir_fd=fd), lambda: _grant_fd(fd))
        except FileNotFoundError:
            pass
        except OSError as error:
            if error.errno != errno.ENOTEMPTY or fd == self.parent:
                raise
            # Something was made in it after its last scan: its folder's next scan finds it again.

    def hoist(self, fd: int, name: str) -> None:
        """Move the subdirectory ``name`` of ``fd`` into the top folder under a fresh name."""
        for _ in range(_MAX_HOIST_TRIES):
            self.spend()
            self.hoisted += 1
            target = f"{_HOIST_PREFIX}{self.hoisted}"
            try:
                # Moving a directory rewrites its "..": that needs write permission on it too.
                _retry_granted(
                    functools.partial(os.rename, name, target, src_dir_fd=fd, dst_dir_fd=self.top),
                    functools.partial(_grant_entry, fd, name),
                )
                return
            except FileNotFoundError:
                return
            except OSError as error:
                if error.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
                    raise
        raise OSError(errno.EEXIST, f"{self.label}: no free name to move a deep folder to")


def _open_level(parent: int, name: str) -> int | None:
    """A descriptor of the directory ``name`` in ``parent``; None when it is not a directory (or a
    symlink to one) by now. A folder its owner locked is unlocked once and opened again."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None
    except OSError as error:
        if error.errno == errno.ELOOP:  # a symlink: removed as an entry, never followed
            return None
        if error.errno != errno.EACCES:
            raise
    _grant_entry(parent, name)
    return os.open(name, _DIR_FLAGS, dir_fd=parent)


def _grant_entry(parent: int, name: str) -> None:
    """``chmod u+rwx`` the directory ``name`` of ``parent`` through an ``O_PATH`` descriptor of it
    (no read permission needed to take one, and it cannot be a symlink: ``O_NOFOLLOW``)."""
    handle = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    try:
        mode = os.stat(handle).st_mode
        os.chmod(f"/proc/self/fd/{handle}", stat.S_IMODE(mode) | stat.S_IRWXU)
    finally:
        os.close(handle)


def _grant_fd(fd: int) -> None:
    """``chmod u+rwx`` the directory open at ``fd`` (its owner took away write permission)."""
    os.fchmod(fd, stat.S_IMODE(os.fstat(fd).st_mode) | stat.S_IRWXU)


def _retry_granted(step: Callable[[], None], grant: Callable[[], None]) -> None:
    """Run ``step``; if it is refused for permission, ``grant`` it (give the folder back to its
    owner) and run it once more; a grant that is refused too (another owner's folder, a read-only
    mount) raises its own reason."""
    try:
        step()
    except PermissionError:
        grant()
        step()
