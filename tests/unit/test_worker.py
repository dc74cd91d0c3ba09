"""The coder worker under moto (issue 5, item 5): the task-token round trip, heartbeats during a long
run, SIGTERM mid-turn, ``SendTaskFailure`` after a crash; and the worker's Dockerfile.

moto executes the state machine for real (``execute_state_machine``): its ``Code`` state is an
``sqs:sendMessage.waitForTaskToken`` task, so the message on the queue carries a real task token and
the execution ends only when the worker answers. moto keeps no record of heartbeats, so the
Step Functions client is wrapped in a recording proxy of our own. The turns run on the local
backend in a temporary home (the AWS adapters do not exist yet); specs have pinned steps, so no
model is needed. The SIGTERM cases run in a forked child process that signals itself, so the
signal is real and pytest's own process is never hit.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from assertions import assert_status
from moto_account import MotoAccount
from sandboxes import light_agent

from alphaagent.api import AlphaAgent
from alphaagent.domain.tools import TurnContext
from alphaagent.domain.turn_steps import acquire_scope_lock, prepare_turn
from alphaagent.ids import new_ulid
from alphaagent.models.aws import AcquireLockInput, TurnInput
from alphaagent.models.common import ConversationScope, utcnow
from alphaagent.models.spec import SpecOutput, parse_spec
from coder.worker import CoderMessage, CoderWorker, WorkerSettings, worker_settings

REPO = Path(__file__).resolve().parents[2]
USER = "analyst@example.com"
REGION = "us-east-1"
FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_REGION": REGION,
}


# ----------------------------------------------------------------------------- harness


class RecordingClient:
    """A thin proxy of a boto3 client that records every call (name, keyword arguments)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.times: list[float] = []  # time.monotonic() of each call

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)

        def call(**kwargs: Any) -> Any:
            self.calls.append((name, kwargs))
            self.times.append(time.monotonic())
            return method(**kwargs)

        return call

    def named(self, name: str) -> list[dict[str, Any]]:
        return [kwargs for called, kwargs in self.calls if called == name]


class Aws:
    """A CoderQueue and a state machine whose only state waits for the worker's answer."""

    def __init__(self) -> None:
        import boto3

        self.sqs = boto3.client("sqs", region_name=REGION)
        self.sfn = RecordingClient(boto3.client("stepfunctions", region_name=REGION))
        self.queue_url = self.sqs.create_queue(QueueName="CoderQueue")["QueueUrl"]
        definition = {
            "StartAt": "Code",
            "States": {
                "Code": {
                    "Type": "Task",
                    "Resource": "arn:aws:states:::sqs:sendMessage.waitForTaskToken",
                    "HeartbeatSeconds": 120,
                    "Parameters": {
                        "QueueUrl": self.queue_url,
                        "MessageBody": {"task_token.$": "$$.Task.Token", "spec.$": "$.spec"},
                    },
                    "End": True,
                }
            },
        }
        self.machine = self.sfn.create_state_machine(
            name="TurnStateMachine",
            definition=json.dumps(definition),
            roleArn="arn:aws:iam::123456789012:role/TurnStateMachineRole",
        )["stateMachineArn"]

    def start(self, spec: dict[str, Any]) -> str:
        """Start an execution for ``spec``; returns its ARN once its message is on the queue."""
        before = self.queued()
        arn: str = self.sfn.start_execution(
            stateMachineArn=self.machine, name=spec["turn_id"], input=json.dumps({"spec": spec})
        )["executionArn"]
        wait_for(lambda: self.queued() > before, "the execution's message on the queue")
        return arn

    def queued(self) -> int:
        attributes = self.sqs.get_queue_attributes(
            QueueUrl=self.queue_url, AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]
        return int(attributes["ApproximateNumberOfMessages"])

    def in_flight(self) -> int:
        attributes = self.sqs.get_queue_attributes(
            QueueUrl=self.queue_url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"]
        )["Attributes"]
        return int(attributes["ApproximateNumberOfMessagesNotVisible"])

    def outcome(self, arn: str) -> dict[str, Any]:
        """The execution once it has ended."""
        ended: dict[str, Any] = {}

        def done() -> bool:
            ended.update(self.sfn.describe_execution(executionArn=arn))
            return ended["status"] != "RUNNING"

        wait_for(done, "the execution to end")
        return ended


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Polls ``condition`` until it holds; ``timeout_s`` only bounds a hang (a turn that starts the
    sandbox takes many seconds on a loaded machine), it is not a claim about speed."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


MOTO_CONFIG: dict[str, Any] = {"stepfunctions": {"execute_state_machine": True}}
"""Step Functions runs the test machine (its only state waits for the worker's task token)."""


def mocked_aws() -> AbstractContextManager[Any]:
    """The moto account of a scenario run in a child process (the ``moto`` fixture is in-process)."""
    from moto import mock_aws

    return mock_aws(config=MOTO_CONFIG)


def spec_of(*steps: str, **fields: Any) -> dict[str, Any]:
    """A spec in a fresh conversation with a fresh turn id (the execution's name)."""
    spec: dict[str, Any] = {
        "spec_version": 1,
        "turn_id": new_ulid(),
        "user_id": USER,
        "scope": {"conversation_id": "c-" + new_ulid().lower()},
        "goal": "test the coder worker",
        "outputs": [],
    }
    if steps:
        spec["steps"] = [{"title": f"step {i}", "code": code} for i, code in enumerate(steps, start=1)]
    spec.update(fields)
    return spec


def settings_for(aws: Aws, **fields: Any) -> WorkerSettings:
    values: dict[str, Any] = {
        "coder_queue_url": aws.queue_url,
        "heartbeat_seconds": 0.2,
        "stop_timeout_seconds": 10.0,
        "wait_time_seconds": 1,
    }
    values.update(fields)
    return WorkerSettings(**values)


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AlphaAgent]:
    with light_agent(tmp_path_factory.mktemp("home")) as agent:
        yield agent


@pytest.fixture
def moto_config() -> dict[str, Any]:
    return MOTO_CONFIG


@pytest.fixture
def aws(moto: MotoAccount, monkeypatch: pytest.MonkeyPatch) -> Aws:
    monkeypatch.setenv("AWS_REGION", REGION)
    return Aws()


class Running:
    """A worker running in a background thread until ``finish()``."""

    def __init__(self, worker: CoderWorker) -> None:
        self.worker = worker
        self.thread = threading.Thread(target=worker.run, daemon=True)
        self.thread.start()

    def finish(self) -> None:
        self.worker.stop()
        self.thread.join(timeout=15)
        assert not self.thread.is_alive(), "the worker did not stop"


def run_worker(agent: AlphaAgent, aws: Aws, coder: Any = None, **fields: Any) -> Running:
    worker = CoderWorker(agent.backend, coder, settings_for(aws, **fields), sqs=aws.sqs, sfn=aws.sfn)
    return Running(worker)


# ----------------------------------------------------------------------------- round trip


def test_task_token_round_trip_ends_in_success_with_the_result_pointer(agent: AlphaAgent, aws: Aws) -> None:
    # Given a waiting execution whose spec has pinned steps
    spec = spec_of("open('datasets/n.csv', 'w').write('n\\n1\\n')")
    spec["outputs"] = [{"kind": "dataset", "name": "n", "path": "datasets/n.csv"}]
    execution = aws.start(spec)

    # When the worker takes its message
    running = run_worker(agent, aws)
    try:
        ended = aws.outcome(execution)
    finally:
        running.finish()

    # Then the execution succeeds with the pointer to the stored result, and the message is gone
    assert_status(ended, "SUCCEEDED", ended)
    pointer = json.loads(ended["output"])
    turn_id = spec["turn_id"]
    scope_key = f"conversations/{spec['scope']['conversation_id']}"
    assert pointer == {
        "turn_id": turn_id,
        "status": "completed",
        "scope_key": scope_key,
        "result_key": f"work/turns/{turn_id}/result.json",
    }
    scope = ConversationScope(conversation_id=spec["scope"]["conversation_id"])
    stored = json.loads(agent.workspace.read_bytes(scope, pointer["result_key"]))
    assert_status(stored, "completed")
    assert [a["name"] for a in stored["artifacts"]] == ["n"]
    assert [call["taskToken"] for call in aws.sfn.named("send_task_success")] != []
    assert aws.sfn.named("send_task_failure") == []
    assert aws.queued() == 0 and aws.in_flight() == 0


def test_a_prepared_turn_runs_only_its_coding_step_under_the_executions_lease(
    agent: AlphaAgent, aws: Aws
) -> None:
    # Given a turn the state machine locked (as execution <turn_id>) and prepared, and a message that
    # carries only the spec's claim check and the prepared inputs, as the machine's Code state sends
    spec = parse_spec(json.dumps(spec_of("open('datasets/n.csv', 'w').write('a\\n1\\n')")))
    spec = spec.model_copy(update={"outputs": [SpecOutput(kind="dataset", name="n")]})
    assert spec.turn_id is not None
    turn_input = TurnInput.of(spec)
    acquire_scope_lock(
        agent.backend,
        AcquireLockInput(
            turn_id=spec.turn_id, spec=spec, execution_id=f"arn:aws:states:x:1:execution:m:{spec.turn_id}"
        ),
    )
    prepared = prepare_turn(agent.backend, turn_input)
    token = "token-" + new_ulid()
    body = CoderMessage(
        task_token=token, spec_key=prepared.spec_key, spec_sha256=prepared.spec_sha256, inputs=prepared.inputs
    )
    aws.sqs.send_message(QueueUrl=aws.queue_url, MessageBody=body.model_dump_json(exclude_none=True))

    # When the worker takes it
    running = run_worker(agent, aws)
    try:
        wait_for(
            lambda: aws.sfn.named("send_task_success") or aws.sfn.named("send_task_failure"), "an answer"
        )
    finally:
        running.finish()

    # Then the code ran and its result waits for the Finalize step; the record and the lease are the
    # machine's (moto does not know this token, so the answer is dropped, not retried)
    [answer] = aws.sfn.named("send_task_success")
    pointer = json.loads(answer["output"])
    stored = json.loads(agent.workspace.read_bytes(spec.scope, pointer["result_key"]))
    assert_status(stored, "completed")
    assert [a["name"] for a in stored["artifacts"]] == ["n"]
    turn = agent.store.get_turn(USER, spec.turn_id)
    assert turn is not None
    assert_status(turn, "running")
    assert not agent.store.acquire_lock(spec.scope.key, "another-execution", utcnow(), 60)
    assert aws.queued() == 0 and aws.in_flight() == 0


def test_a_prepared_turn_whose_lease_is_gone_does_not_run(agent: AlphaAgent, aws: Aws) -> None:
    # Given a prepared turn whose execution no longer holds the scope's lease
    spec = parse_spec(json.dumps(spec_of("open('work/ran.txt', 'w').write('x')")))
    assert spec.turn_id is not None
    prepared = prepare_turn(agent.backend, TurnInput.of(spec))
    token = "token-" + new_ulid()
    body = CoderMessage(task_token=token, spec_key=prepared.spec_key, spec_sha256=prepared.spec_sha256)
    aws.sqs.send_message(QueueUrl=aws.queue_url, MessageBody=body.model_dump_json(exclude_none=True))

    # When the worker takes it
    running = run_worker(agent, aws)
    try:
        wait_for(lambda: aws.sfn.named("send_task_failure"), "a failure")
    finally:
        running.finish()

    # Then nothing ran and the task failed with ScopeBusyError (the machine's failure path ends it)
    [failure] = aws.sfn.named("send_task_failure")
    assert failure["error"] == "ScopeBusyError"
    assert agent.workspace.stat(spec.scope, "work/ran.txt") is None


def test_the_message_body_needs_exactly_one_of_spec_and_spec_key() -> None:
    with pytest.raises(ValueError, match="exactly one of spec and spec_key"):
        CoderMessage(task_token="t")
    with pytest.raises(ValueError, match="exactly one of spec and spec_key"):
        CoderMessage(task_token="t", spec={}, spec_key="conversations/c/spec/x.json")


class TimedOutTasks(RecordingClient):
    """Step Functions for which every task has timed out (its heartbeat deadline passed in the queue)."""

    def __getattr__(self, name: str) -> Any:
        if name != "send_task_heartbeat":
            return super().__getattr__(name)

        def call(**kwargs: Any) -> Any:
            from botocore.exceptions import ClientError

            self.calls.append((name, kwargs))
            raise ClientError({"Error": {"Code": "TaskTimedOut", "Message": "Task Timed Out"}}, name)

        return call


def test_a_task_that_timed_out_in_the_queue_never_runs_its_turn(agent: AlphaAgent, aws: Aws) -> None:
    # Given a message whose execution already gave up on it (HeartbeatSeconds passed in the queue,
    # the lease released by the failure path)
    spec = spec_of("open('work/ran.txt', 'w').write('x')")
    body = CoderMessage.model_validate({"task_token": "token-" + new_ulid(), "spec": spec})
    aws.sqs.send_message(QueueUrl=aws.queue_url, MessageBody=body.model_dump_json(exclude_none=True))
    sfn = TimedOutTasks(aws.sfn._client)

    # When a worker takes it
    worker = CoderWorker(agent.backend, None, settings_for(aws), sqs=aws.sqs, sfn=sfn)
    running = Running(worker)
    try:
        wait_for(lambda: aws.queued() == 0 and aws.in_flight() == 0, "the message to be dropped")
    finally:
        running.finish()

    # Then no code ran, no answer was sent, and the message is gone
    scope = ConversationScope(conversation_id=spec["scope"]["conversation_id"])
    assert agent.workspace.stat(scope, "work/ran.txt") is None
    assert sfn.named("send_task_heartbeat") != []
    assert sfn.named("send_task_success") == [] and sfn.named("send_task_failure") == []


def test_a_body_with_a_token_but_no_valid_spec_fails_its_task(agent: AlphaAgent, aws: Aws) -> None:
    # Given a message whose body has a task token but an unknown field instead of a spec
    token = "token-" + new_ulid()
    body = json.dumps({"task_token": token, "specification": {}})
    aws.sqs.send_message(QueueUrl=aws.queue_url, MessageBody=body)

    running = run_worker(agent, aws)
    try:
        wait_for(lambda: bool(aws.sfn.named("send_task_failure")), "an answer")
    finally:
        running.finish()

    # Then its task is failed at once (no waiting for the heartbeat timeout) and the message is gone
    [failure] = aws.sfn.named("send_task_failure")
    assert (failure["taskToken"], failure["error"]) == (token, "InvalidMessageError")
    assert aws.queued() == 0 and aws.in_flight() == 0


def test_concurrency_runs_turns_side_by_side(agent: AlphaAgent, aws: Aws) -> None:
    # Given two waiting turns of about a second each and two worker threads
    executions = [aws.start(spec_of("import time; time.sleep(1.0)")) for _ in range(2)]

    # When the worker runs them
    running = run_worker(agent, aws, concurrency=2)
    try:
        statuses = [aws.outcome(arn)["status"] for arn in executions]
    finally:
        running.finish()

    # Then both succeed, and each was running (heartbeating) before the other was answered
    assert statuses == ["SUCCEEDED", "SUCCEEDED"]
    first_beat: dict[str, float] = {}
    answered: dict[str, float] = {}
    for (name, kwargs), at in zip(aws.sfn.calls, aws.sfn.times, strict=True):
        if name == "send_task_heartbeat":
            first_beat.setdefault(kwargs["taskToken"], at)
        elif name == "send_task_success":
            answered[kwargs["taskToken"]] = at
    assert len(answered) == 2 and set(first_beat) == set(answered)
    assert max(first_beat.values()) < min(answered.values())


# ----------------------------------------------------------------------------- heartbeats


def test_heartbeats_are_sent_while_a_long_turn_runs(agent: AlphaAgent, aws: Aws) -> None:
    # Given a turn whose step takes about a second and a heartbeat every 0.2 s
    spec = spec_of("import time; time.sleep(1.2)")
    execution = aws.start(spec)

    # When the worker runs it
    running = run_worker(agent, aws, heartbeat_seconds=0.2)
    try:
        ended = aws.outcome(execution)
    finally:
        running.finish()

    # Then several heartbeats went out with the execution's token, before the one answer
    assert_status(ended, "SUCCEEDED", ended)
    names = [name for name, _ in aws.sfn.calls if name.startswith("send_task")]
    assert names.count("send_task_heartbeat") >= 3, names
    assert names[-1] == "send_task_success" and names.count("send_task_success") == 1
    tokens = {call["taskToken"] for call in aws.sfn.named("send_task_heartbeat")}
    assert tokens == {aws.sfn.named("send_task_success")[0]["taskToken"]}


# ----------------------------------------------------------------------------- crash


def test_a_crashing_coder_ends_in_send_task_failure_with_the_error_class(agent: AlphaAgent, aws: Aws) -> None:
    # Given a coder with a defect and a spec without steps
    def crashing_coder(ctx: TurnContext) -> str:
        raise RuntimeError("the coder has a bug")

    execution = aws.start(spec_of())

    # When the worker runs the turn
    running = run_worker(agent, aws, coder=crashing_coder)
    try:
        ended = aws.outcome(execution)
    finally:
        running.finish()

    # Then the task fails with the class name (the Retry/Catch contract) and the message is gone
    assert_status(ended, "FAILED")
    assert ended["error"] == "RuntimeError"
    [failure] = aws.sfn.named("send_task_failure")
    assert failure["error"] == "RuntimeError" and failure["cause"] == "the coder has a bug"
    assert aws.queued() == 0 and aws.in_flight() == 0


def test_a_spec_the_backend_refuses_fails_with_invalid_spec_error(agent: AlphaAgent, aws: Aws) -> None:
    # Given a spec without steps and no model configured
    execution = aws.start(spec_of())

    running = run_worker(agent, aws, coder=None)
    try:
        ended = aws.outcome(execution)
    finally:
        running.finish()

    assert_status(ended, "FAILED")
    assert ended["error"] == "InvalidSpecError"
    [failure] = aws.sfn.named("send_task_failure")
    assert "ANTHROPIC_API_KEY" in failure["cause"]


# ----------------------------------------------------------------------------- SIGTERM


def _sigterm_scenario(home: Path, step_s: float, stop_timeout_s: float) -> dict[str, Any]:
    """Run in a child process: two waiting executions, a worker on the main thread, SIGTERM to the
    process once the first turn is running; report what the worker did.

    ``stop_timeout_s`` 0 means "long enough for the turn to finish": four times what the same turn
    took here once the sandbox was warm (at least 10 s), so a loaded machine cannot turn "the
    turn finishes" into "the stop timeout passed"."""
    with mocked_aws(), light_agent(home) as agent:
        if not stop_timeout_s:
            started = time.monotonic()
            warm_up = agent.run_analysis(spec_of(f"import time; time.sleep({step_s})"))
            assert_status(warm_up, "completed")
            stop_timeout_s = max(10.0, 4 * (time.monotonic() - started))
        aws = Aws()
        first, second = spec_of(f"import time; time.sleep({step_s})"), spec_of("print('second')")
        executions = [aws.start(first), aws.start(second)]
        worker = CoderWorker(
            agent.backend,
            None,
            settings_for(aws, stop_timeout_seconds=stop_timeout_s),
            sqs=aws.sqs,
            sfn=aws.sfn,
        )
        signalled: list[float] = []
        signal.signal(signal.SIGTERM, lambda *_: worker.stop())

        def terminate_mid_turn() -> None:
            wait_for(lambda: bool(aws.sfn.named("send_task_heartbeat")), "the first heartbeat")
            signalled.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=terminate_mid_turn, daemon=True).start()
        worker.run()
        stopped_after_s = time.monotonic() - signalled[0]
        answers = [
            (name, kwargs.get("error"))
            for name, kwargs in aws.sfn.calls
            if name in ("send_task_success", "send_task_failure")
        ]
        report = {
            "stopped_after_s": stopped_after_s,
            "answers": answers,
            "executions": [aws.outcome(arn)["status"] for arn in executions[:1]],
            "second_status": aws.sfn.describe_execution(executionArn=executions[1])["status"],
            "queued": aws.queued(),
            "in_flight": aws.in_flight(),
            "stop_timeout_s": stop_timeout_s,
        }
    return report


SIGTERM_SCENARIOS = {"finishes": (1.5, 0.0), "outlives": (30.0, 0.5)}
"""The SIGTERM scenarios by name: (the first turn's step in seconds, the stop timeout in seconds).
"finishes" runs first: "outlives" leaves its 30 s run to be killed when its sandbox closes."""


@pytest.fixture(scope="module")
def sigterm_reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The report of each SIGTERM scenario, run one after the other in one child process forked
    from this one: the child has its own pid, main thread and signal handler (the signal is real
    and pytest's process is never hit), and inherits the modules already imported here (a fresh
    interpreter paid ~3.5 CPU-s for the platform's imports and moto's Step Functions parser, which
    loads EC2's instance catalogue). Each scenario has its own moto account, data directory,
    sandbox, worker and signal handler, so neither sees the other's."""
    root = tmp_path_factory.mktemp("sigterm")
    with _env(FAKE_AWS):
        return _in_forked_child(
            lambda: {
                name: _sigterm_scenario(root / name, *SIGTERM_SCENARIOS[name]) for name in SIGTERM_SCENARIOS
            },
            timeout_s=110,
        )


@contextlib.contextmanager
def _env(values: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set, as it was afterwards (the child inherits it)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _in_forked_child(run: Callable[[], dict[str, Any]], timeout_s: float) -> dict[str, Any]:
    """``run()`` in a forked child; its JSON result, or an ``AssertionError`` with the child's
    traceback. The child ends with ``os._exit`` (no pytest teardown, no atexit of this process);
    one that outlives ``timeout_s`` is killed."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running anything of the parent's
        status = 1
        try:
            os.close(read_end)
            try:
                payload = json.dumps({"report": run()})
                status = 0
            except BaseException:
                payload = json.dumps({"error": traceback.format_exc()[-3000:]})
            with os.fdopen(write_end, "w") as out:
                out.write(payload)
        finally:
            os._exit(status)
    os.close(write_end)
    killer = threading.Timer(timeout_s, lambda: os.kill(pid, signal.SIGKILL))
    killer.start()
    try:
        with os.fdopen(read_end) as received:
            raw = received.read()
        _, status = os.waitpid(pid, 0)
    finally:
        killer.cancel()
    assert raw, f"the child ended without a report (wait status {status})"
    answer: dict[str, Any] = json.loads(raw)
    assert "report" in answer, answer["error"]
    return dict(answer["report"])


def test_sigterm_mid_turn_finishes_the_turn_and_takes_no_new_message(
    sigterm_reports: dict[str, dict[str, Any]],
) -> None:
    # Given a running 1.5 s turn, a second message waiting, and a stop timeout the turn fits in
    # (at least 10 s: four times the same turn's measured time, the scenario's 0)
    # When the worker's process gets SIGTERM mid-turn
    report = sigterm_reports["finishes"]

    # Then the turn finishes and is answered, the worker stops, the second message stays queued
    assert report["answers"] == [["send_task_success", None]], report
    assert report["executions"] == ["SUCCEEDED"]
    assert report["stopped_after_s"] < report["stop_timeout_s"]
    assert report["second_status"] == "RUNNING"
    assert report["queued"] + report["in_flight"] == 1


def test_sigterm_fails_a_turn_that_outlives_the_stop_timeout(
    sigterm_reports: dict[str, dict[str, Any]],
) -> None:
    # Given a turn that would run 30 s and a 0.5 s stop timeout
    # When the worker's process gets SIGTERM mid-turn
    report = sigterm_reports["outlives"]

    # Then the task fails with WorkerStopping once the stop timeout has passed: no silent hang
    assert report["answers"] == [["send_task_failure", "WorkerStopping"]]
    assert report["executions"] == ["FAILED"]
    assert 0.5 <= report["stopped_after_s"] < 3.0
    assert report["second_status"] == "RUNNING"
    assert report["queued"] + report["in_flight"] == 1


# ----------------------------------------------------------------------------- settings, Dockerfile


def test_settings_are_read_from_the_environment_once(monkeypatch: pytest.MonkeyPatch) -> None:
    worker_settings.cache_clear()
    monkeypatch.setenv("CODER_QUEUE_URL", "https://sqs.us-east-1.amazonaws.com/123456789012/CoderQueue")
    monkeypatch.setenv("WORKER_CONCURRENCY", "3")
    monkeypatch.setenv("HEARTBEAT_SECONDS", "30")
    monkeypatch.setenv("STOP_TIMEOUT_SECONDS", "90")
    try:
        settings = worker_settings()
        monkeypatch.setenv("WORKER_CONCURRENCY", "5")
        assert worker_settings() is settings
    finally:
        worker_settings.cache_clear()
    assert (settings.concurrency, settings.heartbeat_seconds, settings.stop_timeout_seconds) == (3, 30, 90)
    assert settings.wait_time_seconds == 20
    # A bad value names the variable (not the model's field), the rule and the value as set
    with pytest.raises(ValueError, match=r"^HEARTBEAT_SECONDS: must be a number of seconds ≤ 40, got '41'$"):
        WorkerSettings.from_env({"CODER_QUEUE_URL": "q", "HEARTBEAT_SECONDS": "41"})
    with pytest.raises(ValueError, match=r"^CODER_QUEUE_URL: not set \(required\)$"):
        WorkerSettings.from_env({})


def test_python_m_coder_without_a_queue_names_the_variable(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("CODER_QUEUE_URL", "ANTHROPIC_API_KEY")}
    env.update(FAKE_AWS, ALPHAAGENT_HOME=str(tmp_path / "home"))
    done = subprocess.run(
        [sys.executable, "-m", "coder"], capture_output=True, text=True, timeout=30, env=env, cwd=tmp_path
    )
    assert done.returncode == 2
    assert done.stderr == "coder worker: CODER_QUEUE_URL: not set (required)\n"


def test_the_dockerfile_pins_its_base_runs_as_non_root_and_starts_the_worker() -> None:
    # The image cannot be built here (no Docker engine); its contract is checked as text.
    lines = [
        line.strip()
        for line in (REPO / "coder" / "Dockerfile").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    [base] = [line for line in lines if line.upper().startswith("FROM ")]
    assert re.fullmatch(r"FROM python:3\.13\.\d+-slim-\w+@sha256:[0-9a-f]{64}", base) or re.fullmatch(
        r"FROM python:3\.13\.\d+-slim-\w+", base
    ), base
    users = [line.split()[1] for line in lines if line.upper().startswith("USER ")]
    assert users and users[-1] not in ("root", "0", "0:0")
    assert lines[-1] == 'CMD ["python", "-m", "coder"]'
    installs = " ".join(line for line in lines if "pip install" in line)
    assert "-c constraints.txt" in installs and ".[coder]" in installs


def test_a_claim_check_rewritten_by_run_code_is_refused(tmp_path: Path) -> None:
    # Given a spec stored under conversation A's spec/, then rewritten (as run code could) to name
    # conversation B and another turn
    from alphaagent.errors import InvalidMessageError
    from coder.worker import CoderMessage

    with light_agent(tmp_path / "home") as agent:
        backend = agent.backend
        scope_a = ConversationScope(conversation_id="conv-a")
        backend.workspace.ensure_scope(scope_a)
        turn_id = "01JZ0000000000000000000000"
        forged = {
            "spec_version": 1,
            "user_id": "victim",
            "scope": {"conversation_id": "conv-b"},
            "goal": "g",
            "turn_id": "01JZ0000000000000000000001",
            "steps": [{"title": "x", "code": "print(1)"}],
        }
        data = json.dumps(forged).encode()
        backend.workspace.write_bytes(scope_a, f"spec/{turn_id}.json", data)
        key = f"conversations/conv-a/spec/{turn_id}.json"
        message = CoderMessage(task_token="t", spec_key=key, spec_sha256=hashlib.sha256(data).hexdigest())
        # When the worker loads it, then Then it is refused: neither its scope nor its turn match
        with pytest.raises(InvalidMessageError, match="does not hold the spec of that scope and turn"):
            message.load_spec(backend)
        # And a file rewritten since the prepare step hashed it is refused before it is even parsed
        stale = CoderMessage(
            task_token="t", spec_key=key, spec_sha256=hashlib.sha256(b"original").hexdigest()
        )
        with pytest.raises(InvalidMessageError, match="no longer holds the spec the turn was given"):
            stale.load_spec(backend)
        # And a key outside any scope is refused with the same class, not a ValueError
        with pytest.raises(InvalidMessageError):
            CoderMessage(
                task_token="t", spec_key="../../etc/spec/passwd.json", spec_sha256="0" * 64
            ).load_spec(backend)
