"""Static checks of what would break a real deploy or a real turn but that moto never sees: the
template's network, scaling, tenancy and concurrency settings, the saved SAM configuration, the
build's platform, and the README's `sam local invoke` example (issue 9, section 2)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
from cfn import load_template

from alphaagent.aws import backend, settings
from alphaagent.domain.backend import ConnectorSettings
from alphaagent.models.common import ConversationScope, NodeScope

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "template.yaml"
README = ROOT / "README.md"


def _template() -> dict[str, Any]:
    return load_template(TEMPLATE)


def _resource(name: str) -> dict[str, Any]:
    resource: dict[str, Any] = _template()["Resources"][name]
    return resource


# ------------------------------------------------------------------ the no-egress option


def test_the_no_egress_security_group_allows_https_to_the_s3_and_dynamodb_gateway_endpoints_only() -> None:
    # The env function syncs with S3 and reads the scope's lease in DynamoDB; gateway endpoints are
    # reached at the addresses of their AWS-managed prefix lists, so egress must name those.
    group = _resource("EnvSecurityGroup")
    assert group["Condition"] == "HasEnvSubnets"
    rules = group["Properties"]["SecurityGroupEgress"]
    assert {json.dumps(rule.get("DestinationPrefixListId"), sort_keys=True) for rule in rules} == {
        json.dumps({"Ref": "EnvS3PrefixListId"}),
        json.dumps({"Ref": "EnvDynamoDbPrefixListId"}),
    }
    for rule in rules:
        assert (rule["IpProtocol"], rule["FromPort"], rule["ToPort"]) == ("tcp", 443, 443), rule
        assert not {"CidrIp", "CidrIpv6", "DestinationSecurityGroupId"} & set(rule), rule


def test_subnets_without_the_endpoints_prefix_lists_are_refused_before_anything_is_created() -> None:
    template = _template()
    for name in ("EnvS3PrefixListId", "EnvDynamoDbPrefixListId"):
        parameter = template["Parameters"][name]
        assert re.fullmatch(parameter["AllowedPattern"], "pl-0123456789abcdef0")
        assert re.fullmatch(parameter["AllowedPattern"], "")
        assert not re.fullmatch(parameter["AllowedPattern"], "sg-0123456789abcdef0")
    rule = template["Rules"]["EnvEndpointsNamed"]
    assert "EnvSubnetIds" in json.dumps(rule["RuleCondition"])
    asserted = json.dumps(rule["Assertions"])
    assert "EnvS3PrefixListId" in asserted and "EnvDynamoDbPrefixListId" in asserted


# ------------------------------------------------------------------ the coder service


def test_the_coder_service_leaves_its_count_to_autoscaling() -> None:
    # A DesiredCount is applied again on every stack update: it would stop the tasks running turns.
    service = _resource("CoderService")["Properties"]
    assert "DesiredCount" not in service
    target = _resource("CoderScalableTarget")["Properties"]
    assert target["ScalableDimension"] == "ecs:service:DesiredCount"
    assert "CoderService" in json.dumps(target["ResourceId"])


# ------------------------------------------------------------------ the env function


def test_the_env_function_is_always_in_tenant_isolation_mode() -> None:
    # User code can reach the Runtime API: an execution environment must never serve another scope.
    properties = _resource("EnvBuiltinFunction")["Properties"]
    assert properties["TenancyConfig"] == {"TenantIsolationMode": "PER_TENANT"}
    assert "EnvTenantIsolation" not in _template()["Parameters"]
    task = _resource("CoderTaskDefinition")["Properties"]["ContainerDefinitions"][0]
    assert "ENV_TENANT_ISOLATION" not in {variable["Name"] for variable in task["Environment"]}


def test_the_coder_invokes_environments_with_the_scope_as_tenant_id(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "STATE_TABLE_NAME": "t",
        "WORKSPACES_BUCKET_NAME": "b",
        "EVENT_BUS_NAME": "e",
        "ENV_TENANT_ISOLATION": "Disabled",  # an old task definition's variable changes nothing
    }.items():
        monkeypatch.setenv(name, value)
    settings.get_lambda_settings.cache_clear()
    backend.coder_backend.cache_clear()
    try:
        executor = backend.coder_backend().executor
        assert getattr(executor, "tenant_isolation", None) is True
    finally:
        settings.get_lambda_settings.cache_clear()
        backend.coder_backend.cache_clear()


def test_the_env_function_reserves_its_concurrency_unless_told_not_to() -> None:
    template = _template()
    properties = template["Resources"]["EnvBuiltinFunction"]["Properties"]
    assert properties["ReservedConcurrentExecutions"] == {
        "Fn::If": ["HasEnvReservedConcurrency", {"Ref": "EnvReservedConcurrency"}, {"Ref": "AWS::NoValue"}]
    }
    parameter = template["Parameters"]["EnvReservedConcurrency"]
    assert parameter["Type"] == "Number" and parameter["Default"] > 0 and parameter["MinValue"] == 0
    # 0 would throttle every run: it means "reserve none", never ReservedConcurrentExecutions: 0.
    assert template["Conditions"]["HasEnvReservedConcurrency"] == {
        "Fn::Not": [{"Fn::Equals": [{"Ref": "EnvReservedConcurrency"}, 0]}]
    }


def test_each_saved_environment_reserves_a_run_for_every_turn_that_can_be_under_way() -> None:
    # Runs beyond the reservation are throttled, and a throttled run's wait counts against the
    # coder's start-up margin: the reservation covers CoderMaxTasks x CoderWorkerConcurrency.
    defaults = {name: p.get("Default") for name, p in _template()["Parameters"].items()}
    config = tomllib.loads((ROOT / "samconfig.toml").read_text())
    saved = {}
    for env in ("default", "prod"):
        overrides = config[env]["deploy"]["parameters"].get("parameter_overrides", "")
        saved[env] = values = defaults | dict(item.split("=", 1) for item in overrides.split())
        most_runs = int(values["CoderMaxTasks"]) * int(values["CoderWorkerConcurrency"])
        reserved = int(values["EnvReservedConcurrency"])
        # 0 reserves none (the first-deploy configuration); any reservation covers every run.
        assert reserved == 0 or reserved >= most_runs, (env, most_runs)
    # The configuration a first `make deploy` uses reserves none: on a new account (a Lambda quota below
    # 100 + the reservation) any reservation fails the deploy with UnreservedConcurrentExecution.
    assert int(saved["default"]["EnvReservedConcurrency"]) == 0
    assert int(saved["prod"]["EnvReservedConcurrency"]) > 0
    assert (
        defaults["EnvReservedConcurrency"] >= defaults["CoderMaxTasks"] * defaults["CoderWorkerConcurrency"]
    )


# ------------------------------------------------------------------ connectors


def test_the_connector_allowlists_reach_the_prepare_step_and_the_coder() -> None:
    expected = {
        "CONNECTOR_HTTP_HOSTS": {"Fn::Join": [",", {"Ref": "ConnectorHttpHosts"}]},
        "CONNECTOR_S3_PREFIXES": {"Fn::Join": [",", {"Ref": "ConnectorS3Prefixes"}]},
    }
    prepare = _resource("PrepareTurnFunction")["Properties"]["Environment"]["Variables"]
    assert {name: prepare[name] for name in expected} == expected
    task = _resource("CoderTaskDefinition")["Properties"]["ContainerDefinitions"][0]
    coder = {variable["Name"]: variable["Value"] for variable in task["Environment"]}
    assert {name: coder[name] for name in expected} == expected
    # The s3 connector's reads are granted to those two, on exactly the listed prefixes, and only
    # when there are some.
    grant = _resource("ConnectorS3ReadPolicy")
    assert grant["Condition"] == "HasConnectorS3Prefixes"
    assert grant["Properties"]["Roles"] == [{"Ref": "PrepareTurnFunctionRole"}, {"Ref": "CoderTaskRole"}]
    [statement] = [
        s for s in grant["Properties"]["PolicyDocument"]["Statement"] if s["Action"] == ["s3:GetObject"]
    ]
    assert statement["Action"] == ["s3:GetObject"]
    assert '{"Ref": "ConnectorS3Prefixes"}' in json.dumps(statement["Resource"])


def _resolve(value: Any, parameters: dict[str, Any]) -> Any:
    """Just the intrinsics the connector grant uses (Ref to a parameter, Join, Sub with a map, Split)."""
    if isinstance(value, dict) and len(value) == 1:
        [(name, argument)] = value.items()
        if name == "Ref":
            return parameters[argument]
        if name == "Fn::Join":
            return argument[0].join(_resolve(argument[1], parameters))
        if name == "Fn::Split":
            return _resolve(argument[1], parameters).split(argument[0])
        if name == "Fn::Sub":
            text, names = argument
            resolved = {key: _resolve(item, parameters) for key, item in names.items()}
            return re.sub(r"\$\{(\w+)\}", lambda m: resolved[m.group(1)], text)
    return value


def test_the_connector_grant_is_exactly_the_listed_prefixes() -> None:
    # Given two allowed entries, as the settings accept them (bucket/prefix, bucket/ for a bucket)
    statements = _resource("ConnectorS3ReadPolicy")["Properties"]["PolicyDocument"]["Statement"]
    [statement] = [s for s in statements if s["Action"] == ["s3:GetObject"]]
    parameters = {"ConnectorS3Prefixes": ["open-data/penguins/", "whole-bucket/"]}
    # When CloudFormation resolves the resource list; Then each entry is one object ARN pattern
    assert _resolve(statement["Resource"], parameters) == [
        "arn:aws:s3:::open-data/penguins/*",
        "arn:aws:s3:::whole-bucket/*",
    ]


@pytest.mark.parametrize(
    ("parameter", "variable", "value"),
    [
        ("ConnectorHttpHosts", "CONNECTOR_HTTP_HOSTS", "data.example.org"),
        ("ConnectorHttpHosts", "CONNECTOR_HTTP_HOSTS", "https://data.example.org"),
        ("ConnectorHttpHosts", "CONNECTOR_HTTP_HOSTS", "data.example.org:8443"),
        ("ConnectorHttpHosts", "CONNECTOR_HTTP_HOSTS", "Data.Example.org"),
        ("ConnectorS3Prefixes", "CONNECTOR_S3_PREFIXES", "open-data/penguins/"),
        ("ConnectorS3Prefixes", "CONNECTOR_S3_PREFIXES", "whole-bucket/"),
        ("ConnectorS3Prefixes", "CONNECTOR_S3_PREFIXES", "open-data"),
        ("ConnectorS3Prefixes", "CONNECTOR_S3_PREFIXES", "open-data/*"),
    ],
)
def test_the_stack_refuses_at_deploy_what_the_functions_would_refuse(
    parameter: str, variable: str, value: str
) -> None:
    # CloudFormation applies a list parameter's AllowedPattern to each entry: a malformed entry is
    # refused before ConnectorS3ReadPolicy grants anything, exactly as the settings would refuse it.
    pattern = _template()["Parameters"][parameter]["AllowedPattern"]
    accepted_by_stack = re.fullmatch(pattern, value) is not None
    try:
        settings.LambdaSettings.model_validate({variable: value})
        accepted_by_function = True
    except ValueError:
        accepted_by_function = False
    assert accepted_by_stack == accepted_by_function, (value, accepted_by_stack)


def test_the_functions_backend_has_the_stacks_allowlists(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given the variables the template sets from ConnectorHttpHosts and ConnectorS3Prefixes
    monkeypatch.setenv("STATE_TABLE_NAME", "t")
    monkeypatch.setenv("CONNECTOR_HTTP_HOSTS", "data.example.org, api.example.com")
    monkeypatch.setenv("CONNECTOR_S3_PREFIXES", "open-data/penguins/,whole-bucket/")
    settings.get_lambda_settings.cache_clear()
    backend.get_backend.cache_clear()
    try:
        # When a function builds its backend; Then its connectors allow exactly those
        assert backend.get_backend().connectors == ConnectorSettings(
            http_hosts=("data.example.org", "api.example.com"),
            s3_prefixes=("open-data/penguins/", "whole-bucket/"),
        )
    finally:
        settings.get_lambda_settings.cache_clear()
        backend.get_backend.cache_clear()


def test_no_allowlist_allows_nothing() -> None:
    assert settings.LambdaSettings.model_validate({}).connectors() == ConnectorSettings()


@pytest.mark.parametrize(
    ("name", "value", "rule"),
    [
        ("CONNECTOR_HTTP_HOSTS", "https://data.example.org", "DNS host name"),
        ("CONNECTOR_HTTP_HOSTS", "data.example.org:8443", "DNS host name"),
        ("CONNECTOR_S3_PREFIXES", "open-data", "bucket/prefix"),
        ("CONNECTOR_S3_PREFIXES", "open-data/*", "bucket/prefix"),
    ],
)
def test_a_malformed_allowlist_entry_is_refused_naming_the_variable(name: str, value: str, rule: str) -> None:
    # An S3 entry becomes the IAM resource arn:aws:s3:::{entry}*: no slash or a wildcard would widen it.
    with pytest.raises(ValueError, match=rf"{name}[\s\S]*{rule}"):
        settings.LambdaSettings.model_validate({name: value})


# ------------------------------------------------------------------ deploy and build


def test_every_saved_environment_gets_past_sams_image_repository_check() -> None:
    # sam deploy stops at "Missing option --image-repositories" when the template has an image
    # function and the configuration names no repository for it (samcli image_repository_validation).
    images = [
        name
        for name, r in _template()["Resources"].items()
        if r["Type"] == "AWS::Serverless::Function" and r["Properties"].get("PackageType") == "Image"
    ]
    assert images, "the template has image functions"
    config = tomllib.loads((ROOT / "samconfig.toml").read_text())
    for env in ("default", "prod"):
        deploy = config[env]["deploy"]["parameters"]
        options = {"image_repositories", "image_repository", "resolve_image_repos"} & {
            key for key, value in deploy.items() if value
        }
        assert len(options) == 1, (env, options)


def _make_dry_run(*args: str) -> str:
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    done = subprocess.run(
        [make, "--no-print-directory", "-n", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize(
    ("architecture", "wheels"), [("x86_64", "manylinux2014_x86_64"), ("arm64", "manylinux2014_aarch64")]
)
def test_the_zip_build_installs_wheels_for_the_saved_architecture(
    tmp_path: Path, architecture: str, wheels: str
) -> None:
    # Given a saved configuration whose Architecture is `architecture`
    samconfig = tmp_path / "samconfig.toml"
    samconfig.write_text(
        f'[default.deploy.parameters]\nparameter_overrides = "LogRetentionDays=14 Architecture={architecture}"\n'
    )
    # When sam build would run the makefile build of a function (BuildMethod: makefile)
    commands = _make_dry_run(
        "build-StartTurnFunction", f"ARTIFACTS_DIR={tmp_path / 'out'}", f"SAMCONFIG={samconfig}"
    )
    # Then the wheels are those of that architecture, and no other
    [other] = {"manylinux2014_x86_64", "manylinux2014_aarch64"} - {wheels}
    assert f"--platform {wheels} " in commands and other not in commands
    # And sam build, the images and the deploy are given the same architecture
    build = _make_dry_run("build", f"SAMCONFIG={samconfig}", "LINT_STAMP=")
    assert f"--parameter-overrides Architecture={architecture}" in build
    platform = {"x86_64": "linux/amd64", "arm64": "linux/arm64"}[architecture]
    images = _make_dry_run(
        "images", f"SAMCONFIG={samconfig}", "ECR_REGISTRY=123456789012.dkr.ecr.eu-west-1.amazonaws.com"
    )
    assert f"docker build --platform {platform} " in images


def test_an_unknown_architecture_stops_the_build() -> None:
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    done = subprocess.run(
        [make, "build-StartTurnFunction", "ARTIFACTS_DIR=/nonexistent/out", "ARCHITECTURE=sparc"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "ARCHITECTURE must be x86_64 or arm64" in done.stderr


# ------------------------------------------------------------------ sam local invoke, as the README says


def _scope_key(scope: dict[str, str]) -> str:
    """The scope key of an event's ``scope`` (the tenant id the coder passes)."""
    model = NodeScope if "node_id" in scope else ConversationScope
    return model.model_validate(scope).key


def _readme_env_json() -> dict[str, dict[str, str]]:
    text = README.read_text()
    section = text[text.index("### Debug a function with `sam local invoke`") :]
    block = re.search(r"```json\n(.*?)```", section, re.S)
    assert block, "the README's sam local invoke section shows its env.json"
    document: dict[str, dict[str, str]] = json.loads(block.group(1))
    return document


def _declared(function: dict[str, Any]) -> set[str]:
    names = set(_template()["Globals"]["Function"].get("Environment", {}).get("Variables", {}))
    return names | set(function["Properties"].get("Environment", {}).get("Variables", {}))


def test_every_variable_of_the_readmes_env_json_is_one_a_function_declares() -> None:
    # sam local invoke passes a function only the variables the template declares on it.
    functions = {
        name: r for name, r in _template()["Resources"].items() if r["Type"] == "AWS::Serverless::Function"
    }
    env = _readme_env_json()
    declared_anywhere = set().union(*(_declared(f) for f in functions.values()))
    for scope, variables in env.items():
        targets = declared_anywhere if scope == "Parameters" else _declared(functions[scope])
        assert set(variables) <= targets, (scope, set(variables) - targets)


def test_every_readme_invocation_gets_every_resource_its_function_needs() -> None:
    # Each `sam local invoke <Function> -e events/<file>` of the README: the function and the event
    # exist, and every variable of the function that names a resource of the stack (which SAM cannot
    # resolve locally) comes from env.json.
    resources = _template()["Resources"]
    env = _readme_env_json()
    section = README.read_text().split("### Debug a function with `sam local invoke`", 1)[1]
    commands = section.replace("\\\n", " ")  # continuation lines joined, as the shell does
    invocations = re.findall(r"sam local invoke (\w+) -e (events/\S+)([^\n]*)", commands)
    assert invocations
    for function, event, rest in invocations:
        assert resources[function]["Type"] == "AWS::Serverless::Function", function
        assert (ROOT / event).is_file(), event
        # SAM refuses to invoke a function in tenant isolation mode without a tenant id: the scope key.
        tenant = re.search(r"--tenant-id (\S+)", rest)
        if "TenancyConfig" in resources[function]["Properties"]:
            assert tenant, f"{function} is in tenant isolation mode: the README must give --tenant-id"
            scope = _scope_key(json.loads((ROOT / event).read_text())["scope"])
            assert tenant.group(1) == scope, (function, tenant.group(1), scope)
        else:
            assert tenant is None, f"{function} is not in tenant isolation mode: SAM refuses --tenant-id"
        given = set(env.get("Parameters", {})) | set(env.get(function, {}))
        for name, value in (
            resources[function]["Properties"].get("Environment", {}).get("Variables", {}).items()
        ):
            refs = re.findall(r'"(?:Ref|Fn::GetAtt)": \[?"(\w+)', json.dumps(value))
            if any(ref in resources for ref in refs):
                assert name in given, f"{function}: {name} names a stack resource; env.json must give it"
