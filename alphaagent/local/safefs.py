"""File operations under a tree that untrusted code can modify, following no symlink at any component.

The local backend keeps every scope under ``$ALPHAAGENT_HOME`` and runs user code with the scope root
as its working directory (DESIGN §4.2, §5), so any name below the home may have been replaced by a
symlink, a FIFO or a directory since we last looked (cases PATH-01, PATH-03). Every function here starts
from an open directory descriptor that the caller trusts and reaches each further component relative to
its parent with ``O_NOFOLLOW``: a symlink anywhere on the way makes the operation fail (``ELOOP`` or
``ENOTDIR``) instead of leaving the tree, and no check-then-use race can redirect it, because nothing is
ever resolved by path string. This generalises ``alphaagent.sandbox.pathsafe.open_spill_file`` from
"create one file" to read, stat, list, atomic replace and copy.

Paths are sequences of components (``("reports", "2024", "q1.md")``) that the caller has already
validated (``check_workspace_path``); the functions only refuse empty, ``.`` and ``..`` components as a
last line of defence. Callers own every descriptor a function returns and must close it.

Example::

    home_fd = open_root(home, create=True)
    try:
        write_atomic(home_fd, ("conversations", "c1", "reports", "a.md"), b"# A\\n")
    finally:
        os.close(home_fd)
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

from alphaagent.sandbox.pathsafe import MAX_WALK_DEPTH, walk_tree

BLOCK_BYTES: Final = 1024 * 1024
"""Copies and hashes read and write in blocks of 1 MiB: memory use stays constant whatever the file size."""

TEMP_PREFIX: Final = ".alphaagent-tmp-"
"""Name prefix of the temporary files that ``write_atomic`` and blob copies rename into place.

Kept short (16 + 16 characters) so that a temporary name fits NAME_MAX (255 bytes) whatever the name
of the file it will replace."""

DIR_OPEN_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
"""Opening one directory component: never a symlink, never anything but a directory."""

# O_NONBLOCK keeps a FIFO planted where a file was expected from blocking the open (it is then refused
# by the fstat check); it has no effect on reads of a regular file.
_FILE_READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_FILE_CREATE_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

MISSING_ERRNOS: Final = frozenset(
    {errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG, errno.ENXIO}
)
"""Errors meaning "there is no regular file reachable here without following a link": a missing
component, a symlink (``ELOOP`` under ``O_NOFOLLOW``), a file where a directory was expected, a
directory where a file was expected, a component longer than NAME_MAX (255 bytes), a socket."""

TOO_DEEP_REASON: Final = f"directory deeper than {MAX_WALK_DEPTH} levels (not listed)"
"""The skipped-entry reason of a directory below the walk's depth bound (``pathsafe.MAX_WALK_DEPTH``)."""

_REASONS: Final = {
    errno.ELOOP: "a component is a symlink (never followed)",
    errno.ENOTDIR: "a component is not a directory (or is a symlink, never followed)",
    errno.EISDIR: "it is a directory",
    errno.ENAMETOOLONG: "a component is longer than the local filesystem allows (255 bytes)",
    errno.ENOENT: "no such file",
    errno.EEXIST: "a different kind of entry exists there",
}


def describe(error: OSError) -> str:
    """A short reason for an ``OSError`` raised here, fit for a message shown to a user or the coder."""
    return _REASONS.get(error.errno or 0, error.strerror or type(error).__name__)


def temp_name() -> str:
    """A fresh temporary file name (``TEMP_PREFIX`` + 64 random bits in hex)."""
    return TEMP_PREFIX + secrets.token_hex(8)


def open_root(path: Path, *, create: bool = False, mode: int = 0o700) -> int:
    """Open the trusted directory every walk starts from (``$ALPHAAGENT_HOME``) and return its fd.

    The root is chosen by the operator, not by user code, so symlinks in ``path`` itself are followed
    (a home under ``/tmp`` on macOS is reached through one). With ``create``, missing directories are
    made first (``mode``, 0o700 by default: the home holds every user's files).

    Raises:
        OSError: ``path`` cannot be opened as a directory (``FileNotFoundError`` when missing).
    """
    if create:
        os.makedirs(path, mode=mode, exist_ok=True)
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def _check_parts(parts: Sequence[str]) -> None:
    if any(part in ("", ".", "..") or "/" in part or "\x00" in part for part in parts):
        raise OSError(errno.EINVAL, f"unsafe path components: {list(parts)!r}")


def open_dir(dir_fd: int, parts: Sequence[str], *, create: bool = False, mode: int = 0o755) -> int:
    """Open the directory ``parts`` below ``dir_fd``, one component at a time, and return a new fd.

    Each component is opened relative to its parent with ``O_NOFOLLOW | O_DIRECTORY``. With ``create``,
    a missing component is made (``mode``) and then opened the same way, so a concurrent writer that made
    it first is fine and one that planted a symlink there is refused. An empty ``parts`` returns a
    duplicate of ``dir_fd``.

    Raises:
        OSError: ``ELOOP``/``ENOTDIR`` for a component that is a symlink or not a directory,
            ``ENOENT`` for a missing one (without ``create``), ``EINVAL`` for an unsafe component.
    """
    _check_parts(parts)
    current = os.dup(dir_fd)
    try:
        for part in parts:
            try:
                next_fd = os.open(part, DIR_OPEN_FLAGS, dir_fd=current)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):  # made by a concurrent writer: fine
                    os.mkdir(part, mode, dir_fd=current)
                next_fd = os.open(part, DIR_OPEN_FLAGS, dir_fd=current)
            os.close(current)
            current = next_fd
    except BaseException:
        os.close(current)
        raise
    return current


def open_regular(dir_fd: int, parts: Sequence[str]) -> int:
    """Open the regular file ``parts`` below ``dir_fd`` for reading and return its fd.

    Raises:
        FileNotFoundError: no regular file is reachable there without following a link: a component is
            missing, a symlink or not a directory, or the file is a directory, FIFO, socket or device.
            The message says which.
        OSError: anything else (``PermissionError`` for an unreadable file).
    """
    if not parts:
        raise FileNotFoundError(errno.ENOENT, "no regular file (empty path)")
    shown = "/".join(parts)
    try:
        parent = open_dir(dir_fd, parts[:-1])
        try:
            fd = os.open(parts[-1], _FILE_READ_FLAGS, dir_fd=parent)
        finally:
            os.close(parent)
    except OSError as error:
        if error.errno in MISSING_ERRNOS:
            raise FileNotFoundError(errno.ENOENT, f"no regular file: {describe(error)}", shown) from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FileNotFoundError(errno.ENOENT, "no regular file: not a regular file", shown)
    except BaseException:
        os.close(fd)
        raise
    return fd


def lstat_at(dir_fd: int, parts: Sequence[str]) -> os.stat_result | None:
    """The lstat of ``parts`` below ``dir_fd``, or None when it cannot be reached without a link.

    The last component is not followed either: a symlink there is reported as a symlink.
    """
    if not parts:
        return os.fstat(dir_fd)
    try:
        parent = open_dir(dir_fd, parts[:-1])
    except OSError as error:
        if error.errno in MISSING_ERRNOS:
            return None
        raise
    try:
        return os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
    except OSError as error:
        if error.errno in MISSING_ERRNOS:
            return None
        raise
    finally:
        os.close(parent)


def write_atomic(dir_fd: int, parts: Sequence[str], data: bytes, *, mode: int = 0o644) -> None:
    """Replace the file ``parts`` below ``dir_fd`` with ``data``, atomically, creating parent folders.

    The bytes go to a temporary file in the same directory (``O_EXCL | O_NOFOLLOW``), are fsynced, and
    the temporary file is renamed over the target: a reader sees the old content or the new, never a
    mix. A symlink or directory at the target is refused rather than replaced. Should one appear between
    that check and the rename, the rename replaces the link itself and still writes nothing through it.

    Raises:
        OSError: ``ELOOP``/``ENOTDIR`` for a symlink or non-directory among the parents, ``ELOOP`` for a
            symlink at the target, ``EISDIR`` for a directory there, ``ENAMETOOLONG`` for a component
            over 255 bytes. No temporary file is left behind.
    """
    if not parts:
        raise OSError(errno.EINVAL, "empty path")
    parent = open_dir(dir_fd, parts[:-1], create=True)
    name = parts[-1]
    try:
        tmp = temp_name()
        fd = os.open(tmp, _FILE_CREATE_FLAGS, mode, dir_fd=parent)
        try:
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            _refuse_non_file(parent, name)
            os.replace(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=parent)
            raise
    finally:
        os.close(parent)


def _refuse_non_file(parent: int, name: str) -> None:
    try:
        existing = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(existing.st_mode):
        raise OSError(errno.ELOOP, "the target is a symlink (never replaced through)", name)
    if stat.S_ISDIR(existing.st_mode):
        raise IsADirectoryError(errno.EISDIR, "the target is a directory", name)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def create_temp(dir_fd: int, *, mode: int = 0o600) -> tuple[str, int]:
    """Create a new, empty temporary file in the directory ``dir_fd``; return ``(name, writable fd)``."""
    name = temp_name()
    return name, os.open(name, _FILE_CREATE_FLAGS, mode, dir_fd=dir_fd)


def copy_and_hash(src_fd: int, dst_fd: int) -> tuple[str, int]:
    """Copy everything readable from ``src_fd`` to ``dst_fd`` while hashing it, in ``BLOCK_BYTES`` blocks.

    Sparsely: holes of the source (``SEEK_HOLE``/``SEEK_DATA``) and blocks that are all zeros are
    hashed but not written, and the copy is extended to the full size with ``ftruncate``, so a 1 GiB
    file that holds 4 KiB of data takes 4 KiB of disk in the blob store, not 1 GiB per version. A
    filesystem without hole support reports the whole file as data; zero blocks are still skipped.

    Returns ``(sha256 hex digest, size in bytes)`` of exactly the bytes the copy holds (holes read as
    zeros), so a file that changes during the copy still yields a copy that matches its digest. Memory
    use is two blocks.
    """
    digest = hashlib.sha256()
    buffer = bytearray(BLOCK_BYTES)
    view = memoryview(buffer)
    zeros = bytes(BLOCK_BYTES)
    offset = 0
    for data_start, data_end in _data_segments(src_fd):
        _hash_zeros(digest, data_start - offset, zeros)
        offset = data_start
        while offset < data_end:
            count = os.preadv(src_fd, [view[: min(BLOCK_BYTES, data_end - offset)]], offset)
            if count == 0:
                break  # truncated since it was measured: the copy ends here
            chunk = view[:count]
            digest.update(chunk)
            if chunk != zeros[:count]:
                _pwrite_all(dst_fd, chunk, offset)
            offset += count
        if offset < data_end:
            break
    os.ftruncate(dst_fd, offset)
    return digest.hexdigest(), offset


def _data_segments(fd: int) -> Iterator[tuple[int, int]]:
    """``(start, end)`` byte ranges of ``fd`` that may hold data, in order; the rest are holes. The
    last range ends at the size (a trailing hole is a range of no data at the end)."""
    size = os.fstat(fd).st_size
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
            end = os.lseek(fd, start, os.SEEK_HOLE)
        except OSError as error:
            if error.errno == errno.ENXIO:  # no data after offset: a hole up to the end
                yield size, size
                return
            if error.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                raise
            yield offset, size  # no hole support here: all of it is data
            return
        yield start, min(end, size)
        offset = end
    yield size, size


def _hash_zeros(digest: hashlib._Hash, count: int, zeros: bytes) -> None:
    while count > 0:
        step = min(count, len(zeros))
        digest.update(zeros[:step])
        count -= step


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written


def publish_once(src_dir_fd: int, src_name: str, dst_dir_fd: int, dst_name: str) -> bool:
    """Move the finished file ``src_name`` to ``dst_name`` unless a regular file is already there.

    Made for content-addressed storage, where the same name always means the same bytes: the existing
    file is never rewritten (a hard link creates the name only if it is absent, atomically, so two
    concurrent writers cannot both win), and the source is removed either way. On a filesystem without
    hard links the file is renamed into place instead. Anything but a regular file at ``dst_name`` (a
    planted symlink) is replaced, never written through.

    Returns:
        True when this call created ``dst_name``; False when it existed already.
    """
    try:
        try:
            os.link(src_name, dst_name, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd, follow_symlinks=False)
            return True
        except FileExistsError:
            existing = os.stat(dst_name, dir_fd=dst_dir_fd, follow_symlinks=False)
            if stat.S_ISREG(existing.st_mode):
                return False
            os.replace(src_name, dst_name, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
            return True
        except OSError as error:
            if error.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                raise
            os.replace(src_name, dst_name, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
            return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(src_name, dir_fd=src_dir_fd)


def kind_of(mode: int) -> str:
    """A short name for a non-regular file type, for the list of skipped entries."""
    for test, name in (
        (stat.S_ISLNK, "symlink"),
        (stat.S_ISFIFO, "fifo"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "device"),
        (stat.S_ISBLK, "device"),
    ):
        if test(mode):
            return name
    return "special file"


def iter_regular_files(
    dir_fd: int, skipped: list[tuple[str, str]] | None = None
) -> Iterator[tuple[str, os.stat_result]]:
    """Yield ``(relative POSIX path, lstat)`` of every regular file below ``dir_fd``, depth first.

    Nothing but directories is ever opened, each relative to its parent's descriptor with
    ``O_NOFOLLOW`` (``pathsafe.walk_tree``: O(entries) whatever the depth), so a symlinked directory is
    neither entered nor listed, and a directory swapped for a symlink mid-walk is skipped. Symlinks,
    FIFOs, sockets and devices are skipped, as are directories that cannot be opened or listed, and
    directories more than ``MAX_WALK_DEPTH`` (512) levels down. Names are yielded as the OS gives them
    (``os.fsdecode``: a name that is not UTF-8 carries surrogate escapes); order is sorted within each
    directory, not overall. When ``skipped`` is given, each entry that is neither a regular file nor
    a directory is appended to it as ``(relative path, kind)``, and each directory too deep to list as
    ``(relative path, "directory deeper than 512 levels (not listed)")``; none is opened or followed.
    """
    for visit in walk_tree(dir_fd):
        if visit.too_deep:
            if skipped is not None:
                skipped.append(("/".join(visit.parts), TOO_DEEP_REASON))
            continue
        for name, info in visit.entries or ():
            if stat.S_ISREG(info.st_mode):
                yield "/".join((*visit.parts, name)), info
            elif skipped is not None and not stat.S_ISDIR(info.st_mode):
                skipped.append(("/".join((*visit.parts, name)), kind_of(info.st_mode)))
