"""The local turn's scope lease on an injected clock (``Backend.clock``, ``alphaagent.clock``): waiting
for a busy scope, giving up, and taking over an expired lease, without a test that waits for any of it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from assertions import assert_status
from clocks import FakeClock
from sandboxes import light_agent

from alphaagent.api import AlphaAgent
from alphaagent.domain.backend import TurnSettings
from alphaagent.errors import ScopeBusyError
from alphaagent.ids import new_ulid

SCOPE_KEY = "conversations/c-busy"


@pytest.fixture
def agent(tmp_path: Path, fake_clock: FakeClock) -> Iterator[AlphaAgent]:
    """A local backend made while the fake clock is the process's (a scope waits 600 s at most)."""
    with light_agent(tmp_path / "home", turns=TurnSettings(lock_wait_s=600, lock_lease_s=60)) as made:
        assert made.backend.clock is fake_clock
        yield made


def spec(code: str = "print('ran')") -> dict[str, object]:
    return {
        "spec_version": 1,
        "turn_id": new_ulid(),
        "user_id": "u-1",
        "scope": {"conversation_id": "c-busy"},
        "goal": "test the scope lease",
        "steps": [{"title": "step 1", "code": code}],
    }


def test_a_turn_on_a_busy_scope_waits_its_wait_on_the_clock_then_gives_up(
    agent: AlphaAgent, fake_clock: FakeClock
) -> None:
    # Given a scope whose lease another turn holds for an hour
    assert agent.store.acquire_lock(SCOPE_KEY, "other-turn", fake_clock.utcnow(), 3600)
    said: list[str] = []

    # When a turn is run there, Then it says that it waits, waits 600 s of the clock, and gives up
    with pytest.raises(ScopeBusyError, match="waited 600 s; try again later"):
        agent.run_analysis(spec(), progress=said.append)
    assert said[0] == (
        "conversation c-busy is busy: another turn is running there; waiting for it (at most 600 s)"
    )
    assert 600 <= sum(fake_clock.sleeps) < 601
    assert max(fake_clock.sleeps) == 1.0  # the pauses double from 50 ms up to 1 s
    assert agent.store.lock_holder(SCOPE_KEY, fake_clock.utcnow()) == "other-turn"


def test_a_turn_runs_once_the_other_turn_lets_go_and_says_how_long_it_waited(
    agent: AlphaAgent, fake_clock: FakeClock
) -> None:
    # Given a scope whose lease another turn releases five seconds from now
    assert agent.store.acquire_lock(SCOPE_KEY, "other-turn", fake_clock.utcnow(), 3600)
    fake_clock.after(5, lambda: agent.store.release_lock(SCOPE_KEY, "other-turn"))
    said: list[str] = []

    # When a turn is run there
    result = agent.run_analysis(spec(), progress=said.append)

    # Then it ran as soon as the scope was free, and said after how long
    assert_status(result, "completed")
    free = next(line for line in said if "is free after" in line)
    waited = float(free.split("after ")[1].split(" s")[0])
    assert 5 <= waited < 6.1 and 5 <= sum(fake_clock.sleeps) < 6.1


def test_an_expired_lease_is_taken_over_at_once(agent: AlphaAgent, fake_clock: FakeClock) -> None:
    # Given a crashed turn's 60 s lease, and 61 s of the clock gone since
    assert agent.store.acquire_lock(SCOPE_KEY, "crashed-turn", fake_clock.utcnow(), 60)
    fake_clock.advance(61)

    # When a turn is run there, Then it takes the scope without waiting
    assert_status(agent.run_analysis(spec()), "completed")
    assert fake_clock.sleeps == []
