"""What an export of many small files costs (alphaagent/local/export.py), side by side in one run:
every file deflated (what ``export_scope`` did before) against files of at most
``STORED_MAX_BYTES`` stored (what it does now), on a real local workspace of ``--files`` files of
``--size`` bytes each.

Usage, from the repository root::

    .venv/bin/python bench/export.py [--files 20000] [--size 12] [--repeat 3]

Prints JSON: the median CPU seconds (user + system) and wall seconds of each, the archive sizes,
the ratio, and the machine (with its load average).
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from machine import machine

from alphaagent.local import export
from alphaagent.local.workspace import LocalWorkspace
from alphaagent.models.common import ConversationScope


def _cpu() -> float:
    times = os.times()
    return times.user + times.system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=12, help="bytes of each file (at most 64 to be stored)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    scope = ConversationScope(conversation_id="bench")
    with tempfile.TemporaryDirectory() as folder:
        workspace = LocalWorkspace(Path(folder) / "home")
        workspace.ensure_scope(scope)
        for index in range(args.files):
            workspace.write_bytes(
                scope, f"work/parts/p{index:06d}.csv", (b"%d," % index).ljust(args.size, b"x")
            )
        out = Path(folder) / "out.zip"
        samples: dict[str, list[tuple[float, float]]] = {"deflated": [], "stored": []}
        sizes: dict[str, int] = {}
        now = export.STORED_MAX_BYTES
        for _ in range(args.repeat):
            for label, stored_max in (("deflated", -1), ("stored", now)):
                export.STORED_MAX_BYTES = stored_max  # type: ignore[misc]  # -1: nothing stored for its size
                cpu, wall = _cpu(), time.perf_counter()
                report = export.export_scope(workspace, scope, out)
                samples[label].append((_cpu() - cpu, time.perf_counter() - wall))
                sizes[label] = report.archive_bytes
        figures: dict[str, float | int] = {"files": args.files, "file_bytes": args.size}
        for label, runs in samples.items():
            figures[f"{label}_cpu_s"] = round(statistics.median(c for c, _ in runs), 2)
            figures[f"{label}_wall_s"] = round(statistics.median(w for _, w in runs), 2)
            figures[f"{label}_archive_bytes"] = sizes[label]
        figures["deflated_over_stored_cpu"] = round(
            float(figures["deflated_cpu_s"]) / max(float(figures["stored_cpu_s"]), 1e-9), 2
        )
    print(json.dumps({"figures": figures, "machine": machine(load)}, indent=2))


if __name__ == "__main__":
    main()
