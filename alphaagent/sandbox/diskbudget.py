"""The per-run write budget of a scope (``RunLimits.disk_mb``), enforced while the run runs.

There is no per-directory quota a supervisor can set without privileges (project quotas need a
filesystem mounted for them), and walking a big scope every few milliseconds would cost more than the
run. So the supervisor polls cheaply and walks rarely:

- every ``disk_poll_s`` it reads the used blocks of the scope's filesystem (one ``statvfs``);
- only when the filesystem grew by more than what is left of the budget since the last walk does it
  walk the scope (lstat of every entry, summing allocated blocks: a sparse file counts what it
  takes, not its length), and never sooner than 20 walk-durations after the previous walk, so the
  walks cost at most ~5 % of a core whatever else writes to that filesystem;
- and once a second at most (or every 20 walk-durations, if longer) it walks anyway, which catches
  growth that a concurrent deletion elsewhere on the same filesystem hid from ``statvfs``.

The run can only make its scope's filesystem grow through the scope at the ``namespaces`` level
(every other mount of it is read-only there), so the ``statvfs`` growth is an upper bound of the
scope's growth unless something else deletes at the same time. When the run ends, ``final()`` walks
only if the filesystem grew by more than the budget since the run started: a run costs two
``statvfs`` calls, not a walk.

What the run adds (``scope_growth``) is the tree's allocated size now minus its size in the
snapshot the supervisor takes before every run anyway, plus, in the platform's spill directory
(``work/runs``, which that snapshot leaves out and which grows with every run that spills), what
was created or changed since the run started (by ``st_ctime``, which code cannot set back).

Example::

    budget = ScopeDiskBudget(scope, budget_bytes=10 << 30,
                             walk=lambda: scope_growth(scope, before, started_ns, own_spill))
    while running:
        if budget.poll() is not None:
            kill("DiskLimitExceeded")
    over = budget.final()
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

from alphaagent.sandbox.snapshot import TreeSnapshot, take_snapshot

WALK_COST_FACTOR = 20
"""A walk is never started sooner than this many walk-durations after the previous one (<= 5 %)."""

PERIODIC_WALK_S = 1.0
"""The shortest interval between two walks made without a trigger from ``statvfs``."""


def allocated_bytes(snapshot: TreeSnapshot) -> int:
    """Bytes allocated on disk to every entry of ``snapshot`` (``st_blocks`` * 512)."""
    entries = [*snapshot.entries.values(), *snapshot.invalid_names.values()]
    return sum(entry.blocks for entry in entries) * 512


def scope_growth(
    root: Path,
    before: TreeSnapshot | int,
    started_ns: int,
    *,
    platform_dir: str,
    own: str,
    max_entries: int,
    other_platform_dirs: tuple[str, ...] = (),
) -> int:
    """Bytes the scope ``root`` gained since ``before`` (a snapshot that left ``platform_dir`` and
    ``other_platform_dirs`` out, or its ``allocated_bytes``: what ``TreeState.allocated_bytes``
    gives), plus what was created or changed in them since ``started_ns`` (``time.time_ns()``),
    except ``own`` (the run's own spill directory, a name inside ``platform_dir``). A session's live
    state (``work/sessions``) is one of the others: what a run saves there counts against its
    budget, what earlier runs saved does not.

    Raises ``OSError`` when ``root`` cannot be walked."""
    before_bytes = before if isinstance(before, int) else allocated_bytes(before)
    excluded = [platform_dir, *other_platform_dirs]
    now = allocated_bytes(take_snapshot(root, exclude=excluded, max_entries=max_entries))
    changed = _changed_bytes(root / platform_dir, started_ns, own, max_entries) + sum(
        _changed_bytes(root / other, started_ns, "", max_entries) for other in other_platform_dirs
    )
    return now - before_bytes + changed


def _changed_bytes(top: Path, since_ns: int, skip: str, max_entries: int) -> int:
    """Allocated bytes of entries under ``top`` whose ``st_ctime_ns`` is ``since_ns`` or later; symlinks
    are counted, never followed; the entry ``skip`` directly under ``top`` is left out."""
    try:
        if not stat.S_ISDIR(os.lstat(top).st_mode):
            return 0  # absent, or a symlink: never walked
    except OSError:
        return 0
    total, seen, pending = 0, 0, [str(top)]
    while pending and seen < max_entries:
        directory = pending.pop()
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    if directory == str(top) and entry.name == skip:
                        continue
                    seen += 1
                    st = entry.stat(follow_symlinks=False)
                    if st.st_ctime_ns >= since_ns:
                        total += st.st_blocks * 512
                    if stat.S_ISDIR(st.st_mode):
                        pending.append(entry.path)
        except OSError:
            continue  # absent (no run spilled yet) or replaced mid-walk
    return total


def filesystem_used_bytes(path: Path) -> int:
    """Used bytes of the filesystem holding ``path`` (``statvfs``: total minus free blocks)."""
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


class ScopeDiskBudget:
    """Tells a supervisor, cheaply and while the run runs, whether a scope grew past its budget.

    ``root``: the scope root (its filesystem is the one polled); ``budget_bytes``: what the run may
    add (``disk_mb`` * MiB); ``walk``: returns the scope's growth in bytes since the run started
    (``scope_growth``; it may raise ``OSError``). ``clock`` and ``fs_used`` are injectable for tests.
    """

    def __init__(
        self,
        root: Path,
        *,
        budget_bytes: int,
        walk: Callable[[], int],
        clock: Callable[[], float] = time.monotonic,
        fs_used: Callable[[Path], int] = filesystem_used_bytes,
    ) -> None:
        self.root = root
        self.budget_bytes = budget_bytes
        self._clock = clock
        self._fs_used = fs_used
        self._walk = walk
        now = clock()
        self.grown_bytes = 0
        """The scope's growth at the last walk, in bytes (negative when the run deleted files)."""
        self.walks = 0
        self._used_at_start = self._used_at_walk = self._safe_fs_used()
        self._earliest_walk = now
        self._periodic_walk = now + PERIODIC_WALK_S

    def poll(self) -> int | None:
        """The scope's growth in bytes when it is over the budget, else None (one ``statvfs``, and a
        walk of the scope only when the rules of the module docstring ask for one)."""
        now = self._clock()
        if now < self._earliest_walk:
            return None
        used = self._safe_fs_used()
        left = self.budget_bytes - self.grown_bytes
        if used - self._used_at_walk <= left and now < self._periodic_walk:
            return None
        started = self._clock()
        try:
            self.grown_bytes = self._walk()
        except OSError:
            return None  # the scope itself is gone or unreadable: the run's result will say so
        cost = max(0.0, self._clock() - started)
        self.walks += 1
        self._used_at_walk = used
        self._earliest_walk = now + WALK_COST_FACTOR * cost
        self._periodic_walk = now + max(PERIODIC_WALK_S, WALK_COST_FACTOR * cost)
        return self.grown_bytes if self.grown_bytes > self.budget_bytes else None

    def final(self, tree_growth: int | None = None) -> int | None:
        """After the run: its growth in bytes when over the budget, else None. Walks only when the
        filesystem grew by more than the budget since the start (a burst between two polls), or
        when ``tree_growth`` (bytes the scope's tree, platform folders left out, grew by: what the
        supervisor's after-run walk of the tree already knows, at no cost) is over the budget.

        ``statvfs`` alone cannot decide: a deletion elsewhere on the filesystem during the run (by
        the run itself at the ``process`` level, or by anyone else) hides the growth, and a
        64 MiB burst with a 128 MiB file deleted beside it read as no growth at all."""
        grew = self._safe_fs_used() - self._used_at_start
        if grew <= self.budget_bytes and (tree_growth is None or tree_growth <= self.budget_bytes):
            return None
        try:
            self.grown_bytes = self._walk()
        except OSError:
            return None
        self.walks += 1
        return self.grown_bytes if self.grown_bytes > self.budget_bytes else None

    def _safe_fs_used(self) -> int:
        try:
            return self._fs_used(self.root)
        except OSError:
            return 0
