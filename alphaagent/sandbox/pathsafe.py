"""Opening files inside a tree that untrusted code can modify, without following its symlinks."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import BinaryIO


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
