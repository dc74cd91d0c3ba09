"""Snapshots of a scope's working tree, and the regular files that changed between two of them.

The sandbox supervisor snapshots the scope root (DESIGN §4.2) before and after a run and hands the
difference to the sync, which uploads regular files only. The tree is written by untrusted code, so the
walk treats every name as hostile (case PATH-01): it uses lstat semantics only, never follows a symlink,
never descends into a symlinked directory, never opens a special file, survives names that are not UTF-8
and directories it cannot list, and stops after a bounded number of entries. Whatever it does not treat
as a regular file or a directory comes back in ``FileChanges.skipped`` with a reason.

Example::

    before = take_snapshot(scope_root, exclude=["work/runs/01ABC"])
    ...  # the run
    after = take_snapshot(scope_root, exclude=["work/runs/01ABC"])
    changes = diff_snapshots(before, after, hash_cache=cache)
    changes.created, changes.modified, changes.deleted  # ("reports/a.csv",), (), ()
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Final, Literal

from alphaagent.sandbox.pathsafe import MAX_WALK_DEPTH, walk_tree

EntryKind = Literal["file", "dir", "symlink", "fifo", "socket", "device", "other"]
"""What an lstat of a path found; only ``file`` entries are ever reported as created/modified/deleted."""

HashKey = tuple[int, ...]
"""``(dev, ino, size, mtime_ns)`` of one version of a regular file: the key of ``HashCache``
(``treestate`` adds the ``ctime_ns``)."""

DEFAULT_MAX_ENTRIES: Final = 100_000
"""Entries a snapshot records before it stops and sets ``truncated``; bounds time and memory."""

DEFAULT_HASH_CACHE_ENTRIES: Final = 4096
"""Digests a ``HashCache`` keeps by default (about 0.5 MiB)."""

HASH_BLOCK_BYTES: Final = 1024 * 1024
"""``sha256_file`` reads in blocks of 1 MiB."""

# The fixed reasons of SkippedEntry, for callers that act on a reason without matching literals.
REASON_NOT_UTF8: Final = "name is not valid UTF-8"
REASON_UNREADABLE_DIR: Final = "unreadable directory"
REASON_SYMLINK: Final = "symlink"
REASON_SYMLINK_TO_DIR: Final = "symlink to directory (not followed)"
REASON_TOO_DEEP: Final = f"directory deeper than {MAX_WALK_DEPTH} levels (not listed)"

_KIND_REASONS: Final[Mapping[EntryKind, str]] = {
    "fifo": "fifo",
    "socket": "socket",
    "device": "device",
    "other": "other file type",
}
# The root is chosen by the supervisor, not by the run, so a symlinked root (e.g. a tmp dir) is accepted.
_ROOT_OPEN_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# O_NONBLOCK keeps a FIFO that replaced a file since the snapshot from blocking the open; it has no
# effect on reads of a regular file.
_FILE_OPEN_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


@dataclass(frozen=True, slots=True)
class Entry:
    """The lstat of one path in a snapshot.

    Attributes:
        kind: what the path is; a symlink is always ``symlink``, whatever it points at.
        size: ``st_size`` in bytes (for a symlink, the length of its target string).
        mtime_ns: ``st_mtime_ns``, nanoseconds since the epoch.
        ino: ``st_ino``.
        dev: ``st_dev``.
        mode: ``st_mode`` (type and permission bits).
        blocks: ``st_blocks``, 512-byte units allocated on disk (what a sparse file really takes).
    """

    kind: EntryKind
    size: int
    mtime_ns: int
    ino: int
    dev: int
    mode: int
    blocks: int = 0


@dataclass(frozen=True)
class TreeSnapshot:
    """Everything ``take_snapshot`` saw under one root.

    Attributes:
        root: the absolute path that was walked (not resolved; see ``take_snapshot``).
        entries: workspace-relative POSIX path (valid UTF-8, no leading ``./``) → ``Entry``, for
            files, directories and special files alike; the root itself is not an entry.
        truncated: the walk stopped after ``max_entries`` entries, so paths may be missing.
        unreadable: relative paths of directories that could not be listed, or only partly (``"."``
            for the root); such a directory appears in ``entries``, what lies beneath it may not.
        invalid_names: entries whose name is not valid UTF-8, keyed by a display path in which the bad
            bytes are escaped with ``backslashreplace`` (``b"bad\\xff.csv"`` → ``"bad\\\\xff.csv"``).
            They are kept apart from ``entries`` because a display path is not a real path: it cannot
            be opened and may even equal the name of another, genuine file. A directory with such a
            name is not entered.
        too_deep: relative paths of directories more than ``MAX_WALK_DEPTH`` (512) levels down: they
            appear in ``entries``, nothing beneath them is listed.
    """

    root: str
    entries: Mapping[str, Entry]
    truncated: bool = False
    unreadable: tuple[str, ...] = ()
    invalid_names: Mapping[str, Entry] = field(default_factory=dict)
    too_deep: tuple[str, ...] = ()


@dataclass(frozen=True)
class SkippedEntry:
    """A path the sync will not upload, and why.

    Attributes:
        path: workspace-relative POSIX path (a display path for a name that is not UTF-8).
        reason: one of ``"symlink"``, ``"symlink to directory (not followed)"``, ``"fifo"``,
            ``"socket"``, ``"device"``, ``"other file type"``, ``"name is not valid UTF-8"``,
            ``"unreadable directory"``, ``"directory deeper than 512 levels (not listed)"``. Never
            contains a symlink's target.
    """

    path: str
    reason: str


@dataclass(frozen=True)
class FileChanges:
    """The regular files a run created, modified or deleted, and what was skipped.

    Attributes:
        created: sorted relative paths of regular files that are new (or were not a regular file before).
        modified: sorted relative paths of regular files whose content changed (see ``diff_snapshots``).
        deleted: sorted relative paths of regular files that are gone or are no longer a regular file.
        skipped: entries new or changed in the after-snapshot that are neither a regular file nor a
            directory, plus newly unreadable directories and names that are not UTF-8; sorted by path.
        truncated: either snapshot was truncated, or (``treestate``) more paths changed than one
            report may list, so the lists are incomplete.
        unreported: changed paths left out of this report by ``treestate``'s cap; they are carried
            into the next report (0 when ``diff_snapshots`` made it: it cannot tell).
    """

    created: tuple[str, ...]
    modified: tuple[str, ...]
    deleted: tuple[str, ...]
    skipped: tuple[SkippedEntry, ...]
    truncated: bool
    unreported: int = 0

    @property
    def changed(self) -> tuple[str, ...]:
        """Sorted union of ``created``, ``modified`` and ``deleted``."""
        return tuple(sorted({*self.created, *self.modified, *self.deleted}))


class HashCache:
    """A bounded LRU map from ``HashKey`` ``(dev, ino, size, mtime_ns)`` to a sha256 hex digest.

    ``diff_snapshots`` fills it with the digest of every file it had to hash, so that a later diff can
    tell an identical rewrite from a real change. Not thread-safe; keep one per supervisor.

    Args:
        max_entries: digests kept; the least recently used is evicted beyond that. Must be >= 1.

    Raises:
        ValueError: ``max_entries`` < 1.
    """

    def __init__(self, max_entries: int = DEFAULT_HASH_CACHE_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        self._max_entries = max_entries
        self._digests: OrderedDict[HashKey, str] = OrderedDict()

    def get(self, key: HashKey) -> str | None:
        """Return the hex digest stored for ``key`` (marking it recently used), or ``None``."""
        digest = self._digests.get(key)
        if digest is not None:
            self._digests.move_to_end(key)
        return digest

    def put(self, key: HashKey, digest: str) -> None:
        """Store ``digest`` (64 hex characters) for ``key``; the least recently used beyond the bound goes."""
        self._digests[key] = digest
        self._digests.move_to_end(key)
        if len(self._digests) > self._max_entries:
            self._digests.popitem(last=False)

    def __len__(self) -> int:
        """Number of digests held."""
        return len(self._digests)


def sha256_file(path: Path) -> str:
    """Return the sha256 hex digest of the regular file at ``path``, read in 1 MiB blocks.

    The open uses ``O_NOFOLLOW``, so a symlink in the last component is refused rather than followed,
    and ``O_NONBLOCK``, so a FIFO does not hang the caller.

    Raises:
        OSError: the file cannot be opened or read; ``errno.ELOOP`` when ``path`` is a symlink,
            ``errno.EINVAL`` when it is not a regular file.
    """
    fd = os.open(path, _FILE_OPEN_FLAGS)
    with open(fd, "rb", buffering=0, closefd=True) as stream:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        digest = hashlib.sha256()
        buffer = bytearray(HASH_BLOCK_BYTES)
        view = memoryview(buffer)
        while count := stream.readinto(buffer):
            digest.update(view[:count])
        return digest.hexdigest()


def take_snapshot(
    root: Path, *, exclude: Sequence[str] = (), max_entries: int = DEFAULT_MAX_ENTRIES
) -> TreeSnapshot:
    """Walk the tree under ``root`` without following any symlink and record the lstat of every entry.

    The walk is iterative (a tree thousands of levels deep is fine) and each directory's listing is
    sorted, so a truncated walk stops at the same place in two snapshots of the same tree. Nothing is
    opened except directories, each with ``O_NOFOLLOW`` and checked against the (dev, ino) its parent
    listed; symlinks, FIFOs, sockets and devices are lstat'ed and recorded, never opened or entered.

    Args:
        root: the scope root. Chosen by the supervisor, so it may itself be reached through a symlink.
        exclude: workspace-relative path prefixes matched by whole components: ``"work/runs/01ABC"``
            excludes that path and everything beneath it but not ``"work/runs/01ABCD"``. A leading
            ``./`` and a trailing ``/`` are ignored.
        max_entries: entries recorded (including names that are not UTF-8) before the walk stops and
            sets ``truncated``.

    Returns:
        A ``TreeSnapshot``. Directories that cannot be listed, or whose entries cannot be lstat'ed, are
        named in ``unreadable``; a directory replaced by something else during the walk counts as
        unreadable too.

    Raises:
        ValueError: an ``exclude`` prefix is empty, absolute or contains ``..``; ``max_entries`` < 0.
        OSError: ``root`` itself cannot be opened and listed as a directory.
    """
    if max_entries < 0:
        raise ValueError(f"max_entries must not be negative, got {max_entries}")
    excluded = frozenset(_normalise_exclude(prefix) for prefix in exclude)
    root_str = os.path.abspath(root)
    entries: dict[str, Entry] = {}
    invalid_names: dict[str, Entry] = {}
    unreadable: list[str] = []
    too_deep: list[str] = []
    truncated = False

    def enter(parts: tuple[str, ...], st: os.stat_result) -> bool:
        return _is_utf8(parts[-1]) and "/".join(parts) not in excluded

    root_fd = os.open(root_str, _ROOT_OPEN_FLAGS)
    try:
        walk = walk_tree(root_fd, enter=enter)  # a generator: closed below, so its descriptors are too
        try:
            for visit in walk:
                rel_dir = "/".join(visit.parts)
                if visit.too_deep:
                    too_deep.append(rel_dir)
                    continue
                if visit.entries is None:
                    if not visit.parts:
                        raise OSError(errno.EIO, f"cannot list {root_str}")
                    unreadable.append(rel_dir)
                    continue
                if not visit.complete:
                    unreadable.append(rel_dir or ".")
                for name, st in visit.entries:
                    rel = f"{rel_dir}/{name}" if rel_dir else name
                    if rel in excluded:
                        continue
                    if len(entries) + len(invalid_names) >= max_entries:
                        truncated = True
                        break
                    if not _is_utf8(name):
                        invalid_names[_display_path(rel_dir, name)] = _entry_from_stat(st)
                        continue
                    entries[rel] = _entry_from_stat(st)
                if truncated:
                    break
        finally:
            walk.close()
    finally:
        os.close(root_fd)
    return TreeSnapshot(
        root=root_str,
        entries=MappingProxyType(entries),
        truncated=truncated,
        unreadable=tuple(unreadable),
        invalid_names=MappingProxyType(invalid_names),
        too_deep=tuple(too_deep),
    )


def diff_snapshots(
    before: TreeSnapshot, after: TreeSnapshot, *, hash_cache: HashCache | None = None
) -> FileChanges:
    """Compare two snapshots of the same root and report the regular files that changed.

    A regular file present in both is unchanged when its (size, mtime_ns, ino, dev) are all equal, and
    modified when its size differs. When only mtime, inode or device differ, the content decides: the
    after-file is hashed (and its digest put in ``hash_cache``), and the file is unchanged only if
    ``hash_cache`` also holds the digest of the before-version and the two are equal. A hash is thus
    computed only when stat metadata disagrees, and a before-digest is known only when an earlier diff
    hashed that version, so the first same-size rewrite of a file is always reported modified; without
    a ``hash_cache`` nothing is hashed and every such file is modified. A file that cannot be hashed
    (gone, unreadable, replaced) is modified. Like git and rsync, a rewrite that keeps size, mtime_ns,
    inode and device is not detected.

    A path whose kind changed counts as deleted (it was a regular file) and/or created (it is one now);
    a regular file replaced by a symlink is deleted, and the symlink is skipped. A regular file missing
    from ``after`` is deleted only when ``after`` could have seen it: not when it lies beneath a
    directory that ``after`` could not list, and not at all when ``after`` is truncated.

    Symlink reasons say whether the target is a directory; finding that out stats through the link
    (without opening anything), and the target itself never appears in the report.

    Args:
        before: the snapshot taken before the run.
        after: the snapshot taken after it; its ``root`` is where files are hashed.
        hash_cache: digests remembered between diffs; read and filled in place.

    Returns:
        ``FileChanges`` with sorted tuples; only regular files appear in created/modified/deleted.
    """
    after_root = Path(after.root)
    created: list[str] = []
    modified: list[str] = []
    deleted: list[str] = []
    skipped: list[SkippedEntry] = []

    for path, new in after.entries.items():
        old = before.entries.get(path)
        if new.kind == "file":
            if old is None or old.kind != "file":
                created.append(path)
            elif _content_changed(old, new, after_root / path, hash_cache):
                modified.append(path)
        elif new.kind != "dir" and new != old:
            skipped.append(SkippedEntry(path, _skip_reason(new, after_root / path)))

    newly_unreadable = frozenset(after.unreadable) - frozenset(before.unreadable)
    after_unreadable = frozenset(after.unreadable) | frozenset(after.too_deep)
    for path, old in before.entries.items():
        if old.kind != "file":
            continue
        now = after.entries.get(path)
        if now is not None:
            if now.kind != "file":
                deleted.append(path)
        elif not after.truncated and not _beneath_any(path, after_unreadable):
            deleted.append(path)

    skipped.extend(SkippedEntry(path, REASON_UNREADABLE_DIR) for path in newly_unreadable)
    skipped.extend(SkippedEntry(path, REASON_TOO_DEEP) for path in after.too_deep)
    skipped.extend(
        SkippedEntry(path, REASON_NOT_UTF8)
        for path, new in after.invalid_names.items()
        if before.invalid_names.get(path) != new
    )
    return FileChanges(
        created=tuple(sorted(created)),
        modified=tuple(sorted(modified)),
        deleted=tuple(sorted(deleted)),
        skipped=tuple(sorted(skipped, key=lambda item: (item.path, item.reason))),
        truncated=before.truncated or after.truncated,
    )


def _normalise_exclude(prefix: str) -> str:
    parts = [part for part in prefix.split("/") if part not in ("", ".")]
    if prefix.startswith("/") or not parts or ".." in parts:
        raise ValueError(f"exclude prefix must be a relative path inside the scope, got {prefix!r}")
    return "/".join(parts)


def _entry_from_stat(st: os.stat_result) -> Entry:
    return Entry(
        kind=_kind_of(st.st_mode),
        size=st.st_size,
        mtime_ns=st.st_mtime_ns,
        ino=st.st_ino,
        dev=st.st_dev,
        mode=st.st_mode,
        blocks=st.st_blocks,
    )


def _kind_of(mode: int) -> EntryKind:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "other"


def _is_utf8(name: str) -> bool:
    # os.fsdecode maps bytes that are not UTF-8 to lone surrogates, which refuse to encode.
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _display_path(rel_dir: str, name: str) -> str:
    shown = os.fsencode(name).decode("utf-8", "backslashreplace")
    return f"{rel_dir}/{shown}" if rel_dir else shown


def _hash_key(entry: Entry) -> HashKey:
    return (entry.dev, entry.ino, entry.size, entry.mtime_ns)


def _content_changed(old: Entry, new: Entry, path: Path, hash_cache: HashCache | None) -> bool:
    if _hash_key(old) == _hash_key(new):
        return False
    if old.size != new.size or hash_cache is None:
        return True
    after_digest = hash_cache.get(_hash_key(new))
    if after_digest is None:
        try:
            after_digest = sha256_file(path)
        except OSError:
            return True
        hash_cache.put(_hash_key(new), after_digest)
    return hash_cache.get(_hash_key(old)) != after_digest


def _skip_reason(entry: Entry, path: Path) -> str:
    if entry.kind != "symlink":
        return _KIND_REASONS.get(entry.kind, _KIND_REASONS["other"])
    try:
        points_at_dir = stat.S_ISDIR(os.stat(path).st_mode)
    except (OSError, ValueError):
        points_at_dir = False  # dangling, a loop, or unreachable: still just a symlink
    return REASON_SYMLINK_TO_DIR if points_at_dir else REASON_SYMLINK


def _beneath_any(path: str, directories: frozenset[str]) -> bool:
    if not directories:
        return False
    if "." in directories:
        return True
    cut = path.rfind("/")
    while cut > 0:
        path = path[:cut]
        if path in directories:
            return True
        cut = path.rfind("/")
    return False
