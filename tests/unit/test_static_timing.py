"""Timing the simulator cannot show, checked against template.yaml and the ASL (issue 9).

moto models no time: no metric delay, no alarm, no Fargate start. These tests put the AWS figures
that bound a turn's waits next to the template's settings and fail when a timeout, a heartbeat or a
visibility timeout is shorter than what its step can legitimately take. Each figure names its
source; where AWS documents no bound, the figure is a measured or typical value and says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from cfn import load_template

from alphaagent.domain.turn_steps import CODE_STATE_MARGIN_S, CODER_QUEUE_WAIT_S, MAX_TURN_TIMEOUT_S
from coder.worker import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]

SQS_METRIC_PERIOD_S = 60
"""SQS pushes its CloudWatch metrics once a minute (SQS Developer Guide, "Available CloudWatch
metrics for Amazon SQS")."""
CLOUDWATCH_METRIC_DELAY_S = 120
"""A one-minute datapoint is typically visible to alarms one to two minutes after its period ends
(CloudWatch documents no bound; this is the usual figure)."""
INACTIVE_QUEUE_METRICS_S = 15 * 60
"""A queue idle for six hours or more is "inactive": its metrics may take up to 15 minutes to resume
after it gets a message (SQS Developer Guide, CloudWatch metrics). Only a service that waits for
its first task on a scale-out from zero pays this."""
FARGATE_TASK_START_S = 120
"""Provisioning, ENI attachment and container start of a Fargate task: usually 30-60 s; twice that
under capacity pressure (AWS documents no bound)."""
CODER_IMAGE_PULL_S = 120
"""Fargate caches no layers between tasks: each pulls the coder image (Python, Node and the Claude
Code CLI, about 1 GB) from ECR; ~1 minute at typical ECR throughput, doubled for margin."""
WORKER_START_S = 30
"""From container start to the worker's first ReceiveMessage returning (Python start-up, then a long
poll of at most 20 s: ``WorkerSettings.wait_time_seconds``)."""
CODER_FINISH_S = 300
"""After the coder enforced the turn timeout: transcript, result claim check, SendTaskSuccess with
retries (``CODE_STATE_MARGIN_S`` documents it)."""


def _template() -> dict[str, Any]:
    return load_template(ROOT / "template.yaml")


def _states() -> dict[str, Any]:
    states: dict[str, Any] = yaml.safe_load((ROOT / "statemachines" / "turn.asl.yaml").read_text())["States"]
    return states


def _parameter_floor(template: dict[str, Any], value: Any) -> int:
    """The least value ``value`` (a number or a ``Ref`` to a Number parameter) can take in a deploy."""
    if isinstance(value, dict) and "Ref" in value:
        parameter = template["Parameters"][value["Ref"]]
        return int(parameter.get("MinValue", parameter.get("Default", 0)))
    return int(value)


def worst_wait_for_a_coder_worker(template: dict[str, Any]) -> int:
    """Seconds a turn's message may wait on the CoderQueue before a worker takes it: every worker is
    busy (or none runs), so it waits for the backlog alarm, the scale-out and a new task."""
    resources = template["Resources"]
    alarm = resources["CoderBacklogAlarm"]["Properties"]
    scale_out = resources["CoderScaleOutPolicy"]["Properties"]["StepScalingPolicyConfiguration"]
    alarm_s = int(alarm["Period"]) * int(alarm["EvaluationPeriods"])
    wait = (
        SQS_METRIC_PERIOD_S
        + CLOUDWATCH_METRIC_DELAY_S
        + alarm_s
        # A message that arrives just after a scale-out that did not suffice waits out its cooldown.
        + int(scale_out["Cooldown"])
        + FARGATE_TASK_START_S
        + CODER_IMAGE_PULL_S
        + WORKER_START_S
    )
    minimum = _parameter_floor(template, resources["CoderScalableTarget"]["Properties"]["MinCapacity"])
    if minimum == 0:
        wait += INACTIVE_QUEUE_METRICS_S  # the first turn after a quiet spell, from no task at all
    return wait


def test_the_code_states_heartbeat_covers_the_worst_wait_for_a_worker() -> None:
    # Given the heartbeat clock, which starts when the message is sent, not when a worker takes it
    template, code = _template(), _states()["Code"]

    # Then it outlasts the longest wait on the CoderQueue (scale-out from the minimum capacity)
    wait = worst_wait_for_a_coder_worker(template)
    assert code["HeartbeatSeconds"] >= wait, (
        f"HeartbeatSeconds {code['HeartbeatSeconds']} < worst wait {wait} s"
    )
    # And the prepare step's timeout margin is computed from the same figure
    assert code["HeartbeatSeconds"] == CODER_QUEUE_WAIT_S


def test_the_coder_service_never_scales_to_zero() -> None:
    # A service at zero needs the inactive-queue metric delay on top (up to 15 min): the heartbeat is
    # sized for a scale-out from at least one warm task, so the minimum must stay >= 1.
    template = _template()
    target = template["Resources"]["CoderScalableTarget"]["Properties"]
    assert _parameter_floor(template, target["MinCapacity"]) >= 1
    scale_in = template["Resources"]["CoderScaleInPolicy"]["Properties"]["StepScalingPolicyConfiguration"]
    assert all(
        _parameter_floor(template, step["ScalingAdjustment"]) >= 1 for step in scale_in["StepAdjustments"]
    )


def test_a_worker_heartbeats_often_enough_for_the_heartbeat_and_the_visibility_timeout() -> None:
    # Given the worker's defaults (what the ECS task runs with) and the CoderQueue
    settings = WorkerSettings(coder_queue_url="https://sqs.invalid/q")
    queue = _template()["Resources"]["CoderQueue"]["Properties"]

    # Then two heartbeats may be lost before the task times out, and the message's visibility
    # (the queue's, then the worker's renewal) outlasts three heartbeat intervals
    assert 3 * settings.heartbeat_seconds <= _states()["Code"]["HeartbeatSeconds"]
    assert int(queue["VisibilityTimeout"]) >= 3 * settings.heartbeat_seconds
    assert settings.visibility_timeout_seconds >= 3 * settings.heartbeat_seconds


def test_the_code_states_timeout_covers_the_wait_the_turn_and_the_finish() -> None:
    # The state's timeout (turn_timeout_s + CODE_STATE_MARGIN_S) runs from the send; the coder's own
    # turn clock only from when a worker takes the turn.
    assert _states()["Code"]["TimeoutSecondsPath"] == "$.prepared.result.turn_timeout_s"
    assert CODE_STATE_MARGIN_S >= CODER_QUEUE_WAIT_S + CODER_FINISH_S
    # And the message stays invisible for the whole turn: SQS allows 12 h in all per receive chain
    assert MAX_TURN_TIMEOUT_S + CODE_STATE_MARGIN_S <= 12 * 3600


def test_every_lambda_task_timeout_is_above_its_functions_timeout() -> None:
    # A Task timeout below the function's would fail a step the function may still legitimately
    # finish; without one, the function's own Timeout bounds the wait.
    template = _template()
    substitutions = template["Resources"]["TurnStateMachine"]["Properties"]["DefinitionSubstitutions"]
    default = int(template["Globals"]["Function"]["Timeout"])
    for name, state in _states().items():
        if state.get("Resource") != "arn:aws:states:::lambda:invoke":
            continue
        logical = substitutions[state["Parameters"]["FunctionName"].strip("${}")]["Fn::GetAtt"][0]
        timeout = int(template["Resources"][logical]["Properties"].get("Timeout", default))
        if "TimeoutSeconds" in state:
            assert state["TimeoutSeconds"] > timeout, f"{name}: TimeoutSeconds <= {logical} Timeout {timeout}"


def test_lambda_event_source_queues_follow_the_six_times_rule() -> None:
    # AWS Lambda Developer Guide ("Using Lambda with Amazon SQS"): the queue's visibility timeout at
    # least six times the function's timeout plus MaximumBatchingWindowInSeconds, so a retried
    # batch is not delivered again while an attempt still runs.
    template = _template()
    default = int(template["Globals"]["Function"]["Timeout"])
    checked = 0
    for logical, resource in template["Resources"].items():
        if resource["Type"] != "AWS::Serverless::Function":
            continue
        timeout = int(resource["Properties"].get("Timeout", default))
        for event in resource["Properties"].get("Events", {}).values():
            if event["Type"] != "SQS":
                continue
            queue = template["Resources"][event["Properties"]["Queue"]["Fn::GetAtt"][0]]["Properties"]
            window = int(event["Properties"].get("MaximumBatchingWindowInSeconds", 0))
            needed = 6 * timeout + window
            assert int(queue["VisibilityTimeout"]) >= needed, f"{logical}: visibility < {needed} s"
            checked += 1
    assert checked, "no SQS event source found: the check checked nothing"


def test_the_worker_stops_before_ecs_kills_it() -> None:
    # ECS sends SIGKILL StopTimeout seconds after SIGTERM (at most 120 s): in-flight turns must be
    # failed (WorkerStopping) before that.
    container = _template()["Resources"]["CoderTaskDefinition"]["Properties"]["ContainerDefinitions"][0]
    settings = WorkerSettings(coder_queue_url="https://sqs.invalid/q")
    assert settings.stop_timeout_seconds + 10 <= int(container["StopTimeout"]) <= 120
