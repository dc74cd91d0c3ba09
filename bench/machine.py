"""The machine a benchmark ran on: printed with every figure (STYLE: benchmarks say where they ran)."""

from __future__ import annotations

import os
import platform
from typing import Any

import psutil


def machine(load_at_start: float) -> dict[str, Any]:
    """CPU model, cores, memory, kernel, Python, whether we run as root, and the 1-minute load average
    at the start and end of the benchmark (other work on the machine skews every figure)."""
    cpu = "unknown"
    with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "root": os.geteuid() == 0,
        "load_1m_start": round(load_at_start, 2),
        "load_1m_end": round(os.getloadavg()[0], 2),
    }
