"""A warm ``alphaagent`` command line for the tests that run a command to completion and check its
exit code, standard output and standard error.

``run_cli(args, env=..., cwd=..., input=...)`` answers as ``subprocess.run([sys.executable, "-m",
"alphaagent.cli", *args], capture_output=True, ...)`` does, but each call is a child forked from a
helper process (one per test process, started on first use) that has already imported the product:
a fresh interpreter pays ~0.6 CPU-s of imports before the command does anything, and the suite runs
hundreds of commands.

The child is made what a fresh ``python -m alphaagent.cli ARGS`` would be: the call's argv, its
environment (``os.environ`` replaced wholesale, ``time.tzset()``), cwd (also ``sys.path[0]``, as
``-m`` puts it there), umask, and its own standard input, output and error (the descriptors are
passed over a unix socket with ``SCM_RIGHTS``; every other descriptor is closed, as ``close_fds``
does); ``alphaagent.cli`` runs as ``__main__`` through ``runpy`` exactly as ``-m`` runs it, and the
interpreter exits the usual way (atexit, thread joins, flushes), so the exit status the caller gets
is the real one (a negative one for a signal, as ``subprocess`` reports it).

Why that is sound: every child is forked from the helper as it was right after its imports, never
from a process that ran a command, so one call cannot leak into the next; and the project's rule
"nothing at import" (no environment read, no client, no cache filled at import time) means the
imports leave nothing a fresh process would not have. The helper checks that rule before serving:
no thread started, no ``functools`` cache of ``alphaagent`` filled, no descriptor open but its own.

A call runs in a fresh process instead when the warm one could differ: a terminal on a standard
stream (the interpreter picks line buffering at start-up), or an environment whose start-up
variables (``PYTHON*``, ``LANG``, ``LC_*``) differ from the helper's. ``ALPHAAGENT_TEST_FRESH_CLI=1``
runs every call in a fresh process, to check that the two ways agree.

Not for tests that send signals to the command, read its output while it runs, or test process-level
behaviour (Ctrl-C, a closed pipe, the import itself): those start a real process.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import json
import locale
import os
import runpy
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

FRESH_ENV = "ALPHAAGENT_TEST_FRESH_CLI"
"""Set to 1: every ``run_cli`` call starts a fresh ``python -m alphaagent.cli`` process."""

PRELOAD = (
    "alphaagent.cli",
    "alphaagent.api",
    "alphaagent.demo",
    "alphaagent.models.spec",
    "alphaagent.sandbox.supervisor",
    "alphaagent.sandbox.render",
    "alphaagent.local.executor",
    "alphaagent.terminal",
    "alphaagent.domain.turns",
    "alphaagent.local.bus",
    "alphaagent.local.environments",
    "pydantic.type_adapter",
)
"""What the helper imports before forking: the modules most commands import (``exec`` and ``run``
import the sandbox; ``run`` the turn driver, ~30 ms of imports a call; the reads import the API, and
every command with ``--user`` checks it with a ``TypeAdapter``). A module a command needs beyond
these is imported by the child, as a fresh process would."""

_MAX_REQUEST_BYTES = 1 << 20
"""One request (argv, environment, cwd) in one SOCK_SEQPACKET message; far above any test's."""

_STARTUP_NAMES = ("LANG", "LANGUAGE")
_STARTUP_PREFIXES = ("PYTHON", "LC_")
"""Variables the interpreter reads when it starts (encoding, paths, hash seed, buffering): a child
forked after start-up cannot honour a different value, so such a call runs in a fresh process."""


def _startup_variables(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k in _STARTUP_NAMES or k.startswith(_STARTUP_PREFIXES)}


def command(args: Sequence[str]) -> list[str]:
    """The argv of a fresh process running ``alphaagent ARGS``."""
    return [sys.executable, "-m", "alphaagent.cli", *args]


def fresh_only() -> bool:
    """Whether ``ALPHAAGENT_TEST_FRESH_CLI`` asks for fresh processes."""
    return os.environ.get(FRESH_ENV, "") not in ("", "0")


# ----------------------------------------------------------------------------- the client


def run_cli(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    input: bytes | str | None = None,
    stdin: int | IO[Any] | None = None,
    text: bool = False,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[Any]:
    """``alphaagent ARGS`` run to completion with its output captured, as ``subprocess.run(command(args),
    env=env, cwd=cwd, input=input, stdin=stdin, capture_output=True, text=text, timeout=timeout)``.

    Raises:
        subprocess.TimeoutExpired: the command ran longer than ``timeout`` seconds (it is killed).
    """
    if fresh_only():
        return _run_fresh(args, env=env, cwd=cwd, input=input, stdin=stdin, text=text, timeout=timeout)
    environment = dict(os.environ if env is None else env)
    ours: list[int] = []  # descriptors opened here for the child: closed once it has them
    if input is not None:
        if stdin is not None:
            raise ValueError("stdin and input arguments may not both be used")
        read_end, write_end = os.pipe()
        ours.append(read_end)
        data = input.encode(locale.getpreferredencoding(False)) if isinstance(input, str) else input
        feeder = threading.Thread(target=_feed, args=(write_end, data), daemon=True)
        stdin_fd = read_end
    elif stdin == subprocess.DEVNULL:
        stdin_fd = os.open(os.devnull, os.O_RDONLY)
        ours.append(stdin_fd)
        feeder = None
    elif stdin is None:
        stdin_fd, feeder = 0, None
    else:
        stdin_fd, feeder = (stdin if isinstance(stdin, int) else stdin.fileno()), None
    if os.isatty(stdin_fd) or _startup_variables(environment) != _helper_startup():
        for fd in ours if feeder is None else (*ours, write_end):
            os.close(fd)
        return _run_fresh(args, env=env, cwd=cwd, input=input, stdin=stdin, text=text, timeout=timeout)
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    readers = [_Reader(out_read), _Reader(err_read)]
    try:
        pid, status_socket = _helper().start(
            args,
            environment,
            os.fspath(cwd) if cwd is not None else os.getcwd(),
            (stdin_fd, out_write, err_write),
        )
    finally:
        # The child has its copies: the input pipe's feeder must see it go when the child does.
        for fd in (out_write, err_write, *ours):
            _close_quietly(fd)
    if feeder is not None:
        feeder.start()
    with status_socket:
        deadline = None if timeout is None else time.monotonic() + timeout
        status = _wait_status(status_socket, deadline)
        if status is None:  # timed out: kill it as subprocess.run does, then collect it
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
            _wait_status(status_socket, None)
            stdout, stderr = (reader.join(1.0) for reader in readers)
            raise subprocess.TimeoutExpired(command(args), timeout or 0.0, stdout, stderr)
    for reader in readers:  # the end of the output, as subprocess.run waits for it too
        reader.join(None if deadline is None else max(deadline - time.monotonic(), 0.001))
    stdout, stderr = (reader.join(0) for reader in readers)
    if any(reader.alive for reader in readers):  # a process it left holds the output open
        raise subprocess.TimeoutExpired(command(args), timeout or 0.0, stdout, stderr)
    if feeder is not None:
        feeder.join()
    returncode = os.waitstatus_to_exitcode(status)
    if text:
        return subprocess.CompletedProcess(command(args), returncode, _decode(stdout), _decode(stderr))
    return subprocess.CompletedProcess(command(args), returncode, stdout, stderr)


def _run_fresh(args: Sequence[str], **options: Any) -> subprocess.CompletedProcess[Any]:
    return subprocess.run(command(args), capture_output=True, check=False, **options)


def _decode(data: bytes) -> str:
    # What subprocess.run(text=True) gives: the locale's encoding, universal newlines.
    text = data.decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def _feed(fd: int, data: bytes) -> None:
    try:
        with open(fd, "wb", closefd=True) as pipe:
            pipe.write(data)
    except BrokenPipeError:  # the command stopped reading: as subprocess.communicate, not an error
        pass


class _Reader:
    """Reads one pipe to its end on a thread, so a command that writes much never blocks."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._chunks: list[bytes] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            while chunk := os.read(self._fd, 1 << 16):
                self._chunks.append(chunk)
        finally:
            os.close(self._fd)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float | None) -> bytes:
        self._thread.join(timeout)
        return b"".join(self._chunks)


def _wait_status(status_socket: socket.socket, deadline: float | None) -> int | None:
    """The child's wait status from the helper, or None when ``deadline`` passed first."""
    status_socket.settimeout(None if deadline is None else max(deadline - time.monotonic(), 0.001))
    try:
        message = status_socket.recv(_MAX_REQUEST_BYTES)
    except TimeoutError:
        return None
    if not message:
        raise RuntimeError(f"the warm CLI helper died; its log: {_helper().log_tail()}")
    return int(json.loads(message)["status"])


class _Helper:
    """The helper process of this test process, and the socket it listens on."""

    def __init__(self) -> None:
        self._folder = Path(tempfile.mkdtemp(prefix="alphaagent-cli-runner-"))
        self._socket_path = str(self._folder / "socket")
        self._log = self._folder / "helper.log"
        self.startup = _startup_variables(os.environ)
        with open(self._log, "wb") as log:
            self._process = subprocess.Popen(
                [sys.executable, __file__, "--serve", self._socket_path],
                stdin=subprocess.PIPE,  # the lifeline: the helper ends when this process does
                stdout=subprocess.PIPE,
                stderr=log,
                cwd=self._folder,
            )
        assert self._process.stdout is not None
        ready = self._process.stdout.readline()
        self._process.stdout.close()
        if ready.strip() != b"ready":
            self._process.wait(timeout=30)
            raise RuntimeError(f"the warm CLI helper did not start: {self.log_tail()}")

    def start(
        self, args: Sequence[str], env: Mapping[str, str], cwd: str, fds: tuple[int, int, int]
    ) -> tuple[int, socket.socket]:
        """Fork a child for one call; its pid, and the socket its wait status will arrive on."""
        umask = os.umask(0o022)
        os.umask(umask)
        request = {"args": list(args), "env": dict(env), "cwd": cwd, "umask": umask}
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            connection.connect(self._socket_path)
            socket.send_fds(connection, [json.dumps(request).encode()], list(fds))
            answer = connection.recv(_MAX_REQUEST_BYTES)
            if not answer:
                raise RuntimeError(f"the warm CLI helper refused the call; its log: {self.log_tail()}")
            return int(json.loads(answer)["pid"]), connection
        except BaseException:
            connection.close()
            raise

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return self._log.read_text(errors="replace")[-2000:]
        return "(no log)"

    def close(self) -> None:
        if self._process.poll() is None:
            assert self._process.stdin is not None
            self._process.stdin.close()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        with contextlib.suppress(OSError):
            os.unlink(self._socket_path)
        with contextlib.suppress(OSError):
            self._log.unlink()
        with contextlib.suppress(OSError):
            self._folder.rmdir()


_lock = threading.Lock()
_helpers: dict[int, _Helper] = {}


def _helper() -> _Helper:
    """This process's helper, started on first use (a forked test process gets its own)."""
    with _lock:
        helper = _helpers.get(os.getpid())
        if helper is None or helper._process.poll() is not None:
            if not _helpers:
                atexit.register(close_helper)
            helper = _helpers[os.getpid()] = _Helper()
        return helper


def _helper_startup() -> dict[str, str]:
    return _helper().startup


def close_helper() -> None:
    """Stop this process's helper, if it was started (the session fixture does, and atexit)."""
    with _lock:
        helper = _helpers.pop(os.getpid(), None)
    if helper is not None:
        helper.close()


# ----------------------------------------------------------------------------- the helper


def _check_nothing_at_import() -> list[str]:
    """What the imports left that a fresh process would not have: threads, filled caches of
    ``alphaagent`` functions, open descriptors beyond the standard three and the helper's own."""
    problems = []
    if threading.active_count() != 1:
        problems.append(f"threads running after the imports: {threading.enumerate()}")
    for name, module in list(sys.modules.items()):
        if not name.startswith("alphaagent") or module is None:
            continue
        for attribute, value in list(vars(module).items()):
            info = getattr(value, "cache_info", None)
            if isinstance(value, functools._lru_cache_wrapper) and info is not None and info().currsize:
                problems.append(f"{name}.{attribute} cached {info().currsize} value(s) at import")
    extra = sorted(int(fd) for fd in os.listdir("/proc/self/fd") if int(fd) > 2)
    # One of them is the listdir's own descriptor, closed by now.
    open_now = [fd for fd in extra if _is_open(fd)]
    if open_now:
        problems.append(f"descriptors open after the imports: {open_now}")
    return problems


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def serve(socket_path: str) -> None:
    """Import the product, then fork one child per request until standard input closes."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    problems = _check_nothing_at_import()
    if problems:
        print("the imports are not what a fresh process has:", *problems, sep="\n  ", file=sys.stderr)
        sys.exit(3)
    # A fresh `-m` process has imported the cli's dependencies but not `alphaagent.cli` itself: it
    # runs as `__main__`, and a later `import alphaagent.cli` is a module of its own.
    sys.modules.pop("alphaagent.cli", None)
    with contextlib.suppress(AttributeError):
        delattr(sys.modules["alphaagent"], "cli")
    # What `-m alphaagent.cli` runs, found and read once, as runpy.run_module would in every child
    # (~5 ms a call to read and unmarshal the module's bytecode).
    _, cli_spec, cli_code = runpy._get_module_details("alphaagent.cli")  # type: ignore[attr-defined]
    # Everything built so far is the children's inheritance: out of the collector's reach, so that a
    # collection in a child neither walks it nor copies its pages (copy-on-write) by touching them.
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(socket_path)
    listener.listen(64)
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ, "lifeline")
    selector.register(listener, selectors.EVENT_READ, "call")
    children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, connection)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    while True:
        for key, _ in selector.select():
            if key.data == "lifeline":
                if not os.read(0, 1024):
                    return
            elif key.data == "call":
                connection, _ = listener.accept()
                message, fds, _flags, _address = socket.recv_fds(connection, _MAX_REQUEST_BYTES, 3)
                request = json.loads(message)
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    # Becomes the command; never returns here (the interpreter exits with its status).
                    connections = [connection for _, connection in children.values()]
                    _become_command(
                        request, fds, [selector, listener, connection, *connections], (cli_spec, cli_code)
                    )
                for fd in fds:
                    os.close(fd)
                pidfd = os.pidfd_open(pid)
                children[pidfd] = (pid, connection)
                selector.register(pidfd, selectors.EVENT_READ, "child")
                connection.send(json.dumps({"pid": pid}).encode())
            else:
                pid, connection = children.pop(key.fd)
                selector.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                with contextlib.suppress(OSError):
                    connection.send(json.dumps({"status": status}).encode())
                connection.close()


def _become_command(
    request: dict[str, Any], fds: list[int], helper_objects: list[Any], cli: tuple[Any, Any]
) -> None:
    """In the forked child: make this process what ``python -m alphaagent.cli ARGS`` started with
    the call's environment, cwd and standard streams would be, and run it as ``-m`` does (``cli``:
    the module's spec and code, as ``runpy`` finds them)."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    # Closed as objects first, so that no finaliser closes their numbers later, when the command
    # may have opened something else under them.
    for item in helper_objects:
        item.close()
    # As subprocess's close_fds: only the three standard descriptors (the listener, the other
    # calls' connections and pidfds, the received copies all go).
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    os.umask(request["umask"])
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    time.tzset()
    sys.path[0] = os.getcwd()  # what `-m` puts first
    sys.argv = ["-m", *request["args"]]  # runpy sets argv[0] to the module's file, as -m does
    # sys.stdin, sys.stdout and sys.stderr are the helper's start-up objects, now on the call's
    # descriptors: the helper never read or wrote through them, so nothing is buffered in them.
    interrupted = False
    try:
        # What runpy.run_module("alphaagent.cli", run_name="__main__", alter_sys=True) does once it
        # has found the module.
        runpy._run_module_code(cli[1], None, "__main__", cli[0])  # type: ignore[attr-defined]
        status = 0
    except SystemExit as exc:
        status = _exit_status(exc)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        status, interrupted = 1, True
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status = 1
    os._exit(_end_like_the_interpreter(status, interrupted=interrupted))


def _exit_status(exc: SystemExit) -> int:
    # What the interpreter makes of an uncaught SystemExit (Python/pythonrun.c, _Py_HandleSystemExit).
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def _end_like_the_interpreter(status: int, *, interrupted: bool) -> int:
    """The steps of the interpreter's exit (Py_FinalizeEx) that a command can observe: wait for its
    non-daemon threads, run the atexit functions, flush standard output and error (a failed flush
    makes the status 120); then the caller leaves with ``os._exit``. Not the teardown of every
    module (~0.2 CPU-s in this big process, a third of what a warm call would cost): the product
    closes what it opens with ``with`` blocks, and no test checks a finaliser that runs at exit."""
    threading._shutdown()  # type: ignore[attr-defined]  # what Py_FinalizeEx calls first
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            print(f"Exception ignored while flushing {stream!r}", file=sys.__stderr__)
            status = 120
    if interrupted:  # an uncaught KeyboardInterrupt ends the interpreter by SIGINT (Python >= 3.8)
        import signal

        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return status


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2])
