"""The run-notice queues' expiry tags (audit L7): a coder process's queue carries the sweeper's tag,
renews it while the process lives, and makes a new queue when the sweeper took its old one. Calls
are checked against the coder task role of template.yaml (tests/iam.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from iam import Iam, Physical
from moto_account import MotoAccount

from alphaagent.aws.notices import QUEUE_LEASE_S, RENEW_S, RunNotices
from alphaagent.aws.queue_sweeper import EXPIRES_TAG, sweep

ROOT = Path(__file__).resolve().parents[2]
REGION = "eu-west-1"
ACCOUNT = "123456789012"


@pytest.fixture
def aws_region() -> str:
    return REGION


@pytest.fixture
def iam(moto: MotoAccount) -> Iterator[Iam]:
    harness = Iam((ROOT / "template.yaml").read_text(), Physical(REGION, ACCOUNT))
    harness.install()
    try:
        yield harness
    finally:
        harness.uninstall()
    assert not harness.denied, harness.report()


def _expires(iam: Iam, moto: MotoAccount, url: str) -> float:
    with iam.acting_as(None):  # the test's own look, not the coder's
        return float(moto.client("sqs").list_queue_tags(QueueUrl=url)["Tags"][EXPIRES_TAG])


def test_a_coder_queue_is_tagged_renewed_and_remade_after_a_sweep(moto: MotoAccount, iam: Iam) -> None:
    # Given a coder process (its clock injected) that makes its notice queue at t=1000
    now = [1_000.0]
    sqs: Any = moto.client("sqs")
    notices = RunNotices(sqs, wall=lambda: now[0])
    with iam.acting_as("CoderTaskRole"):
        first = notices.queue_url
        # Then the queue may be swept QUEUE_LEASE_S later
        assert _expires(iam, moto, first) == 1_000 + QUEUE_LEASE_S

        # When it runs again within the hour, nothing is renewed; after an hour, the expiry moves on
        now[0] += RENEW_S - 1
        assert notices.queue_url == first
        assert _expires(iam, moto, first) == 1_000 + QUEUE_LEASE_S
        now[0] += 1
        assert notices.queue_url == first
        assert _expires(iam, moto, first) == now[0] + QUEUE_LEASE_S

    # When the process then sleeps past its lease and the sweeper deletes the queue
    now[0] += QUEUE_LEASE_S + 1
    with iam.acting_as("SweepNoticeQueuesFunction"):
        assert sweep(sqs, now=now[0]).deleted == 1

    # Then its next run makes a new queue (tagged afresh) instead of naming a deleted one
    with iam.acting_as("CoderTaskRole"):
        second = notices.queue_url
        assert second != first
        assert _expires(iam, moto, second) == now[0] + QUEUE_LEASE_S
        notices.close()
    assert sqs.list_queues().get("QueueUrls", []) == []
