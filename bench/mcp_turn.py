"""Benchmark of ``alphaagent mcp``: what the MCP layer adds to a turn, side by side with the client.

In one run, on the local backend, with a fresh data directory:

- **client**: ``connect(backend="local").run_analysis(spec)`` in this process (warm: the sandbox's
  zygote already running), a one-step pinned spec in a fresh conversation each time;
- **mcp**: the same spec through ``alphaagent mcp`` over stdio, called by the ``mcp`` SDK's client in
  one long-lived session (warm), with progress notifications on;
- **mcp start**: spawning ``alphaagent mcp`` and getting its tool list (interpreter start, imports,
  the MCP handshake), what an agent host pays once per session;
- **read**: ``read_artifact`` of a small text artifact through MCP, against ``client.artifact``.

Prints one Markdown table of p50/p95 (milliseconds) and the machine (or one JSON object with
``--json``). Usage, from the repository root::

    .venv/bin/python bench/mcp_turn.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import anyio  # noqa: E402
from machine import machine  # noqa: E402
from mcp import Client, StdioServerParameters  # noqa: E402

from alphaagent.client import connect  # noqa: E402
from alphaagent.ids import new_ulid  # noqa: E402

USER = "bench"
STEP = "import pandas as pd\npd.DataFrame({'x': range(100)}).to_csv('datasets/x.csv', index=False)\n"


def spec(conversation: str) -> dict[str, Any]:
    return {
        "spec_version": 1,
        "scope": {"conversation_id": conversation},
        "goal": "write a table",
        "outputs": [{"kind": "dataset", "name": "x"}],
        "steps": [{"title": "write", "code": STEP}],
    }


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"n": len(samples), "p50_ms": round(statistics.median(ordered), 1), "p95_ms": round(p95, 1)}


def bench_client(home: Path, n: int) -> tuple[list[float], list[float]]:
    turns, reads = [], []
    with connect(backend="local", user=USER, home=home, coder=None) as client:
        client.run_analysis(spec("warmup-client"))
        for i in range(n):
            started = time.perf_counter()
            result = client.run_analysis(spec(f"client-{i}"))
            turns.append((time.perf_counter() - started) * 1000)
            assert result.status == "completed", result.error
            started = time.perf_counter()
            client.artifact({"conversation_id": f"client-{i}"}, "x")
            reads.append((time.perf_counter() - started) * 1000)
    return turns, reads


def server_params(home: Path) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "alphaagent.cli", "mcp", "--user", USER],
        env={"ALPHAAGENT_HOME": str(home), "ANTHROPIC_API_KEY": ""},
        cwd=str(REPO_ROOT),
    )


async def bench_mcp(home: Path, n: int) -> tuple[list[float], list[float], list[float], int]:
    starts, turns, reads, notifications = [], [], [], 0

    async def on_progress(_value: float, _total: float | None, _message: str | None) -> None:
        nonlocal notifications
        notifications += 1

    for _ in range(max(2, n // 2)):
        started = time.perf_counter()
        async with Client(server_params(home), read_timeout_seconds=300) as client:
            await client.list_tools()
            starts.append((time.perf_counter() - started) * 1000)
    async with Client(server_params(home), read_timeout_seconds=300) as client:
        await client.call_tool("run_analysis", {"spec": spec("warmup-mcp")})
        for i in range(n):
            started = time.perf_counter()
            result = await client.call_tool(
                "run_analysis", {"spec": spec(f"mcp-{i}")}, progress_callback=on_progress
            )
            turns.append((time.perf_counter() - started) * 1000)
            assert not result.is_error and result.structured_content["status"] == "completed", result.content
            started = time.perf_counter()
            await client.call_tool("read_artifact", {"scope": {"conversation_id": f"mcp-{i}"}, "name": "x"})
            reads.append((time.perf_counter() - started) * 1000)
    return starts, turns, reads, notifications


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, Linux {m['kernel']}, Python"
        f" {m['python']}, load {m['load_1m_start']} -> {m['load_1m_end']}",
        "",
        "| what | n | p50 ms | p95 ms |",
        "|---|---|---|---|",
    ]
    for label, key in (
        ("turn via client (in-process)", "client_turn"),
        ("turn via alphaagent mcp (stdio)", "mcp_turn"),
        ("artifact read via client", "client_read"),
        ("read_artifact via mcp", "mcp_read"),
        ("mcp server start + tools/list", "mcp_start"),
    ):
        row = report[key]
        lines.append(f"| {label} | {row['n']} | {row['p50_ms']} | {row['p95_ms']} |")
    lines += [
        "",
        f"MCP overhead per turn (p50): {report['mcp_overhead_p50_ms']} ms;"
        f" progress notifications per turn: {report['notifications_per_turn']}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer turns (noisier figures)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args(argv)
    n = 3 if args.quick else 10
    load_at_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="alphaagent-bench-mcp-") as tmp:
        home = Path(tmp) / f"home-{new_ulid().lower()}"
        client_turns, client_reads = bench_client(home, n)
        starts, mcp_turns, mcp_reads, notifications = anyio.run(bench_mcp, home, n)
    report = {
        "machine": machine(load_at_start),
        "client_turn": summary(client_turns),
        "mcp_turn": summary(mcp_turns),
        "client_read": summary(client_reads),
        "mcp_read": summary(mcp_reads),
        "mcp_start": summary(starts),
        "mcp_overhead_p50_ms": round(statistics.median(mcp_turns) - statistics.median(client_turns), 1),
        "notifications_per_turn": round(notifications / n, 1),
    }
    print(json.dumps(report, indent=2) if args.json else markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
