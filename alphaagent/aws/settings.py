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
import re
from typing import Final

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator

from alphaagent.domain.backend import ConnectorSettings
from alphaagent.errors import MissingSettingError

DEFAULT_LOCK_LEASE_S = 2 * 60 * 60
"""The scope lease of a turn on AWS, in seconds (2 hours). The state machine does not renew it, so it
must outlast a turn; a failed or aborted execution's lease is released by the orphan rule, and a
crashed one expires after this long at the latest."""


_LABEL: Final = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_HOST: Final = re.compile(rf"(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*")
"""A DNS host name, lower case (RFC 1123 labels); the http connector compares host names exactly."""

_S3_PREFIX: Final = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/[^\x00-\x1f\x7f*?]{0,1024}")
"""``bucket/prefix``: an S3 bucket name (3-63 characters, S3's naming rules), a slash, a key prefix
(possibly empty) without control characters or IAM wildcards (the template turns each entry into the
IAM resource ``arn:aws:s3:::{entry}*``, so ``*`` or ``?`` would widen the grant)."""


def _comma_list(value: object) -> object:
    """A comma-separated environment variable as a tuple of its non-empty, stripped items."""
    if isinstance(value, str):
        return tuple(item.strip() for item in value.split(",") if item.strip())
    return value


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

    model_config = ConfigDict(frozen=True, extra="ignore")

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
    CONNECTOR_HTTP_HOSTS: tuple[str, ...] = ()
    CONNECTOR_S3_PREFIXES: tuple[str, ...] = ()
    RUN_NOTICES: bool = False
    """The coder learns of run results from its own SQS notice queue (``alphaagent.aws.notices``)
    instead of polling; template.yaml turns it on unless the env functions run in a VPC (which has no
    route to SQS without an interface endpoint)."""

    @field_validator("CONNECTOR_HTTP_HOSTS", "CONNECTOR_S3_PREFIXES", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        return _comma_list(value)

    @field_validator("CONNECTOR_HTTP_HOSTS")
    @classmethod
    def _hosts(cls, hosts: tuple[str, ...]) -> tuple[str, ...]:
        for host in hosts:
            if not _HOST.fullmatch(host):
                raise ValueError(f"{host!r} is not a lower-case DNS host name (no scheme, port or path)")
        return hosts

    @field_validator("CONNECTOR_S3_PREFIXES")
    @classmethod
    def _prefixes(cls, prefixes: tuple[str, ...]) -> tuple[str, ...]:
        for entry in prefixes:
            if not _S3_PREFIX.fullmatch(entry):
                raise ValueError(
                    f"{entry!r} is not bucket/prefix (a bucket name, a slash, a key prefix without"
                    " * or ?; bucket/ for the whole bucket)"
                )
        return prefixes

    def connectors(self) -> ConnectorSettings:
        """The connector allowlists of this process (nothing is allowed unless listed)."""
        return ConnectorSettings(http_hosts=self.CONNECTOR_HTTP_HOSTS, s3_prefixes=self.CONNECTOR_S3_PREFIXES)

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
