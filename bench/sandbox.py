"""Benchmark of the zygote sandbox against a fresh interpreter and a warm Jupyter kernel, in one run.

Prints, as a Markdown table (or one JSON object with ``--json``):

- per-run overhead p50/p95 in milliseconds of ``print(1)`` and a small pandas operation, for the zygote
  ``Sandbox`` at both isolation levels (back-to-back runs, and runs 50 ms apart as a coder calls
  ``run_in_env``: it reads each result before the next), a fresh ``python -c`` per run, and a warm
  Jupyter kernel (``execute_interactive`` round trips);
- flood throughput: a child writing 1 GiB to stdout under a 2 GiB spill cap, and the same flood under
  the default 64 MiB cap (killed at the output limit);
- the benchmark process's resident memory before the floods and its peak during them;
- the per-run cost of the bounds at the ``namespaces`` level (issue 10): ``print(1)`` through four
  sandboxes side by side -- no new bounds (the host's ``/dev`` read-only, an unsized ``/tmp``, no
  memory cgroup: the behaviour before them), then adding a sized ``/tmp`` and ``/dev/shm``, a
  minimal ``/dev``, and a memory cgroup (the default) -- with runs interleaved between the four so
  that the machine's load weighs on each alike;
- the machine, and PASS/FAIL against the sandbox's performance targets (``TARGET_*`` below).

Usage, from the repository root::

    .venv/bin/python bench/sandbox.py [--quick] [--json] [--bounds-only]

``--quick`` divides the iteration counts by 4 (a CI smoke run); the figures are then noisier.
Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import psutil  # noqa: E402
from jupyter_client.manager import start_new_kernel  # noqa: E402
from machine import machine  # noqa: E402

from alphaagent.errors import SandboxError  # noqa: E402
from alphaagent.models.run import RunLimits  # noqa: E402
from alphaagent.sandbox.config import SandboxConfig  # noqa: E402
from alphaagent.sandbox.supervisor import Sandbox  # noqa: E402

WORKLOADS: dict[str, tuple[str, str]] = {
    "print(1)": ("print(1)", "1"),
    "pandas sum": (
        'import pandas as pd\nprint(pd.DataFrame({"a": range(1000)})["a"].sum())',
        "499500",
    ),
}
"""Workload name -> (code, expected stdout stripped)."""

PAUSE_S = 0.05
"""Pause between runs of the "paused" pattern: a coder reads each result before calling again."""

FLOOD_MIB = 1024
FLOOD_CODE = f'import os\nb=b"x"*(1<<20)\nfor _ in range({FLOOD_MIB}): os.write(1, b)'
FLOOD_SPILL_BYTES = 2 << 30
FLOOD_LIMITS = RunLimits(timeout_s=120)

# Performance targets of the zygote sandbox: per-run overhead, and what it must beat.
TARGET_PRINT_P50_MS = 10.0
TARGET_FRESH_SPEEDUP = 30.0
TARGET_JUPYTER_RATIO = 5.0
TARGET_RSS_GROWTH_MIB = 64.0
TARGET_BOUNDS_RATIO = 1.10
"""The bounds of issue 10 may cost at most 10 % of the print(1) p50 at the namespaces level."""

BOUND_CONFIGS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("no new bounds (before)", {"private_dev": False, "sized_tmp": False, "memory_cgroup": False}),
    ("+ sized /tmp and /dev/shm", {"private_dev": False, "memory_cgroup": False}),
    ("+ minimal /dev", {"memory_cgroup": False}),
    ("+ memory cgroup (default)", {}),
)
"""Label -> ``SandboxConfig`` overrides, each adding one bound to the row above it. Every row keeps
the seccomp filter (no AF_UNIX socket without network) and the disk budget's poll: they have no
switch, and cost a few microseconds per run."""
BURST = 10
"""Back-to-back runs in a row on one sandbox before the next takes its turn (drains its spares)."""

MIB = 1 << 20


def progress(message: str) -> None:
    """One line of progress on stderr, so ``--json`` output on stdout stays clean."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------- latency


@dataclass
class Latency:
    """Wall-clock round trips of one workload on one runner, in milliseconds (warm-up excluded)."""

    runner: str
    pattern: str
    workload: str
    samples_ms: list[float] = field(repr=False)
    errors: list[str] = field(default_factory=list, repr=False)

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.samples_ms) if self.samples_ms else math.nan

    @property
    def p95_ms(self) -> float:
        if len(self.samples_ms) < 2:
            return self.samples_ms[0] if self.samples_ms else math.nan
        return statistics.quantiles(self.samples_ms, n=20, method="inclusive")[18]

    def summary(self) -> dict[str, Any]:
        """The figures of this row, for the JSON output."""
        return {
            "runner": self.runner,
            "pattern": self.pattern,
            "workload": self.workload,
            "n": len(self.samples_ms),
            "p50_ms": round(self.p50_ms, 2),
            "p95_ms": round(self.p95_ms, 2),
            "min_ms": round(min(self.samples_ms, default=math.nan), 2),
            "max_ms": round(max(self.samples_ms, default=math.nan), 2),
            "errors": len(self.errors),
            "first_error": self.errors[0] if self.errors else None,
        }


class RunFailedError(RuntimeError):
    """A benchmarked run did not print what it should: the figures would be meaningless."""


def measure(
    run_once: Callable[[], None],
    *,
    warmup: int,
    n: int,
    pause_s: float = 0.0,
    tolerate: tuple[type[Exception], ...] = (),
) -> tuple[list[float], list[str]]:
    """Call ``run_once`` ``warmup`` times untimed, then until ``n`` calls succeeded; return the
    successful calls' milliseconds and the messages of the failed ones.

    ``pause_s`` seconds of sleep precede every call (warm-up included), outside the timed span. An
    exception in ``tolerate`` (a platform error the benchmark reports rather than hides) is recorded
    and the call not timed; after ``2 * (warmup + n)`` such failures the measurement gives up.
    """
    samples: list[float] = []
    errors: list[str] = []
    done = 0
    while len(samples) < n and len(errors) < 2 * (warmup + n):
        if pause_s:
            time.sleep(pause_s)
        started = time.perf_counter()
        try:
            run_once()
        except tolerate as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
            continue
        elapsed_ms = (time.perf_counter() - started) * 1000
        done += 1
        if done > warmup:
            samples.append(elapsed_ms)
    return samples, errors


def check_output(runner: str, stdout: str, expected: str) -> None:
    """Raise ``RunFailedError`` unless ``stdout`` is ``expected`` (surrounding whitespace ignored)."""
    if stdout.strip() != expected:
        raise RunFailedError(f"{runner}: expected {expected!r}, got {stdout[:200]!r}")


def bench_zygote(
    label: str, config: SandboxConfig, workdir: Path, *, warmup: int, n: int
) -> tuple[list[Latency], dict[str, Any]]:
    """Both workloads, back-to-back and paused, through one ``Sandbox``; returns rows and its info."""
    rows: list[Latency] = []
    started = time.perf_counter()
    with Sandbox(config) as sandbox:
        info = sandbox.info
        startup_s = time.perf_counter() - started
        progress(f"{label}: zygote ready in {startup_s:.1f} s, isolation {sandbox.isolation}")
        for workload, (code, expected) in WORKLOADS.items():

            def run_once(code: str = code, expected: str = expected) -> None:
                result = sandbox.run(code, cwd=workdir)
                if result.status != "ok":
                    raise RunFailedError(f"{label}: status {result.status}: {result.error}")
                check_output(label, result.stdout, expected)

            for pattern, pause_s in (("back-to-back", 0.0), (f"{int(PAUSE_S * 1000)} ms pause", PAUSE_S)):
                progress(f"{label}: {workload}, {pattern}, {n} runs")
                samples, errors = measure(
                    run_once, warmup=warmup, n=n, pause_s=pause_s, tolerate=(SandboxError,)
                )
                if errors:
                    progress(f"{label}: {len(errors)} runs failed, first: {errors[0]}")
                rows.append(Latency(label, pattern, workload, samples, errors))
    return rows, {
        "label": label,
        "requested_isolation": config.isolation,
        "isolation": info.get("isolation"),
        "isolation_detail": info.get("isolation_detail"),
        "pool_size": config.pool_size,
        "startup_s": round(startup_s, 2),
        "preload_errors": info.get("preload_errors", {}),
    }


def bench_fresh_interpreter(workdir: Path, *, warmup: int, n: int) -> list[Latency]:
    """``subprocess.run([sys.executable, "-c", code])`` per run: the interpreter and pandas start cold."""
    rows: list[Latency] = []
    runner = "fresh interpreter"
    for workload, (code, expected) in WORKLOADS.items():

        def run_once(code: str = code, expected: str = expected) -> None:
            completed = subprocess.run(
                [sys.executable, "-c", code], cwd=workdir, capture_output=True, text=True, check=False
            )
            if completed.returncode != 0:
                raise RunFailedError(f"{runner}: exit {completed.returncode}: {completed.stderr[-500:]}")
            check_output(runner, completed.stdout, expected)

        progress(f"{runner}: {workload}, {n} runs")
        samples, _ = measure(run_once, warmup=warmup, n=n)
        rows.append(Latency(runner, "back-to-back", workload, samples))
    return rows


def bench_jupyter(workdir: Path, *, warmup: int, n: int) -> tuple[list[Latency], float]:
    """One kernel started once, then ``execute_interactive`` round trips; returns rows and start-up s."""
    rows: list[Latency] = []
    runner = "warm Jupyter kernel"
    started = time.perf_counter()
    manager, client = start_new_kernel(
        kernel_name="python3", cwd=str(workdir), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    startup_s = time.perf_counter() - started
    progress(f"{runner}: started in {startup_s:.1f} s")
    try:
        for workload, (code, expected) in WORKLOADS.items():

            def run_once(code: str = code, expected: str = expected) -> None:
                printed: list[str] = []

                def on_output(message: dict[str, Any]) -> None:
                    if message["header"]["msg_type"] == "stream":
                        printed.append(message["content"]["text"])

                reply = client.execute_interactive(code, timeout=60, output_hook=on_output)
                if reply["content"]["status"] != "ok":
                    raise RunFailedError(f"{runner}: {reply['content'].get('ename')}")
                check_output(runner, "".join(printed), expected)

            progress(f"{runner}: {workload}, {n} runs")
            samples, _ = measure(run_once, warmup=warmup, n=n)
            rows.append(Latency(runner, "back-to-back", workload, samples))
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    return rows, startup_s


def bench_bounds(workdir: Path, *, warmup: int, n: int) -> tuple[list[Latency], list[dict[str, Any]]]:
    """``print(1)`` through one sandbox per ``BOUND_CONFIGS`` row, started together and measured in
    turn (single runs with the pause, bursts of ``BURST`` back to back); returns rows and infos."""
    code, expected = WORKLOADS["print(1)"]
    boxes: list[tuple[str, Sandbox]] = []
    infos: list[dict[str, Any]] = []
    rows: list[Latency] = []
    try:
        for label, overrides in BOUND_CONFIGS:
            box = Sandbox(SandboxConfig(**overrides))
            boxes.append((label, box))
            box.start()
            infos.append({"label": label, "isolation": box.isolation, **overrides})
        if any(box.isolation != "namespaces" for _, box in boxes):
            progress("bounds: namespaces unavailable here; the comparison is skipped")
            return [], infos
        results: dict[str, Any] = {}

        def run_on(label: str, box: Sandbox) -> None:
            result = box.run(code, cwd=workdir)
            if result.status != "ok":
                raise RunFailedError(f"{label}: status {result.status}: {result.error}")
            check_output(label, result.stdout, expected)
            results[label] = result.isolation

        for pattern, pause_s, burst in (
            (f"{int(PAUSE_S * 1000)} ms pause", PAUSE_S, 1),
            ("back-to-back", 0.0, BURST),
        ):
            progress(f"bounds: print(1), {pattern}, {n} runs on each of {len(boxes)} sandboxes")
            samples: dict[str, list[float]] = {label: [] for label, _ in boxes}
            for label, box in boxes:
                for _ in range(warmup):
                    run_on(label, box)
            turn = 0
            while any(len(s) < n for s in samples.values()):
                # The order rotates: the sandbox after another one's run shares the CPU with that
                # zygote's refill of its spare, and no row should always be the one that does.
                turn += 1
                for label, box in boxes[turn % len(boxes) :] + boxes[: turn % len(boxes)]:
                    taken, _ = measure(
                        lambda label=label, box=box: run_on(label, box), warmup=0, n=burst, pause_s=pause_s
                    )
                    samples[label] += taken
            rows += [Latency(label, pattern, "print(1)", samples[label][:n]) for label, _ in boxes]
        for info in infos:
            report = results.get(info["label"])
            info["result_isolation"] = report.model_dump() if report is not None else None
    finally:
        for _, box in boxes:
            box.close()
    return rows, infos


# ---------------------------------------------------------------------------------------- floods


class PeakRss:
    """Samples this process's resident set size every ``interval_s`` seconds in a thread; keeps the peak."""

    def __init__(self, interval_s: float = 0.005) -> None:
        self._process = psutil.Process()
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="rss-sampler", daemon=True)
        self.peak_bytes = self._process.memory_info().rss

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak_bytes = max(self.peak_bytes, self._process.memory_info().rss)
            self._stop.wait(self._interval_s)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_bytes = max(self.peak_bytes, self._process.memory_info().rss)


def max_rss_bytes() -> int:
    """Lifetime peak RSS of this process (``ru_maxrss`` is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def flood(config: SandboxConfig, workdir: Path) -> dict[str, Any]:
    """Run the 1 GiB stdout flood once in a fresh ``Sandbox``; returns its figures (MB = 10**6 bytes)."""
    with Sandbox(config) as sandbox:
        sandbox.run("print(1)", cwd=workdir)  # the zygote and a spare child are warm before timing
        started = time.perf_counter()
        result = sandbox.run(FLOOD_CODE, cwd=workdir, limits=FLOOD_LIMITS)
        wall_s = time.perf_counter() - started
    return {
        "spill_bytes": config.spill_bytes,
        "status": result.status,
        "reason": result.reason,
        "stdout_bytes": result.stdout_bytes,
        "wall_s": round(wall_s, 3),
        "mb_per_s": round(result.stdout_bytes / wall_s / 1e6, 1),
        "returned_stdout_chars": len(result.stdout),
        "spilled": result.stdout_path is not None,
    }


def bench_floods(workdir: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The flood under a 2 GiB spill cap, then under the default cap; returns both and the memory."""
    process = psutil.Process()
    rss_before = process.memory_info().rss
    maxrss_before = max_rss_bytes()
    with PeakRss() as peak:
        progress(f"flood: {FLOOD_MIB} MiB to stdout, spill cap {FLOOD_SPILL_BYTES // MIB} MiB")
        big = flood(SandboxConfig(spill_bytes=FLOOD_SPILL_BYTES), workdir / "flood-big")
        progress(f"flood: {big['mb_per_s']} MB/s, status {big['status']}")
        progress("flood: default config (killed at the output limit)")
        capped = flood(SandboxConfig(), workdir / "flood-capped")
        progress(f"flood: ended after {capped['wall_s']} s, status {capped['status']}")
    rss_after = process.memory_info().rss
    memory = {
        "rss_before_mib": round(rss_before / MIB, 1),
        "rss_peak_during_floods_mib": round(peak.peak_bytes / MIB, 1),
        "rss_after_mib": round(rss_after / MIB, 1),
        "rss_growth_mib": round((peak.peak_bytes - rss_before) / MIB, 1),
        "ru_maxrss_before_mib": round(maxrss_before / MIB, 1),
        "ru_maxrss_after_mib": round(max_rss_bytes() / MIB, 1),
    }
    return big, capped, memory


# ---------------------------------------------------------------------------------------- report


def find(rows: list[Latency], runner: str, pattern: str, workload: str) -> Latency:
    """The one row of ``runner``/``pattern``/``workload``."""
    return next(r for r in rows if (r.runner, r.pattern, r.workload) == (runner, pattern, workload))


def targets(rows: list[Latency], zygote_labels: list[str], memory: dict[str, Any]) -> list[dict[str, Any]]:
    """PASS/FAIL of each ``TARGET_*``, for every zygote configuration measured."""
    paused = f"{int(PAUSE_S * 1000)} ms pause"
    fresh = "fresh interpreter"
    jupyter = "warm Jupyter kernel"
    checks: list[dict[str, Any]] = []

    def check(name: str, value: float, unit: str, limit: str, passed: bool) -> None:
        # Rounded as the latency table rounds (2 decimals, then 1), so the two tables agree.
        shown = f"{value:d}" if isinstance(value, int) else f"{round(value, 2):.1f}"
        checks.append({"target": name, "value": f"{shown}{unit}", "limit": limit, "pass": bool(passed)})

    for label in zygote_labels:
        failures = sum(len(r.errors) for r in rows if r.runner == label)
        check(f"{label}: runs that raised SandboxError", failures, "", "0", failures == 0)
        for pattern in (paused, "back-to-back"):
            p50 = find(rows, label, pattern, "print(1)").p50_ms
            check(
                f"{label}: print(1) p50, {pattern}",
                p50,
                " ms",
                f"<= {TARGET_PRINT_P50_MS:g} ms",
                p50 <= TARGET_PRINT_P50_MS,
            )
        zygote_pandas = find(rows, label, paused, "pandas sum").p50_ms
        speedup = find(rows, fresh, "back-to-back", "pandas sum").p50_ms / zygote_pandas
        check(
            f"{label} ({paused}) vs fresh interpreter importing pandas: pandas p50 speed-up",
            speedup,
            "x",
            f">= {TARGET_FRESH_SPEEDUP:g}x",
            speedup >= TARGET_FRESH_SPEEDUP,
        )
        for workload in WORKLOADS:
            ratio = (
                find(rows, label, paused, workload).p50_ms
                / find(rows, jupyter, "back-to-back", workload).p50_ms
            )
            check(
                f"{label} ({paused}) / warm Jupyter kernel: {workload} p50 ratio",
                ratio,
                "x",
                f"<= {TARGET_JUPYTER_RATIO:g}x",
                ratio <= TARGET_JUPYTER_RATIO,
            )
    before = BOUND_CONFIGS[0][0]
    for pattern in (paused, "back-to-back"):
        try:
            old = find(rows, before, pattern, "print(1)").p50_ms
        except StopIteration:
            break  # bounds not measured (namespaces unavailable)
        for label, _ in BOUND_CONFIGS[1:]:
            ratio = find(rows, label, pattern, "print(1)").p50_ms / old
            check(
                f"bounds: {label} / {before}, print(1) p50, {pattern}",
                ratio,
                "x",
                f"<= {TARGET_BOUNDS_RATIO:g}x",
                ratio <= TARGET_BOUNDS_RATIO,
            )
    if not memory:
        return checks
    check(
        "supervisor RSS growth during the floods",
        memory["rss_growth_mib"],
        " MiB",
        f"< {TARGET_RSS_GROWTH_MIB:g} MiB",
        memory["rss_growth_mib"] < TARGET_RSS_GROWTH_MIB,
    )
    return checks


def markdown(report: dict[str, Any]) -> str:
    """The report as Markdown tables."""
    m = report["machine"]
    lines = [
        "## Machine",
        "",
        f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, kernel {m['kernel']}, "
        f"Python {m['python']}, root: {'yes' if m['root'] else 'no'}; "
        f"1-minute load average {m['load_1m_start']} at the start, {m['load_1m_end']} at the end",
        "",
        "## Sandboxes",
        "",
        "| Sandbox | Requested | Active isolation | Pool | Start-up |",
        "|---|---|---|---|---|",
    ]
    for z in report["zygotes"]:
        lines.append(
            f"| {z['label']} | {z['requested_isolation']} | {z['isolation']} ({z['isolation_detail']}) "
            f"| {z['pool_size']} | {z['startup_s']} s |"
        )
    lines.append(f"| warm Jupyter kernel | | | | {report['jupyter_startup_s']} s |")
    lines += [
        "",
        "## Per-run overhead (wall clock of one round trip, warm-up excluded)",
        "",
        "| Runner | Pattern | Workload | N | p50 ms | p95 ms | min ms | max ms | Failed runs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["latency"]:
        lines.append(
            f"| {row['runner']} | {row['pattern']} | {row['workload']} | {row['n']} | "
            f"{row['p50_ms']:.1f} | {row['p95_ms']:.1f} | {row['min_ms']:.1f} | {row['max_ms']:.1f} | "
            f"{row['errors']} |"
        )
    failed = [row for row in report["latency"] if row["errors"]]
    if failed:
        lines += ["", "Runs that failed with a platform error (not timed):", ""]
        for row in failed:
            lines.append(
                f"- {row['runner']}, {row['pattern']}, {row['workload']}: {row['errors']} failed; "
                f"first: `{row['first_error']}`"
            )
    lines += markdown_bounds(report)
    lines += [
        "",
        f"## Stdout flood ({FLOOD_MIB} MiB written by the child)",
        "",
        "| Spill cap | Status | Reason | Bytes read | Wall s | MB/s | Spilled |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in report["floods"]:
        lines.append(
            f"| {f['spill_bytes'] // MIB} MiB | {f['status']} | {f['reason'] or ''} | {f['stdout_bytes']:,} "
            f"| {f['wall_s']} | {f['mb_per_s']} | {'yes' if f['spilled'] else 'no'} |"
        )
    mem = report["memory"]
    lines += [
        "",
        "## Supervisor memory (this process)",
        "",
        "| RSS before floods | Peak during floods | After | Growth | ru_maxrss before | ru_maxrss after |",
        "|---|---|---|---|---|---|",
        "| "
        + " | ".join(
            f"{mem[key]} MiB"
            for key in (
                "rss_before_mib",
                "rss_peak_during_floods_mib",
                "rss_after_mib",
                "rss_growth_mib",
                "ru_maxrss_before_mib",
                "ru_maxrss_after_mib",
            )
        )
        + " |",
    ]
    return "\n".join(lines + markdown_targets(report))


def markdown_bounds(report: dict[str, Any]) -> list[str]:
    """The cost-of-the-bounds table (issue 10), with each row's p50 relative to the first row's."""
    bounds = report.get("bounds") or {}
    rows = bounds.get("latency") or []
    if not rows:
        return []
    lines = [
        "",
        "## Cost of the bounds (namespaces level, print(1), runs interleaved between the sandboxes)",
        "",
        "| Sandbox | Pattern | N | p50 ms | p95 ms | p50 / before | isolation reported |",
        "|---|---|---|---|---|---|---|",
    ]
    infos = {info["label"]: info for info in bounds.get("sandboxes", [])}
    first = {row["pattern"]: row["p50_ms"] for row in rows if row["runner"] == BOUND_CONFIGS[0][0]}
    for row in rows:
        iso = infos.get(row["runner"], {}).get("result_isolation") or {}
        shown = ", ".join(f"{k}={v}" for k, v in iso.items() if k != "level")
        ratio = row["p50_ms"] / first[row["pattern"]] if first.get(row["pattern"]) else math.nan
        lines.append(
            f"| {row['runner']} | {row['pattern']} | {row['n']} | {row['p50_ms']:.1f} | {row['p95_ms']:.1f} "
            f"| {ratio:.2f}x | {shown} |"
        )
    return lines


def markdown_targets(report: dict[str, Any]) -> list[str]:
    """The PASS/FAIL table of the targets."""
    lines = ["", "## Targets", "", "| Target | Value | Limit | Result |", "|---|---|---|---|"]
    for t in report["targets"]:
        lines.append(f"| {t['target']} | {t['value']} | {t['limit']} | {'PASS' if t['pass'] else 'FAIL'} |")
    return lines


def markdown_machine(report: dict[str, Any]) -> list[str]:
    """The machine line alone (for ``--bounds-only``)."""
    m = report["machine"]
    return [
        "## Machine",
        "",
        f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, kernel {m['kernel']}, "
        f"Python {m['python']}, root: {'yes' if m['root'] else 'no'}; "
        f"1-minute load average {m['load_1m_start']} at the start, {m['load_1m_end']} at the end",
    ]


@contextmanager
def workspace() -> Iterator[Path]:
    """A temporary directory for the runs' working directories, removed at the end."""
    with tempfile.TemporaryDirectory(prefix="alphaagent-bench-") as root:
        path = Path(root)
        for sub in ("runs", "bounds", "fresh", "jupyter", "flood-big", "flood-capped"):
            (path / sub).mkdir()
        yield path


def main(argv: list[str] | None = None) -> int:
    """Run every measurement and print the report. Exit status 0 even when a target fails: the figures
    are the product, and a noisy shared CI machine must not fail the build on them."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="divide the iteration counts by 4 (CI smoke)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.add_argument("--bounds-only", action="store_true", help="measure only the cost of the bounds")
    args = parser.parse_args(argv)
    scale = 4 if args.quick else 1
    n_warm, n_fresh = 40 // scale, max(2, 10 // scale)
    warmup = 2 if args.quick else 5

    started = time.perf_counter()
    load_at_start = os.getloadavg()[0]
    rows: list[Latency] = []
    zygotes: list[dict[str, Any]] = []
    with workspace() as root:
        bounds_rows, bounds_info = bench_bounds(root / "bounds", warmup=warmup, n=n_warm)
        if args.bounds_only:
            report = {
                "machine": machine(load_at_start),
                "quick": args.quick,
                "bounds": {"sandboxes": bounds_info, "latency": [row.summary() for row in bounds_rows]},
                "targets": targets(bounds_rows, [], {}),
                "elapsed_s": round(time.perf_counter() - started, 1),
            }
            text = "\n".join(markdown_machine(report) + markdown_bounds(report) + markdown_targets(report))
            print(json.dumps(report, indent=2) if args.json else text)
            return 0
        for label, config in (
            ("zygote (default config)", SandboxConfig()),
            ('zygote (isolation="process")', SandboxConfig(isolation="process")),
        ):
            zygote_rows, info = bench_zygote(label, config, root / "runs", warmup=warmup, n=n_warm)
            rows += zygote_rows
            zygotes.append(info)
        rows += bench_fresh_interpreter(root / "fresh", warmup=1, n=n_fresh)
        jupyter_rows, jupyter_startup_s = bench_jupyter(root / "jupyter", warmup=warmup, n=n_warm)
        rows += jupyter_rows
        big, capped, memory = bench_floods(root)

    report: dict[str, Any] = {
        "machine": machine(load_at_start),
        "quick": args.quick,
        "zygotes": zygotes,
        "jupyter_startup_s": round(jupyter_startup_s, 2),
        "latency": [row.summary() for row in rows],
        "floods": [big, capped],
        "memory": memory,
        "bounds": {"sandboxes": bounds_info, "latency": [row.summary() for row in bounds_rows]},
        "targets": targets(rows + bounds_rows, [z["label"] for z in zygotes], memory),
        "elapsed_s": round(time.perf_counter() - started, 1),
    }
    progress(f"done in {report['elapsed_s']} s")
    print(json.dumps(report, indent=2) if args.json else markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
