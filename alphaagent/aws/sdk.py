"""The AWS SDK, imported on first use (STYLE §2: nothing AWS happens at import time, and the local
backend and CLI never need boto3). boto3 and botocore ship without type information, so clients and
modules are ``Any``; importing them by name keeps mypy strict without stubs.

Example::

    s3 = client("s3")
    try:
        s3.head_object(Bucket=bucket, Key=key)
    except client_error() as error:
        if error_code(error) == "404": ...
"""

from __future__ import annotations

import functools
import importlib
from typing import Any


@functools.cache
def boto3() -> Any:
    """The boto3 module."""
    return importlib.import_module("boto3")


def client(service: str, region: str | None = None, *, config: dict[str, Any] | None = None) -> Any:
    """A boto3 client for ``service``; ``region`` None means the environment's or profile's.
    ``config``: arguments of a ``botocore.config.Config`` (``max_pool_connections``...), or None."""
    if config is None:
        return boto3().client(service, region_name=region)
    settings = importlib.import_module("botocore.config").Config(**config)
    return boto3().client(service, region_name=region, config=settings)


@functools.cache
def client_error() -> type[Exception]:
    """botocore's ``ClientError`` (an AWS service answered with an error)."""
    error: type[Exception] = importlib.import_module("botocore.exceptions").ClientError
    return error


@functools.cache
def sdk_errors() -> tuple[type[Exception], ...]:
    """``(ClientError, BotoCoreError)``: every error a boto3 call raises for AWS or the network."""
    exceptions = importlib.import_module("botocore.exceptions")
    return (exceptions.ClientError, exceptions.BotoCoreError)


def error_code(error: BaseException) -> str:
    """The AWS error code of a ``ClientError`` (``"NoSuchKey"``, ``"404"``...); ``""`` for anything else."""
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""
