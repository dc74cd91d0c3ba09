"""A two-node workflow on alphaagent: node ``clean`` registers a cleaned dataset; node ``summarise``
takes it through a ``node_artifact`` input and writes a chart and a report.

Nodes of one workflow run do not share files (DESIGN §4.2): node ``summarise`` gets node ``clean``'s
dataset only because its spec declares it, as a recorded copy into ``docs/clean/``.

Run it on the local backend (from the repository root)::

    python examples/workflow/penguins_workflow.py

or against a deployed stack, the same driver through the same client (``--backend aws`` reads the
stack outputs from ``ALPHAAGENT_SPEC_QUEUE_URL``, ``ALPHAAGENT_STATE_TABLE`` and
``ALPHAAGENT_WORKSPACES_BUCKET``)::

    python examples/workflow/penguins_workflow.py --backend aws --input '{"kind": "document", ...}'

On AWS the chaining can also live in the stack instead of a driver: ``chain-template`` prints a
CloudFormation template whose EventBridge rule turns node ``clean``'s ``TurnCompleted`` into node
``summarise``'s ``SpecSubmitted`` (see README.md next to this file).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from alphaagent.client import Client, connect
from alphaagent.ids import new_ulid
from alphaagent.models.records import TurnResult

HERE = Path(__file__).resolve().parent
PENGUINS_CSV = HERE.parent / "penguins" / "penguins.csv"

CLEAN, SUMMARISE = "clean", "summarise"
WORKFLOW_PREFIX = "penguins-"
"""Workflow execution ids of this workflow start with it, so the chain rule matches only them."""

CLEAN_CODE = """\
import pandas as pd

raw = pd.read_csv("docs/penguins.csv")
clean = raw.dropna(subset=["species", "body_mass_g", "flipper_length_mm", "sex"])
clean = clean.astype({"body_mass_g": int, "flipper_length_mm": int})
clean.to_csv("datasets/penguins-clean.csv", index=False)
print(f"kept {len(clean)} of {len(raw)} rows")
"""

SUMMARISE_CODE = """\
import json

import pandas as pd

# node_artifact inputs arrive as docs/<node>/<name><suffix>, one stable name for every version;
# the sidecar next to it says which version it is
source = "docs/clean/penguins-clean.csv"
version = json.load(open(source + ".version.json"))["version"]
penguins = pd.read_csv(source)
by_species = penguins.groupby(["species", "sex"])["body_mass_g"].mean().round(0).unstack()
axes = by_species.plot.barh(title="Mean body mass (g) by species and sex")
axes.figure.savefig("charts/mass-by-species.png", bbox_inches="tight")
heaviest = penguins.groupby("species")["body_mass_g"].mean().idxmax()
with open("reports/summary.md", "w") as report:
    report.write(f"# Penguins\\n\\nFrom {len(penguins)} cleaned rows ({source}, v{version}).\\n\\n")
    report.write(f"Heaviest species: {heaviest}.\\n\\n```\\n{by_species.to_string()}\\n```\\n")
print(by_species.to_string())
"""


def clean_spec(workflow_execution_id: str, source: dict[str, Any]) -> dict[str, Any]:
    """Node ``clean``: ``source`` (a spec input that brings ``docs/penguins.csv``) -> dataset
    ``penguins-clean``."""
    return {
        "spec_version": 1,
        "scope": {"workflow_execution_id": workflow_execution_id, "node_id": CLEAN},
        "goal": "Drop the penguins with missing measurements or sex.",
        "inputs": [source],
        "outputs": [{"kind": "dataset", "name": "penguins-clean", "description": "complete rows only"}],
        "steps": [{"title": "drop incomplete rows", "code": CLEAN_CODE}],
    }


def summarise_spec(workflow_execution_id: str) -> dict[str, Any]:
    """Node ``summarise``: node ``clean``'s ``penguins-clean`` -> a chart and a report."""
    return {
        "spec_version": 1,
        "scope": {"workflow_execution_id": workflow_execution_id, "node_id": SUMMARISE},
        "goal": "Which species is heaviest, by sex?",
        "inputs": [{"kind": "node_artifact", "node_id": CLEAN, "artifact": "penguins-clean"}],
        "outputs": [
            {"kind": "chart", "name": "mass-by-species", "path": "charts/mass-by-species.png"},
            {"kind": "report", "name": "summary", "path": "reports/summary.md"},
        ],
        "steps": [{"title": "summarise body mass", "code": SUMMARISE_CODE}],
    }


def local_source() -> dict[str, Any]:
    """Node ``clean``'s input on the local backend: the repository's copy, by the file connector."""
    return {
        "kind": "connector",
        "connector": "file",
        "request": {"path": str(PENGUINS_CSV), "name": "penguins.csv"},
    }


def run_workflow(
    client: Client,
    workflow_execution_id: str,
    source: dict[str, Any],
    progress: Callable[[str], None] | None = None,
) -> dict[str, TurnResult]:
    """Run node ``clean``, then (if it completed) node ``summarise``; return their results by node.

    The same code drives either backend: only ``client`` differs.
    """
    results = {CLEAN: client.run_analysis(clean_spec(workflow_execution_id, source), progress=progress)}
    if results[CLEAN].status == "completed":
        results[SUMMARISE] = client.run_analysis(summarise_spec(workflow_execution_id), progress=progress)
    return results


# ----------------------------------------------------------------------------- AWS: chain in the stack


def chain_rule(event_bus_name: str, spec_queue_arn: Any, dead_letter_arn: Any) -> dict[str, Any]:
    """The EventBridge rule (CloudFormation ``Properties``) that starts node ``summarise`` when node
    ``clean`` of one of this workflow's runs completes. The ARNs are strings, or CloudFormation
    references (``{"Ref": ...}``).

    Its target is the stack's SpecQueue, with an input transformer that writes the ``SpecSubmitted``
    event the starter reads (``{"detail-type": "SpecSubmitted", "detail": {"spec": ...}}``): the
    workflow execution id and the user come from the ``TurnCompleted`` event. The turn id is left
    out, so the starter derives it from the SQS message (one message, one turn). The stack's queue
    policy admits rules on its bus named ``alphaagent-chain-*`` (``template.yaml``).
    """
    spec = summarise_spec("<wf>") | {"user_id": "<user>"}
    envelope = {
        "detail-type": "SpecSubmitted",
        "source": "alphaagent.client",
        "detail": {"schema_version": 1, "scope": spec["scope"], "spec": spec},
    }
    return {
        "Description": "penguins workflow: node clean completed -> submit node summarise",
        "EventBusName": event_bus_name,
        "EventPattern": {
            "source": ["alphaagent.turn"],
            "detail-type": ["TurnCompleted"],
            "detail": {
                "scope": {"node_id": [CLEAN], "workflow_execution_id": [{"prefix": WORKFLOW_PREFIX}]},
                "result": {"status": ["completed"]},
            },
        },
        "State": "ENABLED",
        "Targets": [
            {
                "Id": "SpecQueue",
                "Arn": spec_queue_arn,
                "InputTransformer": {
                    "InputPathsMap": {
                        "wf": "$.detail.scope.workflow_execution_id",
                        "user": "$.detail.user_id",
                    },
                    "InputTemplate": json.dumps(envelope),
                },
                "RetryPolicy": {"MaximumRetryAttempts": 185, "MaximumEventAgeInSeconds": 86400},
                "DeadLetterConfig": {"Arn": dead_letter_arn},
            }
        ],
    }


def chain_template() -> dict[str, Any]:
    """A CloudFormation template (JSON, which is YAML) holding ``chain_rule``, deployed beside the
    alphaagent stack: ``aws cloudformation deploy --template-file chain.json --stack-name
    penguins-chain --parameter-overrides SpecQueueArn=... SpecDeadLetterQueueArn=...``."""
    properties = chain_rule("alphaagent", {"Ref": "SpecQueueArn"}, {"Ref": "SpecDeadLetterQueueArn"})
    return {
        "AWSTemplateFormatVersion": "2010-09-09",
        "Description": "alphaagent example: chain the penguins workflow's nodes on TurnCompleted",
        "Parameters": {
            "SpecQueueArn": {"Type": "String", "Description": "the alphaagent stack output SpecQueueArn"},
            "SpecDeadLetterQueueArn": {"Type": "String", "Description": "the SpecDeadLetterQueue's ARN"},
        },
        "Resources": {
            "ChainSummariseRule": {
                "Type": "AWS::Events::Rule",
                "Properties": properties | {"Name": "alphaagent-chain-penguins-summarise"},
            }
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="?", choices=("run", "chain-template"), default="run")
    parser.add_argument("--backend", choices=("local", "aws"), default="local")
    parser.add_argument("--user", help="who runs it (default: $ALPHAAGENT_USER, else local)")
    parser.add_argument(
        "--workflow", help=f"the workflow execution id (default: {WORKFLOW_PREFIX}<new ulid>)"
    )
    parser.add_argument(
        "--input", help="node clean's input as JSON (default: the file connector, local only)"
    )
    args = parser.parse_args(argv)
    if args.command == "chain-template":
        print(json.dumps(chain_template(), indent=2))
        return 0
    if args.input is None and args.backend == "aws":
        parser.error("--input: on AWS give node clean's input (a document in its scope, or a connector)")
    source = json.loads(args.input) if args.input else local_source()
    workflow = args.workflow or WORKFLOW_PREFIX + new_ulid().lower()
    with connect(backend=args.backend, user=args.user) as client:
        results = run_workflow(client, workflow, source, progress=lambda line: print(line, file=sys.stderr))
        for node, result in results.items():
            root = client.scope_root({"workflow_execution_id": workflow, "node_id": node})
            print(f"{node}: {result.status}  ({root})")
            for artifact in result.artifacts:
                print(f"  {artifact.kind} {artifact.name} v{artifact.version}: {artifact.path}")
            if result.error is not None:
                print(f"  error: {result.error.name}: {result.error.value}")
    return 0 if all(r.status == "completed" for r in results.values()) and len(results) == 2 else 1


if __name__ == "__main__":
    sys.exit(main())
