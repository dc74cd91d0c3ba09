"""What one run costs in CPU, at each isolation level and preload, optionally side by side with another
checkout of the project (``--against``: say a worktree of main) in the same benchmark run.

A run's CPU is spread over processes: the supervisor (this process: the request, the capture, the
file report), the zygote (forking the next spare, its loop, the run's cgroups) and the run's own
processes (a spare, and with namespaces its namespace's init): the page faults after the fork, the
set-up, the code, the exit. ``print(1)`` is run ``--runs`` times on one warm ``Sandbox``; the
figure is the CPU of the supervisor (``RUSAGE_SELF``) plus the zygote's whole tree (``utime``,
``stime``, ``cutime`` and ``cstime`` of ``/proc/<zygote>/stat``: it is a subreaper, so every spare
and init it reaped is in it) over those runs, divided by their number. The zygote's start and
three warm-up runs are not counted; a pause before reading lets the last run's processes be reaped.

Each measurement is a fresh interpreter on one checkout (``--worker``), and the checkouts take
turns round by round, so the machine's load (other work skews every figure) weighs on both alike.
Printed: the median over ``--rounds`` of CPU-ms per run for each variant and checkout, their ratio,
and the machine (Markdown, or one JSON object with ``--json``).

Usage, from the repository root::

    .venv/bin/python bench/run_cpu.py [--rounds 3] [--runs 40] [--against ../main] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import machine  # noqa: E402

VARIANTS: dict[str, dict[str, Any]] = {
    "no preload, namespaces": {"preload": ()},
    "no preload, process": {"preload": (), "isolation": "process"},
    "builtin, namespaces": {},
    "builtin, process": {"isolation": "process"},
}
"""Label -> ``SandboxConfig`` fields (the builtin preload is the default)."""

SETTLE_S = 0.5
"""Pause after the warm-up and after the last run, so the processes of the runs before are reaped."""


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and every child it reaped (fields 14-17 of ``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return sum(int(value) for value in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def worker(tree: str, variant: str, runs: int) -> dict[str, float]:
    """In a fresh interpreter on checkout ``tree``: the CPU-ms per run of ``variant``."""
    sys.path.insert(0, tree)
    import resource

    from alphaagent.sandbox.config import SandboxConfig
    from alphaagent.sandbox.supervisor import Sandbox

    def own() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    with tempfile.TemporaryDirectory() as scope, Sandbox(SandboxConfig(**VARIANTS[variant])) as sandbox:
        for _ in range(3):
            sandbox.run("print(1)", cwd=scope)
        zygote = int(sandbox.info["pid"])
        time.sleep(SETTLE_S)
        own_before, tree_before, wall = own(), _tree_cpu_s(zygote), time.monotonic()
        for _ in range(runs):
            result = sandbox.run("print(1)", cwd=scope)
            if result.status != "ok" or result.stdout.strip() != "1":
                raise SystemExit(f"{variant}: a run failed: {result.status} {result.reason}")
        wall = time.monotonic() - wall
        time.sleep(SETTLE_S)
        own_after, tree_after = own(), _tree_cpu_s(zygote)
        return {
            "supervisor_ms": 1000 * (own_after - own_before) / runs,
            "zygote_tree_ms": 1000 * (tree_after - tree_before) / runs,
            "wall_ms": 1000 * wall / runs,
            "isolation": sandbox.isolation,  # type: ignore[dict-item]
        }


def measure(tree: Path, variant: str, runs: int) -> dict[str, Any]:
    """One ``worker`` in a fresh interpreter on ``tree`` (its own ``alphaagent``, zygote included)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, __file__, "--worker", str(tree), variant, str(runs)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {variant}: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--against", type=Path, help="another checkout, measured side by side")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        tree, variant, runs = args.worker
        print(json.dumps(worker(tree, variant, int(runs))))
        return
    load = os.getloadavg()[0]
    trees = {"this checkout": REPO_ROOT}
    if args.against:
        trees["against"] = args.against.resolve()
    samples: dict[tuple[str, str], list[dict[str, Any]]] = {(t, v): [] for t in trees for v in VARIANTS}
    for round_ in range(args.rounds):
        order = list(trees.items()) if round_ % 2 == 0 else list(trees.items())[::-1]
        for variant in VARIANTS:
            for label, tree in order:
                figures = measure(tree, variant, args.runs)
                samples[label, variant].append(figures)
                print(
                    f"[bench] round {round_ + 1} {label}, {variant}: "
                    f"{figures['supervisor_ms'] + figures['zygote_tree_ms']:.1f} CPU-ms per run",
                    file=sys.stderr,
                    flush=True,
                )
    rows = []
    for variant in VARIANTS:
        row: dict[str, Any] = {"variant": variant}
        for label in trees:
            taken = samples[label, variant]
            row[label] = {
                key: round(statistics.median(s[key] for s in taken), 1)
                for key in ("supervisor_ms", "zygote_tree_ms", "wall_ms")
            }
            row[label]["cpu_ms"] = round(row[label]["supervisor_ms"] + row[label]["zygote_tree_ms"], 1)
            row[label]["isolation"] = taken[0]["isolation"]
        if args.against:
            row["ratio"] = round(row["this checkout"]["cpu_ms"] / row["against"]["cpu_ms"], 2)
        rows.append(row)
    report = {"runs": args.runs, "rounds": args.rounds, "rows": rows, "machine": machine(load)}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    labels = list(trees)
    print(
        f"CPU-ms per `print(1)` run (median of {args.rounds} rounds of {args.runs} runs): "
        "supervisor + zygote tree"
    )
    print()
    print("| variant | " + " | ".join(labels) + (" | this / against |" if args.against else " |"))
    print("|---|" + "---|" * len(labels) + ("---|" if args.against else ""))
    for row in rows:
        cells = []
        for t in labels:
            figures = row[t]
            cells.append(
                f"{figures['cpu_ms']} ({figures['supervisor_ms']} + {figures['zygote_tree_ms']}, "
                f"{figures['isolation']})"
            )
        print(
            f"| {row['variant']} | " + " | ".join(cells) + (f" | {row['ratio']} |" if args.against else " |")
        )
    print()
    print("machine: " + json.dumps(report["machine"]))


if __name__ == "__main__":
    main()
