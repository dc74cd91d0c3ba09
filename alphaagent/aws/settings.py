"""Configuration of the AWS processes (STYLE §7): one model per process kind, read once through a
cached getter.

- each zip function: its model below (``FUNCTION_SETTINGS``, by the template's logical id), read by
  ``get_lambda_settings(model)``; ``LambdaSettings`` is every zip function's variable at once (what
  ``get_backend()`` reads when a caller names no function);
- the env function: ``EnvSettings`` (``get_env_settings()``);
- the coder worker's backend: ``CoderBackendSettings`` (with ``coder.worker.WorkerSettings`` and
  ``coder.settings.CoderSettings``).

Values are set only in ``template.yaml``; nothing is read at import time, so tests set the
environment and call ``get_lambda_settings.cache_clear()``. A bad value is one line naming the
variable (``InvalidSettingError``, also a ``ValueError``).

Example::

    settings = get_lambda_settings(AcquireLockSettings)
    store = DynamoStore(settings.required("STATE_TABLE_NAME"))
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from typing import Annotated, ClassVar, Final, TypeVar

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, model_validator

from alphaagent.connectors import ConnectorSettings
from alphaagent.environments import DEFAULT_STATE_MB
from alphaagent.errors import InvalidSettingError, MissingSettingError
from alphaagent.settings import ORIGIN_DEFAULT, describe_error

DEFAULT_LOCK_LEASE_S = 2 * 60 * 60
"""The scope lease of a turn on AWS, in seconds (2 hours). The state machine does not renew it, so it
must outlast a turn; a failed or aborted execution's lease is released by the orphan rule, and a
crashed one expires after this long at the latest."""

S = TypeVar("S", bound="FunctionSettings")

StateTable = Annotated[str, Field(description="The state table (records, leases, sessions): StateTable.")]
WorkspacesBucket = Annotated[str, Field(description="The workspaces bucket (scope files, claim checks).")]
EventBus = Annotated[str, Field(description="The event bus every event is published to: EventBus.")]


class FunctionSettings(BaseModel):
    """What every AWS function reads: Powertools' variables (the template's ``Globals``; Powertools
    reads them itself); the zip functions add their tunables (``TurnFunctionSettings``).

    ``required`` names a variable that is empty when the function uses it; the connector settings
    come from the connectors' stack variables for a model whose ``CONNECTORS_BACKEND`` is ``"aws"``."""

    model_config = ConfigDict(frozen=True, extra="ignore", arbitrary_types_allowed=True)

    CONNECTORS_BACKEND: ClassVar[str | None] = None

    POWERTOOLS_SERVICE_NAME: str = Field(
        "alphaagent", description="Powertools: the service name of logs and traces."
    )
    POWERTOOLS_METRICS_NAMESPACE: str = Field("alphaagent", description="Powertools: the metrics namespace.")
    POWERTOOLS_LOG_LEVEL: str = Field("INFO", description="Powertools: the log level.")
    connector_settings: ConnectorSettings = Field(default_factory=ConnectorSettings, exclude=True)
    """Every registered connector's stack variables (``ConnectorSettings.from_env(env, "aws")``)."""

    @model_validator(mode="before")
    @classmethod
    def _connectors(cls, values: object) -> object:
        if cls.CONNECTORS_BACKEND and isinstance(values, Mapping) and "connector_settings" not in values:
            env = {str(k): str(v) for k, v in values.items() if isinstance(v, str)}
            return {**values, "connector_settings": ConnectorSettings.from_env(env, cls.CONNECTORS_BACKEND)}
        return values

    def connectors(self) -> ConnectorSettings:
        """The connector allowlists of this process (nothing is allowed unless listed)."""
        return self.connector_settings

    def value(self, name: str) -> str:
        """The value of variable ``name``, ``""`` when this function's model has no such field."""
        value = getattr(self, name, "")
        return value if isinstance(value, str) else ""

    def required(self, name: str) -> str:
        """The value of setting ``name``.

        Raises:
            MissingSettingError: it is empty (the message names the variable).
        """
        value = self.value(name)
        if not value:
            raise MissingSettingError(f"{name}: not set in this function's environment")
        return value


class TurnFunctionSettings(FunctionSettings):
    """The tunables of the functions that build the turn backend (``get_backend``)."""

    LOCK_LEASE_S: float = Field(
        DEFAULT_LOCK_LEASE_S,
        gt=0,
        description="The scope lease a turn takes, in seconds (default 7,200: it must outlast a turn).",
        json_schema_extra=ORIGIN_DEFAULT,
    )
    EVENT_BUS_MAX_ENTRY_BYTES: int = Field(
        256 * 1024,
        ge=1024,
        le=1024 * 1024,
        description="BusLimits.max_entry_bytes: EventBridge's 256 KiB entry limit by default; up to 1 MiB"
        " where the account and Region accept larger events (alphaagent.aws.bus).",
        json_schema_extra=ORIGIN_DEFAULT,
    )


class LambdaSettings(TurnFunctionSettings):
    """Every zip function's variables at once (the starter, the turn steps, the recorder): what
    ``get_backend()`` reads when no function's model is named.

    Every name carries its resource type. Each function gets only the variables it needs (least
    privilege in ``template.yaml``; its own model below says which), so every field may be empty here;
    ``required`` names the one that is missing when a function uses it. ``TURN_STATE_MACHINE_ARN``
    (the template's name, so the one ``sam local invoke --env-vars`` passes) is also read as
    ``STATE_MACHINE_ARN``, its older name.

    The connector allowlists (``connectors()``) are the template's ``ConnectorHttpHosts`` and
    ``ConnectorS3Prefixes``, comma-separated: ``CONNECTOR_HTTP_HOSTS`` (host names, exact match) and
    ``CONNECTOR_S3_PREFIXES`` (``bucket/prefix`` entries; ``bucket/`` for a whole bucket). The ``file``
    connector has no roots on AWS: a function or a Fargate task has no user files to read.
    """

    CONNECTORS_BACKEND: ClassVar[str | None] = "aws"

    STATE_TABLE_NAME: StateTable = ""
    WORKSPACES_BUCKET_NAME: WorkspacesBucket = ""
    EVENT_BUS_NAME: EventBus = ""
    CODER_QUEUE_URL: str = Field("", description="The CoderQueue the turn machine sends coder tasks to.")
    IDEMPOTENCY_TABLE_NAME: str = Field("", description="The idempotency table.")
    RUN_NOTICES: bool = Field(
        False,
        description="The coder learns of run results from its own SQS notice queue (alphaagent.aws.notices)"
        " instead of polling; template.yaml turns it on unless the env functions run in a VPC.",
    )
    TURN_STATE_MACHINE_ARN: str = Field(
        "",
        validation_alias=AliasChoices("TURN_STATE_MACHINE_ARN", "STATE_MACHINE_ARN"),
        description="The turn state machine (TurnStateMachine); also read as STATE_MACHINE_ARN.",
    )


class StartTurnSettings(TurnFunctionSettings):
    """``StartTurnFunction``: starts an execution of the turn machine per spec message."""

    TURN_STATE_MACHINE_ARN: str = Field(
        min_length=1,
        validation_alias=AliasChoices("TURN_STATE_MACHINE_ARN", "STATE_MACHINE_ARN"),
        description="The turn state machine (TurnStateMachine); also read as STATE_MACHINE_ARN.",
    )
    EVENT_BUS_NAME: EventBus = ""


class AcquireLockSettings(TurnFunctionSettings):
    """``AcquireLockFunction``: takes the scope's lease."""

    STATE_TABLE_NAME: StateTable = Field(min_length=1)


class PrepareTurnSettings(TurnFunctionSettings):
    """``PrepareTurnFunction``: checks the spec and fetches its declared inputs (the connectors)."""

    CONNECTORS_BACKEND: ClassVar[str | None] = "aws"

    STATE_TABLE_NAME: StateTable = Field(min_length=1)
    WORKSPACES_BUCKET_NAME: WorkspacesBucket = ""
    EVENT_BUS_NAME: EventBus = ""


class FinalizeTurnSettings(TurnFunctionSettings):
    """``FinalizeTurnFunction``: records the turn's result and emits its ending event."""

    STATE_TABLE_NAME: StateTable = Field(min_length=1)
    WORKSPACES_BUCKET_NAME: WorkspacesBucket = ""
    EVENT_BUS_NAME: EventBus = ""


class ReleaseLockSettings(TurnFunctionSettings):
    """``ReleaseLockFunction``: releases the scope's lease."""

    STATE_TABLE_NAME: StateTable = Field(min_length=1)


class RecordEventSettings(TurnFunctionSettings):
    """``RecordEventFunction``: records the bus's events (and the env functions' destinations)."""

    STATE_TABLE_NAME: StateTable = Field(min_length=1)
    WORKSPACES_BUCKET_NAME: WorkspacesBucket = ""
    EVENT_BUS_NAME: EventBus = ""


class ReleaseOrphanLockSettings(TurnFunctionSettings):
    """``ReleaseOrphanLockFunction``: releases the lease of a failed or aborted execution."""

    STATE_TABLE_NAME: StateTable = Field(min_length=1)
    WORKSPACES_BUCKET_NAME: WorkspacesBucket = ""
    EVENT_BUS_NAME: EventBus = ""


class SweepNoticeQueuesSettings(FunctionSettings):
    """``SweepNoticeQueuesFunction``: deletes expired notice queues (``alphaagent.aws.queue_sweeper``);
    it needs no variable of its own (the queues are found by name prefix in its account)."""


FUNCTION_SETTINGS: Final[dict[str, type[FunctionSettings]]] = {
    "StartTurnFunction": StartTurnSettings,
    "AcquireLockFunction": AcquireLockSettings,
    "PrepareTurnFunction": PrepareTurnSettings,
    "FinalizeTurnFunction": FinalizeTurnSettings,
    "ReleaseLockFunction": ReleaseLockSettings,
    "RecordEventFunction": RecordEventSettings,
    "ReleaseOrphanLockFunction": ReleaseOrphanLockSettings,
    "SweepNoticeQueuesFunction": SweepNoticeQueuesSettings,
}
"""Each zip function's settings model, by its logical id in ``template.yaml``."""


class CoderBackendSettings(TurnFunctionSettings):
    """The coder worker's backend (``coder_backend``): the turn backend, with runs invoked in the env
    functions and the stack's connector allowlists."""

    CONNECTORS_BACKEND: ClassVar[str | None] = "aws"

    STATE_TABLE_NAME: StateTable = Field(min_length=1)
    WORKSPACES_BUCKET_NAME: WorkspacesBucket = Field(min_length=1)
    EVENT_BUS_NAME: EventBus = Field(min_length=1)
    RUN_NOTICES: bool = Field(
        False,
        description="The coder learns of run results from its own SQS notice queue (alphaagent.aws.notices)"
        " instead of polling; template.yaml turns it on unless the env functions run in a VPC.",
    )


class EnvSettings(FunctionSettings):
    """The environment of an env function (``EnvBuiltinFunction``); values are set in ``template.yaml``.

    ``AWS_LAMBDA_RUNTIME_API`` (``host:port``, set by Lambda) is read where the sandbox is configured
    (``env_function.runtime_api_port``): runs are denied connections to it."""

    VARIABLES: ClassVar[dict[str, str]] = {
        "AWS_LAMBDA_RUNTIME_API": "Set by Lambda: host:port of the Runtime API (runs may not connect to it).",
    }

    WORKSPACES_BUCKET_NAME: str = Field(min_length=1, description="The workspaces bucket (required).")
    STATE_TABLE_NAME: str = Field(
        min_length=1, description="The state table, where the scopes' leases are (required)."
    )
    ENV_SYNC_MAX_BYTES: int | None = Field(
        None,
        gt=0,
        description=(
            "Bytes of scope files and session state synced down per run; default and most: half of"
            " /tmp's size at run time (the function's EphemeralStorage)."
        ),
        json_schema_extra=ORIGIN_DEFAULT,
    )
    ENV_STATE_MAX_MB: int = Field(
        DEFAULT_STATE_MB,
        gt=0,
        description="Cap of a session's saved live state in MiB (default 512, DESIGN §4.7).",
        json_schema_extra=ORIGIN_DEFAULT,
    )
    ENV_RUN_NOTICES: bool = Field(
        True,
        description="Whether the function can reach SQS to send run notices (alphaagent.aws.notices):"
        " template.yaml sets false in a VPC without an SQS endpoint, and the notice is then skipped"
        " instead of timing out (the coder's fallback look finds the result).",
    )


def _read(model: type[S]) -> S:
    """``model`` from the process environment. A bad or missing variable is logged as one ERROR
    line (the variable, the rule, the value) before the error is raised: the first invocation of
    the function fails, and its log says why in that line, whatever the runtime adds after it."""
    try:
        return model.model_validate(dict(os.environ))
    except ValidationError as exc:
        first = exc.errors()[0]
        error: InvalidSettingError | MissingSettingError
        if first["type"] in ("missing", "string_too_short") and first["loc"]:
            variable = str(first["loc"][0])
            error = MissingSettingError(f"{variable}: not set in this function's environment")
        else:
            error = InvalidSettingError(describe_error(model, exc))
        logging.getLogger("alphaagent.settings").error("%s: %s", type(error).__name__, error)
        raise error from None


@functools.cache
def get_lambda_settings(model: type[S] = LambdaSettings) -> S:  # type: ignore[assignment]
    """The settings ``model`` (a zip function's, by default every zip variable at once) from the process
    environment, read on first call and cached.

    Raises:
        MissingSettingError: a variable ``model`` requires is unset or empty (the message names it).
        InvalidSettingError: ``LOCK_LEASE_S`` is not a positive number, or a connector allowlist
            entry is malformed (one line naming the variable and the rule).
    """
    return _read(model)


@functools.cache
def get_env_settings() -> EnvSettings:
    """The env function's settings from the process environment, read on first call and cached.

    Raises:
        MissingSettingError: ``WORKSPACES_BUCKET_NAME`` or ``STATE_TABLE_NAME`` is unset.
        InvalidSettingError: ``ENV_SYNC_MAX_BYTES`` is not a positive integer (the message names it).
    """
    return _read(EnvSettings)
