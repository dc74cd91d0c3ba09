"""The state of a scope's tree kept between runs, so a run's change report costs what changed, not a
second walk of the scope (issue 11, item 1).

``take_snapshot`` + ``diff_snapshots`` walk the whole scope before and after every run. Here the
after-state of one run is the before-state of the next, and the after-walk is incremental:

- **Before a run: no walk.** An inotify watch on every directory of the tree tells whether anything
  wrote to it since the last walk (the backend copying a dataset, registering an artifact, the user
  editing a file). If nothing did, the kept state is reused as is; if something did (or inotify is
  not available), a refresh walk folds those changes into the state *without* reporting them, so a
  write by someone else is never passed off as the run's.
- **After a run, at the ``namespaces`` level: only what inotify's events name** (``update`` with
  ``trust_events``). Every directory of the tree is watched (the watch is added before it is
  listed). A directory that had an entry created, deleted or renamed is listed again (a new
  subdirectory is walked whole); an entry named by any other event is lstat'ed; nothing else is
  looked at. Why that sees every change the run made (checked on Linux 6.18):

  - a write, ``truncate``, ``fallocate``, ``copy_file_range`` or a write through
    ``/proc/self/fd`` queues ``IN_MODIFY``, ``chmod``/``utime`` ``IN_ATTRIB``, with the name the
    file was opened by, in that name's directory;
  - a write through a shared mapping (``numpy.memmap``) queues nothing while it writes, and
    ``IN_CLOSE_WRITE`` only when the last reference goes (which may be after the update, while the
    run's process exits): the ``IN_OPEN`` of the open that made the mapping names the file, and the
    write fault has moved its mtime by the time the run has exited. No process of the run is left
    to write through a mapping once the update runs: the supervisor awaits the run's exit (its pid
    namespace's init kills every other process first) and kills the namespace through its init when
    no exit comes, whatever the code did to its pipes or its report (``Sandbox._supervise``);
  - a file with several names gets an event for the name written through only, so every regular
    file with ``st_nlink > 1`` is lstat'ed by every update (and by ``prepare``); a new name (the
    count rises, or a new entry has several) may lie where no watch sees writes through it, so that
    update walks;
  - the run can give a file of the scope a name only on the scope's own mount: it is the run's only
    writable mount of that filesystem (``zygote._private_view``), and ``link(2)``/``rename(2)``
    across mounts fail with ``EXDEV``. Names in the excluded directories (``work/runs``,
    ``work/sessions``), which are not part of the tree, are covered by watches there for new
    entries only: a new file with several names there, or a directory that cannot be watched,
    makes the update walk.

  It walks instead when events cannot vouch: the first update, a watch that could not be added
  (``max_user_watches``), an overflowed queue (16,384 events by default), the root replaced, a
  directory too deep to watch, a new hard link as above; and always at the process level (the run
  could link a scope file from anywhere it can write on that filesystem) and without inotify.
  The update runs once every process of the run is gone (above), so nothing of it writes later.
- **The walk: directories are listed only when they changed.** A directory whose (dev, ino,
  mtime_ns, ctime_ns) are those of its last listing has the same entries (adding, removing or
  renaming an entry updates its mtime and ctime; ``utime`` can set the mtime back, never the ctime),
  so its names are taken from the state and only lstat'ed. A file's content is another matter: a
  write updates the file's own mtime/ctime and nothing of its directory, so the walk lstat's
  **every entry** (one ``fstatat`` each, relative to its directory's descriptor; about 1-5 µs).
  The walk is the source of truth whenever events are not trusted.
- **Racy timestamps.** Where the kernel stamps files with a coarse clock (one jiffy, up to 10 ms,
  before multigrain timestamps in Linux 6.13), a write in the same tick as a walk's lstat would leave
  the same timestamps. ``settle()`` holds a run back until ``RACY_NS`` after the walk its state came
  from started, so everything the run writes carries a later stamp; a directory whose ctime is within
  ``RACY_NS`` of its listing is never trusted (listed again next time).
- **No silent cap.** The walk records every entry. At most ``max_reported`` changed paths go in one
  result (sorted, created before modified before deleted); the result then says ``truncated`` and how
  many were left out, and those are carried into the next run's report, so no change is ever lost.
- **Hashing.** A regular file present before and after is modified when its size differs (not
  hashed); when only mtime, ctime, inode or device differ it is hashed, and unchanged only if the
  digest of its before-version is known and equal. A file that is new or whose size changed is
  never hashed.

The walk keeps the security properties of ``pathsafe.walk_tree``: every directory is opened relative
to its parent's descriptor with ``O_NOFOLLOW`` and checked against the (dev, ino) its parent listed,
nothing else is ever opened (hashing opens with ``O_NOFOLLOW | O_NONBLOCK``), no symlink is followed,
directories more than 512 levels down are reported, not listed, and names that are not UTF-8 are
reported under an escaped display path. The collector is paused during a walk (it allocates ~one
tuple per entry, which would otherwise trigger full collections of a large heap).

Example::

    states = TreeStates()
    state = states.checkout(root, exclude=("work/runs",))   # before the run: usually no walk
    state.settle()
    ...  # the run
    changes = state.update(report=True, max_reported=100_000, hash_cache=cache, trust_events=True)
    states.checkin(state)
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import gc
import os
import stat
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from alphaagent.sandbox.pathsafe import MAX_WALK_DEPTH
from alphaagent.sandbox.snapshot import (
    _KIND_REASONS,
    REASON_NOT_UTF8,
    REASON_SYMLINK,
    REASON_SYMLINK_TO_DIR,
    REASON_TOO_DEEP,
    REASON_UNREADABLE_DIR,
    FileChanges,
    HashCache,
    SkippedEntry,
    _display_path,
    _is_utf8,
    _normalise_exclude,
    sha256_file,
)

RACY_NS: Final = 20_000_000
"""20 ms: more than one tick of the coarse clock Linux stamps files with (a jiffy: 10 ms at HZ=100,
the slowest common setting); a timestamp closer than this to a walk may repeat after it."""

DEFAULT_MAX_STATES: Final = 16
"""Trees kept at once by a ``TreeStates``; each holds one inotify instance (the kernel's default
``max_user_instances`` is 128 per user, shared with everything else the user runs)."""

DEFAULT_MAX_KEPT_ENTRIES: Final = 2_000_000
"""Entries kept over all trees of a ``TreeStates`` (about 200 bytes each: ~400 MiB at most);
least recently used trees are dropped beyond it and walked afresh when next used."""

_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_ROOT_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# inotify(7): every event that means an entry of a watched directory was written, created, deleted,
# renamed, had its attributes changed or was opened, or the directory itself went away.
_IN_MODIFY, _IN_ATTRIB, _IN_CLOSE_WRITE, _IN_OPEN = 0x2, 0x4, 0x8, 0x20
_IN_MOVED_FROM, _IN_MOVED_TO, _IN_CREATE, _IN_DELETE = 0x40, 0x80, 0x100, 0x200
_IN_DELETE_SELF, _IN_MOVE_SELF, _IN_UNMOUNT, _IN_Q_OVERFLOW = 0x400, 0x800, 0x2000, 0x4000
_IN_IGNORED, _IN_ONLYDIR, _IN_ISDIR = 0x8000, 0x01000000, 0x40000000
_IN_NONBLOCK, _IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
_WATCH_MASK: Final = (
    _IN_MODIFY
    | _IN_ATTRIB
    | _IN_CLOSE_WRITE
    | _IN_OPEN
    | _IN_MOVED_FROM
    | _IN_MOVED_TO
    | _IN_CREATE
    | _IN_DELETE
    | _IN_DELETE_SELF
    | _IN_MOVE_SELF
    | _IN_ONLYDIR
)
_SHADOW_MASK: Final = _IN_CREATE | _IN_MOVED_TO | _IN_ONLYDIR
"""On the excluded directories (``work/runs``, ``work/sessions``) and everything below them: only
what could bring a hard link to a file of the tree there (see ``TreeState.update``)."""
_LISTING_EVENTS: Final = _IN_CREATE | _IN_DELETE | _IN_MOVED_FROM | _IN_MOVED_TO
_ABSORB_EVERY: Final = 1024
"""Directories opened by a walk between two reads of the inotify queue: each open queues two
``IN_OPEN`` events (the directory's own watch and its parent's), and the queue holds 16,384 by
default (``/proc/sys/fs/inotify/max_queued_events``); the walk's own opens must never overflow it."""

Sig = tuple[int, int, int, int, int, int, int]
"""``(st_mode, st_size, st_mtime_ns, st_ctime_ns, st_ino, st_dev, st_blocks)`` of one entry."""

_DirSig = tuple[int, int, int, int]


@dataclass(slots=True)
class _Dir:
    """What the last listing of one directory found: its names (excluded and non-UTF-8 names too,
    so a pruned directory still accounts for them) and the signature that makes them reusable."""

    names: list[str]
    trusted: _DirSig | None
    """(dev, ino, mtime_ns, ctime_ns) when the listing may be reused while they stay equal; None
    when the directory must be listed again (changed too close to its listing, or partly read)."""
    stamps: list[tuple[int, int]]
    """(ctime_ns, mtime_ns) of each name as last seen; (-1, -1) when it could not be lstat'ed."""
    subdirs: list[tuple[str, Sig]]
    """The subdirectories to enter (UTF-8 names, not excluded), in reverse order, as listed."""
    wd: int = -1
    """Its inotify watch descriptor (-1: none)."""


Event = tuple[int, int, str]
"""One inotify event: (watch descriptor, mask, name); the name is "" for an event on the directory
itself, and decoded like ``os.scandir``'s names (``os.fsdecode``)."""

_OVERFLOW: Final[Event] = (-1, _IN_Q_OVERFLOW, "")


class _Watcher:
    """One inotify instance over the directories of one tree: what was written, created, deleted,
    renamed or opened in them since the last read."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._add = libc.inotify_add_watch
        self._add.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
        fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.fd: int = fd
        self.complete = True
        """Every directory of the tree is watched (False after a watch could not be added)."""

    def watch(self, dir_fd: int, mask: int = _WATCH_MASK) -> int:
        """Watch the directory open at ``dir_fd``; its watch descriptor, or -1 (``complete`` is then False).

        The same directory always has the same descriptor: a second watch replaces the first's mask."""
        # Through the descriptor's magic link: the watch is on the directory that was opened and
        # checked, whatever a path to it resolves to now.
        wd = int(self._add(self.fd, f"/proc/self/fd/{dir_fd}".encode(), mask))
        if wd < 0:
            self.complete = False  # ENOSPC (max_user_watches) or the like: walk instead
        return wd

    def read(self) -> list[Event]:
        """Every queued event, in order; an overflow (or an unreadable queue) ends in ``_OVERFLOW``."""
        events: list[Event] = []
        while True:
            try:
                buf = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return events
            except OSError:
                events.append(_OVERFLOW)
                return events
            if not buf:
                return events
            offset = 0
            while offset + 16 <= len(buf):
                wd, mask, _cookie, length = struct.unpack_from("iIII", buf, offset)
                raw = buf[offset + 16 : offset + 16 + length].split(b"\0", 1)[0]
                events.append((wd, mask, os.fsdecode(raw) if raw else ""))
                offset += 16 + length

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


@dataclass(slots=True)
class _Plan:
    """What one event-driven update visits: directories to list again (``relist``), entries to lstat
    by name (``named``: directory -> names), every directory on the way to those (``on_way``), and
    the roots of subtrees that are new (``new``: walked whole)."""

    relist: set[str]
    named: dict[str, set[str]]
    on_way: set[str]
    new: set[str] = field(default_factory=set)
    new_excluded: set[str] = field(default_factory=set)


@dataclass
class TreeState:
    """Every entry under one scope root as of the last walk, and what is needed to walk it again cheaply.

    Not thread-safe: a ``TreeStates`` hands one state to one run at a time (``checkout``/``checkin``).

    Attributes:
        root: the absolute path of the scope root (not resolved).
        exclude: normalised workspace-relative prefixes left out (``"work/runs"``).
        entries: relative POSIX path → ``Sig`` of every file, directory and special file.
        walks, listed, pruned: walks made; directories listed / reused without listing by the last walk.
        found_by: how the last ``update`` found its changes: ``"events"`` (from inotify's events,
            see ``update``) or ``"walk"`` (an lstat of every entry), and ``fallback`` why it walked
            when events were asked for (``""`` otherwise).
    """

    root: str
    exclude: frozenset[str]
    entries: dict[str, Sig] = field(default_factory=dict)
    invalid: dict[str, Sig] = field(default_factory=dict)
    unreadable: set[str] = field(default_factory=set)
    too_deep: set[str] = field(default_factory=set)
    walks: int = 0
    listed: int = 0
    pruned: int = 0
    found_by: str = ""
    fallback: str = ""
    _dirs: dict[str, _Dir] = field(default_factory=dict)
    _root_id: tuple[int, int] | None = None
    _walk_started_ns: int = 0
    _pending: dict[str, Sig | None] = field(default_factory=dict)
    _watcher: _Watcher | None = None
    _use_watcher: bool = True
    _wds: dict[int, str] = field(default_factory=dict)
    """Watch descriptor → the tree directory it watches (as of the last walk)."""
    _shadow_wds: dict[int, str] = field(default_factory=dict)
    """Watch descriptor → the directory at or below an excluded prefix it watches for new entries."""
    _shadowed: bool = False
    """Every directory at or below an excluded prefix is watched (``_SHADOW_MASK``) since the last walk."""
    _linked: dict[str, int] = field(default_factory=dict)
    """Regular files with more than one name: path → ``st_nlink`` as last seen (lstat'ed every update)."""
    _link_rose: bool = False
    _held: list[Event] = field(default_factory=list)
    """Events read from the queue during a walk (so that its own opens never overflow it), not yet used."""
    _opened: int = 0
    _trusting: bool = False
    """An update was asked to trust events: every walk then watches the excluded directories too."""
    _excluded_ids: dict[str, tuple[int, int]] = field(default_factory=dict)
    """(st_ino, st_dev) of each excluded directory as its parent's last listing found it."""

    @property
    def allocated_bytes(self) -> int:
        """Bytes allocated on disk to every entry (``st_blocks`` * 512), as of the last walk."""
        return (
            sum(sig[6] for sig in self.entries.values()) * 512
            + sum(sig[6] for sig in self.invalid.values()) * 512
        )

    def prepare(self) -> bool:
        """Bring the state up to date before a run without reporting anything; True if it walked.

        No walk when the tree has been walked before, its root is the same directory, inotify saw
        no write since that walk (an open alone is no write) and no file with several names changed.
        Otherwise a (pruned) walk folds what changed meanwhile into the state: those are not the
        run's changes. Raises ``OSError`` when the root cannot be listed.
        """
        watcher = self._watcher
        if self.walks and watcher is not None and watcher.complete and self._same_root():
            events = [*self._held, *watcher.read()]
            self._held = []
            wrote = any(not (mask & _IN_OPEN) for _, mask, _ in events)
            if not wrote and not self._linked_changed():
                return False
        self.update(report=False)
        return True

    def settle(self) -> None:
        """Wait, if needed, until ``RACY_NS`` after the last walk started (see the module docstring)."""
        wait_ns = self._walk_started_ns + RACY_NS - time.time_ns()
        if wait_ns > 0:
            time.sleep(wait_ns / 1e9)

    def update(
        self,
        *,
        report: bool,
        max_reported: int | None = None,
        hash_cache: HashCache | None = None,
        trust_events: bool = False,
    ) -> FileChanges:
        """Update the state and return what changed since the previous update plus what an earlier
        capped report carried over.

        With ``trust_events`` (the caller vouches that whatever wrote since the last update could
        only reach the tree's files through names inside it: the ``namespaces`` isolation level, see
        the module docstring), the changes are found from inotify's events: directories that had an
        entry created, deleted or renamed are listed again, new subtrees walked whole, and entries
        named by an event (written, truncated, chmod'ed, utime'd, opened) and every file with more
        than one name are lstat'ed; nothing else is looked at. It walks instead (an lstat of every
        entry, listing only directories that changed) when events cannot tell: the first update, a
        watch that could not be added, an overflowed queue, the root replaced, a directory too deep
        to watch, or a new hard link (a file whose name count rose, or a new file with several
        names, inside the tree or below an excluded prefix).

        With ``report=False`` the changes are folded in silently (and carried ones stay carried).
        ``max_reported`` caps created + modified + deleted in the result (None: no cap); the rest are
        carried to the next report and counted in ``FileChanges.unreported``.

        Raises:
            OSError: the root cannot be opened and listed as a directory.
        """
        events: list[Event] = []
        if self._watcher is not None:
            events = [*self._held, *self._watcher.read()]  # what happened so far is what this update sees
            self._held = []
        elif self._use_watcher:
            try:
                self._watcher = _Watcher()
            except OSError:
                self._use_watcher = False
            for listing in self._dirs.values():
                listing.trusted = None  # a new instance watches only what is listed: list everything
        self._trusting = self._trusting or trust_events
        changes: dict[str, tuple[Sig | None, Sig | None]] = {}
        invalid_before = dict(self.invalid)
        unreadable_before = set(self.unreadable)
        collecting = gc.isenabled()
        gc.disable()
        try:
            self.fallback = self._update_from_events(events, changes) if trust_events else ""
            if trust_events and not self.fallback:
                self.found_by = "events"
            else:
                self._walk(changes)
                self.found_by = "walk"
                if self._trusting:
                    self._watch_excluded()
        finally:
            if collecting:
                gc.enable()
        self.walks += 1
        if not report:
            return FileChanges((), (), (), (), False)  # folded in; what was carried stays carried
        for path, old_sig in self._pending.items():
            new_sig = self.entries.get(path)
            changes[path] = (old_sig, new_sig)
        self._pending = {}
        return self._classify(changes, invalid_before, unreadable_before, max_reported, hash_cache)

    def close(self) -> None:
        """Release the inotify instance (the state itself stays usable, without it)."""
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
            self._wds.clear()
            self._shadow_wds.clear()
            self._shadowed = False

    # ------------------------------------------------------------------ the event-driven update

    def _update_from_events(
        self, events: list[Event], changes: dict[str, tuple[Sig | None, Sig | None]]
    ) -> str:
        """Apply what ``events`` say changed; "" when done, else why a walk must follow (whatever was
        applied by then stays applied: the walk completes it)."""
        watcher = self._watcher
        if watcher is None or not watcher.complete:
            return "no inotify" if watcher is None else "a watch could not be added"
        if not self.walks:
            return "first walk"
        if not self._shadowed:
            return "excluded directories not watched"
        if self.too_deep:
            return "a directory too deep to watch"
        if not self._same_root():
            return "root replaced"
        plan = _Plan(relist=set(), named={}, on_way=set())
        new_excluded: list[tuple[str, str]] = []
        for wd, mask, name in events:
            if mask & (_IN_Q_OVERFLOW | _IN_UNMOUNT):
                return "inotify queue overflowed" if mask & _IN_Q_OVERFLOW else "unmounted"
            if mask & _IN_IGNORED:
                continue  # the watch went with its directory: its parent had the event that says so
            rel = self._wds.get(wd)
            if rel is None:
                shadow = self._shadow_wds.get(wd)
                if shadow is not None and name and mask & (_IN_CREATE | _IN_MOVED_TO):
                    new_excluded.append((shadow, name))
                continue  # a directory no longer in the tree: its move or deletion had an event
            if not name:
                if not rel and mask & (_IN_DELETE_SELF | _IN_MOVE_SELF):
                    return "root replaced"
                continue  # the directory's own change also reached its parent, with its name
            if mask & _LISTING_EVENTS:
                plan.relist.add(rel)
            elif not (mask & _IN_OPEN and mask & _IN_ISDIR):  # opening a directory changes nothing
                plan.named.setdefault(rel, set()).add(name)
        for path in self._linked:
            # A write through one name of a file reaches the directory of that name only.
            parent, _, name = path.rpartition("/")
            plan.named.setdefault(parent, set()).add(name)
        plan.relist.update("" if rel == "." else rel for rel in self.unreadable)
        for rel in [*plan.relist, *plan.named]:
            while rel not in plan.on_way:
                plan.on_way.add(rel)
                rel = rel.rpartition("/")[0]
        self._link_rose = False
        self._walk(changes, plan)
        if self._link_rose:
            return "a new hard link"
        for excluded_dir, name in new_excluded:
            if not self._check_excluded_entry(excluded_dir, name):
                return "a new hard link or directory below an excluded prefix"
        for rel in plan.new_excluded:
            if not self._watch_excluded_dir(rel):
                return "a new hard link or directory below an excluded prefix"
        return ""

    def _linked_changed(self) -> bool:
        """Whether a file with several names changed since the last update (a write through a name
        outside the tree reaches no watched directory)."""
        if not self._linked:
            return False
        root = self.root
        for path in self._linked:
            try:
                st = os.lstat(os.path.join(root, path))
            except OSError:
                return True
            if _sig(st) != self.entries.get(path):
                return True
        return False

    # ------------------------------------------------------------------ the excluded directories

    def _watch_excluded(self) -> None:
        """Watch every directory at or below an excluded prefix for new entries (``_SHADOW_MASK``):
        a hard link made there to a file of the tree would otherwise reach no watched directory."""
        self._shadow_wds.clear()
        self._shadowed = self._watcher is not None and all(
            self._watch_excluded_dir(prefix, check_links=False) for prefix in self.exclude
        )

    def _watch_excluded_dir(self, rel: str, *, check_links: bool = True) -> bool:
        """Watch ``rel`` and every directory below it; False if one could not be watched, or (with
        ``check_links``) a regular file there has several names. True if ``rel`` is absent."""
        fd = self._open_rel(rel)
        if fd is None:
            return True
        if fd < 0:
            return False
        return self._watch_excluded_fd(fd, rel, check_links, 0)

    def _watch_excluded_fd(self, fd: int, rel: str, check_links: bool, depth: int) -> bool:
        watcher = self._watcher
        try:
            if watcher is None or depth > MAX_WALK_DEPTH:
                return False
            wd = watcher.watch(fd, _SHADOW_MASK)
            if wd < 0:
                return False
            self._wds.pop(wd, None)
            self._shadow_wds[wd] = rel
            with os.scandir(fd) as found:
                items = list(found)
            for item in items:
                entry_st = item.stat(follow_symlinks=False)
                if stat.S_ISDIR(entry_st.st_mode):
                    child = _open_listed(fd, item.name, _sig(entry_st))
                    if child < 0 or not self._watch_excluded_fd(
                        child, f"{rel}/{item.name}", check_links, depth + 1
                    ):
                        return False
                elif check_links and stat.S_ISREG(entry_st.st_mode) and entry_st.st_nlink > 1:
                    return False
            return True
        except OSError:
            return False
        finally:
            os.close(fd)

    def _check_excluded_entry(self, rel: str, name: str) -> bool:
        """An entry created in (or moved to) the excluded directory ``rel``: True if it cannot be a
        second name of a file of the tree (a new directory below is watched and checked likewise)."""
        fd = self._open_rel(rel)
        if fd is None or fd < 0:
            return fd is None  # gone since: what it held is no name of the tree's files now
        try:
            try:
                entry_st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return True
            if stat.S_ISDIR(entry_st.st_mode):
                child = _open_listed(fd, name, _sig(entry_st))
                return child >= 0 and self._watch_excluded_fd(child, f"{rel}/{name}", True, 0)
            return not (stat.S_ISREG(entry_st.st_mode) and entry_st.st_nlink > 1)
        except OSError:
            return False
        finally:
            os.close(fd)

    def _open_rel(self, rel: str) -> int | None:
        """``rel`` (a directory below the root) opened component by component with ``O_NOFOLLOW``;
        None when it does not exist or is no directory, -1 when it could not be opened otherwise."""
        try:
            fd = os.open(self.root, _ROOT_FLAGS)
        except OSError:
            return -1
        for part in rel.split("/"):
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except (FileNotFoundError, NotADirectoryError):
                os.close(fd)
                return None
            except OSError as exc:
                os.close(fd)
                return None if exc.errno == errno.ELOOP else -1  # a symlink: not a directory
            os.close(fd)
            fd = child
        return fd

    # ------------------------------------------------------------------ the walk

    def _same_root(self) -> bool:
        try:
            st = os.stat(self.root)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._root_id

    def _walk(self, changes: dict[str, tuple[Sig | None, Sig | None]], plan: _Plan | None = None) -> None:
        """Visit the tree: every directory (``plan`` None), or only what ``plan`` names."""
        self._walk_started_ns = time.time_ns()
        self.listed = self.pruned = 0
        root_fd = os.open(self.root, _ROOT_FLAGS)
        try:
            st = os.fstat(root_fd)
            if (st.st_dev, st.st_ino) != self._root_id:
                # Another directory now: nothing listed before can be reused, all it held is gone.
                changes.update((path, (sig, None)) for path, sig in self.entries.items())
                self.entries.clear()
                self.invalid.clear()
                self.unreadable.clear()
                self.too_deep.clear()
                self._dirs.clear()
                self._linked.clear()
                self._root_id = (st.st_dev, st.st_ino)
                plan = None
            if not self._visit(root_fd, "", st, changes, plan):
                raise OSError(errno.EIO, f"cannot list {self.root}")
            self._descend(root_fd, changes, plan)
        finally:
            os.close(root_fd)

    def _descend(
        self, root_fd: int, changes: dict[str, tuple[Sig | None, Sig | None]], plan: _Plan | None
    ) -> None:
        # Depth first, like pathsafe.walk_tree: a parent's descriptor is closed once its last
        # subdirectory is opened, so a deep chain holds two descriptors, no walk more than 513.
        # A frame's flag says the directory is walked whole (no plan, or a new subtree).
        frames: list[tuple[int, str, int, list[tuple[str, Sig]], bool]] = []
        subdirs = self._subdirs("", plan, whole=plan is None)
        if subdirs:
            frames.append((os.dup(root_fd), "", 0, subdirs, plan is None))
        try:
            while frames:
                parent_fd, parent_rel, depth, pending, whole = frames[-1]
                name, listed = pending.pop()
                if not pending:
                    frames.pop()
                rel = f"{parent_rel}/{name}" if parent_rel else name
                try:
                    if depth + 1 > MAX_WALK_DEPTH:
                        self.too_deep.add(rel)
                        continue
                    whole_here = whole or (plan is not None and rel in plan.new)
                    if not whole_here and plan is not None and rel not in plan.on_way:
                        continue
                    fd = _open_listed(parent_fd, name, listed)
                finally:
                    if not pending:
                        os.close(parent_fd)
                if fd < 0:
                    self._mark_unreadable(rel)
                    continue
                self._opened += 1
                if self._opened % _ABSORB_EVERY == 0 and self._watcher is not None:
                    self._absorb()
                try:
                    ok = self._visit(fd, rel, os.fstat(fd), changes, plan, whole=whole_here)
                except OSError:
                    ok = False
                if not ok:
                    os.close(fd)
                    self._mark_unreadable(rel)
                    continue
                child_dirs = self._subdirs(rel, plan, whole=whole_here)
                if child_dirs:
                    frames.append((fd, rel, depth + 1, child_dirs, whole_here))
                else:
                    os.close(fd)
        finally:
            for frame_fd, _, _, _, _ in frames:
                os.close(frame_fd)

    def _absorb(self) -> None:
        """Read the queue mid-walk, keeping every event but the walk's own directory opens."""
        assert self._watcher is not None
        self._held.extend(
            event
            for event in self._watcher.read()
            if not (event[1] & _IN_OPEN and (event[1] & _IN_ISDIR or not event[2]))
        )

    def _subdirs(self, rel: str, plan: _Plan | None, *, whole: bool) -> list[tuple[str, Sig]]:
        listing = self._dirs.get(rel)
        if listing is None:
            return []
        if plan is None or whole:
            return list(listing.subdirs)
        prefix = f"{rel}/" if rel else ""
        return [
            item
            for item in listing.subdirs
            if prefix + item[0] in plan.on_way or prefix + item[0] in plan.new
        ]

    def _mark_unreadable(self, rel: str) -> None:
        # What lies beneath stays as it was: never reported deleted for want of a listing.
        self.unreadable.add(rel)
        listing = self._dirs.get(rel)
        if listing is not None:
            listing.trusted = None

    def _visit(
        self,
        fd: int,
        rel: str,
        st: os.stat_result,
        changes: dict[str, tuple[Sig | None, Sig | None]],
        plan: _Plan | None = None,
        *,
        whole: bool = True,
        relist: bool = False,
    ) -> bool:
        """Look at the directory open at ``fd``: walked ``whole`` (or without a ``plan``), lstat
        every entry and list it only if it changed; else list it if the plan says so, lstat the
        entries the plan names, or do nothing. False if it could not be listed at all."""
        listing = self._dirs.get(rel)
        if plan is not None and not whole and not relist:
            names = plan.named.get(rel)
            if rel not in plan.relist and listing is not None:
                if not names:
                    return True  # only on the way to what changed
                return self._visit_named(fd, rel, st, changes, plan, listing, names)
            relist = True
        self.unreadable.discard(rel or ".")
        self.too_deep.discard(rel)
        dir_sig = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        stats: list[tuple[str, os.stat_result | None]] = []
        if not relist and listing is not None and listing.trusted == dir_sig:
            # Unchanged directory: the same names on the same inodes (replacing or renaming an entry
            # would have changed it), so an entry whose ctime and mtime are those of the last walk is
            # unchanged (any write, chmod, truncate or utime moves the ctime); only the others are
            # looked at further. The (c, m) stamps are kept per directory to make this test cheap.
            self.pruned += 1
            stamps = listing.stamps
            for index, name in enumerate(listing.names):
                try:
                    entry_st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    listing.trusted = None  # cannot happen with an unchanged directory; list it anew
                    return self._visit(fd, rel, st, changes, plan, whole=whole, relist=True)
                except OSError:
                    stats.append((name, None))
                    continue
                stamp = stamps[index]
                if entry_st.st_ctime_ns == stamp[0] and entry_st.st_mtime_ns == stamp[1]:
                    continue
                stamps[index] = (entry_st.st_ctime_ns, entry_st.st_mtime_ns)
                stats.append((name, entry_st))
        else:
            if not self._list(fd, rel, st, changes, plan, listing, stats):
                return False
        self._record(rel, stats, changes, plan)
        return True

    def _visit_named(
        self,
        fd: int,
        rel: str,
        st: os.stat_result,
        changes: dict[str, tuple[Sig | None, Sig | None]],
        plan: _Plan,
        listing: _Dir,
        names: set[str],
    ) -> bool:
        """lstat the entries ``names`` of a directory whose listing still holds (no event said an
        entry came or went); one that is not there after all has the directory listed again."""
        known = set(listing.names)
        stats: list[tuple[str, os.stat_result | None]] = []
        for name in names:
            if name not in known:
                return self._visit(fd, rel, st, changes, plan, whole=False, relist=True)
            try:
                stats.append((name, os.stat(name, dir_fd=fd, follow_symlinks=False)))
            except FileNotFoundError:
                return self._visit(fd, rel, st, changes, plan, whole=False, relist=True)
            except OSError:
                stats.append((name, None))
        self.pruned += 1
        self._record(rel, stats, changes, plan)
        return True

    def _list(
        self,
        fd: int,
        rel: str,
        st: os.stat_result,
        changes: dict[str, tuple[Sig | None, Sig | None]],
        plan: _Plan | None,
        listing: _Dir | None,
        stats: list[tuple[str, os.stat_result | None]],
    ) -> bool:
        """List the directory open at ``fd`` and lstat each entry into ``stats``; record its listing,
        and what it no longer holds as deleted. With a ``plan``, subdirectories that are new (or
        another directory under a known name) are added to its ``new``, excluded ones to
        ``new_excluded``. False if it could not be listed."""
        self.listed += 1
        prefix = f"{rel}/" if rel else ""
        if self._watcher is not None:
            # Before listing: a later write is seen by the next prepare() and update().
            wd = self._watcher.watch(fd)
            if wd >= 0:
                self._wds[wd] = rel
                self._shadow_wds.pop(wd, None)
        else:
            wd = -1
        listed_at = time.time_ns()
        try:
            with os.scandir(fd) as found:
                items = list(found)
        except OSError:
            return False
        for item in items:
            try:
                stats.append((item.name, item.stat(follow_symlinks=False)))
            except FileNotFoundError:
                continue  # removed since the listing: it is simply not there
            except OSError:
                stats.append((item.name, None))
        names = [name for name, _ in stats]
        dir_sig = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        trusted = dir_sig if st.st_ctime_ns < listed_at - RACY_NS else None
        old_names = listing.names if listing is not None else []
        excluded = self.exclude
        subdirs = [
            (name, _sig(entry_st))
            for name, entry_st in reversed(stats)
            if entry_st is not None
            and stat.S_ISDIR(entry_st.st_mode)
            and _is_utf8(name)
            and prefix + name not in excluded
        ]
        if plan is not None:
            known = {name: sig[4:6] for name, sig in listing.subdirs} if listing is not None else {}
            for name, sig in subdirs:
                if known.get(name) != sig[4:6] or prefix + name not in self._dirs:
                    plan.new.add(prefix + name)
        for name, entry_st in stats:
            if entry_st is not None and prefix + name in excluded:
                ids = (entry_st.st_ino, entry_st.st_dev)
                if plan is not None and self._excluded_ids.get(prefix + name) != ids:
                    plan.new_excluded.add(prefix + name)  # a new one, or another directory: watch it
                self._excluded_ids[prefix + name] = ids
        stamps = [
            (-1, -1) if entry_st is None else (entry_st.st_ctime_ns, entry_st.st_mtime_ns)
            for _, entry_st in stats
        ]
        self._dirs[rel] = _Dir(names, trusted, stamps, subdirs, wd)
        if old_names:
            now = set(names)
            for name in old_names:
                if name not in now:
                    self._remove(prefix + name, name, prefix, changes)
        return True

    def _record(
        self,
        rel: str,
        stats: list[tuple[str, os.stat_result | None]],
        changes: dict[str, tuple[Sig | None, Sig | None]],
        plan: _Plan | None,
    ) -> None:
        """Fold the lstat results of entries of ``rel`` into the state and ``changes``."""
        prefix = f"{rel}/" if rel else ""
        entries, excluded, linked = self.entries, self.exclude, self._linked
        complete = True
        for name, maybe_st in stats:
            if maybe_st is None:
                complete = False
                continue
            entry_st = maybe_st
            path = prefix + name
            if path in excluded:
                continue
            sig = _sig(entry_st)
            if not _is_utf8(name):
                display = _display_path(rel, name)
                self.invalid[display] = sig
                continue
            if stat.S_ISREG(entry_st.st_mode) and entry_st.st_nlink > 1:
                if entry_st.st_nlink > linked.get(path, 1):
                    self._link_rose = True  # where else it is named may be no watched directory
                linked[path] = entry_st.st_nlink
            elif linked:
                linked.pop(path, None)
            old = entries.get(path)
            if old != sig:
                entries[path] = sig
                if old is None or old[:6] != sig[:6]:
                    earlier = changes.get(path)
                    changes[path] = (earlier[0] if earlier is not None else old, sig)
                if old is not None and stat.S_ISDIR(old[0]) and not stat.S_ISDIR(sig[0]):
                    self._remove_below(path, changes)
                elif plan is not None and old is not None and stat.S_ISDIR(sig[0]) and old[4:6] != sig[4:6]:
                    plan.new.add(path)
        if not complete:
            self.unreadable.add(rel or ".")
            current = self._dirs.get(rel)
            if current is not None:
                current.trusted = None

    def _remove(
        self, path: str, name: str, prefix: str, changes: dict[str, tuple[Sig | None, Sig | None]]
    ) -> None:
        if not _is_utf8(name):
            self.invalid.pop(_display_path(prefix.rstrip("/"), name), None)
            return
        self._excluded_ids.pop(path, None)
        old = self.entries.pop(path, None)
        if old is None:
            return
        self._linked.pop(path, None)
        earlier = changes.get(path)
        changes[path] = (earlier[0] if earlier is not None else old, None)
        if stat.S_ISDIR(old[0]):
            self._remove_below(path, changes)

    def _remove_below(self, path: str, changes: dict[str, tuple[Sig | None, Sig | None]]) -> None:
        listing = self._dirs.pop(path, None)
        self.unreadable.discard(path)
        self.too_deep.discard(path)
        if listing is None:
            return
        if self._wds.get(listing.wd) == path:
            del self._wds[listing.wd]  # its events, if it lives on elsewhere, are no longer the tree's
        prefix = f"{path}/"
        for name in listing.names:
            self._remove(prefix + name, name, prefix, changes)

    # ------------------------------------------------------------------ the report

    def _classify(
        self,
        changes: dict[str, tuple[Sig | None, Sig | None]],
        invalid_before: dict[str, Sig],
        unreadable_before: set[str],
        max_reported: int | None,
        hash_cache: HashCache | None,
    ) -> FileChanges:
        created: list[str] = []
        modified: list[str] = []
        deleted: list[str] = []
        skipped: list[SkippedEntry] = []
        root = Path(self.root)
        for path, (old, new) in changes.items():
            was_file = old is not None and stat.S_ISREG(old[0])
            is_file = new is not None and stat.S_ISREG(new[0])
            if is_file:
                if not was_file:
                    created.append(path)
                elif (
                    old is not None
                    and new is not None
                    and _content_changed(old, new, root / path, hash_cache)
                ):
                    modified.append(path)
            elif was_file:
                deleted.append(path)
            if new is not None and not is_file and not stat.S_ISDIR(new[0]) and new != old:
                skipped.append(SkippedEntry(path, _skip_reason(new[0], root / path)))
        skipped.extend(
            SkippedEntry(path, REASON_UNREADABLE_DIR) for path in self.unreadable - unreadable_before
        )
        skipped.extend(SkippedEntry(path, REASON_TOO_DEEP) for path in self.too_deep)
        skipped.extend(
            SkippedEntry(path, REASON_NOT_UTF8)
            for path, sig in self.invalid.items()
            if invalid_before.get(path) != sig
        )
        created.sort()
        modified.sort()
        deleted.sort()
        unreported = 0
        if max_reported is not None and len(created) + len(modified) + len(deleted) > max_reported:
            ordered = [*created, *modified, *deleted]
            for path in ordered[max_reported:]:
                self._pending[path] = changes[path][0]
            unreported = len(ordered) - max_reported
            keep = set(ordered[:max_reported])
            created = [p for p in created if p in keep]
            modified = [p for p in modified if p in keep]
            deleted = [p for p in deleted if p in keep]
        return FileChanges(
            created=tuple(created),
            modified=tuple(modified),
            deleted=tuple(deleted),
            skipped=tuple(sorted(skipped, key=lambda item: (item.path, item.reason))),
            truncated=unreported > 0,
            unreported=unreported,
        )


class TreeStates:
    """The ``TreeState`` of each scope root a sandbox ran in, handed to one run at a time; thread-safe.

    A run takes its root's state with ``checkout`` (a new, empty one if none is kept or another run
    in the same root holds it) and gives it back with ``checkin``; a run that failed midway calls
    ``discard``. At most ``max_states`` trees and ``max_entries`` entries in all are kept (least
    recently used dropped first).
    """

    def __init__(
        self, max_states: int = DEFAULT_MAX_STATES, max_entries: int = DEFAULT_MAX_KEPT_ENTRIES
    ) -> None:
        self._lock = threading.Lock()
        self._states: OrderedDict[tuple[str, frozenset[str]], TreeState] = OrderedDict()
        self._max_states = max_states
        self._max_entries = max_entries

    def checkout(self, root: Path, *, exclude: Sequence[str] = ()) -> TreeState:
        """The state of ``root`` with ``exclude`` (see ``take_snapshot``), now held by the caller.

        Raises ``ValueError`` for an exclude prefix that is empty, absolute or contains ``..``."""
        key = (os.path.abspath(root), frozenset(_normalise_exclude(prefix) for prefix in exclude))
        with self._lock:
            state = self._states.pop(key, None)
        return state if state is not None else TreeState(root=key[0], exclude=key[1])

    def checkin(self, state: TreeState) -> None:
        """Keep ``state`` for the next run in its root (replacing one a concurrent run left)."""
        key = (state.root, state.exclude)
        dropped: list[TreeState] = []
        with self._lock:
            previous = self._states.pop(key, None)
            if previous is not None:
                dropped.append(previous)
            self._states[key] = state
            total = sum(len(kept.entries) for kept in self._states.values())
            while len(self._states) > self._max_states or (
                total > self._max_entries and len(self._states) > 1
            ):
                _, oldest = self._states.popitem(last=False)
                total -= len(oldest.entries)
                dropped.append(oldest)
        for old in dropped:
            old.close()

    def discard(self, state: TreeState) -> None:
        """Forget ``state`` (its run ended midway, so it may not describe the tree)."""
        state.close()

    def close(self) -> None:
        """Release every kept state's inotify instance."""
        with self._lock:
            states, self._states = list(self._states.values()), OrderedDict()
        for state in states:
            state.close()

    def __iter__(self) -> Iterator[TreeState]:
        with self._lock:
            return iter(list(self._states.values()))


def _sig(st: os.stat_result) -> Sig:
    return (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev, st.st_blocks)


def _open_listed(parent_fd: int, name: str, listed: Sig) -> int:
    """``name`` below ``parent_fd`` as a descriptor, if it is still the directory that was listed; else -1."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError:
        return -1
    try:
        opened = os.fstat(fd)
        if (opened.st_dev, opened.st_ino) == (listed[5], listed[4]):
            return fd
    except OSError:
        pass
    os.close(fd)
    return -1


def _content_changed(old: Sig, new: Sig, path: Path, hash_cache: HashCache | None) -> bool:
    """Whether a regular file present before and after changed; ``old[:6] != new[:6]`` is given."""
    if old[1] != new[1] or hash_cache is None:
        return True
    # Keyed with the ctime too: a rewrite that set the mtime back keeps (dev, ino, size, mtime) but
    # not the ctime, so the after-version is always hashed afresh, never looked up.
    try:
        after = sha256_file(path)
    except OSError:
        return True
    before = hash_cache.get((old[5], old[4], old[1], old[2], old[3]))
    hash_cache.put((new[5], new[4], new[1], new[2], new[3]), after)
    return before != after


def _skip_reason(mode: int, path: Path) -> str:
    if stat.S_ISLNK(mode):
        try:
            points_at_dir = stat.S_ISDIR(os.stat(path).st_mode)
        except (OSError, ValueError):
            points_at_dir = False  # dangling, a loop, or unreachable: still just a symlink
        return REASON_SYMLINK_TO_DIR if points_at_dir else REASON_SYMLINK
    if stat.S_ISFIFO(mode):
        return _KIND_REASONS["fifo"]
    if stat.S_ISSOCK(mode):
        return _KIND_REASONS["socket"]
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return _KIND_REASONS["device"]
    return _KIND_REASONS["other"]
