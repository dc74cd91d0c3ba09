"""The simulated AWS account the tests share (the ``moto`` fixture of tests/conftest.py)."""

from __future__ import annotations

import functools
from typing import Any

import boto3

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
