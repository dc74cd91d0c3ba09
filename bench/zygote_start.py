"""What one zygote start costs in CPU, side by side in one run: the builtin preload with and without
the font list kept from an earlier start (``alphaagent.sandbox.fontcache``), and a configuration
that preloads nothing with and without the builtin warm-up (``SandboxConfig`` gave a ``preload=()``
configuration the builtin warm-up until the warm-up followed the preload: it imported numpy,
pandas and matplotlib all the same).

Variants, run round robin so the machine's load weighs on all alike:

- ``builtin, font list built``: the builtin preload and warm-up, no font list kept (every start
  before ``fontcache``);
- ``builtin, font list kept``: the same, the font list of an earlier start copied in (every start
  but an interpreter's first now);
- ``preload=(), builtin warm-up``: what ``SandboxConfig(preload=())`` started before;
- ``preload=()``: what it starts now (no warm-up).

Each start is ``Sandbox.start()`` until the zygote is ready, then ``close()`` (which stops its
spares); the CPU is this process's children's (``RUSAGE_CHILDREN``: the zygote and every process it
reaped) plus this process's own, in seconds. Printed: the median and the spread over ``--rounds``.

Usage, from the repository root::

    .venv/bin/python bench/zygote_start.py [--rounds 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from machine import machine  # noqa: E402

from alphaagent.sandbox import fontcache  # noqa: E402
from alphaagent.sandbox.config import BUILTIN_WARMUP, SandboxConfig  # noqa: E402
from alphaagent.sandbox.supervisor import Sandbox  # noqa: E402

VARIANTS: dict[str, tuple[SandboxConfig, bool]] = {
    "builtin, font list built": (SandboxConfig(), False),
    "builtin, font list kept": (SandboxConfig(), True),
    "preload=(), builtin warm-up": (SandboxConfig(preload=(), warmup=BUILTIN_WARMUP), False),
    "preload=()": (SandboxConfig(preload=()), False),
}


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def one_start(config: SandboxConfig, keep_font_list: bool) -> tuple[float, float]:
    """(CPU-s, wall s) of one start and close."""
    if not keep_font_list:
        fontcache.forget()
    cpu, wall = _cpu(), time.monotonic()
    sandbox = Sandbox(config)
    try:
        sandbox.start()
    finally:
        sandbox.close()
    return _cpu() - cpu, time.monotonic() - wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    one_start(SandboxConfig(), True)  # the disk cache warm, and a font list to keep
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in VARIANTS}
    for _ in range(args.rounds):
        for name, (config, keep) in VARIANTS.items():
            if keep:
                one_start(config, False)  # a font list of this interpreter to start from
            samples[name].append(one_start(config, keep))
    rows: list[dict[str, Any]] = []
    for name, values in samples.items():
        cpus, walls = [c for c, _ in values], [w for _, w in values]
        rows.append(
            {
                "variant": name,
                "cpu_s_median": round(statistics.median(cpus), 3),
                "cpu_s_min": round(min(cpus), 3),
                "cpu_s_max": round(max(cpus), 3),
                "wall_s_median": round(statistics.median(walls), 3),
            }
        )
    report = {"machine": machine(load), "rounds": args.rounds, "starts": rows}
    if args.json:
        print(json.dumps(report))
        return
    print(f"machine: {report['machine']}")
    print(f"rounds: {args.rounds} (one start per variant per round, round robin)\n")
    print("| variant | CPU-s median | CPU-s min-max | wall s median |")
    print("|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['variant']} | {row['cpu_s_median']:.2f} | {row['cpu_s_min']:.2f}-{row['cpu_s_max']:.2f}"
            f" | {row['wall_s_median']:.2f} |"
        )


if __name__ == "__main__":
    main()
