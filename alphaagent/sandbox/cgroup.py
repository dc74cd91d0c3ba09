"""A pids cgroup per run, for supervisors that run as root.

``RLIMIT_NPROC`` is not enforced for uid 0 (setrlimit(2)), so a fork bomb run by a root supervisor
(a CI machine, a container running as root) would be bounded only by the timeout. Where a pids
controller is mounted and writable (cgroup v1 ``pids`` hierarchy, or cgroup v2 with ``pids`` in the
root's ``subtree_control``), each ``Sandbox`` creates ``alphaagent-<pid>-<random>/``; each spare child of
the zygote joins its own ``spare-<pid>/`` below it ahead of time (joining costs an RCU grace period,
about 10 ms), and the zygote sets ``pids.max`` to the run's process limit when it hands the spare a
run, then removes the cgroup when the run ends. Elsewhere (non-root, Lambda) ``detect()`` returns
None and ``RLIMIT_NPROC`` does the job.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from pathlib import Path


def _pids_mount() -> Path | None:
    """Where the pids controller is mounted: a v1 hierarchy, or the v2 root if it offers pids."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    v2: Path | None = None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or len(rfields) < 3:
            continue
        mount_point, fstype, options = Path(fields[4]), rfields[0], rfields[2].split(",")
        if fstype == "cgroup" and "pids" in options:
            return mount_point
        if fstype == "cgroup2" and v2 is None:
            v2 = mount_point
    if v2 is not None:
        with contextlib.suppress(OSError):
            if "pids" in (v2 / "cgroup.subtree_control").read_text().split():
                return v2
    return None


def pids_limit_reached(cgroup: str) -> bool:
    """True when a fork in ``cgroup`` was refused because ``pids.max`` was reached (``pids.events``)."""
    with contextlib.suppress(OSError, ValueError):
        for line in (Path(cgroup) / "pids.events").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "max" and int(value) > 0:
                return True
    return False


class PidsCgroup:
    """The parent cgroup of one sandbox's runs (``alphaagent-<pid>-<random>`` under the pids mount)."""

    def __init__(self, parent: Path) -> None:
        self.parent = parent

    @classmethod
    def detect(cls) -> PidsCgroup | None:
        """A usable pids cgroup parent, or None (not root, no pids controller, not writable)."""
        if os.geteuid() != 0:
            return None
        mount = _pids_mount()
        if mount is None:
            return None
        # One parent per Sandbox (several may live in one process), never shared.
        parent = mount / f"alphaagent-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            parent.mkdir()
        except OSError:
            return None
        return cls(parent)

    def close(self, timeout_s: float = 5.0) -> None:
        """Kill anything left in the run cgroups (the zygote is gone), then remove them and the parent."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            children = [p for p in self.parent.iterdir() if p.is_dir()] if self.parent.is_dir() else []
            for child in children:
                with contextlib.suppress(OSError, ValueError):
                    for pid in (child / "cgroup.procs").read_text().split():
                        with contextlib.suppress(OSError):
                            os.kill(int(pid), signal.SIGKILL)
                with contextlib.suppress(OSError):
                    child.rmdir()
            with contextlib.suppress(OSError):
                self.parent.rmdir()
                return
            if not self.parent.exists():
                return
            time.sleep(0.02)
