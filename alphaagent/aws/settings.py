"""Configuration of the zip Lambda functions (STYLE §7): one model, read once through a cached getter.

Values are set only in ``template.yaml``; nothing is read at import time, so tests set the
environment and call ``get_lambda_settings.cache_clear()``.

Example::

    settings = get_lambda_settings()
    store = DynamoStore(settings.required("STATE_TABLE_NAME"))
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

from alphaagent.connectors import ConnectorSettings
from alphaagent.errors import MissingSettingError

DEFAULT_LOCK_LEASE_S = 2 * 60 * 60
"""The scope lease of a turn on AWS, in seconds (2 hours). The state machine does not renew it, so it
must outlast a turn; a failed or aborted execution's lease is released by the orphan rule, and a
crashed one expires after this long at the latest."""


class LambdaSettings(BaseModel):
    """The environment of the zip functions (the starter, the turn steps, the recorder) and of the
    coder's AWS backend.

    Every name carries its resource type. Each function gets only the variables it needs (least
    privilege in ``template.yaml``), so every field may be empty here; ``required`` names the one that
    is missing when a function uses it. ``TURN_STATE_MACHINE_ARN`` (the template's name, so the one
    ``sam local invoke --env-vars`` passes) is also read as ``STATE_MACHINE_ARN``, its older name.

    The connector allowlists (``connectors()``) are the template's ``ConnectorHttpHosts`` and
    ``ConnectorS3Prefixes``, comma-separated: ``CONNECTOR_HTTP_HOSTS`` (host names, exact match) and
    ``CONNECTOR_S3_PREFIXES`` (``bucket/prefix`` entries; ``bucket/`` for a whole bucket). The ``file``
    connector has no roots on AWS: a function or a Fargate task has no user files to read.
    """

    model_config = ConfigDict(frozen=True, extra="ignore", arbitrary_types_allowed=True)

    STATE_TABLE_NAME: str = ""
    WORKSPACES_BUCKET_NAME: str = ""
    EVENT_BUS_NAME: str = ""
    CODER_QUEUE_URL: str = ""
    IDEMPOTENCY_TABLE_NAME: str = ""
    TURN_STATE_MACHINE_ARN: str = Field(
        "", validation_alias=AliasChoices("TURN_STATE_MACHINE_ARN", "STATE_MACHINE_ARN")
    )
    LOCK_LEASE_S: float = Field(DEFAULT_LOCK_LEASE_S, gt=0)
    EVENT_BUS_MAX_ENTRY_BYTES: int = Field(256 * 1024, ge=1024, le=1024 * 1024)
    """``BusLimits.max_entry_bytes``: EventBridge's 256 KiB entry limit by default; up to 1 MiB where
    the account and Region accept larger events (see ``alphaagent.aws.bus``)."""
    RUN_NOTICES: bool = False
    """The coder learns of run results from its own SQS notice queue (``alphaagent.aws.notices``)
    instead of polling; template.yaml turns it on unless the env functions run in a VPC (which has no
    route to SQS without an interface endpoint)."""
    connector_settings: ConnectorSettings = Field(default_factory=ConnectorSettings, exclude=True)
    """Every registered connector's stack variables (``ConnectorSettings.from_env(env, "aws")``)."""

    @model_validator(mode="before")
    @classmethod
    def _connectors(cls, values: object) -> object:
        if isinstance(values, Mapping) and "connector_settings" not in values:
            env = {str(k): str(v) for k, v in values.items() if isinstance(v, str)}
            return {**values, "connector_settings": ConnectorSettings.from_env(env, "aws")}
        return values

    def connectors(self) -> ConnectorSettings:
        """The connector allowlists of this process (nothing is allowed unless listed)."""
        return self.connector_settings

    def required(self, name: str) -> str:
        """The value of setting ``name``.

        Raises:
            MissingSettingError: it is empty (the message names the variable).
        """
        value = getattr(self, name)
        if not isinstance(value, str) or not value:
            raise MissingSettingError(f"{name}: not set in this function's environment")
        return value


@functools.cache
def get_lambda_settings() -> LambdaSettings:
    """The settings from the process environment, read on first call and cached.

    Raises:
        pydantic.ValidationError: ``LOCK_LEASE_S`` is not a positive number, or a connector allowlist
            entry is malformed (the message names the variable and the entry).
    """
    return LambdaSettings.model_validate(dict(os.environ))
