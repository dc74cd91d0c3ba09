"""Large file trees for the snapshot tests, built and removed at the cost of their system calls.

Creating 120,000 files through ``pathlib`` costs ~25 µs of Python a file on top of the kernel's
~8 µs; one ``mknod`` relative to an open directory costs ~2 µs of Python. On tmpfs the kernel's
part is a fraction of ext4's under load, and the walks under test make the same system calls on
both. Removing such a tree file by file (``shutil.rmtree``: a ``stat`` and an ``unlink`` of Python
each) cost as much again as building it; a tmpfs of the test's own is dropped whole by unmounting.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


_MNT_DETACH = 2  # <sys/mount.h>: unmount now, free the tree when its last user lets go


def _mount_tmpfs(target: Path) -> bool:
    """Mount a fresh tmpfs on ``target``; False where this process may not (not root, no
    ``CAP_SYS_ADMIN``, a seccomp filter)."""
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.mount(b"tmpfs", os.fsencode(target), b"tmpfs", 0, b"mode=0700") == 0


@contextlib.contextmanager
def tmpfs_dir(fallback: Path, *, own_mount: bool = True) -> Iterator[Path]:
    """A fresh directory on a tmpfs: one mounted for it under ``fallback`` and unmounted afterwards
    (everything in it freed at once) where this process may mount and ``own_mount``, else one on
    /dev/shm when it is writable (removed afterwards), else ``fallback`` itself.

    Not ``own_mount`` for a tree a running ``Sandbox`` must see: its spares' mount namespaces were
    copied before the mount was made, so a run in one would find no such directory."""
    mountpoint = Path(tempfile.mkdtemp(prefix="tmpfs-", dir=fallback))
    if own_mount and _mount_tmpfs(mountpoint):
        try:
            tree = mountpoint / "tree"  # a directory, as on /dev/shm, not the mount's root
            tree.mkdir()
            yield tree
        finally:
            ctypes.CDLL(None, use_errno=True).umount2(os.fsencode(mountpoint), _MNT_DETACH)
            mountpoint.rmdir()
        return
    mountpoint.rmdir()
    if not os.access("/dev/shm", os.W_OK):
        yield fallback
        return
    path = Path(tempfile.mkdtemp(prefix="alphaagent-tree-", dir="/dev/shm"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def make_empty_files(root: Path, directory: str, names: Iterable[str]) -> list[str]:
    """Create ``root/directory`` (and its parents) and an empty regular file for each name in it;
    the files' paths relative to ``root``, in order."""
    folder = root / directory
    folder.mkdir(parents=True, exist_ok=True)
    mode = 0o644 | stat.S_IFREG
    made = []
    fd = os.open(folder, _DIR_FLAGS)
    try:
        for name in names:
            os.mknod(name, mode, dir_fd=fd)  # one system call a file
            made.append(f"{directory}/{name}")
    finally:
        os.close(fd)
    return made
