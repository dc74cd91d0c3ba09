"""Requests for another user's things leave a trail for the operator (DESIGN §4.7, ISO-01), and the
requester's answer stays that of a thing that does not exist."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import pytest
from assertions import assert_status
from sandboxes import light_agent

from alphaagent.api import AlphaAgent
from alphaagent.domain.audit import METRIC_NAME, ForeignRequest, emf_audit
from alphaagent.errors import NotFoundError
from alphaagent.models.common import ConversationScope

ALICE, MALLORY = "alice", "mallory"


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AlphaAgent]:
    with light_agent(tmp_path_factory.mktemp("home")) as shared:
        spec = {
            "spec_version": 1,
            "user_id": ALICE,
            "scope": {"conversation_id": "c-secret"},
            "goal": "x",
            "steps": [{"title": "write", "code": "open('datasets/t.csv', 'w').write('a\\n1\\n')"}],
            "outputs": [{"kind": "dataset", "name": "t", "path": "datasets/t.csv"}],
        }
        assert_status(shared.run_analysis(spec), "completed")
        yield shared


def _answer(call: object) -> tuple[str, str]:
    try:
        call()  # type: ignore[operator]
    except NotFoundError as exc:
        return type(exc).__name__, str(exc)
    raise AssertionError("expected NotFoundError")


def test_probes_of_another_users_things_are_recorded_and_answered_as_missing(agent: AlphaAgent) -> None:
    # Given alice's conversation, run, session and artifact
    scope = ConversationScope(conversation_id="c-secret")
    (run,) = agent.history(ALICE, scope)
    (session,) = agent.sessions(ALICE, scope)
    trail = agent.audit_trail
    before = len(trail.read())
    missing = ConversationScope(conversation_id="c-nobody")
    # When mallory asks for each of them, and for things that do not exist
    probes = [
        (lambda: agent.history(MALLORY, scope), lambda: agent.history(MALLORY, missing), "conversation"),
        (
            lambda: agent.run_record(MALLORY, run.run_id),
            lambda: agent.run_record(MALLORY, "01" + "0" * 24),
            "run",
        ),
        (
            lambda: agent.session(MALLORY, session.session_id),
            lambda: agent.session(MALLORY, "s" * 32),
            "session",
        ),
        (
            lambda: agent.artifact(MALLORY, scope, "t"),
            lambda: agent.artifact(MALLORY, missing, "t"),
            "artifact",
        ),
    ]
    for foreign, nonexistent, _kind in probes:
        # Then the answer is the one a missing thing of that kind gets (same type; the message names
        # only what was asked for)
        name, message = _answer(foreign)
        assert name == _answer(nonexistent)[0] == "NotFoundError" and "alice" not in message
    # And each foreign probe (only those) is in the trail, with the requesting user and the kind
    recorded = trail.read()[before:]
    assert [(r.requesting_user_id, r.kind) for r in recorded] == [(MALLORY, k) for *_, k in probes]
    assert recorded[1].requested == run.run_id and recorded[0].requested == scope.key
    assert all(ALICE not in r.model_dump_json() for r in recorded)


def test_the_aws_sink_is_one_embedded_metric_line() -> None:
    # Given the functions' sink writing to a buffer
    out = io.StringIO()
    emf_audit(out)(ForeignRequest(requesting_user_id=MALLORY, kind="run", requested="01RUN"))
    # Then it is one EMF document: the ForeignRequests metric by kind, with the requester as a field
    (line,) = out.getvalue().splitlines()
    document = json.loads(line)
    (directive,) = document["_aws"]["CloudWatchMetrics"]
    assert directive["Metrics"] == [{"Name": METRIC_NAME, "Unit": "Count"}]
    assert directive["Dimensions"] == [["kind"]] and document["kind"] == "run"
    assert document[METRIC_NAME] == 1 and document["requesting_user_id"] == MALLORY


def test_a_failing_trail_never_changes_the_answer(agent: AlphaAgent) -> None:
    # Given a trail whose sink fails (a full disk)
    def broken(_request: ForeignRequest) -> None:
        raise OSError("no space left on device")

    working = agent.audit
    agent.audit = broken
    try:
        # When mallory probes alice's conversation; Then the answer is still NotFoundError
        scope = ConversationScope(conversation_id="c-secret")
        assert _answer(lambda: agent.history(MALLORY, scope))[0] == "NotFoundError"
    finally:
        agent.audit = working
