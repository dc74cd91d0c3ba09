"""The decoding server: one interpreter that imports the decoders once (pandas, pyarrow, openpyxl,
pypdf) and forks a fresh, bounded child for every decode of ``alphaagent.domain.decoding``.

A decode used to start a new interpreter, whose imports (~0.5-1 s of CPU, several seconds of wall
on a loaded machine) were most of its cost, and on a loaded machine most of its 30 s wall budget.
The server pays them once per backend process; each child is forked from it and has seen no other
file, so one decode still cannot reach another's data or leave anything for the next. The server
itself never reads a file: it only forks.

The server is started like the old child (``python -I``, an environment of its own, ``cwd="/"``, a
session of its own so a terminal's Ctrl-C reaches the backend, not it) and talks over an
``AF_UNIX``/``SOCK_SEQPACKET`` socket:

backend -> server
    ``{"job", "args", "timeout_s"}`` with four descriptors (``SCM_RIGHTS``): the file to decode,
    the answer file (the child's stdout), the errors file (its stderr) and one end of a socket pair
    on which that request's outcome comes back.
server -> backend (on the request's socket)
    ``{"exit_code": N, "timed_out": bool}`` once the child is gone (negative: killed by that
    signal); ``{"error": "..."}`` when no child could be forked. The server's first datagram on
    the control socket is ``{"ready": true, "preload_errors": [...]}``.

The child applies the same kernel limits as before (``decoding._limit_child``: address space, CPU
seconds counted from the fork, answer size, no core) and the server kills it with ``SIGKILL`` at its
wall budget. When the control socket closes (the backend exited), the server kills its children and
exits.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Final

PRELOAD: Final = (
    "numpy",
    "pandas",
    "pyarrow",
    "pyarrow.parquet",
    "openpyxl",
    "pypdf",
    "alphaagent.domain.artifacts",
    "alphaagent.domain.documents",
    "alphaagent.viewer.preview",
)
"""What the server imports before it forks anything: every decoder a job uses (a job still imports
what it needs, so a module missing here only costs that child its import)."""

START_TIMEOUT_S: Final = 120.0
"""How long the backend waits for a new server to have imported the decoders (~1-2 s on a quiet
machine, tens of seconds at a load of 10): a request is not charged for it, its budget starts at
its own fork."""

REPLY_GRACE_S: Final = 10.0
"""Beyond a child's wall budget, how long the backend waits for the server to say the child is
gone before it takes the server for dead (it kills at the budget)."""

_MAX_MESSAGE: Final = 1 << 16
_PR_SET_PDEATHSIG: Final = 1
_FDS_PER_REQUEST: Final = 4

_BOOT: Final = (
    "import json, os, sys; sys.path.insert(0, sys.argv[1]);"
    " from alphaagent.domain.decode_server import serve;"
    " os._exit(serve(int(sys.argv[2]), json.loads(sys.argv[3])))"
)


class ServerUnavailableError(OSError):
    """The decoding server could not be started or stopped answering (the caller may spawn instead)."""


@dataclass
class ForkServer:
    """The backend's handle on one running server; thread-safe."""

    process: subprocess.Popen[bytes]
    control: socket.socket
    owner_pid: int = field(default_factory=os.getpid)
    preload_errors: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, package_root: str, env: dict[str, str]) -> ForkServer:
        """Start a server and wait until it has imported the decoders.

        Raises:
            ServerUnavailableError: it could not start or did not say it was ready in time."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            process = subprocess.Popen(
                [sys.executable, "-I", "-c", _BOOT, package_root, str(theirs.fileno()), json.dumps(PRELOAD)],
                pass_fds=(theirs.fileno(),),
                env=env,
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            ours.close()
            raise ServerUnavailableError(exc.errno, f"the decoding server could not start: {exc}") from None
        finally:
            theirs.close()
        server = cls(process, ours)
        ours.settimeout(START_TIMEOUT_S)
        try:
            ready = json.loads(ours.recv(_MAX_MESSAGE) or b"null")
        except (OSError, ValueError):
            ready = None
        if not isinstance(ready, dict) or not ready.get("ready"):
            server.close()
            raise ServerUnavailableError(0, f"the decoding server was not ready within {START_TIMEOUT_S:g} s")
        server.preload_errors = [str(e) for e in ready.get("preload_errors", [])]
        ours.settimeout(None)
        return server

    @property
    def alive(self) -> bool:
        """True while the server runs and belongs to this process (a forked backend starts its own)."""
        return self.owner_pid == os.getpid() and self.process.poll() is None

    def run(
        self, job: str, args: dict[str, Any], data_fd: int, answer_fd: int, errors_fd: int, timeout_s: float
    ) -> tuple[int, bool]:
        """Decode in a fresh child of the server: its exit code (negative: the signal that killed it)
        and whether it was killed at its wall budget ``timeout_s`` (seconds).

        Raises:
            ServerUnavailableError: the server is gone or did not answer; no child of it is left running.
            OSError: the server could not fork a child (the message says why)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with ours:
            try:
                request = json.dumps({"job": job, "args": args, "timeout_s": timeout_s}).encode()
                socket.send_fds(self.control, [request], [data_fd, answer_fd, errors_fd, theirs.fileno()])
            except OSError as exc:
                raise ServerUnavailableError(exc.errno, f"the decoding server is gone: {exc}") from None
            finally:
                theirs.close()
            ours.settimeout(timeout_s + REPLY_GRACE_S)
            try:
                reply = json.loads(ours.recv(_MAX_MESSAGE) or b"null")
            except (OSError, ValueError):
                reply = None
        if not isinstance(reply, dict):
            self.close()  # a server that lost a child's outcome is not trusted with the next one
            raise ServerUnavailableError(0, "the decoding server stopped answering")
        if "error" in reply:
            raise OSError(0, str(reply["error"]))
        return int(reply["exit_code"]), bool(reply.get("timed_out"))

    def close(self) -> None:
        """Stop the server: it kills its children and exits when its control socket closes (killed
        if it has not within 5 s); waited for, so its CPU counts as this process's children's."""
        if self.owner_pid != os.getpid():
            return  # a fork's copy of the handle: the server is its parent's
        with contextlib.suppress(OSError):
            self.control.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                self.process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                self.process.wait(timeout=5)


_SERVER_LOCK: Final = threading.Lock()
_server: ForkServer | None = None


def shared_server(package_root: str, env: dict[str, str]) -> ForkServer:
    """This process's server, started on first use (and again if it died or this process is a fork).

    Raises:
        ServerUnavailableError: it could not be started."""
    global _server
    with _SERVER_LOCK:
        if _server is None or not _server.alive:
            if _server is not None:
                _server.close()
            _server = ForkServer.start(package_root, env)
            atexit.register(_server.close)
        return _server


# ----------------------------------------------------------------------------- the server's side


@dataclass
class _Child:
    pid: int
    reply: socket.socket
    deadline: float
    pidfd: int = -1
    timed_out: bool = False


def serve(control_fd: int, preload: list[str]) -> int:
    """Server side: import the modules ``preload`` names, say ready, then fork a child per request
    until the control socket closes."""
    control = socket.socket(fileno=control_fd)
    preload_errors = []
    for name in preload:
        try:
            __import__(name)
        except Exception as exc:  # a decoder that cannot be imported fails in its own child, with the reason
            preload_errors.append(f"{name}: {type(exc).__name__}: {exc}"[:300])
    gc.collect()
    gc.freeze()  # what the imports allocated stays shared with the children (the collector writes no page)
    control.send(json.dumps({"ready": True, "preload_errors": preload_errors}).encode())
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ)
    children: dict[int, _Child] = {}
    try:
        while True:
            now = time.monotonic()
            polled = any(child.pidfd < 0 for child in children.values())
            waits = [child.deadline - now for child in children.values() if not child.timed_out]
            timeout = max(0.0, min(waits)) if waits else None
            if polled:
                timeout = 0.05 if timeout is None else min(timeout, 0.05)
            for key, _ in selector.select(timeout):
                if key.fileobj is control and not _accept(control, selector, children):
                    return 0
            _reap(selector, children)
            now = time.monotonic()
            for child in children.values():
                if not child.timed_out and now >= child.deadline:
                    child.timed_out = True
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(child.pid, signal.SIGKILL)
    finally:
        for child in children.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGKILL)


def _accept(control: socket.socket, selector: selectors.BaseSelector, children: dict[int, _Child]) -> bool:
    """Take one request and fork its child; False when the control socket has closed."""
    try:
        message, fds, _flags, _address = socket.recv_fds(control, _MAX_MESSAGE, _FDS_PER_REQUEST)
    except OSError:
        return False
    if not message:
        for fd in fds:
            os.close(fd)
        return False
    if len(fds) != _FDS_PER_REQUEST:
        for fd in fds:
            os.close(fd)
        return True
    data_fd, answer_fd, errors_fd, reply_fd = fds
    reply = socket.socket(fileno=reply_fd)
    try:
        request = json.loads(message)
        pid = os.fork()
    except (OSError, ValueError) as exc:
        with contextlib.suppress(OSError):
            reply.send(json.dumps({"error": f"no decoding child: {exc}"[:500]}).encode())
        reply.close()
        for fd in (data_fd, answer_fd, errors_fd):
            os.close(fd)
        return True
    if pid == 0:
        _child(request, data_fd, answer_fd, errors_fd)  # never returns
    for fd in (data_fd, answer_fd, errors_fd):
        os.close(fd)
    child = _Child(pid, reply, time.monotonic() + float(request["timeout_s"]))
    try:
        child.pidfd = os.pidfd_open(pid)
        selector.register(child.pidfd, selectors.EVENT_READ)
    except (AttributeError, OSError):
        child.pidfd = -1  # no pidfd here: its exit is polled for
    children[pid] = child
    return True


def _reap(selector: selectors.BaseSelector, children: dict[int, _Child]) -> None:
    """Answer for every child that has exited."""
    for pid, child in list(children.items()):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == 0:
            continue
        del children[pid]
        if child.pidfd >= 0:
            selector.unregister(child.pidfd)
            os.close(child.pidfd)
        outcome = {"exit_code": os.waitstatus_to_exitcode(status), "timed_out": child.timed_out}
        with contextlib.suppress(OSError):
            child.reply.send(json.dumps(outcome).encode())
        child.reply.close()


def _child(request: dict[str, Any], data_fd: int, answer_fd: int, errors_fd: int) -> None:
    """In the forked child: the answer file as stdout, the errors file as stderr, the file to decode
    as the only other descriptor; the limits; the job; ``os._exit``. No interpreter shutdown follows
    the answer: pyarrow's thread pool, torn down at exit while its threads still run, sometimes
    aborts the process ("terminate called without an active exception") after a complete answer,
    and a decode that answered was then refused as a crash."""
    code = 1
    try:
        # Dies with the server: no decode outlives the process that answers for it.
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() == 1:
            os._exit(code)
        os.dup2(answer_fd, 1)
        os.dup2(errors_fd, 2)
        if data_fd != 3:
            os.dup2(data_fd, 3)
        os.closerange(4, _max_fd())
        os.set_inheritable(3, False)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        from alphaagent.domain.decoding import run_job

        code = run_job(str(request["job"]), 3, request["args"])
    except BaseException:
        with contextlib.suppress(BaseException):
            os.write(2, traceback.format_exc()[-4096:].encode("utf-8", "replace"))
        code = 1
    finally:
        os._exit(code)


def _max_fd() -> int:
    try:
        return max(int(name) for name in os.listdir("/proc/self/fd")) + 1
    except (OSError, ValueError):
        return os.sysconf("SC_OPEN_MAX")
