"""The scratch areas a run may leave things in, put back as they were: exclusive mode's sweep of
the uid's other processes and the wipe of the shared paths, and the scratch root's baseline.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from alphaagent.sandbox.procs import send_signal
from alphaagent.sandbox.removal import remove_tree

ZYGOTE_LOG = "zygote.log"


# What exclusive mode keeps of the scratch root's start-up contents (matplotlib's font cache is ~40 KiB).
BASELINE_MAX_BYTES = 8 * 2**20


def sweep_uid_except_ancestors() -> None:
    """Kill every process of our uid except this process and its ancestors (never as root)."""
    uid = os.getuid()
    if uid == 0:
        return
    keep, pid = {os.getpid()}, os.getpid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                pid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        keep.add(pid)
    for _ in range(50):
        victims = []
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) not in keep:
                with contextlib.suppress(OSError):
                    if os.stat(f"/proc/{name}").st_uid == uid:
                        victims.append(int(name))
        if not victims:
            return
        for victim in victims:
            send_signal(victim, signal.SIGKILL)
        time.sleep(0.01)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def default_scratch_dir() -> str | None:
    """/dev/shm when it is a writable tmpfs (directory churn there costs microseconds, not a disk's
    milliseconds); otherwise the platform's temporary directory (Lambda has no /dev/shm)."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK) else None


def wipe_contents(root: Path, keep: set[Path]) -> None:
    """Remove everything under ``root`` except the paths in ``keep`` (and their ancestors).

    Paths are compared as written, never resolved: an entry that is a symlink to ``/`` (or to a kept
    path) is not an ancestor of a kept path, and is removed like any other entry."""
    root = Path(os.path.abspath(root))
    if not root.is_dir():
        return
    keep_abs = {Path(os.path.abspath(k)) for k in keep}
    for entry in os.scandir(root):
        path = root / entry.name
        if path in keep_abs or any(path in k.parents for k in keep_abs):
            continue
        remove_path(path)


def remove_path(path: Path) -> bool:
    """Remove ``path`` -- a file, a symlink (never followed) or a whole tree; True when it is gone.

    ``remove_tree`` walks iteratively (any depth), gives a folder its owner locked (``chmod 500``)
    back to the owner, and never follows a symlink."""
    with contextlib.suppress(OSError):
        remove_tree(path)
    return not os.path.lexists(path)


@dataclass(frozen=True)
class ScratchBaseline:
    """The scratch root as it was when the zygote became ready, which exclusive mode restores after
    each run: its directories and regular files (matplotlib's config dir and font cache, built by
    the preload), and the identity of the root and of the zygote's log (its stderr, kept open)."""

    root_id: tuple[int, int]
    log_id: tuple[int, int]
    log_mode: int
    dirs: tuple[tuple[str, int], ...]  # (path relative to the root, mode), parents first
    files: tuple[tuple[str, int, bytes], ...]  # (path relative to the root, mode, content)

    @classmethod
    def capture(cls, root: Path, log: Path) -> ScratchBaseline:
        root_stat, log_stat = os.lstat(root), os.lstat(log)
        dirs: list[tuple[str, int]] = []
        files: list[tuple[str, int, bytes]] = []
        budget = BASELINE_MAX_BYTES
        for current, dirnames, filenames in os.walk(root):  # symlinks are neither followed nor kept
            for name in sorted(dirnames):
                path = os.path.join(current, name)
                st = os.lstat(path)
                if stat.S_ISDIR(st.st_mode):
                    dirs.append((os.path.relpath(path, root), stat.S_IMODE(st.st_mode)))
            for name in sorted(filenames):
                path = os.path.join(current, name)
                st = os.lstat(path)
                if path == str(log) or not stat.S_ISREG(st.st_mode) or st.st_size > budget:
                    continue  # a cache too big to hold is simply not restored
                with open(path, "rb") as fh:
                    content = fh.read(budget + 1)
                if len(content) <= budget:
                    budget -= len(content)
                    files.append((os.path.relpath(path, root), stat.S_IMODE(st.st_mode), content))
        return cls(
            root_id=(root_stat.st_dev, root_stat.st_ino),
            log_id=(log_stat.st_dev, log_stat.st_ino),
            log_mode=stat.S_IMODE(log_stat.st_mode),
            dirs=tuple(dirs),
            files=tuple(files),
        )

    def restore(self, root: Path) -> bool:
        """Remove everything under ``root`` but the log, recreate the baseline and empty the log in
        place; False when that cannot be done safely (see ``Sandbox._reset_scratch_root``)."""
        try:
            st = os.lstat(root)
            if not stat.S_ISDIR(st.st_mode) or (st.st_dev, st.st_ino) != self.root_id:
                return False  # replaced (renamed away, a symlink put in its place): never follow it
            os.chmod(root, 0o700)  # as mkdtemp made it; a run may have taken its own write access away
            with os.scandir(root) as entries:
                names = [e.name for e in entries if e.name != ZYGOTE_LOG]
            removed = all([remove_path(root / name) for name in names])
            for rel, mode in self.dirs:
                os.mkdir(root / rel)
                os.chmod(root / rel, mode)
            for rel, mode, content in self.files:
                fd = os.open(
                    root / rel, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode
                )
                try:
                    write_all(fd, content)
                finally:
                    os.close(fd)
            return removed and self._empty_log(root / ZYGOTE_LOG)
        except OSError:
            return False

    def _empty_log(self, path: Path) -> bool:
        """Truncate the zygote's log in place, if it is still the very file the zygote writes to and
        has no other name (a hard link elsewhere, or no name at all, would outlive the truncation's
        intent: the zygote is replaced then)."""
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != self.log_id:
            return False
        os.chmod(path, self.log_mode)  # lstat just said: a regular file, and nothing else of the uid runs
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != self.log_id or st.st_nlink != 1:
                return False
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)
        return True
