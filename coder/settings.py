"""The coder's configuration: which model provider, which model, and the bounds of one turn's model use.

Read from the environment once (``coder_settings()``, cached); tests build ``CoderSettings`` directly.

Anthropic API::

    ANTHROPIC_API_KEY=sk-ant-...            required
    ANTHROPIC_BASE_URL=https://...          optional (a gateway; the tests point it at 127.0.0.1)
    ALPHAAGENT_MODEL=claude-sonnet-4-5      optional (default: the CLI's default model)

Amazon Bedrock::

    CLAUDE_CODE_USE_BEDROCK=1
    AWS_REGION=us-east-1                    required (or AWS_DEFAULT_REGION); credentials: the usual chain
    ALPHAAGENT_MODEL=us.anthropic.claude-sonnet-4-5-20250929-v1:0   optional (a Bedrock model id)

Both: ``CLAUDE_CODE_MAX_RETRIES`` (API retries per request; the CLI's default otherwise) and
``ALPHAAGENT_MAX_BUDGET_USD`` (stop a turn that has spent this much on the model).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import lru_cache
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, create_model, model_validator

from alphaagent.errors import ModelConfigError
from alphaagent.settings import describe_error

Provider = Literal["anthropic", "bedrock"]
_TRUE = ("1", "true", "yes", "on")


class CoderSettings(BaseModel):
    """Where the model runs and how the CLI may use it.

    - ``provider``: ``anthropic`` (needs ``anthropic_api_key``) or ``bedrock`` (needs ``aws_region``).
    - ``model``: a model name or Bedrock model id; ``None`` lets the CLI choose its default.
    - ``max_retries``: retries of one failing API request (HTTP 5xx, 529, 429) before the turn fails.
    - ``max_budget_usd``: the model spend after which a turn stops (``BudgetExceededError``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    ENV_NAMES: ClassVar[dict[str, str]] = {
        "provider": "CLAUDE_CODE_USE_BEDROCK",
        "model": "ALPHAAGENT_MODEL",
        "anthropic_api_key": "ANTHROPIC_API_KEY",
        "anthropic_base_url": "ANTHROPIC_BASE_URL",
        "aws_region": "AWS_REGION",
        "max_retries": "CLAUDE_CODE_MAX_RETRIES",
        "max_budget_usd": "ALPHAAGENT_MAX_BUDGET_USD",
    }
    """The variable each field is read from (``from_env``)."""
    VARIABLES: ClassVar[dict[str, str]] = {
        "AWS_DEFAULT_REGION": "The region when AWS_REGION is unset (Bedrock).",
    }

    provider: Provider = Field(
        description="1, true, yes or on: Amazon Bedrock; else the Anthropic API (with a key)."
    )
    model: str | None = Field(None, description="A model name or Bedrock model id (default: the CLI's).")
    anthropic_api_key: SecretStr | None = Field(
        None, description="The Anthropic API key (the Anthropic API)."
    )
    anthropic_base_url: str | None = Field(None, description="A gateway in front of the Anthropic API.")
    aws_region: str | None = Field(None, description="The Bedrock region (or AWS_DEFAULT_REGION).")
    max_retries: int | None = Field(
        None, ge=0, le=20, description="API retries of one failing request (0-20)."
    )
    max_budget_usd: float | None = Field(
        None, gt=0, description="The model spend (USD) after which a turn stops."
    )

    @model_validator(mode="after")
    def _provider_complete(self) -> CoderSettings:
        if self.provider == "anthropic" and not self.anthropic_api_key:
            raise ValueError("the Anthropic API needs ANTHROPIC_API_KEY")
        if self.provider == "bedrock" and not self.aws_region:
            raise ValueError("CLAUDE_CODE_USE_BEDROCK=1 needs AWS_REGION (or AWS_DEFAULT_REGION)")
        return self

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> CoderSettings | None:
        """The settings the environment describes; ``None`` when it configures no model.

        Raises ``ModelConfigError`` naming the variable when a provider is chosen but incomplete or
        a value is malformed.
        """
        bedrock = env.get("CLAUDE_CODE_USE_BEDROCK", "").strip().lower() in _TRUE
        api_key = env.get("ANTHROPIC_API_KEY", "").strip()
        numbers: dict[str, object] = {}
        for field in _NUMBERS:
            raw = env.get(cls.ENV_NAMES[field], "").strip()
            if raw:
                numbers[field] = raw
        try:
            if not bedrock and not api_key:
                # No model, but a malformed bound is still refused where it is read, not first
                # when a model is set (ALPHAAGENT_MAX_BUDGET_USD=abc passed a steps-only run).
                _bounds_model().model_validate(numbers)
                return None
            values: dict[str, object] = {
                "provider": "bedrock" if bedrock else "anthropic",
                "model": env.get("ALPHAAGENT_MODEL") or None,
                "anthropic_api_key": api_key or None,
                "anthropic_base_url": env.get("ANTHROPIC_BASE_URL") or None,
                "aws_region": env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None,
                **numbers,
            }
            return cls.model_validate(values)
        except ValidationError as exc:
            # One line naming the variable and the rule, as every process kind's settings.
            raise ModelConfigError(describe_error(cls, exc)) from None

    def cli_env(self) -> dict[str, str]:
        """The provider's variables for the Claude Code CLI (added over the inherited environment)."""
        env: dict[str, str] = {}
        if self.provider == "bedrock":
            assert self.aws_region is not None  # checked by the validator
            env["CLAUDE_CODE_USE_BEDROCK"] = "1"
            env["AWS_REGION"] = self.aws_region
        else:
            assert self.anthropic_api_key is not None  # checked by the validator
            env["CLAUDE_CODE_USE_BEDROCK"] = ""
            env["ANTHROPIC_API_KEY"] = self.anthropic_api_key.get_secret_value()
            if self.anthropic_base_url:
                env["ANTHROPIC_BASE_URL"] = self.anthropic_base_url
        if self.max_retries is not None:
            env["CLAUDE_CODE_MAX_RETRIES"] = str(self.max_retries)
        return env


_NUMBERS = ("max_retries", "max_budget_usd")
"""The fields of ``CoderSettings`` that bound the model's use: checked even when no model is set."""


@lru_cache(maxsize=1)
def _bounds_model() -> type[BaseModel]:
    """``CoderSettings``' ``_NUMBERS`` fields alone (the very same rules), for an environment that
    sets no model: a refusal then names the variable as ``CoderSettings``' own does."""
    fields: dict[str, Any] = {
        f: (CoderSettings.model_fields[f].annotation, CoderSettings.model_fields[f]) for f in _NUMBERS
    }
    return create_model("ModelBounds", __config__=CoderSettings.model_config, **fields)


@lru_cache(maxsize=1)
def coder_settings() -> CoderSettings | None:
    """The process's coder settings, read from the environment once; ``None`` without a model.

    Raises ``ModelConfigError`` for an incomplete configuration (e.g. Bedrock without a region).
    """
    return CoderSettings.from_env(os.environ)


def model_configured() -> bool:
    """Whether the environment configures a model (the Anthropic API or Bedrock)."""
    return coder_settings() is not None
