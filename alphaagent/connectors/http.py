"""The ``http`` connector: a URL on an allowed host, redirects included (each hop is checked)."""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import PurePosixPath
from typing import Annotated, Any, Final

from pydantic import BaseModel, ConfigDict, Field, field_validator

from alphaagent.connectors.base import ConnectorRequest, EnvVar, Fetched, FetchLimits
from alphaagent.errors import ToolError

NAME = "http"

_LABEL: Final = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
HOST: Final = re.compile(rf"(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*")
"""A DNS host name, lower case (RFC 1123 labels); the connector compares host names exactly, so a
scheme, a port, a path or upper case could never match and is refused when configured."""


class Request(ConnectorRequest):
    """``{"url", "name"?}``."""

    url: str = Field(description="An http or https URL on an allowed host.")


class Settings(BaseModel):
    """Which hosts the ``http`` connector may fetch from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    http_hosts: Annotated[
        tuple[str, ...], EnvVar(local="ALPHAAGENT_HTTP_HOSTS", aws="CONNECTOR_HTTP_HOSTS")
    ] = Field(
        (),
        description="Host names the http connector may fetch from (exact match, redirects included);"
        " comma-separated, lower case, no scheme or port. Default: none.",
    )

    @field_validator("http_hosts")
    @classmethod
    def _hosts(cls, hosts: tuple[str, ...]) -> tuple[str, ...]:
        for host in hosts:
            if not HOST.fullmatch(host):
                raise ValueError(f"{host!r} is not a lower-case DNS host name (no scheme, port or path)")
        return hosts


def describe(settings: Settings) -> str:
    """The tool text's sentence about this connector."""
    hosts = ", ".join(settings.http_hosts) or "none"
    return f"'http' fetches a URL on these hosts only: {hosts}."


def _allowed_url(settings: Settings, url: str, field: str) -> urllib.parse.SplitResult:
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ToolError(f"{field}: must be an http or https URL")
    if parsed.hostname not in settings.http_hosts:
        raise ToolError(f"{field}: host {parsed.hostname} is not in the http connector's allowlist")
    return parsed


def check(request: Request, settings: Settings, limits: FetchLimits) -> None:
    """Refuse, without any network call, a URL ``fetch`` would refuse before fetching: not http(s),
    or a host outside ``http_hosts``. Raises ``ToolError``."""
    try:
        _allowed_url(settings, request.url, "request.url")
    except ValueError:
        raise ToolError("request.url: not a valid URL") from None


def fetch(request: Request, settings: Settings, limits: FetchLimits) -> Fetched:
    """GET ``request.url``, refusing a host (or a redirect's host) not in ``http_hosts``, a body over
    ``limits.max_bytes`` and a transfer longer than ``limits.timeout_s``."""
    url = request.url
    try:
        parsed = _allowed_url(settings, url, "request.url")
    except ValueError:
        raise ToolError("request.url: not a valid URL") from None

    class _CheckedRedirects(urllib.request.HTTPRedirectHandler):
        # A redirect is a new request: it must pass the allowlist too (no SSRF by 302).
        def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
            _allowed_url(settings, newurl, "request.url (redirect)")
            return super().redirect_request(req, fp, code, msg, headers, newurl)

    opener = urllib.request.build_opener(_CheckedRedirects)
    deadline = time.monotonic() + limits.timeout_s
    chunks, size = [], 0
    try:
        with opener.open(url, timeout=limits.timeout_s) as response:
            while chunk := response.read(1 << 16):
                chunks.append(chunk)
                size += len(chunk)
                if size > limits.max_bytes:
                    raise ToolError(
                        f"request.url: the response is over the connector cap of {limits.max_bytes} bytes"
                    )
                if time.monotonic() > deadline:
                    raise ToolError(f"request.url: the fetch took longer than {limits.timeout_s:g} s")
    except (urllib.error.URLError, TimeoutError, OSError, ValueError) as exc:
        raise ToolError(f"request.url: fetching {url} failed: {exc}") from None
    name = request.name or PurePosixPath(parsed.path).name or parsed.hostname or "document"
    return Fetched(b"".join(chunks), name, url)
