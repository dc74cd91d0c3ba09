"""The settings of the local process kind: the CLI, the Python API (``AlphaAgent``), the MCP server and
the viewer (STYLE §7). Every field is the environment variable of the same name; all have defaults.

``local_settings()`` reads ``os.environ`` once per distinct environment and caches the result: a
command-line process reads it once, and a test or an embedding program that changes a variable gets
the new value without clearing a cache by hand (the cache is keyed by the environment's content).

Example::

    settings = local_settings()
    turns = settings.turn_settings()
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from alphaagent.connectors import ConnectorSettings
from alphaagent.settings import read_env

if TYPE_CHECKING:
    from alphaagent.domain.backend import TurnSettings


class LocalSettings(BaseModel):
    """The environment of a local process (seconds throughout)."""

    # allow_inf_nan: every number here is a finite duration (`inf` passed `gt=0` and failed later,
    # in the first turn, as a raw OverflowError: a new-user review).
    model_config = ConfigDict(frozen=True, extra="ignore", arbitrary_types_allowed=True, allow_inf_nan=False)

    CONNECTORS_BACKEND: ClassVar[str] = "local"

    ALPHAAGENT_HOME: str = Field(
        "",
        description="The data directory (default: $XDG_DATA_HOME/alphaagent, else"
        " ~/.local/share/alphaagent); the CLI's --home wins over it.",
    )
    XDG_DATA_HOME: str = Field(
        "", description="The XDG base of the default data directory (ignored unless absolute)."
    )
    ALPHAAGENT_USER: str = Field(
        "", description="The user id when --user is not given (default: local); DESIGN §4.1 rules."
    )
    ALPHAAGENT_DEBUG: str = Field(
        "", description="Any non-empty value: an unforeseen error shows its traceback instead of one line."
    )
    ALPHAAGENT_MCP_TOKEN: str = Field(
        "", description="The bearer token of `alphaagent mcp --http` (default: a random one, printed)."
    )
    ALPHAAGENT_LOCK_LEASE_S: float = Field(
        60.0, gt=0, le=86_400, description="The scope lease of a turn (default 60 s, at most a day)."
    )
    ALPHAAGENT_LOCK_WAIT_S: float = Field(
        600.0,
        ge=0,
        le=86_400,
        description="How long a turn waits for a busy scope (default 600 s, at most a day).",
    )
    ALPHAAGENT_SESSION_IDLE_S: int = Field(
        15 * 60, gt=0, description="A session's idle timeout (default 900 s, DESIGN §4.7)."
    )
    ALPHAAGENT_SESSION_MAX_S: int = Field(
        8 * 60 * 60, gt=0, description="A session's maximum lifetime (default 28,800 s, DESIGN §4.7)."
    )
    ALPHAAGENT_ZYGOTE_IDLE_S: float = Field(
        600.0,  # alphaagent.local.executor.DEFAULT_IDLE_S (not imported: it brings the sandbox)
        gt=0,
        allow_inf_nan=False,
        description="Seconds an environment's zygote stays warm without a run (default 600 s).",
    )
    connector_settings: ConnectorSettings = Field(default_factory=ConnectorSettings, exclude=True)
    """Every registered connector's local variables (``ConnectorSettings.from_env(env, "local")``)."""

    @model_validator(mode="before")
    @classmethod
    def _connectors(cls, values: object) -> object:
        if isinstance(values, Mapping) and "connector_settings" not in values:
            env = {str(k): str(v) for k, v in values.items() if isinstance(v, str)}
            # An empty variable counts as unset (its default), as for ALPHAAGENT_HOME.
            values = {
                k: v
                for k, v in values.items()
                if not (k in cls.model_fields and env.get(k, "x").strip() == "")
            }
            return {**values, "connector_settings": ConnectorSettings.from_env(env, "local")}
        return values

    def home(self) -> Path | None:
        """``ALPHAAGENT_HOME`` as a path, ``None`` when unset (``alphaagent_home`` decides then)."""
        return Path(self.ALPHAAGENT_HOME).expanduser().absolute() if self.ALPHAAGENT_HOME else None

    def turn_settings(self) -> TurnSettings:
        """The turn timings these variables give."""
        # Imported here: the domain is most of the backend, and `alphaagent --help` reads these
        # settings without running a turn.
        from alphaagent.domain.backend import TurnSettings

        return TurnSettings(
            lock_lease_s=self.ALPHAAGENT_LOCK_LEASE_S,
            lock_wait_s=self.ALPHAAGENT_LOCK_WAIT_S,
            session_idle_timeout_s=self.ALPHAAGENT_SESSION_IDLE_S,
            session_max_lifetime_s=self.ALPHAAGENT_SESSION_MAX_S,
        )


@functools.lru_cache(maxsize=4)
def _parse(environment: frozenset[tuple[str, str]]) -> LocalSettings:
    return read_env(LocalSettings, dict(environment))


def local_settings() -> LocalSettings:
    """The local process's settings (cached per distinct environment).

    Raises:
        InvalidSettingError: a value breaks its rule; one line naming the variable
            (``ALPHAAGENT_LOCK_LEASE_S: Input should be greater than 0``).
    """
    return _parse(frozenset(os.environ.items()))


def alphaagent_home(explicit: str | Path | None = None) -> Path:
    """The data directory (DESIGN §1), as an absolute path: ``explicit`` (the CLI's ``--home``),
    else ``$ALPHAAGENT_HOME``, else ``${XDG_DATA_HOME:-~/.local/share}/alphaagent``, the one
    per-user place of the XDG Base Directory specification, so that every command finds the same
    data wherever it is run from. An empty variable counts as unset, and a relative
    ``XDG_DATA_HOME`` is ignored (the specification says such a value is invalid). Nothing is
    created here. (Here, not in ``alphaagent.api``: the CLI's help says where it is without
    importing the backend; ``alphaagent.api.alphaagent_home`` is this function.)"""
    if explicit is not None and str(explicit) != "":
        return Path(explicit).expanduser().absolute()
    settings = local_settings()
    configured = settings.home()
    if configured is not None:
        return configured
    xdg = settings.XDG_DATA_HOME
    data_home = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "share"
    return data_home / "alphaagent"
