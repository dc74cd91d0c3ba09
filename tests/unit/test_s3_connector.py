"""The ``s3`` connector under moto: the bucket/prefix allowlist, the size cap checked before any
download, and a missing object; each answer is a ``ToolError`` naming the request field."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest
from moto_account import MotoAccount

from alphaagent.domain.backend import ConnectorSettings
from alphaagent.domain.tools import CONNECTORS, fetch
from alphaagent.domain.turns import check_spec_against
from alphaagent.environments import StaticRegistry, builtin_local
from alphaagent.errors import ToolError
from alphaagent.models.spec import parse_spec

if TYPE_CHECKING:
    import boto3

CAP_BYTES = 1024
SETTINGS = ConnectorSettings(s3_prefixes=("research-data/shared/", "open-bucket"), max_bytes=CAP_BYTES)


class RecordingS3:
    """The test's own client, and the S3 operations the connector's clients called."""

    def __init__(self, client: Any, session: boto3.session.Session) -> None:
        self.client = client
        self.operations: list[str] = []
        session.events.register("before-call.s3.*", lambda model, **_: self.operations.append(model.name))


@pytest.fixture
def s3(moto: MotoAccount, monkeypatch: pytest.MonkeyPatch) -> RecordingS3:
    import boto3

    for bucket in ("research-data", "open-bucket"):
        client = moto.bucket(bucket)
    client.put_object(Bucket="research-data", Key="shared/penguins.csv", Body=b"species,mass\nAdelie,3700\n")
    client.put_object(Bucket="research-data", Key="private/salaries.csv", Body=b"name,salary\n")
    client.put_object(Bucket="research-data", Key="shared/huge.csv", Body=b"x" * (CAP_BYTES + 1))
    client.put_object(Bucket="open-bucket", Key="a/b/notes.md", Body=b"# notes\n")
    # The connector creates its clients from the default session: a fresh one, observed.
    session = boto3.session.Session()
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", session)
    return RecordingS3(client, session)


def test_an_allowed_object_is_fetched_with_its_name_and_source(s3: RecordingS3) -> None:
    path, data, source = fetch(SETTINGS, "s3", {"bucket": "research-data", "key": "shared/penguins.csv"})
    assert (path, data, source) == (
        "docs/penguins.csv",
        b"species,mass\nAdelie,3700\n",
        "s3://research-data/shared/penguins.csv",
    )
    named = fetch(SETTINGS, "s3", {"bucket": "open-bucket", "key": "a/b/notes.md", "name": "n.md"})
    assert named[0] == "docs/n.md"


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        ({"bucket": "research-data", "key": "private/salaries.csv"}, "outside the s3 connector's allowed"),
        ({"bucket": "research-datax", "key": "shared/penguins.csv"}, "outside the s3 connector's allowed"),
        ({"bucket": "research-data", "key": "shared/"}, "request.key: the s3 connector needs"),
        ({"key": "shared/penguins.csv"}, "request.bucket"),
    ],
)
def test_objects_outside_the_allowlist_are_refused_without_a_call(
    s3: RecordingS3, request_: dict[str, str], message: str
) -> None:
    with pytest.raises(ToolError, match=message):
        fetch(SETTINGS, "s3", request_)
    assert s3.operations == []


def test_the_size_cap_is_checked_before_downloading(s3: RecordingS3) -> None:
    with pytest.raises(ToolError, match=rf"is {CAP_BYTES + 1} bytes, over the connector cap of {CAP_BYTES}"):
        fetch(SETTINGS, "s3", {"bucket": "research-data", "key": "shared/huge.csv"})
    assert s3.operations == ["HeadObject"]


def test_a_missing_object_is_a_readable_error(s3: RecordingS3) -> None:
    with pytest.raises(ToolError, match=r"s3://research-data/shared/missing\.csv does not exist"):
        fetch(SETTINGS, "s3", {"bucket": "research-data", "key": "shared/missing.csv"})


def test_nothing_is_allowed_by_default() -> None:
    with pytest.raises(ToolError, match=r"allowed prefixes \(none configured\)"):
        fetch(ConnectorSettings(), "s3", {"bucket": "research-data", "key": "shared/penguins.csv"})


def test_a_spec_may_declare_an_s3_input() -> None:
    spec = parse_spec(
        json.dumps(
            {
                "spec_version": 1,
                "user_id": "analyst@example.com",
                "scope": {"conversation_id": "c1"},
                "goal": "use an object of the research bucket",
                "inputs": [
                    {
                        "kind": "connector",
                        "connector": "s3",
                        "request": {"bucket": "research-data", "key": "shared/penguins.csv"},
                    }
                ],
                "steps": [{"title": "look", "code": "print(1)"}],
            }
        )
    )
    check_spec_against(SimpleNamespace(environments=StaticRegistry([builtin_local()])), spec, None)  # type: ignore[arg-type]
    assert "s3" in CONNECTORS
