"""Benchmark of what the run's seccomp filter (``alphaagent.sandbox.seccomp``) costs per system call
and per run: the time of a cheap call (``getppid``) in a child without a filter and with each level's
filter, and the time to install the filter (once per run).

Side by side in one run, alternating the settings round by round (the machine's load changes minute
to minute): the median over ``--rounds`` rounds of ns per call over ``--calls`` calls, the filter's
length in instructions, the median install time in microseconds, and the machine. ``--against FILE``
adds another version of ``seccomp.py`` (say main's: ``git show main:alphaagent/sandbox/seccomp.py``)
for a before/after comparison.

Usage, from the repository root::

    .venv/bin/python bench/seccomp_filter.py [--rounds 7] [--calls 200000] [--against OLD.py] [--json]
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine

from alphaagent.sandbox import seccomp

PR_SET_NO_NEW_PRIVS = 38


def _load(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("seccomp_against", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _measure(module: ModuleType | None, level: str, calls: int) -> tuple[float, float]:
    """(ns per getppid, µs to install) in a forked child with ``module``'s filter of ``level``."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reports through the pipe and never returns
        try:
            install_us = 0.0
            if module is not None:
                ctypes.CDLL(None).prctl(PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), ctypes.c_ulong(0), 0, 0)
                start = time.perf_counter_ns()
                module.install(level, unix_sockets=False)
                install_us = (time.perf_counter_ns() - start) / 1e3
            getppid = os.getppid
            start = time.perf_counter_ns()
            for _ in range(calls):
                getppid()
            per_call = (time.perf_counter_ns() - start) / calls
            os.write(w, json.dumps([per_call, install_us]).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        answer = json.loads(fh.read())
    os.waitpid(pid, 0)
    return answer[0], answer[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--against", help="another seccomp.py to compare (e.g. main's)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    load_at_start = os.getloadavg()[0]
    versions: dict[str, ModuleType | None] = {"none": None, "this": seccomp}
    if args.against:
        versions["against"] = _load(args.against)
    settings = [("none", "-")] + [(v, level) for v in versions if v != "none" for level in seccomp.LEVELS]
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {s: [] for s in settings}
    for _ in range(args.rounds):
        for version, level in settings:
            samples[(version, level)].append(_measure(versions[version], level, args.calls))
    rows: list[dict[str, Any]] = []
    for (version, level), values in samples.items():
        module = versions[version]
        rows.append(
            {
                "filter": version,
                "level": level,
                "instructions": len(module.program(level=level) or []) if module else 0,
                "ns_per_call": round(statistics.median(v[0] for v in values), 1),
                "install_us": round(statistics.median(v[1] for v in values), 1),
            }
        )
    base = rows[0]["ns_per_call"]
    for row in rows:
        row["added_ns_per_call"] = round(row["ns_per_call"] - base, 1)
    out = {"machine": machine(load_at_start), "rounds": args.rounds, "calls": args.calls, "rows": rows}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"machine: {out['machine']}")
    print(f"getppid, median of {args.rounds} rounds of {args.calls} calls, settings alternating")
    print(f"{'filter':8} {'level':11} {'instr':>5} {'ns/call':>8} {'+ns':>6} {'install µs':>10}")
    for row in rows:
        print(
            f"{row['filter']:8} {row['level']:11} {row['instructions']:>5} {row['ns_per_call']:>8}"
            f" {row['added_ns_per_call']:>6} {row['install_us']:>10}"
        )


if __name__ == "__main__":
    main()
