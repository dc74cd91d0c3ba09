"""The workflow example chained in the stack, under moto: node ``clean``'s ``TurnCompleted`` goes
through the example's EventBridge rule (``examples/workflow``: its input transformer writes node
``summarise``'s ``SpecSubmitted``) to the SpecQueue, and node ``summarise`` runs with node
``clean``'s dataset. The stack is the turn machine harness (``test_turn_machine.py``).

moto applies the input transformer by plain substitution, as EventBridge does for placeholders
inside JSON strings; it enforces neither the queue policy that admits the rule nor the 8 KiB
template limit (the unit test of the example checks both).
"""

from __future__ import annotations

import json
from types import ModuleType

import example_scripts
from assertions import assert_status

from alphaagent.client import connect
from alphaagent.ids import new_ulid
from alphaagent.models.common import NodeScope, utcnow
from integration.test_turn_machine import (  # iam_template: the stack fixture requests it
    BUCKET,
    BUS,
    REGION,
    TABLE,
    USER,
    Stack,
    iam_template,  # noqa: F401
    stack,
    turn_stack,  # noqa: F401 - the stack fixture requests it (one stack per module)
    wait_for,
)

__all__ = ["stack"]

PENGUINS = (
    "species,island,bill_length_mm,bill_depth_mm,flipper_length_mm,body_mass_g,sex,year\n"
    "Adelie,Torgersen,39.1,18.7,181,3750,male,2007\n"
    "Adelie,Torgersen,39.5,17.4,186,3800,female,2007\n"
    "Adelie,Torgersen,,,,,,2007\n"
    "Gentoo,Biscoe,46.1,13.2,211,4500,female,2007\n"
    "Gentoo,Biscoe,50.0,16.3,230,5700,male,2007\n"
)


def load_example() -> ModuleType:
    return example_scripts.load_example("workflow/penguins_workflow.py")


def test_node_b_is_submitted_by_the_chain_rule_when_node_a_completes(stack: Stack) -> None:
    example = load_example()
    # Given the example's chain rule on the bus, pointed at the SpecQueue as its template points it
    rule = example.chain_rule(BUS, stack.arn_of(stack.spec_queue), stack.arn_of(stack.spec_dlq))
    stack.events.put_rule(
        Name="alphaagent-chain-penguins-summarise",
        EventBusName=BUS,
        EventPattern=json.dumps(rule["EventPattern"]),
    )
    stack.events.put_targets(
        Rule="alphaagent-chain-penguins-summarise", EventBusName=BUS, Targets=rule["Targets"]
    )
    # and node clean's input in its scope (the first turn of a workflow run claims it)
    workflow = example.WORKFLOW_PREFIX + new_ulid().lower()
    clean = NodeScope(workflow_execution_id=workflow, node_id="clean")
    summarise = NodeScope(workflow_execution_id=workflow, node_id="summarise")
    stack.store.claim_owner(clean.owner_key, USER, utcnow())
    stack.workspace.write_bytes(clean, "docs/penguins.csv", PENGUINS.encode())
    stack.start()

    # When only node clean is submitted, by the client
    with connect(
        backend="aws",
        user=USER,
        queue_url=stack.spec_queue,
        table=TABLE,
        bucket=BUCKET,
        region=REGION,
        poll_s=0.2,
    ) as client:
        source = {"kind": "document", "path": "docs/penguins.csv"}
        first = client.run_analysis(example.clean_spec(workflow, source), timeout_s=120)
        assert_status(first, "completed")

        # Then node summarise ran on its own, started by the rule
        def summarised() -> bool:
            turns = stack.store.list_turns(USER, summarise.key)
            return bool(turns) and turns[0].result is not None

        wait_for(summarised, "node summarise's turn", 120, stack)
        [turn] = client.turns(summarise)
        assert turn.result is not None, turn.result
        assert_status(turn.result, "completed", turn.result)
        assert {(a.kind, a.name) for a in turn.result.artifacts} == {
            ("chart", "mass-by-species"),
            ("report", "summary"),
        }
        # with node clean's registered dataset, copied into its docs/
        clean_version, clean_bytes = client.artifact(clean, "penguins-clean")
        assert client.read(summarise, "docs/clean/penguins-clean.csv") == clean_bytes
        report = client.read(summarise, "reports/summary.md").decode()
    assert "From 4 cleaned rows" in report and "Heaviest species: Gentoo." in report
    assert clean_version.version == 1
