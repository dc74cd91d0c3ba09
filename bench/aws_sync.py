"""Benchmark: the AWS calls and the time of one ``run_in_env`` in the env function, before and after the
working copy is kept between runs (issue 11 item 2), side by side in one run.

For scopes of 100 and 1,000 files of 100 KB in moto (in-process, ``mock_aws``), each implementation
serves, in one process (one execution environment):

- a **cold** run: the first run of the scope in the environment;
- a **warm** run: the next run of the same scope, after one file changed in S3 by another path.

Each run's code rewrites one file (one upload). Every AWS call the env function makes is counted by
operation (botocore's ``before-call`` hook), with the thread it ran on, and the figures are:

- ``calls``: the calls of the invocation, by operation;
- ``moto s``: wall-clock seconds of the whole invocation against moto on this machine (the sandbox
  run included): moto answers in-process, so this is CPU work, not network;
- ``AWS s``: a paper estimate on real AWS from the calls' critical path: every call made one after the
  other costs one round trip (``--rtt-ms``, default 20 ms for S3 and DynamoDB from Lambda in-region),
  calls made by the transfer pool cost one round trip per ``POOL_SIZE`` in flight, and the bytes move
  at ``--mbps`` (default 600 Mbit/s, what a Lambda function of 3 GB sustains to S3 on one stream pool;
  AWS does not publish a figure).

"before" is the code of ``--before`` (a git revision, default the commit before this change), taken
with ``git archive`` and run in a child process with the same driver; "after" is the working tree.

Usage, from the repository root::

    .venv/bin/python bench/aws_sync.py [--files 100 1000] [--rtt-ms 20] [--mbps 600]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
BEFORE_REV = "a700fe9"
"""The commit before the working copy was kept (the branch point of issue 11's AWS sync)."""

FILE_BYTES = 100 * 1000
REGION = "eu-west-1"
BUCKET = "alphaagent-workspaces-123456789012-eu-west-1"
TABLE = "alphaagent-state-bench"
TURN = "01JDQ8Z6Q4M3W8K2X5V7N9B0CD"
POOL_SIZE = 32
"""``alphaagent.aws.sync.POOL_SIZE`` (the child of "before" cannot import it)."""


def _measure(code_root: str | None, counts: list[int]) -> dict[str, Any]:
    """Run the cold and warm invocations with the ``alphaagent`` found first on ``sys.path``."""
    if code_root:
        sys.path.insert(0, code_root)
    else:
        sys.path.insert(0, str(REPO_ROOT))
    os.environ.update(
        {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": REGION,
            "POWERTOOLS_TRACE_DISABLED": "true",
            "WORKSPACES_BUCKET_NAME": BUCKET,
            "STATE_TABLE_NAME": TABLE,
        }
    )
    import boto3
    from moto import mock_aws

    from alphaagent.aws import env_function

    try:  # where the invocation lives since the env function was split; the old code had it inline
        from alphaagent.aws import env_run as invocation
    except ImportError:
        invocation = env_function
    from alphaagent.aws.store import DynamoStore, create_table
    from alphaagent.aws.workspace import S3Workspace
    from alphaagent.models.aws import EnvRequest
    from alphaagent.models.common import ConversationScope
    from alphaagent.sandbox.config import SandboxConfig
    from alphaagent.sandbox.supervisor import Sandbox

    calls: list[tuple[str, str, int]] = []

    def before_call(model: Any, params: dict[str, Any], **_: Any) -> None:
        body = params.get("body")
        size = len(body) if isinstance(body, bytes | bytearray) else 0
        if not size and model.name in ("PutObject", "UploadPart"):
            size = int(params.get("headers", {}).get("Content-Length", 0) or 0)
        calls.append((model.name, threading.current_thread().name, size))

    def after_call(model: Any, parsed: dict[str, Any], **_: Any) -> None:
        if model.name == "GetObject":
            calls.append(("bytes-down", threading.current_thread().name, int(parsed.get("ContentLength", 0))))

    results: dict[str, Any] = {}
    sandbox = Sandbox(SandboxConfig(isolation="process", pool_size=1, preload=(), warmup=""))
    with sandbox, mock_aws(), tempfile.TemporaryDirectory() as tmp:
        session = boto3.Session(region_name=REGION)
        s3 = session.client("s3", config=__import__("botocore.config").config.Config(max_pool_connections=64))
        s3.meta.events.register("before-call", before_call)
        s3.meta.events.register("after-call", after_call)
        s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
        create_table(session.client("dynamodb"), TABLE)
        dynamodb = session.client("dynamodb")
        dynamodb.meta.events.register("before-call", before_call)
        store = DynamoStore(TABLE, client=dynamodb) if _takes_client(DynamoStore) else DynamoStore(TABLE)
        payload = os.urandom(FILE_BYTES)
        for count in counts:
            scope = ConversationScope(conversation_id=f"c-{count}")
            store.acquire_lock(scope.key, TURN, datetime.now(UTC), 3600)
            workspace = S3Workspace(BUCKET, client=s3, local_dir=Path(tmp) / f"copies-{count}")
            workspace.ensure_scope(scope)
            for number in range(count):
                s3.put_object(Bucket=BUCKET, Key=f"{scope.key}/datasets/f{number:04}.bin", Body=payload)
            copies = (
                env_function.working_copies(workspace) if hasattr(env_function, "working_copies") else None
            )
            for phase, run_id in (
                ("cold", "01JDQ8ZA00000000000000COLD"),
                ("warm", "01JDQ8ZA00000000000000WARM"),
            ):
                if phase == "warm":  # another writer changes one file between the runs
                    s3.put_object(
                        Bucket=BUCKET, Key=f"{scope.key}/datasets/f0000.bin", Body=os.urandom(FILE_BYTES)
                    )
                request = EnvRequest(
                    run_id=run_id,
                    turn_id=TURN,
                    session_id="s3ss10n-bench-000000000000000000",
                    user_id="bench",
                    scope=scope,
                    code="import os\nopen('datasets/f0001.bin', 'wb').write(os.urandom(100_000))",
                )
                calls.clear()
                arguments: dict[str, Any] = {
                    "workspace": workspace,
                    "store": store,
                    "sandbox": sandbox,
                    "max_sync_bytes": 2**31,
                    "time_left_s": lambda: 900.0,
                }
                if copies is not None:
                    arguments["copies"] = copies
                started = time.perf_counter()
                pointer = invocation.run_request(request, **arguments)
                seconds = time.perf_counter() - started
                assert pointer.status == "ok", pointer
                results[f"{count}/{phase}"] = {"seconds": seconds, "calls": list(calls)}
    return results


def _takes_client(store_class: Any) -> bool:
    import inspect

    return "client" in inspect.signature(store_class).parameters


def _estimate(calls: list[list[Any]], rtt_s: float, bytes_per_s: float) -> float:
    """Seconds on real AWS: calls of the main thread one after the other; each thread of the claimed
    phase runs beside the others (its longest sequence counts); pool calls ``POOL_SIZE`` at a time."""
    sequential = 0
    claimed: Counter[str] = Counter()
    pooled = 0
    moved = 0
    for name, thread, size in calls:
        if name == "bytes-down":
            moved += size
            continue
        moved += size
        if thread.startswith("sync"):
            pooled += 1
        elif thread.startswith("claimed"):
            claimed[thread] += 1
        else:
            sequential += 1
    rounds = sequential + max(claimed.values(), default=0) + -(-pooled // POOL_SIZE)
    return rounds * rtt_s + moved / bytes_per_s


def _report(before: dict[str, Any], after: dict[str, Any], rtt_ms: float, mbps: float) -> None:
    rtt_s, bytes_per_s = rtt_ms / 1000, mbps * 1e6 / 8
    print(f"{'scope':>6} {'run':>5} | {'impl':>6} | {'calls':>6} {'moto s':>7} {'AWS s':>7} | by operation")
    for key in before:
        for impl, figures in (("before", before[key]), ("after", after[key])):
            ops = Counter(name for name, _, _ in figures["calls"] if name != "bytes-down")
            total = sum(ops.values())
            estimate = _estimate(figures["calls"], rtt_s, bytes_per_s)
            count, phase = key.split("/")
            detail = ", ".join(f"{name} {n}" for name, n in sorted(ops.items()))
            row = f"{count:>6} {phase:>5} | {impl:>6} | {total:>6} {figures['seconds']:>7.2f}"
            print(f"{row} {estimate:>7.2f} | {detail}")
    print(
        f"\nAWS s: paper estimate, {rtt_ms:g} ms per request round trip, {mbps:g} Mbit/s,"
        f" {POOL_SIZE} transfers in flight (after); moto s: measured here, in-process (moto's own"
        " ListObjectsV2 of 1,000 keys takes seconds under load: it dominates the warm runs)."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, nargs="+", default=[100, 1000], help="scope sizes (files)")
    parser.add_argument("--rtt-ms", type=float, default=20.0, help="round trip per AWS request (ms)")
    parser.add_argument("--mbps", type=float, default=600.0, help="bandwidth to S3 (Mbit/s)")
    parser.add_argument("--before", default=BEFORE_REV, help="git revision of the 'before' code")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # code root of a child measurement
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        results = _measure(args.child or None, args.files)
        Path(args.out).write_text(json.dumps(results))
        return 0
    load = os.getloadavg()[0]
    figures: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "before"
        old.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "archive", args.before, "alphaagent"],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
        for impl, root in (("before", str(old)), ("after", "")):
            out = Path(tmp) / f"{impl}.json"
            command = [
                sys.executable,
                __file__,
                "--child",
                root,
                "--out",
                str(out),
                "--files",
                *map(str, args.files),
            ]
            subprocess.run(command, check=True, cwd=tmp, stdout=subprocess.DEVNULL)
            figures[impl] = json.loads(out.read_text())
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from machine import machine

    print(
        f"one run_in_env, scopes of {'/'.join(map(str, args.files))} files of 100 KB; one file changed in S3"
    )
    print(f"before: {args.before}; after: the working tree\n")
    _report(figures["before"], figures["after"], args.rtt_ms, args.mbps)
    print(f"\nmachine: {json.dumps(machine(load))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
