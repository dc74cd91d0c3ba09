"""The ``s3`` connector: one object under an allowed ``bucket/prefix``, its size checked before any
byte is downloaded."""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Annotated, Final

from pydantic import BaseModel, ConfigDict, Field

from alphaagent.connectors.base import ConnectorRequest, EnvVar, Fetched, FetchLimits
from alphaagent.errors import ToolError

NAME = "s3"

MAX_KEY_BYTES = 1024
"""S3's object key limit, in UTF-8 bytes."""

PREFIX: Final = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/[^\x00-\x1f\x7f*?]{0,1024}")
"""``bucket/prefix``: an S3 bucket name (3-63 characters, S3's naming rules), a slash, a key prefix
(possibly empty) without control characters or IAM wildcards (the template turns each entry into the
IAM resource ``arn:aws:s3:::{entry}*``, so ``*`` or ``?`` would widen the grant)."""


def check_stack_prefixes(prefixes: tuple[str, ...]) -> tuple[str, ...]:
    """``prefixes`` if each is ``bucket/prefix`` (``PREFIX``); raises ``ValueError`` naming the entry."""
    for entry in prefixes:
        if not PREFIX.fullmatch(entry):
            raise ValueError(
                f"{entry!r} is not bucket/prefix (a bucket name, a slash, a key prefix without"
                " * or ?; bucket/ for the whole bucket)"
            )
    return prefixes


class Request(ConnectorRequest):
    """``{"bucket", "key", "name"?}``."""

    bucket: str = Field(description="The bucket.")
    key: str = Field(description="The key of one object (not a prefix).")


class Settings(BaseModel):
    """Which objects the ``s3`` connector may read.

    Entries are checked as ``bucket/prefix`` (``check_stack_prefixes``) where they come from the
    stack (the AWS variable, whose entries become IAM resources); locally, ``"bucket"`` alone also
    allows the whole bucket, as it always has."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    s3_prefixes: Annotated[
        tuple[str, ...],
        EnvVar(local="ALPHAAGENT_S3_PREFIXES", aws="CONNECTOR_S3_PREFIXES", aws_check=check_stack_prefixes),
    ] = Field(
        (),
        description="bucket/prefix entries the s3 connector may read (the key must start with the"
        " prefix; bucket/ for a whole bucket); comma-separated. Default: none.",
    )


def describe(settings: Settings) -> str:
    """The tool text's sentence about this connector."""
    prefixes = ", ".join(settings.s3_prefixes) or "none"
    return f"'s3' reads an object under these bucket/prefixes only: {prefixes}."


def s3_allowed(settings: Settings, bucket: str, key: str) -> bool:
    """Whether ``s3_prefixes`` lets the connector read ``bucket``/``key`` (the bucket matches exactly
    and the key starts with the entry's prefix)."""
    for entry in settings.s3_prefixes:
        allowed_bucket, _, prefix = entry.partition("/")
        if allowed_bucket == bucket and key.startswith(prefix):
            return True
    return False


def check(request: Request, settings: Settings, limits: FetchLimits) -> None:
    """Refuse, without any call, a request ``fetch`` would refuse before calling S3: no bucket, not
    one object's key, or outside ``s3_prefixes``. Raises ``ToolError``."""
    bucket, key = request.bucket, request.key
    if not bucket:
        raise ToolError("request.bucket: the s3 connector needs a 'bucket'")
    if not key or key.endswith("/") or len(key.encode()) > MAX_KEY_BYTES:
        raise ToolError("request.key: the s3 connector needs the 'key' of one object (at most 1,024 bytes)")
    if not s3_allowed(settings, bucket, key):
        allowed = ", ".join(settings.s3_prefixes) or "none configured"
        raise ToolError(
            f"request.key: s3://{bucket}/{key} is outside the s3 connector's allowed prefixes ({allowed})"
        )


def fetch(request: Request, settings: Settings, limits: FetchLimits) -> Fetched:
    """HEAD then GET the object, refusing one outside ``s3_prefixes`` (before any call) or over
    ``limits.max_bytes`` (before any byte is downloaded, and again while reading)."""
    check(request, settings, limits)
    bucket, key = request.bucket, request.key
    try:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        raise ToolError("the s3 connector needs boto3 installed (the coder's dependencies)") from None
    # Created per fetch, never at import: the region and credentials are those of the moment.
    timeout = Config(connect_timeout=limits.timeout_s, read_timeout=limits.timeout_s)
    client = boto3.client("s3", config=timeout)
    source = f"s3://{bucket}/{key}"
    try:
        # The size cap is checked before any byte is downloaded; the read is capped again in case
        # the object was replaced between the two calls.
        size = int(client.head_object(Bucket=bucket, Key=key)["ContentLength"])
        if size > limits.max_bytes:
            raise ToolError(
                f"request.key: {source} is {size} bytes, over the connector cap of {limits.max_bytes}"
            )
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        data = body.read(limits.max_bytes + 1)
        body.close()
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in ("404", "NoSuchKey", "NoSuchBucket"):
            raise ToolError(f"request.key: {source} does not exist") from None
        raise ToolError(f"request.key: fetching {source} failed ({code or 'error'})") from None
    except BotoCoreError as exc:
        raise ToolError(f"request.key: fetching {source} failed: {exc}") from None
    if len(data) > limits.max_bytes:
        raise ToolError(f"request.key: {source} is over the connector cap of {limits.max_bytes} bytes")
    return Fetched(data, request.name or PurePosixPath(key).name, source)
