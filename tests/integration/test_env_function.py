"""The env function (``alphaagent.aws.env_function``) and the coder's ``LambdaExecutor`` under moto.

The handler runs in-process exactly as Lambda calls it, on the sample ``events/env_invocation.json``,
with a real sandbox; the assertions are on what a user would see: the objects in the bucket, the
claim-check object, the pointer returned, the local working copy. The executor is driven with a fake
Lambda client that plays the env function's part (writes the claim check, or nothing).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from assertions import assert_status
from clocks import FakeClock
from iam import Iam, Physical
from moto_account import MotoAccount
from pydantic import ValidationError

from alphaagent.aws import env_run, sync
from alphaagent.aws.executor import (
    DESTINATION_HEADROOM_BYTES,
    MAX_ASYNC_PAYLOAD_BYTES,
    THROTTLE_ATTEMPTS,
    THROTTLE_BASE_S,
    LambdaExecutor,
)
from alphaagent.aws.notices import RunNotice, RunNotices, send_notice
from alphaagent.aws.store import DynamoStore
from alphaagent.aws.sync import WorkingCopies
from alphaagent.aws.workspace import S3Workspace
from alphaagent.clock import SYSTEM_CLOCK, Clock, SystemClock
from alphaagent.errors import (
    EnvDuplicateDeliveryError,
    EnvFunctionError,
    EnvInvokeError,
    EnvLeaseLostError,
    EnvPayloadTooLargeError,
    EnvRequestExpiredError,
    EnvResultTimeoutError,
    EnvScopeTooLargeError,
    EnvThrottledError,
    InvalidRequestError,
    MissingOriginError,
    RetryableError,
    SandboxError,
)
from alphaagent.models.aws import EnvPointer, EnvRequest
from alphaagent.models.common import ConversationScope
from alphaagent.models.records import RunRecord
from alphaagent.models.run import FileChangeReport, RunError, RunLimits, RunOrigin, RunResult
from alphaagent.sandbox.config import SandboxConfig
from alphaagent.sandbox.session import DEFAULT_STATE_MB
from alphaagent.sandbox.supervisor import Sandbox

ROOT = Path(__file__).resolve().parents[2]
REGION = "eu-west-1"
BUCKET = "alphaagent-workspaces-123456789012-eu-west-1"
TABLE = "alphaagent-state-test"
ACCOUNT = "123456789012"
SECRET = "the-supervisors-own-secret-0123456789"
EVENT: dict[str, Any] = json.loads((ROOT / "events" / "env_invocation.json").read_text())
SCOPE = ConversationScope.model_validate(EVENT["scope"])
RUN_ID = EVENT["run_id"]
TURN = EVENT["turn_id"]
RESULT_KEY = f"work/runs/{RUN_ID}/result.json"


class Context:
    """The attributes of a Lambda context the Powertools logger reads, and the time left."""

    function_name = "alphaagent-env-builtin"
    memory_limit_in_mb = 3008
    invoked_function_arn = f"arn:aws:lambda:{REGION}:123456789012:function:alphaagent-env-builtin"
    aws_request_id = "req-env-1"

    def __init__(self, remaining_ms: int = 900_000) -> None:
        self.remaining_ms = remaining_ms

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    # Not lambda_sandbox_config(): exclusive mode sweeps every process of the uid after each run, and
    # refuses to as root, which is how these tests run. Everything else the handler does is the same.
    with Sandbox(SandboxConfig(isolation="process", pool_size=1, preload=(), warmup="")) as box:
        yield box


@pytest.fixture
def aws_region() -> str:
    """The region of this module's moto account (the ``moto`` fixture of tests/conftest.py)."""
    return REGION


@pytest.fixture
def aws(moto: MotoAccount, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The moto account with the workspaces bucket and the state table; returns the S3 client."""
    from alphaagent.aws import env_function

    for name, value in {
        "AWS_SECRET_ACCESS_KEY": SECRET,  # what test_the_run_sees_no_aws_variables looks for
        "POWERTOOLS_TRACE_DISABLED": "true",
        "WORKSPACES_BUCKET_NAME": BUCKET,
        "STATE_TABLE_NAME": TABLE,
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("ENV_SYNC_MAX_BYTES", raising=False)
    env_function.get_env_settings.cache_clear()
    env_function.get_store.cache_clear()
    env_function.get_sqs.cache_clear()  # a client is bound to the moto account it was made in
    # invoke() runs the handler with the env function's role from template.yaml (tests/iam.py).
    iam = Iam((ROOT / "template.yaml").read_text(), Physical(REGION, ACCOUNT, names={"StateTable": TABLE}))
    iam.install()
    _IAM[:] = [iam]
    try:
        s3 = moto.bucket(BUCKET)
        moto.state_table(TABLE)
        # The sample request's turn holds its scope's lease, as its execution does while it runs.
        DynamoStore(TABLE).acquire_lock(SCOPE.key, TURN, datetime.now(UTC), 3600)
        yield s3
    finally:
        iam.uninstall()
        _IAM.clear()
        env_function.get_env_settings.cache_clear()
        env_function.get_store.cache_clear()
        env_function.get_sqs.cache_clear()
    assert not iam.denied, iam.report()


_IAM: list[Iam] = []
"""The running test's IAM harness (``invoke`` is a plain function, not a fixture)."""


@pytest.fixture
def workspace(aws: Any, tmp_path: Path, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> S3Workspace:
    """The handler's workspace (working copies under tmp_path) and the test sandbox, patched into the
    handler's cached getters."""
    from alphaagent.aws import env_function

    workspace = S3Workspace(BUCKET, client=aws, local_dir=tmp_path / "working-copies")
    monkeypatch.setattr(env_function, "get_workspace", lambda: workspace)
    monkeypatch.setattr(env_function, "get_sandbox", lambda: sandbox)
    workspace.ensure_scope(SCOPE)
    return workspace


def invoke(code: str, context: Context | None = None, **fields: Any) -> dict[str, Any]:
    """The handler on the sample event with ``code`` (and any other field replaced)."""
    from alphaagent.aws import env_function

    event = {**EVENT, "code": code, **fields}
    with _IAM[0].acting_as("EnvBuiltinFunction"):
        answer: dict[str, Any] = env_function.lambda_handler(event, context or Context())
    return answer


def scope_objects(s3: Any, *, with_state: bool = False) -> dict[str, bytes]:
    """The scope's files in the bucket (folder markers left out): workspace path -> bytes. The
    sessions' live state (``work/sessions/``, which every run of a session writes) only when
    ``with_state``."""
    found: dict[str, bytes] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{SCOPE.key}/"):
        for item in page.get("Contents", []):
            path = item["Key"][len(SCOPE.key) + 1 :]
            if not path.endswith("/") and (with_state or not path.startswith("work/sessions/")):
                found[path] = s3.get_object(Bucket=BUCKET, Key=item["Key"])["Body"].read()
    return found


def local_files(workspace: S3Workspace, scope: ConversationScope = SCOPE) -> dict[str, bytes]:
    """The regular files of the scope's local working copy: workspace path -> bytes (the sessions'
    live state, ``work/sessions/``, left out as in ``scope_objects``)."""
    root = workspace.local_root(scope)
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file()
        and not path.is_symlink()
        and not path.relative_to(root).as_posix().startswith("work/sessions/")
    }


def stored_result(workspace: S3Workspace, run_id: str = RUN_ID) -> RunResult:
    return RunResult.model_validate_json(workspace.read_bytes(SCOPE, f"work/runs/{run_id}/result.json"))


MARGIN_S = env_run.sync_margin_s(DEFAULT_STATE_MB * 2**20)
"""Seconds the handler keeps back from a run for what follows it, at the default 512 MiB state cap."""


def context_leaving(seconds: float) -> Context:
    """A context whose invocation leaves the run ``seconds`` once the sync margin is kept back."""
    return Context(remaining_ms=round((MARGIN_S + seconds) * 1000))


class TimedSandbox:
    """The test sandbox, each run of which also takes ``seconds`` on ``clock`` (a run that ends after
    its caller stopped waiting, without a test that waits that long)."""

    def __init__(self, box: Sandbox, clock: FakeClock, seconds: float) -> None:
        self.box, self.clock, self.seconds = box, clock, seconds

    @property
    def info(self) -> dict[str, Any]:
        return self.box.info

    def run(self, *args: Any, **kwargs: Any) -> RunResult:
        result = self.box.run(*args, **kwargs)
        self.clock.advance(self.seconds)
        return result


# ----------------------------------------------------------------------------- the env function


def test_a_run_reads_synced_files_and_its_changes_reach_the_bucket(aws: Any, workspace: S3Workspace) -> None:
    # Given a scope with a document, a dataset and a report
    workspace.write_bytes(SCOPE, "docs/brief.txt", b"count the rows")
    workspace.write_bytes(SCOPE, "datasets/old.csv", b"v\n1\n")
    workspace.write_bytes(SCOPE, "reports/gone.md", b"# obsolete\n")
    code = (
        "import os\n"
        "brief = open('docs/brief.txt').read()\n"
        "open('datasets/x.csv', 'w').write('brief\\n' + brief + '\\n')\n"
        "open('datasets/old.csv', 'a').write('2\\n')\n"
        "os.remove('reports/gone.md')\n"
        "print('read:', brief)\n"
    )

    # When the env function runs code that reads the document, writes, modifies and deletes
    answer = invoke(code)

    # Then the bucket holds the new and modified files, the deleted one is gone
    objects = scope_objects(aws)
    assert objects["datasets/x.csv"] == b"brief\ncount the rows\n"
    assert objects["datasets/old.csv"] == b"v\n1\n2\n"
    assert "reports/gone.md" not in objects
    # And the claim check holds the run result, the answer is the pointer to it
    result = stored_result(workspace)
    assert_status(result, "ok")
    assert (result.run_id, result.stdout) == (RUN_ID, "read: count the rows\n")
    assert result.files == FileChangeReport(
        created=["datasets/x.csv"], modified=["datasets/old.csv"], deleted=["reports/gone.md"]
    )
    assert result.files_changed == ["datasets/old.csv", "datasets/x.csv", "reports/gone.md"]
    assert answer == EnvPointer(run_id=RUN_ID, status="ok", result_key=RESULT_KEY).model_dump()
    # And the working copy is kept for the scope's next run, holding the scope's files and no more
    # (the session's live state is there too, compared in the state tests below)
    kept = {
        path: data for path, data in local_files(workspace).items() if not path.startswith("work/sessions/")
    }
    assert kept == {path: data for path, data in objects.items() if not path.startswith("work/runs/")}


def test_links_and_rule_breaking_names_are_not_uploaded_and_are_reported(
    aws: Any, workspace: S3Workspace
) -> None:
    # Given code that plants links out of the scope and names that break the path rules
    code = (
        "import os\n"
        "os.symlink('/etc/passwd', 'reports/passwd')\n"
        "os.symlink('/etc', 'docs/etc')\n"
        "os.symlink('../../..', 'work/up')\n"
        "open('reports/back\\\\slash.txt', 'w').write('x')\n"
        "open('reports/bell\\x07.txt', 'w').write('x')\n"
        "open('reports/cafe\\u0301.txt', 'w').write('not NFC')\n"
        "open('reports/fine.txt', 'w').write('fine')\n"
    )

    # When the env function runs it
    invoke(code)

    # Then only the regular files with a valid name reach the bucket (besides the claim check), the
    # decomposed name under its NFC spelling
    assert sorted(scope_objects(aws)) == ["reports/caf\u00e9.txt", "reports/fine.txt", RESULT_KEY]
    # And every other entry is reported with its reason, naming the rule, none silently dropped
    result = stored_result(workspace)
    skipped = {item.path: item.reason for item in result.files.skipped}
    assert skipped["reports/passwd"] == "symlink"
    assert skipped["docs/etc"] == "symlink to directory (not followed)"
    assert skipped["work/up"] == "symlink to directory (not followed)"
    assert skipped["reports/back\\slash.txt"] == "not stored: path must use '/' as separator (no '\\')"
    assert skipped["reports/bell\x07.txt"].startswith("not stored: path must not contain NUL, control")
    assert result.files.created == ["reports/caf\u00e9.txt", "reports/fine.txt"]
    assert result.files_changed == ["reports/caf\u00e9.txt", "reports/fine.txt"]


def test_names_follow_the_local_rule_nfc_kept_duplicates_and_long_keys_skipped_with_values(
    aws: Any, workspace: S3Workspace
) -> None:
    # Given code that writes one name in NFC and NFD, and a file whose full key is over 1,024 bytes
    nfc, nfd = "reports/caf\u00e9.md", "reports/cafe\u0301.md"
    deep = "/".join(["d" * 200] * 5)
    code = (
        "import os\n"
        f"open({nfc!r}, 'w').write('composed')\n"
        f"open({nfd!r}, 'w').write('decomposed')\n"
        f"os.makedirs('reports/{deep}')\nopen('reports/{deep}/x.txt', 'w').write('x')\n"
    )
    # When the env function runs it
    invoke(code)
    # Then the NFC file alone is uploaded, with its own content
    objects = scope_objects(aws)
    assert objects[nfc] == b"composed" and sorted(objects) == [nfc, RESULT_KEY]
    # And the skips are the local backend's, word for word: the NFC name, the key size and the limit
    skipped = {item.path: item.reason for item in stored_result(workspace).files.skipped}
    assert skipped[nfd].startswith(f"not stored: its NFC name {nfc!r} is another file's"), skipped
    key_bytes = len(f"{SCOPE.key}/reports/{deep}/x.txt".encode())
    assert skipped[f"reports/{deep}/x.txt"] == (
        f"not stored: path is too long: the full key is {key_bytes} UTF-8 bytes, over S3's"
        " 1024-byte key limit"
    )


def test_keys_the_sync_down_skips_are_reported_with_the_rule_they_break(
    aws: Any, workspace: S3Workspace
) -> None:
    # Given keys put in the bucket by another writer: a decomposed name and one with a backslash
    for path in ("docs/cafe\u0301.txt", "docs/back\\slash.txt"):
        aws.put_object(Bucket=BUCKET, Key=f"{SCOPE.key}/{path}", Body=b"x")
    # When a run syncs the scope down
    invoke("print(1)")
    # Then each skip says which rule the key breaks
    skipped = {item.path: item.reason for item in stored_result(workspace).files.skipped}
    prefix = "not synced down: the key breaks a workspace path rule (DESIGN §4.2): "
    assert (
        skipped["docs/cafe\u0301.txt"]
        == f"{prefix}the name is not in NFC (its NFC form is 'docs/caf\u00e9.txt')"
    )
    assert skipped["docs/back\\slash.txt"] == f"{prefix}path must use '/' as separator (no '\\')"


def test_run_code_cannot_rewrite_or_forge_what_the_platform_writes(aws: Any, workspace: S3Workspace) -> None:
    # Given a turn's spec, an earlier turn's result and an event claim check in the scope
    spec, turn_result = f"spec/{TURN}.json", "work/turns/01JDQ8Z6Q4M3W8K2X5V7N9B0AA/result.json"
    workspace.write_bytes(SCOPE, spec, b'{"goal": "the user\'s own"}')
    workspace.write_bytes(SCOPE, turn_result, b'{"status": "completed"}')
    code = (
        "import os, glob\n"
        "[spec] = glob.glob('spec/*.json')\n"
        'open(spec, \'w\').write(\'{"steps": [{"title": "x", "code": "steal()"}]}\')\n'
        "os.makedirs('work/turns/NEXT', exist_ok=True)\n"
        "open('work/turns/NEXT/result.json', 'w').write('{\"status\": \"completed\"}')\n"
        "os.makedirs('work/events', exist_ok=True)\n"
        "open('work/events/E.json', 'w').write('{}')\n"
        f"os.remove({turn_result!r})\n"
        "open('reports/ok.md', 'w').write('ok')\n"
    )

    # When the env function runs code that rewrites the spec, forges a turn result and an event
    # claim check, and deletes an earlier turn's result
    invoke(code)

    # Then none of it reached the bucket; the ordinary file did; each refusal is reported
    objects = scope_objects(aws)
    assert objects[spec] == b'{"goal": "the user\'s own"}'
    assert objects[turn_result] == b'{"status": "completed"}'
    assert "work/turns/NEXT/result.json" not in objects and "work/events/E.json" not in objects
    assert objects["reports/ok.md"] == b"ok"
    skipped = {item.path: item.reason for item in stored_result(workspace).files.skipped}
    for path in (spec, "work/turns/NEXT/result.json", "work/events/E.json"):
        assert skipped[path].startswith("not uploaded: spec/, work/turns/"), path
    assert skipped[turn_result].startswith("not deleted: spec/, work/turns/")


def test_a_platform_folder_replaced_by_a_file_is_not_uploaded(aws: Any, workspace: S3Workspace) -> None:
    # Given the turn's spec in the scope
    spec = f"spec/{TURN}.json"
    workspace.write_bytes(SCOPE, spec, b"{}")
    code = (
        "import os\n"
        "os.rename('spec', 'x')\n"
        "open('spec', 'w').write('a file where the folder was')\n"
        "os.makedirs('work', exist_ok=True)\n"
        "open('work/events', 'w').write('and another')\n"
    )

    # When a run replaces spec/ and work/events/ with files of the same names
    invoke(code)

    # Then neither file is uploaded (later runs still see the folders), the spec is still there,
    # and both are reported
    objects = scope_objects(aws)
    assert "spec" not in objects and "work/events" not in objects and objects[spec] == b"{}"
    skipped = {item.path: item.reason for item in stored_result(workspace).files.skipped}
    assert skipped["spec"].startswith("not uploaded: spec/, work/turns/")
    assert skipped["work/events"].startswith("not uploaded: spec/, work/turns/")


def test_spill_files_of_older_runs_are_not_synced_down(aws: Any, workspace: S3Workspace) -> None:
    # Given a scope with the spill file and claim check of an older run
    workspace.write_bytes(SCOPE, "work/runs/01OLDRUN/stdout.txt", b"old output")
    workspace.write_bytes(SCOPE, "work/runs/01OLDRUN/result.json", b"{}")
    workspace.write_bytes(SCOPE, "work/notes.txt", b"kept")

    # When a run looks for them
    invoke("import os\nprint(os.path.exists('work/runs/01OLDRUN'), open('work/notes.txt').read())")

    # Then they were not in its working copy, other work/ files were, and the old objects stay
    assert stored_result(workspace).stdout == "False kept\n"
    objects = scope_objects(aws)
    assert objects["work/runs/01OLDRUN/stdout.txt"] == b"old output"


def test_an_error_in_user_code_is_a_result_with_a_pointer(workspace: S3Workspace) -> None:
    # When the code raises
    answer = invoke("print('before')\n1 / 0\n")

    # Then the function still answers with a pointer, and the error is data in the result
    assert answer == EnvPointer(run_id=RUN_ID, status="error", result_key=RESULT_KEY).model_dump()
    result = stored_result(workspace)
    assert_status(result, "error")
    assert result.stdout == "before\n"
    assert result.error is not None and result.error.name == "ZeroDivisionError"


def test_a_scope_over_the_sync_cap_is_refused_naming_its_size_and_the_cap(
    aws: Any, workspace: S3Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    from alphaagent.aws import env_function

    # Given a 100-byte sync cap and a scope of 1,010 bytes
    monkeypatch.setenv("ENV_SYNC_MAX_BYTES", "100")
    env_function.get_env_settings.cache_clear()
    workspace.write_bytes(SCOPE, "docs/small.txt", b"s" * 10)
    workspace.write_bytes(SCOPE, "datasets/big.bin", b"b" * 1000)

    # When a run is asked for, Then it fails with a message naming the scope, its size and the cap
    with pytest.raises(EnvScopeTooLargeError) as raised:
        invoke("open('reports/ran.md', 'w').write('ran')")
    assert str(raised.value).startswith(
        f"scope {SCOPE.key}: its files are 1,010 bytes (0.0 MiB) in 2 files, over the sync cap of 100 bytes"
    )
    assert "ENV_SYNC_MAX_BYTES" in str(raised.value)
    # And nothing ran: no result, no file, the bucket untouched, no working copy left
    objects = scope_objects(aws)
    assert RESULT_KEY not in objects and "reports/ran.md" not in objects
    assert objects["datasets/big.bin"] == b"b" * 1000
    assert not workspace.local_root(SCOPE).exists()


def test_the_sessions_state_counts_against_the_sync_cap(
    aws: Any, workspace: S3Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    from alphaagent.aws import env_function

    # Given a 1,500-byte sync cap, a scope of 1,010 bytes and the run's session's state of 1,000 bytes
    # (both share /tmp with what the run writes)
    monkeypatch.setenv("ENV_SYNC_MAX_BYTES", "1500")
    env_function.get_env_settings.cache_clear()
    workspace.write_bytes(SCOPE, "docs/small.txt", b"s" * 10)
    workspace.write_bytes(SCOPE, "datasets/big.bin", b"b" * 1000)
    workspace.write_bytes(SCOPE, f"work/sessions/{EVENT['session_id']}/objects.bin", b"o" * 1000)

    # When a run is asked for, Then it fails naming the scope's bytes, the state's bytes and the cap
    with pytest.raises(EnvScopeTooLargeError) as raised:
        invoke("open('reports/ran.md', 'w').write('ran')")
    assert str(raised.value).startswith(
        f"scope {SCOPE.key}: its files are 1,010 bytes (0.0 MiB) in 2 files and the session state 1,000"
        " bytes (0.0 MiB), over the sync cap of 1,500 bytes"
    )
    assert "reports/ran.md" not in scope_objects(aws) and not workspace.local_root(SCOPE).exists()


def test_the_run_sees_no_aws_variables(workspace: S3Workspace) -> None:
    # Given the function's process holds AWS credentials (the aws fixture sets AWS_SECRET_ACCESS_KEY)
    code = (
        "import os\n"
        "print(sorted(k for k in os.environ if k.startswith(('AWS', '_X_AMZN', 'LAMBDA'))))\n"
        f"print(any({SECRET!r} in v for v in os.environ.values()))\n"
    )

    # When a run lists its environment
    invoke(code)

    # Then it has no AWS variable and no value holding the secret
    assert stored_result(workspace).stdout == "[]\nFalse\n"


def test_output_over_the_history_cap_is_spilled_and_uploaded(aws: Any, workspace: S3Workspace) -> None:
    # When a run prints more than the stored-history cap (16 KiB)
    invoke("print('x' * 40_000)")

    # Then the full output is uploaded as the run's spill file and the result names it
    result = stored_result(workspace)
    assert result.stdout_path == f"work/runs/{RUN_ID}/stdout.txt"
    assert scope_objects(aws)[result.stdout_path] == b"x" * 40_000 + b"\n"
    assert result.files_changed == []


def test_a_second_delivery_of_the_same_request_does_not_run_the_code_again(
    aws: Any, workspace: S3Workspace
) -> None:
    # Given a run that appends to a file, already done once
    code = "open('datasets/runs.txt', 'a').write('ran\\n')"
    first = invoke(code)

    # When Lambda delivers the same event again
    second = invoke(code)

    # Then the code ran once and both answers point at the same result
    assert first == second
    assert scope_objects(aws)["datasets/runs.txt"] == b"ran\n"


def test_the_run_timeout_is_cut_to_the_time_the_invocation_has_left(
    workspace: S3Workspace, fake_clock: FakeClock
) -> None:
    # Given an invocation with 1.5 s left once the sync margin is kept back (on a clock that stands
    # still while the scope syncs), and a run allowed 60 s
    context = context_leaving(1.5)

    # When the code sleeps longer than what is left
    invoke("import time\ntime.sleep(10)", context)

    # Then the run timed out after 1.5 s, its result says so, and it was still synced
    result = stored_result(workspace)
    assert_status(result, "timeout")
    assert result.limits["timeout_s"] == 1.5
    assert result.reason is not None and "1.5 s" in result.reason


def test_a_request_that_cannot_run_raises_and_leaves_no_result(aws: Any, workspace: S3Workspace) -> None:
    # When the code is empty (a platform-side refusal: the OnFailure destination records it)
    with pytest.raises(InvalidRequestError, match="code: must not be empty"):
        invoke("   ")

    # Then there is no claim check and no working copy left
    assert RESULT_KEY not in scope_objects(aws)
    assert not workspace.local_root(SCOPE).exists()


def test_a_run_id_that_is_not_one_path_segment_is_refused(workspace: S3Workspace) -> None:
    with pytest.raises(InvalidRequestError, match="run_id"):
        invoke("print(1)", run_id="../../escape")


def test_the_lambda_sandbox_is_exclusive_and_keeps_the_working_copies() -> None:
    from alphaagent.aws import env_function

    config = env_function.lambda_sandbox_config(Path("/tmp/alphaagent-workspaces"))
    assert (config.exclusive, config.isolation, config.wipe_paths) == (True, "process", ("/tmp", "/dev/shm"))
    assert config.wipe_keep == ("/tmp/alphaagent-workspaces", "/tmp/alphaagent-workspaces.lock")


def test_invocations_sharing_the_working_copies_take_turns(tmp_path: Path) -> None:
    # Given one invocation holding the working copies (each invocation rewrites them)
    local_dir = tmp_path / "working-copies"
    entered = threading.Event()

    def second_invocation() -> None:
        with env_run.one_invocation_at_a_time(local_dir):
            entered.set()

    with env_run.one_invocation_at_a_time(local_dir):
        # When a second one starts meanwhile (a thread of the same process, or another process)
        thread = threading.Thread(target=second_invocation)
        thread.start()
        # Then it waits
        assert not entered.wait(0.3)
    # And goes on as soon as the first is done
    assert entered.wait(5)
    thread.join()


def test_settings_leave_the_sync_cap_to_the_size_of_tmp(monkeypatch: pytest.MonkeyPatch) -> None:
    from alphaagent.aws import env_function

    monkeypatch.setenv("WORKSPACES_BUCKET_NAME", BUCKET)
    monkeypatch.setenv("STATE_TABLE_NAME", TABLE)
    monkeypatch.delenv("ENV_SYNC_MAX_BYTES", raising=False)
    env_function.get_env_settings.cache_clear()
    try:
        assert env_function.get_env_settings().ENV_SYNC_MAX_BYTES is None
    finally:
        env_function.get_env_settings.cache_clear()


def test_the_sync_cap_is_half_of_tmp_and_a_setting_only_lowers_it(tmp_path: Path) -> None:
    # Given builtin's 4,096 MiB of ephemeral storage (template.yaml) or an environment stack's 10 GiB
    # Then half of it is the cap, and ENV_SYNC_MAX_BYTES may lower it but not raise it
    assert env_run.sync_cap_bytes(None, 4096 * 2**20) == 2 * 2**30
    assert env_run.sync_cap_bytes(None, 10 * 2**30) == 5 * 2**30
    assert env_run.sync_cap_bytes(100, 4096 * 2**20) == 100
    assert env_run.sync_cap_bytes(3 * 2**30, 4096 * 2**20) == 2 * 2**30
    # And /tmp's size is read from the filesystem that will hold the working copies, before they exist
    info = os.statvfs(tmp_path)
    assert env_run.tmp_size_bytes(tmp_path / "working-copies" / "x") == info.f_blocks * info.f_frsize


def test_the_sync_margin_leaves_time_for_the_largest_state_upload() -> None:
    # The 512 MiB state cap and its 64 MiB slack at 32 MiB/s: 18 s on top of the 30 s for the run's files
    assert env_run.sync_margin_s(512 * 2**20) == 48.0
    assert env_run.sync_margin_s(2**20) == pytest.approx(32.03, abs=0.01)


# ----------------------------------------------------------------------------- the Lambda executor

ORIGIN = RunOrigin(
    turn_id=EVENT["turn_id"], session_id=EVENT["session_id"], user_id=EVENT["user_id"], scope=SCOPE
)


def a_result(run_id: str = RUN_ID) -> RunResult:
    return RunResult(
        run_id=run_id,
        status="ok",
        exit_code=0,
        stdout="7\n",
        stderr="",
        stdout_bytes=2,
        stderr_bytes=0,
        stdout_truncated=False,
        stderr_truncated=False,
        error=None,
        duration_ms=12,
        files_changed=[],
        files=FileChangeReport(),
        limits={"timeout_s": 60.0},
        isolation="process",
        network="on",
    )


class FakeLambda:
    """A Lambda client whose ``invoke`` records each call and then plays the function: ``on_invoke``
    runs in a thread (as the real function runs elsewhere); ``error`` makes the call itself fail."""

    def __init__(self, on_invoke: Callable[[EnvRequest], None] | None = None, error: Exception | None = None):
        self.calls: list[dict[str, Any]] = []
        self.on_invoke = on_invoke
        self.error = error
        self.threads: list[threading.Thread] = []

    def invoke(self, **arguments: Any) -> dict[str, Any]:
        self.calls.append(arguments)
        if self.error is not None:
            raise self.error
        if self.on_invoke is not None:
            request = EnvRequest.model_validate_json(arguments["Payload"])
            thread = threading.Thread(target=self.on_invoke, args=(request,))
            thread.start()
            self.threads.append(thread)
        return {"StatusCode": 202}


@pytest.fixture
def store(aws: Any, moto: MotoAccount) -> DynamoStore:
    return DynamoStore(TABLE, client=moto.client("dynamodb"))


def executor_with(
    client: FakeLambda,
    workspace: S3Workspace,
    store: DynamoStore,
    *,
    tenant_isolation: bool = False,
    slept: list[float] | None = None,
) -> LambdaExecutor:
    """An executor polling fast; with ``slept``, its backoff waits are recorded there (not slept),
    each at the top of its jitter range."""
    backoff: dict[str, Any] = (
        {} if slept is None else {"sleep": slept.append, "jitter": lambda _low, high: high}
    )
    return LambdaExecutor(
        lambda_client=client,
        workspace=workspace,
        store=store,
        tenant_isolation=tenant_isolation,
        startup_margin_s=0.0,
        poll_start_s=0.01,
        poll_max_s=0.05,
        **backoff,
    )


def test_the_executor_returns_the_result_once_the_claim_check_exists(
    workspace: S3Workspace, store: DynamoStore
) -> None:
    # Given a function that writes the claim check a little later, as the env function does
    def env_function_runs(request: EnvRequest) -> None:
        workspace.write_bytes(
            request.scope, f"work/runs/{request.run_id}/result.json", a_result().model_dump_json().encode()
        )

    client = FakeLambda(on_invoke=env_function_runs)
    executor = executor_with(client, workspace, store)

    # When the coder runs code through the executor
    result = executor.run(
        Path("/unused"), "print(3 + 4)", limits=RunLimits(timeout_s=5), run_id=RUN_ID, origin=ORIGIN
    )

    # Then it gets the run result, after one asynchronous invocation of the environment's function
    assert result == a_result()
    assert executor.publishes_run_events is True
    [call] = client.calls
    assert (call["FunctionName"], call["InvocationType"]) == ("alphaagent-env-builtin", "Event")
    assert "TenantId" not in call
    request = EnvRequest.model_validate_json(call["Payload"])
    assert (request.run_id, request.code, request.scope, request.limits) == (
        RUN_ID,
        "print(3 + 4)",
        SCOPE,
        RunLimits(timeout_s=5),
    )
    # And the request says until when the executor waits (its timeout plus the startup margin)
    assert request.not_after is not None and 0 < request.not_after - time.time() <= 5


def test_an_invocation_that_starts_after_its_caller_gave_up_runs_nothing(
    aws: Any, workspace: S3Workspace
) -> None:
    # Given a request whose caller stopped waiting a minute ago (a delayed asynchronous event)
    # When the env function receives it
    # Then it refuses to run it: nothing is written, no claim check (the failure destination says so)
    with pytest.raises(EnvRequestExpiredError, match="not run"):
        invoke("open('reports/late.md', 'w').write('late')", not_after=time.time() - 60)
    assert "reports/late.md" not in scope_objects(aws)
    assert RESULT_KEY not in scope_objects(aws)


def test_a_late_duplicate_of_a_finished_run_answers_with_its_result(aws: Any, workspace: S3Workspace) -> None:
    # Given a run that finished
    first = invoke("print('once')")
    # When a duplicate delivery of the same request arrives after its caller stopped waiting
    again = invoke("print('once')", not_after=time.time() - 60)
    # Then it answers with the run's result (a failure would be recorded over the success)
    assert again == first and stored_result(workspace).stdout == "once\n"


def test_a_run_that_ends_after_its_caller_gave_up_changes_nothing_in_the_scope(
    aws: Any,
    workspace: S3Workspace,
    sandbox: Sandbox,
    fake_clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from alphaagent.aws import env_function

    # Given a request that is on time when it starts, and a run that takes 15 minutes: its not_after
    # has passed by the time the run ends (the executor has given up; the turn's lease still holds)
    monkeypatch.setattr(env_function, "get_sandbox", lambda: TimedSandbox(sandbox, fake_clock, 900))

    # When the env function runs it
    with pytest.raises(EnvRequestExpiredError, match="the caller stopped waiting before the run was synced"):
        invoke("open('reports/zombie.md', 'w').write('zombie')", not_after=fake_clock.time() + 600)

    # Then neither the run's files nor a claim check reached the scope, and the working copy is gone
    assert "reports/zombie.md" not in scope_objects(aws)
    assert RESULT_KEY not in scope_objects(aws)
    assert not workspace.local_root(SCOPE).exists()


def test_tenant_isolation_passes_the_scope_key_as_tenant_id(
    workspace: S3Workspace, store: DynamoStore
) -> None:
    workspace.write_bytes(SCOPE, RESULT_KEY, a_result().model_dump_json().encode())
    client = FakeLambda()
    executor_with(client, workspace, store, tenant_isolation=True).run(
        Path("/unused"), "print(1)", limits=RunLimits(timeout_s=1), run_id=RUN_ID, origin=ORIGIN
    )
    assert client.calls[0]["TenantId"] == SCOPE.key


def a_failed_record(request: EnvRequest, error_name: str) -> RunRecord:
    return RunRecord(
        run_id=request.run_id,
        turn_id=request.turn_id,
        session_id=request.session_id,
        user_id=request.user_id,
        scope_key=request.scope.key,
        status="failed",
        exit_code=None,
        code=request.code,
        stdout="",
        stderr="",
        stdout_bytes=0,
        stderr_bytes=0,
        stdout_truncated=False,
        stderr_truncated=False,
        error=RunError(name=error_name, value="Runtime exited with error", traceback=""),
        reason="Runtime exited with error",
        duration_ms=0,
        files_changed=[],
        created_at=datetime(2026, 11, 30, tzinfo=UTC),
    )


def test_a_failed_run_record_raises_env_function_error_marked_recorded(
    workspace: S3Workspace, store: DynamoStore
) -> None:
    # Given a function that fails, so the recorder writes a failed run record (from OnFailure)
    def env_function_fails(request: EnvRequest) -> None:
        store.put_run(a_failed_record(request, "Runtime.OutOfMemory"))

    executor = executor_with(FakeLambda(on_invoke=env_function_fails), workspace, store)

    # When the coder runs code
    with pytest.raises(EnvFunctionError, match=r"Runtime\.OutOfMemory: Runtime exited with error") as raised:
        executor.run(Path("/unused"), "x = 1", limits=RunLimits(timeout_s=5), run_id=RUN_ID, origin=ORIGIN)

    # Then the error says the platform recorded the run already
    assert raised.value.recorded is True


def test_a_failure_recorded_by_a_duplicate_delivery_does_not_end_the_wait(
    workspace: S3Workspace, store: DynamoStore
) -> None:
    # Given a duplicate delivery that gave up (its failure is recorded first), then the real result
    def duplicate_then_result(request: EnvRequest) -> None:
        record = a_failed_record(request, "EnvDuplicateDeliveryError")
        store.put_run(record)

        def later() -> None:
            time.sleep(0.2)
            workspace.write_bytes(
                request.scope,
                f"work/runs/{request.run_id}/result.json",
                a_result().model_dump_json().encode(),
            )

        threading.Thread(target=later, daemon=True).start()

    executor = executor_with(FakeLambda(on_invoke=duplicate_then_result), workspace, store)

    # When the coder runs code
    result = executor.run(
        Path("/unused"), "x = 1", limits=RunLimits(timeout_s=5), run_id=RUN_ID, origin=ORIGIN
    )

    # Then it waited for, and got, the run's result
    assert result == a_result()


def test_neither_result_nor_failure_raises_a_timeout_after_the_deadline(
    workspace: S3Workspace, store: DynamoStore
) -> None:
    executor = executor_with(FakeLambda(), workspace, store)
    with pytest.raises(EnvResultTimeoutError, match=RUN_ID) as raised:
        executor.run(Path("/unused"), "x = 1", limits=RunLimits(timeout_s=0.2), run_id=RUN_ID, origin=ORIGIN)
    assert raised.value.recorded is False


def test_code_over_the_async_payload_limit_is_refused_before_any_invoke(
    workspace: S3Workspace, store: DynamoStore
) -> None:
    client = FakeLambda()
    with pytest.raises(EnvPayloadTooLargeError, match="256 KiB"):
        executor_with(client, workspace, store).run(
            Path("/unused"),
            "#" * MAX_ASYNC_PAYLOAD_BYTES,
            limits=RunLimits(),
            run_id=RUN_ID,
            origin=ORIGIN,
        )
    assert client.calls == []


def test_code_just_under_the_limit_is_invoked(workspace: S3Workspace, store: DynamoStore) -> None:
    workspace.write_bytes(SCOPE, RESULT_KEY, a_result().model_dump_json().encode())
    client = FakeLambda()
    code = "#" * (MAX_ASYNC_PAYLOAD_BYTES - DESTINATION_HEADROOM_BYTES - 1024)
    executor_with(client, workspace, store).run(
        Path("/unused"), code, limits=RunLimits(), run_id=RUN_ID, origin=ORIGIN
    )
    assert len(client.calls) == 1


def test_non_ascii_code_is_measured_as_escaped_json(workspace: S3Workspace, store: DynamoStore) -> None:
    # 60,000 "€" are 180,000 UTF-8 bytes but 360,000 bytes as \u20ac escapes in a re-serialised record
    client = FakeLambda()
    with pytest.raises(EnvPayloadTooLargeError):
        executor_with(client, workspace, store).run(
            Path("/unused"), "\u20ac" * 60_000, limits=RunLimits(), run_id=RUN_ID, origin=ORIGIN
        )
    assert client.calls == []


def test_a_failed_invoke_call_raises_env_invoke_error_naming_the_function(
    workspace: S3Workspace, store: DynamoStore
) -> None:
    from botocore.exceptions import ClientError

    denied = ClientError({"Error": {"Code": "AccessDeniedException", "Message": "no"}}, "Invoke")
    client = FakeLambda(error=denied)
    executor = executor_with(client, workspace, store)
    with pytest.raises(EnvInvokeError, match="alphaagent-env-builtin") as raised:
        executor.run(Path("/unused"), "x = 1", limits=RunLimits(), run_id=RUN_ID, origin=ORIGIN)
    assert raised.value.recorded is False
    assert len(client.calls) == 1  # not throttling: never retried


class ThrottlingLambda(FakeLambda):
    """A Lambda client that answers the first ``throttles`` calls with 429, then accepts."""

    def __init__(self, throttles: int) -> None:
        super().__init__()
        self.throttles = throttles

    def invoke(self, **arguments: Any) -> dict[str, Any]:
        from botocore.exceptions import ClientError

        if len(self.calls) < self.throttles:
            self.calls.append(arguments)
            raise ClientError(
                {
                    "Error": {"Code": "TooManyRequestsException", "Message": "Rate exceeded"},
                    "ResponseMetadata": {"HTTPStatusCode": 429},
                },
                "Invoke",
            )
        return super().invoke(**arguments)


def test_a_throttled_invoke_is_retried_with_backoff_then_runs_once(
    workspace: S3Workspace, store: DynamoStore
) -> None:
    # Given Lambda that throttles the first two invocations (429), and the run's result
    workspace.write_bytes(SCOPE, RESULT_KEY, a_result().model_dump_json().encode())
    client, slept = ThrottlingLambda(throttles=2), []
    # When the coder runs code
    result = executor_with(client, workspace, store, slept=slept).run(
        Path("/unused"), "x = 1", limits=RunLimits(), run_id=RUN_ID, origin=ORIGIN
    )
    # Then the invocation was sent again after growing waits, and the result came back
    assert result == a_result() and len(client.calls) == 3
    assert slept[:2] == [THROTTLE_BASE_S, THROTTLE_BASE_S * 2]


def test_throttling_that_lasts_is_a_typed_retryable_error(workspace: S3Workspace, store: DynamoStore) -> None:
    # Given Lambda that throttles every invocation
    client, slept = ThrottlingLambda(throttles=100), []
    # When the coder runs code; Then it gets EnvThrottledError (retryable, a platform failure not yet
    # recorded), after THROTTLE_ATTEMPTS calls, naming the function and the 429
    with pytest.raises(
        EnvThrottledError, match=r"alphaagent-env-builtin: throttled by Lambda \(429\)"
    ) as raised:
        executor_with(client, workspace, store, slept=slept).run(
            Path("/unused"), "x = 1", limits=RunLimits(), run_id=RUN_ID, origin=ORIGIN
        )
    assert isinstance(raised.value, RetryableError) and isinstance(raised.value, SandboxError)
    assert raised.value.recorded is False
    assert len(client.calls) == THROTTLE_ATTEMPTS and len(slept) == THROTTLE_ATTEMPTS - 1


def test_the_executor_needs_the_origin(workspace: S3Workspace, store: DynamoStore) -> None:
    client = FakeLambda()
    with pytest.raises(MissingOriginError, match="origin"):
        executor_with(client, workspace, store).run(
            Path("/unused"), "x = 1", limits=RunLimits(), run_id=RUN_ID
        )
    assert client.calls == []


def test_the_sync_stops_once_the_caller_gave_up_and_writes_no_result(
    aws: Any, workspace: S3Workspace, fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a run that writes 20 files, and uploads so slow that the request's not_after passes once
    # five are done (many files: the executor gives up while the sync is going on)
    not_after = fake_clock.time() + 600
    real_put = workspace.client.put_object
    done: list[str] = []
    late: list[str] = []

    def put_object(**kwargs: Any) -> Any:
        if kwargs["Key"].startswith(f"{SCOPE.key}/datasets/") and fake_clock.time() > not_after:
            late.append(kwargs["Key"])
        answer = real_put(**kwargs)
        done.append(kwargs["Key"])
        if len(done) == 5:
            fake_clock.advance(900)
        return answer

    monkeypatch.setattr(workspace.client, "put_object", put_object)
    code = "for i in range(20):\n    open(f'datasets/f{i:02}.csv', 'w').write('x')\n"

    # When the env function runs it
    with pytest.raises(EnvRequestExpiredError, match="before the run was synced"):
        invoke(code, not_after=not_after)

    # Then no upload started after not_after, and there is no claim check (the run has no result)
    assert late == []
    assert RESULT_KEY not in scope_objects(aws)


def test_a_turn_that_no_longer_holds_its_scope_runs_nothing_there(aws: Any, workspace: S3Workspace) -> None:
    # Given the turn's execution ended and released the scope, and the next turn took it
    store = DynamoStore(TABLE)
    store.release_lock(SCOPE.key, TURN)
    store.acquire_lock(SCOPE.key, "01NEXTTURN0000000000000000", datetime.now(UTC), 3600)

    # When a late invocation of the old turn arrives; Then it runs nothing and keeps nothing
    with pytest.raises(EnvLeaseLostError, match="no longer holds"):
        invoke("open('reports/late.md', 'w').write('late')")
    assert "reports/late.md" not in scope_objects(aws) and RESULT_KEY not in scope_objects(aws)


def test_a_run_whose_turn_loses_the_scope_stops_syncing(
    aws: Any, workspace: S3Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    from alphaagent.aws import env_function

    # Given a run that writes 20 files, and the turn's lease taken over after the third upload (its
    # execution was aborted and the next turn started), with every lease check reading the table and
    # one upload at a time (so "after the third" is exact)
    monkeypatch.setattr(env_run, "LEASE_CHECK_INTERVAL_S", 0.0)
    monkeypatch.setattr(env_function, "working_copies", lambda ws: WorkingCopies(ws, pool_size=1))
    store, real_put = DynamoStore(TABLE), workspace.client.put_object
    uploads: list[str] = []

    def put_object(**kwargs: Any) -> Any:
        answer = real_put(**kwargs)
        if not kwargs["Key"].startswith(f"{SCOPE.key}/datasets/"):
            return answer
        uploads.append(kwargs["Key"])
        if len(uploads) == 3:
            with _IAM[0].acting_as(None):  # the next turn's steps, not the env function
                store.release_lock(SCOPE.key, TURN)
                store.acquire_lock(SCOPE.key, "01NEXTTURN0000000000000000", datetime.now(UTC), 3600)
        return answer

    monkeypatch.setattr(workspace.client, "put_object", put_object)
    code = "for i in range(20):\n    open(f'datasets/f{i:02}.csv', 'w').write('x')\n"

    # When the env function runs it
    with pytest.raises(EnvLeaseLostError):
        invoke(code)

    # Then nothing was uploaded once the lease was gone, and there is no claim check
    assert len(uploads) == 3 and RESULT_KEY not in scope_objects(aws)


def test_an_invocation_with_an_unknown_field_is_refused_before_anything_runs() -> None:
    # Given the sample invocation with a field the contract does not have (a newer or a forged caller)
    event = json.loads((Path(__file__).resolve().parents[2] / "events" / "env_invocation.json").read_text())
    event["run_as"] = "root"
    # When it is parsed as the handler parses it; Then it is refused, naming the field
    with pytest.raises(ValueError, match="run_as"):
        EnvRequest.model_validate(event)


# ------------------------------------------------- duplicate deliveries at the same time (the claim)

CLAIM_KEY = f"work/runs/{RUN_ID}/claim.json"
RAN_ONCE_CODE = (
    "import time, uuid\ntime.sleep(0.5)\nopen(f'datasets/ran-{uuid.uuid4().hex}.txt', 'w').write('ran')\n"
)


def ran_files(s3: Any) -> list[str]:
    """The side effects of ``RAN_ONCE_CODE``: one uniquely named file per time the code ran."""
    return [path for path in scope_objects(s3) if path.startswith("datasets/ran-")]


def deliver(
    request: EnvRequest,
    workspace: S3Workspace,
    sandbox: Sandbox,
    seconds_left: float = 900.0,
    clock: Clock = SYSTEM_CLOCK,
) -> EnvPointer:
    """One delivery of ``request`` as ``lambda_handler`` makes it, with ``seconds_left`` in the invocation."""
    return env_run.run_request(
        request,
        workspace=workspace,
        store=DynamoStore(TABLE),
        sandbox=sandbox,
        max_sync_bytes=2**30,
        time_left_s=lambda: seconds_left,
        clock=clock,
    )


class PauseRecordingClock(SystemClock):
    """The real clock, recording every pause asked of it (seconds): two deliveries in two threads
    need real time to pass while one of them waits for the other."""

    def __init__(self) -> None:
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        super().sleep(seconds)


CLAIMS_MEET_S = 2.0
"""Seconds the first claim's condition check waits for the second claim's to reach it too (S3 makes
the second one wait for the first claim's write instead; without that, it arrives in milliseconds)."""


def test_two_deliveries_at_the_same_time_run_the_code_once(
    aws: Any, tmp_path: Path, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    from moto.s3.models import S3Backend
    from moto.s3.responses import S3Response

    # Given two execution environments (own working copies, so no local lock orders them) and the
    # pauses of a delivery that waits for another one's result
    clock = PauseRecordingClock()
    request = EnvRequest.model_validate({**EVENT, "code": RAN_ONCE_CODE})
    answers: list[EnvPointer] = []
    errors: list[BaseException] = []
    start = threading.Barrier(2)
    # And S3 deciding both claims at once: a claim that finds no marker in PutObject's condition
    # check waits there (up to CLAIMS_MEET_S) for the other claim's check to find none either
    claim = f"{SCOPE.key}/{CLAIM_KEY}"
    checks = threading.Barrier(2, timeout=CLAIMS_MEET_S)
    checking = threading.local()
    put_object, looked_up = S3Response.put_object, S3Backend.get_object
    met: list[bool] = []

    def conditional_put(response: Any) -> Any:
        checking.claim = response.headers.get("If-None-Match") == "*"
        try:
            return put_object(response)
        finally:
            checking.claim = False

    def get_object(backend: Any, bucket_name: str, key_name: str, *args: Any, **kwargs: Any) -> Any:
        found = looked_up(backend, bucket_name, key_name, *args, **kwargs)
        if getattr(checking, "claim", False) and key_name == claim:
            checking.claim = False  # the condition's own lookup only, not the write's
            try:
                checks.wait()
                met.append(True)
            except threading.BrokenBarrierError:
                met.append(False)
        return found

    monkeypatch.setattr(S3Response, "put_object", conditional_put)
    monkeypatch.setattr(S3Backend, "get_object", get_object)

    def environment(number: int) -> None:
        workspace = S3Workspace(BUCKET, client=aws, local_dir=tmp_path / f"env{number}" / "working-copies")
        start.wait()
        try:
            answers.append(deliver(request, workspace, sandbox, clock=clock))
        except BaseException as error:  # reported by the assertion below
            errors.append(error)

    # When Lambda delivers the same event to both at the same time
    threads = [threading.Thread(target=environment, args=(number,)) for number in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    # Then the code ran once, and both answers are the pointer to the same result
    assert errors == []
    assert len(ran_files(aws)) == 1
    assert len(answers) == 2 and answers[0] == answers[1]
    assert answers[0] == EnvPointer(run_id=RUN_ID, status="ok", result_key=RESULT_KEY)
    # And one of them waited for the other's result instead of running
    assert clock.sleeps
    # And the claim marker is gone once the result exists
    assert CLAIM_KEY not in scope_objects(aws)
    # And S3 checks and writes a conditional write in one step: the second claim was checked only
    # after the first one had been decided, and found its marker
    assert met == [False, False], "both claims were checked before either was written"


def test_a_delivery_that_finds_the_run_claimed_waits_for_the_result_and_runs_nothing(
    aws: Any, workspace: S3Workspace, sandbox: Sandbox, fake_clock: FakeClock
) -> None:
    # Given a run claimed by another delivery, which writes its result a quarter of a second later
    workspace.write_bytes(
        SCOPE, CLAIM_KEY, json.dumps({"run_id": RUN_ID, "claimed_at": fake_clock.time()}).encode()
    )
    winner = a_result().model_copy(update={"status": "error"})
    fake_clock.after(
        0.25, lambda: workspace.write_bytes(SCOPE, RESULT_KEY, winner.model_dump_json().encode())
    )

    # When this delivery of the same request arrives
    request = EnvRequest.model_validate({**EVENT, "code": RAN_ONCE_CODE})
    answer = deliver(request, workspace, sandbox, clock=fake_clock)

    # Then it returns the other delivery's pointer, its status included, without running the code,
    # having looked again with growing pauses until the result was there
    assert answer == EnvPointer(run_id=RUN_ID, status="error", result_key=RESULT_KEY)
    assert fake_clock.sleeps == [0.1, 0.2]
    assert ran_files(aws) == []
    assert stored_result(workspace) == winner
    # And the marker is the other delivery's to remove
    assert CLAIM_KEY in scope_objects(aws)


def test_a_delivery_whose_other_delivery_never_finishes_gives_up_within_the_invocation(
    aws: Any, workspace: S3Workspace, fake_clock: FakeClock
) -> None:
    # Given a run claimed by another delivery that never writes a result
    workspace.write_bytes(SCOPE, CLAIM_KEY, b'{"run_id": "x", "claimed_at": 0}')
    # And an invocation with 0.3 s left to wait once the sync margin is kept back
    context = context_leaving(0.3)

    # When the same request is delivered
    with pytest.raises(EnvDuplicateDeliveryError, match="not run a second time"):
        invoke(RAN_ONCE_CODE, context)

    # Then it gave up after its bounded wait, having run nothing and written no result
    assert sum(fake_clock.sleeps) == pytest.approx(0.3)
    assert ran_files(aws) == []
    assert RESULT_KEY not in scope_objects(aws)


def test_a_delivery_waits_for_the_result_no_longer_than_its_caller(
    aws: Any, workspace: S3Workspace, fake_clock: FakeClock
) -> None:
    # Given a run claimed by another delivery that never writes a result, and a caller that waits
    # 0.4 s more (the invocation itself has 15 minutes)
    workspace.write_bytes(SCOPE, CLAIM_KEY, b'{"run_id": "x", "claimed_at": 0}')

    # When the same request is delivered
    with pytest.raises(EnvDuplicateDeliveryError, match=RUN_ID):
        invoke(RAN_ONCE_CODE, not_after=fake_clock.time() + 0.4)

    # Then it gives up when the caller stops waiting, having run nothing
    assert sum(fake_clock.sleeps) == pytest.approx(0.4)
    assert ran_files(aws) == []


def test_a_failed_run_keeps_its_claim_so_a_later_delivery_does_not_run_it_again(
    aws: Any,
    workspace: S3Workspace,
    sandbox: Sandbox,
    fake_clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from alphaagent.aws import env_function

    # Given a run that ended after its caller stopped waiting (no result kept, a platform failure)
    monkeypatch.setattr(env_function, "get_sandbox", lambda: TimedSandbox(sandbox, fake_clock, 900))
    with pytest.raises(EnvRequestExpiredError):
        invoke(RAN_ONCE_CODE.replace("0.5", "0"), not_after=fake_clock.time() + 600)
    monkeypatch.setattr(env_function, "get_sandbox", lambda: sandbox)

    # When the same request is delivered again, with time to spare but no result ever coming
    with pytest.raises(EnvDuplicateDeliveryError):
        invoke(RAN_ONCE_CODE, context_leaving(0.2))

    # Then the code was not run a second time: its marker stays and nothing reached the scope
    assert CLAIM_KEY in scope_objects(aws)
    assert ran_files(aws) == []


def test_run_code_cannot_claim_another_run_in_advance(aws: Any, workspace: S3Workspace) -> None:
    # Given a run whose code plants the claim marker of a later run
    later = "01JDQ8ZA0000000000000000LT"
    invoke(
        f"import os\nos.makedirs('work/runs/{later}')\nopen('work/runs/{later}/claim.json', 'w').write('{{}}')"
    )
    assert f"work/runs/{later}/claim.json" not in scope_objects(aws)

    # When the later run is delivered, Then it runs (its marker was never uploaded)
    invoke("open('reports/later.md', 'w').write('ran')", run_id=later)
    assert_status(stored_result(workspace, later), "ok")
    assert scope_objects(aws)["reports/later.md"] == b"ran"


def test_create_exclusive_creates_once_and_keeps_the_first_content(workspace: S3Workspace) -> None:
    # When the same object is created exclusively twice
    first = workspace.create_exclusive(SCOPE, "work/runs/R1/claim.json", b"first")
    second = workspace.create_exclusive(SCOPE, "work/runs/R1/claim.json", b"second")

    # Then only the first call created it, and its content stays
    assert (first, second) == (True, False)
    assert workspace.read_bytes(SCOPE, "work/runs/R1/claim.json") == b"first"
    # And a path that breaks a rule is refused before any request
    from alphaagent.errors import PathRuleError

    with pytest.raises(PathRuleError):
        workspace.create_exclusive(SCOPE, "work/../escape.json", b"x")


def test_create_exclusive_retries_a_conflict_and_reports_a_persistent_one_as_taken(aws: Any) -> None:
    # Given S3 answering 409 ConditionalRequestConflict (another write of the key in flight)
    class ConflictingS3:
        def __init__(self, conflicts: int) -> None:
            self.conflicts, self.calls = conflicts, 0

        def put_object(self, **arguments: Any) -> dict[str, Any]:
            from botocore.exceptions import ClientError

            self.calls += 1
            if self.calls <= self.conflicts:
                raise ClientError(
                    {"Error": {"Code": "ConditionalRequestConflict", "Message": "retry"}}, "PutObject"
                )
            return aws.put_object(**arguments)  # type: ignore[no-any-return]

    # When the conflict clears on the second put, Then the object is created
    once = ConflictingS3(conflicts=1)
    assert S3Workspace(BUCKET, client=once).create_exclusive(SCOPE, "work/runs/R2/claim.json", b"x")
    assert once.calls == 2
    # When it persists, Then the caller is told it did not create it (never two creators)
    always = ConflictingS3(conflicts=99)
    assert not S3Workspace(BUCKET, client=always).create_exclusive(SCOPE, "work/runs/R3/claim.json", b"x")
    assert always.calls == 3


# ----------------------------------------------------------------------------- Lambda's own limits


def test_open_files_and_processes_over_lambdas_quotas_are_cut_and_named(workspace: S3Workspace) -> None:
    # Given a request for more open files and processes than a Lambda execution environment has
    # (1,024 file descriptors, 1,024 processes/threads: Lambda quotas)
    limits = {**EVENT["limits"], "open_files": 4096, "processes": 2048}

    # When it runs
    invoke("import resource\nprint(resource.getrlimit(resource.RLIMIT_NOFILE)[0])", limits=limits)

    # Then the run had Lambda's 1,024 descriptors, and its result names both limits that were cut
    result = stored_result(workspace)
    assert_status(result, "ok")
    assert result.stdout.strip() == str(env_run.LAMBDA_FILE_DESCRIPTORS)
    most = env_run.LAMBDA_PROCESSES - env_run.PLATFORM_PROCESS_RESERVE
    assert (result.limits["open_files"], result.limits["processes"]) == (1024, most)
    clamped = str(result.limits["clamped"])
    assert "open_files 4096 -> 1024" in clamped and f"processes 2048 -> {most}" in clamped
    assert "file descriptors" in clamped and "processes/threads" in clamped


def test_limits_within_lambdas_quotas_are_kept_as_asked(workspace: S3Workspace) -> None:
    invoke("print(1)")
    result = stored_result(workspace)
    assert (result.limits["open_files"], result.limits["processes"]) == (1024, 256)
    assert "clamped" not in result.limits


def test_the_lambda_sandbox_denies_the_runtime_api_port(monkeypatch: pytest.MonkeyPatch) -> None:
    from alphaagent.aws import env_function

    # The port comes from AWS_LAMBDA_RUNTIME_API (host:port), 9001 when unset.
    monkeypatch.setenv("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9123")
    assert env_function.lambda_sandbox_config(Path("/tmp/w")).deny_tcp_connect_ports == (9123,)
    monkeypatch.delenv("AWS_LAMBDA_RUNTIME_API")
    assert env_function.lambda_sandbox_config(Path("/tmp/w")).deny_tcp_connect_ports == (9001,)


def test_the_run_result_says_whether_the_runtime_api_was_out_of_reach(
    workspace: S3Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    from alphaagent.aws import env_function
    from alphaagent.sandbox import landlock

    # Given a stand-in for the Runtime API listening on 127.0.0.1, and the env function's sandbox
    # denying its port (Landlock where the kernel has network rules)
    runtime_api = socket.socket()
    runtime_api.bind(("127.0.0.1", 0))
    runtime_api.listen(4)
    port = runtime_api.getsockname()[1]
    config = SandboxConfig(
        isolation="process", pool_size=1, preload=(), warmup="", deny_tcp_connect_ports=(port,)
    )
    probe = (
        "import socket\ns = socket.socket()\ns.settimeout(5)\n"
        f"try:\n    s.connect(('127.0.0.1', {port}))\n    print('reached')\n"
        "except PermissionError:\n    print('denied')\n"
    )
    try:
        with Sandbox(config) as box:
            monkeypatch.setattr(env_function, "get_sandbox", lambda: box)
            # When user code tries to reach it
            invoke(probe)
            result = stored_result(workspace)
    finally:
        runtime_api.close()

    # Then the result says what was in force, and it matched what the code could do
    assert result.landlock is not None and result.landlock.denied_tcp_ports == [port]
    assert result.landlock.abi == landlock.abi_version()
    in_force = landlock.abi_version() >= landlock.NET_ABI
    assert result.landlock.in_force is in_force, result.landlock.detail
    assert result.stdout.strip() == ("denied" if in_force else "reached")


# ------------------------------------------------- the working copy kept between runs (issue 11)


def s3_calls(s3: Any) -> list[str]:
    """The S3 operations the client makes from now on, in order (botocore's ``before-call`` hook)."""
    calls: list[str] = []
    s3.meta.events.register("before-call.s3", lambda model, **_: calls.append(model.name))
    return calls


READ_ALL = (
    "import os\n"
    "for parent, _, names in sorted(os.walk('.')):\n"
    "    for name in sorted(names):\n"
    "        path = os.path.join(parent, name)[2:]\n"
    "        if not path.startswith('work/runs/'):\n"
    "            print(path, open(path).read())\n"
)


def test_a_warm_run_downloads_only_what_changed_in_the_scope(aws: Any, workspace: S3Workspace) -> None:
    # Given a scope of 20 files, synced by a first run in this execution environment
    for number in range(20):
        workspace.write_bytes(SCOPE, f"datasets/part-{number:02}.csv", f"v\n{number}\n".encode())
    invoke("print('first')")
    # And one file changed in S3 since, by another path (the prepare step, another writer)
    workspace.write_bytes(SCOPE, "datasets/part-07.csv", b"v\nchanged\n")

    # When the next run of the scope comes to the same execution environment
    calls = s3_calls(aws)
    invoke(READ_ALL, run_id="01JDQ8ZA0000000000000000R2")
    made = list(calls)

    # Then it saw the changed content and every other file
    result = stored_result(workspace, "01JDQ8ZA0000000000000000R2")
    assert "datasets/part-07.csv v\nchanged\n" in result.stdout
    assert result.stdout.count("datasets/part-") == 20
    # And only that file was downloaded, with no HeadObject per file (one look for a claim check)
    assert made.count("GetObject") == 1 and made.count("HeadObject") == 1, made
    assert made.count("ListObjectsV2") == 1, made


def test_a_warm_copy_that_diverged_from_s3_is_repaired(aws: Any, workspace: S3Workspace) -> None:
    # Given a synced working copy
    workspace.write_bytes(SCOPE, "docs/brief.txt", b"the bucket's bytes")
    workspace.write_bytes(SCOPE, "docs/other.txt", b"untouched")
    invoke("print('first')")
    # And a local change that never reached S3 (a run modified it and its upload failed), made to
    # look like the original: same size, same modification time
    local = workspace.local_root(SCOPE) / "docs" / "brief.txt"
    before = local.stat()
    local.write_bytes(b"a forged version!!")
    os.utime(local, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert local.stat().st_size == before.st_size
    # And a file a run left locally that S3 never had
    (workspace.local_root(SCOPE) / "reports" / "stray.md").write_text("not in the bucket")

    # When the next run reads them
    invoke(READ_ALL, run_id="01JDQ8ZA0000000000000000R2")

    # Then it saw the bucket's bytes and not the stray file
    stdout = stored_result(workspace, "01JDQ8ZA0000000000000000R2").stdout
    assert stdout == "docs/brief.txt the bucket's bytes\ndocs/other.txt untouched\n"
    assert local_files(workspace) == {"docs/brief.txt": b"the bucket's bytes", "docs/other.txt": b"untouched"}


def test_a_file_deleted_in_s3_by_another_path_disappears_from_the_warm_copy(
    aws: Any, workspace: S3Workspace
) -> None:
    # Given a synced working copy with two files
    workspace.write_bytes(SCOPE, "datasets/keep.csv", b"k\n")
    workspace.write_bytes(SCOPE, "datasets/nested/gone.csv", b"g\n")
    invoke("print('first')")
    assert "datasets/nested/gone.csv" in local_files(workspace)
    # When one is deleted in S3 by another path (a user, the console, another writer)
    aws.delete_object(Bucket=BUCKET, Key=f"{SCOPE.key}/datasets/nested/gone.csv")
    invoke(
        "import os\nprint(os.path.exists('datasets/nested/gone.csv'), os.path.exists('datasets/nested'))",
        run_id="01JDQ8ZA0000000000000000R2",
    )

    # Then the next run does not see it, nor its empty folder
    assert stored_result(workspace, "01JDQ8ZA0000000000000000R2").stdout == "False False\n"
    assert local_files(workspace) == {"datasets/keep.csv": b"k\n"}


def test_files_a_run_deletes_leave_the_bucket_in_one_batch(aws: Any, workspace: S3Workspace) -> None:
    # Given three files in the scope
    for name in ("a", "b", "c"):
        workspace.write_bytes(SCOPE, f"reports/{name}.md", b"x")
    # When a run deletes them
    calls = s3_calls(aws)
    invoke("import os\nfor name in 'abc':\n    os.remove(f'reports/{name}.md')")
    # Then they are gone from the bucket, through one DeleteObjects call
    assert not [path for path in scope_objects(aws) if path.startswith("reports/")]
    assert calls.count("DeleteObjects") == 1
    assert stored_result(workspace).files.deleted == ["reports/a.md", "reports/b.md", "reports/c.md"]


def test_a_run_of_another_scope_never_sees_the_kept_copy(aws: Any, workspace: S3Workspace) -> None:
    # Given a kept working copy of one scope
    workspace.write_bytes(SCOPE, "docs/secret.txt", b"scope one's")
    invoke("print('first')")
    assert workspace.local_root(SCOPE).exists()
    # When the same process serves a run of another scope (a function made without tenant isolation)
    other = ConversationScope(conversation_id="c-other")
    DynamoStore(TABLE).acquire_lock(other.key, TURN, datetime.now(UTC), 3600)
    invoke(
        "import os\nprint(sorted(os.listdir('..')))",
        run_id="01JDQ8ZA0000000000000000R2",
        scope=other.model_dump(),
    )

    # Then the first scope's copy is gone before the run, which sees only its own
    assert not workspace.local_root(SCOPE).exists()
    stdout = RunResult.model_validate_json(
        workspace.read_bytes(other, "work/runs/01JDQ8ZA0000000000000000R2/result.json")
    ).stdout
    assert stdout == "['c-other']\n"


def test_a_request_for_a_scope_that_is_not_the_invocations_tenant_runs_nothing(
    aws: Any, workspace: S3Workspace
) -> None:
    # Given an invocation whose tenant id is another scope's
    context = Context()
    context.tenant_id = "conversations/c-other"  # type: ignore[attr-defined]
    # When the request arrives, Then it is refused before anything is claimed or run
    with pytest.raises(InvalidRequestError, match="tenant id 'conversations/c-other' is not"):
        invoke("open('reports/ran.md', 'w').write('ran')", context)
    assert scope_objects(aws) == {}


# ------------------------------------------------- run notices instead of polling (issue 11 item 3)


def notified_executor(
    client: FakeLambda, workspace: S3Workspace, store: DynamoStore, notices: RunNotices, fallback_s: float
) -> LambdaExecutor:
    return LambdaExecutor(
        lambda_client=client,
        workspace=workspace,
        store=store,
        tenant_isolation=False,
        startup_margin_s=30.0,
        notices=notices,
        fallback_poll_s=fallback_s,
    )


def result_reads(s3: Any) -> list[str]:
    """Keys of the GetObject calls the client makes from now on."""
    keys: list[str] = []
    s3.meta.events.register(
        "before-call.s3.GetObject", lambda params, **_: keys.append(params.get("url_path", ""))
    )
    return keys


def test_the_executor_learns_of_the_result_from_the_notice_without_polling(
    moto: MotoAccount, workspace: S3Workspace, store: DynamoStore
) -> None:
    # Given a coder process's notice queue, and an env function that writes the claim check after
    # 0.5 s and then sends the notice, as the real one does
    sqs = moto.client("sqs")
    notices = RunNotices(sqs)
    sent: list[float] = []

    def the_function(request: EnvRequest) -> None:
        from alphaagent.aws import env_function

        time.sleep(0.5)
        workspace.write_bytes(SCOPE, RESULT_KEY, a_result().model_dump_json().encode())
        with _IAM[0].acting_as("EnvBuiltinFunction"):
            send_notice(
                env_function.get_sqs(), request.notice_queue_url, RunNotice(run_id=RUN_ID, status="ok")
            )
        sent.append(time.monotonic())

    # When a run is awaited with a fallback poll far longer than the run takes
    reads = result_reads(workspace.client)
    with _IAM[0].acting_as("CoderTaskRole"):
        executor = notified_executor(FakeLambda(the_function), workspace, store, notices, fallback_s=60.0)
        result = executor.run(
            Path("/unused"), "print(1)", limits=RunLimits(timeout_s=5), run_id=RUN_ID, origin=ORIGIN
        )
        woke = time.monotonic()
        notices.close()

    # Then the result came with the notice, after one look before and one after it: no poll ladder
    assert result == a_result()
    assert sent and woke - sent[0] < 5
    assert len(reads) == 2, reads


def test_a_lost_notice_falls_back_to_a_slow_poll(
    moto: MotoAccount, workspace: S3Workspace, store: DynamoStore
) -> None:
    # Given an env function that writes the claim check but whose notice never arrives
    notices = RunNotices(moto.client("sqs"))

    def the_function(request: EnvRequest) -> None:
        time.sleep(0.2)
        workspace.write_bytes(SCOPE, RESULT_KEY, a_result().model_dump_json().encode())

    # When a run is awaited with a 0.5 s fallback poll
    with _IAM[0].acting_as("CoderTaskRole"):
        executor = notified_executor(FakeLambda(the_function), workspace, store, notices, fallback_s=0.5)
        started = time.monotonic()
        result = executor.run(
            Path("/unused"), "print(1)", limits=RunLimits(timeout_s=5), run_id=RUN_ID, origin=ORIGIN
        )
        notices.close()

    # Then the claim check, the source of truth, is found by the fallback look
    assert result == a_result()
    assert time.monotonic() - started < 10


def test_the_env_function_sends_the_notice_after_the_claim_check(
    moto: MotoAccount, workspace: S3Workspace
) -> None:
    # Given the notice queue of the coder process that invokes
    sqs = moto.client("sqs")
    with _IAM[0].acting_as("CoderTaskRole"):
        url = RunNotices(sqs).queue_url
    # When the env function runs a request naming it
    invoke("print('hello')", notice_queue_url=url)

    # Then the queue holds one notice naming the run and its status, and the claim check exists
    messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get(
        "Messages", []
    )
    assert [RunNotice.model_validate_json(m["Body"]) for m in messages] == [
        RunNotice(run_id=RUN_ID, status="ok")
    ]
    assert stored_result(workspace).stdout == "hello\n"


def test_a_notice_queue_that_is_not_a_run_notice_queue_is_refused() -> None:
    # Given a request naming another queue of the account (a forged or mistaken caller)
    event = {**EVENT, "notice_queue_url": "https://sqs.eu-west-1.amazonaws.com/123456789012/SpecQueue"}
    # Then it is not a request: nothing would be sent there
    with pytest.raises(ValidationError, match="notice_queue_url"):
        EnvRequest.model_validate(event)


# ----------------------------------------------------------------------------- live session state


SESSION = EVENT["session_id"]
STATE_PREFIX = f"work/sessions/{SESSION}/"


def test_a_sessions_state_travels_through_s3_to_the_next_invocation(
    aws: Any, tmp_path: Path, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    from alphaagent.aws import env_function

    # Given the env function with multipart uploads from 5 MiB, and a run that leaves a number and a
    # 6 MB array in its session
    workspace = S3Workspace(BUCKET, client=aws, local_dir=tmp_path / "wc")
    copies = WorkingCopies(workspace, multipart_bytes=5 * 2**20)
    monkeypatch.setattr(env_function, "get_workspace", lambda: workspace)
    monkeypatch.setattr(env_function, "working_copies", lambda _workspace: copies)
    monkeypatch.setattr(env_function, "get_sandbox", lambda: sandbox)
    workspace.ensure_scope(SCOPE)
    uploads: list[str] = []
    real_create = aws.create_multipart_upload
    monkeypatch.setattr(
        aws, "create_multipart_upload", lambda **kw: uploads.append(kw["Key"]) or real_create(**kw)
    )
    invoke("import numpy as np\nx = 41\na = np.arange(750_000)", run_id="01RUNSTATE0000000000000001")

    # Then the state objects are in S3 under the session's folder, written before the claim check
    first = stored_result(workspace, "01RUNSTATE0000000000000001")
    assert first.state is not None and set(first.state.saved) == {"np", "x", "a"}, first.state
    objects = scope_objects(aws, with_state=True)
    state = sorted(path for path in objects if path.startswith(STATE_PREFIX))
    manifest = json.loads(objects[STATE_PREFIX + "manifest.json"])
    assert set(state) == {
        STATE_PREFIX + name
        for name in ("manifest.json", manifest["pickle"], *(b["file"] for b in manifest["buffers"]))
    }
    assert any(key.endswith(".bin") for key in uploads), "the 6 MB buffer went by multipart upload"
    # And each carries the tag the lifecycle rule expires old state versions by (template.yaml)
    for path in state:
        tags = aws.get_object_tagging(Bucket=BUCKET, Key=f"{SCOPE.key}/{path}")["TagSet"]
        assert tags == [{"Key": "alphaagent-kind", "Value": "session-state"}], path
    # And the next invocation lands in another execution environment: no working copy, S3 alone
    shutil.rmtree(workspace.local_dir)

    # When the next invocation of the session reads them
    invoke("print(x + 1, int(a.sum()))", run_id="01RUNSTATE0000000000000002")

    # Then it has them, restored in its own child
    second = stored_result(workspace, "01RUNSTATE0000000000000002")
    assert second.stdout == f"42 {sum(range(750_000))}\n", second.error
    assert second.state is not None and second.state.restored_count == 3

    # When a run rebinds the array, and a later one is killed at its timeout after changing x
    invoke("a = np.arange(3)", run_id="01RUNSTATE0000000000000003")
    after_rebind = {p for p in scope_objects(aws, with_state=True) if p.startswith(STATE_PREFIX)}
    invoke("x = 0\nwhile True:\n    pass", run_id="01RUNSTATE0000000000000004", limits={"timeout_s": 1})

    # Then the old array's object was deleted, the killed run changed nothing in S3, and x is 41
    old_bins = {STATE_PREFIX + b["file"] for b in manifest["buffers"]}
    assert not old_bins & after_rebind
    assert {p for p in scope_objects(aws, with_state=True) if p.startswith(STATE_PREFIX)} == after_rebind
    invoke("print(x, a.tolist())", run_id="01RUNSTATE0000000000000005")
    assert stored_result(workspace, "01RUNSTATE0000000000000005").stdout == "41 [0, 1, 2]\n"


def test_a_run_of_another_session_starts_empty_and_a_fresh_run_keeps_the_state(
    aws: Any, workspace: S3Workspace
) -> None:
    # Given a session holding x
    invoke("x = 'mine'", run_id="01RUNSTATE0000000000000011")

    # When a run of another session of the scope, and a fresh run of the same one, look for x
    invoke(
        "print('x' in globals())",
        run_id="01RUNSTATE0000000000000012",
        session_id="another-session-0000000000000000",
    )
    invoke("print('x' in globals())\nx = 'fresh'", run_id="01RUNSTATE0000000000000013", fresh=True)

    # Then neither sees it, and the session's next run still has its own x
    assert stored_result(workspace, "01RUNSTATE0000000000000012").stdout == "False\n"
    assert stored_result(workspace, "01RUNSTATE0000000000000013").stdout == "False\n"
    invoke("print(x)", run_id="01RUNSTATE0000000000000014")
    assert stored_result(workspace, "01RUNSTATE0000000000000014").stdout == "mine\n"


def test_the_expired_sessions_state_objects_are_deleted(aws: Any, workspace: S3Workspace) -> None:
    # Given a session with state in S3 and a file of the scope
    invoke("x = 1\nopen('reports/kept.md', 'w').write('kept')", run_id="01RUNSTATE0000000000000021")
    assert any(p.startswith(STATE_PREFIX) for p in scope_objects(aws, with_state=True))

    # When its state is dropped (what ending the session does)
    workspace.drop_session_state(SCOPE, SESSION)

    # Then no state object is left, and the file is
    objects = scope_objects(aws, with_state=True)
    assert not any(p.startswith(STATE_PREFIX) for p in objects)
    assert objects["reports/kept.md"] == b"kept"


def test_a_warm_run_of_a_session_lists_the_scope_once_and_keeps_its_state_warm(
    aws: Any, workspace: S3Workspace
) -> None:
    # Given a session that saved x in a first run, and another session's state in the same scope
    invoke("x = 41", run_id="01RUNSTATE0000000000000031")
    workspace.write_bytes(SCOPE, "work/sessions/another-session/manifest.json", b"{}")

    # When the session's next run comes to the same execution environment
    calls = s3_calls(aws)
    invoke("print(x + 1)", run_id="01RUNSTATE0000000000000032")
    made = list(calls)

    # Then it has its state, from the one listing of the scope and the copy the last run left
    assert stored_result(workspace, "01RUNSTATE0000000000000032").stdout == "42\n"
    assert made.count("ListObjectsV2") == 1 and made.count("GetObject") == 0, made
    # And the other session's state never came down
    assert not (workspace.local_root(SCOPE) / "work" / "sessions" / "another-session").exists()


def test_the_listing_jumps_over_other_sessions_to_the_carried_one(
    aws: Any, workspace: S3Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given two keys a page, run records, other sessions' state on both sides of the run's own
    # (one whose id extends the run's, which sorts just before it), and files of the scope
    monkeypatch.setattr(sync, "LIST_PAGE_KEYS", 2)
    names = [
        "datasets/a.csv",
        *(f"work/runs/r{i}/result.json" for i in range(5)),
        *(f"work/sessions/aaa/g{i}.pkl" for i in range(5)),
        *(f"work/sessions/mine-x/g{i}.pkl" for i in range(3)),
        *(f"work/sessions/mine/g{i}.pkl" for i in range(3)),
        *(f"work/sessions/zzz/g{i}.pkl" for i in range(5)),
        "work/z.txt",
    ]
    for name in names:
        workspace.write_bytes(SCOPE, name, b"x")
    copies = WorkingCopies(workspace)
    listed: list[str] = []
    aws.meta.events.register(
        "after-call.s3.ListObjectsV2",
        lambda parsed, **_: listed.extend(
            item["Key"][len(SCOPE.key) + 1 :] for item in parsed.get("Contents", [])
        ),
    )

    # When the scope is synced down with the sessions excluded but for the run's own
    down = copies.sync_down(
        SCOPE, max_bytes=2**20, exclude=["work/runs", "work/sessions"], carry={"work/sessions/mine": 3}
    )

    # Then exactly the scope's files and that session's state came down, and what S3 held there is
    # reported
    mine = {f"work/sessions/mine/g{i}.pkl" for i in range(3)}
    assert set(local_files_with_state(workspace)) == {"datasets/a.csv", "work/z.txt", *mine}
    assert down.carried["work/sessions/mine"].sizes == dict.fromkeys(mine, 1)
    # And the listing jumped: over the runs after their first page, from "aaa" to "mine" (past
    # "mine-x"), and over "zzz" after its first page
    assert "work/runs/r1/result.json" not in listed and "work/sessions/aaa/g2.pkl" not in listed
    assert not [key for key in listed if key.startswith("work/sessions/mine-x/")], listed
    assert "work/sessions/zzz/g1.pkl" not in listed and listed[-1] == "work/z.txt"

    # When the state is over its cap; Then it is reported, not brought down, and gone locally
    down = copies.sync_down(
        SCOPE, max_bytes=2**20, exclude=["work/runs", "work/sessions"], carry={"work/sessions/mine": 2}
    )
    assert not down.carried["work/sessions/mine"].brought_down
    assert set(down.carried["work/sessions/mine"].sizes) == mine
    assert set(local_files_with_state(workspace)) == {"datasets/a.csv", "work/z.txt"}


def local_files_with_state(workspace: S3Workspace) -> list[str]:
    """Every regular file of the scope's working copy, the sessions' state included."""
    root = workspace.local_root(SCOPE)
    return [path.relative_to(root).as_posix() for path in root.rglob("*") if path.is_file()]


def test_without_a_route_to_sqs_the_env_function_skips_the_notice(
    moto: MotoAccount, workspace: S3Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    from alphaagent.aws import env_function

    # Given an environment in a VPC without an SQS endpoint (ENV_RUN_NOTICES false, as the stacks set
    # it there), whose notice, were it attempted, is recorded here instead of sent
    sqs = moto.client("sqs")
    with _IAM[0].acting_as("CoderTaskRole"):
        url = RunNotices(sqs).queue_url
    monkeypatch.setenv("ENV_RUN_NOTICES", "false")
    env_function.get_env_settings.cache_clear()

    attempts: list[Any] = []
    monkeypatch.setattr(env_function, "send_notice", lambda *arguments: attempts.append(arguments))

    # When it runs a request naming the coder's notice queue
    invoke("print('hello')", notice_queue_url=url)

    # Then the run's result is there and no notice was attempted (the queue is empty)
    assert stored_result(workspace).stdout == "hello\n"
    assert attempts == []
    assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0).get("Messages", []) == []


def test_the_notice_client_gives_up_within_two_seconds_of_connect_attempts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from alphaagent.aws import env_function

    # An unreachable SQS costs at most two one-second connect attempts, not botocore's 60 s ones
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    env_function.get_sqs.cache_clear()
    try:
        config = env_function.get_sqs().meta.config
        assert config.connect_timeout <= 1
        assert config.retries["total_max_attempts"] <= 2
    finally:
        env_function.get_sqs.cache_clear()
