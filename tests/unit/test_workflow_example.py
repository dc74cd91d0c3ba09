"""The two-node workflow example (``examples/workflow``) on the local backend, through the client:
node ``summarise`` gets node ``clean``'s dataset only through its ``node_artifact`` input."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import ModuleType

import example_scripts

from alphaagent.client import connect
from alphaagent.ids import new_ulid

ROOT = Path(__file__).resolve().parents[2]


def load_example() -> ModuleType:
    return example_scripts.load_example("workflow/penguins_workflow.py")


def test_node_b_takes_node_a_dataset_through_a_node_artifact_input(tmp_path: Path) -> None:
    example = load_example()
    workflow = example.WORKFLOW_PREFIX + new_ulid().lower()

    # When the driver runs the workflow through a local client
    with connect(backend="local", user="analyst", home=tmp_path, coder=None) as client:
        results = example.run_workflow(client, workflow, example.local_source())
        clean = {"workflow_execution_id": workflow, "node_id": "clean"}
        summarise = {"workflow_execution_id": workflow, "node_id": "summarise"}
        clean_version, clean_bytes = client.artifact(clean, "penguins-clean")
        copied = client.read(summarise, "docs/clean/penguins-clean.csv")
        report = client.read(summarise, "reports/summary.md").decode()
        summarise_files = {f.path for f in client.files(summarise)}

    # Then both nodes completed, and node B's copy is node A's registered dataset, byte for byte
    assert {node: r.status for node, r in results.items()} == {"clean": "completed", "summarise": "completed"}
    assert {(a.kind, a.name) for a in results["summarise"].artifacts} == {
        ("chart", "mass-by-species"),
        ("report", "summary"),
    }
    assert copied == clean_bytes and hashlib.sha256(copied).hexdigest() == clean_version.sha256
    assert "Heaviest species: Gentoo." in report and "From 333 cleaned rows" in report
    # and nothing else of node A's is in node B's scope
    assert not any(path.startswith("datasets/") for path in summarise_files), summarise_files


def test_the_chain_template_is_a_rule_the_stack_admits() -> None:
    example = load_example()
    template = example.chain_template()
    [rule] = template["Resources"].values()
    properties = rule["Properties"]

    # The rule's name is one the SpecQueue's policy admits, and its input is a SpecSubmitted of node B
    assert properties["Name"].startswith("alphaagent-chain-")
    target = properties["Targets"][0]
    envelope = json.loads(
        target["InputTransformer"]["InputTemplate"].replace("<wf>", "penguins-x").replace("<user>", "u")
    )
    assert envelope["detail-type"] == "SpecSubmitted"
    assert envelope["detail"]["spec"] == example.summarise_spec("penguins-x") | {"user_id": "u"}
    assert len(target["InputTransformer"]["InputTemplate"]) <= 8192  # the EventBridge limit
    policy = (ROOT / "template.yaml").read_text()
    assert ":rule/${EventBus}/alphaagent-chain-*" in policy
