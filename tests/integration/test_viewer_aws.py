"""`alphaagent serve --backend aws`: the same viewer over a stack's DynamoDB table and S3 bucket
(moto), reading with the operator's credentials: the pages, the previews, the downloads, and another
user's work answered like missing work."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from moto_account import MotoAccount
from viewer_data import ALICE, BOB, CONV, HOSTILE, PNG, TOKEN, Home, lay_out

from alphaagent.aws.store import DynamoStore
from alphaagent.aws.workspace import S3Workspace
from alphaagent.models.common import ConversationScope
from alphaagent.viewer.app import create_app
from alphaagent.viewer.serve import aws_reader

if TYPE_CHECKING:
    from starlette.testclient import TestClient

REGION = "eu-west-1"
TABLE = "alphaagent-state-viewer"
BUCKET = "alphaagent-workspaces-123456789012-eu-west-1"


@pytest.fixture
def aws_region() -> str:
    return REGION


@pytest.fixture
def stack(moto: MotoAccount) -> Home:
    home = Home(
        DynamoStore(TABLE, client=moto.state_table(TABLE)), S3Workspace(BUCKET, client=moto.bucket(BUCKET))
    )
    lay_out(home)
    return home


def _client(user: str) -> TestClient:
    from starlette.testclient import TestClient

    app = create_app(aws_reader(TABLE, BUCKET, user, REGION), token=TOKEN)
    client = TestClient(app, base_url="http://127.0.0.1:8765")
    assert client.get(f"/?token={TOKEN}").status_code == 200
    return client


def test_the_viewer_reads_a_stacks_table_and_bucket(stack: Home) -> None:
    alice = _client(ALICE)
    # The front page lists her conversation and her workflow node, from the table
    front = alice.get("/").text
    assert 'href="/c/sales/"' in front and 'href="/w/wf1/clean/"' in front
    # The scope page: the latest dataset version as a table, the chart inline, the report rendered,
    # the hostile name escaped, the file tree from the bucket
    page = alice.get("/c/sales/").text
    assert "<td>north</td>" in page and "<h1>Revenue</h1>" in page
    assert 'src="/c/sales/blob/revenue-chart/1"' in page
    assert "&lt;img src=x onerror=alert(1)&gt;.csv" in page and HOSTILE not in page
    # The bytes come from the bucket: the chart's blob and a file download
    assert alice.get("/c/sales/blob/revenue-chart/1").content == PNG
    assert alice.get("/c/sales/file/datasets/revenue.csv").content == b"region,revenue\nnorth,1\n"
    # Paging through version 1 of the dataset
    assert "<td>r119</td>" in alice.get("/c/sales/artifacts/revenue/1?page=3").text


def test_another_users_work_on_aws_is_answered_like_missing_work(stack: Home) -> None:
    stack.claim(ConversationScope(conversation_id="bobs"), BOB)
    stack.turn(ConversationScope(conversation_id="bobs"), user=BOB)
    bob = _client(BOB)
    missing = bob.get("/c/nothing-here/")
    turn_id = stack.store.list_turns(ALICE, CONV.key)[0].turn_id
    for path in (
        "/c/sales/",
        f"/c/sales/turns/{turn_id}",
        "/c/sales/runs",
        "/c/sales/blob/revenue-chart/1",
        "/c/sales/file/datasets/revenue.csv",
        "/w/wf1/clean/",
    ):
        answer: Any = bob.get(path)
        assert (answer.status_code, answer.content) == (404, missing.content), path
    front = bob.get("/").text
    assert "/c/bobs/" in front and "sales" not in front
