"""Benchmark: what showing a run's output live (``alphaagent run``/``exec``) costs, side by side.

For the same warm ``Sandbox``, runs each workload with no sink and with the CLI's ``LiveOutput``
writing to ``/dev/null`` (so the figure is the sink's own work, not a terminal's), interleaved, and
prints p50/p95 wall-clock milliseconds per run and the difference, with the machine.

- ``print(1)``: the per-run overhead a coder's small step sees;
- ``32 MiB of lines``: a chatty run, 32 Ki lines of 1 KiB (the live view stops after 1 MiB per
  stream; the capture and spill still see every byte).

Usage, from the repository root::

    .venv/bin/python bench/live_output.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from machine import machine  # noqa: E402

from alphaagent.sandbox.supervisor import Sandbox  # noqa: E402
from alphaagent.terminal import LiveOutput  # noqa: E402

WORKLOADS = {
    "print(1)": "print(1)",
    "32 MiB of lines": (
        "import sys\nline = 'x' * 1023 + '\\n'\nfor _ in range(32 * 1024):\n    sys.stdout.write(line)"
    ),
}


def _ms(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per workload and mode (default 20)")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory(prefix="alphaagent-bench-live-") as workdir, Sandbox() as sandbox:
        sandbox.run("print('warm')", cwd=Path(workdir))
        with open(os.devnull, "w", encoding="utf-8") as devnull:
            for name, code in WORKLOADS.items():
                times: dict[str, list[float]] = {"no sink": [], "LiveOutput": []}
                for _ in range(args.runs):
                    for mode in times:  # interleaved, so load changes hit both alike
                        sink = LiveOutput(devnull, stdout_prefix="  | ", stderr_prefix="  stderr | ")
                        started = time.perf_counter()
                        result = sandbox.run(
                            code, cwd=Path(workdir), on_output=sink if mode != "no sink" else None
                        )
                        times[mode].append((time.perf_counter() - started) * 1000)
                        if result.status != "ok":
                            print(f"{name} ({mode}): {result.status} {result.reason}", file=sys.stderr)
                            return 1
                base, live = times["no sink"], times["LiveOutput"]
                rows.append(
                    (
                        name,
                        _ms(base, 0.5),
                        _ms(base, 0.95),
                        _ms(live, 0.5),
                        _ms(live, 0.95),
                        statistics.median(live) - statistics.median(base),
                    )
                )
    print(
        "| workload | no sink p50 | p95 | LiveOutput p50 | p95 | p50 difference |"
        f"  (ms, {args.runs} runs each)"
    )
    print("|---|---|---|---|---|---|")
    for name, b50, b95, l50, l95, diff in rows:
        print(f"| {name} | {b50:.1f} | {b95:.1f} | {l50:.1f} | {l95:.1f} | {diff:+.1f} |")
    print(f"\nmachine: {machine(load)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
