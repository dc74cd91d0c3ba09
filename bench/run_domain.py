"""Benchmark of what a run's own Landlock domain costs at the ``namespaces`` level (every run there is
in one now, with file rules granting writes only beneath the scope, /tmp and /dev/shm): the round
trip of ``pass`` and the CPU the sandbox's processes spend on it, with ``landlock`` on and off.

Side by side in one run, alternating the two sandboxes run by run (the machine's load changes minute
to minute): p50 and p95 of the wall-clock round trip in milliseconds over ``--runs`` runs each, the
CPU-ms per run of the zygote and the children it reaped (its spares and runs: ``/proc/<zygote>/stat``
before and after), and the machine.

Usage, from the repository root::

    .venv/bin/python bench/run_domain.py [--runs 40] [--json]
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

from alphaagent.sandbox.config import SandboxConfig
from alphaagent.sandbox.supervisor import Sandbox


def _zygote_cpu_s(box: Sandbox) -> float:
    """User + system CPU seconds of the zygote and the children it reaped (its runs and spares)."""
    fields = Path(f"/proc/{box.info['pid']}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    load_at_start = os.getloadavg()[0]
    walls: dict[str, list[float]] = {"on": [], "off": []}
    cpu: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        boxes = {
            name: Sandbox(SandboxConfig(preload=(), warmup="", pool_size=1, landlock=name == "on"))
            for name in walls
        }
        try:
            for box in boxes.values():
                box.run("pass", cwd=Path(tmp))  # the first run also waits for the spare
            if any(box.isolation != "namespaces" for box in boxes.values()):
                raise SystemExit("this machine gives no user namespaces: nothing to compare")
            before = {name: _zygote_cpu_s(box) for name, box in boxes.items()}
            for _ in range(args.runs):
                for name, box in boxes.items():
                    began = time.perf_counter()
                    result = box.run("pass", cwd=Path(tmp))
                    walls[name].append((time.perf_counter() - began) * 1000)
                    assert result.status == "ok", result.stderr
                    assert result.isolation.landlock_abi or name == "off", result.isolation
            cpu = {n: (_zygote_cpu_s(box) - before[n]) * 1000 / args.runs for n, box in boxes.items()}
            abi = boxes["on"].info.get("landlock_abi")
        finally:
            for box in boxes.values():
                box.close()
    rows: dict[str, Any] = {}
    for name, values in walls.items():
        values.sort()
        rows[name] = {
            "run_ms_p50": round(statistics.median(values), 1),
            "run_ms_p95": round(values[int(0.95 * (len(values) - 1))], 1),
            "zygote_cpu_ms_per_run": round(cpu[name], 1),
        }
    report = {"landlock_abi": abi, "runs": args.runs, **rows, "machine": machine(load_at_start)}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"namespaces level, Landlock ABI {abi}, {args.runs} runs of `pass` each, alternating")
    print("| run's Landlock domain | run p50 (ms) | run p95 (ms) | zygote + runs CPU per run (ms) |")
    print("|---|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {row['run_ms_p50']} | {row['run_ms_p95']} | {row['zygote_cpu_ms_per_run']} |")
    print(f"machine: {json.dumps(report['machine'])}")


if __name__ == "__main__":
    main()
