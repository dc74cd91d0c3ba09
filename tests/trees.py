"""Large file trees for the snapshot tests, built and removed at the cost of their system calls.

Creating 120,000 files through ``pathlib`` costs ~25 µs of Python a file on top of the kernel's
~8 µs; one ``mknod`` relative to an open directory costs ~2 µs of Python. On tmpfs (``/dev/shm``)
the kernel's part is a fraction of ext4's under load, and the walks under test make the same
system calls on both.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


@contextlib.contextmanager
def tmpfs_dir(fallback: Path) -> Iterator[Path]:
    """A fresh directory on /dev/shm when it is writable (removed afterwards), else ``fallback``."""
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
