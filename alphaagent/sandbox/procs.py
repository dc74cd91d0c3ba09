"""Processes of a run, read from ``/proc``: children, descendants, group members, their state,
and waiting for them to be gone (the supervisor's kill and sweep use these).
"""

from __future__ import annotations

import contextlib
import os
import time

DEATH_WAIT_S = 2.0
"""How long a kill waits for the killed processes to be gone: SIGKILL is delivered at once, but a
process with a large address space takes a while to exit on a loaded machine, and a run is only
over when nothing of it runs any more."""


def send_signal(pid: int, sig: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, sig)


def children(pid: int) -> list[int]:
    kids: list[int] = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as fh:
                kids.extend(int(p) for p in fh.read().split())
    return kids


def descendants(pid: int) -> list[int]:
    found: list[int] = []
    stack = children(pid)
    while stack and len(found) < 100_000:
        child = stack.pop()
        found.append(child)
        stack.extend(children(child))
    return found


def wait_until_gone(pgid: int, pids: list[int], timeout_s: float) -> None:
    """Wait up to ``timeout_s`` seconds until none of ``pids`` and no member of process group
    ``pgid`` is alive (exited or a zombie): what was killed has stopped running when this returns."""
    deadline = time.monotonic() + timeout_s
    pending = {pgid, *pids}
    while time.monotonic() < deadline:
        pending = {p for p in pending if running(p)} | set(group_members(pgid))
        if not pending:
            return
        time.sleep(0.01)


def proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            text = stat_file.read().decode("ascii", "replace")
    except OSError:
        return None
    return text.rpartition(")")[2].split()


def running(pid: int) -> bool:
    fields = proc_stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = proc_stat(int(entry))
            if fields is not None and fields[0] not in ("Z", "X") and fields[2] == str(pgid):
                members.append(int(entry))
    return members


def diagnose_hang(pid: int) -> str | None:
    """At the timeout: name the common deadlock of a child process blocked on a full pipe."""
    for child in descendants(pid):
        with contextlib.suppress(OSError), open(f"/proc/{child}/wchan") as fh:
            if "pipe_write" in fh.read():  # pipe_write, or anon_pipe_write since Linux 6.15
                return (
                    "a child process was blocked writing to a full pipe: read its output while it runs"
                    " (subprocess.run(..., capture_output=True) or Popen.communicate()) instead of"
                    " calling wait() first"
                )
    return None
