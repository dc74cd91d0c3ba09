"""A pids and a memory cgroup per run, for supervisors that may create cgroups (root).

``RLIMIT_NPROC`` is not enforced for uid 0 (setrlimit(2)), so a fork bomb run by a root supervisor
(a CI machine, a container running as root) would be bounded only by the timeout; and ``RLIMIT_AS``
bounds each process's address space, not what a run holds in RAM in all (tmpfs and ``memfd`` pages,
page cache, many processes). Where a controller is mounted and writable (a cgroup v1 hierarchy, or
cgroup v2 with the controller in the root's ``subtree_control``), each ``Sandbox`` creates
``alphaagent-<pid>-<random>/`` per controller (under the supervisor's own cgroup with v1, so limits
set above it still hold); each spare child of the zygote joins its own ``spare-<n>/`` below it ahead
of time (joining costs an RCU grace period, about 10 ms), and the zygote sets ``pids.max`` and the
memory limit (``memory.limit_in_bytes`` + ``memory.memsw.limit_in_bytes`` with v1, ``memory.max`` +
``memory.swap.max=0`` and ``memory.oom.group`` with v2) when it hands the spare a run, then removes
the cgroups when the run ends. Elsewhere (non-root, Lambda) ``detect()`` returns None and the rlimits
do the job alone.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from pathlib import Path

CONTROLLERS = ("pids", "memory")


def _controller_mounts() -> dict[str, Path]:
    """controller -> the directory to create run cgroups under: the supervisor's own cgroup in a v1
    hierarchy, else the v2 root if the controller is enabled there."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
        own = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return {}
    own_v1: dict[str, str] = {}
    for line in own:
        _, names, path = line.split(":", 2)
        for name in names.split(","):
            own_v1[name] = path
    found: dict[str, Path] = {}
    v2: Path | None = None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or len(rfields) < 3:
            continue
        mount_point, fstype, options = Path(fields[4]), rfields[0], rfields[2].split(",")
        if fstype == "cgroup":
            for controller in CONTROLLERS:
                if controller in options and controller not in found:
                    own_path = own_v1.get(controller, "/").lstrip("/")
                    found[controller] = mount_point / own_path if own_path else mount_point
        if fstype == "cgroup2" and v2 is None:
            v2 = mount_point
    if v2 is not None:
        with contextlib.suppress(OSError):
            offered = (v2 / "cgroup.subtree_control").read_text().split()
            for controller in CONTROLLERS:
                if controller in offered and controller not in found:
                    found[controller] = v2
    return found


def pids_limit_reached(cgroup: str) -> bool:
    """True when a fork in ``cgroup`` was refused because ``pids.max`` was reached (``pids.events``)."""
    with contextlib.suppress(OSError, ValueError):
        for line in (Path(cgroup) / "pids.events").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "max" and int(value) > 0:
                return True
    return False


def oom_kills(cgroup: str) -> int:
    """Processes the kernel killed in the memory cgroup ``cgroup`` at its limit (``oom_kill`` in
    memory.events with v2, in memory.oom_control with v1); 0 when it cannot be read (removed)."""
    for name in ("memory.events", "memory.oom_control"):
        with contextlib.suppress(OSError, ValueError):
            for line in (Path(cgroup) / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    return 0


class RunCgroups:
    """The parent cgroups of one sandbox's runs: controller -> ``alphaagent-<pid>-<random>`` directory
    (one directory serves both controllers with cgroup v2)."""

    def __init__(self, parents: dict[str, Path]) -> None:
        self.parents = parents

    @property
    def pids(self) -> Path | None:
        """The parent of the runs' pids cgroups, if there is one."""
        return self.parents.get("pids")

    @property
    def memory(self) -> Path | None:
        """The parent of the runs' memory cgroups, if there is one."""
        return self.parents.get("memory")

    @classmethod
    def detect(cls, controllers: tuple[str, ...] = CONTROLLERS) -> RunCgroups | None:
        """Usable parents for ``controllers``, or None when there is none (not root, no controller
        mounted, not writable). A controller that cannot be used is simply left out."""
        if os.geteuid() != 0 or not controllers:
            return None
        name = f"alphaagent-{os.getpid()}-{secrets.token_hex(4)}"  # one per Sandbox, never shared
        parents: dict[str, Path] = {}
        for controller, mount in _controller_mounts().items():
            if controller not in controllers:
                continue
            parent = mount / name
            try:
                if not parent.is_dir():
                    parent.mkdir()
                if _is_v2(parent):
                    # v2: the spare-<n> children get the controller only if the parent hands it down.
                    (parent / "cgroup.subtree_control").write_text(f"+{controller}")
            except OSError:
                continue
            parents[controller] = parent
        if not parents:
            return None
        return cls(parents)

    def close(self, timeout_s: float = 5.0) -> None:
        """Kill anything left in the run cgroups (the zygote is gone), then remove them and the parents."""
        for parent in set(self.parents.values()):
            _remove_tree(parent, timeout_s)


def _is_v2(path: Path) -> bool:
    return (path / "cgroup.subtree_control").exists()


def _remove_tree(parent: Path, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        children = [p for p in parent.iterdir() if p.is_dir()] if parent.is_dir() else []
        for child in children:
            with contextlib.suppress(OSError, ValueError):
                for pid in (child / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):
                        os.kill(int(pid), signal.SIGKILL)
            with contextlib.suppress(OSError):
                child.rmdir()
        with contextlib.suppress(OSError):
            parent.rmdir()
            return
        if not parent.exists():
            return
        time.sleep(0.02)
