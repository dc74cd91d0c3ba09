"""Start the viewer: open the backend read-only, bind the port, print the URL with its token, serve.

Example::

    reader = local_reader(Path("~/.local/share/alphaagent").expanduser(), "alice")
    serve(reader, host="127.0.0.1", port=8765)   # prints http://127.0.0.1:8765/?token=...
"""

from __future__ import annotations

import ipaddress
import secrets
import socket
import sys
import webbrowser
from collections.abc import Callable
from pathlib import Path
from typing import Any

from alphaagent.ports import Store, Workspace
from alphaagent.viewer.reader import WorkspaceReader

TOKEN_BYTES = 32
"""Random bytes of a start's token (256 bits, as URL-safe base64)."""

LOCAL_DB_NAME = "alphaagent.db"
"""The local backend's SQLite file inside the data directory (``alphaagent.api.AlphaAgent``)."""


def local_reader(home: Path, user_id: str) -> WorkspaceReader:
    """A reader of ``home`` (the local data directory). Nothing is created: until the database
    exists, the viewer shows no conversations."""

    def opener() -> tuple[Store, Workspace] | None:
        from alphaagent.local.store import SqliteStore
        from alphaagent.local.workspace import LocalWorkspace

        database = home / LOCAL_DB_NAME
        if not database.is_file():
            return None
        return SqliteStore(database), LocalWorkspace(home)

    return WorkspaceReader(user_id, opener)


def aws_reader(table: str, bucket: str, user_id: str, region: str | None = None) -> WorkspaceReader:
    """A reader of a deployed stack: its ``StateTableName`` and ``WorkspacesBucketName`` outputs,
    with the operator's credentials (needs ``dynamodb:GetItem``/``Query`` on the table and
    ``s3:GetObject``/``ListBucket`` on the bucket)."""

    def opener() -> tuple[Store, Workspace] | None:
        from alphaagent.aws.client import aws_client
        from alphaagent.aws.store import DynamoStore
        from alphaagent.aws.workspace import S3Workspace

        store = DynamoStore(table, client=aws_client("dynamodb", region))
        return store, S3Workspace(bucket, client=aws_client("s3", region))

    return WorkspaceReader(user_id, opener)


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (``127.0.0.0/8``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host``:``port`` (``port`` 0: any free port). Raises ``OSError``
    when the address is taken or cannot be bound."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    listener = socket.socket(family, kind, proto)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(address)
        listener.listen(128)
    except OSError:
        listener.close()
        raise
    return listener


def viewer_url(host: str, port: int, token: str) -> str:
    """``http://HOST:PORT/?token=TOKEN`` (an IPv6 host in brackets)."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/?token={token}"


def serve(
    reader: WorkspaceReader,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    open_browser: bool = False,
    token: str | None = None,
    announce: Callable[[str], Any] | None = None,
) -> None:
    """Serve the viewer until interrupted. Prints the URL (with a fresh random token unless
    ``token`` is given) once the port is bound, or hands it to ``announce``; with ``open_browser``,
    opens it too, or says on standard error that no browser could be opened (and the URL to open).

    Raises:
        OSError: the address cannot be bound (taken, or not an address of this machine).
    """
    import uvicorn

    from alphaagent.viewer.app import create_app

    token = token or secrets.token_urlsafe(TOKEN_BYTES)
    listener = bind(host, port)
    bound_port = int(listener.getsockname()[1])
    # The Host header names the address as the URL does (an IPv6 one in brackets).
    named = f"[{host}]" if ":" in host else host
    hosts = ("127.0.0.1", "localhost", "[::1]", named) if is_loopback(host) else ("*",)
    app = create_app(reader, token=token, cookie_name=f"alphaagent_viewer_{bound_port}", allowed_hosts=hosts)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    url = viewer_url(host, bound_port, token)
    message = f"alphaagent viewer of {reader.user_id!r}: {url}"
    if announce is None:
        print(message, flush=True)  # flushed: whoever reads the URL from a pipe gets it now
    else:
        announce(message)
    if not is_loopback(host):
        print(
            f"alphaagent: warning: listening on {host}, not only this machine; the token is the only guard",
            file=sys.stderr,
        )
    if open_browser and not webbrowser.open(url):
        # A headless machine (no display, no browser): said, with what to open elsewhere, never silence.
        print(f"alphaagent: no browser could be opened here; open {url}", file=sys.stderr, flush=True)
    try:
        uvicorn.Server(config).run(sockets=[listener])
    finally:
        listener.close()
