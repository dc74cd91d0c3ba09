"""Benchmark of the Landlock restriction the env Lambda's sandbox applies (TCP connect to the Runtime
API's port denied): what it costs the zygote's start, and whether it costs a run anything.

Side by side in one run, each at the Lambda level of isolation (``process``, no preload):

- zygote start (``Sandbox.start``, ready message received) in milliseconds, without and with
  ``deny_tcp_connect_ports=(9001,)``, p50 over ``--starts`` starts each;
- per-run overhead of ``print(1)`` p50/p95 in milliseconds, without and with, over ``--runs`` runs;
- the kernel's Landlock ABI and the machine (other work on it skews every figure).

Usage, from the repository root::

    .venv/bin/python bench/landlock.py [--starts 5] [--runs 40] [--json]
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine

from alphaagent.sandbox import landlock
from alphaagent.sandbox.config import SandboxConfig
from alphaagent.sandbox.supervisor import Sandbox


def _config(deny: tuple[int, ...]) -> SandboxConfig:
    return SandboxConfig(isolation="process", pool_size=1, preload=(), warmup="", deny_tcp_connect_ports=deny)


def _measure(deny: tuple[int, ...], starts: int, runs: int, workdir: Path) -> dict[str, Any]:
    start_ms = []
    for _ in range(starts):
        box = Sandbox(_config(deny))
        began = time.perf_counter()
        box.start()
        start_ms.append((time.perf_counter() - began) * 1000)
        state = box.info.get("landlock")
        box.close()
    run_ms = []
    with Sandbox(_config(deny)) as box:
        box.run("print(1)", cwd=workdir)  # the first run also waits for the spare
        for _ in range(runs):
            began = time.perf_counter()
            result = box.run("print(1)", cwd=workdir)
            run_ms.append((time.perf_counter() - began) * 1000)
            assert result.status == "ok", result.stderr
    run_ms.sort()
    return {
        "zygote_start_ms_p50": round(statistics.median(start_ms), 1),
        "run_ms_p50": round(statistics.median(run_ms), 1),
        "run_ms_p95": round(run_ms[int(0.95 * (len(run_ms) - 1))], 1),
        "landlock": state,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    load_at_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        without = _measure((), args.starts, args.runs, Path(tmp))
        with_landlock = _measure((9001,), args.starts, args.runs, Path(tmp))
    report = {
        "landlock_abi": landlock.abi_version(),
        "without": without,
        "with_runtime_api_denied": with_landlock,
        "machine": machine(load_at_start),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(
        f"Landlock ABI {report['landlock_abi']}; in force with the restriction: "
        f"{(with_landlock['landlock'] or {}).get('in_force')}"
    )
    print("| | zygote start p50 (ms) | run p50 (ms) | run p95 (ms) |")
    print("|---|---|---|---|")
    for name, row in (("without", without), ("TCP connect to 9001 denied", with_landlock)):
        print(f"| {name} | {row['zygote_start_ms_p50']} | {row['run_ms_p50']} | {row['run_ms_p95']} |")
    print(f"machine: {json.dumps(report['machine'])}")


if __name__ == "__main__":
    main()
