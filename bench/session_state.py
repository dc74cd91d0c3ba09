"""Benchmark of a session's live state (issue 13): save and restore beside re-reading the same data.

For a float64 DataFrame (8 columns) and a numpy array of 1 MB, 100 MB and 1 GB (``--quick``: 1 MB
and 100 MB), through the real ``Sandbox``, in one session each, it prints:

- ``save_ms``: the child's save after the run that built the object (everything written), and
  ``save_unchanged_ms``: the save after a run that did not touch it (nothing written);
- ``restore_ms``: the child's restore before the next run (the buffers are mapped, not read), and
  ``restore_touch_ms``: restore plus reading every byte once (``sum``), the fair comparison with a
  read that materialises the data;
- ``csv_ms`` / ``parquet_ms``: ``pd.read_csv`` / ``pd.read_parquet`` (``np.loadtxt`` / ``np.load``
  for the array, whose CSV is one column) of the same data, timed in the same child, plus a ``sum``;
- the ``print(1)`` tax: wall time of ``print(1)`` runs in a session that holds a 100 MB DataFrame
  against runs in an empty session, interleaved so the machine's load weighs on both alike (median
  and p90 of ``--runs`` each);
- with ``ALPHAAGENT_STATE_NO_PAGEMAP=1`` set for the sandbox (``--no-pagemap``), the same with the
  CRC-32 fallback that processes without access to ``/proc/self/pagemap`` use (Lambda);
- the machine, and PASS/FAIL against the issue's targets (``TARGET_*``).

Usage, from the repository root::

    .venv/bin/python bench/session_state.py [--quick] [--sizes 1,100,1000] [--runs N] [--no-pagemap] [--json]

Progress goes to stderr. The data goes to a temporary scope that is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from alphaagent.ids import new_ulid  # noqa: E402
from alphaagent.models.run import RunLimits, RunResult  # noqa: E402
from alphaagent.sandbox.config import SandboxConfig  # noqa: E402
from alphaagent.sandbox.session import StateRequest  # noqa: E402
from alphaagent.sandbox.supervisor import Sandbox  # noqa: E402
from bench.machine import machine  # noqa: E402

TARGET_RESTORE_100MB_MS = 150
TARGET_RESTORE_VS_CSV = 5.0
TARGET_PRINT_TAX_MS = 50
MB = 1_000_000
LIMITS = RunLimits(timeout_s=900, memory_mb=10_240, file_size_mb=10 * 1024)

BUILD = {
    "frame": """\
import numpy as np, pandas as pd
rows = np.random.default_rng(0).random(({n} // 64, 8))
obj = pd.DataFrame(rows, columns=[f"c{{i}}" for i in range(8)])
del rows
obj.to_csv("work/bench.csv", index=False)
obj.to_parquet("work/bench.parquet")
""",
    "array": """\
import numpy as np
obj = np.random.default_rng(0).random({n} // 8)
if {csv}:
    np.savetxt("work/bench.csv", obj)
np.save("work/bench.npy", obj)
""",
}
ARRAY_CSV_MAX = 100 * 1_000_000
"""``np.savetxt``/``np.loadtxt`` run at Python speed (~23 s for 100 MB here): the 1 GB array's CSV is
left out to keep the benchmark bounded (its frame, through pandas' C parser, is measured)."""

_TIMED = """\
import json, time

def timed(read):
    started = time.perf_counter()
    data = read()
    float(np.asarray(data).sum())
    return (time.perf_counter() - started) * 1000

figures = {{"touch_ms": timed(lambda: obj), "csv_ms": -1.0}}
"""
READ = {
    "frame": _TIMED
    + """\
figures["csv_ms"] = timed(lambda: pd.read_csv("work/bench.csv"))
figures["parquet_ms"] = timed(lambda: pd.read_parquet("work/bench.parquet"))
print(json.dumps(figures))
""",
    "array": _TIMED
    + """\
if {csv}:
    figures["csv_ms"] = timed(lambda: np.loadtxt("work/bench.csv"))
figures["parquet_ms"] = timed(lambda: np.load("work/bench.npy"))
print(json.dumps(figures))
""",
}


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _run(sandbox: Sandbox, code: str, root: Path, state: StateRequest) -> RunResult:
    result = sandbox.run(code, cwd=root, state=state, limits=LIMITS)
    if result.status != "ok":
        raise SystemExit(f"bench run failed: {result.status} {result.error} {result.stderr[-2000:]}")
    return result


def measure(sandbox: Sandbox, root: Path, kind: str, size: int) -> dict[str, Any]:
    """Save, restore and re-read figures for one object (see the module docstring)."""
    state = StateRequest(session_id=f"bench-{new_ulid().lower()}", max_bytes=4 * 2**30, max_save_s=600)
    csv = kind == "frame" or size <= ARRAY_CSV_MAX
    built = _run(sandbox, BUILD[kind].format(n=size, csv=csv), root, state)
    unchanged = _run(sandbox, "pass", root, state)
    read = _run(sandbox, READ[kind].format(csv=csv), root, state)
    figures = json.loads(read.stdout.strip().splitlines()[-1])
    assert built.state and unchanged.state and read.state
    row = {
        "kind": kind,
        "size_mb": size // MB,
        "state_mb": round(built.state.bytes / MB, 1),
        "save_ms": built.state.save_ms,
        "save_unchanged_ms": unchanged.state.save_ms,
        "written_unchanged_bytes": unchanged.state.written_bytes,
        "restore_ms": read.state.restore_ms,
        "restore_touch_ms": round((read.state.restore_ms or 0) + figures["touch_ms"], 1),
        "csv_ms": round(figures["csv_ms"], 1) if csv else "not run",
        "parquet_ms" if kind == "frame" else "npy_ms": round(figures["parquet_ms"], 1),
    }
    shutil.rmtree(root / "work" / "sessions" / state.session_id, ignore_errors=True)
    for leftover in ("bench.csv", "bench.parquet", "bench.npy"):
        (root / "work" / leftover).unlink(missing_ok=True)
    return row


def print_tax(sandbox: Sandbox, root: Path, runs: int) -> dict[str, Any]:
    """Wall time of ``print(1)`` in a session holding a 100 MB frame vs an empty session."""
    held = StateRequest(session_id=f"bench-{new_ulid().lower()}", max_bytes=4 * 2**30)
    empty = StateRequest(session_id=f"bench-{new_ulid().lower()}")
    build = BUILD["frame"].format(n=100 * MB, csv=False).split("obj.to_csv")[0]
    _run(sandbox, build, root, held)
    _run(sandbox, "pass", root, empty)
    times: dict[str, list[float]] = {"held": [], "empty": []}
    restore: list[int] = []
    save: list[int] = []
    for _ in range(runs):
        for name, state in (("held", held), ("empty", empty)):
            started = time.perf_counter()
            result = _run(sandbox, "print(1)", root, state)
            times[name].append((time.perf_counter() - started) * 1000)
            if name == "held" and result.state:
                restore.append(result.state.restore_ms or 0)
                save.append(result.state.save_ms or 0)

    def p(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)

    return {
        "runs": runs,
        "held_p50_ms": p(times["held"], 0.5),
        "held_p90_ms": p(times["held"], 0.9),
        "empty_p50_ms": p(times["empty"], 0.5),
        "empty_p90_ms": p(times["empty"], 0.9),
        "tax_p50_ms": round(p(times["held"], 0.5) - p(times["empty"], 0.5), 1),
        "held_restore_ms_median": statistics.median(restore) if restore else None,
        "held_save_ms_median": statistics.median(save) if save else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 MB and 100 MB only")
    parser.add_argument("--runs", type=int, default=15, help="print(1) runs per session (default 15)")
    parser.add_argument("--no-pagemap", action="store_true", help="measure the CRC-32 fallback")
    parser.add_argument("--sizes", help="comma-separated sizes in MB instead (100 must be one of them)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    sizes = [1 * MB, 100 * MB] + ([] if args.quick else [1000 * MB])
    if args.sizes:
        sizes = [int(size) * MB for size in args.sizes.split(",")]
    extra_env = {"ALPHAAGENT_STATE_NO_PAGEMAP": "1"} if args.no_pagemap else {}
    rows: list[dict[str, Any]] = []
    root = Path(tempfile.mkdtemp(prefix="alphaagent-bench-state-"))
    (root / "work").mkdir()
    try:
        with Sandbox(SandboxConfig(extra_env=extra_env)) as sandbox:
            for size in sizes:
                for kind in ("frame", "array"):
                    _log(f"{kind} {size // MB} MB ...")
                    rows.append(measure(sandbox, root, kind, size))
            _log("print(1) tax ...")
            tax = print_tax(sandbox, root, args.runs)
            isolation = sandbox.isolation
    finally:
        shutil.rmtree(root, ignore_errors=True)
    frame_100 = next((r for r in rows if r["kind"] == "frame" and r["size_mb"] == 100), rows[0])
    checks = {
        f"restore 100 MB frame < {TARGET_RESTORE_100MB_MS} ms": (frame_100["restore_ms"] or 0)
        < TARGET_RESTORE_100MB_MS,
        f"restore+touch 100 MB frame >= {TARGET_RESTORE_VS_CSV:g}x faster than CSV": frame_100["csv_ms"]
        >= TARGET_RESTORE_VS_CSV * max(frame_100["restore_touch_ms"], 0.1),
        f"print(1) tax <= {TARGET_PRINT_TAX_MS} ms": tax["tax_p50_ms"] <= TARGET_PRINT_TAX_MS,
    }
    report: dict[str, Any] = {
        "rows": rows,
        "print_tax": tax,
        "change_tracking": "crc32" if args.no_pagemap else "pagemap",
        "isolation": isolation,
        "checks": {name: "PASS" if ok else "FAIL" for name, ok in checks.items()},
        "machine": machine(load),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    columns = list(rows[0].keys() | rows[1].keys())
    ordered = [
        c
        for c in (
            "kind",
            "size_mb",
            "state_mb",
            "save_ms",
            "save_unchanged_ms",
            "written_unchanged_bytes",
            "restore_ms",
            "restore_touch_ms",
            "csv_ms",
            "parquet_ms",
            "npy_ms",
        )
        if c in columns
    ]
    print("| " + " | ".join(ordered) + " |")
    print("|" + "---|" * len(ordered))
    for row in rows:
        print("| " + " | ".join(str(row.get(c, "")) for c in ordered) + " |")
    print()
    print(f"print(1) tax ({report['change_tracking']}, {isolation}):", json.dumps(tax))
    for name, verdict in report["checks"].items():
        print(f"{verdict}: {name}")
    print("machine:", json.dumps(report["machine"]))


if __name__ == "__main__":
    main()
