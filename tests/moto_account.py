"""The simulated AWS account the tests share (the ``moto`` fixture of tests/conftest.py)."""

from __future__ import annotations

import functools
import os
from typing import Any, ClassVar

import boto3
import botocore.loaders
import botocore.session

FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
}
"""Credentials moto accepts; set so that no test can reach a real account through a profile."""


class MotoAccount:
    """One test's moto account in one region: clients and the resources the stack's tests need.

    Every method creates what it names the way template.yaml's resource is configured where that
    matters (the state table by ``create_table``, buckets outside us-east-1 with their location).
    """

    def __init__(self, region: str) -> None:
        self.region = region

    @functools.cache  # noqa: B019 - one account per test: the cache dies with it
    def client(self, service: str) -> Any:
        """The account's boto3 client for ``service`` (one per service)."""
        return boto3.client(service, region_name=self.region)

    def bucket(self, name: str, *, versioned: bool = False) -> Any:
        """Create the S3 bucket ``name`` (versioned if asked); return the S3 client."""
        s3 = self.client("s3")
        if self.region == "us-east-1":  # the one region S3 refuses a LocationConstraint for
            s3.create_bucket(Bucket=name)
        else:
            s3.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": self.region})
        if versioned:
            s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
        return s3

    def state_table(self, name: str) -> Any:
        """Create the state table ``name`` as the stack defines it; return the DynamoDB client."""
        from alphaagent.aws.store import create_table

        dynamodb = self.client("dynamodb")
        create_table(dynamodb, name)
        return dynamodb

    def queue(self, name: str, **attributes: str) -> str:
        """Create the SQS queue ``name``; return its URL."""
        url: str = self.client("sqs").create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
        return url

    def queue_arn(self, url: str) -> str:
        """The ARN of the queue at ``url``."""
        attributes = self.client("sqs").get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
        arn: str = attributes["Attributes"]["QueueArn"]
        return arn


# -- the SDK's data files, read once per process ---------------------------------------------------


class _SharedDataLoader(botocore.loaders.Loader):
    """botocore's loader of its data files (service models, endpoints, partitions), with one cache
    per search path for the whole process instead of one per session.

    mock_aws replaces boto3's default session for every test, and each new session's first client
    re-reads and re-parses endpoints.json and the service's model (~100 ms of CPU a client, most of
    a small moto test). The files are the installed SDK's and never change while the tests run, and
    botocore already shares the parsed data between all the clients of one session (nothing mutates
    it), so sharing it between sessions changes no behaviour. Only the files are shared: every
    session keeps its own credentials, configuration, event handlers and clients.
    """

    _caches: ClassVar[dict[tuple[str, ...], dict[Any, Any]]] = {}

    @property
    def _cache(self) -> dict[Any, Any]:
        # Keyed by the search path at lookup time: boto3 appends its own data directory to a
        # session's loader after creating it, and a different path may find different files.
        return self._caches.setdefault(tuple(self.search_paths), {})

    @_cache.setter
    def _cache(self, _value: dict[Any, Any]) -> None:
        """``Loader.__init__`` assigns a fresh dict; every instance reads the shared one instead."""


def _create_loader(search_path_string: str | None = None) -> botocore.loaders.Loader:
    """``botocore.loaders.create_loader`` (the same search path rules) making a :class:`_SharedDataLoader`."""
    if search_path_string is None:
        return _SharedDataLoader()
    paths = [os.path.expanduser(os.path.expandvars(p)) for p in search_path_string.split(os.pathsep)]
    return _SharedDataLoader(extra_search_paths=paths)


def share_sdk_data() -> None:
    """Make every botocore session of the process read the SDK's data files through one cache
    (:class:`_SharedDataLoader`). Idempotent."""
    botocore.session.create_loader = _create_loader


_VALID_DEFINITIONS: set[str] = set()


def remember_valid_state_machines(monkeypatch: Any) -> None:
    """moto's ``CreateStateMachine`` parses the definition with its ANTLR grammar (~0.2 s of CPU for
    turn.asl.yaml) only to refuse an invalid one; the parse is deterministic, so a definition that
    passed once in this process passes again without it. A new or changed definition is parsed
    (and refused) as before, and every execution still parses and runs the definition itself."""
    from moto.stepfunctions.parser.models import StepFunctionsParserBackend

    validate = StepFunctionsParserBackend._validate_definition

    def validate_once(definition: str) -> None:
        if definition not in _VALID_DEFINITIONS:
            validate(definition=definition)  # raises InvalidDefinition for a bad definition
            _VALID_DEFINITIONS.add(definition)

    monkeypatch.setattr(StepFunctionsParserBackend, "_validate_definition", staticmethod(validate_once))
