"""``alphaagent.client`` on the local backend: one user per client, specs bound to it, ``wait=False``,
and the errors of ``connect`` and ``parse_scope`` (one line naming the field)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from assertions import assert_status
from sandboxes import LIGHT_ENVIRONMENT, register_light

from alphaagent.aws.client import client_settings
from alphaagent.client import connect, parse_scope, resolve_user
from alphaagent.errors import InvalidRequestError, InvalidSpecError, NotFoundError
from alphaagent.models.common import NodeScope

STEP = {"title": "write", "code": "open('datasets/n.csv', 'w').write('n\\n1\\n')\nprint('wrote')\n"}


def spec(conversation: str, **fields: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "spec_version": 1,
        "scope": {"conversation_id": conversation},
        "goal": "write a number",
        "outputs": [{"kind": "dataset", "name": "n"}],
        "steps": [STEP],
    }
    document.update(fields)
    return document


def test_a_spec_without_user_id_runs_as_the_clients_user_and_can_be_waited_for(tmp_path: Path) -> None:
    light = {"environment_id": register_light(tmp_path)}  # the client, not the preload, is the subject
    with connect(backend="local", user="ann", home=tmp_path, coder=None) as client:
        # When one spec is submitted without waiting and another run to its end
        submitted = client.run_analysis(spec("c-later", **light), wait=False)
        now = client.run_analysis(spec("c-now", **light))
        later = client.result(submitted.turn_id)

        # Then both ran as ann, and their records say so
        assert_status(now, "completed")
        assert_status(later, "completed")
        assert later.turn_id == submitted.turn_id and submitted.scope.key == "conversations/c-later"
        assert client.turn(submitted.turn_id).user_id == "ann"
        assert client.read({"conversation_id": "c-now"}, "datasets/n.csv") == b"n\n1\n"
        assert [v.name for v in client.artifacts({"conversation_id": "c-later"})] == ["n"]
        # and an ended turn is read from its record by any later call
        assert client.result(now.turn_id) == now


def test_a_bad_spec_is_refused_before_anything_runs_even_without_waiting(tmp_path: Path) -> None:
    with connect(backend="local", user="ann", home=tmp_path, coder=None) as client:
        with pytest.raises(InvalidSpecError, match=r"^goal: must be at least 1 character, got \"\"$"):
            client.run_analysis(spec("c1", goal=""), wait=False)
        with pytest.raises(InvalidSpecError, match=r"^steps: this spec has no pinned steps"):
            client.run_analysis(spec("c1", steps=None), wait=False)
        with pytest.raises(InvalidSpecError, match=r"^spec: not valid JSON"):
            client.run_analysis(b"{")
    assert not (tmp_path / "conversations" / "c1").exists()


def test_another_users_spec_or_scope_is_a_missing_scope(tmp_path: Path) -> None:
    register_light(tmp_path)  # the answers to ann, not the preload, are the subject
    with connect(backend="local", user="bob", home=tmp_path, coder=None) as bob:
        assert_status(bob.run_analysis(spec("bobs", environment_id=LIGHT_ENVIRONMENT)), "completed")
    with connect(backend="local", user="ann", home=tmp_path, coder=None) as ann:
        errors = []
        for attempt in (
            lambda: ann.run_analysis(spec("bobs")),
            lambda: ann.run_analysis(spec("bobs", user_id="bob")),
            lambda: ann.artifacts({"conversation_id": "bobs"}),
            lambda: ann.read({"conversation_id": "bobs"}, "datasets/n.csv"),
        ):
            with pytest.raises(NotFoundError) as refused:
                attempt()
            errors.append(str(refused.value))
        with pytest.raises(NotFoundError) as missing:
            ann.artifacts({"conversation_id": "nobody"})
    assert set(errors) == {"conversation bobs not found"}
    assert str(missing.value) == "conversation nobody not found"


def test_the_identity_rule_and_the_settings_errors_name_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ALPHAAGENT_USER", raising=False)
    assert resolve_user() == "local"
    monkeypatch.setenv("ALPHAAGENT_USER", "env-user")
    assert resolve_user() == "env-user" and resolve_user("flag-user") == "flag-user"
    with pytest.raises(InvalidRequestError, match=r"^user: must be 1-128 characters"):
        connect(backend="local", user="no spaces", home=tmp_path)
    with pytest.raises(InvalidRequestError, match=r"^backend: 'gcp' is not one of local, aws"):
        connect(backend="gcp", home=tmp_path)  # type: ignore[arg-type]

    for name in ("ALPHAAGENT_SPEC_QUEUE_URL", "ALPHAAGENT_STATE_TABLE", "ALPHAAGENT_WORKSPACES_BUCKET"):
        monkeypatch.delenv(name, raising=False)
    client_settings.cache_clear()
    try:
        with pytest.raises(InvalidRequestError, match=r"^queue_url: give the stack's SpecQueueUrl output"):
            connect(backend="aws")
        with pytest.raises(
            InvalidRequestError, match=r"^bucket: give the stack's WorkspacesBucketName output"
        ):
            connect(backend="aws", queue_url="https://sqs.eu-west-1.amazonaws.com/1/q", table="t")
        with pytest.raises(InvalidRequestError, match=r"^queue_url: 'q' is not a queue URL"):
            connect(backend="aws", queue_url="q", table="t", bucket="b")
    finally:
        client_settings.cache_clear()


def test_parse_scope_names_the_field() -> None:
    assert parse_scope({"workflow_execution_id": "w", "node_id": "n"}) == NodeScope(
        workflow_execution_id="w", node_id="n"
    )
    with pytest.raises(InvalidRequestError, match=r"^scope\.node_id: must be 1-80 characters"):
        parse_scope({"workflow_execution_id": "w", "node_id": "../x"})
    with pytest.raises(InvalidRequestError, match=r"^scope: give \{conversation_id\}.*got \{node_id\}"):
        parse_scope({"node_id": "n"})
    with pytest.raises(InvalidRequestError, match=r"^scope: an object"):
        parse_scope("conversations/c1")  # type: ignore[arg-type]
