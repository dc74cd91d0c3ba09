"""Connectors: where a spec's ``connector`` inputs and the coder's ``connector_fetch`` get documents.

A connector is one module (``file``, ``http`` and ``s3`` here; see ``base.Connector`` for its shape):
``NAME``, a ``Request`` model (unknown fields refused), a ``Settings`` model whose fields carry their
environment variables (``EnvVar``), ``describe(settings)`` for the tool text and ``fetch()``. The
registry below drives everything that depends on the set of connectors: spec validation
(``check_request``), the coder's and the MCP server's tool text (``describe_all``, ``request_help``),
and the settings of both backends (``ConnectorSettings.from_env``). Adding a connector is one module
and ``register(module)`` (README, "Adding a connector").

Example::

    settings = ConnectorSettings(http_hosts=("data.example.org",))
    path, data, source = fetch(settings, "http", {"url": "https://data.example.org/rates.csv"})
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any, Final

from pydantic import BaseModel, ValidationError

from alphaagent.connectors import file as _file
from alphaagent.connectors import http as _http
from alphaagent.connectors import s3 as _s3
from alphaagent.connectors.base import (
    DEFAULT_MAX_BYTES,
    DEFAULT_TIMEOUT_S,
    Connector,
    ConnectorRequest,
    EnvVar,
    Fetched,
    FetchLimits,
)
from alphaagent.errors import ToolError
from alphaagent.models.common import unknown_field

__all__ = [
    "Connector",
    "ConnectorRequest",
    "ConnectorSettings",
    "EnvVar",
    "FetchLimits",
    "Fetched",
    "check",
    "check_request",
    "connector",
    "describe_all",
    "env_variables",
    "fetch",
    "names",
    "register",
    "request_help",
    "safe_name",
    "unregister",
]

NAME_PATTERN: Final = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
"""A connector's name, as ``ConnectorInput.connector`` accepts it."""

_REGISTRY: dict[str, Connector] = {}


def register(module: Connector) -> Connector:
    """Add a connector module to the registry (and return it). Raises ``ValueError`` for a module
    that breaks the shape of ``base.Connector``: a bad or taken name, a request model that accepts
    unknown fields, or a settings field another connector already declares."""
    name = getattr(module, "NAME", None)
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ValueError(f"connector NAME {name!r}: must match {NAME_PATTERN.pattern}")
    if name in _REGISTRY:
        raise ValueError(f"connector {name!r}: already registered")
    request = getattr(module, "Request", None)
    if not (isinstance(request, type) and issubclass(request, ConnectorRequest)):
        raise ValueError(f"connector {name!r}: Request must subclass ConnectorRequest")
    if request.model_config.get("extra") != "forbid":
        raise ValueError(f"connector {name!r}: Request must refuse unknown fields (extra='forbid')")
    settings = getattr(module, "Settings", None)
    if not (isinstance(settings, type) and issubclass(settings, BaseModel)):
        raise ValueError(f"connector {name!r}: Settings must be a pydantic model")
    for attribute in ("describe", "fetch"):
        if not callable(getattr(module, attribute, None)):
            raise ValueError(f"connector {name!r}: needs a {attribute}() function")
    taken = {field: other for other, c in _REGISTRY.items() for field in c.Settings.model_fields}
    for field in settings.model_fields:
        if field in taken or field in ("max_bytes", "timeout_s"):
            raise ValueError(
                f"connector {name!r}: settings field {field!r} is already {taken.get(field)!r}'s"
            )
    _REGISTRY[name] = module
    return module


def unregister(name: str) -> None:
    """Remove a connector from the registry (tests that register a throwaway one)."""
    _REGISTRY.pop(name, None)


for _builtin in (_file, _http, _s3):
    register(_builtin)


def names() -> tuple[str, ...]:
    """The connectors a spec input or ``connector_fetch`` may name, in registration order."""
    return tuple(_REGISTRY)


def connector(name: str, field: str = "connector") -> Connector:
    """The connector called ``name``. Raises ``ToolError`` naming ``field`` when there is none."""
    try:
        return _REGISTRY[name]
    except KeyError:
        # `name` is a JSON value (a spec's, the coder's): shown as JSON (alphaagent.wording).
        from alphaagent.wording import shown_json

        available = ", ".join(names())
        raise ToolError(f"{field}: unknown connector {shown_json(name)} (available: {available})") from None


def check_request(name: str, request: Mapping[str, Any], field: str = "request") -> ConnectorRequest:
    """``request`` parsed into connector ``name``'s request model. Raises ``ToolError`` naming the
    first bad field (``request.url: Field required``; ``request.pth: unknown field (did you mean
    'path'?)``, the suggestion only for a close field name)."""
    model = connector(name).Request
    try:
        return model.model_validate(dict(request))
    except ValidationError as exc:
        # An unknown field is named first: it is most likely the misspelling of the missing one.
        first = sorted(exc.errors(), key=lambda error: error["type"] != "extra_forbidden")[0]
        where = ".".join([field, *(str(part) for part in first["loc"])])
        message = str(first["msg"]).removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            # The same help as a spec's own misspelled field gets (models/spec.py).
            message = unknown_field(str(first["loc"][-1]), list(model.model_fields))
        elif first["loc"]:
            # A request is JSON (a spec's, the coder's): its rule and value in the spec's words.
            from alphaagent.models.rules import value_rule
            from alphaagent.wording import shown_json

            name = str(first["loc"][-1])
            message = value_rule(first, model.model_fields.get(name), shown_json, name) or message
        raise ToolError(f"{where}: {message}") from None


def safe_name(name: str) -> str:
    """A copy's file name made safe for ``docs/`` (letters, digits, ``._-``; at most 120 characters)."""
    cleaned = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in name).strip("._") or "document"
    return cleaned[:120]


def fetch(settings: ConnectorSettings, name: str, request: Mapping[str, Any]) -> tuple[str, bytes, str]:
    """Fetch through connector ``name`` into memory: ``(docs/ path it will get, bytes, source)``;
    nothing is written. Raises ``ToolError`` naming the request field for anything not allowed."""
    module = connector(name)
    parsed = check_request(name, request)
    data, copy_name, source = module.fetch(parsed, settings.of(name), settings.limits)
    return f"docs/{safe_name(str(copy_name))}", data, source


def check(settings: ConnectorSettings, name: str, request: Mapping[str, Any]) -> None:
    """Refuse ``request`` now for what connector ``name`` can tell without fetching or writing (its
    module's optional ``check()``: a missing file, a host or prefix not allowed). Raises ``ToolError``
    naming the request field; a request that passes may still fail when fetched."""
    module = connector(name)
    parsed = check_request(name, request)
    checker = getattr(module, "check", None)
    if callable(checker):
        checker(parsed, settings.of(name), settings.limits)


def describe_all(settings: ConnectorSettings) -> str:
    """Every connector's sentence of the tool text, in registration order."""
    return " ".join(_REGISTRY[name].describe(settings.of(name)) for name in names())


def request_help() -> str:
    """Each connector's request fields, for a tool's argument description:
    ``file: {"path", "name"?}; http: {"url", "name"?}; ...`` (``?``: optional)."""
    parts = []
    for name, module in _REGISTRY.items():
        fields = module.Request.model_fields
        listed = [f'"{f}"' + ("" if info.is_required() else "?") for f, info in fields.items()]
        # The copy's name is common to all and optional: last, as the schema reads best.
        listed.sort(key=lambda item: item.startswith('"name"'))
        parts.append(f"{name}: {{{', '.join(listed)}}}")
    return "; ".join(parts)


def _env_fields(backend: str) -> Iterator[tuple[str, str, EnvVar, Any]]:
    """``(connector, field, marker, field info)`` of every settings field ``backend`` reads."""
    for name, module in _REGISTRY.items():
        for field, info in module.Settings.model_fields.items():
            for marker in info.metadata:
                if isinstance(marker, EnvVar) and marker.name(backend):
                    yield name, field, marker, info


def env_variables(backend: str) -> dict[str, str]:
    """The connector variables ``backend`` (``"local"`` or ``"aws"``) reads, with their descriptions."""
    return {str(m.name(backend)): str(info.description or "") for _, _, m, info in _env_fields(backend)}


class ConnectorSettings:
    """The settings of every registered connector, and the limits every fetch shares.

    Keyword arguments are the connectors' settings fields, each routed to the connector that declares
    it (``file_roots``, ``forbidden_roots``: ``file``; ``http_hosts``: ``http``; ``s3_prefixes``:
    ``s3``), so ``settings.http_hosts`` reads the same way; nothing is allowed unless listed.
    ``max_bytes`` caps one fetched copy (default 25 MiB, the export ceiling); ``timeout_s`` is one
    fetch's network timeout (seconds). Raises ``TypeError`` for a field no connector declares and
    ``pydantic.ValidationError`` for a malformed value.
    """

    __slots__ = ("_by_name", "limits")
    limits: FetchLimits
    _by_name: dict[str, BaseModel]

    def __init__(
        self, *, max_bytes: int = DEFAULT_MAX_BYTES, timeout_s: float = DEFAULT_TIMEOUT_S, **fields: Any
    ) -> None:
        owners = {field: name for name, c in _REGISTRY.items() for field in c.Settings.model_fields}
        unknown = sorted(set(fields) - set(owners))
        if unknown:
            raise TypeError(f"ConnectorSettings: no connector has a setting {unknown[0]!r}")
        grouped: dict[str, dict[str, Any]] = {name: {} for name in _REGISTRY}
        for field, value in fields.items():
            grouped[owners[field]][field] = value
        by_name = {name: _REGISTRY[name].Settings.model_validate(values) for name, values in grouped.items()}
        # Immutable, as the frozen dataclass it replaces was: a backend's allow-lists never change.
        object.__setattr__(self, "limits", FetchLimits(max_bytes=max_bytes, timeout_s=timeout_s))
        object.__setattr__(self, "_by_name", by_name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"ConnectorSettings is immutable (use replace(): {name})")

    def of(self, name: str) -> Any:
        """Connector ``name``'s settings model (its defaults for one registered after these were made)."""
        if name not in self._by_name:
            return connector(name).Settings()
        return self._by_name[name]

    @property
    def max_bytes(self) -> int:
        """Size cap of one fetched copy, in bytes."""
        return self.limits.max_bytes

    @property
    def timeout_s(self) -> float:
        """Network timeout of one fetch, in seconds."""
        return self.limits.timeout_s

    def __getattr__(self, field: str) -> Any:
        # Only for the connectors' own fields (``settings.file_roots``); slots resolve before this.
        for settings in object.__getattribute__(self, "_by_name").values():
            if field in type(settings).model_fields:
                return getattr(settings, field)
        raise AttributeError(field)

    def fields(self) -> dict[str, Any]:
        """Every connector field's value, by field name."""
        return {f: getattr(s, f) for s in self._by_name.values() for f in type(s).model_fields}

    def replace(self, **changes: Any) -> ConnectorSettings:
        """A copy with ``changes`` (fields or limits) applied."""
        values = {**self.fields(), "max_bytes": self.max_bytes, "timeout_s": self.timeout_s, **changes}
        return ConnectorSettings(**values)

    @classmethod
    def from_env(cls, env: Mapping[str, str], backend: str) -> ConnectorSettings:
        """The settings the environment gives ``backend`` (``"local"`` or ``"aws"``): each field
        marked with an ``EnvVar`` for it, split on its separator; an unset or empty variable is the
        local default (locally) or nothing. Raises ``ValueError`` whose message starts with the
        variable's name and says the rule (``CONNECTOR_S3_PREFIXES: 'x' is not bucket/prefix ...``)."""
        values: dict[str, Any] = {}
        for name, field, marker, _ in _env_fields(backend):
            variable = str(marker.name(backend))
            raw = env.get(variable, "")
            if not raw.strip():
                if backend == "local" and marker.local_default is not None:
                    values[field] = marker.local_default
                continue
            items = tuple(item.strip() for item in raw.split(marker.separator) if item.strip())
            try:
                if backend == "aws" and marker.aws_check is not None:
                    items = marker.aws_check(items)
                if backend == "local" and marker.local_check is not None:
                    items = marker.local_check(items)
                _REGISTRY[name].Settings.model_validate({field: items})
            except (ValueError, ValidationError) as exc:
                raise ValueError(f"{variable}: {_first_message(exc)}") from None
            values[field] = items
        return cls(**values)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ConnectorSettings):
            return NotImplemented
        return self.limits == other.limits and all(self.of(n) == other.of(n) for n in names())

    def __hash__(self) -> int:
        return hash(self.limits)

    def __repr__(self) -> str:
        shown = ", ".join(f"{f}={v!r}" for f, v in self.fields().items())
        return f"ConnectorSettings({shown}, max_bytes={self.max_bytes}, timeout_s={self.timeout_s:g})"


def _first_message(exc: ValueError | ValidationError) -> str:
    if isinstance(exc, ValidationError):
        return str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
    return str(exc)
