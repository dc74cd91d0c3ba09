"""`alphaagent submit` and the Python client of a deployed stack (DESIGN §3 step 1), under moto.

The CLI is called in-process (``alphaagent.cli.main``); the assertions are on what a user sees: the
message on the SpecQueue, the lines printed, the exit code.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from clocks import FakeClock
from iam import Iam, Physical
from moto_account import MotoAccount

from alphaagent.aws.client import client_settings, queue_region, submit_spec, wait_for_turn
from alphaagent.aws.store import DynamoStore
from alphaagent.cli import main
from alphaagent.cli import main as cli_main
from alphaagent.errors import InvalidSpecError, TurnWaitTimeoutError
from alphaagent.models.common import ConversationScope, utcnow
from alphaagent.models.records import ArtifactRef, Turn, TurnResult
from alphaagent.models.run import RunError
from alphaagent.models.spec import Spec, parse_spec

ROOT = Path(__file__).resolve().parents[2]
REGION = "eu-west-1"
TABLE = "alphaagent-state-test"
USER = "alice@example.com"
SCOPE = ConversationScope(conversation_id="c-demo")
TURN_ID = "01JDQ8Z6Q4M3W8K2X5V7N9B0CD"
ULID = re.compile(r"^[0-9A-HJKMNP-TV-Z]{26}$")
SPEC: dict[str, Any] = {
    "spec_version": 1,
    "user_id": USER,
    "scope": {"conversation_id": "c-demo"},
    "goal": "Summarise the monthly sales table.",
    "steps": [{"title": "summary", "code": "print('total', 3 + 4)"}],
}


ACCOUNT = "123456789012"
SPEC_QUEUE = "alphaagent-spec-queue"
NAMES = {"SpecQueue": SPEC_QUEUE, "StateTable": TABLE}
"""The test's names of the template's resources that ``SubmitAndWaitPolicy`` grants on."""


@pytest.fixture
def aws_region() -> str:
    return REGION


@pytest.fixture
def aws(moto: MotoAccount, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A moto account with the stack's SpecQueue and state table, named by the client's variables."""
    import boto3

    monkeypatch.setenv("ALPHAAGENT_STATE_TABLE", TABLE)
    for name in ("ALPHAAGENT_SPEC_QUEUE_URL", "ALPHAAGENT_USER"):
        monkeypatch.delenv(name, raising=False)
    # The CLI runs as an operator allowed exactly the template's SubmitAndWaitPolicy (tests/iam.py).
    iam = Iam((ROOT / "template.yaml").read_text(), Physical(REGION, ACCOUNT, names=NAMES))
    iam.add_principal("Operator", iam.managed_policy("SubmitAndWaitPolicy"))
    monkeypatch.setitem(globals(), "main", iam.as_component("Operator", cli_main))
    iam.install()
    try:
        moto.state_table(TABLE)
        queue_url = moto.queue(SPEC_QUEUE)
        monkeypatch.setenv("ALPHAAGENT_SPEC_QUEUE_URL", queue_url)
        client_settings.cache_clear()
        yield {
            "sqs": moto.client("sqs"),
            "queue_url": queue_url,
            "store": DynamoStore(TABLE, client=boto3.client("dynamodb", region_name=REGION)),
            "iam": iam,
        }
    finally:
        iam.uninstall()
    client_settings.cache_clear()
    assert not iam.denied, iam.report()


def _spec_file(tmp_path: Path, **fields: Any) -> str:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(SPEC | fields))
    return str(path)


def _messages(aws: dict[str, Any]) -> list[str]:
    response = aws["sqs"].receive_message(QueueUrl=aws["queue_url"], MaxNumberOfMessages=10)
    return [message["Body"] for message in response.get("Messages", [])]


def _running_turn(
    store: DynamoStore, user_id: str = USER, turn_id: str = TURN_ID, spec_sha256: str | None = None
) -> Turn:
    turn = Turn(
        turn_id=turn_id,
        user_id=user_id,
        scope_key=SCOPE.key,
        session_id="s-1",
        status="running",
        goal=SPEC["goal"],
        started_at=utcnow(),
        spec_sha256=spec_sha256,
    )
    assert store.create_turn(turn)
    return turn


def _finish(store: DynamoStore, turn: Turn, result: TurnResult) -> None:
    assert store.finish_turn(
        turn.model_copy(update={"status": result.status, "finished_at": utcnow(), "result": result})
    )


COMPLETED = TurnResult(
    turn_id=TURN_ID,
    status="completed",
    summary="total 7",
    artifacts=[
        ArtifactRef(
            artifact_id="a-1",
            kind="report",
            name="summary",
            version=1,
            path="reports/summary.md",
            sha256="0" * 64,
            size_bytes=12,
        )
    ],
)
FAILED = TurnResult(
    turn_id=TURN_ID,
    status="failed",
    error=RunError(name="ZeroDivisionError", value="division by zero", traceback=""),
    failed_step="summary",
)


# ----------------------------------------------------------------------------- submit


def test_submit_sends_one_message_that_is_the_spec_with_a_new_turn_id(
    aws: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a spec without a turn id and the queue named by ALPHAAGENT_SPEC_QUEUE_URL
    spec_path = _spec_file(tmp_path)

    # When it is submitted
    code = main(["submit", spec_path])

    # Then exactly one message is on the queue, the spec with the turn id that was printed
    out = capsys.readouterr().out
    assert code == 0
    turn_id = out.removeprefix("submitted turn ").strip()
    assert ULID.match(turn_id), out
    (body,) = _messages(aws)
    sent = parse_spec(body)
    assert sent.turn_id == turn_id
    assert sent.model_dump(exclude={"turn_id"}) == parse_spec(json.dumps(SPEC)).model_dump(
        exclude={"turn_id"}
    )


def test_an_explicit_turn_id_is_kept_and_json_names_the_queue(
    aws: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a spec that carries its own turn id (a re-submission is then a duplicate, not a new turn)
    spec_path = _spec_file(tmp_path, turn_id=TURN_ID)

    # When it is submitted with --json
    code = main(["submit", spec_path, "--json"])

    # Then the turn id is unchanged, in the output and in the message
    assert code == 0
    assert json.loads(capsys.readouterr().out) == {"turn_id": TURN_ID, "queue_url": aws["queue_url"]}
    (body,) = _messages(aws)
    assert json.loads(body)["turn_id"] == TURN_ID


def test_user_and_conversation_flags_supply_the_spec_fields(
    aws: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a spec in c-demo without user_id and an explicit queue URL (the environment's is not used)
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps({k: v for k, v in SPEC.items() if k != "user_id"}))

    # When bob submits it to another conversation
    code = main(
        [
            "submit",
            str(spec_path),
            "--user",
            "bob",
            "--conversation",
            "c-other",
            "--queue-url",
            aws["queue_url"],
        ]
    )

    # Then the message carries bob and c-other
    assert code == 0, capsys.readouterr().err
    (body,) = _messages(aws)
    sent = json.loads(body)
    assert sent["user_id"] == "bob"
    assert sent["scope"] == {"conversation_id": "c-other"}


def test_a_spec_of_another_user_than_the_user_flag_is_refused_and_nothing_sent(
    aws: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a spec of alice's
    spec_path = _spec_file(tmp_path)

    # When bob submits it
    code = main(["submit", spec_path, "--user", "bob", "--queue-url", aws["queue_url"]])

    # Then one line names the disagreement, exit 2, and nothing was sent (one identity rule)
    err = capsys.readouterr().err
    assert code == 2
    assert (
        err
        == f"alphaagent: error: user_id: the spec says \"{USER}\" but --user says 'bob'; drop one of them\n"
    )
    assert _messages(aws) == []


def test_a_queue_url_that_is_not_a_url_is_a_usage_error(
    aws: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a queue "URL" that is a name, not a URL
    # When a spec is submitted
    code = main(["submit", _spec_file(tmp_path), "--queue-url", "not-a-url"])

    # Then exit 2 with one line saying what a queue URL looks like, and nothing is sent
    err = capsys.readouterr().err
    assert code == 2
    assert "--queue-url" in err and "https://sqs.REGION.amazonaws.com/ACCOUNT/NAME" in err
    assert _messages(aws) == []


def test_a_missing_queue_url_is_a_usage_error_naming_flag_and_variable(
    aws: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given no --queue-url and no ALPHAAGENT_SPEC_QUEUE_URL
    monkeypatch.delenv("ALPHAAGENT_SPEC_QUEUE_URL")
    client_settings.cache_clear()

    # When a spec is submitted
    code = main(["submit", _spec_file(tmp_path)])

    # Then exit 2 with one line naming both, and nothing is sent
    err = capsys.readouterr().err
    assert code == 2
    assert "--queue-url" in err and "ALPHAAGENT_SPEC_QUEUE_URL" in err
    assert len(err.strip().splitlines()) == 1
    assert _messages(aws) == []


def test_wait_without_a_table_is_a_usage_error_before_anything_is_sent(
    aws: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given no --table and no ALPHAAGENT_STATE_TABLE
    monkeypatch.delenv("ALPHAAGENT_STATE_TABLE")
    client_settings.cache_clear()

    # When a spec is submitted with --wait
    code = main(["submit", _spec_file(tmp_path), "--wait"])

    # Then exit 2 naming --table and the variable, and no turn was left behind
    err = capsys.readouterr().err
    assert code == 2
    assert "--table" in err and "ALPHAAGENT_STATE_TABLE" in err
    assert _messages(aws) == []


def test_an_invalid_spec_exits_2_with_one_line_and_sends_nothing(
    aws: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a spec with an unknown environment id
    spec_path = _spec_file(tmp_path, environment_id="Not Valid")

    # When it is submitted
    code = main(["submit", spec_path])

    # Then exit 2, one line naming the field, nothing on the queue
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("alphaagent: error: environment_id:") and len(err.splitlines()) == 1
    assert _messages(aws) == []


def test_an_aws_error_is_one_line_and_exit_2(
    aws: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a queue URL that names no queue
    missing = aws["queue_url"].replace("alphaagent-spec-queue", "no-such-queue")

    # When a spec is submitted to it
    code = main(["submit", _spec_file(tmp_path), "--queue-url", missing])

    # Then exit 2 (a platform failure) with one line, no traceback
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("alphaagent: error: AWS: ") and len(err.splitlines()) == 1
    assert "Traceback" not in err
    # (Under the operator's policy AWS refuses another queue before it looks for it: AccessDenied.)
    assert aws["iam"].denied and "no-such-queue" in aws["iam"].denied[0]
    aws["iam"].denied.clear()


def test_missing_credentials_are_a_platform_error_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import boto3

    # Given no AWS credentials anywhere botocore looks (no variables, no files, no instance metadata)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", raising=False)
    monkeypatch.delenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", raising=False)
    monkeypatch.delenv("AWS_WEB_IDENTITY_TOKEN_FILE", raising=False)
    client_settings.cache_clear()
    # ...and no boto3 default session holding credentials an earlier test of this worker resolved
    # (a fresh `alphaagent submit` process has none; one left behind made this test reach the network)
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    queue_url = "https://sqs.eu-west-1.amazonaws.com/123456789012/alphaagent-spec-queue"

    # When a spec is submitted
    code = main(["submit", _spec_file(tmp_path), "--queue-url", queue_url])

    # Then exit 2, not 1 (1 means the turn failed): one line that says what is missing
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("alphaagent: error: AWS: ") and len(err.splitlines()) == 1
    assert "credentials" in err.lower()


def test_submit_spec_refuses_a_spec_over_the_size_limit(aws: dict[str, Any]) -> None:
    # Given a spec built in Python (not parsed, so nothing checked its size) of about 100 KiB
    spec = Spec.model_validate(SPEC | {"steps": [{"title": f"s{i}", "code": "x" * 1000} for i in range(100)]})

    # When it is submitted
    with pytest.raises(InvalidSpecError, match="larger than the 64 KiB limit") as caught:
        submit_spec(spec, queue_url=aws["queue_url"])

    # Then the error names the limits and nothing is sent
    assert "SQS message 256 KiB" in str(caught.value)
    assert _messages(aws) == []


@pytest.mark.parametrize(
    ("url", "region"),
    [
        ("https://sqs.eu-west-1.amazonaws.com/123456789012/alphaagent-spec", "eu-west-1"),
        ("https://ap-southeast-2.queue.amazonaws.com/123456789012/q", "ap-southeast-2"),
        ("http://localhost:4566/000000000000/q", None),
    ],
)
def test_queue_region_reads_the_region_from_the_url(url: str, region: str | None) -> None:
    assert queue_region(url) == region


# ----------------------------------------------------------------------------- wait


def test_wait_reports_each_status_until_the_result(aws: dict[str, Any]) -> None:
    # Given a turn that is queued, then starts, then completes (one step per poll)
    store: DynamoStore = aws["store"]
    statuses: list[str] = []
    naps: list[float] = []
    turn: list[Turn] = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        if not turn:
            turn.append(_running_turn(store))
        else:
            _finish(store, turn[0], COMPLETED)

    # When the client waits for it
    result = wait_for_turn(
        store, USER, TURN_ID, timeout_s=60, poll_s=2, progress=statuses.append, sleep=sleep
    )

    # Then it saw each status once and returns the stored result
    assert statuses == ["queued", "running", "completed"]
    assert naps == [2, 2]
    assert result == COMPLETED


def test_wait_times_out_naming_the_turn_and_the_seconds(aws: dict[str, Any]) -> None:
    # Given a turn that never starts, and a clock that advances by each nap
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    # When the client waits 5 s, polling every 2 s
    with pytest.raises(TurnWaitTimeoutError) as caught:
        wait_for_turn(aws["store"], USER, TURN_ID, timeout_s=5, poll_s=2, sleep=sleep, clock=lambda: now[0])

    # Then it gives up at the deadline (never sleeping past it) and says so
    assert now[0] == 5
    assert str(caught.value) == (
        f"turn {TURN_ID}: no result after 5 s (no turn record yet: still queued, or not a turn of this user)"
    )


def _recorder_announces(aws: dict[str, Any], user_id: str = USER, turn_id: str = TURN_ID) -> bool:
    """What the recorder does after persisting a turn's end (as its role in template.yaml)."""
    import boto3

    from alphaagent.aws.turn_notices import send_turn_notice

    sqs = boto3.client("sqs", region_name=REGION)
    announce = aws["iam"].as_component("RecordEventFunction", send_turn_notice)
    sent: bool = announce(sqs, ACCOUNT, user_id, turn_id)
    return sent


def _finish_and_announce(aws: dict[str, Any], turn: Turn, result: TurnResult) -> None:
    _finish(aws["store"], turn, result)
    _recorder_announces(aws)


def _finish_unchecked(aws: dict[str, Any], turn: Turn, result: TurnResult) -> None:
    """The turn's end written by the stack (a fake clock runs it in the waiting thread: not as the
    operator)."""
    with aws["iam"].acting_as(None):
        _finish(aws["store"], turn, result)


def _turn_queues(aws: dict[str, Any]) -> list[str]:
    return [u for u in aws["sqs"].list_queues().get("QueueUrls", []) if "alphaagent-turns-" in u]


def _finish_after_the_first_read(
    aws: dict[str, Any], monkeypatch: pytest.MonkeyPatch, turn: Turn, delay_s: float
) -> tuple[threading.Thread, list[float]]:
    """A worker that ends ``turn`` (and the recorder that announces it) ``delay_s`` after the wait
    has read the record once: the wait sees "running" first however slow the machine is. Returns the
    worker and the times (monotonic s) at which the wait read the record."""
    reads: list[float] = []
    first = threading.Event()
    original = DynamoStore.get_turn

    def get_turn(self: DynamoStore, user_id: str, turn_id: str) -> Turn | None:
        found = original(self, user_id, turn_id)
        reads.append(time.monotonic())
        first.set()
        return found

    monkeypatch.setattr(DynamoStore, "get_turn", get_turn)

    def work() -> None:
        if first.wait(60):
            time.sleep(delay_s)
            _finish_and_announce(aws, turn, COMPLETED)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    return worker, reads


def test_submit_wait_prints_progress_and_the_result_and_exits_0(
    aws: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a running turn that a worker finishes a moment after the wait first reads it (and the
    # recorder announces)
    turn = _running_turn(aws["store"])
    worker, _ = _finish_after_the_first_read(aws, monkeypatch, turn, 0.3)

    # When its spec is submitted with --wait
    started = time.monotonic()
    code = main(["submit", _spec_file(tmp_path, turn_id=TURN_ID), "--wait", "--timeout", "30"])
    worker.join()

    # Then progress went to stderr, the result like `run` prints it to stdout, exit 0
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.err.splitlines() == [
        f"submitted turn {TURN_ID}",
        f"turn {TURN_ID}: running",
        f"turn {TURN_ID}: completed",
    ]
    assert captured.out.splitlines() == [
        f"turn {TURN_ID}: completed",
        "total 7",
        "  report   summary v1  conversations/c-demo/reports/summary.md",
    ]
    assert time.monotonic() - started < 10


def test_submit_wait_json_prints_the_turn_result(
    aws: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a turn of this spec that has already completed (a re-submission of a finished turn)
    store: DynamoStore = aws["store"]
    _finish(store, _running_turn(store), COMPLETED)

    # When the spec is submitted again with --wait --json
    code = main(["submit", _spec_file(tmp_path, turn_id=TURN_ID), "--wait", "--json"])

    # Then the stored result is printed as JSON
    assert code == 0
    assert TurnResult.model_validate_json(capsys.readouterr().out) == COMPLETED


def test_submit_wait_on_a_failed_turn_prints_the_error_and_exits_1(
    aws: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a turn of this spec that failed
    store: DynamoStore = aws["store"]
    _finish(store, _running_turn(store), FAILED)

    # When its spec is submitted with --wait
    code = main(["submit", _spec_file(tmp_path, turn_id=TURN_ID), "--wait"])

    # Then the failure is printed and the exit code is 1
    out = capsys.readouterr().out
    assert code == 1
    assert out.splitlines() == [
        f"turn {TURN_ID}: failed",
        "error in summary: ZeroDivisionError: division by zero",
    ]


def test_submit_wait_timeout_exits_1_naming_the_turn(
    aws: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a spec whose turn never starts (no starter runs under moto)
    spec_path = _spec_file(tmp_path, turn_id=TURN_ID)

    # When it is submitted with a short --wait
    code = main(["submit", spec_path, "--wait", "--timeout", "0.2"])

    # Then exit 1 with one line naming the turn; the spec was still sent
    captured = capsys.readouterr()
    assert code == 1
    assert captured.out == ""
    last = captured.err.splitlines()[-1]
    assert last.startswith(f"alphaagent: error: turn {TURN_ID}: no result after ")
    assert len(_messages(aws)) == 1


def test_another_users_turn_is_never_shown(
    aws: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str], fake_clock: FakeClock
) -> None:
    # Given bob's finished turn, and the answer for a turn id that exists nowhere (both waits are
    # timed on a fake clock: the answers are compared byte for byte, the seconds waited included)
    store: DynamoStore = aws["store"]
    _finish(store, _running_turn(store, user_id="bob"), COMPLETED)
    unknown = "01JDQ8Z6Q4M3W8K2X5V7N9B0ZZ"
    assert main(["submit", _spec_file(tmp_path, turn_id=unknown), "--wait", "--timeout", "0.2"]) == 1
    nowhere = capsys.readouterr()

    # When alice waits for bob's turn id
    code = main(["submit", _spec_file(tmp_path, turn_id=TURN_ID), "--wait", "--timeout", "0.2"])

    # Then she gets exactly the answer of a turn that does not exist: queued, then a timeout
    answer = capsys.readouterr()
    assert code == 1
    assert answer.out == nowhere.out == ""
    assert answer.err == nowhere.err.replace(unknown, TURN_ID)
    assert f"turn {TURN_ID}: queued" in answer.err
    assert "total 7" not in answer.err and "completed" not in answer.err


def test_a_spec_that_could_never_finish_is_refused_before_it_is_sent(
    aws: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a spec whose chart output has a .csv path (checks that need no code, issue 14)
    spec_path = _spec_file(tmp_path, outputs=[{"kind": "chart", "name": "c", "path": "charts/c.csv"}])

    # When it is submitted
    code = main(["submit", spec_path, "--queue-url", aws["queue_url"]])

    # Then one line names the output, exit 2, and nothing reached the queue
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith('alphaagent: error: outputs[0].path: "charts/c.csv" does not fit kind "chart"')
    assert _messages(aws) == []


def test_submit_wait_with_a_reused_turn_id_and_another_spec_exits_2_not_the_old_result(
    aws: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a turn that completed for the spec SPEC under TURN_ID (its digest stored with it)
    store: DynamoStore = aws["store"]
    first = parse_spec(json.dumps(SPEC | {"turn_id": TURN_ID}))
    turn = _running_turn(store, spec_sha256=first.digest())
    _finish(store, turn, COMPLETED)
    # When another spec is submitted with --wait under the same turn id (the starter rejects it)
    code = main(
        ["submit", _spec_file(tmp_path, turn_id=TURN_ID, goal="another goal"), "--wait", "--timeout", "5"]
    )
    # Then the wait does not hand back the first turn's result: one line naming the rule, exit 2
    captured = capsys.readouterr()
    assert code == 2, captured
    assert captured.err.splitlines()[-1] == (
        "alphaagent: error: turn_id: already used for a different spec; leave it out to get a fresh one"
    )
    assert "total 7" not in captured.out
    # And the same spec, resubmitted, still gets its result
    assert main(["submit", _spec_file(tmp_path, turn_id=TURN_ID), "--wait", "--timeout", "5"]) == 0


# ----------------------------------------------------------------------------- turn notices


def test_submit_wait_reads_the_record_when_the_notice_comes_not_on_a_ladder(
    aws: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a running turn that ends 3 s after the wait first reads it, announced by the recorder
    # (the fallback read, 15 s, is far away: only the notice can end the wait that soon)
    turn = _running_turn(aws["store"])
    worker, reads = _finish_after_the_first_read(aws, monkeypatch, turn, 3.0)

    # When its spec is submitted with --wait
    started = time.monotonic()
    code = main(["submit", _spec_file(tmp_path, turn_id=TURN_ID), "--wait", "--timeout", "60"])
    worker.join()
    waited = time.monotonic() - started

    # Then the record was read twice (before, and on the notice), not every 2 s, the result is
    # printed, and the wait's queue is gone
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert len(reads) == 2, reads
    assert waited < 12, waited
    assert captured.out.splitlines()[0] == f"turn {TURN_ID}: completed"
    assert _turn_queues(aws) == []


def test_a_wait_without_sqs_create_queue_says_so_in_one_line_and_polls(
    aws: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str], fake_clock: FakeClock
) -> None:
    # Given an operator allowed to submit and read turns, but not to create queues
    policy = [s for s in aws["iam"].managed_policy("SubmitAndWaitPolicy") if s.get("Sid") != "TurnNotices"]
    aws["iam"].add_principal("Operator", policy)
    store: DynamoStore = aws["store"]
    turn = _running_turn(store)
    fake_clock.after(5, lambda: _finish_unchecked(aws, turn, COMPLETED))

    # When a spec is submitted with --wait
    code = main(["submit", _spec_file(tmp_path, turn_id=TURN_ID), "--wait", "--timeout", "60"])

    # Then one line says why and what the wait does instead, and it reads every 2 s to the result
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.err.splitlines() == [
        f"submitted turn {TURN_ID}",
        f"turn {TURN_ID}: turn notices unavailable (AccessDenied: needs sqs:CreateQueue and sqs:TagQueue"
        " on alphaagent-turns-*); reading the turn record every 2 s",
        f"turn {TURN_ID}: running",
        f"turn {TURN_ID}: completed",
    ]
    assert fake_clock.sleeps == [2, 2, 2]
    assert aws["iam"].denied and "sqs:CreateQueue" in aws["iam"].denied[0]
    aws["iam"].denied.clear()


def test_without_a_notice_the_wait_reads_every_fallback_interval(
    aws: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str], fake_clock: FakeClock
) -> None:
    # Given a turn that ends 40 s into the wait with its notice lost (nobody announces it)
    from alphaagent.aws.turn_notices import FALLBACK_READ_S

    store: DynamoStore = aws["store"]
    turn = _running_turn(store)
    fake_clock.after(40, lambda: _finish_unchecked(aws, turn, COMPLETED))

    # When its spec is submitted with --wait (on the fake clock)
    code = main(["submit", _spec_file(tmp_path, turn_id=TURN_ID), "--wait", "--timeout", "120"])

    # Then the record was read at 0, 15, 30 and 45 s, the result printed, and the queue deleted
    assert code == 0, capsys.readouterr().err
    assert fake_clock.sleeps == [FALLBACK_READ_S] * 3
    assert _turn_queues(aws) == []


def test_the_wait_queue_is_tagged_to_expire_after_the_wait(
    aws: dict[str, Any], fake_clock: FakeClock
) -> None:
    import boto3

    # Given a wait of one hour for a turn
    from alphaagent.aws.client import open_turn_waiter
    from alphaagent.aws.queue_sweeper import EXPIRES_TAG
    from alphaagent.aws.turn_notices import EXPIRY_MARGIN_S

    sqs = boto3.client("sqs", region_name=REGION)
    before = time.time()
    waiter = aws["iam"].as_component("Operator", open_turn_waiter)(sqs, USER, TURN_ID, timeout_s=3600)
    assert waiter is not None
    try:
        # Then its queue carries the sweeper's expiry: the end of the wait plus the margin
        tags = aws["sqs"].list_queue_tags(QueueUrl=waiter.queue_url)["Tags"]
        expires = float(tags[EXPIRES_TAG])
        assert before + 3600 + EXPIRY_MARGIN_S <= expires <= time.time() + 3600 + EXPIRY_MARGIN_S + 1
    finally:
        aws["iam"].as_component("Operator", waiter.close)()
    assert _turn_queues(aws) == []
