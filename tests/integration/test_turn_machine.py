"""One turn on the aws backend end to end, under moto (issue 4 acceptance; DESIGN §3, §6).

The real ``statemachines/turn.asl.yaml`` runs in moto's Step Functions interpreter with the test's
substitutions. Everything else is the product's own code, wired as ``template.yaml`` wires it:

- the EventBridge rules of the template (their patterns read from ``template.yaml``) point at SQS
  queues, and a pump hands each queue's messages to the function the template subscribes: the
  starter (an SQS batch with partial failures, as the event source mapping gives it), the recorder,
  the orphan-lock release;
- the machine's ``lambda:invoke`` tasks and the coder's asynchronous ``Invoke`` of
  ``alphaagent-env-builtin`` run the handlers in-process (moto would need Docker); an asynchronous
  invocation's outcome goes on the bus as Lambda's EventBridge destination puts it;
- the coder is the real worker (``coder.worker.CoderWorker``) without a model: it takes the task
  token from the CoderQueue and drives the real tools for a spec with pinned steps, running code
  through the real ``LambdaExecutor`` and the real env function (the sandbox at process level,
  not exclusive: the tests run as root, where the exclusive uid sweep is refused).

Every AWS call a component makes is checked against the role ``template.yaml`` gives it
(``tests/iam.py``): the starter, each step function, the recorder, the orphan-lock release, the
coder worker (the ECS task role), the env function and the state machine itself. A call the role
does not allow fails as AWS would fail it, and the test fails naming the action and resource.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from assertions import assert_status
from cfn import load_template
from iam import Iam, Physical, without_action
from moto_account import (
    FAKE_CREDENTIALS,
    MotoAccount,
    remember_valid_state_machines,
    reuse_parsed_state_machines,
    reuse_state_machine_clients,
    share_parsed_json_paths,
)

from alphaagent.aws.backend import coder_backend, get_backend, get_stepfunctions_client
from alphaagent.aws.env_deploy import CORE_PARAMETERS
from alphaagent.aws.environments import DynamoEnvironmentRegistry
from alphaagent.aws.settings import get_lambda_settings
from alphaagent.aws.store import DynamoStore, create_table
from alphaagent.aws.workspace import S3Workspace
from alphaagent.environments import Environment, LambdaStart
from alphaagent.ids import new_ulid
from alphaagent.models.common import ConversationScope, utcnow
from alphaagent.sandbox.supervisor import Sandbox
from coder.worker import CoderWorker, WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
REGION = "eu-west-1"
ACCOUNT = "123456789012"
TABLE = "alphaagent-state-test"
BUCKET = f"alphaagent-workspaces-{ACCOUNT}-{REGION}"
BUS = "alphaagent-test"
USER = "alice@example.com"

HANDLERS = {
    "alphaagent-acquire-lock": "functions.acquire_lock",
    "alphaagent-prepare-turn": "functions.prepare_turn",
    "alphaagent-finalize-turn": "functions.finalize_turn",
    "alphaagent-release-lock": "functions.release_lock",
    "alphaagent-env-builtin": "alphaagent.aws.env_function",
    "alphaagent-env-gpu-ml": "alphaagent.aws.env_function",
}
"""Function name -> the module whose ``lambda_handler`` the invocation runs in-process."""

COMPONENTS = {
    "alphaagent-start-turn": "StartTurnFunction",
    "alphaagent-acquire-lock": "AcquireLockFunction",
    "alphaagent-prepare-turn": "PrepareTurnFunction",
    "alphaagent-finalize-turn": "FinalizeTurnFunction",
    "alphaagent-release-lock": "ReleaseLockFunction",
    "alphaagent-record-event": "RecordEventFunction",
    "alphaagent-orphan": "ReleaseOrphanLockFunction",
    "alphaagent-env-builtin": "EnvBuiltinFunction",
    # A custom environment, its own stack from env_images/environment.yaml (EnvironmentId gpu-ml).
    "alphaagent-env-gpu-ml": "EnvironmentFunction",
}
"""Function name (as the test names it) -> its logical id in ``template.yaml`` (whose role it runs as)."""
ENV_TEMPLATE = ROOT / "env_images" / "environment.yaml"
STACK_NAME = "alphaagent"
"""The core stack's name as the harness resolves ``AWS::StackName`` (``Physical.stack_name``): the
environment stack's ``CoreStackName`` default, which samtranslator substitutes where SAM resolves
parameters itself (the destinations)."""
CODER = "CoderTaskDefinition"
"""The coder worker runs as the ECS task definition's task role."""


def physical_names() -> Physical:
    """The test's names for the template's resources (the IAM harness resolves ARNs with them)."""
    names = {logical: name for name, logical in COMPONENTS.items()}
    names |= {"StateTable": TABLE, "EventBus": BUS, "TurnStateMachine": "alphaagent-turn"}
    parameters = {"EnvironmentId": "gpu-ml", "CoreStackName": STACK_NAME}
    return Physical(region=REGION, account=ACCOUNT, names=names, parameters=parameters, stack_name=STACK_NAME)


def function_arn(name: str) -> str:
    return f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{name}"


@dataclass
class Context:
    """The Lambda context attributes the handlers read (Powertools' logger, the env function's
    remaining time)."""

    function_name: str
    memory_limit_in_mb: int = 512
    aws_request_id: str = ""
    timeout_s: float = 900.0

    def __post_init__(self) -> None:
        self.invoked_function_arn = function_arn(self.function_name)
        self.aws_request_id = self.aws_request_id or str(uuid.uuid4())
        self._deadline = time.monotonic() + self.timeout_s

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


# ----------------------------------------------------------------------------- Lambda in-process


class InProcessLambda:
    """Replaces moto's ``LambdaBackend.invoke`` (which needs Docker): synchronous invocations return
    the handler's result, or Lambda's error payload with ``FunctionError``; an asynchronous
    (``Event``) invocation runs in a thread and its outcome goes on the bus as a destination record
    (``template.yaml``: ``MaximumRetryAttempts: 0``, OnSuccess/OnFailure to the bus)."""

    def __init__(self, iam: Iam) -> None:
        self.iam = iam
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.failures: dict[str, Callable[[dict[str, Any]], None]] = {}
        self.threads: list[threading.Thread] = []
        self.events: Any = None
        """The EventBridge client destination records go out with (the stack's, made after the
        IAM harness is installed)."""

    def invoke(self, function_name: str, body: Any, headers: Any, response_headers: dict[str, str]) -> bytes:
        name = function_name.rsplit(":", 1)[-1] if function_name.startswith("arn:") else function_name
        event = json.loads(body) if body else {}
        self.calls.append((name, event))
        if headers.get("X-Amz-Invocation-Type") == "Event":
            thread = threading.Thread(target=self._invoke_async, args=(name, event), daemon=True)
            self.threads.append(thread)
            thread.start()
            return b""
        ok, payload = self._call(name, event)
        if not ok:
            response_headers["x-amz-function-error"] = "Unhandled"
        return json.dumps(payload).encode()

    def _call(self, name: str, event: dict[str, Any]) -> tuple[bool, Any]:
        try:
            if name in self.failures:
                self.failures[name](event)
            handler = importlib.import_module(HANDLERS[name]).lambda_handler
            with self.iam.acting_as(COMPONENTS[name]):
                return True, handler(event, Context(function_name=name))
        except Exception as exc:
            lines = traceback.format_exception(exc)
            error_type = getattr(exc, "error_type", type(exc).__name__)
            return False, {"errorType": error_type, "errorMessage": str(exc), "stackTrace": lines}

    def _invoke_async(self, name: str, event: dict[str, Any]) -> None:
        request_id = str(uuid.uuid4())
        ok, payload = self._call(name, event)
        record = {
            "version": "1.0",
            "timestamp": utcnow().isoformat(),
            "requestContext": {
                "requestId": request_id,
                "functionArn": function_arn(name) + ":$LATEST",
                "condition": "Success" if ok else "RetriesExhausted",
                "approximateInvokeCount": 1,
            },
            "requestPayload": event,
            "responseContext": {"statusCode": 200, "executedVersion": "$LATEST"}
            | ({} if ok else {"functionError": "Unhandled"}),
            "responsePayload": payload,
        }
        outcome = "Success" if ok else "Failure"
        # Lambda puts a destination record with the function's own execution role.
        with self.iam.acting_as(COMPONENTS[name]):
            self._put_record(name, outcome, record)

    def _put_record(self, name: str, outcome: str, record: dict[str, Any]) -> None:
        self.events.put_events(
            Entries=[
                {
                    "EventBusName": BUS,
                    "Source": "lambda",
                    "DetailType": f"Lambda Function Invocation Result - {outcome}",
                    "Detail": json.dumps(record),
                    "Resources": [function_arn(name) + ":$LATEST"],
                }
            ]
        )


# ----------------------------------------------------------------------------- the stack


_LEFT_RUNNING: list[threading.Thread] = []
"""Threads of a test's worker, pumps or invocations still alive after its teardown gave up on them:
every later test on the stack fails at its set-up while one of them runs."""

PUMP_POLL_S = 1
"""How long a pump's receive waits for a message (s): the bound on how late a pump sees the stop."""


class Pump:
    """Feeds a queue's messages to a handler, as an event source mapping or a rule's Lambda target
    would: ``batch=True`` gives the starter SQS batches (and honours ``batchItemFailures``), else each
    message's body (an EventBridge event) goes to the handler alone. A failed message is left for
    redelivery after its visibility timeout."""

    def __init__(
        self,
        sqs: Any,
        queue_url: str,
        handler: Callable[[Any], Any],
        *,
        batch: bool,
        iam: Iam,
        component: str,
        mapping: bool,
    ) -> None:
        """``component`` is the function the pump feeds (the handler runs as its role); with
        ``mapping`` the queue is its event source mapping's, which Lambda reads with the function's
        role too (else the queue only stands in for a rule's direct target)."""
        self.sqs, self.queue_url, self.handler, self.batch = sqs, queue_url, handler, batch
        self.iam, self.component, self.mapping = iam, component, mapping
        self.errors: list[str] = []
        self.handled = 0

    def drain_once(self, wait_s: int = 0) -> int:
        """Hands over one batch; with ``wait_s`` it long-polls that many seconds for one to arrive."""
        with self.iam.acting_as(self.component if self.mapping else None):
            return self._drain_once(wait_s)

    def _drain_once(self, wait_s: int) -> int:
        messages = self.sqs.receive_message(
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=wait_s,
            AttributeNames=["All"],
        ).get("Messages", [])
        if not messages:
            return 0
        if self.batch:
            try:
                with self.iam.acting_as(self.component):
                    failed = self._batch(messages)
            except Exception:  # the whole batch failed (Powertools raises when every record did)
                self.errors.append(traceback.format_exc())
                failed = {m["MessageId"] for m in messages}
        else:
            failed = set()
            for message in messages:
                try:
                    with self.iam.acting_as(self.component):
                        self.handler(json.loads(message["Body"]))
                except Exception:
                    self.errors.append(traceback.format_exc())
                    failed.add(message["MessageId"])
        for message in messages:
            if message["MessageId"] not in failed:
                self.handled += 1
                self.sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"])
        return len(messages)

    def _batch(self, messages: list[dict[str, Any]]) -> set[str]:
        with self.iam.acting_as(None):  # the mapping's own configuration, not a call of the function
            arn = self.sqs.get_queue_attributes(QueueUrl=self.queue_url, AttributeNames=["QueueArn"])[
                "Attributes"
            ]["QueueArn"]
        records = [
            {
                "messageId": m["MessageId"],
                "receiptHandle": m["ReceiptHandle"],
                "body": m["Body"],
                "attributes": m.get("Attributes", {}),
                "messageAttributes": {},
                "md5OfBody": m["MD5OfBody"],
                "eventSource": "aws:sqs",
                "eventSourceARN": arn,
                "awsRegion": REGION,
            }
            for m in messages
        ]
        response = self.handler({"Records": records})
        return {item["itemIdentifier"] for item in response.get("batchItemFailures", [])}


class Stack:
    """The template's resources in moto, the turn machine, the pumps and one coder worker."""

    def __init__(self, moto: MotoAccount, lambdas: InProcessLambda, iam: Iam) -> None:
        import boto3

        self.lambdas, self.iam = lambdas, iam
        self.template = load_template(ROOT / "template.yaml")
        self.sqs = moto.client("sqs")
        self.events = moto.client("events")
        self.sfn = moto.client("stepfunctions")
        self.lambda_client = moto.client("lambda")
        self.dynamodb = moto.client("dynamodb")
        lambdas.events = self.events
        # The coder worker's own clients, one pair for every test's worker (a task keeps its clients).
        self.worker_sqs = boto3.client("sqs", region_name=REGION)
        self.worker_sfn = boto3.client("stepfunctions", region_name=REGION)
        moto.state_table(TABLE)
        self.s3 = moto.bucket(BUCKET)
        # Versioned as the template makes it: reads return a VersionId, and copies pin it.
        versioning = self.resource("WorkspacesBucket")["Properties"]["VersioningConfiguration"]
        self.s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration=versioning)
        self.events.create_event_bus(Name=BUS)
        self.rules_made: list[tuple[str, str]] = []
        self.store = DynamoStore(TABLE)
        self.workspace = S3Workspace(BUCKET)
        # The env functions as the stacks create them, with their tags (the coder may invoke only
        # its own stack's, by tag): builtin of the core stack, gpu-ml of its environment stack.
        iam_client = boto3.client("iam", region_name=REGION)
        role = iam_client.create_role(RoleName="env", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        self.env_role = role
        self.function(
            "alphaagent-env-builtin", {"alphaagent-stack": STACK_NAME, "alphaagent-environment": "builtin"}
        )

        spec_queue = self.resource("SpecQueue")["Properties"]
        self.spec_dlq = self.queue("SpecDeadLetterQueue")
        self.max_receive_count = int(spec_queue["RedrivePolicy"]["maxReceiveCount"])
        self.spec_queue = self.queue(
            "SpecQueue",
            # A short visibility timeout so a failed message comes back within the test.
            VisibilityTimeout="1",
            RedrivePolicy=json.dumps(
                {"deadLetterTargetArn": self.arn_of(self.spec_dlq), "maxReceiveCount": self.max_receive_count}
            ),
        )
        self.coder_queue = self.queue("CoderQueue")
        self.recorder_queue = self.queue("RecordEventTarget", VisibilityTimeout="1")
        self.orphan_queue = self.queue("ReleaseOrphanLockTarget", VisibilityTimeout="1")
        self.sink = self.queue("EverythingOnTheBus")

        substitutions = {
            "AcquireLockFunctionArn": function_arn("alphaagent-acquire-lock"),
            "PrepareFunctionArn": function_arn("alphaagent-prepare-turn"),
            "FinalizeFunctionArn": function_arn("alphaagent-finalize-turn"),
            "ReleaseLockFunctionArn": function_arn("alphaagent-release-lock"),
            "CoderQueueUrl": self.coder_queue,
            "EventBusName": BUS,
        }
        definition = (ROOT / "statemachines" / "turn.asl.yaml").read_text()
        for name, value in substitutions.items():
            definition = definition.replace("${" + name + "}", value)
        self.machine = self.sfn.create_state_machine(
            name="alphaagent-turn",
            definition=asl_json(definition),
            roleArn=f"arn:aws:iam::{ACCOUNT}:role/alphaagent-turn",
        )["stateMachineArn"]

        # The template's rules, their patterns as written there, with queue targets.
        self.rule(
            BUS,
            "SpecSubmittedRule",
            self.resource("SpecSubmittedRule")["Properties"]["EventPattern"],
            self.spec_queue,
        )
        for name, rule in self.function_rules("RecordEventFunction").items():
            self.rule(BUS, name, rule["Pattern"], self.recorder_queue)
        for name, rule in self.function_rules("ReleaseOrphanLockFunction").items():
            self.rule("default", name, rule["Pattern"], self.orphan_queue)
        self.rule(BUS, "Everything", {"source": [{"prefix": ""}]}, self.sink)

        from functions import record_event, release_orphan_lock, start_turn

        def call(module: Any, name: str) -> Callable[[Any], Any]:
            return lambda event: module.lambda_handler(event, Context(function_name=name))

        def pump(queue: str, module: Any, name: str, *, batch: bool) -> Pump:
            return Pump(
                self.sqs,
                queue,
                call(module, name),
                batch=batch,
                iam=iam,
                component=COMPONENTS[name],
                mapping=queue == self.spec_queue,
            )

        self.starter = pump(self.spec_queue, start_turn, "alphaagent-start-turn", batch=True)
        self.pumps = [
            self.starter,
            pump(self.recorder_queue, record_event, "alphaagent-record-event", batch=False),
            pump(self.orphan_queue, release_orphan_lock, "alphaagent-orphan", batch=False),
        ]
        self.queues = [
            self.spec_queue,
            self.spec_dlq,
            self.coder_queue,
            self.recorder_queue,
            self.orphan_queue,
            self.sink,
        ]
        self.functions = {"alphaagent-env-builtin"}
        self.rules = {(bus, name) for bus, name in self.rules_made}
        self._stop = threading.Event()
        self._pumping: list[threading.Thread] = []
        self.worker: CoderWorker | None = None
        self._working: threading.Thread | None = None
        self.seen: list[dict[str, Any]] = []
        self._earlier_executions: set[str] = set()
        self._threads_before: set[threading.Thread] = set()
        self.stop_timeout_s = 30.0
        """How long ``close`` waits for the test's threads once told to stop (s): the worker's own
        ``stop_timeout_seconds`` for an in-flight turn."""

    # -- template ------------------------------------------------------------------------------

    def resource(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.template["Resources"][name]
        return found

    def function_rules(self, function: str) -> dict[str, dict[str, Any]]:
        events = self.resource(function)["Properties"]["Events"]
        return {
            f"{function}{name}": event["Properties"]
            for name, event in events.items()
            if event["Type"] == "EventBridgeRule"
        }

    def resolve(self, value: Any) -> Any:
        """A pattern with the template's references replaced by the test's resources."""
        if isinstance(value, dict) and set(value) == {"Ref"}:
            assert value["Ref"] == "TurnStateMachine", value
            return self.machine
        if isinstance(value, dict):
            return {k: self.resolve(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.resolve(v) for v in value]
        return value

    # -- resources -----------------------------------------------------------------------------

    def function(self, name: str, tags: dict[str, str]) -> None:
        """An env function in moto (its invocations run in-process, ``InProcessLambda``)."""
        self.lambda_client.create_function(
            FunctionName=name,
            Runtime="python3.13",
            Role=self.env_role,
            Handler="alphaagent.aws.env_function.lambda_handler",
            Code={"ZipFile": b"PK\x05\x06" + b"\x00" * 18},  # an empty zip: the code runs in-process
            Tags=tags,
        )

    def queue(self, name: str, **attributes: str) -> str:
        url: str = self.sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
        return url

    def arn_of(self, queue_url: str) -> str:
        attributes = self.sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])
        arn: str = attributes["Attributes"]["QueueArn"]
        return arn

    def rule(self, bus: str, name: str, pattern: dict[str, Any], queue_url: str) -> None:
        self.rules_made.append((bus, name))
        self.events.put_rule(Name=name, EventBusName=bus, EventPattern=json.dumps(self.resolve(pattern)))
        self.events.put_targets(
            Rule=name, EventBusName=bus, Targets=[{"Id": "queue", "Arn": self.arn_of(queue_url)}]
        )

    # -- running -------------------------------------------------------------------------------

    def start(self, *, worker: bool = True) -> None:
        # One thread per queue, each long-polling (moto wakes a waiting receive when a message
        # arrives), as each function's event source polls on its own: polling every queue every
        # 0.1 s cost a tenth of a core per test, and more under load, when a turn takes longer.
        self._pumping = [
            threading.Thread(target=self._pump, args=(pump,), name=f"pump-{pump.component}", daemon=True)
            for pump in self.pumps
        ]
        for thread in self._pumping:
            thread.start()
        if worker:
            self.start_worker()

    def start_worker(self) -> None:
        settings = WorkerSettings(
            coder_queue_url=self.coder_queue,
            wait_time_seconds=1,
            heartbeat_seconds=5,
            stop_timeout_seconds=30,
        )
        self.worker = CoderWorker(
            coder_backend(),
            None,
            settings,
            sqs=self.worker_sqs,
            sfn=self.worker_sfn,
        )
        self._working = threading.Thread(target=self.worker.run, name="coder-worker", daemon=True)
        with self.iam.acting_as(CODER):  # the worker and the threads it starts run as the task role
            self._working.start()

    def _pump(self, pump: Pump) -> None:
        while not self._stop.is_set():
            try:
                pump.drain_once(wait_s=PUMP_POLL_S)
            except Exception:  # moto or the network between threads: keep pumping, keep the trace
                pump.errors.append(traceback.format_exc())
                self._stop.wait(0.1)

    def reset(self) -> None:
        """What one test observes, as a fresh stack has it: empty queues, an empty state table (no
        registered environments), no bus events seen, no Lambda calls, failures or functions beyond
        the builtin env function, no rules beyond the template's, no earlier executions, nothing
        checked or denied by IAM, and no thread of an earlier test running. The bucket keeps earlier
        tests' files: each test has its own conversation."""
        left = [thread for thread in _LEFT_RUNNING if thread.is_alive()]
        if left:
            pytest.fail(f"threads of an earlier test still run (their turns would go unchecked): {left}")
        with self.iam.acting_as(None):
            for url in self.queues:
                self.sqs.purge_queue(QueueUrl=url)  # moto's 60 s purge limit is off (turn_stack)
            # A new state table: moto copies every table for each TransactWriteItems (to roll back),
            # so the items of earlier tests made each of this test's transactions slower.
            self.dynamodb.delete_table(TableName=TABLE)
            create_table(self.dynamodb, TABLE)
            for function in self.lambda_client.list_functions()["Functions"]:
                if function["FunctionName"] not in self.functions:
                    self.lambda_client.delete_function(FunctionName=function["FunctionName"])
            for bus in {bus for bus, _ in self.rules} | {"default"}:
                for rule in self.events.list_rules(EventBusName=bus)["Rules"]:
                    if (bus, rule["Name"]) not in self.rules:
                        targets = self.events.list_targets_by_rule(Rule=rule["Name"], EventBusName=bus)
                        ids = [target["Id"] for target in targets["Targets"]]
                        if ids:
                            self.events.remove_targets(Rule=rule["Name"], EventBusName=bus, Ids=ids)
                        self.events.delete_rule(Name=rule["Name"], EventBusName=bus)
            self._earlier_executions = {e["executionArn"] for e in self.executions(every=True)}
        self.seen.clear()
        self.lambdas.calls.clear()
        self.lambdas.failures.clear()
        self.lambdas.threads.clear()
        for pump in self.pumps:
            pump.errors.clear()
            pump.handled = 0
        self.iam.reset()
        self._stop = threading.Event()
        self._pumping = []
        self.worker, self._working = None, None
        self._threads_before = set(threading.enumerate())

    def close(self) -> None:
        """Stop the test's worker, pumps and invocations, and any execution still running; fail
        loudly if a thread of them is still alive (it would finish the next test's turn unchecked)."""
        if self.worker is not None:
            self.worker.stop()
        if self._working is not None:
            self._working.join(timeout=30)
        self._stop.set()
        for thread in self._pumping:
            if thread.is_alive():
                thread.join(timeout=10)
        for thread in self.lambdas.threads:
            thread.join(timeout=30)
        with self.iam.acting_as(None):
            for execution in self.executions():
                if execution["status"] == "RUNNING":
                    self.sfn.stop_execution(executionArn=execution["executionArn"], cause="the test ended")
        # The worker's own threads (its pollers, each turn's thread) and the test's invocations.
        ours = [
            thread
            for thread in threading.enumerate()
            if thread not in self._threads_before
            and (thread.name.startswith(("coder-", "pump-")) or thread in self.lambdas.threads)
        ]
        deadline = time.monotonic() + self.stop_timeout_s
        for thread in ours:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        left = [thread for thread in ours if thread.is_alive()]
        if left:
            _LEFT_RUNNING.extend(left)
            raise AssertionError(f"the test's threads did not stop within {self.stop_timeout_s:g} s: {left}")

    # -- observing -----------------------------------------------------------------------------

    def bus_events(self) -> list[dict[str, Any]]:
        """Every event put on the bus so far (drained from the catch-all rule's queue)."""
        while messages := self.sqs.receive_message(QueueUrl=self.sink, MaxNumberOfMessages=10).get(
            "Messages"
        ):
            for message in messages:
                self.seen.append(json.loads(message["Body"]))
                self.sqs.delete_message(QueueUrl=self.sink, ReceiptHandle=message["ReceiptHandle"])
        return self.seen

    def bus_events_of(self, turn_id: str, detail_type: str) -> list[dict[str, Any]]:
        return [
            e
            for e in self.bus_events()
            if e["detail-type"] == detail_type and e["detail"].get("turn_id") == turn_id
        ]

    def executions(self, *, every: bool = False) -> list[dict[str, Any]]:
        """The machine's executions started in this test (``every``: in earlier tests too)."""
        found: list[dict[str, Any]] = self.sfn.list_executions(stateMachineArn=self.machine)["executions"]
        return [e for e in found if every or e["executionArn"] not in self._earlier_executions]

    def execution(self, turn_id: str, *, ended: bool = True, timeout_s: float = 30.0) -> dict[str, Any]:
        """The execution named ``turn_id`` (once it has ended, by default)."""
        arn = f"{self.machine.replace(':stateMachine:', ':execution:')}:{turn_id}"
        described: dict[str, Any] = {}

        def ready() -> bool:
            try:
                described.update(self.sfn.describe_execution(executionArn=arn))
            except self.sfn.exceptions.ExecutionDoesNotExist:
                return False
            return not ended or described["status"] != "RUNNING"

        wait_for(ready, f"execution {turn_id}", timeout_s, self)
        return described

    def history(self, execution: dict[str, Any]) -> str:
        """The execution's history, one event per line (for assertion messages)."""
        events = self.sfn.get_execution_history(executionArn=execution["executionArn"])["events"]
        lines = []
        for event in events:
            details = {k: v for k, v in event.items() if k.endswith("EventDetails")}
            lines.append(f"{event['type']}: {json.dumps(details, default=str)[:600]}")
        return "\n".join(lines)

    def settled(self, turn_id: str, detail_type: str, count: int = 1, timeout_s: float = 30.0) -> None:
        """Wait until the state table's event log has ``count`` events of ``detail_type`` for the turn
        (the recorder has caught up)."""

        def enough() -> bool:
            return len([e for e in self.store.list_events(turn_id) if e.detail_type == detail_type]) >= count

        try:
            wait_for(enough, f"{count} {detail_type} of {turn_id} recorded", timeout_s, self)
        except AssertionError as exc:
            recorded = [e.detail_type for e in self.store.list_events(turn_id)]
            on_bus = [e["detail-type"] for e in self.bus_events() if e["detail"].get("turn_id") == turn_id]
            raise AssertionError(f"{exc}\nrecorded: {recorded}\non the bus: {on_bus}") from None

    def queue_is_empty(self, queue_url: str) -> bool:
        """No message of the queue visible or in flight."""
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        counts = self.sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=names)["Attributes"]
        return all(int(counts[name]) == 0 for name in names)

    def errors(self) -> list[str]:
        return [error for pump in self.pumps for error in pump.errors] + self.iam.denied


@functools.lru_cache(maxsize=4)
def asl_json(definition: str) -> str:
    """The state machine's YAML ``definition`` as the JSON Step Functions takes (parsed once per
    text: every test creates the same machine)."""
    return json.dumps(yaml.safe_load(definition))


WAIT_FIRST_S = 0.05
"""Seconds before ``wait_for`` looks again; each pause is twice the last, up to ``WAIT_MOST_S``."""
WAIT_MOST_S = 0.8
"""The longest pause between two looks of ``wait_for`` (s): a look is a moto round trip (~5 ms of CPU
each, a third of all the calls of a turn when every look came 0.1 s after the last), and a turn takes
seconds, so a growing pause costs a turn's wait at most this much more."""


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float, stack: Stack | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    pause = WAIT_FIRST_S
    while not condition():
        if time.monotonic() > deadline:
            detail = "\n".join(stack.errors()[-3:]) if stack is not None else ""
            raise AssertionError(f"timed out waiting for {what}\n{detail}")
        time.sleep(pause)
        pause = min(pause * 2, WAIT_MOST_S)


TEMPLATE_TEXT = (ROOT / "template.yaml").read_text()


@pytest.fixture
def iam_template() -> str:
    """The template whose roles the components run as (a test may parametrize a changed copy)."""
    return TEMPLATE_TEXT


MOTO_CONFIG = {"stepfunctions": {"execute_state_machine": True}, "lambda": {"use_docker": False}}
"""Step Functions runs the machine; Lambda invokes run in-process (no Docker here)."""


@pytest.fixture(scope="module")
def turn_stack(env_sandbox: Sandbox) -> Iterator[Stack]:
    """The stack, one per module: its moto account, resources, IAM harness and the handlers'
    cached clients (as a warm Lambda keeps them); the env function's sandbox is the worker's
    (``env_sandbox``, tests/integration/conftest.py). Building it per test cost about a fifth of a
    turn's CPU. Each test gets it through ``stack``, which resets what a test observes and stops the
    test's worker, pumps and invocations when it ends."""
    from moto import mock_aws
    from moto.awslambda.models import LambdaBackend
    from moto.awslambda_simple.models import LambdaSimpleBackend

    from alphaagent.aws import env_function

    with pytest.MonkeyPatch.context() as monkeypatch:
        for name, value in {
            **FAKE_CREDENTIALS,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
            "POWERTOOLS_TRACE_DISABLED": "true",
            "POWERTOOLS_METRICS_NAMESPACE": "alphaagent-test",
            "STATE_TABLE_NAME": TABLE,
            "WORKSPACES_BUCKET_NAME": BUCKET,
            "EVENT_BUS_NAME": BUS,
            "LOCK_LEASE_S": "600",
            "ENV_TENANT_ISOLATION": "Disabled",
            # The reset empties every queue before each test; SQS allows one purge a minute.
            "MOTO_SQS_ENFORCE_STRICT_QUEUE_PURGE_BEHAVIOUR": "false",
        }.items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv("AWS_PROFILE", raising=False)
        getters = (
            get_lambda_settings,
            get_backend,
            get_stepfunctions_client,
            coder_backend,
            env_function.get_store,
            env_function.get_env_settings,
            env_function.get_workspace,
        )
        for getter in getters:
            getter.cache_clear()
        with mock_aws(config=MOTO_CONFIG):
            iam = Iam(
                TEMPLATE_TEXT,
                physical_names(),
                stacks=(ENV_TEMPLATE.read_text(),),
                stack_parameters=dict(CORE_PARAMETERS),
            )
            lambdas = InProcessLambda(iam)
            # With use_docker off moto answers from LambdaSimpleBackend (an echo); both run our handlers.
            for backend in (LambdaBackend, LambdaSimpleBackend):
                monkeypatch.setattr(
                    backend,
                    "invoke",
                    lambda _self, name, _qualifier, body, headers, response_headers: lambdas.invoke(
                        name, body, headers, response_headers
                    ),
                )
            monkeypatch.setattr(env_function, "get_sandbox", lambda: env_sandbox)
            remember_valid_state_machines(monkeypatch)
            reuse_parsed_state_machines(monkeypatch)
            reuse_state_machine_clients(monkeypatch)
            share_parsed_json_paths(monkeypatch)
            iam.install()  # before any client exists: each takes the session's handlers when created
            for module in set(HANDLERS.values()):  # imported here, not within the first test's waits
                importlib.import_module(module)
            try:
                created = Stack(MotoAccount(REGION), lambdas, iam)
                monkeypatch.setenv("STATE_MACHINE_ARN", created.machine)
                monkeypatch.setenv("CODER_QUEUE_URL", created.coder_queue)
                get_lambda_settings.cache_clear()
                yield created
            finally:
                iam.uninstall()
                for getter in getters:
                    getter.cache_clear()


@pytest.fixture
def stack(turn_stack: Stack, iam_template: str) -> Iterator[Stack]:
    """The module's stack as a fresh one looks to a test (``Stack.reset``), its components checked
    against ``iam_template``'s roles; the test's worker, pumps and invocations are stopped after it,
    and the test fails if any call was denied."""
    iam = turn_stack.iam
    turn_stack.reset()
    if iam_template != TEMPLATE_TEXT:
        iam.use_template(iam_template)
    try:
        yield turn_stack
    finally:
        try:
            turn_stack.close()
        finally:
            if iam_template != TEMPLATE_TEXT:
                iam.use_template(TEMPLATE_TEXT)
    if os.environ.get("IAM_DEBUG"):
        print(sorted(iam.needs), iam.checked)
    assert not iam.denied, iam.report()


# ----------------------------------------------------------------------------- specs

ANALYSIS_STEPS = [
    {
        "title": "summarise the measurements",
        "code": (
            "import pandas as pd\n"
            "df = pd.read_csv('docs/measurements.csv')\n"
            "summary = df.groupby('species')['mass_g'].mean().round(1)\n"
            "summary.to_csv('datasets/summary.csv')\n"
            "print(summary.to_string())\n"
        ),
    },
    {
        "title": "write the report",
        "code": (
            "import pandas as pd\n"
            "s = pd.read_csv('datasets/summary.csv', index_col=0)['mass_g']\n"
            "open('reports/mass.md', 'w').write(f'# Mass\\n\\nHeaviest: {s.idxmax()} ({s.max()} g)\\n')\n"
        ),
    },
]


def conversation() -> ConversationScope:
    return ConversationScope(conversation_id="c-" + new_ulid().lower())


def analysis_spec(scope: ConversationScope, **fields: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "spec_version": 1,
        "turn_id": new_ulid(),
        "user_id": USER,
        "scope": scope.model_dump(),
        "goal": "mean mass per species",
        "inputs": [{"kind": "document", "path": "docs/measurements.csv"}],
        "outputs": [{"kind": "dataset", "name": "summary"}, {"kind": "report", "name": "mass"}],
        "steps": ANALYSIS_STEPS,
    }
    spec.update(fields)
    return spec


def upload_measurements(stack: Stack, scope: ConversationScope) -> None:
    """The user's conversation with a document in it (as an earlier turn or an upload leaves it)."""
    stack.store.claim_owner(scope.owner_key, USER, utcnow())
    data = b"species,mass_g\nAdelie,3700\nAdelie,3800\nGentoo,5000\nGentoo,5100\n"
    stack.workspace.write_bytes(scope, "docs/measurements.csv", data)


def send_spec(stack: Stack, spec: dict[str, Any]) -> None:
    stack.sqs.send_message(QueueUrl=stack.spec_queue, MessageBody=json.dumps(spec))


def lock_is_free(stack: Stack, scope: ConversationScope) -> bool:
    probe = "probe-" + new_ulid()
    free = stack.store.acquire_lock(scope.key, probe, utcnow(), 60)
    if free:
        stack.store.release_lock(scope.key, probe)
    return free


# ----------------------------------------------------------------------------- the happy path


def assert_completed_turn(stack: Stack, spec: dict[str, Any]) -> None:
    """The records, files and events of a completed analysis turn."""
    turn_id, scope = spec["turn_id"], ConversationScope.model_validate(spec["scope"])
    execution = stack.execution(turn_id)
    assert_status(execution, "SUCCEEDED", stack.history(execution))
    stack.settled(turn_id, "TurnCompleted")
    stack.settled(turn_id, "RunCompleted", count=2)

    # The turn record
    turn = stack.store.get_turn(USER, turn_id)
    assert turn is not None
    assert_status(turn, "completed")
    assert turn.result is not None
    assert turn.result.summary.startswith("2 steps ran")
    assert len(turn.result.run_ids) == 2

    # One run record per run, recorded from the env function's destination
    runs = stack.store.list_runs(USER, scope.key)
    assert sorted(r.run_id for r in runs) == sorted(turn.result.run_ids)
    assert {r.status for r in runs} == {"ok"}
    first = next(r for r in runs if r.run_id == turn.result.run_ids[0])
    assert "Gentoo" in first.stdout and "5050.0" in first.stdout
    assert "datasets/summary.csv" in first.files_changed

    # The artifacts, version 1, and their files in the bucket
    artifacts = {(a.kind, a.name, a.version) for a in stack.store.list_artifacts(USER, scope.key)}
    assert artifacts == {("dataset", "summary", 1), ("report", "mass", 1)}
    summary = stack.workspace.read_bytes(scope, "datasets/summary.csv").decode()
    assert summary.splitlines() == ["species,mass_g", "Adelie,3750.0", "Gentoo,5050.0"]
    assert "Heaviest: Gentoo" in stack.workspace.read_bytes(scope, "reports/mass.md").decode()
    stored_spec = json.loads(stack.workspace.read_bytes(scope, f"spec/{turn_id}.json"))
    assert stored_spec["turn_id"] == turn_id
    for run_id in turn.result.run_ids:
        result = json.loads(stack.workspace.read_bytes(scope, f"work/runs/{run_id}/result.json"))
        assert_status(result, "ok")
    result = json.loads(stack.workspace.read_bytes(scope, f"work/turns/{turn_id}/result.json"))
    assert_status(result, "completed")

    # The events: on the bus and in the state table's log, each run reported exactly once
    [completed] = stack.bus_events_of(turn_id, "TurnCompleted")
    assert completed["source"] == "alphaagent.turn"
    assert_status(completed["detail"]["result"], "completed")
    logged = [e.detail_type for e in stack.store.list_events(turn_id)]
    assert logged.count("RunCompleted") == 2 and logged.count("ArtifactRegistered") == 2
    assert "TurnStarted" in logged and "TurnCompleted" in logged and "RunFailed" not in logged

    # The lock is free again
    assert lock_is_free(stack, scope)


def test_a_spec_on_the_spec_queue_runs_its_turn_to_turn_completed(stack: Stack) -> None:
    # Given a conversation with a document and a spec with pinned steps
    scope = conversation()
    upload_measurements(stack, scope)
    spec = analysis_spec(scope)
    stack.start()

    # When the spec is sent to the SpecQueue
    send_spec(stack, spec)

    # Then the turn ran through the machine, the coder and the env function, and is recorded
    assert_completed_turn(stack, spec)
    env_calls = [event for name, event in stack.lambdas.calls if name == "alphaagent-env-builtin"]
    assert len(env_calls) == 2 and {c["turn_id"] for c in env_calls} == {spec["turn_id"]}


GRANTS_TAKEN_OUT = ["dynamodb:GetItem", "s3:PutObject"]
"""Grants every turn needs; with one taken out of template.yaml the harness must fail the turn."""


@pytest.mark.parametrize(
    ("iam_template", "action"),
    [(without_action((ROOT / "template.yaml").read_text(), action), action) for action in GRANTS_TAKEN_OUT],
    ids=GRANTS_TAKEN_OUT,
)
def test_a_grant_taken_out_of_the_template_fails_the_turn_naming_it(
    stack: Stack, iam_template: str, action: str
) -> None:
    # Given the template with ``action`` removed from every role, and a turn that needs it
    scope = conversation()
    upload_measurements(stack, scope)
    spec = analysis_spec(scope)
    stack.start()

    # When the spec is sent
    send_spec(stack, spec)

    # Then the turn fails, and the harness names the action the role lacked and its resource
    execution = stack.execution(spec["turn_id"])
    assert_status(execution, "FAILED", stack.history(execution))
    denied = [d for d in stack.iam.denied if f" is not allowed {action} on arn:aws:" in d]
    assert denied, stack.iam.report()
    print(stack.iam.report())
    stack.iam.denied.clear()  # expected here: the fixture fails every other test that has any


def test_a_spec_submitted_event_on_the_bus_runs_its_turn(stack: Stack) -> None:
    # Given a workflow that puts SpecSubmitted on the bus (as the README's put-events example)
    scope = conversation()
    upload_measurements(stack, scope)
    spec = analysis_spec(scope)
    stack.start()

    # When the event is put on the bus
    stack.events.put_events(
        Entries=[
            {
                "EventBusName": BUS,
                "Source": "alphaagent.client",
                "DetailType": "SpecSubmitted",
                "Detail": json.dumps(
                    {"schema_version": 1, "turn_id": spec["turn_id"], "scope": spec["scope"], "spec": spec}
                ),
            }
        ]
    )

    # Then the rule brought it to the SpecQueue and the turn completed
    assert_completed_turn(stack, spec)


# ----------------------------------------------------------------------------- at-least-once


def test_the_same_spec_delivered_three_times_is_one_turn(stack: Stack) -> None:
    # Given a spec delivered three times at once
    scope = conversation()
    upload_measurements(stack, scope)
    spec = analysis_spec(scope)
    for _ in range(3):
        send_spec(stack, spec)
    stack.start()
    assert_completed_turn(stack, spec)

    # When it is delivered once more after the turn completed, and the starter has dealt with every
    # delivery (none visible, none in flight: a message leaves the queue only after its handler ran)
    send_spec(stack, spec)
    wait_for(lambda: stack.queue_is_empty(stack.spec_queue), "the starter to take every delivery", 30, stack)
    assert not stack.starter.errors, stack.starter.errors

    # Then there is one execution, one set of artifacts, and the turn is still completed
    assert [e["name"] for e in stack.executions()] == [spec["turn_id"]]
    versions = {(a.name, a.version) for a in stack.store.list_artifacts(USER, scope.key)}
    assert versions == {("summary", 1), ("mass", 1)}
    turn = stack.store.get_turn(USER, spec["turn_id"])
    assert turn is not None
    assert_status(turn, "completed")
    assert len(stack.bus_events_of(spec["turn_id"], "TurnCompleted")) == 1


def test_a_poison_message_is_retried_alone_and_dead_lettered(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a batch of three specs, one of which the starter cannot start (StartExecution fails)
    import functions.start_turn as starter

    scopes = [conversation() for _ in range(3)]
    specs = [
        analysis_spec(scope, steps=[{"title": "noop", "code": "print(1)"}], inputs=[], outputs=[])
        for scope in scopes
    ]
    poison = specs[1]["turn_id"]
    attempts: list[str] = []
    real_start = starter.start_turn_execution

    def start(arn: str, turn_id: str, execution_input: str) -> bool:
        if turn_id == poison:
            attempts.append(turn_id)
            raise RuntimeError("StartExecution failed for this one")
        return real_start(arn, turn_id, execution_input)

    monkeypatch.setattr(starter, "start_turn_execution", start)
    for spec in specs:
        send_spec(stack, spec)

    # When the starter consumes the queue
    stack.start()

    # Then the others ran once each, and the poison message went to the DLQ after maxReceiveCount tries
    def dead_lettered() -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = stack.sqs.receive_message(
            QueueUrl=stack.spec_dlq, MaxNumberOfMessages=10
        ).get("Messages", [])
        return found

    letters: list[dict[str, Any]] = []
    wait_for(
        lambda: bool(letters.extend(dead_lettered()) or letters), "the poison message in the DLQ", 30, stack
    )
    assert [json.loads(m["Body"])["turn_id"] for m in letters] == [poison]
    assert len(attempts) == stack.max_receive_count
    for spec in (specs[0], specs[2]):
        assert_status(stack.execution(spec["turn_id"]), "SUCCEEDED")
    assert sorted(e["name"] for e in stack.executions()) == sorted([specs[0]["turn_id"], specs[2]["turn_id"]])


# ----------------------------------------------------------------------------- failure paths


class LambdaTimeout(Exception):
    """How Lambda reports a function that ran past its timeout (the destination's errorType)."""

    error_type = "Sandbox.Timedout"


def out_of_memory(_event: dict[str, Any]) -> None:
    raise MemoryError("Runtime exited with error: signal: killed")


def timed_out(_event: dict[str, Any]) -> None:
    raise LambdaTimeout("Task timed out after 900.00 seconds")


@pytest.mark.parametrize(
    ("failure", "error_name"), [(out_of_memory, "MemoryError"), (timed_out, "Sandbox.Timedout")]
)
def test_an_env_function_failure_is_a_run_failed_that_the_coder_sees(
    stack: Stack, failure: Callable[[dict[str, Any]], None], error_name: str
) -> None:
    # Given an env function that fails as a platform (out of memory, or past the function's timeout)
    stack.lambdas.failures["alphaagent-env-builtin"] = failure
    scope = conversation()
    upload_measurements(stack, scope)
    spec = analysis_spec(scope)
    stack.start()

    # When the turn runs
    send_spec(stack, spec)

    # Then the run is recorded as failed from the failure destination, the coder got the error, the
    # turn failed with it, and the lock is free
    execution = stack.execution(spec["turn_id"])
    assert_status(execution, "SUCCEEDED")
    stack.settled(spec["turn_id"], "TurnFailed")
    [run] = stack.store.list_runs(USER, scope.key)
    assert_status(run, "failed")
    assert run.error is not None and run.error.name == error_name
    turn = stack.store.get_turn(USER, spec["turn_id"])
    assert turn is not None
    assert_status(turn, "failed")
    assert turn.result is not None
    assert turn.result.error is not None and turn.result.error.name == "EnvFunctionError"
    assert error_name in turn.result.error.value
    logged = [e.detail_type for e in stack.store.list_events(spec["turn_id"])]
    assert logged.count("RunFailed") == 1 and "RunCompleted" not in logged
    [failed] = stack.bus_events_of(spec["turn_id"], "TurnFailed")
    assert failed["detail"]["error"]["name"] == "EnvFunctionError"
    assert lock_is_free(stack, scope)


def test_a_coder_failure_ends_the_turn_failed_and_releases_the_lock(stack: Stack) -> None:
    # Given a spec without steps and a coder worker without a model (it answers SendTaskFailure)
    scope = conversation()
    spec = analysis_spec(scope, inputs=[])
    del spec["steps"]
    stack.start()

    # When the turn runs
    send_spec(stack, spec)

    # Then the execution failed, the turn record ended failed with the coder's error, TurnFailed went
    # out, and the lock is free
    execution = stack.execution(spec["turn_id"])
    assert_status(execution, "FAILED", stack.history(execution))
    turn = stack.store.get_turn(USER, spec["turn_id"])
    assert turn is not None, stack.history(execution)
    assert_status(turn, "failed", stack.history(execution))
    assert turn.result is not None, stack.history(execution)
    stack.settled(spec["turn_id"], "TurnFailed")
    assert turn.result.error is not None and turn.result.error.name == "InvalidSpecError"
    assert turn.result.failed_step == "Code"
    [failed] = stack.bus_events_of(spec["turn_id"], "TurnFailed")
    assert failed["detail"]["error"]["name"] == "InvalidSpecError"
    assert lock_is_free(stack, scope)


def test_an_aborted_executions_lock_is_released_by_the_rule(stack: Stack) -> None:
    # Given a turn waiting for a coder (no worker runs) with the scope's lock held
    scope = conversation()
    spec = analysis_spec(scope, inputs=[], steps=[{"title": "noop", "code": "print(1)"}], outputs=[])
    stack.start(worker=False)
    send_spec(stack, spec)
    execution = stack.execution(spec["turn_id"], ended=False)
    wait_for(
        lambda: not lock_is_free(stack, scope) and stack.store.get_turn(USER, spec["turn_id"]) is not None,
        "the lock",
        30,
        stack,
    )

    # When the execution is aborted and Step Functions reports it on the default bus
    stack.sfn.stop_execution(executionArn=execution["executionArn"], error="Aborted", cause="by an operator")
    change = json.loads((ROOT / "events" / "execution_aborted.json").read_text())
    detail = change["detail"] | {
        "executionArn": execution["executionArn"],
        "stateMachineArn": stack.machine,
        "name": spec["turn_id"],
        "status": "ABORTED",
        "input": execution["input"],
    }
    stack.events.put_events(
        Entries=[
            {
                "Source": "aws.states",
                "DetailType": "Step Functions Execution Status Change",
                "Detail": json.dumps(detail),
                "Resources": [execution["executionArn"]],
            }
        ]
    )

    # Then the orphan rule's function ran, the lock is free and the turn no longer shows as running
    orphans = stack.pumps[2]
    wait_for(lambda: orphans.handled == 1, "the orphan rule's function", 30, stack)
    wait_for(lambda: lock_is_free(stack, scope), "the lock's release", 30, stack)
    turn = stack.store.get_turn(USER, spec["turn_id"])
    assert turn is not None
    assert_status(turn, "failed")
    assert turn.result is not None and turn.result.error is not None
    assert turn.result.error.name == "TurnAbandoned" and "ABORTED" in turn.result.error.value


def test_a_spec_whose_input_is_missing_fails_before_any_code_runs(stack: Stack) -> None:
    # Given a spec naming a document the conversation does not have
    scope = conversation()
    spec = analysis_spec(scope)
    stack.start()

    # When it is submitted
    send_spec(stack, spec)

    # Then the prepare step refused it: the turn is recorded failed with the reason (so a client
    # waiting on the table sees the end), nothing ran, and the lock is free
    execution = stack.execution(spec["turn_id"])
    assert_status(execution, "FAILED", stack.history(execution))
    turn = stack.store.get_turn(USER, spec["turn_id"])
    assert turn is not None
    assert_status(turn, "failed")
    assert turn.result is not None
    assert turn.result.error is not None and turn.result.error.name == "InvalidSpecError"
    assert "docs/measurements.csv" in turn.result.error.value
    assert turn.result.failed_step == "Prepare"
    assert not [name for name, _ in stack.lambdas.calls if name == "alphaagent-env-builtin"]
    assert lock_is_free(stack, scope)


# ----------------------------------------------------------------------------- environments (issue 12)


def register_gpu_ml(stack: Stack) -> None:
    """The environment ``gpu-ml`` as ``make env-deploy`` leaves it: its stack's function (tagged with
    the core stack's name) and its item in the state table's registry."""
    stack.function(
        "alphaagent-env-gpu-ml", {"alphaagent-stack": STACK_NAME, "alphaagent-environment": "gpu-ml"}
    )
    DynamoEnvironmentRegistry(TABLE).register(
        Environment(
            environment_id="gpu-ml",
            description="CUDA-less test stand-in for a GPU image",
            start=LambdaStart(
                function_name="alphaagent-env-gpu-ml",
                image_uri=f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/alphaagent-env-gpu-ml:test",
            ),
            packages=("torch==2.9.0", "numpy==2.4.6", "pandas==3.1.1"),
        )
    )


def test_a_spec_in_a_registered_environment_runs_in_its_own_function(stack: Stack) -> None:
    # Given the environment gpu-ml deployed and registered, and a spec that names it
    register_gpu_ml(stack)
    scope = conversation()
    upload_measurements(stack, scope)
    spec = analysis_spec(scope, environment_id="gpu-ml")
    stack.start()

    # When the spec is sent
    send_spec(stack, spec)

    # Then the turn completed through the machine, and every run went to alphaagent-env-gpu-ml (as
    # the coder's role, whose invoke IAM allowed by the function's tag), none to builtin
    assert_completed_turn(stack, spec)
    invoked = [(name, event["environment_id"]) for name, event in stack.lambdas.calls if "-env-" in name]
    assert invoked == [("alphaagent-env-gpu-ml", "gpu-ml")] * 2
    assert (
        "CoderTaskDefinition",
        "lambda:InvokeFunction",
        function_arn("alphaagent-env-gpu-ml"),
    ) in stack.iam.needs


def test_the_coder_cannot_invoke_an_environment_function_its_stack_did_not_deploy(stack: Stack) -> None:
    import boto3
    from botocore.exceptions import ClientError

    # Given a function named like an environment that no stack of ours deployed (another stack's,
    # or one made by hand), and one tagged as another core stack's
    stack.function("alphaagent-env-other", {})
    stack.function("alphaagent-env-theirs", {"alphaagent-stack": "someone-elses-alphaagent"})
    client = boto3.client("lambda", region_name=REGION)

    # When the coder's role invokes them, Then IAM denies it (the grant is scoped by the stack's tag,
    # not alphaagent-env-* of the whole account)
    for name in ("alphaagent-env-other", "alphaagent-env-theirs"):
        with stack.iam.acting_as(CODER), pytest.raises(ClientError) as denied:
            client.invoke(FunctionName=name, InvocationType="Event", Payload=b"{}")
        assert denied.value.response["Error"]["Code"] == "AccessDenied"
        assert f"lambda:InvokeFunction on {function_arn(name)}" in str(denied.value)
    assert not [name for name, _ in stack.lambdas.calls if name != "alphaagent-env-builtin"]
    stack.iam.denied.clear()  # expected here: the fixture fails every other test that has any


def test_a_spec_naming_an_unregistered_environment_is_refused_before_anything_runs(stack: Stack) -> None:
    # Given gpu-ml registered, and a function alphaagent-env-other that exists but is not registered
    register_gpu_ml(stack)
    stack.function("alphaagent-env-other", {"alphaagent-stack": STACK_NAME})
    scope = conversation()
    upload_measurements(stack, scope)
    spec = analysis_spec(scope, environment_id="other")
    stack.start()

    # When its spec is sent
    send_spec(stack, spec)

    # Then the Prepare step refused it naming the available environments, and nothing was invoked
    execution = stack.execution(spec["turn_id"])
    assert execution["status"] == "FAILED", stack.history(execution)
    turn = stack.store.get_turn(USER, spec["turn_id"])
    assert turn is not None and turn.result is not None and turn.result.error is not None
    assert turn.result.error.name == "InvalidSpecError" and turn.result.failed_step == "Prepare"
    assert 'unknown environment "other" (available: builtin, gpu-ml)' in turn.result.error.value
    assert not [name for name, _ in stack.lambdas.calls if "-env-" in name]
    assert lock_is_free(stack, scope)


# ----------------------------------------------------------------------------- waiting for a turn


def test_a_waiter_learns_of_the_turns_end_from_the_recorders_notice(stack: Stack) -> None:
    import boto3

    # Given a submitter allowed exactly the template's SubmitAndWaitPolicy, waiting for its turn
    # with a fallback read far beyond the turn's length (only a notice can end the wait in time)
    from alphaagent.aws.client import open_turn_waiter, submit_spec, wait_for_turn
    from alphaagent.models.spec import parse_spec

    scope = conversation()
    upload_measurements(stack, scope)
    spec = parse_spec(json.dumps(analysis_spec(scope)))
    assert spec.turn_id is not None
    stack.iam.add_principal("Submitter", stack.iam.managed_policy("SubmitAndWaitPolicy"))
    stack.start()
    sqs = boto3.client("sqs", region_name=REGION)
    store = DynamoStore(TABLE, client=boto3.client("dynamodb", region_name=REGION))
    reads: list[str] = []
    looks: list[str] = []
    get_turn = store.get_turn
    store.get_turn = lambda user_id, turn_id: looks.append(turn_id) or get_turn(user_id, turn_id)  # type: ignore[method-assign]

    # When it submits the spec and waits (its calls checked against that policy)
    with stack.iam.acting_as("Submitter"):
        waiter = open_turn_waiter(sqs, USER, spec.turn_id, timeout_s=120, say=reads.append)
        assert waiter is not None, reads
        submit_spec(spec, queue_url=stack.spec_queue, sqs=sqs)
        try:
            result = wait_for_turn(
                store,
                USER,
                spec.turn_id,
                timeout_s=120,
                progress=reads.append,
                notices=waiter,
                fallback_s=3600,
            )
        finally:
            waiter.close()

    # Then the recorder's notice (sent as its role) ended the wait on the completed turn: the record
    # was read before the turn started and once more on the notice, and the queue is gone
    assert_status(result, "completed")
    assert waiter.notices == 1
    assert reads == ["queued", "completed"] and len(looks) == 2, (reads, looks)
    left = [u for u in stack.sqs.list_queues().get("QueueUrls", []) if "alphaagent-turns-" in u]
    assert left == []


# ----------------------------------------------------------------------------- the harness itself


def test_a_worker_thread_that_outlives_its_test_fails_it_and_every_later_test(stack: Stack) -> None:
    # Given a thread of the test's worker that does not stop (a turn still running at the end)
    release = threading.Event()
    stuck = threading.Thread(target=release.wait, name="coder-turn", daemon=True)
    stuck.start()
    stack.stop_timeout_s = 0.2
    try:
        # When the test's teardown stops the stack, Then it fails naming the thread
        with pytest.raises(AssertionError, match=r"did not stop within 0\.2 s.*coder-turn"):
            stack.close()
        # And the next test on the stack fails at its set-up while the thread runs
        with pytest.raises(pytest.fail.Exception, match="threads of an earlier test still run"):
            stack.reset()
    finally:
        release.set()
        stuck.join()
        stack.stop_timeout_s = 30.0
    # Once it has ended, the stack is usable again
    stack.reset()
