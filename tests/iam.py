"""IAM as AWS would enforce it, for the tests that run components under moto (issue 9).

moto enforces no IAM, so a role missing a grant passes every moto test and fails on the first deploy.
This harness closes that gap:

1. ``template.yaml`` is translated by ``samtranslator`` (the tools virtualenv, ``make tools``: SAM
   pins its own pydantic) into plain CloudFormation, so SAM policy templates, event-source policies
   and managed policy ARNs are what CloudFormation would create. Intrinsics (``Ref``, ``Fn::GetAtt``,
   ``Fn::Sub``, ``Fn::If``...) are resolved with the test's own resource names.
2. Every boto3 call goes through botocore's ``before-parameter-build`` / ``before-call`` /
   ``after-call`` events on the default session. The call is attributed to a component (a function,
   the state machine, the coder task) by :meth:`Iam.acting_as` (inherited by the threads the
   component starts), or to the state machine when moto's Step Functions interpreter makes it (its
   clients sign with the access key ``ak``). Calls the harness itself makes (setup, assertions)
   belong to no component and are not checked.
3. The operation is mapped to the IAM actions and resources AWS authorizes for it (the Service
   Authorization Reference; :func:`required`): ``CopyObject`` needs ``s3:GetObject`` on the source
   (``s3:GetObjectVersion`` when it names a version) and ``s3:PutObject`` on the target;
   ``TransactWriteItems`` needs each item's own action; a ``GetObject``/``HeadObject`` of a missing key
   answers 403 instead of 404 without ``s3:ListBucket`` on the bucket. An operation without a mapping
   is refused too, so a new call cannot slip past unchecked.
4. A call the component's role does not allow fails as AWS fails it (``AccessDenied``), and is
   recorded in :attr:`Iam.denied` with the component, role, action and resource; the fixtures assert
   the list is empty.

Further templates deployed against the core one (an environment's ``env_images/environment.yaml``)
join it with ``Iam(..., stacks=...)``: their ``Fn::ImportValue`` resolves to the core's exports, and
``stack_parameters`` gives their parameters the core's outputs.

Not modelled: resource-based policies (bucket and queue policies; ours only deny plain HTTP or allow
AWS services), permission boundaries, SCPs, KMS key policies, and condition keys other than the few
:func:`required` supplies (among them ``aws:ResourceTag/*`` of an invoked function, from moto; a
condition on a key the request does not carry is false, as in IAM).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import json
import os
import re
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import cfn

ROOT = Path(__file__).resolve().parents[1]
TOOLS_PYTHON = ROOT / ".venv-tools" / "bin" / "python"

# ----------------------------------------------------------------------------- translation

_TRANSLATE = r"""
import json, sys
from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse

class NoManagedPolicies:
    # Policies that name a managed policy by name need an IAM lookup; the template uses ARNs only.
    def load(self):
        return {}

template = yaml_parse(sys.stdin.read())
for resource in template.get("Resources", {}).values():
    properties = resource.get("Properties", {})
    # Local paths are what `sam build` rewrites into S3 locations; the translation needs one.
    if isinstance(properties.get("CodeUri"), str):
        properties["CodeUri"] = "s3://alphaagent-build/code.zip"
    if isinstance(properties.get("DefinitionUri"), str):
        properties["DefinitionUri"] = "s3://alphaagent-build/definition.json"
print(json.dumps(transform(template, {}, NoManagedPolicies())))
"""


@functools.cache
def translate(template_text: str, region: str) -> dict[str, Any]:
    """``template_text`` (a SAM template) as CloudFormation, translated by ``samtranslator`` in the
    tools virtualenv (``make tools``): the roles, their inline policies and managed policy ARNs as
    CloudFormation would create them."""
    digest = hashlib.sha256(f"{region}\n{template_text}\n{_TRANSLATE}".encode()).hexdigest()[:32]
    cached = Path(tempfile.gettempdir()) / f"alphaagent-sam-{digest}.json"
    if cached.exists():  # translation takes seconds; each test process would repeat it
        kept: dict[str, Any] = json.loads(cached.read_text())
        return kept
    if not TOOLS_PYTHON.exists():
        raise RuntimeError(
            f"{TOOLS_PYTHON} is missing: run `make tools` (the IAM harness translates template.yaml "
            "with samtranslator, which lives in the tools virtualenv)"
        )
    done = subprocess.run(
        [str(TOOLS_PYTHON), "-c", _TRANSLATE],
        input=template_text,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "AWS_DEFAULT_REGION": region, "AWS_REGION": region, "SAM_CLI_TELEMETRY": "0"},
    )
    if done.returncode != 0:
        raise RuntimeError(f"samtranslator failed:\n{done.stderr[-4000:]}")
    translated: dict[str, Any] = json.loads(done.stdout)
    partial = cached.with_suffix(f".{os.getpid()}")
    partial.write_text(done.stdout)
    partial.replace(cached)
    return translated


# Managed policies SAM and the template attach (their documents as AWS publishes them, the actions
# that matter here). An ARN not listed fails the harness: add its document rather than guess.
MANAGED_POLICIES: dict[str, list[dict[str, Any]]] = {
    "service-role/AWSLambdaBasicExecutionRole": [
        {
            "Effect": "Allow",
            "Action": ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"],
            "Resource": "*",
        }
    ],
    "AWSXrayWriteOnlyAccess": [
        {
            "Effect": "Allow",
            "Action": [
                "xray:PutTraceSegments",
                "xray:PutTelemetryRecords",
                "xray:GetSamplingRules",
                "xray:GetSamplingTargets",
                "xray:GetSamplingStatisticSummaries",
            ],
            "Resource": "*",
        }
    ],
    "service-role/AWSLambdaSQSQueueExecutionRole": [
        {
            "Effect": "Allow",
            "Action": [
                "sqs:ReceiveMessage",
                "sqs:DeleteMessage",
                "sqs:GetQueueAttributes",
                "logs:CreateLogGroup",
                "logs:CreateLogStream",
                "logs:PutLogEvents",
            ],
            "Resource": "*",
        }
    ],
    "service-role/AWSLambdaVPCAccessExecutionRole": [
        {
            "Effect": "Allow",
            "Action": [
                "logs:CreateLogGroup",
                "logs:CreateLogStream",
                "logs:PutLogEvents",
                "ec2:CreateNetworkInterface",
                "ec2:DescribeNetworkInterfaces",
                "ec2:DescribeSubnets",
                "ec2:DeleteNetworkInterface",
                "ec2:AssignPrivateIpAddresses",
                "ec2:UnassignPrivateIpAddresses",
            ],
            "Resource": "*",
        }
    ],
    "service-role/AmazonECSTaskExecutionRolePolicy": [
        {
            "Effect": "Allow",
            "Action": [
                "ecr:GetAuthorizationToken",
                "ecr:BatchCheckLayerAvailability",
                "ecr:GetDownloadUrlForLayer",
                "ecr:BatchGetImage",
                "logs:CreateLogStream",
                "logs:PutLogEvents",
            ],
            "Resource": "*",
        }
    ],
}


# ----------------------------------------------------------------------------- intrinsics


@dataclass
class Physical:
    """How the test names the template's resources: ``names`` maps a logical id to its physical name
    (a queue, table, function or bus name); unnamed resources take the name the template gives them,
    else their logical id. ``parameters`` override the template's defaults."""

    region: str
    account: str
    names: dict[str, str] = field(default_factory=dict)
    parameters: dict[str, Any] = field(default_factory=dict)
    stack_name: str = "alphaagent-test"


class Resolver:
    """Resolves the CloudFormation intrinsics of a translated template to plain values."""

    def __init__(self, template: dict[str, Any], physical: Physical) -> None:
        self.template, self.physical = template, physical
        self.resources: dict[str, Any] = template.get("Resources", {})
        self.parameters: dict[str, Any] = {}
        for name, parameter in template.get("Parameters", {}).items():
            if name in physical.parameters:
                self.parameters[name] = physical.parameters[name]
            elif "Default" in parameter:
                default = parameter["Default"]
                is_list = parameter.get("Type", "").startswith(("List<", "CommaDelimitedList"))
                self.parameters[name] = [v for v in str(default).split(",") if v] if is_list else default
            else:
                self.parameters[name] = f"test-{name}"
        p = physical
        self.pseudo = {
            "AWS::Region": p.region,
            "AWS::AccountId": p.account,
            "AWS::Partition": "aws",
            "AWS::StackName": p.stack_name,
            "AWS::StackId": f"arn:aws:cloudformation:{p.region}:{p.account}:stack/{p.stack_name}/test",
            "AWS::URLSuffix": "amazonaws.com",
        }

    def imported(self, export: str) -> Any:
        """``Fn::ImportValue``: the value of the output the core template exports as ``export`` (an
        environment stack imports the core stack's bus, bucket, table and boundary so)."""
        for output in self.template.get("Outputs", {}).values():
            if "Export" in output and self.value(output["Export"]["Name"]) == export:
                return self.value(output["Value"])
        raise AssertionError(f"IAM harness: no output of the core template is exported as {export}")

    def condition(self, name: str) -> bool:
        return bool(self.value(self.template["Conditions"][name]))

    def exists(self, logical_id: str) -> bool:
        condition = self.resources[logical_id].get("Condition")
        return condition is None or self.condition(condition)

    def name_of(self, logical_id: str) -> str:
        if logical_id in self.physical.names:
            return self.physical.names[logical_id]
        properties = self.resources[logical_id].get("Properties", {})
        for key in ("FunctionName", "TableName", "QueueName", "BucketName", "StateMachineName", "RoleName"):
            if key in properties:
                return str(self.value(properties[key]))
        if self.resources[logical_id]["Type"] == "AWS::Events::EventBus":
            return str(self.value(properties["Name"]))
        if self.resources[logical_id]["Type"] == "AWS::Logs::LogGroup" and "LogGroupName" in properties:
            return str(self.value(properties["LogGroupName"]))
        return logical_id

    def ref(self, name: str) -> Any:
        if name in self.pseudo:
            return self.pseudo[name]
        if name in self.parameters:
            return self.parameters[name]
        kind = self.resources[name]["Type"]
        resource_name = self.name_of(name)
        if kind == "AWS::SQS::Queue":
            return f"https://sqs.{self.physical.region}.amazonaws.com/{self.physical.account}/{resource_name}"
        if kind == "AWS::StepFunctions::StateMachine":
            return self.get_att(name, "Arn")
        return resource_name

    def get_att(self, name: str, attribute: str) -> Any:
        kind = self.resources[name]["Type"]
        n, r, a = self.name_of(name), self.physical.region, self.physical.account
        arns = {
            "AWS::DynamoDB::Table": f"arn:aws:dynamodb:{r}:{a}:table/{n}",
            "AWS::S3::Bucket": f"arn:aws:s3:::{n}",
            "AWS::Events::EventBus": f"arn:aws:events:{r}:{a}:event-bus/{n}",
            "AWS::Events::Rule": f"arn:aws:events:{r}:{a}:rule/{n}",
            "AWS::SQS::Queue": f"arn:aws:sqs:{r}:{a}:{n}",
            "AWS::Lambda::Function": f"arn:aws:lambda:{r}:{a}:function:{n}",
            "AWS::StepFunctions::StateMachine": f"arn:aws:states:{r}:{a}:stateMachine:{n}",
            "AWS::IAM::Role": f"arn:aws:iam::{a}:role/{n}",
            "AWS::Logs::LogGroup": f"arn:aws:logs:{r}:{a}:log-group:{n}:*",
            "AWS::ECS::Cluster": f"arn:aws:ecs:{r}:{a}:cluster/{n}",
        }
        if attribute == "Arn" and kind in arns:
            return arns[kind]
        if attribute in ("QueueName", "Name"):
            return n
        if attribute == "QueueUrl":
            return self.ref(name)
        return f"{name}.{attribute}"

    def sub(self, text: str, variables: dict[str, Any]) -> str:
        def one(match: re.Match[str]) -> str:
            token = match.group(1)
            if token.startswith("!"):
                return "${" + token[1:] + "}"
            if token in variables:
                return str(variables[token])
            if "." in token and token.split(".", 1)[0] in self.resources:
                logical, attribute = token.split(".", 1)
                return str(self.get_att(logical, attribute))
            return str(self.ref(token))

        return re.sub(r"\$\{([^}]+)\}", one, text)

    def value(self, node: Any) -> Any:
        if isinstance(node, list):
            return [v for v in (self.value(item) for item in node) if v is not _NO_VALUE]
        if not isinstance(node, dict):
            return node
        if len(node) == 1:
            ((key, arg),) = node.items()
            if key == "Ref":
                return _NO_VALUE if arg == "AWS::NoValue" else self.ref(arg)
            if key == "Fn::GetAtt":
                logical, attribute = arg if isinstance(arg, list) else arg.split(".", 1)
                return self.get_att(logical, attribute)
            if key == "Fn::Sub":
                text, variables = (arg, {}) if isinstance(arg, str) else arg
                return self.sub(text, {k: self.value(v) for k, v in variables.items()})
            if key == "Fn::Join":
                return str(self.value(arg[0])).join(str(v) for v in self.value(arg[1]))
            if key == "Fn::If":
                return self.value(arg[1] if self.condition(arg[0]) else arg[2])
            if key == "Fn::Equals":
                return self.value(arg[0]) == self.value(arg[1])
            if key == "Fn::Not":
                return not self.value(arg[0])
            if key == "Fn::And":
                return all(self.value(v) for v in arg)
            if key == "Fn::Or":
                return any(self.value(v) for v in arg)
            if key == "Condition":
                return self.condition(arg)
            if key == "Fn::Select":
                return self.value(arg[1])[int(self.value(arg[0]))]
            if key == "Fn::Split":
                return str(self.value(arg[1])).split(self.value(arg[0]))
            if key == "Fn::ImportValue":
                return self.imported(str(self.value(arg)))
        return {k: v for k, v in ((k, self.value(v)) for k, v in node.items()) if v is not _NO_VALUE}


_NO_VALUE = object()

# ----------------------------------------------------------------------------- policy evaluation


@functools.lru_cache(maxsize=4096)  # a turn makes thousands of calls against a few dozen patterns
def _pattern(glob: str, *, ignore_case: bool) -> re.Pattern[str]:
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in glob)
    return re.compile(f"^{regex}$", re.IGNORECASE | re.DOTALL if ignore_case else re.DOTALL)


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _matches_any(globs: Any, value: str, *, ignore_case: bool) -> bool:
    return any(_pattern(str(g), ignore_case=ignore_case).match(value) for g in _listed(globs))


def _condition_holds(operator: str, key: str, wanted: Any, context: dict[str, Any]) -> bool:
    """One condition key of a statement, with IAM's rule for a key the request does not carry: the
    condition is false, except for ``...IfExists`` and the negated operators."""
    qualifier, _, base = operator.rpartition(":")
    if_exists = base.endswith("IfExists")
    base = base.removesuffix("IfExists")
    negated = "Not" in base
    if key not in context:
        return if_exists or negated
    values = [str(v) for v in _listed(context[key])]
    wanted = [str(w) for w in _listed(wanted)]

    def one(value: str) -> bool:
        if base in ("StringEquals", "ArnEquals", "StringNotEquals", "ArnNotEquals"):
            hit = value in wanted
        elif base in ("StringLike", "ArnLike", "StringNotLike", "ArnNotLike"):
            hit = any(_pattern(w, ignore_case=False).match(value) for w in wanted)
        elif base == "StringEqualsIgnoreCase" or base == "Bool":
            hit = value.lower() in [w.lower() for w in wanted]
        else:
            raise AssertionError(f"IAM harness: condition operator {operator} is not modelled")
        return not hit if negated else hit

    if qualifier == "ForAllValues":
        return all(one(v) for v in values)
    return any(one(v) for v in values)


def _statement_applies(
    statement: dict[str, Any], action: str, resource: str, context: dict[str, Any]
) -> bool:
    if "Action" in statement and not _matches_any(statement["Action"], action, ignore_case=True):
        return False
    if "NotAction" in statement and _matches_any(statement["NotAction"], action, ignore_case=True):
        return False
    if "Resource" in statement and not _matches_any(statement["Resource"], resource, ignore_case=False):
        return False
    if "NotResource" in statement and _matches_any(statement["NotResource"], resource, ignore_case=False):
        return False
    for operator, keys in statement.get("Condition", {}).items():
        for key, wanted in keys.items():
            if not _condition_holds(operator, key, wanted, context):
                return False
    return True


def allowed(statements: list[dict[str, Any]], action: str, resource: str, context: dict[str, Any]) -> bool:
    """IAM's identity-policy decision: an explicit Deny wins, else some Allow must apply."""
    applying = [s for s in statements if _statement_applies(s, action, resource, context)]
    if any(s["Effect"] == "Deny" for s in applying):
        return False
    return any(s["Effect"] == "Allow" for s in applying)


# ----------------------------------------------------------------------------- what a call needs


@dataclass(frozen=True)
class Need:
    """One authorization AWS makes for a call: ``action`` on ``resource`` with condition ``context``."""

    action: str
    resource: str
    context: tuple[tuple[str, Any], ...] = ()


def _s3_object(bucket: str, key: str) -> str:
    return f"arn:aws:s3:::{bucket}/{key}"


def _copy_source(value: Any) -> tuple[str, str, str | None]:
    if isinstance(value, dict):
        return value["Bucket"], value["Key"], value.get("VersionId")
    text, _, query = str(value).lstrip("/").partition("?")
    bucket, _, key = text.partition("/")
    version = re.search(r"(?:^|&)versionId=([^&]+)", query)
    return bucket, unquote(key), unquote(version.group(1)) if version else None


def _queue_arn(url: str, region: str) -> str:
    account, name = urlparse(url).path.strip("/").split("/")[-2:]
    return f"arn:aws:sqs:{region}:{account}:{name}"


def _s3(operation: str, p: dict[str, Any], region: str, account: str) -> list[Need]:
    bucket = f"arn:aws:s3:::{p.get('Bucket', '')}"
    obj = _s3_object(p.get("Bucket", ""), p.get("Key", ""))
    read = "s3:GetObjectVersion" if p.get("VersionId") else "s3:GetObject"
    if operation in ("GetObject", "HeadObject"):
        return [Need(read, obj)]
    if operation in ("PutObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload"):
        needs = [Need("s3:PutObject", obj)]
        if p.get("Tagging"):
            needs.append(Need("s3:PutObjectTagging", obj))
        if p.get("ACL") or any(k.startswith("Grant") for k in p):
            needs.append(Need("s3:PutObjectAcl", obj))
        return needs
    if operation in ("CopyObject", "UploadPartCopy"):
        source_bucket, source_key, version = _copy_source(p["CopySource"])
        source_read = "s3:GetObjectVersion" if version else "s3:GetObject"
        needs = [Need(source_read, _s3_object(source_bucket, source_key)), Need("s3:PutObject", obj)]
        if p.get("TaggingDirective") == "REPLACE" and p.get("Tagging"):
            needs.append(Need("s3:PutObjectTagging", obj))
        return needs
    if operation == "DeleteObject":
        return [Need("s3:DeleteObjectVersion" if p.get("VersionId") else "s3:DeleteObject", obj)]
    if operation == "DeleteObjects":
        return [
            Need(
                "s3:DeleteObjectVersion" if o.get("VersionId") else "s3:DeleteObject",
                _s3_object(p["Bucket"], o["Key"]),
            )
            for o in p["Delete"]["Objects"]
        ]
    if operation in ("ListObjectsV2", "ListObjects"):
        context = tuple(
            (k, p[n]) for k, n in (("s3:prefix", "Prefix"), ("s3:delimiter", "Delimiter")) if n in p
        )
        return [Need("s3:ListBucket", bucket, context)]
    if operation == "ListObjectVersions":
        return [Need("s3:ListBucketVersions", bucket)]
    if operation == "HeadBucket":
        return [Need("s3:ListBucket", bucket)]
    if operation == "AbortMultipartUpload":
        return [Need("s3:AbortMultipartUpload", obj)]
    if operation == "ListParts":
        return [Need("s3:ListMultipartUploadParts", obj)]
    if operation in ("GetObjectTagging", "PutObjectTagging"):
        verb = operation.removesuffix("Tagging")
        return [Need(f"s3:{verb}Tagging" + ("Version" if p.get("VersionId") else ""), obj)]
    if operation == "GetBucketVersioning":
        return [Need("s3:GetBucketVersioning", bucket)]
    raise KeyError(operation)


def _dynamodb(operation: str, p: dict[str, Any], region: str, account: str) -> list[Need]:
    def table(name: str) -> str:
        return name if name.startswith("arn:") else f"arn:aws:dynamodb:{region}:{account}:table/{name}"

    if operation in ("GetItem", "PutItem", "UpdateItem", "DeleteItem", "DescribeTable", "DescribeTimeToLive"):
        return [Need(f"dynamodb:{operation}", table(p["TableName"]))]
    if operation in ("Query", "Scan"):
        resource = table(p["TableName"]) + (f"/index/{p['IndexName']}" if p.get("IndexName") else "")
        return [Need(f"dynamodb:{operation}", resource)]
    if operation in ("BatchGetItem", "BatchWriteItem"):
        return [Need(f"dynamodb:{operation}", table(name)) for name in p["RequestItems"]]
    if operation == "TransactWriteItems":
        actions = {
            "Put": "PutItem",
            "Update": "UpdateItem",
            "Delete": "DeleteItem",
            "ConditionCheck": "ConditionCheckItem",
        }
        return [
            Need(f"dynamodb:{actions[kind]}", table(body["TableName"]))
            for item in p["TransactItems"]
            for kind, body in item.items()
        ]
    if operation == "TransactGetItems":
        return [Need("dynamodb:GetItem", table(item["Get"]["TableName"])) for item in p["TransactItems"]]
    raise KeyError(operation)


def _sqs(operation: str, p: dict[str, Any], region: str, account: str) -> list[Need]:
    actions = {
        "SendMessage": "SendMessage",
        "SendMessageBatch": "SendMessage",
        "ReceiveMessage": "ReceiveMessage",
        "DeleteMessage": "DeleteMessage",
        "DeleteMessageBatch": "DeleteMessage",
        "ChangeMessageVisibility": "ChangeMessageVisibility",
        "ChangeMessageVisibilityBatch": "ChangeMessageVisibility",
        "GetQueueAttributes": "GetQueueAttributes",
        "DeleteQueue": "DeleteQueue",
        "TagQueue": "TagQueue",
        "ListQueueTags": "ListQueueTags",
    }
    if operation == "CreateQueue":
        arn = f"arn:aws:sqs:{region}:{account}:{p['QueueName']}"
        # CreateQueue API reference: tagging a queue at creation needs sqs:TagQueue as well.
        return [Need("sqs:CreateQueue", arn)] + ([Need("sqs:TagQueue", arn)] if p.get("tags") else [])
    if operation == "ListQueues":
        # Names only; the Service Authorization Reference scopes it to no queue.
        return [Need("sqs:ListQueues", "*")]
    if operation == "GetQueueUrl":
        return [
            Need(
                "sqs:GetQueueUrl",
                f"arn:aws:sqs:{region}:{p.get('QueueOwnerAWSAccountId', account)}:{p['QueueName']}",
            )
        ]
    return [Need(f"sqs:{actions[operation]}", _queue_arn(p["QueueUrl"], region))]


def _states(operation: str, p: dict[str, Any], region: str, account: str) -> list[Need]:
    if operation in ("StartExecution", "StartSyncExecution", "ListExecutions", "DescribeStateMachine"):
        return [Need(f"states:{operation}", p["stateMachineArn"])]
    if operation in ("DescribeExecution", "StopExecution", "GetExecutionHistory"):
        return [Need(f"states:{operation}", p["executionArn"])]
    if operation in ("SendTaskSuccess", "SendTaskFailure", "SendTaskHeartbeat"):
        # The Service Authorization Reference lists no resource type for these: the token is the key.
        return [Need(f"states:{operation}", "*")]
    raise KeyError(operation)


def _function_tags(name: str, region: str, account: str) -> dict[str, str]:
    """The tags of a function as moto holds it ({} for a function that does not exist): Lambda
    authorizes ``InvokeFunction`` with ``aws:ResourceTag/{key}`` (Lambda's attribute-based access
    control), so the harness supplies them as IAM would."""
    from moto.awslambda.models import lambda_backends
    from moto.awslambda_simple.models import lambda_simple_backends

    for backends in (lambda_backends, lambda_simple_backends):
        try:
            function = backends[account][region].get_function(name)
        except Exception:  # moto's UnknownFunctionException, or no backend for the region yet
            continue
        return {str(k): str(v) for k, v in (function.tags or {}).items()}
    return {}


def _lambda(operation: str, p: dict[str, Any], region: str, account: str) -> list[Need]:
    if operation == "Invoke":
        name = p["FunctionName"]
        arn = name if name.startswith("arn:") else f"arn:aws:lambda:{region}:{account}:function:{name}"
        tags = tuple((f"aws:ResourceTag/{k}", v) for k, v in _function_tags(arn, region, account).items())
        if p.get("Qualifier"):
            arn += f":{p['Qualifier']}"
        return [Need("lambda:InvokeFunction", arn, tags)]
    raise KeyError(operation)


def _events(operation: str, p: dict[str, Any], region: str, account: str) -> list[Need]:
    if operation == "PutEvents":
        needs = []
        for entry in p["Entries"]:
            bus = entry.get("EventBusName", "default")
            arn = bus if bus.startswith("arn:") else f"arn:aws:events:{region}:{account}:event-bus/{bus}"
            context = (
                ("events:source", entry.get("Source")),
                ("events:detail-type", entry.get("DetailType")),
            )
            needs.append(Need("events:PutEvents", arn, context))
        return needs
    raise KeyError(operation)


_SERVICES: dict[str, Callable[[str, dict[str, Any], str, str], list[Need]]] = {
    "s3": _s3,
    "dynamodb": _dynamodb,
    "sqs": _sqs,
    "stepfunctions": _states,
    "lambda": _lambda,
    "events": _events,
}
_FREE = {("sts", "GetCallerIdentity")}  # needs no permission


def required(service: str, operation: str, params: dict[str, Any], region: str, account: str) -> list[Need]:
    """What IAM authorizes for ``operation`` of ``service`` (botocore names) with ``params``.

    Raises ``KeyError`` for an operation the harness does not map (so it cannot pass unchecked)."""
    if (service, operation) in _FREE:
        return []
    return _SERVICES[service](operation, params, region, account)


# ----------------------------------------------------------------------------- the harness


class Iam:
    """Enforces the translated template's roles on every boto3 call a component makes; see the
    module docstring. ``install()`` hooks the default boto3 session (call it before the clients are
    created), ``uninstall()`` unhooks it."""

    STATE_MACHINE_ACCESS_KEY = "ak"  # moto's Step Functions interpreter signs its calls with it

    def __init__(
        self,
        template_text: str,
        physical: Physical,
        *,
        state_machine: str = "TurnStateMachine",
        principals: dict[str, list[dict[str, Any]]] | None = None,
        stacks: tuple[str, ...] = (),
        stack_parameters: dict[str, str] | None = None,
    ) -> None:
        """``principals`` adds callers the template does not define (an operator running the CLI):
        name -> the statements of its policy. ``stacks`` are the texts of further templates deployed
        against this one (an environment's ``env_images/environment.yaml``): their resources join
        the core template's (logical ids must not clash), their ``Fn::ImportValue`` resolves to the
        core template's exports, and their parameters come from ``physical.parameters`` or, for those
        named in ``stack_parameters`` (parameter -> output of the core template), from the core
        template's outputs as ``make env-deploy`` passes them."""
        self.physical = physical
        self.state_machine = state_machine
        self._stacks, self._stack_parameters = stacks, dict(stack_parameters or {})
        self._given_principals = dict(principals or {})
        self.denied: list[str] = []
        self.checked: dict[str, int] = {}
        self.needs: set[tuple[str, str, str]] = set()
        self.use_template(template_text)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._session: Any = None
        self._original_start: Any = None

    def use_template(self, template_text: str) -> None:
        """Enforce the roles of ``template_text`` (with the further stacks given at construction) from
        now on: for a test that runs a shared stack under a changed template (a grant taken out)."""
        physical = self.physical
        template = copy.deepcopy(translate(template_text, physical.region))
        for stack in self._stacks:
            extra = translate(stack, physical.region)
            for name, parameter in extra.get("Parameters", {}).items():
                # A parameter both define (Architecture...) means the same; its default must agree.
                kept = template.setdefault("Parameters", {}).setdefault(name, copy.deepcopy(parameter))
                assert kept.get("Default") == parameter.get("Default"), f"IAM harness: parameter {name}"
            for section in ("Conditions", "Resources"):
                clash = set(template.get(section, {})) & set(extra.get(section, {}))
                assert not clash, f"IAM harness: {section} {sorted(clash)} are in two templates"
                template.setdefault(section, {}).update(copy.deepcopy(extra.get(section, {})))
        resolver = Resolver(template, physical)
        for parameter, output in self._stack_parameters.items():
            resolver.parameters[parameter] = resolver.value(template["Outputs"][output]["Value"])
        self.template, self.resolver = template, resolver
        self.resources: dict[str, Any] = template["Resources"]
        self._statements: dict[str, list[dict[str, Any]]] = dict(self._given_principals)
        self._principals = set(self._given_principals)

    def reset(self) -> None:
        """Forget what was checked and denied, and the principals added since construction (for the
        next test on a shared stack)."""
        with self._lock:
            self.denied.clear()
            self.checked.clear()
            self.needs.clear()
        self._statements = {
            name: statements for name, statements in self._statements.items() if name not in self._principals
        } | dict(self._given_principals)
        self._principals = set(self._given_principals)

    # -- roles ---------------------------------------------------------------------------------

    def role_of(self, component: str) -> str:
        """The logical id of the role ``component`` (a function, state machine or task definition,
        or a role itself) runs as."""
        resource = self.resources[component]
        kind, properties = resource["Type"], resource.get("Properties", {})
        if kind == "AWS::IAM::Role":
            return component
        key = {
            "AWS::Lambda::Function": "Role",
            "AWS::StepFunctions::StateMachine": "RoleArn",
            "AWS::ECS::TaskDefinition": "TaskRoleArn",
        }[kind]
        arn = self.resolver.value(properties[key])
        for logical, candidate in self.resources.items():
            if candidate["Type"] == "AWS::IAM::Role" and self.resolver.get_att(logical, "Arn") == arn:
                return logical
        raise AssertionError(f"{component}: no role in the template has the ARN {arn}")

    def statements_of(self, role: str) -> list[dict[str, Any]]:
        """Every statement of ``role``: its inline policies, its managed policies, and the policy
        resources that attach to it."""
        r = self.resolver
        properties = self.resources[role].get("Properties", {})
        statements: list[dict[str, Any]] = []
        for policy in r.value(properties.get("Policies", [])):
            statements += _listed(policy["PolicyDocument"]["Statement"])
        for arn in r.value(properties.get("ManagedPolicyArns", [])):
            name = str(arn).split(":policy/", 1)[-1]
            if name not in MANAGED_POLICIES:
                raise AssertionError(f"IAM harness: {role} attaches {arn}, whose document is not modelled")
            statements += MANAGED_POLICIES[name]
        role_name = r.name_of(role)
        for logical, resource in self.resources.items():
            if resource["Type"] not in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy") or not r.exists(
                logical
            ):
                continue
            attached = [str(v) for v in r.value(resource["Properties"].get("Roles", []))]
            if role_name in attached:
                statements += _listed(r.value(resource["Properties"]["PolicyDocument"])["Statement"])
        return statements

    def managed_policy(self, logical_id: str) -> list[dict[str, Any]]:
        """The statements of the template's ``AWS::IAM::ManagedPolicy`` ``logical_id``, resolved (for
        a principal outside the stack that an operator attaches it to: ``add_principal``)."""
        resource = self.resources[logical_id]
        assert resource["Type"] == "AWS::IAM::ManagedPolicy", logical_id
        return _listed(self.resolver.value(resource["Properties"]["PolicyDocument"])["Statement"])

    def add_principal(self, name: str, statements: list[dict[str, Any]]) -> None:
        """A caller the template does not define (an operator), allowed exactly ``statements``."""
        self._statements[name] = statements
        self._principals.add(name)

    def _policy(self, component: str) -> tuple[str, list[dict[str, Any]]]:
        if component in self._principals:
            return component, self._statements[component]
        if component not in self._statements:
            role = self.role_of(component)
            self._statements[component] = self.statements_of(role)
        return self.role_of(component), self._statements[component]

    # -- attribution ---------------------------------------------------------------------------

    def current(self) -> str | None:
        """The component the calling thread acts for (``None``: the harness itself)."""
        stack: list[str | None] = getattr(self._local, "stack", [])
        if stack:
            return stack[-1]
        inherited: str | None = getattr(threading.current_thread(), "_iam_component", None)
        return inherited

    @contextlib.contextmanager
    def acting_as(self, component: str | None) -> Iterator[None]:
        """Calls made in this block (and by threads started in it) are ``component``'s; ``None``
        makes them the harness's (unchecked)."""
        if component is not None:
            self._policy(component)  # fails now for a component the template does not have
        stack = self._local.__dict__.setdefault("stack", [])
        stack.append(component)
        try:
            yield
        finally:
            stack.pop()

    def as_component(self, component: str, function: Callable[..., Any]) -> Callable[..., Any]:
        """``function`` (a handler), called as ``component``: for tests that call handlers directly."""

        @functools.wraps(function)
        def called(*args: Any, **kwargs: Any) -> Any:
            with self.acting_as(component):
                return function(*args, **kwargs)

        return called

    def handlers(self) -> dict[str, str]:
        """Each zip function's handler module (``functions.start_turn``) -> its logical id."""
        found = {}
        for logical, resource in self.resources.items():
            handler = resource.get("Properties", {}).get("Handler")
            if resource["Type"] == "AWS::Lambda::Function" and isinstance(handler, str):
                found[handler.rpartition(".")[0].replace("/", ".")] = logical
        return found

    # -- hooks ---------------------------------------------------------------------------------

    def install(self) -> None:
        import boto3

        self._session = boto3._get_default_session()._session
        self._session.register("before-parameter-build", self._keep_params, unique_id="iam-params")
        self._session.register("before-call", self._before_call, unique_id="iam-before")
        self._session.register("after-call", self._after_call, unique_id="iam-after")
        harness = self
        original = self._original_start = threading.Thread.start

        def start(thread: threading.Thread) -> None:
            thread._iam_component = harness.current()  # type: ignore[attr-defined]
            original(thread)

        threading.Thread.start = start  # type: ignore[method-assign]

    def uninstall(self) -> None:
        if self._session is not None:
            self._session.unregister("before-parameter-build", unique_id="iam-params")
            self._session.unregister("before-call", unique_id="iam-before")
            self._session.unregister("after-call", unique_id="iam-after")
        if self._original_start is not None:
            threading.Thread.start = self._original_start  # type: ignore[method-assign]

    @staticmethod
    def _keep_params(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        # The very dict, not a copy: copying iterates it, and s3transfer's worker threads may share a
        # parameter dict that botocore's own handlers are adding keys to (RuntimeError mid-copy).
        context["iam_params"] = params

    def _component_of_call(self, request_signer: Any) -> str | None:
        credentials = getattr(request_signer, "_credentials", None)
        if getattr(credentials, "access_key", None) == self.STATE_MACHINE_ACCESS_KEY:
            return self.state_machine
        return self.current()

    def _before_call(self, model: Any, context: dict[str, Any], request_signer: Any = None, **_: Any) -> None:
        component = self._component_of_call(request_signer)
        context["iam_component"] = component
        if component is None:
            return
        service, operation = model.service_model.service_name, model.name
        region = context.get("client_region") or self.physical.region
        role, statements = self._policy(component)
        try:
            needs = required(service, operation, context.get("iam_params", {}), region, self.physical.account)
        except KeyError:
            self._deny(
                component, role, f"{service}:{operation}", "(no IAM mapping in tests/iam.py)", operation
            )
        with self._lock:
            self.checked[component] = self.checked.get(component, 0) + 1
            self.needs.update((component, n.action, n.resource) for n in needs)
        for need in needs:
            if not allowed(statements, need.action, need.resource, dict(need.context)):
                self._deny(component, role, need.action, need.resource, operation)

    def _after_call(self, model: Any, parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        """A GET or HEAD of a missing key: S3 answers 404 only to a caller allowed ``s3:ListBucket`` on
        the bucket, 403 to anyone else."""
        component = context.get("iam_component")
        if component is None or model.service_model.service_name != "s3":
            return
        if model.name not in ("GetObject", "HeadObject"):
            return
        if parsed.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
            return
        bucket = f"arn:aws:s3:::{context.get('iam_params', {}).get('Bucket', '')}"
        role, statements = self._policy(component)
        self.needs.add((component, "s3:ListBucket", bucket))
        if not allowed(statements, "s3:ListBucket", bucket, {}):
            message = self._record(component, role, "s3:ListBucket", bucket, f"{model.name} of a missing key")
            parsed["Error"] = {
                "Code": "403" if model.name == "HeadObject" else "AccessDenied",
                "Message": message,
            }
            parsed.setdefault("ResponseMetadata", {})["HTTPStatusCode"] = 403

    def _record(self, component: str, role: str, action: str, resource: str, operation: str) -> str:
        message = f"{component} (role {role}) is not allowed {action} on {resource} ({operation})"
        with self._lock:
            self.denied.append(message)
        return message

    def _deny(self, component: str, role: str, action: str, resource: str, operation: str) -> None:
        from botocore.exceptions import ClientError

        message = self._record(component, role, action, resource, operation)
        raise ClientError(
            {
                "Error": {"Code": "AccessDenied", "Message": f"IAM (template.yaml): {message}"},
                "ResponseMetadata": {"HTTPStatusCode": 403},
            },
            operation,
        )

    def report(self) -> str:
        """The denials, one a line, for an assertion message."""
        return "IAM denied (template.yaml):\n" + "\n".join(f"  {d}" for d in self.denied)


def without_action(template_text: str, action: str) -> str:
    """``template_text`` with ``action`` removed from every policy statement that lists it (for the
    tests that show the harness fails when a needed grant is taken out)."""
    template = cfn.parse_template(template_text)

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            if "Action" in node and isinstance(node["Action"], list | str):
                actions = [a for a in _listed(node["Action"]) if a != action]
                node = {**node, "Action": actions or ["none:Nothing"]}
            return {k: strip(v) for k, v in node.items()}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    return json.dumps(strip(template))
