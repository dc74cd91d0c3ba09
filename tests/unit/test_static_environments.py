"""Static checks of the execution environments on AWS (issue 12, items 3-5): the builtin definition
is one list for both backends, the image contract holds for env_images/builtin, and the stack of a
custom environment (env_images/environment.yaml) is builtin's function with another image, importing
only what the core stack exports. Also the audit findings these touch. No AWS."""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from cfn import load_template

from alphaagent.environments import BUILTIN_PACKAGES, builtin_lambda, builtin_local

ROOT = Path(__file__).resolve().parents[2]
ENV_TEMPLATE = ROOT / "env_images" / "environment.yaml"
TOOLS = ROOT / ".venv-tools" / "bin"


def _pins(lines: list[str]) -> dict[str, str]:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            [specifier] = requirement.specifier
            assert specifier.operator == "==", line
            pins[canonicalize_name(requirement.name)] = specifier.version
    return pins


def _core() -> dict[str, Any]:
    return load_template(ROOT / "template.yaml")


def _env() -> dict[str, Any]:
    return load_template(ENV_TEMPLATE)


# ------------------------------------------------------------------ item 3: one builtin definition


def test_the_builtin_packages_are_one_list_for_the_image_the_local_extra_and_the_prompt() -> None:
    listed = _pins((ROOT / "env_images" / "builtin" / "packages.txt").read_text().splitlines())
    extra = _pins(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["env"]
    )
    # The local env extra pins exactly the image's packages (scipy included)
    assert extra == listed and "scipy" in listed
    # and the registry's builtin names the same ones, on both backends
    assert _pins(list(BUILTIN_PACKAGES)) == listed
    assert builtin_lambda().packages == builtin_local().packages == BUILTIN_PACKAGES
    # and the image installs that very file
    requirements = (ROOT / "env_images" / "builtin" / "requirements.txt").read_text()
    assert "-r packages.txt" in requirements.splitlines()
    dockerfile = (ROOT / "env_images" / "builtin" / "Dockerfile").read_text()
    assert "env_images/builtin/packages.txt" in dockerfile
    # and constraints.txt, which `make venv` installs with, agrees
    constraints = _pins((ROOT / "constraints.txt").read_text().splitlines())
    assert {name: constraints.get(name) for name in listed} == listed


# ------------------------------------------------------------------ item 5: the image contract


def _instructions(dockerfile: str) -> list[tuple[str, str]]:
    joined = re.sub(r"\\\n", " ", dockerfile)
    found = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def test_the_builtin_image_meets_the_image_contract() -> None:
    instructions = _instructions((ROOT / "env_images" / "builtin" / "Dockerfile").read_text())
    by = lambda keyword: [rest for k, rest in instructions if k == keyword]  # noqa: E731
    # Python >= 3.11 (a Lambda base image of that version: its runtime interface client)
    [base] = by("FROM")
    version = re.fullmatch(r"public\.ecr\.aws/lambda/python:(\d+)\.(\d+)", base)
    assert version and (int(version[1]), int(version[2])) >= (3, 11), base
    # Packages into the interpreter's own site-packages (no --target, no PYTHONPATH)
    installs = [r for r in by("RUN") if "pip install" in r]
    assert installs and not any("--target" in r or " -t " in r for r in installs)
    assert not any("PYTHONPATH" in r for r in by("ENV"))
    # The alphaagent sandbox and handler, byte-compiled (the task root is read-only at run time)
    assert any(r.startswith("alphaagent/ ${LAMBDA_TASK_ROOT}/alphaagent/") for r in by("COPY"))
    assert any("compileall" in r and "${LAMBDA_TASK_ROOT}/alphaagent" in r for r in by("RUN"))
    # CMD: the env handler
    assert by("CMD") == ['["alphaagent.aws.env_function.lambda_handler"]']
    # Never root at run time: no USER, or a non-root one (Lambda runs its own non-root uid anyway)
    users = by("USER")
    assert not users or users[-1].split(":")[0] not in ("root", "0")
    # /tmp only: nothing declares another writable place
    assert not by("VOLUME")


def test_the_readme_states_the_image_contract_and_how_to_test_an_image() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### The image contract", 1)[1].split("\n## ", 1)[0]
    for needed in (
        "alphaagent.aws.env_function.lambda_handler",
        "3.11",
        "site-packages",
        "/tmp",
        "non-root",
        "sam local invoke",
        "events/env_invocation.json",
        "env_images/environment.yaml",
    ):
        assert needed in section, needed
    assert (ROOT / "events" / "env_invocation.json").exists()


# ------------------------------------------------------------------ item 4: the environment stack


def test_the_environment_stack_takes_the_parameters_the_issue_names() -> None:
    parameters = _env()["Parameters"]
    assert {
        "EnvironmentId",
        "ImageUri",
        "MemorySize",
        "Timeout",
        "EphemeralStorageSize",
        "SubnetIds",
        "CoreStackName",
    } <= set(parameters)
    # The environment id rule of DESIGN §4.1, as the model spells it
    pattern = parameters["EnvironmentId"]["AllowedPattern"]
    assert pattern == r"^[a-z][a-z0-9-]{0,31}$"
    assert re.match(pattern, "gpu-ml") and not re.match(pattern, "GPU") and not re.match(pattern, "1x")


def _function(template: dict[str, Any], logical: str) -> dict[str, Any]:
    properties: dict[str, Any] = template["Resources"][logical]["Properties"]
    return properties


def _actions(properties: dict[str, Any]) -> list[tuple[str, ...]]:
    return sorted(tuple(s["Action"]) for s in properties["Policies"][0]["Statement"])


def test_a_custom_environment_is_builtins_function_with_another_image() -> None:
    builtin = _function(_core(), "EnvBuiltinFunction")
    custom = _function(_env(), "EnvironmentFunction")
    assert custom["FunctionName"] == {"Fn::Sub": "alphaagent-env-${EnvironmentId}"}
    assert custom["PackageType"] == "Image" and custom["ImageUri"] == {"Ref": "ImageUri"}
    # The same asynchronous contract: no retry, both outcomes to the core stack's bus
    bus = {"Ref": "CoreEventBusArn"}
    config = custom["EventInvokeConfig"]
    assert config["MaximumRetryAttempts"] == builtin["EventInvokeConfig"]["MaximumRetryAttempts"] == 0
    for outcome in ("OnSuccess", "OnFailure"):
        assert config["DestinationConfig"][outcome] == {"Type": "EventBridge", "Destination": bus}
    # Tenant isolation, always
    assert custom["TenancyConfig"] == builtin["TenancyConfig"] == {"TenantIsolationMode": "PER_TENANT"}
    # The same least privilege: the very actions builtin's role has, and under the core's boundary
    assert _actions(custom) == _actions(builtin)
    boundary = {"Ref": "CorePermissionsBoundaryArn"}
    assert custom["PermissionsBoundary"] == boundary
    assert builtin["PermissionsBoundary"] == {"Ref": "EnvBoundaryPolicy"}
    # The same variables, from the core stack's outputs
    assert set(custom["Environment"]["Variables"]) >= set(builtin["Environment"]["Variables"])
    # and the tag by which the core stack's coder may invoke it
    assert custom["Tags"]["alphaagent-stack"] == {"Ref": "CoreStackName"}


def _imports(value: Any) -> list[str]:
    if isinstance(value, dict):
        if set(value) == {"Fn::ImportValue"}:
            return [value["Fn::ImportValue"]["Fn::Sub"]]
        return [name for item in value.values() for name in _imports(item)]
    if isinstance(value, list):
        return [name for item in value for name in _imports(item)]
    return []


def test_the_environment_stack_imports_nothing_that_would_lock_the_core_stack() -> None:
    # An import locks the export it reads (CloudFormation refuses to change or delete it), so the
    # core's values come in as parameters instead
    assert _imports(_env()["Resources"]) == []


def test_every_core_parameter_of_the_environment_stack_is_an_output_of_the_core_stack() -> None:
    from alphaagent.aws.env_deploy import CORE_PARAMETERS

    parameters = {
        name for name in _env()["Parameters"] if name.startswith("Core") and name != "CoreStackName"
    }
    assert parameters == set(CORE_PARAMETERS)
    assert set(CORE_PARAMETERS.values()) <= set(_core()["Outputs"])


def test_env_deploy_parameters_reads_the_core_stacks_outputs(capsys: pytest.CaptureFixture[str]) -> None:
    from alphaagent.aws import env_deploy

    class FakeCloudFormation:
        def __init__(self, outputs: dict[str, str]) -> None:
            self.outputs = outputs

        def describe_stacks(self, StackName: str) -> dict[str, Any]:
            entries = [{"OutputKey": k, "OutputValue": v} for k, v in self.outputs.items()]
            return {"Stacks": [{"StackName": StackName, "Outputs": entries}]}

    # Given a core stack with every output, and one deployed before it had the boundary output
    outputs = {output: f"value-of-{output}" for output in env_deploy.CORE_PARAMETERS.values()}
    found = env_deploy.core_parameters("alphaagent", client=FakeCloudFormation(outputs))
    assert found == {name: f"value-of-{output}" for name, output in env_deploy.CORE_PARAMETERS.items()}
    older = {k: v for k, v in outputs.items() if k != "EnvPermissionsBoundaryArn"}

    # When the parameters are asked of the older one; Then one line names the missing output
    with pytest.raises(env_deploy.InvalidRequestError, match="has no EnvPermissionsBoundaryArn output"):
        env_deploy.core_parameters("alphaagent", client=FakeCloudFormation(older))


def test_the_boundary_allows_what_every_environment_role_is_given() -> None:
    statements = _function(_core(), "EnvBuiltinFunction")["Policies"][0]["Statement"]
    boundary = _core()["Resources"]["EnvBoundaryPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    bounded = {a for s in boundary for a in s["Action"]}
    assert {a for s in statements for a in s["Action"]} <= bounded
    # and what SAM attaches to a function's role (logs, traces, the VPC option's network interfaces)
    assert {"logs:PutLogEvents", "xray:PutTraceSegments", "ec2:CreateNetworkInterface"} <= bounded


def _tool(name: str) -> Path:
    tool = TOOLS / name
    if not tool.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{tool} is missing: run `make tools`")
        pytest.skip(f"{tool} is missing: run `make tools`")
    return tool


LINT_ENV = {
    **os.environ,
    "SAM_CLI_TELEMETRY": "0",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
}


@pytest.mark.slow
def test_the_environment_template_lints_clean() -> None:
    # As `make lint` runs them: cfn-lint with the serverless rules. `make lint` then runs `sam validate
    # --lint`, which is cfnlint's default rules (cfnlint.api.lint) over the same text in the same region
    # (AWS_REGION / AWS_DEFAULT_REGION) with the same cfnlint of the tools virtualenv: a subset of this
    # pass, which runs the default rules and appends the serverless ones. A second process would load
    # SAM CLI and every rule again (~5 CPU-s and half a minute under load) to find nothing new.
    linted = subprocess.run(
        [str(_tool("cfn-lint")), "--append-rules", "cfn_lint_serverless.rules", "--", str(ENV_TEMPLATE)],
        capture_output=True,
        text=True,
        timeout=300,
        env=LINT_ENV,
        check=False,
    )
    assert linted.returncode == 0, linted.stdout + linted.stderr


def _make(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_env_deploy_deploys_the_environment_stack_then_registers_it() -> None:
    image = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/alphaagent-env-gpu-ml:abc"
    dry = _make("-n", "env-deploy", "ENV=gpu-ml", f"IMAGE={image}")
    assert dry.returncode == 0, dry.stderr
    deploy, register = dry.stdout.index("sam deploy"), dry.stdout.index("alphaagent.aws.env_deploy register")
    assert deploy < register
    assert "--template-file env_images/environment.yaml" in dry.stdout
    assert "--stack-name alphaagent-env-gpu-ml" in dry.stdout
    assert f"EnvironmentId=gpu-ml ImageUri={image}" in dry.stdout
    assert "CoreStackName=alphaagent" in dry.stdout and "--core-stack alphaagent" in dry.stdout


@pytest.mark.parametrize("arguments", [["ENV=builtin", "IMAGE=x"], ["ENV=Bad_Id", "IMAGE=x"], ["ENV=gpu-ml"]])
def test_env_deploy_refuses_bad_arguments_before_anything_runs(arguments: list[str]) -> None:
    refused = _make("env-deploy", *arguments)
    assert refused.returncode != 0
    assert refused.stderr.startswith("make env-deploy: "), refused.stderr
    assert "sam deploy" not in refused.stdout


def test_make_images_builds_every_environment_dockerfile() -> None:
    listed = _make("-s", "--eval", "print-env-images: ; @echo $(ENV_IMAGES)", "print-env-images")
    names = {p.parent.name for p in (ROOT / "env_images").glob("*/Dockerfile")}
    assert set(listed.stdout.split()) == names and "builtin" in names
    dry = _make("-n", "images", "ECR_REGISTRY=123456789012.dkr.ecr.eu-west-1.amazonaws.com")
    assert "-f env_images/$name/Dockerfile" in dry.stdout


# ------------------------------------------------------------------ audit findings


def _asl() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "statemachines" / "turn.asl.yaml").read_text())
    return loaded


def test_every_retried_lambda_invoke_retries_a_client_execution_timeout() -> None:
    # Step Functions' Lambda integration names a timed-out invoke Lambda.ClientExecutionTimeoutException.
    retried = 0
    for name, state in _asl()["States"].items():
        if state.get("Resource") != "arn:aws:states:::lambda:invoke":
            continue
        for retrier in state["Retry"]:
            if any(e.startswith("Lambda.") for e in retrier["ErrorEquals"]):
                retried += 1
                assert "Lambda.ClientExecutionTimeoutException" in retrier["ErrorEquals"], name
    assert retried >= 6


def test_the_scope_busy_comment_states_what_the_retrier_waits() -> None:
    text = (ROOT / "statemachines" / "turn.asl.yaml").read_text()
    [retrier] = [
        r for r in _asl()["States"]["AcquireLock"]["Retry"] if r["ErrorEquals"] == ["ScopeBusyError"]
    ]
    waits = [
        min(retrier["MaxDelaySeconds"], retrier["IntervalSeconds"] * retrier["BackoffRate"] ** n)
        for n in range(retrier["MaxAttempts"])
    ]
    assert retrier["JitterStrategy"] == "FULL"  # each wait uniform in [0, its bound]: half on average
    comment = text.split("ErrorEquals: [ScopeBusyError]")[0].rsplit("Retry:", 1)[1]
    assert f"~{round(sum(waits) / 2 / 60)} min in total on average" in comment, comment
    assert f"~{round(sum(waits) / 60)} min at most" in comment, comment


def _coder_statements() -> dict[str, dict[str, Any]]:
    role = _core()["Resources"]["CoderTaskRole"]["Properties"]
    return {s["Sid"]: s for s in role["Policies"][0]["PolicyDocument"]["Statement"]}


def test_the_coder_may_read_its_inference_profile() -> None:
    statement = _coder_statements()["ReadInferenceProfile"]
    assert statement["Action"] == ["bedrock:GetInferenceProfile"]
    ends = sorted(resource["Fn::Sub"].rsplit(":", 1)[-1] for resource in statement["Resource"])
    assert ends == ["application-inference-profile/*", "inference-profile/*"]


def test_the_coder_may_invoke_an_application_inference_profile_and_what_it_routes_to() -> None:
    # An application inference profile's ARN as CoderModelId (Bedrock authorizes InvokeModel on the
    # profile and on the foundation models and system profiles it routes to)
    statement = _coder_statements()["InvokeModel"]
    ends = {resource["Fn::Sub"].rsplit(":", 1)[-1] for resource in statement["Resource"]}
    assert ends == {"foundation-model/*", "inference-profile/*", "application-inference-profile/*"}
    assert statement["Action"] == ["bedrock:InvokeModel", "bedrock:InvokeModelWithResponseStream"]


def test_the_connectors_may_decrypt_sse_kms_objects_through_s3_only() -> None:
    policy = _core()["Resources"]["ConnectorS3ReadPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    [decrypt] = [s for s in policy if s["Action"] == ["kms:Decrypt"]]
    assert decrypt["Condition"] == {"StringLike": {"kms:ViaService": "s3.*.amazonaws.com"}}
    assert decrypt["Resource"]["Fn::Sub"].endswith(":key/*")


def test_an_environment_in_a_vpc_without_an_sqs_endpoint_skips_run_notices() -> None:
    # Both stacks tell the function whether it has a route to SQS (no VPC, or the VPC's SQS endpoint)
    core, env = _core(), _env()
    assert _function(core, "EnvBuiltinFunction")["Environment"]["Variables"]["ENV_RUN_NOTICES"] == {
        "Fn::If": ["EnvReachesSqs", "true", "false"]
    }
    assert _function(env, "EnvironmentFunction")["Environment"]["Variables"]["ENV_RUN_NOTICES"] == {
        "Fn::If": ["ReachesSqs", "true", "false"]
    }
    # and the endpoint's egress exists only with the endpoint named
    assert core["Resources"]["EnvSqsEndpointEgress"]["Condition"] == "HasEnvSqsEndpoint"
    assert env["Resources"]["SqsEndpointEgress"]["Condition"] == "HasSqsEndpoint"
    coder = core["Resources"]["CoderTaskDefinition"]["Properties"]["ContainerDefinitions"][0]
    [notices] = [v for v in coder["Environment"] if v["Name"] == "RUN_NOTICES"]
    assert notices["Value"] == {"Fn::If": ["EnvReachesSqs", "true", "false"]}


def test_env_deploy_parameters_prints_them_as_sam_takes_them(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from alphaagent.aws import env_deploy

    # Given the core stack's outputs
    outputs = {output: f"v-{output}" for output in env_deploy.CORE_PARAMETERS.values()}
    monkeypatch.setattr(env_deploy, "stack_outputs", lambda stack_name, client=None: outputs)

    # When make env-deploy asks for the parameters; Then one line of Key=Value pairs, exit 0
    assert env_deploy.main(["parameters", "--core-stack", "alphaagent"]) == 0
    line = capsys.readouterr().out.strip()
    assert dict(pair.split("=", 1) for pair in line.split(" ")) == {
        name: f"v-{output}" for name, output in env_deploy.CORE_PARAMETERS.items()
    }
