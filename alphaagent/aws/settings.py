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
from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from alphaagent.errors import AlphaAgentError

DEFAULT_LOCK_LEASE_S = 2 * 60 * 60
"""The scope lease of a turn on AWS, in seconds (2 hours). The state machine does not renew it, so it
must outlast a turn; a failed or aborted execution's lease is released by the orphan rule, and a
crashed one expires after this long at the latest."""


class MissingSettingError(AlphaAgentError):
    """A function needs an environment variable that its template entry does not set."""


class LambdaSettings(BaseModel):
    """The environment of the zip functions (the starter, the turn steps, the recorder) and of the
    coder's AWS backend. ``ENV_TENANT_ISOLATION`` is the template's ``EnvTenantIsolation``: when
    ``Enabled``, every env invocation carries the scope as its tenant id.

    Every name carries its resource type. Each function gets only the variables it needs (least
    privilege in ``template.yaml``), so every field may be empty here; ``required`` names the one that
    is missing when a function uses it. ``STATE_MACHINE_ARN`` is also read as ``TURN_STATE_MACHINE_ARN``.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    STATE_TABLE_NAME: str = ""
    WORKSPACES_BUCKET_NAME: str = ""
    EVENT_BUS_NAME: str = ""
    CODER_QUEUE_URL: str = ""
    IDEMPOTENCY_TABLE_NAME: str = ""
    STATE_MACHINE_ARN: str = Field(
        "", validation_alias=AliasChoices("STATE_MACHINE_ARN", "TURN_STATE_MACHINE_ARN")
    )
    LOCK_LEASE_S: float = Field(DEFAULT_LOCK_LEASE_S, gt=0)
    ENV_TENANT_ISOLATION: Literal["Enabled", "Disabled"] = "Enabled"

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
        pydantic.ValidationError: ``LOCK_LEASE_S`` is not a positive number.
    """
    return LambdaSettings.model_validate(dict(os.environ))
