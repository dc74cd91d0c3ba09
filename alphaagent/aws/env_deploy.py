"""The operator's side of the AWS environment registry: ``make env-deploy`` runs ``register`` once the
environment's stack (``env_images/environment.yaml``) is deployed, so the Prepare step and the coder
accept its specs (DESIGN §4.9).

    python -m alphaagent.aws.env_deploy register --core-stack alphaagent --environment-id gpu-ml \\
        --image 123456789012.dkr.ecr.eu-west-1.amazonaws.com/alphaagent-env-gpu-ml:abc \\
        --packages-file env_images/gpu-ml/packages.txt --memory-mb 3008 --timeout-s 900
    python -m alphaagent.aws.env_deploy list --core-stack alphaagent [--json]
    python -m alphaagent.aws.env_deploy parameters --core-stack alphaagent
    python -m alphaagent.aws.env_deploy remove --core-stack alphaagent --environment-id gpu-ml

``parameters`` prints the environment stack's ``Core*`` parameters as ``sam deploy
--parameter-overrides`` takes them (``Key=Value`` separated by spaces), read from the core stack's
outputs (``CORE_PARAMETERS``): the environment stack takes the core's values as parameters instead of
importing its exports, so that it never locks a core update (CloudFormation refuses to change or
delete an export in use).

The state table is the core stack's ``StateTableName`` output (``--table`` names it directly). A bad
argument is one line on stderr naming it, exit 2, and nothing is written; runs with the caller's own
AWS credentials (it needs ``cloudformation:DescribeStacks`` on the core stack and
``dynamodb:GetItem``/``PutItem``/``Query`` on the table).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from pydantic import ValidationError

from alphaagent.aws import sdk
from alphaagent.aws.environments import DynamoEnvironmentRegistry
from alphaagent.environments import Environment, function_name
from alphaagent.errors import InvalidRequestError
from alphaagent.models.run import MAX_MEMORY_MB, MAX_TIMEOUT_S

_PACKAGE = re.compile(
    r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?((==|>=|<=|~=|!=|<|>)[A-Za-z0-9.*+!_-]+)?$"
)
"""One line of a packages file: a distribution name, optionally with extras and one version clause."""

MAX_PACKAGES = 200

CORE_PARAMETERS: Final = {
    "CoreEventBusArn": "EventBusArn",
    "CoreWorkspacesBucketName": "WorkspacesBucketName",
    "CoreWorkspacesBucketArn": "WorkspacesBucketArn",
    "CoreStateTableName": "StateTableName",
    "CoreStateTableArn": "StateTableArn",
    "CorePermissionsBoundaryArn": "EnvPermissionsBoundaryArn",
    "CoreVpcId": "VpcId",
}
"""Each parameter of ``env_images/environment.yaml`` that carries a core stack value -> the core
stack's output (template.yaml) it is read from."""


def read_packages(path: Path) -> tuple[str, ...]:
    """The packages a file lists, one a line (``#`` comments and blank lines skipped; ``-r`` lines
    of a requirements file are followed, relative to the file).

    Raises:
        InvalidRequestError: the file is missing, or a line is not a package requirement.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequestError(f"--packages-file: cannot read {path}: {exc.__class__.__name__}") from None
    found: list[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-r "):
            found.extend(read_packages(path.parent / line[3:].strip()))
            continue
        compact = line.replace(" ", "")
        if not _PACKAGE.match(compact):
            raise InvalidRequestError(
                f"--packages-file: {path}:{number}: {raw.strip()!r} is not a package requirement"
            )
        found.append(compact)
    if len(found) > MAX_PACKAGES:
        raise InvalidRequestError(
            f"--packages-file: {path} lists {len(found)} packages; at most {MAX_PACKAGES}"
        )
    return tuple(found)


def stack_outputs(stack_name: str, *, client: Any = None) -> dict[str, str]:
    """The outputs of the stack ``stack_name`` (one DescribeStacks), by output key.

    Raises:
        InvalidRequestError: the stack cannot be described.
    """
    cloudformation = client or sdk.client("cloudformation")
    try:
        stacks = cloudformation.describe_stacks(StackName=stack_name)["Stacks"]
    except sdk.sdk_errors() as exc:
        raise InvalidRequestError(f"--core-stack: cannot describe stack {stack_name!r}: {exc}") from None
    return {
        str(output["OutputKey"]): str(output["OutputValue"])
        for output in (stacks[0].get("Outputs", []) if stacks else [])
    }


def _output(outputs: dict[str, str], stack_name: str, key: str) -> str:
    if key not in outputs:
        raise InvalidRequestError(
            f"--core-stack: stack {stack_name!r} has no {key} output (not a core stack, or one deployed"
            " before it had that output: update it first)"
        )
    return outputs[key]


def table_of_stack(stack_name: str, *, client: Any = None) -> str:
    """The core stack's state table (its ``StateTableName`` output).

    Raises:
        InvalidRequestError: the stack does not exist or has no such output.
    """
    return _output(stack_outputs(stack_name, client=client), stack_name, "StateTableName")


def core_parameters(stack_name: str, *, client: Any = None) -> dict[str, str]:
    """The environment stack's ``Core*`` parameters from the core stack's outputs (``CORE_PARAMETERS``).

    Raises:
        InvalidRequestError: the stack does not exist or lacks one of the outputs (named).
    """
    outputs = stack_outputs(stack_name, client=client)
    return {parameter: _output(outputs, stack_name, key) for parameter, key in CORE_PARAMETERS.items()}


def build_environment(arguments: argparse.Namespace) -> Environment:
    """The ``Environment`` a ``register`` command describes.

    Raises:
        InvalidRequestError: a field breaks its rule (named in the message).
    """
    packages = read_packages(Path(arguments.packages_file)) if arguments.packages_file else ()
    try:
        return Environment.model_validate(
            {
                "environment_id": arguments.environment_id,
                "description": arguments.description,
                "start": {
                    "kind": "lambda",
                    "function_name": function_name(arguments.environment_id),
                    "image_uri": arguments.image,
                },
                "packages": packages,
                "limits": {
                    "timeout_s": min(arguments.timeout_s, MAX_TIMEOUT_S),
                    "memory_mb": min(arguments.memory_mb, MAX_MEMORY_MB),
                },
            }
        )
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        # An id's rule and a length bound in the words of every other refusal, the value as typed.
        from alphaagent.models.rules import string_rule
        from alphaagent.wording import shown_typed

        raise InvalidRequestError(f"{where}: {string_rule(error, shown_typed) or error['msg']}") from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m alphaagent.aws.env_deploy", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)

    def where(command: argparse.ArgumentParser) -> None:
        group = command.add_mutually_exclusive_group(required=True)
        group.add_argument(
            "--core-stack", help="the core stack (template.yaml) whose state table holds the registry"
        )
        group.add_argument("--table", help="the state table itself")

    register = commands.add_parser("register", help="record a deployed environment in the registry")
    where(register)
    register.add_argument("--environment-id", required=True)
    register.add_argument("--image", required=True, help="the ECR image URI the stack was deployed with")
    register.add_argument("--description", default="")
    register.add_argument("--packages-file", help="its main packages, one a line (name==version)")
    register.add_argument("--memory-mb", type=int, default=3008, help="the function's MemorySize (MiB)")
    register.add_argument("--timeout-s", type=float, default=900.0, help="the function's Timeout (s)")

    remove = commands.add_parser("remove", help="mark an environment removed (its specs are refused)")
    where(remove)
    remove.add_argument("--environment-id", required=True)

    listing = commands.add_parser("list", help="the ready environments, builtin first")
    where(listing)
    listing.add_argument("--json", action="store_true")

    parameters = commands.add_parser(
        "parameters", help="the environment stack's Core* parameters, from the core stack's outputs"
    )
    parameters.add_argument("--core-stack", required=True, help="the core stack (template.yaml)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (2 for a bad argument, with one line on stderr)."""
    arguments = _parser().parse_args(argv)
    try:
        if arguments.command == "parameters":
            core = core_parameters(arguments.core_stack)
            print(" ".join(f"{name}={value}" for name, value in core.items()))
            return 0
        environment = build_environment(arguments) if arguments.command == "register" else None
        table = arguments.table or table_of_stack(arguments.core_stack)
        registry = DynamoEnvironmentRegistry(table)
        if environment is not None:
            registry.register(environment)
            name = function_name(environment.environment_id)
            print(f"registered {environment.environment_id} ({name}) in {table}")
        elif arguments.command == "remove":
            registry.remove(arguments.environment_id)
            print(f"removed {arguments.environment_id} from {table}")
        elif arguments.json:
            print(json.dumps([e.model_dump(mode="json") for e in registry.list()], indent=2))
        else:
            for found in registry.list():
                print(f"{found.environment_id}\t{function_name(found.environment_id)}\t{found.description}")
    except InvalidRequestError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
