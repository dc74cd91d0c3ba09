"""What every connector shares: the request base model, the fetch limits, what a fetch returns, the
environment variable marker of a settings field, and the shape of a connector module."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_MAX_BYTES = 25 * 2**20
"""Size cap of one fetched copy, in bytes (25 MiB, the export's per-file ceiling)."""
DEFAULT_TIMEOUT_S = 30.0
"""Network timeout of one fetch, in seconds."""


class ConnectorRequest(BaseModel):
    """The base of a connector's request model: unknown fields are refused (a misspelt ``pth`` is an
    error, not a silently ignored field), and values must have their field's JSON type (``strict``:
    a request is JSON from a spec or the coder). ``name`` is the copy's file name in ``docs/``."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str | None = Field(None, description="The copy's file name in docs/ (default: the source's).")


class FetchLimits(NamedTuple):
    """The limits every fetch obeys: ``max_bytes`` (bytes) and ``timeout_s`` (seconds)."""

    max_bytes: int = DEFAULT_MAX_BYTES
    timeout_s: float = DEFAULT_TIMEOUT_S


class Fetched(NamedTuple):
    """A fetch held in memory: the bytes, the copy's file name (not yet made safe), the source (a URL
    such as ``file:///...``, ``https://...``, ``s3://bucket/key``)."""

    data: bytes
    name: str
    source: str


@dataclass(frozen=True)
class EnvVar:
    """Marks a connector settings field (``Annotated[..., EnvVar(...)]``) with the environment
    variable each backend reads it from: ``local`` (the CLI, the API, the MCP server) and ``aws`` (the
    template's functions and the coder task); ``None`` where that backend has no such setting.
    ``separator`` splits a list; ``local_default`` is the local value when the variable is unset;
    ``aws_check`` a further rule for the stack's value (raises ``ValueError``), where the template
    builds something from it (an IAM resource); ``local_check`` one for a value set locally (it
    returns the items as meant: a root exists, ``~`` expanded), not for ``local_default``."""

    local: str | None
    aws: str | None
    separator: str = ","
    local_default: Any = None
    aws_check: Callable[[Any], Any] | None = None
    local_check: Callable[[Any], Any] | None = None

    def name(self, backend: str) -> str | None:
        """The variable's name on ``backend`` (``"local"`` or ``"aws"``)."""
        return self.local if backend == "local" else self.aws


class Connector(Protocol):
    """The shape of a connector module (``alphaagent.connectors.http`` is one).

    - ``NAME``: what specs and ``connector_fetch`` call it (``[a-z][a-z0-9_-]{0,31}``).
    - ``Request``: its request model, a ``ConnectorRequest`` subclass.
    - ``Settings``: its settings model; field names are unique across connectors (they are the keyword
      arguments of ``ConnectorSettings``), each marked with its ``EnvVar``.
    - ``describe(settings)``: one sentence for the coder's tool text (what it reads, what is allowed).
    - ``fetch(request, settings, limits)``: the ``Fetched`` copy; raises ``ToolError`` naming the
      request field (``request.url: ...``) for anything not allowed. Nothing is written.
    - ``check(request, settings, limits)`` (optional): refuse, as ``fetch`` would, what can be told
      without fetching (a missing file, a host not allowed); a turn checks its inputs this way before
      it waits for a busy scope.
    """

    NAME: str
    Request: type[ConnectorRequest]
    Settings: type[BaseModel]

    def describe(self, settings: Any) -> str: ...

    def fetch(self, request: Any, settings: Any, limits: FetchLimits) -> Fetched: ...
