"""The coder knows its environment (issue 12, item 6): the system prompt names the turn's
environment and its main preinstalled packages, from the backend's registry."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from alphaagent.api import AlphaAgent
from alphaagent.domain.tools import TurnContext
from alphaagent.environments import Environment, LambdaStart, StaticRegistry, builtin_lambda
from alphaagent.models.common import utcnow
from alphaagent.models.records import Session
from alphaagent.models.spec import parse_spec
from coder.prompts import MAX_PROMPT_PACKAGES, SYSTEM_PROMPT, environment_prompt, system_prompt_for
from coder.settings import CoderSettings

pytestmark = pytest.mark.mcp_sdk  # imports the MCP SDK in this process (tests/conftest.py)

GPU = Environment(
    environment_id="gpu-ml",
    description="PyTorch on CPU",
    start=LambdaStart(function_name="alphaagent-env-gpu-ml"),
    packages=("torch==2.9.0", "numpy==2.4.6"),
)


def test_the_prompt_names_the_environment_its_description_and_packages() -> None:
    text = environment_prompt(GPU)
    assert "'gpu-ml': PyTorch on CPU." in text and "torch==2.9.0, numpy==2.4.6" in text
    builtin = environment_prompt(builtin_lambda())
    assert "'builtin'" in builtin and "scipy==1.17.1" in builtin and "pandas==3.1.1" in builtin
    assert system_prompt_for(GPU) == f"{SYSTEM_PROMPT}\n\n{text}"


def test_an_environment_without_packages_or_with_many_says_so() -> None:
    bare = environment_prompt(GPU.model_copy(update={"packages": ()}))
    assert "not listed" in bare and "Preinstalled" not in bare
    many = tuple(f"p{i}==1" for i in range(MAX_PROMPT_PACKAGES + 5))
    listed = environment_prompt(GPU.model_copy(update={"packages": many}))
    assert (
        f"p{MAX_PROMPT_PACKAGES - 1}==1 and 5 more" in listed and f"p{MAX_PROMPT_PACKAGES}==1" not in listed
    )


def test_the_turns_options_carry_the_prompt_of_the_specs_environment(tmp_path: Path) -> None:
    from coder.agent import build_options

    # Given a backend whose registry holds gpu-ml, and a turn of a spec that names it
    with AlphaAgent(tmp_path / "home") as agent:
        backend = dataclasses.replace(agent.backend, environments=StaticRegistry([builtin_lambda(), GPU]))
    spec = parse_spec(
        '{"spec_version": 1, "user_id": "u", "scope": {"conversation_id": "c-1"}, "goal": "g",'
        ' "environment_id": "gpu-ml"}'
    )
    now = utcnow()
    session = Session(
        session_id="s" * 22, user_id="u", scope_key=spec.scope.key, created_at=now, last_used_at=now
    )
    ctx = TurnContext(backend=backend, spec=spec, turn_id="t1", session=session)
    settings = CoderSettings(provider="anthropic", model="claude-sonnet-4-5", anthropic_api_key="k")
    private = tmp_path / "private"
    private.mkdir()
    # When the Agent SDK options are built, Then the system prompt is gpu-ml's
    options = build_options(ctx, settings, private)
    assert options.system_prompt == system_prompt_for(GPU)
