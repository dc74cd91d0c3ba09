"""Static checks of the deployable stack (issue 4, acceptance "Static checks as tests"): template.yaml and
statemachines/turn.asl.yaml agree with each other, with STYLE §6-§8 and with the code. No AWS."""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cfn import load_template

from alphaagent.aws import store
from coder.worker import CoderMessage

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "template.yaml"
ASL = ROOT / "statemachines" / "turn.asl.yaml"
RUNTIME = "python3.13"


def _template() -> dict[str, Any]:
    return load_template(TEMPLATE)


def _asl() -> dict[str, Any]:
    return yaml.safe_load(ASL.read_text())


def _resources(of_type: str | None = None) -> dict[str, dict[str, Any]]:
    resources: dict[str, dict[str, Any]] = _template()["Resources"]
    return {k: v for k, v in resources.items() if of_type is None or v["Type"] == of_type}


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _task_states() -> dict[str, dict[str, Any]]:
    return {name: s for name, s in _asl()["States"].items() if s["Type"] == "Task"}


# ------------------------------------------------------------------ the state machine


def test_every_substitution_in_the_asl_is_defined_and_every_definition_is_used() -> None:
    # Given the placeholders of the ASL (comments excluded) and the machine's substitutions
    used = {m for s in _strings(_asl()) for m in re.findall(r"\$\{(\w+)\}", s)}
    machine = _resources("AWS::Serverless::StateMachine")["TurnStateMachine"]["Properties"]
    # Then they are the same set
    assert used, "the ASL names no ARN or name by substitution"
    assert used == set(machine["DefinitionSubstitutions"])
    assert machine["DefinitionUri"] == "statemachines/turn.asl.yaml"
    assert machine["Type"] == "STANDARD"
    assert machine["Logging"]["Destinations"], "logging is on"


def test_the_asl_names_no_arn_or_queue_literally() -> None:
    # Every ARN and name arrives by substitution (DESIGN §2); service-integration ARNs are not resources.
    for s in _strings(_asl()):
        if s.startswith("arn:aws:states:::"):
            continue
        assert not re.search(r"arn:aws[\w-]*:|https://sqs\.", s), s


def _successors(state: dict[str, Any]) -> list[str]:
    choices = [c["Next"] for c in state.get("Choices", [])] + [state.get("Default")]
    return [n for n in [state.get("Next"), *choices, *(c["Next"] for c in state.get("Catch", []))] if n]


def test_the_asl_is_standard_jsonpath_and_every_next_exists() -> None:
    asl = _asl()
    states = asl["States"]
    assert asl["QueryLanguage"] == "JSONPath"
    assert asl["StartAt"] in states
    reached = {asl["StartAt"]}
    for name, state in states.items():
        for target in _successors(state):
            assert target in states, f"{name} -> {target}"
            reached.add(target)
        assert _successors(state) or state["Type"] in ("Succeed", "Fail") or state.get("End"), name
    assert reached == set(states), f"unreachable: {set(states) - reached}"


def test_every_task_has_retry_with_jitter_and_a_catch() -> None:
    tasks = _task_states()
    assert {"AcquireLock", "Prepare", "Code", "Finalize", "ReleaseLock"} <= set(tasks)
    for name, task in tasks.items():
        assert task.get("Retry"), f"{name} has no Retry"
        assert task.get("Catch"), f"{name} has no Catch"
        for retrier in task["Retry"]:
            assert retrier.get("JitterStrategy") == "FULL", f"{name}: {retrier['ErrorEquals']}"
            assert retrier.get("MaxDelaySeconds"), f"{name}: backoff without a ceiling"
        assert any("States.ALL" in c["ErrorEquals"] for c in task["Catch"]), f"{name} lets errors escape"


def _path_from(state_name: str) -> list[str]:
    states = _asl()["States"]
    path = [state_name]
    while (nxt := states[path[-1]].get("Next")) is not None:
        assert nxt not in path, f"a loop through {nxt}"
        path.append(nxt)
    return path


def test_every_catch_releases_the_lock_ends_the_turn_and_fails() -> None:
    # Given every Catch of the steps that run while the lock is held
    states = _asl()["States"]
    for name in ("Prepare", "Code", "Finalize"):
        for catcher in states[name]["Catch"]:
            # When the failure path is followed
            path = _path_from(catcher["Next"])
            # Then it releases the lock, then finalizes the turn with the failure, and fails
            params = [str(states[p].get("Parameters")) for p in path]
            release = next(i for i, p in enumerate(params) if "ReleaseLockFunctionArn" in p)
            finalize = next(i for i, p in enumerate(params) if "FinalizeFunctionArn" in p)
            assert release < finalize, path
            assert states[path[finalize]]["Parameters"]["Payload.$"] == "$.failure"
            assert states[path[-1]]["Type"] == "Fail", path
            assert states[path[0]]["Parameters"]["failed_step"] == name
    # The lock was never taken when AcquireLock fails: finalize with the failure, then Fail.
    path = _path_from(states["AcquireLock"]["Catch"][0]["Next"])
    assert "ReleaseLockAfterFailure" not in path and states[path[-1]]["Type"] == "Fail"
    # Should finalize fail, TurnFailed goes on the bus directly, then Fail.
    (fallback,) = states["FinalizeFailedTurn"]["Catch"]
    assert _path_from(fallback["Next"]) == ["EmitTurnFailed", "TurnFailed"]


def test_turn_failed_is_put_on_the_bus_as_the_event_model_describes() -> None:
    emit = _asl()["States"]["EmitTurnFailed"]
    assert emit["Resource"] == "arn:aws:states:::events:putEvents"
    (entry,) = emit["Parameters"]["Entries"]
    assert entry["EventBusName"] == "${EventBusName}"
    assert (entry["Source"], entry["DetailType"]) == ("alphaagent.turn", "TurnFailed")
    from alphaagent.models.events import EVENT_MODELS, EVENT_SOURCES

    assert EVENT_SOURCES["TurnFailed"] == entry["Source"]
    assert entry["Detail"]["error"]["name.$"] == "$.failure.error.Error"
    fields = {key.removesuffix(".$") for key in entry["Detail"]}
    assert fields == set(EVENT_MODELS["TurnFailed"].model_fields) - {"result"}


def test_the_coder_step_waits_for_the_task_token_with_heartbeats() -> None:
    code = _asl()["States"]["Code"]
    assert code["Resource"] == "arn:aws:states:::sqs:sendMessage.waitForTaskToken"
    assert code["Parameters"]["QueueUrl"] == "${CoderQueueUrl}"
    body = code["Parameters"]["MessageBody"]
    assert body["task_token.$"] == "$$.Task.Token"
    # The body is exactly what the worker accepts (CoderMessage forbids unknown fields).
    assert {key.removesuffix(".$") for key in body} <= set(CoderMessage.model_fields)
    assert code["HeartbeatSeconds"] >= 60  # how long it must be: tests/unit/test_static_timing.py
    assert "TimeoutSeconds" in code or "TimeoutSecondsPath" in code


def test_lambda_payloads_are_the_step_models() -> None:
    # The payload each Lambda step gets has only fields of its input model (which forbid unknown ones).
    models = pytest.importorskip("alphaagent.models.aws")
    states = _asl()["States"]
    expected = {
        "AcquireLock": models.AcquireLockInput,
        "Prepare": models.PrepareInput,
        "Finalize": models.FinalizeInput,
        "ReleaseLock": models.ReleaseLockInput,
        "ReleaseLockAfterFailure": models.ReleaseLockInput,
    }
    for name, model in expected.items():
        payload = {key.removesuffix(".$") for key in states[name]["Parameters"]["Payload"]}
        required = {f for f, info in model.model_fields.items() if info.is_required()}
        assert required <= payload <= set(model.model_fields), name
    for name, state in states.items():
        if name.endswith("Failed") and state["Type"] == "Pass":
            failure = {key.removesuffix(".$") for key in state["Parameters"]}
            assert failure <= set(models.FinalizeInput.model_fields), name
    # The Code state's timeout and the skip of a finished turn read fields the prepare step returns.
    assert {"spec_key", "turn_timeout_s", "finished"} <= set(models.PreparedTurn.model_fields)


# ------------------------------------------------------------------ the template


def test_every_handler_names_a_functions_module() -> None:
    handlers = {
        name: r["Properties"]["Handler"]
        for name, r in _resources("AWS::Serverless::Function").items()
        if r["Properties"].get("PackageType", "Zip") == "Zip"
    }
    assert len(handlers) == 8
    for name, handler in handlers.items():
        assert re.fullmatch(r"functions/[a-z][a-z0-9_]*\.lambda_handler", handler), (name, handler)


@pytest.mark.skipif(not (ROOT / "functions").is_dir(), reason="functions/ is not written yet")
def test_every_handler_module_exists_and_defines_lambda_handler() -> None:
    for name, r in _resources("AWS::Serverless::Function").items():
        handler = r["Properties"].get("Handler")
        if handler is None:
            continue
        module = ROOT / (handler.rsplit(".", 1)[0] + ".py")
        assert module.is_file(), f"{name}: {module} is missing"
        tree = ast.parse(module.read_text())
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        defined |= {
            t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)
        }
        assert "lambda_handler" in defined, f"{name}: {module.name} defines no lambda_handler"


def test_python_runtime_is_313_everywhere() -> None:
    from packaging.specifiers import SpecifierSet

    # Template: every zip function runs python3.13 (per function, or from Globals).
    template = _template()
    global_runtime = template.get("Globals", {}).get("Function", {}).get("Runtime")
    for name, r in _resources("AWS::Serverless::Function").items():
        if r["Properties"].get("PackageType", "Zip") == "Zip":
            assert r["Properties"].get("Runtime", global_runtime) == RUNTIME, name
    major_minor = RUNTIME.removeprefix("python")
    # The coder's base image.
    base = re.search(r"^FROM\s+python:(\d+\.\d+)", (ROOT / "coder" / "Dockerfile").read_text(), re.MULTILINE)
    assert base and base.group(1) == major_minor
    # Every environment image: the AWS Lambda Python base image of the same version.
    for dockerfile in (ROOT / "env_images").glob("*/Dockerfile"):
        tags = re.findall(r"^FROM\s+\S*lambda/python:(\d+\.\d+)", dockerfile.read_text(), re.MULTILINE)
        assert tags == [major_minor], dockerfile
    # The package allows it.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert SpecifierSet(project["requires-python"]).contains(f"{major_minor}.0")


def test_state_table_is_the_one_the_store_documents() -> None:
    # Given the table declared in alphaagent/aws/store.py's docstring
    doc = store.__doc__ or ""
    block = doc.split("the SAM template declares the same)::", 1)[1].split("\n\n")[1]
    documented = yaml.safe_load(block)["StateTable"]
    # Then the template declares exactly that table
    declared = _resources()["StateTable"]
    assert declared["Type"] == documented["Type"]
    assert declared["Properties"] == documented["Properties"]


def test_idempotency_table_matches_powertools() -> None:
    props = _resources()["IdempotencyTable"]["Properties"]
    assert props["KeySchema"] == [{"AttributeName": "id", "KeyType": "HASH"}]
    assert props["TimeToLiveSpecification"] == {"AttributeName": "expiration", "Enabled": True}


def test_workspaces_bucket_is_named_versioned_encrypted_and_private() -> None:
    props = _resources()["WorkspacesBucket"]["Properties"]
    assert props["BucketName"] == {"Fn::Sub": "alphaagent-workspaces-${AWS::AccountId}-${AWS::Region}"}
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert all(props["PublicAccessBlockConfiguration"].values())
    assert len(props["PublicAccessBlockConfiguration"]) == 4


def test_queues_have_dead_letter_queues_and_the_starter_reports_partial_failures() -> None:
    resources = _resources()
    for queue in ("SpecQueue", "CoderQueue"):
        redrive = resources[queue]["Properties"]["RedrivePolicy"]
        assert redrive["maxReceiveCount"] == 3
        assert redrive["deadLetterTargetArn"]["Fn::GetAtt"][0] in resources
    (event,) = resources["StartTurnFunction"]["Properties"]["Events"].values()
    assert event["Type"] == "SQS"
    assert event["Properties"]["Queue"] == {"Fn::GetAtt": ["SpecQueue", "Arn"]}
    assert event["Properties"]["FunctionResponseTypes"] == ["ReportBatchItemFailures"]


def test_the_starter_may_read_back_executions_and_put_its_rejections_on_the_bus() -> None:
    # Given the starter's role: it starts executions, reads a same-named one's input back (a reused
    # turn id) and puts SpecRejected on the bus (moto does not enforce IAM, so the template is checked)
    props = _resources()["StartTurnFunction"]["Properties"]
    (policy,) = props["Policies"]
    grants = {action: s["Resource"] for s in policy["Statement"] for action in s["Action"]}
    assert grants["states:StartExecution"] == {"Ref": "TurnStateMachine"}
    assert grants["states:DescribeExecution"]["Fn::Sub"].endswith(":execution:${TurnStateMachine.Name}:*")
    assert grants["events:PutEvents"] == {"Fn::GetAtt": ["EventBus", "Arn"]}
    assert set(grants) == {"states:StartExecution", "states:DescribeExecution", "events:PutEvents"}
    assert props["Environment"]["Variables"]["EVENT_BUS_NAME"] == {"Ref": "EventBus"}


def test_the_builtin_environment_never_retries_and_reports_to_the_bus() -> None:
    props = _resources()["EnvBuiltinFunction"]["Properties"]
    assert props["FunctionName"] == "alphaagent-env-builtin"
    assert props["PackageType"] == "Image"
    config = props["EventInvokeConfig"]
    assert config["MaximumRetryAttempts"] == 0
    for outcome in ("OnSuccess", "OnFailure"):
        assert config["DestinationConfig"][outcome] == {
            "Type": "EventBridge",
            "Destination": {"Fn::GetAtt": ["EventBus", "Arn"]},
        }
    assert _resources()["EventBus"]["Properties"]["Name"] == "alphaagent"


def test_the_coder_may_invoke_only_environment_functions() -> None:
    role = _resources()["CoderTaskRole"]["Properties"]
    (policy,) = role["Policies"]
    statements = {s["Sid"]: s for s in policy["PolicyDocument"]["Statement"]}
    assert statements["InvokeEnvironments"]["Action"] == ["lambda:InvokeFunction"]
    assert statements["InvokeEnvironments"]["Resource"]["Fn::Sub"].endswith(":function:alphaagent-env-*")
    # and only those of this stack, by the tag its env functions carry (not the account's every one)
    assert statements["InvokeEnvironments"]["Condition"] == {
        "StringEquals": {"aws:ResourceTag/alphaagent-stack": {"Ref": "AWS::StackName"}}
    }
    builtin = _resources()["EnvBuiltinFunction"]["Properties"]
    assert builtin["Tags"]["alphaagent-stack"] == {"Ref": "AWS::StackName"}
    # No service-wide wildcard action (s3:*, dynamodb:*) anywhere in the role.
    actions = {a for s in statements.values() for a in s["Action"]}
    assert not [a for a in actions if a.endswith(":*")]


def test_environment_variable_names_carry_their_resource_type() -> None:
    # STYLE §7: STATE_TABLE_NAME, WORKSPACES_BUCKET_NAME, EVENT_BUS_NAME, CODER_QUEUE_URL, ...; the
    # connector allowlists name no AWS resource, so they carry their kind instead (CONNECTOR_*), as
    # the env function's own settings do (ENV_*, EnvSettings: ENV_RUN_NOTICES, whether it can reach
    # SQS), on that function only.
    for name, r in _resources("AWS::Serverless::Function").items():
        own = "|ENV_[A-Z0-9_]+" if name == "EnvBuiltinFunction" else ""
        for variable in r["Properties"].get("Environment", {}).get("Variables", {}):
            assert re.fullmatch(
                r"[A-Z][A-Z0-9_]*_(TABLE_NAME|BUCKET_NAME|BUS_NAME|QUEUE_URL|ARN)|CONNECTOR_[A-Z0-9_]+" + own,
                variable,
            ), (
                name,
                variable,
            )


_SUFFIXES = {
    "AWS::Serverless::Function": "Function",
    "AWS::Serverless::StateMachine": "StateMachine",
    "AWS::SQS::Queue": "Queue",
    "AWS::SQS::QueuePolicy": "Policy",
    "AWS::S3::Bucket": "Bucket",
    "AWS::S3::BucketPolicy": "Policy",
    "AWS::DynamoDB::Table": "Table",
    "AWS::Events::EventBus": "Bus",
    "AWS::Events::Archive": "Archive",
    "AWS::Events::Rule": "Rule",
    "AWS::Logs::LogGroup": "LogGroup",
    "AWS::EC2::SecurityGroupEgress": "Egress",
    "AWS::IAM::Role": "Role",
    "AWS::IAM::Policy": "Policy",
    "AWS::IAM::ManagedPolicy": "Policy",
    "AWS::ECS::Cluster": "Cluster",
    "AWS::ECS::TaskDefinition": "TaskDefinition",
    "AWS::ECS::Service": "Service",
    "AWS::EC2::SecurityGroup": "SecurityGroup",
    "AWS::ApplicationAutoScaling::ScalableTarget": "ScalableTarget",
    "AWS::ApplicationAutoScaling::ScalingPolicy": "Policy",
    "AWS::CloudWatch::Alarm": "Alarm",
}


def test_logical_ids_are_pascal_case_with_a_type_suffix() -> None:
    # STYLE §8: SpecQueue, TurnStateMachine, RecordRunFunction.
    for name, resource in _resources().items():
        assert re.fullmatch(r"(?:[A-Z][a-z0-9]+)+", name), name
        suffix = _SUFFIXES.get(resource["Type"])
        assert suffix, f"{name}: add a suffix for {resource['Type']}"
        assert name.endswith(suffix) and name != suffix, (name, suffix)


def test_samconfig_has_a_default_and_a_prod_environment() -> None:
    config = tomllib.loads((ROOT / "samconfig.toml").read_text())
    assert {"default", "prod"} <= set(config)
    for env in ("default", "prod"):
        assert config[env]["deploy"]["parameters"]["capabilities"]


def test_sam_builds_the_zip_functions_in_the_checkout_not_in_a_copy_of_it() -> None:
    # Given zip functions whose CodeUri is the checkout and whose build is the makefile's build-% rule
    template = _template()
    zips = [
        r
        for r in template["Resources"].values()
        if r["Type"] == "AWS::Serverless::Function" and r["Properties"].get("PackageType") != "Image"
    ]
    assert zips and all(
        r["Properties"].get("CodeUri", template["Globals"]["Function"].get("CodeUri")) == "." for r in zips
    )
    # Then every saved build configuration builds in source: SAM's makefile builder would otherwise
    # copy the whole checkout (virtualenvs included, symlinks followed) once per function first
    config = tomllib.loads((ROOT / "samconfig.toml").read_text())
    for env in ("default", "prod"):
        assert config[env]["build"]["parameters"].get("build_in_source") is True, env


# ------------------------------------------------------------------ the environment images


def _pins(path: Path) -> dict[str, str]:
    """``name == version`` lines of a requirements or constraints file, by canonical name."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r "):  # an included file, relative to this one (as pip reads it)
            pins |= _pins(path.parent / line[3:].strip())
        elif line:
            requirement = Requirement(line)
            [specifier] = requirement.specifier  # exactly one: ==
            assert specifier.operator == "==", f"{path.name}: {line} is not pinned with =="
            pins[canonicalize_name(requirement.name)] = specifier.version
    return pins


def test_the_builtin_environment_image_runs_the_env_handler_on_python_313() -> None:
    # The image the template's EnvBuiltinFunction runs: the Lambda base image of the template's runtime.
    dockerfile = (ROOT / "env_images" / "builtin" / "Dockerfile").read_text()
    major_minor = RUNTIME.removeprefix("python")
    assert re.findall(r"^FROM\s+(\S+)", dockerfile, re.MULTILINE) == [
        f"public.ecr.aws/lambda/python:{major_minor}"
    ]
    [handler] = re.findall(r'^CMD\s+\["([\w.]+)"\]', dockerfile, re.MULTILINE)
    module, function = handler.rsplit(".", 1)
    tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text())
    assert function in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    # The coder runs the same Python.
    coder = (ROOT / "coder" / "Dockerfile").read_text()
    assert re.findall(r"^FROM\s+python:(\d+\.\d+)", coder, re.MULTILINE) == [major_minor]


def test_environment_images_install_into_the_interpreters_own_site_packages() -> None:
    # The zygote and user code run with a scrubbed environment (no PYTHONPATH): packages installed
    # with --target ${LAMBDA_TASK_ROOT} would be importable by the handler but not by the code.
    for dockerfile in (ROOT / "env_images").glob("*/Dockerfile"):
        installs = [line for line in dockerfile.read_text().splitlines() if "pip install" in line]
        assert installs, dockerfile
        assert not any("--target" in line or "-t " in line for line in installs), dockerfile


def test_environment_requirements_are_pinned_as_constraints_pins_them() -> None:
    constraints = _pins(ROOT / "constraints.txt")
    for requirements in (ROOT / "env_images").glob("*/requirements.txt"):
        pins = _pins(requirements)
        assert {"numpy", "pandas", "pyarrow", "matplotlib", "pydantic", "boto3"} <= set(pins), requirements
        shared = {name: version for name, version in pins.items() if name in constraints}
        assert shared == {name: constraints[name] for name in shared}, requirements
