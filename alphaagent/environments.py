"""Execution environments (DESIGN §4.9): a set of preinstalled libraries that code runs in.

An ``Environment`` says how it starts (locally a Python >= 3.11 interpreter, on AWS the function
``alphaagent-env-{environment_id}`` from an image), which modules its zygote preloads, and the
ceilings a spec may lower but never raise. ``builtin`` always exists. Each backend keeps a registry
(``EnvironmentRegistry``): locally a table in the data directory, on AWS items in the state table.
A spec naming an environment the registry does not hold, or holds as removed, is refused before
anything is written (``check_environment``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Annotated, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from alphaagent.errors import InvalidSpecError
from alphaagent.models.common import EnvironmentId
from alphaagent.models.run import MAX_MEMORY_MB, MAX_TIMEOUT_S, MIN_MEMORY_MB, RunLimits
from alphaagent.sandbox.config import BUILTIN_PRELOAD
from alphaagent.suggest import did_you_mean_name
from alphaagent.wording import shown_json

BUILTIN_ID = "builtin"

BUILTIN_PACKAGES: tuple[str, ...] = (
    "numpy==2.4.6",
    "pandas==3.1.1",
    "pyarrow==26.0.1",
    "matplotlib==3.11.2",
    "scipy==1.17.1",
    "openpyxl==3.1.5",
    "cloudpickle==3.1.3",
)
"""The builtin environment's packages: env_images/builtin/packages.txt, which the env image installs,
with the same pins as the local ``env`` extra (tests/unit/test_static_aws.py checks the three agree)."""

FUNCTION_PREFIX = "alphaagent-env-"
"""The env function of environment ``X`` is ``alphaagent-env-X`` (DESIGN §4.9)."""

DEFAULT_STATE_MB = 512
"""Cap of a session's saved live state, per environment (DESIGN §4.7)."""

MAX_PRELOAD = 64
"""Most modules a zygote preloads: each costs start-up time and memory in every fork."""

MAX_PACKAGES = 300
"""Most distributions recorded in ``Environment.packages`` (the coder's prompt lists them)."""

MAX_PACKAGE_CHARS = 200
"""Longest ``name==version`` kept (PyPI names are short; a longer entry is not a package name)."""

_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def function_name(environment_id: str) -> str:
    """The AWS Lambda function that runs the environment's code."""
    return f"{FUNCTION_PREFIX}{environment_id}"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EnvironmentLimits(_Strict):
    """The ceilings of every run in the environment; a spec may ask for less, never for more.

    ``timeout_s`` and ``memory_mb`` are bounded by Lambda's quotas (900 s, 10,240 MiB: the same
    bounds as ``RunLimits``); ``state_mb`` caps a session's saved live state (DESIGN §4.7).
    """

    timeout_s: float = Field(MAX_TIMEOUT_S, gt=0, le=MAX_TIMEOUT_S)
    memory_mb: int = Field(2048, ge=MIN_MEMORY_MB, le=MAX_MEMORY_MB)
    network: bool = False
    state_mb: int = Field(DEFAULT_STATE_MB, ge=1, le=MAX_MEMORY_MB)

    def bound(self, limits: RunLimits) -> RunLimits:
        """``limits`` lowered to these ceilings (never raised)."""
        return limits.model_copy(
            update={
                "timeout_s": min(limits.timeout_s, self.timeout_s),
                "memory_mb": min(limits.memory_mb, self.memory_mb),
            }
        )


class LocalStart(_Strict):
    """A local environment: its zygote runs under ``python`` (an absolute path)."""

    kind: Literal["local"] = "local"
    python: str


class LambdaStart(_Strict):
    """An AWS environment: the function that runs its code, and the image it was deployed from
    (``None`` for ``builtin``, built inside the main stack)."""

    kind: Literal["lambda"] = "lambda"
    function_name: str
    image_uri: str | None = None


class Environment(_Strict):
    """One registered execution environment.

    ``packages`` names its main preinstalled distributions (``"pandas==2.2.3"``...), which the
    coder's prompt lists so the model does not try what is not there. ``status`` is ``removed``
    once it was removed (at ``removed_at``): its specs are refused, its record kept for the turns
    that used it. ``preload`` holds dotted module names (at most ``MAX_PRELOAD``); ``packages`` is cut
    to its first ``MAX_PACKAGES`` entries of ``MAX_PACKAGE_CHARS`` characters.
    """

    environment_id: EnvironmentId
    description: str = Field("", max_length=1000)
    start: Annotated[LocalStart | LambdaStart, Field(discriminator="kind")]
    preload: tuple[str, ...] = Field((), max_length=MAX_PRELOAD)
    packages: tuple[str, ...] = ()
    limits: EnvironmentLimits = EnvironmentLimits()
    status: Literal["ready", "removed"] = "ready"
    registered_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    removed_at: datetime | None = None

    @field_validator("packages")
    @classmethod
    def _bounded(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # A descriptive list for the prompt: an image with more is cut, not refused.
        return tuple(name[:MAX_PACKAGE_CHARS] for name in value[:MAX_PACKAGES])

    @field_validator("preload")
    @classmethod
    def _module_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not _MODULE_NAME.match(name):
                raise ValueError(f"{name!r} is not a module name (dotted Python identifiers)")
        return value


class EnvironmentRegistry(Protocol):
    """Where a backend keeps its environments. ``get`` and ``list`` answer ``builtin`` always."""

    def get(self, environment_id: str) -> Environment | None:
        """The environment (ready or removed), or None if it was never registered."""

    def list(self) -> list[Environment]:
        """The ready environments, ``builtin`` first, then by id."""


class StaticRegistry:
    """A registry of fixed environments (tests, and a backend with only ``builtin``)."""

    def __init__(self, environments: Iterable[Environment]) -> None:
        self._by_id = {e.environment_id: e for e in environments}

    def get(self, environment_id: str) -> Environment | None:
        return self._by_id.get(environment_id)

    def list(self) -> list[Environment]:
        ready = [e for e in self._by_id.values() if e.status == "ready"]
        return sorted(ready, key=lambda e: (e.environment_id != BUILTIN_ID, e.environment_id))


def builtin_local(python: str = sys.executable) -> Environment:
    """``builtin`` on the local backend: this interpreter, with the builtin preload."""
    return Environment(
        environment_id=BUILTIN_ID,
        description="Python with the scientific stack (numpy, pandas, pyarrow, matplotlib, scipy)",
        start=LocalStart(python=python),
        preload=BUILTIN_PRELOAD,
        packages=BUILTIN_PACKAGES,
        registered_at=datetime(2026, 1, 1, tzinfo=UTC),
    )


def builtin_lambda() -> Environment:
    """``builtin`` on AWS: the env function of the main stack."""
    return Environment(
        environment_id=BUILTIN_ID,
        description="Python with the scientific stack (numpy, pandas, pyarrow, matplotlib, scipy)",
        start=LambdaStart(function_name=function_name(BUILTIN_ID)),
        preload=BUILTIN_PRELOAD,
        packages=BUILTIN_PACKAGES,
        registered_at=datetime(2026, 1, 1, tzinfo=UTC),
    )


def check_environment(
    registry: EnvironmentRegistry, environment_id: str, shown: Callable[[str], str] = shown_json
) -> Environment:
    """The ready environment a spec names; ``InvalidSpecError`` (exit 2) naming the available
    ones when it is unknown or removed, the id shown by ``shown``: as JSON (a spec's field), or as
    typed text (``shown_typed``, a command-line option's value; ``alphaagent.wording``'s rule)."""
    found = registry.get(environment_id)
    if found is not None and found.status == "ready":
        return found
    ids = [e.environment_id for e in registry.list()]
    state = "removed" if found is not None else "unknown"
    # Environments are the platform's, not a user's: every id may be suggested (as `env show`).
    guess = did_you_mean_name(environment_id, ids) if found is None else ""
    raise InvalidSpecError(
        f"environment_id: {state} environment {shown(environment_id)}{guess} (available: {', '.join(ids)})"
    )
