"""Landlock's TCP-connect restriction (``alphaagent.sandbox.landlock``), for real on this kernel.

The restriction cannot be undone, so it is never applied to the test process: each test restricts a
child process (a ``python -c`` or the sandbox's zygote) and connects from there to servers the test
listens with. The tests that need network rules skip, saying so, where the kernel's Landlock ABI is
below 4.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from assertions import assert_status

from alphaagent.sandbox import landlock
from alphaagent.sandbox.config import SandboxConfig
from alphaagent.sandbox.supervisor import Sandbox

ABI = landlock.abi_version()
needs_network_rules = pytest.mark.skipif(
    ABI < landlock.NET_ABI, reason=f"this kernel's Landlock ABI is {ABI}; TCP rules need 4 (Linux 6.7)"
)

CONNECT = """
import errno, json, os, socket, sys
def attempt(port):
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect(("127.0.0.1", port))
        return "connected"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    finally:
        s.close()
print(json.dumps({str(p): attempt(p) for p in PORTS}))
"""


@pytest.fixture
def servers() -> Iterator[tuple[int, int]]:
    """Two listening TCP sockets on 127.0.0.1 (the one to deny, and another): their ports."""
    sockets = []
    for _ in range(2):
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        sockets.append(server)
    yield sockets[0].getsockname()[1], sockets[1].getsockname()[1]
    for server in sockets:
        server.close()


def _connects(code_prefix: str, ports: tuple[int, ...]) -> dict[str, str]:
    src = Path(landlock.__file__)
    program = (
        "import importlib.util, json, os\n"
        f"spec = importlib.util.spec_from_file_location('ll', {str(src)!r})\n"
        "ll = importlib.util.module_from_spec(spec); spec.loader.exec_module(ll)\n"
        f"{code_prefix}\n" + CONNECT.replace("PORTS", repr(ports))
    )
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(out.stdout.splitlines()[-1])  # type: ignore[no-any-return]


@needs_network_rules
def test_a_restricted_process_cannot_connect_to_the_denied_port_and_can_to_others(
    servers: tuple[int, int],
) -> None:
    denied, other = servers
    # Given a process that denied itself TCP connect to one port, and a child it forks afterwards
    prefix = (
        f"state = ll.restrict_tcp_connect(({denied},))\n"
        "assert state['in_force'], state\n"
        "pid = os.fork()\n"
        "if pid: os.waitpid(pid, 0); raise SystemExit(0)\n"
    )
    # When the child connects to both ports
    answers = _connects(prefix, (denied, other))
    # Then the denied port answers EACCES (Landlock), the other one connects
    assert answers == {str(denied): "EACCES", str(other): "connected"}


def test_an_unrestricted_process_connects_to_both(servers: tuple[int, int]) -> None:
    # The control case: the same program without the restriction reaches both servers.
    assert set(_connects("", servers).values()) == {"connected"}


def test_without_network_rules_nothing_is_changed_and_the_state_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a kernel whose Landlock predates network rules
    monkeypatch.setattr(landlock, "abi_version", lambda: 3)
    # When the restriction is asked for (safe in-process: nothing is enforced below ABI 4)
    state = landlock.restrict_tcp_connect((9001,))
    # Then it is not in force, and the reason names the ABI
    assert state["in_force"] is False and state["abi"] == 3
    assert "ABI 3 has no network rules" in state["detail"]


def test_a_port_outside_1_65535_is_refused() -> None:
    with pytest.raises(ValueError, match="denied_ports"):
        landlock.restrict_tcp_connect((0,))


@needs_network_rules
def test_the_sandbox_zygote_denies_every_run_the_configured_port(
    servers: tuple[int, int], tmp_path: Path
) -> None:
    denied, other = servers
    # Given a sandbox at the Lambda level of isolation, configured as the env function configures it
    config = SandboxConfig(
        isolation="process", pool_size=1, preload=(), warmup="", deny_tcp_connect_ports=(denied,)
    )
    with Sandbox(config) as box:
        # When two runs in turn connect to both ports
        code = CONNECT.replace("PORTS", repr((denied, other)))
        results = [box.run(code, cwd=tmp_path) for _ in range(2)]
        state = box.info["landlock"]
    # Then each run is refused the denied port only, and the zygote says the restriction is in force
    for result in results:
        assert_status(result, "ok", result.stderr)
        assert json.loads(result.stdout) == {str(denied): "EACCES", str(other): "connected"}
    assert state["in_force"] is True and state["denied_tcp_ports"] == [denied]
