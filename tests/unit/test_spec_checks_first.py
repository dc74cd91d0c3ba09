"""Every check of a spec that needs no code is made before any code runs (new-user review: an
output's path was found unregistrable only after every step ran): refused in one line naming the
field, with nothing written (no turn, no session, no file of the steps)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sandboxes import light_agent
from viewer_data import Home

from alphaagent.api import AlphaAgent
from alphaagent.errors import InvalidSpecError, NotFoundError
from alphaagent.models.common import ConversationScope

USER = "spec-user"
SCOPE = ConversationScope(conversation_id="first")
MARK = "work/ran.txt"
"""What the spec's one step writes: present only if code ran."""


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AlphaAgent]:
    with light_agent(tmp_path / "home") as made:
        yield made


def _spec(outputs: list[dict[str, object]]) -> dict[str, object]:
    return {
        "spec_version": 1,
        "user_id": USER,
        "scope": {"conversation_id": SCOPE.conversation_id},
        "goal": "checks first",
        "outputs": outputs,
        "steps": [
            {"title": "write", "code": f"import os\nos.makedirs('work', exist_ok=True)\nopen({MARK!r}, 'w')"}
        ],
    }


def _refused(agent: AlphaAgent, spec: dict[str, object]) -> str:
    turns_before = agent.store.list_turns(USER, SCOPE.key)
    with pytest.raises(InvalidSpecError) as raised:
        agent.run_analysis(spec)
    # Nothing ran and nothing of the turn was written
    assert not (agent.home / SCOPE.key / MARK).exists()
    assert agent.store.list_turns(USER, SCOPE.key) == turns_before
    return str(raised.value)


LONG = "reports/" + "/".join(["d" * 200] * 5) + "/x.md"


@pytest.mark.parametrize(
    ("path", "line"),
    [
        (
            "reports/a%20b.md",
            "outputs[0].path 'reports/a%20b.md': percent-encoding is not decoded in paths; path must stay"
            " inside this scope's datasets/, charts/, reports/ or work/",
        ),
        (
            "work/sessions/x/summary.md",
            'outputs[0].path: "work/sessions/x/summary.md" is in work/sessions/, the platform\'s folder of'
            " the sessions' live state; choose another folder",
        ),
        (
            LONG,
            f"outputs[0].path {LONG!r}: path is too long: the full key is"
            f" {len(('conversations/first/' + LONG).encode())} UTF-8 bytes, over S3's 1024-byte key limit;"
            " path must stay inside this scope's datasets/, charts/, reports/ or work/",
        ),
    ],
)
def test_an_output_path_that_could_never_be_registered_is_refused_before_any_code(
    path: str, line: str, agent: AlphaAgent
) -> None:
    # Given a spec whose output path breaks a rule that needs no file
    spec = _spec([{"kind": "report", "name": "summary", "path": path}])
    # When it is run / Then it is refused naming the field, before its step runs
    assert _refused(agent, spec) == line


def test_an_output_name_already_of_another_kind_is_refused_before_any_code(agent: AlphaAgent) -> None:
    # Given the user's scope where "summary" is already a dataset
    home = Home(agent.store, agent.workspace)
    home.claim(SCOPE, USER)
    turn = home.turn(SCOPE, user=USER)
    home.artifact(SCOPE, turn, "dataset", "summary", "datasets/summary.csv", b"a\n1\n")
    # When a spec declares a report named "summary" (with a path, or without one)
    for output in (
        {"kind": "report", "name": "summary", "path": "reports/s.md"},
        {"kind": "report", "name": "summary"},
    ):
        # Then it is refused naming the output's name, before its step runs
        assert _refused(agent, _spec([output])) == (
            'outputs[0].name: "summary" is already a dataset in this scope; give the report another name'
        )


def test_another_users_artifact_names_are_not_looked_at(agent: AlphaAgent) -> None:
    # Given another user's scope where "summary" is a dataset
    home = Home(agent.store, agent.workspace)
    home.claim(SCOPE, "someone-else")
    turn = home.turn(SCOPE, user="someone-else")
    home.artifact(SCOPE, turn, "dataset", "summary", "datasets/summary.csv", b"a\n1\n")
    # When this user's spec names a report "summary" there / Then the answer is the scope's "not found"
    with pytest.raises(NotFoundError, match=r"^conversation first not found$"):
        agent.run_analysis(_spec([{"kind": "report", "name": "summary"}]))
